"""Mistakes are loud and hints can be pasted: what users of Polygraphy and qdq_loss_debug expect.

A swapped pair stops with exit 2 and the fix, NaN and infinities are counted and named, a
command name that is nearly right gets a suggestion, a list given as several arguments gets
the joined form, the seed is taken in both forms by every command that has one, a bare
``eprun`` shows the help, and help speaks of the name the user typed.
"""
from __future__ import annotations

import os
import subprocess
import sys

import models
import numpy as np
import onnx
import pytest
from conftest import ROOT, run_eprun
from onnx import TensorProto, helper, numpy_helper

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


def test_a_near_miss_command_gets_a_suggestion(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    assert "did you mean 'layers'?" in eprun_fails(2, "layer", fp32, int8, "1")
    assert "did you mean" not in eprun_fails(2, "frobnicate", fp32)


def test_a_list_given_as_several_arguments_gets_the_joined_form(eprun_fails, lab_pair):
    fp32, _ = lab_pair
    line = eprun_fails(2, "partition", fp32, "MatMul", "Add", "Relu")
    assert "joined with commas: MatMul,Add,Relu" in line
    assert "joined with commas" not in eprun_fails(2, "partition", fp32, "MatMul", "--nope")


def test_the_seed_is_taken_in_both_forms(run_eprun_here, eprun, eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    assert eprun("layers", fp32, int8, "--seed", "5") == eprun("layers", fp32, int8, "5")
    assert eprun("settings", int8, "--seed=7") == eprun("settings", int8, "7")
    positional = run_eprun_here("check", fp32, int8, "3", "--profile", "int8")
    optional = run_eprun_here("check", fp32, int8, "--seed", "3", "--profile", "int8")
    assert positional.answer == optional.answer and positional.answer["seed"] == 3
    assert run_eprun_here("check", fp32, int8, "--profile", "int8").answer["seed"] == 0
    assert "required: seed" in eprun_fails(2, "growth", fp32, int8)
    assert "given twice, as 1 and 2" in eprun_fails(2, "layers", fp32, int8, "1", "--seed", "2")
    assert eprun("layers", fp32, int8, "4", "--seed", "4")["seed"] == 4  # the same twice: fine


def test_bare_eprun_shows_a_short_usage_and_where_help_is(run_eprun_here):
    result = run_eprun_here()
    assert result.code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) <= 4 and lines[0].startswith("usage: eprun.py")
    assert "layers" in result.stderr and "--help" in lines[-1]
    assert lines[-1].startswith("eprun: error: no command given")


def test_help_and_hints_use_the_name_typed():
    """Installed, the command is ``eprun``: its help, examples and hints say so."""
    run = ("import sys; sys.path.insert(0, {root!r}); sys.argv = ['eprun'] + {argv!r}; "
           "import eprun; eprun.cli()")
    helped = subprocess.run(
        [sys.executable, "-c", run.format(root=str(ROOT), argv=["layers", "--help"])],
        capture_output=True, text=True, timeout=60, env={**os.environ}, check=False)
    assert helped.returncode == 0
    assert "usage: eprun layers" in helped.stdout
    assert "example:\n  eprun layers " in helped.stdout and "eprun.py" not in helped.stdout
    wrong = subprocess.run(
        [sys.executable, "-c", run.format(root=str(ROOT), argv=["layer"])],
        capture_output=True, text=True, timeout=60, env={**os.environ}, check=False)
    assert wrong.returncode == 2 and "(see 'eprun --help')" in wrong.stderr
    assert "example:\n  eprun.py layers " in run_eprun("layers", "--help").stdout


def test_placement_says_when_the_session_fell_back(run_eprun_here, lab_pair):
    _, int8 = lab_pair
    result = run_eprun_here("placement", int8, "CUDAExecutionProvider,CPUExecutionProvider")
    assert result.code == 0 and result.answer["actual"] == ["CPUExecutionProvider"]
    assert ("eprun: note: the session did not get CUDAExecutionProvider, or it took no node: its "
            "nodes ran on CPUExecutionProvider") in result.stderr
    assert "did not get" not in run_eprun_here("placement", int8, "CPUExecutionProvider").stderr


def test_check_states_the_spread_of_the_differences(run_eprun_here, lab_pair):
    """mean, median and 99th percentile of |candidate - reference|, recomputed on sessions
    opened here with the contract input."""
    fp32, int8 = lab_pair
    x = models.contract_input(0, 8)
    outputs = [models.run(path, x)[0].astype(np.float64) for path in (fp32, int8)]
    diff = np.abs(outputs[1] - outputs[0])
    entry = run_eprun_here("check", fp32, int8, "--profile", "int8").answer["outputs"][0]
    assert entry["mean_abs_diff"] == pytest.approx(float(np.mean(diff)), rel=1e-9)
    assert entry["median_abs_diff"] == pytest.approx(float(np.median(diff)), rel=1e-9)
    assert entry["p99_abs_diff"] == pytest.approx(float(np.quantile(diff, 0.99)), rel=1e-9)
    assert entry["median_abs_diff"] <= entry["p99_abs_diff"] <= entry["max_abs_diff"]


def test_profile_auto_picks_int8_for_a_quantized_candidate(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    quantized = run_eprun_here("check", fp32, int8, "--profile", "auto")
    assert quantized.answer["profile"] == "int8"
    assert quantized.answer["tolerance"] == {"rtol": 0.1, "atol": 0.05, "min_cos": 0.99}
    assert "--profile auto: int8" in quantized.stderr
    same = run_eprun_here("check", fp32, fp32, "--profile", "auto")
    assert same.code == 0 and same.answer["profile"] == "fp16"


def table_rows(text: str) -> list[list[str]]:
    """The data rows of a --format table answer: the lines after the dashed one, split on two
    spaces or more, up to the first line that is not a row."""
    import re

    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if set(line) <= {"-", " "} and line)
    rows = []
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 3:
            break
        rows.append(cells)
    return rows


def test_a_table_has_a_row_per_boundary_and_marks_the_worst(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    answer = run_eprun_here("layers", fp32, int8, "3").answer
    table = run_eprun_here("layers", fp32, int8, "3", "--format", "table")
    assert table.code == 0 and "\033" not in table.stdout  # no colour off a terminal
    rows = table_rows(table.stdout)
    assert [row[1] for row in rows] == [entry["fp32"] for entry in answer["layers"]]
    worst = max(range(len(answer["layers"])), key=lambda k: answer["layers"][k]["rel_error"])
    assert [k for k, row in enumerate(rows) if row[-1] == "<- worst"] == [worst]
    assert float(rows[worst][5]) == pytest.approx(answer["layers"][worst]["rel_error"],
                                                  rel=1e-3)


def test_table_formats_for_every_command_that_has_one(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    growth = run_eprun_here("growth", fp32, int8, "3").answer
    table = run_eprun_here("growth", fp32, int8, "3", "--format", "table").stdout
    said = "shrank" if growth["total_growth"] < 1 else "grew"
    assert f"the error {said}" in table
    settings = run_eprun_here("settings", int8, "3", "--format", "table").stdout
    assert len(table_rows(settings)) == 4  # the baseline and the three cases
    checked = run_eprun_here("check", fp32, int8, "--profile", "int8", "--format", "table")
    assert checked.code == 1 and "failed:" in checked.stdout


def test_colour_and_the_shrinking_error_in_words():
    import eprun as tool

    lines = tool.aligned(["a", "b"], [[1, 0.5], [2, 0.25]], worst=0, colour=True)
    assert lines[2].startswith("\033[1;31m") and lines[2].endswith("<- worst\033[0m")
    assert "\033" not in lines[3]
    shrank = {"seed": 1, "layer_count": 2, "rel_error": [0.2, 0.166], "ratios": [0.83],
              "monotone": False, "total_growth": 0.83, "max_ratio": {"index": 1, "ratio": 0.83}}
    assert "total growth 0.83: the error shrank" in tool.render_table("growth", shrank)
    for total, said in ((1.0, "stayed the same"), (1.2, "grew")):
        text = tool.render_table("growth", {**shrank, "total_growth": total})
        assert f"total growth {total:g}: the error {said}" in text


def test_the_real_stderr_is_remembered_only_while_the_outermost_capture_holds_it():
    """Where a signal's last word goes: the stderr captured_chatter took over, while it holds
    it (an inner capture changes nothing), and nothing once it is given back."""
    import eprun as tool

    run = tool.Run()
    with tool.running(run):
        with tool.captured_chatter():
            outer = run.stderr
            assert outer is not None
            with tool.captured_chatter():
                assert run.stderr == outer
            assert run.stderr == outer
        assert run.stderr is None and run.terminals == []


def test_the_report_names_the_command_that_made_it(run_eprun_here, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "rep"
    assert run_eprun_here("report", fp32, int8, "--seed", "4", "--out-dir", out,
                     "--rows", "16").code == 0
    text = (out / "ep_report.md").read_text(encoding="utf-8")
    assert (f"generated by `python eprun.py report {fp32} {int8} --seed 4 --out-dir {out} "
            "--rows 16`") in text
    import json

    total = json.loads((out / "growth.json").read_text())["total_growth"]
    assert f"the error {'shrank' if total < 1 else 'grew'}." in text


def test_per_output_tolerances(run_eprun_here, lab_pair):
    """``--atol NAME:VALUE`` sets one output's bound; the violations are numpy's count."""
    fp32, int8 = lab_pair
    x = models.contract_input(0, 8)
    reference, candidate = (models.run(path, x)[0] for path in (fp32, int8))
    result = run_eprun_here("check", fp32, int8, "--profile", "int8", "--atol", "y:0.3",
                       "--rtol", "y:0.2")
    tolerance = result.answer["tolerance"]
    assert tolerance["per_output"] == {"y": {"rtol": 0.2, "atol": 0.3}}
    assert (tolerance["rtol"], tolerance["atol"]) == (0.1, 0.05)  # the profile's, for the rest
    want = int(np.count_nonzero(~np.isclose(candidate, reference, rtol=0.2, atol=0.3)))
    assert result.answer["outputs"][0]["violations"] == want
    assert "no output of" in run_eprun_here("check", fp32, int8, "--atol", "z:1").stderr
    assert run_eprun_here("check", fp32, int8, "--atol", ":1").code == 2


def test_the_report_says_where_the_int8_range_clips(run_eprun_here, lab_pair, tmp_path):
    """Boundary 0 is the graph input: the share of the contract input outside the range its
    QuantizeLinear represents, recomputed from the int8 model's own scale and zero point."""
    fp32, int8 = lab_pair
    model = onnx.load(str(int8))
    weights = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    quantize = next(node for node in model.graph.node
                    if node.op_type == "QuantizeLinear" and node.input[0] == "x")
    scale, zero = float(weights[quantize.input[1]]), weights[quantize.input[2]]
    limits = np.iinfo(zero.dtype)
    low, high = (limits.min - int(zero)) * scale, (limits.max - int(zero)) * scale
    x = models.contract_input(9, 8)
    want = float(np.mean((x < low) | (x > high)))
    out = tmp_path / "rep"
    assert run_eprun_here("report", fp32, int8, "--seed", "9", "--out-dir", out).code == 0
    table = (out / "ep_report.md").read_text(encoding="utf-8")
    row = next(line for line in table.splitlines() if line.startswith("| 0 | `x` |"))
    assert row.split("|")[-2].strip() == f"{want:.2%}"
    assert "`clipped` is the share of the fp32 values outside the range" in table


def test_a_wrong_shaped_inputs_array_blames_the_file(eprun_fails, eprun, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    wrong, right = tmp_path / "wrong.npz", tmp_path / "right.npz"
    np.savez(wrong, x=np.zeros((4, 3), np.float32))
    np.savez(right, x=np.zeros((4, 8), np.float32))
    line = eprun_fails(4, "layers", fp32, int8, "1", "--inputs", wrong)
    assert f"{str(wrong)!r}: 'x' has shape [4, 3], but {str(fp32)!r} takes 'x' as" in line
    assert "fix the array in the --inputs file" in line
    assert eprun("layers", fp32, int8, "1", "--inputs", right)["rows"] == 4


@pytest.mark.parametrize("route", ["qoperator", "dynamic"])
def test_sensitivity_refuses_what_it_cannot_restore(run_eprun_here, eprun_fails, lab_pair, tmp_path, route):
    """QOperator and dynamic twins have no float unit between Q/DQ pairs to restore: a clear
    refusal, not a ranking of ops the quantizer never touched. report --sensitivity still
    writes every deliverable and says why the section is missing."""
    import real_models

    fp32, _ = lab_pair
    twin = tmp_path / f"{route}.onnx"
    real_models.ROUTES[route](fp32, twin, 3)
    form = {"qoperator": "QOperator", "dynamic": "dynamic"}[route]
    line = eprun_fails(4, "sensitivity", fp32, twin, "1")
    assert f"is quantized in {form} form" in line and "QuantFormat.QDQ" in line
    out = tmp_path / "rep"
    result = run_eprun_here("report", fp32, twin, "--out-dir", out, "--sensitivity")
    assert result.code == 0, result.stderr
    assert result.answer["sensitivity"] is None
    assert f"quantized in {form} form" in result.answer["sensitivity_error"]
    assert "report --sensitivity: the section is left out" in result.stderr
    text = (out / "ep_report.md").read_text(encoding="utf-8")
    assert "## Sensitivity (optional: report --sensitivity)\n\nNot measured: " in text
    assert len(list(out.iterdir())) == 6


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
def test_a_run_that_fails_on_chosen_dims_says_which_and_how_to_set_them(run_eprun_here, eprun_fails, tmp_path,
                                                                       command):
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


def test_the_sensitivity_table_ranks_from_one_in_the_answers_order(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    answer = run_eprun_here("sensitivity", fp32, int8, "1", "--max-units", "2").answer
    rows = table_rows(run_eprun_here("sensitivity", fp32, int8, "1", "--max-units", "2",
                                "--format", "table").stdout)
    assert [row[0] for row in rows] == [str(k) for k in range(1, len(answer["units"]) + 1)]
    assert [row[1] for row in rows] == [unit["name"] for unit in answer["units"]]


def test_a_seed_after_an_option_is_still_the_seed(run_eprun_here, eprun, eprun_fails, lab_pair):
    """argparse fills an optional positional before the options: a seed typed after one
    (as eprun always took it) must not become an unrecognized argument."""
    fp32, int8 = lab_pair
    assert eprun("layers", fp32, int8, "--rows", "8", "5") == eprun("layers", fp32, int8, "5",
                                                                     "--rows", "8")
    assert eprun("settings", int8, "--rows", "8", "6")["seed"] == 6
    checked = run_eprun_here("check", fp32, int8, "--profile", "int8", "3")
    assert checked.answer["seed"] == 3
    assert "unrecognized arguments: 2" in eprun_fails(2, "layers", fp32, int8, "--rows", "8",
                                                       "1", "2")
    assert "argument seed: seed 'abc'" in eprun_fails(2, "layers", fp32, int8, "--rows", "8",
                                                       "abc")


def test_the_check_table_marks_a_failing_output_not_a_passing_one(run_eprun_here, tmp_path):
    """Two outputs, the first identical, the second off in cosine only (violations 0 both)."""
    def model(path, sign: float) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
        outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 4])
                   for name in ("a", "b")]
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["a"], name="same"),
             helper.make_node("Mul", ["x", "k"], ["b"], name="flip")], "two", [x], outputs,
            [numpy_helper.from_array(np.array(sign, np.float32), "k")])
        built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        built.ir_version = 8
        onnx.save(built, str(path))

    reference, candidate = tmp_path / "r.onnx", tmp_path / "c.onnx"
    model(reference, 1.0)
    model(candidate, -1.0)
    result = run_eprun_here("check", reference, candidate, "--rtol", "2", "--atol", "100",
                       "--format", "table")
    assert result.code == 1
    rows = table_rows(result.stdout)
    assert [row[0] for row in rows if row[-1] == "<- worst"] == ["b"]


def test_a_null_total_growth_says_why(tmp_path):
    import eprun as tool

    lost = {"seed": 1, "layer_count": 3, "rel_error": [0.1, float("nan"), 0.2],
            "ratios": [float("nan"), float("nan")], "monotone": False, "total_growth": None,
            "max_ratio": None}
    assert "the relative error at boundary 1 is NaN or infinite" in tool.render_table(
        "growth", lost)
    zero = {**lost, "rel_error": [0.0, 0.1, 0.2], "ratios": [None, 2.0]}
    assert "the first relative error is 0" in tool.render_table("growth", zero)
    layered = {"seed": 1, "rows": 64, "layer_count": 2, "layers": [
        {"index": 0, "fp32": "x", "int8": "x", "max_abs_error": 0.5, "scale": 1.0,
         "rel_error": 0.5, "cos_min": 1.0},
        {"index": 1, "fp32": "y", "int8": "y", "max_abs_error": float("nan"), "scale": 1.0,
         "rel_error": float("nan"), "cos_min": float("nan"), "nonfinite": {"fp32": 0,
                                                                           "int8": 3}}]}
    text = tool.render_table("layers", layered)
    assert [row[0] for row in table_rows(text) if row[-1] == "<- worst"] == ["1"]
    assert "3 in the int8 one" in text


def test_a_run_is_itself_and_main_gives_the_previous_one_back():
    import eprun as tool

    before = list(tool._RUNS)
    with pytest.raises(SystemExit):
        tool.main([])
    assert len(tool._RUNS) == len(before)
    assert all(a is b for a, b in zip(tool._RUNS, before))


def test_report_writes_beside_the_fp32_model_by_default(run_eprun_here, lab_pair, tmp_path):
    """Without --out-dir the deliverables go to the fp32 model's own folder, not the working
    directory (the README's 'default: the fp32 model's folder')."""
    import shutil

    fp32, int8 = lab_pair
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    for path in (fp32, int8):
        shutil.copy(path, models_dir / path.name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_eprun_here("report", "../models/fp32.onnx", "../models/int8.onnx", cwd=elsewhere)
    assert result.code == 0, result.stderr
    assert result.answer["out_dir"] == "../models"
    assert (models_dir / "ep_report.md").is_file() and list(elsewhere.iterdir()) == []


def test_a_hint_built_from_what_was_typed_stays_on_one_line(eprun_fails, lab_pair):
    """The joined-list hint repeats the user's words: a carriage return among them (found by
    test_random_argv_never_tracebacks) must not split the one stderr line."""
    fp32, _ = lab_pair
    line = eprun_fails(2, "partition", fp32, "\r", fp32)
    assert "joined with commas" in line and "\r" not in line


def test_report_chart_svg_and_local_error(run_eprun_here, lab_pair, tmp_path):
    """``report --local --chart svg``: growth.json gains each segment's local error (as
    ``layers --local`` measures it), the Mermaid chart a second line, and growth.svg draws both
    from 0 with the tensor names; without the options nothing of it appears (the contract)."""
    import json
    import xml.etree.ElementTree as tree

    fp32, int8 = lab_pair
    plain, charted = tmp_path / "plain", tmp_path / "charted"
    result = run_eprun_here("report", fp32, int8, "--seed", "3", "--out-dir", plain)
    assert result.code == 0 and not (plain / "growth.svg").exists()
    assert not any(name.endswith(".svg") for name in result.answer["files"])
    assert "growth.svg" not in (plain / "ep_report.md").read_text(encoding="utf-8")
    result = run_eprun_here("report", fp32, int8, "--seed", "3", "--out-dir", charted, "--local",
                       "--chart", "svg")
    assert result.code == 0, result.stderr
    assert str(charted / "growth.svg") in result.answer["files"]
    growth = json.loads((charted / "growth.json").read_text())
    layers = run_eprun_here("layers", fp32, int8, "3", "--local").answer["layers"]
    assert growth["local_rel_error"] == [entry["local"]["rel_error"] for entry in layers]
    assert growth["rel_error"] == json.loads((plain / "growth.json").read_text())["rel_error"]
    text = (charted / "ep_report.md").read_text(encoding="utf-8")
    assert "![Relative error per boundary](growth.svg)" in text
    assert text.count("    line [") == 2 and "the second is the local one" in text

    svg = tree.parse(charted / "growth.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    lines = svg.findall(f"{ns}polyline")
    assert len(lines) == 2 and lines[1].get("stroke-dasharray")  # the local one dashed
    circles = svg.findall(f"{ns}circle")
    accumulated = circles[:len(layers)]
    # every point's tooltip names its tensor and value; heights follow the values from 0
    names = [entry["fp32"] for entry in layers]
    for circle, name, value in zip(accumulated, names, growth["rel_error"]):
        title = circle.find(f"{ns}title").text
        assert title.startswith(f"{name}: accumulated rel error ")
        assert float(title.split()[-1]) == pytest.approx(value, rel=1e-5)
    heights = [float(circle.get("cy")) for circle in accumulated]
    axis = max(float(line.get("y1")) for line in svg.findall(f"{ns}line")
               if line.get("stroke") == "#ddd")  # the 0 grid line
    top = min(float(line.get("y1")) for line in svg.findall(f"{ns}line")
              if line.get("stroke") == "#ddd")
    ceiling = max(float(t.text) for t in svg.findall(f"{ns}text") if t.get("text-anchor") == "end"
                  and t.text and t.text.replace(".", "", 1).isdigit())
    for height, value in zip(heights, growth["rel_error"]):
        assert height == pytest.approx(axis - (axis - top) * value / ceiling, abs=0.06)
    assert ceiling >= max(growth["rel_error"] + growth["local_rel_error"])
    labels = "".join(text for t in svg.findall(f"{ns}text") for text in t.itertext())
    assert all(name in labels for name in names)
    # a growth.svg eprun did not write is not replaced
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "growth.svg").write_text("mine")
    refused = run_eprun_here("report", fp32, int8, "--seed", "3", "--out-dir", foreign, "--chart",
                        "svg")
    assert refused.code == 4 and "refusing to replace" in refused.stderr
    assert (foreign / "growth.svg").read_text() == "mine"
    again = run_eprun_here("report", fp32, int8, "--seed", "3", "--out-dir", charted, "--chart", "svg")
    assert again.code == 0, again.stderr  # eprun's own growth.svg is replaced, now one line
    assert len(tree.parse(charted / "growth.svg").getroot().findall(f"{ns}polyline")) == 1


def test_eprun_format_is_a_persons_own_default(run_eprun_here, lab_pair):
    """JSON stays the default wherever stdout goes; EPRUN_FORMAT=table makes the table one's
    own default, --format overrides it, and a value eprun does not print is a usage error
    before anything is measured. Commands without a table ignore it."""
    import json

    fp32, int8 = lab_pair
    plain = run_eprun_here("growth", fp32, int8, "1")
    table = run_eprun_here("growth", fp32, int8, "1", env={"EPRUN_FORMAT": "table"})
    layers = json.loads(plain.stdout)["layer_count"]
    assert table.code == 0 and table.stdout.startswith(f"growth: seed 1, {layers} boundaries\n")
    assert table.stdout == run_eprun_here("growth", fp32, int8, "1", "--format", "table").stdout
    forced = run_eprun_here("growth", fp32, int8, "1", "--format", "json",
                       env={"EPRUN_FORMAT": "table"})
    assert json.loads(forced.stdout) == json.loads(plain.stdout)
    wrong = run_eprun_here("growth", fp32, int8, "1", env={"EPRUN_FORMAT": "yaml"})
    assert wrong.code == 0 and json.loads(wrong.stdout) == json.loads(plain.stdout)
    assert ("eprun: warning: EPRUN_FORMAT='yaml' is not a format eprun prints (json or table); "
            "printing JSON") in wrong.stderr.splitlines()
    partition = run_eprun_here("partition", fp32, "MatMul", env={"EPRUN_FORMAT": "yaml"})
    assert partition.code == 0 and json.loads(partition.stdout)["model"] == str(fp32)


def test_placement_and_inputs_read_without_python(run_eprun_here, lab_pair):
    """The README reads answers with --format table, never python -c: placement's table has
    the providers asked for and got and the nodes per provider of the JSON answer; layers'
    names what each input was fed."""
    import json

    fp32, int8 = lab_pair
    asked = "CUDAExecutionProvider,CPUExecutionProvider"
    answer = json.loads(run_eprun_here("placement", int8, asked).stdout)
    table = run_eprun_here("placement", int8, asked, "--format", "table")
    assert table.code == 0
    lines = table.stdout.splitlines()
    assert lines[0] == (f"placement: {int8}, asked {asked}, got "
                        f"{','.join(answer['actual'])} (fell back: CUDAExecutionProvider ran "
                        f"no node); from {answer['source']}")
    rows = {line.split()[0]: int(line.split()[1]) for line in lines[3:] if line.strip()}
    assert rows == answer["counts"]
    argv = ("layers", fp32, int8, "1", "--input-range", "x:-1,1", "--rows", "8")
    (fed,) = json.loads(run_eprun_here(*argv).stdout)["inputs"]
    layers = run_eprun_here(*argv, "--format", "table")
    assert fed["shape"][0] == 8 and fed["source"] == "uniform[-1, 1)"
    assert layers.stdout.splitlines()[1] == f"input x: float32 {fed['shape']} from {fed['source']}"
