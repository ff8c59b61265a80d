"""llama.cpp's gated_delta_net.metal (the gated delta rule of Qwen3-Next and Kimi's KDA),
dispatched as ggml_metal_op_gated_delta_net does, against the recurrence written in numpy
float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import Tensor, decode, encoded

SLOW = pytest.mark.slow
REFERENCE = "numpy float64 gated delta rule"
TOLERANCE = {"dtype": "float32", "atol": 1e-4, "rtol": 1e-4}


def _inputs(d: int, heads: int, q_heads: int, tokens: int, seqs: int, g_width: int,
            ) -> dict[str, Tensor]:
    """q, k [seqs, tokens, q_heads, d], v [seqs, tokens, heads, d], gate [seqs, tokens,
    heads, g_width] (log decay, negative), beta [seqs, tokens, heads, 1] in (0, 1) and the
    state [seqs, heads, d, d] (row i of a head's matrix: output dimension i)."""
    g = np.random.default_rng(d + heads * 7 + tokens)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return {
        "q": encoded(unit(g.standard_normal((seqs, tokens, q_heads, d))), "f32"),
        "k": encoded(unit(g.standard_normal((seqs, tokens, q_heads, d))), "f32"),
        "v": encoded(g.standard_normal((seqs, tokens, heads, d)), "f32"),
        "gate": encoded(-np.abs(g.standard_normal((seqs, tokens, heads, g_width))) * 0.3,
                        "f32"),
        "beta": encoded(1 / (1 + np.exp(-g.standard_normal((seqs, tokens, heads, 1)))),
                        "f32"),
        "state": encoded(g.standard_normal((seqs, heads, d, d)) * 0.1, "f32"),
    }


def reference(t: dict[str, Tensor], snapshots: int) -> tuple[np.ndarray, np.ndarray]:
    """Per head (q and k of head h % q_heads): S <- S * exp(g) (scaled per column when g
    has a value per key dimension), S <- S + beta (v - S k) k^T, o = S q / sqrt(d). Returns
    the outputs [seqs, tokens, heads, d] and the states after the last `snapshots` tokens
    [snapshots, seqs, heads, d, d], the newest first."""
    q, k, v = t["q"].values, t["k"].values, t["v"].values
    gate, beta, s = t["gate"].values, t["beta"].values[..., 0], t["state"].values.copy()
    seqs, tokens, heads, d = v.shape
    q_heads = q.shape[2]
    out = np.zeros_like(v)
    states = np.zeros((snapshots, seqs, heads, d, d))
    for b in range(seqs):
        for h in range(heads):
            m = s[b, h]
            for i in range(tokens):
                kh, qh = k[b, i, h % q_heads], q[b, i, h % q_heads]
                m = m * np.exp(gate[b, i, h])[None, :]
                m = m + beta[b, i, h] * np.outer(v[b, i, h] - m @ kh, kh)
                out[b, i, h] = m @ qh / np.sqrt(d)
                if tokens - 1 - i < snapshots:
                    states[tokens - 1 - i, b, h] = m
    return out, states


def gated_delta_net(t: dict[str, Tensor], snapshots: int) -> tuple[np.ndarray, np.ndarray,
                                                                   list]:
    """kernel_gated_delta_net_f32_<d/32>: a SIMD-group per row of the state (d/32 key
    dimensions a lane), d/32 SIMD-groups a threadgroup, a threadgroup per (rows, head,
    sequence); dst holds the outputs, then the `snapshots` states (unfused: nb_out 0)."""
    q, k, v, gate = t["q"], t["k"], t["v"], t["gate"]
    d, heads, tokens, seqs = v.ne
    nsg = d // 32
    b = built("gated_delta_net.metal", f"kernel_gated_delta_net_f32_{nsg}",
              {fc("FC_GATED_DELTA_NET", 0): d, fc("FC_GATED_DELTA_NET", 1): gate.ne[0],
               fc("FC_GATED_DELTA_NET", 2): snapshots})
    n_out = d * heads * tokens * seqs
    dst_ne = (d * heads, tokens * seqs + snapshots * d * seqs, 1, 1)
    dst_nb = (4, 4 * dst_ne[0], 4 * dst_ne[0] * dst_ne[1], 4 * dst_ne[0] * dst_ne[1])
    args = pack("ggml_metal_kargs_gated_delta_net", q.locals("0"), k.locals("1"),
                v.locals("2"), {f"ne{i}": n for i, n in enumerate(dst_ne)},
                {f"nb{i}": n for i, n in enumerate(dst_nb)},
                ns02=q.nb[2] // 4, ns12=k.nb[2] // 4, ns22=v.nb[2] // 4, nb_out=0)
    size = 4 * (n_out + snapshots * d * d * heads * seqs)
    out = run(b, {0: args, 1: q, 2: k, 3: v, 4: gate, 5: t["beta"], 6: t["state"],
                  7: new(size), 8: np.zeros(16, np.uint8)},  # dst_fuse: unused unfused
              (d // nsg, heads, seqs), (32, nsg, 1))
    values = decode(out[7], "f32", (size // 4,))
    return (values[:n_out].reshape(seqs, tokens, heads, d),
            values[n_out:].reshape(snapshots, seqs, heads, d, d), [b])


@pytest.mark.parametrize(("d", "heads", "q_heads", "tokens", "seqs", "g_width", "snapshots"), [
    (64, 2, 1, 5, 2, 1, 1),
    pytest.param(128, 4, 4, 3, 1, 128, 1, marks=SLOW),  # KDA: a decay per key dimension
    pytest.param(32, 2, 2, 6, 1, 1, 3, marks=SLOW),     # the last 3 states kept
])
def test_gated_delta_net(agreement, d, heads, q_heads, tokens, seqs, g_width,
                         snapshots) -> None:
    t = _inputs(d, heads, q_heads, tokens, seqs, g_width)
    out, states, parts = gated_delta_net(t, snapshots)
    want_out, want_states = reference(t, snapshots)
    name = f"kernel_gated_delta_net_f32_{d // 32} d={d} heads={heads}/{q_heads} " \
           f"tokens={tokens} seqs={seqs} G={g_width} K={snapshots}"
    check(agreement, parts, name, np.concatenate([out.ravel(), states.ravel()]),
          np.concatenate([want_out.ravel(), want_states.ravel()]), REFERENCE, **TOLERANCE)
