"""eprun: what an ONNX Runtime session really got, and where quantization error grows.

Commands (each prints exactly one compact JSON object on one line to stdout):

    providers <model> <list> [<list> ...]   requested vs. actual execution providers
    partition <model> <supported-ops>       file-order simulation of how an EP would split the graph
    expose    <model> <out.onnx>            save a copy with every layer boundary as a graph output
    layers    <fp32> <int8> <seed>          FP32 vs. INT8 error at every layer boundary
    growth    <fp32> <int8> <seed>          how the relative error grows from boundary to boundary
    settings  <model> <seed>                same model and input under other optimization levels
                                            and thread counts

Lists are one argument each, comma-joined; items are stripped and empty items dropped.

Exit codes:

    0  success: stdout holds the JSON answer and nothing else
    2  wrong usage: unknown command, wrong argument count, a seed that is not a non-negative
       integer, ``expose`` onto its own input
    3  an input file that does not exist (or is a directory)
    4  any other failure: a file that is not a loadable ONNX model, fp32/int8 models whose
       boundary counts differ, a model that cannot take the contract input, an output that
       cannot be written

On failure stdout stays empty and stderr gets one line ``eprun: error: <what and why>``;
``EPRUN_DEBUG=1`` adds the Python traceback. The binding reading of every field is
CONTRACT.md; README.md explains them for users.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterator

EXIT_USAGE = 2
EXIT_MISSING = 3
EXIT_FAILURE = 4

ROWS = 64
BOUNDARY_OPS = ("MatMul", "Gemm")
SETTINGS_BASELINE = ("ORT_DISABLE_ALL", 1)
SETTINGS_CASES = (("ORT_ENABLE_ALL", 1), ("ORT_DISABLE_ALL", 2), ("ORT_ENABLE_ALL", 2))
# Initializers smaller than this keep their values in the weightless copy used for shape
# inference: they are the shape and axis tensors that inference needs to read.
SKELETON_KEEP_BYTES = 4096


class EprunError(Exception):
    """An expected failure: one line for stderr and the exit code it maps to."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line, native) error message into one line."""
    return " ".join(str(text).split())


# -- arguments ---------------------------------------------------------------------------------

def parse_list(text: str) -> list[str]:
    """A comma-joined list argument: items stripped, empty items dropped, order kept."""
    return [item.strip() for item in text.split(",") if item.strip()]


_SEED = re.compile(r"[0-9]+", re.ASCII)


def parse_seed(text: str) -> int:
    """A seed is a non-negative decimal integer of any size (``default_rng`` takes big ints)."""
    if not _SEED.fullmatch(text):
        raise argparse.ArgumentTypeError(f"seed {text!r} is not a non-negative integer")
    return int(text)


# -- strict JSON -------------------------------------------------------------------------------

def _strict(value: Any) -> Any:
    """Map non-finite floats to ``None``; refuse anything that is not plain JSON data."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    raise TypeError(f"{type(value).__name__} is not JSON data: {value!r}")


def to_json(answer: dict) -> str:
    """The one serialiser of every answer: compact, strict, in the contract's key order."""
    import json

    return json.dumps(_strict(answer), separators=(",", ":"), allow_nan=False)


# -- the stdout guard --------------------------------------------------------------------------

def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers so native output lands while fd 1 is redirected."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no libc handle (e.g. Windows)
        pass


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout, by Python or by native code, to stderr instead.

    onnxruntime prints its provider fallback banner with ``print()`` while a session is created,
    and native libraries may write to file descriptor 1 directly; either would corrupt the one
    JSON line that is the answer.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # fd 1 or 2 closed: nothing native can reach a closed stdout anyway
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)


# -- files and models --------------------------------------------------------------------------

def require_file(path: str, what: str = "model") -> None:
    """Exit 3 for an input that is not there, before any library gets to raise about it."""
    if os.path.isdir(path):
        raise EprunError(f"{what} {path!r} is a directory, not a file", EXIT_MISSING)
    if not os.path.exists(path):
        raise EprunError(f"{what} file {path!r} does not exist", EXIT_MISSING)


def load_model(path: str, load_weights: bool = True):
    """Parse an ONNX file, turning every way it can be broken into one clear error.

    Protobuf parses many byte strings (an empty file, some text) into an empty message without
    complaint, so a model must also have an IR version and a graph with an output.
    """
    import onnx

    require_file(path)
    try:
        model = onnx.load(path, load_external_data=load_weights)
    except Exception as exc:  # DecodeError, external data problems, OS errors
        raise EprunError(f"{path!r} is not a loadable ONNX model: {type(exc).__name__}: "
                         f"{one_line(exc)}") from exc
    if model.ir_version < 1 or not model.HasField("graph") or not model.graph.output:
        raise EprunError(f"{path!r} is not a loadable ONNX model: no IR version, graph or output")
    return model


def graph_inputs(model) -> list:
    """The graph inputs a caller must feed (older IRs also list initializers as inputs)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


# -- boundaries --------------------------------------------------------------------------------

def find_boundaries(graph) -> list[str]:
    """The first input of every MatMul/Gemm in file order, then the graph's first output.

    A MatMul's first input is the activation entering a layer; in a QDQ model it is the float
    output of a DequantizeLinear, so the same rule finds comparable tensors in both models.
    """
    boundaries: list[str] = []
    candidates = [node.input[0] for node in graph.node
                  if node.op_type in BOUNDARY_OPS and node.input and node.input[0]]
    candidates += [graph.output[0].name] if graph.output else []
    for name in candidates:
        if name not in boundaries:
            boundaries.append(name)
    return boundaries


def _skeleton(model):
    """A copy of ``model`` without large weight payloads, cheap to run shape inference on.

    Shape inference only needs each initializer's type and dims, plus the values of small ones
    (Reshape targets, axes); copying the whole model would duplicate every weight in memory.
    """
    from onnx import ModelProto, TensorProto

    if not model.graph.initializer:
        return model
    skeleton = ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    graph.name = model.graph.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(model.graph, field))
    for tensor in model.graph.initializer:
        if tensor.ByteSize() <= SKELETON_KEEP_BYTES:
            graph.initializer.append(tensor)
        else:
            graph.initializer.append(TensorProto(name=tensor.name, dims=tensor.dims,
                                                 data_type=tensor.data_type))
    return skeleton


def tensor_types(model) -> dict:
    """Name -> inferred ``TypeProto`` for every tensor whose type shape inference can tell."""
    import onnx

    types = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model)).graph
    except Exception:  # custom domains, invalid graphs: fall back to what the file declares
        inferred = model.graph
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type
    for tensor in model.graph.initializer:
        if tensor.name not in types:
            types[tensor.name] = onnx.helper.make_tensor_type_proto(tensor.data_type, tensor.dims)
    return types


def expose_in_place(model) -> list[str]:
    """Add every boundary that is not yet a graph output; return the boundaries.

    Each new output is declared with its inferred type (float when unknown), so an int8 tensor
    is never declared float and the session still opens.
    """
    import onnx

    boundaries = find_boundaries(model.graph)
    existing = {value.name for value in model.graph.output}
    missing = [name for name in boundaries if name not in existing]
    if missing:
        types = tensor_types(model)
        for name in missing:
            value = onnx.ValueInfoProto(name=name)
            if name in types:
                value.type.CopyFrom(types[name])
            else:
                value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            model.graph.output.append(value)
    return boundaries


def write_atomically(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    A reader never sees a partial file, and a failed write leaves no temporary file behind.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise EprunError(f"cannot write {path!r}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise EprunError(f"cannot write {path!r}: it is a directory")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                             dir=folder)
    except OSError as exc:
        raise EprunError(f"cannot write {path!r}: {exc.strerror or one_line(exc)}") from exc
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644 & ~_umask())
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise EprunError(f"cannot write {path!r}: {exc.strerror or one_line(exc)}") from exc
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# -- the contract input and sessions -----------------------------------------------------------

def contract_input(model, seed: int, rows: int = ROWS, path: str = "model"):
    """``(input name, x)`` with x = default_rng(seed).standard_normal((rows, F)) as float32.

    The model must have exactly one input to feed, float32, of shape ``[batch, F]`` with F
    static; anything else cannot take the contract input and is refused with the reason.
    """
    import numpy as np
    from onnx import TensorProto

    inputs = graph_inputs(model)
    if len(inputs) != 1:
        names = ", ".join(value.name for value in inputs) or "none"
        raise EprunError(f"{path!r} has {len(inputs)} inputs ({names}); eprun feeds exactly one")
    value = inputs[0]
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or tensor.elem_type != TensorProto.FLOAT:
        raise EprunError(f"{path!r}: input {value.name!r} is not a float32 tensor; the contract "
                         "input is float32")
    dims = tensor.shape.dim if tensor.HasField("shape") else []
    if len(dims) != 2:
        raise EprunError(f"{path!r}: input {value.name!r} has rank {len(dims)}; the contract "
                         "input is [rows, F]")
    if not dims[1].HasField("dim_value") or dims[1].dim_value < 1:
        raise EprunError(f"{path!r}: input {value.name!r} has no static dimension 1 (F)")
    if dims[0].HasField("dim_value") and dims[0].dim_value not in (0, rows):
        raise EprunError(f"{path!r}: input {value.name!r} fixes the batch at "
                         f"{dims[0].dim_value}; the contract input has {rows} rows")
    features = dims[1].dim_value
    x = np.random.default_rng(seed).standard_normal((rows, features)).astype(np.float32)
    return value.name, x


def import_ort():
    """onnxruntime, imported on first use, with its native log limited to fatal errors.

    Its warnings would only repeat what the JSON answer states, and its error log would
    duplicate the one-line error eprun prints; ``EPRUN_DEBUG=1`` keeps both.
    """
    import onnxruntime

    if not os.environ.get("EPRUN_DEBUG"):
        onnxruntime.set_default_logger_severity(4)
    return onnxruntime


def cpu_session(model_or_path, options=None, what: str = "model"):
    """A CPU-only session from a path or serialized bytes; failures become one clear error."""
    ort = import_ort()
    try:
        return ort.InferenceSession(model_or_path, sess_options=options,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise EprunError(f"onnxruntime cannot open {what}: {type(exc).__name__}: "
                         f"{one_line(exc)}") from exc


def run_session(session, output_names: list[str] | None, feed: dict, what: str = "model") -> list:
    try:
        return session.run(output_names, feed)
    except Exception as exc:
        raise EprunError(f"onnxruntime failed to run {what}: {type(exc).__name__}: "
                         f"{one_line(exc)}") from exc


# -- providers ---------------------------------------------------------------------------------

def providers(model_path: str, requests: list[list[str]]) -> dict:
    """One session per requested list; what it actually holds, what was missing, and whether
    it fell back. A model onnxruntime cannot open is reported per case, not as a failure."""
    require_file(model_path)
    ort = import_ort()
    available = list(ort.get_available_providers())
    cases = []
    for requested in requests:
        try:
            session = ort.InferenceSession(model_path, providers=requested)
            actual, error = list(session.get_providers()), None
            del session
        except Exception as exc:
            actual, error = [], type(exc).__name__
        cases.append({
            "requested": requested,
            "actual": actual,
            "missing": [name for name in requested if name not in available],
            "fell_back": actual != requested,
            "error": error,
        })
    return {"model": model_path, "available": available, "cases": cases}


# -- partition ---------------------------------------------------------------------------------

def partition_nodes(op_types: list[str], supported: list[str]) -> list[dict]:
    """Consecutive runs of nodes with the same owner, in the order given."""
    partitions: list[dict] = []
    supported_set = set(supported)
    for op_type in op_types:
        owner = "ep" if op_type in supported_set else "cpu"
        if partitions and partitions[-1]["owner"] == owner:
            partitions[-1]["nodes"].append(op_type)
        else:
            partitions.append({"owner": owner, "nodes": [op_type]})
    return [{"owner": part["owner"], "nodes": part["nodes"], "size": len(part["nodes"])}
            for part in partitions]


def partition(model_path: str, supported: list[str]) -> dict:
    """A simulation in file order, not real placement: needs only onnx, never a session."""
    model = load_model(model_path, load_weights=False)
    op_types = [node.op_type for node in model.graph.node]
    partitions = partition_nodes(op_types, supported)
    return {
        "model": model_path,
        "supported": supported,
        "nodes": len(op_types),
        "claimed": sum(part["size"] for part in partitions if part["owner"] == "ep"),
        "partition_count": len(partitions),
        "handoffs": max(len(partitions) - 1, 0),
        "partitions": partitions,
    }


# -- expose ------------------------------------------------------------------------------------

def _same_file(first: str, second: str) -> bool:
    if os.path.exists(second):
        return os.path.samefile(first, second)
    return os.path.realpath(first) == os.path.realpath(second)


def expose(model_path: str, out_path: str) -> dict:
    """Save a copy of the model whose outputs include every boundary; the input is untouched."""
    model = load_model(model_path, load_weights=False)
    if _same_file(model_path, out_path):
        raise EprunError(f"refusing to overwrite the input model {model_path!r}; "
                         "choose another output path", EXIT_USAGE)
    boundaries = expose_in_place(model)
    write_atomically(model.SerializeToString(), out_path)
    return {"model": model_path, "out": out_path, "boundaries": boundaries,
            "outputs": [value.name for value in model.graph.output]}


# -- layers and growth -------------------------------------------------------------------------

def boundary_tensors(model_path: str, seed: int):
    """Expose a model in memory and run it once on the contract input.

    Returns ``(boundaries, F, tensors)``. The parsed model and its serialized bytes are dropped
    as soon as the next stage holds the data, so at most two copies of the weights coexist.
    """
    model = load_model(model_path)
    name, x = contract_input(model, seed, path=model_path)
    boundaries = expose_in_place(model)
    try:
        serialized = model.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise EprunError(f"{model_path!r} is too large to expose in memory: {one_line(exc)}") \
            from exc
    del model
    session = cpu_session(serialized, what=repr(model_path))
    del serialized
    tensors = run_session(session, boundaries, {name: x}, what=repr(model_path))
    return boundaries, x.shape[1], tensors


def compare_boundary(a, b, rows: int = ROWS) -> dict:
    """``max_abs_error``, ``scale``, ``rel_error`` and ``cos_min`` of one boundary pair.

    ``a`` is the fp32 tensor, ``b`` the int8 one. Sums run in float64; a row whose cosine has
    a zero denominator counts as 1.0; non-finite values propagate (and become JSON null).
    """
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        max_abs_error = float(np.max(np.abs(a - b))) if a.size else 0.0
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        rel_error = max_abs_error / scale if scale != 0 else 0.0
        a_rows, b_rows = a.reshape(rows, -1), b.reshape(rows, -1)
        dots = np.einsum("ij,ij->i", a_rows, b_rows)
        norms = np.linalg.norm(a_rows, axis=1) * np.linalg.norm(b_rows, axis=1)
        cosines = np.where(norms == 0, 1.0, dots / np.where(norms == 0, 1.0, norms))
        cos_min = float(np.min(np.clip(cosines, -1.0, 1.0)))
    if math.isnan(scale):
        rel_error = float("nan")
    return {"max_abs_error": max_abs_error, "scale": scale, "rel_error": rel_error,
            "cos_min": cos_min}


def layers(fp32_path: str, int8_path: str, seed: int) -> dict:
    """Boundary-by-boundary FP32 vs. INT8 error on the contract input, paired by position."""
    require_file(fp32_path)
    require_file(int8_path)
    fp32_boundaries, fp32_features, fp32_tensors = boundary_tensors(fp32_path, seed)
    int8_boundaries, int8_features, int8_tensors = boundary_tensors(int8_path, seed)
    if fp32_features != int8_features:
        raise EprunError(f"the models take different input widths ({fp32_features} in "
                         f"{fp32_path!r}, {int8_features} in {int8_path!r})")
    if len(fp32_boundaries) != len(int8_boundaries):
        raise EprunError(f"boundary counts differ: {len(fp32_boundaries)} in {fp32_path!r}, "
                         f"{len(int8_boundaries)} in {int8_path!r}; boundaries are paired by "
                         "position, so the models must have the same layer structure")
    entries = []
    for index, (fp32_name, int8_name) in enumerate(zip(fp32_boundaries, int8_boundaries)):
        a, b = fp32_tensors[index], int8_tensors[index]
        if a.shape != b.shape or a.size % ROWS:
            raise EprunError(f"boundary {index} ({fp32_name!r} vs. {int8_name!r}): shapes "
                             f"{list(a.shape)} and {list(b.shape)} cannot be compared row by "
                             f"row over {ROWS} rows")
        entries.append({"index": index, "fp32": fp32_name, "int8": int8_name,
                        **compare_boundary(a, b)})
    return {"seed": seed, "rows": ROWS, "layer_count": len(entries), "layers": entries}


def growth_from(rel_errors: list[float]) -> dict:
    """Ratios of consecutive relative errors, monotonicity, total growth and the largest jump.

    ``ratios[k-1]`` belongs to layer ``k``; ``max_ratio.index`` is that layer index. A ratio
    over a zero (or non-finite) predecessor is null and never the maximum.
    """
    def ratio(numerator: float, denominator: float) -> float | None:
        if denominator == 0 or not math.isfinite(denominator) or not math.isfinite(numerator):
            return None
        return numerator / denominator

    ratios = [ratio(rel_errors[k], rel_errors[k - 1]) for k in range(1, len(rel_errors))]
    max_ratio = None
    for layer, value in enumerate(ratios, start=1):
        if value is not None and math.isfinite(value) and (max_ratio is None
                                                           or value > max_ratio["ratio"]):
            max_ratio = {"index": layer, "ratio": value}
    return {
        "layer_count": len(rel_errors),
        "rel_error": list(rel_errors),
        "ratios": ratios,
        "monotone": all(rel_errors[k] >= rel_errors[k - 1] for k in range(1, len(rel_errors))),
        "total_growth": ratio(rel_errors[-1], rel_errors[0]) if rel_errors else None,
        "max_ratio": max_ratio,
    }


def growth(fp32_path: str, int8_path: str, seed: int) -> dict:
    """The ``layers`` measurement reduced to how relative error grows; one run, not two."""
    measured = layers(fp32_path, int8_path, seed)
    return {"seed": seed, **growth_from([entry["rel_error"] for entry in measured["layers"]])}


# -- settings ----------------------------------------------------------------------------------

def settings(model_path: str, seed: int) -> dict:
    """The first output under other optimization levels and intra-op thread counts, compared
    with the single-threaded, unoptimized baseline bit for bit."""
    import numpy as np

    model = load_model(model_path, load_weights=False)
    name, x = contract_input(model, seed, path=model_path)
    del model
    ort = import_ort()

    def first_output(level: str, intra_op: int):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.intra_op_num_threads = intra_op
        options.inter_op_num_threads = 1
        session = cpu_session(model_path, options, what=repr(model_path))
        return run_session(session, [session.get_outputs()[0].name], {name: x},
                           what=repr(model_path))[0]

    base = first_output(*SETTINGS_BASELINE)
    with np.errstate(all="ignore"):
        baseline = {"level": SETTINGS_BASELINE[0], "intra_op": SETTINGS_BASELINE[1],
                    "max_abs_output": float(np.max(np.abs(base))) if base.size else 0.0,
                    "mean_output": float(base.mean()) if base.size else float("nan")}
        cases = []
        for level, intra_op in SETTINGS_CASES:
            y = first_output(level, intra_op)
            same_shape = y.shape == base.shape
            diff = (np.max(np.abs(y.astype(np.float64) - base.astype(np.float64)))
                    if same_shape and y.size else (0.0 if same_shape else float("nan")))
            cases.append({"level": level, "intra_op": intra_op, "max_abs_diff": float(diff),
                          "bitwise_equal": bool(same_shape and y.dtype == base.dtype
                                                and y.tobytes() == base.tobytes())})
    return {"model": model_path, "seed": seed, "baseline": baseline, "cases": cases,
            "all_equal": all(case["bitwise_equal"] for case in cases)}


# -- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with eprun's one-line usage errors (exit 2, nothing on stdout)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"eprun: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="eprun.py", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Exit codes: 0 ok, 2 usage, 3 missing input file, 4 other failure.")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    commands.required = True

    def command(name: str, summary: str, fields: str, run: Callable[[argparse.Namespace], dict]):
        sub = commands.add_parser(name, help=summary, description=f"{summary}\n\nJSON: {fields}",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(run=run)
        return sub

    sub = command("providers", "requested vs. actual execution providers, one session per list",
                  '{"model", "available", "cases": [{"requested", "actual", "missing", '
                  '"fell_back", "error"}]}',
                  lambda args: providers(args.model, args.lists))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("lists", nargs="+", type=parse_list, metavar="list",
                     help="comma-joined provider names, e.g. CUDAExecutionProvider,CPUExecutionProvider")

    sub = command("partition", "file-order simulation of the partitions an EP supporting only "
                  "the listed ops would form (no session)",
                  '{"model", "supported", "nodes", "claimed", "partition_count", "handoffs", '
                  '"partitions": [{"owner", "nodes", "size"}]}',
                  lambda args: partition(args.model, args.supported))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("supported", type=parse_list, help="comma-joined op types, e.g. MatMul,Add")

    sub = command("expose", "save a copy whose graph outputs include every layer boundary "
                  "(first input of each MatMul/Gemm, then the first output)",
                  '{"model", "out", "boundaries", "outputs"}',
                  lambda args: expose(args.model, args.out))
    sub.add_argument("model", help="ONNX model file (never modified)")
    sub.add_argument("out", help="path of the exposed model to write")

    for name, summary, fields, run in (
            ("layers", "FP32 vs. INT8 error at every boundary on the contract input",
             '{"seed", "rows", "layer_count", "layers": [{"index", "fp32", "int8", '
             '"max_abs_error", "scale", "rel_error", "cos_min"}]}',
             lambda args: layers(args.fp32, args.int8, args.seed)),
            ("growth", "how the relative error grows from boundary to boundary",
             '{"seed", "layer_count", "rel_error", "ratios", "monotone", "total_growth", '
             '"max_ratio": {"index", "ratio"}}',
             lambda args: growth(args.fp32, args.int8, args.seed))):
        sub = command(name, summary, fields, run)
        sub.add_argument("fp32", help="float model")
        sub.add_argument("int8", help="quantized (QDQ) model with the same layer structure")
        sub.add_argument("seed", type=parse_seed,
                         help="non-negative integer; x = default_rng(seed).standard_normal((64, F))")

    sub = command("settings", "the first output under other optimization levels and thread "
                  "counts, compared with a single-threaded unoptimized baseline",
                  '{"model", "seed", "baseline": {"level", "intra_op", "max_abs_output", '
                  '"mean_output"}, "cases": [{"level", "intra_op", "max_abs_diff", '
                  '"bitwise_equal"}], "all_equal"}',
                  lambda args: settings(args.model, args.seed))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("seed", type=parse_seed, help="non-negative integer seed of the input")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with stdout_to_stderr():
            answer = args.run(args)
        text = to_json(answer)
    except EprunError as exc:
        _report_failure(exc)
        return exc.code
    except KeyboardInterrupt:
        print("eprun: error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen library failure: still one line
        _report_failure(exc)
        return EXIT_FAILURE
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def _report_failure(exc: BaseException) -> None:
    if os.environ.get("EPRUN_DEBUG"):
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    message = str(exc) if isinstance(exc, EprunError) else f"{type(exc).__name__}: {exc}"
    print(f"eprun: error: {one_line(message)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
