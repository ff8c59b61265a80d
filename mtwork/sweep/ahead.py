"""A sweep's kernels built before its first setting runs.

On `sim`, every setting still to run is built (`build(config)`) and its kernel compiled,
plain and, with the model on, profiled, in a pool of threads (one per core) before any
setting runs or is timed: clang is a subprocess, so the threads compile side by side,
and no timed round shares the machine with a build. What a setting's build or compile
raises is left to its own run, which raises it again and records it as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..kernel import Launch
from ..library_kernel import LibraryLaunch
from ..run import Runner
from .space import Config

__all__ = ["NOT_BUILT", "build_ahead"]

NOT_BUILT = object()  # a setting whose build(config) raised: its run builds it again


def build_ahead(configs: Sequence[Config], build: Any, runner: Runner) -> list[Any]:
    """What `build` gives for each of `configs` (NOT_BUILT where it raised), their
    kernels compiled on `runner`'s backend; nothing is built ahead off `sim` or for a
    single setting."""
    if runner.backend != "sim" or len(configs) < 2:
        return [NOT_BUILT] * len(configs)
    built = [_built(build, config) for config in configs]
    launches = [b for b in built if isinstance(b, (Launch, LibraryLaunch))]
    if not launches:
        return built
    variants = [False, True] if runner.counts_first(launches[0]) else [False]
    jobs = [(launch, profile) for launch in launches for profile in variants]
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1),
                            thread_name_prefix="mtwork-ahead") as pool:
        for _ in pool.map(lambda job: _compile(runner, *job), jobs):
            pass
    return built


def _built(build: Any, config: Config) -> Any:
    try:
        return build(config)
    except Exception:  # noqa: BLE001 - the setting's own run raises it again
        return NOT_BUILT


def _compile(runner: Runner, launch: Launch | LibraryLaunch, profile: bool) -> None:
    try:
        launch.compile(*runner.inputs, backend=runner.backend, profile=profile)
    except Exception:  # noqa: BLE001 - the setting's own run reports it
        return
