"""Where kernels run: `metal` (the Apple GPU through MLX) or `sim` (the CPU emulator).

The default is `metal` where MLX has a Metal device, else `sim`; `MTWORK_BACKEND` or a
call's `backend=` argument overrides it.
"""

from __future__ import annotations

import os
from functools import cache

import mlx.core as mx

from ..errors import BackendUnavailable

NAMES = ("metal", "sim")


def _metal_reason() -> str | None:
    try:
        if mx.metal.is_available():
            return None
    except AttributeError:
        pass
    return "no Metal device: MLX reports mx.metal.is_available() == False (not an Apple GPU)"


@cache
def _sim_reason() -> str | None:
    from .sim import unavailable_reason

    return unavailable_reason()


def backends() -> dict[str, str | None]:
    """Each backend's name mapped to None when it is usable, else the reason it is not."""
    return {"metal": _metal_reason(), "sim": _sim_reason()}


def default_backend() -> str:
    chosen = os.environ.get("MTWORK_BACKEND")
    if chosen:
        return resolve(chosen)
    return "metal" if _metal_reason() is None else "sim"


def resolve(name: str | None) -> str:
    """Validates a backend name (None: the default) and checks it can run here."""
    if name is None:
        return default_backend()
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(NAMES)}")
    reason = _metal_reason() if name == "metal" else _sim_reason()
    if reason is not None:
        raise BackendUnavailable(f"backend {name!r} is not usable here: {reason}")
    return name
