"""ggml tensors for llama.cpp's kernels: bytes in ggml's layout, with ggml's shape and
strides, and the values they hold as float64 for references.

ggml counts dimensions from the innermost: ``ne[0]`` is a row's length and ``nb[i]`` the
byte stride of dimension ``i`` (``nb[0]`` an element's or a quantised block's size). A
numpy array of shape ``(ne3, ne2, ne1, ne0)`` (or fewer leading axes) in C order is such a
tensor. Encodings come from the `gguf` package (its quantisers and dequantisers, its
block sizes), never from the kernels under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

__all__ = ["Tensor", "blocks", "decode", "encoded", "integers", "locals_of", "random_blocks"]

_QUANT = {"bf16": GGMLQuantizationType.BF16, "q4_0": GGMLQuantizationType.Q4_0,
          "q8_0": GGMLQuantizationType.Q8_0, "q4_K": GGMLQuantizationType.Q4_K,
          "q6_K": GGMLQuantizationType.Q6_K}
_PLAIN = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def blocks(gtype: str) -> tuple[int, int]:
    """(elements a block holds, bytes a block takes) of ggml type `gtype` (gguf's table)."""
    if gtype in _PLAIN:
        return 1, np.dtype(_PLAIN[gtype]).itemsize
    if gtype not in _QUANT:
        raise ValueError(f"unknown ggml type {gtype!r}; known: {', '.join([*_PLAIN, *_QUANT])}")
    return GGML_QUANT_SIZES[_QUANT[gtype]]


@dataclass(frozen=True)
class Tensor:
    """A contiguous ggml tensor: its bytes, ggml type, ``ne`` and ``nb`` (4 each), and the
    values it holds (float64, numpy shape ``(ne3, ne2, ne1, ne0)``) for references."""

    data: np.ndarray  # uint8, C order
    gtype: str
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    def locals(self, prefix: str) -> dict[str, int]:
        """ggml's ``GGML_TENSOR_LOCALS`` of this tensor: ``ne{prefix}0`` ... ``nb{prefix}3``."""
        return locals_of(prefix, self.ne, self.nb)


def locals_of(prefix: str, ne: Sequence[int], nb: Sequence[int]) -> dict[str, int]:
    out = {f"ne{prefix}{i}": int(n) for i, n in enumerate(ne)}
    out.update({f"nb{prefix}{i}": int(n) for i, n in enumerate(nb)})
    return out


def _shape4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"a ggml tensor has 1 to 4 dimensions, got shape {tuple(shape)}")
    ne = tuple(int(d) for d in reversed(shape)) + (1,) * (4 - len(shape))
    return ne  # type: ignore[return-value]


def _strides(gtype: str, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    per_block, block_bytes = blocks(gtype)
    if ne[0] % per_block:
        raise ValueError(f"{gtype} rows hold whole blocks of {per_block}; ne0 = {ne[0]}")
    nb = [block_bytes, block_bytes * (ne[0] // per_block)]
    nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
    return tuple(nb)  # type: ignore[return-value]


def _tensor(data: np.ndarray, gtype: str, values: np.ndarray) -> Tensor:
    ne = _shape4(values.shape)
    return Tensor(np.ascontiguousarray(data).reshape(-1).view(np.uint8), gtype, ne,
                  _strides(gtype, ne), np.asarray(values, dtype=np.float64))


def encoded(values: np.ndarray, gtype: str) -> Tensor:
    """`values` stored as `gtype` (rounded or quantised by numpy / gguf); the tensor's
    `values` are what the bytes hold, decoded again."""
    values = np.asarray(values)
    if gtype in _PLAIN:
        data = values.astype(_PLAIN[gtype])
        return _tensor(data, gtype, data.astype(np.float64))
    qtype = _QUANT.get(gtype)
    if qtype is None:
        raise ValueError(f"unknown ggml type {gtype!r}")
    data = quants.quantize(values.astype(np.float32), qtype)
    return _tensor(data, gtype, quants.dequantize(data, qtype).reshape(values.shape))


def integers(values: np.ndarray, gtype: str = "i32") -> Tensor:
    """An index tensor (``i32`` or ``i64``)."""
    return encoded(np.asarray(values), gtype)


def random_blocks(shape: Sequence[int], gtype: str, rng: np.random.Generator, *,
                  scale: float = 0.02) -> Tensor:
    """A `gtype` tensor of random blocks (for types gguf cannot quantise to, e.g. the
    K-quants): random bytes with each block's float16 scales set near `scale`; the values
    are gguf's dequantisation of them."""
    qtype = _QUANT[gtype]
    per_block, block_bytes = blocks(gtype)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    n_blocks = rows * (shape[-1] // per_block)
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in _scale_offsets(gtype, block_bytes):
        d = (scale * (0.5 + rng.random(n_blocks))).astype(np.float16)
        raw[:, offset:offset + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    data = raw.reshape(rows, -1)
    return _tensor(data, gtype, quants.dequantize(data, qtype).reshape(tuple(shape)))


def _scale_offsets(gtype: str, block_bytes: int) -> tuple[int, ...]:
    """Where a block keeps its float16 super-scales (ggml-common.h: block_q4_K starts with
    d and dmin; block_q6_K ends with d)."""
    if gtype == "q4_K":
        return (0, 2)
    if gtype == "q6_K":
        return (block_bytes - 2,)
    raise ValueError(f"random blocks are made for q4_K and q6_K, not {gtype}")


def decode(data: np.ndarray, gtype: str, shape: Sequence[int]) -> np.ndarray:
    """Bytes a kernel wrote as `gtype`, as float64 of numpy shape `shape` (gguf decodes
    bfloat16 and quantised blocks)."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if gtype in _PLAIN:
        count = int(np.prod(shape))
        return raw[:count * np.dtype(_PLAIN[gtype]).itemsize].view(_PLAIN[gtype]) \
            .astype(np.float64).reshape(tuple(shape))
    per_block, block_bytes = blocks(gtype)
    rows = raw[:int(np.prod(shape)) // per_block * block_bytes].reshape(-1, shape[-1] //
                                                                          per_block * block_bytes)
    return quants.dequantize(rows, _QUANT[gtype]).astype(np.float64).reshape(tuple(shape))
