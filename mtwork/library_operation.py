"""When a full-source kernel's call is an operation of MLX's graph, and what such a call
may not be given: the helpers of `library_kernel.Kernel.__call__`."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from . import graph
from .dispatch import Bound, Completion

__all__ = ["check_kept", "traced_call", "weakly"]


def weakly(method: Any) -> graph.Finish:
    """`method` of a kernel, held weakly (an operation MLX keeps must not keep the
    kernel, or the emulator's worker, alive)."""
    ref = weakref.WeakMethod(method)

    def finish(done: Completion | None, error: BaseException | None) -> None:
        bound = ref()
        if bound is not None:
            bound(done, error)

    return finish


def traced_call(buffers: Any) -> bool:
    """Whether any ``mx.array`` among `buffers` belongs to a graph being traced (inside
    `mx.compile`, `mx.grad`, ...): then the call is an operation of MLX's graph."""
    values = buffers.values() if isinstance(buffers, Mapping) else (
        buffers if isinstance(buffers, Sequence) and not isinstance(buffers, (str, bytes))
        else ())
    arrays = [v for v in values if isinstance(v, mx.array)]
    return bool(arrays) and graph.available() and any(graph.is_tracer(a) for a in arrays)


def check_kept(kernel: str, bound: Mapping[int, Any]) -> None:
    """Inside a transformation, memory is MLX's: no numpy array can be written in place,
    and one array written at two indices would be two outputs."""
    for index, buf in bound.items():
        if isinstance(buf, Bound) and buf.writable and isinstance(buf.array, np.ndarray):
            raise TypeError(f"`{kernel}`: buffer({index}) is written by the kernel and given "
                            f"as a numpy array, which cannot be written inside mx.compile "
                            f"or another transformation; pass an mx.array (its result comes "
                            f"back in the Outputs) or mtwork.new_buffer(...)")
    written = [id(b.array) for b in bound.values()
               if isinstance(b, Bound) and b.writable and isinstance(b.array, mx.array)]
    if len(written) != len(set(written)):
        raise TypeError(f"`{kernel}`: one mx.array is bound to two buffers the kernel "
                        f"writes; inside a transformation each written buffer is an output "
                        f"of its own: pass copies")
