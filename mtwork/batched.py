"""GPU time of a kernel on `metal`, without the host's work around its dispatch.

A whole call of a kernel on metal does host work the GPU never sees: it converts its
inputs to MLX arrays, a full-source kernel copies its buffers into MLX arrays and back,
and each evaluation encodes, commits and waits for a command buffer. For a kernel of tens
of microseconds that work is most of a call, and a tuner timing whole calls would rank
kernels by their copies. So a call that dispatches one kernel on a backend that can
prepare its dispatches (`MetalBackend.prepare`) is timed this way:

1. the call runs once, untimed, with `backends.recording()` open: the one dispatch it
   makes (its program and buffers) is what is timed;
2. the backend prepares that dispatch once: the kernel object (made once per program),
   the inputs as MLX arrays, a full-source kernel's carried buffers; nothing is copied
   after this;
3. each round evaluates one dispatch, then `BATCH` back-to-back dispatches in one
   ``mx.eval`` (then ``mx.synchronize``), the clock around the evaluation only; the time
   per dispatch is the slope, (T(BATCH) - T(1)) / (BATCH - 1), and what one evaluation
   costs besides its dispatches (encoding, committing, waiting: the launch cost) is
   T(1) less it, reported apart, as Metal kernel tuners do.

MLX may let independent dispatches of one batch overlap on the GPU; the clock's label
says what was measured. A call that dispatches no kernel, or several, or needs `setup`
between calls, is timed as a whole call, and labelled so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .backends import recording

__all__ = ["BATCH", "PER_DISPATCH", "WHOLE_CALL", "Batched", "batched"]

BATCH = 32
PER_DISPATCH = (f"per dispatch, from {BATCH} back-to-back dispatches in one evaluation; "
                "launch cost apart")
WHOLE_CALL = "whole call: host work, copies and launch included"


@dataclass
class Batched:
    """Rounds of batched dispatches of one prepared call (see the module's doc); `outputs`
    are those of the untimed call that found it, `launch` the launch cost of each round."""

    prepared: Any  # the backend's prepared call: .dispatch() -> lazy outputs
    timer: Callable[[], float]
    outputs: Any
    launch: list[float] = field(default_factory=list)

    def __call__(self) -> tuple[float, Any]:
        """One round: the time per dispatch (and the launch cost, into `launch`)."""
        one = self._evaluate(1)
        many = self._evaluate(BATCH)
        per_dispatch = max((many - one) / (BATCH - 1), 0.0)
        self.launch.append(max(one - per_dispatch, 0.0))
        return per_dispatch, self.outputs

    def _evaluate(self, dispatches: int) -> float:
        results = [self.prepared.dispatch() for _ in range(dispatches)]  # lazy, untimed
        start = self.timer()
        mx.eval(results)
        mx.synchronize()
        return self.timer() - start


def batched(fn: Callable[[], Any], timer: Callable[[], float],
            wait: Callable[[Any], None]) -> Batched | None:
    """The batched timer of the one kernel dispatch `fn()` makes (it runs once here,
    untimed; `wait` waits for its outputs), or None when it makes none or several, or its
    backend cannot prepare a dispatch."""
    with recording() as calls:
        outputs = fn()
        wait(outputs)
    if len(calls) != 1:
        return None
    backend, program, call = calls[0]
    prepare = getattr(backend, "prepare", None)
    if prepare is None:
        return None
    prepared = prepare(program, call)
    prepared.materialize()  # its inputs computed now, not in the first timed evaluation
    return Batched(prepared, timer, outputs)
