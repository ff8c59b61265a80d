"""MLX's own Metal functions, whatever `mtwork.interpose()` has put in their place.

Interposition replaces ``mx.fast.metal_kernel`` and the Metal queries with mtwork's
(`mtwork.interpose`); each replacement keeps the function it replaced as its
``__mtwork_original__``. mtwork's own decisions (is there an Apple GPU to run on?) and
its `metal` backend must see MLX's answers, never the interposed ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

__all__ = ["ORIGINAL", "metal_available", "metal_kernel", "original"]

ORIGINAL = "__mtwork_original__"  # the attribute a replacement keeps its original in


def original(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, or the MLX function it stands in for."""
    while hasattr(function, ORIGINAL):
        function = getattr(function, ORIGINAL)
    return function


def metal_available() -> bool:
    """MLX's own answer: is there a Metal GPU?"""
    try:
        return bool(original(mx.metal.is_available)())
    except AttributeError:
        return False


def metal_kernel(*args: Any, **kwargs: Any) -> Any:
    """MLX's own ``mx.fast.metal_kernel``."""
    return original(mx.fast.metal_kernel)(*args, **kwargs)
