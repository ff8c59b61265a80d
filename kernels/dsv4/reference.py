"""Float64 numpy oracles of the DeepSeek-V4 operations, written from their definitions
(the notebook states each one in math). They share nothing with the kernels' layouts
beyond the tensors' shapes.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def float64(x) -> np.ndarray:
    """Any array (mx.array in any dtype, numpy, scalar) as float64 numpy."""
    if isinstance(x, mx.array):
        x = np.array(x.astype(mx.float32))  # exact for float16 and bfloat16
    return np.asarray(x, dtype=np.float64)


# --- MoE router ------------------------------------------------------------------------------


def softplus(z: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, z)


def rank_order(keys: np.ndarray) -> np.ndarray:
    """Indices that sort the last axis by key, largest first; equal keys by index."""
    return np.argsort(-keys, axis=-1, kind="stable")


def router(x, gate, bias, route_scale: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """sqrt-softplus router with bias correction ("noaux_tc").

    scores = sqrt(softplus(x gate^T)); the experts with the top_k largest scores + bias
    are selected (the bias steers selection only); their weights are the *unbiased*
    scores normalised over the selected experts, times route_scale. Returns
    (expert ids [tokens, top_k] int32, in rank order, weights [tokens, top_k])."""
    scores = np.sqrt(softplus(float64(x) @ float64(gate).T))
    ids = rank_order(scores + float64(bias))[:, :top_k]
    chosen = np.take_along_axis(scores, ids, axis=-1)
    weights = chosen / chosen.sum(axis=-1, keepdims=True) * float(route_scale)
    return ids.astype(np.int32), weights


def selection_margin(x, gate, bias, top_k: int) -> float:
    """The smallest gap, over tokens, between the k-th and (k+1)-th biased score: a kernel
    computing in float32 selects the oracle's experts when this is well above rounding."""
    keys = np.sqrt(softplus(float64(x) @ float64(gate).T)) + float64(bias)
    ordered = -np.sort(-keys, axis=-1)
    return float((ordered[:, top_k - 1] - ordered[:, top_k]).min())


# --- partial RoPE ----------------------------------------------------------------------------


def rope_angles(positions, rope_dims: int, base: float) -> np.ndarray:
    """theta[t, i] = position_t * base^(-2i / rope_dims), i < rope_dims / 2."""
    inv_freq = base ** (-np.arange(0, rope_dims, 2, dtype=np.float64) / rope_dims)
    return np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]


def partial_rope(x, positions, rope_dims: int, base: float, inverse: bool = False):
    """x [tokens, heads, D]: the first D - rope_dims features pass through; the last
    rope_dims, read as rope_dims/2 complex numbers (x[2i] + i x[2i+1]), are multiplied by
    e^{i theta} (forward) or e^{-i theta} (inverse)."""
    x = float64(x)
    out = x.copy()
    theta = rope_angles(positions, rope_dims, base)[:, None, :]  # [tokens, 1, R/2]
    if inverse:
        theta = -theta
    tail = x[..., x.shape[-1] - rope_dims:]
    z = (tail[..., 0::2] + 1j * tail[..., 1::2]) * np.exp(1j * theta)
    out[..., x.shape[-1] - rope_dims::2] = z.real
    out[..., x.shape[-1] - rope_dims + 1::2] = z.imag
    return out


# --- lightning indexer -----------------------------------------------------------------------


def indexer_score(q, k, w) -> np.ndarray:
    """score[s, t] = sum_h w[s, h] ReLU(q[s, h] . k[t, h']) with q [S, H, Dk],
    k [T, KH, Dk] (KH = 1: one key shared by every head, else KH = H) and w [S, H]."""
    q, k, w = float64(q), float64(k), float64(w)
    if k.shape[1] == 1:
        k = np.broadcast_to(k, (k.shape[0], q.shape[1], k.shape[2]))
    dots = np.einsum("shd,thd->sht", q, k)
    return np.einsum("sh,sht->st", w, np.maximum(dots, 0.0))


def top_k(scores, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k largest scores, largest first, equal scores by smaller index.
    Returns (indices int32, values as given)."""
    s = np.asarray(scores)
    ids = rank_order(float64(s))[..., :k]
    return ids.astype(np.int32), np.take_along_axis(s, ids, axis=-1)


# --- CSA / HCA compressor pool ----------------------------------------------------------------


def compressor_pool(kv, gate, ape, rate: int, overlap: bool) -> np.ndarray:
    """Compress every `rate` tokens into one entry by a softmax-gated pool with an
    absolute position embedding (APE) added to the gate scores.

    HCA (overlap False): kv, gate [tokens, D], ape [rate, D]; window w's slots are its
    tokens. CSA (overlap True): kv, gate [tokens, 2D], ape [rate, 2D]; window w's slots are
    the previous window's tokens on channels [0, D) (none for window 0) and then its own
    on channels [D, 2D). Per channel, out[w] = sum over slots of softmax(gate + ape) * kv.
    Tokens past the last whole window are not pooled."""
    kv, gate, ape = float64(kv), float64(gate), float64(ape)
    windows = kv.shape[0] // rate
    width = kv.shape[1] // 2 if overlap else kv.shape[1]
    kv = kv[:windows * rate].reshape(windows, rate, -1)
    scores = gate[:windows * rate].reshape(windows, rate, -1) + ape[None]
    if overlap:
        previous_kv = np.zeros((windows, rate, width))
        previous_scores = np.full((windows, rate, width), -np.inf)  # weight e^-inf = 0
        previous_kv[1:] = kv[:-1, :, :width]
        previous_scores[1:] = scores[:-1, :, :width]
        kv = np.concatenate([previous_kv, kv[:, :, width:]], axis=1)
        scores = np.concatenate([previous_scores, scores[:, :, width:]], axis=1)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return (weights * kv).sum(axis=1)


# --- mHC: Sinkhorn split, collapse and expand --------------------------------------------------


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def sinkhorn_split(mixes, scale, base, iters: int, eps: float, hc: int = 4):
    """mixes [tokens, (2 + hc) hc] -> pre [tokens, hc], post [tokens, hc],
    comb [tokens, hc, hc]:

        pre  = sigmoid(scale_0 m_pre + b_pre) + eps
        post = 2 sigmoid(scale_1 m_post + b_post)
        C    = softmax_rows(scale_2 m_comb + b_comb) + eps
        C   /= colsum(C) + eps;   then iters - 1 times: C /= rowsum(C) + eps; C /= colsum(C) + eps
    """
    m, s, b = float64(mixes), float64(scale), float64(base)
    z = m * np.repeat(s, [hc, hc, hc * hc]) + b
    pre = sigmoid(z[:, :hc]) + eps
    post = 2.0 * sigmoid(z[:, hc:2 * hc])
    logits = z[:, 2 * hc:].reshape(-1, hc, hc)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    comb = e / e.sum(axis=-1, keepdims=True) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return pre, post, comb


def mhc_collapse(streams, pre) -> np.ndarray:
    """streams [tokens, hc, D], pre [tokens, hc] -> x [tokens, D]:
    x_t = sum_s pre[t, s] streams[t, s]."""
    return np.einsum("ts,tsd->td", float64(pre), float64(streams))


def mhc_expand(f, streams, post, comb) -> np.ndarray:
    """f [tokens, D], streams [tokens, hc, D], post [tokens, hc], comb [tokens, hc, hc]
    -> new streams [tokens, hc, D]: stream n receives post[t, n] f_t and, from every old
    stream m, the share comb[t, m, n] (DeepSeek-V4's hc_post sums comb[m, n] r_m over m)."""
    f, streams, post, comb = float64(f), float64(streams), float64(post), float64(comb)
    out = post[:, :, None] * f[:, None, :]
    for n in range(streams.shape[1]):
        for m in range(streams.shape[1]):
            out[:, n] += comb[:, m, n, None] * streams[:, m]
    return out


# --- SDPA decode with a sink -----------------------------------------------------------------


def sdpa_sink(q, k, v, sinks, scale: float) -> np.ndarray:
    """One query token per head: q [B, H, D], k and v [B, HKV, L, D] (head h reads kv head
    h // (H / HKV)), sinks [H]. Per head, softmax over [q.k_j * scale for j < L, sink_h];
    the sink's probability mass is dropped (it has no value row)."""
    q, k, v, sinks = float64(q), float64(k), float64(v), float64(sinks)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("bhd,bhld->bhl", q, k) * float(scale)
    sink = np.broadcast_to(sinks[None, :, None], scores.shape[:2] + (1,))
    logits = np.concatenate([scores, sink], axis=-1)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhl,bhld->bhd", p[..., :-1], v)


def csa_sdpa(q, k, v, indices, sinks, scale: float) -> np.ndarray:
    """sdpa_sink over a gather list: batch b's query attends only to the cache rows
    indices[b] names (entries < 0 are empty), plus the sink. A list naming every row once
    is dense attention."""
    q, k, v = float64(q), float64(k), float64(v)
    indices = np.asarray(indices)
    out = np.empty(q.shape)
    for b in range(q.shape[0]):
        rows = indices[b][indices[b] >= 0]
        out[b] = sdpa_sink(q[b:b + 1], k[b:b + 1, :, rows], v[b:b + 1, :, rows], sinks,
                           scale)[0]
    return out
