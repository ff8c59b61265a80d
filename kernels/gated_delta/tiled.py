"""The `wy_mma` kernel: the chunked WY prefill with its products on 8x8 simdgroup_matrix
tiles (gated_delta_wy_mma.metal). Its spec, launch, threadgroup budget and sweep space;
`family.py` registers it beside the other kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

import mtwork

FOLDER = Path(__file__).parent
SIMD_WIDTH = 32
THREADGROUP_MEMORY = 32 * 1024
CHUNKS = (8, 16, 32)  # whole 8-row fragments; the diagonal blocks' inverses use C lanes

SPEC = mtwork.KernelSpec(
    folder=FOLDER,
    name="gated_delta_wy_mma",
    source="gated_delta_wy_mma.metal",
    header="gated_delta.h",
    input_names=["q", "k", "v", "g", "beta", "state_in"],
    output_names=["y", "state_out"],
    description="the chunked WY prefill on 8x8 simdgroup_matrix tiles: K K^T, Q K^T, the "
                "block triangular solve and the state update as multiply-accumulates",
)


PAD = 8  # floats added to each row of the threadgroup tiles (bank conflicts)


def threadgroup_bytes(dk: int, chunk: int, pad: int = PAD) -> int:
    """q and k of a chunk and -A and M, rows lengthened by `pad` floats, the diagonal
    blocks' inverses, G and beta: float32."""
    return 4 * (2 * chunk * (dk + pad) + 2 * chunk * (chunk + pad) + 10 * chunk)


def launch(problem: Any, dtype: mx.Dtype = mx.float32, *, chunk: int = 16,
           value_tile: int | None = None, simdgroups: int | None = None, pad: int = PAD,
           state_dtype: mx.Dtype = mx.float32) -> mtwork.Launch:
    """`wy_mma` at `problem`'s shapes: grid (32 * simdgroups, Dv / value_tile, B * Hv),
    chunks of `chunk` tokens (T need not be a multiple), `value_tile` value columns per
    threadgroup (default 16, or 8 when 16 does not divide Dv) shared out in 8-column
    fragments over `simdgroups` SIMD-groups (default: one fragment each). `pad` floats
    lengthen each row of the threadgroup tiles (with 0, the 8 rows of a fragment, Dk or C
    floats apart, fall on the same banks); it changes no result, bit for bit."""
    p = problem
    if value_tile is None:
        value_tile = 16 if p.dv % 16 == 0 else 8
    if simdgroups is None:
        simdgroups = max(value_tile // 8, 1)
    if chunk not in CHUNKS:
        raise ValueError(f"chunk must be one of {CHUNKS}, got {chunk}")
    if value_tile % 8 or p.dv % value_tile:
        raise ValueError(f"value_tile must be a multiple of 8 dividing Dv={p.dv}, "
                         f"got {value_tile}")
    if simdgroups < 1 or (value_tile // 8) % simdgroups:
        raise ValueError(f"simdgroups must divide value_tile / 8 = {value_tile // 8}, "
                         f"got {simdgroups}")
    if pad < 0 or pad % 2:
        raise ValueError(f"pad must be an even number of floats >= 0, got {pad}")
    used = threadgroup_bytes(p.dk, chunk, pad)
    if used > THREADGROUP_MEMORY:
        raise ValueError(f"chunk={chunk} at Dk={p.dk} (pad {pad}) needs {used} bytes of "
                         f"threadgroup memory, more than {THREADGROUP_MEMORY}")
    return mtwork.Launch(
        SPEC.kernel(),
        grid=(SIMD_WIDTH * simdgroups, p.dv // value_tile, p.batch * p.value_heads),
        threadgroup=(SIMD_WIDTH * simdgroups, 1, 1),
        template=[("InT", dtype), ("StT", state_dtype), ("Dk", p.dk), ("Dv", p.dv),
                  ("C", chunk), ("ValueTile", value_tile), ("Simdgroups", simdgroups),
                  ("Pad", pad)],
        output_shapes=[(p.batch, p.tokens, p.value_heads, p.dv),
                       (p.batch, p.value_heads, p.dv, p.dk)],
        output_dtypes=[dtype, state_dtype],
    )


SPACE = {"chunk": list(CHUNKS), "value_tile": [8, 16, 32, 64], "simdgroups": [1, 2, 4, 8]}


def constraints(problem: Any) -> list[Any]:
    """What a `wy_mma` configuration must satisfy at `problem`'s shapes."""
    return [
        mtwork.threadgroup_memory_under(
            lambda c: threadgroup_bytes(problem.dk, c["chunk"], c.get("pad", PAD)),
            THREADGROUP_MEMORY),
        mtwork.divides("value_tile", problem.dv),
        lambda c: (c["value_tile"] // 8) % c["simdgroups"] == 0,
    ]
