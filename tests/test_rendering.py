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


def test_weights_colours_run_from_the_worst_sqnr_in_red(capfd, named_pair, tmp_path):
    fp32, int8 = named_pair
    code, _, err = in_process(capfd, "weights", fp32, int8, "--node-data", tmp_path)
    assert code == 0, err
    graph = results(tmp_path / "b.weight_sqnr_db.json")
    worst = min(graph["results"].values(), key=lambda result: result["value"])
    best = max(graph["results"].values(), key=lambda result: result["value"])
    assert (worst["bgColor"], best["bgColor"]) == ("#d73027", "#1a9850")


def test_two_values_on_one_node_show_the_worst_and_say_so(capfd, tmp_path):
    """A Split writes both boundaries asked for: its node shows the larger error."""
    from onnx import TensorProto, helper

    make = helper.make_node
    model = models.save(models.finish(
        [make("Relu", ["x"], ["r"], name="relu"),
         make("Split", ["r"], ["a", "b"], axis=1, name="split"),
         make("Add", ["a", "b"], ["y"], name="add")],
        [models.float_input("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        name="g"), tmp_path / "split.onnx")
    model.rename(tmp_path / "one.onnx")
    changed = __import__("onnx").load(str(tmp_path / "one.onnx"))
    changed.graph.node[0].op_type = "Abs"  # negative inputs differ: a and b by other amounts
    other = models.save(changed, tmp_path / "two.onnx")
    code, out, err = in_process(capfd, "layers", tmp_path / "one.onnx", other, "1",
                                "--boundaries", "a,b", "--node-data", tmp_path / "nd")
    assert code == 0, err
    answer = json.loads(out)
    graph = results(tmp_path / "nd" / "one.max_abs_error.json")
    errors = [entry["max_abs_error"] for entry in answer["layers"][:2]]
    assert errors[0] != errors[1]
    assert graph["results"]["split"]["value"] == max(errors)
    assert "each such node shows the worst" in err


def test_a_non_finite_value_is_shown_not_dropped(capfd, tmp_path):
    from onnx import TensorProto, helper

    make = helper.make_node
    path = models.save(models.finish(
        [make("Neg", ["x"], ["n"], name="negate"), make("Log", ["n"], ["l"], name="log"),
         make("MatMul", ["l", "w"], ["y"], name="mm")],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [__import__("onnx").numpy_helper.from_array(
            __import__("numpy").eye(4, dtype="float32"), "w")]), tmp_path / "nan.onnx")
    code, out, err = in_process(capfd, "layers", path, path, "1", "--boundaries", "n,l",
                                "--node-data", tmp_path / "nd")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["layers"][1]["rel_error"] is None  # NaN: null in the answer
    graph = results(tmp_path / "nd" / "nan.fp32.rel_error.json")
    assert graph["results"]["log"] == {"value": "non-finite", "bgColor": "#7f0000"}
    assert "NaN or infinity" in err


def test_the_table_names_what_was_written(capfd, named_pair, tmp_path):
    fp32, int8 = named_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--node-data", tmp_path,
                                "--format", "table")
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"node data: {tmp_path / 'a.max_abs_error.json'}")


@pytest.mark.parametrize("argv, words", [
    (["--node-data", ""], "--node-data needs a folder"),
    (["--save-plots", ""], "--save-plots needs a folder"),
    (["--plot-format", "svg"], "give --save-plots DIR"),
])
def test_view_options_that_say_nothing_are_refused(capfd, named_pair, argv, words):
    fp32, int8 = named_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", *argv)
    assert (code, out) == (2, "") and words in err


def test_a_matplotlib_that_cannot_be_imported_is_a_usage_error(capfd, named_pair, tmp_path,
                                                              monkeypatch):
    broken = tmp_path / "site" / "matplotlib"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('built for another numpy')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [name for name in __import__("sys").modules if name.startswith("matplotlib")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    fp32, int8 = named_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--save-plots",
                                tmp_path / "plots", "--node-data", tmp_path / "nd")
    assert (code, out) == (2, "") and "cannot import (ImportError: built for another" in err
    assert not (tmp_path / "plots").exists() and not (tmp_path / "nd").exists()
