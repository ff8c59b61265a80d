"""The chips mtwork knows (M1 to M5, see `chip_table.py`) and finding one by name.

Variants: a chip sold with several GPU-core counts is one entry per count. The plain name
("M2 Max") is the full configuration (38 cores); a binned one is asked for with the core
count, in the name ("M2 Max 30-core", "m2max30") or as `gpu("M2 Max", cores=30)`.

The default GPU (`MTWORK_GPU` unset) is the 32-core M1 Max: philipturner/metal-benchmarks
measured the instruction throughputs, occupancy behaviour and caches the model is built on
on that chip, so it is the entry with the fewest estimates.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from .chip_table import CHIPS
from .chips import Chip

__all__ = ["DEFAULT_GPU", "ENV_VAR", "chip_names", "chips", "default_gpu", "gpu"]

ENV_VAR = "MTWORK_GPU"
DEFAULT_GPU = "M1 Max"


def chips() -> tuple[Chip, ...]:
    """Every known configuration, in table order."""
    return CHIPS


def chip_names() -> tuple[str, ...]:
    """The known chip names with their GPU-core counts, e.g. "M2 Max (30 or 38 cores)"."""
    counts: dict[str, list[int]] = {}
    for chip in chips():
        counts.setdefault(chip.name, []).append(chip.gpu_cores)
    return tuple(f"{name} ({' or '.join(str(c) for c in sorted(cores))} cores)"
                 for name, cores in counts.items())


_CORES_SUFFIX = re.compile(r"^(?P<cores>\d+)?(?:c|core|cores|coregpu|gpu)?$")


def gpu(name: str, cores: int | None = None) -> Chip:
    """The chip called `name`: "M2 Max", "m2max", "M2-Max" all work; a binned variant by
    its core count, in the name ("M2 Max 30-core") or as `cores`. Without a count, the
    full configuration."""
    if not isinstance(name, str):
        raise TypeError(f"gpu(name=...) must be a string like 'M2 Max', got {name!r}")
    wanted_key = _key(name)
    # The longest known name the key starts with ("m2max" before "m2"), then a core count.
    for chip_key in sorted({_key(c.name) for c in chips()}, key=len, reverse=True):
        suffix = _CORES_SUFFIX.match(wanted_key[len(chip_key):])
        if wanted_key.startswith(chip_key) and suffix:
            break
    else:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(chip_names())}")
    known = [c for c in chips() if _key(c.name) == chip_key]
    in_name = int(suffix["cores"]) if suffix["cores"] else None
    if cores is not None and in_name is not None and cores != in_name:
        raise ValueError(f"gpu({name!r}, cores={cores}): the name says {in_name} cores")
    wanted = cores if cores is not None else in_name
    if wanted is None:
        return max(known, key=lambda c: c.gpu_cores)
    for chip in known:
        if chip.gpu_cores == wanted:
            return chip
    offered = " or ".join(str(c.gpu_cores) for c in known)
    raise ValueError(f"{known[0].name} comes with {offered} GPU cores, not {wanted}")


def default_gpu() -> Chip:
    """The chip named by `MTWORK_GPU`, else the 32-core M1 Max (the best-measured entry)."""
    return _named_by_env(os.environ.get(ENV_VAR, "").strip())


@lru_cache(maxsize=16)  # asked for at every profiled dispatch; a lookup takes a millisecond
def _named_by_env(value: str) -> Chip:
    if not value:
        return gpu(DEFAULT_GPU)
    try:
        return gpu(value)
    except ValueError as error:
        raise ValueError(f"{ENV_VAR}={value!r} is not a known GPU: {error}") from None


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())
