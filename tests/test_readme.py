"""Every ``$ python eprun.py ...`` example in README.md and docs/ prints what it shows there,
and every link between them leads to a file and a heading that exist.

The ``settings`` and ``check`` examples on the lab's int8 model, and ``growth --local`` (whose
segments onnxruntime fuses into QLinearMatMul: only the exposed boundaries keep the float
MatMul), show numbers its fused int8 kernel decides, so they are the ones of the CPU that made
the committed deliverables: they are compared in full only on a CPU that gets that kernel
(tests/cpu.py, ``DELIVERABLES_CPU``), and elsewhere in everything but those numbers, which
must still be there, of the same type."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import PINNED_STACK, ROOT, approx_tree
from cpu import DELIVERABLES_CPU, settings_apart_from_int8_kernel

RELEASE_DEPENDENT = "# depends on the onnxruntime release"
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
ANY_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def check_apart_from_int8_kernel(answer: dict) -> dict:
    """A ``check`` answer without what the candidate's values decide (its differences, cosine,
    violations and worst element); what was compared, the verdict and the rest stay."""
    kept = {**answer, "outputs": [{key: value for key, value in entry.items()
                                   if key in ("reference", "candidate", "shape", "elements")}
                                  for entry in answer["outputs"]],
            "failures": [{key: value for key, value in entry.items()
                          if key in ("output", "bound", "elements")}
                         for entry in answer["failures"]]}
    return kept


def local_apart_from_int8_kernel(answer: dict) -> dict:
    """A ``growth --local`` answer without the segments' errors (``local_rel_error`` and
    ``worst_local``) and the int8 side's exposure (its plain run is the fused kernel's); the
    accumulated errors come from the exposed graphs and stay."""
    return {key: value for key, value in answer.items()
            if key not in ("local_rel_error", "worst_local", "exposure")}


def apart_from_int8_kernel(command: str):
    """For the examples on the lab's int8 model whose numbers its fused int8 kernel decides:
    the function that drops those numbers from an answer; None for every other example."""
    words = command.split()
    if "int8.onnx" not in words:
        return None
    if words[2] == "growth" and "--local" in words:
        return local_apart_from_int8_kernel
    return {"settings": settings_apart_from_int8_kernel,
            "check": check_apart_from_int8_kernel}.get(words[2])


def json_types(value):
    """The shape of a JSON value: its keys and lengths, with each leaf replaced by its type."""
    if isinstance(value, dict):
        return {key: json_types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_types(item) for item in value]
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(
        value).__name__


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples() -> list[tuple[str, str]]:
    """(command, shown output) pairs; a shown output may start with RELEASE_DEPENDENT."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTS)
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


# An example as the pinned stack's .venv runs it, with at most these shell forms: stderr thrown
# away, and the first lines of what is printed.
PLAIN = re.compile(r"\.venv/bin/python eprun\.py (?P<argv>[^;|&<>$`]*?)(?P<quiet> 2>/dev/null)?"
                   r"(?: \| head -(?P<head>[0-9]+))?")


def printed_by(command: str, monkeypatch) -> str:
    """What ``command`` prints, stdout and stderr together in the order written. On the pinned
    stack (the ``.venv`` the examples name) an example of the ``PLAIN`` forms is main(argv) in
    this process, both streams written through one file as a shell's ``2>&1`` makes them; any
    other runs through bash as typed, with this interpreter for ``.venv/bin/python`` (on
    another stack, only those reach here: they check that stack)."""
    import shlex
    import tempfile

    plain = PLAIN.fullmatch(command)
    if not (PINNED_STACK and plain):
        env = {**os.environ,
               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
        typed = command.replace(".venv/bin/python", shlex.quote(sys.executable))
        return subprocess.run(["bash", "-c", typed], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    import eprun

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["eprun.py"])
    streams, saved = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as both, open(os.devnull, "wb") as nothing:
        os.dup2(both.fileno(), 1)
        os.dup2(nothing.fileno() if plain["quiet"] else both.fileno(), 2)
        sys.stdout, sys.stderr = (open(fd, "w", encoding="utf-8", closefd=False) for fd in (1, 2))
        try:
            eprun.main(shlex.split(plain["argv"]))
        except SystemExit:  # argparse's own exits; the exit code is not shown
            pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            sys.stdout, sys.stderr = streams
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        both.seek(0)
        text = both.read().decode("utf-8")
    if plain["head"]:
        text = "".join(text.splitlines(keepends=True)[:int(plain["head"])])
    return text


@pytest.mark.byte_exact_on_deliverables_cpu
@pytest.mark.parametrize("command, shown", examples(), ids=lambda value: value[:50])
def test_readme_example_output_is_real(command, shown, monkeypatch):
    if not PINNED_STACK and PLAIN.fullmatch(command):
        pytest.skip("the example runs .venv/bin/python, the pinned stack: make test-current "
                    "compares it exactly, and this stack would only rerun that interpreter")
    printed = printed_by(command, monkeypatch).rstrip("\n")
    if not DELIVERABLES_CPU:  # the plain int8 model's fused kernel moves y here, not there
        printed = "\n".join(line for line in printed.splitlines() if not line.startswith(
            "eprun: note: exposing the boundaries moved the int8 (candidate)"))
    if shown.startswith(RELEASE_DEPENDENT):
        shown = shown[len(RELEASE_DEPENDENT) + 1:]
        if not PINNED_STACK:  # e.g. placement's source: assignment info vs. profiling
            assert len(printed.splitlines()) == len(shown.splitlines())
            return
    apart = apart_from_int8_kernel(command)
    if apart and not DELIVERABLES_CPU:  # another int8 kernel: all but the numbers it decides
        assert len(printed.splitlines()) == len(shown.splitlines()), printed
        for got, want in zip(printed.splitlines(), shown.splitlines()):
            if want.startswith("{"):
                got, want = json.loads(got), json.loads(want)
                kept = apart(got)
                assert apart(want) == (kept if PINNED_STACK else approx_tree(kept))
                assert json_types(want) == json_types(got)
            else:  # e.g. check's stderr line: the text exactly, every number masked
                assert ANY_NUMBER.sub("#", got) == ANY_NUMBER.sub("#", want)
        return
    if PINNED_STACK:
        assert printed == shown
        return
    assert len(printed.splitlines()) == len(shown.splitlines()), printed
    for got, want in zip(printed.splitlines(), shown.splitlines()):
        if want.startswith("{"):
            assert json.loads(want) == approx_tree(json.loads(got))
        else:  # text with numbers: the text exactly, the numbers to 1e-5
            assert NUMBER.sub("#", got) == NUMBER.sub("#", want)
            assert [float(n) for n in NUMBER.findall(got)] == pytest.approx(
                [float(n) for n in NUMBER.findall(want)], rel=1e-5)


def anchors(text: str) -> set[str]:
    """The anchors a Markdown file offers: each heading's GitHub slug (lower case, spaces to
    dashes, punctuation but dashes and underscores dropped, -1, -2 for repeats) and each
    ``<a id="...">``."""
    found, seen = set(), {}
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a shell comment is no heading
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def test_every_link_between_the_documents_leads_somewhere():
    """Relative links of README.md and docs/*.md: the file exists, and the heading or anchor
    after # is one it has."""
    checked = 0
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an address outside the repository: not followed here
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.is_file(), f"{path.name}: {target} leads to no file"
            if anchor:
                assert anchor in anchors(linked.read_text(encoding="utf-8")), \
                    f"{path.name}: {target} leads to no heading of {linked.name}"
            checked += 1
    assert checked >= 10


def test_the_front_page_fits_a_few_screens_and_links_every_document():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 200 and "contract" not in readme
    for name in ("commands.md", "accelerators.md", "performance.md", "development.md",
                 "CHANGELOG.md"):
        assert f"(docs/{name})" in readme
    assert {command.split()[2] for command, _ in examples()} >= {
        "providers", "partition", "expose", "layers", "growth", "settings", "placement",
        "check", "weights", "inspect"}


def test_the_python_example_runs_and_answers_as_the_command_line_does(tmp_path, monkeypatch,
                                                                      capfd):
    """The "From Python" example of docs/commands.md, run as written on copies of the lab
    models: every call returns the answer its command line prints (the same JSON), and the
    report writes its files where its options say."""
    import shutil

    from conftest import in_process

    import eprun

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    block = text[text.index("### From Python"):]
    code = re.search(r"```python\n(.*?)```", block, flags=re.S).group(1)
    for name in ("fp32.onnx", "int8.onnx"):
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    namespace = {"eprun": eprun}
    answers = [eval("eprun." + call.strip(), namespace)  # each call of the example in turn
               for call in code.split("\neprun.")[1:]]
    assert len(answers) == 9 and all(isinstance(answer, dict) for answer in answers)
    assert (tmp_path / "report" / "ep_report.md").is_file()
    typed = {"layers": ["layers", "fp32.onnx", "int8.onnx", "2026", "--local", "--rows", "8"],
             "settings": ["settings", "int8.onnx", "2026", "--explain"],
             "check": ["check", "fp32.onnx", "int8.onnx", "--profile", "int8"]}
    for position, argv in ((3, typed["layers"]), (5, typed["settings"]),
                           (7, typed["check"])):
        status, out, err = in_process(capfd, *argv)
        assert status in (0, 1), err
        assert json.loads(out) == json.loads(eprun.to_json(answers[position])), argv
