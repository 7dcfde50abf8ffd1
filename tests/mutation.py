"""Mutation testing for eprun.py: plant one bug at a time and check that the test suite goes red.

Not a test module (pytest collects only ``test_*.py``) and not part of ``make test`` or CI: a
run takes tens of minutes. ``make mutation`` runs it; by hand, from the repository root::

    .venv/bin/python tests/mutation.py                  # the planted bugs + 60 sampled mutants
    .venv/bin/python tests/mutation.py --sample 200 --seed 7 --jobs 2
    .venv/bin/python tests/mutation.py --sample 0       # the planted bugs alone
    .venv/bin/python tests/mutation.py --only growth_from --list   # ids and changes, no run
    # after writing a test, rerun one survivor with an earlier run's timings (no baseline):
    .venv/bin/python tests/mutation.py --only 'planted:missing-sorted' --no-control \
        --timings /tmp/eprun-mutation-XXXX/report.json

How it works:

1. Mutants. ``ast`` parses eprun.py, and every function body (not the argparse declarations,
   not docstrings, not f-strings or other string building) offers mutation points: comparison
   operators flipped or relaxed, ``and``/``or``, ``not x`` -> ``x``, ``+``/``-``, ``*``/``/``,
   numeric constants (0 -> 1, 1 -> 0 or 2, n -> n + 1), ``True``/``False``, ``return expr`` ->
   ``return None``, ``x[k]`` -> ``x[k - 1]`` for a loop index ``k``, one element dropped from a
   list or tuple display, a call statement removed (``.append`` skipped among them),
   ``max``/``min``, and ``sorted(x)``/``reversed(x)`` -> ``x``. Each mutant changes exactly one
   node. Its text is eprun.py with only that node's source span replaced, and it is kept only
   when it compiles and parses back to exactly the mutated tree. Its id, ``function:line:col:
   change``, is stable for a given eprun.py, so ``--seed`` and ``--sample`` reproduce a run.
   On top of those come ``PLANTED`` (ids ``planted:NAME``): bugs that once survived the suite
   (the issue "Kill the survivors, and keep them dead"), each found by function name and
   code shape. One whose target is gone (a function renamed, a line rewritten) is reported
   and skipped, and makes the exit status 1: update ``PLANTED`` then.
2. Copies. The working tree (without .git, the venvs and caches) is copied once into a
   temporary folder and once more per job; the venvs are symlinked into each copy because the
   README's examples run ``.venv/bin/python``. tests/conftest.py puts the tests' parent folder
   on ``sys.path`` and runs that folder's eprun.py, so pytest run with the copy as its working
   directory tests the copy's eprun.py. Before every mutant a copy is put back to the pristine
   state (tests may write files, e.g. the README's ``expose`` example).
3. Baseline. The unmutated suite runs once (with xdist) to record each test's duration; it
   must pass. The tests are then ordered fastest first (a module with module-scoped fixtures
   stays together), so that a killed mutant dies early with ``-x``. An unmutated "control" run
   in that order, the same way as a mutant's, must pass too, or the run is abandoned.
4. Runs. Each mutant runs ``pytest -x -p no:cacheprovider -p no:randomly -n 0 TESTS...`` in
   its copy with the interpreter running this script, as ``python -m pytest`` would (through
   ``python -c`` and a small plugin, ``PROBE``, that records durations and the first failure),
   ``--jobs`` mutants at a time, with a timeout; a timeout counts as killed but is shown
   apart. The failing test is run twice more on its own: a kill stands when it fails every
   time; a test that passes is flaky (timing-dependent tests are, on a loaded machine), is
   left out from then on, and the mutant's run goes on after it. A test that fails in the
   baseline and passes twice on its own is left out the same way.
5. Results. A table (id, killed/survived/timeout, the first failing test), the line
   ``mutation score: K killed of N (P%)``, every survivor with its diff, and a JSON report
   (``--report``; by default in the temporary folder, never in the repository).

Exit status: 0 after a run, 1 when a planted bug survived or could not be planted (the suite
should kill every one of them), 2 when the run could not start (the unmutated suite fails, for
one).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import fnmatch
import hashlib
import importlib.util
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

REPO = Path(__file__).resolve().parent.parent
TARGET = "eprun.py"
# Never copied into the copies the suite runs in (the venvs are symlinked instead).
NOT_COPIED = (".git", ".venv*", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache",
              ".mypy_cache", "build", "dist", "*.egg-info")
VENVS = ".venv*"

# Functions that only declare the command line (argparse options, help texts).
SKIP_FUNCTIONS = {"build_parser", "input_args", "input_options", "boundary_ops_option"}
# Command-line declarations anywhere else (argparse's, and eprun's own ``arg(...)``): the
# whole call is left alone.
ARGPARSE_CALLS = {"add_argument", "add_parser", "add_subparsers", "add_argument_group",
                  "add_mutually_exclusive_group", "set_defaults", "arg"}

COMPARE_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                 ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
                 ast.Is: ast.IsNot, ast.IsNot: ast.Is}
ARITHMETIC_FLIPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
SYMBOLS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
           ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
           ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.And: "and", ast.Or: "or"}
MIN_MAX = {"max": "min", "min": "max", "argmax": "argmin", "argmin": "argmax"}


class MutationError(Exception):
    """A mutant that cannot be made: its target is gone, or the result does not compile."""


# -- mutants -----------------------------------------------------------------------------------

class Mutant(NamedTuple):
    """One planted change. ``change`` edits a deep copy of eprun.py's module tree in place."""
    id: str
    kind: str  # "planted" or "generated"
    function: str
    line: int
    description: str
    change: Callable[[ast.Module], None]


class Made(NamedTuple):
    """A mutant's eprun.py text, with the one line that shows the change and the diff."""
    mutant: Mutant
    text: str
    summary: str
    diff: str


def _same(first: object, second: object) -> bool:
    if isinstance(first, ast.AST) and isinstance(second, ast.AST):
        return ast.dump(first) == ast.dump(second)
    return first == second


def changed_node(old: ast.AST, new: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """The smallest expression or statement of ``old`` that holds every difference from
    ``new`` (a copy of ``old`` with one change), with its counterpart; None when equal."""
    found = None
    while True:
        if isinstance(old, (ast.expr, ast.stmt)):
            found = (old, new)
        if type(old) is not type(new):
            return found
        differences = []
        for field in old._fields:
            first, second = getattr(old, field, None), getattr(new, field, None)
            if isinstance(first, list) and isinstance(second, list):
                if len(first) != len(second):
                    return found
                differences += [pair for pair in zip(first, second) if not _same(*pair)]
            elif not _same(first, second):
                differences.append((first, second))
        if not differences:
            return None if found is None or _same(*found) else found
        if len(differences) > 1 or not isinstance(differences[0][0], ast.AST):
            return found
        old, new = differences[0]


def splice(source: str, old: ast.AST, new: ast.AST) -> str:
    """``source`` with the span of ``old`` replaced by the text of ``new``: an expression in
    parentheses (right in any context), a statement indented as the one it replaces."""
    data = source.encode("utf-8")  # AST columns count UTF-8 bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    begin = starts[old.lineno - 1] + old.col_offset
    end = starts[old.end_lineno - 1] + old.end_col_offset
    text = ast.unparse(new)
    if isinstance(old, ast.expr):
        text = f"({text})"
    else:
        text = text.replace("\n", "\n" + " " * old.col_offset)
    return (data[:begin] + text.encode("utf-8") + data[end:]).decode("utf-8")


def make(mutant: Mutant, source: str, tree: ast.Module) -> Made:
    """Apply ``mutant`` to a copy of ``tree`` and write it back into ``source``. Raises
    MutationError when the target is gone, nothing changed or the result does not compile."""
    mutated = ast.parse(source)  # a fresh copy of ``tree``
    mutant.change(mutated)
    pair = changed_node(tree, mutated)
    if pair is None:
        raise MutationError("the change leaves the code as it was")
    old, new = pair
    text = splice(source, old, new)
    try:
        compile(text, TARGET, "exec")
        reparsed = ast.parse(text)
    except SyntaxError as exc:
        raise MutationError(f"does not compile: {exc}") from None
    if ast.dump(reparsed) != ast.dump(mutated):
        raise MutationError("the edited text does not parse back to the mutated tree")
    diff = "".join(difflib.unified_diff(source.splitlines(keepends=True),
                                        text.splitlines(keepends=True),
                                        f"a/{TARGET}", f"b/{TARGET}", n=1))
    removed = [line[1:] for line in diff.splitlines()[2:] if line.startswith("-")]
    added = [line[1:] for line in diff.splitlines()[2:] if line.startswith("+")]
    if len(removed) == len(added) == 1:  # the whole line: the node alone may say too little
        summary = f"`{_short(removed[0])}` -> `{_short(added[0])}`"
    else:
        summary = f"`{_short(ast.unparse(old))}` -> `{_short(ast.unparse(new))}`"
    return Made(mutant, text, summary, diff)


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put ``new`` where ``old`` is in ``tree`` (``old`` is not the root)."""
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for position, item in enumerate(value):
                    if item is old:
                        value[position] = new
                        return
    raise MutationError("node not found in the tree")


def _none() -> ast.Constant:
    return ast.Constant(value=None)


# -- generated mutants -------------------------------------------------------------------------

def _loop_indices(function: ast.AST) -> set[str]:
    """Names a function binds to integer positions: ``for k in range(...)`` and the first
    target of ``enumerate(...)``, in loops and comprehensions."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, ast.Call) \
                and isinstance(node.iter.func, ast.Name):
            target = node.target
            if node.iter.func.id == "enumerate" and isinstance(target, ast.Tuple) \
                    and target.elts:
                target = target.elts[0]
            elif node.iter.func.id != "range":
                continue
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


def _stringish(node: ast.AST) -> bool:
    """An operand that makes ``+`` string or list building rather than arithmetic."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, bytes))
    if isinstance(node, ast.BinOp):
        return _stringish(node.left) or _stringish(node.right)
    return isinstance(node, (ast.JoinedStr, ast.List, ast.Tuple, ast.ListComp, ast.Dict,
                             ast.Set, ast.DictComp, ast.SetComp))


def _prose(node: ast.AST) -> bool:
    """Text for people: an f-string, a string with a space in it, or ``+`` of such."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and any(c.isspace() for c in node.value)
    if isinstance(node, ast.BinOp):
        return _prose(node.left) or _prose(node.right)
    return isinstance(node, ast.JoinedStr)


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else None)


class _Points:
    """Walks eprun.py's function bodies and lists every mutation point as a Mutant."""

    def __init__(self, tree: ast.Module) -> None:
        self.positions = {id(node): index for index, node in enumerate(ast.walk(tree))}
        self.mutants: list[Mutant] = []
        self.seen: dict[str, int] = {}
        for statement in tree.body:
            self.definition(statement, prefix="")

    def definition(self, node: ast.AST, prefix: str) -> None:
        """A module- or class-level statement: only functions are mutated."""
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                self.definition(statement, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(node, prefix + node.name)

    def function(self, node: ast.AST, name: str) -> None:
        if name.split(".", maxsplit=1)[0] in SKIP_FUNCTIONS:
            return
        indices = _loop_indices(node)
        body = node.body[1:] if node.body and _is_docstring(node.body[0]) else node.body
        for statement in body:
            self.visit(statement, name, indices, parent=node)

    def visit(self, node: ast.AST, name: str, indices: set[str], parent: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(node, f"{name}.{node.name}")
            return
        if isinstance(node, (ast.JoinedStr, ast.ClassDef)):
            return
        if isinstance(node, ast.Call) and _call_name(node) in ARGPARSE_CALLS:
            return
        self.points(node, name, indices, parent)
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns", "decorator_list") or (
                    isinstance(node, ast.Lambda) and field == "args"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.visit(child, name, indices, parent=node)

    def add(self, name: str, node: ast.AST, change: str, description: str,
            edit: Callable[[ast.AST], ast.AST]) -> None:
        """One mutant: ``edit`` gets the node (in a copy of the tree) and returns what
        replaces it."""
        line, column = node.lineno, node.col_offset
        mutant_id = f"{name}:{line}:{column}:{change}"
        self.seen[mutant_id] = self.seen.get(mutant_id, 0) + 1
        if self.seen[mutant_id] > 1:
            mutant_id += f"#{self.seen[mutant_id]}"
        position = self.positions[id(node)]

        def apply(tree: ast.Module) -> None:
            target = list(ast.walk(tree))[position]
            _replace(tree, target, edit(target))

        self.mutants.append(Mutant(mutant_id, "generated", name, line, description, apply))

    def points(self, node: ast.AST, name: str, indices: set[str], parent: ast.AST) -> None:
        """The mutants of one node."""
        if isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                if type(op) in COMPARE_FLIPS:
                    new_op = COMPARE_FLIPS[type(op)]

                    def edit(target, position=position, new_op=new_op):
                        ops = list(target.ops)
                        ops[position] = new_op()
                        return ast.Compare(left=target.left, ops=ops,
                                           comparators=target.comparators)
                    self.add(name, node, f"{type(op).__name__}->{new_op.__name__}",
                             f"`{SYMBOLS[type(op)]}` -> `{SYMBOLS[new_op]}`", edit)
        elif isinstance(node, ast.BoolOp):
            new_op = ast.Or if isinstance(node.op, ast.And) else ast.And
            self.add(name, node, f"{type(node.op).__name__}->{new_op.__name__}",
                     f"`{SYMBOLS[type(node.op)]}` -> `{SYMBOLS[new_op]}`",
                     lambda target, new_op=new_op: ast.BoolOp(op=new_op(), values=target.values))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.add(name, node, "not-dropped", "`not x` -> `x`", lambda target: target.operand)
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in ARITHMETIC_FLIPS:
            operands = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.value,)
            if not any(_stringish(operand) for operand in operands):
                new_op = ARITHMETIC_FLIPS[type(node.op)]

                def edit(target, new_op=new_op):
                    target.op = new_op()
                    return target
                self.add(name, node, f"{type(node.op).__name__}->{new_op.__name__}",
                         f"`{SYMBOLS[type(node.op)]}` -> `{SYMBOLS[new_op]}`", edit)
        elif isinstance(node, ast.Constant):
            self.constant(node, name)
        elif isinstance(node, ast.Return):
            if node.value is not None and not isinstance(node.value, ast.Constant):
                self.add(name, node, "return-None", "`return expr` -> `return None`",
                         lambda target: ast.Return(value=_none()))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Name) and node.slice.id in indices:
            self.add(name, node, f"index-{node.slice.id}-1",
                     f"`x[{node.slice.id}]` -> `x[{node.slice.id} - 1]`",
                     lambda target: ast.Subscript(
                         value=target.value, ctx=target.ctx,
                         slice=ast.BinOp(left=target.slice, op=ast.Sub(),
                                         right=ast.Constant(value=1))))
        elif isinstance(node, (ast.List, ast.Tuple)) and isinstance(node.ctx, ast.Load):
            self.display(node, name, parent)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            called = _call_name(node.value)
            change = "append-skipped" if called == "append" else "call-removed"
            self.add(name, node, change, f"`{called or 'call'}(...)` statement removed",
                     lambda target: ast.Pass())
        if isinstance(node, ast.Call):
            self.call(node, name)

    def constant(self, node: ast.Constant, name: str) -> None:
        value = node.value
        if isinstance(value, bool):
            replacements = [not value]
        elif isinstance(value, (int, float)):
            replacements = {0: [1], 1: [0, 2]}.get(value, [value + 1])
            replacements = [type(value)(new) for new in replacements]
        else:
            return
        for new in replacements:
            self.add(name, node, f"const-{value!r}->{new!r}", f"`{value!r}` -> `{new!r}`",
                     lambda target, new=new: ast.Constant(value=new))

    def display(self, node: ast.AST, name: str, parent: ast.AST) -> None:
        """Drop one element of a list or tuple display (not a returned or unpacked tuple,
        nor a subscript's index, nor lines of text)."""
        if any(_prose(element) for element in node.elts):
            return
        if isinstance(node, ast.Tuple) and (
                isinstance(parent, ast.Return)
                or (isinstance(parent, ast.Subscript) and parent.slice is node)
                or (isinstance(parent, ast.Assign)
                    and any(isinstance(t, (ast.Tuple, ast.List)) for t in parent.targets))):
            return
        for position in range(len(node.elts)):
            def edit(target, position=position):
                target.elts = target.elts[:position] + target.elts[position + 1:]
                return target
            self.add(name, node, f"drop-item-{position}",
                     f"element {position} of a {type(node).__name__.lower()} dropped", edit)

    def call(self, node: ast.Call, name: str) -> None:
        called = _call_name(node)
        if called in MIN_MAX:
            def edit(target):
                if isinstance(target.func, ast.Name):
                    target.func = ast.Name(id=MIN_MAX[target.func.id], ctx=ast.Load())
                else:
                    target.func = ast.Attribute(value=target.func.value,
                                                attr=MIN_MAX[target.func.attr], ctx=ast.Load())
                return target
            self.add(name, node, f"{called}->{MIN_MAX[called]}",
                     f"`{called}` -> `{MIN_MAX[called]}`", edit)
        elif isinstance(node.func, ast.Name) and called in ("sorted", "reversed") \
                and len(node.args) == 1 and not isinstance(node.args[0], ast.Starred):
            self.add(name, node, f"{called}-unwrapped", f"`{called}(x)` -> `x`",
                     lambda target: target.args[0])


def generated_mutants(tree: ast.Module) -> list[Mutant]:
    """Every single-node mutant of the function bodies of ``tree``, in source order."""
    return _Points(tree).mutants


# -- planted bugs ------------------------------------------------------------------------------

def functions(tree: ast.Module) -> dict[str, ast.AST]:
    """Every function of ``tree`` by qualified name (``outer.inner``, ``Class.method``)."""
    found: dict[str, ast.AST] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    found.setdefault(name, child)
                walk(child, name + ".")
            else:
                walk(child, prefix)
    walk(tree, "")
    return found


def function_named(tree: ast.Module, name: str) -> tuple[str, ast.AST]:
    """The function with qualified name ``name``, else the only one whose last name it is."""
    table = functions(tree)
    if name in table:
        return name, table[name]
    matches = [qualified for qualified in table if qualified.rsplit(".", 1)[-1] == name]
    if len(matches) != 1:
        raise MutationError(f"no function {name!r}" if not matches else
                            f"{name!r} is ambiguous: {', '.join(matches)}")
    return matches[0], table[matches[0]]


def only(scope: ast.AST, what: str, test: Callable[[ast.AST], bool]) -> ast.AST:
    """The one node of ``scope`` that passes ``test``; MutationError for none or several."""
    found = [node for node in ast.walk(scope) if test(node)]
    if len(found) != 1:
        raise MutationError(f"expected exactly one {what}, found {len(found)}")
    return found[0]


def compare_with(op: type, mentioning: str = "") -> Callable[[ast.AST], bool]:
    """A test for a comparison using ``op`` whose text mentions ``mentioning``."""
    return lambda node: (isinstance(node, ast.Compare)
                         and any(isinstance(o, op) for o in node.ops)
                         and mentioning in ast.unparse(node))


def flip(node: ast.Compare, old: type, new: type) -> None:
    node.ops = [new() if isinstance(op, old) else op for op in node.ops]


def field_value(scope: ast.AST, key: str) -> ast.expr:
    """The expression ``scope`` gives the answer field ``key``: ``{"key": value}``,
    ``update(key=value)`` or ``answer["key"] = value`` (exactly one of them)."""
    values = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Dict):
            values += [v for k, v in zip(node.keys, node.values)
                       if isinstance(k, ast.Constant) and k.value == key]
            continue
        keyword = isinstance(node, ast.keyword) and node.arg == key
        assigned = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
            and t.slice.value == key for t in node.targets)
        if keyword or assigned:
            values.append(node.value)
    if len(values) != 1:
        raise MutationError(f"expected the field {key!r} set once, found {len(values)}")
    return values[0]


def call_to(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, ast.Call) and _call_name(node) == name


def name_load(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: (isinstance(node, ast.Name) and node.id == name
                         and isinstance(node.ctx, ast.Load))


def _call(function: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=function, ctx=ast.Load()), args=list(args), keywords=[])


def _largest_latest(function: ast.AST) -> None:
    """``value > best`` -> ``>=`` in a loop, or ``max(pairs, ...)`` -> ``max(reversed(pairs),
    ...)``: either way the last of equal values wins."""
    comparisons = [node for node in ast.walk(function) if compare_with(ast.Gt)(node)]
    if len(comparisons) == 1:
        flip(comparisons[0], ast.Gt, ast.GtE)
        return
    call = only(function, "`>` comparison or max(...) call", call_to("max"))
    call.args[0] = _call("reversed", call.args[0])


def _flat_step_is_drop(function: ast.AST) -> None:
    flip(only(function, "`>=` comparison", compare_with(ast.GtE)), ast.GtE, ast.Gt)


def _missing_wrapped(wrapper: str) -> Callable[[ast.AST], None]:
    def change(function: ast.AST) -> None:
        value = field_value(function, "missing")
        wrapped = _call(wrapper, value)
        _replace(function, value, _call("list", wrapped) if wrapper == "reversed" else wrapped)
    return change


def _all_equal_first_case(function: ast.AST) -> None:
    loop = only(field_value(function, "all_equal"), "comprehension",
                lambda node: isinstance(node, ast.comprehension))
    loop.iter = ast.Subscript(value=loop.iter, slice=ast.Slice(upper=ast.Constant(value=1)),
                              ctx=ast.Load())


def _no_optimization_level(function: ast.AST) -> None:
    assignment = only(function, "assignment to .graph_optimization_level", lambda node: (
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute)
                                             and t.attr == "graph_optimization_level"
                                             for t in node.targets)))
    _replace(function, assignment, ast.Pass())


def _keep_duplicates(function: ast.AST) -> None:
    call = only(function, "dict.fromkeys(...) call", call_to("fromkeys"))
    _replace(function, call, call.args[0])


def _one_retry_too_many(function: ast.AST) -> None:
    flip(only(function, "`>=` comparison with the retries",
              compare_with(ast.GtE, "retries")), ast.GtE, ast.Gt)


def _worst_by_difference(function: ast.AST) -> None:
    call = only(function, "argmax(...) call", call_to("argmax"))
    only(call, "`excess` in argmax(...)", name_load("excess")).id = "diff"


def _wrong_split(function: ast.AST) -> None:
    row = only(function, "`splits[0]`", lambda node: (
        isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
        and node.value.id == "splits" and isinstance(node.slice, ast.Constant)
        and node.slice.value == 0))
    row.slice = ast.Constant(value=1)


def _exposed_is_plain(where: str) -> Callable[[ast.AST], None]:
    """``exposed`` read as ``plain`` in the ``==`` comparison (``bitwise``), or in the one other
    place that reads it, the difference (``diff``)."""
    def change(function: ast.AST) -> None:
        compared = only(function, "`==` comparison with exposed", compare_with(ast.Eq, "exposed"))
        if where == "bitwise":
            name = only(compared, "`exposed` in the `==` comparison", name_load("exposed"))
        else:
            inside = {id(node) for node in ast.walk(compared)}
            name = only(function, "`exposed` read outside the `==` comparison", lambda node: (
                name_load("exposed")(node) and id(node) not in inside))
        name.id = "plain"
    return change


def _no_c_flush(function: ast.AST) -> None:
    statement = only(function, "_flush_c_stdio() statement", lambda node: (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        and _call_name(node.value) == "_flush_c_stdio"))
    _replace(function, statement, ast.Pass())


class Planted(NamedTuple):
    """A known survivor: ``change`` edits the first of ``functions`` (qualified names, or
    last names when unique) that exists and that it applies to."""
    id: str
    functions: tuple[str, ...]
    description: str
    change: Callable[[ast.AST], None]


# Once survivors (the issue "Kill the survivors, and keep them dead"); keep the function
# names in step with eprun.py: a run says which of these no longer apply.
PLANTED = [
    Planted("largest-latest-on-ties", ("_largest",),
            "the largest ratio / worst local layer is the latest on ties", _largest_latest),
    Planted("monotone-flat-is-drop", ("growth_from",),
            "`monotone` treats a flat step as a drop (`>=` -> `>`)", _flat_step_is_drop),
    Planted("missing-sorted", ("_provider_case", "providers"),
            "`missing` sorted instead of in request order", _missing_wrapped("sorted")),
    Planted("missing-reversed", ("_provider_case", "providers"),
            "`missing` in reverse request order", _missing_wrapped("reversed")),
    Planted("all-equal-first-case", ("settings",), "`all_equal` looks at the first case only",
            _all_equal_first_case),
    Planted("no-optimization-level", ("session_options", "SettingsRunner.options", "settings"),
            "settings' sessions never get the case's graph optimization level",
            _no_optimization_level),
    Planted("boundaries-keep-duplicates", ("find_boundaries",),
            "boundaries no longer deduplicated (`dict.fromkeys` dropped)", _keep_duplicates),
    Planted("one-retry-too-many", ("_with_retries", "check"),
            "check retries once more than --retries (`used[0] >= retries` -> `>`)",
            _one_retry_too_many),
    Planted("worst-by-difference", ("compare_outputs",),
            "the worst element is the largest difference, not the largest excess",
            _worst_by_difference),
    Planted("report-wrong-split", ("_partition_prose", "report_markdown"),
            "the report's prose reads the wrong partition row (`splits[0]` -> `splits[1]`)",
            _wrong_split),
    Planted("exposure-bitwise-self", ("_exposure_effect",),
            "`bitwise_equal` compares the plain output with itself", _exposed_is_plain("bitwise")),
    Planted("exposure-diff-self", ("_exposure_effect",),
            "`max_abs_diff` compares the plain output with itself", _exposed_is_plain("diff")),
    Planted("chatter-no-c-flush", ("captured_chatter",),
            "the chatter capture restores fds without flushing C stdio", _no_c_flush),
]


def planted_mutants(source: str) -> tuple[list[Mutant], list[tuple[str, str]]]:
    """PLANTED as mutants of ``source``, and (id, reason) for each that applies nowhere."""
    mutants, missing = [], []
    for bug in PLANTED:
        mutant_id = f"planted:{bug.id}"
        reasons = []
        for wanted in bug.functions:
            try:
                qualified, function = function_named(ast.parse(source), wanted)
                bug.change(function)  # on a throwaway tree: does it apply here?
            except MutationError as exc:
                reasons.append(f"{wanted}: {exc}")
                continue

            def apply(mutated: ast.Module, bug=bug, qualified=qualified) -> None:
                bug.change(function_named(mutated, qualified)[1])

            mutants.append(Mutant(mutant_id, "planted", qualified, function.lineno,
                                  bug.description, apply))
            break
        else:
            missing.append((mutant_id, "; ".join(reasons)))
    return mutants, missing


def select(source: str, tree: ast.Module, args: argparse.Namespace
           ) -> tuple[list[Made], list[tuple[str, str]]]:
    """The mutants to run: every planted one, then ``--sample`` generated ones drawn with
    ``--seed`` (skipping any that do not compile), all filtered by ``--only``. Returns them
    made, with (id, reason) for each planted one that could not be made."""
    def wanted(mutant_id: str) -> bool:
        return not args.only or any(text in mutant_id for text in args.only)

    planted, missing = planted_mutants(source) if not args.no_planted else ([], [])
    made = []
    for mutant in planted:
        if not wanted(mutant.id):
            continue
        try:
            made.append(make(mutant, source, tree))
        except MutationError as exc:
            missing.append((mutant.id, str(exc)))
    generated = [m for m in generated_mutants(tree) if wanted(m.id)]
    if args.all or (args.sample is None and args.only):
        count = len(generated)
    else:
        count = 60 if args.sample is None else args.sample
    random.Random(args.seed).shuffle(generated)
    for mutant in generated:
        if count <= 0:
            break
        try:
            made.append(make(mutant, source, tree))
            count -= 1
        except MutationError as exc:
            if args.verbose:
                print(f"skipped {mutant.id}: {exc}", file=sys.stderr)
    return made, missing


# -- copies of the repository ------------------------------------------------------------------

def _ignored(names: list[str]) -> set[str]:
    return {name for name in names if any(fnmatch.fnmatch(name, p) for p in NOT_COPIED)}


def copy_tree(source: Path, destination: Path) -> None:
    """Copy the repository without NOT_COPIED, keeping modification times."""
    shutil.copytree(source, destination, symlinks=True,
                    ignore=lambda folder, names: _ignored(names))


def link_venvs(repo: Path, destination: Path) -> None:
    """Symlink the repository's venvs into a copy (the README's examples run .venv/bin/python);
    without a .venv there, the venv of the interpreter running this script stands in."""
    venvs = {venv.name: venv for venv in repo.glob(VENVS) if venv.is_dir()}
    if ".venv" not in venvs and sys.prefix != sys.base_prefix:
        venvs[".venv"] = Path(sys.prefix)
    for name, venv in venvs.items():
        (destination / name).symlink_to(venv.resolve(), target_is_directory=True)


def manifest(root: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of every file under ``root``."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            stat = os.lstat(os.path.join(folder, name))
            files[os.path.relpath(os.path.join(folder, name), root)] = (stat.st_size,
                                                                         stat.st_mtime_ns)
    return files


def restore(copy_root: Path, pristine: Path, files: dict[str, tuple[int, int]]) -> None:
    """Put a copy back to ``pristine``: changed files copied again, new ones removed."""
    folders = set()
    for path in files:
        parent = os.path.dirname(path)
        while parent and parent not in folders:
            folders.add(parent)
            parent = os.path.dirname(parent)
    for folder, subfolders, names in os.walk(copy_root):
        relative = os.path.relpath(folder, copy_root)
        relative = "" if relative == "." else relative
        for sub in list(subfolders):
            path = os.path.join(relative, sub)
            full = os.path.join(folder, sub)
            if os.path.islink(full) and fnmatch.fnmatch(sub, VENVS) and not relative:
                subfolders.remove(sub)
            elif path not in folders:
                shutil.rmtree(full, ignore_errors=True)
                subfolders.remove(sub)
        for name in names:
            path = os.path.join(relative, name)
            full = os.path.join(folder, name)
            stat = os.lstat(full)
            if path not in files:
                os.remove(full)
            elif (stat.st_size, stat.st_mtime_ns) != files[path]:
                os.remove(full)
                shutil.copy2(pristine / path, full)
    for path in files:
        if not (copy_root / path).exists():
            (copy_root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine / path, copy_root / path)


# -- running the suite -------------------------------------------------------------------------

# Runs pytest in-process as ``python -m pytest`` would (sys.path[0] is the working directory)
# and writes what happened to the JSON file named by its first argument.
PROBE = r'''
import json, sys, pytest

class Probe:
    def __init__(self):
        self.durations, self.outcomes, self.failures = {}, {}, []

    def pytest_collectreport(self, report):
        if report.failed:
            self.failures.append(["collecting " + (report.nodeid or "tests"), _message(report)])

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failures.append([report.nodeid, _message(report)])
        if report.failed or report.when == "call" or report.skipped:
            self.outcomes.setdefault(report.nodeid, report.outcome)

    def pytest_sessionfinish(self, session, exitstatus):
        with open(OUT, "w") as out:
            json.dump({"exitstatus": int(exitstatus), "durations": self.durations,
                       "outcomes": self.outcomes, "failures": self.failures}, out)

def _message(report):
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:300]

OUT = sys.argv[1]
sys.exit(pytest.main(sys.argv[2:], plugins=[Probe()]))
'''

_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


class Outcome(NamedTuple):
    status: str  # killed, survived, timeout
    seconds: float
    failure: str | None  # the first failing test (or collection error)
    message: str | None
    probe: dict | None


def run_pytest(folder: Path, arguments: list[str], timeout: float, log: Path,
               basetemp: Path) -> Outcome:
    """Run the suite in ``folder`` through PROBE; killed when any test fails, timeout when it
    runs longer than ``timeout`` seconds (the whole process group is killed)."""
    result = basetemp.parent / f"{basetemp.name}.json"
    with contextlib.suppress(OSError):
        result.unlink()
    command = [sys.executable, "-c", PROBE, str(result), "-p", "no:cacheprovider",
               "-p", "no:randomly", f"--basetemp={basetemp}", *arguments]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    with open(log, "w") as output:
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=output,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = None
        except BaseException:  # Ctrl-C: the run is in its own session, so stop it here
            _kill(proc)
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    seconds = time.monotonic() - start
    probe = None
    if result.exists():
        with contextlib.suppress(ValueError):
            probe = json.loads(result.read_text())
    if code is None:
        return Outcome("timeout", seconds, None, f"no result after {timeout:.0f} s", probe)
    failures = (probe or {}).get("failures") or []
    if code == 0:
        return Outcome("survived", seconds, None, None, probe)
    first, message = failures[0] if failures else (f"pytest exit {code}", _tail(log))
    return Outcome("killed", seconds, first, message, probe)


def _kill(proc: subprocess.Popen) -> None:
    """Kill a run and everything it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(log: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])[:300]
    return ""


def confirm_flaky(baseline: Outcome, folder: Path, pristine: Path,
                  files: dict[str, tuple[int, int]], logs: Path, work: Path) -> list[str] | None:
    """The tests that failed in the baseline but pass when run again, twice, on their own
    (they would kill mutants by chance); [] when the baseline passed; None when some test
    fails for real (or nothing ran)."""
    if baseline.probe is None or baseline.status == "timeout":
        return None
    if baseline.status == "survived":
        return []
    failed = list(dict.fromkeys(test for test, _ in baseline.probe["failures"]))
    if not failed or any(test.startswith("collecting ") for test in failed):
        return None
    for attempt in (1, 2):
        restore(folder, pristine, files)
        again = run_pytest(folder, ["-n", "0", *failed], 1800,
                           logs / f"baseline-rerun-{attempt}.log", work / "tmp-baseline")
        if again.status != "survived":
            return None
    return failed


def module_scoped(tests: Path) -> set[str]:
    """Test files with a module- (or class-, package-) scoped fixture: their tests are kept
    together so that the fixture is built once."""
    found = set()
    for path in tests.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "scope" and \
                    isinstance(node.value, ast.Constant) and \
                    node.value.value in ("module", "class", "package"):
                found.add(f"tests/{path.name}")
    return found


def fastest_first(durations: dict[str, float], grouped: set[str]) -> list[str]:
    """Test ids, cheapest first; the tests of a ``grouped`` file stay together, as one unit
    costing all of them."""
    units: dict[str, list[str]] = {}
    for test in durations:
        path = test.split("::")[0]
        units.setdefault(path if path in grouped else test, []).append(test)
    order = sorted(units.values(), key=lambda unit: (sum(durations[t] for t in unit), unit[0]))
    return [test for unit in order for test in sorted(unit, key=durations.get)]


# -- the run -----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tests/mutation.py", description=__doc__.split("\n\n")[0],
        epilog="See the module docstring for how it works.")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="generated mutants to draw (default 60; all matching with "
                        "--only); 0 runs the planted bugs alone")
    parser.add_argument("--all", action="store_true", help="every generated mutant")
    parser.add_argument("--seed", type=int, default=2026, help="seed of the sample (default 2026)")
    parser.add_argument("--only", metavar="TEXT", action="append",
                        help="only mutants whose id contains TEXT (repeatable: any of them)")
    parser.add_argument("--no-planted", action="store_true", help="leave out the planted bugs")
    parser.add_argument("--list", action="store_true",
                        help="print the ids (and changes) of the mutants a run would use, and exit")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds per mutant (default: 3 x the baseline's total test "
                        "time, at least 300)")
    parser.add_argument("--timings", type=Path, metavar="REPORT",
                        help="take the tests' durations from an earlier run's JSON report "
                        "instead of running the baseline")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the unmutated run in the mutants' order (when the order "
                        "is known to pass)")
    parser.add_argument("--report", type=Path, help="JSON report path (default: in the work "
                        "folder)")
    parser.add_argument("--workdir", type=Path, help="work folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the copies of the repository in the work folder")
    parser.add_argument("--verbose", action="store_true",
                        help="also say which sampled mutants were skipped and why")
    args = parser.parse_args(argv)
    if args.jobs < 1 or (args.sample is not None and args.sample < 0):
        parser.error("--jobs must be at least 1 and --sample at least 0")
    return args


def say(text: str = "") -> None:
    print(text, flush=True)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = (REPO / TARGET).read_text(encoding="utf-8")
    tree = ast.parse(source)
    made, missing = select(source, tree, args)
    for mutant_id, reason in missing:
        print(f"mutation.py: PLANTED BUG NOT APPLIED: {mutant_id}: {reason}", file=sys.stderr)
    if args.list:
        for item in made:
            say(f"{item.mutant.id}\t{item.summary}")
        say(f"{len(made)} mutants ({sum(m.mutant.kind == 'planted' for m in made)} planted)")
        return 1 if missing else 0
    if not made:
        say("no mutants to run")
        return 1 if missing else 0
    if importlib.util.find_spec("xdist") is None:
        print("mutation.py: needs pytest-xdist (the dev requirements)", file=sys.stderr)
        return 2

    started = time.time()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="eprun-mutation-"))
    work = work.resolve()
    if work == REPO or REPO in work.parents:
        print("mutation.py: the work folder must be outside the repository", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    report_path = args.report or work / "report.json"
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    pristine = work / "pristine"
    copy_tree(REPO, pristine)
    (pristine / TARGET).write_text(source, encoding="utf-8")  # the text the mutants came from
    files = manifest(pristine)
    copies = []
    for job in range(args.jobs):
        folder = work / f"copy-{job}"
        copy_tree(pristine, folder)
        link_venvs(REPO, folder)
        copies.append(folder)
    say(f"mutation.py: {len(made)} mutants of {TARGET} "
        f"({sum(m.mutant.kind == 'planted' for m in made)} planted), {args.jobs} at a time; "
        f"work folder {work}")

    if args.timings:
        earlier = json.loads(args.timings.read_text())["baseline"]
        durations, flaky = earlier["durations"], earlier.get("flaky", [])
        baseline_seconds = None
        say(f"baseline: {len(durations)} tests timed by {args.timings}")
    else:
        say("baseline: the unmutated suite, to time each test ...")
        baseline = run_pytest(copies[0], ["-n", str(args.jobs)], 3600, logs / "baseline.log",
                              work / "tmp-baseline")
        flaky = confirm_flaky(baseline, copies[0], pristine, files, logs, work)
        if flaky is None:
            say(f"mutation.py: the unmutated suite does not pass ({baseline.failure}: "
                f"{baseline.message}); see {logs / 'baseline.log'}")
            return 2
        durations = baseline.probe["durations"]
        baseline_seconds = round(baseline.seconds, 1)
        say(f"baseline: {len(durations)} tests ran in {baseline.seconds:.0f} s")
    for test in flaky:
        say(f"baseline: FLAKY, left out of the mutant runs: {test}")
        durations.pop(test, None)
    order = fastest_first(durations, module_scoped(pristine / "tests"))
    timeout = args.timeout or max(300.0, 3 * sum(durations.values()))
    say(f"{sum(durations.values()):.0f} s of test time; timeout per mutant {timeout:.0f} s")

    free: queue.Queue = queue.Queue()
    for folder in copies:
        free.put(folder)
    abandon = threading.Event()
    results: dict[str, Outcome] = {}
    control_id = "(control: unmutated)"
    jobs = [] if args.no_control else [(control_id, source)]
    jobs += [(item.mutant.id, item.text) for item in made]
    done = [0]
    print_lock = threading.Lock()

    flaky_now = set(flaky)  # grows when a failure does not reproduce
    flaky_lock = threading.Lock()

    def run_mutant(mutant_id: str, text: str, folder: Path) -> Outcome:
        """The ordered tests on ``text`` in ``folder``, stopping at the first failure. A test
        that fails but then passes when run again on its own is flaky: it is left out from
        then on, and this run goes on with the tests after it."""
        safe = hashlib.sha1(mutant_id.encode()).hexdigest()[:10]
        tmp = work / f"tmp-{folder.name}"
        tests = [test for test in order if test not in flaky_now]
        seconds, part = 0.0, 0
        while True:
            restore(folder, pristine, files)
            (folder / TARGET).write_text(text, encoding="utf-8")
            log = logs / (f"{safe}.log" if not part else f"{safe}-{part}.log")
            outcome = run_pytest(folder, ["-x", "-n", "0", *tests], timeout, log, tmp)
            seconds += outcome.seconds
            failure = outcome.failure
            if outcome.status != "killed" or failure not in tests:
                return outcome._replace(seconds=seconds)
            for attempt in (1, 2):
                restore(folder, pristine, files)
                (folder / TARGET).write_text(text, encoding="utf-8")
                again = run_pytest(folder, ["-n", "0", failure], timeout,
                                   logs / f"{safe}-again-{part}-{attempt}.log", tmp)
                seconds += again.seconds
                if again.status == "survived":
                    break
            else:  # failed three times: a real kill
                return outcome._replace(seconds=seconds)
            with flaky_lock:
                flaky_now.add(failure)
            with print_lock:
                say(f"FLAKY: {failure} failed for {mutant_id} but passed on its own; "
                    "left out from now on")
            tests = [test for test in tests[tests.index(failure) + 1:]
                     if test not in flaky_now]
            part += 1

    def run_one(mutant_id: str, text: str) -> None:
        if abandon.is_set():
            return
        folder = free.get()
        try:
            outcome = run_mutant(mutant_id, text, folder)
        finally:
            free.put(folder)
        if abandon.is_set() and mutant_id != control_id:  # interrupted: its run was killed
            return
        results[mutant_id] = outcome
        if mutant_id == control_id and outcome.status != "survived":
            abandon.set()
        with print_lock:
            done[0] += 1
            say(f"[{done[0]}/{len(jobs)}] {outcome.status:8} {outcome.seconds:6.0f} s  "
                f"{mutant_id}" + (f"  <- {outcome.failure}" if outcome.failure else ""))

    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        for future in [pool.submit(run_one, *job) for job in jobs]:
            future.result()
    except KeyboardInterrupt:  # stop the runs in progress instead of waiting for them
        abandon.set()
        pool.shutdown(wait=False, cancel_futures=True)
        with _RUNNING_LOCK:
            for proc in list(_RUNNING):
                _kill(proc)
        raise
    pool.shutdown()
    if abandon.is_set():
        control = results[control_id]
        say(f"mutation.py: the unmutated suite fails when run like a mutant "
            f"({control.failure}: {control.message}); the results would mean nothing")
        return 2

    seconds = time.time() - started
    entries = []
    for item in made:
        outcome = results[item.mutant.id]
        entries.append({"id": item.mutant.id, "kind": item.mutant.kind,
                        "function": item.mutant.function, "line": item.mutant.line,
                        "description": item.mutant.description, "change": item.summary,
                        "status": outcome.status, "seconds": round(outcome.seconds, 1),
                        "first_failure": outcome.failure, "message": outcome.message,
                        "diff": item.diff})
    killed = sum(e["status"] == "killed" for e in entries)
    timeouts = sum(e["status"] == "timeout" for e in entries)
    survivors = [e for e in entries if e["status"] == "survived"]
    score = 100.0 * (killed + timeouts) / len(entries)

    say()
    say(table([["mutant", "result", "first failing test"]] + [
        [e["id"], e["status"], (e["first_failure"] or "").replace("tests/", "", 1)]
        for e in entries]))
    if survivors:
        say(f"\nsurvivors ({len(survivors)}):")
        for e in survivors:
            say(f"\n{e['id']}: {e['description']}: {e['change']}\n{e['diff'].rstrip()}")
    for mutant_id, reason in missing:
        say(f"\nnot applied: {mutant_id}: {reason}")
    if flaky_now:
        say("\nflaky tests (failed, then passed on their own; left out):")
        for test in sorted(flaky_now):
            say(f"  {test}")
    say(f"\nmutation score: {killed + timeouts} killed of {len(entries)} ({score:.0f}%)"
        f"{f', {timeouts} of them by timeout' if timeouts else ''}; "
        f"{len(survivors)} survived; {seconds / 60:.1f} min")

    report = {"target": TARGET, "sha256": hashlib.sha256(source.encode()).hexdigest(),
              "seed": args.seed, "sample": args.sample, "only": args.only, "jobs": args.jobs,
              "timeout": timeout, "seconds": round(seconds, 1),
              "baseline": {"tests": len(order), "seconds": baseline_seconds,
                           "test_seconds": round(sum(durations.values()), 1),
                           "durations": {test: round(d, 3) for test, d in durations.items()},
                           "flaky": sorted(flaky_now)},
              "control_seconds": (round(results[control_id].seconds, 1)
                                  if control_id in results else None),
              "score": {"killed": killed + timeouts, "timeouts": timeouts,
                        "survived": len(survivors), "total": len(entries),
                        "percent": round(score, 1)},
              "not_applied": [{"id": i, "reason": r} for i, r in missing],
              "mutants": entries}
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    say(f"report: {report_path}")
    if not args.keep:  # the copies and pytest's temporary folders; the logs stay
        for folder in [pristine, *copies, *work.glob("tmp-*")]:
            if folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
    planted_survived = any(e["kind"] == "planted" for e in survivors)
    return 1 if planted_survived or missing else 0


if __name__ == "__main__":
    sys.exit(main())
