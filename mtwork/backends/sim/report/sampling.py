"""A dispatch's counts from a few of its threadgroups, where those few stand for all.

The profiler counts exactly: every lane's every access is logged and grouped into
SIMD-group issues, which costs 20 to 150 times a plain run. Most kernels do the same work
in most threadgroups, at addresses that move by a constant from one threadgroup to the
next (a tile's offset). This module counts a few threadgroups, each alone in a dispatch
with the byte ranges of every device access (`profiling.counting(ranges=...)`), and takes
a box of the grid to do what its corner does when the threadgroups checked in it agree:

- a box's corner `c`, and `c + e_d` along each dimension the box spans, are counted; the
  second, against the first, gives each access site's step `Δ_d`: how far its ranges move
  per threadgroup along `d`;
- the box's far corner, and one more threadgroup inside a box of 8 or more (chosen by a
  hash of the box, so every run picks the same), are counted and must match: the same
  blocks run as often by each lane, the same branches diverge, the same accesses with the
  same bytes and threadgroup-memory wavefronts, and every device range at the corner's
  moved by `Σ_d (g_d - c_d) Δ_d` (per site). A box that fails is split (at its first or
  last slice along the dimension that failed, else in halves) and each part is checked
  the same way; a box of one threadgroup is that threadgroup's own count.

Where every threadgroup of a box does what the checks say, its counts are the corner's,
and the lines a SIMD-group access touches (which depend on where its ranges fall within
a line) and the distinct lines of the dispatch (a union) are computed from the corner's
ranges moved to each threadgroup's place: the result is then exactly what counting every
threadgroup gives. The checks look at a sample, not at every threadgroup: a threadgroup
that differs from its box's corner where none of the checked ones does is not seen.
`whole` gives up (None: count every threadgroup) when a sampled threadgroup uses device
atomics (threadgroups may then depend on each other), when a threadgroup's ranges do not
fit the record, or when the checks would count more than `budget` threadgroups.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .profiling import KIND_ATOMIC, THREADGROUP, Profiled, Site

__all__ = ["GroupCount", "Sampler", "whole"]

_SMALLEST_CHECKED_INSIDE = 8  # a box this large gets a checked threadgroup inside too
_PAIRS_AT_ONCE = 1 << 22  # (shift, range) pairs turned into lines at a time

Point = tuple[int, int, int]


@dataclass(frozen=True)
class Box:
    """Threadgroups `lo + i * stride` for `0 <= i < count`, along each dimension."""

    lo: Point
    count: Point
    stride: Point = (1, 1, 1)
    varied: int = -1  # a dimension along which the work changed in the box it came from

    @property
    def size(self) -> int:
        return math.prod(self.count)

    def at(self, i: Point) -> Point:
        """The threadgroup `i` steps from `lo`."""
        return tuple(lo + n * s for lo, n, s in zip(self.lo, i, self.stride))  # type: ignore

    @property
    def hi(self) -> Point:
        return self.at(tuple(n - 1 for n in self.count))  # type: ignore[arg-type]

    def steps(self) -> np.ndarray:
        """Every threadgroup's steps from `lo`, one row each ([size, 3])."""
        return np.indices(self.count).reshape(3, -1).T.astype(np.int64)

    def part(self, d: int, first: int, count: int, every: int = 1, varied: int = -1) -> Box:
        """Steps `first`, `first + every`, ... (`count` of them) along dimension d."""
        lo, counts, stride = list(self.lo), list(self.count), list(self.stride)
        lo[d] += first * stride[d]
        counts[d], stride[d] = count, stride[d] * every
        return Box(tuple(lo), tuple(counts), tuple(stride), varied)  # type: ignore[arg-type]


@dataclass
class GroupCount:
    """What the profiler counted for one threadgroup."""

    profiled: Profiled
    control: tuple  # everything that must be equal in a threadgroup that stands for it
    ranges: np.ndarray  # profiling.RANGE records, in the order counted
    sites: np.ndarray  # [ranges]: the index of each range's site in `site_keys`
    site_keys: list[tuple[int, int, int]]  # (pc, buffer, kind) of each device site
    shape: tuple  # the ranges but for where they start: equal in a matching threadgroup
    atomics: bool  # device atomics: threadgroups may depend on each other

    @classmethod
    def of(cls, profiled: Profiled) -> GroupCount:
        assert profiled.ranges is not None
        ranges = profiled.ranges
        site_control = sorted((int(s.pc), int(s.buffer), int(s.kind), int(s.accesses),
                               int(s.bytes), int(s.wavefronts), int(s.conflicts))
                              for s in profiled.sites)
        control = (tuple(profiled.lanes), tuple(profiled.simd), tuple(profiled.groups),
                   tuple(profiled.divergences), tuple(site_control))
        # one integer per (pc, buffer, kind): code offsets, 62 buffers and 3 kinds fit
        keys = (ranges["pc"].astype(np.int64) << 8 | ranges["buffer"].astype(np.int64) << 2
                | ranges["kind"].astype(np.int64))
        unique, sites = np.unique(keys, return_inverse=True)
        shape = (ranges["pc"].tobytes(), ranges["buffer"].tobytes(), ranges["kind"].tobytes(),
                 ranges["access"].tobytes(), (ranges["hi"] - ranges["lo"]).tobytes())
        atomics = any(s.kind == KIND_ATOMIC and s.buffer != THREADGROUP
                      for s in profiled.sites)
        return cls(profiled, control, ranges, sites.reshape(-1),
                   [(int(k) >> 8, int(k) >> 2 & 63, int(k) & 3) for k in unique], shape, atomics)

    def same_work(self, other: GroupCount) -> bool:
        """Whether `other` runs the same blocks, branches and accesses, wherever its
        accesses fall."""
        return other.control == self.control and other.shape == self.shape

    def shifts_to(self, other: GroupCount) -> np.ndarray | None:
        """Per site, how far `other`'s ranges lie from these (the same at every range of
        the site), or None when `other` does not do what this threadgroup does."""
        if not self.same_work(other):
            return None
        moved = other.ranges["lo"].astype(np.int64) - self.ranges["lo"].astype(np.int64)
        shifts = np.zeros(len(self.site_keys), np.int64)
        shifts[self.sites] = moved  # any one range of each site; then all must agree
        return shifts if np.array_equal(shifts[self.sites], moved) else None


@dataclass(frozen=True)
class Leaf:
    """A box whose threadgroups all count as `corner` does, its ranges moved by
    `steps[d]` (per site) for each step along dimension d."""

    box: Box
    corner: GroupCount
    steps: np.ndarray  # [3, sites]

    def shifts(self) -> np.ndarray:
        """[size, sites]: each threadgroup's shift of each site's ranges."""
        return self.box.steps() @ self.steps


class GiveUp(Exception):
    """The sample cannot stand for the whole: count every threadgroup."""


# Periods tried along a dimension whose threadgroups do not move by a constant from one
# to the next: a threadgroup every `k` may (a block of `k` threadgroups reading one
# quantised block's header, say).
_PERIODS = (2, 4, 8, 16, 32, 64, 3, 6, 12, 24, 48)


class Sampler:
    """Splits a grid of threadgroups into boxes that each count as their corner does.
    `count(linear_index)` counts one threadgroup (x fastest); at most `budget` are
    counted."""

    def __init__(self, groups: Point, count: Callable[[list[int]], list[Profiled]],
                 budget: int):
        self.groups, self._count, self.budget = groups, count, budget
        self.counted: dict[Point, GroupCount] = {}

    def group(self, p: Point) -> GroupCount:
        self.count([p])
        return self.counted[p]

    def count(self, points: list[Point]) -> None:
        """Counts the threadgroups of `points` not counted yet, together (each apart)."""
        new = list(dict.fromkeys(p for p in points if p not in self.counted))
        if not new:
            return
        if len(self.counted) + len(new) > self.budget:
            raise GiveUp(f"more than {self.budget} threadgroups to count")
        gx, gy, _ = self.groups
        for p, profiled in zip(new, self._count([p[0] + gx * (p[1] + gy * p[2])
                                                 for p in new])):
            if profiled.ranges is None:
                raise GiveUp("a threadgroup's access ranges did not fit the record")
            found = GroupCount.of(profiled)
            if found.atomics:
                raise GiveUp("device atomics (threadgroups may depend on each other)")
            self.counted[p] = found

    def leaves(self) -> Iterator[Leaf]:
        pending = [Box((0, 0, 0), self.groups)]
        while pending:
            box = pending.pop()
            found = self._examine(box)
            if isinstance(found, Leaf):
                yield found
            else:
                pending.extend(found)

    def _examine(self, box: Box) -> Leaf | list[Box]:
        """The box as a leaf, or the parts to examine instead."""
        if box.size > 1:  # what the checks below need, counted on all cores at once
            self.count([box.lo, *(box.at(_unit(d)) for d in range(3) if box.count[d] > 1),
                        *(box.at(i) for i in self._checked(box))])
        corner = self.group(box.lo)
        steps = np.zeros((3, len(corner.site_keys)), np.int64)
        for d in range(3):
            if box.count[d] > 1:
                step = corner.shifts_to(self.group(box.at(_unit(d))))
                if step is None:
                    return self._parts(box, None, d, corner.same_work(self.group(box.at(_unit(d)))))
                steps[d] = step
        for i in self._checked(box):
            if not self._matches(box, steps, i):
                d = self._failing_dimension(box, steps, i)
                return self._parts(box, steps, d, corner.same_work(self.group(box.at(i))))
        return Leaf(box, corner, steps)

    def _matches(self, box: Box, steps: np.ndarray, i: Point) -> bool:
        """Whether threadgroup `i` steps into the box does what its corner does, its ranges
        where the steps put them."""
        found = self.group(box.lo).shifts_to(self.group(box.at(i)))
        return found is not None and np.array_equal(found, np.array(i, np.int64) @ steps)

    def _checked(self, box: Box) -> list[Point]:
        """The far corner, and a threadgroup inside a large box (by a hash of the box)."""
        out = [tuple(n - 1 for n in box.count)]
        if box.size >= _SMALLEST_CHECKED_INSIDE:
            seed = zlib.crc32(repr(box).encode())
            out.append(tuple(int(v) for v in np.unravel_index(seed % box.size, box.count)))
        return out  # type: ignore[return-value]

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
               ) -> list[Box]:
        """The box split along dimension d, where a threadgroup differs from the corner
        (`steps`: None where the one after the corner already does; `same_work`: it does
        the corner's work, only at other addresses).

        The same work at addresses that do not move by a constant: into every k-th slice
        where a slice k further moves by one (a period: a block of k threadgroups reading
        one quantised block's header, say), and one more k moves it as far again. Other
        work: once, off the first slice (the
        first threadgroup's own work) or the last (an edge tile) or in halves, but when
        the work changes again in a part (from one slice to the next, as a causal mask's
        trip counts do) the sample would be most of the grid: give up."""
        n = box.count[d]
        corner = self.group(box.lo)
        if same_work:
            for k in _PERIODS:
                if 2 * k >= n:
                    break
                step = corner.shifts_to(self.group(box.at(_unit(d, k))))
                twice = corner.shifts_to(self.group(box.at(_unit(d, 2 * k))))
                if step is not None and twice is not None and np.array_equal(2 * step, twice):
                    return [box.part(d, r, len(range(r, n, k)), k) for r in range(k)]
        elif box.varied == d:
            raise GiveUp(f"the work changes from one threadgroup to the next along "
                         f"dimension {'xyz'[d]}")
        varied = -1 if same_work else d
        if steps is None:
            return [box.part(d, 0, 1), box.part(d, 1, n - 1, varied=varied)]
        if n > 2 and self._matches(box, steps, _unit(d, n - 2)):
            return [box.part(d, 0, n - 1, varied=varied), box.part(d, n - 1, 1)]
        return [box.part(d, 0, n // 2, varied=varied),
                box.part(d, n // 2, n - n // 2, varied=varied)]


def _unit(d: int, by: int = 1) -> Point:
    return tuple(by if k == d else 0 for k in range(3))  # type: ignore[return-value]


def _lines(lo: np.ndarray, hi: np.ndarray, access: np.ndarray, shift: int,
           line_bytes: int) -> int:
    """The lines the accesses of these ranges (in the order counted, an access's ranges
    together and ascending) touch when moved by `shift`, as the runtime counts them: each
    access's distinct lines, summed."""
    first = (lo + shift) // line_bytes
    last = (hi - 1 + shift) // line_bytes
    shared = np.zeros(len(lo), bool)
    shared[1:] = (access[1:] == access[:-1]) & (first[1:] == last[:-1])
    return int(np.maximum(0, last - first + 1 - shared).sum())


class _Footprint:
    """The lines touched in each buffer, as a union of moved ranges."""

    def __init__(self, lines_per_buffer: list[int]):
        self.starts: list[list[np.ndarray]] = [[] for _ in lines_per_buffer]
        self.ends: list[list[np.ndarray]] = [[] for _ in lines_per_buffer]
        self.sizes = lines_per_buffer

    def add(self, buffer: int, lo: np.ndarray, hi: np.ndarray, shifts: np.ndarray,
            line_bytes: int) -> None:
        """Ranges [lo, hi) moved by each of `shifts`."""
        per = max(1, _PAIRS_AT_ONCE // max(1, len(lo)))
        for at in range(0, len(shifts), per):
            s = shifts[at:at + per, None]
            self.starts[buffer].append(np.maximum(0, (lo[None, :] + s) // line_bytes).ravel())
            self.ends[buffer].append(np.maximum(0, (hi[None, :] - 1 + s) // line_bytes).ravel())

    def distinct(self, buffer: int) -> int:
        if not self.starts[buffer]:
            return 0
        n = self.sizes[buffer] + 1
        starts = np.concatenate(self.starts[buffer])
        ends = np.concatenate(self.ends[buffer]) + 1
        cover = np.cumsum(np.bincount(starts, minlength=n)[:n]
                          - np.bincount(ends, minlength=n)[:n])
        return int(np.count_nonzero(cover))


def _merged(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ranges [lo, hi) as disjoint ranges, ascending."""
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    starts = np.ones(len(lo), bool)
    starts[1:] = lo[1:] > reach[:-1]
    index = np.flatnonzero(starts)
    ends = np.append(index[1:], len(lo)) - 1
    return lo[index], reach[ends]


def _combine(leaves: list[Leaf], line_bytes: int) -> Profiled:
    """The dispatch's counts: each leaf's corner's, times its threadgroups, with lines and
    distinct lines from the corner's ranges moved to each threadgroup's place."""
    first = leaves[0].corner.profiled
    names, buffer_bytes = first.names, first.sizes
    totals = {k: [0] * len(getattr(first, k)) for k in ("lanes", "simd", "groups",
                                                        "divergences")}
    sites: dict[tuple[int, int, int], Counter] = {}
    footprint = _Footprint([b // line_bytes + 2 for b in buffer_bytes])
    for leaf in leaves:
        size, corner = leaf.box.size, leaf.corner
        for k, total in totals.items():
            for b, n in enumerate(getattr(corner.profiled, k)):
                total[b] += n * size
        for s in corner.profiled.sites:
            counts = sites.setdefault((int(s.pc), int(s.buffer), int(s.kind)), Counter())
            for field in ("accesses", "bytes", "wavefronts", "conflicts"):
                counts[field] += getattr(s, field) * size
            if s.buffer == THREADGROUP or s.kind == KIND_ATOMIC:
                counts["lines"] += s.lines * size
        shifts = leaf.shifts()
        r = corner.ranges
        lo, hi = r["lo"].astype(np.int64), r["hi"].astype(np.int64)
        access = r["access"].astype(np.int64)
        for i, key in enumerate(corner.site_keys):
            mine = corner.sites == i
            site_shifts = shifts[:, i]
            residues = Counter((site_shifts % line_bytes).tolist())
            sites[key]["lines"] += sum(n * _lines(lo[mine], hi[mine], access[mine], shift,
                                                  line_bytes)
                                       for shift, n in residues.items())
            union_lo, union_hi = _merged(lo[mine], hi[mine])
            footprint.add(key[1], union_lo, union_hi, np.unique(site_shifts), line_bytes)
    out = Profiled(names, **totals,
                   distinct_lines=[footprint.distinct(b) for b in range(len(names))],
                   sizes=buffer_bytes)
    out.sites = [Site(pc=pc, buffer=buffer, kind=kind, **{k: int(v) for k, v in c.items()})
                 for (pc, buffer, kind), c in sorted(sites.items())]
    return out


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
    return _combine(leaves, line_bytes), len(sampler.counted), ""
