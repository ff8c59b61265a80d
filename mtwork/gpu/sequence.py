"""Modelled time of several dispatches run in order: an operation made of several kernels,
or the kernels of one token of a model.

The GPU runs a command buffer's dispatches one after another, so their modelled GPU
times (`mtwork.gpu.estimate`, launch included) add. The host (CPU) encodes each dispatch
(`Assumptions.host_seconds_per_dispatch`) and, where the caller waits for the result,
pays a command buffer's round trip once (`Assumptions.sync_seconds`); a call's time is
the sum. Host time is a small, published constant per dispatch, not a model of the
caller's program (graph construction, Python): measured timings that include those are
longer than this by what they include.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..display import html_table, seconds_text, text_table
from .catalog import default_gpu, gpu
from .chips import Chip
from .counters import Counters
from .model import Assumptions, Estimate, estimate

__all__ = ["Sequence", "estimate_sequence"]


@dataclass(frozen=True)
class Sequence:
    """Dispatches run in order: each distinct dispatch's estimate and how often it runs."""

    chip: str
    steps: tuple[tuple[Estimate, int], ...]
    synchronous: bool = True  # the caller waits for the result (one round trip)
    assumptions: Assumptions = field(default_factory=Assumptions)

    @property
    def dispatches(self) -> int:
        return sum(n for _, n in self.steps)

    @property
    def gpu_seconds(self) -> float:
        return sum(e.seconds * n for e, n in self.steps)

    @property
    def host_seconds(self) -> float:
        a = self.assumptions
        return self.dispatches * a.host_seconds_per_dispatch + (
            a.sync_seconds if self.synchronous else 0.0)

    @property
    def seconds(self) -> float:
        return self.gpu_seconds + self.host_seconds

    @property
    def bound(self) -> str:
        """The bound of the dispatches that take the most GPU time, or "host"."""
        by_bound: dict[str, float] = {"host": self.host_seconds}
        for e, n in self.steps:
            by_bound[e.bound] = by_bound.get(e.bound, 0.0) + e.seconds * n
        return max(by_bound, key=by_bound.__getitem__)

    def _rows(self) -> list[list[str]]:
        return [[e.kernel, str(n), seconds_text(e.seconds), seconds_text(e.seconds * n),
                 e.bound] for e, n in self.steps]

    def summary(self) -> str:
        return (f"{self.dispatches} dispatches on {self.chip}: {seconds_text(self.seconds)} "
                f"modelled ({seconds_text(self.gpu_seconds)} GPU, "
                f"{seconds_text(self.host_seconds)} host), mostly {self.bound}")

    def __str__(self) -> str:
        return "\n".join([f"Sequence of {self.summary()}",
                          *text_table(["kernel", "times", "each", "total", "bound"],
                                      self._rows(), indent="  ")])

    def _repr_html_(self) -> str:
        return html_table(caption=f"Sequence of {self.summary()}",
                          header=["kernel", "times", "each", "total", "bound"],
                          rows=self._rows())


def estimate_sequence(dispatches: Iterable[Counters | tuple[Counters, int]],
                      chip: Chip | str | None = None,
                      assumptions: Assumptions | None = None, *,
                      synchronous: bool = True) -> Sequence:
    """The modelled time of `dispatches` run in order on `chip`: each a `Counters`, or a
    `(Counters, times)` pair for one that runs `times` times (a layer's kernels × layers).
    `synchronous`: the caller waits for the result (adds one command buffer round trip)."""
    chip = default_gpu() if chip is None else gpu(chip) if isinstance(chip, str) else chip
    a = assumptions or Assumptions()
    steps = []
    for item in dispatches:
        counters, times = item if isinstance(item, tuple) else (item, 1)
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise ValueError(f"estimate_sequence: a dispatch runs a whole number of times "
                             f">= 1, got {times!r} for `{getattr(counters, 'kernel', counters)}`")
        steps.append((estimate(counters, chip, a), times))
    if not steps:
        raise ValueError("estimate_sequence needs at least one dispatch")
    return Sequence(chip.label, tuple(steps), synchronous, a)
