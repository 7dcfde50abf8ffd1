"""sensitivity: which quantized units to keep in float, checked against quantize_static itself.

Emulation equals reality: for every unit, the graph eprun builds for nodes_to_exclude=[unit]
gives the final output quantize_static gives when rerun with that exclusion and the same
calibration data (only where the quantizer would need calibration data eprun does not have,
and eprun says so, may they differ). The ranking finds planted damage, and the recommended
nodes_to_exclude, applied with quantize_static, reaches the error eprun promised."""
from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
import real_models
from conftest import run_eprun
from onnx import numpy_helper

import eprun as tool

# quantize_static (QDQ) calibrated on models.calibration_feeds(model, 1): 4 batches of 4 rows
CALIBRATION = {"seed": 1, "rows": 4}


def named_chain() -> onnx.ModelProto:
    model = models.chain(features=8, widths=(12, 10, 10, 8, 6), seed=3, gemm_layers=(2,))
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}{index}"
    return model


CASES = {"chain": (named_chain, {}),
         "chain_u8_per_channel": (named_chain, {"activation_type": "QUInt8", "per_channel": True}),
         "residual": (models.residual_chain, {}),
         "cnn": (lambda: real_models.residual_cnn(2), {}),
         "encoder": (lambda: real_models.transformer_encoder(1), {})}


def final_output(path, feeds) -> np.ndarray:
    model = onnx.load(str(path))
    name = next(o.name for o in model.graph.output if o.type.tensor_type.elem_type == 1)
    return models.run(path, feeds, [name])[0]


@pytest.mark.parametrize("case", list(CASES))
def test_emulation_equals_quantize_static_for_every_unit(tmp_path, case):
    build, options = CASES[case]
    fp32 = models.save(build(), tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, **CALIBRATION, **options)
    run = tool.SensitivityRun(str(fp32), str(int8), 5, None)
    assert run.units
    inexact = {}
    for unit in run.units:
        run.measure([unit])
        emulated = run.last
        excluded = tmp_path / "x.onnx"
        models.quantize(fp32, excluded, exclude=[unit.name], **CALIBRATION, **options)
        real = final_output(excluded, run.int8_feed)
        deviation = float(np.abs(emulated.astype(np.float64) - real).max()
                          / (np.abs(real).max() or 1.0))
        reason = tool._data_dependent(run.int8_index, unit)
        if reason is None:
            assert deviation < 1e-5, (unit.name, deviation)
        else:  # what the quantizer decides from calibration data: measured, and said
            inexact[unit.name] = deviation
            assert deviation < 0.1, (unit.name, deviation)
    if case != "encoder":
        assert inexact == {}
    else:  # its Softmax and its position embedding's Gather: documented in the README
        assert set(inexact) <= {"/layer0/attn/Softmax", "/embeddings/position_embeddings/Gather",
                                "/embeddings/word_embeddings/Gather"}


def sqnr(reference, candidate) -> float:
    reference, candidate = reference.astype(np.float64), candidate.astype(np.float64)
    return float(10 * np.log10((reference ** 2).sum() / ((reference - candidate) ** 2).sum()))


def test_a_damaged_unit_ranks_first(eprun, tmp_path):
    fp32 = models.save(named_chain(), tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, **CALIBRATION)
    model = onnx.load(str(int8))
    for tensor in model.graph.initializer:  # matmul3's weight scale, three times too large
        if tensor.name == "W1_scale":
            scaled = (numpy_helper.to_array(tensor) * 3).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(scaled, tensor.name))
    damaged = models.save(model, tmp_path / "damaged.onnx")
    answer = eprun("sensitivity", fp32, damaged, "5")
    assert answer["units"][0]["name"] == "matmul3"
    gains = [unit["gain_db"] for unit in answer["units"]]
    assert gains == sorted(gains, reverse=True) and gains[0] > 3
    assert answer["recommendation"]["nodes_to_exclude"][0] == "matmul3"


def test_the_recommendation_keeps_its_promise(eprun, tmp_path):
    fp32 = models.save(real_models.residual_cnn(2), tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, **CALIBRATION)
    first = eprun("sensitivity", fp32, int8, "5", "--target-sqnr", "1000", "--max-units", "2")
    quantized = first["quantized"]["sqnr_db"]
    best = first["recommendation"]["steps"][-1]["sqnr_db"]
    assert first["recommendation"]["met"] is False and best > quantized
    assert len(first["recommendation"]["nodes_to_exclude"]) == 2
    target = (quantized + best) / 2
    answer = eprun("sensitivity", fp32, int8, "5", "--target-sqnr", str(target))
    chosen = answer["recommendation"]["nodes_to_exclude"]
    assert answer["recommendation"]["met"] is True and chosen
    assert answer["recommendation"]["steps"][-1]["sqnr_db"] >= target
    # requantize the float model with eprun's list and the same calibration data
    requantized = tmp_path / "requantized.onnx"
    models.quantize(fp32, requantized, exclude=chosen, **CALIBRATION)
    feeds = {"image": np.random.default_rng(5).standard_normal((64, 3, 32, 32)).astype(
        np.float32)}
    reached = sqnr(final_output(fp32, feeds), final_output(requantized, feeds))
    assert reached >= target
    assert reached == pytest.approx(answer["recommendation"]["steps"][-1]["sqnr_db"], rel=1e-6)


def test_units_restrict_the_analysis_and_unnamed_nodes_are_named_for_what_they_are(tmp_path):
    fp32 = models.save(models.chain(features=4, widths=(4, 4, 4)), tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, **CALIBRATION)
    result = run_eprun("sensitivity", fp32, int8, "1")
    assert result.code == 0
    units = result.answer["units"]
    assert all(not unit["named"] and "#" in unit["name"] for unit in units)
    assert "quantize_static can only exclude named nodes" in result.stderr
    only = run_eprun("sensitivity", fp32, int8, "1", "--units", units[0]["name"])
    assert [unit["name"] for unit in only.answer["units"]] == [units[0]["name"]]
    unknown = run_eprun("sensitivity", fp32, int8, "1", "--units", "nope")
    assert unknown.code == 2 and "--units names 'nope'" in unknown.stderr


def test_a_model_without_qdq_is_refused(lab_pair, tmp_path):
    fp32, _ = lab_pair
    result = run_eprun("sensitivity", fp32, fp32, "1")
    assert result.code == 4 and result.stdout == ""
    assert "has no QuantizeLinear/DequantizeLinear nodes" in result.stderr


def test_the_quantizer_op_table_matches_the_installed_quantizer():
    from onnxruntime.quantization import registry

    installed = set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry)
    assert tool._quantizer_op_types() == installed
