"""Do two versions of eprun.py answer alike? Every command on every model, byte for byte.

A change that should not change behaviour (a move, a rename, a split) is proven here: the lab
models, every README example, the test suite's real-shaped models and their quantized twins,
and the usual mistakes, each run by both versions in twin folders. stdout, stderr, the exit
code and every file a run writes must be the same bytes.

    python bench/same_answers.py --before REV [--after PATH] [--only WORD] [--list]

REV is a git revision of this repository (its eprun.py is taken); --after defaults to the
working tree's eprun.py. Run it with the pinned stack's Python (``make same-answers
BEFORE=REV``). Exit 0 when every run agrees, 1 with the differing runs named.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

ENV = {**os.environ, "EPRUN_PROGRESS_AFTER": "inf", "PYTHONHASHSEED": "0"}
ENV.pop("EPRUN_DEBUG", None)
LAB_FILES = ("fp32.onnx", "int8.onnx", "fp32_exposed.onnx", "int8_exposed.onnx",
             "providers.json", "growth.json", "settings.json", "ep_report.md", "README.md")


def build_models(folder: Path) -> list[tuple[str, str, str]]:
    """The test suite's real-shaped models and their quantized twins, written into ``folder``:
    (kind, float file, quantized file or "") for each, names relative to ``folder``."""
    import models
    import real_models

    made = []
    models.save(models.chain(seed=3), folder / "chain.onnx")
    models.quantize(folder / "chain.onnx", folder / "chain_int8.onnx", seed=3)
    made.append(("chain", "chain.onnx", "chain_int8.onnx"))
    models.save(models.residual_chain(), folder / "residual.onnx")
    made.append(("residual", "residual.onnx", ""))
    for kind, build in real_models.BUILDERS.items():
        fp32 = f"{kind}.onnx"
        models.save(build(7), folder / fp32)
        for route, quantize in real_models.ROUTES.items():
            if quantize is None:
                continue
            twin = f"{kind}_{route}.onnx"
            try:
                quantize(folder / fp32, folder / twin, 7) if route != "dyn" else quantize(
                    folder / fp32, folder / twin)
            except Exception:  # a route this kind has no twin for
                continue
            made.append((kind, fp32, twin))
        made.append((kind, fp32, ""))
    return made


def readme_examples() -> list[list[str]]:
    text = "\n".join(path.read_text(encoding="utf-8") for path in
                     [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        found += [["bash", "-c", line[2:]] for line in block.splitlines()
                  if line.startswith("$ ")]
    return found


def runs(made: list[tuple[str, str, str]]) -> list[tuple[str, list[str]]]:
    """(name, argv after ``eprun.py``) for every run; "@" runs a README line through bash."""
    todo: list[tuple[str, list[str]]] = []
    for argv in readme_examples():
        todo.append(("readme: " + argv[2][:60], ["@", *argv]))
    lab = ("fp32.onnx", "int8.onnx")
    for command in ("layers", "growth"):
        for extra in ([], ["--local"], ["--metrics", "all"], ["--pair", "name"],
                      ["--boundary-ops", "MatMul"]):
            todo.append((f"lab {command} {' '.join(extra)}", [command, *lab, "5", *extra]))
    todo += [
        ("lab settings", ["settings", "int8.onnx", "3"]),
        ("lab settings --explain", ["settings", "int8.onnx", "3", "--explain"]),
        ("lab sensitivity", ["sensitivity", *lab, "1"]),
        ("lab check", ["check", *lab]),
        ("lab check int8", ["check", *lab, "--profile", "int8"]),
        ("lab providers", ["providers", "int8.onnx", "CPUExecutionProvider", "Nope", ""]),
        ("lab partition", ["partition", "fp32.onnx", "MatMul,Add"]),
        ("lab partition ort", ["partition", "int8.onnx", "MatMul", "--mode", "ort"]),
        ("lab placement", ["placement", "int8.onnx", "CPUExecutionProvider"]),
        ("lab expose", ["expose", "int8.onnx", "out/exposed.onnx"]),
        ("lab report", ["report", *lab, "--out-dir", "rep", "--seed", "4"]),
        ("lab report sensitivity", ["report", *lab, "--out-dir", "rep2", "--sensitivity"]),
        ("usage: none", []),
        ("usage: unknown", ["layer", *lab, "1"]),
        ("usage: seed", ["layers", *lab, "-1"]),
        ("usage: count", ["layers", *lab]),
        ("usage: provider", ["layers", *lab, "1", "--providers", "NoSuchExecutionProvider"]),
        ("missing file", ["layers", "nope.onnx", "int8.onnx", "1"]),
        ("not a model", ["growth", "README.md", "int8.onnx", "1"]),
        ("output over input", ["expose", "int8.onnx", "int8.onnx"]),
        ("help", ["--help"]),
        ("layers help", ["layers", "--help"]),
        ("version", ["--version"]),
    ]
    for kind, fp32, twin in made:
        if not twin:
            todo += [
                (f"{kind} settings", ["settings", fp32, "2"]),
                (f"{kind} partition", ["partition", fp32, "MatMul,Conv,Gemm,Add"]),
                (f"{kind} partition ort", ["partition", fp32, "MatMul,Conv", "--mode", "ort"]),
                (f"{kind} placement", ["placement", fp32, "CPUExecutionProvider"]),
                (f"{kind} expose", ["expose", fp32, f"out/{kind}_exposed.onnx"]),
                (f"{kind} providers", ["providers", fp32, "CPUExecutionProvider"]),
            ]
            continue
        pair = [fp32, twin]
        todo += [
            (f"{twin} layers", ["layers", *pair, "2"]),
            (f"{twin} layers --local", ["layers", *pair, "2", "--local"]),
            (f"{twin} layers all", ["layers", *pair, "2", "--metrics", "all", "--pair", "name"]),
            (f"{twin} growth", ["growth", *pair, "2"]),
            (f"{twin} check", ["check", *pair, "--profile", "int8"]),
            (f"{twin} settings", ["settings", twin, "2"]),
            (f"{twin} settings --explain", ["settings", twin, "2", "--explain"]),
            (f"{twin} partition ort", ["partition", twin, "MatMul,Conv", "--mode", "ort"]),
            (f"{twin} sensitivity", ["sensitivity", *pair, "2"]),
            (f"{twin} report", ["report", *pair, "--out-dir", f"rep_{twin}"]),
        ]
    return todo


def outcome(script: Path, folder: Path, argv: list[str]) -> tuple:
    """What one run left behind: exit code, stdout, stderr, and every file it wrote."""
    before = {path: path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}
    if argv[:1] == ["@"]:
        command = argv[1:]
        command[-1] = re.sub(r"\S*python eprun\.py", f"{sys.executable} eprun.py", command[-1])
    else:
        command = [sys.executable, str(script), *argv]
    proc = subprocess.run(command, cwd=folder, env=ENV, capture_output=True, timeout=900,
                          check=False)
    here = str(folder).encode()  # the twin folders' own names are not an answer
    proc.stdout, proc.stderr = (stream.replace(here, b"<folder>")
                                for stream in (proc.stdout, proc.stderr))
    written = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and before.get(path) != path.stat().st_mtime_ns:
            written[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    for path in written:  # the next run finds the folder as this one did
        if Path(path).parts[0] in ("out", "rep", "rep2") or path.startswith("rep_"):
            (folder / path).unlink()
    return proc.returncode, proc.stdout, proc.stderr, written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--after", default=str(ROOT / "eprun.py"), help="an eprun.py")
    parser.add_argument("--only", default="", help="only the runs whose name has this word")
    parser.add_argument("--list", action="store_true", help="list the runs and stop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-answers-") as made_in:
        scratch = Path(made_in)
        models_dir = scratch / "models"
        models_dir.mkdir()
        for name in LAB_FILES:
            shutil.copy2(ROOT / name, models_dir / name)
        made = build_models(models_dir)
        (models_dir / "out").mkdir()
        todo = [(name, argv) for name, argv in runs(made) if args.only in name]
        if args.list:
            print("\n".join(name for name, _ in todo))
            return 0
        sides = {}
        for side in ("before", "after"):
            shutil.copytree(models_dir, scratch / side)
            script = scratch / f"{side}.py"
            sides[side] = (script, scratch / side)
        before_source = subprocess.run(["git", "show", f"{args.before}:eprun.py"], cwd=ROOT,
                                       capture_output=True, check=True).stdout
        sides["before"][0].write_bytes(before_source)
        sides["after"][0].write_bytes(Path(args.after).read_bytes())
        for script, folder in sides.values():  # both are named eprun.py where they run
            (folder / "eprun.py").write_bytes(script.read_bytes())
        sides = {side: (folder / "eprun.py", folder) for side, (_, folder) in sides.items()}

        def every_run(side):  # one side's runs one after another, in its own folder
            return [outcome(*sides[side], argv) for _, argv in todo]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            olds, news = pool.map(every_run, ("before", "after"))
        differing = []
        labels = ("exit code", "stdout", "stderr", "files")
        for (name, _), old, new in zip(todo, olds, news):
            if old != new:
                differing.append(name)
                apart = [label for label, a, b in zip(labels, old, new) if a != b]
                print(f"DIFFERS  {name}: {', '.join(apart)}")
                for label, a, b in zip(labels, old, new):
                    if a != b:
                        print(f"   before {label}: {str(a)[:400]}")
                        print(f"   after  {label}: {str(b)[:400]}")
        print(f"{len(todo) - len(differing)} of {len(todo)} runs answer alike"
              f" (before {args.before}, after {args.after})")
        return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
