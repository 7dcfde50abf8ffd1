"""Which int8 kernels this CPU gets from onnxruntime, and whether they are those of the machine
that made the committed deliverables.

The lab's int8 model runs two ways: ORT_DISABLE_ALL dequantizes and multiplies in float, while
ORT_ENABLE_ALL fuses DequantizeLinear -> MatMul -> QuantizeLinear into one integer kernel,
which onnxruntime's MLAS picks from the CPU's instruction sets (onnxruntime/core/mlas/lib/
platform.cpp): AMX, AVX-512 VNNI and AVX-VNNI sum the 8-bit products exactly in 32 bits, while
plain AVX2 and AVX-512 without VNNI pair them into 16-bit sums that saturate. So settings.json,
the gate in ep_report.md and whether exposing the boundaries changes the int8 model's output
are facts of the CPU: the committed files are reproducible byte for byte only where the int8
kernel is the one that made them (``DELIVERABLES_CPU``). Tests that compare with them bit for
bit carry the ``byte_exact_on_deliverables_cpu`` marker; elsewhere they compare what does not
depend on the int8 kernel exactly and recompute what does (the functions below, sessions
opened here, never eprun's code). A test that decides by ``DELIVERABLES_CPU`` carries the
marker, and a marked test decides by it (tests/test_deliverables.py checks both ways).

Where eprun runs the fused kernel: settings' ORT_ENABLE_ALL cases, check and report's gate
(the plain model), an exposure's plain run, and --local's segments (a segment's inner
DequantizeLinear -> MatMul -> QuantizeLinear is no output, so it fuses). The tables of layers
and growth come from graphs that expose every boundary, which keeps the float MatMul: no int8
kernel there; only their exposure record (and its stderr note) is the plain model's.

``python tests/cpu.py`` prints this machine's fingerprint, in the form of
tests/deliverables_cpu.json.
"""
from __future__ import annotations

import copy
import json
import platform
import re
from pathlib import Path

import models
import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "deliverables_cpu.json"

# The /proc/cpuinfo flags that decide onnxruntime's x86 int8 GEMM (MLAS's GemmU8S8 kernels).
INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8",
              "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset:
    """The INT8_FLAGS this CPU has, from the first ``flags`` line of /proc/cpuinfo (Linux);
    empty where there is no such file, so another system never passes for the recorded one."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split()) & frozenset(INT8_FLAGS)
    return frozenset()


def fingerprint() -> dict:
    """This machine as deliverables_cpu.json records one."""
    return {"machine": platform.machine(), "flags": sorted(cpu_flags())}


def int8_kernel(print_: dict) -> str:
    """The u8s8 GEMM kernel MLAS selects for a fingerprint, in platform.cpp's order (each
    later check overrides the earlier): AVX2, then AVX-VNNI, AVX-512 core (F and BW), AVX-512
    VNNI, and AMX (tile and int8) over all. Not an x86_64: the machine name, never equal to an
    x86 kernel's."""
    if print_["machine"] not in ("x86_64", "AMD64"):
        return f"other:{print_['machine']}"
    flags = set(print_["flags"])
    kernel = "sse"
    if "avx2" in flags:
        kernel = "avx2"
        if "avx_vnni" in flags:
            kernel = "avx_vnni"
        if {"avx512f", "avx512bw"} <= flags:
            kernel = "avx512_core"
            if "avx512_vnni" in flags:
                kernel = "avx512_vnni"
        if {"amx_tile", "amx_int8"} <= flags:
            kernel = "amx"
    return kernel


def recorded() -> dict:
    """The fingerprint of the machine that made the committed deliverables."""
    return json.loads(RECORDED.read_text(encoding="utf-8"))


# True where onnxruntime picks the int8 kernel that made the committed deliverables: there the
# tests marked byte_exact_on_deliverables_cpu compare with them byte for byte.
DELIVERABLES_CPU = int8_kernel(fingerprint()) == int8_kernel(recorded())


# -- the int8-kernel-dependent numbers, recomputed with sessions opened here (models.run) ----

SETTINGS_BASELINE = ("ORT_DISABLE_ALL", 1)
SETTINGS_CASES = (("ORT_ENABLE_ALL", 1), ("ORT_DISABLE_ALL", 2), ("ORT_ENABLE_ALL", 2))
INT8_KERNEL_LEVEL = "ORT_ENABLE_ALL"  # the level at which the fused integer kernel runs


def contract_input(seed: int, model) -> np.ndarray:
    """The contract input for a model whose one input is [N, F]."""
    import onnx

    features = onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return models.contract_input(seed, features)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def settings_cases(model, seed: int) -> list[dict]:
    """``settings``' cases: each level and thread count against the single-threaded
    unoptimized baseline, bit for bit and by the largest absolute difference."""
    x = contract_input(seed, model)
    level, threads = SETTINGS_BASELINE
    base = models.run(model, x, level=level, threads=threads)[0]
    cases = []
    for level, threads in SETTINGS_CASES:
        y = models.run(model, x, level=level, threads=threads)[0]
        cases.append({"level": level, "intra_op": threads, "max_abs_diff": max_abs_diff(base, y),
                      "bitwise_equal": y.shape == base.shape and y.tobytes() == base.tobytes()})
    return cases


def exposure_changes(plain, exposed, seed: int) -> tuple[bool, float]:
    """Whether the exposed copy's first output differs from the plain model's (default
    options), and by how much at most."""
    x = contract_input(seed, plain)
    a, b = models.run(plain, x)[0], models.run(exposed, x)[0]
    return a.tobytes() != b.tobytes(), max_abs_diff(a, b)


def gate_violations(reference, candidate, seed: int, rtol: float, atol: float) -> int:
    """How many elements of the candidate's first output miss ``atol + rtol * |ref|``."""
    x = contract_input(seed, reference)
    ref = models.run(reference, x)[0].astype(np.float64)
    got = models.run(candidate, x)[0].astype(np.float64)
    return int((np.abs(got - ref) > atol + rtol * np.abs(ref)).sum())



def settings_apart_from_int8_kernel(answer: dict) -> dict:
    """A ``settings`` answer without what the int8 kernel decides: the ORT_ENABLE_ALL cases'
    difference and equality, and ``all_equal``."""
    kept = copy.deepcopy(answer)
    kept.pop("all_equal", None)
    for case in kept["cases"]:
        if case["level"] == INT8_KERNEL_LEVEL:
            case.pop("max_abs_diff", None)
            case.pop("bitwise_equal", None)
    return kept


def assert_settings_are_this_cpus(answer: dict, model) -> None:
    """Every case of a ``settings`` answer for ``model`` is what sessions opened here give."""
    cases = settings_cases(model, answer["seed"])
    assert answer["cases"] == cases
    assert answer["all_equal"] is all(case["bitwise_equal"] for case in cases)


# The bullets of ep_report.md's last section that the int8 kernel decides.
REPORT_INT8_KERNEL_LINES = ("- **Settings**", "- **Exposure**", "- **Gate**")


def report_apart_from_int8_kernel(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(REPORT_INT8_KERNEL_LINES)]


def _line(text: str, start: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(start)]
    return line


def assert_report_exposure_is_this_cpus(text: str, plain, exposed, seed: int) -> None:
    """The report's Exposure bullet says what running the plain and the exposed model here
    gives: bitwise equal, or not equal by that largest difference (4 significant digits)."""
    changed, diff = exposure_changes(plain, exposed, seed)
    line = _line(text, "- **Exposure**")
    assert ("was bitwise equal to the plain model's" in line) is (not changed), line
    found = re.search(r"was \*\*not\*\* equal to the plain model's \(max abs diff ([^)]+)\)",
                      line)
    assert bool(found) is changed, line
    if found:
        assert float(found.group(1)) == pytest.approx(diff, rel=5e-4)


def assert_report_is_this_cpus(text: str, fp32, int8, exposed, seed: int) -> None:
    """The three int8-kernel bullets of a report made here, against sessions opened here."""
    cases = settings_cases(int8, seed)
    line = _line(text, "- **Settings**")
    differing = [case for case in cases if not case["bitwise_equal"]]
    assert ("were bitwise equal to the single-threaded unoptimized baseline" in line) is (
        not differing), line
    found = re.findall(r"(ORT_[A-Z_]+) with (\d+) threads? \(max abs diff ([^)]+)\)", line)
    assert [(level, int(threads), float(diff)) for level, threads, diff in found] == [
        (case["level"], case["intra_op"], pytest.approx(case["max_abs_diff"], rel=5e-4))
        for case in differing], line

    assert_report_exposure_is_this_cpus(text, int8, exposed, seed)

    line = _line(text, "- **Gate**")
    rtol, atol = (float(value) for value in re.search(r"rtol ([^,]+), atol ([^,]+),",
                                                       line).groups())
    violations = gate_violations(fp32, int8, seed, rtol, atol)
    found = re.search(r"\*\*failed\*\*: `y`: (\d+) of (\d+) elements outside", line)
    assert (int(found.group(1)) if found else 0) == violations, line
    if found:
        assert int(found.group(2)) == models.run(fp32, contract_input(seed, fp32))[0].size


if __name__ == "__main__":
    here = fingerprint()
    print(json.dumps({**here, "int8_kernel": int8_kernel(here),
                      "recorded_int8_kernel": int8_kernel(recorded()),
                      "deliverables_cpu": DELIVERABLES_CPU}))
