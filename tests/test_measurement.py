"""Layer 5, measurement core: inputs and inputs files, golden records, boundaries and their
pairing, the comparison of outputs, local error, growth and batching within a memory budget.

The table-driven tests call eprun's pure functions in-process; every expected value there is
worked out by hand (powers of two where a ratio must be exact, short arithmetic in the comments
elsewhere), never taken from eprun's own output."""
from __future__ import annotations

import collections
import io
import json
import math
import zipfile
from collections.abc import Iterator
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from conftest import one_error_line
from onnx import TensorProto, helper, numpy_helper
from test_io_safety import in_process, refused, snapshot

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


@pytest.mark.parametrize(("rel_errors", "expected"), [
    ([0.0, 0.1, 0.3], {"index": 1, "total_growth": 0.3 / 0.1}),
    ([0.0, 0.0, 0.25, 0.5], {"index": 2, "total_growth": 2.0}),
    ([0.0, 0.5, 0.0], {"index": 1, "total_growth": 0.0}),
    ([0.2, 0.4], None),  # total_growth is a number: nothing to add
    ([0.0, 0.0], None),  # no error anywhere
    ([0.0, NAN, 0.5], None),
    ([], None),
])
def test_growth_since_the_first_error(rel_errors, expected):
    assert tool.growth_since_first_error(rel_errors) == expected


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


# -- token ids: drawn over the table they index ------------------------------------------------

@pytest.mark.parametrize("axis", [{"axis": 0}, {}])  # Gather's axis is 0 when not given
@pytest.mark.parametrize("path", [[], ["Cast"], ["Reshape", "Cast"]])
def test_ids_index_a_gather_table_directly_or_through_casts_and_reshapes(path, axis):
    """ids -> (Cast to int32 -> Reshape ->) Gather(table of 7 rows of 11): the ids are drawn
    in [0, 7) however many index-preserving ops stand between."""
    nodes, current = [], "ids"
    for k, op in enumerate(path):
        inputs = [current, "shape"] if op == "Reshape" else [current]
        attrs = {"to": TensorProto.INT32} if op == "Cast" else {}
        nodes.append(helper.make_node(op, inputs, [f"p{k}"], **attrs))
        current = f"p{k}"
    nodes.append(helper.make_node("Gather", ["table", current], ["y"], **axis))
    graph = helper.make_graph(
        nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("table", TensorProto.FLOAT, [7, 11], [0.0] * 77),
         helper.make_tensor("shape", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    specs = tool.specs_from_model(model)
    feed = tool.make_feeds(specs, 3, None, "ids.onnx")
    ids = feed.arrays["ids"]
    assert ids.shape == (64, 5) and ids.min() >= 0 and ids.max() == 6  # 320 draws over 7


def test_ids_read_second_by_another_op_index_no_table_of_its_own():
    """A Gather's second input is its indices; the same ids read second by another op (an Add
    of a smaller int tensor) give that op's first input no say: the ids are drawn over the
    Gather's 7 rows, not the 3 the Add's other operand has."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"]),
             helper.make_node("Add", ["offsets", "ids"], ["shifted"])]
    graph = helper.make_graph(
        nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("shifted", TensorProto.INT64, None)],
        [helper.make_tensor("table", TensorProto.FLOAT, [7, 11], [0.0] * 77),
         helper.make_tensor("offsets", TensorProto.INT64, [3, 5], [0] * 15)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (spec,) = tool.specs_from_model(model)
    assert spec.table == ("table", 7)


def test_a_machine_is_described_by_the_int8_instruction_sets_it_has():
    """A golden file's ``machine``: the architecture, the processor's name and, of the
    instruction sets the int8 kernels choose from, exactly those /proc/cpuinfo lists."""
    import platform

    named = {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"}
    flags = next((line.split(":", 1)[1].split() for line in
                  Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
                  if line.split(":", 1)[0].strip() == "flags"), [])
    described = tool.machine()
    assert described.startswith(platform.machine())
    listed = set(described.rsplit(", ", 1)[-1].split()) & named
    assert listed == named & set(flags)


def test_a_fingerprint_tells_where_the_model_file_ends_and_its_data_begins(tmp_path):
    """A model file and its external data are hashed with their sizes: moving bytes from the
    front of the data file to the end of the model file (as a field protobuf skips) gives
    another model, with other weights, and another fingerprint, though the bytes run on the
    same."""
    tail = b"\xa0\x06\x00"  # field 100, a varint 0: a field a ModelProto parse passes over
    weights = np.frombuffer(tail + b"\x00" * 13, dtype=np.float32).copy()
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    onnx.save(model, str(first / "m.onnx"), save_as_external_data=True, location="w.bin",
              size_threshold=0)
    model_bytes = (first / "m.onnx").read_bytes()
    data = (first / "w.bin").read_bytes()
    assert data.startswith(tail)
    (second / "m.onnx").write_bytes(model_bytes + tail)
    (second / "w.bin").write_bytes(data[len(tail):])
    moved = onnx.load(str(second / "m.onnx"), load_external_data=False)  # it parses
    assert [tensor.name for tensor in moved.graph.initializer] == ["w"]
    assert tool.model_fingerprint(str(first / "m.onnx")) != tool.model_fingerprint(
        str(second / "m.onnx"))


def test_outputs_that_are_not_tensors_get_a_clear_message(run_eprun_here, tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("SequenceConstruct", ["y", "y"], ["seq"])]
    seq_type = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    path = models.save(models.finish(nodes, [models.float_input("x", 4)], [seq_type]),
                       tmp_path / "sequence.onnx")
    line = one_error_line(run_eprun_here("check", path, path), 4)
    assert "output 'seq' is a list (not a tensor); check compares numeric tensors only" in line
    line = one_error_line(run_eprun_here("settings", path, "1"), 4)
    assert "settings compares numeric tensors only" in line

SWAPPED_RUNS = {
    "layers": ("layers", "{int8}", "{fp32}", "1"),
    "growth": ("growth", "{int8}", "{fp32}", "1"),
    "sensitivity": ("sensitivity", "{int8}", "{fp32}", "1"),
    "check": ("check", "{int8}", "{fp32}"),
    "report": ("report", "{int8}", "{fp32}", "--out-dir", "{out}"),
}


@pytest.mark.parametrize("command", sorted(SWAPPED_RUNS))
def test_a_swapped_pair_is_wrong_usage_with_the_fix(eprun_fails, lab_pair, tmp_path, command):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    argv = [word.format(fp32=fp32, int8=int8, out=out) for word in SWAPPED_RUNS[command]]
    line = eprun_fails(2, *argv)
    assert "look swapped" in line and "--swapped-ok" in line
    assert f"({fp32} {int8})" in line  # the order to give them in, ready to paste
    assert not out.exists()  # report measured nothing, wrote nothing


def test_swapped_ok_compares_the_pair_as_given(run_eprun_here, eprun, lab_pair):
    fp32, int8 = lab_pair
    as_given = eprun("layers", int8, fp32, "1", "--swapped-ok")
    # the same numbers as the right order, with the roles exchanged: max |a - b| is symmetric
    right = eprun("layers", fp32, int8, "1")
    assert [entry["max_abs_error"] for entry in as_given["layers"]] == pytest.approx(
        [entry["max_abs_error"] for entry in right["layers"]], rel=1e-12)
    checked = run_eprun_here("check", int8, fp32, "--swapped-ok", "--profile", "int8")
    assert checked.code in (0, 1) and checked.answer["outputs"]  # a verdict, not a refusal


def test_the_same_float_model_twice_is_not_a_swap(eprun, lab_pair):
    fp32, _ = lab_pair
    assert eprun("layers", fp32, fp32, "1")["layers"][-1]["max_abs_error"] == 0.0


def log_model(path, absolute: bool) -> None:
    """x @ I -> [Abs] -> Log: without Abs, every negative input becomes NaN (and 0 -> -inf)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm")]
    if absolute:
        nodes.append(helper.make_node("Abs", ["m"], ["a"], name="abs"))
    nodes.append(helper.make_node("Log", ["a" if absolute else "m"], ["y"], name="log"))
    graph = helper.make_graph(nodes, "log", [x], [y],
                              [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def direct_output(path, seed: int) -> np.ndarray:
    return models.run(path, models.contract_input(seed, 4))[0]


def test_nonfinite_values_are_counted_and_named(run_eprun_here, tmp_path):
    finite, broken = tmp_path / "abs_log.onnx", tmp_path / "log.onnx"
    log_model(finite, absolute=True)
    log_model(broken, absolute=False)
    want = int(np.count_nonzero(~np.isfinite(direct_output(broken, 1))))
    assert want > 0
    assert np.all(np.isfinite(direct_output(finite, 1)))

    result = run_eprun_here("layers", finite, broken, "1")
    assert result.code == 0
    last = result.answer["layers"][-1]
    assert last["nonfinite"] == {"fp32": 0, "int8": want}
    assert last["max_abs_error"] is None  # strict JSON: null, and now not silently
    assert f"the int8 tensor 'y' holds {want} NaN or infinite values" in result.stderr
    assert all("nonfinite" not in entry for entry in result.answer["layers"][:-1])

    checked = run_eprun_here("check", finite, broken, "--min-cos", "-1")  # check's seed: 0
    want = int(np.count_nonzero(~np.isfinite(direct_output(broken, 0))))
    assert checked.code == 1
    assert checked.answer["outputs"][0]["nonfinite"] == {"reference": 0, "candidate": want}
    verdict = checked.stderr.splitlines()[-1]
    assert f"no cosine, the outputs hold {want} NaN or infinite values" in verdict
    assert "nan below" not in verdict


def test_finite_answers_have_no_nonfinite_field(eprun, lab_pair):
    fp32, int8 = lab_pair
    assert all("nonfinite" not in entry for entry in eprun("layers", fp32, int8, "1")["layers"])


def test_a_wrong_shaped_inputs_array_blames_the_file(eprun_fails, eprun, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    wrong, right = tmp_path / "wrong.npz", tmp_path / "right.npz"
    np.savez(wrong, x=np.zeros((4, 3), np.float32))
    np.savez(right, x=np.zeros((4, 8), np.float32))
    line = eprun_fails(4, "layers", fp32, int8, "1", "--inputs", wrong)
    assert f"{str(wrong)!r}: 'x' has shape [4, 3], but {str(fp32)!r} takes 'x' as" in line
    assert "fix the array in the --inputs file" in line
    assert eprun("layers", fp32, int8, "1", "--inputs", right)["rows"] == 4


def matmul_model(path, dims: list, features: int) -> None:
    """x (dims) @ w (features x 3) -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((features, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "m",
                              [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("command", ["layers", "growth", "check"])
def test_a_run_that_fails_on_chosen_dims_says_which_and_how_to_set_them(
        run_eprun_here, eprun_fails, tmp_path, command):
    model = tmp_path / "needs_t5.onnx"
    matmul_model(model, ["N", "T"], 5)  # runs only when T is 5
    argv = (command, model, model) + (("1",) if command != "check" else ())
    line = eprun_fails(4, *argv)
    assert "eprun chose" in line and "x[1] ('T')" in line and "--dim NAME=VALUE" in line
    assert run_eprun_here("layers", model, model, "1", "--dim", "T=5").code == 0


def test_only_a_batch_by_features_input_goes_without_the_inputs_record(eprun, tmp_path):
    image = tmp_path / "image.onnx"
    matmul_model(image, ["N", 2, 4], 4)
    answer = eprun("layers", image, image, "1")
    assert answer["inputs"] == [{"name": "x", "dtype": "float32", "shape": [64, 2, 4],
                                 "source": "standard_normal"}]
    flat = tmp_path / "flat.onnx"
    matmul_model(flat, ["N", 4], 4)
    assert "inputs" not in eprun("layers", flat, flat, "1")


def test_the_lab_pair_keeps_the_contracts_pairing(eprun, lab_pair):
    """auto pairs by position where names and positions agree: no "pairing" in the answer."""
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "2")
    assert "pairing" not in answer
    assert answer == eprun("layers", fp32, int8, "2", "--pair", "position")
    assert "pairing" not in eprun("growth", fp32, int8, "2")


def test_local_error_on_a_float16_twin_casts_what_it_feeds(run_eprun_here, tmp_path):
    """A float16 twin's segments take float16: --local feeds the fp32 tensor cast to it. The
    segment into relu1 is checked against onnx's own extraction of that subgraph, fed the
    same cast tensor (sessions opened here)."""
    from test_real_models import float16_twin

    fp32 = models.save(models.chain(features=8, widths=(16, 16, 8), seed=4), tmp_path / "f.onnx")
    fp16 = models.save(float16_twin(onnx.load(str(fp32))), tmp_path / "h.onnx")
    answer = run_eprun_here("layers", fp32, fp16, "2", "--local").answer
    assert answer["local_unavailable"] == []
    x = models.contract_input(2, 8)
    fp32_values = dict(zip(("relu0", "relu1"), models.run(fp32, x, ["relu0", "relu1"])))
    segment = tmp_path / "segment.onnx"
    onnx.utils.extract_model(str(fp16), str(segment), ["relu0"], ["relu1"])
    got = models.run(segment, {"relu0": fp32_values["relu0"].astype(np.float16)})[0]
    assert got.dtype == np.float16
    want = float(np.abs(got.astype(np.float64) - fp32_values["relu1"]).max())
    local = answer["layers"][2]["local"]
    assert answer["layers"][2]["fp32"] == "relu1"
    assert local["max_abs_error"] == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_a_cnn_with_a_gemm_head_is_told_about_conv_boundaries(run_eprun_here, tmp_path):
    import real_models

    cnn = models.save(real_models.residual_cnn(7), tmp_path / "cnn.onnx")
    result = run_eprun_here("layers", cnn, cnn, "1")
    assert result.code == 0 and result.answer["layer_count"] == 2  # the Gemm's input, output
    assert ("has 2 boundaries, but 4 Conv layers no boundary is in front of: --boundary-ops "
            "MatMul,Gemm,Conv compares the input of each") in result.stderr
    wider = run_eprun_here("layers", cnn, cnn, "1", "--boundary-ops", "MatMul,Gemm,Conv")
    assert wider.answer["layer_count"] == 6 and "boundary-ops" not in wider.stderr


def two_outputs(path, factor: float) -> None:
    """x @ (factor * W) -> h; outputs a = Relu(h) (the first float one) and b = Sigmoid(h)."""
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array((factor * rng.standard_normal((4, 3))).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 3])
               for name in ("a", "b")]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Relu", ["h"], ["a"], name="relu"),
                               helper.make_node("Sigmoid", ["h"], ["b"], name="sig")],
                              "two", [x], outputs, [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_output_chooses_the_final_boundary(eprun, eprun_fails, tmp_path):

    first, second = tmp_path / "one.onnx", tmp_path / "two.onnx"
    two_outputs(first, 1.0)
    two_outputs(second, 1.01)
    default = eprun("layers", first, second, "1")
    assert [entry["fp32"] for entry in default["layers"]] == ["x", "a"]
    chosen = eprun("layers", first, second, "1", "--output", "b")
    assert [entry["fp32"] for entry in chosen["layers"]] == ["x", "b"]
    x = models.contract_input(1, 4)
    b1, b2 = (models.run(path, x, ["b"])[0].astype(np.float64) for path in (first, second))
    assert chosen["layers"][-1]["max_abs_error"] == pytest.approx(
        float(np.abs(b2 - b1).max()), rel=1e-9)
    assert "no output of that name (its outputs: a, b)" in eprun_fails(
        2, "growth", first, second, "1", "--output", "h")
# A member that would take a GiB of memory once inflated is one that declares a GiB. What the
# tests below count is how much of a member eprun inflates, so 64 MiB of zeros stand for it
# (a GiB took seconds to deflate for each fixture).
BOMB = 64 << 20


# == R9 bounded reads ===========================================================================

def zeros(count: int) -> Iterator[bytes]:
    """``count`` zero bytes, a MiB at a time."""
    chunk = bytes(1 << 20)
    while count > 0:
        yield chunk[:count]
        count -= len(chunk)


def npy_header(shape: tuple) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def write_member(archive: zipfile.ZipFile, name: str, pieces) -> None:
    """One member written piece by piece: never whole in memory or on disk."""
    with archive.open(name, "w", force_zip64=True) as member:
        for piece in pieces:
            member.write(piece)


def inflated(monkeypatch) -> collections.Counter:
    """From here on, the bytes read out of each .npz member (zipfile's reads), by its name."""
    counts: collections.Counter = collections.Counter()
    for method in ("read", "read1"):
        original = getattr(zipfile.ZipExtFile, method)

        def counting(self, n=-1, original=original):
            data = original(self, n)
            counts[self.name] += len(data)
            return data

        monkeypatch.setattr(zipfile.ZipExtFile, method, counting)
    return counts


@pytest.fixture(scope="module")
def inputs_x():
    return models.contract_input(7, 8)


@pytest.fixture(scope="module")
def with_junk(tmp_path_factory, inputs_x) -> Path:
    """x, and an unused member that declares BOMB bytes (deflated: the file stays small)."""
    path = tmp_path_factory.mktemp("junk") / "inputs.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        write_member(archive, "x.npy", [npy_header(inputs_x.shape), inputs_x.tobytes()])
        write_member(archive, "junk.npy", [npy_header((BOMB // 4,)), *zeros(BOMB)])
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("junk.npy").file_size >= BOMB
    assert path.stat().st_size < BOMB // 64
    return path


@pytest.fixture(scope="module")
def padded_x(tmp_path_factory, inputs_x) -> Path:
    """x whose member declares BOMB bytes more than its header's shape needs (2 KiB)."""
    path = tmp_path_factory.mktemp("padded") / "inputs.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        write_member(archive, "x.npy",
                     [npy_header(inputs_x.shape), inputs_x.tobytes(), *zeros(BOMB)])
    assert path.stat().st_size < BOMB // 64
    return path


def test_an_unused_member_of_an_inputs_file_is_never_decompressed(
        run_eprun_here, lab_pair, with_junk, monkeypatch):
    fp32, int8 = lab_pair
    counts = inflated(monkeypatch)
    result = run_eprun_here("layers", fp32, int8, "1", "--inputs", with_junk)
    assert result.code == 0, result.stderr
    assert result.answer["rows"] == 64
    assert counts["junk.npy"] == 0
    assert counts["x.npy"] >= 64 * 8 * 4  # (what is read is counted)


def test_a_member_larger_than_its_shape_is_refused_before_it_is_inflated(
        run_eprun_here, lab_pair, padded_x, monkeypatch):
    fp32, int8 = lab_pair
    before = snapshot(padded_x.parent)
    counts = inflated(monkeypatch)
    refused(run_eprun_here("layers", fp32, int8, "1", "--inputs", padded_x))
    assert 0 < counts["x.npy"] < 4096  # its header, no more
    assert snapshot(padded_x.parent) == before


@pytest.mark.parametrize("saved_by", ["check", "layers"])
@pytest.mark.parametrize("where", ["the record", "a field"])
def test_a_deeply_nested_golden_record_is_one_clean_line(capfd, lab_pair, tmp_path, saved_by,
                                                         where):
    """900 deep is within json's own limit: nested in a field the answer echoes (the
    providers), it once reached the answer's writer and ended in a RecursionError."""
    fp32, int8 = lab_pair
    golden = tmp_path / "golden.npz"
    save, load = {"check": (["check", fp32, fp32, "--save-outputs"], "--load-outputs"),
                  "layers": (["layers", fp32, int8, "1", "--save-boundaries"],
                             "--load-boundaries")}[saved_by]
    saved = in_process(capfd, *save, golden)
    assert saved.code == 0, saved.stderr
    with np.load(golden, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    records = [name for name, value in members.items()
               if value.dtype.kind == "U" and value.ndim == 0]
    assert len(records) == 1, list(members)  # the JSON record eprun writes
    record = json.loads(str(members[records[0]]))
    deep = "[" * 900 + "]" * 900
    if where == "a field":
        record["providers"] = json.loads(deep)
        deep = json.dumps(record)
    members[records[0]] = np.array(deep)
    np.savez(golden, **members)
    before = snapshot(tmp_path)
    result = in_process(capfd, *save[:-1], load, golden)
    line = refused(result)
    assert "RecursionError" not in result.stderr
    assert "is not a golden file eprun wrote" in line and "nested" in line
    assert snapshot(tmp_path) == before


def test_a_golden_record_is_read_up_to_16_mib_and_refused_past_it(capfd, lab_pair, tmp_path):
    """The record is names and versions, not data: one of 16 MiB (4 Mi characters as numpy
    stores text, 4 bytes each) is read, one character more is refused from its header."""
    fp32, _ = lab_pair
    golden = tmp_path / "golden.npz"
    assert in_process(capfd, "check", fp32, fp32, "--save-outputs", golden).code == 0
    with np.load(golden, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    (record,) = [name for name, value in members.items()
                 if value.dtype.kind == "U" and value.ndim == 0]
    text = str(members[record])
    for length in (4 << 20, (4 << 20) + 1):
        members[record] = np.array(text.ljust(length))  # JSON ends in blanks as well
        assert members[record].nbytes == 4 * length
        np.savez(golden, **members)
        result = in_process(capfd, "check", fp32, fp32, "--load-outputs", golden)
        if length == 4 << 20:
            assert result.code == 0, result.stderr
        else:
            assert "more than such a member ever holds (16777216)" in refused(result)


def test_a_member_the_input_cannot_take_is_never_inflated(capfd, monkeypatch, lab_pair,
                                                          tmp_path):
    """Its header says (1, 2**28) floats where the model takes [N, 8]: refused from the
    header, before numpy reads a byte of its data."""
    fp32, int8 = lab_pair
    path = tmp_path / "wide.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("x.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(
            member, {"descr": "<f4", "fortran_order": False, "shape": (1, 1 << 28)})
        member.write(bytes(1 << 20))  # the rest is never reached
    read = []
    real = np.lib.format.read_array
    monkeypatch.setattr(np.lib.format, "read_array",
                        lambda *args, **kwargs: read.append(1) or real(*args, **kwargs))
    line = refused(in_process(capfd, "layers", fp32, int8, "1", "--inputs", path))
    assert "'x' has shape [1, 268435456]" in line and read == []


def test_max_memory_gives_the_same_answer(tmp_path, monkeypatch, capfd):
    """--max-memory fetches the boundaries in batches, each from sessions opened for it, and
    the answer is the one fetched at once. At 1000 rows a boundary of this 24-wide chain holds
    about 190 KB (fp32 and int8 together): 1 MB fits a few in a batch, 0 fits one. The plan
    and the sessions opened for it show that each run really was split that way.
    (Every batch's sessions expose every boundary, so each kernel, the int8 ones of --local's
    segments included, sees the graph it sees unsplit: equal bit for bit on any CPU.)"""
    import eprun as tool

    fp32 = models.save(models.chain(features=16, widths=[24] * 15 + [8], seed=5),
                       tmp_path / "deep.onnx")
    int8 = models.quantize(fp32, tmp_path / "deep_q.onnx", seed=6)
    plans, opened = [], []
    plan, session = tool.plan_batches, tool.PairedModel.session
    monkeypatch.setattr(tool, "plan_batches", lambda *args: plans.append(plan(*args)) or plans[-1])
    monkeypatch.setattr(tool.PairedModel, "session", lambda self, *args, **kwargs: (
        opened.append(self.path), session(self, *args, **kwargs))[1])

    def growth(*budget: str) -> tuple[dict, list, int]:
        plans.clear()
        opened.clear()
        argv = ["growth", str(fp32), str(int8), "2", "--local", "--rows", "1000", *budget]
        assert tool.main(argv) == 0
        (batches,) = plans
        return json.loads(capfd.readouterr().out), batches, len(opened)

    whole, batches, sessions = growth()
    assert whole["layer_count"] == 17  # 16 MatMul inputs and the output
    assert batches == [list(range(17))]
    for budget in ("0", "1"):
        split, batches, split_sessions = growth("--max-memory", budget)
        assert [k for batch in batches for k in batch] == list(range(17))
        if budget == "0":  # one boundary at a time
            assert len(batches) == 17
        else:  # several batches, of several boundaries
            assert 1 < len(batches) < 17
        # each batch more opens its own fp32 and int8 sessions
        assert split_sessions - sessions == 2 * (len(batches) - 1)
        assert split == whole
