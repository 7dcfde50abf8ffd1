"""eprun on a Llama-like decoder (tests/decoder.py: RMSNorm, rotary embedding, grouped-query
attention under a causal mask, SwiGLU) and its 4-bit weight-only twins made by onnxruntime's own
MatMulNBitsQuantizer: layers and --local, weights, sensitivity, check and inspect. Every number
is recomputed here from sessions opened here (``models.run``, which exposes tensors as graph
outputs), the weights as onnxruntime dequantizes them (``int4.weight_by_onnxruntime``: the
quantized node run alone on an identity matrix), never from eprun's own code."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import decoder
import int4
import models
import numpy as np
import onnx
import pytest
from conftest import in_process
from onnx import numpy_helper

import eprun as tool

pytest.importorskip("onnx_ir", reason="onnxruntime's MatMulNBitsQuantizer, which makes the twins "
                    "here, imports onnx_ir: a test tool that requirements-dev.txt pins and "
                    "onnxruntime does not depend on")
pytestmark = pytest.mark.skipif(
    tool.ort_release() < (1, 24, 1), reason="the twins here (zero points, accuracy_level 4, "
    "INT4 weights) are held to what onnxruntime 1.24.1 and later run, as test_weight_only.py's "
    "every_form is; an older one refuses some of them")

VOCAB, SEQ = 64, 8  # decoder.llama()'s defaults
MATMULS = decoder.weight_matmuls()  # the 15 float MatMuls with a weight, in graph order
# name -> (decoder.quantized's keywords, (symmetric, accuracy_level) as weights reports them)
TWINS = {
    "sym_b32": ({}, (True, 0)),
    "asym_b32_level4": ({"symmetric": False, "accuracy_level": 4}, (False, 4)),
    "qdq_b32": ({"quant_format": "QDQ"}, (True, None)),
}
# check's int4 profile, as docs/commands.md states it
INT4_PROFILE = {"rtol": 0.2, "atol": 0.5, "min_cos": 0.96}
# sensitivity's target for seed 1 on the sym_b32 twin: the fully quantized logits are at 14.8
# dB, and restoring the best unit, then the next, gives 15.9 and 16.9 dB: two units
TARGET_SQNR = 16.5
# The segment whose local error each weight-only MatMul's error is born in, by the index of the
# boundary that ends it (the boundaries: per layer its input norm, the rotated queries, the
# Softmax, the heads merged, the post-attention norm, the SwiGLU product; then the final norm
# and the logits). The key and value projections feed no boundary of their own: the key's error
# is born in the Softmax's segment, the value's where the heads are merged.
BORN_IN = {
    1: ["layers.0.self_attn.q_proj/MatMul"],
    2: ["layers.0.self_attn.k_proj/MatMul"],
    3: ["layers.0.self_attn.v_proj/MatMul"],
    4: ["layers.0.self_attn.o_proj/MatMul"],
    5: ["layers.0.mlp.gate_proj/MatMul", "layers.0.mlp.up_proj/MatMul"],
    6: ["layers.0.mlp.down_proj/MatMul"],
    7: ["layers.1.self_attn.q_proj/MatMul"],
    8: ["layers.1.self_attn.k_proj/MatMul"],
    9: ["layers.1.self_attn.v_proj/MatMul"],
    10: ["layers.1.self_attn.o_proj/MatMul"],
    11: ["layers.1.mlp.gate_proj/MatMul", "layers.1.mlp.up_proj/MatMul"],
    12: ["layers.1.mlp.down_proj/MatMul"],
    13: ["lm_head/MatMul"],
}


@dataclass(frozen=True)
class Decoder:
    """The float decoder and its twins, saved once for the module, and token ids of our own."""

    folder: Path
    model: onnx.ModelProto
    path: Path
    twins: dict  # name -> (model, path)
    ids: np.ndarray  # [1, SEQ]
    ids_file: Path  # ids as numpy.savez wrote them, for --inputs


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Decoder:
    """decoder.llama() and its TWINS, built and saved once."""
    folder = tmp_path_factory.mktemp("decoder")
    model = decoder.llama()
    twins = {}
    for name, (settings, _) in TWINS.items():
        twin = decoder.quantized(model, **settings)
        twins[name] = (twin, models.save(twin, folder / f"{name}.onnx"))
    ids = np.random.default_rng(7).integers(0, VOCAB, (1, SEQ))
    np.savez(folder / "ids.npz", input_ids=ids)
    return Decoder(folder, model, models.save(model, folder / "fp32.onnx"), twins, ids,
                   folder / "ids.npz")


def answer_of(capfd, *argv) -> tuple[dict, str]:
    """eprun's JSON answer and stderr for a run that succeeds."""
    code, out, err = in_process(capfd, *argv)
    assert code == 0, err
    return json.loads(out), err


def eprun_ids(seed: int) -> np.ndarray:
    """The token ids eprun feeds without --inputs, as docs/commands.md (Real models) says it
    draws them: default_rng(seed).integers(0, rows of the table) in the input's shape."""
    return np.random.default_rng(seed).integers(0, VOCAB, (1, SEQ))


def logits(model, ids) -> np.ndarray:
    """The model's logits for ``ids`` from a session opened here, as float64."""
    return models.run(model, {"input_ids": ids})[0].astype(np.float64)


def boundaries(model: onnx.ModelProto) -> list[str]:
    """The first input of each MatMul in graph order, each once, then the output."""
    names = [node.input[0] for node in model.graph.node if node.op_type == "MatMul"]
    return [*dict.fromkeys(names), model.graph.output[0].name]


def cosine(a, b) -> float:
    """The cosine of two flattened tensors, in float64."""
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def sqnr_db(reference, candidate) -> float:
    """10 log10 of the reference's power over the error's, in float64."""
    reference = np.asarray(reference, np.float64)
    error = reference - np.asarray(candidate, np.float64)
    return float(10 * np.log10((reference ** 2).sum() / (error ** 2).sum()))


def quantized_node(twin: onnx.ModelProto, float_node: str) -> str:
    """The twin's node holding the weight of ``float_node``: MatMulNBits ``<name>_Q4``, or the
    QDQ form's DequantizeLinear ``<name>_DQ_Q4`` (MatMulNBitsQuantizer's names)."""
    names = {node.name for node in twin.graph.node}
    return next(name for name in (f"{float_node}_Q4", f"{float_node}_DQ_Q4") if name in names)


def with_weights_of(model: onnx.ModelProto, twin: onnx.ModelProto, nodes) -> onnx.ModelProto:
    """A copy of the float ``model`` whose MatMuls ``nodes`` multiply by the weight the twin
    dequantizes for them (onnxruntime running the twin's node alone), the rest in float."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weights = {node.input[1]: int4.weight_by_onnxruntime(twin, quantized_node(twin, node.name))
               for node in copy.graph.node if node.name in nodes}
    for tensor in copy.graph.initializer:
        if tensor.name in weights:
            tensor.CopyFrom(numpy_helper.from_array(weights[tensor.name], tensor.name))
    assert len(weights) == len(nodes)
    return copy


# -- the fixture ---------------------------------------------------------------------------------

def test_the_twins_differ_from_the_decoder_but_stay_close(llama):
    """The float decoder runs (finite logits of order 1); each twin quantizes its 15 weight
    MatMuls, changes the logits and keeps them close (cosine over 0.9)."""
    reference = logits(llama.model, llama.ids)
    assert reference.shape == (1, SEQ, VOCAB) and np.isfinite(reference).all()
    assert 0.1 < reference.std() < 10
    for name, (twin, _) in llama.twins.items():
        quantized = [node.name for node in twin.graph.node
                     if node.op_type in ("MatMulNBits", "DequantizeLinear")]
        assert len(quantized) == len(MATMULS), name
        candidate = logits(twin, llama.ids)
        assert np.abs(candidate - reference).max() > 1e-3, name
        assert cosine(reference, candidate) > 0.9, name


# -- layers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("twin_name", list(TWINS))
def test_layers_pairs_the_boundaries_by_name_with_numbers_of_sessions_opened_here(
        capfd, llama, twin_name):
    """Every MatMul input (the attention's two activation MatMuls included) and the logits,
    each paired with the twin's tensor of the same name; max_abs_error, scale, rel_error and
    cos_min of each are those of both models with the same boundaries exposed, on our ids."""
    twin, path = llama.twins[twin_name]
    answer, _ = answer_of(capfd, "layers", llama.path, path, "1", "--local",
                          "--inputs", llama.ids_file)
    assert answer["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [1, SEQ],
                                 "source": "file"}]
    expected = boundaries(llama.model)
    assert len(expected) == 14 and expected[2] == "layers.0.self_attn/Softmax_output_0"
    assert [(entry["fp32"], entry["int8"]) for entry in answer["layers"]] == \
        [(name, name) for name in expected]
    assert "pairing" not in answer and answer["local_unavailable"] == []
    feeds = {"input_ids": llama.ids}
    a = models.run(llama.model, feeds, expected)
    b = models.run(twin, feeds, expected)
    for entry, left, right in zip(answer["layers"], a, b):
        left, right = left.astype(np.float64), right.astype(np.float64)
        difference, scale = np.abs(left - right).max(), np.abs(left).max()
        rows = [cosine(x, y) for x, y in zip(left.reshape(1, -1), right.reshape(1, -1))]
        assert entry["max_abs_error"] == pytest.approx(difference, rel=1e-6, abs=1e-9)
        assert entry["scale"] == pytest.approx(scale, rel=1e-7)
        assert entry["rel_error"] == pytest.approx(difference / scale, rel=1e-6, abs=1e-9)
        assert entry["cos_min"] == pytest.approx(min(rows), abs=1e-9)
    assert answer["layers"][0]["max_abs_error"] == 0  # the norm of the float embedding
    assert all(entry["max_abs_error"] > 0 for entry in answer["layers"][1:])


def test_each_weights_error_is_born_in_the_segment_that_first_reads_it(capfd, llama):
    """--local on the twin that computes in float (accuracy_level 0): each segment's local
    error is the float model's with only the weights first read in that segment replaced by
    their 4-bit dequantization. The key projection feeds the Softmax's segment from beside the
    rotated queries (eprun once fed that segment the float keys and reported 0 there), the
    value projection the merged heads'."""
    twin, path = llama.twins["sym_b32"]
    answer, _ = answer_of(capfd, "layers", llama.path, path, "1", "--local",
                          "--inputs", llama.ids_file)
    names = [entry["fp32"] for entry in answer["layers"]]
    assert answer["layers"][0]["local"]["max_abs_error"] == 0
    feeds = {"input_ids": llama.ids}
    floats = dict(zip(names, models.run(llama.model, feeds, names)))
    for index, nodes in BORN_IN.items():
        name = names[index]
        alone = models.run(with_weights_of(llama.model, twin, nodes), feeds, [name])[0]
        difference = np.abs(floats[name].astype(np.float64) - alone).max()
        local = answer["layers"][index]["local"]
        assert local["max_abs_error"] == pytest.approx(difference, rel=1e-4), (name, nodes)
        assert local["rel_error"] == pytest.approx(
            difference / np.abs(floats[name]).max(), rel=1e-4), (name, nodes)
    softmax = answer["layers"][2]
    assert softmax["fp32"] == "layers.0.self_attn/Softmax_output_0"
    assert softmax["local"]["max_abs_error"] > 1e-3, "k_proj's 4-bit error went unseen"


# -- weights -------------------------------------------------------------------------------------

@pytest.mark.parametrize("twin_name", list(TWINS))
def test_weights_pairs_every_projection_with_onnxruntimes_dequantization(capfd, llama,
                                                                         twin_name):
    """The 15 weights (7 a layer and the lm_head), each named by its float MatMul node (what
    nodes_to_exclude takes), with SQNR and largest error of the weight onnxruntime dequantizes
    (the twin's node alone on an identity matrix), quantized as built."""
    twin, path = llama.twins[twin_name]
    symmetric, level = TWINS[twin_name][1]
    answer, _ = answer_of(capfd, "weights", llama.path, path)
    assert answer["weight_count"] == len(MATMULS)
    assert [entry["node"] for entry in answer["weights"]] == MATMULS
    floats = {node.name: node.input[1] for node in llama.model.graph.node
              if node.name in MATMULS}
    tables = {t.name: numpy_helper.to_array(t) for t in llama.model.graph.initializer}
    for entry in answer["weights"]:
        reference = tables[floats[entry["node"]]].astype(np.float64)
        weight = int4.weight_by_onnxruntime(twin, quantized_node(twin, entry["node"]))
        assert entry["name"] == floats[entry["node"]]
        assert entry["shape"] == list(reference.shape)
        assert entry["sqnr_db"] == pytest.approx(
            20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - weight)),
            rel=1e-5)
        assert entry["max_abs_error"] == pytest.approx(np.abs(reference - weight).max(),
                                                       rel=1e-6)
        assert (entry["bits"], entry["block_size"], entry["symmetric"],
                entry["accuracy_level"], entry["axis"]) == (4, 32, symmetric, level, 0)
    worst = min(answer["weights"], key=lambda entry: entry["sqnr_db"])
    assert answer["worst"] == {"name": worst["name"], "sqnr_db": worst["sqnr_db"]}


# -- sensitivity ---------------------------------------------------------------------------------

def test_sensitivitys_recommendation_is_what_the_quantizer_gives_with_it(capfd, llama):
    """Units are the float MatMuls by name; the settings read off the twin are those it was
    made with; requantized by MatMulNBitsQuantizer itself with one unit in nodes_to_exclude,
    then with each step's list, on the ids eprun draws for seed 1, the logits have the SQNR
    that unit or step states, and the target is met in the step that first reaches it."""
    _, path = llama.twins["sym_b32"]
    answer, _ = answer_of(capfd, "sensitivity", llama.path, path, "1",
                          "--target-sqnr", str(TARGET_SQNR))
    assert answer["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [1, SEQ],
                                 "source": "integers[0, 63] (rows of embed_tokens.weight)"}]
    assert sorted(unit["name"] for unit in answer["units"]) == sorted(MATMULS)
    assert answer["predicted_by"] == "graph edits"
    assert answer["quantizer"] == {
        "class": "MatMulNBitsQuantizer", "algorithm": "DEFAULT", "bits": 4, "block_size": 32,
        "is_symmetric": True, "accuracy_level": None, "nodes_to_exclude": [],
        "quant_format": "QOperator", "op_types_to_quantize": None}
    recommendation = answer["recommendation"]
    chosen, steps = recommendation["nodes_to_exclude"], recommendation["steps"]
    assert recommendation["met"] and 1 <= len(steps) <= 3
    assert [step["added"] for step in steps] == chosen
    ids = eprun_ids(1)
    reference = logits(llama.model, ids)
    quantized = sqnr_db(reference, logits(llama.twins["sym_b32"][0], ids))
    assert answer["quantized"]["sqnr_db"] == pytest.approx(quantized, rel=1e-6)
    for unit in answer["units"]:  # each restored alone
        alone = sqnr_db(reference, logits(decoder.quantized(llama.model, exclude=[unit["name"]]),
                                          ids))
        assert unit["sqnr_db"] == pytest.approx(alone, rel=1e-6), unit["name"]
        assert unit["gain_db"] == pytest.approx(alone - quantized, rel=1e-6, abs=1e-9)
    for k, step in enumerate(steps, start=1):
        excluded = decoder.quantized(llama.model, exclude=chosen[:k])
        reached = sqnr_db(reference, logits(excluded, ids))
        assert step["sqnr_db"] == pytest.approx(reached, rel=1e-6), chosen[:k]
        assert step["met"] == (reached >= TARGET_SQNR)


# -- check ---------------------------------------------------------------------------------------

def passes(reference, candidate) -> bool:
    """The int4 profile's bounds, worked out here: every element within atol + rtol * |ref|
    and the cosine of the whole outputs at least min_cos."""
    within = np.abs(candidate - reference) <= (INT4_PROFILE["atol"]
                                               + INT4_PROFILE["rtol"] * np.abs(reference))
    return bool(within.all() and cosine(reference, candidate) >= INT4_PROFILE["min_cos"])


@pytest.mark.parametrize("twin_name", list(TWINS))
def test_check_holds_each_twin_to_the_int4_profile_and_passes_it(capfd, llama, twin_name):
    """Without --profile, a weight-only 4-bit twin gets the int4 profile, said on stderr; on
    the ids eprun draws for seed 0 it passes, as the bounds worked out here say, with the
    largest difference and cosine of sessions opened here."""
    twin, path = llama.twins[twin_name]
    code, out, err = in_process(capfd, "check", llama.path, path)
    answer = json.loads(out)
    assert (code, answer["profile"], answer["passed"]) == (0, "int4", True), err
    assert "profile int4 (no --profile given: auto)" in err
    assert answer["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [1, SEQ],
                                 "source": "integers[0, 63] (rows of embed_tokens.weight)"}]
    assert answer["tolerance"] == INT4_PROFILE
    reference, candidate = logits(llama.model, eprun_ids(0)), logits(twin, eprun_ids(0))
    assert passes(reference, candidate)
    (output,) = answer["outputs"]
    assert output["max_abs_diff"] == pytest.approx(np.abs(candidate - reference).max(),
                                                   rel=1e-6)
    assert output["cosine"] == pytest.approx(cosine(reference, candidate), abs=1e-9)


def test_check_fails_a_twin_whose_first_layer_has_scales_three_times_too_large(capfd, llama):
    """Every scale of layer 0's seven MatMulNBits multiplied by 3: the int4 profile fails it,
    exit 1, as the bounds worked out here do."""
    twin = onnx.ModelProto()
    twin.CopyFrom(llama.twins["sym_b32"][0])
    damaged = {node.input[2] for node in twin.graph.node
               if node.op_type == "MatMulNBits" and node.name.startswith("layers.0.")}
    assert len(damaged) == 7
    for tensor in twin.graph.initializer:
        if tensor.name in damaged:
            scaled = (numpy_helper.to_array(tensor) * 3).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(scaled, tensor.name))
    path = models.save(twin, llama.folder / "damaged.onnx")
    code, out, _ = in_process(capfd, "check", llama.path, path)
    answer = json.loads(out)
    assert (code, answer["profile"], answer["passed"]) == (1, "int4", False)
    assert answer["failures"]
    assert not passes(logits(llama.model, eprun_ids(0)), logits(twin, eprun_ids(0)))


# -- inspect -------------------------------------------------------------------------------------

@pytest.mark.parametrize("twin_name", list(TWINS))
def test_inspect_sums_up_the_twins_weights_as_built(capfd, llama, twin_name):
    """weight_only: the 15 quantizing nodes by op type, 4 bits in blocks of 32, the accuracy
    level given (0 when unset; none for the QDQ form), the bytes of the packed weights, scales
    and zero points those nodes read, and the float32 bytes of the 15 weights."""
    twin, path = llama.twins[twin_name]
    settings, (_, level) = TWINS[twin_name]
    answer, _ = answer_of(capfd, "inspect", path)
    qdq = settings.get("quant_format") == "QDQ"
    op_type = "DequantizeLinear" if qdq else "MatMulNBits"
    stored = {t.name: len(t.raw_data) for t in twin.graph.initializer}
    read = {name for node in twin.graph.node if node.op_type == op_type
            for name in node.input if name in stored}
    tables = {t.name: numpy_helper.to_array(t) for t in llama.model.graph.initializer}
    weights = [node.input[1] for node in llama.model.graph.node if node.name in MATMULS]
    assert answer["weight_only"] == {
        "ops": {op_type: len(MATMULS)}, "bits": [4], "block_sizes": [32],
        "accuracy_levels": [] if level is None else [level],
        "bytes": sum(stored[name] for name in read),
        "float32_bytes": sum(tables[name].size * 4 for name in weights)}
    assert all(stored[name] > 0 for name in read)  # every one held as raw bytes
