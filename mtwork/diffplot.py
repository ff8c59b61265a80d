"""Figures of a diff: where the errors are (a heatmap of |actual - expected|, mismatches
marked) and how large (a histogram of ULP distances in powers of two)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["Elements", "combined_figure", "heatmap_figure", "histogram_figure"]

# Heatmaps are max-pooled down to this many cells per side so figures stay light in
# notebooks and published HTML.
_MAX_HEATMAP_SIDE = 256
_MAX_MARKERS = 2000
_PASS_COLOUR, _FAIL_COLOUR = "#1a7f37", "#cf222e"


@dataclass(frozen=True)
class Elements:
    """Per-element data for plots, shaped like the compared arrays."""

    abs_err: np.ndarray  # |actual - expected|, NaN where a side is not finite
    distance: np.ndarray  # ULPs, or |actual - expected| for integer dtypes; NaN likewise
    mismatch: np.ndarray  # bool


def heatmap_figure(el: Elements, title: str, ok: bool) -> go.Figure:
    import plotly.graph_objects as go  # deferred: most diffs are never plotted

    traces, subtitle = _heatmap_traces(el)
    fig = go.Figure(traces)
    fig.update_layout(title=f"{title}<br><sub>{subtitle}</sub>")
    fig.update_yaxes(autorange="reversed")
    return _style(fig, ok)


def histogram_figure(el: Elements, title: str, ok: bool, *, ulps: bool) -> go.Figure:
    import plotly.graph_objects as go

    trace, subtitle = _histogram_trace(el, ulps=ulps)
    fig = go.Figure(trace)
    fig.update_layout(title=f"{title}<br><sub>{subtitle}</sub>")
    fig.update_yaxes(type="log", title="count")
    return _style(fig, ok)


def combined_figure(el: Elements, title: str, ok: bool, *, ulps: bool) -> go.Figure:
    from plotly.subplots import make_subplots

    heat, heat_title = _heatmap_traces(el)
    hist, hist_title = _histogram_trace(el, ulps=ulps)
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
    fig.update_layout(title=title, height=700)
    return _style(fig, ok)


def _style(fig: go.Figure, ok: bool) -> go.Figure:
    fig.update_layout(
        title_font_color=_PASS_COLOUR if ok else _FAIL_COLOUR,
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    return fig


def _heatmap_traces(el: Elements) -> tuple[list[Any], str]:
    import plotly.graph_objects as go

    err, note = _as_2d(el.abs_err)
    mismatch, _ = _as_2d(el.mismatch)
    err, mismatch, rows, cols, pooled = _pool(err, mismatch)
    traces: list[Any] = [
        go.Heatmap(
            z=err,
            x=cols,
            y=rows,
            # The scale starts at zero error (an exact result is one colour, not a spread
            # around zero).
            zmin=0.0,
            zmax=_upper(err),
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


def _histogram_trace(el: Elements, *, ulps: bool) -> tuple[Any, str]:
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


def _upper(err: np.ndarray) -> float:
    finite = err[np.isfinite(err)]
    top = float(finite.max()) if finite.size else 0.0
    return top if top > 0 else 1.0
