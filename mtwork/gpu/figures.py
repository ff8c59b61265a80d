"""Plotly figures of counters (per kernel, per source line), of modelled times, and of a
sweep's settings on the model (its roofline, the bound per setting).

The functions read what they draw off the objects they are given (`Counters`,
`Estimate`, a sweep's result), so the data types need not know plotly."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go


def counters_figure(counters: Sequence[Any] | Mapping[str, Any]) -> go.Figure:
    """Per kernel: device bytes (requested, moved, distinct), thread-level operations by
    class, and SIMD-group operations."""
    from plotly.subplots import make_subplots

    named = _named(counters, lambda c: c.kernel)
    names = list(named)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "device memory (bytes)", "thread-level operations", "SIMD-group operations"))
    for label, attr in (("requested", "requested_bytes"), ("moved", "moved_bytes"),
                        ("distinct", "distinct_bytes")):
        fig.add_bar(x=names, y=[getattr(c, attr) for c in named.values()], name=label,
                    legendgroup="bytes", row=1, col=1)
    first = next(iter(named.values()))
    for f in fields(first.ops):
        values = [getattr(c.ops, f.name) for c in named.values()]
        if any(values):
            fig.add_bar(x=names, y=values, name=f.name, legendgroup="ops", row=1, col=2)
    for f in fields(first.simd):
        values = [getattr(c.simd, f.name) for c in named.values()]
        if any(values):
            fig.add_bar(x=names, y=values, name=f"simd.{f.name}", legendgroup="simd",
                        row=1, col=3)
    fig.update_layout(barmode="group", title="Counted work per kernel (emulator counts)")
    return fig


def lines_figure(counters: Any) -> go.Figure:
    """Per source line: device bytes requested and moved, threadgroup wavefronts and bank
    conflicts, thread-level operations and divergences."""
    from plotly.subplots import make_subplots

    lines = counters.source_lines
    x = [f"line {s.place}" for s in lines]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, subplot_titles=(
        "device memory (bytes)", "threadgroup memory (wavefronts)", "work"))
    fig.add_bar(x=x, y=[s.device_bytes for s in lines], name="requested", row=1, col=1)
    fig.add_bar(x=x, y=[s.transactions * counters.line_bytes for s in lines], name="moved",
                row=1, col=1)
    fig.add_bar(x=x, y=[s.threadgroup_accesses for s in lines], name="accesses", row=2, col=1)
    fig.add_bar(x=x, y=[s.bank_conflicts for s in lines], name="bank conflicts", row=2, col=1)
    fig.add_bar(x=x, y=[s.lane_ops for s in lines], name="lane ops", row=3, col=1)
    fig.add_bar(x=x, y=[s.divergences for s in lines], name="divergences", row=3, col=1)
    fig.update_layout(barmode="group", title=f"`{counters.kernel}` per source line")
    return fig


def estimates_figure(estimates: Sequence[Any] | Mapping[str, Any]) -> go.Figure:
    """Each modelled term per kernel (log scale), the total as a marker."""
    import plotly.graph_objects as go

    named = _named(estimates, lambda e: f"{e.kernel} on {e.chip}")
    names = list(named)
    fig = go.Figure()
    for term in next(iter(named.values())).terms:
        fig.add_bar(x=names, y=[e.term(term.name).seconds for e in named.values()],
                    name=term.name)
    fig.add_scatter(x=names, y=[e.seconds for e in named.values()], mode="markers+text",
                    name="total", text=[e.bound for e in named.values()],
                    textposition="top center", marker={"symbol": "diamond", "size": 12})
    fig.update_layout(barmode="group", yaxis={"type": "log", "title": "seconds (modelled)"},
                      title="Modelled GPU time by term — a model, not a measurement")
    return fig


def _named(items: Sequence[Any] | Mapping[str, Any], label: Callable[[Any], str]) -> dict:
    if isinstance(items, Mapping):
        named = dict(items)
    else:
        named = {}
        for item in items:
            key, n = label(item), 2
            while key in named:
                key, n = f"{label(item)} ({n})", n + 1
            named[key] = item
    if not named:
        raise ValueError("nothing to plot: pass at least one item")
    return named


# --- a sweep's settings on the model ---------------------------------------------------------

BOUND_COLOURS = {"memory": "#4c72b0", "cache": "#64b5cd", "ALU": "#dd8452",
                 "matrix": "#55a868", "threadgroup memory": "#8172b3", "latency": "#c44e52",
                 "launch": "#937860"}
MMA_FLOPS = 2 * 8 * 8 * 8  # one 8x8x8 multiply-accumulate: 512 FMAs


def float_operations(counters: Any) -> int:
    """Floating-point operations of a dispatch: lane operations of the float classes (an
    FMA counts once: the counters do not split it from an add) plus 1024 per 8x8x8
    `simdgroup_matrix` multiply-accumulate."""
    ops, simd = counters.ops, counters.simd
    return (ops.f32 + ops.f16 + ops.bf16
            + MMA_FLOPS * (simd.mma_f32 + simd.mma_f16 + simd.mma_bf16))


def sweep_roofline(result: Any) -> go.Figure:
    """The settings of a sweep on its chip's roofline: each modelled setting at its
    arithmetic intensity (float operations per distinct DRAM byte, from its counters) and
    its modelled throughput, coloured by its bound; the roofs are the chip's FP32 and
    `simdgroup_matrix` peaks and its memory bandwidth."""
    import numpy as np
    import plotly.graph_objects as go

    chip = _chip_of(result, "sweep_roofline")
    points = [(r, float_operations(r.counters), r.counters.distinct_bytes)
              for r in result.ok if r.estimate is not None]
    points = [(r, ops, nbytes) for r, ops, nbytes in points if ops > 0 and nbytes > 0]
    if not points:
        raise ValueError("sweep_roofline: no modelled setting does floating-point work on "
                         "device memory, so none has an arithmetic intensity to place")
    bandwidth = chip.memory_bandwidth_gbs * 1e9
    roofs = {"FP32 peak": chip.fp32_tflops * 1e12, "matrix peak": chip.matrix_tflops_f32 * 1e12}
    intensity = [ops / nbytes for _, ops, nbytes in points]
    ridge = min(roofs.values()) / bandwidth
    ai = np.geomspace(min(min(intensity), ridge) / 4, max(max(intensity), ridge) * 4, 200)
    fig = go.Figure()
    for name, peak in roofs.items():
        fig.add_scatter(x=ai, y=np.minimum(peak, ai * bandwidth), mode="lines", name=name,
                        line={"dash": "dash" if name == "FP32 peak" else "dot",
                              "color": "#555"}, hoverinfo="skip")
    for bound in dict.fromkeys(r.bound for r, _, _ in points):
        mine = [(r, ops, nbytes) for r, ops, nbytes in points if r.bound == bound]
        fig.add_scatter(
            x=[ops / nbytes for _, ops, nbytes in mine],
            y=[ops / r.modelled for r, ops, _ in mine], mode="markers", name=f"{bound}-bound",
            marker={"size": 11, "color": BOUND_COLOURS.get(bound, "#333")},
            customdata=[_setting_hover(r) for r, _, _ in mine],
            hovertemplate="%{customdata}<extra></extra>")
    fig.update_layout(
        title=f"Roofline of the sweep on {chip.label}<br><sub>modelled, not measured · "
              "float operations per distinct DRAM byte; an FMA counts once</sub>",
        xaxis={"title": {"text": "arithmetic intensity (float operations / DRAM byte)"},
               "type": "log"},
        yaxis={"title": {"text": f"modelled float operations / s on {chip.name}"},
               "type": "log"})
    return fig


def bounds_figure(result: Any) -> go.Figure:
    """The modelled time of each setting (log scale), coloured by what bounds it."""
    import plotly.graph_objects as go

    chip = _chip_of(result, "bounds_figure")
    modelled = result.ranked("modelled")
    if not modelled:
        raise ValueError("bounds_figure: no setting of the sweep was modelled")
    fig = go.Figure()
    for bound in dict.fromkeys(r.bound for r in modelled):
        mine = [r for r in modelled if r.bound == bound]
        fig.add_bar(x=[_setting_label(r) for r in mine], y=[r.modelled for r in mine],
                    name=f"{bound}-bound", marker_color=BOUND_COLOURS.get(bound, "#333"),
                    customdata=[_setting_hover(r) for r in mine],
                    hovertemplate="%{customdata}<extra></extra>")
    fig.update_layout(
        title=f"Modelled time and bound per setting on {chip.label}<br><sub>a model, not a "
              "measurement · fastest first</sub>",
        xaxis={"title": {"text": "setting"}, "type": "category",
               "categoryorder": "array", "categoryarray": [_setting_label(r) for r in modelled]},
        yaxis={"title": {"text": "modelled seconds"}, "type": "log"})
    return fig


def _chip_of(result: Any, who: str) -> Any:
    if getattr(result, "chip", None) is None:
        raise ValueError(f"{who}: the sweep was not modelled (it ran with gpu=False)")
    return result.chip


def _setting_label(record: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in record.config.items())


def _setting_hover(record: Any) -> str:
    import html

    e = record.estimate
    return (f"{html.escape(_setting_label(record))}<br>modelled {e.seconds:.3g} s, "
            f"{html.escape(e.bound)}-bound ({html.escape(e.limiting_term)})")
