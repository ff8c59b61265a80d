"""Full-source libraries are listed as Metal sees them after the preprocessor: host names
made by macros, function constants with computed indices or declared through macros,
function-pointer template parameters, `#if` branches, host names on definitions."""

import numpy as np
import pytest

import mtwork
from tests.conformance.metal_path import run_both

N = 64

LIBRARY = """\
#include <metal_stdlib>
using namespace metal;

#define FC_BASE 600
#define CONST_DECL static constant constexpr const

constant bool has_bias [[function_constant(FC_BASE + 0)]];
CONST_DECL int scale_shift [[function_constant(FC_BASE + 1)]];

float twice(float x) { return 2.0f * x; }
float thrice(float x) { return 3.0f * x; }

template <typename T, float (*op)(float)>
[[kernel]] void apply(device const T* in [[buffer(0)]], device T* out [[buffer(1)]],
                      constant float& bias [[buffer(2), function_constant(has_bias)]],
                      uint i [[thread_position_in_grid]]) {
    float v = op(float(in[i])) * float(1 << scale_shift);
    if (has_bias) v += bias;
    out[i] = T(v);
}

#define instantiate_apply(name, type, fn) \\
  template [[host_name("apply_" #name "_" #fn)]] \\
  [[kernel]] decltype(apply<type, fn>) apply<type, fn>;

instantiate_apply(float32, float, twice)
instantiate_apply(float32, float, thrice)

#if defined(WITH_EXTRA)
[[kernel]] void extra(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
#endif

[[host_name("named_fill")]]
[[kernel]] void fill(device float* out [[buffer(0)]],
                     threadgroup float* scratch [[threadgroup(0)]],
                     uint i [[thread_position_in_grid]]) {
    out[i] = 7.0f;
}
"""


@pytest.fixture(scope="module")
def lib():
    return mtwork.load_metal(LIBRARY)


def test_host_names_made_by_macros_are_listed(lib):
    assert {"apply_float32_twice", "apply_float32_thrice"} <= set(lib.host_names)
    assert lib.host_names["apply_float32_thrice"].template_args == ("float", "thrice")


def test_function_constants_with_computed_indices_and_macro_declarations(lib):
    constants = lib.function_constants
    assert (constants["has_bias"].index, constants["has_bias"].type_text) == (600, "bool")
    assert (constants["scale_shift"].index, constants["scale_shift"].type_text) == (601, "int")
    assert constants["scale_shift"].line == 8  # the author's line, not the preprocessed one


@pytest.mark.parametrize(("host", "factor"), [("apply_float32_twice", 2),
                                              ("apply_float32_thrice", 3)])
def test_a_function_pointer_template_argument_picks_the_function(lib, host, factor):
    x = np.arange(N, dtype=np.float32)
    out = run_both(lib.kernel(host, constants={600: True, "scale_shift": 2}),
                   buffers={"in": x, "out": mtwork.new_buffer(N), "bias": 0.5}, grid=N,
                   threads_per_threadgroup=32)
    np.testing.assert_array_equal(out["out"], x * factor * 4 + 0.5)
    plain = lib.kernel(host, constants={"scale_shift": 0})(
        buffers={"in": x, "out": mtwork.new_buffer(N)}, grid=N, threads_per_threadgroup=32)
    np.testing.assert_array_equal(plain["out"], x * factor)


def test_an_if_branch_that_is_off_defines_nothing():
    assert "extra" not in mtwork.load_metal(LIBRARY)
    on = mtwork.load_metal(LIBRARY, defines={"WITH_EXTRA": 1})
    out = on.kernel("extra")(buffers=[mtwork.new_buffer(N)], grid=N,
                             threads_per_threadgroup=32)
    np.testing.assert_array_equal(out["out"], np.ones(N, np.float32))


SIGNATURE_BY_BRANCH = """\
#include <metal_stdlib>
using namespace metal;
#ifdef WITH_OFFSET
[[kernel]] void put(device float* out [[buffer(0)]], constant float& offset [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) { out[i] = float(i) + offset; }
#else
[[kernel]] void put(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = float(i);
}
#endif
"""


def test_a_signature_is_taken_from_the_branch_that_is_on():
    plain = mtwork.load_metal(SIGNATURE_BY_BRANCH)
    assert [p.name for p in plain.kernels["put"].buffers] == ["out"]
    with_offset = mtwork.load_metal(SIGNATURE_BY_BRANCH, defines={"WITH_OFFSET": 1})
    assert [p.name for p in with_offset.kernels["put"].buffers] == ["out", "offset"]
    out = with_offset.kernel("put")(buffers={"out": mtwork.new_buffer(N), "offset": 0.5},
                                    grid=N, threads_per_threadgroup=32)
    np.testing.assert_array_equal(out["out"], np.arange(N, dtype=np.float32) + 0.5)


def test_a_host_name_on_a_definition_names_the_kernel_and_zero_threadgroup_bytes_are_allowed(
        lib):
    out = lib.kernel("named_fill")(buffers=[mtwork.new_buffer(N)], threadgroup_memory={0: 0},
                                   grid=N, threads_per_threadgroup=32)
    np.testing.assert_array_equal(out["out"], np.full(N, 7, np.float32))


@pytest.mark.parametrize(("defines", "error", "match"), [
    ({"not a name": 1}, ValueError, "identifiers"),
    ({"X": 1.5}, TypeError, "int, a bool or text"),
    (["X"], TypeError, "maps macro names"),
])
def test_bad_defines_are_named(defines, error, match):
    with pytest.raises(error, match=match):
        mtwork.load_metal(LIBRARY, defines=defines)
