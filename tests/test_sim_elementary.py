"""The shim's own exponentials, logarithms, hyperbolic and trigonometric functions, their
inverses and pow (include/mtw_elementary.h, mtw_trig.h) on a sweep of a million floats, and
the plain loops they run in.

Each function of one argument is checked against numpy in float64 over every 4099th bit
pattern of a float (both signs, subnormals, infinities, NaNs), to 1 ulp: the code claims
just over 0.5, Metal's precise bounds allow 4 to 16 (MSL specification, table 8.1), its
fast ones more (table 8.2). Those of two arguments (atan2, pow, powr) run on a grid of
special and representative values in both places and on random pairs, to the same bound.
Zeros and infinities must also have the oracle's sign. Everything runs as plain loops over
threads (vectorized) and on the fiber engine (one thread at a time), which must give the
same bits, and in math modes "fast" (finite values only) and "relaxed" too. And clang
must vectorize the plain loop of an elementwise kernel: its remark says so.
"""

from __future__ import annotations

import uuid

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.compile import compiler, linking
from tests.test_sim_numerics import pi_trig, power, powr, ulp_error

pytestmark = pytest.mark.filterwarnings(
    "ignore:(invalid value|overflow|divide by zero) encountered:RuntimeWarning"
)

FUNCTIONS = {  # MSL call: float64 oracle
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: 10.0**x, "log": np.log,
    "log2": np.log2, "log10": np.log10, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinpi": pi_trig("sin"),
    "cospi": pi_trig("cos"), "tanpi": pi_trig("tan"), "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan,
    "fast::exp": np.exp, "fast::log": np.log, "fast::sin": np.sin, "fast::cos": np.cos,
    "precise::exp2": np.exp2, "precise::log2": np.log2, "precise::tan": np.tan,
}
PAIRS = {  # MSL call of (x, y): float64 oracle
    "atan2": np.arctan2, "pow": power, "powr": powr, "fast::pow": power,
    "precise::atan2": np.arctan2,
}
# Every 4099th float, and the float >= 1 nearest a multiple of pi/2 (relative to its
# size; found by a search over all of them): where sin, cos and tan reduce hardest.
NEAREST_HALF_PI_MULTIPLE = np.float32(float.fromhex("0x1.f37c8ap+95"))
SWEEP = np.concatenate([
    np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32),
    [NEAREST_HALF_PI_MULTIPLE, -NEAREST_HALF_PI_MULTIPLE]]).astype(np.float32)
# Zeros, infinities, NaN, ones, odd and even integers (small, 2^23 + 1, 2^24 on, where all
# are even), halves, values just either side of 1, subnormals, the largest float.
SPECIAL = np.array([
    0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 1.5,
    -1.5, 0.25, 10.0, -10.0, 0.1, -7.0, 127.5, 128.0, -149.0, 150.0, np.pi, 1e10, -1e-10,
    1 + 2.0**-23, 1 - 2.0**-24, -(1 + 2.0**-23), 2.0**23 + 1, -(2.0**23 + 1), 2.0**24,
    -(2.0**24 + 2), 1e-40, -1e-45, 2.0**-126, 3.4028235e38, -3.4028235e38,
], dtype=np.float32)


def pair_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of SPECIAL values, n pairs of random bit patterns, and n pairs of
    moderate x and y (where pow's result is mostly a finite float; half the y integers)."""
    gx, gy = (g.ravel() for g in np.meshgrid(SPECIAL, SPECIAL))
    bx, by = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
              for _ in range(2))
    mx_ = (rng.choice([-1, 1], n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    my = rng.uniform(-40, 40, n)
    my = np.where(rng.random(n) < 0.5, np.round(my), my).astype(np.float32)
    return np.concatenate([gx, bx, mx_]), np.concatenate([gy, by, my])


PAIR_X, PAIR_Y = pair_inputs(np.random.default_rng(18), 1 << 18)


def sweep_kernel(math_mode: str = "safe") -> mtwork.MetalKernel:
    lines = ["  uint i = thread_position_in_grid.x;",
             f"  if (i < {SWEEP.size}) {{"]
    lines += [f"    out[{k} * n + i] = metal::{name}(x[i]);" for k, name in enumerate(FUNCTIONS)]
    lines += ["  }", f"  if (i < {PAIR_X.size}) {{"]
    lines += [f"    pairs[{k} * m + i] = metal::{name}(px[i], py[i]);"
              for k, name in enumerate(PAIRS)]
    lines += ["  }"]
    header = f"constant uint n = {SWEEP.size};\nconstant uint m = {PAIR_X.size};\n"
    return mtwork.metal_kernel(f"elementary_sweep_{math_mode}", ["x", "px", "py"],
                               ["out", "pairs"], "\n".join(lines), header=header,
                               compile_options={"math_mode": math_mode}, backend="sim")


def run_sweep(kernel: mtwork.MetalKernel) -> tuple[np.ndarray, np.ndarray]:
    threads = -max(SWEEP.size, PAIR_X.size) // 256 * -256
    out, pairs = kernel(inputs=[mx.array(SWEEP), mx.array(PAIR_X), mx.array(PAIR_Y)],
                        grid=(threads, 1, 1), threadgroup=(256, 1, 1),
                        output_shapes=[(len(FUNCTIONS) * SWEEP.size,),
                                       (len(PAIRS) * PAIR_X.size,)],
                        output_dtypes=[mx.float32, mx.float32], isolate=False)
    return (np.array(out).reshape(len(FUNCTIONS), SWEEP.size),
            np.array(pairs).reshape(len(PAIRS), PAIR_X.size))


Results = tuple[np.ndarray, np.ndarray]


@pytest.fixture(scope="module")
def swept() -> tuple[Results, Results, Results, Results]:
    """The sweep's results as plain loops over threads, then on the fiber engine, then as
    plain loops in math modes "fast" and "relaxed"."""
    kernel = sweep_kernel()
    loops = run_sweep(kernel)
    assert kernel.last_engine.name == "loops"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MTWORK_SIM_BARRIER_FREE", "0")
        fibers = run_sweep(kernel)
    assert kernel.last_engine.name == "fibers"
    return loops, fibers, run_sweep(sweep_kernel("fast")), run_sweep(sweep_kernel("relaxed"))


def oracle(name: str) -> np.ndarray:
    if name in FUNCTIONS:
        return FUNCTIONS[name](SWEEP.astype(np.float64))
    return PAIRS[name](PAIR_X.astype(np.float64), PAIR_Y.astype(np.float64))


def result(name: str, results: Results) -> np.ndarray:
    ones, twos = results
    return ones[list(FUNCTIONS).index(name)] if name in FUNCTIONS else twos[list(PAIRS).index(name)]


def where(name: str, k: int) -> str:
    if name in FUNCTIONS:
        return repr(SWEEP[k])
    return f"({PAIR_X[k]!r}, {PAIR_Y[k]!r})"


def finite(name: str, want: np.ndarray) -> np.ndarray:
    """Where the inputs and the float result are finite: math mode "fast" may assume
    them so (MSL specification, section 8.4)."""
    inputs = [SWEEP] if name in FUNCTIONS else [PAIR_X, PAIR_Y]
    return np.isfinite(want.astype(np.float32)) & np.all([np.isfinite(x) for x in inputs], 0)


@pytest.mark.parametrize("name", [*FUNCTIONS, *PAIRS])
def test_within_one_ulp_of_float64(name: str, swept) -> None:
    want = oracle(name)
    err = ulp_error(result(name, swept[0]), want, np.float32)
    k = int(np.argmax(err))
    assert err.max() <= 1.0, f"{name}: {err.max()} ulp at {where(name, k)}"
    fast = np.where(finite(name, want), ulp_error(result(name, swept[2]), want, np.float32), 0)
    k = int(np.argmax(fast))
    assert fast.max() <= 1.0, f"{name} (fast): {fast.max()} ulp at {where(name, k)}"
    # "relaxed" keeps infinities and NaNs, not the signs of zeros (-fno-signed-zeros)
    relaxed = ulp_error(result(name, swept[3]), want, np.float32)
    k = int(np.argmax(relaxed))
    assert relaxed.max() <= 1.0, f"{name} (relaxed): {relaxed.max()} ulp at {where(name, k)}"


@pytest.mark.parametrize("name", [*FUNCTIONS, *PAIRS])
def test_zeros_and_infinities_have_the_oracles_sign(name: str, swept) -> None:
    want = oracle(name).astype(np.float32)
    got = result(name, swept[0])
    signed = (want == 0) | np.isinf(want)
    wrong = signed & (np.signbit(got) != np.signbit(want))
    k = int(np.argmax(wrong))
    assert not wrong.any(), f"{name}: {got[k]!r} at {where(name, k)}, want {want[k]!r}"


def test_plain_loops_and_fibers_give_the_same_bits(swept) -> None:
    (loops, loop_pairs), (fibers, fiber_pairs), *_ = swept
    differ = (loops.view(np.uint32) != fibers.view(np.uint32)).any(axis=1)
    pairs_differ = (loop_pairs.view(np.uint32) != fiber_pairs.view(np.uint32)).any(axis=1)
    assert not differ.any() and not pairs_differ.any(), (
        [list(FUNCTIONS)[k] for k in np.flatnonzero(differ)]
        + [list(PAIRS)[k] for k in np.flatnonzero(pairs_differ)])


@pytest.mark.parametrize("body,inputs", [
    ("out[i] = metal::exp(a[i]);", ["a"]),
    ("out[i] = a[i] * b[i] + c[i];", ["a", "b", "c"]),
    ("out[i] = metal::log(a[i]) + metal::tanh(b[i]);", ["a", "b"]),
    ("out[i] = metal::sin(a[i]);", ["a"]),
    ("out[i] = metal::cos(a[i]);", ["a"]),
    ("out[i] = metal::pow(a[i], b[i]);", ["a", "b"]),
    ("out[i] = metal::atan2(a[i], b[i]);", ["a", "b"]),
    ("out[i] = metal::sqrt(a[i]) + metal::rsqrt(b[i]);", ["a", "b"]),  # no errno
    # a body over the inliner's threshold: inlined into the loop all the same
    ("out[i] = metal::sin(a[i]) + metal::cos(b[i]);", ["a", "b"]),
    ("out[i] = metal::pow(a[i], b[i]) * metal::exp(a[i]) + metal::atan2(b[i], a[i]);",
     ["a", "b"]),
])
def test_plain_loop_of_an_elementwise_kernel_vectorizes(body: str, inputs: list[str],
                                                        monkeypatch) -> None:
    """clang's remark on the library's build: the loop over a threadgroup's x in
    mtw_entry_barrier_free is vectorized. (The kernel's name is new on every run, so
    the library is compiled, not found in the cache.)"""
    remarks: list[str] = []
    run_clang = compiler.run_clang

    def with_remarks(args: list[str], what: str, **kw):
        result = run_clang([*args, "-Rpass=loop-vectorize"], what, **kw)
        remarks.append(result.stderr)
        return result

    # the library is compiled and linked in one step, through linking.run_link
    monkeypatch.setattr(compiler, "run_clang", with_remarks)
    monkeypatch.setattr(linking, "run_clang", with_remarks)
    name = f"vectorized_{uuid.uuid4().hex[:12]}"
    kernel = mtwork.metal_kernel(name, inputs, ["out"],
                                 f"uint i = thread_position_in_grid.x; {body}", backend="sim")
    kernel.compile([mx.zeros((64,), dtype=mx.float32)] * len(inputs), [mx.float32])
    assert "vectorized loop" in "".join(remarks), "".join(remarks)[-3000:]
