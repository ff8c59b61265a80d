"""A kernel call as an operation of MLX's graph: `apply` returns arrays that MLX computes
when it evaluates them, by handing the call to `mtwork.backends.run` then.

A call is described once (`Record`: the program, the dispatch without the memory of the
arrays MLX passes, which buffer each input and output of the operation is) and named by
an id in the primitive MLX keeps (`extension.cpp`); `mx.compile`'s replays reuse it with
new inputs. When MLX evaluates the operation, the outputs' memory is first lent by the
backend where it can (`_place`: the emulator's memory shared with its worker, which the
worker writes in place; given back when MLX frees the array), else MLX's own; then
`_run` gets the memory of its inputs and outputs, binds the inputs as they are (no copy),
lets the backend write the fresh buffers straight into the outputs where it can
(`Dispatch.into`) and copies the rest in. A writable
buffer bound to an MLX array (a full-source kernel that updates a buffer) is an output
too: the input's bytes are copied into it and the kernel updates them there, so the
caller's array keeps its values, as MLX arrays always do.

Errors of the dispatch (a fault, a sanitizer's report, a compile error) leave MLX's
evaluation as themselves: `mx.eval` raises them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import mlx.core as mx
import numpy as np

from ..backends import OutputMemory, output_memory
from ..backends import run as run_program
from ..buffers import numpy_view, reuse_memory_for
from ..dispatch import Bound, Completion, Dispatch, Fresh, Program
from ..dtypes import itemsize, storage_numpy_dtype
from .build import GraphUnavailable, load

__all__ = ["Finish", "GraphUnavailable", "Input", "Output", "Record", "available",
           "give_back_freed", "is_tracer", "operation", "pending", "unavailable_reason",
           "warn_eager"]


@dataclass(frozen=True)
class Input:
    """An input of the operation: the buffer it is bound to and whether the kernel sees
    it row-contiguous (else with its own strides)."""

    index: int
    dtype: mx.Dtype
    contiguous: bool = True


@dataclass(frozen=True)
class Output:
    """An output of the operation: the buffer it is, its shape and type; `source` is the
    position of the input whose bytes it starts with (a writable bound buffer), or None
    for a fresh buffer."""

    index: int
    shape: tuple[int, ...]
    dtype: mx.Dtype
    source: int | None = None


Finish = Callable[[Completion | None, BaseException | None], None]


@dataclass(frozen=True)
class Record:
    """What one call runs when MLX evaluates it. `call` holds every buffer but those the
    operation's inputs and outputs give; `finish` hears how each evaluation ended."""

    program: Program
    call: Dispatch
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    backend: str
    finish: Finish


_records: dict[int, Record] = {}
_lent: dict[int, OutputMemory] = {}  # by token: memory MLX holds as outputs' data
_ids = itertools.count(1)
_lock = threading.Lock()
_module: ModuleType | None = None
_reason: str | None = None


def _extension() -> ModuleType:
    """The built extension, with mtwork's runner set; `GraphUnavailable` (kept: a build
    is tried once per process) when it cannot be had."""
    global _module, _reason
    if _module is not None:
        return _module
    if _reason is not None:
        raise GraphUnavailable(_reason)
    try:
        module = load()
    except GraphUnavailable as exc:
        _reason = str(exc)
        raise
    module.set_runner(_run)
    module.set_placer(_place)
    _module = module
    return module


def available() -> bool:
    """Whether kernel calls can be operations of MLX's graph here (the extension builds
    and loads); when not, `unavailable_reason` says why."""
    try:
        _extension()
    except GraphUnavailable:
        return False
    return True


def unavailable_reason() -> str | None:
    return None if available() else _reason


_warned = False


def warn_eager() -> None:
    """Says once that kernels run at the call, not as MLX operations, and why."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"mtwork runs kernels at the call, not as operations of MLX's graph "
                      f"(so not inside mx.compile or other transformations): "
                      f"{unavailable_reason()}", RuntimeWarning, stacklevel=3)


def is_tracer(array: mx.array) -> bool:
    """Whether `array` belongs to a graph being traced (inside `mx.compile`, `mx.grad`,
    `mx.vmap`...), whose values cannot be read."""
    return bool(_extension().is_tracer(array))


def _forget_released(module: ModuleType) -> None:
    released = module.released()
    if released:
        with _lock:
            for call_id in released:
                _records.pop(call_id, None)


def _give_back(module: ModuleType) -> None:
    """Gives back the lent memory of the arrays MLX has freed."""
    for token in module.freed():
        with _lock:
            lent = _lent.pop(token, None)
        if lent is not None:
            lent.release()


def pending() -> int:
    """How many calls MLX still holds operations of (a compiled function keeps its own)."""
    if _module is not None:
        _forget_released(_module)
    return len(_records)


def give_back_freed() -> None:
    """Gives the memory of outputs MLX has freed back to the backends that lent it (they
    get it back at their next operation's evaluation anyway; memory counts want it now)."""
    if _module is not None:
        _give_back(_module)


def _cpu_stream(stream: object) -> mx.Stream | None:
    """The stream an operation runs on: the call's, if it is a CPU stream (what
    ``mx.new_stream(mx.gpu)`` makes under interposition off a Mac), else the CPU's
    default stream (None): the emulator's work is the CPU's."""
    if isinstance(stream, mx.Stream) and stream.device.type == mx.DeviceType.cpu:
        return stream
    return None


def operation(program: Program, call: Dispatch, backend: str, finish: Finish
              ) -> dict[int, mx.array]:
    """The buffers `call` returns, as arrays of MLX's graph, by buffer index: a bound
    ``mx.array`` is an input of the operation (and, when the kernel writes it, an output
    that starts as its bytes), a fresh buffer an output; other buffers (numpy, scalars)
    are constants of the call. `finish` hears how each evaluation ended. The operation
    runs on the call's stream where that is a CPU stream, else on the CPU's default."""
    module = _extension()
    _forget_released(module)
    _give_back(module)
    inputs: list[Input] = []
    outputs: list[Output] = []
    arrays: list[mx.array] = []
    constants: dict[int, Bound | Fresh] = {}
    for index, buf in sorted(call.buffers.items()):
        if isinstance(buf, Fresh):
            outputs.append(Output(index, tuple(buf.shape), buf.dtype))
            constants[index] = buf
        elif isinstance(buf.array, mx.array):
            dtype = buf.dtype or buf.array.dtype
            if buf.writable:
                outputs.append(Output(index, tuple(buf.array.shape), dtype, len(inputs)))
            inputs.append(Input(index, dtype, buf.contiguous))
            arrays.append(buf.array)
        else:
            constants[index] = buf
    record = Record(program, dataclasses.replace(call, buffers=constants), tuple(inputs),
                    tuple(outputs), backend, finish)
    call_id = next(_ids)
    with _lock:
        _records[call_id] = record
    for o in outputs:  # MLX's allocator keeps such outputs for the next call to reuse
        reuse_memory_for(math.prod(o.shape) * itemsize(o.dtype))
    made = module.apply(call_id, arrays, [list(o.shape) for o in outputs],
                        [o.dtype for o in outputs], _cpu_stream(call.stream))
    return {o.index: array for o, array in zip(outputs, made)}


def _view(address: int, shape: tuple[int, ...], strides: tuple[int, ...],
          dtype: mx.Dtype) -> np.ndarray:
    """The memory of an MLX array as numpy (bfloat16 as its uint16 bits), no copy."""
    kind = np.dtype(storage_numpy_dtype(dtype))
    if address == 0 or 0 in shape:
        return np.empty(shape, kind)
    steps = tuple(s * kind.itemsize for s in strides)
    low = sum((n - 1) * s for n, s in zip(shape, steps) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, steps) if s > 0) + kind.itemsize
    raw = (ctypes.c_uint8 * (high - low)).from_address(address + low)
    return np.ndarray(shape, kind, buffer=raw, offset=-low, strides=steps)


def _place(call_id: int, sizes: list[int]) -> list[tuple[int, int, int]]:
    """MLX evaluates call `call_id`, whose outputs take `sizes` bytes: for each, the
    (address, capacity, token) of memory its backend lends, or zeros for MLX's own."""
    module = _extension()
    _give_back(module)
    with _lock:
        record = _records[call_id]
    placed = []
    for memory in output_memory(record.backend, record.call, sizes):
        if memory is None:
            placed.append((0, 0, 0))
            continue
        token = next(_ids)
        with _lock:
            _lent[token] = memory
        placed.append((memory.address, memory.capacity, token))
    return placed


def _run(call_id: int, inputs: list[tuple], outputs: list[tuple]) -> None:
    """MLX evaluates call `call_id`: its inputs' and outputs' memory (address, shape,
    strides in elements, dtype) are given; the outputs are written here."""
    with _lock:
        record = _records[call_id]
    given = [_view(*described) for described in inputs]
    made = [_view(*described) for described in outputs]
    buffers: dict[int, Bound | Fresh] = dict(record.call.buffers)
    for spec, view in zip(record.inputs, given):
        buffers[spec.index] = Bound(view, spec.dtype, contiguous=spec.contiguous)
    into = {}
    for spec, view in zip(record.outputs, made):
        if spec.source is None:
            into[spec.index] = view
        else:  # updated in place: it starts as the input's bytes
            np.copyto(view, given[spec.source].reshape(view.shape))
            buffers[spec.index] = Bound(view, spec.dtype, writable=True)
    call = dataclasses.replace(record.call, buffers=buffers, into=into)
    try:
        done = run_program(record.program, call, backend=record.backend)
    except BaseException as exc:
        record.finish(None, exc)
        raise
    for spec, view in zip(record.outputs, made):
        written = done.buffers[spec.index]
        if written is not view:
            np.copyto(view, numpy_view(written).reshape(view.shape))
    record.finish(done, None)
