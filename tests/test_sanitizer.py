"""The planted-bug corpus: small kernels with one known defect each, and clean twins.

Every defect must be found with the right kind and place; no clean twin may produce a
finding (the sanitizer's false-positive check)."""

import warnings

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.sanitizer import SanitizerError
from tests.helpers.planted import CALL, N, sanitize

# (name, defective body, clean twin, expected kind, where, access, line in the body)
CORPUS = [
    ("read past the end",
     "uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1];",
     "uint i = thread_position_in_grid.x;\nout[i] = inp[min(i + 1, 63u)];",
     "out-of-bounds access", "inp", "read", 2),
    ("write past the end",
     "uint i = thread_position_in_grid.x;\nout[i] = 0;\nif (i == 63) out[i + 3] = 1;",
     "uint i = thread_position_in_grid.x;\nout[i] = 0;\nif (i == 63) out[i] = 1;",
     "out-of-bounds access", "out", "write", 3),
    ("read before the start",
     "int i = int(thread_position_in_grid.x);\nout[i] = inp[i - 2];",
     "int i = int(thread_position_in_grid.x);\nout[i] = inp[max(i - 2, 0)];",
     "out-of-bounds access", "inp", "read", 2),
    ("write to an input",
     "uint i = thread_position_in_grid.x;\n((device float*)inp)[i] = 0;\nout[i] = 1;",
     "uint i = thread_position_in_grid.x;\nout[i] = 1;",
     "write to an input buffer", "inp", "write", 2),
    ("missing barrier between write and read",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = inp[thread_position_in_grid.x];\n"
     "out[thread_position_in_grid.x] = buf[31 - t];",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = inp[thread_position_in_grid.x];\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[31 - t];",
     "threadgroup memory race", "buf", None, None),
    ("two writers of one element",
     "threadgroup float buf[4];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t % 4] = float(t);\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[t % 4];",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = float(t);\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[t];",
     "threadgroup memory race", "buf", "write", 3),
    ("lanes of a SIMD-group without simdgroup_barrier",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = inp[t];\nout[thread_position_in_grid.x] = buf[t ^ 1];",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = inp[t];\nsimdgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[t ^ 1];",
     "threadgroup memory race", "buf", None, None),
    ("plain increment of a shared counter",
     "threadgroup int count[1];\nif (thread_position_in_threadgroup.x == 0) count[0] = 0;\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\ncount[0] += 1;\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = float(count[0]);",
     "threadgroup atomic_int count[1];\nif (thread_position_in_threadgroup.x == 0)\n"
     "  atomic_store_explicit(&count[0], 0, memory_order_relaxed);\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "atomic_fetch_add_explicit(&count[0], 1, memory_order_relaxed);\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = float(atomic_load_explicit(&count[0], "
     "memory_order_relaxed));",
     "threadgroup memory race", "count", None, 4),
    ("read of threadgroup memory never written",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "if (t < 16) buf[t] = 1;\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[t];",
     "threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
     "buf[t] = 1;\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "out[thread_position_in_grid.x] = buf[t];",
     "read of uninitialized threadgroup memory", "buf", "read", 5),
    ("output never written",
     "uint i = thread_position_in_grid.x;\nif (i != 17) out[i] = 1;",
     "uint i = thread_position_in_grid.x;\nout[i] = 1;",
     "output never written", "out", None, None),
    ("early return before a barrier",
     "if (thread_position_in_threadgroup.x == 7) return;\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\nout[thread_position_in_grid.x] = 1;",
     "if (thread_position_in_threadgroup.x != 7) out[thread_position_in_grid.x] = 1;\n"
     "else out[thread_position_in_grid.x] = 2;\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);",
     "barrier divergence", None, None, 2),
    ("threads at different barriers",
     "if (thread_position_in_threadgroup.x < 8) {\n"
     "  threadgroup_barrier(mem_flags::mem_threadgroup);\n} else {\n"
     "  threadgroup_barrier(mem_flags::mem_device);\n}\nout[thread_position_in_grid.x] = 1;",
     "threadgroup_barrier(mem_flags::mem_threadgroup);\nout[thread_position_in_grid.x] = 1;",
     "barrier divergence", None, None, None),
    ("SIMD function in divergent branches",
     "uint lane = thread_index_in_simdgroup;\nfloat v = inp[thread_position_in_grid.x];\n"
     "if (lane < 16) v = simd_sum(v);\nelse v = simd_max(v);\n"
     "out[thread_position_in_grid.x] = v;",
     "uint lane = thread_index_in_simdgroup;\nfloat v = inp[thread_position_in_grid.x];\n"
     "float s = simd_sum(v);\nfloat m = simd_max(v);\n"
     "out[thread_position_in_grid.x] = lane < 16 ? s : m;",
     "SIMD divergence", None, None, None),
    ("threadgroup memory over 32 KiB",
     "threadgroup float big[8200];\nbig[thread_position_in_threadgroup.x] = 1;\n"
     "out[thread_position_in_grid.x] = big[thread_position_in_threadgroup.x];",
     "threadgroup float big[8000];\nbig[thread_position_in_threadgroup.x] = 1;\n"
     "out[thread_position_in_grid.x] = big[thread_position_in_threadgroup.x];",
     "threadgroup memory over budget", None, None, None),
]


@pytest.mark.parametrize("name, bad, clean, kind, where, access, line", CORPUS,
                         ids=[c[0] for c in CORPUS])
def test_defect_is_found_with_kind_and_place(name, bad, clean, kind, where, access, line):
    report = sanitize(bad)
    found = report.of_kind(kind)
    assert found, f"{name}: expected {kind}, got:\n{report}"
    first = found[0]
    if where is not None:
        assert first.where == where, str(report)
    if access is not None:
        assert first.access == access, str(report)
    if line is not None:
        assert first.line == f"source:{line}", str(report)
    assert str(report).endswith(f"{report.errors} error{'s' if report.errors != 1 else ''}")


@pytest.mark.parametrize("name, bad, clean, kind, where, access, line", CORPUS,
                         ids=[c[0] for c in CORPUS])
def test_clean_twin_has_no_finding(name, bad, clean, kind, where, access, line):
    report = sanitize(clean)
    assert report.ok, f"{name} (clean twin) was reported:\n{report}"


def test_out_of_bounds_names_element_and_thread():
    report = sanitize("uint i = thread_position_in_grid.x;\nfloat v = inp[i];\n"
                      "if (i == 45) v += inp[100];\nout[i] = v;")
    (finding,) = report.findings
    assert (finding.element, finding.thread, finding.threadgroup) == (100, (13, 0, 0), (1, 0, 0))


def test_race_names_both_threads():
    report = sanitize("threadgroup float buf[32];\nuint t = thread_position_in_threadgroup.x;\n"
                      "buf[t] = 1;\nthreadgroup_barrier(mem_flags::mem_threadgroup);\n"
                      "if (t == 3) buf[9] = 2;\nout[thread_position_in_grid.x] = buf[9];",
                      )
    races = report.of_kind("threadgroup memory race")
    assert races and races[0].element == 9
    assert {races[0].thread, races[0].other_thread} >= {(3, 0, 0)}


def test_more_than_1024_threads_is_rejected_before_running():
    with pytest.raises(ValueError, match="1024"):
        sanitize("out[0] = 1;", call=dict(threadgroup=(64, 32, 1)))


def test_init_value_means_outputs_need_not_be_written():
    assert sanitize("uint i = thread_position_in_grid.x;\nif (i != 17) out[i] = 1;",
                    init_value=0.0).ok


def test_warn_mode_returns_outputs_and_warns():
    kernel = mtwork.metal_kernel("warned", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1];")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kernel(inputs=[mx.arange(N, dtype=mx.float32)], sanitize="warn", **CALL)[0]
    assert any("out-of-bounds" in str(w.message) for w in caught)
    np.testing.assert_array_equal(np.array(out)[:-1], np.arange(1, N, dtype=np.float32))


def test_environment_variable_turns_sanitizing_on(monkeypatch):
    monkeypatch.setenv("MTWORK_SANITIZE", "1")
    kernel = mtwork.metal_kernel("by_env", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1];")
    with pytest.raises(SanitizerError, match="out-of-bounds"):
        kernel(inputs=[mx.arange(N, dtype=mx.float32)], **CALL)


def test_a_faulty_kernel_reports_and_the_next_call_works():
    bad = mtwork.metal_kernel("segv", ["inp"], ["out"],
                              "device float* p = (device float*)0x40;\nout[0] = p[0];")
    with pytest.raises(mtwork.KernelFault):
        mx.eval(bad(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                    output_shapes=[(1,)], output_dtypes=[mx.float32]))
    good = mtwork.metal_kernel("after", ["inp"], ["out"], "out[0] = inp[0] + 1;")
    out = good(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32])[0]
    assert out.item() == 1.0
