"""A model of Apple GPUs for kernels run on the emulator: a table of M-series chips, the
counters of what a dispatch does to the GPU, and a modelled time per chip.

    import mtwork
    print(mtwork.gpu.estimate(counters, mtwork.gpu("M2 Max")))

docs/gpu-model.md is the guide (how to profile and model, what to trust);
docs/records/gpu-model.md holds the model's terms, its sources, what it cannot see and its
validation.
"""

import sys
import types

from .catalog import chip_names, chips, default_gpu, gpu
from .chips import Chip, Source
from .counters import BufferTraffic, Counters, LaneOps, SimdOps, SourceLine
from .figures import counters_figure, estimates_figure, lines_figure
from .model import Assumptions, Estimate, Occupancy, Term, estimate, occupancy
from .scaling import at_steps, scaled
from .sequence import Sequence, estimate_sequence

__all__ = [
    "Assumptions", "BufferTraffic", "Chip", "Counters", "Estimate", "LaneOps", "Occupancy",
    "Sequence", "SimdOps", "Source", "SourceLine", "Term", "at_steps", "chip_names",
    "chips", "counters_figure", "default_gpu", "estimate", "estimate_sequence",
    "estimates_figure", "gpu", "lines_figure", "occupancy", "scaled",
]


class _CallableModule(types.ModuleType):
    """`mtwork.gpu("M2 Max")` is `mtwork.gpu.gpu("M2 Max")`; the package's names stay
    reachable (`mtwork.gpu.estimate`)."""

    def __call__(self, name: str, cores: int | None = None) -> Chip:
        return gpu(name, cores)


sys.modules[__name__].__class__ = _CallableModule
