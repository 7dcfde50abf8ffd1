"""The features beyond the lab: ORT-mode partitioning, attribution, metrics, check, placement."""
from __future__ import annotations

import inspect
import os
import sys

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, run_eprun
from onnx import TensorProto, helper, numpy_helper
from test_cmd_layers import oracle_boundaries, oracle_layers

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
    answer = eprun("partition", path, supported, "--mode", "ort")
    nodes = list(model.graph.node)
    units = tool.ort_partition_units(nodes, supported.split(","))
    ours = [sorted(nodes[i].name for i in members) for owner, members in units if owner == "ep"]
    assert ours == ort_groups(model, supported.split(","))
    assert [p["nodes"] for p in answer["partitions"] if p["owner"] == "ep"] == [
        [nodes[i].op_type for i in members] for owner, members in units if owner == "ep"]
    assert answer["claimed"] == sum(n.op_type in supported.split(",") for n in nodes)
    assert sum(p["size"] for p in answer["partitions"]) == answer["nodes"] == len(nodes)
    assert answer["handoffs"] == answer["partition_count"] - 1
    # the partitions list every node once, in a valid run order
    order = [i for owner, members in units for i in members]
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
    by_ort = eprun("partition", path, "MatMul,Add", "--mode", "ort")
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
    answer = eprun("partition", path, ",".join(supported), "--mode", "ort")
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
    listed = run_eprun_here("partition", path, "Sigmoid", "--mode", "ort")
    assert listed.code == 0 and "occurs" not in listed.stderr, listed.stderr
    # the contract's file mode partitions the main graph alone: there it occurs nowhere
    main_only = run_eprun_here("partition", path, "Sigmoid")
    assert main_only.code == 0 and "no op type in 'Sigmoid' occurs" in main_only.stderr
    assert "Its op types: Relu, ReduceSum, Greater, If, Loop\n" in main_only.stderr
    miscased = run_eprun_here("partition", path, "sigmoid", "--mode", "ort")
    assert "did you mean sigmoid -> Sigmoid?" in miscased.stderr
    assert "Its op types: Relu, ReduceSum, Greater, If, Loop, Sigmoid, MatMul, Identity" in \
        miscased.stderr


# -- layers --local, --metrics, --rows, --boundary-ops -----------------------------------------

def local_oracle(fp32, int8, seed: int, k: int) -> np.ndarray:
    """Graph surgery instead of extraction: the int8 model with the float tensor in front of
    boundary k-1's QuantizeLinear replaced by a new input fed fp32's boundary k-1 tensor."""
    int8_model = onnx.load(str(int8))
    layers = oracle_layers(fp32, int8, seed)
    producers = {o: n for n in int8_model.graph.node for o in n.output}
    dq = producers[layers[k - 1]["int8"]]
    q = producers[dq.input[0]]
    q.input[0] = "fed"
    int8_model.graph.input.append(helper.make_tensor_value_info("fed", TensorProto.FLOAT, None))
    int8_model.graph.output.append(helper.make_tensor_value_info(layers[k]["int8"],
                                                                 TensorProto.FLOAT, None))
    fp32_model = onnx.load(str(fp32))
    features = fp32_model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(seed, features)
    a_prev = models.run(fp32, x, [layers[k - 1]["fp32"]], typed=True)[0]
    return models.run(int8_model, {"x": x, "fed": a_prev}, [layers[k]["int8"]])[0]


def test_local_errors_match_graph_surgery(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "4", "--local")
    assert answer["local_unavailable"] == []
    expected = oracle_layers(fp32, int8, 4)
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    fp32_tensors = models.run(fp32, models.contract_input(4, features),
                              [e["fp32"] for e in expected], typed=True)
    assert answer["layers"][0]["local"]["rel_error"] == answer["layers"][0]["rel_error"]
    for k in range(1, len(expected)):
        got = answer["layers"][k]["local"]
        b = local_oracle(fp32, int8, 4, k).astype(np.float64)
        a = fp32_tensors[k].astype(np.float64)
        max_abs = float(np.abs(a - b).max())
        assert got["max_abs_error"] == pytest.approx(max_abs, rel=1e-6, abs=1e-12)
        assert got["rel_error"] == pytest.approx(max_abs / float(np.abs(a).max()), rel=1e-6)


def test_a_float16_segment_fed_at_the_input_casts_it_as_the_twin_does(eprun, tmp_path):
    """A float16 twin's first boundary is the Cast of its input, paired with the fp32 input
    by position. The segment after it is the whole prefix, so its local error is the
    accumulated one: the segment casts the fp32 input itself (onnxruntime's CPU then drops the
    cast pair around its float32 Conv, as in the twin), not fed float16 values eprun cast."""
    import real_models
    from test_real_models import float16_twin

    fp32 = models.save(real_models.residual_cnn(2), tmp_path / "cnn.onnx")
    fp16 = models.save(float16_twin(onnx.load(str(fp32))), tmp_path / "cnn16.onnx")
    answer = eprun("layers", fp32, fp16, "1", "--local", "--boundary-ops", "Conv,Gemm")
    first, second = answer["layers"][:2]
    assert (first["fp32"], first["int8"]) == ("image", "image_fp16")
    feed = {"image": np.random.default_rng(1).standard_normal((64, 3, 32, 32)).astype(np.float32)}
    a = models.run(fp32, feed, [second["fp32"]])[0].astype(np.float64)
    b = models.run(fp16, feed, [second["int8"]])[0].astype(np.float64)
    error = float(np.abs(a - b).max())
    assert second["local"]["max_abs_error"] == pytest.approx(error, rel=1e-6, abs=1e-12)
    assert second["local"]["rel_error"] == pytest.approx(second["rel_error"], rel=1e-9)


def test_local_attribution_points_at_a_damaged_layer(eprun, tmp_path):
    fp32 = models.save(models.chain(features=8, widths=(16, 16, 16, 16, 16, 8), seed=21),
                       tmp_path / "f.onnx")
    int8 = tmp_path / "q.onnx"
    models.quantize(fp32, int8, seed=22)

    def damaged(factor: float):
        """Scale layer 3's weight scale: the tensor at boundary 4 (its output) goes wrong."""
        model = onnx.load(str(int8))
        for tensor in model.graph.initializer:
            if tensor.name == "W3_scale":
                tensor.CopyFrom(numpy_helper.from_array(
                    (numpy_helper.to_array(tensor) * np.float32(factor)), tensor.name))
        return models.save(model, tmp_path / f"damaged_{factor}.onnx")

    clean = eprun("growth", fp32, int8, "9", "--local")
    hurt = eprun("growth", fp32, damaged(1.5), "9", "--local")
    # Each segment is fed fp32 tensors, so only the damaged segment's own error changes (the
    # others run the same int8 kernels on the same inputs: equal bit for bit on any CPU) ...
    for k, (before, after) in enumerate(zip(clean["local_rel_error"], hurt["local_rel_error"])):
        assert (after > before) if k == 4 else (after == before), k
    # ... while the accumulated error carries the damage on to the output.
    assert hurt["rel_error"][6] != clean["rel_error"][6]
    assert eprun("growth", fp32, damaged(3.0), "9", "--local")["worst_local"]["index"] == 4


def test_local_refuses_a_segment_whose_skip_has_no_fp32_counterpart(eprun, tmp_path):
    """A residual whose skip tensor the int8 model renamed: it cannot be fed its fp32 value,
    and recomputing it would carry the int8 error of the layers before into the segment."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "W"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "W"], ["h2"]),
             helper.make_node("Add", ["h2", "r0"], ["s"]),
             helper.make_node("MatMul", ["s", "W"], ["y"])]
    model = models.finish(nodes, [models.float_input("x", 4)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    fp32 = models.save(model, tmp_path / "res.onnx")
    int8 = tmp_path / "res_q.onnx"
    models.quantize(fp32, int8, seed=1)
    renamed = onnx.load(str(int8))
    for tensor in renamed.graph.initializer:
        if tensor.name.startswith("r0"):
            tensor.name = "skip" + tensor.name[2:]
    for node in renamed.graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name.startswith("r0"):  # r0 and the Q/DQ tensors named after it
                    field[i] = "skip" + name[2:]
    int8 = models.save(renamed, tmp_path / "renamed.onnx")
    answer = eprun("layers", fp32, int8, "1", "--local")
    reasons = {entry["index"]: entry["reason"] for entry in answer["local_unavailable"]}
    assert list(reasons) == [3]
    assert reasons[3].startswith("cannot cut: 's_DequantizeLinear_Output' reads")
    assert "the fp32 model has no tensor of that name" in reasons[3]
    assert answer["layers"][3]["local"] is None
    assert all(answer["layers"][k]["local"] is not None for k in (0, 1, 2, 4))


def test_metrics_sqnr_and_mse(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "6", "--metrics", "sqnr,mse")
    plain = eprun("layers", fp32, int8, "6")
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = models.contract_input(6, features)
    a_all = models.run(fp32, x, [e["fp32"] for e in plain["layers"]], typed=True)
    b_all = models.run(int8, x, [e["int8"] for e in plain["layers"]], typed=True)
    # with --metrics the answer says how far exposing the boundaries moved the int8 model's
    # final output on the CPU: the plain model's output against the exposed run's
    final = plain["layers"][-1]["int8"]
    (deployed,) = models.run(int8, x, [final])
    moved = float(np.abs(deployed.astype(np.float64) - b_all[-1].astype(np.float64)).max())
    assert answer["exposure"]["output"] == final
    assert answer["exposure"]["max_abs_diff"] == pytest.approx(moved, rel=1e-9, abs=0)
    assert "exposure" not in plain
    for entry, base, a, b in zip(answer["layers"], plain["layers"], a_all, b_all):
        assert {k: v for k, v in entry.items() if k not in ("sqnr_db", "mse")} == base
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert entry["mse"] == pytest.approx(float(((a - b) ** 2).mean()), rel=1e-9)
        noise = float(((a - b) ** 2).sum())
        expected = 20 * np.log10(np.linalg.norm(a) / np.sqrt(noise)) if noise else None
        assert entry["sqnr_db"] == (pytest.approx(expected, rel=1e-9) if expected else None)


def test_sqnr_is_qdq_loss_debugs_where_no_group_between_boundaries_fuses(eprun, tmp_path):
    """onnxruntime's qdq_loss_debug, run on the same input, exposes every tensor; eprun the
    Conv inputs alone. On a Conv/SiLU/Concat detector their SQNRs agree to float rounding,
    and eprun says how far its exposure moved the int8 model's final output."""
    import real_models
    from onnxruntime.quantization import CalibrationDataReader, qdq_loss_debug

    fp32 = models.save(real_models.detector_head(3), tmp_path / "det.onnx")
    int8 = models.quantize(fp32, tmp_path / "det8.onnx", seed=1)
    answer = eprun("layers", fp32, int8, "1", "--metrics", "sqnr", "--boundary-ops", "Conv")
    feed = {"image": np.random.default_rng(1).standard_normal((64, 3, 16, 16))
            .astype(np.float32)}

    class Once(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([feed])

        def get_next(self):
            return next(self.feeds, None)

    activations = []
    for path in (fp32, int8):
        augmented = str(tmp_path / f"{path.stem}_all.onnx")
        qdq_loss_debug.modify_model_output_intermediate_tensors(str(path), augmented)
        activations.append(qdq_loss_debug.collect_activations(augmented, Once()))
    errors = qdq_loss_debug.compute_activation_error(
        qdq_loss_debug.create_activation_matching(activations[1], activations[0]))
    compared = [(entry["sqnr_db"], errors[entry["fp32"]]["xmodel_err"])
                for entry in answer["layers"] if entry["fp32"] in errors]
    assert len(compared) == answer["layer_count"] >= 5
    for ours, theirs in compared:
        assert ours == pytest.approx(float(theirs), abs=1e-5)
    (deployed,) = models.run(int8, feed, ["preds"])
    exposed = models.run(int8, feed, [entry["int8"] for entry in answer["layers"]])[-1]
    assert answer["exposure"]["output"] == "preds"
    assert answer["exposure"]["max_abs_diff"] == pytest.approx(
        float(np.abs(deployed.astype(np.float64) - exposed).max()), rel=1e-9, abs=0)


def test_rows_option(eprun, lab_pair):
    fp32, int8 = lab_pair
    answer = eprun("layers", fp32, int8, "2", "--rows", "8")
    assert answer["rows"] == 8
    features = onnx.load(str(fp32)).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(2).standard_normal((8, features)).astype(np.float32)
    # layers runs both models with every boundary exposed, which on some CPUs changes the
    # int8 model's y (the fused integer kernel it would run otherwise rounds differently):
    # the oracle exposes them too, and reads y, the last boundary
    y = models.run(fp32, x, oracle_boundaries(onnx.load(str(fp32))), typed=True)[-1]
    yq = models.run(int8, x, oracle_boundaries(onnx.load(str(int8))), typed=True)[-1]
    last = answer["layers"][-1]
    assert (last["fp32"], last["int8"]) == ("y", "y")
    assert last["max_abs_error"] == pytest.approx(float(np.abs(y - yq).max()), rel=1e-6)
    settings = eprun("settings", fp32, "2", "--rows", "8")
    assert settings["baseline"]["max_abs_output"] == pytest.approx(float(np.abs(y).max()))


def conv_model(seed: int = 0) -> onnx.ModelProto:
    """NCHW input [N, 3, 8, 8] -> Conv -> Relu -> Conv -> Relu -> Flatten -> MatMul -> y."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 5).astype(np.float32), "K0"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32), "K1"),
             numpy_helper.from_array((rng.standard_normal((256, 5)) / 16).astype(np.float32), "W")]
    nodes = [helper.make_node("Conv", ["x", "K0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "K1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Flatten", ["r1"], ["f"]),
             helper.make_node("MatMul", ["f", "W"], ["y"])]
    return models.finish(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)


def test_conv_model_with_boundary_ops(eprun, tmp_path):
    fp32 = models.save(conv_model(), tmp_path / "conv.onnx")
    int8 = models.quantize(fp32, tmp_path / "conv_q.onnx", seed=3, rows=8)
    plain = eprun("layers", fp32, int8, "3")
    assert [e["fp32"] for e in plain["layers"]] == ["f", "y"]
    answer = eprun("layers", fp32, int8, "3", "--boundary-ops", "Conv")
    assert [e["fp32"] for e in answer["layers"]] == ["x", "r0", "f", "y"]
    x = np.random.default_rng(3).standard_normal((64, 3, 8, 8)).astype(np.float32)
    a_all = models.run(fp32, x, [e["fp32"] for e in answer["layers"]], typed=True)
    b_all = models.run(int8, x, [e["int8"] for e in answer["layers"]], typed=True)
    for entry, a, b in zip(answer["layers"], a_all, b_all):
        a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
        assert entry["max_abs_error"] == pytest.approx(float(np.abs(a - b).max()), rel=1e-6)
        cos = [float(r @ s / (np.linalg.norm(r) * np.linalg.norm(s))) for r, s in zip(a, b)]
        assert entry["cos_min"] == pytest.approx(min(cos), rel=1e-6)
    exposed = eprun("expose", fp32, tmp_path / "e.onnx", "--boundary-ops", "Conv")
    assert exposed["boundaries"] == ["x", "r0", "f", "y"]


# -- check -------------------------------------------------------------------------------------

def test_check_passes_identical_models(run_eprun_here, lab_pair):
    fp32, _ = lab_pair
    result = run_eprun_here("check", fp32, fp32)
    assert result.code == 0, result.stderr
    answer = result.answer
    assert answer["passed"] is True and answer["failures"] == []
    assert answer["tolerance"] == {"rtol": 1e-2, "atol": 1e-3, "min_cos": 0.999}
    assert answer["outputs"][0]["violations"] == 0 and answer["outputs"][0]["cosine"] == 1.0
    assert answer["profile"] == "fp16" and result.stderr == ""  # no twin: fp16, unsaid


def test_check_without_a_profile_holds_a_quantized_twin_to_int8(run_eprun_here, lab_pair):
    """No --profile is auto: the int8 tolerances for the int8 twin, said on stderr, and the
    verdict numpy gives with them; --profile fp16 keeps the float16 tolerances."""
    fp32, int8 = lab_pair
    result = run_eprun_here("check", fp32, int8)
    answer = result.answer
    assert answer["profile"] == "int8"
    assert answer["tolerance"] == {"rtol": 0.1, "atol": 0.05, "min_cos": 0.99}
    assert f"profile int8 (no --profile given: auto), as {str(int8)!r} quantizes" in \
        result.stderr
    x = models.contract_input(0, 8)
    ref, cand = (models.run(path, x)[0].astype(np.float64) for path in (fp32, int8))
    violations = int((np.abs(cand - ref) > 0.05 + 0.1 * np.abs(ref)).sum())
    assert answer["outputs"][0]["violations"] == violations
    assert result.code == (1 if violations else 0)
    strict = run_eprun_here("check", fp32, int8, "--profile", "fp16")
    assert strict.answer["profile"] == "fp16" and strict.code == 1


@pytest.mark.parametrize("options, tolerance", [
    (["--seed", "5", "--profile", "fp16", "--rtol", "0", "--atol", "1e-3"],
     {"rtol": 0.0, "atol": 1e-3, "min_cos": 0.999}),
    (["--profile", "int8", "--atol", "0", "--rtol", "0"], {"rtol": 0.0, "atol": 0.0, "min_cos": 0.99}),
    (["--profile", "int8", "--rtol", "10", "--atol", "10", "--min-cos", "0.9999999"],
     {"rtol": 10.0, "atol": 10.0, "min_cos": 0.9999999}),
])
def test_a_failed_check_says_which_bounds_failed_and_where(run_eprun_here, lab_pair, options, tolerance):
    """Recomputed from sessions opened here with check's own (default) options: the violations
    and the worst element (the largest excess over the bound), the cosine and by how much it
    misses min_cos, each bound failed exactly when the numbers say so, and the one stderr line
    that says why."""
    fp32, int8 = lab_pair
    result = run_eprun_here("check", fp32, int8, *options)
    assert result.code == 1 and result.stdout
    answer = result.answer
    assert answer["tolerance"] == tolerance
    x = models.contract_input(int(options[1]) if options[0] == "--seed" else 0, 8)
    ref, cand = (models.run(path, x)[0].astype(np.float64) for path in (fp32, int8))
    diff = np.abs(cand - ref)
    allowed = tolerance["atol"] + tolerance["rtol"] * np.abs(ref)
    violations = int((diff > allowed).sum())
    cosine = float(cand.ravel() @ ref.ravel() / (np.linalg.norm(cand) * np.linalg.norm(ref)))
    assert answer["outputs"][0]["violations"] == violations
    assert answer["outputs"][0]["cosine"] == pytest.approx(cosine)
    bounds = [failure["bound"] for failure in answer["failures"]]
    assert bounds == ["tolerance"] * (violations > 0) + ["min_cos"] * (cosine < tolerance["min_cos"])
    why = []
    for failure in answer["failures"]:
        if failure["bound"] == "tolerance":
            worst = [int(i) for i in np.unravel_index(int(np.argmax(diff - allowed)), diff.shape)]
            assert failure["violations"] == violations and failure["worst"]["index"] == worst
            assert failure["worst"]["abs_diff"] == pytest.approx(float(diff[tuple(worst)]))
            why.append(f"y: {violations} of {ref.size} elements outside atol + rtol*|ref|, "
                       f"worst at {worst}")
        else:
            assert failure["by"] == pytest.approx(tolerance["min_cos"] - cosine)
            why.append(f"y: cosine {failure['cosine']:.6g} below {tolerance['min_cos']:g}")
    assert answer["retries_used"] == 0  # numeric failures are never retried
    assert result.stderr.splitlines() == ["eprun: check failed: " + "; ".join(why)]


def test_check_require_providers_asks_for_exactly_the_list(run_eprun_here, lab_pair):
    """--allow-fallback passes a fallback; --require-providers fails even CPU appended. The
    CPU build's other provider (Azure) is listed by the session but takes no node: that is a
    fallback too, whatever get_providers() says."""
    fp32, _ = lab_pair
    accelerator = next(p for p in ort.get_available_providers() if p != "CPUExecutionProvider")
    args = ["check", fp32, fp32, "--providers", accelerator]
    relaxed = run_eprun_here(*args, "--allow-fallback")
    assert relaxed.code == 0 and relaxed.answer["providers"]["fell_back"] is True
    nodes = relaxed.answer["providers"]["nodes_per_provider"]
    if nodes is not None:  # onnxruntime 1.24+ says which provider took the nodes
        assert not nodes.get(accelerator) and sum(nodes.values()) > 0
        idle = run_eprun_here(*args)
        assert idle.code == 1 and idle.answer["failures"][0]["missing"] == [accelerator]
    strict = run_eprun_here(*args, "--require-providers", "--allow-fallback")
    assert strict.code == 1
    assert strict.answer["failures"] == [{"bound": "providers", "requested": [accelerator],
                                          "actual": [accelerator, "CPUExecutionProvider"],
                                          "missing": [accelerator] if nodes is not None
                                          else []}]


FLAKY = (
    "import runpy, sys, onnxruntime\n"
    "original = onnxruntime.InferenceSession.run\n"
    "calls = {'n': 0}\n"
    "def flaky(self, *args, **kwargs):\n"
    "    path = str(self._model_path)\n"
    "    if path.startswith('/proc/self/fd/'):  # eprun hands over the file it opened\n"
    "        path = __import__('os').readlink(path)\n"
    "    if 'q.onnx' in path:\n"
    "        calls['n'] += 1\n"
    "        if calls['n'] <= FAILS:\n"
    "            raise RuntimeError(MESSAGE)\n"
    "    return original(self, *args, **kwargs)\n"
    "onnxruntime.InferenceSession.run = flaky\n"
    "sys.argv = [EPRUN] + sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.parametrize("fails, message, code, retries_used", [
    (2, "EP_FAIL: Timeout while compiling the graph", 0, 2),
    (9, "device timed out", 4, None),
    (1, "Invalid argument: bad shape", 4, None),
])
def test_check_retries_transient_errors_only(lab_pair, tmp_path, fails, message, code,
                                             retries_used):
    fp32, _ = lab_pair
    candidate = tmp_path / "q.onnx"
    candidate.write_bytes(fp32.read_bytes())
    script = (FLAKY.replace("FAILS", str(fails)).replace("MESSAGE", repr(message))
              .replace("EPRUN", repr(str(EPRUN))))
    result = run_eprun("check", fp32, candidate, "--retry-pause", "0", "--retries", "2",
                       prefix=[sys.executable, "-c", script])
    assert result.code == code, result.stderr
    if code == 0:
        # the warm-up fails twice, succeeds on the second retry, then the measured run passes
        assert result.answer["retries_used"] == retries_used
    else:
        assert result.stdout == "" and message.split(":")[0] in result.stderr


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
