"""One worker thread for the editor's compile-and-run jobs, so the notebook's kernel stays
free while the emulator works (it releases the GIL while a kernel runs).

Only the newest request matters while someone types: a job submitted while another is
waiting replaces it (the replaced future is cancelled), and `later` debounces (each call
restarts the delay)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

Job = Callable[[], Any]


class Worker:
    """Runs jobs one at a time, newest first; see the module docstring."""

    def __init__(self, name: str = "mtwork-editor"):
        self._name = name
        self._cond = threading.Condition()
        self._pending: tuple[Job, Future] | None = None
        self._running = False
        self._timer: threading.Timer | None = None

    @property
    def busy(self) -> bool:
        """True while a job runs, waits, or is about to be submitted by `later`."""
        with self._cond:
            return self._running or self._pending is not None or self._timer is not None

    def submit(self, job: Job) -> Future:
        """Queue `job`, replacing one that has not started; returns its future."""
        with self._cond:
            self._cancel_timer()
            return self._submit_locked(job)

    def later(self, delay: float, job: Job) -> None:
        """Submit `job` after `delay` seconds unless `later` or `submit` is called first."""
        with self._cond:
            self._cancel_timer()
            timer = threading.Timer(delay, self._fire, args=(job,))
            timer.daemon = True
            self._timer = timer
            timer.start()

    def drop_pending(self) -> None:
        """Forgets the job waiting to start and the one `later` would submit."""
        with self._cond:
            self._cancel_timer()
            if self._pending is not None:
                self._pending[1].cancel()
                self._pending = None
                self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job runs, waits or is scheduled; False if `timeout` ran out."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not (self._running or self._pending or self._timer), timeout)

    def _fire(self, job: Job) -> None:
        with self._cond:
            if self._timer is not threading.current_thread():
                return  # cancelled or replaced after it had started firing
            self._timer = None
            self._submit_locked(job)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._cond.notify_all()

    def _submit_locked(self, job: Job) -> Future:
        future: Future = Future()
        if self._pending is not None:
            self._pending[1].cancel()
        self._pending = (job, future)
        if not self._running:
            self._running = True
            threading.Thread(target=self._drain, name=self._name, daemon=True).start()
        return future

    def _drain(self) -> None:
        while True:
            with self._cond:
                if self._pending is None:
                    self._running = False
                    self._cond.notify_all()
                    return
                job, future = self._pending
                self._pending = None
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever holds the future
                future.set_exception(exc)
