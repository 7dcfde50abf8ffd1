"""Layer 1, contract and declarations: every command's declared fields are in a real answer,
its help has them and an example, every exit code is documented, the argument parsers take
and refuse what they say, error lines escape what a terminal would act on, and non-finite
numbers are strict JSON's null."""
from __future__ import annotations

import argparse
import re
import sys

import models
import pytest
from conftest import EPRUN, ROOT, in_process, one_error_line

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


def help_of(capfd, monkeypatch, *words: str) -> str:
    """``python eprun.py WORDS --help``'s text, from main(argv) here (the program name is read
    off ``sys.argv[0]``, as typed); it exits 0 and says nothing on stderr."""
    monkeypatch.setattr(sys, "argv", [str(EPRUN)])
    code, out, err = in_process(capfd, *words, "--help")
    assert code == 0 and err == ""
    return out


@pytest.mark.parametrize("name", list(tool.COMMANDS))
def test_every_command_has_help_with_its_fields_and_an_example(name, capfd, monkeypatch):
    text = help_of(capfd, monkeypatch, name)
    assert f"usage: eprun.py {name}" in text and "JSON:" in text
    flat = " ".join(text.split())
    command = tool.COMMANDS[name]
    for field in command.fields:
        assert f'"{field}"' in flat
    assert f"example: eprun.py {name} " in flat
    assert command.example.startswith(f"eprun.py {name} ")


def test_the_parser_offers_exactly_the_declared_commands(capfd, monkeypatch):
    parser = tool.build_parser()
    (subparsers,) = [action for action in parser._actions if action.dest == "command"]
    assert list(subparsers.choices) == list(tool.COMMANDS)
    assert {"providers", "partition", "expose", "layers", "growth", "settings"} <= set(
        tool.COMMANDS)  # the contract's commands
    top = help_of(capfd, monkeypatch)
    for name in tool.COMMANDS:
        assert re.search(rf"^\s+{name}\s", top, re.MULTILINE), name


def test_every_exit_code_is_in_the_help_docstring_and_commands_md(capfd, monkeypatch):
    top = " ".join(help_of(capfd, monkeypatch).split())
    commands = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    table = commands[commands.index("## Exit codes"):]
    for code, name, _ in tool.EXIT_CODES:
        assert f"{code} {name}" in top
        assert re.search(rf"^\s+{code}\s", tool.__doc__, re.MULTILINE), code
        assert re.search(rf"^\| {code}\b", table, re.MULTILINE), code


# Parsed arguments that do not reach a command as themselves: settle_seed folds these into
# "seed" (and "seed_given"), invoke builds "inputs", "ep_options" and "extra_options" of the
# others, and --format chooses how main prints the answer.
FOLDED = {"seed_option": "seed", "seed_positional": "seed", "rows": "inputs",
          "dim": "inputs", "input_range": "inputs", "inputs_file": "inputs",
          "iteration": "inputs", "ep_option": "ep_options", "extra_option": "extra_options",
          "format": None}


def test_every_flag_reaches_the_command_and_every_option_is_a_flag():
    """What the parser passes is what the function and its options record name, each field
    a flag of that name: a flag that went nowhere, or a record field no flag sets (but the
    Python-only ones), fails here."""
    import dataclasses
    import inspect

    python_only = {"clipping", "command_line", "seed_given"}
    for command in tool.COMMANDS.values():
        # every command is function(*positionals, options): its models (and seed), then
        # the record of its flags
        parameters = list(inspect.signature(command.function).parameters.values())
        assert [p.name for p in parameters[:len(command.positionals) + 1]] == [
            *command.positionals, "options"], command.name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY
                   for p in parameters[len(command.positionals) + 1:]), command.name
        fields = {field.name for field in dataclasses.fields(command.options)}
        dests = {argument.options.get("dest") or argument.names[-1].lstrip("-").replace("-", "_")
                 for argument in command.arguments}
        reached = {FOLDED.get(dest, dest) for dest in dests} - {None}
        taken = set(command.positionals) | fields
        assert reached - taken == set(), (command.name, reached - taken)
        unset = fields - reached - python_only
        if command.name == "growth":  # layers' record, without --metrics
            unset -= {"metrics"}
        assert unset == set(), (command.name, unset)
        assert set(command.positionals) <= reached, command.name


def test_the_module_offers_every_command_and_lists_them_as_help_does():
    assert set(tool.COMMANDS) <= set(tool.__all__)
    assert all(callable(getattr(tool, name)) for name in tool.__all__
               if name not in ("COMMANDS", "METRICS"))
    listed = re.findall(r"^    ([a-z]+) +<", tool.__doc__, re.MULTILINE)
    assert listed == list(tool.COMMANDS)


@pytest.mark.parametrize(("text", "items"), [
    ("a,b,c", ["a", "b", "c"]),
    (" a , b ,,c, ", ["a", "b", "c"]),
    ("c,a,b", ["c", "a", "b"]),
    ("a,a", ["a", "a"]),
    ("\tMatMul\t", ["MatMul"]),
    ("", []),
    (",,", []),
    (" , ", []),
])
def test_parse_list(text, items):
    assert tool.parse_list(text) == items


@pytest.mark.parametrize(("text", "seed"), [
    ("0", 0), ("7", 7), ("007", 7), ("0000", 0), ("2026", 2026),
    ("1" + "0" * 30, 10 ** 30), pytest.param("9" * 4000, 10 ** 4000 - 1, id="4000 nines"),
])
def test_parse_seed_accepts(text, seed):
    assert tool.parse_seed(text) == seed


def test_parse_seed_past_the_int_conversion_limit():
    """main() lifts Python's 4,300-digit limit; with it lifted a seed of any length reads."""
    limit = getattr(sys, "get_int_max_str_digits", None)
    assert limit is not None, "every supported Python (3.9.14+) has the limit"
    before = limit()
    sys.set_int_max_str_digits(0)
    try:
        assert tool.parse_seed("9" * 5000) == 10 ** 5000 - 1
        assert tool.parse_seed("0" * 4999 + "5") == 5
    finally:
        sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("text", [
    "", " ", "-1", "+1", "1.5", "1e3", "0x10", "1_000", " 7", "7 ", "abc", "-0",
    "\u0663",            # ARABIC-INDIC DIGIT THREE: int() reads it as 3
    "\uff11\uff12",      # FULLWIDTH 12
    "\u00b2",            # SUPERSCRIPT TWO: str.isdigit() says yes
    "1\u0663",
])
def test_parse_seed_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_seed(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("seq=16", ("seq", 16)),
    (" seq = 16 ", ("seq", 16)),
    ("input_ids:1=8", ("input_ids:1", 8)),
    ("a=b=3", ("a=b", 3)),
    ("seq=01", ("seq", 1)),
])
def test_parse_dim_accepts(text, parsed):
    assert tool.parse_dim(text) == parsed


@pytest.mark.parametrize("text", ["seq=0", "seq=-1", "seq=+1", "seq=1.5", "=5", " =5", "seq",
                                  "seq=", "seq=\u0663", "seq=1e3"])
def test_parse_dim_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_dim(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("x:-1,1", ("x", (-1.0, 1.0))),
    ("x:1,1", ("x", (1.0, 1.0))),
    ("x:1e-3,2.5", ("x", (0.001, 2.5))),
    ("a:b:0,2", ("a:b", (0.0, 2.0))),
    (" x : 0 , 2 ", ("x", (0.0, 2.0))),
])
def test_parse_input_range_accepts(text, parsed):
    assert tool.parse_input_range(text) == parsed


@pytest.mark.parametrize("text", ["x:2,1", "x:nan,1", "x:0,nan", "x:0,inf", "x:-inf,0", "x:1",
                                  ":0,1", " :0,1", "0,1", "x:0,1,2", "x:a,1", "x:", "x:,"])
def test_parse_input_range_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_input_range(text)


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), ("-1", -1.0), ("0.99", 0.99),
                                         ("1e-1", 0.1), ("0", 0.0), ("-1.0", -1.0)])
def test_parse_cosine_accepts(text, value):
    assert tool.parse_cosine(text) == value


@pytest.mark.parametrize("text", ["1.0000001", "-1.01", "2", "nan", "inf", "-inf", "abc", ""])
def test_parse_cosine_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        tool.parse_cosine(text)


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


# -- odd inputs --------------------------------------------------------------------------------

def test_seeds_of_any_length(eprun, lab_pair):
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    fp32, int8 = lab_pair
    seed = int("7" * 6000)
    answer = eprun("growth", fp32, int8, str(seed))
    assert answer["seed"] == seed


def test_error_lines_escape_control_characters():
    assert tool.one_line("a\r b\n\n  c\x00d\te") == "a\\r b c\\x00d e"


def test_non_finite_values_are_strict_json_null(eprun, tmp_path):
    """Weights of 1e30 overflow float32 to inf and then nan: strict JSON writes null."""
    fp32 = models.save(models.chain(widths=(8, 8, 8, 8, 4), scale=1e30), tmp_path / "big.onnx")
    answer = eprun("settings", fp32, "0")
    assert answer["baseline"]["max_abs_output"] is None
    assert answer["baseline"]["mean_output"] is None
    grown = eprun("growth", fp32, fp32, "0")
    assert None in grown["rel_error"]


# -- shared flags: one name, one metavar, one help, one default --------------------------------

def shown_flags() -> dict:
    """Every flag each command's help shows: ``{flag: {command: (metavar, help, default)}}``,
    read off the parser the way --help prints them."""
    import argparse

    parser = tool.build_parser()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction)).choices
    shown: dict = {}
    for name, sub in commands.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            for part in formatter._format_action_invocation(action).split(", "):
                option, _, metavar = part.partition(" ")
                shown.setdefault(option, {})[name] = (metavar, action.help, repr(action.default))
    return shown


def test_every_shared_flag_has_one_metavar_one_help_and_one_default():
    """--providers was LIST in five commands and PROVIDERS in two, --profile and --mode meant
    two things each: a flag several commands take is declared once (a group's record, or one
    shared argument), and a different meaning has a different name."""
    shared = {option: per for option, per in shown_flags().items() if len(per) > 1}
    assert {"--providers", "--reference-providers", "--allow-fallback", "--rtol", "--atol",
            "--min-cos", "--profile", "--seed", "--rows", "--format", "--force", "--local",
            "--save-plots", "--ep-option"} <= set(shared)
    for option, per in shared.items():
        for what, k in (("metavar", 0), ("help", 1), ("default", 2)):
            assert len({shown[k] for shown in per.values()}) == 1, (option, what, per)


@pytest.mark.parametrize(("argv", "old", "new"), [
    (["partition", "@int8", "MatMul"], ["--mode", "ort"], ["--rule", "ort"]),
    (["layers", "@fp32", "@int8", "1"], ["--output", "y"], ["--output-name", "y"]),
])
def test_a_renamed_flag_keeps_its_old_spelling_out_of_the_help(capfd, lab_pair, argv, old, new):
    """The old spelling still parses to the same answer; the help shows the new name only."""
    fp32, int8 = lab_pair
    argv = [{"@fp32": str(fp32), "@int8": str(int8)}.get(word, word) for word in argv]
    answers = []
    for flag in (old, new):
        code, out, err = in_process(capfd, *argv, *flag)
        assert code == 0, err
        answers.append(out)
    assert answers[0] == answers[1]
    code, out, _ = in_process(capfd, argv[0], "--help")
    assert code == 0 and new[0] in out and f"{old[0]} " not in out.replace(new[0], "")
