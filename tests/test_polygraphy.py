"""Polygraphy's files, read and written as Polygraphy itself reads and writes them.

Polygraphy (a dev requirement, never a dependency of eprun) writes the inputs and outputs of
``polygraphy run`` here, and reads back what eprun writes; its own loader decodes them for the
oracles, so eprun's reader and writer are checked against Polygraphy, not against themselves.
"""
from __future__ import annotations

import json
import subprocess
import sys

import models
import numpy as np
import pytest
from conftest import in_process

POLYGRAPHY = ("import sys; from polygraphy.tools import main; sys.argv[0] = 'polygraphy'; "
              "sys.exit(main())")


def run_polygraphy(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", POLYGRAPHY, *map(str, argv)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def polygraphy_run(tmp_path_factory):
    """A float chain, its QDQ twin, and what ``polygraphy run --onnxrt`` saved of the float
    one over two iterations: (fp32, int8, inputs.json, outputs.json)."""
    import polygraphy.comparator
    import polygraphy.json  # noqa: F401

    folder = tmp_path_factory.mktemp("polygraphy")
    fp32 = models.save(models.chain(seed=4), folder / "f.onnx")
    int8 = models.quantize(fp32, folder / "q.onnx", seed=4)
    done = run_polygraphy("run", fp32, "--onnxrt", "--iterations", "2", "--input-shapes", "x:[5,8]",
                      "--save-inputs", folder / "in.json", "--save-outputs",
                      folder / "out.json")
    assert done.returncode == 0, done.stdout + done.stderr
    return fp32, int8, folder / "in.json", folder / "out.json"


def polygraphy_feeds(path) -> list[dict]:
    from polygraphy.json import load_json

    return load_json(str(path))


def polygraphy_outputs(path, iteration: int) -> dict:
    from polygraphy.comparator import RunResults

    ((_, iterations),) = RunResults.load(str(path)).items()
    return {name: np.asarray(value) for name, value in iterations[iteration].items()}


@pytest.mark.parametrize("iteration", [0, 1])
def test_check_compares_with_polygraphys_outputs_on_its_inputs(capfd, polygraphy_run, iteration):
    fp32, int8, inputs, outputs = polygraphy_run
    code, out, err = in_process(capfd, "check", fp32, int8, "--inputs", inputs,
                                "--load-outputs", outputs, "--iteration", iteration,
                                "--profile", "fp16")
    assert code == 1, err  # the int8 twin is not within float16's tolerances
    answer = json.loads(out)
    feed = polygraphy_feeds(inputs)[iteration]
    expected = polygraphy_outputs(outputs, iteration)["y"]
    (candidate,) = models.run(int8, feed)
    assert answer["golden"] == {"loaded": str(outputs), "format": "polygraphy",
                                "runner": answer["golden"]["runner"], "iteration": iteration}
    assert answer["golden"]["runner"].startswith("onnxrt-runner")
    assert answer["rows"] == 5 and answer["providers"]["reference"] == []
    (entry,) = answer["outputs"]
    diff = np.abs(candidate.astype(np.float64) - expected.astype(np.float64))
    assert entry["max_abs_diff"] == pytest.approx(float(diff.max()), rel=1e-9)
    assert entry["mean_abs_diff"] == pytest.approx(float(diff.mean()), rel=1e-9)
    code, out, _ = in_process(capfd, "check", fp32, fp32, "--inputs", inputs,
                              "--load-outputs", outputs, "--iteration", iteration)
    assert code == 0 and json.loads(out)["outputs"][0]["max_abs_diff"] == 0


def test_polygraphy_reads_and_compares_what_check_saves(capfd, polygraphy_run, tmp_path):
    """Without --inputs, the inputs go beside the outputs for --load-inputs; Polygraphy passes
    the same model against them and fails the quantized twin."""
    fp32, int8, inputs, _ = polygraphy_run
    golden = tmp_path / "golden.json"
    code, out, err = in_process(capfd, "check", fp32, fp32, "--save-outputs", golden)
    assert code == 0, err
    feeds = tmp_path / "golden.inputs.json"
    assert json.loads(out)["golden"] == {"saved": str(golden), "format": "polygraphy",
                                         "inputs": str(feeds)}
    (feed,) = polygraphy_feeds(feeds)
    assert np.array_equal(feed["x"], models.contract_input(0, 8))
    saved = polygraphy_outputs(golden, 0)
    assert np.array_equal(saved["y"], models.run(fp32, feed)[0])
    same = run_polygraphy("run", fp32, "--onnxrt", "--load-inputs", feeds, "--load-outputs", golden)
    assert same.returncode == 0 and "PASSED" in same.stdout + same.stderr
    other = run_polygraphy("run", int8, "--onnxrt", "--load-inputs", feeds, "--load-outputs", golden)
    assert other.returncode != 0 and "FAILED" in other.stdout + other.stderr
    # inputs from Polygraphy's own file, iteration 1: the very feed dict goes beside
    again = tmp_path / "again.json"
    code, out, _ = in_process(capfd, "check", fp32, fp32, "--inputs", inputs, "--iteration", "1",
                              "--save-outputs", again)
    assert code == 0 and json.loads(out)["golden"] == {
        "saved": str(again), "format": "polygraphy", "inputs": str(tmp_path / "again.inputs.json")}
    (feed,) = polygraphy_feeds(tmp_path / "again.inputs.json")
    assert np.array_equal(feed["x"], polygraphy_feeds(inputs)[1]["x"])
    assert np.array_equal(polygraphy_outputs(again, 0)["y"], models.run(fp32, feed)[0])
    done = run_polygraphy("run", fp32, "--onnxrt", "--load-inputs", tmp_path / "again.inputs.json",
                          "--load-outputs", again)
    assert done.returncode == 0, done.stdout + done.stderr
    # one iteration's file, as Polygraphy writes them apart, is a feed dict of its own
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps(json.loads(inputs.read_text())[1]), encoding="utf-8")
    code, out, _ = in_process(capfd, "check", fp32, fp32, "--inputs", alone,
                              "--load-outputs", again)
    assert code == 0 and json.loads(out)["outputs"][0]["max_abs_diff"] == 0


def test_npz_files_name_their_arrays_by_input_and_output(capfd, polygraphy_run, tmp_path):
    fp32, _, inputs, _ = polygraphy_run
    golden = tmp_path / "golden.npz"
    code, _, err = in_process(capfd, "check", fp32, fp32, "--inputs", inputs, "--iteration", "1",
                              "--save-outputs", golden)
    assert code == 0, err
    with np.load(golden) as stored:
        assert sorted(stored.files) == ["eprun", "x", "y"]
        assert np.array_equal(stored["x"], polygraphy_feeds(inputs)[1]["x"])
        assert np.array_equal(stored["y"], models.run(fp32, stored["x"])[0])
        legacy = {"input_0": stored["x"], "tensor_0": stored["y"]}
        record = json.loads(str(stored["eprun"][()]))
    del record["members"]  # as eprun 0.10 wrote them
    np.savez(tmp_path / "legacy.npz", eprun=np.array(json.dumps(record)), **legacy)
    for path in (golden, tmp_path / "legacy.npz"):
        code, out, err = in_process(capfd, "check", fp32, fp32, "--load-outputs", path)
        assert code == 0, err
        assert json.loads(out)["outputs"][0]["max_abs_diff"] == 0


def test_a_graph_input_that_is_an_output_keeps_both_arrays(capfd, tmp_path):
    """A name can be an input and an output at once: the output holds the input's very values,
    stored once under its name (not again as ``tensor_1``), and the file loads back."""
    from onnx import TensorProto, helper

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = models.save(model, tmp_path / "m.onnx")
    golden = tmp_path / "g.npz"
    code, _, err = in_process(capfd, "check", path, path, "--save-outputs", golden)
    assert code == 0, err
    with np.load(golden) as stored:
        assert sorted(stored.files) == ["eprun", "r", "x"]
        record = json.loads(str(stored["eprun"]))
        assert record["tensors"] == ["r", "x"] and record["members"]["tensors"] == ["r", "x"]
        assert np.array_equal(stored["r"], np.maximum(stored["x"], 0))
    code, _, err = in_process(capfd, "check", path, path, "--load-outputs", golden)
    assert code == 0, err


@pytest.mark.parametrize("argv, code, said", [
    (["--load-outputs", "@out"], 2, "Polygraphy's, whose outputs carry no inputs"),
    (["--inputs", "@in", "--load-outputs", "@out", "--iteration", "2"], 2,
     "--iteration 2: '@out' holds 2 iterations (0 to 1)"),
    (["--inputs", "@in", "--iteration", "5"], 2, "holds 2 feed dicts (0 to 1)"),
    (["--inputs", "@out"], 4, "is not a Polygraphy inputs file"),
    (["--inputs", "@in", "--load-outputs", "@in"], 4, "is not a Polygraphy RunResults file"),
    (["--inputs", "@bad"], 4, "is not a JSON file"),
    (["--inputs", "@noarray"], 4, "'x' is not an array as Polygraphy writes one"),
    (["--iteration", "1"], 2, "--iteration 1 picks an iteration of a Polygraphy JSON file"),
    (["--inputs", "@nox"], 4, "must hold one array per input (x): its feed dict 0 is missing x"),
    (["--inputs", "@empty"], 4, "holds no feed dict"),
    (["--inputs", "@huge"], 4, "'x' declares shape [1000000000, 8] of float32"),
    (["--inputs", "@in", "--save-outputs", "@in"], 2, "refusing to overwrite the input file"),
])
def test_polygraphy_files_that_do_not_fit_are_one_line(capfd, polygraphy_run, tmp_path, argv,
                                                       code, said):
    fp32, _, inputs, outputs = polygraphy_run
    import base64
    import io

    (tmp_path / "bad.json").write_text("[{", encoding="utf-8")
    (tmp_path / "noarray.json").write_text('[{"x": {"values": 3}}]', encoding="utf-8")
    (tmp_path / "nox.json").write_text('[{}]', encoding="utf-8")
    (tmp_path / "empty.json").write_text('[]', encoding="utf-8")
    header = io.BytesIO()  # an .npy header promising 32 GB, and 4 bytes of data
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10 ** 9, 8)})
    payload = base64.b64encode(header.getvalue() + b"abcd")
    (tmp_path / "huge.json").write_text(json.dumps([{"x": {"array": payload.decode()}}]),
                                        encoding="utf-8")
    files = {"@in": str(inputs), "@out": str(outputs), "@bad": str(tmp_path / "bad.json"),
             "@noarray": str(tmp_path / "noarray.json"), "@nox": str(tmp_path / "nox.json"),
             "@empty": str(tmp_path / "empty.json"), "@huge": str(tmp_path / "huge.json")}
    argv = [files.get(word, word) for word in argv]
    got, out, err = in_process(capfd, "check", fp32, fp32, *argv)
    said = said.replace("@out", str(outputs))
    assert (got, out) == (code, "")
    assert err.startswith("eprun: error: ") and said in err and err.count("\n") == 1, err


def test_load_inputs_is_polygraphys_name_for_inputs(capfd, polygraphy_run):
    """A Polygraphy user's command line, flag for flag: the same answer as --inputs."""
    fp32, int8, inputs, outputs = polygraphy_run
    answers = [in_process(capfd, "check", fp32, int8, flag, inputs, "--load-outputs", outputs)
               for flag in ("--load-inputs", "--inputs")]
    assert answers[0] == answers[1] and answers[0][0] in (0, 1), answers[0][2]
    assert json.loads(answers[0][1])["iterations"] == 2


def test_what_every_iteration_of_a_file_shares_is_said_once(capfd, polygraphy_run, tmp_path):
    """A member no input is called in every feed dict, and a second runner in the results:
    each said once however many iterations read them."""
    fp32, _, inputs, outputs = polygraphy_run
    feeds = json.loads(inputs.read_text(encoding="utf-8"))
    for feed in feeds:
        feed["extra"] = feed["x"]
    results = json.loads(outputs.read_text(encoding="utf-8"))
    results["lst"].append(["another", results["lst"][0][1]])
    (tmp_path / "in.json").write_text(json.dumps(feeds), encoding="utf-8")
    (tmp_path / "out.json").write_text(json.dumps(results), encoding="utf-8")
    code, out, err = in_process(capfd, "check", fp32, fp32, "--inputs", tmp_path / "in.json",
                                "--load-outputs", tmp_path / "out.json")
    assert code == 0 and json.loads(out)["iterations"] == len(feeds) == 2, err
    assert err.count("'extra' feeds no input of the model, left unread") == 1, err
    assert err.count("holds the results of 2 runners; compared with the first") == 1, err


def test_a_calibration_file_is_never_polygraphys(capfd, polygraphy_run):
    fp32, int8, inputs, _ = polygraphy_run
    code, out, err = in_process(capfd, "sensitivity", fp32, int8, "1", "--calibration", inputs)
    assert (code, out) == (2, "") and "a calibration file is an .npz of batches" in err
