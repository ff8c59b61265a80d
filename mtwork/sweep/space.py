"""The space a sweep searches: configurations, parameter expressions and constraints."""

from __future__ import annotations

import ast
import difflib
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..display import callable_name, value_text
from ..errors import SweepError, UnknownParameterError
from ..limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES

__all__ = [
    "STRATEGIES",
    "Config",
    "Constraint",
    "Expression",
    "Formula",
    "as_formula",
    "canonical",
    "check_space",
    "choose",
    "constraint",
    "divides",
    "jsonable",
    "latin_hypercube",
    "threadgroup_memory_under",
    "threads_per_threadgroup_under",
    "unknown_message",
]




class Config(Mapping[str, Any]):
    """One point of the space: a read-only mapping that names the space's parameters
    when asked for one it does not have."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise UnknownParameterError(unknown_message([name], self._values)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(canonical(self._values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __str__(self) -> str:
        return ", ".join(f"{k}={value_text(v)}" for k, v in self._values.items())

    def __repr__(self) -> str:
        return f"Config({self})"


def unknown_message(names: Sequence[str], known: Mapping[str, Any] | Sequence[str]) -> str:
    known = list(known)
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"unknown parameter {', '.join(hints)}: the space has {', '.join(map(repr, known))}"
    )


def jsonable(v: Any) -> Any:
    if isinstance(v, mx.Dtype):
        return str(v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def canonical(values: Mapping[str, Any]) -> str:
    return json.dumps({k: jsonable(v) for k, v in values.items()}, sort_keys=True)


def check_space(space: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    if not isinstance(space, Mapping) or not space:
        raise SweepError("the space must be a non-empty dict of parameter name -> values")
    checked = {}
    for name, values in space.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SweepError(f"parameter names must be identifiers, got {name!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, range)):
            raise SweepError(
                f"parameter {name!r} needs a list of values, got {values!r}; "
                f"for a fixed value write [{values!r}]"
            )
        if len(values) == 0:
            raise SweepError(f"parameter {name!r} has no values")
        checked[name] = list(values)
    return checked


# --- constraints --------------------------------------------------------------------------------

_EXPRESSION_FUNCTIONS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil,
                         "floor": math.floor, "log2": math.log2}
_EXPRESSION_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Load, ast.Constant, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)


class Expression:
    """Arithmetic over parameter names, e.g. "(tm * tk + tk * tn) * 4" or "tg % 32 == 0"
    (also min, max, abs, ceil, floor, log2)."""

    def __init__(self, text: str):
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise SweepError(f"cannot parse expression {text!r}: {exc.msg}") from None
        for node in ast.walk(tree):
            bad = not isinstance(node, _EXPRESSION_NODES) or (
                isinstance(node, ast.Call)
                and not (isinstance(node.func, ast.Name)
                         and node.func.id in _EXPRESSION_FUNCTIONS)
            )
            if bad:
                raise SweepError(
                    f"expression {text!r}: only arithmetic, comparisons, parameter names and "
                    f"{', '.join(_EXPRESSION_FUNCTIONS)} are allowed; use a function "
                    "fn(config) for anything else"
                )
        self.text = text
        self.names = frozenset(
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
        ) - set(_EXPRESSION_FUNCTIONS)
        self._code = compile(tree, f"<expression {text!r}>", "eval")

    def __call__(self, config: Mapping[str, Any]) -> Any:
        values = {name: config[name] for name in self.names}
        return eval(self._code, {"__builtins__": {}, **_EXPRESSION_FUNCTIONS}, values)

    def __repr__(self) -> str:
        return repr(self.text)


Formula = str | int | Callable[[Config], Any]


def as_formula(f: Formula) -> tuple[Callable[[Config], Any], frozenset[str] | None, str]:
    """A formula as (fn(config), the names it reads when known, how to print it)."""
    if isinstance(f, str):
        expr = Expression(f)
        return expr, expr.names, repr(f)
    if callable(f):
        return f, None, callable_name(f)
    if isinstance(f, int) and not isinstance(f, bool):
        return (lambda _c: f), frozenset(), str(f)
    raise SweepError(f"expected a parameter expression, an int or a function, got {f!r}")


@dataclass(frozen=True)
class Constraint:
    """A predicate over configurations; those it rejects are not built."""

    predicate: Callable[[Config], Any]
    description: str
    parameters: frozenset[str] | None = None  # the names it reads, when known up front

    def __call__(self, config: Config) -> bool:
        return bool(self.predicate(config))

    def __str__(self) -> str:
        return self.description


def constraint(rule: Constraint | str | Callable[[Config], Any]) -> Constraint:
    """A Constraint from a predicate fn(config) -> bool or an expression string."""
    if isinstance(rule, Constraint):
        return rule
    if isinstance(rule, str):
        expr = Expression(rule)
        return Constraint(expr, repr(rule), expr.names)
    if callable(rule):
        return Constraint(rule, callable_name(rule))
    raise SweepError(f"a constraint must be a function, an expression or a Constraint: {rule!r}")


def threadgroup_memory_under(formula: Formula, limit: int = THREADGROUP_MEMORY_BYTES
                             ) -> Constraint:
    """Threadgroup memory in bytes, computed by `formula`, is at most `limit` (Apple GPUs
    give a threadgroup 32 KiB)."""
    fn, names, text = as_formula(formula)
    return Constraint(lambda c: fn(c) <= limit,
                      f"threadgroup_memory_under({text}, limit={limit})", names)


def threads_per_threadgroup_under(
    limit: int = MAX_THREADS_PER_THREADGROUP, *, key: str | Sequence[str] | Callable[[Config], Any]
) -> Constraint:
    """The threads of a threadgroup number at most `limit`. `key` names the parameter
    holding the threadgroup shape (an int or an (x, y, z) tuple), several parameters
    whose product it is, or a function config -> int or shape."""
    if isinstance(key, str):
        names: frozenset[str] | None = frozenset([key])

        def threads(c: Config) -> int:
            return product(c[key])

    elif callable(key):
        names = None

        def threads(c: Config) -> int:
            return product(key(c))

    else:
        keys = list(key)
        names = frozenset(keys)

        def threads(c: Config) -> int:
            return math.prod(product(c[k]) for k in keys)

    text = callable_name(key) if callable(key) else repr(key)
    return Constraint(lambda c: threads(c) <= limit,
                      f"threads_per_threadgroup_under({limit}, key={text})", names)


def divides(a: Formula, b: Formula) -> Constraint:
    """`a` divides `b` exactly; each is a parameter name or expression, an int or a function."""
    fa, na, ta = as_formula(a)
    fb, nb, tb = as_formula(b)
    names = None if na is None or nb is None else na | nb

    def check(c: Config) -> bool:
        x, y = fa(c), fb(c)
        return x != 0 and y % x == 0

    return Constraint(check, f"divides({ta}, {tb})", names)


def product(shape: Any) -> int:
    if isinstance(shape, (tuple, list)):
        return math.prod(int(s) for s in shape)
    return int(shape)


# --- which configurations to visit -------------------------------------------------------

STRATEGIES = ("exhaustive", "random", "latin")


def choose(candidates: Sequence[Config], params: Mapping[str, Sequence[Any]], strategy: str,
           budget: int | None, seed: int) -> list[Config]:
    """The configurations to visit, in order: all (or the first `budget`) in the space's
    order, a seeded shuffle, or a seeded Latin hypercube of `budget` of them."""
    plan = list(candidates)
    if strategy == "random":
        random.Random(seed).shuffle(plan)
    elif strategy == "latin":
        return latin_hypercube(plan, params, budget or len(plan), seed)
    return plan if budget is None else plan[:budget]


def latin_hypercube(candidates: Sequence[Config], params: Mapping[str, Sequence[Any]],
                    n: int, seed: int) -> list[Config]:
    """`n` distinct candidates that spread over every parameter's values evenly: each
    parameter's values are dealt round-robin into `n` slots and shuffled (a Latin
    hypercube on the grid), and each slot takes the unvisited candidate that agrees with
    it on the most parameters (ties broken by the seeded generator), so constraints and
    small spaces are respected."""
    rng = random.Random(seed)
    n = min(n, len(candidates))
    columns = {}
    for name, values in params.items():
        column = [values[k % len(values)] for k in range(n)]
        rng.shuffle(column)
        columns[name] = column
    left = list(candidates)
    chosen = []
    for slot in range(n):
        def agreement(c: Config, slot: int = slot) -> tuple[int, float]:
            return (sum(c[name] == columns[name][slot] for name in params), rng.random())

        best = max(left, key=agreement)
        left.remove(best)
        chosen.append(best)
    return chosen
