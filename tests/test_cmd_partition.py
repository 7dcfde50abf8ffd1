"""Layer 10, ``partition``: hand-made graphs, and ``--mode ort`` against onnxruntime's own
partitioner, subgraphs included."""
from __future__ import annotations

import inspect

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

# -- partition ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ops, supported, partitions", [
    (["MatMul", "Add", "Relu", "MatMul", "Add"], "MatMul",
     [("ep", ["MatMul"]), ("cpu", ["Add", "Relu"]), ("ep", ["MatMul"]), ("cpu", ["Add"])]),
    (["MatMul", "Add", "Relu", "MatMul", "Add"], "MatMul, Add ,Relu",
     [("ep", ["MatMul", "Add", "Relu", "MatMul", "Add"])]),
    (["MatMul", "Add", "Relu"], "", [("cpu", ["MatMul", "Add", "Relu"])]),
    (["MatMul", "Add", "Relu"], ",,", [("cpu", ["MatMul", "Add", "Relu"])]),
    (["Gemm", "Softmax", "Gemm"], "Gemm,NoSuchOp", [("ep", ["Gemm"]), ("cpu", ["Softmax"]),
                                                    ("ep", ["Gemm"])]),
    (["Relu", "Relu", "MatMul"], "matmul", [("cpu", ["Relu", "Relu", "MatMul"])]),
    ([], "MatMul", []),
])
def test_partition_hand_made_graphs(eprun, tmp_path, ops, supported, partitions):
    path = models.save(models.ops_graph(ops), tmp_path / "g.onnx")
    answer = eprun("partition", path, supported)
    expected_parts = [{"owner": owner, "nodes": nodes, "size": len(nodes)}
                      for owner, nodes in partitions]
    assert answer == {
        "model": str(path),
        "supported": [item.strip() for item in supported.split(",") if item.strip()],
        "nodes": len(ops),
        "claimed": sum(len(nodes) for owner, nodes in partitions if owner == "ep"),
        "partition_count": len(partitions),
        "handoffs": max(len(partitions) - 1, 0),
        "partitions": expected_parts,
    }

# -- partition --mode ort ----------------------------------------------------------------------

def dag(seed: int, size: int = 14) -> onnx.ModelProto:
    """A random DAG of unary and binary ops over 4-wide tensors, in a random topological order."""
    rng = np.random.default_rng(seed)
    tensors, specs = ["x"], []
    for k in range(size):
        op = str(rng.choice(["MatMul", "Add", "Relu", "Mul", "Sigmoid"]))
        arity = 1 if op in ("Relu", "Sigmoid") else 2
        inputs = [tensors[int(i)] for i in rng.integers(0, len(tensors), size=arity)]
        specs.append((op, inputs, f"t{k}"))
        tensors.append(f"t{k}")
    consumed = {name for _, inputs, _ in specs for name in inputs}
    # a random topological order of the same DAG: file order is not what ORT walks
    produced, order, pending = {"x"}, [], list(range(size))
    while pending:
        ready = [k for k in pending if all(i in produced for i in specs[k][1])]
        pick = ready[int(rng.integers(0, len(ready)))]
        order.append(pick)
        pending.remove(pick)
        produced.add(specs[pick][2])
    nodes = [helper.make_node(specs[k][0], specs[k][1], [specs[k][2]], name=f"n{k}")
             for k in order]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 4])
               for _, _, name in specs if name not in consumed]
    return models.finish(nodes, [models.float_input("x", 4)], outputs)


class OpList:
    """Drives onnxruntime's usability checker with a plain op list instead of its .md file."""

    def __init__(self, ops):
        self.ops = set(ops)

    def is_op_supported(self, node) -> bool:
        return node.op_type in self.ops

    def get_caveats(self):
        return []


def ort_groups(model, supported) -> list[list[str]]:
    from onnxruntime.tools.mobile_helpers.usability_checker import check_partitioning

    parameters = inspect.signature(check_partitioning).parameters
    kwargs = {"require_fixed_input_sizes": False} if "require_fixed_input_sizes" in parameters \
        else {}
    info = check_partitioning(model.graph, OpList(supported), **kwargs)
    return [sorted(node.name for node in group) for group in info.supported_groups]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("supported", ["MatMul,Add", "Relu,Sigmoid,Mul", "MatMul"])
def test_ort_mode_matches_onnxruntimes_own_partitioner(tmp_path, eprun, seed, supported):
    import eprun as tool

    model = dag(seed)
    path = models.save(model, tmp_path / "dag.onnx")
    answer = eprun("partition", path, supported, "--rule", "ort")
    nodes = list(model.graph.node)
    groups = tool.ort_partition_groups(nodes, supported.split(","))
    ours = [sorted(nodes[i].name for i in members) for owner, members in groups if owner == "ep"]
    assert ours == ort_groups(model, supported.split(","))
    assert [p["nodes"] for p in answer["partitions"] if p["owner"] == "ep"] == [
        [nodes[i].op_type for i in members] for owner, members in groups if owner == "ep"]
    assert answer["claimed"] == sum(n.op_type in supported.split(",") for n in nodes)
    assert sum(p["size"] for p in answer["partitions"]) == answer["nodes"] == len(nodes)
    assert answer["handoffs"] == answer["partition_count"] - 1
    # the partitions list every node once, in a valid run order
    order = [i for owner, members in groups for i in members]
    assert sorted(order) == list(range(len(nodes)))
    produced = {"x"}
    for i in order:
        assert all(name in produced for name in nodes[i].input)
        produced.update(nodes[i].output)


def test_ort_mode_merges_branches_that_file_order_splits(eprun, tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="A"),
             helper.make_node("Relu", ["a"], ["c"], name="C"),
             helper.make_node("MatMul", ["x", "W"], ["b"], name="B"),
             helper.make_node("Add", ["c", "b"], ["y"], name="D")]
    model = models.finish(nodes, [models.float_input("x", 4)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")])
    path = models.save(model, tmp_path / "branches.onnx")
    by_file = eprun("partition", path, "MatMul,Add")
    by_ort = eprun("partition", path, "MatMul,Add", "--rule", "ort")
    parts = lambda answer: [(p["owner"], p["nodes"]) for p in answer["partitions"]]
    assert parts(by_file) == [("ep", ["MatMul"]), ("cpu", ["Relu"]), ("ep", ["MatMul", "Add"])]
    assert parts(by_ort) == [("ep", ["MatMul", "MatMul"]), ("cpu", ["Relu"]), ("ep", ["Add"])]
    assert ort_groups(model, ["MatMul", "Add"]) == [["A", "B"], ["D"]]
    assert set(by_ort) == set(by_file)


def control_flow_model() -> onnx.ModelProto:
    """x -> Relu (r) -> If(then: MatMul(r), Relu, MatMul; else: Sigmoid(r), MatMul) -> Loop
    (body: Relu, MatMul, Relu) -> y. The branches read r from the outer scope."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "W")
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["r", "W"], ["t0"], name="then_mm0"),
         helper.make_node("Relu", ["t0"], ["t1"], name="then_relu"),
         helper.make_node("MatMul", ["t1", "W"], ["t2"], name="then_mm1")],
        "then", [], [out("t2")])
    else_branch = helper.make_graph(
        [helper.make_node("Sigmoid", ["r"], ["e0"], name="else_sigmoid"),
         helper.make_node("MatMul", ["e0", "W"], ["e1"], name="else_mm")],
        "else", [], [out("e1")])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"], name="body_cond"),
         helper.make_node("Relu", ["v"], ["v0"], name="body_relu0"),
         helper.make_node("MatMul", ["v0", "W"], ["v1"], name="body_mm"),
         helper.make_node("Relu", ["v1"], ["v_out"], name="body_relu1")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []), out("v")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), out("v_out")])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r"], ["total"], name="sum", keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="greater"),
             helper.make_node("If", ["positive"], ["branch"], name="if",
                              then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Loop", ["trips", "", "branch"], ["y"], name="loop", body=body)]
    inits = [w, numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(3, np.int64), "trips")]
    return models.finish(nodes, [models.float_input("x", 4)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)


def standalone(graph, outer: list[str]) -> onnx.ModelProto:
    """A subgraph as a model of its own, the outer-scope values it reads declared as inputs."""
    inputs = list(graph.input) + [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                                  for name in outer]
    return helper.make_model(helper.make_graph(list(graph.node), graph.name, inputs,
                                               list(graph.output)))


def test_ort_mode_partitions_each_subgraph_as_onnxruntime_does(eprun, tmp_path):
    model = control_flow_model()
    path = models.save(model, tmp_path / "control.onnx")
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # a valid model
    supported = ["MatMul", "Relu"]
    answer = eprun("partition", path, ",".join(supported), "--rule", "ort")
    by_name = {(sub["node"], sub["attribute"]): sub for sub in answer["subgraphs"]}
    assert sorted(by_name) == [("if", "else_branch"), ("if", "then_branch"), ("loop", "body")]
    graphs = {node.name: {a.name: a.g for a in node.attribute if a.HasField("g")}
              for node in model.graph.node}
    levels = [(model, answer)]
    for (node, attribute), sub in by_name.items():
        levels.append((standalone(graphs[node][attribute], ["r", "W"]), sub))
        assert sub["op_type"] == {"if": "If", "loop": "Loop"}[node]
    for level_model, level in levels:
        own = {node.name for node in level_model.graph.node}  # 1.19+ also walks the bodies
        groups = [g for g in ort_groups(level_model, supported) if set(g) <= own]
        assert len(groups) == sum(p["owner"] == "ep" for p in level["partitions"])
        assert level["claimed"] == sum(len(group) for group in groups)
        assert level["nodes"] == len(level_model.graph.node)
    assert answer["totals"] == {
        "graphs": 4, "nodes": 5 + 3 + 2 + 4, "claimed": 1 + 3 + 1 + 3,
        "ep_partitions": 1 + 1 + 1 + 1}
    # onnxruntime 1.19+ walks the subgraphs itself and sums the same way
    from onnxruntime.tools.mobile_helpers.usability_checker import check_partitioning
    info = check_partitioning(model.graph, OpList(supported), **(
        {"require_fixed_input_sizes": False}
        if "require_fixed_input_sizes" in inspect.signature(check_partitioning).parameters
        else {}))
    if getattr(info, "num_subgraphs", None):
        assert (info.num_nodes, info.num_supported_nodes, info.num_partitions) == (
            answer["totals"]["nodes"], answer["totals"]["claimed"],
            answer["totals"]["ep_partitions"])
    assert "subgraphs" not in eprun("partition", path, "MatMul,Relu")  # the contract's mode


def test_op_types_only_inside_subgraphs_are_op_types_of_the_model(run_eprun_here, tmp_path):
    """Sigmoid occurs only in an If branch: listing it is no mistake to point out, while a
    miscased Sigmoid is, and the model's op types listed include those of the bodies."""
    path = models.save(control_flow_model(), tmp_path / "control.onnx")
    listed = run_eprun_here("partition", path, "Sigmoid", "--rule", "ort")
    assert listed.code == 0 and "occurs" not in listed.stderr, listed.stderr
    # the contract's file mode partitions the main graph alone: there it occurs nowhere
    main_only = run_eprun_here("partition", path, "Sigmoid")
    assert main_only.code == 0 and "no op type in 'Sigmoid' occurs" in main_only.stderr
    assert "Its op types: Relu, ReduceSum, Greater, If, Loop\n" in main_only.stderr
    miscased = run_eprun_here("partition", path, "sigmoid", "--rule", "ort")
    assert "did you mean sigmoid -> Sigmoid?" in miscased.stderr
    assert "Its op types: Relu, ReduceSum, Greater, If, Loop, Sigmoid, MatMul, Identity" in \
        miscased.stderr
