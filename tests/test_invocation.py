"""What one call of main() holds, and what it hands down (eprun.py, layers 2 and 11).

A command's inputs are its arguments: main() parses the words and passes them down (the
report's own command line, the parser's hints); onnxruntime's process-wide log level is set
by main() for the commands that declare they open sessions, and put back after them; the
``Invocation`` is only the I/O layers' registry of what to release.
"""
from __future__ import annotations

import json

import pytest
from conftest import imported_by, in_process

import eprun as tool

QUIET_ALONE = [name for name, command in tool.COMMANDS.items() if not command.onnxruntime]


def test_the_commands_that_open_no_session_say_so():
    assert sorted(QUIET_ALONE) == ["expose", "inspect", "partition", "weights"]


@pytest.mark.parametrize("name", QUIET_ALONE)
def test_a_command_declared_without_onnxruntime_never_imports_it(lab_pair, tmp_path, name):
    """Its declaration is what main() reads to quiet onnxruntime: a command that says it opens
    no session must not import onnxruntime, or its log would go unquieted."""
    fp32, int8 = map(str, lab_pair)
    argv = {"expose": ["expose", fp32, str(tmp_path / "out.onnx")],
            "inspect": ["inspect", int8],
            "partition": ["partition", fp32, "MatMul", "--rule", "ort"],
            "weights": ["weights", fp32, int8]}[name]
    code, out, imported = imported_by(*argv)
    assert code == 0 and json.loads(out)
    assert "onnxruntime" not in imported, imported


def spy_on(monkeypatch, name: str) -> list[int]:
    """Replace command ``name``'s function by one that records onnxruntime's log level as eprun
    last set it while the command runs, then answers as the real one does."""
    levels: list[int] = []
    command = tool.COMMANDS[name]

    def spy(*args):
        levels.append(tool.OrtLog.level)
        return command.function(*args)

    monkeypatch.setitem(tool.COMMANDS, name, command._replace(function=spy))
    return levels


def test_main_quiets_onnxruntime_for_the_command_and_puts_the_default_back(
        lab_pair, capfd, monkeypatch):
    monkeypatch.delenv("EPRUN_DEBUG", raising=False)
    levels = spy_on(monkeypatch, "providers")
    code, out, _ = in_process(capfd, "providers", str(lab_pair[0]), "CPUExecutionProvider")
    assert code == 0 and json.loads(out)["cases"]
    assert levels == [tool.OrtLog.QUIET]
    assert tool.OrtLog.level == tool.OrtLog.DEFAULT


def test_eprun_debug_keeps_onnxruntime_s_log(lab_pair, capfd, monkeypatch):
    monkeypatch.setenv("EPRUN_DEBUG", "1")
    levels = spy_on(monkeypatch, "providers")
    code, _, _ = in_process(capfd, "providers", str(lab_pair[0]), "CPUExecutionProvider")
    assert code == 0 and levels == [tool.OrtLog.DEFAULT]


def test_a_failed_command_puts_the_default_back_too(capfd, monkeypatch, tmp_path):
    monkeypatch.delenv("EPRUN_DEBUG", raising=False)
    levels = spy_on(monkeypatch, "providers")
    code, out, err = in_process(capfd, "providers", str(tmp_path / "none.onnx"),
                                "CPUExecutionProvider")
    assert (code, out) == (3, "") and err.startswith("eprun: error: ")
    assert levels == [tool.OrtLog.QUIET] and tool.OrtLog.level == tool.OrtLog.DEFAULT


def test_the_provider_check_puts_back_the_level_it_found(lab_pair, monkeypatch):
    """provider_refusal opens its session at the error level, then restores whatever eprun
    had set: quiet inside main(), the default for a direct call."""
    request = tool.ProviderRequest(["CPUExecutionProvider"])
    for level in (tool.OrtLog.QUIET, tool.OrtLog.DEFAULT):
        tool.OrtLog.set(level)
        tool.provider_refusal(str(lab_pair[0]), request, "CPUExecutionProvider")
        assert tool.OrtLog.level == level
    assert tool.OrtLog.level == tool.OrtLog.DEFAULT


def test_the_report_quotes_the_words_main_was_given(lab_pair, tmp_path, capfd):
    """The report's first line is the command line that wrote it, from main()'s own words;
    called from Python, the equivalent one."""
    fp32, int8 = map(str, lab_pair)
    out_dir = tmp_path / "typed"
    code, _, err = in_process(capfd, "report", fp32, int8, "--seed", "3", "--out-dir",
                              str(out_dir))
    assert code == 0, err
    first = (out_dir / "ep_report.md").read_text(encoding="utf-8").splitlines()[0]
    assert f"report {fp32} {int8} --seed 3 --out-dir {out_dir}`" in first
    tool.report(fp32, int8, 3, tool.ReportOptions(out_dir=str(tmp_path / "called")))
    first = (tmp_path / "called" / "ep_report.md").read_text(encoding="utf-8").splitlines()[0]
    assert f"`python eprun.py report {fp32} {int8} --seed 3`" in first


def test_a_usage_hint_reads_the_words_the_parser_was_given(capfd):
    """The hint for a list given as several words comes from the words main() parsed, handed
    to the parser (not from a state shared with another call)."""
    code, out, err = in_process(capfd, "partition", "m.onnx", "MatMul", "Gemm")
    assert (code, out) == (2, "")
    assert "a list is one argument, its items joined with commas: MatMul,Gemm" in err
    parser = tool.build_parser("partition", ("partition", "m.onnx", "Add", "Mul"))
    with pytest.raises(SystemExit):
        parser.parse_args(["partition", "m.onnx", "Add", "Mul"])
    assert "Add,Mul" in capfd.readouterr().err
    # the extra words trail the command line: the last place they stand, not an earlier one
    code, _, err = in_process(capfd, "partition", "Add", "MatMul", "Add")
    assert code == 2 and "joined with commas: MatMul,Add" in err
    # words after a flag, or after a flag's value, are no list's items: they go before it
    for flag in (["--fail-on-fallback"], ["--format", "table"], ["--form", "table"]):
        code, _, err = in_process(capfd, "providers", "m.onnx", "CPUExecutionProvider", *flag,
                                  "CUDAExecutionProvider")
        assert code == 2 and err.count("\n") == 1, err
        assert (f"the lists come before the flags: put CUDAExecutionProvider before {flag[0]}"
                in err), err
    # a second value of a flag given once: the flag takes one (each time, where it repeats)
    for argv, said in (
            (["providers", "m.onnx", "CPUExecutionProvider", "--ep-option",
              "CPUExecutionProvider:a=b", "CPUExecutionProvider:c=d"],
             ("--ep-option takes one value each time: give it again for "
              "CPUExecutionProvider:c=d")),
            (["partition", "m.onnx", "MatMul", "--ru", "ort", "Add"], "--rule takes one value")):
        code, _, err = in_process(capfd, *argv)
        assert code == 2 and said in err and "," not in err.split(";")[-1], err


def test_without_onnxruntime_a_command_s_own_checks_come_first(lab_pair, capfd, monkeypatch,
                                                              tmp_path):
    """Quieting onnxruntime must not import it ahead of the command's own checks: where it is
    missing, a missing model is still exit 3, and only a command that gets as far as a
    session says the package is missing (exit 4)."""
    monkeypatch.delenv("EPRUN_DEBUG", raising=False)

    def missing():
        raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")

    monkeypatch.setattr(tool, "import_ort", missing)
    fp32, int8 = map(str, lab_pair)
    code, out, err = in_process(capfd, "layers", str(tmp_path / "none.onnx"), int8, "1")
    assert (code, out) == (3, "") and "does not exist" in err
    code, out, err = in_process(capfd, "layers", fp32, int8, "1")
    assert (code, out) == (4, "") and "needs the Python package 'onnxruntime'" in err
    assert tool.OrtLog.level == tool.OrtLog.DEFAULT
