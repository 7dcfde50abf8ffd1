"""gen_ep.py builds the lab models the contract describes, deterministically."""
from __future__ import annotations

import subprocess
import sys

import onnx
import onnxruntime as ort
import pytest
from conftest import PINNED_STACK, ROOT


def generate(folder, *options: str, capsys=None) -> None:
    """gen_ep.py --out-dir FOLDER OPTIONS: its main() here (``capsys`` given), else as typed,
    in a process of its own; either way it prints the two paths it wrote."""
    argv = ["--out-dir", str(folder), *options]
    if capsys is None:
        proc = subprocess.run([sys.executable, str(ROOT / "gen_ep.py"), *argv],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        printed = proc.stdout
    else:
        import gen_ep

        capsys.readouterr()
        assert gen_ep.main(argv) == 0
        printed = capsys.readouterr().out
    assert printed.splitlines() == [str(folder / "fp32.onnx"), str(folder / "int8.onnx")]


def test_defaults_reproduce_the_committed_float_model(tmp_path):
    generate(tmp_path)  # as typed: how make lab runs it
    assert (tmp_path / "fp32.onnx").read_bytes() == (ROOT / "fp32.onnx").read_bytes()
    fresh, committed = onnx.load(str(tmp_path / "int8.onnx")), onnx.load(str(ROOT / "int8.onnx"))
    assert [n.op_type for n in fresh.graph.node] == [n.op_type for n in committed.graph.node]
    # Quantizer releases choose some scales differently (the Add biases, for one), and the
    # file records the quantizer's version: the graph is identical on the pinned stack only
    # (calibration runs the float model alone, so no CPU's int8 kernel decides the scales).
    if PINNED_STACK:
        assert fresh.graph == committed.graph


def test_models_have_the_contract_shape(tmp_path, capsys):
    generate(tmp_path, "--features", "6", "--widths", "7,7,5,5,4,3", "--seed", "5",
             capsys=capsys)
    fp32 = onnx.load(str(tmp_path / "fp32.onnx"))
    int8 = onnx.load(str(tmp_path / "int8.onnx"))
    for model in (fp32, int8):
        assert model.ir_version == 8
        assert all(o.version <= 17 for o in model.opset_import if o.domain in ("", "ai.onnx"))
        (value,) = model.graph.input
        dims = value.type.tensor_type.shape.dim
        assert value.name == "x" and value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert len(dims) == 2 and not dims[0].HasField("dim_value") and dims[1].dim_value == 6
        assert len(model.graph.output) == 1
    assert [n.op_type for n in fp32.graph.node] == ["MatMul", "Add", "Relu"] * 5 + ["MatMul", "Add"]
    ops = [n.op_type for n in int8.graph.node]
    assert ops.count("MatMul") == 6 and "QuantizeLinear" in ops and "DequantizeLinear" in ops
    ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"])


def test_same_options_same_bytes(tmp_path, capsys):
    """The same options give the same bytes, in another process too."""
    first, second = tmp_path / "a", tmp_path / "b"
    generate(first, "--features", "4", "--widths", "5,5,5,5,5", capsys=capsys)
    generate(second, "--features", "4", "--widths", "5,5,5,5,5")
    for name in ("fp32.onnx", "int8.onnx"):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_layer_count_option(tmp_path, capsys):
    generate(tmp_path, "--layers", "7", "--features", "4", capsys=capsys)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "fp32.onnx")).graph.node]
    assert ops.count("MatMul") == 7 and ops.count("Relu") == 6


@pytest.mark.parametrize("options, message", [
    (["--widths", "4,4"], "at least 5 layers"),
    (["--layers", "3"], "at least 5 layers"),
    (["--widths", "4,4,4,4,4", "--layers", "6"], "contradicts"),
    (["--widths", "4,x"], "comma-joined integers"),
])
def test_bad_options_are_usage_errors(tmp_path, capsys, options, message):
    import gen_ep

    with pytest.raises(SystemExit) as exit_:
        gen_ep.main(["--out-dir", str(tmp_path), *options])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "fp32.onnx").exists()
