"""`mtwork.profile(launch)`: what one dispatch does to an Apple GPU, counted.

The launch runs once on `sim` with the profiler (on a Mac too: the counts are the
emulator's, the GPU's own time is `mtwork.bench`'s), and its outputs are those of an
ordinary call. The `Counters` it returns go into `mtwork.gpu.estimate`:

    counters = mtwork.profile(launch)
    print(mtwork.gpu.estimate(counters, "M2 Max"))
"""

from __future__ import annotations

from typing import Any

from .gpu.counters import Counters
from .kernel import Launch
from .library_kernel import LibraryLaunch

__all__ = ["profile"]


def profile(launch: Launch | LibraryLaunch, *inputs: Any) -> Counters:
    """Runs `launch` (an `mtwork.Launch`, or a `LibraryLaunch` from `Kernel.launch`) once
    with the profiler and returns the dispatch's `Counters`; `inputs` replace a `Launch`'s
    own, as when calling it."""
    if not isinstance(launch, (Launch, LibraryLaunch)):
        raise TypeError(f"mtwork.profile takes an mtwork.Launch or a LibraryLaunch (from "
                        f"Kernel.launch), got {type(launch).__name__}; a kernel called "
                        f"directly takes profile=True and keeps `last_counters`")
    launch(*inputs, profile=True)
    counters = launch.last_counters
    assert counters is not None  # a profiled call always counts
    return counters
