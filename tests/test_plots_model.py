"""Figures of a sweep ranked by the GPU model: modelled-time heatmaps, the roofline of
the sweep's settings coloured by bound, and the bound per setting. The records carry
counters written by hand for three kinds of kernel (streaming, FP32 arithmetic,
simdgroup_matrix), modelled by `mtwork.gpu.estimate`."""

import numpy as np
import pytest

import mtwork
from mtwork import plots
from mtwork.gpu import BufferTraffic, Counters, LaneOps, SimdOps
from mtwork.gpu.figures import float_operations
from mtwork.sweep import Config, Record, SweepResult
from mtwork.timing import Clock, Measurement

CHIP = mtwork.gpu("M2 Max")


def counters(kind: str, tg: int) -> Counters:
    """64 MiB streamed through, plus the work of `kind` (more with wider groups)."""
    lines = (64 << 20) // 128
    traffic = BufferTraffic("a", load_bytes=lines * 128, loads=lines * 4, transactions=lines,
                            distinct_lines=lines)
    work = {"memory": {}, "alu": {"ops": LaneOps(f32=tg << 24)},
            "matrix": {"simd": SimdOps(mma_f32=tg << 15)}}[kind]
    return Counters(kernel=kind, threadgroups=1024, threads_per_threadgroup=tg,
                    buffers=(traffic,), **work)


def record(kind: str, tg: int) -> Record:
    c = counters(kind, tg)
    times = Measurement.from_samples([1e-3, 1.1e-3, 0.9e-3], clock="sim")
    return Record(Config({"kind": kind, "tg": tg}), "ok", measurement=times, counters=c,
                  estimate=mtwork.gpu.estimate(c, CHIP))


@pytest.fixture
def result() -> SweepResult:
    records = [record(kind, tg) for kind in ("memory", "alu", "matrix") for tg in (64, 256)]
    return SweepResult(records, ("kind", "tg"), Clock("sim"), objective="modelled",
                       candidates=6, space_size=6, chip=CHIP, default_objective=True,
                       values={"kind": ("memory", "alu", "matrix"), "tg": (64, 256)})


def trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_the_records_are_bound_by_what_they_do(result) -> None:
    bounds = {(r.config["kind"], r.config["tg"]): r.bound for r in result.records}
    assert bounds[("memory", 64)] == "memory"
    assert bounds[("alu", 256)] == "ALU" and bounds[("matrix", 256)] == "matrix"


def test_a_modelled_heatmap_shows_the_modelled_time_and_names_the_chip(result) -> None:
    fig = plots.heatmap(result, "tg", "kind")
    z = np.array(fig.data[0].z, dtype=float)
    by = {(r.config["kind"], r.config["tg"]): r.modelled for r in result.records}
    unit = min(by.values())
    scale = mtwork.display.TimeUnit.for_seconds(unit).scale
    assert z[1, 1] == pytest.approx(by[("alu", 256)] / scale)
    assert z[0, 0] == pytest.approx(by[("memory", 64)] / scale)
    assert f"modelled time on {CHIP.label}" in fig.layout.title.text
    assert "emulator CPU time" in fig.layout.title.text  # what was measured, named
    assert "ALU-bound" in fig.data[0].customdata[1][1]
    measured = plots.heatmap(result, "tg", "kind", objective="time")
    assert f"modelled time on {CHIP.label}" not in measured.layout.title.text
    assert "modelled" in measured.data[0].customdata[0][0]  # the model in the hover


def test_the_roofline_places_each_setting_coloured_by_its_bound(result) -> None:
    fig = plots.model_roofline(result)
    points = {t.name: t for t in fig.data if t.name.endswith("-bound")}
    placed = [r for r in result.records if float_operations(r.counters) > 0]
    assert sum(len(t.x) for t in points.values()) == len(placed) == 4
    assert set(points) == {f"{r.bound}-bound" for r in placed}
    for r in placed:
        t = points[f"{r.bound}-bound"]
        ops = float_operations(r.counters)
        i = list(t.x).index(pytest.approx(ops / r.counters.distinct_bytes))
        assert t.y[i] == pytest.approx(ops / r.modelled)
        assert r.config["kind"] in t.customdata[i]
    assert max(trace(fig, "FP32 peak").y) == pytest.approx(CHIP.fp32_tflops * 1e12)
    assert max(trace(fig, "matrix peak").y) == pytest.approx(CHIP.matrix_tflops_f32 * 1e12)
    assert CHIP.label in fig.layout.title.text and "modelled" in fig.layout.title.text


def test_the_bound_per_setting_in_ranked_order(result) -> None:
    fig = plots.bounds(result)
    assert {t.name for t in fig.data} == {f"{r.bound}-bound" for r in result.records}
    ranked = [f"kind={r.config['kind']}, tg={r.config['tg']}" for r in result.ranked()]
    assert list(fig.layout.xaxis.categoryarray) == ranked
    for t in fig.data:
        for x, y in zip(t.x, t.y):
            r = result.records[[f"kind={q.config['kind']}, tg={q.config['tg']}"
                                for q in result.records].index(x)]
            assert y == pytest.approx(r.modelled) and t.name == f"{r.bound}-bound"


def test_model_figures_of_an_unmodelled_sweep_say_so(result) -> None:
    result.chip = None
    with pytest.raises(ValueError, match="gpu=False"):
        plots.model_roofline(result)
    with pytest.raises(ValueError, match="gpu=False"):
        plots.bounds(result)
