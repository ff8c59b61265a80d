"""Profiling every kernel call a piece of code makes: how the tools model a plain callable
(a family's `run`, a function around one `Launch`) whose kernels they cannot see.

Within `profiling_calls()`, `dispatch.options` turns on the profiler for every call of
either kernel form that is not sanitized (so it runs on sim), and `backends.run` keeps
each profiled call's `Completion`, in call order, in the list the block yields.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dispatch import Completion

__all__ = ["profiling_all", "profiling_calls", "record_profiled"]

_kept: ContextVar[list[Completion] | None] = ContextVar("mtwork_profiled_calls",
                                                        default=None)


@contextmanager
def profiling_calls() -> Iterator[list[Completion]]:
    """Every kernel call inside the block is profiled; the list holds their completions."""
    kept: list[Completion] = []
    token = _kept.set(kept)
    try:
        yield kept
    finally:
        _kept.reset(token)


def profiling_all() -> bool:
    """Whether a `profiling_calls` block is active here."""
    return _kept.get() is not None


def record_profiled(completion: Completion) -> None:
    """Keeps a profiled call's completion for the `profiling_calls` block around it."""
    kept = _kept.get()
    if kept is not None and completion.counters is not None:
        kept.append(completion)
