"""The modelled Apple GPU time of a built kernel, for the tools that rank kernels (sweeps,
`compare`, the editor).

On `sim` the emulator's CPU time says nothing about GPU speed (it reverses the ranking of
threadgroup-memory tiling and `simdgroup_matrix` kernels), so these tools rank by the
model instead: a built kernel (`Launch` or `LibraryLaunch`) runs once more with the
profiler, and `mtwork.gpu.estimate` turns its `Counters` into a time and a bound on the
chosen chip. Counters are deterministic, so one profiled run per setting is enough, and
cached counters serve every chip. On `metal` the measured GPU time ranks, and the model
stands beside it with its error (measured / modelled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import KernelCancelled, UnknownParameterError
from .gpu.catalog import default_gpu, gpu
from .gpu.chips import Chip
from .gpu.counters import Counters
from .gpu.model import Estimate, estimate
from .kernel import Launch
from .library_kernel import LibraryLaunch
from .recording import profiling_calls

__all__ = ["MODELLED", "GpuChoice", "chip_for", "counters_from", "counters_of", "estimate_for",
           "estimate_of", "model_label", "model_ratio", "plain_counters"]

GpuChoice = Chip | str | bool | None
MODELLED = "modelled"  # the objective: modelled time on the chosen chip, in seconds


def chip_for(choice: GpuChoice) -> Chip | None:
    """The chip to model on: None or True, `MTWORK_GPU` (else the default chip); a name
    for `mtwork.gpu`; a `Chip`; False: no model."""
    if choice is False:
        return None
    if choice is None or choice is True:
        return default_gpu()
    if isinstance(choice, str):
        return gpu(choice)
    if isinstance(choice, Chip):
        return choice
    raise TypeError(f"gpu= takes a chip name such as 'M2 Max', an mtwork.gpu Chip, None "
                    f"(MTWORK_GPU, else the default chip) or False (no model), got "
                    f"{choice!r}")


def counters_of(built: Any, inputs: Sequence[Any] = ()) -> Counters | None:
    """The counters of one profiled call of `built` (on sim): a `Launch`, a
    `LibraryLaunch`, or a plain callable that dispatches one kernel (a family's `run`, a
    function around one launch). None for a callable that dispatches no kernel or
    several (`plain_counters` says which)."""
    if isinstance(built, LibraryLaunch):
        built(profile=True)
    elif isinstance(built, Launch):
        built(*inputs, profile=True)
    else:
        found = plain_counters(built, inputs)
        return found[0] if len(found) == 1 else None
    return built.last_counters


def plain_counters(call: Any, inputs: Sequence[Any] = ()) -> list[Counters]:
    """The counters of every kernel one call of `call` dispatches, in order."""
    with profiling_calls() as completions:
        call(*inputs)
    return [c.counters for c in completions if c.counters is not None]


def estimate_of(built: Any, inputs: Sequence[Any], chip: Chip,
                dispatched: Sequence[str] | None = None
                ) -> tuple[Counters | None, Estimate | None, str | None]:
    """`built`'s counters, its estimate on `chip`, and why there is no estimate (or None).
    A profiled run that fails, a callable that dispatches no kernel or several, or a
    launch `chip` could not run leaves a reason, not an exception: the timed runs stand
    on their own. `dispatched`: the kernels a plain call of `built` was seen to make
    (`recording.watching_calls`), when known: a callable that made none or several is not
    called again to find out."""
    try:
        if isinstance(built, (Launch, LibraryLaunch)):
            counters = counters_of(built, inputs)
        else:
            if dispatched is not None and len(dispatched) != 1:
                return None, None, _not_one_kernel(list(dispatched))
            found = plain_counters(built, inputs)
            if len(found) != 1:
                return None, None, _not_one_kernel([c.kernel for c in found])
            counters = found[0]
    except (KernelCancelled, UnknownParameterError):
        raise
    except Exception as exc:  # noqa: BLE001 - the model is missing, the run stands
        return None, None, f"not modelled: the profiled run raised {type(exc).__name__}: {exc}"
    assert counters is not None  # a profiled call always counts
    estimated, reason = estimate_for(counters, chip)
    return counters, estimated, reason


def _not_one_kernel(kernels: list[str]) -> str:
    if not kernels:
        return "not modelled: a plain callable that dispatched no mtwork kernel"
    names = ", ".join(dict.fromkeys(kernels))
    return (f"not modelled: a plain callable that dispatched {len(kernels)} kernels "
            f"({names}); model them together with mtwork.gpu.estimate_sequence")


def estimate_for(counters: Counters | None, chip: Chip | None
                 ) -> tuple[Estimate | None, str | None]:
    """The estimate of `counters` on `chip`, or the reason there is none (a launch the
    chip's limits refuse)."""
    if counters is None or chip is None:
        return None, None
    try:
        return estimate(counters, chip), None
    except ValueError as exc:
        return None, f"not modelled: {exc}"


def counters_from(data: Any) -> tuple[Counters | None, str | None]:
    """Counters kept as `Counters.to_dict` (a sweep's cache file), or why they do not read
    (written by another version of the counters): None and the reason, not an error."""
    if data is None:
        return None, None
    try:
        return Counters.from_dict(data), None
    except (TypeError, ValueError) as exc:
        return None, f"not modelled: the cached counters do not read ({exc})"


def model_ratio(measured: float | None, estimated: Estimate | None) -> float | None:
    """The model's error as measured / modelled (above 1: the GPU was slower than modelled)."""
    if measured is None or estimated is None or estimated.seconds <= 0:
        return None
    return measured / estimated.seconds


def model_label(chip: Chip) -> str:
    return f"modelled time on {chip.label} — a model, not a measurement"
