"""The `metal` backend: hands the kernel to `mx.fast.metal_kernel` unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx


def run_body_kernel(
    *,
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str,
    ensure_row_contiguous: bool,
    atomic_outputs: bool,
    compile_options: dict[str, Any] | None,
    call: dict[str, Any],
) -> list[mx.array]:
    options = {} if compile_options is None else {"compile_options": compile_options}
    kernel = mx.fast.metal_kernel(
        name=name,
        input_names=list(input_names),
        output_names=list(output_names),
        source=source,
        header=header,
        ensure_row_contiguous=ensure_row_contiguous,
        atomic_outputs=atomic_outputs,
        **options,
    )
    outputs = kernel(**call)
    mx.eval(outputs)
    return list(outputs)
