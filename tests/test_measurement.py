"""Table-driven tests of eprun's pure functions, imported in-process.

Every expected value below is worked out by hand (powers of two where a ratio must be exact,
short arithmetic in the comments elsewhere), never taken from eprun's own output.
"""
from __future__ import annotations

import argparse
import math
import sys

import models
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import eprun as tool

NAN, INF = float("nan"), float("inf")
ANY = object()  # an expected value that is not asserted


def matches(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for key, want in expected.items():
        if want is not ANY:
            assert got[key] == want, (key, got[key], want)


# -- growth_from -------------------------------------------------------------------------------

def growth(rel, ratios, monotone, total, max_ratio) -> tuple:
    return rel, {"layer_count": len(rel), "rel_error": rel, "ratios": ratios,
                 "monotone": monotone, "total_growth": total, "max_ratio": max_ratio}


@pytest.mark.parametrize(("rel_errors", "expected"), [
    # a tie of two ratios 2.0: the earliest, which belongs to layer 1
    growth([0.25, 0.5, 1.0], [2.0, 2.0], True, 4.0, {"index": 1, "ratio": 2.0}),
    # ratios 4, 1.5, 8: the largest is the third ratio, which belongs to layer 3
    growth([0.125, 0.5, 0.75, 6.0], [4.0, 1.5, 8.0], True, 48.0, {"index": 3, "ratio": 8.0}),
    # ratios 1, 3, 3: a tie after a smaller one; layer 2 wins over layer 3
    growth([1.0, 1.0, 3.0, 9.0], [1.0, 3.0, 3.0], True, 9.0, {"index": 2, "ratio": 3.0}),
    # a rise, then a fall to above the first: not monotone (each step is against the one before)
    growth([0.25, 1.0, 0.5], [4.0, 0.5], False, 2.0, {"index": 1, "ratio": 4.0}),
    # a flat step is not a decrease
    growth([0.5, 0.5, 1.0], [1.0, 2.0], True, 2.0, {"index": 2, "ratio": 2.0}),
    # a flat step, then a decrease
    growth([0.5, 0.5, 0.25], [1.0, 0.5], False, 0.5, {"index": 1, "ratio": 1.0}),
    # a zero predecessor: that ratio is null, and so is the total growth
    growth([0.0, 0.5, 1.0], [None, 2.0], True, None, {"index": 2, "ratio": 2.0}),
    # a ratio of 0.0 is a ratio (the only one), the next one is over a zero
    growth([0.5, 0.0, 0.25], [0.0, None], False, 0.5, {"index": 1, "ratio": 0.0}),
    growth([0.5, 0.25, 0.0, 0.25], [0.5, 0.0, None], False, 0.5, {"index": 1, "ratio": 0.5}),
    # an infinite error: neither ratio touching it is a number
    growth([0.25, INF, 0.5], [None, None], ANY, 2.0, None),
    growth([0.25, NAN, 0.75], [None, None], ANY, 3.0, None),
    # empty and one-element lists
    growth([], [], True, None, None),
    growth([0.5], [], True, 1.0, None),
    growth([0.0], [], True, None, None),
    growth([0.0, 0.0], [None], True, None, None),
])
def test_growth_from(rel_errors, expected):
    matches(tool.growth_from(rel_errors), expected)


@pytest.mark.parametrize(("values", "start", "expected"), [
    ([], 0, None),
    ([None, None], 0, None),
    ([NAN, 3.0], 0, (1, 3.0)),
    ([3.0, INF, 3.0], 0, (0, 3.0)),
    ([None, -INF, NAN], 0, None),
    ([1.0, 2.0, 2.0], 5, (6, 2.0)),
    ([-INF, -2.0, -1.0], 0, (2, -1.0)),
    ([0.0, None], 1, (1, 0.0)),
])
def test_largest_is_the_earliest_finite_maximum(values, start, expected):
    assert tool._largest(values, start=start) == expected


def test_growth_of_a_hand_built_layers_answer_with_local_ties():
    def entry(index: int, rel: float, local: float | None) -> dict:
        return {"index": index, "fp32": f"a{index}", "int8": f"b{index}", "rel_error": rel,
                "local": None if local is None else {"rel_error": local}}

    unavailable = [{"index": 2, "reason": "reads a tensor the fp32 model lacks"}]
    measured = {"seed": 9, "rows": 64, "layer_count": 5,
                "inputs": [{"name": "x", "dtype": "float32", "shape": [64, 4], "source": "s"}],
                "layers": [entry(0, 0.25, 0.25), entry(1, 0.5, 0.375), entry(2, 0.5, None),
                           entry(3, 1.0, 0.375), entry(4, 0.5, 0.125)],
                "local_unavailable": unavailable}
    answer = tool.growth_of(measured)
    assert answer == {
        "seed": 9, "inputs": measured["inputs"], "layer_count": 5,
        "rel_error": [0.25, 0.5, 0.5, 1.0, 0.5], "ratios": [2.0, 1.0, 2.0, 0.5],
        "monotone": False, "total_growth": 2.0, "max_ratio": {"index": 1, "ratio": 2.0},
        "local_rel_error": [0.25, 0.375, None, 0.375, 0.125],
        "worst_local": {"index": 1, "rel_error": 0.375},  # the earlier of two 0.375
        "local_unavailable": unavailable}
    # the contract's key order (README, `growth --local`)
    assert [key for key in answer if key != "inputs"] == [
        "seed", "layer_count", "rel_error", "ratios", "monotone", "total_growth", "max_ratio",
        "local_rel_error", "worst_local", "local_unavailable"]

    del measured["local_unavailable"], measured["inputs"]
    plain = tool.growth_of(measured)
    assert "worst_local" not in plain
    assert "local_rel_error" not in plain
    assert "inputs" not in plain

    measured["layers"] = [entry(0, 0.5, None), entry(1, 0.5, None)]
    measured["local_unavailable"] = []
    assert tool.growth_of(measured)["worst_local"] is None


# -- find_boundaries ---------------------------------------------------------------------------

def graph(nodes: list, outputs: list[tuple[str, int]]):
    node_protos = [helper.make_node(op, list(inputs), list(outs)) for op, inputs, outs in nodes]
    return helper.make_graph(
        node_protos, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs])


FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.mark.parametrize(("nodes", "outputs", "ops", "expected"), [
    # one tensor feeding two MatMuls is one boundary
    ([("MatMul", ["x", "W1"], ["a"]), ("MatMul", ["x", "W2"], ["b"]),
      ("Add", ["a", "b"], ["s"]), ("MatMul", ["s", "W3"], ["y"])],
     [("y", FLOAT)], tool.BOUNDARY_OPS, ["x", "s", "y"]),
    # Gemm counts; Conv only when asked for
    ([("Conv", ["x", "K"], ["c"]), ("Flatten", ["c"], ["f"]), ("Gemm", ["f", "W", "B"], ["g"]),
      ("MatMul", ["g", "W2"], ["y"])],
     [("y", FLOAT)], tool.BOUNDARY_OPS, ["f", "g", "y"]),
    ([("Conv", ["x", "K"], ["c"]), ("Flatten", ["c"], ["f"]), ("Gemm", ["f", "W", "B"], ["g"]),
      ("MatMul", ["g", "W2"], ["y"])],
     [("y", FLOAT)], ("MatMul", "Gemm", "Conv"), ["x", "f", "g", "y"]),
    # the quantized forms of the boundary ops count too (their first input)
    ([("QuantizeLinear", ["x", "s", "z"], ["xq"]),
      ("QLinearMatMul", ["xq", "s", "z", "W", "ws", "wz", "ys", "yz"], ["yq"]),
      ("ConvInteger", ["yq", "K"], ["ci"]), ("DequantizeLinear", ["ci", "s", "z"], ["y"])],
     [("y", FLOAT)], tool.BOUNDARY_OPS, ["xq", "y"]),
    ([("QuantizeLinear", ["x", "s", "z"], ["xq"]),
      ("QLinearMatMul", ["xq", "s", "z", "W", "ws", "wz", "ys", "yz"], ["yq"]),
      ("ConvInteger", ["yq", "K"], ["ci"]), ("DequantizeLinear", ["ci", "s", "z"], ["y"])],
     [("y", FLOAT)], ("MatMul", "Gemm", "Conv"), ["xq", "yq", "y"]),
    # the final boundary is the first float output: an int64 label listed first is skipped
    ([("MatMul", ["x", "W"], ["logits"]), ("ArgMax", ["logits"], ["label"]),
      ("Softmax", ["logits"], ["probs"])],
     [("label", INT64), ("probs", FLOAT)], tool.BOUNDARY_OPS, ["x", "probs"]),
    # no float output at all: the first output
    ([("MatMul", ["x", "W"], ["logits"]), ("ArgMax", ["logits"], ["label"])],
     [("label", INT64)], tool.BOUNDARY_OPS, ["x", "label"]),
    # file order of the first appearance, not name order or consumer count
    ([("Relu", ["x"], ["zeta"]), ("Relu", ["x"], ["alpha"]), ("MatMul", ["zeta", "W"], ["p"]),
      ("MatMul", ["alpha", "W"], ["q"]), ("MatMul", ["zeta", "W"], ["r"]),
      ("Add", ["p", "q"], ["s"]), ("Add", ["s", "r"], ["out"])],
     [("out", FLOAT)], tool.BOUNDARY_OPS, ["zeta", "alpha", "out"]),
    # an output that is already a boundary is listed once, where it first appeared
    ([("MatMul", ["x", "W"], ["h"]), ("Relu", ["h"], ["y"]), ("MatMul", ["y", "W2"], ["z"])],
     [("y", FLOAT), ("z", FLOAT)], tool.BOUNDARY_OPS, ["x", "y"]),
    # no nodes: the output is the input
    ([], [("x", FLOAT)], tool.BOUNDARY_OPS, ["x"]),
])
def test_find_boundaries(nodes, outputs, ops, expected):
    assert tool.find_boundaries(graph(nodes, outputs), ops) == expected


# -- providers: missing keeps the requested order ----------------------------------------------

def test_providers_missing_keeps_the_requested_order(tmp_path):
    path = models.save(models.chain(features=4, widths=(4, 4)), tmp_path / "m.onnx")
    available = ort.get_available_providers()
    absent = [name for name in ort.get_all_providers() if name not in available][:2]
    assert len(absent) == 2, "needs two providers onnxruntime knows but this build lacks"
    first, second = absent
    requests = [[first, second], [second, "CPUExecutionProvider", first]]
    answer = tool.providers(str(path), requests)
    assert [case["missing"] for case in answer["cases"]] == [[first, second], [second, first]]
    assert [case["requested"] for case in answer["cases"]] == requests


# -- compare_outputs ---------------------------------------------------------------------------

def test_compare_outputs_worst_is_the_largest_excess_not_the_largest_difference():
    # rtol 1/64, atol 1/8: allowed = 0.125 + |ref|/64
    reference = np.array([[64.0, 0.0], [2.0, -4.0]], np.float32)
    candidate = np.array([[65.5, 0.75], [2.0, -4.0]], np.float32)
    # diff [[1.5, 0.75], [0, 0]]; allowed [[1.125, 0.125], [0.15625, 0.1875]]
    # excess [[0.375, 0.625], ...]: the worst is [0, 1], although [0, 0] differs most
    answer = tool.compare_outputs(reference, candidate, rtol=1 / 64, atol=1 / 8)
    assert answer["worst"] == {"index": [0, 1], "reference": 0.0, "candidate": 0.75,
                               "abs_diff": 0.75, "allowed": 0.125, "excess": 0.625}
    assert answer["max_abs_diff"] == 1.5
    assert answer["violations"] == 2
    assert answer["elements"] == 4
    dot = 65.5 * 64 + 2 * 2 + 4 * 4
    norms = math.sqrt(65.5 ** 2 + 0.75 ** 2 + 4 + 16) * math.sqrt(64 ** 2 + 4 + 16)
    assert answer["cosine"] == pytest.approx(dot / norms, rel=1e-12)


def test_compare_outputs_of_equal_outputs_are_exactly_equal():
    """0/0 is no relative difference (it made max_rel_diff null), and rounding must not put
    the cosine of equal outputs above 1 (1.0000000000000002 by the formula)."""
    def drawn(seed: int) -> np.ndarray:
        values = np.random.default_rng(seed).standard_normal(1000).astype(np.float32)
        values[:10] = 0.0
        return values

    def raw_cosine(values: np.ndarray) -> float:
        a = values.astype(np.float64)
        return float(np.dot(a, a) / (np.linalg.norm(a) * np.linalg.norm(a)))

    # the first draw whose cosine with itself rounds above 1 with this numpy
    reference = next(drawn(seed) for seed in range(1000) if raw_cosine(drawn(seed)) > 1.0)
    answer = tool.compare_outputs(reference, reference.copy(), rtol=1e-2, atol=1e-3)
    assert (answer["max_rel_diff"], answer["cosine"], answer["max_abs_diff"]) == (0.0, 1.0, 0.0)
    # a zero reference element that differs is infinitely far, relatively
    candidate = reference.copy()
    candidate[0] = 0.5
    assert tool.compare_outputs(reference, candidate, rtol=1e-2, atol=1e-3)[
        "max_rel_diff"] == math.inf



@pytest.mark.parametrize(("reference", "candidate", "rtol", "atol", "violations"), [
    # exactly on the bound is inside it
    ([0.0, 8.0, -8.0], [0.125, 9.125, -6.875], 1 / 8, 1 / 8, 0),
    # just past it, twice
    ([0.0, 8.0, -8.0], [0.25, 9.25, -6.875], 1 / 8, 1 / 8, 2),
    # rtol 0: the absolute bound alone
    ([1.0, 2.0, 3.0, 4.0], [1.5, 2.0, 3.25, 3.0], 0.0, 0.25, 2),
    # NaN and inf in the candidate are violations, however loose the bound
    ([1.0, 2.0, 3.0], [NAN, 2.0, INF], 1.0, 100.0, 2),
    # a NaN in the reference too
    ([NAN, 2.0], [1.0, 2.0], 0.0, 1.0, 1),
])
def test_compare_outputs_counts_violations(reference, candidate, rtol, atol, violations):
    answer = tool.compare_outputs(np.array(reference), np.array(candidate), rtol, atol)
    assert answer["violations"] == violations
    assert answer["elements"] == len(reference)


def test_compare_outputs_a_nan_is_the_worst_element():
    answer = tool.compare_outputs(np.array([1.0, 2.0, 3.0]), np.array([1.0, NAN, 30.0]),
                                  0.0, 0.25)
    assert answer["violations"] == 2
    assert answer["worst"]["index"] == [1]
    assert answer["worst"]["excess"] == INF


@pytest.mark.parametrize(("reference", "candidate", "cosine"), [
    ([0.0, 0.0], [0.0, 0.0], 1.0),    # two zero outputs agree
    ([0.0, 0.0], [1.0, 0.0], 0.0),    # a zero against a non-zero one does not
    ([1.0, 0.0], [0.0, 0.0], 0.0),
    ([1.0, 0.0], [1.0, 1.0], 1 / math.sqrt(2)),
    ([1.0, -2.0], [-2.0, 4.0], -1.0),
])
def test_compare_outputs_cosine(reference, candidate, cosine):
    answer = tool.compare_outputs(np.array(reference), np.array(candidate), 0.0, 0.0)
    assert answer["cosine"] == pytest.approx(cosine, abs=1e-15)


# -- compare_boundary --------------------------------------------------------------------------

@pytest.mark.parametrize(("a", "b", "rows", "expected"), [
    # row 0: cos = 9 / (5 * 3) = 0.6; row 1 is zero in both (1.0); error power 16 of 25
    ([[3, 4], [0, 0]], [[3, 0], [0, 0]], 2,
     {"max_abs_error": 4.0, "scale": 4.0, "rel_error": 1.0, "cos_min": 0.6,
      "sqnr_db": 10 * math.log10(25 / 16), "mse": 16 / 4}),
    # row 1 is zero in the fp32 tensor only: it still counts as 1.0
    ([[1, 2], [0, 0]], [[1, 2], [5, 5]], 2,
     {"max_abs_error": 5.0, "scale": 2.0, "rel_error": 2.5, "cos_min": 1.0,
      "sqnr_db": 10 * math.log10(5 / 50), "mse": 50 / 4}),
    # scale 0: rel_error is 0.0, not a division by zero; no signal power at all
    ([[0, 0, 0], [0, 0, 0]], [[0, 0, 1], [0, 0, 0]], 2,
     {"max_abs_error": 1.0, "scale": 0.0, "rel_error": 0.0, "cos_min": 1.0,
      "sqnr_db": -INF, "mse": 1 / 6}),
    # no error: sqnr is null
    ([[1, -2], [3, 4]], [[1, -2], [3, 4]], 2,
     {"max_abs_error": 0.0, "scale": 4.0, "rel_error": 0.0, "cos_min": 1.0,
      "sqnr_db": None, "mse": 0.0}),
    # opposite rows
    ([[1, -2]], [[-1, 2]], 1,
     {"max_abs_error": 4.0, "scale": 2.0, "rel_error": 2.0, "cos_min": -1.0,
      "sqnr_db": 10 * math.log10(5 / 20), "mse": 20 / 2}),
    # a (2, 2, 2) tensor: each of the 2 rows is 4 values. Row 0 of a is [0, 1, 2, 3], of b
    # [0, -1, 2, 3]: cos = (0 - 1 + 4 + 9) / 14 = 6/7; row 1 is equal (1.0)
    ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[[0, -1], [2, 3]], [[4, 5], [6, 7]]], 2,
     {"max_abs_error": 2.0, "scale": 7.0, "rel_error": 2 / 7, "cos_min": 6 / 7,
      "sqnr_db": 10 * math.log10(140 / 4), "mse": 4 / 8}),
])
def test_compare_boundary_hand_computed(a, b, rows, expected):
    got = tool.compare_boundary(np.array(a, np.float32), np.array(b, np.float32), rows,
                                ("sqnr", "mse"))
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert got[key] == (want if want is None or math.isinf(want)
                            else pytest.approx(want, rel=1e-12, abs=1e-15)), key
    plain = tool.compare_boundary(np.array(a, np.float32), np.array(b, np.float32), rows)
    assert set(plain) == {"max_abs_error", "scale", "rel_error", "cos_min"}


# -- plan_batches ------------------------------------------------------------------------------

@pytest.mark.parametrize(("sizes", "budget", "batches"), [
    ([1, 2, 3], None, [[0, 1, 2]]),
    ([], None, []),
    ([None, None], None, [[0, 1]]),
    ([], 100, []),
    ([40, 60, 50, 50], 100, [[0, 1], [2, 3]]),        # exact fits
    ([40, 61, 50, 50], 100, [[0], [1], [2, 3]]),
    ([10, 10, 10, 10], 25, [[0, 1], [2, 3]]),         # a third would not fit
    ([30, 5], 20, [[0], [1]]),                        # nothing joins one too big for a batch
    ([10, None, 10], 100, [[0], [1], [2]]),           # an unknown size goes alone
    ([None, 10, 10], 100, [[0], [1, 2]]),
    ([10, 10, None], 1000, [[0, 1], [2]]),
    ([150, 10, 90], 100, [[0], [1, 2]]),              # too big for any batch: alone
    ([0, 0, 0], 0, [[0, 1, 2]]),
])
def test_plan_batches(sizes, budget, batches):
    assert tool.plan_batches(sizes, budget) == batches


# -- retries -----------------------------------------------------------------------------------

class Flaky:
    """Fails ``failures`` times with an EprunError caused by ``message``, then returns 'ok'."""

    def __init__(self, failures: int, message: str = "EP compile timed out") -> None:
        self.failures, self.message, self.calls = failures, message, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            try:
                raise RuntimeError(self.message)
            except RuntimeError as cause:
                raise tool.EprunError("onnxruntime failed") from cause
        return "ok"


@pytest.fixture
def no_sleep(monkeypatch):
    import time

    pauses = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    return pauses


@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_retries_recover_from_exactly_the_budget(retries, no_sleep, capsys):
    action, used = Flaky(retries), [0]
    assert tool._with_retries(action, retries, 0.5, used, "m.onnx") == "ok"
    assert action.calls == retries + 1
    assert used == [retries]
    assert no_sleep == [0.5] * retries
    assert capsys.readouterr().err.splitlines() == [
        "eprun: transient provider error, retrying in 0.5s: onnxruntime failed"] * retries


@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_retries_give_up_after_the_budget(retries, no_sleep):
    action, used = Flaky(retries + 1), [0]
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, retries, 0.0, used, "m.onnx")
    assert action.calls == retries + 1
    assert used == [retries]


def test_retries_are_one_budget_for_the_whole_check(no_sleep):
    action, used = Flaky(2), [2]  # two retries already spent elsewhere, of three
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, 3, 0.0, used, "m.onnx")
    assert action.calls == 2
    assert used == [3]


@pytest.mark.parametrize("message", ["invalid model: no such op", "out of memory",
                                     "Load model from /x/timeout.onnx failed"])
def test_retries_never_retry_a_non_transient_error(message, no_sleep):
    action, used = Flaky(1, message), [0]
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, 3, 0.0, used, "/x/timeout.onnx")
    assert action.calls == 1
    assert used == [0]
    assert no_sleep == []


def test_retries_never_retry_other_exceptions(no_sleep):
    calls = []

    def broken():
        calls.append(1)
        try:
            raise TimeoutError("EP compile timed out")
        except TimeoutError as cause:  # not wrapped by eprun: a bug, not a provider error
            raise RuntimeError("unexpected") from cause

    with pytest.raises(RuntimeError):
        tool._with_retries(broken, 3, 0.0, [0], "m.onnx")
    assert calls == [1]


# -- small parsers -----------------------------------------------------------------------------

@pytest.mark.parametrize(("requested", "actual", "missing"), [
    (["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"],
     ["CUDAExecutionProvider"]),
    (["AzureExecutionProvider"], ["AzureExecutionProvider", "CPUExecutionProvider"], []),
    ([], ["CPUExecutionProvider"], []),
    (["B", "A", "CPUExecutionProvider"], ["CPUExecutionProvider"], ["B", "A"]),
    (["A", "B"], ["B", "A"], []),
    (["CPUExecutionProvider"], [], ["CPUExecutionProvider"]),
    # a device policy is missing when it got nothing but the CPU, unless it asked for the CPU
    (["policy:PREFER_NPU"], ["CPUExecutionProvider"], ["policy:PREFER_NPU"]),
    (["policy:PREFER_NPU"], ["OpenVINOExecutionProvider", "CPUExecutionProvider"], []),
    (["policy:PREFER_CPU"], ["CPUExecutionProvider"], []),
])
def test_fallback_of(requested, actual, missing):
    assert tool.fallback_of(requested, actual) == missing


@pytest.mark.parametrize(("text", "items"), [
    ("a,b,c", ["a", "b", "c"]),
    (" a , b ,,c, ", ["a", "b", "c"]),
    ("c,a,b", ["c", "a", "b"]),
    ("a,a", ["a", "a"]),
    ("\tMatMul\t", ["MatMul"]),
    ("", []),
    (",,", []),
    (" , ", []),
])
def test_parse_list(text, items):
    assert tool.parse_list(text) == items


@pytest.mark.parametrize(("text", "seed"), [
    ("0", 0), ("7", 7), ("007", 7), ("0000", 0), ("2026", 2026),
    ("1" + "0" * 30, 10 ** 30), pytest.param("9" * 4000, 10 ** 4000 - 1, id="4000 nines"),
])
def test_parse_seed_accepts(text, seed):
    assert tool.parse_seed(text) == seed


def test_parse_seed_past_the_int_conversion_limit():
    """main() lifts Python's 4,300-digit limit; with it lifted a seed of any length reads."""
    limit = getattr(sys, "get_int_max_str_digits", None)
    assert limit is not None, "every supported Python (3.9.14+) has the limit"
    before = limit()
    sys.set_int_max_str_digits(0)
    try:
        assert tool.parse_seed("9" * 5000) == 10 ** 5000 - 1
        assert tool.parse_seed("0" * 4999 + "5") == 5
    finally:
        sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("text", [
    "", " ", "-1", "+1", "1.5", "1e3", "0x10", "1_000", " 7", "7 ", "abc", "-0",
    "\u0663",            # ARABIC-INDIC DIGIT THREE: int() reads it as 3
    "\uff11\uff12",      # FULLWIDTH 12
    "\u00b2",            # SUPERSCRIPT TWO: str.isdigit() says yes
    "1\u0663",
])
def test_parse_seed_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_seed(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("seq=16", ("seq", 16)),
    (" seq = 16 ", ("seq", 16)),
    ("input_ids:1=8", ("input_ids:1", 8)),
    ("a=b=3", ("a=b", 3)),
    ("seq=01", ("seq", 1)),
])
def test_parse_dim_accepts(text, parsed):
    assert tool.parse_dim(text) == parsed


@pytest.mark.parametrize("text", ["seq=0", "seq=-1", "seq=+1", "seq=1.5", "=5", " =5", "seq",
                                  "seq=", "seq=\u0663", "seq=1e3"])
def test_parse_dim_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_dim(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("x:-1,1", ("x", (-1.0, 1.0))),
    ("x:1,1", ("x", (1.0, 1.0))),
    ("x:1e-3,2.5", ("x", (0.001, 2.5))),
    ("a:b:0,2", ("a:b", (0.0, 2.0))),
    (" x : 0 , 2 ", ("x", (0.0, 2.0))),
])
def test_parse_input_range_accepts(text, parsed):
    assert tool.parse_input_range(text) == parsed


@pytest.mark.parametrize("text", ["x:2,1", "x:nan,1", "x:0,nan", "x:0,inf", "x:-inf,0", "x:1",
                                  ":0,1", " :0,1", "0,1", "x:0,1,2", "x:a,1", "x:", "x:,"])
def test_parse_input_range_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_input_range(text)


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), ("-1", -1.0), ("0.99", 0.99),
                                         ("1e-1", 0.1), ("0", 0.0), ("-1.0", -1.0)])
def test_parse_cosine_accepts(text, value):
    assert tool.parse_cosine(text) == value


@pytest.mark.parametrize("text", ["1.0000001", "-1.01", "2", "nan", "inf", "-inf", "abc", ""])
def test_parse_cosine_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_cosine(text)


# -- quantized tensors read back and fed -------------------------------------------------------

def quantized_graph():
    """q = QuantizeLinear(x, 0.5, 10) (uint8); c = QLinearConcat of q and a uint8 input ``a``
    (scale 0.25, zero point 3), the way onnxruntime's QOperator format writes it."""
    def const(name, value, dtype):
        return helper.make_tensor(name, dtype, [], [value])

    nodes = [helper.make_node("QuantizeLinear", ["x", "q_scale", "q_zero"], ["q"]),
             helper.make_node("QLinearConcat", ["c_scale", "c_zero", "q", "q_scale", "q_zero",
                                                "a", "a_scale", "a_zero"], ["c"],
                              domain="com.microsoft", axis=1)]
    graph = helper.make_graph(
        nodes, "quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 3])],
        [helper.make_tensor_value_info("c", TensorProto.UINT8, [2, 6])],
        [const("q_scale", 0.5, TensorProto.FLOAT), const("q_zero", 10, TensorProto.UINT8),
         const("a_scale", 0.25, TensorProto.FLOAT), const("a_zero", 3, TensorProto.UINT8),
         const("c_scale", 1.0, TensorProto.FLOAT), const("c_zero", 0, TensorProto.UINT8)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_quantized_tensors_take_the_scale_of_their_maker_or_reader():
    model = quantized_graph()
    types = tool.tensor_types(model)
    quantization = tool.Quantization(model, "quantized.onnx", types, ["x", "q", "a"])
    assert quantization.params == {"q": ("q_scale", "q_zero"), "a": ("a_scale", "a_zero")}
    # read: (value - zero) * scale; a: (7 - 3) * 0.25 = 1, (3 - 3) * 0.25 = 0
    assert quantization.read("a", {"a": np.array([7, 3], np.uint8)}).tolist() == [1.0, 0.0]
    # quantize: round half to even of value / scale, plus zero, saturated to uint8:
    # 1.0/0.5 + 10 = 12; -3/0.5 + 10 = 4; 200/0.5 + 10 saturates; -20/0.5 + 10 saturates;
    # 0.25/0.5 = 0.5 rounds to 0 (even), 0.75/0.5 = 1.5 rounds to 2
    fed = quantization.quantize("q", [1.0, -3.0, 200.0, -20.0, 0.25, 0.75])
    assert fed.dtype == np.uint8
    assert fed.tolist() == [12, 4, 255, 0, 10, 12]


def test_an_undefined_declared_type_is_filled_from_the_graph():
    """A value_info that names a tensor but not its element type (0) says nothing: the type
    comes from the node that writes it (QLinearConcat writes its uint8 operands' type)."""
    model = quantized_graph()
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None))
    assert tool.tensor_types(model)["c"].tensor_type.elem_type == TensorProto.UINT8


def test_ctrl_c_while_the_command_line_is_parsed_is_an_interruption(monkeypatch, capfd):
    class Interrupted:
        def parse_known_args(self, argv):
            raise KeyboardInterrupt

    monkeypatch.setattr(tool, "build_parser", lambda only=None: Interrupted())
    assert tool.main(["partition", "m.onnx", "MatMul"]) == 130
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "eprun: error: interrupted\n"


# -- token ids: drawn over the table they index ------------------------------------------------

@pytest.mark.parametrize("path", [[], ["Cast"], ["Reshape", "Cast"]])
def test_ids_index_a_gather_table_directly_or_through_casts_and_reshapes(path):
    """ids -> (Cast to int32 -> Reshape ->) Gather(table of 7 rows): the ids are drawn in
    [0, 7) however many index-preserving ops stand between."""
    nodes, current = [], "ids"
    for k, op in enumerate(path):
        inputs = [current, "shape"] if op == "Reshape" else [current]
        attrs = {"to": TensorProto.INT32} if op == "Cast" else {}
        nodes.append(helper.make_node(op, inputs, [f"p{k}"], **attrs))
        current = f"p{k}"
    nodes.append(helper.make_node("Gather", ["table", current], ["y"], axis=0))
    graph = helper.make_graph(
        nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("table", TensorProto.FLOAT, [7, 3], [0.0] * 21),
         helper.make_tensor("shape", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    specs = tool.specs_from_model(model)
    feed = tool.make_feeds(specs, 3, None, "ids.onnx")
    ids = feed.arrays["ids"]
    assert ids.shape == (64, 5) and ids.min() >= 0 and ids.max() == 6  # 320 draws over 7


@pytest.mark.parametrize(("seconds", "said"), [
    (0.2, "1 s"), (8.4, "8 s"), (89, "89 s"), (95, "2 min"), (3599, "1 h 0 min"),
    (3900, "1 h 5 min")])
def test_a_wait_is_said_as_a_person_reads_it(seconds, said):
    assert tool._duration(seconds) == said
