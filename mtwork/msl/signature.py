"""Reads full MSL sources: their `[[kernel]]` functions, function constants and explicit
instantiations, and the source edits that set function constants at compile time.

A kernel's parameters are classified the way Metal binds them (MSL specification,
"Attributes to Locate Buffer, Texture and Sampler Resources" and "Attributes for Kernel
Function Input Arguments"):

- ``buffer``: a ``device`` or ``constant`` pointer or reference, bound to ``[[buffer(n)]]``;
- ``threadgroup``: a ``threadgroup`` pointer, whose memory the host sizes with
  ``[[threadgroup(n)]]``;
- ``attribute``: a thread attribute such as ``[[thread_position_in_grid]]``;
- ``unsupported``: anything else (textures, samplers, ...), which mtwork cannot bind.

A buffer or threadgroup parameter without an index gets the lowest index the kernel
leaves free, in declaration order (MLX's ``arange.h`` relies on this: its three buffers
have no attribute and MLX binds them at 0, 1 and 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from .body import METAL_ATTRIBUTES
from .declarations import constant_declarations, constant_index
from .lexing import code_without_directives, line_of, matching, matching_back, split_top_level
from .types import normalise_type, strip_top_const

__all__ = [
    "ATTRIBUTE_NAMES",
    "FunctionConstant",
    "Instantiation",
    "KernelParam",
    "KernelSignature",
    "ParsedSource",
    "TemplateParam",
    "parse_source",
]

# The thread attributes a kernel parameter may carry.
ATTRIBUTE_NAMES = frozenset(name for name, _ in METAL_ATTRIBUTES)

ParamKind = Literal["buffer", "threadgroup", "attribute", "unsupported"]
Origin = Callable[[int], tuple[str, int]]  # a line of the parsed text -> (file, line)

_ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread")


@dataclass(frozen=True)
class TemplateParam:
    """One parameter of a kernel template: ``typename T`` or ``int N = 4``."""

    kind: str  # "typename" for a type parameter, else the value's type ("int", "bool", ...)
    name: str
    default: str | None = None

    @property
    def is_type(self) -> bool:
        return self.kind in ("typename", "class")


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel function, as declared."""

    name: str
    type_text: str  # e.g. "const device T*", whitespace normalised
    kind: ParamKind
    index: int | None = None  # buffer or threadgroup index (given or implied)
    attribute: str = ""  # the thread attribute, or the unsupported attribute's text
    function_constant: str | None = None  # present only when this constant is true

    @cached_property
    def address_space(self) -> str | None:
        words = re.findall(r"\b\w+\b", self.type_text)
        return next((w for w in words if w in _ADDRESS_SPACES), None)

    @cached_property
    def is_pointer(self) -> bool:
        return strip_top_const(self.type_text).endswith("*")

    @cached_property
    def is_reference(self) -> bool:
        return self.type_text.endswith("&")

    @cached_property
    def writable(self) -> bool:
        """A buffer the kernel may write: a ``device`` pointer or reference to non-const."""
        if self.kind != "buffer" or self.address_space != "device":
            return False
        return not re.search(r"\bconst\b", strip_top_const(self.type_text))

    @cached_property
    def element_type(self) -> str:
        """The pointee type without qualifiers: ``const device T*`` -> ``T``."""
        text = strip_top_const(self.type_text).rstrip("*&")
        text = re.sub(r"\b(?:const|volatile|device|constant|threadgroup|thread)\b", " ", text)
        return normalise_type(text)

    def declaration(self) -> str:
        return f"{self.type_text} {self.name}{self._attribute_text()}"

    def _attribute_text(self) -> str:
        if self.kind == "buffer":
            gate = self.function_constant
            return f" [[buffer({self.index})" + (f", function_constant({gate})]]" if gate else "]]")
        if self.kind == "threadgroup":
            return f" [[threadgroup({self.index})]]"
        return f" [[{self.attribute}]]" if self.attribute else ""


@dataclass(frozen=True)
class KernelSignature:
    """A ``[[kernel]]`` function: its name, template parameters and parameters."""

    name: str
    params: tuple[KernelParam, ...]
    template_params: tuple[TemplateParam, ...]
    file: str
    line: int
    max_threads: int | None = None  # [[max_total_threads_per_threadgroup(n)]]
    host_name: str | None = None  # [[host_name("...")]] on the definition itself
    body: str = ""  # the text between the braces of its definition

    @property
    def buffers(self) -> tuple[KernelParam, ...]:
        return tuple(p for p in self.params if p.kind == "buffer")

    @property
    def threadgroup_params(self) -> tuple[KernelParam, ...]:
        return tuple(p for p in self.params if p.kind == "threadgroup")

    @property
    def is_template(self) -> bool:
        return bool(self.template_params)

    def describe(self) -> str:
        """The signature as one readable block, e.g. for ``print``."""
        head = ""
        if self.template_params:
            parts = [p.kind + " " + p.name + (f" = {p.default}" if p.default else "")
                     for p in self.template_params]
            head = f"template <{', '.join(parts)}>\n"
        params = ",\n".join("    " + p.declaration() for p in self.params)
        return f"{head}[[kernel]] void {self.name}(\n{params})"


@dataclass(frozen=True)
class FunctionConstant:
    """``constant T name [[function_constant(index)]];`` at program scope."""

    name: str
    type_text: str
    index: int | None  # None when it is not integer arithmetic mtwork can evaluate
    file: str
    line: int


@dataclass(frozen=True)
class Instantiation:
    """``template [[host_name("h")]] [[kernel]] ... f<args>;``: host name, function, args."""

    host_name: str
    function: str
    template_args: tuple[str, ...]

    @property
    def function_text(self) -> str:
        if not self.template_args:
            return self.function
        return f"{self.function}<{', '.join(self.template_args)}>"


@dataclass(frozen=True)
class ParsedSource:
    kernels: tuple[KernelSignature, ...]
    function_constants: tuple[FunctionConstant, ...]
    instantiations: tuple[Instantiation, ...]


# ---------------------------------------------------------------------------------------
# Parsing


_ATTRIBUTE_GROUP = r"\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\]"
_KERNEL_HEAD = re.compile(
    rf"(?P<quals>(?:{_ATTRIBUTE_GROUP}\s*|\bkernel\s+)+)void\s+(?P<name>[A-Za-z_]\w*)\s*\("
)
_ATTRIBUTE_CONTENT = re.compile(r"\[\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\]")


def _attributes(text: str) -> list[str]:
    """The attributes of every ``[[...]]`` group in `text`, e.g. ``["buffer(0)"]``."""
    out = []
    for group in _ATTRIBUTE_CONTENT.findall(text):
        out += [a.strip() for a in split_top_level(group) if a.strip()]
    return out


def _is_kernel(quals: str) -> bool:
    return any(a == "kernel" for a in _attributes(quals)) or bool(
        re.search(r"(?:^|\s|\])kernel\s", quals)
    )


def _template_params(mask: str, start: int) -> tuple[TemplateParam, ...]:
    """The parameters of the ``template <...>`` header ending just before `start`."""
    before = mask[:start].rstrip()
    if not before.endswith(">"):
        return ()
    open_angle = matching_back(mask, len(before) - 1, "<", ">")
    if not re.search(r"\btemplate\s*$", mask[:open_angle]):
        return ()
    params = []
    for part in split_top_level(mask[open_angle + 1 : len(before) - 1]):
        part = normalise_type(part)
        if not part:
            continue
        decl, _, default = part.partition("=")
        pointer = _FUNCTION_POINTER.match(decl.strip())
        if pointer:  # `void (*f)(args)`: a function chosen at instantiation
            params.append(TemplateParam(f"{pointer.group('ret')} (*)({pointer.group('args')})",
                                        pointer.group("name"), default.strip() or None))
            continue
        m = re.match(r"^(?P<kind>.*?)\s*\b(?P<name>[A-Za-z_]\w*)$", decl.strip())
        if not m:
            continue
        params.append(TemplateParam(m.group("kind").strip(), m.group("name"),
                                    default.strip() or None))
    return tuple(params)


_FUNCTION_POINTER = re.compile(
    r"^(?P<ret>[^()]*?)\s*\(\s*\*\s*(?P<name>[A-Za-z_]\w*)\s*\)\s*\((?P<args>.*)\)$")


_BINDING = re.compile(r"^(buffer|threadgroup|function_constant)\s*\(\s*(\w+)\s*\)$")


def _parse_param(text: str) -> KernelParam | None:
    attrs = _attributes(text)
    decl = normalise_type(_ATTRIBUTE_CONTENT.sub(" ", text))
    if not decl:
        return None
    m = re.match(r"^(?P<type>.*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<array>\[[^\]]*\])?$", decl)
    if not m or not m.group("type"):
        return KernelParam(decl, decl, "unsupported", attribute="unnamed parameter")
    name, type_text = m.group("name"), normalise_type(m.group("type"))
    if m.group("array"):
        type_text += "*"  # `constant int s[2]` is bound, and passed, as a pointer
    kind: ParamKind | None = None
    index: int | None = None
    gate: str | None = None
    other: list[str] = []
    thread_attribute = ""
    for a in attrs:
        b = _BINDING.match(a)
        if b and b.group(1) == "function_constant":
            gate = b.group(2)
        elif b and b.group(2).isdigit():
            kind, index = b.group(1), int(b.group(2))  # type: ignore[assignment]
        elif a in ATTRIBUTE_NAMES:
            kind, thread_attribute = "attribute", a
        else:
            other.append(a)
    param = KernelParam(name, type_text, "unsupported", attribute=", ".join(other))
    if other and kind is None:
        return param
    if kind is None:
        space = param.address_space
        if (param.is_pointer or param.is_reference) and space in ("device", "constant"):
            kind = "buffer"
        elif param.is_pointer and space == "threadgroup":
            kind = "threadgroup"
        else:
            return KernelParam(name, type_text, "unsupported", attribute="no binding attribute")
    return KernelParam(name, type_text, kind, index, thread_attribute, gate)


def _assign_implicit_indices(params: list[KernelParam]) -> list[KernelParam]:
    out = list(params)
    for kind in ("buffer", "threadgroup"):
        used = {p.index for p in params if p.kind == kind and p.index is not None}
        free = (i for i in range(1 << 16) if i not in used)
        for k, p in enumerate(out):
            if p.kind == kind and p.index is None:
                out[k] = KernelParam(p.name, p.type_text, p.kind, next(free), p.attribute,
                                     p.function_constant)
    return out


def _kernels(text: str, mask: str, origin: Origin) -> list[KernelSignature]:
    kernels = []
    for m in _KERNEL_HEAD.finditer(mask):
        if not _is_kernel(m.group("quals")):
            continue
        open_paren = m.end() - 1
        close = matching(mask, open_paren, "(", ")")
        after = re.match(rf"\s*(?:{_ATTRIBUTE_GROUP}\s*)*(?=[{{;])", mask[close:])
        if not after or mask[close + after.end()] != "{":
            continue  # a declaration, not the definition
        brace = close + after.end()
        body_end = matching(mask, brace, "{", "}")
        params = [_parse_param(p) for p in split_top_level(mask[open_paren + 1 : close - 1])]
        template = _template_params(mask, m.start())
        max_threads = None
        for a in _attributes(m.group("quals")):
            mt = re.match(r"max_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)$", a)
            if mt:
                max_threads = int(mt.group(1))
        quals = text[m.start("quals"):m.end("quals")]
        host = _HOST_NAME.search(quals)
        kernels.append(
            KernelSignature(
                name=m.group("name"),
                params=tuple(_assign_implicit_indices([p for p in params if p is not None])),
                template_params=template,
                file=origin(line_of(text, m.start("name")))[0],
                line=origin(line_of(text, m.start("name")))[1],
                max_threads=max_threads,
                body=text[brace + 1 : body_end - 1],
                host_name="".join(re.findall(r'"([^"]*)"', host.group(1))) if host else None,
            )
        )
    return kernels


def _function_constants(text: str, mask: str, origin: Origin) -> list[FunctionConstant]:
    out = []
    for d in constant_declarations(mask):
        where, line = origin(line_of(text, d.attribute[0]))
        out.append(FunctionConstant(d.name, d.type_text, constant_index(d.index), where, line))
    return out


_INSTANTIATION = re.compile(rf"\btemplate\s*(?P<attrs>(?:{_ATTRIBUTE_GROUP}\s*)+)")
_HOST_NAME = re.compile(r"host_name\s*\(\s*((?:\"[^\"]*\"\s*)+)\)")
_TEMPLATE_ID = re.compile(r"\b([A-Za-z_]\w*)\s*<")


def _instantiations(text: str, mask: str) -> list[Instantiation]:
    out = []
    for m in _INSTANTIATION.finditer(mask):
        host = _HOST_NAME.search(text[m.start("attrs") : m.end("attrs")])
        end = mask.find(";", m.end())
        if not host or end < 0:
            continue
        decl = mask[m.end() : end]
        tid = _TEMPLATE_ID.search(decl)
        if not tid:
            continue
        open_angle = m.end() + tid.end() - 1
        close = matching(mask, open_angle, "<", ">")
        args = tuple(normalise_type(a) for a in split_top_level(text[open_angle + 1 : close - 1]))
        name = "".join(re.findall(r'"([^"]*)"', host.group(1)))  # adjacent literals join
        out.append(Instantiation(name, tid.group(1), args))
    return out


def parse_source(text: str, file: str = "source",
                 origin: Callable[[int], tuple[str, int]] | None = None) -> ParsedSource:
    """The kernels, function constants and host-named instantiations in `text`. Give it
    preprocessed text (see `preprocess`) to see what macros make; `origin(line)` then
    says which file and line each line of it came from (default: `file`, as numbered)."""
    mask = code_without_directives(text)
    where = origin or (lambda line: (file, line))
    return ParsedSource(
        kernels=tuple(_kernels(text, mask, where)),
        function_constants=tuple(_function_constants(text, mask, where)),
        instantiations=tuple(_instantiations(text, mask)),
    )
