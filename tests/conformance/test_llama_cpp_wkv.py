"""llama.cpp's linear-attention recurrences of wkv.metal (RWKV-6's and RWKV-7's wkv, a
thread per value channel of a 64-wide head) and the triangular solve of solve_tri.metal,
dispatched as ggml_metal_op_rwkv and ggml_metal_op_solve_tri do, against the recurrences
and forward substitution written in numpy float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import decode, encoded

SLOW = pytest.mark.slow
HEAD = 64  # the only head size wkv.metal takes (ggml_metal_library_get_pipeline_rwkv)


def _sizes(b: int, t: int, c: int, h: int) -> dict[int, int]:
    """B, T, C, H at the four indices after dst: the host sets int64_t values, of which
    the kernel's ``constant uint &`` reads the low word, these values."""
    return dict(enumerate((b, t, c, h)))


def wkv6_reference(k, v, r, tf, td, s):
    """RWKV-6 per sequence and head, S[key, value]: y = r (tf k v^T + S),
    S <- diag(td) S + k v^T. Shapes: k, v, r, td [B, tokens, H, 64], tf [H, 64],
    s [B, H, 64, 64]; returns y [B, tokens, H, 64] and the last states."""
    y, states = np.zeros_like(k), s.copy()
    for i in np.ndindex(k.shape[0], k.shape[2]):
        n, head = i
        state = states[n, head]
        for t in range(k.shape[1]):
            kv = np.outer(k[n, t, head], v[n, t, head])
            y[n, t, head] = r[n, t, head] @ (tf[head][:, None] * kv + state)
            state = td[n, t, head][:, None] * state + kv
        states[n, head] = state
    return y, states


def wkv7_reference(r, w, k, v, a, b, s):
    """RWKV-7 per sequence and head, S[value, key]: S <- S diag(w) + v k^T + (S a) b^T,
    y = S r. Shapes: r, w, k, v, a, b [B, tokens, H, 64], s [B, H, 64, 64]."""
    y, states = np.zeros_like(k), s.copy()
    for n, head in np.ndindex(k.shape[0], k.shape[2]):
        state = states[n, head]
        for t in range(k.shape[1]):
            sa = state @ a[n, t, head]
            state = state * w[n, t, head][None, :] + np.outer(v[n, t, head], k[n, t, head]) \
                + np.outer(sa, b[n, t, head])
            y[n, t, head] = state @ r[n, t, head]
        states[n, head] = state
    return y, states


def _inputs(version: int, seqs: int, tokens: int, heads: int) -> dict[str, np.ndarray]:
    """Operands in the ranges the models give them: decays in (0, 1), RWKV-7's a and b
    small (a = -kk, b = kk times a gate, kk unit-norm)."""
    g = np.random.default_rng(version * 100 + tokens)
    shape = (seqs, tokens, heads, HEAD)
    x = {"k": g.standard_normal(shape) * 0.3, "v": g.standard_normal(shape),
         "r": g.standard_normal(shape) * 0.3,
         "s": g.standard_normal((seqs, heads, HEAD, HEAD)) * 0.1}
    decay = np.exp(-np.exp(g.standard_normal(shape) - 1))
    if version == 6:
        x |= {"tf": g.standard_normal((heads, HEAD)) * 0.3, "td": decay}
    else:
        kk = g.standard_normal(shape)
        kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
        x |= {"w": decay, "a": -kk, "b": kk * g.uniform(0, 1, shape)}
    return {name: encoded(value, "f32").values for name, value in x.items()}


@pytest.mark.parametrize(("version", "seqs", "tokens", "heads"), [
    (6, 1, 3, 1),
    (7, 1, 3, 1),
    pytest.param(6, 2, 5, 2, marks=SLOW),
    pytest.param(7, 2, 6, 3, marks=SLOW),
])
def test_rwkv_wkv(agreement, version, seqs, tokens, heads) -> None:
    x = _inputs(version, seqs, tokens, heads)
    order = ("k", "v", "r", "tf", "td", "s") if version == 6 else \
        ("r", "w", "k", "v", "a", "b", "s")
    reference = wkv6_reference if version == 6 else wkv7_reference
    want = np.concatenate([a.ravel() for a in reference(*(x[n] for n in order))])
    # The same recurrence on the operands' magnitudes: the sum of |terms| of every output.
    scale = np.concatenate([a.ravel() for a in reference(*(np.abs(x[n]) for n in order))])
    c, total_tokens = heads * HEAD, seqs * tokens
    b = built("wkv.metal", f"kernel_rwkv_wkv{version}_f32")
    buffers = {i: encoded(x[n], "f32") for i, n in enumerate(order)}
    dst = len(order)
    buffers[dst] = new(4 * want.size)
    buffers |= {dst + 1 + i: v for i, v in _sizes(seqs, total_tokens, c, heads).items()}
    out = run(b, buffers, (seqs * heads, 1, 1), (HEAD, 1, 1))
    check(agreement, b, f"kernel_rwkv_wkv{version}_f32 seqs={seqs} tokens={tokens} "
          f"heads={heads}", decode(out[dst], "f32", want.shape) / scale, want / scale,
          "numpy float64 recurrence; error / sum|terms|", dtype="float64", atol=2e-6,
          rtol=0.0)


@pytest.mark.parametrize(("n", "k", "batch"), [
    (32, 5, (1, 2)),
    pytest.param(64, 17, (2, 1), marks=SLOW),
    pytest.param(24, 3, (1, 1), marks=SLOW),  # rows padded to 32 in threadgroup memory
])
def test_solve_tri(agreement, n, k, batch) -> None:
    g = np.random.default_rng(n + k)
    lower = np.tril(g.standard_normal((*batch, n, n)) * 0.5 / np.sqrt(n))  # well conditioned
    idx = np.arange(n)
    lower[..., idx, idx] = g.uniform(1, 2, (*batch, n)) * g.choice([-1, 1], (*batch, n))
    a = encoded(lower, "f32")
    rhs = encoded(g.standard_normal((*batch, n, k)), "f32")
    want = np.linalg.solve(a.values, rhs.values)
    nsg = 8
    solve = built("solve_tri.metal", "kernel_solve_tri_f32",
                  {fc("FC_SOLVE_TRI", 0): nsg, fc("FC_SOLVE_TRI", 1): n,
                   fc("FC_SOLVE_TRI", 2): k})
    dst = encoded(np.zeros(want.shape), "f32")
    args = pack("ggml_metal_kargs_solve_tri", a.locals("0"), rhs.locals("1"), dst.locals(""))
    # The kernel reads whole 32-wide rows: A's staged rows, and dst's rows (solved or not,
    # times a zero mask) up to 32 past the last when N % 32 != 0. Metal reads them inside
    # the host's larger buffer; here spare zero bytes follow A and dst.
    spare = np.zeros(4 * nsg * (-(-n // 32) * 32), np.uint8)
    a_bytes = np.concatenate([a.data, spare])
    ragged = n % 32 != 0
    solved = new(dst.nbytes + (4 * 32 * k if ragged else 0), scratch=ragged)
    out = run(solve, {0: args, 1: a_bytes, 2: rhs, 3: solved},
              (-(-k // nsg), a.ne[2], a.ne[3]), (32, nsg, 1),
              -(-(-(-n // 32) * 32 * nsg * 4) // 16) * 16)
    x = decode(out[3][:dst.nbytes], "f32", want.shape)
    # Forward substitution in float32: the residual A x - b, relative to |A| |x| + |b|.
    residual = np.abs(a.values @ x - rhs.values) / (np.abs(a.values) @ np.abs(x) +
                                                     np.abs(rhs.values))
    check(agreement, solve, f"kernel_solve_tri_f32 N={n} K={k} batch={batch}",
          np.concatenate([residual.ravel(), (x - want).ravel() / (1 + np.abs(want).ravel())]),
          np.zeros(2 * want.size), "numpy.linalg.solve; residual / (|A||x| + |b|) and "
          "error / (1 + |x|)", dtype="float64", atol=1e-6, rtol=0.0)
