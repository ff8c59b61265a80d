"""Counters kept by kernel, geometry and argument values, so that a configuration already
counted is never counted again: in this process, and in the cache folder (sealed like
every artefact there) for the next one, such as a notebook run a second time.

The key is everything the counts depend on: the profiled library (its cache name is the
digest of the kernel's text, flags, shim, runtime and profiler), the kernel's label, the
geometry, threadgroup memory, every buffer (a bound one's dtype, shape, strides and bytes;
a fresh one's shape, dtype and fill), the line granule of $MTWORK_GPU's chip, how the
counts were taken ($MTWORK_PROFILER) and the code that turns the runtime's tallies into
counters (this folder's files). The cache's copy is written by a thread of its own (a
few milliseconds of files and seals that a sweep's setting would otherwise wait for); the
process lets it finish at its end.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import numpy as np

from .... import cachedir
from ....buffers import numpy_view
from ....dispatch import Bound, Dispatch
from ....gpu.counters import Counters

__all__ = ["key", "kept", "keep"]

_KEPT_IN_PROCESS = 512
_in_process: OrderedDict[str, Counters] = OrderedDict()
_lock = threading.Lock()
_FOLDER = "counters"
# Writes the cache's copies one after another; the interpreter lets it finish at exit.
_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtwork-kept-counters")


@cache
def _code_version() -> str:
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def key(library: Path, label: str, call: Dispatch, *, line_bytes: int, how: str) -> str:
    """The key of a profiled dispatch of `library` (the profiled build) over `call`."""
    h = hashlib.blake2b(digest_size=20)
    g = call.geometry
    h.update(repr((str(library), label, tuple(g.grid), tuple(g.threadgroup),
                   sorted(call.threadgroup_memory.items()), line_bytes, how,
                   _code_version())).encode())
    for index in sorted(call.buffers):
        buf = call.buffers[index]
        if isinstance(buf, Bound):
            view = numpy_view(buf.array)
            if buf.contiguous or not view.flags.c_contiguous:
                view = np.ascontiguousarray(view)
            h.update(repr((index, "bound", str(view.dtype), view.shape)).encode())
            h.update(view.reshape(-1).view(np.uint8).data)
        else:
            h.update(repr((index, "fresh", tuple(buf.shape), str(buf.dtype), buf.fill)).encode())
    return h.hexdigest()


def kept(name: str) -> Counters | None:
    """The counters kept under `name`, from this process or the cache folder."""
    with _lock:
        found = _in_process.get(name)
        if found is not None:
            _in_process.move_to_end(name)
            return found
    path = cachedir.cache_dir() / _FOLDER / f"{name}.json"
    if not cachedir.is_sealed(path):
        return None
    try:
        counters = Counters.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):  # written by another version of the counters
        return None
    cachedir.used(path)
    _remember(name, counters)
    return counters


def keep(name: str, counters: Counters) -> None:
    """Keeps `counters` under `name`, here at once and in the cache folder soon after."""
    _remember(name, counters)
    try:
        _writer.submit(_write, name, counters)
    except RuntimeError:  # the interpreter is ending: written now
        _write(name, counters)


def _write(name: str, counters: Counters) -> None:
    try:
        folder = cachedir.cache_dir() / _FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        work = cachedir.work_dir()
    except OSError:  # a cache that cannot be written: the counts stay in this process
        return
    try:
        built = work / f"{name}.json"
        built.write_text(json.dumps(counters.to_dict()))
        cachedir.publish(built, folder / f"{name}.json")
    except OSError:
        pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remember(name: str, counters: Counters) -> None:
    with _lock:
        _in_process[name] = counters
        _in_process.move_to_end(name)
        while len(_in_process) > _KEPT_IN_PROCESS:
            _in_process.popitem(last=False)
