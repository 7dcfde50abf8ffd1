"""Nothing lost, nothing half-written, no traceback: under kills, races and random input."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import eprun as tool


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
    out = tmp_path / "out.onnx"
    delays = np.linspace(0.05, 0.6, 8)
    for delay in delays:
        proc = subprocess.Popen([sys.executable, str(EPRUN), "expose", str(heavy_model), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(signum)
        stdout, _ = proc.communicate(timeout=60)
        assert leftovers(tmp_path, {"out.onnx"}) == []
        if out.exists():
            assert len(onnx.load(str(out), load_external_data=False).graph.output) == 5
        if stdout:  # the signal came after the answer: it must be whole, and so must the file
            assert stdout.count(b"\n") == 1 and stdout.startswith(b"{") and out.exists()
        if signum == signal.SIGTERM and proc.returncode != 0:
            # 143: eprun unwound through its cleanup; -15: killed during interpreter start-up
            assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM)


def test_two_writers_of_one_path_leave_one_complete_model(heavy_model, tmp_path):
    out = tmp_path / "out.onnx"
    procs = [subprocess.Popen([sys.executable, str(EPRUN), "expose", str(heavy_model), str(out)],
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


# -- properties --------------------------------------------------------------------------------

EXIT_CODES = {0, 1, 2, 3, 4}


@pytest.fixture(scope="module")
def argv_pool(tmp_path_factory):
    import models as builders

    folder = tmp_path_factory.mktemp("argv")
    fp32 = builders.save(builders.chain(features=4, widths=(5, 5, 4, 4, 3)), folder / "f.onnx")
    junk = folder / "junk.onnx"
    junk.write_bytes(b"\x08\x07junk")
    return folder, [str(fp32), str(junk), str(folder / "missing.onnx"), str(folder), "0", "7",
                    "-1", "1e3", "", ",", "MatMul,Add", "CPUExecutionProvider",
                    "FooExecutionProvider,", "--seed", "--out-dir", "--help", "-x",
                    "\u00e9\u00e8", str(folder / "out.onnx")]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_argv_never_tracebacks(argv_pool, capfd, monkeypatch, data):
    folder, pool = argv_pool
    monkeypatch.chdir(folder)  # relative output paths ("-1", "0") land here, not in the repo
    command = data.draw(st.sampled_from([*tool.COMMANDS, "bogus", "-h"]))
    rest = data.draw(st.lists(st.one_of(st.sampled_from(pool), st.text(max_size=6)),
                              max_size=5))
    argv = [command] + [arg for arg in rest if "\x00" not in arg]
    try:
        code = tool.main(argv)
    except SystemExit as exc:  # argparse: usage errors and --help
        code = exc.code
    out, err = capfd.readouterr()
    assert code in EXIT_CODES, (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    assert "internal error" not in err, (argv, err)  # a crash, not an expected failure
    assert code != 1 or command in ("check", "providers"), (argv, err)
    if code == 0 and "-h" not in argv and "--help" not in argv and command != "-h":
        assert len(out.splitlines()) == 1 and out.startswith("{")
    elif code != 0:
        assert out == "" and err.splitlines()[-1].startswith("eprun: error: ")


@st.composite
def model_pairs(draw):
    """A random chain (MatMul or Gemm per layer) and a copy with coarsely rounded weights."""
    depth = draw(st.integers(1, 6))
    features = draw(st.integers(1, 9))
    widths = draw(st.lists(st.integers(1, 9), min_size=depth, max_size=depth))
    gemm = draw(st.sets(st.integers(0, depth - 1)))
    seed = draw(st.integers(0, 2 ** 32))
    fp32 = models.chain(features=features, widths=widths, seed=seed % 1000, gemm_layers=gemm)
    rough = onnx.ModelProto()
    rough.CopyFrom(fp32)
    step = draw(st.sampled_from([0.0, 1 / 16, 1 / 4]))
    for tensor in rough.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if step:
            array = (np.round(array / step) * step).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return fp32, rough, seed


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=model_pairs())
def test_layers_and_growth_invariants(tmp_path, pair):
    fp32, rough, seed = pair
    a = models.save(fp32, tmp_path / "a.onnx")
    b = models.save(rough, tmp_path / "b.onnx")
    measured = tool.layers(str(a), str(b), seed)
    grown = tool.growth_of(measured)
    exposed = tool.expose(str(a), str(tmp_path / "a_exposed.onnx"))
    assert measured["layer_count"] == len(exposed["boundaries"]) == len(measured["layers"])
    rel = grown["rel_error"]
    for entry in measured["layers"]:
        assert entry["rel_error"] >= 0 and entry["max_abs_error"] >= 0
        assert -1.0 <= entry["cos_min"] <= 1.0
        assert entry["rel_error"] == (entry["max_abs_error"] / entry["scale"]
                                      if entry["scale"] else 0.0)
    assert len(grown["ratios"]) == len(rel) - 1
    for k, ratio in enumerate(grown["ratios"], start=1):
        assert ratio == (rel[k] / rel[k - 1] if rel[k - 1] else None)
    if grown["max_ratio"] is not None:
        k = grown["max_ratio"]["index"]
        assert grown["ratios"][k - 1] == grown["max_ratio"]["ratio"]
        assert all(r is None or r <= grown["max_ratio"]["ratio"] for r in grown["ratios"])
        assert all(r is None or r < grown["max_ratio"]["ratio"] for r in grown["ratios"][:k - 1])


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


def test_error_lines_escape_control_characters():
    assert tool.one_line("a\r b\n\n  c\x00d\te") == "a\\r b c\\x00d e"


# -- the wire walker against protobuf ------------------------------------------------------------

def _padded_varint(value: int, extra: int) -> bytes:
    """``value`` as a varint ``extra`` bytes longer than it needs (protobuf's limit for tags
    and lengths is 5 bytes in all)."""
    encoded = bytearray(tool._encode_varint(value))
    if extra:
        encoded[-1] |= 0x80
        encoded += b"\x80" * (extra - 1) + b"\x00"
    return bytes(encoded)


def _fields(data: bytes, start: int, end: int) -> list[tuple[int, int, bytes]]:
    return [(number, wire, data[value_at:field_end])
            for number, wire, _, value_at, field_end in tool._wire_fields(data, start, end)]


def _encode(fields: list, pad: dict) -> bytes:
    """Fields back to bytes; ``pad`` (field index -> (tag extra, length extra)) makes a tag
    or a length overlong."""
    out = bytearray()
    for index, (number, wire, value) in enumerate(fields):
        tag_extra, length_extra = pad.get(index, (0, 0))
        out += _padded_varint(number << 3 | wire, tag_extra)
        if wire == 2:
            out += _padded_varint(len(value), length_extra)
        out += value
    return bytes(out)


def _inlined(model, path) -> onnx.ModelProto:
    """The walker's model with each payload it left in the file read back inline."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data = path.read_bytes()
    for tensor in copy.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            where = {entry.key: entry.value for entry in tensor.external_data}
            assert where["location"] == path.name
            offset, length = int(where["offset"]), int(where["length"])
            tensor.raw_data = data[offset:offset + length]
            del tensor.external_data[:]
            tensor.ClearField("data_location")
    return copy


@pytest.fixture(scope="module")
def walked_model() -> bytes:
    """A small model with one payload large enough for the walker to leave in the file."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W"),
             numpy_helper.from_array(np.ones(32, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    model = models.finish(nodes, [models.float_input("x", 16)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
                          inits)
    return model.SerializeToString()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_wire_walker_accepts_only_what_protobuf_accepts(walked_model, tmp_path, data):
    """Differential: whatever the walker reads, protobuf reads the same (and where the walker
    gives up, protobuf decides). Files with overlong tags and lengths (6-10-byte varints,
    which protobuf, onnx and onnxruntime refuse), random bytes and truncations."""
    top = _fields(walked_model, 0, len(walked_model))
    graph_at = next(index for index, (number, _, _) in enumerate(top) if number == 7)
    graph = _fields(top[graph_at][2], 0, len(top[graph_at][2]))
    kind = data.draw(st.sampled_from(["overlong", "bytes", "truncated"]))
    if kind == "overlong":
        extra = (data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6)))
        inner = data.draw(st.integers(0, len(graph) - 1))
        outer = data.draw(st.integers(0, len(top) - 1))
        if data.draw(st.booleans()):  # a field of the graph (an initializer, a node)
            top[graph_at] = (7, 2, _encode(graph, {inner: extra}))
            blob = _encode(top, {})
        else:
            blob = _encode(top, {outer: extra})
    elif kind == "bytes":
        blob = bytearray(walked_model)
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    else:
        blob = walked_model[:data.draw(st.integers(0, len(walked_model) - 1))]
    path = tmp_path / "walked.onnx"
    path.write_bytes(blob)
    walked = tool._read_graph(str(path))
    if blob == walked_model:
        assert walked is not None  # a walker that always gave up would pass the rest
    if walked is None:
        return  # the ordinary parse decides, as it would without the walker
    parsed = onnx.load(str(path), load_external_data=False)  # raises where protobuf refuses
    assert _inlined(walked, path) == parsed
