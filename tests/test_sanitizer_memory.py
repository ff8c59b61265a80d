"""Planted bugs in memory the tracing of loads and stores alone does not see: copies and
fills (which clang turns into memcpy and memset), vector accesses that run past a
buffer's end, atomics, strided views; each with a clean twin that must give no finding."""

import mlx.core as mx
import numpy as np
import pytest

from tests.helpers.planted import Planted, assert_clean, assert_found, sanitize

PAIR = "struct Pair { float v[8]; };\n"  # 32 bytes: copied with memcpy, not loads and stores
ATOMIC = dict(atomic_outputs=True)
STATE = ("uint i = thread_position_in_grid.x;\nfloat s[16];\n"
         "for (int j = 0; j < 16; ++j) s[j] = inp[(i + j) % 64] * 0.5f;\n")

CORPUS = [
    Planted("float4 written past the end of an output",
            "uint i = thread_position_in_grid.x;\n((device float4*)out)[i] = float4(1.0f);",
            "uint i = thread_position_in_grid.x;\n"
            "if (i < 15) ((device float4*)out)[i] = float4(1.0f);\n"
            "else { out[60] = 1.0f; out[61] = 1.0f; }",
            "out-of-bounds access", "out", "write", "source:2",
            call=dict(grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(62,)])),
    Planted("struct copies fill half of a threadgroup array",
            "threadgroup Pair tile[8];\nuint t = thread_position_in_threadgroup.x;\n"
            "if (t < 4) tile[t] = ((const device Pair*)inp)[t];\n"
            "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "Pair p = tile[t % 8];\nout[thread_position_in_grid.x] = p.v[0] + p.v[7];",
            "threadgroup Pair tile[8];\nuint t = thread_position_in_threadgroup.x;\n"
            "if (t < 8) tile[t] = ((const device Pair*)inp)[t];\n"
            "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "Pair p = tile[t % 8];\nout[thread_position_in_grid.x] = p.v[0] + p.v[7];",
            "read of uninitialized threadgroup memory", "tile", "read", header=PAIR),
    Planted("two threads copy a struct into one threadgroup slot",
            "threadgroup Pair slot[1];\nslot[0] = ((const device Pair*)inp)[0];\n"
            "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "out[thread_position_in_grid.x] = slot[0].v[3];",
            "threadgroup Pair slot[1];\n"
            "if (thread_position_in_threadgroup.x == 0) slot[0] = ((const device Pair*)inp)[0];\n"
            "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "out[thread_position_in_grid.x] = slot[0].v[3];",
            "threadgroup memory race", "slot", "write", "source:2", header=PAIR),
    Planted("zero-fill loop past the end of an output",
            "uint i = thread_position_in_grid.x;\n"
            "for (int j = 0; j < 9; ++j) out[i * 8 + j] = 0.0f;",
            "uint i = thread_position_in_grid.x;\n"
            "for (int j = 0; j < 8; ++j) out[i * 8 + j] = 0.0f;",
            "out-of-bounds access", "out", "write", "source:2",
            call=dict(grid=(8, 1, 1), threadgroup=(8, 1, 1))),
    Planted("private array filled from past the end of an input",
            "uint i = thread_position_in_grid.x;\nfloat row[8];\n"
            "for (int j = 0; j < 8; ++j) row[j] = inp[i * 8 + j + 1];\n"
            "for (int j = 0; j < 8; ++j) out[i * 8 + j] = row[j];",
            "uint i = thread_position_in_grid.x;\nfloat row[8];\n"
            "for (int j = 0; j < 8; ++j) row[j] = inp[i * 8 + j];\n"
            "for (int j = 0; j < 8; ++j) out[i * 8 + j] = row[j];",
            "out-of-bounds access", "inp", "read", "source:3",
            call=dict(grid=(8, 1, 1), threadgroup=(8, 1, 1))),
    # Gated DeltaNet's packed kernel keeps its state in a private array and stores it back
    # in a loop, which clang turns into one memcpy: seen only when copies are checked.
    Planted("private state stored back one element short",
            STATE + "for (int j = 0; j < 15; ++j) out[i * 16 + j] = s[j];",
            STATE + "for (int j = 0; j < 16; ++j) out[i * 16 + j] = s[j];",
            "output never written", "out", call=dict(output_shapes=[(16 * 64,)])),
    Planted("atomic add past the end of an output",
            "atomic_fetch_add_explicit(&out[thread_position_in_grid.x + 1], 1.0f, "
            "memory_order_relaxed);",
            "atomic_fetch_add_explicit(&out[thread_position_in_grid.x], 1.0f, "
            "memory_order_relaxed);",
            "out-of-bounds access", "out", None, "source:1",  # a float add: load, then swap
            options=dict(**ATOMIC, init_value=0.0)),
    Planted("atomic exchanges skip an element",
            "uint i = thread_position_in_grid.x;\n"
            "if (i != 17) atomic_exchange_explicit(&out[i], 1.0f, memory_order_relaxed);",
            "uint i = thread_position_in_grid.x;\n"
            "atomic_exchange_explicit(&out[i], 1.0f, memory_order_relaxed);",
            "output never written", "out", options=ATOMIC),
]


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_defect_is_found_with_kind_and_place(case):
    assert_found(case)


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_clean_twin_has_no_finding(case):
    assert_clean(case)


def test_a_vector_past_the_end_names_the_first_element_outside():
    case = CORPUS[0]
    assert assert_found(case).element == 62  # floats 60..63 of a 62-float output


def test_unwritten_elements_left_by_a_copy_are_counted():
    # A struct copy writes 8 of the 9 floats of each group; the ninth stays unwritten.
    report = sanitize("uint i = thread_position_in_grid.x;\nPair p;\n"
                      "for (int j = 0; j < 8; ++j) p.v[j] = inp[j];\n"
                      "*(device Pair*)(out + i * 9) = p;", header=PAIR,
                      call=dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(36,)]))
    (finding,) = report.findings
    assert (finding.kind, finding.element, finding.count) == ("output never written", 8, 4)


def test_the_element_a_store_loop_from_a_private_array_left_unwritten_is_named():
    case = next(c for c in CORPUS if c.name == "private state stored back one element short")
    finding = assert_found(case)
    assert (finding.element, finding.count) == (15, 64)  # the last of each thread's 16


# --- strided views (ensure_row_contiguous=False): bounded by the memory they span -------

VIEWS = {  # 16 elements each
    "every second element": lambda x: x[:32:2],
    "reversed": lambda x: x[:16][::-1],
    "a column": lambda x: x.reshape(16, 8)[:, 3],
}
VIEW_CALL = dict(grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)])


def _view(make):
    view = make(mx.arange(128, dtype=mx.float32))
    mx.eval(view)
    return view


@pytest.mark.parametrize("make", VIEWS.values(), ids=VIEWS.keys())
def test_a_strided_view_read_through_its_strides_gives_no_finding(make):
    view = _view(make)
    report = sanitize("uint i = thread_position_in_grid.x;\nout[i] = inp[i * inp_strides[0]];",
                      call=VIEW_CALL, inputs=[view], ensure_row_contiguous=False)
    assert report.ok, str(report)


@pytest.mark.parametrize("make", VIEWS.values(), ids=VIEWS.keys())
def test_a_read_past_a_strided_view_is_found_at_the_kernels_index(make):
    view = _view(make)
    stride = np.array(view, copy=False).strides[0] // 4
    report = sanitize("uint i = thread_position_in_grid.x;\n"
                      "out[i] = inp[(int(i) + 1) * inp_strides[0]];",
                      call=VIEW_CALL, inputs=[view], ensure_row_contiguous=False)
    (finding,) = report.of_kind("out-of-bounds access")
    # Element 16 * stride from the data pointer: what the kernel indexed.
    assert (finding.where, finding.element, finding.line) == ("inp", 16 * stride, "source:2")


def test_a_read_past_the_shape_helper_is_reported_on_the_shape_helper():
    # MLX's helpers are buffers of their own: a loop that reads one element too many of
    # `inp_shape` reads past it, not past `inp`.
    report = sanitize("int total = 1;\n"
                      "for (int d = 0; d <= inp_ndim; ++d) total *= inp_shape[d];\n"
                      "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] + total;",
                      ensure_row_contiguous=False)
    found = report.of_kind("out-of-bounds access")
    assert found and (found[0].where, found[0].element, found[0].access) == \
        ("inp_shape", 1, "read"), str(report)
