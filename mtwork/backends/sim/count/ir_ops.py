"""What one LLVM IR instruction of a kernel is on an Apple GPU: operations by class
(`mtwork.gpu.LaneOps`), SIMD-group operations (`SimdOps`), and the shim's functions that
are one operation (`PRIMITIVES`) or none (`is_plumbing`). instrument.py decides which of
a kernel's instructions count and adds them up per block.
"""

from __future__ import annotations

import re
from collections import Counter

from .llvm_ir import Instruction, Module, element_type
from .registers import result_type

__all__ = ["PRIMITIVES", "is_plumbing", "is_primitive", "lane_ops", "primitive_ops",
           "simd_class", "split_name", "vector_template"]

# The shim's functions that are one operation on the GPU: (class, count) pairs, "arith"
# meaning one f32, f16, bf16 or integer operation by the types it computes in. Rough
# forms where Apple's GPU has no single instruction: pow = exp2(y log2 x), cbrt the same,
# hyperbolic functions through one exponential and a division, fmod through a division.
_EXP, _TRIG, _HYPERBOLIC = (("exp_log", 1),), (("trig", 1),), (
    ("exp_log", 1), ("recip_div", 1), ("arith", 2))
PRIMITIVES: dict[str, tuple[tuple[str, int], ...]] = {
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


def split_name(name: str) -> tuple[str, str]:
    base, _, args = name.partition("<")
    return base, args.rstrip(">")


def is_plumbing(function: str) -> bool:
    """Whether a shim function's instructions are the emulator's machinery."""
    return bool(_PLUMBING.match(split_name(function)[0]))


def vector_template(function: str) -> bool:
    """Whether a shim function is a template over a vector length (its loop is unrolled
    on the GPU)."""
    return bool(re.search(r"\b\d+\b", split_name(function)[1]))


def is_primitive(function: str) -> bool:
    """Whether a shim function is one operation (a scalar one: vector forms loop over it)."""
    return split_name(function)[0] in PRIMITIVES and not vector_template(function)


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


def lane_ops(ins: Instruction) -> Counter:
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


def simd_class(ins: Instruction, module: Module) -> str:
    """The SimdOps class of a call of mtw_simd_collective ("" for matrix loads and stores)."""
    combine = re.findall(r"@([-\w.$]+)", ins.text)[-1]
    cls = next((c for mangled, c in _COMBINES if mangled in combine), "shuffles")
    if cls != "mma":
        return cls
    for fr in module.chain(ins.dbg) if ins.dbg is not None else ():
        base, args = split_name(fr.function)
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
    args = split_name(primitive)[1]
    text = args or " ".join(m.text for m in members)
    if re.search(r"\b(_Float16|half)\b", text):
        return "f16"
    if re.search(r"\b(__bf16|bfloat)\b", text):
        return "bf16"
    if re.search(r"\b(float|double)\b", text):
        return "f32"
    return "integer"


def primitive_ops(primitive: str, members: list[Instruction]) -> Counter:
    """What one call of the shim function `primitive` (its inlined instructions
    `members`) is on the GPU."""
    ops = Counter()
    for cls, n in PRIMITIVES[split_name(primitive)[0]]:
        ops[_instance_arith(primitive, members) if cls == "arith" else cls] += n
    return ops
