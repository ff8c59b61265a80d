"""Gated DeltaNet: the recurrence of Qwen3-Next / Kimi Linear style linear attention.

Four kernels compute the same thing:

* `seq`: one SIMD-group per value row, two 32-lane reductions per token (decode and
  short prefill; the layout of mlx-lm's `gated_delta_step`).
* `packed`: eight value rows per SIMD-group, four lanes per row. Its sums associate
  exactly as `seq`'s butterfly, so its outputs are *bitwise* equal to `seq`'s.
* `wy`: prefill chunk by chunk in the compact WY form; within a chunk the tokens are
  processed together, chunks run in order.
* `wy_mma`: the same algebra with its products on 8x8 `simdgroup_matrix` tiles and the
  triangular solve by blocks of 8 (spec, launch and sweep space in `tiled.py`).

Layouts (mlx-lm's): q, k [B, T, Hk, Dk]; v, y [B, T, Hv, Dv]; g, beta [B, T, Hv];
state [B, Hv, Dv, Dk]. Hv is a multiple of Hk: value head h reads key head h // (Hv // Hk).

This module holds the kernel specs, the float64 oracles (the plain recurrence, and the
chunked algebra the `wy` kernel implements), input generators, launch helpers and the
sweep space of the `wy` kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.families import import_sibling

tiled = import_sibling(__name__, __file__, "tiled")

FOLDER = Path(__file__).parent  # where this family's .metal files are

DESCRIPTION = (
    "Gated DeltaNet recurrence: sequential and packed (bitwise equal) decode kernels and "
    "the chunked WY prefill, scalar and on simdgroup_matrix tiles"
)

_INPUTS = ["q", "k", "v", "g", "beta", "state_in"]
_OUTPUTS = ["y", "state_out"]

KERNELS = {
    "seq": mtwork.KernelSpec(
        folder=FOLDER,
        name="gated_delta_seq",
        source="gated_delta_seq.metal",
        header="gated_delta.h",
        input_names=_INPUTS,
        output_names=_OUTPUTS,
        description="one SIMD-group per value row; simd_sum (or the written-out butterfly)",
    ),
    "packed": mtwork.KernelSpec(
        folder=FOLDER,
        name="gated_delta_packed",
        source="gated_delta_packed.metal",
        header="gated_delta.h",
        input_names=_INPUTS,
        output_names=_OUTPUTS,
        description="eight value rows per SIMD-group, bitwise equal to seq",
    ),
    "wy": mtwork.KernelSpec(
        folder=FOLDER,
        name="gated_delta_wy",
        source="gated_delta_wy.metal",
        header="gated_delta.h",
        input_names=_INPUTS,
        output_names=_OUTPUTS,
        description="chunked prefill in the compact WY form; chunk size C <= 32",
    ),
    "wy_mma": tiled.SPEC,
}

SIMD_WIDTH = 32
PACKED_ROWS_PER_SIMDGROUP = 8
MAX_CHUNK = 32  # a chunk's tokens map onto the lanes of one SIMD-group
THREADGROUP_MEMORY = 32 * 1024


# --- problems and inputs ------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """The shapes of one call: batch B, tokens T, key/value heads Hk/Hv, head dims."""

    batch: int
    tokens: int
    key_heads: int
    value_heads: int
    dk: int
    dv: int

    def __post_init__(self) -> None:
        if self.value_heads % self.key_heads:
            raise ValueError(f"Hv={self.value_heads} must be a multiple of Hk={self.key_heads}")
        if self.dk % SIMD_WIDTH:
            raise ValueError(f"Dk={self.dk} must be a multiple of {SIMD_WIDTH}")

    def __str__(self) -> str:
        return (f"B={self.batch} T={self.tokens} Hk={self.key_heads} Hv={self.value_heads} "
                f"Dk={self.dk} Dv={self.dv}")


class Inputs(NamedTuple):
    """Kernel inputs, in the kernels' order."""

    q: mx.array
    k: mx.array
    v: mx.array
    g: mx.array
    beta: mx.array
    state: mx.array

    @property
    def problem(self) -> Problem:
        batch, tokens, key_heads, dk = self.q.shape
        return Problem(batch, tokens, key_heads, self.v.shape[2], dk, self.v.shape[3])


def make_inputs(problem: Problem, dtype: mx.Dtype = mx.float32, *, seed: int = 0,
                max_decay: float = 0.2, state_dtype: mx.Dtype = mx.float32) -> Inputs:
    """Inputs as a model produces them: unit-norm keys, queries scaled by Dk^-1/2,
    decays g = exp(-U(0, max_decay)), beta ~ U(0, 1), a random initial state."""
    p = problem
    keys = mx.random.split(mx.random.key(seed), 6)
    q = mx.random.normal((p.batch, p.tokens, p.key_heads, p.dk), key=keys[0])
    k = mx.random.normal((p.batch, p.tokens, p.key_heads, p.dk), key=keys[1])
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * p.dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((p.batch, p.tokens, p.value_heads, p.dv), key=keys[2])
    g = mx.exp(-max_decay * mx.random.uniform(shape=(p.batch, p.tokens, p.value_heads),
                                              key=keys[3]))
    beta = mx.random.uniform(shape=(p.batch, p.tokens, p.value_heads), key=keys[4])
    state = 0.3 * mx.random.normal((p.batch, p.value_heads, p.dv, p.dk), key=keys[5])
    arrays = Inputs(*(x.astype(dtype) for x in (q, k, v, g, beta)), state.astype(state_dtype))
    mx.eval(*arrays)
    return arrays


# --- oracles ------------------------------------------------------------------------------


def recurrence(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any
               ) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule token by token, in float64: returns (y, final state).

    Per token t and value head h (key head h // (Hv // Hk)):
        S <- g_t S;  delta = beta_t (v_t - S k_t);  S <- S + delta k_t^T;  y_t = S q_t
    with S of shape [Dv, Dk]."""
    q, k, v, g, beta, state = _float64(q, k, v, g, beta, state)
    batch, tokens, key_heads, _ = q.shape
    value_heads = v.shape[2]
    group = value_heads // key_heads
    y = np.zeros(v.shape)
    s = state.copy()
    for b in range(batch):
        for h in range(value_heads):
            hk = h // group
            for t in range(tokens):
                s[b, h] *= g[b, t, h]
                delta = beta[b, t, h] * (v[b, t, h] - s[b, h] @ k[b, t, hk])
                s[b, h] += np.outer(delta, k[b, t, hk])
                y[b, t, h] = s[b, h] @ q[b, t, hk]
    return y, s


def chunked(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, chunk: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The chunked WY algebra of the `wy` kernel, in float64, on whole matrices:
    per chunk with prefix decays G and ratios Gamma[t, j] = G_t / G_j (j <= t),

        (I + A) U = beta * (V - G * K S0^T),   A = strict_lower(beta * Gamma * K K^T)
        Y = G * Q S0^T + lower(Gamma * Q K^T) U
        S_C = G_C S0 + sum_j (G_C / G_j) u_j k_j^T

    It equals `recurrence` up to float64 rounding; a mismatch means the algebra is wrong,
    whatever the kernel does. T is padded to a multiple of `chunk` with identity steps."""
    q, k, v, g, beta, state = _float64(q, k, v, g, beta, state)
    batch, tokens, key_heads, _ = q.shape
    value_heads = v.shape[2]
    group = value_heads // key_heads
    padded = -(-tokens // chunk) * chunk
    pad = [(0, 0), (0, padded - tokens)]
    q, k, v = (np.pad(x, pad + [(0, 0), (0, 0)]) for x in (q, k, v))
    g = np.pad(g, pad + [(0, 0)], constant_values=1.0)
    beta = np.pad(beta, pad + [(0, 0)])
    y = np.zeros(v.shape)
    s = state.copy()
    strict = np.tril(np.ones((chunk, chunk)), -1)
    causal = np.tril(np.ones((chunk, chunk)))
    for b in range(batch):
        for h in range(value_heads):
            hk = h // group
            for t0 in range(0, padded, chunk):
                window = slice(t0, t0 + chunk)
                qc, kc, vc = q[b, window, hk], k[b, window, hk], v[b, window, h]
                bc = beta[b, window, h]
                big_g = np.cumprod(g[b, window, h])
                gamma = big_g[:, None] / big_g[None, :] * causal
                a = bc[:, None] * gamma * (kc @ kc.T) * strict
                rhs = bc[:, None] * (vc - big_g[:, None] * (kc @ s[b, h].T))
                u = np.linalg.solve(np.eye(chunk) + a, rhs)
                y[b, window, h] = big_g[:, None] * (qc @ s[b, h].T) + (gamma * (qc @ kc.T)) @ u
                s[b, h] = big_g[-1] * s[b, h] + (big_g[-1] / big_g[:, None] * u).T @ kc
    return y[:, :tokens], s


def _float64(*arrays: Any) -> list[np.ndarray]:
    out = []
    for x in arrays:
        if isinstance(x, mx.array):
            x = x.astype(mx.float32)  # numpy has no bfloat16; the widening is exact
        out.append(np.array(x, dtype=np.float64))
    return out


# --- launches -----------------------------------------------------------------------------


def kernel(name: str) -> mtwork.MetalKernel:
    """The `mtwork.metal_kernel` of KERNELS[name], read from its files at each call so
    that edits to the MSL take effect on the next run (compiled code is cached by source)."""
    return KERNELS[name].kernel()


def _common(problem: Problem, dtype: mx.Dtype, state_dtype: mx.Dtype) -> dict[str, Any]:
    p = problem
    return dict(
        output_shapes=[(p.batch, p.tokens, p.value_heads, p.dv),
                       (p.batch, p.value_heads, p.dv, p.dk)],
        output_dtypes=[dtype, state_dtype],
    )


def _types(problem: Problem, dtype: mx.Dtype, state_dtype: mx.Dtype) -> list[tuple[str, Any]]:
    return [("InT", dtype), ("StT", state_dtype), ("Dk", problem.dk), ("Dv", problem.dv)]


def seq_launch(problem: Problem, dtype: mx.Dtype = mx.float32, *, rows: int = 4,
               xor_tree: bool = False, state_dtype: mx.Dtype = mx.float32) -> mtwork.Launch:
    """`seq`: grid (32, Dv, B*Hv), `rows` SIMD-groups (value rows) per threadgroup;
    `xor_tree` reduces with the written-out butterfly instead of simd_sum."""
    p = problem
    return mtwork.Launch(
        kernel("seq"),
        grid=(SIMD_WIDTH, p.dv, p.batch * p.value_heads),
        threadgroup=(SIMD_WIDTH, rows, 1),
        template=[*_types(p, dtype, state_dtype), ("XorTree", xor_tree)],
        **_common(p, dtype, state_dtype),
    )


def packed_launch(problem: Problem, dtype: mx.Dtype = mx.float32, *, simdgroups: int = 2,
                  state_dtype: mx.Dtype = mx.float32,
                  variant: mtwork.MetalKernel | None = None) -> mtwork.Launch:
    """`packed`: grid (32, Dv/8, B*Hv), `simdgroups` SIMD-groups of eight value rows
    per threadgroup. `variant` runs another build of the packed source (e.g.
    `packed_left_to_right()`) with the same launch."""
    p = problem
    if p.dv % PACKED_ROWS_PER_SIMDGROUP:
        raise ValueError(f"the packed layout needs Dv % 8 == 0, got Dv={p.dv}")
    return mtwork.Launch(
        variant or kernel("packed"),
        grid=(SIMD_WIDTH, p.dv // PACKED_ROWS_PER_SIMDGROUP, p.batch * p.value_heads),
        threadgroup=(SIMD_WIDTH, simdgroups, 1),
        template=_types(p, dtype, state_dtype),
        **_common(p, dtype, state_dtype),
    )


def wy_threadgroup_bytes(dk: int, chunk: int, rows: int) -> int:
    """Threadgroup memory of the `wy` kernel: q, k of a chunk, A and M, G and beta, and
    one state row per SIMD-group, all float32."""
    return 4 * (2 * chunk * dk + 2 * chunk * chunk + 2 * chunk + rows * dk)


def wy_launch(problem: Problem, dtype: mx.Dtype = mx.float32, *, chunk: int = 16,
              rows: int = 4, state_dtype: mx.Dtype = mx.float32) -> mtwork.Launch:
    """`wy`: grid (32, Dv, B*Hv), `rows` value rows (SIMD-groups) per threadgroup, chunks
    of `chunk` tokens (T need not be a multiple: the kernel pads the last chunk)."""
    p = problem
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be in 1..{MAX_CHUNK}, got {chunk}")
    if p.dv % rows:
        raise ValueError(f"rows={rows} must divide Dv={p.dv}")
    used = wy_threadgroup_bytes(p.dk, chunk, rows)
    if used > THREADGROUP_MEMORY:
        raise ValueError(f"chunk={chunk}, rows={rows} at Dk={p.dk} need {used} bytes of "
                         f"threadgroup memory, more than {THREADGROUP_MEMORY}")
    return mtwork.Launch(
        kernel("wy"),
        grid=(SIMD_WIDTH, p.dv, p.batch * p.value_heads),
        threadgroup=(SIMD_WIDTH, rows, 1),
        template=[*_types(p, dtype, state_dtype), ("C", chunk), ("Rows", rows)],
        **_common(p, dtype, state_dtype),
    )


_PACKED_TREE = ("((part[0] + part[1]) + (part[2] + part[3])) +\n"
                "            ((part[4] + part[5]) + (part[6] + part[7]))")
_LEFT_TO_RIGHT = ("part[0] + part[1] + part[2] + part[3] + part[4] + part[5] + part[6] + "
                  "part[7]")


def packed_left_to_right() -> mtwork.MetalKernel:
    """The packed kernel with its in-lane tree replaced by a left-to-right sum: the same
    numbers added in another order. The negative control of the bitwise A/B: it is as
    accurate as `packed`, but not bitwise equal to `seq`."""
    spec = KERNELS["packed"]
    header = spec.read_header()
    if _PACKED_TREE not in header:
        raise RuntimeError("gd_packed_row_sum's local tree is not where it was in gated_delta.h")
    return mtwork.metal_kernel(
        "gated_delta_packed_left_to_right", spec.input_names, spec.output_names,
        spec.read_source(), header.replace(_PACKED_TREE, _LEFT_TO_RIGHT),
    )


LAUNCHES = {"seq": seq_launch, "packed": packed_launch, "wy": wy_launch,
            "wy_mma": tiled.launch}


def run(name: str, inputs: Inputs, *, backend: str | None = None, **options: Any
        ) -> list[mx.array]:
    """Run kernel `name` ("seq", "packed", "wy" or "wy_mma") on `inputs`: returns
    [y, state]. `options` go to its launch helper (rows, xor_tree, simdgroups, chunk,
    value_tile)."""
    launch = LAUNCHES[name](inputs.problem, inputs.q.dtype, state_dtype=inputs.state.dtype,
                            **options)
    return launch(*inputs, backend=backend)


def bitwise_ab(inputs: Inputs, *, backend: str | None = None
               ) -> dict[str, list[mtwork.DiffReport]]:
    """Bitwise diffs of [y, state] against `seq` (simd_sum) for `packed` and for `seq`
    with the written-out xor butterfly."""
    reference = run("seq", inputs, backend=backend)
    variants = {
        "packed": run("packed", inputs, backend=backend),
        "seq, xor tree": run("seq", inputs, backend=backend, xor_tree=True),
    }
    return {
        name: [mtwork.diff(a, b, bitwise=True, name=f"{name} {what} vs seq")
               for a, b, what in zip(outputs, reference, ("y", "state"))]
        for name, outputs in variants.items()
    }


# --- sweeps -------------------------------------------------------------------------------

WY_SPACE = {"chunk": [4, 8, 16, 32], "rows": [1, 2, 4, 8]}


def wy_constraints(problem: Problem) -> list[Any]:
    """What a `wy` configuration must satisfy at `problem`'s shapes."""
    return [
        mtwork.threadgroup_memory_under(
            lambda c: wy_threadgroup_bytes(problem.dk, c["chunk"], c["rows"]),
            THREADGROUP_MEMORY),
        mtwork.divides("rows", problem.dv),
        f"chunk <= {MAX_CHUNK}",
    ]


# --- shapes tests and notebooks use -------------------------------------------------------

# (Hk, Hv): one head, equal heads, and grouped heads (Hv a multiple of Hk).
HEAD_CONFIGS = [(1, 1), (2, 2), (1, 2), (2, 6)]
TOKEN_COUNTS = [1, 7, 16, 257]
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
