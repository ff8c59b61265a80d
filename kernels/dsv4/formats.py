"""The low-precision weight formats of DeepSeek-V4 on the CPU, in float64 numpy.

* e2m1 (OCP Microscaling Formats (MX) v1.0, section 5.3.3): 1 sign, 2 exponent (bias 1)
  and 1 mantissa bit; exponent 0 is subnormal (0 or 0.5); no infinity and no NaN. Values
  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
* e8m0 (MX v1.0, section 5.4.1): an unsigned power of two 2^(e - 127); 0xFF is NaN.
* MXFP4: blocks of 32 e2m1 elements sharing one e8m0 scale (4.25 bits per weight).
  Two elements per byte, the even element in the low nibble.
* e4m3 (OCP 8-bit Floating Point Specification (OFP8) v1.0, "E4M3"): 1 sign, 4 exponent
  (bias 7) and 3 mantissa bits; exponent 0 is subnormal; no infinity; S.1111.111 (0x7F,
  0xFF) is NaN, so the largest finite value is 448 (0x7E).
* FP8 block: e4m3 weights with one float32 scale per (block x block) tile, 128 x 128 in
  DeepSeek's checkpoints.

The decoders follow the formulas above; the quantisers (round to nearest, ties to even,
saturating) make realistic inputs for the kernels and show the formats' error.
"""

from __future__ import annotations

import numpy as np

MX_BLOCK = 32  # elements sharing one e8m0 scale (MX v1.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of the largest e2m1 normal: 6 = 1.5 * 2^2
E4M3_MAX = 448.0
E4M3_NAN = 0x7F  # and 0xFF: the magnitude bits all set
E8M0_NAN = 0xFF
E8M0_BIAS = 127


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    """e2m1 codes (the low 4 bits of each value) to float64."""
    c = np.asarray(codes, dtype=np.int64) & 0xF
    sign = np.where(c & 0x8, -1.0, 1.0)
    exponent, mantissa = (c >> 1) & 0x3, c & 0x1
    magnitude = np.where(
        exponent == 0,
        mantissa * 0.5,  # subnormal: m/2 * 2^(1 - bias)
        np.ldexp(1.0 + mantissa / 2.0, exponent - 1),
    )
    return sign * magnitude


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes (uint8) to float64; 0x7F and 0xFF are NaN, 0x80 is -0."""
    c = np.asarray(codes, dtype=np.int64) & 0xFF
    sign = np.where(c & 0x80, -1.0, 1.0)
    exponent, mantissa = (c >> 3) & 0xF, c & 0x7
    magnitude = np.where(
        exponent == 0,
        np.ldexp(mantissa / 8.0, -6),  # subnormal: m/8 * 2^(1 - bias)
        np.ldexp(1.0 + mantissa / 8.0, exponent - 7),
    )
    return np.where((c & 0x7F) == E4M3_NAN, np.nan, sign * magnitude)


def decode_e8m0(codes: np.ndarray) -> np.ndarray:
    """e8m0 scale codes (uint8) to float64: 2^(e - 127), NaN for 0xFF."""
    e = np.asarray(codes, dtype=np.int64) & 0xFF
    return np.where(e == E8M0_NAN, np.nan, np.ldexp(1.0, e - E8M0_BIAS))


# --- packed tensors ------------------------------------------------------------------------


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes (..., n) to bytes (..., n/2): element 2i in the low nibble of byte i."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes (..., n/2) to 4-bit codes (..., n), the inverse of `pack_nibbles`."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2], out[..., 1::2] = p & 0xF, p >> 4
    return out


def dequant_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 to float64: packed (..., n/2) bytes and scales (..., n/32) e8m0 codes."""
    values = decode_e2m1(unpack_nibbles(packed))
    shape = values.shape
    blocks = values.reshape(shape[:-1] + (shape[-1] // MX_BLOCK, MX_BLOCK))
    if np.shape(scales) != blocks.shape[:-1]:
        raise ValueError(f"scales must have shape {blocks.shape[:-1]}, not {np.shape(scales)}")
    return (blocks * decode_e8m0(scales)[..., None]).reshape(shape)


def dequant_fp8_blocks(weight: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """FP8 block weights to float64: weight (rows, cols) e4m3 codes, scales
    (ceil(rows/block), ceil(cols/block)) float32, one per tile."""
    rows, cols = weight.shape
    tile_scale = np.repeat(np.repeat(np.asarray(scales, np.float64), block, 0), block, 1)
    return decode_e4m3(weight) * tile_scale[:rows, :cols]


# --- quantisers ----------------------------------------------------------------------------


def _nearest_code(x: np.ndarray, codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The code whose value is nearest to each |x|, ties to the even code (which is the
    even mantissa: round to nearest, ties to even). `values` ascend with `codes`, from 0."""
    mag = np.abs(np.asarray(x, np.float64))
    hi = np.clip(np.searchsorted(values, mag), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - values[lo], values[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    return np.where(pick_hi, codes[hi], codes[lo])


def encode_e2m1(x: np.ndarray) -> np.ndarray:
    """float to e2m1 codes: nearest, ties to even, saturating at +-6 (as MX v1.0 asks)."""
    codes = np.arange(8)
    nearest = _nearest_code(np.clip(x, -E2M1_MAX, E2M1_MAX), codes, decode_e2m1(codes))
    return (nearest | np.where(np.signbit(x), 8, 0)).astype(np.uint8)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float to e4m3 codes: nearest, ties to even, saturating at +-448."""
    codes = np.arange(E4M3_NAN)  # the finite magnitudes 0x00..0x7E
    nearest = _nearest_code(np.clip(x, -E4M3_MAX, E4M3_MAX), codes, decode_e4m3(codes))
    return (nearest | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MX v1.0 section 6.3: shared exponent floor(log2(amax)) - emax(e2m1), elements
    rounded to e2m1 (saturating). Returns (packed bytes, e8m0 scale codes)."""
    w = np.asarray(w, np.float64)
    blocks = w.reshape(w.shape[:-1] + (w.shape[-1] // MX_BLOCK, MX_BLOCK))
    amax = np.abs(blocks).max(axis=-1)
    exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))), -E8M0_BIAS)
    exponent = np.clip(exponent - E2M1_EMAX, -E8M0_BIAS, E8M0_BIAS)
    codes = encode_e2m1(blocks / np.ldexp(1.0, exponent.astype(np.int64))[..., None])
    return pack_nibbles(codes.reshape(w.shape)), (exponent + E8M0_BIAS).astype(np.uint8)


def quantize_fp8_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (block x block) tile: scale = amax / 448 (float32), codes = e4m3(w / scale).
    Returns (codes, scales)."""
    w = np.asarray(w, np.float64)
    rows, cols = w.shape
    tiles_r, tiles_c = -(-rows // block), -(-cols // block)
    padded = np.zeros((tiles_r * block, tiles_c * block))
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(tiles_r, block, tiles_c, block)).max(axis=(1, 3))
    scales = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    full = np.repeat(np.repeat(scales.astype(np.float64), block, 0), block, 1)[:rows, :cols]
    return encode_e4m3(w / full), scales
