"""Metal's scalar and vector types as mtwork binds them: names, dtypes and layouts."""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx

__all__ = ["METAL_TYPE_NAMES", "SCALAR_TYPES", "TypeInfo", "normalise_type", "strip_top_const",
           "type_info"]


def normalise_type(text: str) -> str:
    """Type text with whitespace normalised: ``const  device T *`` -> ``const device T*``."""
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s*([*&])", r"\1", text)
    return re.sub(r"\s*([<>,])\s*", lambda m: m.group(1) + (" " if m.group(1) == "," else ""),
                  text)


def strip_top_const(type_text: str) -> str:
    """``device T* const`` -> ``device T*``: a const pointer still points at writable data."""
    return re.sub(r"([*&])\s*const\s*$", r"\1", type_text.strip())


# Metal's scalar type names (and the typedefs MLX and C++ add) with the MLX dtype of the
# same bytes.
SCALAR_TYPES: dict[str, mx.Dtype] = {
    "bool": mx.bool_,
    "char": mx.int8, "int8_t": mx.int8,
    "uchar": mx.uint8, "unsigned char": mx.uint8, "uint8_t": mx.uint8,
    "short": mx.int16, "int16_t": mx.int16,
    "ushort": mx.uint16, "unsigned short": mx.uint16, "uint16_t": mx.uint16,
    "int": mx.int32, "int32_t": mx.int32,
    "uint": mx.uint32, "unsigned": mx.uint32, "unsigned int": mx.uint32, "uint32_t": mx.uint32,
    "long": mx.int64, "int64_t": mx.int64,
    "ulong": mx.uint64, "unsigned long": mx.uint64, "uint64_t": mx.uint64, "size_t": mx.uint64,
    "half": mx.float16, "float16_t": mx.float16,
    "bfloat": mx.bfloat16, "bfloat16_t": mx.bfloat16,
    "float": mx.float32, "float32_t": mx.float32,
    "complex64_t": mx.complex64,
}

# The Metal spelling of each dtype, used to write template arguments.
METAL_TYPE_NAMES: dict[mx.Dtype, str] = {
    mx.bool_: "bool", mx.int8: "char", mx.uint8: "uchar", mx.int16: "short",
    mx.uint16: "ushort", mx.int32: "int", mx.uint32: "uint", mx.int64: "long",
    mx.uint64: "ulong", mx.float16: "half", mx.bfloat16: "bfloat", mx.float32: "float",
    mx.complex64: "complex64_t",
}


@dataclass(frozen=True)
class TypeInfo:
    """A Metal scalar or vector type: its element dtype, lane count and lanes in memory
    (a three-lane vector takes the room of four unless it is ``packed_``)."""

    dtype: mx.Dtype
    lanes: int = 1
    storage_lanes: int = 1

    @property
    def nbytes(self) -> int:
        return self.dtype.size * self.storage_lanes


_VECTOR = re.compile(r"^(?P<packed>packed_)?(?P<scalar>[a-z]+?)(?P<n>[234])$")
_VEC_TEMPLATE = re.compile(r"^vec<(?P<scalar>[\w ]+), (?P<n>[234])>$")
_ATOMIC = re.compile(r"^(?:atomic<(?P<inner>[\w ]+)>|atomic_(?P<short>\w+))$")


def type_info(type_text: str) -> TypeInfo | None:
    """What a scalar, vector or atomic type holds; None for other types (structs, ...)."""
    text = normalise_type(re.sub(r"\b(?:const|volatile)\b", " ", type_text))
    text = re.sub(r"^(?:metal|::metal)::", "", text)
    atomic = _ATOMIC.match(text)
    if atomic:
        text = atomic.group("inner") or atomic.group("short")
    if text in SCALAR_TYPES:
        return TypeInfo(SCALAR_TYPES[text])
    vec = _VECTOR.match(text) or _VEC_TEMPLATE.match(text)
    if vec and vec.group("scalar").strip() in SCALAR_TYPES:
        n = int(vec.group("n"))
        packed = vec.groupdict().get("packed")
        return TypeInfo(SCALAR_TYPES[vec.group("scalar").strip()], n,
                        4 if n == 3 and not packed else n)
    return None
