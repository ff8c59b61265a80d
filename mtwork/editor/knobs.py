"""A kernel's parameter space as knobs: the values each parameter may take and the
constraints a combination must meet (as `mtwork.sweep` takes them), and the current setting.

Turning one knob to a value keeps the setting valid: when the new value breaks a
constraint with the others, the others move to the nearest valid combination (fewest
knobs changed, then the smallest steps through their value lists)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..display import value_text
from ..errors import SweepError
from ..sweep.space import Config, Constraint, constraint

Rule = Constraint | str | Callable[[Config], Any]


class Knobs:
    """The valid settings of `space` (name -> allowed values) under `constraints`, and
    the current one (`config`, by default the first valid setting; a partial dict picks
    the nearest valid one)."""

    def __init__(self, space: Mapping[str, Sequence[Any]] | None = None,
                 constraints: Sequence[Rule] = (), config: Mapping[str, Any] | None = None):
        self.space = _checked(space or {})
        self.rules = [constraint(rule) for rule in constraints]
        names = list(self.space)
        self.valid = [
            values for values in (
                dict(zip(names, combo)) for combo in itertools.product(*self.space.values())
            )
            if self._passes(values)
        ]
        if not self.valid:
            rules = ", ".join(str(r) for r in self.rules) or "none"
            raise SweepError(f"no setting of {names} meets the constraints ({rules})")
        self._config = dict(self.valid[0])
        if config:
            self.update(config)

    @property
    def names(self) -> list[str]:
        return list(self.space)

    @property
    def config(self) -> Config:
        return Config(self._config)

    def allowed(self, name: str) -> list[Any]:
        """The values of `name` that some valid setting has, in the space's order."""
        self._check_name(name)
        return [v for v in self.space[name] if any(_same(c[name], v) for c in self.valid)]

    def set(self, name: str, value: Any) -> Config:
        """Turn one knob; returns the new setting (other knobs may have moved)."""
        return self.update({name: value})

    def update(self, values: Mapping[str, Any]) -> Config:
        """Set several knobs at once; the rest move only if they must."""
        for name, value in values.items():
            self._check_name(name)
            if not any(_same(value, v) for v in self.space[name]):
                allowed = ", ".join(value_text(v) for v in self.space[name])
                raise SweepError(f"{name}={value_text(value)} is not in the space "
                                 f"({allowed})")
        matching = [c for c in self.valid
                    if all(_same(c[n], v) for n, v in values.items())]
        if not matching:
            wanted = ", ".join(f"{n}={value_text(v)}" for n, v in values.items())
            raise SweepError(f"no valid setting has {wanted}: the constraints "
                             f"({', '.join(map(str, self.rules))}) rule it out")
        self._config = dict(min(matching, key=self._distance))
        return self.config

    def label(self, value: Any) -> str:
        return value_text(value)

    def _distance(self, candidate: Mapping[str, Any]) -> tuple[int, int]:
        changed = steps = 0
        for name, values in self.space.items():
            now = _index(values, self._config[name])
            then = _index(values, candidate[name])
            changed += now != then
            steps += abs(now - then)
        return changed, steps

    def _passes(self, values: Mapping[str, Any]) -> bool:
        config = Config(values)
        try:
            return all(rule(config) for rule in self.rules)
        except SweepError:
            raise
        except Exception as exc:
            raise SweepError(f"a constraint raised {type(exc).__name__} at {config}: "
                             f"{exc}") from exc

    def _check_name(self, name: str) -> None:
        if name not in self.space:
            known = ", ".join(self.space) or "none"
            raise SweepError(f"unknown knob {name!r}; knobs: {known}")


def _checked(space: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    checked = {}
    for name, values in space.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SweepError(f"knob names must be identifiers, got {name!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, range)):
            raise SweepError(f"knob {name!r} needs a list of values, got {values!r}")
        if len(values) == 0:
            raise SweepError(f"knob {name!r} has no values")
        checked[name] = list(values)
    return checked


def _same(a: Any, b: Any) -> bool:
    """Equality that also holds for values (such as mlx dtypes) compared by identity."""
    return a is b or (type(a) is type(b) and a == b)


def _index(values: Sequence[Any], value: Any) -> int:
    return next(i for i, v in enumerate(values) if _same(v, value))
