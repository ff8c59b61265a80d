"""mtwork: write, check and tune Metal (MSL) compute kernels for MLX, on any machine.

`mtwork.metal_kernel` is a drop-in for `mx.fast.metal_kernel`: on a Mac it runs on the
Apple GPU through MLX, elsewhere on `sim`, a CPU emulator that runs the same MSL; its
calls are operations of MLX's graph. `mtwork.interpose()` (and ``pytest --mtwork``) runs
other code that calls ``mx.fast.metal_kernel`` on mtwork, unchanged.
"""

from . import gpu
from .backends import backends, default_backend
from .compare import Comparison, compare
from .errors import (
    BackendUnavailable,
    CompileError,
    EmulatorUnavailable,
    KernelCancelled,
    KernelDeadlock,
    KernelFault,
    KernelTimeout,
    MetalRuleError,
    MtworkError,
    ThreadgroupMemoryError,
)
from .families import KernelSpec, family_names, load_family
from .interposition import Interposition, interpose
from .kernel import Launch, MetalKernel, metal_kernel
from .kernel_log import KernelLog, LogMessage
from .library import Kernel, Library, Outputs, load_metal, new_buffer
from .oracle import DiffReport, assert_bitwise_equal, assert_close, diff
from .profile import profile
from .sanitizer import SanitizerError, SanitizerReport
from .sweep import (
    SweepError,
    SweepInterrupted,
    SweepResult,
    divides,
    sweep,
    threadgroup_memory_under,
    threads_per_threadgroup_under,
)
from .timing import Clock, Measurement, bench

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "CompileError",
    "DiffReport",
    "EmulatorUnavailable",
    "KernelCancelled",
    "KernelDeadlock",
    "KernelFault",
    "KernelSpec",
    "Interposition",
    "Kernel",
    "KernelLog",
    "Library",
    "LogMessage",
    "Outputs",
    "Launch",
    "Clock",
    "Comparison",
    "Measurement",
    "SanitizerError",
    "SanitizerReport",
    "SweepError",
    "SweepInterrupted",
    "SweepResult",
    "KernelTimeout",
    "MetalKernel",
    "MetalRuleError",
    "MtworkError",
    "ThreadgroupMemoryError",
    "assert_bitwise_equal",
    "assert_close",
    "backends",
    "default_backend",
    "bench",
    "compare",
    "diff",
    "editor",
    "divides",
    "family_names",
    "gpu",
    "interpose",
    "load_family",
    "load_metal",
    "new_buffer",
    "plots",
    "profile",
    "sweep",
    "threadgroup_memory_under",
    "threads_per_threadgroup_under",
    "metal_kernel",
]


def __getattr__(name: str) -> object:
    # The editor (anywidget, ipywidgets) and plots (plotly) load on first use: most
    # programs never draw or edit, and those imports are a large part of mtwork's.
    if name in ("editor", "plots"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
