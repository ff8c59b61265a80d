"""llama.cpp's Metal mat-vec kernels of 2023, dispatched as the host code of their day did.

The sources are `llama-cpp-python` source distributions' vendored ``ggml-metal.metal``
(`published.llama_cpp`). Each kernel takes its arguments as ``ggml-metal.m`` of the same
version binds them for ``GGML_OP_MUL_MAT`` with one token (src1 a single row): src0 (the
quantized weights), src1 (the float vector) and dst at buffers 0-2, then the int64 shape
and stride values ne00, ne01, nb00, nb01, nb02, ne10, ne11, nb10, nb11, nb12, ne0, ne1 at
3-14 with ``setBytes`` (a kernel reads those its signature names, by Metal's index
assignment). `HOSTS` holds each version's threads per threadgroup, rows per threadgroup and
threadgroup memory, read from that version's ``ggml-metal.m``.

A matrix is profiled on a slice of its rows (every threadgroup does the same work on rows
of its own; the vector is shared) and taken to the whole with `mtwork.gpu.scaled`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

import mtwork
from mtwork.gpu import Counters, scaled

from . import published

# Block layouts of ggml-common (ggml.h / k_quants.h in 2023): elements, bytes per block.
BLOCKS = {"q4_0": (32, 18), "q4_1": (32, 20), "q4_K": (256, 144), "q5_K": (256, 176),
          "q6_K": (256, 210)}
# Metal's standard library has assert; mtwork's shim does not. These files assert only in
# dequantisation helpers; a release build compiles them out, as here.
PRELUDE = "#define assert(...) ((void)0)\n"


@dataclass(frozen=True)
class Host:
    """How one version's ggml-metal.m dispatches one quantization's mat-vec kernel."""

    threads: tuple[int, int]  # (nth0, nth1)
    rows_per_threadgroup: int
    threadgroup_floats: int = 0  # setThreadgroupMemoryLength: floats at index 0


_OLD = {"q4_0": Host((8, 8), 1, 64), "q4_1": Host((8, 8), 1, 64),
        **{q: Host((4, 16), 1, 64) for q in ("q4_K", "q5_K", "q6_K")}}
# ggml-metal.m, GGML_OP_MUL_MAT's custom mat-vec branch, by llama-cpp-python version.
HOSTS: dict[str, dict[str, Host]] = {
    "0.1.70": _OLD,  # every row a threadgroup of 8x8 (q4) or 4x16 (k-quants) threads
    # #2188: q4_0 rows 8 a threadgroup, ne01 / 8 + ((ne01 % 8) & 0x01) threadgroups
    "0.1.71": {**_OLD, "q4_0": Host((8, 8), 8)},
    "0.1.73": {**_OLD, "q4_0": Host((8, 8), 8), "q4_1": Host((8, 8), 8)},
    # #2290, #2294: q4_K (ne01 + 7) / 8, q5_K (ne01 + 3) / 4, q6_K (ne01 + 1) / 2
    # threadgroups of 2x32 threads, no threadgroup memory
    "0.1.74": {**_OLD, "q4_0": Host((8, 8), 8), "q4_1": Host((8, 8), 8),
               "q4_K": Host((2, 32), 8), "q5_K": Host((2, 32), 4),
               "q6_K": Host((2, 32), 2)},
}


@cache
def kernel(version: str, quant: str) -> mtwork.Kernel:
    source = published.llama_cpp(version) / "ggml-metal.metal"
    library = mtwork.load_metal(source, prelude=PRELUDE)
    return library.kernel(f"kernel_mul_mat_{quant}_f32").compile()


@cache
def mat_vec(version: str, quant: str, rows: int, cols: int, slice_rows: int = 64
            ) -> Counters:
    """The counters of one token's `rows` x `cols` `quant` mat-vec with `version`'s
    kernel, profiled on `slice_rows` rows (a multiple of the rows a threadgroup does) and
    scaled to `rows` (a multiple of `slice_rows`)."""
    host = HOSTS[version][quant]
    if slice_rows % host.rows_per_threadgroup or rows % slice_rows:
        raise ValueError(f"{rows} rows in slices of {slice_rows}: the slice must be whole "
                         f"threadgroups of {host.rows_per_threadgroup} rows and divide the "
                         "rows")
    return scaled(_profile(version, quant, slice_rows, cols), rows // slice_rows,
                  shared=("src1",))


def _profile(version: str, quant: str, rows: int, cols: int) -> Counters:
    per_block, block_bytes = BLOCKS[quant]
    if cols % per_block:
        raise ValueError(f"{quant} rows are whole blocks of {per_block}, got {cols} columns")
    host = HOSTS[version][quant]
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 256, rows * cols // per_block * block_bytes, dtype=np.uint8)
    row_bytes = cols // per_block * block_bytes
    values = {3: cols, 4: rows, 5: block_bytes, 6: row_bytes, 7: row_bytes * rows,
              8: cols, 9: 1, 10: 4, 11: 4 * cols, 12: 4 * cols, 13: rows, 14: 1}
    k = kernel(version, quant)
    declared = {p.index for p in k.program.params if p.kind == "buffer"}
    buffers = {0: weights, 1: rng.standard_normal(cols).astype(np.float32),
               2: mtwork.new_buffer(4 * rows),
               **{i: np.int64(v) for i, v in values.items() if i in declared}}
    memory = {0: 4 * host.threadgroup_floats} if host.threadgroup_floats else None
    launch = k.launch(buffers=buffers, threadgroup_memory=memory,
                      threadgroups=(-(-rows // host.rows_per_threadgroup), 1, 1),
                      threads_per_threadgroup=(*host.threads, 1))
    return mtwork.profile(launch)


def llama_token(version: str, quant: str, *, embd: int, ff: int, layers: int,
                vocab: int = 32000) -> list[tuple[Counters, int]]:
    """One token's `quant` mat-vecs of a LLaMA model: per layer the four attention
    projections (embd x embd), the two feed-forward inputs (ff x embd) and its output
    (embd x ff); then the vocabulary projection. llama.cpp's quantizer of the day
    (``llama_model_quantize_internal`` in 0.1.73's vendored ``llama.cpp``) stores
    ``output.weight`` as Q6_K whenever both its sizes are whole 256-blocks, so a k-quant
    model's vocabulary projection runs the q6_K kernel; a q4_0 file may predate that rule
    (its projection is taken as q4_0)."""
    vocab_quant = "q6_K" if quant.endswith("_K") else quant
    return [(mat_vec(version, quant, embd, embd), 4 * layers),
            (mat_vec(version, quant, ff, embd), 2 * layers),
            (mat_vec(version, quant, embd, ff), layers),
            (mat_vec(version, vocab_quant, vocab, embd), 1)]
