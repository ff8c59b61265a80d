"""Metal's address spaces on sim, where C++ for OpenCL's generic space would let them pass:
device and threadgroup memory reaching a `thread` pointer, reference or member function, a
local variable's address taken as `device`, constant memory passed as `thread`. Each is
refused at its line, and its twin that Metal accepts compiles and runs; from MSL 4.1 an
unqualified pointer is generic, as Metal's is."""

from __future__ import annotations

import numpy as np
import pytest

import mtwork
from mtwork.errors import MetalRuleError

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MARK = "// <-"
SCALE = np.array([2.0], np.float32)


def kernel(top: str, body: str, args: str = "") -> str:
    return (f"{HEAD}{top}\nkernel void k(device float* out [[buffer(0)]]{args}, "
            f"uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n")


HELPER = "float first({space}float* p) {{ return p[0]; }}\n"
STRUCT = "struct S {{\n  float v;\n  float get() const {space}{{ return v; }}\n}};\n"
CONSTRUCTOR = ("struct W {{\n  float v;\n  W({space}float& x) : v(2.0f * x) {{}}\n}};\n")
# MLX's utils.h (read from the check's precompiled header) declares `row` thread int&; with
# no groups it is not written.
MLX_UTILS = '#include "mlx/backend/metal/kernels/utils.h"\n'
SCHEDULE = ("int group = 0;\nshort rows = 0;\nbool found = schedule_row_tile<8>("
            "(device const int32_t*)out, 0, 8, 0, i % 32, {row}, group, rows);")
SCHEDULED = "out[i] = 2.0f * float(i) + (found ? 1.0f : 0.0f);"
CONSTANT_STRUCT = ", constant S& s [[buffer(1)]]"

CASES = {
    # name: (rule, bad, good, buffers of the good one)
    "device to an unqualified pointer parameter": (
        "address-space-conversion",
        kernel(HELPER.format(space="const "),
               f"out[i] = 2.0f * float(i);\nout[i] = first(out + i);  {MARK}"),
        kernel(HELPER.format(space="const device "),
               "out[i] = 2.0f * float(i);\nout[i] = first(out + i);"), {}),
    "threadgroup to a thread reference": (
        "address-space-conversion",
        kernel("float twice(thread float& v) { return 2.0f * v; }\n",
               "threadgroup float t[8];\nt[i % 8] = float(i);\n"
               f"out[i] = twice(t[i % 8]);  {MARK}"),
        kernel("float twice(threadgroup float& v) { return 2.0f * v; }\n",
               "threadgroup float t[8];\nt[i % 8] = float(i);\nout[i] = twice(t[i % 8]);"),
        {}),
    "a local variable's address as device": (
        "address-space-conversion",
        kernel("", f"float x = 2.0f * float(i);\ndevice float* p = &x;  {MARK}\nout[i] = *p;"),
        kernel("", "float x = 2.0f * float(i);\nthread float* p = &x;\nout[i] = *p;"), {}),
    "device to thread by a cast": (
        "address-space-conversion",
        kernel("", f"thread float* p = (thread float*)(out + i);  {MARK}\n"
                   "*p = 2.0f * float(i);"),
        kernel("", "device float* p = (device float*)(out + i);\n*p = 2.0f * float(i);"), {}),
    "constant to an unqualified pointer parameter": (
        "address-space-conversion",
        kernel(HELPER.format(space="const "), f"out[i] = first(scale) * float(i);  {MARK}",
               ", constant float* scale [[buffer(1)]]"),
        kernel(HELPER.format(space="constant "), "out[i] = first(scale) * float(i);",
               ", constant float* scale [[buffer(1)]]"), {"scale": SCALE}),
    "device to a thread reference of a constructor": (
        "address-space-conversion",
        kernel(CONSTRUCTOR.format(space="thread "),
               f"out[i] = float(i);\nW w(out[i]);  {MARK}\nout[i] = w.v;"),
        kernel(CONSTRUCTOR.format(space="device "),
               "out[i] = float(i);\nW w(out[i]);\nout[i] = w.v;"), {}),
    "threadgroup to a thread reference of MLX's function": (
        "address-space-conversion",
        MLX_UTILS + kernel("", f"threadgroup int t[8];\n{SCHEDULE.format(row='t[i % 8]')}"
                               f"  {MARK}\n{SCHEDULED}"),
        MLX_UTILS + kernel("", f"int row = 0;\n{SCHEDULE.format(row='row')}\n{SCHEDULED}"),
        {}),
    "an unmarked member function on a device object": (
        "member-address-space",
        kernel(STRUCT.format(space=""),
               "device S* s = reinterpret_cast<device S*>(out + i);\ns->v = float(i);\n"
               f"out[i] = 2.0f * s->get();  {MARK}"),
        kernel(STRUCT.format(space="device "),
               "device S* s = reinterpret_cast<device S*>(out + i);\ns->v = float(i);\n"
               "out[i] = 2.0f * s->get();"), {}),
    "an unmarked member function on a constant object": (
        "member-address-space",
        kernel(STRUCT.format(space=""), f"out[i] = s.get() * float(i);  {MARK}",
               CONSTANT_STRUCT),
        kernel(STRUCT.format(space="constant "), "out[i] = s.get() * float(i);",
               CONSTANT_STRUCT), {"s": SCALE}),
}


def marked_line(text: str) -> int:
    return next(n for n, line in enumerate(text.split("\n"), 1) if MARK in line)


def run(source: str, buffers: dict, msl_version: str | None = None) -> np.ndarray:
    k = mtwork.load_metal(source, msl_version=msl_version).kernel("k")
    return k(buffers={"out": np.zeros(8, np.float32), **buffers}, grid=(8,),
             threads_per_threadgroup=(8,))["out"]


@pytest.mark.parametrize("name", CASES)
def test_refused_at_its_line(name: str) -> None:
    rule, bad, _, buffers = CASES[name]
    with pytest.raises(MetalRuleError) as caught:
        run(bad, buffers)
    found = [v for v in caught.value.violations if v.rule == rule]
    assert found and (found[0].file, found[0].line) == ("source", marked_line(bad)), \
        str(caught.value)


@pytest.mark.parametrize("name", CASES)
def test_its_twin_runs(name: str) -> None:
    _, _, good, buffers = CASES[name]
    np.testing.assert_array_equal(run(good, buffers), 2.0 * np.arange(8))


def test_objects_copy_and_assign_in_every_address_space() -> None:
    # The implicit copy constructor and assignment take any space in Metal (they are not
    # `thread`'s, as an author's unmarked member function is).
    source = kernel(STRUCT.format(space=""),
                    "threadgroup S t[8];\nt[i % 8].v = float(i);\nS a = s;\nS b = t[i % 8];\n"
                    "t[i % 8] = a;\ndevice S* d = reinterpret_cast<device S*>(out + i);\n"
                    "*d = b;\nS c = *d;\nout[i] = a.get() * c.get();", CONSTANT_STRUCT)
    np.testing.assert_array_equal(run(source, {"s": SCALE}), 2.0 * np.arange(8))


def test_metals_own_types_take_every_address_space() -> None:
    source = kernel("", "out[i] = 2.0f * float(i) + 0.0f * (v[0].x + v[0].yz.x + float(b[0]) "
                        "+ dot(v[0], v[0]) + metal::max(float(b[0]), 0.0f));",
                    ", constant float4* v [[buffer(1)]], constant bfloat* b [[buffer(2)]]")
    out = run(source, {"v": np.zeros(4, np.float32), "b": np.zeros(2, np.uint16)})
    np.testing.assert_array_equal(out, 2.0 * np.arange(8))


def test_from_msl_4_1_an_unqualified_pointer_is_generic() -> None:
    rule, bad, _, buffers = CASES["device to an unqualified pointer parameter"]
    np.testing.assert_array_equal(run(bad, buffers, msl_version="4.1"), 2.0 * np.arange(8))
    # Metal's generic space holds device, threadgroup and thread memory, not constant.
    _, constant_bad, _, _ = CASES["constant to an unqualified pointer parameter"]
    with pytest.raises(MetalRuleError, match=r"\[address-space-conversion\]"):
        run(constant_bad, {"scale": SCALE}, msl_version="4.1")


def test_a_kernel_in_the_authors_header_is_checked_when_the_file_only_includes_it(
        tmp_path) -> None:
    rule, bad, _, _ = CASES["device to an unqualified pointer parameter"]
    (tmp_path / "kernels.h").write_text(bad)
    main = tmp_path / "main.metal"
    main.write_text('// the kernels live in the header\n#include "kernels.h"\n')
    with pytest.raises(MetalRuleError) as caught:
        mtwork.load_metal(main).kernel("k").compile()
    found = [v for v in caught.value.violations if v.rule == rule]
    assert found and (found[0].file, found[0].line) == (str(tmp_path / "kernels.h"),
                                                        marked_line(bad)), str(caught.value)


def test_mlx_kernels_named_by_their_headers_spare_the_clang_pass(monkeypatch) -> None:
    # With no code of the author's, no address-space error can be at the author's lines.
    from mtwork.backends.sim.compile import frontend

    def clang_pass(*args, **kwargs):
        raise AssertionError("the address-space pass ran")

    monkeypatch.setattr(frontend, "address_space_violations", clang_pass)
    headers = (f'{MLX_UTILS}#include "mlx/backend/metal/kernels/softmax.h"\n'
               "/* nothing of the author's but includes and comments */\n")
    template = ("float", "float", 4)
    program = mtwork.load_metal(headers).kernel("softmax_single_row",
                                                template=template).program
    assert frontend.violations(program) == ()
    with_code = mtwork.load_metal(headers + "constant float unused = 0.0f;\n").kernel(
        "softmax_single_row", template=template).program
    with pytest.raises(AssertionError, match="address-space pass ran"):
        frontend.violations(with_code)
