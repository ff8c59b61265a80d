"""A dispatch's counts from a few of its threadgroups, where those few stand for all.

The profiler counts exactly: every lane's every access is logged and lined up into
SIMD-group issues, which costs 20 to 150 times a plain run of the same threadgroups. Most
kernels do the same work in most threadgroups, at addresses that move by a constant from
one threadgroup to the next (a tile's offset). This module counts a few threadgroups,
each apart with the byte ranges of every device access (`profiling.counting(apart=...,
ranges=...)`, those a box needs in one dispatch, on all cores), and takes a box of the
grid to count as its corner does (`combine.py`) when the threadgroups checked in it agree:

- a box's corner `c` is counted in full; `c + e_d` along each dimension the box spans
  (but the last of a box of 8 or more, whose step the far corner gives) gives each
  access site's step `Δ_d`: how far its ranges move per threadgroup along `d`;
- the box's far corner (of a box of 8 or more: a threadgroup inside it, chosen by a hash
  of the box, so every run picks the same) must match: the same blocks run as often by
  each lane, the same accesses of device memory with the same bytes, every device range
  at the corner's moved by `Σ_d (g_d - c_d) Δ_d` (per site), and the same accesses of
  threadgroup memory and branches, one after the other, as the corner's (compared by a
  hash of each sequence: the threadgroups only checked are not lined up into SIMD-group
  issues, which is most of a count's cost).

A box that fails is split along the dimension that failed (`Sampler._parts`): where the
work is the same at addresses that do not move by a constant, into every k-th slice (a
period, as threadgroups that share a quantised block's header); where the work differs,
off its first or last slice (an edge tile) or in halves; where the work changes from one
slice to the next (a causal mask's trip counts), slice by slice, each slice counted at
its corner and moving across as the first one does (`Sampler._slices`). A box of one
threadgroup is that threadgroup's own count.

Where every threadgroup of a box does what the checks say, the result is exactly what
counting every threadgroup gives. The checks look at a sample, not at every threadgroup:
a threadgroup that differs from its box's corner where none of the checked ones does is
not seen. `whole` gives up (None: count every threadgroup) when a sampled threadgroup
uses device atomics (threadgroups may then depend on each other), when a threadgroup's
ranges do not fit the record, or when the checks would count more than `budget`
threadgroups (a third of a box counted slice by slice).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .combine import Box, GroupCount, Leaf, combine
from .profiling import Profiled

__all__ = ["Sampler", "whole"]

_SMALLEST_CHECKED_INSIDE = 8  # a box this large gets a checked threadgroup inside too
Point = tuple[int, int, int]


class GiveUp(Exception):
    """The sample cannot stand for the whole: count every threadgroup."""


# Periods tried along a dimension whose threadgroups do not move by a constant from one
# to the next: a threadgroup every `k` may (a block of `k` threadgroups reading one
# quantised block's header, say).
_PERIODS = (2, 4, 8, 16, 32, 64, 3, 6, 12, 24, 48)


class Sampler:
    """Splits a grid of threadgroups into boxes that each count as their corner does.
    `count(indices, checked)` counts threadgroups (linear indices, x fastest), each apart,
    those `checked` only to compare them with another (`profiling.counting`); at most
    `budget` are counted. Only the corners that stand for boxes are counted in full."""

    def __init__(self, groups: Point,
                 count: Callable[[list[int], list[bool]], list[Profiled]], budget: int):
        self.groups, self._count, self.budget = groups, count, budget
        self.counted: dict[Point, GroupCount] = {}

    def group(self, p: Point) -> GroupCount:
        """Threadgroup `p` counted in full."""
        self.count([p])
        return self.counted[p]

    def probe(self, p: Point) -> GroupCount:
        """Threadgroup `p` counted at least to be compared with another."""
        self.count([], [p])
        return self.counted[p]

    def count(self, full: list[Point], checked: Sequence[Point] = ()) -> None:
        """Counts, in one dispatch, the threadgroups of `full` not yet counted in full and
        those of `checked` not yet counted at all."""
        new = [(p, False) for p in dict.fromkeys(full)
               if p not in self.counted or self.counted[p].only_checked]
        new += [(p, True) for p in dict.fromkeys(checked)
                if p not in self.counted and p not in full]
        if not new:
            return
        if len(set(self.counted) | {p for p, _ in new}) > self.budget:
            raise GiveUp(f"more than {self.budget} threadgroups to count")
        gx, gy, _ = self.groups
        counted = self._count([p[0] + gx * (p[1] + gy * p[2]) for p, _ in new],
                              [only for _, only in new])
        for (p, _), profiled in zip(new, counted):
            if profiled.ranges is None:
                raise GiveUp("a threadgroup's access ranges did not fit the record")
            found = GroupCount.of(profiled)
            if found.atomics:
                raise GiveUp("device atomics (threadgroups may depend on each other)")
            self.counted[p] = found

    def leaves(self) -> Iterator[Leaf]:
        pending: list[Box | Leaf] = [Box((0, 0, 0), self.groups)]
        while pending:
            found = pending.pop()
            if isinstance(found, Leaf):
                yield found
            else:
                pending.extend(self._examine(found))

    def _examine(self, box: Box) -> list[Box | Leaf]:
        """The box as a leaf, or the parts to examine instead. The steps along each
        dimension come from the threadgroup after the corner, but for a box of 8 or more
        the last dimension's, which comes from the far corner (one threadgroup fewer to
        count: with two cores, a round of counting fewer), checked at a threadgroup
        inside; a smaller box is checked at its far corner."""
        dims = [d for d in range(3) if box.count[d] > 1]
        if not dims:
            corner = self.group(box.lo)
            return [Leaf(box, corner, np.zeros((3, len(corner.site_keys)), np.int64))]
        far = tuple(n - 1 for n in box.count)
        inside = self._inside(box, dims[-1])
        stepped = dims if inside is None else dims[:-1]
        self.count([box.lo], [*(box.at(_unit(d)) for d in stepped), box.at(far),  # type: ignore
                              *([box.at(inside)] if inside is not None else [])])
        corner = self.group(box.lo)
        steps = np.zeros((3, len(corner.site_keys)), np.int64)
        for d in stepped:
            after = self.probe(box.at(_unit(d)))
            step = corner.shifts_to(after)
            if step is None:
                return self._parts(box, None, d, corner.same_work(after))
            steps[d] = step
        checked = far if inside is None else inside
        if inside is not None:
            last = dims[-1]
            derived = self._step_from_far(box, steps, last)
            if derived is None:  # the far corner fails: its step from the next one
                after = self.probe(box.at(_unit(last)))
                step = corner.shifts_to(after)
                if step is None:
                    return self._parts(box, None, last, corner.same_work(after))
                steps[last], checked = step, far
            else:
                steps[last] = derived
        if not self._matches(box, steps, checked):  # type: ignore[arg-type]
            d = self._failing_dimension(box, steps, checked)  # type: ignore[arg-type]
            return self._parts(box, steps, d,
                               corner.same_work(self.probe(box.at(checked))))  # type: ignore
        return [Leaf(box, corner, steps)]

    def _step_from_far(self, box: Box, steps: np.ndarray, last: int) -> np.ndarray | None:
        """The step along `last` that puts the far corner where it is, given the other
        steps; None where the far corner does other work or lies at no whole step."""
        far = tuple(n - 1 for n in box.count)
        found = self.group(box.lo).shifts_to(self.probe(box.at(far)))  # type: ignore[arg-type]
        if found is None:
            return None
        rest = found - np.array(far, np.int64) @ steps
        if np.any(rest % far[last]):
            return None
        return rest // far[last]

    def _matches(self, box: Box, steps: np.ndarray, i: Point) -> bool:
        """Whether threadgroup `i` steps into the box does what its corner does, its ranges
        where the steps put them."""
        found = self.group(box.lo).shifts_to(self.probe(box.at(i)))
        return found is not None and np.array_equal(found, np.array(i, np.int64) @ steps)

    def _inside(self, box: Box, last: int) -> Point | None:
        """For a box of 8 or more, a threadgroup inside it chosen by a hash of the box
        (every run picks the same), past the corner's slice along `last`."""
        if box.size < _SMALLEST_CHECKED_INSIDE:
            return None
        seed = zlib.crc32(repr(box).encode())
        i = [int(v) for v in np.unravel_index(seed % box.size, box.count)]
        n = box.count[last]
        i[last] = 1 + (i[last] % (n - 2)) if n > 2 else n - 1
        return tuple(i)  # type: ignore[return-value]

    def _failing_dimension(self, box: Box, steps: np.ndarray, failed: Point) -> int:
        """A dimension along which the box's far end alone already fails, else the one
        the failed threadgroup lies furthest along."""
        for d in range(3):
            if failed[d] > 0 and box.count[d] > 2:
                along = tuple(box.count[d] - 1 if k == d else 0 for k in range(3))
                if not self._matches(box, steps, along):  # type: ignore[arg-type]
                    return d
        return int(np.argmax(np.array(failed) * (np.array(box.count) > 1)))

    def _parts(self, box: Box, steps: np.ndarray | None, d: int, same_work: bool
               ) -> list[Box | Leaf]:
        """The box split along dimension d, where a threadgroup differs from the corner
        (`steps`: None where the one after the corner already does; `same_work`: it does
        the corner's work, only at other addresses).

        The same work at addresses that do not move by a constant: into every k-th slice
        where a slice k further moves by one (a period: a block of k threadgroups reading
        one quantised block's header, say), and one more k moves it as far again. Other
        work: once, off the first slice (the
        first threadgroup's own work) or the last (an edge tile) or in halves, but when
        the work changes again in a part (from one slice to the next, as a causal mask's
        trip counts do), slice by slice (`_slices`)."""
        n = box.count[d]
        corner = self.group(box.lo)
        if same_work:
            for k in _PERIODS:
                if 2 * k >= n:
                    break
                self.count([], [box.at(_unit(d, k)), box.at(_unit(d, 2 * k))])
                step = corner.shifts_to(self.probe(box.at(_unit(d, k))))
                twice = corner.shifts_to(self.probe(box.at(_unit(d, 2 * k))))
                if step is not None and twice is not None and np.array_equal(2 * step, twice):
                    return [box.part(d, r, len(range(r, n, k)), k) for r in range(k)]
        elif box.varied == d:
            return self._slices(box, d)  # type: ignore[return-value]
        varied = -1 if same_work else d
        if steps is None:
            return [box.part(d, 0, 1), box.part(d, 1, n - 1, varied=varied)]
        if n > 2 and self._matches(box, steps, _unit(d, n - 2)):
            return [box.part(d, 0, n - 1, varied=varied), box.part(d, n - 1, 1)]
        if not same_work and self._slices_pay(box, d):
            return self._slices(box, d)  # type: ignore[return-value]
        return [box.part(d, 0, n // 2, varied=varied),
                box.part(d, n // 2, n - n // 2, varied=varied)]

    @staticmethod
    def _slices_pay(box: Box, d: int) -> bool:
        """Whether counting `box` slice by slice along d counts at most a third of it."""
        n = box.count[d]
        across = sum(1 for k in range(3) if k != d and box.count[k] > 1)
        return across > 0 and n + across + 3 <= box.size // 3


    def _slices(self, box: Box, d: int) -> list[Leaf]:
        """A box whose work changes from one slice to the next along d, as a causal mask's
        trip counts do: each slice counted at its corner alone, the threadgroups across it
        taken to move by the steps measured across the first slice, which the far corners
        of the first, the middle and the last slice are checked against. Gives up where
        that counts more than a third of the box."""
        if not self._slices_pay(box, d):
            raise GiveUp(f"the work changes from one threadgroup to the next along "
                         f"dimension {'xyz'[d]}")
        n, first = box.count[d], box.part(d, 0, 1)
        across = [k for k in range(3) if first.count[k] > 1]
        checked = sorted({0, n // 2, n - 1})
        # counting slice by slice, the sample may take a third of the grid
        self.budget = max(self.budget, math.prod(self.groups) // 3)
        slices = [box.part(d, j, 1) for j in range(n)]
        self.count([s.lo for s in slices], [first.at(_unit(k)) for k in across]
                   + [slices[j].hi for j in checked])
        corner = self.group(first.lo)
        by_site: dict[int, dict] = {}
        for k in across:
            step = corner.shifts_to(self.probe(first.at(_unit(k))))
            if step is None:
                raise GiveUp(f"the work changes along dimension {'xyz'[k]} too")
            by_site[k] = dict(zip(corner.site_keys, step.tolist()))
        leaves = []
        for j, piece in enumerate(slices):
            mine = self.group(piece.lo)
            steps = np.zeros((3, len(mine.site_keys)), np.int64)
            for k, step_of in by_site.items():
                if any(key not in step_of for key in mine.site_keys):
                    raise GiveUp("a slice accesses memory from code the first one does not")
                steps[k] = [step_of[key] for key in mine.site_keys]
            if j in checked and not self._matches(piece, steps, tuple(
                    n - 1 for n in piece.count)):  # type: ignore[arg-type]
                raise GiveUp(f"the threadgroups across a slice along dimension {'xyz'[d]} "
                             f"do not all move as across the first")
            leaves.append(Leaf(piece, mine, steps))
        return leaves


def _unit(d: int, by: int = 1) -> Point:
    return tuple(by if k == d else 0 for k in range(3))  # type: ignore[return-value]


def whole(groups: Point, count: Callable[[list[int]], list[Profiled]], *, budget: int,
          line_bytes: int) -> tuple[Profiled | None, int, str]:
    """The counts of the whole grid of `groups` threadgroups from a sample of them, how
    many were counted, and why not (None and the reason) when the sample cannot stand for
    the whole. `count(indices)` counts those threadgroups, each apart, with their
    ranges."""
    sampler = Sampler(groups, count, budget)
    try:
        leaves = list(sampler.leaves())
    except GiveUp as stop:
        return None, len(sampler.counted), str(stop)
    return combine(leaves, line_bytes), len(sampler.counted), ""
