"""Benchmark eprun against what a user would otherwise run: wall time and peak memory.

Not a test. Builds its own models in a scratch folder, runs every route as separate processes
(so start-up counts, as it does for a user) and reports medians as a Markdown table:

* each contract command on a lab-shaped pair against a minimal hand-written script doing the
  same onnxruntime work (the floor), and ``layers`` against a floor that holds one model at a
  time (each exposed model, written beforehand, opened from its file, run once and freed in
  turn: the least any tool can do);
* ``report`` against ``layers`` on the same pair, and against onnxruntime alone opening the
  fp32 model for each of report's provider lists;
* ``layers`` against onnxruntime's ``qdq_loss_debug`` route and the Polygraphy route
  (``polygraphy run --onnxrt --onnx-outputs mark all`` for both models, then a comparison),
  on the lab-shaped pair and on 16 layers of 2048x2048;
* ``layers`` and ``report`` on a ResNet-style CNN pair (64 channels, 64 images of 56x56);
* ``partition`` and ``expose`` on a model with >= 2 GB of external data against ``onnx.load``
  of it and against ``python -c "import onnx"``; ``expose`` of it into another folder (the
  data copied) against ``shutil.copyfile`` of the data file, without and with an fsync;
* start-up: each lab command installed (the module from its byte code, as the ``eprun``
  console script runs it) against its floor, and as ``python eprun.py`` against the floor
  plus the compile of the file; ``--version`` and ``--help`` against ``python -c pass``
  (``--only-startup`` runs these and the 2 GiB routes alone).

``--ep-python PYTHON --ep NAME`` (``make bench-ep``: OpenVINO from ``.venv-openvino``) adds
``layers --providers NAME`` run by that interpreter against the same measurement by hand (the
fp32 model exposed on the CPU, the int8 model exposed and plain on the EP), on the lab pair and
the 16x2048 pair; ``--ep-library PATH`` for a plugin EP.

Usage: ``python bench/bench.py [--repeat N] [--work DIR] [--skip-large] [--only-startup]``
(``make bench``).
Polygraphy comes from requirements-bench.txt; without it that route is reported as missing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPRUN = str(ROOT / "eprun.py")
PY = sys.executable
SEED = 7

# -- the floors: minimal scripts doing the same onnxruntime work as each command --------------

FLOOR_COMMON = '''
import json, sys
import numpy as np
'''

# The contract's boundary rule and output exposure, as a script would write them once.
BOUNDARIES = '''
import onnx
def boundaries(model):
    names = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.input[0] not in names:
            names.append(node.input[0])
    if model.graph.output[0].name not in names:
        names.append(model.graph.output[0].name)
    return names
def expose(model):
    names = boundaries(model)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    known = {v.name: v for v in list(inferred.value_info) + list(inferred.input)}
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(known[name] for name in names if name not in present)
    return names
'''

FLOORS = {
    "providers": FLOOR_COMMON + '''
import onnxruntime as ort
cases = []
for request in sys.argv[2:]:
    wanted = [p for p in request.split(",") if p]
    try:
        actual = ort.InferenceSession(sys.argv[1], providers=wanted).get_providers()
    except Exception:
        actual = []
    cases.append({"requested": wanted, "actual": actual})
print(json.dumps({"available": ort.get_available_providers(), "cases": cases}))
''',
    "partition": FLOOR_COMMON + '''
import onnx
model = onnx.load(sys.argv[1], load_external_data=False)
supported = set(sys.argv[2].split(","))
parts = []
for node in model.graph.node:
    owner = "ep" if node.op_type in supported else "cpu"
    if parts and parts[-1][0] == owner:
        parts[-1][1].append(node.op_type)
    else:
        parts.append((owner, [node.op_type]))
print(json.dumps({"partition_count": len(parts), "partitions": parts}))
''',
    "expose": FLOOR_COMMON + BOUNDARIES + '''
model = onnx.load(sys.argv[1], load_external_data=False)
names = expose(model)
onnx.save(model, sys.argv[2])
print(json.dumps({"boundaries": names}))
''',
    "layers": FLOOR_COMMON + BOUNDARIES + '''
import onnxruntime as ort
def exposed(path):
    model = onnx.load(path)
    names = expose(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return names, session
(fa, sa), (fb, sb) = exposed(sys.argv[1]), exposed(sys.argv[2])
features = sa.get_inputs()[0].shape[1]
x = np.random.default_rng(int(sys.argv[3])).standard_normal((64, features)).astype(np.float32)
out = []
ra, rb = sa.run(fa, {"x": x}), sb.run(fb, {"x": x})
for a, b in zip(ra, rb):
    a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms == 0, 1.0, (a * b).sum(1) / np.where(norms == 0, 1, norms))
    out.append([err, scale, err / scale if scale else 0.0, float(cos.min())])
moved = []  # what exposing moved: each plain model's final output against the exposed one's
for path, names, values in ((sys.argv[1], fa, ra), (sys.argv[2], fb, rb)):
    plain = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (value,) = plain.run([names[-1]], {"x": x})
    moved.append(float(np.abs(value - values[-1]).max()))
if len(sys.argv) > 4:
    rel = [entry[2] for entry in out]
    out = [rel[k] / rel[k - 1] if rel[k - 1] else None for k in range(1, len(rel))]
print(json.dumps(out))
''',
    # The least any tool can do: each exposed model (written beforehand, untimed) opened from
    # its file, run once on every output and freed in turn; then the boundaries compared, and
    # each plain model (argv[5], argv[6]) run for its final output: what exposing moved.
    "layers_sequential": FLOOR_COMMON + '''
import gc
import onnxruntime as ort
sizes = json.loads(sys.argv[4])
def run(path, feed=None):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    if feed is None:
        rng = np.random.default_rng(int(sys.argv[3]))
        feed = {value.name: rng.standard_normal([d if isinstance(d, int) else sizes.get(d, 64)
                                                 for d in value.shape]).astype(np.float32)
                for value in session.get_inputs()}
    values = session.run(None, feed)
    del session
    gc.collect()
    return feed, values
feed, fp32 = run(sys.argv[1])
_, int8 = run(sys.argv[2], feed)
out = []
for a, b in zip(fp32, int8):
    if a.dtype != np.float32 or b.dtype != np.float32:
        continue
    a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    out.append([err, scale, err / scale if scale else 0.0])
for path, exposed in zip(sys.argv[5:7], (fp32, int8)):
    _, (final, *_) = run(path, feed)
    out.append(float(np.abs(final - exposed[0]).max()))
print(json.dumps(out))
''',
    # layers --providers EP by hand: the fp32 model exposed on the CPU, the int8 model exposed
    # on the EP, then the plain int8 model on the EP (how far exposure moved the final output).
    # A plugin EP (argv[5], its library) is appended through its devices.
    "layers_ep": FLOOR_COMMON + BOUNDARIES + '''
import onnxruntime as ort
ep = sys.argv[4]
if len(sys.argv) > 5:
    ort.register_execution_provider_library("bench", sys.argv[5])
def session(model, on_ep):
    if not on_ep:
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    if len(sys.argv) > 5:
        options = ort.SessionOptions()
        options.add_provider_for_devices(
            [d for d in ort.get_ep_devices() if d.ep_name == ep], {})
        return ort.InferenceSession(model, options)
    return ort.InferenceSession(model, providers=[ep, "CPUExecutionProvider"])
fp32 = onnx.load(sys.argv[1])
fa = expose(fp32)
sa = session(fp32.SerializeToString(), False)
features = sa.get_inputs()[0].shape[1]
x = np.random.default_rng(int(sys.argv[3])).standard_normal((64, features)).astype(np.float32)
ya = sa.run(fa, {"x": x})
del sa, fp32
int8 = onnx.load(sys.argv[2])
plain = int8.SerializeToString()
fb = expose(int8)
sb = session(int8.SerializeToString(), True)
yb = sb.run(fb, {"x": x})
del sb, int8
yp = session(plain, True).run([fb[-1]], {"x": x})[0]
out = []
for a, b in zip(ya, yb):
    a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms == 0, 1.0, (a * b).sum(1) / np.where(norms == 0, 1, norms))
    out.append([err, scale, err / scale if scale else 0.0, float(cos.min())])
exposure = float(np.abs(yp.astype(np.float64) - yb[-1]).max())
print(json.dumps({"layers": out, "exposure": exposure}))
''',
    # providers with report's lists: onnxruntime alone, one session per list in turn.
    "providers_report": FLOOR_COMMON + '''
import gc
import onnxruntime as ort
cases = []
for request in sys.argv[2:]:
    wanted = [p for p in request.split(",") if p]
    try:
        session = ort.InferenceSession(sys.argv[1], providers=wanted)
        cases.append(session.get_providers())
        del session
    except Exception as exc:
        cases.append(type(exc).__name__)
    gc.collect()
print(json.dumps(cases))
''',
    "settings": FLOOR_COMMON + '''
import onnxruntime as ort
level = ort.GraphOptimizationLevel
def first(level_value, threads):
    options = ort.SessionOptions()
    options.graph_optimization_level = level_value
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    features = session.get_inputs()[0].shape[1]
    x = np.random.default_rng(int(sys.argv[2])).standard_normal((64, features)).astype(np.float32)
    return session.run(None, {session.get_inputs()[0].name: x})[0]
base = first(level.ORT_DISABLE_ALL, 1)
cases = [(first(l, t) == base).all() for l, t in
         ((level.ORT_ENABLE_ALL, 1), (level.ORT_DISABLE_ALL, 2), (level.ORT_ENABLE_ALL, 2))]
print(json.dumps({"max": float(np.abs(base).max()), "equal": [bool(c) for c in cases]}))
''',
}

QDQ_LOSS_DEBUG = '''
import json, sys
import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.qdq_loss_debug import (collect_activations,
    compute_activation_error, create_activation_matching,
    modify_model_output_intermediate_tensors)
fp32, int8, seed, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import onnx
features = onnx.load(fp32, load_external_data=False).graph.input[0].type.tensor_type.shape.dim[1].dim_value
class Reader(CalibrationDataReader):
    def __init__(self):
        x = np.random.default_rng(seed).standard_normal((64, features)).astype(np.float32)
        self.batches = iter([{"x": x}])
    def get_next(self):
        return next(self.batches, None)
modify_model_output_intermediate_tensors(fp32, work + "/fp32_aug.onnx")
modify_model_output_intermediate_tensors(int8, work + "/int8_aug.onnx")
float_acts = collect_activations(work + "/fp32_aug.onnx", Reader())
qdq_acts = collect_activations(work + "/int8_aug.onnx", Reader())
errors = compute_activation_error(create_activation_matching(qdq_acts, float_acts))
print(json.dumps({name: {k: float(v) for k, v in e.items()} for name, e in errors.items()}))
'''

POLYGRAPHY_LOADER = '''
import numpy as np
import onnx
import os
FEATURES = int(os.environ["BENCH_FEATURES"])
def load_data():
    yield {"x": np.random.default_rng(int(os.environ["BENCH_SEED"])).standard_normal(
        (64, FEATURES)).astype(np.float32)}
'''

POLYGRAPHY_COMPARE = FLOOR_COMMON + BOUNDARIES + '''
from polygraphy.comparator import RunResults
def outputs(path):
    (runner, iterations), = RunResults.load(path).items()
    return iterations[0]
fa, fb = outputs(sys.argv[3]), outputs(sys.argv[4])
# Polygraphy saves node outputs only: a boundary that is the graph input is the loader's x.
x = np.random.default_rng(int(sys.argv[5])).standard_normal((64, int(sys.argv[6])))
def get(saved, name):
    return x.astype(np.float32) if name == "x" and name not in saved else saved[name]
out = []
names = [boundaries(onnx.load(path, load_external_data=False)) for path in sys.argv[1:3]]
for na, nb in zip(*names):
    a = get(fa, na).astype(np.float64).reshape(64, -1)
    b = get(fb, nb).astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    out.append([err, scale])
print(json.dumps(out))
'''


# -- measuring ---------------------------------------------------------------------------------

def run_once(argv: list[str], env: dict | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one process, from wait4's resource usage."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    verdict = argv[1:3] == [EPRUN, "check"]  # exit 1 is a failed verdict, not a failure
    if proc.returncode not in ((0, 1) if verdict else (0,)):
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {stderr[-500:]}")
    return wall, usage.ru_maxrss / 1024


def measure(route: list[list[str]], repeat: int, env: dict | None = None) -> tuple[float, float]:
    """Median over ``repeat`` runs of a route: summed wall time, largest peak RSS."""
    walls, peaks = [], []
    for _ in range(repeat):
        results = [run_once(argv, env) for argv in route]
        walls.append(sum(wall for wall, _ in results))
        peaks.append(max(peak for _, peak in results))
    return statistics.median(walls), statistics.median(peaks)


def measure_together(routes: dict, repeat: int) -> dict:
    """``measure`` for several routes (``{name: (route, env)}``) run in alternation, one run
    of each in turn, so a machine whose load drifts affects them alike."""
    walls: dict = {name: [] for name in routes}
    peaks: dict = {name: [] for name in routes}
    for _ in range(repeat):
        for name, (route, env) in routes.items():
            print(f"  {name} ...", file=sys.stderr)
            results = [run_once(argv, env) for argv in route]
            walls[name].append(sum(wall for wall, _ in results))
            peaks[name].append(max(peak for _, peak in results))
    return {name: (statistics.median(walls[name]), statistics.median(peaks[name]))
            for name in routes}


# -- models ------------------------------------------------------------------------------------

def build_pair(folder: Path, features: int, widths: list[int]) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT))
    import onnx

    import gen_ep

    folder.mkdir(parents=True, exist_ok=True)
    fp32, int8 = folder / "fp32.onnx", folder / "int8.onnx"
    onnx.save(gen_ep.build_fp32(features, widths, gen_ep.DEFAULT_SEED), str(fp32))
    gen_ep.quantize(str(fp32), str(int8), features, gen_ep.DEFAULT_SEED)
    return str(fp32), str(int8)


# The CNN pair: the tests' ResNet-style classifier (batch norm folded, as exporters leave it)
# at 64 channels on 56x56 images, quantized as QDQ by onnxruntime's quantize_static.
CNN_DIMS = {"batch": 64, "h": 56, "w": 56}
CNN_BOUNDARY, CNN_INPUTS = ["--boundary-ops", "Conv"], ["--dim", "h=56", "--dim", "w=56"]


def build_cnn(folder: Path) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    import onnx
    import real_models

    folder.mkdir(parents=True, exist_ok=True)
    fp32, int8 = folder / "fp32.onnx", folder / "int8.onnx"
    onnx.save(real_models.residual_cnn(SEED, channels=64, classes=10, fold_bn=True), str(fp32))
    real_models.quantize_qdq(fp32, int8, SEED, dims={"h": 56, "w": 56})
    return str(fp32), str(int8)


def build_huge(folder: Path, layers: int = 8, width: int = 8192) -> str:
    """A chain whose weights (layers x width^2 float32, 2 GiB by default) sit in one external
    file. The file is sparse (zeros): neither partition nor expose reads it, onnx.load does."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "huge.data"
    nodes, inits, current = [], [], "x"
    offset = 0
    for k in range(layers):
        tensor = TensorProto(name=f"W{k}", dims=[width, width], data_type=TensorProto.FLOAT,
                             data_location=TensorProto.EXTERNAL)
        length = width * width * 4
        for key, value in (("location", data.name), ("offset", str(offset)),
                           ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        offset += length
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"h{k}"]))
        current = f"h{k}"
    with open(data, "wb") as stream:
        stream.truncate(offset)
    graph = helper.make_graph(nodes, "huge",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT,
                                                             ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "huge.onnx"
    onnx.save(model, str(path))
    return str(path)


def build_chain(folder: Path, nodes: int = 50_001, width: int = 4, *, name: str = "chain.onnx",
                scale: float = 0.5, suffix: str = "", tanh: bool = False) -> str:
    """A 50,000-node chain (MatMul -> Add -> Relu, 4 wide): every graph pass must be linear in
    the node count (a list membership test once made ``layers`` spend 11 s in one). Tensors
    are named ``W{k}{suffix}``, ``m{k}{suffix}``, ...; ``tanh`` ends it with a Tanh "y"."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    graph_nodes, inits, current = [], [], "x"
    for k in range(nodes // 3):
        w, b, m, a, r = (f"{letter}{k}{suffix}" for letter in "WBmar")
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) * scale)
                                          .astype(np.float32), w),
                  numpy_helper.from_array(np.zeros(width, np.float32), b)]
        graph_nodes += [helper.make_node("MatMul", [current, w], [m]),
                        helper.make_node("Add", [m, b], [a]),
                        helper.make_node("Relu", [a], [r])]
        current = r
    if tanh:
        graph_nodes.append(helper.make_node("Tanh", [current], ["y"]))
        current = "y"
    graph = helper.make_graph(
        graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / name
    onnx.save(model, str(path))
    return str(path)


def chain_rows(work: Path, repeat: int) -> list[str]:
    """``layers`` and ``partition`` on the 50,000-node chain (the model against itself)
    against the one-model-at-a-time floor and the hand-written partition."""
    chain = str(work / "chain" / "chain.onnx")
    exposed = str(work / "chain" / "chain_exposed.onnx")
    subprocess.run([PY, EPRUN, "expose", chain, exposed], check=True,
                   stdout=subprocess.DEVNULL)  # the floor's input, not timed
    floor = script(work, "floor_sequential", FLOORS["layers_sequential"])
    got = measure_together({
        "layers": ([[PY, EPRUN, "layers", chain, chain, str(SEED)]], None),
        "floor": ([[PY, floor, exposed, exposed, str(SEED), json.dumps({"N": 64}), chain,
                    chain]], None),
        "partition": ([[PY, EPRUN, "partition", chain, "MatMul"]], None),
        "partition floor": ([[PY, script(work, "floor_partition", FLOORS["partition"]), chain,
                              "MatMul"]], None)}, repeat)
    return [row("layers, 50k-node chain", got["layers"], got["floor"],
                "one-model-at-a-time floor"),
            row("partition, 50k-node chain", got["partition"], got["partition floor"],
                "hand-written floor")]


def build_reduce_chain(folder: Path) -> str:
    """A 1,000-node chain (333 blocks of MatMul -> Add -> Relu, 64 wide, then a Tanh) for
    ``reduce``; its tensors end with "_", so no name is the start of another."""
    return build_chain(folder, 999, 64, name="reduce.onnx", scale=1 / 8, suffix="_", tanh=True)


# Fails while the candidate still names two tensors 10 blocks apart (a byte search: the check
# itself costs a Python start, about what a user's cheapest check costs).
REDUCE_CHECK = ("import sys; data = open(sys.argv[1], 'rb').read(); "
                "sys.exit(1 if b'r200_' in data and b'r210_' in data else 0)")


def reduce_rows(work: Path, repeat: int) -> list[str]:
    """``reduce --check`` on the 1,000-node chain against one run of the same check on the
    full model: the ratio is about the number of candidates bisection needs."""
    model = build_reduce_chain(work / "reduce")
    out = str(work / "reduce" / "small.onnx")
    check = f"{PY} -c \"{REDUCE_CHECK}\" {{model}}"
    got = measure_together({
        "reduce": ([[PY, EPRUN, "reduce", model, "--output", out, "--check", check,
                     "--force"]], None),
        # (exit 1 is the check's "fails": the wrapper makes it the success run_once wants)
        "check": ([[PY, "-c", (f"import sys, subprocess; sys.exit(1 - subprocess.run("
                               f"[{PY!r}, '-c', {REDUCE_CHECK!r}, {model!r}]).returncode)")]],
                  None)},
        repeat)
    answer = json.loads(subprocess.run([PY, EPRUN, "reduce", model, "--output", out, "--check",
                                        check, "--force"], capture_output=True, text=True,
                                       check=True).stdout)
    return [row(f"reduce --check, 1,000-node chain ({answer['tries']} candidates, "
                f"{answer['nodes']} nodes kept)", got["reduce"], got["check"],
                "one run of the check on the full model")]


def script(work: Path, name: str, text: str) -> str:
    path = work / f"{name}.py"
    path.write_text(text)
    return str(path)


# -- the table ---------------------------------------------------------------------------------

def row(label: str, ours: tuple[float, float], theirs: tuple[float, float] | None,
        what: str) -> str:
    if theirs is None:
        return f"| {label} | {ours[0]:.2f} | — | — | {ours[1]:.0f} | — | — | {what} (missing) |"
    return (f"| {label} | {ours[0]:.2f} | {theirs[0]:.2f} | {ours[0] / theirs[0]:.2f} | "
            f"{ours[1]:.0f} | {theirs[1]:.0f} | {ours[1] / theirs[1]:.2f} | {what} |")


REPORT_LISTS = ["CPUExecutionProvider", "AzureExecutionProvider",
                "CUDAExecutionProvider,CPUExecutionProvider", "NoSuchExecutionProvider", ""]


def layers_rows(work: Path, fp32: str, int8: str, features: int, label: str,
                repeat: int, sizes: dict | None = None, boundary: list[str] = (),
                inputs: list[str] = (), others: bool = True) -> list[str]:
    """``layers`` against its floors (and, with ``others``, the qdq_loss_debug and Polygraphy
    routes), and ``report`` against ``layers``, against the commands it runs and against
    onnxruntime opening the fp32 model for each of its provider lists, on one pair; every
    route measured in alternation (``measure_together``). ``sizes`` gives the symbolic dims;
    ``boundary`` and ``inputs`` are the eprun options the pair needs."""
    sizes = sizes or {"N": 64}
    extra = [*boundary, *inputs]
    tag = label.split(maxsplit=1)[0]
    exposed = []
    for which, path in (("fp32", fp32), ("int8", int8)):  # written once, not timed
        exposed.append(str(work / f"{tag}_{which}_exposed.onnx"))
        subprocess.run([PY, EPRUN, "expose", path, exposed[-1], *boundary], check=True,
                       stdout=subprocess.DEVNULL)
    routes = {
        "layers": ([[PY, EPRUN, "layers", fp32, int8, str(SEED), *extra]], None),
        "one-model-at-a-time floor": ([[PY, script(work, "floor_sequential",
                                                   FLOORS["layers_sequential"]),
                                        *exposed, str(SEED), json.dumps(sizes), fp32,
                                        int8]], None),
        "report": ([[PY, EPRUN, "report", fp32, int8, "--seed", str(SEED), "--out-dir",
                     str(work / f"report_{tag}"), "--force", *extra]], None),
        "the commands it runs, one by one": ([
            [PY, EPRUN, "providers", fp32, *REPORT_LISTS],
            [PY, EPRUN, "layers", fp32, int8, str(SEED), *extra],
            [PY, EPRUN, "settings", int8, str(SEED), *inputs],
            [PY, EPRUN, "check", fp32, int8, "--profile", "int8", "--seed", str(SEED), *inputs],
            [PY, EPRUN, "expose", fp32, str(work / f"{tag}_part_fp32.onnx"), *boundary],
            [PY, EPRUN, "expose", int8, str(work / f"{tag}_part_int8.onnx"), *boundary]], None),
        "report's provider lists, onnxruntime alone": ([[
            PY, script(work, "floor_providers_report", FLOORS["providers_report"]), fp32,
            *REPORT_LISTS]], None),
    }
    polygraphy = shutil.which("polygraphy", path=str(Path(PY).parent)) or shutil.which(
        "polygraphy")
    if others:
        routes["hand-written floor"] = ([[PY, script(work, "floor_layers", FLOORS["layers"]),
                                          fp32, int8, str(SEED)]], None)
        scratch = work / f"qdq_{tag}"
        scratch.mkdir(exist_ok=True)
        routes["qdq_loss_debug route"] = ([[PY, script(work, "qdq_loss_debug", QDQ_LOSS_DEBUG),
                                            fp32, int8, str(SEED), str(scratch)]], None)
        if polygraphy is not None:
            loader = script(work, "polygraphy_loader", POLYGRAPHY_LOADER)
            compare = script(work, "polygraphy_compare", POLYGRAPHY_COMPARE)
            saved = [str(work / "pg_fp32.json"), str(work / "pg_int8.json")]
            routes["Polygraphy route"] = (
                [[polygraphy, "run", model, "--onnxrt", "--onnx-outputs", "mark", "all",
                  "--data-loader-script", loader, "--save-outputs", out]
                 for model, out in zip((fp32, int8), saved)]
                + [[PY, compare, fp32, int8, *saved, str(SEED), str(features)]],
                {"BENCH_FEATURES": str(features), "BENCH_SEED": str(SEED)})
    got = measure_together(routes, repeat)
    ours, report = got["layers"], got["report"]
    rows = [row(f"layers, {label}", ours, got[name], name)
            for name in ("hand-written floor", "one-model-at-a-time floor") if name in got]
    rows.append(row(f"report, {label}", report, ours, "layers on the same pair"))
    rows += [row(f"report, {label}", report, got[name], name)
             for name in ("one-model-at-a-time floor", "the commands it runs, one by one",
                          "report's provider lists, onnxruntime alone")]
    if others:
        rows += [row(f"layers, {label}", ours, got.get(name), name)
                 for name in ("qdq_loss_debug route", "Polygraphy route")]
    return rows


def dask_rows(work: Path, args: argparse.Namespace, fp32: str, int8: str) -> list[str]:
    """sensitivity on the lab pair with its units on a Dask cluster of one and of two local
    worker processes (distributed.LocalCluster, loopback), against --jobs 1: the cost of a unit
    there, to estimate a cluster's time. The memory columns are the client's alone."""
    try:
        import distributed
    except ImportError:
        return [("| sensitivity on Dask | — | — | — | — | — | — | distributed not installed "
                "(pip install -r requirements-bench.txt) |")]
    import logging

    argv = [PY, EPRUN, "sensitivity", fp32, int8, "5"]
    answer = json.loads(subprocess.run([*argv, "--jobs", "1"], capture_output=True, text=True,
                                       check=True).stdout)
    units = len(answer["units"])
    print("sensitivity, --jobs 1 ...", file=sys.stderr)
    alone = measure([[*argv, "--jobs", "1"]], args.repeat)
    rows = []
    for workers in (1, 2):
        print(f"sensitivity, {workers} Dask worker(s) ...", file=sys.stderr)
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=":0",
                                      silence_logs=logging.CRITICAL) as cluster:
            spread = measure([[*argv, "--dask-scheduler", cluster.scheduler_address]],
                             args.repeat)
        rows.append(row(f"sensitivity, lab pair, {units} units on {workers} local Dask "
                        f"worker{'s' if workers > 1 else ''}: {spread[0] / units:.2f} s a unit "
                        f"(--jobs 1: {alone[0] / units:.2f})", spread, alone,
                        "sensitivity --jobs 1"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per route (median)")
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--skip-large", action="store_true",
                        help="only the lab-shaped pair (no 2048-wide or 2 GB models)")
    parser.add_argument("--ep-python", help="an interpreter whose onnxruntime has --ep")
    parser.add_argument("--ep", default="OpenVINOExecutionProvider",
                        help="the EP --ep-python measures on")
    parser.add_argument("--ep-library", help="the plugin EP library --ep comes from")
    parser.add_argument("--only-ep", action="store_true",
                        help="only the --ep-python routes")
    parser.add_argument("--only-startup", action="store_true",
                        help="only the start-up routes (each lab command, --version, --help) "
                             "and, unless --skip-large, the 2 GiB ones")
    parser.add_argument("--only-reduce", action="store_true",
                        help="only reduce on the 1,000-node chain")
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:  # the child that builds the models (see below)
        build_pair(Path(args.work) / "lab", 32, [64, 64, 48, 48, 32, 16])
        if not args.skip_large:
            build_huge(Path(args.work) / "huge")
        if not (args.skip_large or args.only_startup):
            build_pair(Path(args.work) / "large", 2048, [2048] * 16)
            build_cnn(Path(args.work) / "cnn")
            build_chain(Path(args.work) / "chain")
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="eprun-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        # Peak RSS is a lifetime high-water mark that a child inherits across fork and exec,
        # so this process must stay small: the models are built by a child of their own.
        print("building models ...", file=sys.stderr)
        subprocess.run([PY, __file__, "--build", "--work", str(work)]
                       + (["--skip-large"] if args.skip_large else [])
                       + (["--only-startup"] if args.only_startup else []),
                       check=True)
        fp32, int8 = str(work / "lab" / "fp32.onnx"), str(work / "lab" / "int8.onnx")
        rows = []
        if args.ep_python:
            pairs = [("lab pair", fp32, int8)] + ([] if args.skip_large else [
                ("16x2048² pair", str(work / "large" / "fp32.onnx"),
                 str(work / "large" / "int8.onnx"))])
            rows += ep_rows(work, args, pairs)
        if args.only_reduce:
            rows += reduce_rows(work, args.repeat)
        elif args.only_startup:
            rows += startup_rows(work, args, fp32, int8)
            rows += [] if args.skip_large else huge_rows(work, args)
        elif not args.only_ep:
            rows += startup_rows(work, args, fp32, int8)
            rows += cpu_rows(work, args, fp32, int8)
            rows += dask_rows(work, args, fp32, int8)
        print("| route | eprun s | other s | time ratio | eprun MB | other MB | memory ratio "
              "| other |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def ep_rows(work: Path, args: argparse.Namespace, pairs: list[tuple[str, str, str]]
            ) -> list[str]:
    """``layers --providers EP`` against the same three sessions by hand, on each pair."""
    floor = script(work, "floor_layers_ep", FLOORS["layers_ep"])
    library = [args.ep_library] if args.ep_library else []
    rows = []
    for label, fp32, int8 in pairs:
        print(f"layers --providers {args.ep}, {label} ...", file=sys.stderr)
        got = measure_together({
            "eprun": ([[args.ep_python, EPRUN, "layers", fp32, int8, str(SEED), "--providers",
                        args.ep, *(["--ep-library", *library] if library else [])]], None),
            "floor": ([[args.ep_python, floor, fp32, int8, str(SEED), args.ep, *library]],
                      None)}, args.repeat)
        rows.append(row(f"layers --providers {args.ep}, {label}", got["eprun"], got["floor"],
                        "the same sessions by hand"))
    return rows


def huge_rows(work: Path, args: argparse.Namespace) -> list[str]:
    """``partition`` and ``expose`` on the chain with 2 GiB of external data (see the module
    docstring)."""
    huge = str(work / "huge" / "huge.onnx")
    print("partition and expose, 2 GiB external ...", file=sys.stderr)
    baseline = measure([[PY, "-c", "import onnx"]], args.repeat)
    load = measure([[PY, "-c", f"import onnx; onnx.load({huge!r})"]], 1)
    rows = []
    for command, extra in (("partition", ["MatMul"]),
                           ("expose", [str(work / "huge" / "huge_exposed.onnx")])):
        ours = measure([[PY, EPRUN, command, huge, *extra]], args.repeat)
        rows.append(row(f"{command}, 2 GiB external", ours, load, "onnx.load of it"))
        rows.append(row(f"{command}, 2 GiB external", ours, baseline,
                        "python -c 'import onnx'"))
    print("expose, 2 GiB into another folder ...", file=sys.stderr)
    return rows + expose_copy_rows(work, huge, args.repeat)


def install_copy(work: Path) -> str:
    """eprun as ``pip install .`` leaves it: the module beside its byte code (pip compiles it
    on install) and the console script, which imports it (``from eprun import cli``)."""
    import importlib.util
    import py_compile

    folder = work / "installed"
    folder.mkdir(exist_ok=True)
    module = folder / "eprun.py"
    shutil.copyfile(EPRUN, module)
    py_compile.compile(str(module), cfile=importlib.util.cache_from_source(str(module)),
                       doraise=True)
    command = folder / "eprun"
    command.write_text(f"import sys\nsys.path.insert(0, {str(folder)!r})\n"
                       "from eprun import cli\nif __name__ == '__main__':\n    sys.exit(cli())\n")
    return str(command)


def compile_seconds(repeat: int) -> float:
    """What ``python eprun.py`` spends compiling the file before it runs (median)."""
    source = Path(EPRUN).read_text(encoding="utf-8")
    times = []
    for _ in range(max(repeat, 5)):
        start = time.perf_counter()
        compile(source, EPRUN, "exec")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def lab_commands(work: Path, fp32: str, int8: str, stem: str) -> dict:
    """Each lab command's arguments for eprun and for its floor (``stem`` names the files
    ``expose`` writes)."""
    lists = ["CPUExecutionProvider", "CUDAExecutionProvider,CPUExecutionProvider"]
    return {
        "providers": ([fp32, *lists], [fp32, *lists]),
        "partition": ([int8, "MatMul"], [int8, "MatMul"]),
        "expose": ([int8, str(work / f"{stem}1.onnx")], [int8, str(work / f"{stem}2.onnx")]),
        "layers": ([fp32, int8, str(SEED)], [fp32, int8, str(SEED)]),
        "growth": ([fp32, int8, str(SEED)], [fp32, int8, str(SEED), "growth"]),
        "settings": ([int8, str(SEED)], [int8, str(SEED)]),
    }


def startup_rows(work: Path, args: argparse.Namespace, fp32: str, int8: str) -> list[str]:
    """Each lab command, installed and as ``python eprun.py``, against its hand-written floor
    (the script's against the floor plus the compile of the file); ``--version`` and
    ``--help`` against a bare ``python -c pass``."""
    installed = install_copy(work)
    compiled = compile_seconds(args.repeat)
    rows = []
    commands = lab_commands(work, fp32, int8, "s")
    for command, (ours, floor) in commands.items():
        print(f"start-up, {command} ...", file=sys.stderr)
        floor_script = script(work, f"floor_{command}", FLOORS["layers" if command ==
                                                                 "growth" else command])
        got = measure_together({"installed": ([[PY, installed, command, *ours]], None),
                                "script": ([[PY, EPRUN, command, *ours]], None),
                                "floor": ([[PY, floor_script, *floor]], None)},
                               max(args.repeat, 9))
        rows.append(row(f"{command}, installed", got["installed"], got["floor"],
                        "hand-written floor"))
        floor_wall, floor_mb = got["floor"]
        rows.append(row(f"{command}, python eprun.py", got["script"],
                        (floor_wall + compiled, floor_mb),
                        f"hand-written floor + compile ({compiled:.2f} s)"))
    print("start-up, --version and --help ...", file=sys.stderr)
    got = measure_together({"installed --version": ([[PY, installed, "--version"]], None),
                            "installed --help": ([[PY, installed, "--help"]], None),
                            "script --version": ([[PY, EPRUN, "--version"]], None),
                            "script --help": ([[PY, EPRUN, "--help"]], None),
                            "bare": ([[PY, "-c", "pass"]], None)}, max(args.repeat, 9))
    for flag in ("--version", "--help"):
        rows.append(row(f"{flag}, installed", got[f"installed {flag}"], got["bare"],
                        "python -c pass"))
        rows.append(row(f"{flag}, python eprun.py", got[f"script {flag}"], got["bare"],
                        "python -c pass"))
    return rows


def expose_copy_rows(work: Path, huge: str, repeat: int) -> list[str]:
    """``expose`` of the 2 GiB model into another folder (the data is copied, then made
    durable with fsync as every eprun write is) against ``shutil.copyfile`` of the data file
    after ``import onnx``, without and with an fsync of the copy. The output is removed and
    the page cache written back before each run (untimed)."""
    data = str(Path(huge).with_name("huge.data"))
    out = work / "elsewhere"
    copy = ("import os, shutil, sys\nimport onnx\nshutil.copyfile(sys.argv[1], sys.argv[2])\n"
            "if len(sys.argv) > 3:\n    descriptor = os.open(sys.argv[2], os.O_RDONLY)\n"
            "    os.fsync(descriptor)\n    os.close(descriptor)\n")
    routes = {"eprun": [PY, EPRUN, "expose", huge, str(out / "huge_exposed.onnx")],
              "copyfile": [PY, "-c", copy, data, str(out / "huge.data")],
              "copyfile + fsync": [PY, "-c", copy, data, str(out / "huge.data"), "fsync"]}
    results: dict = {name: [] for name in routes}
    for _ in range(repeat):
        for name, argv in routes.items():
            print(f"  expose elsewhere: {name} ...", file=sys.stderr)
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            os.sync()
            results[name].append(run_once(argv))
    shutil.rmtree(out, ignore_errors=True)
    got = {name: (statistics.median(wall for wall, _ in runs),
                  statistics.median(peak for _, peak in runs)) for name, runs in results.items()}
    return [row("expose, 2 GiB into another folder", got["eprun"], got[name],
                f"import onnx; shutil.{name}" if name == "copyfile" else
                "import onnx; shutil.copyfile, then fsync") for name in
            ("copyfile", "copyfile + fsync")]


def cpu_rows(work: Path, args: argparse.Namespace, fp32: str, int8: str) -> list[str]:
    """Every CPU route (see the module docstring)."""
    rows = []
    commands = lab_commands(work, fp32, int8, "e")
    for command, (ours, floor) in commands.items():
        if command == "layers":  # measured with its other routes below
            continue
        print(f"{command} ...", file=sys.stderr)
        floor_script = script(work, f"floor_{command}", FLOORS["layers" if command ==
                                                                 "growth" else command])
        got = measure_together({"eprun": ([[PY, EPRUN, command, *ours]], None),
                                "floor": ([[PY, floor_script, *floor]], None)}, args.repeat)
        rows.append(row(f"{command}, lab pair", got["eprun"], got["floor"],
                        "hand-written floor"))
    print("layers routes, lab pair ...", file=sys.stderr)
    rows += layers_rows(work, fp32, int8, 32, "lab pair", args.repeat)
    if not args.skip_large:
        big32, big8 = str(work / "large" / "fp32.onnx"), str(work / "large" / "int8.onnx")
        print("layers routes, large pair ...", file=sys.stderr)
        rows += layers_rows(work, big32, big8, 2048, "16x2048² pair", args.repeat)
        print("layers and report, CNN pair ...", file=sys.stderr)
        rows += layers_rows(work, str(work / "cnn" / "fp32.onnx"),
                            str(work / "cnn" / "int8.onnx"), 0, "CNN pair",
                            args.repeat, CNN_DIMS, CNN_BOUNDARY, CNN_INPUTS, others=False)
        print("50k-node chain ...", file=sys.stderr)
        rows += chain_rows(work, args.repeat)
        rows += huge_rows(work, args)
    print("reduce, 1,000-node chain ...", file=sys.stderr)
    rows += reduce_rows(work, args.repeat)
    return rows


if __name__ == "__main__":
    sys.exit(main())
