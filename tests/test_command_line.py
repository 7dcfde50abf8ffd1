"""Every bad input gets its exit code, an empty stdout and one ``eprun: error:`` line."""
from __future__ import annotations

import hashlib
import os

import models
import numpy as np
import pytest
from conftest import run_eprun
from onnx import TensorProto, helper, numpy_helper

COMMANDS_ON_ONE_MODEL = [
    ("partition", ["MatMul"]),
    ("partition", ["MatMul", "--mode", "ort"]),
    ("expose", ["{tmp}/out.onnx"]),
    ("settings", ["1"]),
    ("placement", ["CPUExecutionProvider"]),
]


@pytest.fixture
def files(tmp_path, lab_pair):
    """Broken and awkward inputs, by name."""
    fp32, int8 = lab_pair
    made = {"fp32": fp32, "int8": int8, "dir": tmp_path / "folder",
            "missing": tmp_path / "nope.onnx", "empty": tmp_path / "empty.onnx",
            "random": tmp_path / "random.onnx", "text": tmp_path / "text.onnx",
            "truncated": tmp_path / "truncated.onnx"}
    made["dir"].mkdir()
    made["empty"].write_bytes(b"")
    made["random"].write_bytes(np.random.default_rng(0).bytes(4096))
    made["text"].write_text("ir_version: 8\nthis is a text file, not a model\n")
    made["truncated"].write_bytes(fp32.read_bytes()[:700])

    two_inputs = models.finish(
        [helper.make_node("MatMul", ["x", "z"], ["y"])],
        [models.float_input("x", 4), helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    made["two_inputs"] = models.save(two_inputs, tmp_path / "two_inputs.onnx")

    int_input = models.finish(
        [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["xf", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")])
    made["int64_input"] = models.save(int_input, tmp_path / "int64_input.onnx")

    symbolic = models.chain(features=4, widths=(4, 4, 4, 4, 4))
    symbolic.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
    made["symbolic_f"] = models.save(symbolic, tmp_path / "symbolic_f.onnx")

    fixed = models.chain(features=4, widths=(4, 4, 4, 4, 4), batch=1)
    made["fixed_batch"] = models.save(fixed, tmp_path / "fixed_batch.onnx")

    np.savez(tmp_path / "inputs.npz", x=np.ones((5, 8), np.float32))
    made["npz"] = tmp_path / "inputs.npz"
    np.savez(tmp_path / "wrong.npz", z=np.ones((5, 8), np.float32))
    made["wrong_npz"] = tmp_path / "wrong.npz"
    np.savez(tmp_path / "strings.npz", x=np.array([["a"] * 8] * 5))
    made["strings_npz"] = tmp_path / "strings.npz"
    np.savez(tmp_path / "no_rows.npz", x=np.zeros((0, 8), np.float32))
    made["no_rows_npz"] = tmp_path / "no_rows.npz"
    named = models.chain(features=8, widths=(8, 4)).SerializeToString()
    made["not_utf8"] = tmp_path / "not_utf8.onnx"  # onnxruntime takes it; protobuf gives bytes
    made["not_utf8"].write_bytes(named.replace(b"mm0", b"\xff\xfe0"))
    huge = models.chain(features=4, widths=(4, 4))
    huge.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1 << 62
    made["huge_dim"] = models.save(huge, tmp_path / "huge_dim.onnx")
    made["string_input"] = models.save(models.finish(
        [helper.make_node("Identity", ["s"], ["t"]), helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N"]), models.float_input()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("t", TensorProto.STRING, ["N"])]),
        tmp_path / "string_input.onnx")
    made["label_only"] = models.save(models.finish(
        [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0)],
        [models.float_input()], [helper.make_tensor_value_info("label", TensorProto.INT64,
                                                               ["N"])]),
        tmp_path / "label_only.onnx")
    made["short"] = models.save(models.chain(features=8, widths=(6, 6, 4)), tmp_path / "short.onnx")
    made["wide"] = models.save(models.chain(features=5, widths=(12, 10, 10, 8, 6)),
                               tmp_path / "wide.onnx")
    return made


@pytest.fixture(autouse=True)
def _here(capfd, monkeypatch):
    """``expect_failure`` runs ``main(argv)`` in this process (the exit code, stdout and
    stderr it gives are the ones a process gives: tests/test_process.py checks those)."""
    from conftest import run_here

    monkeypatch.setitem(_RUNNER, "run", lambda *argv: run_here(capfd, monkeypatch, *argv))


_RUNNER: dict = {"run": run_eprun}


def expect_failure(code: int, argv: list[str], names: str | None = None) -> str:
    result = _RUNNER["run"](*argv)
    assert result.code == code, f"{argv}: exit {result.code}, wanted {code}: {result.stderr}"
    assert result.stdout == "", argv
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eprun: error: "), result.stderr
    if names:
        assert names in lines[0], (names, lines[0])
    return lines[0]


def fill(argv: list[str], files: dict, tmp_path) -> list[str]:
    return [str(files[a[1:]]) if a.startswith("@") else a.replace("{tmp}", str(tmp_path))
            for a in argv]


MODEL_FAILURES = [
    # (input, exit code) for every command that reads one model
    ("missing", 3), ("dir", 3), ("empty", 4), ("random", 4), ("text", 4), ("truncated", 4),
]


@pytest.mark.parametrize("command, extra", COMMANDS_ON_ONE_MODEL)
@pytest.mark.parametrize("name, code", MODEL_FAILURES)
def test_unreadable_models(files, tmp_path, command, extra, name, code):
    argv = [command, str(files[name])] + [a.replace("{tmp}", str(tmp_path)) for a in extra]
    expect_failure(code, argv, names=str(files[name]))
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("command, extra", [("layers", ["1"]), ("growth", ["1"]),
                                            ("layers", ["1", "--local"]),
                                            ("report", ["--out-dir", "{tmp}/report"]),
                                            ("check", [])])
@pytest.mark.parametrize("name, code", MODEL_FAILURES)
def test_unreadable_models_in_pairs(files, tmp_path, command, extra, name, code):
    extra = [arg.replace("{tmp}", str(tmp_path)) for arg in extra]
    expect_failure(code, [command, str(files["fp32"]), str(files[name]), *extra],
                   names=str(files[name]))
    expect_failure(code, [command, str(files[name]), str(files["int8"]), *extra],
                   names=str(files[name]))
    assert not (tmp_path / "report").exists() or not os.listdir(tmp_path / "report")


@pytest.mark.parametrize("name", ["missing", "dir"])
def test_providers_exits_3_only_for_a_missing_file(files, name):
    expect_failure(3, ["providers", str(files[name]), "CPUExecutionProvider"],
                   names=str(files[name]))


@pytest.mark.parametrize("argv, code, names", [
    (["settings", "@symbolic_f", "1"], 4, ("eprun chose 32 for x[1] ('F'); set other values "
     "with --dim")),
    (["layers", "@symbolic_f", "@symbolic_f", "1", "--dim", "G=4"], 2,
     "--dim names 'G', which is not a symbolic dimension"),
    (["settings", "@fp32", "1", "--dim", "N=4"], 2, "the batch dimension; set it with --rows"),
    (["settings", "@fixed_batch", "1", "--rows", "8"], 2, "fixes the batch at 1"),
    (["settings", "@fp32", "1", "--dim", "x"], 2, "is not NAME=VALUE"),
    (["settings", "@fp32", "1", "--dim", "F=0"], 2, "is not a positive integer"),
    (["settings", "@fp32", "1", "--input-range", "x:3,1"], 2, "finite LO <= HI"),
    (["settings", "@fp32", "1", "--input-range", "x:1,inf"], 2, "finite LO <= HI"),
    (["settings", "@fp32", "1", "--input-range", "x1,2"], 2, "NAME:LO,HI"),
    (["settings", "@fp32", "1", "--input-range", "z:1,2"], 2, "not an input of"),
    (["settings", "@int64_input", "1", "--input-range", "x:0.2,0.7"], 2, "holds no int64"),
    (["settings", "@int64_input", "1", "--input-range", "x:1e25,1e30"], 2, "holds no int64"),
    (["settings", "@fp32", "1", "--input-range", "x:-1e308,1e308"], 2, "give a narrower range"),
    (["layers", "@huge_dim", "@huge_dim", "1"], 4, "more than this machine's"),
    (["settings", "@fp32", "1", "--rows", str(10 ** 12)], 4, "lower --rows"),
    (["settings", "@fp32", "1", "--rows", str(10 ** 30)], 4, "lower --rows"),
    (["settings", "@fp32", "1", "--rows", str(1 << 63)], 4, "lower --rows"),
    (["layers", "@fp32", "@int8", "1", "--inputs", "@strings_npz"], 4, "the inputs must be numbers"),
    (["layers", "@not_utf8", "@not_utf8", "1"], 4, "not UTF-8 text (b'\\xff\\xfe0')"),
    (["expose", "@not_utf8", "{tmp}/out.onnx"], 4, "not UTF-8 text"),
    (["sensitivity", "@not_utf8", "@not_utf8", "1"], 4, "not UTF-8 text"),
    (["report", "@not_utf8", "@not_utf8", "--out-dir", "{tmp}/report"], 4, "not UTF-8 text"),
    (["layers", "@fp32", "@int8", "1", "--inputs", "@no_rows_npz"], 4, "has 0 rows"),
    (["settings", "@fp32", "1", "--inputs", "{tmp}/none.npz"], 3, "does not exist"),
    (["settings", "@fp32", "1", "--inputs", "@text"], 4, "cannot read the inputs file"),
    (["layers", "@fp32", "@int8", "1", "--inputs", "@wrong_npz"], 4, ("missing x; no input is "
     "called z")),
    (["layers", "@fp32", "@int8", "1", "--inputs", "@npz", "--rows", "3"], 2,
     "--rows 3 contradicts the batch of 5"),
    (["layers", "@string_input", "@string_input", "1"], 4, "cannot generate"),
    (["settings", "@string_input", "1"], 4, "cannot generate"),
    (["layers", "@label_only", "@label_only", "1"], 4, "has no float output"),
    (["layers", "@fp32", "@short", "1", "--pair", "name"], 4, "--pair name: no boundary"),
    (["layers", "@fp32", "@int8", "1", "--pair", "names"], 2, "invalid choice"),
    (["partition", "@fp32", "MatMul", "--metrics", "sqnr"], 2,
     "unrecognized arguments: --metrics sqnr (see 'eprun.py partition --help')"),
    (["layers", "@fp32", "@int8", "1", "--boundary-ops", "conv"], 2,
     "op types are case-sensitive: 'conv' is no op type, did you mean Conv?"),
    (["growth", "@fp32", "@int8", "1", "--boundary-ops", "Conv,Matmul"], 2,
     "'Matmul' is no op type, did you mean MatMul?"),
    (["layers", "@fp32", "@short", "1"], 4, "boundary counts differ"),
    (["growth", "@short", "@int8", "1"], 4, "boundary counts differ"),
    (["layers", "@fp32", "@wide", "1"], 4, "input shapes"),
    (["layers", "@fp32", "@int8", "abc"], 2, "'abc'"),
    (["layers", "@fp32", "@int8", "-1"], 2, "'-1'"),
    (["growth", "@fp32", "@int8", "1.5"], 2, "'1.5'"),
    (["settings", "@fp32", ""], 2, "''"),
    (["settings", "@fp32", " 7"], 2, "' 7'"),
    (["settings", "@fp32", "٣"], 2, "is not a non-negative integer"),
    (["report", "@fp32", "@int8", "--seed", "x"], 2, "'x'"),
    (["frobnicate", "@fp32"], 2, "frobnicate"),
    (["layers", "@fp32", "@int8"], 2, "required"),
    (["layers", "@fp32", "@int8", "1", "2"], 2, "unrecognized"),
    (["settings", "@fp32"], 2, "required"),
    (["partition", "@fp32"], 2, "required"),
    (["partition", "@fp32", "MatMul", "Add"], 2, "unrecognized"),
    (["providers", "@fp32"], 2, "required"),
    (["expose", "@fp32"], 2, "required"),
    (["expose", "@fp32", "@fp32"], 2, "refusing to overwrite"),
    (["expose", "@fp32", "{tmp}/no/such/folder/out.onnx"], 3, "does not exist"),
    (["expose", "@fp32", "{tmp}/folder"], 4, "directory"),
    (["expose", "@fp32", "/proc/eprun-out.onnx"], 4, "cannot write"),
    (["report", "@fp32", "@int8", "--out-dir", "@text"], 4, "is a file, not a folder"),
    (["expose", "@fp32", "{tmp}/" + "a" * 256], 4, "its file name is 256 bytes, more than"),
    (["expose", "@fp32", "{tmp}/" + "a" * 4000], 4, "its file name is 4000 bytes, more than"),
    (["report", "@fp32", "@int8", "--out-dir", "{tmp}/text.onnx/sub"], 4,
     "text.onnx', which is a file, not a folder"),
])
def test_bad_usage_and_unusable_models(files, tmp_path, argv, code, names):
    before = {name: hashlib.sha256(open(files[name], "rb").read()).hexdigest()
              for name in ("fp32", "int8")}
    listed = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    line = expect_failure(code, fill(argv, files, tmp_path), names=names.replace(
        "{tmp}", str(tmp_path)))
    assert "eprun: error:" in line
    after = {name: hashlib.sha256(open(files[name], "rb").read()).hexdigest()
             for name in ("fp32", "int8")}
    assert before == after
    # no output, no temporary file, no folder left behind
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == listed


def test_expose_refuses_its_input_under_another_spelling(files, tmp_path):
    link = tmp_path / "link.onnx"
    os.symlink(files["fp32"], link)
    expect_failure(2, ["expose", str(files["fp32"]), str(link)], names="refusing")
    relative = os.path.relpath(files["fp32"])
    expect_failure(2, ["expose", str(files["fp32"]), relative], names="refusing")


@pytest.mark.parametrize("argv", [
    ["settings", "@fp32", str(10 ** 29)],
    ["partition", "@fp32", ""],
    ["partition", "@fp32", ",,,"],
    ["providers", "@fp32", ""],
])
def test_legal_edge_inputs_succeed(eprun, files, tmp_path, argv):
    answer = eprun(*fill(argv, files, tmp_path))
    if argv[0] == "settings":
        assert answer["seed"] == 10 ** 29
    if argv[0] == "partition":
        assert answer["supported"] == [] and answer["claimed"] == 0
        assert answer["partition_count"] == 1 and answer["handoffs"] == 0


def test_a_model_without_matmul_has_only_its_output_as_boundary(eprun, tmp_path):
    model = models.finish([helper.make_node("Relu", ["x"], ["y"])], [models.float_input("x", 4)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    path = models.save(model, tmp_path / "relu.onnx")
    assert eprun("expose", path, tmp_path / "o.onnx")["boundaries"] == ["y"]
    answer = eprun("growth", path, path, "2")
    assert answer["layer_count"] == 1 and answer["ratios"] == []
    assert answer["rel_error"] == [0.0] and answer["total_growth"] is None
    assert answer["monotone"] is True and answer["max_ratio"] is None


def test_an_initializer_listed_as_input_is_not_fed(eprun, tmp_path):
    model = models.chain(features=4, widths=(4, 4, 4, 4, 4))
    model.graph.input.append(helper.make_tensor_value_info("W0", TensorProto.FLOAT, [4, 4]))
    path = models.save(model, tmp_path / "init_input.onnx")
    assert eprun("layers", path, path, "1")["layer_count"] == 6


def test_debug_mode_shows_the_traceback(run_eprun_here, files):
    result = run_eprun_here("layers", files["empty"], files["int8"], "1", env={"EPRUN_DEBUG": "1"})
    assert result.code == 4 and "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("eprun: error: ")


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_progress_delay_is_a_warning_and_the_default(run_eprun_here, files, value):
    """One of eprun's own knobs set wrong must not fail the run it only tunes."""
    plain = run_eprun_here("layers", files["fp32"], files["int8"], "1")
    result = run_eprun_here("layers", files["fp32"], files["int8"], "1",
                       env={"EPRUN_PROGRESS_AFTER": value})
    assert result.code == 0 and result.stdout == plain.stdout, result.stderr
    assert result.stderr.splitlines() == [
        (f"eprun: warning: EPRUN_PROGRESS_AFTER={value!r} is not a number of seconds (it sets "
         "after how long progress is shown); using the default, 2")]


@pytest.mark.parametrize("value", ["0", "no", "false", "OFF", ""])
def test_eprun_debug_off_means_off(run_eprun_here, files, value):
    result = run_eprun_here("layers", files["empty"], files["int8"], "1", env={"EPRUN_DEBUG": value})
    assert result.code == 4 and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_out_of_range_integer_bounds_are_clipped_to_the_type(eprun, files):
    answer = eprun("settings", files["int64_input"], "1", "--input-range", "x:-1e30,1e30")
    assert answer["inputs"][0]["source"] == f"integers[{-(1 << 63)}, {(1 << 63) - 1}]"


def test_a_file_name_of_250_bytes_is_written(eprun, files, tmp_path):
    """The hidden temporary beside it must fit the file system's 255 bytes too."""
    out = tmp_path / ("a" * 246 + ".onnx")
    assert eprun("expose", files["fp32"], out)["out"] == str(out)
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("a")) == [
        out.name]


def test_an_initializer_nothing_reads_is_no_failure(eprun, tmp_path):
    """onnxruntime drops it while resolving the graph and then cannot find it to hand it its
    weights (1.16: "Failed to find existing initializer"); a large one is left in the file."""
    model = models.chain(features=8, widths=(8, 4))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((32, 32), np.float32),
                                                           "unused"))
    path = models.save(model, tmp_path / "unused.onnx")
    answer = eprun("layers", path, path, "1")
    assert answer["layer_count"] == 3 and all(entry["max_abs_error"] == 0.0
                                              for entry in answer["layers"])
