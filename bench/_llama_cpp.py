"""llama.cpp's q4_0 matrix kernels (mul_mv, mul_mm) from the llama-cpp-python sdist.

The sdist is fetched with pip at bench time (the conformance suite's
tests/conformance/llama_cpp_sdist.py) and its Metal sources are kept in the user's cache
folder; nothing of llama.cpp lives in this repository. The kernels are dispatched as
llama.cpp's host code does (ggml/src/ggml-metal/ggml-metal-ops.cpp, ggml_metal_op_mul_mat,
and the pipeline parameters of ggml-metal-device.cpp): arguments in a struct at
buffer(0), src0 (the q4_0 weights), src1 (float rows) and dst at buffers 1 to 3, function
constants at FC_MUL_MV / FC_MUL_MM, threadgroups of (32, nsg, 1).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The checkout's root on the path: the pinned sources come through the conformance suite's
# fetcher (one cache for both).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mtwork  # noqa: E402
from tests.conformance import llama_cpp_sdist  # noqa: E402

QK4_0 = 32
Q4_0_BYTES = 18  # a float16 scale and 16 bytes of nibbles (ggml-common.h, block_q4_0)


class Unavailable(Exception):
    """The kernel cannot run on the emulator here; the message says why."""


def ggml_src() -> Path:
    """ggml/src of the pinned sdist (ggml-metal/ and ggml-common.h), fetched on first use
    by tests/conformance/llama_cpp_sdist.py."""
    try:
        return llama_cpp_sdist.ggml_src()
    except llama_cpp_sdist.Unavailable as exc:
        raise Unavailable(str(exc)) from exc


def impl_define(src: Path, name: str) -> int:
    """An integer `#define` of ggml-metal-impl.h (e.g. N_R0_Q4_0, FC_MUL_MV)."""
    text = (src / "ggml-metal" / "ggml-metal-impl.h").read_text()
    found = re.search(rf"^#define\s+{name}\s+(\d+)\s*$", text, re.M)
    if found is None:
        raise Unavailable(f"ggml-metal-impl.h defines no integer {name}")
    return int(found.group(1))


# ggml_metal_kargs_mul_mv and ggml_metal_kargs_mul_mm of ggml-metal-impl.h, C layout.
_I32, _U64, _I16 = np.int32, np.uint64, np.int16
MUL_MV_ARGS = np.dtype({
    "names": ["ne00", "ne01", "ne02", "nb00", "nb01", "nb02", "nb03", "ne10", "ne11", "ne12",
              "nb10", "nb11", "nb12", "nb13", "ne0", "ne1", "nr0", "r2", "r3"],
    "formats": [_I32] * 3 + [_U64] * 4 + [_I32] * 3 + [_U64] * 4 + [_I32] * 3 + [_I16] * 2,
}, align=True)
MUL_MM_ARGS = np.dtype({
    "names": ["ne00", "ne02", "nb01", "nb02", "nb03", "ne12", "nb10", "nb11", "nb12", "nb13",
              "ne0", "ne1", "r2", "r3"],
    "formats": [_I32] * 2 + [_U64] * 3 + [_I32] + [_U64] * 4 + [_I32] * 2 + [_I16] * 2,
}, align=True)


@dataclass(frozen=True)
class MatMul:
    """dst[n, m] = sum_k W[m, k] x[n, k] with W [M, K] in q4_0 blocks and x [N, K] float."""

    m: int
    k: int
    n: int

    def strides(self) -> dict[str, int]:
        """ggml's byte strides (nb) of src0 (q4_0, [K, M]) and src1 (f32, [K, N])."""
        row = self.k // QK4_0 * Q4_0_BYTES
        return dict(nb00=Q4_0_BYTES, nb01=row, nb02=row * self.m, nb03=row * self.m,
                    nb10=4, nb11=4 * self.k, nb12=4 * self.k * self.n,
                    nb13=4 * self.k * self.n)


def build(src: Path, file: str, name: str, constants: dict[int, Any]) -> mtwork.Kernel:
    """Kernel `name` of llama.cpp's `file`, loaded unchanged and compiled for sim."""
    try:
        library = mtwork.load_metal(src / "ggml-metal" / "kernels" / file,
                                    include_dirs=[src / "ggml-metal", src])
        return library.kernel(name, constants=constants).compile()
    except Exception as exc:  # noqa: BLE001 - the front end's reason is the message
        reason = _opening(str(exc).replace(f"{src}/", "")) or type(exc).__name__
        raise Unavailable(f"mtwork cannot run llama.cpp's {file} unchanged yet: "
                          f"{reason}") from exc


def _opening(message: str, lines: int = 2, limit: int = 240) -> str:
    """The first lines of a long error message (a compile error's first diagnostic)."""
    kept = [line.strip() for line in message.strip().splitlines() if line.strip()][:lines]
    text = " ".join(kept)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def mul_mv_sim(src: Path, shape: MatMul, weights: np.ndarray, x: np.ndarray):
    """kernel_mul_mv_q4_0_f32 on sim, dispatched as ggml_metal_op_mul_mat does for
    src1 with one row: nr0 = N_R0_Q4_0 rows per SIMD-group, nsg = N_SG_Q4_0."""
    nr0, nsg = impl_define(src, "N_R0_Q4_0"), impl_define(src, "N_SG_Q4_0")
    fc = impl_define(src, "FC_MUL_MV")  # nsg, nxpsg, ne12, r2, r3, split follow it
    kernel = build(src, "mul_mv.metal", "kernel_mul_mv_q4_0_f32",
                   {fc: nsg, fc + 2: 1, fc + 3: 1, fc + 4: 1, fc + 5: False})
    args = np.zeros((), MUL_MV_ARGS)
    for name, value in dict(ne00=shape.k, ne01=shape.m, ne02=1, ne10=shape.k, ne11=shape.n,
                            ne12=1, ne0=shape.m, ne1=shape.n, nr0=nr0, r2=1, r3=1,
                            **shape.strides()).items():
        args[name] = value
    groups = (-(-shape.m // (nr0 * nsg)), shape.n, 1)
    return _launcher(kernel, args, weights, x, shape, groups, (32, nsg, 1),
                     # q4_0 mul_mv uses no threadgroup memory (pipeline smem 0); Metal
                     # lengths are multiples of 16, and mtwork asks for a positive one.
                     threadgroup_bytes=16)


def mul_mm_sim(src: Path, shape: MatMul, weights: np.ndarray, x: np.ndarray):
    """kernel_mul_mm_q4_0_f32 on sim, dispatched as ggml_metal_op_mul_mat does without
    tensor support: 64 x 32 tiles of dst (nr0, nr1 of ggml-metal-device.cpp), nsg =
    N_MM_SIMD_GROUP_X * N_MM_SIMD_GROUP_Y, and 4096 + 2048 bytes of threadgroup memory when
    no edge tile needs bounds checks."""
    if shape.m % 64 or shape.n % 32 or shape.k % 32:
        raise ValueError(f"mul_mm here takes M % 64 == N % 32 == K % 32 == 0, got {shape}")
    nsg = impl_define(src, "N_MM_SIMD_GROUP_X") * impl_define(src, "N_MM_SIMD_GROUP_Y")
    fc = impl_define(src, "FC_MUL_MM")  # bc_inp, bc_out, ne12, ne13, r2, r3 follow it
    # bc_inp (K % 32 != 0) and bc_out (edge tiles) are false here.
    kernel = build(src, "mul_mm.metal", "kernel_mul_mm_q4_0_f32",
                   {fc: False, fc + 1: False, fc + 2: 1, fc + 3: 1, fc + 4: 1, fc + 5: 1})
    args = np.zeros((), MUL_MM_ARGS)
    strides = shape.strides()
    del strides["nb00"]
    for name, value in dict(ne00=shape.k, ne02=1, ne12=1, ne0=shape.m, ne1=shape.n, r2=1,
                            r3=1, **strides).items():
        args[name] = value
    groups = (shape.n // 32, shape.m // 64, 1)
    return _launcher(kernel, args, weights, x, shape, groups, (32, nsg, 1),
                     threadgroup_bytes=4096 + 2048)


def _launcher(kernel: mtwork.Kernel, args: np.ndarray, weights: np.ndarray, x: np.ndarray,
              shape: MatMul, groups: tuple[int, int, int], threads: tuple[int, int, int],
              threadgroup_bytes: int):
    src0 = weights.view(np.int8).reshape(-1)
    src1 = np.ascontiguousarray(x, dtype=np.float32).view(np.int8).reshape(-1)
    out_bytes = 4 * shape.m * shape.n
    arg_bytes = args.tobytes()

    def run() -> np.ndarray:
        out = kernel(buffers={0: arg_bytes, 1: src0, 2: src1,
                              3: mtwork.new_buffer(out_bytes)},
                     threadgroup_memory={0: threadgroup_bytes}, threadgroups=groups,
                     threads_per_threadgroup=threads)
        return out["dst"].view(np.float32).reshape(shape.n, shape.m)

    return run


# --- the same product in numpy, and its reference ----------------------------------------


def quantize(w: np.ndarray) -> np.ndarray:
    """W [M, K] as q4_0 blocks, [M, K / 32 * 18] bytes (the gguf package's quantiser)."""
    from gguf import GGMLQuantizationType, quants

    return np.ascontiguousarray(quants.quantize(w.astype(np.float32),
                                                GGMLQuantizationType.Q4_0))


def reference(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dst [N, M] in float64 from the gguf package's q4_0 dequantiser."""
    from gguf import GGMLQuantizationType, quants

    w = quants.dequantize(weights, GGMLQuantizationType.Q4_0).astype(np.float64)
    return x.astype(np.float64) @ w.T


def numpy_matmul(weights: np.ndarray, x: np.ndarray) -> Any:
    """numpy's way to the same product: dequantise every block, then a float32 matmul."""
    rows = weights.shape[0]
    blocks = weights.reshape(rows, -1, Q4_0_BYTES)
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(np.float32)
    nibbles = blocks[..., 2:]

    def run() -> np.ndarray:
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float32) - 8.0
        return x @ (q * scales).reshape(rows, -1).T

    return run
