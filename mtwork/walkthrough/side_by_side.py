"""Several notebooks run at once, `jobs` at a time, the slowest started first: a notebook's
kernel is one process and mostly one core busy, so side by side they fill a machine's
cores. They share one compile cache (its builds are locked: a library two notebooks need
is built once, the other waits). Each start and end is one line on stderr (bars over cells
from several notebooks at once would overwrite each other); the runs come back in the
order given, a failed or crashed notebook among them with the others' results kept."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from .execute import NotebookRun, kernel_environment, run_notebook
from .export import write_atomically

__all__ = ["expected_seconds", "record_seconds", "run_notebooks", "slowest_first"]

_RECORD_NAME = "walkthrough-seconds.json"  # in the compile cache: each notebook's last time


def _record_path() -> Path:
    from ..cachedir import cache_dir

    return cache_dir() / _RECORD_NAME


def _recorded() -> dict[str, float]:
    try:
        data = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def _record_key(notebook: Path, parameters: Mapping[str, object]) -> str:
    """A notebook's time is kept per set of parameters (small ones run faster)."""
    return f"{notebook.resolve()} {json.dumps(parameters, sort_keys=True, default=repr)}"


def record_seconds(runs: Sequence[NotebookRun],
                   parameters: Mapping[Path, Mapping[str, object]]) -> None:
    """Keeps the time of each notebook that ran through (with its `parameters`), for the
    order of the next run."""
    times = _recorded()
    times.update({_record_key(run.notebook, parameters[run.notebook]): round(run.seconds, 1)
                  for run in runs if run.ok})
    # A read-only cache keeps none: the next run orders by the notebooks' own hints.
    with contextlib.suppress(OSError):
        write_atomically(_record_path(), json.dumps(times, indent=0, sort_keys=True))


def expected_seconds(notebook: Path, parameters: Mapping[str, object],
                     recorded: Mapping[str, float] | None = None) -> float:
    """How long `notebook` is expected to run with `parameters`: its last recorded time,
    else the hint in its metadata (``mtwork.typical_seconds``, for its defaults), else
    infinity (an unknown one may be long)."""
    recorded = _recorded() if recorded is None else recorded
    key = _record_key(notebook, parameters)
    if key in recorded:
        return recorded[key]
    try:
        hint = json.loads(notebook.read_text()).get("metadata", {}).get("mtwork", {})
        return float(hint["typical_seconds"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return float("inf")


def slowest_first(notebooks: Sequence[Path],
                  parameters: Mapping[Path, Mapping[str, object]]) -> list[Path]:
    """`notebooks` in the order to start them: the longest first (ties keep their order),
    so that the last to finish is a short one."""
    recorded = _recorded()
    return sorted(notebooks, key=lambda nb: -expected_seconds(nb, parameters[nb], recorded))


def run_notebooks(notebooks: Sequence[Path], out_dir: Path,
                  parameters: Mapping[Path, Mapping[str, object]], *, jobs: int,
                  env: Mapping[str, str], log: TextIO | None = None) -> list[NotebookRun]:
    """Runs `notebooks` (each with its `parameters`), `jobs` at a time, into `out_dir`;
    returns their runs in the order given. With one job, or one notebook, they run one
    after another with a progress bar each."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1 or len(notebooks) == 1:
        runs = [run_notebook(nb, out_dir, parameters[nb], env=env) for nb in notebooks]
    else:
        runs = _side_by_side(notebooks, out_dir, parameters, jobs, env, log or sys.stderr)
    record_seconds(runs, parameters)
    return runs


def _side_by_side(notebooks: Sequence[Path], out_dir: Path,
                  parameters: Mapping[Path, Mapping[str, object]], jobs: int,
                  env: Mapping[str, str], log: TextIO) -> list[NotebookRun]:
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(text, file=log, flush=True)

    def one(notebook: Path) -> NotebookRun:
        say(f"{notebook.stem}: started")
        start = time.perf_counter()
        try:
            run = run_notebook(notebook, out_dir, parameters[notebook], progress=False,
                               environment_set=True)
        except Exception as failure:  # noqa: BLE001 - one notebook's crash ends only its run
            run = NotebookRun(notebook, "failed", time.perf_counter() - start, None,
                              error=f"{type(failure).__name__}: {failure}".splitlines()[0])
        where = f" in cell [{run.failed_cell}]" if run.failed_cell is not None else ""
        say(f"{notebook.stem}: {'ok' if run.ok else 'FAILED' + where} "
            f"after {run.seconds:.1f} s")
        return run

    with kernel_environment(env), ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {nb: pool.submit(one, nb) for nb in slowest_first(notebooks, parameters)}
        try:
            return [futures[nb].result() for nb in notebooks]
        except BaseException:  # Ctrl-C: the notebooks not started yet never start
            pool.shutdown(wait=False, cancel_futures=True)
            raise
