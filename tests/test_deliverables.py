"""The committed deliverables are what the commands print for the committed models.

Where the int8 kernel decides a number (settings.json's ORT_ENABLE_ALL cases, the report's
Settings, Exposure and Gate bullets) the committed files are this CPU's only on a CPU that gets
the kernel that made them (tests/cpu.py); the tests marked byte_exact_on_deliverables_cpu
compare those numbers with the committed ones there, and with sessions opened here elsewhere."""
from __future__ import annotations

import inspect
import json
import os
import platform
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, PINNED_STACK, ROOT, approx_tree
from cpu import (
    DELIVERABLES_CPU,
    assert_report_exposure_is_this_cpus,
    assert_report_is_this_cpus,
    assert_settings_are_this_cpus,
    report_apart_from_int8_kernel,
    settings_apart_from_int8_kernel,
)

HEADINGS = ["## 무엇을 요청했고 무엇을 쥐었나", "## 그래프가 쪼개지는 자리",
            "## 층을 거듭하며 자란 오차", "## 이 기계에서만 참인 것"]


def typed(*args: str) -> str:
    """stdout of ``python eprun.py ARGS`` run as typed in the repository's root, as ``make
    deliverables`` runs it."""
    proc = subprocess.run([sys.executable, str(EPRUN), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def cli(run_eprun_here):
    """stdout of eprun ARGS, main(argv) here with the repository's root the working folder."""
    def run(*args: str) -> str:
        result = run_eprun_here(*args, cwd=ROOT)
        assert result.code == 0, result.stderr
        return result.stdout
    return run


def load(name: str) -> dict:
    return json.loads((ROOT / name).read_text())


@pytest.mark.byte_exact_on_deliverables_cpu
@pytest.mark.parametrize("name, argv", [
    ("growth.json", lambda seed: ["growth", "fp32.onnx", "int8.onnx", str(seed)]),
    ("settings.json", lambda seed: ["settings", "int8.onnx", str(seed)]),
])
def test_committed_json_equals_the_command_output(name, argv, cli):
    committed_text = (ROOT / name).read_text()
    committed = json.loads(committed_text)
    fresh_text = cli(*argv(committed["seed"]))
    fresh = json.loads(fresh_text)
    if name == "settings.json":  # every case as sessions opened here give it, on every CPU
        assert_settings_are_this_cpus(fresh, ROOT / "int8.onnx")
    if name == "settings.json" and not DELIVERABLES_CPU:
        # another int8 kernel: the committed answer holds apart from what that kernel decides
        committed, fresh = (settings_apart_from_int8_kernel(value)
                            for value in (committed, fresh))
        assert committed == (fresh if PINNED_STACK else approx_tree(fresh))
    elif PINNED_STACK:
        assert committed_text == fresh_text
    else:
        assert committed == approx_tree(fresh)


def test_providers_json_is_the_providers_answer_plus_a_note(cli):
    committed = load("providers.json")
    note = committed.pop("note")
    assert isinstance(note, str) and note and "\n" not in note
    requests = [",".join(case["requested"]) for case in committed["cases"]]
    assert json.loads(cli("providers", "fp32.onnx", *requests)) == committed
    available = set(committed["available"])
    assert any(case["requested"] and set(case["requested"]) <= available
               for case in committed["cases"]), "needs a request of available providers only"
    assert any(case["missing"] for case in committed["cases"]), "needs a missing provider"


@pytest.mark.parametrize("source", ["fp32.onnx", "int8.onnx"])
def test_exposed_models_are_current_and_run(tmp_path, source, cli):
    exposed = ROOT / source.replace(".onnx", "_exposed.onnx")
    answer = json.loads(cli("expose", source, str(tmp_path / "fresh.onnx")))
    assert onnx.load(str(exposed)) == onnx.load(str(tmp_path / "fresh.onnx"))
    session = ort.InferenceSession(str(exposed), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == answer["outputs"]
    features = session.get_inputs()[0].shape[1]
    x = np.random.default_rng(0).standard_normal((64, features)).astype(np.float32)
    assert len(session.run(None, {"x": x})) == len(answer["outputs"])


def test_report_has_the_four_headings_and_the_measured_numbers():
    text = (ROOT / "ep_report.md").read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings == HEADINGS
    sections = re.split(r"^## .*$", text, flags=re.M)
    providers = load("providers.json")
    assert f"**{len(providers['available'])}**" in sections[1]
    growth = load("growth.json")
    assert repr(growth["total_growth"]) in sections[3]
    settings = load("settings.json")
    last = sections[4]
    assert "No timing was measured" in last
    assert f"seed {settings['seed']}" in last
    if PINNED_STACK:
        assert f"onnxruntime {ort.__version__}" in last


@pytest.fixture(scope="module")
def fresh_report(tmp_path_factory):
    """``report`` run once on the committed models, as the committed files were made:
    (folder, answer, seed)."""
    seed = load("growth.json")["seed"]
    out = tmp_path_factory.mktemp("report") / "out"
    answer = json.loads(typed("report", "fp32.onnx", "int8.onnx", "--seed", str(seed),
                              "--out-dir", str(out)))
    return out, answer, seed


@pytest.mark.byte_exact_on_deliverables_cpu
def test_report_says_whether_exposure_changed_the_int8_output(fresh_report):
    """Recompute: the plain int8 model vs. its exposed copy, default options, same input. A
    report made here must say what this CPU gives; the committed one too on the CPU that made
    it (another int8 kernel can fuse differently: the AVX2 one changes the output)."""
    out, _, seed = fresh_report
    reports = [out / "ep_report.md"] + ([ROOT / "ep_report.md"] if DELIVERABLES_CPU else [])
    for report in reports:
        assert_report_exposure_is_this_cpus(report.read_text(encoding="utf-8"),
                                            ROOT / "int8.onnx", ROOT / "int8_exposed.onnx", seed)


DELIVERABLES = ("fp32_exposed.onnx", "int8_exposed.onnx", "providers.json", "growth.json",
                "settings.json", "ep_report.md")
# What describes the interpreter and the machine rather than eprun's answer.
MACHINE = re.compile(r"Python \S+ on \S+ with \d+ logical CPUs")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@pytest.mark.byte_exact_on_deliverables_cpu
def test_report_regenerates_the_committed_deliverables(fresh_report, cli):
    """report writes the files it lists, and they are the committed ones (whose JSON is what
    the individual commands print): byte for byte on the pinned stack and a CPU with the int8
    kernel that made them. With another int8 kernel, the models, providers.json and
    growth.json still are; settings.json is what ``settings`` prints here and, like the
    report's Settings, Exposure and Gate bullets, what sessions opened here give; everything
    else in them is the committed text."""
    out, listing, seed = fresh_report
    assert sorted(os.listdir(out)) == sorted(DELIVERABLES)
    assert sorted(Path(path).name for path in listing["files"]) == sorted(DELIVERABLES)

    fresh_md = (out / "ep_report.md").read_text(encoding="utf-8")
    committed_md = (ROOT / "ep_report.md").read_text(encoding="utf-8")
    machine = (f"Python {platform.python_version()} on {platform.machine() or 'unknown'} with "
               f"{os.cpu_count()} logical CPUs")
    assert machine in fresh_md
    assert f"onnxruntime {ort.__version__}, numpy {np.__version__}, " in fresh_md
    assert fresh_md.startswith(f"eprun report, generated by `python eprun.py report fp32.onnx "
                               f"int8.onnx --seed {seed} --out-dir {out}`")
    assert committed_md.startswith(f"eprun report, generated by `python eprun.py report "
                                   f"fp32.onnx int8.onnx --seed {seed}`")  # make deliverables
    fresh_md = fresh_md.replace(f" --out-dir {out}`", "`", 1)
    fresh_md, committed_md = (MACHINE.sub("Python <this machine>", text)
                              for text in (fresh_md, committed_md))

    if not DELIVERABLES_CPU:
        assert (out / "settings.json").read_text() == cli("settings", "int8.onnx", str(seed))
        assert_settings_are_this_cpus(json.loads((out / "settings.json").read_text()),
                                      ROOT / "int8.onnx")
        assert_report_is_this_cpus(fresh_md, ROOT / "fp32.onnx", ROOT / "int8.onnx",
                                   ROOT / "int8_exposed.onnx", seed)
        fresh_md, committed_md = ("\n".join(report_apart_from_int8_kernel(text))
                                  for text in (fresh_md, committed_md))
        fresh, committed = (settings_apart_from_int8_kernel(json.loads(path.read_text()))
                            for path in (out / "settings.json", ROOT / "settings.json"))
        assert committed == (fresh if PINNED_STACK else approx_tree(fresh))
    kernel_free = DELIVERABLES if DELIVERABLES_CPU else tuple(
        name for name in DELIVERABLES if name != "settings.json")
    if PINNED_STACK:
        for name in kernel_free[:-1]:
            assert (out / name).read_bytes() == (ROOT / name).read_bytes(), name
        assert fresh_md == committed_md
        return
    for name in DELIVERABLES[:2]:
        assert onnx.load(str(out / name)) == onnx.load(str(ROOT / name)), name
    for name in kernel_free[2:-1]:
        fresh = json.loads((out / name).read_text())
        assert json.loads((ROOT / name).read_text()) == approx_tree(fresh), name
    assert NUMBER.sub("#", fresh_md) == NUMBER.sub("#", committed_md)


def _global_names(code) -> set:
    """The global names a function's code reads, its nested code (comprehensions) included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def test_a_test_gated_on_the_deliverables_cpu_carries_the_marker_and_the_other_way(request):
    """A test that decides by the fingerprint whether to compare bit for bit is marked
    byte_exact_on_deliverables_cpu, and a marked test decides by it (of the tests collected)."""
    gated, marked = set(), set()
    for item in request.session.items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        name = f"{item.module.__name__}.{item.originalname}"
        if "DELIVERABLES_CPU" in _global_names(inspect.unwrap(function).__code__):
            gated.add(name)
        if item.get_closest_marker("byte_exact_on_deliverables_cpu"):
            marked.add(name)
    assert gated == marked
