"""The validation set's records: a published before/after timing of Apple-GPU kernels,
the two published sources it compares, how their host code dispatched them, and the chip.

A `Pair` is measured at one of two levels:

* "kernel": the published figures time the kernels themselves (GPU time, or an
  operation's call whose time the kernels set); the model's times and ratio are compared
  with them directly.
* "token": the published figures are whole tokens of a model (ms per token, tokens per
  second), of which the changed kernels are a part. The model gives the changed kernels
  only, so it is held to bounds: their modelled time is at most the measured token, and
  their modelled ratio at least the published one (the rest of the token, unchanged,
  can only dilute it).

Each pair says what its figures time (`timed`): the kernels' GPU time, or calls that
encode them and wait (the model then adds its host cost per dispatch and a round trip).
Each pair says which part of the set it is in: "fit" pairs may be used to choose the
model's calibrated parameters, "held out" pairs never are (the cross-validation
`validation.evaluate` reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mtwork.gpu import Counters

Level = Literal["kernel", "token"]
Timed = Literal["gpu", "call"]
Part = Literal["fit", "held out"]
Dispatches = list[tuple[Counters, int]]


@dataclass(frozen=True)
class Side:
    """One side of a pair: its published source and the dispatches of what was timed."""

    source: str  # the package and version its kernels come from
    kernels: str  # the kernel (or kernels) that changed, as their source names them
    dispatches: Callable[[], Dispatches]  # (counters, times run) of the timed work


@dataclass(frozen=True)
class Published:
    """The published figures: seconds before and after (per token or per call), or only
    a speed-up (`before` / `after`) where no times were given."""

    url: str  # where it was published (a project seed is named as such)
    says: str  # what was measured, as the source reports it
    ratio: float  # before time / after time
    before: float | None = None  # seconds
    after: float | None = None


@dataclass(frozen=True)
class Pair:
    name: str
    level: Level
    chip: str  # a name mtwork.gpu knows
    published: Published
    before: Side
    after: Side
    part: Part = "held out"
    # "gpu": the figures are GPU time of the kernels; "call": calls that encode the
    # dispatches and wait for them (host time per dispatch and a round trip added)
    timed: Timed = "call"

    def __post_init__(self) -> None:
        p = self.published
        if (p.before is not None and p.after is not None
                and abs(p.before / p.after - p.ratio) > 0.02 * p.ratio):
            raise ValueError(f"{self.name}: published ratio {p.ratio} is not "
                             f"{p.before} / {p.after}")


def per_token(tokens_per_second: float) -> float:
    return 1.0 / tokens_per_second
