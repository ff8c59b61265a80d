"""The conformance recorder and page (report.py): rows add up across runs, the latest row
of a kernel wins, and the page has a table per suite and the unsupported kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mtwork

from . import report


@pytest.fixture
def rows_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MTWORK_CONFORMANCE_DIR", str(tmp_path))
    return tmp_path


def test_rows_render_as_tables_and_unsupported(rows_dir) -> None:
    exact = mtwork.diff(np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32),
                        bitwise=True)
    close = mtwork.diff(np.float32([1.0, 2.0]), np.float32([1.0, 2.0001]))
    report.record(suite="mlx", kernel="copy_v<float32>", source="mlx 0.32.4",
                  reference="astype (CPU)", agreement=exact, compile_s=0.5, status="pass")
    report.record(suite="mlx", kernel="gemv", source="mlx 0.32.4", reference="matmul (CPU)",
                  agreement=close, compile_s=1.25, status="fail")
    report.record(suite="mlx", kernel="gemv", source="mlx 0.32.4", reference="matmul (CPU)",
                  agreement=close, compile_s=1.0, status="pass")  # a later run wins
    report.record_unsupported(suite="llama.cpp", kernel="kernel_mul_mm_nax",
                              source="llama-cpp-python 0.3", error=ValueError("no tensors\nmore"))
    report.record_unsupported(suite="mlx", kernel="gemm_nax", source="mlx 0.32.4",
                              error="CompileError: kernel `gemm_nax` failed to compile:\n"
                                    "In file included from gemm.metal:2:\n"
                                    "nax.h:9:10: error: Metal 4 tensor APIs are not supported\n"
                                    "    9 | #include <MetalPerformancePrimitives/...>")
    rows = report.read_rows(rows_dir)
    assert [(r.suite, r.kernel, r.status) for r in rows if r.kernel != "gemm_nax"] == [
        ("llama.cpp", "kernel_mul_mm_nax", "unsupported"), ("mlx", "copy_v<float32>", "pass"),
        ("mlx", "gemv", "pass")]
    page = report.render(rows, preamble="Intro.")
    assert "## mlx" in page and "2 of 2 kernels agree" in page
    assert "| copy_v<float32> | mlx 0.32.4 | astype (CPU) | bitwise | — | 0.5 s | pass |" in page
    assert "max abs 0.0001" in page and "1.0 s" in page
    assert ("| mlx | gemm_nax | mlx 0.32.4 | `` CompileError: kernel `gemm_nax` failed to "
            "compile: Metal 4 tensor APIs are not supported `` |") in page
    assert "## llama.cpp" not in page  # a suite with nothing run has no table
    assert "| llama.cpp | kernel_mul_mm_nax | llama-cpp-python 0.3 | `ValueError: no tensors` |" \
        in page


def test_rows_that_state_their_agreement_as_text_render_once(rows_dir) -> None:
    # The shorter shape (agreement as one text, no `recorded`) beside a full row of the
    # same kernel under another suite name: the kernel is listed once, the later row, with
    # the reference and compile time it leaves out taken from the earlier one.
    short = {"suite": "llama.cpp", "kernel": "kernel_add", "source": "llama-cpp-python 0.3",
             "reference": "numpy", "agreement": "max abs 0 (atol 0, rtol 0)",
             "compile_s": 0.4, "status": "pass"}
    (rows_dir / "llama_cpp.jsonl").write_text(json.dumps(short) + "\n"
                                              + json.dumps({**short, "kernel": "kernel_mul"})
                                              + "\n")
    report.record(suite="llama-cpp-python", kernel="kernel_add", source="llama-cpp-python 0.3",
                  reference="", agreement=mtwork.diff(np.float32([1]), np.float32([1]),
                                                           bitwise=True), status="pass")
    rows = report.read_rows(rows_dir)
    assert [(r.suite, r.kernel, r.agreement, r.reference, r.compile_s) for r in rows] == [
        ("llama-cpp-python", "kernel_add", "bitwise", "numpy", 0.4),  # filled in from before
        ("llama.cpp", "kernel_mul", "max abs 0 (atol 0, rtol 0)", "numpy", 0.4)]
    page = report.render(rows)
    assert "| kernel_mul | llama-cpp-python 0.3 | numpy | max abs 0 (atol 0, rtol 0) |" in page


def test_bad_rows_are_refused(rows_dir) -> None:
    with pytest.raises(ValueError, match="`status` must be one of pass, fail, unsupported"):
        report.record(suite="mlx", kernel="k", source="s", reference="r", agreement=None,
                      status="ok")
    with pytest.raises(ValueError, match="`suite` names a file"):
        report.record(suite="../x", kernel="k", source="s", reference="r", agreement=None,
                      status="pass")
