"""The self-test's checks of the emulator's own machinery, where machines differ most:
a write far past a buffer caught by its guard page (page sizes, the signal a system
raises, the signal context), the sanitizer's finding named at the author's line (the
loaded image's code offsets, a symbolizer reading debug information), and the profiler's
counts with their source lines. Each is a (what, result, passed) row of the checks."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from ..errors import KernelFault
from ..kernel import metal_kernel

__all__ = ["emulator_checks"]

_N = 64


def _fault_isolation() -> str:
    # 256 KiB past a 256-byte output: its page of slack, then its guard page, on pages of
    # 4, 16 or 64 KiB.
    wild = metal_kernel("selftest_far_past", ["a"], ["out"],
                        "for (uint j = 0; j < 65536; ++j) out[j] = a[0];")
    try:  # evaluated here: a call is an operation of MLX's graph, run when evaluated
        mx.eval(wild(inputs=[mx.ones((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                     output_shapes=[(_N,)], output_dtypes=[mx.float32], backend="sim"))
    except KernelFault as fault:
        if "invalid memory access" not in fault.detail:
            raise AssertionError(f"a fault, but not named a memory access: "
                                 f"{fault.detail}") from None
    else:
        raise AssertionError("a write 256 KiB past an output was not caught")
    good = metal_kernel("selftest_after_fault", ["a"], ["out"],
                        "out[thread_position_in_grid.x] = a[thread_position_in_grid.x] + 1;")
    out = good(inputs=[mx.arange(_N, dtype=mx.float32)], grid=(_N, 1, 1),
               threadgroup=(_N, 1, 1), output_shapes=[(_N,)], output_dtypes=[mx.float32],
               backend="sim")[0]
    if not np.array_equal(np.array(out), np.arange(1, _N + 1)):
        raise AssertionError("the kernel run after the fault gave wrong values")
    return "a write past a guard page faults; the next kernel runs"


def _sanitizer() -> str:
    kernel = metal_kernel("selftest_read_past", ["inp"], ["out"],
                          "uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1];")
    kernel(inputs=[mx.arange(_N, dtype=mx.float32)], grid=(_N, 1, 1), threadgroup=(32, 1, 1),
           output_shapes=[(_N,)], output_dtypes=[mx.float32], sanitize="report")
    report = kernel.last_sanitizer_report
    found = [(f.kind, f.where, f.element) for f in report.findings] if report else []
    wanted = ("out-of-bounds access", "inp", _N)
    if found != [wanted]:
        raise AssertionError(f"expected one finding {wanted}, got {found}")
    line = report.findings[0].line  # type: ignore[union-attr]
    if line == "source:2":
        return "a read one past an input found at its line (source:2)"
    if not line:  # the finding stands; only its line is missing (docs/platforms.md)
        return ("a read one past an input found, WITHOUT its source line: no symbolizer "
                "read the kernel's debug information (llvm-symbolizer or addr2line)")
    raise AssertionError(f"the finding is named at {line}, not at source:2")


def _profiler() -> str:
    kernel = metal_kernel("selftest_counted", ["inp"], ["out"],
                          "uint i = thread_position_in_grid.x;\nout[i] = inp[i] * 2.0f;")
    kernel(inputs=[mx.arange(_N, dtype=mx.float32)], grid=(_N, 1, 1), threadgroup=(32, 1, 1),
           output_shapes=[(_N,)], output_dtypes=[mx.float32], profile=True)
    counters = kernel.last_counters
    if counters is None or counters.simd_issues <= 0:
        raise AssertionError(f"no counts came back: {counters}")
    lines = "by source line" if counters.source_lines else (
        "WITHOUT source lines: no symbolizer read the kernel's debug information")
    return f"{counters.simd_issues} SIMD-group issues counted, {lines}"


def emulator_checks(check: Callable[[str, Callable[[], str]], tuple[str, str, bool]]
                    ) -> list[tuple[str, str, bool]]:
    """The checks above, each run through `check` (which turns an exception into a
    failed row)."""
    return [check("fault isolation", _fault_isolation), check("sanitizer", _sanitizer),
            check("profiler", _profiler)]
