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

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import mlx.core as mx
import numpy as np

from .diffplot import Elements, combined_figure, heatmap_figure, histogram_figure
from .difftext import Scalar, headline, report_html, report_text
from .floats import (
    band,
    comparison_dtype,
    cosine,
    count_elements,
    max_or_none,
    max_rel_err,
    parts,
    same_bits,
    ulp_distance,
    ulp_stats,
    within_band,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

ArrayLike = Any  # mx.array, np.ndarray, Python scalar or nested list

_FLOAT_FIELDS = ("atol", "rtol", "max_abs_err", "max_rel_err", "mean_ulp", "cosine")


@dataclass(frozen=True)
class Mismatch:
    """One mismatching element: its multi-index and both values as given."""

    index: tuple[int, ...]
    actual: Scalar
    expected: Scalar


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
    _elements: Elements | None = field(default=None, repr=False, compare=False)

    @property
    def mismatch_fraction(self) -> float:
        return self.n_mismatch / self.size if self.size else 0.0

    def __str__(self) -> str:
        return report_text(self)

    def _repr_html_(self) -> str:
        return report_html(self)

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
        title = (f"{headline(self)}: {self.dtype} {self.shape}, {self.n_mismatch}/"
                 f"{self.size} mismatches")
        ulps = self.max_ulp is not None
        if kind == "heatmap":
            return heatmap_figure(self._elements, title, self.ok)
        if kind == "histogram":
            return histogram_figure(self._elements, title, self.ok, ulps=ulps)
        if kind == "both":
            return combined_figure(self._elements, title, self.ok, ulps=ulps)
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
    cmp = comparison_dtype(dtype, e, a_dtype)
    if bitwise:
        _check_bitwise(a_dtype, e_dtype, cmp, atol, rtol)
        atol_, rtol_, band_text = 0.0, 0.0, "bitwise"
    else:
        atol_, rtol_, band_text = band(cmp, atol, rtol)

    ac, ec = parts(a, cmp), parts(e, cmp)
    # Widening signalling NaNs raises "invalid"; Inf - Inf does too, and huge finite pairs
    # can overflow. Those elements are judged by the NaN/Inf rules, so silence all three.
    with np.errstate(over="ignore", invalid="ignore"):
        av, ev = ac.astype(np.float64), ec.astype(np.float64)
        finite = np.isfinite(av) & np.isfinite(ev)
        abs_err = np.where(finite, np.abs(av - ev), np.nan)
    if bitwise:
        same = same_bits(ac, ec, cmp)
    else:
        same = within_band(ac, ec, av, ev, abs_err, finite, atol_, rtol_)
    mismatch = ~same.all(axis=-1)
    pair_finite = finite.all(axis=-1)
    ulps = ulp_distance(ac, ec, cmp)
    max_ulp, mean_ulp = ulp_stats(None if ulps is None else ulps[pair_finite])
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
        band=band_text,
        atol=atol_,
        rtol=rtol_,
        size=int(a.size),
        n_mismatch=int(mismatch.sum()),
        max_abs_err=max_or_none(abs_err[finite]),
        max_rel_err=max_rel_err(abs_err, ev, finite),
        max_ulp=max_ulp,
        mean_ulp=mean_ulp,
        cosine=cosine(av[pair_finite], ev[pair_finite]),
        nan_actual=count_elements(np.isnan(av)),
        nan_expected=count_elements(np.isnan(ev)),
        inf_actual=count_elements(np.isinf(av)),
        inf_expected=count_elements(np.isinf(ev)),
        mismatches=_first_mismatches(a, e, mismatch, max_listed),
        _elements=Elements(elem_abs_err, np.where(pair_finite, distance, np.nan), mismatch),
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


# --- mismatches -----------------------------------------------------------------------------


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
