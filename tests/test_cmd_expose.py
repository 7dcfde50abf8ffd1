"""Layer 10, ``expose``: the exposed model opens, runs and declares real types; its weights go
beside it byte for byte, copied or referenced, and nothing is left on failure."""
from __future__ import annotations

import os
import re

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import weighty_chain
from test_cmd_layers import oracle_boundaries, sha
from test_model_access import odd_tensors_model


def twice_named_model() -> onnx.ModelProto:
    """An invalid model onnx.load still reads: two initializers named W0 (the first one used
    by onnxruntime's rules is not the point), a small and a large one named W1."""
    from onnx import numpy_helper

    model = weighty_chain()
    rng = np.random.default_rng(9)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((40, 48)).astype(np.float32), "W0"),
        numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "W1")])
    return model


@pytest.mark.parametrize("build", [odd_tensors_model, models.residual_chain, twice_named_model])
def test_expose_writes_the_payloads_back_byte_for_byte(eprun, tmp_path, build):
    path = models.save(build(), tmp_path / "m.onnx")
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "exposed.onnx"
    answer = eprun("expose", path, out, "--boundary-ops", "MatMul,Conv")
    exposed, whole = onnx.load(str(out)), onnx.load(str(path))
    assert [value.name for value in exposed.graph.output] == answer["outputs"]
    assert out.read_bytes() == exposed.SerializeToString()  # protobuf's own field order
    del exposed.graph.output[len(whole.graph.output):]
    (mark,) = exposed.metadata_props  # eprun's mark, with a digest of the graph's nodes
    assert mark.key == "eprun"
    assert re.fullmatch(r"exposed: every layer boundary is a graph output; graph [0-9a-f]{16}",
                        mark.value)
    del exposed.metadata_props[:]
    assert exposed == whole  # weights, subgraphs and every other field as they were
    assert list((tmp_path / "out").iterdir()) == [out]  # no data file beside it


def test_expose_copies_external_data_into_another_folder(
        run_eprun_here, eprun, external_pair, tmp_path):
    """Never a second link to the user's weights: onnx 1.23 refuses a data file with more than
    one link ("potential hardlink attack"), and the user's own model would stop loading."""
    fp32 = external_pair[0]
    data = fp32.parent / "fp32.data"
    data.chmod(0o600)
    before = (data.stat().st_ino, data.read_bytes())
    out = tmp_path / "elsewhere" / "exposed.onnx"
    out.parent.mkdir()
    answer = eprun("expose", fp32, out)
    copy = out.parent / "exposed.onnx.data"  # named after the copy, not the model's location
    assert answer["external_data"] == [{"source": str(data), "file": str(copy),
                                        "how": answer["external_data"][0]["how"]}]
    assert answer["external_data"][0]["how"] in ("copy", "reflink")
    assert copy.stat().st_ino != data.stat().st_ino and data.stat().st_nlink == 1
    assert copy.read_bytes() == before[1] and copy.stat().st_mode & 0o777 == 0o600
    assert (data.stat().st_ino, data.read_bytes()) == before
    onnx.checker.check_model(onnx.load(str(fp32)))  # the user's model still loads
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == answer["outputs"]
    session.run(None, {"x": models.contract_input(0, 8)})
    # the same again is fine and says so; different data at the target is overwritten only
    # along with eprun's own exposed copy, never beside a path that holds none
    assert eprun("expose", fp32, out)["external_data"][0]["how"] == "present"
    copy.unlink()
    copy.write_bytes(b"somebody else's weights")
    other = out.parent / "other.onnx"
    (out.parent / "other.onnx.data").write_bytes(b"somebody else's weights")
    result = run_eprun_here("expose", fp32, other)
    assert result.code == 4 and "holds other data" in result.stderr
    assert (out.parent / "other.onnx.data").read_bytes() == b"somebody else's weights"
    assert not other.exists()
    assert eprun("expose", fp32, out)["external_data"][0]["how"] in ("copy", "reflink")
    assert copy.read_bytes() == before[1]
    # a hard link an older eprun left there is replaced by a copy: the original's one link back
    copy.unlink()
    os.link(data, copy)
    assert eprun("expose", fp32, out)["external_data"][0]["how"] in ("copy", "reflink")
    assert data.stat().st_nlink == 1 and copy.read_bytes() == before[1]


def test_weights_in_a_subfolder_are_copied_beside_the_copy_and_nothing_left_on_failure(
        eprun, tmp_path):
    """Weights at a relative location with a folder ("w/fp32.data"): the copy's weights go
    beside it under eprun's own name, no folder is made, and a failure leaves nothing."""
    model = weighty_chain(widths=[48, 8])
    source = tmp_path / "models"
    (source / "w").mkdir(parents=True)
    onnx.save(model, str(source / "m.onnx"), save_as_external_data=True,
              location="w/fp32.data", size_threshold=0)
    out = tmp_path / "out"
    out.mkdir()
    answer = eprun("expose", source / "m.onnx", out / "m.onnx")
    assert [entry["file"] for entry in answer["external_data"]] == [str(out / "m.onnx.data")]
    assert sorted(path.name for path in out.iterdir()) == ["m.onnx", "m.onnx.data"]
    ort.InferenceSession(str(out / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": models.contract_input(0, 40)})
    import eprun as tool

    empty = tmp_path / "empty"
    empty.mkdir()
    _, staged = tool.prepare_expose(str(source / "m.onnx"), str(empty / "m.onnx"))
    assert not list(empty.iterdir())  # staged, unnamed
    tool.discard(staged)  # what a failure before the commit does
    assert not list(empty.iterdir())


def test_expose_elsewhere_without_the_weights_file_is_a_missing_path(eprun_fails, external_pair,
                                                                    tmp_path):
    fp32 = external_pair[0]
    (fp32.parent / "fp32.data").unlink()
    (tmp_path / "out").mkdir()
    line = eprun_fails(3, "expose", fp32, tmp_path / "out" / "e.onnx")
    assert "fp32.data" in line
    assert not list((tmp_path / "out").iterdir())


def test_expose_next_to_the_model_keeps_the_references(eprun, external_pair):
    fp32 = external_pair[0]
    out = fp32.parent / "exposed.onnx"
    eprun("expose", fp32, out)
    model = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_a_linked_output_or_a_linked_data_target_is_refused(eprun_fails, external_pair,
                                                            tmp_path):
    """An output that is a link, or a link at the name its weights would get, is refused:
    either may lead to the user's own weights."""
    fp32 = external_pair[0]
    data = fp32.parent / "fp32.data"
    before = (data.stat().st_ino, data.read_bytes())
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "exposed.onnx"
    link.symlink_to(tmp_path / "real" / "exposed.onnx")
    assert "symbolic link" in eprun_fails(4, "expose", fp32, link)
    assert not list((tmp_path / "real").iterdir())
    out = tmp_path / "other"
    out.mkdir()
    (out / "exposed.onnx.data").symlink_to(data)
    assert "symbolic link" in eprun_fails(4, "expose", fp32, out / "exposed.onnx")
    assert (data.stat().st_ino, data.read_bytes()) == before  # the user's file untouched
    assert sorted(path.name for path in out.iterdir()) == ["exposed.onnx.data"]


# -- expose ------------------------------------------------------------------------------------

def test_expose_fp32_with_gemm_opens_runs_and_is_idempotent(eprun, tmp_path):
    fp32 = models.save(models.chain(gemm_layers=(1, 3)), tmp_path / "m.onnx")
    before = sha(fp32)
    out = tmp_path / "m_exposed.onnx"
    answer = eprun("expose", fp32, out)
    expected = oracle_boundaries(onnx.load(str(fp32)))
    assert expected == ["x", "relu0", "relu1", "relu2", "relu3", "y"]
    assert answer == {"model": str(fp32), "out": str(out), "boundaries": expected,
                      "outputs": ["y", *expected[:-1]]}
    assert sha(fp32) == before
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == answer["outputs"]
    x = models.contract_input(0, 8)
    results = session.run(None, {"x": x})
    np.testing.assert_array_equal(results[1], x)

    again = eprun("expose", out, tmp_path / "twice.onnx")
    assert again["boundaries"] == answer["boundaries"]
    assert again["outputs"] == answer["outputs"]
    assert onnx.load(str(tmp_path / "twice.onnx")) == onnx.load(str(out))


def test_expose_int8_declares_real_types_and_runs(eprun, lab_pair, tmp_path):
    _, int8 = lab_pair
    before = sha(int8)
    out = tmp_path / "int8_exposed.onnx"
    answer = eprun("expose", int8, out)
    model = onnx.load(str(int8))
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert answer["boundaries"] == oracle_boundaries(model)
    assert all(producers[name] == "DequantizeLinear" for name in answer["boundaries"][:-1])
    exposed = onnx.load(str(out))
    for value in exposed.graph.output:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    session.run(None, {"x": models.contract_input(1, 8)})
    assert sha(int8) == before


def test_expose_keeps_an_int8_boundary_int8(eprun, tmp_path):
    """A MatMulInteger-free graph whose MatMul reads a Cast-to-int32 tensor: declared int32."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT32),
             helper.make_node("MatMul", ["xi", "W"], ["yi"]),
             helper.make_node("Cast", ["yi"], ["y"], to=TensorProto.FLOAT)]
    w = numpy_helper.from_array(np.ones((8, 3), np.int32), "W")
    model = models.finish(nodes, [models.float_input()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    path = models.save(model, tmp_path / "int.onnx")
    eprun("expose", path, tmp_path / "out.onnx")
    outputs = {o.name: o.type.tensor_type.elem_type
               for o in onnx.load(str(tmp_path / "out.onnx")).graph.output}
    assert outputs == {"y": TensorProto.FLOAT, "xi": TensorProto.INT32}
    ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])


def test_a_boundary_op_the_model_lacks_is_said(run_eprun_here, lab_pair, tmp_path):
    """layers said so; expose was silent, and its copy has the plain boundaries."""
    fp32, _ = lab_pair
    plain = run_eprun_here("expose", fp32, tmp_path / "plain.onnx")
    asked = run_eprun_here("expose", fp32, tmp_path / "conv.onnx", "--boundary-ops", "Conv,Relux")
    assert asked.code == plain.code == 0, asked.stderr
    assert asked.answer["boundaries"] == plain.answer["boundaries"]
    assert asked.stderr.splitlines() == [
        ("eprun: note: --boundary-ops Conv, Relux: the model has no such node, so it adds no "
        "boundary; did you mean Relu?")]
    assert plain.stderr == ""
