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


# --- mHC Sinkhorn split ----------------------------------------------------------------------


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
