"""IR for the regions: one function per region, run by the driver for every thread.

A region function takes the threadgroup record, the buffer table, the context, the
uniform values kept before and after the region (read from `%uin`, written to `%uout`)
and one thread's index and position; it runs that thread from the region's entry to the
next barrier and returns the number of the region after it (or EXIT). On entry it loads
or recomputes the values the plan keeps across the barrier before it; on leaving at a
barrier it stores the ones kept across that barrier. Inside, each such value lives in a
local variable of its own (`%v.N.cur`, stored at every definition and loaded at every
use), which SROA turns back into SSA form: a value defined both before the region and
inside it (a loop counter) needs no hand-made phis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Instruction, rename
from .regions import Region, reroute
from .slots import Kind, Plan
from .types import Type

__all__ = ["EXIT", "Layout", "region_function"]

EXIT = "-1"  # returned when the thread's kernel returned (0xFFFFFFFF)
CONTEXT_THREADS = 1024
SIMDGROUPS = 32  # each has its own records of uniform values
# Private arrays kept in the context get this much room before them, so an index a
# little out of bounds (which the GPU tolerates) stays in the thread's own slot.
ARRAY_PADDING = 64
REGION_PARAMS = ("ptr noalias %g", "ptr noalias %buffers", "ptr noalias %ctx",
                 "ptr noalias %uin", "ptr noalias %uout", "i32 %i", "i32 %x", "i32 %y",
                 "i32 %z")


# The context's first fields, include/mtw_engine.h's mtw_engine_frame: each thread's
# threadgroup-memory cursor, position (x, y, z), the region it goes to next, and the
# arguments it hands to a SIMD-group function; then the offsets of the threadgroup
# variables.
FRAME = (f"[{CONTEXT_THREADS} x i32]",) * 5 + (f"[{CONTEXT_THREADS} x ptr]",) * 2
NEXT, INS, OUTS, SITES = 4, 5, 6, 7


@dataclass
class Layout:
    """The context's fields (FRAME, the threadgroup variables' offsets, then one array per
    kept value or alloca) and the uniform record's fields."""

    sites: int
    thread_fields: dict[str, int] = field(default_factory=dict)
    uniform_fields: dict[str, int] = field(default_factory=dict)
    context_types: list[str] = field(default_factory=list)
    uniform_types: list[str] = field(default_factory=list)
    allocas: set[str] = field(default_factory=set)  # fields of allocas: { T, align }
    padded: set[str] = field(default_factory=set)  # ... with room before: { pad, T, align }

    @classmethod
    def of(cls, plan: Plan, sites: int) -> Layout:
        layout = cls(sites, context_types=[*FRAME, f"[{max(sites, 1)} x i32]"])
        for value in plan.context_allocas():
            t, align = plan.types[value], max(plan.alloca_align[value], 1)
            element = f"{t.text}, [0 x <{align} x i8>]"
            if t.kind == "array":
                element = f"[{ARRAY_PADDING} x i8], {element}"
                layout.padded.add(value)
            layout.allocas.add(value)
            layout.thread_fields[value] = len(layout.context_types)
            layout.context_types.append(f"[{CONTEXT_THREADS} x {{ {element} }}]")
        for value in plan.stored():
            if plan.kinds[value] is Kind.UNIFORM:
                layout.uniform_fields[value] = len(layout.uniform_types)
                layout.uniform_types.append(plan.types[value].text)
            if plan.per_thread(value):
                layout.thread_fields[value] = len(layout.context_types)
                layout.context_types.append(f"[{CONTEXT_THREADS} x {plan.types[value].text}]")
        return layout

    def type_definitions(self) -> str:
        return (f"%mtw.ctx = type {{ {', '.join(self.context_types)} }}\n"
                f"%mtw.uni = type {{ {', '.join(self.uniform_types)} }}\n"
                f"%mtw.scratch = type {{ %mtw.ctx, [{SIMDGROUPS} x %mtw.uni], "
                f"[{SIMDGROUPS} x %mtw.uni] }}\n")

    def thread_slot(self, value: str) -> str:
        """An instruction's right-hand side: the address of `value`'s slot of this thread."""
        inner = ""
        if value in self.allocas:
            inner = f", i32 {1 if value in self.padded else 0}"
        return (f"getelementptr inbounds %mtw.ctx, ptr %ctx, i64 0, "
                f"i32 {self.thread_fields[value]}, i64 %i.64{inner}")

    def uniform_slot(self, value: str, record: str) -> str:
        return (f"getelementptr inbounds %mtw.uni, ptr {record}, i64 0, "
                f"i32 {self.uniform_fields[value]}")


class _Writer:
    """Builds one region function's text."""

    def __init__(self, plan: Plan, layout: Layout, region: Region) -> None:
        self.plan, self.layout, self.region = plan, layout, region
        self.lines: list[str] = []
        self.counter = 0
        entry_sync = region.index - 1
        live = (plan.liveness.live_in[plan.regions.syncs[entry_sync].block]
                if region.index else set())
        self.at_entry = set(live)
        stored_in = plan.stored_at[entry_sync] if region.index else []
        self.stored_in = stored_in
        self.recomputed_in = plan.recomputed_at[entry_sync] if region.index else []
        self.allocas_in = plan.allocas_at[entry_sync] if region.index else []
        tracked = set(live) | set(stored_in)
        for k in region.exits:
            tracked |= set(plan.stored_at[k]) | set(plan.regions.syncs[k].arguments)
        self.tracked = {v for v in tracked
                        if plan.kinds.get(v) in (Kind.RECOMPUTED, Kind.UNIFORM, Kind.THREAD)}

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"%{stem}.{self.counter}"

    def type_of(self, value: str) -> Type:
        return self.plan.types[value]

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    # --- the prologue ------------------------------------------------------------------

    def prologue(self) -> None:
        self.lines.append("prologue:")
        self.emit("%i.64 = zext i32 %i to i64")
        for value in sorted(self.tracked):
            self.emit(f"{value}.cur = alloca {self.type_of(value).text}")
        entry = self.plan.regions.function.blocks[0]
        for inst in entry.instructions if self.region.index == 0 else []:
            if inst.opcode == "alloca":
                self._alloca(inst.result, inst)  # type: ignore[arg-type]
        for value in self.allocas_in:
            self._alloca(value, self.plan.definitions[value])
        have: dict[str, str] = {}
        entry_sync = self.region.index - 1  # stored_in is empty in region 0
        for value in self.stored_in:
            address = self.fresh("in.addr")
            if self.plan.uniform_across(value, entry_sync):
                self.emit(f"{address} = {self.layout.uniform_slot(value, '%uin')}")
            else:
                self.emit(f"{address} = {self.layout.thread_slot(value)}")
            have[value] = self.fresh("in")
            self.emit(f"{have[value]} = load {self.type_of(value).text}, ptr {address}")
        for value in self.recomputed_in:
            inst = self.plan.definitions[value]
            have[value] = self.fresh("re")
            body = inst.text[len(value) + 3:]
            self.emit(f"{have[value]} = {rename(body, have)}")
        for value in sorted(self.tracked & (self.at_entry | set(self.stored_in))):
            if value in have:
                self.emit(f"store {self.type_of(value).text} {have[value]}, ptr {value}.cur")
        self.emit(f"br label {self.region.entry}")

    def _alloca(self, value: str, inst: Instruction) -> None:
        if self.plan.kinds[value] is Kind.PRIVATE_ALLOCA:
            self.emit(inst.text)
        else:
            self.emit(f"{value} = {self.layout.thread_slot(value)}")

    # --- the body -------------------------------------------------------------------------

    def body(self) -> None:
        blocks = self.plan.regions.function.block_map()
        inside = set(self.region.blocks)
        ends: dict[str, list[str]] = {}  # loads to add at the end of a block, for phis
        phis: dict[int, Instruction] = {}
        for name in self.region.blocks:
            for inst in blocks[name].phis:
                phis[id(inst)] = self._phi(inst, inside, ends)
        for name in self.region.blocks:
            block = blocks[name]
            self.lines += ["", name[1:] + ":"]
            for inst in block.phis:
                self.emit(phis[id(inst)].text)
            self._store_defined(block.phis)
            for inst in block.instructions[len(block.phis):]:
                if inst.opcode == "alloca" or self._marks_context(inst):
                    continue  # in the prologue; a context slot has no lifetime
                if inst.is_terminator:
                    for line in ends.get(name, []):
                        self.emit(line)
                    inst = self._with_loads(inst)
                    self.emit(reroute(inst, self.plan.regions.syncs, EXIT).text)
                    continue
                self.emit(self._with_loads(inst).text)
                self._store_defined([inst])

    def _marks_context(self, inst: Instruction) -> bool:
        """Whether `inst` is a lifetime marker of an alloca now kept in the context."""
        return (inst.callee or "").startswith("@llvm.lifetime.") and any(
            self.plan.kinds.get(v) is Kind.CONTEXT_ALLOCA for v in inst.operands())

    def _store_defined(self, insts: list[Instruction]) -> None:
        for inst in insts:
            if inst.result in self.tracked:
                t = self.type_of(inst.result).text
                self.emit(f"store {t} {inst.result}, ptr {inst.result}.cur")

    def _with_loads(self, inst: Instruction) -> Instruction:
        mapping = {}
        for value in dict.fromkeys(inst.operands()):
            if value in self.tracked:
                mapping[value] = self.fresh("use")
                self.emit(f"{mapping[value]} = load {self.type_of(value).text}, "
                          f"ptr {value}.cur")
        return inst.renamed(mapping) if mapping else inst

    def _phi(self, inst: Instruction, inside: set[str],
             ends: dict[str, list[str]]) -> Instruction:
        pairs = []
        for value, pred in inst.incoming():
            if pred not in inside:
                continue
            if value in self.tracked:
                loaded = self.fresh("edge")
                ends.setdefault(pred, []).append(
                    f"{loaded} = load {self.type_of(value).text}, ptr {value}.cur")
                value = loaded
            pairs.append(f"[ {value}, {pred} ]")
        head = inst.text[: inst.text.index("[")]
        return Instruction(head + ", ".join(pairs), inst.result, "phi")

    # --- the exits ----------------------------------------------------------------------------

    def exits(self) -> None:
        for k in self.region.exits:
            self.lines.append("")
            self.lines.append(f"exit.{k}:")
            sync = self.plan.regions.syncs[k]
            for field_index, value in zip((INS, OUTS), sync.arguments):
                if value in self.tracked:
                    current = self.fresh("arg")
                    self.emit(f"{current} = load ptr, ptr {value}.cur")
                    value = current
                address = self.fresh("arg.addr")
                self.emit(f"{address} = getelementptr inbounds %mtw.ctx, ptr %ctx, i64 0, "
                          f"i32 {field_index}, i64 %i.64")
                self.emit(f"store ptr {value}, ptr {address}")
            for value in self.plan.stored_at[k]:
                t = self.type_of(value).text
                current = self.fresh("out")
                address = self.fresh("out.addr")
                self.emit(f"{current} = load {t}, ptr {value}.cur")
                if self.plan.uniform_across(value, k):
                    self.emit(f"{address} = {self.layout.uniform_slot(value, '%uout')}")
                else:
                    self.emit(f"{address} = {self.layout.thread_slot(value)}")
                self.emit(f"store {t} {current}, ptr {address}")
            self.emit(f"ret i32 {self.plan.regions.region_after(k)}")


def region_function(plan: Plan, layout: Layout, region: Region, attributes: str,
                    independent: bool = False) -> str:
    """The IR of `region`'s function, `@mtw.region.<index>`. `independent`: its loop over
    threads is marked parallel (include/mtw_engine.h, mtw_engine_run_independent), which
    the vectorizer takes only if every access in it carries the mark; parameters marked
    `noalias` would add scope declarations, inlined into the loop, that do not."""
    writer = _Writer(plan, layout, region)
    params = ", ".join(p.replace("noalias ", "") if independent else p for p in REGION_PARAMS)
    writer.lines.append(f"define internal i32 @mtw.region.{region.index}({params}) "
                        f"{attributes} {{")
    writer.prologue()
    writer.body()
    writer.exits()
    writer.lines.append("}")
    return "\n".join(writer.lines)
