"""The emulator core: thread attributes, dispatch geometry, barriers and threadgroup memory,
dtypes, strides, poison, and errors instead of crashes."""

import itertools

import mlx.core as mx
import numpy as np
import pytest

import mtwork

SCALARS = [
    "dispatch_quadgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup",
    "quadgroup_index_in_threadgroup",
    "quadgroups_per_threadgroup",
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
    "thread_execution_width",
    "thread_index_in_quadgroup",
    "thread_index_in_simdgroup",
    "thread_index_in_threadgroup",
    "threads_per_simdgroup",
]
VECTORS = [
    "dispatch_threads_per_threadgroup",
    "grid_origin",
    "grid_size",
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threadgroups_per_grid",
    "threads_per_grid",
    "threads_per_threadgroup",
]
FIELDS = SCALARS + [f"{v}.{c}" for v in VECTORS for c in "xyz"]


def _attributes_kernel():
    writes = "\n".join(
        f"  out[base + {i}] = {field};" for i, field in enumerate(FIELDS)
    )
    source = (
        "  uint3 p = thread_position_in_grid;\n"
        "  uint3 g = threads_per_grid;\n"
        f"  uint base = ((p.z * g.y + p.y) * g.x + p.x) * {len(FIELDS)};\n" + writes
    )
    return mtwork.metal_kernel("attrs", ["dummy"], ["out"], source)


def _expected_attributes(grid, tg):
    """Every attribute of every thread, derived from dispatchThreads semantics."""
    gx, gy, gz = grid
    tx, ty, tz = (min(t, g) for t, g in zip(tg, grid))
    groups = [-(-g // t) for g, t in zip(grid, (tx, ty, tz))]
    dispatch_threads = tx * ty * tz
    rows = np.zeros((gz, gy, gx, len(FIELDS)), dtype=np.int64)
    for z, y, x in itertools.product(range(gz), range(gy), range(gx)):
        gp = (x // tx, y // ty, z // tz)
        lp = (x % tx, y % ty, z % tz)
        actual = [min(t, g - q * t) for t, g, q in zip((tx, ty, tz), grid, gp)]
        n = actual[0] * actual[1] * actual[2]
        linear = lp[0] + lp[1] * actual[0] + lp[2] * actual[0] * actual[1]
        scalars = {
            "dispatch_quadgroups_per_threadgroup": -(-dispatch_threads // 4),
            "dispatch_simdgroups_per_threadgroup": -(-dispatch_threads // 32),
            "quadgroup_index_in_threadgroup": linear // 4,
            "quadgroups_per_threadgroup": -(-n // 4),
            "simdgroup_index_in_threadgroup": linear // 32,
            "simdgroups_per_threadgroup": -(-n // 32),
            "thread_execution_width": 32,
            "thread_index_in_quadgroup": linear % 4,
            "thread_index_in_simdgroup": linear % 32,
            "thread_index_in_threadgroup": linear,
            "threads_per_simdgroup": 32,
        }
        vectors = {
            "dispatch_threads_per_threadgroup": (tx, ty, tz),
            "grid_origin": (0, 0, 0),
            "grid_size": grid,
            "thread_position_in_grid": (x, y, z),
            "thread_position_in_threadgroup": lp,
            "threadgroup_position_in_grid": gp,
            "threadgroups_per_grid": groups,
            "threads_per_grid": grid,
            "threads_per_threadgroup": actual,
        }
        values = [scalars[s] for s in SCALARS] + [
            vectors[v][k] for v in VECTORS for k in range(3)
        ]
        rows[z, y, x] = values
    return rows


@pytest.mark.parametrize(
    "grid, tg",
    [((70, 3, 2), (32, 2, 1)), ((5, 7, 3), (4, 4, 2)), ((33, 1, 1), (256, 1, 1))],
)
def test_all_twenty_attributes_including_partial_threadgroups(grid, tg):
    kernel = _attributes_kernel()
    total = grid[0] * grid[1] * grid[2]
    out = kernel(inputs=[mx.zeros((1,))], grid=grid, threadgroup=tg,
                 output_shapes=[(total * len(FIELDS),)], output_dtypes=[mx.uint32])[0]
    got = np.array(out).reshape(grid[2], grid[1], grid[0], len(FIELDS))
    expected = _expected_attributes(grid, tg)
    for i, field in enumerate(FIELDS):
        np.testing.assert_array_equal(got[..., i], expected[..., i], err_msg=field)


@pytest.mark.parametrize("grid, tg", [((1_000_003, 1, 1), (64, 1, 1)),
                                      ((300, 200, 20), (16, 8, 2))])
def test_every_threadgroup_of_a_large_grid_runs_once(grid, tg):
    """Workers claim runs of a barrier-free kernel's threadgroups at a time: every group
    must still run once, the last partial run and the partial groups at the edges too."""
    kernel = mtwork.metal_kernel("group_counts", ["a"], ["counts"], """
        uint3 g = threadgroup_position_in_grid, n = threadgroups_per_grid;
        atomic_fetch_add_explicit(&counts[(g.z * n.y + g.y) * n.x + g.x], 1,
                                  memory_order_relaxed);
    """, atomic_outputs=True)
    groups = [-(-a // b) for a, b in zip(grid, tg)]
    counts = kernel(inputs=[mx.zeros((1,))], grid=grid, threadgroup=tg,
                    output_shapes=[(int(np.prod(groups)),)], output_dtypes=[mx.uint32],
                    init_value=0)[0]
    z, y, x = np.meshgrid(*(np.arange(n) // t for n, t in zip(grid[::-1], tg[::-1])),
                          indexing="ij")
    linear = (z * groups[1] + y) * groups[0] + x
    np.testing.assert_array_equal(np.array(counts),
                                  np.bincount(linear.ravel(), minlength=counts.size))


def test_attribute_declared_types_match_mlx():
    gen = _attributes_kernel().generate([mx.zeros((1,))], [mx.uint32])
    declared = {p.name: p.msl_type for p in gen.params if p.kind == "attribute"}
    assert len(declared) == 20
    assert all(declared[s] == "uint" for s in SCALARS)
    assert all(declared[v] == "uint3" for v in VECTORS)


def test_threads_outside_the_grid_do_not_run():
    kernel = mtwork.metal_kernel("count", ["a"], ["out"], """
        out[thread_position_in_grid.x] = 1;
    """)
    out = kernel(inputs=[mx.zeros((1,))], grid=(37, 1, 1), threadgroup=(16, 1, 1),
                 output_shapes=[(48,)], output_dtypes=[mx.int32])[0]
    got = np.array(out)
    assert (got[:37] == 1).all()
    assert (got[37:] == np.int32(np.uint32(0xBEBEBEBE).view(np.int32))).all()


def test_barrier_tree_reduction_and_threadgroup_memory_is_private():
    source = """
        threadgroup float buf[128];
        uint t = thread_position_in_threadgroup.x;
        buf[t] = inp[thread_position_in_grid.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = 64; s > 0; s >>= 1) {
            if (t < s) buf[t] += buf[t + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (t == 0) out[threadgroup_position_in_grid.x] = buf[0];
    """
    kernel = mtwork.metal_kernel("tree", ["inp"], ["out"], source)
    x = np.random.default_rng(0).integers(-50, 50, size=128 * 40).astype(np.float32)
    out = kernel(inputs=[x], grid=(x.size, 1, 1), threadgroup=(128, 1, 1),
                 output_shapes=[(40,)], output_dtypes=[mx.float32])[0]
    np.testing.assert_array_equal(np.array(out), x.reshape(40, 128).sum(axis=1))


def test_two_threadgroup_arrays_do_not_overlap():
    source = """
        threadgroup int a[64];
        threadgroup int b[64];
        uint t = thread_position_in_threadgroup.x;
        a[t] = int(t);
        b[t] = -int(t);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = a[63 - t] + 1000 * b[t];
    """
    kernel = mtwork.metal_kernel("two_arrays", ["x"], ["out"], source)
    out = kernel(inputs=[mx.zeros((1,))], grid=(128, 1, 1), threadgroup=(64, 1, 1),
                 output_shapes=[(128,)], output_dtypes=[mx.int32])[0]
    t = np.tile(np.arange(64), 2)
    np.testing.assert_array_equal(np.array(out), (63 - t) - 1000 * t)


ALL_DTYPES = [mx.bool_, mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16,
              mx.uint32, mx.uint64, mx.float16, mx.bfloat16, mx.float32, mx.complex64]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_mlx_dtype_round_trips(dtype):
    rng = np.random.default_rng(1)
    values = mx.array(rng.integers(0, 100, size=(5, 3))).astype(dtype)
    kernel = mtwork.metal_kernel("copy", ["inp"], ["out"], """
        uint i = thread_position_in_grid.x;
        out[i] = inp[i];
    """)
    out = kernel(inputs=[values], grid=(15, 1, 1), threadgroup=(8, 1, 1),
                 output_shapes=[(5, 3)], output_dtypes=[dtype])[0]
    assert out.dtype == dtype
    assert mx.array_equal(out, values)


def test_non_contiguous_inputs_with_real_strides():
    base = mx.arange(4 * 6 * 5, dtype=mx.float32).reshape(4, 6, 5)
    view = base.transpose(2, 0, 1)[:, ::2, 1:]
    kernel = mtwork.metal_kernel("strided", ["inp"], ["out", "meta"], """
        uint i = thread_position_in_grid.x;
        out[i] = inp[elem_to_loc(i, inp_shape, inp_strides, inp_ndim)];
        if (i < uint(inp_ndim)) { meta[i] = inp_shape[i]; meta[3 + i] = inp_strides[i]; }
    """, ensure_row_contiguous=False)
    out, meta = kernel(inputs=[view], grid=(view.size, 1, 1), threadgroup=(32, 1, 1),
                       output_shapes=[view.shape, (6,)],
                       output_dtypes=[mx.float32, mx.int64])
    assert mx.array_equal(out, view)
    assert list(np.array(meta)[:3]) == list(view.shape)
    assert list(np.array(meta)[3:]) == [1, 2 * 30, 5]


def test_poison_marks_unwritten_outputs_and_init_value_fills():
    kernel = mtwork.metal_kernel("half_written", ["a"], ["f", "h", "i"], """
        uint k = thread_position_in_grid.x;
        if (k % 2 == 0) { f[k] = 1; h[k] = 1; i[k] = 1; }
    """)
    call = dict(inputs=[mx.zeros((1,))], grid=(8, 1, 1), threadgroup=(8, 1, 1),
                output_shapes=[(8,)] * 3, output_dtypes=[mx.float32, mx.float16, mx.int32])
    f, h, i = (np.array(o) for o in kernel(**call))
    assert np.isnan(f[1::2]).all() and (f[::2] == 1).all()
    assert np.isnan(h[1::2]).all()
    assert (i[1::2] == np.uint32(0xBEBEBEBE).view(np.int32)).all()
    f, h, i = (np.array(o) for o in kernel(init_value=-2.5, **call))
    assert (f[1::2] == -2.5).all() and (h[1::2] == -2.5).all() and (i[1::2] == -2).all()


def test_scalars_and_small_arrays_go_to_constant_space():
    kernel = mtwork.metal_kernel("scalars", ["s", "small", "big"], ["out"], """
        uint i = thread_position_in_grid.x;
        out[i] = s + small[i % 3] + big[i];
    """)
    big = mx.arange(10, dtype=mx.float32)
    out = kernel(inputs=[2.5, mx.array([1.0, 2.0, 3.0]), big], grid=(10, 1, 1),
                 threadgroup=(4, 1, 1), output_shapes=[(10,)], output_dtypes=[mx.float32])[0]
    np.testing.assert_allclose(np.array(out), 2.5 + np.array([1, 2, 3] * 4)[:10] + np.arange(10))
    text = kernel.generate([2.5, mx.array([1.0, 2.0, 3.0]), big], [mx.float32]).text
    assert "const constant float& s" in text and "const constant float* small" in text
    assert "const device float* big" in text


# ---- bad calls: ValueError saying what is wrong -------------------------------------------

def _copy_kernel():
    return mtwork.metal_kernel("bad_calls", ["a"], ["out"], "out[0] = a[0];")


GOOD = dict(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
            output_shapes=[(1,)], output_dtypes=[mx.float32])


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(output_shapes=[]), "output_shapes"),
        (dict(output_dtypes=[mx.float32, mx.float32]), "output_dtypes"),
        (dict(inputs=[]), "inputs"),
        (dict(grid=(1, 1)), "grid"),
        (dict(grid=(0, 1, 1)), "grid"),
        (dict(threadgroup=(32, 32, 2)), "1024"),
        (dict(threadgroup=(1.5, 1, 1)), "threadgroup"),
        (dict(template=[("T", "float")]), "template"),
        (dict(output_dtypes=["float32"]), "output_dtypes"),
    ],
)
def test_bad_calls_raise_value_errors(change, message):
    with pytest.raises(ValueError, match=message):
        _copy_kernel()(**{**GOOD, **change})


def test_no_outputs_is_rejected():
    with pytest.raises(ValueError, match="at least one output"):
        mtwork.metal_kernel("none", ["a"], [], "")


# ---- faults become exceptions; the process carries on ------------------------------------
# A call is an operation of MLX's graph: what goes wrong as it runs is raised where MLX
# evaluates it (`mx.eval` here), as MLX raises its own kernels' errors.

def test_compile_error_quotes_the_authors_line():
    kernel = mtwork.metal_kernel("typo", ["a"], ["out"], """
        uint i = thread_position_in_grid.x;
        out[i] = a[i] + not_declared;
    """)
    with pytest.raises(mtwork.CompileError) as info:
        kernel(**GOOD)
    assert "source:3:" in info.value.message
    assert "not_declared" in info.value.message
    assert " 3 |" in info.value.message


def test_wild_pointer_is_a_kernel_fault_naming_kernel_and_thread():
    kernel = mtwork.metal_kernel("wild", ["a"], ["out"], """
        device float* p = (device float*)0x40;
        out[0] = p[thread_position_in_grid.x * 1024];
    """)
    with pytest.raises(mtwork.KernelFault, match="wild.*segmentation fault.*thread"):
        mx.eval(kernel(**{**GOOD, "grid": (64, 1, 1), "threadgroup": (32, 1, 1)}))
    assert mx.array_equal(_copy_kernel()(**GOOD)[0], mx.zeros((1,)))


def test_barrier_after_early_return_runs_as_on_the_gpu():
    # Threads that returned do not hold a barrier back on Apple GPUs (MLX's fft.h relies
    # on it); the sanitizer reports it (see test_sanitizer.py).
    kernel = mtwork.metal_kernel("early", ["a"], ["out"], """
        if (thread_position_in_threadgroup.x == 5) return;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = 1;
    """)
    out = kernel(**{**GOOD, "grid": (32, 1, 1), "threadgroup": (32, 1, 1),
                    "output_shapes": [(32,)], "init_value": 0})[0]
    assert np.array_equal(np.array(out), np.where(np.arange(32) == 5, 0, 1))


def test_simdgroups_at_different_barriers_is_a_deadlock():
    kernel = mtwork.metal_kernel("split", ["a"], ["out"], """
        if (simdgroup_index_in_threadgroup == 0) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        } else {
            threadgroup_barrier(mem_flags::mem_device);
        }
        out[0] = 1;
    """)
    with pytest.raises(mtwork.KernelDeadlock, match="different threadgroup_barrier"):
        mx.eval(kernel(**{**GOOD, "grid": (64, 1, 1), "threadgroup": (64, 1, 1)}))


def test_endless_kernel_is_stopped_by_the_watchdog():
    kernel = mtwork.metal_kernel("endless", ["a"], ["out"], """
        volatile uint n = 0;
        while (a[0] < 1.0f) { n = n + 1; }
        out[0] = n;
    """)
    with pytest.raises(mtwork.KernelTimeout, match="endless"):
        mx.eval(kernel(**GOOD, timeout=0.5))
    assert mx.array_equal(_copy_kernel()(**GOOD)[0], mx.zeros((1,)))


def test_threadgroup_memory_over_32_kib_is_an_error():
    kernel = mtwork.metal_kernel("too_big", ["a"], ["out"], """
        threadgroup float big[9000];
        big[thread_position_in_threadgroup.x] = 1;
        out[0] = big[0];
    """)
    with pytest.raises(mtwork.ThreadgroupMemoryError, match="32768"):
        mx.eval(kernel(**GOOD))


def test_a_kernel_hiding_its_simd_calls_still_runs_correctly():
    # The barrier-free fast path is chosen from the kernel's text; here the SIMD function's
    # name is pasted together by the preprocessor, so the guess is wrong and the runtime
    # must fall back to the general path with fresh outputs.
    kernel = mtwork.metal_kernel("hidden_simd", ["a"], ["out"], """
        uint i = thread_position_in_grid.x;
        out[i] = CAT(simd, _sum)(a[i]);
    """, header="#define CAT(x, y) x##y\n")
    x = np.arange(64, dtype=np.float32)
    for _ in range(2):
        out = kernel(inputs=[x], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                     output_shapes=[(64,)], output_dtypes=[mx.float32])[0]
        expected = np.repeat(x.reshape(2, 32).sum(axis=1), 32)
        np.testing.assert_array_equal(np.array(out), expected)


@pytest.mark.parametrize("body, what", [
    ("int d = int(a[0]); out[0] = float(7 / d);", "arithmetic trap"),
    ("__builtin_trap();", "trap"),
])
def test_traps_become_kernel_faults(body, what):
    kernel = mtwork.metal_kernel("trapping", ["a"], ["out"], body)
    with pytest.raises(mtwork.KernelFault, match=what):
        mx.eval(kernel(**GOOD))
    assert mx.array_equal(_copy_kernel()(**GOOD)[0], mx.zeros((1,)))
