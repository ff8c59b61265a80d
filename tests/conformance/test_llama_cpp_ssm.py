"""llama.cpp's ssm.metal: the depthwise causal convolution of Mamba (ssm_conv, its batched
form for prefill) and the selective scan (ssm_scan, Mamba-2's scalar decay per head and
Mamba-1's decay per state), dispatched as ggml_metal_op_ssm_conv and ggml_metal_op_ssm_scan
do, against the recurrences written in numpy float64.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import Tensor, decode, encoded, integers

SLOW = pytest.mark.slow
REFERENCE = "numpy float64"
F32 = {"dtype": "float32", "atol": 1e-5, "rtol": 1e-4}


def _batch_size(tokens: int) -> int:
    """The threads a threadgroup of the batched kernel takes (ggml_metal_op_ssm_conv)."""
    for above, size in ((128, 256), (64, 128), (32, 64), (16, 32), (8, 16), (4, 8)):
        if tokens > above:
            return size
    return 2


def ssm_conv(x: Tensor, w: Tensor, silu: bool) -> tuple[np.ndarray, list]:
    """x [seqs, channels, d_conv - 1 + tokens], w [channels, d_conv] -> dst [seqs, tokens,
    channels]: kernel_ssm_conv_f32_f32[_batched][_4], one thread a token."""
    nc, channels = w.ne[0], w.ne[1]
    tokens, seqs = x.ne[0] - nc + 1, x.ne[2]
    dst = encoded(np.zeros((seqs, tokens, channels)), "f32")
    suffix = "_4" if nc % 4 == 0 else ""
    constants = {fc("FC_SSM_CONV", 1): silu, fc("FC_SSM_CONV", 2): nc}
    if tokens > 1:
        bs = _batch_size(tokens)
        b = built("ssm.metal", f"kernel_ssm_conv_f32_f32_batched{suffix}",
                  {**constants, fc("FC_SSM_CONV", 0): bs})
        grid, threads = (channels, -(-tokens // bs), seqs), (bs, 1, 1)
    else:
        b = built("ssm.metal", f"kernel_ssm_conv_f32_f32{suffix}", constants)
        grid, threads = (channels, tokens, seqs), (1, 1, 1)
    args = pack("ggml_metal_kargs_ssm_conv", x.locals("0"), w.locals("1"), dst.locals(""))
    out = run(b, {0: args, 1: x, 2: w, 3: new(dst.nbytes)}, grid, threads)
    return decode(out[3], "f32", dst.values.shape), [b]


def conv_reference(x: Tensor, w: Tensor, silu: bool) -> np.ndarray:
    """y[s, t, c] = sum_k x[s, c, t + k] w[c, k], then x / (1 + e^-x) when fused with silu."""
    xs, ws = x.values, w.values
    nc = ws.shape[1]
    tokens = xs.shape[2] - nc + 1
    y = np.stack([(xs[:, :, t:t + nc] * ws[None]).sum(-1) for t in range(tokens)], axis=1)
    return y / (1 + np.exp(-y)) if silu else y


@pytest.mark.parametrize(("seqs", "channels", "tokens", "d_conv", "silu"), [
    (2, 48, 7, 4, True),                                 # batched, float4 taps
    pytest.param(1, 64, 1, 4, False, marks=SLOW),         # decode: one token
    pytest.param(3, 16, 40, 3, False, marks=SLOW),        # batched, scalar taps
])
def test_ssm_conv(agreement, seqs, channels, tokens, d_conv, silu) -> None:
    g = np.random.default_rng(tokens * 10 + d_conv)
    x = encoded(g.standard_normal((seqs, channels, d_conv - 1 + tokens)), "f32")
    w = encoded(g.standard_normal((channels, d_conv)), "f32")
    actual, parts = ssm_conv(x, w, silu)
    name = f"kernel_ssm_conv_f32_f32 seqs={seqs} channels={channels} tokens={tokens} " \
           f"d_conv={d_conv}{' silu' if silu else ''}"
    check(agreement, parts, name, actual, conv_reference(x, w, silu), REFERENCE, **F32)


def _scan_inputs(d_state: int, head_dim: int, heads: int, groups: int, tokens: int,
                 seqs: int, decay_per_state: bool) -> dict[str, Tensor]:
    """ggml_ssm_scan's operands: states [seqs, heads, head_dim, d_state], x [seqs, tokens,
    heads, head_dim], dt [seqs, tokens, heads], A [heads, 1 or d_state] (negative), B and
    C [seqs, tokens, groups, d_state], and which state each sequence starts from."""
    g = np.random.default_rng(d_state + tokens)
    return {
        "s": encoded(g.standard_normal((seqs, heads, head_dim, d_state)) * 0.5, "f32"),
        "x": encoded(g.standard_normal((seqs, tokens, heads, head_dim)), "f32"),
        "dt": encoded(g.standard_normal((seqs, tokens, heads)), "f32"),
        "A": encoded(-np.exp(g.standard_normal((heads, d_state if decay_per_state else 1))),
                     "f32"),
        "B": encoded(g.standard_normal((seqs, tokens, groups, d_state)), "f32"),
        "C": encoded(g.standard_normal((seqs, tokens, groups, d_state)), "f32"),
        "ids": integers(np.arange(seqs)[::-1].copy()),
    }


def scan_reference(t: dict[str, Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Per head h (B and C of group h // (heads / groups)): dt' = softplus(dt),
    S <- S exp(dt' A) + dt' x B^T, y = S C. Returns y [seqs, tokens, heads, head_dim] and
    the last states [seqs, heads, head_dim, d_state]; sequence i starts from state ids[i]."""
    s0, x, dt = t["s"].values, t["x"].values, t["dt"].values
    a, b, c, ids = t["A"].values, t["B"].values, t["C"].values, t["ids"].values.astype(int)
    seqs, tokens, heads, _ = x.shape
    per_group = heads // b.shape[2]
    y, states = np.zeros_like(x), np.zeros_like(s0)
    for i in range(seqs):
        for h in range(heads):
            s = s0[ids[i], h]
            for k in range(tokens):
                d = dt[i, k, h] if dt[i, k, h] > 20 else np.log1p(np.exp(dt[i, k, h]))
                bg, cg = b[i, k, h // per_group], c[i, k, h // per_group]
                s = s * np.exp(d * a[h])[None, :] + np.outer(x[i, k, h] * d, bg)
                y[i, k, h] = s @ cg
            states[i, h] = s
    return y, states


def ssm_scan(t: dict[str, Tensor]) -> tuple[np.ndarray, np.ndarray, list]:
    """kernel_ssm_scan_f32: a thread per state element, d_state threads a threadgroup, a
    threadgroup per (head dimension, head, sequence); dst holds y, then the last states
    (one snapshot, K = 1). The host picks the simdgroup_matrix kernel only for head_dim
    OP_SSM_SCAN_SSD_HD with a whole chunk of tokens and a scalar decay."""
    s, x = t["s"], t["x"]
    d_state, head_dim, heads, seqs = s.ne
    tokens = x.ne[2]
    assert head_dim != impl_define("OP_SSM_SCAN_SSD_HD") or \
        tokens < impl_define("OP_SSM_SCAN_SSD_CS") or t["A"].ne[0] != 1
    nsg = -(-d_state // 32)
    b = built("ssm.metal", "kernel_ssm_scan_f32")
    locals_ = {**s.locals("0"), **x.locals("1"), **t["dt"].locals("2"), **t["A"].locals("3"),
               **t["B"].locals("4"), **t["C"].locals("5")}
    n_y = x.nbytes // 4
    args = pack("ggml_metal_kargs_ssm_scan", locals_, d_state=d_state, d_inner=head_dim,
                n_head=heads, n_group=t["B"].ne[1], n_seq_tokens=tokens,
                n_seq_tokens_total=tokens, token_offset=0, n_seqs=seqs, K=1, s_off=4 * n_y,
                ns12=x.nb[2] // x.nb[0], ns21=t["dt"].nb[1] // t["dt"].nb[0],
                ns42=t["B"].nb[2] // t["B"].nb[0], ns52=t["C"].nb[2] // t["C"].nb[0],
                nb0=4)
    size = 4 * n_y + s.nbytes
    out = run(b, {0: args, 1: s, 2: x, 3: t["dt"], 4: t["A"], 5: t["B"], 6: t["C"],
                  7: t["ids"], 8: new(size)}, (head_dim, heads, seqs), (d_state, 1, 1),
              -(-(32 + 2) * 4 * nsg // 16) * 16)
    values = decode(out[8], "f32", (size // 4,))
    return (values[:n_y].reshape(x.values.shape), values[n_y:].reshape(s.values.shape), [b])


@pytest.mark.parametrize(("d_state", "head_dim", "heads", "groups", "tokens", "seqs",
                          "per_state"), [
    (64, 16, 4, 2, 5, 2, False),                        # Mamba-2: a decay per head
    pytest.param(16, 8, 2, 1, 3, 1, True, marks=SLOW),  # Mamba-1: a decay per state
    pytest.param(128, 32, 2, 2, 40, 1, False, marks=SLOW),  # 4 SIMD-groups: tokens 4 at a time
])
def test_ssm_scan(agreement, d_state, head_dim, heads, groups, tokens, seqs,
                  per_state) -> None:
    t = _scan_inputs(d_state, head_dim, heads, groups, tokens, seqs, per_state)
    y, states, parts = ssm_scan(t)
    want_y, want_states = scan_reference(t)
    name = f"kernel_ssm_scan_f32 d_state={d_state} head_dim={head_dim} heads={heads}/" \
           f"{groups} tokens={tokens} seqs={seqs}{' A per state' if per_state else ''}"
    check(agreement, parts, name, np.concatenate([y.ravel(), states.ravel()]),
          np.concatenate([want_y.ravel(), want_states.ravel()]), REFERENCE, **F32)


def _scan_args(t: dict[str, Tensor], **fields: int) -> bytes:
    """ggml_metal_kargs_ssm_scan as ggml_metal_op_ssm_scan fills it (one snapshot, K = 1);
    `fields` are what the host sets per dispatch (tokens of this part, its offset)."""
    s, x = t["s"], t["x"]
    locals_ = {**s.locals("0"), **x.locals("1"), **t["dt"].locals("2"), **t["A"].locals("3"),
               **t["B"].locals("4"), **t["C"].locals("5")}
    return pack("ggml_metal_kargs_ssm_scan", locals_, d_state=s.ne[0], d_inner=s.ne[1],
                n_head=s.ne[2], n_group=t["B"].ne[1], n_seq_tokens_total=x.ne[2], n_seqs=s.ne[3],
                K=1, s_off=x.nbytes, ns12=x.nb[2] // x.nb[0],
                ns21=t["dt"].nb[1] // t["dt"].nb[0], ns42=t["B"].nb[2] // t["B"].nb[0],
                ns52=t["C"].nb[2] // t["C"].nb[0], nb0=4, **fields)


def ssm_scan_chunked(t: dict[str, Tensor]) -> tuple[np.ndarray, np.ndarray, list]:
    """What the host runs for Mamba-2 heads of OP_SSM_SCAN_SSD_HD channels, a scalar decay
    and a whole chunk of tokens or more: kernel_ssm_scan_ssd_mma_f32 (simdgroup_matrix
    chunks of OP_SSM_SCAN_SSD_CS tokens, OP_SSM_SCAN_SSD_NSG SIMD-groups, a threadgroup per
    (head, sequence)) over the whole chunks, then kernel_ssm_scan_f32_tail over the rest,
    starting from the states the first wrote into dst."""
    s, x = t["s"], t["x"]
    d_state, head_dim, heads, seqs = s.ne
    tokens, chunk = x.ne[2], impl_define("OP_SSM_SCAN_SSD_CS")
    assert head_dim == impl_define("OP_SSM_SCAN_SSD_HD") and t["A"].ne[0] == 1
    assert d_state % 8 == 0 and tokens >= chunk
    whole = tokens // chunk * chunk
    nsg = impl_define("OP_SSM_SCAN_SSD_NSG")
    mma = built("ssm.metal", "kernel_ssm_scan_ssd_mma_f32")
    smem = (3 * chunk + chunk * head_dim + nsg * 8 * chunk + nsg * 2 * 8 * 8) * 4
    buffers = {1: s, 2: x, 3: t["dt"], 4: t["A"], 5: t["B"], 6: t["C"], 7: t["ids"]}
    size = x.nbytes + s.nbytes
    # With a tail, the chunked kernel leaves the tail tokens' y to the tail kernel.
    dst = new(size, scratch=whole < tokens)
    out = run(mma, {0: _scan_args(t, n_seq_tokens=whole), **buffers, 8: dst},
              (1, heads, seqs), (nsg * 32, 1, 1), smem)[8]
    parts = [mma]
    if whole < tokens:
        tail = built("ssm.metal", "kernel_ssm_scan_f32_tail")
        groups = -(-d_state // 32)
        out = run(tail, {0: _scan_args(t, n_seq_tokens=tokens - whole, token_offset=whole),
                         **buffers, 8: out}, (head_dim, heads, seqs), (d_state, 1, 1),
                  -(-(32 + 2) * 4 * groups // 16) * 16)[8]
        parts.append(tail)
    values = decode(out, "f32", (size // 4,))
    n_y = x.nbytes // 4
    return values[:n_y].reshape(x.values.shape), values[n_y:].reshape(s.values.shape), parts


@pytest.mark.parametrize(("d_state", "heads", "groups", "tokens", "seqs"), [
    (16, 2, 1, 64, 1),                                  # one chunk
    pytest.param(128, 4, 2, 128, 2, marks=SLOW),        # two chunks carry the state
    pytest.param(64, 2, 2, 70, 1, marks=SLOW),          # a chunk, then the tail kernel
])
def test_ssm_scan_ssd_mma(agreement, d_state, heads, groups, tokens, seqs) -> None:
    head_dim = impl_define("OP_SSM_SCAN_SSD_HD")
    t = _scan_inputs(d_state, head_dim, heads, groups, tokens, seqs, False)
    # Steps as Mamba-2 takes them: softplus(dt) in [0.001, 0.1], its initial range.
    step = np.random.default_rng(tokens).uniform(1e-3, 0.1, t["dt"].values.shape)
    t["dt"] = encoded(np.log(np.expm1(step)), "f32")
    y, states, parts = ssm_scan_chunked(t)
    want = np.concatenate([a.ravel() for a in scan_reference(t)])
    # The chunked form sums the same terms in another order: errors are measured relative
    # to the sum of the terms' magnitudes (the scan of |s0|, |x|, |B|, |C|). Its decays are
    # exp of differences of the chunk's cumulative sum of dt A in float32, which carry that
    # sum's rounding (an ulp of max |cumsum|) into every term.
    scale = np.concatenate([a.ravel() for a in scan_reference(
        {k: replace(v, values=np.abs(v.values)) if k in "s x B C" else v
         for k, v in t.items()})])
    chunk = impl_define("OP_SSM_SCAN_SSD_CS")
    decay = np.log1p(np.exp(t["dt"].values)) * t["A"].values[:, 0]
    whole = tokens // chunk * chunk
    cumsum = decay[:, :whole].reshape(seqs, -1, chunk, heads).cumsum(axis=2)
    atol = 2e-6 + 2 * 2.0 ** -24 * float(np.abs(cumsum).max())
    name = " + ".join(p.kernel.name for p in parts) + f" d_state={d_state} head_dim=" \
        f"{head_dim} heads={heads}/{groups} tokens={tokens} seqs={seqs}"
    check(agreement, parts, name, np.concatenate([y.ravel(), states.ravel()]) / scale,
          want / scale, REFERENCE + "; error / sum|terms|, band 2e-6 + 2 ulp of the "
          "chunk's largest |cumsum dt A|", dtype="float64", atol=round(atol, 9), rtol=0.0)
