"""eprun: what an ONNX Runtime session really got, and where quantization error grows.

Commands (each prints exactly one compact JSON object on one line to stdout; ``--format
table`` on any of them prints aligned columns instead, and ``EPRUN_FORMAT=table`` makes that
a person's default):

    providers <model> <list> [<list> ...]   requested vs. actual execution providers
    partition <model> <supported-ops>       file-order simulation of how an EP would split the graph
    expose    <model> <out.onnx>            save a copy with every layer boundary as a graph output
    layers    <fp32> <int8> <seed>          FP32 vs. INT8 error at every layer boundary
    growth    <fp32> <int8> <seed>          how the relative error grows from boundary to boundary
    settings  <model> <seed>                same model and input under other optimization levels
                                            and thread counts
    placement <model> <providers>           the EP each node was actually assigned to
    check     <reference> <candidate>       CI gate: outputs within rtol/atol/cosine (exit 1 if not)
    reduce    <model> --output <out.onnx>   the smallest part of a model that still fails
    sensitivity <fp32> <int8> <seed>        which quantized units to keep in float
    weights   <fp32> <int8>                 each quantized weight against its float original
    inspect   <model>                       opsets, inputs, outputs, op types, weights, Q/DQ
    report    <fp32> <int8>                 every lab measurement, written as the deliverables

Lists are one argument each, comma-joined; items are stripped and empty items dropped.
Every command that opens sessions runs them where ``--providers`` says (built-in EPs by name,
plugin EPs through their devices, ``policy:NAME`` device policies; ``--ep-library``,
``--ep-option``), and refuses a measurement whose session did not get what was asked for.

Map of the file. It reads top-down in eleven layers, each under a ``# == N. Title`` banner; a
layer uses the layers above it, never one below (tests/test_layers.py checks). onnx,
onnxruntime, numpy and matplotlib are imported inside the functions that need them, never at
the top, so a command loads only what it uses.

    1. Contract and declarations  exit codes, EprunError, argument parsers, Command and
       declare, the records of shared flag groups (ProviderFlags, ...), strict JSON; the
       standard library only
    2. I/O safety  the Invocation (what one call of main holds, for a signal to release),
       the stdout guard, progress, temporaries, signals, paths, staging and commit, npz
       files, locked folders
    3. Model access  graphs read without their weights, external data, GraphIndex, value
       types, eprun's mark on what it writes; onnx's generated messages, onnx itself only
       where they do not do
    4. Sessions and providers  import_ort and OrtLog, execution providers and plugin EPs,
       session_options and open_session (the only places options and sessions are made),
       what an EP takes (ort_partition_groups), its colour, what the report asks for
    5. Measurement core  feeds, golden files, boundaries, comparison and METRICS, paired
       boundaries, local error, growth, the gate (outputs judged against tolerances),
       weights read back as onnxruntime dequantizes them; numpy
    6. Rendering  answers into text: a verdict's line, the report's markdown, Model
       Explorer node data, plots (matplotlib, only when asked for), tables
    7. Sensitivity  sensitivity's machinery: the quantized units, quantize_static run again,
       each unit restored and measured (in worker processes), the ranking and the verified
       recommendation
    8. Reduction  reduce's machinery: the reference values, the graph cut to a candidate,
       the failure test and the bisection
    9. Optimizer explanation  settings --explain's machinery: onnxruntime's transformers by
       release, the search for a minimal set whose disabling restores the baseline
    10. Commands  each command's options record, its function, what only it uses (a
       command's own runner, its table of words) and its declaration, in the order listed
       above
    11. Command line  the parser, main() (which makes the Invocation and passes the words it
       parsed down), the one failure report

Where to change what:

    a metric     one ``Metric(field, compute, higher_is_better, log_scale, label)`` in
                 METRICS (layer 5), nothing else: --metrics offers it; layers (and --local's
                 segments) compute it per boundary; the table's column and worst marker,
                 node data and plots read it from there (also through the Python API)
    a command    in a section of its own in layer 10: its options record (a frozen
                 dataclass of its flags, inheriting the shared groups), its function
                 (models, seed, ``options``) and ``declare(Command(..., options=...,
                 positionals=(...)))``, called as ``function(*positionals, options)``;
                 a table renderer in _TABLES (layer 6); docs/development.md lists the rest
                 (a default invocation and a test file); machinery a command needs beyond
                 measuring (a search, a cut of the graph) is a layer of its own above it
    an EP rule   layer 4: how an EP is asked for (ProviderRequest: by name, by device, by
                 policy), what counts as not getting it (fallback_of, require_got), what it
                 needs (PROVIDER_PACKAGES, PROVIDER_OPTION_KEYS), what it takes
                 (ort_partition_groups)
    sensitivity  layer 7 alone (units, requantization, measurement, ranking), and the
                 command's own section in layer 10; reduce and settings --explain likewise
                 (layers 8 and 9)

State: what a command computes comes in through its arguments: its models, its seed and
its options record. One call of main() has its Invocation (layer 2), which only the I/O and
model-access layers reach, for what a signal handler must find and release whatever runs
(temporaries, the captured streams, child processes) and for the files read (their stamps).
What lives at module level does so on purpose: the process's, not a call's. The registries
COMMANDS (each command's declaration, filled as the file loads) and METRICS (the --metrics
measures; the Python API may add one); _INVOCATIONS (the Invocation of the call in
progress, last; the first is that of direct calls from Python); OrtLog (onnxruntime's log
level is process-wide, and cannot be read back); PLUGINS (the plugin EP libraries
registered: onnxruntime keeps a registration for the rest of the process); _ONE_AT_A_TIME
(main() holds the process's file descriptors 1 and 2, so calls take turns); in a
sensitivity worker process, _WORKER (its open study: a process pool hands its tasks nothing
else); on a Dask worker, the bare module _eprun_dask_state in sys.modules (its studies by
run and the runs that ended: an upload's reload of eprun's copy leaves it alone); and caches
of what cannot change within a process, each a functools cache on its function: onnx's
message classes and native extension (onnx_messages, onnx_native), the op
types by their lower-case spelling (_op_types_by_case) and glibc's malloc_trim
(_malloc_trim). (GraphIndex caches its readers and consumers per graph, on the object.)

Flow: parse the arguments -> read each model's graph only (weights stay on disk) -> expose the
boundaries in memory -> one session per model, one model at a time -> compare with numpy ->
one JSON line. Everything onnxruntime prints meanwhile is held back; a failure is one line.

Exit codes:

    0    success: stdout holds the answer (one JSON line, or the table asked for) and
         nothing else
    1    a verdict that failed (``check``, ``providers --fail-on-fallback``): the JSON answer
         on stdout, one line on stderr saying why
    2    wrong usage: unknown command or option, wrong argument count, a seed that is not a
         non-negative integer, a provider or ``policy:NAME`` onnxruntime does not know, a
         malformed ``--ep-option``, an output that is one of the inputs (or their weights),
         a pair that looks swapped (the quantized model first) without ``--swapped-ok``
    3    a path that is not there: a missing input file (or a directory), an output's folder
    4    any other failure: a file that is not a loadable ONNX model, a session that did not
         get a requested provider (``--providers`` without ``--allow-fallback``), a provider
         that fails to start, boundary counts that differ, a model eprun cannot feed or
         compare, an output it must not or cannot write
    130  interrupted (Ctrl-C)
    143  stopped by SIGTERM (129: SIGHUP)

On failure stdout stays empty and stderr gets one line ``eprun: error: <what and why>``;
``EPRUN_DEBUG=1`` adds the Python traceback. docs/commands.md is the binding description of
every command and field.
"""
from __future__ import annotations

import os
import signal
import sys
import threading


def _startup_interrupt(signum: int, frame: object) -> None:
    """Until main() installs its handlers: Ctrl-C while the rest of this file loads is an
    interruption too, not a traceback."""
    os.write(2, b"eprun: error: interrupted\n")
    os._exit(130)


# Before any other import: the first instants of `python eprun.py` or of the installed `eprun`
# command (which imports this module by name) are interruptible too.
if (__name__ == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "eprun") \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _startup_interrupt)

import argparse
import collections
import contextlib
import dataclasses
import errno
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

__version__ = "0.14.0"
__all__ = ["COMMANDS", "METRICS", "CheckOptions", "EprunError", "ExposeOptions", "InputOptions",
           "InspectOptions", "LayerOptions", "Metric", "PartitionOptions", "PlacementOptions",
           "ProvidersOptions", "ReduceOptions", "ReportOptions", "SensitivityOptions",
           "SettingsOptions", "WeightsOptions", "check", "cli", "expose", "growth", "inspect",
           "layers", "main", "partition", "placement", "providers", "reduce", "report",
           "sensitivity", "settings", "weights"]


# == 1. Contract and declarations ==================================================================


# -- exit codes and errors -------------------------------------------------------------------------

EXIT_USAGE = 2
EXIT_MISSING = 3
EXIT_FAILURE = 4

ROWS = 64
BOUNDARY_OPS = ("MatMul", "Gemm")
# The quantized forms of the boundary ops: their first input is the quantized activation, read
# back as float with its own scale and zero point (see ``Quantization``), or, in the weight-only
# forms (``WEIGHT_ONLY_OPS``), the float activation itself.
QUANTIZED_FORMS = {"MatMul": ("QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul",
                              "MatMulIntegerToFloat", "MatMulNBits", "MatMulBnb4"),
                   "Gemm": ("QGemm",),
                   "Conv": ("QLinearConv", "ConvInteger")}
# onnxruntime's weight-only quantized ops (com.microsoft): a constant weight stored in blocks of
# 2 to 8 bits, each block with its own scale, and float activations. MatMulNBits is what
# MatMulNBitsQuantizer writes, MatMulBnb4 bitsandbytes' FP4/NF4, GatherBlockQuantized a
# quantized embedding table.
WEIGHT_ONLY_OPS = ("MatMulNBits", "MatMulBnb4", "GatherBlockQuantized")
# A symbolic dimension other than the batch takes this value unless --dim sets it: a multiple of
# 32, so CNNs that downsample by up to 32 and sequence models both accept it.
DIM_DEFAULT = 32
TOLERANCE_PROFILES = {"fp16": {"rtol": 1e-2, "atol": 1e-3, "min_cos": 0.999},
                      "int8": {"rtol": 1e-1, "atol": 5e-2, "min_cos": 0.990},
                      "int4": {"rtol": 2e-1, "atol": 5e-1, "min_cos": 0.960}}
SETTINGS_BASELINE = ("ORT_DISABLE_ALL", 1)
SETTINGS_CASES = (("ORT_ENABLE_ALL", 1), ("ORT_DISABLE_ALL", 2), ("ORT_ENABLE_ALL", 2))


class EprunError(Exception):
    """An expected failure: one line for stderr and the exit code it maps to."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        """``message`` for the one stderr line; ``code`` the exit code it maps to (4, any other
        failure, unless given)."""
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # from a worker process, with its exit code
        """Pickled as its type, message and exit code: how a worker's error reaches its parent."""
        return type(self), (str(self), self.code)


class ModelChanged(EprunError):
    """A model file that changed while eprun read it: no other way of reading it helps."""


class ProviderRefused(EprunError):
    """A session that opened without a provider it was asked for (``require_got``): no other
    way of opening it changes that."""


def out_of_space(exc: BaseException) -> bool:
    """A write the disk or quota had no room for: the machine's failure, said plainly."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


# -- arguments -------------------------------------------------------------------------------------

# Patterns stay strings here: ``re`` compiles each on its first use and keeps it, so a run pays
# only for the ones it uses. This one is compiled now: the failure report uses it, and a run
# out of memory must not need memory to say so.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line, native) message into one line.

    Runs of spaces and newlines become one space; any other control character left (a
    carriage return inside an argument, say) is shown escaped, so stderr stays one line.
    """
    collapsed = " ".join(re.split(r"[ \t\n]+", str(text).strip(" \t\n")))
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], collapsed)


def parse_list(text: str) -> list[str]:
    """A comma-joined list argument: items stripped, empty items dropped, order kept."""
    return [item.strip() for item in text.split(",") if item.strip()]


_DECIMAL = r"(?a)[0-9]+"


def _decimal(text: str, what: str, minimum: int = 0) -> int:
    """ASCII decimal digits only (no sign, space, underscore or other scripts' digits), of
    any length (read in pieces below Python's 4,300-digit conversion limit)."""
    value = 0
    if re.fullmatch(_DECIMAL, text):
        for start in range(0, len(text), 4000):
            piece = text[start:start + 4000]
            value = value * 10 ** len(piece) + int(piece)
    if not re.fullmatch(_DECIMAL, text) or value < minimum:
        kind = "a positive" if minimum else "a non-negative"
        raise argparse.ArgumentTypeError(f"{what}{text!r} is not {kind} integer")
    return value


def parse_seed(text: str) -> int:
    """A seed is a non-negative decimal integer of any size (``default_rng`` takes big ints)."""
    return _decimal(text, "seed ")


def parse_rows(text: str) -> int:
    """``--rows``: a positive decimal integer of any size."""
    return _decimal(text, "rows ", minimum=1)


def parse_top_k(text: str) -> int:
    """``--top-k``: a positive decimal integer."""
    return _decimal(text, "K ", minimum=1)


def parse_file(text: str) -> str:
    """The path of a file to read (``--inputs``, ``--load-outputs``, ...): an empty one names
    none, and is not taken for the flag left out."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file; give the file's path")
    return text


def parse_count(text: str) -> int:
    """A non-negative decimal integer of any size, for the count options (``--iteration``,
    ``--retries``, ``--jobs``, ...)."""
    return _decimal(text, "")


def parse_tolerance(text: str) -> float:
    """A finite non-negative number as ``float`` reads it (``1e-3``, ``1_000`` and surrounding
    spaces pass): tolerances, and the options in seconds or dB too."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return value


def parse_output_tolerance(text: str) -> tuple[str, float]:
    """``VALUE`` (every output) or ``NAME:VALUE`` (one output; a name may hold colons)."""
    name, colon, value = text.rpartition(":")
    if not colon:
        return "", parse_tolerance(text)
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r} has no output name before the colon")
    try:
        return name, parse_tolerance(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not VALUE or NAME:VALUE with a non-negative number") from None


def parse_dim(text: str) -> tuple[str, int]:
    """``NAME=VALUE``: a symbolic dimension's name (or ``INPUT:AXIS``) and a positive size."""
    name, _, value = text.rpartition("=")
    if not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name.strip(), _decimal(value.strip(), f"the value of {name.strip()!r}, ", minimum=1)


def parse_extra_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, a quantize_static extra option: VALUE read as JSON where it is (true,
    3, ["MatMul"]), ``True``/``False`` as Python writes them, else as the string it is."""
    import json

    key, equals, value = text.partition("=")
    if not key.strip() or not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    value = value.strip()
    if value in ("True", "False"):
        return key.strip(), value == "True"
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def parse_input_range(text: str) -> tuple[str, tuple[float, float]]:
    """``NAME:LO,HI`` with finite ``LO <= HI``."""
    name, _, bounds = text.rpartition(":")
    parts = bounds.split(",")
    try:
        low, high = (float(part) for part in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        low = high = None
    if (not name.strip() or low is None or not math.isfinite(low) or not math.isfinite(high)
            or low > high):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:LO,HI with finite LO <= HI")
    if not math.isfinite(high - low):
        raise argparse.ArgumentTypeError(f"{text!r}: the width HI - LO is beyond what a float "
                                         "holds; give a narrower range")
    return name.strip(), (low, high)


def parse_cosine(text: str) -> float:
    """A cosine bound: a number from -1 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a cosine (a number from -1 to 1)")
    return value


# Polygraphy's --check-error-stat: elemwise is eprun's per-element test (numpy's isclose), the
# others a statistic of the absolute and the relative difference.
ERROR_STATS = ("elemwise", "max", "mean", "median", "quantile")


def parse_error_stat(text: str) -> tuple[str, str]:
    """``--check-error-stat [NAME:]STAT``: ``(output name or "", statistic)``."""
    name, _, stat = text.rpartition(":")
    if stat.strip() not in ERROR_STATS:
        raise argparse.ArgumentTypeError(f"{text!r}: the statistic is one of "
                                         f"{', '.join(ERROR_STATS)} (NAME:STAT for one output)")
    return name.strip(), stat.strip()


def parse_fraction(text: str) -> float:
    """A number from 0 to 1 (a quantile, a share, an agreement)."""
    value = parse_tolerance(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0 to 1")
    return value


def parse_output_fraction(text: str) -> tuple[str, float]:
    """``[NAME:]Q``: a number from 0 to 1, for one output where NAME is given."""
    name, _, value = text.rpartition(":")
    return name.strip(), parse_fraction(value)


def parse_provider_share(text: str) -> tuple[str, float]:
    """``EP:FRACTION``: the least share of the candidate's nodes that provider EP must take."""
    provider, colon, value = text.rpartition(":")
    if not (colon and provider.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not EP:FRACTION (e.g. "
                                          "OpenVINOExecutionProvider:0.9)")
    return provider.strip(), parse_fraction(value)


def parse_axis(text: str) -> int:
    """An axis: a decimal integer, negative counting from the last."""
    if not re.fullmatch(r"(?a)-?[0-9]{1,6}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not an axis (an integer, -1 the last)")
    return int(text.strip())


def parse_boundary_ops(text: str) -> tuple[str, ...]:
    """``--boundary-ops Conv`` adds to MatMul and Gemm; it never removes them. An ONNX op type
    written in the wrong case (``conv``, ``Matmul``) is a usage error that names it: op types
    are case-sensitive, and such a list would match nothing. Other names (custom ops) pass,
    and are checked against the models (``_note_absent_ops``)."""
    ops = parse_list(text)
    wrong = [(op, _op_types_by_case().get(op.lower())) for op in ops]
    wrong = [(op, right) for op, right in wrong if right is not None and right != op]
    if wrong:
        raise argparse.ArgumentTypeError(
            "op types are case-sensitive: " + "; ".join(
                f"{op!r} is no op type, did you mean {right}?" for op, right in wrong))
    return BOUNDARY_OPS + tuple(op for op in ops if op not in BOUNDARY_OPS)


@functools.lru_cache(maxsize=1)
def _op_types_by_case() -> dict[str, str]:
    """Lower-cased op type -> op type, for ONNX's operators (every domain onnx knows) and the
    quantized forms onnxruntime adds; an op type two of them spell alike in other cases is
    left out (no one spelling to suggest)."""
    from onnx import defs

    names = {schema.name for schema in defs.get_all_schemas_with_history()}
    names |= {form for forms in QUANTIZED_FORMS.values() for form in forms}
    found: dict[str, str | None] = {}
    for name in names:
        key = name.lower()
        found[key] = name if found.get(key, name) == name else None
    return {key: name for key, name in found.items() if name is not None}


def parse_ep_option(text: str) -> tuple[str, str, str]:
    """``EP:KEY=VALUE``: a provider option."""
    provider, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and provider.strip() and key.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not EP:KEY=VALUE (e.g. "
                                         "OpenVINOExecutionProvider:device_type=CPU)")
    return provider.strip(), key.strip(), value


# -- command declarations --------------------------------------------------------------------------

class Arg(NamedTuple):
    """One command-line argument: its names and ``ArgumentParser.add_argument`` options."""

    names: tuple
    options: dict


def arg(*names: str, **options: Any) -> Arg:
    """An ``Arg``: one argument's names and ``add_argument`` options, as a command declares it."""
    return Arg(names, options)


class Command(NamedTuple):
    """Everything about one command, declared next to its function: the parser is built from
    these, the help shows them, and the tests check ``fields`` against real answers.

    ``function`` is called ``function(*positionals, options)``: the parsed arguments
    ``positionals`` names (its models, and a seed where it takes one), in order, then
    ``options``, the record of the command's flags (a frozen dataclass, each field the flag
    of its name, ``inputs`` built from the input flags), made from the parsed arguments of
    its fields' names. ``fields`` are the top-level keys of its
    answer for a contract-shaped model and default options, in order; ``detail`` says what is
    inside them and what options add; ``verdict`` turns an answer into a failure reason (exit
    1) or None; ``onnxruntime`` False: the command never opens a session (nor imports
    onnxruntime).
    """

    name: str
    summary: str
    function: Callable[..., dict]
    arguments: tuple
    fields: tuple
    detail: str = ""
    example: str = ""
    verdict: Callable[[argparse.Namespace, dict], str | None] | None = None
    onnxruntime: bool = True
    options: type | None = None
    positionals: tuple = ()


COMMANDS: dict[str, Command] = {}


def declare(command: Command) -> Command:
    """Register ``command`` in ``COMMANDS`` under its name (a later one of the same name replaces
    it) and return it, for the declaration to keep in a name of its own."""
    COMMANDS[command.name] = command
    return command


# The exit codes (code, name, meaning), for the help, the module docstring and
# docs/commands.md's table; the tests check that all three list every one.
EXIT_CODES = (
    (0, "success", "stdout holds the JSON answer and nothing else"),
    (1, "failed verdict", ("check or providers --fail-on-fallback: the answer on stdout, the "
        "reason on stderr")),
    (2, "usage", ("unknown command or option, wrong argument count, a bad seed or number, an "
        "unknown provider or policy name, a malformed --ep-option, an output that is an "
        "input, an empty path")),
    (3, "missing path", "a missing input file (or a directory), an output's folder"),
    (4, "other failure", ("an unreadable model, a session without a requested provider, a "
        "provider that fails to start, boundary counts that differ, a model eprun cannot feed "
        "or compare, an output it must not or cannot write")),
    (130, "interrupted", "Ctrl-C"),
    (143, "terminated", "SIGTERM (129: SIGHUP)"),
)

# -- the flag groups several commands share, as records --------------------------------------------

# A flag group is a frozen record whose fields are the values of its flags, each field carrying
# its flag's argparse spec (``flag``): the group declares a flag once, and a command takes it by
# inheriting the record and listing the group's flags (``flags_of``). One meaning has one name,
# one metavar, one help text and one default in every command's help (tests/test_contract.py
# reads them all); a different meaning gets a different name.

def flag(*names: str, field_default: Any = None, **options: Any) -> Any:
    """A record field declared with its flag: ``names`` and ``options`` as ``add_argument``
    takes them. ``field_default`` is the record's value when no flag set it (the Python API);
    argparse's own ``default`` stays in ``options`` (an ``append`` flag needs a list there)."""
    return dataclasses.field(default=field_default, metadata={"flag": arg(*names, **options)})


def flags_of(group: type, *names: str) -> tuple[Arg, ...]:
    """The flags ``group`` declares, inherited ones first; with ``names``, those of these
    fields only."""
    return tuple(field.metadata["flag"] for field in dataclasses.fields(group)
                 if "flag" in field.metadata and (not names or field.name in names))


# A command's options record (``Command.options``) takes these fields by inheriting them; the
# command checks them, in its own order, before it measures.

@dataclasses.dataclass(frozen=True)
class EpFlags:
    """How an EP is reached and set: ``--ep-library`` (plugin EP libraries to register) and
    ``--ep-option`` (``{provider: {key: value}}``), for every command that opens sessions."""

    ep_library: list[str] = flag(
        "--ep-library", field_default=(), action="append", default=[], metavar="PATH",
        type=parse_file,
        help="register this plugin EP library (onnxruntime 1.22+) before any session; "
             "repeatable. Installed plugin packages (onnxruntime-ep-*) are registered by "
             "themselves when a list names their EP")
    ep_options: dict | None = flag(
        "--ep-option", type=parse_ep_option, action="append", default=[],
        metavar="EP:KEY=VALUE",
        help="a provider option, e.g. OpenVINOExecutionProvider:device_type=CPU; repeatable")


@dataclasses.dataclass(frozen=True)
class ProviderFlags(EpFlags):
    """Where a command's sessions run: ``--providers`` (None: the CPU, with the contract's
    default session), ``--allow-fallback``, ``--ep-library`` (paths) and ``--ep-option``
    (``{provider: {key: value}}``); ``targets_from`` checks and parses them."""

    providers: list[str] | None = flag(
        "--providers", type=parse_list, metavar="LIST",
        help="where the candidate (int8) model's sessions run: comma-joined provider names, "
             "or one device policy policy:NAME (onnxruntime 1.22+); default the CPU. The "
             "answer then says \"providers\" (and what each session got); a session that "
             "does not get them is refused (exit 4; in check, the gate fails: exit 1) unless "
             "--allow-fallback")
    allow_fallback: bool = flag(
        "--allow-fallback", field_default=False, action="store_true",
        help="accept a session that did not get a provider it asked for (or whose provider "
             "took no node) instead of refusing it (or, in check, failing the gate); the "
             "answer records what each session got")


@dataclasses.dataclass(frozen=True)
class ReferenceProviderFlags(ProviderFlags):
    """``ProviderFlags`` and ``--reference-providers``, for a command that runs a reference
    model beside the candidate (None: the CPU)."""

    reference_providers: list[str] | None = flag(
        "--reference-providers", type=parse_list, metavar="LIST",
        help="where the reference (fp32) model's sessions run, named as --providers "
             "(default the CPU)")


@dataclasses.dataclass(frozen=True)
class ToleranceFlags:
    """The bounds an output is held to: ``--profile``, ``--rtol`` and ``--atol`` (a number, or
    ``[(output, number), ...]`` from NAME:VALUE) and ``--min-cos``; ``tolerances`` reads them."""

    profile: str | None = flag(
        "--profile", choices=[*sorted(TOLERANCE_PROFILES), "auto"],
        help="the tolerances an output is held to. fp16: rtol 1e-2, atol 1e-3, cosine >= "
             "0.999; int8: rtol 1e-1, atol 5e-2, cosine >= 0.990; int4: rtol 2e-1, atol "
             "5e-1, cosine >= 0.960; auto (the default): int8 when the candidate quantizes "
             "(Q/DQ, QLinear*, integer ops) and the reference does not, int4 when it "
             "quantizes weights only, some in blocks of 4 bits or fewer (MatMulNBits, "
             "MatMulBnb4, int4 DequantizeLinear), else fp16. An element fails when "
             "|candidate - reference| > atol + rtol*|reference| (numpy's isclose, the "
             "reference as the desired value; Polygraphy fails it only when both its "
             "absolute and its relative difference are over)")
    rtol: float | list | None = flag(
        "--rtol", type=parse_output_tolerance, action="append", metavar="[NAME:]VALUE",
        help="relative tolerance (overrides the profile); NAME:VALUE for one output; "
             "repeatable")
    atol: float | list | None = flag(
        "--atol", type=parse_output_tolerance, action="append", metavar="[NAME:]VALUE",
        help="absolute tolerance (overrides the profile); NAME:VALUE for one output; "
             "repeatable")
    min_cos: float | None = flag(
        "--min-cos", type=parse_cosine,
        help="smallest allowed cosine between the flattened outputs (overrides the profile)")


@dataclasses.dataclass(frozen=True)
class DaskFlags:
    """A Dask cluster to run the work on (``sensitivity``'s units): its scheduler's address,
    or the file ``dask scheduler --scheduler-file`` wrote (the form batch systems hand over)."""

    dask_scheduler: str | None = flag(
        "--dask-scheduler", metavar="ADDRESS",
        help="run the units as tasks on the Dask cluster whose scheduler is at ADDRESS (e.g. "
             "tcp://host:8786); the workers need onnx, onnxruntime, numpy and distributed of "
             "the same versions, and must read the models by the same absolute paths. "
             "pip install 'eprun[dask]'")
    dask_scheduler_file: str | None = flag(
        "--dask-scheduler-file", type=parse_file, metavar="FILE",
        help="as --dask-scheduler, the address read from the JSON file dask scheduler "
             "--scheduler-file writes")

    def dask(self) -> DaskFlags | None:
        """These flags where they name a cluster, else None; both at once is a usage error."""
        if self.dask_scheduler is not None and self.dask_scheduler_file is not None:
            raise EprunError("--dask-scheduler and --dask-scheduler-file name the scheduler "
                             "twice; give one", EXIT_USAGE)
        if self.dask_scheduler is None and self.dask_scheduler_file is None:
            return None
        return DaskFlags(self.dask_scheduler, self.dask_scheduler_file)

    def option(self) -> str:
        """The flag that names the cluster, as typed: for messages."""
        return "--dask-scheduler" if self.dask_scheduler is not None else "--dask-scheduler-file"


PLOT_FORMATS = ("png", "svg")


@dataclasses.dataclass(frozen=True)
class PlotFlags:
    """``--save-plots DIR`` and ``--plot-format``: where the answer's figures go, if anywhere."""

    save_plots: str | None = flag(
        "--save-plots", metavar="DIR",
        help="also draw the answer into DIR (created if missing) with matplotlib, the optional "
             "plots extra: pip install 'eprun[plots]'; the answer adds \"plots\" (their paths)")
    plot_format: str | None = flag("--plot-format", choices=PLOT_FORMATS,
                                   help="png (the default) or svg")


# The flags of the groups, as the commands list them.
EP_ARGS = flags_of(EpFlags)
PLOT_ARGS = flags_of(PlotFlags)
TOLERANCE_ARGS = flags_of(ToleranceFlags)


def measure_ep_args(reference: bool = True) -> tuple:
    """The provider flags of a command that measures; ``reference`` False leaves out
    ``--reference-providers`` (a command that runs one model)."""
    return flags_of(ReferenceProviderFlags if reference else ProviderFlags)


# Shared flags that fill no group record of their own (the inputs become an InputOptions in
# the measurement layer: ``inputs_from``).
INPUT_ARGS = (
    arg("--rows", type=parse_rows,
        help=f"batch size of the inputs (default {ROWS}, placement 1; a model that fixes its "
             "batch gets that)"),
    arg("--dim", type=parse_dim, action="append", default=[], metavar="NAME=VALUE",
        help=f"value of a symbolic dimension (default {DIM_DEFAULT}); an unnamed one is "
             "INPUT:AXIS=VALUE; repeatable"),
    arg("--input-range", type=parse_input_range, action="append", default=[],
        metavar="NAME:LO,HI",
        help="draw input NAME uniformly from [LO, HI) instead (integers: LO..HI "
             "inclusive); repeatable"),
    arg("--inputs", "--load-inputs", dest="inputs_file", type=parse_file, metavar="FILE.npz",
        help="feed these arrays (numpy.savez, one per input name; or the JSON file "
             "polygraphy run --save-inputs writes, --load-inputs as Polygraphy calls it) "
             "instead of generated ones; their batch sets the rows"),
    arg("--iteration", type=parse_count, metavar="N",
        help="with a Polygraphy JSON file (--inputs, --load-outputs), the iteration to "
             "take (check: every one by default; the other commands: the first)"),
)
BOUNDARY_OPS_ARG = arg(
    "--boundary-ops", type=parse_boundary_ops, default=BOUNDARY_OPS,
    help="comma-joined op types whose first input is also a boundary, on top of MatMul and "
         "Gemm (e.g. Conv); their quantized forms (QLinearConv, ...) count too")
# What --node-data shows of each command's answer (its writers are in the commands layer).
NODE_DATA_ARG = arg("--node-data", metavar="DIR",
                    help="also write Model Explorer node-data files into DIR (created if "
                         "missing): <model file stem>.<quantity>.json, one per model and "
                         "quantity, opened with model-explorer MODEL --extensions="
                         "model_explorer_onnx --node_data_paths=FILE; the answer adds "
                         "\"node_data\" (their paths)")
FORMATS = ("json", "table")
FORMAT_ARG = arg("--format", choices=FORMATS,
                 help="json: one JSON line (default, the contract's form); table: aligned "
                      "columns for people, the worst row marked (EPRUN_FORMAT=table makes it "
                      "your default)")
FORCE_ARG = arg("--force", action="store_true",
                help="replace a file at an output's path that eprun did not write (by default "
                     "that is refused)")
LOCAL_ARG = arg("--local", action="store_true",
                help="also feed each int8 segment the fp32 tensors before it, to separate the "
                     "error a layer introduces from the error it inherits (growth: "
                     "local_rel_error; report: in growth.json and the chart)")

# Argument groups several commands share.
MODEL = arg("model", help="ONNX model file")
SEED = arg("seed", type=parse_seed, nargs="?",
           help="non-negative integer; the inputs are drawn by numpy.random.default_rng(seed) "
                "(or give it as --seed)")
_SEED_HELP = ("the input seed, for numpy.random.default_rng, the same as a positional seed; "
              "0 when neither is given, where the command allows that")
SEED_OPTION = arg("--seed", dest="seed_option", type=parse_seed, metavar="SEED",
                  help=_SEED_HELP)
# Where --seed is the usual form (default 0), a positional seed after the models is taken too.
SEED_FLAG = arg("--seed", type=parse_seed, metavar="SEED", help=_SEED_HELP)
SEED_POSITIONAL = arg("seed_positional", type=parse_seed, nargs="?", metavar="seed",
                      help="the seed as a positional argument, the same as --seed")
FP32_INT8 = (arg("fp32", help="float model"),
             arg("int8", help="quantized model (QDQ, QOperator, dynamic or float16) of it"))


def hidden_alias(name: str, dest: str, **options: Any) -> Arg:
    """An older spelling of a renamed flag, still parsed (``dest``, as the new one) and kept
    out of the help, where only the new name appears; docs/commands.md lists it."""
    return arg(name, dest=dest, help=argparse.SUPPRESS, **options)


def program_name() -> str:
    """The name the user typed eprun by: ``eprun`` for the installed command, ``eprun.py``
    when run as a file (and from other Python code), so that help and hints can be pasted."""
    typed = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "eprun" if typed in ("eprun", "eprun.exe") else "eprun.py"


# -- strict JSON -----------------------------------------------------------------------------------

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


# == 2. I/O safety =================================================================================


# -- the invocation: what one call of main holds ---------------------------------------------------

@dataclasses.dataclass(eq=False)  # each invocation is itself: two fresh ones are not one
class Invocation:
    """What one call of ``main`` holds while it works, for the I/O layers to release whatever
    ends it: ``main`` (and ``cli``) make one and install it for the call (``installed``);
    eprun's functions called directly from other Python code share the one made at import.

    Nothing here decides an answer: what a command computes comes in through its arguments
    (the parsed command line, ``main`` passes it down). This is the registry a signal
    handler must find whatever is running when the signal comes, and the per-call caches of
    the model-access layer. Only layers 2 and 3 reach it through ``current_invocation()``
    (``tests/test_layers.py`` checks); ``main`` hands it to ``_execute`` for what the command
    line itself must know (eprun is the process, a signal came, the answer is out).

    ``program``: eprun is the process (``cli``), not a library in someone else's Python.
    ``terminals``: the terminal that stderr was on before each ``captured_chatter`` took it
    over (None if not a terminal), innermost last: where progress goes. ``stderr``: the real
    stderr while the outermost capture holds fd 2: where a signal's last word goes.
    ``temporaries``: named temporary files and folders, removed if a signal ends the process.
    ``read_stamps``: each model file's stamp when its graph was read (``require_unchanged``).
    ``held``: the signals waiting for each open ``signals_held`` block. ``interrupted``: the
    signals received. ``answered``: the answer is out. ``warned``: the knob warnings given
    (``knob_warning``). ``locations``: each model file's external-data locations
    (``external_locations``). ``children``: the process groups of the commands it runs
    (``reduce --check``, ``own_process_group``), ended with it. ``releases``: what must be let
    go before a signal ends the process (a Dask client: ``released_on_signal``).
    ``releases_kept``: the SIGBUS handler's C callback, kept alive (``install_bus_handler``).
    ``own_environment``: the variables eprun set for its own process, left out of the
    environment of a command it runs (``child_environment``). ``progress_shown``: a
    ``Progress`` line is on the terminal now (``erase_progress``)."""

    program: bool = False
    terminals: list = dataclasses.field(default_factory=list)
    stderr: int | None = None
    temporaries: set = dataclasses.field(default_factory=set)
    read_stamps: dict = dataclasses.field(default_factory=dict)
    held: list = dataclasses.field(default_factory=list)
    interrupted: list = dataclasses.field(default_factory=list)
    answered: bool = False
    warned: set = dataclasses.field(default_factory=set)
    locations: dict = dataclasses.field(default_factory=dict)
    children: set = dataclasses.field(default_factory=set)
    releases: list = dataclasses.field(default_factory=list)
    releases_kept: Any = None
    own_environment: set = dataclasses.field(default_factory=set)
    progress_shown: bool = False


_INVOCATIONS = [Invocation()]  # the one in progress last; the first is that of direct calls


def current_invocation() -> Invocation:
    """The invocation in progress: the I/O layers' registry of what it holds (see
    ``Invocation``)."""
    return _INVOCATIONS[-1]


@contextlib.contextmanager
def installed(invocation: Invocation, *, stays: bool = False) -> Iterator[Invocation]:
    """``invocation`` is the current one for the block; after it the previous one is back,
    unless ``stays`` (``cli``: the process ends with it, and a late signal must still find
    that the answer is out)."""
    _INVOCATIONS.append(invocation)
    try:
        yield invocation
    finally:
        if not stays:
            _INVOCATIONS.remove(invocation)


# -- the stdout guard ------------------------------------------------------------------------------

def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers so native output lands while fd 1 is redirected."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no libc handle (e.g. Windows)
        pass


def _unnamed_file() -> Any:
    """A file with no name for what a run holds: in memory where the system makes one
    (Linux's ``memfd_create``: no temporary folder needed, and no ``tempfile`` to import, with
    ``shutil`` and ``random`` behind it, on every run), else an anonymous temporary file."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return open(os.memfd_create("eprun", os.MFD_CLOEXEC), "w+b")
    import tempfile

    return tempfile.TemporaryFile()  # held open by the caller


@contextlib.contextmanager
def captured_chatter() -> Iterator[Any]:
    """Hold everything written to stdout or stderr during a command, by Python or by native
    code, in a file with no name (``_unnamed_file``); yield that file.

    onnxruntime prints its provider fallback banner with ``print()`` while a session is
    created, logs natively to file descriptor 2, and warns through Python; any of it on stdout
    would corrupt the one JSON line that is the answer, and on stderr it would bury the one
    error line of a failure. ``main`` shows what was held after a success (or with
    ``EPRUN_DEBUG=1``) and drops it after a failure. A closed descriptor stays closed.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        store = _unnamed_file()
    except OSError:  # no writable temporary folder: at least keep stdout clean
        store = None
    # A signal's handler writes its last word to real_stderr() between any two of these steps:
    # the copy of the real stderr is remembered before fd 2 is moved to the store, and
    # forgotten only once fd 2 is back. fd 1 is held first, so that where it was closed the
    # copy of fd 2 cannot take its number.
    target = store.fileno() if store is not None else None
    saved = _copied((1,))
    with contextlib.suppress(OSError):
        os.dup2(target if target is not None else 2, 1)
    if target is not None:
        saved.update(_copied((2,)))
    terminal = saved.get(2)
    invocation = current_invocation()
    invocation.terminals.append(terminal if terminal is not None and os.isatty(terminal) else None)
    if invocation.stderr is None and terminal is not None:
        invocation.stderr = terminal
    try:
        if target is not None:
            with contextlib.suppress(OSError):
                os.dup2(target, 2)
        with contextlib.redirect_stdout(sys.stderr):
            yield store
    finally:
        invocation.terminals.pop()
        for stream in (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__):
            with contextlib.suppress(Exception):  # what was buffered goes to the store too
                stream.flush()
        _flush_c_stdio()
        _put_back(saved)
        if invocation.stderr == terminal and not invocation.terminals:  # the outermost capture ends
            invocation.stderr = None
        for copy in saved.values():
            if copy is not None:
                os.close(copy)


def _copied(fds) -> dict:
    """A copy of each of the descriptors ``fds`` (None for one that is closed)."""
    saved = {}
    for fd in fds:
        try:
            saved[fd] = os.dup(fd)
        except OSError:
            saved[fd] = None
    return saved


def _put_back(saved: dict) -> None:
    """Each descriptor ``_copied`` copied is again what the copy holds (closed if it was); the
    copies stay open."""
    for fd, copy in saved.items():
        if copy is None:
            with contextlib.suppress(OSError):
                os.close(fd)
        else:
            os.dup2(copy, fd)


def replay(store) -> None:
    """Copy what ``captured_chatter`` held to stderr (nothing if stderr is closed)."""
    if store is None:
        return
    store.seek(0)
    while True:
        chunk = store.read(1 << 16)
        if not chunk or not write_fd(2, chunk):
            return


def write_fd(fd: int, data: bytes) -> bool:
    """Write all of ``data`` to a file descriptor; False when it cannot take it."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return False
    return True


def say(line: str) -> None:
    """One line on stderr, written to the descriptor so it works whatever ``sys.stderr`` is;
    silence where stderr is closed or broken."""
    write_fd(2, (line + "\n").encode("utf-8", "backslashreplace"))


def note(message: str) -> None:
    """One line on stderr that explains a result without changing it (held with the rest of
    a command's chatter: shown after a success only)."""
    with contextlib.suppress(Exception):
        print(f"eprun: note: {one_line(message)}", file=sys.stderr, flush=True)


def note_once(message: str) -> None:
    """``note``, once per run however often it is reached (a file read by both sides)."""
    said = current_invocation().warned
    if message not in said:
        said.add(message)
        note(message)


# -- eprun's own environment knobs -----------------------------------------------------------------

def debugging() -> bool:
    """``EPRUN_DEBUG``: off for unset, empty, 0, no, false, off (any case); on for anything
    else (1, yes, a typo: a typo should not hide the traceback asked for)."""
    value = os.environ.get("EPRUN_DEBUG", "").strip().lower()
    return value not in ("", "0", "no", "false", "off", "n", "f")


def knob_warning(message: str) -> None:
    """A warning about one of eprun's own environment variables, once per run; the run goes
    on with the default."""
    warned = current_invocation().warned
    if message not in warned:
        warned.add(message)
        say(f"eprun: warning: {one_line(message)}")


# -- progress --------------------------------------------------------------------------------------

def _progress_after() -> float:
    """``EPRUN_PROGRESS_AFTER``: seconds before progress shows (default 2, ``inf`` never);
    a value that is not a number of seconds is a warning, and the default."""
    text = os.environ.get("EPRUN_PROGRESS_AFTER") or "2"  # empty: as if unset
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        knob_warning(f"EPRUN_PROGRESS_AFTER={text!r} is not a number of seconds (it sets after "
                     "how long progress is shown); using the default, 2")
        return 2.0
    return seconds


class Progress:
    """One updating stderr line ("eprun: what: step i of n") for long work, shown only when
    stderr is a terminal and the work has run for more than a couple of seconds; never on
    stdout, never into a log. ``EPRUN_PROGRESS_AFTER`` sets the seconds (tests use 0)."""

    def __init__(self, what: str, total: int | None = None) -> None:
        """Start the clock for ``what``, of ``total`` steps where known; nothing is shown yet."""
        import time

        self.what, self.total, self.shown = what, total, False
        self.start = time.monotonic()
        self.after = _progress_after()

    def step(self, done: int) -> None:
        """Show that ``done`` steps are finished (with a ``total``, and about how long the rest
        takes at the pace so far) on the terminal stderr was on before ``captured_chatter`` took it,
        once the wait has passed; else nothing."""
        import time

        terminal = current_invocation().terminals[-1] if current_invocation().terminals else None
        elapsed = time.monotonic() - self.start
        if terminal is not None and elapsed >= self.after:
            of = f" of {self.total}" if self.total else ""
            if self.total and 0 < done < self.total:  # the steps so far, at their pace
                of += f", about {_duration(elapsed / done * (self.total - done))} left"
            line = f"\reprun: {self.what}: step {done}{of}\x1b[K"
            current_invocation().progress_shown = True  # first: a signal may come right after
            self.shown = write_fd(terminal, line.encode()) or self.shown
            current_invocation().progress_shown = self.shown

    def close(self) -> None:
        """Erase the progress line, if one was shown."""
        if self.shown:
            erase_progress()


def erase_progress() -> None:
    """Erase the progress line on the terminal, if one is shown (before a failure's line or a
    signal's last word, which would otherwise land at its end). Within a capture that holds
    no terminal, the line stays marked as shown, for the caller's capture to erase."""
    invocation = current_invocation()
    if invocation.progress_shown and invocation.terminals and invocation.terminals[-1] is not None:
        write_fd(invocation.terminals[-1], b"\r\x1b[K")
        invocation.progress_shown = False


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: "8 s", "3 min", "1 h 5 min"."""
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


# -- temporaries -----------------------------------------------------------------------------------

@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[str]:
    """A temporary folder of eprun's own, removed when the block ends and on a signal too (the
    signal path ends the process at once, so a ``TemporaryDirectory`` would stay behind).
    It holds a marker file that this process keeps locked (``flock``) while it works: what a
    ``kill -9`` leaves is known as eprun's by its marker, and as abandoned by a lock anyone
    can take, and the next eprun sweeps it (``sweep_scratch``)."""
    import fcntl
    import shutil
    import tempfile

    sweep_scratch(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    temporaries = current_invocation().temporaries
    temporaries.add(folder)
    marker = None
    try:
        marker = os.open(os.path.join(folder, _SCRATCH_MARKER),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), 0o600)
        fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        temporaries.discard(folder)
        if marker is not None:
            os.close(marker)


# What scratch_folder names its folders (eprun-<what>-<pid>-<random>) and the marker inside.
_SCRATCH_NAME = r"eprun-[a-z]+-([0-9]+)-[A-Za-z0-9_]+"
_SCRATCH_MARKER = ".eprun-scratch"


def sweep_scratch(folder: str) -> None:
    """Remove the scratch folders an eprun killed outright left in ``folder``: folders named
    as ``scratch_folder`` names them, of this user, not links, that hold eprun's marker and
    whose marker no live process holds locked (a lock dies with its process, in any pid
    namespace). Anything else there, a folder of the user's named alike included, is left
    alone."""
    import fcntl
    import shutil
    import stat

    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if re.fullmatch(_SCRATCH_NAME, name) is None:
            continue
        path = os.path.join(folder, name)
        try:
            status = os.lstat(path)
            if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
                continue
            marker = os.open(os.path.join(path, _SCRATCH_MARKER),
                             os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                             | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue  # no marker: not eprun's scratch
        try:
            fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its eprun is at work
        finally:
            os.close(marker)
        shutil.rmtree(path, ignore_errors=True)  # by descriptors: a link inside is not followed


def _process_alive(pid: int) -> bool:
    """Is there a process ``pid``? Only the kernel's "no such process" says no: one eprun may not
    signal, or a number no pid can be, counts as alive (its temporaries are left alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # someone else's, or not a pid eprun could have had: leave it
    return True


def real_stderr() -> int:
    """The descriptor of the real stderr, also while ``captured_chatter`` holds fd 2: for a
    line the user must see as it happens (a signal's last word, reduce's progress)."""
    where = current_invocation().stderr
    return where if where is not None else 2


@contextlib.contextmanager
def own_process_group(process) -> Iterator[None]:
    """For the block, ``process`` (started with ``start_new_session``) leads a process group
    that a signal ending eprun kills too (``remove_temporaries``); after it, the group is
    killed, whatever it left running, and reaped."""
    children = current_invocation().children
    children.add(process.pid)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left running, or all of it
        with contextlib.suppress(Exception):
            process.wait()
        children.discard(process.pid)


def remove_temporaries() -> None:
    """What a signal leaves of eprun's temporaries: nothing, and no process group it started
    (``children``: a ``reduce --check`` command) still running."""
    import shutil

    for group in list(current_invocation().children):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for name in list(current_invocation().temporaries):
        if os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(name)


# -- signals ---------------------------------------------------------------------------------------

def _on_signal(signum: int, frame: object) -> None:
    """SIGINT, SIGTERM and SIGHUP. Inside ``signals_held`` the signal waits for the block to
    end; once the answer is out it is ignored. Otherwise, as a program, eprun removes its
    named temporary files, says "interrupted" for Ctrl-C on the real stderr and exits at once
    (130, 143, 129): unwinding a Python exception through a C extension in the middle of its
    import or of a protobuf call could crash the interpreter (SIGSEGV) or turn into another
    error. Called from other Python code it raises KeyboardInterrupt or SystemExit instead,
    and SIGINT is remembered, so that a library that turns the KeyboardInterrupt into another
    error (numpy's import does) is still reported as an interruption."""
    invocation = current_invocation()
    invocation.interrupted.append(signum)
    if invocation.held:
        invocation.held[-1].append(signum)
        return
    if invocation.answered:  # the answer is out: finish as it says, not as an interruption
        return
    _act_on_signal(signum)


def _act_on_signal(signum: int) -> None:
    """Act on ``signum`` now. As a program: kill the workers and child process groups, remove the
    temporaries, say "interrupted" for Ctrl-C and exit at once (130, else 128 + the signal); called
    from Python code: raise KeyboardInterrupt (SIGINT) or SystemExit."""
    code = 130 if signum == signal.SIGINT else 128 + signum
    invocation = current_invocation()
    if invocation.program:
        stop_workers()
        for release in reversed(invocation.releases):
            with contextlib.suppress(Exception):
                release()
        remove_temporaries()
        if signum == signal.SIGINT:
            erase_progress()
            write_fd(real_stderr(), b"eprun: error: interrupted\n")
        os._exit(code)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(code)


@contextlib.contextmanager
def released_on_signal(release: Callable[[], Any]) -> Iterator[None]:
    """Within the block, a signal that ends the process calls ``release`` first (a Dask
    client closed: its tasks cancelled, no client left connected to the scheduler)."""
    releases = current_invocation().releases
    releases.append(release)
    try:
        yield
    finally:
        releases.remove(release)


def _on_bus_error(signum: int) -> None:
    """SIGBUS, as a program: a memory-mapped file was read past its end, so a file eprun read
    was cut short meanwhile (onnxruntime maps the weights files it reads). No Python handler
    survives such a fault (the faulting instruction runs again for ever): this one is called
    from C (``install_bus_handler``), finds the file whose stamp changed, says it in one line
    and ends the process at once, exit 4, as the signals' path does."""
    invocation = current_invocation()
    changed = None
    for path, stamp in list(invocation.read_stamps.items()):
        try:
            now = _stamp(os.stat(path))
        except OSError:
            now = None
        if now != stamp:
            changed = path
            break
    line = (f"eprun: error: {changed!r} changed while eprun was reading it (cut short under "
            "a memory map: SIGBUS); run the command again once it is whole" if changed else
            "eprun: error: SIGBUS: a file mapped into memory was cut short while it was read "
            "(or onnxruntime faulted); run the command again")
    with contextlib.suppress(Exception):
        stop_workers()
        for release in reversed(invocation.releases):
            with contextlib.suppress(Exception):
                release()
        remove_temporaries()
    write_fd(real_stderr(), one_line(line).encode("utf-8", "backslashreplace") + b"\n")
    os._exit(EXIT_FAILURE)


def install_bus_handler(invocation: Invocation) -> None:
    """As a program (Linux, glibc's ``signal``), SIGBUS ends eprun with one line and exit 4
    (``_on_bus_error``) instead of the process dying without a word. The C callback is kept
    on the invocation, which outlives every fault it handles."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        kind = ctypes.CFUNCTYPE(None, ctypes.c_int)
        handler = kind(_on_bus_error)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, kind]
        libc.signal(signal.SIGBUS, handler)
    except (OSError, AttributeError, TypeError):  # no such C library here: the default stays
        return
    invocation.releases_kept = handler


def child_environment() -> dict:
    """The environment for a command eprun runs for the user (``reduce --check``): eprun's
    own, less what eprun set only for itself."""
    own = current_invocation().own_environment
    return {name: value for name, value in os.environ.items() if name not in own}


def stop_workers() -> None:
    """Kill every worker process this process started, at once: a signal that ends eprun
    ends its workers too (they would otherwise go on alone, and keep multiprocessing's
    resource tracker alive)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return
    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.kill()


def _install_signal_handlers() -> dict:
    """eprun's handlers for SIGTERM, SIGHUP and SIGINT where they have their defaults; returns
    the handlers they replaced. Only the main thread may set handlers; from any other thread
    eprun runs without them."""
    replaced: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return replaced
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) in (
                signal.SIG_DFL, signal.default_int_handler, _startup_interrupt):
            replaced[number] = signal.signal(number, _on_signal)
    return replaced


# -- paths -----------------------------------------------------------------------------------------

def _stamp(status: os.stat_result) -> tuple:
    """A file's stamp: device, inode, size, and modification and change times in nanoseconds; what
    tells that the file changed."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
            status.st_ctime_ns)


def require_file(path: str, what: str = "model") -> None:
    """Exit 3 for an input that is not there, before any library gets to raise about it; exit
    4 for one that is not a regular file (a FIFO would block the reader forever, a device
    would be read without end), without opening it."""
    import stat

    if os.path.isdir(path):
        raise EprunError(f"{what} {path!r} is a directory; give the path of a file", EXIT_MISSING)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise EprunError(f"{what} file {path!r} does not exist; check the path",
                         EXIT_MISSING) from None
    if not stat.S_ISREG(mode):
        raise EprunError(f"{what} {path!r} is not a regular file (a device, FIFO or socket); "
                         "give the path of a file")


# Never written to, through a link or not: /dev/stdout would be replaced by a regular file.
_SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")


def _name_max(folder: str) -> int:
    """The longest file name, in bytes, that the file system of ``folder`` allows (``PC_NAME_MAX``;
    the working directory's where ``folder`` is no folder; 255 where it cannot be asked)."""
    try:
        return os.pathconf(folder if os.path.isdir(folder) else ".", "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):
        return 255


def _shortened(path: str) -> str:
    """A path fit for a one-line message."""
    return path if len(path) <= 160 else f"{path[:100]}...{path[-40:]}"


def _places_of(path: str) -> list[str]:
    """Every path a write to ``path`` goes through: itself, each hop of a chain of links (a
    link to /proc/self/fd/1 is a way to stdout), and where it resolves."""
    places = [os.path.abspath(path)]
    current = places[0]
    for _ in range(40):  # the kernel's own limit on a chain of links
        if not os.path.islink(current):
            break
        with contextlib.suppress(OSError):
            current = os.path.normpath(os.path.join(os.path.dirname(current),
                                                    os.readlink(current)))
        places.append(current)
    return list(dict.fromkeys([*places, os.path.realpath(path)]))


def _same_file(first: str, second: str) -> bool:
    """Do the two paths name one file? ``os.path.samefile`` where both exist (a path that is
    not there is no existing file), else their resolved paths compared."""
    if os.path.exists(second):
        return os.path.exists(first) and os.path.samefile(first, second)
    return os.path.realpath(first) == os.path.realpath(second)


def _refuse_folder_name(path: str) -> None:
    """A path ending in a slash (or ``/.``) names a folder, never the file eprun would write:
    exit 3 when that folder is not there, 4 when it exists (a file, or a folder, which no file
    replaces). Without this, ``os.path.abspath`` drops the slash and the write lands on a file
    of the folder's name."""
    if not (path.endswith(os.sep) or os.path.basename(path) in (".", "..")):
        return
    if os.path.isdir(path):
        raise EprunError(f"cannot write {path!r}: it is a directory; name a file inside it")
    named = path.rstrip(os.sep)
    while os.path.basename(named) == "." and named != ".":
        named = os.path.dirname(named).rstrip(os.sep)
    if os.path.lexists(named):
        raise EprunError(f"cannot write {path!r}: the trailing slash names a folder, and "
                         f"{named!r} is a file; name the output file without a trailing slash")
    _refuse_under_no_folder(path, os.path.dirname(named))
    raise EprunError(f"cannot write {path!r}: the trailing slash names a folder, and folder "
                     f"{named!r} does not exist; name the output file without a trailing "
                     "slash", EXIT_MISSING)


def require_output_path(path: str, inputs: list[str]) -> None:
    """Refuse an output path before anything is written: one that is (or resolves to) an input
    file, a model's external data included, or that is empty (exit 2); whose folder does not
    exist (exit 3, the path is not there); one under a file, under /dev, /proc or /sys, or
    that exists as anything but a regular file (exit 4: a device or FIFO would be replaced by
    the rename), or that is a symbolic link (exit 4: eprun never writes through one, see
    ``refuse_link``)."""
    import stat

    if not path:
        raise EprunError("an output path is empty; name a file", EXIT_USAGE)
    for source in inputs:
        if _same_file(source, path):
            raise EprunError(f"refusing to overwrite the input file {source!r} with "
                             f"{path!r}; choose another output path", EXIT_USAGE)
    for where in _places_of(path):
        system = next((folder for folder in _SYSTEM_FOLDERS
                       if where == folder or where.startswith(folder + os.sep)), None)
        if where.startswith("/dev/shm/"):  # a plain tmpfs folder, not a device
            system = None
        if system is not None:
            how = "it is" if where == os.path.abspath(path) else f"it leads to {where!r},"
            raise EprunError(f"cannot write {path!r}: {how} under {system}, which eprun never "
                             "writes to (the JSON answer goes to stdout by itself); give the "
                             "path of a file")
    refuse_link(path)
    _refuse_folder_name(path)
    stop = _refuse_under_no_folder(path, os.path.dirname(path))
    folder = os.path.dirname(os.path.abspath(path))
    name, longest = os.fsencode(os.path.basename(path)), _name_max(folder)
    if len(name) > longest:
        raise EprunError(f"cannot write {_shortened(path)!r}: its file name is {len(name)} "
                         f"bytes, more than the {longest} a file name may have there")
    if stop is not None:  # (a part not there)
        raise EprunError(f"cannot write {path!r}: folder {stop[0]!r} does not exist; create "
                         "it first", EXIT_MISSING)
    if os.path.isdir(path):
        raise EprunError(f"cannot write {path!r}: it is a directory; name a file inside it")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise EprunError(f"cannot write {path!r}: it exists and is not a regular file (a "
                             "device, FIFO or socket); eprun replaces regular files only")


def _on_the_way(folder: str) -> tuple[str, bool] | None:
    """Where the way to ``folder`` stops, its parts taken as written, as the system takes them
    (``afile/../d`` needs ``afile`` to be a folder, although the text tidied says ``d``):
    ``(part, True)`` for a part that is there but is no folder (a file, a FIFO, ...),
    ``(part, False)`` for one that is not there (a dangling link too: what it names can be
    made); None where the way is open."""
    way = os.sep if folder.startswith(os.sep) else ""
    for part in folder.split(os.sep):
        if part in ("", "."):
            continue
        way = os.path.join(way, part)
        if not os.path.exists(way):
            return way, False
        if not os.path.isdir(way):
            return way, True
    return None


def _refuse_under_no_folder(path: str, folder: str) -> tuple[str, bool] | None:
    """Exit 4 where a part of the way to ``folder`` (where output ``path`` goes) is there but
    is no folder; else where the way stops (``_on_the_way``)."""
    stop = _on_the_way(folder)
    if stop is not None and stop[1]:
        raise EprunError(f"cannot write {path!r}: it is under {stop[0]!r}, which is "
                         f"{_not_a_folder(stop[0])}")
    return stop


def _not_a_folder(path: str) -> str:
    """What ``path``, there but no folder, is: for "which is ..." in a message."""
    return "a file, not a folder" if os.path.isfile(path) else \
        "not a folder (a FIFO, socket or device)"


def require_folder_named(out_dir: str, option: str) -> None:
    """An empty folder option is a usage error (``os.makedirs("")`` would say nothing useful)."""
    if not out_dir:
        raise EprunError(f"{option} needs a folder (it is empty)", EXIT_USAGE)


def require_out_dir(out_dir: str, option: str = "--out-dir") -> None:
    """Before anything is measured: ``--out-dir`` (or ``option``) must name a folder that is,
    or can be created as, a folder eprun can write into (not a file, nor under one)."""
    require_folder_named(out_dir, option)
    stop = _on_the_way(out_dir)
    if stop is not None and stop[1]:
        where = ("is" if os.path.abspath(stop[0]) == os.path.abspath(out_dir)
                 else f"is under {stop[0]!r}, which is")
        raise EprunError(f"{option} {out_dir!r} {where} {_not_a_folder(stop[0])}; choose "
                         f"another {option}")
    existing = os.path.abspath(out_dir)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EprunError(f"{option} {out_dir!r}: eprun may not write into {existing!r}; "
                         f"choose another {option}")


# -- staging and commit ----------------------------------------------------------------------------

class Staged(NamedTuple):
    """A complete, synced file not yet at its path: an unnamed ``O_TMPFILE`` (``handle``) or a
    hidden temporary file (``temporary``, a name inside the folder), both in the folder that
    ``folder`` (an open descriptor) is, where ``name`` is the file's name."""

    path: str
    folder: int
    name: str
    handle: int | None
    temporary: str | None


def refuse_link(path: str) -> None:
    """An output path that is a symbolic link is refused: a link in a shared folder may lead
    to anyone's file, and eprun writes only what it names itself."""
    if os.path.islink(path):
        raise EprunError(f"cannot write {path!r}: it is a symbolic link, and eprun never writes "
                         "through a link; remove the link or name another path")


def output_mode(sources: tuple[str, ...] = ()) -> int:
    """The permission bits of a new output: ``0666 & ~umask``, and no more than each file it
    derives from allows (a 0600 model gives 0600 outputs); never setuid, setgid or sticky."""
    import stat

    mode = 0o666 & ~_umask()
    for source in sources:
        with contextlib.suppress(OSError):
            mode &= stat.S_IMODE(os.stat(source).st_mode)
    return mode & 0o777


def open_folder(path: str) -> int:
    """A descriptor of the folder ``path`` names, for every step of a write to go through."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                   | getattr(os, "O_CLOEXEC", 0))


def in_folder(folder: int | None, path: str) -> str:
    """``path``'s name read through the open ``folder`` (``/proc/self/fd/N/name`` on Linux),
    so that what is checked is what is then replaced, however the folder's path changes
    meanwhile; ``path`` itself where there is no such view."""
    if folder is None or not os.path.isdir("/proc/self/fd"):
        return path
    return f"/proc/self/fd/{folder}/{os.path.basename(path)}"


def stage(data: bytes | Callable[[Any], None], path: str, like: tuple[str, ...] = (), *,
          folder: int | None = None) -> Staged:
    """Write ``data`` (bytes, or a function that writes into the open file) into the folder
    of ``path`` without giving it a name there yet, with the permissions ``output_mode(like)``
    allows.

    The folder is opened once (or ``folder``, already open: a set of files written into one
    folder goes through one descriptor) and every later step (creating, linking, renaming) is
    relative to it, so a folder swapped for a link meanwhile changes nothing. On Linux the
    bytes go to an unnamed ``O_TMPFILE``, which vanishes by itself if eprun dies, even by
    ``kill -9``; elsewhere to a hidden file created with ``O_EXCL | O_NOFOLLOW``, removed on
    any failure or signal eprun can catch.
    """
    refuse_link(path)
    folder_path, name = os.path.split(os.path.abspath(path))
    given, folder, handle, temporary = folder, None, None, None
    try:
        folder = os.dup(given) if given is not None else open_folder(folder_path)
        handle = _open_unnamed(folder)
        if handle is None:
            temporary, descriptor = _open_hidden(folder, name)
            current_invocation().temporaries.add(os.path.join(folder_path, temporary))
        else:
            descriptor = os.dup(handle)
        os.fchmod(descriptor, output_mode(like))
        with os.fdopen(descriptor, "wb") as stream:
            if callable(data):
                data(stream)
            else:
                stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        return Staged(path, folder, name, handle, temporary)
    except BaseException as exc:
        if folder is not None:
            discard([Staged(path, folder, name, handle, temporary)])
        if isinstance(exc, OSError):
            raise EprunError(f"cannot write {path!r}: {exc.strerror or one_line(exc)}") from exc
        raise


def discard(staged: list[Staged]) -> None:
    """Drop staged files that will not be committed."""
    for item in staged:
        if item.handle is not None:
            with contextlib.suppress(OSError):
                os.close(item.handle)
        if item.temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(item.temporary, dir_fd=item.folder)
            current_invocation().temporaries.discard(_temporary_path(item))
        with contextlib.suppress(OSError):
            os.close(item.folder)


def _temporary_path(item: Staged) -> str:
    """The path of ``item``'s hidden temporary file as ``Invocation.temporaries`` records it (the
    folder's path with a trailing separator where it has none)."""
    return os.path.join(os.path.dirname(os.path.abspath(item.path)), item.temporary or "")


def _missing_folders(folder: str) -> list[str]:
    """The folders ``os.makedirs(folder)`` would create, the deepest first."""
    missing = []
    folder = os.path.abspath(folder)
    while not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, so that an interrupt lands before
    or after a set of renames, never between two of them.

    onnxruntime's worker threads do not block signals, so the kernel may hand a signal to one
    of them; eprun's handlers (see ``main``) therefore defer on their own while a block is
    open, and the signal takes effect when it closes.
    """
    held = current_invocation().held
    held.append([])
    try:
        yield
    finally:
        pending = held.pop()
        if pending and not held:
            _act_on_signal(pending[0])


def commit(staged: list[Staged]) -> None:
    """Give every staged file its name, with signals held, so an interrupt lands before or
    after the whole set; each rename is atomic within its folder, so a reader sees an old or a
    new file, never a partial one. A name that is a link by now is replaced itself, never
    followed: linking and renaming work on names, not on what they lead to."""
    names: list[str | None] = [None] * len(staged)
    renamed = 0
    try:
        with signals_held():
            for position, item in enumerate(staged):  # a new name: linked there, none between
                if item.temporary is None and _link_unnamed(item, item.name):
                    renamed += 1
                    continue
                names[position] = item.temporary or _link_hidden(item)
                os.replace(names[position], item.name, src_dir_fd=item.folder,
                           dst_dir_fd=item.folder)
                names[position] = None
                renamed += 1
            for folder in {item.folder for item in staged}:  # the new names are durable too
                with contextlib.suppress(OSError):
                    os.fsync(folder)
    except BaseException as exc:
        if isinstance(exc, OSError):
            failed = staged[min(renamed, len(staged) - 1)].path  # exc.filename may be an fd
            raise EprunError(f"cannot write {failed!r}: {exc.strerror or one_line(exc)}") \
                from exc
        raise
    finally:
        for item, name in zip(staged, names):
            for hidden in {name, item.temporary} - {None}:  # what was not renamed
                with contextlib.suppress(OSError):
                    os.unlink(hidden, dir_fd=item.folder)
            current_invocation().temporaries.discard(_temporary_path(item))
        for item in staged:
            if item.handle is not None:
                with contextlib.suppress(OSError):
                    os.close(item.handle)
        for folder in {item.folder for item in staged}:
            with contextlib.suppress(OSError):
                os.close(folder)


def write_atomically(data: bytes | Callable[[Any], None], path: str,
                     like: tuple[str, ...] = ()) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either untouched or complete (see
    ``stage`` and ``commit``); two writers of the same path leave one complete file."""
    commit([stage(data, path, like)])


def write_into(folder_path: str, files: list[tuple[str, bytes]], like: tuple[str, ...]) -> None:
    """Write ``files`` (``(path, bytes)``, all in ``folder_path``) as one set, all or none,
    the folder created first where it is missing (and removed again on a failure)."""
    staged, created = stage_into(folder_path, files, like)
    try:
        commit(staged)
    except BaseException:
        discard(staged)
        remove_folders(created)
        raise


def stage_into(folder_path: str, files: list[tuple[str, bytes]], like: tuple[str, ...]
               ) -> tuple[list[Staged], list[str]]:
    """``files`` staged into ``folder_path`` (created where missing), not yet visible:
    ``(staged, the folders made)``; on a failure nothing is left."""
    created = _missing_folders(folder_path)
    staged: list[Staged] = []
    try:
        os.makedirs(folder_path, exist_ok=True)
        folder = open_folder(folder_path)
        try:
            for path, data in files:
                staged.append(stage(data, path, like=like, folder=folder))
        finally:
            os.close(folder)
    except BaseException:
        discard(staged)
        remove_folders(created)
        raise
    return staged, created


def remove_folders(created: list[str]) -> None:
    """Remove the folders a failed write made, the deepest first (each empty by then)."""
    for made in created:
        with contextlib.suppress(OSError):
            os.rmdir(made)


def _open_unnamed(folder: int) -> int | None:
    """An unnamed file in the folder open as ``folder`` (Linux ``O_TMPFILE``), or None where
    unsupported."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd") or os.link not in os.supports_dir_fd:
        return None
    try:
        return os.open(".", flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600,
                       dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # the filesystem has no O_TMPFILE: use a named temporary file
        raise


def _open_hidden(folder: int, name: str) -> tuple[str, int]:
    """A new hidden file beside ``name`` in the open ``folder``: its name and descriptor.
    ``O_EXCL | O_NOFOLLOW``: a name someone else made (a link, say) is never opened."""
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    for attempt in range(100):
        hidden = f".{_hidden_stem(name)}.{os.getpid()}.{attempt}.tmp"
        try:
            return hidden, os.open(hidden, flags, 0o600, dir_fd=folder)
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"no free temporary name beside {name!r}")


def _link_unnamed(item: Staged, name: str) -> bool:
    """Give the unnamed file ``name`` in its folder, if nothing has that name yet (linkat
    never replaces, and never follows a link at the new name)."""
    # os.link only asks linkat() to follow the /proc magic link when given a dir_fd.
    proc_fds = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.link(str(item.handle), name, src_dir_fd=proc_fds, dst_dir_fd=item.folder,
                follow_symlinks=True)
        return True
    except FileExistsError:
        return False
    finally:
        os.close(proc_fds)


def _link_hidden(item: Staged) -> str:
    """Give the unnamed file a hidden name beside its own, to be renamed onto it at once.
    What an eprun killed in that instant left beside the same name goes first."""
    _sweep_hidden(item.folder, item.name)
    for attempt in range(100):
        hidden = f".{_hidden_stem(item.name)}.{os.getpid()}.{attempt}.tmp"
        if _link_unnamed(item, hidden):
            return hidden
    raise OSError(errno.EEXIST, f"no free temporary name beside {item.path!r}")


def _sweep_hidden(folder: int, name: str) -> None:
    """Remove the hidden temporaries beside ``name`` (``.<name>.<pid>.<n>.tmp``) whose eprun
    is gone: regular files of this user only, untouched for a minute (a live eprun names one
    for an instant; one in another pid namespace is not seen as alive)."""
    import stat
    import time

    pattern = re.compile(re.escape(f".{_hidden_stem(name)}.") + r"([0-9]+)\.[0-9]+\.tmp")
    with contextlib.suppress(OSError):
        for entry in os.listdir(folder):
            match = pattern.fullmatch(entry)
            if match is None or _process_alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                status = os.lstat(entry, dir_fd=folder)
                if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid() \
                        and time.time() - status.st_mtime > 60:
                    os.unlink(entry, dir_fd=folder)


def _hidden_stem(path: str) -> str:
    """The file name of ``path`` as the start of a hidden temporary's name beside it, cut to
    200 bytes so that the temporary's name stays within the 255 a file system allows."""
    return os.fsdecode(os.fsencode(os.path.basename(path))[:200])


def _umask() -> int:
    """The process's umask, read the only way ``os`` offers: set to 0 and put straight back (for
    that instant, a file another thread creates gets no umask)."""
    current = os.umask(0)
    os.umask(current)
    return current

_COPY_SLICE = 8 << 20


def _copier(source: str, how: list[str], model_path: str | None = None
            ) -> Callable[[Any], None]:
    """A writer of a copy of ``source`` that appends to ``how`` the way it copied:
    ``"reflink"`` where the file system shares the blocks (btrfs, XFS: no space, no time),
    else ``"copy"`` (the kernel's own copy where it has one). With ``model_path``, the file
    opened must lie where that model's data may (``_safe_location``'s folders): a link
    swapped in after the check is caught on the open file itself."""
    def copy(stream) -> None:
        """Fill ``stream`` with ``source``'s bytes, read through a descriptor checked to be
        inside the model's folders."""
        with open(source, "rb") as original:
            if model_path is not None:
                _require_inside(original.fileno(), source, model_path)
            if _reflink(original.fileno(), stream.fileno()):
                how.append("reflink")
                return
            how.append("copy")
            _copy_bytes(original.fileno(), stream)
    return copy


def _copy_bytes(source: int, stream) -> None:
    """All of the open file ``source`` onto ``stream``: ``copy_file_range`` or ``sendfile``
    (no bytes through Python) where the kernel has them, else in slices."""
    stream.flush()
    target = stream.fileno()
    for kernel_copy in (getattr(os, "copy_file_range", None), getattr(os, "sendfile", None)):
        if kernel_copy is None:
            continue
        try:
            while True:
                sent = (kernel_copy(source, target, 1 << 30) if kernel_copy is not os.sendfile
                        else os.sendfile(target, source, None, 1 << 30))
                if not sent:
                    return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                 errno.EBADF, errno.ENOTSUP):
                raise
            if os.lseek(target, 0, os.SEEK_CUR):  # part copied: go on the plain way
                break
    while True:
        chunk = os.read(source, _COPY_SLICE)
        if not chunk:
            return
        stream.write(chunk)


def _require_inside(descriptor: int, path: str, model_path: str) -> None:
    """Refuse an open data file that lies outside the folders a model's data may be read
    from (the model's folder, and the folder of the file it resolves to)."""
    link = f"/proc/self/fd/{descriptor}"
    if not os.path.islink(link):
        return
    opened = os.readlink(link)
    folder = os.path.dirname(os.path.abspath(model_path))
    allowed = {os.path.realpath(folder), os.path.dirname(os.path.realpath(model_path))}
    if not any(os.path.commonpath([opened, inside]) == inside for inside in allowed):
        raise EprunError(f"{path!r} led outside {model_path!r}'s folder when it was opened (to "
                         f"{opened!r}); eprun copies no data from outside the model's folder")


def _reflink(source: int, target: int) -> bool:
    """Make ``target`` share ``source``'s blocks (Linux ``FICLONE``); False where the file
    system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import fcntl

    try:
        fcntl.ioctl(target, 0x40049409, source)  # FICLONE
    except OSError:
        return False
    return True


# -- npz files and locked folders ------------------------------------------------------------------

def _storable(value):
    """``value`` as an array ``numpy.save`` writes without pickling (strings as unicode),
    or None for what is no such array (a sequence, a map, objects that are not strings)."""
    import numpy as np

    if not isinstance(value, np.ndarray):
        return None
    if value.dtype == object:
        if not all(isinstance(item, str) for item in value.flat):
            return None
        return value.astype(str)
    return value


def write_npz(stream, arrays: dict) -> None:
    """``arrays`` as an uncompressed ``.npz`` whose members are named exactly by their keys
    (``numpy.savez`` takes names as keywords: an input called ``file`` would be refused)."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            value = np.asanyarray(array)
            if value.dtype == object and _storable(value) is not None:  # strings: unicode
                value = _storable(value)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


@contextlib.contextmanager
def locked_folder(folder: str) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``folder`` itself (no lock file is left in it) for the
    block, and yield its descriptor, for every check and write of the block to go through;
    a second eprun writing into the same folder waits, and says so."""
    import fcntl

    descriptor = open_folder(folder)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"waiting for another eprun writing into {folder!r}")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield descriptor
    finally:
        os.close(descriptor)  # which releases the lock


# == 3. Model access ===============================================================================


# -- loading ---------------------------------------------------------------------------------------

def _is_text(path: str) -> bool:
    """Is ``path`` UTF-8 text (a folder named in another encoding under ``LC_ALL=C`` is not:
    Python keeps its bytes as surrogates, which onnxruntime's string options refuse)?"""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def require_initializer_data(model, path: str) -> None:
    """Refuse an initializer that declares dims but holds no data at all (neither inline nor
    external): onnxruntime and numpy would fail on it each in their own words."""
    fields = ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
              "double_data", "uint64_data")
    for tensor in model.graph.initializer:
        if tensor.data_location == tensor.EXTERNAL or not math.prod(tensor.dims):
            continue
        if not any(len(getattr(tensor, field)) for field in fields):
            raise EprunError(f"{path!r}: initializer {tensor.name!r} declares dims "
                             f"{list(tensor.dims)} but holds no data; the model is broken: "
                             "re-export or regenerate it")


def load_model(path: str, inline_weights: bool = False, text_names: bool = False,
               graph_only: bool = False):
    """Parse an ONNX file's graph, turning every way it can be broken into one clear error.

    Weights stay where they are: external data in its files and, unless ``inline_weights``,
    each large inline payload in the model file itself, referenced by offset as if it were
    external data (see ``_read_graph``), so a 2 GB model parses in milliseconds and code
    that reads weights (onnxruntime, ``_initializer_array``) reads them from the file.
    ``inline_weights`` parses the payloads into the model, for writing it out again;
    ``text_names`` refuses names that are not UTF-8 (see ``require_text_names``);
    ``graph_only``: the caller needs nothing of onnx but its messages, so where it can the
    graph is read without importing onnx (see ``onnx_messages``).
    Protobuf parses many byte strings (an empty file, some text) into an empty message without
    complaint, so a model must also have an IR version and a graph with an output.
    """
    require_file(path)
    model = None if inline_weights else _read_graph(path, graph_only)
    if model is None:
        import onnx

        before = file_stamp(path)
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as exc:  # DecodeError, external data problems, OS errors
            raise EprunError(f"{path!r} is not a loadable ONNX model ({type(exc).__name__}: "
                             f"{one_line(exc)}); re-export or regenerate it") from exc
        require_same_stamp(path, before)
        remember_stamp(path, before)
    if model.ir_version < 1 or not model.HasField("graph") or not model.graph.output:
        raise EprunError(f"{path!r} is not a loadable ONNX model (no IR version, graph or "
                         "output); re-export or regenerate it")
    if text_names:
        require_text_names(model, path)
    require_initializer_data(model, path)
    remember_data_stamps(model, path)
    return model


def require_text_names(model, path: str) -> None:
    """Refuse names that are not UTF-8 text, which protobuf hands over as bytes (onnxruntime
    takes them): the commands that name tensors in their answer, pair them or make them
    outputs read names as text."""
    graph = model.graph
    values = (*graph.input, *graph.output, *graph.value_info, *graph.initializer)
    for where, name in itertools.chain(
            ((f"node {node.name or index!r} ({node.op_type!r})", name)
             for index, node in enumerate(graph.node)
             for name in (node.name, node.op_type, *node.input, *node.output)),
            (("the graph", value.name) for value in values)):
        if isinstance(name, bytes):
            raise EprunError(f"{path!r}: {where} has a name that is not UTF-8 text ({name!r}); "
                             "eprun reads tensor names as text: give it a UTF-8 name")


# Model files in onnx's text formats: everything else is read as protobuf.
_TEXT_EXTENSIONS = frozenset({".txtpb", ".textproto", ".prototxt", ".pbtxt", ".json",
                              ".onnxjson", ".onnxtxt", ".onnxtext"})


# -- the wire walker -------------------------------------------------------------------------------

# Field numbers of the protobuf messages _read_graph walks: ModelProto.graph,
# GraphProto.initializer, and TensorProto's raw_data, external_data and data_location.
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
# ... and where a tensor hides further in (external_locations): GraphProto.node,
# NodeProto.attribute, and AttributeProto's t, g, tensors and graphs (a Constant's value, an
# If's or a Loop's body).
_GRAPH_NODE, _NODE_ATTRIBUTE = 1, 5
_ATTRIBUTE_TENSORS, _ATTRIBUTE_GRAPHS = (5, 10), (6, 11)
_TENSOR_DIMS, _TENSOR_DATA_TYPE = 1, 2
_TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 9, 13, 14


# Inline initializers at least this large are handed to onnxruntime as arrays; smaller ones
# (scales, zero points, shapes) stay in the graph where optimizers expect them.
DETACH_MIN_BYTES = 1024


# Bits per element of every fixed-size ONNX type (int4 and float4 types pack two to a byte).
_ELEMENT_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32,
                 13: 64, 14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4,
                 23: 4}
# Bytes per element of the numeric ONNX types whose numpy form onnxruntime takes as is (no
# float16/bfloat16/4-bit mappings, which vary across onnx releases): FLOAT, UINT8, INT8,
# UINT16, INT16, INT32, INT64, BOOL, DOUBLE, UINT32, UINT64.
_ELEMENT_BYTES = {elem: _ELEMENT_BITS[elem] // 8 for elem in (1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13)}

_DETACHABLE_TYPES = frozenset(_ELEMENT_BYTES)


# The types whose payloads load_model leaves in the file: those, and FLOAT16 (numpy's float16
# on every onnx release, for the memory maps older onnxruntime releases are given).
_REFERENCE_BYTES = {**_ELEMENT_BYTES, 10: 2}


def _safe_location(location: str, model_path: str) -> str:
    """The file an external-data location names, refused (as onnxruntime and onnx refuse it)
    when it is outside the model's folder: an absolute path, a ``..`` on the way, or a
    symbolic link on the way that resolves outside both the model's folder and the folder of
    the file the model itself resolves to (a model linked into a cache, its data beside the
    blob it links to, stays readable). A NUL byte names no file at all."""
    if "\x00" in location:
        raise EprunError(f"{model_path!r} keeps weights at {location!r}, a name with a NUL "
                         "byte, which no file can have; the model is broken")
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise EprunError(f"{model_path!r} keeps weights at {location!r}, outside its folder; "
                         "onnxruntime refuses that location")
    folder = os.path.dirname(os.path.abspath(model_path))
    path = os.path.join(folder, location)
    resolved = os.path.realpath(path)
    if resolved != os.path.normpath(path):  # a link on the way: where does it lead?
        allowed = {os.path.realpath(folder), os.path.dirname(os.path.realpath(model_path))}
        if not any(os.path.commonpath([resolved, inside]) == inside for inside in allowed):
            raise EprunError(f"{model_path!r} keeps weights at {location!r}, which a symbolic "
                             f"link leads outside its folder (to {resolved!r}); eprun reads "
                             "no data from outside the model's folder")
    return path


@functools.cache
def onnx_messages():
    """A module holding onnx's protobuf message classes (``ModelProto``, ``TensorProto``, ...):
    ``onnx`` itself once anything imported it, else, where protobuf is its upb build, onnx's
    generated ``onnx_ml_pb2`` alone. That file needs protobuf only, so a command that reads a
    graph and needs nothing else of onnx (``partition``) skips onnx's own import and the
    ml_dtypes it pulls in (0.3 s; 0.7 s with ml_dtypes 0.7.0). upb keeps one class per message
    type, so a later ``import onnx`` in the same process hands out these very classes; other
    protobuf builds make new ones, which onnx's functions would not take: there, onnx."""
    import importlib.util

    if "onnx" in sys.modules:
        return sys.modules["onnx"]
    try:
        from google.protobuf.internal import api_implementation

        spec = importlib.util.find_spec("onnx")
        path = os.path.join(spec.submodule_search_locations[0], "onnx_ml_pb2.py")
        if api_implementation.Type() != "upb" or not os.path.isfile(path):
            raise ImportError
        generated = importlib.util.spec_from_file_location("onnx.onnx_ml_pb2", path)
        module = importlib.util.module_from_spec(generated)
        generated.loader.exec_module(module)
        module.ModelProto  # noqa: B018 - the class every caller needs
    except Exception:  # an onnx laid out otherwise, another protobuf: onnx decides
        import onnx

        return onnx
    return module


@functools.cache
def onnx_native():
    """onnx's compiled extension (``onnx.onnx_cpp2py_export``: shape inference, the checker,
    the schemas): onnx's own once anything imported onnx, else, beside the messages
    ``onnx_messages`` read alone, the extension loaded alone (it needs nothing of onnx's
    Python), so that ``expose`` infers types without importing onnx and ml_dtypes. It is
    registered under its own name, so a later ``import onnx`` takes this very module (onnx's
    own imports name it in full; only the attribute ``onnx.onnx_cpp2py_export`` is then
    missing)."""
    import importlib.machinery
    import importlib.util

    name = "onnx.onnx_cpp2py_export"
    if "onnx" in sys.modules or onnx_messages() is sys.modules.get("onnx"):
        return importlib.import_module(name)
    try:
        folder = importlib.util.find_spec("onnx").submodule_search_locations[0]
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        found = [entry for entry in sorted(os.listdir(folder))
                 if entry.startswith("onnx_cpp2py_export.") and entry.endswith(suffixes)]
        if len(found) != 1:
            raise ImportError
        loader = importlib.machinery.ExtensionFileLoader(name, os.path.join(folder, found[0]))
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, loader.path, loader=loader))
        loader.exec_module(module)
        sys.modules[name] = module  # it cannot be loaded twice
        module.shape_inference.infer_shapes  # noqa: B018 - what callers need
    except Exception:  # laid out otherwise: onnx decides
        return importlib.import_module(name)
    return module


def infer_shapes(model):
    """``onnx.shape_inference.infer_shapes(model)``, through ``onnx_native``: the same call
    of onnx's extension on the same bytes, parsed into the same message class."""
    inferred = onnx_native().shape_inference.infer_shapes(model.SerializeToString(), False,
                                                          False, False)
    return type(model).FromString(inferred)


def tensor_type(elem_type: int, dims=None):
    """``onnx.helper.make_tensor_type_proto(elem_type, dims)`` with ``onnx_messages``'s
    classes: integer dims are values, strings names, None unknown; ``dims=[]`` is a scalar
    (an empty shape, present), ``None`` no shape at all."""
    value = onnx_messages().TypeProto()
    value.tensor_type.elem_type = elem_type
    if dims is not None:
        shape = value.tensor_type.shape
        shape.SetInParent()
        for size in dims:
            dim = shape.dim.add()
            if isinstance(size, str):
                dim.dim_param = size
            elif size is not None:
                dim.dim_value = size
    return value


def _read_graph(path: str, graph_only: bool = False):
    """The model at ``path`` with every large inline weight left in the file: each
    ``raw_data`` payload of at least ``DETACH_MIN_BYTES`` of a ``_REFERENCE_BYTES`` type
    becomes an external-data reference (``location`` the file's own name, ``offset``,
    ``length``) to where the payload sits in the file.

    Only the protobuf wire format's tags and lengths are read (``_FileBytes``): the payloads
    are never copied, and what is parsed is the graph alone. ``None`` when the file
    is not plain protobuf in the shape this walk expects (a text format, a graph or payload
    given twice, a broken file): the caller then parses it the ordinary way, which also gives
    the ordinary error message. ``graph_only``: parsed with ``onnx_messages`` (see
    ``load_model``); otherwise with onnx's own classes, for a caller that needs onnx anyway.
    """
    if os.path.splitext(path)[1].lower() in _TEXT_EXTENSIONS:
        return None
    try:
        _safe_location(os.path.basename(path), path)  # refuses a name such as ..\m.onnx
        with open(path, "rb", buffering=0) as stream:
            stamp = _stamp(os.fstat(stream.fileno()))
            size = stamp[2]
            # a small file is read whole (indexing bytes is fast), a large one on demand
            data = stream.read() if size <= _READ_WHOLE_BYTES else _FileBytes(stream, size)
            if len(data) != size:
                return None  # cut short meanwhile: the ordinary parse says what it is now
            serialized = _graph_with_references(data, os.path.basename(path).encode())
        if graph_only:
            model = onnx_messages().ModelProto()
        else:
            from onnx import ModelProto

            model = ModelProto()
        model.ParseFromString(serialized)
    except Exception:  # any surprise: the ordinary parse decides
        return None
    remember_stamp(path, stamp)  # see require_unchanged
    return model


_READ_WHOLE_BYTES = 16 << 20


def external_locations(path: str) -> list[str]:
    """The ``location`` of every external-data tensor of the model file's graph (subgraphs and
    Constants' values too), read off the wire without parsing anything (no onnx import): what
    a path handed to onnxruntime will make it open, checked first (``_safe_location``) since
    older releases do not confine it. Empty where the file is not plain protobuf as the walk
    expects: onnxruntime decides.
    Walked once per file (and stamp) in a run: a command opens many sessions of one model."""
    key = (os.path.abspath(path), file_stamp(path))
    known = current_invocation().locations
    if key not in known:
        known[key] = _walk_locations(path)
    return known[key]


def external_files(path: str) -> list[str]:
    """The files the model file at ``path`` reads its external weights from
    (``external_locations``), each confined to the model's folder (``_safe_location``)."""
    return [_safe_location(location, path) for location in external_locations(path)]


def _walk_locations(path: str) -> list[str]:
    """What ``external_locations`` caches: the external ``location`` of each tensor of the
    graph (an initializer, a Constant's value, in a subgraph too), walked off the wire; empty
    where the file cannot be read or walked."""
    locations: list[str] = []
    try:
        with open(path, "rb", buffering=0) as stream:
            size = os.fstat(stream.fileno()).st_size
            data = stream.read() if size <= _READ_WHOLE_BYTES else _FileBytes(stream, size)
            for _, body, end in _messages(data, 0, len(data), (_MODEL_GRAPH,)):
                _graph_locations(data, body, end, locations, depth=0)
    except (OSError, ValueError, IndexError, RecursionError):
        return []
    return locations


def _graph_locations(data, body: int, end: int, found: list[str], depth: int) -> None:
    """Add the external locations of one serialized GraphProto's tensors to ``found``: its
    initializers', then those its nodes' attributes hold (``_node_locations``)."""
    if depth > 100:  # (as deep as protobuf itself parses)
        raise ValueError("graphs nested deeper than protobuf parses")
    for number, at, field_end in _messages(data, body, end,
                                           (_GRAPH_INITIALIZER, _GRAPH_NODE)):
        if number == _GRAPH_INITIALIZER:
            found += _tensor_locations(data, at, field_end)
        else:
            _node_locations(data, at, field_end, found, depth)


def _node_locations(data, body: int, end: int, found: list[str], depth: int) -> None:
    """Add the external locations of the tensors one serialized NodeProto's attributes hold
    (a Constant's value) to ``found``, and those of its subgraphs (an If's or a Loop's body)."""
    for _, attribute, attribute_end in _messages(data, body, end, (_NODE_ATTRIBUTE,)):
        for number, at, field_end in _messages(data, attribute, attribute_end,
                                               _ATTRIBUTE_TENSORS + _ATTRIBUTE_GRAPHS):
            if number in _ATTRIBUTE_TENSORS:
                found += _tensor_locations(data, at, field_end)
            else:
                _graph_locations(data, at, field_end, found, depth + 1)


def _messages(data, start: int, end: int, numbers: tuple[int, ...]):
    """``(number, value start, field end)`` of each length-delimited field of the message in
    ``data[start:end]`` whose number is one of ``numbers``."""
    for number, wire, _, at, field_end in _wire_fields(data, start, end):
        if wire == 2 and number in numbers:
            yield number, at, field_end


def _tensor_locations(data, body: int, end: int) -> list[str]:
    """The ``location`` entries of one serialized TensorProto's external data."""
    found = []
    for number, wire, _, value_at, field_end in _wire_fields(data, body, end):
        if number != _TENSOR_EXTERNAL_DATA or wire != 2:
            continue
        entry = {e_number: bytes(data[e_at:e_end]) for e_number, e_wire, _, e_at, e_end
                 in _wire_fields(data, value_at, field_end) if e_wire == 2}
        if entry.get(1) == b"location" and 2 in entry:
            found.append(entry[2].decode("utf-8", "surrogateescape"))
    return found


class _FileBytes:
    """An open file seen as the bytes it holds, read on demand at offsets (a block at a time
    for single bytes). Not a memory map: a file cut short meanwhile gives a short read, an
    error the walk turns into "parse it the ordinary way", where a map would kill the process
    with SIGBUS."""

    _BLOCK = 8192

    def __init__(self, stream, size: int) -> None:
        """Over ``stream`` (opened unbuffered) of ``size`` bytes; nothing is read yet."""
        self.stream, self.size = stream, size
        self.block, self.cached = -1, b""

    def __len__(self) -> int:
        """The file's size when it was opened."""
        return self.size

    def __getitem__(self, key):
        """One byte (an int), through the cached block around it, or a slice as bytes read at once
        (its step ignored); a negative index, or one past the end, is an IndexError."""
        if isinstance(key, slice):
            start, stop, _ = key.indices(self.size)
            return self._read(start, stop - start) if stop > start else b""
        if not 0 <= key < self.size:
            raise IndexError(key)
        block = key // self._BLOCK
        if block != self.block:
            start = block * self._BLOCK
            self.cached = self._read(start, min(self._BLOCK, self.size - start))
            self.block = block
        return self.cached[key - block * self._BLOCK]

    def _read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``; ValueError where the file holds fewer now."""
        self.stream.seek(offset)
        data = self.stream.read(length)
        if len(data) != length:
            raise ValueError("the file was cut short while it was read")
        return data


def require_unchanged(path: str, status: os.stat_result | None = None) -> None:
    """Refuse a model file that changed since eprun read its graph (``remember_stamp``): its
    payloads would be taken at offsets that now hold something else, and a session made from
    it would measure another model than the one checked. ``status``: the file's, as opened."""
    require_same_stamp(path, _stamp_of(path), _stamp(status) if status is not None else None)


def remember_stamp(path: str, stamp: tuple | None = None) -> None:
    """Keep ``path``'s stamp (device, inode, size, times) as of this read of its graph: the
    weights read later must come from that same file (``require_unchanged``)."""
    stamp = stamp or file_stamp(path)
    if stamp is not None:
        stamps = current_invocation().read_stamps
        stamps[os.path.abspath(path)] = stamps[os.path.realpath(path)] = stamp


def file_stamp(path: str) -> tuple | None:
    """``path``'s stamp now, None where it cannot be read."""
    try:
        return _stamp(os.stat(path))
    except OSError:
        return None


def require_same_stamp(path: str, before: tuple | None, now: tuple | None = None) -> None:
    """Refuse a model file whose stamp (``now``, else read again) is not ``before`` any more;
    nothing to compare where ``before`` is unknown."""
    if before is not None and (now or file_stamp(path)) != before:
        raise model_changed(path)


def model_changed(path: str) -> ModelChanged:
    """The error (exit 4) for a model file that changed while eprun was reading it."""
    return ModelChanged(f"{path!r} changed while eprun was reading it; run the command again")


def _stamp_of(path: str) -> tuple | None:
    """``path``'s stamp as remembered when its graph was read (``remember_stamp``), by its absolute
    or its real path; None where it was not read in this invocation."""
    stamps = current_invocation().read_stamps
    return stamps.get(os.path.abspath(path), stamps.get(os.path.realpath(path)))


def _graph_with_references(data, location: bytes) -> bytes:
    """``data`` (a serialized ModelProto) with the large payloads of its graph's
    initializers replaced by references to their offsets (see ``_read_graph``)."""
    model, graphs = bytearray(), 0
    for number, wire, start, body, end in _wire_fields(data, 0, len(data)):
        if number != _MODEL_GRAPH or wire != 2:
            model += data[start:end]
            continue
        graphs += 1
        graph = bytearray()
        for g_number, g_wire, g_start, g_body, g_end in _wire_fields(data, body, end):
            # a tensor shorter than DETACH_MIN_BYTES holds no payload to refer to
            tensor = (_tensor_with_reference(data, g_body, g_end, location)
                      if g_number == _GRAPH_INITIALIZER and g_wire == 2
                      and g_end - g_body >= DETACH_MIN_BYTES else None)
            graph += data[g_start:g_end] if tensor is None else _length_delimited(
                _GRAPH_INITIALIZER, tensor)
        model += _length_delimited(_MODEL_GRAPH, bytes(graph))
    if graphs != 1:
        raise ValueError("a model has one graph")
    return bytes(model)


def _tensor_with_reference(data, body: int, end: int, location: bytes) -> bytes | None:
    """One serialized TensorProto with its large payload turned into a reference, or None
    to keep it as it is (a payload whose length is not what its dims and type make stays
    inline, for onnxruntime to refuse as it would the file)."""
    payload, kept, data_type, dims = None, bytearray(), 0, []
    for number, wire, start, value_at, field_end in _wire_fields(data, body, end):
        if number == _TENSOR_RAW_DATA and wire == 2:
            if payload is not None:
                return None  # given twice: protobuf keeps the last; let it
            payload = (value_at, field_end - value_at)
            continue
        if number in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            return None  # already external (or contradictory): nothing to refer to
        if number == _TENSOR_DATA_TYPE and wire == 0:
            data_type = _varint(data, value_at)[0]
        elif number == _TENSOR_DIMS and wire == 0:
            dims.append(_varint(data, value_at)[0])
        elif number == _TENSOR_DIMS and wire == 2:  # packed
            at = value_at
            while at < field_end:
                dim, at = _varint(data, at)
                dims.append(dim)
        kept += data[start:field_end]
    size = _REFERENCE_BYTES.get(data_type, 0)
    if payload is None or payload[1] < DETACH_MIN_BYTES or any(dim >= 1 << 63 for dim in dims) \
            or payload[1] != size * math.prod(dims):
        return None
    for key, value in ((b"location", location), (b"offset", b"%d" % payload[0]),
                       (b"length", b"%d" % payload[1])):
        kept += _length_delimited(_TENSOR_EXTERNAL_DATA, _length_delimited(1, key)
                                  + _length_delimited(2, value))
    kept += _encode_varint(_TENSOR_DATA_LOCATION << 3) + _encode_varint(1)  # EXTERNAL
    return bytes(kept)


def _wire_fields(data, start: int, end: int):
    """``(number, wire type, field start, value start, field end)`` of each field of the
    message serialized in ``data[start:end]``; a length-delimited value starts after its
    length. Groups (wire types 3 and 4), unused by ONNX, are refused, and so is what protobuf
    itself refuses (its parser is what the walk stands in for): a tag or a length longer than
    5 bytes, a tag beyond 32 bits or of field 0. A length may pass protobuf's 2 GiB: the
    graph of a model over 2 GB in one file, and its large payloads, are walked over, never
    parsed (what is parsed afterwards, the graph with references, is small)."""
    position = start
    while position < end:
        key, value_at = _varint(data, position, _MAX_TAG_BYTES)
        wire = key & 7
        if key >> 3 == 0 or key >= 1 << 32:
            raise ValueError(f"tag {key}")
        if wire == 0:
            field_end = _varint(data, value_at)[1]
        elif wire == 1:
            field_end = value_at + 8
        elif wire == 2:
            length, value_at = _varint(data, value_at, _MAX_TAG_BYTES)
            field_end = value_at + length
        elif wire == 5:
            field_end = value_at + 4
        else:
            raise ValueError(f"wire type {wire}")
        if field_end > end:
            raise ValueError("truncated field")
        yield key >> 3, wire, position, value_at, field_end
        position = field_end


# protobuf reads tags and lengths as varints of at most 5 bytes (lengths up to 32 GiB here).
_MAX_TAG_BYTES = 5


def _varint(data, position: int, most: int = 10) -> tuple[int, int]:
    """The varint at ``position`` and the position after it; at most ``most`` bytes, and a
    64-bit value (a 10th byte above 1 overflows, which protobuf refuses)."""
    value = shift = 0
    for _ in range(most):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >= 1 << 64:
                raise ValueError("varint beyond 64 bits")
            return value, position
        shift += 7
    raise ValueError(f"varint longer than {most} bytes")


def _encode_varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _length_delimited(number: int, value: bytes) -> bytes:
    """Protobuf field ``number`` of wire type 2: its tag, ``value``'s length, then ``value``."""
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


def graph_inputs(model) -> list:
    """The graph inputs a caller must feed (older IRs also list initializers as inputs)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


# -- the graph index -------------------------------------------------------------------------------

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


class GraphIndex:
    """One graph's nodes by the tensors they write and read, its initializers and, where the
    caller has them, its value types: built once for a graph and passed to what walks it.

    ``producer(name)`` is the node that writes ``name`` (the last one, in a graph that writes a
    name twice, and the "" of an omitted optional output like any other name);
    ``consumers[name]`` the indices of the nodes that read it, outer-scope reads of their
    subgraphs included (a node reading it twice is listed twice); ``readers[name]`` the
    ``(node index, input position)`` of each direct read. ``producer_index`` is of the nodes
    as they were when the index was built, ``consumers`` and ``readers`` as they were when
    first asked for: an index is for a graph that is read, not rewired."""

    def __init__(self, nodes, initializers=(), types: dict | None = None) -> None:
        """Index ``nodes`` by the tensors they write (the last writer of a name wins) and
        ``initializers`` by name; ``types``: name -> type, None where the caller has none."""
        self.nodes = list(nodes)
        self.producer_index = {output: index for index, node in enumerate(self.nodes)
                               for output in node.output}
        self.initializers = {tensor.name: tensor for tensor in initializers}
        self.types = types

    @classmethod
    def of(cls, graph, types: dict | None = None) -> GraphIndex:
        """The index of ``graph``'s own nodes and initializers."""
        return cls(graph.node, graph.initializer, types)

    def producer(self, name: str):
        """The node that writes ``name``; None for an input, an initializer or an unwritten name."""
        index = self.producer_index.get(name)
        return None if index is None else self.nodes[index]

    @functools.cached_property
    def consumers(self) -> dict[str, list[int]]:
        """Tensor name -> indices of the nodes that read it, their subgraphs' outer-scope reads
        included; built on first use."""
        found: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in _node_inputs(node):
                found.setdefault(name, []).append(index)
        return found

    @functools.cached_property
    def readers(self) -> dict[str, list[tuple[int, int]]]:
        """Tensor name -> ``(node index, input position)`` of each direct read (none of a
        subgraph's); built on first use."""
        found: dict[str, list[tuple[int, int]]] = {}
        for index, node in enumerate(self.nodes):
            for position, name in enumerate(node.input):
                found.setdefault(name, []).append((index, position))
        return found


def int_attributes(node) -> dict[str, int]:
    """A node's integer attributes by name (AttributeProto.INT is 2)."""
    return {attribute.name: attribute.i for attribute in node.attribute if attribute.type == 2}


def weight_only_nodes(graph) -> list[tuple[Any, int]]:
    """``(node, bits)`` for each node that dequantizes a constant weight in blocks, in file
    order: those of ``WEIGHT_ONLY_OPS``, and each DequantizeLinear with a ``block_size`` that
    reads an initializer (MatMulNBitsQuantizer's QDQ form); ``bits`` those of its codes (the
    ``bits`` attribute of MatMulNBits and of a uint8 GatherBlockQuantized table, 4 for
    MatMulBnb4, else its element type's)."""
    types = {tensor.name: tensor.data_type for tensor in graph.initializer}
    found = []
    for node in graph.node:
        attributes = int_attributes(node)
        data = types.get(node.input[0]) if node.input else None
        if node.op_type in ("MatMulNBits", "MatMulBnb4"):
            bits = attributes.get("bits", 4)
        elif node.op_type == "GatherBlockQuantized":
            bits = attributes.get("bits", 4) if data == 2 else _ELEMENT_BITS.get(data, 4)
        elif node.op_type == "DequantizeLinear" and attributes.get("block_size") and data:
            bits = _ELEMENT_BITS.get(data, 8)
        else:
            continue
        found.append((node, bits))
    return found


# What a twin's quantized weight adds to its float weight's name: W_Q4, W_DQ_Q4, W_Q4G32.
_QUANTIZED_WEIGHT_SUFFIX = re.compile(r"_(DQ_)?Q\d+(G-?\d+)?$")


class FloatWeightReaders:
    """The float model's MatMuls and Gathers of a constant weight, found by what a weight-only
    twin keeps of them: a quantizer renames the weight and the node, not the activation a
    MatMul multiplies, the output it writes or a Gather's output. How ``weights`` and
    sensitivity's units pair a weight-only op with the float node it stands for."""

    def __init__(self, graph) -> None:
        """Index every MatMul and Gather of ``graph`` that reads an initializer as its weight."""
        weights = {tensor.name for tensor in graph.initializer}
        self.nodes = list(graph.node)
        self.matmuls: dict[str, list[int]] = {}  # activation -> the MatMuls' positions
        self.gathers: dict[str, int] = {}  # output -> the Gather's position
        for position, node in enumerate(self.nodes):
            if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights:
                self.matmuls.setdefault(node.input[0], []).append(position)
            elif node.op_type == "Gather" and node.input and node.input[0] in weights:
                self.gathers.setdefault(node.output[0], position)

    def matmul_of(self, activation: str, output: str, weight: str,
                  taken: Iterable[int] = ()) -> int | None:
        """The position of the float MatMul that a weight-only MatMul reading ``activation``,
        writing ``output`` and quantizing ``weight`` stands for: of the MatMuls reading that
        activation (less those ``taken``), where several do (a query, a key and a value
        projection), the one writing ``output`` (or it less ``_pre_reshape``, where the
        quantizer reshapes an N-D weight's product), then the one whose weight ``weight`` is
        named after; None unless exactly one is left."""
        taken = set(taken)
        candidates = [position for position in self.matmuls.get(activation, ())
                      if position not in taken]
        writes = {output, output.removesuffix("_pre_reshape")}
        named = _QUANTIZED_WEIGHT_SUFFIX.sub("", weight)
        for keeps in (lambda node: node.output[0] in writes,
                      lambda node: node.input[1] == named):
            narrower = [position for position in candidates if keeps(self.nodes[position])]
            if len(candidates) > 1 and narrower:
                candidates = narrower
        return candidates[0] if len(candidates) == 1 else None

    def gather_of(self, output: str) -> int | None:
        """The position of the float Gather writing ``output`` (a GatherBlockQuantized's)."""
        return self.gathers.get(output)


# -- external data ---------------------------------------------------------------------------------

def external_data_files(model, model_path: str) -> list[str]:
    """The files a model's external weights live in (inputs to protect, as the model is)."""
    locations = {_external_location(tensor).location for tensor in external_tensors(model)}
    files = [_safe_location(location, model_path) for location in sorted(locations)]
    # load_model's references into the model file itself are not files of their own.
    return [path for path in files if not _same_file(model_path, path)]


def plan_external_data(model, model_path: str, out_path: str, replacing: bool = False
                       ) -> list[dict]:
    """How a copy of ``model`` at ``out_path`` reaches each of its external data files:
    ``{"source", "file", "how"}`` per file, ``how`` being ``"shared"`` (the copy sits in the
    model's folder and reads the same file), ``"present"`` (the same bytes are already at
    ``file``, a file of its own) or ``"copy"`` (to be copied there).

    A copy written elsewhere needs its data beside it (onnxruntime resolves external data
    only inside the model's own folder). The names of those files are eprun's, never the
    model's: ``<out name>.data``, then ``<out name>.1.data`` ... in the output's folder, so a
    ``location`` such as ``sub/w.bin`` or ``.ssh/authorized_keys`` chooses nothing about where
    eprun writes. A data file is copied, never hard-linked: a second link to the user's
    weights makes onnx (1.23+) refuse them afterwards as a "potential hardlink attack", the
    original model included; a hard link already there (an older eprun's) is replaced by a
    copy. A link at a data file's name is refused, and so is a different file there unless
    the output it belongs to is replaced too (``replacing``: eprun's own, or ``--force``).
    """
    source_folder = os.path.dirname(os.path.abspath(model_path))
    target_folder = os.path.dirname(os.path.abspath(out_path))
    shared = os.path.isdir(target_folder) and os.path.samefile(source_folder, target_folder)
    nested = [] if shared else _nested_external(model)
    if nested:
        raise EprunError(f"{model_path!r} keeps the weights of {nested[0]!r} (a Constant or "
                         "an If/Loop/Scan body) in external data, which eprun copies only for "
                         "the graph's initializers: expose it into the model's own folder, or "
                         "save those weights inline")
    plan = []
    for number, source in enumerate(external_data_files(model, model_path)):
        if shared:
            plan.append({"source": source, "file": source, "how": "shared"})
            continue
        target = os.path.join(target_folder, data_file_name(out_path, number))
        entry = {"source": source, "file": target, "how": "copy"}
        plan.append(entry)
        require_file(source, "external data")
        if not os.path.lexists(target):
            continue
        require_output_path(target, [])  # a link, a folder, a FIFO or device at its name: refused
        if os.path.samefile(source, target):
            continue  # a hard link: copied over, which gives the original its one link back
        if _same_bytes(source, target):
            entry["how"] = "present"
        elif not replacing:
            raise EprunError(f"cannot write {out_path!r}: its weights go to {target!r}, which "
                             "holds other data eprun did not write for it; move it away, "
                             "choose another output name, or add --force")
    return plan


def _nested_external(model) -> list[str]:
    """The tensors outside the main graph's initializers (node attributes, the initializers
    of subgraphs) that keep their data in external files."""
    TensorProto = onnx_messages().TensorProto

    found, pending = [], list(model.graph.node)
    while pending:
        node = pending.pop()
        for attribute in node.attribute:
            tensors = ([attribute.t] if attribute.HasField("t") else []) + list(attribute.tensors)
            found += [tensor.name or node.name for tensor in tensors
                      if tensor.data_location == TensorProto.EXTERNAL]
            for body in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                found += [tensor.name for tensor in body.initializer
                          if tensor.data_location == TensorProto.EXTERNAL]
                pending += list(body.node)
    return found


def data_file_name(out_path: str, number: int) -> str:
    """The name of the ``number``-th external data file of an output, in its folder."""
    stem = _hidden_stem(out_path)  # room for the suffix within a file name's 255 bytes
    return f"{stem}.data" if number == 0 else f"{stem}.{number}.data"


def relocate_external_data(model, model_path: str, plan: list[dict]) -> None:
    """Point each external tensor of ``model`` at the file ``plan`` gives its data, by the
    name eprun chose (a plain file name in the output's folder)."""
    moved = {entry["source"]: os.path.basename(entry["file"]) for entry in plan
             if entry["how"] != "shared"}
    for tensor in external_tensors(model):
        source = _safe_location(_external_location(tensor).location, model_path)
        if source not in moved:
            continue  # a reference into the model file itself: written inline
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = moved[source]


def _same_bytes(first: str, second: str) -> bool:
    """Do the two files hold the same bytes? Compared in full, not by their stat signatures."""
    import filecmp

    return filecmp.cmp(first, second, shallow=False)


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
    """The main graph's initializers whose data is external, ``load_model``'s references into the
    model file itself included."""
    return [tensor for tensor in model.graph.initializer if uses_external_data(tensor)]


def uses_external_data(tensor) -> bool:
    """onnx's ``external_data_helper.uses_external_data``, without importing onnx."""
    return (tensor.HasField("data_location")
            and tensor.data_location == onnx_messages().TensorProto.EXTERNAL)


class _ExternalLocation:
    """Where an external tensor's bytes are, read as onnx's ``ExternalDataInfo`` (1.2x) reads
    them, without importing onnx: ``location``; ``offset`` and ``length`` integers where given
    (ValueError for one that is not a number or is negative); other keys ignored."""

    def __init__(self, tensor) -> None:
        """Read ``tensor``'s ``external_data`` entries (of a key given twice, the last)."""
        entries = {entry.key: entry.value for entry in tensor.external_data}
        self.location = entries.get("location", "")
        self.offset, self.length = (self._size(tensor, entries, key) for key in ("offset",
                                                                              "length"))

    @staticmethod
    def _size(tensor, entries: dict, key: str) -> int | None:
        """The ``offset`` or ``length`` entry as an int; None where absent, ValueError where it is
        not a number or is negative."""
        if key not in entries:
            return None
        size = int(entries[key])
        if size < 0:
            raise ValueError(f"External data {key} must be non-negative, got {size} for "
                             f"tensor {tensor.name!r}")
        return size


def _external_location(tensor) -> _ExternalLocation:
    """Where ``tensor``'s external data is (``_ExternalLocation``)."""
    return _ExternalLocation(tensor)


def _relink_own_references(model, model_path: str, own: list) -> str:
    """The path external locations are relative to: ``model_path``, or, for a model file that
    is a link and keeps no data in other files, the file it resolves to, with the references
    ``load_model`` made into the model file (``own``, see ``_in_file_references``) renamed
    after it."""
    resolved = os.path.realpath(model_path)
    if not any(own) or resolved == os.path.abspath(model_path) or \
            external_data_files(model, model_path):
        return model_path
    for tensor, payload in zip(model.graph.initializer, own):
        for entry in tensor.external_data if payload else ():
            if entry.key == "location":
                entry.value = os.path.basename(resolved)
    return resolved


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
                or _initializer_bytes(tensor) < DETACH_MIN_BYTES
                or (tensor.raw_data and len(tensor.raw_data) != _initializer_bytes(tensor))):
            continue  # (a payload of the wrong length stays, for onnxruntime to refuse)
        array = numpy_helper.to_array(tensor)
        tensor.CopyFrom(_placeholder(tensor.name, array))
        names.append(tensor.name)
        arrays.append(array)
    return names, arrays


def _placeholder(name: str, array):
    """An initializer that only declares ``array``'s name, type and dims, pointing at external
    data: the form ``add_external_initializers`` fills in."""
    from onnx import TensorProto, helper

    placeholder = TensorProto(name=name, dims=array.shape,
                              data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                              data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "eprun-detached"), ("offset", "0"),
                       ("length", str(array.nbytes))):
        entry = placeholder.external_data.add()
        entry.key, entry.value = key, value
    return placeholder


def _initializer_bytes(tensor) -> int:
    """Size of an initializer's data from its dims, without touching the (large) payload;
    0 for a type outside ``_ELEMENT_BYTES``."""
    count = _ELEMENT_BYTES.get(tensor.data_type, 0)
    for dim in tensor.dims:
        count *= dim
    return count


def _map_external(tensor, model_path: str, read: bool = False):
    """A read-only memory map of one external-data tensor, located as onnxruntime would; with
    ``read``, its values read into memory instead (a file cut short is then an error, where
    touching a map past its end is SIGBUS)."""
    import numpy as np
    from onnx import helper

    location = _external_location(tensor)
    path = _safe_location(location.location, model_path)
    require_file(path, "external data")
    if _same_file(model_path, path):
        require_unchanged(model_path)
    elif _stamp_of(path) is not None:  # stamped when the graph was read
        require_unchanged(path)
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        size = dtype.itemsize * math.prod(tensor.dims)
        if location.length is not None and int(location.length) != size:
            raise ValueError(f"{location.length} bytes where its dims {list(tensor.dims)} "
                             f"make {size}")
        if not read:
            return np.memmap(path, dtype=dtype, mode="r", offset=int(location.offset or 0),
                             shape=tuple(tensor.dims))
        values = np.fromfile(path, dtype=dtype, count=math.prod(tensor.dims),
                             offset=int(location.offset or 0))
        if values.size != math.prod(tensor.dims):
            raise ValueError("the file is shorter than its reference says")
        return values.reshape(tuple(tensor.dims))
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise EprunError(f"cannot read the weights of {tensor.name!r} from {path!r}: "
                         f"{one_line(exc)}") from exc


def require_data_unchanged(tensors: list, model_path: str) -> None:
    """Refuse (``ModelChanged``) when the external data file of one of ``tensors`` changed
    since the graph was read: what onnxruntime read or refused is then another file's."""
    for tensor in tensors:
        with contextlib.suppress(ValueError, OSError):
            path = _safe_location(_external_location(tensor).location, model_path)
            if _stamp_of(path) is not None:
                require_unchanged(path)


def remember_data_stamps(model, model_path: str) -> None:
    """Stamp the external data files of ``model`` not stamped yet in this invocation: those
    files are read later (by eprun, or mapped by onnxruntime), and one that changes meanwhile
    is named as changed (``require_unchanged``, and SIGBUS's one line). A location eprun
    refuses is left for the reader to refuse."""
    for tensor in external_tensors(model):
        with contextlib.suppress(EprunError, ValueError, OSError):
            path = _safe_location(_external_location(tensor).location, model_path)
            if not _same_file(model_path, path) and _stamp_of(path) is None:
                remember_stamp(path)


def _inline_subgraph_weights(model, data_path: str, attributes: bool = False) -> None:
    """Put the external weights of If/Loop/Scan bodies back inline: for a model given as
    bytes without the folder option (releases before 1.21, or a main graph with no external
    data), onnxruntime looks for them relative to the working directory, where another file
    of the same name may be, and ``add_external_initializers`` reaches the main graph only.
    ``attributes``: the tensors in node attributes too (a Constant's value), at any depth,
    for a model written elsewhere (``reduce``'s candidates), where no reference would hold."""
    pending = [attribute for node in model.graph.node for attribute in node.attribute]
    while pending:
        attribute = pending.pop()
        tensors = ([attribute.t] if attribute.HasField("t") else []) + list(attribute.tensors)
        bodies = ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
        for tensor in (tensors if attributes else []) + [tensor for body in bodies
                                                         for tensor in body.initializer]:
            if uses_external_data(tensor):
                values = _map_external(tensor, data_path, read=True)
                del tensor.external_data[:]
                tensor.ClearField("data_location")
                tensor.raw_data = values.tobytes()
        pending += [inner for body in bodies for node in body.node for inner in node.attribute]


def _drop_unused_initializers(model) -> None:
    """Remove the initializers nothing reads (no node, subgraph, graph input or output):
    onnxruntime drops them while it resolves the graph, and then fails to find them when they
    are handed over as arrays or maps ("Failed to find existing initializer")."""
    graph = model.graph
    used = {name for node in graph.node for name in _node_inputs(node)}
    used.update(value.name for value in (*graph.input, *graph.output))
    for index in reversed([index for index, tensor in enumerate(graph.initializer)
                           if tensor.name not in used]):
        del graph.initializer[index]


def _in_file_references(model, model_path: str) -> list:
    """For each initializer of the graph in order, ``(offset, length)`` of the payload
    ``load_model`` left in the model file itself, else None."""
    own: list = []
    for tensor in model.graph.initializer:
        location = _external_location(tensor) if uses_external_data(tensor) else None
        own.append((int(location.offset), int(location.length)) if location is not None and
                   _same_file(model_path, _safe_location(location.location, model_path))
                   else None)
    return own


def _inlined_tensor(data: bytes, body: int, end: int, payload: tuple[int, int]) -> list:
    """The pieces of one serialized TensorProto with its reference replaced by its
    ``raw_data`` (``(offset, length)`` in the model file), where field order puts it."""
    pieces: list = []
    raw = _encode_varint(_TENSOR_RAW_DATA << 3 | 2) + _encode_varint(payload[1])
    for number, _, start, _, field_end in _wire_fields(data, body, end):
        if number in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            continue
        if number > _TENSOR_RAW_DATA and raw:
            pieces += [raw, payload]
            raw = b""
        pieces.append(data[start:field_end])
    if raw:
        pieces += [raw, payload]
    return pieces


def _pieces_length(pieces: list) -> int:
    """The bytes ``pieces`` make when written: each piece's length, or each payload's."""
    return sum(len(piece) if isinstance(piece, bytes) else piece[1] for piece in pieces)


def _inline_writer(model, model_path: str, relocate: list[dict] = ()) -> Callable[[Any], None]:
    """A writer of ``model`` as protobuf would serialize it with every payload that
    ``load_model`` left in ``model_path`` back inline: the same bytes as parsing the weights
    and calling ``SerializeToString``, without either. The graph is serialized (small), and
    each referring initializer gets its ``raw_data`` field back in field-number order, copied
    from the file as it is written. ``relocate``: the external data plan whose file names
    the other references take (``relocate_external_data``)."""
    own = _in_file_references(model, model_path)
    if relocate:
        relocate_external_data(model, model_path, relocate)
    serialized = model.SerializeToString()
    if not any(own):
        return lambda stream: stream.write(serialized)
    payloads = iter(own)  # the graph's initializers, in the order they are serialized
    pieces: list = []  # bytes, or (offset, length) of a payload in the model file
    for number, wire, start, body, end in _wire_fields(serialized, 0, len(serialized)):
        if number != _MODEL_GRAPH or wire != 2:
            pieces.append(serialized[start:end])
            continue
        graph_pieces: list = []
        for g_number, g_wire, g_start, g_body, g_end in _wire_fields(serialized, body, end):
            tensor = (next(payloads) if g_number == _GRAPH_INITIALIZER and g_wire == 2
                      else None)
            if tensor is None:
                graph_pieces.append(serialized[g_start:g_end])
                continue
            tensor_pieces = _inlined_tensor(serialized, g_body, g_end, tensor)
            graph_pieces += [_encode_varint(_GRAPH_INITIALIZER << 3 | 2)
                             + _encode_varint(_pieces_length(tensor_pieces)), *tensor_pieces]
        pieces += [_encode_varint(_MODEL_GRAPH << 3 | 2)
                   + _encode_varint(_pieces_length(graph_pieces)), *graph_pieces]

    def write(stream) -> None:
        """Fill ``stream`` with the model: the pieces kept in memory, the rest copied from the
        file, checked unchanged."""
        with open(model_path, "rb") as source:
            require_unchanged(model_path, os.fstat(source.fileno()))
            for piece in pieces:
                if isinstance(piece, bytes):
                    stream.write(piece)
                    continue
                offset, length = piece  # read in slices: never the whole payload at once
                source.seek(offset)
                while length:
                    chunk = source.read(min(_COPY_SLICE, length))
                    if not chunk:
                        raise EprunError(f"{model_path!r} changed while eprun read it")
                    stream.write(chunk)
                    length -= len(chunk)
    return write


# -- value types -----------------------------------------------------------------------------------

# Initializers smaller than this keep their values in the weightless copy used for shape
# inference: they are the shape and axis tensors that inference needs to read.
SKELETON_KEEP_BYTES = 4096

_QUANTIZED_DTYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16"}


def _is_integer(types: dict | None, name: str) -> bool:
    """Does ``types`` give ``name`` an 8- or 16-bit integer type, a quantized tensor's? False where
    it gives no type at all."""
    value = (types or {}).get(name)
    return value is not None and value.tensor_type.elem_type in (2, 3, 4, 5)  # u/int8, u/int16


def _initializer_array(tensor, model_path: str):
    """An initializer's values as a numpy array; external data is read into memory, not mapped."""
    from onnx import TensorProto, numpy_helper

    if tensor.data_location == TensorProto.EXTERNAL:
        return _map_external(tensor, model_path, read=True)
    return numpy_helper.to_array(tensor)


def _skeleton(model):
    """A copy of ``model`` without large weight payloads, cheap to run shape inference on.

    Shape inference only needs each initializer's type and dims, plus the values of small ones
    (Reshape targets, axes); copying the whole model would duplicate every weight in memory.
    """
    messages = onnx_messages()
    ModelProto, TensorProto = messages.ModelProto, messages.TensorProto

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


def inferred_graph(model):
    """``model``'s graph with the types shape inference gives its values (run on a copy
    without the weights), or its graph as declared where inference fails."""
    try:
        return infer_shapes(_skeleton(model)).graph
    except Exception:  # custom domains, invalid graphs: fall back to what the file declares
        return model.graph


def tensor_types(model, inferred=None) -> dict:
    """Name -> inferred ``TypeProto`` for every tensor whose type shape inference can tell
    (``inferred``: ``inferred_graph(model)``, where the caller has it). Imports onnx only
    where a type is left that onnx's schemas must tell (``_fill_types``)."""
    types = {}
    inferred = inferred if inferred is not None else inferred_graph(model)
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type
    for tensor in model.graph.initializer:
        if tensor.name not in types:
            types[tensor.name] = tensor_type(tensor.data_type, tensor.dims)
    _fill_types(model, types)
    return types


def _fill_types(model, types: dict) -> None:
    """Element types shape inference could not tell, node by node in file order.

    onnx knows no schema for onnxruntime's own quantized ops (``com.microsoft`` QLinearAdd,
    QLinearConcat, ...), so inference stops behind the first one, and a quantized tensor
    declared float would not open. Their output takes the type of their quantized operands
    (their first 8-bit input); a standard op after them is inferred from its schema.
    """
    opset = next((entry.version for entry in model.opset_import
                  if entry.domain in ("", "ai.onnx")), None)
    for node in model.graph.node:
        if all(not name or name in types for name in node.output):
            continue
        inferred: dict = {}
        if node.domain in ("", "ai.onnx") and opset is not None:
            inferred = _schema_types(node, opset, types)
        elif node.op_type.startswith("QLinear") or node.op_type == "QGemm":
            inferred = _quantized_operand_type(node, types)
        for name, value in inferred.items():
            if name and name not in types and value.HasField("tensor_type") \
                    and value.tensor_type.elem_type:
                types[name] = value


def _schema_types(node, opset: int, types: dict) -> dict:
    """A standard op's output types from its schema, once every input's type is known;
    nothing where there is no schema or it needs input values."""
    if not all(not name or name in types for name in node.input):
        return {}
    with contextlib.suppress(Exception):  # no schema, or it needs input values
        from onnx import defs, shape_inference

        schema = defs.get_schema(node.op_type, opset, "")
        return shape_inference.infer_node_outputs(
            schema, node, {name: types[name] for name in node.input if name})
    return {}


def _quantized_operand_type(node, types: dict) -> dict:
    """A QLinear op's or QGemm's output type, as onnxruntime's schemas tell it: a QGemm's is
    its output zero point's, float without one (its output is then not quantized); another's
    that of its quantized operands (the first 8-bit input)."""
    if node.op_type == "QGemm":
        operand = node.input[8] if len(node.input) > 8 else None
    else:
        operand = next((name for name in node.input if _element_type(types, name) in (2, 3)),
                       None)
    elem = _element_type(types, operand) if operand else 1
    return {node.output[0]: tensor_type(elem or 1)}


def _type_name(elem: int) -> str:
    """An ONNX element type's name (``FLOAT``, ``INT8``, ...); ``type N`` for one onnx lacks."""
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem) if elem in TensorProto.DataType.values() \
        else f"type {elem}"


def _element_type(types: dict, name: str) -> int:
    """The ONNX element type ``types`` gives ``name``; 0 where it gives none (or no tensor type)."""
    value = types.get(name)
    return value.tensor_type.elem_type if value is not None else 0


# -- eprun's mark on the models it writes ----------------------------------------------------------

# The metadata entry eprun sets in every model it writes (its value ends with a digest of the
# graph's nodes): what it may replace without --force.
EPRUN_MARK = ("eprun", "exposed: every layer boundary is a graph output")


def mark_as_eprun(model, purpose: str = EPRUN_MARK[1]) -> None:
    """Set ``EPRUN_MARK`` in ``model``'s metadata (once, whatever was there under its key),
    with a digest of its graph's nodes: a model made from eprun's output by another tool (a
    quantizer keeps the metadata) is not eprun's any more. ``purpose``: what eprun made it
    for (an exposed copy, or ``EPRUN_REDUCED``)."""
    kept = [entry for entry in model.metadata_props if entry.key != EPRUN_MARK[0]]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = EPRUN_MARK[0], _mark_value(model, purpose)


def _mark_value(model, purpose: str = EPRUN_MARK[1]) -> str:
    """``EPRUN_MARK``'s value: ``purpose`` and 16 hex digits of a SHA-256 of the graph's nodes and
    its input and output names."""
    import hashlib

    digest = hashlib.sha256()
    for node in model.graph.node:
        digest.update(node.SerializeToString())
    for value in (*model.graph.input, *model.graph.output):
        digest.update(value.name.encode("utf-8", "surrogateescape") + b"\0")
    return f"{purpose}; graph {digest.hexdigest()[:16]}"


def is_eprun_model(path: str) -> bool:
    """Does the model at ``path`` carry eprun's mark (so replacing it loses nothing eprun
    cannot write again)? Reads the graph only, never the weights."""
    try:
        model = load_model(path, graph_only=True)
    except (EprunError, OSError, ValueError):
        return False
    marks = {_mark_value(model, purpose) for purpose in (EPRUN_MARK[1], EPRUN_REDUCED)}
    return any(entry.key == EPRUN_MARK[0] and entry.value in marks
               for entry in model.metadata_props)


# The mark of a model ``reduce`` wrote (see ``EPRUN_MARK``).
EPRUN_REDUCED = "reduced: the smallest part of a model that still fails"


# == 4. Sessions and providers =====================================================================


# -- onnxruntime, imported on first use ------------------------------------------------------------

def import_ort():
    """onnxruntime, imported on first use (and only by the commands that open sessions)."""
    import onnxruntime

    return onnxruntime


class OrtLog:
    """onnxruntime's native log level: the process's default logger severity, which can be
    set but not read back, so eprun keeps the level it last set (``level``).

    ``main`` quiets it (``QUIET``, fatal errors only) for a command that opens sessions: its
    error log would repeat the one-line error eprun prints. ``EPRUN_DEBUG=1`` keeps it (and
    onnxruntime's Python warnings, which ``main`` otherwise ignores for the call). ``main``
    puts onnxruntime's default back when it returns (the caller's own level cannot be read
    back); eprun's functions called directly from Python leave it alone. The fallback banner
    onnxruntime prints still goes to stderr."""

    DEFAULT = 2  # onnxruntime's own: warnings and worse
    QUIET = 4
    level = DEFAULT

    @classmethod
    def quiet(cls) -> bool:
        """Quiet onnxruntime's log, if onnxruntime imports; False where it does not (missing,
        or broken): the command then meets that itself, after its own checks, as it would
        have without eprun quieting anything."""
        try:
            cls.set(cls.QUIET)
        except Exception:
            return False
        return True

    @classmethod
    def set(cls, level: int) -> None:
        """Set onnxruntime's default logger severity (importing it) and remember it in ``level``."""
        import_ort().set_default_logger_severity(level)
        cls.level = level


def ort_release() -> tuple[int, int]:
    """``(major, minor)`` of the onnxruntime imported, to compare with a release such as
    ``PLUGIN_EPS_SINCE``."""
    major, minor = (int(part) for part in re.findall(r"\d+", import_ort().__version__)[:2])
    return major, minor


# -- execution providers ---------------------------------------------------------------------------

CPU_EP = "CPUExecutionProvider"
POLICY_PREFIX = "policy:"
# onnxruntime's OrtExecutionProviderDevicePolicy members, as a list item policy:NAME names them.
DEVICE_POLICIES = ("DEFAULT", "PREFER_CPU", "PREFER_NPU", "PREFER_GPU", "MAX_PERFORMANCE",
                   "MAX_EFFICIENCY", "MIN_OVERALL_POWER")
# The policies that ask for a device other than the CPU: getting the CPU alone is a fallback.
_ACCELERATOR_POLICIES = ("PREFER_NPU", "PREFER_GPU")
# The first onnxruntime release with plugin EP libraries, EP devices and device policies.
PLUGIN_EPS_SINCE = (1, 22)


_WARNING = 2  # onnxruntime's log severity for warnings


@dataclasses.dataclass
class ProviderRequest:
    """Where a session is asked to run.

    ``requested`` is the list as the user gave it: provider names in priority order, or one
    ``policy:NAME`` item that lets onnxruntime choose the devices. ``options`` holds provider
    options by provider name (``--ep-option``). ``strict``: a provider that fails to start
    (an option it rejects, a missing driver) is an error, where onnxruntime would print a
    banner and quietly retry on the CPU. ``allow_fallback`` false: a session that does not
    hold every requested provider is refused (``require_got``), as a measurement on another
    provider would be a wrong answer.

    onnxruntime appends a built-in provider by its name. A plugin EP (registered from a
    library) is listed by ``get_available_providers`` too, yet asked for by name it silently
    gives the CPU: it must be appended through its devices (``add_provider_for_devices``), and
    once one provider goes that way they all do (the ``providers`` argument would override
    them). ``by_devices`` says which way a request takes.
    """

    requested: list[str]
    options: dict = dataclasses.field(default_factory=dict)
    strict: bool = False
    allow_fallback: bool = True

    @property
    def names(self) -> list[str]:
        """The requested provider names, any ``policy:NAME`` item left out."""
        return [name for name in self.requested if not name.startswith(POLICY_PREFIX)]

    @property
    def policy(self) -> str | None:
        """The NAME of the ``policy:NAME`` item; None where the request names providers."""
        return next((name[len(POLICY_PREFIX):] for name in self.requested
                     if name.startswith(POLICY_PREFIX)), None)

    def by_devices(self) -> bool:
        """Does the request go through devices (``add_to``) rather than by name: a policy, or any
        name a registered plugin EP brought?"""
        plugins = PLUGINS.names()
        return self.policy is not None or any(name in plugins for name in self.names)

    def add_to(self, options) -> None:
        """Append the requested providers to session ``options`` through their devices (a
        built-in one by name), or set the device policy. A provider without a device here, or
        one this build lacks, is left out, as onnxruntime drops an unknown name: the session's
        own list then shows the fallback."""
        ort = import_ort()
        if self.policy is not None:
            options.set_provider_selection_policy(
                getattr(ort.OrtExecutionProviderDevicePolicy, self.policy))
            return
        devices = list(ort.get_ep_devices())
        available = set(ort.get_available_providers())
        for name in self.names:
            provider_options = {key: str(value)
                                for key, value in self.options.get(name, {}).items()}
            own = [device for device in devices if device.ep_name == name]
            if own:
                if provider_options and not 0 <= options.log_severity_level <= _WARNING:
                    # a plugin EP says only in its log that it ignored an option
                    options.log_severity_level = _WARNING
                options.add_provider_for_devices(own, provider_options)
            elif name in available and name not in PLUGINS.names():
                options.add_provider(name, provider_options)


def differs_from_request(requested: list[str], actual: list[str]) -> bool:
    """The contract's ``fell_back`` field: the session's providers are not the requested list,
    compared as lists (onnxruntime appending the CPU provider counts). It is a record, not a
    verdict: what eprun refuses, and calls a fallback, is ``fallback_of``."""
    return actual != requested


def fallback_of(requested: list[str], actual: list[str], nodes: dict | None = None
                ) -> list[str]:
    """The requested providers a session did not get: the one fallback rule. onnxruntime
    appending the CPU provider to what was asked is not a fallback; a requested provider
    missing from the session is, and so is one the session lists but that took no node
    (``nodes``, where known: ``get_providers()`` lists an EP whatever it took), and a policy
    that prefers a GPU or NPU and got the CPU alone."""
    took = set(actual) if nodes is None else {name for name, count in nodes.items() if count}
    missing = [name for name in requested if not name.startswith(POLICY_PREFIX)
               and (name not in actual or (name != CPU_EP and nodes is not None
                                           and name not in took))]
    policies = [name for name in requested if name.startswith(POLICY_PREFIX)]
    if any(name[len(POLICY_PREFIX):] in _ACCELERATOR_POLICIES for name in policies) and \
            (set(actual) <= {CPU_EP} or took <= {CPU_EP}):
        missing += policies
    return missing


class PluginLibraries:
    """The plugin EP libraries registered in this process, by real path, with the EP names
    each brought. onnxruntime keeps a registration for the life of the process, so this list
    mirrors its state rather than any one command's."""

    def __init__(self) -> None:
        """None registered yet, and the installed plugin packages not yet looked for."""
        self.libraries: dict[str, list[str]] = {}
        self.discovered = False

    def names(self) -> set[str]:
        """Every EP name the registered libraries brought."""
        return {name for names in self.libraries.values() for name in names}

    def register(self, path: str, names: list[str] | None = None, what: str = "--ep-library"
                 ) -> list[str]:
        """Register the library at ``path`` (once); the EP names it offers: ``names`` (what
        its package says) and the EP names of the devices it added."""
        ort = import_ort()
        require_plugin_support(what)
        require_file(path, "EP library")
        real = os.path.realpath(path)
        if real in self.libraries:
            return self.libraries[real]
        before = {device.ep_name for device in ort.get_ep_devices()}
        registration = f"eprun-{len(self.libraries)}"
        try:
            ort.register_execution_provider_library(registration, real)
        except Exception as exc:
            raise EprunError(f"{path!r} is not an execution provider library onnxruntime "
                             f"{ort.__version__} can load: {type(exc).__name__}: "
                             f"{one_line(exc)}") from exc
        # a package can name fewer EPs than its library adds (OpenVINO's names one and adds
        # "OpenVINOExecutionProvider.AUTO" too), and a library with no device here adds none
        added = sorted({device.ep_name for device in ort.get_ep_devices()} - before)
        if not added and not names:  # nothing says what it is: it is of no use here
            with contextlib.suppress(Exception):
                ort.unregister_execution_provider_library(registration)
            raise EprunError(f"{path!r} loaded but brought no execution provider: it offers no "
                             f"device on this machine, or it was built for another onnxruntime "
                             f"release than {ort.__version__} (a plugin built for a newer one "
                             "loads and creates nothing)")
        offered = list(dict.fromkeys([*(names or ()), *added]))
        self.libraries[real] = offered
        return offered

    def discover(self) -> None:
        """Register every installed plugin EP package once (see ``installed_plugins``), except
        one whose EP this onnxruntime already has built in."""
        if self.discovered:
            return
        self.discovered = True
        ort = import_ort()
        if ort_release() < PLUGIN_EPS_SINCE:
            return
        built_in = set(ort.get_available_providers())
        for package, library, names in installed_plugins():
            if set(names) <= built_in:
                continue
            try:
                self.register(library, names, what=f"the plugin package {package!r}")
            except EprunError as exc:
                note(f"installed plugin package {package!r} was not registered: {exc}")


PLUGINS = PluginLibraries()


def require_plugin_support(what: str) -> None:
    """A usage error (exit 2) for ``what`` (the option or package that asks) before onnxruntime
    1.22, which has no plugin EPs, EP devices or device policies."""
    ort = import_ort()
    if ort_release() < PLUGIN_EPS_SINCE:
        raise EprunError(f"{what} needs onnxruntime 1.22 or newer, which loads plugin EP "
                         f"libraries and chooses devices; this is onnxruntime {ort.__version__}",
                         EXIT_USAGE)


def installed_plugins() -> list[tuple[str, str, list[str]]]:
    """(package, library path, EP names) of each installed plugin EP package: a distribution
    named ``onnxruntime-ep-*``, or one that requires onnxruntime, whose top-level module
    defines ``get_library_path()`` and ``get_ep_name()`` or ``get_ep_names()`` (the shape
    ``onnxruntime-ep-openvino`` and its peers share). Modules are read as text first and only
    such a module is imported, so unrelated packages are never imported."""
    folders = _plugin_candidates()
    if folders == []:
        return []
    from importlib import metadata

    found = []
    for distribution in (metadata.distributions() if folders is None
                         else [metadata.Distribution.at(folder) for folder in folders]):
        package = distribution.metadata["Name"] or ""
        name = package.lower().replace("_", "-")
        plugin_named = name.startswith("onnxruntime-ep-")
        if name.startswith("onnxruntime") and not plugin_named:
            continue  # onnxruntime itself and its builds, genai, extensions
        if not plugin_named and "onnxruntime" not in " ".join(distribution.requires or ()).lower():
            continue
        for file in distribution.files or ():
            if file.name == "__init__.py" and len(file.parts) == 2 and _looks_like_plugin(file):
                try:
                    found.append((package, *_plugin_entry(file.parts[0])))
                except Exception as exc:
                    note(f"installed plugin package {package!r} cannot be used: "
                         f"{type(exc).__name__}: {one_line(exc)}")
    return found


def _plugin_candidates() -> list[str] | None:
    """The metadata folders on ``sys.path`` that may hold a plugin EP package, found without
    importing ``importlib.metadata`` (its import and a parse of every distribution's metadata
    cost a tenth of a second, more with many packages): a ``*.dist-info`` or ``*.egg-info``
    folder named ``onnxruntime-ep-*``, or one not named ``onnxruntime*`` whose metadata
    mentions onnxruntime at all. A superset of what ``installed_plugins`` keeps, which then
    decides each by its parsed metadata. ``None`` where a path entry is not a plain folder
    (a zip file): there only importlib.metadata knows what is installed."""
    found = []
    for entry in dict.fromkeys(sys.path):
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):
                return None
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in sorted(names):
            stem, suffix = os.path.splitext(name)
            if suffix.lower() not in (".dist-info", ".egg-info"):
                continue
            normal = re.sub(r"[-_.]+", "-", stem.lower())
            path = os.path.join(folder, name)
            if normal.startswith("onnxruntime-ep-") or (
                    not normal.startswith("onnxruntime") and _mentions_onnxruntime(path)):
                found.append(path)
    return found


def _mentions_onnxruntime(path: str) -> bool:
    """Does a distribution's metadata (``METADATA``, ``PKG-INFO``, ``requires.txt``, or the
    file itself for a one-file ``.egg-info``) name onnxruntime anywhere?"""
    files = ([os.path.join(path, name) for name in ("METADATA", "PKG-INFO", "requires.txt")]
             if os.path.isdir(path) else [path])
    for file in files:
        try:
            with open(file, "rb") as stream:
                if b"onnxruntime" in stream.read().lower():
                    return True
        except OSError:
            continue
    return False


def _looks_like_plugin(file) -> bool:
    """Does a package's ``__init__.py`` define the plugin functions (read, not imported)?"""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return "def get_library_path" in text and "def get_ep_name" in text


def _plugin_entry(module_name: str) -> tuple[str, list[str]]:
    """Import the plugin package ``module_name``; its library path and EP names (``get_ep_names()``,
    else ``[get_ep_name()]``)."""
    import importlib

    module = importlib.import_module(module_name)
    names = (list(module.get_ep_names()) if hasattr(module, "get_ep_names")
             else [module.get_ep_name()])
    return module.get_library_path(), names


def prepare_providers(lists: list[list[str]], libraries: list[str] = (),
                      options: dict | None = None, discover: bool = False) -> None:
    """Before any session: register the ``--ep-library`` files and, when a list asks for
    something onnxruntime does not have built in (or ``discover``), the installed plugin
    packages; then refuse what cannot work (exit 2): an unknown provider or policy name, a
    policy mixed with names, options for a provider no list asks for."""
    ort = import_ort()
    for path in libraries:
        PLUGINS.register(path)
    built_in = set(ort.get_available_providers())
    if discover or any(name not in built_in for requested in lists for name in requested):
        PLUGINS.discover()
    for requested in lists:
        policies = [name for name in requested if name.startswith(POLICY_PREFIX)]
        if policies:
            require_plugin_support(f"{policies[0]!r}")
            if len(requested) > 1:
                raise EprunError(f"{','.join(requested)}: a device policy chooses the providers "
                                 f"itself; give {policies[0]} alone, or name the providers",
                                 EXIT_USAGE)
            policy = policies[0][len(POLICY_PREFIX):]
            if policy not in DEVICE_POLICIES:
                raise EprunError(f"{policies[0]!r} is not a device policy; "
                                 f"{_closest(policy, DEVICE_POLICIES, 'policies are')}",
                                 EXIT_USAGE)
    for provider in options or {}:
        if not any(provider in requested for requested in lists):
            raise EprunError(f"--ep-option names {provider}, which no provider list of this "
                             f"command asks for ({'; '.join(map(','.join, lists))})", EXIT_USAGE)
    for message in option_warnings(options or {}):
        note(message)
    for name in sorted(set(options or {}) & PLUGINS.names()):
        note(f"{name} is a plugin EP: onnxruntime hands it the --ep-option values unchecked, "
             "and it may ignore one it does not use without an error (the EP's own warnings "
             "are shown); the answer's \"options\" are what was given, not what it applied")


def _closest(name: str, known: list[str] | tuple, what: str) -> str:
    """``did you mean X?`` for the one of ``known`` closest to ``name`` upper-cased (a policy name),
    else ``what`` and every known one."""
    import difflib

    close = difflib.get_close_matches(name.upper(), list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else f"{what} {', '.join(known)}"


def plugin_notes(lists: list[list[str]]) -> list[str]:
    """Why a registered plugin EP will not be in a session: it offers no device on this
    machine (the OpenVINO plugin, for one, offers Intel devices only)."""
    ort = import_ort()
    if not PLUGINS.libraries:  # nothing registered (always so before onnxruntime 1.22)
        return []
    with_devices = {device.ep_name for device in ort.get_ep_devices()}
    wanted = {name for requested in lists for name in requested}
    messages = []
    for path, names in PLUGINS.libraries.items():
        idle = [name for name in names if name not in with_devices]
        if not names or (idle and wanted & set(idle)):
            messages.append(f"{', '.join(idle) or 'the plugin EP library'} "
                            f"({os.path.basename(path)}) is registered but offers no device "
                            "on this machine, so no session can use it")
    return messages


def provider_warnings(requested: list[str]) -> list[str]:
    """One message per requested name onnxruntime does not know (in any build, nor as a
    registered plugin), with the closest known name; onnxruntime itself would only drop it
    silently. Policy items are checked by ``prepare_providers``."""
    ort = import_ort()
    known = list(dict.fromkeys([*ort.get_all_providers(), *sorted(PLUGINS.names())]))
    messages = []
    for name in requested:
        if name in known or name.startswith(POLICY_PREFIX):
            continue
        close = _closest_provider(name, known)
        hint = (f"did you mean {close}?" if close else f"onnxruntime knows {', '.join(known)}")
        messages.append(f"{name!r} is not a provider onnxruntime knows; {hint}")
    return messages


def _closest_provider(name: str, known: list[str]) -> str | None:
    """The known provider ``name`` was meant to be, by the part before its "ExecutionProvider"
    suffix, so that a typo in the suffix ("OpenVINOExecutionProvder") or a short form
    ("OpenVino", "CUDA") still finds it, and the suffix alone makes no match
    ("FooExecutionProvider")."""
    import difflib

    def stem(text: str) -> str:
        """The part of a provider name before "Execution...", however that is spelt."""
        return re.split(r"exec", text.lower(), maxsplit=1)[0] or text.lower()

    stems: dict[str, str] = {}
    for known_name in known:  # the first of a stem ("OpenVINOExecutionProvider", not ".AUTO")
        stems.setdefault(stem(known_name), known_name)
    match = difflib.get_close_matches(stem(name), list(stems), n=1, cutoff=0.75)
    return stems[match[0]] if match else None


def require_known_providers(requested: list[str]) -> None:
    """A usage error (exit 2) for a provider name onnxruntime does not know."""
    messages = provider_warnings(requested)
    if messages:
        raise EprunError(messages[0], EXIT_USAGE)


def require_got(session, on: ProviderRequest, what: str, source=None) -> None:
    """Refuse (exit 4) a session that misses a requested provider, or whose provider took no
    node: a number measured on another provider than the one asked for is a wrong answer.
    (With ``--allow-fallback`` it is measured anyway, and the answer records what it ran
    on.) The refusal says why the provider is missing where that can be known: the package
    that has it, or the provider's own words on the options it was given (``source``: what
    the session was opened from, to ask the provider again)."""
    actual = list(session.get_providers())
    nodes = nodes_of(session)
    missing = fallback_of(on.requested, actual, nodes)
    if not missing:
        return
    idle = [name for name in missing if name in actual]
    installed = set(import_ort().get_available_providers()) | set(PLUGINS.names())
    if idle:
        got = (f"{', '.join(idle)} took 0 of {sum(nodes.values())} nodes (they ran on "
               f"{', '.join(name for name, count in nodes.items() if count) or 'nothing'})")
        remedy = "check which op types it supports"
    else:  # each in its own words: not in this build, or installed but it did not start
        reasons = [why_missing(name, on, source)
                   or (f"{name} did not start" if name in installed else f"{name} missing")
                   for name in missing]
        got = f"got {','.join(actual)} ({'; '.join(reasons)})"
        remedy = ("fix the provider's options or its device" if set(missing) <= installed
                  else "install or fix the provider (or its options)")
    raise ProviderRefused(f"{what} asked for {','.join(on.requested)} and {got}; a "
                          f"measurement on other providers would answer another question: "
                          f"{remedy}, or add --allow-fallback to measure on what the session "
                          "got")


# The package that brings each execution provider onnxruntime's plain CPU build lacks.
PROVIDER_PACKAGES = {
    "CUDAExecutionProvider": "onnxruntime-gpu", "TensorrtExecutionProvider": "onnxruntime-gpu",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "DmlExecutionProvider": "onnxruntime-directml", "QNNExecutionProvider": "onnxruntime-qnn",
    "ROCMExecutionProvider": "onnxruntime-rocm", "MIGraphXExecutionProvider":
    "onnxruntime-migraphx", "VitisAIExecutionProvider": "onnxruntime-vitisai",
    "CoreMLExecutionProvider": "onnxruntime (its macOS build)",
    "WebGpuExecutionProvider": "onnxruntime-webgpu"}


# The option keys of the built-in EPs users most often pass (onnxruntime's docs, 1.16 - 1.24):
# a key outside these is flagged before any session, never refused (releases add keys).
PROVIDER_OPTION_KEYS = {
    "OpenVINOExecutionProvider": (
        "device_type", "precision", "num_of_threads", "cache_dir", "context",
        "enable_opencl_throttling", "enable_qdq_optimizer", "disable_dynamic_shapes",
        "enable_dynamic_shapes", "model_priority", "num_streams", "load_config", "device_id",
        "enable_npu_fast_compile", "reshape_input", "layout", "device_luid",
        "enable_causallm"),
    "CUDAExecutionProvider": (
        "device_id", "gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search",
        "do_copy_in_default_stream", "cudnn_conv_use_max_workspace",
        "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph", "enable_skip_layer_norm_strict_mode",
        "use_ep_level_unified_stream", "use_tf32", "prefer_nhwc", "tunable_op_enable",
        "tunable_op_tuning_enable", "tunable_op_max_tuning_duration_ms", "sdpa_kernel",
        "has_user_compute_stream", "user_compute_stream", "fuse_conv_bias"),
    "CPUExecutionProvider": ()}


def option_warnings(options: dict) -> list[str]:
    """One message per ``--ep-option`` key a built-in EP eprun knows the options of does not
    take, with the nearest key."""
    if not options:
        return []
    import difflib

    messages = []
    for provider, keys in options.items():
        known = PROVIDER_OPTION_KEYS.get(provider)
        for key in keys if known is not None else ():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else (
                    f"it takes {', '.join(known)}" if known else "it takes no options")
                messages.append(f"--ep-option {provider}:{key}: {provider} has no option "
                                f"{key!r} that eprun knows of; {hint}")
    return messages


def why_missing(name: str, on: ProviderRequest, source=None) -> str:
    """Why a requested provider is not in a session, in a few words: not in this build (and
    the package that has it), a plugin without a device here, or what the provider itself
    said when it did not start (asked again, ``provider_refusal``)."""
    if name.startswith(POLICY_PREFIX):
        return ""
    notes = plugin_notes([[name]])
    if notes:
        return "; ".join(notes)
    if name not in import_ort().get_available_providers():
        package = PROVIDER_PACKAGES.get(name)
        return (f"this onnxruntime build has no {name}" +
                (f": it comes with the package {package}" if package else ""))
    if source is None:
        return ""
    reason = provider_refusal(source, on, name)
    given = _options_text(on.options, [name])
    return (f"{name} did not start" + (f" with the options given ({given})" if given else "")
            + (f": {reason}" if reason else ""))


# onnxruntime's log lines: "[E:onnxruntime:Default, file.cc:12 Function] message"
_LOG_ERROR = r"\[E:onnxruntime:[^\]]*\]\s*(.*)"
_ANSI = r"\x1b\[[0-9;]*m"


def provider_refusal(source, on: ProviderRequest, name: str) -> str:
    """What provider ``name`` says when a session asks for it alone, strictly (no quiet
    fallback), with ``on``'s options: its exception, or else the error it logs (onnxruntime
    drops an EP that fails to start and logs why, even where fallback is off). Empty where
    it says nothing."""
    alone = ProviderRequest([name], options=on.options, strict=True)
    level = OrtLog.level
    OrtLog.set(3)  # errors: what the provider says when it will not start
    try:
        with captured_chatter() as store:
            try:
                open_session(source, what="the provider check", on=alone)
            except EprunError as exc:
                return one_line(exc.__cause__ or exc)
    finally:
        OrtLog.set(level)
    if store is None:
        return ""
    store.seek(0)
    for line in store.read().decode("utf-8", "replace").splitlines():
        match = re.search(_LOG_ERROR, re.sub(_ANSI, "", line))
        if match:
            text = match.group(1)
            return one_line(text.split("[ERROR]", 1)[-1] if "[ERROR]" in text else text)
    return ""


def _options_text(options: dict, providers: list[str]) -> str:
    """The ``--ep-option`` values of ``providers`` as ``EP:KEY=VALUE, ...`` for a message; empty
    where none was given."""
    return ", ".join(f"{provider}:{key}={value}" for provider in providers
                     for key, value in options.get(provider, {}).items())


class Targets(NamedTuple):
    """Where a measuring command runs its two sides: the candidate (int8) model on
    ``--providers``, the reference (fp32) on ``--reference-providers``; None is the CPU with
    the contract's default session, and the answer left as the contract has it."""

    candidate: ProviderRequest | None = None
    reference: ProviderRequest | None = None

    @property
    def given(self) -> bool:
        """Was either side given providers?"""
        return self.candidate is not None or self.reference is not None

    def field(self, candidate: Got, reference: Got) -> dict:
        """The answer's ``providers`` record: what was asked, what each side's session got,
        and how many nodes each provider took there."""
        requested = (self.candidate.requested if self.candidate else [CPU_EP])
        record = {"requested": requested, "actual": candidate.actual,
                  "fell_back": differs_from_request(requested, candidate.actual),
                  "missing": fallback_of(requested, candidate.actual, candidate.nodes),
                  "reference": reference.actual, **nodes_record(candidate.nodes),
                  **nodes_record(reference.nodes, "reference_")}
        options = (self.candidate or self.reference).options
        if options:
            record["options"] = options
        return record


def targets_from(flags: ProviderFlags, reference_providers: list[str] | None = None
                 ) -> Targets:
    """Parse and check a measuring command's provider flags before anything is measured: the
    candidate's from ``flags``, the reference's ``reference_providers`` (None: the CPU, with
    the contract's default session)."""
    providers, allow_fallback = flags.providers, flags.allow_fallback
    ep_options = flags.ep_options or {}
    lists = [requested for requested in (providers, reference_providers) if requested is not None]
    if (flags.ep_library or ep_options) and not lists:
        providers = [CPU_EP]
        lists = [providers]
    prepare_providers(lists, flags.ep_library, ep_options)
    for requested in lists:
        require_known_providers(requested)

    def request(requested: list[str] | None) -> ProviderRequest | None:
        """One side's ``ProviderRequest`` (None: the CPU, the contract's default session)."""
        if requested is None:
            return None
        if not requested:
            raise EprunError("the provider list is empty; name at least one provider, e.g. "
                             "CPUExecutionProvider", EXIT_USAGE)
        return ProviderRequest(requested, options=ep_options, strict=not allow_fallback,
                               allow_fallback=allow_fallback)

    return Targets(request(providers), request(reference_providers))


def ep_options_from(args: argparse.Namespace) -> dict:
    """``{provider: {key: value}}`` of the parsed ``--ep-option`` values (a key's last wins)."""
    options: dict = {}
    for provider, key, value in args.ep_option:
        options.setdefault(provider, {})[key] = value
    return options


# -- sessions --------------------------------------------------------------------------------------

# The first onnxruntime release that reads session.model_external_initializers_file_folder_path
# (onnxruntime #23557). Earlier ones ignore the unknown key and, for a model given as bytes,
# look for external data relative to the working directory, where a file of the same name
# may hold other weights: they are given the data as memory maps instead.
_FOLDER_OPTION_SINCE = (1, 21)


def session_options(*, level: str | None = None, threads: int | None = None,
                    optimized_path: str | None = None, config: dict | None = None,
                    profile_prefix: str | None = None):
    """The one place eprun builds onnxruntime's SessionOptions: an optimization level by its
    ``GraphOptimizationLevel`` name, a number of intra-op threads (inter-op then one), a file
    to save the optimized graph in, session config entries, and profiling into files named
    ``profile_prefix...``. What is not given stays onnxruntime's default."""
    ort = import_ort()
    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


# Address space for what onnxruntime, onnx and numpy map when they load (pinned stack: 160 MB,
# one OpenBLAS thread), and what a session needs beyond its threads' stacks (an arena, MLAS's
# per-thread buffers, outputs). Below these the libraries fail inside native code.
_IMPORT_ROOM = 160 << 20
_SESSION_ROOM = 4 << 20


def _stack_size() -> int:
    """The stack a new thread reserves: RLIMIT_STACK's soft limit (glibc's default), else 8 MB."""
    import resource

    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return 8 << 20 if stack in (resource.RLIM_INFINITY, 0) else stack


def require_address_space(what: str, room: int = _SESSION_ROOM, threads: int = 0) -> None:
    """Under a finite ``ulimit -v`` (RLIMIT_AS), refuse (exit 4, one line) what the room left
    cannot hold: ``room`` bytes plus the stacks of ``threads`` new threads. onnxruntime,
    protobuf and numpy do not fail cleanly there: a thread pool whose thread did not start
    deadlocks, an unchecked allocation is a SIGSEGV."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return
        with open("/proc/self/status", "rb") as status:
            used = next(int(line.split()[1]) << 10 for line in status
                        if line.startswith(b"VmSize:"))
    except (ImportError, OSError, StopIteration, ValueError):
        return
    need = room + threads * _stack_size()
    if limit - used < need:
        raise EprunError(f"out of address space for {what}: ulimit -v is {limit >> 10} KB, "
                         f"{used >> 10} KB are in use and about {need >> 20} MB more are "
                         f"needed; raise ulimit -v to at least {(used + need) >> 10}")


# The first onnxruntime release whose CPU kernels run each weight-only form right, measured on
# the wheels from 1.16.0 to 1.28: MatMulNBits of 4 bits and MatMulBnb4 from 1.16.2, but 1.16
# refuses accuracy_level and reads zero points in an older layout (wrong sums); 8 bits fail, at
# open or at run, before 1.23, 2 bits before 1.24; GatherBlockQuantized from 1.20; an INT4 or
# UINT4 tensor (a blockwise DequantizeLinear's weight, a quantized table) from 1.19.
_NBITS_SINCE = {2: (1, 24, 1), 4: (1, 16, 2), 8: (1, 23, 0)}
_WEIGHT_ONLY_SINCE = {"zero points": (1, 17, 0), "MatMulBnb4": (1, 16, 2),
                      "GatherBlockQuantized": (1, 20, 0), "int4": (1, 19, 0)}


def weight_only_release(graph) -> tuple[tuple[int, int, int], str] | None:
    """``(release, what)``: the first onnxruntime release that runs every weight-only form in
    ``graph`` right (``_NBITS_SINCE``, ``_WEIGHT_ONLY_SINCE``), and the form that needs it, in
    words; None for a graph without one."""
    int4 = {tensor.name for tensor in graph.initializer if tensor.data_type in (21, 22)}
    needs = []
    for node, bits in weight_only_nodes(graph):
        attributes = int_attributes(node)
        if node.op_type == "MatMulNBits":
            needs.append((_NBITS_SINCE.get(bits, max(_NBITS_SINCE.values())),
                          f"{bits}-bit MatMulNBits weights"))
            zero_points = len(node.input) > 3 and bool(node.input[3])
            if bits == 4 and (zero_points or "accuracy_level" in attributes):
                needs.append((_WEIGHT_ONLY_SINCE["zero points"],
                              "4-bit MatMulNBits weights with zero points or an accuracy_level"))
        elif node.op_type in _WEIGHT_ONLY_SINCE:
            needs.append((_WEIGHT_ONLY_SINCE[node.op_type], f"{node.op_type} weights"))
        if int4.intersection(node.input):
            needs.append((_WEIGHT_ONLY_SINCE["int4"], f"INT4/UINT4 weights ({node.op_type})"))
    return max(needs, default=None)


# The words a model with weight-only quantization holds: its op types, or a block_size.
_WEIGHT_ONLY_WORDS = (b"MatMulNBits", b"MatMulBnb4", b"GatherBlockQuantized", b"block_size")
# The largest model file searched for them whole; a larger one is left to onnxruntime's words.
_WEIGHT_ONLY_SCAN_BYTES = 64 << 20


def _may_quantize_weights_only(source) -> bool:
    """Could ``source`` (a path or a model's bytes) hold weight-only quantization? Its bytes
    searched for the words such a model must hold, before any graph is read."""
    if isinstance(source, str):
        try:
            if os.path.getsize(source) > _WEIGHT_ONLY_SCAN_BYTES:
                return False
            with open(source, "rb") as stream:
                source = stream.read()
        except OSError:
            return False
    data = bytes(source)
    return any(word in data for word in _WEIGHT_ONLY_WORDS)


def _require_weight_only_release(source, what: str) -> None:
    """Refuse, before onnxruntime tries, a model whose weight-only quantization this
    onnxruntime cannot run or runs wrong (``weight_only_release``), naming the release that
    runs it: onnxruntime's own words name neither, and 1.16's sums are silently wrong. The
    graph is read for that only on a release older than one of those."""
    version = import_ort().__version__
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if release >= max(*_NBITS_SINCE.values(), *_WEIGHT_ONLY_SINCE.values()):
        return
    if not _may_quantize_weights_only(source):
        return  # (no graph read, nor onnx imported, for any other model)
    try:
        model = (load_model(source, graph_only=True) if isinstance(source, str) else
                 onnx_messages().ModelProto.FromString(bytes(source)))
        needed = weight_only_release(model.graph)
    except Exception:  # not a model eprun reads: onnxruntime's own error says what it is
        return
    if needed is not None and release < needed[0]:
        raise EprunError(f"onnxruntime {version} cannot run {what}: its {needed[1]} run on "
                         f"onnxruntime {'.'.join(map(str, needed[0]))} and later; upgrade it "
                         "(pip install --upgrade onnxruntime)")


def open_session(source, options=None, what: str = "model", disabled: list[str] = (), *,
                 on: ProviderRequest | None = None, ask_with: str | None = None):
    """The one way eprun opens a session: from a path or serialized bytes, on the CPU unless
    ``on`` says otherwise (see ``ProviderRequest``), with the graph transformers named in
    ``disabled`` turned off; any failure becomes one clear error whose cause is onnxruntime's
    own exception, and a session without a provider ``on`` requires is refused
    (``require_got``). ``ask_with``: the model file a provider that did not start is asked
    again with, for its own reason (default ``source``; an exposed copy's bytes name their
    weights by a location only its own options resolve)."""
    ort = import_ort()
    _require_weight_only_release(source, what)
    counting = records_assignment()
    on = on or ProviderRequest([CPU_EP])
    options, extra = _session_arguments(options, disabled, on, counting)
    return_freed_memory()  # what sessions released before this one, so peaks do not stack
    threads = options.intra_op_num_threads if options is not None else 0
    require_address_space(what, threads=(threads or os.cpu_count() or 1) - 1)
    path = source if isinstance(source, str) else None
    before, handle, source = _pinned_source(path, source)
    try:
        with _options_from_eprun():
            session = ort.InferenceSession(source, sess_options=options, **extra)
    except Exception as exc:
        said = native_message(exc)
        if handle is not None:
            os.close(handle)  # (onnxruntime names the file by the descriptor: say the path)
            said = re.sub(re.escape(source) + r"(?!\d)", lambda _: path, said)
        asked = "" if on.requested == [CPU_EP] else f" with providers {on.requested}"
        raise EprunError(f"onnxruntime cannot open {what}{asked}: "
                         f"{type(exc).__name__}: {said}{_too_large_hint(path)}") from exc
    if handle is not None:  # the file stays open as long as the session that names it
        import weakref

        weakref.finalize(session, os.close, handle)
        require_same_stamp(path, before, _stamp(os.fstat(handle)))
    if path is not None and handle is None:  # what onnxruntime read is one file, not two
        require_same_stamp(path, before)
    session.eprun_stamp = before  # the file this session is of (None: given as bytes)
    _require_text_names(session, what)
    if counting:
        session.eprun_nodes = _assigned_nodes(session)
    if not on.allow_fallback:
        require_got(session, on, what, ask_with or source)
    return session


# onnxruntime's Python API reads this when a session is made: "1" replaces the session options
# with the ort_config a model file carries in its metadata.
_CONFIG_FROM_MODEL = "ORT_LOAD_CONFIG_FROM_MODEL"


@contextlib.contextmanager
def _options_from_eprun() -> Iterator[None]:
    """A session's options are eprun's own, whatever ``ORT_LOAD_CONFIG_FROM_MODEL`` says: what
    a model file asks for would replace the levels, threads and config entries eprun measures
    with (node assignment's entry among them), so the variable is set aside while the session
    is made, and said once."""
    if os.environ.get(_CONFIG_FROM_MODEL) != "1":
        yield
        return
    knob_warning(f"{_CONFIG_FROM_MODEL}=1 is ignored: eprun's sessions take their options from "
                 "eprun's flags, never from the ort_config a model file carries")
    saved = os.environ.pop(_CONFIG_FROM_MODEL)
    try:
        yield
    finally:
        os.environ[_CONFIG_FROM_MODEL] = saved


def _session_arguments(options, disabled: list[str], on: ProviderRequest,
                       counting: bool) -> tuple[Any, dict]:
    """``(session options, keyword arguments)`` for ``InferenceSession``: the transformers
    turned off, no quiet retry on the CPU for a strict request, node assignment recorded
    where onnxruntime can, and the providers by name or (plugin EPs, policies) by device."""
    extra: dict = {"disabled_optimizers": list(disabled)} if disabled else {}
    if on.strict:  # an EP that fails to start is the answer, not a quiet retry on the CPU
        extra["enable_fallback"] = 0
    if counting:  # which provider each node went to: the truth get_providers() is not
        options = options if options is not None else import_ort().SessionOptions()
        options.add_session_config_entry(_ASSIGNMENT_KEY, "1")
    if on.by_devices():
        options = options if options is not None else session_options()
        on.add_to(options)
    else:
        extra["providers"] = on.names
        if on.options:
            extra["provider_options"] = [dict(on.options.get(name, {})) for name in on.names]
    return options, extra


def _pinned_source(path: str | None, source) -> tuple[Any, int | None, Any]:
    """``(stamp, descriptor, source)``: the model file held open where it has no external
    data (onnxruntime then reads the very file eprun stamped, whatever the path leads to
    meanwhile), its external data's locations confined first; bytes for a path that is not
    text."""
    if path is None:
        return None, None, source
    before = file_stamp(path)
    weights = external_files(path)  # confined here, whatever the release confines
    if not weights and os.path.isdir("/proc/self/fd"):
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return _stamp(os.fstat(handle)), handle, f"/proc/self/fd/{handle}"
    if not _is_text(path):
        return before, None, _bytes_for_a_path_not_text(path)
    return before, None, source


def _require_text_names(session, what: str) -> None:
    """onnxruntime hands names over as text: a name that is not UTF-8 fails on first use, so
    it fails here, once, in words."""
    try:
        [value.name for value in (*session.get_inputs(), *session.get_outputs())]
    except UnicodeDecodeError as exc:
        raise EprunError(f"{what} has an input or output whose name is not UTF-8 text "
                         f"({one_line(exc)}); eprun reads tensor names as text: give it a "
                         "UTF-8 name") from exc


# The session config entry that makes onnxruntime (1.24+) keep each node's provider.
_ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"


def records_assignment() -> bool:
    """Does this onnxruntime tell which provider each node was assigned to (1.24+)?"""
    return hasattr(import_ort().InferenceSession, "get_provider_graph_assignment_info")


def assigned_op_types(session) -> dict | None:
    """``{provider: {op_type: nodes}}`` as onnxruntime assigned the (optimized) graph's nodes;
    None where this onnxruntime does not say (before 1.24)."""
    if not records_assignment():
        return None
    kinds: dict = {}
    for subgraph in session.get_provider_graph_assignment_info():
        taken = kinds.setdefault(subgraph.ep_name, {})
        for node in subgraph.get_nodes():
            taken[node.op_type] = taken.get(node.op_type, 0) + 1
    return kinds


def _assigned_nodes(session) -> dict:
    """``{provider: nodes}`` as onnxruntime assigned the (optimized) graph's nodes."""
    return {provider: sum(kinds.values())
            for provider, kinds in (assigned_op_types(session) or {}).items()}


def nodes_of(session) -> dict | None:
    """What ``open_session`` learnt of the nodes each provider took; None where it cannot be
    known (onnxruntime before 1.24)."""
    return getattr(session, "eprun_nodes", None)


def nodes_record(nodes: dict | None, prefix: str = "", why: str | None = None) -> dict:
    """The record fields that say how many nodes each provider took, or why that is unknown
    (``prefix``: whose, e.g. the reference's; ``why``: other than this onnxruntime's age)."""
    if nodes is not None:
        return {f"{prefix}nodes_per_provider": nodes}
    return {f"{prefix}nodes_per_provider": None,
            f"{prefix}nodes_unknown": why or f"onnxruntime {import_ort().__version__} does not "
                                             "say which provider each node went to (1.24 and "
                                             "later do)"}


class Got(NamedTuple):
    """What a session got: its providers (``get_providers()``) and the nodes each took."""

    actual: list
    nodes: dict | None = None

    @classmethod
    def of(cls, session) -> Got:
        """What ``session`` got: its providers and the nodes each took (None where unknown)."""
        return cls(list(session.get_providers()), nodes_of(session))


# The source position and C++ signature onnxruntime puts before a native exception's words.
_NATIVE_PREFIX = r"^\S+\.(?:cc|cpp|h):\d+ (?:[^(]*\([^)]*\)(?: const)? )?"


def native_message(exc: BaseException) -> str:
    """A native exception's message in one line, without the source file and C++ signature
    before it ("/onnxruntime/...cc:1053 std::shared_ptr<...> f(...) Invalid option: x")."""
    return one_line(re.sub(_NATIVE_PREFIX, "", one_line(exc)))


def _bytes_for_a_path_not_text(path: str) -> bytes:
    """onnxruntime takes a path as UTF-8 text, and a folder named in another encoding is not
    (Python keeps its bytes as surrogates): such a model is handed over as its bytes, which
    works unless it keeps weights in other files (found beside a path only)."""
    model = load_model(path)
    if external_data_files(model, path):
        raise EprunError(f"{path!r} is not UTF-8 text, which onnxruntime needs to find the "
                         "external data beside a model; rename its folder (or the model) in "
                         "UTF-8")
    with open(path, "rb") as stream:
        return stream.read()


def _too_large_hint(path: str | None) -> str:
    """Why onnxruntime cannot parse a model file of 2 GB or more: protobuf's limit."""
    try:
        size = os.path.getsize(path) if path is not None else 0
    except OSError:
        return ""
    if size < 1 << 31:
        return ""
    return (f" (the file is {size / (1 << 30):.1f} GiB in one piece, past protobuf's 2 GiB "
            "limit, which onnxruntime cannot load from a path; keep its weights as external "
            "data: onnx.save_model(model, path, save_as_external_data=True))")


def fetch(session, names: list[str], feed: dict, what: str = "model", hint: str = "") -> dict:
    """``names`` by name from one run of ``session``; a name that is a graph input the
    session does not also output (``expose_in_place`` leaves it an input) is its feed."""
    outputs = {value.name for value in session.get_outputs()}
    fetched = [name for name in names if name in outputs or name not in feed]
    values = dict(zip(fetched, run_session(session, fetched, feed, what=what, hint=hint)))
    return {name: values[name] if name in values else feed[name] for name in names}


def return_freed_memory() -> None:
    """Hand the heap pages freed since the last call back to the system (glibc's
    ``malloc_trim``; elsewhere nothing). glibc keeps most of what a closed session freed, and
    the next session's weights would otherwise be counted on top of it."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, looked up once; None where the C library has none."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc (musl, macOS, Windows)
        return None


def run_session(session, output_names: list[str] | None, feed: dict, what: str = "model",
                hint: str = "") -> list:
    """``session.run(output_names, feed)`` (None: every output), any failure turned into one error
    (exit 4) that names ``what`` and ends with ``hint``."""
    require_address_space(what)
    try:
        return session.run(output_names, feed)
    except Exception as exc:
        raise EprunError(f"onnxruntime failed to run {what}: {type(exc).__name__}: "
                         f"{one_line(exc)}{hint}") from exc


# Errors worth another try: driver watchdog resets and timeouts while an EP compiles its graph.
_TRANSIENT = (r"(?i)time ?out|timed out|TDR|DXGI_ERROR|device (was )?(lost|removed)|"
              r"temporarily unavailable")


def _with_retries(action: Callable[[], Any], retries: int, pause: float, used: list,
                  path: str) -> Any:
    """Run ``action``, retrying transient provider errors only. ``used[0]`` counts the retries
    spent so far; ``retries`` bounds them for the whole check."""
    import time

    while True:
        try:
            return action()
        except EprunError as exc:
            if used[0] >= retries or not is_transient(exc, path):
                raise
            used[0] += 1
            print(f"eprun: transient provider error, retrying in {pause:g}s: {exc}",
                  file=sys.stderr)
            time.sleep(pause)


def is_transient(exc: EprunError, path: str) -> bool:
    """Is the onnxruntime error behind ``exc`` one worth another try? Only onnxruntime's own
    exception is read, with the model's path taken out: a model called ``timeout.onnx`` that
    is corrupt is not a timeout."""
    cause = exc.__cause__
    if cause is None:
        return False
    text = f"{type(cause).__name__}: {cause}"
    for spelling in sorted({path, os.path.abspath(path), os.path.basename(path)}, key=len,
                           reverse=True):
        if spelling:
            text = text.replace(spelling, "<model>")
    return bool(re.search(_TRANSIENT, text))


# -- what an EP takes, how it is drawn, what the report asks for -----------------------------------

_OWNER_COLOURS = {"CPU": "#9e9e9e", "EP": "#6a3d9a", "OpenVINO": "#0068b5", "CUDA": "#76b900",
                  "TensorRT": "#4c8c00", "DirectML": "#ff8c00", "Dml": "#ff8c00",
                  "QNN": "#d62598", "CoreML": "#7f3fbf", "ROCm": "#ed1c24",
                  "MIGraphX": "#b5179e", "WebGpu": "#00a3a3", "Azure": "#0078d4",
                  "VitisAI": "#e05206"}


_OTHER_COLOURS = ("#a6761d", "#66a61e", "#e7298a", "#7570b3", "#d95f02", "#1b9e77")


def ort_partition_groups(nodes: list, supported: list[str]) -> list[tuple[str, list[int]]]:
    """onnxruntime's ``CreateSupportedPartitionNodeGroups``, on node indices.

    A Kahn-style topological walk in waves: every supported node that becomes ready joins the
    current group; an unsupported node that consumes a member of the group (the group's
    border) waits for the next wave, and the group closes when a wave runs dry. Independent
    branches therefore merge into one group whatever their order in the file. Each unsupported
    node is emitted when it is processed and each group where it closes, which is a valid
    execution order; the caller merges runs of unsupported nodes into CPU partitions.
    """
    from collections import deque

    consumers, in_degree = _dependencies(nodes)
    supported_set = set(supported)
    ready = deque(index for index, degree in enumerate(in_degree) if degree == 0)
    next_wave: deque = deque()
    groups: list[tuple[str, list[int]]] = []
    group: list[int] = []
    border: set[int] = set()
    while ready or next_wave:
        if not ready:
            if group:
                groups.append(("ep", group))
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
            groups.append(("cpu", [index]))
        for consumer in consumers[index]:
            in_degree[consumer] -= 1
            if in_degree[consumer] == 0:
                ready.append(consumer)
    if group:
        groups.append(("ep", group))
    placed = sum(len(members) for _, members in groups)
    if placed != len(nodes):
        raise _cycle_error(next(node for index, node in enumerate(nodes)
                                if in_degree[index] > 0))
    return groups


def _dependencies(nodes: list) -> tuple[list[list[int]], list[int]]:
    """``(consumers, in_degree)`` by node index: who reads each node's outputs, and how many
    distinct nodes each reads from; a node that reads its own output is a cycle."""
    producer_of = GraphIndex(nodes).producer_index  # "" (an omitted input) is nobody's output
    producers = [sorted({producer_of[name] for name in _node_inputs(node)
                         if name and name in producer_of}) for node in nodes]
    for index, sources in enumerate(producers):
        if index in sources:  # Add(x, a) -> a reads its own output
            raise _cycle_error(nodes[index])
    consumers: list[list[int]] = [[] for _ in nodes]
    for index, sources in enumerate(producers):
        for source in sources:
            consumers[source].append(index)
    return consumers, [len(sources) for sources in producers]


def _cycle_error(stuck) -> EprunError:
    """The error (exit 4) for a graph in which node ``stuck`` reads its own output."""
    return EprunError(f"the graph has a cycle (node {stuck.name or stuck.op_type!r} waits on "
                      "its own output): it is not a valid ONNX graph")


REPORT_REQUESTS = (["CPUExecutionProvider"], ["AzureExecutionProvider"],
                   ["CUDAExecutionProvider", "CPUExecutionProvider"],
                   ["NoSuchExecutionProvider"], [])


# == 5. Measurement core ===========================================================================


# -- inputs ----------------------------------------------------------------------------------------


class InputSpec(NamedTuple):
    """What feeding one graph input takes: its numpy dtype, its dims (an int when fixed, a
    symbol's name, or None when unnamed or unset) and, for integer indices into a Gather table,
    the table's name and row count."""

    name: str
    dtype: str
    dims: tuple
    table: tuple[str, int] | None = None


@dataclasses.dataclass
class InputOptions:
    """How the user shaped the inputs (``--rows``, ``--dim``, ``--input-range``, ``--inputs``).

    ``rows=None`` means "not given": the contract's 64, or the model's own fixed batch.
    """

    rows: int | None = None
    dims: dict = dataclasses.field(default_factory=dict)
    ranges: dict = dataclasses.field(default_factory=dict)
    file: str | None = None
    arrays: dict | None = None  # inputs read from a golden file (``load_golden``)
    iteration: int | None = None  # which feed dict of a Polygraphy JSON file (--iteration;
    # None: not chosen, the first, or in check every one)

    @property
    def shaped(self) -> bool:
        """Did the user shape the inputs (``--dim``, ``--input-range``, an inputs file or golden
        arrays)? ``--rows`` alone does not count."""
        return bool(self.dims or self.ranges or self.file or self.arrays is not None)


class Feed(NamedTuple):
    """The arrays fed to a model, by input name, and what the answer says about them."""

    arrays: dict
    rows: int
    fed: list           # one {"name", "dtype", "shape", "source"} per input
    contract_shaped: bool
    defaulted: list     # "input[axis]" of each dimension eprun chose (for error hints)


_INDEX_PATH_OPS = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})


def specs_from_model(model) -> list[InputSpec]:
    """The graph inputs to feed, with the Gather table each integer input indexes."""
    from onnx import helper

    specs, index = [], None
    for value in graph_inputs(model):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise EprunError(f"input {value.name!r} is not a tensor; eprun feeds tensors only")
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        except (KeyError, TypeError, ValueError):
            dtype = f"onnx type {tensor.elem_type}"
        dims = tuple(dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0
                     else (dim.dim_param or None)
                     for dim in (tensor.shape.dim if tensor.HasField("shape") else ()))
        table = None
        if dtype.startswith(("int", "uint")):
            index = index or GraphIndex.of(model.graph, tensor_types(model))
            table = _gather_table(index, value.name)
        specs.append(InputSpec(value.name, dtype, dims, table))
    return specs


def _gather_table(index: GraphIndex, name: str) -> tuple[str, int] | None:
    """``(table, rows)`` of the smallest Gather table ``name`` indexes, directly or through
    casts and reshapes; None when it indexes none. ``index`` carries the value types."""
    types = index.types
    best, frontier, seen = None, [name], {name}
    while frontier:
        current = frontier.pop()
        for reader, position in index.readers.get(current, ()):
            node = index.nodes[reader]
            if node.op_type == "Gather" and position == 1:
                axis = next((attribute.i for attribute in node.attribute
                             if attribute.name == "axis"), 0)
                table_type = types.get(node.input[0])
                dims = (table_type.tensor_type.shape.dim
                        if table_type is not None and table_type.tensor_type.HasField("shape")
                        else [])
                if -len(dims) <= axis < len(dims) and dims[axis].dim_value > 0:
                    rows = dims[axis].dim_value
                    if best is None or rows < best[1]:
                        best = (float_tensor_name(node.input[0]), rows)
            elif node.op_type in _INDEX_PATH_OPS and position == 0:
                for output in node.output:
                    if output not in seen:
                        seen.add(output)
                        frontier.append(output)
    return best


_SESSION_TYPES = {"float": "float32", "double": "float64", "float16": "float16",
                  "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
                  "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8",
                  "bool": "bool"}


def session_specs(session, model_path: str) -> list[InputSpec]:
    """Input specs from a session's metadata; only a model with integer inputs has its graph
    parsed (to find the Gather tables they index), so a float model needs no onnx import."""
    values = session.get_inputs()
    kinds = [value.type[len("tensor("):-1] if value.type.startswith("tensor(") else value.type
             for value in values]
    if any(kind.startswith(("int", "uint")) for kind in kinds):
        return specs_from_model(load_model(model_path))
    return [InputSpec(value.name, _SESSION_TYPES.get(kind, f"onnx type {value.type}"),
                      tuple(dim if isinstance(dim, int) and dim > 0 else (dim or None)
                            if isinstance(dim, str) else None for dim in value.shape))
            for value, kind in zip(values, kinds)]


def make_feeds(specs: list[InputSpec], seed: int, options: InputOptions | None = None,
               path: str = "model") -> Feed:
    """Every input of a model, drawn by one ``default_rng(seed)`` in graph-input order.

    Floats are standard normal, integers that index a Gather table uniform over its rows,
    other integers and booleans 1 (an attention mask that attends); ``--input-range`` draws
    one input uniformly instead and ``--inputs`` takes arrays from a file. The batch axis
    (axis 0 when it is symbolic, unset, 0 or -1, and every dimension named like such an axis)
    gets ``rows``; other symbols share one value each (``--dim``, else ``DIM_DEFAULT``). For the
    contract's one float32 ``[batch, F]`` input this is exactly
    ``default_rng(seed).standard_normal((64, F)).astype(float32)``.
    """
    import numpy as np

    options = options or InputOptions()
    _require_named_inputs(specs, options, path)
    stored = (options.arrays if options.arrays is not None else
              _load_inputs_file(options.file, specs, path, iteration=options.iteration)
              if options.file else {})
    batch_symbols = _require_known_dims(specs, options, path)
    rows = _feed_rows(specs, options, stored, path)

    rng = np.random.default_rng(seed)
    arrays, fed, defaulted = {}, [], []
    for spec in specs:
        if spec.name in stored:
            array = stored[spec.name]
            if options.file and options.arrays is None:
                _require_fitting(array, spec, options.file, path)
            arrays[spec.name] = array
            fed.append({"name": spec.name, "dtype": array.dtype.name, "shape": list(array.shape),
                        "source": "file"})
            continue
        shape = _input_shape(spec, options.dims, rows, batch_symbols, defaulted)
        array, source = _draw(rng, spec, tuple(shape), options.ranges.get(spec.name), path)
        arrays[spec.name] = np.asarray(array)  # a scalar input stays an array
        fed.append({"name": spec.name, "dtype": spec.dtype, "shape": shape, "source": source})
    # the contract's one float32 [batch, F] input: its answers say nothing of the inputs
    return Feed(arrays, rows, fed, is_contract_input(specs) and not options.shaped, defaulted)


def _require_named_inputs(specs: list[InputSpec], options: InputOptions, path: str) -> None:
    """Every ``--input-range`` names an input of the model."""
    names = [spec.name for spec in specs]
    for name in options.ranges:
        if name not in names:
            raise EprunError(f"--input-range names {name!r}, which is not an input of {path!r} "
                             f"(inputs: {', '.join(names) or 'none'})", EXIT_USAGE)


def _require_known_dims(specs: list[InputSpec], options: InputOptions, path: str) -> set:
    """Every ``--dim`` names a symbolic (or unset) dimension of the model that is not the
    batch's (``--rows`` sets that); returns the batch's symbols."""
    batch_symbols = {spec.dims[0] for spec in specs
                     if spec.dims and isinstance(spec.dims[0], str)}
    for key in options.dims:
        if key in batch_symbols or key.endswith(":0"):
            raise EprunError(f"--dim {key}: that is the batch dimension; set it with --rows",
                             EXIT_USAGE)
    symbols = {dim for spec in specs for dim in spec.dims if isinstance(dim, str)}
    unnamed = {f"{spec.name}:{axis}" for spec in specs for axis, dim in enumerate(spec.dims)
               if dim is None}
    for key in options.dims:
        if key not in symbols and key not in unnamed:
            known = sorted(symbols | unnamed)
            raise EprunError(f"--dim names {key!r}, which is not a symbolic dimension of "
                             f"{path!r} (its symbolic dimensions: {', '.join(known) or 'none'})",
                             EXIT_USAGE)
    return batch_symbols


def _input_shape(spec: InputSpec, dims: dict, rows: int, batch_symbols: set,
                 defaulted: list[str]) -> list[int]:
    """The shape an input is drawn with: fixed dims as they are, ``--dim``'s, the batch's
    ``rows``, else ``DIM_DEFAULT`` (appended to ``defaulted`` for the note that says so)."""
    shape = []
    for axis, dim in enumerate(spec.dims):
        key = dim if isinstance(dim, str) else f"{spec.name}:{axis}"
        if isinstance(dim, int):
            shape.append(dim)
        elif key in dims:
            shape.append(dims[key])
        elif axis == 0 or dim in batch_symbols:
            shape.append(rows)
        else:
            shape.append(DIM_DEFAULT)
            defaulted.append(f"{spec.name}[{axis}]" + (f" ({dim!r})" if dim else ""))
    return shape


def is_contract_input(specs: list[InputSpec]) -> bool:
    """Do ``specs`` declare the contract's one float32 ``[batch, F]`` input?"""
    only = specs[0] if len(specs) == 1 else None
    return bool(only and only.dtype == "float32" and len(only.dims) == 2
                and not isinstance(only.dims[0], int) and isinstance(only.dims[1], int))


def require_room(spec: InputSpec, shape: list[int], path: str) -> None:
    """Refuse an input this machine cannot hold before drawing it: a dim of 2**62 in the model,
    ``--rows 10**12``. The draw makes float64 values first, so 8 bytes an element at least."""
    import numpy as np

    needed = math.prod(shape) * max(8, np.dtype(spec.dtype).itemsize)
    memory = _physical_memory()
    if needed > memory:
        raise EprunError(f"{path!r}: input {spec.name!r} of shape {shape} would take "
                         f"{_size_text(needed)}, more than this machine's "
                         f"{_size_text(memory)} of memory; lower --rows, or set its dims with "
                         "--dim (or give it with --inputs)")


def _physical_memory() -> int:
    """The machine's physical memory in bytes; the largest int64 where the system cannot say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not a POSIX system: numpy's own limit
        return (1 << 63) - 1


def _size_text(count: float) -> str:
    """A byte count as a person reads it: ``512 bytes``, ``1.5 MiB``, up to PiB."""
    if count < 1024:
        return f"{count:.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.3g} PiB"


def _feed_rows(specs: list[InputSpec], options: InputOptions, stored: dict, path: str) -> int:
    """The batch: ``--inputs``' arrays, else ``--rows``, else the model's own fixed batch,
    else the contract's 64. A batch the model fixes cannot be overridden."""
    fixed = next((spec.dims[0] for spec in specs
                  if spec.dims and isinstance(spec.dims[0], int)), None)
    batched = [spec for spec in specs if spec.dims and not isinstance(spec.dims[0], int)]
    from_file = {stored[spec.name].shape[0] for spec in batched
                 if spec.name in stored and stored[spec.name].ndim}
    if len(from_file) > 1:
        raise EprunError(f"the arrays in {options.file!r} disagree on the batch size "
                         f"({', '.join(map(str, sorted(from_file)))})")
    if from_file:
        rows = from_file.pop()
        if options.rows is not None and options.rows != rows:
            raise EprunError(f"--rows {options.rows} contradicts the batch of {rows} in "
                             f"{options.file!r}", EXIT_USAGE)
        return rows
    if fixed is not None and not batched:
        if options.rows is not None and options.rows != fixed:
            raise EprunError(f"{path!r} fixes the batch at {fixed}; --rows {options.rows} "
                             "cannot change it", EXIT_USAGE)
        return fixed
    return options.rows if options.rows is not None else ROWS


def _draw(rng, spec: InputSpec, shape: tuple, value_range: tuple | None, path: str):
    """One input's array and its ``source``: uniform in ``value_range``, else standard normal
    floats, its Gather table's row indices, or ones. A type it cannot generate or a shape memory
    cannot hold is refused; an empty integer range is a usage error."""
    import numpy as np

    kind = spec.dtype
    if not (kind == "bool" or kind.startswith(("float", "int", "uint"))):
        raise EprunError(f"{path!r}: input {spec.name!r} has type {kind}, which eprun cannot "
                         "generate; give it with --inputs FILE.npz")
    dtype = np.dtype(kind)
    require_room(spec, list(shape), path)
    if value_range is not None:
        low, high = value_range
        if dtype.kind == "f":
            return (rng.uniform(low, high, shape).astype(dtype),
                    f"uniform[{low:g}, {high:g})")
        low, high = math.ceil(low), math.floor(high)
        if dtype.kind == "b":
            low, high = max(low, 0), min(high, 1)
        else:  # as far as the type (and the generator's int64) holds
            info = np.iinfo(dtype)
            low, high = max(low, info.min, -1 << 63), min(high, info.max, (1 << 63) - 1)
        if low > high:
            raise EprunError(f"--input-range for {spec.name!r} holds no {kind} value",
                             EXIT_USAGE)
        return (rng.integers(low, high, shape, endpoint=True).astype(dtype),
                f"integers[{low}, {high}]")
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype), "standard_normal"
    if spec.table is not None:
        table, count = spec.table
        return (rng.integers(0, count, shape).astype(dtype),
                f"integers[0, {count - 1}] (rows of {table})")
    return np.ones(shape, dtype), "ones"


def declared_misfit(dims: tuple, shape: tuple) -> list | None:
    """The dims an input declares, as a message shows them, where an array of ``shape``
    cannot feed it (another rank, another size at a fixed dim); None where it can, or where
    the input declares no dims (a scalar, or no shape)."""
    if not dims or (len(shape) == len(dims) and all(
            not isinstance(dim, int) or dim == size for dim, size in zip(dims, shape))):
        return None
    return [dim if isinstance(dim, int) else (dim or "?") for dim in dims]


def npy_header(stream) -> tuple:
    """``(shape, fortran_order, dtype)`` of the .npy data ``stream`` starts with, read from
    its header alone."""
    import numpy as np

    version = np.lib.format.read_magic(stream)
    reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    return reader(stream)


def _require_fitting(array, spec: InputSpec, file: str, path: str,
                     option: str = "--inputs") -> None:
    """An array of an ``--inputs`` (or ``option``) file has the rank of the input it feeds and
    its fixed dims: a wrong one is the file's mistake, said as such before onnxruntime blames
    a model."""
    declared = declared_misfit(spec.dims, array.shape)
    if declared is not None:
        raise EprunError(f"{file!r}: {spec.name!r} has shape {list(array.shape)}, but "
                         f"{path!r} takes {spec.name!r} as {declared}; fix the array in the "
                         f"{option} file")


def _load_inputs_file(file: str, specs: list, path: str, what: str = "inputs", *,
                      iteration: int | None = 0) -> dict:
    """The arrays of an ``.npz`` file, one per input of ``specs``: only those members are read
    (``read_npz``), each only once its header's shape fits the input it feeds; a member no
    input is called is left unread, and said so. A ``.json`` file is Polygraphy's (``polygraphy
    run --save-inputs``): its feed dict number ``iteration``."""
    require_file(file, what)
    if file.lower().endswith(".json"):
        if what == "calibration":
            raise EprunError(f"--calibration {file!r}: a calibration file is an .npz of batches "
                             "(numpy.savez, one array per input); Polygraphy's JSON is for "
                             "--inputs", EXIT_USAGE)
        return _checked_inputs(file, read_polygraphy_inputs(
            file, [spec.name for spec in specs], iteration,
            {spec.name: spec.dims for spec in specs}))
    # a calibration file may hold many batches of a fixed batch size: its first axis is free
    dims = {spec.name: (spec.dims if what != "calibration" or not spec.dims
                        else (None, *spec.dims[1:])) for spec in specs}
    stored = read_npz(file, [spec.name for spec in specs], what, per=f"per input of {path!r}",
                      dims=dims, model=path)
    return _checked_inputs(file, stored)


def _checked_inputs(file: str, stored: dict) -> dict:
    """Inputs are numbers, with at least one row."""
    for name, array in stored.items():
        if array.dtype.kind not in "biuf":
            raise EprunError(f"{file!r}: {name!r} holds {array.dtype} values; the inputs must be "
                             "numbers (bool, integer or float arrays)")
        if array.ndim and array.shape[0] == 0:
            raise EprunError(f"{file!r}: {name!r} has 0 rows (shape {list(array.shape)}); give "
                             "at least one")
    return stored


# Bytes a .npy member may hold beyond its array's data: the header (numpy pads it to 64 bytes,
# and allows up to 4 GB only in format 2, which no real file needs).
_NPY_HEADER_BYTES = 1 << 16


def read_npz(file: str, names: list[str], what: str = "inputs", *, per: str = "",
             extra: str = "noted", max_bytes: int | None = None, dims: dict | None = None,
             model: str = "the model") -> dict:
    """The members ``names`` of an ``.npz`` file as arrays, and nothing else of it read.

    A zip member says how large it is before it is inflated: a member that declares more
    bytes than its .npy header's shape and type need (a zip bomb) is refused before it is
    inflated, and members no name asks for are never inflated at all. Object arrays (pickles)
    are refused. A missing name is an error (``per``: what each array is for, for the
    message); an extra one, by ``extra``, a note ("noted"), an error where the file must hold
    exactly ``names`` ("refused"), or nothing at all ("ignored"). ``max_bytes`` bounds the
    first member (a record, not data); ``dims`` (name: the dims an input declares) refuses a
    member whose header's shape the input cannot take, before a byte of it is inflated."""
    import zipfile

    try:
        with zipfile.ZipFile(file) as archive:
            members = {info.filename[:-4] if info.filename.endswith(".npy") else
                       info.filename: info for info in archive.infolist()}
            _require_members(file, names, list(members), per=per, extra=extra)
            fits = (dims or {}), model, "--calibration" if what == "calibration" else "--inputs"
            return {name: _read_npy_member(archive, members[name], file,
                                           max_bytes if position == 0 else None, fits)
                    for position, name in enumerate(names)}
    except EprunError:
        raise
    except Exception as exc:  # not a zip, a pickled object array, a damaged member
        raise EprunError(f"cannot read the {what} file {file!r} ({type(exc).__name__}: "
                         f"{one_line(exc)}); write it with numpy.savez") from exc


def _require_members(file: str, names: list[str], members: list[str], *, per: str,
                     extra: str) -> None:
    """Every one of ``names`` is a member; an extra member is an error where the file must
    hold exactly ``names`` (``extra`` "refused"), a note where it is "noted"."""
    missing = [name for name in names if name not in members]
    unread = [name for name in members if name not in names]
    exact = extra == "refused"
    if missing or (unread and exact):
        unknown = "nothing is called" if exact else "no input is called"
        raise EprunError(f"{file!r} must hold one array {per} ({', '.join(names)}): "
                         + "; ".join(part for part in (
                             f"missing {', '.join(missing)}" if missing else "",
                             f"{unknown} {', '.join(unread)}" if unread else "")
                             if part))
    if unread and extra == "noted":
        note(f"{file!r}: {', '.join(map(repr, unread))} is no input's name; left unread")


def _read_npy_member(archive, info, file: str, max_bytes: int | None = None,
                     fits: tuple = ({}, "the model", "--inputs")):
    """One member of an open .npz, its declared size checked against its header (and
    ``max_bytes``, and the dims of the input it feeds: ``fits`` is (name: dims, the model,
    the option that named the file)) first."""
    import numpy as np

    with archive.open(info) as stream:
        shape, _, dtype = npy_header(stream)
        needed = math.prod(shape) * dtype.itemsize
        if dtype.hasobject:
            raise ValueError(f"{info.filename!r} holds Python objects, which eprun never reads")
        if max_bytes is not None and needed > max_bytes:
            raise ValueError(f"{info.filename!r} is {needed} bytes, more than such a member "
                             f"ever holds ({max_bytes})")
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        model, option = fits[1], fits[2]
        declared = declared_misfit(fits[0].get(name), shape)
        if declared is not None:
            raise EprunError(f"{file!r}: {name!r} has shape {list(shape)}, but {model!r} takes "
                             f"{name!r} as {declared}; fix the array in the {option} file")
        if info.file_size > needed + _NPY_HEADER_BYTES:
            raise EprunError(f"{file!r}: member {info.filename!r} declares "
                             f"{info.file_size} bytes where its shape {list(shape)} of "
                             f"{dtype} needs {needed}; refusing to inflate it")
    with archive.open(info) as stream:
        return np.lib.format.read_array(stream, allow_pickle=False)


def feed_for(specs: list[InputSpec], other_path: str, feed: Feed) -> dict:
    """``feed``'s arrays for a second model of a comparison: by input name when the names
    agree, by position otherwise (a converted model may rename its inputs); cast where that
    model takes another float or integer width (a float16 model)."""
    names = [spec.name for spec in specs]
    if set(names) == set(feed.arrays):
        arrays = [feed.arrays[name] for name in names]
    elif len(names) == len(feed.arrays):
        arrays = list(feed.arrays.values())
    else:
        raise EprunError(f"{other_path!r} takes {len(names)} inputs ({', '.join(names)}), the "
                         f"first model {len(feed.arrays)} ({', '.join(feed.arrays)}); both must "
                         "take the same inputs")
    fed = {}
    for spec, given in zip(specs, arrays):
        array = given
        fixed = [(axis, dim) for axis, dim in enumerate(spec.dims) if isinstance(dim, int)]
        if len(spec.dims) != array.ndim or any(array.shape[axis] != dim for axis, dim in fixed):
            raise EprunError(f"the models take different input shapes: {other_path!r} wants "
                             f"{spec.name!r} as {[d if d else '?' for d in spec.dims]}, the "
                             f"first model takes {list(array.shape)}")
        if spec.dtype != array.dtype.name and spec.dtype in _SESSION_TYPES.values():
            array = array.astype(spec.dtype)
        fed[spec.name] = array
    return fed


def inputs_from(args: argparse.Namespace) -> InputOptions:
    """The ``InputOptions`` of the parsed input options; ``--iteration`` without a Polygraphy JSON
    file to pick from is a usage error."""
    if args.iteration and not any(str(getattr(args, name, None) or "").lower().endswith(".json")
                                  for name in ("inputs_file", "load_outputs")):
        raise EprunError(f"--iteration {args.iteration} picks an iteration of a Polygraphy JSON "
                         "file (--inputs FILE.json, --load-outputs FILE.json), and none is given",
                         EXIT_USAGE)
    return InputOptions(rows=args.rows, dims=dict(args.dim), ranges=dict(args.input_range),
                        file=args.inputs_file, iteration=args.iteration)


def dims_hint(feed: Feed) -> str:
    """What to try when a run fails on dimensions eprun chose itself."""
    if not feed.defaulted:
        return ""
    return (f" (eprun chose {DIM_DEFAULT} for {', '.join(feed.defaulted)}; set other values "
            "with --dim NAME=VALUE)")


def _require_numeric(value, name: str, path: str, command: str = "check") -> None:
    """``check`` and ``settings`` compare numeric tensors; a sequence, map or string output
    is refused."""
    import numpy as np

    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc":
        kind = (f"a {value.dtype} tensor" if isinstance(value, np.ndarray)
                else f"a {type(value).__name__} (not a tensor)")
        raise EprunError(f"{path!r}: output {name!r} is {kind}; {command} compares numeric "
                         "tensors only")


# -- golden files ----------------------------------------------------------------------------------

# The member of a golden .npz that says what it holds; the arrays are named by their input and
# tensor names (``golden_members``; eprun 0.10 and before named them input_<i>, tensor_<i>).
_GOLDEN_META = "eprun"
# The largest record (JSON text) a golden file may have: names and versions, not data.
_GOLDEN_RECORD_BYTES = 16 << 20


def save_golden(path: str, kind: str, model: str, tensors: dict | list[dict],
                inputs: dict | list[dict], *, got: Got, seed: int | None,
                inputs_file: str | None = None) -> dict:
    """Store reference tensors measured here (``kind`` "outputs" for check, "boundaries" for
    layers) with the inputs they were measured on, for a run on another machine
    (``load_golden``): the numbers a model gives depend on the machine, and the point is to
    compare across machines. The file knows what it was made from: the model's fingerprint
    (graph and weights), the inputs' digest, the seed that drew them (None when none did),
    onnxruntime's version, the providers and the nodes each took (``got``, the session's that
    measured them). Written all or nothing; returns the answer's ``golden`` record.

    ``tensors`` and ``inputs`` may be lists, one per iteration of a run over several: the
    first iteration is stored as a golden file of one iteration is (an older eprun reads that
    one), each later one under ``<member>@<k>``, listed in the record's
    ``more_iterations``."""
    import json

    import numpy as np

    every = list(zip(tensors, inputs)) if isinstance(tensors, list) else [(tensors, inputs)]
    tensors, inputs = every[0]
    arrays: dict = {}
    more = []
    for k, (iteration_tensors, iteration_inputs) in enumerate(every):
        shared = [name for name, value in iteration_tensors.items()
                  if name in iteration_inputs
                  and np.array_equal(np.asarray(value), np.asarray(iteration_inputs[name]))]
        stored = golden_members(list(iteration_inputs), list(iteration_tensors), shared)
        if k:
            stored = {key: [f"{member}@{k}" for member in names]
                      for key, names in stored.items()}
            more.append({**stored, "inputs_sha256": arrays_digest(iteration_inputs)})
        else:
            members = stored
        arrays.update(zip(stored["inputs"], map(np.asarray, iteration_inputs.values())))
        arrays.update(zip(stored["tensors"], map(np.asarray, iteration_tensors.values())))
    meta = {"eprun": __version__, "kind": kind, "model": os.path.basename(model),
            "tensors": list(tensors), "inputs": list(inputs), "members": members,
            "providers": got.actual,
            "onnxruntime": import_ort().__version__, "machine": machine(), "seed": seed,
            "fingerprint": model_fingerprint(model), "inputs_sha256": arrays_digest(inputs),
            "nodes_per_provider": got.nodes, **({"more_iterations": more} if more else {})}
    arrays[_GOLDEN_META] = np.array(json.dumps(meta))
    write_atomically(lambda stream: np.savez(stream, **arrays), path,
                     like=(model, *([inputs_file] if inputs_file else [])))
    return {"saved": path}


def golden_members(inputs: list[str], tensors: list[str], shared: list[str] = ()) -> dict:
    """The member of a golden .npz each input and tensor is stored as: its own name, so that
    ``numpy.load(file)["y"]`` is output y, unless another member has it already (a graph
    input that is also an output), it is eprun's record's, or it is empty: then
    ``input_<i>`` / ``tensor_<i>``. A tensor in ``shared`` holds its input's very values (the
    first boundary of layers is the graph's input): it is that input's member, stored once."""
    used = {_GOLDEN_META}
    members: dict[str, list[str]] = {"inputs": [], "tensors": []}
    for kind, names in (("input", inputs), ("tensor", tensors)):
        for i, name in enumerate(names):
            if kind == "tensor" and name in shared:
                members["tensors"].append(members["inputs"][inputs.index(name)])
                continue
            member = name if name and name not in used else f"{kind}_{i}"
            while member in used:
                member += "_"
            used.add(member)
            members[f"{kind}s"].append(member)
    return members


def model_fingerprint(path: str) -> str:
    """A digest of everything a model's numbers come from: the model file and each external
    data file it names (graph and weights), in that order."""
    return files_digest([path, *external_data_files(load_model(path), path)])


def files_digest(files: list[str]) -> str:
    """A SHA-256 of ``files``' sizes and bytes, in order, read a slice at a time."""
    import hashlib

    digest = hashlib.sha256()
    for file in files:
        digest.update(b"%d\0" % os.path.getsize(file))
        with open(file, "rb") as stream:
            for chunk in iter(lambda: stream.read(_COPY_SLICE), b""):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def arrays_digest(arrays: dict) -> str:
    """A digest of named arrays: names, types, shapes and values."""
    import hashlib

    import numpy as np

    digest = hashlib.sha256()
    for name, given in arrays.items():
        value = np.ascontiguousarray(given)
        digest.update(f"{name}\0{value.dtype.str}\0{list(value.shape)}\0".encode())
        digest.update(value.tobytes())
    return f"sha256:{digest.hexdigest()}"


def machine() -> str:
    """What the numbers of a CPU session depend on: the architecture, the processor and the
    instruction sets its int8 and float kernels choose from (Linux names them)."""
    import platform

    described = [platform.machine() or "unknown"]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            fields = dict(tuple(part.strip() for part in line.split(":", 1))
                          for line in itertools.islice(info, 64) if ":" in line)
        model = " ".join(fields.get("model name", "").split())
        flags = set(fields.get("flags", "").split())
        wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")
        described += [part for part in (model, " ".join(f for f in wanted if f in flags))
                      if part]
    return ", ".join(described)


def load_golden(path: str, kind: str, tensor_names: list[str], model: str, seed: int | None,
                *, graph, given_inputs: dict | None = None, iteration: int = 0
                ) -> tuple[dict, dict, dict]:
    """``(record, inputs, tensors)`` of a golden file, refused (exit 4) when it holds another
    kind of tensors or other names than ``tensor_names`` (what ``model`` gives here), when
    ``model``'s graph or weights are not those it was saved from (its fingerprint), or when
    the inputs asked for contradict the stored ones: a ``seed`` given (None: none was) that is
    not the one they were drawn with, or ``given_inputs`` (an ``--inputs`` file) that differ.
    The stored inputs are the ones measured on, and fed; they must be ``graph``'s inputs
    (``model`` parsed). ``iteration``: which of a file of several (the record says how many
    as ``iterations``)."""

    require_file(path, "golden")
    meta, inputs, tensors = _read_golden(path, iteration)
    if iteration:  # a later iteration's inputs have their own digest
        meta = {**meta, "inputs_sha256": meta["more_iterations"][iteration - 1].get(
            "inputs_sha256")}
        given_inputs = None
    if meta.get("kind") != kind:
        raise EprunError(f"{path!r} holds {meta.get('kind')}, not {kind}; load it with the "
                         "command that saved it")
    if meta["tensors"] != list(tensor_names):
        differ = next((f"{stored!r} where {model!r} has {here!r}" for stored, here in
                       zip(meta["tensors"], tensor_names) if stored != here),
                      f"{len(meta['tensors'])} tensors where {model!r} has "
                      f"{len(tensor_names)}")
        raise EprunError(f"{path!r} was saved from another graph than {model!r} "
                         f"({differ}); refusing to compare")
    require_golden_inputs(path, inputs, graph, model)
    _require_same_source(path, meta, model, inputs, seed=seed, given_inputs=given_inputs)
    if os.path.basename(model) != meta.get("model"):
        note(f"{path!r} was saved from {meta.get('model')!r}, and is compared as "
             f"{os.path.basename(model)!r}'s: the tensor names and the fingerprint match")
    record = {"loaded": path, **{key: meta.get(key) for key in (
        "model", "fingerprint", "providers", "nodes_per_provider", "onnxruntime", "machine",
        "seed")}}
    if meta.get("more_iterations"):
        record["iterations"] = 1 + len(meta["more_iterations"])
    return record, inputs, tensors


# How deep a golden file's record may nest: eprun writes 3 levels; a record nested hundreds
# deep (well within json's limit) would exhaust the recursion of whatever walks it next.
_GOLDEN_RECORD_DEPTH = 8


def _nesting(value: Any) -> int:
    """How deep lists and dicts nest in a decoded JSON value (a scalar is 0), counted without
    recursion."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth + 1)
            level.extend((child, depth + 1) for child in
                         (item.values() if isinstance(item, dict) else item))
    return deepest


def _read_golden(path: str, iteration: int = 0) -> tuple[dict, dict, dict]:
    """``(meta, inputs, tensors)`` as a golden file holds them: its decoded JSON record, and
    the arrays of ``iteration`` by the names that record lists; a file that is not one eprun
    wrote is refused in one line."""
    import json

    try:
        record = read_npz(path, [_GOLDEN_META], "golden", per="", extra="ignored",
                          max_bytes=_GOLDEN_RECORD_BYTES)[_GOLDEN_META]
        meta = json.loads(str(record[()]))
        if (depth := _nesting(meta)) > _GOLDEN_RECORD_DEPTH:
            raise ValueError(f"its record is nested {depth} deep, where eprun's are "
                             f"{_GOLDEN_RECORD_DEPTH} at most")
        if not isinstance(meta, dict) or not all(
                isinstance(meta.get(key), list) and all(isinstance(name, str)
                                                        for name in meta[key])
                for key in ("inputs", "tensors")):
            raise ValueError("its record does not list the inputs and tensors it holds")
        every = [_first_members(meta), *_more_iterations(meta)]
        arrays = read_npz(path, [_GOLDEN_META, *(member for stored in every
                                                 for key in ("inputs", "tensors")
                                                 for member in stored[key])],
                          "golden", per="per name its record lists", extra="refused",
                          max_bytes=_GOLDEN_RECORD_BYTES)
        members = every[iteration]
        inputs = {name: arrays[member] for name, member in zip(meta["inputs"],
                                                               members["inputs"])}
        tensors = {name: arrays[member] for name, member in zip(meta["tensors"],
                                                                members["tensors"])}
    except Exception as exc:
        why = str(exc) if isinstance(exc, EprunError) else f"{type(exc).__name__}: {one_line(exc)}"
        raise EprunError(f"{path!r} is not a golden file eprun wrote ({why}); write one with "
                         "--save-outputs or --save-boundaries") from exc
    return meta, inputs, tensors


def _first_members(meta: dict) -> dict:
    """The members of a golden record's (first) iteration, checked."""
    members = meta.get("members") or {  # eprun 0.10 and before: input_<i>, tensor_<i>
        "inputs": [f"input_{i}" for i in range(len(meta["inputs"]))],
        "tensors": [f"tensor_{i}" for i in range(len(meta["tensors"]))]}
    if not isinstance(members, dict) or any(
            not isinstance(members.get(key), list)
            or len(members[key]) != len(meta[key])
            or not all(isinstance(member, str) for member in members[key])
            for key in ("inputs", "tensors")):
        raise ValueError("its record's members do not match its inputs and tensors")
    return members


def _more_iterations(meta: dict) -> list[dict]:
    """The members of a golden record's later iterations (``save_golden``), checked."""
    more = meta.get("more_iterations", [])
    if not isinstance(more, list) or not all(
            isinstance(stored, dict) and all(
                isinstance(stored.get(key), list) and len(stored[key]) == len(meta[key])
                and all(isinstance(member, str) for member in stored[key])
                for key in ("inputs", "tensors")) for stored in more):
        raise ValueError("its record's later iterations do not match its inputs and tensors")
    return more


def _require_same_source(path: str, meta: dict, model: str, inputs: dict, *,
                         seed: int | None, given_inputs: dict | None) -> None:
    """Refuse a golden file whose model or inputs are not the ones asked for here: a model
    with the same names but other weights, a seed given that did not draw the stored inputs,
    or an inputs file that holds other values than them."""
    import numpy as np

    stored = meta.get("fingerprint")
    if stored is None:
        note(f"{path!r} was saved by eprun {meta.get('eprun')}, before golden files knew their "
             "model: eprun cannot check that it was saved from this one")
    elif stored != (here := model_fingerprint(model)):
        raise EprunError(f"{path!r} was saved from a model with the tensor names of "
                         f"{model!r} but other graph or weights (fingerprint {stored[:19]}..., "
                         f"{model!r} has {here[:19]}...): stale golden outputs pass or fail "
                         "for the wrong reason; save the golden file again from this model")
    if seed is not None and "seed" in meta and meta["seed"] != seed:
        drawn = (f"drawn with seed {meta['seed']}" if meta["seed"] is not None
                 else "taken from an inputs file")
        raise EprunError(f"seed {seed} contradicts {path!r}: its inputs were {drawn}; leave "
                         "the seed out (the stored inputs are fed) or give that one")
    for name, value in (given_inputs or {}).items():
        kept = inputs.get(name)
        if kept is None or kept.shape != value.shape or not np.array_equal(kept, value):
            raise EprunError(f"the --inputs file contradicts {path!r}: its {name!r} is not the "
                             "stored input; leave --inputs out (the stored inputs are fed)")


def require_golden_inputs(path: str, stored: dict, graph, model: str) -> None:
    """The stored inputs must be the model's inputs, by name: others would be drawn afresh
    and compared with tensors computed from different values."""
    names = [value.name for value in graph_inputs(graph)]
    if sorted(stored) != sorted(names):
        raise EprunError(f"{path!r} holds inputs {', '.join(stored) or 'none'}, but {model!r} "
                         f"takes {', '.join(names) or 'none'}; refusing to compare")


# -- Polygraphy's JSON files -----------------------------------------------------------------------

# The key Polygraphy marks each object of its JSON with (its class name).
_POLYGRAPHY_CLASS = "polygraphy_class"


def _read_json_file(path: str, what: str) -> Any:
    """The JSON value in the file at ``path``; one that is not JSON is an error (exit 4) ending with
    ``what`` (what the option takes). An OSError is not caught."""
    import json

    try:
        with open(path, "rb") as stream:
            return json.loads(stream.read())
    except (ValueError, RecursionError) as exc:
        raise EprunError(f"{path!r} is not a JSON file ({type(exc).__name__}: "
                         f"{one_line(exc)}); {what}") from exc


def _polygraphy_array(value: Any, file: str, name: str, dims: tuple | None = None):
    """An array as Polygraphy's JSON holds one: ``{"array": <np.save bytes in base64>}``
    (latin-1 text in releases before 0.33), inside a ``LazyArray``'s ``{"values": ...}``
    where the outputs of a run are. Its .npy header is read first: an array of Python objects,
    one whose shape ``dims`` (an input's) cannot take, or one whose data is not exactly what
    its shape and type need is refused before any memory is set aside for it, so a small file
    never asks for a large one."""
    import base64
    import binascii
    import io

    import numpy as np

    if isinstance(value, dict) and "array" not in value and "values" in value:
        value = value["values"]
    if not isinstance(value, dict) or not isinstance(value.get("array"), str):
        raise EprunError(f"{file!r}: {name!r} is not an array as Polygraphy writes one "
                         "({\"array\": ...})")
    text = value["array"]
    try:
        try:
            data = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            data = text.encode("latin-1")
        stream = io.BytesIO(data)
        shape, fortran, dtype = npy_header(stream)
    except (ValueError, OSError, UnicodeEncodeError, EOFError) as exc:
        raise EprunError(f"{file!r}: {name!r} holds no .npy array as Polygraphy writes one "
                         f"({type(exc).__name__}: {one_line(exc)})") from exc
    if dtype.hasobject:
        raise EprunError(f"{file!r}: {name!r} holds Python objects, which eprun never reads")
    declared = declared_misfit(dims, shape)
    if declared is not None:
        raise EprunError(f"{file!r}: {name!r} has shape {list(shape)}, but the model takes "
                         f"{name!r} as {declared}; fix the array in the --inputs file")
    count = math.prod(shape)
    if len(data) - stream.tell() != count * dtype.itemsize:
        raise EprunError(f"{file!r}: {name!r} declares shape {list(shape)} of {dtype} "
                         f"({count * dtype.itemsize} bytes) but holds "
                         f"{len(data) - stream.tell()} bytes")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell())
    return array.reshape(shape[::-1]).T.copy() if fortran else array.reshape(shape).copy()


def _iteration_of(items: list, iteration: int, file: str, what: str) -> Any:
    """Item ``iteration`` of ``items`` (an iteration of a Polygraphy file); a usage error that says
    the range where the file holds fewer."""
    if iteration >= len(items):
        raise EprunError(f"--iteration {iteration}: {file!r} holds {len(items)} "
                         f"{what}{'s' if len(items) != 1 else ''} (0 to {len(items) - 1})",
                         EXIT_USAGE)
    return items[iteration]


def polygraphy_feed_dicts(file: str) -> list:
    """The feed dicts of a ``polygraphy run --save-inputs`` file, one per iteration (a file
    holding one feed dict alone, as Polygraphy writes each iteration's apart, is one)."""
    feeds = _read_json_file(file, "--inputs takes an .npz file or Polygraphy's JSON")
    if isinstance(feeds, dict) and feeds and all(isinstance(value, dict)
                                                 for value in feeds.values()):
        feeds = [feeds]  # one iteration's file
    if not isinstance(feeds, list) or not all(isinstance(feed, dict) for feed in feeds):
        raise EprunError(f"{file!r} is not a Polygraphy inputs file (a list of feed dicts, "
                         "what polygraphy run --save-inputs writes)")
    if not feeds:
        raise EprunError(f"{file!r} holds no feed dict")
    return feeds


def read_polygraphy_inputs(file: str, names: list[str], iteration: int | None = 0,
                           dims: dict | None = None) -> dict:
    """The arrays ``names`` of one feed dict of a ``polygraphy run --save-inputs`` file (a
    JSON list of feed dicts, one per iteration; or one feed dict alone, as Polygraphy writes
    each iteration's file when it saves them apart), each checked against its input's
    ``dims``. Every input must be there, as in an ``.npz``; members no input is called are
    said. ``iteration`` None: the first, said where the file holds more (a command that
    measures one iteration names the one it measures)."""
    feeds = polygraphy_feed_dicts(file)
    if iteration is None:
        iteration = 0
        if len(feeds) > 1:
            note_once(f"{file!r} holds {len(feeds)} iterations (feed dicts); this measures "
                      "iteration 0 (--iteration N picks another; check runs every one)")
    feed = _iteration_of(feeds, iteration, file, "feed dict")
    missing = [name for name in names if name not in feed]
    if missing:
        raise EprunError(f"{file!r} must hold one array per input ({', '.join(names)}): its "
                         f"feed dict {iteration} is missing {', '.join(missing)}")
    unread = [name for name in feed if name not in names]
    if unread:
        note_once(f"{file!r}: {', '.join(map(repr, unread))} "
                  f"feed{'s' if len(unread) == 1 else ''} no input of the model, left unread")
    return {name: _polygraphy_array(feed[name], file, name, (dims or {}).get(name))
            for name in names}


def polygraphy_iterations(file: str) -> int:
    """How many iterations the first runner of a ``polygraphy run --save-outputs`` file holds."""
    return len(_polygraphy_runs(file)[0][1])


def _polygraphy_runs(file: str) -> list:
    """The ``[runner, [iteration, ...]]`` pairs of a RunResults file, checked for that shape."""
    results = _read_json_file(file, "--load-outputs takes a golden .npz or Polygraphy's JSON")
    runs = results.get("lst") if isinstance(results, dict) else None
    if not isinstance(runs, list) or not runs or not all(
            isinstance(run, list) and len(run) == 2 and isinstance(run[1], list) for run in runs):
        raise EprunError(f"{file!r} is not a Polygraphy RunResults file (what polygraphy run "
                         "--save-outputs writes)")
    return runs


def read_polygraphy_outputs(file: str, names: list[str], iteration: int = 0
                            ) -> tuple[str, dict]:
    """``(runner name, {output: array})``: the outputs ``names`` of one iteration of the first
    runner in a ``polygraphy run --save-outputs`` file (its RunResults)."""
    runs = _polygraphy_runs(file)
    runner, iterations = runs[0]
    if not iterations:
        raise EprunError(f"{file!r}: runner {runner!r} holds no iteration")
    if len(runs) > 1:
        note_once(f"{file!r} holds the results of {len(runs)} runners; compared with the "
                  f"first, {runner!r}")
    result = _iteration_of(iterations, iteration, file, "iteration")
    outputs = result.get("outputs") if isinstance(result, dict) else None
    if not isinstance(outputs, dict):
        raise EprunError(f"{file!r}: iteration {iteration} of {runner!r} holds no outputs")
    missing = [name for name in names if name not in outputs]
    if missing:
        raise EprunError(f"{file!r} has no output {', '.join(map(repr, missing))} (it holds "
                         f"{', '.join(outputs) or 'none'}); refusing to compare")
    return str(runner), {name: _polygraphy_array(outputs[name], file, name) for name in names}


def _polygraphy_encoded(array) -> dict:
    """``array`` as Polygraphy's JSON holds an ndarray: ``np.save`` bytes (no pickle), base64."""
    import base64
    import io

    import numpy as np

    stream = io.BytesIO()
    np.save(stream, np.asarray(array), allow_pickle=False)
    return {"array": base64.b64encode(stream.getvalue()).decode("ascii"),
            _POLYGRAPHY_CLASS: "ndarray"}


def polygraphy_run_results(runner: str, outputs: dict | list[dict]) -> bytes:
    """``outputs`` (one iteration's, or a list of them) as the RunResults JSON ``polygraphy run
    --load-outputs`` reads: one runner, an iteration each."""
    import json

    iterations = [{"outputs": {name: {"values": _polygraphy_encoded(value),
                                      _POLYGRAPHY_CLASS: "LazyArray"}
                               for name, value in one.items()},
                   "runtime": 0.0, "runner_name": runner, _POLYGRAPHY_CLASS: "IterationResult"}
                  for one in (outputs if isinstance(outputs, list) else [outputs])]
    return json.dumps({"lst": [[runner, iterations]], _POLYGRAPHY_CLASS: "RunResults"},
                      indent=4).encode()


def polygraphy_feeds(inputs: dict | list[dict]) -> bytes:
    """``inputs`` (one feed dict, or a list of them) as the JSON ``polygraphy run
    --load-inputs`` reads."""
    import json

    return json.dumps([{name: _polygraphy_encoded(value) for name, value in one.items()}
                       for one in (inputs if isinstance(inputs, list) else [inputs])],
                      indent=4).encode()


def polygraphy_inputs_path(outputs_path: str) -> str:
    """Where ``check --save-outputs FILE.json`` puts the inputs: FILE's stem + .inputs.json."""
    stem = outputs_path[:-len(".json")] if outputs_path.lower().endswith(".json") \
        else outputs_path
    return stem + ".inputs.json"


def golden_paths(save: str | None, load: str | None, inputs: list[str], option: str,
                 shaped: InputOptions | None = None) -> None:
    """Check a save/load pair before anything is measured."""
    if save and load:
        raise EprunError(f"--save-{option} and --load-{option} exclude each other: save on "
                         "the machine that gives the reference, load on the other", EXIT_USAGE)
    if load and shaped is not None and shaped.rows is not None:
        raise EprunError(f"--load-{option} feeds the inputs stored in {load!r}; drop --rows",
                         EXIT_USAGE)
    if save is not None:  # ("" too: an empty path is refused, not taken for no path)
        # what must not be written over: the models and their weights, and an --inputs file
        weights = [weight for path in inputs for weight in external_files(path)]
        inputs = [*inputs, *weights,
                  *([shaped.file] if shaped is not None and shaped.file else [])]
        require_output_path(save, inputs)
        if option == "outputs" and save.lower().endswith(".json"):
            require_output_path(polygraphy_inputs_path(save), inputs)


# -- boundaries ------------------------------------------------------------------------------------

# onnx element types that hold real numbers: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
FLOAT_TYPES = frozenset({1, 10, 11, 16})
# Ops with weights whose input is worth a boundary when MatMul/Gemm give none (a CNN).
_LINEAR_OPS = ("Conv", "ConvTranspose", "QLinearConv", "ConvInteger", "Einsum")


def with_quantized_forms(boundary_ops: tuple[str, ...]) -> tuple[str, ...]:
    """``boundary_ops`` followed by their quantized forms (``QUANTIZED_FORMS``), each once."""
    extra = [form for op in boundary_ops for form in QUANTIZED_FORMS.get(op, ())]
    return tuple(boundary_ops) + tuple(op for op in extra if op not in boundary_ops)


def final_output(graph) -> str | None:
    """The graph's first float output: the one whose error quantization is about (an int64
    label in front of the probabilities is not); the first output when none is float."""
    for value in graph.output:
        if value.type.tensor_type.elem_type in FLOAT_TYPES:
            return value.name
    return graph.output[0].name if graph.output else None


def find_boundaries(graph, boundary_ops: tuple[str, ...] = BOUNDARY_OPS,
                    final: str | None = None) -> list[str]:
    """The first input of every MatMul/Gemm (or quantized form of one) in file order, then the
    graph's first float output (or ``final``, a graph output chosen with ``--output``, last
    whatever else reads it); each name once.

    A MatMul's first input is the activation entering a layer; in a QDQ model it is the float
    output of a DequantizeLinear, so the same rule finds comparable tensors in both models.
    """
    ops = set(with_quantized_forms(boundary_ops))
    candidates = [node.input[0] for node in graph.node
                  if node.op_type in ops and node.input and node.input[0]]
    if final is not None:
        candidates = [name for name in candidates if name != final]
    final = final or final_output(graph)
    return list(dict.fromkeys(candidates + ([final] if final else [])))


def boundary_owners(graph, boundaries: list[str], boundary_ops: tuple[str, ...]) -> dict:
    """Boundary -> name of the first boundary-op node that reads it (its layer's node)."""
    ops = set(with_quantized_forms(boundary_ops))
    wanted = set(boundaries)  # a set: a list made this quadratic on long chains
    owners: dict[str, str] = {}
    for node in graph.node:
        if node.op_type in ops and node.input and node.input[0] in wanted:
            owners.setdefault(node.input[0], node.name)
    return owners


BOUNDARIES_ARG = arg(
    "--boundaries", type=parse_list, metavar="NAME,NAME",
    help="measure exactly these tensors of the fp32 model (in graph order), each paired with "
         "the int8 tensor named after it (its dequantized form first); instead of "
         "--boundary-ops and --pair, and the output is not added")


def _tensor_order(graph) -> dict[str, int]:
    """Each tensor a graph computes or takes (inputs, then node outputs in file order) ->
    its position."""
    weights = {tensor.name for tensor in graph.initializer}  # older IRs list them as inputs
    names = [value.name for value in graph.input if value.name not in weights] + [
        name for node in graph.node for name in node.output if name]
    return {name: position for position, name in enumerate(dict.fromkeys(names))}


def _unknown_tensor(name: str, path: str, graph, known, what: str = "of that name"
                    ) -> EprunError:
    """Wrong usage: ``--boundaries`` names a tensor the graph at ``path`` does not compute;
    said with the nearest names it does (``known``)."""
    import difflib

    if any(tensor.name == name for tensor in graph.initializer):
        return EprunError(f"--boundaries {name!r}: in {path!r} that is a weight (an "
                          "initializer), not a tensor the model computes; the weights "
                          "command compares weights", EXIT_USAGE)
    near = difflib.get_close_matches(name, list(known), 3, 0.5)
    return EprunError(f"--boundaries {name!r}: {path!r} has no tensor {what}"
                      + (f"; nearest: {', '.join(near)}" if near else ""), EXIT_USAGE)


def named_boundaries(graph, path: str, names: list[str], types: dict) -> list[str]:
    """``--boundaries``: the fp32 tensors asked for, each once, in graph order; a name the
    graph neither computes nor takes, or one that holds no real numbers, is wrong usage."""
    order = _tensor_order(graph)
    for name in names:
        if name not in order:
            raise _unknown_tensor(name, path, graph, order)
        elem = _element_type(types, name)
        if elem and elem not in FLOAT_TYPES:
            raise EprunError(f"--boundaries {name!r}: {path!r} holds {_type_name(elem)} "
                             "values there; eprun compares float tensors", EXIT_USAGE)
    return sorted(dict.fromkeys(names), key=order.__getitem__)


def twin_boundaries(graph, path: str, names: list[str]) -> list[str]:
    """The int8 model's counterpart of each ``--boundaries`` name, as eprun pairs a boundary:
    the tensor named after it (``float_tensor_name``), the output of a DequantizeLinear
    first (what the next layer reads), else the same name, else the first named after it
    (a QOperator model's quantized tensor, read back through its scale)."""
    order = _tensor_order(graph)
    dequantized = {node.output[0] for node in graph.node
                   if node.op_type == "DequantizeLinear" and node.output}
    named_after: dict[str, list[str]] = {}
    for tensor in order:
        named_after.setdefault(float_tensor_name(tensor), []).append(tensor)
    found = []
    for name in names:
        candidates = named_after.get(name, []) + ([name] if name in order else [])
        if not candidates:
            # the nearest names a user can give: fp32 tensors this model has a twin of
            offered = [key for key in named_after
                       if not re.search(r"_(QuantizeLinear|DequantizeLinear|quantized)", key)]
            raise _unknown_tensor(name, path, graph, offered, "named after it (the int8 "
                                  "model's counterpart of that fp32 tensor)")
        found.append(next((tensor for tensor in candidates if tensor in dequantized),
                          name if name in order else candidates[0]))
    return found


# Suffixes onnxruntime's quantizer appends to the float tensor or node it quantizes.
_TENSOR_SUFFIXES = (r"(_DequantizeLinear_Output|_QuantizeLinear_Output|_quantized|"
                    r"_output_quantized|_dequantized)(_\d+)?$")
_NODE_SUFFIXES = r"(_quant|_QuantizeLinear|_DequantizeLinear)$"


def float_tensor_name(name: str) -> str:
    """``name`` without a suffix onnxruntime's quantizer appends (``_quantized``,
    ``_DequantizeLinear_Output``, ...): the float tensor it was made from."""
    return re.sub(_TENSOR_SUFFIXES, "", name)


def pair_by_name(fp32: list[str], int8: list[str], fp32_owners: dict, int8_owners: dict
                 ) -> dict[int, int]:
    """fp32 boundary index -> int8 boundary index, where the names say which is which.

    A quantized tensor is named after its float original, and a layer's node keeps its name
    (``_quant`` appended in the QOperator form); the final outputs pair with each other. Of
    several int8 boundaries naming one fp32 boundary (one tensor dequantized per consumer),
    the first is taken.
    """
    fp32_index = {name: index for index, name in enumerate(fp32)}
    owner_index = {owner: fp32_index[name] for name, owner in fp32_owners.items() if owner}
    pairs: dict[int, int] = {}
    if fp32 and int8:
        pairs[len(fp32) - 1] = len(int8) - 1
    for j, name in enumerate(int8[:-1]):
        i = fp32_index.get(name, fp32_index.get(float_tensor_name(name)))
        if i is None and int8_owners.get(name):
            i = owner_index.get(re.sub(_NODE_SUFFIXES, "", int8_owners[name]))
        if i is not None and i != len(fp32) - 1 and i not in pairs:
            pairs[i] = j
    return pairs


# Where a quantized op reads each quantized operand's scale and zero point: op type ->
# (operand, scale, zero point) input positions. QLinearConcat lists (x, scale, zero point)
# triples after its output's scale and zero point.
_QUANTIZED_OPERANDS = {
    "QLinearMatMul": ((0, 1, 2), (3, 4, 5)), "QLinearConv": ((0, 1, 2), (3, 4, 5)),
    "QGemm": ((0, 1, 2), (3, 4, 5)), "QLinearAdd": ((0, 1, 2), (3, 4, 5)),
    "QLinearMul": ((0, 1, 2), (3, 4, 5)), "QLinearSigmoid": ((0, 1, 2),),
    "QLinearLeakyRelu": ((0, 1, 2),), "QLinearSoftmax": ((0, 1, 2),),
    "QLinearGlobalAveragePool": ((0, 1, 2),), "QLinearAveragePool": ((0, 1, 2),),
    "DequantizeLinear": ((0, 1, 2),),
}


def _quantized_readers(index: GraphIndex) -> dict[str, tuple[str, str]]:
    """``{quantized operand: (scale, zero point)}`` as the first quantized op that reads it
    (QLinearMatMul, QLinearAdd, ... ``_QUANTIZED_OPERANDS``; QLinearConcat's own layout)
    names them; zero point "" where the op omits it."""
    readers: dict[str, tuple[str, str]] = {}
    for node in index.nodes:
        layout = _QUANTIZED_OPERANDS.get(node.op_type, ())
        if node.op_type == "QLinearConcat":
            layout = tuple((k, k + 1, k + 2) for k in range(2, len(node.input) - 2, 3))
        for operand, scale, zero in layout:
            if operand < len(node.input) and scale < len(node.input):
                readers.setdefault(node.input[operand], (
                    node.input[scale], node.input[zero] if zero < len(node.input) else ""))
    return readers


# Where a quantized op's result scale and zero point are among its inputs (QGemm's are
# optional: without them it writes float), by op type.
_QUANTIZED_RESULT = {"QLinearMatMul": (6, 7), "QLinearConv": (6, 7), "QLinearAdd": (6, 7),
                     "QLinearMul": (6, 7), "QGemm": (7, 8), "QLinearSigmoid": (3, 4),
                     "QLinearLeakyRelu": (3, 4), "QLinearSoftmax": (3, 4),
                     "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4),
                     "QLinearConcat": (0, 1)}


def _quantization_source(producer, reader: tuple[str, str] | None) -> tuple[str, str] | None:
    """A quantized tensor's ``(scale, zero point)``: its QuantizeLinear's or
    DynamicQuantizeLinear's, else a reading op's (``reader``), else the result scale of the
    quantized op that wrote it (a fused projection only a Split reads); None where none
    says."""
    if producer is not None and producer.op_type == "QuantizeLinear":
        return (producer.input[1], producer.input[2] if len(producer.input) > 2 else "")
    if producer is not None and producer.op_type == "DynamicQuantizeLinear":
        return (producer.output[1], producer.output[2])
    if reader is None and producer is not None and producer.op_type in _QUANTIZED_RESULT:
        scale, zero = _QUANTIZED_RESULT[producer.op_type]
        if scale < len(producer.input) and producer.input[scale]:
            return (producer.input[scale],
                    producer.input[zero] if zero < len(producer.input) else "")
    return reader


class Quantization:
    """How to read a model's quantized (8/16-bit) tensors back as float, and how to quantize
    float values into them.

    A tensor's scale and zero point are those of the QuantizeLinear or DynamicQuantizeLinear
    that made it, else those of a quantized op that reads it (QLinearMatMul, QLinearAdd, ...).
    Scales held in initializers are read once; scales computed at run time (dynamic
    quantization) must be fetched with the tensor (``runtime``).
    """

    def __init__(self, model, model_path: str, types: dict, tensors: list[str],
                 index: GraphIndex | None = None) -> None:
        """For each of ``tensors`` of an 8/16-bit integer type, find its scale and zero point
        (``params``) and read those held in initializers (``constants``); one with no source found
        stays out of ``params``, for callers to refuse."""
        self.path, self.types = model_path, types
        self.params: dict[str, tuple[str, str]] = {}
        self.constants: dict = {}
        quantized = [name for name in tensors if _is_integer(types, name)]
        if not quantized:
            return
        index = index or GraphIndex.of(model.graph)
        readers = _quantized_readers(index)
        initializers = index.initializers
        for name in quantized:
            source = _quantization_source(index.producer(name), readers.get(name))
            if source is None:
                continue
            for tensor in source:
                if tensor in initializers and tensor not in self.constants:
                    self.constants[tensor] = _initializer_array(initializers[tensor],
                                                                model_path)
            self.params[name] = source

    def runtime(self, name: str) -> list[str]:
        """The run-time scale and zero point of ``name`` (empty when they are constants)."""
        return [tensor for tensor in self.params.get(name, ())
                if tensor and tensor not in self.constants]

    def _scale_zero(self, name: str, fetched: dict):
        """``(scale, zero point)`` of ``name`` as float64 scalars, from the initializers or
        ``fetched`` (zero where the op omits it); per-channel ones are refused. One found in neither
        becomes NaN, not an error."""
        import numpy as np

        scale_name, zero_name = self.params[name]
        scale = np.asarray(self.constants.get(scale_name, fetched.get(scale_name)), np.float64)
        zero = (np.asarray(self.constants.get(zero_name, fetched.get(zero_name)), np.float64)
                if zero_name else np.zeros(()))
        if scale.size != 1 or zero.size != 1:
            raise EprunError(f"{self.path!r}: {name!r} is quantized per channel; eprun reads "
                             "back per-tensor quantized activations only")
        return scale.reshape(()), zero.reshape(())

    def read(self, name: str, fetched: dict):
        """The float value of ``name`` from the fetched tensors (dequantized if quantized)."""
        value = fetched[name]
        if name not in self.params:
            return value
        scale, zero = self._scale_zero(name, fetched)
        return (value.astype("float64") - zero) * scale

    def quantize(self, name: str, value):
        """``value`` (float) quantized as the model quantizes ``name``: round half to even,
        saturate, as QuantizeLinear does."""
        import numpy as np

        scale, zero = self._scale_zero(name, {})
        dtype = np.dtype(_QUANTIZED_DTYPES[self.types[name].tensor_type.elem_type])
        info = np.iinfo(dtype)
        return np.asarray(np.clip(np.rint(np.asarray(value, np.float64) / scale) + zero,
                                  info.min, info.max), dtype=dtype)


def expose_in_place(model, boundary_ops: tuple[str, ...] = BOUNDARY_OPS, extra: list[str] = (),
                    types: dict | None = None, unknown_as_float: bool = True) -> list[str]:
    """Add every boundary (then each name in ``extra``) that is not yet a graph output; return
    the boundaries.

    Each new output is declared with its inferred type, so an int8 tensor is never declared
    float and the session still opens. A type nothing can infer is declared float in a saved
    file (a graph output must have a type) and left to onnxruntime in memory
    (``unknown_as_float=False``), which infers it when the session opens. In memory a graph
    input is not made an output either: some EPs refuse a name that is both (OpenVINO:
    "Duplicate definition of name"), and its value is the feed itself (``fetch``).
    """
    messages = onnx_messages()
    boundaries = find_boundaries(model.graph, boundary_ops)
    existing = {value.name for value in model.graph.output}
    if not unknown_as_float:
        existing |= {value.name for value in graph_inputs(model)}
    missing = [name for name in dict.fromkeys([*boundaries, *extra]) if name not in existing]
    if missing:
        types = types if types is not None else tensor_types(model)
        for name in missing:
            value = messages.ValueInfoProto(name=name)
            if name in types:
                value.type.CopyFrom(types[name])
            elif unknown_as_float:
                value.type.tensor_type.elem_type = messages.TensorProto.FLOAT
            model.graph.output.append(value)
    return boundaries


def open_exposed(model, model_path: str, options: dict | None = None,
                 extra_arrays: dict | None = None, on: ProviderRequest | None = None):
    """A session with default options for an in-memory (exposed) copy of ``model_path``, on
    the CPU unless ``on`` says otherwise.

    The weights never pass through protobuf serialization. Those stored outside the graph
    (external data, and the payloads ``load_model`` left in the model file) are read by
    onnxruntime from their files: releases that know
    ``session.model_external_initializers_file_folder_path`` read them from the model's
    folder (the folder of the file a linked model resolves to, as onnxruntime refuses a
    location that resolves outside it), older ones get each tensor as a read-only memory map
    (see ``_FOLDER_OPTION_SINCE``).
    Large inline initializers left in ``model`` are moved out into arrays and handed over
    with ``add_external_initializers``, which puts them back before any graph optimization,
    so the graph onnxruntime optimizes is the one in the file. ``model`` is consumed.
    ``options`` are ``session_options``' keywords (``level``, ``threads``, ``config``);
    ``extra_arrays`` adds initializers by name, handed over as arrays (weights taken from
    another model).
    """
    ort = import_ort()
    extra_arrays = extra_arrays or {}
    _drop_unused_initializers(model)
    external = [tensor for tensor in external_tensors(model) if tensor.name not in extra_arrays]
    own = _in_file_references(model, model_path)
    if any(own):
        require_unchanged(model_path)
    data_path = _relink_own_references(model, model_path, own)
    names, arrays = detach_initializers(model)
    present = {tensor.name for tensor in model.graph.initializer}
    for name, array in extra_arrays.items():
        if name not in present:  # else a placeholder for it is there already
            model.graph.initializer.append(_placeholder(name, array))
        names.append(name)
        arrays.append(array)
    _inline_subgraph_weights(model, data_path)
    serialized = model.SerializeToString()
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in arrays]

    folder_path = os.path.dirname(os.path.abspath(data_path))
    if not _is_text(folder_path):  # a config entry is UTF-8 text: such a folder gets maps
        external_via_folder = False
    else:
        external_via_folder = bool(external) and ort_release() >= _FOLDER_OPTION_SINCE

    def session_with(extra_names: list[str], extra_values: list, folder_option: bool):
        """A session of the model, its external weights handed over as arrays (the mapped
        ones and ``extra_names``' ``extra_values``), or read through the external-data folder
        option where ``folder_option``."""
        keywords = dict(options or {})
        config = {**(keywords.pop("config", None) or {}),
                  **({"session.model_external_initializers_file_folder_path": folder_path}
                     if folder_option else {})}
        built = session_options(**keywords, config=config)
        if names or extra_names:
            built.add_external_initializers(names + extra_names, values + extra_values)
        session = open_session(serialized, built, what=repr(model_path), on=on,
                               ask_with=model_path)
        require_unchanged(model_path)  # the weights onnxruntime read are the ones checked
        require_data_unchanged(external, data_path)
        return session

    if external_via_folder:
        try:
            return session_with([], [], folder_option=True)
        except (ProviderRefused, ModelChanged):
            raise
        except EprunError:  # a location it refuses (a link out of the folder): map the data
            require_data_unchanged(external, data_path)  # (or a file cut short meanwhile)
    maps = [_map_external(tensor, data_path) for tensor in external]
    return session_with([tensor.name for tensor in external],
                        [ort.OrtValue.ortvalue_from_numpy(data) for data in maps],
                        folder_option=False)


# -- comparison ------------------------------------------------------------------------------------

def differences(reference, candidate):
    """The one comparison core: ``(reference, candidate, |candidate - reference|)`` in
    float64, the reference always first. Non-finite values propagate."""
    import numpy as np

    reference = np.asarray(reference, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    with np.errstate(all="ignore"):
        diff = np.subtract(candidate, reference)
        return reference, candidate, np.abs(diff, out=diff)  # in place: no second array


def largest_of(values) -> float:
    """``max`` of an array as a float, 0.0 for an empty one."""
    import numpy as np

    return float(np.max(values)) if np.size(values) else 0.0


def _largest_magnitude(values) -> float:
    """``largest_of(np.abs(values))`` for a float array, a slice at a time (a maximum does
    not depend on how it is split), so no second array of the tensor's size is made."""
    import numpy as np

    flat = values.reshape(-1)
    step = 1 << 20
    return largest_of([np.max(np.abs(flat[start:start + step]))  # np.max passes a NaN on
                       for start in range(0, flat.size, step)])


def compare_boundary(reference, candidate, rows: int = ROWS,
                     metrics: tuple[str, ...] = ()) -> dict:
    """``max_abs_error``, ``scale``, ``rel_error`` and ``cos_min`` of one boundary pair.

    ``reference`` is the fp32 tensor, ``candidate`` the int8 one. Sums run in float64; a row
    whose cosine has a zero denominator counts as 1.0; non-finite values propagate (and become
    JSON null). ``metrics`` adds any of ``METRICS``: ``sqnr_db`` and ``mse``.
    """
    import numpy as np

    a, b, diff = differences(reference, candidate)
    with np.errstate(all="ignore"):
        max_abs_error = largest_of(diff)
        scale = _largest_magnitude(a)
        rel_error = max_abs_error / scale if scale != 0 else 0.0
        a_rows, b_rows = a.reshape(rows, -1), b.reshape(rows, -1)
        dots = np.einsum("ij,ij->i", a_rows, b_rows)
        # np.linalg.norm(x, axis=1) is sqrt(add.reduce(conj(x) * x, axis=1)): the same sums,
        # without the copy conj makes of a real array
        norms = (np.sqrt(np.add.reduce(a_rows * a_rows, axis=1))
                 * np.sqrt(np.add.reduce(b_rows * b_rows, axis=1)))
        cosines = np.where(norms == 0, 1.0, dots / np.where(norms == 0, 1.0, norms))
        cos_min = float(np.min(np.clip(cosines, -1.0, 1.0)))
        measured = {"max_abs_error": max_abs_error, "scale": scale, "rel_error": rel_error,
                    "cos_min": cos_min}
        for name in metrics:
            measured[METRICS[name].field] = METRICS[name].compute(a, diff)
    counts = nonfinite_counts(a, b)
    if any(counts):
        measured["nonfinite"] = {"fp32": counts[0], "int8": counts[1]}
    return measured


def nonfinite_counts(*arrays) -> tuple[int, ...]:
    """How many NaN and infinite values each array holds (counted a slice at a time, so no
    array of the tensor's size is made)."""
    import numpy as np

    counts, step = [], 1 << 20
    for array in arrays:
        flat = array.reshape(-1)
        finite = sum(int(np.count_nonzero(np.isfinite(flat[start:start + step])))
                     for start in range(0, flat.size, step))
        counts.append(flat.size - finite)
    return tuple(counts)


@dataclasses.dataclass(frozen=True)
class Metric:
    """One error measure of a boundary pair, whole: the entry's ``field`` it fills, how it is
    computed (``compute(reference, diff)`` -> a float, or None for "no value"; both float64
    arrays, ``diff`` = ``|candidate - reference|``), which way is better, whether a plot of
    it may use a log axis (where its values span decades), and its table heading (``label``,
    else the field). ``layers --metrics`` computes it at every boundary (and in each
    ``--local`` segment); tables, the worst marker, Model Explorer node data and plots read
    it from here, as sensitivity reads its ``sqnr_db`` from ``METRICS["sqnr"]``."""

    field: str
    compute: Callable[[Any, Any], Any] | None
    higher_is_better: bool = False
    log_scale: bool = False
    label: str | None = None

    @property
    def heading(self) -> str:
        """The table column's heading."""
        return self.label or self.field


def _sqnr(reference, diff) -> float | None:
    """10·log10 of signal power over error power, the measure onnxruntime's qdq_loss_debug
    reports; null when there is no error."""
    import numpy as np

    noise = float(np.sum(diff ** 2))
    return float(10 * np.log10(float(np.sum(reference ** 2)) / noise)) if noise > 0 else None


def _mse(reference, diff) -> float:
    """Mean squared error."""
    import numpy as np

    return float(np.mean(diff ** 2)) if diff.size else 0.0


# --metrics NAME -> its Metric. One entry is the whole of a metric: ``--metrics`` offers it,
# layers computes it (its --local segments too), tables show it, plots and node data draw it.
METRICS: dict[str, Metric] = {
    "sqnr": Metric("sqnr_db", _sqnr, higher_is_better=True),
    "mse": Metric("mse", _mse, log_scale=True),
}

# The quantities eprun measures whatever --metrics says (computed together, row by row, in
# compare_boundary and the weights command), described the way a Metric is.
_OWN_QUANTITIES = {quantity.field: quantity for quantity in (
    Metric("max_abs_error", None, log_scale=True), Metric("scale", None, log_scale=True),
    Metric("rel_error", None, log_scale=True), Metric("cos_min", None, higher_is_better=True),
    Metric("weight_sqnr_db", None, higher_is_better=True))}


def quantity_of(field: str) -> Metric | None:
    """The Metric that fills ``field`` (an entry's key, a node-data quantity): one of METRICS,
    as it is now, or one eprun always measures; None for any other."""
    return next((metric for metric in METRICS.values() if metric.field == field),
                _OWN_QUANTITIES.get(field))


def metric_fields() -> list[str]:
    """The fields of METRICS, in its order (as it is now: the API may have added some)."""
    return [metric.field for metric in METRICS.values()]


def parse_metrics(text: str) -> tuple[str, ...]:
    """``--metrics``: comma-joined names of ``METRICS``; an unknown name is a usage error."""
    metrics = tuple(parse_list(text))
    unknown = [name for name in metrics if name not in METRICS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown metric {unknown[0]!r}; choose from "
                                         f"{', '.join(METRICS)}")
    return metrics


def bitwise_equal(reference, candidate) -> bool:
    """Same shape, dtype and bytes (a NaN equals the same NaN; -0.0 differs from 0.0)."""
    return (reference.shape == candidate.shape and reference.dtype == candidate.dtype
            and reference.tobytes() == candidate.tobytes())


def compare_outputs(reference, candidate, rtol: float, atol: float) -> dict:
    """Element-wise ``|candidate - reference| <= atol + rtol * |reference|`` (numpy's allclose
    with the reference as the desired value), the global cosine and the worst element."""
    import numpy as np

    b, a, diff = differences(reference, candidate)
    with np.errstate(all="ignore"):
        allowed = atol + rtol * np.abs(b)
        excess = np.where(np.isnan(diff), np.inf, diff - allowed)
        violations = int(np.count_nonzero(~np.isclose(a, b, rtol=rtol, atol=atol)))
        norms = float(np.linalg.norm(a.ravel()) * np.linalg.norm(b.ravel()))
        both_zero = not np.any(a) and not np.any(b)
        cosine = 1.0 if both_zero else (float(np.dot(a.ravel(), b.ravel()) / norms)
                                        if norms else 0.0)
        if math.isfinite(cosine):  # rounding gives 1.0000000000000002 for equal outputs
            cosine = min(1.0, max(-1.0, cosine))
        worst = None
        if a.size:
            position = np.unravel_index(int(np.argmax(excess)), a.shape)
            worst = {"index": [int(i) for i in position], "reference": float(b[position]),
                     "candidate": float(a[position]), "abs_diff": float(diff[position]),
                     "allowed": float(allowed[position]), "excess": float(excess[position])}
        # an element equal in both has no relative difference, even where it is 0 (0/0)
        relative = np.where(diff == 0, 0.0, diff / np.abs(b))
        max_rel = float(np.max(relative)) if a.size else 0.0
        spread = ({"mean_abs_diff": float(np.mean(diff)),
                   "median_abs_diff": float(np.median(diff)),
                   "p99_abs_diff": float(np.quantile(diff, 0.99))} if a.size else
                  dict.fromkeys(("mean_abs_diff", "median_abs_diff", "p99_abs_diff"), 0.0))
    answer = {"max_abs_diff": largest_of(diff), **spread, "max_rel_diff": max_rel,
              "cosine": cosine, "elements": int(a.size), "violations": violations,
              "worst": worst}
    counts = nonfinite_counts(b, a)
    if any(counts):
        answer["nonfinite"] = {"reference": counts[0], "candidate": counts[1]}
    return answer


# What Polygraphy adds to a zero reference value before dividing by it (its relative error).
_POLYGRAPHY_EPSILON = 2.220446049250313e-16


def error_statistic(reference, candidate, stat: str, quantile: float = 0.99) -> dict:
    """``{"abs", "rel"}``: the statistic ``stat`` (max, mean, median or quantile) of
    ``|c - r|`` and of ``|c - r| / |r|``, as Polygraphy's ``--check-error-stat`` computes them
    (a zero reference value divided as 2.22e-16); NaN where either holds one."""
    import numpy as np

    r, _, diff = differences(reference, candidate)
    if not diff.size:
        return {"abs": 0.0, "rel": 0.0}
    with np.errstate(all="ignore"):
        relative = diff / np.where(r == 0, _POLYGRAPHY_EPSILON, np.abs(r))
        of = {"max": np.max, "mean": np.mean, "median": np.median,
              "quantile": lambda values: np.quantile(values, quantile)}[stat]
        return {"abs": float(of(diff)), "rel": float(of(relative))}


def statistic_fails(values: dict, atol: float, rtol: float) -> bool:
    """Polygraphy's rule for a statistic: fail only when both the absolute one is over atol and
    the relative one over rtol (NaN is over anything)."""
    return (not values["abs"] <= atol) and (not values["rel"] <= rtol)


def top_k_agreement(reference, candidate, k: int, axis: int = -1) -> float | None:
    """The fraction of rows (every position but ``axis``) whose top-``k`` index sets agree, the
    set and not its order ("did the answer change?"); None where the output has fewer than
    ``k`` values along ``axis``, or no axis at all."""
    import numpy as np

    r, c = np.asarray(reference), np.asarray(candidate)
    if r.ndim == 0 or not -r.ndim <= axis < r.ndim or r.shape[axis] < k:
        return None
    r, c = np.moveaxis(r, axis, -1), np.moveaxis(c, axis, -1)
    r, c = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
    if not r.shape[0]:
        return None
    with np.errstate(invalid="ignore"):
        picked = [np.sort(np.argsort(-values.astype(np.float64), axis=1, kind="stable")[:, :k],
                          axis=1) for values in (r, c)]
    return float(np.mean(np.all(picked[0] == picked[1], axis=1)))


# -- paired boundaries -----------------------------------------------------------------------------

class PairedModel:
    """One side of a ``layers`` comparison: the parsed graph (weights left on disk), its
    boundaries and how to read a quantized one back as float."""

    def __init__(self, path: str, boundary_ops: tuple[str, ...],
                 on: ProviderRequest | None = None, output: str | None = None, *,
                 named: list[str] | None = None, twin: bool = False) -> None:
        """``named`` (``--boundaries``) are the boundaries instead of those ``boundary_ops``
        find: the fp32 tensors of those names, or on the ``twin`` (int8) side the tensors
        named after them; then only they are exposed."""
        self.path, self.boundary_ops, self.on = path, boundary_ops, on
        self.named = named is not None
        self.got = Got([])
        self.model = load_model(path, text_names=True)
        outputs = [value.name for value in self.model.graph.output]
        if output is not None and output not in outputs:
            raise EprunError(f"--output-name {output!r}: {path!r} has no output of that name (its "
                             f"outputs: {', '.join(outputs)})", EXIT_USAGE)
        self.types = tensor_types(self.model)
        graph = self.model.graph
        self.boundaries = (find_boundaries(graph, boundary_ops, output) if named is None else
                           twin_boundaries(graph, path, named) if twin else
                           named_boundaries(graph, path, named, self.types))
        self.owners = boundary_owners(self.model.graph, self.boundaries, boundary_ops)
        self._require_float_output(output)
        self.quantization = Quantization(self.model, path, self.types, self.boundaries,
                                         GraphIndex.of(self.model.graph, self.types))
        self._require_readable_boundaries()
        self.runtime = [tensor for name in self.boundaries
                        for tensor in self.quantization.runtime(name)]
        self.tensor_names = {name for node in self.model.graph.node for name in node.output}
        # Only the graph is kept: the weights are parsed again when a session needs them, so
        # the int8 model's weights are not in memory while the fp32 session runs.
        self.model = _skeleton(self.model)

    def _require_float_output(self, output: str | None) -> None:
        """The output measured (``--output``, else the first float one) holds floats."""
        graph = self.model.graph
        final = output or final_output(graph)
        declared = {value.name: value.type.tensor_type.elem_type for value in graph.output}
        if final is None or (declared.get(final)
                             or _element_type(self.types, final)) not in FLOAT_TYPES:
            outputs = ", ".join(value.name for value in graph.output)
            raise EprunError(f"{self.path!r} has no float output (outputs: {outputs}); eprun "
                             "measures quantization error on the first float output")

    def _require_readable_boundaries(self) -> None:
        """Every boundary holds floats, or integers whose scale and zero point eprun found."""
        path, types = self.path, self.types
        unread = [name for name in self.boundaries if _is_integer(types, name)
                  and name not in self.quantization.params]
        if unread:
            raise EprunError(f"{path!r}: boundary {unread[0]!r} is quantized, but eprun cannot "
                             "find its scale and zero point")
        for name in self.boundaries:
            elem = _element_type(types, name)
            if elem and elem not in FLOAT_TYPES and not _is_integer(types, name):
                raise EprunError(f"{path!r}: boundary {name!r} holds {_type_name(elem)} values; "
                                 "eprun compares float, float16 and 8/16-bit quantized tensors")

    def session(self, names: list[str], exposed: bool = True):
        """A session of the graph exposing its boundaries and ``names`` (or, not ``exposed``,
        of the graph as it is), parsed from the file for it (its weights go to onnxruntime as
        arrays, then are released with it); on the CPU, or where ``on`` asks, refused when it
        did not get that (``require_got``)."""
        model = load_model(self.path)
        if exposed and self.named:
            expose_in_place(model, (), extra=[*self.boundaries, *names], types=self.types,
                            unknown_as_float=False)
        elif exposed:
            expose_in_place(model, self.boundary_ops, extra=names, types=self.types,
                            unknown_as_float=False)
        session = open_exposed(model, self.path, on=self.on)
        self.got = Got.of(session)
        return session

    def boundary_bytes(self, name: str, rows: int) -> int | None:
        """Boundary ``name``'s estimated bytes at ``rows`` rows; None where that is unknown."""
        return _estimated_bytes(self.types.get(name), rows)


@dataclasses.dataclass(frozen=True)
class LayerOptions(ReferenceProviderFlags, PlotFlags):
    """The options of ``layers`` and ``growth`` (``growth`` has no ``metrics``), and how
    ``measure_layers`` measures; each field is the flag of its name.

    ``providers`` and ``reference_providers`` run each side elsewhere (``targets_from``); the
    answer then says which (``providers``) and, off the CPU or with ``metrics``, how far
    exposing the boundaries moved the candidate's final output there (``exposure``): an EP
    compiles the exposed graph differently, and the CPU no longer fuses a DequantizeLinear
    whose output is exposed. ``save_boundaries`` stores the fp32 side's boundary tensors and
    inputs; ``load_boundaries`` takes them from such a file (made on another machine) instead
    of running the fp32 model. ``clipping`` (for ``report``, no flag) adds each entry's
    ``clipped``: the fraction of the fp32 values outside the range the int8 model's
    QuantizeLinear there can represent. ``boundaries`` (``--boundaries``) are the fp32
    tensors to measure instead, each paired with the int8 tensor named after it
    (``twin_boundaries``). ``node_data`` and ``save_plots``: folders for Model Explorer node
    data and plots of the answer.
    """

    inputs: InputOptions | None = None
    boundary_ops: tuple[str, ...] = BOUNDARY_OPS
    metrics: tuple[str, ...] = ()
    local: bool = False
    max_memory: int | None = None
    pair: str = "auto"
    save_boundaries: str | None = None
    load_boundaries: str | None = None
    swapped_ok: bool = False
    clipping: bool = False
    output: str | None = None
    boundaries: list[str] | None = None
    node_data: str | None = None

    def refuse_mistakes(self, fp32_path: str, int8_path: str) -> None:
        """Before any model is read: the files are there, and no two options contradict."""
        require_file(fp32_path)
        require_file(int8_path)
        golden_paths(self.save_boundaries, self.load_boundaries, [fp32_path, int8_path],
                     "boundaries", self.inputs)
        if self.load_boundaries and self.local:
            raise EprunError("--local feeds each segment tensors of the fp32 run, which "
                             "--load-boundaries does not make; use one or the other",
                             EXIT_USAGE)
        if self.boundaries is not None and not self.boundaries:
            raise EprunError("--boundaries names no tensor: give the fp32 tensors to measure, "
                             "comma-joined", EXIT_USAGE)
        if self.boundaries and self.boundary_ops != BOUNDARY_OPS:
            raise EprunError("--boundaries names the tensors to measure, --boundary-ops the "
                             "ops that find them: give one or the other", EXIT_USAGE)

    def says_more(self, targets: Targets) -> bool:
        """Does any option (or ``targets``, where the sides run) take the answer beyond the
        contract's fields?"""
        return bool(self.metrics or self.local or targets.given
                    or self.output or self.save_boundaries or self.load_boundaries
                    or self.boundary_ops != BOUNDARY_OPS or self.boundaries)


def measure_layers(fp32_path: str, int8_path: str, seed: int,
                   options: LayerOptions = LayerOptions(), targets: Targets | None = None,
                   plain: dict | None = None):
    """The ``layers`` answer, and the int8 model's (exposed) final output for ``report``;
    ``targets``: where each side runs (``targets_from`` of the options; None: the CPU).
    ``plain``: ``{"fp32"|"int8": {output: value}}``, what a run of the plain models on the same
    inputs and providers already answered (``report``'s check): the exposure records take
    their values from there instead of running each plain model again.

    One model is in memory at a time: the fp32 session runs once for every boundary and is
    released before the int8 one opens. With ``max_memory`` the boundaries are fetched in
    batches whose estimated fp32 + int8 tensor bytes fit the budget (a boundary of unknown size
    goes alone), each batch from sessions opened for it. The numbers are the same either way.
    """
    options.refuse_mistakes(fp32_path, int8_path)
    measurement = LayerMeasurement(fp32_path, int8_path, seed, options, targets or Targets())
    measurement.plain = plain or {}
    measurement.compare()
    return measurement.answer(), measurement.final


class LayerMeasurement:
    """One ``measure_layers`` run: the two sides paired boundary by boundary (``__init__``),
    compared batch by batch (``compare``), then said (``answer``)."""

    def __init__(self, fp32_path: str, int8_path: str, seed: int,
                 options: LayerOptions, targets: Targets) -> None:
        """Read both sides, pair their boundaries (by position for ``--boundaries``, else
        ``plan_pairs``), take ``--load-boundaries``' file, draw the feeds and cut ``--local``'s
        segments; ``compare`` then measures."""
        self.seed, self.options = seed, options
        self.targets = targets
        named = options.boundaries
        self.fp32 = fp32 = PairedModel(fp32_path, options.boundary_ops, targets.reference,
                                       options.output, named=named)
        self.int8 = int8 = PairedModel(int8_path, options.boundary_ops, targets.candidate,
                                       options.output, named=fp32.boundaries if named else None,
                                       twin=True)
        require_in_order((fp32.model, int8.model), (fp32_path, int8_path), options.swapped_ok)
        self.pairs, self.pairing = ([(k, k) for k in range(len(fp32.boundaries))], "position") \
            if named else plan_pairs(fp32, int8, options.pair)
        self.golden, self.stored, inputs = None, {}, options.inputs
        if options.load_boundaries:
            self.golden, self.stored, inputs = _stored_boundaries(
                options.load_boundaries, fp32, self.pairs, seed, inputs)
        self.feed = make_feeds(specs_from_model(fp32.model), seed, inputs, fp32_path)
        self.int8_feed = feed_for(specs_from_model(int8.model), int8_path, self.feed)
        if not named:
            _suggest_boundary_ops(fp32, options.boundary_ops)
            _note_absent_ops((fp32.model, int8.model), options.boundary_ops)
        self.segments = (LocalSegments(int8, [int8.boundaries[j] for _, j in self.pairs],
                                       fp32_names=fp32.tensor_names,
                                       input_names=set(self.feed.arrays), rows=self.feed.rows,
                                       metrics=options.metrics)
                         if options.local else None)
        self.fp32_names = [fp32.boundaries[i] for i, _ in self.pairs]
        self.int8_names = [int8.boundaries[j] for _, j in self.pairs]
        self.entries: list[dict] = []
        self.final = None  # the int8 side's last boundary value, for report
        self.ends = {side: options.output or final_output(paired.model.graph)
                     for side, paired in (("fp32", fp32), ("int8", int8))}
        self.ended: dict = {}  # the final outputs' values, for the exposure records
        self.kept: dict = {}  # the fp32 tensors --save-boundaries stores
        self.ranges: dict = {}  # what each int8 boundary's QuantizeLinear can represent
        self.side_values: dict = {}  # fp32 tensors that feed --local's segments

    def compare(self) -> None:
        """Every pair's entry, in batches that fit ``--max-memory``: one session at a time,
        released before the next opens."""
        rows = self.feed.rows
        self.ranges = quantized_ranges(self.int8.path, self.int8_names) \
            if self.options.clipping else {}
        max_memory = self.options.max_memory
        budget = None if max_memory is None else max_memory << 20
        sizes = [None if a is None or b is None else a + b
                 for a, b in ((self.fp32.boundary_bytes(f, rows),
                               self.int8.boundary_bytes(q, rows))
                              for f, q in zip(self.fp32_names, self.int8_names))]
        batches = plan_batches(sizes, budget)
        self.side_values = (self.segments.fp32_values(self.fp32, self.feed.arrays)
                            if self.segments else {})
        progress = Progress("comparing boundaries", len(self.pairs))
        previous = None
        for batch in batches:
            a_values, b_values = self._fetch(batch)
            for k in batch:
                fp32_name, int8_name = self.fp32_names[k], self.int8_names[k]
                a, b = a_values[fp32_name], b_values[int8_name]
                self.entries.append(self._entry(k, a, b, previous))
                progress.step(k + 1)
                if k == len(self.pairs) - 1:
                    self.final = b
                if int8_name == self.ends["int8"]:
                    self.ended["int8"] = b
                if fp32_name == self.ends["fp32"]:
                    self.ended["fp32"] = a
                previous = a
            del a_values, b_values
        progress.close()

    def _fetch(self, batch: list[int]) -> tuple[dict, dict]:
        """The batch's fp32 values (stored ones with ``--load-boundaries``) and int8 values."""
        fp32_names = [self.fp32_names[k] for k in batch]
        hint = dims_hint(self.feed)
        a_values = ({name: self.stored[name] for name in fp32_names}
                    if self.options.load_boundaries
                    else _boundary_values(self.fp32, fp32_names, self.feed.arrays, hint))
        if self.options.save_boundaries:
            self.kept.update(a_values)
        b_values = _boundary_values(self.int8, [self.int8_names[k] for k in batch],
                                    self.int8_feed, hint)
        return a_values, b_values

    def _entry(self, k: int, a, b, previous) -> dict:
        """Boundary ``k``'s entry: the pair compared, clipping and the local error added
        where asked for; non-finite values named on stderr."""
        fp32_name, int8_name = self.fp32_names[k], self.int8_names[k]
        entry = _boundary_entry(k, (fp32_name, int8_name), (a, b), self.feed.rows,
                                self.options.metrics)
        if self.options.clipping:
            entry["clipped"] = clipped_fraction(a, self.ranges.get(int8_name))
        _note_nonfinite(entry.get("nonfinite"), f"boundary {k}",
                        {"fp32": fp32_name, "int8": int8_name})
        if self.segments is not None:
            entry["local"] = (self.segments.measure(k, previous, a, self.side_values) if k else
                              {key: value for key, value in entry.items()
                               if key not in ("index", "fp32", "int8")})
        return entry

    def answer(self) -> dict:
        """The ``layers`` answer: the contract's fields, then whatever the options add."""
        options, feed, entries = self.options, self.feed, self.entries
        answer = {"seed": self.seed, "rows": feed.rows}
        if not feed.contract_shaped:
            answer["inputs"] = feed.fed
        answer.update(layer_count=len(entries), layers=entries)
        guessed = self.pairing != "position" and options.pair == "auto"
        if not (feed.contract_shaped and not options.says_more(self.targets) and not guessed):
            answer["first_divergence"] = first_divergence(entries)  # (the contract's stays)
        if guessed:  # said only where it is not the contract's
            answer["pairing"] = self.pairing
        if self.segments is not None:
            answer["local_unavailable"] = self.segments.unavailable
        if self.targets.given:
            answer["providers"] = self.targets.field(self.int8.got, self.fp32.got)
        self._exposures(answer, contract="first_divergence" not in answer)
        golden = self.golden
        if options.save_boundaries:
            golden = save_golden(
                options.save_boundaries, "boundaries", self.fp32.path,
                {name: self.kept[name] for name in self.fp32_names}, feed.arrays,
                got=self.fp32.got, seed=drawn_with(feed, self.seed),
                inputs_file=options.inputs.file if options.inputs is not None else None)
        if golden:
            answer["golden"] = golden
        return answer

    def _exposures(self, answer: dict, contract: bool) -> None:
        """Exposing the boundaries changes what a session compiles: an EP fuses across what is
        now an output, and the CPU no longer fuses a DequantizeLinear whose output is exposed.
        Each side says by how much its final output moved (on stderr where it did); the answer
        carries it wherever it is not the contract's."""
        if not self.entries:
            return
        targets = self.targets
        if not _fell_back(targets.candidate, self.int8.got):
            exposure = exposure_of(self.int8, self.ends["int8"], self.ended.get("int8"),
                                   self.int8_feed, "the int8 (candidate)",
                                   self.plain.get("int8", {}).get(self.ends["int8"]))
            if not contract:
                answer["exposure"] = exposure
        if not self.options.load_boundaries and not _fell_back(targets.reference, self.fp32.got):
            exposure = exposure_of(self.fp32, self.ends["fp32"], self.ended.get("fp32"),
                                   self.feed.arrays, "the fp32 (reference)",
                                   self.plain.get("fp32", {}).get(self.ends["fp32"]))
            if not contract:
                answer["reference_exposure"] = exposure


def _fell_back(on: ProviderRequest | None, got: Got) -> bool:
    """Did a side measured anyway (``--allow-fallback``) miss what it asked for? Its exposure
    would describe the CPU, not the target: it is not said."""
    return on is not None and bool(fallback_of(on.requested, got.actual, got.nodes))


def first_divergence(entries: list[dict]) -> dict | None:
    """Where the two sides first differ: ``{"index", "boundary", "max_abs_error"}`` of the
    first boundary whose error is not zero (a non-finite one counts), None when none is. For
    the same model on two providers, the layer the kernels disagree from."""
    for entry in entries:
        error = entry["max_abs_error"]
        if error is None or error != 0:
            return {"index": entry["index"], "boundary": entry["fp32"], "max_abs_error": error}
    return None


def _stored_boundaries(path: str, fp32: PairedModel, pairs: list, seed: int,
                       inputs: InputOptions | None) -> tuple[dict, dict, InputOptions]:
    """``(golden record, fp32 boundary tensors, inputs)`` from a ``--save-boundaries`` file,
    checked against the fp32 model; its inputs are the ones to feed the int8 model."""
    golden, stored_inputs, stored = load_golden(
        path, "boundaries", [fp32.boundaries[i] for i, _ in pairs], fp32.path, seed,
        graph=fp32.model, given_inputs=_given_inputs(inputs, fp32.model, fp32.path))
    fp32.got = Got(golden["providers"], golden.get("nodes_per_provider"))
    return golden, stored, dataclasses.replace(inputs or InputOptions(), arrays=stored_inputs)


def _given_inputs(inputs: InputOptions | None, graph, path: str) -> dict | None:
    """The arrays of an ``--inputs`` file given beside a golden file, to check against it."""
    if inputs is None or not inputs.file:
        return None
    return _load_inputs_file(inputs.file, specs_from_model(graph), path,
                             iteration=inputs.iteration or 0)


def drawn_with(feed: Feed, seed: int) -> int | None:
    """The seed that drew some of ``feed``'s inputs; None when every one came from a file."""
    return seed if any(entry["source"] != "file" for entry in feed.fed) else None


def _boundary_values(side: PairedModel, names: list[str], feeds: dict,
                     hint: str = "") -> dict:
    """The float values of boundaries ``names`` of one side, from a session opened for them
    (quantized ones read back through their scale and zero point); ``hint`` is added to a
    failed run's error (the dims eprun chose)."""
    wanted = list(dict.fromkeys(names + side.runtime))
    fetched = fetch(side.session(side.runtime), wanted, feeds, what=repr(side.path), hint=hint)
    return {name: side.quantization.read(name, fetched) for name in names}


def _note_nonfinite(counts: dict | None, where: str, names: dict) -> None:
    """Name on stderr each tensor that held NaN or infinite values (the answer counts them in
    ``nonfinite``; the numbers they touch are null)."""
    for side, count in (counts or {}).items():
        if count:
            note(f"{where}: the {side} tensor {names[side]!r} holds {count} NaN or infinite "
                 f"value{'s' if count > 1 else ''}; the numbers it touches are null")


def quantized_ranges(path: str, names: list[str]) -> dict:
    """For each boundary of the int8 model at ``path``, the float range its QuantizeLinear
    can represent, ``((qmin - zero) * scale, (qmax - zero) * scale)`` for a per-tensor scale
    and zero point held in initializers; None where no such QuantizeLinear makes it."""
    import numpy as np

    model = load_model(path)
    index = GraphIndex.of(model.graph)
    ranges: dict = {}
    for name in names:
        quantize = next((node for node in quantizing_chain(name, index)[1]
                         if node.op_type == "QuantizeLinear"), None)
        ranges[name] = None
        if quantize is None or len(quantize.input) < 2 or \
                quantize.input[1] not in index.initializers:
            continue
        scale = _initializer_array(index.initializers[quantize.input[1]], path)
        zero = (_initializer_array(index.initializers[quantize.input[2]], path)
                if len(quantize.input) > 2 and quantize.input[2] in index.initializers
                else np.zeros((), np.uint8))
        if scale.size != 1 or zero.size != 1 or not np.issubdtype(zero.dtype, np.integer):
            continue
        limits = np.iinfo(zero.dtype)
        step, offset = float(scale.reshape(())), int(zero.reshape(()))
        ranges[name] = ((limits.min - offset) * step, (limits.max - offset) * step)
    return ranges


def clipped_fraction(values, bounds: tuple[float, float] | None) -> float | None:
    """The fraction of ``values`` outside ``bounds`` (None without bounds)."""
    import numpy as np

    if bounds is None or not values.size:
        return None
    outside = np.count_nonzero((values < bounds[0]) | (values > bounds[1]))
    return int(outside) / int(values.size)


def _boundary_entry(k: int, names: tuple[str, str], values: tuple, rows: int,
                    metrics: tuple[str, ...]) -> dict:
    """Boundary ``k``'s entry of the ``layers`` answer: its (fp32, int8) names and how far
    apart their values are, row by row."""
    (fp32_name, int8_name), (a, b) = names, values
    if a.shape != b.shape or a.size % rows:
        raise EprunError(f"boundary {k} ({fp32_name!r} vs. {int8_name!r}): shapes "
                         f"{list(a.shape)} and {list(b.shape)} cannot be compared row "
                         f"by row over {rows} rows")
    return {"index": k, "fp32": fp32_name, "int8": int8_name,
            **compare_boundary(a, b, rows, metrics)}


def exposure_of(side: PairedModel, output: str, exposed_value, feed: dict,
                which: str = "the int8 (candidate)", plain_value=None) -> dict:
    """How far exposing the boundaries moved ``output`` on the side's providers: the plain
    model run there on the same inputs, against the exposed run's value. An EP that compiles
    the graph as a whole (OpenVINO, TensorRT) fuses across what is now an output, and the CPU
    no longer fuses DequantizeLinear -> MatMul -> QuantizeLinear into one int8 kernel where
    the DequantizeLinear's output is exposed, so the per-boundary table describes a slightly
    different graph; this says by how much, and ``which`` model it is on stderr.
    ``plain_value``: the plain model's ``output`` where a run of it already answered (never
    two plain runs of one model for one answer)."""
    import numpy as np

    if exposed_value is None or output not in {value.name for value in side.model.graph.output}:
        return {"output": output, "max_abs_diff": None}  # not measured, or no plain output
    value = plain_value
    if value is None:
        plain = side.session([], exposed=False)
        (value,) = run_session(plain, [output], feed, what=repr(side.path))
        del plain
    diff = (float("nan") if value.shape != exposed_value.shape else
            0.0 if np.array_equal(value, exposed_value, equal_nan=value.dtype.kind in "fc")
            else largest_of(differences(exposed_value, value)[2]))
    if diff != 0:
        note(f"exposing the boundaries moved {which} model's {output!r} on "
             f"{','.join(side.got.actual)} by {diff:.6g} (max abs): the session compiles or "
             "optimizes the exposed graph differently, so the table describes the exposed "
             "graph, not exactly the plain one")
    return {"output": output, "max_abs_diff": float(diff)}


def plan_pairs(fp32: PairedModel, int8: PairedModel, pair: str) -> tuple[list, str]:
    """``([(fp32 index, int8 index), ...], how)``: each compared boundary, and how they were
    paired (``position`` or ``name``).

    ``position`` (the contract) pairs the k-th with the k-th and warns on stderr where the
    names prove that wrong; ``name`` pairs by the names quantizers keep. ``auto`` (the
    default) is ``position`` unless the names prove it wrong: where they pair every boundary
    otherwise, or where the int8 model is a conversion of the fp32 one (it computes nothing
    under a name the fp32 model lacks), the names win wherever they tie two boundaries and
    the rest keep their order; with a different count of boundaries, the conversion whose
    names pair every fp32 boundary is paired by name (a float16 twin that renamed an output
    read by a MatMul). Said on stderr and in the answer. Other counts that differ stay the
    contract's error.
    """
    named = pair_by_name(fp32.boundaries, int8.boundaries, fp32.owners, int8.owners)
    count_fp32, count_int8 = len(fp32.boundaries), len(int8.boundaries)
    if pair == "name":
        unpaired = [fp32.boundaries[i] for i in range(count_fp32) if i not in named]
        if unpaired:
            raise EprunError(f"--pair name: no boundary of {int8.path!r} is named after "
                             f"{', '.join(map(repr, unpaired[:3]))}"
                             f"{' and more' if len(unpaired) > 3 else ''} of {fp32.path!r}; "
                             "pair by position (the default) or add --boundary-ops")
        return sorted(named.items()), "name"
    converted = pair == "auto" and not _computed_anew(fp32.model, int8.model)
    if count_fp32 != count_int8:
        return _pairs_of_other_counts(fp32, int8, named, converted)
    return _pairs_against_names(fp32, int8, named, pair == "auto", converted)


def _pairs_of_other_counts(fp32: PairedModel, int8: PairedModel, named: dict,
                           converted: bool) -> tuple[list, str]:
    """``plan_pairs`` where the counts differ: by name for a conversion whose names pair
    every fp32 boundary (said on stderr), else the contract's error."""
    count_fp32, count_int8 = len(fp32.boundaries), len(int8.boundaries)
    if converted and len(named) == count_fp32:
        left = [int8.boundaries[j] for j in range(count_int8) if j not in named.values()]
        note(f"boundary counts differ ({count_fp32} in {fp32.path!r}, {count_int8} in "
             f"{int8.path!r}), but the int8 model computes nothing the fp32 one does not "
             f"and the names pair every fp32 boundary: paired by name, leaving "
             f"{', '.join(map(repr, left[:3]))}{' and more' if len(left) > 3 else ''} "
             "out; --pair position keeps the contract's error")
        return sorted(named.items()), "name"
    hint = ("; the names pair every fp32 boundary, so --pair name would compare them"
            if len(named) == count_fp32 else "")
    raise EprunError(f"boundary counts differ: {count_fp32} in {fp32.path!r}, "
                     f"{count_int8} in {int8.path!r}; boundaries are paired by "
                     f"position, so the models must have the same layer structure{hint}")


def _pairs_against_names(fp32: PairedModel, int8: PairedModel, named: dict, auto: bool,
                         converted: bool) -> tuple[list, str]:
    """``plan_pairs`` for equal counts: by position, unless the names contradict it and
    ``auto`` lets them win (every boundary named, or a conversion: where they tie two); a
    contradiction that stays is said on stderr."""
    count_fp32, count_int8 = len(fp32.boundaries), len(int8.boundaries)
    wrong = [(i, j) for i, j in sorted(named.items()) if i != j]
    if wrong:
        shown = "; ".join(f"{fp32.boundaries[i]!r} (position {i}) goes with "
                          f"{int8.boundaries[j]!r} (position {j})" for i, j in wrong[:3])
        more = " and more" if len(wrong) > 3 else ""
        if auto and len(named) == count_fp32:
            note(f"paired by name, as position contradicts the tensor names: {shown}{more}; "
                 "--pair position keeps the k-th with the k-th")
            return sorted(named.items()), "name"
        if converted:
            rest = zip((i for i in range(count_fp32) if i not in named),
                       (j for j in range(count_int8) if j not in named.values()))
            note(f"paired by name where the names tie {len(named)} of the {count_fp32} "
                 f"boundaries, as position contradicts them: {shown}{more}; the other "
                 f"{count_fp32 - len(named)} in order among the rest; --pair position keeps "
                 "the k-th with the k-th")
            return sorted([*named.items(), *rest]), "name"
        advice = ("rerun with --pair name" if len(named) == count_fp32 else
                  f"the names pair only {len(named)} of the {count_fp32} boundaries, so "
                  "neither order is sure: check that the int8 model is a quantization of the "
                  "fp32 one, or choose the boundaries with --boundary-ops")
        note(f"pairing by position contradicts the tensor names: {shown}{more}; {advice}")
    return [(k, k) for k in range(count_fp32)], "position"


# Nodes a quantizer or a float16 conversion adds around the computation it keeps.
_CONVERSION_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Cast"}


def _computed_anew(fp32_model, int8_model) -> list[str]:
    """The int8 model's nodes that no fp32 node accounts for by name (a quantized op keeps
    its float node's name, with ``_quant`` appended in the QOperator form), beside what a
    conversion adds (Q/DQ pairs, casts); an unnamed one counts, as nothing says what it is.
    None of them: the int8 model is a conversion of the fp32 one, and its names are its."""
    names = {node.name for node in fp32_model.graph.node if node.name}
    return [node.name or node.op_type for node in int8_model.graph.node
            if node.op_type not in _CONVERSION_OPS
            and re.sub(_NODE_SUFFIXES, "", node.name) not in names]


_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# The ops of the other quantized forms: dynamic quantization's, and (with QLinear*) QOperator's.
_INTEGER_OPS = ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger")


def _quantization_ops(model) -> int:
    """How many nodes quantize or compute in the integer domain (Q/DQ, QLinear*, ...), or
    read a weight quantized in blocks (``WEIGHT_ONLY_OPS``)."""
    return sum(node.op_type in _QDQ_OPS + _INTEGER_OPS + WEIGHT_ONLY_OPS
               or node.op_type.startswith("QLinear") for node in model.graph.node)


def _weight_only_4bit(model) -> bool:
    """A weight-only twin: some weight of 4 bits or fewer dequantized in blocks
    (``weight_only_nodes``), and no activation quantized (no QuantizeLinear, dynamic or
    QLinear op, no DequantizeLinear of anything but an initializer)."""
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    activations = [node for node in graph.node if node.op_type.startswith("QLinear")
                   or (node.op_type in _QDQ_OPS + _INTEGER_OPS and not (
                       node.op_type == "DequantizeLinear" and node.input[0] in initializers))]
    return not activations and any(bits <= 4 for _, bits in weight_only_nodes(graph))


SWAPPED_OK_ARG = arg(
    "--swapped-ok", action="store_true",
    help="compare the pair as given even when the first model is quantized and the second is "
         "not (eprun otherwise stops with exit 2: they look swapped)")


def require_in_order(models: tuple, paths: tuple[str, str], swapped_ok: bool,
                     roles: tuple[str, str] = ("fp32", "int8")) -> None:
    """The float model goes first. A first model that quantizes (Q/DQ, QLinear*, integer
    ops) beside a second that does not is a swapped pair: measured as given, every scale and
    every verdict would be the wrong way round, so it is wrong usage unless ``swapped_ok``."""
    import shlex

    if swapped_ok:
        return
    first = _quantization_ops(models[0])
    if first and not _quantization_ops(models[1]):
        raise EprunError(
            f"the models look swapped: {paths[0]!r}, given as the {roles[0]} model, has "
            f"{first} quantization node{'s' if first > 1 else ''} and {paths[1]!r}, the "
            f"{roles[1]} one, has none; give them the other way round "
            f"({shlex.join([paths[1], paths[0]])}), or add --swapped-ok to compare them as "
            "given", EXIT_USAGE)


def _note_absent_ops(models: tuple, boundary_ops: tuple[str, ...]) -> None:
    """A note for each ``--boundary-ops`` op type none of ``models`` has a node of (nor a
    quantized form of): it adds no boundary, which is likely not what was meant."""
    present = {node.op_type for model in models for node in model.graph.node}
    absent = [op for op in boundary_ops if op not in BOUNDARY_OPS
              and not present & {op, *QUANTIZED_FORMS.get(op, ())}]
    if absent:
        import difflib

        near = {op: difflib.get_close_matches(op, sorted(present), 1, 0.6) for op in absent}
        whom = ("neither model has such a node" if len(models) > 1
                else "the model has no such node")
        hints = "".join(f"; did you mean {near[op][0]}?" for op in absent if near[op])
        note(f"--boundary-ops {', '.join(absent)}: {whom}, so it adds no boundary{hints}")


def _suggest_boundary_ops(fp32: PairedModel, boundary_ops: tuple[str, ...]) -> None:
    """A CNN has no MatMul: its only boundary is the output, or the output and the input of
    a Gemm head. Say which option helps where the layers left out outnumber those compared."""
    left_out = [node.op_type for node in fp32.model.graph.node
                if node.op_type in _LINEAR_OPS and node.op_type not in boundary_ops]
    present = sorted(set(left_out))
    if not present or len(left_out) < len(fp32.boundaries):
        return
    wider = ",".join(dict.fromkeys([*boundary_ops, *present]))
    if len(fp32.boundaries) <= 1:
        note(f"{fp32.path!r} has no boundary before its output (no "
             f"{'/'.join(boundary_ops)} node), but it has {', '.join(present)}: add "
             f"--boundary-ops {','.join(present)} to compare the input of each")
    else:
        note(f"{fp32.path!r} has {len(fp32.boundaries)} boundaries, but {len(left_out)} "
             f"{'/'.join(present)} layers no boundary is in front of: --boundary-ops {wider} "
             "compares the input of each")


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


# -- local error -----------------------------------------------------------------------------------

def quantizing_chain(name: str, index: GraphIndex) -> tuple[str, list]:
    """``(float tensor, nodes)``: the QuantizeLinear [-> DequantizeLinear] or
    DynamicQuantizeLinear that turned a float tensor into ``name``; ``(name, [])`` when none
    did."""
    chain = []
    node = index.producer(name)
    if node is not None and node.op_type == "DequantizeLinear":
        chain.append(node)
        node = index.producer(node.input[0])
    if node is not None and node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear"):
        return node.input[0], [*chain, node]
    return name, []


def _before_cast(name: str, index: GraphIndex, fp32_names: set) -> str:
    """Where a segment starting at ``name`` is fed: in front of the Cast that made it float16
    (or bfloat16) from a float32 tensor the fp32 model has (a float16 twin casts its input),
    so the segment casts as the twin does. onnxruntime's CPU runs float16 Convs and MatMuls
    in float32 between casts and drops a Cast pair that cancels: fed already cast, the
    segment would round the input to float16, which the twin itself never does."""
    node = index.producer(name)
    types = index.types or {}
    if node is not None and node.op_type == "Cast" and node.input and \
            node.input[0] in fp32_names and _element_type(types, node.input[0]) == 1 and \
            _element_type(types, name) in (10, 16):  # float32 into float16 / bfloat16
        return node.input[0]
    return name


class Segment(NamedTuple):
    """The int8 nodes between two boundaries, cut out as a model of their own.

    ``start`` is fed the fp32 value of the previous boundary ("" when the segment does not read
    it: a parallel branch); each name in ``sides`` (a skip connection, a mask, a second branch)
    is fed the fp32 tensor it maps to, at the point where the int8 model quantizes it, or
    quantized with the int8 model's own scale where it is an 8-bit tensor. ``outputs`` are
    ``end`` and what reads it back as float (a run-time scale). ``reason`` says why a segment
    could not be cut.
    """

    model: Any
    start: str
    outputs: list
    sides: dict
    reason: str | None


class Feedable(NamedTuple):
    """What a segment may be fed rather than compute: the fp32 model's tensor names
    (``fp32_names``), the graph inputs (``input_names``) and what the int8 model computes for
    the earlier boundaries (``earlier``; None: whatever does not descend from the start)."""

    fp32_names: set
    input_names: set
    earlier: set | None = None


def cut_segment(model, start: str, end: str, *, index: GraphIndex, types: dict,
                feedable: Feedable, extra_outputs: list[str] = ()) -> Segment:
    """The nodes that compute ``end`` from ``start`` and from fp32 values of what else they read.

    Walking back from ``end``, a tensor that does not descend from ``start`` but the int8
    model computes for an earlier boundary (``feedable.earlier``: the earlier boundaries and
    what they are computed from) is not the segment's to compute: it is fed its
    fp32 value, taken in front of the QuantizeLinear -> DequantizeLinear pair that quantizes
    it (the pair stays in the segment) or where it is (a graph input, a float tensor both
    models have). What has no fp32 counterpart is computed by the segment itself (shape
    arithmetic, dequantized weights), and so is a branch no earlier boundary needs (the key
    and value projections beside a query's): its own error is this segment's. ``index`` is
    ``model``'s graph index.
    """
    outputs = [end, *extra_outputs]
    taken, sides, reason = _segment_nodes(index, start, outputs, types=types,
                                          feedable=feedable)
    members = [index.nodes[i] for i in sorted(taken)]
    used = {name for node in members for name in _node_inputs(node)}
    if start not in used:  # a parallel branch: its inputs are all sides
        start = ""
    segment = _segment_model(model, index, members, [start, *sorted(sides)], outputs,
                             used=used, types=types)
    return Segment(segment, start, outputs, sides, reason)


def _add_ancestors(index: GraphIndex, name: str, found: set[str]) -> None:
    """Add ``name`` and every tensor it is computed from (through subgraphs' outer reads) to
    ``found``; a tensor already there is not walked again."""
    frontier = [name]
    while frontier:
        tensor = frontier.pop()
        if not tensor or tensor in found:
            continue
        found.add(tensor)
        node = index.producer(tensor)
        if node is not None:
            frontier.extend(_node_inputs(node))


def _descendants(index: GraphIndex, start: str) -> set[str]:
    """``start`` and every tensor computed from it."""
    found, frontier = {start}, [start]
    while frontier:
        for i in index.consumers.get(frontier.pop(), ()):
            for output in index.nodes[i].output:
                if output and output not in found:
                    found.add(output)
                    frontier.append(output)
    return found


# One piece: a single walk back whose cases (a fed side tensor, its Q/DQ chain, a tensor
# computed before the previous boundary) share one stack and one seen set, and each decides
# whether the walk goes on; split, every piece would take and hand back all of that state.
def _segment_nodes(index: GraphIndex, start: str, outputs: list[str], *, types: dict,
                   feedable: Feedable) -> tuple[set[int], dict, str | None]:
    """``(node indices, sides, reason)``: the walk back from ``outputs`` (the segment's end
    first) that ``cut_segment`` describes; ``reason`` says where it had to stop."""
    fp32_names, input_names, earlier = feedable
    end, extra_outputs = outputs[0], outputs[1:]
    descendants = _descendants(index, start)
    taken: set[int] = set()
    fed_through: set[int] = set()  # the Q/DQ nodes in front of a fed side tensor
    sides: dict[str, str] = {}
    seen: set[str] = set()
    stack, reason = list(outputs), None
    index_of = {id(node): i for i, node in enumerate(index.nodes)}
    while stack:
        name = stack.pop()
        if name in seen or name == start or name in index.initializers:
            continue
        seen.add(name)
        before = name != end and name not in descendants and name not in extra_outputs
        if before and (earlier is None or name in earlier or name in input_names):
            fed_at, chain = quantizing_chain(name, index)
            if chain and (fed_at in fp32_names or fed_at in input_names):
                fed_through.update(index_of[id(node)] for node in chain)
                stack.extend(n for node in chain for n in node.input[1:] if n)
                sides[fed_at] = fed_at
                continue
            if name in input_names or name in fp32_names:
                sides[name] = name
                continue
            if _is_integer(types, name) and float_tensor_name(name) in fp32_names:
                sides[name] = float_tensor_name(name)  # quantized from fp32 when fed
                continue
        if name not in index.producer_index:
            reason = f"{end!r} reads {name!r}, which no node computes"
            break
        node = index.nodes[index.producer_index[name]]
        if before and (earlier is None or name in earlier) and _quantizes(node):
            reason = (f"{end!r} reads {name!r}, which the int8 model computes before the "
                      "previous boundary and the fp32 model has no tensor of that name for")
            break
        taken.add(index.producer_index[name])
        stack.extend(n for n in _node_inputs(node) if n)
    return taken | fed_through, sides, reason


def _segment_model(model, index: GraphIndex, members: list, inputs: list[str],
                   outputs: list[str], *, used: set, types: dict):
    """``members`` as a model of their own, with ``model``'s opsets and functions: inputs
    typed as declared (an unknown one float, where eprun feeds fp32), outputs left to
    onnxruntime to infer where their type is unknown, and the initializers they read."""
    from onnx import ValueInfoProto, helper

    def value(name: str, fed: bool):
        """The value info of ``name``: its inferred type, or float of unknown shape where it is
        fed, else none."""
        if name in types:
            return helper.make_value_info(name, types[name])
        return helper.make_tensor_value_info(name, 1, None) if fed else ValueInfoProto(name=name)

    initializers = index.initializers
    graph = helper.make_graph(members, f"segment_{outputs[0]}",
                              [value(name, True) for name in inputs if name],
                              [value(name, False) for name in outputs],
                              [initializers[name] for name in sorted(used & set(initializers))])
    segment = helper.make_model(graph, opset_imports=list(model.opset_import))
    segment.ir_version = model.ir_version
    segment.functions.extend(model.functions)
    return segment


def _quantizes(node) -> bool:
    """Does this node quantize an activation (so recomputing it would bring int8 error in)?"""
    return (node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                             "ConvInteger", "QGemm") or node.op_type.startswith("QLinear"))


class LocalSegments:
    """Error each int8 segment introduces on its own, given perfect (fp32) inputs.

    For boundary k >= 1 the int8 nodes between boundary k-1 and k are cut out (``cut_segment``)
    and fed the fp32 tensor of boundary k-1 where the int8 model quantizes it (the input of the
    QuantizeLinear in front of that boundary's DequantizeLinear), so the segment's own input
    quantization counts as its error; what an earlier boundary is computed from (a skip
    connection) is fed its fp32 value the same way, and a branch no earlier boundary needs (a
    key projection beside the query's) is computed in the segment from the fp32 values of the
    earlier boundaries it reads, so its own error is born there. Boundary 0 has no earlier
    boundary: its local error is its error. A segment that cannot be cut gets null and a
    reason in ``unavailable``.
    """

    def __init__(self, int8: PairedModel, boundaries: list[str], *, fp32_names: set,
                 input_names: set, rows: int, metrics: tuple[str, ...]) -> None:
        """Cut the int8 nodes between each boundary and the one before it (from k = 1) and find the
        scales their quantized inputs need; a segment that cannot be cut, or whose quantized input
        has no scale eprun finds, goes to ``unavailable`` with its reason."""
        self.path, self.rows, self.metrics = int8.path, rows, metrics
        self.types = int8.types
        self.on = int8.on  # segments run where the int8 model runs (--providers)
        self.unavailable: list[dict] = []
        model = load_model(int8.path)
        index = GraphIndex.of(model.graph, int8.types)
        self.segments: dict[int, Segment] = {}
        earlier: set[str] = set()  # the earlier boundaries and what they are computed from
        for k in range(1, len(boundaries)):
            _add_ancestors(index, boundaries[k - 1], earlier)
            start = _before_cast(quantizing_chain(boundaries[k - 1], index)[0], index,
                                 {*fp32_names, *input_names})
            segment = cut_segment(model, start, boundaries[k], index=index, types=int8.types,
                                  feedable=Feedable(fp32_names, input_names, earlier),
                                  extra_outputs=int8.quantization.runtime(boundaries[k]))
            if segment.reason:
                self.unavailable.append({"index": k, "reason": f"cannot cut: {segment.reason}"})
            else:
                self.segments[k] = segment
        fed = [name for segment in self.segments.values()
               for name in [segment.start, *segment.sides] if name]
        self.quantization = Quantization(model, int8.path, int8.types, [*fed, *boundaries],
                                         index)
        for k, segment in list(self.segments.items()):
            unread = [name for name in fed if _is_integer(int8.types, name)
                      and name in [segment.start, *segment.sides]
                      and name not in self.quantization.params]
            if unread:
                del self.segments[k]
                self.unavailable.append({"index": k, "reason": f"cannot cut: {unread[0]!r} is "
                                         "quantized with no scale eprun can find"})

    def fp32_values(self, fp32: PairedModel, inputs: dict) -> dict:
        """The fp32 tensors the segments are fed besides their start, from one extra run of
        the fp32 model (the boundary run is left as it is)."""
        wanted = sorted({source for segment in self.segments.values()
                         for source in segment.sides.values()} - set(inputs))
        values = dict(inputs)
        if wanted:
            values.update(fetch(fp32.session(wanted), wanted, inputs, what=repr(fp32.path)))
        return values

    def _fed(self, name: str, value):
        """An fp32 value as the int8 model holds ``name``: quantized where it is 8-bit, cast
        where it is another float type (a float16 twin's segments take float16)."""
        if name in self.quantization.params:
            return self.quantization.quantize(name, value)
        elem = _element_type(self.types, name)
        if elem in FLOAT_TYPES and elem != 1:  # 1: float32, as fed
            from onnx import helper

            with contextlib.suppress(KeyError, TypeError, ValueError):  # bfloat16: no numpy
                return value.astype(helper.tensor_dtype_to_np_dtype(elem))
        return value

    def measure(self, k: int, fp32_before, fp32_here, side_values: dict) -> dict | None:
        """Boundary ``k``'s local error (``compare_boundary``): its segment, in a session of its
        own, fed ``fp32_before`` (boundary k-1's fp32 tensor) and ``side_values``, against
        ``fp32_here``; None where it has no segment (k 0, or unavailable)."""
        segment = self.segments.get(k)
        if segment is None:
            return None
        session = open_exposed(segment.model, self.path, on=self.on)
        feeds = {name: self._fed(name, side_values[source])
                 for name, source in segment.sides.items()}
        if segment.start:
            feeds[segment.start] = self._fed(segment.start, fp32_before)
        fetched = dict(zip(segment.outputs, run_session(session, segment.outputs, feeds,
                                                        what=f"segment {k} of {self.path!r}")))
        return compare_boundary(fp32_here, self.quantization.read(segment.outputs[0], fetched),
                                self.rows, self.metrics)


# -- growth ----------------------------------------------------------------------------------------

def growth_from(rel_errors: list[float]) -> dict:
    """Ratios of consecutive relative errors, monotonicity, total growth and the largest jump.

    ``ratios[k-1]`` belongs to layer ``k``; ``max_ratio.index`` is that layer index. A ratio
    over a zero (or non-finite) predecessor is null and never the maximum.
    """
    def ratio(numerator: float, denominator: float) -> float | None:
        """``numerator / denominator``, or None over a zero or non-finite one."""
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


def growth_since_first_error(rel_errors: list) -> dict | None:
    """Where the first relative error is 0 (a weight-only twin's first boundaries are the float
    model's): ``{"index", "total_growth"}``, the last error over the first that is not 0, from
    the boundary that has it; None where there is none, or a number is NaN or infinite."""
    if not rel_errors or rel_errors[0] != 0 or any(
            value is None or not math.isfinite(value) for value in rel_errors):
        return None
    first = next((k for k, value in enumerate(rel_errors) if value != 0), None)
    if first is None:
        return None
    return {"index": first, "total_growth": rel_errors[-1] / rel_errors[first]}


def _largest(values: list, start: int = 0) -> tuple[int, float] | None:
    """``(index, value)`` of the largest finite value, the earliest on ties (``max`` keeps the
    first of equal keys); None if there is none."""
    finite = [(index, value) for index, value in enumerate(values, start=start)
              if value is not None and math.isfinite(value)]
    return max(finite, key=lambda pair: pair[1], default=None)


def growth_of(measured: dict) -> dict:
    """The ``growth`` answer for a ``layers`` answer: one measurement, never a second run.

    With local errors measured, ``local_rel_error`` lists each segment's own relative error and
    ``worst_local`` names the segment that introduces the most (earliest on ties): where the
    accumulated error jumps but the local one does not, the layer only inherits.
    """
    answer = {"seed": measured["seed"]}
    if "inputs" in measured:
        answer["inputs"] = measured["inputs"]
    answer.update(growth_from([entry["rel_error"] for entry in measured["layers"]]))
    since = growth_since_first_error(answer["rel_error"])
    # beyond the contract's fields only where the answer already is (first_divergence says so)
    if answer["total_growth"] is None and since is not None and "first_divergence" in measured:
        answer["growth_from_first_error"] = since
    if "local_unavailable" in measured:
        local_rel = [entry["local"]["rel_error"] if entry["local"] else None
                     for entry in measured["layers"]]
        largest = _largest(local_rel)
        worst = None if largest is None else {"index": largest[0], "rel_error": largest[1]}
        answer.update(local_rel_error=local_rel, worst_local=worst,
                      local_unavailable=measured["local_unavailable"])
    for key in ("first_divergence", "pairing", "providers", "exposure", "reference_exposure",
                "golden"):
        if key in measured:
            answer[key] = measured[key]
    return answer


# -- the gate: outputs judged against tolerances ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GateRules:
    """How each output is judged beyond the tolerances: ``stats`` ``{output: (statistic,
    quantile)}`` (Polygraphy's --check-error-stat; elemwise is the per-element test), the
    cosine bound's status where a statistic replaces the per-element test (``explicit_cos``:
    --min-cos given), and the top-K agreement asked for."""

    stats: dict
    explicit_cos: bool
    top_k: int | None
    top_k_axis: int
    min_top_k_agreement: float | None

    @classmethod
    def plain(cls) -> GateRules:
        """The per-element test and the cosine, nothing more."""
        return cls({}, False, None, -1, None)

    @classmethod
    def of(cls, options: CheckOptions, names: list[str], reference: str) -> GateRules:
        """The rules of ``options`` for the reference's outputs ``names``; a NAME that is no
        output is a usage error."""
        stats = {name: ["elemwise", 0.99] for name in names}
        for given, slot in ((options.check_error_stat, 0), (options.error_quantile, 1)):
            for name, value in given or ():
                if name and name not in stats:
                    raise EprunError(f"--check-error-stat/--error-quantile name {name!r}, which "
                                     f"is no output of {reference!r} (its outputs: "
                                     f"{', '.join(names)})", EXIT_USAGE)
                for target in [name] if name else names:
                    stats[target][slot] = value
        if options.error_quantile and not any(rule[0] == "quantile" for rule in stats.values()):
            raise EprunError("--error-quantile is the quantile of --check-error-stat quantile, "
                             "which no output is judged by", EXIT_USAGE)
        top_k = options.top_k
        if top_k is None and options.min_top_k_agreement is not None:
            top_k = 1
        if top_k is None and options.top_k_axis != -1:
            raise EprunError("--top-k-axis is the axis --top-k ranks along: give --top-k",
                             EXIT_USAGE)
        return cls({name: tuple(rule) for name, rule in stats.items()},
                   options.min_cos is not None, top_k, options.top_k_axis,
                   options.min_top_k_agreement)


def _measure_outputs(expected_outputs, got_outputs, paths: tuple[str, str],
                     rules: GateRules) -> list[dict]:
    """Each (name, value) of the reference against the candidate's at the same position: its
    entry of the answer (a shape that differs: ``"candidate_shape"`` and nothing else), with
    the statistic and the top-K agreement where asked for."""
    entries = []
    for (reference_name, expected), (candidate_name, got) in zip(expected_outputs,
                                                                 got_outputs):
        for value, name, path in ((expected, reference_name, paths[0]),
                                  (got, candidate_name, paths[1])):
            _require_numeric(value, name, path)
        entry = {"reference": reference_name, "candidate": candidate_name,
                 "shape": list(expected.shape)}
        entries.append(entry)
        if expected.shape != got.shape:
            entry["candidate_shape"] = list(got.shape)
            continue
        entry["_tolerance"] = None  # filled in by the judge, per output
        entry["_values"] = (expected, got)
        stat, quantile = rules.stats.get(reference_name, ("elemwise", 0.99))
        if stat != "elemwise":
            entry["error_stat"] = {"stat": stat, **({"quantile": quantile}
                                                    if stat == "quantile" else {}),
                                   **error_statistic(expected, got, stat, quantile)}
        if rules.top_k is not None:
            entry["top_k_agreement"] = top_k_agreement(expected, got, rules.top_k,
                                                       rules.top_k_axis)
    return entries


def _judge_outputs(entries: list[dict], tolerance: dict, rules: GateRules,
                   iteration: int | None = None) -> tuple[list[dict], list[dict]]:
    """``(outputs, failures)`` of one iteration: each entry's numbers against its tolerance
    (per element, or by its statistic), and every bound it breaks (shape, tolerance or
    statistic, cosine, top-K agreement)."""
    outputs, failures = [], []
    at = {} if iteration is None else {"iteration": iteration}
    for entry in entries:
        name = entry["reference"]
        if "candidate_shape" in entry:
            failures.append({"output": name, "bound": "shape", "reference": entry["shape"],
                             "candidate": entry["candidate_shape"], **at})
            outputs.append({key: entry[key] for key in ("reference", "candidate", "shape")})
            continue
        own = {**tolerance, **tolerance.get("per_output", {}).get(name, {})}
        expected, got = entry["_values"]
        judged = {key: value for key, value in entry.items() if not key.startswith("_")}
        extra = {key: judged.pop(key) for key in ("error_stat", "top_k_agreement")
                 if key in judged}
        judged.update(compare_outputs(expected, got, own["rtol"], own["atol"]))
        _note_nonfinite(judged.get("nonfinite"), f"output {name!r}",
                        {"reference": name, "candidate": entry["candidate"]})
        statistic = extra.get("error_stat")
        if statistic is not None:
            statistic.update(atol=own["atol"], rtol=own["rtol"])
        judged.update(extra)
        outputs.append(judged)
        failures += _broken_bounds(judged, tolerance, rules, at)
    return outputs, failures


def _broken_bounds(entry: dict, tolerance: dict, rules: GateRules, at: dict) -> list[dict]:
    """The bounds one output's entry breaks, in the gate's order."""
    name, broken = entry["reference"], []
    statistic = entry.get("error_stat")
    if statistic is None and entry["violations"]:
        broken.append({"output": name, "bound": "tolerance", "violations": entry["violations"],
                       "elements": entry["elements"], "worst": entry["worst"], **at})
    if statistic is not None and statistic_fails(statistic, statistic["atol"],
                                                 statistic["rtol"]):
        broken.append({"output": name, "bound": "error_stat", **statistic, **at})
    lost = (entry.get("nonfinite") or {}).get("candidate", 0)
    if statistic is not None and lost:  # NaN and Inf fail whatever the tolerances
        broken.append({"output": name, "bound": "nonfinite", "candidate": lost, **at})
    least = tolerance["min_cos"]
    if (statistic is None or rules.explicit_cos) and not entry["cosine"] >= least:
        broken.append({"output": name, "bound": "min_cos", "cosine": entry["cosine"],
                       "min_cos": least, "by": least - entry["cosine"],
                       **({"nonfinite": entry["nonfinite"]} if "nonfinite" in entry else {}),
                       **at})
    agreement = entry.get("top_k_agreement")
    if rules.min_top_k_agreement is not None and agreement is not None \
            and agreement < rules.min_top_k_agreement:
        broken.append({"output": name, "bound": "top_k", "k": rules.top_k,
                       "top_k_agreement": agreement,
                       "min_top_k_agreement": rules.min_top_k_agreement, **at})
    return broken


def gate_outputs(expected_outputs, got_outputs, paths: tuple[str, str],
                 tolerance: dict) -> tuple[list[dict], list[dict]]:
    """``(outputs, failures)`` of one run under the per-element test alone (``reduce``'s):
    each (name, value) of the reference against the candidate's at the same position."""
    rules = GateRules.plain()
    return _judge_outputs(_measure_outputs(expected_outputs, got_outputs, paths, rules),
                          tolerance, rules)


def tolerances(profile: str, rtol, atol, min_cos: float | None) -> tuple[dict, dict]:
    """``(tolerance, per_output)``: the profile's bounds with ``--rtol``/``--atol`` given
    without a name (and ``--min-cos``) over them, and ``{output: {"rtol"|"atol": value}}``
    for those given as NAME:VALUE."""
    tolerance = dict(TOLERANCE_PROFILES[profile])
    per_output: dict[str, dict] = {}
    for key, given in (("rtol", rtol), ("atol", atol)):
        for name, value in ([("", given)] if isinstance(given, (int, float)) else given or ()):
            (per_output.setdefault(name, {}) if name else tolerance)[key] = value
    if min_cos is not None:
        tolerance["min_cos"] = min_cos
    return tolerance, per_output


# -- weights, read back as onnxruntime dequantizes them --------------------------------------------

class QuantizedWeight(NamedTuple):
    """An integer initializer a quantized op reads as a weight, with where its scale and zero
    point are (initializer names; ``zero`` "" where the op gives none) and its channel axis
    (None: one scale for the whole tensor)."""

    name: str
    scale: str
    zero: str
    axis: int | None
    op_type: str


# The axis of a per-channel weight scale, where an op's (``_QUANTIZED_OPERANDS``) is not the
# last one: QLinearConv's output channels (a DequantizeLinear says its own, QGemm's turns with
# transB).
_WEIGHT_AXIS = {"QLinearConv": 0}


def quantized_weights(graph) -> list[QuantizedWeight]:
    """Every integer initializer read back as float, in file order: the input of a
    DequantizeLinear (its ``axis``, 1 by default as ONNX says, where the scale has one value
    per channel), and every operand of a quantized op that is a constant (the weight of
    QLinearConv, QLinearMatMul and QGemm, the bias QLinearAdd and QLinearMul add). Each
    once. (An int32 bias that a QLinearConv or QGemm scales by its inputs' scales has no
    scale of its own: not listed.)"""
    initializers = {tensor.name for tensor in graph.initializer}
    found: dict[str, QuantizedWeight] = {}
    for node in graph.node:
        attributes = {attribute.name: attribute.i for attribute in node.attribute}
        if node.op_type == "DequantizeLinear" and attributes.get("block_size"):
            continue  # a blocked weight: blockwise_weights
        axis = (attributes.get("axis", 1) if node.op_type == "DequantizeLinear" else
                0 if node.op_type == "QGemm" and attributes.get("transB") else
                _WEIGHT_AXIS.get(node.op_type, -1))
        inputs = list(node.input) + [""] * 6
        for weight, scale, zero in _QUANTIZED_OPERANDS.get(node.op_type, ()):
            if inputs[weight] in initializers and inputs[scale] in initializers \
                    and inputs[weight] not in found:
                found[inputs[weight]] = QuantizedWeight(
                    inputs[weight], inputs[scale],
                    inputs[zero] if inputs[zero] in initializers else "", axis, node.op_type)
    return list(found.values())


def dequantize_weight(values, scale, zero, axis: int | None) -> tuple:
    """``(values - zero) * scale`` as numpy computes it for qdq_loss_debug, in the types it
    gives (int8 weights come back float32, int32 biases float64), so the SQNR is the one it
    reports; but an integer difference that wraps around in the weight's own type (an int8
    bias with a zero point, a uint8 weight far from its own) is taken in 64 bits, where it is
    right. Returns (dequantized, what qdq_loss_debug computes where that differs, else None).
    """
    import numpy as np

    if scale.size == 1 and zero.size == 1:
        scale, zero = scale.reshape(()), zero.reshape(())
    elif axis is not None and scale.ndim == 1 and values.ndim:
        shape = [1] * values.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    with np.errstate(over="ignore"):
        narrow = values - zero
    if not np.issubdtype(narrow.dtype, np.integer):  # float8 weights: nothing wraps
        return narrow * scale, None
    wide = values.astype(np.int64) - zero.astype(np.int64)
    if np.array_equal(narrow, wide):
        return narrow * scale, None
    return wide * scale, narrow * scale


def weight_error(reference, dequantized) -> dict:
    """``sqnr_db`` as ``qdq_loss_debug.compute_signal_to_quantization_noice_ratio`` computes
    it (norms floored at the float epsilon, so an exact weight gets a large finite number),
    and the largest absolute difference."""
    import numpy as np

    left, right = reference.flatten(), dequantized.flatten()
    epsilon = np.finfo(float).eps
    diff = left - right
    signal = max(np.linalg.norm(left), epsilon)
    noise = max(np.linalg.norm(diff), epsilon)
    return {"sqnr_db": 20 * math.log10(signal / noise),
            "max_abs_error": float(np.abs(diff).max()) if diff.size else 0.0}


class BlockwiseWeight(NamedTuple):
    """A weight that a weight-only op reads in blocks: the initializer (``name``), the node that
    dequantizes it (MatMulNBits, MatMulBnb4, GatherBlockQuantized, or a DequantizeLinear with a
    ``block_size``), and what the float model's node must share with it to be the one whose
    weight it quantizes: the activation the MatMul multiplies (for a DequantizeLinear, that of
    the MatMul reading its output) and the output it writes; for GatherBlockQuantized, the
    Gather's output. Quantizers rename the weight and the node, but keep those two names."""

    name: str
    node: Any
    activation: str
    output: str


def blockwise_weights(graph) -> list[BlockwiseWeight]:
    """Every initializer a weight-only op reads in blocks, in file order, each once: B of
    MatMulNBits and MatMulBnb4, the table of GatherBlockQuantized, and the input of a
    DequantizeLinear with a ``block_size`` (opset 21's blocked form, MatMulNBitsQuantizer's QDQ
    format), paired with the MatMul that reads what it dequantizes where exactly one does."""
    initializers = {tensor.name for tensor in graph.initializer}
    matmuls: dict[str, list] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1:
            matmuls.setdefault(node.input[1], []).append(node)
    found: dict[str, BlockwiseWeight] = {}
    for node in graph.node:
        inputs = [*node.input, "", ""]
        if node.op_type in ("MatMulNBits", "MatMulBnb4"):
            name, activation, output = inputs[1], inputs[0], node.output[0]
        elif node.op_type == "GatherBlockQuantized":
            name, activation, output = inputs[0], "", node.output[0]
        elif (node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx")
              and int_attributes(node).get("block_size")):
            readers = matmuls.get(node.output[0], [])
            name = inputs[0]
            activation, output = ((readers[0].input[0], readers[0].output[0])
                                  if len(readers) == 1 else ("", ""))
        else:
            continue
        if name in initializers and name not in found:
            found[name] = BlockwiseWeight(name, node, activation, output)
    return list(found.values())


def _unpack_codes(data, bits: int, count: int):
    """The first ``count`` codes of ``bits`` bits packed along the last axis of uint8 ``data``,
    the first in a byte's lowest bits (MatMulNBits' blobs and zero points, a uint8
    GatherBlockQuantized table), as int64."""
    import numpy as np

    data = np.asarray(data, np.uint8)
    shifts = np.arange(8 // bits, dtype=np.uint8) * bits
    codes = (data[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*data.shape[:-1], -1)[..., :count].astype(np.int64)


def _is_midpoint(zero, bits: int, signed: bool) -> bool:
    """Symmetric quantization: every zero point in the middle of the codes' range (0 for signed
    codes, 2^(bits-1) for unsigned ones), so the grid is symmetric around 0."""
    import numpy as np

    return bool(np.all(np.asarray(zero) == (0 if signed else 1 << (bits - 1))))


def _dequantize_nbits(node, tensors) -> tuple:
    """MatMulNBits' B as the [K, N] weight it multiplies by, as onnxruntime's kernel computes
    it in float32: column n, row k in block b = k // block_size, (code - zero point) * scale,
    the code the (k % block_size)-th of the blob B[n, b] (lowest bits first), K padded to a
    whole block; the zero point 2^(bits-1) where none is given, else packed like the codes
    (uint8) or one float per block (unpacked)."""
    import numpy as np

    attributes = int_attributes(node)
    k, n, block = attributes["K"], attributes["N"], attributes["block_size"]
    bits = attributes.get("bits", 4)
    inputs = [*node.input, "", "", ""]
    if bits not in (2, 4, 8) or attributes.get("weight_prepacked") or inputs[4]:
        raise ValueError(f"bits {bits}, weight_prepacked {attributes.get('weight_prepacked', 0)}"
                         + (", g_idx" if inputs[4] else "") + " is a layout eprun does not read")
    blocks = -(-k // block)
    packed = tensors.array(inputs[1]).reshape(n, blocks, block * bits // 8)
    codes = _unpack_codes(packed, bits, block)
    scales = tensors.array(inputs[2]).astype(np.float32).reshape(n, blocks)
    zero = tensors.array(inputs[3]) if inputs[3] else np.full((n, blocks), 1 << (bits - 1))
    if zero.dtype == np.uint8 and inputs[3]:
        zero = _unpack_codes(zero.reshape(n, -1), bits, blocks)
    zero = zero.reshape(n, blocks)
    values = (codes.astype(np.float32) - zero[..., None].astype(np.float32)) * scales[..., None]
    return values.reshape(n, -1)[:, :k].T, {
        "bits": bits, "block_size": block, "symmetric": _is_midpoint(zero, bits, False),
        "accuracy_level": attributes.get("accuracy_level", 0)}


# bitsandbytes' 4-bit codes as onnxruntime's MatMulBnb4 kernel maps them
# (blockwise_quant_block_bnb4.h): quant_type 0 FP4, 1 NF4; a value is its code's entry times
# its block's absmax.
_BNB4_VALUES = {
    0: (0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
        -0.0, -5.208333333e-03, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25),
    1: (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)}


def _dequantize_bnb4(node, tensors) -> tuple:
    """MatMulBnb4's B as the [K, N] weight it multiplies by: the transposed weight [N, K]
    flattened, in blocks of block_size, each code (the first of a byte in its high nibble,
    bitsandbytes' order) mapped through the FP4 or NF4 table times its block's absmax."""
    import numpy as np

    attributes = int_attributes(node)
    k, n, block = attributes["K"], attributes["N"], attributes["block_size"]
    kind = attributes.get("quant_type")
    if kind not in _BNB4_VALUES or attributes.get("transB", 1) != 1:
        raise ValueError(f"quant_type {kind}, transB {attributes.get('transB', 1)} is a layout "
                         "eprun does not read")
    packed = tensors.array(node.input[1]).reshape(-1)
    codes = np.stack([packed >> 4, packed & 0xF], axis=-1).reshape(-1)[:k * n]
    absmax = tensors.array(node.input[2]).astype(np.float32).reshape(-1)
    if codes.size != k * n or absmax.size != -(-k * n // block):
        raise ValueError(f"{packed.size} bytes and {absmax.size} absmax for K {k}, N {n}")
    values = np.asarray(_BNB4_VALUES[kind], np.float32)[codes] * absmax[np.arange(k * n) // block]
    return values.reshape(n, k).T, {"bits": 4, "block_size": block, "symmetric": True,
                                    "accuracy_level": None,
                                    "quant_type": "fp4" if kind == 0 else "nf4"}


# onnx element type -> (bits, signed) of the integer codes a blocked weight holds.
_CODE_TYPES = {21: (4, False), 22: (4, True), 2: (8, False), 3: (8, True), 4: (16, False),
               5: (16, True)}


def _dequantize_blocked(node, tensors, shape: tuple) -> tuple:
    """A DequantizeLinear with a block_size (``(x - zero point) * scale``, one scale and zero
    point per block_size consecutive elements along ``axis``, zero points 0 where none are
    given), or a GatherBlockQuantized table (the same along quantize_axis; a uint8 table packs
    codes of ``bits`` bits along its last axis, lowest first, as MatMulNBits does, with
    2^(bits-1) the zero point where none is given), in float32 and the float weight's
    ``shape``."""
    import numpy as np

    attributes = int_attributes(node)
    gather = node.op_type == "GatherBlockQuantized"
    inputs = [*node.input, "", "", ""]
    data, scale, zero = (inputs[0], inputs[2], inputs[3]) if gather else inputs[:3]
    bits, signed = _CODE_TYPES.get(tensors.elem(data), (None, False))
    if bits is None:
        raise ValueError(f"{_ELEMENT_NAMES.get(tensors.elem(data))} codes are not integers")
    packed = gather and tensors.elem(data) == 2  # MatMulNBits' layout, bits as the attribute
    bits = attributes.get("bits", 4) if packed else bits
    codes = tensors.array(data)
    if packed:
        codes = _unpack_codes(codes, bits, shape[-1])
    codes = codes.astype(np.int64).reshape(shape)
    scales = tensors.array(scale).astype(np.float32)
    zeros = (np.full(scales.shape, 1 << (bits - 1) if packed else 0) if not zero else
             _unpack_codes(tensors.array(zero), bits, scales.shape[-1]) if packed else
             tensors.array(zero))
    zeros = zeros.astype(np.int64).reshape(scales.shape)
    axis = attributes.get("quantize_axis" if gather else "axis", 1) % len(shape)
    block = attributes.get("block_size", 128)
    rows = np.arange(shape[axis]) // block
    values = ((codes - np.take(zeros, rows, axis=axis)).astype(np.float32)
              * np.take(scales, rows, axis=axis))
    return values, {"bits": bits, "block_size": block,
                    "symmetric": _is_midpoint(zeros, bits, signed), "accuracy_level": None,
                    "axis": axis}


def dequantize_blockwise(node, tensors, shape: tuple) -> tuple:
    """``(weight, fields)``: what a weight-only node's weight dequantizes to, as onnxruntime
    computes it, in the float weight's layout (``shape``), and the entry's fields that say how
    it is quantized (``bits``, ``block_size``, ``symmetric``, ``accuracy_level``, ``axis``: the
    one its blocks run along). ``tensors``: the model's initializers (``_Tensors``). A
    ValueError says why a layout is not one eprun reads."""
    if node.op_type == "MatMulNBits":
        values, fields = _dequantize_nbits(node, tensors)
    elif node.op_type == "MatMulBnb4":
        values, fields = _dequantize_bnb4(node, tensors)
    else:
        return _dequantize_blocked(node, tensors, shape)
    return values, {**fields, "axis": 0}


def worst_block(difference, axis: int, block_size: int) -> tuple[int, int, float]:
    """``(row, block, largest |difference|)`` of the block holding the largest difference:
    ``row`` the index over the other axes (flattened; for a MatMul's [K, N] weight, the output
    column), ``block`` the block's index along ``axis``."""
    import numpy as np

    moved = np.moveaxis(np.abs(np.asarray(difference, np.float64)), axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    blocks = -(-rows.shape[1] // block_size)
    padded = np.zeros((rows.shape[0], blocks * block_size))
    padded[:, :rows.shape[1]] = rows
    per_block = padded.reshape(rows.shape[0], blocks, block_size).max(axis=-1)
    row, block = np.unravel_index(int(np.argmax(per_block)), per_block.shape)
    return int(row), int(block), float(per_block[row, block])


def _nibble_codes(tensor, model_path: str):
    """An INT4 or UINT4 initializer's codes (int64, in its dims), from the bytes ONNX packs them
    in (two a byte, the first in the low nibble), inline or external: ``_map_external`` reads
    whole bytes per element."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    if tensor.data_location != TensorProto.EXTERNAL:
        return np.asarray(numpy_helper.to_array(tensor)).astype(np.int64)
    count = math.prod(tensor.dims)
    location = _external_location(tensor)
    path = _safe_location(location.location, model_path)
    require_file(path, "external data")
    data = np.fromfile(path, np.uint8, count=(count + 1) // 2, offset=int(location.offset or 0))
    if data.size != (count + 1) // 2:
        raise EprunError(f"cannot read the weights of {tensor.name!r} from {path!r}: the file "
                         "is shorter than its reference says")
    codes = _unpack_codes(data, 4, count)
    if tensor.data_type == TensorProto.INT4:
        codes = np.where(codes >= 8, codes - 16, codes)
    return codes.reshape(tuple(tensor.dims))


class _Tensors:
    """A model's initializers by name, read when asked for: ``array`` their values (an INT4 or
    UINT4 one's codes), ``elem`` their element type."""

    def __init__(self, tensors: dict, model_path: str) -> None:
        """``tensors``: name -> TensorProto of the model at ``model_path``."""
        self.tensors, self.path = tensors, model_path

    def elem(self, name: str) -> int:
        """The element type of initializer ``name``."""
        return self.tensors[name].data_type

    def array(self, name: str):
        """The values of initializer ``name``; its codes where it packs 4-bit integers."""
        tensor = self.tensors[name]
        if tensor.data_type in (21, 22):
            return _nibble_codes(tensor, self.path)
        return _initializer_array(tensor, self.path)


# onnx element type -> the name numpy (or ml_dtypes) gives it.
_ELEMENT_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
                  7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64",
                  12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
                  16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
                  20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1"}


# == 6. Rendering ==================================================================================

def failure_reasons(failures: list[dict], markdown: bool = False) -> list[str]:
    """Each failed bound of a ``check`` answer, in words: plain for the CI log line
    (``check_verdict``), or for the report's markdown (``_gate_line``), which names what it
    cannot show in a line."""
    reasons = []
    for failure in failures:
        bound = failure["bound"]
        output = f"`{failure.get('output')}`" if markdown else failure.get("output")
        if markdown and bound not in ("tolerance", "min_cos"):
            reasons.append(f"{bound} ({failure.get('output', 'session')})")
            continue
        reason = _REASONS.get(bound, _providers_reason)(failure, output, markdown)
        where = failure.get("iterations_failed")
        if where is not None and not markdown:
            reason += (f" (iteration{'s' if len(where) > 1 else ''} "
                       f"{', '.join(map(str, where))}, worst {failure['iteration']})")
        reasons.append(reason)
    return reasons


def _tolerance_reason(failure: dict, output: str, markdown: bool) -> str:
    """Elements outside the per-element test."""
    reason = (f"{output}: {failure['violations']} of {failure['elements']} elements "
              f"outside atol + rtol{'·' if markdown else '*'}|ref|")
    return reason if markdown else f"{reason}, worst at {failure['worst']['index']}"


def _cosine_reason(failure: dict, output: str, markdown: bool) -> str:
    """A cosine below the bound, or none at all."""
    if not math.isfinite(failure["cosine"]):
        held = sum(failure.get("nonfinite", {}).values())
        return f"{output}: no cosine, the outputs hold {held} NaN or infinite values"
    cosine = _num(failure["cosine"], 6) if markdown else f"{failure['cosine']:.6g}"
    return f"{output}: cosine {cosine} below {failure['min_cos']:g}"


def _statistic_reason(failure: dict, output: str, markdown: bool) -> str:
    """A statistic over both its tolerances."""
    stat = (f"quantile {failure['quantile']:g}" if failure["stat"] == "quantile"
            else failure["stat"])
    return (f"{output}: {stat} |c - r| {failure['abs']:.6g} over atol {failure['atol']:g} and "
            f"{stat} |c - r|/|r| {failure['rel']:.6g} over rtol {failure['rtol']:g}")


def _provider_share_reason(failure: dict, output: str, markdown: bool) -> str:
    """An EP that took too few of the candidate's nodes, or whose share cannot be known."""
    provider = failure["provider"]
    if failure["share"] is None:
        return f"{provider}'s share of the nodes cannot be known: {failure['unknown']}"
    elsewhere = ", ".join(f"{op} x{count}" for op, count in failure["elsewhere"].items())
    return (f"{provider} took {failure['nodes']} of {failure['total']} nodes "
            f"({failure['share']:.3g}, below {failure['min_share']:g})"
            + (f"; elsewhere: {elsewhere}" if elsewhere else ""))


def _providers_reason(failure: dict, output: str, markdown: bool) -> str:
    """A candidate session without the providers asked for."""
    return (f"providers: asked for {','.join(failure['requested'])}, got "
            f"{','.join(failure['actual'])}")


# Each failed bound in words (the rest: the providers').
_REASONS = {
    "tolerance": _tolerance_reason,
    "min_cos": _cosine_reason,
    "shape": lambda failure, output, markdown: (
        f"{output}: shape {failure['candidate']} instead of {failure['reference']}"),
    "error_stat": _statistic_reason,
    "nonfinite": lambda failure, output, markdown: (
        f"{output}: the candidate holds {failure['candidate']} NaN or infinite values"),
    "top_k": lambda failure, output, markdown: (
        f"{output}: top-{failure['k']} agreement "
        + ("unknown (fewer values than K along the axis)" if failure["top_k_agreement"] is None
           else f"{failure['top_k_agreement']:.6g}")
        + f" below {failure['min_top_k_agreement']:g}"),
    "provider_share": _provider_share_reason,
}


def check_verdict(args: argparse.Namespace, answer: dict) -> str | None:
    """Why the gate failed, in one line for the CI log (the JSON answer has the details)."""
    if answer["passed"]:
        return None
    return "check failed: " + "; ".join(failure_reasons(answer["failures"]))


def _gate_line(gate: dict) -> str:
    """The ``check`` verdict as one bullet: what was compared, and why it failed if it did."""
    tolerance = gate["tolerance"]
    reasons = failure_reasons(gate["failures"], markdown=True)
    return (f"- **Gate**: `check` of the int8 model against the fp32 one under the "
            f"{gate['profile']} profile (rtol {tolerance['rtol']:g}, atol {tolerance['atol']:g}, "
            f"cosine ≥ {tolerance['min_cos']:g}) on {_ops(gate['providers']['actual'])}: "
            + ("**passed**." if gate["passed"] else "**failed**: " + "; ".join(reasons) + "."))


def _plain(value: float) -> str:
    """Six significant digits in plain decimal notation (Mermaid's charts take no exponent)."""
    import numpy as np

    return np.format_float_positional(value, precision=6, unique=False, fractional=False,
                                      trim="-")


def _num(value: float | None, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits; ``null`` for None, NaN and infinity."""
    return "null" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _ops(names: list[str]) -> str:
    """Names as a comma-joined list of markdown code spans; ``(none)`` for none."""
    return ", ".join(f"`{name}`" for name in names) if names else "(none)"


def _partition_prose(splits: list[dict], measured: dict, facts: dict) -> str:
    """What the partition table shows, said only as far as the numbers and the graph show it."""
    compute, every_op = splits[0], splits[1]
    int8_compute, int8_float_ops, int8_all = splits[2], splits[3], splits[4]
    names = ", ".join(f"`{op}`" for op in compute["supported"])
    text = (f"With only {names} supported the float model splits into "
            f"{compute['partition_count']} partitions and the int8 model into "
            f"{int8_compute['partition_count']}")
    boundaries = len(measured["layers"]) - 1
    wrapped = boundaries > 0 and all(k in facts["requantized"] for k in range(boundaries))
    if (wrapped and int8_all["partition_count"] == 1
            and int8_float_ops["partition_count"] > every_op["partition_count"]):
        return (text + ": QDQ puts a QuantizeLinear/DequantizeLinear pair between every two "
                "compute ops, so an EP that does not claim Q/DQ hands the tensor back and forth "
                "at each of them; claiming Q/DQ as well is what lets the quantized graph stay "
                "in one piece.")
    return (text + f". Claiming every op type of the float model leaves the float model in "
            f"{every_op['partition_count']} and the int8 model in "
            f"{int8_float_ops['partition_count']} partitions; adding the int8 model's own "
            f"quantization ops gives {int8_all['partition_count']}.")


def _sensitivity_missing(why: str) -> str:
    """The optional section when the ranking could not be made, and why."""
    return "\n".join(["", REPORT_SENSITIVITY_HEADING, "",
                      f"Not measured: {why}", ""])


def _sensitivity_section(ranked: dict) -> str:
    """The optional fifth section of ``ep_report.md`` (``report --sensitivity``)."""
    quantized = ranked["quantized"]
    quantizer = (ranked.get("quantizer") or {}).get("class") or "quantize_static"
    lines = ["", REPORT_SENSITIVITY_HEADING, "",
             ("Each quantized unit restored to float alone ("
              + ("the graph the installed quantize_static writes with it in nodes_to_exclude"
                 if ranked.get("predicted_by") == "quantize_static" else
                 f"the int8 graph edited as {quantizer}'s nodes_to_exclude would leave it"
                 + ("" if quantizer != "quantize_static" else
                    "; the quantizer itself could not be used here"))
              + "), measured on the final output "
             f"`{ranked['output']}` against the fp32 model; the fully quantized model has "
             f"SQNR {_num(quantized['sqnr_db'])} dB, rel error {_num(quantized['rel_error'])}."),
             "", "| rank | unit | op | SQNR (dB) | gain (dB) | rel error |",
             "|---|---|---|---|---|---|"]
    shown = ranked["units"][:10]
    for rank, unit in enumerate(shown, start=1):
        lines.append(f"| {rank} | `{unit['name']}` | {unit['op_type']} | "
                     f"{_num(unit['sqnr_db'])}{' *' if 'inexact' in unit else ''} | "
                     f"{_num(unit['gain_db'])} | {_num(unit['rel_error'])} |")
    recommendation = ranked["recommendation"]
    reached = recommendation["steps"][-1] if recommendation["steps"] else quantized
    if any("inexact" in unit for unit in shown) or "inexact" in reached:
        lines += ["", ("\\* an estimate: quantize_static would calibrate a range from data "
                       "eprun does not have (the unit's `inexact` in the sensitivity answer says "
                       "which; `--calibration` with the int8 model's calibration data makes it "
                       "exact).")]
    lines += ["", f"Recommended `nodes_to_exclude` ({len(recommendation['nodes_to_exclude'])}"
              + ("" if quantizer == "quantize_static" else f", for {quantizer}") + "): "
              f"{_ops(recommendation['nodes_to_exclude'])}; the combined graph reaches "
              + (f"SQNR {_num(reached['sqnr_db'])} dB" if reached["sqnr_db"] is not None
                 else "the fp32 output exactly")
              + (" (an estimate, as above)" if "inexact" in reached else "") + ", and the target "
              f"{'is' if recommendation['met'] else 'is **not**'} met.", ""]
    return "\n".join(lines)


def _report_command(provider_answer: dict, settings_answer: dict,
                    argv: list[str] | None = None) -> str:
    """The command line that wrote the report, every option as typed (``argv``, from
    ``main``), or the equivalent one for a report made by calling ``report`` from Python."""
    import shlex

    if argv and argv[0] == "report":
        program = program_name()
        return shlex.join([*(["python"] if program.endswith(".py") else []), program, *argv])
    return (f"python eprun.py report {provider_answer['model']} {settings_answer['model']} "
            f"--seed {settings_answer['seed']}")


# The report's headings that figures (--save-plots) go under.
REPORT_GROWTH_HEADING = "## 층을 거듭하며 자란 오차"
REPORT_MACHINE_HEADING = "## 이 기계에서만 참인 것"
REPORT_SENSITIVITY_HEADING = "## Sensitivity (optional: report --sensitivity)"


def with_figures(markdown: str, figures: dict) -> str:
    """``markdown`` with each figure (``{heading: relative path}``) linked at the end of the
    section under that heading."""
    lines = markdown.split("\n")
    for heading, path in figures.items():
        if heading not in lines:
            continue
        start = lines.index(heading)
        end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith("## ")),
                   len(lines))
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        target = f"<{path}>" if re.search(r"[\s()<>]", path) else path
        lines[end:end] = ["", f"![{os.path.basename(path)}]({target})"]
    return "\n".join(lines)


def report_markdown(*, provider_answer: dict, splits: list[dict], measured: dict,
                    growth_answer: dict, settings_answer: dict, exposure: dict, gate: dict,
                    facts: dict) -> str:
    """``ep_report.md``: the four headings of the contract, every number from a measurement."""
    made_by = _report_command(provider_answer, settings_answer, facts.get("command_line"))
    lines = [(f"eprun report, generated by `{made_by}`"
              "; the JSON files beside this report hold every number in full precision. Its "
              "headings are in Korean because that is the lab's own report format."), ""]
    lines += _providers_section(provider_answer)
    lines += _partition_section(splits, measured, facts)
    lines += _growth_section(measured, growth_answer, facts)
    lines += _machine_section(provider_answer, settings_answer, exposure, gate)
    return "\n".join(lines)


def _where_ran(answer: dict) -> str:
    """Where a section's sessions ran, in words: the contract's CPU, or each side's providers
    and the nodes they took (``providers`` record)."""
    record = answer.get("providers")
    if record is None:
        return "on the CPU provider"

    def side(actual: list[str], nodes: dict | None) -> str:
        """The providers a side got, with the nodes each took where known."""
        took = (" (" + ", ".join(f"{count} nodes on {name}" for name, count in nodes.items())
                + ")") if nodes else ""
        return f"{_ops(actual)}{took}"

    fell = " — **a fallback**: not what was asked for" if record.get("missing") else ""
    reference = side(record["reference"], record.get("reference_nodes_per_provider"))
    candidate = side(record["actual"], record.get("nodes_per_provider"))
    return f"the fp32 model on {reference}, the int8 model on {candidate}{fell}"


def _providers_section(provider_answer: dict) -> list[str]:
    """What was requested and what each session got."""
    import onnxruntime

    available = provider_answer["available"]
    fell_back = [case for case in provider_answer["cases"] if case["fell_back"]]
    errors = [case for case in provider_answer["cases"] if case["error"]]
    lines = ["## 무엇을 요청했고 무엇을 쥐었나", "",
             (f"This onnxruntime ({onnxruntime.__version__}) offers **{len(available)}** "
             f"execution providers: {_ops(available)}. Each requested list below got its own "
             f"session on `{provider_answer['model']}` (`providers.json`)."), "",
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
    return lines


def _partition_section(splits: list[dict], measured: dict, facts: dict) -> list[str]:
    """Where the graph splits, for each op list the report tried."""
    lines = ["## 그래프가 쪼개지는 자리", "",
              ("A simulation in file order, not real placement: a node is the EP's when its op "
              "type is in the supported list, and each run of consecutive nodes with one owner "
              "is one partition (`eprun.py partition`)."), "",
              "| model | supported ops | nodes | claimed by EP | partitions | hand-offs |",
              "|---|---|---|---|---|---|"]
    for split in splits:
        lines.append(f"| `{split['model']}` | {_ops(split['supported'])} | {split['nodes']} | "
                     f"{split['claimed']} | {split['partition_count']} | {split['handoffs']} |")
    lines += ["", _partition_prose(splits, measured, facts), ""]
    return lines


def _growth_section(measured: dict, growth_answer: dict, facts: dict) -> list[str]:
    """The error at every boundary, how it grew, and its chart."""
    rel_error = growth_answer["rel_error"]
    ratios = [None] + growth_answer["ratios"]
    drawn = [item for item in measured.get("inputs", ()) if item["source"] != "file"]
    fed = (f"`default_rng({measured['seed']}).standard_normal(({measured['rows']}, F))`"
           if "inputs" not in measured else
           (f"one `default_rng({measured['seed']})` in input order: " if drawn else
            "the inputs file's arrays: ") + "; ".join(
               f"`{item['name']}` {item['dtype']} {item['shape']} from {item['source']}"
               for item in measured["inputs"]))
    paired = ("the int8 tensor of the fp32 one's name" if measured.get("pairing") == "name" else
              f"the k-th tensor of each model{'' if facts['in_order'] else ' named after it'}")
    lines = [REPORT_GROWTH_HEADING, "",
              (f"Input: {fed}, both models exposed in memory and run {_where_ran(measured)} "
              f"with default session options; boundary k pairs {paired} (`growth.json`)."), "",
              ("| boundary | fp32 tensor | int8 tensor | max abs error | scale | rel error | "
              "cos min | ratio to previous | clipped |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for entry, ratio in zip(measured["layers"], ratios):
        clipped = entry.get("clipped")
        lines.append(f"| {entry['index']} | `{entry['fp32']}` | `{entry['int8']}` | "
                     f"{_num(entry['max_abs_error'])} | {_num(entry['scale'])} | "
                     f"{_num(entry['rel_error'])} | {_num(entry['cos_min'], 6)} | "
                     f"{'—' if entry['index'] == 0 or ratio is None else _num(ratio)} | "
                     f"{'—' if clipped is None else f'{clipped:.2%}'} |")
    lines += ["", _clipping_prose(measured["layers"])]
    lines += _growth_prose(measured, growth_answer, facts)
    if _drawable(rel_error):
        lines += _growth_chart(measured, growth_answer, facts)
    lines.append("")
    return lines


def _growth_prose(measured: dict, growth_answer: dict, facts: dict) -> list[str]:
    """How the error grew, in words: the total, the largest jump, monotone or where not."""
    rel_error = growth_answer["rel_error"]
    total = growth_answer["total_growth"]
    since = growth_since_first_error(rel_error) if total is None else None
    jump = growth_answer["max_ratio"]
    drops = [k for k in range(1, len(rel_error)) if not rel_error[k] >= rel_error[k - 1]]
    lines = ["", f"Total growth factor, last relative error over the first: **{_num(total)}** "
             f"(`total_growth` = {total!r} in `growth.json`): the error "
             f"{'grew' if total > 1 else 'shrank' if total < 1 else 'stayed the same'}."
             if total is not None else
             f"Total growth factor: null ({_no_growth_why(rel_error)})"
             + (f"; from boundary {since['index']}, the first with an error, the last relative "
                f"error is **{_num(since['total_growth'])}** times that one"
                + (" (`growth_from_first_error` in `growth.json`)."
                   if "growth_from_first_error" in growth_answer else ".")
                if since else "."), ""]
    if jump:
        lines.append(f"Largest jump: into boundary {jump['index']} "
                     f"(`{measured['layers'][jump['index']]['fp32']}`), ×{_num(jump['ratio'])}.")
    lines.append("Growth was monotone: the relative error never decreased." if not drops else
                 "Growth was not monotone: the relative error fell at boundar"
                 f"{'y' if len(drops) == 1 else 'ies'} {', '.join(map(str, drops))}"
                 + (" (the int8 model requantizes each of those tensors with its own "
                    "scale)."
                    if set(drops) <= set(facts["requantized"]) else "."))
    return lines


def _growth_chart(measured: dict, growth_answer: dict, facts: dict) -> list[str]:
    """The relative error per boundary as a mermaid chart (the local one beside it where it
    was measured at every boundary), and the SVG chart's link."""
    rel_error = growth_answer["rel_error"]
    local = _drawable(growth_answer.get("local_rel_error"))
    names = [entry["fp32"].replace('"', "'") for entry in measured["layers"]]
    top = max([*rel_error, *(local or [])]) * 1.1 or 1.0
    lines = ["", "```mermaid", "xychart-beta",
             '    title "Relative error per boundary (int8 vs fp32)"',
             "    x-axis \"fp32 tensor at the boundary\" ["
             + ", ".join(f'"{name}"' for name in names) + "]",
             f'    y-axis "max abs error / scale" 0 --> {_plain(top)}',
             "    line [" + ", ".join(map(_plain, rel_error)) + "]",
             *(["    line [" + ", ".join(map(_plain, local)) + "]"] if local else []),
             "```"]
    if growth_answer.get("local_rel_error") and not local:
        lines += ["", ("The local error is not drawn: it was not measured at every "
                       "boundary (`local_unavailable` in `growth.json`).")]
    if local:
        lines += ["", ("The first line is the accumulated relative error; the second is "
                       "the local one, each segment of the int8 model fed the fp32 values "
                       "at its input (`report --local`): where the first rises and the "
                       "second does not, the layer only inherits.")]
    if facts.get("chart"):
        lines += ["", f"![Relative error per boundary]({facts['chart']})"]
    return lines


def _drawable(values: list | None) -> list | None:
    """``values`` if every one is a finite number (a chart can draw them), else None."""
    if values and all(value is not None and math.isfinite(value) for value in values):
        return values
    return None


# One piece: one drawing, top to bottom; every element reads the same layout (``x``, ``y``,
# the margins), and the file reads in the order the SVG's elements are written.
def growth_svg(measured: dict, growth_answer: dict) -> str:
    """The growth chart as a standalone SVG (``report --chart svg``), for viewers that do not
    render Mermaid: relative error per boundary from 0, the fp32 tensor names under the x axis
    (shortened, the full name as the point's tooltip), and the local error as a dashed line
    where it was measured."""
    from html import escape

    series = [("accumulated rel error", growth_answer["rel_error"], "#c0392b", "")]
    local = growth_answer.get("local_rel_error")  # the points measured; a gap where not
    if local and any(value is not None and math.isfinite(value) for value in local):
        series.append(("local rel error", local, "#2471a3", ' stroke-dasharray="6 4"'))
    names = [entry["fp32"] for entry in measured["layers"]]
    drawn = [value for _, values, _, _ in series for value in values
             if value is not None and math.isfinite(value)]
    top = _nice_ceiling(max(drawn) if drawn else 1.0)
    width, height, left, right, upper, lower = 760, 420, 70, 20, 40, 150
    plot_w, plot_h = width - left - right, height - upper - lower
    step = plot_w / max(len(names) - 1, 1)

    def x(k: int) -> float:
        """The chart's x coordinate of boundary ``k``."""
        return left + (k * step if len(names) > 1 else plot_w / 2)

    def y(value: float) -> float:
        """The chart's y coordinate of a relative error."""
        return upper + plot_h * (1 - value / top)

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" data-generator="eprun" '
              f'width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">'),
             f'<rect width="{width}" height="{height}" fill="white"/>',
             (f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">Relative '
              'error per boundary (int8 vs fp32)</text>')]
    for tick in range(5):
        value = top * tick / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" '
                     f'y2="{y(value):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f'{_plain(value)}</text>')
    parts.append(f'<text x="16" y="{upper + plot_h / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {upper + plot_h / 2})">max abs error / scale</text>')
    for k, name in enumerate(names):
        short = name if len(name) <= 24 else name[:11] + "…" + name[-12:]
        parts.append(f'<text x="{x(k):.1f}" y="{upper + plot_h + 14}" text-anchor="end" '
                     f'transform="rotate(-40 {x(k):.1f} {upper + plot_h + 14})">'
                     f'<title>{escape(name)}</title>{k}: {escape(short)}</text>')
    for index, (label, values, colour, dash) in enumerate(series):
        points = [(x(k), y(value)) for k, value in enumerate(values)
                  if value is not None and math.isfinite(value)]
        if len(points) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
                         'points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in points) + '"/>')
        for k, value in enumerate(values):
            if value is not None and math.isfinite(value):
                parts.append(f'<circle cx="{x(k):.1f}" cy="{y(value):.1f}" r="3.5" '
                             f'fill="{colour}"><title>{escape(names[k])}: {label} '
                             f'{_plain(value)}</title></circle>')
        parts.append(f'<line x1="{left + 10 + 190 * index}" x2="{left + 40 + 190 * index}" '
                     f'y1="{height - 14}" y2="{height - 14}" stroke="{colour}" '
                     f'stroke-width="2"{dash}/>')
        parts.append(f'<text x="{left + 46 + 190 * index}" y="{height - 10}">{label}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{upper}" y2="{upper + plot_h}" '
                 'stroke="black"/>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{upper + plot_h}" '
                 f'y2="{upper + plot_h}" stroke="black"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``value`` (> 0)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(power * factor for factor in (1, 2, 2.5, 5, 10) if power * factor >= value)


def _clipping_prose(entries: list[dict]) -> str:
    """What the ``clipped`` column says: where the int8 range first cuts off fp32 values."""
    clipping = [entry for entry in entries if entry.get("clipped")]
    if all(entry.get("clipped") is None for entry in entries):
        return ("`clipped` is the share of the fp32 values outside the range the int8 model's "
                "QuantizeLinear at that boundary can represent; no boundary here has one with "
                "a scale and zero point eprun reads (a weight-only twin quantizes no "
                "activation), so nothing was measured.")
    if not clipping:
        return ("`clipped` is the share of the fp32 values outside the range the int8 model's "
                "QuantizeLinear at that boundary can represent (its calibration range); none "
                "is clipped here, so the error is rounding, not saturation.")
    first = clipping[0]
    return ("`clipped` is the share of the fp32 values outside the range the int8 model's "
            "QuantizeLinear at that boundary can represent (its calibration range). The "
            f"damage starts at boundary {first['index']} (`{first['fp32']}`): "
            f"{first['clipped']:.2%} of its values are clipped there, so part of its error is "
            "saturation, not rounding"
            + (f"; boundar{'ies' if len(clipping) > 2 else 'y'} "
               f"{', '.join(str(entry['index']) for entry in clipping[1:])} clip too."
               if len(clipping) > 1 else "."))


def _exposure_line(exposure: dict | None) -> str:
    """Did exposing the int8 boundaries move the final output where the table was measured?"""
    head = ("- **Exposure**: exposing the int8 boundary tensors as outputs can change which "
            "fused kernels onnxruntime picks (a DequantizeLinear whose output is a graph "
            "output cannot be folded into a QLinearMatMul).")
    if exposure is None or exposure.get("max_abs_diff") is None:
        return (head + " It was not measured here: the table's sessions did not run where "
                "they were asked to, or the output is not one of the plain model's.")
    return (head + f" Here the exposed int8 model's final output `{exposure['output']}` was "
            + ("bitwise equal to the plain model's, so the error table describes the model "
               "as deployed."
               if exposure["bitwise_equal"] else
               f"**not** equal to the plain model's (max abs diff "
               f"{_num(exposure['max_abs_diff'])}): the error table describes the exposed "
               "graph, whose kernels differ from the model as deployed."))


def _machine_section(provider_answer: dict, settings_answer: dict, exposure: dict | None,
                     gate: dict) -> list[str]:
    """What holds on this machine only: providers, software, settings, exposure, the gate."""
    import platform

    import numpy
    import onnxruntime

    available = provider_answer["available"]
    base = settings_answer["baseline"]
    differing = [case for case in settings_answer["cases"] if not case["bitwise_equal"]]
    lines = [REPORT_MACHINE_HEADING, "",
              ("These results hold for this machine's provider set and settings, and may differ "
              "elsewhere:"), "",
              (f"- **Providers**: {len(available)} available ({_ops(available)}). Which lists fell "
              "back, and to what, is a property of this onnxruntime build: on a machine with "
              "CUDA the CUDA request would hold."),
              (f"- **Software**: onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}, "
              f"Python {platform.python_version()} on {platform.machine() or 'unknown'} with "
              f"{os.cpu_count()} logical CPUs. The error table used onnxruntime's default "
              "session options (all graph optimizations, default thread count); other kernels "
              "round differently, so the error values in the last digits are this stack's."),
              "- **Settings** (`settings.json`, int8 model"
              + (f" on {_ops(settings_answer['providers']['actual'])}"
                 if "providers" in settings_answer else "")
              + f", seed {settings_answer['seed']}): "
              + ("all three cases (ORT_ENABLE_ALL with 1 thread, ORT_DISABLE_ALL with 2, "
                 "ORT_ENABLE_ALL with 2) were bitwise equal to the single-threaded unoptimized "
                 "baseline here. That is a measurement of this machine, not a guarantee."
                 if not differing else
                 "these cases differed from the single-threaded unoptimized baseline: "
                 + "; ".join(f"{case['level']} with {case['intra_op']} "
                             f"thread{'' if case['intra_op'] == 1 else 's'} (max abs diff "
                             f"{_num(case['max_abs_diff'])})" for case in differing) + "."),
              (f"  Baseline output: max |y| = {_num(base['max_abs_output'])}, "
              f"mean = {_num(base['mean_output'])}."),
              _exposure_line(exposure),
              _gate_line(gate),
              ("- **No timing was measured.** Nothing here says anything about speed; latency on "
              "this machine would not carry over to an accelerator anyway."), ""]
    return lines


# -- Model Explorer node data ----------------------------------------------------------------------

# Colours of a number's scale, from the good end to the bad one, and of each provider or owner.
_SCALE = ((0.0, (0x1a, 0x98, 0x50)), (0.5, (0xfe, 0xe0, 0x8b)), (1.0, (0xd7, 0x30, 0x27)))


def explorer_node_ids(graph) -> list[str]:
    """The id Model Explorer's ONNX adapter (model-explorer-onnx 0.4.2) shows for each node of
    the main graph, in file order: the node's name as onnx-ir's ``NameFixPass`` leaves it. That
    pass walks every node depth first (a node, then the nodes of its subgraphs), each graph a
    scope of its own for node names and one counter of suffixes for the whole walk: an unnamed
    node is called ``node``, and a name already taken in its graph gets ``_1``, ``_2`` ... (the
    counter of that name), so an unnamed node's id depends on every name before it."""
    counter: collections.Counter = collections.Counter()
    main: list[str] = []

    def unique(preferred: str, used: set) -> str:
        """``preferred``, or the next of its numbered names the scope has not used (one counter
        for every scope, as the adapter's)."""
        name = preferred
        while name in used:
            counter[preferred] += 1
            name = f"{preferred}_{counter[preferred]}"
        used.add(name)
        return name

    def walk(graph, top: bool) -> None:
        """Name ``graph``'s nodes as the adapter does, depth first; ``top``: the main graph,
        whose nodes' ids are the answer."""
        used: set = set()
        for node in graph.node:
            name = unique(node.name or "node", used)
            if top:
                main.append(name)
            for attribute in node.attribute:
                for body in ([attribute.g] if attribute.HasField("g") else []) + \
                        list(attribute.graphs):
                    walk(body, False)

    walk(graph, True)
    return main


def explorer_producers(graph) -> dict[str, str]:
    """``{tensor: node id}``: the node Model Explorer's ONNX adapter draws as writing each
    tensor of the main graph. A graph input is a node of its own (``[value] NAME``); an If's
    outputs come from the ``(Phi)`` node (``<If's id>_phi``) the adapter adds where it draws
    the If's branches inline."""
    ids = explorer_node_ids(graph)
    found = {value.name: f"[value] {value.name}" for value in graph.input}
    for node, node_id in zip(graph.node, ids):
        inline = node.op_type == "If" and node.domain in ("", "ai.onnx")
        for output in node.output:
            if output:
                found[output] = f"{node_id}_phi" if inline else node_id
    return found


def explorer_graph_id(graph) -> str:
    """The id of the main graph in Model Explorer's ONNX adapter: its name (empty too), or
    ``<main>`` for a graph without the field."""
    return graph.name if graph.HasField("name") else "<main>"


def _hex(rgb: tuple) -> str:
    """``(r, g, b)`` as a CSS colour, ``#rrggbb``."""
    return "#" + "".join(f"{round(channel):02x}" for channel in rgb)


def _scale_colour(position: float) -> str:
    """The colour at ``position`` (0 good, 1 bad) of the green-yellow-red scale."""
    position = min(1.0, max(0.0, position))
    for (start, low), (end, high) in zip(_SCALE, _SCALE[1:]):
        if position <= end:
            t = (position - start) / (end - start)
            return _hex(tuple(a + (b - a) * t for a, b in zip(low, high)))
    return _hex(_SCALE[-1][1])


def owner_colour(label: str) -> str:
    """One fixed colour per provider or owner (the label's first word), in every file."""
    word = label.split(maxsplit=1)[0] if label.strip() else label
    if word in _OWNER_COLOURS:
        return _OWNER_COLOURS[word]
    import zlib

    return _OTHER_COLOURS[zlib.crc32(word.encode("utf-8", "surrogateescape"))
                          % len(_OTHER_COLOURS)]


def number_colours(values: list[float], higher_is_better: bool = False) -> list[str]:
    """A colour per value on a scale that fits them: green at the best, red at the worst,
    logarithmic where positive values span more than two decades."""
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return [_scale_colour(1.0) for _ in values]
    low, high = min(finite), max(finite)
    logarithmic = low > 0 and high / low > 100
    if logarithmic:
        low, high = math.log10(low), math.log10(high)

    def position(value: float) -> float:
        """Where ``value`` sits on the colour scale, 0 to 1 (a non-finite value at the worst
        end)."""
        if not math.isfinite(value):
            return 1.0
        point = math.log10(value) if logarithmic else value
        where = 0.5 if high == low else (point - low) / (high - low)
        return 1.0 - where if higher_is_better else where

    return [_scale_colour(position(value)) for value in values]


def higher_is_better(quantity: str) -> bool:
    """Are ``quantity``'s larger values the better ones (the colours run the other way)?"""
    metric = quantity_of(quantity)
    return metric is not None and metric.higher_is_better


def node_data(graph, quantity: str, values: dict) -> tuple[dict, int]:
    """Model Explorer's node data (the shape ``model_explorer.node_data_builder`` writes: graph
    id -> ``results`` keyed by node id, with a ``gradient`` for numbers) of ``values``, keyed
    by tensor (placed on the node the adapter draws writing it) or by ``("node", index)`` (the
    main graph's node at that position); ``(data, count of values with no node to sit on)``.
    Numbers get colours from green (good) to red (bad); strings one colour per owner."""
    better = higher_is_better(quantity)
    results, counts = _placed_values(graph, values, better)
    numbered = [entry for entry in results.values() if not isinstance(entry["value"], str)]
    data: dict = {"name": quantity, "results": results}
    if numbered:
        numbers = [entry["value"] for entry in numbered]
        for entry, colour in zip(numbered, number_colours(numbers, better)):
            entry["bgColor"] = colour
        finite = [value for value in numbers if math.isfinite(value)]
        if not (finite and min(finite) > 0 and max(finite) / min(finite) > 100):
            ends = (_SCALE[-1][1], _SCALE[0][1]) if better else (_SCALE[0][1], _SCALE[-1][1])
            data["gradient"] = [{"stop": 0, "bgColor": _hex(ends[0])},
                                {"stop": 0.5, "bgColor": _hex(_SCALE[1][1])},
                                {"stop": 1, "bgColor": _hex(ends[1])}]
    for entry in results.values():
        if entry["value"] == NON_FINITE:
            entry["bgColor"] = "#7f0000"
        elif isinstance(entry["value"], str):
            entry["bgColor"] = owner_colour(entry["value"])
    return {explorer_graph_id(graph): data}, counts


def _placed_values(graph, values: dict, better: bool) -> tuple[dict[str, dict], dict]:
    """``({node id: {"value"}}, counts)``: each value on the node that writes its tensor (or
    the node at its index), the worst where several share a node, ``NON_FINITE`` for NaN or
    infinity; ``counts`` of those unplaced, shared and non-finite (``lost``)."""
    producers = explorer_producers(graph)
    ids = explorer_node_ids(graph)
    results: dict[str, dict] = {}
    counts = {"unplaced": 0, "shared": 0, "lost": 0}
    for key, given in values.items():
        if isinstance(key, tuple):
            node_id = ids[key[1]] if 0 <= key[1] < len(ids) else None
        else:
            node_id = producers.get(key)
        if node_id is None:
            counts["unplaced"] += 1
            continue
        value = given
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            value = NON_FINITE  # NaN or infinity got into it: shown, in the worst colour
            counts["lost"] += 1
        if node_id in results:  # one node, several values: it shows the worst
            counts["shared"] += 1
            value = _worse(results[node_id]["value"], value, better)
        results[node_id] = {"value": value}
    return results, counts


# What a node shows for a value that NaN or infinity got into (null in the answer).
NON_FINITE = "non-finite"


def _worse(first, second, higher_is_better: bool):
    """The worse of two values for one node: a non-finite one, else by the quantity's sense
    (strings: the first)."""
    if NON_FINITE in (first, second):
        return NON_FINITE
    if isinstance(first, str) or isinstance(second, str):
        return first
    return min(first, second) if higher_is_better else max(first, second)


class NodeDataWriter:
    """``--node-data DIR``: each command's node-data files, one per model and quantity, named
    ``<model file stem>.<quantity>.json`` (the stem qualified by the model's role where two
    models share it), staged into DIR (created if missing) and committed together."""

    def __init__(self, folder: str, models: dict[str, str]) -> None:
        """Files for ``models`` (role -> path) in ``folder``, named by model stem, or by stem and
        role where two stems are alike (in any case); nothing written yet."""
        self.folder = folder
        stems = {role: _model_stem(path) for role, path in models.items()}
        self.shared = len({stem.lower() for stem in stems.values()}) < len(stems)
        self.stems = {role: f"{stem}.{role}" if self.shared else stem
                      for role, stem in stems.items()}
        self.files: list[tuple[str, bytes]] = []
        self.counts = {"unplaced": 0, "shared": 0, "lost": 0}
        self.models = models

    def add(self, role: str, graph, quantity: str, values: dict) -> None:
        """Keep the file of one model's ``quantity``: ``values`` placed on the nodes of ``graph``
        (``node_data``), its counts added up for the notes ``write`` gives."""
        import json

        data, counts = node_data(graph, quantity, values)
        for key, count in counts.items():
            self.counts[key] += count
        path = os.path.join(self.folder, f"{self.stems[role]}.{quantity}.json")
        self.files.append((path, (json.dumps(_strict(data), indent=1, allow_nan=False)
                                  + "\n").encode()))

    def write(self) -> dict:
        """Write every file (all or none); the answer's fields."""
        write_into(self.folder, self.files, tuple(self.models.values()))
        unplaced, shared, lost = (self.counts[key] for key in ("unplaced", "shared", "lost"))
        if unplaced:
            note(f"--node-data: {unplaced} value{'s' if unplaced > 1 else ''} had no node to "
                 "sit on in Model Explorer's drawing of the main graph (a tensor inside a "
                 "subgraph, a node onnxruntime fused, renamed or reported without a name) and "
                 f"{'were' if unplaced > 1 else 'was'} left out")
        if shared:
            note(f"--node-data: {shared} value{'s' if shared > 1 else ''} fell on a node that "
                 "already had one (a node writing several boundaries, or reading several "
                 "weights): each such node shows the worst")
        if lost:
            note(f"--node-data: {lost} value{'s' if lost > 1 else ''} had NaN or infinity in "
                 f"{'them' if lost > 1 else 'it'} (null in the answer): shown as "
                 f"{NON_FINITE!r}, in dark red")
        fields: dict = {"node_data": [path for path, _ in self.files]}
        if self.shared:
            fields["node_data_note"] = ("the models share a file name, so each file name "
                                        "carries the model's role: "
                                        + ", ".join(f"{stem} for {self.models[role]}"
                                                    for role, stem in self.stems.items()))
        return fields


def _model_stem(path: str) -> str:
    """A model file's name without its ``.onnx``: what its output files are named after."""
    name = os.path.basename(path)
    return name[:-len(".onnx")] if name.lower().endswith(".onnx") else name


# -- plots (matplotlib, only when asked for) -------------------------------------------------------

# Boundary names shown on a plot's axis at most; a longer model shows every k-th.
PLOT_LABELS = 24


def require_plots(save_plots: str | None, plot_format: str | None = None) -> None:
    """Before anything is measured: ``--save-plots`` needs matplotlib (the ``plots`` extra),
    importable, and a folder eprun can write into; ``--plot-format`` needs ``--save-plots``."""
    if save_plots is None:
        if plot_format is not None:
            raise EprunError("--plot-format says how --save-plots draws; give --save-plots DIR",
                             EXIT_USAGE)
        return
    require_folder_named(save_plots, "--save-plots")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise EprunError(f"--save-plots needs matplotlib, which {sys.executable} does not "
                         "have: pip install 'eprun[plots]' (or pip install matplotlib)",
                         EXIT_USAGE)
    try:
        import matplotlib.figure  # noqa: F401 (an install that is there but broken)
    except Exception as exc:
        raise EprunError(f"--save-plots needs matplotlib, which {sys.executable} has but "
                         f"cannot import ({type(exc).__name__}: {one_line(exc)}): reinstall "
                         "it with pip install --force-reinstall 'eprun[plots]'",
                         EXIT_USAGE) from exc
    require_out_dir(save_plots, "--save-plots")


# matplotlib settings of every figure, whatever the user's matplotlibrc says (and the
# settings of a program that imports eprun are left as they were: no pyplot, no backend)
PLOT_STYLE = {"svg.hashsalt": "eprun", "figure.dpi": 100, "savefig.dpi": 100, "font.size": 9,
              "font.family": "DejaVu Sans", "axes.unicode_minus": False}


class PlotWriter:
    """``--save-plots DIR``: figures drawn with matplotlib (imported here, never on the
    start-up path), named ``<model stem>.<command>.<what>.<png|svg>``, the same bytes on a
    rerun with the same stack (no date, no version, a fixed SVG id salt), written into DIR
    (created if missing) all or none."""

    def __init__(self, folder: str, stem_of: str, command: str, form: str | None = None
                 ) -> None:
        """Figures of ``command``, named after ``stem_of``'s model file, drawn as ``form`` (png
        unless given) for ``folder``; nothing drawn yet."""
        self.folder, self.form = folder, form or "png"
        self.prefix = f"{_model_stem(stem_of)}.{command}"
        self.files: list[tuple[str, bytes]] = []

    def style(self):
        """The settings every figure is drawn and saved under (``PLOT_STYLE``)."""
        import matplotlib

        return matplotlib.rc_context(PLOT_STYLE)

    def figure(self, size: tuple[float, float]):
        """A new figure of ``size`` inches and its one axes, outside pyplot (no global state)."""
        from matplotlib.figure import Figure

        figure = Figure(figsize=size)
        return figure, figure.subplots()

    def add(self, what: str, figure) -> str:
        """Render ``figure`` into bytes, kept for ``write`` as ``<prefix>.<what>.<form>``;
        return its path."""
        import io

        buffer = io.BytesIO()
        metadata = ({"Software": None} if self.form == "png" else
                    {"Date": None, "Creator": None})
        figure.savefig(buffer, format=self.form, metadata=metadata, bbox_inches="tight")
        path = os.path.join(self.folder, f"{self.prefix}.{what}.{self.form}")
        self.files.append((path, buffer.getvalue()))
        return path

    def write(self, like: tuple[str, ...]) -> list[str]:
        """Write every figure added into the folder (created if missing), all or none, with
        permissions no wider than ``like``'s; their paths."""
        write_into(self.folder, self.files, like)
        return [path for path, _ in self.files]

    def stage(self, like: tuple[str, ...]) -> tuple[list, list]:
        """The files staged (see ``stage``), not yet visible, and the folders made for them:
        for a caller that commits them with other files, or discards both."""
        return stage_into(self.folder, self.files, like)


def _thinned(names: list[str]) -> tuple[list[int], list[str]]:
    """Positions and labels for an axis of boundary names, every k-th one for a long model."""
    step = max(1, math.ceil(len(names) / PLOT_LABELS))
    picked = list(range(0, len(names), step))
    return picked, [names[k] if len(names[k]) <= 28 else names[k][:27] + "…" for k in picked]


def _spans_decades(values: list) -> bool:
    """Do the (all positive) values span more than two decades, so a log axis reads them?"""
    finite = [value for value in values if isinstance(value, (int, float))
              and math.isfinite(value) and value > 0]
    return bool(finite) and len(finite) == len([v for v in values if v is not None]) and \
        max(finite) / min(finite) > 100


def plot_boundaries(writer: PlotWriter, answer: dict, metric: str, growth: dict) -> str:
    """The chosen metric per boundary (a log axis where it spans decades), where the error is
    born (the first divergence) and where it jumps most (the largest ratio lands) marked, the
    local and inherited parts stacked where ``--local`` measured them."""
    with writer.style():
        return _draw_boundaries(writer, answer, metric, growth)


def _draw_boundaries(writer: PlotWriter, answer: dict, metric: str, growth: dict) -> str:
    """``plot_boundaries``' figure, drawn under the style its caller holds; the path it gets."""
    entries = answer["layers"]
    names = [entry["fp32"] for entry in entries]
    values = [entry.get(metric) for entry in entries]
    figure, axes = writer.figure((max(6.0, min(16.0, 0.35 * len(entries) + 4)), 4))
    positions = list(range(len(entries)))
    local = growth.get("local_rel_error") if metric == "rel_error" else _local_values(
        entries, metric)
    if local:
        own = [value if value is not None else 0.0 for value in local]
        inherited = [max(0.0, (total or 0.0) - part) for total, part in zip(values, own)]
        axes.bar(positions, own, color="#d73027", label="local (born in this layer)")
        axes.bar(positions, inherited, bottom=own, color="#fdae61",
                 label="inherited from before")
    else:
        axes.plot(positions, [math.nan if value is None else value for value in values],
                  marker="o", color="#2c7bb6", label=metric)
    described = quantity_of(metric)
    if _spans_decades(values) and described is not None and described.log_scale:
        axes.set_yscale("log")
    _mark_boundaries(axes, answer, values, growth, metric)
    picked, labels = _thinned(names)
    axes.set_xticks(picked)
    axes.set_xticklabels(labels, rotation=60, ha="right")
    axes.set_xlabel("boundary (fp32 name)")
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} per boundary")
    axes.legend(loc="best", fontsize=8)
    axes.grid(True, alpha=0.3)
    return writer.add(metric, figure)


def _local_values(entries: list[dict], metric: str) -> list | None:
    """``metric`` of each boundary's local segment (``--local``), where it is an error that
    adds up (lower is better) and was measured; None otherwise (an SQNR is not stacked)."""
    if higher_is_better(metric) or not any(metric in (entry.get("local") or {})
                                           for entry in entries):
        return None
    return [(entry.get("local") or {}).get(metric) for entry in entries]


def _mark_boundaries(axes, answer: dict, values: list, growth: dict, metric: str) -> None:
    """The boundaries worth a mark: where the error is born, where the relative error jumps
    most (named so under another ``metric``), and a band on each whose value NaN or infinity
    got into."""
    born = (answer.get("first_divergence") or first_divergence(answer["layers"])
            or {}).get("index")
    if born is not None:
        axes.axvline(born, color="#1a9850", linestyle="--", linewidth=1,
                     label=f"born: boundary {born}")
    jump = growth.get("max_ratio")  # its index: the boundary the jump lands on
    if jump:
        whose = "" if metric == "rel_error" else "rel_error "
        axes.axvline(jump["index"], color="#d73027", linestyle=":", linewidth=1.5,
                     label=f"largest {whose}jump: x{jump['ratio']:.3g} at boundary "
                           f"{jump['index']}")
    lost = [k for k, value in enumerate(values) if value is None]
    for k in lost:  # NaN or infinity got into it: drawn as a band, never left out unseen
        axes.axvspan(k - 0.4, k + 0.4, color="#7f0000", alpha=0.25,
                     label="non-finite" if k == lost[0] else None)


def plot_settings(writer: PlotWriter, answer: dict) -> str:
    """One bar per case: its largest difference from the baseline's output."""
    with writer.style():
        return _draw_settings(writer, answer)


def _draw_settings(writer: PlotWriter, answer: dict) -> str:
    """``plot_settings``' figure, drawn under the style its caller holds; the path it gets."""
    cases = answer["cases"]
    labels = [f"{case['ep_option']['key']}={case['ep_option']['value']}" if "ep_option" in case
              else f"{case['level']}\n{case['intra_op']} thread"
              + ("s" if case["intra_op"] > 1 else "") for case in cases]
    diffs = [case["max_abs_diff"] if case["max_abs_diff"] is not None else math.nan
             for case in cases]
    figure, axes = writer.figure((6, 3.5))
    colours = ["#1a9850" if case.get("bitwise_equal") else "#d73027" for case in cases]
    axes.bar(range(len(cases)), diffs, color=colours)
    axes.set_xticks(range(len(cases)))
    axes.set_xticklabels(labels, fontsize=8)
    baseline = answer["baseline"]
    axes.set_ylabel("max |case - baseline|")
    axes.set_title(f"against {baseline['level']}, {baseline['intra_op']} thread "
                   "(green: bitwise equal)")
    axes.grid(True, axis="y", alpha=0.3)
    return writer.add("max_abs_diff", figure)


def plot_check(writer: PlotWriter, compared: list[tuple[str, Any, Any]]) -> list[str]:
    """``check``'s pictures of each ``(output, reference, candidate)``: its error against the
    reference's magnitude (Polygraphy's error-metrics plot), and for an output of rank 2 or more
    a heatmap of ``|c - r|`` (rows: every axis but the last)."""
    paths = []
    with writer.style():
        for name, reference, candidate in compared:
            paths.append(_draw_error_metrics(writer, name, reference, candidate))
            if getattr(reference, "ndim", 0) >= 2 and reference.shape == candidate.shape:
                paths.append(_draw_error_heatmap(writer, name, reference, candidate))
    return paths


def _plot_name(output: str) -> str:
    """An output's name as a part of a file name: what a path cannot hold becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", output) or "output"


def _draw_error_metrics(writer: PlotWriter, name: str, reference, candidate) -> str:
    """``|c - r|`` and ``|c - r| / |r|`` against ``|r|``, each element a point."""
    import numpy as np

    r, _, diff = differences(reference, candidate)
    magnitude = np.abs(r).ravel()
    with np.errstate(all="ignore"):
        relative = (diff / np.where(r == 0, _POLYGRAPHY_EPSILON, np.abs(r))).ravel()
    figure = writer.figure((9, 3.5))[0]
    figure.clear()
    for axes, (values, label) in zip(figure.subplots(1, 2),
                                     ((diff.ravel(), "|c - r|"), (relative, "|c - r| / |r|"))):
        axes.scatter(magnitude, np.nan_to_num(values, nan=0.0, posinf=0.0), s=4,
                     color="#2c7bb6", alpha=0.5, linewidths=0)
        axes.set_xlabel("|reference|")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    figure.suptitle(f"{name}: error against the reference's magnitude")
    return writer.add(f"{_plot_name(name)}.error", figure)


def _draw_error_heatmap(writer: PlotWriter, name: str, reference, candidate) -> str:
    """``|c - r|`` of an output of rank 2 or more, its last axis across."""
    import numpy as np

    _, _, diff = differences(reference, candidate)
    grid = np.nan_to_num(diff.reshape(-1, diff.shape[-1]), nan=np.inf)
    finite = grid[np.isfinite(grid)]
    top = float(finite.max()) if finite.size else 1.0
    figure, axes = writer.figure((6, 4.5))
    image = axes.imshow(np.where(np.isfinite(grid), grid, top), aspect="auto",
                        interpolation="nearest", cmap="viridis")
    figure.colorbar(image, ax=axes, label="|c - r|")
    axes.set_xlabel(f"last axis ({diff.shape[-1]})")
    axes.set_ylabel("rows (the other axes)")
    axes.set_title(f"{name}: |c - r|")
    return writer.add(f"{_plot_name(name)}.heatmap", figure)


def plot_sensitivity(writer: PlotWriter, answer: dict) -> str:
    """The gain of restoring each unit alone, best first, the recommended units marked."""
    with writer.style():
        return _draw_sensitivity(writer, answer)


def _draw_sensitivity(writer: PlotWriter, answer: dict) -> str:
    """``plot_sensitivity``' figure, drawn under the style its caller holds; the path it gets."""
    units = answer["units"]
    chosen = set((answer.get("recommendation") or {}).get("nodes_to_exclude") or ())
    gains = [unit["gain_db"] if unit["gain_db"] is not None else math.nan for unit in units]
    figure, axes = writer.figure((max(6.0, min(16.0, 0.3 * len(units) + 4)), 4))
    axes.bar(range(len(units)), gains,
             color=["#d73027" if unit["name"] in chosen else "#9e9e9e" for unit in units])
    picked, labels = _thinned([unit["name"] for unit in units])
    axes.set_xticks(picked)
    axes.set_xticklabels(labels, rotation=60, ha="right")
    axes.set_ylabel("gain in final-output SQNR (dB)")
    axes.set_title("each unit restored to float alone (red: recommended)")
    axes.grid(True, axis="y", alpha=0.3)
    return writer.add("gain_db", figure)


# -- tables ----------------------------------------------------------------------------------------


def output_format(given: str | None) -> str:
    """``--format`` as given, else ``EPRUN_FORMAT`` (a person's own default, set once in their
    shell), else JSON: eprun's default output never depends on where stdout goes."""
    if given is not None:
        return given
    text = os.environ.get("EPRUN_FORMAT", "")
    if text and text not in FORMATS:
        knob_warning(f"EPRUN_FORMAT={text!r} is not a format eprun prints (json or table); "
                     "printing JSON")
        return "json"
    return text or "json"


def _cell(value) -> str:
    """One table cell: yes or no for a bool, four significant digits for a float (``null`` if not
    finite), a dash for None, else the value as text."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _num(value)
    return "—" if value is None else str(value)


def aligned(headers: list[str], rows: list[list], worst: int | None = None,
            colour: bool = False) -> list[str]:
    """``rows`` under ``headers`` in aligned columns (numbers to four significant digits,
    right-aligned); row ``worst`` marked with ``<- worst``, in red where ``colour``."""
    cells = [[_cell(value) for value in row] for row in rows]
    numeric = [all(row[k] is None or (isinstance(row[k], (int, float))
                                      and not isinstance(row[k], bool)) for row in rows)
               for k in range(len(headers))]
    widths = [max([len(header)] + [len(row[k]) for row in cells])
              for k, header in enumerate(headers)]

    def line(values: list[str]) -> str:
        """One row, numbers right-aligned and text left-aligned in their columns."""
        return "  ".join(value.rjust(width) if numeric[k] else value.ljust(width)
                         for k, (value, width) in enumerate(zip(values, widths))).rstrip()

    lines = [line(headers), line(["-" * width for width in widths])]
    for k, row in enumerate(cells):
        text = line(row)
        if k == worst:
            text += "  <- worst"
            if colour:
                text = f"\033[1;31m{text}\033[0m"
        lines.append(text)
    return lines


def _worst(values: list, lost: list | None = None) -> int | None:
    """The index of the largest finite value (the earliest on ties), or of the first entry
    ``lost`` marks (its number is null: NaN or infinity got into it); None when neither."""
    first_lost = next((k for k, gone in enumerate(lost or ()) if gone), None)
    if first_lost is not None:
        return first_lost
    finite = [(value, k) for k, value in enumerate(values)
              if isinstance(value, (int, float)) and math.isfinite(value)]
    return max(finite, key=lambda item: (item[0], -item[1]))[1] if finite else None


def render_table(command: str, answer: dict, colour: bool = False) -> str:
    """``answer`` of ``command`` (layers, growth, check, settings, sensitivity, placement) as
    text a person reads at a terminal: what was measured, one aligned row per boundary,
    output, case, unit or provider, the worst one marked, and the verdict or summary under
    it."""
    lines = _TABLES[command](answer, colour)
    for key, what in (("node_data", "node data"), ("plots", "plots")):
        if answer.get(key):
            lines.append(f"{what}: {', '.join(answer[key])}")
    if answer.get("node_data_note"):
        lines.append(f"({answer['node_data_note']})")
    return "\n".join(lines)


def _layers_table(answer: dict, colour: bool) -> list[str]:
    """``layers`` as table lines: one row per boundary, the worst marked (the first non-finite, else
    the lowest SQNR or largest MSE where measured, else the largest relative error), then the first
    divergence and any NaN counts."""
    entries = answer["layers"]
    extra = [key for key in metric_fields() if any(key in entry for entry in entries)]
    local = any("local" in entry for entry in entries)
    sides = _side_names(answer)
    headers = ["boundary", f"{sides[0]} tensor", f"{sides[1]} tensor", "max abs error", "scale",
               "rel error", "cos min", *[quantity_of(key).heading for key in extra],
               *(["local rel error"] if local else [])]
    rows = [[entry["index"], entry["fp32"], entry["int8"], entry["max_abs_error"],
             entry["scale"], entry["rel_error"], entry["cos_min"],
             *[entry.get(key) for key in extra],
             *([(entry.get("local") or {}).get("rel_error")] if local else [])]
            for entry in entries]
    lines = [(f"layers: seed {answer['seed']}, {answer['rows']} rows, "
              f"{answer['layer_count']} boundaries")]
    lines += _inputs_lines(answer)
    # the worst row by the first metric measured (the lowest where higher is better, else the
    # largest), else by rel error
    key = extra[0] if extra else "rel_error"
    sense = -1 if higher_is_better(key) else 1
    lines += aligned(headers, rows, _worst([None if _is_lost(entry.get(key)) else
                                            sense * entry[key] for entry in entries],
                                           [_is_lost(entry["rel_error"]) for entry in entries]),
                     colour)
    lines += _divergence_lines(answer)
    for entry in entries:
        counts = entry.get("nonfinite") or {}
        if any(counts.values()):
            lines.append(f"boundary {entry['index']}: NaN or infinite values, "
                         f"{counts.get('fp32', 0)} in the fp32 tensor and "
                         f"{counts.get('int8', 0)} in the int8 one")
    return lines


def _side_names(answer: dict) -> tuple[str, str]:
    """What to call the two sides of a comparison in a table: fp32 and int8, the contract's
    words, unless the answer ran them on providers of their own (the same file on the CPU and
    on an EP is no fp32/int8 pair): then the reference and the candidate, with where each
    ran."""
    record = answer.get("providers")
    if not record:
        return "fp32", "int8"

    def short(names: list[str]) -> str:
        """Provider names without their "ExecutionProvider" suffix, comma-joined."""
        return ",".join(name.replace("ExecutionProvider", "") for name in names) or "none"

    return (f"reference ({short(record['reference'])})",
            f"candidate ({short(record['actual'])})")


def _divergence_lines(answer: dict) -> list[str]:
    """Where the two sides first differ, where the answer says (``first_divergence``)."""
    if "first_divergence" not in answer:
        return []
    first = answer["first_divergence"]
    if first is None:
        return ["first divergence: none, every boundary is equal"]
    return [(f"first divergence: boundary {first['index']} ({first['boundary']}), max abs "
             f"error {_num(first['max_abs_error'])}")]


def _inputs_lines(answer: dict) -> list[str]:
    """What each input was fed, where the answer records it (``inputs``), one line each."""
    return [f"input {item['name']}: {item['dtype']} {item['shape']} from {item['source']}"
            for item in answer.get("inputs", ())]


def _placement_table(answer: dict, colour: bool) -> list[str]:
    """Where onnxruntime put the nodes: the providers asked for and got, nodes per provider,
    and the nodes off the first provider asked for (all of them when it fell back)."""
    fell = fallback_of(answer["requested"], answer["actual"], answer["counts"])
    lines = [(f"placement: {answer['model']}, asked {','.join(answer['requested'])}, got "
              f"{','.join(answer['actual'])}"
              f"{' (fell back: ' + ', '.join(fell) + ' ran no node)' if fell else ''}; "
              f"from {answer['source']}")]
    counts = answer["counts"]
    lines += aligned(["provider", "nodes"], [[name, count] for name, count in counts.items()],
                     None, colour)
    first = answer["requested"][0] if answer["requested"] else None
    elsewhere = [node for node in answer["nodes"] if node["provider"] != first]
    if elsewhere and len(counts) > 1:
        lines += ["", f"nodes not on {first}:"]
        lines += aligned(["node", "op", "provider"],
                         [[node["name"], node["op_type"], node["provider"]]
                          for node in elsewhere], None, colour)
    return lines


def _growth_table(answer: dict, colour: bool) -> list[str]:
    """``growth`` as table lines: each boundary's relative error and ratio to the one before (and
    local error), the largest jump marked, then the total growth and whether it is monotone."""
    ratios = [None, *answer["ratios"]]
    local = answer.get("local_rel_error")
    rows = [[k, error, ratio, *([local[k]] if local is not None else [])]
            for k, (error, ratio) in enumerate(zip(answer["rel_error"], ratios))]
    jump = answer["max_ratio"]
    lines = [f"growth: seed {answer['seed']}, {answer['layer_count']} boundaries"]
    lines += aligned(["boundary", "rel error", "ratio to previous",
                      *(["local rel error"] if local is not None else [])], rows,
                     jump["index"] if jump else None, colour)
    lines += _divergence_lines(answer)
    total = answer["total_growth"]
    since = answer.get("growth_from_first_error")
    if total is None:
        lines.append(f"total growth: none ({_no_growth_why(answer['rel_error'])})"
                     + (f"; {_num(since['total_growth'])} from boundary {since['index']}, the "
                        "first with an error" if since else ""))
    else:
        said = ("the error grew" if total > 1 else "the error shrank" if total < 1
                else "the error stayed the same")
        lines.append(f"total growth {_num(total)}: {said}; "
                     f"{'monotone' if answer['monotone'] else 'not monotone'}")
    return lines


def _is_lost(value) -> bool:
    """A number NaN or infinity took (null in JSON)."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _no_growth_why(rel_errors: list) -> str:
    """Why a total growth is null: a zero first error, or a number NaN or infinity took."""
    lost = next((k for k, value in enumerate(rel_errors) if _is_lost(value)), None)
    if lost is not None:
        return f"the relative error at boundary {lost} is NaN or infinite"
    return "the first relative error is 0"


def _check_table(answer: dict, colour: bool) -> list[str]:
    """``check`` as table lines: the tolerances, one row per output (the failing one with the most
    violations marked), with the worst iteration, the statistic and the top-K agreement where
    the answer has them, then passed or the reasons it failed."""
    tolerance = answer["tolerance"]
    outputs = answer["outputs"]
    several = "iterations" in answer
    stats = any("error_stat" in entry for entry in outputs)
    top_k = any("top_k_agreement" in entry for entry in outputs)
    rows = [[entry["reference"], entry["candidate"], "x".join(map(str, entry["shape"])),
             entry.get("max_abs_diff"), entry.get("mean_abs_diff"), entry.get("p99_abs_diff"),
             entry.get("max_rel_diff"), entry.get("cosine"), entry.get("violations"),
             entry.get("elements"),
             *([entry.get("worst_iteration")] if several else []),
             *(_statistic_cells(entry.get("error_stat")) if stats else []),
             *([entry.get("top_k_agreement")] if top_k else [])] for entry in outputs]
    over = f", {answer['iterations']} iterations" if several else ""
    rule = (f"|c - r| <= {tolerance['atol']:g} + {tolerance['rtol']:g}*|r| per element, "
            f"cosine >= {tolerance['min_cos']:g}")
    if stats:
        rule += ("; by a statistic where the table names one: its |c - r| over atol and its "
                 "|c - r|/|r| over rtol fail, and the cosine only under --min-cos")
    lines = [(f"check: {answer['candidate']} against {answer['reference']}, "
              f"{answer['profile']} profile ({rule}), "
              f"on {','.join(answer['providers']['actual'])}{over}")]
    failing = {failure.get("output") for failure in answer["failures"]}
    lines += aligned(["reference", "candidate", "shape", "max abs diff", "mean abs diff",
                      "p99 abs diff", "max rel diff", "cosine", "violations", "elements",
                      *(["worst iteration"] if several else []),
                      *(["statistic", "stat abs", "stat rel"] if stats else []),
                      *(["top-k agreement"] if top_k else [])], rows,
                     _worst([entry.get("violations") or 0 if entry["reference"] in failing
                             else None for entry in outputs]), colour)
    for provider, share in (answer.get("provider_share") or {}).items():
        lines.append(f"{provider}: " + ("share unknown" if share["share"] is None else
                                        f"{share['nodes']} of {share['total']} nodes "
                                        f"({share['share']:.3g})"))
    lines.append("passed" if answer["passed"] else
                 "failed: " + "; ".join(failure_reasons(answer["failures"])))
    return lines


def _statistic_cells(statistic: dict | None) -> list:
    """The statistic an output was judged by, and its absolute and relative values."""
    if statistic is None:
        return ["elemwise", None, None]
    name = (f"quantile {statistic['quantile']:g}" if statistic["stat"] == "quantile"
            else statistic["stat"])
    return [name, statistic["abs"], statistic["rel"]]


def _settings_table(answer: dict, colour: bool) -> list[str]:
    """``settings`` as table lines: the baseline first, then each case's largest difference from it,
    the case that differs most marked, then whether all are equal."""
    base = answer["baseline"]
    cases = answer["cases"]
    swept = any("ep_option" in case for case in cases)

    def option(case: dict) -> list:
        """The option column of a case, where the answer sweeps one."""
        given = case.get("ep_option")
        return ([f"{given['key']}={given['value']}" if given else ""] if swept else [])

    rows = [[base["level"], base["intra_op"], *option({}), 0.0, True],
            *[[case["level"], case["intra_op"], *option(case), case["max_abs_diff"],
               case["bitwise_equal"]] for case in cases]]
    differing = [case["max_abs_diff"] if not case["bitwise_equal"] else None for case in cases]
    worst = _worst(differing)
    lines = [f"settings: {answer['model']}, seed {answer['seed']}, against the first row"]
    lines += aligned(["level", "threads", *(["ep option"] if swept else []), "max abs diff",
                      "bitwise equal"], rows, None if worst is None else worst + 1, colour)
    lines.append("all equal" if answer["all_equal"] else "not all equal")
    return lines


def _undoes_most(kept: int, units: int, where: str = "float") -> str:
    """The warning for a recommendation that keeps ``kept`` of ``units`` quantized units in
    float (or, ``where`` "int8", at 8 bits; its callers give it past half)."""
    return (f"the recommendation keeps {kept} of the {units} quantized units "
            + ("in float: that undoes most of the quantization (its speed and size gains go "
               "with it)" if where == "float" else
               "at 8 bits: most of the model is then an 8-bit one, at twice the 4-bit size")
            + "; a looser target, --max-units, or calibrating again may serve better")


def _sensitivity_table(answer: dict, colour: bool) -> list[str]:
    """``sensitivity`` as table lines: the units in rank order (no row marked), then the
    recommendation, whether it meets the target, and what is only an estimate."""
    quantized = answer["quantized"]
    estimates = any("inexact" in unit for unit in answer["units"])
    rows = [[rank, unit["name"], unit["op_type"], unit["sqnr_db"], unit["gain_db"],
             unit["rel_error"], *(["estimate" if "inexact" in unit else ""] if estimates else [])]
            for rank, unit in enumerate(answer["units"], start=1)]
    lines = [(f"sensitivity: output {answer['output']}, quantized SQNR "
              f"{_num(quantized['sqnr_db'])} dB, rel error {_num(quantized['rel_error'])}; "
              f"each unit restored to {answer.get('restore_to', 'float')} alone")]
    lines += aligned(["rank", "unit", "op", "SQNR dB", "gain dB", "rel error",
                      *(["exact?"] if estimates else [])], rows, None, colour)
    recommendation = answer["recommendation"]
    last = recommendation["steps"][-1] if recommendation["steps"] else {}
    lines.append(f"recommended nodes_to_exclude ({len(recommendation['nodes_to_exclude'])}): "
                 f"{', '.join(recommendation['nodes_to_exclude']) or 'none'}; target "
                 f"{'met' if recommendation['met'] else 'not met'}"
                 f"{' (an estimate)' if 'inexact' in last else ''}")
    if "nodes_to_include" in recommendation:
        lines.append("then at 8 bits, nodes_to_include: "
                     f"{', '.join(recommendation['nodes_to_include']) or 'none'}")
    added = len(recommendation["steps"])
    if added * 2 > len(answer["units"]):
        lines.append(_undoes_most(added, len(answer["units"]), answer.get("restore_to", "float")))
    if estimates or "inexact" in last:
        lines.append("estimate: quantize_static would calibrate a range from data eprun does "
                     "not have (the JSON's inexact says which); --calibration makes it exact")
    return lines


def _weights_table(answer: dict, colour: bool) -> list[str]:
    """Worst first: the lowest SQNR."""
    order = sorted(range(len(answer["weights"])), key=lambda k: (
        answer["weights"][k]["sqnr_db"] is None,
        answer["weights"][k]["sqnr_db"] or 0.0, k))
    rows = [[weight["name"], weight["op_type"], "x".join(map(str, weight["shape"])) or "scalar",
             f"{weight['bits']}-bit b{weight['block_size']}" if "block_size" in weight else
             "per-channel" if weight["axis"] is not None else "per-tensor",
             weight["sqnr_db"], weight["max_abs_error"]]
            for weight in (answer["weights"][k] for k in order)]
    lines = [f"weights: {answer['weight_count']} quantized in {answer['int8']}, worst first"]
    return lines + aligned(["weight", "read by", "shape", "quantized", "SQNR dB", "max abs error"],
                           rows, 0 if rows else None, colour)


def _inspect_table(answer: dict, colour: bool) -> list[str]:
    """``inspect`` as table lines: opsets, inputs and outputs, op type counts, weights and external
    data, and the QDQ summary (``colour`` is unused: no row is marked)."""
    def values(entries: list) -> list[list]:
        """Name, type and shape of each input or output, as table cells."""
        return [[entry["name"], entry["type"],
                 "?" if entry["shape"] is None else
                 "[" + ", ".join("?" if dim is None else str(dim) for dim in entry["shape"]) + "]"]
                for entry in entries]

    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}"
                       for domain, version in answer["opsets"].items())
    lines = [f"model {answer['model']}: IR {answer['ir_version']}, opsets {opsets}"]
    for what in ("inputs", "outputs"):
        lines += ["", f"{what} ({len(answer[what])})"]
        lines += aligned(["name", "type", "shape"], values(answer[what]))
    lines += ["", f"nodes ({answer['nodes']})"]
    lines += aligned(["op type", "count"], [list(item) for item in answer["op_types"].items()])
    initializers, external = answer["initializers"], answer["external_data"]
    lines += ["", f"initializers: {initializers['count']}, {_size_text(initializers['bytes'])}"
              + (f"; external data: {len(external)} file(s), "
                 f"{_size_text(sum(item['bytes'] for item in external))}" if external else "")]
    qdq = answer["qdq"]
    if qdq is not None:
        wrapped = ", ".join(f"{op} {count}" for op, count in qdq["wrapped_ops"].items())
        lines.append(f"QDQ: {qdq['activation_pairs']} activation Q->DQ pairs, "
                     f"{qdq['weight_dequantizers']} weight DequantizeLinear; they feed "
                     f"{wrapped or 'no node'}")
    only = answer.get("weight_only")
    if only is not None:
        levels = "/".join(map(str, only["accuracy_levels"]))
        ops = ", ".join(f"{op} {count}" for op, count in only["ops"].items())
        lines.append(f"weight-only: {ops}; {'/'.join(map(str, only['bits']))}-bit, blocks of "
                     f"{'/'.join(map(str, only['block_sizes']))}"
                     + (f", accuracy level {levels}" if levels else "")
                     + f"; {_size_text(only['bytes'])} for {_size_text(only['float32_bytes'])} "
                     "of float32 weights")
    return lines


def _repeats(names: list[str]) -> str:
    """``A, A, A, B`` as ``A x3, B``."""
    return ", ".join(name if len(group) == 1 else f"{name} x{len(group)}"
                     for name, group in ((key, list(same))
                                         for key, same in itertools.groupby(names)))


def _partition_table(answer: dict, colour: bool) -> list[str]:
    """``partition`` as table lines: the split, then one row per partition, its op types in runs."""
    lines = [(f"partition: {answer['model']}, {answer['nodes']} nodes, {answer['claimed']} "
             f"claimed by an EP supporting {', '.join(answer['supported']) or 'nothing'}: "
             f"{answer['partition_count']} partitions, {answer['handoffs']} hand-offs")]
    rows = [[k, part["owner"], part["size"], _repeats(part["nodes"])]
            for k, part in enumerate(answer["partitions"])]
    lines += aligned(["partition", "owner", "nodes", "op types"], rows, None, colour)
    subgraphs = answer.get("subgraphs") or []
    if subgraphs:
        lines.append(f"subgraphs: {len(subgraphs)} partitioned apart (see the JSON)")
    return lines


def _providers_table(answer: dict, colour: bool) -> list[str]:
    """``providers`` as table lines: one row per requested list; the first that failed or fell
    back is marked as the worst."""
    lines = [(f"providers: {answer['model']}; onnxruntime offers "
             f"{', '.join(answer['available'])}")]
    rows = [[k, ",".join(case["requested"]) or "(none)", ",".join(case["actual"]),
             ",".join(case["missing"]), case["fell_back"], case["error"]]
            for k, case in enumerate(answer["cases"])]
    worst = next((k for k, case in enumerate(answer["cases"])
                  if case["error"] or case["fell_back"]), None)
    return lines + aligned(["case", "requested", "actual", "missing", "fell back", "error"],
                           rows, worst, colour)


def _expose_table(answer: dict, colour: bool) -> list[str]:
    """``expose`` as table lines: the boundaries in order, then the copy's graph outputs."""
    lines = [(f"expose: {answer['model']} -> {answer['out']}, {len(answer['boundaries'])} "
             "boundaries")]
    rows = [[k, name] for k, name in enumerate(answer["boundaries"])]
    lines += aligned(["boundary", "tensor"], rows, None, colour)
    lines.append(f"graph outputs: {', '.join(answer['outputs'])}")
    return lines


def _report_table(answer: dict, colour: bool) -> list[str]:
    """``report`` as table lines: its headline numbers, one row each, the gate's verdict among
    them, then the files written."""
    head, gate = answer["headline"], answer["check"]
    worst, largest = head["worst_layer"], head["max_ratio"]
    verdict = ("passed" if gate["passed"] else
               "failed: " + "; ".join(failure_reasons(gate["failures"])))
    moved = head["exposure_max_abs_diff"]
    rows = [
        ["providers available", head["available"]],
        ["requests that fell back", f"{head['fell_back']} of {head['requests']}"],
        ["boundaries", head["layer_count"]],
        ["worst boundary (rel error)",
         "—" if worst is None else f"{worst['index']} ({_cell(worst['rel_error'])})"],
        ["total error growth", _cell(head["total_growth"])],
        ["largest step (ratio)",
         "—" if largest is None else f"{largest['index']} ({_cell(largest['ratio'])})"],
        ["settings all equal", head["settings_all_equal"]],
        ["exposure moved int8 output by", "—" if moved is None else _cell(moved)],
        [f"gate ({gate['profile']} profile, on {','.join(gate['providers']['actual'])})",
         verdict],
    ]
    lines = [(f"report: {len(answer['files'])} files written in {answer['out_dir']} "
             f"(boundaries paired by {answer['pairing']})")]
    lines += aligned(["measurement", "value"], rows, None, colour)
    lines.append("files: " + ", ".join(answer["files"]))
    return lines


def _reduce_table(answer: dict, colour: bool) -> list[str]:
    """``reduce``: what was kept, in file order, the cut's inputs and outputs, and the failure."""
    rows = [[node["name"] or "(unnamed)", node["op_type"], ", ".join(node["outputs"])]
            for node in answer["kept"]]
    failure = answer["failure"] or {}
    why = ", ".join(f"{key} {value}" for key, value in failure.items() if key != "bounds")
    minimal = ", minimal" if answer["minimal"] else ", not shown minimal"
    head = (f"reduce: {answer['model']}: {answer['nodes']} of {answer['original_nodes']} "
            f"nodes still fail ({answer['tries']} candidates tried{minimal})")
    return [head,
            *aligned(["node", "op", "outputs"], rows),
            f"inputs: {', '.join(answer['inputs']) or 'none'}",
            f"outputs: {', '.join(answer['outputs'])}",
            f"failure: {why or 'none recorded'}",
            f"written: {answer['output']}, {answer['inputs_file']}"]


_TABLES = {"layers": _layers_table, "growth": _growth_table, "check": _check_table,
           "settings": _settings_table, "sensitivity": _sensitivity_table,
           "placement": _placement_table, "weights": _weights_table,
           "inspect": _inspect_table, "partition": _partition_table,
           "providers": _providers_table, "expose": _expose_table, "report": _report_table,
           "reduce": _reduce_table}


# == 7. Sensitivity ================================================================================


# -- units: what the int8 model quantized, and one restored to float -------------------------------

class Unit(NamedTuple):
    """A node the quantizer wrapped, by the float model's node name (what
    ``quantize_static(nodes_to_exclude=...)`` takes); ``named`` is False when the float node
    has no name and eprun derived one from its op type and position."""

    name: str
    op_type: str
    named: bool
    int8_index: int
    fp32_index: int


def quantized_units(fp32_model, int8_model, int8_index: GraphIndex | None = None) -> list[Unit]:
    """The compute nodes of a QDQ model that read a DequantizeLinear output or feed a
    QuantizeLinear, paired with their float nodes: by name, else (unnamed nodes) the k-th
    unnamed node of the same op type in each model."""
    int8_index = int8_index or GraphIndex.of(int8_model.graph)
    int8_nodes, fp32_nodes = int8_index.nodes, list(fp32_model.graph.node)
    feeds_quantize = {node.input[0] for node in int8_nodes if node.op_type == "QuantizeLinear"}
    by_name = {node.name: index for index, node in enumerate(fp32_nodes) if node.name}
    unnamed: dict[str, list[int]] = {}
    for index, node in enumerate(fp32_nodes):
        if not node.name:
            unnamed.setdefault(node.op_type, []).append(index)
    seen: dict[str, int] = {}
    units = []
    quantizable = _quantizer_op_types()
    for index, node in enumerate(int8_nodes):
        if node.op_type in _QDQ_OPS or (quantizable and node.op_type not in quantizable):
            continue
        wrapped = any(int8_index.producer(name) is not None
                      and int8_index.producer(name).op_type == "DequantizeLinear"
                      for name in node.input)
        if not wrapped and not feeds_quantize.intersection(node.output):
            continue
        if node.name:
            if node.name in by_name:
                units.append(Unit(node.name, node.op_type, True, index, by_name[node.name]))
            continue
        k = seen.get(node.op_type, 0)
        seen[node.op_type] = k + 1
        if k < len(unnamed.get(node.op_type, ())):
            units.append(Unit(f"{node.op_type}#{k}", node.op_type, False, index,
                              unnamed[node.op_type][k]))
    return units


# The op types onnxruntime's quantizer quantizes by default (its QLinearOpsRegistry and
# QDQRegistry, the list quantize_static starts from), with the release that added each one,
# read from every release from 1.16 to 1.32 (onnxruntime/quantization/registry.py). Only
# sensitivity imports the quantizer (and reads its registries); this table serves where it
# cannot be imported (it needs sympy on some releases) and for the units of graph edits.
QUANTIZER_OP_TYPES = (
    *((name, (1, 16)) for name in (
        "Add", "ArgMax", "AveragePool", "Clip", "Concat", "Conv", "ConvTranspose",
        "EmbedLayerNormalization", "Gather", "Gemm", "GlobalAveragePool",
        "InstanceNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Pad", "Relu",
        "Reshape", "Resize", "Sigmoid", "Softmax", "Split", "Squeeze", "Transpose",
        "Unsqueeze", "Where")),
    ("LayerNormalization", (1, 17)), ("BatchNormalization", (1, 19)),
    ("GatherElements", (1, 20)), ("Slice", (1, 20)), ("TopK", (1, 23)), ("CumSum", (1, 24)),
    ("Flatten", (1, 28)),
)


def _quantizer_op_types() -> set[str]:
    """The op types the quantizer of the installed onnxruntime release quantizes (the int8
    model is taken to come from that release's quantize_static)."""
    release = ort_release()
    return {name for name, first in QUANTIZER_OP_TYPES if first <= release}


def restore_to_float(int8_model, fp32_model, units: list[Unit], fp32_path: str,
                     every_unit: list[Unit] | None = None):
    """The int8 graph with ``units`` back in float, as ``quantize_static(...,
    nodes_to_exclude=[...])`` writes it (checked against it in the tests): each unit reads its
    float weights and biases instead of their DequantizeLinear; an input the quantizer only
    quantized for the unit (a graph input read by nothing else) loses its Q/DQ pair; and an
    activation the quantizer folded into the unit's output (a Relu after a MatMul + Add) comes
    back as the float node it was. An input quantized only for the unit (a graph input, the
    output of an op left in float) and an output quantized only for the unit (a graph output)
    lose their QuantizeLinear/DequantizeLinear pair. Returns ``(model, float weights by
    name)``; ``int8_model`` is not changed. The weights are read as arrays, never copied
    through protobuf."""
    from onnx import ModelProto

    model = ModelProto()
    model.CopyFrom(int8_model)  # graph only: weights stay on disk or in placeholders later
    if every_unit is None:
        every_unit = quantized_units(fp32_model, int8_model)
    restoring = _Restoring(model, fp32_model, units, fp32_path, every_unit)
    for unit in units:
        restoring.unit_inputs(unit)
        restoring.unit_output(unit)
        restoring.folded_activation(unit)
        restoring.float_attributes(unit)
    restoring.write_back()
    return model, restoring.arrays


class _Restoring:
    """``restore_to_float`` at work on a copy of the int8 graph: its nodes as they are
    rewired, those removed, the float weights to hand over and the activations put back.

    Units register their outputs for quantization; any other producer (a graph input, an op
    the quantizer leaves in float) had its output quantized only for its consumers. Who reads
    each tensor is kept up to date as inputs are rewired; who writes it is the graph's as it
    was."""

    def __init__(self, model, fp32_model, units: list[Unit], fp32_path: str,
                 every_unit: list[Unit]) -> None:
        """Index the copy ``model`` (who reads each tensor, who wrote it) and ``fp32_model``'s nodes
        and weights; ``units`` are those to restore, ``every_unit`` all the quantizer wrapped."""
        self.model, self.fp32_path = model, fp32_path
        self.nodes = list(model.graph.node)
        self.fp32_nodes = list(fp32_model.graph.node)
        self.fp32_weights = {tensor.name: tensor for tensor in fp32_model.graph.initializer}
        self.int8_weights = {tensor.name for tensor in model.graph.initializer}
        self.excluded = {unit.int8_index for unit in units}
        self.wrapped = {unit.int8_index for unit in every_unit}
        self.removed: set[int] = set()
        self.arrays: dict = {}
        self.inserted: dict[int, list] = {}
        self.producer_index = GraphIndex(self.nodes).producer_index
        self.readers: dict[str, set[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in node.input:
                self.readers.setdefault(name, set()).add(index)
        self.fp32_readers: dict[str, list] = {}
        for candidate in self.fp32_nodes:
            for name in candidate.input:
                self.fp32_readers.setdefault(name, []).append(candidate)

    def consumers(self, name: str) -> set[int]:
        """The nodes not removed that read ``name`` directly (a subgraph's read is not counted)."""
        return {index for index in self.readers.get(name, ()) if index not in self.removed}

    def rename(self, old: str, new: str) -> None:
        """Every node that reads ``old`` reads ``new`` instead."""
        for index in self.readers.pop(old, set()):
            other = self.nodes[index]
            other.input[:] = [new if item == old else item for item in other.input]
            self.readers.setdefault(new, set()).add(index)

    def set_input(self, index: int, position: int, new: str) -> None:
        """Node ``index`` reads ``new`` at ``position``; it stays a reader of the old name only
        where another of its inputs still is that name."""
        node = self.nodes[index]
        old = node.input[position]
        node.input[position] = new
        if old not in node.input:
            self.readers[old].discard(index)
        self.readers.setdefault(new, set()).add(index)

    def unit_inputs(self, unit: Unit) -> None:
        """The unit reads its float weights and biases, and an activation quantized only for
        it loses its Q/DQ pair."""
        nodes = self.nodes
        node, original = nodes[unit.int8_index], self.fp32_nodes[unit.fp32_index]
        for position, name in enumerate(list(node.input)):
            source = self.producer_index.get(name)
            if source is None or nodes[source].op_type != "DequantizeLinear" or \
                    position >= len(original.input):
                continue
            dequantize = nodes[source]
            if dequantize.input[0] in self.int8_weights:  # a quantized weight or bias
                float_name = original.input[position]
                if float_name not in self.fp32_weights:
                    continue
                if self.consumers(name) <= self.excluded:  # quantized for these units only
                    self.removed.add(source)
                # The float weight under its own name, unless a node left in the graph writes
                # that name: the DequantizeLinear that keeps a bias's name, for this unit or
                # (a bias shared by two nodes, each quantized with its own scale) another.
                writer = self.producer_index.get(float_name)
                taken = writer is not None and writer not in self.removed
                target = f"{float_name}_float" if taken else float_name
                self.arrays[target] = _initializer_array(self.fp32_weights[float_name],
                                                         self.fp32_path)
                self.set_input(unit.int8_index, position, target)
                continue
            quantize_at = self.producer_index.get(dequantize.input[0])
            quantize = nodes[quantize_at] if quantize_at is not None else None
            upstream = (self.producer_index.get(quantize.input[0]) if quantize is not None
                        else None)
            if (quantize is not None and quantize.op_type == "QuantizeLinear"
                    and (upstream is None or upstream not in self.wrapped)
                    and self.consumers(name) & self.wrapped <= self.excluded
                    and self.consumers(quantize.output[0]) <= {source}):
                self.rename(name, quantize.input[0])  # every reader reads the float tensor
                self.removed.update((source, quantize_at))

    def unit_output(self, unit: Unit) -> None:
        """The Q/DQ pair that quantized the unit's own output for nobody else (a graph
        output) goes."""
        nodes = self.nodes
        node, original = nodes[unit.int8_index], self.fp32_nodes[unit.fp32_index]
        output_pair = _output_pair(nodes, node.output[0], self.removed)
        if output_pair is None or not (
                self.consumers(nodes[output_pair[1]].output[0]) & self.wrapped
                <= self.excluded):
            return
        dequantize_at = output_pair[1]
        if nodes[dequantize_at].output[0] == original.output[0]:
            node.output[0] = original.output[0]
        else:
            self.rename(nodes[dequantize_at].output[0], node.output[0])
        self.removed.update(output_pair)

    def folded_activation(self, unit: Unit) -> None:
        """An activation the quantizer folded into the unit's output (a Relu after a MatMul +
        Add) comes back as the float node it was."""
        node, original = self.nodes[unit.int8_index], self.fp32_nodes[unit.fp32_index]
        if node.output[0] == original.output[0]:
            return
        chain, current = [], original.output[0]
        while current != node.output[0] and len(self.fp32_readers.get(current, ())) == 1:
            follower = self.fp32_readers[current][0]
            chain.append(follower)
            current = follower.output[0]
        if current == node.output[0]:
            node.output[0] = original.output[0]
            self.inserted[unit.int8_index] = chain
            for name in {name for follower in chain for name in follower.input}:
                # a Clip's bounds: the quantizer drops them with the Clip
                if name in self.fp32_weights and name not in self.int8_weights:
                    self.arrays[name] = _initializer_array(self.fp32_weights[name],
                                                           self.fp32_path)

    def float_attributes(self, unit: Unit) -> None:
        """The unit's attributes as the float node has them: the quantizer folds a Gemm's beta
        into its int32 bias and writes beta 1, which the float bias must not keep."""
        node, original = self.nodes[unit.int8_index], self.fp32_nodes[unit.fp32_index]
        del node.attribute[:]
        node.attribute.extend(original.attribute)

    def write_back(self) -> None:
        """The kept nodes in order, each followed by the activations put back after it, and
        only the initializers they read (onnxruntime drops unused ones before they arrive)."""
        ordered = []
        for index, node in enumerate(self.nodes):
            if index not in self.removed:
                ordered.append(node)
                ordered += self.inserted.get(index, [])
        graph = self.model.graph
        del graph.node[:]
        graph.node.extend(ordered)
        used = {name for node in ordered for name in _node_inputs(node)}
        kept = [tensor for tensor in graph.initializer if tensor.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _output_pair(nodes: list, name: str, removed: set) -> tuple[int, int] | None:
    """``(QuantizeLinear, DequantizeLinear)`` indices of the one pair that reads ``name``."""
    for index, node in enumerate(nodes):
        if index not in removed and node.op_type == "QuantizeLinear" and node.input[0] == name:
            follower = next((k for k, other in enumerate(nodes) if k not in removed
                             and other.op_type == "DequantizeLinear"
                             and other.input[0] == node.output[0]), None)
            return None if follower is None else (index, follower)
    return None


def _data_dependent(index: GraphIndex, unit: Unit) -> str | None:
    """Why restoring ``unit`` cannot match quantize_static exactly, if it cannot: the quantizer
    then quantizes the unit's output from calibration data eprun does not have. ``index`` is
    the int8 graph's."""
    nodes = index.nodes
    node = nodes[unit.int8_index]
    if node.op_type == "Softmax":
        return ("a quantized Softmax's output range is fixed to [0, 1]; left in float, its "
                "output is calibrated from data, so its scale is not known here")
    pair = _output_pair(nodes, node.output[0], set())
    weights = index.initializers
    table_scales = {index.producer(name).input[1] for name in node.input
                    if name in index.producer_index
                    and index.producer(name).op_type == "DequantizeLinear"
                    and index.producer(name).input[0] in weights}
    if pair is not None and nodes[pair[0]].input[1] in table_scales:
        return (f"a quantized {node.op_type} passes its table's scale on to its output; left "
                "in float, its output is calibrated from data, so its scale is not known here")
    return None


def _final(model) -> str:
    """The name of ``model``'s first float output (else its first output); an error (exit 4) for a
    model without any output."""
    name = final_output(model.graph)
    if name is None:
        raise EprunError("the model has no output")
    return name


def require_qdq_form(model, path: str) -> None:
    """sensitivity restores units of a QDQ model, whose every quantized op is a float op
    between DequantizeLinear and QuantizeLinear. A QOperator model (QLinearMatMul, ...) or a
    dynamic one (DynamicQuantizeLinear, MatMulInteger) has no such units: restoring what
    looks like one would rank ops the quantizer never touched."""
    ops = [node.op_type for node in model.graph.node]
    other = sorted({op for op in ops if op.startswith("QLinear") or op in (
        *_INTEGER_OPS, "QGemm", "QAttention", "DynamicQuantizeMatMul")})
    if other:
        form = "dynamic" if {"DynamicQuantizeLinear", "DynamicQuantizeMatMul"} & set(other) \
            else "QOperator"
        raise EprunError(f"{path!r} is quantized in {form} form ({', '.join(other)}); "
                         "sensitivity restores units of a QDQ model (quantize_static with "
                         "QuantFormat.QDQ): quantize the float model that way to rank its "
                         "units", EXIT_FAILURE)
    if not any(op in _QDQ_OPS for op in ops):
        if "MatMulNBits" in ops:
            raise EprunError(f"{path!r} is weight-only, but none of its MatMulNBits is one "
                             "MatMulNBitsQuantizer writes (of an initializer, without a bias "
                             "or g_idx input): sensitivity restores those, or the units of a "
                             "QDQ model")
        raise EprunError(f"{path!r} has no QuantizeLinear/DequantizeLinear nodes; "
                         "sensitivity restores units of a QDQ model (quantize_static with "
                         "QuantFormat.QDQ)")


# -- weight-only twins: MatMulNBitsQuantizer's blockwise MatMuls -----------------------------------

# Bits per code of a blockwise DequantizeLinear's integer weight, by TensorProto data type:
# UINT8, INT8, UINT4, INT4, UINT2, INT2 (MatMulNBitsQuantizer's QDQ form writes the 4-bit ones).
_BLOCKWISE_BITS = {2: 8, 3: 8, 21: 4, 22: 4, 25: 2, 26: 2}
# The weight names of MatMulNBitsQuantizer's neural-compressor algorithms (RTN, k_quant, GPTQ):
# ``W_Q4G32`` (bits, then block size), where its default algorithm and HQQ write ``W_Q4``.
_NEURAL_COMPRESSOR_WEIGHT = re.compile(r"_Q\d+G-?\d+$")
# What algorithm a twin's weights show (``BlockwiseMatMul.algorithm``) when neural-compressor's
# names them: GPTQ among those, which a weight's values cannot tell from RTN's.
_NEURAL_COMPRESSOR = "RTN, k_quant or GPTQ"


class BlockwiseMatMul(NamedTuple):
    """A MatMul of a weight-only twin that reads its weight quantized in blocks along K: the
    twin's node (``index``: com.microsoft MatMulNBits, ``form`` "QOperator", or a MatMul
    reading a blockwise DequantizeLinear, "QDQ"), its activation and quantized weight (an
    initializer), and what the graph says of how it was quantized. ``symmetric``: no zero
    points; ``float_zero_points``: zero points in float, as only HQQ writes them;
    ``accuracy_level`` None where the node has none (or 0, which the quantizer never
    writes)."""

    index: int
    activation: str
    weight: str
    form: str
    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: int | None
    float_zero_points: bool

    @property
    def algorithm(self) -> str:
        """The MatMulNBitsQuantizer algorithm the names and zero points show: "HQQ" (float zero
        points), "RTN, k_quant or GPTQ" (neural-compressor's names, ``W_Q4G32``), else "DEFAULT"
        (the quantizer's own round to nearest, ``W_Q4``)."""
        if self.float_zero_points:
            return "HQQ"
        if _NEURAL_COMPRESSOR_WEIGHT.search(self.weight):
            return _NEURAL_COMPRESSOR
        return "DEFAULT"


def blockwise_matmuls(index: GraphIndex) -> list[BlockwiseMatMul]:
    """The MatMuls of a graph whose weight is quantized in blocks along K, in file order: a
    com.microsoft MatMulNBits of an initializer (without g_idx or bias, which the quantizer
    never writes), and a MatMul whose B a DequantizeLinear with ``block_size`` on axis 0
    writes from an integer initializer."""
    weights = index.initializers
    found = []
    for position, node in enumerate(index.nodes):
        inputs = list(node.input)
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            if len(inputs) < 3 or inputs[1] not in weights or any(inputs[4:]):
                continue
            attributes = int_attributes(node)
            zero = inputs[3] if len(inputs) > 3 else ""
            found.append(BlockwiseMatMul(
                position, inputs[0], inputs[1], "QOperator", attributes.get("bits", 4),
                attributes.get("block_size", 0), not zero,
                attributes.get("accuracy_level") or None,
                zero in weights and weights[zero].data_type in FLOAT_TYPES))
        elif node.op_type == "MatMul" and len(inputs) == 2:
            dequantize = _weight_dequantizer(index, inputs[1])
            attributes = int_attributes(dequantize) if dequantize is not None else {}
            if not attributes.get("block_size") or attributes.get("axis", 1) != 0:
                continue
            bits = _BLOCKWISE_BITS.get(weights[dequantize.input[0]].data_type)
            if bits is not None:
                found.append(BlockwiseMatMul(
                    position, inputs[0], dequantize.input[0], "QDQ", bits,
                    attributes["block_size"],
                    len(dequantize.input) < 3 or not dequantize.input[2], None, False))
    return found


class WeightOnlyTwin(NamedTuple):
    """What sensitivity reads off a weight-only twin (``weight_only_twin``): its units, each
    unit's ``BlockwiseMatMul`` by the twin's node index, the MatMulNBitsQuantizer arguments
    the graph shows (the answer's ``quantizer``: ``_nbits_arguments``) and the settings its
    MatMuls do not share (where they differ, the arguments give the most common)."""

    units: list[Unit]
    matmuls: dict[int, BlockwiseMatMul]
    arguments: dict
    mixed: list[str]

    def inexact(self, restored: list[Unit]) -> str | None:
        """Why restoring ``restored`` may not be what MatMulNBitsQuantizer writes with them
        excluded: a weight named as neural-compressor's algorithms name them, which include a
        calibrated one. (Restoring is exact where each weight was quantized alone, as the
        quantizer's default round to nearest and HQQ do.)"""
        for unit in restored:
            matmul = self.matmuls[unit.int8_index]
            if matmul.algorithm == _NEURAL_COMPRESSOR:
                return (f"{matmul.weight!r} is named as MatMulNBitsQuantizer's neural-compressor "
                        "algorithms name a weight (<W>_Q<bits>G<block_size>): RTN and k_quant "
                        "quantize each weight alone, as restoring assumes, but GPTQ fits the "
                        "weights to calibration data eprun does not have, so if GPTQ made the "
                        "twin its other weights may depend on this one")
        return None


def weight_only_twin(fp32_model, twin_model) -> WeightOnlyTwin | None:
    """``twin_model`` read as a weight-only twin of ``fp32_model`` (MatMulNBitsQuantizer's, in
    either form), or None where it is none: it has no blockwise MatMul, or an op that
    quantizes activations (then it is a QDQ model of quantize_static, or refused as one)."""
    if any(node.op_type in ("QuantizeLinear", *_INTEGER_OPS)
           or node.op_type.startswith("QLinear") for node in twin_model.graph.node):
        return None
    index = GraphIndex.of(twin_model.graph)
    matmuls = blockwise_matmuls(index)
    if not matmuls:
        return None
    units = _weight_only_units(fp32_model, index, matmuls)
    arguments, mixed = _nbits_arguments(fp32_model, index, matmuls)
    return WeightOnlyTwin(units, {matmul.index: matmul for matmul in matmuls}, arguments, mixed)


def _weight_only_units(fp32_model, index: GraphIndex,
                       matmuls: list[BlockwiseMatMul]) -> list[Unit]:
    """Each blockwise MatMul paired with the float MatMul it replaced, found through its
    activation: the float MatMul of a constant weight whose first input is the blockwise
    one's; where several read it (a query, a key and a value projection), the one writing the
    same output, then the one whose weight the quantized one is named after. A unit is named by
    the float node's name, which ``MatMulNBitsQuantizer(nodes_to_exclude=...)`` takes
    (``<op>#<k>`` where it has none, ``_named_nodes``). A MatMul with no such float node is
    no unit: there is no float weight to restore."""
    fp32_nodes = list(_named_nodes(fp32_model.graph))
    readers = FloatWeightReaders(fp32_model.graph)
    units, taken = [], set()
    for matmul in matmuls:
        position = readers.matmul_of(matmul.activation, index.nodes[matmul.index].output[0],
                                     matmul.weight, taken)
        if position is None:
            continue
        taken.add(position)
        units.append(Unit(fp32_nodes[position].name, "MatMul",
                          bool(fp32_model.graph.node[position].name), matmul.index, position))
    return units


def _nbits_arguments(fp32_model, index: GraphIndex,
                     matmuls: list[BlockwiseMatMul]) -> tuple[dict, list[str]]:
    """The MatMulNBitsQuantizer arguments a twin shows, and the names of those its blockwise
    MatMuls do not share: ``class`` (MatMulNBitsQuantizer), ``algorithm`` (its
    WeightOnlyQuantConfig's, as ``BlockwiseMatMul.algorithm`` reads it), ``bits``,
    ``block_size``, ``is_symmetric``, ``accuracy_level`` (each the most common value, the
    first on a tie), ``nodes_to_exclude`` (the float model's named MatMuls of a constant
    weight the twin leaves in float: the quantizer would have quantized them unless told),
    ``quant_format`` ("QOperator" for MatMulNBits, "QDQ") and ``op_types_to_quantize`` (None,
    the default MatMul alone, or with Gather where the twin has GatherBlockQuantized)."""
    settings = {"algorithm": [matmul.algorithm for matmul in matmuls],
                "bits": [matmul.bits for matmul in matmuls],
                "block_size": [matmul.block_size for matmul in matmuls],
                "is_symmetric": [matmul.symmetric for matmul in matmuls],
                "accuracy_level": [matmul.accuracy_level for matmul in matmuls],
                "quant_format": [matmul.form for matmul in matmuls]}
    common = {key: collections.Counter(values).most_common(1)[0][0]
              for key, values in settings.items()}
    mixed = [key for key, values in settings.items() if len(set(values)) > 1]
    fp32_names = {node.name for node in fp32_model.graph.node if node.name}
    left = [node.name for node in index.nodes
            if node.op_type == "MatMul" and node.name in fp32_names and len(node.input) == 2
            and _quantizable_weight(index.initializers.get(node.input[1]))]
    gathers = any(node.op_type == "GatherBlockQuantized" for node in index.nodes)
    return {"class": "MatMulNBitsQuantizer", "algorithm": common["algorithm"],
            "bits": common["bits"], "block_size": common["block_size"],
            "is_symmetric": common["is_symmetric"], "accuracy_level": common["accuracy_level"],
            "nodes_to_exclude": left, "quant_format": common["quant_format"],
            "op_types_to_quantize": ["Gather", "MatMul"] if gathers else None}, mixed


def _quantizable_weight(tensor) -> bool:
    """Is ``tensor`` a weight MatMulNBitsQuantizer quantizes: float, 2-D, or more dims whose
    leading ones are all 1?"""
    return (tensor is not None and tensor.data_type in FLOAT_TYPES and len(tensor.dims) >= 2
            and all(dim == 1 for dim in tensor.dims[:-2]))


def restore_weight_only(twin_model, fp32_model, units: list[Unit], fp32_path: str,
                        to_int8: dict | None = None):
    """The twin's graph with ``units`` back in float, as ``MatMulNBitsQuantizer(...,
    nodes_to_exclude=[...])`` writes it (checked against it in the tests): each blockwise
    MatMul is the float model's MatMul again (its name, its float weight), and what only it
    read goes with it: the QDQ form's DequantizeLinear, the Reshape chain the quantizer puts
    after a MatMulNBits of a weight with leading 1-dims, their initializers. That is exact
    where each weight was quantized alone (the quantizer's default round to nearest, HQQ).
    With ``to_int8`` (the twin's ``BlockwiseMatMul`` by node index) each restored MatMul is
    then quantized to 8 bits as ``MatMulNBitsQuantizer(bits=8, nodes_to_include=[...])``
    writes it on that graph (``_int8_matmul``): the mixed precision LLM builds keep.
    Returns ``(model, float weights by name)``, as ``restore_to_float`` does; ``twin_model``
    is not changed, and the weights are read as arrays, never copied through protobuf."""
    from onnx import ModelProto, NodeProto

    model = ModelProto()
    model.CopyFrom(twin_model)  # graph only: weights stay on disk or in placeholders later
    nodes = list(model.graph.node)
    fp32_weights = {tensor.name: tensor for tensor in fp32_model.graph.initializer}
    present = {tensor.name for tensor in model.graph.initializer}
    arrays: dict = {}
    dropped: set[int] = set()
    unread: list[str] = []  # what a replaced node read: its writer may be read by no one now
    for unit in units:
        original = fp32_model.graph.node[unit.fp32_index]
        replaced = nodes[unit.int8_index]
        nodes[unit.int8_index] = restored = NodeProto()
        restored.CopyFrom(original)
        unread += list(replaced.input)
        weight = original.input[1]
        if to_int8 is not None:
            restored.CopyFrom(_int8_matmul(original, _initializer_array(
                fp32_weights[weight], fp32_path), to_int8[unit.int8_index], arrays))
        elif weight not in present and weight not in arrays:
            arrays[weight] = _initializer_array(fp32_weights[weight], fp32_path)
        if replaced.output[0] != original.output[0]:  # a Reshape after it wrote the output
            dropped.update(k for k, node in enumerate(nodes)
                           if k != unit.int8_index and original.output[0] in node.output)
    _drop_unread(model.graph, nodes, dropped, unread)
    kept = [node for k, node in enumerate(nodes) if k not in dropped]
    graph = model.graph
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in _node_inputs(node)}
    used.update(value.name for value in graph.input)
    initializers = [tensor for tensor in graph.initializer
                    if tensor.name in used and tensor.name not in arrays]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return model, arrays


def _int8_matmul(original, weight, matmul: BlockwiseMatMul, arrays: dict):
    """The 8-bit MatMulNBits that ``MatMulNBitsQuantizer(bits=8, block_size, is_symmetric,
    accuracy_level)`` of the twin's ``matmul`` writes for the float MatMul ``original`` of
    2-D float32 or float16 ``weight``: its blocks quantized by onnxruntime's own kernel
    (``quantize_matmul_8bits``, the one that quantizer calls), its initializers (``<W>_Q8``,
    ``<W>_scales`` in the weight's type, and ``<W>_zero_points`` where asymmetric) added to
    ``arrays``."""
    import numpy as np
    from onnx import helper

    rows, cols = weight.shape  # 2-D, float32 or float16 (_require_int8_restore)
    block = matmul.block_size
    blocks = -(-rows // block)
    padded = np.zeros((blocks * block, cols), weight.dtype)  # the scales take its type
    padded[:rows] = weight
    packed = np.zeros((cols, blocks, block), np.uint8)
    scales = np.zeros((cols, blocks), weight.dtype)
    zero = np.zeros((cols, blocks), np.uint8)
    import_ort().capi._pybind_state.quantize_matmul_8bits(
        packed, padded, scales, zero, block, cols, rows, matmul.symmetric)
    name = original.input[1]
    inputs = [original.input[0], f"{name}_Q8", f"{name}_scales"]
    arrays.update({f"{name}_Q8": packed, f"{name}_scales": scales})
    if not matmul.symmetric:
        inputs.append(f"{name}_zero_points")
        arrays[f"{name}_zero_points"] = zero
    level = {"accuracy_level": matmul.accuracy_level} if matmul.accuracy_level else {}
    return helper.make_node("MatMulNBits", inputs, list(original.output),
                            name=f"{original.name}_Q8" if original.name else "",
                            domain="com.microsoft", K=rows, N=cols, bits=8, block_size=block,
                            **level)


def _require_int8_restore(twin: WeightOnlyTwin | None, int8: str, fp32_model,
                          fp32: str) -> None:
    """``--restore-to int8`` needs a twin of MatMulNBits below 8 bits whose units each read a
    2-D float32 or float16 weight of their own (a weight two MatMuls share, MatMulNBitsQuantizer
    writes under clashing names; an N-D one it reshapes, which eprun does not write), and an
    onnxruntime that quantizes and runs 8-bit MatMulNBits (1.23 and newer)."""
    if twin is None:
        raise EprunError(f"--restore-to int8 is for a weight-only twin (MatMulNBits); {int8!r} "
                         "is none: its units are restored to float", EXIT_USAGE)
    forms = {matmul.form for matmul in twin.matmuls.values()}
    if forms != {"QOperator"} or any(m.bits >= 8 for m in twin.matmuls.values()):
        raise EprunError(f"--restore-to int8: {int8!r} has "
                         + ("MatMuls of blockwise DequantizeLinear weights (the QDQ form, which "
                            "MatMulNBitsQuantizer writes at 4 bits only)" if forms != {"QOperator"}
                            else "MatMulNBits of 8 bits already")
                         + "; restore its units to float")
    graph = fp32_model.graph
    readers = collections.Counter(node.input[1] for node in graph.node
                                  if node.op_type == "MatMul" and len(node.input) == 2)
    weights = {tensor.name: tensor for tensor in graph.initializer}
    for unit in twin.units:
        weight = weights[graph.node[unit.fp32_index].input[1]]
        why = ("is read by several MatMuls, whose 8-bit weights MatMulNBitsQuantizer would "
               "write under one name" if readers[weight.name] > 1 else
               f"is {len(weight.dims)}-D, which MatMulNBitsQuantizer reshapes" if
               len(weight.dims) != 2 else
               "is neither float32 nor float16" if weight.data_type not in (1, 10) else None)
        if why:
            raise EprunError(f"--restore-to int8: the weight {weight.name!r} of {fp32!r} (unit "
                             f"{unit.name!r}) {why}; restore the units to float")
    if not hasattr(import_ort().capi._pybind_state, "quantize_matmul_8bits") or \
            ort_release() < (1, 23):
        raise EprunError(f"--restore-to int8 needs onnxruntime 1.23 or newer (8-bit "
                         f"MatMulNBits); this is {import_ort().__version__}")


def _drop_unread(graph, nodes: list, dropped: set[int], unread: list[str]) -> None:
    """Add to ``dropped`` every node that only the dropped nodes or the replaced ones read
    (``unread``: the names those read), and so on upstream; a graph output is always read."""
    outputs = {value.name for value in graph.output}
    live = [(k, node) for k, node in enumerate(nodes) if k not in dropped]
    readers = collections.Counter(name for _, node in live for name in _node_inputs(node))
    writer = {name: k for k, node in live for name in node.output}
    pending = unread + [name for k in dropped for name in _node_inputs(nodes[k])]
    while pending:
        k = writer.get(pending.pop())
        if k is None or k in dropped or any(readers[name] or name in outputs
                                             for name in nodes[k].output):
            continue
        dropped.add(k)
        for name in _node_inputs(nodes[k]):
            readers[name] -= 1
            pending.append(name)


# -- requantization: quantize_static itself --------------------------------------------------------

# A zero point's element type -> the QuantType that writes it.
_QUANT_TYPE_NAMES = {2: "QUInt8", 3: "QInt8", 4: "QUInt16", 5: "QInt16", 21: "QUInt4", 22: "QInt4"}
# quantize_static calls the settings search may make before eprun falls back to graph edits.
REQUANTIZE_SEARCH_CALLS = 80
# quantize_static's extra_options that change which tensors it quantizes, each tried alone with
# the default op types when those do not write the int8 model's tensors.
_STRUCTURAL_OPTIONS = ({"QuantizeBias": False}, {"AddQDQPairToWeight": True},
                       {"ForceQuantizeNoInputCheck": True}, {"MatMulConstBOnly": True})


def quantized_signature(model) -> frozenset:
    """What a quantizer decided for a QDQ graph: the activations it quantized (a
    QuantizeLinear reads them) and the weights it quantized (a DequantizeLinear reads them),
    by name, which quantize_static derives from the float model's tensor names."""
    weights = {tensor.name for tensor in model.graph.initializer}
    decided = set()
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in weights:
            decided.add(("activation", node.input[0]))
        elif node.op_type == "DequantizeLinear" and node.input[0] in weights:
            decided.add(("weight", node.input[0]))
    return frozenset(decided)


# Where a quantized graph reads a weight in the weight type: a MatMul's or Gemm's B, a Conv's
# W. Other constants it quantizes (an Add's bias, a Mul's factor) take the activation type.
_KERNEL_INPUTS = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1}


def quantization_types(model) -> dict:
    """``activation_type``, ``weight_type`` (QuantType names: the most common zero-point type
    of each kind, a weight's read where a MatMul, Gemm or Conv takes its kernel, else of any
    quantized constant but an int32 bias) and ``per_channel`` (a kernel with more than one
    scale) of a QDQ graph."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    kernel_reads = {node.input[position] for node in model.graph.node
                    for op, position in _KERNEL_INPUTS.items()
                    if node.op_type == op and len(node.input) > position}
    activations: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    constants: collections.Counter = collections.Counter()
    per_channel = False
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in weights \
                and len(node.input) > 2 and node.input[2] in weights:
            activations[weights[node.input[2]].data_type] += 1
        elif node.op_type == "DequantizeLinear" and node.input[0] in weights:
            data_type = weights[node.input[0]].data_type
            if data_type == 6:  # int32: a bias
                continue
            if node.output[0] not in kernel_reads:
                constants[data_type] += 1
                continue
            kernels[data_type] += 1
            scale = weights.get(node.input[1])
            per_channel = per_channel or (scale is not None and math.prod(scale.dims) > 1)
    named = {kind: _QUANT_TYPE_NAMES.get(counts.most_common(1)[0][0] if counts else 3, "QInt8")
             for kind, counts in (("activation_type", activations),
                                  ("weight_type", kernels or constants))}
    return {**named, "per_channel": per_channel}


def _kernel_quantizations(index: GraphIndex, values: Callable) -> list[tuple]:
    """``(quantized values, zero point)`` of every kernel a MatMul, Gemm or Conv reads through
    a DequantizeLinear of a quantized weight; ``values`` gives an initializer's array."""
    found = []
    for node in index.nodes:
        position = _KERNEL_INPUTS.get(node.op_type)
        if position is None or len(node.input) <= position:
            continue
        dequantize = _weight_dequantizer(index, node.input[position])
        if dequantize is None or len(dequantize.input) < 3:
            continue
        weight, zero = values(dequantize.input[0]), values(dequantize.input[2])
        if weight is not None and zero is not None and weight.dtype.kind in "iu" and weight.size:
            found.append((weight, zero))
    return found


def _reduced_range(kernels: list[tuple]) -> bool:
    """Whether every kernel keeps to half its type's range, as quantize_static's
    ``reduce_range`` (7 bits of 8) writes them; a full-range kernel reaches an end."""
    import numpy as np

    spans = [(int(weight.max()) - int(weight.min()),
              int(np.iinfo(weight.dtype).max) - int(np.iinfo(weight.dtype).min))
             for weight, _ in kernels]
    return bool(spans) and any(span for span, _ in spans) and all(
        span <= (full + 1) // 2 for span, full in spans)


def _centred(points: list) -> bool:
    """Whether every zero point sits at the middle of its type (0 for a signed one, 128 for
    uint8), as a symmetric quantizer writes them; False for none."""
    import numpy as np

    return bool(points) and all(
        point.dtype.kind in "iu" and np.all(point == (
            0 if point.dtype.kind == "i" else (int(np.iinfo(point.dtype).max) + 1) // 2))
        for point in points)


def _same_numbers(mine: tuple | None, theirs: tuple | None) -> bool:
    """Whether two (scale, zero point) pairs hold the same numbers, exactly."""
    return mine is not None and theirs is not None and len(mine) == len(theirs) and all(
        a is not None and b is not None and a.shape == b.shape and bool((a == b).all())
        for a, b in zip(mine, theirs))


def _visible_options(model) -> dict:
    """The quantize_static extra_options a QDQ graph shows: ``ActivationSymmetric`` where
    every activation's zero point sits at the middle of its type, ``DedicatedQDQPair`` where a
    tensor has a QuantizeLinear for each reader. (``ForceQuantizeNoInputCheck`` and the like
    can leave no trace; they are taken as off unless the tensors say otherwise.)"""
    from onnx import numpy_helper

    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    quantizers = [node for node in model.graph.node
                  if node.op_type == "QuantizeLinear" and node.input[0] not in weights]
    options = {}
    # (only a range calibrated anew depends on it: every other number is the int8 model's)
    if _centred([numpy_helper.to_array(weights[node.input[2]]) for node in quantizers
                 if len(node.input) > 2 and node.input[2] in weights]):
        options["ActivationSymmetric"] = True
    if any(count > 1 for count in collections.Counter(
            node.input[0] for node in quantizers).values()):
        options["DedicatedQDQPair"] = True
    return options


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The quantizer's advice ("consider pre-processing") and prints stay out of eprun's
    output, once per call; ``EPRUN_DEBUG=1`` keeps them."""
    import logging
    import warnings

    if debugging():
        yield
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), open(os.devnull, "w") as sink, \
                contextlib.redirect_stdout(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def _shown_op_types(index: GraphIndex, present: set[str]) -> list[list[str]]:
    """The ``op_types_to_quantize`` a QDQ graph suggests, among the op types ``present``, most
    likely first: those of the nodes that read a quantized weight (a weight is quantized for
    its reader alone); then those of every node that reads a DequantizeLinear's output (a
    reader of a shared activation may be left in float: a residual Add beside a MatMul)."""
    weights, activations = set(), set()
    for node in index.nodes:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for name in node.input:
            producer = index.producer(name) if name else None
            if producer is not None and producer.op_type == "DequantizeLinear":
                activations.add(node.op_type)
                if producer.input[0] in index.initializers:
                    weights.add(node.op_type)
    shown = []
    for types in (weights & present, (weights | activations) & present):
        if types and sorted(types) not in shown and types != present:
            shown.append(sorted(types))
    return shown


def _touched(difference: frozenset) -> set[str]:
    """The float tensors behind a signature difference (quantize_static names a quantized
    weight W ``W_quantized``)."""
    return {name for _, name in difference} | {
        name[:-len("_quantized")] for kind, name in difference
        if kind == "weight" and name.endswith("_quantized")}


class _Found(NamedTuple):
    """Where ``Requantizer.settle``'s search stands: how many quantized tensors still differ
    from the int8 model's, which, and under which op type list."""

    distance: int
    difference: frozenset
    types: list[str]


class QuantizerFailure(EprunError):
    """quantize_static raised: a model or an exclusion onnxruntime's quantizer cannot do."""


class Requantizer:
    """The installed onnxruntime's ``quantize_static`` (QDQ), set up to write the int8 model
    again from the fp32 one, so that what it makes of ``nodes_to_exclude=[...]`` follows the
    quantizer's own rules: which Q/DQ pairs survive an exclusion (one that a Transpose or a
    residual Add needed goes with it), what a restricted ``op_types_to_quantize`` leaves alone.

    Its settings are read off the int8 model: the quantization types, ``per_channel``,
    ``reduce_range`` and the extra options a graph shows from its zero points, scales and
    kernels; ``op_types_to_quantize``, an extra option that changes the quantized tensors and
    the nodes it already leaves in float by search, until the quantized tensors are the int8
    model's (``settle``). Its numbers are the int8 model's: every scale, zero point and
    quantized weight it has is taken from there, so only a tensor the int8 model never
    quantized keeps the range calibration on ``batches`` gave it (eprun's seeded input, or
    with ``calibrated`` the int8 model's own calibration data, whose activation numbers are
    kept: ``_take_activation``)."""

    def __init__(self, fp32_path: str, fp32_model, int8_model, *, int8_values: Callable,
                 batches: list[dict], calibrated: bool, folder: str) -> None:
        """``batches`` are what the quantizer calibrates on; ``calibrated``: they are the
        int8 model's own calibration data, so the activations keep the numbers it derives."""
        from onnxruntime import quantization  # ImportError: the caller falls back

        self.quantization, self.batches, self.folder = quantization, batches, folder
        self.calibrated = calibrated
        self.int8_model, self.int8_values = int8_model, int8_values
        index = self.int8_index = GraphIndex.of(int8_model.graph)
        self.target = quantized_signature(int8_model)
        self.types = quantization_types(int8_model)
        self.extra_options = _visible_options(int8_model)
        kernels = _kernel_quantizations(index, int8_values)
        self.types["reduce_range"] = _reduced_range(kernels)
        symmetric = _centred([zero for _, zero in kernels])
        if kernels and symmetric != self.types["weight_type"].startswith("QInt"):
            self.extra_options["WeightSymmetric"] = symmetric  # not the weight type's default
        self.output_path = os.path.join(folder, "requantized.onnx")
        self.calls = 0
        self.progress: Progress | None = None
        self.op_types: list[str] | None = None  # None: quantize_static's default
        self.excluded: list[str] = []
        self.source = fp32_path
        self.fp32_nodes = {node.name: node for node in _named_nodes(fp32_model.graph)}
        self.fp32_initializers = {tensor.name: tensor for tensor in fp32_model.graph.initializer}
        self.fp32_path, self.large = self._named_copy(fp32_path)
        self.int8_quantizers = _activation_quantizers(index)
        named = list(_named_nodes(int8_model.graph))
        self.int8_nodes = {node.name: node for node in named}
        self.borrowed = _borrowed_ranges(named, index, self.int8_quantizers, int8_values)
        # tensor -> (scale, zero point) quantize_static calibrated on ``batches``, nothing
        # excluded, where they are said to be the int8 model's data: set by the first
        # model([]) (the check that it writes the int8 model again)
        self.calibrated_values: dict | None = None
        # (node, input position) -> the DequantizeLinear of a weight it reads in the int8 model
        self.int8_weight_readers = {
            (node.name, position): _weight_dequantizer(index, name)
            for node in named
            for position, name in enumerate(node.input)
            if _weight_dequantizer(index, name) is not None}

    def _named_copy(self, fp32_path: str) -> tuple[str, bool]:
        """The fp32 model copied into the scratch folder, where quantize_static may write beside
        it (it writes ``<stem>-inferred.onnx`` next to its input, and would remove a user's
        file of that name), each unnamed node named as eprun names its unit
        (``_named_nodes``), since quantize_static excludes nodes by name; and whether it is
        large enough to need external data."""
        import onnx

        model = onnx.load(fp32_path)
        for node, named in zip(model.graph.node, list(_named_nodes(model.graph))):
            node.name = named.name
        path = os.path.join(self.folder, "fp32.onnx")
        large = model.ByteSize() > (1 << 30)  # protobuf's 2 GB limit, with room
        onnx.save(model, path, save_as_external_data=large)
        return path, large

    def quantize(self, op_types: list[str] | None, excluded) -> Any:
        """One quantize_static call, calibrated on ``batches``; the graph it wrote."""
        import onnx

        quantization = self.quantization
        feeds = iter(self.batches)

        class Reader(quantization.CalibrationDataReader):
            def get_next(self):
                """The next calibration batch, None when they are all given."""
                return next(feeds, None)

        self.calls += 1
        import tempfile

        saved, tempfile.tempdir = tempfile.tempdir, self.folder  # its temporaries: in ours
        try:
            with _quiet_quantizer():
                quantization.quantize_static(
                    self.fp32_path, self.output_path, Reader(),
                    quant_format=quantization.QuantFormat.QDQ, op_types_to_quantize=op_types,
                    nodes_to_exclude=sorted(excluded), per_channel=self.types["per_channel"],
                    activation_type=getattr(quantization.QuantType,
                                            self.types["activation_type"]),
                    weight_type=getattr(quantization.QuantType, self.types["weight_type"]),
                    reduce_range=self.types["reduce_range"],
                    use_external_data_format=self.large, extra_options=dict(self.extra_options))
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # the quantizer's own failure, on this model
            raise QuantizerFailure(
                f"onnxruntime's quantize_static fails on {self.source!r} with "
                f"nodes_to_exclude={sorted(excluded)} ({type(exc).__name__}: "
                f"{one_line(exc)})") from exc
        finally:
            tempfile.tempdir = saved
        return onnx.load(self.output_path)

    def _distance(self, op_types, excluded) -> tuple[int, frozenset]:
        """How far quantize_static with ``op_types`` and ``excluded`` is from the int8 model: how
        many quantized tensors differ, and which; each call is a step of progress."""
        difference = quantized_signature(self.quantize(op_types, excluded)) ^ self.target
        if self.progress is not None:
            self.progress.step(self.calls)
        return len(difference), difference

    def settle(self, fp32_model, quantizable: set[str]) -> bool:
        """Settings under which quantize_static writes the int8 model's quantized tensors: its
        default op types (alone, then with each structural option); else the op type lists
        the int8 model shows (``_shown_op_types``), then, from the closest list, dropping one
        op type at a time while that brings the tensors closer, then every op type it can do
        without (a restricted list is a short one); then nodes left in float, among those
        that read or write a tensor that still differs. False if none is found within
        ``REQUANTIZE_SEARCH_CALLS`` calls."""
        self.progress = Progress("matching quantize_static's settings to the int8 model")
        try:
            return self._settle(fp32_model, quantizable)
        finally:
            self.progress.close()
            self.progress = None

    def _settle(self, fp32_model, quantizable: set[str]) -> bool:
        """``settle``'s search, one phase after another, each from the closest settings the
        phases before it found: ``(distance, difference, op types)``."""
        distance, difference = self._distance(None, ())
        if self._settled_by_an_option(distance):
            return True
        # the default list, restricted to the op types present: the same decisions
        every = {node.op_type for node in fp32_model.graph.node} & quantizable
        found = self._closest_shown(distance, difference, sorted(every))
        found = self._drop_op_types(*found)
        distance, difference, types = found
        if distance == 0:
            types = self._without_unneeded(types)
        excluded, distance, difference = self._exclude_nodes(fp32_model, found._replace(
            types=types))
        if distance:
            self.difference = difference
            return False
        self.op_types = None if set(types) == every else types  # None: the default list
        self.excluded = excluded
        return True

    def _settled_by_an_option(self, distance: int) -> bool:
        """Does the default list write the int8 model, alone or with one structural option
        (which then stays set)?"""
        kept = self.extra_options
        for options in _STRUCTURAL_OPTIONS if distance else ():  # one alone may be all it takes
            self.extra_options = {**kept, **options}
            if self._distance(None, ())[0] == 0:
                return True
        self.extra_options = kept
        return distance == 0

    def _closest_shown(self, distance: int, difference: frozenset,
                       types: list[str]) -> _Found:
        """The lists the twin shows (one call each), before a search that drops one op type
        per round: a restricted list is mostly what the twin's DequantizeLinears are read
        by."""
        for shown in _shown_op_types(self.int8_index, set(types)):
            trial, trial_difference = self._distance(shown, ())
            if trial < distance:
                distance, difference, types = trial, trial_difference, shown
            if distance == 0:
                break
        return _Found(distance, difference, types)

    def _drop_op_types(self, distance: int, difference: frozenset, types: list[str]) -> _Found:
        """One op type dropped per round, the one that brings the tensors closest, while
        that brings them closer."""
        while distance and self.calls + len(types) <= REQUANTIZE_SEARCH_CALLS:
            trials = [(self._distance([t for t in types if t != op], ()), op) for op in types]
            (best, best_difference), op = min(trials, key=lambda trial: trial[0][0])
            if best >= distance:
                break
            distance, difference = best, best_difference
            types = [t for t in types if t != op]
        return _Found(distance, difference, types)

    def _without_unneeded(self, types: list[str]) -> list[str]:
        """Every op type the list can do without, still writing the int8 model: a restricted
        list is a short one."""
        for op in list(types):
            if len(types) > 1 and self.calls < REQUANTIZE_SEARCH_CALLS and \
                    self._distance([t for t in types if t != op], ())[0] == 0:
                types = [t for t in types if t != op]
        return types

    def _exclude_nodes(self, fp32_model, found: _Found) -> tuple[list[str], int, frozenset]:
        """``(excluded, distance, difference)``: nodes left in float, among those that read or
        write a tensor that still differs, each kept where it brings the tensors closer."""
        distance, difference, types = found
        excluded: list[str] = []
        in_int8 = {node.name for node in self.int8_model.graph.node}
        progress = True
        while distance and progress and self.calls < REQUANTIZE_SEARCH_CALLS:
            progress = False
            touched = _touched(difference)
            for node in fp32_model.graph.node:
                if (node.op_type in types and node.name in in_int8 and node.name not in excluded
                        and touched.intersection((*node.input, *node.output))
                        and self.calls < REQUANTIZE_SEARCH_CALLS):
                    trial, trial_difference = self._distance(types, [*excluded, node.name])
                    if trial < distance:
                        distance, difference, progress = trial, trial_difference, True
                        excluded.append(node.name)
                        touched = _touched(difference)
        return excluded, distance, difference

    def model(self, excluded: list[str]) -> tuple[Any, dict, list[str], list[str]]:
        """The graph quantize_static writes with ``excluded`` (and the nodes the int8 model
        leaves in float) kept in float, its numbers taken from the int8 model: ``(model,
        arrays by initializer name, tensors whose numbers the int8 model does not hold,
        tensors it would calibrate anew)``.
        The arrays replace the graph's own initializers of those names.

        An activation's scale and zero point are the int8 model's QuantizeLinear's for the
        same tensor; a weight's or bias's are those the same node reads at the same input in
        the int8 model (not those of the same name: a bias shared by two nodes is quantized
        once for each, and which gets the plain name depends on what is excluded)."""
        from onnx import numpy_helper

        model = self.quantize(self.op_types, [*self.excluded, *excluded])
        index = GraphIndex.of(model.graph)
        own = index.initializers
        quantizers = _activation_quantizers(index)
        if self.calibrated and self.calibrated_values is None and not excluded:
            self.calibrated_values = {tensor: _quantization_values(own, node)
                                      for tensor, node in quantizers.items()}
        taking = _Taking(own, self.int8_values)
        left = {*self.excluded, *excluded}
        for node in model.graph.node:
            if node.op_type == "QuantizeLinear" and node.input[0] not in own:
                self._take_activation(taking, node, quantizers, left)
        self._take_weights(taking, index, model, left)
        arrays = {}
        for name, value in taking.values.items():  # small ones inline, large ones as arrays
            if value.nbytes < DETACH_MIN_BYTES:
                own[name].CopyFrom(numpy_helper.from_array(value, name))
            else:
                arrays[name] = value
        kept = [tensor for tensor in model.graph.initializer if tensor.name not in arrays]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        return model, arrays, taking.unknown, taking.fresh

    def _take_weights(self, taking: _Taking, index: GraphIndex, model, left: set) -> None:
        """``model``'s quantized weights and biases (``index`` its graph's, ``left`` the nodes
        it keeps in float) get the numbers of those the same node reads at the same input in
        the int8 model, each for the first quantized node that reads it, as the quantizer
        quantizes it; a bias the int8 model quantized for another reader, as the quantizer
        does for this one (``_take_bias_for``)."""
        own = index.initializers
        readers = sorted(_named_nodes(model.graph), key=lambda node: node.name in left)
        done: set[str] = set()
        rescaled: set[str] = set()
        for node in readers:  # the quantized readers first: a weight is quantized for them
            for position, name in enumerate(node.input):
                dequantize = _weight_dequantizer(index, name)
                if dequantize is None or dequantize.input[0] in rescaled or \
                        (node.name in left and dequantize.input[0] in done):
                    continue  # (a node left in float may read what was quantized for another)
                first = dequantize.input[0] not in done
                done.add(dequantize.input[0])
                bias = own[dequantize.input[0]].data_type == 6
                if self.calibrated and bias and not self._same_input_scale(index, node):
                    continue  # an int32 bias follows its input's scale, calibrated anew here
                theirs = self.int8_weight_readers.get((node.name, position))
                moved = self._moved_bias_scale(theirs, taking, index, node) if first and bias \
                    else None
                if moved is not None:
                    self._take_bias_for(taking, index, node, dequantize, moved)
                    rescaled.add(dequantize.input[0])  # its first reader's, for every reader
                else:
                    taking.take(dequantize.input, theirs, dequantize.input[0])

    def _moved_bias_scale(self, theirs, taking: _Taking, index: GraphIndex, node):
        """Where the int8 model's int32 bias that ``node`` (a Gemm, Conv, LayerNorm, ... of the
        requantized graph) reads, ``theirs`` its DequantizeLinear, was quantized for another
        reader, the scale it has for ``node`` (``_bias_scale``); else None. onnxruntime before
        1.20 quantizes a bias several nodes read once, for the first of them it quantizes, so
        excluding that one gives the bias to the next at its own scales, which the int8 model
        does not hold."""
        if theirs is None or len(self.int8_index.readers.get(theirs.output[0], ())) < 2:
            return None
        import numpy as np

        scale, held = self._bias_scale(taking, index, node), self.int8_values(theirs.input[1])
        if scale is None or held is None or _same_numbers(
                (np.asarray(scale, dtype=held.dtype).reshape(-1),), (held.reshape(-1),)):
            return None
        return scale

    def _bias_scale(self, taking: _Taking, index: GraphIndex, node):
        """The scale quantize_static gives ``node``'s int32 bias, from the scales its input and
        weight are read with in the requantized graph (the int8 model's, once taken): input
        scale x weight scale x a Gemm's beta, computed as the quantizer does. None where an
        input is not read through a DequantizeLinear."""
        from onnx import helper, numpy_helper

        scales = []
        for name in node.input[:2]:
            dequantize = index.producer(name)
            if dequantize is None or dequantize.op_type != "DequantizeLinear" or \
                    dequantize.input[1] not in index.initializers:
                return None
            scale = dequantize.input[1]
            scales.append(taking.values[scale] if scale in taking.values else
                          numpy_helper.to_array(index.initializers[scale]))
        original = self.fp32_nodes.get(node.name, node)  # (the quantizer sets beta to 1)
        beta = next((helper.get_attribute_value(attribute) for attribute in original.attribute
                     if attribute.name == "beta"), 1.0) if node.op_type == "Gemm" else 1.0
        return scales[0] * scales[1] * beta

    def _take_bias_for(self, taking: _Taking, index: GraphIndex, node, dequantize,
                       scale) -> None:
        """``dequantize``'s int32 bias quantized for ``node`` as quantize_static does, from the
        fp32 model's bias: its values over ``scale`` (``_moved_bias_scale``), rounded; where
        the fp32 model has no such initializer, it is named in ``unknown``."""
        import numpy as np

        fp32_node = self.fp32_nodes.get(node.name)
        name = fp32_node.input[2] if fp32_node is not None and len(fp32_node.input) > 2 else None
        tensor = self.fp32_initializers.get(name)
        if tensor is None:
            taking.unknown.append(dequantize.input[0])
            return
        bias = _initializer_array(tensor, self.source)
        own = index.initializers
        taking.values[dequantize.input[0]] = np.asarray(
            (np.asarray(bias) / scale).round().astype(np.int32)).reshape(
                tuple(own[dequantize.input[0]].dims))
        taking.values[dequantize.input[1]] = np.asarray(scale, dtype=bias.dtype).reshape(
            tuple(own[dequantize.input[1]].dims))
        for mine in dequantize.input[:2]:
            taking.assigned[mine] = f"quantized for {node.name}"

    def _same_input_scale(self, index: GraphIndex, node) -> bool:
        """Whether ``node`` (a Gemm or Conv of the requantized graph) reads its input with the
        scale the same node reads it with in the int8 model: then its int32 bias is the int8
        model's, scaled by the int8 model's weight scale, which the weight taken from there
        needs (the quantizer's own weight scale can differ: reduce_range, WeightSymmetric)."""
        from onnx import numpy_helper

        theirs_node = self.int8_nodes.get(node.name)
        mine = index.producer(node.input[0]) if node.input else None
        theirs = (self.int8_index.producer(theirs_node.input[0])
                  if theirs_node is not None and theirs_node.input else None)
        if mine is None or theirs is None or mine.op_type != "DequantizeLinear" or \
                theirs.op_type != "DequantizeLinear" or mine.input[1] not in index.initializers:
            return False
        return _same_numbers((numpy_helper.to_array(index.initializers[mine.input[1]]),),
                             (self.int8_values(theirs.input[1]),))

    def calibration_differs(self) -> str | None:
        """Where the quantizer's own calibration (nothing excluded) does not give the int8
        model's scale or zero point, the first such tensor said with both scales; None where
        every one agrees."""
        import numpy as np

        for tensor, node in self.int8_quantizers.items():
            mine = (self.calibrated_values or {}).get(tensor)
            theirs = tuple(self.int8_values(name) for name in node.input[1:3])
            if mine is None or len(theirs) < 2 or any(value is None for value in theirs):
                continue
            if mine[0].shape != theirs[0].shape or not (
                    np.allclose(mine[0], theirs[0], rtol=1e-6, atol=0)
                    and np.array_equal(mine[1], theirs[1])):
                return (f"{tensor!r} with scale {np.ravel(mine[0])[0]:.6g}, the int8 model has "
                        f"{np.ravel(theirs[0])[0]:.6g}")
        return None

    def _take_activation(self, taking: _Taking, node, quantizers: dict, left: set) -> None:
        """An activation's scale and zero point, ``node`` its QuantizeLinear in the requantized
        graph (``quantizers``: its activation QuantizeLinears, ``left``: the nodes it leaves in
        float): the int8 model's, unless the quantizer calibrated on the int8 model's own data
        (``calibrated``: then its numbers are the int8 model's already). Where the tensor
        borrowed its range along a chain this graph cuts, the quantizer calibrates it anew from
        data eprun does not have: that is said (``fresh``), and the int8 number is still the
        nearest there is."""
        if self.calibrated:
            return
        tensor = node.input[0]
        if self._cut_from_its_range(tensor, quantizers, taking.own, left) and \
                repr(tensor) not in taking.fresh:
            taking.fresh.append(repr(tensor))
        taking.take(node.input[1:], self.int8_quantizers.get(tensor), tensor)

    def _cut_from_its_range(self, tensor: str, quantizers: dict, own: dict, left: set) -> bool:
        """Whether ``tensor`` borrowed its range in the int8 model along a chain that this
        graph cuts, from a tensor whose range is not its own: the quantizer then calibrates
        the tensor after the cut itself. A loan is cut where its op is left in float, the
        lender is no longer quantized, or the two no longer share the numbers here (the
        quantizer passes a scale on only to an op it reaches after the input was quantized,
        in node order: excluding the earlier readers of a tensor ends a MaxPool's loan).
        ``quantizers``: this graph's activation QuantizeLinears, ``own`` its initializers."""
        path, current, seen = [], tensor, {tensor}
        while current in self.borrowed:
            lender, op_type, node_name, by_name = self.borrowed[current]
            if lender in seen:
                break
            path.append((current, lender, op_type, node_name, by_name))
            seen.add(lender)
            current = lender
        for k, (child, lender, _, node_name, by_name) in enumerate(path):
            if node_name in left or lender not in quantizers or child not in quantizers:
                cut = True
            elif by_name:
                cut = quantizers[child].input[1] != quantizers[lender].input[1]
            else:
                cut = not _same_numbers(_quantization_values(own, quantizers[child]),
                                        _quantization_values(own, quantizers[lender]))
            if cut:
                return not {op for _, _, op, _, _ in path[k:]} <= _RANGE_KEEPING_OPS
        return False


def _weight_dequantizer(index: GraphIndex, name: str):
    """The DequantizeLinear of a quantized weight (an initializer) that writes ``name``, if
    one does."""
    node = index.producer(name)
    if node is not None and node.op_type == "DequantizeLinear" and \
            node.input[0] in index.initializers:
        return node
    return None


def _named_nodes(graph) -> Iterator:
    """The graph's nodes, each unnamed one named as eprun names its unit (``<op>#<k>``), in a
    copy: how a requantized node and the int8 model's node it was are paired."""
    counts: collections.Counter = collections.Counter()
    for node in graph.node:
        if node.name:
            yield node
            continue
        named = type(node)()
        named.CopyFrom(node)
        named.name = f"{node.op_type}#{counts[node.op_type]}"
        counts[node.op_type] += 1
        yield named


def _quantization_values(initializers: dict, quantize) -> tuple | None:
    """The (scale, zero point) arrays a QuantizeLinear reads from ``initializers``."""
    from onnx import numpy_helper

    names = list(quantize.input[1:3])
    if len(names) < 2 or not set(names) <= initializers.keys():
        return None
    return tuple(numpy_helper.to_array(initializers[name]) for name in names)


def _activation_quantizers(index: GraphIndex) -> dict:
    """Each quantized activation's QuantizeLinear, by the tensor it reads."""
    return {node.input[0]: node for node in index.nodes
            if node.op_type == "QuantizeLinear" and node.input[0] not in index.initializers}


# Ops whose output holds exactly their input's values, moved or repeated: the range a quantizer
# calibrates for the output is the input's, whatever the data.
_RANGE_KEEPING_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                                "Identity", "DepthToSpace", "SpaceToDepth", "Expand", "Tile"})
# Activations a symmetric quantizer gives their input's range the other way round: the input
# takes the output's (quantize_static with ActivationSymmetric, a Relu it cannot fold).
_RANGE_LENDING_OUTPUTS = frozenset({"Relu", "Clip"})
# Ops a quantizer gives their input's scale and zero point (onnxruntime's QDQ pass-through
# ops and their kin): where another tool names the shared numbers twice, equal numbers across
# one of these are taken as borrowed; across any other op they are a coincidence of the data.
_RANGE_PASSING_OPS = _RANGE_KEEPING_OPS | {"Slice", "Split", "Gather", "GatherElements", "TopK",
                                          "MaxPool", "AveragePool", "Resize", "Pad"}


def _borrowed_ranges(nodes, index: GraphIndex, quantizers: dict, values: Callable) -> dict:
    """Which activations of a QDQ graph (``nodes``, named as the units are) borrowed their
    scale and zero point from a neighbour, as a quantizer gives an op that passes values on
    (Reshape, Slice, MaxPool, Split) its input's, and a symmetric one a Relu's input the
    Relu's output: ``{tensor: (lender, op type, node name, by name)}``, for every op whose
    input and output are quantized with the same numbers (by name, or by value across
    ``_RANGE_PASSING_OPS``)."""
    borrowed: dict = {}

    def numbers(tensor: str):
        """The scale and zero point of the QuantizeLinear that quantizes ``tensor``."""
        node = quantizers[tensor]
        return [values(name) for name in node.input[1:3]]

    for node in nodes:
        if node.op_type in _QDQ_OPS:
            continue
        for output in node.output:
            if output not in quantizers:
                continue
            theirs = numbers(output)
            for name in node.input:
                dequantize = index.producer(name)
                quantize = index.producer(dequantize.input[0]) if dequantize is not None and \
                    dequantize.op_type == "DequantizeLinear" else None
                if quantize is None or quantize.op_type != "QuantizeLinear" or \
                        quantize.input[0] not in quantizers or quantize.input[0] == output:
                    continue
                same_name = quantize.input[1] == quantizers[output].input[1]
                if not same_name and (
                        node.op_type not in _RANGE_PASSING_OPS | _RANGE_LENDING_OUTPUTS
                        or not _same_numbers(numbers(quantize.input[0]), theirs)):
                    continue
                if node.op_type in _RANGE_LENDING_OUTPUTS:
                    borrowed.setdefault(quantize.input[0],
                                        (output, node.op_type, node.name, same_name))
                else:
                    borrowed.setdefault(output,
                                        (quantize.input[0], node.op_type, node.name, same_name))
    return borrowed


class _Taking:
    """Numbers taken over from the int8 model into a requantized graph's initializers
    (``own``): each only where its shape and type fit and no initializer would get two; what
    cannot be taken is named in ``unknown``."""

    def __init__(self, own: dict, int8_values: Callable) -> None:
        """Nothing taken yet: ``own`` holds the requantized graph's initializers by name,
        ``int8_values`` gives an int8 tensor's value by name (None where unknown)."""
        self.own, self.int8_values = own, int8_values
        self.values: dict = {}
        self.assigned: dict[str, str] = {}
        self.unknown: list[str] = []
        self.fresh: list[str] = []  # ranges the quantizer would calibrate anew, said once each

    def take(self, mine: list[str], theirs, what: str) -> None:
        """``mine`` (initializer names) get the values of ``theirs``' same inputs."""
        from onnx import helper

        if theirs is None:
            self.unknown.append(what)
            return
        their_names = list(theirs.input) if len(mine) == len(theirs.input) else \
            list(theirs.input[1:])
        for name, their in zip(mine, their_names):
            value = self.int8_values(their)
            tensor = self.own.get(name)
            fits = (value is not None and tensor is not None
                    and value.shape == tuple(tensor.dims)
                    and value.dtype == helper.tensor_dtype_to_np_dtype(tensor.data_type))
            if not fits or self.assigned.get(name, their) != their:  # one name, two values
                self.unknown.append(what)
                return
            self.assigned[name] = their
            self.values[name] = value


# How an estimate by graph edits in the quantizer's place begins (``SensitivityStudy.inexact``).
_GRAPH_EDITS_STAND_IN = "graph edits stand in for quantize_static"


def _for_graph_edits_only(inexact: str | None) -> bool:
    """Is a unit exact but for graph edits standing in for the quantizer? Then it is no
    worse an estimate than every other unit, and keeps its rank in the recommendation."""
    return inexact is None or inexact.startswith(_GRAPH_EDITS_STAND_IN)


# -- measurement: a sensitivity run, its calibration data, its worker processes --------------------

@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """How a ``SensitivityStudy`` opens. ``swapped_ok``: the pair's order goes unchecked;
    ``requantize`` False: graph edits only; ``calibration``: the file of the data the int8
    model was calibrated on; ``extra_options``: quantize_static options it was made with that
    it may not show. A worker's own: ``settled`` (op types, nodes left in float, calibrated:
    what its parent found and checked), ``folder`` (inside the parent's own) and
    ``session_config`` (config entries for every session it opens). ``restore_to``: what a
    weight-only twin's restored MatMul becomes, ``float`` or ``int8`` (an 8-bit MatMulNBits
    of the float weight, ``restore_weight_only``)."""

    swapped_ok: bool = False
    requantize: bool = True
    restore_to: str = "float"
    calibration: str | None = None
    extra_options: dict | None = None
    settled: tuple | None = None
    folder: str | None = None
    session_config: dict | None = None


# Worker processes side by side: a thread that spins while it waits takes a core from the
# other. (How many threads a session has, which could change its numbers, stays the default.)
WORKER_SESSION_CONFIG = {"session.intra_op.allow_spinning": "0",
                         "session.inter_op.allow_spinning": "0"}


class SensitivityStudy:
    """The fp32 model's final output, and the int8 model's with any set of units restored.

    Restored units are requantized: the graph is the one the installed onnxruntime's
    quantize_static writes with them in ``nodes_to_exclude`` (``Requantizer``), its numbers
    the int8 model's. Where the quantizer cannot be imported or cannot be made to write the
    int8 model again, eprun edits the int8 graph instead (``restore_to_float``) and says so
    (``predicted_by``). A weight-only twin of MatMulNBitsQuantizer (``weight_only``: 4-, 8- or
    2-bit MatMulNBits, or MatMuls of blockwise DequantizeLinear weights) is always restored
    by graph edits (``restore_weight_only``), which write what that quantizer writes with the
    units in its ``nodes_to_exclude``; quantize_static does not run. A context manager: its
    scratch folder goes when the block ends."""

    def __init__(self, fp32: str, int8: str, seed: int, inputs: InputOptions | None,
                 *, targets: Targets | None = None, options: StudyOptions | None = None) -> None:
        """Open the study (``_open``): both models read, the fp32 reference run, the quantizer set
        up; if that fails, what it opened is closed again."""
        options = options or StudyOptions()
        self._stack = contextlib.ExitStack()
        self._settled, self._folder = options.settled, options.folder
        self.calibration = options.calibration
        self.restore_to = options.restore_to
        self.given_options = dict(options.extra_options or {})
        # session_options' keywords for every session the study opens (None: the defaults)
        self._session_options = ({"config": options.session_config}
                                 if options.session_config else None)
        try:
            self._open(fp32, int8, seed, inputs, targets=targets,
                       swapped_ok=options.swapped_ok, requantize=options.requantize)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> SensitivityStudy:
        """The study itself, closed when the block ends."""
        return self

    def __exit__(self, *exc_info) -> None:
        """Close the study; an exception from the block goes on."""
        self.close()

    def close(self) -> None:
        """Remove the scratch folder the study made, if any (a worker's is its parent's)."""
        self._stack.close()

    def _open(self, fp32: str, int8: str, seed: int, inputs: InputOptions | None, *,
              targets: Targets | None, swapped_ok: bool, requantize: bool) -> None:
        """``__init__``'s work: read and check both models and the calibration file, draw the feeds,
        find the units, run the fp32 model for the reference output, and set up the requantizer (or
        graph edits, said in a note), keeping only the units it can restore."""
        require_file(fp32)
        require_file(int8)
        self.fp32, self.int8 = fp32, int8
        self.targets = targets or Targets()
        self.got = Got([])
        self.unknown: list[str] = []
        self.fresh: list[str] = []
        self.fp32_model = load_model(fp32, text_names=True)
        self.int8_model = load_model(int8, text_names=True)
        require_in_order((self.fp32_model, self.int8_model), (fp32, int8), swapped_ok)
        # a calibration file that does not fit fails before anything runs
        self.batches = (calibration_batches(self.fp32_model, self.calibration, fp32)
                        if self.calibration else None)
        self.weight_only = weight_only_twin(self.fp32_model, self.int8_model)
        if self.restore_to != "float":
            _require_int8_restore(self.weight_only, int8, self.fp32_model, fp32)
        if self.weight_only is None:
            require_qdq_form(self.int8_model, int8)
        self.feed = make_feeds(specs_from_model(self.fp32_model), seed, inputs, fp32)
        self.int8_feed = feed_for(specs_from_model(self.int8_model), int8, self.feed)
        # Inline int8 weights become arrays once (large ones are read from the file by
        # each session); each rebuilt graph copies placeholders only.
        self.int8_weights = dict(zip(*detach_initializers(self.int8_model)))
        self._int8_tensors = {tensor.name: tensor for tensor in self.int8_model.graph.initializer}
        self.int8_index = GraphIndex.of(self.int8_model.graph)
        self.units = (self.weight_only.units if self.weight_only is not None else
                      quantized_units(self.fp32_model, self.int8_model, self.int8_index))
        fp32_output = _final(self.fp32_model)
        self.output = _final(self.int8_model)
        model = load_model(fp32)
        session = open_exposed(model, fp32, self._session_options, on=self.targets.reference)
        self.reference_got = Got.of(session)
        self.reference = run_session(session, [fp32_output], self.feed.arrays,
                                     what=repr(fp32), hint=dims_hint(self.feed))[0]
        del session
        self.sessions = 0
        # why graph edits stand in for the quantizer that was asked for, once they do
        self.fallback: str | None = None
        self._unrestored: tuple | None = None  # (value, unknown, fresh, got), by _reproduces
        self.requantizer = (self._requantizer() if requantize and self.weight_only is None
                            else None)
        if self.weight_only is not None:
            self._note_weight_only(int8)
        elif self.requantizer is None and requantize:  # graph edits: what was given goes unused
            if self.calibration:
                note(f"--calibration {self.calibration!r} is not used: the quantizer does not "
                     "run (see above), and graph edits take every number from the int8 model")
            if self.given_options:
                note(f"--extra-option {', '.join(self.given_options)} is not used: graph edits "
                     "do not run the quantizer")
        if self.requantizer is not None:
            kept = set(self.requantizer.op_types or _installed_quantizer_op_types())
            left = set(self.requantizer.excluded)
            self.units = [unit for unit in self.units
                          if unit.op_type in kept and unit.name not in left]

    def _note_weight_only(self, int8: str) -> None:
        """What a weight-only twin leaves unused (``--calibration``, ``--extra-option``: its
        restored MatMuls read float weights, no calibrated number), and settings its
        MatMuls do not share (not one MatMulNBitsQuantizer call: the answer gives the most
        common)."""
        twin = self.weight_only
        if self.calibration:
            note(f"--calibration {self.calibration!r} is not used: {int8!r} is a weight-only "
                 "twin (MatMulNBitsQuantizer), whose restored MatMuls read the float weights")
        if self.given_options:
            note(f"--extra-option {', '.join(self.given_options)} is not used: they are "
                 f"quantize_static's, and {int8!r} is a weight-only twin (MatMulNBitsQuantizer)")
        if twin.mixed:
            note(f"{int8!r}'s blockwise MatMuls differ in {', '.join(twin.mixed)}, which one "
                 "MatMulNBitsQuantizer call does not write: its quantizer field gives the "
                 "most common of each")

    @property
    def predicted_by(self) -> str:
        """What wrote the restored graphs: ``quantize_static``, or ``graph edits`` where eprun edits
        the int8 graph instead (always, for a weight-only twin: they write what
        MatMulNBitsQuantizer writes, whose arguments ``quantizer_arguments`` gives)."""
        return "quantize_static" if self.requantizer is not None else "graph edits"

    @property
    def quantizer_name(self) -> str:
        """The quantizer whose ``nodes_to_exclude`` the recommendation is for:
        ``MatMulNBitsQuantizer`` for a weight-only twin, else ``quantize_static``."""
        return "MatMulNBitsQuantizer" if self.weight_only is not None else "quantize_static"

    @property
    def already_excluded(self) -> list[str]:
        """The float nodes the quantized model already leaves in float, which a
        ``nodes_to_exclude`` list that writes it again names too."""
        if self.weight_only is not None:
            return list(self.weight_only.arguments["nodes_to_exclude"])
        return list(self.requantizer.excluded) if self.requantizer is not None else []

    def _int8_value(self, name: str):
        """The int8 model's value of initializer ``name`` (a detached array, or read from its
        tensor); None where it is no initializer."""
        if name in self.int8_weights:
            return self.int8_weights[name]
        tensor = self._int8_tensors.get(name)
        return None if tensor is None else _initializer_array(tensor, self.int8)

    def _requantizer(self) -> Requantizer | None:
        """The installed quantizer, set up to write the int8 model again; None (and a note)
        where it cannot be."""
        folder = self._folder or self._stack.enter_context(scratch_folder("eprun-sensitivity-"))
        self.folder = folder
        fallback = ("sensitivity edits the int8 graph instead, which can differ from what "
                    "quantize_static writes")
        try:
            from onnxruntime import quantization  # noqa: F401 - can it be imported at all?
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # ImportError (sympy), or a release that breaks on import
            self.fallback = (f"onnxruntime.quantization cannot be imported here "
                             f"({type(exc).__name__}: {one_line(exc)})")
            note(f"{self.fallback}; {fallback}")
            return None
        batches = self.batches or [calibration_rows(self.fp32_model, self.feed)]
        requantizer = Requantizer(self.fp32, self.fp32_model, self.int8_model,
                                  int8_values=self._int8_value, batches=batches,
                                  calibrated=bool(self.calibration), folder=folder)
        requantizer.extra_options.update(self.given_options)
        if self._settled is not None:  # a worker: its parent searched and checked
            (requantizer.op_types, requantizer.excluded, requantizer.extra_options,
             requantizer.calibrated) = self._settled
            return requantizer
        try:
            settled = requantizer.settle(self.fp32_model, _installed_quantizer_op_types())
        except QuantizerFailure as exc:
            self._blame_given_options(requantizer, exc)
            self.fallback = str(exc)
            note(f"{exc}; {fallback}")
            return None
        if not settled:
            differ = sorted(name for _, name in requantizer.difference)
            self.fallback = (f"quantize_static, with any settings eprun tried "
                             f"({requantizer.calls} calls), does not quantize the tensors "
                             f"{self.int8!r} quantizes ({len(differ)} differ, e.g. "
                             f"{', '.join(map(repr, differ[:3]))})")
            note(f"{self.fallback}; {fallback}")
            return None
        return requantizer if self._reproduces(requantizer, fallback) else None

    def _blame_given_options(self, requantizer: Requantizer, failure: QuantizerFailure) -> None:
        """A usage error where quantize_static fails only with the ``--extra-option`` given:
        it is the option, not the model."""
        if not self.given_options:
            return
        for key in self.given_options:
            requantizer.extra_options.pop(key, None)
        try:
            requantizer.quantize(None, ())
        except QuantizerFailure:
            return  # it fails without them too: the model's
        given = ", ".join(f"{key}={value!r}" for key, value in self.given_options.items())
        cause = failure.__cause__ or failure
        raise EprunError(f"--extra-option {given}: quantize_static refuses it "
                         f"({type(cause).__name__}: {one_line(cause)})", EXIT_USAGE)

    def _reproduces(self, requantizer: Requantizer, fallback: str) -> bool:
        """Does the requantized model with nothing excluded give the int8 model's own final
        output? Same tensors quantized is not enough where a number could not be taken over
        (a weight quantized per channel here and per tensor there)."""
        import numpy as np

        session = open_exposed(load_model(self.int8), self.int8, self._session_options,
                               on=self.targets.candidate)
        (own,) = run_session(session, [self.output], self.int8_feed, what=repr(self.int8),
                             hint=dims_hint(self.feed))
        del session
        own64 = own.astype(np.float64)
        mine = self._run_variant(requantizer, []).astype(np.float64)
        differs = requantizer.calibration_differs() if requantizer.calibrated else None
        if differs:
            note(f"{self.calibration!r} is not the data {self.int8!r} was calibrated on "
                 f"(quantize_static, MinMax, calibrates {differs}); sensitivity takes the int8 "
                 "model's numbers instead and says where a range would be calibrated anew")
            requantizer.calibrated = False
            mine = self._run_variant(requantizer, []).astype(np.float64)
        # the variant with nothing restored is the ranking's base: measured once, here
        self._unrestored = (self._last_variant, self.unknown, self.fresh, self.got)
        if own64.shape == mine.shape:
            deviation = float(np.abs(own64 - mine).max(initial=0.0))
            if deviation <= 1e-6 * max(float(np.abs(own64).max(initial=0.0)), 1e-30) or \
                    np.array_equal(own64, mine, equal_nan=True):
                return True
        else:
            deviation = math.inf
        self.fallback = (f"quantize_static, set up to write {self.int8!r} again, gives another "
                         f"final output (max abs difference {deviation:.3g}: a number of the "
                         f"int8 model could not be taken over)")
        note(f"{self.fallback}; {fallback}")
        return False

    def measure(self, restored: list[Unit], metrics=("sqnr",)) -> dict:
        """The final output with ``restored`` in float, compared with the fp32 reference
        (``compare_boundary`` with ``metrics``); with nothing restored, the requantized run
        ``_reproduces`` made is reused, not run again."""
        if not restored and self._unrestored is not None and self.requantizer is not None:
            self.last, self.unknown, self.fresh, self.got = self._unrestored
        else:
            self.last = self._run_variant(self.requantizer, restored)
        return compare_boundary(self.reference, self.last, self.feed.rows, metrics)

    def _run_variant(self, requantizer: Requantizer | None, restored: list[Unit]):
        """The int8 model's final output with ``restored`` in float: requantized by
        ``requantizer``, else by graph edits."""
        if requantizer is not None:
            model, arrays, self.unknown, self.fresh = requantizer.model(
                [unit.name for unit in restored])
            path = requantizer.output_path
        else:
            model, arrays = (
                restore_weight_only(self.int8_model, self.fp32_model, restored, self.fp32,
                                    self.weight_only.matmuls if self.restore_to == "int8"
                                    else None)
                if self.weight_only is not None else
                restore_to_float(self.int8_model, self.fp32_model, restored, self.fp32,
                                 self.units))
            used = {tensor.name for tensor in model.graph.initializer}
            arrays = {**{name: array for name, array in self.int8_weights.items()
                         if name in used}, **arrays}
            path, self.unknown, self.fresh = self.int8, [], []
        session = open_exposed(model, path, self._session_options, extra_arrays=arrays,
                               on=self.targets.candidate)
        self.got = Got.of(session)
        self.sessions += 1
        (value,) = run_session(session, [self.output], self.int8_feed, what=repr(self.int8),
                               hint=dims_hint(self.feed))
        self._last_variant = value
        return value

    def inexact(self, restored: list[Unit]) -> str | None:
        """Why the last measure (``restored`` in float) may differ from quantize_static, if it
        may: what the quantizer would calibrate from data eprun does not have (none where it
        calibrates on the int8 model's own, ``--calibration``). For a weight-only twin, why it
        may differ from MatMulNBitsQuantizer (``WeightOnlyTwin.inexact``)."""
        if self.weight_only is not None:
            return self.weight_only.inexact(restored)
        if self.requantizer is not None and self.requantizer.calibrated:
            return None
        reason = next(filter(None, (_data_dependent(self.int8_index, unit)
                                    for unit in restored)), None)
        if self.fallback is not None and restored:
            stand_in = (f"{_GRAPH_EDITS_STAND_IN}, which can write another graph with this "
                        f"excluded: {self.fallback}")
            reason = stand_in if reason is None else f"{reason}; besides, {stand_in}"
        source = "the --calibration data" if self.calibration else "eprun's seeded input"
        if reason is None and self.unknown:
            reason = (f"quantize_static would quantize {', '.join(self.unknown[:3])}"
                      f"{' and more' if len(self.unknown) > 3 else ''}, which the int8 model "
                      f"does not, with a range calibrated from data eprun does not have (here "
                      f"from {source})")
        if reason is None and self.fresh:
            more = " and more" if len(self.fresh) > 2 else ""
            cure = ("the --calibration data does not give the int8 model's ranges"
                    if self.calibration else "--calibration makes it exact")
            reason = (f"quantize_static would calibrate the range of "
                      f"{', '.join(self.fresh[:2])}{more} anew, from data eprun does not have "
                      f"(here the int8 model's number for it stands in; {cure})")
        return reason

    def quantizer_arguments(self) -> dict | None:
        """The quantize_static arguments that write the int8 model again (None where graph
        edits stand in for it); for a weight-only twin, the MatMulNBitsQuantizer arguments
        read off its graph, ``{"class": "MatMulNBitsQuantizer", "algorithm", "bits",
        "block_size", "is_symmetric", "accuracy_level", "nodes_to_exclude", "quant_format",
        "op_types_to_quantize"}`` (``_nbits_arguments``)."""
        if self.weight_only is not None:
            arguments = dict(self.weight_only.arguments)
            if self.restore_to == "int8":  # a second call, on what the first one writes
                arguments["then"] = {
                    "class": "MatMulNBitsQuantizer", "algorithm": "DEFAULT", "bits": 8,
                    "block_size": arguments["block_size"],
                    "is_symmetric": arguments["is_symmetric"],
                    "accuracy_level": arguments["accuracy_level"],
                    "nodes_to_include": "the recommendation's nodes_to_include"}
            return arguments
        requantizer = self.requantizer
        if requantizer is None:
            return None
        return {"op_types_to_quantize": requantizer.op_types,
                "nodes_to_exclude": requantizer.excluded, **requantizer.types,
                "extra_options": requantizer.extra_options, "calls": requantizer.calls}


def calibration_batches(model, file: str, path: str) -> list[dict]:
    """The arrays of a ``--calibration`` file (numpy.savez, one per input of the fp32 model)
    as the batches quantize_static calibrates on. Where inputs fix a batch size and the file
    holds a multiple of it, that many rows at a time: those inputs and the ones whose first
    dim is free are cut alike (their row counts must agree), the rest (a scalar, a state
    whose first dim is fixed and given whole) go with every batch. Else the file is one
    batch. MinMax calibration takes the smallest and largest values over all batches."""

    specs = specs_from_model(model)
    arrays = _calibration_arrays(specs, _load_inputs_file(file, specs, path, "calibration"),
                                 file, path)
    free = {spec.name for spec in specs if spec.dims and not isinstance(spec.dims[0], int)
            and arrays[spec.name].ndim}
    fixed = {spec.name: spec.dims[0] for spec in specs if spec.dims
             and isinstance(spec.dims[0], int) and arrays[spec.name].ndim
             and arrays[spec.name].shape[0] != spec.dims[0]}  # more rows than the model takes
    rows = {name: arrays[name].shape[0] for name in (*free, *fixed)}
    if len(set(rows.values())) > 1:
        raise EprunError(f"the arrays in {file!r} disagree on the batch size ("
                         + ", ".join(f"{name} {count}" for name, count in sorted(rows.items()))
                         + "); give every batched input the same rows")
    batches = _cut_batches(arrays, free, fixed, rows)
    for spec in specs:
        _require_fitting(batches[0][spec.name], spec, file, path, "--calibration")
    return batches


def _calibration_arrays(specs: list[InputSpec], stored: dict, file: str, path: str) -> dict:
    """The file's arrays in the types the inputs take (an integer width for another is
    fine; another kind of number is refused)."""
    import numpy as np

    arrays = {}
    for spec in specs:
        array = stored[spec.name]
        wanted = np.dtype(spec.dtype) if spec.dtype in _SESSION_TYPES.values() else array.dtype
        if array.dtype.kind != wanted.kind and {array.dtype.kind, wanted.kind} != {"i", "u"}:
            raise EprunError(f"{file!r}: {spec.name!r} holds {array.dtype} values; {path!r} "
                             f"takes {spec.dtype}")
        arrays[spec.name] = array.astype(wanted, copy=False)
    return arrays


def _cut_batches(arrays: dict, free: set, fixed: dict, rows: dict) -> list[dict]:
    """The batches: ``fixed``'s one batch size at a time where every batched input's rows
    are a multiple of it (the inputs of ``free`` and ``fixed`` cut alike, the rest whole in
    each), else ``arrays`` as one batch."""
    sizes = set(fixed.values())
    if len(sizes) == 1 and next(iter(rows.values())) % next(iter(sizes)) == 0:
        size, count = sizes.pop(), next(iter(rows.values()))
        cut = {*free, *fixed}
        return [{name: array[start:start + size] if name in cut else array
                 for name, array in arrays.items()} for start in range(0, count, size)]
    return [arrays]


# Rows of eprun's input the quantizer calibrates on: the numbers it derives are replaced by the
# int8 model's, so the rows only matter for a tensor the int8 model does not quantize
# ("inexact"), and all of them would cost memory for every tensor of the model, every call.
CALIBRATION_ROWS = 16


def calibration_rows(model, feed: Feed) -> dict:
    """The first ``CALIBRATION_ROWS`` rows of ``feed``, where every graph input has a batch
    dim of free size holding ``feed.rows``; else the whole feed."""
    weights = {tensor.name for tensor in model.graph.initializer}
    for value in model.graph.input:
        if value.name in weights or value.name not in feed.arrays:
            continue
        dims = value.type.tensor_type.shape.dim
        array = feed.arrays[value.name]
        if not dims or dims[0].HasField("dim_value") or not array.ndim or \
                array.shape[0] != feed.rows:
            return feed.arrays
    return {name: array[:CALIBRATION_ROWS] for name, array in feed.arrays.items()}


def _installed_quantizer_op_types() -> set[str]:
    """The op types the installed quantizer's registries quantize (its default list)."""
    try:
        from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    except ImportError:
        return _quantizer_op_types()
    return set(QLinearOpsRegistry) | set(QDQRegistry)


@dataclasses.dataclass
class Parallel:
    """How ``sensitivity`` spreads its units over processes: ``jobs`` as given (None: as many
    as the machine has cores, once the units would take a few seconds one after another),
    and what a worker needs to open its own run (``spec``)."""

    jobs: int | None
    spec: dict
    dask: DaskFlags | None = None


# Seconds the units must be expected to take one after another before sensitivity, left to
# choose (no --jobs), starts worker processes: each costs an interpreter, its imports and its
# own reference run.
PARALLEL_AFTER_SECONDS = 4.0


def _usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), else the machine's count, else 1."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _each_unit(study: SensitivityStudy, chosen: list[Unit], parallel: Parallel | None
               ) -> Iterator[tuple[dict, str | None]]:
    """Each unit restored alone, in order: ``(measured, inexact)``. The first runs here; the
    rest in worker processes when ``--jobs`` asks for more than one, or when left to choose
    and the first took long enough that the rest would take ``PARALLEL_AFTER_SECONDS``.
    Workers open the same models with the same input and settings, so the numbers are the
    ones one process gives."""
    import time

    progress = Progress("restoring units one at a time", len(chosen))
    if parallel is not None and parallel.dask is not None and chosen:
        measured = _on_dask(study, chosen, parallel, progress)
        progress.close()
        yield from measured
        return
    done = 0
    rest = list(chosen)
    if rest:
        started = time.monotonic()
        unit = rest.pop(0)
        yield study.measure([unit]), study.inexact([unit])
        done += 1
        progress.step(done)
        took = time.monotonic() - started
        jobs = 1 if parallel is None else parallel.jobs
        if jobs is None:
            jobs = _usable_cores() if took * len(rest) >= PARALLEL_AFTER_SECONDS else 1
        jobs = min(jobs, len(rest))
        if jobs > 1:
            for result in _in_workers(study, rest, parallel, jobs):
                done += 1
                progress.step(done)
                yield result
            rest = []
    for unit in rest:
        yield study.measure([unit]), study.inexact([unit])
        done += 1
        progress.step(done)
    progress.close()


def _in_workers(study: SensitivityStudy, units: list[Unit], parallel: Parallel, jobs: int
                ) -> Iterator[tuple[dict, str | None]]:
    """``units`` measured by ``jobs`` spawned worker processes, results in ``units``' order.
    Each worker's scratch folder is inside this study's, so it goes with it, on a signal too."""
    import concurrent.futures
    import multiprocessing

    spec = {**parallel.spec, **_settled(study),
            "folder": study.folder if study.requantizer is not None else None}
    context = multiprocessing.get_context("spawn")
    spec["parent"] = os.getpid()
    with _isolated_spawning(), _one_blas_thread_spawned(), \
            concurrent.futures.ProcessPoolExecutor(
                max_workers=jobs, mp_context=context, initializer=_worker_start,
                initargs=(spec,)) as pool:
        futures = [pool.submit(_worker_measure, unit.name) for unit in units]
        try:
            for future in futures:
                try:
                    measured, inexact, sessions, calls = future.result()
                except concurrent.futures.process.BrokenProcessPool as exc:
                    raise EprunError(f"a sensitivity worker process ended abruptly "
                                     f"({one_line(exc)}); rerun with --jobs 1") from exc
                study.sessions += sessions
                if study.requantizer is not None:
                    study.requantizer.calls += calls
                yield measured, inexact
        finally:
            for future in futures:
                future.cancel()


@contextlib.contextmanager
def _one_blas_thread_spawned() -> Iterator[None]:
    """Worker processes started in the block run numpy's BLAS on one thread, as eprun's own
    process does (``cli``), for the reason of WORKER_SESSION_CONFIG: an idle OpenBLAS thread
    spins on the core the next worker computes on. Also when eprun is called from Python,
    whose process keeps its own (the variable is read when a worker loads numpy, which may be
    as it starts: by the caller's main module, or by arrays in its spec); a user's
    ``OPENBLAS_NUM_THREADS`` stays."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


@contextlib.contextmanager
def _isolated_spawning() -> Iterator[None]:
    """Worker processes (and multiprocessing's resource tracker) started in the block run
    Python isolated (``-I``): no working directory on ``sys.path`` before the parent's own
    path is restored, no ``PYTHON*`` variables, no user site. multiprocessing starts them as
    ``python -c ...``, which would put the working directory first: a ``copyreg.py`` or
    ``pickle.py`` there would run in every worker."""
    from multiprocessing import spawn, util

    commands = spawn.get_command_line
    flags = util._args_from_interpreter_flags

    def isolated_command(**kwargs) -> list[str]:
        """The worker's command line, with the interpreter's isolated mode (``-I``)."""
        command = commands(**kwargs)
        return [command[0], "-I", *command[1:]]

    def isolated_flags() -> list[str]:
        """The interpreter flags of the resource tracker's command line, with ``-I``."""
        return ["-I", *[flag for flag in flags() if flag != "-I"]]

    spawn.get_command_line, util._args_from_interpreter_flags = isolated_command, isolated_flags
    try:
        yield
    finally:
        spawn.get_command_line, util._args_from_interpreter_flags = commands, flags


# A sensitivity worker process's open study (or why it could not open), made by the pool's
# initializer for the tasks after it: a process pool hands its tasks nothing else.
_WORKER: dict = {}


def _worker_start(spec: dict) -> None:
    """A worker process opens its own study of the same pair, quietly: its notes would repeat
    the parent's, and anything it has to say comes back as an error."""
    import ctypes
    import tempfile

    with contextlib.suppress(Exception):  # Linux: die with the parent, whatever ends it
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != spec["parent"]:  # the parent died before that could take effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(spec["parent"],), daemon=True).start()
    if not debugging():
        sink = os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        OrtLog.set(OrtLog.QUIET)
    try:
        folder = (tempfile.mkdtemp(prefix="worker-", dir=spec["folder"]) if spec["folder"]
                  else None)
        study = _worker_study(spec, folder)
    except Exception as exc:  # said by the first measurement asked of this worker
        _WORKER["error"] = exc
        return
    _WORKER["study"] = study
    _WORKER["units"] = {unit.name: unit for unit in study.units}


def _worker_study(spec: dict, folder: str | None) -> SensitivityStudy:
    """The study a worker (a process of the pool or a Dask worker) opens from its parent's
    ``spec`` (``_worker_spec``): the same models, inputs, providers and restoring, what the
    parent settled taken over, scratch files in ``folder``, sessions that do not spin."""
    study = SensitivityStudy(spec["fp32"], spec["int8"], spec["seed"], spec["inputs"],
                             targets=targets_from(*spec["targets"]), options=StudyOptions(
                                 swapped_ok=True, requantize=spec["requantize"],
                                 restore_to=spec["restore_to"],
                                 calibration=spec["calibration"],
                                 extra_options=spec["extra_options"], settled=spec["settled"],
                                 folder=folder, session_config=WORKER_SESSION_CONFIG))
    study.fallback = spec["fallback"]  # graph edits because the parent's quantizer failed
    return study


def _watch_parent(parent: int) -> None:
    """A worker's watch, where ``PR_SET_PDEATHSIG`` is missing or the parent thread that
    started it ended: once its parent is gone, the worker ends too."""
    import time

    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker_measure(name: str) -> tuple[dict, str | None, int, int]:
    """One unit restored alone: ``(measured, inexact, sessions opened, quantizer calls)``."""
    if "error" in _WORKER:
        raise _WORKER["error"]
    study = _WORKER["study"]
    unit = _WORKER["units"][name]
    before = study.sessions, study.requantizer.calls if study.requantizer is not None else 0
    measured = study.measure([unit])
    calls = study.requantizer.calls if study.requantizer is not None else 0
    return measured, study.inexact([unit]), study.sessions - before[0], calls - before[1]


# -- beyond one machine: the units as tasks on a Dask cluster --------------------------------------

# Seconds eprun waits for a Dask scheduler to answer, and for a first worker to join it.
DASK_TIMEOUT = 10.0
# Seconds without a word from the scheduler, mid-run, before eprun gives up on it: a busy one
# may be silent for a while (distributed's own connections wait 30 s), a hung one for ever.
DASK_SILENCE = 60.0


def _import_distributed(flags: DaskFlags):
    """Dask's ``distributed`` (the optional dask extra), its logging kept off eprun's stderr:
    its import puts handlers on the distributed, tornado and bokeh loggers, which are swapped
    for nothing (the top loggers, and those its configuration keeps from propagating, end
    the propagation there: a logger with no handler on its way prints to stderr)."""
    import logging

    try:
        import distributed
    except ImportError:
        raise EprunError(f"{flags.option()} needs Dask's distributed, which {sys.executable} "
                         "does not have: pip install 'eprun[dask]'", EXIT_USAGE) from None
    names = [name for name in list(logging.root.manager.loggerDict)
             if name.split(".")[0] in ("distributed", "tornado", "bokeh")]
    for name in {"distributed", "tornado", "bokeh", *names}:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        if "." not in name:
            logger.propagate = False
        if not logger.propagate:
            logger.addHandler(logging.NullHandler())
    return distributed


# A scheduler's address as distributed writes them: tcp://host:port (tls, ucx, ucxx, ws, wss
# likewise), the protocol left out meaning tcp.
_DASK_ADDRESS = (r"(?:(?:tcp|tls|ucxx?|wss?)://)?(?:\[[0-9a-fA-F:.]+\]|[^\s/:\[\]]+)"
                 r":([0-9]{1,5})")


def dask_address(flags: DaskFlags) -> str:
    """The scheduler's address: ``--dask-scheduler``, or the one the ``--dask-scheduler-file``
    that ``dask scheduler --scheduler-file`` wrote holds (read here: distributed would wait for
    a missing file for ever)."""
    import json

    if flags.dask_scheduler is not None:
        match = re.fullmatch(_DASK_ADDRESS, flags.dask_scheduler)
        if match is None or not 0 < int(match.group(1)) < 65536:
            raise EprunError(f"--dask-scheduler {flags.dask_scheduler!r} is not a scheduler's "
                             "address (PROTOCOL://HOST:PORT, PROTOCOL one of tcp, tls, ucx, "
                             "ucxx, ws, wss and PORT 1 to 65535, e.g. tcp://127.0.0.1:8786)",
                             EXIT_USAGE)
        return flags.dask_scheduler
    path = flags.dask_scheduler_file
    require_file(path, "scheduler")
    try:
        with open(path, encoding="utf-8") as stream:
            address = json.load(stream)["address"]
        if not isinstance(address, str) or not address:
            raise ValueError("its address is not a text")
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        raise EprunError(f"--dask-scheduler-file {path!r} is not a file dask scheduler "
                         f"--scheduler-file writes ({type(exc).__name__}: {one_line(exc)})"
                         ) from exc
    return address


def _require_reachable(distributed, address: str) -> None:
    """One connection to the scheduler, bounded in time (``DASK_TIMEOUT``) whatever listens
    there (distributed's own client waits for ever on a port that accepts and never
    answers)."""
    import asyncio
    import time

    seconds = DASK_TIMEOUT

    async def knock() -> None:
        """Connect, and close again."""
        comm = await asyncio.wait_for(distributed.comm.connect(address, timeout=seconds),
                                      seconds + 1)
        await comm.close()

    started = time.monotonic()
    try:
        asyncio.run(knock())
    except MemoryError as exc:  # a frame length read off bytes that are no Dask message
        raise EprunError(f"cannot reach the Dask scheduler at {address}: what answers there "
                         "does not speak Dask's protocol") from exc
    except (OSError, asyncio.TimeoutError, ValueError, TypeError) as exc:
        why = one_line(exc) or type(exc).__name__
        waited = (f" within {seconds:g} s" if time.monotonic() - started >= seconds else "")
        raise EprunError(f"cannot reach the Dask scheduler at {address}{waited} ({why})"
                         ) from exc


def _eprun_copy(folder: str):
    """This very file, copied as ``eprun_<digest>.py`` into ``folder`` and imported under that
    name: the tasks name a module only this source has, so neither an eprun installed on a
    worker nor another version a concurrent run uploads is ever the one that runs."""
    import importlib.util
    import shutil

    source = os.path.abspath(__file__)
    digest = files_digest([source])
    name = f"eprun_{digest.partition(':')[2][:16]}"
    copy = os.path.join(folder, f"{name}.py")
    shutil.copyfile(source, copy)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, copy)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name], copy, digest


def _on_dask(study: SensitivityStudy, units: list[Unit], parallel: Parallel,
             progress: Progress) -> list[tuple[dict, str | None]]:
    """Every unit measured as a task on the Dask cluster ``parallel.dask`` names, results in
    ``units``' order: eprun's code reaches the scheduler and the workers from here (uploaded
    under a name of its own), each worker process opens its study once, a worker that ends
    is the cluster's business (its tasks run again elsewhere), and whatever ends this run
    cancels the tasks, has the workers drop the run and closes the client."""
    import asyncio
    import warnings

    distributed = _import_distributed(parallel.dask)
    address = dask_address(parallel.dask)
    _require_reachable(distributed, address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a version mismatch is checked task by task
        try:
            client = distributed.Client(address, timeout=DASK_TIMEOUT, set_as_default=False)
        except (OSError, asyncio.TimeoutError) as exc:
            raise EprunError(f"cannot connect to the Dask scheduler at {address}: "
                             f"{one_line(exc)}") from exc
    try:
        with released_on_signal(lambda: client.close(timeout=2)), \
                scratch_folder("eprun-dask-") as folder:
            return _run_on_dask(distributed, client, address, study, units, parallel,
                                progress, folder)
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=DASK_TIMEOUT)


def _run_on_dask(distributed, client, address: str, study: SensitivityStudy,
                 units: list[Unit], parallel: Parallel, progress: Progress,
                 folder: str) -> list[tuple[dict, str | None]]:
    """``_on_dask`` once the client is connected: the copy uploaded, one task per unit, the
    results gathered as they come, everything undone in the end (on a signal too, in a
    bounded time)."""
    import uuid

    try:
        client.wait_for_workers(1, timeout=DASK_TIMEOUT)
    except Exception as exc:
        raise EprunError(f"the Dask scheduler at {address} has no worker (none joined within "
                         f"{DASK_TIMEOUT:g} s)") from exc
    workers = len(client.nthreads())
    where = f"the Dask cluster at {address} ({workers} worker{'s' if workers != 1 else ''})"
    note(f"the units run as tasks on {where}")
    # the note is held until the end; the progress line is not (and fits a terminal's row)
    progress.what += f" on {workers} Dask worker{'s' if workers != 1 else ''}"
    module, copy, digest = _eprun_copy(folder)
    token = uuid.uuid4().hex[:12]
    plugin = f"eprun-upload-{token}"
    spec = _worker_spec(study, parallel)
    spec = {**_as_fields(spec), "token": token, "digest": digest,
            "versions": stack_versions(), "files": _read_files(spec)}
    futures: list = []
    ended, acting = threading.Event(), threading.Lock()
    from distributed.diagnostics.plugin import SchedulerUploadFile, UploadFile

    def act(action: Callable[[], Any]) -> Any:
        """One action on the cluster, unless the run has ended: the undo waits for the one
        in progress, so nothing is uploaded or submitted after it, and it cancels every
        task submitted."""
        with acting:
            if ended.is_set():
                raise EprunError("the run ended")
            return action()

    def run(step: Callable[[int], None]) -> list:
        """The copy uploaded, one task per unit, their results gathered."""
        try:
            for upload in (SchedulerUploadFile, UploadFile):
                act(lambda upload=upload: client.register_plugin(upload(copy, load=True),
                                                                 name=plugin))
        except OSError as exc:  # (distributed's CommClosedError is one)
            raise EprunError(f"the Dask scheduler at {address} did not take eprun's code "
                             f"({one_line(exc) or type(exc).__name__})") from exc
        for k, unit in enumerate(units):
            act(lambda k=k, unit=unit: futures.append(client.submit(
                module.dask_measure, spec, unit.name, pure=False, key=f"eprun-unit-{token}-{k}")))
        return _gathered(client, address, futures, step, ended)

    def undo() -> None:
        """End the run: cancel the tasks, have every worker drop the run's study and scratch
        folder, and take the uploads back."""
        ended.set()
        with acting:
            pass
        with contextlib.suppress(Exception):
            client.cancel(futures)
        with contextlib.suppress(Exception):
            client.run(module.dask_forget, token)
        for unregister in ("unregister_worker_plugin", "unregister_scheduler_plugin"):
            with contextlib.suppress(Exception):
                getattr(client, unregister)(plugin)

    with released_on_signal(lambda: _within(DASK_TIMEOUT, undo)):
        try:
            results = _off_the_main_thread(run, progress)
        finally:  # (bounded: a scheduler that stops answering must not hold eprun here)
            _within(DASK_TIMEOUT, undo)
    for _, _, sessions, calls in results:
        study.sessions += sessions
        if study.requantizer is not None:
            study.requantizer.calls += calls
    return [(measured, inexact) for measured, inexact, _, _ in results]


def _off_the_main_thread(work: Callable[[Callable[[int], None]], Any], progress: Progress):
    """``work(step)`` run in a thread of its own, ``step(done)`` counted by ``progress``: this
    (main) thread only waits for its reports. A signal's handler runs in the main thread and
    talks to the cluster (the undo), which needs distributed's event loop free, and the loop
    waits for any lock of distributed's the main thread holds when the signal lands
    (``as_completed`` holds one while it is made, a client while it submits): the undo would
    wait for ``DASK_TIMEOUT`` and leave the run's uploads behind."""
    import queue

    reports: queue.SimpleQueue = queue.SimpleQueue()  # (put and get take no Python lock)

    def report() -> None:
        """``work``'s steps, then its value or its exception."""
        try:
            reports.put(("value", work(lambda done: reports.put(("step", done)))))
        except BaseException as exc:  # raised in the waiting thread
            reports.put(("error", exc))

    threading.Thread(target=report, name="eprun-dask", daemon=True).start()
    while True:
        try:  # (a signal the kernel gave another thread is handled at this thread's next step)
            kind, value = reports.get(timeout=0.02)
        except queue.Empty:
            continue
        if kind == "step":
            progress.step(value)
        elif kind == "value":
            return value
        else:
            raise value


def _gathered(client, address: str, futures: list, step: Callable[[int], None],
              ended: threading.Event) -> list:
    """The results of ``futures`` in their order, taken as they come (``step`` counts them),
    until the run has ``ended``: a task's failure is its one line, and a cluster left with no
    worker for ``DASK_TIMEOUT`` is one line too (distributed would wait for one for ever)."""
    import asyncio
    import time

    from distributed import as_completed

    index = {future.key: k for k, future in enumerate(futures)}
    results: list = [None] * len(futures)
    arriving = as_completed(futures, loop=client.loop)
    done, looked, alone_since = 0, time.monotonic(), None
    while done < len(futures):
        if ended.is_set():
            raise EprunError("the run ended")
        if not arriving.has_ready():
            ended.wait(0.02)
            if time.monotonic() - looked >= 1:  # are there workers left to run the rest?
                looked = time.monotonic()
                try:
                    alone_since = (None if client.nthreads(callback_timeout=DASK_SILENCE) else
                                   alone_since or looked)
                except (TimeoutError, asyncio.TimeoutError) as exc:  # (one from 3.11 on)
                    raise EprunError(f"the Dask scheduler at {address} stopped answering (not "
                                     f"a word within {DASK_SILENCE:g} s; {done} of "
                                     f"{len(futures)} units done)") from exc
                except Exception:  # (a lost scheduler fails the tasks)
                    pass
                if alone_since is not None and looked - alone_since >= DASK_TIMEOUT:
                    raise EprunError(f"the Dask cluster at {address} lost its last worker, and "
                                     f"none joined again within {DASK_TIMEOUT:g} s ({done} of "
                                     f"{len(futures)} units done)")
            continue
        future = next(arriving)
        try:
            results[index[future.key]] = future.result()
        except Exception as exc:  # the task's words, one line; what a worker lacks
            if future.status == "cancelled":  # e.g. the scheduler lost: its words, and where
                raise EprunError(f"the Dask cluster at {address} cancelled the units "
                                 f"({one_line(exc) or type(exc).__name__})") from exc
            raise EprunError(one_line(exc) or type(exc).__name__) from exc
        future.release()  # delivered: a worker lost later need not compute it again
        done += 1
        step(done)
    return results


def _within(seconds: float, work: Callable[[], Any]) -> None:
    """``work`` run for at most ``seconds`` (in a thread left behind after that): what a signal
    has to do before the process ends, against a cluster that may not answer."""
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)


# A record of eprun's in a spec a Dask worker gets: (this tag, the class's name, its fields).
_RECORD = "eprun-record"


def _as_fields(value):
    """``value`` (a spec for a Dask worker) with eprun's records in it (the inputs, the
    provider flags) as plain fields: this eprun may be a module named ``eprun``, which neither
    the scheduler nor a worker may import (one may have none, or another version), so the
    worker's copy makes them again as its own (``_from_fields``)."""
    if type(value).__module__ == __name__ and dataclasses.is_dataclass(value):
        return (_RECORD, type(value).__name__,
                {field.name: _as_fields(getattr(value, field.name))
                 for field in dataclasses.fields(value)})
    if type(value).__module__ == __name__:  # (a NamedTuple: none is in a spec today)
        raise TypeError(f"{type(value).__name__} cannot go to a Dask worker as fields")
    if isinstance(value, dict):
        return {key: _as_fields(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_as_fields(item) for item in value)
    return value


def _from_fields(value):
    """``_as_fields`` undone, with this module's own records."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == _RECORD:
        record = globals()[value[1]]
        if not dataclasses.is_dataclass(record):
            raise TypeError(f"{value[1]} is no record of eprun's")
        return record(**_from_fields(value[2]))
    if isinstance(value, dict):
        return {key: _from_fields(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_from_fields(item) for item in value)
    return value


def _read_files(spec: dict) -> dict[str, str]:
    """Each file a worker reads by path (the models with their external weights, the inputs
    and calibration files, the ``--ep-library`` files) and a digest of its bytes here
    (``_files_read_digest``): a worker that sees other bytes there would give other numbers,
    so it refuses (``_open_on_worker``)."""
    inputs = spec.get("inputs")
    paths = [spec["fp32"], spec["int8"], spec.get("calibration"),
             inputs.file if inputs is not None else None, *spec["targets"][0].ep_library]
    return {path: _files_read_digest(path, spec) for path in dict.fromkeys(paths) if path}


def _files_read_digest(path: str, spec: dict) -> str:
    """A model's ``model_fingerprint`` (its external weights too, each file once), another
    file's bytes."""
    return model_fingerprint(path) if _is_model(path, spec) else files_digest([path])


def _is_model(path: str, spec: dict) -> bool:
    """Is ``path`` one of the run's two models?"""
    return path in (spec["fp32"], spec["int8"])


def stack_versions() -> dict:
    """The versions a measurement's numbers depend on: the same on every worker, or no run."""
    import numpy
    import onnx

    return {"onnxruntime": import_ort().__version__, "onnx": onnx.__version__,
            "numpy": numpy.__version__}


def _worker_spec(study: SensitivityStudy, parallel: Parallel) -> dict:
    """What a worker needs to open its own study of the pair: the run's spec (its paths made
    absolute: a worker reads them as they are, from wherever it was started) and what the
    parent settled about requantizing."""
    spec = dict(parallel.spec)
    for key in ("fp32", "int8", "calibration"):
        if spec.get(key):
            spec[key] = os.path.abspath(spec[key])
    inputs = spec.get("inputs")
    if inputs is not None and inputs.file:
        spec["inputs"] = dataclasses.replace(inputs, file=os.path.abspath(inputs.file))
    flags, reference = spec["targets"]
    spec["targets"] = (dataclasses.replace(flags, ep_library=[
        os.path.abspath(path) for path in flags.ep_library]), reference)
    return {**spec, **_settled(study)}


def _settled(study: SensitivityStudy) -> dict:
    """What the parent's study settled that a worker's must take over, not find again: whether
    it requantizes, the quantizer's op types, exclusions, options and calibration, and the
    graph edits a failed quantizer left."""
    requantizer = study.requantizer
    return {"requantize": requantizer is not None,
            "settled": (None if requantizer is None else
                        (requantizer.op_types, requantizer.excluded, requantizer.extra_options,
                         requantizer.calibrated)),
            "fallback": study.fallback}


def _dask_state():
    """This worker process's studies, by run: kept in a bare module of ``sys.modules``, which
    the reload an upload makes leaves alone (a module-level dict here would be emptied)."""
    import types

    fresh = types.ModuleType("_eprun_dask_state")
    fresh.runs, fresh.lock, fresh.opened, fresh.ended = {}, threading.Lock(), 0, set()
    state = sys.modules.setdefault("_eprun_dask_state", fresh)
    if not hasattr(state, "ended"):  # made by an eprun before the runs' ends were kept
        state.ended = set()
    return state


def _dask_worker() -> tuple[str, str | None]:
    """``(this worker's address, its local folder)``, for messages and scratch space."""
    try:
        from distributed import get_worker

        worker = get_worker()
        return str(worker.address), str(worker.local_directory)
    except (ImportError, ValueError):
        return f"process {os.getpid()}", None


def dask_measure(spec: dict, name: str) -> tuple[dict, str | None, int, int]:
    """A task on a Dask worker: unit ``name`` restored alone, on the study this worker process
    opened for the run (once: the first task opens it, under a lock). Any failure comes back
    as one line naming the worker (a builtin exception: the client unpickles it whatever
    module its own eprun runs as)."""
    where, _ = _dask_worker()
    try:
        state = _dask_state()
        token = spec["token"]
        with state.lock:
            study = state.runs.get(token)
            if study is None and token not in state.ended:
                study = state.runs[token] = _open_on_worker(spec)
                state.opened += 1  # (studies opened by this process, for whoever asks)
            try:
                if token in state.ended:
                    raise EprunError("its run has ended")
                unit = {unit.name: unit for unit in study.units}[name]
                before = study.sessions, study.requantizer.calls if study.requantizer else 0
                measured = study.measure([unit])
                calls = study.requantizer.calls if study.requantizer is not None else 0
                return (measured, study.inexact([unit]), study.sessions - before[0],
                        calls - before[1])
            finally:  # the run ended before or while this task ran (dask_forget: ended, then
                if token in state.ended:  # pop): what this task opened or wrote goes too
                    state.runs.pop(token, None)
                    _drop_study(study)
    except Exception as exc:
        raise RuntimeError(f"on Dask worker {where}: {one_line(exc)}") from None


def _open_on_worker(spec: dict) -> SensitivityStudy:
    """A worker's study of the pair, after checking it runs this very eprun on the same stack;
    a requantizing study works in a folder of the worker's own."""
    import shutil
    import tempfile

    if files_digest([os.path.abspath(__file__)]) != spec["digest"]:
        raise EprunError(f"it imported another eprun ({__version__}, {__file__}) than the "
                         "client's")
    if stack_versions() != spec["versions"]:
        raise EprunError(f"it runs {stack_versions()}, the client {spec['versions']}: the "
                         "numbers would differ; install the same versions on every worker")
    for path, digest in spec["files"].items():
        try:
            with open(path, "rb"):  # (what cannot be read is said as such, not as a model)
                pass
            if _files_read_digest(path, spec) != digest:
                weights = "or its external weights do; " if _is_model(path, spec) else ""
                raise EprunError(f"{path} holds other bytes there than where eprun runs "
                                 f"({weights}workers read the files by this path: they must "
                                 "see the same files)")
        except OSError as exc:
            raise EprunError(f"cannot read {path} (workers read the files by this path: they "
                             f"must see the same files; {one_line(exc)})") from exc
    folder = (tempfile.mkdtemp(prefix="eprun-worker-", dir=_dask_worker()[1])
              if spec["requantize"] else None)
    try:
        study = _worker_study(_from_fields(spec), folder)
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    study.dask_folder = folder
    return study


def dask_forget(token: str) -> bool:
    """The run ``token`` ended: this worker drops its study and its scratch folder (without
    waiting for a task of the run: this runs on the worker's event loop)."""
    state = _dask_state()
    state.ended.add(token)  # first: a task opening the study now drops it itself
    study = state.runs.pop(token, None)
    _drop_study(study)
    return study is not None


def _drop_study(study: SensitivityStudy | None) -> None:
    """A worker's study of a run closed, its scratch folder removed."""
    import shutil

    if study is not None:
        with contextlib.suppress(Exception):
            study.close()
        if study.dask_folder:
            shutil.rmtree(study.dask_folder, ignore_errors=True)


# -- ranking and the verified recommendation -------------------------------------------------------

def _meets(target: dict, measured: dict, reference, candidate) -> bool:
    """Does ``measured`` meet ``target``: an SQNR at least (no error at all meets it), a relative
    error at most, or a check profile's tolerances and cosine on ``reference`` and ``candidate``?"""
    if "sqnr_db" in target:
        return measured["sqnr_db"] is None or measured["sqnr_db"] >= target["sqnr_db"]
    if "rel_error" in target:
        return measured["rel_error"] <= target["rel_error"]
    verdict = compare_outputs(reference, candidate, target["rtol"], target["atol"])
    return verdict["violations"] == 0 and verdict["cosine"] >= target["min_cos"]


@dataclasses.dataclass(frozen=True)
class Ranking:
    """What ``sensitivity`` ranks and how far its recommendation goes: ``target`` (the
    answer's field: ``sqnr_db``, ``rel_error``, or a check profile and its tolerances),
    ``max_units`` (None: no limit) and ``units`` (the float node names to restore; None:
    every unit)."""

    target: dict
    max_units: int | None = None
    units: list[str] | None = None

    @classmethod
    def of(cls, target_sqnr: float | None, target_rel_error: float | None,
           profile: str | None, max_units: int | None, units: list[str] | None) -> Ranking:
        """The ranking ``sensitivity``'s options ask for; without a target, ``{"profile":
        None}`` until ``for_study`` knows the twin."""
        if target_sqnr is not None:
            target = {"sqnr_db": target_sqnr}
        elif target_rel_error is not None:
            target = {"rel_error": target_rel_error}
        else:
            target = {"profile": profile, **TOLERANCE_PROFILES.get(profile, {})}
        return cls(target, max_units, units)

    def for_study(self, study: SensitivityStudy) -> Ranking:
        """The target profile where none was given, as ``check``'s auto profile picks it: int4
        for a weight-only twin of 4 bits or fewer (said on stderr), int8 otherwise."""
        if "profile" not in self.target or self.target["profile"] is not None:
            return self
        profile = ("int4" if study.weight_only is not None
                   and _weight_only_4bit(study.int8_model) else "int8")
        if profile == "int4":
            note(f"target profile int4 (no --target-profile given), as {study.int8!r} quantizes "
                 "weights only, to 4 bits or fewer; --target-profile int8 holds it to the int8 "
                 "tolerances")
        return dataclasses.replace(self, target={"profile": profile,
                                                 **TOLERANCE_PROFILES[profile]})

    def chosen(self, study: SensitivityStudy) -> list[Unit]:
        """The study's units ``units`` names, in the study's order; a name it does not quantize
        is a usage error."""
        if self.units is None:
            return study.units
        known = {unit.name for unit in study.units}
        unknown = [name for name in self.units if name not in known]
        if unknown:
            raise EprunError(f"--units names {', '.join(map(repr, unknown))}, which "
                             f"{study.int8!r} does not quantize (its units: "
                             f"{', '.join(sorted(known)) or 'none'})", EXIT_USAGE)
        return [unit for unit in study.units if unit.name in self.units]


def _rank_units(study: SensitivityStudy, seed: int, targets: Targets, ranking: Ranking,
                parallel: Parallel | None = None) -> dict:
    """``sensitivity``'s answer from an open study: each unit restored alone, ranked by gain,
    then the recommendation, each step measured on the graph quantize_static writes (for a
    weight-only twin, MatMulNBitsQuantizer: ``quantizer`` then holds its arguments, and the
    recommendation's ``nodes_to_exclude`` is for it)."""
    ranking = ranking.for_study(study)
    chosen = ranking.chosen(study)
    quantized = study.measure([])
    base = study.last
    ranked = _ranked(chosen, quantized, _each_unit(study, chosen, parallel))
    met = _meets(ranking.target, quantized, study.reference, base)
    limit = len(ranked) if ranking.max_units is None else ranking.max_units
    excluded, steps, met = _recommend(study, ranked, ranking.target, met, limit)
    answer = {"seed": seed, "rows": study.feed.rows}
    if not study.feed.contract_shaped:
        answer["inputs"] = study.feed.fed
    unnamed = [entry["name"] for entry in ranked if not entry["named"]]
    if unnamed:
        note(f"{', '.join(unnamed)}: the float model's node has no name, so eprun names it by op "
             f"type and position; {study.quantizer_name} can only exclude named nodes")
    already = study.already_excluded
    if len(excluded) * 2 > len(ranked):
        note(_undoes_most(len(excluded), len(ranked), study.restore_to))
    recommendation = {"nodes_to_exclude": [*already, *excluded], "steps": steps, "met": met}
    if study.restore_to == "int8":  # the second quantizer call's: back at 8 bits
        answer["restore_to"] = "int8"
        recommendation["nodes_to_include"] = list(excluded)
    return {**answer, "output": study.output, "quantized": {
                key: quantized[key] for key in ("rel_error", "cos_min", "sqnr_db")},
            "units": ranked, "target": ranking.target, "recommendation": recommendation,
            "predicted_by": study.predicted_by,
            "quantizer": study.quantizer_arguments(),
            "sessions": study.sessions,
            **({"providers": targets.field(study.got, study.reference_got)}
               if targets.given else {})}


def _ranked(chosen: list[Unit], quantized: dict, measured_units: Iterator) -> list[dict]:
    """Each chosen unit's entry (``measured_units``: its ``(measured, inexact)``), the largest
    gain first; a unit without a gain sorts after every finite one, and after the units whose
    restored output has no SQNR at all."""
    ranked = []
    for unit, (measured, inexact) in zip(chosen, list(measured_units)):
        gain = (None if measured["sqnr_db"] is None or quantized["sqnr_db"] is None
                else measured["sqnr_db"] - quantized["sqnr_db"])
        entry = {"name": unit.name, "op_type": unit.op_type, "named": unit.named,
                 "rel_error": measured["rel_error"], "cos_min": measured["cos_min"],
                 "sqnr_db": measured["sqnr_db"], "gain_db": gain}
        if inexact:
            entry["inexact"] = inexact
        ranked.append(entry)
    ranked.sort(key=lambda entry: (-math.inf if entry["gain_db"] is None and
                                   entry["sqnr_db"] is not None else
                                   -(entry["gain_db"] if entry["gain_db"] is not None
                                     else math.inf)))
    return ranked


def _recommend(study: SensitivityStudy, ranked: list[dict], target: dict, met: bool,
               limit: int) -> tuple[list[str], list[dict], bool]:
    """``(nodes to exclude, steps, met)``: the best-ranked units added one at a time, the
    combined graph measured each time, until ``target`` is met or ``limit`` units are in."""
    by_name = {unit.name: unit for unit in study.units}
    excluded: list[str] = []
    steps = []
    # units measured exactly first: a step whose number is calibrated from data eprun does
    # not have is a promise it cannot check
    for entry in sorted(ranked, key=lambda entry: not _for_graph_edits_only(
            entry.get("inexact"))):
        if met or len(excluded) >= limit:
            break
        excluded.append(entry["name"])
        restored = [by_name[name] for name in excluded]
        measured = study.measure(restored)
        met = _meets(target, measured, study.reference, study.last)
        steps.append({"added": entry["name"], "rel_error": measured["rel_error"],
                      "cos_min": measured["cos_min"], "sqnr_db": measured["sqnr_db"],
                      "met": met})
        inexact = study.inexact(restored)
        if inexact:
            steps[-1]["inexact"] = inexact
    return excluded, steps, met


# == 8. Reduction ==================================================================================

# Bytes of reference values fetched per run of the exposed model (``ReferenceValues``).
REDUCE_BATCH_BYTES = 256 << 20
# Weights above this total leave a written candidate as external data, under protobuf's 2 GiB.
REDUCE_INLINE_LIMIT = 1 << 30


class ReferenceValues:
    """Every tensor the main graph's nodes compute, as the reference providers compute it on
    the original model and the given inputs: computed once, a batch of outputs per run (sized
    so one batch holds about ``REDUCE_BATCH_BYTES``), each kept as a ``.npy`` file in the run's
    scratch folder and read back when a candidate is fed or compared, so the tensors of a big
    model are never all in memory at once. A graph input's value is its feed."""

    def __init__(self, folder: str, feed: dict) -> None:
        """Nothing computed yet: ``feed`` holds the graph inputs' values, ``folder`` the files."""
        self.folder, self.feed = folder, feed
        self.files: dict[str, str] = {}
        self.other: set[str] = set()  # values that are no tensor (sequences, maps)

    def compute(self, model, model_path: str, names: list[str], on: ProviderRequest,
                types: dict) -> Got:
        """Run ``model`` (consumed; ``types``: its value types) with ``names`` exposed;
        return what its session got."""
        import numpy as np

        expose_in_place(model, (), extra=names, types=types, unknown_as_float=False)
        _inline_subgraph_weights(model, model_path, attributes=True)
        session = open_exposed(model, model_path, on=on)
        size, start = 32, 0
        while start < len(names):
            batch = names[start:start + size]
            try:
                values = run_session(session, batch, self.feed, what=repr(model_path))
            except EprunError:
                if len(batch) == 1:  # a type numpy has no form for (bfloat16): not fed
                    self.other.add(batch[0])
                    start += 1
                    continue
                size = 1  # one at a time, to find the one that fails
                continue
            used = 0
            for name, fetched in zip(batch, values):
                value = _storable(fetched)
                if value is None:
                    self.other.add(name)
                    continue
                path = os.path.join(self.folder, f"value-{len(self.files)}.npy")
                np.save(path, value, allow_pickle=False)
                self.files[name] = path
                used += value.nbytes
            del values
            start += len(batch)
            size = max(1, min(4096, int(REDUCE_BATCH_BYTES * len(batch) / max(used, 1))))
        return Got.of(session)

    def has(self, name: str) -> bool:
        """Is there a value of ``name`` to feed (a graph input's, or one kept on disk)?"""
        return name in self.feed or name in self.files

    def get(self, name: str):
        """The value of ``name``: its feed, or read back from its ``.npy`` file."""
        import numpy as np

        return self.feed[name] if name in self.feed else np.load(self.files[name])


class ReduceGraph:
    """The main graph of the model being reduced, read for cutting: for each node (by file
    position) the tensors it reads (its subgraphs' outer-scope reads included: an If, Loop or
    Scan moves as a whole) and writes. A candidate is a sorted tuple of node positions."""

    def __init__(self, model, model_path: str) -> None:
        """Read ``model``'s main graph: each node's reads (each once, its subgraphs' included) and
        writes, the initializers, sparse ones, inputs, outputs and value infos."""
        graph = model.graph
        self.model, self.path = model, model_path
        self.nodes = list(graph.node)
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.sparse = {tensor.values.name: tensor for tensor in graph.sparse_initializer}
        self.inputs = [value for value in graph_inputs(model)
                       if value.name not in self.sparse]
        self.input_names = {value.name for value in self.inputs}
        self.outputs = {value.name: value for value in graph.output}
        self.reads = [[name for name in dict.fromkeys(_node_inputs(node)) if name]
                      for node in self.nodes]
        self.writes = [[name for name in node.output if name] for node in self.nodes]
        self.value_info = {value.name: value for value in graph.value_info}
        self._interfaces: dict[tuple, tuple[list[str], list[str]]] = {}

    def computed(self) -> list[str]:
        """Every tensor a node writes, each once, in file order."""
        return list(dict.fromkeys(name for names in self.writes for name in names))

    def interface(self, kept: tuple[int, ...]) -> tuple[list[str], list[str]]:
        """``(inputs, outputs)`` of the candidate ``kept``: the original graph inputs it reads
        (in their order), then each tensor it reads that no kept node writes (fed with the
        reference's value); each tensor a kept node writes that none reads, or that is an
        output of the original."""
        if kept not in self._interfaces:
            self._interfaces[kept] = self._interface(kept)
        return self._interfaces[kept]

    def _interface(self, kept: tuple[int, ...]) -> tuple[list[str], list[str]]:
        """``interface`` without its cache."""
        written = {name for i in kept for name in self.writes[i]}
        read = {name for i in kept for name in self.reads[i]}
        inputs = [value.name for value in self.inputs if value.name in read]
        inputs += list(dict.fromkeys(
            name for i in kept for name in self.reads[i]
            if name not in written and name not in self.initializers
            and name not in self.sparse and name not in self.input_names))
        outputs = [name for i in kept for name in self.writes[i]
                   if name not in read or name in self.outputs]
        return inputs, list(dict.fromkeys(outputs))

    def ends(self, kept: tuple[int, ...]) -> tuple[list[int], list[int]]:
        """``(sinks, sources)`` of ``kept``: the nodes no kept node reads from, last first, and
        the nodes that read from no kept node, first first: the ends a node can leave by."""
        written = {name: i for i in kept for name in self.writes[i]}
        read = {name for i in kept for name in self.reads[i]}
        sinks = [i for i in reversed(kept) if not any(name in read for name in self.writes[i])]
        sources = [i for i in kept if not any(name in written for name in self.reads[i])]
        return sinks, sources

    def model_of(self, kept: tuple[int, ...], types: dict, values: ReferenceValues):
        """The candidate as a model: the kept nodes as they are (names, attributes, subgraphs),
        the initializers they read (still referring to their data where the original keeps
        it), the original's opsets, functions and IR version; every input and output typed,
        with the shape of the reference's value where the original declares none."""
        inputs, outputs = self.interface(kept)
        model = self._empty_like()
        graph = model.graph
        graph.name = self.model.graph.name or "reduced"
        graph.node.extend(self.nodes[i] for i in kept)
        read = {name for i in kept for name in self.reads[i]}
        graph.initializer.extend(tensor for name, tensor in self.initializers.items()
                                 if name in read)
        graph.sparse_initializer.extend(tensor for name, tensor in self.sparse.items()
                                        if name in read)
        _inline_subgraph_weights(model, self.path, attributes=True)
        self._declare_interface(graph, (inputs, outputs), types, values)
        inner = {name for i in kept for name in self.writes[i]} - set(outputs)
        graph.value_info.extend(value for name, value in self.value_info.items()
                                if name in inner)
        return model

    def _empty_like(self):
        """A model with the original's header, opsets and functions, and no graph yet."""
        model = onnx_messages().ModelProto()
        for field in ("ir_version", "producer_name", "producer_version", "domain",
                      "model_version", "doc_string"):
            setattr(model, field, getattr(self.model, field))
        model.opset_import.extend(self.model.opset_import)
        model.functions.extend(self.model.functions)
        return model

    def _declare_interface(self, graph, interface: tuple[list[str], list[str]], types: dict,
                           values: ReferenceValues) -> None:
        """The candidate's inputs and outputs, as the original declares them where it does
        with a shape, else typed from inference and the reference values; under IR 3 the
        initializers listed as inputs too."""
        inputs, outputs = interface
        original = {value.name: value for value in self.inputs}
        for name in inputs:
            graph.input.append(original[name] if name in original and
                               _declared(original[name]) else
                               self._typed(name, types, values))
        if self.model.ir_version < 4:  # the initializers were graph inputs too then
            listed = {value.name: value for value in self.model.graph.input}
            graph.input.extend(listed[tensor.name] for tensor in graph.initializer
                               if tensor.name in listed)
        for name in outputs:
            declared = self.outputs.get(name)
            graph.output.append(declared if declared is not None and _declared(declared)
                                else self._typed(name, types, values))

    @staticmethod
    def _typed(name: str, types: dict, values: ReferenceValues):
        """``name`` declared with its inferred element type and the reference value's shape."""
        import numpy as np

        messages = onnx_messages()
        value = messages.ValueInfoProto(name=name)
        if name in types:
            value.type.CopyFrom(types[name])
        array = values.get(name) if values.has(name) else None
        if isinstance(array, np.ndarray) and not value.type.HasField("sequence_type") and \
                not value.type.HasField("map_type") and not value.type.HasField("optional_type"):
            tensor = value.type.tensor_type
            if not tensor.elem_type:
                from onnx import helper

                tensor.elem_type = (messages.TensorProto.STRING if array.dtype.kind in "OUS"
                                    else helper.np_dtype_to_tensor_dtype(array.dtype))
            tensor.ClearField("shape")
            tensor.shape.SetInParent()
            for size in array.shape:
                tensor.shape.dim.add().dim_value = size
        return value


def _declared(value) -> bool:
    """Does a graph input or output declare a tensor type with a shape?"""
    return (value.type.HasField("tensor_type") and bool(value.type.tensor_type.elem_type)
            and value.type.tensor_type.HasField("shape"))


def _weight_writers(model, model_path: str, data_name: str | None) -> tuple:
    """``(model writer, data writer or None)`` for a candidate whose initializers may still
    refer to their data (in the original's data files or its model file): each is read back
    inline, or, with ``data_name`` (a plain file name beside the model), the ones the original
    keeps in data files of their own (and all of them past ``REDUCE_INLINE_LIMIT``) are written
    one after the other into that file. Only the candidate's own weights are read."""
    TensorProto = onnx_messages().TensorProto
    referring = [tensor for tensor in model.graph.initializer if uses_external_data(tensor)]
    inline_total = sum(_initializer_bytes(tensor) for tensor in referring)
    outside = [] if data_name is None else [
        tensor for tensor in referring
        if inline_total > REDUCE_INLINE_LIMIT or _in_data_file(tensor, model_path)]
    outside_ids = {id(tensor) for tensor in outside}
    sources = []
    offset = 0
    for tensor in referring:
        payload = _map_external(tensor, model_path, read=True)
        del tensor.external_data[:]
        if id(tensor) in outside_ids:
            length = payload.nbytes
            for key, value in (("location", data_name), ("offset", str(offset)),
                               ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = TensorProto.EXTERNAL
            sources.append(payload)
            offset += length
        else:
            tensor.ClearField("data_location")
            tensor.raw_data = payload.tobytes()
    serialized = model.SerializeToString()

    def write_data(stream) -> None:
        """Fill ``stream`` with the external weights, in the order their offsets were given."""
        for payload in sources:
            stream.write(payload.tobytes())

    return (lambda stream: stream.write(serialized)), (write_data if outside else None)


def _call_check(argv: list[str], errors, timeout: float | None) -> int | None:
    """Run a ``--check`` command in a process group of its own (its stdout dropped, its
    stderr into ``errors``); its exit status (negative: the signal that ended it), or None
    when it ran past ``timeout`` and was killed, with every process it started. A signal that
    ends eprun meanwhile ends the group too (``Invocation.children``)."""
    import subprocess

    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=errors, start_new_session=True,
                                   env=child_environment())
    except OSError as exc:
        code = EXIT_MISSING if isinstance(exc, FileNotFoundError) else EXIT_USAGE
        raise EprunError(f"--check cannot run {argv[0]!r}: {exc.strerror or one_line(exc)}",
                         code) from exc
    with own_process_group(process):
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def _in_data_file(tensor, model_path: str) -> bool:
    """Does the original keep this initializer in a data file of its own (not a payload
    ``load_model`` left in the model file)?"""
    return not _same_file(model_path, _safe_location(_external_location(tensor).location,
                                                    model_path))


def _check_status(code: int) -> dict:
    """A ``--check`` command's end as the answer records it."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"signal": name}
    return {"exit": code}


class FailureTest(NamedTuple):
    """What makes a candidate fail: the ``--check`` command's words (None: its numbers),
    with ``--check-timeout`` and ``--timeout-fails``; or its outputs on ``on`` against the
    reference's on ``reference_on``, beyond ``tolerance``."""

    check: list[str] | None
    timeout: float | None
    timeout_fails: bool
    on: ProviderRequest | None
    reference_on: ProviderRequest
    tolerance: dict


class Reduction:
    """One ``reduce``: the graph, the reference values, the test that says whether a candidate
    still fails, and every verdict so far (a candidate tried twice is run once)."""

    def __init__(self, model_path: str, graph: ReduceGraph, values: ReferenceValues,
                 types: dict, folder: str, test: FailureTest) -> None:
        """No verdict yet; ``strict`` while the full model is judged (a session without its
        providers is then an error, not a pass), and the clock for progress starts."""
        self.path, self.graph, self.values, self.types = model_path, graph, values, types
        self.folder = folder
        (self.check, self.timeout, self.timeout_fails, self.on, self.reference_on,
         self.tolerance) = test
        self.verdicts: dict[tuple, tuple[bool, dict | None, bool]] = {}  # fails, why, tried
        self.tries, self.idle, self.uncut = 0, 0, 0
        self.strict = True  # the full model: a session without the providers is refused
        import time

        self.started = time.monotonic()

    def fails(self, kept: tuple[int, ...], *, show: bool = True) -> bool:
        """Does the candidate ``kept`` still fail? Run once per distinct candidate."""
        if kept not in self.verdicts:
            inputs, _ = self.graph.interface(kept)
            if not kept or not all(self.values.has(name) for name in inputs):
                self.uncut += bool(kept)  # a cut through a value that is no tensor
                self.verdicts[kept] = (False, None, False)
            else:
                self.tries += 1
                self.verdicts[kept] = (*(self._check(kept) if self.check is not None
                                         else self._numbers(kept)), True)
                if show:
                    self._progress(kept)
        return self.verdicts[kept][0]

    def failure(self, kept: tuple[int, ...]) -> dict | None:
        """Why ``kept`` fails (or, for one that passed by a timeout, that record)."""
        return self.verdicts[kept][1]

    def passed(self, kept: tuple[int, ...]) -> bool:
        """Was the candidate ``kept`` tried, and did it pass? (The empty one has nothing to
        try: a single node is as small as a failing candidate gets.)"""
        fails, _, tried = self.verdicts.get(kept, (True, None, False))
        return not kept or (tried and not fails)

    def _progress(self, kept: tuple[int, ...]) -> None:
        """One stderr line on the real stderr, as the candidate's verdict comes in."""
        import time

        fails = self.verdicts[kept][0]
        line = (f"eprun: reduce: candidate {self.tries}: {len(kept)} of "
                f"{len(self.graph.nodes)} nodes, {'fails' if fails else 'passes'} "
                f"({time.monotonic() - self.started:.1f} s)\n")
        write_fd(real_stderr(), line.encode())

    def say_what_passed(self, providers: list[str] | None) -> None:
        """Notes on the candidates that passed for want of something to run."""
        if self.idle:
            note(f"{self.idle} candidate{'s' if self.idle > 1 else ''} passed because their "
                 f"session did not get {','.join(providers or [])} (the provider took none of "
                 "their nodes): a failure there cannot be that provider's")
        if self.uncut:
            note(f"{self.uncut} candidate{'s' if self.uncut > 1 else ''} would cut through a "
                 "value eprun cannot feed (a sequence, a map, or a type numpy has no form "
                 "for), counted as passing")

    def feed(self, kept: tuple[int, ...]) -> dict:
        """The arrays that feed the candidate ``kept``: each of its inputs' reference value."""
        inputs, _ = self.graph.interface(kept)
        return {name: self.values.get(name) for name in inputs}

    def _numbers(self, kept: tuple[int, ...]) -> tuple[bool, dict | None]:
        """The candidate on ``--providers`` against the reference's values, compared as
        ``check`` compares outputs. A candidate the providers cannot open or run fails when
        the reference providers can (the error is the failure); one whose session did not get
        a requested provider passes (it cannot show that provider's fault)."""
        _, outputs = self.graph.interface(kept)
        feed = self.feed(kept)
        try:
            session = open_exposed(self.graph.model_of(kept, self.types, self.values),
                                   self.path, on=self.on)
            got = run_session(session, outputs, feed, what="the candidate")
        except ProviderRefused:
            if self.strict:
                raise
            self.idle += 1
            return False, None
        except ModelChanged:
            raise
        except EprunError as exc:
            try:
                reference = open_exposed(self.graph.model_of(kept, self.types, self.values),
                                         self.path, on=self.reference_on)
                run_session(reference, outputs, feed, what="the candidate")
            except EprunError:
                return False, None  # a cut no provider runs: not the failure looked for
            return True, {"error": one_line(exc)}
        pairs = [(name, self.values.get(name), value) for name, value in zip(outputs, got)
                 if name in self.values.files and getattr(value, "dtype", None) is not None
                 and value.dtype.kind in "biufc"]
        entries, failures = gate_outputs(((name, expected) for name, expected, _ in pairs),
                                         ((name, value) for name, _, value in pairs),
                                         ("the reference", "the candidate"), self.tolerance)
        if not failures:
            return False, None
        worst = max(entries, key=lambda entry: (entry.get("violations", 0),
                                                entry.get("max_abs_diff") or 0))
        return True, {"output": worst["reference"], "max_abs_diff": worst.get("max_abs_diff"),
                      "max_rel_diff": worst.get("max_rel_diff"),
                      "violations": worst.get("violations"), "elements": worst.get("elements"),
                      "bounds": sorted({failure["bound"] for failure in failures})}

    def _check(self, kept: tuple[int, ...]) -> tuple[bool, dict | None]:
        """The user's ``--check`` command on the candidate written into the scratch folder."""
        stem = os.path.join(self.folder, f"candidate-{self.tries}")
        model_path, inputs_path = f"{stem}.onnx", f"{stem}.inputs.npz"
        data_name = os.path.basename(stem) + ".data"
        write_model, write_data = _weight_writers(
            self.graph.model_of(kept, self.types, self.values), self.path, data_name)
        written = [model_path, inputs_path]
        try:
            with open(model_path, "xb") as stream:
                write_model(stream)
            if write_data is not None:
                written.append(os.path.join(self.folder, data_name))
                with open(written[-1], "xb") as stream:
                    write_data(stream)
            with open(inputs_path, "xb") as stream:
                write_npz(stream, self.feed(kept))
            argv = [word.replace("{model}", model_path).replace("{inputs}", inputs_path)
                    for word in self.check]
            with open(f"{stem}.stderr", "w+b") as errors:
                written.append(f"{stem}.stderr")
                code = _call_check(argv, errors, self.timeout)
                if code is None:
                    return self.timeout_fails, {"timeout": self.timeout}
                errors.seek(0)
                said = [line for line in errors.read()[-4096:].decode(
                    "utf-8", "replace").splitlines() if line.strip()]
        finally:
            for path in written:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        status = _check_status(code)
        if said:
            status["stderr"] = said[-1].strip()[:500]
        return code != 0, status


def _bisected(reduction: Reduction, kept: tuple[int, ...]) -> tuple[int, ...]:
    """``kept`` cut from the front, then from the back, by bisection: each time the most
    nodes whose removal still fails."""
    for from_front in (True, False):
        known, beyond = 0, len(kept)  # removing `known` still fails; `beyond` is too many
        while beyond - known > 1:
            middle = (known + beyond) // 2
            trial = kept[middle:] if from_front else kept[:len(kept) - middle]
            if reduction.fails(trial):
                known = middle
            else:
                beyond = middle
        kept = kept[known:] if from_front else kept[:len(kept) - known]
    return kept


def reduce_nodes(reduction: Reduction, mode: str) -> tuple[tuple[int, ...], bool]:
    """``(kept, minimal)``: bisection from both ends (``mode`` "bisect"), then single nodes
    off either end of the graph (its sinks, then its sources) until none can go. ``minimal``:
    every end node was tried in the end and the candidate without it passed."""
    kept = tuple(range(len(reduction.graph.nodes)))
    if mode == "bisect":
        kept = _bisected(reduction, kept)
    needed: set[int] = set()  # ends whose removal passed once: tried again only at the end
    while True:
        sinks, sources = reduction.graph.ends(kept)
        ends = list(dict.fromkeys([*sinks, *sources]))
        fresh = [node for node in ends if node not in needed]
        removed = False
        for node in fresh or ends:  # the new ends; when none, every end once more
            trial = tuple(i for i in kept if i != node)
            if trial and reduction.fails(trial):
                kept, removed = trial, True
                break
            needed.add(node)
        if not removed and not fresh:
            break
    return kept, all(reduction.passed(tuple(i for i in kept if i != node)) for node in ends)


def _value_types(inferred) -> dict:
    """Name -> type of every value of an ``inferred_graph``, sequences and maps too
    (``tensor_types`` keeps tensors only)."""
    return {value.name: value.type for value in (*inferred.value_info, *inferred.output)
            if value.type.WhichOneof("value") is not None}


class ReducedPaths(NamedTuple):
    """What ``reduce`` writes: the model, its inputs (the model's stem + ``.inputs.npz``) and,
    for weights kept outside it, their data file (``data_file_name``)."""

    model: str
    inputs: str
    data: str

    @classmethod
    def of(cls, output: str) -> ReducedPaths:
        """The paths ``reduce`` writes for ``output``: it, ``<stem>.inputs.npz`` beside it, and its
        first data file's name in its folder."""
        stem = output[:-len(".onnx")] if output.lower().endswith(".onnx") else output
        return cls(output, f"{stem}.inputs.npz",
                   os.path.join(os.path.dirname(output), data_file_name(output, 0)))


def _check_words(check: str | None, providers: list[str] | None, timeout: float | None,
                 timeout_fails: bool, tolerances: tuple) -> list[str] | None:
    """The ``--check`` command's words (None without one), refusing every option that says
    nothing with what was given."""
    import shlex

    if check is None:
        if providers is None:
            raise EprunError("say what fails: --providers LIST (the candidate's numbers on "
                             "them against --reference-providers) or --check 'COMMAND {model}'",
                             EXIT_USAGE)
        if timeout is not None or timeout_fails:
            raise EprunError("--check-timeout and --timeout-fails are for a --check command",
                             EXIT_USAGE)
        return None
    try:
        argv = shlex.split(check)
    except ValueError as exc:
        raise EprunError(f"--check {check!r} is not a command line: {one_line(exc)}",
                         EXIT_USAGE) from exc
    if not argv or not any("{model}" in word for word in argv):
        raise EprunError(f"--check {check!r} does not name the candidate: put {{model}} where "
                         "its path goes (and {inputs} where the path of its inputs, an .npz, "
                         "goes)", EXIT_USAGE)
    if providers is not None:
        raise EprunError("--check decides by itself whether a candidate fails; --providers "
                         "compares the candidate's numbers instead: give one of them",
                         EXIT_USAGE)
    if any(value is not None for value in tolerances):
        raise EprunError("--profile, --rtol, --atol and --min-cos set what a difference in "
                         "numbers is (with --providers); a --check command decides by itself",
                         EXIT_USAGE)
    if timeout_fails and timeout is None:
        raise EprunError("--timeout-fails needs --check-timeout SECONDS", EXIT_USAGE)
    return argv


def _one_tolerance(profile: str | None, rtol, atol, min_cos: float | None) -> dict:
    """The tolerance every output of every candidate is held to (a profile's, overridden):
    ``check``'s, without the per-output ones."""
    # auto is fp16 here: both sides are the one model, so neither quantizes where the other
    # does not (check's rule)
    tolerance, per_output = tolerances(profile if profile not in (None, "auto") else "fp16",
                                       rtol, atol, min_cos)
    for name, named in per_output.items():
        key, value = next(iter(named.items()))
        raise EprunError(f"--{key} {name}:{value}: reduce holds every output of every "
                         "candidate to one tolerance; give it without a name", EXIT_USAGE)
    return tolerance


def _why_it_passes(reduction: Reduction, check: str | None) -> str:
    """Why the full model does not fail, in words, for the one line that says so."""
    record = reduction.failure(tuple(range(len(reduction.graph.nodes)))) or {}
    if "timeout" in record:
        return (f"--check ran past --check-timeout {record['timeout']:g} s on it, which "
                "counts as passing without --timeout-fails")
    if check is not None:
        return f"--check {check!r} passes on it"
    return (f"its outputs on {','.join(reduction.on.requested)} are within tolerance of "
            f"{','.join(reduction.reference_on.requested)}'s")


# Weights the original keeps in data files of its own stay outside the reduced model when the
# ones it keeps come to this much or more; below it they are written inline.
REDUCE_EXTERNAL_MIN = 1 << 20


def _write_reduced(reduction: Reduction, kept: tuple, paths: ReducedPaths, sources: tuple,
                   replacing: set) -> bool:
    """Write the reduced model, its inputs and (weights kept outside) its data file, all or
    none; an earlier data file of eprun's that the new model no longer reads goes. True when
    weights went to the data file."""
    graph = reduction.graph
    reduced = graph.model_of(kept, reduction.types, reduction.values)
    mark_as_eprun(reduced, EPRUN_REDUCED)
    outside = sum(_initializer_bytes(tensor) for tensor in external_tensors(reduced)
                  if _in_data_file(tensor, reduction.path))
    write_model, write_data = _weight_writers(
        reduced, reduction.path,
        os.path.basename(paths.data) if outside >= REDUCE_EXTERNAL_MIN else None)
    feed = reduction.feed(kept)
    staged: list[Staged] = []
    folder = open_folder(os.path.dirname(os.path.abspath(paths.model)))
    try:
        if write_data is not None:
            staged.append(stage(write_data, paths.data, like=sources, folder=folder))
        staged.append(stage(lambda stream: write_npz(stream, feed), paths.inputs,
                            like=sources, folder=folder))
        staged.append(stage(write_model, paths.model, like=sources, folder=folder))
        commit(staged)
        if write_data is None and paths.data in replacing:  # the last one's, now unread
            with contextlib.suppress(OSError):
                os.unlink(os.path.basename(paths.data), dir_fd=folder)
    except BaseException:
        discard(staged)
        raise
    finally:
        os.close(folder)
    return write_data is not None


def _replaceable(paths: ReducedPaths, force: bool) -> set[str]:
    """The paths ``reduce`` writes that hold what an earlier ``reduce`` wrote there (a model
    with eprun's mark, the inputs file whose arrays are that model's inputs, the data file it
    reads). Any other file there is refused, unless ``force``."""
    present = {path for path in paths if os.path.lexists(path)}
    earlier = None
    if paths.model in present and is_eprun_model(paths.model):
        earlier = load_model(paths.model, graph_only=True)
    elif paths.model in present and not force:
        raise EprunError(f"refusing to replace {paths.model!r}, which eprun did not write; "
                         "choose another --output, or add --force to replace it")
    mine = set()
    if earlier is not None:
        mine.add(paths.model)
        inputs = {value.name for value in graph_inputs(earlier)}
        if paths.inputs in present and _npz_members(paths.inputs) == inputs:
            mine.add(paths.inputs)
        if any(_external_location(tensor).location == os.path.basename(paths.data)
               for tensor in external_tensors(earlier)):
            mine.add(paths.data)
    foreign = sorted(present - mine)
    if foreign and not force:
        raise EprunError(f"refusing to replace {foreign[0]!r}, which eprun did not write for "
                         f"{paths.model!r}; move it away, choose another --output, or add "
                         "--force")
    return mine


def _npz_members(path: str) -> set[str] | None:
    """The array names of an ``.npz`` file; None for a file that is not one."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    return {name[:-len(".npy")] for name in names if name.endswith(".npy")}


def _note_invalid(path: str) -> None:
    """Say on stderr when onnx's full check refuses the written model (an original it
    refuses gives such parts)."""
    import onnx

    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as exc:  # ValidationError, InferenceError, or its own failure to read
        note(f"onnx.checker (full_check) refuses {path!r}: {one_line(exc)}")


# == 9. Optimizer explanation ======================================================================

# onnxruntime's graph transformers and rewrite rules, by the name ``disabled_optimizers``
# matches: (name, level, first release, last release or None for "still there"). The level is
# the lowest at which the name runs (1 BASIC, 2 EXTENDED, 3 LAYOUT, 4 ALL only). Where the
# names are defined: onnxruntime/core/optimizer/graph_transformer_utils.cc (GenerateTransformers
# and GenerateRewriteRules) of each release; each name is the string its class passes to
# GraphTransformer(...) or RewriteRule(...). docs/commands.md says how this list is kept up to
# date.
TRANSFORMERS = (
    ("Level1_RuleBasedTransformer", 1, (1, 16), None),
    ("DoubleQDQPairsRemover", 1, (1, 16), None),
    ("ConstantSharing", 1, (1, 16), None),
    ("ShapeInputMerge", 1, (1, 18), (1, 18)),
    ("CommonSubexpressionElimination", 1, (1, 16), None),
    ("ConstantFolding", 1, (1, 16), None),
    ("MatMulAddFusion", 1, (1, 16), None),
    ("ReshapeFusion", 1, (1, 16), None),
    ("FreeDimensionOverrideTransformer", 1, (1, 16), None),
    ("SliceConcatToSpaceToDepthFusion", 1, (1, 25), None),
    ("GeluFusionL1", 1, (1, 20), None),
    ("LayerNormFusionL1", 1, (1, 20), None),
    ("QDQPropagationTransformer", 1, (1, 16), None),
    ("WeightBiasQuantization", 1, (1, 21), None),
    ("EnsureUniqueDQForNodeUnit", 1, (1, 16), None),
    ("WhereDummyDq", 1, (1, 24), None),
    ("TransposeOptimizer", 1, (1, 16), None),
    ("DQMatMulNBitsFusion", 1, (1, 24), None),
    ("Level2_RuleBasedTransformer", 2, (1, 19), None),
    ("TransposeOptimizer_CPUExecutionProvider", 2, (1, 17), None),
    ("QDQS8ToU8Transformer", 2, (1, 16), None),
    ("QDQSelectorActionTransformer", 2, (1, 16), None),
    ("GemmActivationFusion", 2, (1, 16), None),
    ("MatMulIntegerToFloatFusion", 2, (1, 16), None),
    ("DynamicQuantizeMatMulFusion", 2, (1, 16), None),
    ("ConvActivationFusion", 2, (1, 16), None),
    ("GeluFusion", 2, (1, 16), (1, 19)),
    ("LayerNormFusion", 2, (1, 16), (1, 19)),
    ("GeluFusionL2", 2, (1, 20), None),
    ("LayerNormFusionL2", 2, (1, 20), None),
    ("SimplifiedLayerNormFusion", 2, (1, 16), None),
    ("AttentionFusion", 2, (1, 16), None),
    ("EmbedLayerNormFusion", 2, (1, 16), None),
    ("GatherToSplitFusion", 2, (1, 16), (1, 17)),
    ("GatherSliceToSplitFusion", 2, (1, 18), None),
    ("GatherToSliceFusion", 2, (1, 16), None),
    ("MatmulTransposeFusion", 2, (1, 16), None),
    ("BiasGeluFusion", 2, (1, 16), None),
    ("GroupQueryAttentionFusion", 2, (1, 22), None),
    ("SkipLayerNormFusion", 2, (1, 16), None),
    ("BiasSkipLayerNormFusion", 2, (1, 25), None),
    ("FastGeluFusion", 2, (1, 16), None),
    ("QuickGeluFusion", 2, (1, 16), None),
    ("SwiGluFusion", 2, (1, 32), None),
    ("BiasSoftmaxFusion", 2, (1, 16), None),
    ("BiasDropoutFusion", 2, (1, 16), None),
    ("MatMulScaleFusion", 2, (1, 16), None),
    ("MatMulActivationFusion", 2, (1, 16), None),
    ("MatMulNBitsFusion", 2, (1, 19), None),
    ("GroupQueryAttentionPreNormFusion", 2, (1, 28), None),
    ("QDQFinalCleanupTransformer", 2, (1, 16), None),
    ("GeluApproximation", 2, (1, 16), None),
    ("Avx2WeightS8ToU8Transformer", 2, (1, 16), None),
    ("NchwcTransformer", 3, (1, 16), None),
    ("NhwcTransformer", 3, (1, 16), None),
    ("ConvAddActivationFusion", 3, (1, 16), None),
    ("FuseFp16InitializerToFp32NodeTransformer", 4, (1, 23), None),
)


# The rewrite rules inside Level1_RuleBasedTransformer and Level2_RuleBasedTransformer.
REWRITE_RULES = (
    ("EliminateIdentity", 1, (1, 16), None), ("EliminateSlice", 1, (1, 16), None),
    ("UnsqueezeElimination", 1, (1, 16), None), ("EliminateDropout", 1, (1, 16), None),
    ("ExpandElimination", 1, (1, 16), None), ("CastElimination", 1, (1, 16), None),
    ("CastChainElimination", 1, (1, 23), None), ("PreShapeNodeElimination", 1, (1, 16), None),
    ("NoopElimination", 1, (1, 16), None), ("DivMulFusion", 1, (1, 16), None),
    ("FuseReluClip", 1, (1, 16), None), ("GemmSumFusion", 1, (1, 16), None),
    ("GemmTransposeFusion", 1, (1, 16), None), ("NotWhereFusion", 1, (1, 16), None),
    ("ConvAddFusion", 1, (1, 16), None), ("ConvMulFusion", 1, (1, 16), None),
    ("ConvBNFusion", 1, (1, 16), None), ("Pad_Fusion", 1, (1, 17), None),
    ("MatMul_BatchNormalization_Fusion", 1, (1, 17), None),
    ("LabelEncoderFusion", 1, (1, 18), None), ("ClipQuantRewrite", 1, (1, 16), None),
    ("ReluQuantRewrite", 1, (1, 16), None),
)


# The levels a case is bisected over, in order, with the transformer level each one adds.
OPTIMIZATION_LEVELS = (("ORT_ENABLE_BASIC", 1), ("ORT_ENABLE_EXTENDED", 2),
                       ("ORT_ENABLE_LAYOUT", 3), ("ORT_ENABLE_ALL", 4))


def known_names(table: tuple, up_to_level: int) -> list[str]:
    """The names of ``table`` this onnxruntime release has, at or below ``up_to_level``."""
    release = ort_release()
    return [name for name, level, first, last in table
            if level <= up_to_level and first <= release and (last is None or release <= last)]


def ddmin(items: list[str], passes: Callable[[list[str]], bool]) -> list[str]:
    """Zeller's delta debugging: a minimal subset of ``items`` for which ``passes`` holds,
    given that it holds for all of them (minimal: dropping any one item makes it fail)."""
    parts = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / parts)
        chunks = [items[k:k + size] for k in range(0, len(items), size)]
        for chunk in chunks:
            if passes(chunk):
                items, parts = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [item for item in items if item not in chunk]
                if len(chunks) > 2 and passes(rest):
                    items, parts = rest, max(parts - 1, 2)
                    break
            else:
                if parts >= len(items):
                    break
                parts = min(len(items), parts * 2)
    return items


# One piece: one search in two stages (at the level that introduces the difference, then at
# the case's own), sharing one progress line and one count of tries; the complexity is the
# explanation's outcomes, each of which returns the record it says.
def explain_case(runner: SettingsRunner, base, case: dict) -> dict:
    """Why one settings case differs from the baseline, and what undoes it.

    A case at ORT_DISABLE_ALL, or one whose single-threaded twin equals the baseline, differs
    by its thread count: onnxruntime splits the work and sums in another order, no optimizer
    involved. Otherwise the levels are bisected (BASIC, EXTENDED, LAYOUT, ALL, one thread) to
    the one that introduces the difference; a delta-debugging search over this release's
    transformer names at that level finds a minimal set whose disabling restores the baseline
    bit for bit (rule containers are refined to their rules); each name is checked to change
    the optimized graph, since onnxruntime ignores names it does not know; and the first
    boundary that differs, with the optimized nodes that compute it, says where it starts.
    """
    level, intra_op = case["level"], case["intra_op"]
    explanation = {"level": level, "intra_op": intra_op}
    threads_reason = (f"no graph optimizer: with {intra_op} intra-op threads onnxruntime splits "
                      "the work of a kernel (a reduction, a matrix product) and sums the parts "
                      "in another order")
    if level == SETTINGS_BASELINE[0] or (
            intra_op > 1 and bitwise_equal(base, runner.output(level, 1))):
        return {**explanation, "cause": "threads", "why": threads_reason}
    levels = [(name, rank) for name, rank in OPTIMIZATION_LEVELS
              if hasattr(import_ort().GraphOptimizationLevel, name)]
    introducing, rank = next(((name, rank) for name, rank in levels
                              if not bitwise_equal(base, runner.output(name, 1))), levels[-1])
    explanation["introduced_by"] = introducing

    progress = Progress(f"searching the transformers behind {level} x{intra_op}")
    tries = [0]

    def restores(names: list[str]) -> bool:
        """Does disabling ``names`` at the level that introduces the difference restore the
        baseline?"""
        tries[0] += 1
        progress.step(tries[0])
        return bitwise_equal(base, runner.output(introducing, 1, names))

    candidates = known_names(TRANSFORMERS, rank)
    if not restores(candidates):
        progress.close()
        return {**explanation, "cause": "not an optimizer",
                "why": "disabling every graph transformer this onnxruntime release has up to "
                       f"{introducing} does not restore the baseline: the difference comes "
                       "from a transformer that cannot be disabled or from kernel choice"}
    found = _refined(ddmin(candidates, restores), restores)
    joined_at: dict[str, str] = {}  # a name found at the case's level, not at introducing
    # the set is the answer only if disabling it restores the baseline at the case's own
    # level (rerun here); only then can what is left at more threads be the threads' doing
    restored = level == introducing or bitwise_equal(base, runner.output(level, 1, found))
    if not restored:
        # more transformers change the numbers at the case's own level: find those too
        case_rank = dict(levels).get(level, rank)

        def restores_here(names: list[str]) -> bool:
            """Does disabling ``names`` (with those found) at the case's own level restore the
            baseline?"""
            tries[0] += 1
            progress.step(tries[0])
            return bitwise_equal(base, runner.output(level, 1, found + names))

        more = [name for name in known_names(TRANSFORMERS, case_rank) if name not in found]
        if restores_here(more):
            joined = _refined(ddmin(more, restores_here), restores_here)
            found, joined_at = found + joined, dict.fromkeys(joined, level)
            restored = bitwise_equal(base, runner.output(level, 1, found))
    progress.close()
    changed = {name: _changes_the_graph(runner, joined_at.get(name, introducing), name)
               for name in found}
    explanation.update(cause="optimizer", transformers=found,
                       verified=[name for name in found if changed[name]],
                       restores_baseline=restored)
    if not restored:
        explanation["why"] = (f"disabling these restores the baseline at {introducing} but "
                              f"not at {level}: the rest of the difference comes from a "
                              "transformer that cannot be disabled or from kernel choice")
    elif intra_op > 1 and not bitwise_equal(base, runner.output(level, intra_op, found)):
        explanation["threads_too"] = threads_reason
    explanation["first_difference"] = _first_difference(runner, base, level, intra_op)
    explanation["workaround"] = {
        "disabled_optimizers": found,
        "session_config": {"optimization.disable_specified_optimizers": ";".join(found)}
        if ort_release() >= (1, 18) else None,
        "graph_optimization_level": next(
            (name for name, _ in reversed(levels[:levels.index((introducing, rank))])),
            SETTINGS_BASELINE[0])}
    return explanation


def _refined(found: list[str], restores: Callable[[list[str]], bool]) -> list[str]:
    """``found`` with each rule container in it (Level1/Level2_RuleBasedTransformer) replaced
    by the rules inside it that make the difference, where those alone do."""
    for container, rule_level in (("Level1_RuleBasedTransformer", 1),
                                  ("Level2_RuleBasedTransformer", 2)):
        if container in found:  # which rules inside it
            others = [name for name in found if name != container]
            rules = known_names(REWRITE_RULES, rule_level)
            if restores(others + rules):
                found = others + ddmin(rules, lambda subset, o=others: restores(o + subset))
    return found


def _optimized_nodes(runner: SettingsRunner, level: str, disabled: list[str] = ()) -> list:
    """The nodes of the graph onnxruntime optimized at ``level`` (one thread)."""
    with scratch_folder("eprun-optimized-") as scratch:
        path = os.path.join(scratch, "optimized.onnx")
        runner.session(level, 1, disabled, optimized_path=path)
        return list(load_model(path).graph.node)


def _changes_the_graph(runner: SettingsRunner, level: str, name: str) -> bool:
    """Does disabling ``name`` change the optimized graph (is it a name onnxruntime uses)?"""
    def shape(nodes: list) -> list:
        """The nodes as op types, inputs and outputs, to compare two graphs by."""
        return [(node.op_type, list(node.input), list(node.output)) for node in nodes]

    return shape(_optimized_nodes(runner, level)) != shape(
        _optimized_nodes(runner, level, [name]))


def _first_difference(runner: SettingsRunner, base, level: str, intra_op: int) -> dict:
    """The first boundary (as in ``layers``) whose value differs between the baseline and the
    case, both exposed, and the optimized nodes that compute it that the file does not have."""
    def boundary_values(at_level: str, threads: int) -> tuple[list[str], list]:
        """The boundaries and their values with the model exposed, at ``at_level`` and
        ``threads``."""
        model = load_model(runner.model)
        boundaries = expose_in_place(model, BOUNDARY_OPS, unknown_as_float=False)

        session = open_exposed(model, runner.model, {"level": at_level, "threads": threads},
                               on=runner.on)
        fetched = fetch(session, boundaries, runner.feed.arrays, what=repr(runner.model))
        return boundaries, [fetched[name] for name in boundaries]

    boundaries, reference = boundary_values(*SETTINGS_BASELINE)
    _, candidate = boundary_values(level, intra_op)
    index = next((k for k, (a, b) in enumerate(zip(reference, candidate))
                  if not bitwise_equal(a, b)), None)
    if index is None:
        return {"index": None, "why": "with every boundary exposed as an output the two "
                "settings agree: exposing them stops the fusion that makes the difference"}
    original = {(node.name, node.op_type) for node in
                load_model(runner.model).graph.node}
    optimized = _optimized_nodes(runner, level)
    optimized_index = GraphIndex(optimized)
    stop = set(boundaries[:index]) | set(runner.feed.arrays)
    fused, pending, seen = [], [boundaries[index]], set()
    while pending:
        node = optimized_index.producer(pending.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if (node.name, node.op_type) not in original:
            fused.append({"name": node.name, "op_type": node.op_type})
        pending += [name for name in node.input if name and name not in stop]
    return {"index": index, "tensor": boundaries[index],
            "max_abs_diff": largest_of(differences(reference[index], candidate[index])[2]),
            "optimized_nodes": fused}


# == 10. Commands ==================================================================================


# -- providers -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProvidersOptions(EpFlags):
    """``providers``' options; each field is the flag of its name."""

    nodes: bool = False
    fail_on_fallback: bool = False


def providers(model: str, lists: list[list[str]],
              options: ProvidersOptions | None = None) -> dict:
    """One session per requested list; what it actually holds, what was missing, and whether
    it fell back. A model onnxruntime cannot open is reported per case, not as a failure.

    Installed plugin EP packages and ``ep_library`` files are registered first, so
    ``available`` lists the plugin EPs that offer a device here, and a plugin EP is asked for
    through its devices (``ProviderRequest``). A provider that rejects its ``ep_options`` is
    the case's ``error``, with its own words on stderr. Each case also says how many nodes
    each provider took (``nodes_per_provider``: a listed EP may have taken none), except in
    the contract's own call (a contract-shaped model, no option), whose answer stays exactly
    the contract's; ``nodes`` asks for them there too."""
    options = options or ProvidersOptions()
    ep_library, ep_options = options.ep_library, options.ep_options
    nodes, fail_on_fallback = options.nodes, options.fail_on_fallback
    require_file(model)
    ort = import_ort()
    ep_options = ep_options or {}
    prepare_providers(lists, ep_library, ep_options, discover=True)
    available = list(ort.get_available_providers())
    cases, counts, shaped = [], [], True
    for message in dict.fromkeys(m for requested in lists
                                 for m in provider_warnings(requested)):
        note(message)
    for message in plugin_notes(lists):
        note(message)
    for name in _missing_built_ins(lists, available):
        note(why_missing(name, ProviderRequest([name])))
    for requested in lists:
        case, got, case_shaped = _provider_case(model, requested, available, ep_options)
        shaped = shaped and case_shaped
        cases.append(case)
        counts.append(got.nodes)
    if nodes or fail_on_fallback or ep_options or ep_library or not shaped:
        for case, counted in zip(cases, counts):
            case.update(nodes_record(counted))
    return {"model": model, "available": available, "cases": cases}


def _missing_built_ins(lists: list[list[str]], available: list[str]) -> list[str]:
    """The providers asked for that onnxruntime knows but this build lacks, once each in the
    order asked: each gets a note of the package that has it (an unknown name has its own
    warning, a plugin EP its own note)."""
    known = set(import_ort().get_all_providers())
    return [name for name in dict.fromkeys(name for requested in lists for name in requested)
            if name in known and name not in available and not plugin_notes([[name]])]


def _provider_case(model: str, requested: list[str], available: list[str],
                   ep_options: dict) -> tuple[dict, Got, bool]:
    """``(case, what its session got, whether the session takes the contract's input)``: one
    requested list opened on ``model``; a session that does not open is the case's
    ``error`` (onnxruntime's exception class), and so is a provider onnxruntime dropped over
    its options (asked why, on stderr)."""
    on = ProviderRequest(requested, options=ep_options)
    got, error, shaped = Got([], {}), None, True
    try:
        session = open_session(model, on=on)
        got = Got.of(session)
        shaped = _contract_shaped(session)
        del session
    except ModelChanged:
        raise
    except EprunError as exc:  # the contract's error: onnxruntime's exception class
        error = type(exc.__cause__).__name__
        if any(name in ep_options for name in requested):  # its words on what it refused
            note(f"case {','.join(requested)}: {native_message(exc.__cause__ or exc)}")
    case = {
        "requested": requested,
        "actual": got.actual,
        "missing": [name for name in requested
                    if name not in available and not name.startswith(POLICY_PREFIX)],
        "fell_back": differs_from_request(requested, got.actual),
        "error": error,
    }
    rejected = [name for name in fallback_of(requested, got.actual)
                if name in ep_options and name in available]
    if rejected and not error:  # onnxruntime dropped it and went on: ask it why
        case["error"] = "RuntimeError"  # what a provider that will not start raises
        for name in rejected:
            note(f"case {','.join(requested)}: {why_missing(name, on, model)}")
    return case, got, shaped


def _contract_shaped(session) -> bool:
    """Does the session take the contract's one float32 ``[batch, F]`` input? (Its metadata
    says: a model with integer inputs is not, and needs no graph read to say so.)"""
    inputs = session.get_inputs()
    return (len(inputs) == 1 and inputs[0].type == "tensor(float)"
            and is_contract_input(session_specs(session, "")))


def providers_verdict(args: argparse.Namespace, answer: dict) -> str | None:
    """``--fail-on-fallback``: which cases did not get a provider they asked for."""
    fell = [(index, case) for index, case in enumerate(answer["cases"])
            if fallback_of(case["requested"], case["actual"], case.get("nodes_per_provider"))]
    if not args.fail_on_fallback or not fell:
        return None
    def got(case: dict) -> str:
        """What a fallen-back case got instead, in words: the providers that took no node, or the
        list."""
        nodes = case.get("nodes_per_provider") or {}
        idle = [name for name in fallback_of(case["requested"], case["actual"], nodes or None)
                if name in case["actual"]]
        return (f"{', '.join(idle)} took 0 of {sum(nodes.values())} nodes" if idle else
                f"got {','.join(case['actual']) or 'no session'}")

    return "fallback: " + "; ".join(
        f"case {index} asked for {','.join(case['requested'])} and {got(case)}"
        for index, case in fell)


declare(Command(
    name="providers",
    summary="requested vs. actual execution providers, one session per list",
    function=providers,
    options=ProvidersOptions,
    positionals=("model", "lists"),
    arguments=(MODEL,
               arg("lists", nargs="+", type=parse_list, metavar="list",
                   help="comma-joined provider names, e.g. "
                        "CUDAExecutionProvider,CPUExecutionProvider, or one device policy "
                        f"policy:NAME ({', '.join(DEVICE_POLICIES)}; onnxruntime 1.22+)"),
               *EP_ARGS,
               arg("--fail-on-fallback", action="store_true",
                   help="exit 1 (after printing the answer) when a case did not get a provider "
                        "it asked for, or the provider took no node (onnxruntime adding the "
                        "CPU provider is not a fallback)"),
               arg("--nodes", action="store_true",
                   help="say how many nodes each provider took in every case, also where the "
                        "answer would otherwise be exactly the contract's (a contract-shaped "
                        "model and no option)"),
               FORMAT_ARG),
    fields=("model", "available", "cases"),
    detail='cases: [{"requested", "actual", "missing", "fell_back", "error"}]; each case adds '
           '"nodes_per_provider" (null and "nodes_unknown" before onnxruntime 1.24) unless the '
           'call is the contract\'s own (a contract-shaped model, no option; --nodes adds it)',
    example="eprun.py providers model.onnx CUDAExecutionProvider,CPUExecutionProvider "
            "CPUExecutionProvider",
    verdict=providers_verdict))


# -- partition -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartitionOptions:
    """``partition``'s options; each field is the flag of its name (``mode``: ``--rule``)."""

    mode: str = "file"
    node_data: str | None = None


def partition(model: str, supported: list[str], options: PartitionOptions | None = None, *,
              parsed=None) -> dict:
    """Which pieces an EP supporting only ``supported`` would get; needs only onnx.

    ``file`` (the contract): runs of consecutive nodes in file order. ``ort``: the groups
    onnxruntime's own partitioner forms, with the unsupported nodes between them merged; as
    onnxruntime partitions each If/Loop/Scan body on its own (a group never crosses into a
    subgraph), each body is partitioned alone, listed under ``subgraphs`` and added into
    ``totals``. ``parsed`` is the already parsed graph of ``model``, when the caller has it.
    """
    options = options or PartitionOptions()
    mode, node_data = options.mode, options.node_data
    require_views(node_data, None)
    if parsed is None:
        parsed = load_model(model, graph_only=True)
    _check_op_list(parsed, supported, model, mode)
    answer = {"model": model, "supported": supported,
              **_partition_graph(parsed.graph, supported, mode)}
    if mode == "ort":
        subgraphs = _partition_subgraphs(parsed.graph, supported)
        if subgraphs:
            answer["subgraphs"] = subgraphs
            answer["totals"] = _partition_totals(answer)
    if node_data:  # each node of the main graph its owner and the partition's index
        writer = NodeDataWriter(node_data, {"model": model})
        writer.add("model", parsed.graph, "partition", {
            ("node", index): f"{'EP' if owner == 'ep' else 'CPU'} {number}"
            for number, (owner, members) in enumerate(
                _partition_members(parsed.graph.node, supported, mode))
            for index in members})
        answer.update(writer.write())
    return answer


def _check_op_list(parsed, supported: list[str], model: str, mode: str) -> None:
    """A note when no listed op type occurs in the graphs ``mode`` partitions (the main one,
    and with ``ort`` every If/Loop/Scan body too; op types are case-sensitive), with the near
    misses and the op types there."""
    import difflib

    nodes = _nodes_everywhere(parsed.graph) if mode == "ort" else parsed.graph.node
    present = list(dict.fromkeys(node.op_type for node in nodes))
    if not supported or set(supported) & set(present):
        return
    lower = {op.lower(): op for op in present}
    near = [lower.get(op.lower()) or next(iter(difflib.get_close_matches(op, present, 1, 0.7)),
                                          None) for op in supported]
    misses = [f"{op} -> {guess}" for op, guess in zip(supported, near) if guess]
    note(f"no op type in {','.join(supported)!r} occurs in {model!r} (op types are "
         f"case-sensitive){'; did you mean ' + ', '.join(misses) + '?' if misses else ''} Its "
         f"op types: {', '.join(present) or 'none'}")


def _partition_members(nodes, supported: list[str], mode: str) -> list[tuple[str, list]]:
    """``(owner, node positions)`` of each partition, in the answer's order."""
    nodes = list(nodes)
    if mode == "ort":
        groups = ort_partition_groups(nodes, supported)
    else:
        supported_set = set(supported)
        groups = [("ep" if node.op_type in supported_set else "cpu", [index])
                  for index, node in enumerate(nodes)]
    # Runs of groups with one owner form one partition. onnxruntime's groups are never
    # adjacent (a new wave starts with the unsupported nodes the last group held back), so
    # in ort mode only unsupported nodes merge.
    return [(owner, [index for _, members in run for index in members])
            for owner, run in itertools.groupby(groups, key=lambda group: group[0])]


def _partition_graph(graph, supported: list[str], mode: str) -> dict:
    """One graph's split (``_partition_members``): its node count, the nodes the EP claims, the
    partitions and the hand-offs between them."""
    nodes = list(graph.node)
    merged = _partition_members(nodes, supported, mode)
    partitions = [{"owner": owner, "nodes": [nodes[i].op_type for i in members],
                   "size": len(members)} for owner, members in merged]
    return {
        "nodes": len(nodes),
        "claimed": sum(part["size"] for part in partitions if part["owner"] == "ep"),
        "partition_count": len(partitions),
        "handoffs": max(len(partitions) - 1, 0),
        "partitions": partitions,
    }


def _nodes_everywhere(graph) -> Iterator:
    """The graph's nodes, then those of every If branch and Loop/Scan body, depth first."""
    for node in graph.node:
        yield node
    for node in graph.node:
        for attribute in node.attribute:
            for body in ([attribute.g] if attribute.HasField("g") else []) + \
                    list(attribute.graphs):
                yield from _nodes_everywhere(body)


def _partition_subgraphs(graph, supported: list[str]) -> list[dict]:
    """Each graph attribute of each node (If branches, Loop and Scan bodies), depth first."""
    found = []
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:
            bodies = ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
            for body in bodies:
                entry = {"node": node.name or f"{node.op_type}_{index}", "op_type": node.op_type,
                         "attribute": attribute.name, **_partition_graph(body, supported, "ort")}
                inner = _partition_subgraphs(body, supported)
                if inner:
                    entry["subgraphs"] = inner
                found.append(entry)
    return found


def _partition_totals(answer: dict) -> dict:
    """Nodes, claimed nodes and EP partitions summed over the graph and every subgraph (the
    counts onnxruntime's own usability checker reports)."""
    levels, pending = [], [answer]
    while pending:
        level = pending.pop()
        levels.append(level)
        pending.extend(level.get("subgraphs", ()))
    return {"graphs": len(levels),
            "nodes": sum(level["nodes"] for level in levels),
            "claimed": sum(level["claimed"] for level in levels),
            "ep_partitions": sum(1 for level in levels for part in level["partitions"]
                                 if part["owner"] == "ep")}


declare(Command(
    name="partition",
    summary="file-order simulation of the partitions an EP supporting only the listed ops "
            "would form (no session)",
    function=partition,
    options=PartitionOptions,
    positionals=("model", "supported"),
    onnxruntime=False,
    arguments=(MODEL,
               arg("supported", type=parse_list, help="comma-joined op types, e.g. MatMul,Add"),
               arg("--rule", dest="mode", choices=("file", "ort"), default="file",
                   help="file: runs of consecutive nodes in file order (the lab's rule, "
                        "default); ort: the groups onnxruntime's partitioner forms "
                        "(topological, branches merge, each If/Loop/Scan body on its own)"),
               hidden_alias("--mode", "mode", choices=("file", "ort")),
               FORMAT_ARG, NODE_DATA_ARG),
    fields=("model", "supported", "nodes", "claimed", "partition_count", "handoffs",
            "partitions"),
    detail='partitions: [{"owner", "nodes", "size"}]; --rule ort adds "subgraphs" and '
           '"totals" when the model has If/Loop/Scan bodies',
    example="eprun.py partition model.onnx MatMul,Add,Relu --rule ort"))


# -- expose ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ExposeOptions:
    """``expose``'s options; each field is the flag of its name."""

    boundary_ops: tuple[str, ...] = BOUNDARY_OPS
    force: bool = False


def expose(model: str, out: str, options: ExposeOptions | None = None) -> dict:
    """Save a copy of the model whose outputs include every boundary; the input is untouched.
    An existing file at ``out`` that eprun did not write is replaced only with ``force``."""
    options = options or ExposeOptions()
    answer, staged = prepare_expose(model, out, options.boundary_ops, force=options.force,
                                    say_absent=True)
    commit(staged)
    return answer


def prepare_expose(model_path: str, out_path: str, boundary_ops: tuple[str, ...] = BOUNDARY_OPS,
                   *, force: bool = False, checked: bool = False, folder: int | None = None,
                   say_absent: bool = False) -> tuple[dict, list[Staged]]:
    """Everything ``expose`` writes, checked and staged but not yet visible: the answer and
    the staged files (see ``commit``). A model keeping its weights in other files gets
    ``"external_data"`` in the answer: how the copy reaches each file (see
    ``plan_external_data``). The copy is marked as eprun's (``EPRUN_MARK``); an existing file
    at ``out_path`` without that mark is replaced only with ``force`` (``checked``: the caller
    has refused it already). ``folder``: the output's folder, already open. ``say_absent``:
    note a ``boundary_ops`` op type the model has no node of (``expose`` itself; ``report``'s
    measurement notes it for both models)."""
    model = load_model(model_path, text_names=True, graph_only=True)
    if say_absent:
        _note_absent_ops((model,), boundary_ops)
    require_output_path(out_path, [model_path, *external_data_files(model, model_path)])
    own = folder is None
    folder = open_folder(os.path.dirname(os.path.abspath(out_path))) if own else folder
    try:
        return _stage_expose(model, model_path, out_path, boundary_ops, force=force,
                             checked=checked, folder=folder)
    finally:
        if own:
            os.close(folder)


def _stage_expose(model, model_path: str, out_path: str, boundary_ops: tuple[str, ...], *,
                  force: bool, checked: bool, folder: int) -> tuple[dict, list[Staged]]:
    """``prepare_expose`` once the output's folder is open: every check of what is at the
    output's name and every file staged goes through ``folder``."""
    existing = in_folder(folder, out_path)
    replacing = os.path.isfile(existing)
    if replacing and not force and not checked and not is_eprun_model(existing):
        raise EprunError(f"refusing to replace {out_path!r}, which eprun did not write"
                         f"{_swapped_hint(existing)}; choose another output path, or add "
                         "--force to replace it")
    boundaries = expose_in_place(model, boundary_ops)
    mark_as_eprun(model)
    plan = plan_external_data(model, model_path, out_path, replacing=replacing or force)
    like = (model_path,)
    writer = _inline_writer(model, model_path, relocate=plan)
    staged: list[Staged] = []
    try:
        for entry in plan:
            if entry["how"] == "copy":
                how: list[str] = []
                staged.append(stage(_copier(entry["source"], how, model_path), entry["file"],
                                    like=(entry["source"],), folder=folder))
                entry["how"] = how[0]
        staged.append(stage(writer, out_path, like=like, folder=folder))
    except BaseException:
        discard(staged)
        raise
    answer = {"model": model_path, "out": out_path, "boundaries": boundaries,
              "outputs": [value.name for value in model.graph.output]}
    if plan:
        answer["external_data"] = plan
    return answer, staged


def _swapped_hint(out_path: str) -> str:
    """For an output that is somebody's model: the arguments may be the wrong way round."""
    try:
        model = load_model(out_path, graph_only=True)
    except (EprunError, OSError, ValueError):
        return ""
    outputs = {value.name for value in model.graph.output}
    if len(outputs) > 1 and set(find_boundaries(model.graph, BOUNDARY_OPS)) <= outputs:
        return (" (it looks like an exposed copy, which eprun marks since 0.10: if an older "
                "eprun wrote it, --force replaces it once)")
    return (" (it is an ONNX model: are the arguments swapped? expose reads the first and "
            "writes the second)")

declare(Command(
    name="expose",
    summary="save a copy whose graph outputs include every layer boundary (first input of each "
            "MatMul/Gemm, then the first float output)",
    function=expose,
    options=ExposeOptions,
    positionals=("model", "out"),
    onnxruntime=False,
    arguments=(arg("model", help="ONNX model file (never modified)"),
               arg("out", help="path of the exposed model to write"), BOUNDARY_OPS_ARG,
               FORCE_ARG,
               FORMAT_ARG),
    fields=("model", "out", "boundaries", "outputs"),
    example="eprun.py expose int8.onnx int8_exposed.onnx"))


# -- layers and growth -----------------------------------------------------------------------------

def layers(fp32: str, int8: str, seed: int, options: LayerOptions | None = None) -> dict:
    """Boundary-by-boundary FP32 vs. INT8 error (see ``measure_layers``). The same file given
    twice with ``providers`` is the EP-vs-CPU divergence table of that model."""
    options = options or LayerOptions()
    require_file(fp32)
    require_file(int8)
    require_views(options.node_data, options.save_plots, options.plot_format)
    targets = targets_from(options, options.reference_providers)
    answer = measure_layers(fp32, int8, seed, options, targets)[0]
    if options.node_data:
        answer.update(_layers_node_data(options.node_data, fp32, int8, answer))
    if options.save_plots:
        metric = METRICS[options.metrics[0]].field if options.metrics else "rel_error"
        writer = PlotWriter(options.save_plots, int8, "layers", options.plot_format)
        plot_boundaries(writer, answer, metric, growth_of(answer))
        answer["plots"] = writer.write((fp32, int8))
    return answer


def require_views(node_data: str | None, save_plots: str | None,
                  plot_format: str | None = None) -> None:
    """Before anything is measured: the folders ``--node-data`` and ``--save-plots`` name can
    be written into, and matplotlib is there for plots."""
    if node_data is not None:
        require_out_dir(node_data, "--node-data")
    require_plots(save_plots, plot_format)


def growth(fp32: str, int8: str, seed: int, options: LayerOptions | None = None) -> dict:
    """The ``layers`` measurement reduced to how relative error grows."""
    options = options or LayerOptions()
    require_views(options.node_data, options.save_plots, options.plot_format)
    measured = layers(fp32, int8, seed, dataclasses.replace(
        options, metrics=(), node_data=None, save_plots=None, plot_format=None))
    answer = growth_of(measured)
    if options.node_data:
        answer.update(_growth_node_data(options.node_data, fp32, int8, measured, answer))
    if options.save_plots:
        writer = PlotWriter(options.save_plots, int8, "growth", options.plot_format)
        plot_boundaries(writer, measured, "rel_error", answer)
        answer["plots"] = writer.write((fp32, int8))
    return answer


def _pair_node_data(folder: str, fp32: str, int8: str, quantities: dict,
                    graphs: dict | None = None) -> dict:
    """Write ``quantities`` (``{quantity: {"fp32": {tensor: value}, "int8": {...}}}``) for
    both models of a pair (``graphs``: their graphs, where the caller has read them); the
    answer's node-data fields."""
    writer = NodeDataWriter(folder, {"fp32": fp32, "int8": int8})
    graphs = graphs or {"fp32": load_model(fp32, graph_only=True).graph,
                        "int8": load_model(int8, graph_only=True).graph}
    for quantity, sides in quantities.items():
        for role, values in sides.items():
            writer.add(role, graphs[role], quantity, values)
    return writer.write()


def _layers_node_data(folder: str, fp32: str, int8: str, answer: dict) -> dict:
    """Each boundary's numbers, on the node that writes the boundary in each model."""
    quantities = [key for key in ("max_abs_error", "rel_error", "cos_min", *metric_fields())
                  if answer["layers"] and key in answer["layers"][0]]
    return _pair_node_data(folder, fp32, int8, {
        key: {role: {entry[role]: entry[key] for entry in answer["layers"]}
              for role in ("fp32", "int8")} for key in quantities})


def _growth_node_data(folder: str, fp32: str, int8: str, measured: dict,
                      answer: dict) -> dict:
    """Ratio *i* on boundary *i + 1* (where the jump lands; null ones left out), and each
    boundary's own error with ``--local``."""
    entries = measured["layers"]
    quantities = {"ratio": {role: {entries[k + 1][role]: ratio
                                   for k, ratio in enumerate(answer["ratios"])
                                   if ratio is not None}
                            for role in ("fp32", "int8")}}
    if "local_rel_error" in answer:
        quantities["local_rel_error"] = {
            role: {entry[role]: value for entry, value in zip(entries, answer["local_rel_error"])
                   if value is not None} for role in ("fp32", "int8")}
    return _pair_node_data(folder, fp32, int8, quantities)


# What layers and growth both take.
PAIR_ARGS = (
    *FP32_INT8, SEED, SEED_OPTION, *INPUT_ARGS, BOUNDARY_OPS_ARG, BOUNDARIES_ARG,
    arg("--pair", choices=("auto", "position", "name"), default="auto",
        help="auto (default): by position, the lab's rule, unless the names pair every "
             "boundary otherwise, or the int8 model is a conversion of the fp32 one (its "
             "computing nodes all named as fp32 nodes): then by name where the names tie, "
             "also across different boundary counts, and the answer says \"pairing\": "
             "\"name\"; "
             "position: always the k-th with the k-th (a warning when the names disagree); "
             "name: by the names quantizers keep (<t>_DequantizeLinear_Output, <node>_quant)"),
    arg("--max-memory", type=parse_count, metavar="MB",
        help="fetch boundaries in batches whose tensors (fp32 + int8) fit in about MB "
             "megabytes, instead of all at once, running each model again per batch; 0 "
             "fetches one at a time. The answer is the same"),
    LOCAL_ARG,
    *measure_ep_args(),
    SWAPPED_OK_ARG,
    arg("--output-name", dest="output", metavar="NAME",
        help="the graph output to end with (default: the first float one), in both models: "
             "e.g. a detector's scores rather than boxes reordered by TopK"),
    hidden_alias("--output", "output"),
    arg("--save-boundaries", metavar="FILE.npz",
        help="also store the fp32 model's boundary tensors and the inputs, for "
             "--load-boundaries on another machine"),
    arg("--load-boundaries", type=parse_file, metavar="FILE.npz",
        help="take the fp32 side from a file --save-boundaries wrote (on its inputs) instead "
             "of running the fp32 model; refused if its boundaries are not the stored ones"),
    NODE_DATA_ARG, *PLOT_ARGS,
)

declare(Command(
    name="layers",
    summary="FP32 vs. INT8 error at every boundary",
    function=layers,
    positionals=("fp32", "int8", "seed"),
    options=LayerOptions,
    arguments=(*PAIR_ARGS, FORMAT_ARG,
               arg("--metrics", type=parse_metrics, default=(),
                   help=f"comma-joined extra metrics per boundary: {', '.join(METRICS)} "
                        "(SQNR in dB and mean squared error)")),
    fields=("seed", "rows", "layer_count", "layers"),
    detail='layers: [{"index", "fp32", "int8", "max_abs_error", "scale", "rel_error", '
           '"cos_min"}]; a model that is not one float32 [batch, F] input adds "inputs"; '
           '--metrics adds "sqnr_db"/"mse" per entry; --local adds "local" per entry and '
           '"local_unavailable"; --providers adds "providers": {"requested", "actual", '
           '"fell_back", "missing", "reference"}; an answer that is not the contract\'s adds '
           '"exposure" and "reference_exposure": {"output", "max_abs_diff"} (how far exposing '
           'moved each side\'s final output); --save-boundaries/--load-boundaries add '
           '"golden"',
    example="eprun.py layers fp32.onnx int8.onnx 2026 --local --metrics sqnr"))

declare(Command(
    name="growth",
    summary="how the relative error grows from boundary to boundary",
    function=growth,
    positionals=("fp32", "int8", "seed"),
    options=LayerOptions,
    arguments=(*PAIR_ARGS, FORMAT_ARG),
    fields=("seed", "layer_count", "rel_error", "ratios", "monotone", "total_growth",
            "max_ratio"),
    detail='max_ratio: {"index", "ratio"}; "growth_from_first_error": {"index", '
           '"total_growth"} where total_growth is null over a first error of 0 (beyond the '
           'contract: not for its models at default options); "inputs", '
           '"providers", "first_divergence", '
           '"exposure" and "reference_exposure" as in layers; --local adds "local_rel_error", '
           '"worst_local" and "local_unavailable"',
    example="eprun.py growth fp32.onnx int8.onnx 2026"))


# -- settings --------------------------------------------------------------------------------------

class SettingsRunner:
    """One model's first output under given session settings, always on the same inputs."""

    def __init__(self, model: str, seed: int, inputs: InputOptions | None,
                 targets: Targets | None = None) -> None:
        """Nothing opened yet: the first ``session`` draws the feed and stamps the model file every
        later case must read."""
        self.model, self.seed, self.inputs = model, seed, inputs
        self.feed: Feed | None = None
        self.on = (targets or Targets()).candidate
        self.got = Got([])
        self.stamp: tuple | None = None  # the model file every case is measured on

    def session(self, level: str, intra_op: int, disabled: list[str] = (),
                optimized_path: str | None = None):
        """A session of the model at ``level`` with ``intra_op`` threads (``disabled`` transformers
        off), refused where the file changed since the first case; the first also draws the feed."""
        options = session_options(level=level, threads=intra_op, optimized_path=optimized_path)
        session = open_session(self.model, options, what=repr(self.model), disabled=disabled,
                               on=self.on)
        if self.stamp is None:  # each case the very file the first case read
            self.stamp = session.eprun_stamp
        else:
            require_same_stamp(self.model, self.stamp, session.eprun_stamp)
        self.got = Got.of(session)
        if self.feed is None:  # from the first session's metadata: a float model needs no onnx
            self.feed = make_feeds(session_specs(session, self.model), self.seed, self.inputs,
                                   self.model)
        return session

    def run(self, session):
        """``session``'s first output on the runner's feed; a non-numeric one is refused."""
        output = session.get_outputs()[0].name
        value = run_session(session, [output], self.feed.arrays, what=repr(self.model),
                            hint=dims_hint(self.feed))[0]
        _require_numeric(value, output, self.model, "settings")
        return value

    def output(self, level: str, intra_op: int, disabled: list[str] = ()):
        """The first output at ``level`` with ``intra_op`` threads and ``disabled`` transformers
        off, from a session of its own."""
        return self.run(self.session(level, intra_op, disabled))

    def output_with(self, provider: str, key: str, value: str):
        """The output at the baseline's level and threads, with one provider option set."""
        base_on = self.on
        options = {**base_on.options, provider: {**base_on.options.get(provider, {}), key: value}}
        self.on = dataclasses.replace(base_on, options=options)
        try:
            return self.output(*SETTINGS_BASELINE)
        finally:
            self.on = base_on


def parse_option_sweep(text: str) -> tuple[str, str, list[str]]:
    """``EP:KEY=V1,V2,...``: the values of one provider option to try, each a case."""
    provider, key, values = parse_ep_option(text)
    items = [value.strip() for value in values.split(",") if value.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} names no value to try (EP:KEY=V1,V2,...)")
    return provider, key, items


def _settings_cases(runner: SettingsRunner, base) -> list[dict]:
    """Each of ``SETTINGS_CASES`` (a level and an intra-op thread count) against the
    baseline's output ``base``."""
    cases = []
    for level, intra_op in SETTINGS_CASES:
        y = runner.output(level, intra_op)
        same_shape = y.shape == base.shape
        diff = largest_of(differences(base, y)[2]) if same_shape else float("nan")
        cases.append({"level": level, "intra_op": intra_op, "max_abs_diff": float(diff),
                      "bitwise_equal": bitwise_equal(base, y)})
    return cases


def _sweep_cases(runner: SettingsRunner, base, sweep: list) -> list[dict]:
    """One case per value of each ``--ep-option-sweep`` (provider, key, values), at the
    baseline's level and threads."""
    cases = []
    for provider, key, values in sweep:
        for value in values:
            y = runner.output_with(provider, key, value)
            diff = (largest_of(differences(base, y)[2]) if y.shape == base.shape
                    else float("nan"))
            cases.append({"level": SETTINGS_BASELINE[0], "intra_op": SETTINGS_BASELINE[1],
                          "ep_option": {"provider": provider, "key": key, "value": value},
                          "max_abs_diff": float(diff), "bitwise_equal": bitwise_equal(base, y),
                          **nodes_record(runner.got.nodes)})
    return cases


@dataclasses.dataclass(frozen=True)
class SettingsOptions(ProviderFlags, PlotFlags):
    """``settings``' options; each field is the flag of its name."""

    inputs: InputOptions | None = None
    explain: bool = False
    ep_option_sweep: list = ()


def settings(model: str, seed: int, options: SettingsOptions | None = None) -> dict:
    """The first output under other optimization levels and intra-op thread counts, compared
    with the single-threaded, unoptimized baseline bit for bit.

    The baseline runs twice; one that does not reproduce itself is reported (``repeatable``
    false). With ``explain``, each case that differs is explained (``explain_case``). With
    ``providers`` every session runs there (``reference`` in the answer's ``providers`` is
    the baseline's session): what the settings change on the EP a model is deployed to; on
    an EP the knobs that matter are its own options, and ``ep_option_sweep`` (provider, key,
    values) adds a case per value, at the baseline's level and threads.
    """
    import numpy as np

    options = options or SettingsOptions()
    require_file(model)
    require_plots(options.save_plots, options.plot_format)
    for provider, key, _ in options.ep_option_sweep:
        if provider not in (options.providers or ()):
            raise EprunError(f"--ep-option-sweep {provider}:{key}: give {provider} in "
                             "--providers, where the sweep runs", EXIT_USAGE)
    targets = targets_from(options)
    runner = SettingsRunner(model, seed, options.inputs, targets)
    base_session = runner.session(*SETTINGS_BASELINE)
    base_got = runner.got
    base = runner.run(base_session)
    repeatable = bitwise_equal(base, runner.run(base_session))
    del base_session
    with np.errstate(all="ignore"):
        baseline = {"level": SETTINGS_BASELINE[0], "intra_op": SETTINGS_BASELINE[1],
                    "max_abs_output": float(np.max(np.abs(base))) if base.size else 0.0,
                    "mean_output": float(base.mean()) if base.size else float("nan")}
    cases = [*_settings_cases(runner, base),
             *_sweep_cases(runner, base, options.ep_option_sweep)]
    answer = {"model": model, "seed": seed}
    if not runner.feed.contract_shaped:
        answer["inputs"] = runner.feed.fed
    answer.update(baseline=baseline, cases=cases,
                  all_equal=all(case["bitwise_equal"] for case in cases))
    if targets.given:
        answer["providers"] = targets.field(runner.got, base_got)
    if options.explain or not repeatable:
        answer["repeatable"] = repeatable
    if options.explain:
        answer["explanations"] = [explain_case(runner, base, case) for case in cases
                                  if not case["bitwise_equal"] and "ep_option" not in case]
    if options.save_plots:
        writer = PlotWriter(options.save_plots, model, "settings", options.plot_format)
        plot_settings(writer, answer)
        answer["plots"] = writer.write((model,))
    return answer


declare(Command(
    name="settings",
    summary="the first output under other optimization levels and thread counts, compared "
            "with a single-threaded unoptimized baseline",
    function=settings,
    positionals=("model", "seed"),
    options=SettingsOptions,
    arguments=(MODEL, SEED, SEED_OPTION, *INPUT_ARGS, FORMAT_ARG, *PLOT_ARGS,
               arg("--explain", action="store_true",
                   help="for each case that differs: the optimization level that introduces "
                        "it, a minimal set of graph transformers whose disabling restores the "
                        "baseline bit for bit, the first boundary that differs, and the "
                        "workaround; or that the thread count (no optimizer) is the cause"),
               arg("--ep-option-sweep", type=parse_option_sweep, action="append", default=[],
                   metavar="EP:KEY=V1,V2",
                   help="with --providers: one more case per value of this provider option "
                        "(e.g. OpenVINOExecutionProvider:precision=FP32,ACCURACY), at the "
                        "baseline's level and threads; repeatable"),
               *measure_ep_args(reference=False)),
    fields=("model", "seed", "baseline", "cases", "all_equal"),
    detail='baseline: {"level", "intra_op", "max_abs_output", "mean_output"}; cases: '
           '[{"level", "intra_op", "max_abs_diff", "bitwise_equal"}]; "inputs" as in layers; '
           '"repeatable" when the baseline does not reproduce itself or with --explain, which '
           'adds "explanations"; --providers adds "providers" (every session runs there; '
           '"reference" is the baseline\'s); --ep-option-sweep adds a case per value with '
           '"ep_option": {"provider", "key", "value"} and its "nodes_per_provider"',
    example="eprun.py settings int8.onnx 2026"))


# -- placement -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PlacementOptions(EpFlags):
    """``placement``'s options; each field is the flag of its name (the inputs feed the one
    profiled run of releases before 1.24, drawn with seed 0)."""

    inputs: InputOptions | None = None
    node_data: str | None = None


def placement(model: str, providers: list[str], options: PlacementOptions | None = None
              ) -> dict:
    """Which execution provider each node was actually assigned to, as onnxruntime reports it.

    onnxruntime 1.24+ records the assignment when asked (``session.record_ep_graph_assignment_
    info``); older releases only show it in a profile, so there eprun runs the model once with
    profiling on and reads each node event's provider. The recorded assignment lists the
    nodes as onnxruntime partitioned them among its EPs (after its basic optimizations; an
    EP's own fusions come later, so the nodes of a kernel the CPU fuses are each listed, on
    the EP that took them); a profile lists the kernels that ran, a fused one once.
    """
    options = options or PlacementOptions()
    seed, inputs, node_data = 0, options.inputs, options.node_data
    ep_library, ep_options = options.ep_library, options.ep_options
    require_file(model)
    require_views(node_data, None)
    prepare_providers([providers], ep_library, ep_options)
    require_known_providers(providers)
    recorded = hasattr(import_ort().InferenceSession, "get_provider_graph_assignment_info")
    source = "graph_assignment_info" if recorded else "profiling"
    with scratch_folder("eprun-profile-") as scratch:
        options = session_options(
            config={"session.record_ep_graph_assignment_info": "1"} if recorded else None,
            profile_prefix=None if recorded else os.path.join(scratch, "profile"))
        # an EP that fails to start (an option it rejects) is an error, not a CPU placement
        session = open_session(model, options, repr(model),
                               on=ProviderRequest(providers, options=ep_options or {},
                                                  strict=True))
        actual = list(session.get_providers())
        nodes, subgraphs = (_recorded_placement(session, model) if recorded else
                            _profiled_placement(session, model, seed, inputs))
    counts = dict(collections.Counter(node["provider"] for node in nodes))
    request = ProviderRequest(providers, options=ep_options or {})
    rejected = [name for name in fallback_of(providers, actual)
                if name in (ep_options or {}) and name in import_ort().get_available_providers()]
    if rejected:  # an option it refused, not a provider this machine lacks
        raise EprunError(f"placement of {model!r}: {why_missing(rejected[0], request, model)}")
    missing = fallback_of(providers, actual, counts)
    if missing:
        note(f"the session did not get {', '.join(missing)}, or it took no node: its nodes ran "
             f"on {', '.join(counts) or 'nothing'}")
    answer = {"model": model, "requested": providers, "actual": actual,
              "fell_back": differs_from_request(providers, actual), "source": source,
              "counts": counts, "nodes_per_provider": counts, "nodes": nodes,
              "subgraphs": dict(collections.Counter(subgraphs))}
    if node_data:
        answer.update(_placement_node_data(node_data, model, nodes))
    return answer


def _recorded_placement(session, model: str) -> tuple[list[dict], list[str]]:
    """``(nodes, subgraphs)`` as onnxruntime 1.24+ recorded the assignment."""
    assigned = session.get_provider_graph_assignment_info()
    try:
        nodes = [{"name": node.name, "op_type": node.op_type, "provider": subgraph.ep_name}
                 for subgraph in assigned for node in subgraph.get_nodes()]
    except UnicodeDecodeError as exc:  # onnxruntime decodes node names as UTF-8
        raise _not_text(model, exc) from exc
    return nodes, [subgraph.ep_name for subgraph in assigned]


def _profiled_placement(session, model: str, seed: int, inputs: InputOptions | None
                        ) -> tuple[list[dict], list[str]]:
    """``(nodes, subgraphs)`` from a profile of one run (one row unless ``--rows``): each
    node event's provider, and the runs of consecutive nodes on one provider, in the order
    they ran."""
    shaped = inputs or InputOptions()
    feed = make_feeds(session_specs(session, model), seed,
                      dataclasses.replace(shaped, rows=shaped.rows or 1), model)
    run_session(session, None, feed.arrays, what=repr(model), hint=dims_hint(feed))
    try:
        nodes = _profiled_nodes(session.end_profiling())
    except UnicodeDecodeError as exc:
        raise _not_text(model, exc) from exc
    return nodes, [provider for provider, _ in
                   itertools.groupby(node["provider"] for node in nodes)]


def _placement_node_data(folder: str, model: str, nodes: list[dict]) -> dict:
    """Each node of the file its provider (short: ``OpenVINO``, ``CPU``), matched by name with
    the nodes onnxruntime ran; a node it fused into another, or renamed, has none."""
    graph = load_model(model, graph_only=True).graph
    ran = {node["name"]: node["provider"] for node in nodes if node["name"]}
    values = {("node", index): _short_provider(ran[node.name])
              for index, node in enumerate(graph.node) if node.name in ran}
    writer = NodeDataWriter(folder, {"model": model})
    writer.add("model", graph, "provider", values)
    writer.counts["unplaced"] += len(graph.node) - len(values)
    return writer.write()


def _short_provider(name: str) -> str:
    """A provider's name as a node shows it: ``OpenVINO`` for ``OpenVINOExecutionProvider``."""
    return name[:-len("ExecutionProvider")] if name.endswith("ExecutionProvider") else name


def _not_text(model: str, exc: UnicodeDecodeError) -> EprunError:
    """The error (exit 4) for a node name not UTF-8: placement reports node names as text."""
    return EprunError(f"{model!r} has a node whose name is not UTF-8 text ({one_line(exc)}); "
                      "placement reports node names as text: give it a UTF-8 name")


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


declare(Command(
    name="placement",
    summary="which execution provider each node was actually assigned to (onnxruntime's "
            "graph assignment info, or a one-run profile on releases before 1.24)",
    function=placement,
    options=PlacementOptions,
    positionals=("model", "providers"),
    arguments=(MODEL, arg("providers", type=parse_list, help="comma-joined provider names"),
               *INPUT_ARGS, *EP_ARGS, FORMAT_ARG, NODE_DATA_ARG),
    fields=("model", "requested", "actual", "fell_back", "source", "counts",
            "nodes_per_provider", "nodes",
            "subgraphs"),
    detail='nodes: [{"name", "op_type", "provider"}]; subgraphs: {provider: how many '
           'subgraphs onnxruntime gave it} (from a profile: runs of consecutive nodes)',
    example="eprun.py placement int8.onnx CUDAExecutionProvider,CPUExecutionProvider"))


# -- check -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CheckOptions(ReferenceProviderFlags, ToleranceFlags, PlotFlags):
    """``check``'s options; each field is the flag of its name (``seed_given``: a seed was
    given at all, which a golden file's inputs refuse if it did not draw them;
    ``check_error_stat`` and ``error_quantile``: ``[(output or "", value), ...]``;
    ``min_provider_share``: ``[(provider, fraction), ...]``)."""

    inputs: InputOptions | None = None
    seed: int = 0
    seed_given: bool = False
    warmup: int = 1
    retries: int = 2
    retry_pause: float = 2.0
    require_providers: bool = False
    save_outputs: str | None = None
    load_outputs: str | None = None
    swapped_ok: bool = False
    check_error_stat: list | None = None
    error_quantile: list | None = None
    top_k: int | None = None
    top_k_axis: int = -1
    min_top_k_agreement: float | None = None
    min_provider_share: list | None = None


def check(reference: str, candidate: str, options: CheckOptions | None = None, *,
          outputs_into: dict | None = None, reference_into: dict | None = None) -> dict:
    """The CI gate: does the candidate (model and providers) match the reference within
    tolerance on the same inputs? Fails on any broken bound, and on a fallback (a requested
    provider the candidate's session did not get) unless ``allow_fallback``;
    ``require_providers`` asks for exactly the requested list. ``outputs_into`` (for
    ``report``) receives the candidate's outputs by name, so they need not be computed again
    (``reference_into`` the reference's).
    ``save_outputs`` stores the reference's outputs and inputs; ``load_outputs`` takes them
    from such a file instead of running the reference (made on another machine).

    A Polygraphy inputs file of several iterations is run and gated iteration by iteration
    (unless ``--iteration`` picks one): each output's figures are then the worst over them
    and say which iteration was worst. ``check_error_stat`` judges an output by a statistic
    as Polygraphy does, ``top_k`` adds each output's top-K agreement, ``min_provider_share``
    fails a candidate whose EP took too few of its nodes."""
    options = options or CheckOptions()
    inputs, seed = options.inputs, options.seed
    profile, on, reference_on = _gate_setup(reference, candidate, options)
    providers = on.requested
    tolerance, per_output = tolerances(profile, options.rtol, options.atol, options.min_cos)
    iterations = _gate_iterations(inputs, options.load_outputs, options.save_outputs)
    golden, feeds, reference_names, reference_runs, reference_got = _reference_side(
        reference, seed, inputs, reference_on, options.load_outputs,
        seed_given=options.seed_given, iterations=iterations)
    _name_tolerances(tolerance, per_output, reference_names, reference)
    rules = GateRules.of(options, reference_names, reference)
    ran = _candidate_side(candidate, on, feeds, options, len(reference_names))
    if outputs_into is not None:
        outputs_into.update(zip(ran.names, ran.runs[0]))
    if reference_into is not None and golden is None:  # (a reference run here, not loaded)
        reference_into.update(zip(reference_names, reference_runs[0]))
    measured = [_measure_outputs(zip(reference_names, expected), zip(ran.names, actual),
                                 (reference, candidate), rules)
                for expected, actual in zip(reference_runs, ran.runs)]
    _require_top_k_fits(rules, measured[0], reference_runs[0])
    outputs, failures = (_judge_outputs(measured[0], tolerance, rules) if len(measured) == 1
                         else _judge_iterations(measured, tolerance, rules))
    failures.extend(_provider_failures(providers, ran.got, options.require_providers,
                                       options.allow_fallback))
    share = (_provider_share(ran.op_types, options.min_provider_share)
             if options.min_provider_share else None)
    failures.extend(share["failures"] if share else [])
    for name in fallback_of(providers, ran.got.actual, ran.got.nodes):
        if name not in ran.got.actual and (why := why_missing(name, on, candidate)):
            note(f"{name} is not in the candidate's session: {why}")
    plots = (_check_plots(options, candidate, outputs, reference_runs, ran, reference_names)
             if options.save_plots else None)
    if options.save_outputs:  # only once everything ran: a failed check leaves no file
        golden = _save_reference(options.save_outputs, reference,
                                 [dict(zip(reference_names, run)) for run in reference_runs],
                                 feeds, seed=seed, inputs=inputs,
                                 reference_got=reference_got)
    feed = feeds[0]
    answer = {"reference": reference, "candidate": candidate, "seed": seed,
              "rows": feed.rows}
    if not feed.contract_shaped:
        answer["inputs"] = feed.fed
    if len(feeds) > 1:
        answer["iterations"] = len(feeds)
    return {**answer, "profile": profile, "tolerance": tolerance,
            "providers": _gate_providers(providers, ran.got, reference_got, golden,
                                         options.ep_options),
            "warmup": options.warmup, "retries_used": ran.retries_used, "outputs": outputs,
            "failures": failures, "passed": not failures,
            **({"provider_share": share["share"]} if share else {}),
            **({"golden": golden} if golden else {}),
            **({"plots": plots} if plots is not None else {})}


def _gate_setup(reference: str, candidate: str, options: CheckOptions
                ) -> tuple[str, ProviderRequest, ProviderRequest]:
    """Before anything runs: the files there, the outputs and plots writable, the pair in
    order; ``(profile, candidate's request, reference's request)``, the profile chosen where
    it was left to ``auto``."""
    profile = options.profile
    require_file(reference)
    require_file(candidate)
    golden_paths(options.save_outputs, options.load_outputs, [reference, candidate], "outputs",
                 options.inputs)
    require_views(None, options.save_plots, options.plot_format)
    graphs = ([_graph_or_none(path) for path in (reference, candidate)]
              if not options.swapped_ok or profile in (None, "auto") else [None, None])
    if None not in graphs:  # a file that is no model gets onnxruntime's own words below
        require_in_order(graphs, (reference, candidate), options.swapped_ok,
                         ("reference", "candidate"))
    on, reference_on = _gate_requests(options)
    for provider, _ in options.min_provider_share or ():
        if provider not in on.requested:
            raise EprunError(f"--min-provider-share {provider}: the candidate does not ask for "
                             f"it (--providers {','.join(on.requested)}); name a provider of "
                             "--providers", EXIT_USAGE)
    if profile in (None, "auto"):
        profile = _auto_profile(graphs, candidate, told=profile == "auto")
    return profile, on, reference_on


def _gate_iterations(inputs: InputOptions | None, load_outputs: str | None,
                     save_outputs: str | None) -> list[int | None]:
    """The iterations ``check`` runs: every feed dict of a Polygraphy inputs file that holds
    several (``--iteration`` not given), else ``[None]``: one run as before. A Polygraphy
    results file to compare with must hold as many; a golden .npz holds one iteration."""
    file = inputs.file if inputs is not None else None
    if not file or not file.lower().endswith(".json") or inputs.iteration is not None:
        return [None]
    if load_outputs and not load_outputs.lower().endswith(".json"):
        return [None]  # the golden file's own inputs are fed
    require_file(file, "inputs")
    count = len(polygraphy_feed_dicts(file))
    if load_outputs:
        require_file(load_outputs, "golden")
        held = polygraphy_iterations(load_outputs)
        if held != count:
            raise EprunError(f"{file!r} holds {count} iterations and {load_outputs!r} "
                             f"{held}: they must be one run's (or pick one with --iteration N)",
                             EXIT_USAGE)
    return list(range(count)) if count > 1 else [None]


class CandidateRun(NamedTuple):
    """The candidate's side of a check: its output names, its outputs per iteration, what its
    session got (and the op types each provider took), and the retries it spent."""

    names: list[str]
    runs: list[list]
    got: Got
    op_types: dict | None
    retries_used: int


def _candidate_side(candidate: str, on: ProviderRequest, feeds: list[Feed],
                    options: CheckOptions, references: int) -> CandidateRun:
    """One session of the candidate, warmed up once, run on each iteration's feed."""
    attempts = _Attempts(options.retries, options.retry_pause, candidate)
    session = attempts.make(lambda: open_session(candidate, what=repr(candidate), on=on))
    specs = session_specs(session, candidate)
    runs = []
    for k, feed in enumerate(feeds):
        arrays = feed_for(specs, candidate, feed)

        def run_once(arrays: dict = arrays, feed: Feed = feed) -> list:
            """One run of the candidate, with the retries a transient error earns."""
            return attempts.make(lambda: run_session(session, None, arrays,
                                                     what=repr(candidate),
                                                     hint=dims_hint(feed)))

        for _ in range(options.warmup if k == 0 else 0):
            run_once()
        runs.append(run_once())
        if len(runs[-1]) < references:
            raise EprunError(f"{candidate!r} has {len(runs[-1])} outputs, the reference "
                             f"{references}; outputs are paired by position")
    return CandidateRun([value.name for value in session.get_outputs()], runs,
                        Got.of(session), assigned_op_types(session), attempts.used)


def _provider_share(op_types: dict | None, wanted: list) -> dict:
    """``--min-provider-share EP:FRACTION``: ``{"share": {EP: record}, "failures": [...]}``, the
    share of the candidate's nodes each EP took (node assignment) and the op types that went
    elsewhere; where onnxruntime does not say (before 1.24) the gate fails rather than
    guesses."""
    share, failures = {}, []
    for provider, least in wanted:
        if op_types is None:
            record = {"share": None, "min_share": least,
                      "unknown": f"onnxruntime {import_ort().__version__} does not say which "
                                 "provider each node ran on (1.24+ does)"}
            failures.append({"bound": "provider_share", "provider": provider, **record})
        else:
            total = sum(sum(kinds.values()) for kinds in op_types.values())
            taken = sum(op_types.get(provider, {}).values())
            elsewhere: dict = {}
            for owner, kinds in op_types.items():
                for op_type, count in kinds.items() if owner != provider else ():
                    elsewhere[op_type] = elsewhere.get(op_type, 0) + count
            record = {"share": taken / total if total else 0.0, "min_share": least,
                      "nodes": taken, "total": total,
                      "elsewhere": dict(sorted(elsewhere.items(), key=lambda item: -item[1]))}
            if record["share"] < least:
                failures.append({"bound": "provider_share", "provider": provider, **record})
        share[provider] = record
    return {"share": share, "failures": failures}


def _require_top_k_fits(rules: GateRules, entries: list[dict], outputs: list) -> None:
    """``--top-k`` along ``--top-k-axis``: an output that has no such axis, or fewer than K
    values along it, is said (its agreement is null, and no gate); where no output can take
    it, the flags are wrong: a usage error."""
    if rules.top_k is None:
        return
    cannot = [(entry["reference"], list(getattr(value, "shape", ())))
              for entry, value in zip(entries, outputs) if entry.get("top_k_agreement") is None]
    if cannot and len(cannot) == len(entries):
        raise EprunError(f"--top-k {rules.top_k} along axis {rules.top_k_axis}: no output "
                         f"has {rules.top_k} values there ("
                         + ", ".join(f"{name!r} has shape {shape}" for name, shape in cannot)
                         + ")", EXIT_USAGE)
    for name, shape in cannot:
        note(f"--top-k {rules.top_k} along axis {rules.top_k_axis}: output {name!r} (shape "
             f"{shape}) has fewer values there, or no such axis: no top_k_agreement")


def _judge_iterations(measured: list[list[dict]], tolerance: dict, rules: GateRules
                      ) -> tuple[list[dict], list[dict]]:
    """``(outputs, failures)`` over several iterations: each iteration judged alone, then per
    output the worst figures (the largest differences, violations and elements summed, the
    smallest cosine and agreement) with ``iterations`` and ``worst_iteration`` (the one with the
    most violations, then the largest difference), and its failures folded the same way."""
    judged = [_judge_outputs(entries, tolerance, rules, k) for k, entries in enumerate(measured)]
    outputs, failures = [], []
    for index, first in enumerate(judged[0][0]):
        entry = _worst_entry([outputs_k[index] for outputs_k, _ in judged])
        outputs.append(entry)
        for failure in _folded_failures(first["reference"],
                                        [failures_k for _, failures_k in judged]):
            if failure["bound"] == "tolerance":  # of every iteration, as the entry counts them
                failure["elements"] = entry["elements"]
            failures.append(failure)
    return outputs, failures


def _worst_entry(per: list[dict]) -> dict:
    """One output's entry over its iterations' entries ``per``: the worst figures of them,
    ``iterations`` and ``worst_iteration``."""
    worst = max(range(len(per)), key=lambda k: _badness(per[k], k))
    entry = dict(per[worst])
    if "max_abs_diff" in per[0]:
        for key in ("max_abs_diff", "mean_abs_diff", "median_abs_diff", "p99_abs_diff",
                    "max_rel_diff"):
            entry[key] = max((one[key] for one in per), key=_finite_or_inf)
        entry["cosine"] = min((one["cosine"] for one in per), key=_nan_first)
        entry["elements"] = sum(one["elements"] for one in per)
        entry["violations"] = sum(one["violations"] for one in per)
        entry["worst"] = ({**per[worst]["worst"], "iteration": worst} if per[worst]["worst"]
                          else None)
        lost = [one["nonfinite"] for one in per if "nonfinite" in one]
        if lost:
            entry["nonfinite"] = {side: sum(one[side] for one in lost)
                                  for side in ("reference", "candidate")}
        if "top_k_agreement" in per[0]:
            agreements = [one["top_k_agreement"] for one in per]
            entry["top_k_agreement"] = None if None in agreements else min(agreements)
    entry.update(iterations=len(per), worst_iteration=worst)
    return entry


def _badness(entry: dict, k: int) -> tuple:
    """How bad iteration ``k``'s entry of an output is, to pick the worst: by its statistic
    (failing first, then the largest) where it is judged by one, else by its violations, then
    by its largest difference; the earliest on ties."""
    statistic = entry.get("error_stat")
    if statistic is not None:
        return (statistic_fails(statistic, statistic["atol"], statistic["rtol"]),
                _finite_or_inf(statistic["abs"]), -k)
    return (entry.get("violations") or 0, _finite_or_inf(entry.get("max_abs_diff")), -k)


def _finite_or_inf(value) -> float:
    """A number to rank by, NaN (a difference NaN made) counting as the largest."""
    return math.inf if value is None or math.isnan(value) else value


def _nan_first(value) -> float:
    """A number to take the smallest of, NaN (no cosine) counting as the smallest."""
    return -math.inf if value is None or math.isnan(value) else value


def _folded_failures(output: str, per_iteration: list[list[dict]]) -> list[dict]:
    """An output's failures over the iterations, one per bound: the worst iteration's (the
    most violations, the largest statistic, the smallest cosine or agreement), tolerance
    failures with their violations and elements summed; ``iterations_failed`` lists where."""
    folded: dict[str, dict] = {}
    where: dict[str, list[int]] = {}
    for k, failures in enumerate(per_iteration):
        for failure in failures:
            if failure.get("output") != output:
                continue
            bound = failure["bound"]
            where.setdefault(bound, []).append(k)
            kept = folded.get(bound)
            if kept is None or _worse_failure(failure, kept):
                summed = ({"violations": failure["violations"] + kept["violations"],
                           "elements": failure["elements"] + kept["elements"]}
                          if kept is not None and bound == "tolerance" else {})
                folded[bound] = {**failure, **summed}
            elif bound == "tolerance":
                kept["violations"] += failure["violations"]
                kept["elements"] += failure["elements"]
    return [{**failure, "iterations_failed": where[bound]}
            for bound, failure in folded.items()]


def _worse_failure(failure: dict, kept: dict) -> bool:
    """Is ``failure`` the worse of two failures of one bound (in two iterations)?"""
    bound = failure["bound"]
    if bound == "tolerance":
        return failure["violations"] > kept["violations"]
    if bound == "error_stat":
        return _finite_or_inf(failure["abs"]) > _finite_or_inf(kept["abs"])
    if bound == "min_cos":
        return _nan_first(failure["cosine"]) < _nan_first(kept["cosine"])
    if bound == "top_k":
        return _nan_first(failure["top_k_agreement"]) < _nan_first(kept["top_k_agreement"])
    return False


def _check_plots(options: CheckOptions, candidate: str, outputs: list[dict],
                 reference_runs: list[list], ran: CandidateRun,
                 reference_names: list[str]) -> list[str]:
    """``--save-plots``: each output's pictures, of its worst iteration."""
    writer = PlotWriter(options.save_plots, candidate, "check", options.plot_format)
    compared = [(name, reference_runs[entry.get("worst_iteration", 0)][index],
                 ran.runs[entry.get("worst_iteration", 0)][index])
                for index, (name, entry) in enumerate(zip(reference_names, outputs))
                if "max_abs_diff" in entry]
    plot_check(writer, compared)
    return writer.write((candidate,))


def _gate_requests(flags: ReferenceProviderFlags) -> tuple[ProviderRequest, ProviderRequest]:
    """``check``'s two provider requests (the CPU where none is given), once every name is
    known. A provider that fails to start is an error (exit 4, its message), not a quiet CPU
    run; the candidate's fallback is a verdict (exit 1), the reference's a refusal (exit 4)."""
    providers = [CPU_EP] if flags.providers is None else flags.providers
    reference_providers = ([CPU_EP] if flags.reference_providers is None
                           else flags.reference_providers)
    ep_options = flags.ep_options
    prepare_providers([providers, reference_providers], flags.ep_library, ep_options)
    require_known_providers(providers)
    require_known_providers(reference_providers)
    on = ProviderRequest(providers, options=ep_options or {}, strict=not flags.allow_fallback)
    reference_on = ProviderRequest(reference_providers, options=ep_options or {}, strict=True,
                                   allow_fallback=flags.allow_fallback)
    return on, reference_on


def _name_tolerances(tolerance: dict, per_output: dict, reference_names: list[str],
                     reference: str) -> None:
    """Each ``--rtol``/``--atol`` NAME:VALUE on its output (``tolerance["per_output"]``, the
    rest from the profile or the options); a name that is no output is a usage error."""
    unknown = sorted(set(per_output) - set(reference_names))
    if unknown:
        raise EprunError(f"--rtol/--atol name {', '.join(map(repr, unknown))}, which is no "
                         f"output of {reference!r} (its outputs: {', '.join(reference_names)})",
                         EXIT_USAGE)
    if per_output:
        tolerance["per_output"] = {name: {key: per_output[name].get(key, tolerance[key])
                                          for key in ("rtol", "atol")}
                                   for name in reference_names if name in per_output}


class _Attempts:
    """``check``'s retries of transient provider errors: at most ``retries`` for the whole
    check, ``pause`` seconds apart; ``used`` counts those spent."""

    def __init__(self, retries: int, pause: float, path: str) -> None:
        """None spent yet; ``path``, the model's, is masked in an error before it is judged."""
        self.retries, self.pause, self.path = retries, pause, path
        self.spent = [0]

    @property
    def used(self) -> int:
        """How many retries were spent."""
        return self.spent[0]

    def make(self, action: Callable[[], Any]) -> Any:
        """``action``'s result, after as many retries as it needs and the budget allows."""
        return _with_retries(action, self.retries, self.pause, self.spent, self.path)


def _provider_failures(providers: list[str], got: Got, require_providers: bool,
                       allow_fallback: bool) -> list[dict]:
    """The gate's ``providers`` failure, if any: a fallback not allowed, or (with
    ``--require-providers``) any list but the one requested."""
    missing = fallback_of(providers, got.actual, got.nodes)
    if (require_providers and got.actual != providers) or (missing and not allow_fallback):
        return [{"bound": "providers", "requested": providers, "actual": got.actual,
                 "missing": missing}]
    return []


def _save_reference(path: str, reference: str, outputs: list[dict], feeds: list[Feed], *,
                    seed: int, inputs: InputOptions | None, reference_got: Got) -> dict:
    """``--save-outputs``: Polygraphy's RunResults for a ``.json`` path (an iteration per
    iteration run), eprun's golden file otherwise (one iteration); its record for the
    answer."""
    feed = feeds[0]
    if path.lower().endswith(".json"):
        several = len(outputs) > 1
        return save_polygraphy(path, reference, outputs if several else outputs[0],
                               [one.arrays for one in feeds] if several else feed.arrays,
                               inputs)
    return save_golden(path, "outputs", reference, outputs, [one.arrays for one in feeds],
                       got=reference_got, seed=drawn_with(feed, seed),
                       inputs_file=inputs.file if inputs is not None else None)


def _gate_providers(providers: list[str], got: Got, reference_got: Got, golden: dict | None,
                    ep_options: dict | None) -> dict:
    """The gate's ``providers`` field: what was asked for, what each side got."""
    polygraphy = "loaded" in (golden or {}) and golden.get("format") == "polygraphy"
    return {"requested": providers, "actual": got.actual,
            "fell_back": differs_from_request(providers, got.actual),
            "reference": reference_got.actual, **nodes_record(got.nodes),
            **nodes_record(reference_got.nodes, "reference_", (
                "the reference ran in Polygraphy, whose results file does not say where"
                if polygraphy else None)),
            **({"options": ep_options} if ep_options else {})}


def _auto_profile(graphs: list, candidate: str, told: bool = True) -> str:
    """``--profile auto`` (the default): the int8 tolerances for a quantized candidate of a
    float reference (``graphs``: theirs, None where unreadable), the int4 ones where it
    quantizes only weights, some to 4 bits or fewer (``_weight_only_4bit``), the fp16 ones
    otherwise. Said on stderr where it was asked for, and where the default chose a quantized
    profile (no profile given used to mean fp16, which fails every int8 pair)."""
    quantized = None not in graphs and bool(_quantization_ops(graphs[1])) and not \
        _quantization_ops(graphs[0])
    profile = ("fp16" if not quantized else "int4" if _weight_only_4bit(graphs[1])
               else "int8")
    why = {"int8": "quantizes and the reference does not",
           "int4": "quantizes weights only, to 4 bits or fewer, and the reference does not",
           "fp16": "is not a quantized twin of the reference"}[profile]
    if told:
        note(f"--profile auto: {profile}, as {candidate!r} {why}")
    elif quantized:
        note(f"profile {profile} (no --profile given: auto), as {candidate!r} {why}; "
             "--profile fp16 holds it to the float16 tolerances")
    return profile


def _graph_or_none(path: str):
    """The graph of ``path`` (weights left on disk), or None where it is not one eprun reads."""
    try:
        return load_model(path)
    except EprunError:
        return None


def _reference_side(reference: str, seed: int, inputs: InputOptions | None,
                    on: ProviderRequest, load_outputs: str | None, *, seed_given: bool = True,
                    iterations: list[int | None] = (None,)) -> tuple:
    """``(golden, feeds, output names, outputs per iteration, providers)`` of the reference:
    run here on ``on``, or read from the ``--load-outputs`` file made elsewhere (``golden`` its
    record, else None), whose inputs then feed the candidate. ``iterations``: the feed dicts of
    a Polygraphy inputs file to run (``[None]``: the one ``inputs`` names); a golden .npz
    brings its own."""
    if load_outputs and load_outputs.lower().endswith(".json"):  # Polygraphy's RunResults
        return _polygraphy_reference(reference, seed, inputs, load_outputs, iterations)
    if load_outputs:  # the reference ran elsewhere: its graph says what the file must hold
        return _golden_reference(reference, seed if seed_given else None, inputs,
                                 load_outputs)
    session = open_session(reference, what=repr(reference), on=on)
    specs = session_specs(session, reference)
    feeds = [make_feeds(specs, seed, _iteration_inputs(inputs, k), reference)
             for k in iterations]
    runs = [run_session(session, None, feed.arrays, what=repr(reference), hint=dims_hint(feed))
            for feed in feeds]
    names = [value.name for value in session.get_outputs()]
    # its outputs are all the rest needs: the session goes before the candidate's opens
    return None, feeds, names, runs, Got.of(session)


def _iteration_inputs(inputs: InputOptions | None, k: int | None) -> InputOptions | None:
    """The input options of iteration ``k`` (None: as given)."""
    return inputs if k is None else dataclasses.replace(inputs, iteration=k)


def _polygraphy_reference(reference: str, seed: int, inputs: InputOptions | None,
                          load_outputs: str, iterations: list[int | None]) -> tuple:
    """``_reference_side`` from a ``polygraphy run --save-outputs`` file: its iterations, fed
    with the inputs file's."""
    graph = load_model(reference)
    names = [value.name for value in graph.graph.output]
    require_file(load_outputs, "golden")
    if inputs is None or not inputs.file:
        raise EprunError(f"{load_outputs!r} is Polygraphy's, whose outputs carry no inputs: "
                         "give the inputs they were computed on with --inputs (the file "
                         "polygraphy run --save-inputs wrote)", EXIT_USAGE)
    feeds, runs = [], []
    for k in iterations:
        runner, stored = read_polygraphy_outputs(load_outputs, names,
                                                 inputs.iteration or 0 if k is None else k)
        feeds.append(make_feeds(specs_from_model(graph), seed, _iteration_inputs(inputs, k),
                                reference))
        runs.append([stored[name] for name in names])
    golden = {"loaded": load_outputs, "format": "polygraphy", "runner": runner,
              **({"iteration": inputs.iteration or 0} if iterations == [None] else
                 {"iterations": len(iterations)})}
    return golden, feeds, names, runs, Got([])


def _golden_reference(reference: str, seed: int | None, inputs: InputOptions | None,
                      load_outputs: str) -> tuple:
    """``_reference_side`` from a golden .npz: every iteration it holds, fed with its own
    inputs."""
    graph = load_model(reference)
    names = [value.name for value in graph.graph.output]
    feeds, runs, k, golden = [], [], 0, {}
    while k == 0 or k < golden.get("iterations", 1):
        golden, stored_inputs, stored = load_golden(
            load_outputs, "outputs", names, reference, seed, graph=graph,
            given_inputs=_given_inputs(inputs, graph, reference), iteration=k)
        feeds.append(make_feeds(specs_from_model(graph), seed or 0, dataclasses.replace(
            inputs or InputOptions(), arrays=stored_inputs), reference))
        runs.append([stored[name] for name in names])
        k += 1
    return (golden, feeds, names, runs,
            Got(golden["providers"], golden.get("nodes_per_provider")))


def save_polygraphy(path: str, reference: str, outputs: dict | list[dict],
                    feed: dict | list[dict], inputs: InputOptions | None) -> dict:
    """``check --save-outputs FILE.json``: the reference's outputs as Polygraphy's RunResults
    (``polygraphy run MODEL --onnxrt --load-inputs ... --load-outputs FILE.json`` compares its
    run with them), and the very inputs they were computed on beside it as FILE's stem +
    ``.inputs.json`` (for ``--load-inputs``; an ``--inputs`` file may hold other iterations
    first): both written, or neither."""
    given = inputs.file if inputs is not None else None
    sources = (reference, *([given] if given else []))
    staged = [stage(polygraphy_run_results(f"eprun-{os.path.basename(reference)}", outputs),
                    path, sources)]
    inputs_path = polygraphy_inputs_path(path)
    try:
        staged.append(stage(polygraphy_feeds(feed), inputs_path, sources))
    except BaseException:
        discard(staged)
        raise
    commit(staged)
    return {"saved": path, "format": "polygraphy", "inputs": inputs_path}


declare(Command(
    name="check",
    summary="CI gate: candidate model and providers against a reference within "
            "rtol/atol/cosine on the same inputs; exit 0 pass, 1 fail",
    function=check,
    positionals=("reference", "candidate"),
    options=CheckOptions,
    arguments=(
        arg("reference", help="reference model (usually the FP32 one), run on "
                              "--reference-providers"),
        arg("candidate", help="candidate model, run on --providers"),
        *measure_ep_args(), *TOLERANCE_ARGS,
        *INPUT_ARGS,
        SEED_POSITIONAL,
        SEED_FLAG,
        arg("--warmup", type=parse_count, default=1,
            help="candidate runs before the measured one (default 1)"),
        arg("--retries", type=parse_count, default=2,
            help="extra tries after a transient provider error such as a timeout, never after "
                 "a numeric failure (default 2)"),
        arg("--retry-pause", type=parse_tolerance, default=2.0,
            help="seconds between tries (default 2)"),
        arg("--require-providers", action="store_true",
            help="fail unless the candidate's session got exactly --providers"),
        arg("--save-outputs", metavar="FILE.npz",
            help="also store the reference's outputs and the inputs, for --load-outputs on "
                 "another machine; FILE.json writes Polygraphy's RunResults instead (and the "
                 "inputs as FILE.inputs.json) for polygraphy run --load-outputs"),
        arg("--load-outputs", type=parse_file, metavar="FILE.npz",
            help="compare with the reference outputs stored by --save-outputs (on their "
                 "inputs) instead of running the reference; refused if the reference model's "
                 "outputs are not the stored ones; FILE.json: what polygraphy run "
                 "--save-outputs wrote, fed with --inputs"),
        arg("--check-error-stat", type=parse_error_stat, action="append",
            metavar="[NAME:]STAT",
            help="how an output is judged, as Polygraphy's --check-error-stat: elemwise (the "
                 "default) per element, |c - r| <= atol + rtol*|r|; max, mean, median or "
                 "quantile: the output fails only when that statistic of |c - r| is over atol "
                 "and the one of |c - r|/|r| is over rtol (the profile's cosine then applies "
                 "only when --min-cos is given); NaN or Inf in the candidate fails it all the "
                 "same; NAME:STAT for one output; repeatable"),
        arg("--error-quantile", type=parse_output_fraction, action="append",
            metavar="[NAME:]Q",
            help="the quantile --check-error-stat quantile takes (default 0.99); NAME:Q for one "
                 "output; repeatable"),
        arg("--top-k", type=parse_top_k, metavar="K",
            help="add each output's top_k_agreement: the fraction of rows (every position but "
                 "the --top-k-axis) whose K largest values sit at the same indices, as a set"),
        arg("--top-k-axis", type=parse_axis, default=-1, metavar="AXIS",
            help="the axis --top-k ranks along (default -1, the last)"),
        arg("--min-top-k-agreement", type=parse_fraction, metavar="F",
            help="fail an output whose top_k_agreement is below F (--top-k 1 unless given)"),
        arg("--min-provider-share", type=parse_provider_share, action="append",
            metavar="EP:FRACTION",
            help="fail when the provider EP took fewer than FRACTION of the candidate's nodes "
                 "(onnxruntime's node assignment, 1.24+; before it, the gate fails rather than "
                 "guesses); the answer adds \"provider_share\" with the op types that went "
                 "elsewhere; repeatable"),
        SWAPPED_OK_ARG, FORMAT_ARG, *PLOT_ARGS),
    fields=("reference", "candidate", "seed", "rows", "profile", "tolerance", "providers",
            "warmup", "retries_used", "outputs", "failures", "passed"),
    detail='providers: {"requested", "actual", "fell_back", "reference"}; outputs: '
           '[{"reference", "candidate", "shape", "max_abs_diff", "mean_abs_diff", '
           '"median_abs_diff", "p99_abs_diff", "max_rel_diff", "cosine", "elements", '
           '"violations", "worst"}] ("nonfinite" when NaN/Inf; "error_stat" with '
           '--check-error-stat, "top_k_agreement" with --top-k, "iterations" and '
           '"worst_iteration" over several iterations); "inputs" as in layers; '
           '"iterations" where a Polygraphy inputs file held several; --save-outputs and '
           '--load-outputs add "golden", --min-provider-share "provider_share", --save-plots '
           '"plots"',
    example="eprun.py check fp32.onnx int8.onnx --profile int8 "
            "--providers CUDAExecutionProvider,CPUExecutionProvider",
    verdict=check_verdict))


# -- reduce ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReduceOptions(ReferenceProviderFlags, ToleranceFlags):
    """``reduce``'s options, but ``--output``; each field is the flag of its name (``check``:
    the ``--check`` command line, ``{model}`` and ``{inputs}`` in it)."""

    check: str | None = None
    check_timeout: float | None = None
    timeout_fails: bool = False
    inputs: InputOptions | None = None
    seed: int = 0
    mode: str = "bisect"
    force: bool = False


def reduce(model: str, output: str, options: ReduceOptions | None = None) -> dict:
    """The smallest set of ``model``'s nodes that still fails, written as ``output`` with its
    inputs beside it (``<output stem>.inputs.npz``). Fails: the ``check`` command exits
    non-zero (or dies by a signal) on the candidate, or, without ``check``, the candidate's
    outputs on ``providers`` differ from the reference's beyond the tolerance."""
    options = options or ReduceOptions()
    check, inputs = options.check, options.inputs
    require_file(model)
    bounds = (options.profile, options.rtol, options.atol, options.min_cos)
    argv = _check_words(check, options.providers, options.check_timeout,
                        options.timeout_fails, bounds)
    tolerance = _one_tolerance(*bounds)
    paths = ReducedPaths.of(output)
    graph_model = load_model(model, text_names=True)
    sources = (model, *external_data_files(graph_model, model),
               *([inputs.file] if inputs is not None and inputs.file else []))
    for path in paths:
        require_output_path(path, list(sources))
    replacing = _replaceable(paths, options.force)  # an earlier reduce's files
    targets = targets_from(options, options.reference_providers or [CPU_EP])
    graph = ReduceGraph(graph_model, model)
    if not graph.nodes:
        raise EprunError(f"{model!r} has no node to reduce")
    feed = make_feeds(specs_from_model(graph_model), options.seed or 0, inputs, model)
    inferred = inferred_graph(graph_model)
    types = {**_value_types(inferred), **tensor_types(graph_model, inferred)}
    with scratch_folder("eprun-reduce-") as folder:
        values = ReferenceValues(folder, feed.arrays)
        exposed = type(graph_model)()  # a copy to expose (the weights stay in their files)
        exposed.CopyFrom(graph_model)
        reference_got = values.compute(exposed, model, graph.computed(), targets.reference,
                                       types)
        reduction = Reduction(model, graph, values, types, folder, FailureTest(
            check=argv, timeout=options.check_timeout, timeout_fails=options.timeout_fails,
            on=targets.candidate, reference_on=targets.reference, tolerance=tolerance))
        everything = tuple(range(len(graph.nodes)))
        if not reduction.fails(everything, show=False):
            raise EprunError(f"{model!r} does not fail ({_why_it_passes(reduction, check)})"
                             ": there is nothing to reduce; nothing written", 1)
        reduction.strict = False
        kept, minimal = reduce_nodes(reduction, options.mode)
        external = _write_reduced(reduction, kept, paths, sources, replacing)
    reduction.say_what_passed(options.providers)
    _note_invalid(output)
    nodes = graph.nodes
    model_inputs, model_outputs = graph.interface(kept)
    answer = {"model": model, "output": output, "inputs_file": paths.inputs,
              "original_nodes": len(nodes), "nodes": len(kept),
              "kept": [{"name": nodes[i].name, "op_type": nodes[i].op_type,
                        "outputs": list(nodes[i].output)} for i in kept],
              "inputs": model_inputs, "outputs": model_outputs, "tries": reduction.tries,
              "minimal": minimal, "failure": reduction.failure(kept)}
    if external:
        answer["external_data"] = paths.data
    if argv is None:
        answer["tolerance"] = tolerance
        answer["providers"] = {"requested": targets.candidate.requested,
                               "reference": reference_got.actual}
    return answer


declare(Command(
    name="reduce",
    summary="the smallest part of a model that still fails (a --check command, or numbers "
            "on --providers against the reference), saved with its inputs",
    function=reduce,
    positionals=("model", "output"),
    options=ReduceOptions,
    arguments=(
        MODEL,
        arg("-o", "--output", required=True, metavar="OUT.onnx",
            help="where the reduced model goes; its inputs go beside it as OUT's stem + "
                 ".inputs.npz"),
        arg("--check", metavar="COMMAND",
            help="a command line (split as a shell splits it, run without a shell) in which "
                 "{model} is the candidate's path and {inputs} the path of an .npz of its "
                 "inputs; the candidate still fails when it exits non-zero or dies by a signal"),
        arg("--check-timeout", type=parse_tolerance, metavar="SECONDS",
            help="stop a --check that runs longer; it then passes (or fails: --timeout-fails)"),
        arg("--timeout-fails", action="store_true",
            help="a --check stopped by --check-timeout counts as failing"),
        *measure_ep_args(), *TOLERANCE_ARGS,
        arg("--search", dest="mode", choices=("bisect", "linear"), default="bisect",
            help="bisect from both ends, then remove single end nodes (default); linear: "
                 "single end nodes only"),
        hidden_alias("--mode", "mode", choices=("bisect", "linear")),
        *INPUT_ARGS,
        SEED_FLAG,
        FORCE_ARG,
        FORMAT_ARG),
    fields=("model", "output", "inputs_file", "original_nodes", "nodes", "kept", "inputs",
            "outputs", "tries", "minimal", "failure"),
    detail='kept: [{"name", "op_type", "outputs"}] in file order; failure: for --check '
           '{"exit"} or {"signal"} or {"timeout"} (with the check\'s last stderr line as '
           '"stderr"), else {"output", "max_abs_diff", "max_rel_diff", "violations", '
           '"elements", "bounds"} of the worst output (or {"error"}); without --check '
           '"tolerance" and "providers" too; "external_data" when weights went to a file',
    example="eprun.py reduce model.onnx --output small.onnx --providers "
            "OpenVINOExecutionProvider --rtol 1e-5 --atol 1e-9"))


# -- sensitivity -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SensitivityOptions(ReferenceProviderFlags, PlotFlags, DaskFlags):
    """``sensitivity``'s options; each field is the flag of its name (``extra_options``:
    ``--extra-option``'s, ``{key: value}``)."""

    inputs: InputOptions | None = None
    target_sqnr: float | None = None
    target_rel_error: float | None = None
    profile: str | None = None
    max_units: int | None = None
    units: list[str] | None = None
    swapped_ok: bool = False
    jobs: int | None = None
    restore_to: str = "float"
    calibration: str | None = None
    extra_options: dict | None = None
    node_data: str | None = None


def sensitivity(fp32: str, int8: str, seed: int,
                options: SensitivityOptions | None = None) -> dict:
    """Which quantized units to keep in float: each restored alone (the graph quantize_static
    writes with it excluded, ``SensitivityStudy``) and measured on the final float output
    against the fp32 model, ranked by the SQNR it gains, then a verified recommendation: the
    best-ranked units added one at a time, the combined graph requantized and re-measured each
    time, until the target is met. With ``providers``
    every int8 variant runs there, so the ranking is the one of the EP deployed to.
    ``calibration``: a file of the data the int8 model was calibrated on; ``extra_options``:
    quantize_static extra options the int8 model was made with, over those eprun reads off it.
    ``int8`` may also be a weight-only twin made by MatMulNBitsQuantizer (4-, 8- or 2-bit
    MatMulNBits, or its QDQ form's blockwise DequantizeLinear): each MatMul is a unit, named
    by the float node it replaced, restored by graph edits to what that quantizer writes with
    it in ``nodes_to_exclude``; the answer's ``quantizer`` gives the arguments read off the
    twin, and the recommendation's list is for that quantizer."""
    options = options or SensitivityOptions()
    inputs, node_data = options.inputs, options.node_data
    if options.restore_to not in ("float", "int8"):
        raise EprunError(f"restore_to {options.restore_to!r}: float or int8", EXIT_USAGE)
    require_file(fp32)
    require_file(int8)
    require_views(node_data, options.save_plots, options.plot_format)
    targets = targets_from(options, options.reference_providers)
    if options.jobs is not None and options.jobs < 1:
        raise EprunError("--jobs must be at least 1", EXIT_USAGE)
    cluster = options.dask()
    if cluster is not None and options.jobs is not None:
        raise EprunError("--jobs counts processes on this machine; with a Dask cluster its "
                         "workers run the units: give one or the other", EXIT_USAGE)
    if cluster is not None:  # before anything is measured: the extra there, the scheduler up
        _require_reachable(_import_distributed(cluster), dask_address(cluster))
    parallel = Parallel(jobs=options.jobs, dask=cluster, spec={
        "fp32": fp32, "int8": int8, "seed": seed, "inputs": inputs,
        "calibration": options.calibration, "extra_options": options.extra_options,
        "restore_to": options.restore_to,
        "targets": (ProviderFlags(providers=options.providers,
                                  allow_fallback=options.allow_fallback,
                                  ep_library=list(options.ep_library),
                                  ep_options=options.ep_options),
                    options.reference_providers)})
    ranking = Ranking.of(options.target_sqnr, options.target_rel_error, options.profile,
                         options.max_units, options.units)
    with SensitivityStudy(fp32, int8, seed, inputs, targets=targets, options=StudyOptions(
            swapped_ok=options.swapped_ok, restore_to=options.restore_to,
            calibration=options.calibration,
            extra_options=options.extra_options)) as study:
        answer = _rank_units(study, seed, targets, ranking, parallel)
        if node_data:  # each unit's gain on its node in both models
            gains = {entry["name"]: entry["gain_db"] for entry in answer["units"]}
            answer.update(_pair_node_data(node_data, fp32, int8, {"gain_db": {
                role: {("node", getattr(unit, f"{role}_index")): gains[unit.name]
                       for unit in study.units if unit.name in gains}
                for role in ("fp32", "int8")}}))
    if options.save_plots:
        writer = PlotWriter(options.save_plots, int8, "sensitivity", options.plot_format)
        plot_sensitivity(writer, answer)
        answer["plots"] = writer.write((fp32, int8))
    return answer


EXTRA_OPTION_ARG = arg(
    "--extra-option", type=parse_extra_option, action="append", default=[], dest="extra_option",
    metavar="KEY=VALUE",
    help="a quantize_static extra option the int8 model was made with and does not show (e.g. "
         "ForceQuantizeNoInputCheck=true); repeatable")
CALIBRATION_ARG = arg(
    "--calibration", type=parse_file, metavar="FILE.npz",
    help="the data the int8 model was calibrated on (numpy.savez, one array per input of the "
         "fp32 model, rows along the batch): quantize_static calibrates on it, so a range it "
         "would calibrate anew is exact")


declare(Command(
    name="sensitivity",
    summary="which quantized units to keep in float: each restored alone and measured on the "
            "final output, ranked, and a verified nodes_to_exclude list",
    function=sensitivity,
    positionals=("fp32", "int8", "seed"),
    options=SensitivityOptions,
    arguments=(
        *FP32_INT8, SEED, SEED_OPTION, *INPUT_ARGS,
        arg("--target-sqnr", type=parse_tolerance, metavar="DB",
            help="stop adding units once the final output's SQNR reaches DB"),
        arg("--target-rel-error", type=parse_tolerance, metavar="X",
            help="stop once the final output's rel_error is at most X"),
        arg("--target-profile", dest="profile", choices=sorted(TOLERANCE_PROFILES),
            help="stop once the final output passes check's profile (default int8; int4 "
                 "for a weight-only twin of 4 bits or fewer, as check's auto profile)"),
        hidden_alias("--profile", "profile", choices=sorted(TOLERANCE_PROFILES)),
        arg("--max-units", type=parse_count, metavar="N",
            help="recommend at most N units"),
        arg("--units", type=parse_list, metavar="NAME,...",
            help="restore only these units (float node names) one at a time"),
        arg("--restore-to", choices=("float", "int8"), default="float",
            help="what a weight-only twin's restored MatMul becomes: float (default), or an "
                 "8-bit MatMulNBits of its float weight, as MatMulNBitsQuantizer(bits=8, "
                 "nodes_to_include=...) writes it on the 4-bit twin (the mixed precision LLM "
                 "builds keep)"),
        arg("--jobs", type=parse_count, metavar="N",
            help="measure the units in N processes (default: one per core, once the units "
                 "would take more than a few seconds one after another)"),
        *flags_of(DaskFlags),
        CALIBRATION_ARG, EXTRA_OPTION_ARG, *measure_ep_args(), SWAPPED_OK_ARG, FORMAT_ARG,
        NODE_DATA_ARG, *PLOT_ARGS),
    fields=("seed", "rows", "output", "quantized", "units", "target", "recommendation",
            "predicted_by", "quantizer", "sessions"),
    detail='units: [{"name", "op_type", "named", "rel_error", "cos_min", "sqnr_db", '
           '"gain_db"}] ranked by gain, "inexact" (why) where the quantizer would calibrate '
           'from data eprun does not have; recommendation: {"nodes_to_exclude", "steps", '
           '"met"}, a step "inexact" likewise; '
           'predicted_by: "quantize_static" or "graph edits"; quantizer: the quantize_static '
           'settings that write the int8 model again (null for graph edits), or for a '
           'weight-only twin (MatMulNBits, blockwise DequantizeLinear: always graph edits) the '
           'MatMulNBitsQuantizer arguments its graph shows, {"class": "MatMulNBitsQuantizer", '
           '"algorithm", "bits", "block_size", "is_symmetric", "accuracy_level", '
           '"nodes_to_exclude", "quant_format", "op_types_to_quantize"}, which the '
           'recommendation\'s nodes_to_exclude is for; --restore-to int8 adds "restore_to", '
           'the quantizer\'s "then" (a second call at 8 bits) and the recommendation\'s '
           '"nodes_to_include" for it; "providers" as in layers',
    example="eprun.py sensitivity fp32.onnx int8.onnx 2026 --target-sqnr 30"))


# -- weights ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WeightsOptions:
    """``weights``' options; each field is the flag of its name."""

    swapped_ok: bool = False
    node_data: str | None = None


def weights(fp32: str, int8: str, options: WeightsOptions | None = None) -> dict:
    """Each quantized weight of ``int8`` (biases too) against the fp32 weight it quantizes,
    named by its float name as qdq_loss_debug names it (the integer initializer's name less
    ``_quantized`` and the other suffixes quantizers add); each weight a weight-only op reads
    in blocks (``blockwise_weights``) against the weight of the float node it stands for."""
    options = options or WeightsOptions()
    swapped_ok, node_data = options.swapped_ok, options.node_data
    require_file(fp32)
    require_file(int8)
    require_views(node_data, None)
    fp32_model, int8_model = load_model(fp32, text_names=True), load_model(int8, text_names=True)
    require_in_order((fp32_model, int8_model), (fp32, int8), swapped_ok)
    found = quantized_weights(int8_model.graph)
    blocked = blockwise_weights(int8_model.graph)
    if not found and not blocked:
        raise EprunError(f"{int8!r} has no quantized weight (no DequantizeLinear, QLinear or "
                         "weight-only op reading an integer initializer)"
                         + ("; are the models swapped?" if quantized_weights(fp32_model.graph)
                            or blockwise_weights(fp32_model.graph) else ""))
    pairing = _WeightPairing(fp32, int8, fp32_model, int8_model)
    entries = [entry for entry in map(pairing.entry, found) if entry is not None]
    if blocked:
        entries = _in_reading_order(int8_model.graph, entries + [
            entry for entry in map(pairing.blockwise_entry, blocked) if entry is not None])
    if not entries and not pairing.unread and not pairing.unsupported:
        raise EprunError(f"no quantized weight of {int8!r} pairs with a weight of {fp32!r} (by "
                         "name and shape, or through the node that reads it): is it that "
                         "model's quantized twin?")
    pairing.note_left_out(entries)
    worst = min(entries, key=lambda entry: entry["sqnr_db"], default=None)
    answer = {"fp32": fp32, "int8": int8, "weight_count": len(entries), "weights": entries,
              "worst": None if worst is None else {"name": worst["name"],
                                                   "sqnr_db": worst["sqnr_db"]}}
    if node_data:  # each weight's SQNR on the nodes that read it, in both models
        answer.update(_pair_node_data(node_data, fp32, int8, {"weight_sqnr_db": {
            role: {("node", index): entry["sqnr_db"] for entry in entries
                   for index, node in enumerate(model.graph.node)
                   if entry[key] in node.input}
            for role, model, key in (("fp32", fp32_model, "name"),
                                     ("int8", int8_model, "quantized"))}},
            graphs={"fp32": fp32_model.graph, "int8": int8_model.graph}))
    return answer


def _in_reading_order(graph, entries: list[dict]) -> list[dict]:
    """``entries`` (both kinds) in the int8 file's order: that of the first node that reads
    each one's quantized initializer."""
    first: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            first.setdefault(name, position)
    return sorted(entries, key=lambda entry: first.get(entry["quantized"], len(first)))


class _WeightPairing:
    """``weights``' pairing of each quantized weight with the float one it quantizes, and
    the weights it had to leave out (``unpaired``, ``unread``), said on stderr."""

    def __init__(self, fp32: str, int8: str, fp32_model, int8_model) -> None:
        """Index both models' initializers by name; nothing left out yet."""
        self.fp32, self.int8 = fp32, int8
        self.floats = {tensor.name: tensor for tensor in fp32_model.graph.initializer}
        self.int8_tensors = {tensor.name: tensor for tensor in int8_model.graph.initializer}
        self.unpaired: list[str] = []  # no float weight of the same name and shape
        self.unread: list[str] = []  # neither one scale per tensor nor one per channel
        self.readers = FloatWeightReaders(fp32_model.graph)
        # each float node's name as sensitivity names its unit (<op>#<k> where it has none)
        self.node_names = [node.name for node in _named_nodes(fp32_model.graph)]
        self.tensors = _Tensors(self.int8_tensors, int8)
        self.unmatched: list[str] = []  # weight-only: no float node reads the same names
        self.unsupported: list[str] = []  # weight-only: a layout eprun does not read

    def entry(self, weight) -> dict | None:
        """The weight's entry of the answer, or None where it is left out."""
        import numpy as np

        int8, tensors = self.int8, self.int8_tensors
        name = float_tensor_name(weight.name)
        if name not in self.floats:
            self.unpaired.append(weight.name)
            return None
        values = _initializer_array(tensors[weight.name], int8)
        scale = _initializer_array(tensors[weight.scale], int8)
        zero = (_initializer_array(tensors[weight.zero], int8) if weight.zero else
                np.zeros(scale.shape, np.int32))
        reference = _initializer_array(self.floats[name], self.fp32)
        per_channel = scale.size > 1
        if zero.size not in (1, scale.size) or (per_channel and zero.size != scale.size):
            raise EprunError(f"{int8!r}: weight {weight.name!r} has {scale.size} scale(s) and "
                             f"{zero.size} zero point(s); DequantizeLinear needs as many of each")
        if per_channel and (scale.ndim != 1 or values.ndim == 0
                            or not -values.ndim <= weight.axis < values.ndim
                            or values.shape[weight.axis] != scale.size):
            self.unread.append(f"{weight.name!r} (shape {list(values.shape)}, {scale.size} "
                               f"scales, axis {weight.axis})")
            return None
        if reference.shape != values.shape:
            self.unpaired.append(weight.name)
            return None
        dequantized, wrapped = dequantize_weight(values, scale, zero,
                                                 weight.axis if per_channel else None)
        entry = {"name": name, "quantized": weight.name, "op_type": weight.op_type,
                 "shape": list(values.shape),
                 "axis": (weight.axis % values.ndim) if per_channel else None,
                 **weight_error(reference, dequantized)}
        if wrapped is not None:
            entry["qdq_loss_debug_sqnr_db"] = weight_error(reference, wrapped)["sqnr_db"]
        return entry

    def blockwise_entry(self, weight: BlockwiseWeight) -> dict | None:
        """A weight-only op's weight against the weight of the float node it stands for
        (``FloatWeightReaders``; ``node`` names it, as MatMulNBitsQuantizer's
        ``nodes_to_exclude`` takes it), dequantized as onnxruntime computes it, or None where it
        is left out: with its bits, block size, symmetry, accuracy level and its worst block."""
        import numpy as np

        readers = self.readers
        position = (readers.gather_of(weight.output)
                    if weight.node.op_type == "GatherBlockQuantized" else
                    readers.matmul_of(weight.activation, weight.output, weight.name)
                    if weight.activation else None)
        node = None if position is None else readers.nodes[position]
        name = None if node is None else node.input[1 if node.op_type == "MatMul" else 0]
        named = None if position is None else self.node_names[position]
        if name not in self.floats:
            self.unmatched.append(weight.name)
            return None
        reference = _initializer_array(self.floats[name], self.fp32).astype(np.float32)
        if reference.ndim > 2 and weight.activation and reference.size == math.prod(
                reference.shape[-2:]):  # an N-D weight the quantizer squeezed to [K, N]
            reference = reference.reshape(reference.shape[-2:])
        try:
            dequantized, fields = dequantize_blockwise(weight.node, self.tensors,
                                                       reference.shape)
        except (ValueError, KeyError, IndexError) as exc:
            self.unsupported.append(f"{weight.name!r} ({weight.node.op_type}: {one_line(exc)})")
            return None
        if dequantized.shape != reference.shape:
            self.unmatched.append(weight.name)
            return None
        axis = fields.pop("axis")
        row, block, largest = worst_block(reference - dequantized, axis, fields["block_size"])
        return {"name": name, "quantized": weight.name, "op_type": weight.node.op_type,
                "node": named,
                "shape": list(reference.shape), "axis": axis,
                **weight_error(reference, dequantized), **fields,
                "worst_block": {"column" if weight.activation else "row": row, "block": block,
                                "max_abs_error": largest}}

    def note_left_out(self, entries: list[dict]) -> None:
        """Say on stderr where qdq_loss_debug's own number differs, and what was left out."""
        fp32, int8, unread, unpaired = self.fp32, self.int8, self.unread, self.unpaired
        wrapping = [entry["name"] for entry in entries if "qdq_loss_debug_sqnr_db" in entry]
        if wrapping:
            note(f"{len(wrapping)} weight{'s' if len(wrapping) > 1 else ''} ("
                 f"{', '.join(wrapping[:5])}{' and more' if len(wrapping) > 5 else ''}) "
                 f"{'lie' if len(wrapping) > 1 else 'lies'} so far from the zero point that "
                 "qdq_loss_debug's integer subtraction (of a DequantizeLinear weight) wraps "
                 "around in the weight's own type: qdq_loss_debug_sqnr_db is what its "
                 "compute_weight_error reports, eprun's sqnr_db is the spec's arithmetic")
        if unread:
            note(f"{int8!r}: {', '.join(unread)}: not one scale per tensor nor one per channel "
                 "of the axis (blocked quantization, or an axis the weight has not): left out")
        if unpaired:
            note(f"{len(unpaired)} quantized weight{'s' if len(unpaired) > 1 else ''} of "
                 f"{int8!r} {'have' if len(unpaired) > 1 else 'has'} no fp32 weight of the same "
                 f"name and shape in {fp32!r}, left out: {', '.join(map(repr, unpaired[:5]))}"
                 f"{' and more' if len(unpaired) > 5 else ''}")
        if self.unsupported:
            note(f"{int8!r}: {', '.join(self.unsupported)}: a weight-only layout eprun does not "
                 "dequantize, left out")
        unmatched = self.unmatched
        if unmatched:
            note(f"{len(unmatched)} weight-only weight{'s' if len(unmatched) > 1 else ''} of "
                 f"{int8!r} ({', '.join(map(repr, unmatched[:5]))}"
                 f"{' and more' if len(unmatched) > 5 else ''}) pair with no node of {fp32!r}: "
                 "no MatMul there reads the same activation and writes the same output (no "
                 "Gather the same output) with a constant weight of that shape; left out")


declare(Command(
    name="weights",
    summary="how far each quantized weight is from its float original (qdq_loss_debug's "
            "weight SQNR), no session",
    function=weights,
    options=WeightsOptions,
    positionals=("fp32", "int8"),
    onnxruntime=False,
    arguments=(*FP32_INT8, SWAPPED_OK_ARG, FORMAT_ARG, NODE_DATA_ARG),
    fields=("fp32", "int8", "weight_count", "weights", "worst"),
    detail='weights: [{"name", "quantized", "op_type", "shape", "axis", "sqnr_db", '
           '"max_abs_error"}] in the int8 file\'s order, "name" the float weight\'s name, '
           '"axis" the channel axis of a per-channel scale (null: per tensor), '
           '"qdq_loss_debug_sqnr_db" where its int8 arithmetic wraps around (see stderr); a '
           'weight-only one (MatMulNBits, MatMulBnb4, GatherBlockQuantized, a DequantizeLinear '
           'with a block_size), paired through the float MatMul reading the same activation and '
           'writing the same output, adds "node" (that float node\'s name, as '
           'MatMulNBitsQuantizer\'s nodes_to_exclude takes it), "bits", "block_size", '
           '"symmetric", "accuracy_level" '
           'and "worst_block": {"column" (or a table\'s "row"), "block", "max_abs_error"}, '
           '"axis" the one its blocks run along; worst: {"name", "sqnr_db"} of the lowest '
           'SQNR; --format table sorts worst first',
    example="eprun.py weights fp32.onnx int8.onnx --format table"))


# -- inspect ---------------------------------------------------------------------------------------


def _value_entry(value) -> dict:
    """A graph input or output: its name, element type and shape (a dim by its value, its
    symbolic name, or null where neither is known; null shape where none is declared)."""
    tensor = value.type.tensor_type
    elem = tensor.elem_type if value.type.HasField("tensor_type") else 0
    shape = None
    if value.type.HasField("tensor_type") and tensor.HasField("shape"):
        shape = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
                 for dim in tensor.shape.dim]
    kind = value.type.WhichOneof("value") or "unknown"
    return {"name": value.name,
            "type": _ELEMENT_NAMES.get(elem, f"onnx type {elem}") if elem else kind,
            "shape": shape}


def _tensor_bytes(tensor) -> int:
    """An initializer's size from its dims and type (its payload is not read)."""
    if tensor.data_type == 8:
        return sum(len(item) for item in tensor.string_data)
    count = 1
    for dim in tensor.dims:
        count *= dim
    return (count * _ELEMENT_BITS.get(tensor.data_type, 0) + 7) // 8


def qdq_summary(graph) -> dict | None:
    """For a model with QuantizeLinear/DequantizeLinear nodes: how many activations go
    through a QuantizeLinear -> DequantizeLinear pair, how many DequantizeLinear read a
    weight (an initializer), and the op types of the nodes that read what they dequantize
    (nodes of each type). None for a model without them."""
    if not any(node.op_type in _QDQ_OPS for node in graph.node):
        return None
    initializers = {tensor.name for tensor in graph.initializer}
    quantized = {node.output[0] for node in graph.node
                 if node.op_type == "QuantizeLinear" and node.output}
    dequantizers = [node for node in graph.node if node.op_type == "DequantizeLinear"]
    dequantized = {node.output[0] for node in dequantizers if node.output}
    wrapped = collections.Counter(node.op_type for node in graph.node
                                  if node.op_type not in _QDQ_OPS
                                  and dequantized.intersection(node.input))
    return {"activation_pairs": sum(node.input[0] in quantized for node in dequantizers),
            "weight_dequantizers": sum(node.input[0] in initializers for node in dequantizers),
            "wrapped_ops": dict(wrapped.most_common())}


def weight_only_summary(graph) -> dict | None:
    """For a model with weight-only quantized weights (``weight_only_nodes``): the nodes of
    each op type, the bits, block sizes and accuracy levels (MatMulNBits') they use, and the
    bytes their codes, scales and zero points take (``bytes``) against the float32 weights
    they stand for (``float32_bytes``: 4 bytes an element). None for a model without them."""
    tensors = {tensor.name: tensor for tensor in graph.initializer}
    ops: collections.Counter = collections.Counter()
    bits, blocks, levels = set(), set(), set()
    stored = elements = 0
    for node, width in weight_only_nodes(graph):
        attributes = int_attributes(node)
        inputs = [*node.input, "", "", ""]
        if node.op_type in ("MatMulNBits", "MatMulBnb4"):
            parts = inputs[1:4] if node.op_type == "MatMulNBits" else inputs[1:3]
            elements += attributes.get("K", 0) * attributes.get("N", 0)
        else:  # GatherBlockQuantized's table, or a DequantizeLinear's weight
            parts = [inputs[0], *inputs[2:4]] if node.op_type == "GatherBlockQuantized" \
                else inputs[:3]
            data = tensors.get(inputs[0])
            elements += 0 if data is None else math.prod(data.dims) * (
                8 // width if data.data_type == 2 and node.op_type != "DequantizeLinear" else 1)
        if node.op_type == "MatMulNBits":
            levels.add(attributes.get("accuracy_level", 0))
        ops[node.op_type] += 1
        bits.add(width)
        blocks.add(attributes.get("block_size", 128))
        stored += sum(_tensor_bytes(tensors[name]) for name in parts if name in tensors)
    if not ops:
        return None
    return {"ops": dict(ops.most_common()), "bits": sorted(bits), "block_sizes": sorted(blocks),
            "accuracy_levels": sorted(levels), "bytes": stored, "float32_bytes": 4 * elements}


@dataclasses.dataclass(frozen=True)
class InspectOptions:
    """``inspect``'s options: none but the output's form, which ``main`` takes."""


def inspect(model: str, options: InspectOptions | None = None) -> dict:
    """What the model is, as ``polygraphy inspect model`` summarises it: opsets, inputs and
    outputs, op types, initializers and external data, and its Q/DQ structure, from the
    graph alone (weights stay on disk). ``options``: none yet."""
    parsed = load_model(model, graph_only=True)
    graph = parsed.graph
    external: dict[str, dict] = {}
    for tensor in external_tensors(parsed):
        location = _external_location(tensor)
        if _same_file(model, _safe_location(location.location, model)):
            continue  # a payload load_model left in the model file itself
        entry = external.setdefault(location.location, {"file": location.location,
                                                        "tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += _tensor_bytes(tensor)
    weight_only = weight_only_summary(graph)  # a key only where there is some (else as before)
    return {"model": model, "ir_version": parsed.ir_version,
            "producer": " ".join(filter(None, (parsed.producer_name, parsed.producer_version))),
            "opsets": {entry.domain: entry.version for entry in parsed.opset_import},
            "inputs": [_value_entry(value) for value in graph_inputs(parsed)],
            "outputs": [_value_entry(value) for value in graph.output],
            "nodes": len(graph.node),
            "op_types": dict(collections.Counter(node.op_type for node in graph.node)
                             .most_common()),
            "initializers": {"count": len(graph.initializer),
                             "bytes": sum(_tensor_bytes(tensor) for tensor in graph.initializer)},
            "external_data": sorted(external.values(), key=lambda item: item["file"]),
            "qdq": qdq_summary(graph),
            **({"weight_only": weight_only} if weight_only is not None else {})}


declare(Command(
    name="inspect",
    summary="what a model is: opsets, inputs and outputs with their shapes, op types, "
            "initializers, external data and its Q/DQ structure (no session, no weights read)",
    function=inspect,
    options=InspectOptions,
    positionals=("model",),
    onnxruntime=False,
    arguments=(MODEL, FORMAT_ARG),
    fields=("model", "ir_version", "producer", "opsets", "inputs", "outputs", "nodes",
            "op_types", "initializers", "external_data", "qdq"),
    detail='opsets: {domain: version} ("" is ai.onnx); inputs/outputs: [{"name", "type", '
           '"shape"}], a dim as its number, its symbolic name or null; op_types: {op type: '
           'nodes}, most first; initializers: {"count", "bytes"}; external_data: [{"file", '
           '"tensors", "bytes"}]; qdq: {"activation_pairs", "weight_dequantizers", '
           '"wrapped_ops"} or null without Q/DQ nodes; weight_only, only where the model has '
           'weight-only quantized weights: {"ops", "bits", "block_sizes", "accuracy_levels", '
           '"bytes", "float32_bytes"}',
    example="eprun.py inspect int8.onnx --format table"))


# -- report ----------------------------------------------------------------------------------------

REPORT_NOTE = ("A requested provider list is a wish, not a guarantee: onnxruntime drops providers "
               "it does not have without raising and runs on what is left (CPU at the end); "
               "'actual' is session.get_providers(), the only reliable answer.")
# The ops an accelerator is usually built around: the "compute only" op list.
_COMPUTE_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM", "GRU", "Attention")
REPORT_FILES = ("fp32_exposed.onnx", "int8_exposed.onnx", "providers.json", "growth.json",
                "settings.json", "ep_report.md")
CHART_FILE = "growth.svg"  # report --chart svg


def report_splits(fp32_model, int8_model) -> list[tuple[str, list[str]]]:
    """The op lists the report partitions with, chosen from the ops in the models.

    The compute ops alone (on each model, with their quantized forms on the int8 one), every op
    type of the float model (on each), and those plus the int8 model's own quantization ops
    (QuantizeLinear and DequantizeLinear first). For the lab's MatMul/Add/Relu chain these are
    ``MatMul``, ``MatMul,Add,Relu`` and ``MatMul,Add,Relu,QuantizeLinear,DequantizeLinear``.
    """
    fp32_ops = list(dict.fromkeys(node.op_type for node in fp32_model.graph.node))
    int8_ops = list(dict.fromkeys(node.op_type for node in int8_model.graph.node))
    compute = [op for op in fp32_ops if op in _COMPUTE_OPS] or fp32_ops[:1]
    quantized_compute = compute + [op for op in with_quantized_forms(tuple(compute))
                                   if op in int8_ops and op not in compute]
    extra = [op for op in ("QuantizeLinear", "DequantizeLinear") if op in int8_ops]
    extra += [op for op in int8_ops if op not in fp32_ops and op not in extra]
    return [("fp32", compute), ("fp32", fp32_ops), ("int8", quantized_compute),
            ("int8", fp32_ops), ("int8", fp32_ops + extra)]


@dataclasses.dataclass(frozen=True)
class ReportOptions(ProviderFlags, PlotFlags, DaskFlags):
    """``report``'s options; each field is the flag of its name (``sensitivity_section``:
    ``--sensitivity``; ``providers``: the target's, for a row of the providers table and for
    the int8 side of every measurement), but ``command_line``: the words ``main`` was called
    with, quoted at the report's top."""

    out_dir: str | None = None
    inputs: InputOptions | None = None
    boundary_ops: tuple[str, ...] = BOUNDARY_OPS
    force: bool = False
    sensitivity_section: bool = False
    swapped_ok: bool = False
    local: bool = False
    chart: str | None = None
    calibration: str | None = None
    extra_options: dict | None = None
    command_line: list[str] | None = None


def report(fp32: str, int8: str, seed: int, options: ReportOptions | None = None) -> dict:
    """Measure everything the lab asks for and write the deliverables into ``out_dir`` (the
    fp32 model's folder when not given).

    Every output is checked before anything is measured (an input's path, a device, a file
    eprun did not write unless ``force``), every measurement runs before anything is written,
    and the files are then committed as one set: an error or an interrupt leaves the previous
    deliverables as they were, all of them. Boundaries are paired by
    name wherever the names pair them all (for the lab's models that is the same as by
    position). The answer adds the ``check`` verdict of the int8 model against the fp32 one
    under the int8 profile, on ``providers`` (CPU when not given); with them, the
    error table, growth and settings run the int8 model there too (the fp32 reference on the
    CPU), each section saying where it ran, and a target the sessions do not get is refused
    like any fallback unless ``allow_fallback``. ``local`` adds each
    segment's local error to growth.json and the chart; ``chart="svg"`` also writes the chart
    as ``growth.svg``, linked from the report.
    """
    options = options or ReportOptions()
    made = _Report(fp32, int8, seed, options.out_dir if options.out_dir is not None
                   else (os.path.dirname(fp32) or "."), options)
    made.measure()
    return made.write()


class _Report:
    """One ``report``: its outputs checked (``__init__``), every section measured
    (``measure``), then the deliverables and plots written as one set (``write``)."""

    def __init__(self, fp32: str, int8: str, seed: int, out_dir: str,
                 options: ReportOptions) -> None:
        """Before anything is measured, refuse what would fail: a missing model, a sensitivity
        option without ``--sensitivity``, an out dir or plots eprun cannot write, a swapped pair, a
        calibration file that does not fit, outputs it may not replace."""
        self.fp32, self.int8, self.seed, self.out_dir, self.options = \
            fp32, int8, seed, out_dir, options
        require_file(fp32)
        require_file(int8)
        for given, option in ((options.calibration, "--calibration"),
                              (options.extra_options, "--extra-option"),
                              (options.dask_scheduler, "--dask-scheduler"),
                              (options.dask_scheduler_file, "--dask-scheduler-file")):
            if given and not options.sensitivity_section:
                raise EprunError(f"{option} is the sensitivity section's: give --sensitivity "
                                 "too", EXIT_USAGE)
        require_out_dir(out_dir)
        require_plots(options.save_plots, options.plot_format)
        self.names = (*REPORT_FILES, *((CHART_FILE,) if options.chart == "svg" else ()))
        self.paths = {name: os.path.join(out_dir, name) for name in self.names}
        self.paths_of = {"fp32": fp32, "int8": int8}
        self.graphs = {which: load_model(path, text_names=True)
                       for which, path in self.paths_of.items()}
        require_in_order((self.graphs["fp32"], self.graphs["int8"]), (fp32, int8),
                         options.swapped_ok)
        if options.calibration is not None:  # a file that does not fit fails now, not later
            calibration_batches(self.graphs["fp32"], options.calibration, fp32)
        _check_report_targets(self.paths, self.graphs, self.paths_of, options.force)
        self.sections: dict = {}  # each measured answer, by what it is
        self.named: dict | None = None  # the boundaries paired by name, if the names do

    def measure(self) -> None:
        """Every section's answer, in the report's order, six steps of progress."""
        options, fp32, int8, seed = self.options, self.fp32, self.int8, self.seed
        requests = [list(request) for request in REPORT_REQUESTS]
        if options.providers is not None and options.providers not in requests:
            requests.append(list(options.providers))
        progress = Progress("report", 6)
        with captured_chatter():  # the made-up provider's banner and note: the table says so
            self.sections["providers"] = {
                **providers(fp32, requests, ProvidersOptions(
                    ep_library=options.ep_library, ep_options=options.ep_options)),
                "note": REPORT_NOTE}
        progress.step(1)
        graphs = self.graphs
        self.sections["splits"] = [
            partition(self.paths_of[which], ops, parsed=graphs[which])
            for which, ops in report_splits(graphs["fp32"], graphs["int8"])]
        self.named = _name_pairs(graphs["fp32"].graph, graphs["int8"].graph,
                                 options.boundary_ops)
        progress.step(2)
        # the gate first: its runs of the plain models are the ones the exposure records
        # compare with, so no plain model runs twice
        candidate: dict = {}
        reference: dict = {}
        self.sections["gate"] = check(fp32, int8, CheckOptions(
            providers=options.providers,
            profile="int4" if _weight_only_4bit(self.graphs["int8"]) else "int8",
            inputs=options.inputs, seed=seed,
            ep_options=options.ep_options, allow_fallback=options.allow_fallback,
            swapped_ok=True),  # the order is checked above, on the graphs read there
            outputs_into=candidate, reference_into=reference)
        progress.step(3)
        targets = targets_from(options) if options.providers is not None else Targets()
        measured, int8_final = measure_layers(fp32, int8, seed, LayerOptions(
            inputs=options.inputs, boundary_ops=options.boundary_ops, pair=self.pairing,
            swapped_ok=options.swapped_ok, clipping=True, local=options.local), targets,
            plain={"fp32": reference, "int8": candidate})
        self.sections.update(measured=measured, growth=growth_of(measured))
        progress.step(4)
        self.sections["settings"] = settings(int8, seed, SettingsOptions(
            inputs=options.inputs, providers=options.providers,
            allow_fallback=options.allow_fallback, ep_library=options.ep_library,
            ep_options=options.ep_options))
        progress.step(5)
        self.sections["exposure"] = self._exposure(targets, candidate, int8_final)
        progress.step(6)
        progress.close()
        self.sections["ranked"] = (
            _optional_sensitivity(fp32, int8, seed, options.inputs, options.swapped_ok,
                                  calibration=options.calibration,
                                  extra_options=options.extra_options,
                                  cluster=options.dask())
            if options.sensitivity_section else None)

    @property
    def pairing(self) -> str:
        """How the boundaries are paired: by name wherever the names pair them all."""
        return "name" if self.named is not None else "position"

    def _exposure(self, targets: Targets, candidate: dict, int8_final) -> dict | None:
        """How far exposing the boundaries moved the int8 model's final output: measured
        where the table was (none after a fallback), or on the CPU against the check's run of
        the plain model as deployed."""
        measured = self.sections["measured"]
        final = measured["layers"][-1]["int8"]
        if targets.given:
            exposure = measured.get("exposure")
            if exposure is not None and exposure["max_abs_diff"] is not None:
                exposure = {**exposure, "bitwise_equal": exposure["max_abs_diff"] == 0}
            return exposure
        plain = (candidate.get(final) if self.sections["gate"]["providers"]["actual"] == [CPU_EP]
                 else None)
        return _exposure_effect(self.int8, self.seed, final, int8_final,
                                inputs=self.options.inputs, plain=plain)

    def markdown(self) -> str:
        """ep_report.md's text, the sensitivity section (or why there is none) at its end."""
        sections, ranked = self.sections, self.sections["ranked"]
        facts = {**_report_facts(self.graphs["int8"], sections["measured"]),
                 "in_order": self.named is None or all(i == j for i, j in self.named.items()),
                 "chart": CHART_FILE if self.options.chart == "svg" else None,
                 "command_line": self.options.command_line}
        markdown = report_markdown(
            provider_answer=sections["providers"], splits=sections["splits"],
            measured=sections["measured"], growth_answer=sections["growth"],
            settings_answer=sections["settings"], exposure=sections["exposure"],
            gate=sections["gate"], facts=facts)
        if ranked is not None:
            markdown += (_sensitivity_section(ranked) if "error" not in ranked else
                         _sensitivity_missing(ranked["error"]))
        return markdown

    def write(self) -> dict:
        """Write the deliverables (and plots, staged first and linked from their sections)
        as one set; the answer."""
        options, sections = self.options, self.sections
        markdown, plots = self.markdown(), None
        if options.save_plots:
            markdown, plots = self._stage_plots(markdown)
        try:
            external = _write_deliverables(
                self.out_dir, self.paths, self.paths_of, options.boundary_ops,
                {"providers.json": sections["providers"], "growth.json": sections["growth"],
                 "settings.json": sections["settings"], "ep_report.md": markdown,
                 **({CHART_FILE: growth_svg(sections["measured"], sections["growth"])}
                    if options.chart == "svg" else {})},
                force=options.force)
        except BaseException:  # the report they belong to was not written: nor are they
            if plots and plots.paths:
                discard(plots.files)
                remove_folders(plots.folders)
            raise
        if plots and plots.paths:
            commit(plots.files)
        return self.answer(external, plots.paths if plots else [])

    def _stage_plots(self, markdown: str) -> tuple[str, _StagedPlots]:
        """The figures drawn and staged, and ``markdown`` with each linked under its
        section."""
        sections, ranked = self.sections, self.sections["ranked"]
        writer = PlotWriter(self.options.save_plots, self.int8, "report",
                            self.options.plot_format)
        figures = {REPORT_GROWTH_HEADING: plot_boundaries(writer, sections["measured"],
                                                          "rel_error", sections["growth"]),
                   REPORT_MACHINE_HEADING: plot_settings(writer, sections["settings"])}
        if ranked is not None and "error" not in ranked:
            figures[REPORT_SENSITIVITY_HEADING] = plot_sensitivity(writer, ranked)
        files, folders = writer.stage((self.fp32, self.int8))
        staged = _StagedPlots(files, folders, [path for path, _ in writer.files])
        return with_figures(markdown, {heading: os.path.relpath(path, self.out_dir)
                                       for heading, path in figures.items()}), staged

    def headline(self) -> dict:
        """The numbers ep_report.md is about, as its sections measured them: providers
        available and requests that fell back, the boundaries, the worst one, the growth,
        whether the settings agreed and how far exposing moved the int8 output."""
        sections = self.sections
        cases, growth = sections["providers"]["cases"], sections["growth"]
        rel_errors = growth["rel_error"]
        worst = _worst(rel_errors)
        exposure = sections["exposure"] or {}
        return {"available": len(sections["providers"]["available"]),
                "requests": len(cases),
                "fell_back": sum(bool(case["fell_back"]) for case in cases),
                "layer_count": growth["layer_count"],
                "worst_layer": None if worst is None else {"index": worst,
                                                           "rel_error": rel_errors[worst]},
                "total_growth": growth["total_growth"], "max_ratio": growth["max_ratio"],
                "settings_all_equal": sections["settings"]["all_equal"],
                "exposure_max_abs_diff": exposure.get("max_abs_diff")}

    def answer(self, external: list[dict], plots: list[str]) -> dict:
        """``report``'s answer: the files, the pairing, the check's verdict, and whatever the
        options added."""
        gate, ranked = self.sections["gate"], self.sections["ranked"]
        answer = {"out_dir": self.out_dir, "files": [self.paths[name] for name in self.names],
                  "pairing": self.pairing, "headline": self.headline(),
                  "check": {key: gate[key] for key in ("profile", "tolerance", "providers",
                                                       "failures", "passed")}}
        if ranked is not None:
            answer["sensitivity"] = ranked.get("recommendation")
            if "error" in ranked:
                answer["sensitivity_error"] = ranked["error"]
        if external:
            answer["external_data"] = external
        if plots:
            answer["plots"] = plots
        return answer


class _StagedPlots(NamedTuple):
    """A report's figures, staged beside its deliverables: the staged files, the folders
    made for them, and their final paths."""

    files: list
    folders: list
    paths: list[str]


def _write_deliverables(out_dir: str, paths: dict, models: dict, boundary_ops: tuple,
                        contents: dict, *, force: bool) -> list[dict]:
    """Stage both exposed models and the ``contents`` (answers as JSON, the report's text),
    then commit them as one set; on any failure, or a signal, nothing is left: no staged file
    and no folder the report made. The folder is locked meanwhile (``locked_folder``), and
    what may be replaced is checked again under the lock, so two reports into one folder
    leave one run's set. Returns the exposed models' ``external_data`` entries."""
    created = _missing_folders(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    staged: list[Staged] = []
    external: list[dict] = []
    like = tuple(models.values())
    try:
        with locked_folder(out_dir) as folder:
            _refuse_foreign(paths, force, folder)
            for which in ("fp32", "int8"):
                exposed, files = prepare_expose(models[which], paths[f"{which}_exposed.onnx"],
                                                boundary_ops, force=force, checked=True,
                                                folder=folder)
                staged += files
                external += exposed.get("external_data", [])
            for name, content in contents.items():
                data = (content.encode("utf-8", "surrogateescape") if isinstance(content, str)
                        else (to_json(content) + "\n").encode())
                staged.append(stage(data, paths[name], like=like, folder=folder))
            commit(staged)
    except BaseException:
        discard(staged)
        remove_folders(created)
        raise
    return external


def _optional_sensitivity(fp32: str, int8: str, seed: int, inputs: InputOptions | None,
                          swapped_ok: bool, *, calibration: str | None = None,
                          extra_options: dict | None = None,
                          cluster: DaskFlags | None = None) -> dict:
    """``report --sensitivity``'s ranking, or ``{"error": why}`` when it cannot be made: an
    optional section that fails (a model form it refuses, a graph onnxruntime will not open)
    leaves the rest of the report standing, and says why on stderr and in the report."""
    try:
        cluster = cluster or DaskFlags()
        return sensitivity(fp32, int8, seed, SensitivityOptions(
            inputs=inputs, swapped_ok=swapped_ok, calibration=calibration,
            extra_options=extra_options, dask_scheduler=cluster.dask_scheduler,
            dask_scheduler_file=cluster.dask_scheduler_file))
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # whatever it was (MemoryError too), the report still goes out
        if out_of_space(exc):  # but a full disk is the machine's failure: the report fails
            raise
        why = one_line(exc) if isinstance(exc, EprunError) else (
            f"internal error: {type(exc).__name__}: {one_line(exc)}")
        note(f"report --sensitivity: the section is left out: {why}")
        return {"error": why}


# What each deliverable starts with when eprun wrote it: JSON keys, or the report's first words.
_REPORT_SIGNATURES = {"providers.json": {"model", "available", "cases", "note"},
                      "growth.json": {"seed", "layer_count", "rel_error", "ratios"},
                      "settings.json": {"model", "seed", "baseline", "cases", "all_equal"},
                      "ep_report.md": "eprun report, generated by",
                      CHART_FILE: '<svg xmlns="http://www.w3.org/2000/svg" data-generator="eprun" '}


declare(Command(
    name="report",
    summary="run every lab measurement and write the deliverables: " + ", ".join(REPORT_FILES),
    function=report,
    positionals=("fp32", "int8", "seed"),
    options=ReportOptions,
    arguments=(
        *FP32_INT8,
        SEED_POSITIONAL,
        SEED_FLAG,
        arg("--out-dir", help="folder to write into (default: the fp32 model's folder)"),
        FORCE_ARG,
        arg("--sensitivity", action="store_true", dest="sensitivity_section",
            help="add an optional fifth section to ep_report.md: sensitivity's ranking and "
                 "recommendation"),
        *flags_of(ProviderFlags, "providers"),
        LOCAL_ARG,
        arg("--chart", choices=("svg",),
            help=f"also write the growth chart as {CHART_FILE} (for viewers without Mermaid), "
                 "linked from ep_report.md"),
        *flags_of(ProviderFlags, "allow_fallback"),
        *INPUT_ARGS, BOUNDARY_OPS_ARG, *EP_ARGS, SWAPPED_OK_ARG, CALIBRATION_ARG,
        EXTRA_OPTION_ARG, *flags_of(DaskFlags), FORMAT_ARG, *PLOT_ARGS),
    fields=("out_dir", "files", "pairing", "headline", "check"),
    detail='headline: {"available", "requests", "fell_back", "layer_count", "worst_layer", '
           '"total_growth", "max_ratio", "settings_all_equal", "exposure_max_abs_diff"}; '
           'check: {"profile", "tolerance", "providers", "failures", "passed"}; the JSON files '
           'hold the command answers, providers.json adds "note"',
    example="eprun.py report fp32.onnx int8.onnx --seed 2026 --out-dir report"))


def _check_report_targets(paths: dict, graphs: dict, paths_of: dict, force: bool) -> None:
    """Refuse, before anything is measured, every deliverable path ``report`` must not
    replace: an input or its weights (exit 2), a device, folder or link (exit 4), a file
    eprun did not write (exit 4, unless ``force``), and a data file of an exposed model that
    holds other data."""
    protected = [path for which, model_path in paths_of.items()
                 for path in (model_path, *external_data_files(graphs[which], model_path))]
    for path in paths.values():
        if os.path.isdir(os.path.dirname(os.path.abspath(path))):
            require_output_path(path, protected)
    _refuse_foreign(paths, force)
    for which, model_path in paths_of.items():
        out = paths[f"{which}_exposed.onnx"]
        plan_external_data(graphs[which], model_path, out,
                           replacing=force or os.path.isfile(out))


def _refuse_foreign(paths: dict, force: bool, folder: int | None = None) -> None:
    """Without ``force``, refuse a deliverable path that holds a file eprun did not write
    (read through ``folder``, the open output folder, where given)."""
    for name, path in paths.items():
        existing = in_folder(folder, path)
        if not force and os.path.isfile(existing) and not _written_by_eprun(name, existing):
            hint = _swapped_hint(existing) if name not in _REPORT_SIGNATURES else ""
            raise EprunError(f"refusing to replace {path!r}, which eprun did not write{hint}; "
                             "move it away, choose another --out-dir, or add --force")


def _written_by_eprun(name: str, path: str) -> bool:
    """Does the file at a deliverable's path carry eprun's mark: a model its metadata entry
    (``EPRUN_MARK``), the report and chart their first words, a JSON answer its exact form
    (one compact line as eprun writes it, with the command's fields)? Replacing such a file
    loses nothing eprun cannot write again."""
    import json

    signature = _REPORT_SIGNATURES.get(name)
    if signature is None:
        return is_eprun_model(path)
    try:
        with open(path, encoding="utf-8") as stream:
            if isinstance(signature, str):
                return stream.read(len(signature)) == signature
            text = stream.read(1 << 24)
        answer = json.loads(text)
        return (isinstance(answer, dict) and signature <= set(answer)
                and text == to_json(answer) + "\n")
    except (OSError, ValueError, TypeError, RecursionError):
        return False


def _name_pairs(fp32_graph, int8_graph, boundary_ops: tuple[str, ...]) -> dict | None:
    """The boundary pairs the tensor and node names give, when they pair every boundary
    (from the graphs ``report`` has parsed already)."""
    fp32, int8 = find_boundaries(fp32_graph, boundary_ops), find_boundaries(int8_graph,
                                                                            boundary_ops)
    named = pair_by_name(fp32, int8, boundary_owners(fp32_graph, fp32, boundary_ops),
                         boundary_owners(int8_graph, int8, boundary_ops))
    return named if len(named) == len(fp32) else None


def _report_facts(int8_model, measured: dict) -> dict:
    """What the graph says about the measured boundaries, for the report's prose: which int8
    boundaries a QuantizeLinear -> DequantizeLinear pair requantizes."""
    index = GraphIndex.of(int8_model.graph)
    requantized = [entry["index"] for entry in measured["layers"]
                   if len(quantizing_chain(entry["int8"], index)[1]) == 2]
    return {"requantized": requantized}


def _exposure_effect(int8_path: str, seed: int, output: str, exposed, *,
                     inputs: InputOptions | None = None, plain=None) -> dict:
    """Does exposing the int8 boundaries change the final output? Exposed DQ outputs can stop
    onnxruntime from fusing DequantizeLinear -> MatMul -> QuantizeLinear into one kernel.
    ``plain`` is the plain model's output when a run already has it."""
    if plain is None:
        session = open_session(int8_path, what=repr(int8_path))
        feed = make_feeds(session_specs(session, int8_path), seed, inputs, int8_path)
        plain = run_session(session, [output], feed.arrays, what=repr(int8_path))[0]
    return {"output": output, "bitwise_equal": plain.tobytes() == exposed.tobytes(),
            "max_abs_diff": largest_of(differences(plain, exposed)[2])}


# == 11. Command line ==============================================================================

class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, asking for the terminal's width only when it formats. argparse
    makes one for each argument it declares (to check the argument's metavar), and without a
    width each asks ``shutil``, whose import (zlib, bz2 and lzma with it) costs a short command
    more than the rest of its argument parsing."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None, **options: Any) -> None:
        """argparse's formatter; without a ``width``, the terminal's is asked for only in
        ``format_help`` (80 meanwhile)."""
        self._asked_position = max_help_position if width is None else None
        super().__init__(prog, indent_increment, max_help_position,
                         80 if width is None else width, **options)

    def format_help(self) -> str:
        """The help text, at the terminal's width (asked here, once) unless a width was given."""
        if self._asked_position is not None:  # what argparse sets when given no width
            import shutil

            self._width = shutil.get_terminal_size().columns - 2
            self._max_help_position = min(self._asked_position,
                                          max(self._width - 20, self._indent_increment * 2))
            self._asked_position = None
        return super().format_help()


class _Parser(argparse.ArgumentParser):
    """argparse with eprun's one-line usage errors (exit 2, nothing on stdout); ``argv``: the
    words being parsed (``build_parser`` gives them), for the hint."""

    argv: tuple[str, ...] = ()

    def error(self, message: str) -> None:  # type: ignore[override]
        """Exit 2 with one line on stderr: argparse's message, a hint where there is one
        (``_usage_hint``), and the ``--help`` of the command at fault."""
        # an argument the command does not take is reported by the top parser: its help is
        # the command's own
        prog = self.prog
        command = next((word for word in self.argv if word in COMMANDS), None)
        if command is not None and " " not in prog:
            prog = f"{prog} {command}"
        hint = _usage_hint(message, self.argv)
        self.exit(EXIT_USAGE, f"eprun: error: {one_line(message + hint)} "
                  f"(see '{prog} --help')\n")


def _usage_hint(message: str, given: tuple[str, ...]) -> str:
    """What to type instead, where argparse's message alone would leave the user guessing: a
    command name that is nearly one, a list given as several arguments (``given``: the words
    parsed)."""
    import difflib

    argv = list(given)
    wrong = re.search(r"invalid choice: '([^']*)'", message)
    if wrong and message.startswith("argument <command>"):
        close = difflib.get_close_matches(wrong.group(1), list(COMMANDS), n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""
    command = next((COMMANDS[word] for word in argv if word in COMMANDS), None)
    extra = re.match(r"unrecognized arguments: (.*)$", message)
    lists = [argument for argument in (command.arguments if command else ())
             if not argument.names[0].startswith("-")
             and argument.options.get("type") is parse_list]
    if extra and lists and argv:
        words = extra.group(1).split()
        start = next((k for k in reversed(range(len(argv)))  # the extras trail: the last
                      if argv[k:k + len(words)] == words), None)
        if start and not any(word.startswith("-") for word in words):
            return _list_hint(command, argv, start, words, lists)
    return ""


def _list_hint(command: Command, argv: list[str], start: int, words: list[str],
               lists: list[Arg]) -> str:
    """The hint for ``words``, left over at ``argv[start]`` by a command that takes a list:
    a flag's second value (the flag takes one, each time it is given), words after a flag
    (they go before the flags), or a list's items given apart (joined with commas)."""
    before, said = argv[start - 1], " ".join(words)
    several = any(argument.options.get("nargs") in ("+", "*") for argument in lists)
    flag = _option_named(command, argv[start - 2]) if start >= 2 else None
    if not before.startswith("-") and flag is not None and "=" not in argv[start - 2] \
            and flag.options.get("action") in (None, "store", "append"):
        if flag.options.get("action") == "append":
            return f"; {flag.names[0]} takes one value each time: give it again for {said}"
        if not several:
            return f"; {flag.names[0]} takes one value"
        before = argv[start - 2]
    if before.startswith("-"):
        if several:
            return f"; the lists come before the flags: put {said} before {before}"
        return "; a list is one argument, its items joined with commas, before the flags"
    joined = ",".join([before, *words])
    return f"; a list is one argument, its items joined with commas: {joined}"


def _option_named(command: Command, word: str) -> Arg | None:
    """The flag of ``command`` that ``word`` names, as argparse reads it: the whole name or a
    prefix of one name alone, a value after ``=`` aside; None for anything else."""
    if not word.startswith("-"):
        return None
    typed = word.split("=", 1)[0]
    flags = [argument for argument in command.arguments
             if any(name.startswith("-") for name in argument.names)]
    exact = [argument for argument in flags if typed in argument.names]
    if exact:
        return exact[0]
    prefixed = [argument for argument in flags
                if any(name.startswith(typed) for name in argument.names)]
    return prefixed[0] if len(prefixed) == 1 else None


def _seed_from(args: argparse.Namespace, extra: list[str]) -> None:
    """An optional positional seed given after an option (``layers a b --local 2026``):
    argparse fills optional positionals in one go, before the options, so the seed arrives
    as the first word left over. It is taken as the seed (checked as one), as it always was."""
    values = vars(args)
    name = next((key for key in ("seed", "seed_positional")
                 if key in values and values[key] is None
                 and (key == "seed_positional" or "seed_option" in values)), None)
    if name is None or not extra or extra[0].startswith("-"):
        return
    try:
        values[name] = parse_seed(extra[0])
    except argparse.ArgumentTypeError as exc:
        args.command_parser.error(f"argument seed: {exc}")
    del extra[0]  # what is left is still unrecognized


def settle_seed(args: argparse.Namespace) -> str | None:
    """The seed is taken in both forms, positional and ``--seed``, by every command that has
    one; leaves it in ``args.seed`` (and whether it was given at all in ``args.seed_given``:
    a golden file's inputs refuse a seed given that did not draw them) and returns what is
    wrong, if anything (none given where it is required, or two that differ)."""
    values = vars(args)
    if "seed_option" in values:  # positional first: one of the two is required
        given = [value for value in (args.seed, values.pop("seed_option")) if value is not None]
        if not given:
            return "the following arguments are required: seed (or --seed SEED)"
    elif "seed_positional" in values:  # --seed first, default 0
        given = [value for value in (args.seed, values.pop("seed_positional"))
                 if value is not None]
    else:
        return None
    if len(set(given)) > 1:
        return f"the seed is given twice, as {given[0]} and {given[1]}: give it once"
    args.seed, args.seed_given = (given[0], True) if given else (0, False)
    return None


class _VersionAction(argparse.Action):
    """``--version``: eprun's own version and those of the libraries it would run with."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        """Print eprun's, onnx's, onnxruntime's, numpy's and Python's versions on one line and exit
        0; exit 4 where stdout cannot take the line."""
        import importlib
        import platform

        found = []
        for package in ("onnx", "onnxruntime", "numpy"):  # onnxruntime-gpu etc. import the same
            try:
                version = (_installed_version(package)
                           or importlib.import_module(package).__version__)
                found.append(f"{package} {version}")
            except ImportError:
                found.append(f"{package} not installed")
        line = f"eprun {__version__} ({', '.join(found)}; Python {platform.python_version()})\n"
        if sys.stdout is None or not write_fd(1, line.encode()):  # closed at start, or full
            say("eprun: error: cannot write the version to stdout (closed, full or a closed "
                "pipe)")
            _silence_stdout()
            parser.exit(EXIT_FAILURE)
        parser.exit(0)


def _installed_version(module: str) -> str | None:
    """The version of the installed distribution whose files hold the package ``module``
    imports (``onnxruntime`` comes from ``onnxruntime-gpu`` as well), read from its metadata
    folder beside the package: no import of the package (onnx's alone takes a third of a
    second) nor of importlib.metadata. None where no such folder lists the package's
    ``__init__.py`` (a source tree on the path, another installer): the caller imports it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or os.path.basename(spec.origin) != "__init__.py":
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    listed = f"{module}/__init__.py"
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return None
    for name in names:
        if not (name.endswith(".dist-info") and name.lower().startswith(module.lower())):
            continue
        try:
            with open(os.path.join(site, name, "RECORD"), encoding="utf-8") as record:
                if not any(line.split(",", 1)[0] == listed for line in record):
                    continue
            with open(os.path.join(site, name, "METADATA"), encoding="utf-8") as metadata:
                for line in metadata:
                    if not line.strip():
                        break
                    if line.startswith("Version:"):
                        return line[len("Version:"):].strip() or None
        except (OSError, UnicodeDecodeError):
            continue
    return None


def build_parser(only: str | None = None,
                 argv: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The command line, built from the ``COMMANDS`` declarations; with ``only`` (the command
    the words name first, see ``_command_named``), that command alone: no other is reachable
    then, and declaring them all would be most of the start-up of a short command. ``argv``:
    the words it will parse, for its usage hints."""
    import textwrap

    codes = ", ".join(f"{code} {name}" for code, name, _ in EXIT_CODES)
    program = program_name()
    parser = _Parser(prog=program, description=__doc__.split("\n\n")[0],
                     formatter_class=_Formatter,
                     epilog=textwrap.fill(f"Exit codes: {codes}.", 79))
    parser.argv = argv
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print eprun's version and the onnx, onnxruntime and numpy "
                        "versions it runs with, then exit")
    # the prog argparse would format for each command (the program name, with no positional
    # before the command), given so that declaring them formats nothing
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", prog=program)
    subparsers.required = True
    for command in COMMANDS.values():
        if only is not None and command.name != only:
            continue
        description = "\n\n".join(part for part in (
            textwrap.fill(command.summary, 79),
            textwrap.fill("JSON: {" + ", ".join(f'"{field}"' for field in command.fields)
                          + "}" + (f"; {command.detail}" if command.detail else ""), 79,
                          subsequent_indent="  ")) if part)
        example = re.sub(r"^eprun\.py\b", program, command.example)
        sub = subparsers.add_parser(command.name, help=command.summary, description=description,
                                    epilog=f"example:\n  {example}",
                                    formatter_class=_Formatter)
        for argument in command.arguments:
            sub.add_argument(*argument.names, **argument.options)
        sub.set_defaults(declared=command, command_parser=sub)
        sub.argv = argv
    return parser


def _command_named(argv: tuple[str, ...]) -> str | None:
    """The command ``argv`` starts with; else None (no command, an unknown one, or a top-level
    option first such as ``--help``, whose text lists every command): the whole parser."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def invoke(command: Command, args: argparse.Namespace, argv: tuple[str, ...] = ()) -> dict:
    """``command.function(*positionals, options)``: the parsed arguments ``positionals`` names,
    then the options record made of those its fields name (``command_line``: ``argv``, the
    words as typed)."""
    values = vars(args)
    if "rows" in values:
        values = {**values, "inputs": inputs_from(args)}
    if "ep_option" in values:
        values = {**values, "ep_options": ep_options_from(args)}
    if "extra_option" in values:
        values = {**values, "extra_options": dict(args.extra_option)}
    values = {**values, "command_line": list(argv)}
    options = command.options(**{field.name: values[field.name]
                                 for field in dataclasses.fields(command.options)
                                 if field.name in values})
    return command.function(*(values[name] for name in command.positionals), options)


def main(argv: list[str] | None = None) -> int:
    """Run one command: parse, compute with every stream held, print one JSON line or one
    error line; return the exit code (see the module docstring). Safe to call from any thread
    and from other Python code: signal handlers are set only in the main thread, and the
    caller's come back before it returns. Each call has a state of its own (``Invocation``). Calls
    from several threads at once run one after the other (``_ONE_AT_A_TIME``): eprun holds
    the process's file descriptors 1 and 2 while a command runs, so two at once would take
    each other's answers."""
    with _ONE_AT_A_TIME, installed(Invocation()) as invocation:
        return _main(argv, invocation, restore_handlers=True)


# The process's file descriptors 1 and 2 are one, whoever calls main(): one call at a time,
# in any thread (an RLock, as main() is re-entered only by the command it runs).
_ONE_AT_A_TIME = threading.RLock()


def _main(argv: list[str] | None, invocation: Invocation, restore_handlers: bool) -> int:
    """``main`` for ``invocation``: parse ``argv`` (None: the process's own), refuse what
    cannot work before anything runs, then ``_execute``."""
    import warnings

    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # seeds of any length, in and out
    closed = _hold_closed_streams()
    replaced: dict = {}
    try:
        replaced = _install_signal_handlers()
        words = tuple(sys.argv[1:] if argv is None else argv)
        parser = build_parser(_command_named(words), words)
        if not words:  # bare eprun: a short usage, the commands, and where help is
            parser.print_usage(sys.stderr)
            print(f"commands: {', '.join(COMMANDS)}", file=sys.stderr)
            parser.error("no command given")
        args, extra = parser.parse_known_args(argv)
        _seed_from(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        problem = settle_seed(args)
        if problem:
            args.command_parser.error(problem)
        if 1 in closed:
            say("eprun: error: stdout is closed, so there is nowhere to write the answer")
            return EXIT_FAILURE
        with warnings.catch_warnings():
            quiet = not debugging()
            if quiet:  # "Specified provider ... is not in available provider names"
                warnings.filterwarnings("ignore", category=UserWarning, module="onnxruntime")
            return _execute(args, words, invocation,
                            quiet_ort=quiet and args.declared.onnxruntime)
    except KeyboardInterrupt:
        say("eprun: error: interrupted")
        return 130
    finally:
        for number, previous in replaced.items() if restore_handlers else ():
            signal.signal(number, previous)


def cli() -> None:
    """The ``eprun`` command and ``python eprun.py``: ``main``, then exit with its code
    (``_exit``). A signal that arrives while the process ends (the answer already out) is
    ignored rather than turning a finished run into a killed one. onnxruntime's telemetry
    (1.32 writes a device id and a database under ``$HOME/.cache`` and a file in ``$TMPDIR``)
    is off for eprun's own process unless the user set ``ORT_DISABLE_TELEMETRY``: a tool that
    leaves nothing behind."""
    # numpy's BLAS: one thread (eprun's sums are dot products and norms), not a thread, an
    # 8 MB stack and a 32 MB buffer per core, reserved at numpy's import
    own = {name for name in ("ORT_DISABLE_TELEMETRY", "OPENBLAS_NUM_THREADS")
           if name not in os.environ}
    for name in own:
        os.environ[name] = "1"
    _one_arena_under_a_limit()
    with installed(Invocation(program=True, own_environment=own), stays=True) as invocation:
        if threading.current_thread() is threading.main_thread():
            install_bus_handler(invocation)
        try:
            code = _main(None, invocation, restore_handlers=False)
        except SystemExit as exc:  # argparse's: --help, --version and usage errors
            if not (exc.code is None or isinstance(exc.code, int)):
                raise
            code = exc.code or 0
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                signal.signal(getattr(signal, name), signal.SIG_IGN)
    _exit(code)


def _one_arena_under_a_limit() -> None:
    """Under a finite ``ulimit -v``, one glibc malloc arena: each thread that allocates (every
    onnxruntime intra-op thread) would otherwise reserve an arena of 64 MB of the room left."""
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return
    with contextlib.suppress(Exception):  # not glibc
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX


def _exit(code: int) -> None:
    """End the process with ``code``. When the run left nothing running (no other thread, no
    worker process: multiprocessing never imported), the atexit handlers run and the process
    ends there: what the interpreter would do next, finalizing every module and then running
    the C libraries' destructors, is onnxruntime's and numpy's teardown (about 0.02 s here, a
    tenth of a short command), and nothing eprun leaves depends on it: the answer went to
    fd 1 in one write, every file it wrote is closed and fsynced, its temporaries are gone."""
    import atexit

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    if (run_exit_functions is None or threading.active_count() > 1
            or "multiprocessing" in sys.modules):
        sys.exit(code)
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _execute(args: argparse.Namespace, argv: tuple[str, ...], invocation: Invocation, *,
             quiet_ort: bool) -> int:
    """One parsed command (``argv``: as typed) carried out to its exit code: the answer on
    stdout (and the verdict's line on stderr), or the one failure line; what onnxruntime
    printed meanwhile is held back. ``quiet_ort``: onnxruntime's native log is quieted for
    the command (``OrtLog``), and its default put back after it unless eprun is the
    process."""
    store, quieted = None, False
    try:
        try:
            form = output_format(args.format) if hasattr(args, "format") else "json"
            if args.declared.onnxruntime and "numpy" not in sys.modules:
                require_address_space("onnxruntime, onnx and numpy", _IMPORT_ROOM)
            with captured_chatter() as store:
                quieted = quiet_ort and OrtLog.quiet()
                answer = invoke(args.declared, args, argv)
            text = (to_json(answer) if form == "json" else
                    render_table(args.declared.name, answer,
                                 colour=os.isatty(1) and not os.environ.get("NO_COLOR")))
        except EprunError as exc:
            _report_failure(exc, store)
            return exc.code
        except KeyboardInterrupt:
            _report_failure(EprunError("interrupted"), store)
            return 130
        except Exception as exc:  # the one place every other failure is reported
            return _unexpected_failure(exc, store, invocation)
        replay(store)
        return _answered(args, answer, text, invocation)
    finally:  # an unclosed file is a ResourceWarning (an error under PYTHONWARNINGS=error)
        if store is not None:
            store.close()
        if quieted and not invocation.program:  # onnxruntime's default level again
            OrtLog.set(OrtLog.DEFAULT)


def _unexpected_failure(exc: Exception, store, invocation: Invocation) -> int:
    """Any failure that is not an ``EprunError``, in words: an interruption that surfaced as
    another exception, running out of memory, a missing package; else its own message."""
    if invocation.interrupted and invocation.interrupted[-1] == signal.SIGINT:
        _report_failure(EprunError("interrupted"), store)
        return 130
    if isinstance(exc, ImportError) and ("failed to map segment" in str(exc)
                                         or "Cannot allocate memory" in str(exc)):
        exc = MemoryError(str(exc))
    if isinstance(exc, MemoryError):
        exc = EprunError(f"out of memory ({one_line(exc) or 'MemoryError'}); lower "
                         "--rows, or use --max-memory MB (layers, growth)")
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("onnx", "onnxruntime", "numpy"):
        exc = EprunError(
            f"eprun needs the Python package {exc.name!r}, which {sys.executable} does not "
            "have: run eprun with the Python that make lab set up (.venv/bin/python "
            "eprun.py ...), or install it with: python -m pip install onnx onnxruntime "
            "numpy")
    _report_failure(exc, store)
    return EXIT_FAILURE


def _answered(args: argparse.Namespace, answer: dict, text: str,
              invocation: Invocation) -> int:
    """Write the answer to stdout in one write; 1 with the verdict's line where it failed."""
    reason = args.declared.verdict(args, answer) if args.declared.verdict else None
    written = write_fd(1, (text + "\n").encode())
    invocation.answered = True
    if not written:
        say("eprun: error: cannot write the answer to stdout (closed, full or a closed pipe)")
        _silence_stdout()
        return EXIT_FAILURE
    if reason:
        say(f"eprun: {one_line(reason)}")
        return 1
    return 0


def _hold_closed_streams() -> set[int]:
    """Point a closed stdin, stdout or stderr at /dev/null (so that no file eprun opens takes
    its number and receives the answer or an error line by mistake); return which were
    closed."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    return closed


def _silence_stdout() -> None:
    """After a failed write of the answer, point fd 1 at /dev/null so that the interpreter's
    own flush at exit neither fails nor prints about it."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)


def _report_failure(exc: BaseException, store=None) -> None:
    """The one stderr line of a failure. What the command printed meanwhile (onnxruntime's
    banners and warnings, eprun's notes) is dropped, or shown first with ``EPRUN_DEBUG=1``,
    which also adds the traceback. An exception eprun did not expect is an internal error."""
    if debugging():
        import traceback

        replay(store)
        say("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
    if isinstance(exc, EprunError):
        message = str(exc)
    elif out_of_space(exc):
        where = f" writing {exc.filename!r}" if isinstance(exc.filename, str) else ""
        message = (f"{exc.strerror}{where}; free some space (or set TMPDIR to a folder with "
                   "room) and run again")
    else:
        message = (f"internal error: {type(exc).__name__}: {exc} (rerun with EPRUN_DEBUG=1 "
                   "and report it)")
    erase_progress()  # (a failure while a progress line is shown: the line goes first)
    try:
        say(f"eprun: error: {one_line(message)}")
    except MemoryError:
        say("eprun: error: out of memory")


if __name__ == "__main__":
    cli()
