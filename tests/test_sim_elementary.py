"""The shim's own exponentials, logarithms and hyperbolic functions (include/
mtw_elementary.h) on a sweep of a million floats, and the plain loops they run in.

Each function is checked against numpy in float64 over every 4099th bit pattern of a
float (both signs, subnormals, infinities, NaNs), to 1 ulp: the code claims just over
0.5, Metal's precise bounds allow 4 to 5 (MSL specification, table 8.1). The same sweep
runs as plain loops over threads (vectorized) and on the fiber engine (one thread at a
time), which must give the same bits. And clang must vectorize the plain loop of an
elementwise kernel: its remark says so.
"""

from __future__ import annotations

import uuid

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim import compiler, linking
from tests.test_sim_numerics import ulp_error

pytestmark = pytest.mark.filterwarnings(
    "ignore:(invalid value|overflow|divide by zero) encountered:RuntimeWarning"
)

FUNCTIONS = {  # MSL call: float64 oracle
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: 10.0**x, "log": np.log,
    "log2": np.log2, "log10": np.log10, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
    "fast::exp": np.exp, "fast::log": np.log, "precise::exp2": np.exp2,
    "precise::log2": np.log2,
}
SWEEP = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)


def sweep_kernel() -> mtwork.MetalKernel:
    lines = ["  uint i = thread_position_in_grid.x;"]
    lines += [f"  out[{k} * n + i] = metal::{name}(x[i]);" for k, name in enumerate(FUNCTIONS)]
    return mtwork.metal_kernel("elementary_sweep", ["x"], ["out"], "\n".join(lines),
                               header=f"constant uint n = {SWEEP.size};\n", backend="sim")


def run_sweep(kernel: mtwork.MetalKernel) -> np.ndarray:
    (out,) = kernel(inputs=[mx.array(SWEEP)], grid=(SWEEP.size, 1, 1),
                    threadgroup=(256, 1, 1), output_shapes=[(len(FUNCTIONS) * SWEEP.size,)],
                    output_dtypes=[mx.float32], isolate=False)
    return np.array(out).reshape(len(FUNCTIONS), SWEEP.size)


@pytest.fixture(scope="module")
def swept() -> tuple[np.ndarray, np.ndarray]:
    """The sweep's results as plain loops over threads, then on the fiber engine."""
    kernel = sweep_kernel()
    loops = run_sweep(kernel)
    assert kernel.last_engine.name == "loops"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MTWORK_SIM_BARRIER_FREE", "0")
        fibers = run_sweep(kernel)
    assert kernel.last_engine.name == "fibers"
    return loops, fibers


@pytest.mark.parametrize("name", FUNCTIONS)
def test_within_one_ulp_of_float64(name: str, swept) -> None:
    loops, _ = swept
    want = FUNCTIONS[name](SWEEP.astype(np.float64))
    err = ulp_error(loops[list(FUNCTIONS).index(name)], want, np.float32)
    assert err.max() <= 1.0, f"{name}: {err.max()} ulp at {SWEEP[np.argmax(err)]!r}"


def test_plain_loops_and_fibers_give_the_same_bits(swept) -> None:
    loops, fibers = swept
    differ = loops.view(np.uint32) != fibers.view(np.uint32)
    assert not differ.any(), [list(FUNCTIONS)[k] for k in np.flatnonzero(differ.any(axis=1))]


@pytest.mark.parametrize("body,inputs", [
    ("out[i] = metal::exp(a[i]);", ["a"]),
    ("out[i] = a[i] * b[i] + c[i];", ["a", "b", "c"]),
    ("out[i] = metal::log(a[i]) + metal::tanh(b[i]);", ["a", "b"]),
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
