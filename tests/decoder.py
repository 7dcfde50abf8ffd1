"""A Llama-like decoder built with onnx.helper (torch is not available to the tests), and its
weight-only twins made by onnxruntime's own MatMulNBitsQuantizer; every RNG is seeded.

``llama`` writes the graph a torch export of a Llama decoder writes (the dynamo exporter's op
types; each node named after the module that made it, ``layers.0.self_attn.q_proj/MatMul``,
its output ``<node>_output_0``): RMSNorm as Pow, ReduceMean, Add eps, Sqrt, Reciprocal and
two Muls; rotary embedding from constant cos/sin tables with rotate-half as Slice, Neg and
Concat; grouped-query attention repeating the key and value heads through Unsqueeze, Expand
and Reshape (repeat_interleave); a constant causal mask of float32's lowest value over the
upper triangle; a SwiGLU MLP (Sigmoid times its input); residual Adds. Every weight MatMul
reads a constant [in, out] weight, as the exporters write a Linear's transposed weight, so
MatMulNBitsQuantizer quantizes exactly those: seven per layer and the lm_head.

``quantized`` is that quantizer's round to nearest (it imports onnx_ir, a test tool only; its
HQQ algorithm needs torch, which the tests do not have).
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def weight_matmuls(layers: int = 2) -> list[str]:
    """The names of ``llama``'s MatMul nodes with a constant weight, in graph order: what
    MatMulNBitsQuantizer quantizes and its ``nodes_to_exclude`` takes."""
    return [f"layers.{k}.{projection}/MatMul" for k in range(layers)
            for projection in PROJECTIONS] + ["lm_head/MatMul"]


class _Graph:
    """Nodes and initializers as an exporter names them: a node ``<module>/<Op>`` (``_1``,
    ``_2``, ... for the module's next nodes of that op), its output ``<node>_output_0``."""

    def __init__(self) -> None:
        """An empty graph."""
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: dict[str, str] = {}

    def op(self, module: str, op_type: str, inputs: list[str], **attributes) -> str:
        """Add node ``op_type`` of ``module`` reading ``inputs``; its one output's name."""
        base = f"{module}/{op_type}"
        taken = {node.name for node in self.nodes}
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        output = f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attributes))
        return output

    def weight(self, name: str, array: np.ndarray) -> str:
        """A float32 initializer ``name``."""
        self.initializers.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def constant(self, array, dtype) -> str:
        """A small shared constant (shapes, axes, eps), written once per value as exporters
        fold equal constants into one initializer."""
        array = np.asarray(array, dtype)
        key = f"{array.dtype}{array.shape}{array.tobytes().hex()}"
        if key not in self._constants:
            name = f"val_{len(self._constants)}"
            self.initializers.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
        return self._constants[key]


def _rms_norm(graph: _Graph, module: str, x: str, weight: np.ndarray) -> str:
    """weight * (x * 1 / sqrt(mean(x ** 2, -1) + eps)), as exported."""
    squared = graph.op(module, "Pow", [x, graph.constant(2.0, np.float32)])
    mean = graph.op(module, "ReduceMean", [squared, graph.constant([-1], np.int64)], keepdims=1)
    shifted = graph.op(module, "Add", [mean, graph.constant(1e-5, np.float32)])
    root = graph.op(module, "Sqrt", [shifted])
    inverse = graph.op(module, "Reciprocal", [root])
    normed = graph.op(module, "Mul", [x, inverse])
    return graph.op(module, "Mul", [graph.weight(f"{module}.weight", weight), normed])


def _rotary(graph: _Graph, module: str, x: str, cos: str, sin: str, head_dim: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2])."""
    half = head_dim // 2
    axis, step = graph.constant([3], np.int64), graph.constant([1], np.int64)
    first = graph.op(module, "Slice", [x, graph.constant([0], np.int64),
                                       graph.constant([half], np.int64), axis, step])
    second = graph.op(module, "Slice", [x, graph.constant([half], np.int64),
                                        graph.constant([np.iinfo(np.int64).max], np.int64),
                                        axis, step])
    rotated = graph.op(module, "Concat", [graph.op(module, "Neg", [second]), first], axis=-1)
    return graph.op(module, "Add", [graph.op(module, "Mul", [x, cos]),
                                    graph.op(module, "Mul", [rotated, sin])])


def _heads(graph: _Graph, module: str, x: str, seq: int, count: int, head_dim: int) -> str:
    """[1, seq, count * head_dim] -> [1, count, seq, head_dim]."""
    split = graph.op(module, "Reshape", [x, graph.constant([1, seq, count, head_dim], np.int64)])
    return graph.op(module, "Transpose", [split], perm=[0, 2, 1, 3])


def _repeat_kv(graph: _Graph, module: str, x: str, seq: int, rep: int, head_dim: int) -> str:
    """[1, kv, seq, d] -> [1, kv * rep, seq, d], each head ``rep`` times in a row
    (repeat_interleave on dim 1, as the dynamo exporter writes it)."""
    wide = graph.op(module, "Unsqueeze", [x, graph.constant([2], np.int64)])
    expanded = graph.op(module, "Expand", [wide, graph.constant([1, 1, rep, 1, 1], np.int64)])
    return graph.op(module, "Reshape", [expanded,
                                        graph.constant([1, -1, seq, head_dim], np.int64)])


def _attention(graph: _Graph, prefix: str, x: str, weights, tables, shape) -> str:
    """Grouped-query self-attention of layer ``prefix`` on the normed ``x``; its o_proj's
    output. ``weights``: the four projections' [in, out] weights; ``tables``: cos, sin, mask;
    ``shape``: (seq, heads, kv_heads, head_dim)."""
    seq, heads, kv_heads, head_dim = shape
    cos, sin, mask = tables
    module = f"{prefix}.self_attn"
    projected = {name: graph.op(f"{module}.{name}", "MatMul",
                                [x, graph.weight(f"{module}.{name}.weight", weights[name])])
                 for name in ("q_proj", "k_proj", "v_proj")}
    q = _heads(graph, module, projected["q_proj"], seq, heads, head_dim)
    k = _heads(graph, module, projected["k_proj"], seq, kv_heads, head_dim)
    v = _heads(graph, module, projected["v_proj"], seq, kv_heads, head_dim)
    q = _rotary(graph, f"{module}.rotary_q", q, cos, sin, head_dim)
    k = _rotary(graph, f"{module}.rotary_k", k, cos, sin, head_dim)
    k = _repeat_kv(graph, f"{module}.repeat_k", k, seq, heads // kv_heads, head_dim)
    v = _repeat_kv(graph, f"{module}.repeat_v", v, seq, heads // kv_heads, head_dim)
    keys = graph.op(module, "Transpose", [k], perm=[0, 1, 3, 2])
    scores = graph.op(module, "MatMul", [q, keys])
    scaled = graph.op(module, "Div", [scores,
                                      graph.constant(np.sqrt(head_dim), np.float32)])
    probs = graph.op(module, "Softmax", [graph.op(module, "Add", [scaled, mask])], axis=-1)
    context = graph.op(module, "MatMul", [probs, v])
    merged = graph.op(module, "Reshape", [
        graph.op(module, "Transpose", [context], perm=[0, 2, 1, 3]),
        graph.constant([1, seq, heads * head_dim], np.int64)])
    return graph.op(f"{module}.o_proj", "MatMul",
                    [merged, graph.weight(f"{module}.o_proj.weight", weights["o_proj"])])


def _mlp(graph: _Graph, prefix: str, x: str, weights) -> str:
    """down_proj(silu(gate_proj(x)) * up_proj(x)), silu(g) = g * sigmoid(g)."""
    module = f"{prefix}.mlp"

    def linear(name: str, source: str) -> str:
        """Projection ``name`` of ``source``: MatMul by its constant [in, out] weight."""
        return graph.op(f"{module}.{name}", "MatMul",
                        [source, graph.weight(f"{module}.{name}.weight", weights[name])])

    gate = linear("gate_proj", x)
    silu = graph.op(module, "Mul", [gate, graph.op(module, "Sigmoid", [gate])])
    return linear("down_proj", graph.op(module, "Mul", [silu, linear("up_proj", x)]))


def _rotary_tables(seq: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [seq, head_dim] of positions 0..seq-1, base 10000, both halves alike."""
    inverse = 1.0 / 10000 ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq, dtype=np.float64), inverse)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A Llama config's sizes (as transformers' LlamaConfig names them), and the sequence."""

    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    layers: int = 2
    seq: int = 8


def llama(sizes: Sizes = Sizes(), seed: int = 0) -> onnx.ModelProto:
    """A Llama decoder: input_ids int64 [1, seq] -> logits float [1, seq, vocab].

    ::

        input_ids -> Gather embed_tokens -> h
        per layer k (prefix layers.k):
          h -> RMSNorm input_layernorm -> x
            -> q_proj, k_proj, v_proj MatMuls -> Reshape/Transpose to heads
            -> rotary on q and k -> k, v repeated to ``heads`` (GQA)
            -> MatMul(q, k^T) / sqrt(head_dim) + causal mask -> Softmax -> MatMul v
            -> Transpose/Reshape -> o_proj MatMul -> + h -> h
          h -> RMSNorm post_attention_layernorm -> x
            -> down_proj(silu(gate_proj x) * up_proj x) -> + h -> h
        h -> RMSNorm norm -> lm_head MatMul -> logits

    Weights N(0, 1) / sqrt(fan_in), the embedding N(0, 1), the norms' weights 1 + N(0, 0.1),
    all from ``default_rng(seed)``; opset 21, ir_version 10."""
    vocab, hidden, heads, kv_heads, head_dim, intermediate, layers, seq = \
        dataclasses.astuple(sizes)
    rng = np.random.default_rng(seed)
    graph = _Graph()

    def linear(rows: int, cols: int) -> np.ndarray:
        """A [rows, cols] weight, N(0, 1) / sqrt(rows)."""
        return rng.standard_normal((rows, cols)) / np.sqrt(rows)

    def norm_weight() -> np.ndarray:
        """An RMSNorm's weight [hidden], 1 + N(0, 0.1)."""
        return 1 + 0.1 * rng.standard_normal(hidden)

    cos, sin = _rotary_tables(seq, head_dim)
    upper = np.triu(np.ones((seq, seq), bool), k=1)
    tables = (graph.weight("rotary.cos", cos), graph.weight("rotary.sin", sin),
              graph.weight("causal_mask", np.where(upper, np.finfo(np.float32).min, 0)))
    h = graph.op("embed_tokens", "Gather",
                 [graph.weight("embed_tokens.weight", rng.standard_normal((vocab, hidden))),
                  "input_ids"], axis=0)
    for k in range(layers):
        prefix = f"layers.{k}"
        x = _rms_norm(graph, f"{prefix}.input_layernorm", h, norm_weight())
        attention = {"q_proj": linear(hidden, heads * head_dim),
                     "k_proj": linear(hidden, kv_heads * head_dim),
                     "v_proj": linear(hidden, kv_heads * head_dim),
                     "o_proj": linear(heads * head_dim, hidden)}
        shape = (seq, heads, kv_heads, head_dim)
        h = graph.op(prefix, "Add", [h, _attention(graph, prefix, x, attention, tables, shape)])
        x = _rms_norm(graph, f"{prefix}.post_attention_layernorm", h, norm_weight())
        mlp = {"gate_proj": linear(hidden, intermediate), "up_proj": linear(hidden, intermediate),
               "down_proj": linear(intermediate, hidden)}
        h = graph.op(prefix, "Add", [h, _mlp(graph, prefix, x, mlp)])
    x = _rms_norm(graph, "norm", h, norm_weight())
    graph.op("lm_head", "MatMul", [x, graph.weight("lm_head.weight", linear(hidden, vocab))])
    graph.nodes[-1].output[0] = "logits"
    model = helper.make_model(
        helper.make_graph(
            graph.nodes, "llama",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
            graph.initializers),
        opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests/decoder.py")
    model.ir_version = IR_VERSION
    return model


def quantized(model: onnx.ModelProto, bits: int = 4, block_size: int = 32,
              symmetric: bool = True, accuracy_level: int | None = None,
              quant_format: str = "QOperator", exclude=()) -> onnx.ModelProto:
    """``model``'s weight-only twin as onnxruntime's MatMulNBitsQuantizer writes it with its
    default round to nearest (DefaultWeightOnlyQuantConfig), the nodes named in ``exclude``
    (its nodes_to_exclude) left in float; ``quant_format`` "QOperator" for com.microsoft
    MatMulNBits or "QDQ" for a blockwise DequantizeLinear of INT4/UINT4 weights feeding the
    MatMul. ``model`` is not changed. The quantizer imports onnx_ir, which only the dev
    requirements pin."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    # the quantizer logs every node at INFO through the root handler it installs
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric,
                                          accuracy_level=accuracy_level, bits=bits,
                                          quant_format=getattr(QuantFormat, quant_format))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    quantizer = MatMulNBitsQuantizer(copy, nodes_to_exclude=list(exclude), algo_config=config)
    quantizer.process()
    return quantizer.model.model
