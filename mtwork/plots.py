"""Plotly figures for sweeps and comparisons.

Every figure names its clock in the title and on the time axis, so emulator CPU time is
never read as GPU speed; figures of the modelled time (a sweep's default objective on sim)
name the chip and say it is a model, and hover shows each setting's bound.
`model_roofline` and `bounds` place a sweep's settings on the model (`mtwork.gpu.figures`).
`setup_offline()` makes figures survive HTML export without a network (call it once near
the top of a notebook).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .compare import Comparison
from .display import TimeUnit, number_text, value_text
from .errors import SweepError
from .gpu.figures import bounds_figure as bounds
from .gpu.figures import sweep_roofline as model_roofline
from .modelled import MODELLED, model_label
from .sweep.results import TIME_OBJECTIVES, Record, SweepResult, is_time
from .sweep.space import Config, as_formula

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["bounds", "heatmap", "lines", "model_roofline", "roofline", "setup_offline",
           "speedup_bars"]

OFFLINE_RENDERER = "plotly_mimetype+notebook"
_FAILED_COLOUR = "#cf222e"
_OK_COLOUR = "#4c72b0"


def setup_offline(renderer: str = OFFLINE_RENDERER) -> str:
    """Make plotly figures render in JupyterLab *and* in HTML exported by nbconvert,
    with no network; returns the renderer set.

    Plotly 6+ shows figures only as `application/vnd.plotly.v1+json` by default, which
    JupyterLab draws but nbconvert drops ("is not able to be represented"). The
    `notebook` renderer adds a `text/html` copy and embeds plotly.js once (about 5 MB)
    in the first figure's output, so exported HTML draws offline; `plotly_mimetype`
    keeps JupyterLab's own renderer. ("notebook_connected" would fetch plotly.js from a
    CDN when the page is viewed.)
    """
    import plotly.io as pio

    pio.renderers.default = renderer
    return renderer


# --- sweeps ------------------------------------------------------------------------------------


def heatmap(
    result: SweepResult,
    x: str,
    y: str,
    *,
    objective: str | None = None,
    maximize: bool | None = None,
) -> go.Figure:
    """The objective over two parameters. Where other parameters vary, a cell shows the
    best configuration that shares its x and y; cells where every configuration failed
    are marked with a red cross (hover for the reasons)."""
    import plotly.graph_objects as go

    objective, maximize = result.direction(objective, maximize)
    _check_parameters(result, x, y)
    xs, ys = _values(result, x), _values(result, y)
    scale = _scale(result, objective)
    z = np.full((len(ys), len(xs)), np.nan)
    hover = [["not run"] * len(xs) for _ in ys]
    failed_x, failed_y, failed_text = [], [], []
    for j, yv in enumerate(ys):
        for i, xv in enumerate(xs):
            records = [r for r in result.records
                       if r.config[x] == xv and r.config[y] == yv]
            best = _best(records, objective, maximize)
            if best is not None:
                z[j, i] = best.value(objective) / scale.scale
                hover[j][i] = _hover(best, objective, scale)
            elif records:
                failed_x.append(value_text(xv))
                failed_y.append(value_text(yv))
                failed_text.append("<br>".join(_failure_hover(r) for r in records))
                hover[j][i] = "failed"
    label = _objective_label(result, objective, scale)
    traces: list[Any] = [
        go.Heatmap(
            z=z,
            x=[value_text(v) for v in xs],
            y=[value_text(v) for v in ys],
            text=[[_cell_text(v) for v in row] for row in z],
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale="Viridis",
            reversescale=not maximize,  # the best cells are always the bright ones
            colorbar={"title": {"text": _short_label(objective, scale)}},
            name=objective,
        )
    ]
    if failed_x:
        traces.append(
            go.Scatter(
                x=failed_x, y=failed_y, mode="markers", name="failed",
                marker={"symbol": "x", "size": 16, "color": _FAILED_COLOUR},
                customdata=failed_text, hovertemplate="%{customdata}<extra>failed</extra>",
            )
        )
    others = [p for p in result.parameters if p not in (x, y)]
    note = f"each cell: best over {', '.join(others)}" if others else ""
    fig = go.Figure(traces)
    fig.update_layout(
        title=_title(f"{label} over {x} × {y}", _clock_text(result, objective), note),
        xaxis={"title": {"text": x}, "type": "category"},
        yaxis={"title": {"text": y}, "type": "category"},
        legend=_LEGEND,
    )
    return fig


def lines(
    result: SweepResult,
    x: str,
    *,
    by: str | None = None,
    objective: str | None = None,
    maximize: bool | None = None,
) -> go.Figure:
    """The objective against one parameter, one line per value of `by`. Times show the
    median with a bar from min to p95. Where other parameters vary, each point is the
    best configuration; points where every configuration failed are red crosses on the
    axis."""
    import plotly.graph_objects as go

    objective, maximize = result.direction(objective, maximize)
    _check_parameters(result, *[p for p in (x, by) if p])
    scale = _scale(result, objective)
    xs = _values(result, x)
    groups = _values(result, by) if by else [None]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
    fig = go.Figure()
    failed_x, failed_text = [], []
    for g in groups:
        px, py, lo, hi, hover = [], [], [], [], []
        for xv in xs:
            records = [r for r in result.records
                       if r.config[x] == xv and (by is None or r.config[by] == g)]
            best = _best(records, objective, maximize)
            if best is None:
                if records:
                    failed_x.append(xv if numeric else value_text(xv))
                    failed_text.append("<br>".join(_failure_hover(r) for r in records))
                continue
            value = best.value(objective) / scale.scale
            px.append(xv if numeric else value_text(xv))
            py.append(value)
            m = best.measurement
            if objective in ("time", "median") and m is not None:
                lo.append(value - m.min / scale.scale)
                hi.append(m.p95 / scale.scale - value)
            hover.append(_hover(best, objective, scale))
        fig.add_trace(
            go.Scatter(
                x=px, y=py, mode="lines+markers",
                name=f"{by}={value_text(g)}" if by else objective,
                error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": bool(hi)},
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            )
        )
    if failed_x:
        fig.add_trace(
            go.Scatter(
                x=failed_x, y=[0] * len(failed_x), mode="markers", name="failed",
                marker={"symbol": "x", "size": 12, "color": _FAILED_COLOUR},
                customdata=failed_text, hovertemplate="%{customdata}<extra>failed</extra>",
            )
        )
    label = _objective_label(result, objective, scale)
    others = [p for p in result.parameters if p not in (x, by)]
    notes = []
    if objective in ("time", "median"):
        notes.append("bars: min to p95")
    if others:
        notes.append(f"each point: best over {', '.join(others)}")
    fig.update_layout(
        title=_title(f"{label} against {x}", _clock_text(result, objective), "; ".join(notes)),
        xaxis={"title": {"text": x}, **({} if numeric else {"type": "category"})},
        yaxis={"title": {"text": label}, "rangemode": "tozero"},
        legend=_LEGEND,
    )
    return fig


def roofline(
    result: SweepResult,
    *,
    flops: str | Callable[[Config], float],
    bytes: str | Callable[[Config], float],
    peak_flops: float | None = None,
    peak_bandwidth: float | None = None,
) -> go.Figure:
    """Achieved FLOP/s against arithmetic intensity, one point per passing configuration.

    `flops` and `bytes` (moved to and from device memory) are given per configuration
    as functions of the config or expressions over its parameters. `peak_flops`
    (FLOP/s) and `peak_bandwidth` (bytes/s) draw the roof; hover shows each point's
    share of it. On `sim` the points are emulator CPU speed, not GPU speed.
    """
    import plotly.graph_objects as go

    flops_of, _, _ = as_formula(flops)
    bytes_of, _, _ = as_formula(bytes)
    points = []
    for r in result.ok:
        f, b = float(flops_of(r.config)), float(bytes_of(r.config))
        if f <= 0 or b <= 0:
            raise SweepError(f"roofline: flops and bytes must be positive; {r.config} gives "
                             f"flops={f}, bytes={b}")
        points.append((r, f / b, f / r.time))
    if not points:
        raise SweepError("roofline: no configuration passed, so there is nothing to place")
    fig = go.Figure()
    intensity = [p[1] for p in points]
    lo, hi = min(intensity) / 4, max(intensity) * 4
    roof = _roof(peak_flops, peak_bandwidth)
    if roof is not None:
        if peak_flops and peak_bandwidth:
            ridge = peak_flops / peak_bandwidth
            lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        ai = np.geomspace(lo, hi, 200)
        fig.add_trace(go.Scatter(x=ai, y=[roof(a) for a in ai], mode="lines", name="roof",
                                 line={"color": "#555", "dash": "dash"}, hoverinfo="skip"))
    hover = []
    for r, ai, perf in points:
        share = f"<br>{perf / roof(ai):.1%} of the roof" if roof is not None else ""
        hover.append(f"{html.escape(str(r.config))}<br>{ai:.3g} FLOP/byte<br>"
                     f"{perf:.3g} FLOP/s{share}")
    fig.add_trace(
        go.Scatter(x=intensity, y=[p[2] for p in points], mode="markers", name="configurations",
                   marker={"size": 10, "color": _OK_COLOUR}, customdata=hover,
                   hovertemplate="%{customdata}<extra></extra>")
    )
    note = "roof from the peaks given" if roof is not None else "no peaks given: no roof"
    fig.update_layout(
        title=_title("Roofline", result.clock.label, note),
        xaxis={"title": {"text": "arithmetic intensity (FLOP/byte)"}, "type": "log"},
        yaxis={"title": {"text": f"achieved FLOP/s — {result.clock.label}"}, "type": "log"},
        legend=_LEGEND,
    )
    return fig


def _roof(peak_flops: float | None, peak_bandwidth: float | None
          ) -> Callable[[float], float] | None:
    if peak_flops and peak_bandwidth:
        return lambda ai: min(peak_flops, ai * peak_bandwidth)
    if peak_flops:
        return lambda ai: peak_flops
    if peak_bandwidth:
        return lambda ai: ai * peak_bandwidth
    return None


# --- comparisons -----------------------------------------------------------------------------


def speedup_bars(comparison: Comparison) -> go.Figure:
    """Each variant's median paired speed-up over the baseline, with its min–max range
    over the rounds. Variants whose outputs differed from the baseline's are red."""
    import plotly.graph_objects as go

    ratios = comparison.speedups
    names = [n for n in comparison.names if n != comparison.baseline]
    medians = [ratios[n].median for n in names]
    colours = [_FAILED_COLOUR if comparison.agrees(n) is False else _OK_COLOUR for n in names]
    hover = []
    for n in names:
        text = f"{n}: {ratios[n]} over {comparison.rounds} rounds"
        agrees = comparison.agrees(n)
        if agrees is not None:
            text += f"<br>outputs {'match' if agrees else 'DIFFER from'} {comparison.baseline}"
        hover.append(text)
    fig = go.Figure(
        go.Bar(
            x=names, y=medians, marker_color=colours, name="median speed-up",
            error_y={"type": "data",
                     "array": [ratios[n].max - ratios[n].median for n in names],
                     "arrayminus": [ratios[n].median - ratios[n].min for n in names]},
            text=[f"{m:.3g}×" for m in medians], textposition="outside",
            customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        )
    )
    fig.add_hline(y=1, line_dash="dash", line_color="#555",
                  annotation_text=f"{comparison.baseline} (baseline)")
    fig.update_layout(
        title=_title(
            f"Speed-up over {comparison.baseline}",
            comparison.clock.label,
            f"{comparison.baseline} time / variant time, paired in each of "
            f"{comparison.rounds} interleaved rounds: median, bar min–max",
        ),
        yaxis={"title": {"text": f"speed-up (×) — {comparison.clock.label}"},
               "rangemode": "tozero"},
        xaxis={"title": {"text": "variant"}},
    )
    return fig


# --- helpers -----------------------------------------------------------------------------------

_LEGEND = {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"}


def _title(text: str, clock: str, note: str = "") -> dict[str, Any]:
    sub = f"{clock}" + (f" · {note}" if note else "")
    return {"text": f"{text}<br><sub>{html.escape(sub)}</sub>"}


def _check_parameters(result: SweepResult, *names: str) -> None:
    unknown = [n for n in names if n not in result.parameters]
    if unknown:
        raise SweepError(f"unknown parameter {', '.join(map(repr, unknown))}: the sweep has "
                         f"{', '.join(map(repr, result.parameters))}")


def _values(result: SweepResult, name: str) -> list[Any]:
    """The parameter's values in the space's order (those the sweep visited)."""
    seen = [r.config[name] for r in result.records]
    order = list(result.values.get(name, ())) or seen
    return [v for v in order if any(_same(v, s) for s in seen)]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _best(records: Sequence[Record], objective: str, maximize: bool) -> Record | None:
    scored = [r for r in records if r.ok and r.value(objective) is not None]
    if not scored:
        return None
    return (max if maximize else min)(scored, key=lambda r: r.value(objective))


def _scale(result: SweepResult, objective: str) -> TimeUnit:
    """Times in a readable unit; metrics as they are."""
    if not is_time(objective):
        return TimeUnit("", 1.0)
    values = [r.value(objective) for r in result.ok if r.value(objective) is not None]
    return TimeUnit.for_seconds(min(values)) if values else TimeUnit("s", 1.0)


def _objective_label(result: SweepResult, objective: str, scale: TimeUnit) -> str:
    if objective == MODELLED:
        return f"modelled time ({scale.name})"
    if objective in TIME_OBJECTIVES:
        stat = TIME_OBJECTIVES[objective]
        return f"{stat} time ({scale.name})"
    return objective


def _clock_text(result: SweepResult, objective: str) -> str:
    """What the plotted values are: the model on its chip, or the sweep's clock."""
    if objective == MODELLED and result.chip is not None:
        return f"{model_label(result.chip)}; measured: {result.clock.label}"
    return result.clock.label


def _short_label(objective: str, scale: TimeUnit) -> str:
    return scale.name if scale.name else objective


def _hover(r: Record, objective: str, scale: TimeUnit) -> str:
    v = r.value(objective)
    shown = scale.format(v) if scale.name else f"{v:.4g}"
    text = f"{html.escape(str(r.config))}<br>{objective}: {shown}"
    if r.measurement is not None and r.measurement.unstable:
        text += f"<br>unstable (CV {r.measurement.cv:.1%})"
    if r.estimate is not None:
        e = r.estimate
        text += f"<br>{html.escape(e.bound)}-bound ({html.escape(e.limiting_term)})"
        if objective != MODELLED:
            text += f"<br>modelled {TimeUnit.for_seconds(e.seconds).format(e.seconds)}"
    return text


def _failure_hover(r: Record) -> str:
    return html.escape(f"{r.config}: {r.status} {r.short_message}".strip())


def _cell_text(v: float) -> str:
    return "" if math.isnan(v) else number_text(v)

