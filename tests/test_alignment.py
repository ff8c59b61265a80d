"""Bound memory in place, or on an aligned copy: in-process, an mx array's data (8 bytes past
a 16-byte boundary on MLX's CPU allocator) is used where it is unless the program declares
an aligned type, which the compiled code then assumes of the pointers that reach it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.compile import compiler
from mtwork.backends.sim.run import memory
from mtwork.backends.sim.run.arena import guarded
from mtwork.msl import body
from mtwork.msl.alignment import declares_alignment

ROWS = 4096
ROW_COPY = "((device Row*)out)[i].v = ((device const Row*)inp)[i].v * 2.0f;"


def misaligned_input() -> mx.array:
    x = mx.arange(ROWS * 4, dtype=mx.float32)
    assert np.array(x, copy=False).ctypes.data % 16 != 0, "MLX's allocator changed"
    return x


def rows_kernel(declaration: str) -> mtwork.MetalKernel:
    return mtwork.metal_kernel(
        "alignment_rows", ["inp"], ["out"],
        f"uint i = thread_position_in_grid.x; {ROW_COPY}",
        header=f"struct {declaration} Row {{ float4 v; }};\n", backend="sim")


def run_rows(kernel: mtwork.MetalKernel, x: mx.array) -> np.ndarray:
    (out,) = kernel(inputs=[x], grid=(ROWS, 1, 1), threadgroup=(64, 1, 1),
                    output_shapes=[(ROWS * 4,)], output_dtypes=[mx.float32], isolate=False)
    return np.array(out)


@pytest.mark.parametrize("declaration", ["", "alignas(16)"])
def test_vector_rows_of_misaligned_memory(declaration: str) -> None:
    """float4 rows read and written through pointers to misaligned memory: in place
    (the compiled code assumes 4-byte alignment), or, for a type declared 16-aligned,
    on an aligned copy (an aligned vector move of the caller's memory would fault)."""
    got = run_rows(rows_kernel(declaration), misaligned_input())
    np.testing.assert_array_equal(got, np.arange(ROWS * 4, dtype=np.float64) * 2.0)


def test_in_place_unless_aligned_type_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory made for a call: the fresh output alone, or the output and a copy."""
    made: list[int] = []

    def spy(spans: tuple[int, ...], *, guard: bool) -> list[np.ndarray]:
        made.append(len(spans))
        return guarded(spans, guard=guard)

    monkeypatch.setattr(memory, "guarded", spy)
    x = misaligned_input()
    run_rows(rows_kernel(""), x)
    run_rows(rows_kernel("alignas(16)"), x)
    assert made == [1, 2]


def test_declared_alignment_found_in_text_and_includes() -> None:
    plain = "kernel void f(device float* x) { x[0] = 1; }"
    assert not declares_alignment((body.PRELUDE, plain), None, ())
    assert declares_alignment(("struct __attribute__((aligned(32))) T { float a; };",), None, ())
    assert declares_alignment(("struct alignas(8) T { float a; };",), None, ())
    assert not declares_alignment(("void gemm_loop_aligned(int k);",), None, ())
    # MLX's steel GEMM loader reads rows as an alignas struct, two includes down.
    steel = '#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"'
    assert declares_alignment((steel,), None, ())
    # An include that cannot be found may declare anything.
    assert declares_alignment(('#include "not_here.h"',), None, ())
    assert not declares_alignment(("#include <metal_stdlib>",), None, ())


def test_shim_declares_no_alignment() -> None:
    """`declares_alignment` takes the Metal standard library as declaring none: the shim's
    headers must not."""
    headers = [p for p in compiler.SHIM_DIR.rglob("*") if p.is_file()]
    assert len(headers) > 20
    for header in headers:
        assert not declares_alignment((header.read_text(errors="replace"),), header.parent,
                                      ()), header.name
