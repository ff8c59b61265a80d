"""The rules of the Metal front end: each names the place in Apple's Metal Shading
Language Specification (version 3.2, June 2024; section numbers are that edition's) that
states it, and what Apple's compiler reports when a kernel breaks it.

`docs/msl-rules.md` lists every rule with its test and status; a test keeps the two the
same.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RULES", "SPEC", "Rule", "Violation", "rule"]

# The edition of the specification whose section numbers the rules cite.
SPEC = "MSL 3.2"


@dataclass(frozen=True)
class Rule:
    """One rule: its id, the section that states it, and what it says."""

    id: str
    section: str
    summary: str


_TABLE = (
    # 1.5.4 Restrictions: C++ features Metal does not have.
    Rule("lambda", "1.5.4", "lambda expressions need MSL 3.2 or later"),
    Rule("dynamic-cast", "1.5.4", "dynamic_cast is not available in Metal"),
    Rule("typeid", "1.5.4", "type identification (typeid) is not available in Metal"),
    Rule("new-delete", "1.5.4", "new and delete are not available in Metal (placement new "
                                "from MSL 4.1)"),
    Rule("noexcept-operator", "1.5.4", "the noexcept operator is not available in Metal"),
    Rule("goto", "1.5.4", "goto is not available in Metal"),
    Rule("storage-class", "1.5.4", "register and thread_local are not available in Metal"),
    Rule("virtual", "1.5.4", "virtual functions are not available in Metal"),
    Rule("exceptions", "1.5.4", "exception handling (try, catch, throw) is not available in "
                                "Metal"),
    Rule("main", "1.5.4", "a Metal function cannot be called main"),
    # 2.1 Scalar data types.
    Rule("double", "2.1", "double is not a Metal type"),
    # 4 Address spaces.
    Rule("program-scope", "4.2", "a program-scope variable must be in the constant address "
                                 "space"),
    Rule("constant-initialized", "4.2", "a constant program-scope variable must be "
                                        "initialized"),
    Rule("threadgroup-variable", "4.4", "threadgroup variables are declared in kernel "
                                        "functions only"),
    Rule("address-space-conversion", "4", "a pointer or reference does not convert between "
                                          "address spaces"),
    Rule("member-address-space", "4", "a member function is called on an object in an "
                                      "address space it is not declared for"),
    # 5.1 Functions.
    Rule("kernel-return", "5.1.3", "a kernel function must return void"),
    Rule("host-name", "5.1.10", "two functions cannot have the same host name"),
    # 5.2 Function arguments.
    Rule("argument-address-space", "4", "a pointer or reference argument of a kernel needs "
                                        "the device, constant or threadgroup address space"),
    Rule("argument-binding", "5.2.1", "a kernel argument's attribute must fit its type"),
    Rule("argument-index", "5.2.1", "a resource index must be in range and unique within "
                                    "its group"),
    Rule("argument-attribute", "5.2.3.6", "a kernel argument's attribute must be one Metal "
                                          "defines"),
    Rule("attribute-type", "5.2.3.6", "a built-in kernel argument must have one of the "
                                      "types Table 5.8 allows, matching its companions"),
    Rule("argument-type", "5.2", "a kernel argument cannot be of type size_t or ptrdiff_t"),
    # 5.8 Function constants.
    Rule("function-constant-index", "5.8.1", "a function constant's index must be between "
                                             "0 and 65535 and unique"),
    Rule("function-constant-type", "5.8.1", "a function constant must be a scalar or vector"),
    Rule("function-constant-name", "5.8.1.2", "[[function_constant(name)]] must name a "
                                              "program-scope constant"),
    # Limits of the GPU family (Metal feature set tables).
    Rule("threads-per-threadgroup", "5.1.3", "max_total_threads_per_threadgroup cannot "
                                             "exceed the GPU family's limit"),
)

RULES: dict[str, Rule] = {r.id: r for r in _TABLE}


def rule(rule_id: str) -> Rule:
    return RULES[rule_id]


@dataclass(frozen=True)
class Violation:
    """A place where a kernel breaks a rule, as Apple's compiler would report it."""

    rule: str
    file: str
    line: int
    column: int
    message: str
    excerpt: str = ""  # the author's line

    def __str__(self) -> str:
        r = RULES[self.rule]
        # Always a column, as compilers write it (editors read `file:line:col:`).
        where = f"{self.file}:{self.line}:{self.column or 1}"
        text = f"{where}: error: {SPEC} §{r.section}: {self.message} [{self.rule}]"
        if self.excerpt:
            text += f"\n{self.line:>5} | {self.excerpt}"
            if self.column:
                text += f"\n      | {' ' * (self.column - 1)}^"
        return text
