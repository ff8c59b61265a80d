"""Settings a sweep need not build: those of a compile error class already seen.

A compile error usually follows from a few parameter values (a tile that overflows a
static array, a template value the kernel's `static_assert` refuses), not from the whole
setting. When two settings fail with the same first error and share some values, every
later setting with those values is taken to fail the same way: it is recorded as
``skipped``, naming the values and the error, instead of being compiled again. One
failure alone skips nothing (its values are the whole setting).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .space import Config

__all__ = ["CompileErrorClasses", "error_class"]

_LOCATION = re.compile(r"^\S+?:\d+:\d+:\s*")


def error_class(message: str) -> str:
    """What tells compile errors apart: the first ``error:`` line without its location."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first = next((line for line in lines if "error:" in line), lines[0] if lines else "")
    return _LOCATION.sub("", first)


class CompileErrorClasses:
    """The compile errors a sweep has met, and the values each follows from."""

    def __init__(self) -> None:
        self._failed: dict[str, list[Config]] = {}

    def add(self, config: Config, message: str) -> None:
        self._failed.setdefault(error_class(message), []).append(config)

    @staticmethod
    def _shared(configs: list[Config]) -> dict[str, Any]:
        first = dict(configs[0])
        return {k: v for k, v in first.items() if all(c.get(k) == v for c in configs[1:])}

    def reason(self, config: Mapping[str, Any]) -> str | None:
        """Why `config` need not be built, or None when it must."""
        for cls, configs in self._failed.items():
            if len(configs) < 2:
                continue
            shared = self._shared(configs)
            if shared and all(config.get(k) == v for k, v in shared.items()):
                values = ", ".join(f"{k}={v}" for k, v in shared.items())
                return (f"skipped: {len(configs)} settings with {values} failed to compile "
                        f"with: {cls}")
        return None
