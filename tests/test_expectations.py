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

import numpy as np
import onnx
import onnxruntime as ort
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


def test_swapped_ok_compares_the_pair_as_given(eprun, lab_pair):
    fp32, int8 = lab_pair
    as_given = eprun("layers", int8, fp32, "1", "--swapped-ok")
    # the same numbers as the right order, with the roles exchanged: max |a - b| is symmetric
    right = eprun("layers", fp32, int8, "1")
    assert [entry["max_abs_error"] for entry in as_given["layers"]] == pytest.approx(
        [entry["max_abs_error"] for entry in right["layers"]], rel=1e-12)
    checked = run_eprun("check", int8, fp32, "--swapped-ok", "--profile", "int8")
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
    x = np.random.default_rng(seed).standard_normal((64, 4)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_nonfinite_values_are_counted_and_named(tmp_path):
    finite, broken = tmp_path / "abs_log.onnx", tmp_path / "log.onnx"
    log_model(finite, absolute=True)
    log_model(broken, absolute=False)
    want = int(np.count_nonzero(~np.isfinite(direct_output(broken, 1))))
    assert want > 0
    assert np.all(np.isfinite(direct_output(finite, 1)))

    result = run_eprun("layers", finite, broken, "1")
    assert result.code == 0
    last = result.answer["layers"][-1]
    assert last["nonfinite"] == {"fp32": 0, "int8": want}
    assert last["max_abs_error"] is None  # strict JSON: null, and now not silently
    assert f"the int8 tensor 'y' holds {want} NaN or infinite values" in result.stderr
    assert all("nonfinite" not in entry for entry in result.answer["layers"][:-1])

    checked = run_eprun("check", finite, broken, "--min-cos", "-1")  # check's seed: 0
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


def test_the_seed_is_taken_in_both_forms(eprun, eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    assert eprun("layers", fp32, int8, "--seed", "5") == eprun("layers", fp32, int8, "5")
    assert eprun("settings", int8, "--seed=7") == eprun("settings", int8, "7")
    positional = run_eprun("check", fp32, int8, "3", "--profile", "int8")
    optional = run_eprun("check", fp32, int8, "--seed", "3", "--profile", "int8")
    assert positional.answer == optional.answer and positional.answer["seed"] == 3
    assert run_eprun("check", fp32, int8, "--profile", "int8").answer["seed"] == 0
    assert "required: seed" in eprun_fails(2, "growth", fp32, int8)
    assert "given twice, as 2 and 1" in eprun_fails(2, "layers", fp32, int8, "1", "--seed", "2")
    assert eprun("layers", fp32, int8, "4", "--seed", "4")["seed"] == 4  # the same twice: fine


def test_bare_eprun_shows_the_help():
    result = run_eprun()
    assert result.code == 2 and result.stdout == ""
    assert "usage: eprun.py" in result.stderr and "layers" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("eprun: error: no command given")


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


def test_placement_says_when_the_session_fell_back(lab_pair):
    _, int8 = lab_pair
    result = run_eprun("placement", int8, "CUDAExecutionProvider,CPUExecutionProvider")
    assert result.code == 0 and result.answer["actual"] == ["CPUExecutionProvider"]
    assert ("eprun: note: the session did not get CUDAExecutionProvider: its nodes ran on what "
            "onnxruntime fell back to, CPUExecutionProvider") in result.stderr
    assert "did not get" not in run_eprun("placement", int8, "CPUExecutionProvider").stderr
