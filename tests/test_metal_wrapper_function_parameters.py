"""The metal backend's wrapper with a template parameter of a named function type, as
llama.cpp's kernel_mul_mv_id takes its mat-vec (``typedef decltype(f<...>) fn_t;
template<fn_t disp_fn>``, where ``f`` is an overloaded template only the parameter's
type resolves): the wrapper declares it as a pointer to that function type."""

import numpy as np

from mtwork.backends.metal import wrapper
from mtwork.library import load_metal, new_buffer
from tests.conformance.metal_path import registered

SOURCE = """
#include <metal_stdlib>
using namespace metal;

typedef void (*one_t)(device float *, float);
typedef void (*two_t)(device float *, float, float);

template <int k> void one(device float * out, float x) { out[0] = k * x; }
template <int k> void two(device float * out, float x, float y) { out[0] = k * (x + y); }

template <one_t f> void call(device float * out, float x, float y) { f(out, x + y); }
template <two_t f> void call(device float * out, float x, float y) { f(out, x, y); }

typedef decltype(call<one<1>>) call_t;

template <call_t fn, short bias>
kernel void apply(device const float * in [[buffer(0)]], device float * out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
    fn(out + i, in[i], bias);
}

template [[host_name("apply_3")]] kernel decltype(apply<call<two<3>>, 1>) apply<call<two<3>>, 1>;
"""


def test_a_function_typed_template_parameter_is_declared_as_its_pointer(tmp_path):
    path = tmp_path / "apply.metal"
    path.write_text(SOURCE)
    k = load_metal(path, backend="sim").kernel("apply_3")
    w = wrapper(k.program, ["in", "out"], {})
    assert w.source.splitlines()[:2] == ["  constexpr __mtw_value_t<call_t> fn = call<two<3>>;",
                                         "  constexpr short bias = 1;"]
    x = np.arange(8, dtype=np.float32)
    direct = k(buffers=[x, new_buffer(8)], grid=8, threads_per_threadgroup=8)
    wrapped = k(buffers=[x, new_buffer(8)], grid=8, threads_per_threadgroup=8,
                backend=registered())
    np.testing.assert_array_equal(direct["out"], 3 * (x + 1))
    np.testing.assert_array_equal(wrapped["out"], direct["out"])
