"""Planted subscripts outside an array's bounds, for arrays whose size the compiler knows:
thread-private arrays (which the GPU tolerates, reading or overwriting the thread's own
scratch), their rows, struct members, threadgroup arrays; each with a clean twin."""

import pytest

from mtwork.backends.sim.report.places import Place, Places
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
    Planted("write below a private array's start (MLX's layer_norm tail threads)",
            FILL + "int n = int(i % 8) - 2;\nfor (int j = n; j < 8; ++j) a[j] = 1.0f;\n"
                   "out[i] = a[7];",
            FILL + "int n = int(i % 8) - 2;\nfor (int j = max(n, 0); j < 8; ++j) a[j] = 1.0f;\n"
                   "out[i] = a[7];",
            KIND, "a", access="write", line="source:5"),
    Planted("private array read past its end in the author's header",
            FILL + "out[i] = pick(a, int(i % 9));", FILL + "out[i] = pick(a, int(i % 8));",
            KIND, "values", access="read", line="header:1",
            header="float pick(thread float (&values)[8], int k) { return values[k]; }\n"),
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
    (CORPUS[6], 32, "threadgroup array of type 'float[32]'"),
], ids=["past the end", "below the start", "a row", "threadgroup"])
def test_the_finding_names_the_index_and_the_array_type(case, element, detail):
    finding = assert_found(case)
    assert (finding.element, finding.detail) == (element, detail)


def test_reads_and_writes_are_told_apart_and_the_array_named():
    read, write = assert_found(CORPUS[0]), assert_found(CORPUS[4])
    assert (read.where, read.access, write.where, write.access) == ("a", "read", "a", "write")
    assert "write of `a` element -" in str(write)


def test_an_array_in_a_header_that_is_not_the_authors_is_named_too(tmp_path):
    # MLX's headers are compiled from a copy, not the author's files: the place's text is
    # read from the file the frame names.
    header = tmp_path / "layer_norm.h"
    header.write_text("  for (int i = n; i < N; i++) {\n    thread_x[i] = mean;\n"
                      "    total += thread_x[i + 1];\n  }\n")
    places = Places.__new__(Places)
    write = Place("mlx/layer_norm.h:2", False, file=str(header), line=2, column=17)
    read = Place("mlx/layer_norm.h:3", False, file=str(header), line=3, column=14)
    assert places.subscripted([write]) == ("thread_x", "write")
    assert places.subscripted([read]) == ("thread_x", "read")
