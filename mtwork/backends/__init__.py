"""Where kernels run, and the one place every dispatch passes: `run`.

A backend is an object with a `name`, `unavailable_reason()` (None when it can run here),
`compile(program, sanitize=...)` and `dispatch(program, call) -> Completion` (see
`mtwork.dispatch` for what it receives). Two come with mtwork:

- ``metal``: the Apple GPU through MLX (`backends/metal`);
- ``sim``: the CPU emulator (`backends/sim`).

A third is one module and one `register("name", "package.module:Factory")` call (or an
entry point in the ``mtwork.backends`` group). Backends are imported when first used.

The default is ``metal`` where MLX has a Metal device, else ``sim``; `MTWORK_BACKEND` or
a call's ``backend=`` overrides it. A sanitized dispatch runs on ``sim``: the sanitizer is
the emulator's.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Protocol

from ..dispatch import Completion, Dispatch, Options, Program
from ..errors import BackendUnavailable
from ..recording import record
from ..sanitizer import SanitizerError, SanitizerWarning

__all__ = ["Backend", "OutputMemory", "backends", "builds_graph", "cancel", "chosen",
           "compile", "default_backend", "get", "hold", "log_note", "names", "output_memory",
           "recording", "register", "resolve", "run", "unregister"]


class Backend(Protocol):
    """What mtwork asks of a backend. One whose `dispatch` of a body-form program returns
    arrays of MLX's graph (lazy, as ``mx.fast.metal_kernel``'s) says so with a true
    ``builds_graph`` attribute; mtwork makes the calls of every other one operations of
    MLX's graph itself (`mtwork.graph`)."""

    name: str

    def unavailable_reason(self) -> str | None: ...

    def compile(self, program: Program, *, sanitize: bool = False,
                profile: bool = False) -> object: ...

    def dispatch(self, program: Program, call: Dispatch) -> Completion: ...

    def cancel(self) -> None:
        """Stops the running dispatch (from another thread), where the backend can."""

    def idle(self) -> None:
        """No kernel object is left: let go of what runs in the background (optional)."""

    def output_memory(self, call: Dispatch, sizes: list[int]) -> list[OutputMemory | None]:
        """Memory the call would write outputs of `sizes` bytes into without a copy, for
        outputs of MLX's graph (optional; None for an output: MLX's own memory)."""


class OutputMemory(Protocol):
    """Memory a backend lends for an output of MLX's graph: `capacity` bytes at
    `address` (page-aligned), given back by `release` when MLX frees the array."""

    address: int
    capacity: int

    def release(self) -> None: ...


Factory = Callable[[], Backend]

_FACTORIES: dict[str, str | Factory] = {
    "metal": "mtwork.backends.metal:MetalBackend",
    "sim": "mtwork.backends.sim:SimBackend",
}
_instances: dict[str, Backend] = {}
_reasons: dict[str, str | None] = {}
_lock = threading.Lock()
_entry_points_read = False
_held = 0  # kernel objects alive (`hold`)
# `_held`'s own lock: a kernel's finalizer may run while `_lock` is held (a collection
# during the import `get` makes), and must not wait for it.
_held_lock = threading.RLock()
_recorded = threading.local()  # `recording`: this thread's list, while one is open


def register(name: str, factory: str | Factory) -> None:
    """Makes backend `name` available: `factory` makes it, or is "module:attribute"."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a backend's name must be an identifier, got {name!r}")
    with _lock:
        _FACTORIES[name] = factory
        replaced = _instances.pop(name, None)
        _reasons.pop(name, None)
    del replaced  # outside the lock: what it held may count released kernels (`hold`)


def unregister(name: str) -> None:
    """Forgets backend `name` (what `register` added)."""
    with _lock:
        _FACTORIES.pop(name, None)
        removed = _instances.pop(name, None)
        _reasons.pop(name, None)
    del removed  # outside the lock, as in `register`


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in entry_points(group="mtwork.backends"):
        _FACTORIES.setdefault(ep.name, ep.value)


def names() -> tuple[str, ...]:
    """The registered backends' names."""
    _read_entry_points()
    return tuple(_FACTORIES)


def get(name: str) -> Backend:
    """The backend `name` (made on first use); a `ValueError` lists the known names."""
    known = names()
    if name not in known:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(known)}")
    with _lock:
        backend = _instances.get(name)
        if backend is None:
            factory = _FACTORIES[name]
            if isinstance(factory, str):
                module, _, attribute = factory.partition(":")
                factory = getattr(importlib.import_module(module), attribute)
            backend = _instances[name] = factory()
    return backend


def _reason(name: str) -> str | None:
    if name not in _reasons:
        _reasons[name] = get(name).unavailable_reason()
    return _reasons[name]


def backends() -> dict[str, str | None]:
    """Each backend's name mapped to None when it is usable, else the reason it is not."""
    return {name: _reason(name) for name in names()}


def default_backend() -> str:
    """$MTWORK_BACKEND, else ``metal`` where it can run, else ``sim``."""
    chosen = os.environ.get("MTWORK_BACKEND")
    if chosen:
        try:
            return resolve(chosen)
        except ValueError as exc:
            raise ValueError(f"MTWORK_BACKEND: {exc}") from None
    return "metal" if _reason("metal") is None else "sim"


def resolve(name: str | None) -> str:
    """Validates a backend name (None: the default) and checks it can run here."""
    if name is None:
        return default_backend()
    if not isinstance(name, str):
        raise ValueError(f"`backend` must be a backend's name ({', '.join(names())}), "
                         f"got {name!r}")
    get(name)
    reason = _reason(name)
    if reason is not None:
        raise BackendUnavailable(f"backend {name!r} is not usable here: {reason}")
    return name


def chosen(backend: str | None, options: Options) -> str:
    """The backend a dispatch with `options` runs on (a sanitized one on ``sim``)."""
    return resolve("sim" if options.sanitize else backend)


def log_note(options: Options, backend: str | None) -> str:
    """What a call with ``log=True`` says when it runs on ``sim`` instead of `backend`
    (None: the default): "" when it would have run on ``sim`` anyway."""
    if not options.log or options.sanitize or options.profile or resolve(backend) == "sim":
        return ""
    return (f"run on sim for log=True: the {resolve(backend)} backend keeps no log of the "
            f"kernel's os_log messages (see mtwork's logging guide)")


def _chosen(backend: str | None, options: Options) -> Backend:
    return get(chosen(backend, options))


def builds_graph(name: str) -> bool:
    """Whether backend `name` returns body-form results as arrays of MLX's graph."""
    return bool(getattr(get(name), "builds_graph", False))


def output_memory(name: str, call: Dispatch, sizes: list[int]) -> list[OutputMemory | None]:
    """Memory backend `name` lends for outputs of `sizes` bytes of `call` (see
    `Backend.output_memory`); all None where it lends none."""
    lend = getattr(get(name), "output_memory", None)
    return list(lend(call, sizes)) if lend is not None else [None] * len(sizes)


def compile(program: Program, *, backend: str | None = None,
            options: Options | None = None) -> None:
    """Compiles `program` ahead of its first dispatch (where the backend compiles): its
    profiled build with `options.profile`."""
    options = options or Options()
    _chosen(backend, options).compile(program, sanitize=options.sanitize is not None,
                                      profile=options.profile)


def cancel(backend: str | None = None) -> None:
    """Stops what `backend` (None: the default) is running, where it can: on ``sim`` the
    kernel ends at once with `KernelCancelled`. Backends made by `register` that have no
    ``cancel`` are left running."""
    chosen = _instances.get(resolve(backend))
    stop = getattr(chosen, "cancel", None)
    if stop is not None:
        stop()


def hold(kernel: object) -> None:
    """Counts `kernel` as alive until it is collected; when the last one goes, every
    backend made so far is told it is idle (the emulator then ends its worker process)."""
    global _held
    with _held_lock:
        _held += 1
    weakref.finalize(kernel, _released)


def _released() -> None:
    global _held
    with _held_lock:
        _held -= 1
        last = _held == 0
    if last:
        for backend in [b for b in list(_instances.values()) if hasattr(b, "idle")]:
            backend.idle()  # type: ignore[attr-defined]


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Backend, Program, Dispatch]]]:
    """Within it, each dispatch this thread makes is also listed (the backend, the program
    and the call), as a timer learns what a function it times dispatches; not those a
    backend makes inside one (a stand-in backend that runs on another)."""
    found: list[tuple[Backend, Program, Dispatch]] = []
    outer = getattr(_recorded, "calls", None)
    _recorded.calls = found
    try:
        yield found
    finally:
        _recorded.calls = outer


def run(program: Program, call: Dispatch, *, backend: str | None = None) -> Completion:
    """Dispatches `program` on `backend` (None: the default). With the sanitizer on, a
    report with findings raises `SanitizerError` (``"raise"``), warns (``"warn"``) or is
    only kept (``"report"``); the report is on the completion, and on the error as
    `.report`."""
    picked = _chosen(backend, call.options)
    calls, depth = getattr(_recorded, "calls", None), getattr(_recorded, "depth", 0)
    if calls is not None and depth == 0:
        calls.append((picked, program, call))
    _recorded.depth = depth + 1
    try:
        completion = picked.dispatch(program, call)
    finally:
        _recorded.depth = depth
    record(program, completion)
    report = completion.sanitizer
    if report is not None and not report.ok:
        if call.options.sanitize == "raise":
            error = SanitizerError(report)
            error.log = completion.log  # type: ignore[attr-defined]
            raise error
        if call.options.sanitize == "warn":
            warnings.warn(str(report), SanitizerWarning, stacklevel=3)
    return completion
