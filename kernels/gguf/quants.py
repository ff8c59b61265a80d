"""The GGUF formats on the CPU: block layouts, numpy quantisers and float64 dequantisers.

Everything here follows llama.cpp's definitions (ggml/src/ggml-common.h for the structs
and tables, ggml/src/ggml-quants.c for `quantize_row_q8_0_ref`, `quantize_row_q2_K_ref`,
`dequantize_row_q2_K` and `dequantize_row_iq2_xxs`) and shares nothing with the MSL
kernels but the iq2_xxs grid, which is data (read from gguf.h, checked by the tests).

Packed tensors are uint8 arrays whose last axis holds whole blocks, byte for byte as in a
.gguf file; a row of `n` weights takes `n // weights * nbytes` bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

QK8_0 = 32  # weights per q8_0 block
QK_K = 256  # weights per super-block (q2_K, iq2_xxs)

# The C structs as numpy dtypes: fields in order, packed, little-endian.
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", QK8_0)])
BLOCK_Q2_K = np.dtype([("scales", "u1", QK_K // 16), ("qs", "u1", QK_K // 4),
                       ("d", "<f2"), ("dmin", "<f2")])
BLOCK_IQ2_XXS = np.dtype([("d", "<f2"), ("qs", "<u2", QK_K // 8)])
assert (BLOCK_Q8_0.itemsize, BLOCK_Q2_K.itemsize, BLOCK_IQ2_XXS.itemsize) == (34, 84, 66)

IQ2XXS_MAGNITUDES = (0x08, 0x19, 0x2B)  # the only bytes of iq2xxs_grid
HEADER = Path(__file__).with_name("gguf.h")


# --- tables ------------------------------------------------------------------------------


def header_table(name: str, header: Path = HEADER) -> list[int]:
    """The integers of the `constant` array `name` in gguf.h (the kernels' copy)."""
    match = re.search(rf"\b{name}\[\d+\]\s*=\s*\{{(.*?)\}};", header.read_text(), re.S)
    if match is None:
        raise ValueError(f"no table {name!r} in {header}")
    return [int(token, 0) for token in re.findall(r"0x[0-9a-fA-F]+|\d+", match.group(1))]


def iq2xxs_grid() -> np.ndarray:
    """The 256 grid points as uint8 magnitudes, shape (256, 8): byte j is weight j."""
    words = np.array(header_table("iq2xxs_grid"), dtype="<u8")
    return words.view(np.uint8).reshape(256, 8)


def sign_bytes(seven_bits: np.ndarray) -> np.ndarray:
    """Expand 7 stored sign bits to 8: bit 7 makes the count of negative signs even."""
    bits = np.asarray(seven_bits).astype(np.uint8) & 0x7F
    parity = np.unpackbits(bits[..., None], axis=-1).sum(axis=-1) & 1
    return bits | (parity.astype(np.uint8) << 7)


# --- float64 dequantisers (the oracles) --------------------------------------------------


def dequantize_q8_0(packed: np.ndarray) -> np.ndarray:
    blocks = _blocks(packed, BLOCK_Q8_0)
    w = blocks["d"].astype(np.float64)[..., None] * blocks["qs"]
    return _rows(w, packed)


def dequantize_q2_K(packed: np.ndarray) -> np.ndarray:
    blocks = _blocks(packed, BLOCK_Q2_K)
    i = np.arange(QK_K)
    # dequantize_row_q2_K walks each 128-weight half h in four passes s of 32 weights:
    # weight 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; scales[i // 16] serves it.
    half, pass_, lane = i // 128, (i % 128) // 32, i % 32
    q = (blocks["qs"][..., 32 * half + lane] >> (2 * pass_)) & 3
    sc = blocks["scales"][..., i // 16]
    d = blocks["d"].astype(np.float64)[..., None]
    dmin = blocks["dmin"].astype(np.float64)[..., None]
    return _rows(d * (sc & 15) * q - dmin * (sc >> 4), packed)


def dequantize_iq2_xxs(packed: np.ndarray) -> np.ndarray:
    blocks = _blocks(packed, BLOCK_IQ2_XXS)
    qs = blocks["qs"].astype(np.uint32).reshape(*blocks.shape, 8, 2, 2)  # group, word, half
    words = qs[..., 0] | (qs[..., 1] << 16)  # (..., 8 groups, 2 little-endian uint32)
    indices, signs_scale = words[..., 0], words[..., 1]
    part = np.arange(4, dtype=np.uint32)
    point = (indices[..., None] >> (8 * part)) & 0xFF  # (..., 8, 4)
    signs = sign_bytes((signs_scale[..., None] >> (7 * part)) & 0x7F)
    negative = (signs[..., None] >> np.arange(8, dtype=np.uint8)) & 1  # (..., 8, 4, 8)
    magnitude = iq2xxs_grid()[point].astype(np.float64)
    db = blocks["d"].astype(np.float64)[..., None] * (0.5 + (signs_scale >> 28)) * 0.25
    w = db[..., None, None] * magnitude * np.where(negative == 1, -1.0, 1.0)
    return _rows(w, packed)


# --- quantisers -----------------------------------------------------------------------------


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref: d = amax / 127, q = round-half-away(x / d), d stored as fp16."""
    xb = _weights(x, QK8_0)
    d = np.abs(xb).max(axis=-1) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    blocks = np.zeros(xb.shape[:-1], BLOCK_Q8_0)
    blocks["d"] = d
    blocks["qs"] = _round_half_away(xb * inv[..., None])
    return _packed(blocks, x)


def quantize_q2_K(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_K_ref: per 16 weights a 2-bit affine fit (make_qkx2_quants), its
    scale and min quantised to 4 bits against the super-block's fp16 d and dmin, then the
    weights requantised with the stored scales and packed in llama.cpp's order."""
    xs = _weights(x, QK_K).reshape(-1, QK_K // 16, 16)  # (blocks, sub-blocks, 16)
    scales, mins, levels = _fit_affine_2bit(xs)
    max_scale, max_min = scales.max(axis=-1), mins.max(axis=-1)
    blocks = np.zeros(xs.shape[0], BLOCK_Q2_K)
    sc = _nibbles(scales, max_scale) | (_nibbles(mins, max_min) << 4)
    blocks["scales"] = sc
    blocks["d"] = np.where(max_scale > 0, max_scale / np.float32(15), 0)
    blocks["dmin"] = np.where(max_min > 0, max_min / np.float32(15), 0)

    d = blocks["d"].astype(np.float32)[:, None] * (sc & 15)
    m = blocks["dmin"].astype(np.float32)[:, None] * (sc >> 4)
    safe_d = np.where(d == 0, 1, d)
    again = np.clip(np.rint((xs + m[..., None]) / safe_d[..., None]), 0, 3)
    levels = np.where(d[..., None] == 0, levels, again).astype(np.uint8).reshape(-1, QK_K)

    # qs[32h + l] = L[128h + l] | L[128h + l + 32] << 2 | L[.. + 64] << 4 | L[.. + 96] << 6
    quarters = levels.reshape(-1, 2, 4, 32)  # (blocks, half, pass, lane)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    blocks["qs"] = np.bitwise_or.reduce(quarters << shifts, axis=2).reshape(-1, QK_K // 4)
    return _packed(blocks.reshape(*x.shape[:-1], -1), x)


def quantize_iq2_xxs(x: np.ndarray) -> np.ndarray:
    """A plain search over the grid (not llama.cpp's importance-weighted quantiser).

    Signs are the weights' own, except that an odd count of negatives in 8 weights flips
    the sign of the smallest one (the format stores only even counts). d puts the block's
    largest weight on the top magnitude at the top group scale; each 32-weight group then
    takes the scale s in 0..15 and the four grid points that minimise its squared error.
    """
    xb = _weights(x, QK_K).reshape(-1, 8, 4, 8)  # (blocks, group, part, weight)
    magnitude = np.abs(xb)
    negative = xb < 0
    odd = negative.sum(axis=-1) % 2 == 1
    smallest = magnitude.argmin(axis=-1)[..., None] == np.arange(8)
    negative ^= odd[..., None] & smallest
    seven = (negative[..., :7] << np.arange(7)).sum(axis=-1).astype(np.uint32)

    top = max(IQ2XXS_MAGNITUDES) * (0.5 + 15) * 0.25
    d = (magnitude.max(axis=(1, 2, 3)) / top).astype(np.float16).astype(np.float64)
    grid = iq2xxs_grid().astype(np.float64)
    best_err = np.full(xb.shape[:2], np.inf)
    best_s = np.zeros(xb.shape[:2], np.uint32)
    best_points = np.zeros(xb.shape[:3], np.uint32)
    for s in range(16):
        db = d * (0.5 + s) * 0.25
        safe = np.where(db == 0, 1, db)[:, None, None, None]
        target = magnitude / safe  # in grid units
        # |t - g|^2 = |t|^2 - 2 t.g + |g|^2, for every grid point at once
        dist = (target**2).sum(-1)[..., None] - 2 * target @ grid.T + (grid**2).sum(-1)
        points = dist.argmin(axis=-1)
        err = (np.take_along_axis(dist, points[..., None], -1)[..., 0]).sum(-1)
        err = err * (safe[..., 0, 0] ** 2)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_points = np.where(better[..., None], points, best_points)

    part = np.arange(4, dtype=np.uint32)
    indices = (best_points << (8 * part)).sum(axis=-1)
    signs_scale = (seven << (7 * part)).sum(axis=-1) | (best_s << 28)
    words = np.stack([indices, signs_scale], axis=-1).astype("<u4")  # (blocks, 8, 2)
    blocks = np.zeros(xb.shape[0], BLOCK_IQ2_XXS)
    blocks["d"] = d
    blocks["qs"] = words.view("<u2").reshape(-1, QK_K // 8)
    return _packed(blocks.reshape(*x.shape[:-1], -1), x)


# --- helpers ---------------------------------------------------------------------------------


def _fit_affine_2bit(xs: np.ndarray, rmin: float = -0.5, rdelta: float = 0.1,
                     nstep: int = 15) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(16, 3, x, |x|, ..., use_mad=true) on every row of `xs` at once:
    x ~ scale * L - min with L in 0..3, chosen among nstep + 1 trial inverse scales by the
    |x|-weighted absolute error. Returns (scale, min, L); min >= 0 is subtracted."""
    nmax = np.float32(3)
    w = np.abs(xs)
    lo = np.minimum(xs.min(axis=-1), 0)
    hi = xs.max(axis=-1)
    flat = hi == lo
    span = np.where(flat, 1, hi - lo)
    sum_w, sum_x = w.sum(-1), (w * xs).sum(-1)

    def levels(inverse_scale: np.ndarray, low: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(inverse_scale[..., None] * (xs - low[..., None])), 0, nmax)

    def error(scale: np.ndarray, low: np.ndarray, lv: np.ndarray) -> np.ndarray:
        return (w * np.abs(scale[..., None] * lv + low[..., None] - xs)).sum(-1)

    inverse = nmax / span
    scale = 1 / inverse
    best = levels(inverse, lo)
    best_err = error(scale, lo, best)
    for step in range(nstep + 1):
        span = np.where(hi > lo, hi - lo, 1)  # lo moves when a trial wins
        stretch = np.float32(rmin) + np.float32(rdelta) * np.float32(step) + nmax
        trial = levels(stretch / span, lo)
        sum_l, sum_l2 = (w * trial).sum(-1), (w * trial * trial).sum(-1)
        sum_xl = (w * trial * xs).sum(-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe_det = np.where(ok, det, 1)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_det
        clamp = this_min > 0  # a positive offset is refitted as a pure scale
        this_min = np.where(clamp, 0, this_min)
        this_scale = np.where(clamp, sum_xl / np.where(sum_l2 > 0, sum_l2, 1), this_scale)
        better = ok & (error(this_scale, this_min, trial) < best_err)
        best_err = np.where(better, error(this_scale, this_min, trial), best_err)
        best = np.where(better[..., None], trial, best)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)  # later trials measure from the refitted min
    scale = np.where(flat, 0, scale).astype(np.float32)
    best = np.where(flat[..., None], 0, best)
    return scale, (-lo).astype(np.float32), best.astype(np.uint8)


def _nibbles(values: np.ndarray, top: np.ndarray) -> np.ndarray:
    """nearest_int(15 / top * v), all zero where top is 0."""
    inverse = np.divide(np.float32(15), top, out=np.zeros_like(top), where=top > 0)
    return np.rint(inverse[:, None] * values).astype(np.uint8)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves round away from zero (np.rint would round them to even)."""
    a = np.abs(v)
    return np.sign(v) * (np.floor(a) + np.floor(2 * (a - np.floor(a))))


def _weights(x: np.ndarray, per_block: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % per_block:
        raise ValueError(f"rows of {x.shape} do not split into blocks of {per_block}")
    return x.reshape(*x.shape[:-1], -1, per_block)


def _packed(blocks: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks).view(np.uint8).reshape(*np.shape(x)[:-1], -1)


def _blocks(packed: np.ndarray, block: np.dtype) -> np.ndarray:
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if packed.ndim == 0 or packed.shape[-1] % block.itemsize:
        raise ValueError(f"rows of {packed.shape} bytes are not whole {block.itemsize}-byte blocks")
    return packed.view(block)  # (..., blocks per row)


def _rows(w: np.ndarray, packed: np.ndarray) -> np.ndarray:
    return w.reshape(*np.shape(packed)[:-1], -1)
