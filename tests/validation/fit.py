"""The model's fitted parameter, chosen on one part of the validation set and tried on the
other (two-fold cross-validation).

One parameter is fitted: `Assumptions.memory_parallelism`, the bytes a core's loads keep
in flight in multiples of its share of Little's law at full bandwidth (the chip's
published bandwidth and DRAM latency; at least 1, or a copy could not reach the measured
bandwidth). A part's fit is the candidate with the least mean
|log(modelled ratio / published ratio)| over the part's pairs; every other parameter is
a published measurement (`mtwork.gpu.model`, `mtwork.gpu.chip_table`). The set's parts
alternate along the catalog (`catalog.PAIRS`: even places "fit", odd "held out"), so
every family of pairs is in both; the library's default is the fit on the "fit" part,
and the "held out" part's errors are the model's on pairs it was not fitted to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from mtwork.gpu import Assumptions

from .evaluate import Row, model_dispatches
from .pairs import Dispatches, Pair

PARAMETER = "memory_parallelism"
CANDIDATES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 1e9)


@dataclass(frozen=True)
class Fit:
    value: float
    loss: float  # mean |log(modelled ratio / published ratio)| on the part it was fitted on
    pairs: int


def loss(rows: Sequence[Row]) -> float:
    return sum(abs(math.log(r.modelled / r.published)) for r in rows) / len(rows)


def rows_with(pairs: Sequence[Pair], dispatches: Sequence[tuple[Dispatches, Dispatches]],
              value: float) -> list[Row]:
    """Every pair modelled with the parameter at `value` (its sides' dispatches given)."""
    a = replace(Assumptions(), **{PARAMETER: value})
    return [model_dispatches(p, d, a) for p, d in zip(pairs, dispatches)]


def fit(pairs: Sequence[Pair], dispatches: Sequence[tuple[Dispatches, Dispatches]]) -> Fit:
    """The candidate value with the least loss on `pairs`."""
    if not pairs:
        raise ValueError("fit(pairs=...) needs at least one pair, got none")
    best = min(CANDIDATES, key=lambda v: loss(rows_with(pairs, dispatches, v)))
    return Fit(best, loss(rows_with(pairs, dispatches, best)), len(pairs))
