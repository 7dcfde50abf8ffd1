"""Tests that hold whatever the environment: a per-test TMPDIR, block-buffered stdout, and a
kill that lands, for certain, while a staged file is open."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from conftest import EPRUN, PROGRAM, RUN_ARGV0, process_state, without_exposure_note

# -- a temporary folder of its own -------------------------------------------------------------


def test_every_test_has_its_own_temporary_folder(tmp_path, tmp_path_factory):
    folder = Path(os.environ["TMPDIR"])
    assert tempfile.gettempdir() == str(folder)
    assert folder.parent == tmp_path_factory.getbasetemp()  # not the machine's /tmp
    assert folder.name.startswith("tmpdir")
    assert folder != tmp_path
    assert os.listdir(folder) == []  # nothing from an earlier test
    with tempfile.NamedTemporaryFile() as handle:
        assert Path(handle.name).parent == folder
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert child.stdout.strip() == str(folder)  # processes the test starts inherit it
    assert list(tmp_path.iterdir()) == []  # and tmp_path itself stays the test's alone


# -- stdout stays one line, with a block-buffered stdout ---------------------------------------

NOISY = """\
import ctypes, os, sys
import onnxruntime
original = onnxruntime.InferenceSession.__init__
libc = ctypes.CDLL(None)
def noisy(self, *args, **kwargs):
    os.write(1, b'native write to fd 1\\n')
    libc.printf(b'buffered C stdio write\\n')
    libc.printf(b'C stdio without a newline')
    print('python print during session creation')
    original(self, *args, **kwargs)
onnxruntime.InferenceSession.__init__ = noisy
sys.argv = sys.argv[1:]
""" + RUN_ARGV0


def refuse(constant: str) -> None:
    raise AssertionError(f"non-strict JSON constant {constant}")


@pytest.mark.parametrize("argv", [
    ["providers", "@fp32", "FooExecutionProvider"], ["layers", "@fp32", "@int8", "1"],
    ["growth", "@fp32", "@int8", "1", "--local"], ["settings", "@int8", "1"],
    ["placement", "@int8", "DmlExecutionProvider"], ["check", "@fp32", "@int8"],
    ["report", "@fp32", "@int8", "--out-dir", "@report"],
], ids=lambda argv: argv[0] + ("_local" if "--local" in argv else ""))
def test_stdout_is_one_json_line_without_pythonunbuffered(lab_pair, tmp_path, argv):
    """A native library that writes straight to file descriptor 1, to C stdio (with and
    without a newline) and to print() while a session is made. With PYTHONUNBUFFERED unset and
    stdout a pipe, Python's and C's stdout buffers hold what they are given until flushed:
    whatever is held during the command must end on stderr, not after the answer on
    stdout."""
    fp32, int8 = lab_pair
    paths = {"@fp32": fp32, "@int8": int8, "@report": tmp_path / "report"}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", NOISY, str(EPRUN),
                           *(str(paths.get(arg, arg)) for arg in argv)],
                          check=False, capture_output=True, env=env, timeout=120)
    assert proc.returncode in ((0, 1) if argv[0] == "check" else (0,)), proc.stderr
    assert proc.stdout.count(b"\n") == 1, proc.stdout
    assert proc.stdout.endswith(b"}\n"), proc.stdout
    assert isinstance(json.loads(proc.stdout, parse_constant=refuse), dict)
    for text in (b"native write to fd 1", b"buffered C stdio write",
                 b"C stdio without a newline", b"python print during session creation"):
        assert text in proc.stderr, text


# -- a kill while the staged copy is open ------------------------------------------------------

# Runs eprun with os.fsync slowed down: the staged copy is written and open, not yet named,
# for as long as the test needs to look at it. NO_O_TMPFILE takes O_TMPFILE away, as on a
# system without it.
SLOW_SYNC = """\
import os, sys, time
real_fsync = os.fsync
def slow_fsync(fd):
    for _ in range(1200):  # short sleeps: a signal for the main thread is handled at once
        time.sleep(0.1)
    real_fsync(fd)
os.fsync = slow_fsync
if os.environ.get("NO_O_TMPFILE") and hasattr(os, "O_TMPFILE"):
    del os.O_TMPFILE
sys.argv = sys.argv[1:]
""" + RUN_ARGV0


def supports_unnamed_files(folder: Path) -> bool:
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return False
        raise
    return True


@contextlib.contextmanager
def output_folder(tmp_path: Path):
    """An empty folder for the output, on a filesystem with O_TMPFILE (tmpfs when the test's
    own filesystem lacks it, as overlayfs on older kernels does)."""
    folder = tmp_path / "out"
    folder.mkdir()
    if supports_unnamed_files(folder):
        yield folder
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        assert supports_unnamed_files(Path(shm)), "no filesystem with O_TMPFILE here"
        yield Path(shm)


def descriptors(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """fd -> (link target, mode, link count, size) of every open file of process ``pid``."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            info = os.stat(f"/proc/{pid}/fd/{fd}")
            found[fd] = (target, info.st_mode & 0o777, info.st_nlink, info.st_size)
    return found


def staged_file(proc: subprocess.Popen, folder: Path, size: int,
                timeout: float = 60.0) -> tuple[str, str]:
    """Poll /proc/<pid>/fd until a descriptor points into ``folder`` at a file of ``size``
    bytes (written in full, fsync not yet returned): (fd, link target)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for fd, (target, _, _, length) in descriptors(proc.pid).items():
            if target.startswith(f"{folder}/") and length == size:
                return fd, target
        time.sleep(0.002)
    raise AssertionError(f"no descriptor into {folder} within {timeout} s: "
                         f"{descriptors(proc.pid)}")


@contextlib.contextmanager
def slow_expose(model: Path, out: Path, **env: str) -> Iterator[subprocess.Popen]:
    """``eprun expose`` with a slow fsync; killed at the end whatever the test did."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SYNC, str(EPRUN), "expose", str(model),
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def stop_at_the_staged_copy(proc: subprocess.Popen, folder: Path, pattern: str, size: int,
                            links: int) -> None:
    """Wait for the staged copy to be complete, freeze eprun, and check (frozen) that the copy
    is open, matches ``pattern`` and has ``links`` names; eprun stays stopped."""
    fd, seen = staged_file(proc, folder, size)
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(proc.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert process_state(proc.pid) == "T"
    # frozen: what is checked now is what the kill will meet
    now = descriptors(proc.pid)
    assert now[fd][0] == seen, now
    assert re.fullmatch(pattern, seen), now
    assert now[fd][2:] == (links, size), now  # every byte written, and not yet named
    assert now[fd][1] == 0o666 & ~umask(), now


def umask() -> int:
    """This process's umask, which eprun inherits (read, not set: Linux 4.7+)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


def reference_copy(model: Path, tmp_path: Path) -> bytes:
    reference = tmp_path / "reference.onnx"
    proc = subprocess.run([*PROGRAM, "expose", str(model), str(reference)],
                          check=False, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = reference.read_bytes()
    reference.unlink()
    return data


def test_kill_9_while_the_unnamed_copy_is_open_leaves_nothing(lab_pair, tmp_path):
    model = lab_pair[0]
    expected = reference_copy(model, tmp_path)
    with output_folder(tmp_path) as folder:
        out = folder / "out.onnx"
        with slow_expose(model, out) as proc:
            # O_TMPFILE: a file in the output folder with no name, shown as '<folder>/#<inode>'
            stop_at_the_staged_copy(proc, folder, rf"{re.escape(str(folder))}/#\d+ \(deleted\)",
                                    len(expected), links=0)
            assert os.listdir(folder) == []  # not even a hidden name while it is written
            proc.kill()
            stdout, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert stdout == b""
        assert os.listdir(folder) == []  # no output, no temporary, no hidden file


def test_kill_9_leaves_an_existing_output_as_it_was(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    with output_folder(tmp_path) as folder:
        out = folder / "out.onnx"
        first = subprocess.run([*PROGRAM, "expose", str(int8), str(out)],
                               check=False, capture_output=True, timeout=120)
        assert first.returncode == 0, first.stderr
        before = out.read_bytes()
        expected = reference_copy(fp32, tmp_path)
        assert expected != before
        with slow_expose(fp32, out) as proc:
            stop_at_the_staged_copy(proc, folder, rf"{re.escape(str(folder))}/#\d+ \(deleted\)",
                                    len(expected), links=0)
            proc.kill()
            proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert os.listdir(folder) == ["out.onnx"]
        assert out.read_bytes() == before  # the old, complete model
        assert onnx.load(str(out)).graph.output  # and it loads


def test_sigterm_removes_a_named_temporary_where_there_is_no_o_tmpfile(lab_pair, tmp_path):
    """Without O_TMPFILE eprun stages into a hidden named file; SIGTERM must remove it."""
    model = lab_pair[0]
    expected = reference_copy(model, tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.onnx"
    with slow_expose(model, out, NO_O_TMPFILE="1") as proc:
        stop_at_the_staged_copy(proc, folder,
                                rf"{re.escape(str(folder))}/\.out\.onnx\.[^/]+\.tmp",
                                len(expected), links=1)
        assert len(os.listdir(folder)) == 1  # the hidden temporary, while eprun is stopped
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stdout == b""
    assert os.listdir(folder) == []


# -- nothing left in $HOME or $TMPDIR ----------------------------------------------------------

def test_nothing_is_left_in_home_or_tmpdir(lab_pair, tmp_path):
    """onnxruntime 1.32's telemetry writes a device id and a database under $HOME/.cache and a
    file in $TMPDIR on every session unless ORT_DISABLE_TELEMETRY is set: eprun sets it for
    itself (on older releases there is nothing to write, and the test holds as it is)."""
    fp32, int8 = lab_pair
    home, temporary = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temporary.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "ORT_DISABLE_TELEMETRY"}
    env.update(HOME=str(home), TMPDIR=str(temporary))
    codes = []
    for argv in (["settings", int8, "1"], ["layers", fp32, int8, "1"],
                 ["providers", fp32, "CPUExecutionProvider"],
                 ["layers", fp32, int8, "1", "--providers", "CUDAExecutionProvider"]):
        codes.append(subprocess.run([*PROGRAM, *map(str, argv)], env=env,
                                    capture_output=True, timeout=120).returncode)
    assert codes == [0, 0, 0, 4]  # they ran: a crash at start-up would write nothing either
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == [
        "home", "tmp"]


def test_strict_warnings_change_nothing(lab_pair):
    """Under PYTHONWARNINGS=error or PYTHONDEVMODE=1 the answer and the one error line stay as
    they are: eprun leaves no file unclosed (the held chatter was, a ResourceWarning)."""
    fp32, int8 = lab_pair
    for extra in ({"PYTHONWARNINGS": "error"}, {"PYTHONDEVMODE": "1"}):
        env = {**os.environ, **extra}
        ok = subprocess.run([*PROGRAM, "growth", str(fp32), str(int8), "1"],
                            env=env, capture_output=True, text=True, timeout=120)
        assert (ok.returncode, without_exposure_note(ok.stderr)) == (0, ""), extra
        assert json.loads(ok.stdout)["layer_count"] >= 2
        failed = subprocess.run([*PROGRAM, "layers", str(fp32),
                                 str(int8) + ".missing", "1"],
                                env=env, capture_output=True, text=True, timeout=120)
        assert failed.returncode == 3, extra
        assert failed.stdout == "" and len(failed.stderr.splitlines()) == 1, failed.stderr


def test_a_signal_removes_every_scratch_folder(lab_pair, tmp_path):
    """SIGTERM while placement and settings --explain have onnxruntime write into scratch
    folders of eprun's (a profile, an optimized model): nothing is left in TMPDIR."""
    import models
    from test_cmd_settings import wide_layers  # a model whose optimized graph rounds differently

    _, int8 = lab_pair
    wide = models.save(wide_layers(), tmp_path / "wide.onnx")
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        "import os, signal, sys\n"
        "import onnxruntime\n"
        "original = onnxruntime.InferenceSession.__init__\n"
        "def stopped(self, *args, **kwargs):\n"
        "    if any(name.startswith('eprun-') for name in os.listdir(os.environ['TMPDIR'])):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    original(self, *args, **kwargs)\n"
        "onnxruntime.InferenceSession.__init__ = stopped\n"
        "sys.argv = sys.argv[1:]\n"
        + RUN_ARGV0)
    for argv in (["placement", str(int8), "CPUExecutionProvider"],
                 ["settings", str(wide), "3", "--explain"]):
        folder = tmp_path / argv[0]
        folder.mkdir()
        result = subprocess.run([sys.executable, str(wrapper), str(EPRUN), *argv],
                                env={**os.environ, "TMPDIR": str(folder),
                                     # the wrapper imports onnxruntime before eprun can say
                                     "ORT_DISABLE_TELEMETRY": "1"},
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 128 + signal.SIGTERM, (argv, result.stderr)
        assert os.listdir(folder) == [], argv
