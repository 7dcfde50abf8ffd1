"""Real-shaped ONNX models built with onnx.helper (nothing downloaded).

Every builder returns an onnx.ModelProto (opset 17, ir_version 8, float32 weights, symbolic
batch dim "batch") drawn from ``numpy.random.default_rng(seed)``. Node and tensor names follow
the PyTorch exporter ("/layer0/attn/query/MatMul" writes ".../MatMul_output_0"), except in
``unnamed_chain``. Their quantized twins come from ``models.quantize`` (what each route names
is written there), their feeds from ``models.calibration_feeds``.
``python tests/real_models.py [--names]`` builds, quantizes and runs everything.
"""
from __future__ import annotations

import functools
import math
import random
import sys
from pathlib import Path

import models
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


class _Builder:
    """Collects nodes and initializers; ``op`` names the node and returns its output."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def weight(self, name, shape, fan_in=None, scale=1.0):
        value = scale * self.rng.standard_normal(shape) / math.sqrt(fan_in or shape[0])
        return self.const(name, value)

    def const(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type, inputs, name, out=None, **attrs):
        out = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def linear(self, x, fan_in, fan_out, scope):
        """MatMul + Add, as the exporter writes nn.Linear."""
        w = self.weight(f"{scope}.weight", (fan_in, fan_out))
        b = self.const(f"{scope}.bias", 0.1 * self.rng.standard_normal(fan_out))
        path = "/" + scope.replace(".", "/")
        return self.op("Add", [self.op("MatMul", [x, w], f"{path}/MatMul"), b], f"{path}/Add")

    def finish(self, inputs, outputs, name) -> onnx.ModelProto:
        """``inputs``/``outputs`` are (name, element type, shape) triples."""
        inputs, outputs = ([helper.make_tensor_value_info(*v) for v in values]
                           for values in (inputs, outputs))
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", models.OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def transformer_encoder(seed: int, vocab: int = 50, seq="seq", hidden: int = 16,
                        heads: int = 2) -> onnx.ModelProto:
    """One BERT-style encoder layer (45 nodes); ``seq`` is a dim name or an int.

    input_ids -Gather(word table)--+-- Add -> LayerNorm = x
    input_ids -Shape-Gather-Range-Gather(position table, 64 rows when seq is symbolic)
    x -> query/key/value: MatMul+Add -> Reshape [b,s,H,d] -> Transpose (key: [b,H,d,s])
    MatMul(q,k) -> Div sqrt(d) -> Add mask bias -> Softmax -> MatMul(.,v) -> Transpose
      -> Reshape [b,s,hidden] -> output: MatMul+Add -> Add x -> LayerNorm = y
    y -> fc1: MatMul+Add -> GELU (Div sqrt2, Erf, Add 1, Mul, Mul 0.5) -> fc2: MatMul+Add
      -> Add y -> LayerNorm = last_hidden_state [batch, seq, hidden]
    mask bias: attention_mask -> Cast float -> Sub(1, .) -> Mul -10000 -> Unsqueeze [b,1,1,s]
    """
    g, d = _Builder(seed), hidden // heads
    word = g.weight("embeddings.word_embeddings.weight", (vocab, hidden), 1, 0.5)
    pos = g.weight("embeddings.position_embeddings.weight",
                   (seq if isinstance(seq, int) else 64, hidden), 1, 0.1)
    zero, one = g.const("const_zero", 0, np.int64), g.const("const_one", 1, np.int64)
    emb = g.op("Gather", [word, "input_ids"], "/embeddings/word_embeddings/Gather")
    length = g.op("Gather", [g.op("Shape", ["input_ids"], "/embeddings/Shape"), one],
                  "/embeddings/Gather", axis=0)
    ids = g.op("Range", [zero, length, one], "/embeddings/Range")
    emb = g.op("Add", [emb, g.op("Gather", [pos, ids], "/embeddings/position_embeddings/Gather")],
               "/embeddings/Add")

    def layer_norm(x, scope, out=None):
        gamma = g.const(f"{scope}.weight", 1 + 0.1 * g.rng.standard_normal(hidden))
        beta = g.const(f"{scope}.bias", 0.1 * g.rng.standard_normal(hidden))
        return g.op("LayerNormalization", [x, gamma, beta], "/" + scope.replace(".", "/")
                    + "/LayerNormalization", out=out, axis=-1, epsilon=1e-12)

    x = layer_norm(emb, "embeddings.LayerNorm")
    split, qkv = g.const("/attn/split_shape", [0, 0, heads, d], np.int64), {}
    for part, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]), ("value", [0, 2, 1, 3])):
        t = g.op("Reshape", [g.linear(x, hidden, hidden, f"layer0.attn.{part}"), split],
                 f"/layer0/attn/{part}/Reshape")
        qkv[part] = g.op("Transpose", [t], f"/layer0/attn/{part}/Transpose", perm=perm)
    scores = g.op("MatMul", [qkv["query"], qkv["key"]], "/layer0/attn/MatMul")
    scores = g.op("Div", [scores, g.const("/attn/sqrt_d", math.sqrt(d))], "/layer0/attn/Div")
    mask = g.op("Cast", ["attention_mask"], "/mask/Cast", to=FLOAT)
    mask = g.op("Sub", [g.const("/mask/one", 1.0), mask], "/mask/Sub")
    mask = g.op("Mul", [mask, g.const("/mask/big", -10000.0)], "/mask/Mul")
    mask = g.op("Unsqueeze", [mask, g.const("/mask/axes", [1, 2], np.int64)], "/mask/Unsqueeze")
    probs = g.op("Softmax", [g.op("Add", [scores, mask], "/layer0/attn/Add")],
                 "/layer0/attn/Softmax", axis=-1)
    ctx = g.op("MatMul", [probs, qkv["value"]], "/layer0/attn/MatMul_1")
    ctx = g.op("Transpose", [ctx], "/layer0/attn/Transpose", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.const("/attn/merge_shape", [0, 0, hidden], np.int64)],
               "/layer0/attn/Reshape")
    out = g.linear(ctx, hidden, hidden, "layer0.attn.output")
    y = layer_norm(g.op("Add", [out, x], "/layer0/attn/output/Add_1"), "layer0.attn.LayerNorm")
    h = g.linear(y, hidden, 2 * hidden, "layer0.ffn.fc1")
    erf = g.op("Div", [h, g.const("/gelu/sqrt2", math.sqrt(2))], "/layer0/gelu/Div")
    erf = g.op("Add", [g.op("Erf", [erf], "/layer0/gelu/Erf"), g.const("/gelu/one", 1.0)],
               "/layer0/gelu/Add")
    h = g.op("Mul", [g.op("Mul", [h, erf], "/layer0/gelu/Mul"), g.const("/gelu/half", 0.5)],
             "/layer0/gelu/Mul_1")
    h = g.op("Add", [g.linear(h, 2 * hidden, hidden, "layer0.ffn.fc2"), y], "/layer0/ffn/Add_1")
    layer_norm(h, "layer0.ffn.LayerNorm", out="last_hidden_state")
    ids = [("input_ids", INT64, ["batch", seq]), ("attention_mask", INT64, ["batch", seq])]
    return g.finish(ids, [("last_hidden_state", FLOAT, ["batch", seq, hidden])], "encoder")


def distilbert_like(seed: int, layers: int = 2, vocab: int = 40, hidden: int = 16,
                    heads: int = 2, classes: int = 3) -> onnx.ModelProto:
    """A DistilBERT-style classifier whose graph holds 15 op types the quantizer knows:
    Gather, Add, LayerNormalization, MatMul, Split, Reshape, Transpose, Softmax, Where,
    Unsqueeze, Mul, Sigmoid, Slice, Squeeze, Concat (and Div, Equal, ReduceMean beside them).

    input_ids -Gather(word table) + position table -> LayerNorm = x; per layer:
      x -> MatMul+Add [hidden, 3 hidden] -> Split q, k, v -> Reshape [b,s,H,d] -> Transpose
      MatMul(q,k) -> Div sqrt(d) -> Where(attention_mask == 0, -1e4, .) -> Softmax
      -> MatMul(.,v) -> Transpose -> Reshape -> MatMul+Add -> Add x -> LayerNorm = y
      y -> MatMul+Add -> quick GELU (h * Sigmoid(1.702 h)) -> MatMul+Add -> Add y -> LayerNorm
    head: Concat(Slice first token -> Squeeze, ReduceMean over seq) -> MatMul+Add = logits
    """
    g, d, seq = _Builder(seed), hidden // heads, 8
    word = g.weight("embeddings.word_embeddings.weight", (vocab, hidden), 1, 0.5)
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], "/embeddings/word_embeddings/Gather"),
                     g.weight("embeddings.position_embeddings", (seq, hidden), 1, 0.1)],
             "/embeddings/Add")

    def layer_norm(x, scope):
        gamma = g.const(f"{scope}.weight", 1 + 0.1 * g.rng.standard_normal(hidden))
        beta = g.const(f"{scope}.bias", 0.1 * g.rng.standard_normal(hidden))
        return g.op("LayerNormalization", [x, gamma, beta],
                    "/" + scope.replace(".", "/") + "/LayerNormalization", axis=-1,
                    epsilon=1e-12)

    x = layer_norm(x, "embeddings.LayerNorm")
    blocked = g.op("Equal", ["attention_mask", g.const("/mask/zero", 0, np.int64)], "/mask/Equal")
    blocked = g.op("Unsqueeze", [blocked, g.const("/mask/axes", [1, 2], np.int64)],
                   "/mask/Unsqueeze")
    split, merge = (g.const("/attn/split_shape", [0, 0, heads, d], np.int64),
                    g.const("/attn/merge_shape", [0, 0, hidden], np.int64))
    for layer in range(layers):
        scope = f"/layer{layer}"
        fused = g.linear(x, hidden, 3 * hidden, f"layer{layer}.attn.qkv")
        parts = [f"{scope}/attn/Split_output_{i}" for i in range(3)]
        g.nodes.append(helper.make_node("Split", [fused, g.const(
            f"{scope}/attn/split_sizes", [hidden] * 3, np.int64)], parts,
            name=f"{scope}/attn/Split", axis=-1))
        qkv = {}
        for part, t, perm in zip(("query", "key", "value"), parts,
                                 ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])):
            t = g.op("Reshape", [t, split], f"{scope}/attn/{part}/Reshape")
            qkv[part] = g.op("Transpose", [t], f"{scope}/attn/{part}/Transpose", perm=perm)
        scores = g.op("MatMul", [qkv["query"], qkv["key"]], f"{scope}/attn/MatMul")
        scores = g.op("Div", [scores, g.const(f"{scope}/attn/sqrt_d", math.sqrt(d))],
                      f"{scope}/attn/Div")
        scores = g.op("Where", [blocked, g.const(f"{scope}/attn/big", -1e4), scores],
                      f"{scope}/attn/Where")
        probs = g.op("Softmax", [scores], f"{scope}/attn/Softmax", axis=-1)
        ctx = g.op("MatMul", [probs, qkv["value"]], f"{scope}/attn/MatMul_1")
        ctx = g.op("Transpose", [ctx], f"{scope}/attn/Transpose", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge], f"{scope}/attn/Reshape")
        out = g.linear(ctx, hidden, hidden, f"layer{layer}.attn.output")
        y = layer_norm(g.op("Add", [out, x], f"{scope}/attn/Add_1"), f"layer{layer}.attn.LayerNorm")
        h = g.linear(y, hidden, 2 * hidden, f"layer{layer}.ffn.lin1")
        gate = g.op("Sigmoid", [g.op("Mul", [h, g.const(f"{scope}/ffn/k", 1.702)],
                                     f"{scope}/ffn/Mul")], f"{scope}/ffn/Sigmoid")
        h = g.op("Mul", [h, gate], f"{scope}/ffn/Mul_1")
        h = g.op("Add", [g.linear(h, 2 * hidden, hidden, f"layer{layer}.ffn.lin2"), y],
                 f"{scope}/ffn/Add_1")
        x = layer_norm(h, f"layer{layer}.ffn.LayerNorm")
    first = g.op("Slice", [x, g.const("/head/start", [0], np.int64),
                           g.const("/head/end", [1], np.int64),
                           g.const("/head/axis", [1], np.int64)], "/head/Slice")
    first = g.op("Squeeze", [first, g.const("/head/squeeze", [1], np.int64)], "/head/Squeeze")
    mean = g.op("ReduceMean", [x], "/head/ReduceMean", axes=[1], keepdims=0)
    pooled = g.op("Concat", [first, mean], "/head/Concat", axis=-1)
    g.op("Add", [g.op("MatMul", [pooled, g.weight("head.weight", (2 * hidden, classes))],
                      "/head/MatMul"), g.const("head.bias", np.zeros(classes))],
         "/head/Add", out="logits")
    ids = [("input_ids", INT64, ["batch", seq]), ("attention_mask", INT64, ["batch", seq])]
    return g.finish(ids, [("logits", FLOAT, ["batch", classes])], "distilbert")


def detector_head(seed: int, channels: int = 8, size: int = 16) -> onnx.ModelProto:
    """A YOLO-style detector: Conv + SiLU (x * Sigmoid(x)) blocks, a Concat of two of them,
    a MaxPool, a head block and a 1x1 Conv to 6 predictions per cell."""
    g, c = _Builder(seed), channels

    def block(x, cin, cout, name):
        w = g.weight(f"{name}.weight", (cout, cin, 3, 3), cin * 9)
        b = g.const(f"{name}.bias", 0.1 * g.rng.standard_normal(cout))
        y = g.op("Conv", [x, w, b], f"/{name}/Conv", pads=[1] * 4)
        return g.op("Mul", [y, g.op("Sigmoid", [y], f"/{name}/Sigmoid")], f"/{name}/Mul")

    a = block(block("image", 3, c, "stem"), c, c, "b1")
    joined = g.op("Concat", [a, block(a, c, c, "b2")], "/neck/Concat", axis=1)
    pooled = g.op("MaxPool", [joined], "/neck/MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    head = block(pooled, 2 * c, c, "head")
    g.op("Conv", [head, g.weight("out.weight", (6, c, 1, 1), c), g.const("out.bias",
                                                                         np.zeros(6))],
         "/out/Conv", out="preds")
    half = size // 2
    return g.finish([("image", FLOAT, ["batch", 3, size, size])],
                    [("preds", FLOAT, ["batch", 6, half, half])], "detector")


def efficientnet_like(seed: int, size: int = 96,
                      blocks=((16, 24, 2), (24, 40, 2), (40, 80, 2), (80, 80, 1),
                              (80, 112, 1))) -> onnx.ModelProto:
    """An EfficientNet-style classifier (80 nodes, 27 Convs): a strided SiLU stem, then per
    block (in, out, stride) a 1x1 expand x4, a 3x3 depthwise Conv, squeeze-and-excitation
    (GlobalAveragePool, 1x1 reduce with SiLU, 1x1 expand, Sigmoid, Mul), a 1x1 projection and
    a residual Add where the shape allows; a 1x1 head to 320, pooling and a Gemm to 10."""
    g = _Builder(seed)

    def conv(x, cin, cout, name, k=1, stride=1, group=1, act=True):
        w = g.weight(f"{name}.weight", (cout, cin // group, k, k), cin // group * k * k)
        b = g.const(f"{name}.bias", 0.05 * g.rng.standard_normal(cout))
        y = g.op("Conv", [x, w, b], f"/{name}/Conv", pads=[k // 2] * 4, strides=[stride] * 2,
                 group=group)
        if not act:
            return y
        return g.op("Mul", [y, g.op("Sigmoid", [y], f"/{name}/Sigmoid")], f"/{name}/Mul")

    x = conv("image", 3, 16, "stem", k=3, stride=2)
    for i, (cin, cout, stride) in enumerate(blocks):
        n = f"blocks.{i}"
        e = conv(x, cin, cin * 4, f"{n}.expand")
        d = conv(e, cin * 4, cin * 4, f"{n}.dw", k=3, stride=stride, group=cin * 4)
        s = g.op("GlobalAveragePool", [d], f"/{n}/se/GlobalAveragePool")
        s = conv(s, cin * 4, cin // 4, f"{n}.se.reduce")
        s = g.op("Sigmoid", [conv(s, cin // 4, cin * 4, f"{n}.se.expand", act=False)],
                 f"/{n}/se/Sigmoid")
        d = g.op("Mul", [d, s], f"/{n}/se/Mul")
        y = conv(d, cin * 4, cout, f"{n}.project", act=False)
        x = g.op("Add", [x, y], f"/{n}/Add") if cin == cout and stride == 1 else y
    x = conv(x, blocks[-1][1], 320, "head")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], "/pool/GlobalAveragePool")], "/Flatten")
    w = g.weight("fc.weight", (320, 10))
    g.op("Gemm", [x, w, g.const("fc.bias", np.zeros(10))], "/fc/Gemm", out="logits")
    return g.finish([("image", FLOAT, ["batch", 3, size, size])],
                    [("logits", FLOAT, ["batch", 10])], "efficientnet")


def residual_cnn(seed: int, channels: int = 8, classes: int = 5,
                 fold_bn: bool = False) -> onnx.ModelProto:
    """A ResNet-ish classifier (14 nodes, 13 folded); ``fold_bn`` folds bn1 into conv1 with the
    same random draws, so both variants compute the same function (to ~1e-7).

    image [batch,3,h,w] -> conv1 Conv 3x3 pad 1 -> (bn1 BatchNormalization) -> Relu = a
    a -> Conv -> Relu -> Conv -> Add a -> Relu -> MaxPool 2x2 -> Conv (2C) -> Relu
      -> GlobalAveragePool -> Flatten -> fc Gemm(transB=1) = logits [batch, classes]
    """
    g, c = _Builder(seed), channels

    def conv(x, c_in, c_out, scope, weight=None, bias=None):
        if weight is None:
            weight = g.rng.standard_normal((c_out, c_in, 3, 3)) / math.sqrt(9 * c_in)
            bias = 0.1 * g.rng.standard_normal(c_out)
        inputs = [x, g.const(f"{scope}.weight", weight), g.const(f"{scope}.bias", bias)]
        return g.op("Conv", inputs, "/" + scope.replace(".", "/") + "/Conv",
                    kernel_shape=[3, 3], pads=[1, 1, 1, 1])

    w1, b1 = g.rng.standard_normal((c, 3, 3, 3)) / math.sqrt(27), 0.1 * g.rng.standard_normal(c)
    gamma, beta = 1 + 0.1 * g.rng.standard_normal(c), 0.1 * g.rng.standard_normal(c)
    mean, var = 0.1 * g.rng.standard_normal(c), 0.5 + g.rng.random(c)
    if fold_bn:
        k = gamma / np.sqrt(var + 1e-5)
        a = conv("image", 3, c, "conv1", w1 * k[:, None, None, None], (b1 - mean) * k + beta)
    else:
        bn = [g.const(f"bn1.{n}", v) for n, v in (("weight", gamma), ("bias", beta),
                                                  ("running_mean", mean), ("running_var", var))]
        a = g.op("BatchNormalization", [conv("image", 3, c, "conv1", w1, b1), *bn],
                 "/bn1/BatchNormalization", epsilon=1e-5)
    a = g.op("Relu", [a], "/relu/Relu")
    r = g.op("Relu", [conv(a, c, c, "layer1.conv1")], "/layer1/relu/Relu")
    r = g.op("Relu", [g.op("Add", [conv(r, c, c, "layer1.conv2"), a], "/layer1/Add")],
             "/layer1/relu_1/Relu")
    r = g.op("MaxPool", [r], "/maxpool/MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    r = g.op("Relu", [conv(r, c, 2 * c, "layer2.conv")], "/layer2/relu/Relu")
    r = g.op("Flatten", [g.op("GlobalAveragePool", [r], "/avgpool/GlobalAveragePool")],
             "/Flatten", axis=1)
    fc = [g.weight("fc.weight", (classes, 2 * c), 2 * c),
          g.const("fc.bias", 0.1 * g.rng.standard_normal(classes))]
    g.op("Gemm", [r, *fc], "/fc/Gemm", out="logits", transB=1)
    return g.finish([("image", FLOAT, ["batch", 3, "h", "w"])],
                    [("logits", FLOAT, ["batch", classes])], "cnn")


def label_classifier(seed: int, features: int = 6, classes: int = 3) -> onnx.ModelProto:
    """x [batch,features] -> fc1 MatMul+Add -> Relu -> fc2 MatMul+Add -> Softmax = probabilities
    probabilities -> ArgMax(axis=1, keepdims=0) = label int64 [batch].
    Graph outputs in this order: label, probabilities.
    """
    g = _Builder(seed)
    h = g.op("Relu", [g.linear("x", features, 2 * features, "fc1")], "/relu/Relu")
    p = g.op("Softmax", [g.linear(h, 2 * features, classes, "fc2")], "/Softmax",
             out="probabilities", axis=1)
    g.op("ArgMax", [p], "/ArgMax", out="label", axis=1, keepdims=0)
    return g.finish([("x", FLOAT, ["batch", features])],
                    [("label", INT64, ["batch"]), ("probabilities", FLOAT, ["batch", classes])],
                    "classifier")


def stateful_vad(seed: int, samples: int = 32, state: int = 8) -> onnx.ModelProto:
    """A Silero-VAD-shaped recurrent cell: inputs input, state, sr (int64 scalar, any value).

    input [batch,samples] -> in MatMul -------------------+
    state [2,batch,S] -Gather 0-> h -> rec MatMul --------Add -> Add bias -> Add sr0 -> Tanh = h'
    sr -> Cast float -> Mul 0 = sr0           state -Gather 1-> c -> Add h' = c'
    h' -> head MatMul+Add -> Sigmoid = output [batch, 1]
    h', c' -> Unsqueeze 0 -> Concat axis 0 = stateN [2, batch, S]
    """
    g = _Builder(seed)
    h = g.op("Gather", ["state", g.const("/state/h_index", 0, np.int64)], "/state/Gather", axis=0)
    c = g.op("Gather", ["state", g.const("/state/c_index", 1, np.int64)], "/state/Gather_1",
             axis=0)
    x = g.op("MatMul", ["input", g.weight("cell.in.weight", (samples, state))], "/cell/in/MatMul")
    r = g.op("MatMul", [h, g.weight("cell.rec.weight", (state, state))], "/cell/rec/MatMul")
    t = g.op("Add", [x, r], "/cell/Add")
    t = g.op("Add", [t, g.const("cell.bias", 0.1 * g.rng.standard_normal(state))], "/cell/Add_1")
    sr = g.op("Mul", [g.op("Cast", ["sr"], "/sr/Cast", to=FLOAT), g.const("/sr/zero", 0.0)],
              "/sr/Mul")
    h = g.op("Tanh", [g.op("Add", [t, sr], "/cell/Add_2")], "/cell/Tanh")
    c = g.op("Add", [c, h], "/cell/Add_3")
    g.op("Sigmoid", [g.linear(h, state, 1, "head")], "/head/Sigmoid", out="output")
    axes = g.const("/state/axes", [0], np.int64)
    g.op("Concat", [g.op("Unsqueeze", [h, axes], "/state/Unsqueeze"),
                    g.op("Unsqueeze", [c, axes], "/state/Unsqueeze_1")],
         "/state/Concat", out="stateN", axis=0)
    inputs = [("input", FLOAT, ["batch", samples]), ("state", FLOAT, [2, "batch", state]),
              ("sr", INT64, [])]
    return g.finish(inputs, [("output", FLOAT, ["batch", 1]),
                             ("stateN", FLOAT, [2, "batch", state])], "vad")


def sequence_head(seed: int, steps: int = 6, features: int = 5, hidden: int = 4,
                  classes: int = 3) -> onnx.ModelProto:
    """A recurrent-encoder-shaped head: frames projected, transposed and flattened into a
    classifier, where the Transpose and the Reshape are quantized only because the head MatMul
    reads what they write.

    x [batch, steps, features] -> MatMul+Add (frame) -> Transpose (0, 2, 1) -> Reshape
    [batch, hidden*steps] -> MatMul+Add (head) -> logits [batch, classes]
    """
    g = _Builder(seed)
    h = g.linear("x", features, hidden, "frame")
    t = g.op("Transpose", [h], "/Transpose", perm=[0, 2, 1])
    flat = g.op("Reshape", [t, g.const("/flat_shape", [0, hidden * steps], np.int64)],
                "/Reshape")
    g.op("Add", [g.op("MatMul", [flat, g.weight("head.weight", (hidden * steps, classes))],
                      "/head/MatMul"), g.const("head.bias", 0.1 * g.rng.standard_normal(classes))],
         "/head/Add", out="logits")
    return g.finish([("x", FLOAT, ["batch", steps, features])],
                    [("logits", FLOAT, ["batch", classes])], "sequence_head")


def pass_through_head(seed: int, features: int = 8) -> onnx.ModelProto:
    """Ops a quantizer passes its input's scale through (Slice, Split, Reshape, Transpose,
    AveragePool, Flatten): where an exclusion cuts such a chain, quantize_static calibrates
    the tensor after the cut anew.

    x [batch, F] -> fc1 MatMul+Add -> Slice [2:8] -> fc2 Gemm -> Split (3, 5) = a, b
    a -> Mul 1.5;  b -> fc3 MatMul+Add -> Reshape [batch, 2, 2] -> Transpose -> AveragePool 2
      -> Flatten;  Concat (flat, a*1.5) -> out MatMul = y [batch, 3]
    """
    g = _Builder(seed)
    h = g.linear("x", features, 12, "fc1")
    s = g.op("Slice", [h, g.const("/slice/starts", [2], np.int64),
                      g.const("/slice/ends", [8], np.int64),
                      g.const("/slice/axes", [1], np.int64)], "/Slice")
    h = g.op("Gemm", [s, g.weight("fc2.weight", (6, 8)),
                      g.const("fc2.bias", 0.1 * g.rng.standard_normal(8))], "/fc2/Gemm")
    g.nodes.append(helper.make_node("Split", [h, g.const("/split/sizes", [3, 5], np.int64)],
                                    ["/Split_output_0", "/Split_output_1"], name="/Split",
                                    axis=1))
    m = g.op("Mul", ["/Split_output_0", g.const("/scale", 1.5)], "/Mul")
    h = g.linear("/Split_output_1", 5, 4, "fc3")
    r = g.op("Reshape", [h, g.const("/reshape/shape", [0, 2, 2], np.int64)], "/Reshape")
    t = g.op("Transpose", [r], "/Transpose", perm=[0, 2, 1])
    p = g.op("AveragePool", [t], "/AveragePool", kernel_shape=[2])
    f = g.op("Flatten", [p], "/Flatten", axis=1)
    y = g.op("Concat", [f, m], "/Concat", axis=1)
    g.op("MatMul", [y, g.weight("out.weight", (5, 3))], "/out/MatMul", out="y")
    return g.finish([("x", FLOAT, ["batch", features])], [("y", FLOAT, ["batch", 3])],
                    "pass_through")


def branches(seed: int, channels: int = 4) -> onnx.ModelProto:
    """One image read by two Convs, a MaxPool and a Concat, in that node order: the quantizer
    passes the image's scale to the MaxPool only while a node before it has quantized the
    image, so excluding both Convs ends the loan although the Concat still quantizes it.

    image [batch,3,h,w] -> a Conv, c Conv, pool MaxPool 3x3 pad 1 -> m Conv;
    Concat (a, c, m, image) -> head Conv 1x1 = y
    """
    g, c = _Builder(seed), channels

    def conv(x, c_in, c_out, name, kernel=3):
        weight = g.const(f"{name}.weight", g.rng.standard_normal((c_out, c_in, kernel, kernel))
                         / math.sqrt(kernel * kernel * c_in))
        bias = g.const(f"{name}.bias", 0.1 * g.rng.standard_normal(c_out))
        pad = kernel // 2
        return g.op("Conv", [x, weight, bias], f"/{name}/Conv", kernel_shape=[kernel, kernel],
                    pads=[pad] * 4)

    a, b = conv("image", 3, c, "a"), conv("image", 3, c, "c")
    pooled = g.op("MaxPool", ["image"], "/pool/MaxPool", kernel_shape=[3, 3], pads=[1] * 4)
    m = conv(pooled, 3, c, "m")
    joined = g.op("Concat", [a, b, m, "image"], "/Concat", axis=1)
    conv_out = conv(joined, 3 * c + 3, 2, "head", kernel=1)
    g.nodes[-1].output[0] = "y"
    del conv_out
    return g.finish([("image", FLOAT, ["batch", 3, "h", "w"])],
                    [("y", FLOAT, ["batch", 2, "h", "w"])], "branches")


def clipped_gemm(seed: int, features: int = 6, hidden: int = 8,
                 classes: int = 3) -> onnx.ModelProto:
    """A MobileNet-style head: Gemm with beta 0.5 (the quantizer folds it into the int32 bias
    and writes beta 1) -> Clip [0, 6] with its bounds as initializers (folded into the Gemm's
    output, bounds dropped) -> Gemm = logits [batch, classes]."""
    g = _Builder(seed)
    w1 = g.weight("fc1.weight", (features, hidden))
    b1 = g.const("fc1.bias", g.rng.standard_normal(hidden))
    h = g.op("Gemm", ["x", w1, b1], "/fc1/Gemm", beta=0.5)
    h = g.op("Clip", [h, g.const("/clip/min", 0.0), g.const("/clip/max", 6.0)], "/clip/Clip")
    w2 = g.weight("fc2.weight", (hidden, classes))
    g.op("Gemm", [h, w2, g.const("fc2.bias", 0.1 * g.rng.standard_normal(classes))],
         "/fc2/Gemm", out="logits")
    return g.finish([("x", FLOAT, ["batch", features])], [("logits", FLOAT, ["batch", classes])],
                    "clipped_gemm")


def unnamed_chain(seed: int, features: int = 4, depth: int = 3) -> onnx.ModelProto:
    """x -> MatMul W0 -> t0 -> MatMul W1 -> t1 ... -> y: ``depth`` MatMuls with NO node names."""
    g, current = _Builder(seed), "x"
    for k in range(depth):
        out = "y" if k == depth - 1 else f"t{k}"
        weight = g.weight(f"W{k}", (features, features))
        g.nodes.append(helper.make_node("MatMul", [current, weight], [out]))
        current = out
    return g.finish([("x", FLOAT, ["batch", features])], [("y", FLOAT, ["batch", features])],
                    "unnamed")


BUILDERS = {"encoder": transformer_encoder, "cnn": residual_cnn,
            "cnn_folded": lambda seed: residual_cnn(seed, fold_bn=True),
            "classifier": label_classifier, "vad": stateful_vad, "unnamed": unnamed_chain}


# bench/bench.py's name for models.quantize with these models' calibration (4-row batches);
# not a second quantizer: the one in models.py, with that default bound.
quantize_qdq = functools.partial(models.quantize, rows=4)


def random_feeds(model: onnx.ModelProto, seed: int, rows: int = 4,
                 dims: dict | None = None) -> dict:
    """One feed dict, drawn as ``calibration_feeds`` draws them."""
    return models.calibration_feeds(model, seed, 1, rows, dims)[0]


def reorder_nodes(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy whose graph.node is another valid topological order: a seeded random Kahn order
    that differs from the file order whenever the graph has more than one order. Only top-level
    node inputs count as dependencies (a subgraph's outer-scope reads are not followed)."""
    nodes = list(model.graph.node)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    deps = [{producer[t] for t in n.input if t in producer} for n in nodes]
    users = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for k in ds:
            users[k].append(i)
    rng, waiting, order, deviated = random.Random(seed), [len(ds) for ds in deps], [], False
    ready = [i for i, w in enumerate(waiting) if w == 0]
    while ready:
        ready.sort()
        others = [i for i in ready if i != len(order)]  # anything but the file's next node
        pick = rng.choice(others if others and not deviated else ready)
        deviated = deviated or pick != len(order)
        ready.remove(pick)
        order.append(pick)
        for user in users[pick]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes[i] for i in order)
    return copy


COMPUTE = {"MatMul", "Conv", "Gemm", "QLinearMatMul", "QLinearConv", "QGemm", "MatMulInteger",
           "ConvInteger"}


def pair_compute_nodes(fp32_model, q_model) -> list:
    """(float node, quantized node or None) for each float MatMul/Conv/Gemm: the quantized
    compute node named n, n_quant or n_MatMul_quant; an unnamed node pairs with the compute
    node that reads a tensor named after its second input (W_quantized, W_DequantizeLinear...)."""
    q_nodes = [q for q in q_model.graph.node if q.op_type in COMPUTE]
    pairs = []
    for n in (n for n in fp32_model.graph.node if n.op_type in COMPUTE):
        names = {n.name, n.name + "_quant", n.name + "_MatMul_quant"}
        hits = [q for q in q_nodes if q.name in names] if n.name else [
            q for q in q_nodes if any(t.startswith(n.input[1] + "_") for t in q.input)]
        pairs.append((n, hits[0] if hits else None))
    return pairs


# The self-check's routes: name -> quantize(fp32_path, out_path, seed); None is the float model.
ROUTES = {"fp32": None, "qdq": lambda f, o, s: models.quantize(f, o, s, rows=4),
          "qdq_pc_u8": lambda f, o, s: models.quantize(f, o, s, True, activation_type="QUInt8",
                                                       rows=4),
          "qoperator": lambda f, o, s: models.quantize(f, o, s, route="qoperator", rows=4),
          "dynamic": lambda f, o, s: models.quantize(f, o, route="dynamic")}


def _self_check(show_names: bool = False) -> int:
    """Build, quantize and run every model on every route; one table row per (model, route).
    "kept" counts the float model's node outputs whose names still exist in the routed model."""
    import tempfile

    import onnxruntime as ort

    def outputs(model):
        return {t for n in model.graph.node for t in n.output}

    stack, failures = f"ort {ort.__version__}/onnx {onnx.__version__}", 0
    print(f"{'model':11} {'route':9} {'stack':24} {'result':14} nodes kept  ops")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in BUILDERS.items():
            fp32, model = Path(tmp, f"{name}.onnx"), build(7)
            onnx.save(model, str(fp32))
            feeds, float_names = random_feeds(model, 11), outputs(model)
            base, shuffled = models.run(model, feeds), reorder_nodes(model, 5)
            onnx.checker.check_model(shuffled)
            same = all(np.array_equal(a, b) for a, b in zip(base, models.run(shuffled, feeds)))
            moved = list(shuffled.graph.node) != list(model.graph.node)
            print(f"{name:11} {'reorder':9} {stack:24} {'ok' if same else 'FAIL':14} moved={moved}")
            failures += not same
            for route, make in ROUTES.items():
                path = fp32 if make is None else Path(tmp, f"{name}.{route}.onnx")
                try:
                    if make is not None:
                        make(fp32, path, 3)
                    q, outs = onnx.load(str(path)), models.run(path, feeds)
                    err = max(float(np.abs(a - b).max())
                              for a, b in zip(base, outs) if a.dtype.kind == "f")
                except Exception as exc:
                    failures += 1
                    print(f"{name:11} {route:9} {stack:24} FAIL {type(exc).__name__}: {exc}")
                    continue
                kept = f"{len(float_names & outputs(q))}/{len(float_names)}"
                ops = ",".join(sorted({n.op_type for n in q.graph.node}))
                print(f"{name:11} {route:9} {stack:24} {f'ok err={err:.2g}':14} "
                      f"{len(q.graph.node):5} {kept:5} {ops}")
                for n, qn in pair_compute_nodes(model, q) if show_names and make else ():
                    print(f"    {n.name or '<unnamed>'!r} -> " + (f"{qn.op_type} {qn.name!r} in="
                          f"{list(qn.input)[:4]} out={list(qn.output)}" if qn else "not paired"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_self_check("--names" in sys.argv))
