"""Small ONNX models for the tests, built with onnx.helper, and the tests' one way each to
quantize a model (``quantize``), to run one in a session of their own (``run``) and to expose
tensors as outputs typed by shape inference (``with_outputs``); every RNG is seeded.

real_models.py builds real-shaped models on top of these; both quantize and run through here.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
DIMS = {"seq": 8, "h": 16, "w": 16}  # sizes for symbolic dims in feeds; "batch" takes ``rows``


def finish(nodes, inputs, outputs, initializers=(), name: str = "test") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def save(model: onnx.ModelProto, path) -> Path:
    onnx.save(model, str(path))
    return Path(path)


def float_input(name: str = "x", features: int = 8, batch="N"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, features])


def chain(features: int = 8, widths=(12, 10, 8, 8, 6), seed: int = 0, gemm_layers=(),
          batch="N", scale: float = 1.0) -> onnx.ModelProto:
    """x -> [MatMul|Gemm] -> Add -> Relu ... ; the last layer has no Relu; output "y"."""
    rng = np.random.default_rng(seed)
    nodes, inits, current, fan_in = [], [], "x", features
    for k, width in enumerate(widths):
        w = (scale * rng.standard_normal((fan_in, width)) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.1 * rng.standard_normal(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(b, f"b{k}")]
        last = k == len(widths) - 1
        out = "y" if last else f"add{k}"
        if k in gemm_layers:
            nodes.append(helper.make_node("Gemm", [current, f"W{k}", f"b{k}"], [out]))
        else:
            nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"mm{k}"]))
            nodes.append(helper.make_node("Add", [f"mm{k}", f"b{k}"], [out]))
        current = out
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{k}"]))
            current = f"relu{k}"
        fan_in = width
    return finish(nodes, [float_input("x", features, batch)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, widths[-1]])],
                  inits)


def ops_graph(op_types: list[str]) -> onnx.ModelProto:
    """A valid single-chain graph whose nodes have exactly these op types, in this order."""
    unary = {"Relu", "Sigmoid", "Tanh", "Softmax", "Identity", "Abs", "Neg", "Exp"}
    nodes, inits, current = [], [], "x"
    for k, op in enumerate(op_types):
        out = f"t{k}"
        if op in ("MatMul", "Add", "Mul", "Sub"):
            shape = (4, 4) if op == "MatMul" else (4,)
            inits.append(numpy_helper.from_array(np.full(shape, 0.5, np.float32), f"c{k}"))
            nodes.append(helper.make_node(op, [current, f"c{k}"], [out]))
        elif op == "Gemm":
            inits.append(numpy_helper.from_array(np.eye(4, dtype=np.float32), f"c{k}"))
            nodes.append(helper.make_node("Gemm", [current, f"c{k}"], [out]))
        elif op in unary:
            nodes.append(helper.make_node(op, [current], [out]))
        else:
            raise ValueError(op)
        current = out
    # With no op types the graph has no nodes and its output is its input.
    return finish(nodes, [float_input("x", 4)],
                  [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["N", 4])], inits)


def contract_input(seed: int, features: int) -> np.ndarray:
    """The contract input, written out again here from CONTRACT.md."""
    return np.random.default_rng(seed).standard_normal((64, features)).astype(np.float32)


def residual_chain() -> onnx.ModelProto:
    """x -> MatMul -> Relu (r) -> MatMul -> Relu (c) -> MatMul -> Add(., r) (s) -> MatMul -> y:
    the segment into s reads r, a skip tensor from two boundaries back."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((6, 6)) / 2.4).astype(np.float32),
                                     f"W{k}") for k in range(4)]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["a"], name="mm0"),
             helper.make_node("Relu", ["a"], ["r"], name="relu0"),
             helper.make_node("MatMul", ["r", "W1"], ["b"], name="mm1"),
             helper.make_node("Relu", ["b"], ["c"], name="relu1"),
             helper.make_node("MatMul", ["c", "W2"], ["d"], name="mm2"),
             helper.make_node("Add", ["d", "r"], ["s"], name="add"),
             helper.make_node("MatMul", ["s", "W3"], ["y"], name="mm3")]
    return finish(nodes, [float_input("x", 6)],
                         [helper.make_tensor_value_info("y", 1, ["N", 6])], inits)


# -- quantizing -----------------------------------------------------------------------------------

def calibration_feeds(model: onnx.ModelProto, seed: int, batches: int = 4, rows: int = 4,
                      dims: dict | None = None) -> list:
    """``batches`` feed dicts for the graph inputs. A symbolic dim takes its size from ``dims``
    (over DIMS), else ``rows`` (the batch dim). Floats are standard normal; an int input that a
    Gather reads an initializer table with is uniform over the table's rows (token ids); every
    other int input is ones (attention masks; sr = 1)."""
    sizes, inits = {**DIMS, **(dims or {})}, {t.name: t for t in model.graph.initializer}
    tables = {n.input[1]: inits[n.input[0]].dims[0] for n in model.graph.node
              if n.op_type == "Gather" and n.input[0] in inits}
    rng, feeds = np.random.default_rng(seed), []
    for _ in range(batches):
        feed = {}
        for value in (v for v in model.graph.input if v.name not in inits):
            shape = [d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param, rows)
                     for d in value.type.tensor_type.shape.dim]
            dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            if np.issubdtype(dtype, np.floating):
                feed[value.name] = rng.standard_normal(shape).astype(dtype)
            elif value.name in tables:
                feed[value.name] = rng.integers(0, tables[value.name], shape).astype(dtype)
            else:
                feed[value.name] = np.ones(shape, dtype)
        feeds.append(feed)
    return feeds


@contextlib.contextmanager
def _quiet():
    """Root logger at ERROR while quantizing; the quantizer's print()s go to stderr."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        root.setLevel(level)


def _clamp(path) -> None:
    """ir_version <= 8 and default-domain opset <= 17, what onnxruntime 1.16 opens (a guard:
    with opset-17 input neither stack raises them today)."""
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, 8)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = min(opset.version, OPSET)
    onnx.save(model, str(path))


ROUTES = ("qdq", "qoperator", "dynamic")


def quantize(fp32, out, seed: int = 0, per_channel: bool = False, *, route: str = "qdq",
             activation_type: str | None = None, weight_type: str = "QInt8", rows: int = 16,
             dims: dict | None = None, exclude=(), op_types=None,
             extra_options: dict | None = None, reduce_range: bool = False) -> Path:
    """``fp32`` quantized by onnxruntime.quantization into ``out``, kept at ir_version 8 /
    opset 17 so that the oldest stack (onnx 1.15, onnxruntime 1.16) opens it; ``exclude``
    names nodes left float (``nodes_to_exclude``), ``extra_options`` go to quantize_static.

    ``route`` "qdq" and "qoperator" are quantize_static, MinMax-calibrated on
    ``calibration_feeds(model, seed, rows=rows, dims=dims)`` (the lab chains: 4 batches of 16
    standard-normal rows), activations int8 for QDQ and uint8 for QOperator unless
    ``activation_type`` says otherwise; "dynamic" is quantize_dynamic of the MatMuls, with no
    calibration (``seed`` is unused).

    What each route names (onnxruntime 1.16.3 and 1.32.0 alike, unless said):

    - QDQ: float nodes keep their name and op; input t of a quantized node is read as
      t_DequantizeLinear_Output (one DQ per tensor, shared by all readers) from
      t_QuantizeLinear -> t_QuantizeLinear_Output -> t_DequantizeLinear, with t_scale /
      t_zero_point; weight W is W_quantized -> W_DequantizeLinear_Output. A Relu after a
      quantized producer is removed and the producer writes the Relu's output name. A graph
      output y is written as y_QuantizeLinear_Input and y itself comes from y_DequantizeLinear.
      Only 1.32 also quantizes LayerNormalization and BatchNormalization (scale W ->
      W_DequantizeLinear_Output; the int32 bias's DQ output keeps the bias name), so only 1.32
      removes the Relu after a BatchNormalization.
    - QOperator: QLinearMatMul, QLinearConv and com.microsoft QGemm, QLinearAdd, QLinearMul,
      QLinearSoftmax, QLinearConcat, QLinearSigmoid, QLinearGlobalAveragePool, on uint8
      activations by default (u8s8, a pair every CPU QLinear kernel has). Node n becomes
      n_quant, tensor t becomes t_quantized, and most float tensor names disappear. A removed
      Relu leaves the producer's name (the opposite of QDQ). Past Reshape/Transpose (and
      Flatten, on 1.32 only) the scale is the upstream tensor's u_scale, not t_scale. A graph
      output y comes from y_DequantizeLinear(y_quantized); ArgMax reads the uint8 tensor.
    - dynamic: a MatMul n with a constant B, reading x and writing y, becomes x_QuantizeLinear
      (DynamicQuantizeLinear -> x_quantized, x_scale, x_zero_point), n_quant (MatMulInteger ->
      y_output_quantized), a Cast, and Mul n_quant_output_scale_mul, which writes y. MatMuls of
      two activations stay float (1.16 prints "Ignore MatMul ..."; sent to stderr), and so do
      Gemm and Conv (ConvInteger with int8 weights has no CPU kernel on onnxruntime 1.16.3).
    """
    from onnxruntime import quantization

    if route not in ROUTES:
        raise ValueError(route)
    weights = getattr(quantization.QuantType, weight_type)
    with _quiet():
        if route == "dynamic":
            quantization.quantize_dynamic(str(fp32), str(out), weight_type=weights,
                                          per_channel=per_channel, op_types_to_quantize=["MatMul"],
                                          nodes_to_exclude=list(exclude))
        else:
            feeds = iter(calibration_feeds(onnx.load(str(fp32)), seed, rows=rows, dims=dims))

            class Reader(quantization.CalibrationDataReader):
                def get_next(self):
                    return next(feeds, None)

            activations = activation_type or ("QInt8" if route == "qdq" else "QUInt8")
            quantization.quantize_static(
                str(fp32), str(out), Reader(),
                quant_format=getattr(quantization.QuantFormat, "QDQ" if route == "qdq"
                                     else "QOperator"),
                per_channel=per_channel, weight_type=weights,
                activation_type=getattr(quantization.QuantType, activations),
                nodes_to_exclude=list(exclude),
                op_types_to_quantize=list(op_types) if op_types else None,
                extra_options=dict(extra_options or {}), reduce_range=reduce_range)
    _clamp(out)
    return Path(out)


# -- running: sessions the tests open themselves ----------------------------------------------

def run(model, feeds, outputs=None, *, typed: bool = False, level: str | None = None,
        threads: int = 0, disabled=()) -> list:
    """``model``'s outputs on ``feeds``, from a CPU session opened here (an oracle's, never
    eprun's code).

    ``model`` is a path or an onnx.ModelProto; ``feeds`` a dict (inputs the model does not take
    are dropped: one dict serves a model and its quantized twin) or the one input's array.
    ``outputs`` names what to fetch, in order (default: the graph outputs); a name that is not a
    graph output is added as one, untyped (onnxruntime infers the type) or, ``typed``, declared
    as shape inference types it (``with_outputs``). Default session options, unless ``level``
    names a GraphOptimizationLevel ("ORT_DISABLE_ALL", ...): then with ``threads`` intra-op
    threads and one inter-op thread. ``disabled`` names graph optimizers to turn off.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    source = str(model)
    if isinstance(model, onnx.ModelProto) or outputs:
        proto = onnx.ModelProto()
        proto.CopyFrom(model if isinstance(model, onnx.ModelProto) else onnx.load(str(model)))
        if typed:
            proto = with_outputs(proto, outputs or ())
        declared = {value.name for value in proto.graph.output}
        proto.graph.output.extend(onnx.ValueInfoProto(name=name) for name in
                                  dict.fromkeys(outputs or ()) if name not in declared)
        source = proto.SerializeToString()
    extra = {"disabled_optimizers": list(disabled)} if disabled else {}
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], **extra)
    if not isinstance(feeds, dict):
        feeds = {session.get_inputs()[0].name: feeds}
    taken = {value.name for value in session.get_inputs()}
    return session.run(list(outputs) if outputs else None,
                       {name: value for name, value in feeds.items() if name in taken})


def with_outputs(model, names) -> onnx.ModelProto:
    """``model`` (a path or a ModelProto) with ``names`` added as graph outputs, each declared
    with the type onnx's shape inference gives it (how expose declares a boundary, written out
    again here)."""
    inferred = onnx.shape_inference.infer_shapes(
        model if isinstance(model, onnx.ModelProto) else onnx.load(str(model)))
    known = {value.name: value
             for value in list(inferred.graph.value_info) + list(inferred.graph.input)}
    present = {value.name for value in inferred.graph.output}
    for name in names:
        if name not in present:
            inferred.graph.output.append(known[name])
            present.add(name)
    return inferred
