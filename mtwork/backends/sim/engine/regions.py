"""The kernel's code cut at its barriers into regions, each run for all threads in turn.

A thread's code (the per-thread entry with the kernel inlined) is first given canonical
names; each barrier call then becomes an empty block of its own (`%sync.k`) followed by
the block where threads resume (`%resume.k`). A region is the part of the code reachable
from the entry or from one resume block without passing a barrier (AdaptiveCpp's
sub-CFGs in its continuation-based CPU backend: a block reachable from two barriers
belongs to both regions and is copied into each). A region ends at a barrier, after
which the next region starts at that barrier's resume block, or at a return.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .cfg import Graph
from .ir import Block, Function, Instruction, IRError, rename
from .types import Type

__all__ = ["THREAD_PARAMS", "Region", "Regions", "SyncPoint", "canonical", "form_regions"]

# The per-thread entry's parameters: the threadgroup record, the buffer table, the
# thread's linear index and its position in the threadgroup.
THREAD_PARAMS = ("%g", "%buffers", "%i", "%x", "%y", "%z")
BARRIER = "@mtw_threadgroup_barrier"
COLLECTIVE = "@mtw_simd_collective"  # SIMD-group functions: (in, out, combine)
LOOP_SYNC = "@mtw_engine_loop_sync"  # the head of a reduction loop (loops.py)


@dataclass(frozen=True)
class SyncPoint:
    """A barrier, or a SIMD-group function (where the lanes of a SIMD-group meet)."""

    index: int
    block: str  # "%sync.k": holds the call, then branches to `resume`
    resume: str  # "%resume.k": where threads go on
    call: Instruction
    arguments: tuple[str, ...] = ()  # a SIMD-group function's `in` and `out` pointers
    combine: str = ""  # ... and the function that completes it
    implicit: bool = False  # no barrier: threads may pass it a different number of times

    @property
    def is_barrier(self) -> bool:
        return not self.combine


@dataclass
class Region:
    index: int  # 0: the kernel's entry; k + 1: after barrier k
    entry: str
    blocks: list[str]
    exits: list[int] = field(default_factory=list)  # the barriers it can end at


@dataclass
class Regions:
    function: Function  # canonical names, cut at barriers
    graph: Graph
    syncs: list[SyncPoint]
    regions: list[Region]
    named_types: dict[str, Type] = field(default_factory=dict)  # the module's struct types

    def region_after(self, sync: int) -> int:
        return sync + 1


def canonical(function: Function) -> Function:
    """`function` with parameters named as THREAD_PARAMS, blocks `%bb.N` and values
    `%v.N`, so that the engine's own names never meet the compiler's."""
    if len(function.params) != len(THREAD_PARAMS):
        raise IRError(f"the per-thread entry has {len(function.params)} parameters, "
                      f"not {len(THREAD_PARAMS)}")
    mapping = dict(zip(function.params, THREAD_PARAMS))
    for k, block in enumerate(function.blocks):
        mapping[block.name] = f"%bb.{k}"
    count = 0
    for block in function.blocks:
        for inst in block.instructions:
            if inst.result:
                mapping[inst.result] = f"%v.{count}"
                count += 1
    blocks = [Block(mapping[b.name], [i.renamed(mapping) for i in b.instructions])
              for b in function.blocks]
    return Function(function.name, function.header, list(THREAD_PARAMS), blocks)


def _sync_point(k: int, inst: Instruction) -> SyncPoint:
    if inst.callee in (BARRIER, LOOP_SYNC):
        return SyncPoint(k, f"%sync.{k}", f"%resume.{k}", inst,
                         implicit=inst.callee == LOOP_SYNC)
    args = re.search(r"\((.*)\)", inst.text[inst.text.index(COLLECTIVE):])
    parts = [a.strip().split()[-1] for a in (args.group(1).split(",") if args else [])]
    if len(parts) != 3 or not parts[2].startswith("@") or not all(
            p.startswith("%") for p in parts[:2]):
        raise IRError(f"a SIMD-group function called unexpectedly: {inst.text[:100]}")
    return SyncPoint(k, f"%sync.{k}", f"%resume.{k}", inst, (parts[0], parts[1]), parts[2])


def _split(function: Function) -> tuple[Function, list[SyncPoint]]:
    """Each barrier or SIMD-group function call moved into a block of its own (the call
    stays there, so that what it uses is live across it)."""
    blocks: list[Block] = []
    syncs: list[SyncPoint] = []
    last_piece: dict[str, str] = {}
    for block in function.blocks:
        current = Block(block.name)
        blocks.append(current)
        for inst in block.instructions:
            if inst.callee not in (BARRIER, COLLECTIVE, LOOP_SYNC):
                current.instructions.append(inst)
                continue
            sync = _sync_point(len(syncs), inst)
            syncs.append(sync)
            current.instructions.append(Instruction(f"br label {sync.block}", None, "br"))
            blocks.append(Block(sync.block, [inst, Instruction(f"br label {sync.resume}", None,
                                                               "br")]))
            current = Block(sync.resume)
            blocks.append(current)
        if current.name != block.name:
            last_piece[block.name] = current.name
    if last_piece:  # phis name the block that now holds the original terminator
        for block in blocks:
            block.instructions = [i.renamed(last_piece) if i.opcode == "phi" else i
                                  for i in block.instructions]
    return Function(function.name, function.header, function.params, blocks), syncs


_UNSUPPORTED = re.compile(r"\b(?:blockaddress|indirectbr|callbr|invoke|landingpad|va_arg|"
                          r"llvm\.stacksave|llvm\.localescape)\b|\btoken\b")


def _check_supported(function: Function) -> None:
    for block in function.blocks:
        for inst in block.instructions:
            m = _UNSUPPORTED.search(inst.text)
            if m:
                raise IRError(f"the kernel's code uses `{m.group(0)}`")


def form_regions(function: Function) -> Regions:
    """Cuts canonical `function` at its barriers into regions."""
    _check_supported(function)
    cut, syncs = _split(function)
    graph = Graph.of(cut)
    stops = frozenset(s.block for s in syncs)
    by_block = {s.block: s.index for s in syncs}
    entries = [cut.blocks[0].name] + [s.resume for s in syncs]
    regions = []
    for index, entry in enumerate(entries):
        blocks = graph.reachable([entry], stops)
        exits = sorted({by_block[s] for b in blocks for s in graph.succ[b] if s in stops})
        regions.append(Region(index, entry, blocks, exits))
    return Regions(cut, graph, syncs, regions)


def reroute(terminator: Instruction, syncs: list[SyncPoint], exit_value: str) -> Instruction:
    """A region's copy of `terminator`: edges into a barrier go to that barrier's exit
    block (`%exit.k`), and a return gives `exit_value`."""
    if terminator.opcode == "ret":
        return Instruction(f"ret i32 {exit_value}", None, "ret")
    mapping = {s.block: f"%exit.{s.index}" for s in syncs}
    return Instruction(rename(terminator.text, mapping), None, terminator.opcode)
