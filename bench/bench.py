"""Benchmark eprun against what a user would otherwise run: wall time and peak memory.

Not a test. Builds its own models in a scratch folder, runs every route as separate processes
(so start-up counts, as it does for a user) and reports medians as a Markdown table:

* each contract command on a lab-shaped pair against a minimal hand-written script doing the
  same onnxruntime work (the floor), and ``layers`` against a floor that holds one model at a
  time (each exposed model opened, run once and freed in turn: the least any tool can do);
* ``report`` against ``layers`` on the same pair;
* ``layers`` against onnxruntime's ``qdq_loss_debug`` route and the Polygraphy route
  (``polygraphy run --onnxrt --onnx-outputs mark all`` for both models, then a comparison),
  on the lab-shaped pair and on 16 layers of 2048x2048;
* ``partition`` and ``expose`` on a model with >= 2 GB of external data against ``onnx.load``
  of it and against ``python -c "import onnx"``.

Usage: ``python bench/bench.py [--repeat N] [--work DIR] [--skip-large]`` (``make bench``).
Polygraphy comes from requirements-bench.txt; without it that route is reported as missing.
"""
from __future__ import annotations

import argparse
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
for a, b in zip(sa.run(fa, {"x": x}), sb.run(fb, {"x": x})):
    a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms == 0, 1.0, (a * b).sum(1) / np.where(norms == 0, 1, norms))
    out.append([err, scale, err / scale if scale else 0.0, float(cos.min())])
if len(sys.argv) > 4:
    rel = [entry[2] for entry in out]
    out = [rel[k] / rel[k - 1] if rel[k - 1] else None for k in range(1, len(rel))]
print(json.dumps(out))
''',
    # The least any tool can do: each model exposed, opened, run once and freed in turn.
    "layers_sequential": FLOOR_COMMON + BOUNDARIES + '''
import gc
import onnxruntime as ort
def run(path, x):
    model = onnx.load(path)
    names = expose(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    del model
    values = session.run(names, {session.get_inputs()[0].name: x})
    del session
    gc.collect()
    return values
model = onnx.load(sys.argv[1], load_external_data=False)
features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
del model
x = np.random.default_rng(int(sys.argv[3])).standard_normal((64, features)).astype(np.float32)
fp32 = run(sys.argv[1], x)
int8 = run(sys.argv[2], x)
out = []
for a, b in zip(fp32, int8):
    a, b = a.astype(np.float64).reshape(64, -1), b.astype(np.float64).reshape(64, -1)
    err, scale = float(np.abs(a - b).max()), float(np.abs(a).max())
    out.append([err, scale, err / scale if scale else 0.0])
print(json.dumps(out))
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
out = []
names = [boundaries(onnx.load(path, load_external_data=False)) for path in sys.argv[1:3]]
for na, nb in zip(*names):
    a, b = fa[na].astype(np.float64).reshape(64, -1), fb[nb].astype(np.float64).reshape(64, -1)
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
    if proc.returncode not in (0, 1):
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


def layers_rows(work: Path, fp32: str, int8: str, features: int, label: str,
                repeat: int) -> list[str]:
    ours = measure([[PY, EPRUN, "layers", fp32, int8, str(SEED)]], repeat)
    rows = [row(f"layers, {label}", ours,
                measure([[PY, script(work, "floor_layers", FLOORS["layers"]), fp32, int8,
                          str(SEED)]], repeat), "hand-written floor"),
            row(f"layers, {label}", ours,
                measure([[PY, script(work, "floor_sequential", FLOORS["layers_sequential"]),
                          fp32, int8, str(SEED)]], repeat), "one-model-at-a-time floor")]
    out = work / f"report_{label.split(maxsplit=1)[0]}"
    report = measure([[PY, EPRUN, "report", fp32, int8, "--seed", str(SEED), "--out-dir",
                       str(out), "--force"]], repeat)
    rows.append(row(f"report, {label}", report, ours, "layers on the same pair"))
    scratch = work / f"qdq_{label.split(maxsplit=1)[0]}"
    scratch.mkdir(exist_ok=True)
    rows.append(row(f"layers, {label}", ours,
                    measure([[PY, script(work, "qdq_loss_debug", QDQ_LOSS_DEBUG), fp32, int8,
                              str(SEED), str(scratch)]], repeat), "qdq_loss_debug route"))
    polygraphy = shutil.which("polygraphy", path=str(Path(PY).parent)) or shutil.which(
        "polygraphy")
    if polygraphy is None:
        rows.append(row(f"layers, {label}", ours, None, "Polygraphy route"))
        return rows
    loader = script(work, "polygraphy_loader", POLYGRAPHY_LOADER)
    compare = script(work, "polygraphy_compare", POLYGRAPHY_COMPARE)
    env = {"BENCH_FEATURES": str(features), "BENCH_SEED": str(SEED)}
    route = [[polygraphy, "run", fp32, "--onnxrt", "--onnx-outputs", "mark", "all",
              "--data-loader-script", loader, "--save-outputs", str(work / "pg_fp32.json")],
             [polygraphy, "run", int8, "--onnxrt", "--onnx-outputs", "mark", "all",
              "--data-loader-script", loader, "--save-outputs", str(work / "pg_int8.json")],
             [PY, compare, fp32, int8, str(work / "pg_fp32.json"), str(work / "pg_int8.json")]]
    rows.append(row(f"layers, {label}", ours, measure(route, repeat, env), "Polygraphy route"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per route (median)")
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--skip-large", action="store_true",
                        help="only the lab-shaped pair (no 2048-wide or 2 GB models)")
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:  # the child that builds the models (see below)
        build_pair(Path(args.work) / "lab", 32, [64, 64, 48, 48, 32, 16])
        if not args.skip_large:
            build_pair(Path(args.work) / "large", 2048, [2048] * 16)
            build_huge(Path(args.work) / "huge")
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="eprun-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        # Peak RSS is a lifetime high-water mark that a child inherits across fork and exec,
        # so this process must stay small: the models are built by a child of their own.
        print("building models ...", file=sys.stderr)
        subprocess.run([PY, __file__, "--build", "--work", str(work)]
                       + (["--skip-large"] if args.skip_large else []), check=True)
        fp32, int8 = str(work / "lab" / "fp32.onnx"), str(work / "lab" / "int8.onnx")
        rows = []
        commands = {
            "providers": ([fp32, "CPUExecutionProvider", "CUDAExecutionProvider,CPUExecutionProvider"],
                          [fp32, "CPUExecutionProvider", "CUDAExecutionProvider,CPUExecutionProvider"]),
            "partition": ([int8, "MatMul"], [int8, "MatMul"]),
            "expose": ([int8, str(work / "e1.onnx")], [int8, str(work / "e2.onnx")]),
            "layers": ([fp32, int8, str(SEED)], [fp32, int8, str(SEED)]),
            "growth": ([fp32, int8, str(SEED)], [fp32, int8, str(SEED), "growth"]),
            "settings": ([int8, str(SEED)], [int8, str(SEED)]),
        }
        for command, (ours, floor) in commands.items():
            if command == "layers":  # measured with its other routes below
                continue
            print(f"{command} ...", file=sys.stderr)
            floor_script = script(work, f"floor_{command}", FLOORS["layers" if command ==
                                                                     "growth" else command])
            rows.append(row(f"{command}, lab pair",
                            measure([[PY, EPRUN, command, *ours]], args.repeat),
                            measure([[PY, floor_script, *floor]], args.repeat),
                            "hand-written floor"))
        print("layers routes, lab pair ...", file=sys.stderr)
        rows += layers_rows(work, fp32, int8, 32, "lab pair", args.repeat)
        if not args.skip_large:
            big32, big8 = str(work / "large" / "fp32.onnx"), str(work / "large" / "int8.onnx")
            print("layers routes, large pair ...", file=sys.stderr)
            rows += layers_rows(work, big32, big8, 2048, "16x2048² pair",
                                max(1, args.repeat // 2))
            huge = str(work / "huge" / "huge.onnx")
            baseline = measure([[PY, "-c", "import onnx"]], args.repeat)
            load = measure([[PY, "-c", f"import onnx; onnx.load({huge!r})"]], 1)
            for command, extra in (("partition", ["MatMul"]),
                                   ("expose", [str(work / "huge" / "huge_exposed.onnx")])):
                ours = measure([[PY, EPRUN, command, huge, *extra]], args.repeat)
                rows.append(row(f"{command}, 2 GiB external", ours, load, "onnx.load of it"))
                rows.append(row(f"{command}, 2 GiB external", ours, baseline,
                                "python -c 'import onnx'"))
        print("| route | eprun s | other s | time ratio | eprun MB | other MB | memory ratio "
              "| other |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
