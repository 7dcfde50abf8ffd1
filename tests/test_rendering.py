"""Layer 6, rendering: the tables of every command, colour and words, EPRUN_FORMAT, and
``--node-data`` and ``--save-plots`` on every stack: what the files hold, where they go, and
what happens without matplotlib. (Against Model Explorer itself, its adapter and a browser:
tests/test_viz.py, in make test-viz.)"""
from __future__ import annotations

import json
import re

import models
import pytest
from conftest import in_process
from test_contract import default_argv

import eprun as tool


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


@pytest.mark.parametrize("name", list(tool.COMMANDS))
def test_every_command_prints_a_table_when_asked(capfd, lab_pair, tmp_path, name):
    """--format table on every command: text for a person, its first line naming the command,
    never a JSON line."""
    argv = [str(word) for word in default_argv(name, *lab_pair, tmp_path)]
    assert tool.main([*argv, "--format", "table"]) in (0, 1)  # check's verdict may fail
    out = capfd.readouterr().out
    assert out.startswith(f"{name}:") or (name == "inspect" and out.startswith("model ")), out
    assert not any(line.startswith("{") for line in out.splitlines())


def dashed_rows(text: str) -> list[list[str]]:
    """The rows under a table's dashed rule, split on runs of two or more spaces."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if set(line) <= {"-", " "} and line) + 1
    rows = []
    for line in lines[start:]:
        if not line[:1].isspace() and not line[:1].isdigit():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


@pytest.mark.parametrize("metric, key, sense", [("sqnr", "sqnr_db", min), ("mse", "mse", max),
                                                (None, "rel_error", max)])
def test_the_layers_table_marks_the_worst_by_the_metric_asked_for(capfd, lab_pair, metric, key,
                                                                  sense):
    argv = ["layers", *map(str, lab_pair), "3", *(["--metrics", metric] if metric else [])]
    assert tool.main(argv) == 0
    entries = json.loads(capfd.readouterr().out)["layers"]
    assert tool.main([*argv, "--format", "table"]) == 0
    rows = dashed_rows(capfd.readouterr().out)
    marked = [int(row[0]) for row in rows if row[-1] == "<- worst"]
    assert marked == [sense(entries, key=lambda entry: entry[key])["index"]]


def test_the_growth_table_shows_the_local_column(capfd, lab_pair):
    argv = ["growth", *map(str, lab_pair), "3", "--local"]
    assert tool.main(argv) == 0
    local = json.loads(capfd.readouterr().out)["local_rel_error"]
    assert tool.main([*argv, "--format", "table"]) == 0
    text = capfd.readouterr().out
    assert "local rel error" in text.splitlines()[1]
    shown = [float(row[3]) for row in dashed_rows(text)]
    assert shown == pytest.approx(local, rel=1e-3)


def table_rows(text: str) -> list[list[str]]:
    """The data rows of a --format table answer: the lines after the dashed one, split on two
    spaces or more, up to the first line that is not a row."""
    import re

    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if set(line) <= {"-", " "} and line)
    rows = []
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 3:
            break
        rows.append(cells)
    return rows


def test_a_table_has_a_row_per_boundary_and_marks_the_worst(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    answer = run_eprun_here("layers", fp32, int8, "3").answer
    table = run_eprun_here("layers", fp32, int8, "3", "--format", "table")
    assert table.code == 0 and "\033" not in table.stdout  # no colour off a terminal
    rows = table_rows(table.stdout)
    assert [row[1] for row in rows] == [entry["fp32"] for entry in answer["layers"]]
    worst = max(range(len(answer["layers"])), key=lambda k: answer["layers"][k]["rel_error"])
    assert [k for k, row in enumerate(rows) if row[-1] == "<- worst"] == [worst]
    assert float(rows[worst][5]) == pytest.approx(answer["layers"][worst]["rel_error"],
                                                  rel=1e-3)


def test_table_formats_for_every_command_that_has_one(run_eprun_here, lab_pair):
    fp32, int8 = lab_pair
    growth = run_eprun_here("growth", fp32, int8, "3").answer
    table = run_eprun_here("growth", fp32, int8, "3", "--format", "table").stdout
    said = "shrank" if growth["total_growth"] < 1 else "grew"
    assert f"the error {said}" in table
    settings = run_eprun_here("settings", int8, "3", "--format", "table").stdout
    assert len(table_rows(settings)) == 4  # the baseline and the three cases
    checked = run_eprun_here("check", fp32, int8, "--profile", "int8", "--format", "table")
    assert checked.code == 1 and "failed:" in checked.stdout


def test_colour_and_the_shrinking_error_in_words():
    import eprun as tool

    lines = tool.aligned(["a", "b"], [[1, 0.5], [2, 0.25]], worst=0, colour=True)
    assert lines[2].startswith("\033[1;31m") and lines[2].endswith("<- worst\033[0m")
    assert "\033" not in lines[3]
    shrank = {"seed": 1, "layer_count": 2, "rel_error": [0.2, 0.166], "ratios": [0.83],
              "monotone": False, "total_growth": 0.83, "max_ratio": {"index": 1, "ratio": 0.83}}
    assert "total growth 0.83: the error shrank" in tool.render_table("growth", shrank)
    for total, said in ((1.0, "stayed the same"), (1.2, "grew")):
        text = tool.render_table("growth", {**shrank, "total_growth": total})
        assert f"total growth {total:g}: the error {said}" in text


def test_a_null_total_growth_says_why(tmp_path):
    import eprun as tool

    lost = {"seed": 1, "layer_count": 3, "rel_error": [0.1, float("nan"), 0.2],
            "ratios": [float("nan"), float("nan")], "monotone": False, "total_growth": None,
            "max_ratio": None}
    assert "the relative error at boundary 1 is NaN or infinite" in tool.render_table(
        "growth", lost)
    zero = {**lost, "rel_error": [0.0, 0.1, 0.2], "ratios": [None, 2.0]}
    assert "the first relative error is 0" in tool.render_table("growth", zero)
    layered = {"seed": 1, "rows": 64, "layer_count": 2, "layers": [
        {"index": 0, "fp32": "x", "int8": "x", "max_abs_error": 0.5, "scale": 1.0,
         "rel_error": 0.5, "cos_min": 1.0},
        {"index": 1, "fp32": "y", "int8": "y", "max_abs_error": float("nan"), "scale": 1.0,
         "rel_error": float("nan"), "cos_min": float("nan"), "nonfinite": {"fp32": 0,
                                                                           "int8": 3}}]}
    text = tool.render_table("layers", layered)
    assert [row[0] for row in table_rows(text) if row[-1] == "<- worst"] == ["1"]
    assert "3 in the int8 one" in text


def test_eprun_format_is_a_persons_own_default(run_eprun_here, lab_pair):
    """JSON stays the default wherever stdout goes; EPRUN_FORMAT=table makes the table one's
    own default, --format overrides it, and a value eprun does not print is one warning and
    JSON. Commands without a table ignore it."""
    import json

    fp32, int8 = lab_pair
    plain = run_eprun_here("growth", fp32, int8, "1")
    table = run_eprun_here("growth", fp32, int8, "1", env={"EPRUN_FORMAT": "table"})
    layers = json.loads(plain.stdout)["layer_count"]
    assert table.code == 0 and table.stdout.startswith(f"growth: seed 1, {layers} boundaries\n")
    assert table.stdout == run_eprun_here("growth", fp32, int8, "1", "--format", "table").stdout
    forced = run_eprun_here("growth", fp32, int8, "1", "--format", "json",
                       env={"EPRUN_FORMAT": "table"})
    assert json.loads(forced.stdout) == json.loads(plain.stdout)
    wrong = run_eprun_here("growth", fp32, int8, "1", env={"EPRUN_FORMAT": "yaml"})
    assert wrong.code == 0 and json.loads(wrong.stdout) == json.loads(plain.stdout)
    assert ("eprun: warning: EPRUN_FORMAT='yaml' is not a format eprun prints (json or table); "
            "printing JSON") in wrong.stderr.splitlines()
    partition = run_eprun_here("partition", fp32, "MatMul", env={"EPRUN_FORMAT": "yaml"})
    assert partition.code == 0 and json.loads(partition.stdout)["model"] == str(fp32)


def test_placement_and_inputs_read_without_python(run_eprun_here, lab_pair):
    """The README reads answers with --format table, never python -c: placement's table has
    the providers asked for and got and the nodes per provider of the JSON answer; layers'
    names what each input was fed."""
    import json

    fp32, int8 = lab_pair
    asked = "CUDAExecutionProvider,CPUExecutionProvider"
    answer = json.loads(run_eprun_here("placement", int8, asked).stdout)
    table = run_eprun_here("placement", int8, asked, "--format", "table")
    assert table.code == 0
    lines = table.stdout.splitlines()
    assert lines[0] == (f"placement: {int8}, asked {asked}, got "
                        f"{','.join(answer['actual'])} (fell back: CUDAExecutionProvider ran "
                        f"no node); from {answer['source']}")
    rows = {line.split()[0]: int(line.split()[1]) for line in lines[3:] if line.strip()}
    assert rows == answer["counts"]
    argv = ("layers", fp32, int8, "1", "--input-range", "x:-1,1", "--rows", "8")
    (fed,) = json.loads(run_eprun_here(*argv).stdout)["inputs"]
    layers = run_eprun_here(*argv, "--format", "table")
    assert fed["shape"][0] == 8 and fed["source"] == "uniform[-1, 1)"
    assert layers.stdout.splitlines()[1] == f"input x: float32 {fed['shape']} from {fed['source']}"
