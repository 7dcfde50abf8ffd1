"""Models people actually quantize: several inputs, symbolic dims, reordered graphs, QOperator
and dynamic quantization, a label before the probabilities, residual connections.

Every number is recomputed here from sessions this file opens itself, with boundaries paired
by the quantizers' naming rules (``real_models.pair_compute_nodes``) and quantized tensors
dequantized by hand.
"""
from __future__ import annotations

import json

import models
import numpy as np
import onnx
import pytest
import real_models
from onnx import TensorProto, helper, numpy_helper

ROUTES = {route: lambda f, o, route=route: models.quantize(f, o, 7, route=route, rows=4)
          for route in models.ROUTES}
# model -> (builder, --boundary-ops on top of MatMul/Gemm)
MODELS = {"encoder": (lambda: real_models.transformer_encoder(1), ()),
          "cnn": (lambda: real_models.residual_cnn(2), ("Conv",)),
          "classifier": (lambda: real_models.label_classifier(3), ()),
          "vad": (lambda: real_models.stateful_vad(4), ())}


@pytest.fixture(scope="session")
def real_pairs(tmp_path_factory):
    """{(model, route): (fp32 path, quantized path)}, plus a reordered QDQ twin per model."""
    folder = tmp_path_factory.mktemp("real")
    pairs = {}
    for name, (build, _) in MODELS.items():
        fp32 = models.save(build(), folder / f"{name}.onnx")
        for route, quantize in ROUTES.items():
            quantized = folder / f"{name}.{route}.onnx"
            quantize(fp32, quantized)
            pairs[name, route] = (fp32, quantized)
        shuffled = real_models.reorder_nodes(onnx.load(str(folder / f"{name}.qdq.onnx")), 3)
        pairs[name, "reordered"] = (fp32, models.save(shuffled, folder / f"{name}.re.onnx"))
    return pairs


# -- the oracle --------------------------------------------------------------------------------

def oracle_feeds(model, seed: int, rows: int = 64, seq: int = 32, side: int = 32) -> dict:
    """The inputs as the README describes them, written out for these models by hand."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        shape = [d.dim_value if d.dim_value > 0 else
                 rows if d.dim_param == "batch" or axis == 0 else
                 seq if d.dim_param == "seq" else side for axis, d in enumerate(dims)]
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        elif value.name == "input_ids":  # indexes a 50-row embedding table
            feeds[value.name] = rng.integers(0, 50, shape).astype(np.int64)
        else:  # the attention mask and the sample rate
            feeds[value.name] = np.ones(shape, np.int64)
    return feeds


def dequantized(model, node, fetched_names: list[str]):
    """(tensor, scale, zero point) names that give the float value of ``node``'s first input."""
    producers = {o: n for n in model.graph.node for o in n.output}
    source = producers.get(node.input[0])
    if source is not None and source.op_type == "QuantizeLinear":
        return node.input[0], source.input[1], source.input[2]
    if source is not None and source.op_type == "DynamicQuantizeLinear":
        return node.input[0], source.output[1], source.output[2]
    if node.op_type in ("QLinearMatMul", "QLinearConv", "QGemm"):
        return node.input[0], node.input[1], node.input[2]
    return node.input[0], None, None


def oracle_layers(fp32, quantized, seed: int, ops=("MatMul", "Gemm"), feeds=None) -> list[dict]:
    fm, qm = onnx.load(str(fp32)), onnx.load(str(quantized))
    feeds = feeds if feeds is not None else oracle_feeds(fm, seed)
    pairs = [(n, q) for n, q in real_models.pair_compute_nodes(fm, qm) if n.op_type in ops]
    boundaries, seen = [], set()
    for n, q in pairs:
        if n.input[0] not in seen:
            seen.add(n.input[0])
            boundaries.append((n.input[0], dequantized(qm, q, [])))
    final = next(o.name for o in fm.graph.output if o.type.tensor_type.elem_type == 1)
    boundaries.append((final, (final, None, None)))
    a_names = list(dict.fromkeys(b for b, _ in boundaries))
    a_values = dict(zip(a_names, models.run(fp32, feeds, a_names)))
    b_names = list(dict.fromkeys(t for _, spec in boundaries for t in spec if t))
    b_values = dict(zip(b_names, models.run(quantized, feeds, b_names)))
    constants = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    entries = []
    for k, (name, (q_name, scale, zero)) in enumerate(boundaries):
        a = a_values[name].astype(np.float64)
        b = b_values[q_name].astype(np.float64)
        if scale:
            s = constants.get(scale, b_values.get(scale))
            z = constants.get(zero, b_values.get(zero))
            b = (b - np.float64(z)) * np.float64(s)
        rows = a.shape[0]
        cos = []
        for ra, rb in zip(a.reshape(rows, -1), b.reshape(rows, -1)):
            d = np.sqrt((ra ** 2).sum()) * np.sqrt((rb ** 2).sum())
            cos.append(1.0 if d == 0 else float(ra @ rb / d))
        max_abs, top = float(np.abs(a - b).max()), float(np.abs(a).max())
        entries.append({"index": k, "fp32": name, "int8": q_name, "max_abs_error": max_abs,
                        "scale": top, "rel_error": max_abs / top if top else 0.0,
                        "cos_min": min(cos)})
    return entries


def assert_layers_match(answer: dict, expected: list[dict], rel: float = 1e-5) -> None:
    """Within float32 rounding: which outputs a graph declares, and with which shapes, lets
    onnxruntime pick other fused kernels on some releases (seen on 1.16 in LayerNorm paths and
    in dynamic quantization), so the last bits of a tensor may differ."""
    assert answer["layer_count"] == len(expected)
    for got, want in zip(answer["layers"], expected):
        for key in ("index", "fp32", "int8"):
            assert got[key] == want[key], (key, got, want)
        for key in ("max_abs_error", "scale", "rel_error", "cos_min"):
            assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-9), (key, got, want)


@pytest.fixture
def layers(run_eprun_here):
    """``eprun layers ARGV`` in this process, held to success: (the answer, stderr)."""
    def run(*argv) -> tuple[dict, str]:
        result = run_eprun_here("layers", *argv)
        assert result.code == 0, result.stderr
        return result.answer, result.stderr
    return run


# -- every route, every input ------------------------------------------------------------------

@pytest.mark.parametrize("route", [*ROUTES, "reordered"])
@pytest.mark.parametrize("name", MODELS)
def test_real_pairs_match_the_oracle(layers, real_pairs, name, route):
    fp32, quantized = real_pairs[name, route]
    ops = ("MatMul", "Gemm", *MODELS[name][1])
    extra = ["--boundary-ops", ",".join(MODELS[name][1])] if MODELS[name][1] else []
    answer, _ = layers(fp32, quantized, "5", "--pair", "name", *extra)
    expected = oracle_layers(fp32, quantized, 5, ops)
    assert_layers_match(answer, expected)
    assert answer["rows"] == 64
    if route != "dynamic" or name == "encoder":  # dynamic leaves Conv and Gemm in float
        assert any(entry["max_abs_error"] > 0 for entry in answer["layers"])


def test_the_answer_records_every_input_fed(layers, real_pairs):
    fp32, quantized = real_pairs["encoder", "qdq"]
    answer, _ = layers(fp32, quantized, "5")
    assert answer["inputs"] == [
        {"name": "input_ids", "dtype": "int64", "shape": [64, 32],
         "source": "integers[0, 49] (rows of embeddings.word_embeddings.weight)"},
        {"name": "attention_mask", "dtype": "int64", "shape": [64, 32], "source": "ones"}]
    assert list(answer)[:3] == ["seed", "rows", "inputs"]
    vad = layers(*real_pairs["vad", "qdq"], "5")[0]["inputs"]
    assert [(i["name"], i["shape"], i["source"]) for i in vad] == [
        ("input", [64, 32], "standard_normal"), ("state", [2, 64, 8], "standard_normal"),
        ("sr", [], "ones")]


def test_dim_rows_range_and_file_shape_the_inputs(layers, real_pairs, tmp_path):
    fp32, quantized = real_pairs["encoder", "qdq"]
    answer, _ = layers(fp32, quantized, "5", "--dim", "seq=5", "--rows", "3",
                       "--input-range", "input_ids:0,3")
    ids, mask = answer["inputs"]
    assert ids["shape"] == mask["shape"] == [3, 5] and ids["source"] == "integers[0, 3]"
    # the same arrays from a file give the same numbers (and the file's batch is the rows)
    rng = np.random.default_rng(5)
    feeds = {"input_ids": rng.integers(0, 4, (3, 5), endpoint=False).astype(np.int64),
             "attention_mask": np.ones((3, 5), np.int64)}
    np.savez(tmp_path / "feeds.npz", **feeds)
    from_file, _ = layers(fp32, quantized, "0", "--inputs", tmp_path / "feeds.npz")
    assert [i["source"] for i in from_file["inputs"]] == ["file", "file"]
    assert from_file["rows"] == 3
    assert_layers_match(from_file, oracle_layers(fp32, quantized, 0, feeds=feeds))


def test_the_contract_input_is_unchanged():
    import eprun as tool

    spec = tool.InputSpec("x", "float32", ("N", 7))
    for seed in (0, 2026, 10 ** 40):
        feed = tool.make_feeds([spec], seed)
        expected = np.random.default_rng(seed).standard_normal((64, 7)).astype(np.float32)
        assert feed.arrays["x"].tobytes() == expected.tobytes() and feed.contract_shaped
    assert not tool.make_feeds([spec], 0, tool.InputOptions(ranges={"x": (0, 1)})).contract_shaped


def test_a_fixed_batch_sets_the_rows(layers, tmp_path):
    fixed = models.save(models.chain(features=4, widths=(4, 4, 4, 4, 4), batch=2),
                        tmp_path / "fixed.onnx")
    answer, _ = layers(fixed, fixed, "1")
    assert answer["rows"] == 2 and answer["inputs"][0]["shape"] == [2, 4]


# -- pairing -----------------------------------------------------------------------------------

def test_position_pairing_warns_where_the_names_disagree(layers, tmp_path):
    """Two branches whose MatMuls the quantized file lists in the other order."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.7, "W")
    v = numpy_helper.from_array(np.eye(4, dtype=np.float32)[::-1] * 1.3, "V")
    nodes = [helper.make_node("Relu", ["x"], ["ra"], name="relu_a"),
             helper.make_node("Sigmoid", ["x"], ["sb"], name="sigmoid_b"),
             helper.make_node("MatMul", ["ra", "W"], ["ma"], name="mm_a"),
             helper.make_node("MatMul", ["sb", "V"], ["mb"], name="mm_b"),
             helper.make_node("Add", ["ma", "mb"], ["s"], name="add"),
             helper.make_node("MatMul", ["s", "W"], ["y"], name="mm_out")]
    fp32 = models.save(models.finish(nodes, [models.float_input("x", 4)],
                                     [helper.make_tensor_value_info("y", 1, ["N", 4])], [w, v]),
                       tmp_path / "branches.onnx")
    plain = tmp_path / "branches.int8.onnx"
    models.quantize(fp32, plain, seed=2)
    quantized = onnx.load(str(plain))
    order = list(quantized.graph.node)
    mm_a = next(i for i, n in enumerate(order) if n.name == "mm_a")
    mm_b = next(i for i, n in enumerate(order) if n.name == "mm_b")
    order[mm_a], order[mm_b] = order[mm_b], order[mm_a]  # still a valid topological order
    del quantized.graph.node[:]
    quantized.graph.node.extend(order)
    swapped = models.save(quantized, tmp_path / "swapped.onnx")

    by_position, stderr = layers(fp32, swapped, "4", "--pair", "position")
    assert ("pairing by position contradicts the tensor names: 'ra' (position 0) goes with "
            "'ra_DequantizeLinear_Output' (position 1)") in stderr
    assert "--pair name" in stderr and "pairing" not in by_position
    by_default, stderr = layers(fp32, swapped, "4")  # auto: the names pair every boundary
    assert "paired by name, as position contradicts the tensor names" in stderr
    assert by_default["pairing"] == "name"
    assert_layers_match({key: value for key, value in by_default.items() if key != "pairing"},
                        oracle_layers(fp32, swapped, 4))
    assert by_position["layers"][0]["int8"] == "sb_DequantizeLinear_Output"
    by_name, stderr = layers(fp32, swapped, "4", "--pair", "name")
    assert "contradicts" not in stderr
    assert_layers_match(by_name, oracle_layers(fp32, swapped, 4))
    assert by_name["layers"][0]["rel_error"] != by_position["layers"][0]["rel_error"]
    assert "contradicts" not in layers(fp32, plain, "4")[1]


def test_pair_name_compares_models_with_different_boundary_counts(layers,
        run_eprun_here, lab_pair, tmp_path):
    """An int8 model with an extra MatMul on the raw input: one boundary more, all named."""
    fp32, int8 = lab_pair
    extra = onnx.load(str(int8))
    extra.graph.initializer.append(numpy_helper.from_array(np.eye(8, dtype=np.float32), "E"))
    extra.graph.node.append(helper.make_node("MatMul", ["x", "E"], ["aux"], name="aux"))
    extra.graph.output.append(helper.make_tensor_value_info("aux", 1, ["N", 8]))
    extra = models.save(extra, tmp_path / "extra.onnx")
    result = run_eprun_here("layers", fp32, extra, "1")
    assert result.code == 4
    assert f"boundary counts differ: 6 in '{fp32}', 7 in '{extra}'" in result.stderr
    assert "the names pair every fp32 boundary, so --pair name would compare them" in \
        result.stderr
    by_name, _ = layers(fp32, extra, "1", "--pair", "name")
    assert by_name == layers(fp32, int8, "1")[0]


def clip_like_pair(tmp_path):
    """A head whose first output also feeds a MatMul (CLIP's text_embeds before the logits),
    and its float16 twin as a converter with kept io types writes it: the producer writes
    graph_output_cast_0, the MatMul reads that, a Cast makes the float32 output. The twin has
    one boundary more (the MatMul's input is no longer the output)."""
    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32),
                                       f"W{k}") for k in range(3)]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="/fc0/MatMul"),
             helper.make_node("Relu", ["h"], ["r"], name="/relu/Relu"),
             helper.make_node("MatMul", ["r", "W1"], ["text_embeds"], name="/proj/MatMul"),
             helper.make_node("MatMul", ["text_embeds", "W2"], ["logits"], name="/head/MatMul")]
    outputs = [helper.make_tensor_value_info(name, 1, ["N", 8]) for name in
               ("text_embeds", "logits")]
    fp32 = models.save(models.finish(nodes, [models.float_input("x", 8)], outputs, weights),
                       tmp_path / "clip.onnx")
    twin = onnx.load(str(fp32))
    for tensor in twin.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    renamed = {"x": "graph_input_cast_0", "text_embeds": "graph_output_cast_0",
               "logits": "graph_output_cast_1"}
    for node in twin.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        node.output[:] = [renamed.get(name, name) for name in node.output]
    casts = [helper.make_node("Cast", [renamed[name]], [name], name=f"{renamed[name]}_node",
                              to=TensorProto.FLOAT) for name in ("text_embeds", "logits")]
    nodes = [helper.make_node("Cast", ["x"], ["graph_input_cast_0"], name="graph_input_cast",
                              to=TensorProto.FLOAT16), *twin.graph.node, *casts]
    del twin.graph.node[:]
    twin.graph.node.extend(nodes)
    return fp32, models.save(twin, tmp_path / "clip_fp16.onnx")


def test_a_float16_twin_with_a_boundary_more_is_paired_by_name(layers, run_eprun_here, tmp_path):
    """layers pairs the twin by name on its own (as report does), says so, and compares each
    fp32 boundary with the twin's tensor of the same place; the twin's extra boundary is left
    out. A twin that computes something the fp32 model does not keeps the contract's error."""
    fp32, fp16 = clip_like_pair(tmp_path)
    answer, stderr = layers(fp32, fp16, "3")
    assert ("boundary counts differ (3 in " in stderr and "paired by name, leaving "
            "'graph_output_cast_0' out" in stderr), stderr
    assert answer["pairing"] == "name"
    assert [(e["fp32"], e["int8"]) for e in answer["layers"]] == [
        ("x", "graph_input_cast_0"), ("r", "r"), ("text_embeds", "text_embeds")]
    x = models.contract_input(3, 8)
    reference = [x, *models.run(fp32, x, ["r", "text_embeds"])]
    # the twin's session exposes all its boundaries, the one left out too: on the CPU the
    # float16 MatMul runs in float32 between casts, and whether its output is rounded to
    # float16 before the last Cast depends on what is exposed
    got = models.run(fp16, x, ["graph_input_cast_0", "r", "graph_output_cast_0", "text_embeds"])
    del got[2]
    for entry, a, b in zip(answer["layers"], reference, got):
        error = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
        assert entry["max_abs_error"] == pytest.approx(error, rel=1e-9, abs=1e-12)
        assert entry["scale"] == pytest.approx(float(np.abs(a).max()), rel=1e-9)
    refused = run_eprun_here("layers", fp32, fp16, "3", "--pair", "position")
    assert refused.code == 4 and "boundary counts differ: 3 in" in refused.stderr
    extra = onnx.load(str(fp16))  # one node more, under a name the fp32 model lacks
    extra.graph.node.insert(1, helper.make_node("Identity", ["graph_input_cast_0"], ["xi"],
                                                name="/extra/Identity"))
    extra.graph.node[2].input[0] = "xi"
    extra = models.save(extra, tmp_path / "extra.onnx")
    refused = run_eprun_here("layers", fp32, extra, "3")
    assert refused.code == 4 and "boundary counts differ: 3 in" in refused.stderr


def test_in_a_conversion_the_names_win_where_they_tie_and_the_rest_keep_their_order(capsys):
    """Four boundaries each: the names tie three of them otherwise than position, the fourth
    has no name to go by. The conversion (every node keeps its name) is paired by the names
    where they tie and by order among the rest; an int8 model with a node of its own is not
    a conversion, and keeps the contract's position with a note."""
    from types import SimpleNamespace

    import eprun as tool

    def side(path, boundaries, owners, names):
        graph = helper.make_graph([helper.make_node("Relu", ["a"], ["b"], name=name)
                                   for name in names], "g", [], [])
        return SimpleNamespace(path=path, boundaries=boundaries, owners=owners,
                               model=helper.make_model(graph))

    layers_ = ["mm_a", "mm_b", "mm_c"]
    fp32 = side("f.onnx", ["a", "b", "c", "y"], dict(zip("abc", layers_)), layers_)
    int8 = side("q.onnx", ["b_DequantizeLinear_Output", "opaque", "a_DequantizeLinear_Output",
                           "y"], {}, [f"{name}_quant" for name in layers_])
    assert tool.plan_pairs(fp32, int8, "auto") == ([(0, 2), (1, 0), (2, 1), (3, 3)], "name")
    assert "the names tie 3 of the 4 boundaries" in capsys.readouterr().err
    other = side("q.onnx", int8.boundaries, {}, [*layers_, "mm_new"])
    assert tool.plan_pairs(fp32, other, "auto") == ([(k, k) for k in range(4)], "position")
    assert "neither order is sure" in capsys.readouterr().err


# -- outputs that matter -----------------------------------------------------------------------

def test_the_final_boundary_is_the_first_float_output(layers, run_eprun_here, real_pairs):
    fp32, quantized = real_pairs["classifier", "qdq"]
    answer, _ = layers(fp32, quantized, "5")
    assert answer["layers"][-1]["fp32"] == "probabilities"
    growth = run_eprun_here("growth", fp32, quantized, "5").answer
    assert growth["total_growth"] not in (None, 0.0)
    assert growth["rel_error"][-1] == answer["layers"][-1]["rel_error"] > 0


def test_a_boundary_op_neither_model_has_is_said(layers, lab_pair):
    """A custom or misspelt op type that no node of either model has adds no boundary: the
    answer is the plain one, and stderr says so with the nearest op type there is."""
    fp32, int8 = lab_pair
    answer, stderr = layers(fp32, int8, "1", "--boundary-ops", "Ad,CustomConv")
    plain, _ = layers(fp32, int8, "1")
    assert answer["layers"] == plain["layers"]
    assert ("--boundary-ops Ad, CustomConv: neither model has such a node, so it adds no "
            "boundary; did you mean Add?") in stderr


def test_a_cnn_without_matmul_boundaries_is_told_about_boundary_ops(layers, real_pairs, tmp_path):
    body = real_models.residual_cnn(2)
    body.graph.node.remove(next(n for n in body.graph.node if n.op_type == "Gemm"))
    flat = next(n for n in body.graph.node if n.op_type == "Flatten").output[0]
    del body.graph.output[:]
    body.graph.output.append(helper.make_tensor_value_info(flat, 1, None))
    path = models.save(body, tmp_path / "convs.onnx")
    answer, stderr = layers(path, path, "1")
    assert answer["layer_count"] == 1
    assert "add --boundary-ops Conv to compare the input of each" in stderr
    answer, stderr = layers(path, path, "1", "--boundary-ops", "Conv")
    assert answer["layer_count"] > 1 and "boundary-ops" not in stderr


# -- --local on residual and multi-branch segments ---------------------------------------------

def surgery(int8, fed: dict, output: str, x) -> np.ndarray:
    """The int8 model with the float input of each QuantizeLinear of ``fed``'s tensors
    replaced by a new graph input carrying the given fp32 value."""
    model = onnx.load(str(int8))
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in fed:
            node.input[0] = f"fed_{node.input[0]}"
    for name in fed:
        model.graph.input.append(helper.make_tensor_value_info(f"fed_{name}", 1, None))
    return models.run(model, {"x": x, **{f"fed_{k}": v for k, v in fed.items()}}, [output])[0]


def test_local_feeds_skip_connections_their_fp32_values(eprun, tmp_path):
    fp32 = models.save(models.residual_chain(), tmp_path / "res.onnx")
    int8 = tmp_path / "res.int8.onnx"
    models.quantize(fp32, int8, seed=5)
    answer = eprun("layers", fp32, int8, "3", "--local")
    assert answer["local_unavailable"] == []
    x = models.contract_input(3, 6)
    a = dict(zip("rcsy", models.run(fp32, x, list("rcsy"))))
    # boundary k's segment is fed the fp32 tensors it reads from before boundary k-1
    for k, fed, end in ((1, {"x": x}, "r"), (2, {"r": a["r"]}, "c"),
                        (3, {"c": a["c"], "r": a["r"]}, "s"), (4, {"s": a["s"]}, "y")):
        local = surgery(int8, fed, answer["layers"][k]["int8"], x).astype(np.float64)
        ref = a[end].astype(np.float64)
        got = answer["layers"][k]["local"]
        assert got["max_abs_error"] == pytest.approx(float(np.abs(ref - local).max()),
                                                     rel=1e-6, abs=1e-12), k


@pytest.mark.parametrize("name", ["encoder", "vad", "cnn"])
def test_local_cuts_every_segment_of_real_models(run_eprun_here, real_pairs, name):
    extra = ["--boundary-ops", "Conv"] if name == "cnn" else []
    qdq = run_eprun_here("growth", *real_pairs[name, "qdq"], "5", "--local", *extra).answer
    qop = run_eprun_here("growth", *real_pairs[name, "qoperator"], "5", "--local", "--pair", "name",
                    *extra).answer
    assert qdq["local_unavailable"] == [] and None not in qdq["local_rel_error"]
    assert qop["local_unavailable"] == [] and None not in qop["local_rel_error"]
    assert qdq["local_rel_error"][0] == qdq["rel_error"][0]


def test_local_feeds_a_fused_projection_by_the_scale_of_the_op_that_wrote_it(run_eprun_here,
                                                                             tmp_path):
    """A QOperator twin's fused QKV projection is read only by a Split: where a segment is fed
    at it, its scale is the QLinearAdd's result scale (no quantized op reads the tensor)."""
    fp32 = models.save(real_models.distilbert_like(1), tmp_path / "dbert.onnx")
    qop = tmp_path / "dbert.qop.onnx"
    models.quantize(fp32, qop, 1, route="qoperator", rows=4)
    answer = run_eprun_here("growth", fp32, qop, "1", "--local").answer
    assert answer["local_unavailable"] == [] and None not in answer["local_rel_error"]


# -- other commands on real models -------------------------------------------------------------

def test_settings_check_and_placement_feed_every_input(run_eprun_here, eprun, real_pairs):
    fp32, quantized = real_pairs["encoder", "qdq"]
    settings = eprun("settings", quantized, "5")
    assert [i["name"] for i in settings["inputs"]] == ["input_ids", "attention_mask"]
    feeds = oracle_feeds(onnx.load(str(quantized)), 5)
    # the baseline's own options: with default ones the int8 kernel of the CPU would decide
    # (it fuses DequantizeLinear -> MatMul -> QuantizeLinear), and only some CPUs' agree
    baseline = models.run(quantized, feeds, level="ORT_DISABLE_ALL", threads=1)[0]
    assert settings["baseline"]["max_abs_output"] == pytest.approx(
        float(np.abs(baseline).max()), rel=1e-6)
    result = run_eprun_here("check", fp32, quantized, "--profile", "int8", "--seed", "5")
    assert result.code in (0, 1), result.stderr
    assert result.answer["inputs"] == settings["inputs"]
    y = models.run(quantized, feeds)[0]  # check's default options, as its sessions have
    assert result.answer["outputs"][0]["max_abs_diff"] == pytest.approx(
        float(np.abs(models.run(fp32, feeds)[0] - y).max()), rel=1e-6)
    assert eprun("placement", quantized, "CPUExecutionProvider")["nodes"]


def float16_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float model in float16 inside, float32 at its edges (what
    ``convert_float_to_float16(keep_io_types=True)`` makes): weights cast, a Cast after the
    input and before the output, every other tensor name kept."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    for tensor in twin.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(
            numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    x, y = twin.graph.input[0].name, twin.graph.output[0].name
    for node in twin.graph.node:
        node.input[:] = [f"{x}_fp16" if name == x else name for name in node.input]
        node.output[:] = [f"{y}_fp16" if name == y else name for name in node.output]
    nodes = [helper.make_node("Cast", [x], [f"{x}_fp16"], to=TensorProto.FLOAT16),
             *twin.graph.node,
             helper.make_node("Cast", [f"{y}_fp16"], [y], to=TensorProto.FLOAT)]
    del twin.graph.node[:]
    twin.graph.node.extend(nodes)
    return twin


def test_a_float16_twin_is_compared_after_casting(layers, tmp_path):
    fp32 = models.save(models.chain(features=8, widths=(16, 16, 8), seed=4), tmp_path / "f.onnx")
    fp16 = models.save(float16_twin(onnx.load(str(fp32))), tmp_path / "h.onnx")
    answer, stderr = layers(fp32, fp16, "2")
    assert "contradicts" not in stderr
    assert [e["int8"] for e in answer["layers"]] == ["x_fp16", "relu0", "relu1", "y"]
    x = models.contract_input(2, 8)
    names = ["relu0", "relu1", "y"]
    reference = [x, *models.run(fp32, x, names)]
    got = models.run(fp16, x, ["x_fp16", *names])
    for entry, ref, half in zip(answer["layers"], reference, got):
        assert half.dtype == (np.float16 if entry["int8"] != "y" else np.float32)
        error = float(np.abs(ref.astype(np.float64) - half.astype(np.float64)).max())
        assert entry["max_abs_error"] == pytest.approx(error, rel=1e-9, abs=1e-12)
        assert 0 < entry["rel_error"] < 1e-2


def test_boundaries_of_other_types_are_refused(run_eprun_here, tmp_path):
    model = models.finish(
        [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT32),
         helper.make_node("MatMul", ["xi", "W"], ["yi"]),
         helper.make_node("Cast", ["yi"], ["y"], to=TensorProto.FLOAT)],
        [models.float_input("x", 4)], [helper.make_tensor_value_info("y", 1, ["N", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.int32), "W")])
    path = models.save(model, tmp_path / "int32.onnx")
    result = run_eprun_here("layers", path, path, "1")
    assert result.code == 4 and result.stdout == ""
    assert result.stderr.strip().endswith("boundary 'xi' holds INT32 values; eprun compares "
                                          "float, float16 and 8/16-bit quantized tensors")


# -- report on any pair ------------------------------------------------------------------------

def partition_rows(text: str) -> list[list[str]]:
    """The cells of the partition table's rows (model, ops, nodes, claimed, partitions, ...)."""
    return [line.split(" | ") for line in text.splitlines()
            if line.startswith("| `") and line.split(" | ")[0].endswith(".onnx`")]

def test_report_on_a_real_cnn_pair(run_eprun_here, eprun, real_pairs, tmp_path):
    fp32, quantized = real_pairs["cnn", "qoperator"]
    out = tmp_path / "report"
    # a target this build lacks is a fallback: refused, or measured anyway when allowed
    refused = run_eprun_here("report", fp32, quantized, "--seed", "5", "--out-dir", out,
                        "--providers", "DmlExecutionProvider,CPUExecutionProvider",
                        "--boundary-ops", "Conv")
    assert refused.code == 4 and "onnxruntime-directml" in refused.stderr
    assert not out.exists()
    answer = eprun("report", fp32, quantized, "--seed", "5", "--out-dir", out, "--providers",
                   "DmlExecutionProvider,CPUExecutionProvider", "--boundary-ops", "Conv",
                   "--allow-fallback")
    assert answer["pairing"] == "name"
    # the op lists come from the models: a Conv net is partitioned by Conv, not MatMul
    splits = partition_rows((out / "ep_report.md").read_text())
    assert splits[0][1] == "`Conv`, `Gemm`"
    assert "`QLinearConv`" in splits[2][1]
    # the user's request is a row of the providers table, and the check ran on it
    provided = json.loads((out / "providers.json").read_text())
    assert provided["cases"][-1]["requested"] == ["DmlExecutionProvider", "CPUExecutionProvider"]
    gate = run_eprun_here("check", fp32, quantized, "--profile", "int8", "--seed", "5",
                     "--providers", "DmlExecutionProvider,CPUExecutionProvider",
                     "--allow-fallback")
    assert answer["check"]["passed"] == gate.answer["passed"]
    assert answer["check"]["failures"] == gate.answer["failures"]
    text = (out / "ep_report.md").read_text()
    verdict = "**passed**." if gate.answer["passed"] else "**failed**: "
    assert f"on `CPUExecutionProvider`: {verdict}" in text
    # growth.json is exactly what growth prints for the same pairing, inputs and providers
    growth = eprun("growth", fp32, quantized, "5", "--pair", "name", "--boundary-ops", "Conv",
                   "--providers", "DmlExecutionProvider,CPUExecutionProvider",
                   "--allow-fallback")
    assert json.loads((out / "growth.json").read_text()) == growth
    assert "Relu cuts" not in text


@pytest.mark.parametrize("pair", ["lab", "dynamic"])
def test_report_prose_follows_the_graph_and_the_numbers(eprun, lab_pair, real_pairs, tmp_path,
                                                        pair):
    """The Q/DQ sentence only where a QuantizeLinear/DequantizeLinear pair wraps every boundary
    and claiming the quantization ops joins what the float ops leave split."""
    fp32, int8 = lab_pair if pair == "lab" else real_pairs["classifier", "dynamic"]
    eprun("report", fp32, int8, "--out-dir", tmp_path / "r")
    text = (tmp_path / "r" / "ep_report.md").read_text()
    rows = partition_rows(text)
    claim = "claiming Q/DQ as well is what lets the quantized graph stay in one piece"
    assert (claim in text) == (pair == "lab")
    if pair == "lab":
        assert int(rows[3][4]) > int(rows[1][4]) and rows[4][4] == "1"
    else:
        assert (f"Claiming every op type of the float model leaves the float model in "
                f"{rows[1][4]} and the int8 model in {rows[3][4]} partitions; adding the int8 "
                f"model's own quantization ops gives {rows[4][4]}.") in text


def test_chart_values_are_plain_decimals():
    import eprun as tool

    assert [tool._plain(v) for v in (1.61938e-05, 0.00427523, 0.138014, 43.5316654, 2e-9)] == [
        "0.0000161938", "0.00427523", "0.138014", "43.5317", "0.000000002"]
