"""A model of Apple GPUs for kernels run on the emulator: a table of M-series chips, the
counters of what a dispatch does to the GPU, and a modelled time per chip.

    from mtwork.gpu import Counters, estimate, gpu
    print(estimate(counters, gpu("M2 Max")))

See docs/gpu-model.md for the model, its sources and what it cannot see.
"""

from .chips import Chip, Source, chip_names, chips, default_gpu, gpu
from .counters import BufferTraffic, Counters, LaneOps, SimdOps, SourceLine
from .figures import counters_figure, estimates_figure, lines_figure
from .model import Assumptions, Estimate, Occupancy, Term, estimate, occupancy

__all__ = [
    "Assumptions", "BufferTraffic", "Chip", "Counters", "Estimate", "LaneOps", "Occupancy",
    "SimdOps", "Source", "SourceLine", "Term", "chip_names", "chips", "counters_figure",
    "default_gpu", "estimate", "estimates_figure", "gpu", "lines_figure", "occupancy",
]
