"""External data, models beyond memory-friendly sizes, and bounded memory."""
from __future__ import annotations

import sys

import models
import onnx
import onnxruntime as ort
import pytest
from conftest import EPRUN, run_eprun
from test_commands import oracle_layers


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
    assert external == inline
    expected = oracle_layers(*external_pair, 3)
    for got, want in zip(external["layers"], expected):
        assert got["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)
    assert eprun("settings", external_pair[1], "3") == {
        **eprun("settings", lab_pair[1], "3"), "model": str(external_pair[1])}


def test_layers_does_not_read_weights_into_python(external_pair, monkeypatch):
    """onnx.load is only ever asked for the graph, never the external data."""
    import eprun as tool

    calls = []
    original = onnx.load

    def spy(path, *args, **kwargs):
        calls.append(kwargs.get("load_external_data", True))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", spy)
    tool.layers(str(external_pair[0]), str(external_pair[1]), 1, local=True)
    assert calls and not any(calls)


def test_expose_links_external_data_into_another_folder(eprun, external_pair, tmp_path):
    fp32 = external_pair[0]
    data = fp32.parent / "fp32.data"
    before = (data.stat().st_ino, data.read_bytes())
    out = tmp_path / "elsewhere" / "exposed.onnx"
    out.parent.mkdir()
    answer = eprun("expose", fp32, out)
    linked = out.parent / "fp32.data"
    assert linked.stat().st_ino == data.stat().st_ino  # a hard link, not a copy
    assert (data.stat().st_ino, data.read_bytes()) == before
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == answer["outputs"]
    session.run(None, {"x": models.contract_input(0, 8)})
    # the same again is fine; different data already at the target is never overwritten
    eprun("expose", fp32, out)
    linked.unlink()
    linked.write_bytes(b"somebody else's weights")
    result = run_eprun("expose", fp32, out)
    assert result.code == 4 and "holds other data" in result.stderr
    assert linked.read_bytes() == b"somebody else's weights"


def test_expose_next_to_the_model_keeps_the_references(eprun, external_pair):
    fp32 = external_pair[0]
    out = fp32.parent / "exposed.onnx"
    eprun("expose", fp32, out)
    model = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("command", [["partition", "MatMul"], ["expose", "{out}"]])
def test_partition_and_expose_import_neither_onnxruntime_nor_weights(external_pair, tmp_path,
                                                                     command):
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(EPRUN)!r}] + sys.argv[1:]\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'onnxruntime' not in sys.modules, 'imported onnxruntime'\n")
    argv = [str(external_pair[1])] + [a.replace("{out}", str(tmp_path / "o.onnx"))
                                      for a in command[1:]]
    result = run_eprun(command[0], *argv, prefix=[sys.executable, "-c", code])
    assert result.code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_nothing_imports_the_quantizer():
    source = (EPRUN).read_text()
    assert "onnxruntime.quantization" not in source


def test_max_memory_gives_the_same_answer(eprun, tmp_path):
    fp32 = models.save(models.chain(features=16, widths=[24] * 30 + [8], seed=5),
                       tmp_path / "deep.onnx")
    int8 = tmp_path / "deep_q.onnx"
    models.quantize(fp32, int8, seed=6)
    whole = eprun("growth", fp32, int8, "2", "--local")
    assert whole["layer_count"] == 32  # 31 MatMul inputs and the output
    for budget in ("0", "1"):
        assert eprun("growth", fp32, int8, "2", "--local", "--max-memory", budget) == whole


def test_batches_respect_the_budget():
    import eprun as tool

    assert tool.plan_batches([10, 10, 10, 10], None) == [[0, 1, 2, 3]]
    assert tool.plan_batches([10, 10, 10, 10], 25) == [[0, 1], [2, 3]]
    assert tool.plan_batches([10, None, 10], 100) == [[0], [1], [2]]
    assert tool.plan_batches([30, 5], 20) == [[0], [1]]
    assert tool.plan_batches([], 5) == []
