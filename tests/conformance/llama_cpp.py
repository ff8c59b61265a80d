"""llama.cpp's Metal kernels as its host code runs them, for the conformance suite.

Each ``kernels/<kind>.metal`` of ggml-metal is loaded unchanged with `mtwork.load_metal`,
with the search folders and macros llama.cpp's host uses (ggml-metal-device.m: the
kernels' folder, ggml-metal/ and ggml/src; ``GGML_METAL_HAS_BF16`` where the device has
bfloat, as every Apple GPU since M2 and mtwork's sim have). A kernel is dispatched with
the arguments its host code sets (ggml-metal-ops.cpp and the pipeline parameters of
ggml-metal-device.cpp: function constants, grid, threadgroup, threadgroup memory), through
both of mtwork's paths (`metal_path.run_both`). Each test's measured agreement becomes one
row of the conformance report.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mtwork
from mtwork.dtypes import storage_numpy_dtype
from mtwork.library import NewBuffer

from .llama_cpp_sdist import Unavailable, ggml_src, source_label
from .llama_cpp_structs import impl_define
from .llama_cpp_tensors import Tensor
from .metal_path import run_both

__all__ = ["DEFINES", "MAX_THREADS", "Built", "built", "check", "fc", "kernel_files",
           "library", "new", "run", "src"]

# What ggml-metal-device.m passes as MTLCompileOptions.preprocessorMacros on a device that
# has bfloat (has_tensor is off: Metal 4 tensor kernels are not emulated).
DEFINES = {"GGML_METAL_HAS_BF16": 1}
# maxTotalThreadsPerThreadgroup of llama.cpp's pipelines on Apple GPUs, which its host
# reads back (ggml_metal_pipeline_max_theads_per_threadgroup) to size threadgroups.
MAX_THREADS = 1024
# Included by the kernel files, not compiled as libraries of their own (CMakeLists.txt).
_SHARED = ("fa_common.metal", "fa_vec_common.metal")


def src() -> Path:
    """ggml/src of the pinned sdist; the test is skipped, saying why, when pip cannot
    fetch it."""
    try:
        return ggml_src()
    except Unavailable as exc:
        pytest.skip(f"llama.cpp's Metal sources are unavailable: {exc}")


def kernel_files() -> list[str]:
    """The ``.metal`` files llama.cpp compiles into libraries (not the shared ones)."""
    try:
        folder = ggml_src() / "ggml-metal" / "kernels"
    except Unavailable:
        return []
    return sorted(p.name for p in folder.glob("*.metal") if p.name not in _SHARED)


@cache
def library(file: str) -> mtwork.Library:
    """``kernels/<file>`` loaded as llama.cpp's host compiles it."""
    root = src()
    return mtwork.load_metal(root / "ggml-metal" / "kernels" / file,
                             include_dirs=[root / "ggml-metal", root], defines=DEFINES)


def fc(offset: str, k: int = 0) -> int:
    """A function constant's index as the host writes it: ``FC_MUL_MV + 2``."""
    return impl_define(offset) + k


@dataclass(frozen=True)
class Built:
    """A compiled kernel, and how long its compile took in this process."""

    kernel: mtwork.Kernel
    compile_s: float


_BUILT: dict[tuple[str, str, tuple[tuple[int, Any], ...]], Built] = {}


def built(file: str, name: str, constants: Mapping[int, Any] | None = None) -> Built:
    """Kernel `name` of `file` with function constants by index, compiled (once per
    process); the first compile's wall time is kept for the report."""
    key = (file, name, tuple(sorted((constants or {}).items())))
    if key not in _BUILT:
        start = time.perf_counter()
        k = library(file).kernel(name, constants=dict(constants or {})).compile()
        _BUILT[key] = Built(k, time.perf_counter() - start)
    return _BUILT[key]


def new(nbytes: int, *, scratch: bool = False) -> NewBuffer:
    """A fresh output buffer of `nbytes` (sim poisons it: unwritten bytes show). A
    `scratch` buffer is one the host sizes beyond what the kernel writes (rounded up, or
    reserved for a larger configuration): zero-filled, so its unwritten tail is no
    finding."""
    return mtwork.new_buffer(nbytes, np.uint8, fill=0 if scratch else None)


def _as_param(k: mtwork.Kernel, index: int, value: Any) -> Any:
    """`value` (a Tensor, bytes, a uint8 array or a new buffer) as buffer `index` of `k`
    takes it: bytes viewed as the element type the parameter declares."""
    if isinstance(value, Tensor):
        value = value.data
    p = next(q for q in k.signature.buffers if q.index == index)
    info = k.element_info(p)
    if isinstance(value, NewBuffer):
        if info is None:
            return value
        dtype = storage_numpy_dtype(info.dtype)
        return mtwork.new_buffer(value.shape[0] // dtype.itemsize, dtype, fill=value.fill)
    if not p.is_pointer or info is None or not isinstance(value, np.ndarray):
        return value
    return value.view(storage_numpy_dtype(info.dtype))


def run(b: Built, buffers: Mapping[int, Any], threadgroups: tuple[int, int, int],
        threads: tuple[int, int, int], smem: int | None = None) -> dict[int, np.ndarray]:
    """Dispatches `b` as the host does (``dispatch_threadgroups``, threadgroup memory
    `smem` at index 0 where the kernel takes it) on both of mtwork's paths; returns the
    written buffers by index, as bytes."""
    k = b.kernel
    call: dict[str, Any] = {
        "buffers": {i: _as_param(k, i, v) for i, v in buffers.items()},
        "threadgroups": threadgroups, "threads_per_threadgroup": threads}
    if k.signature.threadgroup_params:
        call["threadgroup_memory"] = {0: smem or 0}
    out = run_both(k, **call)
    by_name = {p.name: p.index for p in k.signature.buffers}
    return {by_name[n]: np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            for n, a in out.items()}


def check(agreement: Any, b: Built | list[Built], kernel: str, actual: Any, expected: Any,
          reference: str, **options: Any) -> mtwork.DiffReport:
    """Measures `actual` against `expected` (a float64 reference written from the
    algorithm) through the `agreement` fixture, which records the report's row (suite
    "llama-cpp-python") with the kernels' compile time, and fails the test out of
    tolerance."""
    __tracebackhide__ = True
    parts = b if isinstance(b, list) else [b]
    return agreement(kernel, source_label(), actual, expected, reference=reference,
                     compile_s=round(sum(p.compile_s for p in parts), 2), **options)
