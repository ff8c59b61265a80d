"""Metal's rules on sim: for every rule of the front end (docs/msl-rules.md), a kernel that
breaks it is refused with a `MetalRuleError` at the line that breaks it, naming the rule
and its section of the specification, and a twin that keeps it compiles and runs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import mtwork
from mtwork.errors import MetalRuleError
from mtwork.msl.rules import RULES, SPEC

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MARK = "// <-"  # the line a violation is reported at


def full(top: str = "", body: str = "out[i] = 2.0f * float(i);", args: str = "",
         attributes: str = "", returns: str = "void") -> str:
    """A kernel `k` writing `out`, with `top` before it and `body` in it."""
    return (f"{HEAD}{top}\n{attributes}kernel {returns} k(device float* out [[buffer(0)]]"
            f"{args}, uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n")


@dataclass(frozen=True)
class Case:
    rule: str
    bad: str
    good: str
    buffers: dict = field(default_factory=dict)  # the twin's bindings besides `out`
    expect: Callable[[int], float] = lambda i: 2.0 * i
    msl_version: str | None = None
    constants: dict = field(default_factory=dict)
    kernel: str = "k"


TWICE = "float twice(float v) { return 2.0f * v; }\n"
SCALE = np.array([2.0], np.float32)

CASES = [
    Case("lambda",
         full(body="auto twice = [](float v) { return 2.0f * v; };  // <-\nout[i] = twice(i);"),
         full(TWICE, "out[i] = twice(float(i));"), msl_version="3.1"),
    Case("dynamic-cast",
         full("struct B { float s; };\nstruct D : B {};\n",
              "D d; d.s = 2.0f;\nthread B* b = dynamic_cast<thread B*>(&d);  // <-\n"
              "out[i] = b->s * float(i);"),
         full("struct B { float s; };\nstruct D : B {};\n",
              "D d; d.s = 2.0f;\nthread B* b = static_cast<thread B*>(&d);\n"
              "out[i] = b->s * float(i);")),
    Case("typeid",
         full(body="bool same = typeid(i) == typeid(uint);  // <-\n"
                   "out[i] = same ? 2.0f * float(i) : 0.0f;"),
         full(body="bool same = is_same_v<decltype(i), uint>;\n"
                   "out[i] = same ? 2.0f * float(i) : 0.0f;")),
    Case("new-delete",
         full(body="thread float* p = new float[1];  // <-\np[0] = 2.0f;\n"
                   "out[i] = p[0] * float(i);"),
         full(body="float p[1];\np[0] = 2.0f;\nout[i] = p[0] * float(i);")),
    Case("noexcept-operator",
         full(TWICE, "out[i] = noexcept(twice(1.0f)) ? 0.0f : twice(i);  // <-"),
         full("float twice(float v) noexcept { return 2.0f * v; }\n",
              "out[i] = twice(float(i));")),
    Case("goto",
         full(body="float s = 0.0f;\nuint n = 0;\nagain:\ns += float(i);\n"
                   "if (++n < 2) goto again;  // <-\nout[i] = s;"),
         full(body="float s = 0.0f;\nfor (uint n = 0; n < 2; ++n) s += float(i);\n"
                   "out[i] = s;")),
    Case("storage-class",
         full(body="thread_local float scale = 2.0f;  // <-\nout[i] = scale * float(i);"),
         full(body="float scale = 2.0f;\nout[i] = scale * float(i);")),
    Case("virtual",
         full("struct S {\n  virtual float scale() const { return 2.0f; }  // <-\n};\n",
              "S s;\nout[i] = s.scale() * float(i);"),
         full("struct S {\n  float scale() const { return 2.0f; }\n};\n",
              "S s;\nout[i] = s.scale() * float(i);")),
    Case("exceptions",
         full(body="if (i > 64) throw 1;  // <-\nout[i] = 2.0f * float(i);"),
         full(body="if (i > 64) return;\nout[i] = 2.0f * float(i);")),
    Case("main",
         full("float main(float v) { return 2.0f * v; }  // <-\n", "out[i] = main(i);"),
         full(TWICE, "out[i] = twice(float(i));")),
    Case("double",
         full(body="double scale = 2.0;  // <-\nout[i] = float(scale * i);"),
         full(body="float scale = 2.0f;\nout[i] = scale * float(i);")),
    Case("program-scope",
         full("float scale = 2.0f;  // <-\n", "out[i] = scale * float(i);"),
         full("constant float scale = 2.0f;\n", "out[i] = scale * float(i);")),
    Case("constant-initialized",
         full("constant float scale;  // <-\n", "out[i] = scale * float(i);"),
         full("constant float scale = 2.0f;\n", "out[i] = scale * float(i);")),
    Case("threadgroup-variable",
         full("float twice(float v) {\n  threadgroup float scratch[1];  // <-\n"
              "  return 2.0f * v;\n}\n", "out[i] = twice(float(i));"),
         full("float twice(threadgroup float* scratch, float v) {\n  return 2.0f * v;\n}\n",
              "threadgroup float scratch[1];\nout[i] = twice(scratch, float(i));")),
    Case("address-space-conversion",
         full("float first(const device float* p) { return p[0]; }\n",
              "threadgroup float t[8];\nt[i % 8] = 2.0f * float(i);\n"
              "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
              "out[i] = first(t + i % 8);  // <-"),
         full("float first(const threadgroup float* p) { return p[0]; }\n",
              "threadgroup float t[8];\nt[i % 8] = 2.0f * float(i);\n"
              "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
              "out[i] = first(t + i % 8);")),
    Case("member-address-space",
         full("struct S {\n  float v;\n  float twice() const device { return 2.0f * v; }\n"
              "};\n", "threadgroup S shared[8];\nshared[i % 8].v = float(i);\n"
                      "out[i] = shared[i % 8].twice();  // <-"),
         full("struct S {\n  float v;\n  float twice() const threadgroup { return 2.0f * v; }\n"
              "};\n", "threadgroup S shared[8];\nshared[i % 8].v = float(i);\n"
                      "out[i] = shared[i % 8].twice();")),
    Case("kernel-return",
         full(body="out[i] = 2.0f * float(i);\nreturn 0;", returns="int")
         .replace("kernel int k(", "kernel int k(  // <-\n"),
         full()),
    Case("host-name",
         HEAD + "template <typename T>\nkernel void scaled(device T* out [[buffer(0)]], "
                "uint i [[thread_position_in_grid]]) { out[i] = T(2) * T(i); }\n"
                "template [[host_name(\"k\")]] kernel void scaled<float>(device float*, uint);\n"
                "template [[host_name(\"k\")]] kernel void scaled<int>(device int*, uint);"
                "  // <-\n",
         HEAD + "template <typename T>\nkernel void scaled(device T* out [[buffer(0)]], "
                "uint i [[thread_position_in_grid]]) { out[i] = T(2) * T(i); }\n"
                "template [[host_name(\"k\")]] kernel void scaled<float>(device float*, uint);\n"
                "template [[host_name(\"k_int\")]] kernel void scaled<int>(device int*, uint);\n"),
    Case("argument-address-space",
         full(body="out[i] = scale[0] * float(i);", args=", const float* scale [[buffer(1)]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(body="out[i] = scale[0] * float(i);",
              args=", const device float* scale [[buffer(1)]]"), buffers={"scale": SCALE}),
    Case("argument-binding",
         full(body="out[i] = scale * float(i);", args=", device float scale [[buffer(1)]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(body="out[i] = scale * float(i);", args=", constant float& scale [[buffer(1)]]"),
         buffers={"scale": 2.0}),
    Case("argument-index",
         full(body="out[i] = scale[0] * float(i);",
              args=", const device float* scale [[buffer(0)]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(body="out[i] = scale[0] * float(i);",
              args=", const device float* scale [[buffer(1)]]"), buffers={"scale": SCALE}),
    Case("argument-attribute",
         full(args=", uint lane [[thread_index_in_simd_group]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(args=", uint lane [[thread_index_in_simdgroup]]")),
    Case("attribute-type",
         full(args=", float lane [[thread_index_in_simdgroup]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(args=", ushort lane [[thread_index_in_simdgroup]]")),
    Case("argument-type",
         full(args=", size_t lane [[thread_index_in_simdgroup]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full(args=", uint lane [[thread_index_in_simdgroup]]")),
    Case("function-constant-index",
         full("constant bool scaled [[function_constant(0)]];\n"
              "constant bool shifted [[function_constant(0)]];  // <-\n",
              "out[i] = (scaled ? 2.0f : 1.0f) * float(i) + (shifted ? 1.0f : 0.0f);"),
         full("constant bool scaled [[function_constant(0)]];\n"
              "constant bool shifted [[function_constant(1)]];\n",
              "out[i] = (scaled ? 2.0f : 1.0f) * float(i) + (shifted ? 1.0f : 0.0f);"),
         constants={"scaled": True, "shifted": False}),
    Case("function-constant-type",
         full("struct Scale { float s; };\n"
              "constant Scale scale [[function_constant(0)]];  // <-\n",
              "out[i] = scale.s * float(i);"),
         full("constant float scale [[function_constant(0)]];\n", "out[i] = scale * float(i);"),
         constants={"scale": 2.0}),
    Case("function-constant-name",
         full(body="out[i] = 2.0f * float(i);",
              args=", const device float* extra [[buffer(1), function_constant(has_extra)]]")
         .replace("kernel void", MARK + "\nkernel void"),
         full("constant bool has_extra [[function_constant(0)]];\n", "out[i] = 2.0f * float(i);",
              args=", const device float* extra [[buffer(1), function_constant(has_extra)]]"),
         constants={"has_extra": False}),
    Case("threads-per-threadgroup",
         full(attributes="[[max_total_threads_per_threadgroup(2048)]]\n")
         .replace("kernel void", MARK + "\nkernel void"),
         full(attributes="[[max_total_threads_per_threadgroup(256)]]\n")),
]


def marked_line(text: str) -> int:
    """The line `MARK` is on; a mark on a line of its own stands for the next one."""
    lines = text.split("\n")
    k = next(n for n, line in enumerate(lines) if MARK in line)
    return k + (2 if lines[k].strip() == MARK else 1)


def test_every_rule_has_a_case() -> None:
    assert sorted(c.rule for c in CASES) == sorted(RULES)


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rejected(case: Case) -> None:
    lib = mtwork.load_metal(case.bad, msl_version=case.msl_version)
    with pytest.raises(MetalRuleError) as caught:
        lib.kernel(case.kernel).compile()  # function constants left unset
    found = [v for v in caught.value.violations if v.rule == case.rule]
    assert found, str(caught.value)
    assert (found[0].file, found[0].line) == ("source", marked_line(case.bad)), str(found[0])
    section = RULES[case.rule].section
    assert f"source:{found[0].line}" in str(caught.value)
    assert f"{SPEC} §{section}: " in str(caught.value) and f"[{case.rule}]" in str(caught.value)


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_valid_twin(case: Case) -> None:
    lib = mtwork.load_metal(case.good, msl_version=case.msl_version)
    kernel = lib.kernel(case.kernel, constants=case.constants)
    out = kernel(buffers={"out": np.zeros(8, np.float32), **case.buffers}, grid=(8,),
                 threads_per_threadgroup=(8,))["out"]
    np.testing.assert_array_equal(out, [case.expect(i) for i in range(8)])


def test_the_rules_page_lists_every_rule_with_its_section_and_test() -> None:
    page = (Path(__file__).parents[1] / "docs" / "msl-rules.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| ([\d.]+) \|", page, flags=re.M))
    assert rows == {r.id: r.section for r in RULES.values()}
    assert "test_rejected[<rule>]" in page and "test_valid_twin[<rule>]" in page
    # Each row names the rule's two tests (cases of this file) and its status.
    cases = {c.rule for c in CASES}
    named = re.findall(r"^\| `([a-z-]+)` \| [\d.]+ \| [^|]+ \| ([^|]+) \| ([^|]+) \|$",
                       page, flags=re.M)
    assert len(named) == len(RULES)
    for rule, tests, status in named:
        assert f"`test_rejected[{rule}]`" in tests and f"`test_valid_twin[{rule}]`" in tests, rule
        assert rule in cases and status.strip() == "enforced, tested", rule


# --- the issue's examples, in the body form ------------------------------------------


def body_kernel(source: str, header: str = "", **kwargs) -> mtwork.MetalKernel:
    return mtwork.metal_kernel("rules", ["a"], ["out"], source, header=header, **kwargs)


def run(kernel: mtwork.MetalKernel) -> np.ndarray:
    import mlx.core as mx
    return np.array(kernel(inputs=[mx.arange(16, dtype=mx.float32)], output_shapes=[(16,)],
                           output_dtypes=[mx.float32], grid=(16, 1, 1),
                           threadgroup=(16, 1, 1))[0])


ISSUE_EXAMPLES = [
    ("double", "", "double d = a[0];\nout[0] = float(d);", "source", 1),
    ("double", "", "long double d = a[0];\nout[0] = float(d);", "source", 1),
    ("new-delete", "", "thread float* p = new float[2];\nout[0] = p[0];", "source", 1),
    ("goto", "", "goto end;\nend:\nout[0] = a[0];", "source", 1),
    ("storage-class", "", "thread_local float t = a[0];\nout[0] = t;", "source", 1),
    ("virtual", "struct S { virtual float f() { return 1.0f; } };", "out[0] = a[0];",
     "header", 1),
    ("address-space-conversion", "float first(const device float* p) { return p[0]; }",
     "threadgroup float t[16];\nt[0] = a[0];\nout[0] = first(t);", "source", 3),
    ("address-space-conversion", "",
     "device float* d = (device float*)out;\nthreadgroup float* t = (threadgroup float*)d;\n"
     "out[0] = t[0];", "source", 2),
    ("program-scope", "float scale = 2.0f;", "out[0] = a[0] * scale;", "header", 1),
    ("program-scope", "device float scale;", "out[0] = a[0];", "header", 1),
]


@pytest.mark.parametrize(("rule", "header", "source", "where", "line"), ISSUE_EXAMPLES,
                         ids=[f"{r}-{k}" for k, (r, *_) in enumerate(ISSUE_EXAMPLES)])
def test_what_compiled_on_sim_before_is_refused_at_the_authors_line(rule, header, source,
                                                                    where, line) -> None:
    with pytest.raises(MetalRuleError) as caught:
        run(body_kernel(source, header))
    found = [v for v in caught.value.violations if v.rule == rule]
    assert found and (found[0].file, found[0].line) == (where, line), str(caught.value)


def test_a_double_is_reported_as_apple_words_it() -> None:
    with pytest.raises(MetalRuleError, match=r"source:1:1: error: MSL 3\.2 §2\.1: double is "
                                             r"not a Metal type"):
        run(body_kernel("double d = a[0];\nout[thread_position_in_grid.x] = float(d);"))


@pytest.mark.parametrize("pointer", ["float* x", "thread float* x"])
def test_a_kernel_pointer_argument_needs_an_address_space(pointer: str) -> None:
    lib = mtwork.load_metal(full(args=f", {pointer} [[buffer(1)]]"))
    with pytest.raises(MetalRuleError, match=r"argument `x` .* device, constant or "
                                             r"threadgroup \[argument-address-space\]"):
        lib.kernel("k")


def test_two_arguments_on_one_buffer_index_are_a_rule_not_an_internal_error() -> None:
    lib = mtwork.load_metal(full(args=", device float* other [[buffer(0)]]"))
    with pytest.raises(MetalRuleError, match=r"arguments `out` and `other` both have "
                                             r"\[\[buffer\(0\)\]\]"):
        lib.kernel("k")(buffers={0: np.zeros(8, np.float32)}, grid=(8,),
                        threads_per_threadgroup=(8,))


def test_lambdas_and_derived_structs_compile_from_msl_3_2() -> None:
    # MLX's Metal 4 kernels use both; Apple's compiler takes them.
    kernel = body_kernel("auto twice = [](float v) { return 2.0f * v; };\n"
                         "Derived d;\nd.s = 1.0f;\n"
                         "out[thread_position_in_grid.x] = twice(a[thread_position_in_grid.x]) "
                         "* d.s;",
                         header="struct Base { float s; };\nstruct Derived : Base {};")
    np.testing.assert_array_equal(run(kernel), 2.0 * np.arange(16))


def test_the_editor_shows_a_broken_rule_at_its_line() -> None:
    from mtwork.editor.diagnostics import parse_diagnostics

    with pytest.raises(MetalRuleError) as caught:
        run(body_kernel("float x = a[0];\nlong double d = x;\nout[0] = float(d);",
                        header="float scale = 2.0f;"))
    found = {(d.file, d.line, d.severity) for d in parse_diagnostics(caught.value.message)}
    assert found == {("source", 2, "error"), ("header", 1, "error")}


def test_a_sweep_records_the_configuration_that_breaks_a_rule() -> None:
    import mlx.core as mx

    from mtwork.kernel import Launch
    from mtwork.sweep import sweep

    kernel = body_kernel("ACC acc = ACC(a[thread_position_in_grid.x]);\n"
                         "out[thread_position_in_grid.x] = float(acc * ACC(2));")

    def build(config) -> Launch:
        return Launch(kernel, grid=(16, 1, 1), threadgroup=(16, 1, 1),
                      output_shapes=[(16,)], output_dtypes=[mx.float32],
                      defines={"ACC": config["acc"]})

    result = sweep(build, {"acc": ["float", "double"]},
                   inputs=[mx.arange(16, dtype=mx.float32)],
                   oracle=lambda a, config: 2.0 * np.asarray(a, np.float64), rounds=1,
                   progress=False)
    records = {r.config["acc"]: r for r in result.records}
    assert records["float"].status == "ok"
    assert records["double"].status == "compile_error"
    assert "MSL 3.2 §2.1" in records["double"].message and "[double]" in records["double"].message
