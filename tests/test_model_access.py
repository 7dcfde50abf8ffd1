"""Layer 3, model access: loading, the wire walker against protobuf, the graph index, external
data (where each payload sits, what is read and from where, links and same-named decoys), value
types, models over 2 GB, and models that change or are cut short while they are read."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, one_error_line, weighty_chain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_cmd_layers import oracle_layers
from test_io_safety import in_process, refused, snapshot
from test_measurement import quantized_graph

import eprun as tool


def test_layers_on_external_data_equal_inline(eprun, lab_pair, external_pair):
    inline = eprun("layers", *lab_pair, "3", "--local")
    external = eprun("layers", *external_pair, "3", "--local")
    assert external == inline  # --local's int8 kernels too: the same ones, on one machine
    expected = oracle_layers(*external_pair, 3)
    for got, want in zip(external["layers"], expected):
        assert got["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)
    assert eprun("settings", external_pair[1], "3") == {
        **eprun("settings", lab_pair[1], "3"), "model": str(external_pair[1])}


@pytest.mark.parametrize("argv", [["layers", "{fp32}", "{int8}", "1"],
                                  ["weights", "{fp32}", "{int8}"],
                                  ["sensitivity", "{fp32}", "{int8}", "1"]])
def test_a_missing_external_data_file_is_a_missing_path(eprun_fails, external_pair, argv):
    """Weights whose data file is gone: exit 3, the file named, before any is read."""
    fp32, int8 = external_pair
    (int8.parent / "int8.data").unlink()
    line = eprun_fails(3, *[word.format(fp32=fp32, int8=int8) for word in argv])
    assert line == (f"eprun: error: external data file {str(int8.parent / 'int8.data')!r} "
                    "does not exist; check the path")


def test_layers_does_not_read_weights_into_python(external_pair, monkeypatch):
    """Neither onnx.load nor the tensor converter is ever asked for a weight."""
    from onnx import numpy_helper

    import eprun as tool

    loads, converted = [], []
    original_load, original_to_array = onnx.load, numpy_helper.to_array

    def load(path, *args, **kwargs):
        loads.append(kwargs.get("load_external_data", True))
        return original_load(path, *args, **kwargs)

    def to_array(tensor, *args, **kwargs):
        converted.append(tensor.name)
        return original_to_array(tensor, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", load)
    monkeypatch.setattr(numpy_helper, "to_array", to_array)
    for pair in (external_pair, tuple(path.parent / f"inline_{path.name}"
                                      for path in external_pair)):
        if pair is not external_pair:  # the same weights, inline in each model file
            for source, target in zip(external_pair, pair):
                onnx.save(original_load(str(source)), str(target))
        tool.layers(str(pair[0]), str(pair[1]), 1, tool.LayerOptions(local=True))
        weights = {tensor.name for path in pair for tensor in original_load(
            str(path), load_external_data=False).graph.initializer if len(tensor.dims) == 2}
        assert weights and not any(loads) and not weights & set(converted)


def test_a_linked_model_file_is_read_where_it_resolves(tmp_path, monkeypatch):
    """onnxruntime refuses weights whose location resolves outside the folder it is given;
    a model file that is a link gets the folder of its target."""
    import eprun as tool

    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    fp32 = models.save(weighty_chain(), tmp_path / "fp32.onnx")
    models.quantize(fp32, tmp_path / "real" / "int8.onnx")
    (tmp_path / "links" / "int8.onnx").symlink_to(tmp_path / "real" / "int8.onnx")
    mapped = []
    original = tool._map_external
    monkeypatch.setattr(tool, "_map_external", lambda *args: mapped.append(args) or original(
        *args))
    linked = tool.layers(str(fp32), str(tmp_path / "links" / "int8.onnx"), 2)
    direct = tool.layers(str(fp32), str(tmp_path / "real" / "int8.onnx"), 2)
    assert linked["layers"] == direct["layers"] and linked["layer_count"] == 4
    if tool.ort_release() >= tool._FOLDER_OPTION_SINCE:  # nothing mapped by eprun
        assert mapped == []


@pytest.mark.parametrize("stored", ["inline", "external"])
def test_weights_never_come_from_a_same_named_file_in_the_working_directory(
        run_eprun_here, tmp_path, stored):
    """onnxruntime before 1.21 ignores the folder option and resolves the external data of a
    model given as bytes against the working directory: a file there with the same name but
    other weights must not be read."""
    def pair(folder, seed):
        folder.mkdir()
        model = weighty_chain(seed)
        path = folder / "fp32.onnx"
        if stored == "inline":
            models.save(model, path)
        else:
            onnx.save(model, str(path), save_as_external_data=True, location="fp32.data",
                      size_threshold=0)
        models.quantize(path, folder / "int8.onnx", seed=seed)
        return path, folder / "int8.onnx"

    wanted, decoy = pair(tmp_path / "models", 1), pair(tmp_path / "here", 2)
    elsewhere = run_eprun_here("layers", *wanted, "3", cwd=str(tmp_path))
    among_decoys = run_eprun_here("layers", *wanted, "3", cwd=str(decoy[0].parent))
    assert elsewhere.code == 0 and among_decoys.code == 0, among_decoys.stderr
    assert among_decoys.answer == elsewhere.answer
    for got, want in zip(elsewhere.answer["layers"], oracle_layers(*wanted, 3)):
        assert got["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)


# -- the graph without its weights, and the weights back --------------------------------------

def odd_tensors_model() -> onnx.ModelProto:
    """Initializers in every form load_model must tell apart: large raw payloads of several
    types, one with a field after raw_data (doc_string), small ones, a large one in float_data
    (no raw_data), float16, and a subgraph with its own initializer."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")
    w.doc_string = "a field numbered after raw_data"
    listed = helper.make_tensor("listed", TensorProto.FLOAT, [32, 16],
                                rng.standard_normal(512).astype(np.float32).tolist())
    half = numpy_helper.from_array(rng.standard_normal((16, 64)).astype(np.float16), "half")
    table = numpy_helper.from_array(np.arange(600, dtype=np.int64).reshape(300, 2), "table")
    shape = numpy_helper.from_array(np.array([-1, 16], np.int64), "shape")
    branch = helper.make_graph(
        [helper.make_node("Add", ["m2", "inner"], ["branch_out"])], "branch", [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(16, np.float32), "inner")])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m1"]),
             helper.make_node("MatMul", ["m1", "listed"], ["m2"]),
             helper.make_node("Reshape", ["m2", "shape"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["chosen"], then_branch=branch,
                              else_branch=branch),
             helper.make_node("Cast", ["half"], ["half32"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["chosen", "half32"], ["y"]),
             helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)]
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    model = models.finish(
        nodes, [models.float_input("x", 16),
                helper.make_tensor_value_info("ids", TensorProto.INT64, ["K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64]),
         helper.make_tensor_value_info("rows", TensorProto.INT64, ["K", 2])],
        [w, listed, half, table, shape, zero])
    onnx.checker.check_model(model)
    return model


def resolve_references(model: onnx.ModelProto, folder) -> onnx.ModelProto:
    """Every external reference of ``model`` replaced by the bytes it names, read here with
    plain file reads (the oracle shares nothing with eprun)."""
    from onnx import TensorProto

    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        where = {entry.key: entry.value for entry in tensor.external_data}
        with open(folder / where["location"], "rb") as stream:
            stream.seek(int(where["offset"]))
            tensor.raw_data = stream.read(int(where["length"]))
        tensor.ClearField("external_data")
        tensor.ClearField("data_location")
    return model


@pytest.mark.parametrize("which", ["odd tensors", "chain", "int8 chain"])
def test_the_graph_refers_to_each_payload_where_it_sits(tmp_path, which):
    import eprun as tool

    path = tmp_path / "m.onnx"
    if which == "odd tensors":
        models.save(odd_tensors_model(), path)
    else:
        fp32 = models.save(weighty_chain(), tmp_path / "f.onnx")
        if which == "chain":
            path = fp32
        else:
            models.quantize(fp32, path)
    parsed = tool.load_model(str(path))
    whole = onnx.load(str(path))
    refers = [tensor.name for tensor in parsed.graph.initializer if tensor.external_data]
    large = [tensor.name for tensor in whole.graph.initializer if len(tensor.raw_data) >= 1024]
    assert refers == large and large
    payloads = sum(len(tensor.raw_data) for tensor in whole.graph.initializer
                   if tensor.name in large)
    assert parsed.ByteSize() < path.stat().st_size - payloads + 80 * len(large)  # references
    assert resolve_references(parsed, tmp_path) == whole
    onnx.save(whole, str(tmp_path / "copy.onnx"))  # any file name: the references follow it
    assert resolve_references(tool.load_model(str(tmp_path / "copy.onnx")), tmp_path) == whole


def test_dims_written_packed_are_read_too(tmp_path):
    """proto2 writes repeated dims one varint each; other writers may pack them into one
    length-delimited field, which protobuf parsers also read."""
    import eprun as tool

    model = weighty_chain(widths=[48, 8])
    plain = model.SerializeToString()
    unpacked = bytes([0x08, 40, 0x08, 48, 0x10, 1])  # dims 40, dims 48, data_type FLOAT
    assert plain.count(unpacked) == 1  # W0 [40, 48]
    path = tmp_path / "packed.onnx"
    path.write_bytes(plain.replace(unpacked, bytes([0x0A, 2, 40, 48, 0x10, 1])))
    assert onnx.load(str(path)) == model  # the same model to protobuf
    parsed = tool.load_model(str(path))
    w0 = next(tensor for tensor in parsed.graph.initializer if tensor.name == "W0")
    assert list(w0.dims) == [40, 48] and w0.external_data  # referenced, not parsed
    assert resolve_references(parsed, tmp_path) == model


def test_a_payload_of_the_wrong_length_is_refused_not_misread(eprun_fails, tmp_path):
    """raw_data 4 bytes short of its dims: not referenced (the next field's bytes would be
    read as weights), so onnxruntime refuses it as it refuses the file."""
    model = weighty_chain()
    weight = next(tensor for tensor in model.graph.initializer if tensor.name == "W1")
    weight.raw_data = weight.raw_data[:-4]
    bad = models.save(model, tmp_path / "bad.onnx")
    int8 = tmp_path / "int8.onnx"
    models.quantize(models.save(weighty_chain(),
                                tmp_path / "good.onnx"), int8)
    line = eprun_fails(4, "layers", bad, int8, "1")
    assert "onnxruntime cannot open" in line


def test_a_model_file_that_changed_since_its_graph_was_read_is_refused(tmp_path, monkeypatch):
    import eprun as tool

    path = models.save(weighty_chain(1), tmp_path / "m.onnx")
    other = models.save(weighty_chain(2), tmp_path / "o.onnx")
    model = tool.load_model(str(path))
    tool.expose_in_place(model)
    os.replace(other, path)
    with pytest.raises(tool.EprunError, match="changed while eprun was reading it"):
        tool.open_exposed(model, str(path))
    # expose: the file is replaced after its graph is read, before the copy is written
    original = tool.expose_in_place

    def then_replaced(*args, **kwargs):
        answer = original(*args, **kwargs)
        models.save(weighty_chain(3), tmp_path / "n.onnx")
        os.replace(tmp_path / "n.onnx", path)
        return answer

    monkeypatch.setattr(tool, "expose_in_place", then_replaced)
    with pytest.raises(tool.EprunError, match="changed while eprun was reading it"):
        tool.expose(str(path), str(tmp_path / "e.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_file_name_that_cannot_be_a_location_is_parsed_whole(eprun, tmp_path):
    """The references name the model file itself; a name onnxruntime would refuse as a
    location (it reads a backslash as a separator) is parsed the ordinary way."""
    fp32 = models.save(weighty_chain(), tmp_path / "..\\m.onnx")
    plain = models.save(weighty_chain(), tmp_path / "m.onnx")
    int8 = tmp_path / "int8.onnx"
    models.quantize(plain, int8)
    assert eprun("layers", fp32, int8, "1") == eprun("layers", plain, int8, "1")


def test_files_the_walk_does_not_take_are_parsed_as_before(eprun, eprun_fails, tmp_path):
    """A text-format model, a graph given twice (protobuf merges) and a truncated file."""
    import eprun as tool

    model = weighty_chain(widths=[48, 8])
    text = tmp_path / "m.textproto"
    text.write_text(str(model))  # protobuf's text format
    assert tool.load_model(str(text)) == model
    twice = tmp_path / "twice.onnx"
    half = len(model.graph.node) // 2
    first, second = onnx.ModelProto(), onnx.ModelProto()
    first.CopyFrom(model)
    second.graph.node.extend(first.graph.node[half:])
    del first.graph.node[half:]
    twice.write_bytes(first.SerializeToString() + second.SerializeToString())
    assert tool.load_model(str(twice)) == model
    whole = models.save(model, tmp_path / "whole.onnx")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(whole.read_bytes()[:-7])
    assert "is not a loadable ONNX model" in eprun_fails(4, "partition", cut, "MatMul")


def test_a_model_cut_short_while_its_graph_is_read_is_exit_4(tmp_path):
    """The walk reads the file by offsets, not through a memory map: a file truncated under
    it gives a short read and one error line, where a map killed eprun with SIGBUS."""
    path = models.save(weighty_chain(widths=[256, 256, 8]), tmp_path / "m.onnx")
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(EPRUN.parent)!r})\n"
        "import eprun as tool\n"
        "tool._READ_WHOLE_BYTES = 0  # read on demand, as a large model is\n"
        "path = sys.argv[1]\n"
        "original = tool._graph_with_references\n"
        "def cut(data, location):\n"
        "    os.truncate(path, os.path.getsize(path) // 2)  # shrinks under the walk\n"
        "    return original(data, location)\n"
        "tool._graph_with_references = cut\n"
        "sys.exit(tool.main(['partition', path, 'MatMul']))\n")
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 4, (result.returncode, result.stderr)
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert "is not a loadable ONNX model" in result.stderr


@pytest.mark.parametrize("moment", ["open", "run"])
def test_external_data_cut_short_while_layers_reads_it_is_exit_4(external_pair, moment):
    """A data file cut short before a session opens, or before one runs (onnxruntime maps the
    weights files it reads, and a page past the new end is SIGBUS, which once ended eprun
    without a word): exit 4 with one line naming the file, as the command line runs it."""
    fp32, int8 = external_pair
    data = [str(path.parent / f"{path.stem}.data") for path in (fp32, int8)]
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(EPRUN.parent)!r})\n"
        "import eprun as tool, onnxruntime as ort\n"
        "moment, files = sys.argv[1], sys.argv[4:]\n"
        "def wrap(name):\n"
        "    original = getattr(ort.InferenceSession, name)\n"
        "    def wrapped(*args, **kwargs):\n"
        "        if name == {'open': '__init__', 'run': 'run'}[moment]:\n"
        "            for path in files:\n"
        "                os.truncate(path, 0)\n"
        "        return original(*args, **kwargs)\n"
        "    setattr(ort.InferenceSession, name, wrapped)\n"
        "wrap('__init__')\n"
        "wrap('run')\n"
        "sys.argv = ['eprun', 'layers', sys.argv[2], sys.argv[3], '1']\n"
        "tool.cli()\n")
    result = subprocess.run([sys.executable, "-c", script, moment, str(fp32), str(int8), *data],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, (result.returncode, result.stderr)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("eprun: error: '") and "changed while eprun was reading it" in line
    assert any(repr(os.path.abspath(path)) in line for path in data)


def loop_model() -> onnx.ModelProto:
    """x -> MatMul -> Loop (3 times MatMul by its body's own weight Wb) -> y."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "Wb"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) / 3, "Wb")])
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W0")]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["a"]),
             helper.make_node("Loop", ["trip", "cond", "a"], ["y"], body=body)]
    return models.finish(nodes, [models.float_input("x", 8)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits)


@pytest.mark.parametrize("body_only", [False, True])
def test_a_loop_body_weight_in_external_data_is_read_from_the_models_folder(
        run_eprun_here, tmp_path, monkeypatch, body_only):
    """onnxruntime looks for a body's external weights relative to the working directory
    (before 1.21, and on any release when the main graph has no external data): a same-named
    file there, holding other weights, must not be read."""
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "loop.onnx"
    model = loop_model()
    if body_only:  # only the body's weight outside the file
        from onnx.external_data_helper import set_external_data

        body = model.graph.node[1].attribute[0].g
        (folder / "loop.data").write_bytes(body.initializer[0].raw_data)
        set_external_data(body.initializer[0], "loop.data")
        body.initializer[0].ClearField("raw_data")
        body.initializer[0].data_location = onnx.TensorProto.EXTERNAL
        onnx.save(model, str(path))
    else:
        onnx.save(model, str(path), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="loop.data", size_threshold=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "loop.data").write_bytes((folder / "loop.data").read_bytes()[::-1])  # decoy
    monkeypatch.chdir(elsewhere)
    result = run_eprun_here("layers", path, path, "2", "--metrics", "sqnr")
    assert result.code == 0, result.stderr
    x = models.contract_input(2, 8)
    expected = models.run(path, x)[0]
    assert result.answer["layers"][-1]["scale"] == pytest.approx(
        float(np.abs(expected).max()), rel=1e-6)
    # a command that hands onnxruntime the path: the body's data is found beside the model
    # (it was looked for beside /proc/self/fd/N where only the body had external data)
    checked = run_eprun_here("check", path, path, "--seed", "2")
    assert checked.code == 0 and checked.answer["passed"], checked.stderr


def test_every_external_location_of_a_graph_is_found_where_onnx_finds_it(tmp_path):
    """Initializers of the graph and of a subgraph, and a Constant's value inside it: the
    wire walk finds each location onnx's own helper lists."""
    from onnx.external_data_helper import _get_all_tensors, set_external_data

    model = loop_model()
    body = model.graph.node[1].attribute[0].g
    body.node.append(helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
        np.arange(16, dtype=np.float32), "k")))
    tensors = [model.graph.initializer[0], body.initializer[0], body.node[-1].attribute[0].t]
    for k, tensor in enumerate(tensors):
        (tmp_path / f"w{k}.bin").write_bytes(tensor.raw_data or
                                             numpy_helper.to_array(tensor).tobytes())
        set_external_data(tensor, f"w{k}.bin")
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    theirs = sorted(entry.value for tensor in _get_all_tensors(onnx.load(str(path),
                                                                         load_external_data=False))
                    for entry in tensor.external_data if entry.key == "location")
    assert theirs == ["w0.bin", "w1.bin", "w2.bin"]
    assert sorted(tool.external_locations(str(path))) == theirs


def test_an_undefined_declared_type_is_filled_from_the_graph():
    """A value_info that names a tensor but not its element type (0) says nothing: the type
    comes from the node that writes it (QLinearConcat writes its uint8 operands' type)."""
    model = quantized_graph()
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None))
    assert tool.tensor_types(model)["c"].tensor_type.elem_type == TensorProto.UINT8


def qgemm_model(inputs: list[str], declared: int):
    """y = QGemm(a, ...) of onnxruntime's domain, with ``inputs`` of A (uint8), its scale and
    zero point, B (int8), its scale and zero point, C, y_scale and an int8 y_zero_point;
    ``y`` declared ``declared``."""
    def const(name, dtype, values, dims=()):
        return helper.make_tensor(name, dtype, list(dims), values)

    node = helper.make_node("QGemm", inputs, ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node], "qgemm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 3])],
        [helper.make_tensor_value_info("y", declared, None)],
        [const("a_scale", TensorProto.FLOAT, [0.5]), const("a_zero", TensorProto.UINT8, [3]),
         const("b", TensorProto.INT8, [1, 2, 3, 4, 5, 6], (3, 2)),
         const("b_scale", TensorProto.FLOAT, [0.25]), const("b_zero", TensorProto.INT8, [0]),
         const("y_scale", TensorProto.FLOAT, [0.1]), const("y_zero", TensorProto.INT8, [-2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)  # onnx's default may exceed what onnxruntime opens


QGEMM_OPERANDS = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero"]


@pytest.mark.parametrize("inputs", [QGEMM_OPERANDS, [*QGEMM_OPERANDS, ""],
                                    [*QGEMM_OPERANDS, "", "y_scale"],
                                    [*QGEMM_OPERANDS, "", "y_scale", ""],
                                    [*QGEMM_OPERANDS, "", "y_scale", "y_zero"]],
                         ids=["no-C", "empty-C", "no-zero-point", "empty-zero-point", "int8-output"])
def test_a_qgemm_output_has_the_type_onnxruntime_gives_it(inputs):
    """A QGemm without an output zero point writes float, with one the zero point's type (here
    int8, although A is uint8): the type onnxruntime's own graph check accepts as y's declared
    type, and the one eprun fills in where the model declares none."""
    accepted = []
    for declared in (TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8):
        try:
            ort.InferenceSession(qgemm_model(inputs, declared).SerializeToString(),
                                 providers=["CPUExecutionProvider"])
        except Exception as error:  # a type the schema rejects, or no kernel for this mix
            if "Type Error" in str(error):
                continue
        accepted.append(declared)
    assert len(accepted) == 1
    filled = tool.tensor_types(qgemm_model(inputs, TensorProto.UNDEFINED))["y"]
    assert filled.tensor_type.elem_type == accepted[0]


@pytest.mark.parametrize("dims", [None, [], [3], [0, 2], ["batch", None, 4]])
def test_tensor_type_is_the_one_onnx_helper_makes(dims):
    from onnx import helper

    made = tool.tensor_type(7, dims)
    assert made.SerializeToString() == helper.make_tensor_type_proto(7, dims).SerializeToString()
    assert made.tensor_type.HasField("shape") is (dims is not None)


def test_external_locations_read_as_onnx_reads_them():
    """As onnx 1.17+ reads them: offset and length are integers where given, a negative or
    empty one is refused. Older onnx kept an empty offset as text and took -1; eprun refuses
    both there too (onnxruntime does), so onnx itself is the oracle only where it refuses."""
    import warnings

    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    cases = [({"location": "w.bin", "offset": "4096", "length": "64"}, ("w.bin", 4096, 64)),
             ({"location": "w.bin"}, ("w.bin", None, None)),
             ({"location": "w.bin", "offset": "0", "checksum": "x"}, ("w.bin", 0, None)),
             ({"location": "w.bin", "offset": "", "length": "3"}, "invalid literal"),
             ({"location": "w.bin", "offset": "-1"}, "offset must be non-negative"),
             ({"location": "w.bin", "length": "x"}, "invalid literal")]
    for entries, expected in cases:
        tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16],
                             data_location=TensorProto.EXTERNAL)
        for key, value in entries.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        try:
            theirs = ExternalDataInfo(tensor)
        except ValueError as exc:
            theirs = str(exc)
        if isinstance(expected, str):
            with pytest.raises(ValueError, match=expected) as ours:
                tool._external_location(tensor)
            assert not isinstance(theirs, str) or str(ours.value) == theirs \
                or "invalid literal" in theirs
            continue
        ours = tool._external_location(tensor)
        assert (ours.location, ours.offset, ours.length) == expected
        assert (theirs.location, theirs.offset, theirs.length) == expected
    tensor = TensorProto(name="w", data_location=TensorProto.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "__class__", "w.bin"  # a key is never taken as an attribute
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tool._external_location(tensor).location == ""
    for tensor in (TensorProto(name="a"), TensorProto(name="b", data_location=1),
                   TensorProto(name="c", data_location=TensorProto.EXTERNAL)):
        assert tool.uses_external_data(tensor) is uses_external_data(tensor)


def test_a_graph_with_a_cycle_is_refused(run_eprun_here, tmp_path):
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Relu", ["x"], ["y"], name="free")]
    path = models.save(models.finish(nodes, [models.float_input("x", 4)],
                                     [helper.make_tensor_value_info("y", 1, ["N", 4])]),
                       tmp_path / "cycle.onnx")
    line = one_error_line(run_eprun_here("partition", path, "Relu", "--rule", "ort"), 4)
    assert "the graph has a cycle" in line
    # a node that reads its own output is the shortest cycle
    nodes = [helper.make_node("Add", ["x", "a"], ["a"], name="self"),
             helper.make_node("Relu", ["a"], ["y"], name="after")]
    path = models.save(models.finish(nodes, [models.float_input("x", 4)],
                                     [helper.make_tensor_value_info("y", 1, ["N", 4])]),
                       tmp_path / "self_loop.onnx")
    for supported in ("Add", "Relu"):
        line = one_error_line(run_eprun_here("partition", path, supported, "--rule", "ort"), 4)
        assert "the graph has a cycle (node 'self'" in line


# == R7 a model that changes under eprun ========================================================

@pytest.mark.parametrize("changes", [True, False])
@pytest.mark.parametrize("command", ["layers", "settings"])
def test_a_model_replaced_while_sessions_open_is_refused(capfd, monkeypatch, tmp_path, command,
                                                         changes):
    widths = (64, 64, 64)
    model = models.save(models.chain(features=64, widths=widths, seed=5), tmp_path / "m.onnx")
    quantized = models.quantize(model, tmp_path / "q.onnx", seed=1)
    other = models.save(models.chain(features=64, widths=widths, seed=6), tmp_path / "o.onnx")
    real = ort.InferenceSession

    class Replacing(real):
        """The first session opened finds the model file replaced: same graph, other
        weights."""

        def __init__(self, *args, **kwargs):
            if changes and other.exists():
                os.replace(other, model)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Replacing)
    argv = (["layers", model, quantized, "1"] if command == "layers"
            else ["settings", model, "1"])
    result = in_process(capfd, *argv)
    if changes:
        assert not other.exists()  # it did change under eprun
        assert "changed" in refused(result)
    else:
        assert result.code == 0, result.stderr


# == C10 clean errors ===========================================================================

@pytest.mark.parametrize("command", ["layers", "settings", "expose"])
def test_an_initializer_without_data_is_one_clean_line(capfd, tmp_path, command):
    empty = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 4])
    model = models.save(models.finish(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [models.float_input("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [empty]),
        tmp_path / "empty.onnx")
    argv = {"layers": ["layers", model, model, "1"], "settings": ["settings", model, "1"],
            "expose": ["expose", model, tmp_path / "exposed.onnx"]}[command]
    before = snapshot(tmp_path)
    refused(in_process(capfd, *argv))
    assert snapshot(tmp_path) == before


# == a model over 2 GB in one file ==============================================================

def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _length_field(number: int, length: int) -> bytes:
    return _varint(number << 3 | 2) + _varint(length)


@pytest.fixture(scope="module")
def over_2gb(tmp_path_factory) -> Path:
    """ReduceSum(big) + x, with ``big`` 2.1 GiB of float zeros inline: protobuf refuses the
    file (its 2 GiB limit). Written sparse: the payload's bytes are never on disk."""
    count = (1 << 31) // 4 + 1024  # float elements, just over 2 GiB of them
    tensor = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[count // 4, 4])
    tensor_bytes = tensor.SerializeToString() + _length_field(9, count * 4)  # raw_data
    tensor_length = len(tensor_bytes) + count * 4
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["big"], ["total"], name="sum", keepdims=1),
         helper.make_node("Add", ["x", "total"], ["y"], name="add")], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])]).SerializeToString()
    graph_length = len(graph) + len(_length_field(5, tensor_length)) + tensor_length
    model = helper.make_model(helper.make_graph([], "empty", [], []),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ClearField("graph")
    path = tmp_path_factory.mktemp("over_2gb") / "big.onnx"
    with open(path, "wb") as stream:
        stream.write(model.SerializeToString() + _length_field(7, graph_length) + graph
                     + _length_field(5, tensor_length) + tensor_bytes)
        stream.truncate(stream.tell() + count * 4)
    assert os.path.getsize(path) > 1 << 31
    return path


def test_partition_walks_a_model_over_2gb(capfd, over_2gb):
    result = in_process(capfd, "partition", over_2gb, "Add")
    assert result.code == 0, result.stderr
    assert result.answer["nodes"] == 2 and result.answer["partitions"] == [
        {"owner": "cpu", "nodes": ["ReduceSum"], "size": 1},
        {"owner": "ep", "nodes": ["Add"], "size": 1}]


def test_where_onnxruntime_cannot_load_over_2gb_the_error_says_so(capfd, over_2gb):
    line = refused(in_process(capfd, "settings", over_2gb, "1"))
    assert "past protobuf's 2 GiB limit" in line and "save_as_external_data=True" in line


# -- the wire walker against protobuf ------------------------------------------------------------

def _padded_varint(value: int, extra: int) -> bytes:
    """``value`` as a varint ``extra`` bytes longer than it needs (protobuf's limit for tags
    and lengths is 5 bytes in all)."""
    encoded = bytearray(tool._encode_varint(value))
    if extra:
        encoded[-1] |= 0x80
        encoded += b"\x80" * (extra - 1) + b"\x00"
    return bytes(encoded)


def _fields(data: bytes, start: int, end: int) -> list[tuple[int, int, bytes]]:
    return [(number, wire, data[value_at:field_end])
            for number, wire, _, value_at, field_end in tool._wire_fields(data, start, end)]


def _encode(fields: list, pad: dict) -> bytes:
    """Fields back to bytes; ``pad`` (field index -> (tag extra, length extra)) makes a tag
    or a length overlong."""
    out = bytearray()
    for index, (number, wire, value) in enumerate(fields):
        tag_extra, length_extra = pad.get(index, (0, 0))
        out += _padded_varint(number << 3 | wire, tag_extra)
        if wire == 2:
            out += _padded_varint(len(value), length_extra)
        out += value
    return bytes(out)


def _inlined(model, path) -> onnx.ModelProto:
    """The walker's model with each payload it left in the file read back inline."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data = path.read_bytes()
    for tensor in copy.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            where = {entry.key: entry.value for entry in tensor.external_data}
            assert where["location"] == path.name
            offset, length = int(where["offset"]), int(where["length"])
            tensor.raw_data = data[offset:offset + length]
            del tensor.external_data[:]
            tensor.ClearField("data_location")
    return copy


@pytest.fixture(scope="module")
def walked_model() -> bytes:
    """A small model with one payload large enough for the walker to leave in the file."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W"),
             numpy_helper.from_array(np.ones(32, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    model = models.finish(nodes, [models.float_input("x", 16)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])],
                          inits)
    return model.SerializeToString()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_wire_walker_accepts_only_what_protobuf_accepts(walked_model, tmp_path, data):
    """Differential: whatever the walker reads, protobuf reads the same (and where the walker
    gives up, protobuf decides). Files with overlong tags and lengths (6-10-byte varints,
    which protobuf, onnx and onnxruntime refuse), random bytes and truncations."""
    top = _fields(walked_model, 0, len(walked_model))
    graph_at = next(index for index, (number, _, _) in enumerate(top) if number == 7)
    graph = _fields(top[graph_at][2], 0, len(top[graph_at][2]))
    kind = data.draw(st.sampled_from(["overlong", "bytes", "truncated"]))
    if kind == "overlong":
        extra = (data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6)))
        inner = data.draw(st.integers(0, len(graph) - 1))
        outer = data.draw(st.integers(0, len(top) - 1))
        if data.draw(st.booleans()):  # a field of the graph (an initializer, a node)
            top[graph_at] = (7, 2, _encode(graph, {inner: extra}))
            blob = _encode(top, {})
        else:
            blob = _encode(top, {outer: extra})
    elif kind == "bytes":
        blob = bytearray(walked_model)
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    else:
        blob = walked_model[:data.draw(st.integers(0, len(walked_model) - 1))]
    path = tmp_path / "walked.onnx"
    path.write_bytes(blob)
    walked = tool._read_graph(str(path))
    if blob == walked_model:
        assert walked is not None  # a walker that always gave up would pass the rest
    if walked is None:
        return  # the ordinary parse decides, as it would without the walker
    parsed = onnx.load(str(path), load_external_data=False)  # raises where protobuf refuses
    assert _inlined(walked, path) == parsed
