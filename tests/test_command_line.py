"""Layer 11, command line: ``main(argv)`` and the parser. Every bad input gets its exit code, an
empty stdout and one ``eprun: error:`` line; random argv never tracebacks; near misses get a
suggestion; the seed is taken in both forms; main runs in any thread and gives the previous
run back."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import models
import numpy as np
import pytest
from conftest import EPRUN, run_eprun, without_exposure_note
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_contract import default_argv

import eprun as tool

COMMANDS_ON_ONE_MODEL = [
    ("partition", ["MatMul"]),
    ("partition", ["MatMul", "--rule", "ort"]),
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
def _here(request, monkeypatch):
    """``expect_failure`` runs ``main(argv)`` in this process (the exit code, stdout and
    stderr it gives are the ones a process gives: tests/test_process.py checks those). It
    takes ``capfd`` only when called, so that the tests here that read ``capsys`` can."""
    from conftest import run_here

    monkeypatch.setitem(_RUNNER, "run", lambda *argv: run_here(
        request.getfixturevalue("capfd"), monkeypatch, *argv))


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
    (["report", "@fp32", "@int8", "--out-dir", ""], 2, "--out-dir needs a folder (it is empty)"),
    (["expose", "@fp32", ""], 2, "an output path is empty; name a file"),
    (["check", "@fp32", "@int8", "--save-outputs", ""], 2, "an output path is empty"),
    (["layers", "@fp32", "@int8", "1", "--save-boundaries", ""], 2, "an output path is empty"),
    (["check", "@fp32", "@int8", "--load-outputs", ""], 2, "an empty path names no file"),
    (["check", "@fp32", "@int8", "--inputs", ""], 2, "an empty path names no file"),
    (["layers", "@fp32", "@int8", "1", "--load-boundaries", ""], 2,
     "an empty path names no file"),
    (["sensitivity", "@fp32", "@int8", "1", "--calibration", ""], 2,
     "an empty path names no file"),
    (["expose", "@fp32", "{tmp}/text.onnx/out.onnx"], 4,
     "it is under '{tmp}/text.onnx', which is a file, not a folder"),
    (["check", "@fp32", "@int8", "--save-outputs", "{tmp}/text.onnx/sub/out.json"], 4,
     "it is under '{tmp}/text.onnx', which is a file, not a folder"),
    # the way as the system walks it: '..' after a file does not tidy the file away
    (["expose", "@fp32", "{tmp}/text.onnx/../out.onnx"], 4,
     "it is under '{tmp}/text.onnx', which is a file, not a folder"),
    (["report", "@fp32", "@int8", "--out-dir", "{tmp}/text.onnx/../r"], 4,
     "is under '{tmp}/text.onnx', which is a file, not a folder"),
    (["expose", "@fp32", "{tmp}/missing/../text.onnx/out.onnx"], 3,
     "folder '{tmp}/missing' does not exist"),
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
    assert without_exposure_note(result.stderr).splitlines() == [
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


def test_ctrl_c_while_the_command_line_is_parsed_is_an_interruption(monkeypatch, capfd):
    class Interrupted:
        def parse_known_args(self, argv):
            raise KeyboardInterrupt

    monkeypatch.setattr(tool, "build_parser", lambda only=None, argv=(): Interrupted())
    assert tool.main(["partition", "m.onnx", "MatMul"]) == 130
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "eprun: error: interrupted\n"


def test_an_op_list_that_matches_nothing_gets_near_misses(run_eprun_here, lab_pair):
    fp32, _ = lab_pair
    result = run_eprun_here("partition", fp32, "matmul,Addd")
    assert result.code == 0 and result.answer["claimed"] == 0
    assert ("eprun: note: no op type in 'matmul,Addd' occurs in" in result.stderr)
    assert "did you mean matmul -> MatMul, Addd -> Add?" in result.stderr
    assert "Its op types: MatMul, Add, Relu" in result.stderr
    assert "note" not in run_eprun_here("partition", fp32, "MatMul,Conv").stderr


def test_version_names_the_libraries():
    result = subprocess.run([sys.executable, str(EPRUN), "--version"], capture_output=True,
                            text=True, timeout=60)
    import numpy
    import onnx
    import onnxruntime

    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == (f"eprun {tool.__version__} (onnx {onnx.__version__}, onnxruntime "
                             f"{onnxruntime.__version__}, numpy {numpy.__version__}; Python "
                             f"{sys.version.split()[0]})\n")


def test_installed_version_is_the_distribution_that_holds_the_package(tmp_path, monkeypatch):
    from importlib import metadata

    assert tool._installed_version("numpy") == metadata.version("numpy")
    assert tool._installed_version("no_such_module_here") is None
    # a metadata folder whose RECORD does not list the package is not its distribution
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("__version__ = '9'\n")
    info = tmp_path / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n\n")
    (info / "RECORD").write_text("otherpkg/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert tool._installed_version("fakepkg") is None
    (info / "RECORD").write_text("fakepkg/__init__.py,,\nfakepkg-1.0.dist-info/RECORD,,\n")
    assert tool._installed_version("fakepkg") == "1.0"


def test_one_command_parser_parses_as_the_whole_one(lab_pair, tmp_path):
    """A run builds only the command it names; what it parses is what the whole parser
    parses (the help and usage texts are checked above against the whole one's)."""
    whole = tool.build_parser()
    for name in tool.COMMANDS:
        argv = [str(word) for word in default_argv(name, *lab_pair, tmp_path)]
        assert tool._command_named(tuple(argv)) == name
        alone = vars(tool.build_parser(name).parse_args(argv))
        full = vars(whole.parse_args(argv))
        assert alone.pop("command_parser").format_help() == \
            full.pop("command_parser").format_help()
        assert alone == full
    assert tool._command_named(("--help", "layers")) is None
    assert tool._command_named(("layer",)) is None


@pytest.mark.parametrize("columns", ["30", "64", "150"])
def test_help_wraps_as_argparse_would_though_the_width_is_read_late(monkeypatch, capsys,
                                                                     columns):
    """eprun's formatter asks for the terminal's width when it formats, not when each
    argument is declared: the texts are the ones argparse's own formatter makes."""
    import argparse

    monkeypatch.setenv("COLUMNS", columns)
    ours = tool.build_parser()
    monkeypatch.setattr(tool, "_Formatter", argparse.RawDescriptionHelpFormatter)
    stock = tool.build_parser()
    assert ours.format_help() == stock.format_help()
    for name in ("layers", "sensitivity"):
        mine = ours._subparsers._group_actions[0].choices[name]
        theirs = stock._subparsers._group_actions[0].choices[name]
        assert mine.prog == theirs.prog
        assert mine.format_help() == theirs.format_help()
        assert mine.format_usage() == theirs.format_usage()


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


def test_a_near_miss_command_gets_a_suggestion(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    assert "did you mean 'layers'?" in eprun_fails(2, "layer", fp32, int8, "1")
    assert "did you mean" not in eprun_fails(2, "frobnicate", fp32)


def test_a_list_given_as_several_arguments_gets_the_joined_form(eprun_fails, lab_pair):
    fp32, _ = lab_pair
    line = eprun_fails(2, "partition", fp32, "MatMul", "Add", "Relu")
    assert "joined with commas: MatMul,Add,Relu" in line
    assert "joined with commas" not in eprun_fails(2, "partition", fp32, "MatMul", "--nope")


def test_the_seed_is_taken_in_both_forms(run_eprun_here, eprun, eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    assert eprun("layers", fp32, int8, "--seed", "5") == eprun("layers", fp32, int8, "5")
    assert eprun("settings", int8, "--seed=7") == eprun("settings", int8, "7")
    positional = run_eprun_here("check", fp32, int8, "3", "--profile", "int8")
    optional = run_eprun_here("check", fp32, int8, "--seed", "3", "--profile", "int8")
    assert positional.answer == optional.answer and positional.answer["seed"] == 3
    assert run_eprun_here("check", fp32, int8, "--profile", "int8").answer["seed"] == 0
    assert "required: seed" in eprun_fails(2, "growth", fp32, int8)
    assert "given twice, as 1 and 2" in eprun_fails(2, "layers", fp32, int8, "1", "--seed", "2")
    assert eprun("layers", fp32, int8, "4", "--seed", "4")["seed"] == 4  # the same twice: fine


def test_bare_eprun_shows_a_short_usage_and_where_help_is(run_eprun_here):
    result = run_eprun_here()
    assert result.code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) <= 4 and lines[0].startswith("usage: eprun.py")
    assert "layers" in result.stderr and "--help" in lines[-1]
    assert lines[-1].startswith("eprun: error: no command given")


def test_a_seed_after_an_option_is_still_the_seed(run_eprun_here, eprun, eprun_fails, lab_pair):
    """argparse fills an optional positional before the options: a seed typed after one
    (as eprun always took it) must not become an unrecognized argument."""
    fp32, int8 = lab_pair
    assert eprun("layers", fp32, int8, "--rows", "8", "5") == eprun("layers", fp32, int8, "5",
                                                                     "--rows", "8")
    assert eprun("settings", int8, "--rows", "8", "6")["seed"] == 6
    checked = run_eprun_here("check", fp32, int8, "--profile", "int8", "3")
    assert checked.answer["seed"] == 3
    assert "unrecognized arguments: 2" in eprun_fails(2, "layers", fp32, int8, "--rows", "8",
                                                       "1", "2")
    assert "argument seed: seed 'abc'" in eprun_fails(2, "layers", fp32, int8, "--rows", "8",
                                                       "abc")


def test_an_invocation_is_itself_and_main_gives_the_previous_one_back():
    import eprun as tool

    before = list(tool._INVOCATIONS)
    with pytest.raises(SystemExit):
        tool.main([])
    assert len(tool._INVOCATIONS) == len(before)
    assert all(a is b for a, b in zip(tool._INVOCATIONS, before))


def test_a_hint_built_from_what_was_typed_stays_on_one_line(eprun_fails, lab_pair):
    """The joined-list hint repeats the user's words: a carriage return among them (found by
    test_random_argv_never_tracebacks) must not split the one stderr line."""
    fp32, _ = lab_pair
    line = eprun_fails(2, "partition", fp32, "\r", fp32)
    assert "joined with commas" in line and "\r" not in line


def test_bare_eprun_is_a_short_usage_error(run_eprun_here):
    result = run_eprun_here()
    assert result.code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) <= 4, result.stderr
    assert "--help" in result.stderr
    assert "Traceback" not in result.stderr


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
