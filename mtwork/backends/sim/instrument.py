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
divergent issues; `Table` says what one execution of each block is worth.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ...dispatch import Sources
from .llvm_ir import Frame, Function, Instruction, Module, element_type
from .registers import register_estimate, result_type

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

LANE_CLASSES = ("f32", "f16", "bf16", "integer", "integer_mul", "exp_log", "recip_div",
                "sqrt_rsqrt", "trig", "convert", "convert_float")
SIMD_CLASSES = ("shuffles", "reductions", "mma_f32", "mma_f16", "mma_bf16", "barriers")

# The shim's functions that are one operation on the GPU: (class, count) pairs, "arith"
# meaning one f32, f16, bf16 or integer operation by the types it computes in. Rough
# forms where Apple's GPU has no single instruction: pow = exp2(y log2 x), cbrt the same,
# hyperbolic functions through one exponential and a division, fmod through a division.
_EXP, _TRIG, _HYPERBOLIC = (("exp_log", 1),), (("trig", 1),), (
    ("exp_log", 1), ("recip_div", 1), ("arith", 2))
_PRIMITIVES: dict[str, tuple[tuple[str, int], ...]] = {
    **{f"__metal_{n}": _EXP for n in ("exp", "exp2", "exp10", "log", "log2", "log10")},
    "__metal_pow": (("exp_log", 2), ("arith", 1)), "__metal_powr": (("exp_log", 2), ("arith", 1)),
    **{f"__metal_{n}": _TRIG for n in ("sin", "cos", "tan", "sinpi", "cospi", "tanpi", "asin",
                                       "acos", "atan", "atan2")},
    **{f"__metal_{n}": _HYPERBOLIC for n in ("sinh", "cosh", "tanh", "asinh", "acosh",
                                             "atanh")},
    "__metal_sqrt": (("sqrt_rsqrt", 1),), "__metal_rsqrt": (("sqrt_rsqrt", 1),),
    "__metal_cbrt": (("exp_log", 2),), "__metal_divide": (("recip_div", 1),),
    "__metal_fmod": (("recip_div", 1), ("convert", 1), ("arith", 2)),
    **{f"__metal_{n}": (("convert", 1),) for n in ("ceil", "floor", "rint", "round", "trunc")},
    "__metal_fract": (("convert", 1), ("arith", 1)), "modf": (("convert", 1), ("arith", 1)),
    **{f"__metal_{n}": (("arith", 1),) for n in ("fabs", "copysign", "fmax", "fmin", "step",
                                                 "sign", "fdim", "fma", "saturate")},
    "__metal_fmax3": (("arith", 2),), "__metal_fmin3": (("arith", 2),),
    "__metal_fmedian3": (("arith", 3),), "__metal_mix": (("arith", 2),),
    "__metal_smoothstep": (("recip_div", 1), ("arith", 5)),
    **{n: (("integer", 2),) for n in ("__metal_ldexp", "__metal_frexp", "__metal_nextafter",
                                      "ilogb", "absdiff", "addsat", "subsat", "hadd", "rhadd",
                                      "madsat")},
    **{n: (("arith", 1),) for n in ("__scalar_max", "__scalar_min", "__scalar_abs", "isnan",
                                    "isinf", "isfinite", "signbit", "isnormal")},
    **{n: (("integer_mul", 1),) for n in ("popcount", "clz", "ctz", "reverse_bits", "mulhi",
                                          "madhi", "mul24", "mad24", "rotate", "extract_bits",
                                          "insert_bits")},
}
# The shim's functions whose instructions are the emulator's machinery, not GPU work.
_PLUMBING = re.compile(r"^(simd_|quad_|__metal_simd_|__metal_quad_|__metal_get_|simdgroup_|"
                       r"make_filled_simdgroup_matrix|threadgroup_barrier|atomic_|"
                       r"__mtw_threadgroup_var|collective|vote_call)")
# SIMD-group functions by the combine function (mangled) they hand the runtime.
_COMBINES = (("8mtw_simd6reduce", "reductions"), ("8mtw_simd4scan", "reductions"),
             ("8mtw_simd4move", "shuffles"), ("8mtw_simd15broadcast_first", "shuffles"),
             ("8mtw_simd4vote", "shuffles"), ("8mtw_simd7nothing", "barriers"),
             ("12mtw_sgmatrix8multiply", "mma"), ("12mtw_sgmatrix4load", ""),
             ("12mtw_sgmatrix5store", ""))
# Calls and intrinsics outside the shim's functions (made by the optimiser, or MLX's code).
_CALLS = {
    **{n: "exp_log" for n in ("exp", "exp2", "exp10", "log", "log2", "log10")},
    **{n: "trig" for n in ("sin", "cos", "tan", "asin", "acos", "atan", "atan2")},
    "sqrt": "sqrt_rsqrt", **{n: "convert" for n in ("floor", "ceil", "trunc", "rint", "round",
                                                    "roundeven", "nearbyint", "lround", "lrint",
                                                    "fptosi.sat", "fptoui.sat")},
    **{n: "arith" for n in ("fma", "fmuladd", "fabs", "copysign", "minnum", "maxnum",
                            "minimum", "maximum", "minimumnum", "maximumnum", "fmax", "fmin")},
    **{n: "integer" for n in ("smax", "smin", "umax", "umin", "abs", "sadd.sat", "uadd.sat",
                              "ssub.sat", "usub.sat")},
    **{n: "integer_mul" for n in ("ctpop", "ctlz", "cttz", "bitreverse", "bswap", "fshl",
                                  "fshr")},
}
_FLAGS = frozenset([  # instruction flags and comparison predicates before the first type
    "nuw", "nsw", "exact", "disjoint", "nneg", "samesign", "fast", "nnan", "ninf", "nsz",
    "arcp", "contract", "afn", "reassoc", "volatile", "eq", "ne", "ugt", "uge", "ult", "ule",
    "sgt", "sge", "slt", "sle", "false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord",
    "ueq", "une", "uno", "true"])
_ZERO_EXTENDING_MASKS = {"255", "65535", "4294967295"}


@dataclass
class BlockWork:
    ops: Counter = field(default_factory=Counter)  # lane-op class -> per lane
    simd: Counter = field(default_factory=Counter)  # SimdOps class -> per SIMD-group issue
    barriers: int = 0
    lines: Counter = field(default_factory=Counter)  # (file, line) -> lane ops

    def counts(self) -> bool:
        return bool(self.ops or self.simd or self.barriers)


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
                            "lines": [[f, n, c] for (f, n), c in b.lines.items()]}
                           for b in self.blocks]}

    @classmethod
    def from_json(cls, data: dict) -> Table:
        blocks = tuple(BlockWork(Counter(b["ops"]), Counter(b["simd"]), b["barriers"],
                                 Counter({(f, n): c for f, n, c in b["lines"]}))
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


def _split_name(name: str) -> tuple[str, str]:
    base, _, args = name.partition("<")
    return base, args.rstrip(">")


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
            base, args = _split_name(fr.function)
            if _PLUMBING.match(base):
                return Role("plumbing")
            if base in _PRIMITIVES and not re.search(r"\b\d+\b", args):
                return Role("primitive", fr.site, fr.function, line)
        innermost = frames[0]
        if self.is_shim(innermost.file) and re.search(r"\b\d+\b", _split_name(
                innermost.function)[1]):
            return Role("loop", line=line)  # its integer work is the loop's control
        return Role("kernel", line=line)


def _operand_type(operands: str) -> str:
    """The first type in an instruction's operands, after its flags."""
    words = operands.split(" ")
    while words and words[0] in _FLAGS:
        words.pop(0)
    text = " ".join(words)
    if text.startswith("<"):
        return text[: text.index(">") + 1]
    return words[0] if words else ""


def _float_class(element: str) -> str:
    return {"half": "f16", "bfloat": "bf16"}.get(element, "f32")


def _is_float(element: str) -> bool:
    return element in ("half", "bfloat", "float", "double")


def _second_operand(operands: str) -> str:
    return operands.rsplit(", ", 1)[-1].strip()


def _constant_power_of_two(text: str) -> bool | None:
    """True/False for an integer constant (a splat too), None for a variable."""
    m = re.fullmatch(r"(?:splat \()?(?:i\d+ )?(-?\d+)\)?", text)
    if not m:
        return None if "%" in text else False
    value = abs(int(m.group(1)))
    return value > 0 and value & (value - 1) == 0


def _arith(ops: Counter, lanes: int, element: str) -> None:
    ops[_float_class(element) if _is_float(element) else "integer"] += lanes


def _lane_ops(ins: Instruction) -> Counter:
    """The operations one execution of a kernel instruction is on the GPU, per lane."""
    op, ops, operands = ins.opcode, Counter(), ins.operands
    lanes, element = element_type(_operand_type(operands))
    if op in ("fadd", "fsub", "fmul", "fneg", "fcmp"):
        ops[_float_class(element)] += lanes
    elif op in ("fdiv", "frem"):
        ops["recip_div"] += lanes
    elif op in ("add", "sub", "or", "xor", "icmp"):
        ops["integer"] += lanes
    elif op == "and" and _second_operand(operands) not in _ZERO_EXTENDING_MASKS:
        ops["integer"] += lanes  # (x & 0xffffffff is a zero extension: free)
    elif op == "mul":
        ops["integer_mul"] += lanes
    elif op in ("shl", "lshr", "ashr"):
        constant = _constant_power_of_two(_second_operand(operands)) is not None
        ops["integer" if constant else "integer_mul"] += lanes
    elif op in ("udiv", "sdiv", "urem", "srem"):
        power = _constant_power_of_two(_second_operand(operands))
        ops["recip_div" if power is None else "integer" if power else "integer_mul"] += lanes
    elif op == "select":
        lanes, element = element_type(_operand_type(operands.split(", ", 1)[1]))
        _arith(ops, lanes, element)
    elif op in ("sitofp", "uitofp", "fptosi", "fptoui"):
        ops["convert"] += lanes
    elif op in ("fpext", "fptrunc"):
        ops["convert_float"] += lanes
    elif op == "call":
        _call_ops(ins, ops)
    return ops


def _call_name(callee: str) -> str:
    """An intrinsic's or libm function's name without its types: llvm.fma.v2f32 is fma,
    expf is exp."""
    if callee.startswith("llvm."):
        parts = callee[5:].split(".")
        while len(parts) > 1 and re.fullmatch(r"(v\d+)?([fi]\d+|bf16|p\d+)", parts[-1]):
            parts.pop()
        return ".".join(parts)
    return callee[:-1] if callee.endswith("f") and callee[:-1] in _CALLS else callee


def _call_ops(ins: Instruction, ops: Counter) -> None:
    name = _call_name(ins.callee or "")
    cls = _CALLS.get(name)
    if name in ("pow", "powi"):
        ops["exp_log"] += 2
        cls = "arith"
    if cls is None:
        return
    lanes, element = element_type(result_type(ins))
    if cls == "arith":
        _arith(ops, lanes, element)
    else:
        ops[cls] += lanes


def _simd_class(ins: Instruction, module: Module) -> str:
    """The SimdOps class of a call of mtw_simd_collective ("" for matrix loads and stores)."""
    combine = re.findall(r"@([-\w.$]+)", ins.text)[-1]
    cls = next((c for mangled, c in _COMBINES if mangled in combine), "shuffles")
    if cls != "mma":
        return cls
    for fr in module.chain(ins.dbg) if ins.dbg is not None else ():
        base, args = _split_name(fr.function)
        if base in ("simdgroup_multiply_accumulate", "simdgroup_multiply"):
            operands = [a.strip() for a in args.split(",")][1:3]  # A and B
            if any(a in ("_Float16", "half") for a in operands):
                return "mma_f16"
            if any(a in ("__bf16", "bfloat") for a in operands):
                return "mma_bf16"
    return "mma_f32"


def _instance_arith(primitive: str, members: list[Instruction]) -> str:
    """The class of a shim function's "arith" operation, from its template argument or
    the types it computes in."""
    args = _split_name(primitive)[1]
    text = args or " ".join(m.text for m in members)
    if re.search(r"\b(_Float16|half)\b", text):
        return "f16"
    if re.search(r"\b(__bf16|bfloat)\b", text):
        return "bf16"
    if re.search(r"\b(float|double)\b", text):
        return "f32"
    return "integer"


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
                    cls = _simd_class(ins, self.module)
                    if cls:
                        self.work[b].simd[cls] += 1
                elif ins.callee == "mtw_threadgroup_barrier":
                    self.work[b].barriers += 1
                elif role.kind == "primitive":
                    instances[role.key or 0].append(ins)
                elif role.kind in ("kernel", "loop"):
                    ops = _lane_ops(ins)
                    if role.kind == "loop":
                        ops = Counter({k: v for k, v in ops.items() if not k.startswith("int")})
                    self._add(b, ops, role.line)
        for members in instances.values():
            self._add_instance(members)
        return self.work

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
        per_copy = Counter()
        for cls, n in _PRIMITIVES[_split_name(role.primitive)[0]]:
            per_copy[_instance_arith(role.primitive, members) if cls == "arith" else cls] += n
        for sink in sinks or members[:1]:
            self._add(self.block_of[id(sink)], per_copy, self.role[id(sink)].line or role.line)


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
    names = iter(range(1 << 62))

    def fresh() -> str:
        return f"%mtwp.{next(names)}"

    for f in module.functions:
        if f.name == "mtw_entry_barrier_free" or roles.is_shim(module.function_file(f)):
            continue
        counter = _Counter(module, roles, f)
        work = counter.count()
        counted.append((f, counter))
        for block, w in zip(f.blocks, work):
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
    declarations = ["declare void @mtw_profile_block(i32)",
                    "declare void @mtw_profile_branch(i32, i32)"]
    return (module.with_lines(before, declarations),
            Table(tuple(blocks), tuple(branches), registers))
