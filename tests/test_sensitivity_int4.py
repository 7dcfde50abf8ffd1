"""Layer 7, sensitivity on weight-only 4-bit twins (MatMulNBits, and the QDQ form's blockwise
DequantizeLinear).

A twin made by onnxruntime's MatMulNBitsQuantizer (com.microsoft MatMulNBits, or its QDQ form's
blockwise DequantizeLinear) has a unit per quantized MatMul, named by the float node it replaced;
restoring one is a graph edit that writes what the quantizer writes with that node in
nodes_to_exclude, bit for bit; the ranking finds planted damage; and the answer says which
quantizer its recommendation is for, with the settings read off the twin."""
from __future__ import annotations

import int4
import models
import numpy as np
import onnx
import pytest
from conftest import run_eprun
from onnx import numpy_helper

import eprun as tool

LAYERS = ["layer0/MatMul", "layer1/MatMul", "layer2/MatMul"]
# What onnxruntime runs (int4.py): 4-bit MatMulNBits from 1.16.2, but 1.16 reads asymmetric zero
# points in an older layout and rejects accuracy_level; the QDQ form (INT4 tensors) from 1.19
# and onnx 1.16; 8-bit MatMulNBits from 1.23.
ASYMMETRIC = tool.ort_release() >= (1, 17)
QDQ_INT4 = tool.ort_release() >= (1, 19) and hasattr(onnx.TensorProto, "INT4")
EIGHT_BITS = tool.ort_release() >= (1, 23)
# (form, settings): int4.to_matmul_nbits's or to_qdq_int4's keywords, and whether this stack runs it
TWINS = {
    "nbits_symmetric": ("QOperator", {"symmetric": True}, True),
    "nbits_asymmetric_level4": ("QOperator", {"symmetric": False, "accuracy_level": 4},
                                ASYMMETRIC),
    "nbits_8bit": ("QOperator", {"bits": 8, "symmetric": True}, EIGHT_BITS),
    "qdq_signed": ("QDQ", {"signed": True}, QDQ_INT4),
    "qdq_unsigned": ("QDQ", {"signed": False}, QDQ_INT4),
}


def twin_of(model, form: str, settings: dict, exclude=()) -> onnx.ModelProto:
    """``model``'s weight-only twin as MatMulNBitsQuantizer's default RTN writes it (int4.py),
    block size 32."""
    if form == "QOperator":
        return int4.to_matmul_nbits(model, block_size=32, exclude=exclude, **settings)
    return int4.to_qdq_int4(model, block_size=32, exclude=exclude, **settings)


def twin_case(case: str):
    form, settings, runs = TWINS[case]
    if not runs:
        pytest.skip(f"onnxruntime {tool.ort_release()} does not run the {case} twin")
    return form, settings


def saved_pair(tmp_path, case: str, model=None):
    """The MLP and its ``case`` twin, saved."""
    form, settings = twin_case(case)
    model = model if model is not None else int4.mlp()
    fp32 = models.save(model, tmp_path / "f.onnx")
    twin = models.save(twin_of(model, form, settings), tmp_path / "q4.onnx")
    return fp32, twin


@pytest.mark.parametrize("case", list(TWINS))
def test_a_twin_has_a_unit_per_matmul_named_by_the_float_node(tmp_path, case):
    """Each blockwise MatMul is a unit named by the float MatMul it replaced (what
    nodes_to_exclude takes), not by the twin's own node ("layer0/MatMul_Q4",
    "layer0/MatMul_matmul_Q4"); the settings are read off the graph."""
    form, settings = twin_case(case)
    fp32, twin = saved_pair(tmp_path, case)
    with tool.SensitivityStudy(str(fp32), str(twin), 5, None) as study:
        assert [(unit.name, unit.op_type, unit.named) for unit in study.units] == \
            [(name, "MatMul", True) for name in LAYERS]
        suffix = "_Q" + str(settings.get("bits", 4)) if form == "QOperator" else "_matmul_Q4"
        twin_nodes = study.int8_model.graph.node
        assert [twin_nodes[unit.int8_index].name for unit in study.units] == \
            [name + suffix for name in LAYERS]
        assert study.predicted_by == "graph edits" and study.requantizer is None
        symmetric = settings.get("symmetric", settings.get("signed"))
        assert study.quantizer_arguments() == {
            "class": "MatMulNBitsQuantizer", "algorithm": "DEFAULT",
            "bits": settings.get("bits", 4), "block_size": 32, "is_symmetric": symmetric,
            "accuracy_level": settings.get("accuracy_level"), "nodes_to_exclude": [],
            "quant_format": form, "op_types_to_quantize": None}
        study.measure([])
        assert all(study.inexact([unit]) is None for unit in study.units)


@pytest.mark.skipif(not hasattr(onnx.TensorProto, "INT4"), reason="INT4 tables need onnx 1.16")
def test_units_sharing_an_activation_are_told_apart_by_their_outputs():
    """tiny_lm's query, key and value projections read one activation: each quantized MatMul
    is paired with the float MatMul writing its output; the quantized Gather is no unit, and
    says that Gather was quantized too."""
    fp32 = int4.tiny_lm()
    twin = int4.to_matmul_nbits(int4.to_gather_block_quantized(int4.tiny_lm()), block_size=32)
    found = tool.weight_only_twin(fp32, twin)
    names = {node.name: k for k, node in enumerate(twin.graph.node)}
    assert [unit.name for unit in found.units] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert all(unit.int8_index == names[unit.name + "_Q4"] for unit in found.units)
    assert found.arguments["op_types_to_quantize"] == ["Gather", "MatMul"]


def test_a_twin_of_unnamed_nodes_names_its_units_for_what_they_are(run_eprun_here, tmp_path):
    """The quantizer names no node it quantizes where the float node has no name."""
    model, twin = int4.mlp(), int4.to_matmul_nbits(int4.mlp(), block_size=32)
    for node in (*model.graph.node, *twin.graph.node):
        node.name = ""
    fp32 = models.save(model, tmp_path / "f.onnx")
    result = run_eprun_here("sensitivity", fp32, models.save(twin, tmp_path / "q4.onnx"), "1")
    assert result.code == 0, result.stderr
    assert sorted((unit["name"], unit["named"]) for unit in result.answer["units"]) == \
        [("MatMul#0", False), ("MatMul#1", False), ("MatMul#2", False)]
    assert "MatMulNBitsQuantizer can only exclude named nodes" in result.stderr


@pytest.mark.parametrize("case", ["nbits_symmetric", "qdq_signed"])
def test_a_restored_unit_is_the_twin_with_that_matmul_in_float(tmp_path, case):
    """Without the quantizer: restoring a unit gives, bit for bit, the final output of the twin
    int4.py writes with that node excluded (what the quantizer writes: checked below where
    onnx_ir imports), one unit, two, and all."""
    form, settings = twin_case(case)
    fp32, twin = saved_pair(tmp_path, case)
    with tool.SensitivityStudy(str(fp32), str(twin), 5, None) as study:
        for chosen in ([study.units[1]], study.units[:2], study.units):
            names = [unit.name for unit in chosen]
            study.measure(chosen)
            excluded = twin_of(int4.mlp(), form, settings, exclude=names)
            assert np.array_equal(study.last, int4.run(excluded, study.int8_feed["x"])), names


def matmul_nbits_quantizer(model, exclude=(), include=None, **settings) -> onnx.ModelProto:
    """onnxruntime's MatMulNBitsQuantizer (default RTN) on a copy of ``model`` (it changes the
    model it is given), with ``exclude`` as nodes_to_exclude and ``include`` (None: every
    MatMul) as nodes_to_include."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    quantizer = MatMulNBitsQuantizer(copy, nodes_to_exclude=list(exclude),
                                     nodes_to_include=include, **settings)
    quantizer.process()
    return quantizer.model.model


# onnxruntime's MatMulNBitsQuantizer, which makes the twins of the tests that need it
NBITS_QUANTIZER = "onnxruntime.quantization.matmul_nbits_quantizer"
WITHOUT_NBITS_QUANTIZER = ("no onnxruntime.quantization.matmul_nbits_quantizer that imports "
                           "here (it needs onnx_ir; older releases have none)")


def quantizer_takes_bits() -> bool:
    """Whether MatMulNBitsQuantizer has a ``bits`` argument (onnxruntime 1.23.2's does not,
    although 1.23 runs 8-bit MatMulNBits)."""
    import inspect

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    return "bits" in inspect.signature(MatMulNBitsQuantizer.__init__).parameters


def skip_unless_3d_weights_quantized(twin) -> None:
    """onnxruntime 1.23.2's MatMulNBitsQuantizer leaves a MatMul with a 3-D weight in float
    (a later one squeezes it and adds a Reshape chain)."""
    if any(node.op_type == "MatMul" and "W1" in node.input for node in twin.graph.node):
        pytest.skip("this MatMulNBitsQuantizer leaves a MatMul with a 3-D weight in float")


def leading_one_mlp() -> onnx.ModelProto:
    """int4.mlp with layer1's weight [1, K, N]: the quantizer squeezes it and puts a Reshape
    chain after the MatMulNBits, which a restored unit must not keep."""
    model = int4.mlp()
    for tensor in model.graph.initializer:
        if tensor.name == "W1":
            weight = numpy_helper.to_array(tensor)
            tensor.CopyFrom(numpy_helper.from_array(weight[None], "W1"))
    return model


QUANTIZER_SETTINGS = {
    "default": {},  # block 128, asymmetric, QOperator
    "symmetric_32": {"block_size": 32, "is_symmetric": True},
    "asymmetric_16_level4": {"block_size": 16, "is_symmetric": False, "accuracy_level": 4},
    "bits8": {"bits": 8, "block_size": 32, "is_symmetric": True},
    "qdq_symmetric": {"block_size": 32, "is_symmetric": True, "quant_format": "QDQ"},
    "qdq_asymmetric": {"block_size": 32, "is_symmetric": False, "quant_format": "QDQ"},
    "leading_one_weight": {"block_size": 32, "is_symmetric": True},
}


@pytest.mark.parametrize("case", list(QUANTIZER_SETTINGS))
def test_restoring_equals_matmul_nbits_quantizer_with_nodes_to_exclude(tmp_path, case):
    """The promise, against onnxruntime's own quantizer (it imports onnx_ir, which eprun never
    needs): for every unit alone, two together and all, eprun's restored variant gives the final
    output MatMulNBitsQuantizer(fp32, the twin's settings, nodes_to_exclude=[...]) gives, bit for
    bit; and the settings eprun reads off the twin are the ones it was made with. (HQQ, the other
    algorithm that quantizes each weight alone, needs torch: not checked here.)"""
    pytest.importorskip(NBITS_QUANTIZER, reason=WITHOUT_NBITS_QUANTIZER)
    from onnxruntime.quantization import QuantFormat

    settings = dict(QUANTIZER_SETTINGS[case])
    if "bits" in settings and not quantizer_takes_bits():
        pytest.skip("this MatMulNBitsQuantizer has no bits argument")
    if "quant_format" in settings:
        settings["quant_format"] = getattr(QuantFormat, settings["quant_format"])
    model = leading_one_mlp() if case == "leading_one_weight" else int4.mlp()
    fp32 = models.save(model, tmp_path / "f.onnx")
    quantized = matmul_nbits_quantizer(model, **settings)
    if case == "leading_one_weight":
        skip_unless_3d_weights_quantized(quantized)
    twin = models.save(quantized, tmp_path / "q4.onnx")
    with tool.SensitivityStudy(str(fp32), str(twin), 5, None) as study:
        assert [unit.name for unit in study.units] == LAYERS
        read = study.quantizer_arguments()
        assert (read["bits"], read["block_size"], read["is_symmetric"], read["accuracy_level"]) \
            == (settings.get("bits", 4), settings.get("block_size", 128),
                settings.get("is_symmetric", False), settings.get("accuracy_level"))
        for chosen in [[unit] for unit in study.units] + [study.units[:2], study.units]:
            names = [unit.name for unit in chosen]
            study.measure(chosen)
            excluded = matmul_nbits_quantizer(model, exclude=names, **settings)
            real = models.run(excluded, study.int8_feed)[0]
            assert np.array_equal(study.last, real), names
            assert study.inexact(chosen) is None


@pytest.mark.parametrize("settings", [{"block_size": 32, "is_symmetric": False},
                                      {"block_size": 16, "is_symmetric": True,
                                       "accuracy_level": 4}])
def test_restoring_to_int8_is_the_quantizer_run_again_at_8_bits(eprun, tmp_path, settings):
    """--restore-to int8: a unit restored is what MatMulNBitsQuantizer writes with it excluded,
    then again at 8 bits with it included (the mixed precision LLM builds keep), bit for bit;
    the answer's figures are that twin's, and its recommendation's two lists write the last
    step's twin."""
    pytest.importorskip(NBITS_QUANTIZER, reason=WITHOUT_NBITS_QUANTIZER)
    if tool.ort_release() < (1, 23) or not quantizer_takes_bits():
        pytest.skip("8-bit MatMulNBits run from onnxruntime 1.23, and MatMulNBitsQuantizer "
                    "writes them when it has a bits argument")
    model = int4.mlp(widths=(64, 64, 64, 16))
    fp32 = models.save(model, tmp_path / "f.onnx")
    twin = models.save(matmul_nbits_quantizer(model, **settings), tmp_path / "q4.onnx")

    def mixed(names):
        first = matmul_nbits_quantizer(model, exclude=names, **settings)
        return matmul_nbits_quantizer(first, include=names, **{**settings, "bits": 8})

    with tool.SensitivityStudy(str(fp32), str(twin), 5, None,
                               options=tool.StudyOptions(restore_to="int8")) as study:
        for chosen in [study.units[1:2], study.units[:3]]:
            names = [unit.name for unit in chosen]
            study.measure(chosen)
            assert np.array_equal(study.last, models.run(mixed(names), study.int8_feed)[0])
    answer = eprun("sensitivity", fp32, twin, "5", "--restore-to", "int8", "--target-sqnr", "35")
    assert answer["restore_to"] == "int8" and answer["quantizer"]["then"]["bits"] == 8
    x = models.contract_input(5, 32)
    reference = int4.run(model, x).astype(np.float64)

    def sqnr(candidate):
        error = reference - candidate.astype(np.float64)
        return float(10 * np.log10((reference ** 2).sum() / (error ** 2).sum()))

    for unit in answer["units"]:
        assert unit["sqnr_db"] == pytest.approx(sqnr(int4.run(mixed([unit["name"]]), x)),
                                                rel=1e-9)
    recommendation = answer["recommendation"]
    assert recommendation["nodes_to_include"] == recommendation["nodes_to_exclude"]
    assert recommendation["steps"][-1]["sqnr_db"] == pytest.approx(
        sqnr(int4.run(mixed(recommendation["nodes_to_include"]), x)), rel=1e-9)


def float16_mlp() -> onnx.ModelProto:
    """int4.mlp() in float16: weights, input and output (MatMulNBits then scales in float16)."""
    model = int4.mlp()
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    return model


def test_restoring_a_float16_twin_to_int8_keeps_its_scales_in_float16(tmp_path):
    """The quantizer writes a float16 weight's 8-bit scales in float16: so does eprun, bit for
    bit (float32 scales beside float16 activations do not even open)."""
    pytest.importorskip(NBITS_QUANTIZER, reason=WITHOUT_NBITS_QUANTIZER)
    if tool.ort_release() < (1, 23) or not quantizer_takes_bits():
        pytest.skip("8-bit MatMulNBits run from onnxruntime 1.23, and MatMulNBitsQuantizer "
                    "writes them when it has a bits argument")
    model = float16_mlp()
    settings = {"block_size": 32, "is_symmetric": True}
    fp32 = models.save(model, tmp_path / "f16.onnx")
    twin = models.save(matmul_nbits_quantizer(model, **settings), tmp_path / "q4.onnx")
    with tool.SensitivityStudy(str(fp32), str(twin), 5, None,
                               options=tool.StudyOptions(restore_to="int8")) as study:
        for unit in study.units:
            study.measure([unit])
            first = matmul_nbits_quantizer(model, exclude=[unit.name], **settings)
            mixed = matmul_nbits_quantizer(first, include=[unit.name], **{**settings, "bits": 8})
            assert np.array_equal(study.last, models.run(mixed, study.int8_feed)[0]), unit.name


def tied_mlp() -> onnx.ModelProto:
    """int4.mlp() whose layer1 reads layer0's weight W0 too (a 32-wide MLP, so both fit)."""
    model = int4.mlp(features=32, widths=(32, 32, 16))
    for node in model.graph.node:
        if node.name == "layer1/MatMul":
            node.input[1] = "W0"
    kept = [t for t in model.graph.initializer if t.name != "W1"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def test_restoring_to_int8_refuses_what_the_quantizer_would_write_otherwise(run_eprun_here,
                                                                           tmp_path):
    """A weight two MatMuls share (the quantizer's 8-bit initializers would clash) and a 3-D
    weight (the quantizer reshapes it): one line each, exit 4, before anything is measured; an
    options record with another value is a usage error."""
    pytest.importorskip(NBITS_QUANTIZER, reason=WITHOUT_NBITS_QUANTIZER)
    for name, model in (("tied", tied_mlp()), ("nd", leading_one_mlp())):
        fp32 = models.save(model, tmp_path / f"{name}.onnx")
        quantized = matmul_nbits_quantizer(model, block_size=32, is_symmetric=True)
        if name == "nd":
            skip_unless_3d_weights_quantized(quantized)
        twin = models.save(quantized, tmp_path / f"{name}4.onnx")
        result = run_eprun_here("sensitivity", fp32, twin, "5", "--restore-to", "int8")
        assert (result.code, result.stdout) == (4, "") and result.stderr.count("\n") == 1
        assert ("read by several MatMuls" if name == "tied" else "is 3-D") in result.stderr
    with pytest.raises(tool.EprunError, match="float or int8") as raised:
        tool.sensitivity(str(fp32), str(twin), 5, tool.SensitivityOptions(restore_to="fp16"))
    assert raised.value.code == tool.EXIT_USAGE


def test_a_twin_with_any_4bit_weight_is_held_to_the_int4_profile_as_check_holds_it(
        run_eprun_here, tmp_path):
    """Two MatMuls at 8 bits and one at 4 (what a --restore-to int8 recommendation writes):
    check's auto profile and sensitivity's default target are both int4."""
    if not EIGHT_BITS:
        pytest.skip("8-bit MatMulNBits run from onnxruntime 1.23")
    model = int4.mlp()
    four = int4.to_matmul_nbits(model, block_size=32, exclude=["layer0/MatMul", "layer1/MatMul"])
    mixed = int4.to_matmul_nbits(four, bits=8, block_size=32)  # the MatMuls still in float
    fp32 = models.save(model, tmp_path / "f.onnx")
    twin = models.save(mixed, tmp_path / "mixed.onnx")
    checked = run_eprun_here("check", fp32, twin)
    assert "--profile auto: int4" in checked.stderr or "profile int4" in checked.stderr
    ranked = run_eprun_here("sensitivity", fp32, twin, "5")
    assert ranked.code == 0, ranked.stderr
    assert ranked.answer["target"]["profile"] == "int4"


def test_restoring_to_int8_is_refused_where_the_quantizer_cannot(run_eprun_here, tmp_path,
                                                                 lab_pair):
    """The QDQ form (MatMulNBitsQuantizer writes it at 4 bits only) and a quantize_static twin
    (no MatMulNBits: a usage error) are refused in one line, before anything is measured."""
    fp32, qdq = saved_pair(tmp_path, "qdq_signed")
    for pair, code, said in (((fp32, qdq), 4, "the QDQ form"),
                             (lab_pair, 2, "is for a weight-only twin")):
        result = run_eprun_here("sensitivity", *pair, "5", "--restore-to", "int8")
        assert (result.code, result.stdout) == (code, "") and said in result.stderr
        assert result.stderr.count("\n") == 1


def test_a_matmul_nbits_the_quantizer_never_writes_is_said_to_be_that(run_eprun_here,
                                                                      tmp_path):
    """MatMulNBits with a bias input (a Gemm's, folded by hand): no unit eprun can restore,
    and the one line says so rather than asking for a QDQ model."""
    form, settings = twin_case("nbits_symmetric")
    model = int4.mlp()
    twin = twin_of(model, form, settings)
    for k, node in enumerate(node for node in twin.graph.node if node.op_type == "MatMulNBits"):
        columns = int(onnx.helper.get_attribute_value(
            next(a for a in node.attribute if a.name == "N")))
        twin.graph.initializer.append(numpy_helper.from_array(
            np.zeros(columns, np.float32), f"bias{k}"))
        node.input.extend([""] * (5 - len(node.input)) + [f"bias{k}"])
    fp32 = models.save(model, tmp_path / "f.onnx")
    result = run_eprun_here("sensitivity", fp32, models.save(twin, tmp_path / "q4.onnx"), "5")
    assert (result.code, result.stdout) == (4, "") and result.stderr.count("\n") == 1
    assert "none of its MatMulNBits is one MatMulNBitsQuantizer writes" in result.stderr


@pytest.mark.parametrize("case", ["nbits_symmetric", "qdq_signed"])
def test_a_damaged_unit_of_a_twin_ranks_first(eprun, tmp_path, case):
    """layer1's scales three times too large: its unit gains most, and the recommendation, a
    nodes_to_exclude list for MatMulNBitsQuantizer, starts with it."""
    fp32, twin = saved_pair(tmp_path, case)
    model = onnx.load(str(twin))
    for tensor in model.graph.initializer:
        if tensor.name in ("W1_scales", "W1_DQ_scales"):
            scaled = (numpy_helper.to_array(tensor) * 3).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(scaled, tensor.name))
    damaged = models.save(model, tmp_path / "damaged.onnx")
    answer = eprun("sensitivity", fp32, damaged, "5")
    assert answer["units"][0]["name"] == "layer1/MatMul"
    gains = [unit["gain_db"] for unit in answer["units"]]
    assert gains == sorted(gains, reverse=True) and gains[0] > gains[1] + 3
    assert answer["recommendation"]["nodes_to_exclude"][0] == "layer1/MatMul"
    assert answer["predicted_by"] == "graph edits"
    assert answer["quantizer"]["class"] == "MatMulNBitsQuantizer"


def test_the_verified_recommendation_is_what_the_excluded_twin_gives(eprun, tmp_path):
    """The last step's SQNR is the SQNR of the twin written with the recommended list, and a
    node the twin already leaves in float is in both lists (the quantizer needs it told)."""
    model = int4.mlp(widths=(64, 64, 64, 16))
    fp32 = models.save(model, tmp_path / "f.onnx")
    twin = models.save(int4.to_matmul_nbits(model, block_size=32, exclude=["layer3/MatMul"]),
                       tmp_path / "q4.onnx")
    first = eprun("sensitivity", fp32, twin, "5", "--target-sqnr", "1000", "--max-units", "1")
    assert first["quantizer"]["nodes_to_exclude"] == ["layer3/MatMul"]
    assert sorted(unit["name"] for unit in first["units"]) == LAYERS
    chosen = first["recommendation"]["nodes_to_exclude"]
    assert chosen[0] == "layer3/MatMul" and len(chosen) == 2
    x = models.contract_input(5, 32)  # eprun's input for seed 5
    excluded = int4.to_matmul_nbits(model, block_size=32, exclude=chosen)
    reference = int4.run(model, x).astype(np.float64)
    error = reference - int4.run(excluded, x).astype(np.float64)
    reached = float(10 * np.log10((reference ** 2).sum() / (error ** 2).sum()))
    assert reached == pytest.approx(first["recommendation"]["steps"][-1]["sqnr_db"], rel=1e-9)


def passes(reference, candidate, rtol: float, atol: float, min_cos: float) -> bool:
    """check's bounds, worked out here: every element within atol + rtol * |reference|, and
    the cosine of the whole outputs at least min_cos."""
    reference, candidate = reference.astype(np.float64), candidate.astype(np.float64)
    within = np.abs(candidate - reference) <= atol + rtol * np.abs(reference)
    cosine = (reference * candidate).sum() / (np.linalg.norm(reference)
                                              * np.linalg.norm(candidate))
    return bool(within.all() and cosine >= min_cos)


@pytest.mark.parametrize("case, profile", [("nbits_symmetric", "int4"), ("nbits_8bit", "int8")])
def test_without_a_target_a_4bit_twin_is_held_to_the_int4_profile(run_eprun_here, tmp_path,
                                                                  case, profile):
    """As check's auto profile: a twin of 4-bit weights is held to the int4 tolerances (said
    on stderr), an 8-bit one to the int8 ones; the recommendation is the shortest prefix of the
    ranking whose twin passes them, worked out here with the quantizer's exclusions."""
    model = int4.mlp(widths=(64, 64, 64, 16))
    form, settings = twin_case(case)
    fp32 = models.save(model, tmp_path / "f.onnx")
    twin = models.save(twin_of(model, form, settings), tmp_path / "q.onnx")
    result = run_eprun_here("sensitivity", fp32, twin, "5")
    assert result.code == 0, result.stderr
    answer = result.answer
    bounds = {"int4": (0.2, 0.5, 0.96), "int8": (0.1, 0.05, 0.99)}[profile]
    assert answer["target"] == {"profile": profile, "rtol": bounds[0], "atol": bounds[1],
                                "min_cos": bounds[2]}
    assert ("target profile int4" in result.stderr) == (profile == "int4")
    x = models.contract_input(5, 32)
    reference = int4.run(model, x)
    ranked = [unit["name"] for unit in answer["units"]]
    chosen = answer["recommendation"]["nodes_to_exclude"]
    assert chosen == ranked[:len(chosen)]
    for k in range(len(chosen) + 1):
        excluded = twin_of(model, form, settings, exclude=ranked[:k])
        assert passes(reference, int4.run(excluded, x), *bounds) == (
            k == len(chosen) and answer["recommendation"]["met"])


def test_neural_compressor_names_make_every_figure_an_estimate(tmp_path):
    """Weights named W_Q4G32 come from MatMulNBitsQuantizer's neural-compressor algorithms, GPTQ
    among them, which fits the weights to calibration data: restoring is then an estimate, and
    says why; float zero points are HQQ's, which quantizes each weight alone: exact."""
    fp32, twin = saved_pair(tmp_path, "nbits_symmetric")
    model = onnx.load(str(twin))
    renamed = {f"W{k}_Q4": f"W{k}_Q4G32" for k in range(3)}
    for tensor in model.graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in model.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    gptq = models.save(model, tmp_path / "gptq.onnx")
    with tool.SensitivityStudy(str(fp32), str(gptq), 5, None) as study:
        assert study.quantizer_arguments()["algorithm"] == "RTN, k_quant or GPTQ"
        assert all("GPTQ fits the weights to calibration data" in study.inexact([unit])
                   for unit in study.units)
    hqq = int4.to_matmul_nbits(int4.mlp(), block_size=32, symmetric=True)
    scales = {tensor.name: tensor for tensor in hqq.graph.initializer}
    for node in hqq.graph.node:  # HQQ's zero points: float, one per block, like the scales
        if node.op_type == "MatMulNBits":
            shape = tuple(scales[node.input[2]].dims)
            zero = numpy_helper.from_array(np.full(shape, 7.5, np.float32), node.input[2] + "_zp")
            hqq.graph.initializer.append(zero)
            node.input.append(zero.name)
    found = tool.weight_only_twin(int4.mlp(), hqq)
    assert found.arguments["algorithm"] == "HQQ"
    assert all(found.inexact([unit]) is None for unit in found.units)


def test_a_twin_in_worker_processes_gives_the_same_answer(run_eprun_here, tmp_path):
    fp32, twin = saved_pair(tmp_path, "nbits_symmetric")
    alone = run_eprun_here("sensitivity", fp32, twin, "5", "--jobs", "1")
    together = run_eprun("sensitivity", fp32, twin, "5", "--jobs", "2")
    assert alone.code == together.code == 0, together.stderr
    assert together.stdout == alone.stdout


def test_what_a_twin_does_not_use_is_said(run_eprun_here, tmp_path):
    """--calibration and --extra-option are quantize_static's: a twin's restored MatMuls read
    the float weights. MatMuls of other block sizes are no one quantizer call: said, and the
    quantizer field gives the most common."""
    fp32, _ = saved_pair(tmp_path, "nbits_symmetric")
    mixed = int4.to_matmul_nbits(int4.to_matmul_nbits(int4.mlp(), block_size=16,
                                                      exclude=LAYERS[:2]), block_size=32)
    twin = models.save(mixed, tmp_path / "mixed.onnx")
    np.savez(tmp_path / "cal.npz", x=np.zeros((4, 32), np.float32))
    result = run_eprun_here("sensitivity", fp32, twin, "5", "--calibration",
                            str(tmp_path / "cal.npz"), "--extra-option", "WeightSymmetric=1")
    assert result.code == 0, result.stderr
    assert "is not used: " in result.stderr and "weight-only twin" in result.stderr
    assert "--extra-option WeightSymmetric is not used" in result.stderr
    assert "differ in block_size" in result.stderr
    assert result.answer["quantizer"]["block_size"] == 32


def test_an_int8_answer_keeps_its_quantize_static_fields(eprun, lab_pair):
    """A QDQ int8 model is no weight-only twin: its answer is the one it always was (the lab
    pair's answer was compared byte for byte with the release before this change)."""
    fp32, int8 = lab_pair
    answer = eprun("sensitivity", fp32, int8, "2026")
    assert answer["predicted_by"] == "quantize_static"
    assert "class" not in answer["quantizer"] and "calls" in answer["quantizer"]


def test_a_model_with_neither_qdq_nor_blockwise_weights_is_still_refused(run_eprun_here,
                                                                          lab_pair):
    fp32, _ = lab_pair
    result = run_eprun_here("sensitivity", fp32, fp32, "1")
    assert result.code == 4 and "has no QuantizeLinear/DequantizeLinear nodes" in result.stderr
