"""Layer 7, ``check``: the gate passes, fails and says which bounds failed and where, by profile
and per output, requires the providers asked for, and retries transient errors only."""
from __future__ import annotations

import sys

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, run_eprun
from onnx import TensorProto, helper, numpy_helper
from test_rendering import table_rows
from test_sessions import AVAILABLE

# -- check -------------------------------------------------------------------------------------

def test_check_passes_identical_models(run_eprun_here, lab_pair):
    fp32, _ = lab_pair
    result = run_eprun_here("check", fp32, fp32)
    assert result.code == 0, result.stderr
    answer = result.answer
    assert answer["passed"] is True and answer["failures"] == []
    assert answer["tolerance"] == {"rtol": 1e-2, "atol": 1e-3, "min_cos": 0.999}
    assert answer["outputs"][0]["violations"] == 0 and answer["outputs"][0]["cosine"] == 1.0
    assert answer["profile"] == "fp16" and result.stderr == ""  # no twin: fp16, unsaid


def test_check_without_a_profile_holds_a_quantized_twin_to_int8(run_eprun_here, lab_pair):
    """No --profile is auto: the int8 tolerances for the int8 twin, said on stderr, and the
    verdict numpy gives with them; --profile fp16 keeps the float16 tolerances."""
    fp32, int8 = lab_pair
    result = run_eprun_here("check", fp32, int8)
    answer = result.answer
    assert answer["profile"] == "int8"
    assert answer["tolerance"] == {"rtol": 0.1, "atol": 0.05, "min_cos": 0.99}
    assert f"profile int8 (no --profile given: auto), as {str(int8)!r} quantizes" in \
        result.stderr
    x = models.contract_input(0, 8)
    ref, cand = (models.run(path, x)[0].astype(np.float64) for path in (fp32, int8))
    violations = int((np.abs(cand - ref) > 0.05 + 0.1 * np.abs(ref)).sum())
    assert answer["outputs"][0]["violations"] == violations
    assert result.code == (1 if violations else 0)
    strict = run_eprun_here("check", fp32, int8, "--profile", "fp16")
    assert strict.answer["profile"] == "fp16" and strict.code == 1


@pytest.mark.parametrize("options, tolerance", [
    (["--seed", "5", "--profile", "fp16", "--rtol", "0", "--atol", "1e-3"],
     {"rtol": 0.0, "atol": 1e-3, "min_cos": 0.999}),
    (["--profile", "int8", "--atol", "0", "--rtol", "0"], {"rtol": 0.0, "atol": 0.0, "min_cos": 0.99}),
    (["--profile", "int8", "--rtol", "10", "--atol", "10", "--min-cos", "0.9999999"],
     {"rtol": 10.0, "atol": 10.0, "min_cos": 0.9999999}),
])
def test_a_failed_check_says_which_bounds_failed_and_where(
        run_eprun_here, lab_pair, options, tolerance):
    """Recomputed from sessions opened here with check's own (default) options: the violations
    and the worst element (the largest excess over the bound), the cosine and by how much it
    misses min_cos, each bound failed exactly when the numbers say so, and the one stderr line
    that says why."""
    fp32, int8 = lab_pair
    result = run_eprun_here("check", fp32, int8, *options)
    assert result.code == 1 and result.stdout
    answer = result.answer
    assert answer["tolerance"] == tolerance
    x = models.contract_input(int(options[1]) if options[0] == "--seed" else 0, 8)
    ref, cand = (models.run(path, x)[0].astype(np.float64) for path in (fp32, int8))
    diff = np.abs(cand - ref)
    allowed = tolerance["atol"] + tolerance["rtol"] * np.abs(ref)
    violations = int((diff > allowed).sum())
    cosine = float(cand.ravel() @ ref.ravel() / (np.linalg.norm(cand) * np.linalg.norm(ref)))
    assert answer["outputs"][0]["violations"] == violations
    assert answer["outputs"][0]["cosine"] == pytest.approx(cosine)
    bounds = [failure["bound"] for failure in answer["failures"]]
    assert bounds == ["tolerance"] * (violations > 0) + ["min_cos"] * (cosine < tolerance["min_cos"])
    why = []
    for failure in answer["failures"]:
        if failure["bound"] == "tolerance":
            worst = [int(i) for i in np.unravel_index(int(np.argmax(diff - allowed)), diff.shape)]
            assert failure["violations"] == violations and failure["worst"]["index"] == worst
            assert failure["worst"]["abs_diff"] == pytest.approx(float(diff[tuple(worst)]))
            why.append(f"y: {violations} of {ref.size} elements outside atol + rtol*|ref|, "
                       f"worst at {worst}")
        else:
            assert failure["by"] == pytest.approx(tolerance["min_cos"] - cosine)
            why.append(f"y: cosine {failure['cosine']:.6g} below {tolerance['min_cos']:g}")
    assert answer["retries_used"] == 0  # numeric failures are never retried
    assert result.stderr.splitlines() == ["eprun: check failed: " + "; ".join(why)]


def test_check_require_providers_asks_for_exactly_the_list(run_eprun_here, lab_pair):
    """--allow-fallback passes a fallback; --require-providers fails even CPU appended. The
    CPU build's other provider (Azure) is listed by the session but takes no node: that is a
    fallback too, whatever get_providers() says."""
    fp32, _ = lab_pair
    accelerator = next(p for p in ort.get_available_providers() if p != "CPUExecutionProvider")
    args = ["check", fp32, fp32, "--providers", accelerator]
    relaxed = run_eprun_here(*args, "--allow-fallback")
    assert relaxed.code == 0 and relaxed.answer["providers"]["fell_back"] is True
    nodes = relaxed.answer["providers"]["nodes_per_provider"]
    if nodes is not None:  # onnxruntime 1.24+ says which provider took the nodes
        assert not nodes.get(accelerator) and sum(nodes.values()) > 0
        idle = run_eprun_here(*args)
        assert idle.code == 1 and idle.answer["failures"][0]["missing"] == [accelerator]
    strict = run_eprun_here(*args, "--require-providers", "--allow-fallback")
    assert strict.code == 1
    assert strict.answer["failures"] == [{"bound": "providers", "requested": [accelerator],
                                          "actual": [accelerator, "CPUExecutionProvider"],
                                          "missing": [accelerator] if nodes is not None
                                          else []}]


FLAKY = (
    "import runpy, sys, onnxruntime\n"
    "original = onnxruntime.InferenceSession.run\n"
    "calls = {'n': 0}\n"
    "def flaky(self, *args, **kwargs):\n"
    "    path = str(self._model_path)\n"
    "    if path.startswith('/proc/self/fd/'):  # eprun hands over the file it opened\n"
    "        path = __import__('os').readlink(path)\n"
    "    if 'q.onnx' in path:\n"
    "        calls['n'] += 1\n"
    "        if calls['n'] <= FAILS:\n"
    "            raise RuntimeError(MESSAGE)\n"
    "    return original(self, *args, **kwargs)\n"
    "onnxruntime.InferenceSession.run = flaky\n"
    "sys.argv = [EPRUN] + sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.parametrize("fails, message, code, retries_used", [
    (2, "EP_FAIL: Timeout while compiling the graph", 0, 2),
    (9, "device timed out", 4, None),
    (1, "Invalid argument: bad shape", 4, None),
])
def test_check_retries_transient_errors_only(lab_pair, tmp_path, fails, message, code,
                                             retries_used):
    fp32, _ = lab_pair
    candidate = tmp_path / "q.onnx"
    candidate.write_bytes(fp32.read_bytes())
    script = (FLAKY.replace("FAILS", str(fails)).replace("MESSAGE", repr(message))
              .replace("EPRUN", repr(str(EPRUN))))
    result = run_eprun("check", fp32, candidate, "--retry-pause", "0", "--retries", "2",
                       prefix=[sys.executable, "-c", script])
    assert result.code == code, result.stderr
    if code == 0:
        # the warm-up fails twice, succeeds on the second retry, then the measured run passes
        assert result.answer["retries_used"] == retries_used
    else:
        assert result.stdout == "" and message.split(":")[0] in result.stderr


# -- the gate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("warmup", [0, 2])
def test_check_runs_the_candidate_warmup_times_before_the_run_it_measures(lab_pair, monkeypatch,
                                                                         warmup):
    """--warmup N: N runs of the candidate's session before the one compared, and the
    reference once."""
    import eprun as tool

    fp32, int8 = map(str, lab_pair)
    runs, real = [], tool.run_session
    monkeypatch.setattr(tool, "run_session",
                        lambda session, *args, **kwargs: runs.append(kwargs.get("what"))
                        or real(session, *args, **kwargs))
    answer = tool.check(fp32, int8, tool.CheckOptions(warmup=warmup))
    assert answer["warmup"] == warmup
    assert runs.count(repr(int8)) == warmup + 1 and runs.count(repr(fp32)) == 1


def test_check_fails_a_fallback_by_default(run_eprun_here, lab_pair):
    fp32, _ = lab_pair
    wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    result = run_eprun_here("check", fp32, fp32, "--providers", ",".join(wanted))
    got = [name for name in wanted if name in AVAILABLE]
    if "CUDAExecutionProvider" in AVAILABLE:  # a GPU build: a real match passes
        assert result.code == 0, result.stderr
        return
    assert result.code == 1
    answer = result.answer
    assert answer["passed"] is False and answer["providers"]["actual"] == got
    assert answer["failures"] == [{"bound": "providers", "requested": wanted, "actual": got,
                                   "missing": ["CUDAExecutionProvider"]}]
    assert result.stderr.splitlines()[-1] == (
        "eprun: check failed: providers: asked for CUDAExecutionProvider,CPUExecutionProvider, "
        "got CPUExecutionProvider")
    allowed = run_eprun_here("check", fp32, fp32, "--providers", ",".join(wanted), "--allow-fallback")
    assert allowed.code == 0 and allowed.answer["passed"] is True
    assert allowed.answer["providers"]["fell_back"] is True  # still reported


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
