"""Numerics of the emulator against numpy: half and bfloat rounding, math modes, integer
and conversion rules, bit casts, and every metal:: math, integer, relational and geometric
function on scalars and vectors.

Accuracy bounds are Metal's (MSL specification, section 8.4): table 8.1 for precise float
functions, table 8.2 for fast ones; half functions are held to 1 ulp, which is what
computing in float and rounding once gives. Oracles compute in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.compile import compiler
from mtwork.errors import KernelFault

# The float64 oracles run on infinities and NaNs on purpose.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(invalid value|overflow|divide by zero) encountered:RuntimeWarning"
)

F32_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))
F16_BELOW_ONE = float(np.nextafter(np.float16(1), np.float16(0)))


def sim_kernel(name, inputs, outputs, body, header="", mode=None):
    options = None if mode is None else {"math_mode": mode}
    return mtwork.metal_kernel(name, inputs, outputs, body, header=header,
                               compile_options=options, backend="sim")


def launch(kernel, inputs, outputs, threads: int):
    results = kernel(
        inputs=[x if isinstance(x, mx.array) else mx.array(x) for x in inputs],
        grid=(threads, 1, 1),
        threadgroup=(min(threads, 256), 1, 1),
        output_shapes=[(size,) for size, _ in outputs],
        output_dtypes=[dtype for _, dtype in outputs],
    )
    mx.eval(results)
    return results


def compiled_with(flag: str, mode: str = "safe") -> bool:
    return flag in compiler.COMMON_FLAGS or flag in compiler.MATH_MODE_FLAGS[mode]


def ulp_error(got: np.ndarray, want: np.ndarray, dtype) -> np.ndarray:
    """|got - want| in ulps of `dtype` at the true value `want` (float64); 0 where both are
    the same NaN/infinity, inf where only one is."""
    got = got.astype(np.float64)
    rounded = want.astype(dtype)
    special = ~np.isfinite(rounded)
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = np.spacing(np.abs(rounded)).astype(np.float64)
        err = np.abs(got - want) / spacing
    same_special = (np.isnan(got) & np.isnan(want)) | (got == rounded)
    err = np.where(special, np.where(same_special, 0.0, np.inf), err)
    return np.where(np.isnan(got) != np.isnan(want), np.inf, err)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even), returned as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


# --- half and bfloat arithmetic ------------------------------------------------------------


def crafted_products(fmt: str, rng: np.random.Generator, n: int):
    """a, b and c = -round(a * b) in `fmt` ("half" or "bfloat"): evaluated step by step
    a * b + c is exactly 0, fused it is the rounding error of a * b, which is not."""
    def to_fmt(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float32)  # exact: the products have at most 22 bits
        return v.astype(np.float16).astype(np.float32) if fmt == "half" else bf16_round(v)

    a, b = to_fmt(1 + rng.random(n)), to_fmt(1 + rng.random(n))
    return a, b, -to_fmt(a * b)


ROUNDING_BODY = """
  uint i = thread_position_in_grid.x;
  half ha = half(a[i]), hb = half(b[i]), hc = half(c[i]);
  h[i] = ha * hb + hc;
  bfloat16_t ba = bfloat16_t(a[i]), bb = bfloat16_t(b[i]), bc = bfloat16_t(c[i]);
  bf[i] = ba * bb + bc;
  f[i] = a[i] * b[i] + c[i];
  hf[i] = fma(ha, hb, hc);
"""


def test_half_bfloat_and_float_round_after_each_operation():
    """`a * b + c` rounds the product, then the sum (math mode "safe"): equal to numpy's
    step-by-step float16 and to step-by-step bfloat16 rounding, and unequal to the fused
    value on inputs made to tell the two apart; fma() fuses."""
    rng = np.random.default_rng(1)
    n, q = 256, 64
    half_abc = crafted_products("half", rng, q)  # elements [0, q)
    bf_abc = crafted_products("bfloat", rng, q)  # elements [q, 2q)
    noise = rng.standard_normal((3, n - 2 * q)) * 10.0 ** rng.integers(-2, 3, (3, n - 2 * q))
    a, b, c = (np.concatenate([h, f, r]).astype(np.float32)
               for h, f, r in zip(half_abc, bf_abc, noise))
    kernel = sim_kernel("rounding", ["a", "b", "c"], ["h", "bf", "f", "hf"], ROUNDING_BODY)
    h, bf, f, hf = launch(kernel, [a, b, c],
                          [(n, mx.float16), (n, mx.bfloat16), (n, mx.float32), (n, mx.float16)],
                          n)

    a16, b16, c16 = a.astype(np.float16), b.astype(np.float16), c.astype(np.float16)
    stepwise = (a16 * b16) + c16  # numpy rounds each float16 operation
    fused = (a16.astype(np.float64) * b16 + c16).astype(np.float16)
    np.testing.assert_array_equal(np.array(h), stepwise)
    assert (stepwise[:q] == 0).all() and (fused[:q] != 0).mean() > 0.9
    np.testing.assert_array_equal(np.array(hf)[:q], fused[:q])

    a_bf, b_bf, c_bf = bf16_round(a), bf16_round(b), bf16_round(c)
    stepwise_bf = bf16_round(bf16_round(a_bf * b_bf) + c_bf)
    fused_bf = bf16_round((a_bf.astype(np.float64) * b_bf + c_bf).astype(np.float32))
    np.testing.assert_array_equal(np.array(bf.astype(mx.float32)), stepwise_bf)
    assert (stepwise_bf[q : 2 * q] == 0).all() and (fused_bf[q : 2 * q] != 0).mean() > 0.9

    np.testing.assert_array_equal(np.array(f), (a * b) + c)  # numpy float32: two roundings


def test_bfloat_math_goes_through_float_and_rounds_once():
    """MLX's bf16_math.h computes bfloat math in float and rounds: the result is the
    float result rounded to bfloat (to nearest even, not truncated)."""
    rng = np.random.default_rng(4)
    n = 512
    x = bf16_round(rng.uniform(0.1, 8, n).astype(np.float32))
    y = bf16_round(rng.uniform(-3, 3, n).astype(np.float32))
    body = """
  uint i = thread_position_in_grid.x;
  bfloat16_t v = x[i], w = y[i];
  e[i] = metal::exp(w);
  l[i] = metal::precise::log(v);
  s[i] = metal::fast::sqrt(v);
  t[i] = metal::tanh(w);
  m[i] = metal::fma(v, w, v);
"""
    kernel = sim_kernel("bf16_math", ["x", "y"], list("elstm"), body)
    xb = mx.array(x).astype(mx.bfloat16)
    yb = mx.array(y).astype(mx.bfloat16)
    outs = launch(kernel, [xb, yb], [(n, mx.bfloat16)] * 5, n)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    wants = [np.exp(y64), np.log(x64), np.sqrt(x64), np.tanh(y64), x64 * y64 + x64]
    for name, out, want in zip("elstm", outs, wants):
        got = np.array(out.astype(mx.float32))
        rounded = bf16_round(want.astype(np.float32))
        exact = got == rounded
        assert exact.mean() > 0.99, name  # float's own error may flip a tie now and then
        assert (ulp_error(got, want, np.float32) <= 65536 + 1).all(), name  # <= 1 bf16 ulp


# --- math modes ----------------------------------------------------------------------------

MODES_BODY = """
  uint i = thread_position_in_grid.x;
#if defined(__FAST_MATH__) && __FAST_MATH__
  flag[i] = 1;
#else
  flag[i] = 0;
#endif
  mul_add[i] = a[i] * b[i] + c[i];
  specials[i] = metal::exp(x[i]) + float(isnan(x[i] - x[i]));
"""


@pytest.mark.parametrize("mode", ["safe", "relaxed", "fast"])
def test_math_modes(mode):
    """MLX 0.32's compile_options math_mode: __FAST_MATH__ only for "fast"; "safe" and
    "relaxed" keep infinities and NaNs (exp(-inf) = 0, inf - inf is NaN); "safe" rounds
    a * b + c twice, "fast" may fuse it."""
    rng = np.random.default_rng(8)
    n = 64
    a = (1 + rng.random(n)).astype(np.float32)
    b = (1 + rng.random(n)).astype(np.float32)
    c = -(a * b)  # a * b + c is 0 twice rounded, the product's rounding error fused
    x = np.array([-np.inf, 0.0, -0.0, np.inf] * (n // 4), dtype=np.float32)
    kernel = sim_kernel(f"mode_{mode}", ["a", "b", "c", "x"], ["flag", "mul_add", "specials"],
                        MODES_BODY, mode=mode)
    flag, mul_add, specials = (np.array(o) for o in launch(
        kernel, [a, b, c, x], [(n, mx.int32), (n, mx.float32), (n, mx.float32)], n))
    assert (flag == (1 if mode == "fast" else 0)).all()
    with np.errstate(invalid="ignore"):
        want_specials = np.exp(x) + np.isnan(x - x)
    fused = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (fused != 0).mean() > 0.9
    if mode == "safe":
        np.testing.assert_array_equal(mul_add, np.zeros(n, np.float32))
        np.testing.assert_array_equal(specials, want_specials)
    elif mode == "relaxed":
        np.testing.assert_array_equal(specials, want_specials)
    else:  # fused where the host has fused multiply-add, else rounded twice
        assert ((mul_add == fused) | (mul_add == 0)).all()


# --- integers, conversions, shifts, bit casts ----------------------------------------------

RULES_BODY = """
  uint i = thread_position_in_grid.x;
  int v = xi[i];
  uint u = as_type<uint>(v);
  wrap[0 * N + i] = v + 2147483647;                    // int overflow wraps
  wrap[1 * N + i] = v * 65537;
  wrap[2 * N + i] = int(u * 3000000000u);
  wrap[3 * N + i] = short(v * 4099);                   // narrowing keeps the low bits
  wrap[4 * N + i] = char(v);
  wrap[5 * N + i] = uchar(v) << 9;                     // promoted to int before the shift
  int4 s = int4(v) << int4(33, 1, 40, 31);             // vector counts: modulo the width
  uchar4 us = uchar4(uchar(v)) >> uchar4(9, 1, 15, 0);
  wrap[6 * N + i] = s.x; wrap[7 * N + i] = s.z; wrap[8 * N + i] = us.x; wrap[9 * N + i] = us.z;
  // conversions: float to integer rounds toward zero; integers to float to nearest even
  float f = xf[i];
  conv[0 * N + i] = float(int(f));
  conv[1 * N + i] = float(uint(fabs(f)));
  conv[2 * N + i] = float(short(fmod(f, 30000.0f)));
  conv[3 * N + i] = float(v);                          // rounds to nearest even
  conv[4 * N + i] = float(half(f));
  conv[5 * N + i] = float(bfloat16_t(f));
  conv[6 * N + i] = float(half(v));
  // bit casts
  bits[0 * N + i] = as_type<uint>(f);
  bits[1 * N + i] = as_type<uint>(half2(half(f), half(-f)));
  bits[2 * N + i] = as_type<uint2>(as_type<ulong>(float2(f, -f))).y;
  bits[3 * N + i] = as_type<uint>(as_type<float>(u));
  bits[4 * N + i] = as_type<uint>(as_type<uchar4>(u).zyxw);
  bits[5 * N + i] = as_type<uint>(bfloat2(bfloat16_t(f), bfloat16_t(1.0f)));
  bits[6 * N + i] = as_type<uint4>(as_type<float3>(float4(f, 1, 2, 3))).x;
"""


def rules_inputs(n: int):
    rng = np.random.default_rng(12)
    xi = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    xi[:6] = [0, 1, -1, 2**31 - 1, -(2**31), 2**24 + 1]
    xi[6:10] = [16777217, 16777219, 33554435, -16777219]  # ties at float's precision
    xf = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 9, n)).astype(np.float32)
    xf[:8] = [0.5, -0.5, 1.5, -2.75, 65519.0, 65520.0, 1e-8, 2.0**-25]
    return xi, xf


def low32(x: np.ndarray) -> np.ndarray:
    """The low 32 bits of integers, as int32 (two's complement)."""
    return (np.asarray(x).astype(np.uint64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def test_integer_wrap_shifts_conversions_and_bit_casts():
    n = 256
    xi, xf = rules_inputs(n)
    header = f"constant uint N = {n};\n"
    kernel = sim_kernel("rules", ["xi", "xf"], ["wrap", "conv", "bits"], RULES_BODY, header)
    wrap, conv, bits = (np.array(o) for o in launch(
        kernel, [xi, xf], [(10 * n, mx.int32), (7 * n, mx.float32), (7 * n, mx.uint32)], n))
    wrap, conv, bits = wrap.reshape(10, n), conv.reshape(7, n), bits.reshape(7, n)

    v = xi.astype(np.int64)
    u = v & 0xFFFFFFFF
    np.testing.assert_array_equal(wrap[0], low32(v + 2147483647))
    np.testing.assert_array_equal(wrap[1], low32(v * 65537))
    np.testing.assert_array_equal(wrap[2], low32(u.astype(np.uint64) * np.uint64(3000000000)))
    np.testing.assert_array_equal(wrap[3], (v * 4099).astype(np.int16))
    np.testing.assert_array_equal(wrap[4], v.astype(np.int8))
    np.testing.assert_array_equal(wrap[5], (v & 0xFF) << 9)
    np.testing.assert_array_equal(wrap[6], low32(v << 1))
    np.testing.assert_array_equal(wrap[7], low32(v << 8))
    np.testing.assert_array_equal(wrap[8], (v & 0xFF) >> 1)
    np.testing.assert_array_equal(wrap[9], (v & 0xFF) >> 7)

    f64 = xf.astype(np.float64)
    in_int = np.abs(f64) < 2**31
    np.testing.assert_array_equal(conv[0][in_int], np.trunc(f64[in_int]))
    in_uint = np.abs(f64) < 2**32
    np.testing.assert_array_equal(conv[1][in_uint], np.trunc(np.abs(f64[in_uint])))
    np.testing.assert_array_equal(conv[2], np.trunc(np.fmod(xf, np.float32(30000))))
    np.testing.assert_array_equal(conv[3], xi.astype(np.float32))
    with np.errstate(over="ignore"):  # beyond 65504 is half's infinity
        xf16, xi16 = xf.astype(np.float16), xi.astype(np.float16)
    np.testing.assert_array_equal(conv[4], xf16.astype(np.float32))
    np.testing.assert_array_equal(conv[5], bf16_round(xf))
    np.testing.assert_array_equal(conv[6], xi16.astype(np.float32))

    np.testing.assert_array_equal(bits[0], xf.view(np.uint32))
    halves = np.stack([xf16, -xf16], 1)
    np.testing.assert_array_equal(bits[1], halves.view(np.uint32).ravel())
    np.testing.assert_array_equal(bits[2], (-xf).view(np.uint32))
    np.testing.assert_array_equal(bits[3], u.astype(np.uint32))
    b = u.astype(np.uint32).view(np.uint8).reshape(n, 4)
    np.testing.assert_array_equal(bits[4], b[:, [2, 1, 0, 3]].copy().view(np.uint32).ravel())
    bf_bits = bf16_round(xf).view(np.uint32) >> 16
    np.testing.assert_array_equal(bits[5], bf_bits | (0x3F80 << 16))
    np.testing.assert_array_equal(bits[6], xf.view(np.uint32))


CONVERSION_EDGES = """
  uint i = thread_position_in_grid.x;
  float f = xf[i];
  out[0 * N + i] = int(f);
  out[1 * N + i] = int(uint(f));
  out[2 * N + i] = short(f);
  out[3 * N + i] = int4(float4(f)).x;
"""


def test_float_to_integer_saturates_and_nan_becomes_zero():
    """Out-of-range values and NaN are undefined in MSL; the emulator follows GPU
    conversion instructions: saturate to the type's range, NaN to 0 (scalars and vectors)."""
    xf = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 5e4, -5e4, 2.5e9], dtype=np.float32)
    n = xf.size
    kernel = sim_kernel("float_to_int", ["xf"], ["out"], CONVERSION_EDGES,
                        f"constant uint N = {n};\n")
    (out,) = launch(kernel, [xf], [(4 * n, mx.int32)], n)
    out = np.array(out).reshape(4, n)
    i32, u32 = (-(2**31), 2**31 - 1), (0, 2**32 - 1)
    want_int = [0, i32[1], i32[0], i32[1], i32[0], 50000, -50000, i32[1]]
    want_uint = [0, u32[1], 0, 3000000000, 0, 50000, 0, 2500000000]
    want_short = [0, 32767, -32768, 32767, -32768, 32767, -32768, 32767]
    np.testing.assert_array_equal(out[0], want_int)
    np.testing.assert_array_equal(out[1], np.array(want_uint, np.uint32).view(np.int32))
    np.testing.assert_array_equal(out[2], want_short)
    np.testing.assert_array_equal(out[3], want_int)


@pytest.mark.parametrize(("a", "b"), [(7, 0), (-(2**31), -1)], ids=["by_zero", "int_min_by_-1"])
def test_integer_division_trap_is_a_kernel_fault(a, b):
    """Undefined in MSL; the emulator stops with a KernelFault instead of inventing a
    value."""
    x = np.array([a, 1, a], dtype=np.int32)
    y = np.array([1, 1, b], dtype=np.int32)
    body = "  uint i = thread_position_in_grid.x;\n  out[i] = x[i] / y[i] + x[i] % y[i];\n"
    kernel = sim_kernel("int_divide", ["x", "y"], ["out"], body)
    with pytest.raises(KernelFault, match="arithmetic trap"):
        launch(kernel, [x, y], [(3, mx.int32)], 3)


# --- every math function, scalar and vector, float and half --------------------------------


@dataclass(frozen=True)
class MathFn:
    name: str  # MSL function, with its namespace
    args: tuple[str, ...]  # input domain of each argument
    oracle: Callable[..., np.ndarray]  # float64 in, float64 out
    ulps: float  # float bound (0.5: correctly rounded)
    call: str = ""  # MSL call if not name(args...)

    def msl(self, values: list[str]) -> str:
        return self.call.format(*values) if self.call else f"{self.name}({', '.join(values)})"


def pi_trig(fn: str) -> Callable[[np.ndarray], np.ndarray]:
    """sin/cos/tan(pi x) from x = n + r, |r| <= 1/2, with exact zeros and infinities."""

    def oracle(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            n = np.round(x)
            r = x - n
            sign = np.where(np.mod(n, 2) == 0, 1.0, -1.0)
            s, c = np.sin(np.pi * r), np.cos(np.pi * r)
            if fn == "sin":
                out = np.where(r == 0, np.copysign(0.0, x), sign * s)
            elif fn == "cos":
                out = np.where(np.abs(r) == 0.5, 0.0, sign * c)
            else:
                out = np.where(r == 0, np.copysign(0.0, sign * x), s / c)
                out = np.where(np.abs(r) == 0.5, np.where(sign * r > 0, np.inf, -np.inf), out)
        return np.where(np.isfinite(x), out, np.nan)

    return oracle


def metal_round(x):
    return np.where(np.isfinite(x), np.sign(x) * np.floor(np.abs(x) + 0.5), x)


def metal_fract(below_one: float):
    def oracle(x):
        with np.errstate(invalid="ignore"):
            r = np.minimum(x - np.floor(x), below_one)
        return np.where(np.isinf(x), np.copysign(0.0, x), r)

    return oracle


def metal_sign(x):
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, np.where(np.isnan(x), 0.0, x)))


def fdim(x, y):
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x - y, 0.0))


def smoothstep(e0, e1, x):
    t = np.clip((x - e0) / (e1 - e0), 0, 1)
    return t * t * (3 - 2 * t)


def median3(x, y, z):
    return np.fmax(np.fmin(x, y), np.fmin(np.fmax(x, y), z))


def powr(x, y):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.where(x < 0, np.nan, np.power(x, y))


def power(x, y):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(x, y)


def quiet(fn):
    def oracle(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    return oracle


CR = 0.5  # correctly rounded
MATH = [
    MathFn("acos", ("unit",), quiet(np.arccos), 4),
    MathFn("acosh", ("ge1",), quiet(np.arccosh), 4),
    MathFn("asin", ("unit",), quiet(np.arcsin), 4),
    MathFn("asinh", ("any",), np.arcsinh, 4),
    MathFn("atan", ("any",), np.arctan, 5),
    MathFn("atanh", ("unit",), quiet(np.arctanh), 5),
    MathFn("cbrt", ("any",), np.cbrt, 4),
    MathFn("ceil", ("any",), np.ceil, CR),
    MathFn("cos", ("trig",), np.cos, 4),
    MathFn("cosh", ("small",), quiet(np.cosh), 4),
    MathFn("cospi", ("trig",), pi_trig("cos"), 4),
    MathFn("exp", ("small",), quiet(np.exp), 4),
    MathFn("exp2", ("small",), quiet(np.exp2), 4),
    MathFn("exp10", ("small",), quiet(lambda x: 10.0**x), 4),
    MathFn("fabs", ("any",), np.abs, CR),
    MathFn("abs", ("any",), np.abs, CR),
    MathFn("floor", ("any",), np.floor, CR),
    MathFn("fract", ("any",), None, CR),  # its bound below one depends on the format
    MathFn("log", ("pos",), quiet(np.log), 4),
    MathFn("log10", ("pos",), quiet(np.log10), 4),
    MathFn("log2", ("pos",), quiet(np.log2), 4),
    MathFn("rint", ("any",), np.rint, CR),
    MathFn("round", ("any",), metal_round, CR),
    MathFn("rsqrt", ("pos",), quiet(lambda x: 1 / np.sqrt(x)), CR),
    MathFn("sin", ("trig",), np.sin, 4),
    MathFn("sinh", ("small",), quiet(np.sinh), 4),
    MathFn("sinpi", ("trig",), pi_trig("sin"), 4),
    MathFn("sqrt", ("pos",), quiet(np.sqrt), CR),
    MathFn("tan", ("trig",), np.tan, 6),
    MathFn("tanh", ("any",), np.tanh, 5),
    MathFn("tanpi", ("trig",), pi_trig("tan"), 6),
    MathFn("trunc", ("any",), np.trunc, CR),
    MathFn("saturate", ("any",), lambda x: np.where(np.isnan(x), 0.0, np.clip(x, 0, 1)), CR),
    MathFn("sign", ("any",), metal_sign, CR),
    MathFn("atan2", ("any", "any2"), quiet(np.arctan2), 6),
    MathFn("copysign", ("any", "any2"), np.copysign, CR),
    MathFn("divide", ("any", "any2"), quiet(np.divide), CR),
    MathFn("fdim", ("any", "any2"), fdim, CR),
    MathFn("fmax", ("any", "any2"), np.fmax, CR),
    MathFn("max", ("any", "any2"), np.fmax, CR),
    MathFn("fmin", ("any", "any2"), np.fmin, CR),
    MathFn("min", ("any", "any2"), np.fmin, CR),
    MathFn("fmod", ("any", "any2"), quiet(np.fmod), CR),
    MathFn("pow", ("pos", "small"), power, 16),
    MathFn("powr", ("any", "small"), powr, 16),
    MathFn("step", ("any", "any2"), lambda e, x: np.where(x < e, 0.0, 1.0), CR),
    MathFn("fma", ("any", "any2", "any3"), lambda a, b, c: a * b + c, CR),
    MathFn("fmax3", ("any", "any2", "any3"), lambda a, b, c: np.fmax(np.fmax(a, b), c), CR),
    MathFn("fmin3", ("any", "any2", "any3"), lambda a, b, c: np.fmin(np.fmin(a, b), c), CR),
    MathFn("fmedian3", ("any", "any2", "any3"), median3, CR),
    MathFn("max3", ("any", "any2", "any3"), lambda a, b, c: np.fmax(np.fmax(a, b), c), CR),
    MathFn("min3", ("any", "any2", "any3"), lambda a, b, c: np.fmin(np.fmin(a, b), c), CR),
    MathFn("median3", ("any", "any2", "any3"), median3, CR),
    MathFn("clamp", ("any", "unit", "unit2"),
           lambda x, a, b: np.fmin(np.fmax(x, np.fmin(a, b)), np.fmax(a, b)), CR,
           call="clamp({0}, min({1}, {2}), max({1}, {2}))"),
    MathFn("mix", ("any", "any2", "unit"), lambda x, y, a: x + (y - x) * a, 4),
    MathFn("smoothstep", ("unit", "unit2", "any"),
           lambda a, b, x: smoothstep(np.fmin(a, b), np.fmax(a, b), x), 8,
           call="smoothstep(min({0}, {1}), max({0}, {1}), {2})"),
    MathFn("nextafter", ("any", "any2"), None, 0),  # checked in its own format below
    # metal::precise:: spelled out (the plain names above are precise in math mode "safe")
    MathFn("precise::exp", ("small",), quiet(np.exp), 4),
    MathFn("precise::log", ("pos",), quiet(np.log), 4),
    MathFn("precise::sin", ("trig",), np.sin, 4),
    MathFn("precise::cos", ("trig",), np.cos, 4),
    MathFn("precise::tanh", ("any",), np.tanh, 5),
    MathFn("precise::pow", ("pos", "small"), power, 16),
    MathFn("precise::sqrt", ("pos",), quiet(np.sqrt), CR),
    MathFn("precise::rsqrt", ("pos",), quiet(lambda x: 1 / np.sqrt(x)), CR),
]
# Functions whose error is measured against their inputs' scale (cancellation).
SCALED = {"mix", "smoothstep"}
FAST = [  # metal::fast:: with table 8.2's bounds, checked separately
    ("exp", "small"), ("exp2", "small"), ("log", "pos"), ("log2", "pos"), ("sin", "fast_trig"),
    ("cos", "fast_trig"), ("rsqrt", "pos"), ("sqrt", "pos"), ("divide", "any"),
]


def domains(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Inputs per domain: special values first, then random ones."""
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, 2.0, -3.0,
                1e-40, 65504.0, 1e-5, 100.5]
    mixed = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5, n)
    trig = np.concatenate([np.arange(-4, 4.5, 0.5), rng.uniform(-100, 100, n)])
    out = {
        "any": np.concatenate([specials, mixed]),
        "any2": np.concatenate([specials[::-1], rng.standard_normal(n) * 10.0 ** rng.integers(
            -4, 5, n)]),
        "any3": np.concatenate([specials[3:] + specials[:3], rng.standard_normal(n) * 100]),
        "unit": np.concatenate([[0.0, -0.0, 1.0, -1.0, 0.5, -0.5], rng.uniform(-1, 1, n)]),
        "unit2": np.concatenate([[1.0, 0.0, -1.0], rng.uniform(-1, 1, n)]),
        "ge1": np.concatenate([[1.0, np.inf], 1 + 10.0 ** rng.uniform(-4, 3, n)]),
        "pos": np.concatenate([[0.0, 1.0, np.inf, 1e-40, 4.0], 10.0 ** rng.uniform(-5, 5, n)]),
        "small": np.concatenate([[0.0, -0.0, 1.0, -np.inf, np.inf, 10.0], rng.uniform(-12, 12, n)]),
        "trig": trig,
        "fast_trig": rng.uniform(-np.pi, np.pi, n),
    }
    return {k: v[:n].astype(np.float32) for k, v in out.items()}


def math_kernel_source(n: int) -> str:
    """Thread t evaluates each function on elements 4t..4t+3: as four float and four half
    scalars and as one float4 and one half4."""
    lines = ["  uint t = thread_position_in_grid.x;"]
    fns = [(fn.msl, fn.args) for fn in MATH] + [
        (lambda v, f=f: f"fast::{f}({', '.join(v)})", (d, "any2") if f == "divide" else (d,))
        for f, d in FAST
    ]
    for k, (msl, args) in enumerate(fns):
        scalar = [f"in_{a}[e]" for a in args]
        vec4 = [f"float4(in_{a}[4 * t], in_{a}[4 * t + 1], in_{a}[4 * t + 2], in_{a}[4 * t + 3])"
                for a in args]
        lines += [
            "  for (uint c = 0; c < 4; ++c) { uint e = 4 * t + c;",
            f"    sf[{k} * {n} + e] = {msl(scalar)};",
            f"    sh[{k} * {n} + e] = {msl([f'half({s})' for s in scalar])}; }}",
            f"  {{ float4 r = {msl(vec4)}; half4 q = {msl([f'half4({v})' for v in vec4])};",
            f"    for (uint c = 0; c < 4; ++c) {{ vf[{k} * {n} + 4 * t + c] = r[c];"
            f" vh[{k} * {n} + 4 * t + c] = q[c]; }} }}",
        ]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def math_run():
    n = 256
    data = domains(np.random.default_rng(21), n)
    names = sorted({a for fn in MATH for a in fn.args} | {d for _, d in FAST} | {"any2"})
    kernel = sim_kernel("math_functions", [f"in_{a}" for a in names],
                        ["sf", "vf", "sh", "vh"], math_kernel_source(n))
    k = len(MATH) + len(FAST)
    outs = launch(kernel, [data[a] for a in names],
                  [(k * n, mx.float32), (k * n, mx.float32), (k * n, mx.float16),
                   (k * n, mx.float16)], n // 4)
    sf, vf, sh, vh = (np.array(o).reshape(k, n) for o in outs)
    return data, sf, vf, sh, vh


def scale_spacing(args: list[np.ndarray], want: np.ndarray, dtype) -> np.ndarray:
    scale = np.max(np.abs(np.stack([*args, want])), axis=0).astype(dtype)
    return np.spacing(scale).astype(np.float64)


@pytest.mark.parametrize("fn", MATH, ids=lambda fn: fn.name)
def test_math_function_float_and_half_scalar_and_vector(fn: MathFn, math_run):
    data, sf, vf, sh, vh = math_run
    k = MATH.index(fn)
    for dtype, scalar, vector, bound in ((np.float32, sf, vf, fn.ulps),
                                         (np.float16, sh, vh, min(fn.ulps, 1.0))):
        args = [data[a].astype(dtype).astype(np.float64) for a in fn.args]
        if fn.name == "nextafter":
            want = np.nextafter(args[0].astype(dtype), args[1].astype(dtype))
            np.testing.assert_array_equal(scalar[k].astype(dtype), want)
        else:
            if fn.name == "fract":
                oracle = metal_fract(F32_BELOW_ONE if dtype is np.float32 else F16_BELOW_ONE)
            else:
                oracle = fn.oracle
            want = oracle(*args)
            if fn.name in SCALED:
                finite = np.isfinite(np.stack([*args, want])).all(axis=0)
                scale = scale_spacing([a[finite] for a in args], want[finite], dtype)
                worst = np.max(np.abs(scalar[k][finite] - want[finite]) / scale)
            else:
                worst = np.max(ulp_error(scalar[k], want, dtype))
            assert worst <= bound + 1e-6, f"{fn.name} {dtype.__name__}: {worst} ulp"
        # The vector form is the scalar form per component, to the bit.
        same = (scalar[k].view(np.uint32 if dtype is np.float32 else np.uint16)
                == vector[k].view(np.uint32 if dtype is np.float32 else np.uint16))
        assert same.all(), f"{fn.name} {dtype.__name__} vector differs at {np.flatnonzero(~same)}"


def test_fract_stays_below_one_and_pi_functions_are_exact_at_half_integers(math_run):
    """fract of a tiny negative number is the largest value below 1 of its format, not
    1; cospi and sinpi are exactly 0 where the true value is, with OpenCL's signs."""
    data, sf, _, sh, _ = math_run
    names = [fn.name for fn in MATH]
    x = data["any"]
    for out, dtype in ((sf, np.float32), (sh, np.float16)):
        finite = np.isfinite(x.astype(dtype))
        got = out[names.index("fract")][finite]
        assert ((got >= 0) & (got < 1)).all()
    t = data["trig"].astype(np.float64)
    is_half_int = (2 * t == np.round(2 * t)) & (t != np.round(t))
    is_int = t == np.round(t)
    assert is_half_int.sum() >= 8 and is_int.sum() >= 8
    cospi, sinpi = sf[names.index("cospi")], sf[names.index("sinpi")]
    assert (cospi[is_half_int] == 0).all() and not np.signbit(cospi[is_half_int]).any()
    assert (sinpi[is_int] == 0).all()
    assert (np.signbit(sinpi[is_int]) == np.signbit(t[is_int])).all()  # sinpi(-n) is -0


def fast_bound(name: str, x: np.ndarray, want: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Whether each result is within MSL table 8.2's bound for metal::fast::name."""
    ulps = ulp_error(got, want, np.float32)
    if name in ("exp", "exp2"):
        return ulps <= 3 + np.floor(np.abs(2 * x))
    if name in ("log", "log2"):
        near_one = (x >= 0.5) & (x <= 2)
        return np.where(near_one, np.abs(got - want) <= 2.0**-21, ulps <= 3)
    if name in ("sin", "cos"):
        return np.abs(got - want) <= 2.0**-13
    if name == "rsqrt":
        return ulps <= 2
    if name == "sqrt":
        return ulps <= 3  # x * rsqrt(x)
    return ulps <= 2.5  # divide


@pytest.mark.parametrize("name,domain", FAST, ids=[f for f, _ in FAST])
def test_fast_math_functions_within_fast_bounds(name, domain, math_run):
    data, sf, *_ = math_run
    k = len(MATH) + [f for f, _ in FAST].index(name)
    x = data[domain].astype(np.float64)
    oracles = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sin": np.sin,
               "cos": np.cos, "rsqrt": lambda v: 1 / np.sqrt(v), "sqrt": np.sqrt}
    with np.errstate(all="ignore"):
        want = (oracles[name](x) if name != "divide"
                else x / data["any2"].astype(np.float64))
    ok = fast_bound(name, x, want, sf[k]) | (np.isnan(want) & np.isnan(sf[k]))
    if name == "divide":  # table 8.2: for divisors in [2^-126, 2^126]
        y = np.abs(data["any2"].astype(np.float64))
        ok |= (y < 2.0**-126) | (y > 2.0**126) | ~np.isfinite(want)
    assert ok.all(), f"fast::{name} out of bounds at {np.flatnonzero(~ok)}"


# --- functions with an integer part ---------------------------------------------------------

SPLIT_BODY = """
  uint t = thread_position_in_grid.x;
  float4 x = float4(xs[4 * t], xs[4 * t + 1], xs[4 * t + 2], xs[4 * t + 3]);
  int4 k = int4(ks[4 * t], ks[4 * t + 1], ks[4 * t + 2], ks[4 * t + 3]);
  int4 e; float4 whole, cosine;
  float4 m = frexp(x, e);
  float4 fr = modf(x, whole);
  float4 s = sincos(x, cosine);
  float4 l = ldexp(x, k);
  int4 lg = ilogb(x);
  half4 hx = half4(x); int4 he; half4 hwhole;
  half4 hm = frexp(hx, he);
  half4 hfr = modf(hx, hwhole);
  for (uint c = 0; c < 4; ++c) {
    uint i = 4 * t + c;
    float sm = frexp(x[c], e[c]);
    float swhole, scos;
    float sfr = modf(x[c], swhole);
    float ssin = sincos(x[c], scos);
    out[0 * N + i] = m[c]; out[1 * N + i] = float(e[c]); out[2 * N + i] = fr[c];
    out[3 * N + i] = whole[c]; out[4 * N + i] = s[c]; out[5 * N + i] = cosine[c];
    out[6 * N + i] = l[c]; out[7 * N + i] = float(lg[c]); out[8 * N + i] = sm;
    out[9 * N + i] = float(hm[c]); out[10 * N + i] = float(he[c]);
    out[11 * N + i] = float(hfr[c]); out[12 * N + i] = float(hwhole[c]);
    out[13 * N + i] = ldexp(x[c], k[c]);
    out[14 * N + i] = float(ilogb(half(x[c])));
    out[15 * N + i] = sfr; out[16 * N + i] = swhole; out[17 * N + i] = ssin;
    out[18 * N + i] = scos;
  }
"""


def test_frexp_modf_sincos_ldexp_ilogb():
    rng = np.random.default_rng(6)
    n = 128
    xs = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    xs[:4] = [1.0, -2.5, 1024.75, 3e-3]
    ks = rng.integers(-20, 20, n).astype(np.int32)
    kernel = sim_kernel("split", ["xs", "ks"], ["out"], SPLIT_BODY, f"constant uint N = {n};\n")
    (out,) = launch(kernel, [xs, ks], [(19 * n, mx.float32)], n // 4)
    out = np.array(out).reshape(19, n)
    m, e = np.frexp(xs)
    np.testing.assert_array_equal(out[0], m)
    np.testing.assert_array_equal(out[1], e)
    frac, whole = np.modf(xs)
    np.testing.assert_array_equal(out[2], frac)
    np.testing.assert_array_equal(out[3], whole)
    x64 = xs.astype(np.float64)
    assert ulp_error(out[4], np.sin(x64), np.float32).max() <= 4
    assert ulp_error(out[5], np.cos(x64), np.float32).max() <= 4
    np.testing.assert_array_equal(out[6], np.ldexp(xs, ks))
    np.testing.assert_array_equal(out[7], np.floor(np.log2(np.abs(x64))))
    np.testing.assert_array_equal(out[8], m)
    h = xs.astype(np.float16)
    hm, he = np.frexp(h)
    np.testing.assert_array_equal(out[9], hm)
    np.testing.assert_array_equal(out[10], he)
    hfrac, hwhole = np.modf(h)
    np.testing.assert_array_equal(out[11], hfrac)
    np.testing.assert_array_equal(out[12], hwhole)
    np.testing.assert_array_equal(out[13], np.ldexp(xs, ks))
    finite = h != 0
    np.testing.assert_array_equal(out[14][finite],
                                  np.floor(np.log2(np.abs(h[finite].astype(np.float64)))))
    np.testing.assert_array_equal(out[15:19], out[[2, 3, 4, 5]])  # scalar forms


# --- integer functions, every integer type, scalar and vector ------------------------------


@dataclass(frozen=True)
class IntType:
    name: str
    bits: int
    signed: bool
    lanes: int = 1

    @property
    def element(self) -> str:
        return self.name.rstrip("234")

    def wrap(self, v: int) -> int:
        v &= (1 << self.bits) - 1
        return v - (1 << self.bits) if self.signed and v >> (self.bits - 1) else v

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - (1 if self.signed else 0))) - 1


INT_TYPES = [
    IntType("char", 8, True), IntType("uchar", 8, False), IntType("short", 16, True),
    IntType("ushort", 16, False), IntType("int", 32, True), IntType("uint", 32, False),
    IntType("long", 64, True), IntType("ulong", 64, False), IntType("int4", 32, True, 4),
    IntType("ushort2", 16, False, 2), IntType("uchar3", 8, False, 3),
    IntType("long2", 64, True, 2),
]


def rotate_left(t: IntType, v: int, i: int) -> int:
    s = (i % (1 << 64)) % t.bits
    u = v % (1 << t.bits)
    return t.wrap((u << s) | (u >> (t.bits - s)) if s else u)


def extract(t: IntType, x: int, offset: int, bits: int) -> int:
    field = ((x % (1 << t.bits)) >> offset) & ((1 << bits) - 1)
    if t.signed and field >> (bits - 1):
        field -= 1 << bits
    return t.wrap(field)


def insert(t: IntType, base: int, ins: int, offset: int, bits: int) -> int:
    mask = ((1 << bits) - 1) << offset
    return t.wrap((base % (1 << t.bits)) & ~mask | ((ins << offset) & mask))


def saturate(t: IntType, v: int) -> int:
    return min(max(v, t.lo), t.hi)


# name: (MSL call, oracle(type, a, b, c) on Python ints of the type's range)
INT_FUNCTIONS: dict[str, tuple[str, Callable]] = {
    "abs": ("abs({a})", lambda t, a, b, c: t.wrap(abs(a))),
    "absdiff": ("absdiff({a}, {b})", lambda t, a, b, c: t.wrap(abs(a - b))),
    "addsat": ("addsat({a}, {b})", lambda t, a, b, c: saturate(t, a + b)),
    "subsat": ("subsat({a}, {b})", lambda t, a, b, c: saturate(t, a - b)),
    "madsat": ("madsat({a}, {b}, {c})", lambda t, a, b, c: saturate(t, a * b + c)),
    "clamp": ("clamp({a}, min({b}, {c}), max({b}, {c}))",
              lambda t, a, b, c: min(max(a, min(b, c)), max(b, c))),
    "clz": ("clz({a})",
            lambda t, a, b, c: t.bits - (a % (1 << t.bits)).bit_length()),
    "ctz": ("ctz({a})", lambda t, a, b, c: (
        ((a % (1 << t.bits)) & -(a % (1 << t.bits))).bit_length() - 1 if a else t.bits)),
    "popcount": ("popcount({a})", lambda t, a, b, c: bin(a % (1 << t.bits)).count("1")),
    "hadd": ("hadd({a}, {b})", lambda t, a, b, c: (a + b) >> 1),
    "rhadd": ("rhadd({a}, {b})", lambda t, a, b, c: (a + b + 1) >> 1),
    "mulhi": ("mulhi({a}, {b})", lambda t, a, b, c: t.wrap((a * b) >> t.bits)),
    "madhi": ("madhi({a}, {b}, {c})", lambda t, a, b, c: t.wrap(((a * b) >> t.bits) + c)),
    "max": ("max({a}, {b})", lambda t, a, b, c: max(a, b)),
    "min": ("min({a}, {b})", lambda t, a, b, c: min(a, b)),
    "max3": ("max3({a}, {b}, {c})", lambda t, a, b, c: max(a, b, c)),
    "min3": ("min3({a}, {b}, {c})", lambda t, a, b, c: min(a, b, c)),
    "median3": ("median3({a}, {b}, {c})", lambda t, a, b, c: sorted((a, b, c))[1]),
    "reverse_bits": ("reverse_bits({a})", lambda t, a, b, c: t.wrap(
        int(format(a % (1 << t.bits), f"0{t.bits}b")[::-1], 2))),
    "rotate": ("rotate({a}, {b})", lambda t, a, b, c: rotate_left(t, a, b)),
    "extract_bits": ("extract_bits({a}, 3, 5)", lambda t, a, b, c: extract(t, a, 3, 5)),
    "insert_bits": ("insert_bits({a}, {b}, 2, 5)", lambda t, a, b, c: insert(t, a, b, 2, 5)),
    "mul24": ("mul24({a} % 2000, {b} % 2000)",
              lambda t, a, b, c: t.wrap(int(np.fmod(a, 2000)) * int(np.fmod(b, 2000)))),
    "mad24": ("mad24({a} % 2000, {b} % 2000, {c})",
              lambda t, a, b, c: t.wrap(int(np.fmod(a, 2000)) * int(np.fmod(b, 2000)) + c)),
}
ONLY_32_BIT = {"mul24", "mad24"}


def int_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Three rows of 4 x n int64 bit patterns: random widths, extremes and zeros."""
    widths = rng.integers(1, 65, size=(3, 4 * n))
    raw = rng.integers(0, 2**63, size=(3, 4 * n), dtype=np.int64)
    values = raw >> (64 - widths)
    values = np.where(rng.random((3, 4 * n)) < 0.5, values, -values)
    edges = np.array([0, -1, 1, 2**63 - 1, -(2**63), 127, -128, 255, 32767, -32768, 65535,
                      2**31 - 1, -(2**31), 2**32 - 1], dtype=np.int64)
    for row in range(3):
        values[row, : edges.size] = np.roll(edges, row)
    return values


def test_integer_functions_every_type_scalar_and_vector():
    n = 32
    abc = int_inputs(np.random.default_rng(17), n)
    lines, slots = ["  uint i = thread_position_in_grid.x;"], []
    for t in INT_TYPES:
        def arg(row: str, t=t) -> str:
            comps = [f"{t.element}({row}[{c} * {n} + i])" for c in range(t.lanes)]
            return comps[0] if t.lanes == 1 else f"{t.name}({', '.join(comps)})"

        for name, (call, _) in INT_FUNCTIONS.items():
            if name in ONLY_32_BIT and t.bits != 32:
                continue
            expr = call.format(a=arg("a"), b=arg("b"), c=arg("c"))
            first = len(slots)
            stores = " ".join(
                f"out[{first + c} * {n} + i] = long(r{'' if t.lanes == 1 else f'[{c}]'});"
                for c in range(t.lanes)
            )
            lines.append(f"  {{ auto r = {expr}; {stores} }}")
            slots += [(t, name, c) for c in range(t.lanes)]
    kernel = sim_kernel("integer_functions", ["a", "b", "c"], ["out"], "\n".join(lines))
    (out,) = launch(kernel, [abc[0], abc[1], abc[2]], [(len(slots) * n, mx.int64)], n)
    got = np.array(out).reshape(len(slots), n)
    for slot, (t, name, comp) in enumerate(slots):
        rows = [[t.wrap(int(v)) for v in abc[r, comp * n : (comp + 1) * n]] for r in range(3)]
        oracle = INT_FUNCTIONS[name][1]
        want = [oracle(t, a, b, c) for a, b, c in zip(*rows)]
        want64 = [IntType("long", 64, True).wrap(w) for w in want]  # stored as long
        bad = np.flatnonzero(got[slot] != np.array(want64, dtype=np.int64))
        assert bad.size == 0, (
            f"{name}({t.name})[{comp}] at {bad[:4]}: got {got[slot][bad[:4]]}, "
            f"want {np.array(want64)[bad[:4]]} for a={np.array(rows[0])[bad[:4]]}, "
            f"b={np.array(rows[1])[bad[:4]]}, c={np.array(rows[2])[bad[:4]]}"
        )


# --- relational and geometric functions ----------------------------------------------------

RELATIONAL_BODY = """
  uint i = thread_position_in_grid.x;
  float x = xs[i], y = ys[i];
  float4 v = float4(xs[i], ys[i], xs[(i + 1) % N], ys[(i + 2) % N]);
  half hx = half(x), hy = half(y);
  half4 hv = half4(v);
  rel[0 * N + i] = isnan(x) | isinf(y) << 1 | isfinite(x) << 2 | isnormal(x) << 3
                   | signbit(y) << 4 | isordered(x, y) << 5 | isunordered(x, y) << 6;
  rel[1 * N + i] = isnan(hx) | isinf(hy) << 1 | isfinite(hx) << 2 | isnormal(hx) << 3
                   | signbit(hy) << 4 | isordered(hx, hy) << 5 | isunordered(hx, hy) << 6;
  bool4 n4 = isnan(v), f4 = isfinite(hv), m4 = isnormal(hv);
  rel[2 * N + i] = all(n4) | any(n4) << 1 | all(f4) << 2 | any(not(f4)) << 3
                   | any(m4) << 4 | all(isordered(v, v.wzyx)) << 5 | any(signbit(v)) << 6
                   | any(isinf(hv)) << 7 | any(isunordered(hv, hv.wzyx)) << 8;
  float4 picked = select(v, v.yxwz, bool4(true, false, true, false));
  rel[3 * N + i] = int(select(x, y, x < y) == y) | all(picked == float4(v.y, v.y, v.w, v.w)) << 1;
  // geometric
  float4 a = float4(xs[i], ys[i], zs[i], ws[i]), b = a.yzwx * 0.5f - 1.0f;
  float3 a3 = a.xyz, b3 = b.xyz;
  float4 u = normalize(b);
  geo[0 * N + i] = dot(a, b);
  geo[1 * N + i] = length(a);
  geo[2 * N + i] = length_squared(a);
  geo[3 * N + i] = distance(a, b);
  geo[4 * N + i] = distance_squared(a, b);
  float4 r4 = normalize(a);
  float3 c3 = cross(a3, b3);
  float4 ff = faceforward(a, b, a.wzyx);
  float4 rf = reflect(a, u);
  float4 rr = refract(a, u, 1.3f);
  for (uint c = 0; c < 4; ++c) {
    geo[(5 + c) * N + i] = r4[c];
    geo[(9 + c) * N + i] = ff[c];
    geo[(13 + c) * N + i] = rf[c];
    geo[(17 + c) * N + i] = rr[c];
    if (c < 3) geo[(21 + c) * N + i] = c3[c];
  }
  half4 ha = half4(a), hb = half4(b);
  geo[24 * N + i] = float(dot(ha, hb));
  geo[25 * N + i] = float(length(ha));
"""


def relational_oracle(x: np.ndarray, y: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> list:
    def flags(x, y, normal_min):
        fin = np.isfinite(x)
        normal = fin & (np.abs(x) >= normal_min)
        ordered = ~np.isnan(x) & ~np.isnan(y)
        return (np.isnan(x) | np.isinf(y) << 1 | fin << 2 | normal << 3 | np.signbit(y) << 4
                | ordered << 5 | ~ordered << 6)

    n = x.size
    idx = np.arange(n)
    v = np.stack([xs, ys, xs[(idx + 1) % n], ys[(idx + 2) % n]], 1)
    hv = v.astype(np.float16)
    n4, f4 = np.isnan(v), np.isfinite(hv)
    m4 = f4 & (np.abs(hv) >= np.float16(2.0**-14))
    ordered4 = (~np.isnan(v) & ~np.isnan(v[:, ::-1])).all(1)
    unordered_h = (np.isnan(hv) | np.isnan(hv[:, ::-1])).any(1)
    row2 = (n4.all(1) | n4.any(1) << 1 | f4.all(1) << 2 | (~f4).any(1) << 3 | m4.any(1) << 4
            | ordered4 << 5 | np.signbit(v).any(1) << 6 | np.isinf(hv).any(1) << 7
            | unordered_h << 8)
    with np.errstate(invalid="ignore"):
        sel = np.where(x < y, y, x)
        swapped = v[:, [1, 0, 3, 2]]
        chosen = np.where([True, False, True, False], swapped, v)
        row3 = (sel == y).astype(int) | (chosen == v[:, [1, 1, 3, 3]]).all(1) << 1
    return [flags(x, y, 2.0**-126), flags(x.astype(np.float16), y.astype(np.float16), 2.0**-14),
            row2, row3]


def test_relational_functions_float_half_scalar_and_vector():
    rng = np.random.default_rng(23)
    n = 64
    xs = (rng.standard_normal(n) * 10.0 ** rng.integers(-45, 39, n)).astype(np.float32)
    ys = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32)
    xs[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e-5, 1e5]
    ys[:8] = [1.0, np.nan, -0.0, np.inf, np.nan, -1.0, 2.0, -np.inf]
    zs, ws = np.ones(n, np.float32), np.ones(n, np.float32)
    kernel = sim_kernel("relational", ["xs", "ys", "zs", "ws"], ["rel", "geo"], RELATIONAL_BODY,
                        f"constant uint N = {n};\n")
    rel, _ = launch(kernel, [xs, ys, zs, ws], [(4 * n, mx.int32), (26 * n, mx.float32)], n)
    rel = np.array(rel).reshape(4, n)
    for row, want in enumerate(relational_oracle(xs, ys, xs, ys)):
        bad = np.flatnonzero(rel[row] != want)
        assert bad.size == 0, f"row {row} at {bad}: {rel[row][bad]} != {want[bad]}"


def test_geometric_functions():
    rng = np.random.default_rng(29)
    n = 64
    cols = [rng.uniform(-4, 4, n).astype(np.float32) for _ in range(4)]
    kernel = sim_kernel("geometric", ["xs", "ys", "zs", "ws"], ["rel", "geo"], RELATIONAL_BODY,
                        f"constant uint N = {n};\n")
    _, geo = launch(kernel, cols, [(4 * n, mx.int32), (26 * n, mx.float32)], n)
    geo = np.array(geo).reshape(26, n).astype(np.float64)
    a = np.stack(cols, 1).astype(np.float64)
    b = (np.roll(a, -1, axis=1).astype(np.float32) * np.float32(0.5) - 1).astype(np.float64)
    u = b / np.linalg.norm(b, axis=1, keepdims=True)
    d = (a * b).sum(1)
    scale = (np.abs(a) * np.abs(b)).sum(1)  # rounding errors of a dot grow with this
    np.testing.assert_allclose(geo[0], d, rtol=0, atol=1e-6 * scale.max())
    np.testing.assert_allclose(geo[1], np.linalg.norm(a, axis=1), rtol=2e-6)
    np.testing.assert_allclose(geo[2], (a * a).sum(1), rtol=2e-6)
    np.testing.assert_allclose(geo[3], np.linalg.norm(a - b, axis=1), rtol=2e-6)
    np.testing.assert_allclose(geo[4], ((a - b) ** 2).sum(1), rtol=2e-6)
    np.testing.assert_allclose(geo[5:9].T, a / np.linalg.norm(a, axis=1, keepdims=True),
                               atol=2e-6)
    nref = a[:, ::-1]
    ff = np.where(((nref * b).sum(1) < 0)[:, None], a, -a)
    np.testing.assert_array_equal(geo[9:13].T, ff.astype(np.float32))
    ud = (u * a).sum(1, keepdims=True)
    np.testing.assert_allclose(geo[13:17].T, a - 2 * ud * u, atol=1e-5 * np.abs(a).max())
    eta = 1.3
    k = 1 - eta**2 * (1 - ud**2)
    assert 0 < (k < 0).mean() < 1  # both refraction and total internal reflection
    refracted = np.where(k < 0, 0.0, eta * a - (eta * ud + np.sqrt(np.maximum(k, 0))) * u)
    np.testing.assert_allclose(geo[17:21].T, refracted, atol=1e-5 * np.abs(a).max())
    np.testing.assert_allclose(geo[21:24].T, np.cross(a[:, :3], b[:, :3]), atol=1e-5)
    ha, hb = a.astype(np.float16), b.astype(np.float16)
    hdot = ha[:, 0] * hb[:, 0]
    for c in range(1, 4):
        hdot = hdot + ha[:, c] * hb[:, c]  # float16 numpy: each step rounded, left to right
    np.testing.assert_array_equal(geo[24], hdot.astype(np.float64))
    hlen = np.sqrt((ha.astype(np.float64) ** 2).sum(1))
    np.testing.assert_allclose(geo[25], hlen, rtol=4e-3)
