"""eprun's answers drawn where people look: Model Explorer's node data and matplotlib plots.

These run in ``make test-viz``'s venv (requirements-viz.txt: Model Explorer, its ONNX adapter,
matplotlib, selenium) with Debian's chromium and chromium-driver. The oracle for node data is
the real adapter: each model is converted by ``model_explorer_onnx`` itself, and every key of
every file must be one of the node ids it draws, on the node it draws writing the tensor the
value belongs to, with the answer's value. The browser test opens Model Explorer's own server
in headless Chromium and reads the loaded node data's minimum and maximum off the page.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from conftest import in_process
from explorer import browser, explorer, page_text_with
from model_explorer_onnx.main import ONNXAdapter
from onnx import TensorProto, helper, numpy_helper

logging.getLogger("model_explorer_onnx").setLevel(logging.ERROR)


def drawn(model_path) -> dict:
    """``{graph id: {node id: {tensor names it writes}}}`` as the ONNX adapter draws the
    model (an input node writes its input, an op node its outputs)."""
    graphs = ONNXAdapter().convert(str(model_path), {})["graphs"]
    found = {}
    for graph in graphs:
        nodes = {}
        for node in graph.nodes:
            tags = set()
            for metadata in node.outputsMetadata:
                tags |= {attr.value for attr in metadata.attrs if attr.key == "__tensor_tag"}
            nodes[node.id] = tags
        found[graph.id] = nodes
    return found


def op_node_ids(model_path) -> list[str]:
    """The ids of the main graph's op nodes as the adapter draws them, in file order."""
    graph = ONNXAdapter().convert(str(model_path), {})["graphs"][0]
    return [node.id for node in graph.nodes
            if node.label not in ("Input", "Output", "Initializer")]


def assert_on_the_writers(path, model_path, values_by_tensor: dict) -> None:
    """Every key of the node-data file ``path`` is a node the adapter draws for
    ``model_path``, writing a tensor whose value (from the answer) is the one stored."""
    data = json.loads(Path(path).read_text())
    graphs = drawn(model_path)
    assert len(data) == 1
    ((graph_id, graph_data),) = data.items()
    nodes = graphs[graph_id]
    placed = 0
    for node_id, result in graph_data["results"].items():
        assert node_id in nodes, f"{node_id!r} is no node the adapter draws"
        written = [name for name in nodes[node_id] if name in values_by_tensor]
        assert written, f"{node_id!r} writes none of the tensors measured"
        assert result["value"] == values_by_tensor[written[0]]
        placed += 1
    return placed


def layers_values(answer: dict, role: str, key: str) -> dict:
    return {entry[role]: entry[key] for entry in answer["layers"]}


# -- models ------------------------------------------------------------------------------------

def unnamed_pair(tmp_path):
    """A float chain whose nodes have no names, and its QDQ twin (whose quantizer names the
    nodes it adds, not the ones it wraps)."""
    fp32 = models.chain(features=8, widths=(12, 10, 8), seed=6)
    for node in fp32.graph.node:
        node.name = ""
    fp32_path = models.save(fp32, tmp_path / "unnamed_fp32.onnx")
    int8_path = tmp_path / "unnamed_int8.onnx"
    models.quantize(fp32_path, int8_path, seed=7)
    return fp32_path, int8_path


def if_pair(tmp_path):
    """A MatMul chain with an If between two layers (its output a boundary)."""
    make = helper.make_node
    rng = np.random.default_rng(8)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"W{k}")
               for k in range(3)]
    then_branch = helper.make_graph([make("Relu", ["m0"], ["then_out"])], "then", [],
                                    [helper.make_tensor_value_info("then_out", 1, ["N", 8])])
    else_branch = helper.make_graph([make("Neg", ["m0"], ["else_out"])], "else", [],
                                    [helper.make_tensor_value_info("else_out", 1, ["N", 8])])
    nodes = [make("MatMul", ["x", "W0"], ["m0"], name="mm0"),
             make("If", ["flag"], ["branched"], name="choice", then_branch=then_branch,
                  else_branch=else_branch),
             make("MatMul", ["branched", "W1"], ["m1"]),
             make("Relu", ["m1"], ["r1"]),
             make("MatMul", ["r1", "W2"], ["y"], name="last")]
    model = models.finish(nodes, [models.float_input("x", 8)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                          [*weights, numpy_helper.from_array(np.array(True), "flag")])
    return models.save(model, tmp_path / "if.onnx")


# -- node data on the nodes the adapter draws ------------------------------------------------------

def test_layers_node_data_sits_on_each_boundary_writer(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    folder = tmp_path / "nd"
    code, out, err = in_process(capfd, "layers", fp32, int8, "3", "--metrics", "sqnr,mse",
                                "--node-data", folder)
    assert code == 0, err
    answer = json.loads(out)
    expected = {f"{role}.{key}.json" for role in ("fp32", "int8")
                for key in ("max_abs_error", "rel_error", "cos_min", "sqnr_db", "mse")}
    assert {Path(path).name for path in answer["node_data"]} == expected
    for path in answer["node_data"]:
        role, key = Path(path).name.split(".")[:2]
        model = fp32 if role == "fp32" else int8
        placed = assert_on_the_writers(path, model, layers_values(answer, role, key))
        assert placed == answer["layer_count"]


def test_growth_ratios_sit_where_the_jump_lands(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "3")
    layers = json.loads(out)["layers"]
    code, out, err = in_process(capfd, "growth", fp32, int8, "3", "--local", "--node-data",
                                tmp_path)
    assert code == 0, err
    answer = json.loads(out)
    for role, model in (("fp32", fp32), ("int8", int8)):
        ratios = {layers[k + 1][role]: ratio for k, ratio in enumerate(answer["ratios"])
                  if ratio is not None}
        assert assert_on_the_writers(tmp_path / f"{role}.ratio.json", model, ratios) == \
            len(ratios)
        local = {entry[role]: value for entry, value in zip(layers, answer["local_rel_error"])}
        assert_on_the_writers(tmp_path / f"{role}.local_rel_error.json", model, local)


def test_unnamed_nodes_get_the_adapters_names(capfd, tmp_path):
    fp32, int8 = unnamed_pair(tmp_path)
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--node-data", tmp_path)
    assert code == 0, err
    answer = json.loads(out)
    for role, model in (("fp32", fp32), ("int8", int8)):
        path = tmp_path / f"unnamed_{role}.rel_error.json"
        assert assert_on_the_writers(path, model, layers_values(answer, role, "rel_error")) \
            == answer["layer_count"]  # the input x on the adapter's input node
    data = json.loads((tmp_path / "unnamed_fp32.rel_error.json").read_text())
    assert any(key.startswith("node") for key in next(iter(data.values()))["results"])


def test_an_if_output_sits_on_the_adapters_phi_node(capfd, tmp_path):
    model = if_pair(tmp_path)
    code, out, err = in_process(capfd, "layers", model, model, "1", "--node-data", tmp_path,
                                "--boundaries", "m0,branched,r1,y")
    assert code == 0, err
    answer = json.loads(out)
    path = tmp_path / "if.fp32.rel_error.json"  # both sides share the file name
    assert "share a file name" in answer["node_data_note"]
    assert assert_on_the_writers(path, model, layers_values(answer, "fp32", "rel_error")) == 4
    keys = next(iter(json.loads(path.read_text()).values()))["results"]
    assert "choice_phi" in keys


def test_a_quantized_conv_net_places_every_boundary(capfd, tmp_path):
    import real_models

    fp32 = models.save(real_models.residual_cnn(4), tmp_path / "cnn_fp32.onnx")
    int8 = tmp_path / "cnn_int8.onnx"
    models.quantize(fp32, int8, seed=2)
    code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--boundary-ops", "Conv",
                                "--rows", "2", "--node-data", tmp_path)
    assert code == 0, err
    answer = json.loads(out)
    for role, model in (("fp32", fp32), ("int8", int8)):
        values = layers_values(answer, role, "rel_error")
        graph_inputs = {value.name for value in onnx.load(str(model)).graph.input}
        placed = assert_on_the_writers(tmp_path / f"cnn_{role}.rel_error.json", model, values)
        assert placed == len(values)
        assert graph_inputs  # the input boundary sits on the adapter's input node too


def test_placement_partition_weights_and_sensitivity(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    graph = onnx.load(str(int8)).graph
    code, out, err = in_process(capfd, "placement", int8, "CPUExecutionProvider", "--node-data",
                                tmp_path / "p")
    assert code == 0, err
    answer = json.loads(out)
    by_name = {node["name"]: node["provider"].replace("ExecutionProvider", "")
               for node in answer["nodes"]}
    data = next(iter(json.loads((tmp_path / "p" / "int8.provider.json").read_text()).values()))
    ids = set(drawn(int8)[graph.name])
    assert set(data["results"]) <= ids
    for node_id, result in data["results"].items():
        assert result["value"] == by_name[node_id]
    colours = {result["value"]: result["bgColor"] for result in data["results"].values()}
    assert len(set(colours.values())) == len(colours)

    code, out, err = in_process(capfd, "partition", int8, "MatMul,Add", "--node-data",
                                tmp_path / "q")
    answer = json.loads(out)
    owners = [f"{'EP' if part['owner'] == 'ep' else 'CPU'} {k}"
              for k, part in enumerate(answer["partitions"]) for _ in range(part["size"])]
    data = next(iter(json.loads((tmp_path / "q" / "int8.partition.json").read_text())
                     .values()))
    assert [data["results"][node_id]["value"] for node_id in op_node_ids(int8)] == owners
    assert set(data["results"]) <= ids

    code, out, err = in_process(capfd, "sensitivity", fp32, int8, "1", "--max-units", "2",
                                "--node-data", tmp_path / "s")
    assert code == 0, err
    answer = json.loads(out)
    gains = {unit["name"]: unit["gain_db"] for unit in answer["units"]}
    for role, model in (("fp32", fp32), ("int8", int8)):
        data = next(iter(json.loads((tmp_path / "s" / f"{role}.gain_db.json").read_text())
                         .values()))
        assert set(data["results"]) <= set(op_node_ids(model))
        assert sorted(result["value"] for result in data["results"].values()) == \
            sorted(gains.values())


# -- plots -----------------------------------------------------------------------------------------

def test_a_metric_added_through_the_api_is_plotted(capfd, monkeypatch, lab_pair, tmp_path):
    """METRICS["mae"] = Metric(...) and nothing else: --save-plots draws it (it once failed
    with KeyError: 'mae'), the same bytes twice."""
    from test_cmd_layers import mean_abs_error

    import eprun as tool

    fp32, int8 = lab_pair
    monkeypatch.setitem(tool.METRICS, "mae", tool.Metric(field="mae", compute=mean_abs_error))
    drawn = []
    for run in ("one", "two"):
        code, out, err = in_process(capfd, "layers", fp32, int8, "1", "--metrics", "mae",
                                    "--save-plots", tmp_path / run)
        assert code == 0, err
        (path,) = json.loads(out)["plots"]
        assert Path(path).name == "int8.layers.mae.png"
        drawn.append(Path(path).read_bytes())
    assert drawn[0] == drawn[1] and drawn[0].startswith(b"\x89PNG")


def test_check_draws_each_outputs_error_and_heatmap_the_same_twice(capfd, lab_pair, tmp_path):
    """Polygraphy's error-metrics plot and its heatmap, per output, of the worst iteration:
    the same bytes on a rerun, a picture that is not blank."""
    import matplotlib.image

    fp32, int8 = lab_pair
    drawn = []
    for run in ("one", "two"):
        code, out, err = in_process(capfd, "check", fp32, int8, "--save-plots", tmp_path / run)
        assert code in (0, 1), err
        answer = json.loads(out)
        assert [Path(path).name for path in answer["plots"]] == ["int8.check.y.error.png",
                                                                 "int8.check.y.heatmap.png"]
        drawn.append([Path(path).read_bytes() for path in answer["plots"]])
    assert drawn[0] == drawn[1]
    for path in answer["plots"]:
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 200 and float(np.std(image[..., :3])) > 0.05


@pytest.mark.parametrize("argv, names", [
    (["layers", "{fp32}", "{int8}", "1", "--metrics", "sqnr"], ["int8.layers.sqnr_db"]),
    (["growth", "{fp32}", "{int8}", "1", "--local"], ["int8.growth.rel_error"]),
    (["settings", "{int8}", "1"], ["int8.settings.max_abs_diff"]),
])
@pytest.mark.parametrize("form", ["png", "svg"])
def test_plots_are_drawn_and_the_same_bytes_twice(capfd, lab_pair, tmp_path, argv, names,
                                                  form):
    import matplotlib.image

    fp32, int8 = lab_pair
    argv = [word.format(fp32=fp32, int8=int8) for word in argv]
    written = []
    for run in ("one", "two"):
        code, out, err = in_process(capfd, *argv, "--save-plots", tmp_path / run,
                                    "--plot-format", form)
        assert code == 0, err
        answer = json.loads(out)
        assert [Path(path).name for path in answer["plots"]] == [f"{name}.{form}"
                                                                 for name in names]
        written.append([Path(path).read_bytes() for path in answer["plots"]])
    assert written[0] == written[1]
    if form == "png":
        image = matplotlib.image.imread(answer["plots"][0])
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert float(np.std(image[..., :3])) > 0.05  # not blank
    else:
        assert written[0][0].startswith(b"<?xml") and b"<svg" in written[0][0]


def test_report_links_each_figure_under_its_section(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    folder = tmp_path / "out"
    shutil.copy(fp32, tmp_path / "fp32.onnx")
    shutil.copy(int8, tmp_path / "int8.onnx")
    code, out, err = in_process(capfd, "report", tmp_path / "fp32.onnx", tmp_path / "int8.onnx",
                                "--out-dir", folder, "--save-plots", folder / "figures")
    assert code == 0, err
    answer = json.loads(out)
    text = (folder / "ep_report.md").read_text()
    for path in answer["plots"]:
        link = f"]({os.path.relpath(path, folder)})"
        assert link in text
    growth_at = text.index("## 층을 거듭하며 자란 오차")
    machine_at = text.index("## 이 기계에서만 참인 것")
    assert growth_at < text.index("int8.report.rel_error.png") < machine_at
    assert machine_at < text.index("int8.report.max_abs_diff.png")


# -- Model Explorer itself, in a browser -----------------------------------------------------------

def test_model_explorer_loads_the_node_data_with_eprun_s_range(capfd, lab_pair, tmp_path):
    fp32, int8 = lab_pair
    code, out, err = in_process(capfd, "layers", fp32, int8, "5", "--node-data", tmp_path)
    assert code == 0, err
    answer = json.loads(out)
    errors = [entry["rel_error"] for entry in answer["layers"]]
    node_data = tmp_path / "int8.rel_error.json"
    with explorer(int8, node_data) as url, browser() as driver:
        driver.get(url)
        lines = page_text_with(driver, "\nMin ").splitlines()
    assert "Aggregated stats" in lines and "rel_error" in lines
    shown = {line.split()[0]: float(line.split()[1]) for line in lines
             if line.split() and line.split()[0] in ("Min", "Max") and len(line.split()) == 2}
    assert shown["Min"] == pytest.approx(min(errors), rel=1e-12)
    assert shown["Max"] == pytest.approx(max(errors), rel=1e-12)


def boundary_figures(folder, int8, layers: dict, growth: dict, metrics) -> list:
    """The figures ``plot_boundaries`` draws of ``layers`` for each of ``metrics``, kept as
    matplotlib figures instead of written."""
    import eprun

    kept = []

    class Keeping(eprun.PlotWriter):
        def add(self, what, figure):
            kept.append(figure)
            return what

    writer = Keeping(str(folder), str(int8), "layers")
    for metric in metrics:
        eprun.plot_boundaries(writer, layers, metric, growth)
    return kept


def test_the_jump_is_marked_where_growth_says_it_lands(capfd, lab_pair, tmp_path):
    """The figure's dotted line stands at growth's max_ratio index (where the jump lands)."""
    fp32, int8 = lab_pair
    layers = json.loads(in_process(capfd, "layers", fp32, int8, "1")[1])
    growth = json.loads(in_process(capfd, "growth", fp32, int8, "1")[1])
    (figure,) = boundary_figures(tmp_path, int8, layers, growth, ["rel_error"])
    (axes,) = figure.axes
    vertical = [line for line in axes.lines if line.get_label().startswith("largest jump")]
    assert list(vertical[0].get_xdata()) == [growth["max_ratio"]["index"]] * 2
    ratio = layers["layers"][growth["max_ratio"]["index"]]["rel_error"] / \
        layers["layers"][growth["max_ratio"]["index"] - 1]["rel_error"]
    assert ratio == pytest.approx(growth["max_ratio"]["ratio"], rel=1e-12)


def test_another_metric_stacks_its_own_local_part_and_names_whose_jump_is_marked(
        capfd, lab_pair, tmp_path):
    """--metrics mse --local: the bars are each boundary's local mse (its segment's, from the
    answer) and the rest of its mse; the dotted line is the relative error's jump, and says
    so. An SQNR is drawn as a line: dB do not stack."""
    fp32, int8 = lab_pair
    layers = json.loads(in_process(capfd, "layers", fp32, int8, "1", "--metrics", "mse,sqnr",
                                   "--local")[1])
    growth = json.loads(in_process(capfd, "growth", fp32, int8, "1", "--local")[1])
    (mse_axes,), (sqnr_axes,) = (figure.axes for figure in boundary_figures(
        tmp_path, int8, layers, growth, ["mse", "sqnr_db"]))
    own, inherited = (container for container in mse_axes.containers)
    local = [entry["local"]["mse"] for entry in layers["layers"]]
    total = [entry["mse"] for entry in layers["layers"]]
    assert [bar.get_height() for bar in own] == pytest.approx(local, rel=1e-12)
    assert [bar.get_height() for bar in inherited] == pytest.approx(
        [max(0.0, whole - part) for whole, part in zip(total, local)], rel=1e-12, abs=1e-15)
    labels = [line.get_label() for line in mse_axes.lines]
    assert any(label.startswith("largest rel_error jump: x") for label in labels), labels
    assert not sqnr_axes.containers and any(line.get_label() == "sqnr_db"
                                            for line in sqnr_axes.lines)


def test_a_report_that_fails_keeps_the_last_ones_figures(capfd, lab_pair, tmp_path,
                                                         monkeypatch):
    import eprun

    fp32, int8 = lab_pair
    shutil.copy(fp32, tmp_path / "fp32.onnx")
    shutil.copy(int8, tmp_path / "int8.onnx")
    argv = ["report", tmp_path / "fp32.onnx", tmp_path / "int8.onnx", "--out-dir",
            tmp_path / "out", "--save-plots", tmp_path / "out" / "figures"]
    assert in_process(capfd, *argv)[0] == 0
    before = {path.name: path.read_bytes() for path in (tmp_path / "out" / "figures").iterdir()}

    def fails(*args, **kwargs):
        raise eprun.EprunError("the disk is full")

    monkeypatch.setattr(eprun, "_write_deliverables", fails)
    code, out, err = in_process(capfd, *argv, "--seed", "9", "--force")
    assert (code, out) == (4, "") and "the disk is full" in err
    after = {path.name: path.read_bytes() for path in (tmp_path / "out" / "figures").iterdir()}
    assert after == before
    code, out, err = in_process(capfd, *argv[:-1], tmp_path / "new" / "figures", "--force")
    assert code == 4 and not (tmp_path / "new").exists()
