"""`mtwork.interpose()`: code written for MLX on a Mac runs unchanged on mtwork.

Projects call ``mx.fast.metal_kernel`` themselves, and choose their Metal path with
``mx.metal.is_available()``, often with ``mx.default_device() == mx.gpu`` too; on Linux
MLX has neither, so that code never runs. While interposed:

- ``mx.fast.metal_kernel`` makes `mtwork.metal_kernel` kernels (on the default backend:
  ``sim`` off a Mac, the GPU on one), optionally sanitizing every call; each call of such
  a kernel is counted by name in `Interposition.calls` (a call traced inside
  ``mx.compile`` counts once, when traced);
- ``mx.metal.is_available()`` answers `metal_available` (True unless told otherwise);
- ``mx.gpu`` is the device MLX runs mtwork's kernels on (`gpu_device`; by default
  ``mx.cpu`` where MLX has no Metal GPU, MLX's own ``mx.gpu`` where it has one), so
  ``mx.default_device() == mx.gpu`` holds and ``mx.new_stream(mx.gpu)``,
  ``mx.set_default_device(mx.gpu)`` and ``stream=mx.gpu`` work;
- ``mx.device_info()`` (for the GPU, or for no device: a Mac's default device is its
  GPU) and the deprecated ``mx.metal.device_info()`` describe the modelled chip
  (`mtwork.gpu.device`); the memory functions under ``mx`` and ``mx.metal`` answer as
  `memory_queries` says: limits of the modelled chip, counters of real use.

`interpose()` applies at once and returns an `Interposition`; ``with mtwork.interpose():``
undoes it at the end of the block, ``.restore()`` at any time. Limits: a kernel made
before interposition (a module that builds its kernels at import, imported earlier) stays
MLX's, and so does a name bound before it (``from mlx.core import gpu``); with ``mx.gpu``
the CPU, ``mx.gpu == mx.cpu``: code that tests ``mx.default_device() == mx.cpu`` to take a
CPU-only path takes it too, and ``mx.device_info(mx.cpu)`` describes the chip; everything
else MLX does is MLX's, on the CPU.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .gpu.catalog import default_gpu, gpu
from .gpu.chips import Chip
from .gpu.device import device_info
from .kernel import MetalKernel
from .memory_queries import ModelledMemory
from .native import ORIGINAL
from .native import metal_available as native_metal
from .sanitizer import mode

__all__ = ["Interposition", "interpose"]

_lock = threading.Lock()
_GPU = mx.DeviceType.gpu  # MLX's own, whatever ``mx.gpu`` answers


@dataclass(frozen=True, repr=False)
class InterposedKernel(MetalKernel):
    """A kernel ``mx.fast.metal_kernel`` made while interposed: its calls are counted by
    the `Interposition`, and sanitized when it says so (unless a call says otherwise)."""

    interposition: Interposition | None = field(default=None, compare=False, repr=False)

    def __call__(self, **call: Any) -> list[mx.array]:  # type: ignore[override]
        owner = self.interposition
        if owner is not None:
            owner.count(self.name)
            if owner.sanitize is not None:
                call.setdefault("sanitize", owner.sanitize)
        return super().__call__(**call)


def _replacement(function: Callable[..., Any], replaced: Callable[..., Any] | None,
                 name: str) -> Callable[..., Any]:
    """`function` as a stand-in for `replaced`, which it keeps (`mtwork.native`)."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    if replaced is not None:
        setattr(stand_in, ORIGINAL, replaced)
    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__doc__ = f"mtwork's stand-in for MLX's {name} (see mtwork.interpose)."
    return stand_in


class Interposition:
    """MLX's Metal functions replaced by mtwork's (see the module); a context manager.
    `calls`: how many times each interposed kernel was called, by name."""

    def __init__(self, *, metal_available: bool, sanitize: str | None,
                 backend: str | None, chip: Chip, gpu_device: mx.DeviceType) -> None:
        self.chip = chip
        self.metal_available = metal_available
        self.sanitize = sanitize
        self.backend = backend
        self.gpu_device = gpu_device
        self.memory = ModelledMemory(chip)
        self.calls: Counter[str] = Counter()
        self._counting = threading.Lock()
        self._replaced: list[tuple[Any, str, Any, Any]] = []
        with _lock:
            for owner, name, make in self._patches():
                before = getattr(owner, name, None)
                new = _replacement(make(before), before, name)
                self._replace(owner, name, before, new)
            if gpu_device != mx.gpu:
                self._replace(mx, "gpu", mx.gpu, gpu_device)

    def _replace(self, owner: Any, name: str, before: Any, new: Any) -> None:
        setattr(owner, name, new)
        self._replaced.append((owner, name, before, new))

    def _patches(self) -> list[tuple[Any, str, Callable[[Any], Callable[..., Any]]]]:
        patches = [
            (mx.fast, "metal_kernel", lambda _: self._metal_kernel),
            (mx.metal, "is_available", lambda _: lambda: self.metal_available),
            (mx.metal, "device_info", lambda _: lambda: dict(device_info(self.chip))),
            (mx, "device_info", self._device_info),
        ]
        for name, function in self.memory.functions().items():
            patches += [(mx, name, lambda _, f=function: f),
                        (mx.metal, name, lambda _, f=function: f)]
        return patches

    def _metal_kernel(self, name: str, input_names: Any, output_names: Any, source: str,
                      header: str = "", ensure_row_contiguous: bool = True,
                      atomic_outputs: bool = False, compile_options: Any = None,
                      **_ignored: Any) -> Any:
        return InterposedKernel(name, input_names, output_names, source, header,
                                ensure_row_contiguous, atomic_outputs, compile_options,
                                backend=self.backend, interposition=self)

    def _device_info(self, before: Callable[..., Mapping[str, Any]]) -> Callable[..., Any]:
        def info(d: Any = None) -> dict[str, Any]:
            kind = getattr(d, "type", d)
            if d is None or kind in (mx.gpu, _GPU):
                return dict(device_info(self.chip))
            return dict(before(d))

        return info

    def count(self, kernel: str) -> None:
        """One more call of interposed kernel `kernel`."""
        with self._counting:
            self.calls[kernel] += 1

    @property
    def active(self) -> bool:
        return bool(self._replaced)

    def restore(self) -> None:
        """Puts MLX's functions back (those nothing has replaced since)."""
        with _lock:
            for owner, name, before, new in reversed(self._replaced):
                if getattr(owner, name, None) is new:
                    if before is None:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, before)
            self._replaced.clear()

    def __enter__(self) -> Interposition:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "active" if self.active else "restored"
        return (f"Interposition({state}: mx.fast.metal_kernel on "
                f"{self.backend or 'the default backend'}, sanitize={self.sanitize}, "
                f"mx.metal.is_available() -> {self.metal_available}, mx.gpu -> "
                f"{self.gpu_device}, chip {self.chip.label})")


def _gpu_device(gpu_device: Any, metal_available: bool) -> mx.DeviceType:
    """What ``mx.gpu`` answers: the device given, else the one MLX runs mtwork's kernels
    on (MLX's GPU where it has one; else the CPU, unless Metal is to look absent)."""
    if gpu_device is None:
        return _GPU if native_metal() or not metal_available else mx.DeviceType.cpu
    if not isinstance(gpu_device, mx.DeviceType):
        raise TypeError(f"interpose: `gpu_device` must be mx.DeviceType.cpu or "
                        f"mx.DeviceType.gpu (or None: the device MLX runs mtwork's kernels "
                        f"on), got {gpu_device!r}")
    return gpu_device


def interpose(*, metal_available: bool = True, sanitize: bool | str | None = None,
              backend: str | None = None, chip: str | Chip | None = None,
              gpu_device: mx.DeviceType | None = None) -> Interposition:
    """Makes ``mx.fast.metal_kernel`` mtwork's and the Metal queries answer for a modelled
    chip, now (see the module); returns the `Interposition` (``with``, or ``.restore()``).

    `metal_available`: what ``mx.metal.is_available()`` answers. `sanitize`: True, "warn"
    or "report" sanitizes every call of an interposed kernel (see mtwork.sanitizer).
    `backend`: where interposed kernels run (default: mtwork's default backend).
    `chip`: the chip ``mx.device_info()`` describes (a name such as "M3 Max", or a
    `mtwork.gpu` chip; default: $MTWORK_GPU or mtwork's default chip). `gpu_device`: what
    ``mx.gpu`` answers (``mx.DeviceType.gpu`` keeps MLX's; default: the device MLX runs
    mtwork's kernels on, ``mx.cpu`` off a Mac, and MLX's own where Metal is to look
    absent)."""
    if not isinstance(metal_available, bool):
        raise TypeError(f"interpose: `metal_available` must be True or False, got "
                        f"{metal_available!r}")
    if chip is None:
        chip = default_gpu()
    elif isinstance(chip, str):
        chip = gpu(chip)
    elif not isinstance(chip, Chip):
        raise TypeError(f"interpose: `chip` must be a chip's name (such as 'M3 Max') or a "
                        f"mtwork.gpu chip, got {chip!r}")
    if backend is not None:
        from .backends import get

        get(backend)  # an unknown name is refused now, with the known ones
    return Interposition(metal_available=metal_available,
                         sanitize=None if sanitize is None else mode(sanitize),
                         backend=backend, chip=chip,
                         gpu_device=_gpu_device(gpu_device, metal_available))
