"""What needs a real process: ``python eprun.py`` as typed (help names what was typed), exit
codes as the shell sees them with stdout full, closed or a closed pipe and stderr closed, Ctrl-C
and SIGTERM at any moment, onnxruntime's C-level prints, the modules a command imports at
start-up, and the end of the process after its atexit handlers. Everything else runs
``main(argv)`` in-process (tests/conftest.py)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import models
import pytest
from conftest import (
    EPRUN,
    IMPORT_EPRUN,
    PROGRAM,
    ROOT,
    RUN_ARGV0,
    imported_by,
    own_code_runs,
    run_eprun,
    without_exposure_note,
)

import eprun as tool

# -- streams -----------------------------------------------------------------------------------

def run_raw(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PROGRAM, *map(str, argv)], timeout=120, **kwargs)


def test_a_full_or_closed_stdout_is_exit_4_with_one_line(lab_pair):
    fp32, int8 = lab_pair
    argv = ["layers", fp32, int8, "1"]
    with open("/dev/full", "w") as full:
        proc = run_raw(argv, stdout=full, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 4
    assert without_exposure_note(proc.stderr) == (
        "eprun: error: cannot write the answer to stdout (closed, full or a closed pipe)\n")
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
    assert without_exposure_note(proc.stderr).splitlines() == [
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
    proc = subprocess.Popen([*PROGRAM, "growth", str(fp32), str(int8), "1",
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
    code = ("import builtins, os, signal, sys\n"
            "real = builtins.__import__\n"
            "def hooked(name, *args, **kwargs):\n"
            "    if name == 'argparse':\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = hooked\n"
            "sys.argv = sys.argv[1:]\n"
            + RUN_ARGV0)
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
    for step in range(10):
        out = tmp_path / "out.onnx"
        proc = subprocess.Popen([*PROGRAM, "expose", str(heavy), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # from the moment eprun starts loading onnx (its C extension is mapped), however
        # slow the machine's start-up is, through the parse and the write
        deadline = time.monotonic() + 60
        while (not loaded(proc.pid, "onnx_cpp2py_export") and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.001)
        time.sleep(0.01 * step)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        # 0: it finished first; 143: eprun stopped; -15: before eprun's first line ran
        assert proc.returncode in (0, 143, -signal.SIGTERM), (step, proc.returncode, err)
        assert err == b"" or proc.returncode == 0
        assert sorted(os.listdir(tmp_path)) in (["heavy.onnx"], ["heavy.onnx", "out.onnx"])
    assert 143 in codes  # the sweep did land while eprun worked


BLOCK_ONNX = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "onnx" or name.startswith("onnx."):
            raise ModuleNotFoundError("No module named 'onnx'", name="onnx")
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
""" + RUN_ARGV0


def test_a_missing_package_names_itself_and_the_fix(lab_pair):
    fp32, int8 = lab_pair
    result = run_eprun("layers", fp32, int8, "1", prefix=[sys.executable, "-c", BLOCK_ONNX,
                                                           str(EPRUN)])
    assert result.code == 4 and result.stdout == ""
    assert result.stderr.splitlines() == [
        (f"eprun: error: eprun needs the Python package 'onnx', which {sys.executable} does not "
        "have: run eprun with the Python that make lab set up (.venv/bin/python eprun.py ...), "
        "or install it with: python -m pip install onnx onnxruntime numpy")]


def read_all(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal's other end closed
            return data
        if not chunk:
            return data
        data += chunk


def test_progress_goes_to_a_terminal_only(lab_pair):
    import pty

    fp32, int8 = lab_pair
    argv = [*PROGRAM, "layers", str(fp32), str(int8), "1"]
    env = {**os.environ, "EPRUN_PROGRESS_AFTER": "0"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    answer = json.loads(proc.stdout.read())
    proc.wait(timeout=60)
    shown = without_exposure_note(read_all(leader).decode())
    os.close(leader)
    assert proc.returncode == 0 and answer["layer_count"] == 6
    # each step overwrites the last, with the time left at the pace so far, then cleared
    steps = [rf"\reprun: comparing boundaries: step {k} of 6, about \d+ s left\x1b\[K"
             for k in range(1, 6)]
    assert re.fullmatch("".join(steps) + r"\reprun: comparing boundaries: step 6 of 6"
                        r"\x1b\[K\r\x1b\[K", shown), shown
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert piped.returncode == 0 and without_exposure_note(piped.stderr) == ""
    assert json.loads(piped.stdout) == answer


def test_ctrl_c_erases_the_progress_line_before_its_one_line(tmp_path):
    import pty

    fp32 = models.save(models.chain(features=8, widths=[8] * 24, seed=3), tmp_path / "f.onnx")
    int8 = models.quantize(fp32, tmp_path / "q.onnx", seed=4)
    argv = [*PROGRAM, "sensitivity", str(fp32), str(int8), "5", "--jobs", "1"]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower,
                            env={**os.environ, "EPRUN_PROGRESS_AFTER": "0"})
    os.close(follower)
    shown = b""
    while b"step 1 of 48" not in shown:  # a unit of 48 restored: the line is on the terminal
        shown += os.read(leader, 4096)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    shown += read_all(leader)
    os.close(leader)
    assert proc.returncode == 130
    assert re.search(rb"step [0-9]+ of 48[^\r]*\x1b\[K\r\x1b\[Keprun: error: interrupted\r?\n$",
                     shown), shown


# -- start-up: each command imports only what it uses -------------------------------------------

def upb_protobuf() -> bool:
    from google.protobuf.internal import api_implementation

    return api_implementation.Type() == "upb"


def test_version_reads_the_versions_without_importing_the_libraries():
    import numpy
    import onnx
    import onnxruntime

    code, out, imported = imported_by("--version")
    assert code == 0
    assert (f"(onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, numpy "
            f"{numpy.__version__}; Python ") in out
    assert not imported & {"onnx", "onnxruntime", "numpy", "importlib.metadata"}, imported
    code, out, imported = imported_by("--help")
    assert code == 0 and "providers" in out and not imported, imported


@pytest.mark.parametrize("mode", ["file", "ort"])
def test_partition_reads_the_graph_without_importing_onnx(lab_pair, mode):
    """Where protobuf is its upb build, partition parses the graph with onnx's generated
    message module alone; elsewhere it imports onnx. The answer is the same either way."""
    code, out, imported = imported_by("partition", lab_pair[1], "MatMul", "--mode", mode)
    assert code == 0
    assert ("onnx" in imported) is not upb_protobuf(), imported
    if mode == "file":  # numpy comes with onnx, never for the walk itself
        assert ("numpy" in imported) is ("onnx" in imported), imported
    assert json.loads(out) == tool.partition(str(lab_pair[1]), ["MatMul"],
                                                   tool.PartitionOptions(mode=mode))


def test_messages_read_alone_are_the_ones_onnx_hands_out(lab_pair):
    """The premise of reading a graph without onnx: upb keeps one class per message type, so
    a model parsed before ``import onnx`` is a model onnx's own functions take."""
    script = (IMPORT_EPRUN +
              "messages = eprun.onnx_messages()\n"
              "standalone = 'onnx' not in sys.modules\n"
              "model = eprun.load_model(sys.argv[1])\n"
              "import onnx\n"
              "same = messages.ModelProto is onnx.ModelProto\n"
              "onnx.checker.check_model(model)\n"
              "onnx.shape_inference.infer_shapes(model)\n"
              "print(standalone, same)\n")
    result = subprocess.run([sys.executable, "-c", script, str(lab_pair[1])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(upb_protobuf()), "True"]


def test_providers_scans_no_metadata_when_no_plugin_is_installed(lab_pair):
    code, out, imported = imported_by("providers", lab_pair[0], "CPUExecutionProvider",
                                      "CUDAExecutionProvider,CPUExecutionProvider")
    assert code == 0 and json.loads(out)["cases"][1]["requested"][0] == "CUDAExecutionProvider"
    assert "onnx" not in imported
    assert ("importlib.metadata" in imported) is bool(tool._plugin_candidates()), imported


def test_only_partition_and_expose_read_messages_apart_from_onnx(lab_pair, tmp_path):
    """A command that imports onnx anyway parses with onnx's own classes: loading the
    generated module apart too would cost it a few hundredths of a second for nothing."""
    fp32, int8 = lab_pair
    script = (IMPORT_EPRUN +
              "code = eprun.main(sys.argv[1:])\n"
              "apart = bool(eprun.onnx_messages.cache_info().currsize) and \\\n"
              "    eprun.onnx_messages() is not sys.modules.get('onnx')\n"
              "print(int(apart), file=sys.stderr)\n"
              "sys.exit(code)\n")
    upb = upb_protobuf()  # elsewhere onnx's own classes are the only ones that work
    for argv, apart in ((["partition", int8, "MatMul"], upb),
                        (["expose", int8, tmp_path / "e.onnx"], upb),
                        (["layers", fp32, int8, "1"], False),
                        (["settings", int8, "1"], False)):
        result = subprocess.run([sys.executable, "-c", script, *map(str, argv)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines()[-1] == str(int(apart)), (argv, result.stderr)


def test_a_run_imports_no_shutil_or_tempfile_unless_it_copies(lab_pair):
    """argparse's width and the held chatter cost a short command neither module."""
    script = ("import sys\n"
              f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
              "import atexit\n"
              "atexit.register(lambda: print('shutil' in sys.modules, 'tempfile' in "
              "sys.modules, file=sys.stderr, flush=True))\n"
              + RUN_ARGV0)
    result = subprocess.run([sys.executable, "-c", script, "providers", str(lab_pair[0]),
                             "CPUExecutionProvider"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    expected = "True True" if not hasattr(os, "memfd_create") else "False False"
    assert result.stderr.splitlines()[-1] == expected


# eprun.py run as typed, from a script that leaves an object for the interpreter to finalize
# (it says so on fd 2 when it is) and an atexit handler.
_ENDING = (
    "import atexit, os, sys\n"
    f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
    "if os.environ.get('WITH_MULTIPROCESSING'):\n    import multiprocessing\n"
    "class Finalized:\n    def __del__(self, write=os.write):\n"
    "        write(2, b'finalized\\n')\n"
    "left = Finalized()\n"
    "atexit.register(lambda: os.write(2, b'atexit\\n'))\n"
    + RUN_ARGV0)


@pytest.mark.parametrize("argv, code", [(["providers", "{fp32}", "CPUExecutionProvider"], 0),
                                        (["layers", "{fp32}"], 2),
                                        (["layers", "{fp32}", "{fp32}", "--inputs",
                                          "missing.npz"], 2)])
def test_the_process_ends_after_the_atexit_handlers_without_the_teardown(lab_pair, argv,
                                                                         code):
    argv = [word.format(fp32=lab_pair[0]) for word in argv]
    result = subprocess.run([sys.executable, "-c", _ENDING, *argv], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == code, result.stderr
    assert "atexit" in result.stderr.splitlines()
    assert "finalized" not in result.stderr.splitlines()
    assert (result.stdout.count("\n"), bool(result.stdout)) == ((1, True) if code == 0
                                                                else (0, False))
    # with multiprocessing loaded (sensitivity's workers) the interpreter ends as usual
    result = subprocess.run([sys.executable, "-c", _ENDING, *argv], capture_output=True,
                            text=True, timeout=120, env={**os.environ,
                                                         "WITH_MULTIPROCESSING": "1"})
    assert result.returncode == code, result.stderr
    assert result.stderr.splitlines()[-2:] == ["atexit", "finalized"]


def test_expose_infers_the_types_onnx_infers_without_importing_it(lab_pair, tmp_path):
    """Where protobuf is its upb build, expose runs onnx's shape inference through onnx's
    extension alone: each added output has the type ``onnx.shape_inference`` gives it."""
    import onnx

    for model in lab_pair:
        out = tmp_path / f"{model.stem}_exposed.onnx"
        code, answer, imported = imported_by("expose", model, out)
        assert code == 0
        assert ("onnx" in imported) is not upb_protobuf(), imported
        assert ("numpy" in imported) is ("onnx" in imported), imported
        inferred = onnx.shape_inference.infer_shapes(onnx.load(str(model))).graph
        known = {value.name: value.type
                 for value in (*inferred.input, *inferred.value_info, *inferred.output)}
        written = onnx.load(str(out)).graph.output
        added = [value.name for value in written][len(inferred.output):]
        assert added and added == [name for name in json.loads(answer)["boundaries"]
                                   if name not in {v.name for v in inferred.output}]
        for value in written:
            assert value.type == known[value.name], value.name


def test_the_extension_read_alone_is_the_one_a_later_import_of_onnx_takes(lab_pair):
    script = (IMPORT_EPRUN +
              "model = eprun.load_model(sys.argv[1], graph_only=True)\n"
              "types = eprun.tensor_types(model)\n"
              "native = eprun.onnx_native()\n"
              "standalone = 'onnx' not in sys.modules\n"
              "import onnx\n"
              "import onnx.onnx_cpp2py_export as C\n"
              "onnx.checker.check_model(model)\n"
              "inferred = onnx.shape_inference.infer_shapes(eprun._skeleton(model)).graph\n"
              "same = all(types[v.name] == v.type for v in inferred.value_info)\n"
              "print(standalone, C is native, same, len(inferred.value_info) > 0)\n")
    result = subprocess.run([sys.executable, "-c", script, str(lab_pair[1])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(upb_protobuf()), "True", "True", "True"]


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


def test_ctrl_c_while_layers_starts_is_one_line(lab_pair):
    """Ctrl-C 0, 0.03 and 0.08 s after eprun's own code runs (its SIGTERM handler is in
    place), while it imports onnx and onnxruntime and loads the models. The moments count from
    the handler, not from the start: the whole run takes about 0.25 s on an idle machine, and
    the interpreter's start-up before the handler can take longer than that on a loaded one."""
    fp32, int8 = lab_pair
    interrupted = 0
    for delay in (0.0, 0.03, 0.08):
        proc = subprocess.Popen([*PROGRAM, "layers", str(fp32), str(int8),
                                 "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        own_code_runs(proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        if proc.returncode == 0:  # it finished first: then its answer is whole
            assert json.loads(out)["layer_count"] == 6
            continue
        assert (proc.returncode, out, err) == (130, "", "eprun: error: interrupted\n"), delay
        interrupted += 1
    assert interrupted >= 1


@pytest.mark.parametrize("stored", ["inline", "external"])
@pytest.mark.parametrize("command", [["partition", "MatMul"], ["expose", "{out}"]])
def test_partition_and_expose_import_neither_onnxruntime_nor_weights(lab_pair, external_pair,
                                                                     tmp_path, command, stored):
    model = (lab_pair if stored == "inline" else external_pair)[1]
    argv = [str(model)] + [a.replace("{out}", str(tmp_path / "o.onnx")) for a in command[1:]]
    code, out, imported = imported_by(command[0], *argv)
    assert code == 0
    assert "onnxruntime" not in imported, "imported onnxruntime"
    assert len(out.splitlines()) == 1


def test_only_sensitivity_imports_the_quantizer(lab_pair, tmp_path):
    """onnxruntime.quantization is slow to import and needs sympy on some releases: every
    command but sensitivity (and report --sensitivity) runs without it. The commands without
    it run one after the other in one process (what one of them imports stays imported), and
    sensitivity in another shows that the check sees the import."""
    fp32, int8 = lab_pair
    script = (IMPORT_EPRUN + "import json\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    code = eprun.main(argv)\n"
              "    print(code, 'onnxruntime.quantization' in sys.modules, file=sys.stderr)\n")
    for commands, imported in (([["layers", fp32, int8, "1"],
                                 ["report", fp32, int8, "--out-dir", tmp_path / "r"],
                                 ["check", fp32, int8, "--atol", "100", "--min-cos", "-1"]],
                                False),
                               ([["sensitivity", fp32, int8, "1", "--max-units", "1"]], True)):
        words = json.dumps([[str(word) for word in argv] for argv in commands])
        result = subprocess.run([sys.executable, "-c", script, words],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        said = [line for line in result.stderr.splitlines() if line.startswith("0 ")]
        assert said == [f"0 {imported}"] * len(commands), (commands, result.stderr)


@pytest.mark.parametrize("limit_mb", [400, 250, 230, 210, 180, 120, 80])
def test_a_small_address_space_is_an_answer_or_one_line(lab_pair, limit_mb):
    """Under ulimit -v, layers on the lab pair died by SIGSEGV with nothing on stderr (a
    thread's unchecked allocation inside onnxruntime), or said "interrupted" (OpenBLAS raising
    SIGINT when its threads did not start): now it answers, or refuses in one line (exit 4)."""
    import resource

    fp32, int8 = lab_pair
    limit = limit_mb << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # as typed: the script's syntax tree (about 35 MB, kept while it runs) sets where each
    # limit lands
    proc = subprocess.run([sys.executable, str(EPRUN), "layers", str(fp32), str(int8), "1"],
                          capture_output=True, text=True, timeout=120, preexec_fn=cap)
    assert proc.returncode in (0, 4), (proc.returncode, proc.stderr)
    if proc.returncode == 4:
        (line,) = proc.stderr.splitlines()
        assert line.startswith("eprun: error: ") and "internal error" not in line, line
        assert proc.stdout == ""
    else:
        assert json.loads(proc.stdout)["layer_count"] == 6
