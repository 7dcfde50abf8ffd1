"""Shared fixtures: run eprun in this process (main(argv)) or, where a test needs one, in a
process of its own; and build small models inline."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# pytest keeps the test modules whose assertions it rewrites (tests/__pycache__, git-ignored)
# only where Python may write bytecode: under PYTHONDONTWRITEBYTECODE each worker rewrote every
# one of them on every run (3 s of a worker's start). So the test processes write bytecode for
# whatever they import (the helper modules, a test's temporary package); the processes the
# tests start keep the variable.
sys.dont_write_bytecode = False
# tests/test_viz.py needs make test-viz's venv (Model Explorer, matplotlib, selenium) and a
# browser: that target sets EPRUN_TEST_VIZ=1; every other run leaves the file out.
collect_ignore = [] if os.environ.get("EPRUN_TEST_VIZ") == "1" else ["test_viz.py"]
EPRUN = ROOT / "eprun.py"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# What ``python eprun.py`` does with the file, from its bytecode: ``sys.argv[0]``'s code runs
# as a fresh ``__main__`` module, as runpy.run_path runs it, and the real ``__main__`` is back
# after. The interpreter compiles a script on every run (0.3 s for this 800 KB file, and
# PYTHONDONTWRITEBYTECODE keeps even imports from caching it): the test run compiles it once
# (pytest_configure) and each process the tests start loads that. A script of a test's own
# (a wrapper that patches something first) ends with this; ``PROGRAM`` is the command line.
RUN_ARGV0 = (
    "import importlib.machinery as _machinery, sys as _sys, types as _types\n"
    "_main, _saved = _types.ModuleType('__main__'), _sys.modules['__main__']\n"
    "_main.__file__ = _sys.argv[0]\n"
    "_sys.modules['__main__'] = _main\n"
    "try:\n"
    "    exec(_machinery.SourceFileLoader('__main__', _sys.argv[0]).get_code('__main__'),\n"
    "         vars(_main))\n"
    "finally:\n"
    "    _sys.modules['__main__'] = _saved\n")
# ``python eprun.py ARGS`` is ``[*PROGRAM, *ARGS]``: argv[0] and the first folder on sys.path
# are the script's, as they are for the script typed.
# (Under PYTHONSAFEPATH neither -c nor a script puts a folder first: nothing is replaced.)
PROGRAM = [sys.executable, "-c",
           "import os, sys\nsys.argv = sys.argv[1:]\nif sys.path[:1] == ['']:\n"
           "    sys.path[0] = os.path.dirname(sys.argv[0])\n" + RUN_ARGV0, str(EPRUN)]
# The first lines of a ``python -c`` script that calls eprun's functions from Python (as a user's
# program would, in a process of its own): ``sys`` and ``eprun`` imported.
IMPORT_EPRUN = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport eprun\n"


# The note layers gives where exposing the int8 boundaries moved the final output. Whether it
# does is the CPU's: where the fused int8 kernel agrees bit for bit with the float path (AVX-512
# VNNI, AMX) it is never said; on AVX2 without VNNI (u8 x s8 pairs summed in int16) it is. A
# test about something else drops it with ``without_exposure_note``.
_EXPOSURE_NOTE = re.compile(r"(\r?)eprun: note: exposing the boundaries moved [^\n]*\n?")


def without_exposure_note(text: str) -> str:
    """``text`` (stderr, or what a terminal showed) without the exposure note's line."""
    return _EXPOSURE_NOTE.sub(r"\1", text)


def pinned(package: str) -> str:
    """The version requirements.txt pins for ``package``."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==")[1].strip()
    raise LookupError(package)


def _one_blas_thread() -> None:
    """numpy's BLAS runs one thread in a test process, as it does in eprun's own (``cli``).

    After a call it shared out, an idle OpenBLAS thread spins for a while; pytest-xdist runs
    two workers on a machine of two cores, so it spins on the core the other worker computes
    on (the same waste as a session's spinning threads, below). OpenBLAS reads the variable
    when numpy loads it, so it is set for that import only: the processes the tests start get
    the environment as it was."""
    if "numpy" in sys.modules:
        return
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


_one_blas_thread()


def _on_pinned_stack() -> bool:
    import numpy
    import onnxruntime

    return (onnxruntime.__version__, numpy.__version__) == (pinned("onnxruntime"), pinned("numpy"))


# The committed deliverables were made on the pinned stack; other onnxruntime releases use
# other kernels and quantizer choices, so there the tests compare to 1e-5 instead of exactly.
PINNED_STACK = _on_pinned_stack()


def _sessions_wait_without_spinning() -> None:
    """Every onnxruntime session opened in a test process (eprun's in-process runs, the
    oracles' own sessions, quantize_static's calibration) waits for work without spinning.

    An idle intra-op thread spins by default, and pytest-xdist runs two workers on a machine
    of two cores: each worker's spinning threads take the core the other computes on, which
    made every session-heavy test about half again as slow (eprun's sensitivity workers turn
    spinning off for the same reason, WORKER_SESSION_CONFIG). How threads wait is all this
    changes: how many there are, and so every number a session computes, stays the default.
    Processes the tests start (``python eprun.py``) run as a user's do."""
    import onnxruntime

    default = onnxruntime.SessionOptions

    class SessionOptions(default):
        def __init__(self) -> None:
            super().__init__()
            for pool in ("intra_op", "inter_op"):
                self.add_session_config_entry(f"session.{pool}.allow_spinning", "0")

    onnxruntime.SessionOptions = SessionOptions


_sessions_wait_without_spinning()

# A shell script's background job starts with Ctrl-C ignored, and the processes the tests
# start would inherit that, so an interrupted eprun would finish instead (`make test &` in a
# script); under nohup, SIGHUP is ignored likewise. The tests stand for a user at a terminal:
# a handler here is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_configure(config):
    import py_compile

    if not hasattr(config, "workerinput"):  # xdist's workers start after this, and load it
        # What PROGRAM and every import of eprun load; checked against the source's hash, so
        # an edit in the same second is never missed. A checkout that cannot be written
        # leaves each process to compile the source.
        with contextlib.suppress(OSError):
            py_compile.compile(str(EPRUN), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    config.addinivalue_line(
        "markers", "byte_exact_on_deliverables_cpu: compares bit for bit what the CPU's int8 "
        "kernel decides: with the committed values (deliverables, README examples, the facts "
        "recorded with them) only where onnxruntime picks the int8 kernel that made them "
        "(tests/cpu.py: DELIVERABLES_CPU); elsewhere compares what does not depend on that "
        "kernel and recomputes what does")


# The files whose tests take longest, in this order: quantize_static and a session per unit on
# transformer models, then the ones whose tests wait on processes they start and signal (a few
# seconds each, timeouts and kills at chosen moments). pytest-xdist hands tests out in
# collection order, so these go first, and the many short tests fill both workers at the end
# instead of one worker idling while the other finishes a long one. Only under xdist: a run
# with -n 0 (tests/mutation.py's) keeps the order it asks for.
SLOW_FIRST = ("test_sensitivity.py", "test_io_safety.py", "test_process.py", "test_cmd_reduce.py")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: SLOW_FIRST.index(item.path.name)
                   if item.path.name in SLOW_FIRST else len(SLOW_FIRST))


def approx_tree(value):
    """A JSON value whose floats compare to a relative 1e-5 (for stacks other than the pinned
    one, whose kernels round differently)."""
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-5, abs=1e-9)
    if isinstance(value, dict):
        return {key: approx_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [approx_tree(item) for item in value]
    return value


class Result:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def answer(self) -> dict:
        """stdout parsed as exactly one strict JSON object on one line."""
        lines = self.stdout.splitlines()
        assert len(lines) == 1, f"expected one stdout line, got {self.stdout!r}"

        def refuse(constant: str) -> None:
            raise AssertionError(f"non-strict JSON constant {constant}")

        value = json.loads(lines[0], parse_constant=refuse)
        assert isinstance(value, dict)
        return value


def process_state(pid: int) -> str:
    """The state letter /proc gives process ``pid`` (``R``, ``S``, ``T``, ``Z``, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def own_code_runs(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until eprun's own code runs in ``proc`` (it has a SIGTERM handler of its own,
    /proc's SigCgt mask) or the process ended: moments counted from here do not depend on how
    slow the interpreter's start-up is."""
    status, deadline = Path(f"/proc/{proc.pid}/status"), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            caught = re.search(r"^SigCgt:\s*(\w+)", status.read_text(), re.MULTILINE)
            if caught and int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1:
                return
        time.sleep(0.001)


def run_eprun(*args: str, env: dict | None = None, cwd: str | None = None,
              prefix: list[str] | None = None) -> Result:
    command = (prefix or PROGRAM) + [str(arg) for arg in args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    return Result(proc)


# Run eprun.py as typed, then say which of these modules the run imported (stderr's last line,
# from an atexit handler: eprun's exit runs those, then may end the process at once).
_IMPORTED = (
    "import atexit, sys\n"
    f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
    "watched = ('onnx', 'onnxruntime', 'numpy', 'importlib.metadata')\n"
    "atexit.register(lambda: print(','.join(name for name in watched if name in sys.modules),"
    " file=sys.stderr, flush=True))\n"
    + RUN_ARGV0)


def imported_by(*argv) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the watched modules one run of eprun imported."""
    result = subprocess.run([sys.executable, "-c", _IMPORTED, *map(str, argv)],
                            capture_output=True, text=True, timeout=120)
    return (result.returncode, result.stdout,
            set(filter(None, result.stderr.splitlines()[-1].split(","))))



def in_process(capfd, *argv) -> tuple[int, str, str]:
    """``eprun.main(argv)`` in this process, its streams captured by ``capfd``: (exit code,
    stdout, stderr). What was printed before the call (a library's own log) is dropped."""
    import eprun

    capfd.readouterr()
    # capfd hands Python streams that write to its files directly, past file descriptors 1
    # and 2: a real process's sys.stdout and sys.stderr write through them, which is where
    # eprun holds a command's chatter (and drops it after a failure).
    streams = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = (open(fd, "w", encoding="utf-8", errors="backslashreplace",
                                   closefd=False) for fd in (1, 2))
    try:
        code = eprun.main([str(word) for word in argv])
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = streams
    out, err = capfd.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def own_tmpdir(tmp_path_factory, monkeypatch):
    """Every test gets its own temporary folder, for itself (``tempfile``) and for every
    process it starts (``TMPDIR``), so no test sees another's leftovers. It sits beside the
    test's ``tmp_path``, not inside it, because tests list what ``tmp_path`` holds.
    ``monkeypatch`` restores both after the test."""
    import tempfile

    folder = str(tmp_path_factory.mktemp("tmpdir"))
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setattr(tempfile, "tempdir", folder)
    return folder


class _Done:
    """What ``in_process`` gave, as ``run_eprun``'s ``Result`` reads."""

    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    answer = Result.answer


def run_here(capfd, monkeypatch, *args: str, env: dict | None = None,
             cwd: str | None = None, prefix: list[str] | None = None):
    """``run_eprun`` without a process: ``main(argv)`` here, with ``env`` set and ``cwd`` the
    working folder for the call (a ``prefix``, another interpreter, still gets a process)."""
    if prefix is not None:
        return run_eprun(*args, env=env, cwd=cwd, prefix=prefix)
    with monkeypatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        if cwd is not None:
            patch.chdir(cwd)
        return _Done(*in_process(capfd, *args))


def succeeds(run):
    """``run`` (one way to run eprun) held to success: the parsed JSON answer."""
    def call(*args: str, **kwargs) -> dict:
        result = run(*args, **kwargs)
        assert result.code == 0, f"exit {result.code}: {result.stderr}"
        assert "Traceback" not in result.stderr
        return result.answer
    return call


def fails(run):
    """``run`` held to failure ``code``: empty stdout, one error line (returned)."""
    def call(code: int, *args: str, **kwargs) -> str:
        result = run(*args, **kwargs)
        assert result.code == code, f"exit {result.code}, wanted {code}: {result.stderr}"
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, f"expected one stderr line, got {result.stderr!r}"
        assert lines[0].startswith("eprun: error: ")
        return lines[0]
    return call


@pytest.fixture
def eprun(capfd, monkeypatch):
    """Run eprun with ARGS in this process (``main(argv)``); assert success and return the
    parsed JSON answer."""
    return succeeds(lambda *args, **kwargs: run_here(capfd, monkeypatch, *args, **kwargs))


@pytest.fixture
def eprun_fails(capfd, monkeypatch):
    """Run eprun with ARGS in this process expecting failure ``code``: empty stdout, one
    error line."""
    return fails(lambda *args, **kwargs: run_here(capfd, monkeypatch, *args, **kwargs))


@pytest.fixture
def run_eprun_here(capfd, monkeypatch):
    """``run_eprun`` without a process: ``main(argv)`` here, its exit code and streams in the
    same ``Result`` fields, with ``env`` set and ``cwd`` the working folder for the call."""
    return lambda *args, **kwargs: run_here(capfd, monkeypatch, *args, **kwargs)


@pytest.fixture
def eprun_process():
    """``eprun``, as ``python eprun.py ARGS`` in a process of its own: for what lives as long
    as a process (a plugin EP library registered, onnxruntime's log level)."""
    return succeeds(run_eprun)


@pytest.fixture
def eprun_fails_process():
    """``eprun_fails`` in a process of its own."""
    return fails(run_eprun)


@pytest.fixture(scope="session")
def lab_pair(tmp_path_factory):
    """A small fp32 chain (5 layers) and its QDQ quantization, built once per test run."""
    import models

    folder = tmp_path_factory.mktemp("lab")
    fp32 = folder / "fp32.onnx"
    int8 = folder / "int8.onnx"
    models.save(models.chain(features=8, widths=[12, 10, 10, 8, 6], seed=3), fp32)
    models.quantize(fp32, int8, seed=4)
    return fp32, int8


def one_error_line(result, code: int) -> str:
    """``result`` (a ``Result``) failed with ``code``: empty stdout and one ``eprun: error:``
    line on stderr, returned."""
    assert result.code == code, (result.code, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eprun: error: "), result.stderr
    return lines[0]


def weighty_chain(seed: int = 0, widths=(48, 48, 8)):
    """A chain whose weights are large enough (over 1 KB) to be left in the file by
    load_model."""
    import models

    return models.chain(features=40, widths=list(widths), seed=seed)


def save_external(model, folder, name: str, data: str) -> str:
    """``model`` saved as ``folder/name`` with every weight in the one file ``data`` beside it."""
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data, size_threshold=0)
    return path


@pytest.fixture
def external_pair(tmp_path, lab_pair):
    """The lab pair re-saved with every weight in an external data file."""
    import onnx

    fp32, int8 = lab_pair
    folder = tmp_path / "models"
    return (save_external(onnx.load(str(fp32)), folder, "fp32.onnx", "fp32.data"),
            save_external(onnx.load(str(int8)), folder, "int8.onnx", "int8.data"))
