"""Parameter sweeps: build every configuration of a kernel, check it against an oracle,
time it, and keep going when a configuration fails.

A sweep takes a `build(config)` function and a space of parameter values::

    def build(c):
        return Launch(
            kernel,                                     # an mtwork.metal_kernel
            grid=(n // c["items"], 1, 1),
            threadgroup=(c["tg"], 1, 1),                # threadgroup shape
            template=[("T", mx.float32), ("ITEMS", c["items"])],   # template values
            defines={"UNROLL": c["unroll"]},            # constants: #define lines
            output_shapes=[(n,)], output_dtypes=[mx.float32],
        )

    result = sweep(build, {"tg": [32, 64, 128], "items": [1, 2, 4], "unroll": [1, 4]},
                   inputs=[x], oracle=lambda x: 2 * np.asarray(x, np.float64),
                   constraints=[divides("tg * items", n)], cache="scale.jsonl")
    result.best()

`build` may also return any callable: it is called with the sweep's `inputs` and returns
the outputs (an array, or a list/tuple/dict of arrays). A `Launch` is better where it
fits: the sweep runs it on the backend whose clock it reports.

Per configuration, in order: build, compute the oracle (once for the sweep, or per
configuration when the oracle takes a `config` argument), first call (it includes the
compile, and is timed apart), `mtwork.oracle.diff` of every output against the
oracle's, then `timing.bench`. Outcomes are recorded, never raised: `ok`; `wrong` (the
diff failed; not timed); `compile_error` (`mtwork.CompileError`); `fault`
(`mtwork.KernelFault` and subclasses: deadlock, timeout, threadgroup memory);
`oracle_error` (a per-configuration oracle raised); `error` (anything else, e.g. a
launch the kernel API rejects). Mistakes in the sweep itself (an unknown parameter name,
an empty space, an oracle that raises before anything ran) raise `SweepError`.

With `cache=path` every finished configuration is appended to a JSON-lines file at
once, keyed by a hash of the sweep's identity (by default the source of `build`, of the
kernels and strings it refers to, and of the oracle; or `key=`), the inputs' shapes and
dtypes, the backend, the timing settings and the configuration. A sweep stopped with
Ctrl-C keeps what it finished and the same call resumes; a repeated sweep is served from
the file.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import html
import inspect
import itertools
import json
import math
import os
import random
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import numpy as np

from . import dtypes
from .errors import CompileError, KernelFault, MtworkError
from .kernel import MetalKernel
from .oracle import DiffReport, diff
from .timing import (
    Clock,
    Measurement,
    TimeUnit,
    _text_table,
    bench,
    clock_for,
    output_arrays,
    wait_for,
)

Status = Literal["ok", "wrong", "compile_error", "fault", "oracle_error", "error"]
FAILED: tuple[Status, ...] = ("wrong", "compile_error", "fault", "oracle_error", "error")
TIME_OBJECTIVES = {"time": "median", "median": "median", "min": "min", "p95": "p95",
                   "mean": "mean"}
CACHE_FORMAT = 1


class SweepError(MtworkError, ValueError):
    """The sweep itself is set up wrong (not one configuration's failure)."""


class UnknownParameterError(SweepError, KeyError):
    """A constraint, build or metric asked for a parameter the space does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class OracleError(SweepError):
    """The oracle raised before any configuration could be checked."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep. `result` holds the configurations that finished (they are
    in the cache file too, when there is one)."""

    def __init__(self, message: str, result: SweepResult):
        super().__init__(message)
        self.result = result


# --- configurations ---------------------------------------------------------------------------


class Config(Mapping[str, Any]):
    """One point of the space: a read-only mapping that names the space's parameters
    when asked for one it does not have."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise UnknownParameterError(_unknown_message([name], self._values)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(_canonical(self._values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __str__(self) -> str:
        return ", ".join(f"{k}={_value_text(v)}" for k, v in self._values.items())

    def __repr__(self) -> str:
        return f"Config({self})"


def _unknown_message(names: Sequence[str], known: Mapping[str, Any] | Sequence[str]) -> str:
    known = list(known)
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"unknown parameter {', '.join(hints)}: the space has {', '.join(map(repr, known))}"
    )


def _value_text(v: Any) -> str:
    if isinstance(v, mx.Dtype):
        return str(v).rsplit(".", 1)[-1]
    return repr(v) if isinstance(v, str) else str(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, mx.Dtype):
        return str(v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def _canonical(values: Mapping[str, Any]) -> str:
    return json.dumps({k: _jsonable(v) for k, v in values.items()}, sort_keys=True)


def _check_space(space: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
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


def _formula(f: Formula) -> tuple[Callable[[Config], Any], frozenset[str] | None, str]:
    """A formula as (fn(config), the names it reads when known, how to print it)."""
    if isinstance(f, str):
        expr = Expression(f)
        return expr, expr.names, repr(f)
    if callable(f):
        return f, None, _callable_name(f)
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
        return Constraint(rule, _callable_name(rule))
    raise SweepError(f"a constraint must be a function, an expression or a Constraint: {rule!r}")


def threadgroup_memory_under(formula: Formula, limit: int = 32768) -> Constraint:
    """Threadgroup memory in bytes, computed by `formula`, is at most `limit` (Apple GPUs
    give a threadgroup 32 KiB)."""
    fn, names, text = _formula(formula)
    return Constraint(lambda c: fn(c) <= limit,
                      f"threadgroup_memory_under({text}, limit={limit})", names)


def threads_per_threadgroup_under(
    limit: int = 1024, *, key: str | Sequence[str] | Callable[[Config], Any]
) -> Constraint:
    """The threads of a threadgroup number at most `limit`. `key` names the parameter
    holding the threadgroup shape (an int or an (x, y, z) tuple), several parameters
    whose product it is, or a function config -> int or shape."""
    if isinstance(key, str):
        names: frozenset[str] | None = frozenset([key])

        def threads(c: Config) -> int:
            return _product(c[key])

    elif callable(key):
        names = None

        def threads(c: Config) -> int:
            return _product(key(c))

    else:
        keys = list(key)
        names = frozenset(keys)

        def threads(c: Config) -> int:
            return math.prod(_product(c[k]) for k in keys)

    text = _callable_name(key) if callable(key) else repr(key)
    return Constraint(lambda c: threads(c) <= limit,
                      f"threads_per_threadgroup_under({limit}, key={text})", names)


def divides(a: Formula, b: Formula) -> Constraint:
    """`a` divides `b` exactly; each is a parameter name or expression, an int or a function."""
    fa, na, ta = _formula(a)
    fb, nb, tb = _formula(b)
    names = None if na is None or nb is None else na | nb

    def check(c: Config) -> bool:
        x, y = fa(c), fb(c)
        return x != 0 and y % x == 0

    return Constraint(check, f"divides({ta}, {tb})", names)


def _product(shape: Any) -> int:
    if isinstance(shape, (tuple, list)):
        return math.prod(int(s) for s in shape)
    return int(shape)


def _callable_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if name != "<lambda>":
        return name
    try:
        text = inspect.getsource(fn).strip()
    except (OSError, TypeError):
        return name
    start = text.find("lambda")
    return " ".join(text[start:].split())[:80] if start >= 0 else name


# --- what a configuration builds ----------------------------------------------------------------


@dataclass
class Launch:
    """One call of an `mtwork.metal_kernel`, with its template values, `#define`d
    constants and dispatch shape. Calling it runs the kernel: `launch(*inputs,
    backend=...)`; without inputs it uses `inputs` given here.

    `defines` become `#define NAME value` lines at the top of the header, so the kernel
    body and header can use them as constants (on `metal` as on `sim`). Header lines in
    compiler messages are then shifted by the number of defines; body lines are not.
    """

    kernel: MetalKernel
    grid: Sequence[int]
    threadgroup: Sequence[int]
    output_shapes: Sequence[Sequence[int]]
    output_dtypes: Sequence[mx.Dtype]
    inputs: Sequence[Any] | None = None
    template: Sequence[tuple[str, Any]] | None = None
    defines: Mapping[str, Any] | None = None
    init_value: float | None = None
    timeout: float | None = None

    @cached_property
    def defined_kernel(self) -> MetalKernel:
        """The kernel with `defines` written into its header."""
        if not self.defines:
            return self.kernel
        k = self.kernel
        return MetalKernel(
            k.name, k.input_names, k.output_names, k.source,
            header=define_lines(self.defines) + k.header,
            ensure_row_contiguous=k.ensure_row_contiguous, atomic_outputs=k.atomic_outputs,
            compile_options=k.compile_options, backend=k.backend,
        )

    def __call__(self, *inputs: Any, backend: str | None = None) -> list[mx.array]:
        arrays = list(inputs) if inputs else list(self.inputs or [])
        return self.defined_kernel(
            inputs=arrays, grid=self.grid, threadgroup=self.threadgroup,
            output_shapes=self.output_shapes, output_dtypes=self.output_dtypes,
            template=self.template, init_value=self.init_value, backend=backend,
            timeout=self.timeout,
        )


def define_lines(defines: Mapping[str, Any]) -> str:
    """`#define` lines for constants: ints, floats (as float literals), bools, mlx dtypes
    (as their Metal type) or strings (pasted as they are)."""
    lines = []
    for name, value in defines.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SweepError(f"define names must be identifiers, got {name!r}")
        lines.append(f"#define {name} {_define_text(name, value)}\n")
    return "".join(lines)


def _define_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise SweepError(f"define {name}={value!r}: only finite floats can be written")
        return f"{float(value)!r}f"
    if isinstance(value, mx.Dtype):
        return dtypes.type_string(value)
    if isinstance(value, str):
        return value
    raise SweepError(f"define {name}={value!r}: use an int, float, bool, mlx dtype or str")


# --- records and results ----------------------------------------------------------------------


@dataclass
class Record:
    """What happened to one configuration."""

    config: Config
    status: Status
    measurement: Measurement | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    diffs: list[DiffReport] = field(default_factory=list)
    error_type: str | None = None
    message: str | None = None
    first_call_s: float | None = None  # the first call, compile included; not a sample
    cached: bool = False
    key: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def time(self) -> float | None:
        """Median time in seconds (None unless the configuration passed)."""
        return None if self.measurement is None else self.measurement.median

    def value(self, objective: str) -> float | None:
        """The objective's value: a time statistic ("time" is the median) or a metric."""
        if objective in TIME_OBJECTIVES:
            if self.measurement is None:
                return None
            return getattr(self.measurement, TIME_OBJECTIVES[objective])
        return self.metrics.get(objective)

    @property
    def check(self) -> str:
        """Short oracle verdict, e.g. "PASS ULP≤2" or "FAIL 7/384"."""
        if not self.diffs:
            return "—"
        bad = [d for d in self.diffs if not d.ok]
        if bad:
            return f"FAIL {sum(d.n_mismatch for d in bad)}/{sum(d.size for d in self.diffs)}"
        ulps = [d.max_ulp for d in self.diffs if d.max_ulp is not None]
        return f"PASS ULP≤{max(ulps)}" if ulps else "PASS"

    @property
    def short_message(self) -> str:
        return _short(self.message) if self.message else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CACHE_FORMAT,
            "key": self.key,
            "config": {k: _jsonable(v) for k, v in self.config.items()},
            "status": self.status,
            "measurement": None if self.measurement is None else self.measurement.to_dict(),
            "metrics": self.metrics,
            "diffs": [d.to_dict() for d in self.diffs],
            "error_type": self.error_type,
            "message": self.message,
            "first_call_s": self.first_call_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: Config) -> Record:
        m = data.get("measurement")
        return cls(
            config=config,
            status=data["status"],
            measurement=None if m is None else Measurement.from_dict(m),
            metrics=dict(data.get("metrics") or {}),
            diffs=[DiffReport.from_dict(d) for d in data.get("diffs") or []],
            error_type=data.get("error_type"),
            message=data.get("message"),
            first_call_s=data.get("first_call_s"),
            cached=True,
            key=data["key"],
        )


def _short(message: str, width: int = 110) -> str:
    """The line of a message that says most: the first compiler error, else the first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    chosen = next((line for line in lines if "error:" in line), lines[0] if lines else "")
    return chosen if len(chosen) <= width else chosen[: width - 1] + "…"


@dataclass
class SweepResult:
    """The records of a sweep, in the order they were visited."""

    records: list[Record]
    parameters: tuple[str, ...]
    clock: Clock
    objective: str = "time"
    maximize: bool = False
    candidates: int = 0  # configurations left after constraints
    space_size: int = 0  # configurations before constraints
    stopped: str = "complete"  # or "budget", "time budget", "interrupted"
    cache_path: str | None = None
    values: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # the space, in order

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.ok]

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if not r.ok]

    def counts(self) -> dict[str, int]:
        counts = Counter(r.status for r in self.records)
        return {s: counts[s] for s in ("ok", *FAILED) if counts[s]}

    def ranked(self, objective: str | None = None, *, maximize: bool | None = None
               ) -> list[Record]:
        """Passing records, best first."""
        objective, maximize = self._direction(objective, maximize)
        scored = [r for r in self.ok if r.value(objective) is not None]
        return sorted(scored, key=lambda r: r.value(objective), reverse=maximize)

    def best(self, objective: str | None = None, *, maximize: bool | None = None) -> Record:
        """The passing configuration with the best objective (default: the sweep's)."""
        ranked = self.ranked(objective, maximize=maximize)
        if not ranked:
            counts = ", ".join(f"{n} {s}" for s, n in self.counts().items()) or "none ran"
            raise SweepError(f"no configuration passed ({counts}); see the failures above")
        return ranked[0]

    def _direction(self, objective: str | None, maximize: bool | None) -> tuple[str, bool]:
        objective = objective or self.objective
        if maximize is None:
            maximize = self.maximize if objective == self.objective else False
        known = set(TIME_OBJECTIVES) | {k for r in self.records for k in r.metrics}
        if objective not in known:
            raise SweepError(
                f"unknown objective {objective!r}: use one of {', '.join(sorted(known))}"
            )
        return objective, maximize

    def to_dataframe(self) -> Any:
        """One row per configuration (pandas needed)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "SweepResult.to_dataframe needs pandas, which is not installed: "
                "pip install pandas (or use result.records)"
            ) from None
        return pd.DataFrame([self._row(r) for r in self.records])

    def _row(self, r: Record) -> dict[str, Any]:
        row: dict[str, Any] = dict(r.config)
        m = r.measurement
        row.update(
            status=r.status,
            time=None if m is None else m.median,
            time_min=None if m is None else m.min,
            time_p95=None if m is None else m.p95,
            time_mean=None if m is None else m.mean,
            time_cv=None if m is None else m.cv,
            unstable=None if m is None else m.unstable,
        )
        row.update(r.metrics)
        reports = r.diffs
        row.update(
            check=r.check,
            max_abs_err=max((d.max_abs_err for d in reports if d.max_abs_err is not None),
                            default=None),
            max_ulp=max((d.max_ulp for d in reports if d.max_ulp is not None), default=None),
            error_type=r.error_type,
            message=r.short_message or None,
            first_call_s=r.first_call_s,
            cached=r.cached,
        )
        return row

    # --- text and HTML

    def _headline(self) -> list[str]:
        visited = f"{len(self.records)} of {self.candidates} configurations"
        if self.space_size != self.candidates:
            visited += f" ({self.space_size} before constraints)"
        stop = "" if self.stopped == "complete" else f"; stopped: {self.stopped}"
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items())
        cached = sum(r.cached for r in self.records)
        lines = [f"Sweep of {visited} — {self.clock.label}",
                 f"{counts}; {cached} from the cache{stop}"]
        direction = "higher" if self.maximize else "lower"
        if self.ranked():
            b = self.best()
            lines.append(f"best by {self.objective} ({direction} is better): {b.config} — "
                         f"{self._objective_text(b)}")
        return lines

    def _objective_text(self, r: Record) -> str:
        v = r.value(self.objective)
        if v is None:
            return "—"
        if self.objective in TIME_OBJECTIVES:
            return TimeUnit.for_seconds(v).format(v)
        return f"{v:.4g}"

    def _table(self) -> tuple[list[str], list[tuple[list[str], str]]]:
        metric_names = list(dict.fromkeys(k for r in self.records for k in r.metrics))
        header = [*self.parameters, "status", "median", "min", "CV", *metric_names, "check",
                  "note"]
        ranked_ok = {id(r) for r in self.ranked()}
        order = self.ranked() + [r for r in self.records if id(r) not in ranked_ok]
        times = [r.time for r in self.ok if r.time is not None]
        unit = TimeUnit.for_seconds(min(times)) if times else TimeUnit("s", 1.0)
        rows = []
        for r in order:
            m = r.measurement
            cells = [_value_text(r.config[p]) for p in self.parameters] + [r.status]
            if m is None:
                cells += ["—", "—", "—"]
            else:
                cv = "n/a" if m.cv is None else f"{m.cv:.1%}" + ("*" if m.unstable else "")
                cells += [unit.format(m.median), unit.format(m.min), cv]
            cells += [f"{r.metrics[k]:.4g}" if k in r.metrics else "—" for k in metric_names]
            note = r.short_message or ("from cache" if r.cached else "")
            cells += [r.check, note]
            rows.append((cells, r.status))
        return header, rows

    def __str__(self) -> str:
        header, rows = self._table()
        lines = self._headline() + [""] + _text_table(header, [c for c, _ in rows])
        if any(r.measurement is not None and r.measurement.unstable for r in self.records):
            lines.append("* unstable: coefficient of variation above the threshold")
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items())
        return f"<SweepResult {len(self.records)} configurations ({counts}); {self.clock.label}>"

    def _repr_html_(self) -> str:
        header, rows = self._table()
        cell = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
        colours = {"ok": "#1a7f37", "wrong": "#cf222e", "fault": "#cf222e",
                   "compile_error": "#9a6700", "oracle_error": "#8250df", "error": "#cf222e"}
        status_col = len(self.parameters)
        body = []
        for cells, status in rows:
            tds = []
            for i, c in enumerate(cells):
                style = cell + (f";color:{colours[status]};font-weight:bold"
                                if i == status_col else "")
                tds.append(f'<td style="{style}">{html.escape(c)}</td>')
            body.append("<tr>" + "".join(tds) + "</tr>")
        head = "".join(f'<th style="{cell}">{html.escape(h)}</th>' for h in header)
        first, *rest = self._headline()
        return (
            '<div style="font-family:sans-serif;font-size:0.9em">'
            f'<div style="font-weight:bold">{html.escape(first)}</div>'
            f'<div>{"<br>".join(html.escape(line) for line in rest)}</div>'
            f'<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}</table>'
            "</div>"
        )


# --- the cache file --------------------------------------------------------------------------


class _CacheFile:
    """JSON lines, one finished configuration each, appended and flushed at once."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when a run was killed mid-write
                if isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT:
                    self.entries[entry["key"]] = entry

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = record.to_dict()
        with open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # finish a line cut short by a killed run
                    f.write(b"\n")
            f.write((json.dumps(entry) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.entries[record.key] = entry


def _identity(*objects: Any) -> str:
    """A digest of what the sweep runs: sources of functions and of the kernels and
    constants they refer to (globals and closures, following plain functions)."""
    h = hashlib.sha256()
    seen: set[int] = set()
    for obj in objects:
        for part in _identity_parts(obj, seen, depth=0):
            h.update(part.encode())
            h.update(b"\0")
    return h.hexdigest()[:24]


def _identity_parts(obj: Any, seen: set[int], depth: int) -> Iterator[str]:
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, MetalKernel):
        yield repr((obj.name, obj.input_names, obj.output_names, obj.source, obj.header,
                    obj.ensure_row_contiguous, obj.atomic_outputs, obj.compile_options))
    elif isinstance(obj, (str, bytes, int, float, bool, type(None), mx.Dtype)):
        yield repr(obj)
    elif isinstance(obj, (tuple, list, frozenset)):
        for item in obj:
            yield from _identity_parts(item, seen, depth + 1)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield repr(k)
            yield from _identity_parts(v, seen, depth + 1)
    elif isinstance(obj, types.FunctionType):
        yield f"{obj.__module__}.{obj.__qualname__}"
        try:
            yield inspect.getsource(obj)
        except (OSError, TypeError):
            yield obj.__code__.co_code.hex()
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                value = obj.__globals__[name]
                if not isinstance(value, types.ModuleType):
                    yield name
                    yield from _identity_parts(value, seen, depth + 1)
        for cell in obj.__closure__ or ():
            try:
                yield from _identity_parts(cell.cell_contents, seen, depth + 1)
            except ValueError:  # an empty cell
                continue
    elif callable(obj):
        yield f"{type(obj).__module__}.{type(obj).__qualname__}"


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def _inputs_signature(inputs: Sequence[Any]) -> list[str]:
    """Shapes and dtypes of the inputs (not their values: hashing those would make
    every fresh random input a cache miss)."""
    signature = []
    for x in inputs:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        signature.append(repr(x) if shape is None else f"{tuple(shape)} {dtype}")
    return signature


def _record_key(identity: str, backend: str, rounds: int, warmup: int, config: Config) -> str:
    text = json.dumps([identity, backend, rounds, warmup, _canonical(config)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- running one configuration ------------------------------------------------------------------


@dataclass
class _Runner:
    build: Callable[[Config], Any]
    inputs: Sequence[Any]
    oracle: Any
    diff_options: Mapping[str, Any]
    metrics: Mapping[str, Callable[[Config, Measurement], float]]
    clock: Clock
    rounds: int
    warmup: int
    _expected: Any = None
    _have_expected: bool = False

    @property
    def oracle_per_config(self) -> bool:
        if not callable(self.oracle):
            return False
        try:
            return "config" in inspect.signature(self.oracle).parameters
        except (TypeError, ValueError):
            return False

    def expected_once(self) -> Any:
        """The oracle's outputs, computed at the first configuration that needs them."""
        if not self._have_expected:
            if callable(self.oracle):
                try:
                    self._expected = self.oracle(*self.inputs)
                except Exception as exc:  # noqa: BLE001 - any oracle failure stops the sweep
                    raise OracleError(
                        f"the oracle {_callable_name(self.oracle)} raised "
                        f"{type(exc).__name__}: {exc}. Nothing was checked; fix the oracle "
                        "(or pass oracle=None to sweep without checking)"
                    ) from exc
            else:
                self._expected = self.oracle
            self._have_expected = True
        return self._expected

    def run(self, config: Config, key: str) -> Record:
        record = Record(config=config, status="ok", key=key)
        try:
            fn = self._callable(self.build(config))
        except UnknownParameterError as exc:
            raise _named(exc, "build(config)") from None
        except Exception as exc:  # noqa: BLE001 - a failed build is this config's outcome
            return _failed(record, exc)

        expected = None
        if self.oracle is not None:
            if self.oracle_per_config:
                try:
                    expected = self.oracle(*self.inputs, config=config)
                except UnknownParameterError as exc:
                    raise _named(exc, "the oracle") from None
                except Exception as exc:  # noqa: BLE001
                    record.status = "oracle_error"
                    record.error_type = type(exc).__name__
                    record.message = f"the oracle raised {type(exc).__name__}: {exc}"
                    return record
            else:
                expected = self.expected_once()

        start = time.perf_counter()
        try:
            outputs = fn()
            wait_for(outputs, self.clock.backend)
        except UnknownParameterError:
            raise
        except Exception as exc:  # noqa: BLE001
            return _failed(record, exc)
        record.first_call_s = time.perf_counter() - start

        if self.oracle is not None:
            wrong = self._check(record, outputs, expected)
            if wrong:
                return record

        try:
            record.measurement = bench(fn, warmup=self.warmup, rounds=self.rounds,
                                       backend=self.clock.backend)
        except UnknownParameterError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a fault that shows up only later
            return _failed(record, exc)
        for name, metric in self.metrics.items():
            try:
                record.metrics[name] = float(metric(config, record.measurement))
            except UnknownParameterError as exc:
                raise _named(exc, f"metric {name!r}") from None
            except Exception as exc:
                raise SweepError(
                    f"metric {name!r} raised {type(exc).__name__} for {config}: {exc}"
                ) from exc
        return record

    def _callable(self, built: Any) -> Callable[[], Any]:
        if isinstance(built, Launch):
            backend = self.clock.backend
            return lambda: built(*self.inputs, backend=backend)
        if not callable(built):
            raise SweepError(
                f"build(config) must return a Launch or a callable, got {type(built).__name__}"
            )
        return lambda: built(*self.inputs)

    def _check(self, record: Record, outputs: Any, expected: Any) -> bool:
        """Diff outputs against the oracle; True (and the record marked) when wrong."""
        got, want = output_arrays(outputs), output_arrays(expected)
        if len(got) != len(want):
            record.status = "wrong"
            record.message = (f"the kernel returned {len(got)} outputs, the oracle "
                              f"{len(want)}")
            return True
        try:
            record.diffs = [
                diff(a, e, name=f"output {i}", **self.diff_options)
                for i, (a, e) in enumerate(zip(got, want))
            ]
        except ValueError as exc:  # e.g. shapes that do not match
            record.status = "wrong"
            record.error_type = type(exc).__name__
            record.message = str(exc)
            return True
        bad = [d for d in record.diffs if not d.ok]
        if bad:
            record.status = "wrong"
            record.message = "; ".join(
                f"{d.name}: {d.n_mismatch}/{d.size} mismatches"
                + ("" if d.max_abs_err is None else f", max abs err {d.max_abs_err:.3g}")
                for d in bad
            )
            return True
        return False


def _named(exc: UnknownParameterError, who: str) -> UnknownParameterError:
    return UnknownParameterError(f"{who} asked for an {exc}")


def _failed(record: Record, exc: Exception) -> Record:
    if isinstance(exc, SweepError):
        raise exc
    if isinstance(exc, CompileError):
        record.status = "compile_error"
    elif isinstance(exc, KernelFault):
        record.status = "fault"
    else:
        record.status = "error"
    record.error_type = type(exc).__name__
    record.message = str(exc)
    return record


# --- the sweep ------------------------------------------------------------------------------------


def sweep(
    build: Callable[[Config], Any],
    space: Mapping[str, Sequence[Any]],
    *,
    inputs: Sequence[Any] = (),
    oracle: Any = None,
    diff_options: Mapping[str, Any] | None = None,
    constraints: Sequence[Constraint | str | Callable[[Config], Any]] = (),
    strategy: Literal["exhaustive", "random"] = "exhaustive",
    budget: int | None = None,
    time_budget: float | None = None,
    objective: str = "time",
    maximize: bool = False,
    metrics: Mapping[str, Callable[[Config, Measurement], float]] | None = None,
    cache: str | os.PathLike | None = None,
    key: str | None = None,
    backend: str | None = None,
    seed: int = 0,
    rounds: int = 5,
    warmup: int = 1,
    progress: bool = True,
) -> SweepResult:
    """Build, check and time every configuration of `space` that passes `constraints`.

    - `build(config)` returns a `Launch` or a callable taking `inputs`; see the module doc.
    - `oracle`: expected outputs, or a function of `inputs` giving them (computed once), or
      one that also takes a `config=` keyword (computed per configuration). None: no check.
      `diff_options` go to `mtwork.oracle.diff` (atol, rtol, bitwise, dtype).
    - `constraints`: predicates fn(config) -> bool, expression strings such as
      "tg % 32 == 0", or the ready-made `threadgroup_memory_under`,
      `threads_per_threadgroup_under` and `divides`.
    - `strategy`: "exhaustive" (in the space's order) or "random" (shuffled with `seed`);
      `budget` caps the configurations visited (cached ones count), `time_budget` the
      seconds spent (no new configuration starts after it).
    - `objective`: "time" (median; or "min", "p95", "mean") or a name in `metrics`, a dict
      of fn(config, measurement) -> float; `maximize=True` for metrics such as GB/s.
    - `cache`: a JSON-lines file to resume from and append to; `key` names the sweep's
      identity there (default: a digest of `build`'s and the oracle's sources and what
      they refer to; pass a version string when the kernel's source comes from elsewhere).
    - `backend`: the clock and the backend `Launch`es run on (default: the default one).
    - `rounds`, `warmup`: as in `timing.bench`, after the first call.
    """
    params = _check_space(space)
    rules = [constraint(c) for c in constraints]
    _check_rule_names(rules, params)
    if strategy not in ("exhaustive", "random"):
        raise SweepError(f"strategy must be 'exhaustive' or 'random', not {strategy!r}")
    if budget is not None and budget < 1:
        raise SweepError(f"budget must be at least 1 configuration, got {budget}")
    metrics = dict(metrics or {})
    if objective not in TIME_OBJECTIVES and objective not in metrics:
        raise SweepError(
            f"objective {objective!r} is neither a time ({', '.join(TIME_OBJECTIVES)}) nor "
            f"one of the metrics ({', '.join(metrics) or 'none given'})"
        )
    clock = clock_for(backend)

    every = [Config(dict(zip(params, values))) for values in itertools.product(*params.values())]
    candidates = [c for c in every if all(_passes(rule, c) for rule in rules)]
    if not candidates:
        raise SweepError(_empty_space_message(every, rules))
    plan = list(candidates)
    if strategy == "random":
        random.Random(seed).shuffle(plan)
    if budget is not None:
        plan = plan[:budget]

    identity = json.dumps([key if key is not None else _identity(build, oracle),
                           _inputs_signature(inputs)])
    cache_file = None if cache is None else _CacheFile(cache)
    runner = _Runner(build, list(inputs), oracle, dict(diff_options or {}), metrics, clock,
                     rounds, warmup)
    result = SweepResult([], tuple(params), clock, objective, maximize, len(candidates),
                         len(every), cache_path=None if cache is None else str(cache),
                         values={name: tuple(vs) for name, vs in params.items()})

    from tqdm.auto import tqdm

    bar = tqdm(total=len(plan), desc="sweep", unit="config", disable=not progress)
    started = time.perf_counter()
    try:
        for config in plan:
            record_key = _record_key(identity, clock.backend, rounds, warmup, config)
            if cache_file is not None and record_key in cache_file.entries:
                record = Record.from_dict(cache_file.entries[record_key], config)
            else:
                if time_budget is not None and time.perf_counter() - started >= time_budget:
                    result.stopped = "time budget"
                    break
                bar.set_description(f"sweep {config}")
                record = runner.run(config, record_key)
                if cache_file is not None:
                    cache_file.append(record)
            result.records.append(record)
            bar.update()
            bar.set_postfix_str(_progress_text(result), refresh=False)
        else:
            if len(plan) < len(candidates):
                result.stopped = "budget"
    except KeyboardInterrupt as exc:
        result.stopped = "interrupted"
        bar.close()
        where = (f"; they are in {cache}, and the same call resumes from there"
                 if cache is not None else "")
        raise SweepInterrupted(
            f"sweep interrupted after {len(result.records)} of {len(plan)} configurations: "
            f"the finished ones are in the exception's .result{where}",
            result,
        ) from exc
    bar.set_description("sweep")
    bar.close()
    return result


def _progress_text(result: SweepResult) -> str:
    counts = result.counts()
    failed = sum(n for s, n in counts.items() if s != "ok")
    text = f"ok={counts.get('ok', 0)} failed={failed}"
    if result.ranked():
        text += f" best={result._objective_text(result.best())}"
    return text


def _passes(rule: Constraint, config: Config) -> bool:
    try:
        return rule(config)
    except UnknownParameterError as exc:
        raise _named(exc, f"constraint {rule}") from None


def _check_rule_names(rules: Sequence[Constraint], params: Mapping[str, Any]) -> None:
    for rule in rules:
        unknown = sorted((rule.parameters or frozenset()) - set(params))
        if unknown:
            raise UnknownParameterError(
                f"constraint {rule} asked for an " + _unknown_message(unknown, params)
            )


def _empty_space_message(every: Sequence[Config], rules: Sequence[Constraint]) -> str:
    if not rules:
        return "the space is empty"
    lines = [f"no configuration is left: the constraints rejected all {len(every)} "
             "configurations of the space. Each constraint on its own rejects:"]
    for rule in rules:
        rejected = sum(not _passes(rule, c) for c in every)
        lines.append(f"  {rule}: {rejected} of {len(every)}")
    return "\n".join(lines)
