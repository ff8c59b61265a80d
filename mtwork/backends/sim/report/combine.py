"""The counts of a grid of threadgroups from boxes of it that each count as their corner
does (`sampling.py` finds them): a box's threadgroups do the corner's work, every device
access at the corner's place moved by a constant step per threadgroup along each
dimension (per access site). The counts of work are the corner's times the box's
threadgroups; the lines an access touches depend on where its ranges fall within a line,
and the distinct lines of the dispatch are a union, so both are computed from the
corner's ranges moved to each threadgroup's place, as the runtime counts them (tally.cpp).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .profiling import KIND_ATOMIC, THREADGROUP, Profiled, Site

__all__ = ["Box", "GroupCount", "Leaf", "combine"]

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
    checked: tuple  # the same, where one of the two was only checked (its threadgroup-
    # memory accesses and branches hashed, not counted): device accesses, block
    # executions, and the hashes of threadgroup-memory accesses and of branches
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
        blocks = (tuple(profiled.lanes), tuple(profiled.simd), tuple(profiled.groups))
        control = (*blocks, tuple(profiled.divergences), tuple(site_control),
                   profiled.hashes)
        device = tuple(site for site in site_control if site[1] != THREADGROUP)
        checked = (*blocks, device, profiled.hashes)
        # one integer per (pc, buffer, kind): code offsets, 62 buffers and 3 kinds fit
        keys = (ranges["pc"].astype(np.int64) << 8 | ranges["buffer"].astype(np.int64) << 2
                | ranges["kind"].astype(np.int64))
        unique, sites = np.unique(keys, return_inverse=True)
        shape = (ranges["pc"].tobytes(), ranges["buffer"].tobytes(), ranges["kind"].tobytes(),
                 ranges["access"].tobytes(), (ranges["hi"] - ranges["lo"]).tobytes())
        atomics = any(s.kind == KIND_ATOMIC and s.buffer != THREADGROUP
                      for s in profiled.sites)
        return cls(profiled, control, checked, ranges, sites.reshape(-1),
                   [(int(k) >> 8, int(k) >> 2 & 63, int(k) & 3) for k in unique], shape, atomics)

    @property
    def only_checked(self) -> bool:
        return self.profiled.checked

    def same_work(self, other: GroupCount) -> bool:
        """Whether `other` runs the same blocks, branches and accesses, wherever its
        device accesses fall (its threadgroup-memory accesses where these are)."""
        if other.shape != self.shape:
            return False
        if self.only_checked or other.only_checked:
            return other.checked == self.checked
        return other.control == self.control

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


def combine(leaves: list[Leaf], line_bytes: int) -> Profiled:
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


