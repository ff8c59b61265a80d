"""llama.cpp's kernel argument structs (``ggml_metal_kargs_*`` of ggml-metal-impl.h), packed
as its host code fills them.

The layout is the compiler's, not ours: a small C++ file that includes the header and
lists ``sizeof`` and each field's ``offsetof`` in a constant is compiled with mtwork's clang
(`mtwork.toolchain`), once per header text, and the constant read from the LLVM IR it
emits becomes a numpy structured dtype. Only the fields' names and element types are
read from the header's text, to write that program and to choose numpy types, and the
compiler's sizes check them.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from mtwork.toolchain import run_clang

from .llama_cpp_sdist import cache_dir, ggml_src

__all__ = ["impl_define", "layout", "pack"]

# C types of the header's fields and their numpy equivalents (Metal's sizes: size_t is 64-bit).
_NUMPY = {"int8_t": "i1", "uint8_t": "u1", "int16_t": "i2", "uint16_t": "u2",
          "int32_t": "i4", "uint32_t": "u4", "int": "i4", "int64_t": "i8",
          "uint64_t": "u8", "size_t": "u8", "float": "f4", "bool": "?"}
_STRUCT = re.compile(r"typedef\s+struct\s*\{(?P<body>[^{}]*)\}\s*(?P<name>\w+)\s*;")
_FIELD = re.compile(r"^\s*(?P<type>\w+)\s+(?P<name>\w+)\s*(?:\[\s*(?P<count>\d+)\s*\])?\s*;",
                    re.M)


def _header() -> Path:
    return ggml_src() / "ggml-metal" / "ggml-metal-impl.h"


def _without_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


def _declared(text: str) -> dict[str, list[tuple[str, str, int]]]:
    """Each struct's fields as (C type, name, element count), in declaration order."""
    out = {}
    for m in _STRUCT.finditer(_without_comments(text)):
        fields = [(f["type"], f["name"], int(f["count"] or 1))
                  for f in _FIELD.finditer(m["body"])]
        unknown = [t for t, _, _ in fields if t not in _NUMPY]
        if unknown:
            raise ValueError(f"{m['name']}: field type {unknown[0]} has no numpy equivalent")
        out[m["name"]] = fields
    return out


def _program(structs: Mapping[str, list[tuple[str, str, int]]]) -> str:
    """C++ whose one constant lists, per struct, its size and each field's offset and size."""
    values = []
    for name, fields in structs.items():
        values.append(f"sizeof({name})")
        values += [f"offsetof({name}, {f}), sizeof((({name} *)0)->{f})" for _, f, _ in fields]
    return ("#include <stddef.h>\n#include <stdint.h>\n#include \"ggml-metal-impl.h\"\n"
            "extern const unsigned long long mtw_layout[] = {\n  "
            + ",\n  ".join(values) + "\n};\n")


_CONSTANT = re.compile(r"@mtw_layout = [^\[]*\[\d+ x i64\] \[(?P<values>[^\]]*)\]")


def _measured(header: Path, program: str) -> list[int]:
    """The numbers `program` lists, as clang computes them (read from its LLVM IR: nothing
    is linked or run)."""
    with tempfile.TemporaryDirectory() as tmp:
        source, ir = Path(tmp) / "layout.cpp", Path(tmp) / "layout.ll"
        source.write_text(program)
        built = run_clang(["-std=c++17", "-S", "-emit-llvm", "-o", str(ir), "-I",
                           str(header.parent), str(source)], "the layout of ggml-metal-impl.h")
        found = _CONSTANT.search(ir.read_text()) if ir.is_file() else None
    if built.returncode or found is None:
        raise RuntimeError(f"the layout program does not compile:\n{built.stderr}")
    return [int(v.split()[1]) for v in found["values"].split(",")]


def _dtypes(structs: Mapping[str, list[tuple[str, str, int]]], numbers: list[int]
            ) -> dict[str, dict[str, Any]]:
    """Each struct as numpy's dtype arguments (names, formats, offsets, itemsize)."""
    out: dict[str, dict[str, Any]] = {}
    values = iter(numbers)
    for name, fields in structs.items():
        spec: dict[str, Any] = {"names": [], "formats": [], "offsets": [],
                                "itemsize": next(values)}
        for ctype, field, count in fields:
            offset, nbytes = next(values), next(values)
            fmt = _NUMPY[ctype] if count == 1 else f"({count},){_NUMPY[ctype]}"
            if np.dtype(fmt).itemsize != nbytes:
                raise ValueError(f"{name}.{field}: the compiler says {nbytes} bytes, the "
                                 f"header's text reads as {fmt}")
            spec["names"].append(field)
            spec["formats"].append(fmt)
            spec["offsets"].append(offset)
        out[name] = spec
    return out


@cache
def _layouts() -> dict[str, dict[str, Any]]:
    header = _header()
    text = header.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    stored = cache_dir() / f"kargs-layout-{digest}.json"
    if stored.is_file():
        return json.loads(stored.read_text())
    structs = _declared(text)
    found = _dtypes(structs, _measured(header, _program(structs)))
    partial = stored.with_suffix(".partial")
    partial.write_text(json.dumps(found))
    partial.replace(stored)
    return found


def layout(struct: str) -> np.dtype:
    """The numpy dtype of ``struct`` (e.g. ``"ggml_metal_kargs_mul_mv"``)."""
    spec = _layouts().get(struct)
    if spec is None:
        raise KeyError(f"ggml-metal-impl.h declares no struct {struct}")
    return np.dtype(spec)


def pack(struct: str, *tensors: Mapping[str, Any], **fields: Any) -> bytes:
    """``struct`` filled as a host fills it: `tensors` are tensor locals (``ne00``, ``nb01``,
    ...; names the struct does not have are left out, as the host's locals are), `fields`
    the rest (each must be a field). Fields given nowhere are zero."""
    dtype = layout(struct)
    unknown = set(fields) - set(dtype.names or ())
    if unknown:
        raise KeyError(f"{struct} has no field {', '.join(sorted(unknown))}; it has "
                       f"{', '.join(dtype.names or ())}")
    value = np.zeros((), dtype)
    for source in (*tensors, fields):
        for name, v in source.items():
            if name in (dtype.names or ()):
                value[name] = v
    return value.tobytes()


def impl_define(name: str) -> int:
    """An integer ``#define`` of ggml-metal-impl.h (``N_R0_Q4_0``, ``FC_MUL_MV``, ...)."""
    found = re.search(rf"^#define\s+{name}\s+(\d+)\s*(?://.*)?$", _header().read_text(), re.M)
    if found is None:
        raise KeyError(f"ggml-metal-impl.h defines no integer {name}")
    return int(found.group(1))


def impl_defines(names: Sequence[str]) -> dict[str, int]:
    return {n: impl_define(n) for n in names}
