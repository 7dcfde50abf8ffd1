"""Every ``$ python eprun.py ...`` example in README.md prints what the README shows."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import PINNED_STACK, ROOT, approx_tree

RELEASE_DEPENDENT = "# depends on the onnxruntime release"
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def examples() -> list[tuple[str, str]]:
    """(command, shown output) pairs; a shown output may start with RELEASE_DEPENDENT."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        command, output = None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    found.append((command, "\n".join(output)))
                command, output = line[2:], []
            else:
                output.append(line)
        if command:
            found.append((command, "\n".join(output)))
    return found


def test_readme_has_examples_of_every_command():
    commands = {command.split()[2] for command, _ in examples()}
    assert {"providers", "partition", "expose", "layers", "growth", "settings", "placement",
            "check"} <= commands


@pytest.mark.parametrize("command, shown", examples(), ids=lambda value: value[:50])
def test_readme_example_output_is_real(command, shown):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    printed = proc.stdout.rstrip("\n")
    if shown.startswith(RELEASE_DEPENDENT):
        shown = shown[len(RELEASE_DEPENDENT) + 1:]
        if not PINNED_STACK:  # e.g. placement's source: assignment info vs. profiling
            assert printed.count("\n") == shown.count("\n")
            return
    if PINNED_STACK:
        assert printed == shown
        return
    assert printed.count("\n") == shown.count("\n"), printed
    for got, want in zip(printed.splitlines(), shown.splitlines()):
        if want.startswith("{"):
            assert json.loads(want) == approx_tree(json.loads(got))
        else:  # text with numbers: the text exactly, the numbers to 1e-5
            assert NUMBER.sub("#", got) == NUMBER.sub("#", want)
            assert [float(n) for n in NUMBER.findall(got)] == pytest.approx(
                [float(n) for n in NUMBER.findall(want)], rel=1e-5)
