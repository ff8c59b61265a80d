"""What MLX's ``mx.device_info()`` says of an Apple GPU, for a modelled chip.

On a Mac, MLX answers from Metal (``mlx/backend/metal/device_info.cpp``): the device's
name, its architecture string, ``maxBufferLength``, ``recommendedMaxWorkingSetSize``,
the machine's memory (``hw.memsize``) and the GPU's resource limit (``iogpu.rsrc_limit``,
499000 when unset). `mtwork.interpose()` answers the same keys for the chip it models:

- ``device_name``: "Apple " and the chip's name, as Metal names it ("Apple M1 Max");
- ``architecture``: Metal's ``applegpu_g<generation><tier>``: generation 13 for M1, 14
  for M2, 15 for M3, 16 for M4, 17 for M5; tier ``g`` for the base chip, ``s`` Pro,
  ``c`` Max, ``d`` Ultra (the strings MLX's ``get_architecture`` reports and its
  kernels' tuning reads, e.g. "applegpu_g13s" on an M1 Pro);
- ``memory_size``: this machine's memory, which the emulator's kernels use;
- ``max_recommended_working_set_size``: three quarters of it, and ``max_buffer_length``
  half of it (estimates: Metal derives both from the machine's memory);
- ``resource_limit``: 499000, MLX's value where the system does not say.
"""

from __future__ import annotations

import os
import re

from .chips import Chip

__all__ = ["architecture", "device_info", "machine_memory"]

_GENERATIONS = {"M1": 13, "M2": 14, "M3": 15, "M4": 16, "M5": 17}
_TIERS = {"": "g", "Pro": "s", "Max": "c", "Ultra": "d"}
RESOURCE_LIMIT = 499000


def architecture(chip: Chip) -> str:
    """Metal's architecture string for `chip` ("applegpu_g15c" for an M3 Max)."""
    m = re.fullmatch(r"(M\d)(?: (Pro|Max|Ultra))?", chip.name)
    if m is None or m.group(1) not in _GENERATIONS:
        raise ValueError(f"no Metal architecture is known for chip {chip.name!r}")
    return f"applegpu_g{_GENERATIONS[m.group(1)]}{_TIERS[m.group(2) or '']}"


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 16 << 30  # a common Mac's, where the system does not say


def device_info(chip: Chip) -> dict[str, str | int]:
    """``mx.device_info()`` of `chip`, with this machine's memory (module docstring)."""
    memory = machine_memory()
    return {
        "device_name": f"Apple {chip.name}",
        "architecture": architecture(chip),
        "max_buffer_length": memory // 2,
        "max_recommended_working_set_size": memory * 3 // 4,
        "memory_size": memory,
        "resource_limit": RESOURCE_LIMIT,
    }
