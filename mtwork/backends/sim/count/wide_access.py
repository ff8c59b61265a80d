"""A thread's memory accesses as Apple's compiler issues them: adjacent loads (or stores)
of one thread from one base pointer merged into wide ones.

clang's coverage callbacks report each scalar load the CPU code makes: a quantized block
read a byte or a 16-bit word at a time is, to the profiler, as many SIMD-group accesses.
Apple's GPU loads up to four components of 8, 16 or 32 bits with one instruction (the
`device_load` of the reverse-engineered ISA takes a format and a mask of four
components: dougallj/applegpu), and its compiler packs adjacent accesses into it; Philip
Turner measured a thread's 1-, 2-, 4- and 8-byte accesses at relative times 1700, 1100,
700 and 400 (philipturner/metal-experiment-1, elementwise_f32_i32.metal), so the width
of what a thread issues is what the L1 term must see.

Within a basic block and between two calls that may touch memory, the accesses of one
kind whose addresses are a base value plus a constant are grouped by base; each run of
adjacent or overlapping ones is reissued as accesses of up to four elements, an element
being the run's known alignment (from the IR's `align`, at most 4 bytes). A run is only
rewritten when that takes fewer accesses than it had. The run's accesses are reported to
the runtime together (up to 128 bytes a call, with the instructions they stand for), so
the L1 term counts each granule the lanes touch with them once, as the hardware
coalesces the accesses a SIMD-group issues together. Every lane runs the same code, so
every lane's accesses merge alike and the runtime still lines them up by code address.

The emulator's build keeps loops rolled (compile/compiler.py); Apple's compiler unrolls
a short loop of constant trip count (`UNROLLED_TRIPS`), after which its iterations'
accesses are adjacent. So a one-block loop's accesses at a base plus a multiple of its
counter (from 0, stepping by a constant: `q[i / 2]` for `i += 2`), or the counter plus a
constant (`y[l + 32]`) or plus a value the loop does not change, are taken over all its
iterations, merged the same way, and reported once in the block before the loop.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from .ir_loops import EDGE, Graph, Loop
from .llvm_ir import Block, Function, Instruction

_CALLBACK = re.compile(r"__sanitizer_cov_(load|store)(\d+)$")
_POINTER = re.compile(r"\(ptr (%[-\w.$]+)\)")
_GEP = re.compile(r"getelementptr (?:inbounds )?(?:nuw )?(?:nusw )?(%?[\w.$]+), ptr (%[-\w.$]+), "
                  r"i(?:32|64) (-?\d+|%[-\w.$]+)$")
_ALIGN = re.compile(r", align (\d+)")
_ACCESS = re.compile(r"(?:load [^,]+|store [^,]+, [^,]+), ptr (%[-\w.$]+)")
_SCALAR_BYTES = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8,
                 "double": 8}
COMPONENTS = 4  # components one load or store instruction moves
WIDEST_ELEMENT = 4  # bytes: 32-bit components
HOOKS = {"load": "mtw_profile_load", "store": "mtw_profile_store"}
UNROLLED_TRIPS = 16  # the longest loop taken as unrolled
# A thread's adjacent wide accesses are reported together up to this many bytes: Philip
# Turner measured 8, 16 and 32 bytes a thread at the same time per byte, "128B starts to
# take longer" (philipturner/metal-experiment-1).
REPORTED_BYTES = 128


@dataclass(frozen=True)
class Access:
    kind: str  # "load" or "store"
    line: int  # the callback's line in the module
    base: str
    offset: int
    size: int
    align: int
    dbg: int | None
    stride: int = 0  # bytes the address advances per iteration of the loop it is in


def _offsets(f: Function, sizes: Callable[[str], float], counter: str | None = None,
             step: int = 1) -> dict[str, tuple[str, int, int]]:
    """Each pointer a `getelementptr` by a constant (or by the loop's `counter`, which
    advances by `step` an iteration, or the counter plus a value) makes: (its base, byte
    offset, bytes per iteration of the loop). A base moved by a value is written
    `base@value*bytes` (`_base_lines`)."""
    shifted = _shifted(f, counter) if counter else {}
    out: dict[str, tuple[str, int, int]] = {}
    for block in f.blocks:
        for ins in block.instructions:
            m = _GEP.search(ins.text) if ins.opcode == "getelementptr" else None
            size = _element_bytes(m.group(1), sizes) if m and ins.result else 0
            if not size:
                continue
            base, offset, stride = out.get(m.group(2), (m.group(2), 0, 0))
            index = m.group(3)
            other = shifted.get(index, "")
            if other.lstrip("-").isdigit():  # the counter plus a constant
                out[ins.result or ""] = (base, offset + int(other) * size,
                                         stride + step * size)
            elif index == counter or (other and "@" not in base):
                if index != counter:
                    base = f"{base}@{other}*{size}"
                out[ins.result or ""] = (base, offset, stride + step * size)
            elif index.lstrip("-").isdigit():
                out[ins.result or ""] = (base, offset + int(index) * size, stride)
    return out


def _element_bytes(type_text: str, sizes: Callable[[str], float]) -> int:
    """Bytes of a `getelementptr`'s element type (0: not a whole number of bytes)."""
    if type_text in _SCALAR_BYTES:
        return _SCALAR_BYTES[type_text]
    try:
        size = sizes(type_text)
    except (KeyError, ValueError):
        return 0
    return int(size) if size >= 1 and size == int(size) else 0


def _shifted(f: Function, counter: str) -> dict[str, str]:
    """Values that are the counter plus another value or a constant: {sum: the other}.
    LLVM writes the counter plus a constant whose bits the counter never sets as a
    disjoint `or` (`y[l + 32]` for l < 8), which is the same sum."""
    out = {}
    for block in f.blocks:
        for ins in block.instructions:
            if not ins.result or not (ins.opcode == "add" or (
                    ins.opcode == "or" and ins.operands.startswith("disjoint "))):
                continue
            m = re.fullmatch(r"(?:disjoint )?(?:nuw )?(?:nsw )?i64 (%[-\w.$]+), "
                             r"(%[-\w.$]+|-?\d+)", ins.operands)
            if m and counter in m.groups() and m.group(1) != m.group(2):
                out[ins.result] = m.group(2) if m.group(1) == counter else m.group(1)
    return out


def _base_lines(base: str, fresh: Callable[[], str]) -> tuple[str, list[str]]:
    """The pointer a base stands for, and the lines that make it (a moved base)."""
    if "@" not in base:
        return base, []
    root, moved = base.split("@")
    value, size = moved.split("*")
    skip, pointer = fresh(), fresh()
    return pointer, [f"{skip} = mul i64 {value}, {size}",
                     f"{pointer} = getelementptr i8, ptr {root}, i64 {skip}"]


def _invariant(base: str, graph: Graph, loop: Loop) -> bool:
    """Whether the values a base is made of are defined outside the loop."""
    names = [base.split("@")[0], *([base.split("@")[1].split("*")[0]] if "@" in base else [])]
    return all(graph.defined.get(n) not in loop.blocks for n in names)


def _alignment(block: Block, start: int, pointer: str, size: int) -> int:
    """The `align` of the load or store a callback reports (its own size if not found)."""
    for ins in block.instructions[start + 1:]:
        if ins.opcode in ("load", "store"):
            m = _ACCESS.search(ins.text)
            if m and m.group(1) == pointer:
                a = _ALIGN.search(ins.text)
                return int(a.group(1)) if a else size
        if ins.opcode == "call" and _CALLBACK.match(ins.callee or ""):
            break
    return size


def _breaks(ins: Instruction) -> bool:
    """A call that may touch memory (anything but the callbacks and non-copying
    intrinsics) ends the stretch in which accesses may merge."""
    callee = ins.callee or ""
    if ins.opcode != "call" or _CALLBACK.match(callee):
        return False
    return not callee.startswith("llvm.") or bool(re.match(r"llvm\.mem(cpy|move|set)",
                                                           callee))


def _stretches(block: Block, offsets: dict[str, tuple[str, int, int]]
               ) -> list[list[Access]]:
    """The block's callbacks, in stretches that no other memory-touching call splits; a
    store ends a stretch of loads and a load one of stores (they might alias)."""
    out: list[list[Access]] = [[]]
    for index, ins in enumerate(block.instructions):
        if _breaks(ins):
            out.append([])
            continue
        m = _CALLBACK.match(ins.callee or "") if ins.opcode == "call" else None
        pointer = _POINTER.search(ins.text) if m else None
        if not m or not pointer:
            continue
        kind, size = m.group(1), int(m.group(2))
        if out[-1] and out[-1][-1].kind != kind:
            out.append([])
        base, offset, stride = offsets.get(pointer.group(1), (pointer.group(1), 0, 0))
        out[-1].append(Access(kind, ins.line, base, offset, size,
                              _alignment(block, index, pointer.group(1), size), ins.dbg,
                              stride))
    return [s for s in out if s]


def _runs(accesses: list[Access]) -> list[list[Access]]:
    """Accesses of one base, in runs of adjacent or overlapping byte ranges."""
    ordered = sorted(accesses, key=lambda a: (a.offset, -a.size))
    runs = [[ordered[0]]]
    end = ordered[0].offset + ordered[0].size
    for a in ordered[1:]:
        if a.offset <= end:
            runs[-1].append(a)
        else:
            runs.append([a])
        end = max(end, a.offset + a.size) if a.offset <= end else a.offset + a.size
    return runs


def chunks(start: int, end: int, align: int) -> list[tuple[int, int]]:
    """(offset, bytes) of the wide accesses that cover [start, end) when `start` is known
    aligned to `align` bytes: elements of the largest power of two dividing the alignment
    (at most 32 bits), up to four a time."""
    element = 1
    while element * 2 <= min(align, WIDEST_ELEMENT):
        element *= 2
    out, at = [], start
    while at < end:
        size = min(COMPONENTS * element, end - at)
        out.append((at, size))
        at += size
    return out


def reports(wide: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(offset, bytes, instructions) of the calls that report `wide`'s accesses: adjacent
    ones together, up to `REPORTED_BYTES` a call, so the L1 sees the granules a
    SIMD-group's lanes touch with the instructions it issues together once."""
    out: list[tuple[int, int, int]] = []
    for offset, size in wide:
        if out and out[-1][0] + out[-1][1] == offset and out[-1][1] + size <= REPORTED_BYTES:
            at, total, pieces = out[-1]
            out[-1] = (at, total + size, pieces + 1)
        else:
            out.append((offset, size, 1))
    return out


def merged(f: Function, fresh: Callable[[], str], sizes: Callable[[str], float]
           ) -> tuple[dict[int, list[str]], set[int]]:
    """Lines to insert (before each line index) and callback lines to drop, so `f`'s
    accesses are reported as wide ones."""
    before: dict[int, list[str]] = defaultdict(list)
    dropped: set[int] = set()
    graph = Graph(f)
    unrolled = {loop.header for loop in _innermost(graph.loops)
                if _unrolled(f, graph, loop, sizes, (before, dropped, fresh))}
    offsets = _offsets(f, sizes)
    for block in f.blocks:
        if block.label in unrolled:
            continue
        for stretch in _stretches(block, offsets):
            if len(stretch) < 2:
                continue
            by_base: dict[str, list[Access]] = defaultdict(list)
            for a in stretch:
                by_base[a.base].append(a)
            for group in by_base.values():
                for run in _runs(group):
                    _rewrite(run, before, dropped, fresh)
    return before, dropped


def _innermost(loops: list[Loop]) -> list[Loop]:
    out = []
    for loop in loops:
        out += _innermost(loop.inner) if loop.inner else [loop]
    return out


def _counter(header: Block, preheader: str) -> tuple[str, str, int] | None:
    """The loop's counter, its start and its step: a phi from a value of the preheader
    that adds a positive constant per iteration (`for (i = 0; i < 8; i += 2)`)."""
    steps = {ins.result: ins.operands for ins in header.instructions if ins.opcode == "add"}
    for ins in header.instructions:
        if ins.opcode != "phi":
            break
        edges = dict((b, v.strip()) for v, b in EDGE.findall(ins.operands))
        step = [steps.get(v, "") for b, v in edges.items() if b != preheader]
        m = re.fullmatch(rf"(?:nuw )?(?:nsw )?i64 {re.escape(ins.result or '')}, ([1-9]\d*)",
                         step[0]) if len(step) == 1 else None
        if preheader in edges and m and ins.result:
            return ins.result, edges[preheader], int(m.group(1))
    return None


Edits = tuple[dict[int, list[str]], set[int], Callable[[], str]]  # before, dropped, fresh


def _unrolled(f: Function, graph: Graph, loop: Loop, sizes: Callable[[str], float],
              edits: Edits) -> bool:
    """Rewrites the accesses of a one-block loop Apple's compiler unrolls as the wide
    accesses of all its iterations, in the block before it; whether it did."""
    header = graph.blocks[loop.header]
    latches = loop.blocks - {loop.header}
    outside = [p for p in graph.pred[loop.header] if p not in loop.blocks]
    if (loop.trips is None or loop.trips > UNROLLED_TRIPS or len(outside) != 1
            or graph.succ[outside[0]] != [loop.header]
            or any(len(graph.blocks[b].instructions) > 1 for b in latches)
            or any(_breaks(ins) for ins in header.instructions)):
        return False
    found = _counter(header, outside[0])
    if found is None:
        return False
    counter, start, step = found
    if step != 1 and start != "0":
        return False  # the base would move by the start in elements, not iterations
    stretch = [a for s in _stretches(header, _offsets(f, sizes, counter, step)) for a in s]
    groups: dict[tuple[str, str], list[Access]] = defaultdict(list)
    for a in stretch:
        if _invariant(a.base, graph, loop):
            groups[(a.kind, a.base)].append(a)
    at = graph.blocks[outside[0]].terminator.line
    changed = False
    for group in groups.values():
        changed |= _rewrite_loop(group, loop.trips, start, at, *edits)
    return changed


def _rewrite_loop(group: list[Access], trips: int, start: str, at: int,
                  before: dict[int, list[str]], dropped: set[int],
                  fresh: Callable[[], str]) -> bool:
    """One base's accesses over all `trips` iterations of a counter from `start`, merged
    and reported before line `at`; whether that took fewer accesses."""
    strides = {a.stride for a in group}
    if start != "0" and len(strides) > 1:
        return False  # offsets from the counter's start and from the base do not mix
    align = min(min(a.align, a.stride & -a.stride) if a.stride else a.align for a in group)
    ranges = sorted((a.offset + k * a.stride, a.size) for a in group for k in range(trips))
    first_offset = ranges[0][0]

    def run(start: int, end: int) -> list[tuple[int, int]]:
        apart = start - first_offset  # the alignment known at `start`
        return chunks(start, end, min(align, apart & -apart) if apart else align)

    wide: list[tuple[int, int]] = []
    low, high = ranges[0][0], ranges[0][0] + ranges[0][1]
    for offset, size in ranges[1:]:
        if offset > high:
            wide += run(low, high)
            low, high = offset, offset + size
        high = max(high, offset + size)
    wide += run(low, high)
    if len(wide) >= trips * len(group):
        return False
    first = min(group, key=lambda a: a.line)
    dbg = f", !dbg !{first.dbg}" if first.dbg is not None else ""
    base, lines = _base_lines(first.base, fresh)
    before[at] += lines
    if start != "0":  # the counter's first value moves the base
        skip, moved, base = fresh(), base, fresh()
        before[at].append(f"{skip} = mul i64 {start}, {strides.pop()}")
        before[at].append(f"{base} = getelementptr i8, ptr {moved}, i64 {skip}")
    for offset, size, pieces in reports(wide):
        pointer = fresh()
        before[at].append(f"{pointer} = getelementptr i8, ptr {base}, i64 {offset}")
        before[at].append(f"call void @{HOOKS[first.kind]}(ptr {pointer}, i32 {size}, "
                          f"i32 {pieces}){dbg}")
    dropped.update(a.line for a in group)
    return True


def _rewrite(run: list[Access], before: dict[int, list[str]], dropped: set[int],
             fresh: Callable[[], str]) -> None:
    start = run[0].offset
    align = max(a.align for a in run if a.offset == start)
    wide = chunks(start, max(a.offset + a.size for a in run), align)
    if len(wide) >= len(run):
        return
    first = min(run, key=lambda a: a.line)
    dbg = f", !dbg !{first.dbg}" if first.dbg is not None else ""
    lines = before[first.line]
    for offset, size, pieces in reports(wide):
        at = fresh()
        lines.append(f"{at} = getelementptr i8, ptr {first.base}, i64 {offset}")
        lines.append(f"call void @{HOOKS[first.kind]}(ptr {at}, i32 {size}, i32 {pieces})"
                     f"{dbg}")
    dropped.update(a.line for a in run)
