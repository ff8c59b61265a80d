"""What a sweep found: a `Record` per configuration, and the `SweepResult` of them all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..display import TimeUnit, html_table, text_table, value_text
from ..errors import SweepError
from ..gpu.chips import Chip
from ..gpu.counters import Counters
from ..gpu.model import Estimate
from ..modelled import MODELLED, counters_from, estimate_for, model_label, model_ratio
from ..oracle import DiffReport
from ..run import FAILED, Outcome, Status
from ..timing import Clock, Measurement
from .space import Config, jsonable

__all__ = ["CACHE_FORMAT", "MODELLED", "TIME_OBJECTIVES", "Record", "SweepInterrupted",
           "SweepResult", "is_time"]

TIME_OBJECTIVES = {"time": "median", "median": "median", "min": "min", "p95": "p95",
                   "mean": "mean"}


def is_time(objective: str) -> bool:
    """Whether `objective` is in seconds: a measured statistic or the modelled time."""
    return objective in TIME_OBJECTIVES or objective == MODELLED

# 2: counters carry ILP and loads in flight, and count device accesses in 64-byte granules;
# entries of format 1 would rank unevenly beside them, so a resumed sweep runs them again.
CACHE_FORMAT = 2
_STATUS_COLOURS = {"ok": "#1a7f37", "wrong": "#cf222e", "fault": "#cf222e",
                   "compile_error": "#9a6700", "oracle_error": "#8250df", "error": "#cf222e",
                   "skipped": "#6e7781"}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep. `result` holds the configurations that finished (they are
    in the cache file too, when there is one)."""

    def __init__(self, message: str, result: SweepResult):
        super().__init__(message)
        self.result = result


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
    first_call_s: float | None = None  # the first call, compile (and the count, when it
    # models on sim) included; not a sample
    cached: bool = False
    key: str = ""
    counters: Counters | None = None  # of the one profiled run, when the sweep models
    estimate: Estimate | None = None  # the modelled time on the sweep's chip
    model_note: str | None = None  # why a passing setting has no estimate

    @property
    def modelled(self) -> float | None:
        """Modelled seconds on the sweep's chip (None without an estimate)."""
        return None if self.estimate is None else self.estimate.seconds

    @property
    def bound(self) -> str | None:
        """What bounds the modelled time: memory, ALU, matrix, ..."""
        return None if self.estimate is None else self.estimate.bound

    @property
    def model_error(self) -> float | None:
        """Measured / modelled median time: the model's error on a GPU clock."""
        return model_ratio(self.time, self.estimate)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def time(self) -> float | None:
        """Median time in seconds (None unless the configuration passed)."""
        return None if self.measurement is None else self.measurement.median

    def value(self, objective: str) -> float | None:
        """The objective's value: a time statistic ("time" is the median), the modelled
        time ("modelled") or a metric."""
        if objective == MODELLED:
            return self.modelled
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
            "config": {k: jsonable(v) for k, v in self.config.items()},
            "status": self.status,
            "measurement": None if self.measurement is None else self.measurement.to_dict(),
            "metrics": self.metrics,
            "diffs": [d.to_dict() for d in self.diffs],
            "error_type": self.error_type,
            "message": self.message,
            "first_call_s": self.first_call_s,
            "counters": None if self.counters is None else self.counters.to_dict(),
            # what the counters gave on the sweep's chip, for readers of the file; a
            # resumed sweep models the counters again, on its own chip
            "modelled": None if self.estimate is None else {
                "chip": self.estimate.chip, "seconds": self.estimate.seconds,
                "bound": self.estimate.bound, "limiting_term": self.estimate.limiting_term},
            "model_note": self.model_note,
        }

    @classmethod
    def of(cls, config: Config, outcome: Outcome, key: str) -> Record:
        """The record of `config`, run with this `outcome`."""
        return cls(config=config, status=outcome.status, measurement=outcome.measurement,
                   diffs=list(outcome.diffs), error_type=outcome.error_type,
                   message=outcome.message, first_call_s=outcome.first_call_s, key=key,
                   counters=outcome.counters, estimate=outcome.estimate,
                   model_note=outcome.model_note)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], config: Config, chip: Chip | None = None
                  ) -> Record:
        """The record a cache entry holds; its counters (entries written before sweeps
        modelled have none) are modelled on `chip`."""
        m = data.get("measurement")
        counters, unread = counters_from(data.get("counters"))
        estimated, reason = estimate_for(counters, chip)
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
            counters=counters,
            estimate=estimated,
            model_note=unread or reason or data.get("model_note"),
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
    chip: Chip | None = None  # the chip the settings are modelled on (None: not modelled)
    # True when the objective was the sweep's default: the modelled time on sim, which
    # falls back to the measured time when no setting could be modelled
    default_objective: bool = False

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.ok]

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if not r.ok]

    def counts(self) -> dict[str, int]:
        counts = Counter(r.status for r in self.records)
        return {s: counts[s] for s in ("ok", *FAILED, "skipped") if counts[s]}

    def ranked(self, objective: str | None = None, *, maximize: bool | None = None
               ) -> list[Record]:
        """Passing records, best first."""
        objective, maximize = self.direction(objective, maximize)
        scored = [r for r in self.ok if r.value(objective) is not None]
        return sorted(scored, key=lambda r: r.value(objective), reverse=maximize)

    def best(self, objective: str | None = None, *, maximize: bool | None = None) -> Record:
        """The passing configuration with the best objective (default: the sweep's)."""
        ranked = self.ranked(objective, maximize=maximize)
        if not ranked:
            counts = ", ".join(f"{n} {s}" for s, n in self.counts().items()) or "none ran"
            raise SweepError(f"no configuration passed ({counts}); see the failures above")
        return ranked[0]

    def direction(self, objective: str | None, maximize: bool | None) -> tuple[str, bool]:
        """The objective to rank by and whether higher is better (None: the sweep's)."""
        if objective is None:
            objective = self.objective
            if objective == MODELLED and self.default_objective and not self._any_modelled:
                objective = "time"  # plain callables: nothing to model
        if maximize is None:
            maximize = self.maximize if objective == self.objective else False
        known = set(TIME_OBJECTIVES) | {k for r in self.records for k in r.metrics}
        if self.chip is not None:
            known.add(MODELLED)
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
        if self.chip is not None:
            row.update(modelled=r.modelled, bound=r.bound,
                       limiting_term=None if r.estimate is None else r.estimate.limiting_term)
            if self._gpu_clock:
                row.update(model_error=r.model_error)
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
        objective, maximize = self.direction(None, None)
        direction = "higher" if maximize else "lower"
        if self.chip is not None:
            lines.append(self._model_line(objective))
        if self.ranked():
            b = self.best()
            what = "modelled time" if objective == MODELLED else objective
            lines.append(f"best by {what} ({direction} is better): {b.config} — "
                         f"{self.objective_text(b)}" + (f", {b.bound}-bound" if b.bound else ""))
        return lines

    @property
    def _any_modelled(self) -> bool:
        return any(r.estimate is not None for r in self.records)

    @property
    def _gpu_clock(self) -> bool:
        return self.clock.backend == "metal"

    def _model_line(self, objective: str) -> str:
        assert self.chip is not None
        if not self._any_modelled:
            notes = [r.model_note for r in self.ok if r.model_note]
            return f"ranked by {objective}; {notes[0] if notes else 'not modelled'}"
        if objective == MODELLED:
            return (f"ranked by {model_label(self.chip)}; the times measured are "
                    f"{self.clock.label}")
        if self._gpu_clock:
            return (f"ranked by {self.clock.label}; beside it the {model_label(self.chip)}, "
                    "and the model's error as measured / modelled")
        return f"ranked by {objective}; beside it the {model_label(self.chip)}"

    def objective_text(self, r: Record) -> str:
        """`r`'s value of the sweep's objective, formatted."""
        objective, _ = self.direction(None, None)
        v = r.value(objective)
        if v is None:
            return "—"
        if is_time(objective):
            return TimeUnit.for_seconds(v).format(v)
        return f"{v:.4g}"

    def _table(self) -> tuple[list[str], list[tuple[list[str], str]]]:
        metric_names = list(dict.fromkeys(k for r in self.records for k in r.metrics))
        clock = "GPU" if self._gpu_clock else "emulator CPU"
        header = [*self.parameters, "status", f"{clock} median", f"{clock} min", "CV",
                  *self._model_header(), *metric_names, "check", "note"]
        ranked_ok = {id(r) for r in self.ranked()}
        order = self.ranked() + [r for r in self.records if id(r) not in ranked_ok]
        times = [r.time for r in self.ok if r.time is not None]
        unit = TimeUnit.for_seconds(min(times)) if times else TimeUnit("s", 1.0)
        rows = []
        modelled = self._any_modelled  # else the headline says once why nothing is
        for r in order:
            m = r.measurement
            cells = [value_text(r.config[p]) for p in self.parameters] + [r.status]
            if m is None:
                cells += ["—", "—", "—"]
            else:
                cv = "n/a" if m.cv is None else f"{m.cv:.1%}" + ("*" if m.unstable else "")
                cells += [unit.format(m.median), unit.format(m.min), cv]
            cells += self._model_cells(r)
            cells += [f"{r.metrics[k]:.4g}" if k in r.metrics else "—" for k in metric_names]
            note = r.short_message or (r.model_note if modelled and r.ok and r.model_note
                                       else "") or ("from cache" if r.cached else "")
            cells += [r.check, note]
            rows.append((cells, r.status))
        return header, rows

    def _model_header(self) -> list[str]:
        if self.chip is None:
            return []
        return [f"modelled ({self.chip.name})", "bound",
                *(["measured / modelled"] if self._gpu_clock else [])]

    def _model_cells(self, r: Record) -> list[str]:
        if self.chip is None:
            return []
        if r.estimate is None:
            return ["—"] * len(self._model_header())
        cells = [TimeUnit.for_seconds(r.estimate.seconds).format(r.estimate.seconds),
                 r.estimate.bound]
        if self._gpu_clock:
            ratio = r.model_error
            cells.append("—" if ratio is None else f"{ratio:.3g}×")
        return cells

    def __str__(self) -> str:
        header, rows = self._table()
        lines = self._headline() + [""] + text_table(header, [c for c, _ in rows])
        if any(r.measurement is not None and r.measurement.unstable for r in self.records):
            lines.append("* unstable: coefficient of variation above the threshold")
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items())
        return f"<SweepResult {len(self.records)} configurations ({counts}); {self.clock.label}>"

    def _repr_html_(self) -> str:
        header, rows = self._table()
        status_col = len(self.parameters)
        styles = [[f"color:{_STATUS_COLOURS[status]};font-weight:bold" if i == status_col
                   else "" for i in range(len(cells))] for cells, status in rows]
        first, *rest = self._headline()
        return html_table(caption=first, lines=rest, header=header,
                          rows=[cells for cells, _ in rows], cell_styles=styles)
