"""A sweep's memory: the JSON-lines cache file it resumes from, and the identity that
keys its entries (what the sweep runs, not where or when)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..kernel import MetalKernel
from .results import CACHE_FORMAT, Record
from .space import Config, canonical

__all__ = ["CacheFile", "identity", "inputs_signature", "record_key"]




class CacheFile:
    """JSON lines, one finished configuration each, appended and flushed at once."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when a run was killed mid-write
                if isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT:
                    self.entries[entry["key"]] = entry

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = record.to_dict()
        with open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # finish a line cut short by a killed run
                    f.write(b"\n")
            f.write((json.dumps(entry) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.entries[record.key] = entry


def identity(*objects: Any) -> str:
    """A digest of what the sweep runs: sources of functions and of the kernels and
    constants they refer to (globals and closures, following plain functions)."""
    h = hashlib.sha256()
    seen: set[int] = set()
    for obj in objects:
        for part in _identity_parts(obj, seen, depth=0):
            h.update(part.encode())
            h.update(b"\0")
    return h.hexdigest()[:24]


def _identity_parts(obj: Any, seen: set[int], depth: int) -> Iterator[str]:
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, MetalKernel):
        yield repr((obj.name, obj.input_names, obj.output_names, obj.source, obj.header,
                    obj.ensure_row_contiguous, obj.atomic_outputs, obj.compile_options))
    elif isinstance(obj, (str, bytes, int, float, bool, type(None), mx.Dtype)):
        yield repr(obj)
    elif isinstance(obj, (tuple, list, frozenset)):
        for item in obj:
            yield from _identity_parts(item, seen, depth + 1)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield repr(k)
            yield from _identity_parts(v, seen, depth + 1)
    elif isinstance(obj, types.FunctionType):
        yield from _function_parts(obj, seen, depth)
    elif callable(obj):
        yield f"{type(obj).__module__}.{type(obj).__qualname__}"


def _function_parts(fn: types.FunctionType, seen: set[int], depth: int) -> Iterator[str]:
    """A function's name and source, and what its globals and closure cells hold."""
    yield f"{fn.__module__}.{fn.__qualname__}"
    try:
        yield inspect.getsource(fn)
    except (OSError, TypeError):
        yield fn.__code__.co_code.hex()
    for name in _global_names(fn.__code__):
        value = fn.__globals__.get(name, _MISSING)
        if value is not _MISSING and not isinstance(value, types.ModuleType):
            yield name
            yield from _identity_parts(value, seen, depth + 1)
    for cell in fn.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield from _identity_parts(contents, seen, depth + 1)


_MISSING = object()


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def inputs_signature(inputs: Sequence[Any]) -> list[str]:
    """Shapes and dtypes of the inputs (not their values: hashing those would make
    every fresh random input a cache miss)."""
    signature = []
    for x in inputs:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        signature.append(repr(x) if shape is None else f"{tuple(shape)} {dtype}")
    return signature


def record_key(identity: str, backend: str, rounds: int, warmup: int, config: Config) -> str:
    text = json.dumps([identity, backend, rounds, warmup, canonical(config)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]
