"""The command line as declared: every command's fields, help, example and exit codes, and the
messages that say what to do when a user gets something wrong."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import EPRUN, ROOT, imported_by, run_eprun

import eprun as tool


def default_argv(name: str, fp32, int8, tmp_path) -> list:
    """A default invocation of each command on the lab pair. A new command must add one."""
    return {
        "providers": ["providers", fp32, "CPUExecutionProvider"],
        "partition": ["partition", int8, "MatMul"],
        "expose": ["expose", fp32, tmp_path / "exposed.onnx"],
        "layers": ["layers", fp32, int8, "1"],
        "growth": ["growth", fp32, int8, "1"],
        "settings": ["settings", int8, "1"],
        "placement": ["placement", int8, "CPUExecutionProvider"],
        "check": ["check", fp32, fp32],
        "report": ["report", fp32, int8, "--out-dir", tmp_path / "report"],
        "sensitivity": ["sensitivity", fp32, int8, "1"],
        "weights": ["weights", fp32, int8],
        "inspect": ["inspect", int8],
        "reduce": ["reduce", int8, "--output", tmp_path / "small.onnx", "--check",
                   f"{sys.executable} -c 'raise SystemExit(1)' {{model}}"],
    }[name]


# The contract's answers, key for key and in this order (README), written out again here: a
# contract-shaped run (one float32 [batch, F] input, no options) adds nothing to them.
CONTRACT_FIELDS = {
    "providers": ["model", "available", "cases"],
    "partition": ["model", "supported", "nodes", "claimed", "partition_count", "handoffs",
                  "partitions"],
    "expose": ["model", "out", "boundaries", "outputs"],
    "layers": ["seed", "rows", "layer_count", "layers"],
    "growth": ["seed", "layer_count", "rel_error", "ratios", "monotone", "total_growth",
               "max_ratio"],
    "settings": ["model", "seed", "baseline", "cases", "all_equal"],
}


@pytest.mark.parametrize("name", list(tool.COMMANDS))
def test_every_declared_field_is_in_a_real_answer(eprun, lab_pair, tmp_path, name):
    command = tool.COMMANDS[name]
    answer = eprun(*default_argv(name, *lab_pair, tmp_path))
    assert tuple(answer) == command.fields
    if name in CONTRACT_FIELDS:
        assert list(answer) == CONTRACT_FIELDS[name]


@pytest.mark.parametrize("name", list(tool.COMMANDS))
def test_every_command_has_help_with_its_fields_and_an_example(name):
    result = subprocess.run([sys.executable, str(EPRUN), name, "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert f"usage: eprun.py {name}" in result.stdout and "JSON:" in result.stdout
    flat = " ".join(result.stdout.split())
    command = tool.COMMANDS[name]
    for field in command.fields:
        assert f'"{field}"' in flat
    assert f"example: eprun.py {name} " in flat
    assert command.example.startswith(f"eprun.py {name} ")


def test_the_parser_offers_exactly_the_declared_commands():
    parser = tool.build_parser()
    (subparsers,) = [action for action in parser._actions if action.dest == "command"]
    assert list(subparsers.choices) == list(tool.COMMANDS)
    assert {"providers", "partition", "expose", "layers", "growth", "settings"} <= set(
        tool.COMMANDS)  # the contract's commands
    top = subprocess.run([sys.executable, str(EPRUN), "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    for name in tool.COMMANDS:
        assert re.search(rf"^\s+{name}\s", top, re.MULTILINE), name


def test_every_exit_code_is_documented_in_help_docstring_and_readme():
    top = " ".join(subprocess.run([sys.executable, str(EPRUN), "--help"], capture_output=True,
                                  text=True, timeout=60).stdout.split())
    readme = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Exit codes"):]
    for code, name, _ in tool.EXIT_CODES:
        assert f"{code} {name}" in top
        assert re.search(rf"^\s+{code}\s", tool.__doc__, re.MULTILINE), code
        assert re.search(rf"^\| {code}\b", table, re.MULTILINE), code


def test_an_op_list_that_matches_nothing_gets_near_misses(run_eprun_here, lab_pair):
    fp32, _ = lab_pair
    result = run_eprun_here("partition", fp32, "matmul,Addd")
    assert result.code == 0 and result.answer["claimed"] == 0
    assert ("eprun: note: no op type in 'matmul,Addd' occurs in" in result.stderr)
    assert "did you mean matmul -> MatMul, Addd -> Add?" in result.stderr
    assert "Its op types: MatMul, Add, Relu" in result.stderr
    assert "note" not in run_eprun_here("partition", fp32, "MatMul,Conv").stderr


BLOCK_ONNX = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "onnx" or name.startswith("onnx."):
            raise ModuleNotFoundError("No module named 'onnx'", name="onnx")
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_missing_package_names_itself_and_the_fix(lab_pair):
    fp32, int8 = lab_pair
    result = run_eprun("layers", fp32, int8, "1", prefix=[sys.executable, "-c", BLOCK_ONNX,
                                                           str(EPRUN)])
    assert result.code == 4 and result.stdout == ""
    assert result.stderr.splitlines() == [
        (f"eprun: error: eprun needs the Python package 'onnx', which {sys.executable} does not "
        "have: run eprun with the Python that make lab set up (.venv/bin/python eprun.py ...), "
        "or install it with: python -m pip install onnx onnxruntime numpy")]


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


def test_command_functions_take_keyword_arguments():
    """What the parser passes is what the function names: no positional plumbing."""
    import inspect

    for command in tool.COMMANDS.values():
        parameters = inspect.signature(command.run).parameters
        dests = {argument.options.get("dest") or argument.names[-1].lstrip("-").replace("-", "_")
                 for argument in command.arguments}
        dests |= {"inputs"} if "rows" in dests else set()
        missing = [name for name in parameters if name not in dests and
                   parameters[name].default is inspect.Parameter.empty]
        assert missing == [], (command.name, missing)


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
    argv = [sys.executable, str(EPRUN), "layers", str(fp32), str(int8), "1"]
    env = {**os.environ, "EPRUN_PROGRESS_AFTER": "0"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    answer = json.loads(proc.stdout.read())
    proc.wait(timeout=60)
    shown = read_all(leader).decode()
    os.close(leader)
    assert proc.returncode == 0 and answer["layer_count"] == 6
    # each step overwrites the last, with the time left at the pace so far, then cleared
    steps = [rf"\reprun: comparing boundaries: step {k} of 6, about \d+ s left\x1b\[K"
             for k in range(1, 6)]
    assert re.fullmatch("".join(steps) + r"\reprun: comparing boundaries: step 6 of 6"
                        r"\x1b\[K\r\x1b\[K", shown), shown
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert piped.returncode == 0 and piped.stderr == ""
    assert json.loads(piped.stdout) == answer


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


@pytest.mark.parametrize("mode", ["file", "ort"])
def test_partition_reads_the_graph_without_importing_onnx(lab_pair, mode):
    """Where protobuf is its upb build, partition parses the graph with onnx's generated
    message module alone; elsewhere it imports onnx. The answer is the same either way."""
    code, out, imported = imported_by("partition", lab_pair[1], "MatMul", "--mode", mode)
    assert code == 0
    assert ("onnx" in imported) is not upb_protobuf(), imported
    if mode == "file":  # numpy comes with onnx, never for the walk itself
        assert ("numpy" in imported) is ("onnx" in imported), imported
    assert json.loads(out) == tool.partition(str(lab_pair[1]), ["MatMul"], mode)


def test_messages_read_alone_are_the_ones_onnx_hands_out(lab_pair):
    """The premise of reading a graph without onnx: upb keeps one class per message type, so
    a model parsed before ``import onnx`` is a model onnx's own functions take."""
    script = (f"import sys; sys.path.insert(0, {str(EPRUN.parent)!r}); import eprun\n"
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


def test_plugin_candidates_hold_every_plugin_metadata_finds(tmp_path, monkeypatch):
    """The quick scan of metadata folders keeps every distribution installed_plugins would
    keep (named onnxruntime-ep-*, or requiring onnxruntime) and skips onnxruntime's own."""
    def distribution(name: str, requires: str = "") -> None:
        info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                       + (f"Requires-Dist: {requires}\n" if requires else "")
                                       + "\n")
    distribution("onnxruntime-ep-example")
    distribution("vendor-npu-ep", "onnxruntime>=1.22")
    distribution("onnxruntime-gpu", "numpy")
    distribution("unrelated", "numpy")
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    found = {os.path.basename(path) for path in tool._plugin_candidates()}
    assert found == {"onnxruntime_ep_example-1.0.dist-info", "vendor_npu_ep-1.0.dist-info"}
    zipped = tmp_path / "packages.zip"
    zipped.write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(zipped)])
    assert tool._plugin_candidates() is None  # a zip on the path: importlib.metadata decides


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


def test_only_partition_and_expose_read_messages_apart_from_onnx(lab_pair, tmp_path):
    """A command that imports onnx anyway parses with onnx's own classes: loading the
    generated module apart too would cost it a few hundredths of a second for nothing."""
    fp32, int8 = lab_pair
    script = (f"import sys; sys.path.insert(0, {str(EPRUN.parent)!r}); import eprun\n"
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


def test_the_module_offers_every_command_and_lists_them_as_help_does():
    assert set(tool.COMMANDS) <= set(tool.__all__)
    assert all(callable(getattr(tool, name)) for name in tool.__all__ if name != "COMMANDS")
    listed = re.findall(r"^    ([a-z]+) +<", tool.__doc__, re.MULTILINE)
    assert listed == list(tool.COMMANDS)


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


def test_a_run_imports_no_shutil_or_tempfile_unless_it_copies(lab_pair):
    """argparse's width and the held chatter cost a short command neither module."""
    script = ("import sys, runpy\n"
              f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
              "import atexit\n"
              "atexit.register(lambda: print('shutil' in sys.modules, 'tempfile' in "
              "sys.modules, file=sys.stderr, flush=True))\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", script, "providers", str(lab_pair[0]),
                             "CPUExecutionProvider"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    expected = "True True" if not hasattr(os, "memfd_create") else "False False"
    assert result.stderr.splitlines()[-1] == expected


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


# eprun.py run as typed, from a script that leaves an object for the interpreter to finalize
# (it says so on fd 2 when it is) and an atexit handler.
_ENDING = (
    "import atexit, os, runpy, sys\n"
    f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
    "if os.environ.get('WITH_MULTIPROCESSING'):\n    import multiprocessing\n"
    "class Finalized:\n    def __del__(self, write=os.write):\n"
    "        write(2, b'finalized\\n')\n"
    "left = Finalized()\n"
    "atexit.register(lambda: os.write(2, b'atexit\\n'))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


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
    script = (f"import sys; sys.path.insert(0, {str(EPRUN.parent)!r}); import eprun\n"
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


@pytest.mark.parametrize("dims", [None, [], [3], [0, 2], ["batch", None, 4]])
def test_tensor_type_is_the_one_onnx_helper_makes(dims):
    from onnx import helper

    made = tool.tensor_type(7, dims)
    assert made.SerializeToString() == helper.make_tensor_type_proto(7, dims).SerializeToString()
    assert made.tensor_type.HasField("shape") is (dims is not None)


def test_external_locations_read_as_onnx_reads_them():
    """As onnx 1.17+ reads them: offset and length are integers where given, a negative or
    empty one is refused. Older onnx kept an empty offset as text and took -1; eprun refuses
    both there too (onnxruntime does), so onnx itself is the oracle only where it refuses."""
    import warnings

    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    cases = [({"location": "w.bin", "offset": "4096", "length": "64"}, ("w.bin", 4096, 64)),
             ({"location": "w.bin"}, ("w.bin", None, None)),
             ({"location": "w.bin", "offset": "0", "checksum": "x"}, ("w.bin", 0, None)),
             ({"location": "w.bin", "offset": "", "length": "3"}, "invalid literal"),
             ({"location": "w.bin", "offset": "-1"}, "offset must be non-negative"),
             ({"location": "w.bin", "length": "x"}, "invalid literal")]
    for entries, expected in cases:
        tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16],
                             data_location=TensorProto.EXTERNAL)
        for key, value in entries.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        try:
            theirs = ExternalDataInfo(tensor)
        except ValueError as exc:
            theirs = str(exc)
        if isinstance(expected, str):
            with pytest.raises(ValueError, match=expected) as ours:
                tool._external_location(tensor)
            assert not isinstance(theirs, str) or str(ours.value) == theirs \
                or "invalid literal" in theirs
            continue
        ours = tool._external_location(tensor)
        assert (ours.location, ours.offset, ours.length) == expected
        assert (theirs.location, theirs.offset, theirs.length) == expected
    tensor = TensorProto(name="w", data_location=TensorProto.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "__class__", "w.bin"  # a key is never taken as an attribute
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tool._external_location(tensor).location == ""
    for tensor in (TensorProto(name="a"), TensorProto(name="b", data_location=1),
                   TensorProto(name="c", data_location=TensorProto.EXTERNAL)):
        assert tool.uses_external_data(tensor) is uses_external_data(tensor)


@pytest.mark.parametrize("name", list(tool.COMMANDS))
def test_every_command_prints_a_table_when_asked(capfd, lab_pair, tmp_path, name):
    """--format table on every command: text for a person, its first line naming the command,
    never a JSON line."""
    argv = [str(word) for word in default_argv(name, *lab_pair, tmp_path)]
    assert tool.main([*argv, "--format", "table"]) in (0, 1)  # check's verdict may fail
    out = capfd.readouterr().out
    assert out.startswith(f"{name}:") or (name == "inspect" and out.startswith("model ")), out
    assert not any(line.startswith("{") for line in out.splitlines())


def table_rows(text: str) -> list[list[str]]:
    """The rows under a table's dashed rule, split on runs of two or more spaces."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if set(line) <= {"-", " "} and line) + 1
    rows = []
    for line in lines[start:]:
        if not line[:1].isspace() and not line[:1].isdigit():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


@pytest.mark.parametrize("metric, key, sense", [("sqnr", "sqnr_db", min), ("mse", "mse", max),
                                                (None, "rel_error", max)])
def test_the_layers_table_marks_the_worst_by_the_metric_asked_for(capfd, lab_pair, metric, key,
                                                                  sense):
    argv = ["layers", *map(str, lab_pair), "3", *(["--metrics", metric] if metric else [])]
    assert tool.main(argv) == 0
    entries = json.loads(capfd.readouterr().out)["layers"]
    assert tool.main([*argv, "--format", "table"]) == 0
    rows = table_rows(capfd.readouterr().out)
    marked = [int(row[0]) for row in rows if row[-1] == "<- worst"]
    assert marked == [sense(entries, key=lambda entry: entry[key])["index"]]


def test_the_growth_table_shows_the_local_column(capfd, lab_pair):
    argv = ["growth", *map(str, lab_pair), "3", "--local"]
    assert tool.main(argv) == 0
    local = json.loads(capfd.readouterr().out)["local_rel_error"]
    assert tool.main([*argv, "--format", "table"]) == 0
    text = capfd.readouterr().out
    assert "local rel error" in text.splitlines()[1]
    shown = [float(row[3]) for row in table_rows(text)]
    assert shown == pytest.approx(local, rel=1e-3)
