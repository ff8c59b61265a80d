"""Where each value that lives across a barrier is kept between regions.

- parameters of the per-thread entry (the threadgroup record, the buffer table, the
  thread's index and position) are the region functions' own parameters;
- a private array or struct (an `alloca`) lives in the thread's slot of the context
  (`ctx`), unless its memory is dead at every barrier: then each region has its own;
- a value the engine can compute again from values it has (addresses, indices: integer
  and pointer arithmetic, loads from the buffer table) is recomputed where needed;
- a uniform value (the same in every thread) is kept once per threadgroup, so the loops
  over threads see it as loop-invariant (and vectorize addresses built from it); across
  an implicit sync (loops.py) it is kept per thread as well: threads may pass one a
  different number of times, each on by itself, and the group's record would then hold
  another thread's value of another iteration;
- any other value is kept per thread in the context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from .allocas import private_allocas
from .cfg import Liveness
from .ir import Instruction, IRError
from .regions import THREAD_PARAMS, Regions
from .types import Type, parse_type, result_type
from .uniformity import Uniformity

__all__ = ["Kind", "Plan", "plan"]


class Kind(Enum):
    PARAM = "param"
    CONTEXT_ALLOCA = "context alloca"
    PRIVATE_ALLOCA = "private alloca"
    RECOMPUTED = "recomputed"
    UNIFORM = "uniform"
    THREAD = "thread"


# Operations cheap to compute again, which cannot trap.
_RECOMPUTABLE = frozenset({
    "getelementptr", "trunc", "zext", "sext", "bitcast", "ptrtoint", "inttoptr",
    "addrspacecast", "add", "sub", "mul", "shl", "lshr", "ashr", "and", "or", "xor", "icmp",
    "select", "extractelement", "insertelement", "extractvalue", "insertvalue",
    "shufflevector", "freeze"})
_MAX_RECOMPUTED = 24  # instructions in one recomputed value's chain
_STORED = (Kind.UNIFORM, Kind.THREAD)


@dataclass
class Plan:
    regions: Regions
    liveness: Liveness
    uniformity: Uniformity
    kinds: dict[str, Kind]  # of every value needed across a barrier
    types: dict[str, Type]  # of every stored value and alloca (the allocated type)
    alloca_align: dict[str, int]
    definitions: dict[str, Instruction]
    stored_at: list[list[str]]  # per barrier: values kept in memory across it
    recomputed_at: list[list[str]]  # per barrier: values recomputed after it, in order
    allocas_at: list[list[str]]  # per barrier: allocas used after it

    def stored(self) -> list[str]:
        """Every value kept in memory, in a stable order."""
        return sorted({v for vs in self.stored_at for v in vs}, key=_order)

    def uniform_across(self, value: str, sync: int) -> bool:
        """Whether `value` is kept once per group across sync point `sync`."""
        return self.kinds[value] is Kind.UNIFORM and not self.regions.syncs[sync].implicit

    def per_thread(self, value: str) -> bool:
        """Whether `value` has a slot per thread: kept so across some sync point."""
        return any(value in stored and not self.uniform_across(value, k)
                   for k, stored in enumerate(self.stored_at))

    def context_allocas(self) -> list[str]:
        return sorted((v for v, k in self.kinds.items() if k is Kind.CONTEXT_ALLOCA),
                      key=_order)


def _order(value: str) -> tuple[int, str]:
    m = re.fullmatch(r"%v\.(\d+)", value)
    return (int(m.group(1)), "") if m else (-1, value)


def _alloca_type(inst: Instruction) -> tuple[Type, int]:
    body = inst.text.split(" = alloca ", 1)[1]
    allocated, pos = parse_type(body)
    rest = body[pos:]
    if re.match(r"\s*,\s*i\d+ ", rest):
        raise IRError("an alloca of a variable number of elements")
    m = re.search(r"\balign (\d+)", rest)
    return allocated, int(m.group(1)) if m else 1


class _Classifier:
    def __init__(self, regions: Regions, uniformity: Uniformity, private: set[str],
                 invariant_loads: set[str]) -> None:
        self.definitions = {i.result: i for b in regions.function.blocks
                            for i in b.instructions if i.result}
        self.uniformity = uniformity
        self.private = private
        self.invariant_loads = invariant_loads
        self.kinds: dict[str, Kind] = {p: Kind.PARAM for p in THREAD_PARAMS}
        self.sizes: dict[str, int] = {}
        blocks = regions.function.block_map()
        # Definitions come before their (non-phi) uses in reverse post-order.
        for name in regions.graph.reverse_postorder():
            for inst in blocks[name].instructions:
                if inst.result:
                    self.kinds[inst.result] = self._classify(inst)

    def kind(self, value: str) -> Kind:
        return self.kinds[value]

    def values_used(self, inst: Instruction) -> list[str]:
        """The values `inst` uses, without repeats: its local names other than named
        types (`%"struct.x"` in a getelementptr reads like a value)."""
        return [v for v in dict.fromkeys(inst.operands())
                if v in self.definitions or v in THREAD_PARAMS]

    def _classify(self, inst: Instruction) -> Kind:
        if inst.opcode == "alloca":
            return Kind.PRIVATE_ALLOCA if inst.result in self.private else Kind.CONTEXT_ALLOCA
        if self._recomputable(inst):
            return Kind.RECOMPUTED
        if self.uniformity.uniform(inst.result):  # type: ignore[arg-type]
            return Kind.UNIFORM
        return Kind.THREAD

    def _recomputable(self, inst: Instruction) -> bool:
        if inst.opcode not in _RECOMPUTABLE and inst.result not in self.invariant_loads:
            return False
        size = 1
        for operand in self.values_used(inst):
            if self.kinds.get(operand, Kind.THREAD) is Kind.THREAD:
                return False
            size += self.sizes.get(operand, 0)
        if size > _MAX_RECOMPUTED:
            return False
        self.sizes[inst.result] = size  # type: ignore[index]
        return True

    def expand(self, live: set[str]) -> tuple[list[str], list[str], list[str]]:
        """The stored values, recomputed values (in dependency order) and allocas needed
        to have every value of `live` after a barrier."""
        stored, recomputed, allocas = set(), [], set()
        seen: set[str] = set()

        def visit(value: str) -> None:
            if value in seen:
                return
            seen.add(value)
            kind = self.kind(value)
            if kind in _STORED:
                stored.add(value)
            elif kind in (Kind.CONTEXT_ALLOCA, Kind.PRIVATE_ALLOCA):
                allocas.add(value)
            elif kind is Kind.RECOMPUTED:
                for operand in self.values_used(self.definitions[value]):
                    visit(operand)
                recomputed.append(value)

        for value in sorted(live, key=_order):
            visit(value)
        return sorted(stored, key=_order), recomputed, sorted(allocas, key=_order)


def plan(regions: Regions, liveness: Liveness, uniformity: Uniformity,
         invariant_loads: set[str]) -> Plan:
    """Decides, for each barrier, what is kept in memory or recomputed across it."""
    private = private_allocas(regions, liveness)
    classifier = _Classifier(regions, uniformity, private, invariant_loads)
    stored_at, recomputed_at, allocas_at = [], [], []
    for sync in regions.syncs:
        stored, recomputed, allocas = classifier.expand(liveness.live_in[sync.block])
        stored_at.append(stored)
        recomputed_at.append(recomputed)
        allocas_at.append(allocas)
    types: dict[str, Type] = {}
    aligns: dict[str, int] = {}
    needed = {v for s in regions.syncs for v in liveness.live_in[s.block]}
    needed.update(v for vs in stored_at for v in vs)
    needed.update(v for v, k in classifier.kinds.items() if k is Kind.CONTEXT_ALLOCA)
    for value in needed:
        inst = classifier.definitions.get(value)
        if inst is None:
            continue  # a parameter
        if inst.opcode == "alloca":
            types[value], aligns[value] = _alloca_type(inst)
        else:
            types[value] = result_type(inst, regions.named_types)
    return Plan(regions, liveness, uniformity, dict(classifier.kinds), types, aligns,
                classifier.definitions, stored_at, recomputed_at, allocas_at)
