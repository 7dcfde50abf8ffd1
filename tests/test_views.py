"""``--node-data`` and ``--save-plots`` on every stack: what the files hold, where they go,
and what happens without matplotlib. (Against Model Explorer itself, its adapter and a
browser: tests/test_viz.py, in make test-viz.)"""
from __future__ import annotations

import json
import re

import models
import pytest
from conftest import in_process


@pytest.fixture
def named_pair(tmp_path):
    """The lab-shaped chain with every node named, and its QDQ twin."""
    fp32 = models.chain(features=8, widths=(12, 10, 8), seed=3)
    for index, node in enumerate(fp32.graph.node):
        node.name = f"{node.op_type.lower()}_{index}"
    fp32_path = models.save(fp32, tmp_path / "a.onnx")
    int8_path = tmp_path / "b.onnx"
    models.quantize(fp32_path, int8_path, seed=4)
    return fp32_path, int8_path


def results(path) -> dict:
    (graph,) = json.loads(path.read_text()).values()
    return graph


def test_layers_node_data_holds_the_answer_on_each_writer(capfd, named_pair, tmp_path):
    """Each boundary's value sits under the name of the node that writes it (the graph input
    under the input node Model Explorer draws for it), coloured green to red."""
    import onnx

    fp32, int8 = named_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--node-data",
                                tmp_path / "views" / "new")
    assert code == 0, err
    answer = json.loads(out)
    writer = {name: node.name for node in onnx.load(str(fp32)).graph.node
              for name in node.output}
    graph = results(tmp_path / "views" / "new" / "a.rel_error.json")
    expected = {writer.get(entry["fp32"], f"[value] {entry['fp32']}"): entry["rel_error"]
                for entry in answer["layers"]}
    assert {key: result["value"] for key, result in graph["results"].items()} == expected
    assert graph["name"] == "rel_error"
    assert [stop["stop"] for stop in graph["gradient"]] == [0, 0.5, 1]
    colours = {result["value"]: result["bgColor"] for result in graph["results"].values()}
    assert all(re.fullmatch(r"#[0-9a-f]{6}", colour) for colour in colours.values())
    assert colours[max(colours)] == "#d73027" and colours[min(colours)] == "#1a9850"
    cosine = results(tmp_path / "views" / "new" / "a.cos_min.json")["results"].values()
    best = max(cosine, key=lambda result: result["value"])
    assert best["bgColor"] == "#1a9850"  # the larger the cosine, the better
    assert sorted(answer["node_data"]) == sorted(
        str(tmp_path / "views" / "new" / f"{stem}.{key}.json") for stem in ("a", "b")
        for key in ("max_abs_error", "rel_error", "cos_min"))


def test_without_the_flag_the_answer_has_no_view_fields(capfd, named_pair):
    fp32, int8 = named_pair
    code, out, _ = in_process(capfd, "layers", fp32, int8, "1")
    assert code == 0 and "node_data" not in json.loads(out) and "plots" not in json.loads(out)


def test_partition_node_data_names_each_owner_and_partition(capfd, named_pair, tmp_path):
    import onnx

    fp32, _ = named_pair
    code, out, err = in_process(capfd, "partition", fp32, "MatMul", "--node-data", tmp_path)
    assert code == 0, err
    answer = json.loads(out)
    graph = results(tmp_path / "a.partition.json")
    owners = [f"{'EP' if part['owner'] == 'ep' else 'CPU'} {k}"
              for k, part in enumerate(answer["partitions"]) for _ in range(part["size"])]
    names = [node.name for node in onnx.load(str(fp32)).graph.node]
    assert [graph["results"][name]["value"] for name in names] == owners
    colours = {result["value"].split()[0]: result["bgColor"]
               for result in graph["results"].values()}
    assert len(set(colours.values())) == 2  # one colour per owner, whatever the index


def test_plots_without_matplotlib_are_a_usage_error_before_measuring(capfd, named_pair,
                                                                      tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "matplotlib" else real(name, *args))
    fp32, int8 = named_pair
    for argv in (["layers", fp32, int8, "1"], ["settings", int8, "1"],
                 ["report", fp32, int8, "--out-dir", tmp_path / "report"]):
        code, out, err = in_process(capfd, *argv, "--save-plots", tmp_path / "plots")
        assert (code, out) == (2, "")
        assert err.strip().splitlines() == [
            "eprun: error: --save-plots needs matplotlib, which " + __import__("sys").executable
            + " does not have: pip install 'eprun[plots]' (or pip install matplotlib)"]
    assert not (tmp_path / "plots").exists() and not (tmp_path / "report").exists()


def test_a_node_data_folder_that_is_a_file_is_refused_first(capfd, named_pair, tmp_path):
    fp32, int8 = named_pair
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--node-data", blocker)
    assert (code, out) == (4, "") and "--node-data" in err and "not a folder" in err
