"""papermill's engine with the executed notebook saved at most every few seconds while its
cells run, and always when it stops.

papermill writes the whole output notebook when each cell starts and again when it ends.
A walkthrough embeds plotly.js (about 5 MB) so that its HTML draws offline, which made
those writes (JSON-encoding the notebook about 80 times) the largest cost of the process
running the notebooks: 12 of its 17 CPU seconds in `mtwork run`. Saving at most every
`SAVE_EVERY` seconds keeps the partial notebook of a run that is stopped or whose kernel
dies, at most that many seconds behind, and the end of a run (passed, failed or
interrupted) always saves.
"""

from __future__ import annotations

import time
from typing import Any

from papermill.engines import NBClientEngine, NotebookExecutionManager, papermill_engines

__all__ = ["ENGINE_NAME", "SAVE_EVERY", "SparseSaves"]

ENGINE_NAME = "mtwork"
SAVE_EVERY = 5.0  # seconds between two saves while cells run


class SparseSaves(NotebookExecutionManager):
    """Saves while cells run at most every SAVE_EVERY seconds; at the end always."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_save = -float("inf")
        self._finishing = False

    def save(self, **kwargs: Any) -> None:
        now = time.monotonic()
        if not self._finishing and now - self._last_save < SAVE_EVERY:
            return
        super().save(**kwargs)
        self._last_save = now

    def notebook_complete(self, **kwargs: Any) -> None:
        self._finishing = True
        super().notebook_complete(**kwargs)


class _Engine(NBClientEngine):
    """nbclient's engine with `SparseSaves` (papermill's `Engine.execute_notebook`
    builds its manager itself, so this is that method with the manager swapped)."""

    @classmethod
    def execute_notebook(cls, nb: Any, kernel_name: str, output_path: str | None = None,
                         progress_bar: Any = True, log_output: bool = False,
                         autosave_cell_every: int = 30, **kwargs: Any) -> Any:
        manager = SparseSaves(nb, output_path=output_path, progress_bar=progress_bar,
                               log_output=log_output, autosave_cell_every=autosave_cell_every)
        manager.notebook_start()
        try:
            cls.execute_managed_notebook(manager, kernel_name, log_output=log_output,
                                         **kwargs)
        finally:
            manager.cleanup_pbar()
            manager.notebook_complete()
        return manager.nb


papermill_engines.register(ENGINE_NAME, _Engine)
