"""Compare a kernel's output with a reference and decide whether it is close enough.

`diff` measures how far `actual` (the kernel output) is from `expected` (usually a float64
numpy oracle) and returns a `DiffReport`: absolute, relative and ULP errors, cosine
similarity, NaN/Inf accounting, the first mismatching indices and a PASS/FAIL verdict.

Conventions used throughout:

* The comparison dtype is `actual`'s dtype unless `dtype=` overrides it. It sets the default
  tolerance band and the unit of ULP distances.
* Absolute, relative, ULP and cosine figures are taken over *finite pairs* (elements where
  both sides are finite). Non-finite elements are judged separately: NaN matches NaN, an
  infinity matches the same infinity, anything else involving NaN or Inf is a mismatch.
* Relative error is `|actual - expected| / |expected|` over finite pairs whose expected value
  is nonzero; elements with `expected == 0` are judged by `atol` alone and show up in the
  absolute error. It is `None` when no element qualifies.
* Complex numbers are compared part by part (real, imaginary). An element's error is the
  larger of its two parts' errors and it mismatches if either part does.
* Figures that are not defined for the data (e.g. ULPs of integers) are `None`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go

ArrayLike = Any  # mx.array, np.ndarray, Python scalar or nested list
Scalar = bool | int | float | complex

_FLOAT_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
_COMPLEX_PART = {"complex64": "float32", "complex128": "float64"}
_INTEGER = {"bool"} | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
_SUPPORTED = set(_FLOAT_WIDTH) | set(_COMPLEX_PART) | _INTEGER
_DEFAULT_TOL = {"float64": 1e-10, "float32": 1e-4, "float16": 5e-3, "bfloat16": 5e-2}
_FLOAT_FIELDS = ("atol", "rtol", "max_abs_err", "max_rel_err", "mean_ulp", "cosine")
# Heatmaps are max-pooled down to this many cells per side so figures stay light in
# notebooks and published HTML.
_MAX_HEATMAP_SIDE = 256
_MAX_MARKERS = 2000
_PASS_COLOUR, _FAIL_COLOUR = "#1a7f37", "#cf222e"


@dataclass(frozen=True)
class Mismatch:
    """One mismatching element: its multi-index and both values as given."""

    index: tuple[int, ...]
    actual: Scalar
    expected: Scalar


@dataclass(frozen=True)
class _Elements:
    """Per-element data for plots, shaped like the compared arrays."""

    abs_err: np.ndarray  # |actual - expected|, NaN where a side is not finite
    distance: np.ndarray  # ULPs, or |actual - expected| for integer dtypes; NaN likewise
    mismatch: np.ndarray  # bool


@dataclass
class DiffReport:
    """Outcome of `diff`. Public fields survive `to_dict`; `_elements` only feeds `plot`."""

    ok: bool
    name: str | None
    dtype: str  # comparison dtype: sets the default band and the ULP unit
    actual_dtype: str
    expected_dtype: str
    shape: tuple[int, ...]
    bitwise: bool
    band: str  # how the verdict was reached, e.g. "float32 default (atol=0.0001, rtol=0.0001)"
    atol: float
    rtol: float
    size: int
    n_mismatch: int
    max_abs_err: float | None
    max_rel_err: float | None
    max_ulp: int | None
    mean_ulp: float | None
    cosine: float | None
    nan_actual: int
    nan_expected: int
    inf_actual: int
    inf_expected: int
    mismatches: list[Mismatch]
    _elements: _Elements | None = field(default=None, repr=False, compare=False)

    @property
    def mismatch_fraction(self) -> float:
        return self.n_mismatch / self.size if self.size else 0.0

    def __str__(self) -> str:
        lines = [_headline(self)]
        lines += ["  " + "   ".join(f"{k} {v}" for k, v in group) for group in _metric_groups(self)]
        if self.mismatches:
            lines.append("  first mismatches (row-major):")
            lines += [f"    {_format_mismatch(self, m)}" for m in self.mismatches]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return _report_html(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (non-finite floats become "nan"/"inf"/"-inf", complex [re, im])."""
        out: dict[str, Any] = {}
        for f in _public_fields():
            value = getattr(self, f.name)
            if f.name == "mismatches":
                value = [
                    {
                        "index": list(m.index),
                        "actual": _to_json(m.actual),
                        "expected": _to_json(m.expected),
                    }
                    for m in value
                ]
            elif f.name == "shape":
                value = list(value)
            else:
                value = _to_json(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffReport:
        """Inverse of `to_dict`; the result prints and renders but cannot `plot`."""
        kwargs = {f.name: data[f.name] for f in _public_fields()}
        kwargs["shape"] = tuple(kwargs["shape"])
        for key in _FLOAT_FIELDS:
            kwargs[key] = _from_json(kwargs[key])
        kwargs["mismatches"] = [
            Mismatch(tuple(m["index"]), _from_json(m["actual"]), _from_json(m["expected"]))
            for m in kwargs["mismatches"]
        ]
        return cls(**kwargs)

    def plot(self, kind: Literal["both", "heatmap", "histogram"] = "both") -> go.Figure:
        """Heatmap of |actual - expected| and/or a histogram of ULP distances.

        The heatmap is 2-D: 0-d/1-D data is drawn as one row, N-D data has its leading
        dimensions collapsed into rows; large arrays are max-pooled into blocks. Mismatching
        cells are marked with red crosses. The histogram bins ULP distances (or, for
        integers, |actual - expected|) in powers of two with a log count axis.
        """
        if self._elements is None:
            raise ValueError(
                "this report carries no element data (it was restored from a dict); "
                "run diff() again to plot it"
            )
        if kind == "heatmap":
            return _heatmap_figure(self, self._elements)
        if kind == "histogram":
            return _histogram_figure(self, self._elements)
        if kind == "both":
            return _combined_figure(self, self._elements)
        raise ValueError(f"kind must be 'both', 'heatmap' or 'histogram', not {kind!r}")


def diff(
    actual: ArrayLike,
    expected: ArrayLike,
    *,
    dtype: Any = None,
    atol: float | None = None,
    rtol: float | None = None,
    bitwise: bool = False,
    max_listed: int = 10,
    name: str | None = None,
) -> DiffReport:
    """Compare a kernel output with a reference; see the module docstring for conventions.

    Elements pass when `|actual - expected| <= atol + rtol * |expected|`; atol and rtol
    default by comparison dtype (float64 1e-10, float32 and complex64 1e-4, float16 5e-3,
    bfloat16 5e-2, integers and bool exact). `dtype` (numpy, mlx or a name such as
    "bfloat16") overrides the comparison dtype. With `bitwise=True` elements pass only when
    their bit patterns are equal, which needs both sides in the same dtype.
    """
    if max_listed < 0:
        raise ValueError(f"max_listed must be >= 0, got {max_listed}")
    a, a_dtype = _to_numpy(actual)
    e, e_dtype = _to_numpy(expected)
    e = _check_compatible(a, a_dtype, e, e_dtype)
    cmp = _comparison_dtype(dtype, e, a_dtype)
    if bitwise:
        _check_bitwise(a_dtype, e_dtype, cmp, atol, rtol)
        atol_, rtol_, band = 0.0, 0.0, "bitwise"
    else:
        atol_, rtol_, band = _band(cmp, atol, rtol)

    ac, ec = _parts(a, cmp), _parts(e, cmp)
    # Widening signalling NaNs raises "invalid"; Inf - Inf does too, and huge finite pairs
    # can overflow. Those elements are judged by the NaN/Inf rules, so silence all three.
    with np.errstate(over="ignore", invalid="ignore"):
        av, ev = ac.astype(np.float64), ec.astype(np.float64)
        finite = np.isfinite(av) & np.isfinite(ev)
        abs_err = np.where(finite, np.abs(av - ev), np.nan)
    if bitwise:
        same = _same_bits(ac, ec, cmp)
    else:
        same = _within_band(ac, ec, av, ev, abs_err, finite, atol_, rtol_)
    mismatch = ~same.all(axis=-1)
    pair_finite = finite.all(axis=-1)
    ulps = _ulp_distance(ac, ec, cmp)
    max_ulp, mean_ulp = _ulp_stats(None if ulps is None else ulps[pair_finite])
    elem_abs_err = abs_err.max(axis=-1)  # NaN wherever a part is not finite
    # Integer outputs checked against a float reference can be off by a fraction; round up
    # so the error lands in a nonzero histogram bin.
    distance = np.ceil(elem_abs_err) if ulps is None else ulps.astype(np.float64)

    return DiffReport(
        ok=not bool(mismatch.any()),
        name=name,
        dtype=cmp,
        actual_dtype=a_dtype,
        expected_dtype=e_dtype,
        shape=tuple(a.shape),
        bitwise=bitwise,
        band=band,
        atol=atol_,
        rtol=rtol_,
        size=int(a.size),
        n_mismatch=int(mismatch.sum()),
        max_abs_err=_max_or_none(abs_err[finite]),
        max_rel_err=_max_rel_err(abs_err, ev, finite),
        max_ulp=max_ulp,
        mean_ulp=mean_ulp,
        cosine=_cosine(av[pair_finite], ev[pair_finite]),
        nan_actual=_count_elements(np.isnan(av)),
        nan_expected=_count_elements(np.isnan(ev)),
        inf_actual=_count_elements(np.isinf(av)),
        inf_expected=_count_elements(np.isinf(ev)),
        mismatches=_first_mismatches(a, e, mismatch, max_listed),
        _elements=_Elements(elem_abs_err, np.where(pair_finite, distance, np.nan), mismatch),
    )


def assert_close(actual: ArrayLike, expected: ArrayLike, **kw: Any) -> DiffReport:
    """`diff` then raise AssertionError carrying the text summary if the verdict is FAIL."""
    __tracebackhide__ = True  # pytest: point failures at the caller, not at this helper
    report = diff(actual, expected, **kw)
    if not report.ok:
        raise AssertionError(str(report))
    return report


def assert_bitwise_equal(
    actual: ArrayLike, expected: ArrayLike, *, max_listed: int = 10, name: str | None = None
) -> DiffReport:
    """Raise AssertionError with the summary unless both sides have identical bit patterns."""
    __tracebackhide__ = True
    return assert_close(actual, expected, bitwise=True, max_listed=max_listed, name=name)


# --- loading -------------------------------------------------------------------------------


def _to_numpy(x: ArrayLike) -> tuple[np.ndarray, str]:
    """Return the data as numpy without losing bits, plus its dtype name."""
    if isinstance(x, mx.array):
        if x.dtype == mx.bfloat16:
            # NumPy has no bfloat16: widen the raw bits into the top half of a float32,
            # which represents every bfloat16 value (NaN payloads included) exactly.
            bits = np.array(x.view(mx.uint16)).astype(np.uint32) << 16
            return bits.view(np.float32), "bfloat16"
        x = np.array(x)
    arr = np.asarray(x)
    return arr, arr.dtype.name


def _check_compatible(a: np.ndarray, a_dtype: str, e: np.ndarray, e_dtype: str) -> np.ndarray:
    """Validate both sides and return `e` broadcast to `a`'s shape (only size-1 broadcasts)."""
    both = (
        f"actual has shape {a.shape} and dtype {a_dtype}; "
        f"expected has shape {e.shape} and dtype {e_dtype}"
    )
    for side, arr in (("actual", a), ("expected", e)):
        if arr.dtype.kind not in "biufc":
            raise ValueError(
                f"{side} is not numeric ({both}); convert it to a numeric array, "
                "e.g. np.asarray(x, dtype=np.float64)"
            )
    if e.shape == a.shape:
        return e
    if e.size == 1:
        return np.broadcast_to(e.reshape(()), a.shape)
    raise ValueError(
        f"shape mismatch: {both}. Pass arrays of equal shape (reshape or transpose the "
        "reference), or an expected of size 1 to compare every element with one value"
    )


def _comparison_dtype(dtype: Any, e: np.ndarray, a_dtype: str) -> str:
    cmp = a_dtype if dtype is None else _dtype_name(dtype)
    if cmp not in _SUPPORTED:
        raise ValueError(f"unsupported comparison dtype {cmp!r}; use one of {sorted(_SUPPORTED)}")
    if cmp not in _COMPLEX_PART and np.iscomplexobj(e):
        # A real comparison would silently drop the reference's imaginary part.
        raise ValueError(
            f"expected is complex ({e.dtype}) but the comparison dtype {cmp} is real; "
            "pass dtype='complex64' or dtype='complex128' to compare as complex"
        )
    return cmp


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, mx.Dtype):
        return str(dtype).rsplit(".", 1)[-1]
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype  # NumPy does not know this name
    return np.dtype(dtype).name


def _check_bitwise(
    a_dtype: str, e_dtype: str, cmp: str, atol: float | None, rtol: float | None
) -> None:
    if atol is not None or rtol is not None:
        raise ValueError("bitwise=True compares bit patterns; drop atol/rtol or bitwise")
    if not a_dtype == e_dtype == cmp:
        raise ValueError(
            f"bitwise comparison needs one dtype on both sides, got actual {a_dtype}, "
            f"expected {e_dtype}, comparison {cmp}; cast one side, or compare with tolerances"
        )


def _band(cmp: str, atol: float | None, rtol: float | None) -> tuple[float, float, str]:
    """Resolve the tolerance band and describe where it came from."""
    if cmp in _INTEGER:
        default, origin = 0.0, f"{cmp} exact"
    else:
        part = _COMPLEX_PART.get(cmp, cmp)
        default, origin = _DEFAULT_TOL[part], f"{cmp} default"
    if atol is not None or rtol is not None:
        origin = "custom"
    atol_ = default if atol is None else float(atol)
    rtol_ = default if rtol is None else float(rtol)
    return atol_, rtol_, f"{origin} (atol={atol_:g}, rtol={rtol_:g})"


def _parts(x: np.ndarray, cmp: str) -> np.ndarray:
    """Add a trailing axis of components: (real, imag) for complex, the value otherwise.

    Every metric is computed per component and then reduced over this axis, so real and
    complex data share one code path.
    """
    if cmp in _COMPLEX_PART:
        return np.stack([x.real, x.imag], axis=-1)
    return x[..., np.newaxis]


# --- element tests and metrics --------------------------------------------------------------


def _within_band(
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


def _same_bits(ac: np.ndarray, ec: np.ndarray, cmp: str) -> np.ndarray:
    part = _COMPLEX_PART.get(cmp, cmp)
    if part in _FLOAT_WIDTH:
        return _float_bits(ac, part) == _float_bits(ec, part)
    return ac == ec


def _ulp_distance(ac: np.ndarray, ec: np.ndarray, cmp: str) -> np.ndarray | None:
    """Per-element ULP distance in the comparison dtype (max over parts), None for integers.

    Both sides are first rounded to the comparison dtype. Meaningless where a side is NaN;
    callers mask those out.
    """
    part = _COMPLEX_PART.get(cmp, cmp)
    if part not in _FLOAT_WIDTH:
        return None
    return _ordered_distance(_float_bits(ac, part), _float_bits(ec, part)).max(axis=-1)


def _ordered_distance(a_bits: np.ndarray, e_bits: np.ndarray) -> np.ndarray:
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


def _float_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns of x rounded to nearest (ties to even) in `dtype`, as unsigned ints."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return _bfloat16_bits(x)
        target = np.dtype(dtype)
        return x.astype(target).view(f"uint{target.itemsize * 8}")


def _bfloat16_bits(x: np.ndarray) -> np.ndarray:
    if x.dtype in (np.float16, np.float32):
        f32 = x.astype(np.float32)  # exact
    else:
        f32 = _float32_round_to_odd(x.astype(np.float64))
    u = f32.view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    # NaN keeps its top bits (exact for widened bfloat16), but a payload that lived only in
    # the low bits would truncate to Inf, so such NaNs get the quiet bit.
    truncated = u >> np.uint32(16)
    nan = np.where(truncated & np.uint32(0x7F), truncated, truncated | np.uint32(0x40))
    return np.where(np.isnan(f32), nan, rounded).astype(np.uint16)


def _float32_round_to_odd(x: np.ndarray) -> np.ndarray:
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


def _ulp_stats(ulps: np.ndarray | None) -> tuple[int | None, float | None]:
    """Max and mean ULP distance, None when undefined (integers) or nothing is finite."""
    if ulps is None or not ulps.size:
        return None, None
    return int(ulps.max()), float(ulps.mean())


def _count_elements(part_flags: np.ndarray) -> int:
    """Elements with the flag set on any part (a complex NaN counts once)."""
    return int(part_flags.any(axis=-1).sum())


def _max_or_none(x: np.ndarray) -> float | None:
    return float(x.max()) if x.size else None


def _max_rel_err(abs_err: np.ndarray, ev: np.ndarray, finite: np.ndarray) -> float | None:
    has_ref = finite & (ev != 0)
    with np.errstate(over="ignore"):
        return _max_or_none(abs_err[has_ref] / np.abs(ev[has_ref]))


def _cosine(av: np.ndarray, ev: np.ndarray) -> float | None:
    """Cosine similarity of the flattened finite pairs; None if either side is all zero.

    For complex data this is Re<a, e> / (|a| |e|), i.e. real and imaginary parts are
    treated as separate coordinates.
    """
    x, y = av.ravel(), ev.ravel()
    sx, sy = _max_or_none(np.abs(x)), _max_or_none(np.abs(y))
    if not sx or not sy:
        return None
    # Scale to max 1 first so squaring can neither overflow nor underflow.
    x, y = x / sx, y / sy
    cos = np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.clip(cos, -1.0, 1.0))


def _first_mismatches(
    a: np.ndarray, e: np.ndarray, mismatch: np.ndarray, max_listed: int
) -> list[Mismatch]:
    listed = []
    for flat in np.flatnonzero(mismatch)[:max_listed]:
        index = tuple(int(i) for i in np.unravel_index(flat, mismatch.shape))
        listed.append(Mismatch(index, a[index].item(), e[index].item()))
    return listed


# --- serialisation --------------------------------------------------------------------------


def _public_fields() -> list[Any]:
    return [f for f in fields(DiffReport) if not f.name.startswith("_")]


def _to_json(value: Any) -> Any:
    if isinstance(value, complex):
        return [_to_json(value.real), _to_json(value.imag)]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf" or "-inf": strict JSON has no such numbers
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return complex(_from_json(value[0]), _from_json(value[1]))
    if isinstance(value, str):
        return float(value)
    return value


# --- text and HTML --------------------------------------------------------------------------


def _headline(r: DiffReport) -> str:
    verdict = "PASS" if r.ok else "FAIL"
    return f"{verdict} {r.name}" if r.name else verdict


def _metric_groups(r: DiffReport) -> list[list[tuple[str, str]]]:
    """Label/value pairs shared by the text and HTML renderings, grouped into text lines."""
    sides = (("actual", r.actual_dtype), ("expected", r.expected_dtype))
    others = ", ".join(f"{side} {d}" for side, d in sides if d != r.dtype)
    dtype = f"{r.dtype} ({others})" if others else r.dtype
    pct = f"{100 * r.mismatch_fraction:.3g}%"
    return [
        [("dtype", dtype), ("shape", str(r.shape)), ("band", r.band)],
        [
            ("max abs err", _fmt_float(r.max_abs_err, ".3e")),
            ("max rel err", _fmt_float(r.max_rel_err, ".3e")),
            ("ULP max", "n/a" if r.max_ulp is None else str(r.max_ulp)),
            ("ULP mean", _fmt_float(r.mean_ulp, ".3g")),
            ("cosine", _fmt_float(r.cosine, ".9f")),
        ],
        [
            ("mismatches", f"{r.n_mismatch}/{r.size} ({pct})"),
            ("NaN actual/expected", f"{r.nan_actual}/{r.nan_expected}"),
            ("Inf actual/expected", f"{r.inf_actual}/{r.inf_expected}"),
        ],
    ]


def _fmt_float(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _format_mismatch(r: DiffReport, m: Mismatch) -> str:
    index = "[" + ", ".join(map(str, m.index)) + "]"
    actual = _fmt_value(m.actual, r.actual_dtype)
    expected = _fmt_value(m.expected, r.expected_dtype)
    return f"{index} actual={actual} expected={expected}"


def _fmt_value(value: Scalar, dtype: str) -> str:
    """Shortest text that identifies the value in its own dtype."""
    if isinstance(value, complex):
        part = _COMPLEX_PART.get(dtype, "float64")
        real, imag = _fmt_value(value.real, part), _fmt_value(value.imag, part)
        return f"({real}{'' if imag.startswith('-') else '+'}{imag}j)"
    if not isinstance(value, float):
        return str(value)
    if dtype == "bfloat16":
        return f"{value:.4g}"  # 4 significant digits round-trip bfloat16's 8-bit mantissa
    if dtype in ("float16", "float32"):
        return str(np.dtype(dtype).type(value))
    return repr(value)


def _report_html(r: DiffReport) -> str:
    colour = _PASS_COLOUR if r.ok else _FAIL_COLOUR
    cell = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
    rows = [
        f'<tr><th style="{cell}">{html.escape(k)}</th><td style="{cell}">{html.escape(v)}</td></tr>'
        for group in _metric_groups(r)
        for k, v in group
    ]
    if r.mismatches:
        listed = "<br>".join(html.escape(_format_mismatch(r, m)) for m in r.mismatches)
        rows.append(
            f'<tr><th style="{cell}">first mismatches</th>'
            f'<td style="{cell};font-family:monospace">{listed}</td></tr>'
        )
    head = (
        f'<tr><th colspan="2" style="{cell};background:{colour};color:white;font-size:1.1em">'
        f"{html.escape(_headline(r))}</th></tr>"
    )
    return (
        '<table style="border-collapse:collapse;font-family:sans-serif;font-size:0.9em">'
        f"{head}{''.join(rows)}</table>"
    )


# --- plots ----------------------------------------------------------------------------------


def _title(r: DiffReport) -> str:
    return f"{_headline(r)}: {r.dtype} {r.shape}, {r.n_mismatch}/{r.size} mismatches"


def _heatmap_figure(r: DiffReport, el: _Elements) -> go.Figure:
    import plotly.graph_objects as go  # deferred: sweeps import this module but never plot

    traces, subtitle = _heatmap_traces(el)
    fig = go.Figure(traces)
    fig.update_layout(title=f"{_title(r)}<br><sub>{subtitle}</sub>")
    fig.update_yaxes(autorange="reversed")
    return _style(fig, r)


def _histogram_figure(r: DiffReport, el: _Elements) -> go.Figure:
    import plotly.graph_objects as go

    trace, subtitle = _histogram_trace(el, ulps=r.max_ulp is not None)
    fig = go.Figure(trace)
    fig.update_layout(title=f"{_title(r)}<br><sub>{subtitle}</sub>")
    fig.update_yaxes(type="log", title="count")
    return _style(fig, r)


def _combined_figure(r: DiffReport, el: _Elements) -> go.Figure:
    from plotly.subplots import make_subplots

    heat, heat_title = _heatmap_traces(el)
    hist, hist_title = _histogram_trace(el, ulps=r.max_ulp is not None)
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.68, 0.32],
        vertical_spacing=0.14,
        subplot_titles=[heat_title, hist_title],
    )
    for trace in heat:
        fig.add_trace(trace, row=1, col=1)
    fig.add_trace(hist, row=2, col=1)
    # Keep the colour bar beside the heatmap instead of spanning both rows.
    low, high = fig.layout.yaxis.domain
    fig.update_traces(
        colorbar={"y": (low + high) / 2, "len": high - low, "yanchor": "middle"},
        selector={"type": "heatmap"},
    )
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(type="log", title="count", row=2, col=1)
    fig.update_layout(title=_title(r), height=700)
    return _style(fig, r)


def _style(fig: go.Figure, r: DiffReport) -> go.Figure:
    fig.update_layout(
        title_font_color=_PASS_COLOUR if r.ok else _FAIL_COLOUR,
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    return fig


def _heatmap_traces(el: _Elements) -> tuple[list[Any], str]:
    import plotly.graph_objects as go

    err, note = _as_2d(el.abs_err)
    mismatch, _ = _as_2d(el.mismatch)
    err, mismatch, rows, cols, pooled = _pool(err, mismatch)
    traces: list[Any] = [
        go.Heatmap(
            z=err,
            x=cols,
            y=rows,
            colorscale="Viridis",
            colorbar={"title": {"text": "|a−e|"}},
            hovertemplate="row %{y}, col %{x}<br>|a−e| = %{z:.3g}<extra></extra>",
            name="|actual − expected|",
        )
    ]
    r_idx, c_idx = np.nonzero(mismatch)
    if r_idx.size:
        traces.append(
            go.Scatter(
                x=cols[c_idx[:_MAX_MARKERS]],
                y=rows[r_idx[:_MAX_MARKERS]],
                mode="markers",
                marker={"symbol": "x", "color": "red", "size": 7},
                name="mismatch",
                hovertemplate="mismatch at row %{y}, col %{x}<extra></extra>",
            )
        )
    return traces, "|actual − expected|" + note + pooled


def _as_2d(x: np.ndarray) -> tuple[np.ndarray, str]:
    """View per-element data as a matrix and say how, for the plot title."""
    if x.ndim == 2:
        return x, ""
    if x.ndim < 2:
        return x.reshape(1, -1), " (shown as one row)"
    lead = "×".join(map(str, x.shape[:-1]))
    return x.reshape(-1, x.shape[-1]), f" (leading dims {lead} collapsed into rows)"


def _pool(
    err: np.ndarray, mismatch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Max-pool to at most _MAX_HEATMAP_SIDE cells per side; axes keep original indices."""
    steps = [max(1, math.ceil(n / _MAX_HEATMAP_SIDE)) for n in err.shape]
    starts = [np.arange(0, n, step) for n, step in zip(err.shape, steps, strict=True)]
    for axis, step in enumerate(steps):
        if step > 1:
            # fmax ignores NaN (non-finite pairs) unless a whole block is NaN.
            err = np.fmax.reduceat(err, starts[axis], axis=axis)
            mismatch = np.logical_or.reduceat(mismatch, starts[axis], axis=axis)
    pooled = "" if steps == [1, 1] else f", max over {steps[0]}×{steps[1]} blocks"
    return err, mismatch, starts[0], starts[1], pooled


def _histogram_trace(el: _Elements, *, ulps: bool) -> tuple[Any, str]:
    import plotly.graph_objects as go

    finite = el.distance[np.isfinite(el.distance)]
    labels, counts = _pow2_histogram(finite)
    unit = "ULP distance" if ulps else "|actual − expected|"
    skipped = el.distance.size - finite.size
    title = f"{unit}, finite pairs" + (f" ({skipped} non-finite left out)" if skipped else "")
    bar = go.Bar(
        x=labels,
        y=counts,
        name=unit,
        marker_color="#4c72b0",
        showlegend=False,
        hovertemplate="%{x}: %{y} elements<extra></extra>",
    )
    return bar, title


def _pow2_histogram(distance: np.ndarray) -> tuple[list[str], list[int]]:
    """Count integer-valued distances in bins 0, 1, 2–3, 4–7, ... (empty bins kept)."""
    # frexp: d = m * 2**exp with m in [0.5, 1), so exp is the bin index for d >= 1 and 0
    # for d == 0.
    _, exp = np.frexp(distance)
    counts = np.bincount(exp.ravel(), minlength=1)
    return [_pow2_label(k) for k in range(counts.size)], counts.tolist()


def _pow2_label(k: int) -> str:
    if k == 0:
        return "0"
    low, high = 2 ** (k - 1), 2**k - 1
    if high < 10_000:
        return str(low) if low == high else f"{low}–{high}"
    return f"2^{k - 1}–2^{k}"
