"""The checks of a `load_metal` kernel's call arguments that need the kernel's
signature: buffers bound by index or name, threadgroup memory sizes, and how a parameter
is named in their messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from .errors import ThreadgroupMemoryError
from .limits import THREADGROUP_MEMORY_ALIGNMENT, THREADGROUP_MEMORY_BYTES
from .msl.signature import KernelParam, KernelSignature

__all__ = ["chosen_buffers", "describe", "threadgroup_sizes"]


def describe(p: KernelParam) -> str:
    return f"{p.kind}({p.index}) `{p.name}` ({p.type_text})"


def threadgroup_sizes(kernel: str, params: Sequence[KernelParam],
                      sizes: Mapping[int | str, int] | None,
                      limit: int = THREADGROUP_MEMORY_BYTES) -> dict[int, int]:
    """Bytes of each ``[[threadgroup(n)]]`` argument of `kernel` (`params`), by index in
    increasing order, from a call's ``threadgroup_memory``; together at most `limit`
    (the GPU family's threadgroup memory)."""
    if sizes is not None and not isinstance(sizes, Mapping):
        raise TypeError("`threadgroup_memory` maps [[threadgroup(n)]] indices or names "
                        f"to sizes in bytes, got {type(sizes).__name__}")
    given: dict[int, int] = {}
    for key, size in (sizes or {}).items():
        p = None if isinstance(key, bool) else next(
            (q for q in params if key in (q.index, q.name)), None)
        if p is None:
            have = ", ".join(describe(q) for q in params) or "none"
            raise TypeError(f"kernel `{kernel}` has no threadgroup({key}) argument; "
                            f"it has: {have}")
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{describe(p)}: the size is a number of bytes (0 or more), "
                             f"got {size!r}")
        if size % THREADGROUP_MEMORY_ALIGNMENT:
            raise ValueError(f"{describe(p)}: {size} bytes is not a multiple of 16, as "
                             f"Metal's setThreadgroupMemoryLength requires")
        given[p.index] = int(size)  # type: ignore[index]
    missing = [p for p in params if p.index not in given]
    if missing:
        raise TypeError(f"kernel `{kernel}`: give the size in bytes of "
                        + ", ".join(describe(p) for p in missing)
                        + " with threadgroup_memory={index: bytes}")
    total = sum(given.values())
    if total > limit:
        raise ThreadgroupMemoryError(
            kernel, f"its [[threadgroup(n)]] arguments take {total} bytes, more than "
                    f"the {limit} bytes ({limit // 1024} KiB) a threadgroup has")
    return dict(sorted(given.items()))


def chosen_buffers(kernel: str, signature: KernelSignature,
                   buffers: Mapping[int | str, Any] | Sequence[Any] | None
                   ) -> dict[str, tuple[KernelParam, Any]]:
    """The buffers a call of `kernel` binds, by parameter name: `buffers` maps
    ``[[buffer(n)]]`` indices or names to values, or is a sequence by index."""
    params = signature.buffers
    if buffers is None:
        buffers = {}
    if isinstance(buffers, (str, bytes, np.ndarray, mx.array)):
        raise TypeError("`buffers` maps [[buffer(n)]] indices or parameter names to "
                        f"values (or is a list by index), got {type(buffers).__name__}")
    if not isinstance(buffers, Mapping):
        buffers = dict(enumerate(buffers))
    by_index = {p.index: p for p in params}
    by_name = {p.name: p for p in params}
    chosen: dict[str, tuple[KernelParam, Any]] = {}
    for key, value in buffers.items():
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            p = by_index.get(int(key))
        elif isinstance(key, str):
            p = by_name.get(key)
        else:
            raise TypeError(f"buffers are bound by index (int) or name (str), not {key!r}")
        if p is None:
            raise TypeError(_no_such_buffer(kernel, signature, key))
        if p.name in chosen:
            raise TypeError(f"{describe(p)} is bound twice (by index and by name)")
        chosen[p.name] = (p, value)
    return chosen


def _no_such_buffer(kernel: str, signature: KernelSignature, key: int | str) -> str:
    other = next((p for p in signature.params if p.name == key), None)
    if other is not None and other.kind == "threadgroup":
        return (f"`{key}` is threadgroup memory: give its size in bytes with "
                f"threadgroup_memory={{{other.index}: ...}}")
    if other is not None and other.kind == "attribute":
        return f"`{key}` is the thread attribute [[{other.attribute}]]: the dispatch sets it"
    what = f"buffer({key})" if isinstance(key, int) else f"buffer named `{key}`"
    have = ", ".join(describe(p) for p in signature.buffers) or "none"
    return f"kernel `{kernel}` has no {what}; its buffers are: {have}"
