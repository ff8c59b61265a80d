"""Sweeps: a real block-sum kernel on sim with every kind of outcome, the cache and resume,
strategies and budgets, and the errors a mis-set sweep gives."""

import json
import sys
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.kernel import Launch, define_lines
from mtwork.oracle import diff
from mtwork.sweep import (
    OracleError,
    SweepError,
    SweepInterrupted,
    UnknownParameterError,
    divides,
    sweep,
    threadgroup_memory_under,
    threads_per_threadgroup_under,
)
from mtwork.sweep.cache import identity

SIM_LABEL = "emulator CPU time (sim) — not GPU speed"

# Each threadgroup sums TG * ITEMS consecutive elements with a tree over threadgroup
# memory. Two real bugs are left in on purpose: the tree assumes TG is a power of two
# (48 drops partial sums), and threads past the end wait at a barrier of their own before
# returning, which deadlocks when a whole SIMD-group of the last threadgroup has no data.
BLOCK_SUM = """
    static_assert(ITEMS <= 4, "at most 4 items per thread");
    threadgroup float partial[TG];
    uint lid = thread_position_in_threadgroup.x;
    uint group = threadgroup_position_in_grid.x;
    uint first = (group * TG + lid) * ITEMS;
    if (first >= N) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        return;
    }
    float acc = 0.0f;
    for (uint k = 0; k < ITEMS; ++k) acc += a[first + k];
    partial[lid] = acc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = TG / 2; s > 0; s >>= 1) {
        if (lid < s) partial[lid] += partial[lid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (lid == 0) out[group] = partial[0];
"""
N = 384  # a multiple of 32, 48, 64, 96 and 192, but not of 144
KERNEL = mtwork.metal_kernel("block_sum", ["a"], ["out"], BLOCK_SUM)
X = mx.array(np.random.default_rng(0).standard_normal(N).astype(np.float32))


def groups(config) -> int:
    return -(-N // (config["tg"] * config["items"]))


def build(config) -> Launch:
    return Launch(
        KERNEL,
        grid=(groups(config) * config["tg"], 1, 1),
        threadgroup=(config["tg"], 1, 1),
        output_shapes=[(groups(config),)],
        output_dtypes=[mx.float32],
        template=[("TG", config["tg"]), ("ITEMS", config["items"])],
        defines={"N": N},
    )


def block_sums(a, *, config):
    """Sums of consecutive blocks of tg * items elements, in float64."""
    per_block = config["tg"] * config["items"]
    x = np.asarray(a, dtype=np.float64)
    x = np.pad(x, (0, groups(config) * per_block - x.size))
    return x.reshape(-1, per_block).sum(axis=1)


SAFE_SPACE = {"tg": [32, 64], "items": [1, 3]}  # every configuration passes


def by_config(result):
    return {(r.config["tg"], r.config["items"]): r for r in result.records}


# --- a real kernel on sim -----------------------------------------------------------------------


def test_sweep_records_ok_wrong_compile_error_and_fault() -> None:
    result = sweep(
        build,
        {"tg": [32, 48, 64, 2048], "items": [1, 3, 8]},
        inputs=[X],
        oracle=block_sums,
        constraints=[
            threads_per_threadgroup_under(1024, key="tg"),
            "items != 8 or tg == 32",  # one configuration that cannot compile is enough
        ],
        rounds=3,
        progress=False,
    )
    assert (result.space_size, result.candidates, len(result.records)) == (12, 7, 7)
    records = by_config(result)
    status = {k: r.status for k, r in records.items()}
    assert status == {
        (32, 1): "ok", (32, 3): "ok", (64, 1): "ok", (64, 3): "ok",
        (48, 1): "wrong",  # the tree assumes a power of two
        (48, 3): "fault",  # 384 is not a multiple of 144: the last group's second
                           # SIMD-group waits at the other barrier
        (32, 8): "compile_error",
    }
    compile_error = records[(32, 8)]
    assert "static assertion failed" in compile_error.message
    assert "source:2:" in compile_error.message  # the author's own line number
    assert records[(48, 3)].error_type == "KernelDeadlock"
    wrong = records[(48, 1)]
    assert wrong.measurement is None  # a wrong answer is not timed
    assert not wrong.diffs[0].ok and wrong.check.startswith("FAIL")
    for r in result.ok:
        assert r.diffs[0].ok and r.measurement.rounds == 3
        assert r.measurement.clock.label == SIM_LABEL
        assert r.first_call_s > 0
    assert result.best() in result.ok
    # On sim the sweep ranks by the model; the emulator's clock still ranks on request.
    assert result.objective == "modelled" and all(r.estimate is not None for r in result.ok)
    assert result.best().modelled == min(r.modelled for r in result.ok)
    assert result.best("time").time == min(r.time for r in result.ok)
    text = str(result)
    assert SIM_LABEL in text and "4 ok, 1 wrong, 1 compile_error, 1 fault" in text
    assert "deadlocked" in text
    assert SIM_LABEL in result._repr_html_()


def test_interrupted_sweep_keeps_its_results_and_resumes(tmp_path, monkeypatch) -> None:
    from mtwork.run import Runner

    cache = tmp_path / "block_sum.jsonl"
    built = []
    ran = []
    real_run = Runner.run

    def interrupted_on_third(self, launch, config):
        ran.append(dict(config))
        if len(ran) == 3:
            raise KeyboardInterrupt
        return real_run(self, launch, config)

    kwargs = dict(inputs=[X], oracle=block_sums, cache=cache, key="block_sum v1", rounds=2,
                  progress=False)
    with monkeypatch.context() as patched, pytest.raises(SweepInterrupted) as caught:
        patched.setattr(Runner, "run", interrupted_on_third)
        sweep(build, SAFE_SPACE, **kwargs)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert [r.status for r in caught.value.result.records] == ["ok", "ok"]
    assert caught.value.result.stopped == "interrupted"
    assert len(cache.read_text().splitlines()) == 2

    def counting(config):
        built.append(dict(config))
        return build(config)

    built.clear()
    resumed = sweep(counting, SAFE_SPACE, **kwargs)
    assert built == [{"tg": 64, "items": 1}, {"tg": 64, "items": 3}]  # only the rest
    assert [r.cached for r in resumed.records] == [True, True, False, False]
    assert all(r.ok for r in resumed.records)

    built.clear()
    again = sweep(counting, SAFE_SPACE, **kwargs)
    assert built == [] and all(r.cached for r in again.records)
    assert [r.time for r in again.records] == [r.time for r in resumed.records]
    assert again.best().config == resumed.best().config


def test_sweep_runs_a_launch_on_its_backend() -> None:
    result = sweep(build, {"tg": [32], "items": [1]}, inputs=[X], oracle=block_sums,
                   backend="sim", rounds=1, progress=False)
    assert result.clock.backend == "sim" and result.records[0].ok


def test_launch_without_sweep_matches_the_oracle() -> None:
    config = {"tg": 64, "items": 3}
    launch = build(config)
    launch.inputs = [X]
    assert diff(launch()[0], block_sums(X, config=config)).ok
    assert "#define N 384" in launch.defined_kernel.header


# --- the cache file -------------------------------------------------------------------------------


def quick_build(config):
    """A stand-in kernel: plain numpy, so cache and strategy tests need no compiler."""
    return lambda x: np.asarray(x) * config["scale"]


def test_cache_file_is_json_lines_and_survives_a_cut_line(tmp_path) -> None:
    cache = tmp_path / "quick.jsonl"
    space = {"scale": [1, 2, 3]}
    x = np.arange(4.0)

    def identity(x):
        return np.asarray(x, dtype=np.float64)

    first = sweep(quick_build, space, inputs=[x], oracle=identity, cache=cache, rounds=2,
                  progress=False)
    assert [r.status for r in first.records] == ["ok", "wrong", "wrong"]
    lines = cache.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["config"] for e in entries] == [{"scale": 1}, {"scale": 2}, {"scale": 3}]
    assert entries[0]["measurement"]["backend"] == "sim"
    assert entries[1]["diffs"][0]["ok"] is False
    # A run killed mid-write leaves half a line: it is ignored, and the next append
    # starts on a fresh line.
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    second = sweep(quick_build, space, inputs=[x], oracle=identity, cache=cache, rounds=2,
                   progress=False)
    assert [r.cached for r in second.records] == [True, True, False]
    assert all(json.loads(line) for line in cache.read_text().splitlines()[-1:])
    # Inputs of another shape are another problem: nothing is reused.
    longer = sweep(quick_build, space, inputs=[np.arange(5.0)], oracle=identity, cache=cache,
                   rounds=2, progress=False)
    assert not any(r.cached for r in longer.records)


def test_cache_key_follows_the_kernel_source() -> None:
    other = mtwork.metal_kernel("block_sum", ["a"], ["out"], BLOCK_SUM.replace("s >>= 1", "s /= 2"))

    def build_other(config):
        return Launch(other, grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)],
                      output_dtypes=[mx.float32])

    def build_same(config):
        return Launch(KERNEL, grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)],
                      output_dtypes=[mx.float32])

    assert identity(build, block_sums) == identity(build, block_sums)
    assert identity(build_same, None) != identity(build_other, None)


# --- strategies and budgets --------------------------------------------------------------------


GRID = {"a": list(range(5)), "b": list(range(4))}


def pair_build(config):
    return lambda: (config["a"], config["b"])


def configs(result):
    return [(r.config["a"], r.config["b"]) for r in result.records]


def test_random_strategy_samples_a_budget_of_distinct_configurations() -> None:
    kw = dict(strategy="random", budget=6, rounds=1, warmup=0, progress=False)
    first = sweep(pair_build, GRID, seed=3, **kw)
    assert len(first.records) == 6 and len(set(configs(first))) == 6
    assert first.stopped == "budget"
    assert configs(first) == configs(sweep(pair_build, GRID, seed=3, **kw))
    assert configs(first) != configs(sweep(pair_build, GRID, seed=4, **kw))
    assert configs(first) != [(a, b) for a in range(5) for b in range(4)][:6]


def test_latin_strategy_covers_every_value_of_every_parameter() -> None:
    space = {"a": [1, 2, 3, 4, 5, 6], "b": [10, 20, 30, 40]}
    kw = dict(strategy="latin", budget=12, rounds=1, warmup=0, progress=False)
    first = sweep(pair_build, space, seed=1, **kw)
    picked = configs(first)
    assert len(set(picked)) == 12
    assert sorted(a for a, _ in picked) == sorted([1, 2, 3, 4, 5, 6] * 2)
    assert sorted(b for _, b in picked) == sorted([10, 20, 30, 40] * 3)
    assert picked == configs(sweep(pair_build, space, seed=1, **kw))
    assert picked != configs(sweep(pair_build, space, seed=2, **kw))


def test_latin_strategy_respects_the_constraints() -> None:
    space = {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}
    result = sweep(pair_build, space, constraints=["a != b"], strategy="latin", budget=8,
                   rounds=1, warmup=0, progress=False)
    picked = configs(result)
    assert len(set(picked)) == 8 and all(a != b for a, b in picked)
    assert {a for a, _ in picked} == {1, 2, 3, 4} and {b for _, b in picked} == {1, 2, 3, 4}


def test_exhaustive_with_budget_takes_the_space_in_order() -> None:
    result = sweep(pair_build, GRID, budget=3, rounds=1, warmup=0, progress=False)
    assert configs(result) == [(0, 0), (0, 1), (0, 2)]


def test_time_budget_stops_starting_new_configurations() -> None:
    def slow_build(config):
        time.sleep(0.05)
        return lambda: None

    result = sweep(slow_build, GRID, time_budget=0.12, rounds=1, warmup=0, progress=False)
    assert 1 <= len(result.records) < 20
    assert result.stopped == "time budget"


def test_metrics_and_objective() -> None:
    nbytes = 1e6

    def sleepy(config):
        return lambda: time.sleep(config["ms"] / 1000)

    result = sweep(
        sleepy, {"ms": [4, 1, 2]}, rounds=3, warmup=0, progress=False,
        metrics={"GB/s": lambda config, m: nbytes / m.median / 1e9},
        objective="GB/s", maximize=True,
    )
    best = result.best()
    assert best.metrics["GB/s"] == max(r.metrics["GB/s"] for r in result.records)
    assert best.config == result.best("time").config
    assert result.best("GB/s", maximize=False).config == result.best("time", maximize=True).config
    assert "GB/s" in str(result) and "higher is better" in str(result)
    with pytest.raises(SweepError, match="objective 'GFLOP/s'"):
        sweep(sleepy, {"ms": [1]}, objective="GFLOP/s", progress=False)


# --- outcomes of plain callables ------------------------------------------------------------


def test_failures_are_classified_by_exception() -> None:
    def build_with_failures(config):
        kind = config["kind"]
        if kind == "compile":
            raise mtwork.CompileError("k", "source:1:1: error: nope")
        if kind == "fault":
            return lambda: (_ for _ in ()).throw(mtwork.KernelTimeout("k", "ran too long"))
        if kind == "error":
            return lambda: (_ for _ in ()).throw(ValueError("bad launch"))
        return lambda: np.zeros(2)

    result = sweep(build_with_failures, {"kind": ["ok", "compile", "fault", "error"]},
                   oracle=np.zeros(2), rounds=1, progress=False)
    status = {r.config["kind"]: (r.status, r.error_type) for r in result.records}
    assert status == {
        "ok": ("ok", None),
        "compile": ("compile_error", "CompileError"),
        "fault": ("fault", "KernelTimeout"),
        "error": ("error", "ValueError"),
    }


def test_an_oracle_per_configuration_that_raises_is_recorded() -> None:
    def oracle(*, config):
        if config["n"] == 2:
            raise RuntimeError("no reference for n=2")
        return np.arange(config["n"], dtype=np.float64)

    result = sweep(lambda c: lambda: np.arange(c["n"], dtype=np.float64),
                   {"n": [1, 2, 3]}, oracle=oracle, rounds=1, progress=False)
    assert [r.status for r in result.records] == ["ok", "oracle_error", "ok"]
    assert "RuntimeError: no reference for n=2" in result.records[1].message


# --- mistakes in the sweep itself -----------------------------------------------------------------


def test_an_oracle_that_raises_stops_the_sweep_with_its_cause() -> None:
    with pytest.raises(OracleError, match="ZeroDivisionError") as caught:
        sweep(quick_build, {"scale": [1, 2]}, inputs=[np.ones(2)], oracle=lambda x: 1 / 0,
              progress=False)
    assert "oracle" in str(caught.value)


@pytest.mark.parametrize(
    "rule",
    [
        "tgg % 32 == 0",
        divides("tgg", 1024),
        threadgroup_memory_under("tgg * 4"),
        threads_per_threadgroup_under(1024, key="tgg"),
        lambda c: c["tgg"] > 0,
    ],
)
def test_a_constraint_naming_an_unknown_parameter_is_an_error(rule) -> None:
    with pytest.raises(UnknownParameterError) as caught:
        sweep(pair_build, {"tg": [32], "items": [1]}, constraints=[rule], progress=False)
    message = str(caught.value)
    assert "'tgg'" in message and "did you mean 'tg'" in message
    assert message.startswith("constraint ")


def test_a_build_naming_an_unknown_parameter_is_an_error() -> None:
    with pytest.raises(UnknownParameterError, match=r"build\(config\).*'itemz'"):
        sweep(lambda c: c["itemz"], {"tg": [32], "items": [1]}, progress=False)


def test_an_empty_space_says_which_constraints_emptied_it() -> None:
    with pytest.raises(SweepError) as caught:
        sweep(pair_build, {"tg": [32, 64, 128]},
              constraints=[divides("tg", 7), threadgroup_memory_under("tg * 4", limit=1024)],
              progress=False)
    message = str(caught.value)
    assert "divides('tg', 7): 3 of 3" in message
    assert "threadgroup_memory_under('tg * 4', limit=1024): 0 of 3" in message


@pytest.mark.parametrize(
    ("space", "match"),
    [
        ({}, "non-empty"),
        ({"tg": 32}, "list of values"),
        ({"tg": "32"}, "list of values"),
        ({"tg": []}, "no values"),
    ],
)
def test_malformed_spaces_are_refused(space, match) -> None:
    with pytest.raises(SweepError, match=match):
        sweep(pair_build, space, progress=False)


@pytest.mark.parametrize("text", ["__import__('os')", "tg.bit_length()", "[tg for tg in x]"])
def test_expressions_allow_only_arithmetic(text) -> None:
    with pytest.raises(SweepError, match="only arithmetic"):
        sweep(pair_build, {"tg": [32]}, constraints=[text], progress=False)


def test_ready_made_constraints() -> None:
    result = sweep(
        pair_build,
        {"a": [16, 32, 48], "b": [8, 16, 32, 64]},
        constraints=[
            threads_per_threadgroup_under(1024, key=("a", "b")),
            threadgroup_memory_under(lambda c: c["a"] * c["b"] * 16, limit=16384),
            divides("b", 64),
        ],
        rounds=1, warmup=0, progress=False,
    )
    assert sorted(configs(result)) == [(16, 8), (16, 16), (16, 32), (16, 64), (32, 8),
                                       (32, 16), (32, 32), (48, 8), (48, 16)]


# --- results --------------------------------------------------------------------------------


def test_define_lines() -> None:
    text = define_lines({"N": 4, "SCALE": 0.5, "FAST": True, "T": mx.float16, "OP": "a + b"})
    assert text.splitlines() == ["#define N 4", "#define SCALE 0.5f", "#define FAST true",
                                 "#define T float16_t", "#define OP a + b"]
    with pytest.raises(ValueError, match="identifiers"):
        define_lines({"not a name": 1})


def test_to_dataframe_without_pandas_says_how_to_get_it(monkeypatch) -> None:
    result = sweep(pair_build, {"a": [1], "b": [2]}, rounds=1, progress=False)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        result.to_dataframe()


def test_to_dataframe() -> None:
    pytest.importorskip("pandas")
    result = sweep(quick_build, {"scale": [1, 2]}, inputs=[np.ones(3)],
                   oracle=np.ones(3), rounds=2, progress=False)
    frame = result.to_dataframe()
    assert list(frame["scale"]) == [1, 2]
    assert list(frame["status"]) == ["ok", "wrong"]
    assert {"time", "time_min", "time_p95", "time_cv", "max_ulp", "message"} <= set(frame)


def test_best_without_passing_configurations_explains() -> None:
    result = sweep(quick_build, {"scale": [2]}, inputs=[np.ones(3)], oracle=np.ones(3),
                   progress=False)
    with pytest.raises(SweepError, match="no configuration passed.*1 wrong"):
        result.best()
