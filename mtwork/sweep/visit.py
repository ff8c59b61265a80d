"""Running a sweep's planned configurations: one after another, or spread over any
`concurrent.futures.Executor` (a process pool, Dask's or Ray's executor), with the same
cache file and the same resume either way.

Each configuration is a `Job`: everything it needs to be built, run, checked and timed
where it runs. On an executor, jobs (and so `build`, the oracle, the metrics and the
inputs) travel by pickle: module-level functions with a process pool, any function with
executors that use cloudpickle (Dask's). The cache file is written here, as results
arrive, so a sweep stopped at any point keeps every configuration that finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass
from typing import Any

from ..errors import KernelCancelled, SweepError, UnknownParameterError
from ..run import Runner, outcome_of
from ..timing import Measurement
from .ahead import NOT_BUILT, build_ahead
from .cache import CacheFile
from .results import Record, SweepInterrupted, SweepResult
from .skipping import CompileErrorClasses
from .space import Config

__all__ = ["Job", "named", "visit"]


def named(exc: UnknownParameterError, who: str) -> UnknownParameterError:
    """`exc` saying who asked for the unknown parameter."""
    return UnknownParameterError(f"{who} asked for an {exc}")


@dataclass(frozen=True)
class Job:
    """One configuration to build, run, check and time; with `skips`, settings of a
    compile error class already seen (see `skipping`) are recorded as skipped."""

    build: Callable[[Config], Any]
    runner: Runner
    metrics: Mapping[str, Callable[[Config, Measurement], float]]
    skips: CompileErrorClasses | None = None

    def __call__(self, config: Config, key: str, built: Any = NOT_BUILT) -> Record:
        reason = self.skips.reason(config) if self.skips is not None else None
        if reason is not None:
            return Record(config=config, status="skipped", message=reason, key=key)
        record = self._run(config, key, built)
        if self.skips is not None and record.status == "compile_error" and record.message:
            self.skips.add(config, record.message)
        return record

    def _run(self, config: Config, key: str, built: Any) -> Record:
        try:
            if built is NOT_BUILT:
                built = self.build(config)
        except UnknownParameterError as exc:
            raise named(exc, "build(config)") from None
        except Exception as exc:  # noqa: BLE001 - a failed build is this config's outcome
            return Record.of(config, outcome_of(exc), key)
        try:
            outcome = self.runner.run(built, config)
        except UnknownParameterError as exc:
            raise named(exc, "the oracle") from None
        record = Record.of(config, outcome, key)
        if record.ok and record.measurement is not None:
            for name, metric in self.metrics.items():
                try:
                    record.metrics[name] = float(metric(config, record.measurement))
                except UnknownParameterError as exc:
                    raise named(exc, f"metric {name!r}") from None
                except Exception as exc:
                    raise SweepError(f"metric {name!r} raised {type(exc).__name__} for "
                                     f"{config}: {exc}") from exc
        return record


def _progress_text(result: SweepResult) -> str:
    counts = result.counts()
    failed = sum(n for s, n in counts.items() if s != "ok")
    text = f"ok={counts.get('ok', 0)} failed={failed}"
    if result.ranked():
        text += f" best={result.objective_text(result.best())}"
    return text


def _interrupted(result: SweepResult, planned: int, cache_file: CacheFile | None
                 ) -> SweepInterrupted:
    result.stopped = "interrupted"
    where = (f"; they are in {cache_file.path}, and the same call resumes from there"
             if cache_file is not None else "")
    return SweepInterrupted(
        f"sweep interrupted after {len(result.records)} of {planned} configurations: the "
        f"finished ones are in the exception's .result{where}", result)


def visit(plan: Sequence[Config], key_of: Callable[[Config], str], job: Job,
          cache_file: CacheFile | None, result: SweepResult, bar: Any,
          time_budget: float | None, executor: Executor | None = None) -> None:
    """Runs the planned configurations (or takes them from the cache) into `result`, in
    the plan's order; a Ctrl-C (or a kernel cancelled from outside) keeps what finished
    and raises `SweepInterrupted`."""
    keys = [key_of(c) for c in plan]
    done: dict[int, Record] = {}
    for i, (config, key) in enumerate(zip(plan, keys)):
        if cache_file is not None and key in cache_file.entries:
            done[i] = Record.from_dict(cache_file.entries[key], config, job.runner.chip)
    todo = [i for i in range(len(plan)) if i not in done]
    try:
        for i in sorted(done):
            _arrived(result, done[i], bar)
        if executor is None:
            _one_by_one(plan, keys, todo, job, cache_file, result, bar, time_budget)
        else:
            _on_executor(plan, keys, todo, job, cache_file, result, bar, time_budget,
                         executor)
    except (KeyboardInterrupt, KernelCancelled) as exc:
        raise _interrupted(result, len(plan), cache_file) from exc
    finally:
        order = {key: n for n, key in enumerate(keys)}
        result.records.sort(key=lambda r: order.get(r.key, len(order)))
    bar.set_description("sweep")


def _arrived(result: SweepResult, record: Record, bar: Any) -> None:
    result.records.append(record)
    bar.update()
    bar.set_postfix_str(_progress_text(result), refresh=False)


def _over(started: float, time_budget: float | None) -> bool:
    return time_budget is not None and time.perf_counter() - started >= time_budget


def _one_by_one(plan: Sequence[Config], keys: Sequence[str], todo: Sequence[int], job: Job,
                cache_file: CacheFile | None, result: SweepResult, bar: Any,
                time_budget: float | None) -> None:
    started = time.perf_counter()
    # Settings built ahead: not where compile errors skip settings or time may run out.
    ahead = job.skips is None and time_budget is None
    if ahead:
        bar.set_description("sweep: compiling")
    built = (build_ahead([plan[i] for i in todo], job.build, job.runner) if ahead
             else [NOT_BUILT] * len(todo))
    for i, prebuilt in zip(todo, built):
        if _over(started, time_budget):
            result.stopped = "time budget"
            return
        bar.set_description(f"sweep {plan[i]}")
        record = job(plan[i], keys[i], prebuilt)
        if cache_file is not None and record.status != "skipped":
            cache_file.append(record)
        _arrived(result, record, bar)


def _on_executor(plan: Sequence[Config], keys: Sequence[str], todo: Sequence[int], job: Job,
                 cache_file: CacheFile | None, result: SweepResult, bar: Any,
                 time_budget: float | None, executor: Executor) -> None:
    started = time.perf_counter()
    futures: dict[Future, int] = {executor.submit(job, plan[i], keys[i]): i for i in todo}
    try:
        for future in as_completed(futures):
            record = future.result()  # a mistake in the sweep itself raises here
            if cache_file is not None and record.status != "skipped":
                cache_file.append(record)
            _arrived(result, record, bar)
            if _over(started, time_budget) and len(result.records) < len(plan):
                result.stopped = "time budget"
                return
    finally:
        for future in futures:
            future.cancel()  # what has not started yet
