"""mtwork: write, check and tune Metal (MSL) compute kernels for MLX, on any machine.

`mtwork.metal_kernel` is a drop-in for `mx.fast.metal_kernel`: on a Mac it runs on the
Apple GPU through MLX, elsewhere on `sim`, a CPU emulator that runs the same MSL.
"""

from .backends import backends, default_backend
from .errors import (
    BackendUnavailable,
    CompileError,
    EmulatorUnavailable,
    KernelDeadlock,
    KernelFault,
    KernelTimeout,
    MtworkError,
    ThreadgroupMemoryError,
)
from .kernel import MetalKernel, metal_kernel
from .oracle import DiffReport, assert_bitwise_equal, assert_close, diff

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "CompileError",
    "DiffReport",
    "EmulatorUnavailable",
    "KernelDeadlock",
    "KernelFault",
    "KernelTimeout",
    "MetalKernel",
    "MtworkError",
    "ThreadgroupMemoryError",
    "assert_bitwise_equal",
    "assert_close",
    "backends",
    "default_backend",
    "diff",
    "metal_kernel",
]
