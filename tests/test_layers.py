"""eprun.py reads top-down in layers: each layer uses only the layers above it.

The module docstring's table of contents names every layer banner in order, and no top-level
definition refers to a name defined in a later layer (the command line, last, ties them all
together). A helper moved to the wrong place, or a shared part borrowed from a command's
section, turns this red.
"""
from __future__ import annotations

import ast
import functools
import re

import pytest
from conftest import EPRUN

LAYER = re.compile(r"^# == (\d+)\. (.+?) =+$")


@functools.lru_cache(maxsize=2)
def parsed(path) -> tuple[str, ast.Module]:
    """The text and syntax tree of ``path`` (eprun.py), parsed once per process (a third of a
    second each time; the tests only read the tree)."""
    source = path.read_text(encoding="utf-8")
    return source, ast.parse(source)


def layered() -> tuple[list[tuple[int, str]], list[tuple[int, ast.stmt]], str]:
    """The layer banners (number, title), each top-level statement with its layer number (0
    before the first banner), and the module docstring."""
    source, tree = parsed(EPRUN)
    starts = {}  # line number -> layer number
    banners = []
    for number, line in enumerate(source.splitlines(), start=1):
        found = LAYER.match(line)
        if found:
            starts[number] = int(found.group(1))
            banners.append((int(found.group(1)), found.group(2)))
    placed, layer = [], 0
    lines = sorted(starts)
    for statement in tree.body:
        while lines and lines[0] < statement.lineno:
            layer = starts[lines.pop(0)]
        placed.append((layer, statement))
    return banners, placed, ast.get_docstring(tree) or ""


def defined_names(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return {node.id for target in targets for node in ast.walk(target)
                if isinstance(node, ast.Name)}
    return set()


def used_names(statement: ast.stmt) -> set[str]:
    """Names the statement reads from the module: every name loaded, less those it binds
    itself (parameters, local assignments) and those only in annotations (strings at run
    time under ``from __future__ import annotations``)."""
    annotations = set()
    for node in ast.walk(statement):
        for field in ("annotation", "returns"):
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                annotations |= {id(inner) for inner in ast.walk(value)}
    bound = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node is not statement:
            bound.add(node.name)
    return {node.id for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            and id(node) not in annotations and node.id not in bound}


def test_the_docstring_lists_every_layer_in_order():
    banners, _, docstring = layered()
    assert [number for number, _ in banners] == list(range(1, len(banners) + 1))
    assert len(banners) >= 7
    listed = re.findall(r"^ {4}(\d+)\. (.+?)  ", docstring, flags=re.M)
    assert [(int(number), title) for number, title in listed] == banners


def test_no_layer_reaches_into_a_later_one():
    _, placed, _ = layered()
    layer_of = {}
    for layer, statement in placed:
        for name in defined_names(statement):
            layer_of.setdefault(name, layer)
    reaching = []
    for layer, statement in placed:
        for name in sorted(used_names(statement)):
            if layer_of.get(name, 0) > layer:
                owner = ", ".join(sorted(defined_names(statement))) or ast.dump(statement)[:40]
                reaching.append(f"{owner} (layer {layer}) uses {name} (layer {layer_of[name]})")
    assert not reaching, "\n".join(reaching)


def test_only_the_io_layers_reach_the_invocation():
    """A command's inputs are its arguments: ``current_invocation()`` (what the call holds, for
    a signal to release) is read in layers 2 and 3 only, never by what computes an answer."""
    _, placed, _ = layered()
    reaching = [f"{', '.join(sorted(defined_names(statement)))} (layer {layer})"
                for layer, statement in placed
                if "current_invocation" in used_names(statement) and layer not in (2, 3)]
    assert not reaching, reaching


def test_the_checker_sees_a_reach(tmp_path, monkeypatch):
    """The two tests above can fail: a function in layer 1 calling one of layer 2 is caught."""
    import test_layers

    planted = tmp_path / "planted.py"
    planted.write_text('"""x.\n\n    1. One  a\n    2. Two  b\n"""\n'
                       "# == 1. One ===\ndef low():\n    return high()\n"
                       "# == 2. Two ===\ndef high():\n    return 1\n", encoding="utf-8")
    monkeypatch.setattr(test_layers, "EPRUN", planted)
    banners, _, _ = layered()
    assert banners == [(1, "One"), (2, "Two")]
    with pytest.raises(AssertionError, match=r"low \(layer 1\) uses high \(layer 2\)"):
        test_no_layer_reaches_into_a_later_one()


# radon's rank C ends at 20: a function above it is one a reader cannot hold in their head.
RANK_C = 20
ONE_PIECE = "# One piece:"


def too_complex(source: str) -> list[str]:
    """The functions and methods of ``source`` whose cyclomatic complexity (radon's measure)
    is above rank C and that no ``# One piece:`` comment, right above the ``def`` (and its
    decorators), says must stay whole."""
    from radon.complexity import cc_visit

    lines = source.splitlines()
    blocks = cc_visit(source)  # functions and methods, each once, and the classes
    found = []
    for function in blocks:
        if not hasattr(function, "is_method") or function.complexity <= RANK_C:
            continue  # a class (its methods are counted on their own), or simple enough
        above = function.lineno - 2  # the line before the def (lineno is 1-based)
        while above >= 0 and lines[above].lstrip().startswith("@"):
            above -= 1
        comment = []
        while above >= 0 and lines[above].lstrip().startswith("#"):
            comment.insert(0, lines[above].strip())
            above -= 1
        if not comment or not comment[0].startswith(ONE_PIECE):
            found.append(f"{function.fullname} (line {function.lineno}): {function.complexity}")
    return found


def test_no_function_above_rank_c_without_saying_why():
    """Each function of eprun.py is at most rank C (complexity 20) in radon's measure, or a
    ``# One piece:`` comment above it says why it must stay one piece."""
    offenders = too_complex(EPRUN.read_text(encoding="utf-8"))
    assert not offenders, "split these, or say why each is one piece:\n" + "\n".join(offenders)


def test_the_complexity_check_sees_a_tangle():
    """The test above can fail: 21 branches fail it, the comment excuses them, 20 pass."""
    def tangle(branches: int, comment: str = "") -> str:
        body = "".join(f"    if x == {k}:\n        return {k}\n" for k in range(branches - 1))
        return f"{comment}def tangled(x):\n{body}    return -1\n"

    assert too_complex(tangle(21)) == ["tangled (line 1): 21"]
    assert too_complex(tangle(21, "# One piece: a lookup table.\n")) == []
    assert too_complex(tangle(20)) == []
    method = "class Holder:\n" + "".join(f"    {line}\n" for line in tangle(21).splitlines())
    assert too_complex(method) == ["Holder.tangled (line 2): 21"]


def test_no_module_level_name_is_defined_twice():
    """A second ``def _worse`` far below the first replaced it for every caller (node data
    then called the gate's): ruff does not see a redefinition once the first is used."""
    _, tree = parsed(EPRUN)
    seen: dict[str, int] = {}
    twice = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if node.name in seen:
                twice.append(f"{node.name} (lines {seen[node.name]} and {node.lineno})")
            seen[node.name] = node.lineno
    assert not twice, twice
