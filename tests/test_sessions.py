"""Layer 4, sessions and providers: provider names checked and suggested, fallback as the gate
sees it, plugin metadata, and retries of transient errors only."""
from __future__ import annotations

import os
import sys

import models
import onnxruntime as ort
import pytest
from conftest import one_error_line

import eprun as tool

AVAILABLE = ort.get_available_providers()

# -- providers: missing keeps the requested order ----------------------------------------------

def test_providers_missing_keeps_the_requested_order(tmp_path):
    path = models.save(models.chain(features=4, widths=(4, 4)), tmp_path / "m.onnx")
    available = ort.get_available_providers()
    absent = [name for name in ort.get_all_providers() if name not in available][:2]
    assert len(absent) == 2, "needs two providers onnxruntime knows but this build lacks"
    first, second = absent
    requests = [[first, second], [second, "CPUExecutionProvider", first]]
    answer = tool.providers(str(path), requests)
    assert [case["missing"] for case in answer["cases"]] == [[first, second], [second, first]]
    assert [case["requested"] for case in answer["cases"]] == requests


def test_a_session_that_cannot_open_names_the_file_not_its_descriptor(tmp_path):
    """onnxruntime reads the file eprun holds open (/proc/self/fd/N) and names that in its
    error: the user is told the path they gave."""
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n", encoding="utf-8")
    with pytest.raises(tool.EprunError) as failed:
        tool.open_session(str(notes), what=repr(str(notes)))
    said = str(failed.value)
    assert f"Load model from {notes} failed" in said and "/proc/self/fd" not in said, said


# -- retries -----------------------------------------------------------------------------------

class Flaky:
    """Fails ``failures`` times with an EprunError caused by ``message``, then returns 'ok'."""

    def __init__(self, failures: int, message: str = "EP compile timed out") -> None:
        self.failures, self.message, self.calls = failures, message, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            try:
                raise RuntimeError(self.message)
            except RuntimeError as cause:
                raise tool.EprunError("onnxruntime failed") from cause
        return "ok"


@pytest.fixture
def no_sleep(monkeypatch):
    import time

    pauses = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    return pauses


@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_retries_recover_from_exactly_the_budget(retries, no_sleep, capsys):
    action, used = Flaky(retries), [0]
    assert tool._with_retries(action, retries, 0.5, used, "m.onnx") == "ok"
    assert action.calls == retries + 1
    assert used == [retries]
    assert no_sleep == [0.5] * retries
    assert capsys.readouterr().err.splitlines() == [
        "eprun: transient provider error, retrying in 0.5s: onnxruntime failed"] * retries


@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_retries_give_up_after_the_budget(retries, no_sleep):
    action, used = Flaky(retries + 1), [0]
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, retries, 0.0, used, "m.onnx")
    assert action.calls == retries + 1
    assert used == [retries]


def test_retries_are_one_budget_for_the_whole_check(no_sleep):
    action, used = Flaky(2), [2]  # two retries already spent elsewhere, of three
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, 3, 0.0, used, "m.onnx")
    assert action.calls == 2
    assert used == [3]


@pytest.mark.parametrize("message", ["invalid model: no such op", "out of memory",
                                     "Load model from /x/timeout.onnx failed"])
def test_retries_never_retry_a_non_transient_error(message, no_sleep):
    action, used = Flaky(1, message), [0]
    with pytest.raises(tool.EprunError):
        tool._with_retries(action, 3, 0.0, used, "/x/timeout.onnx")
    assert action.calls == 1
    assert used == [0]
    assert no_sleep == []


def test_retries_never_retry_other_exceptions(no_sleep):
    calls = []

    def broken():
        calls.append(1)
        try:
            raise TimeoutError("EP compile timed out")
        except TimeoutError as cause:  # not wrapped by eprun: a bug, not a provider error
            raise RuntimeError("unexpected") from cause

    with pytest.raises(RuntimeError):
        tool._with_retries(broken, 3, 0.0, [0], "m.onnx")
    assert calls == [1]


# -- small parsers -----------------------------------------------------------------------------

@pytest.mark.parametrize(("requested", "actual", "missing"), [
    (["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"],
     ["CUDAExecutionProvider"]),
    (["AzureExecutionProvider"], ["AzureExecutionProvider", "CPUExecutionProvider"], []),
    ([], ["CPUExecutionProvider"], []),
    (["B", "A", "CPUExecutionProvider"], ["CPUExecutionProvider"], ["B", "A"]),
    (["A", "B"], ["B", "A"], []),
    (["CPUExecutionProvider"], [], ["CPUExecutionProvider"]),
    # a device policy is missing when it got nothing but the CPU, unless it asked for the CPU
    (["policy:PREFER_NPU"], ["CPUExecutionProvider"], ["policy:PREFER_NPU"]),
    (["policy:PREFER_NPU"], ["OpenVINOExecutionProvider", "CPUExecutionProvider"], []),
    (["policy:PREFER_CPU"], ["CPUExecutionProvider"], []),
])
def test_fallback_of(requested, actual, missing):
    assert tool.fallback_of(requested, actual) == missing


def test_plugin_candidates_hold_every_plugin_metadata_finds(tmp_path, monkeypatch):
    """The quick scan of metadata folders keeps every distribution installed_plugins would
    keep (named onnxruntime-ep-*, or requiring onnxruntime) and skips onnxruntime's own."""
    def distribution(name: str, requires: str = "") -> None:
        info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                       + (f"Requires-Dist: {requires}\n" if requires else "")
                                       + "\n")
    distribution("onnxruntime-ep-example")
    distribution("vendor-npu-ep", "onnxruntime>=1.22")
    distribution("onnxruntime-gpu", "numpy")
    distribution("unrelated", "numpy")
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    found = {os.path.basename(path) for path in tool._plugin_candidates()}
    assert found == {"onnxruntime_ep_example-1.0.dist-info", "vendor_npu_ep-1.0.dist-info"}
    zipped = tmp_path / "packages.zip"
    zipped.write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(zipped)])
    assert tool._plugin_candidates() is None  # a zip on the path: importlib.metadata decides


def test_onnxruntime_adding_the_cpu_provider_is_not_a_fallback(run_eprun_here, lab_pair):
    """[X] that got [X, CPU] holds what it asked for, as long as X took nodes. The CPU build's
    other provider (Azure) is listed by every session it is asked for and takes none: where
    onnxruntime says so (1.24+), that is the fallback, not the CPU it appended."""
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"]) == []
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"],
                            {"X": 3, "CPUExecutionProvider": 1}) == []
    assert tool.fallback_of(["X"], ["X", "CPUExecutionProvider"],
                            {"CPUExecutionProvider": 4}) == ["X"]
    fp32, _ = lab_pair
    accelerator = next(name for name in AVAILABLE if name != "CPUExecutionProvider")
    result = run_eprun_here("check", fp32, fp32, "--providers", accelerator)
    answer = result.answer
    assert answer["providers"]["actual"] == [accelerator, "CPUExecutionProvider"]
    nodes = answer["providers"]["nodes_per_provider"]
    idle = nodes is not None and not nodes.get(accelerator)
    assert result.code == (1 if idle else 0) and answer["profile"] == "fp16"
    assert [failure["bound"] for failure in answer["failures"]] == (["providers"] if idle
                                                                    else [])


@pytest.mark.parametrize("name, hint", [
    ("CUDAExecutionprovider", "did you mean CUDAExecutionProvider?"),
    ("CUDA", "did you mean CUDAExecutionProvider?"),
    ("tensorrt", "did you mean TensorrtExecutionProvider?"),
    ("a;b", "onnxruntime knows "),
])
def test_unknown_provider_names_are_caught(run_eprun_here, lab_pair, name, hint):
    fp32, _ = lab_pair
    for argv in (["check", fp32, fp32, "--providers", f"{name},CPUExecutionProvider"],
                 ["check", fp32, fp32, "--reference-providers", name],
                 ["placement", fp32, name]):
        line = one_error_line(run_eprun_here(*argv), 2)
        assert f"{name!r} is not a provider onnxruntime knows; {hint}" in line
    reported = run_eprun_here("providers", fp32, name)  # the contract's command reports it
    assert reported.code == 0 and reported.answer["cases"][0]["missing"] == [name]
    assert f"eprun: note: {name!r} is not a provider onnxruntime knows; {hint}" in \
        reported.stderr


def test_retries_never_match_the_users_own_path(run_eprun_here, tmp_path):
    corrupt = tmp_path / "timeout_study.onnx"
    corrupt.write_bytes(b"not a model, timed out")
    fine = models.save(models.chain(features=4, widths=(4, 4)), tmp_path / "fine.onnx")
    result = run_eprun_here("check", fine, corrupt, "--retry-pause", "0")
    one_error_line(result, 4)

    import eprun as tool

    class Fail(Exception):
        pass

    def error_from(text: str) -> tool.EprunError:
        try:
            raise tool.EprunError("onnxruntime cannot open it") from Fail(text)
        except tool.EprunError as exc:
            return exc

    assert tool.is_transient(error_from("CUDA failure: the launch timed out"), "m.onnx")
    assert not tool.is_transient(error_from("Load model from /x/timeout.onnx failed"),
                                 "/x/timeout.onnx")
    assert not tool.is_transient(tool.EprunError("device lost in m.onnx"), "m.onnx")


# -- what a model file asks of its session -------------------------------------------------------

def test_a_model_s_ort_config_never_sets_eprun_s_sessions(run_eprun_here, lab_pair, tmp_path):
    """ORT_LOAD_CONFIG_FROM_MODEL=1 replaced eprun's session options with the model's own
    (none here), node assignment's entry with them, and layers ended in an internal error. The
    variable is set aside, said once, and is there again afterwards."""
    import onnx

    fp32, int8 = lab_pair
    model = onnx.load(str(int8))
    onnx.helper.set_model_props(model, {"ort_config": '{"session_options": '
                                        '{"graph_optimization_level": 0}}'})
    asking = tmp_path / "asking.onnx"
    onnx.save(model, str(asking))
    plain = run_eprun_here("layers", fp32, int8, "1")
    assert plain.code == 0, plain.stderr
    told = run_eprun_here("layers", fp32, asking, "1", env={"ORT_LOAD_CONFIG_FROM_MODEL": "1"})
    assert told.code == 0, told.stderr
    assert told.answer == plain.answer
    warnings = [line for line in told.stderr.splitlines() if "ORT_LOAD_CONFIG_FROM_MODEL" in line]
    assert warnings == [("eprun: warning: ORT_LOAD_CONFIG_FROM_MODEL=1 is ignored: eprun's "
                        "sessions take their options from eprun's flags, never from the "
                        "ort_config a model file carries")]
