"""Every contract command run as a user runs it, each number recomputed independently."""
from __future__ import annotations

import hashlib
import re

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import in_process
from cpu import assert_settings_are_this_cpus
from onnx import helper


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def oracle_boundaries(model: onnx.ModelProto) -> list[str]:
    """CONTRACT.md's boundary rule, written out again for the tests."""
    names = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.input[0] not in names:
            names.append(node.input[0])
    if model.graph.output[0].name not in names:
        names.append(model.graph.output[0].name)
    return names


def close(actual, expected, rel=1e-6) -> bool:
    if expected is None:
        return actual is None
    return actual == pytest.approx(expected, rel=rel, abs=1e-12)


# -- providers ---------------------------------------------------------------------------------

def test_providers_reports_requested_actual_missing_and_fallback(eprun, lab_pair):
    fp32, _ = lab_pair
    answer = eprun("providers", fp32, " CPUExecutionProvider ", "CUDAExecutionProvider,CPUExecutionProvider",
                   "FooExecutionProvider", "AzureExecutionProvider", ",,")
    available = ort.get_available_providers()
    assert answer["model"] == str(fp32)
    assert answer["available"] == available
    assert [case["requested"] for case in answer["cases"]] == [
        ["CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"],
        ["FooExecutionProvider"], ["AzureExecutionProvider"], []]
    for case in answer["cases"]:
        assert set(case) == {"requested", "actual", "missing", "fell_back", "error"}
        session = ort.InferenceSession(str(fp32), providers=case["requested"])
        assert case["actual"] == session.get_providers()
        assert case["missing"] == [p for p in case["requested"] if p not in available]
        assert case["fell_back"] is (case["actual"] != case["requested"])
        assert case["error"] is None
    assert answer["cases"][0]["fell_back"] is False
    assert answer["cases"][2]["fell_back"] is True  # made-up name: CPU, no exception


def test_providers_on_an_unloadable_file_reports_errors_per_case(eprun, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model")
    answer = eprun("providers", junk, "CPUExecutionProvider", "FooExecutionProvider")
    for case in answer["cases"]:
        assert case["actual"] == [] and case["fell_back"] is True
        assert isinstance(case["error"], str) and case["error"]


# -- partition ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ops, supported, partitions", [
    (["MatMul", "Add", "Relu", "MatMul", "Add"], "MatMul",
     [("ep", ["MatMul"]), ("cpu", ["Add", "Relu"]), ("ep", ["MatMul"]), ("cpu", ["Add"])]),
    (["MatMul", "Add", "Relu", "MatMul", "Add"], "MatMul, Add ,Relu",
     [("ep", ["MatMul", "Add", "Relu", "MatMul", "Add"])]),
    (["MatMul", "Add", "Relu"], "", [("cpu", ["MatMul", "Add", "Relu"])]),
    (["MatMul", "Add", "Relu"], ",,", [("cpu", ["MatMul", "Add", "Relu"])]),
    (["Gemm", "Softmax", "Gemm"], "Gemm,NoSuchOp", [("ep", ["Gemm"]), ("cpu", ["Softmax"]),
                                                    ("ep", ["Gemm"])]),
    (["Relu", "Relu", "MatMul"], "matmul", [("cpu", ["Relu", "Relu", "MatMul"])]),
    ([], "MatMul", []),
])
def test_partition_hand_made_graphs(eprun, tmp_path, ops, supported, partitions):
    path = models.save(models.ops_graph(ops), tmp_path / "g.onnx")
    answer = eprun("partition", path, supported)
    expected_parts = [{"owner": owner, "nodes": nodes, "size": len(nodes)}
                      for owner, nodes in partitions]
    assert answer == {
        "model": str(path),
        "supported": [item.strip() for item in supported.split(",") if item.strip()],
        "nodes": len(ops),
        "claimed": sum(len(nodes) for owner, nodes in partitions if owner == "ep"),
        "partition_count": len(partitions),
        "handoffs": max(len(partitions) - 1, 0),
        "partitions": expected_parts,
    }


# -- expose ------------------------------------------------------------------------------------

def test_expose_fp32_with_gemm_opens_runs_and_is_idempotent(eprun, tmp_path):
    fp32 = models.save(models.chain(gemm_layers=(1, 3)), tmp_path / "m.onnx")
    before = sha(fp32)
    out = tmp_path / "m_exposed.onnx"
    answer = eprun("expose", fp32, out)
    expected = oracle_boundaries(onnx.load(str(fp32)))
    assert expected == ["x", "relu0", "relu1", "relu2", "relu3", "y"]
    assert answer == {"model": str(fp32), "out": str(out), "boundaries": expected,
                      "outputs": ["y", *expected[:-1]]}
    assert sha(fp32) == before
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == answer["outputs"]
    x = models.contract_input(0, 8)
    results = session.run(None, {"x": x})
    np.testing.assert_array_equal(results[1], x)

    again = eprun("expose", out, tmp_path / "twice.onnx")
    assert again["boundaries"] == answer["boundaries"]
    assert again["outputs"] == answer["outputs"]
    assert onnx.load(str(tmp_path / "twice.onnx")) == onnx.load(str(out))


def test_expose_int8_declares_real_types_and_runs(eprun, lab_pair, tmp_path):
    _, int8 = lab_pair
    before = sha(int8)
    out = tmp_path / "int8_exposed.onnx"
    answer = eprun("expose", int8, out)
    model = onnx.load(str(int8))
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert answer["boundaries"] == oracle_boundaries(model)
    assert all(producers[name] == "DequantizeLinear" for name in answer["boundaries"][:-1])
    exposed = onnx.load(str(out))
    for value in exposed.graph.output:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    session.run(None, {"x": models.contract_input(1, 8)})
    assert sha(int8) == before


def test_expose_keeps_an_int8_boundary_int8(eprun, tmp_path):
    """A MatMulInteger-free graph whose MatMul reads a Cast-to-int32 tensor: declared int32."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT32),
             helper.make_node("MatMul", ["xi", "W"], ["yi"]),
             helper.make_node("Cast", ["yi"], ["y"], to=TensorProto.FLOAT)]
    w = numpy_helper.from_array(np.ones((8, 3), np.int32), "W")
    model = models.finish(nodes, [models.float_input()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    path = models.save(model, tmp_path / "int.onnx")
    eprun("expose", path, tmp_path / "out.onnx")
    outputs = {o.name: o.type.tensor_type.elem_type
               for o in onnx.load(str(tmp_path / "out.onnx")).graph.output}
    assert outputs == {"y": TensorProto.FLOAT, "xi": TensorProto.INT32}
    ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])


# -- layers and growth -------------------------------------------------------------------------

def oracle_layers(fp32, int8, seed: int) -> list[dict]:
    fp32_model, int8_model = onnx.load(str(fp32)), onnx.load(str(int8))
    features = fp32_model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(seed, features)
    names_a, names_b = oracle_boundaries(fp32_model), oracle_boundaries(int8_model)
    tensors_a = models.run(fp32, x, names_a, typed=True)
    tensors_b = models.run(int8, x, names_b, typed=True)
    entries = []
    for k, (a, b) in enumerate(zip(tensors_a, tensors_b)):
        a, b = a.astype(np.float64), b.astype(np.float64)
        max_abs = float(np.abs(a - b).max())
        scale = float(np.abs(a).max())
        cosines = []
        for row_a, row_b in zip(a.reshape(64, -1), b.reshape(64, -1)):
            denominator = np.sqrt((row_a ** 2).sum()) * np.sqrt((row_b ** 2).sum())
            cosines.append(1.0 if denominator == 0 else float(row_a @ row_b / denominator))
        entries.append({"index": k, "fp32": names_a[k], "int8": names_b[k],
                        "max_abs_error": max_abs, "scale": scale,
                        "rel_error": max_abs / scale if scale else 0.0,
                        "cos_min": min(cosines)})
    return entries


def gemm_per_channel_pair(folder):
    """A chain with Gemm layers, quantized per channel."""
    fp32 = models.save(models.chain(widths=(16, 12, 12, 10, 4), gemm_layers=(0, 2), seed=9),
                       folder / "f.onnx")
    return fp32, models.quantize(fp32, folder / "q.onnx", seed=10, per_channel=True)


@pytest.mark.parametrize("pair, seed", [("lab", 0), ("lab", 12345), ("lab", 10 ** 30),
                                        ("gemm_per_channel", 5)])
def test_layers_matches_numpy_recomputation(eprun, lab_pair, tmp_path, pair, seed):
    fp32, int8 = lab_pair if pair == "lab" else gemm_per_channel_pair(tmp_path)
    answer = eprun("layers", fp32, int8, str(seed))
    assert answer["seed"] == seed and answer["rows"] == 64
    expected = oracle_layers(fp32, int8, seed)
    assert answer["layer_count"] == len(expected) == 6  # five layers and the output
    for got, want in zip(answer["layers"], expected):
        assert set(got) == set(want)
        for key in ("index", "fp32", "int8"):
            assert got[key] == want[key]
        for key in ("max_abs_error", "scale", "rel_error", "cos_min"):
            assert close(got[key], want[key]), (key, got, want)
    assert any(entry["max_abs_error"] > 0 for entry in answer["layers"])


def test_growth_is_derived_from_layers(eprun, lab_pair):
    fp32, int8 = lab_pair
    rel = [entry["rel_error"] for entry in eprun("layers", fp32, int8, "3")["layers"]]
    answer = eprun("growth", fp32, int8, "3")
    ratios = [rel[k] / rel[k - 1] if rel[k - 1] else None for k in range(1, len(rel))]
    best = max((r, -k) for k, r in enumerate(ratios, start=1) if r is not None)
    assert answer == {
        "seed": 3, "layer_count": len(rel), "rel_error": rel, "ratios": ratios,
        "monotone": all(rel[k] >= rel[k - 1] for k in range(1, len(rel))),
        "total_growth": rel[-1] / rel[0] if rel[0] else None,
        "max_ratio": {"index": -best[1], "ratio": best[0]},
    }


# -- settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("which", [0, 1])
def test_settings_matches_direct_sessions(eprun, lab_pair, which):
    path = lab_pair[which]
    answer = eprun("settings", path, "11")
    base = models.run(path, models.contract_input(11, 8), level="ORT_DISABLE_ALL", threads=1)[0]
    assert answer["model"] == str(path) and answer["seed"] == 11
    assert answer["baseline"] == {"level": "ORT_DISABLE_ALL", "intra_op": 1,
                                  "max_abs_output": pytest.approx(float(np.abs(base).max())),
                                  "mean_output": pytest.approx(float(base.mean()))}
    # bit for bit against sessions opened here: on the int8 model the int8 kernel decides the
    # ORT_ENABLE_ALL cases, and these sessions get the same kernel as eprun's
    assert_settings_are_this_cpus(answer, path)


def test_non_finite_values_are_strict_json_null(eprun, tmp_path):
    """Weights of 1e30 overflow float32 to inf and then nan: strict JSON writes null."""
    fp32 = models.save(models.chain(widths=(8, 8, 8, 8, 4), scale=1e30), tmp_path / "big.onnx")
    answer = eprun("settings", fp32, "0")
    assert answer["baseline"]["max_abs_output"] is None
    assert answer["baseline"]["mean_output"] is None
    grown = eprun("growth", fp32, fp32, "0")
    assert None in grown["rel_error"]


# -- layers --boundaries: the tensors a user names -------------------------------------------

def test_named_boundaries_measure_exactly_those_tensors(capfd, lab_pair):
    """In graph order whatever order they are given in, each paired with the int8 tensor the
    next layer reads (the dequantized one); numbers recomputed from sessions opened here."""
    import json

    fp32, int8 = lab_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "5", "--boundaries",
                                "relu2, y,x,mm1,relu2")
    assert code == 0, err
    answer = json.loads(out)
    want = [("x", "x_DequantizeLinear_Output"), ("mm1", "mm1_DequantizeLinear_Output"),
            ("relu2", "relu2_DequantizeLinear_Output"), ("y", "y")]
    assert [(entry["fp32"], entry["int8"]) for entry in answer["layers"]] == want
    assert answer["layer_count"] == 4
    x = models.contract_input(5, 8)
    expected = models.run(fp32, x, [a for a, _ in want], typed=True)
    got = models.run(int8, x, [b for _, b in want], typed=True)
    for entry, a, b in zip(answer["layers"], expected, got):
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert close(entry["max_abs_error"], float(np.abs(a - b).max()))
        assert close(entry["rel_error"], float(np.abs(a - b).max() / np.abs(a).max()))
    growth = json.loads(in_process(capfd, "growth", fp32, int8, "5", "--boundaries",
                                   "x,mm1,relu2,y")[1])
    assert growth["rel_error"] == [entry["rel_error"] for entry in answer["layers"]]


@pytest.mark.parametrize("names, message", [
    ("relu9", (r"--boundaries 'relu9': '[^']*fp32.onnx' has no tensor of that name; "
               r"nearest: relu\d")),
    ("W0", r"--boundaries 'W0': in '[^']*fp32.onnx' that is a weight"),
    ("y,x,nothing", r"--boundaries 'nothing': "),
])
def test_a_named_boundary_that_is_not_a_tensor_is_wrong_usage(capfd, lab_pair, names, message):
    code, out, err = in_process(capfd, "layers", *lab_pair, "1", "--boundaries", names)
    assert (code, out) == (2, "")
    assert re.fullmatch(r"eprun: error: " + message + r".*\n", err), err


def test_a_named_boundary_the_int8_model_lacks_is_wrong_usage(capfd, tmp_path):
    """The quantizer folds Relu into the Add before it: the int8 model has no such tensor."""
    fp32 = models.save(models.chain(widths=(6, 4), seed=2), tmp_path / "f.onnx")
    int8 = models.quantize(fp32, tmp_path / "q.onnx", seed=2)
    present = {name for node in onnx.load(str(int8)).graph.node for name in node.output}
    assert "add0" not in present and "relu0" in present
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--boundaries", "add0")
    assert (code, out) == (2, "")
    assert "'add0': " in err and "q.onnx' has no tensor named after it" in err
    code, _, err = in_process(capfd, "layers", fp32, int8, "1", "--boundaries", "relu0",
                              "--boundary-ops", "Conv")
    assert code == 2 and "give one or the other" in err


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


# -- inspect: what a model is, from its graph -------------------------------------------------

def test_inspect_summarises_a_model_as_onnx_reads_it(capfd, tmp_path):
    """Symbolic dims by name, op types counted, initializer bytes and external data as
    onnx's own loader and numpy give them, and the Q/DQ structure counted by hand."""
    import json
    from collections import Counter

    from onnx import numpy_helper

    fp32 = models.chain(features=8, widths=(40, 6), seed=1, batch="batch")
    fp32.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    int8 = models.quantize(models.save(fp32, tmp_path / "inline.onnx"), tmp_path / "q.onnx",
                           seed=1)
    onnx.save(fp32, str(tmp_path / "f.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="f.data", size_threshold=64)
    for path in (tmp_path / "f.onnx", int8):
        code, out, err = in_process(capfd, "inspect", path)
        assert code == 0, err
        answer = json.loads(out)
        model = onnx.load(str(path))
        assert answer["opsets"] == {o.domain: o.version for o in model.opset_import}
        assert answer["inputs"] == [{"name": "x", "type": "float32", "shape": ["batch", 8]}]
        assert answer["outputs"][0]["name"] == "y" and answer["outputs"][0]["shape"][1] == 6
        assert answer["nodes"] == len(model.graph.node)
        assert answer["op_types"] == dict(Counter(n.op_type for n in model.graph.node))
        arrays = [numpy_helper.to_array(t) for t in model.graph.initializer]
        assert answer["initializers"] == {"count": len(arrays),
                                          "bytes": sum(a.nbytes for a in arrays)}
    fp32_answer = json.loads(in_process(capfd, "inspect", tmp_path / "f.onnx")[1])
    stored = onnx.load(str(tmp_path / "f.onnx"), load_external_data=False).graph.initializer
    external = sum(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)
    assert external == 3
    assert fp32_answer["external_data"] == [{"file": "f.data", "tensors": external,
                                             "bytes": (tmp_path / "f.data").stat().st_size}]
    assert fp32_answer["qdq"] is None
    nodes = onnx.load(str(int8)).graph.node
    dq = [n for n in nodes if n.op_type == "DequantizeLinear"]
    weights = {t.name for t in onnx.load(str(int8)).graph.initializer}
    assert answer["qdq"] == {
        "activation_pairs": sum(n.input[0] not in weights for n in dq),
        "weight_dequantizers": sum(n.input[0] in weights for n in dq),
        "wrapped_ops": {"MatMul": 2, "Add": 2}}
    code, out, _ = in_process(capfd, "inspect", int8, "--format", "table")
    assert code == 0 and "x     float32  [batch, 8]" in out


def test_an_empty_or_weight_boundary_list_is_wrong_usage(capfd, tmp_path, lab_pair):
    """An empty list never falls back to the default boundaries; a weight that an older IR
    lists among the graph inputs is still a weight."""
    code, out, err = in_process(capfd, "layers", *lab_pair, "1", "--boundaries", ",")
    assert (code, out) == (2, "") and "--boundaries names no tensor" in err
    model = onnx.load(str(lab_pair[0]))
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                             for t in model.graph.initializer)
    fp32 = models.save(model, tmp_path / "ir_inputs.onnx")
    code, out, err = in_process(capfd, "layers", fp32, fp32, "1", "--boundaries", "W0")
    assert (code, out) == (2, "") and "that is a weight" in err


# -- layers: what exposing the boundaries does to each side ---------------------------------

def exposure_oracle(model, x) -> float:
    """How far the final output of ``model`` moves when its boundaries are graph outputs:
    the plain session against the exposed one, both opened here."""
    proto = onnx.load(str(model))
    (plain,) = models.run(model, x)
    exposed = models.run(model, x, oracle_boundaries(proto), typed=True)[-1]
    return float(np.abs(plain.astype(np.float64) - exposed.astype(np.float64)).max())


def test_layers_says_what_exposing_moved_on_each_side(capfd, lab_pair):
    """On the CPU too, and whatever this CPU's int8 kernel makes of it: the contract's answer
    stays as it is and says it on stderr only where it moved; any other answer carries it."""
    import json

    fp32, int8 = lab_pair
    x = models.contract_input(4, 8)
    moved = {"int8 (candidate)": exposure_oracle(int8, x),
             "fp32 (reference)": exposure_oracle(fp32, x)}
    code, out, err = in_process(capfd, "layers", fp32, int8, "4")
    assert code == 0 and "exposure" not in json.loads(out)
    for which, diff in moved.items():
        assert (f"exposing the boundaries moved the {which} model's 'y'" in err) is (diff != 0)
    code, out, _ = in_process(capfd, "layers", fp32, int8, "4", "--output", "y")
    answer = json.loads(out)
    assert answer["exposure"] == {"output": "y", "max_abs_diff": moved["int8 (candidate)"]}
    assert answer["reference_exposure"] == {"output": "y",
                                            "max_abs_diff": moved["fp32 (reference)"]}


def test_an_exposure_that_moved_the_output_is_said_with_its_side(capfd, lab_pair):
    """Where this CPU's kernels leave the lab pair's output alone, an exposed value that
    differs by a known amount stands in for one that moved: said on stderr, side named."""
    import eprun as tool

    _, int8 = lab_pair
    x = models.contract_input(4, 8)
    (plain,) = models.run(int8, x)
    side = tool.PairedModel(str(int8), tool.BOUNDARY_OPS)
    moved = tool.exposure_of(side, "y", plain + np.float32(0.5), {"x": x},
                             "the int8 (candidate)")
    assert moved == {"output": "y", "max_abs_diff": pytest.approx(0.5, rel=1e-6)}
    err = capfd.readouterr().err
    said = ("exposing the boundaries moved the int8 (candidate) model's 'y' on "
            "CPUExecutionProvider by 0.5 (max abs)")
    assert said in err
    assert tool.exposure_of(side, "y", plain, {"x": x}) == {"output": "y", "max_abs_diff": 0.0}
    assert capfd.readouterr().err == ""


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


def test_the_exposure_record_follows_the_final_output_not_the_last_boundary(capfd, tmp_path):
    """The first output also feeds a MatMul, so the last boundary is no output: the record
    still measures the final output. An output holding NaN in the same places in both runs
    did not move."""
    import json

    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), name)
               for name in ("W1", "W2", "W3")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["t"]),
             helper.make_node("Relu", ["t"], ["u"]),
             helper.make_node("MatMul", ["u", "W3"], ["r"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 8])
               for name in ("h", "r")]
    path = models.save(models.finish(nodes, [models.float_input("x", 8)], outputs, weights),
                       tmp_path / "two.onnx")
    code, out, err = in_process(capfd, "layers", path, path, "1", "--metrics", "sqnr")
    assert code == 0, err
    answer = json.loads(out)
    assert [entry["fp32"] for entry in answer["layers"]] == ["x", "h", "u"]
    assert answer["exposure"] == answer["reference_exposure"] == {"output": "h",
                                                                  "max_abs_diff": 0.0}
    nodes = [helper.make_node("Log", ["x"], ["l"]), helper.make_node("MatMul", ["l", "W1"],
                                                                     ["y"])]
    path = models.save(models.finish(
        nodes, [models.float_input("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], weights[:1]),
        tmp_path / "nan.onnx")
    code, out, err = in_process(capfd, "layers", path, path, "1", "--metrics", "sqnr")
    assert code == 0 and json.loads(out)["exposure"] == {"output": "y", "max_abs_diff": 0.0}
    assert "exposing the boundaries moved" not in err


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


def test_the_names_offered_for_a_missing_twin_are_fp32_names(lab_pair):
    """The nearest names a missing twin's error offers are names --boundaries takes (fp32
    tensors the int8 model has a twin of), never the int8 model's own quantizer names."""
    import eprun as tool

    graph = onnx.load(str(lab_pair[1])).graph
    for name, offered in (("relu0_x", "relu0"), ("relu0_QuantizeLinear_Outpu", None)):
        with pytest.raises(tool.EprunError) as refused:
            tool.twin_boundaries(graph, "q.onnx", [name])
        said = str(refused.value)
        assert "QuantizeLinear" not in said.replace(name, "")
        assert (offered is None) is ("nearest" not in said)
        assert offered is None or offered in said.split("nearest: ")[1].split(", ")


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
