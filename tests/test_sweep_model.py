"""Sweeps and comparisons ranked by the Apple GPU model: on sim the modelled time ranks
(the emulator's CPU time, shown beside it, reverses the ranking of tiling and
simdgroup_matrix kernels); on metal the measured time ranks, the model beside it with its
error. The records, tables and cache file carry the modelled time and bound."""

import json

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends import _FACTORIES, register
from mtwork.backends.sim import SimBackend
from mtwork.kernel import Launch
from mtwork.sweep import SweepError, SweepInterrupted, sweep
from mtwork.sweep.results import CACHE_FORMAT

# A 512 x 512 transpose, naive (each SIMD-group's stores stride a whole row apart) or
# through a threadgroup tile (loads and stores both along rows). The tile's barrier puts
# every thread on a fiber in the emulator, so its CPU time is many times the naive one's.
N = 512
NAIVE = """
    uint x = thread_position_in_grid.x, y = thread_position_in_grid.y;
    out[x * N + y] = inp[y * N + x];
"""
TILED = """
    threadgroup float tile[T][T + 1];
    uint2 l = uint2(thread_position_in_threadgroup.x, thread_position_in_threadgroup.y);
    uint2 g = uint2(threadgroup_position_in_grid.x, threadgroup_position_in_grid.y);
    tile[l.y][l.x] = inp[(g.y * T + l.y) * N + g.x * T + l.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[(g.x * T + l.y) * N + g.y * T + l.x] = tile[l.x][l.y];
"""
NAIVE_KERNEL = mtwork.metal_kernel("transpose_naive", ["inp"], ["out"], NAIVE)
TILED_KERNEL = mtwork.metal_kernel("transpose_tiled", ["inp"], ["out"], TILED)
X = mx.array(np.random.default_rng(0).standard_normal((N, N)).astype(np.float32))


def transpose(config) -> Launch:
    """tile=0: the naive kernel; else the tiled one with tile x tile threadgroups."""
    t = config["tile"]
    return Launch(NAIVE_KERNEL if t == 0 else TILED_KERNEL, grid=(N, N, 1),
                  threadgroup=(32, 8, 1) if t == 0 else (t, t, 1),
                  template=[("T", t)] if t else [], defines={"N": N},
                  output_shapes=[(N, N)], output_dtypes=[mx.float32])


def transposed(a):
    return np.asarray(a, np.float64).T


KW = dict(inputs=[X], oracle=transposed, rounds=2, warmup=1, progress=False)


@pytest.fixture(scope="module")
def transposes():
    return sweep(transpose, {"tile": [0, 16]}, **KW)


def tile_of(record) -> int:
    return record.config["tile"]


def test_the_model_ranks_the_tiled_transpose_first_where_cpu_time_says_the_opposite(
        transposes) -> None:
    result = transposes
    assert result.objective == "modelled" and result.chip == mtwork.gpu.default_gpu()
    assert [tile_of(r) for r in result.ranked()] == [16, 0]
    assert [tile_of(r) for r in result.ranked("time")] == [0, 16]  # the emulator's clock
    for r in result.records:
        assert r.estimate is not None and r.counters is not None
        assert r.modelled == r.estimate.seconds == mtwork.gpu.estimate(r.counters).seconds
        assert r.bound in ("memory", "cache", "latency", "launch", "ALU",
                               "threadgroup memory")
    naive, tiled = sorted(result.records, key=tile_of)
    assert tiled.counters.coalescing > naive.counters.coalescing  # why the model says so


def test_the_table_labels_the_emulator_clock_and_shows_the_model(transposes) -> None:
    text = str(transposes)
    chip = mtwork.gpu.default_gpu()
    assert f"ranked by modelled time on {chip.label}" in text
    assert "emulator CPU median" in text and f"modelled ({chip.name})" in text
    assert "best by modelled time (lower is better): tile=16" in text
    best = transposes.best()
    row = next(line for line in text.splitlines() if line.startswith("16 "))
    assert best.bound in row
    html = transposes._repr_html_()
    assert "emulator CPU median" in html and "bound" in html


def test_the_cache_keeps_counters_and_serves_another_chip_without_running(tmp_path) -> None:
    cache = tmp_path / "transpose.jsonl"
    built = []

    def counting(config):
        built.append(config["tile"])
        return transpose(config)

    first = sweep(counting, {"tile": [0, 16]}, cache=cache, key="t1", **KW)
    entries = [json.loads(line) for line in cache.read_text().splitlines()]
    for entry, record in zip(entries, first.records):
        assert entry["modelled"]["bound"] == record.bound
        assert entry["modelled"]["seconds"] == record.modelled
        assert entry["counters"]["kernel"] == record.counters.kernel
    built.clear()
    other = sweep(counting, {"tile": [0, 16]}, cache=cache, key="t1", gpu="M2 Ultra", **KW)
    assert built == [] and all(r.cached for r in other.records)
    ultra = mtwork.gpu("M2 Ultra")
    for mine, theirs in zip(first.records, other.records):
        assert theirs.estimate.chip == ultra.label
        assert theirs.modelled == mtwork.gpu.estimate(mine.counters, ultra).seconds
    assert "M2 Ultra" in str(other)


def test_an_old_cache_file_without_the_model_still_loads(tmp_path) -> None:
    cache = tmp_path / "old.jsonl"
    sweep(transpose, {"tile": [0, 16]}, cache=cache, key="t2", **KW)
    old = [json.loads(line) for line in cache.read_text().splitlines()]
    for entry in old:
        for name in ("counters", "modelled", "model_note"):
            del entry[name]
    cache.write_text("".join(json.dumps(e) + "\n" for e in old))
    again = sweep(transpose, {"tile": [0, 16]}, cache=cache, key="t2", **KW)
    assert all(r.cached and r.ok and r.estimate is None for r in again.records)
    assert again.best().config == again.best("time").config  # nothing to model: measured
    assert "—" in str(again)
    # counters of another shape (another version's) load as no counters, and say so
    old[0]["counters"] = {"kernel": "k", "threadgroups": 1, "wavefronts": 3}
    cache.write_text("".join(json.dumps(e) + "\n" for e in old))
    odd = sweep(transpose, {"tile": [0, 16]}, cache=cache, key="t2", **KW)
    assert odd.records[0].cached and odd.records[0].counters is None
    assert "unknown key 'wavefronts'" in odd.records[0].model_note


def test_entries_of_an_older_cache_format_are_run_again(tmp_path) -> None:
    cache = tmp_path / "format.jsonl"
    sweep(transpose, {"tile": [0, 16]}, cache=cache, key="t4", **KW)
    entries = [json.loads(line) for line in cache.read_text().splitlines()]
    entries[0]["format"] = CACHE_FORMAT - 1  # counted before the current counters
    cache.write_text("".join(json.dumps(e) + "\n" for e in entries))
    built = []

    def counting(config):
        built.append(config["tile"])
        return transpose(config)

    again = sweep(counting, {"tile": [0, 16]}, cache=cache, key="t4", **KW)
    assert built == [entries[0]["config"]["tile"]]
    assert [r.cached for r in again.records] == [False, True]


def test_an_interrupted_sweep_keeps_the_model_of_what_finished(tmp_path, monkeypatch
                                                               ) -> None:
    from mtwork.run import Runner

    cache = tmp_path / "cut.jsonl"
    real_run = Runner.run

    def interrupted_on_second(self, launch, config):
        if config["tile"] == 16:
            raise KeyboardInterrupt
        return real_run(self, launch, config)

    monkeypatch.setattr(Runner, "run", interrupted_on_second)
    with pytest.raises(SweepInterrupted) as caught:
        sweep(transpose, {"tile": [0, 16]}, cache=cache, key="t3", **KW)
    (kept,) = caught.value.result.records
    assert kept.estimate is not None and kept.bound is not None
    (entry,) = [json.loads(line) for line in cache.read_text().splitlines()]
    assert entry["modelled"]["seconds"] == kept.modelled


def test_the_flash_attention_family_ranks_its_simdgroup_matrix_kernel_first() -> None:
    family = mtwork.load_family("flash_attention")
    shape = family.Shape(batch=1, heads=1, q_len=128, kv_len=128, head_dim=64)

    def build(config):
        if config["kernel"] == "naive":
            return family.naive_launch(shape)
        return family.flash_launch(shape, tiles=family.Tiles(32, 32, 2))

    result = sweep(build, {"kernel": ["naive", "flash"]}, inputs=family.make_inputs(shape),
                   oracle=family.reference_for(False), rounds=1, warmup=0, progress=False)
    assert [r.config["kernel"] for r in result.ranked()] == ["flash", "naive"]
    flash = result.best()
    assert flash.bound == "matrix" and flash.counters.simd.mma_f32 > 0


# --- metal: measured time ranks, the model beside it ----------------------------------------


class FakeMetal(SimBackend):
    """The emulator under the metal backend's name, so that a sweep takes the metal path
    (its clock reads as GPU time) off a Mac."""

    name = "metal"


@pytest.fixture
def fake_metal():
    original = _FACTORIES["metal"]
    register("metal", FakeMetal)
    try:
        yield
    finally:
        register("metal", original)


def test_on_metal_measured_time_ranks_and_the_model_error_is_shown(fake_metal) -> None:
    result = sweep(transpose, {"tile": [0, 16]}, backend="metal", **KW)
    assert result.clock.backend == "metal" and result.objective == "time"
    assert [r.time for r in result.ranked()] == sorted(r.time for r in result.records)
    for r in result.records:
        assert r.estimate is not None
        assert r.model_error == pytest.approx(r.time / r.modelled)
    text = str(result)
    assert "GPU median" in text and "measured / modelled" in text
    assert "the model's error as measured / modelled" in text
    for r in result.records:
        row = next(line for line in text.splitlines()
                   if line.startswith(f"{r.config['tile']} "))
        assert f"{r.model_error:.3g}×" in row and r.bound in row


def test_compare_on_metal_shows_the_model_error(fake_metal) -> None:
    naive, tiled = transpose({"tile": 0}), transpose({"tile": 16})
    naive.inputs = tiled.inputs = [X]
    c = mtwork.compare({"naive": naive, "tiled": tiled}, rounds=2, warmup=0, backend="metal")
    assert c.ranked_by == "measured"
    medians = {n: m.median for n, m in c.measurements.items()}
    assert c.ranked() == sorted(medians, key=medians.get)
    for name in ("naive", "tiled"):
        assert c.model_errors[name] == pytest.approx(medians[name] / c.estimates[name].seconds)
    assert "measured / modelled" in str(c)


# --- compare on sim ------------------------------------------------------------------------


def test_compare_on_sim_ranks_by_the_model() -> None:
    naive, tiled = transpose({"tile": 0}), transpose({"tile": 16})
    naive.inputs = tiled.inputs = [X]
    c = mtwork.compare({"naive": naive, "tiled": tiled}, rounds=2, warmup=1)
    assert c.ranked_by == "modelled" and c.ranked() == ["tiled", "naive"]
    assert c.modelled_speedups["tiled"] == pytest.approx(
        c.estimates["naive"].seconds / c.estimates["tiled"].seconds)
    assert c.modelled_speedups["tiled"] > 1
    text = str(c)
    assert "emulator CPU median" in text and "modelled speed-up vs naive" in text
    assert text.index("\ntiled ") < text.index("\nnaive ")  # the table in ranked order


def test_compare_models_a_callable_that_dispatches_one_kernel() -> None:
    # A family's `run` or a function around one launch: its kernel call is profiled.
    naive, tiled = transpose({"tile": 0}), transpose({"tile": 16})
    c = mtwork.compare({"naive": lambda: naive(X)[0] + 1, "tiled": lambda: tiled(X)},
                       rounds=2, warmup=1)
    assert c.ranked_by == "modelled" and c.ranked() == ["tiled", "naive"]
    assert c.estimates["naive"].kernel == "transpose_naive"
    assert c.model_verdict().startswith(f"on {mtwork.gpu.default_gpu().label} the model "
                                        "expects tiled to win: ")
    both = mtwork.compare({"one": lambda: naive(X), "two": lambda: (naive(X), tiled(X))},
                          rounds=1, warmup=0)
    assert both.ranked_by == "measured"
    assert "dispatched 2 kernels" in both.model_notes["two"]
    assert "estimate_sequence" in both.model_notes["two"]
    assert "cannot rank" in both.model_verdict() and "dispatched 2 kernels" in both.model_verdict()


def test_compare_of_plain_callables_ranks_by_the_clock_and_says_why() -> None:
    c = mtwork.compare({"a": lambda: mx.zeros(4), "b": lambda: mx.ones(4)}, rounds=2,
                       warmup=0)
    assert c.ranked_by == "measured" and not c.modelled
    assert "plain callable" in str(c)
    assert "modelled" not in str(mtwork.compare({"a": lambda: None, "b": lambda: None},
                                                rounds=1, warmup=0, gpu=False))


# --- choosing the chip ----------------------------------------------------------------------


def pair_build(config):
    return lambda: config["a"]


def test_gpu_false_turns_the_model_off_and_plain_callables_fall_back_to_time() -> None:
    off = sweep(pair_build, {"a": [1, 2]}, rounds=1, warmup=0, progress=False, gpu=False)
    assert off.chip is None and off.objective == "time" and "modelled" not in str(off)
    on = sweep(pair_build, {"a": [1, 2]}, rounds=1, warmup=0, progress=False)
    assert on.objective == "modelled" and on.direction(None, None)[0] == "time"
    assert all("plain callable" in r.model_note for r in on.records)
    with pytest.raises(SweepError, match="objective='modelled' needs a GPU"):
        sweep(pair_build, {"a": [1]}, objective="modelled", gpu=False, progress=False)


def test_the_gpu_comes_from_mtwork_gpu_or_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MTWORK_GPU", "M3 Pro")
    assert sweep(pair_build, {"a": [1]}, rounds=1, progress=False).chip == mtwork.gpu("M3 Pro")
    with pytest.raises(ValueError, match="unknown GPU 'M9 Giga'"):
        sweep(pair_build, {"a": [1]}, gpu="M9 Giga", progress=False)
    with pytest.raises(TypeError, match="gpu= takes a chip name"):
        sweep(pair_build, {"a": [1]}, gpu=3, progress=False)


def test_each_passing_setting_is_profiled_once_and_a_cached_one_not_again(monkeypatch,
                                                                          tmp_path) -> None:
    from mtwork.backends.sim import SimBackend

    profiled = []
    calls = []
    real = SimBackend.dispatch

    def dispatch(self, program, call):
        (profiled if call.options.profile else calls).append(program.label)
        return real(self, program, call)

    monkeypatch.setattr(SimBackend, "dispatch", dispatch)
    space = {"tile": [0, 8, 16]}
    cache = tmp_path / "once.jsonl"
    first = sweep(transpose, space, cache=cache, key="t4", **KW)
    assert len(profiled) == 3 and all(r.estimate for r in first.records)
    # the profiled call is each setting's first, checked against the oracle: the model
    # adds no call (warmup 1 and 2 rounds each)
    assert len(calls) == 3 * 3
    profiled.clear()
    again = sweep(transpose, space, cache=cache, key="t4", **KW)
    assert profiled == [] and [r.modelled for r in again.records] == [
        r.modelled for r in first.records]


def test_every_setting_compiles_plain_and_profiled_before_any_runs(monkeypatch) -> None:
    from mtwork.backends.sim import SimBackend

    events = []
    compile_, dispatch = SimBackend.compile, SimBackend.dispatch

    def compiling(self, program, *, sanitize=False, profile=False):
        if not any(e[0] == "run" for e in events):
            events.append(("compile", program.label, profile))
        return compile_(self, program, sanitize=sanitize, profile=profile)

    def running(self, program, call):
        events.append(("run", program.label, call.options.profile))
        return dispatch(self, program, call)

    monkeypatch.setattr(SimBackend, "compile", compiling)
    monkeypatch.setattr(SimBackend, "dispatch", running)
    space = {"tile": [0, 8, 16]}
    ahead = sweep(transpose, space, **KW)
    before = {(label, profile) for kind, label, profile in events if kind == "compile"}
    assert before == {(label, profile) for label in ("transpose_naive", "transpose_tiled")
                      for profile in (False, True)}
    # the same records as settings built one by one (compile-error skipping builds none
    # ahead): the same outcomes and counts, so the same modelled times
    events.clear()
    alone = sweep(transpose, space, skip_compile_errors=True, **KW)
    kinds = [kind for kind, _, _ in events]
    assert kinds.count("compile") <= 2 < len(kinds)  # the first setting's builds only
    assert [(r.status, r.modelled) for r in ahead.records] == [
        (r.status, r.modelled) for r in alone.records]
