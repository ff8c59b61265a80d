"""Plotly figures of counters (per kernel, per source line) and of modelled times.

The functions read what they draw off the objects they are given (`Counters`,
`Estimate`), so the data types need not know plotly."""

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
