"""llama.cpp's flash attention: the tiled simdgroup_matrix kernel (fa_*.metal, with the
mask-block scan and the KV padding pass of fa_aux.metal) and the vector kernel for few
queries (fa_vec_*.metal, its 32 workgroups joined by the reduce kernel), dispatched as
ggml_metal_op_flash_attn_ext does, against attention written in numpy float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import Tensor, decode, encoded

SLOW = pytest.mark.slow
REFERENCE = "numpy float64 attention, Q rounded to half as the kernels stage it"
TOLERANCE = {"dtype": "float32", "atol": 2e-3, "rtol": 2e-3}  # half K, V and P tiles
# What the host binds for the padding and mask-block buffers when it runs no pass to fill
# them (the kernels read them only under has_kvpad / has_mask).
_UNUSED = np.zeros(32, np.uint8)


@dataclass(frozen=True)
class Attention:
    q: Tensor      # f32 [batch, heads, n_q, dk]
    k: Tensor      # [batch, kv_heads, n_kv, dk]
    v: Tensor      # [batch, kv_heads, n_kv, dv]
    mask: Tensor | None   # f16 [1, 1, n_q, n_kv]
    sinks: Tensor | None  # f32 [heads]
    scale: float
    max_bias: float

    def locals(self) -> dict[str, int]:
        """The tensors' GGML_TENSOR_LOCALS and the derived values every kernel's args take."""
        m = self.mask or self.q
        out = {**self.q.locals("0"), **self.k.locals("1"), **self.v.locals("2"),
               **m.locals("3"), "ne_12_2": self.k.ne[2], "ne_12_3": self.k.ne[3]}
        n_head_log2 = 1 << int(np.floor(np.log2(self.q.ne[2])))
        out.update(scale=self.scale, max_bias=self.max_bias, n_head_log2=n_head_log2,
                   m0=2.0 ** (-self.max_bias / n_head_log2),
                   m1=2.0 ** (-self.max_bias / 2 / n_head_log2), logit_softcap=0.0,
                   ns10=self.k.nb[1] // self.k.nb[0], ns20=self.v.nb[1] // self.v.nb[0])
        return out

    def dst(self) -> Tensor:
        """dst [batch, n_q, heads, dv] (ggml's flash_attn_ext result layout)."""
        b, h, n_q, _ = self.q.values.shape
        return encoded(np.zeros((b, n_q, h, self.v.ne[0])), "f32")

    def flags(self) -> dict[int, bool]:
        """has_mask, has_sinks, has_bias, has_scap at offsets 0..3."""
        return dict(enumerate([self.mask is not None, self.sinks is not None,
                               self.max_bias != 0.0, False]))


def _pad(a: Attention, ncpsg: int, reserve: int) -> tuple[Tensor | np.ndarray, list]:
    """kernel_flash_attn_ext_pad: the last partial chunk of K, V (and the mask) copied to
    a scratch buffer, padded to ncpsg cache items; the host reserves it for 64 items."""
    k, v, m = a.k, a.v, a.mask
    size = reserve * (k.nb[1] * k.ne[2] * k.ne[3] + v.nb[1] * v.ne[2] * v.ne[3]
                      + (2 * m.ne[1] * m.ne[2] * m.ne[3] if m else 0))
    b = built("fa_aux.metal", "kernel_flash_attn_ext_pad",
              {fc("FC_FLASH_ATTN_EXT_PAD", 0): m is not None,
               fc("FC_FLASH_ATTN_EXT_PAD", 25): ncpsg})
    args = pack("ggml_metal_kargs_flash_attn_ext_pad", a.locals())
    groups = (ncpsg, max(k.ne[2], m.ne[2] if m else 1), max(k.ne[3], m.ne[3] if m else 1))
    out = run(b, {0: args, 1: k, 2: v, 3: m or a.q, 4: new(size, scratch=True)}, groups,
              (32, 1, 1))
    return out[4], [b]


def _blocks(a: Attention, nqptg: int, ncpsg: int) -> tuple[np.ndarray, list]:
    """kernel_flash_attn_ext_blk: per (queries x cache items) block of the mask, whether
    it is all -inf (skipped), all zero, or mixed."""
    m = a.mask
    nblk1, nblk0 = -(-a.q.ne[1] // nqptg), -(-m.ne[0] // ncpsg)
    b = built("fa_aux.metal", "kernel_flash_attn_ext_blk",
              {fc("FC_FLASH_ATTN_EXT_BLK", 24): nqptg, fc("FC_FLASH_ATTN_EXT_BLK", 25): ncpsg})
    args = pack("ggml_metal_kargs_flash_attn_ext_blk", a.locals())
    size = -(-nblk0 * nblk1 * m.ne[2] * m.ne[3] // 32) * 32
    out = run(b, {0: args, 1: m, 2: new(size, scratch=True)},
              (nblk0, nblk1, m.ne[2] * m.ne[3]), (32, 1, 1))
    return out[2], [b]


def tiled(a: Attention) -> tuple[np.ndarray, list]:
    """The half8x8 kernel: 8 queries per threadgroup, 64 cache items per SIMD-group, 4
    SIMD-groups (8 from dk 512)."""
    nqptg, ncpsg = impl_define("OP_FLASH_ATTN_EXT_NQPSG"), impl_define("OP_FLASH_ATTN_EXT_NCPSG")
    dk, dv, n_kv = a.k.ne[0], a.v.ne[0], a.k.ne[1]
    kvpad = n_kv % ncpsg != 0
    parts: list = []
    pad, blk = _UNUSED, _UNUSED
    if kvpad:
        pad, parts = _pad(a, ncpsg, ncpsg)
    if a.mask is not None:
        blk, more = _blocks(a, nqptg, ncpsg)
        parts += more
    quantised = a.k.gtype not in ("f16", "bf16", "f32")
    nsg = 8 if dk >= 512 else 4
    smem_half = nqptg * (dk + 2 * (-(-dv // 64) * 64) + 4 * ncpsg) + quantised * 16 * 32 * nsg
    bc_mask = a.mask is not None and a.mask.ne[1] % 8 != 0
    flags = {fc("FC_FLASH_ATTN_EXT", i): f for i, f in a.flags().items()}
    flags.update({fc("FC_FLASH_ATTN_EXT", 4): kvpad, fc("FC_FLASH_ATTN_EXT", 10): bc_mask,
                  fc("FC_FLASH_ATTN_EXT", 20): a.k.nb[1] // a.k.nb[0],
                  fc("FC_FLASH_ATTN_EXT", 21): a.v.nb[1] // a.v.nb[0],
                  fc("FC_FLASH_ATTN_EXT", 22): nsg})
    b = built(f"fa_{a.k.gtype}.metal", f"kernel_flash_attn_ext_{a.k.gtype}_dk{dk}_dv{dv}",
              flags)
    dst = a.dst()
    args = pack("ggml_metal_kargs_flash_attn_ext", a.locals(), dst.locals(""))
    out = run(b, {0: args, 1: a.q, 2: a.k, 3: a.v, 4: a.mask or a.q, 5: a.sinks or a.q,
                  6: pad, 7: blk, 8: new(dst.nbytes)},
              (-(-a.q.ne[1] // nqptg), a.q.ne[2], a.q.ne[3]), (32, nsg, 1),
              -(-smem_half * 2 // 16) * 16)
    return decode(out[8], "f32", dst.values.shape), [*parts, b]


def vector(a: Attention) -> tuple[np.ndarray, list]:
    """The half4x4 kernel for under 20 queries: one query per threadgroup (the baseline
    configuration ggml-metal-tuning picks for under 1024 cache items or a GPU family its
    table does not know), 32 workgroups over the cache, SIMD-groups doubling while
    2*32*nsg*32 < n_kv; then kernel_flash_attn_ext_vec_reduce joins the workgroups'
    partial results."""
    ncpsg, nwg, nqptg = impl_define("OP_FLASH_ATTN_EXT_VEC_NCPSG"), 32, 1
    dk, dv, n_kv = a.k.ne[0], a.v.ne[0], a.k.ne[1]
    kvpad = n_kv % ncpsg != 0
    parts: list = []
    pad = _UNUSED
    if kvpad:
        pad, parts = _pad(a, ncpsg, impl_define("OP_FLASH_ATTN_EXT_NCPSG"))
    nsg = 1
    while 2 * nwg * nsg * ncpsg < n_kv and nsg < 4:
        nsg *= 2
    smem_half = (-(-dk // 128) * 128 + 4 * ncpsg + 2 * (-(-dv // 128) * 128)) * nqptg * nsg
    flags = {fc("FC_FLASH_ATTN_EXT_VEC", i): f for i, f in a.flags().items()}
    flags.update({fc("FC_FLASH_ATTN_EXT_VEC", 4): kvpad, fc("FC_FLASH_ATTN_EXT_VEC", 5): False,
                  fc("FC_FLASH_ATTN_EXT_VEC", 20): a.k.nb[1] // a.k.nb[0],
                  fc("FC_FLASH_ATTN_EXT_VEC", 21): a.v.nb[1] // a.v.nb[0],
                  fc("FC_FLASH_ATTN_EXT_VEC", 22): nsg, fc("FC_FLASH_ATTN_EXT_VEC", 23): nwg})
    b = built(f"fa_vec_{a.k.gtype}.metal", f"kernel_flash_attn_ext_vec_{a.k.gtype}_dk{dk}_dv{dv}",
              flags)
    dst = a.dst()
    rows = dst.ne[1] * dst.ne[2] * dst.ne[3]
    args = pack("ggml_metal_kargs_flash_attn_ext_vec", a.locals(), dst.locals(""),
                n_kv_max_padded=0)
    out = run(b, {0: args, 1: a.q, 2: a.k, 3: a.v, 4: a.mask or a.q, 5: a.sinks or a.q,
                  6: pad, 7: new(4 * rows * nwg * (dv + 2)), 8: a.q},
              (-(-a.q.ne[1] // nqptg), a.q.ne[2], a.q.ne[3] * nwg), (32, nsg, 1),
              -(-smem_half * 2 // 16) * 16)
    reduce = built("fa_aux.metal", "kernel_flash_attn_ext_vec_reduce",
                   {fc("FC_FLASH_ATTN_EXT_VEC_REDUCE", 0): dv,
                    fc("FC_FLASH_ATTN_EXT_VEC_REDUCE", 1): nwg})
    done = run(reduce, {0: pack("ggml_metal_kargs_flash_attn_ext_vec_reduce", nrows=rows),
                        1: out[7], 2: new(dst.nbytes)}, (rows, 1, 1), (32 * nwg, 1, 1))
    return decode(done[2], "f32", dst.values.shape), [*parts, b, reduce]


def reference(a: Attention) -> np.ndarray:
    """softmax(scale q k^T + slope_h mask) v per head (grouped-query: head h reads kv head
    h // (heads / kv_heads)), a sink logit per head joining the normaliser only; as
    dst [batch, n_q, heads, dv]."""
    q = a.q.values.astype(np.float16).astype(np.float64)
    k, v = a.k.values, a.v.values
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
    s = a.scale * q @ np.swapaxes(k, -1, -2)
    if a.mask is not None:
        h = np.arange(heads)
        n_log2 = 1 << int(np.floor(np.log2(heads)))
        slope = np.ones(heads)
        if a.max_bias:
            m0, m1 = 2.0 ** (-a.max_bias / n_log2), 2.0 ** (-a.max_bias / 2 / n_log2)
            slope = np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))
        s = s + slope[None, :, None, None] * a.mask.values[..., :q.shape[2], :]
    top = s.max(axis=-1, keepdims=True)
    if a.sinks is not None:
        top = np.maximum(top, a.sinks.values[None, :, None, None])
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    if a.sinks is not None:
        total = total + np.exp(a.sinks.values[None, :, None, None] - top)
    return np.swapaxes((p / total) @ v, 1, 2)


def _attention(kv_type: str, heads: int, kv_heads: int, n_q: int, n_kv: int, d: int, *,
               mask: bool = True, sinks: bool = False, max_bias: float = 0.0) -> Attention:
    g = np.random.default_rng(n_q * 100 + n_kv)
    q = encoded(g.standard_normal((1, heads, n_q, d)), "f32")
    k = encoded(g.standard_normal((1, kv_heads, n_kv, d)), kv_type)
    v = encoded(g.standard_normal((1, kv_heads, n_kv, d)), kv_type)
    m = None
    if mask:
        # causal: query i sees the cache up to position n_kv - n_q + i; plus a bias
        values = np.zeros((1, 1, n_q, n_kv))
        for i in range(n_q):
            values[..., i, n_kv - n_q + i + 1:] = -np.inf
        values += g.standard_normal(values.shape) * 0.5
        m = encoded(values, "f16")
    s = encoded(g.standard_normal(heads), "f32") if sinks else None
    return Attention(q, k, v, m, s, 1 / np.sqrt(d), max_bias)


def _described(extra: dict) -> str:
    """A case's options as the report names them: " no mask", " sinks", " max_bias=8"."""
    words = {"mask": lambda v: "" if v else " no mask", "sinks": lambda v: " sinks" * v,
             "max_bias": lambda v: f" max_bias={v:g}"}
    return "".join(words[k](v) for k, v in extra.items())


@pytest.mark.parametrize(("kv_type", "heads", "kv_heads", "n_q", "n_kv", "d", "extra"), [
    ("f16", 4, 2, 24, 128, 64, {}),
    pytest.param("f16", 2, 2, 20, 100, 64, {"sinks": True}, marks=SLOW),     # KV padding
    pytest.param("f16", 4, 4, 33, 64, 128, {"max_bias": 8.0}, marks=SLOW),  # ALiBi, bc_mask
    pytest.param("q8_0", 2, 1, 24, 128, 64, {}, marks=SLOW),                # quantised KV
    pytest.param("f16", 2, 1, 24, 64, 64, {"mask": False}, marks=SLOW),
])
def test_flash_attn_ext_tiled(agreement, kv_type, heads, kv_heads, n_q, n_kv, d, extra) -> None:
    a = _attention(kv_type, heads, kv_heads, n_q, n_kv, d, **extra)
    actual, parts = tiled(a)
    name = f"kernel_flash_attn_ext_{kv_type}_dk{d}_dv{d} heads={heads}/{kv_heads} " \
           f"n_q={n_q} n_kv={n_kv}{_described(extra)}"
    check(agreement, parts, name, actual, reference(a), REFERENCE, **TOLERANCE)


@pytest.mark.parametrize(("kv_type", "heads", "kv_heads", "n_q", "n_kv", "d", "extra"), [
    ("f16", 4, 2, 1, 256, 64, {}),
    pytest.param("f16", 2, 2, 3, 70, 64, {"sinks": True, "max_bias": 8.0}, marks=SLOW),
    pytest.param("q8_0", 4, 4, 2, 96, 64, {}, marks=SLOW),
    pytest.param("f32", 2, 2, 1, 64, 64, {"mask": False}, marks=SLOW),
    # Head size 128 (one lane per head element: lane 0 rewrites the scores the others
    # have just read), and 2 and 4 SIMD-groups per threadgroup (their reduce reads and
    # rewrites the sums and maxima the same way): right only with the SIMD-group's
    # threadgroup accesses in lockstep, as on the GPU.
    pytest.param("f16", 2, 2, 1, 256, 128, {}, marks=SLOW),
    pytest.param("f16", 2, 2, 1, 2100, 64, {}, marks=SLOW),
    pytest.param("q8_0", 2, 1, 2, 4200, 64, {}, marks=SLOW),
])
def test_flash_attn_ext_vec(agreement, kv_type, heads, kv_heads, n_q, n_kv, d, extra) -> None:
    a = _attention(kv_type, heads, kv_heads, n_q, n_kv, d, **extra)
    actual, parts = vector(a)
    name = f"kernel_flash_attn_ext_vec_{kv_type}_dk{d}_dv{d} heads={heads}/{kv_heads} " \
           f"n_q={n_q} n_kv={n_kv}{_described(extra)}"
    check(agreement, parts, name, actual, reference(a), REFERENCE, **TOLERANCE)
