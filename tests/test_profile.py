"""The profiler (`profile=True`, `mtwork.profile`): counts of small kernels worked out by
hand from the SIMD-group model `mtwork.gpu.Counters` documents, their determinism, and
outputs that do not change when a kernel is profiled."""

import functools
import pickle

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.run import runtime
from mtwork.library import load_metal, new_buffer
from mtwork.msl.includes import mlx_include_dir

N = 1024  # threads: 32 SIMD-groups
# Device accesses are counted in the granule the L1 moves per cycle (64 bytes: half a line).
GRANULE = mtwork.gpu.default_gpu().l1_bytes_per_core_cycle


def profiled(name, body, inputs, *, out=(N,), dtype=mx.float32, grid=(N, 1, 1),
             threadgroup=(256, 1, 1), isolate=False, **call):
    """(outputs, counters) of one profiled call of a body-form kernel with inputs in0, ..."""
    kernel = mtwork.metal_kernel(name, [f"in{i}" for i in range(len(inputs))], ["out"], body)
    outputs = kernel(inputs=inputs, grid=grid, threadgroup=threadgroup, output_shapes=[out],
                     output_dtypes=[dtype], profile=True, isolate=isolate, **call)
    return outputs, kernel.last_counters


def buffer(counters, name):
    return next(b for b in counters.buffers if b.buffer == name)


# --- device memory ------------------------------------------------------------------------


def test_coalesced_copy_moves_128_bytes_per_simdgroup_access():
    x = mx.arange(N, dtype=mx.float32)
    _, c = profiled("copy", "uint i = thread_position_in_grid.x; out[i] = in0[i];", [x])
    load, store = buffer(c, "in0"), buffer(c, "out")
    accesses = N // 32
    per_access = 128 // GRANULE  # 32 floats
    assert (load.loads, load.load_bytes, load.transactions) == (accesses, 4 * N,
                                                                 accesses * per_access)
    assert (store.stores, store.store_bytes, store.transactions) == (accesses, 4 * N,
                                                                     accesses * per_access)
    assert load.distinct_lines == store.distinct_lines == 4 * N // GRANULE
    assert c.coalescing == 1.0


def test_strided_copy_requests_the_same_bytes_in_32_granules_per_access():
    x = mx.arange(32 * N, dtype=mx.float32)
    _, c = profiled("strided", "uint i = thread_position_in_grid.x; out[i] = in0[i * 32];",
                    [x])
    load = buffer(c, "in0")
    accesses = N // 32
    assert (load.loads, load.load_bytes) == (accesses, 4 * N)  # as many bytes as coalesced
    assert load.transactions == 32 * accesses  # every lane in a granule of its own
    assert load.distinct_lines == N
    assert buffer(c, "out").transactions == accesses * 128 // GRANULE


def test_lanes_reading_one_word_count_its_bytes_once():
    x = mx.arange(64, dtype=mx.float32)
    _, c = profiled("broadcast", "out[thread_position_in_grid.x] = in0[3];", [x])
    load = buffer(c, "in0")
    assert (load.loads, load.load_bytes, load.transactions) == (N // 32, 4 * N // 32, N // 32)
    assert load.distinct_lines == 1


def test_adjacent_byte_loads_of_a_thread_are_issued_four_at_a_time():
    # Six adjacent bytes a thread (alignment 1): one 4-byte and one 2-byte load, not six.
    x = mx.zeros((2 * N,), dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const uchar* p = "
            "(device const uchar*)in0 + 8 * i; out[i] = float(p[0]) + float(p[1]) + "
            "float(p[2]) + float(p[3]) + float(p[4]) * float(p[5]);")
    _, c = profiled("bytes6", body, [x])
    load = buffer(c, "in0")
    accesses = N // 32
    assert (load.loads, load.load_bytes) == (2 * accesses, 6 * N)
    # 32 lanes × 8 bytes apart: 256 bytes, 4 granules, which the two loads issued
    # together touch once (the L1 coalesces what a SIMD-group issues together)
    assert load.transactions == accesses * 256 // GRANULE


def test_adjacent_aligned_loads_merge_up_to_four_32_bit_components():
    # Eight adjacent floats a thread: two 16-byte loads (four 32-bit components each).
    x = mx.arange(8 * N, dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const float* p = in0 + 8 * i; "
            "out[i] = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));")
    outputs, c = profiled("floats8", body, [x])
    assert np.allclose(np.array(outputs[0]), np.array(x).reshape(N, 8).sum(axis=1))
    assert buffer(c, "in0").loads == 2 * (N // 32)


def test_a_short_loops_loads_merge_over_its_iterations():
    # Apple's compiler unrolls a loop of 16 iterations: 16 bytes and 16 floats a thread
    # are four 4-byte loads and four 16-byte loads, not 32 loads.
    x = mx.arange(16 * N, dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const uchar* p = "
            "(device const uchar*)in0 + 16 * i; float s = 0; "
            "for (int k = 0; k < 16; ++k) s += float(p[k] & 15) * in0[k]; out[i] = s;")
    _, c = profiled("loop16", body, [x])
    load = buffer(c, "in0")
    assert load.loads == 8 * (N // 32)
    # the bytes: 512 a SIMD-group (8 granules); the floats: 64 bytes all lanes share (1)
    assert load.transactions == (512 // GRANULE + 1) * (N // 32)
    # 64 iterations: not unrolled, one load of each a iteration
    _, c = profiled("loop64", body.replace("16", "64"), [mx.arange(64 * N,
                                                                    dtype=mx.float32)])
    assert buffer(c, "in0").loads == 2 * 64 * (N // 32)
    # an inner loop that starts where the outer one is: 4 floats at 4q, one 16-byte load
    x = mx.arange(8 * N, dtype=mx.float32)
    nested = ("uint i = thread_position_in_grid.x; device const float* p = in0 + 8 * i; "
              "float s = 0; for (int q = 0; q < 2; ++q) { float t = 0; "
              "for (int k = 4 * q; k < 4 * q + 4; ++k) t += p[k]; s += t * t; } out[i] = s;")
    outputs, c = profiled("nested", nested, [x])
    parts = np.array(x).reshape(N, 2, 4).sum(axis=2)
    assert np.allclose(np.array(outputs[0]), (parts ** 2).sum(axis=1))
    load = buffer(c, "in0")
    assert (load.loads, load.load_bytes) == (2 * (N // 32), 32 * N)


def test_a_short_loops_loads_at_the_counter_plus_a_constant_merge():
    # llama.cpp's k-quant mat-vecs read y1[l + 32] and y2[l + 32] for l < 8, whose shared
    # index LLVM writes as `or disjoint l, 32`: once unrolled, each is eight adjacent
    # floats a thread, two 16-byte loads, not eight 4-byte ones
    x = mx.arange(256 * N, dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const float* p = in0 + 256 * i; "
            "device const float* q = p + 128; float s = 0, t = 0; "
            "for (int l = 0; l < 8; ++l) { s += p[l] * q[l]; t += p[l + 32] * q[l + 32]; } "
            "out[i] = s + t;")
    outputs, c = profiled("plus32", body, [x])
    rows = np.array(x, dtype=np.float64).reshape(N, 256)
    want = sum(rows[:, k] * rows[:, 128 + k] for k in (*range(8), *range(32, 40)))
    assert np.allclose(np.array(outputs[0]), want, rtol=1e-5)
    load = buffer(c, "in0")
    assert (load.loads, load.load_bytes) == (8 * (N // 32), 128 * N)
    # each of a lane's four 32-byte runs lies in one granule of its own
    assert load.transactions == 4 * 32 * (N // 32)


def test_a_short_loop_stepping_by_two_merges():
    # llama.cpp's q4_K mat-vec reads q[i / 2] for i = 0, 2, 4, 6: four adjacent 16-bit
    # words a thread, one 8-byte load once unrolled, not four
    x = mx.arange(4 * N, dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const ushort* q = "
            "(device const ushort*)in0 + 8 * i; float s = 0; "
            "for (int k = 0; k < 8; k += 2) s += float(q[k / 2] & 15) * float(q[k / 2] >> 8); "
            "out[i] = s;")
    outputs, c = profiled("step2", body, [x])
    words = np.array(x).view(np.uint16).reshape(N, 8)[:, :4].astype(np.float64)
    want = ((words.astype(np.uint16) & 15) * (words.astype(np.uint16) >> 8)).sum(1)
    assert np.allclose(np.array(outputs[0]), want)
    load = buffer(c, "in0")
    assert (load.loads, load.load_bytes) == (N // 32, 8 * N)
    # 32 lanes 16 bytes apart: 512 bytes, 8 granules
    assert load.transactions == 512 // GRANULE * (N // 32)


def test_a_loop_over_a_moved_base_of_bfloats_merges():
    # the counter plus a value the loop does not change, over bfloat elements (a struct
    # in the shim): eight bfloats a thread at 2-byte alignment, two 8-byte loads
    x = mx.arange(8 * N, dtype=mx.float32).astype(mx.bfloat16)
    body = ("uint i = thread_position_in_grid.x; float s = 0; "
            "for (ulong k = 0; k < 8; ++k) s += float(in0[8 * ulong(i) + k]); out[i] = s;")
    outputs, c = profiled("bf16loop", body, [x])
    want = np.array(x.astype(mx.float32)).reshape(N, 8).sum(axis=1)
    assert np.allclose(np.array(outputs[0]), want, rtol=1e-2)
    assert buffer(c, "in0").loads == 2 * (N // 32)


def test_loads_with_a_gap_or_a_store_between_are_not_merged():
    # in0[4i] and in0[4i + 2] are not adjacent; the store between in0[4i+2] and
    # in0[4i+3] may alias them: three loads per thread.
    x = mx.arange(4 * N, dtype=mx.float32)
    body = ("uint i = thread_position_in_grid.x; device const float* p = in0 + 4 * i; "
            "float a = p[0] + p[2]; out[i] = a; out[i] = a * p[3];")
    _, c = profiled("gapped", body, [x])
    assert buffer(c, "in0").loads == 3 * (N // 32)


def test_device_atomics_count_per_lane_and_not_as_loads():
    body = """atomic_fetch_add_explicit((device atomic_uint*)out + thread_position_in_grid.x % 4,
                                   1u, memory_order_relaxed);"""
    _, c = profiled("histogram", body, [mx.zeros((1,))], out=(4,), dtype=mx.uint32,
                    init_value=0)
    out = buffer(c, "out")
    assert (out.atomics, out.loads, out.stores) == (N, 0, 0)
    # the atomics' line reaches DRAM: the model's memory term sees it
    assert out.distinct_lines == 1
    assert c.distinct_bytes == c.line_bytes


# --- threadgroup memory ---------------------------------------------------------------------

BANKS = """
threadgroup float tile[32 * 33];
uint t = thread_position_in_threadgroup.x;
tile[t * S] = in0[t];
threadgroup_barrier(mem_flags::mem_threadgroup);
out[t] = tile[t * S];
"""


@pytest.mark.parametrize("stride, conflicts", [
    (1, 0),    # 32 words in 32 banks: one wavefront
    (2, 1),    # 32 words in the 16 even banks, two in each: one extra wavefront
    (32, 31),  # every word in bank 0: 32 wavefronts
    (33, 0),   # padded: stride 33 is 1 modulo 32
])
def test_threadgroup_bank_conflicts(stride, conflicts):
    x = mx.arange(32, dtype=mx.float32)
    _, c = profiled("banks", BANKS, [x], out=(32,), grid=(32, 1, 1), threadgroup=(32, 1, 1),
                    template=[("S", stride)])
    assert c.threadgroup_accesses == 2  # the store and the load, one wavefront each
    assert c.bank_conflicts == 2 * conflicts
    assert c.threadgroup_barriers == 1
    assert c.threadgroup_memory == 32 * 33 * 4


def test_lanes_reading_one_threadgroup_word_do_not_conflict():
    body = """threadgroup float tile[64];
    uint t = thread_position_in_threadgroup.x;
    if (t == 0) tile[0] = in0[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[t] = tile[0];"""
    _, c = profiled("tg_broadcast", body, [mx.ones((1,))], out=(32,), grid=(32, 1, 1),
                    threadgroup=(32, 1, 1))
    assert (c.threadgroup_accesses, c.bank_conflicts) == (2, 0)


def test_float4_accesses_need_four_wavefronts_without_conflicts():
    body = """threadgroup float4 tile[32];
    uint t = thread_position_in_threadgroup.x;
    tile[t] = float4(in0[t]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[t] = tile[31 - t].x;"""
    _, c = profiled("tg_float4", body, [mx.ones((32,))], out=(32,), grid=(32, 1, 1),
                    threadgroup=(32, 1, 1))
    # 32 lanes x 16 bytes = 128 words: 4 wavefronts; the scalar reads 32 words 4 apart:
    # banks 0, 4, ..., 28 hold 4 words each, 4 wavefronts where 1 would do.
    assert c.threadgroup_accesses == 4 + 1
    assert c.bank_conflicts == 3


def test_threadgroup_atomics_count_per_lane():
    body = """threadgroup atomic_uint count;
    uint t = thread_position_in_threadgroup.x;
    if (t == 0) atomic_store_explicit(&count, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0)
        out[threadgroup_position_in_grid.x] = atomic_load_explicit(&count, memory_order_relaxed);"""
    outputs, c = profiled("tg_atomics", body, [mx.ones((1,))], out=(4,), dtype=mx.uint32)
    assert np.array(outputs[0]).tolist() == [256] * 4
    groups = N // 256
    assert c.threadgroup_atomics == groups * (1 + 256 + 1)
    assert c.threadgroup_accesses == 0 and c.threadgroup_barriers == 2 * groups


# --- operations ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, cls", [(mx.float32, "f32"), (mx.float16, "f16"),
                                        (mx.bfloat16, "bf16")])
def test_arithmetic_is_counted_in_its_own_precision(dtype, cls):
    x = mx.ones((N,), dtype=dtype)
    _, c = profiled("fma", "uint i = thread_position_in_grid.x; out[i] = in0[i] * in1[i] + in0[i];",
                    [x, x], dtype=dtype)
    ops = {k: v for k, v in vars(c.ops).items() if v}
    assert ops == {cls: 2 * N}  # a multiply and an add per thread, nothing else


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_exp_counts_as_one_exp_log(dtype):
    x = mx.ones((N,), dtype=dtype)
    _, c = profiled("exp", "uint i = thread_position_in_grid.x; out[i] = exp(in0[i]);", [x],
                    dtype=dtype)
    # Not the libm call's instructions, nor the CPU's conversions of half to float.
    assert {k: v for k, v in vars(c.ops).items() if v} == {"exp_log": N}


def test_math_functions_count_as_their_class():
    body = """uint i = thread_position_in_grid.x;
    float x = in0[i];
    out[i] = sqrt(x) + precise::rsqrt(x) + sin(x) + float(int(x)) + x / in1[i] + fmax(x, 1.0f);"""
    x = mx.ones((N,))
    _, c = profiled("math", body, [x, x])
    assert (c.ops.sqrt_rsqrt, c.ops.trig, c.ops.convert, c.ops.recip_div) == (2 * N, N, 2 * N, N)
    assert c.ops.f32 == 6 * N  # fmax and the five additions


def test_integer_work_by_class():
    body = """uint i = thread_position_in_grid.x;
    uint a = uint(in0[i]);
    out[i] = float((a * 3u) ^ (a >> in1[0]) ^ popcount(a) ^ (a / 7u) ^ (a + 5u));"""
    x = mx.full((N,), 7.0)
    _, c = profiled("ints", body, [x, mx.array([2], dtype=mx.uint32)])
    # multiply, variable shift, popcount and division by a constant (a multiply-high);
    # xor four times and the add; two conversions
    assert (c.ops.integer_mul, c.ops.integer, c.ops.convert) == (4 * N, 5 * N, 2 * N)


# --- SIMD-group work -------------------------------------------------------------------------


def test_simd_reductions_and_shuffles_count_per_simdgroup():
    body = """uint i = thread_position_in_grid.x;
    float x = simd_sum(in0[i]);
    x += simd_shuffle_xor(x, ushort(1)) + simd_broadcast(x, ushort(0));
    out[i] = x;"""
    _, c = profiled("simd", body, [mx.ones((N,))])
    assert (c.simd.reductions, c.simd.shuffles) == (N // 32, 2 * N // 32)


GEMM = """
    // C (8 x 8) = A (8 x K) B (K x 8), one SIMD-group
    simdgroup_matrix<T, 8, 8> a, b;
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k = 0; k < K; k += 8) {
        simdgroup_load(a, in0, K, ulong2(k, 0));
        simdgroup_load(b, in1, 8, ulong2(0, k));
        simdgroup_multiply_accumulate(acc, a, b, acc);
    }
    simdgroup_store(acc, out, 8);
"""


@pytest.mark.parametrize("dtype, cls", [(mx.float32, "mma_f32"), (mx.float16, "mma_f16")])
def test_simdgroup_matrix_gemm(dtype, cls):
    k = 32
    a = mx.random.normal((8, k), key=mx.random.key(1)).astype(dtype)
    b = mx.random.normal((k, 8), key=mx.random.key(2)).astype(dtype)
    outputs, c = profiled("gemm", GEMM, [a, b], out=(8, 8), grid=(32, 1, 1),
                          threadgroup=(32, 1, 1), template=[("T", dtype), ("K", k)])
    reference = np.array(a.astype(mx.float32), np.float64) @ np.array(b.astype(mx.float32))
    mtwork.assert_close(outputs[0], reference, dtype=mx.float32)
    assert {f: getattr(c.simd, f) for f in ("mma_f32", "mma_f16", "mma_bf16")
            if getattr(c.simd, f)} == {cls: k // 8}
    a_load, b_load, store = buffer(c, "in0"), buffer(c, "in1"), buffer(c, "out")
    # A fragment of A: 8 rows of 8 elements, K elements apart: a float row (32 bytes, 128
    # apart) and a half row (16 bytes, 64 apart) each sit in a 64-byte granule of its own.
    assert (a_load.loads, a_load.load_bytes) == (k // 8, k * 8 * dtype.size)
    assert a_load.transactions == k // 8 * 8
    # B's fragments are 8 contiguous rows: 64 elements, 4 granules of floats or 2 of halves.
    assert b_load.transactions == k // 8 * (64 * dtype.size // GRANULE)
    assert (store.stores, store.store_bytes, store.transactions) == (1, 256, 256 // GRANULE)


# --- SIMD efficiency and divergence ------------------------------------------------------------

EARLY = """
uint i = thread_position_in_grid.x;
if (in1[i % 32] != 0) return;
float x = in0[i];
for (int k = 0; k < 10; ++k) x = x * 1.5f + 1.0f;
out[i] = x;
"""


def test_half_the_lanes_returning_halves_simd_efficiency_of_the_work():
    x = mx.ones((N,))
    everyone = mx.zeros((32,))
    half = mx.array([0.0] * 16 + [1.0] * 16)  # lanes 16..31 of each SIMD-group return
    _, full = profiled("early", EARLY, [x, everyone], init_value=0)
    _, part = profiled("early", EARLY, [x, half], init_value=0)
    assert full.simd_efficiency == 1.0 and full.divergence_sites == ()
    # Before the return each lane does e = 2 operations (i % 32 and the comparison), after
    # it w: the same instructions issue (16 lanes of each SIMD-group stay), with half the
    # lanes in those after the return.
    e, w = 2, full.ops.total // N - 2
    assert part.simd_issues == full.simd_issues == (e + w) * N // 32
    assert (part.ops.f32, part.ops.integer) == (N + (full.ops.f32 - N) // 2,
                                                N + (full.ops.integer - N) // 2)
    assert part.active_lanes == e * N + w * N // 2
    assert part.simd_efficiency == (e + w / 2) / (e + w)
    # Every SIMD-group diverges once, at the return.
    (site,) = part.divergence_sites
    assert (site.file, site.line, site.divergences) == ("source", 3, N // 32)


def test_loops_of_different_lengths_diverge_where_lanes_leave():
    body = """uint i = thread_position_in_grid.x;
    float x = 0.0f;
    for (uint k = 0; k < i % 4; ++k) x += 1.0f;
    out[i] = x;"""
    outputs, c = profiled("trips", body, [mx.zeros((1,))])
    assert np.array(outputs[0]).tolist() == [float(i % 4) for i in range(N)]
    # Lanes run 0 to 3 iterations: a quarter skips the loop (the first issue of its test
    # diverges), a quarter leaves after one iteration and one after two (the next two
    # diverge); the last test has only the lanes that all leave: three per SIMD-group.
    (site,) = c.divergence_sites
    assert (site.line, site.divergences) == (3, 3 * (N // 32))


# --- lines, determinism, both forms ------------------------------------------------------------


def test_counts_are_at_the_authors_lines():
    x = mx.arange(32 * N, dtype=mx.float32)
    body = "uint i = thread_position_in_grid.x;\nfloat v = in0[i * 32];\nout[i] = v * 2.0f;"
    _, c = profiled("lines", body, [x])
    by_line = {(s.file, s.line): s for s in c.source_lines}
    assert by_line[("source", 2)].transactions == N  # the strided load
    assert by_line[("source", 3)].transactions == N // 32 * 128 // GRANULE
    assert by_line[("source", 3)].lane_ops == N  # the multiply


def _flash():
    family = mtwork.load_family("flash_attention")
    inputs = family.make_inputs(family.SMALL, mx.float16)
    return family.flash_launch(family.SMALL, mx.float16), inputs


def test_counts_are_the_same_on_every_run_and_any_number_of_workers(monkeypatch):
    launch, inputs = _flash()
    first = mtwork.profile(launch, *inputs)
    assert mtwork.profile(launch, *inputs) == first
    monkeypatch.setattr(runtime, "dispatch", functools.partial(runtime.dispatch, workers=1))
    kernel = launch.defined_kernel
    kernel(inputs=inputs, grid=launch.grid, threadgroup=launch.threadgroup,
           output_shapes=launch.output_shapes, output_dtypes=launch.output_dtypes,
           template=launch.template, profile=True, isolate=False)
    assert kernel.last_counters == first


def test_isolated_and_in_process_runs_count_alike():
    x = mx.arange(32 * N, dtype=mx.float32)
    body = "uint i = thread_position_in_grid.x; out[i] = in0[i * 32] * 2.0f;"
    _, here = profiled("isolated", body, [x], isolate=False)
    _, there = profiled("isolated", body, [x], isolate=True)
    assert there == here
    assert pickle.loads(pickle.dumps(here)) == here


def _family_runs():
    flash = mtwork.load_family("flash_attention")
    gated = mtwork.load_family("gated_delta")
    gguf = mtwork.load_family("gguf")
    fa_inputs = flash.make_inputs(flash.SMALL, mx.float16)
    problem = gated.Problem(batch=1, tokens=7, key_heads=1, value_heads=2, dk=32, dv=16)
    gd_inputs = list(gated.make_inputs(problem))
    packed = mx.array(gguf.quants.quantize_q8_0(gguf.sample_weights(2, 256)))
    return [
        (flash.flash_launch(flash.SMALL, mx.float16), fa_inputs),
        (flash.naive_launch(flash.SMALL, mx.float16), fa_inputs),
        (gated.seq_launch(problem), gd_inputs),
        (gated.packed_launch(problem), gd_inputs),
        (gguf.launch("q8_0", packed, mx.float16), [packed]),
    ]


@pytest.mark.parametrize("index", range(5))
def test_profiling_does_not_change_outputs(index):
    launch, inputs = _family_runs()[index]
    plain = launch(*inputs)
    counted = launch(*inputs, profile=True)
    assert launch.last_counters is not None
    for a, b in zip(plain, counted):
        mtwork.assert_bitwise_equal(b, a)


SAXPY = """#include <metal_stdlib>
using namespace metal;
[[kernel]] void saxpy(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      constant float& a [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  y[i] = a * x[i] + y[i];
}
"""


def test_full_source_kernels_and_their_launches_are_profiled():
    kernel = load_metal(SAXPY).kernel("saxpy")
    x, y = np.arange(N, dtype=np.float32), np.ones(N, dtype=np.float32)
    plain = kernel(buffers=[x, y.copy(), np.float32(2)], grid=N, threads_per_threadgroup=64)
    counted = kernel(buffers=[x, y.copy(), np.float32(2)], grid=N, threads_per_threadgroup=64,
                     profile=True)
    np.testing.assert_array_equal(counted["y"], plain["y"])
    c = kernel.last_counters
    assert c.kernel == "saxpy" and c.threadgroups == N // 64 and c.ops.f32 == 2 * N
    assert (buffer(c, "y").loads, buffer(c, "y").stores) == (N // 32, N // 32)
    # the scalar is a value the host set (setBytes), kept in uniform registers: no traffic
    assert {b.buffer for b in c.buffers} == {"x", "y"}
    launch = kernel.launch(buffers=[x, y.copy(), np.float32(2)], grid=N,
                           threads_per_threadgroup=64)
    assert mtwork.profile(launch) == c
    assert {(s.file, s.line) for s in c.source_lines} == {("source", 5)}


def test_a_const_qualified_constant_reference_is_a_value_not_buffer_traffic():
    # MLX spells its scalar arguments `const constant int&`: still a value the host sets
    source = SAXPY.replace("constant float& a", "const constant float& a")
    kernel = load_metal(source).kernel("saxpy")
    x, y = np.arange(N, dtype=np.float32), np.ones(N, dtype=np.float32)
    kernel(buffers=[x, y, np.float32(2)], grid=N, threads_per_threadgroup=64, profile=True)
    assert {b.buffer for b in kernel.last_counters.buffers} == {"x", "y"}


GEMM_PARAMS = np.dtype(
    [("M", "i4"), ("N", "i4"), ("K", "i4"), ("lda", "i4"), ("ldb", "i4"), ("ldd", "i4"),
     ("tiles_n", "i4"), ("tiles_m", "i4"), ("batch_stride_a", "i8"), ("batch_stride_b", "i8"),
     ("batch_stride_d", "i8"), ("swizzle_log", "i4"), ("gemm_k_iterations_aligned", "i4"),
     ("batch_ndim", "i4")],
    align=True,
)  # MLX's steel/gemm/params.h GEMMParams


def test_mlx_steel_gemm_does_m_n_k_over_512_multiply_accumulates():
    # MLX's own GEMM from the installed wheel, dispatched as matmul.cpp does: 32 x 32
    # tiles, 4 SIMD-groups; its loaders copy 16-byte vectors of A and B into threadgroup
    # memory (memcpy in the IR, reported as accesses).
    kernels = mlx_include_dir() / "mlx" / "backend" / "metal" / "kernels"
    lib = load_metal(kernels / "steel/gemm/kernels/steel_gemm_fused.h",
                     prelude='#include "mlx/backend/metal/kernels/utils.h"\n'
                             '#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"\n')
    m = n = 64
    k = 32
    kernel = lib.kernel("gemm", template=(mx.float32, 32, 32, 16, 2, 2, False, False),
                        constants={"has_batch": False, "use_out_source": False,
                                   "do_axpby": False, "align_M": True, "align_N": True,
                                   "align_K": True})
    a = np.random.default_rng(0).standard_normal((1, m, k)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((1, k, n)).astype(np.float32)
    params = np.array([(m, n, k, k, n, n, 2, 2, m * k, k * n, m * n, 0, k // 16, 1)],
                      dtype=GEMM_PARAMS)
    out = kernel(buffers={"A": a, "B": b, "D": new_buffer((1, m, n)), "params": params},
                 threadgroups=(2, 2, 1), threads_per_threadgroup=(32, 2, 2), profile=True)
    mtwork.assert_close(out.mx("D"), a.astype(np.float64) @ b, dtype=mx.float32)
    c = kernel.last_counters
    assert c.simd.mma_f32 == m * n * k // 512
    for name, size in (("A", a.nbytes), ("B", b.nbytes)):
        loads = buffer(c, name)
        assert loads.distinct_lines == size // GRANULE
        assert loads.load_bytes == 2 * size  # each tile is read by the two tiles across
    assert c.threadgroup_accesses > 0 and c.threadgroup_barriers > 0


def test_the_model_ranks_flash_attention_above_the_scalar_kernel():
    family = mtwork.load_family("flash_attention")
    shape = family.Shape(batch=1, heads=1, q_len=128, kv_len=128, head_dim=64)
    inputs = family.make_inputs(shape)
    tiles = family.Tiles(block_q=32, block_k=32, simdgroups=2)
    flash = mtwork.profile(family.flash_launch(shape, tiles=tiles), *inputs)
    naive = mtwork.profile(family.naive_launch(shape), *inputs)
    assert flash.simd.mma_f32 > 0 and naive.simd.mma_f32 == 0
    assert mtwork.gpu.estimate(flash).seconds < mtwork.gpu.estimate(naive).seconds


def test_bad_profile_arguments_are_refused():
    kernel = mtwork.metal_kernel("bad", ["a"], ["o"], "o[0] = a[0];")
    call = dict(inputs=[mx.ones((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                output_shapes=[(1,)], output_dtypes=[mx.float32])
    with pytest.raises(ValueError, match="`profile` must be True or False"):
        kernel(**call, profile="yes")
    with pytest.raises(ValueError, match="cannot be combined"):
        kernel(**call, profile=True, sanitize=True)
    with pytest.raises(TypeError, match="mtwork.Launch"):
        mtwork.profile(kernel)


# --- registers ----------------------------------------------------------------------------


def test_the_register_estimate_counts_the_values_a_thread_keeps_live():
    # No per-kernel register counts are published for Apple's compiler; the estimate is
    # held to what a thread must keep: a copy needs a handful, a thread that holds 32
    # loaded floats until a reverse pass uses them needs at least 32 (and is not charged
    # for much more than it holds).
    v = (np.arange(N * 32) % 5 * 0.25).reshape(N, 32)
    x = mx.array(v.reshape(-1).astype(np.float32))
    _, copy = profiled("copy", "uint i = thread_position_in_grid.x; out[i] = in0[i];", [x])
    held = ("uint i = thread_position_in_grid.x; float v[32];"
            "for (int k = 0; k < 32; ++k) v[k] = in0[i * 32 + k];"
            "float s = 0.0f; for (int k = 31; k >= 0; --k) s = s * v[k] + 1.0f;"
            "out[i] = s;")
    outputs, holding = profiled("hold32", held, [x])
    assert copy.registers <= 12
    assert 32 <= holding.registers <= 56
    expected = np.zeros(N)
    for k in range(31, -1, -1):
        expected = expected * v[:, k] + 1.0
    np.testing.assert_allclose(np.array(outputs[0]), expected, rtol=1e-4)
