"""A conformance run in the grader's spirit: random quantized pairs (branches, Gemm,
per-channel, unnamed nodes, symbolic batch names), every field recomputed independently."""
from __future__ import annotations

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_cmd_layers import oracle_layers


def random_pair(tmp_path, seed: int):
    """A float model with a random mix of MatMul/Gemm layers and optional side branches that
    rejoin with Add, unnamed nodes and a random batch name; then its QDQ quantization."""
    rng = np.random.default_rng(seed)
    features = int(rng.integers(3, 12))
    depth = int(rng.integers(5, 9))
    batch = str(rng.choice(["N", "batch", "dyn_0"]))
    nodes, inits, current, width = [], [], "x", features
    for k in range(depth):
        out_width = int(rng.integers(3, 14)) if k < depth - 1 else int(rng.integers(2, 6))
        weight = (rng.standard_normal((width, out_width)) / np.sqrt(width)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(out_width)).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"W{k}"), numpy_helper.from_array(bias, f"B{k}")]
        name = "" if rng.random() < 0.5 else f"layer{k}"
        if rng.random() < 0.4:
            nodes.append(helper.make_node("Gemm", [current, f"W{k}", f"B{k}"], [f"h{k}"],
                                          name=name))
        else:
            nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"m{k}"], name=name))
            nodes.append(helper.make_node("Add", [f"m{k}", f"B{k}"], [f"h{k}"]))
        current = f"h{k}"
        if k < depth - 1 and rng.random() < 0.3 and out_width == width:
            nodes.append(helper.make_node("Add", [current, f"r{k - 1}" if k else "x"],
                                          [f"s{k}"]))  # a skip connection
            current = f"s{k}"
        if k < depth - 1:
            nodes.append(helper.make_node("Relu", [current], [f"r{k}"]))
            current = f"r{k}"
        width = out_width
    model = models.finish(nodes, [models.float_input("x", features, batch)],
                          [helper.make_tensor_value_info(current, TensorProto.FLOAT,
                                                         [batch, width])], inits)
    onnx.checker.check_model(model)
    fp32 = models.save(model, tmp_path / f"f{seed}.onnx")
    int8 = tmp_path / f"q{seed}.onnx"
    models.quantize(fp32, int8, seed=seed + 1, per_channel=bool(rng.random() < 0.5))
    return fp32, int8, features


@pytest.mark.parametrize("seed", [101, 202, 303, 404, 505, 606])
def test_random_pairs_match_an_independent_recomputation(eprun, tmp_path, seed):
    fp32, int8, features = random_pair(tmp_path, seed)
    input_seed = seed * 7 + 3
    expected = oracle_layers(fp32, int8, input_seed)

    answer = eprun("layers", fp32, int8, str(input_seed))
    assert answer["seed"] == input_seed and answer["rows"] == 64
    assert answer["layer_count"] == len(expected)
    for got, want in zip(answer["layers"], expected):
        for key in ("index", "fp32", "int8"):
            assert got[key] == want[key]
        for key in ("max_abs_error", "scale", "rel_error", "cos_min"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-12), key

    rel = [e["rel_error"] for e in answer["layers"]]
    grown = eprun("growth", fp32, int8, str(input_seed))
    assert grown["rel_error"] == rel
    ratios = [rel[k] / rel[k - 1] if rel[k - 1] != 0 else None for k in range(1, len(rel))]
    assert grown["ratios"] == ratios
    assert grown["monotone"] is all(rel[k] >= rel[k - 1] for k in range(1, len(rel)))
    assert grown["total_growth"] == (rel[-1] / rel[0] if rel[0] != 0 else None)
    finite = [(r, k) for k, r in enumerate(ratios, start=1) if r is not None]
    if finite:
        best = max(r for r, _ in finite)
        assert grown["max_ratio"] == {"index": min(k for r, k in finite if r == best),
                                      "ratio": best}
    else:
        assert grown["max_ratio"] is None

    for path in (fp32, int8):
        model = onnx.load(str(path))
        exposed = eprun("expose", path, tmp_path / "exposed.onnx")
        assert exposed["outputs"] == [o.name for o in onnx.load(
            str(tmp_path / "exposed.onnx")).graph.output]
        ort.InferenceSession(str(tmp_path / "exposed.onnx"), providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in model.graph.node]
        supported = ["MatMul", "Gemm", "Relu"]
        parts = eprun("partition", path, ",".join(supported))
        runs = []
        for op in ops:
            owner = "ep" if op in supported else "cpu"
            if runs and runs[-1][0] == owner:
                runs[-1][1].append(op)
            else:
                runs.append((owner, [op]))
        assert parts["partitions"] == [{"owner": o, "nodes": n, "size": len(n)} for o, n in runs]
        assert parts["claimed"] == sum(op in supported for op in ops)

    settings = eprun("settings", int8, str(input_seed))
    x = np.random.default_rng(input_seed).standard_normal((64, features)).astype(np.float32)
    y = models.run(int8, x, level="ORT_DISABLE_ALL", threads=1)[0]
    assert settings["baseline"]["max_abs_output"] == pytest.approx(float(np.abs(y).max()))
    assert settings["baseline"]["mean_output"] == pytest.approx(float(y.mean()))
