"""Layer 10, ``layers`` and ``growth``: every number recomputed independently (numpy, sessions
opened here, graph surgery), named boundaries, --local, --metrics, --rows, --boundary-ops, what
exposing a boundary moves, and the properties every pair keeps."""
from __future__ import annotations

import hashlib
import json
import re

import models
import numpy as np
import onnx
import pytest
from conftest import in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import eprun as tool


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


def test_a_named_boundary_of_another_width_is_refused_by_its_shapes(capfd, tmp_path):
    """A twin whose tensor of the same name is another width: its rows cannot be compared,
    though the row count divides both sizes; said in one line with both shapes."""
    fp32, other = (models.save(models.chain(features=4, widths=(width, 2), seed=width),
                               tmp_path / f"w{width}.onnx") for width in (6, 3))
    code, out, err = in_process(capfd, "layers", fp32, other, "1", "--boundaries", "relu0")
    assert (code, out) == (4, ""), err
    (line,) = err.splitlines()
    assert line.startswith("eprun: error: boundary 0 ('relu0' vs. 'relu0'): shapes [64, 6] "
                           "and [64, 3] cannot be compared row by row over 64 rows"), line


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


@pytest.mark.parametrize("extra", [(), ("--output", "y", "--metrics", "sqnr")])
def test_the_exposure_record_is_paid_once(capfd, monkeypatch, lab_pair, extra):
    """Each model runs exposed once and plain once, and a model's session is opened only
    once the previous one of that model is gone: never two in memory at once."""
    import weakref

    fp32, int8 = lab_pair
    alive = {str(fp32): weakref.WeakSet(), str(int8): weakref.WeakSet()}
    opened, overlapping = [], []
    original = tool.PairedModel.session

    def tracked(self, names, exposed=True):
        overlapping.extend((self.path, exposed) for _ in alive[self.path])
        session = original(self, names, exposed)
        alive[self.path].add(session)
        opened.append((self.path, exposed))
        return session

    monkeypatch.setattr(tool.PairedModel, "session", tracked)
    code, _, err = in_process(capfd, "layers", fp32, int8, "4", *extra)
    assert code == 0, err
    assert sorted(opened) == sorted((str(path), exposed) for path in (fp32, int8)
                                    for exposed in (True, False))
    assert overlapping == []


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


@st.composite
def model_pairs(draw):
    """A random chain (MatMul or Gemm per layer) and a copy with coarsely rounded weights."""
    depth = draw(st.integers(1, 6))
    features = draw(st.integers(1, 9))
    widths = draw(st.lists(st.integers(1, 9), min_size=depth, max_size=depth))
    gemm = draw(st.sets(st.integers(0, depth - 1)))
    seed = draw(st.integers(0, 2 ** 32))
    fp32 = models.chain(features=features, widths=widths, seed=seed % 1000, gemm_layers=gemm)
    rough = onnx.ModelProto()
    rough.CopyFrom(fp32)
    step = draw(st.sampled_from([0.0, 1 / 16, 1 / 4]))
    for tensor in rough.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if step:
            array = (np.round(array / step) * step).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return fp32, rough, seed


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=model_pairs())
def test_layers_and_growth_invariants(tmp_path, pair):
    fp32, rough, seed = pair
    a = models.save(fp32, tmp_path / "a.onnx")
    b = models.save(rough, tmp_path / "b.onnx")
    measured = tool.layers(str(a), str(b), seed)
    grown = tool.growth_of(measured)
    exposed = tool.expose(str(a), str(tmp_path / "a_exposed.onnx"))
    assert measured["layer_count"] == len(exposed["boundaries"]) == len(measured["layers"])
    rel = grown["rel_error"]
    for entry in measured["layers"]:
        assert entry["rel_error"] >= 0 and entry["max_abs_error"] >= 0
        assert -1.0 <= entry["cos_min"] <= 1.0
        assert entry["rel_error"] == (entry["max_abs_error"] / entry["scale"]
                                      if entry["scale"] else 0.0)
    assert len(grown["ratios"]) == len(rel) - 1
    for k, ratio in enumerate(grown["ratios"], start=1):
        assert ratio == (rel[k] / rel[k - 1] if rel[k - 1] else None)
    if grown["max_ratio"] is not None:
        k = grown["max_ratio"]["index"]
        assert grown["ratios"][k - 1] == grown["max_ratio"]["ratio"]
        assert all(r is None or r <= grown["max_ratio"]["ratio"] for r in grown["ratios"])
        assert all(r is None or r < grown["max_ratio"]["ratio"] for r in grown["ratios"][:k - 1])


# -- layers --local, --metrics, --rows, --boundary-ops -----------------------------------------

def local_oracle(fp32, int8, seed: int, k: int) -> np.ndarray:
    """Graph surgery instead of extraction: the int8 model with the float tensor in front of
    boundary k-1's QuantizeLinear replaced by a new input fed fp32's boundary k-1 tensor."""
    int8_model = onnx.load(str(int8))
    layers = oracle_layers(fp32, int8, seed)
    producers = {o: n for n in int8_model.graph.node for o in n.output}
    dq = producers[layers[k - 1]["int8"]]
    q = producers[dq.input[0]]
    q.input[0] = "fed"
    int8_model.graph.input.append(helper.make_tensor_value_info("fed", TensorProto.FLOAT, None))
    int8_model.graph.output.append(helper.make_tensor_value_info(layers[k]["int8"],
                                                                 TensorProto.FLOAT, None))
    fp32_model = onnx.load(str(fp32))
    features = fp32_model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(seed, features)
    a_prev = models.run(fp32, x, [layers[k - 1]["fp32"]], typed=True)[0]
    return models.run(int8_model, {"x": x, "fed": a_prev}, [layers[k]["int8"]])[0]


def test_local_errors_match_graph_surgery(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "4", "--local")
    assert answer["local_unavailable"] == []
    expected = oracle_layers(fp32, int8, 4)
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    fp32_tensors = models.run(fp32, models.contract_input(4, features),
                              [e["fp32"] for e in expected], typed=True)
    assert answer["layers"][0]["local"]["rel_error"] == answer["layers"][0]["rel_error"]
    for k in range(1, len(expected)):
        got = answer["layers"][k]["local"]
        b = local_oracle(fp32, int8, 4, k).astype(np.float64)
        a = fp32_tensors[k].astype(np.float64)
        max_abs = float(np.abs(a - b).max())
        assert got["max_abs_error"] == pytest.approx(max_abs, rel=1e-6, abs=1e-12)
        assert got["rel_error"] == pytest.approx(max_abs / float(np.abs(a).max()), rel=1e-6)


def test_a_float16_segment_fed_at_the_input_casts_it_as_the_twin_does(eprun, tmp_path):
    """A float16 twin's first boundary is the Cast of its input, paired with the fp32 input
    by position. The segment after it is the whole prefix, so its local error is the
    accumulated one: the segment casts the fp32 input itself (onnxruntime's CPU then drops the
    cast pair around its float32 Conv, as in the twin), not fed float16 values eprun cast."""
    import real_models
    from test_real_models import float16_twin

    fp32 = models.save(real_models.residual_cnn(2), tmp_path / "cnn.onnx")
    fp16 = models.save(float16_twin(onnx.load(str(fp32))), tmp_path / "cnn16.onnx")
    answer = eprun("layers", fp32, fp16, "1", "--local", "--boundary-ops", "Conv,Gemm")
    first, second = answer["layers"][:2]
    assert (first["fp32"], first["int8"]) == ("image", "image_fp16")
    feed = {"image": np.random.default_rng(1).standard_normal((64, 3, 32, 32)).astype(np.float32)}
    a = models.run(fp32, feed, [second["fp32"]])[0].astype(np.float64)
    b = models.run(fp16, feed, [second["int8"]])[0].astype(np.float64)
    error = float(np.abs(a - b).max())
    assert second["local"]["max_abs_error"] == pytest.approx(error, rel=1e-6, abs=1e-12)
    assert second["local"]["rel_error"] == pytest.approx(second["rel_error"], rel=1e-9)


def test_local_attribution_points_at_a_damaged_layer(eprun, tmp_path):
    fp32 = models.save(models.chain(features=8, widths=(16, 16, 16, 16, 16, 8), seed=21),
                       tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, seed=22)

    def damaged(factor: float):
        """Scale layer 3's weight scale: the tensor at boundary 4 (its output) goes wrong."""
        model = onnx.load(str(int8))
        for tensor in model.graph.initializer:
            if tensor.name == "W3_scale":
                tensor.CopyFrom(numpy_helper.from_array(
                    (numpy_helper.to_array(tensor) * np.float32(factor)), tensor.name))
        return models.save(model, tmp_path / f"damaged_{factor}.onnx")

    clean = eprun("growth", fp32, int8, "9", "--local")
    hurt = eprun("growth", fp32, damaged(1.5), "9", "--local")
    # Each segment is fed fp32 tensors, so only the damaged segment's own error changes (the
    # others run the same int8 kernels on the same inputs: equal bit for bit on any CPU) ...
    for k, (before, after) in enumerate(zip(clean["local_rel_error"], hurt["local_rel_error"])):
        assert (after > before) if k == 4 else (after == before), k
    # ... while the accumulated error carries the damage on to the output.
    assert hurt["rel_error"][6] != clean["rel_error"][6]
    assert eprun("growth", fp32, damaged(3.0), "9", "--local")["worst_local"]["index"] == 4


def test_local_refuses_a_segment_whose_skip_has_no_fp32_counterpart(eprun, tmp_path):
    """A residual whose skip tensor the int8 model renamed: it cannot be fed its fp32 value,
    and recomputing it would carry the int8 error of the layers before into the segment."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "W"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "W"], ["h2"]),
             helper.make_node("Add", ["h2", "r0"], ["s"]),
             helper.make_node("MatMul", ["s", "W"], ["y"])]
    model = models.finish(nodes, [models.float_input("x", 4)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    fp32 = models.save(model, tmp_path / "res.onnx")
    int8 = tmp_path / "res_q.onnx"
    models.quantize(fp32, int8, seed=1)
    renamed = onnx.load(str(int8))
    for tensor in renamed.graph.initializer:
        if tensor.name.startswith("r0"):
            tensor.name = "skip" + tensor.name[2:]
    for node in renamed.graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name.startswith("r0"):  # r0 and the Q/DQ tensors named after it
                    field[i] = "skip" + name[2:]
    int8 = models.save(renamed, tmp_path / "renamed.onnx")
    answer = eprun("layers", fp32, int8, "1", "--local")
    reasons = {entry["index"]: entry["reason"] for entry in answer["local_unavailable"]}
    assert list(reasons) == [3]
    assert reasons[3].startswith("cannot cut: 's_DequantizeLinear_Output' reads")
    assert "the fp32 model has no tensor of that name" in reasons[3]
    assert answer["layers"][3]["local"] is None
    assert all(answer["layers"][k]["local"] is not None for k in (0, 1, 2, 4))


def test_metrics_sqnr_and_mse(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "6", "--metrics", "sqnr,mse")
    plain = eprun("layers", fp32, int8, "6")
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(6, features)
    a_all = models.run(fp32, x, [e["fp32"] for e in plain["layers"]], typed=True)
    b_all = models.run(int8, x, [e["int8"] for e in plain["layers"]], typed=True)
    # with --metrics the answer says how far exposing the boundaries moved the int8 model's
    # final output on the CPU: the plain model's output against the exposed run's
    final = plain["layers"][-1]["int8"]
    (deployed,) = models.run(int8, x, [final])
    moved = float(np.abs(deployed.astype(np.float64) - b_all[-1].astype(np.float64)).max())
    assert answer["exposure"]["output"] == final
    assert answer["exposure"]["max_abs_diff"] == pytest.approx(moved, rel=1e-9, abs=0)
    assert "exposure" not in plain
    for entry, base, a, b in zip(answer["layers"], plain["layers"], a_all, b_all):
        assert {k: v for k, v in entry.items() if k not in ("sqnr_db", "mse")} == base
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert entry["mse"] == pytest.approx(float(((a - b) ** 2).mean()), rel=1e-9)
        noise = float(((a - b) ** 2).sum())
        expected = 20 * np.log10(np.linalg.norm(a) / np.sqrt(noise)) if noise else None
        assert entry["sqnr_db"] == (pytest.approx(expected, rel=1e-9) if expected else None)


def test_sqnr_is_qdq_loss_debugs_where_no_group_between_boundaries_fuses(eprun, tmp_path):
    """onnxruntime's qdq_loss_debug, run on the same input, exposes every tensor; eprun the
    Conv inputs alone. On a Conv/SiLU/Concat detector their SQNRs agree to float rounding,
    and eprun says how far its exposure moved the int8 model's final output."""
    import real_models
    from onnxruntime.quantization import CalibrationDataReader, qdq_loss_debug

    fp32 = models.save(real_models.detector_head(3), tmp_path / "det.onnx")
    int8 = models.quantize(fp32, tmp_path / "det8.onnx", seed=1)
    answer = eprun("layers", fp32, int8, "1", "--metrics", "sqnr", "--boundary-ops", "Conv")
    feed = {"image": np.random.default_rng(1).standard_normal((64, 3, 16, 16))
            .astype(np.float32)}

    class Once(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([feed])

        def get_next(self):
            return next(self.feeds, None)

    activations = []
    for path in (fp32, int8):
        augmented = str(tmp_path / f"{path.stem}_all.onnx")
        qdq_loss_debug.modify_model_output_intermediate_tensors(str(path), augmented)
        activations.append(qdq_loss_debug.collect_activations(augmented, Once()))
    errors = qdq_loss_debug.compute_activation_error(
        qdq_loss_debug.create_activation_matching(activations[1], activations[0]))
    compared = [(entry["sqnr_db"], errors[entry["fp32"]]["xmodel_err"])
                for entry in answer["layers"] if entry["fp32"] in errors]
    assert len(compared) == answer["layer_count"] >= 5
    for ours, theirs in compared:
        assert ours == pytest.approx(float(theirs), abs=1e-5)
    (deployed,) = models.run(int8, feed, ["preds"])
    exposed = models.run(int8, feed, [entry["int8"] for entry in answer["layers"]])[-1]
    assert answer["exposure"]["output"] == "preds"
    assert answer["exposure"]["max_abs_diff"] == pytest.approx(
        float(np.abs(deployed.astype(np.float64) - exposed).max()), rel=1e-9, abs=0)


def test_rows_option(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "2", "--rows", "8")
    assert answer["rows"] == 8
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(2).standard_normal((8, features)).astype(np.float32)
    # layers runs both models with every boundary exposed, which on some CPUs changes the
    # int8 model's y (the fused integer kernel it would run otherwise rounds differently):
    # the oracle exposes them too, and reads y, the last boundary
    y = models.run(fp32, x, oracle_boundaries(onnx.load(str(fp32))), typed=True)[-1]
    yq = models.run(int8, x, oracle_boundaries(onnx.load(str(int8))), typed=True)[-1]
    last = answer["layers"][-1]
    assert (last["fp32"], last["int8"]) == ("y", "y")
    assert last["max_abs_error"] == pytest.approx(float(np.abs(y - yq).max()), rel=1e-6)
    settings = eprun("settings", fp32, "2", "--rows", "8")
    assert settings["baseline"]["max_abs_output"] == pytest.approx(float(np.abs(y).max()))


def conv_model(seed: int = 0) -> onnx.ModelProto:
    """NCHW input [N, 3, 8, 8] -> Conv -> Relu -> Conv -> Relu -> Flatten -> MatMul -> y."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 5).astype(np.float32), "K0"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32), "K1"),
             numpy_helper.from_array((rng.standard_normal((256, 5)) / 16).astype(np.float32), "W")]
    nodes = [helper.make_node("Conv", ["x", "K0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "K1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Flatten", ["r1"], ["f"]),
             helper.make_node("MatMul", ["f", "W"], ["y"])]
    return models.finish(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)


def test_conv_model_with_boundary_ops(eprun, tmp_path):
    fp32 = models.save(conv_model(), tmp_path / "conv.onnx")
    int8 = models.quantize(fp32, tmp_path / "conv_q.onnx", seed=3, rows=8)
    plain = eprun("layers", fp32, int8, "3")
    assert [e["fp32"] for e in plain["layers"]] == ["f", "y"]
    answer = eprun("layers", fp32, int8, "3", "--boundary-ops", "Conv")
    assert [e["fp32"] for e in answer["layers"]] == ["x", "r0", "f", "y"]
    x = np.random.default_rng(3).standard_normal((64, 3, 8, 8)).astype(np.float32)
    a_all = models.run(fp32, x, [e["fp32"] for e in answer["layers"]], typed=True)
    b_all = models.run(int8, x, [e["int8"] for e in answer["layers"]], typed=True)
    for entry, a, b in zip(answer["layers"], a_all, b_all):
        a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
        assert entry["max_abs_error"] == pytest.approx(float(np.abs(a - b).max()), rel=1e-6)
        cos = [float(r @ s / (np.linalg.norm(r) * np.linalg.norm(s))) for r, s in zip(a, b)]
        assert entry["cos_min"] == pytest.approx(min(cos), rel=1e-6)
    exposed = eprun("expose", fp32, tmp_path / "e.onnx", "--boundary-ops", "Conv")
    assert exposed["boundaries"] == ["x", "r0", "f", "y"]


def test_saved_boundaries_are_named_by_their_tensors(capfd, lab_pair, tmp_path):
    """The first boundary is the graph's input: it was stored a second time as ``tensor_0``.
    Every array is now its tensor's name, the input stored once, and the file loads back."""
    fp32, int8 = lab_pair
    golden = tmp_path / "boundaries.npz"
    code, saved, err = in_process(capfd, "layers", fp32, int8, "1", "--save-boundaries", golden)
    assert code == 0, err
    names = oracle_boundaries(onnx.load(str(fp32)))
    rows = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    with np.load(golden, allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted({*names, "eprun"})
        np.testing.assert_array_equal(archive["x"], rows)
        assert archive[names[-1]].shape == (64, 6)
    code, loaded, err = in_process(capfd, "layers", fp32, int8, "1", "--load-boundaries", golden)
    assert code == 0, err
    assert json.loads(loaded)["layers"] == json.loads(saved)["layers"]


def mean_abs_error(reference, diff) -> float:
    """The metric a user adds through the API in the test below: mean |c - r|."""
    return float(np.mean(diff))


def test_a_metric_added_through_the_api_is_reported_everywhere(capfd, monkeypatch, lab_pair,
                                                               tmp_path):
    """One entry in METRICS, nothing else: --metrics offers it, the JSON has it (recomputed
    here from sessions), the table has its column and marks the worst by it (the lowest
    where higher is better), node data holds it. (Its plot: test_viz.py.)"""
    import json

    fp32, int8 = lab_pair
    monkeypatch.setitem(tool.METRICS, "mae", tool.Metric(field="mae", compute=mean_abs_error,
                                                         higher_is_better=False))
    code, out, err = in_process(capfd, "layers", fp32, int8, "6", "--metrics", "mae",
                                "--node-data", tmp_path / "nd")
    assert code == 0, err
    answer = json.loads(out)
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(6, features)
    a_all = models.run(fp32, x, [entry["fp32"] for entry in answer["layers"]], typed=True)
    b_all = models.run(int8, x, [entry["int8"] for entry in answer["layers"]], typed=True)
    expected = [float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())
                for a, b in zip(a_all, b_all)]
    assert [entry["mae"] for entry in answer["layers"]] == pytest.approx(expected, rel=1e-9)
    for role in ("fp32", "int8"):
        (graph,) = json.loads((tmp_path / "nd" / f"{role}.mae.json").read_text()).values()
        assert graph["name"] == "mae"
        assert sorted(result["value"] for result in graph["results"].values()) == \
            pytest.approx(sorted(expected), rel=1e-12)
    for better, pick in ((False, max), (True, min)):
        monkeypatch.setitem(tool.METRICS, "mae", tool.Metric(
            field="mae", compute=mean_abs_error, higher_is_better=better, label="mean abs"))
        code, out, err = in_process(capfd, "layers", fp32, int8, "6", "--metrics", "mae",
                                    "--format", "table")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[1].split()[-2:] == ["mean", "abs"]
        marked = [line for line in lines if line.endswith("<- worst")]
        worst = expected.index(pick(expected))
        assert len(marked) == 1 and marked[0].split()[0] == str(worst), out
    code, _, err = in_process(capfd, "layers", fp32, int8, "6", "--metrics", "nope")
    assert code == 2 and "choose from sqnr, mse, mae" in err
