"""Full-source kernels: loading `.metal` files, listing their kernels, instantiating,
setting function constants, binding buffers, dispatching, and the errors on the way."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mtwork import CompileError, ThreadgroupMemoryError
from mtwork.backends.metal import wrapper
from mtwork.library import load_metal, new_buffer
from mtwork.msl.includes import mlx_include_dir
from tests.conformance.metal_path import registered

DATA = Path(__file__).parent / "data" / "library"
KERNELS = DATA / "kernels.metal"
MLX_KERNELS = mlx_include_dir() / "mlx" / "backend" / "metal" / "kernels"
MLX_UTILS = '#include "mlx/backend/metal/kernels/utils.h"'


@pytest.fixture(scope="module")
def lib():
    return load_metal(KERNELS, backend="sim")


def _blocks(values: np.ndarray, size: int) -> list[np.ndarray]:
    return [values[i : i + size] for i in range(0, len(values), size)]


def _sequential_sum(values: np.ndarray) -> np.float32:
    """Left-to-right float32 sum, the order the kernel adds in."""
    return np.cumsum(values, dtype=np.float32)[-1] if len(values) else np.float32(0)


# ---------------------------------------------------------------------------------------
# What a library lists


def test_lists_kernels_with_their_parameters(lib):
    assert list(lib.kernels) == ["axpy_blocked", "block_sum"]
    axpy = lib.kernels["axpy_blocked"]
    assert [(t.kind, t.name) for t in axpy.template_params] == [("typename", "T"), ("int", "N")]
    assert [(p.name, p.type_text, p.kind, p.index) for p in axpy.params] == [
        ("x", "const device T*", "buffer", 0),
        ("y", "device T*", "buffer", 1),
        ("alpha", "constant float&", "buffer", 2),
        ("n", "constant uint&", "buffer", 3),
        ("gid", "uint", "attribute", None),
    ]
    x, y, alpha = axpy.params[:3]
    assert (x.address_space, x.is_pointer, x.writable, x.element_type) == ("device", True,
                                                                          False, "T")
    assert y.writable and not alpha.writable and alpha.is_reference
    assert axpy.params[4].attribute == "thread_position_in_grid"
    assert axpy.line == 9 and axpy.file == str(KERNELS)


def test_lists_threadgroup_memory_gated_buffers_and_attributes(lib):
    block_sum = lib.kernels["block_sum"]
    by_name = {p.name: p for p in block_sum.params}
    assert (by_name["partial"].kind, by_name["partial"].index) == ("threadgroup", 0)
    assert by_name["partial"].address_space == "threadgroup"
    assert by_name["bias"].function_constant == "use_bias"
    assert [(p.name, p.type_text, p.attribute) for p in block_sum.params[5:]] == [
        ("gid", "uint", "thread_position_in_grid"),
        ("lid", "ushort", "thread_index_in_threadgroup"),
        ("group", "uint2", "threadgroup_position_in_grid"),
        ("tg_size", "uint", "threads_per_threadgroup"),
    ]


def test_lists_function_constants_and_host_names(lib):
    assert [(c.name, c.type_text, c.index) for c in lib.function_constants.values()] == [
        ("use_scale", "bool", 0), ("scale", "float", 1), ("use_bias", "bool", 2)]
    assert {h: i.function_text for h, i in lib.host_names.items()} == {
        "axpy_float_4": "axpy_blocked<float, 4>",
        "axpy_half_2": "axpy_blocked<half, 2>",
    }
    assert lib.names() == ["axpy_blocked", "block_sum", "axpy_float_4", "axpy_half_2"]
    text = repr(lib)
    assert "threadgroup float* partial [[threadgroup(0)]]" in text
    assert "[[buffer(3), function_constant(use_bias)]]" in text


def test_buffers_without_an_index_take_the_lowest_free_ones():
    lib = load_metal("""
        #include <metal_stdlib>
        kernel void f(device float* a [[buffer(1)]], device float* b, constant int& c,
                      threadgroup float* t, uint i [[thread_position_in_grid]]) {}
    """)
    assert [(p.name, p.kind, p.index) for p in lib.kernels["f"].params[:4]] == [
        ("a", "buffer", 1), ("b", "buffer", 0), ("c", "buffer", 2), ("t", "threadgroup", 0)]


def test_a_parameter_mtwork_cannot_bind_is_refused_when_asked_for():
    lib = load_metal("[[kernel]] void f(texture2d<float> t [[texture(0)]]) {}")
    assert lib.kernels["f"].params[0].kind == "unsupported"
    with pytest.raises(TypeError, match=r"`t`.*texture\(0\)"):
        lib.kernel("f")


# ---------------------------------------------------------------------------------------
# Dispatch


def test_explicit_instantiation_by_host_name_dispatched_by_threadgroups(lib):
    n = 37
    x = np.arange(n, dtype=np.float32) * 0.25
    y = np.arange(n, dtype=np.float32)[::-1].copy()
    expected = y + np.float32(-1.5) * x
    # Four elements per thread: 10 threads needed, 3 groups of 4 give 12 (two idle).
    out = lib.kernel("axpy_float_4")(
        buffers={"x": x, "y": y, "alpha": -1.5, "n": n},
        threadgroups=(3, 1, 1), threads_per_threadgroup=(4, 1, 1))
    assert out["y"] is y  # written in place, like a Metal buffer
    np.testing.assert_array_equal(y, expected)


def test_template_instantiated_on_request_matches_the_host_named_one(lib):
    n = 50
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n).astype(np.float16)
    y = rng.standard_normal(n).astype(np.float16)
    alpha = 0.75
    expected = (np.float32(alpha) * x.astype(np.float32)).astype(np.float16) + y
    by_host = lib.kernel("axpy_half_2")
    by_template = lib.kernel("axpy_blocked", template={"T": mx.float16, "N": 2})
    assert by_host.function == by_template.function == "axpy_blocked<half, 2>"
    for k in (by_host, by_template):
        out = k(buffers=[x, y.copy(), alpha, n], grid=(25,), threads_per_threadgroup=(8,))
        np.testing.assert_array_equal(out["y"], expected)


def test_binding_by_index_and_by_name_give_the_same_result(lib):
    n = 33
    x = mx.arange(n).astype(mx.float32)  # an mx.array input
    k = lib.kernel("axpy_blocked", template=(np.float32, 1))
    by_index = k(buffers={0: x, 1: new_buffer(n, fill=1.0), 2: 2.0, 3: n},
                 grid=n, threads_per_threadgroup=16)
    by_name = k(buffers={"x": x, "y": new_buffer(n, fill=1.0), "alpha": 2.0, "n": n},
                grid=n, threads_per_threadgroup=16)
    expected = 2 * np.arange(n, dtype=np.float32) + 1
    np.testing.assert_array_equal(by_index["y"], expected)
    np.testing.assert_array_equal(by_name["y"], expected)
    assert mx.array_equal(by_name.mx("y"), mx.array(expected))


def test_dispatch_threads_with_a_partial_edge_threadgroup(lib):
    n, size = 100, 32
    values = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    # grid=100 threads in groups of 32: the last group has 4 threads and says so through
    # [[threads_per_threadgroup]], so it sums exactly its 4 elements.
    out = lib.kernel("block_sum")(
        buffers={"in": values, "out": new_buffer(4), "n": n},
        threadgroup_memory={0: size * 4}, grid=(n,), threads_per_threadgroup=(size,))
    expected = [_sequential_sum(b) for b in _blocks(values, size)]
    np.testing.assert_array_equal(out["out"], np.array(expected, dtype=np.float32))


def test_dispatch_threadgroups_runs_whole_groups(lib):
    n, size = 100, 32
    values = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    padded = np.concatenate([values, np.zeros(4 * size - n, np.float32)])
    out = lib.kernel("block_sum")(
        buffers={"in": values, "out": new_buffer(4), "n": n},
        threadgroup_memory={"partial": size * 4}, threadgroups=4, threads_per_threadgroup=size)
    expected = [_sequential_sum(b) for b in _blocks(padded, size)]
    np.testing.assert_array_equal(out["out"], np.array(expected, dtype=np.float32))


@pytest.mark.parametrize(
    ("constants", "factor"),
    [
        ({}, 1.0),  # use_scale not defined: reads as false
        ({"use_scale": False, "scale": 4.0}, 1.0),
        ({"use_scale": True}, 2.0),  # scale not defined: is_function_constant_defined false
        ({0: True, "scale": 0.5}, 0.5),  # by index and by name
    ],
)
def test_function_constants_are_set_at_compile_time(lib, constants, factor):
    values = np.arange(64, dtype=np.float32)
    out = lib.kernel("block_sum", constants=constants)(
        buffers={"in": values, "out": new_buffer(2), "n": 64},
        threadgroup_memory={0: 128}, grid=64, threads_per_threadgroup=32)
    expected = np.array([values[:32].sum(), values[32:].sum()], np.float32) * factor
    np.testing.assert_array_equal(out["out"], expected)


def test_a_buffer_gated_by_a_function_constant_is_bound_only_when_it_is_true(lib):
    values = np.ones(64, dtype=np.float32)
    bias = np.array([10.0, 20.0], dtype=np.float32)
    k = lib.kernel("block_sum", constants={"use_bias": True})
    with pytest.raises(TypeError, match=r"buffer\(3\) `bias`"):
        k(buffers={"in": values, "out": new_buffer(2), "n": 64},
          threadgroup_memory={0: 128}, grid=64, threads_per_threadgroup=32)
    out = k(buffers={"in": values, "out": new_buffer(2), "n": 64, "bias": bias},
            threadgroup_memory={0: 128}, grid=64, threads_per_threadgroup=32)
    np.testing.assert_array_equal(out["out"], [42.0, 52.0])


def test_threadgroup_arguments_and_declared_threadgroup_variables_do_not_overlap(lib):
    # block_sum declares `threadgroup Sum total;` and zeroes it after filling `partial`;
    # were the two in the same bytes, the sums would lose partial[0].
    values = np.full(64, 3.0, dtype=np.float32)
    out = lib.kernel("block_sum")(
        buffers={"in": values, "out": new_buffer(1), "n": 64},
        threadgroup_memory={0: 256}, grid=64, threads_per_threadgroup=64)
    assert out["out"][0] == 192.0


def test_new_buffers_start_poisoned_on_sim():
    lib = load_metal("""#include <metal_stdlib>
[[kernel]] void evens(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i % 2 == 0) out[i] = float(i);
}""")
    out = lib.kernel("evens")(buffers=[new_buffer(8)], grid=8, threads_per_threadgroup=8)
    np.testing.assert_array_equal(out["out"][::2], [0, 2, 4, 6])
    assert np.isnan(out["out"][1::2]).all()


def test_struct_and_vector_arguments():
    lib = load_metal("""#include <metal_stdlib>
using namespace metal;
struct Params { uint n; float scale; };
[[kernel]] void affine(device float2* out [[buffer(0)]],
                       constant Params& p [[buffer(1)]],
                       constant float2& offset [[buffer(2)]],
                       uint i [[thread_position_in_grid]]) {
  if (i < p.n) out[i] = float2(i) * p.scale + offset;
}""")
    params = np.array((5, 0.5), dtype=[("n", "<u4"), ("scale", "<f4")])
    out = lib.kernel("affine")(buffers=[new_buffer(6), params, (1.0, -1.0)],
                               grid=6, threads_per_threadgroup=4)
    assert out["out"].shape == (6, 2)  # a new buffer of float2 gets a lane axis
    np.testing.assert_array_equal(out["out"][:5, 0], np.arange(5) * 0.5 + 1)
    np.testing.assert_array_equal(out["out"][:5, 1], np.arange(5) * 0.5 - 1)
    assert np.isnan(out["out"][5]).all()  # not written: still poison
    with pytest.raises(TypeError, match="takes 2 value"):
        lib.kernel("affine")(buffers=[new_buffer(6), params, 1.0], grid=6,
                             threads_per_threadgroup=4)
    with pytest.raises(TypeError, match="is a struct: pass its bytes"):
        lib.kernel("affine")(buffers=[new_buffer(6), 5, (1.0, -1.0)], grid=6,
                             threads_per_threadgroup=4)


def test_kernel_qualifier_form_and_source_strings():
    lib = load_metal("""#include <metal_stdlib>
using namespace metal;
kernel void triple(device uint* out, uint3 pos [[thread_position_in_grid]],
                   uint3 size [[threads_per_grid]]) {
  out[pos.y * size.x + pos.x] = 3 * (pos.y * size.x + pos.x);
}""")
    out = lib.kernel("triple")(buffers=[new_buffer((3, 5))], grid=(5, 3),
                               threads_per_threadgroup=(4, 2))
    np.testing.assert_array_equal(out["out"], 3 * np.arange(15).reshape(3, 5))


def test_mlx_arange_kernel_matches_mx_arange():
    """MLX's own `arange.h`, bound as MLX's Arange::eval_gpu binds it: start, and the step
    as (start + step) - start in the output type, at buffers 0 and 1, output at 2."""
    lib = load_metal(MLX_KERNELS / "arange.h", prelude=MLX_UTILS, backend="sim")
    for dtype, start, step, n in [(mx.float32, 0.5, 0.25, 1000), (mx.int32, 7, -3, 77),
                                  (mx.float16, -2.0, 0.5, 64), (mx.bfloat16, 1.0, 0.125, 40),
                                  (mx.uint8, 3, 2, 100)]:
        first = mx.array(start, dtype=dtype)
        step_t = (mx.array(start + step, dtype=dtype) - first).item()
        out = lib.kernel("arange", template=(dtype,))(
            buffers=[first.item(), step_t, new_buffer(n)], grid=n,
            threads_per_threadgroup=min(n, 1024))
        expected = mx.arange(start, start + n * step, step, dtype=dtype, stream=mx.cpu)
        assert out.mx("out").dtype == dtype
        assert mx.array_equal(out.mx("out"), expected).item(), dtype


def test_mlx_softmax_kernel_matches_mx_softmax():
    """MLX's `softmax_single_row` (SIMD reductions, threadgroup arrays, barriers), dispatched
    as MLX's Softmax::eval_gpu does: one threadgroup per row, enough SIMD-groups for the
    row at 4 elements a thread; its defaulted template parameters stay defaulted."""
    lib = load_metal(MLX_KERNELS / "softmax.h", prelude=MLX_UTILS, backend="sim")
    k = lib.kernel("softmax_single_row", template=(mx.float32,))
    assert k.function == "softmax_single_row<float>"
    assert k.template_values == {"T": "float", "AccT": "float", "N_READS": "SOFTMAX_N_READS"}
    rows, n = 5, 300
    x = np.random.default_rng(4).standard_normal((rows, n)).astype(np.float32) * 4
    threads = (n + 3) // 4
    simdgroups = (threads + 31) // 32
    out = k(buffers=[x, new_buffer(x.shape), n], threadgroups=rows,
            threads_per_threadgroup=32 * simdgroups)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["out"], expected, rtol=2e-6, atol=1e-9)


def test_a_path_string_must_name_a_file():
    with pytest.raises(FileNotFoundError, match="no MSL file at"):
        load_metal("no/such/kernels.metal")


# ---------------------------------------------------------------------------------------
# Errors


def test_unknown_kernel_lists_the_ones_there_are(lib):
    with pytest.raises(KeyError) as info:
        lib.kernel("axpy")
    message = str(info.value)
    assert "no kernel `axpy`" in message
    for name in ("axpy_blocked", "block_sum", "axpy_float_4", "axpy_half_2"):
        assert name in message


def _axpy_call(k, **buffers):
    return k(buffers=buffers, grid=4, threads_per_threadgroup=4)


def test_missing_and_extra_bindings_say_which(lib):
    k = lib.kernel("axpy_float_4")
    x = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match=r"no binding for buffer\(2\) `alpha`.*buffer\(3\) `n`"):
        _axpy_call(k, x=x, y=x.copy())
    with pytest.raises(TypeError, match=r"has no buffer\(7\); its buffers are: buffer\(0\) `x`"):
        k(buffers={0: x, 1: x.copy(), 2: 1.0, 3: 16, 7: x}, grid=4, threads_per_threadgroup=4)
    with pytest.raises(TypeError, match="has no buffer named `z`"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=16, z=x)
    with pytest.raises(TypeError, match="`gid` is the thread attribute"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=16, gid=0)
    with pytest.raises(TypeError, match="bound twice"):
        k(buffers={0: x, "x": x, 1: x.copy(), 2: 1.0, 3: 16}, grid=4, threads_per_threadgroup=4)


def test_scalars_are_checked_against_the_declared_type(lib):
    k = lib.kernel("axpy_float_4")
    x = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match=r"buffer\(3\) `n` .* takes an integer \(uint\), not "
                                        r"the float 2.5"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=2.5)
    with pytest.raises(ValueError, match=r"-1 is outside the range of uint \[0, 4294967295\]"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=-1)
    with pytest.raises(TypeError, match="not the bool True"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=True)
    with pytest.raises(TypeError, match="got a numpy int64 value"):
        _axpy_call(k, x=x, y=x.copy(), alpha=1.0, n=np.int64(16))
    with pytest.raises(TypeError, match="points at float data; got an array of int32"):
        _axpy_call(k, x=x.astype(np.int32), y=x.copy(), alpha=1.0, n=16)
    with pytest.raises(TypeError, match="is a pointer: pass an array"):
        _axpy_call(k, x=1.0, y=x.copy(), alpha=1.0, n=16)
    with pytest.raises(ValueError, match="writable, C-contiguous"):
        _axpy_call(k, x=x, y=np.zeros(32, np.float32)[::2], alpha=1.0, n=16)


def test_template_instantiation_failures_are_compile_errors(lib):
    with pytest.raises(CompileError, match="is a template <typename T, int N>"):
        lib.kernel("axpy_blocked")
    with pytest.raises(CompileError, match="takes 2 template arguments, got 3"):
        lib.kernel("axpy_blocked", template=(mx.float32, 1, 2))
    with pytest.raises(CompileError, match="has no template parameter 'M'"):
        lib.kernel("axpy_blocked", template={"T": mx.float32, "M": 1})
    with pytest.raises(CompileError, match="`block_sum` is not a template"):
        lib.kernel("block_sum", template=(mx.float32,))
    # Accepted here, refused by the compiler: the message quotes the author's header.
    with pytest.raises(CompileError) as info:
        lib.kernel("axpy_blocked", template=(mx.float32, 0)).compile()
    message = str(info.value)
    assert "a block holds at least one element" in message
    assert f"{DATA / 'common' / 'blocks.h'}:9:" in message
    assert "kernels.metal:15:" in message  # where Block<N> is instantiated


def test_compile_errors_point_at_the_source_string():
    lib = load_metal("#include <metal_stdlib>\n\n[[kernel]] void f(device float* o) {\n"
                     "  o[0] = undefined_name;\n}\n")
    with pytest.raises(CompileError, match=r"source:4:10: error: use of undeclared identifier"):
        lib.kernel("f").compile()


def test_threadgroup_memory_over_32_kib_is_refused(lib):
    k = lib.kernel("block_sum")
    call = dict(buffers={"in": np.zeros(32, np.float32), "out": new_buffer(1), "n": 32},
                grid=32, threads_per_threadgroup=32)
    with pytest.raises(ThreadgroupMemoryError, match="take 32784 bytes, more than the 32768"):
        k(threadgroup_memory={0: 32768 + 16}, **call)
    # 32 KiB of arguments leave no room for the kernel's own `threadgroup Sum total;`.
    with pytest.raises(ThreadgroupMemoryError):
        k(threadgroup_memory={0: 32768}, **call)
    with pytest.raises(TypeError, match=r"size in bytes of threadgroup\(0\) `partial`"):
        k(**call)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        k(threadgroup_memory={0: 100}, **call)
    with pytest.raises(TypeError, match=r"no threadgroup\(1\) argument"):
        k(threadgroup_memory={0: 128, 1: 16}, **call)


def test_function_constant_errors(lib):
    with pytest.raises(KeyError, match="no function constant 'use_gelu'.*use_scale"):
        lib.kernel("block_sum", constants={"use_gelu": True})
    with pytest.raises(KeyError, match="no function constant 9"):
        lib.kernel("block_sum", constants={9: True})
    with pytest.raises(TypeError, match="function constant `use_scale` .* takes a bool"):
        lib.kernel("block_sum", constants={"use_scale": 1})


def test_dispatch_geometry_errors(lib):
    k = lib.kernel("axpy_float_4")
    x = np.zeros(16, np.float32)
    buffers = {"x": x, "y": x.copy(), "alpha": 1.0, "n": 16}
    with pytest.raises(TypeError, match="either threadgroups= .* or grid="):
        k(buffers=buffers, threads_per_threadgroup=4)
    with pytest.raises(TypeError, match="either threadgroups="):
        k(buffers=buffers, grid=4, threadgroups=1, threads_per_threadgroup=4)
    with pytest.raises(ValueError, match="1025 threads, more than the 1024"):
        k(buffers=buffers, grid=4, threads_per_threadgroup=(1025,))


# ---------------------------------------------------------------------------------------
# The metal backend: the same kernel as an mx.fast.metal_kernel body (text only here)


def test_metal_wrapper_declares_each_parameter_then_runs_the_body(lib):
    k = lib.kernel("block_sum", constants={"use_scale": True, "scale": 0.5})
    w = wrapper(k.program, ["in", "out", "n"], {0: 256})
    assert w.input_names == ["__mtw_buffer0", "__mtw_buffer1", "__mtw_buffer2"]
    assert w.output_names == ["__mtw_unused"]
    head = w.source.split("\n\n", 1)[0]
    assert head.splitlines() == [
        "  threadgroup float4 __mtw_threadgroup_0[16];",
        "  const auto __mtw_attribute5 = thread_position_in_grid;",
        "  const auto __mtw_attribute6 = thread_index_in_threadgroup;",
        "  const auto __mtw_attribute7 = threadgroup_position_in_grid;",
        "  const auto __mtw_attribute8 = threads_per_threadgroup;",
        "  {",
        "  const device float* in = (const device float*)__mtw_buffer0;",
        "  device float* out = (device float*)__mtw_buffer1;",
        "  const device uint& n = *(const device uint*)__mtw_buffer2;",
        "  const device float* bias = nullptr;",
        "  threadgroup float* partial = (threadgroup float*)__mtw_threadgroup_0;",
        "  uint gid = uint(__mtw_attribute5.x);",
        "  ushort lid = ushort(__mtw_attribute6);",
        "  uint2 group = uint2(__mtw_attribute7.xy);",
        "  uint tg_size = uint(__mtw_attribute8.x);",
    ]
    assert w.source.endswith(k.signature.body + "\n  }")
    # The header: constants set, the subfolder's header pasted in once, no quoted includes.
    assert w.header.startswith("#define __mtw_fc_scale (float)(0.5f)\n"
                               "#define __mtw_fc_defined_scale true\n")
    assert "#define __mtw_fc_defined_use_bias false" in w.header
    assert "constexpr constant bool use_scale = __mtw_fc_use_scale;" in w.header
    assert "constant bool has_scale = __mtw_fc_defined_scale;" in w.header
    assert w.header.count("struct Sum {") == 1
    assert '#include "' not in w.header and "#pragma once" not in w.header


def test_metal_wrapper_sets_the_template_arguments_in_the_body(lib):
    w = wrapper(lib.kernel("axpy_half_2").program, ["x", "y", "alpha", "n"], {})
    lines = w.source.splitlines()
    assert lines[:2] == ["  using T = half;", "  constexpr int N = 2;"]
    assert "  const device T* x = (const device T*)__mtw_buffer0;" in lines
    assert "  device T* y = (device T*)__mtw_buffer1;" in lines


def test_metal_wrapper_declares_defaulted_template_parameters_in_the_body():
    lib = load_metal(MLX_KERNELS / "softmax.h", prelude=MLX_UTILS)
    w = wrapper(lib.kernel("softmax_single_row", template=(mx.float16,)).program,
                      ["in", "out", "axis_size"], {})
    lines = w.source.splitlines()
    assert lines[:3] == ["  using T = half;", "  using AccT = T;",
                         "  constexpr int N_READS = SOFTMAX_N_READS;"]
    assert lines[lines.index("  {") + 1 : lines.index("  {") + 4] == [
        "  const device T* in = (const device T*)__mtw_buffer0;",
        "  device T* out = (device T*)__mtw_buffer1;",
        "  const device int& axis_size = *(const device int*)__mtw_buffer2;",
    ]
    assert "utils.h" not in w.header  # already in every MLX custom kernel


@pytest.fixture
def metal_on_sim():
    return registered()


def test_metal_path_runs_through_a_stand_in_for_mx_fast_metal_kernel(lib, metal_on_sim):
    values = np.arange(100, dtype=np.float32)
    bias = np.array([1, 2, 3, 4], np.float32)
    out = lib.kernel("block_sum", constants={"use_scale": True, "scale": 0.5, "use_bias": True})(
        buffers={"in": values, "out": new_buffer(4), "n": 100, "bias": bias},
        threadgroup_memory={0: 128}, grid=100, threads_per_threadgroup=32,
        backend=metal_on_sim)
    expected = [_sequential_sum(b) * np.float32(0.5) + c
                for b, c in zip(_blocks(values, 32), bias)]
    np.testing.assert_array_equal(out["out"], np.array(expected, np.float32))
    y = np.ones(10, np.float16)
    lib.kernel("axpy_half_2")(buffers=[np.arange(10, dtype=np.float16), y, 2.0, 10],
                              threadgroups=2, threads_per_threadgroup=4,
                              backend=metal_on_sim)
    np.testing.assert_array_equal(y, 1 + 2 * np.arange(10))


def test_an_authors_copy_of_an_mlx_header_is_the_one_compiled(tmp_path):
    # load_metal resolves includes in the author's folders before MLX's headers; the build
    # must too (a library shipping another MLX version's headers compiles with those), and
    # no precompiled header of the installed ones may stand in for them.
    own = tmp_path / "mlx" / "backend" / "metal" / "kernels"
    own.mkdir(parents=True)
    (own / "utils.h").write_text("#pragma once\n#include <metal_stdlib>\n"
                                 "using namespace metal;\nconstant float OWN_COPY = 7.0f;\n")
    lib = load_metal('#include "mlx/backend/metal/kernels/utils.h"\n'
                     "[[kernel]] void k(device float* o [[buffer(0)]],\n"
                     "                  uint i [[thread_position_in_grid]]) { o[i] = OWN_COPY; }\n",
                     include_dirs=[tmp_path])
    out = lib.kernel("k")(buffers={0: new_buffer(32)}, grid=32,
                          threads_per_threadgroup=32)
    assert np.all(out["o"] == 7.0)
