"""Planted subscripts outside an array's bounds, for arrays whose size the compiler knows:
thread-private arrays (which the GPU tolerates, reading or overwriting the thread's own
scratch), their rows, struct members, threadgroup arrays; each with a clean twin."""

import pytest

from tests.helpers.planted import Planted, assert_clean, assert_found

KIND = "array index out of bounds"
FILL = "uint i = thread_position_in_grid.x;\nfloat a[8];\n" \
       "for (int j = 0; j < 8; ++j) a[j] = inp[(i + j) % 64];\n"

CORPUS = [
    Planted("private array one past its end",
            FILL + "out[i] = a[i % 9];", FILL + "out[i] = a[i % 8];",
            KIND, "a", line="source:4"),
    Planted("private array below its start",
            FILL + "out[i] = a[int(i % 8) - 1];", FILL + "out[i] = a[max(int(i % 8) - 1, 0)];",
            KIND, "a", line="source:4"),
    Planted("row of a two-dimensional private array past its end",
            "uint i = thread_position_in_grid.x;\nfloat m[4][4];\n"
            "for (int r = 0; r < 4; ++r) for (int c = 0; c < 4; ++c) m[r][c] = inp[r * 4 + c];\n"
            "out[i] = m[i % 4][i % 5];",
            "uint i = thread_position_in_grid.x;\nfloat m[4][4];\n"
            "for (int r = 0; r < 4; ++r) for (int c = 0; c < 4; ++c) m[r][c] = inp[r * 4 + c];\n"
            "out[i] = m[i % 4][i % 4];",
            KIND, "m", line="source:4"),
    Planted("array member of a struct past its end",
            "uint i = thread_position_in_grid.x;\nFrag f;\n"
            "for (int j = 0; j < 4; ++j) f.v[j] = inp[j];\nout[i] = f.v[i % 5];",
            "uint i = thread_position_in_grid.x;\nFrag f;\n"
            "for (int j = 0; j < 4; ++j) f.v[j] = inp[j];\nout[i] = f.v[i % 4];",
            KIND, "f.v", line="source:4", header="struct Frag { float v[4]; };\n"),
    Planted("threadgroup array past its end",
            "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
            "buf[t] = inp[t];\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "out[thread_position_in_grid.x] = buf[t + 1];",
            "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
            "buf[t] = inp[t];\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "out[thread_position_in_grid.x] = buf[(t + 1) % 32];",
            KIND, "buf", line="source:5"),
]


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_defect_is_found_with_kind_and_place(case):
    assert_found(case)


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_clean_twin_has_no_finding(case):
    assert_clean(case)


@pytest.mark.parametrize(("case", "element", "detail"), [
    (CORPUS[0], 8, "thread-private array of type 'float[8]'"),
    (CORPUS[1], -1, "thread-private array of type 'float[8]'"),
    (CORPUS[2], 4, "thread-private array of type 'float[4]'"),
    (CORPUS[4], 32, "threadgroup array of type 'float[32]'"),
], ids=["past the end", "below the start", "a row", "threadgroup"])
def test_the_finding_names_the_index_and_the_array_type(case, element, detail):
    finding = assert_found(case)
    assert (finding.element, finding.detail) == (element, detail)
