"""The self-test's kernels written by others: a few of MLX's own kernels, from the headers
the installed mlx wheel ships (as MLX's `.metal` files instantiate them, with the
geometry of its host code), and one launch of each kernel family in ``kernels/`` when a
checkout's families are found. Each oracle is MLX's CPU operation, or the family's own
float64 reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import mlx.core as mx
import numpy as np

from ..families import family_names, load_family
from ..library import load_metal
from ..library_kernel import Kernel
from ..msl.includes import mlx_include_dir
from ..values import new_buffer
from .corpus import Case

__all__ = ["family_cases", "mlx_cases"]

_KERNELS = "mlx/backend/metal/kernels/"


@cache
def _mlx_kernel(headers: tuple[str, ...], function: str, template: tuple) -> Kernel:
    """An MLX kernel as its `.metal` file makes it: the headers it includes, in order, and
    one instantiation's template arguments."""
    text = "".join(f'#include "{_KERNELS}{h}"\n' for h in headers)
    return load_metal(text, name=f"{headers[-1].removesuffix('.h')}.metal").kernel(
        function, template=template)


def _values(shape: tuple[int, ...], seed: int, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


_N = 1000


def _run_unary_exp(backend: str) -> list[mx.array]:
    # unary.metal's "v_Exp..." (unary_v, float32, N = 1): one thread per element.
    kernel = _mlx_kernel(("utils.h", "unary_ops.h", "unary.h"), "unary_v",
                         (mx.float32, mx.float32, "Exp", 1))
    x = _values((_N,), 1)
    out = kernel(buffers={"in": x, "out": new_buffer((_N,), mx.float32), "size": _N},
                 grid=(_N,), threads_per_threadgroup=(_N,), backend=backend)
    return [out.mx("out")]


def _bf16(seed: int) -> mx.array:
    return mx.array(_values((_N,), seed)).astype(mx.bfloat16)


def _run_binary_multiply(backend: str) -> list[mx.array]:
    # binary.metal's "vv_Multiply..." (binary_vv, bfloat16, N = 1).
    kernel = _mlx_kernel(("defines.h", "utils.h", "binary_ops.h", "binary.h"), "binary_vv",
                         (mx.bfloat16, mx.bfloat16, "Multiply", 1))
    out = kernel(buffers={"a": _bf16(2), "b": _bf16(3), "c": new_buffer((_N,), mx.bfloat16),
                          "size": _N},
                 grid=(_N,), threads_per_threadgroup=(_N,), backend=backend)
    return [out.mx("c")]


_ROWS, _AXIS = 5, 700


def _run_softmax(backend: str) -> list[mx.array]:
    # softmax.cpp: a row that fits one threadgroup runs softmax_single_row with N_READS =
    # 4 and ceil(axis / 4) threads rounded up to whole SIMD-groups.
    kernel = _mlx_kernel(("utils.h", "softmax.h"), "softmax_single_row",
                         (mx.float32, mx.float32, 4))
    x = _values((_ROWS, _AXIS), 4, scale=3.0)
    per_row = -(-_AXIS // 4)
    threads = -(-per_row // 32) * 32
    out = kernel(buffers={"in": x, "out": new_buffer(x.shape, mx.float32), "axis_size": _AXIS},
                 threadgroups=(_ROWS,), threads_per_threadgroup=(threads,), backend=backend)
    return [out.mx("out")]


def mlx_cases() -> list[Case]:
    """MLX's kernels, when the installed mlx ships its Metal headers (else none)."""
    if mlx_include_dir() is None:
        return []
    return [
        Case("MLX unary_v Exp", "MLX's unary.h (float32)", _run_unary_exp,
             lambda: [mx.exp(mx.array(_values((_N,), 1)), stream=mx.cpu)]),
        Case("MLX binary_vv Multiply", "MLX's binary.h (bfloat16)", _run_binary_multiply,
             lambda: [mx.multiply(_bf16(2), _bf16(3), stream=mx.cpu)], exact=True),
        Case("MLX softmax_single_row", "MLX's softmax.h: SIMD-group and threadgroup "
             "reductions", _run_softmax,
             lambda: [mx.softmax(mx.array(_values((_ROWS, _AXIS), 4, scale=3.0)), axis=-1,
                                 precise=True, stream=mx.cpu)]),
    ]


# --- the kernel families --------------------------------------------------------------------


def _launch_case(name: str, covers: str, launch: Callable[[], Any],
                 inputs: Callable[[], Sequence[Any]],
                 expected: Callable[[Sequence[Any]], Any], **diff: Any) -> Case:
    """A family's `Launch` run on the family's inputs, against its reference."""

    def run(backend: str) -> list[Any]:
        return list(launch()(*inputs(), backend=backend))

    def oracle() -> list[Any]:
        found = expected(inputs())
        return list(found) if isinstance(found, (list, tuple)) else [found]

    return Case(name, covers, run, oracle, diff_options=diff)


def _gguf(family: Any) -> Case:
    weights = family.sample_weights(4, 1024, seed=1)
    packed = mx.array(family.FORMATS["q2_K"].quantize(weights))
    return _launch_case(
        "gguf q2_K", "family gguf: q2_K super-blocks to float32",
        lambda: family.launch("q2_K", packed), lambda: [packed],
        lambda xs: family.FORMATS["q2_K"].dequantize(np.array(xs[0])))


def _flash_attention(family: Any) -> Case:
    shape = family.SMALL
    return _launch_case(
        "flash_attention", "family flash_attention: simdgroup_matrix tiles, online softmax",
        lambda: family.flash_launch(shape), lambda: family.make_inputs(shape),
        lambda xs: family.reference_for(False)(*xs))


def _gated_delta(family: Any) -> Case:
    problem = family.Problem(1, 16, 2, 2, 64, 16)
    inputs = family.make_inputs(problem, seed=7)
    return _launch_case(
        "gated_delta seq", "family gated_delta: SIMD-group reductions over a recurrence",
        lambda: family.seq_launch(problem), lambda: list(inputs),
        lambda xs: family.recurrence(*xs), atol=1e-4, rtol=1e-3)


def _dsv4(family: Any) -> Case:
    inputs = family.mxfp4_inputs(8, 128, seed=2)
    return _launch_case(
        "dsv4 mxfp4_dequant", "family dsv4: e2m1 codes with e8m0 scales to float32",
        lambda: family.mxfp4_launch(8, 128), lambda: inputs,
        lambda xs: family.mxfp4_reference(*xs))


_FAMILY_CASES: dict[str, Callable[[Any], Case]] = {
    "dsv4": _dsv4, "flash_attention": _flash_attention, "gated_delta": _gated_delta,
    "gguf": _gguf,
}


def family_cases() -> tuple[list[Case], str | None]:
    """One launch of each family found, and why there are none (no ``kernels/`` folder)
    or which families have no case here."""
    try:
        names = family_names()
    except FileNotFoundError as exc:
        return [], str(exc)
    cases = [_FAMILY_CASES[n](load_family(n)) for n in names if n in _FAMILY_CASES]
    missing = [n for n in names if n not in _FAMILY_CASES]
    note = f"families without a self-test case: {', '.join(missing)}" if missing else None
    return cases, note
