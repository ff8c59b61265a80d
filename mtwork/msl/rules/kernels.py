"""Rules of kernel functions and function constants: what a kernel returns and is called
(MSL 3.2 specification, sections 5.1.3 and 5.1.10), what its arguments are and carry
(chapter 4; section 5.2; 5.2.1 "Locating Buffer, Texture, and Sampler Arguments"; 5.2.3.6
"Kernel Function Input Attributes", Table 5.8), how function constants are declared
(section 5.8.1), and the GPU family's limit on threads per threadgroup.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from ..declarations import ConstantDeclaration, constant_declarations, constant_index
from ..signature import ATTRIBUTE_NAMES, Instantiation, KernelParam, KernelSignature
from ..target import MslTarget
from ..types import normalise_type, strip_top_const, type_info
from .code import Code
from .table import Violation

__all__ = ["constant_violations", "kernel_return_message", "kernel_return_violations",
           "non_void_kernels", "signature_violations"]

# Table 5.8: built-ins whose type is a uint or ushort scalar or vector, which match in
# pairs; and those whose type is a uint or ushort scalar, which all match.
_POSITIONS = frozenset({
    "thread_position_in_grid", "threads_per_grid", "thread_position_in_threadgroup",
    "threads_per_threadgroup", "threadgroup_position_in_grid",
    "dispatch_threads_per_threadgroup", "threadgroups_per_grid", "grid_origin", "grid_size",
})
_SAME_TYPE = (("thread_position_in_grid", "threads_per_grid"),
              ("thread_position_in_threadgroup", "threads_per_threadgroup",
               "dispatch_threads_per_threadgroup"))
_SIMD_COUNTS = frozenset({
    "thread_index_in_simdgroup", "threads_per_simdgroup", "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup", "dispatch_simdgroups_per_threadgroup",
    "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "dispatch_quadgroups_per_threadgroup",
})
_POSITION_TYPES = frozenset({"uint", "uint2", "uint3", "ushort", "ushort2", "ushort3",
                             "vec<uint, 2>", "vec<uint, 3>", "vec<ushort, 2>",
                             "vec<ushort, 3>", "unsigned int", "unsigned short", "uint32_t",
                             "uint16_t"})
_INDEX_TYPES = frozenset({"uint", "ushort", "unsigned int", "unsigned short", "uint32_t",
                          "uint16_t"})
# Arguments that are resources without a pointer (bound with [[buffer(n)]] too).
_RESOURCE_TYPES = re.compile(r"\b(?:texture\w*|depth\w*|sampler|acceleration_structure|"
                             r"intersection_function_table|visible_function_table|tensor|"
                             r"array|imageblock|mesh_grid_properties|command_buffer)\b")
_RESOURCE_ATTRIBUTE = re.compile(r"^(buffer|threadgroup|texture|sampler)\s*\((.*)\)$")
_OTHER_ATTRIBUTES = re.compile(r"^(?:function_constant\s*\(.*\)|stage_in|"
                               r"raster_order_group\s*\(.*\)|id\s*\(.*\)|"
                               r"user\s*\(.*\)|payload)$")
_KERNEL_SPACES = ("device", "constant", "threadgroup", "threadgroup_imageblock")
MAX_FUNCTION_CONSTANT_INDEX = 65535


def _is_indirect(p: KernelParam) -> bool:
    return strip_top_const(p.type_text).endswith(("*", "&"))


def _plain(type_text: str) -> str:
    text = normalise_type(re.sub(r"\b(?:const|volatile|thread)\b", " ", type_text))
    return re.sub(r"^(?:metal)?::", "", text)


def signature_violations(kernel: KernelSignature, target: MslTarget,
                         constants: Iterable[str] = (),
                         at: Code | None = None) -> Iterator[Violation]:
    """The rules `kernel`'s signature breaks; `constants` are the program-scope constants
    a ``[[function_constant(name)]]`` may name."""
    found: list[tuple[str, str]] = []
    for p in kernel.params:
        found += _argument(p, target)
    found += _indices(kernel.params, target)
    found += _attribute_types(kernel.params)
    names = {c.split("::")[-1] for c in constants}
    found += [("function-constant-name", f"argument `{p.name}`: [[function_constant("
               f"{p.function_constant})]] names no program-scope constant")
              for p in kernel.params
              if p.function_constant and p.function_constant.split("::")[-1] not in names]
    limit = target.limits.threads_per_threadgroup
    if kernel.max_threads is not None and kernel.max_threads > limit:
        found.append(("threads-per-threadgroup", f"max_total_threads_per_threadgroup("
                      f"{kernel.max_threads}) is over the {limit} threads a threadgroup has "
                      f"on {target.gpu_family}"))
    excerpt = ""
    if at is not None:
        lines = at.originals(kernel.file)
        if lines is not None and 0 < kernel.line <= len(lines):
            excerpt = lines[kernel.line - 1].rstrip()
    for rule, message in found:
        yield Violation(rule, kernel.file, kernel.line, 0,
                        f"kernel `{kernel.name}`: {message}", excerpt)


def _argument(p: KernelParam, target: MslTarget) -> list[tuple[str, str]]:
    """What is wrong with one argument on its own."""
    attrs = [a.strip() for a in p.attribute.split(",") if a.strip()] if p.kind == \
        "unsupported" else []
    attrs = [a for a in attrs if a not in ("no binding attribute", "unnamed parameter")]
    unknown = [a for a in attrs
               if not _RESOURCE_ATTRIBUTE.match(a) and not _OTHER_ATTRIBUTES.match(a)]
    if unknown:
        return [("argument-attribute", f"argument `{p.name}` has [[{unknown[0]}]], which is "
                 f"no attribute of a kernel argument (Table 5.8 lists the built-ins)")]
    space = p.address_space
    if _is_indirect(p) and p.kind != "attribute" and space not in _KERNEL_SPACES:
        what = "no address space" if space is None else f"the {space} address space"
        return [("argument-address-space", f"argument `{p.name}` ({p.type_text}) is a "
                 f"pointer or reference with {what}: a kernel's are device, constant or "
                 f"threadgroup")]
    plain = _plain(p.type_text)
    if not _is_indirect(p) and re.fullmatch(r"(?:std::)?(?:size_t|ptrdiff_t)", plain):
        return [("argument-type", f"argument `{p.name}` is a {plain}, which a kernel "
                 f"argument cannot be (its size differs between host and GPU)")]
    if p.kind == "buffer" and not _is_indirect(p) and not _RESOURCE_TYPES.search(plain):
        return [("argument-binding", f"argument `{p.name}` has [[buffer({p.index})]] but is "
                 f"a {p.type_text}: a buffer is a device or constant pointer or reference")]
    if p.kind == "buffer" and space == "threadgroup":
        return [("argument-binding", f"argument `{p.name}` is threadgroup memory: it takes "
                 f"[[threadgroup(n)]], not [[buffer({p.index})]]")]
    if p.kind == "threadgroup" and space != "threadgroup":
        return [("argument-binding", f"argument `{p.name}` has [[threadgroup({p.index})]] "
                 f"but is a {p.type_text}: it must point to threadgroup memory")]
    if p.kind == "attribute" and _is_indirect(p):
        return [("attribute-type", f"argument `{p.name}` has [[{p.attribute}]], whose value "
                 f"is a number, not a pointer or reference")]
    if p.kind == "unsupported" and not attrs and not _is_indirect(p) \
            and not _RESOURCE_TYPES.search(plain):
        return [("argument-attribute", f"argument `{p.name}` ({p.type_text}) has no "
                 f"attribute: a kernel argument is a buffer, threadgroup memory, a texture "
                 f"or sampler, or a built-in such as [[thread_position_in_grid]]")]
    return []


def _indices(params: Sequence[KernelParam], target: MslTarget) -> list[tuple[str, str]]:
    """Resource indices out of the argument table, or used twice in one group (arguments
    gated by a function constant may share one, section 5.2.1)."""
    out: list[tuple[str, str]] = []
    slots = target.limits.buffer_slots
    seen: dict[tuple[str, int], str] = {}
    for p in params:
        for group, index in _resources(p):
            if index >= slots:
                out.append(("argument-index", f"argument `{p.name}` has [[{group}({index})]]"
                            f": the argument table has indices 0 to {slots - 1}"))
            key = (group, index)
            if key in seen and not p.function_constant:
                out.append(("argument-index", f"arguments `{seen[key]}` and `{p.name}` both "
                            f"have [[{group}({index})]]"))
            elif not p.function_constant:
                seen[key] = p.name
    return out


def _resources(p: KernelParam) -> list[tuple[str, int]]:
    if p.kind in ("buffer", "threadgroup") and p.index is not None:
        return [(p.kind, p.index)]
    out = []
    for a in p.attribute.split(","):
        m = _RESOURCE_ATTRIBUTE.match(a.strip())
        if m and m.group(2).strip().isdigit():
            out.append((m.group(1), int(m.group(2))))
    return out


def _attribute_types(params: Sequence[KernelParam]) -> list[tuple[str, str]]:
    """Built-in arguments of a type Table 5.8 does not allow, or that differ from the
    built-ins whose type they must match."""
    out: list[tuple[str, str]] = []
    types = {p.attribute: _plain(p.type_text) for p in params if p.kind == "attribute"}
    for name, t in types.items():
        allowed = _POSITION_TYPES if name in _POSITIONS else _INDEX_TYPES
        if name in ATTRIBUTE_NAMES and t not in allowed:
            what = ("ushort or uint, scalar or vector" if name in _POSITIONS
                    else "ushort or uint")
            out.append(("attribute-type", f"[[{name}]] is declared {t}; it must be {what}"))
    for group in _SAME_TYPE:
        declared = {types[n] for n in group if n in types}
        if len(declared) > 1:
            present = ", ".join(f"[[{n}]] {types[n]}" for n in group if n in types)
            out.append(("attribute-type", f"{present}: these built-ins must have one type"))
    simd = {types[n] for n in _SIMD_COUNTS if n in types}
    if len(simd & _INDEX_TYPES) > 1:
        present = ", ".join(f"[[{n}]] {types[n]}" for n in sorted(_SIMD_COUNTS) if n in types)
        out.append(("attribute-type", f"{present}: the SIMD-group and quad-group built-ins "
                    f"must have one type"))
    position = types.get("thread_position_in_threadgroup", "")
    if position.startswith("uint") and types.get("thread_index_in_threadgroup",
                                                 "uint") != "uint":
        out.append(("attribute-type", "[[thread_index_in_threadgroup]] must be uint when "
                    f"[[thread_position_in_threadgroup]] is {position}"))
    return out


_NON_VOID_KERNEL = re.compile(
    r"(?:\[\[\s*kernel\s*\]\]|\bkernel)\s+(?:\[\[[^\]]*\]\]\s*)*"
    r"(?!void\b)(?P<type>[A-Za-z_][\w:]*(?:<[^<>;{}]*>)?[\s*&]*)\s+(?P<name>[A-Za-z_]\w*)\s*\(")


def non_void_kernels(mask: str) -> Iterator[tuple[str, int, str]]:
    """(name, offset of the name, return type) of each kernel function in `mask` (a code
    mask) that does not return void."""
    for m in _NON_VOID_KERNEL.finditer(mask):
        if m.group("type").strip() not in ("static", "inline", "constexpr"):
            yield m.group("name"), m.start("name"), m.group("type").strip()


def kernel_return_message(name: str, returns: str) -> str:
    return f"kernel `{name}` returns {returns}: a kernel function must return void"


def kernel_return_violations(code: Code) -> Iterator[Violation]:
    """Kernel functions that do not return void (section 5.1.3)."""
    for name, at, returns in non_void_kernels(code.mask):
        v = code.violation("kernel-return", at, kernel_return_message(name, returns))
        if v is not None:
            yield v


def host_name_violations(instantiations: Sequence[Instantiation],
                         kernels: Sequence[KernelSignature], code: Code
                         ) -> Iterator[Violation]:
    """Host names given to two different functions (section 5.1.10)."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for inst in instantiations:
        text = inst.function_text
        nth = seen[inst.host_name] = seen.get(inst.host_name, -1) + 1
        if names.setdefault(inst.host_name, text) == text:
            continue
        places = [m.start() for m in re.finditer(
            r'host_name\s*\(\s*"' + re.escape(inst.host_name) + '"', code.author_text)]
        if nth < len(places):
            v = code.violation("host-name", places[nth], f"host name \"{inst.host_name}\" "
                               f"names both {names[inst.host_name]} and {text}")
            if v is not None:
                yield v


def constant_violations(code: Code, struct_names: set[str]) -> Iterator[Violation]:
    """Function constants with an index out of range or used twice, or of a type that is
    not a scalar or vector (section 5.8.1)."""
    seen: dict[int, str] = {}
    for d in constant_declarations(code.mask):
        yield from _constant(code, d, seen, struct_names)


def _constant(code: Code, d: ConstantDeclaration, seen: dict[int, str],
              struct_names: set[str]) -> Iterator[Violation]:
    index = constant_index(d.index)
    found: list[tuple[str, str]] = []
    if index is not None:
        if not 0 <= index <= MAX_FUNCTION_CONSTANT_INDEX:
            found.append(("function-constant-index", f"function constant `{d.name}` has "
                          f"index {index}; indices are 0 to {MAX_FUNCTION_CONSTANT_INDEX}"))
        elif seen.setdefault(index, d.name) != d.name:
            found.append(("function-constant-index", f"function constants `{seen[index]}` "
                          f"and `{d.name}` both have index {index}"))
    base = d.type_text.split("::")[-1]
    array = bool(re.search(re.escape(d.name) + r"\s*\[", code.mask[d.start:d.attribute[0]]))
    if array or (type_info(d.type_text) is None and base in struct_names):
        what = "an array" if array else f"a {d.type_text}"
        found.append(("function-constant-type", f"function constant `{d.name}` is {what}; "
                      f"function constants are scalars or vectors"))
    for rule, message in found:
        v = code.violation(rule, d.attribute[0], message)
        if v is not None:
            yield v
