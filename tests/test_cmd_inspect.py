"""Layer 10, ``inspect``: what a model is, from its graph, as onnx reads it."""
from __future__ import annotations

import models
import onnx
from conftest import in_process
from onnx import helper

# -- inspect: what a model is, from its graph -------------------------------------------------

def test_inspect_summarises_a_model_as_onnx_reads_it(capfd, tmp_path):
    """Symbolic dims by name, op types counted, initializer bytes and external data as
    onnx's own loader and numpy give them, and the Q/DQ structure counted by hand."""
    import json
    from collections import Counter

    from onnx import numpy_helper

    fp32 = models.chain(features=8, widths=(40, 6), seed=1, batch="batch")
    fp32.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    int8 = models.quantize(models.save(fp32, tmp_path / "inline.onnx"), tmp_path / "q.onnx",
                           seed=1)
    onnx.save(fp32, str(tmp_path / "f.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="f.data", size_threshold=64)
    for path in (tmp_path / "f.onnx", int8):
        code, out, err = in_process(capfd, "inspect", path)
        assert code == 0, err
        answer = json.loads(out)
        model = onnx.load(str(path))
        assert answer["opsets"] == {o.domain: o.version for o in model.opset_import}
        assert answer["inputs"] == [{"name": "x", "type": "float32", "shape": ["batch", 8]}]
        assert answer["outputs"][0]["name"] == "y" and answer["outputs"][0]["shape"][1] == 6
        assert answer["nodes"] == len(model.graph.node)
        assert answer["op_types"] == dict(Counter(n.op_type for n in model.graph.node))
        arrays = [numpy_helper.to_array(t) for t in model.graph.initializer]
        assert answer["initializers"] == {"count": len(arrays),
                                          "bytes": sum(a.nbytes for a in arrays)}
    fp32_answer = json.loads(in_process(capfd, "inspect", tmp_path / "f.onnx")[1])
    stored = onnx.load(str(tmp_path / "f.onnx"), load_external_data=False).graph.initializer
    external = sum(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)
    assert external == 3
    assert fp32_answer["external_data"] == [{"file": "f.data", "tensors": external,
                                             "bytes": (tmp_path / "f.data").stat().st_size}]
    assert fp32_answer["qdq"] is None
    nodes = onnx.load(str(int8)).graph.node
    dq = [n for n in nodes if n.op_type == "DequantizeLinear"]
    weights = {t.name for t in onnx.load(str(int8)).graph.initializer}
    assert answer["qdq"] == {
        "activation_pairs": sum(n.input[0] not in weights for n in dq),
        "weight_dequantizers": sum(n.input[0] in weights for n in dq),
        "wrapped_ops": {"MatMul": 2, "Add": 2}}
    code, out, _ = in_process(capfd, "inspect", int8, "--format", "table")
    assert code == 0 and "x     float32  [batch, 8]" in out
