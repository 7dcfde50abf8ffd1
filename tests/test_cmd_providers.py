"""Layer 10, ``providers``: requested, actual, missing and fell back per case, and
--fail-on-fallback by the gate's rule."""
from __future__ import annotations

import onnxruntime as ort
import pytest
from test_sessions import AVAILABLE


@pytest.mark.parametrize("requests", [
    ["CPUExecutionProvider"], ["<accelerator>"],
    ["CPUExecutionProvider", "FooExecutionProvider"],
    ["<accelerator>", "NoSuchExecutionProvider"],
])
def test_fail_on_fallback_uses_the_gates_rule(run_eprun_here, lab_pair, requests):
    """providers keeps the contract's fell_back (an accelerator with the CPU appended fell
    back), while --fail-on-fallback fails only a case that did not get what it asked for: a
    provider missing, or listed with no node (Azure, where onnxruntime says)."""
    fp32, _ = lab_pair
    accelerator = next(name for name in AVAILABLE if name != "CPUExecutionProvider")
    requests = [accelerator if name == "<accelerator>" else name for name in requests]
    result = run_eprun_here("providers", fp32, *requests, "--fail-on-fallback")
    fell_back = [case["fell_back"] for case in result.answer["cases"]]
    assert fell_back == [name != "CPUExecutionProvider" for name in requests]
    reasons = []
    for index, case in enumerate(result.answer["cases"]):
        nodes = case["nodes_per_provider"]
        if case["requested"][0] not in case["actual"]:
            reasons.append(f"case {index} asked for {case['requested'][0]} and got "
                           "CPUExecutionProvider")
        elif nodes is not None and case["requested"] != ["CPUExecutionProvider"] \
                and not nodes.get(case["requested"][0]):
            reasons.append(f"case {index} asked for {case['requested'][0]} and "
                           f"{case['requested'][0]} took 0 of {sum(nodes.values())} nodes")
    assert result.code == (1 if reasons else 0), result.stderr
    if reasons:
        assert result.stderr.splitlines()[-1] == "eprun: fallback: " + "; ".join(reasons)


# -- providers ---------------------------------------------------------------------------------

def test_providers_reports_requested_actual_missing_and_fallback(eprun, lab_pair):
    fp32, _ = lab_pair
    answer = eprun("providers", fp32, " CPUExecutionProvider ", "CUDAExecutionProvider,CPUExecutionProvider",
                   "FooExecutionProvider", "AzureExecutionProvider", ",,")
    available = ort.get_available_providers()
    assert answer["model"] == str(fp32)
    assert answer["available"] == available
    assert [case["requested"] for case in answer["cases"]] == [
        ["CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"],
        ["FooExecutionProvider"], ["AzureExecutionProvider"], []]
    for case in answer["cases"]:
        assert set(case) == {"requested", "actual", "missing", "fell_back", "error"}
        session = ort.InferenceSession(str(fp32), providers=case["requested"])
        assert case["actual"] == session.get_providers()
        assert case["missing"] == [p for p in case["requested"] if p not in available]
        assert case["fell_back"] is (case["actual"] != case["requested"])
        assert case["error"] is None
    assert answer["cases"][0]["fell_back"] is False
    assert answer["cases"][2]["fell_back"] is True  # made-up name: CPU, no exception


def test_providers_on_an_unloadable_file_reports_errors_per_case(eprun, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model")
    answer = eprun("providers", junk, "CPUExecutionProvider", "FooExecutionProvider")
    for case in answer["cases"]:
        assert case["actual"] == [] and case["fell_back"] is True
        assert isinstance(case["error"], str) and case["error"]


def test_a_missing_provider_is_named_with_its_package(run_eprun_here, lab_pair):
    """layers said which package brings a provider this build lacks; providers said nothing.
    Each missing one is named once, the providers that are there never."""
    import eprun as tool

    fp32, _ = lab_pair
    lacking = [name for name in tool.PROVIDER_PACKAGES if name not in AVAILABLE][:2]
    assert len(lacking) == 2, "needs two providers with a package that this build lacks"
    result = run_eprun_here("providers", fp32, f"{lacking[0]},CPUExecutionProvider",
                            ",".join(lacking), "CPUExecutionProvider")
    assert result.code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "comes with the package" in line]
    assert notes == [f"eprun: note: this onnxruntime build has no {name}: it comes with the "
                     f"package {tool.PROVIDER_PACKAGES[name]}" for name in lacking]
    assert "CPUExecutionProvider" not in "".join(notes)
