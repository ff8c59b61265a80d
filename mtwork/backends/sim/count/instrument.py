"""What each basic block of a kernel does on an Apple GPU, read from the optimised LLVM IR,
and the IR with a counting call at the start of each such block.

Why the IR: the x86 code clang makes says little about the GPU (half arithmetic runs in
float, `exp` is a libm call of dozens of instructions, `rsqrt` goes through double), and
the shim's headers cannot see a kernel's own `a * b`. The IR still has the types the
kernel computes in, and its line tables name the function each instruction came from, so
every instruction is counted as what it is on the GPU:

- the kernel's own instructions by class (`LaneOps`): `fmul half` is f16, `fdiv` a
  division, `sitofp` a conversion, `mul` an integer multiply; vectors count per lane;
- a call of one of the shim's math or integer functions counts once, as its class
  (`exp` is exp_log, `fmax` one f32 or f16 operation, `popcount` a bit-field operation),
  whatever instructions implement it on the CPU;
- the emulator's own machinery counts nothing: the launcher, SIMD-group and
  `simdgroup_matrix` plumbing, threadgroup variables, atomics (the runtime counts those),
  the loops the shim uses for vector math (the GPU's code is unrolled);
- SIMD-group functions count once per SIMD-group issue, by the combine function they hand
  the runtime (`SimdOps`); barriers per threadgroup.

Each block that counts something gets ``call @mtw_profile_block(id)`` after its phis, and
each conditional branch of the kernel's own code ``call @mtw_profile_branch(id, way)``:
the runtime counts executions per lane, per SIMD-group issue and per threadgroup, and
divergent issues; `Table` says what one execution of each block is worth. Copies the
optimiser made `memcpy`/`memset` calls report their accesses like loads and stores.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ....dispatch import Sources
from .ilp import chains, load_chains
from .ir_ops import (
    is_plumbing,
    is_primitive,
    lane_ops,
    primitive_ops,
    simd_class,
    vector_template,
)
from .llvm_ir import Frame, Function, Instruction, Module
from .registers import register_estimate
from .wide_access import HOOKS, merged

__all__ = ["Table", "author_place", "instrument"]

Place = Callable[[str, int], "tuple[str, int] | None"]  # (file, line) -> the author's


def _same_file(path: str, name: str) -> bool:
    # Debug info joins a relative `#line` name (``<generated>``, ``source``) to the
    # compiler's working folder.
    return path == name or path.endswith("/" + name)


def author_place(sources: Sources) -> Place:
    """Maps a (file, line) of the debug info to the author's own: lines of the main file
    through its regions (the body form's ``source`` and ``header``), the author's other
    files as they are; None for any other file (the shim, MLX's headers, generated code)."""
    others = [str(p) for p, _ in sources.files]

    def place(path: str, line: int) -> tuple[str, int] | None:
        if line <= 0:
            return None
        if _same_file(path, sources.label):
            return sources.author_line(line)
        return next(((other, line) for other in others if _same_file(path, other)), None)

    return place


@dataclass
class BlockWork:
    ops: Counter = field(default_factory=Counter)  # lane-op class -> per lane
    simd: Counter = field(default_factory=Counter)  # SimdOps class -> per SIMD-group issue
    barriers: int = 0
    lines: Counter = field(default_factory=Counter)  # (file, line) -> lane ops
    chain: float = 0.0  # its lane ops on the critical path per execution (ilp.py)
    loads: int = 0  # loads of memory (not private arrays) per execution
    load_chain: float = 0.0  # of those, on the chain of dependent loads (ilp.py)

    def counts(self) -> bool:
        # a block of loads alone counts too (a pointer chase computes nothing in between)
        return bool(self.ops or self.simd or self.barriers or self.loads)


@dataclass(frozen=True)
class Table:
    """What one execution of each instrumented block does, the source line of each
    instrumented branch, and the estimated registers per thread."""

    blocks: tuple[BlockWork, ...]
    branches: tuple[tuple[str, int] | None, ...]
    registers: int

    def to_json(self) -> dict:
        return {"registers": self.registers,
                "branches": [list(b) if b else None for b in self.branches],
                "blocks": [{"ops": dict(b.ops), "simd": dict(b.simd), "barriers": b.barriers,
                            "lines": [[f, n, c] for (f, n), c in b.lines.items()],
                            "chain": b.chain, "loads": b.loads,
                            "load_chain": b.load_chain}
                           for b in self.blocks]}

    @classmethod
    def from_json(cls, data: dict) -> Table:
        blocks = tuple(BlockWork(Counter(b["ops"]), Counter(b["simd"]), b["barriers"],
                                 Counter({(f, n): c for f, n, c in b["lines"]}), b["chain"],
                                 b["loads"], b["load_chain"])
                       for b in data["blocks"])
        return cls(blocks, tuple(tuple(b) if b else None for b in data["branches"]),
                   data["registers"])


@dataclass(frozen=True)
class Role:
    """What an instruction is: "kernel" work, part of a shim function counted as one
    operation ("primitive", `key` naming the inlined call), or uncounted ("plumbing",
    "launcher", "loop": the shim's vector loops)."""

    kind: str
    key: int | None = None
    primitive: str = ""
    line: tuple[str, int] | None = None


_KERNEL = Role("kernel")


class _Roles:
    """Each debug location's role, from its frames."""

    def __init__(self, module: Module, shim: str, unit: str, place: Place):
        self.module, self.shim, self.unit, self.place = module, shim, unit, place
        self.cache: dict[int, Role] = {}

    def is_shim(self, path: str) -> bool:
        return path.startswith(self.shim)

    def of(self, location: int | None) -> Role:
        if location is None:
            return _KERNEL
        if location not in self.cache:
            self.cache[location] = self._role(self.module.chain(location))
        return self.cache[location]

    def _line(self, frames: tuple[Frame, ...]) -> tuple[str, int] | None:
        for fr in frames:  # innermost first
            if fr.line and not self.is_shim(fr.file) and fr.file != self.unit:
                found = self.place(fr.file, fr.line)
                if found is not None:
                    return found
        return None

    def _role(self, frames: tuple[Frame, ...]) -> Role:
        outward = list(reversed(frames))
        start = next((i for i, fr in enumerate(outward)
                      if not self.is_shim(fr.file) and fr.file != self.unit), None)
        if start is None:
            return Role("launcher")
        line = self._line(frames)
        for fr in outward[start:]:
            if not self.is_shim(fr.file):
                continue
            if is_plumbing(fr.function):
                return Role("plumbing")
            if is_primitive(fr.function):
                return Role("primitive", fr.site, fr.function, line)
        innermost = frames[0]
        if self.is_shim(innermost.file) and vector_template(innermost.function):
            return Role("loop", line=line)  # its integer work is the loop's control
        return Role("kernel", line=line)


class _Counter:
    """Counts one function's blocks."""

    def __init__(self, module: Module, roles: _Roles, f: Function):
        self.module, self.roles, self.f = module, roles, f
        self.work = [BlockWork() for _ in f.blocks]
        self.users: dict[str, list[Instruction]] = defaultdict(list)
        self.block_of: dict[int, int] = {}
        for b, block in enumerate(f.blocks):
            for ins in block.instructions:
                self.block_of[id(ins)] = b
                for name in ins.uses:
                    self.users[name].append(ins)
        self.role = self._roles()
        self.work_ids: set[int] = set()  # instructions that are GPU work (a step of a chain)

    def _roles(self) -> dict[int, Role]:
        """Every instruction's role; one without a location takes its users' role when
        they all agree (the optimiser drops the location of what it moves)."""
        everything = [i for block in self.f.blocks for i in block.instructions]
        role = {id(i): self.roles.of(i.dbg) for i in everything}
        unlocated = [i for i in everything if i.dbg is None]
        for _ in range(3):
            for ins in reversed(unlocated):
                users = self.users.get(ins.result or "", [])
                seen = {role[id(u)] for u in users}
                if len(seen) == 1:
                    role[id(ins)] = seen.pop()
        return role

    def count(self) -> list[BlockWork]:
        instances: dict[int, list[Instruction]] = defaultdict(list)
        for b, block in enumerate(self.f.blocks):
            for ins in block.instructions:
                role = self.role[id(ins)]
                if ins.callee == "mtw_simd_collective":
                    cls = simd_class(ins, self.module)
                    if cls:
                        self.work[b].simd[cls] += 1
                        self.work_ids.add(id(ins))
                elif ins.callee == "mtw_threadgroup_barrier":
                    self.work[b].barriers += 1
                elif role.kind == "primitive":
                    instances[role.key or 0].append(ins)
                elif role.kind in ("kernel", "loop"):
                    ops = lane_ops(ins)
                    if role.kind == "loop":
                        ops = Counter({k: v for k, v in ops.items() if not k.startswith("int")})
                    self._add(b, ops, role.line)
                    if ops:
                        self.work_ids.add(id(ins))
        for members in instances.values():
            self._add_instance(members)
        self._chains()
        return self.work

    def _chains(self) -> None:
        """Each block's share of the critical paths of its operations and of its loads."""
        for w, chain in zip(self.work, chains(self.f, [sum(w.ops.values()) for w in self.work],
                                              lambda ins: int(id(ins) in self.work_ids))):
            w.chain = chain
        kernels = ("kernel", "loop")  # not the launcher's or the plumbing's loads
        loads, load_chain = load_chains(self.f, lambda i: self.role[id(i)].kind in kernels)
        for w, n, chain in zip(self.work, loads, load_chain):
            w.loads, w.load_chain = n, chain

    def _add(self, b: int, ops: Counter, line: tuple[str, int] | None) -> None:
        self.work[b].ops.update(ops)
        if line is not None and ops:
            self.work[b].lines[line] += sum(ops.values())

    def _add_instance(self, members: list[Instruction]) -> None:
        """One operation (or a few) per copy of an inlined shim function, counted in the
        block of each copy's result: a value used outside the copy and not inside it."""
        inside = {id(m) for m in members}
        sinks = [m for m in members if m.result and
                 any(id(u) not in inside for u in self.users.get(m.result, ())) and
                 not any(id(u) in inside for u in self.users.get(m.result, ()))]
        role = self.role[id(members[0])]
        per_copy = primitive_ops(role.primitive, members)
        for sink in sinks or members[:1]:
            self._add(self.block_of[id(sink)], per_copy, self.role[id(sink)].line or role.line)
            self.work_ids.add(id(sink))


def _branch_hook(ins: Instruction, branch: int, fresh: Callable[[], str]) -> list[str] | None:
    """Lines that report which way a conditional branch or switch goes, or None."""
    if ins.opcode == "br":
        m = re.fullmatch(r"br i1 (%[-\w.$]+), label (%[-\w.$]+), label (%[-\w.$]+)", ins.text)
        if not m or m.group(2) == m.group(3):
            return None
        way = fresh()
        return [f"{way} = zext i1 {m.group(1)} to i32",
                f"call void @mtw_profile_branch(i32 {branch}, i32 {way})"]
    m = re.fullmatch(r"switch (\S+) ([^,]+), label (%[-\w.$]+) \[(.*)\]", ins.text)
    if not m:
        return None
    kind, value, default, cases = m.groups()
    targets = {default: 0}
    lines, way = [], "0"
    for case_value, label in re.findall(r"\S+ (-?\d+|true|false), label (%[-\w.$]+)", cases):
        index = targets.setdefault(label, len(targets))
        if index == 0:
            continue
        hit, chosen = fresh(), fresh()
        lines += [f"{hit} = icmp eq {kind} {value}, {case_value}",
                  f"{chosen} = select i1 {hit}, i32 {index}, i32 {way}"]
        way = chosen
    if len(targets) < 2:
        return None
    return [*lines, f"call void @mtw_profile_branch(i32 {branch}, i32 {way})"]


_COPY = re.compile(r"llvm\.(memcpy|memmove|memset)\.")
_TRACE_SIZES = (16, 8, 4, 2, 1)  # the sizes clang's trace-loads/trace-stores callbacks take
_LARGEST_TRACED_COPY = 4096


def _copy_hooks(ins: Instruction, fresh: Callable[[], str]) -> list[str]:
    """Access reports for a `memcpy`/`memset` of a constant size (a struct copied from a
    buffer, as MLX's BlockLoader does): the coverage callbacks see loads and stores only,
    so the copy is reported as the 16-, 8-, 4-, 2- and 1-byte accesses it is made of."""
    m = _COPY.match(ins.callee or "")
    args = _split_args(ins.text)
    size = re.fullmatch(r"i\d+ (\d+)", args[2]) if m and len(args) >= 3 else None
    if not size or not 0 < int(size.group(1)) <= _LARGEST_TRACED_COPY:
        return []
    dbg = f", !dbg !{ins.dbg}" if ins.dbg is not None else ""
    pointers = [("store", args[0].split(" ")[-1])]
    if m.group(1) != "memset":
        pointers.append(("load", args[1].split(" ")[-1]))
    lines, left, offset = [], int(size.group(1)), 0
    while left:
        chunk = next(n for n in _TRACE_SIZES if n <= left)
        for kind, pointer in pointers:
            at = pointer
            if offset:
                at = fresh()
                lines.append(f"{at} = getelementptr i8, ptr {pointer}, i64 {offset}")
            lines.append(f"call void @__sanitizer_cov_{kind}{chunk}(ptr {at}){dbg}")
        left, offset = left - chunk, offset + chunk
    return lines


def _split_args(text: str) -> list[str]:
    """The arguments of a call's text, split at its top-level commas."""
    inner = text[text.index("(", text.index("@")) + 1: text.rindex(")")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{<"
        depth -= ch in ")]}>"
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    return [*parts, inner[start:].strip()]


def _declarations(module: Module) -> list[str]:
    """The profile hooks, and the coverage callbacks the copies call that the module does
    not declare yet."""
    out = ["declare void @mtw_profile_block(i32)", "declare void @mtw_profile_branch(i32, i32)",
           *(f"declare void @{hook}(ptr, i32, i32)" for hook in HOOKS.values())]
    declared = "\n".join(line for line in module.lines if line.startswith("declare "))
    for kind in ("load", "store"):
        for n in _TRACE_SIZES:
            if f"@__sanitizer_cov_{kind}{n}(" not in declared:
                out.append(f"declare void @__sanitizer_cov_{kind}{n}(ptr)")
    return out


def instrument(text: str, *, shim_dir: str, place: Place) -> tuple[str, Table]:
    """The instrumented IR of a module and what its blocks count. `shim_dir` is the shim's
    folder; `place(file, line)` maps a line of the debug info to the author's (file, line),
    or None when the line is not the author's."""
    module = Module(text)
    unit = module.compile_unit_file()
    roles = _Roles(module, shim_dir.rstrip("/") + "/", unit, place)
    blocks: list[BlockWork] = []
    branches: list[tuple[str, int] | None] = []
    before: dict[int, list[str]] = defaultdict(list)
    counted: list[tuple[Function, _Counter]] = []
    dropped: set[int] = set()
    names = iter(range(1 << 62))

    def fresh() -> str:
        return f"%mtwp.{next(names)}"

    for f in module.functions:
        if f.name == "mtw_entry_barrier_free" or roles.is_shim(module.function_file(f)):
            continue
        counter = _Counter(module, roles, f)
        work = counter.count()
        counted.append((f, counter))
        wide, merged_away = merged(f, fresh, module.bytes_of)
        for line, inserted in wide.items():
            before[line] += inserted
        dropped |= merged_away
        for block, w in zip(f.blocks, work):
            for ins in block.instructions:
                if ins.opcode == "call":
                    before[ins.line] += _copy_hooks(ins, fresh)
            hook = None
            role = counter.role[id(block.terminator)]
            if block.terminator.opcode in ("br", "switch") and role.kind == "kernel":
                hook = _branch_hook(block.terminator, len(branches), fresh)
            if hook:
                branches.append(role.line)
                before[block.terminator.line] += hook
            if w.counts() or hook:
                before[block.first_non_phi().line].insert(
                    0, f"call void @mtw_profile_block(i32 {len(blocks)})")
                blocks.append(w)
    registers = max((register_estimate(module, f, c.role) for f, c in counted), default=0)
    return (module.with_lines(before, _declarations(module), dropped),
            Table(tuple(blocks), tuple(branches), registers))
