"""Weight-only 4-bit (and 2- and 8-bit) quantized models for the tests, built with onnx.helper from
one float MLP (``mlp``), and a numpy oracle of the weights they compute with; every RNG is
seeded.

Two forms, each as onnxruntime's MatMulNBitsQuantizer (onnxruntime.quantization.
matmul_nbits_quantizer, its default round-to-nearest algorithm) writes it, names and bits alike,
without needing that quantizer (it imports onnx_ir, which the pinned stack does not have):

- ``to_matmul_nbits``: each MatMul with a constant weight becomes com.microsoft MatMulNBits,
  onnxruntime's contrib op. Its CPU kernel runs 4 bits from onnxruntime 1.16.2, but 1.16
  reads asymmetric zero points in an older layout (wrong sums wherever ceil(K / block_size)
  is odd) and rejects accuracy_level; 8 bits run from 1.23, 2 bits from 1.24.
- ``to_qdq_int4``: each constant weight becomes an INT4/UINT4 initializer read by an opset-21
  blockwise DequantizeLinear (axis 0), feeding the MatMul (opset 21, ir_version 10): runs on
  onnxruntime 1.19 and later, built with onnx 1.16 and later (TensorProto.INT4).

``pack_nbits`` and ``quantize_blockwise`` round as onnxruntime's MLAS blockwise quantizer does
(checked bit for bit against it); ``dequantize`` and ``forward`` are written from the operator
specs alone (MatMulNBits in onnxruntime's ContribOperators.md, DequantizeLinear-21 in ONNX's),
never from eprun's code, so a test can hold eprun's numbers against them.

A third form, ``to_gather_block_quantized``, quantizes an embedding table (``tiny_lm``'s Gather)
into com.microsoft GatherBlockQuantized, as MatMulNBitsQuantizer's numpy quantize_ndarray does
(checked bit for bit against it; it runs from onnxruntime 1.20). ``weight_by_onnxruntime`` is the
other oracle: the weight a node dequantizes, from onnxruntime running that node alone (on an
identity matrix, or on every index of a table).
"""
from __future__ import annotations

import models
import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


def mlp(features: int = 32, widths=(64, 64, 16), seed: int = 0, batch="N") -> onnx.ModelProto:
    """x [N, features] -> (MatMul W{k} -> Add b{k} -> Relu) per layer, the last without Relu;
    output "y". models.chain's graph, with each node named "layer{k}/{op}": the quantizer's
    nodes_to_exclude and its new nodes' names go by node name, and chain leaves them empty."""
    model = models.chain(features, tuple(widths), seed=seed, batch=batch)
    layer = -1
    for node in model.graph.node:
        layer += node.op_type == "MatMul"
        node.name = f"layer{layer}/{node.op_type}"
    return model


# -- rounding as MLAS does ------------------------------------------------------------------------

def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf, halves away from zero (np.round goes to even); in float64, where |x| + 0.5
    is exact for every float32 x (in float32, 0.49999997 + 0.5 would round up to 1)."""
    x = np.asarray(x, np.float64)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _block_params(blocks: np.ndarray, bits: int, symmetric: bool):
    """Scale (float32) and zero point (int, for unsigned codes) of each block, reducing the last
    axis, as MLAS's range2scale / range2scalezp compute them in float32.

    Symmetric: the value of largest magnitude (the minimum on a tie) maps to code 0, so
    scale = -v / 2^(bits-1) and the zero point is 2^(bits-1) (a negative scale is normal).
    Asymmetric: the range is widened to hold 0, scale = (max - min) / (2^bits - 1), and the
    zero point is -min / scale rounded and clamped. Zero padding changes neither."""
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    half = np.float32(1 << (bits - 1))
    if symmetric:
        peak = np.where(np.abs(high) > np.abs(low), high, low)
        return (-peak / half).astype(np.float32), np.full(low.shape, int(half))
    low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
    scale = ((high - low) / np.float32((1 << bits) - 1)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    zero_fp = np.where(scale == 0, low, np.float32(0) - low / safe).astype(np.float32)
    return scale, np.clip(_roundf(zero_fp), 0, (1 << bits) - 1).astype(np.int64)


def _reciprocal(scale: np.ndarray) -> np.ndarray:
    """1.0f / scale, and 0 for a zero scale (an all-zero block quantizes to its zero point)."""
    safe = np.where(scale == 0, np.float32(1), scale)
    return np.where(scale == 0, np.float32(0), np.float32(1) / safe).astype(np.float32)


def _pack(codes: np.ndarray, bits: int, pad: int = 0) -> np.ndarray:
    """Codes (0 .. 2^bits - 1) packed along the last axis, the first in the low bits of a byte
    (four 2-bit codes a byte, two 4-bit, one 8-bit); a count that fills no whole byte is padded
    with ``pad``."""
    codes = np.asarray(codes).astype(np.uint8)
    per_byte = 8 // bits
    if per_byte == 1:
        return codes
    short = -codes.shape[-1] % per_byte
    if short:
        codes = np.concatenate([codes, np.full((*codes.shape[:-1], short), pad, np.uint8)],
                               axis=-1)
    mask = (1 << bits) - 1
    packed = np.zeros((*codes.shape[:-1], codes.shape[-1] // per_byte), np.uint8)
    for j in range(per_byte):
        packed |= (codes[..., j::per_byte] & mask) << (bits * j)
    return packed


def _blocks_along_k(weight: np.ndarray, block_size: int) -> np.ndarray:
    """[K, N] -> [N, n_blocks, block_size], K zero padded to a multiple of block_size."""
    k, n = weight.shape
    n_blocks = -(-k // block_size)
    padded = np.zeros((n_blocks * block_size, n), np.float32)
    padded[:k] = weight
    return padded.T.reshape(n, n_blocks, block_size)


# -- the two forms' quantizers --------------------------------------------------------------------

def pack_nbits(weight, bits: int = 4, block_size: int = 32, symmetric: bool = True):
    """MatMulNBits' B, scales and zero_points for a float weight [K, N] (K zero padded to a
    multiple of block_size), equal bit for bit to MatMulNBitsQuantizer's (its C++ RTN):

    - packed: uint8 [N, n_blocks, block_size * bits / 8], column n's block b along K; 4-bit
      codes two a byte, the lower k in the low nibble; unsigned codes, q = clamp(roundf(w /
      scale + zero_point)) computed as w * (1.0f / scale) + zero_point in float32. Codes past K
      are 0, as the quantizer leaves them (the kernel never reads them), except that for an odd
      K the quantizer leaves a stale code in the last byte's high nibble: compare codes < K.
    - scales: float32 [N, n_blocks] (what the quantizer writes; the spec also reads the flat
      [N * n_blocks]).
    - zero_points: None when symmetric (the kernel's default, 2^(bits-1), applies); else uint8
      [N, ceil(n_blocks * bits / 8)], each column's packed like the codes; an odd n_blocks
      leaves a pad nibble of 2^(bits-1), as the quantizer writes it.
    """
    weight = np.asarray(weight, np.float32)
    k = weight.shape[0]
    blocks = _blocks_along_k(weight, block_size)
    scale, zero = _block_params(blocks, bits, symmetric)
    q = blocks * _reciprocal(scale)[..., None] + zero[..., None].astype(np.float32)
    codes = np.clip(_roundf(q.astype(np.float32)), 0, (1 << bits) - 1).astype(np.uint8)
    codes.reshape(codes.shape[0], -1)[:, k:] = 0  # a view: the padding's codes
    return _pack(codes, bits), scale, None if symmetric else _pack(zero, bits, 1 << (bits - 1))


def quantize_blockwise(weight, block_size: int = 32, signed: bool = True):
    """The QDQ form's int4 weight [K, N] (codes as int8), scales [n_blocks, N] float32 and
    zero points [n_blocks, N] (uint8 codes; None when signed), as MatMulNBitsQuantizer's QDQ
    format (its C++ quantize_qdq_matmul_4bits) makes them, bit for bit.

    signed (is_symmetric): INT4 codes -8..7, zero point 0, scale = -(value of largest
    magnitude) / 8. Unsigned: UINT4 codes with zero points, scale and zero point as in
    pack_nbits' asymmetric case. Unlike MatMulNBits, the code is roundf(w * (1.0f / scale))
    plus the zero point, rounded before the zero point is added (the two differ on ties), and
    the last block may be short: K is not padded."""
    weight = np.asarray(weight, np.float32)
    k = weight.shape[0]
    blocks = _blocks_along_k(weight, block_size)
    scale, zero = _block_params(blocks, 4, signed)
    if signed:
        zero = np.zeros_like(zero)
    scaled = (blocks * _reciprocal(scale)[..., None]).astype(np.float32)
    low, high = (-8, 7) if signed else (0, 15)
    codes = np.clip(_roundf(scaled) + zero[..., None], low, high).astype(np.int8)
    codes = np.ascontiguousarray(codes.reshape(codes.shape[0], -1)[:, :k].T)
    return codes, scale.T.copy(), None if signed else zero.T.astype(np.uint8)


# -- the graph rewrites ---------------------------------------------------------------------------

def _constant_matmuls(model: onnx.ModelProto, exclude) -> dict:
    """{MatMul node name: its weight [K, N]} for each MatMul whose B is an initializer and whose
    name is not in ``exclude`` (the quantizer's nodes_to_exclude)."""
    inits = {t.name: t for t in model.graph.initializer}
    return {node.name: numpy_helper.to_array(inits[node.input[1]]) for node in model.graph.node
            if node.op_type == "MatMul" and node.input[1] in inits and node.name not in exclude}


def _replace(model: onnx.ModelProto, rewrite, exclude) -> onnx.ModelProto:
    """A copy of ``model`` with each constant MatMul n replaced by ``rewrite(n, W)``'s nodes,
    whose initializers go to the end, and the initializers no node reads any more removed (the
    quantizer's order and clean_initializers)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = _constant_matmuls(model, exclude)
    nodes, inits = [], []
    for node in out.graph.node:
        if node.name in weights:
            new_nodes, new_inits = rewrite(node, weights[node.name])
            nodes += new_nodes
            inits += new_inits
        else:
            nodes.append(node)
    _set_nodes(out, nodes, inits)
    return out


def to_matmul_nbits(model: onnx.ModelProto, bits: int = 4, block_size: int = 32,
                    symmetric: bool = True, accuracy_level: int | None = None,
                    exclude=()) -> onnx.ModelProto:
    """``model`` with each MatMul n (weight W, not in ``exclude``) replaced by com.microsoft
    MatMulNBits "n_Q{bits}" reading the same A and writing the same output, from initializers
    "W_Q{bits}" (packed), "W_scales" and, asymmetric, "W_zero_points" (pack_nbits); attributes
    K, N, bits, block_size, and accuracy_level only when given and non-zero (as the quantizer:
    most EPs lack it). Adds the com.microsoft opset 1; the default opset and ir_version stay."""

    def rewrite(node, weight):
        packed, scales, zero_points = pack_nbits(weight, bits, block_size, symmetric)
        w = node.input[1]
        inits = [numpy_helper.from_array(packed, f"{w}_Q{bits}"),
                 numpy_helper.from_array(scales, f"{w}_scales")]
        if zero_points is not None:
            inits.append(numpy_helper.from_array(zero_points, f"{w}_zero_points"))
        attrs = {"K": weight.shape[0], "N": weight.shape[1], "bits": bits,
                 "block_size": block_size}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        return [helper.make_node("MatMulNBits", [node.input[0], *(t.name for t in inits)],
                                 [node.output[0]], name=f"{node.name}_Q{bits}",
                                 domain=MS_DOMAIN, **attrs)], inits

    out = _replace(model, rewrite, exclude)
    if not any(o.domain == MS_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out


def _int4_tensor(name: str, codes: np.ndarray, signed: bool) -> onnx.TensorProto:
    """An INT4 (signed) or UINT4 initializer of ``codes``' shape: ONNX packs the flattened
    codes two a byte, the first in the low nibble (TensorProto.INT4 needs onnx 1.16)."""
    data_type = onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4
    packed = _pack(codes.reshape(-1).astype(np.uint8) & 0xF, 4)
    return helper.make_tensor(name, data_type, list(codes.shape), packed.tobytes(), raw=True)


def to_qdq_int4(model: onnx.ModelProto, block_size: int = 32, signed: bool = True,
                exclude=()) -> onnx.ModelProto:
    """``model`` with each MatMul n (weight W, not in ``exclude``) reading W dequantized:
    DequantizeLinear "n_DQ_Q4" (axis 0, block_size; opset 21) of "W_DQ_Q4" (INT4 [K, N] when
    ``signed``, else UINT4), "W_DQ_scales" [ceil(K / block_size), N] and, unsigned,
    "W_DQ_zero_points" (UINT4, the scales' shape) writes "W_DQ_Q4_output", which MatMul
    "n_matmul_Q4" reads with the same A and output: MatMulNBitsQuantizer's QDQ format
    (is_symmetric = signed). The default opset is raised to 21 and ir_version to 10."""

    def rewrite(node, weight):
        codes, scales, zero_points = quantize_blockwise(weight, block_size, signed)
        w = node.input[1]
        inits = [_int4_tensor(f"{w}_DQ_Q4", codes, signed),
                 numpy_helper.from_array(scales, f"{w}_DQ_scales")]
        if zero_points is not None:
            inits.append(_int4_tensor(f"{w}_DQ_zero_points", zero_points, False))
        dq_out = f"{w}_DQ_Q4_output"
        return [helper.make_node("DequantizeLinear", [t.name for t in inits], [dq_out],
                                 name=f"{node.name}_DQ_Q4", axis=0, block_size=block_size),
                helper.make_node("MatMul", [node.input[0], dq_out], [node.output[0]],
                                 name=f"{node.name}_matmul_Q4")], inits

    out = _replace(model, rewrite, exclude)
    for opset in out.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 21)
    out.ir_version = max(out.ir_version, 10)
    return out


# -- the oracle: from the specs -------------------------------------------------------------------

def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 bytes -> codes along the last axis, the low bits first; the first ``count``."""
    if bits == 8:
        return data[..., :count].astype(np.int64)
    mask = (1 << bits) - 1
    codes = np.stack([(data >> (bits * j)) & mask for j in range(8 // bits)], axis=-1)
    return codes.reshape(*data.shape[:-1], -1)[..., :count].astype(np.int64)


def dequantize_nbits(packed, scales, zero_points, k: int, bits: int,
                     block_size: int) -> np.ndarray:
    """MatMulNBits' B as the float32 [K, N] weight it multiplies by: for column n and row k in
    block b = k // block_size, (code - zero_point[n, b]) * scale[n, b], the code the
    (k % block_size)-th of block b's blob (low bits first), the zero point 2^(bits-1) when
    zero_points is absent (uint8 zero points only)."""
    packed = np.asarray(packed, np.uint8)
    n, n_blocks = packed.shape[0], packed.shape[1]
    codes = _unpack(packed, bits, block_size)  # [N, n_blocks, block_size]
    scales = np.asarray(scales, np.float32).reshape(n, n_blocks)
    if zero_points is None:
        zero = np.full((n, n_blocks), 1 << (bits - 1))
    else:
        zero = _unpack(np.asarray(zero_points, np.uint8).reshape(n, -1), bits, n_blocks)
    weight = (codes - zero[..., None]).astype(np.float32) * scales[..., None]
    return weight.reshape(n, -1)[:, :k].T.copy()


def dequantize_blockwise(codes, scales, zero_points, block_size: int) -> np.ndarray:
    """DequantizeLinear-21 on axis 0 with block_size: y[i, j] = (x[i, j] - zero_point[i //
    block_size, j]) * scale[i // block_size, j] in float32, the zero point 0 when absent."""
    codes = np.asarray(codes, np.int64)
    rows = np.arange(codes.shape[0]) // block_size
    zero = 0 if zero_points is None else np.asarray(zero_points, np.int64)[rows]
    return (codes - zero).astype(np.float32) * np.asarray(scales, np.float32)[rows]


def _int4_codes(tensor: onnx.TensorProto) -> np.ndarray:
    """An INT4/UINT4 initializer's codes (int64) from its raw bytes, as ONNX packs them."""
    count = int(np.prod(tensor.dims))
    data = np.frombuffer(tensor.raw_data, np.uint8)
    codes = _unpack(data, 4, count)
    if tensor.data_type == onnx.TensorProto.INT4:
        codes = np.where(codes >= 8, codes - 16, codes)
    return codes.reshape(tuple(tensor.dims))


def dequantize(model: onnx.ModelProto, node_name: str) -> np.ndarray:
    """The float32 [K, N] weight that MatMulNBits or DequantizeLinear node ``node_name`` of
    ``model`` computes with, from its initializers (dequantize_nbits, dequantize_blockwise)."""
    node = next(n for n in model.graph.node if n.name == node_name)
    inits = {t.name: t for t in model.graph.initializer}
    given = [inits.get(name) for name in node.input]
    given += [None] * (4 - len(given))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "MatMulNBits":
        zero = None if given[3] is None else numpy_helper.to_array(given[3])
        return dequantize_nbits(numpy_helper.to_array(given[1]), numpy_helper.to_array(given[2]),
                                zero, attrs["K"], attrs["bits"], attrs["block_size"])
    if node.op_type == "DequantizeLinear" and attrs.get("axis", 1) == 0:
        zero = None if given[2] is None else _int4_codes(given[2])
        return dequantize_blockwise(_int4_codes(given[0]), numpy_helper.to_array(given[1]), zero,
                                    attrs["block_size"])
    raise ValueError(f"{node_name}: {node.op_type} is not a blockwise weight dequantization")


def forward(model: onnx.ModelProto, x) -> np.ndarray:
    """The model's first output for input ``x`` in numpy, float64, every weight the one
    ``dequantize`` gives: the oracle for mlp and its two quantized forms (MatMul, MatMulNBits,
    DequantizeLinear, Add and Relu only)."""
    return tensors(model, {model.graph.input[0].name: x})[model.graph.output[0].name]


def tensors(model: onnx.ModelProto, feeds: dict) -> dict:
    """Every tensor ``forward`` computes, by name (float64), from ``feeds``: the graph input
    and any tensor given a value of its own, which the nodes that would compute it leave as
    given (a segment fed its fp32 input, as ``layers --local`` feeds it)."""
    inits = {t.name: t for t in model.graph.initializer}
    values = {name: np.asarray(value, np.float64) for name, value in feeds.items()}

    def value(name):
        return values[name] if name in values else numpy_helper.to_array(inits[name])

    for node in model.graph.node:
        args = node.input
        if node.output[0] in values:
            continue
        if node.op_type in ("MatMulNBits", "DequantizeLinear"):
            weight = dequantize(model, node.name).astype(np.float64)
            result = value(args[0]) @ weight if node.op_type == "MatMulNBits" else weight
        elif node.op_type in ("MatMul", "Add"):
            a, b = value(args[0]).astype(np.float64), value(args[1]).astype(np.float64)
            result = a @ b if node.op_type == "MatMul" else a + b
        elif node.op_type == "Relu":
            result = np.maximum(value(args[0]), 0)
        else:
            raise ValueError(f"{node.name}: {node.op_type} is not in the oracle")
        values[node.output[0]] = result
    return values


# -- a quantized embedding: GatherBlockQuantized -------------------------------------------------

def tiny_lm(vocab: int = 100, dim: int = 64, hidden: int = 96, seed: int = 5) -> onnx.ModelProto:
    """ids [N] -> Gather "embed" of table E [vocab, dim] -> h; three MatMuls "q_proj",
    "k_proj", "v_proj" all read h (one activation, three weights of one shape: only the output
    names tell them apart) -> Add, Add -> s -> MatMul "o_proj" -> logits [N, vocab]."""
    rng = np.random.default_rng(seed)

    def weight(name, rows, cols):
        return numpy_helper.from_array(
            (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32), name)

    inits = [numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "E"),
             weight("Wq", dim, hidden), weight("Wk", dim, hidden), weight("Wv", dim, hidden),
             weight("Wo", hidden, vocab)]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"], name="embed", axis=0),
             helper.make_node("MatMul", ["h", "Wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["h", "Wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["h", "Wv"], ["v"], name="v_proj"),
             helper.make_node("Add", ["q", "k"], ["qk"], name="add0"),
             helper.make_node("Add", ["qk", "v"], ["s"], name="add1"),
             helper.make_node("MatMul", ["s", "Wo"], ["logits"], name="o_proj")]
    graph = helper.make_graph(
        nodes, "tiny_lm", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def quantize_table(table, block_size: int = 32, signed: bool = True):
    """A [V, D] table in blocks along D (quantize_axis 1), as MatMulNBitsQuantizer's numpy
    quantize_ndarray does it: (codes [V, D] as int8, scales [V, ceil(D / block_size)] float32,
    zero points of the scales' shape or None). Signed: scale = (value of largest magnitude) /
    -8, code = round(w / scale) (numpy's round, halves to even) clipped to -8..7. Unsigned: the
    range widened to hold 0, scale = (max - min) / 15, zero point and code rounded likewise,
    clipped to 0..15."""
    table = np.asarray(table, np.float32)
    dim = table.shape[1]
    codes, scales, zeros = np.zeros(table.shape, np.int8), [], []
    for start in range(0, dim, block_size):
        part = table[:, start:start + block_size]
        low, high = part.min(axis=1, keepdims=True), part.max(axis=1, keepdims=True)
        if signed:
            scale = np.where(np.abs(high) > np.abs(low), high, low) / -8.0
            safe = np.where(scale == 0, 1, scale)
            codes[:, start:start + block_size] = np.where(
                scale == 0, 0, part / safe).round().clip(-8, 7)
        else:
            low, high = np.minimum(low, 0), np.maximum(high, 0)
            scale = (high - low) / 15.0
            safe = np.where(scale == 0, 1, scale)
            zero = np.where(scale == 0, 8, -low / safe).round().clip(0, 15)
            codes[:, start:start + block_size] = np.where(
                scale == 0, 8, part / safe + zero).round().clip(0, 15)
            zeros.append(zero)
        scales.append(scale)
    return (codes, np.concatenate(scales, axis=1).astype(np.float32),
            None if signed else np.concatenate(zeros, axis=1).astype(np.int8))


def to_gather_block_quantized(model: onnx.ModelProto, block_size: int = 32,
                              signed: bool = True) -> onnx.ModelProto:
    """``model`` with each Gather g of a constant table E replaced by com.microsoft
    GatherBlockQuantized "g_Q4" (gather_axis as g's axis, quantize_axis 1, block_size) of
    "E_Q4" (INT4 when ``signed``, else UINT4, E's shape), the same indices, "E_scales" and,
    unsigned, "E_zero_points" (UINT4, the scales' shape), writing g's output: the
    quantizer's QOperator form of a Gather (quantize_table's numbers). Adds the com.microsoft
    opset 1; the default opset is raised to 21 and ir_version to 10 (INT4 tensors)."""
    inits = {t.name: t for t in model.graph.initializer}

    def rewrite(node, table):
        codes, scales, zero_points = quantize_table(table, block_size, signed)
        e = node.input[0]
        new = [_int4_tensor(f"{e}_Q4", codes, signed),
               numpy_helper.from_array(scales, f"{e}_scales")]
        if zero_points is not None:
            new.append(_int4_tensor(f"{e}_zero_points", zero_points, False))
        names = [new[0].name, node.input[1], new[1].name] + [t.name for t in new[2:]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        return [helper.make_node("GatherBlockQuantized", names, [node.output[0]],
                                 name=f"{node.name}_Q4", domain=MS_DOMAIN, gather_axis=axis,
                                 quantize_axis=1, block_size=block_size)], new

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, added = [], []
    for node in out.graph.node:
        if node.op_type == "Gather" and node.input[0] in inits:
            new_nodes, new_inits = rewrite(node, numpy_helper.to_array(inits[node.input[0]]))
            nodes += new_nodes
            added += new_inits
        else:
            nodes.append(node)
    _set_nodes(out, nodes, added)
    if not any(o.domain == MS_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    for opset in out.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 21)
    out.ir_version = max(out.ir_version, 10)
    return out


# -- the other oracle: onnxruntime running the node alone -----------------------------------------

def weight_by_onnxruntime(model: onnx.ModelProto, node_name: str) -> np.ndarray:
    """The float32 weight node ``node_name`` of ``model`` computes with, as onnxruntime computes
    it: the node alone in a model of its own, run on the CPU without graph optimizations.
    MatMulNBits and MatMulBnb4 multiply an identity matrix [K, K] (accuracy_level dropped, so
    the identity is not quantized): their product is the [K, N] weight; a DequantizeLinear
    writes it; a GatherBlockQuantized gathers every row of its table (gather_axis 0)."""
    import onnxruntime as ort

    node = onnx.NodeProto()
    node.CopyFrom(next(n for n in model.graph.node if n.name == node_name))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inits = {t.name: t for t in model.graph.initializer}
    feeds, inputs = {}, []
    if node.op_type in ("MatMulNBits", "MatMulBnb4"):
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        node.ClearField("attribute")
        node.attribute.extend(kept)
        feeds[node.input[0]] = np.eye(attrs["K"], dtype=np.float32)
        inputs.append(helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT,
                                                    [attrs["K"], attrs["K"]]))
    elif node.op_type == "GatherBlockQuantized":
        rows = inits[node.input[0]].dims[0]
        feeds[node.input[1]] = np.arange(rows, dtype=np.int64)
        inputs.append(helper.make_tensor_value_info(node.input[1], onnx.TensorProto.INT64,
                                                    [rows]))
    graph = helper.make_graph(
        [node], "one_node", inputs,
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [inits[name] for name in node.input if name in inits])
    alone = helper.make_model(graph, opset_imports=list(model.opset_import))
    alone.ir_version = model.ir_version
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(alone.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def run(model, x, *, level: str | None = None, config: dict | None = None) -> np.ndarray:
    """The model's first output for input ``x`` from a CPU session opened here (onnxruntime,
    never eprun's code). ``level`` names a GraphOptimizationLevel (default: onnxruntime's,
    ORT_ENABLE_ALL); ``config`` adds session config entries, e.g.
    {"session.qdq_matmulnbits_accuracy_level": "0"}: with optimizations on, onnxruntime fuses
    the QDQ form's DequantizeLinear -> MatMul into MatMulNBits at accuracy level 4 by default,
    which quantizes the activations to int8."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for key, entry in (config or {}).items():
        options.add_session_config_entry(key, entry)
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _set_nodes(out, nodes: list, added: list) -> None:
    """``out``'s graph with ``nodes`` in place of its own and ``added`` initializers, those no
    node reads any more dropped."""
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(added)
    read = {name for node in out.graph.node for name in node.input}
    kept = [tensor for tensor in out.graph.initializer if tensor.name in read]
    out.graph.ClearField("initializer")
    out.graph.initializer.extend(kept)
