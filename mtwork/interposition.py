"""`mtwork.interpose()`: code written for MLX on a Mac runs unchanged on mtwork.

Projects call ``mx.fast.metal_kernel`` themselves, and choose their Metal path with
``mx.metal.is_available()``; on Linux MLX has no Metal, so that code never runs. While
interposed:

- ``mx.fast.metal_kernel`` makes `mtwork.metal_kernel` kernels (on the default backend:
  ``sim`` off a Mac, the GPU on one), optionally sanitizing every call;
- ``mx.metal.is_available()`` answers `metal_available` (True unless told otherwise);
- ``mx.device_info()`` (for the GPU, or for no device: a Mac's default device is its
  GPU) and the deprecated ``mx.metal.device_info()`` describe the modelled chip
  (`mtwork.gpu.device`); ``mx.set_wired_limit`` refuses more than that chip's
  recommended working set, as Metal does; the memory counters (``mx.metal.
  get_active_memory`` and friends) are MLX's own counts of this process's memory.

`interpose()` applies at once and returns an `Interposition`; ``with mtwork.interpose():``
undoes it at the end of the block, ``.restore()`` at any time. Limits: a kernel made
before interposition (a module that builds its kernels at import, imported earlier) stays
MLX's; code that also asks ``mx.default_device() == mx.gpu`` still sees the CPU off a
Mac; everything else MLX does is MLX's, on the CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import mlx.core as mx

from .gpu.catalog import default_gpu, gpu
from .gpu.chips import Chip
from .gpu.device import device_info
from .kernel import MetalKernel, metal_kernel
from .native import ORIGINAL, original
from .sanitizer import mode

__all__ = ["Interposition", "interpose"]

# The memory functions a Mac's code asks mx.metal for: MLX keeps them under mx as well.
_MEMORY = ("get_active_memory", "get_peak_memory", "get_cache_memory", "reset_peak_memory",
           "clear_cache", "set_cache_limit", "set_memory_limit")
_lock = threading.Lock()


class _Sanitized:
    """An interposed kernel whose calls are sanitized (unless a call says otherwise)."""

    def __init__(self, kernel: MetalKernel, sanitize: str) -> None:
        self.kernel = kernel
        self._sanitize = sanitize

    def __call__(self, **call: Any) -> list[mx.array]:
        call.setdefault("sanitize", self._sanitize)
        return self.kernel(**call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


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
    """MLX's Metal functions replaced by mtwork's (see the module); a context manager."""

    def __init__(self, *, metal_available: bool, sanitize: str | None,
                 backend: str | None, chip: Chip) -> None:
        self.chip = chip
        self.metal_available = metal_available
        self.sanitize = sanitize
        self.backend = backend
        self._wired = 0
        self._replaced: list[tuple[Any, str, Any, Any]] = []
        with _lock:
            for owner, name, make in self._patches():
                before = getattr(owner, name, None)
                new = _replacement(make(before), before, name)
                setattr(owner, name, new)
                self._replaced.append((owner, name, before, new))

    def _patches(self) -> list[tuple[Any, str, Callable[[Any], Callable[..., Any]]]]:
        patches = [
            (mx.fast, "metal_kernel", lambda _: self._metal_kernel),
            (mx.metal, "is_available", lambda _: lambda: self.metal_available),
            (mx.metal, "device_info", lambda _: lambda: dict(device_info(self.chip))),
            (mx, "device_info", self._device_info),
            (mx, "set_wired_limit", self._set_wired_limit),
            (mx.metal, "set_wired_limit", self._set_wired_limit),
        ]
        patches += [(mx.metal, name, lambda _, name=name: original(getattr(mx, name)))
                    for name in _MEMORY if not hasattr(mx.metal, name)]
        return patches

    def _metal_kernel(self, name: str, input_names: Any, output_names: Any, source: str,
                      header: str = "", ensure_row_contiguous: bool = True,
                      atomic_outputs: bool = False, compile_options: Any = None,
                      **_ignored: Any) -> Any:
        kernel = metal_kernel(name, input_names, output_names, source, header,
                              ensure_row_contiguous, atomic_outputs, compile_options,
                              backend=self.backend)
        return kernel if self.sanitize is None else _Sanitized(kernel, self.sanitize)

    def _device_info(self, before: Callable[..., Mapping[str, Any]]) -> Callable[..., Any]:
        def info(d: Any = None) -> dict[str, Any]:
            kind = getattr(d, "type", d)
            if d is None or kind == mx.gpu:
                return dict(device_info(self.chip))
            return dict(before(d))

        return info

    def _set_wired_limit(self, before: Callable[[int], int]) -> Callable[[int], int]:
        def set_wired_limit(limit: int) -> int:
            most = device_info(self.chip)["max_recommended_working_set_size"]
            if limit > most:  # type: ignore[operator]
                raise ValueError("[metal::set_wired_limit] Setting a wired limit larger than "
                                 "the maximum working set size is not allowed.")
            previous, self._wired = self._wired, int(limit)
            return previous

        return set_wired_limit

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
                f"mx.metal.is_available() -> {self.metal_available}, chip {self.chip.label})")


def interpose(*, metal_available: bool = True, sanitize: bool | str | None = None,
              backend: str | None = None, chip: str | Chip | None = None) -> Interposition:
    """Makes ``mx.fast.metal_kernel`` mtwork's and the Metal queries answer for a modelled
    chip, now (see the module); returns the `Interposition` (``with``, or ``.restore()``).

    `metal_available`: what ``mx.metal.is_available()`` answers. `sanitize`: True, "warn"
    or "report" sanitizes every call of an interposed kernel (see mtwork.sanitizer).
    `backend`: where interposed kernels run (default: mtwork's default backend).
    `chip`: the chip ``mx.device_info()`` describes (a name such as "M3 Max", or a
    `mtwork.gpu` chip; default: $MTWORK_GPU or mtwork's default chip)."""
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
                         backend=backend, chip=chip)
