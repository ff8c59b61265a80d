"""llama.cpp's convolution-side kernels: im2col (conv.metal, 1D and 2D, and its "ext" form
for kernels of more than a threadgroup of taps), conv_transpose_1d / _2d (conv.metal),
pool_1d / pool_2d (pool.metal) and upscale (upscale.metal: nearest, bilinear, bicubic,
antialiased bilinear), each dispatched as its ggml_metal_op_* does, against numpy written
from ggml's definitions (the transposed convolutions as scatters where the kernels
gather, the resamplings as matrices).
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, fc, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import decode, encoded

SLOW = pytest.mark.slow
EXACT = {"dtype": "float64", "atol": 0.0, "rtol": 0.0}
# float32 sums: errors relative to the sum of the terms' magnitudes.
SUMS = {"dtype": "float64", "atol": 1e-6, "rtol": 0.0}


def _out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def im2col_reference(x: np.ndarray, kh: int, kw: int, s: tuple[int, int],
                     p: tuple[int, int], d: tuple[int, int]) -> np.ndarray:
    """x [N, IC, IH, IW] -> [N, OH, OW, IC * KH * KW]: each output position's window of
    the zero-padded input, channel-major then kernel row then column."""
    n, ic, ih, iw = x.shape
    oh, ow = _out(ih, kh, s[1], p[1], d[1]), _out(iw, kw, s[0], p[0], d[0])
    padded = np.pad(x, ((0, 0), (0, 0), (p[1], p[1] + kh * d[1]), (p[0], p[0] + kw * d[0])))
    out = np.zeros((n, oh, ow, ic, kh, kw))
    for a in range(kh):
        for b in range(kw):
            rows = padded[:, :, a * d[1]: a * d[1] + s[1] * oh: s[1], :]
            out[:, :, :, :, a, b] = rows[:, :, :, b * d[0]: b * d[0] + s[0] * ow: s[0]] \
                .transpose(0, 2, 3, 1)
    return out.reshape(n, oh, ow, ic * kh * kw)


@pytest.mark.parametrize(("out_type", "shape", "kernel", "s", "p", "d"), [
    ("f32", (2, 3, 9, 8), (3, 3), (1, 2), (1, 0), (1, 1)),            # 2D
    pytest.param("f16", (3, 2, 1, 20), (1, 5), (2, 1), (2, 0), (2, 1), marks=SLOW),  # 1D
    pytest.param("f32", (2, 1, 36, 36), (33, 33), (1, 1), (0, 0), (1, 1), marks=SLOW),  # ext
])
def test_im2col(agreement, out_type, shape, kernel, s, p, d) -> None:
    n, ic, ih, iw = shape
    kh, kw = kernel
    two_d = ih > 1 or kh > 1
    # ggml_conv_1d's input is [N, IC, IW]: a 3-dimensional tensor.
    values = np.random.default_rng(12).standard_normal(shape)
    x = encoded(values if two_d else values[:, :, 0], "f32")
    want = im2col_reference(values.astype(np.float32), kh, kw, s, p, d)
    if not two_d:  # ggml_conv_1d passes no stride, padding or dilation along the height
        s, p, d = (s[0], 0), (p[0], 0), (d[0], 0)
    _, oh, ow, chw = want.shape
    ofs = (x.nb[3] // 4, x.nb[2] // 4) if two_d else (x.nb[2] // 4, x.nb[1] // 4)
    args = pack("ggml_metal_kargs_im2col", ofs0=ofs[0], ofs1=ofs[1], IW=iw, IH=ih, CHW=chw,
                s0=s[0], s1=s[1], p0=p[0], p1=p[1], d0=d[0], d1=d[1], N=n, KH=kh, KW=kw,
                KHW=kh * kw)
    nbytes = want.size * (4 if out_type == "f32" else 2)
    if kh * kw <= MAX_THREADS:
        b = built("conv.metal", f"kernel_im2col_{out_type}")
        groups, threads = (ic, oh, ow), (min(MAX_THREADS // (kh * kw), n), kh, kw)
    else:
        b = built("conv.metal", f"kernel_im2col_ext_{out_type}")
        nth = min(MAX_THREADS, n)
        groups, threads = (-(-n // nth) * chw, oh, ow), (nth, 1, 1)
    out = run(b, {0: args, 1: x, 2: new(nbytes)}, groups, threads)
    check(agreement, b, f"{b.kernel.name} x={shape} k={kernel} s={s} p={p} d={d}",
          decode(out[2], out_type, want.shape), encoded(want, out_type).values,
          "numpy: windows of the zero-padded input", **EXACT)


@pytest.mark.parametrize(("wtype", "ic", "oc", "il", "k", "s"), [
    ("f32", 3, 4, 10, 4, 2),
    pytest.param("f16", 2, 3, 7, 5, 3, marks=SLOW),
    pytest.param("f32", 4, 2, 6, 2, 3, marks=SLOW),  # stride past the kernel: gaps
])
def test_conv_transpose_1d(agreement, wtype, ic, oc, il, k, s) -> None:
    g = np.random.default_rng(13)
    w = encoded(g.standard_normal((ic, oc, k)), wtype)
    x = encoded(g.standard_normal((ic, il)), "f32")
    ol = (il - 1) * s + k
    want, scale = np.zeros((oc, ol)), np.zeros((oc, ol))
    for j in range(k):  # out[o, i s + j] += sum_c x[c, i] w[c, o, j]
        want[:, j: j + s * il: s] += np.einsum("ci,co->oi", x.values, w.values[:, :, j])
        scale[:, j: j + s * il: s] += np.einsum("ci,co->oi", np.abs(x.values),
                                                np.abs(w.values[:, :, j]))
    dst = encoded(want, "f32")
    b = built("conv.metal", f"kernel_conv_transpose_1d_{wtype}_f32")
    args = pack("ggml_metal_kargs_conv_transpose_1d", IC=ic, IL=il, K=k, s0=s, nb0=dst.nb[0],
                nb1=dst.nb[1])
    out = run(b, {0: args, 1: w, 2: x, 3: new(dst.nbytes)}, (ol, oc, 1), (1, 1, 1))
    scale = np.maximum(scale, 1e-30)
    check(agreement, b, f"{b.kernel.name} IC={ic} OC={oc} IL={il} K={k} s={s}",
          decode(out[3], "f32", want.shape) / scale, want / scale,
          "numpy float64 scatter; error / sum|products|", **SUMS)


@pytest.mark.parametrize(("wtype", "n", "ic", "oc", "ih", "iw", "kh", "kw", "s"), [
    ("f32", 1, 2, 3, 4, 5, 3, 3, 2),
    pytest.param("f16", 2, 3, 2, 3, 3, 2, 4, 1, marks=SLOW),
])
def test_conv_transpose_2d(agreement, wtype, n, ic, oc, ih, iw, kh, kw, s) -> None:
    g = np.random.default_rng(14)
    w = encoded(g.standard_normal((ic, oc, kh, kw)), wtype)
    x = encoded(g.standard_normal((n, ic, ih, iw)), "f32")
    oh, ow = (ih - 1) * s + kh, (iw - 1) * s + kw
    want, scale = np.zeros((n, oc, oh, ow)), np.zeros((n, oc, oh, ow))
    for a in range(kh):
        for c in range(kw):
            rows, cols = slice(a, a + s * ih, s), slice(c, c + s * iw, s)
            want[:, :, rows, cols] += np.einsum("bihw,io->bohw", x.values, w.values[:, :, a, c])
            scale[:, :, rows, cols] += np.einsum("bihw,io->bohw", np.abs(x.values),
                                                 np.abs(w.values[:, :, a, c]))
    dst = encoded(want, "f32")
    b = built("conv.metal", f"kernel_conv_transpose_2d_{wtype}_f32")
    args = pack("ggml_metal_kargs_conv_transpose_2d", IC=ic, IH=ih, IW=iw, KH=kh, KW=kw,
                OC=oc, s0=s, nb0=dst.nb[0], nb1=dst.nb[1], nb2=dst.nb[2], nb3=dst.nb[3])
    out = run(b, {0: args, 1: w, 2: x, 3: new(dst.nbytes)}, (ow, oh, oc * n), (kw, kh, 1),
              -(-kw * kh * 4 // 16) * 16)
    scale = np.maximum(scale, 1e-30)
    check(agreement, b, f"{b.kernel.name} N={n} IC={ic} OC={oc} {ih}x{iw} k={kh}x{kw} s={s}",
          decode(out[3], "f32", want.shape) / scale, want / scale,
          "numpy float64 scatter; error / sum|products|", **SUMS)


def _windows(x: np.ndarray, k: int, s: int, p: int, axis: int) -> list[np.ndarray]:
    """Per output position along `axis`, the in-bounds part of its window."""
    size = x.shape[axis]
    out = (size + 2 * p - k) // s + 1
    return [np.take(x, range(max(0, o * s - p), min(size, o * s - p + k)), axis=axis)
            for o in range(out)]


@pytest.mark.parametrize(("op", "shape", "k", "s", "p"), [
    ("avg", (2, 3, 11), 3, 2, 1),
    pytest.param("max", (1, 4, 9), 4, 3, 2, marks=SLOW),
])
def test_pool_1d(agreement, op, shape, k, s, p) -> None:
    x = encoded(np.random.default_rng(15).standard_normal(shape), "f32")
    # ggml's pool_1d: max, or the mean over the taps inside the row.
    reduce = np.max if op == "max" else np.mean
    want = np.stack([reduce(w, axis=-1) for w in _windows(x.values, k, s, p, -1)], axis=-1)
    b = built("pool.metal", f"kernel_pool_1d_{op}_f32")
    args = pack("ggml_metal_kargs_pool_1d", k0=k, s0=s, p0=p, IW=shape[-1],
                OW=want.shape[-1], np=want.size)
    nth = min(MAX_THREADS, want.size)
    out = run(b, {0: args, 1: x, 2: new(4 * want.size)}, (-(-want.size // nth), 1, 1),
              (nth, 1, 1))
    check(agreement, b, f"{b.kernel.name} {shape} k={k} s={s} p={p}",
          decode(out[2], "f32", want.shape), want, "numpy float64 over each window",
          dtype="float32", atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("op", "shape", "k", "s", "p"), [
    ("max", (2, 2, 7, 9), (3, 2), (2, 2), (1, 0)),
    pytest.param("avg", (1, 3, 6, 6), (2, 3), (1, 2), (0, 1), marks=SLOW),
])
def test_pool_2d(agreement, op, shape, k, s, p) -> None:
    x = encoded(np.random.default_rng(16).standard_normal(shape), "f32")
    want = np.stack([np.stack([
        w.max(axis=(-2, -1)) if op == "max" else w.sum(axis=(-2, -1)) / (k[0] * k[1])
        for w in _windows(rows, k[0], s[0], p[0], -1)], axis=-1)
        for rows in _windows(x.values, k[1], s[1], p[1], -2)], axis=-2)
    b = built("pool.metal", f"kernel_pool_2d_{op}_f32")
    args = pack("ggml_metal_kargs_pool_2d", k0=k[0], k1=k[1], s0=s[0], s1=s[1], p0=p[0],
                p1=p[1], IH=shape[2], IW=shape[3], OH=want.shape[2], OW=want.shape[3],
                np=want.size)
    nth = min(MAX_THREADS, want.size)
    out = run(b, {0: args, 1: x, 2: new(4 * want.size)}, (-(-want.size // nth), 1, 1),
              (nth, 1, 1))
    # ggml's pool_2d: max, or the window's in-bounds sum over all k0 k1 taps.
    check(agreement, b, f"{b.kernel.name} {shape} k={k} s={s} p={p}",
          decode(out[2], "f32", want.shape), want, "numpy float64 over each window",
          dtype="float32", atol=1e-6, rtol=1e-6)


def _keys_cubic(d: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution weight at distance d, a = -0.75."""
    a, d = -0.75, np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def resampling(size: int, out: int, mode: str) -> np.ndarray:
    """The [out, size] matrix of a half-pixel-centred resampling along one axis: output i
    sits at f = (i + 1/2) size / out - 1/2 of the source. Bilinear and bicubic weigh the
    2 or 4 nearest source samples (taps past an edge taken from the edge); the
    antialiased bilinear widens the triangle to the downscaling factor and normalises."""
    f = (np.arange(out) + 0.5) * size / out - 0.5
    m = np.zeros((out, size))
    if mode == "bilinear-aa":
        support = max(1.0, size / out)
        m = np.maximum(0, 1 - np.abs(np.arange(size)[None, :] - f[:, None]) / support)
        return m / m.sum(axis=1, keepdims=True)
    lo, taps = (np.floor(f), (0, 1)) if mode == "bilinear" else (np.floor(f), (-1, 0, 1, 2))
    weight = (lambda d: np.maximum(0, 1 - np.abs(d))) if mode == "bilinear" else _keys_cubic
    for t in taps:
        src = lo + t
        np.add.at(m, (np.arange(out), np.clip(src, 0, size - 1).astype(int)), weight(src - f))
    return m


@pytest.mark.parametrize(("mode", "shape", "out_shape"), [
    ("nearest", (1, 2, 3, 4), (2, 2, 6, 12)),
    pytest.param("bilinear", (1, 2, 4, 5), (1, 2, 7, 9), marks=SLOW),
    pytest.param("bicubic", (1, 1, 5, 4), (1, 1, 8, 10), marks=SLOW),
    pytest.param("bilinear-aa", (1, 2, 9, 12), (1, 2, 4, 5), marks=SLOW),  # downscale
])
def test_upscale(agreement, mode, shape, out_shape) -> None:
    x = encoded(np.random.default_rng(17).standard_normal(shape), "f32")
    dst = encoded(np.zeros(out_shape), "f32")
    sf = [dst.ne[i] / x.ne[i] for i in range(4)]
    if mode == "nearest":  # each output index's source: floor(i / scale)
        idx = [np.floor(np.arange(o) / (o / i)).astype(int) for i, o in zip(shape, out_shape)]
        want = x.values[np.ix_(*idx)]
    else:
        rows = resampling(shape[2], out_shape[2], mode)
        cols = resampling(shape[3], out_shape[3], mode)
        want = np.einsum("oh,bchw,pw->bcop", rows, x.values, cols)
    kernel = mode.split("-")[0]
    b = built("upscale.metal", f"kernel_upscale_{kernel}_f32",
              {fc("FC_UPSCALE"): mode.endswith("-aa")})
    args = pack("ggml_metal_kargs_upscale", x.locals("0"), dst.locals(""), sf0=sf[0],
                sf1=sf[1], sf2=sf[2], sf3=sf[3], poffs=0.5)
    out = run(b, {0: args, 1: x, 2: new(dst.nbytes)}, (dst.ne[1], dst.ne[2], dst.ne[3]),
              (min(MAX_THREADS, dst.ne[0]), 1, 1))
    check(agreement, b, f"{b.kernel.name}{' antialiased' if mode.endswith('-aa') else ''} "
          f"{shape} -> {out_shape}", decode(out[2], "f32", out_shape), want,
          "numpy: nearest source / half-pixel resampling matrices", dtype="float32",
          atol=2e-6, rtol=1e-6)
