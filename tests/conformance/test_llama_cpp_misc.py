"""llama.cpp's small kernels: argmax, pad (zero and circular), arange, timestep_embedding,
count_equal after memset (misc.metal); sum_rows and mean, cumsum (a block pass, and for
rows longer than a threadgroup the passes that carry the blocks' totals; reduce.metal);
tri (tri.metal); l2_norm (norm.metal); add_id (binbcast.metal); concat (quantize.metal,
also block by block for quantised rows), each dispatched as its ggml_metal_op_* does,
against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import blocks, decode, encoded, integers

SLOW = pytest.mark.slow
EXACT = {"dtype": "float64", "atol": 0.0, "rtol": 0.0}
# float32 sums: errors relative to the sum of the terms' magnitudes.
SUMS = {"dtype": "float64", "atol": 1e-6, "rtol": 0.0}


@pytest.mark.parametrize("shape", [(3, 100), pytest.param((2, 3, 1000), marks=SLOW),
                                   pytest.param((1, 7), marks=SLOW)])
def test_argmax(agreement, shape) -> None:
    # Distinct values: the largest is unique, as the kernel's lane reduction assumes.
    g = np.random.default_rng(5)
    x = encoded(g.permutation(int(np.prod(shape))).reshape(shape) * 0.25 - 60, "f32")
    rows = int(np.prod(shape[:-1]))
    nth = 32
    while nth < x.ne[0] and nth * rows < 256:
        nth *= 2
    b = built("misc.metal", "kernel_argmax_f32")
    args = pack("ggml_metal_kargs_argmax", ne00=x.ne[0], nb01=x.nb[1])
    out = run(b, {0: args, 1: x, 2: new(4 * rows)}, (rows, 1, 1), (nth, 1, 1), 32 * 8)
    check(agreement, b, f"kernel_argmax_f32 {shape}", out[2].view(np.int32),
          np.argmax(x.values.reshape(rows, -1), axis=1).astype(np.int32), "numpy argmax",
          bitwise=True)


@pytest.mark.parametrize(("shape", "pads", "circular"), [
    ((2, 3, 5, 7), (1, 2, 0, 1, 2, 0, 0, 1), False),
    pytest.param((1, 2, 4, 6), (2, 1, 1, 2, 0, 1, 0, 0), True, marks=SLOW),
    pytest.param((1, 1, 3, 1500), (7, 9, 0, 0, 0, 0, 0, 0), False, marks=SLOW),  # 2 blocks
])
def test_pad(agreement, shape, pads, circular) -> None:
    # ggml_pad_ext: (left, right) per dimension, innermost first, as op_params 0..7.
    x = encoded(np.random.default_rng(6).standard_normal(shape), "f32")
    widths = [(pads[2 * d], pads[2 * d + 1]) for d in range(4)][::-1]
    want = np.pad(x.values, widths, mode="wrap" if circular else "constant")
    dst = encoded(np.zeros(want.shape), "f32")
    b = built("misc.metal", "kernel_pad_f32", {fc("FC_PAD"): circular})
    args = pack("ggml_metal_kargs_pad", x.locals("0"), dst.locals(""), lp0=pads[0],
                lp1=pads[2], lp2=pads[4], lp3=pads[6])
    nth = min(dst.ne[0], 64)
    groups = (-(-dst.ne[0] // 1024) * dst.ne[1], dst.ne[2], dst.ne[3])
    out = run(b, {0: args, 1: x, 2: new(dst.nbytes)}, groups, (nth, 1, 1))
    check(agreement, b, f"kernel_pad_f32 {shape} pads={pads}{' circular' if circular else ''}",
          decode(out[2], "f32", want.shape), want, "numpy pad", **EXACT)


@pytest.mark.parametrize(("n", "start", "step"), [(300, -2.5, 0.37),
                                                  pytest.param(2000, 7.0, -0.001, marks=SLOW)])
def test_arange(agreement, n, start, step) -> None:
    b = built("misc.metal", "kernel_arange_f32")
    args = pack("ggml_metal_kargs_arange", ne0=n, start=start, step=step)
    out = run(b, {0: args, 1: new(4 * n)}, (1, 1, 1), (min(MAX_THREADS, n), 1, 1))
    s, d = float(np.float32(start)), float(np.float32(step))
    # start + step i in float32: one or two roundings (a fused multiply-add or not).
    check(agreement, b, f"kernel_arange_f32 n={n} start={start} step={step}",
          decode(out[1], "f32", (n,)), s + d * np.arange(n), "numpy float64",
          dtype="float32", atol=4 * 2.0 ** -24 * (abs(s) + abs(d) * n), rtol=0.0)


@pytest.mark.parametrize(("steps", "dim", "max_period"), [
    (4, 64, 10000), pytest.param(3, 33, 1000, marks=SLOW)])  # odd dim: a zero last column
def test_timestep_embedding(agreement, steps, dim, max_period) -> None:
    t = encoded(np.random.default_rng(7).uniform(0, 50, steps), "f32")
    half = dim // 2
    freq = np.exp(-np.log(max_period) * np.arange(half) / half)
    arg = t.values[:, None] * freq[None, :]
    want = np.concatenate([np.cos(arg), np.sin(arg), np.zeros((steps, dim % 2))], axis=1)
    dst = encoded(np.zeros(want.shape), "f32")
    b = built("misc.metal", "kernel_timestep_embedding_f32")
    args = pack("ggml_metal_kargs_timestep_embedding", nb1=dst.nb[1], dim=dim,
                max_period=max_period)
    out = run(b, {0: args, 1: t, 2: new(dst.nbytes)}, (steps, 1, 1),
              (max(1, min(MAX_THREADS, half)), 1, 1))
    # float32 frequencies (exp of a rounded log) times the step: the angle's error grows
    # with it; a few ulp of the largest angle bound it.
    check(agreement, b, f"kernel_timestep_embedding_f32 steps={steps} dim={dim} "
          f"max_period={max_period}", decode(out[2], "f32", want.shape), want,
          "numpy float64", dtype="float32", atol=16 * 2.0 ** -24 * float(arg.max()), rtol=0.0)


@pytest.mark.parametrize("shape", [(3, 2, 200), pytest.param((1, 5, 3000), marks=SLOW)])
def test_count_equal(agreement, shape) -> None:
    g = np.random.default_rng(8)
    a = integers(g.integers(0, 4, shape).astype(np.int32))
    c = integers(g.integers(0, 4, shape).astype(np.int32))
    zero = built("misc.metal", "kernel_memset_i64")
    total = run(zero, {0: pack("ggml_metal_kargs_memset", val=0), 1: new(8)}, (1, 1, 1),
                (1, 1, 1))[1]
    nsg = 1
    while 32 * nsg < a.ne[0] and nsg < 32:
        nsg *= 2
    b = built("misc.metal", "kernel_count_equal_i32", {fc("FC_COUNT_EQUAL"): nsg})
    args = pack("ggml_metal_kargs_count_equal", a.locals("0"), c.locals("1"))
    out = run(b, {0: args, 1: a, 2: c, 3: total}, (a.ne[1], a.ne[2], a.ne[3]),
              (32 * nsg, 1, 1), 32 * 4)
    check(agreement, [zero, b], f"kernel_memset_i64 + kernel_count_equal_i32 {shape}",
          out[3].view(np.int64), np.array([np.sum(a.values == c.values)], np.int64),
          "numpy count of equal elements", bitwise=True)


@pytest.mark.parametrize(("shape", "mean"), [((3, 4, 96), False),
                                             pytest.param((2, 50), True, marks=SLOW),
                                             pytest.param((5, 1030), False, marks=SLOW),
                                             pytest.param((2, 3, 37), True, marks=SLOW)])
def test_sum_rows(agreement, shape, mean) -> None:
    x = encoded(np.random.default_rng(9).standard_normal(shape), "f32")
    c4 = x.ne[0] % 4 == 0
    ne00 = x.ne[0] // 4 if c4 else x.ne[0]
    op = impl_define("OP_SUM_ROWS_NUM_MEAN" if mean else "OP_SUM_ROWS_NUM_SUM_ROWS")
    b = built("reduce.metal", f"kernel_sum_rows_f32_f32{'_4' if c4 else ''}",
              {fc("FC_SUM_ROWS"): op})
    dst = encoded(np.zeros((*shape[:-1], 1)), "f32")
    args = pack("ggml_metal_kargs_sum_rows", x.locals("0"), dst.locals(""), ne00=ne00,
                ne0=1)
    nth = 32
    while nth < ne00 and nth < MAX_THREADS:
        nth *= 2
    out = run(b, {0: args, 1: x, 2: new(dst.nbytes)}, (x.ne[1], x.ne[2], x.ne[3]),
              (min(nth, ne00), 1, 1), 32 * 4 * (4 if c4 else 1))
    n = shape[-1] if mean else 1
    scale = np.abs(x.values).sum(-1, keepdims=True) / n
    check(agreement, b, f"{b.kernel.name} {'mean' if mean else 'sum'} {shape}",
          decode(out[2], "f32", dst.values.shape) / scale,
          x.values.sum(-1, keepdims=True) / n / scale,
          "numpy float64; error / sum|x|", **SUMS)


def cumsum(x) -> tuple[np.ndarray, list]:
    """ggml_metal_op_cumsum: each threadgroup scans a block of nth values of a row
    (SIMD-group prefix sums); a row longer than nth also writes each block's total to a
    scratch row after dst, which one more block pass scans in place (the same buffer at
    all three indices) and kernel_cumsum_add adds to the blocks after the first."""
    nth = 1
    while nth < x.ne[0] and 2 * nth <= MAX_THREADS:
        nth *= 2
    net0 = -(-x.ne[0] // nth)
    net = (net0, x.ne[1], x.ne[2], x.ne[3])
    nbt = (4, 4 * net0, 4 * net0 * net[1], 4 * net0 * net[1] * net[2])
    scratch = {f"net{i}": net[i] for i in range(4)} | {f"nbt{i}": nbt[i] for i in range(4)}
    blk = built("reduce.metal", "kernel_cumsum_blk_f32")
    args = pack("ggml_metal_kargs_cumsum_blk", x.locals("0"), **scratch, outb=x.ne[0] > nth)
    # The scratch row after dst: written only when the row spans several blocks.
    tmp = new(4 * int(np.prod(net)), scratch=x.ne[0] <= nth)
    out = run(blk, {0: args, 1: x, 2: tmp, 3: new(x.nbytes)},
              (net0 * x.ne[1], x.ne[2], x.ne[3]), (nth, 1, 1), 32 * 4)
    dst, parts = out[3], [blk]
    if x.ne[0] > nth:
        totals = out[2]
        args = pack("ggml_metal_kargs_cumsum_blk", **scratch, ne00=net0, ne01=net[1],
                    ne02=net[2], ne03=net[3], nb00=nbt[0], nb01=nbt[1], nb02=nbt[2],
                    nb03=nbt[3], outb=False)
        totals = run(blk, {0: args, 1: totals, 2: totals, 3: totals}, net[1:], (nth, 1, 1),
                     32 * 4)[3]
        add = built("reduce.metal", "kernel_cumsum_add_f32")
        args = pack("ggml_metal_kargs_cumsum_add", x.locals("0"), **scratch)
        dst = run(add, {0: args, 1: totals, 2: dst}, (net0 * x.ne[1], x.ne[2], x.ne[3]),
                  (nth, 1, 1))[2]
        parts.append(add)
    return decode(dst, "f32", x.values.shape), parts


@pytest.mark.parametrize("shape", [(3, 2, 300), pytest.param((2, 2500), marks=SLOW)])
def test_cumsum(agreement, shape) -> None:
    x = encoded(np.random.default_rng(10).standard_normal(shape), "f32")
    actual, parts = cumsum(x)
    scale = np.cumsum(np.abs(x.values), axis=-1)
    check(agreement, parts, " + ".join(p.kernel.name for p in parts) + f" {shape}",
          actual / scale, np.cumsum(x.values, axis=-1) / scale,
          "numpy float64; error / running sum|x|", **SUMS)


# ggml_tri_type: 0 upper with the diagonal, 1 upper, 2 lower with the diagonal, 3 lower.
_TRI = {0: lambda a: np.triu(a), 1: lambda a: np.triu(a, 1), 2: lambda a: np.tril(a),
        3: lambda a: np.tril(a, -1)}


@pytest.mark.parametrize(("gtype", "ttype", "shape"), [
    ("f32", 3, (2, 6, 6)),
    pytest.param("f32", 0, (1, 5, 40), marks=SLOW),
    pytest.param("f16", 1, (2, 7, 7), marks=SLOW),
    pytest.param("bf16", 2, (1, 9, 9), marks=SLOW),
])
def test_tri(agreement, gtype, ttype, shape) -> None:
    x = encoded(np.random.default_rng(11).standard_normal(shape), gtype)
    b = built("tri.metal", f"kernel_tri_{gtype}_{ttype}")
    args = pack("ggml_metal_kargs_tri", x.locals("0"), x.locals(""))
    nth = 32
    while nth < x.ne[0] and nth < MAX_THREADS:
        nth *= 2
    out = run(b, {0: args, 1: x, 2: new(x.nbytes)}, (x.ne[1], x.ne[2], x.ne[3]),
              (min(nth, x.ne[0]), 1, 1))
    check(agreement, b, f"kernel_tri_{gtype}_{ttype} {shape}", decode(out[2], gtype, shape),
          _TRI[ttype](x.values), "numpy triu / tril", **EXACT)


@pytest.mark.parametrize("shape", [(3, 64), pytest.param((2, 2, 37), marks=SLOW)])
def test_l2_norm(agreement, shape) -> None:
    x = encoded(np.random.default_rng(18).standard_normal(shape), "f32")
    eps = 1e-6
    c4 = x.ne[0] % 4 == 0
    b = built("norm.metal", f"kernel_l2_norm_f32_f32{'_4' if c4 else ''}")
    args = pack("ggml_metal_kargs_l2_norm", x.locals("0"), x.locals(""), eps=eps,
                ne00=x.ne[0] // 4 if c4 else x.ne[0], ne0=x.ne[0] // 4 if c4 else x.ne[0])
    nth = 32
    while nth < x.ne[0] and nth < MAX_THREADS:
        nth *= 2
    out = run(b, {0: args, 1: x, 2: new(x.nbytes)}, (x.ne[1], x.ne[2], x.ne[3]),
              (nth, 1, 1), 32 * 4)
    norm = np.sqrt((x.values ** 2).sum(-1, keepdims=True))
    check(agreement, b, f"{b.kernel.name} {shape}", decode(out[2], "f32", shape),
          x.values / np.maximum(norm, eps), "numpy float64 x / max(|x|, eps)",
          dtype="float32", atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("tokens", "used", "experts", "width"), [
    (3, 2, 4, 40), pytest.param(5, 4, 8, 1500, marks=SLOW)])
def test_add_id(agreement, tokens, used, experts, width) -> None:
    # ggml_add_id: each (token, slot) row plus the bias row of the expert it was routed to.
    g = np.random.default_rng(19)
    x = encoded(g.standard_normal((tokens, used, width)), "f32")
    bias = encoded(g.standard_normal((experts, width)), "f32")
    ids = integers(np.argsort(g.random((tokens, experts)), axis=1)[:, :used].astype(np.int32))
    b = built("binbcast.metal", "kernel_add_id")
    args = pack("ggml_metal_kargs_add_id", ne0=width, ne1=used, nb01=x.nb[1], nb02=x.nb[2],
                nb11=bias.nb[1], nb21=ids.nb[1])
    out = run(b, {0: args, 1: x, 2: bias, 3: ids, 4: new(x.nbytes)}, (used, tokens, 1),
              (min(MAX_THREADS, width), 1, 1))
    want = x.values + bias.values[ids.values.astype(int)]
    check(agreement, b, f"kernel_add_id tokens={tokens} experts={experts}/{used} "
          f"width={width}", decode(out[4], "f32", x.values.shape),
          encoded(want, "f32").values, "numpy float64, rounded once to float32", **EXACT)


@pytest.mark.parametrize(("gtype", "a_shape", "b_shape", "dim"), [
    ("f32", (2, 3, 4, 5), (2, 3, 2, 5), 1),
    pytest.param("f16", (1, 2, 3, 300), (1, 2, 3, 40), 0, marks=SLOW),
    pytest.param("i32", (2, 1, 3, 4), (2, 2, 3, 4), 2, marks=SLOW),
    pytest.param("q8_0", (2, 3, 64), (2, 3, 32), 0, marks=SLOW),  # whole blocks
])
def test_concat(agreement, gtype, a_shape, b_shape, dim) -> None:
    # `dim` counts ggml's dimensions, innermost first.
    g = np.random.default_rng(20)
    if gtype == "i32":
        a, c = (integers(g.integers(-9, 9, s).astype(np.int32)) for s in (a_shape, b_shape))
    else:
        a, c = (encoded(g.standard_normal(s), gtype) for s in (a_shape, b_shape))
    per_block = blocks(gtype)[0]  # quantised rows are concatenated block by block
    want = np.concatenate([a.values, c.values], axis=a.values.ndim - 1 - dim)
    dst = encoded(np.zeros(want.shape), gtype)
    b = built("quantize.metal", f"kernel_concat_{gtype}")
    ne0 = dst.ne[0] // per_block
    args = pack("ggml_metal_kargs_concat", a.locals("0"), c.locals("1"), dst.locals(""),
                ne00=a.ne[0] // per_block, ne10=c.ne[0] // per_block, ne0=ne0, dim=dim)
    nth = min(256, ne0)
    nrptg = 1
    if nth < 256:
        nrptg = min(-(-256 // nth), dst.ne[1])
        if nrptg * nth > 256:
            nrptg = 256 // nth
    out = run(b, {0: args, 1: a, 2: c, 3: new(dst.nbytes)},
              (-(-dst.ne[1] // nrptg), dst.ne[2], dst.ne[3]), (nth, nrptg, 1))
    check(agreement, b, f"kernel_concat_{gtype} {a_shape} + {b_shape} dim={dim}",
          decode(out[3], gtype, want.shape), want, "numpy concatenate (decoded values equal)",
          **EXACT)

