"""Helpers of the MLX corpus: MLX's kernels loaded as MLX's own `.metal` files compile
them, timed, with the geometry helpers of MLX's host code.

MLX's `.metal` files (which include the headers and list the instantiations) are not in
the wheel and PyPI has no MLX source distribution, so `metal_library` writes the include
lines such a file starts with, and each test names the template arguments one of the
file's instantiations uses (the test cites the `.metal` file). The headers themselves are
read from the installed wheel, through ``#include "mlx/backend/metal/kernels/..."``: the
path a `.metal` file takes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import cache
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np
import pytest

import mtwork

from .report import record_unsupported
from .sources import mlx_kernels_dir

MLX = "mlx"
KERNELS = "mlx/backend/metal/kernels/"
RNG_SEED = 0


def rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


@cache
def metal_library(*headers: str) -> mtwork.Library:
    """The library a `.metal` file of MLX's makes from `headers`: the paths under
    kernels/ it includes, in its order (softmax.metal: "utils.h", "softmax.h")."""
    mlx_kernels_dir()  # skips the test when the wheel ships no headers
    text = "".join(f'#include "{KERNELS}{h}"\n' for h in headers)
    label = headers[-1].rsplit("/", 1)[-1].removesuffix(".h") + ".metal"
    return mtwork.load_metal(text, name=label)


class Built(NamedTuple):
    """A kernel and the seconds its compile took in this run (a cached one: ~0)."""

    kernel: mtwork.Kernel
    compile_s: float


def build(library: mtwork.Library, function: str, template: Any = None,
          constants: Mapping[str | int, Any] | None = None) -> Built:
    """`library`'s kernel `function`, instantiated and compiled now."""
    kernel = library.kernel(function, template=template, constants=constants)
    start = time.perf_counter()
    kernel.compile()
    return Built(kernel, time.perf_counter() - start)


def ceil_div(n: int, m: int) -> int:
    return -(-n // m)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_dims(dim0: int, dim1: int, dim2: int, pow2: int = 10) -> tuple[int, int, int]:
    """MLX's `get_block_dims` (backend/common/utils.cpp): a power of two per dimension,
    grown in turn while the dimension is at least twice as large, up to 2**pow2 threads."""
    pows = [0, 0, 0]
    total = 0
    dims = (dim0, dim1, dim2)
    while True:
        before = total
        for axis in range(3):
            if dims[axis] >= 1 << (pows[axis] + 1):
                pows[axis] += 1
                total += 1
            if total == 10:
                return (1 << pows[0], 1 << pows[1], 1 << pows[2])
        if total in (before, pow2):
            return (1 << pows[0], 1 << pows[1], 1 << pows[2])


def strided_view(base: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The shape and element strides of `base` transposed by `axes`, as the int32 shape
    and int64 strides MLX's general kernels take (the kernel reads `base`'s buffer)."""
    view = base.transpose(axes)
    strides = np.array([s // base.itemsize for s in view.strides], np.int64)
    return np.array(view.shape, np.int32), strides


def expect_unsupported(kernel: str, error: type[BaseException], match: str,
                       call: Any) -> BaseException:
    """Runs `call`, requires it to raise `error` matching `match`, records the kernel as
    unsupported with that error, and returns it."""
    with pytest.raises(error, match=match) as caught:
        call()
    record_unsupported(suite=MLX, kernel=kernel, source=_mlx_source(), error=caught.value)
    return caught.value


@cache
def _mlx_source() -> str:
    from .conftest import source_text

    return source_text(MLX)
