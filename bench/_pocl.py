"""PoCL through pyopencl: find a PoCL platform that compiles and runs here, and run
OpenCL C kernels on it with inputs resident in device buffers.

PoCL is optional: without pyopencl, or where no PoCL platform works (the PoCL bundled in
some pip wheels fails with "unknown target CPU 'generic'" on some CPUs, while Debian's
`pocl-opencl-icd` works), `find_pocl` returns None and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("vs_pocl.cl")
_PROBE = "__kernel void probe(__global float* x) { x[get_global_id(0)] = exp(1.0f); }"


@dataclass
class PoCL:
    """One PoCL device with a context, an in-order queue and the benchmark's program."""

    cl: Any  # the pyopencl module
    platform: Any
    device: Any
    context: Any
    queue: Any
    _programs: dict[str, Any] = field(default_factory=dict)

    @property
    def has_subgroups(self) -> bool:
        return "cl_khr_subgroups" in self.device.extensions.split()

    def describe(self) -> str:
        d = self.device
        return (f"{self.platform.name}, {self.platform.version.strip()}; device {d.name} "
                f"({d.max_compute_units} compute units, {d.version.strip()})")

    def program(self, path: Path = SOURCE) -> Any:
        """The OpenCL program of `path`, built once; SIMD-group reductions use
        sub_group_reduce_* where the device has cl_khr_subgroups."""
        key = str(path)
        if key not in self._programs:
            options = ["-DUSE_SUBGROUPS"] if self.has_subgroups else []
            self._programs[key] = self.cl.Program(self.context, path.read_text()).build(
                options=options)
        return self._programs[key]

    def kernel(self, name: str) -> Any:
        return self.cl.Kernel(self.program(), name)

    def to_device(self, array: np.ndarray) -> Any:
        """A read-only device buffer holding a copy of `array`."""
        flags = self.cl.mem_flags.READ_ONLY | self.cl.mem_flags.COPY_HOST_PTR
        return self.cl.Buffer(self.context, flags, hostbuf=np.ascontiguousarray(array))

    def output(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> Output:
        host = np.empty(shape, dtype=dtype)
        buffer = self.cl.Buffer(self.context, self.cl.mem_flags.WRITE_ONLY, host.nbytes)
        return Output(host, buffer)

    def launcher(self, name: str, global_size: Sequence[int], local_size: Sequence[int],
                 args: Sequence[Any], outputs: Sequence[Output]):
        """A call that runs kernel `name` on `args` and copies `outputs` back to the host:
        the PoCL side's time is the kernel plus the read-back of its results."""
        kernel = self.kernel(name)
        cl, queue = self.cl, self.queue
        global_size, local_size = tuple(global_size), tuple(local_size)

        def run() -> list[np.ndarray]:
            # Set on every call: the kernel holds no reference to its buffers, `args` does.
            kernel.set_args(*args)
            cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
            for out in outputs:
                cl.enqueue_copy(queue, out.host, out.buffer, is_blocking=False)
            queue.finish()
            return [out.host for out in outputs]

        return run


@dataclass
class Output:
    host: np.ndarray
    buffer: Any


def find_pocl(prefer: str | None = None) -> tuple[PoCL | None, list[str]]:
    """The first PoCL platform (or the first whose name and version contain `prefer`)
    that builds and runs a probe kernel, and one line for each platform looked at."""
    try:
        import pyopencl as cl
    except ImportError:
        return None, ["pyopencl is not installed (pip install pyopencl; see bench/README.md)"]
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:  # no ICD at all raises PLATFORM_NOT_FOUND_KHR
        return None, [f"no OpenCL platform: {exc}"]
    notes, chosen = [], None
    for platform in platforms:
        label = f"{platform.name} ({platform.version.strip()})"
        if "Portable Computing Language" not in platform.name:
            notes.append(f"{label}: not PoCL, not used")
            continue
        if prefer and prefer.lower() not in label.lower():
            notes.append(f"{label}: not chosen (--pocl {prefer!r})")
            continue
        if chosen is not None:
            notes.append(f"{label}: not tried, the PoCL above is used")
            continue
        try:
            chosen = _probe(cl, platform)
            notes.append(f"{label}: works, used")
        except Exception as exc:  # noqa: BLE001 - any failure makes the platform unusable
            first = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
            notes.append(f"{label}: unusable ({type(exc).__name__}: {first[:200]})")
    if not platforms:
        notes.append("no OpenCL platform found")
    return chosen, notes


def _probe(cl: Any, platform: Any) -> PoCL:
    devices = platform.get_devices()
    if not devices:
        raise RuntimeError("the platform has no device")
    context = cl.Context(devices[:1])
    queue = cl.CommandQueue(context)
    x = np.zeros(64, dtype=np.float32)
    buffer = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, x.nbytes)
    cl.Program(context, _PROBE).build().probe(queue, x.shape, None, buffer)
    cl.enqueue_copy(queue, x, buffer, is_blocking=True)
    if not np.allclose(x, np.e):
        raise RuntimeError(f"the probe kernel computed {x[:4]}, not e")
    return PoCL(cl, platform, devices[0], context, queue)
