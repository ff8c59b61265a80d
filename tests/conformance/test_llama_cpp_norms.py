"""llama.cpp's norm.metal (rms_norm, norm, their fused multiply / add, group_norm) and
softmax.metal, dispatched as ggml_metal_op_norm, ggml_metal_op_group_norm and
ggml_metal_op_soft_max do, against numpy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, fc, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import Tensor, decode, encoded

SLOW = pytest.mark.slow
REFERENCE = "numpy float64"
F32 = {"dtype": "float32", "atol": 1e-5, "rtol": 1e-4}
EPS = 1e-6
SMEM = 32 * 4  # pipeline.smem of the norms and soft_max: 32 floats


def _rng() -> np.random.Generator:
    return np.random.default_rng(5)


def _norm(kind: str, x: Tensor, weights: list[Tensor]) -> tuple[np.ndarray, list]:
    """kernel_{kind}[_mul[_add]]_f32[_4] as ggml_metal_op_norm dispatches it: the fused
    operands' shapes and strides in nef/nbf[1..2] (index 0 is src0), one threadgroup a row
    of up to 1024 threads, 32 floats of threadgroup memory."""
    fused = ["", "_mul", "_mul_add"][len(weights)]
    c4 = x.ne[0] % 4 == 0
    b = built("norm.metal", f"kernel_{kind}{fused}_f32{'_4' if c4 else ''}",
              {fc("FC_NORM", 0): False})
    ne00_t = x.ne[0] // 4 if c4 else x.ne[0]
    operands = [x, *weights]
    args = pack("ggml_metal_kargs_norm", ne00=x.ne[0], ne00_t=ne00_t, nb1=x.nb[1],
                nb2=x.nb[2], nb3=x.nb[3], eps=EPS, scale=1.0,
                **{f"nef{d}": _padded([t.ne[d] for t in operands]) for d in (1, 2, 3)},
                **{f"nbf{d}": _padded([t.nb[d] for t in operands]) for d in (1, 2, 3)})
    nth = 32
    while nth < ne00_t and nth < MAX_THREADS:
        nth *= 2
    nth = min(nth, MAX_THREADS, (ne00_t + 31) // 32 * 32)
    fuse = [*weights, x, x][:2]  # absent operands are bound to src0, as the host does
    out = run(b, {0: args, 1: x, 2: fuse[0], 3: fuse[1], 4: new(x.nbytes)},
              (x.ne[1], x.ne[2], x.ne[3]), (nth, 1, 1), SMEM)
    return decode(out[4], "f32", x.values.shape), [b]


def _padded(values: list[int]) -> list[int]:
    return (values + [0, 0, 0])[:3]


@pytest.mark.parametrize(("kind", "shape", "n_weights"), [
    ("rms_norm", (3, 4, 256), 0),
    pytest.param("rms_norm", (5, 77), 0, marks=SLOW),        # ne00 % 4 != 0
    pytest.param("rms_norm", (2, 6, 4096), 2, marks=SLOW),   # rms_norm_mul_add, 1024 thr
    pytest.param("norm", (4, 128), 0, marks=SLOW),
    pytest.param("norm", (3, 2, 300), 1, marks=SLOW),        # norm_mul
])
def test_norm(agreement, kind, shape, n_weights) -> None:
    g = _rng()
    x = encoded(g.standard_normal(shape) * 3 + 0.5, "f32")
    weights = [encoded(g.standard_normal((1,) * (len(shape) - 2) + (shape[-2], shape[-1])),
                       "f32") for _ in range(n_weights)]
    actual, parts = _norm(kind, x, weights)
    v = x.values
    if kind == "rms_norm":
        y = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + EPS)
    else:
        c = v - v.mean(axis=-1, keepdims=True)
        y = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + EPS)
    if n_weights:
        y = y * weights[0].values  # numpy broadcasting: one weight row per i01
    if n_weights == 2:
        y = y + weights[1].values
    fused = ["", "_mul", "_mul_add"][n_weights]
    check(agreement, parts, f"kernel_{kind}{fused}_f32 {shape}", actual, y, REFERENCE, **F32)


@pytest.mark.parametrize(("shape", "groups"), [
    ((8, 6, 32), 4),
    pytest.param((12, 5, 7), 3, marks=SLOW),
])
def test_group_norm(agreement, shape, groups) -> None:
    # ggml_metal_op_group_norm: one threadgroup of 32 threads per group of channels (ne02
    # split into `groups`), src0 contiguous.
    x = encoded(_rng().standard_normal(shape) * 2 - 1, "f32")
    b = built("norm.metal", "kernel_group_norm_f32")
    args = pack("ggml_metal_kargs_group_norm", x.locals("0"), ngrp=groups, eps=EPS)
    out = run(b, {0: args, 1: x, 2: new(x.nbytes)}, (groups, 1, 1), (32, 1, 1), SMEM)
    actual = decode(out[2], "f32", shape)
    per = x.values.reshape(groups, -1)
    c = per - per.mean(axis=1, keepdims=True)
    expected = (c / np.sqrt(np.mean(c * c, axis=1, keepdims=True) + EPS)).reshape(shape)
    check(agreement, b, f"kernel_group_norm_f32 {shape} in {groups}", actual, expected,
          REFERENCE, **F32)


def _soft_max(x: Tensor, mask: Tensor | None, sinks: Tensor | None, scale: float,
              max_bias: float) -> tuple[np.ndarray, list]:
    """kernel_soft_max_{mask type}[_4] as ggml_metal_op_soft_max dispatches it: absent
    mask and sinks are bound to src0's buffer (the kernel tells them apart by address),
    ALiBi's m0, m1 from max_bias over the heads (ne02), threads doubling from 32 while
    under ne00 (/4) and under 256 in all."""
    c4 = x.ne[0] % 4 == 0
    b = built("softmax.metal", f"kernel_soft_max_{mask.gtype if mask else 'f32'}"
              f"{'_4' if c4 else ''}")
    n_head_log2 = 1 << int(np.floor(np.log2(x.ne[2])))
    m = mask or x
    args = pack("ggml_metal_kargs_soft_max", x.locals("0"), m.locals("1"), x.locals(""),
                scale=scale, max_bias=max_bias, n_head_log2=n_head_log2,
                m0=2.0 ** (-max_bias / n_head_log2), m1=2.0 ** (-max_bias / 2 / n_head_log2))
    nth, limit = 32, x.ne[0] // 4 if c4 else x.ne[0]
    while nth < limit and nth * x.ne[1] * x.ne[2] * x.ne[3] < 256:
        nth *= 2
    out = run(b, {0: args, 1: x, 2: m, 3: sinks or x, 4: new(x.nbytes)},
              (x.ne[1], x.ne[2], x.ne[3]), (nth, 1, 1), SMEM)
    return decode(out[4], "f32", x.values.shape), [b]


def _soft_max_reference(x: np.ndarray, mask: np.ndarray | None, sinks: np.ndarray | None,
                        scale: float, max_bias: float) -> np.ndarray:
    """ggml's soft_max_ext: softmax(x * scale + slope_h * mask) over rows, ALiBi slopes per
    head h (m0^(h+1) for the first n_head_log2 heads, then m1^(2(h - n_head_log2) + 1)),
    and a sink logit per head that takes part in the sum only."""
    heads = x.shape[1]
    n_log2 = 1 << int(np.floor(np.log2(heads)))
    h = np.arange(heads)
    slope = np.ones(heads)
    if max_bias > 0:
        m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-max_bias / 2 / n_log2)
        slope = np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))
    logits = x * scale
    if mask is not None:
        logits = logits + slope[None, :, None, None] * mask
    top = logits.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[None, :, None, None])
    e = np.exp(logits - top)
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[None, :, None, None] - top)
    return e / total


@pytest.mark.parametrize(("shape", "mask_type", "sinks", "max_bias"), [
    ((1, 4, 6, 128), "f16", False, 0.0),
    pytest.param((2, 3, 5, 70), None, False, 0.0, marks=SLOW),   # no mask, ne00 % 4 != 0
    pytest.param((1, 8, 4, 64), "f32", True, 8.0, marks=SLOW),   # ALiBi and sinks
    pytest.param((1, 2, 3, 1000), "f16", False, 0.0, marks=SLOW),
])
def test_soft_max(agreement, shape, mask_type, sinks, max_bias) -> None:
    g = _rng()
    x = encoded(g.standard_normal(shape) * 2, "f32")
    mask = None
    if mask_type:
        m = g.standard_normal((1, 1, shape[2], shape[3]))
        m[..., ::7] = -np.inf  # masked out, as a causal mask does
        mask = encoded(m, mask_type)
    sink = encoded(g.standard_normal(shape[1]), "f32") if sinks else None
    scale = 0.125
    actual, parts = _soft_max(x, mask, sink, scale, max_bias)
    expected = _soft_max_reference(x.values, None if mask is None else mask.values,
                                   None if sink is None else sink.values, scale, max_bias)
    name = f"kernel_soft_max_{mask_type or 'f32'} {shape}{' sinks' if sinks else ''}" \
           f"{' alibi' if max_bias else ''}"
    check(agreement, parts, name, actual, expected, REFERENCE, **F32)
