"""MLX's memory functions as code written for a Mac sees them under `mtwork.interpose()`.

Two kinds of answer, kept apart:

- **limits describe the modelled device**, as MLX's Metal allocator sets them
  (``mlx/backend/metal/allocator.cpp``): the memory limit starts at the smaller of 1.5
  times the recommended working set and 95% of the machine's memory, the cache limit at
  the memory limit, the wired limit at 0 (and ``set_wired_limit`` refuses more than the
  recommended working set, as Metal does). Each ``set_*`` returns the modelled limit it
  replaces. The memory and cache limits a project sets are also given to what really
  holds memory here: MLX's own allocator and mtwork's memory shared with the emulator's
  worker (its freed blocks kept up to the cache limit);
- **counters report real use**, of this process: MLX's own counts plus the memory mtwork
  shares with the emulator's worker (the outputs of isolated kernels live there, not in
  MLX's allocator). The peak is the sum of the two peaks, which bounds the true peak of
  the sum from above; ``reset_peak_memory`` and ``clear_cache`` act on both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from . import graph
from .backends import get
from .gpu.chips import Chip
from .gpu.device import device_info
from .native import original

__all__ = ["FUNCTIONS", "ModelledMemory"]

# The memory functions a Mac's code calls, under mx (and their deprecated mx.metal forms).
FUNCTIONS = ("get_active_memory", "get_peak_memory", "get_cache_memory", "reset_peak_memory",
             "clear_cache", "get_memory_limit", "set_memory_limit", "set_cache_limit",
             "set_wired_limit")


def _limit(value: Any, function: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{function}: `limit` must be a number of bytes (an int >= 0), got "
                        f"{value!r}")
    return value


def _shared() -> Any:
    """The memory shared with the emulator's worker, its freed outputs given back."""
    graph.give_back_freed()
    return get("sim").shared_memory  # type: ignore[attr-defined]


class ModelledMemory:
    """The memory functions for `chip` (see the module); `functions()` maps each name to
    its stand-in."""

    def __init__(self, chip: Chip) -> None:
        info = device_info(chip)
        self.recommended = int(info["max_recommended_working_set_size"])
        self.memory_limit = int(min(1.5 * self.recommended, 0.95 * int(info["memory_size"])))
        self.cache_limit = self.memory_limit
        self.wired_limit = 0
        self._lock = threading.Lock()

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in FUNCTIONS}

    # --- counters: real use --------------------------------------------------------------

    def get_active_memory(self) -> int:
        return int(original(mx.get_active_memory)()) + _shared().in_use

    def get_peak_memory(self) -> int:
        return int(original(mx.get_peak_memory)()) + _shared().peak

    def get_cache_memory(self) -> int:
        return int(original(mx.get_cache_memory)()) + _shared().cached

    def reset_peak_memory(self) -> None:
        original(mx.reset_peak_memory)()
        _shared().reset_peak()

    def clear_cache(self) -> None:
        original(mx.clear_cache)()
        _shared().clear_cache()

    # --- limits: the modelled device's --------------------------------------------------

    def get_memory_limit(self) -> int:
        return self.memory_limit

    def set_memory_limit(self, limit: int) -> int:
        limit = _limit(limit, "set_memory_limit")
        original(mx.set_memory_limit)(limit)
        with self._lock:
            previous, self.memory_limit = self.memory_limit, limit
        return previous

    def set_cache_limit(self, limit: int) -> int:
        limit = _limit(limit, "set_cache_limit")
        original(mx.set_cache_limit)(limit)
        _shared().set_cache_limit(limit)
        with self._lock:
            previous, self.cache_limit = self.cache_limit, limit
        return previous

    def set_wired_limit(self, limit: int) -> int:
        limit = _limit(limit, "set_wired_limit")
        if limit > self.recommended:
            raise ValueError("[metal::set_wired_limit] Setting a wired limit larger than "
                             "the maximum working set size is not allowed.")
        with self._lock:
            previous, self.wired_limit = self.wired_limit, limit
        return previous
