"""`mtwork.sweep`: build every configuration of a kernel, check it against an oracle,
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

Each configuration goes through `mtwork.run.Runner` (first call, diff against the
oracle, timing) and its outcome is recorded, never raised. Mistakes in the sweep itself
(an unknown parameter name, an empty space, an oracle that raises before anything ran)
raise `SweepError`.

With `cache=path` every finished configuration is appended to a JSON-lines file at
once, keyed by a hash of the sweep's identity (by default the source of `build`, of the
kernels and strings it refers to, and of the oracle; or `key=`), the inputs' shapes and
dtypes, the backend, the timing settings and the configuration. A sweep stopped with
Ctrl-C keeps what it finished and the same call resumes; a repeated sweep is served from
the file.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ..errors import SweepError, UnknownParameterError
from ..run import Runner, outcome_of
from ..timing import Measurement, clock_for
from .cache import CacheFile, identity, inputs_signature, record_key
from .results import TIME_OBJECTIVES, Record, SweepInterrupted, SweepResult
from .space import STRATEGIES, Config, Constraint, check_space, choose, constraint, unknown_message

__all__ = ["sweep"]




def sweep(
    build: Callable[[Config], Any],
    space: Mapping[str, Sequence[Any]],
    *,
    inputs: Sequence[Any] = (),
    oracle: Any = None,
    diff_options: Mapping[str, Any] | None = None,
    constraints: Sequence[Constraint | str | Callable[[Config], Any]] = (),
    strategy: Literal["exhaustive", "random", "latin"] = "exhaustive",
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
    - `strategy`: "exhaustive" (in the space's order), "random" (shuffled with `seed`) or
      "latin" (a Latin hypercube of `budget` settings, seeded: every value of every
      parameter as evenly as the constraints allow); `budget` caps the configurations
      visited (cached ones count), `time_budget` the seconds spent (no new configuration
      starts after it).
    - `objective`: "time" (median; or "min", "p95", "mean") or a name in `metrics`, a dict
      of fn(config, measurement) -> float; `maximize=True` for metrics such as GB/s.
    - `cache`: a JSON-lines file to resume from and append to; `key` names the sweep's
      identity there (default: a digest of `build`'s and the oracle's sources and what
      they refer to; pass a version string when the kernel's source comes from elsewhere).
    - `backend`: the clock and the backend `Launch`es run on (default: the default one).
    - `rounds`, `warmup`: as in `timing.bench`, after the first call.
    """
    params = check_space(space)
    rules = [constraint(c) for c in constraints]
    _check_rule_names(rules, params)
    metrics = dict(metrics or {})
    _check_options(strategy, budget, objective, metrics)
    clock = clock_for(backend)
    every = [Config(dict(zip(params, values))) for values in itertools.product(*params.values())]
    candidates = [c for c in every if all(_passes(rule, c) for rule in rules)]
    if not candidates:
        raise SweepError(_empty_space_message(every, rules))
    plan = choose(candidates, params, strategy, budget, seed)
    sweep_identity = json.dumps([key if key is not None else identity(build, oracle),
                                 inputs_signature(inputs)])
    runner = Runner(inputs=inputs, oracle=oracle, diff_options=diff_options,
                    backend=clock.backend, rounds=rounds, warmup=warmup)
    result = SweepResult([], tuple(params), clock, objective, maximize, len(candidates),
                         len(every), cache_path=None if cache is None else str(cache),
                         values={name: tuple(vs) for name, vs in params.items()})

    def key_of(config: Config) -> str:
        return record_key(sweep_identity, clock.backend, rounds, warmup, config)

    def run_one(config: Config, key: str) -> Record:
        return _run_one(build, runner, metrics, config, key)

    from tqdm.auto import tqdm

    with tqdm(total=len(plan), desc="sweep", unit="config", disable=not progress) as bar:
        _visit(plan, key_of, run_one, None if cache is None else CacheFile(cache), result,
               bar, time_budget)
    if result.stopped == "complete" and len(plan) < len(candidates):
        result.stopped = "budget"
    return result


def _check_options(strategy: str, budget: int | None, objective: str,
                   metrics: Mapping[str, Any]) -> None:
    if strategy not in STRATEGIES:
        raise SweepError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, "
                         f"not {strategy!r}")
    if budget is not None and budget < 1:
        raise SweepError(f"budget must be at least 1 configuration, got {budget}")
    if objective not in TIME_OBJECTIVES and objective not in metrics:
        raise SweepError(
            f"objective {objective!r} is neither a time ({', '.join(TIME_OBJECTIVES)}) nor "
            f"one of the metrics ({', '.join(metrics) or 'none given'})"
        )


def _visit(plan: Sequence[Config], key_of: Callable[[Config], str],
           run_one: Callable[[Config, str], Record], cache_file: CacheFile | None,
           result: SweepResult, bar: Any, time_budget: float | None) -> None:
    """Runs the planned configurations (or takes them from the cache) into `result`; a
    Ctrl-C keeps what finished and raises `SweepInterrupted`."""
    started = time.perf_counter()
    try:
        for config in plan:
            key = key_of(config)
            if cache_file is not None and key in cache_file.entries:
                record = Record.from_dict(cache_file.entries[key], config)
            else:
                if time_budget is not None and time.perf_counter() - started >= time_budget:
                    result.stopped = "time budget"
                    return
                bar.set_description(f"sweep {config}")
                record = run_one(config, key)
                if cache_file is not None:
                    cache_file.append(record)
            result.records.append(record)
            bar.update()
            bar.set_postfix_str(_progress_text(result), refresh=False)
        bar.set_description("sweep")
    except KeyboardInterrupt as exc:
        result.stopped = "interrupted"
        where = (f"; they are in {cache_file.path}, and the same call resumes from there"
                 if cache_file is not None else "")
        raise SweepInterrupted(
            f"sweep interrupted after {len(result.records)} of {len(plan)} configurations: "
            f"the finished ones are in the exception's .result{where}",
            result,
        ) from exc


def _progress_text(result: SweepResult) -> str:
    counts = result.counts()
    failed = sum(n for s, n in counts.items() if s != "ok")
    text = f"ok={counts.get('ok', 0)} failed={failed}"
    if result.ranked():
        text += f" best={result.objective_text(result.best())}"
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
                f"constraint {rule} asked for an " + unknown_message(unknown, params)
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


def _run_one(build: Callable[[Config], Any], runner: Runner,
             metrics: Mapping[str, Callable[[Config, Measurement], float]],
             config: Config, key: str) -> Record:
    """Builds, runs, checks and times one configuration, then computes its metrics."""
    try:
        built = build(config)
    except UnknownParameterError as exc:
        raise _named(exc, "build(config)") from None
    except Exception as exc:  # noqa: BLE001 - a failed build is this config's outcome
        return Record.of(config, outcome_of(exc), key)
    try:
        outcome = runner.run(built, config)
    except UnknownParameterError as exc:
        raise _named(exc, "the oracle") from None
    record = Record.of(config, outcome, key)
    if record.ok and record.measurement is not None:
        for name, metric in metrics.items():
            try:
                record.metrics[name] = float(metric(config, record.measurement))
            except UnknownParameterError as exc:
                raise _named(exc, f"metric {name!r}") from None
            except Exception as exc:
                raise SweepError(
                    f"metric {name!r} raised {type(exc).__name__} for {config}: {exc}"
                ) from exc
    return record


def _named(exc: UnknownParameterError, who: str) -> UnknownParameterError:
    return UnknownParameterError(f"{who} asked for an {exc}")
