"""Every finding names the author's line; a finding inside a helper (the author's header,
MLX's headers, the shim standing in for Metal's library) names the call site in the
author's code too, inlined or not."""

import mlx.core as mx
import pytest

import mtwork
from tests.helpers.planted import N, sanitize

READ_PAST = "inline float fetch(const device float* p, uint i) {\n  return p[i + 1];\n}\n"
PICK = "inline float pick(thread const float (&a)[8], uint k) {\n  return a[k];\n}\n"


def _only(report, kind):
    (finding,) = report.of_kind(kind)
    return finding


def test_a_helper_in_the_header_names_its_line_and_the_call_site():
    report = sanitize("uint i = thread_position_in_grid.x;\nout[i] = fetch(inp, i);",
                      header=READ_PAST)
    finding = _only(report, "out-of-bounds access")
    assert (finding.line, finding.called_from) == ("header:2", "source:2")
    assert "at header:2 (called from source:2)" in str(finding)


def test_a_helper_that_is_not_inlined_names_the_call_site():
    header = "__attribute__((noinline))\n" + READ_PAST
    report = sanitize("uint i = thread_position_in_grid.x;\nout[i] = fetch(inp, i);",
                      header=header)
    finding = _only(report, "out-of-bounds access")
    assert (finding.line, finding.called_from) == ("header:3", "source:2")


def test_an_array_subscript_in_a_helper_names_the_array_and_the_call_site():
    report = sanitize("uint i = thread_position_in_grid.x;\nfloat a[8] = {};\n"
                      "a[i % 8] = inp[i];\nout[i] = pick(a, i % 9);", header=PICK)
    finding = _only(report, "array index out of bounds")
    assert (finding.where, finding.element, finding.line, finding.called_from) == (
        "a", 8, "header:2", "source:4")


def test_a_shim_function_is_told_by_the_authors_call():
    # simdgroup_load reads for the whole SIMD-group inside the runtime's collective; the
    # place is the author's call, not the shim's code.
    report = sanitize("simdgroup_float8x8 m;\nsimdgroup_load(m, inp + 40, 8);\n"
                      "simdgroup_store(m, out, 8);\nout[thread_position_in_grid.x] = 1;")
    finding = _only(report, "out-of-bounds access")
    assert (finding.line, finding.called_from) == ("source:2", "")


def test_a_helper_of_mlx_names_its_header_in_mlx_and_the_call_site():
    # MLX's schedule_row_tile (utils.h, in every body-form kernel's prelude) reads an
    # offset per group: 80 groups from a buffer of 64.
    body = ("int row = 0, group = 0;\nshort rows = 0;\n"
            "bool found = schedule_row_tile<8>(inp, 80, 64, 0, thread_index_in_simdgroup, "
            "row, group, rows);\n"
            "out[thread_position_in_grid.x] = float(row + group + rows + found);")
    report = sanitize(body, inputs=[mx.zeros((N,), dtype=mx.int32)],
                      call=dict(grid=(32, 1, 1), output_shapes=[(32,)]))
    found = report.of_kind("out-of-bounds access")
    assert found, str(report)
    for finding in found:  # the group's start and end offsets: two lines of utils.h
        assert finding.line.startswith("mlx/backend/metal/kernels/utils.h:"), str(finding)
        assert finding.called_from == "source:3", str(finding)


def test_a_full_source_kernel_names_its_files(tmp_path):
    (tmp_path / "helper.h").write_text(
        "// the author's header\ninline float fetch(const device float* p, uint i) {\n"
        "  return p[i + 1];\n}\n")
    (tmp_path / "k.metal").write_text(
        '#include <metal_stdlib>\n#include "helper.h"\nusing namespace metal;\n\n'
        "kernel void k(const device float* inp [[buffer(0)]], device float* out [[buffer(1)]],\n"
        "              uint i [[thread_position_in_grid]]) {\n  out[i] = fetch(inp, i);\n}\n")
    kernel = mtwork.load_metal(tmp_path / "k.metal").kernel("k")
    with pytest.raises(mtwork.SanitizerError) as caught:
        kernel(buffers={"inp": mx.arange(N, dtype=mx.float32), "out": mtwork.new_buffer((N,))},
               grid=(N,), threads_per_threadgroup=(32,), sanitize=True)
    finding = _only(caught.value.report, "out-of-bounds access")
    assert (finding.line, finding.called_from) == (f"{tmp_path / 'helper.h'}:3",
                                                   f"{tmp_path / 'k.metal'}:7")


@pytest.mark.parametrize(("body", "line"), [
    ("if (thread_position_in_threadgroup.x == 7) return;\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\nout[thread_position_in_grid.x] = 1;",
     "source:2"),
    ("uint lane = thread_index_in_simdgroup;\nfloat v = inp[thread_position_in_grid.x];\n"
     "if (lane < 16) v = simd_sum(v);\nelse v = simd_max(v);\n"
     "out[thread_position_in_grid.x] = v;", "source:3"),
], ids=["barrier", "SIMD-group function"])
def test_divergence_names_the_authors_call_not_the_shim(body, line):
    report = sanitize(body)
    assert report.findings[0].line == line, str(report)
