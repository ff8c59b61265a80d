"""Run one notebook with papermill and publish it: the kernel quiet, a progress bar over
its cells, the HTML written whether the run passed or stopped at a failing cell."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..host import socket_dir
from .export import export_html
from .math import UnrenderableFormula

__all__ = ["NotebookRun", "kernel_environment", "run_notebook"]

# Plotly >= 6 only emits a mimetype nbconvert drops; the notebook renderer embeds plotly.js
# so the walkthrough draws offline.
_KERNEL_ENV = {"PLOTLY_RENDERER": "notebook"}
# What the kernel runs before the first cell (see the file), unless the caller has its own.
_KERNEL_STARTUP = {"PYTHONSTARTUP": str(Path(__file__).with_name("kernel_startup.py"))}


@dataclass(frozen=True)
class NotebookRun:
    """How one notebook went: `status` "ok" or "failed", the wall time, the HTML written
    (None only when not even a partial notebook came back), and for a failure the cell
    it stopped in and the error's last line."""

    notebook: Path
    status: str
    seconds: float
    html: Path | None
    failed_cell: int | None = None  # the cell's execution count, as In [n] shows it
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@contextlib.contextmanager
def kernel_environment(extra: Mapping[str, str]) -> Iterator[None]:
    """Environment for the kernel process: this mtwork first on its path (so a checkout's
    notebooks run the checkout's package, whatever is installed), plus `extra`."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    startup = {} if os.environ.get("PYTHONSTARTUP") else _KERNEL_STARTUP
    changes = {**_KERNEL_ENV, **startup, **extra, "PYTHONPATH": path}
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _kernel_config(folder: Path) -> Any:
    """Unix sockets, not TCP, between papermill and the kernel: nothing on the network, and
    no "running over TCP without encryption" warning from ipykernel on every notebook."""
    from traitlets.config import Config

    if os.name != "posix":
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": str(folder / "kernel")}})


def run_notebook(notebook: Path, out_dir: Path, parameters: Mapping[str, object], *,
                 progress: bool = True, env: Mapping[str, str] | None = None,
                 environment_set: bool = False) -> NotebookRun:
    """Executes `notebook` with papermill into `out_dir` and exports its HTML walkthrough
    there (also when a cell fails: the walkthrough then shows where). `progress` draws a
    tqdm bar over the cells; `env` adds variables for the kernel. `environment_set`: the
    caller has set the kernel's up with `kernel_environment` (once for notebooks run side
    by side in threads, which must not each change and restore the process's)."""
    if environment_set:
        return _run(notebook, out_dir, parameters, progress)
    with kernel_environment(env or {}):
        return _run(notebook, out_dir, parameters, progress)


def _run(notebook: Path, out_dir: Path, parameters: Mapping[str, object],
         progress: bool) -> NotebookRun:
    import papermill

    from .saving import ENGINE_NAME

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / notebook.name
    html = executed.with_suffix(".html")
    executed.unlink(missing_ok=True)  # a stale copy must not pass for this run's
    status, failed_cell, error = "ok", None, ""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mtwork-kernel-", dir=socket_dir()) as sockets:
        try:
            papermill.execute_notebook(
                str(notebook), str(executed), parameters=dict(parameters),
                # The kernel starts in the notebook's folder; papermill's own `cwd` would
                # change this process's folder, under notebooks run side by side in threads.
                resources={"metadata": {"path": str(notebook.parent.resolve())}},
                kernel_name="python3", engine_name=ENGINE_NAME,
                progress_bar={"desc": notebook.stem, "leave": True} if progress else False,
                config=_kernel_config(Path(sockets)))
        except papermill.PapermillExecutionError as failure:
            status, failed_cell = "failed", failure.exec_count
            error = f"{failure.ename}: {failure.evalue}".splitlines()[0]
        except Exception as failure:  # noqa: BLE001 - a dead kernel or a timeout: report it
            status, error = "failed", f"{type(failure).__name__}: {failure}".splitlines()[0]
    seconds = time.perf_counter() - start
    if not executed.is_file():
        return NotebookRun(notebook, status, seconds, None, failed_cell, error)
    try:
        export_html(executed, html)
    except UnrenderableFormula as failure:
        return NotebookRun(notebook, "failed", seconds, None, failed_cell,
                           error or f"export: {failure}")
    return NotebookRun(notebook, status, seconds, html, failed_cell, error)
