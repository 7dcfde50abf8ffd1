"""External data, models beyond memory-friendly sizes, and bounded memory."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, imported_by, run_eprun
from test_cmd_layers import oracle_layers


def weighty_chain(seed: int = 0, widths=(48, 48, 8)) -> onnx.ModelProto:
    """A chain whose weights are large enough (over 1 KB) to be left in the file by
    load_model."""
    return models.chain(features=40, widths=list(widths), seed=seed)


def save_external(model: onnx.ModelProto, folder, name: str, data: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data, size_threshold=0)
    return path


@pytest.fixture
def external_pair(tmp_path, lab_pair):
    """The lab pair re-saved with every weight in an external data file."""
    fp32, int8 = lab_pair
    folder = tmp_path / "models"
    return (save_external(onnx.load(str(fp32)), folder, "fp32.onnx", "fp32.data"),
            save_external(onnx.load(str(int8)), folder, "int8.onnx", "int8.data"))


def test_layers_on_external_data_equal_inline(eprun, lab_pair, external_pair):
    inline = eprun("layers", *lab_pair, "3", "--local")
    external = eprun("layers", *external_pair, "3", "--local")
    assert external == inline  # --local's int8 kernels too: the same ones, on one machine
    expected = oracle_layers(*external_pair, 3)
    for got, want in zip(external["layers"], expected):
        assert got["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)
    assert eprun("settings", external_pair[1], "3") == {
        **eprun("settings", lab_pair[1], "3"), "model": str(external_pair[1])}


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
        tool.layers(str(pair[0]), str(pair[1]), 1, local=True)
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
def test_weights_never_come_from_a_same_named_file_in_the_working_directory(run_eprun_here, tmp_path, stored):
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


def test_expose_copies_external_data_into_another_folder(run_eprun_here, eprun, external_pair, tmp_path):
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


@pytest.mark.parametrize("stored", ["inline", "external"])
@pytest.mark.parametrize("command", [["partition", "MatMul"], ["expose", "{out}"]])
def test_partition_and_expose_import_neither_onnxruntime_nor_weights(lab_pair, external_pair,
                                                                     tmp_path, command, stored):
    model = (lab_pair if stored == "inline" else external_pair)[1]
    argv = [str(model)] + [a.replace("{out}", str(tmp_path / "o.onnx")) for a in command[1:]]
    code, out, imported = imported_by(command[0], *argv)
    assert code == 0
    assert "onnxruntime" not in imported, "imported onnxruntime"
    assert len(out.splitlines()) == 1


def test_only_sensitivity_imports_the_quantizer(lab_pair, tmp_path):
    """onnxruntime.quantization is slow to import and needs sympy on some releases: every
    command but sensitivity (and report --sensitivity) runs without it."""
    fp32, int8 = lab_pair
    script = (f"import sys; sys.path.insert(0, {str(EPRUN.parent)!r}); import eprun; "
              "argv = sys.argv[1:]; code = eprun.main(argv); "
              "print('onnxruntime.quantization' in sys.modules, file=sys.stderr); sys.exit(code)")
    for argv, imported in ((["layers", fp32, int8, "1"], False),
                           (["report", fp32, int8, "--out-dir", tmp_path / "s", "--sensitivity"],
                            True),
                           (["report", fp32, int8, "--out-dir", tmp_path / "r"], False),
                           (["check", fp32, int8, "--atol", "100", "--min-cos", "-1"], False),
                           (["sensitivity", fp32, int8, "1", "--max-units", "1"], True)):
        result = subprocess.run([sys.executable, "-c", script, *map(str, argv)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stderr.splitlines()[-1] == str(imported), (argv, result.stderr)


def test_max_memory_gives_the_same_answer(tmp_path, monkeypatch, capfd):
    """--max-memory fetches the boundaries in batches, each from sessions opened for it, and
    the answer is the one fetched at once. At 1000 rows a boundary of this 24-wide chain holds
    about 190 KB (fp32 and int8 together): 1 MB fits a few in a batch, 0 fits one. The plan
    and the sessions opened for it show that each run really was split that way.
    (Every batch's sessions expose every boundary, so each kernel, the int8 ones of --local's
    segments included, sees the graph it sees unsplit: equal bit for bit on any CPU.)"""
    import eprun as tool

    fp32 = models.save(models.chain(features=16, widths=[24] * 30 + [8], seed=5),
                       tmp_path / "deep.onnx")
    int8 = models.quantize(fp32, tmp_path / "deep_q.onnx", seed=6)
    plans, opened = [], []
    plan, session = tool.plan_batches, tool.PairedModel.session
    monkeypatch.setattr(tool, "plan_batches", lambda *args: plans.append(plan(*args)) or plans[-1])
    monkeypatch.setattr(tool.PairedModel, "session", lambda self, *args, **kwargs: (
        opened.append(self.path), session(self, *args, **kwargs))[1])

    def growth(*budget: str) -> tuple[dict, list, int]:
        plans.clear()
        opened.clear()
        argv = ["growth", str(fp32), str(int8), "2", "--local", "--rows", "1000", *budget]
        assert tool.main(argv) == 0
        (batches,) = plans
        return json.loads(capfd.readouterr().out), batches, len(opened)

    whole, batches, sessions = growth()
    assert whole["layer_count"] == 32  # 31 MatMul inputs and the output
    assert batches == [list(range(32))]
    for budget in ("0", "1"):
        split, batches, split_sessions = growth("--max-memory", budget)
        assert [k for batch in batches for k in batch] == list(range(32))
        if budget == "0":  # one boundary at a time
            assert len(batches) == 32
        else:  # several batches, of several boundaries
            assert 1 < len(batches) < 32
        # each batch more opens its own fp32 and int8 sessions
        assert split_sessions - sessions == 2 * (len(batches) - 1)
        assert split == whole


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
def test_a_loop_body_weight_in_external_data_is_read_from_the_models_folder(run_eprun_here, tmp_path,
                                                                           monkeypatch,
                                                                           body_only):
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
