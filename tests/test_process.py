"""The gate cannot be fooled, and nothing is ever destroyed: hostile inputs, outputs, streams
and signals, each with its exit code, one stderr line, an empty stdout on failure, and inputs
left byte for byte."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import models
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, run_eprun
from onnx import TensorProto, helper

import eprun as tool

AVAILABLE = ort.get_available_providers()


def digest(*paths) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def one_error_line(result, code: int) -> str:
    assert result.code == code, (result.code, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eprun: error: "), result.stderr
    return lines[0]


# -- the gate ----------------------------------------------------------------------------------

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


def test_onnxruntime_adding_the_cpu_provider_is_not_a_fallback(run_eprun_here, lab_pair):
    """[X] that got [X, CPU] holds what it asked for, as long as X took nodes. The CPU build's
    other provider (Azure) is listed by every session it is asked for and takes none: where
    onnxruntime says so (1.24+), that is the fallback, not the CPU it appended."""
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"]) == []
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"],
                            {"X": 3, "CPUExecutionProvider": 1}) == []
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"],
                            {"CPUExecutionProvider": 4}) == ["X"]
    fp32, _ = lab_pair
    accelerator = next(name for name in AVAILABLE if name != "CPUExecutionProvider")
    result = run_eprun_here("check", fp32, fp32, "--providers", accelerator)
    answer = result.answer
    assert answer["providers"]["actual"] == [accelerator, "CPUExecutionProvider"]
    nodes = answer["providers"]["nodes_per_provider"]
    idle = nodes is not None and not nodes.get(accelerator)
    assert result.code == (1 if idle else 0) and answer["profile"] == "fp16"
    assert [failure["bound"] for failure in answer["failures"]] == (["providers"] if idle
                                                                    else [])


@pytest.mark.parametrize("requests", [
    ["CPUExecutionProvider"], ["<accelerator>"],
    ["CPUExecutionProvider", "FooExecutionProvider"],
    ["<accelerator>", "NoSuchExecutionProvider"],
])
def test_fail_on_fallback_uses_the_gates_rule(run_eprun_here, lab_pair, requests):
    """providers keeps the contract's fell_back (an accelerator with the CPU appended fell
    back), while --fail-on-fallback fails only a case that did not get what it asked for: a
    provider missing, or listed with no node (Azure, where onnxruntime says)."""
    fp32, _ = lab_pair
    accelerator = next(name for name in AVAILABLE if name != "CPUExecutionProvider")
    requests = [accelerator if name == "<accelerator>" else name for name in requests]
    result = run_eprun_here("providers", fp32, *requests, "--fail-on-fallback")
    fell_back = [case["fell_back"] for case in result.answer["cases"]]
    assert fell_back == [name != "CPUExecutionProvider" for name in requests]
    reasons = []
    for index, case in enumerate(result.answer["cases"]):
        nodes = case["nodes_per_provider"]
        if case["requested"][0] not in case["actual"]:
            reasons.append(f"case {index} asked for {case['requested'][0]} and got "
                           "CPUExecutionProvider")
        elif nodes is not None and case["requested"] != ["CPUExecutionProvider"] \
                and not nodes.get(case["requested"][0]):
            reasons.append(f"case {index} asked for {case['requested'][0]} and "
                           f"{case['requested'][0]} took 0 of {sum(nodes.values())} nodes")
    assert result.code == (1 if reasons else 0), result.stderr
    if reasons:
        assert result.stderr.splitlines()[-1] == "eprun: fallback: " + "; ".join(reasons)


@pytest.mark.parametrize("name, hint", [
    ("CUDAExecutionprovider", "did you mean CUDAExecutionProvider?"),
    ("CUDA", "did you mean CUDAExecutionProvider?"),
    ("tensorrt", "did you mean TensorrtExecutionProvider?"),
    ("a;b", "onnxruntime knows "),
])
def test_unknown_provider_names_are_caught(run_eprun_here, lab_pair, name, hint):
    fp32, _ = lab_pair
    for argv in (["check", fp32, fp32, "--providers", f"{name},CPUExecutionProvider"],
                 ["check", fp32, fp32, "--reference-providers", name],
                 ["placement", fp32, name]):
        line = one_error_line(run_eprun_here(*argv), 2)
        assert f"{name!r} is not a provider onnxruntime knows; {hint}" in line
    reported = run_eprun_here("providers", fp32, name)  # the contract's command reports it
    assert reported.code == 0 and reported.answer["cases"][0]["missing"] == [name]
    assert f"eprun: note: {name!r} is not a provider onnxruntime knows; {hint}" in \
        reported.stderr


@pytest.mark.parametrize("argv, message", [
    (["--min-cos", "2"], "'2' is not a cosine"),
    (["--min-cos", "-1.5"], "'-1.5' is not a cosine"),
    (["--min-cos", "nan"], "'nan' is not a cosine"),
    (["--rtol", "-1"], "'-1' is not a non-negative number"),
    (["--atol", "inf"], "'inf' is not a non-negative number"),
])
def test_tolerances_are_range_checked(run_eprun_here, lab_pair, argv, message):
    fp32, _ = lab_pair
    assert message in one_error_line(run_eprun_here("check", fp32, fp32, *argv), 2)


def test_retries_never_match_the_users_own_path(run_eprun_here, tmp_path):
    corrupt = tmp_path / "timeout_study.onnx"
    corrupt.write_bytes(b"not a model, timed out")
    fine = models.save(models.chain(features=4, widths=(4, 4)), tmp_path / "fine.onnx")
    result = run_eprun_here("check", fine, corrupt, "--retry-pause", "0")
    one_error_line(result, 4)

    import eprun as tool

    class Fail(Exception):
        pass

    def error_from(text: str) -> tool.EprunError:
        try:
            raise tool.EprunError("onnxruntime cannot open it") from Fail(text)
        except tool.EprunError as exc:
            return exc

    assert tool.is_transient(error_from("CUDA failure: the launch timed out"), "m.onnx")
    assert not tool.is_transient(error_from("Load model from /x/timeout.onnx failed"),
                                 "/x/timeout.onnx")
    assert not tool.is_transient(tool.EprunError("device lost in m.onnx"), "m.onnx")


# -- nothing is destroyed ----------------------------------------------------------------------

@pytest.fixture
def external(tmp_path):
    """A model whose weights live in ext/m.onnx.data."""
    folder = tmp_path / "ext"
    folder.mkdir()
    model = models.chain(features=64, widths=(64, 64, 64), seed=2)
    onnx.save(model, str(folder / "m.onnx"), save_as_external_data=True,
              location="m.onnx.data", size_threshold=0)
    return folder / "m.onnx", folder / "m.onnx.data"


def test_expose_refuses_to_write_onto_its_own_weights(run_eprun_here, external):
    model, data = external
    before = digest(model, data)
    line = one_error_line(run_eprun_here("expose", model, data), 2)
    assert f"refusing to overwrite the input file {str(data)!r}" in line
    assert digest(model, data) == before
    assert sorted(os.listdir(model.parent)) == ["m.onnx", "m.onnx.data"]


def test_outputs_that_are_not_regular_files_are_refused(run_eprun_here, lab_pair, external, tmp_path):
    fp32, _ = lab_pair
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    line = one_error_line(run_eprun_here("expose", fp32, fifo), 4)
    assert "is not a regular file" in line and Path(fifo).is_fifo()
    # onto a folder: refused before the weights are linked beside it
    model, _ = external
    target = tmp_path / "elsewhere"
    (target / "sub").mkdir(parents=True)
    one_error_line(run_eprun_here("expose", model, target / "sub"), 4)
    assert sorted(p.name for p in target.rglob("*")) == ["sub"]
    # a folder that does not exist is a path that is not there
    one_error_line(run_eprun_here("expose", fp32, tmp_path / "no" / "such" / "out.onnx"), 3)
    assert not (tmp_path / "no").exists()


def test_an_output_link_is_refused_and_what_it_leads_to_untouched(run_eprun_here, lab_pair, tmp_path):
    """A link at an output path may lead to anyone's file: eprun never writes through one."""
    fp32, _ = lab_pair
    (tmp_path / "real").mkdir()
    victim = tmp_path / "real" / "victim.onnx"
    victim.write_bytes(b"the user's own file")
    link = tmp_path / "out.onnx"
    link.symlink_to(victim)
    line = one_error_line(run_eprun_here("expose", fp32, link), 4)
    assert "symbolic link" in line
    assert link.is_symlink() and victim.read_bytes() == b"the user's own file"
    dangling = tmp_path / "nowhere.onnx"  # dangling until something writes through it
    dangling.symlink_to(tmp_path / "real" / "new.onnx")
    assert "symbolic link" in one_error_line(run_eprun_here("expose", fp32, dangling), 4)
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["victim.onnx"]


def test_nothing_under_dev_or_proc_is_ever_written(lab_pair, tmp_path):
    """`expose m.onnx /dev/stdout > answer.txt`, as root, replaced the system's /dev/stdout link
    with a regular file. A link of one's own into /proc/self/fd is the same way to stdout (and
    the one tested here, so that a regression cannot damage /dev)."""
    fp32, _ = lab_pair
    to_stdout = tmp_path / "stdout.onnx"
    to_stdout.symlink_to("/proc/self/fd/1")
    answer = tmp_path / "answer.txt"
    with open(answer, "wb") as stream:
        result = subprocess.run([sys.executable, EPRUN, "expose", str(fp32), str(to_stdout)],
                                stdout=stream, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 4, result.stderr
    assert "under /proc, which eprun never writes to" in result.stderr
    assert to_stdout.is_symlink() and os.readlink(to_stdout) == "/proc/self/fd/1"
    assert answer.read_bytes() == b""
    line = one_error_line(run_eprun("expose", fp32, "/proc/eprun.onnx"), 4)
    assert "under /proc" in line  # (where a regression cannot write anything either)


def test_a_model_that_is_not_a_regular_file_is_refused_without_reading_it(run_eprun_here, tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    started = time.monotonic()
    for argv in (["partition", fifo, "MatMul"], ["layers", fifo, fifo, "1"],
                 ["settings", fifo, "1"], ["providers", fifo, "CPUExecutionProvider"]):
        line = one_error_line(run_eprun_here(*argv), 4)
        assert "is not a regular file" in line
    assert time.monotonic() - started < 60  # nothing blocked on the FIFO


def report_files(folder) -> dict:
    return {name: (Path(folder) / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_report_refuses_files_it_did_not_write(run_eprun_here, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    out.mkdir()
    (out / "settings.json").write_text('{"my": "project settings"}\n')
    line = one_error_line(run_eprun_here("report", fp32, int8, "--out-dir", out), 4)
    assert f"refusing to replace {str(out / 'settings.json')!r}, which eprun did not write" in line
    assert report_files(out) == {"settings.json": b'{"my": "project settings"}\n'}
    forced = run_eprun_here("report", fp32, int8, "--out-dir", out, "--force")
    assert forced.code == 0, forced.stderr
    again = run_eprun_here("report", fp32, int8, "--out-dir", out)  # its own files: no --force
    assert again.code == 0, again.stderr


def test_report_of_two_models_with_one_weights_name_gives_each_copy_its_own(run_eprun_here, tmp_path):
    """Two models that both keep their weights in model.onnx.data, reported elsewhere: each
    exposed copy's weights get a name eprun chooses from that copy's name, so they never
    need one file (an older eprun refused this pair)."""
    for name, seed in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        onnx.save(models.chain(features=64, widths=(64, 64, 64), seed=seed),
                  str(tmp_path / name / "model.onnx"), save_as_external_data=True,
                  location="model.onnx.data", size_threshold=0)
    out = tmp_path / "report"
    result = run_eprun_here("report", tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx",
                       "--out-dir", out)
    assert result.code == 0, result.stderr
    for which, name in (("fp32", "a"), ("int8", "b")):
        data = out / f"{which}_exposed.onnx.data"
        assert data.read_bytes() == (tmp_path / name / "model.onnx.data").read_bytes()
    assert not (out / "model.onnx.data").exists()


def test_a_write_error_leaves_the_previous_deliverables(lab_pair, tmp_path):
    """A file-size limit makes staging the second exposed model fail (EFBIG)."""
    import resource

    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun("report", fp32, int8, "--out-dir", out, "--seed", "1").code == 0
    before = report_files(out)
    limit = os.path.getsize(out / "fp32_exposed.onnx") + 1

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, str(EPRUN), "report", str(fp32), str(int8),
                           "--out-dir", str(out), "--seed", "2"], capture_output=True,
                          text=True, preexec_fn=small_files, timeout=120)
    assert proc.returncode == 4 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "cannot write" in proc.stderr and "EP Error" not in proc.stderr
    assert report_files(out) == before  # no new file, no temporary, no half set
    # into folders it had to create: they go too, and only they
    fresh = tmp_path / "fresh" / "deeper"
    proc = subprocess.run([sys.executable, str(EPRUN), "report", str(fp32), str(int8),
                           "--out-dir", str(fresh)], capture_output=True, text=True,
                          preexec_fn=small_files, timeout=120)
    assert proc.returncode == 4 and "cannot write" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["out"]


INTERRUPT_AFTER_FIRST_RENAME = """
import os, signal, sys
sys.argv = [sys.argv[1]] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import eprun
real = os.replace
def replace(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)  # lands while the set is being committed
os.replace = replace
sys.exit(eprun.main())
"""


def test_an_interrupt_lands_before_or_after_the_whole_report(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun("report", fp32, int8, "--out-dir", "out", "--seed", "1",
                     cwd=tmp_path).code == 0
    old = report_files(out)
    elsewhere = tmp_path / "elsewhere"  # the same command line (the report's first line)
    elsewhere.mkdir()
    assert run_eprun("report", fp32, int8, "--out-dir", "out", "--seed", "2",
                     cwd=elsewhere).code == 0
    new = report_files(elsewhere / "out")
    assert old["growth.json"] != new["growth.json"]
    proc = subprocess.run([sys.executable, "-c", INTERRUPT_AFTER_FIRST_RENAME, str(EPRUN),
                           "report", str(fp32), str(int8), "--out-dir", "out", "--seed",
                           "2"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM and proc.stdout == ""
    got = report_files(out)
    assert got in (new, old), "a mixed set of deliverables"
    assert got == new  # the signal was held until the set was complete


def test_killed_report_leaves_old_or_new_sets_and_no_stray_files(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun("report", fp32, int8, "--out-dir", out, "--seed", "1").code == 0
    old = report_files(out)
    for delay in (0.3, 0.6, 0.9, 1.2, 1.5):
        proc = subprocess.Popen([sys.executable, str(EPRUN), "report", str(fp32), str(int8),
                                 "--out-dir", str(out), "--seed", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        # 0: finished first; 143: stopped by eprun; -15: before eprun's first line ran
        assert proc.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM), err
        got = report_files(out)
        assert set(got) == set(old), "a stray or temporary file"
        assert {name for name in got if got[name] != old[name]} in (
            set(), {"growth.json", "settings.json", "ep_report.md"}), "a mixed set"
        out_again = run_eprun("report", fp32, int8, "--out-dir", out, "--seed", "1")
        assert out_again.code == 0 and report_files(out) == old


# -- streams -----------------------------------------------------------------------------------

def run_raw(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EPRUN), *map(str, argv)], timeout=120, **kwargs)


def test_a_full_or_closed_stdout_is_exit_4_with_one_line(lab_pair):
    fp32, int8 = lab_pair
    argv = ["layers", fp32, int8, "1"]
    with open("/dev/full", "w") as full:
        proc = run_raw(argv, stdout=full, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 4
    assert proc.stderr == ("eprun: error: cannot write the answer to stdout (closed, full or a "
                           "closed pipe)\n")
    proc = run_raw(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                   preexec_fn=lambda: os.close(1))
    assert proc.returncode == 4
    assert proc.stderr == ("eprun: error: stdout is closed, so there is nowhere to write the "
                           "answer\n")
    # --version too, which argparse runs while it parses
    version_failed = ("eprun: error: cannot write the version to stdout (closed, full or a "
                      "closed pipe)\n")
    with open("/dev/full", "w") as full:
        proc = run_raw(["--version"], stdout=full, stderr=subprocess.PIPE, text=True)
    assert (proc.returncode, proc.stderr) == (4, version_failed)
    proc = run_raw(["--version"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                   preexec_fn=lambda: os.close(1))
    assert (proc.returncode, proc.stderr) == (4, version_failed)


def test_a_closed_pipe_is_exit_4(lab_pair):
    fp32, int8 = lab_pair
    reader, writer = os.pipe()
    os.close(reader)  # nobody will ever read: the write gets EPIPE
    try:
        proc = run_raw(["layers", fp32, int8, "1"], stdout=writer, stderr=subprocess.PIPE,
                       text=True)
    finally:
        os.close(writer)
    assert proc.returncode == 4
    assert proc.stderr.splitlines() == [
        "eprun: error: cannot write the answer to stdout (closed, full or a closed pipe)"]


def test_a_closed_stderr_changes_no_exit_code(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    close_stderr = lambda: os.close(2)
    ok = run_raw(["growth", fp32, int8, "1"], capture_output=True, text=True,
                 preexec_fn=close_stderr)
    assert ok.returncode == 0 and json.loads(ok.stdout)["layer_count"] == 6
    missing = run_raw(["growth", tmp_path / "nope.onnx", int8, "1"], capture_output=True,
                      text=True, preexec_fn=close_stderr)
    assert missing.returncode == 3 and missing.stdout == ""
    failed = run_raw(["check", fp32, int8, "--profile", "int8"], capture_output=True,
                     text=True, preexec_fn=close_stderr)
    assert failed.returncode == 1 and json.loads(failed.stdout)["passed"] is False


def test_chatter_is_dropped_on_failure_and_kept_on_success(lab_pair, tmp_path):
    """onnxruntime's fallback banner for a made-up provider: shown after a success only."""
    fp32, _ = lab_pair
    ok = run_eprun("providers", fp32, "NoSuchExecutionProvider")
    assert ok.code == 0 and "EP Error" in ok.stderr
    assert len(ok.stdout.splitlines()) == 1  # the banner never reaches stdout
    # the same banner, then a failure: one line
    unwritable = tmp_path / "out.json"
    unwritable.mkdir()
    failed = run_eprun("report", fp32, fp32, "--out-dir", tmp_path / "r",
                       "--providers", "CPUExecutionProvider")
    assert failed.code == 0 and "EP Error" not in failed.stderr  # report hides its own probe
    debug = run_eprun("expose", fp32, unwritable, env={"EPRUN_DEBUG": "1"})
    assert debug.code == 4 and "Traceback" in debug.stderr


def test_an_unexpected_exception_is_an_internal_error(monkeypatch, capfd, lab_pair):
    import eprun as tool

    fp32, int8 = lab_pair

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(tool, "compare_boundary", broken)
    assert tool.main(["layers", str(fp32), str(int8), "1"]) == 4
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ("eprun: error: internal error: ZeroDivisionError: planted (rerun with "
                   "EPRUN_DEBUG=1 and report it)\n")


def test_main_runs_in_any_thread(lab_pair, capfd):
    import threading

    import eprun as tool

    fp32, int8 = lab_pair
    codes = []
    worker = threading.Thread(target=lambda: codes.append(
        tool.main(["growth", str(fp32), str(int8), "1"])))
    worker.start()
    worker.join(120)
    assert codes == [0]
    assert json.loads(capfd.readouterr().out)["layer_count"] == 6


def test_concurrent_calls_of_main_lose_no_answer(lab_pair, capfd):
    """eprun holds fds 1 and 2 while a command runs; calls from several threads at once run
    one after the other, each answer whole on its own line."""
    import threading

    import eprun as tool

    fp32, int8 = lab_pair
    codes = []
    workers = [threading.Thread(target=lambda seed=seed: codes.append(
        tool.main(["growth", str(fp32), str(int8), str(seed)]))) for seed in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert codes == [0, 0, 0, 0]
    answers = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert sorted(answer["seed"] for answer in answers) == [0, 1, 2, 3]


# -- odd inputs --------------------------------------------------------------------------------

def test_seeds_of_any_length(eprun, lab_pair):
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    fp32, int8 = lab_pair
    seed = int("7" * 6000)
    answer = eprun("growth", fp32, int8, str(seed))
    assert answer["seed"] == seed


def test_a_graph_with_a_cycle_is_refused(run_eprun_here, tmp_path):
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Relu", ["x"], ["y"], name="free")]
    path = models.save(models.finish(nodes, [models.float_input("x", 4)],
                                     [helper.make_tensor_value_info("y", 1, ["N", 4])]),
                       tmp_path / "cycle.onnx")
    line = one_error_line(run_eprun_here("partition", path, "Relu", "--mode", "ort"), 4)
    assert "the graph has a cycle" in line
    # a node that reads its own output is the shortest cycle
    nodes = [helper.make_node("Add", ["x", "a"], ["a"], name="self"),
             helper.make_node("Relu", ["a"], ["y"], name="after")]
    path = models.save(models.finish(nodes, [models.float_input("x", 4)],
                                     [helper.make_tensor_value_info("y", 1, ["N", 4])]),
                       tmp_path / "self_loop.onnx")
    for supported in ("Add", "Relu"):
        line = one_error_line(run_eprun_here("partition", path, supported, "--mode", "ort"), 4)
        assert "the graph has a cycle (node 'self'" in line


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


def loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("moment", ["numpy", "onnxruntime_pybind11_state", "running"])
def test_ctrl_c_at_any_moment_is_interrupted(lab_pair, moment):
    """While numpy is imported (it turns the interrupt into an ImportError), while onnxruntime
    loads, and later; Python's own start-up, before eprun's first line, is the interpreter's."""
    fp32, int8 = lab_pair
    proc = subprocess.Popen([sys.executable, str(EPRUN), "growth", str(fp32), str(int8), "1",
                             "--local"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    library = "onnxruntime_pybind11_state" if moment == "running" else moment
    while not loaded(proc.pid, library) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    if moment == "running":
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # it finished first: the answer is whole
        assert json.loads(out)["layer_count"] == 6
        return
    assert proc.returncode == 130, err
    assert out == "" and err == "eprun: error: interrupted\n"


def test_ctrl_c_while_eprun_imports_its_first_modules_is_one_line(lab_pair):
    """A SIGINT sent while eprun's own module imports argparse (its first instants): the
    handler is installed before any other import, so it is exit 130 and one line."""
    fp32, int8 = lab_pair
    code = ("import builtins, os, runpy, signal, sys\n"
            "real = builtins.__import__\n"
            "def hooked(name, *args, **kwargs):\n"
            "    if name == 'argparse':\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = hooked\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", code, str(EPRUN), "growth", str(fp32),
                             str(int8), "1"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (
        130, "", "eprun: error: interrupted\n")


def test_sigterm_at_any_moment_never_crashes(tmp_path):
    """SIGTERM while onnx (protobuf) loads or parses used to unwind an exception through the C
    extension: a SIGSEGV now and then, or an internal error. Sweep the start-up and the work."""
    heavy = models.save(models.chain(features=512, widths=(512, 512, 512, 512), seed=1),
                        tmp_path / "heavy.onnx")
    codes = []
    for step in range(20):
        out = tmp_path / "out.onnx"
        proc = subprocess.Popen([sys.executable, str(EPRUN), "expose", str(heavy), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # from the moment eprun starts loading onnx (its C extension is mapped), however
        # slow the machine's start-up is, through the parse and the write
        deadline = time.monotonic() + 60
        while (not loaded(proc.pid, "onnx_cpp2py_export") and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.001)
        time.sleep(0.005 * step)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        # 0: it finished first; 143: eprun stopped; -15: before eprun's first line ran
        assert proc.returncode in (0, 143, -signal.SIGTERM), (step, proc.returncode, err)
        assert err == b"" or proc.returncode == 0
        assert sorted(os.listdir(tmp_path)) in (["heavy.onnx"], ["heavy.onnx", "out.onnx"])
    assert 143 in codes  # the sweep did land while eprun worked
