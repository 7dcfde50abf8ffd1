"""Measuring on execution providers other than the CPU: provider requests, plugin EP libraries,
device policies, provider options, refusals, and every number of ``--providers`` recomputed
with onnxruntime and numpy on the same inputs.

The tests that need a real second EP run where one is installed (``make test-ep`` builds the
two stacks: onnxruntime-openvino, and onnxruntime with the OpenVINO plugin package and a plugin
CPU EP library) and are skipped elsewhere; the rest run on every stack.
"""
from __future__ import annotations

import importlib.util
import json
import platform

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import fails, run_eprun, run_here, succeeds

import eprun as tool

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
RELEASE = tuple(int(part) for part in ort.__version__.split(".")[:2])
PLUGINS_SUPPORTED = RELEASE >= (1, 22)
BUILT_IN = frozenset(ort.get_available_providers())  # before any library is registered here

built_in_openvino = pytest.mark.skipif(
    OPENVINO not in BUILT_IN,
    reason="onnxruntime-openvino is not installed (make test-ep runs these)")
plugin_cpu_ep = pytest.mark.skipif(
    not PLUGINS_SUPPORTED or importlib.util.find_spec("nxrt_ep_cpu") is None,
    reason="the plugin CPU EP package nxrt-ep-cpu is not installed (make test-ep runs these)")
plugin_openvino = pytest.mark.skipif(
    not PLUGINS_SUPPORTED or importlib.util.find_spec("onnxruntime_ep_openvino") is None,
    reason="onnxruntime-ep-openvino is not installed (make test-ep runs these)")


# The EPs of the plugin packages installed here: eprun registers such a package by itself
# when a provider list names its EP.
PLUGIN_EPS = tuple(name for _, _, names in tool.installed_plugins() for name in names)


def registers_a_plugin(args) -> bool:
    """Could a run of eprun with ``args`` register a plugin EP library (``--ep-library``, a
    device policy, or a list naming an installed plugin package's EP)? onnxruntime keeps a
    registration as long as its process does, so such a run gets a process of its own: it must
    not leak into the next run's sessions, nor meet the registration ``plugin_packages`` makes
    for the oracles. Every other run is ``main(argv)`` in this process."""
    words = [str(word) for word in args]
    return any(word == "--ep-library" or "policy:" in word
               or any(name in word for name in PLUGIN_EPS) for word in words)


@pytest.fixture
def run_ep(capfd, monkeypatch):
    """``run_eprun``, in a process of its own only where the run may register a plugin EP."""
    def call(*args, **kwargs):
        if registers_a_plugin(args):
            return run_eprun(*args, **kwargs)
        return run_here(capfd, monkeypatch, *args, **kwargs)
    return call


@pytest.fixture
def eprun(run_ep):
    return succeeds(run_ep)


@pytest.fixture
def eprun_fails(run_ep):
    return fails(run_ep)


# -- oracles: onnxruntime sessions made here, numbers with numpy -------------------------------

@pytest.fixture(scope="module")
def plugin_packages():
    """The installed plugin EP packages registered in this process too, as eprun registers
    them by itself: an oracle session must see the devices eprun's sessions see (on an Intel
    CPU the OpenVINO plugin offers one, and a device policy then picks it)."""
    registered = []
    if PLUGINS_SUPPORTED and importlib.util.find_spec("onnxruntime_ep_openvino") is not None:
        import onnxruntime_ep_openvino

        ort.register_execution_provider_library("test-openvino",
                                                onnxruntime_ep_openvino.get_library_path())
        registered.append("test-openvino")
    yield
    for name in registered:
        ort.unregister_execution_provider_library(name)


@pytest.fixture(scope="module")
def openvino(plugin_packages):
    """Open a session on OpenVINO in whichever packaging is installed, the way each is
    documented: built in by name, the plugin through its devices. Skips where neither is
    installed, or the plugin offers no device (it takes Intel devices only)."""
    if OPENVINO in BUILT_IN:
        def by_name(path, options=None):
            return ort.InferenceSession(str(path), options, providers=[OPENVINO, CPU])
        return by_name
    devices = ([device for device in ort.get_ep_devices() if device.ep_name == OPENVINO]
               if PLUGINS_SUPPORTED else [])
    if not devices:
        pytest.skip("OpenVINO is not installed, or its plugin offers no device on this machine "
                    "(make test-ep runs these)")

    def by_devices(path, options=None):
        options = options or ort.SessionOptions()
        options.add_provider_for_devices(devices, {})
        return ort.InferenceSession(str(path), options)
    return by_devices


def lab_input(model, seed: int) -> np.ndarray:
    """The contract input for a [batch, F] model (models.contract_input)."""
    features = onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return models.contract_input(seed, features)


def absent_provider() -> str:
    """A provider onnxruntime knows but this build does not have."""
    return next(name for name in ("CUDAExecutionProvider", "DmlExecutionProvider")
                if name not in ort.get_available_providers())


def test_a_registered_plugin_ep_goes_through_its_devices(monkeypatch):
    """By name alone a plugin EP can silently give the CPU (OpenVINO's does): once one is
    requested, every provider of the list is appended through the session options."""
    monkeypatch.setattr(tool.PLUGINS, "libraries", {"/plugins/libx.so": ["cpu_ep"]})
    assert tool.ProviderRequest(["cpu_ep", CPU]).by_devices()
    assert tool.ProviderRequest(["policy:PREFER_NPU"]).by_devices()
    assert not tool.ProviderRequest([OPENVINO, CPU]).by_devices()  # built in: by name


def plugin_library() -> str:
    import nxrt_ep_cpu

    return nxrt_ep_cpu.get_library_path()


def plugin_session(path, ep_name: str):
    """A session on a plugin EP, made the way the onnxruntime documentation says: through its
    devices (the CPU sessions of the oracles are ``models.run``'s)."""
    options = ort.SessionOptions()
    devices = [device for device in ort.get_ep_devices() if device.ep_name == ep_name]
    assert devices, f"{ep_name} offers no device"
    options.add_provider_for_devices(devices, {})
    return ort.InferenceSession(str(path), options)


def boundary_numbers(reference: np.ndarray, candidate: np.ndarray, rows: int) -> dict:
    """The contract's per-boundary numbers, written out again from the README."""
    a = reference.astype(np.float64)
    b = candidate.astype(np.float64)
    max_abs = float(np.abs(a - b).max())
    scale = float(np.abs(a).max())
    a2, b2 = a.reshape(rows, -1), b.reshape(rows, -1)
    cosines = []
    for row_a, row_b in zip(a2, b2):
        norm = np.linalg.norm(row_a) * np.linalg.norm(row_b)
        cosines.append(1.0 if norm == 0 else float(row_a @ row_b / norm))
    return {"max_abs_error": max_abs, "scale": scale,
            "rel_error": max_abs / scale if scale else 0.0, "cos_min": min(cosines)}


def nodes_on(path, opener=None) -> dict | None:
    """How many nodes each provider took in a session made here (onnxruntime's assignment
    info, 1.24+), None where onnxruntime does not say."""
    if not hasattr(ort.InferenceSession, "get_provider_graph_assignment_info"):
        return None
    options = ort.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    session = (opener or (lambda model, given: ort.InferenceSession(
        str(model), given, providers=[CPU])))(path, options)
    counts: dict = {}
    for subgraph in session.get_provider_graph_assignment_info():
        counts[subgraph.ep_name] = counts.get(subgraph.ep_name, 0) + len(subgraph.get_nodes())
    return counts


def nodes_fields(counts: dict | None, prefix: str = "") -> dict:
    """The record fields eprun writes for ``counts`` (README: "nodes_per_provider")."""
    if counts is not None:
        return {f"{prefix}nodes_per_provider": counts}
    return {f"{prefix}nodes_per_provider": None,
            f"{prefix}nodes_unknown": f"onnxruntime {ort.__version__} does not say which "
                                      "provider each node went to (1.24 and later do)"}


def exposed_copy(model, tmp_path, name: str):
    out = tmp_path / f"{name}_exposed.onnx"
    return out, tool.expose(str(model), str(out))["boundaries"]


def assert_table(answer: dict, reference_outputs: dict, candidate_outputs: dict, rows: int):
    for entry in answer["layers"]:
        expected = boundary_numbers(reference_outputs[entry["fp32"]],
                                    candidate_outputs[entry["int8"]], rows)
        for key, value in expected.items():
            assert entry[key] == pytest.approx(value, rel=1e-6, abs=1e-12), (entry, key)


# -- on every stack ----------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["OpenVINOExecutionProvider", "EP:key", ":key=value",
                                  "EP:=value", "EP"])
def test_malformed_ep_option_is_a_usage_error(eprun_fails, lab_pair, text):
    fp32, int8 = lab_pair
    line = eprun_fails(2, "layers", fp32, int8, "1", "--providers", CPU, "--ep-option", text)
    assert "EP:KEY=VALUE" in line


def test_ep_option_parsing_keeps_the_value_whole():
    assert tool.parse_ep_option("OpenVINOExecutionProvider:cache_dir=a:b=c") == (
        OPENVINO, "cache_dir", "a:b=c")


def test_an_option_for_a_provider_no_list_asks_for_is_refused(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    line = eprun_fails(2, "layers", fp32, int8, "1", "--providers", CPU, "--ep-option",
                       f"{OPENVINO}:device_type=CPU")
    assert OPENVINO in line and "no provider list" in line


def test_unknown_provider_is_a_usage_error_with_a_suggestion(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    for command in (["layers", fp32, int8, "1"], ["growth", fp32, int8, "1"],
                    ["settings", int8, "1"], ["sensitivity", fp32, int8, "1"]):
        line = eprun_fails(2, *command, "--providers", "OpenVinoExecutionProvider")
        assert "did you mean OpenVINOExecutionProvider?" in line, command
    # a typo in the suffix itself, and a short form
    for typed, meant in (("OpenVINOExecutionProvder", OPENVINO),
                         ("CUDAExecutionProviders", "CUDAExecutionProvider"),
                         ("OpenVino", OPENVINO)):
        line = eprun_fails(2, "layers", fp32, int8, "1", "--providers", typed)
        assert f"did you mean {meant}?" in line, typed


@pytest.mark.skipif(not PLUGINS_SUPPORTED, reason="plugin EP libraries need onnxruntime 1.22+")
def test_a_library_that_brings_no_provider_is_refused(lab_pair, monkeypatch):
    """A plugin built for a newer onnxruntime loads, prints its complaint and creates nothing
    (nxrt-ep-cpu on onnxruntime 1.24): --ep-library naming it is an error, not an unknown
    provider name later."""
    fp32, _ = lab_pair
    monkeypatch.setattr(ort, "register_execution_provider_library", lambda name, path: None)
    monkeypatch.setattr(tool, "PLUGINS", tool.PluginLibraries())
    with pytest.raises(tool.EprunError, match="brought no execution provider") as caught:
        tool.PLUGINS.register(str(fp32))
    assert caught.value.code == 4


def test_request_splits_names_and_policy():
    request = tool.ProviderRequest(["policy:MAX_EFFICIENCY"])
    assert (request.names, request.policy) == ([], "MAX_EFFICIENCY")
    request = tool.ProviderRequest([OPENVINO, CPU])
    assert (request.names, request.policy) == ([OPENVINO, CPU], None)


def test_missing_provider_is_refused_unless_fallback_is_allowed(eprun, eprun_fails, lab_pair,
                                                               tmp_path):
    """A provider this build does not have: the session quietly gets the CPU. The measurement
    is refused (exit 4, naming what it got); --allow-fallback measures and records it."""
    fp32, int8 = lab_pair
    absent = absent_provider()
    for command in (["layers", fp32, int8, "1"], ["settings", int8, "1"],
                    ["sensitivity", fp32, int8, "1", "--max-units", "1"]):
        line = eprun_fails(4, *command, "--providers", absent)
        assert f"asked for {absent} and got CPUExecutionProvider" in line, command
        assert "--allow-fallback" in line
    plain = eprun("layers", fp32, int8, "1")
    allowed = eprun("layers", fp32, int8, "1", "--providers", absent, "--allow-fallback")
    fp32_exposed, _ = exposed_copy(fp32, tmp_path, "fp32")
    int8_exposed, _ = exposed_copy(int8, tmp_path, "int8")
    assert allowed["providers"] == {"requested": [absent], "actual": [CPU], "fell_back": True,
                                    "missing": [absent], "reference": [CPU],
                                    **nodes_fields(nodes_on(int8_exposed)),
                                    **nodes_fields(nodes_on(fp32_exposed), "reference_")}
    assert allowed["layers"] == plain["layers"]
    # a fallback measured anyway: no exposure record, which would describe the CPU
    assert "exposure" not in allowed


def test_cpu_providers_add_the_record_and_change_no_number(eprun, lab_pair):
    fp32, int8 = lab_pair
    plain = eprun("growth", fp32, int8, "5")
    on_cpu = eprun("growth", fp32, int8, "5", "--providers", CPU)
    record = on_cpu.pop("providers")
    assert {key: record.pop(key) for key in ("requested", "actual", "fell_back", "missing",
                                              "reference")} == {
        "requested": [CPU], "actual": [CPU], "fell_back": False, "missing": [],
        "reference": [CPU]}
    counts = record.pop("nodes_per_provider"), record.pop("reference_nodes_per_provider")
    assert all(count is None or set(count) == {CPU} for count in counts)
    for key in ("exposure", "reference_exposure"):  # no longer the contract's: said
        exposure = on_cpu.pop(key)
        assert exposure["output"] == "y" and exposure["max_abs_diff"] >= 0
    # the answer is no longer the contract's: it says where the two first differ
    first = on_cpu.pop("first_divergence")
    born = next(k for k, error in enumerate(plain["rel_error"]) if error != 0)
    assert first["index"] == born
    assert on_cpu == plain


def test_policy_mixed_with_names_is_refused(eprun_fails, lab_pair):
    fp32, _ = lab_pair
    code = 2
    line = eprun_fails(code, "providers", fp32, f"policy:PREFER_NPU,{CPU}")
    assert "give policy:PREFER_NPU alone" in line or "needs onnxruntime 1.22" in line


@pytest.mark.skipif(PLUGINS_SUPPORTED, reason="onnxruntime 1.22+ has plugin EPs")
def test_plugin_features_name_the_release_they_need(eprun_fails, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    library = tmp_path / "libplugin.so"
    library.write_bytes(b"\x7fELF")
    line = eprun_fails(2, "layers", fp32, int8, "1", "--ep-library", library)
    assert "needs onnxruntime 1.22 or newer" in line and ort.__version__ in line
    line = eprun_fails(2, "providers", fp32, "policy:PREFER_NPU")
    assert "needs onnxruntime 1.22 or newer" in line


@pytest.mark.skipif(not PLUGINS_SUPPORTED, reason="plugin EP libraries need onnxruntime 1.22+")
def test_ep_library_that_is_missing_or_not_a_library(eprun_fails, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    line = eprun_fails(3, "layers", fp32, int8, "1", "--ep-library", tmp_path / "no.so")
    assert "no.so" in line and "does not exist" in line
    fake = tmp_path / "fake.so"
    fake.write_bytes(b"not a shared library")
    line = eprun_fails(4, "providers", fp32, CPU, "--ep-library", fake)
    assert "is not an execution provider library" in line


@pytest.mark.skipif(not PLUGINS_SUPPORTED, reason="device policies need onnxruntime 1.22+")
def test_policy_names_are_checked(eprun, eprun_fails, lab_pair, plugin_packages):
    fp32, _ = lab_pair
    line = eprun_fails(2, "providers", fp32, "policy:PREFER_NPUU")
    assert "did you mean PREFER_NPU?" in line
    answer = eprun("providers", fp32, "policy:PREFER_CPU")
    options = ort.SessionOptions()
    options.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    expected = ort.InferenceSession(str(fp32), options).get_providers()
    assert answer["cases"][0]["actual"] == expected
    assert answer["cases"][0]["missing"] == []


# -- a plugin EP library (nxrt-ep-cpu: a CPU plugin EP that offers a device on any CPU) -------

@plugin_cpu_ep
def test_plugin_ep_is_appended_through_its_devices(eprun, lab_pair):
    """Registered from ``--ep-library``, the plugin EP is listed as available and each list
    gets it in its own order, as a session given its devices does (the way onnxruntime
    documents for plugin EPs; by name alone some plugins, OpenVINO's, give the CPU)."""
    fp32, _ = lab_pair
    library = plugin_library()
    answer = eprun("providers", fp32, "cpu_ep", f"{CPU},cpu_ep", "--ep-library", library)
    assert "cpu_ep" in answer["available"]
    assert [case["actual"] for case in answer["cases"]] == [["cpu_ep", CPU], [CPU, "cpu_ep"]]
    assert [case["missing"] for case in answer["cases"]] == [[], []]
    ort.register_execution_provider_library("test-cpu-ep", library)
    try:
        assert "cpu_ep" in ort.get_available_providers()
        assert plugin_session(fp32, "cpu_ep").get_providers() == ["cpu_ep", CPU]
    finally:
        ort.unregister_execution_provider_library("test-cpu-ep")


@plugin_cpu_ep
def test_unregistered_plugin_name_is_unknown(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    line = eprun_fails(2, "layers", fp32, int8, "1", "--providers", "cpu_ep")
    assert "'cpu_ep' is not a provider onnxruntime knows" in line


@plugin_cpu_ep
def test_layers_on_a_plugin_ep_recomputed(eprun, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    library = plugin_library()
    answer = eprun("layers", fp32, int8, "7", "--providers", "cpu_ep", "--ep-library", library)
    assert answer["providers"]["actual"] == ["cpu_ep", CPU]
    assert answer["providers"]["missing"] == []
    fp32_exposed, fp32_names = exposed_copy(fp32, tmp_path, "fp32")
    int8_exposed, int8_names = exposed_copy(int8, tmp_path, "int8")
    x = lab_input(fp32, 7)
    ort.register_execution_provider_library("test-cpu-ep", library)
    try:
        reference = dict(zip(fp32_names, models.run(fp32_exposed, x, fp32_names)))
        on_plugin = plugin_session(int8_exposed, "cpu_ep")
        candidate = dict(zip(int8_names, on_plugin.run(int8_names, {"x": x})))
        plain = plugin_session(int8, "cpu_ep").run([int8_names[-1]], {"x": x})[0]
    finally:
        ort.unregister_execution_provider_library("test-cpu-ep")
    assert_table(answer, reference, candidate, 64)
    assert answer["exposure"] == {"output": int8_names[-1], "max_abs_diff": pytest.approx(
        float(np.abs(plain.astype(np.float64) - candidate[int8_names[-1]]).max()), abs=0)}


# -- the OpenVINO plugin package: registered by itself ------------------------------------------

@plugin_openvino
def test_openvino_plugin_package_is_registered_by_itself(
        eprun, eprun_fails, lab_pair, plugin_packages, run_ep):
    """Where the plugin offers a device (an Intel CPU, GPU or NPU) the session gets it; where
    it offers none (the plugin takes Intel devices only), the measurement is refused with the
    reason, and --allow-fallback records the CPU."""
    fp32, int8 = lab_pair
    offered = any(device.ep_name == OPENVINO for device in ort.get_ep_devices())
    answer = eprun("providers", fp32, OPENVINO)
    assert (OPENVINO in answer["available"]) is offered
    assert (OPENVINO in answer["cases"][0]["actual"]) is offered
    if offered:
        measured = eprun("layers", fp32, int8, "1", "--providers", OPENVINO)
        assert measured["providers"]["actual"] == [OPENVINO, CPU]
        assert measured["providers"]["missing"] == []
        # the package names one EP, its library's devices carry more (".AUTO"): each is known
        carried = sorted({device.ep_name for device in ort.get_ep_devices()
                          if device.ep_name.startswith(OPENVINO)})
        for name in carried:
            result = run_ep("growth", fp32, int8, "1", "--providers", name)
            assert result.code == 0, (name, result.stderr)
            assert result.answer["providers"]["actual"] == [name, CPU]
    else:
        line = eprun_fails(4, "layers", fp32, int8, "1", "--providers", OPENVINO)
        assert "offers no device on this machine" in line
        allowed = eprun("layers", fp32, int8, "1", "--providers", OPENVINO, "--allow-fallback")
        assert allowed["providers"]["missing"] == [OPENVINO]


# -- onnxruntime-openvino: OpenVINO built in ----------------------------------------------------

def test_int8_against_itself_on_openvino_is_the_divergence_table(eprun, tmp_path, openvino):
    """The same quantized transformer on OpenVINO and on the CPU: every boundary recomputed
    from sessions made here on the same .npz inputs, and the exposure effect measured."""
    import real_models

    fp32 = tmp_path / "enc.onnx"
    int8 = tmp_path / "enc_int8.onnx"
    model = real_models.transformer_encoder(seed=3)
    onnx.save(model, str(fp32))
    models.quantize(fp32, int8, seed=4, rows=4)
    feeds = real_models.random_feeds(model, seed=5, rows=4)
    np.savez(tmp_path / "inputs.npz", **feeds)
    answer = eprun("layers", int8, int8, "0", "--providers", OPENVINO, "--inputs",
                   tmp_path / "inputs.npz")
    exposed, names = exposed_copy(int8, tmp_path, "enc_int8")
    assert answer["providers"] == {"requested": [OPENVINO], "actual": [OPENVINO, CPU],
                                   "fell_back": True, "missing": [], "reference": [CPU],
                                   **nodes_fields(nodes_on(exposed, openvino)),
                                   **nodes_fields(nodes_on(exposed), "reference_")}
    reference = dict(zip(names, models.run(exposed, feeds, names)))
    candidate = dict(zip(names, openvino(exposed).run(names, feeds)))
    assert_table(answer, reference, candidate, answer["rows"])
    plain = openvino(int8).run([names[-1]], feeds)[0]
    assert answer["exposure"]["output"] == names[-1]
    assert answer["exposure"]["max_abs_diff"] == pytest.approx(
        float(np.abs(plain.astype(np.float64) - candidate[names[-1]]).max()), abs=0)


def test_lab_pair_on_openvino_recomputed(eprun, lab_pair, tmp_path, openvino):
    fp32, int8 = lab_pair
    answer = eprun("growth", fp32, int8, "11", "--providers", f"{OPENVINO},{CPU}")
    fp32_exposed, fp32_names = exposed_copy(fp32, tmp_path, "fp32")
    int8_exposed, int8_names = exposed_copy(int8, tmp_path, "int8")
    x = lab_input(fp32, 11)
    reference = models.run(fp32_exposed, x, fp32_names)
    candidate = openvino(int8_exposed).run(int8_names, {"x": x})
    rel = [boundary_numbers(a, b, 64)["rel_error"] for a, b in zip(reference, candidate)]
    assert answer["rel_error"] == pytest.approx(rel, rel=1e-6, abs=1e-12)
    assert answer["providers"]["actual"] == [OPENVINO, CPU]
    assert answer["providers"]["fell_back"] is False


def test_check_on_openvino_counts_what_numpy_counts(lab_pair, openvino, run_ep):
    fp32, int8 = lab_pair
    result = run_ep("check", fp32, int8, "--providers", OPENVINO, "--seed", "2",
                       "--profile", "fp16")
    assert result.code in (0, 1), result.stderr
    answer = result.answer
    assert answer["providers"]["actual"] == [OPENVINO, CPU]
    x = lab_input(fp32, 2)
    expected = models.run(fp32, x)[0]
    got = openvino(int8).run(None, {"x": x})[0]
    violations = int(np.count_nonzero(~np.isclose(got, expected, rtol=1e-2, atol=1e-3)))
    assert answer["outputs"][0]["violations"] == violations
    assert (result.code == 1) is (violations > 0 or answer["outputs"][0]["cosine"] < 0.999)


@built_in_openvino
@pytest.mark.parametrize("route", ["qdq", "qoperator"])
def test_the_share_of_the_graph_on_openvino_is_node_assignment(lab_pair, run_ep, tmp_path,
                                                               route):
    """--min-provider-share: the QDQ lab twin runs on OpenVINO, the QOperator one mostly does
    not (QLinearMatMul and QLinearAdd stay on the CPU); the share and the op types elsewhere
    are onnxruntime's own node assignment, read here from a session opened the same way."""
    fp32, _ = lab_pair
    int8 = models.quantize(fp32, tmp_path / f"{route}.onnx", seed=4, route=route)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    session = ort.InferenceSession(str(int8), options, providers=[OPENVINO, CPU])
    kinds: dict = {}
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            kinds.setdefault(subgraph.ep_name, {}).setdefault(node.op_type, 0)
            kinds[subgraph.ep_name][node.op_type] += 1
    total = sum(sum(by_type.values()) for by_type in kinds.values())
    share = sum(kinds.get(OPENVINO, {}).values()) / total
    result = run_ep("check", fp32, int8, "--providers", OPENVINO, "--atol", "10",
                    "--min-cos", "0", "--min-provider-share", f"{OPENVINO}:0.5")
    record = result.answer["provider_share"][OPENVINO]
    assert record["share"] == pytest.approx(share) and record["total"] == total
    failed = [f for f in result.answer["failures"] if f["bound"] == "provider_share"]
    assert bool(failed) is (share < 0.5)
    if route == "qoperator":
        assert share < 0.5 and failed[0]["elsewhere"] == kinds[CPU]
        assert f"{OPENVINO} took {record['nodes']} of {total} nodes" in result.stderr
    else:
        assert share >= 0.5 and result.code == 0, result.stderr


def test_settings_on_openvino_recomputed(eprun, lab_pair, openvino):
    _, int8 = lab_pair
    answer = eprun("settings", int8, "4", "--providers", OPENVINO)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = openvino(int8, options)
    x = lab_input(int8, 4)
    y = session.run(None, {"x": x})[0]
    assert answer["baseline"]["max_abs_output"] == pytest.approx(float(np.abs(y).max()),
                                                                 rel=1e-6)
    assert answer["providers"]["reference"] == [OPENVINO, CPU]


def test_sensitivity_on_openvino_runs_every_variant_there(eprun, lab_pair, openvino):
    fp32, int8 = lab_pair
    answer = eprun("sensitivity", fp32, int8, "3", "--providers", OPENVINO, "--max-units", "1")
    assert answer["providers"]["actual"] == [OPENVINO, CPU]
    assert answer["providers"]["reference"] == [CPU]
    x = lab_input(fp32, 3)
    reference = models.run(fp32, x)[0]
    quantized = openvino(int8).run(None, {"x": x})[0]
    assert answer["quantized"]["rel_error"] == pytest.approx(
        boundary_numbers(reference, quantized, 64)["rel_error"], rel=1e-6)


@built_in_openvino
def test_ep_options_recorded_and_a_rejected_one_is_an_error(eprun, eprun_fails, lab_pair, run_ep):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "1", "--providers", OPENVINO, "--ep-option",
                   f"{OPENVINO}:precision=ACCURACY")
    assert answer["providers"]["options"] == {OPENVINO: {"precision": "ACCURACY"}}
    assert answer["providers"]["actual"] == [OPENVINO, CPU]
    for command in (["layers", fp32, int8, "1", "--providers", OPENVINO],
                    ["placement", int8, OPENVINO]):
        line = eprun_fails(4, *command, "--ep-option", f"{OPENVINO}:no_such_key=1")
        assert "Invalid OpenVINO EP option: no_such_key" in line, command  # onnxruntime's own
    # providers reports per case (the contract's exit 0), the provider's words on stderr
    result = run_ep("providers", fp32, OPENVINO, "--ep-option", f"{OPENVINO}:no_such_key=1")
    assert result.code == 0 and result.answer["cases"][0]["error"] == "RuntimeError"
    assert "Invalid OpenVINO EP option: no_such_key" in result.stderr


@plugin_openvino
def test_options_a_plugin_ep_ignores_are_said_to_be_unchecked(lab_pair, openvino, run_ep):
    """onnxruntime hands a plugin EP its options unchecked, and OpenVINO's plugin ignores an
    unknown key without a word (and "precision" with only a log line): the session opens, so
    the answer must not pass the given options off as applied."""
    fp32, int8 = lab_pair
    result = run_ep("layers", fp32, int8, "1", "--providers", OPENVINO,
                       "--ep-option", f"{OPENVINO}:no_such_key=1")
    assert result.code == 0, result.stderr
    assert result.answer["providers"]["options"] == {OPENVINO: {"no_such_key": "1"}}
    assert result.answer["providers"]["actual"] == [OPENVINO, CPU]
    assert f"{OPENVINO} is a plugin EP" in result.stderr
    assert "what was given, not what it applied" in result.stderr


@pytest.mark.parametrize("requested", [[CPU], [OPENVINO, CPU]])
def test_placement_counts_the_subgraphs_onnxruntime_assigned(eprun, lab_pair, requested,
                                                             request):
    opener = (request.getfixturevalue("openvino") if OPENVINO in requested else
              lambda path, options: ort.InferenceSession(str(path), options, providers=[CPU]))
    _, int8 = lab_pair
    answer = eprun("placement", int8, ",".join(requested))
    assert answer["actual"] == requested
    assert sum(answer["counts"].values()) == len(answer["nodes"])
    if answer["source"] == "graph_assignment_info":
        options = ort.SessionOptions()
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        session = opener(int8, options)
        expected: dict = {}
        for subgraph in session.get_provider_graph_assignment_info():
            expected[subgraph.ep_name] = expected.get(subgraph.ep_name, 0) + 1
    else:  # a profile: each run of consecutive nodes on one provider is one subgraph
        expected, previous = {}, None
        for node in answer["nodes"]:
            if node["provider"] != previous:
                expected[node["provider"]] = expected.get(node["provider"], 0) + 1
            previous = node["provider"]
    assert answer["subgraphs"] == expected


# -- golden files: the reference measured on one machine, the candidate run on another -------

def test_saved_outputs_hold_the_reference_run_and_give_the_same_verdict(lab_pair, tmp_path, run_ep):
    fp32, int8 = lab_pair
    golden = tmp_path / "golden.npz"
    first = run_ep("check", fp32, int8, "--seed", "6", "--save-outputs", golden)
    saved = first.answer
    assert saved.pop("golden") == {"saved": str(golden)}
    with np.load(golden, allow_pickle=False) as archive:
        stored_x, stored_y = archive["x"], archive["y"]  # by their input and output names
    x = lab_input(fp32, 6)
    assert np.array_equal(stored_x, x)
    assert np.array_equal(stored_y, models.run(fp32, x)[0])
    second = run_ep("check", fp32, int8, "--load-outputs", golden)
    assert second.code == first.code
    assert second.stderr == first.stderr  # no seed given: the stored inputs, nothing to say
    loaded = second.answer
    record = loaded.pop("golden")
    assert record["loaded"] == str(golden) and record["providers"] == [CPU]
    assert record["onnxruntime"] == ort.__version__ and record["model"] == fp32.name
    assert record["machine"].startswith(platform.machine()) and record["seed"] == 6
    assert record["nodes_per_provider"] == nodes_on(fp32)
    assert record["fingerprint"].startswith("sha256:")
    assert loaded.pop("inputs") == [{"name": "x", "dtype": "float32",
                                     "shape": list(x.shape), "source": "file"}]
    assert loaded.pop("seed") == 0 and saved.pop("seed") == 6
    assert loaded == saved


def test_saved_boundaries_give_the_same_table(eprun, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    golden = tmp_path / "boundaries.npz"
    saved = eprun("layers", fp32, int8, "8", "--save-boundaries", golden)
    plain = eprun("layers", fp32, int8, "8")
    assert saved.pop("golden") == {"saved": str(golden)}
    assert saved.pop("exposure")["output"] == saved.pop("reference_exposure")["output"] == "y"
    assert saved.pop("first_divergence")["index"] == next(
        entry["index"] for entry in plain["layers"] if entry["max_abs_error"] != 0)
    assert saved == plain
    loaded = eprun("growth", fp32, int8, "8", "--load-boundaries", golden)
    assert loaded["rel_error"] == [entry["rel_error"] for entry in plain["layers"]]
    assert loaded["golden"]["loaded"] == str(golden)


def test_golden_files_are_refused_where_they_do_not_fit(eprun, eprun_fails, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    golden = tmp_path / "boundaries.npz"
    eprun("layers", fp32, int8, "8", "--save-boundaries", golden)
    line = eprun_fails(4, "layers", int8, int8, "8", "--load-boundaries", golden)
    assert "saved from another graph" in line and "refusing to compare" in line
    line = eprun_fails(4, "check", fp32, int8, "--load-outputs", golden)
    assert "holds boundaries, not outputs" in line
    line = eprun_fails(2, "layers", fp32, int8, "8", "--load-boundaries", golden,
                       "--save-boundaries", tmp_path / "again.npz")
    assert "exclude each other" in line
    line = eprun_fails(2, "layers", fp32, int8, "8", "--load-boundaries", golden, "--local")
    assert "--local" in line
    eprun_fails(3, "check", fp32, int8, "--load-outputs", tmp_path / "none.npz")
    (tmp_path / "junk.npz").write_bytes(b"junk")
    line = eprun_fails(4, "check", fp32, int8, "--load-outputs", tmp_path / "junk.npz")
    assert "is not a golden file" in line
    eprun_fails(3, "check", fp32, int8, "--save-outputs", tmp_path / "no" / "out.npz")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["boundaries.npz", "junk.npz"]


def test_golden_inputs_must_be_the_models_and_nothing_is_left_on_failure(
        eprun, eprun_fails, lab_pair, tmp_path, run_ep):
    fp32, int8 = lab_pair
    golden = tmp_path / "outputs.npz"
    assert run_ep("check", fp32, int8, "--save-outputs", golden).code in (0, 1)
    renamed = onnx.load(str(fp32))
    renamed.graph.input[0].name = "z"
    for node in renamed.graph.node:
        node.input[:] = ["z" if name == "x" else name for name in node.input]
    onnx.save(renamed, str(tmp_path / "renamed.onnx"))
    line = eprun_fails(4, "check", tmp_path / "renamed.onnx", tmp_path / "renamed.onnx",
                       "--load-outputs", golden)
    assert "holds inputs x" in line and "takes z" in line
    line = eprun_fails(2, "check", fp32, int8, "--load-outputs", golden, "--rows", "8")
    assert "drop --rows" in line
    (tmp_path / "bad.onnx").write_text("not a model")
    eprun_fails(4, "check", fp32, tmp_path / "bad.onnx", "--save-outputs", tmp_path / "s.npz")
    assert not (tmp_path / "s.npz").exists()


def test_a_reference_that_misses_its_provider_is_refused(eprun_fails, lab_pair, run_ep):
    fp32, int8 = lab_pair
    absent = absent_provider()
    line = eprun_fails(4, "check", fp32, int8, "--reference-providers", absent)
    assert f"asked for {absent} and got CPUExecutionProvider" in line
    allowed = run_ep("check", fp32, int8, "--reference-providers", absent,
                        "--allow-fallback")
    assert allowed.code in (0, 1) and allowed.answer["providers"]["reference"] == [CPU]


def test_local_segments_open_where_the_candidate_runs(lab_pair, monkeypatch):
    """--local cuts the int8 model into segments: each must run on the candidate's providers,
    not on the CPU by default."""
    fp32, int8 = lab_pair
    real = tool.open_exposed
    opened = []

    def recording(model, model_path, *args, **kwargs):
        opened.append((model_path, kwargs.get("on")))
        return real(model, model_path, *args, **kwargs)

    monkeypatch.setattr(tool, "open_exposed", recording)
    answer = tool.layers(str(fp32), str(int8), 1, tool.LayerOptions(local=True, providers=[CPU]))
    assert any(entry["local"] for entry in answer["layers"][1:])
    int8_sessions = [on for path, on in opened if path == str(int8)]
    assert len(int8_sessions) >= len(answer["layers"])  # the whole model, then each segment
    assert all(on is not None and on.requested == [CPU] for on in int8_sessions)


def test_a_golden_file_refuses_a_model_or_inputs_it_was_not_made_from(
        eprun_fails, lab_pair, tmp_path, run_ep):
    """The same graph with one weight changed, a seed given that did not draw the stored
    inputs, an inputs file with other values: each is a stale comparison, refused (exit 4)
    naming what differs; the same model, no seed, or the very inputs pass."""
    fp32, int8 = lab_pair
    golden = tmp_path / "golden.npz"
    saved = run_ep("check", fp32, int8, "--seed", "3", "--save-outputs", golden)
    assert saved.code in (0, 1), saved.stderr
    retrained = onnx.load(str(fp32))
    weight = retrained.graph.initializer[0]
    values = onnx.numpy_helper.to_array(weight).copy()
    values.flat[0] += 1.0
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    onnx.save(retrained, str(tmp_path / "fp32.onnx"))  # same name, same graph, other weights
    line = eprun_fails(4, "check", tmp_path / "fp32.onnx", int8, "--load-outputs", golden)
    assert "other graph or weights" in line
    line = eprun_fails(4, "check", fp32, int8, "--load-outputs", golden, "--seed", "4")
    assert "seed 4 contradicts" in line and "drawn with seed 3" in line
    x = lab_input(fp32, 3)
    np.savez(tmp_path / "same.npz", x=x)
    np.savez(tmp_path / "other.npz", x=x + 1)
    line = eprun_fails(4, "check", fp32, int8, "--load-outputs", golden,
                       "--inputs", tmp_path / "other.npz")
    assert "'x' is not the stored input" in line
    for extra in ([], ["--seed", "3"], ["--inputs", tmp_path / "same.npz"]):
        again = run_ep("check", fp32, int8, "--load-outputs", golden, *extra)
        assert again.code == saved.code, (extra, again.stderr)
        assert again.answer["outputs"] == saved.answer["outputs"]


# -- the truth about what ran where ------------------------------------------------------------

def float64_chain(path) -> None:
    """MatMul -> Add -> Relu twice in float64: OpenVINO lists itself in the session and takes
    none of its nodes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    weights = [numpy_helper.from_array(rng.standard_normal((6, 6)), f"w{k}") for k in range(2)]
    nodes, previous = [], "x"
    for k in range(2):
        nodes += [helper.make_node("MatMul", [previous, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"relu{k}")]
        previous = f"r{k}"
    graph = helper.make_graph(nodes, "f64", [helper.make_tensor_value_info(
        "x", TensorProto.DOUBLE, ["N", 6])], [helper.make_tensor_value_info(
            previous, TensorProto.DOUBLE, ["N", 6])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(path))


@built_in_openvino
def test_a_provider_that_takes_no_node_is_a_fallback(
        eprun, eprun_fails, lab_pair, tmp_path, run_ep):
    """get_providers() lists OpenVINO for a float64 model and for device_type=NOPE, yet the
    nodes ran on the CPU: measuring is refused, the gate fails, --allow-fallback measures and
    says where the nodes went."""
    _, int8 = lab_pair
    model = tmp_path / "f64.onnx"
    float64_chain(model)
    assert nodes_on(model, lambda path, options: ort.InferenceSession(
        str(path), options, providers=[OPENVINO, CPU])).get(OPENVINO, 0) == 0  # the premise
    for command in (["layers", model, model, "1"], ["settings", model, "1"]):
        line = eprun_fails(4, *command, "--providers", OPENVINO)
        assert f"{OPENVINO} took 0 of" in line and "--allow-fallback" in line, command
    nope = ["--ep-option", f"{OPENVINO}:device_type=NOPE"]
    line = eprun_fails(4, "layers", int8, int8, "1", "--providers", OPENVINO, *nope)
    assert f"{OPENVINO} took 0 of" in line
    gate = run_ep("check", int8, int8, "--providers", OPENVINO, *nope)
    assert gate.code == 1
    assert gate.answer["failures"][-1] == {"bound": "providers", "requested": [OPENVINO],
                                           "actual": [OPENVINO, CPU], "missing": [OPENVINO]}
    assert set(gate.answer["providers"]["nodes_per_provider"]) == {CPU}
    listed = run_ep("providers", int8, OPENVINO, *nope, "--fail-on-fallback")
    assert listed.code == 1 and f"{OPENVINO} took 0 of" in listed.stderr
    assert set(listed.answer["cases"][0]["nodes_per_provider"]) == {CPU}
    allowed = eprun("layers", int8, int8, "1", "--providers", OPENVINO, *nope,
                    "--allow-fallback")
    assert allowed["providers"]["missing"] == [OPENVINO] and "exposure" not in allowed


@built_in_openvino
def test_an_option_the_provider_rejects_is_said_in_its_own_words(eprun_fails, lab_pair, run_ep):
    fp32, int8 = lab_pair
    wrong = ["--ep-option", f"{OPENVINO}:precision=WRONG"]
    words = "Unsupported inference precision"
    for command in (["layers", fp32, int8, "1", "--providers", OPENVINO],
                    ["placement", int8, OPENVINO]):
        line = eprun_fails(4, *command, *wrong)
        assert words in line and "precision=WRONG" in line, command
        assert "install" not in line.split(";")[0]  # not "missing, install it"
    listed = run_ep("providers", int8, OPENVINO, *wrong)
    assert listed.code == 0 and listed.answer["cases"][0]["error"] == "RuntimeError"
    assert words in listed.stderr


@built_in_openvino
@pytest.mark.parametrize("command", ["layers", "growth", "settings", "placement", "check"])
def test_a_device_the_provider_lacks_is_said_from_any_folder(lab_pair, run_ep, tmp_path,
                                                             command):
    """The diagnosis of layers reopened the exposed copy, whose weights are named relative to
    the model's folder, from the working directory: OpenVINO's own reason was lost to
    "filesystem error: cannot get file size", and the line called an installed provider
    missing. Run from another folder, every measuring command says the provider's words and
    the option, never "missing" or "install"."""
    import os

    fp32, int8 = lab_pair
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    near = [os.path.relpath(path, elsewhere) for path in (fp32, int8)]
    argv = {"layers": ["layers", *near, "1"], "growth": ["growth", *near, "1"],
            "settings": ["settings", near[1], "1"], "placement": ["placement", near[1], OPENVINO],
            "check": ["check", *near]}[command]
    if command != "placement":
        argv += ["--providers", OPENVINO]
    result = run_ep(*argv, "--ep-option", f"{OPENVINO}:device_type=GPU", cwd=elsewhere)
    assert result.code == (1 if command == "check" else 4), result.stderr
    said = [line for line in result.stderr.splitlines() if "device_type=GPU" in line]
    assert len(said) == 1, result.stderr
    assert "Device GPU is not available" in said[0]
    assert "filesystem error" not in result.stderr
    assert " missing" not in said[0] and "install" not in said[0]


def test_a_missing_provider_names_the_package_that_has_it(eprun_fails, lab_pair):
    fp32, int8 = lab_pair
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this build has CUDA")  # (never the case on the stacks make test builds)
    line = eprun_fails(4, "layers", fp32, int8, "1", "--providers", "CUDAExecutionProvider")
    assert "it comes with the package onnxruntime-gpu" in line


def test_an_option_key_no_built_in_ep_takes_is_flagged(lab_pair, run_ep):
    fp32, int8 = lab_pair
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this build has CUDA")
    result = run_ep("layers", fp32, int8, "1", "--providers", "CUDAExecutionProvider",
                       "--allow-fallback", "--ep-option", "CUDAExecutionProvider:devce_id=0")
    assert result.code == 0, result.stderr
    assert "has no option 'devce_id' that eprun knows of; did you mean 'device_id'?" in \
        result.stderr


@built_in_openvino
def test_a_graph_input_is_a_boundary_on_openvino_on_both_sides(eprun, lab_pair, tmp_path):
    """OpenVINO refuses a name that is both a graph input and an output: the fp32 model's
    first boundary x is read from the feed. The same model on the CPU and on OpenVINO: where
    the kernels first disagree, recomputed from sessions made here."""
    fp32, _ = lab_pair
    answer = eprun("layers", fp32, fp32, "2", "--providers", OPENVINO,
                   "--reference-providers", OPENVINO)
    x = lab_input(fp32, 2)
    assert answer["layers"][0]["fp32"] == "x"
    assert answer["layers"][0]["max_abs_error"] == 0.0
    assert answer["layers"][0]["scale"] == pytest.approx(float(np.abs(x).max()), rel=1e-7)
    across = eprun("layers", fp32, fp32, "2", "--providers", OPENVINO)
    exposed, names = exposed_copy(fp32, tmp_path, "fp32")
    names = [name for name in names if name != "x"]
    cpu = models.run(exposed, x, names)
    stripped = onnx.load(str(exposed))  # x is an input: OpenVINO takes it as no output
    kept = [value for value in stripped.graph.output if value.name != "x"]
    del stripped.graph.output[:]
    stripped.graph.output.extend(kept)
    onnx.save(stripped, str(tmp_path / "no_input_output.onnx"))
    ep_values = ort.InferenceSession(str(tmp_path / "no_input_output.onnx"),
                                     providers=[OPENVINO, CPU]).run(names, {"x": x})
    errors = {"x": 0.0, **{name: float(np.abs(a.astype(np.float64) - b).max())
                           for name, a, b in zip(names, cpu, ep_values)}}
    first = next((entry for entry in across["layers"] if errors[entry["fp32"]] != 0), None)
    assert across["first_divergence"] == (None if first is None else {
        "index": first["index"], "boundary": first["fp32"],
        "max_abs_error": pytest.approx(errors[first["fp32"]], rel=1e-6)})
    grown = eprun("growth", fp32, fp32, "2", "--providers", OPENVINO)
    assert grown["first_divergence"] == across["first_divergence"]


@built_in_openvino
def test_report_measures_every_section_on_the_target(eprun, eprun_fails, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    out = tmp_path / "report"
    answer = eprun("report", fp32, int8, "--providers", OPENVINO, "--out-dir", out)
    growth = json.loads((out / "growth.json").read_text())
    settings = json.loads((out / "settings.json").read_text())
    assert growth["providers"]["actual"] == [OPENVINO, CPU]
    assert growth["providers"]["nodes_per_provider"].get(OPENVINO, 0) > 0
    assert settings["providers"]["actual"] == [OPENVINO, CPU]
    assert answer["check"]["providers"]["actual"] == [OPENVINO, CPU]
    text = (out / "ep_report.md").read_text()
    assert f"the int8 model on `{OPENVINO}`" in text
    assert f"int8 model on `{OPENVINO}`" in text.split("**Settings**")[1]
    assert "run on the CPU provider" not in text
    absent = absent_provider()
    line = eprun_fails(4, "report", fp32, int8, "--providers", absent, "--out-dir",
                       tmp_path / "absent")
    assert f"asked for {absent}" in line and not (tmp_path / "absent").exists()


@built_in_openvino
def test_settings_sweeps_a_provider_option(eprun, lab_pair):
    _, int8 = lab_pair
    answer = eprun("settings", int8, "4", "--providers", OPENVINO, "--ep-option-sweep",
                   f"{OPENVINO}:precision=FP32,ACCURACY")
    swept = answer["cases"][len(tool.SETTINGS_CASES):]
    assert [case["ep_option"]["value"] for case in swept] == ["FP32", "ACCURACY"]
    x = lab_input(int8, 4)

    def run(precision=None):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        given = [{"precision": precision}] if precision else [{}]
        return ort.InferenceSession(str(int8), options, providers=[OPENVINO],
                                    provider_options=given).run(None, {"x": x})[0]

    base = run()
    for case in swept:
        y = run(case["ep_option"]["value"])
        assert case["max_abs_diff"] == pytest.approx(
            float(np.abs(base.astype(np.float64) - y).max()), abs=1e-7)
        assert case["bitwise_equal"] is (base.tobytes() == y.tobytes())
    assert answer["all_equal"] is all(case["bitwise_equal"] for case in answer["cases"])


@built_in_openvino
def test_tables_say_reference_and_candidate_and_no_false_fallback(lab_pair, run_ep):
    fp32, int8 = lab_pair
    table = run_ep("placement", int8, OPENVINO, "--format", "table")
    assert table.code == 0 and "fell back" not in table.stdout.splitlines()[0]
    layers = run_ep("layers", fp32, fp32, "1", "--providers", OPENVINO, "--format", "table")
    header = layers.stdout.splitlines()[1]
    assert "reference (CPU) tensor" in header and "candidate (OpenVINO,CPU) tensor" in header
    assert "fp32 tensor" not in header


@built_in_openvino
def test_local_on_openvino_recomputed(eprun, lab_pair, tmp_path):
    """--local with --providers: each int8 segment, fed the fp32 tensor before it, runs on
    OpenVINO; recomputed by graph surgery (the float tensor in front of boundary k-1's
    QuantizeLinear replaced by an input fed the fp32 value) run on OpenVINO here."""
    from onnx import TensorProto, helper

    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "4", "--local", "--providers", OPENVINO)
    assert answer["local_unavailable"] == []
    x = lab_input(fp32, 4)
    names = [(entry["fp32"], entry["int8"]) for entry in answer["layers"]]
    fp32_exposed, _ = exposed_copy(fp32, tmp_path, "fp32")
    fp32_values = dict(zip([a for a, _ in names], models.run(fp32_exposed, x,
                                                              [a for a, _ in names])))
    for k in range(1, len(names)):
        model = onnx.load(str(int8))
        producers = {output: node for node in model.graph.node for output in node.output}
        quantize = producers[producers[names[k - 1][1]].input[0]]
        quantize.input[0] = "fed"
        fed = fp32_values[names[k - 1][0]]
        model.graph.input.append(helper.make_tensor_value_info(
            "fed", TensorProto.FLOAT, ["N", *fed.shape[1:]]))
        if names[k][1] not in {value.name for value in model.graph.output}:
            model.graph.output.append(helper.make_tensor_value_info(
                names[k][1], TensorProto.FLOAT, None))
        path = tmp_path / f"segment{k}.onnx"
        onnx.save(model, str(path))
        session = ort.InferenceSession(str(path), providers=[OPENVINO, CPU])
        b = session.run([names[k][1]], {"x": x, "fed": fed})[0].astype(np.float64)
        a = fp32_values[names[k][0]].astype(np.float64)
        got = answer["layers"][k]["local"]
        assert got["max_abs_error"] == pytest.approx(float(np.abs(a - b).max()), rel=1e-6,
                                                     abs=1e-12), k


def test_reduce_finds_the_one_node_openvino_computes_differently(eprun, openvino, tmp_path):
    """An elementwise chain in which only OpenVINO's Erf is off (by about 1e-5 relative: its
    approximation of erf), held to --rtol 1e-5 --atol 1e-9: reduce keeps the Erf alone, and
    the saved model, run here on its saved inputs, still fails there against the CPU."""
    from onnx import TensorProto, helper

    ops = ["Abs", "Neg", "Erf", "Neg", "Relu", "Abs"]
    nodes = [helper.make_node(op, [f"t{k - 1}" if k else "x"], [f"t{k}"], name=f"{op}{k}")
             for k, op in enumerate(ops)]
    model = models.save(models.finish(nodes, [models.float_input("x", 4)], [
        helper.make_tensor_value_info("t5", TensorProto.FLOAT, ["N", 4])]),
        tmp_path / "erf_chain.onnx")
    out = tmp_path / "erf.onnx"
    answer = eprun("reduce", model, "--output", out, "--providers", OPENVINO, "--rows", "512",
                   "--rtol", "1e-5", "--atol", "1e-9")
    assert [(node["name"], node["op_type"]) for node in answer["kept"]] == [("Erf2", "Erf")]
    assert answer["minimal"] and answer["inputs"] == ["t1"] and answer["outputs"] == ["t2"]
    assert answer["providers"]["reference"] == [CPU]
    saved = dict(np.load(tmp_path / "erf.inputs.npz"))
    on_cpu = models.run(out, saved)[0]
    on_openvino = openvino(out).run(None, saved)[0]
    violations = int(np.count_nonzero(~np.isclose(on_openvino, on_cpu, rtol=1e-5, atol=1e-9)))
    assert violations > 0
    assert answer["failure"]["violations"] == violations
    assert answer["failure"]["max_abs_diff"] == pytest.approx(
        float(np.abs(on_openvino.astype(np.float64) - on_cpu).max()), rel=1e-6)
