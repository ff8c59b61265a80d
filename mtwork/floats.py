"""Floating-point facts the oracle measures with: bit patterns in each dtype, ULP
distances, tolerance bands, and the summary statistics of a diff.

ULP distances are counted in the comparison dtype: both values are rounded to it (float64
to float32 by round-to-odd, so that a second rounding to bfloat16 is correct), their bit
patterns are put on one ordered integer line, and the distance is the difference.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

__all__ = ["COMPLEX_PART", "DEFAULT_TOL", "FLOAT_WIDTH", "INTEGER", "SUPPORTED", "band",
           "comparison_dtype", "dtype_name", "parts", "cosine", "count_elements", "float_bits",
           "max_or_none", "max_rel_err", "same_bits", "ulp_distance", "ulp_stats",
           "within_band"]

FLOAT_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
COMPLEX_PART = {"complex64": "float32", "complex128": "float64"}
INTEGER = {"bool"} | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
SUPPORTED = set(FLOAT_WIDTH) | set(COMPLEX_PART) | INTEGER
DEFAULT_TOL = {"float64": 1e-10, "float32": 1e-4, "float16": 5e-3, "bfloat16": 5e-2}


def within_band(
    ac: np.ndarray,
    ec: np.ndarray,
    av: np.ndarray,
    ev: np.ndarray,
    abs_err: np.ndarray,
    finite: np.ndarray,
    atol: float,
    rtol: float,
) -> np.ndarray:
    # Native equality keeps integer comparisons exact (float64 would round large int64s) and
    # matches infinities of the same sign; NaN only matches NaN.
    close = (ac == ec) | (np.isnan(av) & np.isnan(ev))
    if atol or rtol:
        close |= finite & (abs_err <= atol + rtol * np.abs(ev))
    return close


def same_bits(ac: np.ndarray, ec: np.ndarray, cmp: str) -> np.ndarray:
    part = COMPLEX_PART.get(cmp, cmp)
    if part in FLOAT_WIDTH:
        return float_bits(ac, part) == float_bits(ec, part)
    return ac == ec


def ulp_distance(ac: np.ndarray, ec: np.ndarray, cmp: str) -> np.ndarray | None:
    """Per-element ULP distance in the comparison dtype (max over parts), None for integers.

    Both sides are first rounded to the comparison dtype. Meaningless where a side is NaN;
    callers mask those out.
    """
    part = COMPLEX_PART.get(cmp, cmp)
    if part not in FLOAT_WIDTH:
        return None
    return ordered_distance(float_bits(ac, part), float_bits(ec, part)).max(axis=-1)


def ordered_distance(a_bits: np.ndarray, e_bits: np.ndarray) -> np.ndarray:
    """How many representable values lie between two IEEE bit patterns (unsigned ints).

    Floats are sign-magnitude, so ordering by value is ordering by +magnitude / -magnitude.
    Both zeros have magnitude 0 and are 0 apart; the smallest subnormals of opposite sign
    are 2 apart. Stays in the patterns' own unsigned width, which cannot overflow: two
    magnitudes sum to at most 2**width - 2. That also keeps large arrays cheap.
    """
    uint = a_bits.dtype.type
    sign = uint(1) << uint(a_bits.dtype.itemsize * 8 - 1)
    magnitude = sign - uint(1)
    ma, me = a_bits & magnitude, e_bits & magnitude
    same_sign = (a_bits & sign) == (e_bits & sign)
    return np.where(same_sign, np.maximum(ma, me) - np.minimum(ma, me), ma + me)


def float_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns of x rounded to nearest (ties to even) in `dtype`, as unsigned ints."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return bfloat16_bits(x)
        target = np.dtype(dtype)
        return x.astype(target).view(f"uint{target.itemsize * 8}")


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    if x.dtype in (np.float16, np.float32):
        f32 = x.astype(np.float32)  # exact
    else:
        f32 = float32_round_to_odd(x.astype(np.float64))
    u = f32.view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    # NaN keeps its top bits (exact for widened bfloat16), but a payload that lived only in
    # the low bits would truncate to Inf, so such NaNs get the quiet bit.
    truncated = u >> np.uint32(16)
    nan = np.where(truncated & np.uint32(0x7F), truncated, truncated | np.uint32(0x40))
    return np.where(np.isnan(f32), nan, rounded).astype(np.uint16)


def float32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding inexact results to the neighbour with an odd last bit.

    Rounding to nearest twice (float64 -> float32 -> bfloat16) can land on the wrong
    bfloat16 when the first step creates an exact tie; rounding to odd first never does,
    because float32 keeps more than two extra bits below bfloat16's last place.
    """
    f = x.astype(np.float32)
    overshoot = np.abs(f.astype(np.float64)) > np.abs(x)
    f = np.where(overshoot, np.nextafter(f, np.float32(0)), f)
    inexact = f.astype(np.float64) != x  # NaNs too, harmlessly: only their top bits are kept
    return (f.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def ulp_stats(ulps: np.ndarray | None) -> tuple[int | None, float | None]:
    """Max and mean ULP distance, None when undefined (integers) or nothing is finite."""
    if ulps is None or not ulps.size:
        return None, None
    return int(ulps.max()), float(ulps.mean())


def count_elements(part_flags: np.ndarray) -> int:
    """Elements with the flag set on any part (a complex NaN counts once)."""
    return int(part_flags.any(axis=-1).sum())


def max_or_none(x: np.ndarray) -> float | None:
    return float(x.max()) if x.size else None


def max_rel_err(abs_err: np.ndarray, ev: np.ndarray, finite: np.ndarray) -> float | None:
    has_ref = finite & (ev != 0)
    with np.errstate(over="ignore"):
        return max_or_none(abs_err[has_ref] / np.abs(ev[has_ref]))


def cosine(av: np.ndarray, ev: np.ndarray) -> float | None:
    """Cosine similarity of the flattened finite pairs; None if either side is all zero.

    For complex data this is Re<a, e> / (|a| |e|), i.e. real and imaginary parts are
    treated as separate coordinates.
    """
    x, y = av.ravel(), ev.ravel()
    sx, sy = max_or_none(np.abs(x)), max_or_none(np.abs(y))
    if not sx or not sy:
        return None
    # Scale to max 1 first so squaring can neither overflow nor underflow.
    x, y = x / sx, y / sy
    cos = np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.clip(cos, -1.0, 1.0))


def comparison_dtype(dtype: Any, e: np.ndarray, a_dtype: str) -> str:
    cmp = a_dtype if dtype is None else dtype_name(dtype)
    if cmp not in SUPPORTED:
        raise ValueError(f"unsupported comparison dtype {cmp!r}; use one of {sorted(SUPPORTED)}")
    if cmp not in COMPLEX_PART and np.iscomplexobj(e):
        # A real comparison would silently drop the reference's imaginary part.
        raise ValueError(
            f"expected is complex ({e.dtype}) but the comparison dtype {cmp} is real; "
            "pass dtype='complex64' or dtype='complex128' to compare as complex"
        )
    return cmp


def dtype_name(dtype: Any) -> str:
    if isinstance(dtype, mx.Dtype):
        return str(dtype).rsplit(".", 1)[-1]
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype  # NumPy does not know this name
    return np.dtype(dtype).name


def band(cmp: str, atol: float | None, rtol: float | None) -> tuple[float, float, str]:
    """Resolve the tolerance band and describe where it came from."""
    if cmp in INTEGER:
        default, origin = 0.0, f"{cmp} exact"
    else:
        part = COMPLEX_PART.get(cmp, cmp)
        default, origin = DEFAULT_TOL[part], f"{cmp} default"
    if atol is not None or rtol is not None:
        origin = "custom"
    atol_ = default if atol is None else float(atol)
    rtol_ = default if rtol is None else float(rtol)
    return atol_, rtol_, f"{origin} (atol={atol_:g}, rtol={rtol_:g})"


def parts(x: np.ndarray, cmp: str) -> np.ndarray:
    """Add a trailing axis of components: (real, imag) for complex, the value otherwise.

    Every metric is computed per component and then reduced over this axis, so real and
    complex data share one code path.
    """
    if cmp in COMPLEX_PART:
        return np.stack([x.real, x.imag], axis=-1)
    return x[..., np.newaxis]
