"""Layers 8 and 10, ``reduce``: the smallest part of a model that still fails.

The oracle is the graph itself: with a ``--check`` that fails exactly when the candidate still
computes two chosen tensors A and B, the smallest failing part is the set of nodes on the
paths from A's producer to B's producer (computed here from the node lists, by walking the
graph both ways). The written model is then run here, in a session of the test's own, on the
saved inputs, and its outputs compared with the original model's tensors of the same names.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from conftest import in_process, process_state
from onnx import TensorProto, helper, numpy_helper

# Exit 1 (fails) when the candidate model still computes both tensors named after it. The
# names its nodes write are read off the protobuf wire (ModelProto.graph is field 7,
# GraphProto.node 1, NodeProto.output 2), as onnx.load(..., load_external_data=False) gives
# them: the check runs once per candidate, and importing onnx was most of its time.
PRODUCES_BOTH = """import sys

def fields(data):
    at = 0
    while at < len(data):
        key, at = varint(data, at)
        kind = key & 7
        if kind == 0:
            value, at = varint(data, at)
        elif kind == 1 or kind == 5:
            value, at = None, at + (8 if kind == 1 else 4)
        elif kind == 2:
            size, at = varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise ValueError(f"wire type {kind}")
        yield key >> 3, value

def varint(data, at):
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at

with open(sys.argv[1], "rb") as stream:
    model = stream.read()
made = {output.decode() for number, graph in fields(model) if number == 7
        for kind, node in fields(graph) if kind == 1
        for field, output in fields(node) if field == 2}
sys.exit(1 if set(sys.argv[2:]) <= made else 0)
"""


def check_script(tmp_path: Path, body: str = PRODUCES_BOTH) -> Path:
    script = tmp_path / "check.py"
    script.write_text(body)
    return script


def check_command(script: Path, *names: str) -> str:
    return " ".join([sys.executable, str(script), "{model}", *names])


def path_nodes(model: onnx.ModelProto, a: str, b: str) -> list[int]:
    """Positions of the nodes that are descendants of A's producer and ancestors of B's
    producer (both included), reads inside subgraphs counted as the node's reads."""
    nodes = list(model.graph.node)

    def reads(node) -> set[str]:
        names = set(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= {name for inner in attribute.g.node for name in inner.input}
        return names

    producer = {name: i for i, node in enumerate(nodes) for name in node.output}
    down, frontier = {producer[a]}, [producer[a]]
    while frontier:
        written = set(nodes[frontier.pop()].output)
        for i, node in enumerate(nodes):
            if i not in down and reads(node) & written:
                down.add(i)
                frontier.append(i)
    up, frontier = {producer[b]}, [producer[b]]
    while frontier:
        for name in reads(nodes[frontier.pop()]):
            if name in producer and producer[name] not in up:
                up.add(producer[name])
                frontier.append(producer[name])
    return sorted(down & up)


def reduce_with_check(capfd, tmp_path, model_path, a, b, *extra) -> dict:
    out = tmp_path / "out" / "small.onnx"
    out.parent.mkdir(exist_ok=True)
    script = check_script(tmp_path)
    code, stdout, stderr = in_process(capfd, "reduce", model_path, "--output", out,
                                      "--check", check_command(script, a, b),
                                      "--inputs", given_inputs(model_path), *extra)
    assert code == 0, stderr
    return json.loads(stdout)


def given_inputs(model_path: Path) -> Path:
    """An .npz of every input of the model (5 rows each), saved beside it for --inputs."""
    rng = np.random.default_rng(11)
    model = onnx.load(str(model_path), load_external_data=False)
    path = model_path.with_suffix(".given.npz")
    np.savez(path, **{value.name: rng.standard_normal(
        (5, value.type.tensor_type.shape.dim[1].dim_value)).astype(np.float32)
        for value in model.graph.input})
    return path


def assert_reduced_correctly(answer: dict, model_path: Path, a: str, b: str) -> None:
    """The kept nodes are exactly the A-to-B paths', as the original has them; the written
    model is valid, typed, and computes what the original computes on the saved inputs."""
    original = onnx.load(str(model_path))
    expected = path_nodes(original, a, b)
    nodes = list(original.graph.node)
    assert [(node["name"], node["op_type"], node["outputs"]) for node in answer["kept"]] == \
        [(nodes[i].name, nodes[i].op_type, list(nodes[i].output)) for i in expected]
    assert answer["nodes"] == len(expected)
    assert answer["original_nodes"] == len(nodes)
    assert answer["minimal"] is True
    out = Path(answer["output"])
    written = onnx.load(str(out))
    onnx.checker.check_model(str(out), full_check=True)
    assert [plain(node) for node in written.graph.node] == [plain(nodes[i]) for i in expected]
    for value in (*written.graph.input, *written.graph.output):
        tensor = value.type.tensor_type
        assert tensor.elem_type and tensor.HasField("shape"), value.name
    assert [value.name for value in written.graph.input] == answer["inputs"]
    assert [value.name for value in written.graph.output] == answer["outputs"]
    # Run both here: the reduced model on its saved inputs gives the original's tensors.
    saved = dict(np.load(answer["inputs_file"]))
    assert sorted(saved) == sorted(answer["inputs"])
    feed = dict(np.load(model_path.with_suffix(".given.npz")))
    reference = dict(zip(answer["inputs"] + answer["outputs"],
                         models.run(model_path, feed, answer["inputs"] + answer["outputs"])))
    for name in answer["inputs"]:
        np.testing.assert_array_equal(saved[name], reference[name])
    got = models.run(out, saved)
    for name, value in zip(answer["outputs"], got):
        np.testing.assert_allclose(value, reference[name], rtol=1e-6, atol=1e-6)


def plain(node) -> bytes:
    """A node's bytes with its tensors' weights where they are, inline or read back from
    their file: onnx.load marks a tensor it read back as stored by default."""
    node = onnx.NodeProto.FromString(node.SerializeToString())
    pending = [node]
    while pending:
        for attribute in pending.pop().attribute:
            tensors = ([attribute.t] if attribute.HasField("t") else []) + list(attribute.tensors)
            for body in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                tensors += list(body.initializer)
                pending += list(body.node)
            for tensor in tensors:
                if tensor.data_location == TensorProto.DEFAULT:
                    tensor.ClearField("data_location")
    return node.SerializeToString()


# -- models ------------------------------------------------------------------------------------

def chain_model(ops=("Relu", "Sigmoid", "Erf", "Tanh", "Abs", "Neg", "Exp", "Sin"),
                named: bool = True) -> onnx.ModelProto:
    nodes, previous = [], "x"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [previous], [f"t{i}"],
                                      name=f"n{i}" if named else ""))
        previous = f"t{i}"
    return models.finish(nodes, [models.float_input("x", 4)],
                         [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["N", 4])])


def branching_model() -> onnx.ModelProto:
    """Two inputs, a diamond between A and B, side branches off it and into it, a second
    output; half of the nodes unnamed."""
    make = helper.make_node
    nodes = [
        make("Relu", ["x"], ["a0"], name="start"),
        make("Abs", ["u"], ["u1"]),                       # another input's branch, into B
        make("Sigmoid", ["a0"], ["A"], name="producer_a"),
        make("Tanh", ["A"], ["left"]),                    # the diamond's two sides
        make("Neg", ["u1"], ["u2"], name="side_in"),
        make("Exp", ["A"], ["dead_end"], name="side_out"),  # off A, read by nothing kept
        make("Sin", ["A"], ["right"]),
        make("Add", ["left", "right"], ["joined"], name="join"),
        make("Mul", ["joined", "u2"], ["B"], name="producer_b"),
        make("Relu", ["B"], ["y"]),
        make("Add", ["dead_end", "y"], ["z"], name="tail"),
    ]
    return models.finish(nodes, [models.float_input("x", 4), models.float_input("u", 4)],
                         [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4]),
                          helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])


def if_model() -> onnx.ModelProto:
    """An If on the path from A to B whose branches read tensors of the outer graph, one of
    them computed off the path (it becomes an input of the reduced model)."""
    make = helper.make_node
    then_branch = helper.make_graph(
        [make("Tanh", ["A"], ["t"]), make("Add", ["t", "outer"], ["then_out"])], "then", [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, ["N", 4])])
    else_branch = helper.make_graph(
        [make("Neg", ["A"], ["else_out"])], "else", [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, ["N", 4])])
    nodes = [
        make("Relu", ["x"], ["r"], name="first"),
        make("Sigmoid", ["r"], ["A"], name="producer_a"),
        make("Abs", ["x"], ["outer"], name="off_path"),
        make("If", ["flag"], ["branched"], name="choice", then_branch=then_branch,
             else_branch=else_branch),
        make("Exp", ["branched"], ["B"], name="producer_b"),
        make("Neg", ["B"], ["y"], name="last"),
    ]
    flag = numpy_helper.from_array(np.array(True), "flag")
    return models.finish(nodes, [models.float_input("x", 4)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                         [flag])


def weighted_chain(path: Path, width: int = 4) -> Path:
    """MatMul layers whose weights live in an external data file beside the model."""
    rng = np.random.default_rng(5)
    nodes, weights, previous = [], [], "x"
    for i in range(4):
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((width, width)) / width).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i}"], name=f"act{i}"))
        previous = f"h{i}"
    model = models.finish(nodes, [models.float_input("x", width)],
                          [helper.make_tensor_value_info(previous, TensorProto.FLOAT,
                                                         ["N", width])],
                          weights)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    return path


# -- the kept nodes are the paths from A to B ---------------------------------------------------

@pytest.mark.parametrize("a, b", [("t1", "t4"), ("t0", "t7"), ("t3", "t3"), ("t2", "t5")])
def test_a_chain_reduces_to_the_nodes_from_a_to_b(capfd, tmp_path, a, b):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    assert_reduced_correctly(reduce_with_check(capfd, tmp_path, model, a, b), model, a, b)


def test_unnamed_nodes_keep_their_empty_names(capfd, tmp_path):
    model = models.save(chain_model(named=False), tmp_path / "chain.onnx")
    answer = reduce_with_check(capfd, tmp_path, model, "t2", "t5")
    assert {node["name"] for node in answer["kept"]} == {""}
    assert_reduced_correctly(answer, model, "t2", "t5")


@pytest.mark.parametrize("mode", ["bisect", "linear"])
def test_a_branching_graph_keeps_only_the_paths(capfd, tmp_path, mode):
    model = models.save(branching_model(), tmp_path / "branching.onnx")
    answer = reduce_with_check(capfd, tmp_path, model, "A", "B", "--mode", mode)
    assert_reduced_correctly(answer, model, "A", "B")
    assert answer["inputs"] == ["a0", "u2"]  # cut where removed nodes wrote them
    assert answer["outputs"] == ["B"]


def test_an_if_moves_whole_and_its_outer_reads_become_inputs(capfd, tmp_path):
    model = models.save(if_model(), tmp_path / "if.onnx")
    answer = reduce_with_check(capfd, tmp_path, model, "A", "B")
    assert_reduced_correctly(answer, model, "A", "B")
    assert [node["op_type"] for node in answer["kept"]] == ["Sigmoid", "If", "Exp"]
    assert "outer" in answer["inputs"]


def test_external_weights_go_beside_the_reduced_model(capfd, tmp_path):
    """Two 512x512 weights kept (2 MiB, the original keeps them in a data file): beside the
    reduced model, in a data file named after it."""
    model = weighted_chain(tmp_path / "weighted.onnx", width=512)
    answer = reduce_with_check(capfd, tmp_path, model, "m1", "m2")
    assert_reduced_correctly(answer, model, "m1", "m2")
    data = Path(answer["external_data"])
    assert data.parent == Path(answer["output"]).parent and data.name == "small.onnx.data"
    written = onnx.load(answer["output"], load_external_data=False)
    kept_weights = {tensor.name for tensor in written.graph.initializer}
    assert kept_weights == {"w1", "w2"}
    assert all(entry.value == data.name for tensor in written.graph.initializer
               for entry in tensor.external_data if entry.key == "location")


def test_small_external_weights_come_inline(capfd, tmp_path):
    model = weighted_chain(tmp_path / "weighted.onnx")
    answer = reduce_with_check(capfd, tmp_path, model, "m1", "m2")
    assert_reduced_correctly(answer, model, "m1", "m2")
    assert "external_data" not in answer
    written = onnx.load(answer["output"], load_external_data=False)
    assert [tensor.name for tensor in written.graph.initializer] == ["w1", "w2"]
    assert not any(tensor.external_data for tensor in written.graph.initializer)


def test_a_branch_weight_in_external_data_comes_inline(capfd, tmp_path):
    """onnx.save puts an If branch's initializers in the data file too: the reduced model
    (written elsewhere) carries them inline."""
    model = if_model()
    (then_branch,) = [attribute.g for attribute in model.graph.node[3].attribute
                      if attribute.name == "then_branch"]
    then_branch.initializer.append(numpy_helper.from_array(np.full((4,), 0.5, np.float32),
                                                           "half"))
    then_branch.node[0].input[0] = "A"
    then_branch.node.insert(1, helper.make_node("Mul", ["t", "half"], ["t_half"]))
    then_branch.node[2].input[0] = "t_half"
    path = tmp_path / "if_external.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="if.bin", size_threshold=0)
    answer = reduce_with_check(capfd, tmp_path, path, "A", "B")
    assert_reduced_correctly(answer, path, "A", "B")


def test_bisection_tries_grow_with_the_log_of_the_node_count(capfd, tmp_path):
    """200 nodes, the failure between nodes 120 and 122: bisection needs about 2 log2(200)
    candidates, going node by node needs about 200."""
    model = models.save(chain_model(["Relu", "Neg"] * 100), tmp_path / "long.onnx")
    answer = reduce_with_check(capfd, tmp_path, model, "t120", "t122")
    assert_reduced_correctly(answer, model, "t120", "t122")
    assert answer["tries"] <= 2 * 8 + 4 + 2


# -- what fails ----------------------------------------------------------------------------------

def test_a_check_killed_by_a_signal_fails(capfd, tmp_path):
    script = check_script(tmp_path, PRODUCES_BOTH.replace(
        "sys.exit(1 if", "import os, signal\nif set(sys.argv[2:]) <= made: "
        "os.kill(os.getpid(), signal.SIGSEGV)\nsys.exit(1 if"))
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--check", check_command(script, "t1", "t2"))
    assert code == 0, stderr
    answer = json.loads(stdout)
    assert answer["failure"] == {"signal": "SIGSEGV"}
    assert [node["outputs"] for node in answer["kept"]] == [["t1"], ["t2"]]


def test_a_check_past_its_timeout_counts_as_the_user_says(capfd, tmp_path):
    script = check_script(tmp_path, PRODUCES_BOTH.replace(
        "sys.exit(1 if", "import time\nif set(sys.argv[2:]) <= made: time.sleep(30)\n"
        "sys.exit(1 if"))
    model = models.save(chain_model(["Relu", "Neg", "Abs"]), tmp_path / "chain.onnx")
    command = check_command(script, "t1", "t2")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--check", command, "--check-timeout", "1",
                                      "--timeout-fails")
    assert code == 0, stderr
    answer = json.loads(stdout)
    assert answer["failure"] == {"timeout": 1.0}
    assert [node["outputs"] for node in answer["kept"]] == [["t1"], ["t2"]]
    # passing on a timeout (the default), the full model does not fail
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "other.onnx",
                                      "--check", command, "--check-timeout", "1")
    assert code == 1 and stdout == ""
    assert not (tmp_path / "other.onnx").exists()


def test_numbers_off_on_one_node_reduce_to_that_node(capfd, tmp_path, monkeypatch):
    """Without --check: a stand-in provider whose Erf is off by 1e-3 (every session after the
    reference's gets each Erf's output shifted so); the reduction keeps the Erf alone and
    says how far off it is."""
    import eprun

    real, opened = eprun.open_exposed, []

    def skewed(model, model_path, *args, **kwargs):
        opened.append(model_path)
        if len(opened) > 1:  # the first session is the reference's
            for node in [node for node in model.graph.node if node.op_type == "Erf"]:
                exact = node.output[0] + "_exact"
                model.graph.node.append(helper.make_node("Add", [exact, "skew"],
                                                         [node.output[0]]))
                node.output[0] = exact
            model.graph.initializer.append(numpy_helper.from_array(np.float32(1e-3), "skew"))
            sorted_nodes = onnx.helper.make_graph(
                _topological(model.graph.node), "g", model.graph.input, model.graph.output,
                model.graph.initializer)
            model.graph.CopyFrom(sorted_nodes)
        return real(model, model_path, *args, **kwargs)

    monkeypatch.setattr(eprun, "open_exposed", skewed)
    model = models.save(chain_model(["Abs", "Neg", "Erf", "Neg", "Relu"]),
                        tmp_path / "chain.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--providers", "CPUExecutionProvider", "--rtol", "1e-5",
                                      "--atol", "1e-9")
    assert code == 0, stderr
    answer = json.loads(stdout)
    assert [node["op_type"] for node in answer["kept"]] == ["Erf"]
    assert answer["inputs"] == ["t1"] and answer["outputs"] == ["t2"]
    failure = answer["failure"]
    assert failure["output"] == "t2" and failure["violations"] == failure["elements"] == 64 * 4
    assert failure["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)


def _topological(nodes) -> list:
    """``nodes`` ordered so each comes after the writers of what it reads."""
    pending, ordered = list(nodes), []
    while pending:
        for node in pending:
            writers = {name for other in pending if other is not node for name in other.output}
            if not set(node.input) & writers:
                ordered.append(node)
                pending.remove(node)
                break
    return ordered


def test_a_model_that_does_not_fail_writes_nothing(capfd, tmp_path):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    before = sorted(os.listdir(tmp_path))
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--providers", "CPUExecutionProvider")
    assert (code, stdout) == (1, "")
    assert stderr.splitlines() == [stderr.strip()] and "does not fail" in stderr
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("argv, words", [
    (["--check", "true"], "{model}"),
    ([], "--providers"),
    (["--check", "x {model}", "--providers", "CPUExecutionProvider"], "one of them"),
    (["--check", "'unclosed {model}"], "not a command line"),
    (["--check", "x {model}", "--timeout-fails"], "--check-timeout"),
])
def test_a_wrong_request_is_one_line_and_exit_2(capfd, tmp_path, argv, words):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      *argv)
    assert (code, stdout) == (2, "")
    assert stderr.count("\n") == 1 and words in stderr


# The oldest stack's protobuf warns while it tries "my notes" as a model; a real process holds
# that back with the rest of what its libraries print; pytest shows it.
@pytest.mark.filterwarnings("ignore:Unexpected end-group tag:RuntimeWarning")
def test_a_file_eprun_did_not_write_is_not_replaced(capfd, tmp_path):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    mine = tmp_path / "small.onnx"
    mine.write_bytes(b"my notes")
    script = check_script(tmp_path)
    argv = ["reduce", model, "-o", mine, "--check", check_command(script, "t1", "t2")]
    code, stdout, stderr = in_process(capfd, *argv)
    assert (code, stdout) == (4, "") and "eprun did not write" in stderr
    assert mine.read_bytes() == b"my notes"
    assert in_process(capfd, *argv, "--force")[0] == 0
    assert in_process(capfd, *argv)[0] == 0  # eprun's own now: replaced without --force


def test_the_table_names_the_kept_nodes(capfd, tmp_path):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    script = check_script(tmp_path)
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--check", check_command(script, "t1", "t2"),
                                      "--format", "table")
    assert code == 0, stderr
    assert stdout.splitlines()[0].startswith(f"reduce: {model}: 2 of 8 nodes still fail")
    assert any(line.split()[:3] == ["n1", "Sigmoid", "t1"] for line in stdout.splitlines())


# -- models that are not plain float chains --------------------------------------------------------

def test_strings_old_irs_and_sequences_reduce_to_valid_models(capfd, tmp_path):
    """A string tensor cut (fed from the saved inputs), an IR 3 model whose initializers are
    graph inputs too, and a sequence that becomes an output: each written model passes
    onnx's full check and runs on its saved inputs."""
    make = helper.make_node
    strings = models.finish(
        [make("Relu", ["x"], ["r"], name="relu"), make("Cast", ["r"], ["s"], to=8, name="text"),
         make("Cast", ["s"], ["back"], to=1, name="number"), make("Neg", ["back"], ["y"])],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    old = helper.make_model(helper.make_graph(
        [make("MatMul", ["x", "w"], ["m0"]), make("MatMul", ["m0", "w"], ["m1"]),
         make("Relu", ["m1"], ["y"])], "old",
        [models.float_input("x", 4), helper.make_tensor_value_info("w", TensorProto.FLOAT,
                                                                   [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [weight]),
        opset_imports=[helper.make_opsetid("", 9)])
    old.ir_version = 3
    sequence = models.finish(
        [make("Relu", ["x"], ["A"]), make("SplitToSequence", ["A"], ["sq"], axis=1),
         make("SequenceAt", ["sq", "zero"], ["first"]), make("Neg", ["first"], ["y"])],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "zero")])
    for name, model, a, b in (("strings", strings, "s", "back"), ("old", old, "m0", "m1"),
                              ("sequence", sequence, "A", "sq")):
        path = models.save(model, tmp_path / f"{name}.onnx")
        answer = reduce_with_check(capfd, tmp_path, path, a, b)
        onnx.checker.check_model(answer["output"], full_check=True)
        saved = dict(np.load(answer["inputs_file"]))
        assert sorted(saved) == sorted(answer["inputs"]), name
        if name != "sequence":  # (a sequence output is no array for models.run)
            models.run(answer["output"], saved)


def test_a_numbers_failure_in_a_bool_output_counts(capfd, tmp_path, monkeypatch):
    """Outputs compare as check compares them, booleans included."""
    import eprun

    real, opened = eprun.open_exposed, []

    def flipped(model, model_path, *args, **kwargs):
        opened.append(model_path)
        if len(opened) > 1:  # every candidate's session: its Not gives the opposite
            for node in model.graph.node:
                if node.op_type == "Not":
                    node.op_type = "Identity"
        return real(model, model_path, *args, **kwargs)

    monkeypatch.setattr(eprun, "open_exposed", flipped)
    make = helper.make_node
    model = models.save(models.finish(
        [make("Abs", ["x"], ["a"]), make("Greater", ["a", "half"], ["big"]),
         make("Not", ["big"], ["small"], name="negation")],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("small", TensorProto.BOOL, ["N", 4])],
        [numpy_helper.from_array(np.float32(0.5), "half")]), tmp_path / "bool.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--providers", "CPUExecutionProvider")
    assert code == 0, stderr
    answer = json.loads(stdout)
    assert [node["name"] for node in answer["kept"]] == ["negation"]
    assert answer["failure"]["output"] == "small"


# -- what is written, and what is not --------------------------------------------------------------

def test_outputs_are_no_more_open_than_their_sources(capfd, tmp_path):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    given = given_inputs(model)
    os.chmod(given, 0o600)
    answer = reduce_with_check(capfd, tmp_path, model, "t1", "t2")
    for path in (answer["output"], answer["inputs_file"]):
        assert os.stat(path).st_mode & 0o777 == 0o600 & ~_umask(), path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_file_of_someone_else_beside_an_earlier_result_is_refused(capfd, tmp_path):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    script = check_script(tmp_path)
    argv = ["reduce", model, "-o", tmp_path / "small.onnx", "--check",
            check_command(script, "t1", "t2")]
    assert in_process(capfd, *argv)[0] == 0
    assert in_process(capfd, *argv)[0] == 0  # its own files: replaced
    notes = tmp_path / "small.inputs.npz"
    notes.write_text("my notes")
    code, stdout, stderr = in_process(capfd, *argv)
    assert (code, stdout) == (4, "") and "small.inputs.npz" in stderr
    assert notes.read_text() == "my notes"


def test_a_missing_inputs_file_beside_an_existing_output_is_a_missing_path(capfd, tmp_path):
    """The output checks compare it with every source, the --inputs file among them: one that
    is not there is no file the output could be (it used to escape as an internal error)."""
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    (tmp_path / "small.onnx").write_bytes(b"someone's")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--force", "--check", "true {model}", "--inputs",
                                      tmp_path / "missing.npz")
    assert (code, stdout) == (3, "") and "missing.npz' does not exist" in stderr
    assert (tmp_path / "small.onnx").read_bytes() == b"someone's"


def test_a_full_model_past_the_timeout_says_so(capfd, tmp_path):
    """A check that ran past --check-timeout on the full model: the line says it timed out,
    and the check's own child (a shell's sleep) is ended with it."""
    pid_file = tmp_path / "child"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\nsh -c 'echo $$ > {pid_file}; exec sleep 60' &\nsleep 30\n")
    script.chmod(0o755)
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      "--check", f"{script} {{model}}", "--check-timeout", "0.5")
    assert (code, stdout) == (1, "")
    assert "ran past --check-timeout 0.5 s" in stderr
    assert not still_running(pid_file, within=10)  # a child left alone outlives the check


def still_running(pid_file: Path, within: float) -> bool:
    """Is the process whose pid ``pid_file`` holds alive (not a zombie) after ``within``
    seconds? False as soon as it is gone, and when it never wrote the file."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pid = pid_file.read_text().strip() if pid_file.exists() else ""
        if pid.isdigit():
            try:
                if process_state(int(pid)) == "Z":
                    return False
            except FileNotFoundError:
                return False
        time.sleep(0.02)
    return pid_file.exists()


@pytest.mark.parametrize("argv, words", [
    (["--check", "x {model}", "--rtol", "0.1"], "--rtol"),
    (["--check", "x {model}", "--profile", "int8"], "--profile"),
    (["--providers", "CPUExecutionProvider", "--check-timeout", "1"], "--check-timeout"),
])
def test_an_option_that_says_nothing_with_the_others_is_refused(capfd, tmp_path, argv, words):
    model = models.save(chain_model(), tmp_path / "chain.onnx")
    code, stdout, stderr = in_process(capfd, "reduce", model, "-o", tmp_path / "small.onnx",
                                      *argv)
    assert (code, stdout) == (2, "") and words in stderr


def test_an_original_output_read_further_on_stays_an_output(capfd, tmp_path):
    model = chain_model()
    model.graph.output.append(helper.make_tensor_value_info("t1", TensorProto.FLOAT, ["N", 4]))
    path = models.save(model, tmp_path / "two_outputs.onnx")
    answer = reduce_with_check(capfd, tmp_path, path, "t0", "t3")
    assert answer["outputs"] == ["t1", "t3"]
    assert_reduced_correctly(answer, path, "t0", "t3")


def test_a_part_that_cannot_be_cut_further_is_not_called_minimal(capfd, tmp_path):
    """Without its SplitToSequence the SequenceAt would need a sequence fed, which eprun
    cannot feed: that candidate is never run, so the answer does not say minimal."""
    make = helper.make_node
    path = models.save(models.finish(
        [make("Relu", ["x"], ["A"], name="relu"),
         make("SplitToSequence", ["A"], ["sq"], axis=1, name="split"),
         make("SequenceAt", ["sq", "zero"], ["first"], name="at"),
         make("Neg", ["first"], ["y"], name="neg")],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "zero")]), tmp_path / "seq.onnx")
    out = tmp_path / "small.onnx"
    code, stdout, stderr = in_process(capfd, "reduce", path, "-o", out, "--check",
                                      check_command(check_script(tmp_path), "first", "first"))
    assert code == 0, stderr
    answer = json.loads(stdout)
    assert [node["name"] for node in answer["kept"]] == ["split", "at"]
    assert answer["minimal"] is False
    assert "cannot feed" in stderr


def test_a_constant_kept_in_external_data_comes_inline(capfd, tmp_path):
    """onnx can keep a Constant's value in the data file too: the reduced model, written
    elsewhere, carries it inline."""
    from onnx import external_data_helper

    make = helper.make_node
    model = models.finish(
        [make("Constant", [], ["c"], name="const",
              value=numpy_helper.from_array(np.full((4,), 2.0, np.float32), "c_value")),
         make("Relu", ["x"], ["A"], name="relu"), make("Mul", ["A", "c"], ["B"], name="mul"),
         make("Neg", ["B"], ["y"], name="neg")],
        [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    external_data_helper.convert_model_to_external_data(
        model, location="c.bin", size_threshold=0, convert_attribute=True)
    path = models.save(model, tmp_path / "constant.onnx")
    assert (tmp_path / "c.bin").exists()
    answer = reduce_with_check(capfd, tmp_path, path, "c", "B")
    assert_reduced_correctly(answer, path, "c", "B")


def test_a_check_command_gets_the_users_environment_not_eprun_s_own(lab_pair, tmp_path):
    """As a program eprun sets OPENBLAS_NUM_THREADS and ORT_DISABLE_TELEMETRY for itself; the
    --check command it runs for the user gets the environment the user gave (here: neither)."""
    import subprocess

    from conftest import PROGRAM

    fp32, _ = lab_pair
    seen = tmp_path / "seen.txt"
    script = tmp_path / "check.py"
    script.write_text("import os, sys\n"
                      f"open({str(seen)!r}, 'a').write(repr(sorted(name for name in os.environ"
                      " if name in ('OPENBLAS_NUM_THREADS', 'ORT_DISABLE_TELEMETRY'))) + '\\n')\n"
                      "sys.exit(1)\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ("OPENBLAS_NUM_THREADS", "ORT_DISABLE_TELEMETRY")}
    done = subprocess.run([*PROGRAM, "reduce", str(fp32), "--output",
                           str(tmp_path / "small.onnx"), "--check",
                           f"{sys.executable} {script} {{model}}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert set(seen.read_text().splitlines()) == {"[]"}
