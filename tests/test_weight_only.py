"""Layers 5 and 10 on weight-only twins (MatMulNBits, MatMulBnb4, opset 21's blockwise
DequantizeLinear of INT4/UINT4 weights, GatherBlockQuantized): their boundaries in layers, --local, growth, expose and
--boundaries; weights; inspect's weight_only; check's int4 profile; and the refusal on an
onnxruntime too old to run them. Every number is recomputed here: numpy on tests/int4.py's
oracle, sessions opened here, or onnxruntime running the quantized node alone
(``int4.weight_by_onnxruntime``), never eprun's own code."""
from __future__ import annotations

import copy
import json

import int4
import models
import numpy as np
import onnx
import pytest
from conftest import in_process
from onnx import numpy_helper

# What runs every form these tests build (8 and 2 bits, zero points, INT4 tables): onnxruntime
# 1.24.1 and onnx 1.16. On an older stack eprun refuses such a twin in one line, naming the
# release that runs it (the last tests, and test_sensitivity_int4.py's version guards); the
# numbers are checked where the forms run.
RUNS_EVERY_FORM = (tuple(int(part) for part in onnx.__version__.split(".")[:2]) >= (1, 16)
                   and __import__("eprun").ort_release() >= (1, 24, 1))
every_form = pytest.mark.skipif(not RUNS_EVERY_FORM, reason="the weight-only forms these tests "
                                "build run from onnxruntime 1.24.1 and onnx 1.16 (the pinned "
                                "stack); an older one refuses them, as the last tests check")
INT4_TABLES = hasattr(onnx.TensorProto, "INT4")

BOUNDARIES = ["x", "relu0", "relu1", "y"]  # int4.mlp()'s: the first input of each MatMul, y
# Twins whose MatMulNBits computes in float (accuracy_level 0): numpy's float64 oracle gives
# every boundary to float32's rounding.
NBITS = {"nbits4": {}, "nbits4_asym_b16": {"block_size": 16, "symmetric": False},
         "nbits8_asym": {"bits": 8, "symmetric": False},
         "nbits2": {"bits": 2}}


def save(model, path):
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def float_mlp(tmp_path_factory):
    """int4.mlp(), saved once, with its folder for the twins."""
    folder = tmp_path_factory.mktemp("int4")
    return save(int4.mlp(), folder / "f.onnx")


def twin(fp32, name: str, model) -> str:
    """``model`` saved beside ``fp32`` as NAME.onnx."""
    return save(model, fp32.parent / f"{name}.onnx")


def answer_of(capfd, *argv):
    code, out, err = in_process(capfd, *argv)
    assert code == 0, err
    return json.loads(out), err


def cosine_min(a, b) -> float:
    cosines = []
    for row_a, row_b in zip(a.reshape(64, -1), b.reshape(64, -1)):
        denominator = np.linalg.norm(row_a) * np.linalg.norm(row_b)
        cosines.append(1.0 if denominator == 0 else float(row_a @ row_b / denominator))
    return min(cosines)


# -- boundaries: a MatMulNBits input is a MatMul input ----------------------------------------

@every_form
@pytest.mark.parametrize("form", list(NBITS))
def test_a_matmul_nbits_twin_has_the_float_boundaries_and_numpys_numbers(capfd, float_mlp,
                                                                         form):
    """The first input of each MatMulNBits is a boundary, named as the float model's (the
    quantizer keeps activation names); every number is numpy's, on int4's oracle."""
    fp32 = float_mlp
    model = int4.to_matmul_nbits(onnx.load(str(fp32)), **NBITS[form])
    answer, _ = answer_of(capfd, "layers", fp32, twin(fp32, form, model), "1")
    assert answer["layer_count"] == 4
    assert [(e["fp32"], e["int8"]) for e in answer["layers"]] == [(n, n) for n in BOUNDARIES]
    x = models.contract_input(1, 32)
    a = int4.tensors(onnx.load(str(fp32)), {"x": x})
    b = int4.tensors(model, {"x": x})
    for entry, name in zip(answer["layers"], BOUNDARIES):
        difference = np.abs(a[name] - b[name]).max()
        scale = np.abs(a[name]).max()
        assert entry["max_abs_error"] == pytest.approx(difference, rel=1e-4, abs=2e-6)
        assert entry["scale"] == pytest.approx(scale, rel=1e-6)
        assert entry["rel_error"] == pytest.approx(difference / scale, rel=1e-4, abs=2e-6)
        assert entry["cos_min"] == pytest.approx(cosine_min(a[name], b[name]), abs=1e-6)
    assert answer["layers"][1]["max_abs_error"] > 0


@every_form
def test_a_qdq_int4_twin_pairs_as_its_float_model_with_onnxruntimes_numbers(capfd, float_mlp):
    """The QDQ form's MatMul reads the same activation: the same boundaries. onnxruntime fuses
    DequantizeLinear -> MatMul into MatMulNBits (accuracy level 4: int8 activations) in the
    session, so its numbers are those of a session opened here on the same exposed graph."""
    fp32 = float_mlp
    int8 = twin(fp32, "qdq_int4", int4.to_qdq_int4(onnx.load(str(fp32))))
    answer, _ = answer_of(capfd, "layers", fp32, int8, "2")
    assert [(e["fp32"], e["int8"]) for e in answer["layers"]] == [(n, n) for n in BOUNDARIES]
    x = models.contract_input(2, 32)
    a = models.run(fp32, x, BOUNDARIES, typed=True)
    b = models.run(int8, x, BOUNDARIES, typed=True)
    for entry, left, right in zip(answer["layers"], a, b):
        assert entry["max_abs_error"] == pytest.approx(
            float(np.abs(left.astype(np.float64) - right).max()), rel=1e-6, abs=1e-12)


@every_form
def test_local_segments_cut_at_a_matmul_nbits(capfd, float_mlp):
    """--local feeds each segment the fp32 value of the boundary before it: numpy feeds that
    tensor into the twin's oracle, where the nodes that would compute it stay out."""
    fp32 = float_mlp
    model = int4.to_matmul_nbits(onnx.load(str(fp32)), block_size=16, symmetric=False)
    answer, _ = answer_of(capfd, "layers", fp32, twin(fp32, "local", model), "3", "--local")
    assert answer["local_unavailable"] == []
    x = models.contract_input(3, 32)
    a = int4.tensors(onnx.load(str(fp32)), {"x": x})
    for k in range(1, 4):
        before, here = BOUNDARIES[k - 1], BOUNDARIES[k]
        segment = int4.tensors(model, {"x": x, before: a[before]})[here]
        local = answer["layers"][k]["local"]
        assert local["max_abs_error"] == pytest.approx(np.abs(a[here] - segment).max(),
                                                       rel=1e-4, abs=2e-6)
    assert answer["layers"][2]["local"]["max_abs_error"] < answer["layers"][2]["max_abs_error"]
    growth, _ = answer_of(capfd, "growth", fp32, twin(fp32, "local", model), "3", "--local")
    assert growth["rel_error"] == [entry["rel_error"] for entry in answer["layers"]]
    assert growth["local_rel_error"] == [entry["local"]["rel_error"] for entry in answer["layers"]]
    rel = growth["rel_error"]  # x is the float model's own input: no error at boundary 0
    assert rel[0] == 0 and growth["total_growth"] is None
    assert growth["growth_from_first_error"] == {"index": 1, "total_growth": rel[-1] / rel[1]}
    plain, _ = answer_of(capfd, "growth", fp32, twin(fp32, "local", model), "3")
    assert list(plain) == ["seed", "layer_count", "rel_error", "ratios", "monotone",
                           "total_growth", "max_ratio"]  # the contract's input: its fields only


def branched(features: int = 32, width: int = 48, seed: int = 3) -> onnx.ModelProto:
    """x -> MatMul Wq -> Relu -> r -> MatMul W2 -> Add -> z -> MatMul W3 -> y, where the Add's
    other input is k = MatMul(x, Wk): a key projection beside a query's, read by no boundary
    before z. Boundaries: x (Wq's and Wk's), r, z."""
    from onnx import helper

    rng = np.random.default_rng(seed)

    def weight(name, rows, cols):
        return numpy_helper.from_array(
            (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
             helper.make_node("Relu", ["q"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["m"], name="mix"),
             helper.make_node("Add", ["m", "k"], ["z"], name="add"),
             helper.make_node("MatMul", ["z", "W3"], ["y"], name="out")]
    graph = helper.make_graph(
        nodes, "branched", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                          ["N", features])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 16])],
        [weight("Wq", features, width), weight("Wk", features, width),
         weight("W2", width, width), weight("W3", width, 16)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@every_form
def test_local_counts_a_branch_that_no_earlier_boundary_needs(capfd, tmp_path):
    """The key projection k feeds z's segment from beside the previous boundary r: its 4-bit
    error is born there, so that segment computes k from the fp32 x (an earlier boundary) with
    the twin's weight. numpy's oracle feeds the twin the fp32 r and x and computes the rest."""
    fp32_model = branched()
    model = int4.to_matmul_nbits(fp32_model, block_size=16)
    fp32 = save(fp32_model, tmp_path / "f.onnx")
    answer, _ = answer_of(capfd, "layers", fp32, save(model, tmp_path / "q.onnx"), "3",
                          "--local")
    assert [entry["fp32"] for entry in answer["layers"]] == ["x", "r", "z", "y"]
    x = models.contract_input(3, 32)
    a = int4.tensors(fp32_model, {"x": x})
    segment = int4.tensors(model, {"x": x, "r": a["r"]})["z"]
    local = answer["layers"][2]["local"]
    assert local["max_abs_error"] == pytest.approx(np.abs(a["z"] - segment).max(), rel=1e-4)
    k_fed = int4.tensors(model, {"x": x, "r": a["r"], "k": a["k"]})["z"]  # k's error unseen
    assert local["max_abs_error"] != pytest.approx(np.abs(a["z"] - k_fed).max(), rel=1e-2)


@every_form
def test_expose_and_named_boundaries_on_a_weight_only_twin(capfd, float_mlp, tmp_path):
    """expose makes the same tensors outputs as on the float model; --boundaries pairs each
    named tensor with the twin's tensor of the same name."""
    fp32 = float_mlp
    int8 = twin(fp32, "named", int4.to_matmul_nbits(onnx.load(str(fp32))))
    exposed, _ = answer_of(capfd, "expose", int8, tmp_path / "exposed.onnx")
    assert exposed["boundaries"] == BOUNDARIES
    assert {o.name for o in onnx.load(str(tmp_path / "exposed.onnx")).graph.output} == \
        set(BOUNDARIES)
    answer, _ = answer_of(capfd, "layers", fp32, int8, "1", "--boundaries", "y,relu1")
    assert [(e["fp32"], e["int8"]) for e in answer["layers"]] == [("relu1", "relu1"),
                                                                  ("y", "y")]


# -- weights ------------------------------------------------------------------------------------

def worst_block_oracle(reference, weight, block_size: int) -> tuple[int, int, float]:
    """(column, K-block, largest |difference|) of a [K, N] weight, K padded with zeros."""
    difference = np.abs(reference.astype(np.float64) - weight.astype(np.float64))
    k, n = difference.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n))
    padded[:k] = difference
    per_block = padded.reshape(blocks, block_size, n).max(axis=1)  # [blocks, N]
    block, column = np.unravel_index(np.argmax(per_block.T), per_block.T.shape)[::-1]
    return int(column), int(block), float(per_block[block, column])


def sqnr(reference, weight) -> float:
    reference, weight = reference.astype(np.float64), weight.astype(np.float64)
    return float(20 * np.log10(np.linalg.norm(reference) / np.linalg.norm(reference - weight)))


ODD = {"features": 40, "widths": (48, 72, 10), "seed": 3}  # K 40: a block of 32 runs short
FORMS = {
    "nbits4": ({}, int4.to_matmul_nbits, (4, 32, True, 0)),
    "nbits4_asym_odd": (ODD, lambda m: int4.to_matmul_nbits(m, symmetric=False),
                        (4, 32, False, 0)),
    "nbits4_acc4_b16": ({}, lambda m: int4.to_matmul_nbits(m, block_size=16, accuracy_level=4),
                        (4, 16, True, 4)),
    "nbits8": ({}, lambda m: int4.to_matmul_nbits(m, bits=8, symmetric=False), (8, 32, False, 0)),
    "nbits2_odd": (ODD, lambda m: int4.to_matmul_nbits(m, bits=2), (2, 32, True, 0)),
    "qdq_int4": ({}, int4.to_qdq_int4, (4, 32, True, None)),
    "qdq_uint4_odd": (ODD, lambda m: int4.to_qdq_int4(m, block_size=16, signed=False),
                      (4, 16, False, None)),
    "bnb4_nf4": ({}, lambda m: bnb4(m, 1, 32), (4, 32, True, None)),
    "bnb4_fp4_odd": (ODD, lambda m: bnb4(m, 0, 16), (4, 16, True, None)),
}


def bnb4(model, quant_type: int, block_size: int):
    """onnxruntime's own MatMulBnb4Quantizer (FP4 0, NF4 1): it needs no onnx_ir."""
    from onnxruntime.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer

    quantizer = MatMulBnb4Quantizer(copy.deepcopy(model), quant_type, block_size)
    quantizer.process()
    return quantizer.model.model


@every_form
@pytest.mark.parametrize("form", list(FORMS))
def test_weights_of_a_weight_only_twin_are_onnxruntimes(capfd, tmp_path, form):
    """Each weight against its float original, dequantized as onnxruntime computes it (the
    node run alone on an identity matrix), with how it is quantized and its worst block."""
    shape, make, (bits, block_size, symmetric, level) = FORMS[form]
    fp32_model = int4.mlp(**shape)
    model = make(fp32_model)
    fp32 = save(fp32_model, tmp_path / "f.onnx")
    answer, err = answer_of(capfd, "weights", fp32, save(model, tmp_path / "q.onnx"))
    assert err == ""
    floats = {t.name: numpy_helper.to_array(t) for t in fp32_model.graph.initializer}
    assert [entry["name"] for entry in answer["weights"]] == ["W0", "W1", "W2"]
    assert answer["weight_count"] == 3
    for entry in answer["weights"]:
        node = next(n for n in model.graph.node if entry["quantized"] in n.input)
        weight = int4.weight_by_onnxruntime(model, node.name)
        reference = floats[entry["name"]]
        assert entry["op_type"] == node.op_type and entry["shape"] == list(reference.shape)
        assert entry["node"] == next(n.name for n in fp32_model.graph.node
                                     if entry["name"] in n.input)  # nodes_to_exclude's name
        assert entry["sqnr_db"] == pytest.approx(sqnr(reference, weight), rel=1e-5)
        assert entry["max_abs_error"] == pytest.approx(
            float(np.abs(reference.astype(np.float64) - weight).max()), rel=1e-6)
        assert (entry["bits"], entry["block_size"], entry["symmetric"],
                entry["accuracy_level"], entry["axis"]) == (bits, block_size, symmetric, level, 0)
        column, block, largest = worst_block_oracle(reference, weight, block_size)
        assert entry["worst_block"] == {"column": column, "block": block,
                                        "max_abs_error": pytest.approx(largest, rel=1e-6)}
    worst = min(answer["weights"], key=lambda entry: entry["sqnr_db"])
    assert answer["worst"] == {"name": worst["name"], "sqnr_db": worst["sqnr_db"]}


@every_form
def test_a_quantized_table_and_weights_that_share_an_activation_pair_by_their_node(capfd,
                                                                                   tmp_path):
    """q_proj, k_proj and v_proj read one activation with weights of one shape: each pairs by
    the output it writes. The GatherBlockQuantized table pairs with the Gather writing the
    same output, its worst block named by its row."""
    lm = int4.tiny_lm()
    model = int4.to_gather_block_quantized(int4.to_matmul_nbits(lm), block_size=16)
    fp32 = save(lm, tmp_path / "lm.onnx")
    answer, _ = answer_of(capfd, "weights", fp32, save(model, tmp_path / "lm_q4.onnx"))
    assert [(e["name"], e["quantized"], e["op_type"]) for e in answer["weights"]] == [
        ("E", "E_Q4", "GatherBlockQuantized"), ("Wq", "Wq_Q4", "MatMulNBits"),
        ("Wk", "Wk_Q4", "MatMulNBits"), ("Wv", "Wv_Q4", "MatMulNBits"),
        ("Wo", "Wo_Q4", "MatMulNBits")]
    table = answer["weights"][0]
    reference = numpy_helper.to_array(next(t for t in lm.graph.initializer if t.name == "E"))
    weight = int4.weight_by_onnxruntime(model, "embed_Q4")
    assert table["sqnr_db"] == pytest.approx(sqnr(reference, weight), rel=1e-5)
    assert (table["bits"], table["block_size"], table["axis"]) == (4, 16, 1)
    # blocks run along axis 1 here: the oracle's K-blocks are the table's transposed rows
    row, block, largest = worst_block_oracle(reference.T, weight.T, 16)
    assert table["worst_block"] == {"row": row, "block": block,
                                    "max_abs_error": pytest.approx(largest, rel=1e-6)}


@pytest.mark.parametrize("disguise", ["weights", "outputs"])
def test_projections_sharing_an_activation_pair_by_output_or_else_by_weight_name(capfd,
                                                                                 tmp_path,
                                                                                 disguise):
    """q, k and v projections read one activation: their twin's weights renamed to say
    nothing (A_Q4, B_Q4, C_Q4) still pair by the output each writes; their outputs renamed
    instead (q2, k2, v2) still pair by the names the quantizer gave their weights."""
    lm = int4.tiny_lm()
    model = int4.to_matmul_nbits(lm)
    if disguise == "weights":
        for old, new in (("Wq", "A"), ("Wk", "B"), ("Wv", "C")):
            for suffix in ("_Q4", "_scales"):
                rename(model, old + suffix, new + suffix)
    else:
        for name in ("q", "k", "v"):
            rename(model, name, name + "2")
    fp32 = save(lm, tmp_path / "lm.onnx")
    answer, _ = answer_of(capfd, "weights", fp32, save(model, tmp_path / "lm_q4.onnx"))
    floats = {t.name: numpy_helper.to_array(t) for t in lm.graph.initializer}
    by_name = {entry["name"]: entry for entry in answer["weights"]}
    assert sorted(by_name) == ["Wk", "Wo", "Wq", "Wv"]
    for name, node in (("Wq", "q_proj"), ("Wk", "k_proj"), ("Wv", "v_proj")):
        assert by_name[name]["node"] == node
        weight = int4.weight_by_onnxruntime(model, node + "_Q4")
        assert by_name[name]["sqnr_db"] == pytest.approx(sqnr(floats[name], weight), rel=1e-5)


def rename(model, old: str, new: str):
    """``model`` with tensor ``old`` called ``new`` wherever it appears."""
    for tensor in model.graph.initializer:
        tensor.name = new if tensor.name == old else tensor.name
    for node in model.graph.node:
        for field in (node.input, node.output):
            for k, name in enumerate(field):
                if name == old:
                    field[k] = new
    return model


@every_form
def test_weights_pair_by_the_node_never_by_the_initializers_name(capfd, tmp_path):
    """Two 64x64 layers whose packed weights trade names: each is still measured against the
    float weight of the MatMul that reads the same activation. A twin whose activation has
    another name than the float one's is left out, with a note, not paired by its name."""
    fp32_model = int4.mlp(widths=(64, 64, 64, 16))
    model = int4.to_matmul_nbits(fp32_model)
    for name in ("W1_Q4", "W1_scales"):
        rename(model, name, "tmp")
        rename(model, name.replace("1", "2"), name)
        rename(model, "tmp", name.replace("1", "2"))
    fp32 = save(fp32_model, tmp_path / "f.onnx")
    answer, _ = answer_of(capfd, "weights", fp32, save(model, tmp_path / "q.onnx"))
    floats = {t.name: numpy_helper.to_array(t) for t in fp32_model.graph.initializer}
    by_name = {entry["name"]: entry for entry in answer["weights"]}
    assert by_name["W1"]["quantized"] == "W2_Q4" and by_name["W2"]["quantized"] == "W1_Q4"
    for name, node in (("W1", "layer1/MatMul_Q4"), ("W2", "layer2/MatMul_Q4")):
        weight = int4.weight_by_onnxruntime(model, node)
        assert by_name[name]["sqnr_db"] == pytest.approx(sqnr(floats[name], weight), rel=1e-5)
        assert by_name[name]["sqnr_db"] > 15
    moved = rename(int4.to_matmul_nbits(int4.mlp()), "relu0", "act0")
    code, out, err = in_process(capfd, "weights", save(int4.mlp(), tmp_path / "g.onnx"),
                                save(moved, tmp_path / "moved.onnx"))
    assert code == 0, err
    assert [entry["name"] for entry in json.loads(out)["weights"]] == ["W0", "W2"]
    assert "1 weight-only weight of" in err and "'W1_Q4'" in err and "left out" in err


def test_an_unnamed_float_node_is_named_as_sensitivity_names_its_unit(capfd, tmp_path):
    """``node`` of a weight whose float MatMul has no name: ``MatMul#<k>``, the k-th MatMul."""
    fp32_model = int4.mlp()
    model = int4.to_matmul_nbits(fp32_model)
    for node in (*fp32_model.graph.node, *model.graph.node):
        node.name = ""
    fp32 = save(fp32_model, tmp_path / "f.onnx")
    answer, _ = answer_of(capfd, "weights", fp32, save(model, tmp_path / "q.onnx"))
    assert [entry["node"] for entry in answer["weights"]] == ["MatMul#0", "MatMul#1", "MatMul#2"]


@every_form
def test_weights_of_a_twin_of_another_model_is_a_failure(capfd, tmp_path):
    """No weight of the twin pairs with one of the float model: exit 4 and one line, not an
    answer of 0 weights a CI job would pass."""
    fp32 = save(int4.mlp(), tmp_path / "f.onnx")
    other = save(int4.to_matmul_nbits(int4.tiny_lm()), tmp_path / "lm_q4.onnx")
    code, out, err = in_process(capfd, "weights", fp32, other)
    assert (code, out) == (4, "")
    assert err.count("\n") == 1 and "pairs with a weight of" in err


@every_form
def test_the_report_of_a_weight_only_twin_says_what_was_measured(capfd, tmp_path):
    """No clipping sentence about QuantizeLinear ranges that are not there, no "null" ratio in
    the table, the growth from the first error, and a recommendation for the quantizer that
    made the twin."""
    fp32_model = int4.mlp()
    fp32 = save(fp32_model, tmp_path / "f.onnx")
    q4 = save(int4.to_matmul_nbits(fp32_model, block_size=16), tmp_path / "q.onnx")
    code, _, err = in_process(capfd, "report", fp32, q4, "--out-dir", tmp_path / "out",
                              "--sensitivity")
    assert code == 0, err
    report = (tmp_path / "out" / "ep_report.md").read_text(encoding="utf-8")
    growth = json.loads((tmp_path / "out" / "growth.json").read_text(encoding="utf-8"))
    assert "none is clipped here" not in report and "so nothing was measured" in report
    table = [line for line in report.splitlines() if line.startswith("| 1 | `relu0`")]
    assert len(table) == 1 and "null" not in table[0]
    rel = growth["rel_error"]  # growth.json keeps the contract's fields for its input
    assert "growth_from_first_error" not in growth and rel[0] == 0 < rel[1]
    assert (f"from boundary 1, the first with an error, the last relative error is "
            f"**{rel[-1] / rel[1]:.4g}** times that one.") in report
    assert "for MatMulNBitsQuantizer)" in report and "quantize_static" not in report.split(
        "Recommended")[-1].split("\n")[0]


def test_int8_answers_keep_their_fields(capfd, lab_pair):
    """An int8 twin's weights entries and inspect answer carry no weight-only field."""
    import eprun

    fp32, int8 = lab_pair
    answer, _ = answer_of(capfd, "weights", fp32, int8)
    for entry in answer["weights"]:
        assert list(entry)[:7] == ["name", "quantized", "op_type", "shape", "axis", "sqnr_db",
                                   "max_abs_error"]
        assert set(entry) <= {*list(entry)[:7], "qdq_loss_debug_sqnr_db"}
    inspected, _ = answer_of(capfd, "inspect", int8)
    assert tuple(inspected) == eprun.COMMANDS["inspect"].fields


# -- inspect -------------------------------------------------------------------------------------

@every_form
def test_inspect_sums_up_the_weight_only_weights(capfd, tmp_path):
    """Ops by type, bits, block sizes, accuracy levels, and the bytes of the packed weights,
    scales and zero points against the float32 bytes they stand for (K * N * 4)."""
    lm = int4.tiny_lm()
    model = int4.to_gather_block_quantized(
        int4.to_matmul_nbits(lm, block_size=16, symmetric=False, accuracy_level=4))
    answer, _ = answer_of(capfd, "inspect", save(model, tmp_path / "lm.onnx"))
    # every initializer of the twin is a packed weight, a scale or a zero point, each stored raw
    stored = sum(len(t.raw_data) for t in model.graph.initializer)
    floats = sum(numpy_helper.to_array(t).nbytes for t in lm.graph.initializer)  # all weights
    assert answer["weight_only"] == {
        "ops": {"MatMulNBits": 4, "GatherBlockQuantized": 1}, "bits": [4],
        "block_sizes": [16, 32], "accuracy_levels": [4], "bytes": stored,
        "float32_bytes": floats}
    code, out, _ = in_process(capfd, "inspect", tmp_path / "lm.onnx", "--format", "table")
    assert code == 0 and "weight-only: MatMulNBits 4, GatherBlockQuantized 1; 4-bit" in out


# -- check: the int4 profile ---------------------------------------------------------------------

@every_form
@pytest.mark.parametrize("form", ["nbits4", "qdq_int4", "bnb4_nf4"])
def test_check_holds_a_weight_only_4bit_twin_to_the_int4_profile(capfd, tmp_path, form):
    """Chosen by --profile auto and said; a round-to-nearest twin passes it."""
    import eprun

    _, make, _ = FORMS[form]
    fp32 = save(int4.mlp(), tmp_path / "f.onnx")
    candidate = save(make(int4.mlp()), tmp_path / "q.onnx")
    code, out, err = in_process(capfd, "check", fp32, candidate)
    answer = json.loads(out)
    assert (code, answer["profile"], answer["passed"]) == (0, "int4", True), err
    assert answer["tolerance"] == eprun.TOLERANCE_PROFILES["int4"]
    assert "profile int4 (no --profile given: auto)" in err and "weights only" in err
    code, out, _ = in_process(capfd, "check", fp32, candidate, "--profile", "int4")
    assert code == 0 and json.loads(out)["profile"] == "int4"


@every_form
def test_the_int4_profile_fails_a_twin_whose_nibbles_are_swapped(capfd, tmp_path):
    """A packer that puts the first code in the high nibble: a broken twin fails."""
    fp32 = save(int4.mlp(), tmp_path / "f.onnx")
    model = int4.to_matmul_nbits(int4.mlp())
    for tensor in model.graph.initializer:
        if tensor.name == "W1_Q4":
            codes = numpy_helper.to_array(tensor)
            tensor.CopyFrom(numpy_helper.from_array(((codes & 0xF) << 4 | codes >> 4)
                                                    .astype(np.uint8), tensor.name))
    code, out, _ = in_process(capfd, "check", fp32, save(model, tmp_path / "q.onnx"))
    answer = json.loads(out)
    assert code == 1 and answer["profile"] == "int4" and not answer["passed"]
    assert {failure["bound"] for failure in answer["failures"]} == {"tolerance", "min_cos"}


@every_form
def test_an_8bit_weight_only_twin_keeps_the_int8_profile(capfd, tmp_path):
    fp32 = save(int4.mlp(), tmp_path / "f.onnx")
    candidate = save(int4.to_matmul_nbits(int4.mlp(), bits=8), tmp_path / "q.onnx")
    _, out, err = in_process(capfd, "check", fp32, candidate, "--profile", "auto")
    assert json.loads(out)["profile"] == "int8" and "--profile auto: int8" in err


# -- an onnxruntime too old for the twin -----------------------------------------------------------

@pytest.mark.parametrize("release, build, needs", [
    ("1.16.3", lambda m: int4.to_matmul_nbits(m, symmetric=False),
     ("its 4-bit MatMulNBits weights with zero points or an accuracy_level run on onnxruntime "
      "1.17.0 and later")),
    ("1.22.0", lambda m: int4.to_matmul_nbits(m, bits=8),
     "its 8-bit MatMulNBits weights run on onnxruntime 1.23.0 and later"),
    pytest.param("1.18.1", int4.to_qdq_int4,
                 "its INT4/UINT4 weights (DequantizeLinear) run on onnxruntime 1.19.0 and later",
                 marks=pytest.mark.skipif(not INT4_TABLES, reason="INT4 tensors need onnx 1.16")),
])
def test_an_onnxruntime_too_old_for_the_twin_names_the_release_that_runs_it(
        capfd, tmp_path, monkeypatch, release, build, needs):
    """Refused before onnxruntime tries (1.16's asymmetric sums would be wrong, 1.22 fails
    8 bits at run time only), naming the release; what that release runs, it runs."""
    import onnxruntime

    fp32 = save(int4.mlp(), tmp_path / "f.onnx")
    int8 = save(build(int4.mlp()), tmp_path / "q.onnx")
    monkeypatch.setattr(onnxruntime, "__version__", release)
    code, out, err = in_process(capfd, "layers", fp32, int8, "1")
    assert (code, out) == (4, "")
    assert err == (f"eprun: error: onnxruntime {release} cannot run {str(int8)!r}: {needs}; "
                   "upgrade it (pip install --upgrade onnxruntime)\n")
    code, _, err = in_process(capfd, "check", fp32, int8)
    assert code == 4 and needs in err
    symmetric = save(int4.to_matmul_nbits(int4.mlp()), tmp_path / "sym.onnx")
    code, _, err = in_process(capfd, "layers", fp32, symmetric, "1")
    assert code == 0, err  # 4-bit MatMulNBits without zero points runs from 1.16.2
