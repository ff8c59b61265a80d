"""Counters of a large dispatch from those of a part of it that the emulator can run.

A kernel whose threadgroups do the same work on data of their own (rows of a matrix,
heads, batches) can be profiled on a slice of its grid and taken to the whole: every count
grows with the copies of the slice, except the lines of buffers every copy reads (a
vector all rows multiply), which reach DRAM once whatever the copies. A kernel that does
the same per step (a token of a recurrence) can be profiled at two step counts and taken
to any: each count is affine in the steps. Source-line numbers and the geometry are
labels, not counts, and stay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from typing import TypeVar

from .counters import BufferTraffic, Counters, LaneOps, SimdOps, SourceLine

__all__ = ["at_steps", "scaled"]

_LABELS = {"kernel", "threads_per_threadgroup", "threadgroup_memory", "registers",
           "dispatches", "line_bytes", "buffer", "line", "file"}
Record = TypeVar("Record", LaneOps, SimdOps, BufferTraffic, SourceLine)


def scaled(counters: Counters, copies: int, *, shared: Iterable[str] = (),
           distinct_lines: Mapping[str, int] | None = None) -> Counters:
    """The counts of a dispatch of `copies` copies of `counters`' threadgroups, each on
    data of its own (every count times `copies`), except `shared` buffers' distinct lines
    (each copy reads the same ones) and the buffers of `distinct_lines`, whose distinct
    lines over the whole dispatch are known (a matrix all tiles read, each part by some
    of them). A remainder that is not a whole copy is profiled on its own and added
    (`a + b`)."""
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"scaled(copies=...) must be a whole number >= 1, got {copies!r}")
    shared = set(shared)
    known = dict(distinct_lines or {})
    unknown = (shared | set(known)) - {b.buffer for b in counters.buffers}
    if unknown:
        raise ValueError(f"scaled(shared=..., distinct_lines=...): no buffer "
                         f"{sorted(unknown)} in `"
                         f"{counters.kernel}`; buffers: "
                         f"{', '.join(b.buffer for b in counters.buffers)}")

    def times(x: int, _y: int) -> int:
        return x * copies

    out = _combine(counters, counters, times)
    buffers = tuple(replace(b, distinct_lines=orig.distinct_lines) if b.buffer in shared
                    else replace(b, distinct_lines=min(known[b.buffer], b.transactions))
                    if b.buffer in known else b
                    for b, orig in zip(out.buffers, counters.buffers))
    return replace(out, buffers=buffers)


def at_steps(a: Counters, b: Counters, steps: tuple[int, int], at: int) -> Counters:
    """The counts at `at` steps of a kernel that does the same per step, from its counts
    `a` and `b` at `steps` (each count affine in the steps: exact integers or an error)."""
    lo, hi = steps

    def affine(x: int, y: int) -> int:
        grown, rest = divmod((y - x) * (at - lo), hi - lo)
        if rest:
            raise ValueError(f"counts {x} at {lo} steps and {y} at {hi} are not affine "
                             f"to {at}")
        return x + grown

    return _combine(a, b, affine)


def _combine(a: Counters, b: Counters, f: Callable[[int, int], int]) -> Counters:
    """`f` applied to every count of `a` and `b` (labels and geometry are `a`'s)."""
    for name in ("kernel", "threads_per_threadgroup", "line_bytes"):
        if getattr(a, name) != getattr(b, name):
            raise ValueError(f"counters differ in {name}: {getattr(a, name)!r} vs "
                             f"{getattr(b, name)!r}")
    theirs = {x.buffer: x for x in b.buffers}
    lines = {(x.file, x.line): x for x in b.source_lines}
    missing = [x.buffer for x in a.buffers if x.buffer not in theirs]
    if missing:
        raise ValueError(f"counters differ in buffers: {missing} only in one")
    return replace(
        a, **_counts(a, b, f),
        ops=_record(a.ops, b.ops, f), simd=_record(a.simd, b.simd, f),
        buffers=tuple(_record(x, theirs[x.buffer], f) for x in a.buffers),
        source_lines=tuple(_record(x, lines.get((x.file, x.line), x), f)
                           for x in a.source_lines))


def _counts(a: Counters, b: Counters, f: Callable[[int, int], int]) -> dict[str, int]:
    return {field.name: f(getattr(a, field.name), getattr(b, field.name))
            for field in fields(Counters)
            if field.type == "int" and field.name not in _LABELS}


def _record(a: Record, b: Record, f: Callable[[int, int], int]) -> Record:
    return replace(a, **{field.name: f(getattr(a, field.name), getattr(b, field.name))
                         for field in fields(a)
                         if field.type == "int" and field.name not in _LABELS})
