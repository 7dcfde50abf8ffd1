"""Layer 2, I/O safety: nothing is destroyed and nothing is left behind. Staging and commit
under kills and races, temporaries, paths that are links, FIFOs or under /dev and /proc, the
held chatter, eprun's own environment knobs, and the threat model's tests (issue 32).

The threat model: whoever wrote the model, planted a link in the output folder or runs a
second eprun beside this one, eprun never writes through a symbolic link (W1), chooses the
names it writes itself (W2), never hands out more permission than the user's umask and the
source allow (W3), replaces only what it wrote unless told ``--force`` (W4), and two runs into
one folder leave one run's set (W5). It runs no code from the working directory (R6), refuses a
model that changes under it (R7), leaves no process or scratch folder behind (R8), reads what
it was given only as far as it needs (R9), and every refusal is one clean line (C10, C11).

Every refusal here is the exit code, an empty stdout, exactly one ``eprun: error:`` line and no
traceback, with every file of the test's folder (victims included) left byte for byte, inode
and mode as it was. Every hostile folder is built inside the test's ``tmp_path``. Runs are
``main(argv)`` in this process unless what is tested lasts as long as a process (a kill, a
signal, a spawned worker)."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, IMPORT_EPRUN, PROGRAM, Result, one_error_line, own_code_runs, run_eprun
from onnx import TensorProto, helper, numpy_helper

import eprun as tool

SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


# -- how a run is judged -----------------------------------------------------------------------

def in_process(capfd, *argv) -> Result:
    """``eprun.main(argv)`` in this process: its exit code and what reached fds 1 and 2.
    ``sys.stdout`` and ``sys.stderr`` are the descriptors meanwhile, as in a process of its own
    (capfd otherwise writes Python's prints to its file directly, past eprun's hold on fd 2)."""
    capfd.readouterr()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        code = tool.main([str(arg) for arg in argv])
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = streams
    out, err = capfd.readouterr()
    return Result(subprocess.CompletedProcess(list(argv), code, out, err))


def refused(result: Result, code: int = 4) -> str:
    """A clean refusal: ``code``, nothing on stdout, one error line, no traceback and no
    internal error; returns the line."""
    assert result.code == code, (result.code, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eprun: error: "), result.stderr
    assert "internal error" not in lines[0]
    return lines[0]


def snapshot(root) -> dict:
    """Everything under ``root``, links not followed: each entry's mode and inode, and its
    bytes' digest (a file) or its target (a link)."""
    seen = {}
    for folder, folders, files in os.walk(root):
        for name in (*folders, *files):
            path = os.path.join(folder, name)
            status = os.lstat(path)
            if stat.S_ISLNK(status.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(status.st_mode):
                what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                what = None
            seen[os.path.relpath(path, root)] = (status.st_mode, status.st_ino, what)
    return seen


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of somebody else's that no eprun run may touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    path = folder / "secret.txt"
    path.write_bytes(b"precious, and not eprun's\n")
    path.chmod(0o640)
    return path


@pytest.fixture
def own_pair(lab_pair, tmp_path) -> tuple[Path, Path]:
    """Copies of the lab pair (written by onnx.save, not eprun) that a test may chmod or see
    overwritten."""
    folder = tmp_path / "models"
    folder.mkdir()
    copies = []
    for source in lab_pair:
        copies.append(folder / source.name)
        shutil.copyfile(source, copies[-1])
    return copies[0], copies[1]


# -- models whose weights live elsewhere ------------------------------------------------------

def external_model(folder: Path, location: str, data_at: Path | None = None,
                   seed: int = 2) -> Path:
    """``folder``/m.onnx, a 64-wide chain whose every initializer is external data at
    ``location``, one file written at ``data_at`` (default: where the location names)."""
    model = models.chain(features=64, widths=(64, 64, 64), seed=seed)
    blob = bytearray()
    for tensor in model.graph.initializer:
        raw = numpy_helper.to_array(tensor).tobytes()
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(len(blob))),
                           ("length", str(len(raw)))):
            tensor.external_data.add(key=key, value=value)
        blob += raw
    data_at = data_at if data_at is not None else folder / location
    data_at.parent.mkdir(parents=True, exist_ok=True)
    data_at.write_bytes(bytes(blob))
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def final_output(path, seed: int = 3):
    """The model's "y" on the contract input, from a session onnxruntime opens by path (so it
    finds the external data itself), optimizations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": models.contract_input(seed, 64)})[0]


def locations(path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {entry.value for tensor in model.graph.initializer
            for entry in tensor.external_data if entry.key == "location"}


# == W1 never through a symlink ================================================================

@pytest.mark.parametrize("leads_to", ["victim", "nothing"])
def test_expose_never_writes_through_an_output_link(capfd, lab_pair, tmp_path, victim,
                                                    leads_to):
    fp32, _ = lab_pair
    link = tmp_path / "out.onnx"
    target = victim if leads_to == "victim" else victim.parent / "planted.onnx"
    link.symlink_to(target)
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "expose", fp32, link))
    assert "symbolic link" in line
    assert snapshot(tmp_path) == before
    assert not (victim.parent / "planted.onnx").exists()


@pytest.mark.parametrize("name", ["growth.json", "ep_report.md"])
def test_report_never_writes_through_a_deliverable_link(capfd, lab_pair, tmp_path, victim,
                                                        name):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "report", fp32, int8, "--out-dir", out))
    assert "symbolic link" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("leads_to", ["victim", "nothing"])
def test_a_golden_file_is_never_written_through_a_link(capfd, lab_pair, tmp_path, victim,
                                                       leads_to):
    fp32, _ = lab_pair
    link = tmp_path / "golden.npz"
    link.symlink_to(victim if leads_to == "victim" else victim.parent / "planted.npz")
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "check", fp32, fp32, "--save-outputs", link))
    assert "symbolic link" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("at_stage", ["a file", "nothing"])
def test_a_link_planted_between_stage_and_commit_is_replaced_itself(tmp_path, victim,
                                                                    at_stage):
    """The race: the name is a regular file (or free) when eprun stages, and a link to a victim
    by the time it commits. The link itself is replaced, never its target."""
    path = tmp_path / "out.bin"
    if at_stage == "a file":
        path.write_bytes(b"old")
    victim_before = snapshot(victim.parent)
    staged = tool.stage(b"new", str(path))
    if path.exists():
        path.unlink()
    path.symlink_to(victim)
    tool.commit([staged])
    assert not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode)
    assert path.read_bytes() == b"new"
    assert snapshot(victim.parent) == victim_before
    assert sorted(os.listdir(tmp_path)) == ["out.bin", "victim"]  # no temporary left


# == W2 external data: eprun chooses the written names =========================================

@pytest.mark.parametrize("missing", [(), ("copy_file_range",), ("copy_file_range", "sendfile")],
                         ids=["copy_file_range", "sendfile", "slices"])
def test_a_copy_holds_every_byte_whichever_way_the_kernel_offers(tmp_path, monkeypatch,
                                                                  missing):
    """External data is copied by copy_file_range where the kernel has it, else sendfile,
    else read and written in slices: the same bytes every way (here, several slices)."""
    data = os.urandom(3 << 20) + b"the end"
    (tmp_path / "source").write_bytes(data)
    for name in missing:
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.setattr(tool, "_COPY_SLICE", 1 << 20)
    with open(tmp_path / "source", "rb") as source, open(tmp_path / "copy", "wb") as copy:
        copy.write(b"head ")
        tool._copy_bytes(source.fileno(), copy)
    assert (tmp_path / "copy").read_bytes() == b"head " + data


def test_exposed_weights_get_eprun_s_own_name(capfd, tmp_path):
    model = external_model(tmp_path / "model", "sub/w.bin")
    out = tmp_path / "out"
    out.mkdir()
    result = in_process(capfd, "expose", model, out / "exposed.onnx")
    assert result.code == 0, result.stderr
    assert sorted(os.listdir(out)) == ["exposed.onnx", "exposed.onnx.data"]
    assert locations(out / "exposed.onnx") == {"exposed.onnx.data"}
    np.testing.assert_array_equal(final_output(out / "exposed.onnx"), final_output(model))
    entries = result.answer["external_data"]
    assert entries and all(entry["file"] == str(out / "exposed.onnx.data") for entry in entries)


def test_a_location_naming_a_hidden_folder_creates_none(capfd, tmp_path):
    folder = tmp_path / "model"
    model = external_model(folder, ".ssh/authorized_keys")
    assert (folder / ".ssh" / "authorized_keys").is_file()
    out = tmp_path / "out"
    out.mkdir()
    in_process(capfd, "expose", model, out / "exposed.onnx")
    assert not (out / ".ssh").exists()
    assert set(os.listdir(out)) <= {"exposed.onnx", "exposed.onnx.data"}


@pytest.mark.parametrize("command", ["expose", "layers", "settings"])
def test_weights_behind_a_link_out_of_the_folder_are_refused(capfd, tmp_path, command):
    outside = tmp_path / "outside"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    model = external_model(folder, "sub/w.bin", data_at=outside / "w.bin")
    out = tmp_path / "out"
    out.mkdir()
    argv = {"expose": ["expose", model, out / "exposed.onnx"],
            "layers": ["layers", model, model, "1"],
            "settings": ["settings", model, "1"]}[command]
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, *argv))
    assert "sub/w.bin" in line and "outside" in line
    assert snapshot(tmp_path) == before


def test_a_link_at_the_data_file_s_name_is_refused(capfd, tmp_path, victim):
    model = external_model(tmp_path / "model", "w.bin")
    out = tmp_path / "out"
    out.mkdir()
    (out / "exposed.onnx.data").symlink_to(victim)
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "expose", model, out / "exposed.onnx"))
    assert "symbolic link" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["expose", "layers", "growth", "settings", "check",
                                     "placement"])
def test_a_location_with_a_nul_byte_is_one_clean_line(capfd, tmp_path, command):
    folder = tmp_path / "model"
    model = external_model(folder, "w\x00.bin", data_at=folder / "w.bin")
    argv = {"expose": ["expose", model, tmp_path / "exposed.onnx"],
            "layers": ["layers", model, model, "1"],
            "growth": ["growth", model, model, "1"],
            "settings": ["settings", model, "1"],
            "check": ["check", model, model],
            "placement": ["placement", model, "CPUExecutionProvider"]}[command]
    before = snapshot(tmp_path)
    refused(in_process(capfd, *argv))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["absolute", "parent"])
@pytest.mark.parametrize("command", ["expose", "layers", "settings"])
def test_reading_stays_inside_the_model_s_folder(capfd, tmp_path, where, command):
    folder = tmp_path / "model"
    folder.mkdir()
    data = tmp_path / "x"  # a real file, so the refusal is not "missing"
    model = external_model(folder, str(data) if where == "absolute" else "../x", data_at=data)
    argv = {"expose": ["expose", model, tmp_path / "exposed.onnx"],
            "layers": ["layers", model, model, "1"],
            "settings": ["settings", model, "1"]}[command]
    before = snapshot(tmp_path)
    assert "outside" in refused(in_process(capfd, *argv))  # on releases that do not confine
    assert snapshot(tmp_path) == before


# == W3 mode bits ===============================================================================

def test_a_copied_data_file_loses_setuid_setgid_and_sticky(capfd, tmp_path):
    assert os.geteuid() == 0  # root keeps special bits on its own writes: the case that matters
    model = external_model(tmp_path / "model", "w.bin")
    data = tmp_path / "model" / "w.bin"
    data.chmod(0o6755)
    out = tmp_path / "out"
    out.mkdir()
    with umask(0o022):
        result = in_process(capfd, "expose", model, out / "exposed.onnx")
    assert result.code == 0, result.stderr
    copies = [entry["file"] for entry in result.answer["external_data"]]
    assert copies
    for copy in copies:
        mode = mode_of(copy)
        assert mode & SPECIAL_BITS == 0, oct(mode)
        assert mode & ~(0o666 & ~0o022) == 0, oct(mode)
        assert mode & ~0o6755 == 0, oct(mode)


def test_a_private_model_gives_a_private_exposed_copy(capfd, own_pair, tmp_path):
    assert os.geteuid() == 0
    fp32, _ = own_pair
    fp32.chmod(0o600)
    with umask(0o022):
        result = in_process(capfd, "expose", fp32, tmp_path / "exposed.onnx")
    assert result.code == 0, result.stderr
    assert mode_of(tmp_path / "exposed.onnx") == 0o600


@pytest.mark.parametrize("model_mode, mask, wanted", [
    pytest.param(0o600, 0o022, 0o600, id="models-0600-umask-022"),
    pytest.param(0o644, 0o022, 0o644, id="models-0644-umask-022"),
    pytest.param(0o644, 0o077, 0o600, id="models-0644-umask-077")])
def test_report_files_are_no_more_open_than_the_models_and_the_umask(
        capfd, own_pair, tmp_path, model_mode, mask, wanted):
    assert os.geteuid() == 0
    for model in own_pair:
        model.chmod(model_mode)
    out = tmp_path / "out"
    with umask(mask):
        result = in_process(capfd, "report", *own_pair, "--out-dir", out)
    assert result.code == 0, result.stderr
    assert os.listdir(out)
    assert {name: oct(mode_of(out / name)) for name in os.listdir(out)} == {
        name: oct(wanted) for name in os.listdir(out)}


def test_a_golden_file_has_no_special_bits_and_keeps_to_the_umask(capfd, own_pair, tmp_path):
    assert os.geteuid() == 0
    fp32, _ = own_pair
    fp32.chmod(0o6755)
    golden = tmp_path / "golden.npz"
    with umask(0o027):
        result = in_process(capfd, "check", fp32, fp32, "--save-outputs", golden)
    assert result.code == 0, result.stderr
    mode = mode_of(golden)
    assert mode & SPECIAL_BITS == 0, oct(mode)
    assert mode & ~(0o666 & ~0o027) == 0, oct(mode)


# == W4 "not written by eprun" means it =========================================================

def test_expose_onto_the_users_fp32_model_is_refused_as_swapped(capfd, own_pair):
    fp32, int8 = own_pair
    before, listed = fp32.read_bytes(), snapshot(fp32.parent)
    line = refused(in_process(capfd, "expose", int8, fp32))
    assert "--force" in line and "swapped" in line
    assert snapshot(fp32.parent) == listed
    forced = in_process(capfd, "expose", int8, fp32, "--force")
    assert forced.code == 0, forced.stderr
    assert fp32.read_bytes() != before
    written = onnx.load(str(fp32))
    assert "QuantizeLinear" in {node.op_type for node in written.graph.node}  # int8's copy


def test_expose_replaces_its_own_output_and_marks_it(capfd, lab_pair, tmp_path):
    fp32, _ = lab_pair
    out = tmp_path / "exposed.onnx"
    for _ in range(2):
        result = in_process(capfd, "expose", fp32, out)
        assert result.code == 0, result.stderr
    marks = {entry.key: entry.value for entry in onnx.load(str(out)).metadata_props}
    assert marks.get("eprun")


def test_expose_refuses_any_other_onnx_model_without_force(capfd, lab_pair, tmp_path):
    fp32, _ = lab_pair
    out = models.save(models.ops_graph(["Relu", "Abs"]), tmp_path / "mine.onnx")
    before = snapshot(tmp_path)
    refused(in_process(capfd, "expose", fp32, out))
    assert snapshot(tmp_path) == before
    forced = in_process(capfd, "expose", fp32, out, "--force")
    assert forced.code == 0, forced.stderr
    assert {entry.key for entry in onnx.load(str(out)).metadata_props} >= {"eprun"}


def test_report_refuses_a_users_model_at_a_deliverable_path(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    out.mkdir()
    models.save(models.ops_graph(["Relu"]), out / "fp32_exposed.onnx")
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "report", fp32, int8, "--out-dir", out))
    assert "fp32_exposed.onnx" in line
    assert snapshot(tmp_path) == before
    forced = in_process(capfd, "report", fp32, int8, "--out-dir", out, "--force")
    assert forced.code == 0, forced.stderr


def test_report_refuses_pretty_printed_json_that_only_looks_like_its_own(capfd, lab_pair,
                                                                         tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    out.mkdir()
    mine = {"seed": 0, "layer_count": 2, "rel_error": [0.5, 1.5], "ratios": [3.0],
            "monotone": True, "total_growth": 3.0, "max_ratio": 3.0}
    (out / "growth.json").write_text(json.dumps(mine, indent=2) + "\n")
    before = snapshot(tmp_path)
    refused(in_process(capfd, "report", fp32, int8, "--out-dir", out))
    assert snapshot(tmp_path) == before


def test_a_second_report_replaces_its_own_set_without_force(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    for seed in ("1", "2"):
        result = in_process(capfd, "report", fp32, int8, "--out-dir", out, "--seed", seed)
        assert result.code == 0, result.stderr
    assert json.loads((out / "growth.json").read_text())["seed"] == 2


# == W5 two runs, one folder ====================================================================

def report_command(fp32, int8, out, seed: int) -> list[str]:
    return [*PROGRAM, "report", str(fp32), str(int8), "--out-dir", str(out),
            "--seed", str(seed)]


# eprun with a pause after it names growth.json: a commit slow enough for another run's to
# land in the middle of it, unless the folder is held for the whole set
PAUSED_AFTER_GROWTH = """
import os, sys, time
sys.argv = [sys.argv[1]] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import eprun
def pausing(real):
    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        if len(args) > 1 and os.path.basename(os.fsdecode(args[1])) == "growth.json":
            time.sleep(1.5)
        return result
    return call
os.link, os.replace, os.rename = pausing(os.link), pausing(os.replace), pausing(os.rename)
sys.exit(eprun.main())
"""


def test_two_reports_into_one_folder_leave_one_run_s_set(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "shared"
    out.mkdir()
    slow = report_command(fp32, int8, out, 1)
    slow[:len(PROGRAM)] = [sys.executable, "-c", PAUSED_AFTER_GROWTH, str(EPRUN)]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for argv in (slow, report_command(fp32, int8, out, 2))]
    finished = [run.communicate(timeout=60) for run in runs]
    for run, (_, err) in zip(runs, finished):
        assert run.returncode == 0, err
    files = {os.path.basename(path) for path in json.loads(finished[0][0])["files"]}
    assert set(os.listdir(out)) == files  # no temporary, no stray file
    seeds = {name: json.loads((out / name).read_text())["seed"]
             for name in ("growth.json", "settings.json")}
    assert seeds["growth.json"] == seeds["settings.json"], seeds
    assert seeds["growth.json"] in (1, 2)


def blocked_on_a_lock(process: subprocess.Popen, timeout: float) -> bool:
    """Does ``process`` come to wait for a lock (the kernel lists it as a waiter, ``->``, in
    /proc/locks) before it ends or ``timeout`` seconds pass?"""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            if any(line.split()[1] == "->" and str(process.pid) in line.split()[2:6]
                   for line in locks if len(line.split()) > 5):
                return True
        time.sleep(0.05)
    return False


def test_a_report_waits_while_another_holds_the_folder(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "held"
    out.mkdir()
    holder = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        run = subprocess.Popen(report_command(fp32, int8, out, 1), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        waited = blocked_on_a_lock(run, timeout=60)
        listing = os.listdir(out)
        fcntl.flock(holder, fcntl.LOCK_UN)
    finally:
        os.close(holder)
    out_text, err = run.communicate(timeout=60)
    assert waited, f"report did not wait for the lock (exit {run.returncode}): {err}"
    assert listing == []
    assert run.returncode == 0, err
    assert "Traceback" not in err
    assert f"eprun: note: waiting for another eprun writing into {str(out)!r}" in err
    assert set(os.listdir(out)) == {os.path.basename(path)
                                    for path in json.loads(out_text)["files"]}


# == R6 no code from the working directory, R8 nothing left behind ==============================

@pytest.fixture(scope="module")
def sensitivity_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A named chain and its QDQ quantization: sensitivity spreads its units over workers."""
    folder = tmp_path_factory.mktemp("sensitivity")
    model = models.chain(features=8, widths=(12, 10, 10, 8, 6), seed=3, gemm_layers=(2,))
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}{index}"
    fp32 = models.save(model, folder / "f.onnx")
    int8 = models.quantize(fp32, folder / "q.onnx", seed=1, rows=4)
    return fp32, int8


def sensitivity_argv(pair) -> list[str]:
    return [*PROGRAM, "sensitivity", str(pair[0]), str(pair[1]), "5",
            "--max-units", "2", "--jobs", "2"]


def environment(pid: int) -> list[bytes]:
    """The environment process ``pid`` started with (``NAME=value`` each); empty once it is
    gone."""
    try:
        return Path("/proc", str(pid), "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def command_line(pid: int) -> bytes:
    """Process ``pid``'s command line (its words NUL-separated); empty once it is gone."""
    try:
        return Path("/proc", str(pid), "cmdline").read_bytes()
    except OSError:
        return b""


def tagged(tag: str) -> list[int]:
    """The processes alive whose environment holds ``EPRUN_TEST_TAG=tag``."""
    wanted = f"EPRUN_TEST_TAG={tag}".encode()
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and wanted in environment(int(entry))]


def start_tagged(argv: list[str], tag: str, cwd=None, env: dict | None = None):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env={**os.environ, **(env or {}), "EPRUN_TEST_TAG": tag})


def wait_for_a_child(process, tag: str) -> bool:
    """Wait until a process other than ``process`` carries the tag (a worker); False if
    ``process`` ended first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if any(pid != process.pid for pid in tagged(tag)):
            return True
        time.sleep(0.005)
    return False


def gone_within(tag: str, seconds: float) -> list[int]:
    """The tagged processes still alive after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    alive = tagged(tag)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = tagged(tag)
    return alive


def test_workers_run_no_module_from_the_working_directory_nor_pythonpath(sensitivity_pair,
                                                                         tmp_path):
    """multiprocessing starts a worker as ``python -c ...``, which would put the working
    directory first on its path and honour ``PYTHON*`` variables (a ``sitecustomize`` on
    PYTHONPATH runs in every process Python starts): in a worker neither happens."""
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("copyreg", "numpy", "onnx"):
        (cwd / f"{name}.py").write_text(f"open({str(markers / name)!r}, 'w').write('ran')\n")
    path = tmp_path / "path"
    path.mkdir()
    (path / "sitecustomize.py").write_text(  # eprun itself runs it: only a worker's counts
        "import sys\nif '--multiprocessing-fork' in sys.argv:\n"
        f"    open({str(markers / 'sitecustomize')!r}, 'w').write('ran')\n")
    tag = uuid.uuid4().hex
    run = start_tagged(sensitivity_argv(sensitivity_pair), tag, cwd=cwd,
                       env={"PYTHONPATH": str(path)})
    worked = wait_for_a_child(run, tag)
    out, err = run.communicate(timeout=60)
    assert worked, "no worker process was started"
    assert os.listdir(markers) == [], "a module from the working directory or PYTHONPATH ran"
    assert run.returncode == 0, err
    assert json.loads(out)["units"]


@pytest.mark.parametrize(("user", "workers"), [(None, b"1"), (b"3", b"3")])
def test_workers_run_numpys_blas_on_one_thread_when_eprun_is_called_from_python(
        sensitivity_pair, user, workers):
    """From Python (main), in a process that loaded numpy before eprun (its BLAS keeps its
    threads), the worker processes start with OPENBLAS_NUM_THREADS=1, as eprun's own process
    runs (an idle OpenBLAS thread spins on the core the next worker computes on); a user's
    setting stays."""
    tag = uuid.uuid4().hex
    script = "import numpy\n" + IMPORT_EPRUN + "sys.exit(eprun.main(sys.argv[1:]))"
    env = {name: value for name, value in os.environ.items() if name != "OPENBLAS_NUM_THREADS"}
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user.decode()
    argv = sensitivity_argv(sensitivity_pair)[len(PROGRAM):]
    run = subprocess.Popen([sys.executable, "-c", script, *argv],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**env, "EPRUN_TEST_TAG": tag})
    settings: dict = {}
    deadline = time.monotonic() + 60
    # a worker is counted once it runs multiprocessing's spawn_main: until its exec, a child
    # just forked shows the environment its parent started with
    while run.poll() is None and time.monotonic() < deadline and \
            not any(pid != run.pid for pid in settings):
        for pid in tagged(tag):
            environ, command = environment(pid), command_line(pid)
            if environ and (pid == run.pid or b"--multiprocessing-fork" in command):
                settings[pid] = [entry for entry in environ
                                 if entry.startswith(b"OPENBLAS_NUM_THREADS=")]
        time.sleep(0.005)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert json.loads(out)["units"]
    expected = [] if user is None else [b"OPENBLAS_NUM_THREADS=" + user]
    assert settings.pop(run.pid) == expected  # the caller's own process: as it was
    assert settings, "no worker process was started"
    assert all(found == [b"OPENBLAS_NUM_THREADS=" + workers] for found in settings.values())


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_ends_every_worker_and_leaves_no_scratch(sensitivity_pair, own_tmpdir,
                                                          signum, code):
    tag = uuid.uuid4().hex
    run = start_tagged(sensitivity_argv(sensitivity_pair), tag)
    assert wait_for_a_child(run, tag), "no worker process was started"
    run.send_signal(signum)
    out, err = run.communicate(timeout=60)
    assert run.returncode == code, err
    assert out == ""
    assert gone_within(tag, 10) == []
    assert [name for name in os.listdir(own_tmpdir) if name.startswith("eprun")] == []


def test_what_a_kill_leaves_is_swept_by_the_next_run(sensitivity_pair, own_tmpdir, tmp_path):
    scratch = Path(own_tmpdir)
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead, live = ended.pid, os.getpid()
    elsewhere = tmp_path / "linked"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    kept = [f"eprun-{live}-x", f"eprun-sensitivity-{live}-x", f"my-eprun-sensitivity-{dead}-x"]
    for name in kept:
        (scratch / name).mkdir()
        (scratch / name / "keep").write_text("mine")
    links = ["eprun-1-x", f"eprun-sensitivity-{dead}-x"]
    for name in links:
        (scratch / name).symlink_to(elsewhere, target_is_directory=True)
    decoys = snapshot(scratch)
    names = set(os.listdir(scratch))

    tag = uuid.uuid4().hex
    run = start_tagged(sensitivity_argv(sensitivity_pair), tag)
    assert wait_for_a_child(run, tag), "no worker process was started"
    run.kill()
    run.communicate(timeout=60)
    assert gone_within(tag, 10) == []
    left = set(os.listdir(scratch)) - names
    assert any(name.startswith("eprun-") for name in left), left  # the kill left its scratch

    fp32, int8 = sensitivity_pair
    again = run_eprun("sensitivity", fp32, int8, "5", "--max-units", "1", "--jobs", "1")
    assert again.code == 0, again.stderr  # a run of no worker processes sweeps it too
    assert set(os.listdir(scratch)) == names
    assert snapshot(scratch) == decoys
    assert (elsewhere / "keep").read_text() == "mine"


def test_a_folder_name_that_is_not_utf8_under_the_c_locale(lab_pair, tmp_path):
    fp32, _ = lab_pair
    folder = os.fsencode(tmp_path) + b"/models-\xff"
    os.mkdir(folder)
    model = folder + b"/fp32.onnx"
    shutil.copyfile(fp32, model)
    before = snapshot(tmp_path)
    proc = subprocess.run([*PROGRAM, "settings", model, "1"],
                          capture_output=True, timeout=120, env={**os.environ, "LC_ALL": "C"})
    err = proc.stderr.decode("utf-8", "backslashreplace")
    assert proc.returncode in (0, 4), err
    for word in ("internal error", "TypeError", "Traceback"):
        assert word not in err
    if proc.returncode == 0:
        assert len(proc.stdout.splitlines()) == 1
        json.loads(proc.stdout)
    else:
        refused(Result(subprocess.CompletedProcess([], 4, proc.stdout.decode(), err)))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("value, traceback", [
    ("0", False), ("no", False), ("false", False), ("off", False), ("", False), ("1", True)])
def test_eprun_debug_takes_words_for_no(capfd, monkeypatch, tmp_path, value, traceback):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model at all")
    monkeypatch.setenv("EPRUN_DEBUG", value)
    before = snapshot(tmp_path)
    result = in_process(capfd, "layers", broken, broken, "1")
    assert result.code == 4 and result.stdout == ""
    if traceback:
        assert "Traceback" in result.stderr
    else:
        refused(result)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("renamed", [b"relu_node", b"hidden_tensor"])
def test_placement_of_names_that_are_not_utf8_is_one_clean_line(capfd, tmp_path, renamed):
    nodes = [helper.make_node("Relu", ["x"], ["hidden_tensor"], name="relu_node"),
             helper.make_node("Abs", ["hidden_tensor"], ["y"], name="abs_node")]
    model = models.finish(nodes, [models.float_input("x", 4)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    serialized = model.SerializeToString()
    patched = renamed[:4] + b"\xff" + renamed[5:]  # the same length: the message stays valid
    assert serialized.count(renamed) >= 1
    path = tmp_path / "names.onnx"
    path.write_bytes(serialized.replace(renamed, patched))
    before = snapshot(tmp_path)
    result = in_process(capfd, "placement", path, "CPUExecutionProvider")
    if renamed == b"hidden_tensor":  # no name placement reports: the answer stands
        assert result.code == 0, result.stderr
        assert [node["name"] for node in result.answer["nodes"]] == ["relu_node", "abs_node"]
    else:
        refused(result)
    assert snapshot(tmp_path) == before


def test_report_sensitivity_with_a_full_disk_is_an_error(capfd, monkeypatch, lab_pair,
                                                         tmp_path, own_tmpdir):
    """Writing the requantizer's scratch copy of the fp32 model fails for want of space: the
    report fails, instead of leaving the section out with a note."""
    fp32, int8 = lab_pair
    real_save = onnx.save

    def full_disk(proto, f, *args, **kwargs):
        target = os.fspath(getattr(f, "name", f)) if not isinstance(f, int) else ""
        if isinstance(target, str) and target.startswith(own_tmpdir):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(proto, f, *args, **kwargs)

    monkeypatch.setattr(onnx, "save", full_disk)
    monkeypatch.setattr(onnx, "save_model", full_disk)
    out = tmp_path / "report"
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "report", fp32, int8, "--out-dir", out, "--sensitivity"))
    assert "No space left" in line
    assert snapshot(tmp_path) == before and not out.exists()


# == C11 ========================================================================================

def test_a_bad_progress_delay_is_a_warning_not_a_failure(capfd, monkeypatch, lab_pair):
    fp32, int8 = lab_pair
    monkeypatch.setenv("EPRUN_PROGRESS_AFTER", "abc")
    result = in_process(capfd, "layers", fp32, int8, "1")
    assert result.code == 0, result.stderr
    assert result.answer["layer_count"] == 6
    warnings = [line for line in result.stderr.splitlines()
                if line.startswith("eprun: warning:")]
    assert warnings and any("EPRUN_PROGRESS_AFTER" in line for line in warnings), result.stderr


def test_a_hidden_name_a_kill_left_is_removed_by_the_next_replacement(capfd, lab_pair, tmp_path):
    """Only the instant between a hidden name and its rename can leave a `.name.pid.n.tmp`:
    the next eprun that replaces the same file removes those whose process is gone, and
    leaves a live process's (and anything not of that form) alone."""
    fp32, _ = lab_pair
    out = tmp_path / "exposed.onnx"
    assert in_process(capfd, "expose", fp32, out).code == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    left = tmp_path / f".exposed.onnx.{dead}.0.tmp"
    live = tmp_path / f".exposed.onnx.{os.getpid()}.7.tmp"
    other = tmp_path / ".exposed.onnx.notes"
    fresh = tmp_path / f".exposed.onnx.{dead}.1.tmp"  # a moment old: maybe being renamed
    for path in (left, live, other, fresh):
        path.write_bytes(b"half")
        if path is not fresh:
            os.utime(path, (time.time() - 120, time.time() - 120))
    assert in_process(capfd, "expose", fp32, out).code == 0
    assert not left.exists() and live.exists() and other.exists() and fresh.exists()
    fresh.unlink()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["exposed.onnx", live.name, other.name])


def test_a_full_disk_is_one_plain_line(capfd, monkeypatch, lab_pair, tmp_path):
    """ENOSPC where eprun did not expect it (here: writing a golden file) is said as what it
    is, not as an internal error."""
    fp32, int8 = lab_pair

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/somewhere/full")

    monkeypatch.setattr(tool, "save_golden", full)
    line = refused(in_process(capfd, "check", fp32, int8, "--save-outputs",
                              tmp_path / "golden.npz"))
    assert line == ("eprun: error: No space left on device writing '/somewhere/full'; free "
                    "some space (or set TMPDIR to a folder with room) and run again")


# == what a hostile review found ================================================================

def test_a_folder_of_the_users_named_like_scratch_is_left_alone(capfd, lab_pair, own_tmpdir):
    """Only a folder holding eprun's marker, which no live eprun holds locked, is swept: a
    report folder of the user's called eprun-report-2025-06 in TMPDIR is not eprun's."""
    _, int8 = lab_pair
    mine = Path(own_tmpdir) / "eprun-report-2025-06"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    result = in_process(capfd, "placement", int8, "CPUExecutionProvider")  # makes scratch
    assert result.code == 0, result.stderr
    assert (mine / "notes.txt").read_text() == "the user's"
    assert [path.name for path in Path(own_tmpdir).iterdir()] == [mine.name]


def test_every_file_of_a_set_goes_into_the_folder_first_opened(tmp_path):
    """The folder renamed away and another put at its path after staging began: the staged
    files land in the folder that was opened, never in the one now at the path."""
    real = tmp_path / "out"
    real.mkdir()
    folder = tool.open_folder(str(real))
    try:
        first = tool.stage(b"one", str(real / "a.json"), folder=folder)
        real.rename(tmp_path / "moved")
        (tmp_path / "out").mkdir()  # someone else's folder at the old path
        second = tool.stage(b"two", str(real / "b.json"), folder=folder)
        tool.commit([first, second])
    finally:
        os.close(folder)
    assert sorted(path.name for path in (tmp_path / "moved").iterdir()) == ["a.json", "b.json"]
    assert list((tmp_path / "out").iterdir()) == []


def test_a_model_another_tool_made_from_eprun_s_output_is_not_eprun_s(capfd, lab_pair,
                                                                      tmp_path):
    """A quantizer keeps the metadata of the model it reads: the mark names the graph it was
    written with, so a derived model is the user's and is not replaced without --force."""
    from onnxruntime.quantization import quantize_dynamic

    fp32, int8 = lab_pair
    exposed = tmp_path / "exposed.onnx"
    assert in_process(capfd, "expose", fp32, exposed).code == 0
    derived = tmp_path / "derived.onnx"
    quantize_dynamic(str(exposed), str(derived))
    assert any(entry.key == "eprun" for entry in onnx.load(str(derived)).metadata_props)
    before = derived.read_bytes()
    assert "--force" in refused(in_process(capfd, "expose", int8, derived))
    assert derived.read_bytes() == before


def test_a_fifo_at_a_data_file_s_name_is_refused_before_anything_is_written(capfd, tmp_path):
    model = external_model(tmp_path / "model", "w.bin")
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "exposed.onnx.data")
    assert "not a regular file" in refused(in_process(capfd, "expose", model,
                                                      out / "exposed.onnx"))
    assert sorted(path.name for path in out.iterdir()) == ["exposed.onnx.data"]
    assert stat.S_ISFIFO(os.lstat(out / "exposed.onnx.data").st_mode)


def test_a_golden_file_is_no_more_open_than_the_inputs_it_holds(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    inputs = tmp_path / "private.npz"
    np.savez(inputs, x=models.contract_input(1, 8))
    inputs.chmod(0o600)
    golden = tmp_path / "golden.npz"
    with umask(0o022):
        result = in_process(capfd, "check", fp32, int8, "--inputs", inputs, "--save-outputs",
                            golden)
    assert result.code in (0, 1), result.stderr
    assert mode_of(golden) == 0o600


def test_a_report_in_a_folder_whose_name_is_not_utf8(lab_pair, tmp_path):
    fp32, int8 = lab_pair
    folder = os.fsencode(tmp_path) + b"/models-\xff"
    os.mkdir(folder)
    for source in (fp32, int8):
        shutil.copyfile(source, folder + b"/" + os.fsencode(source.name))
    proc = subprocess.run([*PROGRAM, "report", folder + b"/fp32.onnx",
                           folder + b"/int8.onnx", "--out-dir", folder + b"/report"],
                          capture_output=True, timeout=120, env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "backslashreplace")
    report = (folder + b"/report/ep_report.md")
    assert os.fsencode(folder) in Path(os.fsdecode(report)).read_bytes()


def test_exposing_nested_external_weights_elsewhere_is_refused(capfd, tmp_path):
    """A Constant whose value is external data is not among the initializers eprun copies:
    written elsewhere its location would be read in the output's folder. Refused there; in
    the model's own folder the copy reads the same file and works."""
    folder = tmp_path / "model"
    folder.mkdir()
    value = np.arange(8, dtype=np.float32)
    (folder / "c.bin").write_bytes(value.tobytes())
    tensor = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[8],
                         data_location=TensorProto.EXTERNAL)
    for key, text in (("location", "c.bin"), ("offset", "0"), ("length", "32")):
        tensor.external_data.add(key=key, value=text)
    nodes = [helper.make_node("Constant", [], ["c"], name="const", value=tensor),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    model = models.finish(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "out").mkdir()
    line = refused(in_process(capfd, "expose", folder / "m.onnx", tmp_path / "out" / "e.onnx"))
    assert "'c'" in line and "Constant" in line
    assert list((tmp_path / "out").iterdir()) == []
    assert in_process(capfd, "expose", folder / "m.onnx", folder / "e.onnx").code == 0


@pytest.mark.parametrize(("seconds", "said"), [
    (0.2, "1 s"), (8.4, "8 s"), (89, "89 s"), (95, "2 min"), (3599, "1 h 0 min"),
    (3900, "1 h 5 min")])
def test_a_wait_is_said_as_a_person_reads_it(seconds, said):
    assert tool._duration(seconds) == said


def test_the_held_file_takes_what_native_code_writes():
    store = tool._unnamed_file()
    try:
        os.write(store.fileno(), b"native\n")
        store.write(b"python\n")
        store.flush()
        store.seek(0)
        assert store.read() == b"native\npython\n"
        assert not os.get_inheritable(store.fileno())
    finally:
        store.close()


def digest(*paths) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


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


@pytest.mark.parametrize("argv", [["check", "@m", "@m", "--save-outputs", "@data"],
                                  ["layers", "@m", "@m", "1", "--save-boundaries", "@data"]])
def test_a_golden_file_is_never_written_onto_the_models_weights(run_eprun_here, external, argv):
    model, data = external
    before = digest(model, data)
    line = one_error_line(run_eprun_here(*[{"@m": model, "@data": data}.get(word, word)
                                           for word in argv]), 2)
    assert f"refusing to overwrite the input file {str(data)!r}" in line
    assert digest(model, data) == before


def test_outputs_that_are_not_regular_files_are_refused(
        run_eprun_here, lab_pair, external, tmp_path):
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


@pytest.mark.parametrize(("named", "code", "said"), [
    ("other/newname/", 3, "folder 'other/newname' does not exist"),
    ("other/newname/.", 3, "folder 'other/newname' does not exist"),
    ("other/a_file/", 4, "'other/a_file' is a file"),
    ("other/a_file/./", 4, "'other/a_file' is a file"),
    ("other/", 4, "it is a directory"),
])
def test_a_trailing_slash_names_a_folder_and_nothing_is_written(capfd, lab_pair, tmp_path,
                                                               monkeypatch, named, code, said):
    """`expose f.onnx other/newname/` once wrote a file `other/newname`: the slash names a
    folder, which is never the file eprun writes."""
    fp32, _ = lab_pair
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a_file").write_bytes(b"the user's own file")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    line = refused(in_process(capfd, "expose", fp32, named), code)
    assert said in line
    assert snapshot(tmp_path) == before


def test_an_output_link_is_refused_and_what_it_leads_to_untouched(
        run_eprun_here, lab_pair, tmp_path):
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
        result = subprocess.run([*PROGRAM, "expose", str(fp32), str(to_stdout)],
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


def test_a_write_error_leaves_the_previous_deliverables(run_eprun_here, lab_pair, tmp_path):
    """A file-size limit makes staging the second exposed model fail (EFBIG)."""
    import resource

    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun_here("report", fp32, int8, "--out-dir", out, "--seed", "1").code == 0
    before = report_files(out)
    limit = os.path.getsize(out / "fp32_exposed.onnx") + 1

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([*PROGRAM, "report", str(fp32), str(int8),
                           "--out-dir", str(out), "--seed", "2"], capture_output=True,
                          text=True, preexec_fn=small_files, timeout=120)
    assert proc.returncode == 4 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "cannot write" in proc.stderr and "EP Error" not in proc.stderr
    assert report_files(out) == before  # no new file, no temporary, no half set
    # into folders it had to create: they go too, and only they
    fresh = tmp_path / "fresh" / "deeper"
    proc = subprocess.run([*PROGRAM, "report", str(fp32), str(int8),
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


def test_an_interrupt_lands_before_or_after_the_whole_report(run_eprun_here, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun_here("report", fp32, int8, "--out-dir", "out", "--seed", "1",
                     cwd=tmp_path).code == 0
    old = report_files(out)
    elsewhere = tmp_path / "elsewhere"  # the same command line (the report's first line)
    elsewhere.mkdir()
    assert run_eprun_here("report", fp32, int8, "--out-dir", "out", "--seed", "2",
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


def test_killed_report_leaves_old_or_new_sets_and_no_stray_files(run_eprun_here, lab_pair, tmp_path):
    """SIGTERM swept over the whole run, counted from eprun's first line (the run takes about
    0.2 s from there on an idle machine), through the measurement and the writes."""
    fp32, int8 = lab_pair
    out = tmp_path / "out"
    assert run_eprun_here("report", fp32, int8, "--out-dir", out, "--seed", "1").code == 0
    old = report_files(out)
    codes = []
    for delay in np.linspace(0.0, 0.24, 9):
        proc = subprocess.Popen([*PROGRAM, "report", str(fp32), str(int8),
                                 "--out-dir", str(out), "--seed", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        own_code_runs(proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        # 0: finished first; 143: stopped by eprun
        assert proc.returncode in (0, 128 + signal.SIGTERM), err
        got = report_files(out)
        assert set(got) == set(old), "a stray or temporary file"
        assert {name for name in got if got[name] != old[name]} in (
            set(), {"growth.json", "settings.json", "ep_report.md"}), "a mixed set"
        if got != old:
            out_again = run_eprun_here("report", fp32, int8, "--out-dir", out, "--seed", "1")
            assert out_again.code == 0 and report_files(out) == old
    assert 128 + signal.SIGTERM in codes  # the sweep did land while eprun worked


def test_the_real_stderr_is_remembered_only_while_the_outermost_capture_holds_it():
    """Where a signal's last word goes: the stderr captured_chatter took over, while it holds
    it (an inner capture changes nothing), and nothing once it is given back."""
    import eprun as tool

    invocation = tool.Invocation()
    with tool.installed(invocation):
        with tool.captured_chatter():
            outer = invocation.stderr
            assert outer is not None and tool.real_stderr() == outer
            with tool.captured_chatter():
                assert invocation.stderr == outer
            assert invocation.stderr == outer
        assert invocation.stderr is None and invocation.terminals == []
        assert tool.real_stderr() == 2


def test_a_signal_at_any_step_of_a_capture_finds_the_real_stderr(monkeypatch):
    """A signal's last word ("interrupted") is written to ``real_stderr()`` from the handler,
    which runs between any two steps of captured_chatter: before and after each descriptor it
    copies, moves or closes, that is the stderr the run began with, never the held file (a
    Ctrl-C just as a command began or ended was exit 130 with nothing said)."""
    import eprun as tool

    def where(fd: int) -> tuple:
        stat = os.fstat(fd)
        return stat.st_dev, stat.st_ino

    real = where(2)
    steps = []

    def checked(name: str):
        call = getattr(os, name)

        def step(*args):
            steps.append((name, where(tool.real_stderr()) == real))
            result = call(*args)
            steps.append((name, where(tool.real_stderr()) == real))
            return result
        return step

    for name in ("dup", "dup2", "close"):
        monkeypatch.setattr(os, name, checked(name))
    invocation = tool.Invocation()
    with tool.installed(invocation), tool.captured_chatter() as store:
        os.write(2, b"held")
    monkeypatch.undo()
    assert {name for name, _ in steps} == {"dup", "dup2", "close"}
    assert [name for name, found in steps if not found] == []
    with store:
        store.seek(0)
        assert store.read() == b"held"  # and the store did hold fd 2 meanwhile


def test_a_capture_with_stdin_and_stdout_closed_gives_stderr_back():
    """Where fds 0 and 1 are closed, the store takes fd 0 and fd 1 is held first: the copy of
    the real stderr takes neither number, the real stderr is remembered while the capture
    holds fd 2, and fd 2 is the real stderr again after it."""
    script = (
        IMPORT_EPRUN + "import os\n"
        "real = os.fstat(2)\n"
        "os.close(0); os.close(1)\n"
        "with eprun.installed(eprun.Invocation()):\n"
        "    with eprun.captured_chatter() as store:\n"
        "        os.write(2, b'held')\n"
        "        inside = os.fstat(eprun.real_stderr())\n"
        "    after = os.fstat(2)\n"
        "same = {(stat.st_dev, stat.st_ino) for stat in (real, inside, after)}\n"
        "store.seek(0)\n"
        "os.write(2, f'{len(same)} '.encode() + store.read())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stderr) == (0, "1 held")


@pytest.fixture(scope="module")
def heavy_model(tmp_path_factory):
    """~64 MB of weights, so that writing the exposed copy takes a while."""
    folder = tmp_path_factory.mktemp("heavy")
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for k in range(4):
        inits.append(numpy_helper.from_array(rng.standard_normal((2048, 2048)).astype(np.float32),
                                             f"W{k}"))
        nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"h{k}"]))
        current = f"h{k}"
    model = models.finish(nodes, [models.float_input("x", 2048)],
                          [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["N", 2048])],
                          inits)
    return models.save(model, folder / "heavy.onnx")


def leftovers(folder, keep: set[str]) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name not in keep)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killed_expose_leaves_nothing_or_a_complete_model(heavy_model, tmp_path, signum):
    """The signal swept over the 0.2 s from eprun's first line (on an idle machine its answer
    comes after 0.1-0.2 s: the load, the new outputs, the write of 64 MB); at least one run must
    die unfinished."""
    out = tmp_path / "out.onnx"
    unfinished = 0
    for delay in np.linspace(0.0, 0.2, 9):
        proc = subprocess.Popen([*PROGRAM, "expose", str(heavy_model), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        own_code_runs(proc)
        time.sleep(delay)
        proc.send_signal(signum)
        stdout, _ = proc.communicate(timeout=60)
        unfinished += proc.returncode != 0
        assert leftovers(tmp_path, {"out.onnx"}) == []
        if out.exists():
            assert len(onnx.load(str(out), load_external_data=False).graph.output) == 5
        if stdout:  # the signal came after the answer: it must be whole, and so must the file
            assert stdout.count(b"\n") == 1 and stdout.startswith(b"{") and out.exists()
        if signum == signal.SIGTERM and proc.returncode != 0:
            assert proc.returncode == 128 + signal.SIGTERM  # eprun unwound through its cleanup
    assert unfinished >= 1


def test_two_writers_of_one_path_leave_one_complete_model(heavy_model, tmp_path):
    out = tmp_path / "out.onnx"
    procs = [subprocess.Popen([*PROGRAM, "expose", str(heavy_model), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    assert leftovers(tmp_path, {"out.onnx"}) == []
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert len(session.get_outputs()) == 5


def test_no_command_modifies_its_inputs(eprun, lab_pair, tmp_path):
    fp32, int8 = lab_pair

    def digest():
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in (fp32, int8)] + [
            os.stat(p).st_mtime_ns for p in (fp32, int8)]

    before = digest()
    eprun("providers", fp32, "CPUExecutionProvider", "FooExecutionProvider")
    eprun("partition", int8, "MatMul")
    eprun("expose", int8, tmp_path / "e.onnx")
    eprun("layers", fp32, int8, "1")
    eprun("growth", fp32, int8, "1")
    eprun("settings", int8, "1")
    eprun("report", fp32, int8, "--seed", "1", "--out-dir", tmp_path / "report")
    assert digest() == before


def test_the_named_temporary_fallback_writes_and_cleans_up(tmp_path, monkeypatch):
    """Where O_TMPFILE is missing (macOS, some filesystems) a hidden named file is used."""
    monkeypatch.setattr(tool, "_open_unnamed", lambda folder: None)
    target = tmp_path / "out.bin"
    tool.write_atomically(b"complete", str(target))
    assert target.read_bytes() == b"complete"
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~tool._umask())

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    def half_written(stream):
        stream.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(tool.EprunError, match="No space left"):  # staging fails
        tool.stage(half_written, str(target))
    assert sorted(os.listdir(tmp_path)) == ["out.bin"] and not tool.current_invocation().temporaries
    monkeypatch.setattr(tool.os, "replace", fail)
    with pytest.raises(tool.EprunError, match="No space left"):  # committing fails
        tool.write_atomically(b"new", str(target))
    assert target.read_bytes() == b"complete"
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_TMPFILE is Linux's")
def test_a_new_file_is_linked_to_its_path_with_no_hidden_name(tmp_path, monkeypatch):
    """On Linux a new path gets the unnamed file itself: no hidden name, no rename, so a
    kill -9 at any moment leaves nothing but the complete file. A path that appears between
    staging and commit is replaced through the hidden name, as any existing file is."""
    target = tmp_path / "new.bin"
    staged = tool.stage(b"complete", str(target))
    assert staged.handle is not None and os.listdir(tmp_path) == []  # nothing named yet

    def no_rename(*args, **kwargs):
        raise AssertionError("renamed")

    with monkeypatch.context() as patched:
        patched.setattr(tool.os, "replace", no_rename)
        tool.commit([staged])
    assert target.read_bytes() == b"complete" and os.listdir(tmp_path) == ["new.bin"]
    staged = tool.stage(b"newer", str(target))
    target.write_bytes(b"someone else's")  # appears after the check that it was free
    tool.commit([staged])
    assert target.read_bytes() == b"newer" and os.listdir(tmp_path) == ["new.bin"]
