"""The metal backend's path for full-source kernels, proved off a Mac.

On a Mac, `mtwork.load_metal` kernels run through ``mx.fast.metal_kernel``: the backend
writes the kernel as a body-form kernel (`mtwork.msl.wrap`) whose inputs carry every
buffer. `MetalOnSim` is that backend with `mtwork.metal_kernel` on sim standing in for
MLX (same arguments, same generated kernel), so the exact text MLX would get runs here;
`run_both` runs a kernel directly and through it, and requires the same bytes.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

import mtwork
from mtwork import graph
from mtwork.backends import names, register
from mtwork.backends.metal import MetalBackend

NAME = "metal_on_sim"


# Metal rounds a buffer's allocation up to whole pages, so a kernel that reads or writes a
# little past an input's end (MLX's rader_fft does on its last rows) stays inside memory
# of its own; MLX arrays on the CPU have no such room.
ALLOCATION_SLACK = 16384


def _in_process_kernel(**arguments: Any) -> Any:
    """`mtwork.metal_kernel` on sim, in process: the metal path's writable buffers are MLX
    inputs the kernel writes in place, as a Metal buffer is written (the worker process
    works on copies of inputs). Each input runs with `ALLOCATION_SLACK` bytes after it and
    is written back."""
    kernel = functools.partial(mtwork.metal_kernel(**arguments, backend="sim"), isolate=False)

    def run(*, inputs: list[mx.array], **call: Any) -> Any:
        if any(graph.is_tracer(a) for a in inputs):
            # Traced (inside mx.compile): a body-form kernel, whose inputs are MLX's; the
            # wrapper of a full-source kernel runs at evaluation, on concrete carriers.
            return kernel(inputs=inputs, **call)
        roomy = [mx.array(np.concatenate([np.array(a).view(np.uint8),
                                          np.zeros(ALLOCATION_SLACK, np.uint8)]))
                 for a in inputs]
        outputs = kernel(inputs=roomy, **call)
        mx.eval(outputs)  # the kernel writes its inputs as it runs
        for original, padded in zip(inputs, roomy):
            target = np.array(original, copy=False).reshape(-1).view(np.uint8)
            np.copyto(target, np.array(padded)[: target.size])
        return outputs

    return run


class MetalOnSim(MetalBackend):
    """The metal backend, with `mtwork.metal_kernel` on sim in place of MLX's."""

    name = NAME

    def __init__(self) -> None:
        super().__init__(make_kernel=_in_process_kernel)

    def unavailable_reason(self) -> str | None:
        return None


def registered() -> str:
    """The stand-in backend's name, registered once."""
    if NAME not in names():
        register(NAME, MetalOnSim)
    return NAME


def _copied(buffers: Any) -> Any:
    """The buffers with every numpy array copied (a kernel may write them in place); one
    memory given at several indices stays one memory (one copy, viewed alike)."""
    copies: dict[tuple[int, int], np.ndarray] = {}

    def copy(value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        key = (value.ctypes.data, value.nbytes)
        if key not in copies:
            copies[key] = value.copy()
        return copies[key].view(value.dtype).reshape(value.shape)

    if isinstance(buffers, dict):
        return {k: copy(v) for k, v in buffers.items()}
    return [copy(v) for v in buffers]


def run_both(kernel: mtwork.Kernel, **call: Any) -> mtwork.Outputs:
    """Runs `kernel` on sim directly and through the metal backend's wrapper; asserts
    every written buffer is bitwise the same; returns the direct run's outputs."""
    wrapped_call = {**call, "buffers": _copied(call.get("buffers") or {})}
    direct = kernel(**call, backend="sim")
    wrapped = kernel(**wrapped_call, backend=registered())
    assert set(direct) == set(wrapped), (set(direct), set(wrapped))
    for name in direct:
        a, b = np.asarray(direct[name]), np.asarray(wrapped[name])
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), (
            f"`{kernel.name}`: buffer `{name}` differs between the direct path and the "
            f"metal backend's wrapper")
    return direct
