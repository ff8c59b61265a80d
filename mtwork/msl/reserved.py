"""Words an MSL name cannot be: a buffer or template parameter called ``new`` or
``device`` is a compile error, not a name.

MSL is C++14 with extensions (Metal Shading Language Specification, section 1.4 "Metal
and C++14"), so C++14's keywords ([lex.key], table 4 of ISO/IEC 14882:2014) and their
alternative spellings ([lex.key], table 5: ``and``, ``not_eq``, ...) are reserved; MSL
adds its address spaces (chapter 4 "Address Spaces": ``device``, ``constant``,
``thread``, ``threadgroup``, ``threadgroup_imageblock``, ``ray_data``, ``object_data``)
and its function qualifiers (section 5.1: ``kernel``, ``vertex``, ``fragment``); the
emulator's shim defines the address spaces and ``kernel`` as macros.
"""

from __future__ import annotations

__all__ = ["reserved_reason"]

_CPP14_KEYWORDS = frozenset({
    "alignas", "alignof", "asm", "auto", "bool", "break", "case", "catch", "char",
    "char16_t", "char32_t", "class", "const", "constexpr", "const_cast", "continue",
    "decltype", "default", "delete", "do", "double", "dynamic_cast", "else", "enum",
    "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
    "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "nullptr",
    "operator", "private", "protected", "public", "register", "reinterpret_cast", "return",
    "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
    "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef",
    "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
    "wchar_t", "while",
})

_CPP14_ALTERNATIVE_TOKENS = frozenset({
    "and", "and_eq", "bitand", "bitor", "compl", "not", "not_eq", "or", "or_eq", "xor",
    "xor_eq",
})

_MSL_WORDS = frozenset({
    "device", "constant", "thread", "threadgroup", "threadgroup_imageblock", "ray_data",
    "object_data", "kernel", "vertex", "fragment",
})

def reserved_reason(name: str) -> str | None:
    """Why `name` cannot name anything in MSL, or None when it can."""
    if name in _CPP14_KEYWORDS:
        return "a C++ keyword (MSL is based on C++14)"
    if name in _CPP14_ALTERNATIVE_TOKENS:
        return "a C++ operator word (MSL is based on C++14)"
    if name in _MSL_WORDS:
        return "an MSL address space or function qualifier"
    return None
