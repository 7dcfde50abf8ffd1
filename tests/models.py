"""Small ONNX models for the tests, built with onnx.helper; every RNG is seeded."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


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


def quantize(fp32_path, int8_path, seed: int = 0, per_channel: bool = False) -> None:
    """Static QDQ quantization calibrated on standard-normal rows from its own seed."""
    import logging

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = onnx.load(str(fp32_path))
    features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(seed)
            self.batches = iter([{"x": rng.standard_normal((16, features)).astype(np.float32)}
                                 for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(fp32_path), str(int8_path), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=per_channel)
    model = onnx.load(str(int8_path))
    model.ir_version = 8
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = min(opset.version, OPSET)
    onnx.save(model, str(int8_path))


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
