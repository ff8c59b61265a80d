"""mtwork.gpu: the chip table, the counters and the model of a dispatch's time."""

import json
from dataclasses import fields, replace

import pytest

from bench import gpu_model_claims as claims
from mtwork.gpu import (
    Assumptions,
    BufferTraffic,
    Counters,
    LaneOps,
    SimdOps,
    SourceLine,
    chips,
    counters_figure,
    default_gpu,
    estimate,
    estimates_figure,
    gpu,
    lines_figure,
    occupancy,
)
from mtwork.gpu.chips import fact_names
from mtwork.gpu.model import LANE_OP_CYCLES

# metal-benchmarks' GPU table (GOPS32 column), derived there from its own cores and clocks.
PUBLISHED_GOPS32 = {("M1", 8): 2617, ("M1 Pro", 16): 5308, ("M1 Max", 32): 10617,
                    ("M1 Ultra", 64): 21233, ("M2", 10): 3579, ("M2 Pro", 19): 6800,
                    ("M2 Max", 38): 13600}


# --- chip table ----------------------------------------------------------------------------


def test_every_fact_of_every_chip_has_a_source() -> None:
    for chip in chips():
        named = [name for name, _ in chip.sources]
        assert sorted(named) == sorted(fact_names()), chip.label
        for name in fact_names():
            source = chip.source(name)
            assert source.document.strip() and source.says.strip(), (chip.label, name)


def test_peak_rates_follow_from_cores_lanes_and_clock() -> None:
    for (name, cores), gops in PUBLISHED_GOPS32.items():
        chip = gpu(name, cores=cores)
        assert chip.fp32_tflops * 1000 == pytest.approx(gops, rel=0.005), chip.label
    for chip in chips():
        assert chip.fp32_tflops == pytest.approx(
            chip.gpu_cores * chip.alus_per_core * 2 * chip.clock_ghz / 1000)
        assert chip.fp16_tflops == chip.fp32_tflops
        assert chip.matrix_tflops_f32 < chip.fp32_tflops  # 101.7 of 128 FFMA per core-cycle
        assert "×" in chip.source("fp32_tflops").says


def test_measured_microarchitecture_is_an_estimate_on_chips_it_was_not_measured_on() -> None:
    assert not gpu("M1 Max").source("clock_ghz").estimate
    assert not gpu("M1 Max").source("memory_latency_ns").estimate
    assert gpu("M2 Max").source("memory_latency_ns").estimate
    for name in ("M3 Max", "M4 Pro", "M5 Max"):
        assert gpu(name).source("matrix_ffma_per_core_cycle_f32").estimate
        assert gpu(name).source("register_file_per_core").estimate
    assert not gpu("M4 Pro").source("clock_ghz").estimate  # measured (powermetrics)
    assert gpu("M5").source("clock_ghz").estimate


def test_variants_share_a_name_and_the_full_configuration_is_the_default() -> None:
    labels = [c.label for c in chips()]
    assert len(labels) == len(set(labels))
    by_name: dict[str, list] = {}
    for chip in chips():
        by_name.setdefault(chip.name, []).append(chip)
    for name, variants in by_name.items():
        full = max(variants, key=lambda c: c.gpu_cores)
        assert gpu(name) is full
        assert all(v.memory_bandwidth_gbs <= full.memory_bandwidth_gbs for v in variants)
    assert gpu("M3 Max", cores=30).memory_bandwidth_gbs == 300
    assert gpu("M4 Max", cores=32).memory_bandwidth_gbs == 410


# --- lookup --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["M2 Max", "m2max", "M2-Max", " m2_MAX "])
def test_gpu_accepts_spellings_of_a_name(name) -> None:
    assert gpu(name).label == "M2 Max (38-core GPU)"


@pytest.mark.parametrize("name, cores", [("M2 Max 30-core", 30), ("m2max30", 30),
                                         ("M2 Max (30-core GPU)", 30), ("M1 7-core", 7),
                                         ("m1", 8), ("M1 Ultra 48c", 48)])
def test_gpu_picks_a_variant_by_its_core_count(name, cores) -> None:
    assert gpu(name).gpu_cores == cores


def test_gpu_errors_name_what_is_known() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 'M7'.*M2 Max \(30 or 38 cores\)"):
        gpu("M7")
    with pytest.raises(ValueError, match="M2 Max comes with 30 or 38 GPU cores, not 32"):
        gpu("M2 Max", cores=32)
    with pytest.raises(ValueError, match="the name says 30 cores"):
        gpu("M2 Max 30-core", cores=38)
    with pytest.raises(TypeError, match="must be a string"):
        gpu(38)


def test_default_gpu_reads_mtwork_gpu(monkeypatch) -> None:
    monkeypatch.delenv("MTWORK_GPU", raising=False)
    assert default_gpu().label == "M1 Max (32-core GPU)"
    monkeypatch.setenv("MTWORK_GPU", "m3max30")
    assert default_gpu().label == "M3 Max (30-core GPU)"
    monkeypatch.setenv("MTWORK_GPU", "M9 Turbo")
    with pytest.raises(ValueError, match="MTWORK_GPU='M9 Turbo' is not a known GPU"):
        default_gpu()


# --- counters ------------------------------------------------------------------------------


def copy_counters(n: int = 1 << 24, stride: int = 1, kernel: str = "copy") -> Counters:
    """n floats read coalesced and written with `stride` between lanes (1 = coalesced)."""
    accesses = n // 32
    write_lines = min(32, stride)  # lines one SIMD-group's store touches
    lines = n * 4 // 128
    return Counters(
        kernel, threadgroups=n // 256, threads_per_threadgroup=256,
        buffers=[BufferTraffic("out", store_bytes=4 * n, stores=accesses,
                               transactions=accesses * write_lines, distinct_lines=lines),
                 BufferTraffic("inp", load_bytes=4 * n, loads=accesses, transactions=accesses,
                               distinct_lines=lines)],
        ops=LaneOps(integer=3 * n), simd_issues=3 * accesses, active_lanes=3 * n,
        source_lines=[SourceLine(4, device_bytes=4 * n, transactions=accesses * write_lines),
                      SourceLine(3, device_bytes=4 * n, transactions=accesses,
                                 lane_ops=3 * n)])


def test_counters_are_stored_in_one_order_and_print_the_same() -> None:
    a = copy_counters()
    b = replace(a, buffers=tuple(reversed(a.buffers)),
                source_lines=tuple(reversed(a.source_lines)))
    assert a == b and str(a) == str(b) and a.to_dict() == b.to_dict()
    assert [x.buffer for x in a.buffers] == ["inp", "out"]
    assert [s.line for s in a.source_lines] == [3, 4]


def test_counters_round_trip_through_json() -> None:
    c = replace(copy_counters(stride=8), simd=SimdOps(shuffles=5, mma_f16=2),
                threadgroup_accesses=7, bank_conflicts=3, registers=40)
    back = Counters.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and str(back) == str(c)
    with pytest.raises(ValueError, match="unknown key 'bytes'.*known keys: kernel"):
        Counters.from_dict({**c.to_dict(), "bytes": 1})
    with pytest.raises(ValueError, match=r"Counters.ops: unknown key 'f64'"):
        Counters.from_dict({**c.to_dict(), "ops": {"f64": 1}})


def test_counters_report_coalescing_and_simd_efficiency() -> None:
    strided = copy_counters(stride=32)
    assert strided.requested_bytes == 2 * 4 * (1 << 24)
    assert strided.coalescing == pytest.approx(2 / 33)  # loads 1 line, stores 32
    assert copy_counters().coalescing == 1.0
    half = replace(copy_counters(), active_lanes=copy_counters().active_lanes // 2)
    assert half.simd_efficiency == 0.5
    ragged = Counters("k", threadgroups=1, threads_per_threadgroup=48)  # 2 SIMD-groups
    assert ragged.simd_efficiency == 48 / 64


def test_counters_reject_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"BufferTraffic\(loads=...\) must be >= 0"):
        Counters("k", 1, 32, buffers=[BufferTraffic("a", loads=-1)])
    with pytest.raises(ValueError, match="distinct_lines=3 > transactions=2"):
        Counters("k", 1, 32, buffers=[BufferTraffic("a", transactions=2, distinct_lines=3)])
    with pytest.raises(ValueError, match="257 bytes requested but only 2 transactions"):
        Counters("k", 1, 32, buffers=[BufferTraffic("a", load_bytes=257, transactions=2)])
    with pytest.raises(ValueError, match="buffer 'a' appears twice"):
        Counters("k", 1, 32, buffers=[BufferTraffic("a"), BufferTraffic("a")])
    with pytest.raises(TypeError, match=r"LaneOps\(f32=...\) must be an int, got True"):
        Counters("k", 1, 32, ops=LaneOps(f32=True))
    with pytest.raises(ValueError, match=r"Counters\(threadgroups=...\) must be at least 1"):
        Counters("k", 0, 32)
    with pytest.raises(ValueError, match="active_lanes=33 must lie between"):
        Counters("k", 1, 32, simd_issues=1, active_lanes=33)
    with pytest.raises(ValueError, match="active_lanes=0 must lie between"):
        Counters("k", 1, 32, simd_issues=1, active_lanes=0)


def test_counters_sum_over_dispatches() -> None:
    c = copy_counters()
    total = sum([c, c, c])
    assert total.dispatches == 3 and total.threadgroups == 3 * c.threadgroups
    assert total.requested_bytes == 3 * c.requested_bytes
    assert total.ops.integer == 3 * c.ops.integer
    assert total.source_lines[0].lane_ops == 3 * c.source_lines[0].lane_ops
    with pytest.raises(ValueError, match="different threads_per_threadgroup"):
        c + replace(c, threads_per_threadgroup=128)
    with pytest.raises(ValueError, match="different kernel"):
        c + replace(c, kernel="other")


def test_counters_render_as_text_html_and_figures() -> None:
    c = replace(copy_counters(stride=32), source_lines=(
        SourceLine(3, lane_ops=9, divergences=2), SourceLine(5, device_bytes=4096,
                                                             transactions=32)))
    text = str(c)
    assert "coalescing 6.1%" in text and "divergence sites" in text and "line 3 (2×)" in text
    assert "<table" in c._repr_html_() and "`copy`" in c._repr_html_()
    fig = counters_figure({"strided": c, "coalesced": copy_counters()})
    moved = next(t for t in fig.data if t.name == "moved")
    assert list(moved.x) == ["strided", "coalesced"]
    assert list(moved.y) == [c.moved_bytes, copy_counters().moved_bytes]
    lines = lines_figure(c)
    assert list(lines.data[0].x) == ["line 3", "line 5"]
    assert list(next(t for t in lines.data if t.name == "divergences").y) == [2, 0]


# --- model ---------------------------------------------------------------------------------


def alu_counters(ops: int = 1 << 32, threadgroups: int = 4096, threads: int = 256) -> Counters:
    return Counters("alu", threadgroups=threadgroups, threads_per_threadgroup=threads,
                    ops=LaneOps(f32=ops))


def test_every_operation_class_has_a_cost() -> None:
    assert set(LANE_OP_CYCLES) == {f.name for f in fields(LaneOps)}


def test_more_bytes_never_take_less_time() -> None:
    base = copy_counters(stride=4)
    for chip in ("M1", "M2 Max", "M5 Max"):
        last = 0.0
        for scale in (1, 2, 4):
            bigger = replace(base, buffers=tuple(
                replace(b, load_bytes=b.load_bytes * scale, store_bytes=b.store_bytes * scale,
                        loads=b.loads * scale, stores=b.stores * scale,
                        transactions=b.transactions * scale,
                        distinct_lines=b.distinct_lines * scale) for b in base.buffers))
            seconds = estimate(bigger, chip).seconds
            assert seconds >= last
            last = seconds


@pytest.mark.parametrize("name, small, large", [("M2 Max", 30, 38), ("M1 Max", 24, 32),
                                                ("M4 Max", 32, 40), ("M3 Ultra", 60, 80)])
def test_more_cores_never_take_more_time(name, small, large) -> None:
    workloads = [copy_counters(), copy_counters(stride=32), alu_counters(),
                 alu_counters(threadgroups=50), claims.flash_attention(8, seq=128, heads=2),
                 claims.gated_delta(True, steps=64, hv=2), claims.q8_0_dequant(rows=256)]
    for counters in workloads:
        few = estimate(counters, gpu(name, cores=small)).seconds
        many = estimate(counters, gpu(name, cores=large)).seconds
        assert many <= few, counters.kernel


def test_a_streaming_copy_is_memory_bound_at_dram_bandwidth() -> None:
    e = estimate(copy_counters(), "M1 Max")
    assert (e.bound, e.limiting_term) == ("memory", "memory (DRAM)")
    assert e.seconds == pytest.approx(128 * 2**20 / 400e9 + 5e-6, rel=1e-6)


def test_alu_matrix_threadgroup_latency_and_launch_bounds() -> None:
    assert estimate(alu_counters()).bound == "ALU"
    mma = Counters("mma", threadgroups=4096, threads_per_threadgroup=256,
                   simd=SimdOps(mma_f32=1 << 26), ops=LaneOps(f32=1 << 20))
    assert estimate(mma).bound == "matrix"
    conflicted = Counters("tg", threadgroups=4096, threads_per_threadgroup=256,
                          threadgroup_accesses=1 << 24, bank_conflicts=31 << 24)
    assert estimate(conflicted).bound == "threadgroup memory"
    # One SIMD-group per core waiting on a long chain of loads that hit in cache.
    chain = Counters("chain", threadgroups=32, threads_per_threadgroup=32, buffers=[
        BufferTraffic("a", load_bytes=128 * 100_000, loads=100_000, transactions=100_000,
                      distinct_lines=1000)])
    e = estimate(chain, "M1 Max")
    assert e.bound == "latency" and e.occupancy.simdgroups_per_core == 1
    assert estimate(Counters("tiny", 1, 32, ops=LaneOps(f32=32))).bound == "launch"


def test_a_cores_loads_in_flight_are_capped_by_littles_law() -> None:
    # 24 SIMD-groups a core with 4 loads of two 128-byte lines in flight each would hide 96 loads'
    # latency; a core keeps its share of bandwidth × DRAM latency in flight (times
    # memory_parallelism), so the latency term is the loads over that many.
    loads = 1_000_000
    many = Counters("many", threadgroups=32 * 3, threads_per_threadgroup=256,
                    load_issues=4, dependent_loads=1, buffers=[
                        BufferTraffic("a", load_bytes=128 * loads, loads=loads,
                                      transactions=2 * loads, distinct_lines=2 * loads)])
    chip = gpu("M1 Max")
    little = 400 / 32 * chip.memory_latency_ns  # bytes in flight per core
    for k in (1.0, 4.0, 1e9):
        e = estimate(many, chip, Assumptions(memory_parallelism=k))
        in_flight = min(24 * 4, k * little / 256)
        expected = loads / 32 / in_flight * chip.memory_latency_ns * 1e-9
        assert e.term("latency").seconds == pytest.approx(expected, rel=1e-9)
    # a streaming copy still reaches the bandwidth (test above) at the least value, 1


def test_bank_conflicts_serialise_threadgroup_memory() -> None:
    clean = Counters("tg", threadgroups=4096, threads_per_threadgroup=256,
                     threadgroup_accesses=1 << 24)
    conflicted = replace(clean, bank_conflicts=7 << 24)  # an 8-way conflict everywhere
    assert (estimate(conflicted).term("threadgroup memory").seconds
            == pytest.approx(8 * estimate(clean).term("threadgroup memory").seconds))


def test_occupancy_is_limited_by_threads_memory_registers_or_grid() -> None:
    chip = gpu("M1 Max")
    assert occupancy(alu_counters(threads=1024), chip).limited_by == "threads"
    assert occupancy(alu_counters(threads=1024), chip).threadgroups_per_core == 3
    tg = replace(alu_counters(), threadgroup_memory=24 * 1024)
    assert (occupancy(tg, chip).limited_by, occupancy(tg, chip).threadgroups_per_core) == (
        "threadgroup memory", 2)
    regs = replace(alu_counters(), registers=100)
    assert occupancy(regs, chip).limited_by == "registers"
    assert occupancy(regs, chip).simdgroups_per_core == 3 * 8  # 98,304 / (32 × 100): 30
    few = alu_counters(threadgroups=40)
    assert (occupancy(few, chip).limited_by, occupancy(few, chip).threadgroups_per_core) == (
        "grid", 2)


# Philip Turner's table of registers against occupancy on the M1 GPU (DTolm/VkFFT issue
# #91): (32-bit registers a thread, threadgroup size, SIMD-groups resident per core).
PUBLISHED_OCCUPANCY = [(32, 1024, 96), (36, 896, 84), (40, 768, 72), (48, 1024, 64),
                       (52, 896, 56), (56, 832, 52), (64, 768, 48), (68, 704, 44),
                       (76, 640, 40), (84, 576, 36), (96, 512, 32), (108, 448, 28),
                       (128, 384, 24)]


@pytest.mark.parametrize(("registers", "threads", "simdgroups"), PUBLISHED_OCCUPANCY)
def test_occupancy_by_registers_is_the_published_table(registers: int, threads: int,
                                                       simdgroups: int) -> None:
    counters = Counters("k", 4096, threads, registers=registers)
    resident = occupancy(counters, gpu("M1 Max"))
    assert resident.registers == registers  # each row's threadgroup fits its registers
    assert resident.simdgroups_per_core == simdgroups


def test_dispatches_metal_could_not_launch_are_refused() -> None:
    with pytest.raises(ValueError, match="threads_per_threadgroup=2048 exceeds 1024"):
        estimate(Counters("k", 1, 2048))
    with pytest.raises(ValueError, match="threadgroup_memory=40000 bytes exceeds 32768"):
        estimate(Counters("k", 1, 32, threadgroup_memory=40000))
    with pytest.raises(ValueError, match="counted in 32-byte granules"):
        estimate(Counters("k", 1, 32, line_bytes=32))
    with pytest.raises(ValueError, match="counted in 256-byte granules"):
        estimate(Counters("k", 1, 32, line_bytes=256))


def test_a_register_estimate_never_refuses_what_metal_runs() -> None:
    # llama.cpp dispatches kernel_flash_attn_ext_vec_reduce with 1024 threads; an
    # estimate of 128 registers a thread (512 KiB for the group) means Apple's compiler
    # fitted fewer, so the group is resident alone, limited by registers.
    chip = gpu("M1 Max")
    big = estimate(Counters("k", 64, 1024, registers=128), chip)
    assert big.occupancy.registers == 52  # 208 KiB / (1024 threads × 4 B)
    assert (big.occupancy.threadgroups_per_core, big.occupancy.limited_by) == (1, "registers")
    spilled = estimate(Counters("k", 64, 32, registers=200), chip).occupancy
    assert spilled.registers == 128  # at most what a thread can have
    assert "52 registers a thread" in str(big)


def test_a_partial_last_wave_leaves_cores_idle() -> None:
    # 3 threadgroups of 1024 threads fill a core; a 97th threadgroup runs on one core
    # while the other 31 idle, so 1% more work takes a third more time.
    per_tg = 1024 * 1_000_000
    full = estimate(alu_counters(ops=96 * per_tg, threadgroups=96, threads=1024), "M1 Max")
    spill = estimate(alu_counters(ops=97 * per_tg, threadgroups=97, threads=1024), "M1 Max")
    assert spill.term("ALU").seconds == pytest.approx(4 / 3 * full.term("ALU").seconds)


def test_few_simdgroups_per_core_slow_issue_as_measured() -> None:
    low, full = (estimate(claims.ffma_chain(n), "M1 Max").seconds for n in (4, 88))
    assert low / full == pytest.approx(24 / 4, rel=0.01)  # metal-benchmarks: 11.34 / 1.99


def test_strided_stores_are_slower_than_coalesced_ones() -> None:
    coalesced = estimate(copy_counters(), "M2 Max")
    strided = estimate(copy_counters(stride=32), "M2 Max")
    assert strided.seconds > 1.5 * coalesced.seconds
    assert (strided.bound, strided.limiting_term) == ("cache", "cache (L1)")


def transpose(tiled: bool, n: int = 4096) -> Counters:
    """An n × n float transpose, one element per thread. Naive: reads coalesced, writes
    strided (each SIMD-group store touches 32 lines). Tiled: 32 × 32 tiles staged through
    padded threadgroup memory (one wavefront per access, no conflicts), one barrier."""
    accesses, lines = n * n // 32, n * n * 4 // 128
    elements = n * n
    return Counters(
        "transpose", threadgroups=elements // (1024 if tiled else 256),
        threads_per_threadgroup=256, threadgroup_memory=32 * 33 * 4 if tiled else 0,
        buffers=[BufferTraffic("inp", load_bytes=4 * elements, loads=accesses,
                               transactions=accesses, distinct_lines=lines),
                 BufferTraffic("out", store_bytes=4 * elements, stores=accesses,
                               transactions=accesses * (1 if tiled else 32),
                               distinct_lines=lines)],
        threadgroup_accesses=2 * accesses if tiled else 0,
        threadgroup_barriers=elements // 1024 if tiled else 0,
        ops=LaneOps(integer=(8 if tiled else 4) * elements))


def test_a_tiled_transpose_beats_the_naive_one_on_every_chip() -> None:
    for chip in chips():
        naive, tiled = estimate(transpose(False), chip), estimate(transpose(True), chip)
        assert tiled.seconds < naive.seconds, chip.label
        assert naive.limiting_term == "cache (L1)"


def test_assumptions_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"Assumptions\(barrier_cycles=...\) must be > 0"):
        Assumptions(barrier_cycles=0)


def test_estimates_print_and_serialise() -> None:
    e = estimate(copy_counters(), "M2 Max")
    text = str(e)
    assert text.startswith("Estimate `copy` on M2 Max (38-core GPU):")
    assert "memory-bound (limited by memory (DRAM))" in text and "occupancy:" in text
    assert str(estimate(copy_counters(), "M2 Max")) == text
    assert json.loads(json.dumps(e.to_dict()))["bound"] == "memory"
    assert "<table" in e._repr_html_()
    fig = estimates_figure([e, estimate(copy_counters(stride=32), "M2 Max")])
    assert [t.name for t in fig.data][-1] == "total"
    assert list(fig.data[-1].text) == ["memory", "cache"]
    assert "not a measurement" in fig.layout.title.text
    with pytest.raises(KeyError, match="no term 'disk'"):
        e.term("disk")


# --- the seeds' claims, from the emulator's counts of the repository's kernels -------------


def test_flash_attention_is_faster_with_eight_simdgroups() -> None:
    four = estimate(claims.flash_attention(4, seq=256), "M3 Max")
    eight = estimate(claims.flash_attention(8, seq=256), "M3 Max")
    assert eight.seconds < four.seconds
    assert eight.occupancy.simdgroups_per_core == 2 * four.occupancy.simdgroups_per_core


def test_packed_gated_delta_reads_q_and_k_in_fewer_l1_granules() -> None:
    # Seed 002: packing eight value rows per SIMD-group is faster on the chip. Per access
    # of k or q (float32, Dk = 128), the sequential kernel's 32 lanes read words 16 bytes
    # apart (PerLane = 4 contiguous elements a lane): 512 bytes, eight 64-byte granules;
    # the packed kernel's four lanes of a row read words 128 bytes apart (32 contiguous
    # elements a lane), shared by the eight rows: four granules. Both make as many
    # accesses per value row, so the packed kernel moves half the L1 granules. Its in-lane
    # tree and two shuffles also replace the sequential kernel's two simd_sum per row and
    # token. (At this small shape, a few SIMD-groups per core, neither is bound by the
    # L1, and the busiest core's share is not the same for both.)
    seq, packed = (claims.gated_delta(p, steps=64, hv=2) for p in (False, True))
    assert packed.simd.reductions == 0 < seq.simd.reductions
    assert claims.issue_cycles(packed) < claims.issue_cycles(seq)
    rows = {"seq": seq.threadgroups * 4, "packed": packed.threadgroups * 2 * 8}
    assert rows["seq"] == rows["packed"]
    for name in ("q", "k"):
        a, b = (next(x for x in c.buffers if x.buffer == name) for c in (seq, packed))
        assert a.loads == b.loads
        assert (a.transactions, b.transactions) == (8 * a.loads, 4 * b.loads)
    assert packed.moved_bytes < 0.6 * seq.moved_bytes
    assert (estimate(packed, "M5 Max").term("cache (L1)").seconds
            < estimate(seq, "M5 Max").term("cache (L1)").seconds)


def test_q8_0_dequantisation_is_memory_bound() -> None:
    assert estimate(claims.q8_0_dequant(), "M5 Max").bound == "memory"


def test_claims_script_prints_one_row_per_claim(capsys) -> None:
    claims.main(["--quick"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0] == "| claim | source | published | modelled |"
    assert len(rows) == 2 + len(claims.claims(claims.QUICK))
    assert all(row.count(" | ") == 3 for row in rows[2:])
