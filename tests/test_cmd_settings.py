"""Layers 9 and 10, ``settings`` and ``settings --explain``: which optimizer changes the numbers, where,
and whether a run repeats.

The cases are real on every supported stack: onnxruntime's MatMulAddFusion turns MatMul + Add
into one Gemm that adds the bias inside the product's accumulation, so a wide layer with a
large bias rounds differently. Every claim is checked against sessions opened here."""
from __future__ import annotations

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cpu import assert_settings_are_this_cpus
from onnx import TensorProto, helper, numpy_helper

import eprun as tool


def wide_layers(seed: int = 0, width: int = 1000) -> onnx.ModelProto:
    """x -> Relu -> MatMul + Add (wide, large bias) -> Relu -> MatMul + Add -> y: boundaries
    x, the second Relu's output and y; the first fused layer is the one that rounds."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((width, 64)).astype(np.float32), "W0"),
             numpy_helper.from_array((100 * rng.standard_normal(64)).astype(np.float32), "b0"),
             numpy_helper.from_array((rng.standard_normal((64, 8)) / 8).astype(np.float32),
                                     "W1"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b1")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_in"),
             helper.make_node("MatMul", ["r", "W0"], ["m0"], name="mm0"),
             helper.make_node("Add", ["m0", "b0"], ["a0"], name="add0"),
             helper.make_node("Relu", ["a0"], ["h"], name="relu0"),
             helper.make_node("MatMul", ["h", "W1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["y"], name="add1")]
    return models.finish(nodes, [models.float_input("x", width)],
                         [helper.make_tensor_value_info("y", 1, ["N", 8])], inits)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return models.save(wide_layers(), tmp_path_factory.mktemp("explain") / "wide.onnx")


def test_explain_names_the_transformer_and_where_it_starts(eprun, wide):
    answer = eprun("settings", wide, "3", "--explain")
    x = models.contract_input(3, 1000)
    base = models.run(wide, x, level="ORT_DISABLE_ALL", threads=1)[0]
    optimized = models.run(wide, x, level="ORT_ENABLE_ALL", threads=1)[0]
    assert optimized.tobytes() != base.tobytes()  # the case is real on this stack
    assert answer["all_equal"] is False and answer["repeatable"] is True
    explained = {(e["level"], e["intra_op"]): e for e in answer["explanations"]}
    assert set(explained) == {(case["level"], case["intra_op"]) for case in answer["cases"]
                              if not case["bitwise_equal"]}
    first = explained["ORT_ENABLE_ALL", 1]
    assert first["cause"] == "optimizer"
    # the level: BASIC already differs (MatMulAddFusion is a Level 1 transformer)
    assert first["introduced_by"] == "ORT_ENABLE_BASIC"
    basic = models.run(wide, x, level="ORT_ENABLE_BASIC", threads=1)[0]
    assert basic.tobytes() != base.tobytes()
    # the named transformers, disabled (and nothing else), restore the baseline bit for bit
    names = first["transformers"]
    assert names == ["MatMulAddFusion"] and first["verified"] == names
    restored = models.run(wide, x, level="ORT_ENABLE_ALL", threads=1, disabled=names)[0]
    assert restored.tobytes() == base.tobytes()
    assert first["workaround"]["disabled_optimizers"] == names
    assert first["workaround"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    # the first boundary that differs, recomputed with every boundary exposed
    boundaries = ["x", "h", "y"]
    reference = models.run(wide, x, boundaries, level="ORT_DISABLE_ALL", threads=1)
    candidate = models.run(wide, x, boundaries, level="ORT_ENABLE_ALL", threads=1)
    differs = [k for k, (a, b) in enumerate(zip(reference, candidate))
               if a.tobytes() != b.tobytes()]
    where = first["first_difference"]
    assert where["index"] == differs[0] == 1 and where["tensor"] == "h"
    assert where["max_abs_diff"] == pytest.approx(
        float(np.abs(reference[1].astype(np.float64) - candidate[1]).max()), rel=1e-12)
    # the node the optimized session computes h with, from its own optimized model
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(wide.parent / "optimized.onnx")
    ort.InferenceSession(str(wide), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    producer = next(node for node in optimized.graph.node if "h" in node.output)
    assert where["optimized_nodes"] == [{"name": producer.name, "op_type": producer.op_type}]
    assert producer.op_type in ("Gemm", "FusedGemm")


def test_a_model_that_does_not_differ_is_not_searched(eprun, lab_pair, monkeypatch, capfd):
    _, int8 = lab_pair
    answer = eprun("settings", int8, "3", "--explain")
    if answer["all_equal"]:
        assert answer["explanations"] == []

        def searched(*args, **kwargs):
            raise AssertionError("a search for a case that does not differ")

        monkeypatch.setattr(tool, "explain_case", searched)
        assert tool.main(["settings", str(int8), "3", "--explain"]) == 0
    else:  # a CPU whose int8 kernel rounds otherwise (tests/cpu.py): every difference explained
        assert len(answer["explanations"]) == sum(not c["bitwise_equal"]
                                                  for c in answer["cases"])


def test_repeatable_appears_only_when_false_or_asked(eprun, wide, monkeypatch, capfd):
    plain = eprun("settings", wide, "3")
    assert "repeatable" not in plain and "explanations" not in plain
    calls = []
    real = tool.SettingsRunner.run

    def flaky(self, session):
        value = real(self, session)
        calls.append(1)
        return value + np.float32(len(calls) == 2)  # the baseline's second run differs

    monkeypatch.setattr(tool.SettingsRunner, "run", flaky)
    assert tool.main(["settings", str(wide), "3"]) == 0
    import json

    answer = json.loads(capfd.readouterr().out)
    assert answer["repeatable"] is False


class FakeRunner:
    """A runner whose outputs are given: the same as the baseline unless listed."""

    def __init__(self, base, differing):
        self.base, self.differing = base, differing

    def output(self, level, intra_op, disabled=()):
        if (level, intra_op) in self.differing and not disabled:
            return self.base + 1
        return self.base


@pytest.mark.parametrize("case, differing", [
    ({"level": "ORT_DISABLE_ALL", "intra_op": 2}, {("ORT_DISABLE_ALL", 2)}),
    ({"level": "ORT_ENABLE_ALL", "intra_op": 2}, {("ORT_ENABLE_ALL", 2)}),
])
def test_thread_count_differences_are_not_blamed_on_an_optimizer(case, differing):
    base = np.zeros(4, np.float32)
    explanation = tool.explain_case(FakeRunner(base, differing), base, case)
    assert explanation["cause"] == "threads"
    assert explanation["why"].startswith("no graph optimizer: with 2 intra-op threads")
    assert "transformers" not in explanation


@pytest.mark.parametrize("culprits", [["c"], ["a", "h"], ["b", "c", "g"], [], ["a", "b", "c", "d",
                                                                           "e", "f", "g", "h"]])
def test_delta_debugging_finds_a_minimal_set(culprits):
    items = list("abcdefgh")
    calls = []

    def restores(subset):
        calls.append(subset)
        return set(culprits) <= set(subset)

    found = tool.ddmin(items, restores)
    assert set(culprits) <= set(found)
    for name in found:  # minimal: every name is needed
        assert not restores([item for item in found if item != name]) or not culprits
    if culprits:
        assert sorted(found) == sorted(culprits)


def test_the_transformer_list_follows_the_installed_release(monkeypatch):
    monkeypatch.setattr(tool, "ort_release", lambda: (1, 18))
    names = tool.known_names(tool.TRANSFORMERS, 2)
    assert "GatherSliceToSplitFusion" in names and "GatherToSplitFusion" not in names
    assert "GeluFusion" in names and "GeluFusionL1" not in names
    assert "NchwcTransformer" not in names  # level 3
    monkeypatch.setattr(tool, "ort_release", lambda: (1, 32))
    names = tool.known_names(tool.TRANSFORMERS, 4)
    assert {"SwiGluFusion", "GeluFusionL2", "FuseFp16InitializerToFp32NodeTransformer"} <= set(
        names)
    assert "ShapeInputMerge" not in names


def test_explain_is_a_usage_of_settings_only(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    assert run_eprun_here("layers", fp32, int8, "1", "--explain").code == 2


def test_all_equal_reads_every_case(lab_pair, monkeypatch):
    """Only the last case differs (an injected run): all_equal must still be false. The first
    two cases are made equal to the baseline rather than assumed so: on a CPU whose int8
    kernel rounds otherwise (AVX2 without VNNI), ORT_ENABLE_ALL really differs."""
    _, int8 = lab_pair
    real = tool.SettingsRunner.run
    runs = []

    def last_case_differs(self, session):
        value = real(self, session)
        runs.append(value)  # the baseline twice, then the three cases
        if len(runs) <= 2:
            return value
        return runs[0] + np.float32(1) if len(runs) == 5 else runs[0].copy()

    monkeypatch.setattr(tool.SettingsRunner, "run", last_case_differs)
    answer = tool.settings(str(int8), 3)
    assert [case["bitwise_equal"] for case in answer["cases"]] == [True, True, False]
    assert answer["all_equal"] is False
    assert answer["cases"][2]["max_abs_diff"] == pytest.approx(1.0, rel=1e-6)


class LayeredOptimizers:
    """A stand-in for settings' runner whose numbers two transformers change: MatMulAddFusion
    from ORT_ENABLE_BASIC on, QDQSelectorActionTransformer from ORT_ENABLE_EXTENDED on (as
    CastElimination and the QDQ selector do on attention models), with no thread effect."""
    def __init__(self) -> None:
        self.runs = []
        self.ranks = {"ORT_DISABLE_ALL": 0, "ORT_ENABLE_BASIC": 1, "ORT_ENABLE_EXTENDED": 2,
                      "ORT_ENABLE_LAYOUT": 3, "ORT_ENABLE_ALL": 4}

    def output(self, level, threads, disabled=()):
        self.runs.append((level, threads, tuple(disabled)))
        rank = self.ranks[level]
        value = 0.0
        if rank >= 1 and "MatMulAddFusion" not in disabled:
            value += 1.0
        if rank >= 2 and "QDQSelectorActionTransformer" not in disabled:
            value += 2.0
        return np.array([value], np.float32)


def test_explain_finds_every_transformer_at_the_cases_own_level(monkeypatch):
    """Disabling the transformer found at the introducing level (BASIC) leaves ENABLE_ALL
    different: the explanation goes on at ENABLE_ALL, and only a set verified to restore the
    baseline there lets the rest be blamed on threads (here nothing is left)."""
    import eprun as tool

    monkeypatch.setattr(tool, "_changes_the_graph", lambda runner, level, name: True)
    monkeypatch.setattr(tool, "_first_difference", lambda *args: None)
    runner = LayeredOptimizers()
    base = runner.output("ORT_DISABLE_ALL", 1)
    for threads in (1, 2):
        explained = tool.explain_case(runner, base,
                                      {"level": "ORT_ENABLE_ALL", "intra_op": threads})
        assert explained["introduced_by"] == "ORT_ENABLE_BASIC"
        assert sorted(explained["transformers"]) == ["MatMulAddFusion",
                                                     "QDQSelectorActionTransformer"]
        assert explained["restores_baseline"] is True
        assert "threads_too" not in explained
        assert ("ORT_ENABLE_ALL", 1, tuple(explained["transformers"])) in runner.runs


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

# -- settings that differ for real -------------------------------------------------------------


def layer_norm_model(features: int = 256, seed: int = 0) -> onnx.ModelProto:
    """LayerNormalization written out as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div,
    Mul, Add (opset 17 has no fused op in the default domain). ORT_ENABLE_ALL fuses the chain
    into one LayerNormalization kernel, which sums in another order than the separate
    kernels; ORT_DISABLE_ALL runs them one by one."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(features)).astype(np.float32),
                                     "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(features)).astype(np.float32),
                                     "beta"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    node = helper.make_node
    nodes = [node("ReduceMean", ["x"], ["mean"], axes=[-1]),
             node("Sub", ["x", "mean"], ["centered"]),
             node("Pow", ["centered", "two"], ["squared"]),
             node("ReduceMean", ["squared"], ["variance"], axes=[-1]),
             node("Add", ["variance", "eps"], ["padded"]),
             node("Sqrt", ["padded"], ["deviation"]),
             node("Div", ["centered", "deviation"], ["normal"]),
             node("Mul", ["normal", "gamma"], ["scaled"]),
             node("Add", ["scaled", "beta"], ["y"])]
    return models.finish(nodes, [models.float_input("x", features)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", features])],
                         inits)


def test_settings_reports_a_fusion_that_changes_the_output(eprun, tmp_path):
    features, seed = 256, 2026
    model = layer_norm_model(features)
    onnx.checker.check_model(model)
    path = models.save(model, tmp_path / "layer_norm.onnx")
    x = models.contract_input(seed, features)

    base = models.run(path, x, level="ORT_DISABLE_ALL", threads=1)[0]
    # the model is what it says: a layer norm, to float32 precision
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(axis=-1, keepdims=True)
    normal = centered / np.sqrt((centered ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    gamma, beta = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer[:2])
    np.testing.assert_allclose(base, normal * gamma + beta, rtol=1e-5, atol=1e-5)

    answer = eprun("settings", path, str(seed))
    assert answer["model"] == str(path)
    assert answer["seed"] == seed
    assert answer["baseline"] == {"level": "ORT_DISABLE_ALL", "intra_op": 1,
                                  "max_abs_output": float(np.abs(base).max()),
                                  "mean_output": pytest.approx(float(base.mean()), rel=1e-9)}
    assert_settings_are_this_cpus(answer, path)  # every case as sessions opened here give it
    for case in answer["cases"]:
        if case["level"] == "ORT_ENABLE_ALL":  # the fused kernel rounds differently, on every stack
            assert case["bitwise_equal"] is False
            assert 0 < case["max_abs_diff"] < 1e-4
    assert answer["all_equal"] is False
