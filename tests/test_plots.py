"""Figures for sweeps and comparisons, and their survival through nbconvert's HTML export."""

import math
import re
import sys
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest

from mtwork import plots
from mtwork.compare import Comparison
from mtwork.sweep import Config, Record, SweepError, SweepResult
from mtwork.timing import Clock, Measurement

SIM_LABEL = "emulator CPU time (sim) — not GPU speed"
REPO = Path(__file__).resolve().parents[1]


def record(tg, items, unroll=1, *, ms=None, status="ok", message=None):
    measurement = None
    if ms is not None:
        measurement = Measurement.from_samples([ms * 1e-3, ms * 1.1e-3, ms * 0.9e-3],
                                               clock="sim")
    return Record(Config({"tg": tg, "items": items, "unroll": unroll}), status,
                  measurement=measurement, message=message)


@pytest.fixture
def result() -> SweepResult:
    records = [
        record(32, 1, 1, ms=4.0), record(32, 1, 2, ms=3.0),  # best of the cell: 3 ms
        record(32, 2, 1, ms=2.0), record(32, 2, 2, ms=2.5),
        record(64, 1, 1, ms=1.0), record(64, 1, 2, ms=1.5),
        record(64, 2, 1, status="fault", message="kernel `k` deadlocked: ..."),
        record(64, 2, 2, status="compile_error", message="source:3:1: error: boom"),
    ]
    return SweepResult(records, ("tg", "items", "unroll"), Clock("sim"), candidates=8,
                       space_size=8,
                       values={"tg": (32, 64), "items": (1, 2), "unroll": (1, 2)})


def trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_heatmap_shows_the_best_of_each_cell_and_marks_failures(result) -> None:
    fig = plots.heatmap(result, "tg", "items")
    heat = fig.data[0]
    assert list(heat.x) == ["32", "64"] and list(heat.y) == ["1", "2"]
    z = np.array(heat.z, dtype=float)  # rows are items, columns tg; in ms
    assert z[0, 0] == pytest.approx(3.0) and z[1, 0] == pytest.approx(2.0)
    assert z[0, 1] == pytest.approx(1.0) and math.isnan(z[1, 1])
    failed = trace(fig, "failed")
    assert (list(failed.x), list(failed.y)) == (["64"], ["2"])
    assert "deadlocked" in failed.customdata[0] and "compile_error" in failed.customdata[0]
    assert SIM_LABEL in fig.layout.title.text
    assert "best over unroll" in fig.layout.title.text


def test_lines_one_per_variant_with_min_to_p95_bars(result) -> None:
    fig = plots.lines(result, "tg", by="items")
    one, two = trace(fig, "items=1"), trace(fig, "items=2")
    assert list(one.x) == [32, 64] and list(one.y) == pytest.approx([3.0, 1.0])
    assert list(two.x) == [32] and list(two.y) == pytest.approx([2.0])
    # median 3 ms with samples 2.7..3.3 ms: the bar reaches down to min and up to p95
    assert one.error_y.arrayminus[0] == pytest.approx(0.3)
    assert 0 < one.error_y.array[0] <= 0.3 + 1e-9
    assert list(trace(fig, "failed").x) == [64]
    assert SIM_LABEL in fig.layout.title.text
    assert fig.layout.yaxis.title.text == "median time (ms)"


def test_plots_name_unknown_parameters(result) -> None:
    with pytest.raises(SweepError, match="'tgg'"):
        plots.heatmap(result, "tgg", "items")


def test_roofline_places_configurations_under_the_roof(result) -> None:
    n = 1 << 20
    fig = plots.roofline(result, flops=f"{2 * n} * unroll", bytes=lambda c: 8 * n,
                         peak_flops=1e12, peak_bandwidth=1e11)
    points = trace(fig, "configurations")
    assert len(points.x) == 6
    assert sorted(set(points.x)) == pytest.approx([0.25, 0.5])
    achieved = [2 * n * r.config["unroll"] / r.time for r in result.ok]
    assert sorted(points.y) == pytest.approx(sorted(achieved))
    roof = trace(fig, "roof")
    assert max(roof.y) == pytest.approx(1e12)  # the ridge (10 FLOP/byte) is on the plot
    assert "of the roof" in points.customdata[0]
    assert SIM_LABEL in fig.layout.yaxis.title.text and SIM_LABEL in fig.layout.title.text
    assert fig.layout.xaxis.type == "log"


def comparison() -> Comparison:
    return Comparison(
        clock=Clock("sim"), baseline="base", names=("base", "packed", "wide"),
        orders=(("base", "packed", "wide"),) * 3,
        round_times={"base": (2.0, 4.0, 2.0), "packed": (1.0, 1.0, 1.6), "wide": (2.0, 4.0, 4.0)},
        warmup=1,
    )


def test_speedup_bars_show_median_and_range() -> None:
    fig = plots.speedup_bars(comparison())
    bar = fig.data[0]
    assert list(bar.x) == ["packed", "wide"]
    assert list(bar.y) == pytest.approx([2.0, 1.0])  # medians of (2, 4, 1.25), (1, 1, 0.5)
    assert list(bar.error_y.array) == pytest.approx([2.0, 0.0])
    assert list(bar.error_y.arrayminus) == pytest.approx([0.75, 0.5])
    assert SIM_LABEL in fig.layout.title.text and SIM_LABEL in fig.layout.yaxis.title.text


def test_setup_offline_sets_an_offline_renderer() -> None:
    before = pio.renderers.default
    try:
        assert plots.setup_offline() == "plotly_mimetype+notebook"
        assert pio.renderers.default == "plotly_mimetype+notebook"
    finally:
        pio.renderers.default = before


NOTEBOOK_CELLS = [
    f"import sys\nsys.path.insert(0, {str(REPO)!r})",
    "from mtwork import plots\nfrom mtwork.compare import Comparison\n"
    "from mtwork.timing import Clock\nplots.setup_offline()",
    "c = Comparison(clock=Clock('sim'), baseline='base', names=('base', 'packed'),\n"
    "               orders=(('base', 'packed'), ('packed', 'base')),\n"
    "               round_times={'base': (2.0, 4.0), 'packed': (1.0, 1.5)}, warmup=0)\n"
    "fig = plots.speedup_bars(c)\n"
    "fig.update_layout(title_text='FIGURE_SURVIVES_EXPORT')\n"
    "fig",
]


def test_figures_survive_html_export_without_a_network() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = nb.cells[-1].outputs
    assert any("text/html" in o.get("data", {}) for o in outputs), (
        f"no HTML output; got {[list(o.get('data', {})) for o in outputs]} "
        f"(python {sys.executable})"
    )
    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    assert 'class="plotly-graph-div"' in body
    assert "Plotly.newPlot" in body
    assert "FIGURE_SURVIVES_EXPORT" in body
    assert "packed" in body
    # plotly.js itself is inlined, not fetched
    assert re.search(r"plotly\.js v\d", body)
    sources = re.findall(r'<script[^>]*\ssrc="([^"]+)"', body)
    assert not [s for s in sources if "plot" in s.lower()], sources
