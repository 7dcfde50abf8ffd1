"""eprun: what an ONNX Runtime session really got, and where quantization error grows.

Commands (each prints exactly one compact JSON object on one line to stdout):

    providers <model> <list> [<list> ...]   requested vs. actual execution providers
    partition <model> <supported-ops>       file-order simulation of how an EP would split the graph
    expose    <model> <out.onnx>            save a copy with every layer boundary as a graph output
    layers    <fp32> <int8> <seed>          FP32 vs. INT8 error at every layer boundary
    growth    <fp32> <int8> <seed>          how the relative error grows from boundary to boundary
    settings  <model> <seed>                same model and input under other optimization levels
                                            and thread counts
    placement <model> <providers>           the EP each node was actually assigned to
    check     <reference> <candidate>       CI gate: outputs within rtol/atol/cosine (exit 1 if not)
    report    <fp32> <int8>                 every lab measurement, written as the deliverables

Lists are one argument each, comma-joined; items are stripped and empty items dropped.

Exit codes:

    0  success: stdout holds the JSON answer and nothing else
    1  a verdict that failed (``check``, ``providers --fail-on-fallback``); the JSON answer
       on stdout says why
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
import errno
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

__version__ = "0.9.0"

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


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line, native) message into one line.

    Runs of spaces and newlines become one space; any other control character left (a
    carriage return inside an argument, say) is shown escaped, so stderr stays one line.
    """
    collapsed = " ".join(re.split(r"[ \t\n]+", str(text).strip(" \t\n")))
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], collapsed)


# -- arguments ---------------------------------------------------------------------------------

def parse_list(text: str) -> list[str]:
    """A comma-joined list argument: items stripped, empty items dropped, order kept."""
    return [item.strip() for item in text.split(",") if item.strip()]


_DECIMAL = re.compile(r"[0-9]+", re.ASCII)


def _decimal(text: str, what: str, minimum: int = 0) -> int:
    """ASCII decimal digits only (no sign, space, underscore or other scripts' digits)."""
    if not _DECIMAL.fullmatch(text) or int(text) < minimum:
        kind = "a positive" if minimum else "a non-negative"
        raise argparse.ArgumentTypeError(f"{what}{text!r} is not {kind} integer")
    return int(text)


def parse_seed(text: str) -> int:
    """A seed is a non-negative decimal integer of any size (``default_rng`` takes big ints)."""
    return _decimal(text, "seed ")


def parse_rows(text: str) -> int:
    return _decimal(text, "rows ", minimum=1)


def parse_count(text: str) -> int:
    return _decimal(text, "")


def parse_tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return value


def parse_metrics(text: str) -> tuple[str, ...]:
    metrics = tuple(parse_list(text))
    unknown = [name for name in metrics if name not in METRICS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown metric {unknown[0]!r}; choose from "
                                         f"{', '.join(METRICS)}")
    return metrics


def parse_boundary_ops(text: str) -> tuple[str, ...]:
    """``--boundary-ops Conv`` adds to MatMul and Gemm; it never removes them."""
    return BOUNDARY_OPS + tuple(op for op in parse_list(text) if op not in BOUNDARY_OPS)


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
        raise EprunError(f"{what} {path!r} is a directory; give the path of a file", EXIT_MISSING)
    if not os.path.exists(path):
        raise EprunError(f"{what} file {path!r} does not exist; check the path", EXIT_MISSING)


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
        raise EprunError(f"{path!r} is not a loadable ONNX model ({type(exc).__name__}: "
                         f"{one_line(exc)}); re-export or regenerate it") from exc
    if model.ir_version < 1 or not model.HasField("graph") or not model.graph.output:
        raise EprunError(f"{path!r} is not a loadable ONNX model (no IR version, graph or "
                         "output); re-export or regenerate it")
    return model


def graph_inputs(model) -> list:
    """The graph inputs a caller must feed (older IRs also list initializers as inputs)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


# -- boundaries --------------------------------------------------------------------------------

def find_boundaries(graph, boundary_ops: tuple[str, ...] = BOUNDARY_OPS) -> list[str]:
    """The first input of every MatMul/Gemm in file order, then the graph's first output.

    A MatMul's first input is the activation entering a layer; in a QDQ model it is the float
    output of a DequantizeLinear, so the same rule finds comparable tensors in both models.
    """
    boundaries: list[str] = []
    candidates = [node.input[0] for node in graph.node
                  if node.op_type in boundary_ops and node.input and node.input[0]]
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
        if (tensor.data_location != TensorProto.EXTERNAL
                and _initializer_bytes(tensor) <= SKELETON_KEEP_BYTES):
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


def expose_in_place(model, boundary_ops: tuple[str, ...] = BOUNDARY_OPS) -> list[str]:
    """Add every boundary that is not yet a graph output; return the boundaries.

    Each new output is declared with its inferred type (float when unknown), so an int8 tensor
    is never declared float and the session still opens.
    """
    import onnx

    boundaries = find_boundaries(model.graph, boundary_ops)
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


def write_atomically(data: bytes | Callable[[Any], None], path: str) -> None:
    """Write ``data`` (bytes, or a function that writes into the open file) to ``path`` so
    that ``path`` is either untouched or complete.

    On Linux the bytes go to an unnamed ``O_TMPFILE`` in the target folder that gets a name
    only once it is complete and synced, so even ``kill -9`` mid-write leaves nothing behind.
    Elsewhere a hidden temporary file is used and removed on any failure or signal eprun can
    catch. Either way the final step is a rename, atomic within the folder: two writers of the
    same path leave one complete file.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise EprunError(f"cannot write {path!r}: folder {folder!r} does not exist; create it "
                         "first")
    if os.path.isdir(path):
        raise EprunError(f"cannot write {path!r}: it is a directory; name a file inside it")
    temporary = None
    try:
        handle = _open_unnamed(folder)
        if handle is None:
            import tempfile

            handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                                                 suffix=".tmp", dir=folder)
        with os.fdopen(handle, "wb") as stream:
            if callable(data):
                data(stream)
            else:
                stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
            if temporary is None:
                temporary = _link_unnamed(stream.fileno(), path)
            else:
                os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException as exc:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        if isinstance(exc, OSError):
            raise EprunError(f"cannot write {path!r}: {exc.strerror or one_line(exc)}") from exc
        raise


def _open_unnamed(folder: str) -> int | None:
    """An unnamed file in ``folder`` (Linux ``O_TMPFILE``), or None where unsupported."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd") or os.link not in os.supports_dir_fd:
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY, 0o666)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # the filesystem has no O_TMPFILE: use a named temporary file
        raise


def _link_unnamed(handle: int, path: str) -> str:
    """Give the unnamed file a hidden name beside ``path``, to be renamed onto it at once."""
    folder, base = os.path.split(os.path.abspath(path))
    # os.link only asks linkat() to follow the /proc magic link when given a dir_fd.
    proc_fds = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for attempt in range(100):
            name = os.path.join(folder, f".{base}.{os.getpid()}.{attempt}.tmp")
            try:
                os.link(str(handle), name, src_dir_fd=proc_fds, follow_symlinks=True)
                return name
            except FileExistsError:
                continue
    finally:
        os.close(proc_fds)
    raise OSError(errno.EEXIST, f"no free temporary name beside {path!r}")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# -- the contract input and sessions -----------------------------------------------------------

def contract_input(model, seed: int, rows: int = ROWS, path: str = "model"):
    """``(input name, x)`` for a ``ModelProto``; see ``_contract_x`` for the rules."""
    from onnx import TensorProto

    inputs = graph_inputs(model)
    if len(inputs) != 1:
        _refuse_input_count(path, [value.name for value in inputs])
    value = inputs[0]
    tensor = value.type.tensor_type
    is_float = value.type.HasField("tensor_type") and tensor.elem_type == TensorProto.FLOAT
    dims = tensor.shape.dim if tensor.HasField("shape") else []
    sizes = [dim.dim_value if dim.HasField("dim_value") else None for dim in dims]
    return value.name, _contract_x(path, value.name, is_float, sizes, seed, rows)


def session_contract_input(session, seed: int, rows: int = ROWS, path: str = "model"):
    """``(input name, x)`` from an onnxruntime session's input metadata (no onnx import)."""
    inputs = session.get_inputs()
    if len(inputs) != 1:
        _refuse_input_count(path, [value.name for value in inputs])
    value = inputs[0]
    sizes = [dim if isinstance(dim, int) else None for dim in value.shape]
    return value.name, _contract_x(path, value.name, value.type == "tensor(float)", sizes,
                                   seed, rows)


def _refuse_input_count(path: str, names: list[str]) -> None:
    raise EprunError(f"{path!r} has {len(names)} inputs ({', '.join(names) or 'none'}); eprun "
                     "feeds exactly one float32 [rows, F] input, so give it a single-input model")


def _contract_x(path: str, name: str, is_float: bool, sizes: list, seed: int, rows: int):
    """x = default_rng(seed).standard_normal((rows, *rest)) as float32.

    For the contract's ``[batch, F]`` input that is ``standard_normal((64, F))``. The input must
    be float32, its first dimension the batch (symbolic, unset or equal to ``rows``) and its
    other dimensions static; anything else cannot take the contract input and is refused with
    the reason.
    """
    import numpy as np

    if not is_float:
        raise EprunError(f"{path!r}: input {name!r} is not a float32 tensor; the contract "
                         "input is float32")
    if not sizes:
        raise EprunError(f"{path!r}: input {name!r} has no batch dimension; the contract "
                         "input is [rows, F]")
    for axis, size in enumerate(sizes[1:], start=1):
        if not size or size < 1:
            raise EprunError(f"{path!r}: input {name!r} has no static dimension {axis}; "
                             "every dimension but the batch must be a fixed number")
    if sizes[0] not in (None, 0, rows):
        raise EprunError(f"{path!r}: input {name!r} fixes the batch at {sizes[0]}; the "
                         f"contract input has {rows} rows")
    return np.random.default_rng(seed).standard_normal((rows, *sizes[1:])).astype(np.float32)


def import_ort():
    """onnxruntime, imported on first use, with its warnings and native log quietened.

    Its warnings ("Specified provider ... is not in available provider names") only repeat
    what the JSON answer states, and its error log would duplicate the one-line error eprun
    prints; ``EPRUN_DEBUG=1`` keeps both. The fallback banner it prints still goes to stderr.
    """
    import warnings

    import onnxruntime

    if not os.environ.get("EPRUN_DEBUG"):
        onnxruntime.set_default_logger_severity(4)
        warnings.filterwarnings("ignore", category=UserWarning, module="onnxruntime")
    return onnxruntime


def cpu_session(model_or_path, options=None, what: str = "model",
                providers: list[str] | None = None):
    """A session (CPU only unless ``providers`` says otherwise) from a path or serialized
    bytes; any failure becomes one clear error."""
    ort = import_ort()
    requested = ["CPUExecutionProvider"] if providers is None else providers
    try:
        return ort.InferenceSession(model_or_path, sess_options=options, providers=requested)
    except Exception as exc:
        with_providers = "" if providers is None else f" with providers {requested}"
        raise EprunError(f"onnxruntime cannot open {what}{with_providers}: "
                         f"{type(exc).__name__}: {one_line(exc)}") from exc


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

def ort_partition_units(nodes: list, supported: list[str]) -> list[tuple[str, list[int]]]:
    """onnxruntime's ``CreateSupportedPartitionNodeGroups``, on node indices.

    A Kahn-style topological walk in waves: every supported node that becomes ready joins the
    current group; an unsupported node that consumes a member of the group (the group's
    border) waits for the next wave, and the group closes when a wave runs dry. Independent
    branches therefore merge into one group whatever their order in the file. Each unsupported
    node is emitted when it is processed and each group where it closes, which is a valid
    execution order; the caller merges runs of unsupported nodes into CPU partitions.
    """
    from collections import deque

    producer_of = {output: index for index, node in enumerate(nodes)
                   for output in node.output if output}
    producers = [sorted({producer_of[name] for name in _node_inputs(node)
                         if name in producer_of and producer_of[name] != index})
                 for index, node in enumerate(nodes)]
    consumers: list[list[int]] = [[] for _ in nodes]
    for index, sources in enumerate(producers):
        for source in sources:
            consumers[source].append(index)
    in_degree = [len(sources) for sources in producers]
    supported_set = set(supported)
    ready = deque(index for index, degree in enumerate(in_degree) if degree == 0)
    next_wave: deque = deque()
    units: list[tuple[str, list[int]]] = []
    group: list[int] = []
    border: set[int] = set()
    while ready or next_wave:
        if not ready:
            if group:
                units.append(("ep", group))
            group, border = [], set()
            ready, next_wave = next_wave, deque()
            continue
        index = ready.popleft()
        if nodes[index].op_type in supported_set:
            group.append(index)
            border.discard(index)
            border.update(consumers[index])
        elif index in border:
            next_wave.append(index)
            continue
        else:
            units.append(("cpu", [index]))
        for consumer in consumers[index]:
            in_degree[consumer] -= 1
            if in_degree[consumer] == 0:
                ready.append(consumer)
    if group:
        units.append(("ep", group))
    return units


def _node_inputs(node) -> list[str]:
    """A node's inputs, plus the outer-scope names its subgraphs read (implicit inputs)."""
    names = list(node.input)
    for attribute in node.attribute:
        for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            local = {name for inner in graph.node for name in inner.output}
            local |= {value.name for value in graph.input}
            local |= {tensor.name for tensor in graph.initializer}
            names += [name for inner in graph.node for name in _node_inputs(inner)
                      if name not in local]
    return names


def partition(model_path: str, supported: list[str], mode: str = "file", model=None) -> dict:
    """Which pieces an EP supporting only ``supported`` would get; needs only onnx.

    ``file`` (the contract): runs of consecutive nodes in file order. ``ort``: the groups
    onnxruntime's own partitioner forms, with the unsupported nodes between them merged.
    ``model`` is the already parsed graph of ``model_path``, when the caller has it.
    """
    if model is None:
        model = load_model(model_path, load_weights=False)
    nodes = list(model.graph.node)
    if mode == "ort":
        units = ort_partition_units(nodes, supported)
    else:
        supported_set = set(supported)
        units = [("ep" if node.op_type in supported_set else "cpu", [index])
                 for index, node in enumerate(nodes)]
    # Runs of units with one owner form one partition. onnxruntime's groups are never
    # adjacent (a new wave starts with the unsupported nodes the last group held back), so
    # in ort mode only unsupported nodes merge.
    merged: list[tuple[str, list[int]]] = []
    for owner, members in units:
        if merged and merged[-1][0] == owner:
            merged[-1][1].extend(members)
        else:
            merged.append((owner, list(members)))
    partitions = [{"owner": owner, "nodes": [nodes[i].op_type for i in members],
                   "size": len(members)} for owner, members in merged]
    return {
        "model": model_path,
        "supported": supported,
        "nodes": len(nodes),
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


def expose(model_path: str, out_path: str,
           boundary_ops: tuple[str, ...] = BOUNDARY_OPS, model=None) -> dict:
    """Save a copy of the model whose outputs include every boundary; the input is untouched.

    ``model`` is the already parsed graph of ``model_path``, when the caller has it; it gets
    the new outputs.
    """
    if model is None:
        model = load_model(model_path, load_weights=False)
    if _same_file(model_path, out_path):
        raise EprunError(f"refusing to overwrite the input model {model_path!r}; "
                         "choose another output path", EXIT_USAGE)
    boundaries = expose_in_place(model, boundary_ops)
    carry_external_data(model, model_path, out_path)
    write_atomically(model.SerializeToString(), out_path)
    return {"model": model_path, "out": out_path, "boundaries": boundaries,
            "outputs": [value.name for value in model.graph.output]}


def carry_external_data(model, model_path: str, out_path: str) -> None:
    """Make the external data files of ``model`` reachable from ``out_path``'s folder.

    onnxruntime resolves external data only inside the model's own folder, so an exposed copy
    written elsewhere gets each data file hard-linked next to it (copied, with a note on
    stderr, where a link is impossible). The original data is never moved or rewritten, and
    a different file already at the target is never overwritten.
    """
    import shutil

    source_folder = os.path.dirname(os.path.abspath(model_path))
    target_folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(target_folder) or os.path.samefile(source_folder, target_folder):
        return  # a missing folder is reported by the write itself
    locations = sorted({_external_location(tensor).get("location", "")
                        for tensor in external_tensors(model)})
    for location in locations:
        source = _safe_location(location, model_path)
        require_file(source, "external data")
        target = os.path.join(target_folder, location)
        if os.path.exists(target):
            if os.path.samefile(source, target) or _same_bytes(source, target):
                continue
            raise EprunError(f"cannot write {out_path!r}: its weights must sit at {target!r}, "
                             "which holds other data; choose another output folder")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            print(f"eprun: copying {source!r} to {target!r} (a hard link is not possible "
                  "there)", file=sys.stderr)
            with open(source, "rb") as stream:
                write_atomically(lambda copy: shutil.copyfileobj(stream, copy, 16 << 20), target)


def _same_bytes(first: str, second: str) -> bool:
    if os.path.getsize(first) != os.path.getsize(second):
        return False
    with open(first, "rb") as a, open(second, "rb") as b:
        while True:
            chunk = a.read(16 << 20)
            if chunk != b.read(16 << 20):
                return False
            if not chunk:
                return True


# -- layers and growth -------------------------------------------------------------------------

def boundary_tensors(model_path: str, seed: int, rows: int = ROWS,
                     boundary_ops: tuple[str, ...] = BOUNDARY_OPS):
    """Expose a model in memory and open it.

    Returns ``(boundaries, x, session, input name, estimated bytes per boundary)``. Weights
    stored as external data stay on disk: only the graph is parsed and re-serialized, and
    onnxruntime reads the data itself (see ``open_exposed``).
    """
    model = load_model(model_path, load_weights=False)
    name, x = contract_input(model, seed, rows, path=model_path)
    boundaries = expose_in_place(model, boundary_ops)
    declared = {value.name: value.type for value in model.graph.output}
    sizes = [_estimated_bytes(declared.get(boundary), rows) for boundary in boundaries]
    session = open_exposed(model, model_path)
    return boundaries, x, session, name, sizes


def _estimated_bytes(value_type, rows: int) -> int | None:
    """Bytes of a tensor of this type with the batch axis at ``rows``; None when unknown."""
    if value_type is None or not value_type.HasField("tensor_type"):
        return None
    tensor = value_type.tensor_type
    count = _ELEMENT_BYTES.get(tensor.elem_type)
    if count is None or not tensor.HasField("shape"):
        return None
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value"):
            count *= dim.dim_value
        elif axis == 0:
            count *= rows
        else:
            return None
    return count


def external_tensors(model) -> list:
    from onnx import TensorProto

    return [tensor for tensor in model.graph.initializer
            if tensor.data_location == TensorProto.EXTERNAL]


def _external_location(tensor) -> dict:
    return {entry.key: entry.value for entry in tensor.external_data}


def _safe_location(location: str, model_path: str) -> str:
    """The file an external-data location names, refused (as onnxruntime does) outside the
    model's folder."""
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise EprunError(f"{model_path!r} keeps weights at {location!r}, outside its folder; "
                         "onnxruntime refuses that location")
    return os.path.join(os.path.dirname(os.path.abspath(model_path)), location)


def open_exposed(model, model_path: str):
    """A CPU session with default options for an in-memory (exposed) copy of ``model_path``.

    The weights never pass through protobuf serialization: large inline initializers are moved
    out of ``model`` into arrays and handed to onnxruntime with ``add_external_initializers``,
    which puts them back before any graph optimization, so the graph onnxruntime optimizes is
    the one in the file. Weights stored as external data stay in their files: onnxruntime
    releases that know ``session.model_external_initializers_file_folder_path`` read them from
    the model's folder; older ones get each tensor as a read-only memory map. ``model`` is
    consumed (its large initializers become placeholders).
    """
    ort = import_ort()
    external = external_tensors(model)
    names, arrays = detach_initializers(model)
    serialized = model.SerializeToString()
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in arrays]

    def session_with(extra_names: list[str], extra_values: list, folder_option: bool):
        options = ort.SessionOptions()
        if folder_option:
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path",
                os.path.dirname(os.path.abspath(model_path)))
        if names or extra_names:
            options.add_external_initializers(names + extra_names, values + extra_values)
        return ort.InferenceSession(serialized, sess_options=options,
                                    providers=["CPUExecutionProvider"])

    if external:
        try:
            return session_with([], [], folder_option=True)
        except Exception:  # an onnxruntime without that option: hand it the data instead
            pass
    maps = [_map_external(tensor, model_path) for tensor in external]
    try:
        return session_with([tensor.name for tensor in external],
                            [ort.OrtValue.ortvalue_from_numpy(data) for data in maps],
                            folder_option=False)
    except Exception as exc:
        raise EprunError(f"onnxruntime cannot open {model_path!r}: {type(exc).__name__}: "
                         f"{one_line(exc)}") from exc


# Inline initializers at least this large are handed to onnxruntime as arrays; smaller ones
# (scales, zero points, shapes) stay in the graph where optimizers expect them.
DETACH_MIN_BYTES = 1024


def detach_initializers(model) -> tuple[list[str], list]:
    """Move every large numeric inline initializer out of ``model`` into a numpy array.

    Each tensor becomes a placeholder that declares its name, type and dims and points at
    external data, the form ``add_external_initializers`` replaces. Tensors are converted one
    at a time, so the weights exist about once, never as proto + bytes + parse.
    """
    from onnx import TensorProto, numpy_helper

    names, arrays = [], []
    for tensor in model.graph.initializer:
        if (tensor.data_location == TensorProto.EXTERNAL
                or tensor.data_type not in _DETACHABLE_TYPES
                or _initializer_bytes(tensor) < DETACH_MIN_BYTES):
            continue
        array = numpy_helper.to_array(tensor)
        placeholder = TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type,
                                  data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "eprun-detached"), ("offset", "0"),
                           ("length", str(array.nbytes))):
            entry = placeholder.external_data.add()
            entry.key, entry.value = key, value
        tensor.CopyFrom(placeholder)
        names.append(tensor.name)
        arrays.append(array)
    return names, arrays


# Bytes per element of the numeric ONNX types whose numpy form onnxruntime takes as is (no
# float16/bfloat16/4-bit mappings, which vary across onnx releases): FLOAT, UINT8, INT8,
# UINT16, INT16, INT32, INT64, BOOL, DOUBLE, UINT32, UINT64.
_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 11: 8, 12: 4, 13: 8}
_DETACHABLE_TYPES = frozenset(_ELEMENT_BYTES)


def _initializer_bytes(tensor) -> int:
    """Size of an initializer's data from its dims, without touching the (large) payload;
    0 for a type outside ``_ELEMENT_BYTES``."""
    count = _ELEMENT_BYTES.get(tensor.data_type, 0)
    for dim in tensor.dims:
        count *= dim
    return count


def _map_external(tensor, model_path: str):
    """A read-only memory map of one external-data tensor, located as onnxruntime would."""
    import numpy as np
    from onnx import helper

    location = _external_location(tensor)
    path = _safe_location(location.get("location", ""), model_path)
    require_file(path, "external data")
    try:
        return np.memmap(path, dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type),
                         mode="r", offset=int(location.get("offset", 0)),
                         shape=tuple(tensor.dims))
    except (ValueError, OSError) as exc:
        raise EprunError(f"cannot read the weights of {tensor.name!r} from {path!r}: "
                         f"{one_line(exc)}") from exc


METRICS = ("sqnr", "mse")


def compare_boundary(a, b, rows: int = ROWS, metrics: tuple[str, ...] = ()) -> dict:
    """``max_abs_error``, ``scale``, ``rel_error`` and ``cos_min`` of one boundary pair.

    ``a`` is the fp32 tensor, ``b`` the int8 one. Sums run in float64; a row whose cosine has
    a zero denominator counts as 1.0; non-finite values propagate (and become JSON null).
    ``metrics`` may add ``sqnr_db`` (10·log10 of signal power over error power, the measure
    onnxruntime's qdq_loss_debug reports; null when there is no error) and ``mse``.
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
        measured = {"max_abs_error": max_abs_error, "scale": scale, "rel_error": rel_error,
                    "cos_min": cos_min}
        if "sqnr" in metrics:
            noise = float(np.sum((a - b) ** 2))
            measured["sqnr_db"] = (float(10 * np.log10(float(np.sum(a ** 2)) / noise))
                                   if noise > 0 else None)
        if "mse" in metrics:
            measured["mse"] = float(np.mean((a - b) ** 2)) if a.size else 0.0
    return measured


def measure_layers(fp32_path: str, int8_path: str, seed: int, rows: int = ROWS,
                   boundary_ops: tuple[str, ...] = BOUNDARY_OPS, metrics: tuple[str, ...] = (),
                   local: bool = False, max_memory: int | None = None):
    """The ``layers`` answer, and the int8 model's (exposed) first output for ``report``.

    Each model is opened once. Without ``max_memory`` one run of each fetches every boundary;
    with it, boundaries are fetched in batches whose estimated fp32 + int8 tensor bytes fit the
    budget (a boundary of unknown size goes alone), so memory stays bounded however many
    boundaries there are. The exposed graphs are the same either way, so are the numbers.
    """
    require_file(fp32_path)
    require_file(int8_path)
    fp32_boundaries, fp32_x, fp32_session, fp32_input, fp32_sizes = boundary_tensors(
        fp32_path, seed, rows, boundary_ops)
    int8_boundaries, int8_x, int8_session, int8_input, int8_sizes = boundary_tensors(
        int8_path, seed, rows, boundary_ops)
    if fp32_x.shape != int8_x.shape:
        raise EprunError(f"the models take different input shapes ({list(fp32_x.shape)} in "
                         f"{fp32_path!r}, {list(int8_x.shape)} in {int8_path!r})")
    if len(fp32_boundaries) != len(int8_boundaries):
        raise EprunError(f"boundary counts differ: {len(fp32_boundaries)} in {fp32_path!r}, "
                         f"{len(int8_boundaries)} in {int8_path!r}; boundaries are paired by "
                         "position, so the models must have the same layer structure")
    sizes = [None if a is None or b is None else a + b for a, b in zip(fp32_sizes, int8_sizes)]
    budget = None if max_memory is None else max_memory << 20
    segments = LocalSegments(int8_path, int8_boundaries, rows, metrics) if local else None
    int8_output = int8_session.get_outputs()[0].name
    entries, final, previous = [], None, None
    for batch in plan_batches(sizes, budget):
        fp32_tensors = run_session(fp32_session, [fp32_boundaries[i] for i in batch],
                                   {fp32_input: fp32_x}, what=repr(fp32_path))
        int8_tensors = run_session(int8_session, [int8_boundaries[i] for i in batch],
                                   {int8_input: int8_x}, what=repr(int8_path))
        for index, a, b in zip(batch, fp32_tensors, int8_tensors):
            fp32_name, int8_name = fp32_boundaries[index], int8_boundaries[index]
            if a.shape != b.shape or a.size % rows:
                raise EprunError(f"boundary {index} ({fp32_name!r} vs. {int8_name!r}): shapes "
                                 f"{list(a.shape)} and {list(b.shape)} cannot be compared row "
                                 f"by row over {rows} rows")
            entry = {"index": index, "fp32": fp32_name, "int8": int8_name,
                     **compare_boundary(a, b, rows, metrics)}
            if segments is not None:
                entry["local"] = (segments.measure(index, previous, a) if index else
                                  {key: value for key, value in entry.items()
                                   if key not in ("index", "fp32", "int8")})
            entries.append(entry)
            if int8_name == int8_output:
                final = b
            previous = a
        del fp32_tensors, int8_tensors
    answer = {"seed": seed, "rows": rows, "layer_count": len(entries), "layers": entries}
    if segments is not None:
        answer["local_unavailable"] = segments.unavailable
    return answer, final


def plan_batches(sizes: list[int | None], budget: int | None) -> list[list[int]]:
    """Consecutive boundary indices grouped so each group's estimated bytes fit ``budget``."""
    if budget is None:
        return [list(range(len(sizes)))] if sizes else []
    batches: list[list[int]] = []
    used = 0
    for index, size in enumerate(sizes):
        cost = budget + 1 if size is None else size
        if batches and used + cost <= budget:
            batches[-1].append(index)
            used += cost
        else:
            batches.append([index])
            used = cost
    return batches


def _quantized_from(name: str, producers: dict) -> str:
    """The float tensor that QuantizeLinear -> DequantizeLinear turned into ``name``."""
    node = producers.get(name)
    if node is not None and node.op_type == "DequantizeLinear":
        quantize = producers.get(node.input[0])
        if quantize is not None and quantize.op_type == "QuantizeLinear":
            return quantize.input[0]
    return name


def cut_segment(model, start: str, end: str, types: dict):
    """The nodes that compute ``end`` from ``start``, as a model of their own.

    Walks back from ``end`` through producers in reverse file order, stopping at ``start``.
    Returns ``(segment, reason)``: ``reason`` is None for a link of a chain, else says why the
    segment is not one (it needs a skip connection or the model input, or never reads
    ``start``).
    """
    import onnx
    from onnx import helper

    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    needed, taken = {end}, []
    for node in reversed(model.graph.node):
        if needed.intersection(node.output):
            taken.append(node)
            needed.update(name for name in node.input if name and name != start)
    taken.reverse()
    produced = {output for node in taken for output in node.output}
    unfed = sorted(name for name in needed
                   if name not in produced and name not in initializers and name != end)
    used = {name for node in taken for name in node.input}

    def value(name: str):
        if name in types:
            return helper.make_value_info(name, types[name])
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)

    graph = helper.make_graph(taken, f"segment_{end}", [value(start)], [value(end)],
                              [initializers[name] for name in sorted(used & set(initializers))])
    segment = helper.make_model(graph, opset_imports=list(model.opset_import))
    segment.ir_version = model.ir_version
    segment.functions.extend(model.functions)
    if unfed:
        return segment, f"{end!r} depends on {', '.join(map(repr, unfed))} besides {start!r}"
    if start not in used:
        return segment, f"{end!r} does not depend on {start!r}"
    return segment, None


class LocalSegments:
    """Error each int8 segment introduces on its own, given a perfect (fp32) input.

    For boundary k >= 1 the int8 model's nodes between boundary k-1 and k are cut out and fed
    the fp32 tensor of boundary k-1 where the int8 model quantizes it (the input of the
    QuantizeLinear in front of that boundary's DequantizeLinear), so the segment's own input
    quantization counts as its error. Boundary 0 has no earlier boundary: its local error is
    its error. A segment that needs any other tensor (a skip connection, a second branch) is
    not a chain link; it gets null and a reason in ``unavailable``.
    """

    def __init__(self, int8_path: str, boundaries: list[str], rows: int,
                 metrics: tuple[str, ...]) -> None:
        self.path, self.boundaries, self.rows, self.metrics = int8_path, boundaries, rows, metrics
        self.model = load_model(int8_path, load_weights=False)
        self.producers = {output: node for node in self.model.graph.node
                          for output in node.output}
        self.types = tensor_types(self.model)
        self.unavailable: list[dict] = []

    def measure(self, k: int, fp32_before, fp32_here) -> dict | None:
        start = _quantized_from(self.boundaries[k - 1], self.producers)
        end = self.boundaries[k]
        segment, reason = cut_segment(self.model, start, end, self.types)
        if reason:
            self.unavailable.append({"index": k, "reason": f"not a chain: {reason}"})
            return None
        session = open_exposed(segment, self.path)
        (output,) = run_session(session, [end], {start: fp32_before},
                                what=f"segment {k} of {self.path!r}")
        return compare_boundary(fp32_here, output, self.rows, self.metrics)


def layers(fp32_path: str, int8_path: str, seed: int, rows: int = ROWS,
           boundary_ops: tuple[str, ...] = BOUNDARY_OPS, metrics: tuple[str, ...] = (),
           local: bool = False, max_memory: int | None = None) -> dict:
    """Boundary-by-boundary FP32 vs. INT8 error on the contract input, paired by position."""
    return measure_layers(fp32_path, int8_path, seed, rows, boundary_ops, metrics, local,
                          max_memory)[0]


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
    largest = _largest(ratios, start=1)
    max_ratio = None if largest is None else {"index": largest[0], "ratio": largest[1]}
    return {
        "layer_count": len(rel_errors),
        "rel_error": list(rel_errors),
        "ratios": ratios,
        "monotone": all(rel_errors[k] >= rel_errors[k - 1] for k in range(1, len(rel_errors))),
        "total_growth": ratio(rel_errors[-1], rel_errors[0]) if rel_errors else None,
        "max_ratio": max_ratio,
    }


def _largest(values: list, start: int = 0) -> tuple[int, float] | None:
    """``(index, value)`` of the largest finite value, the earliest on ties; None if none."""
    best = None
    for index, value in enumerate(values, start=start):
        if value is not None and math.isfinite(value) and (best is None or value > best[1]):
            best = (index, value)
    return best


def growth_of(measured: dict) -> dict:
    """The ``growth`` answer for a ``layers`` answer: one measurement, never a second run.

    With local errors measured, ``local_rel_error`` lists each segment's own relative error and
    ``worst_local`` names the segment that introduces the most (earliest on ties): where the
    accumulated error jumps but the local one does not, the layer only inherits.
    """
    answer = {"seed": measured["seed"],
              **growth_from([entry["rel_error"] for entry in measured["layers"]])}
    if "local_unavailable" in measured:
        local_rel = [entry["local"]["rel_error"] if entry["local"] else None
                     for entry in measured["layers"]]
        largest = _largest(local_rel)
        worst = None if largest is None else {"index": largest[0], "rel_error": largest[1]}
        answer.update(local_rel_error=local_rel, worst_local=worst,
                      local_unavailable=measured["local_unavailable"])
    return answer


def growth(fp32_path: str, int8_path: str, seed: int, rows: int = ROWS,
           boundary_ops: tuple[str, ...] = BOUNDARY_OPS, local: bool = False,
           max_memory: int | None = None) -> dict:
    """The ``layers`` measurement reduced to how relative error grows."""
    return growth_of(layers(fp32_path, int8_path, seed, rows, boundary_ops, local=local,
                            max_memory=max_memory))


# -- settings ----------------------------------------------------------------------------------

def settings(model_path: str, seed: int, rows: int = ROWS) -> dict:
    """The first output under other optimization levels and intra-op thread counts, compared
    with the single-threaded, unoptimized baseline bit for bit."""
    import numpy as np

    require_file(model_path)
    ort = import_ort()
    feed: dict = {}

    def first_output(level: str, intra_op: int):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.intra_op_num_threads = intra_op
        options.inter_op_num_threads = 1
        session = cpu_session(model_path, options, what=repr(model_path))
        if not feed:  # the input comes from the first session's metadata: no onnx import
            name, x = session_contract_input(session, seed, rows, path=model_path)
            feed[name] = x
        return run_session(session, [session.get_outputs()[0].name], feed,
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


# -- placement ---------------------------------------------------------------------------------

def _feeds(session, rows: int, seed: int) -> dict:
    """Standard-normal (or zero, for non-float types) inputs for every input of a session;
    symbolic dimensions take ``rows`` for the first axis and 1 elsewhere."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for value in session.get_inputs():
        shape = [dim if isinstance(dim, int) and dim >= 0 else (rows if axis == 0 else 1)
                 for axis, dim in enumerate(value.shape)]
        kind = value.type[len("tensor("):-1] if value.type.startswith("tensor(") else "float"
        dtype = {"float": np.float32, "double": np.float64, "float16": np.float16,
                 "int64": np.int64, "int32": np.int32, "int8": np.int8, "uint8": np.uint8,
                 "bool": np.bool_}.get(kind)
        if dtype is None:
            raise EprunError(f"input {value.name!r} has type {value.type}, which eprun cannot "
                             "feed")
        feeds[value.name] = (rng.standard_normal(shape).astype(dtype)
                             if np.issubdtype(dtype, np.floating) else np.zeros(shape, dtype))
    return feeds


def placement(model_path: str, requested: list[str], seed: int = 0) -> dict:
    """Which execution provider each node was actually assigned to, as onnxruntime reports it.

    onnxruntime 1.24+ records the assignment when asked (``session.record_ep_graph_assignment_
    info``); older releases only show it in a profile, so there eprun runs the model once with
    profiling on and reads each node event's provider. Both list the nodes onnxruntime
    executes, after its graph optimizations: a fused node stands for several of the file's.
    """
    require_file(model_path)
    import tempfile

    ort = import_ort()
    options = ort.SessionOptions()
    source = "profiling"
    if hasattr(ort.InferenceSession, "get_provider_graph_assignment_info"):
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        source = "graph_assignment_info"
    with tempfile.TemporaryDirectory(prefix="eprun-profile-") as scratch:
        if source == "profiling":
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(scratch, "profile")
        session = cpu_session(model_path, options, repr(model_path), providers=requested)
        actual = list(session.get_providers())
        if source == "graph_assignment_info":
            nodes = [{"name": node.name, "op_type": node.op_type, "provider": subgraph.ep_name}
                     for subgraph in session.get_provider_graph_assignment_info()
                     for node in subgraph.get_nodes()]
        else:
            run_session(session, None, _feeds(session, 1, seed), what=repr(model_path))
            nodes = _profiled_nodes(session.end_profiling())
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node["provider"]] = counts.get(node["provider"], 0) + 1
    return {"model": model_path, "requested": requested, "actual": actual,
            "fell_back": actual != requested, "source": source, "counts": counts,
            "nodes": nodes}


def _profiled_nodes(profile_path: str) -> list[dict]:
    """The kernel events of an onnxruntime profile: one per executed node, in run order."""
    import json

    with open(profile_path, encoding="utf-8") as stream:
        events = json.load(stream)
    suffix = "_kernel_time"
    return [{"name": event["name"][:-len(suffix)], "op_type": event["args"].get("op_name", ""),
             "provider": event["args"].get("provider", "")}
            for event in events
            if event.get("cat") == "Node" and event.get("name", "").endswith(suffix)]


# -- check -------------------------------------------------------------------------------------

TOLERANCE_PROFILES = {"fp16": {"rtol": 1e-2, "atol": 1e-3, "min_cos": 0.999},
                      "int8": {"rtol": 1e-1, "atol": 5e-2, "min_cos": 0.990}}
# Errors worth another try: driver watchdog resets and timeouts while an EP compiles its graph.
_TRANSIENT = re.compile(r"time ?out|timed out|TDR|DXGI_ERROR|device (was )?(lost|removed)|"
                        r"temporarily unavailable", re.IGNORECASE)


def _with_retries(action: Callable[[], Any], retries: int, pause: float, used: list) -> Any:
    """Run ``action``, retrying transient provider errors only. ``used[0]`` counts the retries
    spent so far; ``retries`` bounds them for the whole check."""
    import time

    while True:
        try:
            return action()
        except EprunError as exc:
            if used[0] >= retries or not _TRANSIENT.search(str(exc)):
                raise
            used[0] += 1
            print(f"eprun: transient provider error, retrying in {pause:g}s: {exc}",
                  file=sys.stderr)
            time.sleep(pause)


def compare_outputs(reference, candidate, rtol: float, atol: float) -> dict:
    """Element-wise ``|candidate - reference| <= atol + rtol * |reference|`` (numpy's allclose
    with the reference as the desired value), the global cosine and the worst element."""
    import numpy as np

    b = np.asarray(reference, dtype=np.float64)
    a = np.asarray(candidate, dtype=np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(a - b)
        allowed = atol + rtol * np.abs(b)
        excess = np.where(np.isnan(diff), np.inf, diff - allowed)
        violations = int(np.count_nonzero(~(diff <= allowed)))
        norms = float(np.linalg.norm(a.ravel()) * np.linalg.norm(b.ravel()))
        both_zero = not np.any(a) and not np.any(b)
        cosine = 1.0 if both_zero else (float(np.dot(a.ravel(), b.ravel()) / norms)
                                        if norms else 0.0)
        worst = None
        if a.size:
            position = np.unravel_index(int(np.argmax(excess)), a.shape)
            worst = {"index": [int(i) for i in position], "reference": float(b[position]),
                     "candidate": float(a[position]), "abs_diff": float(diff[position]),
                     "allowed": float(allowed[position]), "excess": float(excess[position])}
        max_rel = float(np.max(diff / np.abs(b))) if a.size else 0.0
    return {"max_abs_diff": float(np.max(diff)) if a.size else 0.0, "max_rel_diff": max_rel,
            "cosine": cosine, "elements": int(a.size), "violations": violations,
            "worst": worst}


def check(reference_path: str, candidate_path: str, providers: list[str],
          reference_providers: list[str], profile: str | None, rtol: float | None,
          atol: float | None, min_cos: float | None, rows: int = ROWS, seed: int = 0,
          warmup: int = 1, retries: int = 2, retry_pause: float = 2.0,
          require_providers: bool = False) -> dict:
    """The CI gate: does the candidate (model and providers) match the reference within
    tolerance on the contract input? Fails on any broken bound, and on a fallback if asked."""
    require_file(reference_path)
    require_file(candidate_path)
    tolerance = dict(TOLERANCE_PROFILES[profile or "fp16"])
    tolerance.update({key: value for key, value in
                      (("rtol", rtol), ("atol", atol), ("min_cos", min_cos)) if value is not None})
    retries_used = [0]
    reference_session = cpu_session(reference_path, what=repr(reference_path),
                                    providers=reference_providers)
    input_name, x = session_contract_input(reference_session, seed, rows, path=reference_path)
    reference_outputs = run_session(reference_session, None, {input_name: x},
                                    what=repr(reference_path))
    candidate_session = _with_retries(
        lambda: cpu_session(candidate_path, what=repr(candidate_path), providers=providers),
        retries, retry_pause, retries_used)
    candidate_inputs = candidate_session.get_inputs()
    if len(candidate_inputs) != 1:
        raise EprunError(f"{candidate_path!r} has {len(candidate_inputs)} inputs; the candidate "
                         "must take the reference's single input")
    feed = {candidate_inputs[0].name: x}

    def run_candidate() -> list:
        return _with_retries(lambda: run_session(candidate_session, None, feed,
                                                 what=repr(candidate_path)),
                             retries, retry_pause, retries_used)

    for _ in range(warmup):
        run_candidate()
    candidate_outputs = run_candidate()
    if len(candidate_outputs) < len(reference_outputs):
        raise EprunError(f"{candidate_path!r} has {len(candidate_outputs)} outputs, the "
                         f"reference {len(reference_outputs)}; outputs are paired by position")
    actual = list(candidate_session.get_providers())
    outputs, failures = [], []
    reference_names = [value.name for value in reference_session.get_outputs()]
    candidate_names = [value.name for value in candidate_session.get_outputs()]
    for index, (expected, got) in enumerate(zip(reference_outputs, candidate_outputs)):
        entry = {"reference": reference_names[index], "candidate": candidate_names[index],
                 "shape": list(expected.shape)}
        if expected.shape != got.shape:
            failures.append({"output": entry["reference"], "bound": "shape",
                             "reference": list(expected.shape), "candidate": list(got.shape)})
            outputs.append(entry)
            continue
        entry.update(compare_outputs(expected, got, tolerance["rtol"], tolerance["atol"]))
        outputs.append(entry)
        if entry["violations"]:
            failures.append({"output": entry["reference"], "bound": "tolerance",
                             "violations": entry["violations"], "elements": entry["elements"],
                             "worst": entry["worst"]})
        if not entry["cosine"] >= tolerance["min_cos"]:
            failures.append({"output": entry["reference"], "bound": "min_cos",
                             "cosine": entry["cosine"], "min_cos": tolerance["min_cos"],
                             "by": tolerance["min_cos"] - entry["cosine"]})
    if require_providers and actual != providers:
        failures.append({"bound": "providers", "requested": providers, "actual": actual})
    return {"reference": reference_path, "candidate": candidate_path, "seed": seed, "rows": rows,
            "profile": profile, "tolerance": tolerance,
            "providers": {"requested": providers, "actual": actual,
                          "fell_back": actual != providers,
                          "reference": list(reference_session.get_providers())},
            "warmup": warmup, "retries_used": retries_used[0], "outputs": outputs,
            "failures": failures, "passed": not failures}


# -- report ------------------------------------------------------------------------------------

REPORT_REQUESTS = (["CPUExecutionProvider"], ["AzureExecutionProvider"],
                   ["CUDAExecutionProvider", "CPUExecutionProvider"],
                   ["NoSuchExecutionProvider"], [])
REPORT_NOTE = ("A requested provider list is a wish, not a guarantee: onnxruntime drops providers "
               "it does not have without raising and runs on what is left (CPU at the end); "
               "'actual' is session.get_providers(), the only reliable answer.")
REPORT_SPLITS = (("fp32", "MatMul"), ("fp32", "MatMul,Add,Relu"), ("int8", "MatMul"),
                 ("int8", "MatMul,Add,Relu"),
                 ("int8", "MatMul,Add,Relu,QuantizeLinear,DequantizeLinear"))
REPORT_FILES = ("fp32_exposed.onnx", "int8_exposed.onnx", "providers.json", "growth.json",
                "settings.json", "ep_report.md")


def report(fp32_path: str, int8_path: str, seed: int, out_dir: str | None = None) -> dict:
    """Measure everything the lab asks for and write the deliverables into ``out_dir``.

    All measurements run before the first file is written, so a failure leaves the previous
    deliverables as they were; each file is then written atomically.
    """
    out_dir = out_dir if out_dir is not None else (os.path.dirname(fp32_path) or ".")
    require_file(fp32_path)
    require_file(int8_path)
    paths = {name: os.path.join(out_dir, name) for name in REPORT_FILES}
    for source in (fp32_path, int8_path):
        for target in paths.values():
            if _same_file(source, target):
                raise EprunError(f"refusing to overwrite the input model {source!r} with a "
                                 "deliverable; choose another --out-dir", EXIT_USAGE)
    paths_of = {"fp32": fp32_path, "int8": int8_path}
    graphs = {which: load_model(path, load_weights=False) for which, path in paths_of.items()}
    provider_answer = {**providers(fp32_path, [list(r) for r in REPORT_REQUESTS]),
                       "note": REPORT_NOTE}
    splits = [partition(paths_of[which], parse_list(ops), model=graphs[which])
              for which, ops in REPORT_SPLITS]
    measured, int8_final = measure_layers(fp32_path, int8_path, seed)
    growth_answer = growth_of(measured)
    settings_answer = settings(int8_path, seed)
    exposure = _exposure_effect(int8_path, seed, int8_final)
    markdown = report_markdown(provider_answer, splits, measured, growth_answer,
                               settings_answer, exposure)

    os.makedirs(out_dir, exist_ok=True)
    expose(fp32_path, paths["fp32_exposed.onnx"], model=graphs["fp32"])
    expose(int8_path, paths["int8_exposed.onnx"], model=graphs["int8"])
    for name, answer in (("providers.json", provider_answer), ("growth.json", growth_answer),
                         ("settings.json", settings_answer)):
        write_atomically((to_json(answer) + "\n").encode(), paths[name])
    write_atomically(markdown.encode("utf-8"), paths["ep_report.md"])
    return {"out_dir": out_dir, "files": [paths[name] for name in REPORT_FILES]}


def _exposure_effect(int8_path: str, seed: int, exposed) -> dict:
    """Does exposing the int8 boundaries change the final output? Exposed DQ outputs can stop
    onnxruntime from fusing DequantizeLinear -> MatMul -> QuantizeLinear into one kernel."""
    import numpy as np

    session = cpu_session(int8_path, what=repr(int8_path))
    name, x = session_contract_input(session, seed, path=int8_path)
    output = session.get_outputs()[0].name
    plain = run_session(session, [output], {name: x}, what=repr(int8_path))[0]
    with np.errstate(all="ignore"):
        diff = float(np.max(np.abs(plain.astype(np.float64) - exposed.astype(np.float64))))
    return {"output": output, "bitwise_equal": plain.tobytes() == exposed.tobytes(),
            "max_abs_diff": diff}


def _num(value: float | None, digits: int = 4) -> str:
    return "null" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _ops(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names) if names else "(none)"


def report_markdown(provider_answer: dict, splits: list[dict], measured: dict,
                    growth_answer: dict, settings_answer: dict, exposure: dict) -> str:
    """``ep_report.md``: the four headings of the contract, every number from a measurement."""
    import platform

    import numpy
    import onnxruntime

    available = provider_answer["available"]
    fell_back = [case for case in provider_answer["cases"] if case["fell_back"]]
    errors = [case for case in provider_answer["cases"] if case["error"]]
    lines = [f"eprun report, generated by `python eprun.py report {provider_answer['model']} "
             f"{settings_answer['model']} --seed {settings_answer['seed']}`; the JSON files "
             "beside this report hold every number in full precision.", "",
             "## 무엇을 요청했고 무엇을 쥐었나", "",
             f"This onnxruntime ({onnxruntime.__version__}) offers **{len(available)}** "
             f"execution providers: {_ops(available)}. Each requested list below got its own "
             f"session on `{provider_answer['model']}` (`providers.json`).", "",
             "| requested | actual (`get_providers()`) | missing | fell back | error |",
             "|---|---|---|---|---|"]
    for case in provider_answer["cases"]:
        lines.append(f"| {_ops(case['requested'])} | {_ops(case['actual'])} | "
                     f"{_ops(case['missing'])} | {'yes' if case['fell_back'] else 'no'} | "
                     f"{case['error'] or '—'} |")
    lines += ["", f"{len(fell_back)} of {len(provider_answer['cases'])} requests did not get "
              "exactly what they asked for, and "
              + ("none of them raised an exception: a missing provider is silently dropped, so "
                 "only the session can say what is running."
                 if not errors else f"{len(errors)} raised an exception at session creation."),
              ""]

    lines += ["## 그래프가 쪼개지는 자리", "",
              "A simulation in file order, not real placement: a node is the EP's when its op "
              "type is in the supported list, and each run of consecutive nodes with one owner "
              "is one partition (`eprun.py partition`).", "",
              "| model | supported ops | nodes | claimed by EP | partitions | hand-offs |",
              "|---|---|---|---|---|---|"]
    for split in splits:
        lines.append(f"| `{split['model']}` | {_ops(split['supported'])} | {split['nodes']} | "
                     f"{split['claimed']} | {split['partition_count']} | {split['handoffs']} |")
    fp32_split, int8_split = splits[0], splits[2]
    lines += ["", f"With only `MatMul` supported the float model splits into "
              f"{fp32_split['partition_count']} partitions and the int8 model into "
              f"{int8_split['partition_count']}: QDQ puts a QuantizeLinear/DequantizeLinear "
              "pair between every two compute ops, so an EP that does not claim Q/DQ hands the "
              "tensor back and forth at each of them; claiming Q/DQ as well is what lets the "
              "quantized graph stay in one piece.", ""]

    rel_error = growth_answer["rel_error"]
    ratios = [None] + growth_answer["ratios"]
    lines += ["## 층을 거듭하며 자란 오차", "",
              f"Input: `default_rng({measured['seed']}).standard_normal(({measured['rows']}, F))`"
              ", both models exposed in memory and run on the CPU provider with default session "
              "options; boundary k pairs the k-th tensor of each model (`growth.json`).", "",
              "| boundary | fp32 tensor | int8 tensor | max abs error | scale | rel error | "
              "cos min | ratio to previous |", "|---|---|---|---|---|---|---|---|"]
    for entry, ratio in zip(measured["layers"], ratios):
        lines.append(f"| {entry['index']} | `{entry['fp32']}` | `{entry['int8']}` | "
                     f"{_num(entry['max_abs_error'])} | {_num(entry['scale'])} | "
                     f"{_num(entry['rel_error'])} | {_num(entry['cos_min'], 6)} | "
                     f"{'—' if entry['index'] == 0 else _num(ratio)} |")
    total = growth_answer["total_growth"]
    jump = growth_answer["max_ratio"]
    drops = [k for k in range(1, len(rel_error)) if not rel_error[k] >= rel_error[k - 1]]
    lines += ["", f"Total growth factor, last relative error over the first: **{_num(total)}** "
              f"(`total_growth` = {total!r} in `growth.json`)." if total is not None else
              "Total growth factor: null (the first relative error is 0).", ""]
    if jump:
        lines.append(f"Largest jump: into boundary {jump['index']} "
                     f"(`{measured['layers'][jump['index']]['fp32']}`), ×{_num(jump['ratio'])}.")
    lines.append("Growth was monotone: the relative error never decreased." if not drops else
                 "Growth was not monotone: the relative error fell at boundar"
                 f"{'y' if len(drops) == 1 else 'ies'} {', '.join(map(str, drops))} "
                 "(Relu cuts part of the error and each layer is requantized with its own scale).")
    if all(value is not None and math.isfinite(value) for value in rel_error):
        lines += ["", "```mermaid", "xychart-beta",
                  '    title "Relative error per boundary (int8 vs fp32)"',
                  "    x-axis \"boundary\" [" + ", ".join(f'"{k}"' for k in range(len(rel_error)))
                  + "]", '    y-axis "max abs error / scale"',
                  "    line [" + ", ".join(f"{value:.6g}" for value in rel_error) + "]", "```"]
    lines.append("")

    base = settings_answer["baseline"]
    differing = [case for case in settings_answer["cases"] if not case["bitwise_equal"]]
    lines += ["## 이 기계에서만 참인 것", "",
              "These results hold for this machine's provider set and settings, and may differ "
              "elsewhere:", "",
              f"- **Providers**: {len(available)} available ({_ops(available)}). Which lists fell "
              "back, and to what, is a property of this onnxruntime build: on a machine with "
              "CUDA the CUDA request would hold.",
              f"- **Software**: onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}, "
              f"Python {platform.python_version()} on {platform.machine() or 'unknown'} with "
              f"{os.cpu_count()} logical CPUs. The error table used onnxruntime's default "
              "session options (all graph optimizations, default thread count); other kernels "
              "round differently, so the error values in the last digits are this stack's.",
              f"- **Settings** (`settings.json`, int8 model, seed {settings_answer['seed']}): "
              + ("all three cases (ORT_ENABLE_ALL with 1 thread, ORT_DISABLE_ALL with 2, "
                 "ORT_ENABLE_ALL with 2) were bitwise equal to the single-threaded unoptimized "
                 "baseline here. That is a measurement of this machine, not a guarantee."
                 if not differing else
                 "these cases differed from the single-threaded unoptimized baseline: "
                 + "; ".join(f"{case['level']} with {case['intra_op']} threads (max abs diff "
                             f"{_num(case['max_abs_diff'])})" for case in differing) + "."),
              f"  Baseline output: max |y| = {_num(base['max_abs_output'])}, "
              f"mean = {_num(base['mean_output'])}.",
              "- **Exposure**: exposing the int8 boundary tensors as outputs can change which "
              "fused kernels onnxruntime picks (a DequantizeLinear whose output is a graph "
              "output cannot be folded into a QLinearMatMul). Here the exposed int8 model's "
              f"final output `{exposure['output']}` was "
              + ("bitwise equal to the plain model's, so the error table describes the model "
                 "as deployed."
                 if exposure["bitwise_equal"] else
                 f"**not** equal to the plain model's (max abs diff "
                 f"{_num(exposure['max_abs_diff'])}): the error table describes the exposed "
                 "graph, whose kernels differ from the model as deployed."),
              "- **No timing was measured.** Nothing here says anything about speed; latency on "
              "this machine would not carry over to an accelerator anyway.", ""]
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with eprun's one-line usage errors (exit 2, nothing on stdout)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"eprun: error: {one_line(message)} (see '{self.prog} --help')\n")


def rows_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--rows", type=parse_rows, default=ROWS,
                     help=f"batch size of the input (default {ROWS}, the contract's)")


def boundary_ops_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--boundary-ops", type=parse_boundary_ops, default=BOUNDARY_OPS,
                     help="comma-joined op types whose first input is also a boundary, on top "
                     "of MatMul and Gemm (e.g. Conv)")


class _VersionAction(argparse.Action):
    """``--version``: eprun's own version and those of the libraries it would run with."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import importlib
        import platform

        found = []
        for package in ("onnx", "onnxruntime", "numpy"):  # onnxruntime-gpu etc. import the same
            try:
                found.append(f"{package} {importlib.import_module(package).__version__}")
            except ImportError:
                found.append(f"{package} not installed")
        parser.exit(0, f"eprun {__version__} ({', '.join(found)}; Python "
                    f"{platform.python_version()})\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="eprun.py", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Exit codes: 0 ok, 1 failed verdict (check, --fail-on-fallback), 2 usage, "
                     "3 missing input file, 4 other failure.")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print eprun's version and the onnx, onnxruntime and numpy "
                        "versions it runs with, then exit")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    commands.required = True

    def command(name: str, summary: str, fields: str, run: Callable[[argparse.Namespace], dict],
                verdict: Callable[[argparse.Namespace, dict], int] = lambda args, answer: 0):
        import textwrap

        description = (textwrap.fill(summary, 79) + "\n\n"
                       + textwrap.fill(f"JSON: {fields}", 79, subsequent_indent="  "))
        sub = commands.add_parser(name, help=summary, description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(run=run, verdict=verdict)
        return sub

    sub = command("providers", "requested vs. actual execution providers, one session per list",
                  '{"model", "available", "cases": [{"requested", "actual", "missing", '
                  '"fell_back", "error"}]}',
                  lambda args: providers(args.model, args.lists),
                  lambda args, answer: int(args.fail_on_fallback
                                           and any(case["fell_back"] for case in answer["cases"])))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("lists", nargs="+", type=parse_list, metavar="list",
                     help="comma-joined provider names, e.g. CUDAExecutionProvider,CPUExecutionProvider")
    sub.add_argument("--fail-on-fallback", action="store_true",
                     help="exit 1 (after printing the answer) when any case fell back")

    sub = command("placement", "which execution provider each node was actually assigned to "
                  "(onnxruntime's graph assignment info, or a one-run profile on releases "
                  "before 1.24)",
                  '{"model", "requested", "actual", "fell_back", "source", "counts", '
                  '"nodes": [{"name", "op_type", "provider"}]}',
                  lambda args: placement(args.model, args.providers))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("providers", type=parse_list, help="comma-joined provider names")

    sub = command("partition", "file-order simulation of the partitions an EP supporting only "
                  "the listed ops would form (no session)",
                  '{"model", "supported", "nodes", "claimed", "partition_count", "handoffs", '
                  '"partitions": [{"owner", "nodes", "size"}]}',
                  lambda args: partition(args.model, args.supported, args.mode))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("supported", type=parse_list, help="comma-joined op types, e.g. MatMul,Add")
    sub.add_argument("--mode", choices=("file", "ort"), default="file",
                     help="file: runs of consecutive nodes in file order (the contract, default); "
                     "ort: the groups onnxruntime's partitioner forms (topological, branches "
                     "merge)")

    sub = command("expose", "save a copy whose graph outputs include every layer boundary "
                  "(first input of each MatMul/Gemm, then the first output)",
                  '{"model", "out", "boundaries", "outputs"}',
                  lambda args: expose(args.model, args.out, args.boundary_ops))
    sub.add_argument("model", help="ONNX model file (never modified)")
    sub.add_argument("out", help="path of the exposed model to write")
    boundary_ops_option(sub)

    for name, summary, fields, run in (
            ("layers", "FP32 vs. INT8 error at every boundary on the contract input",
             '{"seed", "rows", "layer_count", "layers": [{"index", "fp32", "int8", '
             '"max_abs_error", "scale", "rel_error", "cos_min"}]}; --metrics adds "sqnr_db" '
             'and/or "mse" per entry; --local adds "local" per entry and "local_unavailable"',
             lambda args: layers(args.fp32, args.int8, args.seed, args.rows, args.boundary_ops,
                                 args.metrics, args.local, args.max_memory)),
            ("growth", "how the relative error grows from boundary to boundary",
             '{"seed", "layer_count", "rel_error", "ratios", "monotone", "total_growth", '
             '"max_ratio": {"index", "ratio"}}; --local adds "local_rel_error", "worst_local" '
             'and "local_unavailable"',
             lambda args: growth(args.fp32, args.int8, args.seed, args.rows, args.boundary_ops,
                                 args.local, args.max_memory))):
        sub = command(name, summary, fields, run)
        sub.add_argument("fp32", help="float model")
        sub.add_argument("int8", help="quantized (QDQ) model with the same layer structure")
        sub.add_argument("seed", type=parse_seed,
                         help="non-negative integer; x = default_rng(seed).standard_normal((64, F))")
        rows_option(sub)
        boundary_ops_option(sub)
        sub.add_argument("--max-memory", type=parse_count, metavar="MB",
                         help="fetch boundaries in batches whose tensors (fp32 + int8) fit in "
                         "about MB megabytes, instead of all at once; 0 fetches one at a time. "
                         "The answer is the same")
        sub.add_argument("--local", action="store_true",
                         help="also feed each int8 segment the fp32 tensor of the boundary before "
                         "it, to separate the error a layer introduces from the error it inherits")
        if name == "layers":
            sub.add_argument("--metrics", type=parse_metrics, default=(),
                             help=f"comma-joined extra metrics per boundary: {', '.join(METRICS)} "
                             "(SQNR in dB and mean squared error)")

    sub = command("settings", "the first output under other optimization levels and thread "
                  "counts, compared with a single-threaded unoptimized baseline",
                  '{"model", "seed", "baseline": {"level", "intra_op", "max_abs_output", '
                  '"mean_output"}, "cases": [{"level", "intra_op", "max_abs_diff", '
                  '"bitwise_equal"}], "all_equal"}',
                  lambda args: settings(args.model, args.seed, args.rows))
    sub.add_argument("model", help="ONNX model file")
    sub.add_argument("seed", type=parse_seed, help="non-negative integer seed of the input")
    rows_option(sub)

    sub = command("check", "CI gate: candidate model and providers against a reference within "
                  "rtol/atol/cosine on the contract input; exit 0 pass, 1 fail",
                  '{"reference", "candidate", "seed", "rows", "profile", "tolerance", '
                  '"providers": {"requested", "actual", "fell_back", "reference"}, "warmup", '
                  '"retries_used", "outputs": [{"reference", "candidate", "shape", "max_abs_diff", '
                  '"max_rel_diff", "cosine", "elements", "violations", "worst"}], "failures", '
                  '"passed"}',
                  lambda args: check(args.reference, args.candidate, args.providers,
                                     args.reference_providers, args.profile, args.rtol,
                                     args.atol, args.min_cos, args.rows, args.seed, args.warmup,
                                     args.retries, args.retry_pause, args.require_providers),
                  lambda args, answer: 0 if answer["passed"] else 1)
    sub.add_argument("reference", help="reference model (usually the FP32 one), run on "
                     "--reference-providers")
    sub.add_argument("candidate", help="candidate model, run on --providers")
    sub.add_argument("--providers", type=parse_list, default=["CPUExecutionProvider"],
                     help="candidate's requested providers (default CPUExecutionProvider)")
    sub.add_argument("--reference-providers", type=parse_list, default=["CPUExecutionProvider"],
                     help="reference's providers (default CPUExecutionProvider)")
    sub.add_argument("--profile", choices=sorted(TOLERANCE_PROFILES),
                     help="fp16: rtol 1e-2, atol 1e-3, cosine >= 0.999 (the default); "
                     "int8: rtol 1e-1, atol 5e-2, cosine >= 0.990")
    for option, what in (("--rtol", "relative"), ("--atol", "absolute")):
        sub.add_argument(option, type=parse_tolerance, help=f"{what} tolerance (overrides the "
                         "profile)")
    sub.add_argument("--min-cos", type=parse_tolerance,
                     help="smallest allowed cosine between the flattened outputs")
    rows_option(sub)
    sub.add_argument("--seed", type=parse_seed, default=0, help="input seed (default 0)")
    sub.add_argument("--warmup", type=parse_count, default=1,
                     help="candidate runs before the measured one (default 1)")
    sub.add_argument("--retries", type=parse_count, default=2,
                     help="extra tries after a transient provider error such as a timeout, "
                     "never after a numeric failure (default 2)")
    sub.add_argument("--retry-pause", type=parse_tolerance, default=2.0,
                     help="seconds between tries (default 2)")
    sub.add_argument("--require-providers", action="store_true",
                     help="fail when the candidate's session did not get exactly --providers")

    sub = command("report", "run every lab measurement and write the deliverables: "
                  + ", ".join(REPORT_FILES),
                  '{"out_dir", "files"} (the JSON files hold the command answers; providers.json '
                  'adds "note")',
                  lambda args: report(args.fp32, args.int8, args.seed, args.out_dir))
    sub.add_argument("fp32", help="float model")
    sub.add_argument("int8", help="quantized (QDQ) model")
    sub.add_argument("--seed", type=parse_seed, default=0, help="input seed (default 0)")
    sub.add_argument("--out-dir", help="folder to write into (default: the fp32 model's folder)")
    return parser


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("SIGTERM", "SIGHUP"):  # unwind through the cleanup code instead of vanishing
        if hasattr(signal, name) and signal.getsignal(getattr(signal, name)) == signal.SIG_DFL:
            signal.signal(getattr(signal, name), _exit_on_signal)
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
    return args.verdict(args, answer)


def _report_failure(exc: BaseException) -> None:
    if os.environ.get("EPRUN_DEBUG"):
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    message = str(exc) if isinstance(exc, EprunError) else f"{type(exc).__name__}: {exc}"
    print(f"eprun: error: {one_line(message)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
