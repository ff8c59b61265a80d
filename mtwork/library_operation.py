"""When a full-source kernel's call is an operation of MLX's graph, and what such a call
may not be given: the helpers of `library_kernel.Kernel.__call__`.

A call is an operation when one of its ``mx.array`` buffers is being traced (inside
``mx.compile``, ``mx.grad``...), or when it is given a stream (``stream=``, as
``mx.fast.metal_kernel`` calls take one): its outputs are then arrays of MLX's graph,
computed when MLX evaluates them (``mx.eval``, ``mx.async_eval``), on that stream."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from . import graph
from .backends import compile as compile_program
from .dispatch import Bound, Completion, Dispatch, Program
from .kernel_arguments import check_stream

__all__ = ["check_kept", "is_operation", "operation_outputs", "stream_of", "traced_call",
           "weakly"]


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


def stream_of(kernel: str, stream: Any) -> Any:
    """The call's `stream`, checked as ``mx.fast.metal_kernel`` checks it."""
    return check_stream(stream, f"`{kernel}`: `stream` must be the GPU's (mx.gpu, a GPU "
                                f"stream, or under mtwork.interpose the device mx.gpu "
                                f"answers as), got {stream!r}")


def is_operation(buffers: Any, stream: Any) -> bool:
    """Whether the call is an operation of MLX's graph (module docstring)."""
    return (stream is not None and graph.available()) or traced_call(buffers)


def operation_outputs(program: Program, call: Dispatch, backend: str, finish: graph.Finish,
                      *, traced: bool) -> dict[int, mx.array]:
    """The call's written buffers as arrays of MLX's graph; compiled now (its errors come
    at the call). A sanitized or profiled call not being traced is evaluated at once, so
    that its report or counts are there when it returns."""
    compile_program(program, backend=backend, options=call.options)
    written = graph.operation(program, call, backend, finish)
    if not traced and (call.options.sanitize or call.options.profile):
        mx.eval(list(written.values()))
    return written


def check_kept(kernel: str, bound: Mapping[int, Any]) -> None:
    """In an operation of MLX's graph, memory is MLX's: no numpy array can be written in
    place, and one array written at two indices would be two outputs."""
    for index, buf in bound.items():
        if isinstance(buf, Bound) and buf.writable and isinstance(buf.array, np.ndarray):
            raise TypeError(f"`{kernel}`: buffer({index}) is written by the kernel and given "
                            f"as a numpy array, which cannot be written by an operation of "
                            f"MLX's graph (inside mx.compile or another transformation, or "
                            f"a call given stream=); pass an mx.array (its result comes "
                            f"back in the Outputs) or mtwork.new_buffer(...)")
    written = [id(b.array) for b in bound.values()
               if isinstance(b, Bound) and b.writable and isinstance(b.array, mx.array)]
    if len(written) != len(set(written)):
        raise TypeError(f"`{kernel}`: one mx.array is bound to two buffers the kernel "
                        f"writes; in an operation of MLX's graph each written buffer is an "
                        f"output of its own: pass copies")
