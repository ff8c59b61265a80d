"""The checks of a `load_metal` kernel's call arguments that need the kernel's
signature: threadgroup memory sizes, and how a parameter is named in their messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .errors import ThreadgroupMemoryError
from .limits import THREADGROUP_MEMORY_ALIGNMENT, THREADGROUP_MEMORY_BYTES
from .msl.signature import KernelParam

__all__ = ["describe", "threadgroup_sizes"]


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
