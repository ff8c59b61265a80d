"""The GPU model's validation set (tests/validation): its structure and the model's
invariants on a representative part by default (one llama.cpp and one MLX pair), every
pair as slow tests. Timings are the bench's (bench/gpu_model_validation.py), not asserted
here. The published sources come from pip on first use and stay in the user's cache."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtwork.gpu import Counters, estimate, estimate_sequence, scaled
from tests.validation import evaluate, llama, mlx_side, published
from tests.validation.catalog import PAIRS
from tests.validation.pairs import Pair

REPRESENTATIVE = ("llama.cpp #2188", "MLX #3764: qmv_wide for 2 vectors, int4, 15360x3840")


def _pair(prefix: str) -> Pair:
    return next(p for p in PAIRS if p.name.startswith(prefix))


def _available(call):
    try:
        return call()
    except published.Unavailable as exc:
        pytest.skip(str(exc))


def test_the_set_is_at_least_its_published_figures() -> None:
    names = [p.name + p.chip for p in PAIRS]
    assert len(set(names)) == len(names)
    for p in PAIRS:
        assert p.published.url.startswith(("https://github.com/", "seed "))
        assert p.published.ratio > 0 and p.published.says
        assert p.before.source != p.after.source or p.before.kernels != p.after.kernels
        if p.level == "token":  # bounds need the measured tokens
            assert p.published.before and p.published.after


def test_published_sources_come_from_the_package_cache() -> None:
    source = _available(lambda: published.llama_cpp("0.1.71")) / "ggml-metal.metal"
    assert source.is_file() and published.cache_root() in source.parents
    assert "N_SIMDGROUP" in source.read_text()  # #2188's kernel, as released
    include = _available(lambda: published.mlx_include("0.32.0"))
    assert (include / mlx_side.KERNELS / "quantized.h").read_text().count("qmv_wide") > 1


def test_a_slice_scaled_is_the_whole_dispatch() -> None:
    # 128 rows profiled whole, and 64 rows taken twice: the same counts, the shared
    # vector's lines once (0.1.70's kernel: a row a threadgroup, no read past its row).
    # The chains are rounded once per profile, so they may differ by that rounding.
    whole = _available(lambda: llama._profile("0.1.70", "q4_0", 128, 512)).to_dict()
    half = llama._profile("0.1.70", "q4_0", 64, 512)
    twice = scaled(half, 2, shared=("src1",)).to_dict()
    for chain in ("dependent_issues", "dependent_loads"):
        assert abs(twice.pop(chain) - whole.pop(chain)) <= 2
    assert twice == whole
    assert [s.line for s in half.source_lines] == [s["line"] for s in twice["source_lines"]]
    with pytest.raises(ValueError, match="no buffer"):
        scaled(half, 2, shared=("vector",))


def test_scalar_arguments_are_not_buffer_traffic() -> None:
    c = _available(lambda: llama.mat_vec("0.1.70", "q4_0", 64, 512))
    assert {b.buffer for b in c.buffers} == {"src0", "src1", "dst"}  # not ne00, ne10, ne0


def test_a_k_quant_tokens_vocabulary_projection_runs_q6_k(monkeypatch) -> None:
    # llama.cpp's quantizer of 2023 stores output.weight as Q6_K for every type
    made = []
    monkeypatch.setattr(llama, "mat_vec", lambda version, quant, rows, cols: made.append(
        (quant, rows, cols)) or Counters("k", 1, 32))
    for quant in ("q4_K", "q5_K", "q6_K", "q4_0"):
        made.clear()
        token = llama.llama_token("0.1.73", quant, embd=4096, ff=11008, layers=32)
        assert [n for _, n in token] == [128, 64, 32, 1]
        assert made[-1] == ("q4_0" if quant == "q4_0" else "q6_K", 32000, 4096)
        assert {q for q, _, _ in made[:-1]} == {quant}


@pytest.mark.parametrize("prefix", REPRESENTATIVE)
def test_representative_pairs_model_on_their_chip(prefix: str) -> None:
    pair = _pair(prefix)
    row = _available(lambda: evaluate.model(pair))
    for side, sequence in ((pair.before, row.before), (pair.after, row.after)):
        dispatches = side.dispatches()
        assert sequence.dispatches == sum(n for _, n in dispatches)
        # a sequence is its dispatches' modelled times plus the host's per dispatch
        gpu = sum(estimate(c, pair.chip).seconds * n for c, n in dispatches)
        assert math.isclose(sequence.gpu_seconds, gpu)
        assert sequence.seconds > sequence.gpu_seconds
    assert math.isclose(row.modelled, row.before_seconds / row.after_seconds)
    timed = row.before.gpu_seconds if pair.timed == "gpu" else row.before.seconds
    assert row.before_seconds == timed
    assert row.direction_right == ((row.modelled > 1) == (row.published > 1)) or (
        pair.level == "kernel" and abs(row.published - 1) <= evaluate.NEAR_ONE)
    if pair.level == "token":
        fits, _ = row.token_bounds
        assert fits == (row.before_seconds <= pair.published.before
                        and row.after_seconds <= pair.published.after)


def test_summary_counts_its_rows() -> None:
    c = Counters("k", 64, 256, ops=_ops())
    fast = estimate_sequence([c], "M1 Max")
    slow = estimate_sequence([(c, 3)], "M1 Max")
    assert slow.dispatches == 3 and slow.gpu_seconds == pytest.approx(3 * fast.gpu_seconds)
    pair = _pair(REPRESENTATIVE[1])
    rows = [evaluate.Row(pair, slow, fast), evaluate.Row(pair, fast, slow)]
    s = evaluate.summary(rows)
    assert (s.pairs, s.directions_right, s.kernel_pairs) == (2, 1, 2)
    assert s.kernel_ratios_within == sum(bool(r.ratio_within) for r in rows)


def _ops():
    from mtwork.gpu import LaneOps

    return LaneOps(f32=int(np.int64(64 * 256 * 100)))


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p.name} ({p.chip})")
def test_every_pair_models(pair: Pair) -> None:
    row = _available(lambda: evaluate.model(pair))
    assert row.before.seconds > 0 and row.after.seconds > 0
    assert math.isfinite(row.ratio_error)


def test_the_parts_alternate_and_the_fit_picks_the_value_that_matches() -> None:
    # Every family has pairs in both parts.
    assert {p.part for p in PAIRS[0::2]} == {"fit"}
    assert {p.part for p in PAIRS[1::2]} == {"held out"}
    # A side whose loads hit the L2 against a streaming one: below about 1.6 times Little's
    # law the cap makes the first latency-bound, above it the L1 bounds it, so a
    # published ratio made at 1, 1.5 or 2 is fitted back to that candidate (2 ties with
    # the larger ones; the first candidate of equal loss is kept).
    from mtwork.gpu import BufferTraffic
    from tests.validation import fit
    from tests.validation.pairs import Published, Side

    loads = 1_000_000
    waiting = Counters("waiting", threadgroups=32 * 3, threads_per_threadgroup=256,
                       load_issues=4, dependent_loads=1, buffers=[
                           BufferTraffic("a", load_bytes=128 * loads, loads=loads,
                                         transactions=loads, distinct_lines=1000)])
    streaming = Counters("streaming", threadgroups=4096, threads_per_threadgroup=256,
                         buffers=[BufferTraffic("a", load_bytes=1 << 26, loads=1 << 19,
                                                transactions=1 << 19,
                                                distinct_lines=1 << 19)])
    sides = ([(waiting, 1)], [(streaming, 1)])

    def pair(ratio: float) -> Pair:
        return Pair("synthetic", "kernel", "M1 Max", Published("synthetic", "made", ratio),
                    Side("a", "waiting", lambda: sides[0]),
                    Side("b", "streaming", lambda: sides[1]), timed="gpu")

    ratios = {value: fit.rows_with([pair(1.0)], [sides], value)[0].modelled
              for value in (1.0, 1.5, 2.0)}
    assert len(set(ratios.values())) == 3
    for value, ratio in ratios.items():
        assert fit.fit([pair(ratio)], [sides]).value == value
    with pytest.raises(ValueError, match="at least one pair"):
        fit.fit([], [])
