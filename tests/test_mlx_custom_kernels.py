"""MLX's own custom-kernel tests (python/tests/test_fast.py, `test_custom_kernel_*`),
re-written against `mtwork.metal_kernel` and run on the `sim` backend."""

import mlx.core as mx
import numpy as np
import pytest

import mtwork


def test_custom_kernel_basic():
    mx.random.seed(7)
    a = mx.random.normal(shape=(2, 2))
    kernel = mtwork.metal_kernel(
        name="basic",
        input_names=["a"],
        output_names=["out1"],
        source="""
            uint elem = thread_position_in_grid.x;
            out1[elem] = a[elem];
        """,
    )
    out = kernel(
        inputs=[a],
        grid=(4, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(2, 2)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )
    assert mx.allclose(out[0], a)


def test_custom_kernel_args():
    mx.random.seed(7)
    a = mx.random.normal(shape=(3, 6))
    c = mx.random.normal(shape=(2, 2)).astype(mx.bfloat16)
    kernel = mtwork.metal_kernel(
        name="arg_test",
        input_names=["a", "b", "c", "d"],
        output_names=["out1", "out2"],
        source="""
            uint elem = thread_position_in_grid.x;
            T tmp = a[0];
            if (e) {
                out1[elem] = a[1] + b[2] + c[3] + d + f;
            } else {
                out1[elem] = 1;
            }
            out2[elem] = a[1] + b[2] + c[1] - d;
        """,
    )
    out = kernel(
        inputs=[a, mx.array([3, 4, 5]), c, 7.3],
        template=[("e", True), ("f", 3), ("T", mx.float16)],
        grid=(6, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(3, 2), (3, 2)],
        output_dtypes=[mx.float32, mx.int32],
        stream=mx.gpu,
    )
    # The expected values follow from the inputs, computed the way Metal does: the bf16
    # element widens to float, the 0-d `d` is float32, the int store truncates.
    an, cn = np.array(a), np.array(c.astype(mx.float32))
    d = np.float32(7.3)
    expected1 = np.float32(an.flat[1] + np.float32(5) + cn.flat[3] + d + np.float32(3))
    expected2 = np.int32(np.float32(an.flat[1] + np.float32(5) + cn.flat[1] - d))
    assert mx.allclose(out[0], mx.full((3, 2), expected1.item()))
    assert mx.array_equal(out[1], mx.full((3, 2), int(expected2), dtype=mx.int32))


@pytest.mark.parametrize("contig", [True, False])
def test_custom_kernel_strides(contig):
    mx.random.seed(7)
    source = """
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;
    """
    source_contig = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;
    """
    a = mx.random.normal(shape=(3, 6))
    a = mx.tile(a[::2], [4, 1])
    kernel = mtwork.metal_kernel(
        name="myexp" + str(contig),
        input_names=["inp"],
        output_names=["out"],
        source=source_contig if contig else source,
        ensure_row_contiguous=contig,
    )
    out = kernel(
        inputs=[a],
        template=[("T", mx.float32)],
        grid=(a.size, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape],
        output_dtypes=[a.dtype],
        stream=mx.gpu,
    )
    assert mx.allclose(mx.exp(a) * 32, out[0])


def test_custom_kernel_helper():
    mx.random.seed(7)
    a = mx.random.normal(shape=(2, 2))
    kernel = mtwork.metal_kernel(
        name="helper",
        input_names=["a"],
        output_names=["out1"],
        header="""
        template <typename T>
        T do_exp(T x) {
            return metal::precise::exp(x);
        }
        """,
        source="""
            uint elem = thread_position_in_grid.x;
            out1[elem] = do_exp(a[elem]);
        """,
    )
    out = kernel(
        inputs=[a],
        grid=(4, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(2, 2)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )
    assert mx.allclose(out[0], mx.exp(a))


def test_custom_kernel_attributes():
    a = mx.zeros(shape=(1, 1))
    kernel = mtwork.metal_kernel(
        name="test_fun",
        input_names=["a"],
        output_names=["out"],
        source="""
            out[0] = threads_per_threadgroup.x;
        """,
    )
    out = kernel(
        inputs=[a],
        grid=(2, 1, 1),
        threadgroup=(2, 1, 1),
        output_shapes=[(1, 1)],
        output_dtypes=[mx.uint32],
        stream=mx.gpu,
    )[0]
    assert out.item() == 2


def test_custom_kernel_caching():
    def call_kernel(a, source):
        kernel = mtwork.metal_kernel(
            name="my_kernel", input_names=["inp"], output_names=["out"], source=source
        )
        return kernel(
            inputs=[a],
            grid=(a.size, 1, 1),
            threadgroup=(a.size, 1, 1),
            output_shapes=[a.shape],
            output_dtypes=[a.dtype],
            stream=mx.gpu,
        )[0]

    a = mx.random.normal(shape=(32,))
    out = call_kernel(a, "uint elem = thread_position_in_grid.x; out[elem] = 0.0;")
    assert mx.array_equal(out, mx.zeros_like(out))
    out = call_kernel(a, "uint elem = thread_position_in_grid.x; out[elem] = 1.0;")
    assert mx.array_equal(out, mx.ones_like(out))


def test_custom_kernel_same_name_different_source_one_eval():
    a = mx.arange(32, dtype=mx.float32)

    def make(source):
        return mtwork.metal_kernel(
            name="dup_name", input_names=["inp"], output_names=["out"], source=source
        )

    call = dict(grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
                output_dtypes=[mx.float32])
    out_a = make("uint e = thread_position_in_grid.x; out[e] = inp[e] * 2.0f;")(
        inputs=[a], **call)[0]
    out_b = make("uint e = thread_position_in_grid.x; out[e] = inp[e] + 100.0f;")(
        inputs=[a], **call)[0]
    mx.eval(out_a, out_b)
    assert mx.array_equal(out_a, a * 2)
    assert mx.array_equal(out_b, a + 100)


def test_custom_metal_kernel_math_mode():
    source = """
        uint elem = thread_position_in_grid.x;
    #if defined(__FAST_MATH__) && __FAST_MATH__
        out[elem] = 1.0f;
    #else
        out[elem] = 0.0f;
    #endif
    """
    a = mx.zeros((4,))

    def run(mode):
        kernel = mtwork.metal_kernel(
            name="math_mode_" + mode, input_names=["a"], output_names=["out"], source=source,
            compile_options={"math_mode": mode},
        )
        return kernel(inputs=[a], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                      output_shapes=[(4,)], output_dtypes=[mx.float32])[0]

    assert mx.array_equal(run("safe"), mx.zeros((4,)))
    assert mx.array_equal(run("relaxed"), mx.zeros((4,)))
    assert mx.array_equal(run("fast"), mx.ones((4,)))
    with pytest.raises(ValueError):
        mtwork.metal_kernel(name="m", input_names=["a"], output_names=["out"], source=source,
                            compile_options={"math_mode": "precise"})
    with pytest.raises(ValueError):
        mtwork.metal_kernel(name="m", input_names=["a"], output_names=["out"], source=source,
                            compile_options={"fast_math": True})


def test_custom_kernel_mixed_dtypes():
    kernel = mtwork.metal_kernel(
        name="mixed",
        input_names=["inp"],
        output_names=["out"],
        source="uint elem = thread_position_in_grid.x; out[elem] = inp[elem] + inp[elem];",
    )

    def call(x):
        return kernel(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                      output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    a_out = call(mx.full((32,), 1.5, dtype=mx.float16))
    b_out = call(mx.full((32,), 2.5, dtype=mx.float32))
    assert a_out.dtype == mx.float16 and b_out.dtype == mx.float32
    assert mx.allclose(a_out.astype(mx.float32) + b_out, mx.full((32,), 8.0))


def test_compile_error_is_an_exception_and_later_calls_work():
    bad = mtwork.metal_kernel(name="bad", input_names=["a"], output_names=["out"],
                              source="this is not metal code {")
    a = mx.zeros((4,))
    call = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                output_dtypes=[mx.float32])
    with pytest.raises(mtwork.CompileError):
        bad(inputs=[a], **call)
    good = mtwork.metal_kernel(name="good", input_names=["a"], output_names=["out"],
                               source="out[thread_position_in_grid.x] = a[0] + 1;")
    assert mx.array_equal(good(inputs=[a], **call)[0], mx.ones((4,)))


def test_stream_cpu_is_rejected_like_mlx():
    kernel = mtwork.metal_kernel(name="s", input_names=["a"], output_names=["out"],
                                 source="out[0] = a[0];")
    with pytest.raises(ValueError, match="Only supports the GPU"):
        kernel(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32], stream=mx.cpu)
