"""Layer 10, ``check``: the gate passes, fails and says which bounds failed and where, by profile
and per output, requires the providers asked for, and retries transient errors only."""
from __future__ import annotations

import sys

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, RUN_ARGV0, run_eprun
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
    "import sys, onnxruntime\n"
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
    + RUN_ARGV0)


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


# -- a gate over real data: every iteration, statistics, top-k, the provider share ---------------

@pytest.fixture(scope="module")
def five_iterations(tmp_path_factory):
    """The lab-shaped chain, its QDQ twin and ``polygraphy run --iterations 5 --save-inputs``'s
    file of it (five feed dicts, one row each): (fp32, int8, inputs.json, [feed dict, ...])."""
    from test_polygraphy import polygraphy_feeds, run_polygraphy

    folder = tmp_path_factory.mktemp("five")
    fp32 = models.save(models.chain(seed=8), folder / "f.onnx")
    int8 = models.quantize(fp32, folder / "q.onnx", seed=4)
    done = run_polygraphy("run", fp32, "--onnxrt", "--iterations", "5", "--input-shapes",
                          "x:[3,8]", "--save-inputs", folder / "in5.json")
    assert done.returncode == 0, done.stdout + done.stderr
    feeds = polygraphy_feeds(folder / "in5.json")
    assert len(feeds) == 5
    return fp32, int8, folder / "in5.json", feeds


def oracle_iteration(fp32, int8, feed: dict, rtol: float, atol: float) -> dict:
    """One iteration's figures of output y, from sessions opened here and numpy."""
    (r,) = models.run(fp32, feed)
    (c,) = models.run(int8, feed)
    r, c = r.astype(np.float64), c.astype(np.float64)
    diff = np.abs(c - r)
    return {"max_abs_diff": float(diff.max()),
            "violations": int(np.count_nonzero(~np.isclose(c, r, rtol=rtol, atol=atol))),
            "cosine": float(c.ravel() @ r.ravel() / (np.linalg.norm(c) * np.linalg.norm(r))),
            "elements": int(r.size), "r": r, "c": c}


def test_every_iteration_of_a_polygraphy_inputs_file_is_gated(run_eprun_here, five_iterations,
                                                                tmp_path):
    """check --inputs in5.json measured the first iteration only; it runs all five, the figures
    the worst over them, and says which was worst; --iteration N keeps one."""
    fp32, int8, inputs, feeds = five_iterations
    result = run_eprun_here("check", fp32, int8, "--inputs", inputs, "--profile", "fp16")
    expected = [oracle_iteration(fp32, int8, feed, 0.01, 0.001) for feed in feeds]
    answer = result.answer
    assert answer["iterations"] == 5
    (entry,) = answer["outputs"]
    assert entry["iterations"] == 5
    assert entry["max_abs_diff"] == pytest.approx(max(e["max_abs_diff"] for e in expected),
                                                  rel=1e-6)
    assert entry["violations"] == sum(e["violations"] for e in expected)
    assert entry["elements"] == sum(e["elements"] for e in expected)
    assert entry["cosine"] == pytest.approx(min(e["cosine"] for e in expected), rel=1e-9)
    worst = max(range(5), key=lambda k: (expected[k]["violations"],
                                         expected[k]["max_abs_diff"], -k))
    assert entry["worst_iteration"] == worst
    failed = entry["violations"] > 0 or entry["cosine"] < 0.999
    assert answer["passed"] is not failed and result.code == (1 if failed else 0)
    assert max(e["max_abs_diff"] for e in expected) > expected[0]["max_abs_diff"], \
        "the first iteration should not be the worst here, or the test proves little"
    for k in (0, worst):
        one = run_eprun_here("check", fp32, int8, "--inputs", inputs, "--profile", "fp16",
                             "--iteration", str(k)).answer
        assert "iterations" not in one and "iterations" not in one["outputs"][0]
        assert one["outputs"][0]["max_abs_diff"] == pytest.approx(
            expected[k]["max_abs_diff"], rel=1e-6)
        assert one["outputs"][0]["violations"] == expected[k]["violations"]


def test_saved_outputs_of_several_iterations_are_polygraphys_and_load_back(
        run_eprun_here, five_iterations, tmp_path):
    """--save-outputs FILE.json writes one Polygraphy iteration per input iteration (read here
    by Polygraphy's own loader), a golden FILE.npz every iteration too, and --load-outputs
    reads them all: the same verdict."""
    from test_polygraphy import polygraphy_feeds, polygraphy_outputs

    fp32, int8, inputs, feeds = five_iterations
    saved = tmp_path / "golden.json"
    ran = run_eprun_here("check", fp32, int8, "--inputs", inputs, "--save-outputs", saved)
    for k, feed in enumerate(feeds):
        np.testing.assert_array_equal(polygraphy_outputs(saved, k)["y"],
                                      models.run(fp32, feed)[0])
    assert len(polygraphy_feeds(tmp_path / "golden.inputs.json")) == 5
    loaded = run_eprun_here("check", fp32, int8, "--inputs", inputs, "--load-outputs", saved)
    assert loaded.code == ran.code
    assert loaded.answer["outputs"] == ran.answer["outputs"]
    assert loaded.answer["golden"]["iterations"] == 5
    # a golden .npz of several iterations: the first as a file of one is, the rest beside it
    golden = tmp_path / "golden.npz"
    run_eprun_here("check", fp32, int8, "--inputs", inputs, "--save-outputs", golden)
    with np.load(golden, allow_pickle=False) as archive:
        for k, feed in enumerate(feeds):
            suffix = f"@{k}" if k else ""
            np.testing.assert_array_equal(archive[f"y{suffix}"], models.run(fp32, feed)[0])
            np.testing.assert_array_equal(archive[f"x{suffix}"], feed["x"])
    from_npz = run_eprun_here("check", fp32, int8, "--load-outputs", golden)
    assert from_npz.code == ran.code
    assert from_npz.answer["outputs"] == ran.answer["outputs"]
    assert from_npz.answer["iterations"] == 5 and from_npz.answer["golden"]["iterations"] == 5


def test_layers_says_which_iteration_it_measures(run_eprun_here, five_iterations):
    fp32, int8, inputs, feeds = five_iterations
    first = run_eprun_here("layers", fp32, int8, "1", "--inputs", inputs)
    assert first.code == 0, first.stderr
    assert f"'{inputs}' holds 5 iterations (feed dicts); this measures iteration 0" in \
        first.stderr
    chosen = run_eprun_here("layers", fp32, int8, "1", "--inputs", inputs, "--iteration", "3")
    assert "holds 5 iterations" not in chosen.stderr
    (r,) = models.run(fp32, feeds[3])
    (c,) = models.run(int8, feeds[3])
    assert chosen.answer["layers"][-1]["max_abs_error"] == pytest.approx(
        float(np.abs(c.astype(np.float64) - r).max()), rel=1e-6)


def polygraphy_statistic(r, c, stat: str, quantile: float = 0.99) -> tuple[float, float]:
    """Polygraphy's --check-error-stat numbers, written out again: |c - r| and |c - r| / |r|
    (a zero r divided as 2.22e-16)."""
    r, c = r.astype(np.float64), c.astype(np.float64)
    diff = np.abs(c - r)
    relative = diff / np.abs(np.where(r == 0, 2.220446049250313e-16, r))
    pick = {"max": np.max, "mean": np.mean, "median": np.median,
            "quantile": lambda values: np.quantile(values, quantile)}[stat]
    return float(pick(diff)), float(pick(relative))


@pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile"])
def test_an_error_statistic_passes_unless_both_are_over(run_eprun_here, lab_pair, stat):
    """Polygraphy's rule: with a statistic, an output fails only when the absolute one is over
    atol and the relative one over rtol; just above and just below each tolerance."""
    fp32, int8 = lab_pair
    x = models.contract_input(0, 8)
    r, c = models.run(fp32, x)[0], models.run(int8, x)[0]
    quantile = 0.9
    absolute, relative = polygraphy_statistic(r, c, stat, quantile)
    assert absolute > 0 and relative > 0
    chosen = ["--check-error-stat", stat, *(["--error-quantile", "0.9"] if stat == "quantile"
                                            else [])]

    def gate(atol: float, rtol: float):
        return run_eprun_here("check", fp32, int8, *chosen, "--atol", repr(atol), "--rtol",
                              repr(rtol))

    over, under = 1 - 1e-6, 1 + 1e-6
    both_over = gate(absolute * over, relative * over)
    assert both_over.code == 1, both_over.stderr
    (failure,) = [f for f in both_over.answer["failures"] if f["bound"] == "error_stat"]
    assert failure["abs"] == pytest.approx(absolute, rel=1e-9)
    assert failure["rel"] == pytest.approx(relative, rel=1e-9)
    values = both_over.answer["outputs"][0]["error_stat"]
    assert values["stat"] == stat and values["abs"] == pytest.approx(absolute, rel=1e-9)
    for atol, rtol in ((absolute * under, relative * over), (absolute * over, relative * under)):
        one_under = gate(atol, rtol)
        assert one_under.code == 0, one_under.stderr
        assert one_under.answer["passed"] is True
    named = run_eprun_here("check", fp32, int8, "--check-error-stat", f"y:{stat}",
                           *chosen[2:], "--atol", repr(absolute * over), "--rtol",
                           repr(relative * over))
    assert named.code == 1 and named.answer["outputs"][0]["error_stat"]["stat"] == stat


def nan_pair(folder):
    """A reference that takes the square root of |x| and a candidate that takes it of x: NaN
    wherever x is negative."""
    def model(ops):
        nodes = [helper.make_node(op, [a], [b]) for op, a, b in ops]
        return helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return (models.save(model([("Abs", "x", "a"), ("Sqrt", "a", "y")]), folder / "r.onnx"),
            models.save(model([("Sqrt", "x", "y")]), folder / "c.onnx"))


@pytest.mark.parametrize("stat", ["elemwise", "mean", "median"])
def test_nan_in_the_candidate_fails_however_loose_the_tolerances(run_eprun_here, tmp_path,
                                                                  stat):
    reference, candidate = nan_pair(tmp_path)
    x = models.contract_input(0, 8)
    lost = int(np.count_nonzero(~np.isfinite(models.run(candidate, x)[0])))
    assert lost > 0
    result = run_eprun_here("check", reference, candidate, "--check-error-stat", stat,
                            "--atol", "1e30", "--rtol", "1e30")
    assert result.code == 1, result.stderr
    assert result.answer["outputs"][0]["nonfinite"] == {"reference": 0, "candidate": lost}
    assert "NaN or infinite" in result.stderr.splitlines()[-1] or stat == "elemwise"


def test_a_statistic_replaces_the_profiles_cosine_and_min_cos_still_applies(run_eprun_here,
                                                                             tmp_path):
    """Under --check-error-stat the profile's cosine is no bound (Polygraphy has none), and the
    table's rule says so; an explicit --min-cos still fails the output."""
    reference, candidate = classifier(tmp_path, 5, 3.0)
    x = models.contract_input(0, 16)
    r, c = (models.run(path, x)[0].astype(np.float64).ravel() for path in (reference, candidate))
    cosine = float(r @ c / (np.linalg.norm(r) * np.linalg.norm(c)))
    assert cosine < 0.99  # the int8 profile's cosine (docs/commands.md)
    loose = ["--profile", "int8", "--check-error-stat", "mean", "--atol", "1e3"]
    judged = run_eprun_here("check", reference, candidate, *loose)
    assert judged.code == 0 and judged.answer["outputs"][0]["cosine"] == pytest.approx(cosine)
    table = run_eprun_here("check", reference, candidate, *loose, "--format", "table")
    assert "and the cosine only under --min-cos" in table.stdout.splitlines()[0]
    bounded = run_eprun_here("check", reference, candidate, *loose, "--min-cos", "0.99")
    assert bounded.code == 1
    (failure,) = bounded.answer["failures"]
    assert failure["bound"] == "min_cos" and failure["cosine"] == pytest.approx(cosine)


def classifier(folder, seed: int, noise: float):
    """x [N, 16] -> MatMul -> logits [N, 10]; the candidate's weights moved by ``noise``."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((16, 10)).astype(np.float32)

    def model(w):
        return helper.make_model(helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
            [numpy_helper.from_array(w, "w")]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    moved = (weight + noise * rng.standard_normal(weight.shape)).astype(np.float32)
    return (models.save(model(weight), folder / "ref.onnx"),
            models.save(model(moved), folder / "cand.onnx"))


@pytest.mark.parametrize("k", [1, 3])
def test_top_k_agreement_is_the_share_of_rows_whose_top_k_sets_agree(run_eprun_here, tmp_path,
                                                                      k):
    reference, candidate = classifier(tmp_path, 5, 0.3)
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    r, c = models.run(reference, x)[0], models.run(candidate, x)[0]
    agree = float(np.mean([set(np.argsort(-a)[:k]) == set(np.argsort(-b)[:k])
                           for a, b in zip(r, c)]))
    assert 0 < agree < 1, "the candidate should change some answers and keep others"
    result = run_eprun_here("check", reference, candidate, "--top-k", str(k), "--profile",
                            "int8", "--atol", "100", "--min-cos", "0")
    assert result.code == 0, result.stderr
    assert result.answer["outputs"][0]["top_k_agreement"] == pytest.approx(agree, abs=1e-12)
    gated = run_eprun_here("check", reference, candidate, "--top-k", str(k), "--atol", "100",
                           "--min-cos", "0", "--min-top-k-agreement", repr(agree + 1e-9))
    assert gated.code == 1
    assert [f["bound"] for f in gated.answer["failures"]] == ["top_k"]
    assert f"top-{k} agreement" in gated.stderr.splitlines()[-1]
    passed = run_eprun_here("check", reference, candidate, "--top-k", str(k), "--atol", "100",
                            "--min-cos", "0", "--min-top-k-agreement", repr(agree))
    assert passed.code == 0
    for axis in ("2", "-3"):  # no such axis of a [64, 10] output: the flags are wrong
        wrong = run_eprun_here("check", reference, candidate, "--top-k", str(k),
                               "--top-k-axis", axis, "--atol", "100", "--min-cos", "0")
        assert wrong.code == 2 and "no output has" in wrong.stderr
    along = run_eprun_here("check", reference, candidate, "--top-k", str(k), "--top-k-axis", "0",
                           "--atol", "100", "--min-cos", "0")
    columns = float(np.mean([set(np.argsort(-a)[:k]) == set(np.argsort(-b)[:k])
                       for a, b in zip(r.T, c.T)]))
    assert along.answer["outputs"][0]["top_k_agreement"] == pytest.approx(columns, abs=1e-12)


def test_the_share_of_the_graph_on_an_ep_gates_or_says_it_cannot_be_known(run_eprun_here,
                                                                          lab_pair):
    """--min-provider-share EP:FRACTION counts node assignment; where onnxruntime cannot say
    (before 1.24) the gate fails rather than guesses."""
    _, int8 = lab_pair
    whole = run_eprun_here("check", int8, int8, "--min-provider-share",
                           "CPUExecutionProvider:1")
    none = run_eprun_here("check", int8, int8, "--providers",
                          "AzureExecutionProvider,CPUExecutionProvider", "--allow-fallback",
                          "--min-provider-share", "AzureExecutionProvider:0.5")
    assert none.code == 1, none.stderr
    unasked = run_eprun_here("check", int8, int8, "--min-provider-share",
                             "CUDAExecutionProvider:0.5")
    assert unasked.code == 2 and "the candidate does not ask for it" in unasked.stderr
    if not hasattr(ort.InferenceSession, "get_provider_graph_assignment_info"):
        assert whole.code == 1 and "cannot be known" in whole.stderr
        return
    options = ort.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    session = ort.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])
    kinds: dict = {}
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            kinds[node.op_type] = kinds.get(node.op_type, 0) + 1
    assert whole.code == 0, whole.stderr
    assert whole.answer["provider_share"]["CPUExecutionProvider"]["share"] == 1.0
    (failure,) = none.answer["failures"]
    assert failure["bound"] == "provider_share" and failure["share"] == 0.0
    assert failure["total"] == sum(kinds.values()) and failure["elsewhere"] == kinds
    assert "AzureExecutionProvider took 0 of" in none.stderr.splitlines()[-1]


def test_the_table_shows_iterations_statistic_and_top_k(run_eprun_here, five_iterations):
    fp32, int8, inputs, _ = five_iterations
    result = run_eprun_here("check", fp32, int8, "--inputs", inputs, "--check-error-stat", "mean",
                            "--top-k", "2", "--format", "table")
    lines = result.stdout.splitlines()
    assert lines[0].endswith(", 5 iterations")
    assert lines[1].split()[-8:] == ["worst", "iteration", "statistic", "stat", "abs", "stat",
                                     "rel", "top-k"] or "top-k agreement" in lines[1]
    assert "worst iteration" in lines[1] and "statistic" in lines[1]
    assert " mean " in lines[3]


@pytest.mark.parametrize(("argv", "said"), [
    (["--error-quantile", "0.5"], "--error-quantile is the quantile of --check-error-stat"),
    (["--check-error-stat", "mean", "--error-quantile", "0.5"], "no output is judged by"),
    (["--top-k-axis", "0"], "--top-k-axis is the axis --top-k ranks along"),
    (["--check-error-stat", "nope:max"], "which is no output of"),
    (["--check-error-stat", "worst"], "the statistic is one of"),
    (["--error-quantile", "2"], "is not a number from 0 to 1"),
    (["--min-provider-share", "CPUExecutionProvider"], "is not EP:FRACTION"),
])
def test_the_gates_flags_refuse_what_says_nothing(run_eprun_here, lab_pair, argv, said):
    fp32, int8 = lab_pair
    result = run_eprun_here("check", fp32, int8, *argv)
    assert result.code == 2, result.stderr
    assert said in result.stderr.splitlines()[-1]
