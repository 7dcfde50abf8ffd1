"""Build the eprun lab models: ``fp32.onnx`` and its static QDQ quantization ``int8.onnx``.

The float model is a plain stack of fully connected layers::

    x [N, F]
      -> MatMul(W0) -> Add(b0) -> Relu      layer 0
      -> MatMul(W1) -> Add(b1) -> Relu      layer 1
      ...
      -> MatMul(Wn) -> Add(bn)              last layer, no Relu
      -> y [N, widths[-1]]

``int8.onnx`` is ``quantize_static(fp32, int8, reader, quant_format=QDQ)``: every MatMul now
reads its activation through ``QuantizeLinear -> DequantizeLinear``. The calibration reader
draws standard-normal rows, the distribution of eprun's contract input, from an RNG stream of
its own, so calibration never sees the rows eprun measures with.

Everything is seeded: the same command writes byte-identical models. Both files are saved with
``ir_version`` 8 and opset 17 so that onnxruntime releases from 1.16 on can load them.

Usage: ``python gen_ep.py [--out-dir DIR] [--seed N] [--features F] [--widths 64,64,...]
[--layers N]``
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
OPSET = 17
DEFAULT_SEED = 20261129
DEFAULT_FEATURES = 32
DEFAULT_WIDTHS = (64, 64, 48, 48, 32, 16)
CALIBRATION_ROWS = 256


def build_fp32(features: int, widths: list[int], seed: int) -> onnx.ModelProto:
    """The float model: ``len(widths)`` layers of MatMul -> Add -> Relu, the last without Relu.

    Weights are He-scaled so activations keep a similar magnitude from layer to layer; the
    biases are small and non-zero so that Relu really cuts some of every layer's outputs.
    """
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current, fan_in = "x", features
    for index, width in enumerate(widths):
        weight = (rng.standard_normal((fan_in, width)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(width)).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"W{index}"),
                         numpy_helper.from_array(bias, f"b{index}")]
        last = index == len(widths) - 1
        matmul_out, add_out = f"mm{index}", "y" if last else f"add{index}"
        nodes.append(helper.make_node("MatMul", [current, f"W{index}"], [matmul_out],
                                      name=f"layer{index}/MatMul"))
        nodes.append(helper.make_node("Add", [matmul_out, f"b{index}"], [add_out],
                                      name=f"layer{index}/Add"))
        current = add_out
        if not last:
            current = f"relu{index}"
            nodes.append(helper.make_node("Relu", [add_out], [current], name=f"layer{index}/Relu"))
        fan_in = width
    graph = helper.make_graph(
        nodes, "eprun_lab_fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, widths[-1]])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="eprun-gen_ep")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def make_reader(input_name: str, features: int, seed: int):
    """A ``CalibrationDataReader`` over standard-normal batches (the contract input's law).

    Built inside a function because ``onnxruntime.quantization`` is imported lazily.
    """
    from onnxruntime.quantization import CalibrationDataReader

    class _NormalRows(CalibrationDataReader):
        def __init__(self) -> None:
            # A stream spawned from the seed, never equal to default_rng(seed) itself.
            rng = np.random.default_rng([seed, 1])
            rows = rng.standard_normal((CALIBRATION_ROWS, features)).astype(np.float32)
            self._batches = iter(np.split(rows, CALIBRATION_ROWS // 32))
            self._input_name = input_name

        def get_next(self):
            batch = next(self._batches, None)
            return None if batch is None else {self._input_name: batch}

    return _NormalRows()


def quantize(fp32_path: str, int8_path: str, features: int, seed: int) -> None:
    """Static QDQ quantization of ``fp32_path`` into ``int8_path``, pinned back to opset 17.

    The quantizer logs a "consider pre-processing" hint for every model it has not seen through
    ``quant_pre_process``; the lab model is already plain MatMul/Add/Relu with static weights,
    so there is nothing to pre-process and the hint is silenced.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = os.path.join(scratch, "int8.onnx")
        quantize_static(fp32_path, raw, make_reader("x", features, seed),
                        quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        model = onnx.load(raw)
    model.ir_version = IR_VERSION
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > OPSET:
            opset.version = OPSET
    onnx.checker.check_model(model)
    onnx.save(model, int8_path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Build the eprun lab models fp32.onnx and int8.onnx.")
    parser.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)),
                        help="folder to write the models into (default: next to this script)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="weights and calibration seed")
    parser.add_argument("--features", type=int, default=DEFAULT_FEATURES, help="input width F")
    parser.add_argument("--widths", help="comma-joined output width of each layer, e.g. "
                        f"{','.join(map(str, DEFAULT_WIDTHS))} (the default)")
    parser.add_argument("--layers", type=int,
                        help="number of layers; alone, hidden layers keep the default first "
                        "width and the last layer the default output width")
    args = parser.parse_args(argv)
    if args.widths is None:
        widths = list(DEFAULT_WIDTHS)
        if args.layers is not None:
            widths = [DEFAULT_WIDTHS[0]] * (args.layers - 1) + [DEFAULT_WIDTHS[-1]]
    else:
        try:
            widths = [int(w) for w in args.widths.split(",") if w.strip()]
        except ValueError:
            parser.error(f"--widths must be comma-joined integers, got {args.widths!r}")
        if args.layers is not None and args.layers != len(widths):
            parser.error(f"--layers {args.layers} contradicts --widths, which has "
                         f"{len(widths)} layers")
    args.widths = widths
    if len(args.widths) < 5 or min(args.widths) < 1 or args.features < 1:
        parser.error("need at least 5 layers and positive widths")
    if args.seed < 0:
        parser.error("--seed must be non-negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    fp32_path = os.path.join(args.out_dir, "fp32.onnx")
    int8_path = os.path.join(args.out_dir, "int8.onnx")
    onnx.save(build_fp32(args.features, args.widths, args.seed), fp32_path)
    print(fp32_path)
    quantize(fp32_path, int8_path, args.features, args.seed)
    print(int8_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
