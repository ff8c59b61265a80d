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
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import mlx.core as mx

from .backends.sim.launcher import ATTRIBUTE_NAMES
from .backends.sim.rewrite import _matching, _matching_back, _split_top_level, code_mask

__all__ = [
    "FunctionConstant",
    "Instantiation",
    "KernelParam",
    "KernelSignature",
    "ParsedSource",
    "TemplateParam",
    "TypeInfo",
    "code_without_directives",
    "function_constant_macros",
    "parse_source",
    "rewrite_function_constants",
    "strip_msl_only_syntax",
    "type_info",
]

ParamKind = Literal["buffer", "threadgroup", "attribute", "unsupported"]

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
        return _strip_top_const(self.type_text).endswith("*")

    @cached_property
    def is_reference(self) -> bool:
        return self.type_text.endswith("&")

    @cached_property
    def writable(self) -> bool:
        """A buffer the kernel may write: a ``device`` pointer or reference to non-const."""
        if self.kind != "buffer" or self.address_space != "device":
            return False
        return not re.search(r"\bconst\b", _strip_top_const(self.type_text))

    @cached_property
    def element_type(self) -> str:
        """The pointee type without qualifiers: ``const device T*`` -> ``T``."""
        text = _strip_top_const(self.type_text).rstrip("*&")
        text = re.sub(r"\b(?:const|volatile|device|constant|threadgroup|thread)\b", " ", text)
        return _normalise(text)

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
    index: int
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
        return f"{self.function}<{', '.join(self.template_args)}>"


@dataclass(frozen=True)
class ParsedSource:
    kernels: tuple[KernelSignature, ...]
    function_constants: tuple[FunctionConstant, ...]
    instantiations: tuple[Instantiation, ...]


# ---------------------------------------------------------------------------------------
# Parsing


def _normalise(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s*([*&])", r"\1", text)
    return re.sub(r"\s*([<>,])\s*", lambda m: m.group(1) + (" " if m.group(1) == "," else ""),
                  text)


def _strip_top_const(type_text: str) -> str:
    """``device T* const`` -> ``device T*``: a const pointer still points at writable data."""
    return re.sub(r"([*&])\s*const\s*$", r"\1", type_text.strip())


def code_without_directives(text: str) -> str:
    """`code_mask(text)` with preprocessor directives (and their continuations) blanked too:
    declarations inside macros are not the file's own."""
    mask = code_mask(text)
    out = []
    continued = False
    for line in mask.split("\n"):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        out.append(" " * len(line) if directive else line)
    return "\n".join(out)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


_ATTRIBUTE_GROUP = r"\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\]"
_KERNEL_HEAD = re.compile(
    rf"(?P<quals>(?:{_ATTRIBUTE_GROUP}\s*|\bkernel\s+)+)void\s+(?P<name>[A-Za-z_]\w*)\s*\("
)
_ATTRIBUTE_CONTENT = re.compile(r"\[\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\]")


def _attributes(text: str) -> list[str]:
    """The attributes of every ``[[...]]`` group in `text`, e.g. ``["buffer(0)"]``."""
    out = []
    for group in _ATTRIBUTE_CONTENT.findall(text):
        out += [a.strip() for a in _split_top_level(group) if a.strip()]
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
    open_angle = _matching_back(mask, len(before) - 1, "<", ">")
    if not re.search(r"\btemplate\s*$", mask[:open_angle]):
        return ()
    params = []
    for part in _split_top_level(mask[open_angle + 1 : len(before) - 1]):
        part = _normalise(part)
        if not part:
            continue
        decl, _, default = part.partition("=")
        m = re.match(r"^(?P<kind>.*?)\s*\b(?P<name>[A-Za-z_]\w*)$", decl.strip())
        if not m:
            continue
        params.append(TemplateParam(m.group("kind").strip(), m.group("name"),
                                    default.strip() or None))
    return tuple(params)


_BINDING = re.compile(r"^(buffer|threadgroup|function_constant)\s*\(\s*(\w+)\s*\)$")


def _parse_param(text: str) -> KernelParam | None:
    attrs = _attributes(text)
    decl = _normalise(_ATTRIBUTE_CONTENT.sub(" ", text))
    if not decl:
        return None
    m = re.match(r"^(?P<type>.*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<array>\[[^\]]*\])?$", decl)
    if not m or not m.group("type"):
        return KernelParam(decl, decl, "unsupported", attribute="unnamed parameter")
    name, type_text = m.group("name"), _normalise(m.group("type"))
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


def _kernels(text: str, mask: str, file: str) -> list[KernelSignature]:
    kernels = []
    for m in _KERNEL_HEAD.finditer(mask):
        if not _is_kernel(m.group("quals")):
            continue
        open_paren = m.end() - 1
        close = _matching(mask, open_paren, "(", ")")
        after = re.match(rf"\s*(?:{_ATTRIBUTE_GROUP}\s*)*(?=[{{;])", mask[close:])
        if not after or mask[close + after.end()] != "{":
            continue  # a declaration, not the definition
        brace = close + after.end()
        body_end = _matching(mask, brace, "{", "}")
        params = [_parse_param(p) for p in _split_top_level(mask[open_paren + 1 : close - 1])]
        template = _template_params(mask, m.start())
        max_threads = None
        for a in _attributes(m.group("quals")):
            mt = re.match(r"max_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)$", a)
            if mt:
                max_threads = int(mt.group(1))
        kernels.append(
            KernelSignature(
                name=m.group("name"),
                params=tuple(_assign_implicit_indices([p for p in params if p is not None])),
                template_params=template,
                file=file,
                line=_line_of(text, m.start("name")),
                max_threads=max_threads,
                body=text[brace + 1 : body_end - 1],
            )
        )
    return kernels


_FUNCTION_CONSTANT = re.compile(
    r"\bconstant\s+(?P<type>[A-Za-z_][\w:<>, ]*?)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\[\s*function_constant\s*\(\s*(?P<index>\d+)\s*\)\s*\]\]\s*;"
)


def _function_constants(text: str, mask: str, file: str) -> list[FunctionConstant]:
    return [
        FunctionConstant(m.group("name"), _normalise(m.group("type")), int(m.group("index")),
                         file, _line_of(text, m.start()))
        for m in _FUNCTION_CONSTANT.finditer(mask)
    ]


_INSTANTIATION = re.compile(rf"\btemplate\s*(?P<attrs>(?:{_ATTRIBUTE_GROUP}\s*)+)")
_HOST_NAME = re.compile(r"host_name\s*\(\s*\"([^\"]+)\"\s*\)")
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
        close = _matching(mask, open_angle, "<", ">")
        args = tuple(_normalise(a) for a in _split_top_level(text[open_angle + 1 : close - 1]))
        out.append(Instantiation(host.group(1), tid.group(1), args))
    return out


def parse_source(text: str, file: str = "source") -> ParsedSource:
    """The kernels, function constants and host-named instantiations written in `text`
    (not those of included files, nor those made by macros)."""
    mask = code_without_directives(text)
    return ParsedSource(
        kernels=tuple(_kernels(text, mask, file)),
        function_constants=tuple(_function_constants(text, mask, file)),
        instantiations=tuple(_instantiations(text, mask)),
    )


# ---------------------------------------------------------------------------------------
# Types

# Metal's scalar type names (and the typedefs MLX and C++ add) with the MLX dtype of the
# same bytes.
SCALAR_TYPES: dict[str, mx.Dtype] = {
    "bool": mx.bool_,
    "char": mx.int8, "int8_t": mx.int8,
    "uchar": mx.uint8, "unsigned char": mx.uint8, "uint8_t": mx.uint8,
    "short": mx.int16, "int16_t": mx.int16,
    "ushort": mx.uint16, "unsigned short": mx.uint16, "uint16_t": mx.uint16,
    "int": mx.int32, "int32_t": mx.int32,
    "uint": mx.uint32, "unsigned": mx.uint32, "unsigned int": mx.uint32, "uint32_t": mx.uint32,
    "long": mx.int64, "int64_t": mx.int64,
    "ulong": mx.uint64, "unsigned long": mx.uint64, "uint64_t": mx.uint64, "size_t": mx.uint64,
    "half": mx.float16, "float16_t": mx.float16,
    "bfloat": mx.bfloat16, "bfloat16_t": mx.bfloat16,
    "float": mx.float32, "float32_t": mx.float32,
    "complex64_t": mx.complex64,
}

# The Metal spelling of each dtype, used to write template arguments.
METAL_TYPE_NAMES: dict[mx.Dtype, str] = {
    mx.bool_: "bool", mx.int8: "char", mx.uint8: "uchar", mx.int16: "short",
    mx.uint16: "ushort", mx.int32: "int", mx.uint32: "uint", mx.int64: "long",
    mx.uint64: "ulong", mx.float16: "half", mx.bfloat16: "bfloat", mx.float32: "float",
    mx.complex64: "complex64_t",
}


@dataclass(frozen=True)
class TypeInfo:
    """A Metal scalar or vector type: its element dtype, lane count and lanes in memory
    (a three-lane vector takes the room of four unless it is ``packed_``)."""

    dtype: mx.Dtype
    lanes: int = 1
    storage_lanes: int = 1

    @property
    def nbytes(self) -> int:
        return self.dtype.size * self.storage_lanes


_VECTOR = re.compile(r"^(?P<packed>packed_)?(?P<scalar>[a-z]+?)(?P<n>[234])$")
_VEC_TEMPLATE = re.compile(r"^vec<(?P<scalar>[\w ]+), (?P<n>[234])>$")
_ATOMIC = re.compile(r"^(?:atomic<(?P<inner>[\w ]+)>|atomic_(?P<short>\w+))$")


def type_info(type_text: str) -> TypeInfo | None:
    """What a scalar, vector or atomic type holds; None for other types (structs, ...)."""
    text = _normalise(re.sub(r"\b(?:const|volatile)\b", " ", type_text))
    text = re.sub(r"^(?:metal|::metal)::", "", text)
    atomic = _ATOMIC.match(text)
    if atomic:
        text = atomic.group("inner") or atomic.group("short")
    if text in SCALAR_TYPES:
        return TypeInfo(SCALAR_TYPES[text])
    vec = _VECTOR.match(text) or _VEC_TEMPLATE.match(text)
    if vec and vec.group("scalar").strip() in SCALAR_TYPES:
        n = int(vec.group("n"))
        packed = vec.groupdict().get("packed")
        return TypeInfo(SCALAR_TYPES[vec.group("scalar").strip()], n,
                        4 if n == 3 and not packed else n)
    return None


# ---------------------------------------------------------------------------------------
# Function constants, set when the source is compiled

_IS_DEFINED = re.compile(r"\bis_function_constant_defined\s*\(\s*([A-Za-z_]\w*)\s*\)")


def value_macro(name: str) -> str:
    return f"__mtw_fc_{name}"


def defined_macro(name: str) -> str:
    return f"__mtw_fc_defined_{name}"


def rewrite_function_constants(text: str) -> str:
    """Turns function constants into compile-time constants whose values are macros.

    ``constant T x [[function_constant(n)]];`` becomes ``constant constexpr T x =
    __mtw_fc_x;`` and ``is_function_constant_defined(x)`` becomes ``__mtw_fc_defined_x``;
    `function_constant_macros` defines both for one choice of values. Keeping the values
    out of the text lets every choice share one rewritten copy of a file. Lines stay where
    they were, and so does the kernel's own text around them.
    """
    mask = code_without_directives(text)
    edits = [
        (m.start(), m.end(),
         f"constant constexpr {m.group('type')} {m.group('name')} = "
         f"{value_macro(m.group('name'))};" + "\n" * text.count("\n", m.start(), m.end()))
        for m in _FUNCTION_CONSTANT.finditer(mask)
    ]
    edits += [(m.start(), m.end(), defined_macro(m.group(1))) for m in _IS_DEFINED.finditer(mask)]
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def function_constant_macros(values: dict[str, tuple[str, str | None]]) -> str:
    """``#define`` lines giving each constant (name -> (type, value text or None for
    "not set")) its value; an unset constant reads as zero and is not defined."""
    lines = []
    for name, (type_text, value) in sorted(values.items()):
        lines.append(f"#define {value_macro(name)} ({type_text})({value or 0})")
        lines.append(f"#define {defined_macro(name)} {'true' if value else 'false'}")
    return "\n".join(lines) + ("\n" if lines else "")


_KERNEL_KEYWORD = re.compile(r"\bkernel(?=\s+void\b)")
_THREADGROUP_ATTRIBUTE = re.compile(r"\[\[[^\[\]]*\bthreadgroup\s*\([^\[\]]*\]\]")


def strip_msl_only_syntax(text: str) -> str:
    """Blanks what C++ cannot read once the address spaces are empty macros: the
    ``kernel`` qualifier (``kernel void f(...)``) and ``[[threadgroup(n)]]`` attributes."""
    mask = code_without_directives(text)
    spans = [m.span() for m in _KERNEL_KEYWORD.finditer(mask)]
    spans += [m.span() for m in _THREADGROUP_ATTRIBUTE.finditer(mask)]
    for a, b in sorted(spans, reverse=True):
        text = text[:a] + " " * (b - a) + text[b:]
    return text
