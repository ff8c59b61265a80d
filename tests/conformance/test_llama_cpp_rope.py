"""llama.cpp's rope.metal (norm and neox rotations, partial rotation, YaRN, frequency
factors) dispatched as ggml_metal_op_rope does, against ggml's RoPE written in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import Tensor, decode, encoded, integers

SLOW = pytest.mark.slow
REFERENCE = "numpy float64 (ggml's RoPE with YaRN)"
TOLERANCE = {"f32": {"dtype": "float32", "atol": 1e-4, "rtol": 1e-4},  # float32 angles
             "f16": {"dtype": "float16", "atol": 2e-3, "rtol": 2e-3}}


def _corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float,
               beta_slow: float) -> tuple[float, float]:
    """ggml's rope_yarn_corr_dims: the dimensions where YaRN's ramp starts and ends."""
    def factor(n_rot: float) -> float:
        return n_dims * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))

    return max(0.0, np.floor(factor(beta_fast))), min(n_dims - 1.0, np.ceil(factor(beta_slow)))


def rope_reference(x: np.ndarray, pos: np.ndarray, *, neox: bool, n_dims: int,
                   base: float, freq_scale: float = 1.0, ext_factor: float = 0.0,
                   attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                   n_ctx_orig: int = 4096, freq_factors: np.ndarray | None = None
                   ) -> np.ndarray:
    """ggml_rope_ext over x [..., tokens, heads, head_dim]: pairs (2i, 2i+1) (norm) or
    (i, i + n_dims/2) (neox) of the first n_dims channels turn by pos * base^(-2i/n_dims),
    interpolated by YaRN; the other channels are copied."""
    out = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    theta = pos[:, None] * base ** (-2.0 * i / n_dims)  # [tokens, half]
    if freq_factors is not None:
        theta = theta / freq_factors[None, :half]
    interp = freq_scale * theta
    mscale = attn_factor
    if ext_factor != 0.0:
        low, high = _corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow)
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        mix = ramp * ext_factor
        interp = interp * (1 - mix) + theta * mix
        mscale *= 1 + 0.1 * np.log(1 / freq_scale)
    cos, sin = np.cos(interp)[:, None, :] * mscale, np.sin(interp)[:, None, :] * mscale
    first = (..., slice(0, n_dims, 2)) if not neox else (..., slice(0, half))
    second = (..., slice(1, n_dims, 2)) if not neox else (..., slice(half, n_dims))
    a, b = x[first], x[second]
    out[first] = a * cos - b * sin
    out[second] = a * sin + b * cos
    return out


def _rope(x: Tensor, pos: Tensor, factors: Tensor | None, neox: bool, n_dims: int,
          params: dict) -> tuple[np.ndarray, list]:
    """kernel_rope_{norm,neox}_* as ggml_metal_op_rope dispatches it: one threadgroup per
    (head, token, batch), min(1024, ne00) threads, frequency factors at buffer 3 (src0's
    buffer when there are none, with args.src2 false)."""
    kind = "neox" if neox else "norm"
    b = built("rope.metal", f"kernel_rope_{kind}_{x.gtype}",
              {fc("FC_ROPE", 0): False, fc("FC_ROPE", 1): False})
    args = pack("ggml_metal_kargs_rope", x.locals("0"), x.locals(""), n_past=0,
                n_dims=n_dims, n_offs=0, n_ctx_orig=params.get("n_ctx_orig", 4096),
                freq_base=params["base"], freq_scale=params.get("freq_scale", 1.0),
                ext_factor=params.get("ext_factor", 0.0),
                attn_factor=params.get("attn_factor", 1.0),
                beta_fast=params.get("beta_fast", 32.0), beta_slow=params.get("beta_slow", 1.0),
                src2=factors is not None, inplace=False)
    out = run(b, {0: args, 1: x, 2: pos, 3: factors or x, 4: new(x.nbytes)},
              (x.ne[1], x.ne[2], x.ne[3]), (min(1024, x.ne[0]), 1, 1))
    return decode(out[4], x.gtype, x.values.shape), [b]


@pytest.mark.parametrize(("neox", "gtype", "shape", "n_dims", "yarn", "factors"), [
    (False, "f32", (5, 4, 64), 64, False, False),
    pytest.param(True, "f32", (3, 2, 128), 128, False, False, marks=SLOW),
    pytest.param(True, "f16", (4, 3, 96), 64, False, False, marks=SLOW),   # partial rotation
    pytest.param(False, "f32", (2, 2, 64), 32, True, False, marks=SLOW),   # YaRN
    pytest.param(True, "f32", (3, 2, 64), 64, True, True, marks=SLOW),     # + freq factors
])
def test_rope(agreement, neox, gtype, shape, n_dims, yarn, factors) -> None:
    g = np.random.default_rng(3)
    x = encoded(g.standard_normal(shape), gtype)
    positions = g.integers(0, 512, size=shape[0]).astype(np.int32)
    pos = integers(positions)
    freq = encoded(1 + g.random(n_dims // 2) * 3, "f32") if factors else None
    params = {"base": 10000.0}
    if yarn:
        params.update(freq_scale=0.25, ext_factor=1.0, attn_factor=1.0, n_ctx_orig=2048)
    actual, parts = _rope(x, pos, freq, neox, n_dims, params)
    expected = rope_reference(x.values, positions.astype(np.float64), neox=neox, n_dims=n_dims,
                              freq_factors=None if freq is None else freq.values, **params)
    name = f"kernel_rope_{'neox' if neox else 'norm'}_{gtype} {shape} n_dims={n_dims}" \
           f"{' yarn' if yarn else ''}{' freq_factors' if factors else ''}"
    check(agreement, parts, name, actual, expected, REFERENCE, **TOLERANCE[gtype])
