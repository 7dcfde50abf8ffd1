"""Layer 10, ``placement``: every node's provider, and a session that fell back said so."""
from __future__ import annotations

import os
import sys

import onnx
import onnxruntime as ort


def test_placement_says_when_the_session_fell_back(run_eprun_here, lab_pair):
    _, int8 = lab_pair
    result = run_eprun_here("placement", int8, "CUDAExecutionProvider,CPUExecutionProvider")
    assert result.code == 0 and result.answer["actual"] == ["CPUExecutionProvider"]
    assert ("eprun: note: the session did not get CUDAExecutionProvider, or it took no node: its "
            "nodes ran on CPUExecutionProvider") in result.stderr
    assert "did not get" not in run_eprun_here("placement", int8, "CPUExecutionProvider").stderr


# -- placement ---------------------------------------------------------------------------------

def test_placement_reports_every_node_and_cleans_up(eprun, lab_pair, tmp_path):
    _, int8 = lab_pair
    scratch = tmp_path / "tmp"  # its own temporary folder: nothing else writes there
    scratch.mkdir()
    # what onnxruntime itself leaves there (1.32 keeps a telemetry session id) is not eprun's
    import subprocess
    subprocess.run([sys.executable, "-c", ("import onnxruntime as o; o.InferenceSession("
                    f"{str(int8)!r}, providers=['CPUExecutionProvider'])")],
                   env={**os.environ, "TMPDIR": str(scratch)}, check=True)
    runtime_own = set(os.listdir(scratch))
    answer = eprun("placement", int8, "CUDAExecutionProvider,CPUExecutionProvider",
                   env={"TMPDIR": str(scratch)})
    assert set(os.listdir(scratch)) == runtime_own
    assert answer["requested"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert answer["actual"] == ["CPUExecutionProvider"] and answer["fell_back"] is True
    has_api = hasattr(ort.InferenceSession, "get_provider_graph_assignment_info")
    assert answer["source"] == ("graph_assignment_info" if has_api else "profiling")
    assert sum(answer["counts"].values()) == len(answer["nodes"]) > 0
    assert {n["provider"] for n in answer["nodes"]} <= set(answer["actual"])
    names = {n.name for n in onnx.load(str(int8)).graph.node}
    assert any(node["name"] in names for node in answer["nodes"])
