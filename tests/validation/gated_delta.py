"""The sequential gated-delta recurrence: MLX's `gated_delta_seq` (one SIMD-group a value
row, `simd_sum` reductions) and mlx-lm's packed kernel (eight value rows a SIMD-group,
four lanes a row, mlx-lm #1559), the layout seed 002 and MLX #4409 port into MLX.

MLX's kernel comes from the `mlx-metal` wheel's `gated_delta_update.h`, dispatched as
`GatedDeltaUpdate::eval_gpu` does for the sequential path (`GATED_DELTA_CHUNK=0`, as the
published measurements set it): `gated_delta_seq<InT, Dk, Dv, Hk, Hv, 1>` with
`save_state` off, dispatchThreads over (32, Dv, B * Hv) in threadgroups of 32 x 4 (the
zero fill of the output before it is left out: a write of y, small beside the kernel).
mlx-lm's kernels are its own module from its wheel, with `mx.fast.metal_kernel` standing
for mtwork's, called through its own `gated_delta_kernel` (host code and all), whose
profiled dispatch is the one kernel it makes.

Each side is profiled for one key head and its two value heads (the (16, 32) heads'
ratio) at 8 and 16 tokens, taken to `steps` tokens (`mtwork.gpu.at_steps`: every token
does the same work) and to B x 16 key heads (`scaled`: heads and batches touch lines of
their own).
"""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from functools import cache
from types import ModuleType

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.gpu import Counters, at_steps, scaled
from mtwork.recording import profiling_calls

from . import mlx_side, published

DK = DV = 128
KEY_HEADS = 16  # (Hk, Hv) = (16, 32)


def inputs(batch: int, steps: int, hk: int, hv: int, dtype: mx.Dtype, seed: int = 0
           ) -> tuple[mx.array, ...]:
    """q, k, v, g, beta and the float32 state, as the published benchmark shapes them
    (g and beta per value head, k L2-normalised)."""
    r = np.random.default_rng(seed)
    q = r.standard_normal((batch, steps, hk, DK)) / np.sqrt(DK)
    k = r.standard_normal((batch, steps, hk, DK))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = r.standard_normal((batch, steps, hv, DV))
    g = np.exp(-0.2 * r.uniform(size=(batch, steps, hv)))
    beta = r.uniform(size=(batch, steps, hv))
    state = 0.3 * r.standard_normal((batch, hv, DV, DK))
    return (*(mx.array(a, dtype) for a in (q, k, v)), mx.array(g, mx.float32),
            mx.array(beta, dtype), mx.array(state, mx.float32))


def mlx_seq(version: str, batch: int, steps: int, dtype: mx.Dtype) -> Counters:
    return _whole(lambda t: _mlx_seq_counts(version, t, dtype), batch, steps)


def mlx_lm(version: str, batch: int, steps: int, dtype: mx.Dtype, packed: bool) -> Counters:
    return _whole(lambda t: _mlx_lm_counts(version, t, dtype, packed), batch, steps)


def _whole(counts, batch: int, steps: int) -> Counters:
    a, b = counts(8), counts(16)
    return scaled(at_steps(a, b, (8, 16), steps), batch * KEY_HEADS)


@cache
def _mlx_seq_counts(version: str, steps: int, dtype: mx.Dtype) -> Counters:
    q, k, v, g, beta, state = inputs(1, steps, 1, 2, dtype)
    kern = mlx_side.kernel(version, ("utils.h", "gated_delta_update.h"), "gated_delta_seq",
                           (dtype, DK, DV, 1, 2, 1), (("save_state", False),))
    launch = kern.launch(buffers={"q": q, "k": k, "v": v, "state_in": state,
                                  "g": g.astype(dtype), "beta": beta,
                                  "y": mtwork.new_buffer((1, steps, 2, DV), dtype),
                                  "state_out": mtwork.new_buffer(state.shape, mx.float32),
                                  "T": steps},
                         grid=(32, DV, 2), threads_per_threadgroup=(32, 4, 1))
    return mtwork.profile(launch)


@cache
def _mlx_lm_counts(version: str, steps: int, dtype: mx.Dtype, packed: bool) -> Counters:
    module = mlx_lm_gated_delta(version)
    call = module.gated_delta_kernel if packed else module.gated_delta_kernel_unpacked
    with profiling_calls() as done:
        call(*inputs(1, steps, 1, 2, dtype))
    if len(done) != 1:
        raise RuntimeError(f"mlx-lm {version}'s gated delta dispatched {len(done)} kernels")
    counted = done[0].counters
    assert counted is not None
    want = "packed" if packed else "gated_delta_step"
    if want not in counted.kernel:
        raise RuntimeError(f"mlx-lm {version} ran `{counted.kernel}`, not its {want} kernel")
    return counted


@cache
def mlx_lm_gated_delta(version: str) -> ModuleType:
    """mlx-lm `version`'s mlx_lm/models/gated_delta.py, its kernels made by
    `mtwork.metal_kernel` (the same arguments as `mx.fast.metal_kernel`). Kept under its own
    name in `sys.modules`; the installed mlx_lm, if any, is left as it is."""
    path = published.mlx_lm_package(version) / "models" / "gated_delta.py"
    name = f"mtwork_validation_mlx_lm_{version.replace('.', '_')}_gated_delta"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _metal_kernels_from_mtwork():
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@contextmanager
def _metal_kernels_from_mtwork():
    """The module builds its kernels at import only where Metal is available: for that
    moment it is, and its factory is mtwork's (the kernels then run where mtwork runs
    them; profiled calls run on sim)."""
    real, available = mx.fast.metal_kernel, mx.metal.is_available
    mx.fast.metal_kernel, mx.metal.is_available = mtwork.metal_kernel, lambda: True
    try:
        yield
    finally:
        mx.fast.metal_kernel, mx.metal.is_available = real, available
