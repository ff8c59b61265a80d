"""Metal atomics on the emulator: device atomics shared by threadgroups that run in
parallel, threadgroup atomics, float atomics, MLX's `atomic_outputs=True` and its
atomic.h helpers."""

import mlx.core as mx
import numpy as np
import pytest

import mtwork

GROUPS = 64  # threadgroups per test dispatch: enough to spread over every core


def run(kernel, inputs, grid, threadgroup, shapes, dtypes, **kwargs):
    outs = kernel(
        inputs=[mx.array(x) for x in inputs],
        grid=grid,
        threadgroup=threadgroup,
        output_shapes=shapes,
        output_dtypes=dtypes,
        backend="sim",
        **kwargs,
    )
    return [np.array(o) for o in outs]


def test_histogram_counts_are_exact_across_threadgroups() -> None:
    rng = np.random.default_rng(0)
    # Skewed bins, so many threads of many threadgroups hit the same counter at once.
    values = np.minimum(rng.geometric(0.15, GROUPS * 256) - 1, 39).astype(np.uint32)
    kernel = mtwork.metal_kernel(
        "histogram",
        ["values"],
        ["hist"],
        """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&hist[values[i]], 1, memory_order_relaxed);
        """,
        atomic_outputs=True,
    )
    (hist,) = run(kernel, [values], (values.size, 1, 1), (256, 1, 1), [(40,)], [mx.uint32],
                  init_value=0)
    np.testing.assert_array_equal(hist, np.bincount(values, minlength=40))


def test_device_atomics_on_a_plain_output_buffer() -> None:
    # Without atomic_outputs, kernels cast their output to `device atomic_uint*`.
    n = GROUPS * 128
    kernel = mtwork.metal_kernel(
        "cast_counter",
        ["dummy"],
        ["count"],
        """
        device atomic_uint* c = (device atomic_uint*)count;
        atomic_fetch_add_explicit(c, 2u, memory_order_relaxed);
        atomic_fetch_sub_explicit(c + 1, 1u, memory_order_relaxed);
        """,
    )
    (count,) = run(kernel, [np.zeros(1, np.float32)], (n, 1, 1), (128, 1, 1), [(2,)],
                   [mx.uint32], init_value=0)
    assert count[0] == 2 * n
    assert count[1] == np.uint32(-n % 2**32)  # unsigned wrap-around


def test_threadgroup_counter_hands_out_distinct_tickets() -> None:
    threads = 256
    kernel = mtwork.metal_kernel(
        "tickets",
        ["dummy"],
        ["tickets", "totals"],
        """
        threadgroup atomic_int counter;
        threadgroup atomic_uint per_simd[8];
        uint t = thread_index_in_threadgroup;
        if (t == 0) atomic_store_explicit(&counter, 0, memory_order_relaxed);
        if (t < 8) atomic_store_explicit(&per_simd[t], 0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        tickets[thread_position_in_grid.x] =
            atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&per_simd[simdgroup_index_in_threadgroup], 1u,
                                  memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (t < 9) {
          int total = t == 8 ? atomic_load_explicit(&counter, memory_order_relaxed)
                             : int(atomic_load_explicit(&per_simd[t], memory_order_relaxed));
          totals[threadgroup_position_in_grid.x * 9 + t] = total;
        }
        """,
    )
    groups = 16
    tickets, totals = run(kernel, [np.zeros(1, np.float32)], (groups * threads, 1, 1),
                          (threads, 1, 1), [(groups * threads,), (groups, 9)],
                          [mx.int32, mx.int32])
    for g in range(groups):
        got = np.sort(tickets[g * threads : (g + 1) * threads])
        np.testing.assert_array_equal(got, np.arange(threads))
    np.testing.assert_array_equal(totals[:, :8], 32)
    np.testing.assert_array_equal(totals[:, 8], threads)


def test_threadgroup_atomic_has_the_size_and_alignment_of_its_value() -> None:
    kernel = mtwork.metal_kernel(
        "layout",
        ["dummy"],
        ["out"],
        "out[0] = sizeof(atomic_int) + sizeof(atomic_float) + sizeof(atomic_bool);",
        header="""
        static_assert(sizeof(atomic_uint) == 4 && alignof(atomic_uint) == 4);
        static_assert(sizeof(atomic_float) == 4 && alignof(atomic_float) == 4);
        static_assert(sizeof(atomic_ulong) == 8 && alignof(atomic_ulong) == 8);
        static_assert(__is_trivially_constructible(atomic_int));
        static_assert(__is_trivially_destructible(atomic_float));
        """,
    )
    (out,) = run(kernel, [np.zeros(1, np.float32)], (1, 1, 1), (1, 1, 1), [(1,)], [mx.uint32])
    assert out[0] == 9


def test_float_fetch_add_matches_the_sum() -> None:
    rng = np.random.default_rng(1)
    slots, per_slot = 8, GROUPS * 64
    x = rng.standard_normal(slots * per_slot).astype(np.float32)
    kernel = mtwork.metal_kernel(
        "float_sum",
        ["x"],
        ["sums"],
        """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&sums[i % 8], x[i], memory_order_relaxed);
        """,
        atomic_outputs=True,
    )
    (sums,) = run(kernel, [x], (x.size, 1, 1), (64, 1, 1), [(slots,)], [mx.float32],
                  init_value=0)
    by_slot = x.astype(np.float64).reshape(per_slot, slots)
    expected = by_slot.sum(axis=0)
    # Any order of float32 additions stays within n * eps * sum|x| of the exact sum.
    bound = per_slot * np.finfo(np.float32).eps * np.abs(by_slot).sum(axis=0)
    assert np.all(np.abs(sums - expected) <= bound)


def test_float_fetch_sub_and_exchange() -> None:
    kernel = mtwork.metal_kernel(
        "float_sub",
        ["dummy"],
        ["acc", "old"],
        """
        uint i = thread_position_in_grid.x;
        atomic_fetch_sub_explicit(&acc[0], 0.5f, memory_order_relaxed);
        float taken = atomic_exchange_explicit(&acc[1], float(i + 1), memory_order_relaxed);
        atomic_store_explicit(&old[i], taken, memory_order_relaxed);
        """,
        atomic_outputs=True,
    )
    n = GROUPS * 32
    acc, old = run(kernel, [np.zeros(1, np.float32)], (n, 1, 1), (32, 1, 1), [(2,), (n,)],
                   [mx.float32, mx.float32], init_value=0)
    assert acc[0] == -0.5 * n  # halves add exactly
    # Each value put in is either taken out by the next exchange or still there at the end.
    seen = np.sort(np.append(old, acc[1]))
    np.testing.assert_array_equal(seen, np.arange(n + 1, dtype=np.float32))


def test_compare_exchange_builds_a_float_maximum() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(GROUPS * 64).astype(np.float32) * 100
    kernel = mtwork.metal_kernel(
        "cas_max",
        ["x"],
        ["best", "retries"],
        """
        uint i = thread_position_in_grid.x;
        float v = x[i];
        float seen = atomic_load_explicit(&best[0], memory_order_relaxed);
        uint tries = 0;
        while (v > seen && !atomic_compare_exchange_weak_explicit(
                               &best[0], &seen, v, memory_order_relaxed,
                               memory_order_relaxed)) {
          ++tries;
        }
        atomic_fetch_add_explicit(&retries[0], tries, memory_order_relaxed);
        """,
        atomic_outputs=True,
    )
    best, _ = run(kernel, [x], (x.size, 1, 1), (64, 1, 1), [(1,), (1,)],
                  [mx.float32, mx.uint32], init_value=-1e30)
    assert best[0] == x.max()


def test_compare_exchange_reports_the_value_found() -> None:
    kernel = mtwork.metal_kernel(
        "cas_semantics",
        ["dummy"],
        ["ints", "floats", "results"],
        """
        device atomic_int* i = (device atomic_int*)ints;
        device atomic_float* f = (device atomic_float*)floats;
        atomic_store_explicit(i, 7, memory_order_relaxed);
        int expected = 3;
        results[0] = atomic_compare_exchange_weak_explicit(
            i, &expected, 9, memory_order_relaxed, memory_order_relaxed);
        results[1] = expected;  // the 7 found
        results[2] = atomic_compare_exchange_weak_explicit(
            i, &expected, 9, memory_order_relaxed, memory_order_relaxed);
        results[3] = atomic_load_explicit(i, memory_order_relaxed);

        // Apple compares floats by value: -0 matches +0, NaN matches nothing (MLX atomic.h).
        float nan = numeric_limits<float>::quiet_NaN(), zero = 0.0f;
        atomic_store_explicit(&f[0], -0.0f, memory_order_relaxed);
        results[4] = atomic_compare_exchange_weak_explicit(
            &f[0], &zero, 5.0f, memory_order_relaxed, memory_order_relaxed);
        atomic_store_explicit(&f[1], nan, memory_order_relaxed);
        results[5] = atomic_compare_exchange_weak_explicit(
            &f[1], &nan, 6.0f, memory_order_relaxed, memory_order_relaxed);
        results[6] = isnan(nan);
        """,
    )
    ints, floats, results = run(kernel, [np.zeros(1, np.float32)], (1, 1, 1), (1, 1, 1),
                                [(1,), (2,), (7,)], [mx.int32, mx.float32, mx.int32])
    np.testing.assert_array_equal(results, [0, 7, 1, 9, 1, 0, 1])
    assert ints[0] == 9
    assert floats[0] == 5.0
    assert np.isnan(floats[1])


def test_scatter_add_with_atomic_outputs() -> None:
    # The pattern of MLX's grid_sample VJP example: many threads add weighted gradients
    # into shared output cells.
    rng = np.random.default_rng(3)
    n, cells = GROUPS * 64, 50
    index = rng.integers(0, cells, n).astype(np.int32)
    weight = rng.uniform(0, 1, n).astype(np.float32)
    grad = rng.standard_normal(n).astype(np.float32)
    kernel = mtwork.metal_kernel(
        "scatter_add",
        ["index", "weight", "grad"],
        ["out"],
        """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&out[index[i]], weight[i] * grad[i], memory_order_relaxed);
        """,
        atomic_outputs=True,
    )
    (out,) = run(kernel, [index, weight, grad], (n, 1, 1), (64, 1, 1), [(cells,)],
                 [mx.float32], init_value=0)
    terms = (weight * grad).astype(np.float64)
    expected = np.zeros(cells)
    np.add.at(expected, index, terms)
    magnitude = np.zeros(cells)
    np.add.at(magnitude, index, np.abs(terms))
    counts = np.bincount(index, minlength=cells)
    assert np.all(np.abs(out - expected) <= counts * np.finfo(np.float32).eps * magnitude)


@pytest.mark.parametrize(("dtype", "type_name"), [(mx.int32, "int"), (mx.uint32, "uint")])
def test_fetch_min_and_max(dtype: mx.Dtype, type_name: str) -> None:
    rng = np.random.default_rng(4)
    np_type = np.int32 if type_name == "int" else np.uint32
    info = np.iinfo(np_type)
    x = rng.integers(info.min, info.max, GROUPS * 64, dtype=np.int64).astype(np_type)
    start = 1_000_000
    kernel = mtwork.metal_kernel(
        f"minmax_{type_name}",
        ["x"],
        ["lo", "hi", "old_lo"],
        """
        uint i = thread_position_in_grid.x;
        old_lo[i] = atomic_fetch_min_explicit((device atomic<T>*)&lo[0], x[i],
                                              memory_order_relaxed);
        atomic_fetch_max_explicit((device atomic<T>*)&hi[0], x[i], memory_order_relaxed);
        """,
    )
    lo, hi, old_lo = run(kernel, [x], (x.size, 1, 1), (64, 1, 1), [(1,), (1,), (x.size,)],
                         [dtype] * 3, template=[("T", dtype)], init_value=start)
    assert lo[0] == min(x.min(), start)
    assert hi[0] == max(x.max(), start)
    # Each fetch returned the minimum so far: the start or one of the values, between the
    # final minimum and the start.
    assert np.all((old_lo >= lo[0]) & (old_lo <= start))
    assert np.all(np.isin(old_lo, np.append(x, np_type(start))))


def test_bitwise_fetch_operations() -> None:
    kernel = mtwork.metal_kernel(
        "bits",
        ["dummy"],
        ["bits", "old"],
        """
        threadgroup atomic_uint mask;
        uint i = thread_position_in_grid.x, t = thread_index_in_threadgroup;
        if (t == 0) atomic_store_explicit(&mask, ~0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        atomic_fetch_and_explicit(&mask, ~(1u << t) | 1u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (t == 1) {
          uint m = atomic_load_explicit(&mask, memory_order_relaxed);
          atomic_fetch_or_explicit((device atomic_uint*)&bits[1], m, memory_order_relaxed);
        }
        atomic_fetch_or_explicit((device atomic_uint*)&bits[0], 1u << (i % 32),
                                 memory_order_relaxed);
        old[i] = atomic_fetch_xor_explicit((device atomic_uint*)&bits[2], 1u << (i % 3),
                                           memory_order_relaxed);
        """,
    )
    n = GROUPS * 32 + 3
    bits, old = run(kernel, [np.zeros(1, np.float32)], (n, 1, 1), (32, 1, 1), [(3,), (n,)],
                    [mx.uint32, mx.uint32], init_value=0)
    assert bits[0] == 0xFFFFFFFF
    # Full threadgroups clear every bit but bit 0; the last one, of 3 threads, bits 1 and 2.
    assert bits[1] == 1 | (0xFFFFFFFF & ~0b110)
    flips = np.bincount(np.arange(n) % 3, minlength=3)
    assert bits[2] == sum(int(f % 2) << b for b, f in enumerate(flips))
    assert np.all(old >> 3 == 0)  # bits above 2 are never touched


def test_bool_flag_elects_one_thread() -> None:
    kernel = mtwork.metal_kernel(
        "flag",
        ["dummy"],
        ["flag", "winners"],
        """
        bool was_set = atomic_exchange_explicit((device atomic_bool*)flag, true,
                                                memory_order_relaxed);
        if (!was_set)
          atomic_fetch_add_explicit((device atomic_uint*)winners, 1u, memory_order_relaxed);
        """,
    )
    flag, winners = run(kernel, [np.zeros(1, np.float32)], (GROUPS * 32, 1, 1), (32, 1, 1),
                        [(1,), (1,)], [mx.bool_, mx.uint32], init_value=0)
    assert flag[0] and winners[0] == 1


def test_64_bit_min_and_max() -> None:
    # Metal 2.4's atomic_ulong: min and max that return nothing.
    kernel = mtwork.metal_kernel(
        "ulong_minmax",
        ["values"],
        ["extremes"],
        """
        ulong v = values[thread_position_in_grid.x];
        atomic_max_explicit((device atomic_ulong*)extremes, v, memory_order_relaxed);
        atomic_min_explicit((device atomic_ulong*)extremes + 1, v, memory_order_relaxed);
        """,
    )
    start = 2**40
    rng = np.random.default_rng(6)
    # Magnitudes from 2^32 to 2^62, so both ends pass the start and need all 64 bits.
    powers = np.uint64(1) << rng.integers(32, 63, GROUPS * 32).astype(np.uint64)
    values = powers + rng.integers(0, 2**31, GROUPS * 32).astype(np.uint64)
    (extremes,) = run(kernel, [values], (values.size, 1, 1), (32, 1, 1), [(2,)], [mx.uint64],
                      init_value=start)
    assert values.min() < start < values.max()
    assert extremes[0] == values.max()
    assert extremes[1] == values.min()


def test_mlx_atomic_header_compiles_and_runs() -> None:
    # MLX's own atomic.h: native float atomics, and the packed-in-uint path for half.
    rng = np.random.default_rng(5)
    x = rng.standard_normal(GROUPS * 32).astype(np.float32)
    kernel = mtwork.metal_kernel(
        "mlx_atomics",
        ["x"],
        ["sums", "maxes"],
        """
        uint i = thread_position_in_grid.x;
        mlx_atomic_fetch_add_explicit((device mlx_atomic<float>*)sums, x[i], i % 4);
        mlx_atomic_fetch_max_explicit((device mlx_atomic<half>*)maxes, half(x[i]), i % 4);
        """,
        header='#include "mlx/backend/metal/kernels/atomic.h"\n',
    )
    sums, maxes = run(kernel, [x], (x.size, 1, 1), (32, 1, 1), [(4,), (4,)],
                      [mx.float32, mx.float16], init_value=-100)
    by_slot = x.astype(np.float64).reshape(-1, 4)
    bound = len(by_slot) * np.finfo(np.float32).eps * (np.abs(by_slot).sum(axis=0) + 100)
    assert np.all(np.abs(sums - (by_slot.sum(axis=0) - 100)) <= bound)
    np.testing.assert_array_equal(maxes, x.astype(np.float16).reshape(-1, 4).max(axis=0))


@pytest.mark.parametrize(
    ("declaration", "call"),
    [
        ("threadgroup atomic<half> h;", ""),
        ("threadgroup atomic_float f;",
         "atomic_fetch_min_explicit(&f, 1.0f, memory_order_relaxed);"),
        ("threadgroup atomic_float f;",
         "atomic_fetch_or_explicit(&f, 1.0f, memory_order_relaxed);"),
    ],
)
def test_operations_metal_lacks_do_not_compile(declaration: str, call: str) -> None:
    kernel = mtwork.metal_kernel("unsupported", ["dummy"], ["out"],
                                 f"{declaration}\n{call}\nout[0] = 0;")
    with pytest.raises(mtwork.CompileError):
        run(kernel, [np.zeros(1, np.float32)], (1, 1, 1), (1, 1, 1), [(1,)], [mx.float32])
