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
oracle, timing) and its outcome is recorded, never raised. A passing `Launch` also runs
once with the profiler: its counters give the modelled time and bound on the chosen Apple
GPU (`gpu=`), which ranks the settings on `sim`, where the clock times the emulator's CPU;
on `metal` the measured GPU time ranks and the model stands beside it, with its error.
Mistakes in the sweep itself (an unknown parameter name, an empty space, an oracle that
raises before anything ran) raise `SweepError`.

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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Literal

from ..errors import SweepError, UnknownParameterError
from ..modelled import MODELLED, GpuChoice, chip_for
from ..run import Runner
from ..timing import Measurement, clock_for
from .cache import CacheFile, identity, inputs_signature, record_key
from .results import TIME_OBJECTIVES, SweepResult
from .skipping import CompileErrorClasses
from .space import STRATEGIES, Config, Constraint, check_space, choose, constraint, unknown_message
from .visit import Job, named, visit

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
    objective: str | None = None,
    maximize: bool = False,
    metrics: Mapping[str, Callable[[Config, Measurement], float]] | None = None,
    cache: str | os.PathLike | None = None,
    key: str | None = None,
    backend: str | None = None,
    seed: int = 0,
    rounds: int = 5,
    warmup: int = 1,
    progress: bool = True,
    executor: Executor | None = None,
    skip_compile_errors: bool = False,
    gpu: GpuChoice = None,
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
    - `gpu`: the Apple GPU the settings are modelled on (a name such as "M2 Max", an
      `mtwork.gpu` chip; None: `MTWORK_GPU`, else the default chip; False: no model).
      Each passing `Launch` runs once more with the profiler, and its record keeps the
      counters, the modelled time and the bound (see `mtwork.modelled`).
    - `objective`: "modelled" (the modelled time on `gpu`: the default on `sim`, whose
      clock times the emulator, not a GPU; a sweep of plain callables, which cannot be
      modelled, falls back to "time"), "time" (the measured median: the default on
      `metal`; or "min", "p95", "mean") or a name in `metrics`, a dict of
      fn(config, measurement) -> float; `maximize=True` for metrics such as GB/s.
    - `cache`: a JSON-lines file to resume from and append to; `key` names the sweep's
      identity there (default: a digest of `build`'s and the oracle's sources and what
      they refer to; pass a version string when the kernel's source comes from elsewhere).
    - `backend`: the clock and the backend `Launch`es run on (default: the default one).
    - `rounds`, `warmup`: as in `timing.bench`, after the first call.
    - `executor`: any `concurrent.futures.Executor` to spread the configurations over
      (a `ProcessPoolExecutor`, `dask.distributed.Client.get_executor()`, ...); `build`,
      the oracle, the metrics and the inputs must then pickle. Measured times of
      configurations run side by side share the machine: compare them with care.
    - `skip_compile_errors`: once two settings fail to compile with the same error and
      share some values, later settings with those values are recorded as ``skipped``
      (named with the values and the error) instead of compiled (see `sweep.skipping`).
    """
    params = check_space(space)
    rules = [constraint(c) for c in constraints]
    _check_rule_names(rules, params)
    metrics = dict(metrics or {})
    clock = clock_for(backend)
    chip = chip_for(gpu)
    default_objective = objective is None
    if objective is None:
        objective = MODELLED if chip is not None and clock.backend != "metal" else "time"
    _check_options(strategy, budget, objective, metrics, chip is not None)
    every = [Config(dict(zip(params, values))) for values in itertools.product(*params.values())]
    candidates = [c for c in every if all(_passes(rule, c) for rule in rules)]
    if not candidates:
        raise SweepError(_empty_space_message(every, rules))
    plan = choose(candidates, params, strategy, budget, seed)
    sweep_identity = json.dumps([key if key is not None else identity(build, oracle),
                                 inputs_signature(inputs)])
    runner = Runner(inputs=inputs, oracle=oracle, diff_options=diff_options,
                    backend=clock.backend, rounds=rounds, warmup=warmup, chip=chip)
    result = SweepResult([], tuple(params), clock, objective, maximize, len(candidates),
                         len(every), cache_path=None if cache is None else str(cache),
                         values={name: tuple(vs) for name, vs in params.items()},
                         chip=chip, default_objective=default_objective)

    def key_of(config: Config) -> str:
        return record_key(sweep_identity, clock.backend, rounds, warmup, config)

    from tqdm.auto import tqdm

    with tqdm(total=len(plan), desc="sweep", unit="config", disable=not progress) as bar:
        skips = CompileErrorClasses() if skip_compile_errors else None
        visit(plan, key_of, Job(build, runner, metrics, skips),
              None if cache is None else CacheFile(cache), result, bar, time_budget, executor)
    if result.stopped == "complete" and len(plan) < len(candidates):
        result.stopped = "budget"
    # What the times measured, as their measurements say (on metal: per dispatch).
    clocks = {r.measurement.clock for r in result.records if r.measurement is not None}
    if len(clocks) == 1:
        result.clock = clocks.pop()
    return result


def _check_options(strategy: str, budget: int | None, objective: str,
                   metrics: Mapping[str, Any], modelled: bool) -> None:
    if strategy not in STRATEGIES:
        raise SweepError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, "
                         f"not {strategy!r}")
    if budget is not None and budget < 1:
        raise SweepError(f"budget must be at least 1 configuration, got {budget}")
    if objective == MODELLED:
        if not modelled:
            raise SweepError("objective='modelled' needs a GPU to model: pass gpu='M2 Max' "
                             "(or any mtwork.gpu chip), or leave gpu unset, not gpu=False")
        return
    if objective not in TIME_OBJECTIVES and objective not in metrics:
        raise SweepError(
            f"objective {objective!r} is neither a time ({', '.join(TIME_OBJECTIVES)}), "
            f"{MODELLED!r} nor "
            f"one of the metrics ({', '.join(metrics) or 'none given'})"
        )


def _passes(rule: Constraint, config: Config) -> bool:
    try:
        return rule(config)
    except UnknownParameterError as exc:
        raise named(exc, f"constraint {rule}") from None


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
