"""Seeing the kernel calls a piece of code makes: how the tools model a plain callable (a
family's `run`, a function around one `Launch`) whose kernels they cannot see.

`backends.run` reports every call it completes (`record`). Within `watching_calls()` the
list it yields gets each call's program label, at no cost to the call: how many kernels a
callable dispatches. Within `profiling_calls()`, `dispatch.options` turns on the profiler
for every call of either kernel form that is not sanitized (so it runs on sim), and the
list gets each call's `Completion`, with its counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol


class _Labelled(Protocol):
    """A program as the seam reports it (`dispatch.Program`): only its label is read here,
    so this module needs nothing from `dispatch`, which reads `profiling_all`."""

    @property
    def label(self) -> str: ...


# A call's `dispatch.Completion`; kept whole for whoever profiles, read here for its counters.
Completion = Any

__all__ = ["profiling_all", "profiling_calls", "record", "watching_calls"]

_profiled: ContextVar[list[Completion] | None] = ContextVar("mtwork_profiled_calls",
                                                            default=None)
_watched: ContextVar[list[str] | None] = ContextVar("mtwork_watched_calls", default=None)


@contextmanager
def profiling_calls() -> Iterator[list[Completion]]:
    """Every kernel call inside the block is profiled; the list holds their completions."""
    kept: list[Completion] = []
    token = _profiled.set(kept)
    try:
        yield kept
    finally:
        _profiled.reset(token)


@contextmanager
def watching_calls() -> Iterator[list[str]]:
    """The list holds the label of every kernel call made inside the block."""
    seen: list[str] = []
    token = _watched.set(seen)
    try:
        yield seen
    finally:
        _watched.reset(token)


def profiling_all() -> bool:
    """Whether a `profiling_calls` block is active here."""
    return _profiled.get() is not None


def record(program: _Labelled, completion: Completion) -> None:
    """Notes a completed call for the `watching_calls` and `profiling_calls` blocks
    around it."""
    seen = _watched.get()
    if seen is not None:
        seen.append(program.label)
    kept = _profiled.get()
    if kept is not None and completion.counters is not None:
        kept.append(completion)
