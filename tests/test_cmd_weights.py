"""Layer 10, ``weights``: each quantized weight against its float original, as qdq_loss_debug
computes it, for QDQ and QOperator models and every channel layout."""
from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
from conftest import in_process
from onnx import helper
from test_cmd_layers import gemm_per_channel_pair

# -- weights: each quantized weight against its float original --------------------------------

def float_and_dequantized(fp32, int8) -> dict:
    """Float weight name -> (float values, dequantized values in float64, per channel?), for
    every DequantizeLinear of an initializer, written out here from the ONNX spec."""
    from onnx import numpy_helper

    floats = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(fp32)).graph.initializer}
    model = onnx.load(str(int8))
    ints = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in ints:
            continue
        q = ints[node.input[0]].astype(np.float64)
        scale = ints[node.input[1]].astype(np.float64)
        zero = ints[node.input[2]].astype(np.float64) if len(node.input) > 2 else 0 * scale
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.size > 1:
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        name = node.input[0].removesuffix("_quantized")
        found[name] = (floats[name].astype(np.float64), (q - zero) * scale, scale.size > 1)
    return found


def sqnr(reference, dequantized) -> float:
    return 20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - dequantized))


@pytest.mark.parametrize("per_channel", [False, True])
def test_weights_equal_qdq_loss_debugs_weight_error(capfd, tmp_path, per_channel):
    """Per tensor and per channel, biases included, named by their float names: the SQNR is
    the very number qdq_loss_debug.compute_weight_error reports."""
    import json

    from onnxruntime.quantization import qdq_loss_debug

    fp32, int8 = gemm_per_channel_pair(tmp_path) if per_channel else (
        models.save(models.chain(seed=6), tmp_path / "f.onnx"), None)
    if int8 is None:
        int8 = models.quantize(fp32, tmp_path / "q.onnx", seed=6)
    code, out, err = in_process(capfd, "weights", fp32, int8)
    assert code == 0, err
    answer = json.loads(out)
    theirs = qdq_loss_debug.compute_weight_error(
        qdq_loss_debug.create_weight_matching(str(fp32), str(int8)))
    assert [entry["name"] for entry in answer["weights"]] == list(theirs)
    assert any(entry["name"].startswith("b") for entry in answer["weights"])
    assert (answer["weight_count"] == len(theirs)) and theirs
    ours = float_and_dequantized(fp32, int8)
    for entry in answer["weights"]:
        assert entry.get("qdq_loss_debug_sqnr_db", entry["sqnr_db"]) == pytest.approx(
            theirs[entry["name"]], rel=1e-12, abs=0)
        reference, dequantized, channels = ours[entry["name"]]
        assert entry["sqnr_db"] == pytest.approx(sqnr(reference, dequantized), rel=1e-5)
        assert entry["max_abs_error"] == pytest.approx(
            float(np.abs(reference - dequantized).max()), rel=1e-5)
        assert entry["shape"] == list(reference.shape)
        assert (entry["axis"] is not None) is channels
        assert channels or not per_channel or entry["name"].startswith("b")
    worst = min(answer["weights"], key=lambda entry: entry["sqnr_db"])
    assert answer["worst"] == {"name": worst["name"], "sqnr_db": worst["sqnr_db"]}
    wrapped = [entry["name"] for entry in answer["weights"] if "qdq_loss_debug_sqnr_db" in entry]
    assert bool(wrapped) is ("wraps around" in err)


def test_weights_far_from_their_zero_point_do_not_wrap_around(capfd, tmp_path):
    """uint8 weights with a zero point near 128: qdq_loss_debug subtracts in uint8, which
    wraps around; eprun's numbers are those of the spec's arithmetic."""
    import json

    fp32 = models.save(models.chain(seed=8), tmp_path / "f.onnx")
    int8 = models.quantize(fp32, tmp_path / "q.onnx", seed=8, weight_type="QUInt8",
                           activation_type="QUInt8")
    code, out, err = in_process(capfd, "weights", fp32, int8)
    assert code == 0, err
    ours = float_and_dequantized(fp32, int8)
    for entry in json.loads(out)["weights"]:
        reference, dequantized, _ = ours[entry["name"]]
        assert entry["sqnr_db"] == pytest.approx(sqnr(reference, dequantized), rel=1e-5)
        assert entry["sqnr_db"] > 30


def test_weights_of_a_qoperator_model_and_the_table_worst_first(capfd, tmp_path):
    import json

    from onnx import numpy_helper

    fp32, _ = gemm_per_channel_pair(tmp_path)
    int8 = models.quantize(fp32, tmp_path / "qop.onnx", seed=10, route="qoperator")
    code, out, err = in_process(capfd, "weights", fp32, int8)
    assert code == 0, err
    answer = json.loads(out)
    floats = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(fp32)).graph.initializer}
    model = onnx.load(str(int8))
    ints = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    expected = {}
    for node in model.graph.node:
        if node.op_type in ("QLinearMatMul", "QGemm", "QLinearAdd") and node.input[3] in ints:
            q, scale, zero = (ints[node.input[k]].astype(np.float64) for k in (3, 4, 5))
            name = node.input[3].removesuffix("_quantized")
            expected[name] = sqnr(floats[name].astype(np.float64), (q - zero) * scale)
    assert expected and {entry["name"]: entry["sqnr_db"] for entry in answer["weights"]} == \
        pytest.approx(expected, rel=1e-5)
    code, out, _ = in_process(capfd, "weights", fp32, int8, "--format", "table")
    rows = [line.split() for line in out.splitlines()[3:]]
    shown = [float(row[4]) for row in rows]
    assert code == 0 and len(rows) == len(expected) and shown == sorted(shown)
    assert rows[0][-1] == "worst" and all("worst" not in row for row in rows[1:])


def test_weights_of_a_swapped_or_unquantized_pair_are_refused(capfd, lab_pair):
    fp32, int8 = lab_pair
    code, out, err = in_process(capfd, "weights", int8, fp32)
    assert (code, out) == (2, "") and "the models look swapped" in err
    code, out, err = in_process(capfd, "weights", fp32, fp32)
    assert (code, out) == (4, "") and "has no quantized weight" in err


def test_float8_weights_are_read_as_floats_not_integers(capfd, tmp_path):
    """A float8 weight (FLOAT8E4M3FN) dequantizes as values * scale: nothing is truncated to
    an integer, and nothing wraps around."""
    import json

    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((8, 4)).astype(np.float32)
    scale = np.float32(0.5)
    fp32 = models.finish([helper.make_node("MatMul", ["x", "W"], ["y"])],
                         [models.float_input("x", 8)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                         [numpy_helper.from_array(weight, "W")])
    quantized = helper.make_tensor("W_quantized", TensorProto.FLOAT8E4M3FN, [8, 4],
                                   (weight / scale).ravel().tolist())
    int8 = models.finish(
        [helper.make_node("DequantizeLinear", ["W_quantized", "W_scale"], ["W_dq"]),
         helper.make_node("MatMul", ["x", "W_dq"], ["y"])],
        [models.float_input("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [quantized, numpy_helper.from_array(np.array(scale), "W_scale")])
    code, out, err = in_process(capfd, "weights", models.save(fp32, tmp_path / "f.onnx"),
                                models.save(int8, tmp_path / "q.onnx"))
    assert code == 0, err
    (entry,) = json.loads(out)["weights"]
    stored = numpy_helper.to_array(quantized).astype(np.float64) * float(scale)
    expected = sqnr(weight.astype(np.float64), stored)
    assert 10 < expected < 60 and "wraps" not in err
    assert entry["sqnr_db"] == pytest.approx(expected, rel=1e-6)
    assert entry["max_abs_error"] == pytest.approx(float(np.abs(weight - stored).max()),
                                                   rel=1e-6)


def test_a_weight_with_scales_that_fit_no_channel_axis_is_left_out_and_said(capfd, tmp_path):
    """Blocked quantization (two scales along an axis of 8) is left out with a note; the
    other weights are still measured."""
    import json

    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(4)
    w1, w2 = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    fp32 = models.finish([helper.make_node("MatMul", ["x", "W1"], ["h"]),
                          helper.make_node("MatMul", ["h", "W2"], ["y"])],
                         [models.float_input("x", 8)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                         [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    scale = np.float32(0.02)
    inits = [numpy_helper.from_array(np.round(w1 / scale).astype(np.int8), "W1_quantized"),
             numpy_helper.from_array(np.array(scale), "W1_scale"),
             numpy_helper.from_array(np.round(w2 / scale).astype(np.int8), "W2_quantized"),
             numpy_helper.from_array(np.full(2, scale), "W2_scale")]
    int8 = models.finish(
        [helper.make_node("DequantizeLinear", ["W1_quantized", "W1_scale"], ["W1_dq"]),
         helper.make_node("DequantizeLinear", ["W2_quantized", "W2_scale"], ["W2_dq"], axis=1),
         helper.make_node("MatMul", ["x", "W1_dq"], ["h"]),
         helper.make_node("MatMul", ["h", "W2_dq"], ["y"])],
        [models.float_input("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)
    code, out, err = in_process(capfd, "weights", models.save(fp32, tmp_path / "f.onnx"),
                                models.save(int8, tmp_path / "q.onnx"))
    assert code == 0, err
    assert [entry["name"] for entry in json.loads(out)["weights"]] == ["W1"]
    assert "'W2_quantized' (shape [8, 8], 2 scales, axis 1)" in err and "left out" in err


def test_a_transposed_qgemm_weight_has_its_channels_on_axis_0(capfd, tmp_path):
    """Gemm with transB=1 keeps its weight as (N, K): quantized per channel, QGemm's scales
    run along N, the first axis (the QGemm spec), not the last."""
    import json

    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((6, 8)) * np.linspace(0.1, 3, 6)[:, None]).astype(np.float32)
    fp32 = models.save(models.finish(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)], [models.float_input("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.zeros(6, np.float32),
                                                                       "b")]),
        tmp_path / "f.onnx")
    int8 = models.quantize(fp32, tmp_path / "q.onnx", seed=1, route="qoperator",
                           per_channel=True)
    code, out, err = in_process(capfd, "weights", fp32, int8)
    assert code == 0, err
    (entry,) = json.loads(out)["weights"]
    ints = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(int8)).graph.initializer}
    (gemm,) = [n for n in onnx.load(str(int8)).graph.node if n.op_type == "QGemm"]
    q, scale, zero = (ints[gemm.input[k]].astype(np.float64) for k in (3, 4, 5))
    assert q.shape == (6, 8) and scale.shape == (6,)
    expected = sqnr(weight.astype(np.float64), (q - zero[:, None]) * scale[:, None])
    assert entry["axis"] == 0 and entry["sqnr_db"] == pytest.approx(expected, rel=1e-6)
