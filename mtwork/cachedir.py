"""The folder where mtwork keeps what it builds — compiled kernels, the emulator runtime,
rewritten sources, preprocessed listings — and how it keeps it safe.

- Where: $MTWORK_CACHE_DIR, else ``$XDG_CACHE_HOME/mtwork`` or ``~/.cache/mtwork``;
  made private to the user (mode 0700). A folder that cannot be written, or belongs to
  someone else, is replaced by a temporary one, with a warning, removed at exit; the
  emulator's worker process uses the folder its parent settled on.
- Integrity: every artefact is *sealed* when it is published — an HMAC of its bytes under
  a key only the user can read (``.seal-key``, mode 0600) — and checked before it is
  used. A truncated, zeroed or changed artefact is rebuilt, never loaded: nobody who can
  only write the cache can run code in mtwork's processes.
- Concurrency: processes may share the cache (notebooks run side by side). A build holds
  a lock named after its artefact (``builds/locks/``), so another process that needs the
  same artefact waits for it and then uses it, rather than building it again or replacing
  a folder of headers a compile is reading.
- Leftovers: builds happen in folders of ``builds/`` named after their process, and move
  into place when done; those of processes that are gone are removed when a process
  first uses the cache (one folder to list, not the tens of thousands of kernels).
- Size: least recently used artefacts go once they pass $MTWORK_CACHE_MAX (bytes, or
  with K/M/G; default 2G). zig's own build of the C runtime (built once, about 50 MB) is
  kept apart and does not count. A running total (``.usage``: the bytes last counted plus
  those published since) spares each build a walk over the whole cache (a second and
  more for tens of thousands of kernels): the cache is counted again only once the total
  nears the limit, or an hour after the last count.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from .host import exclusive_lock

__all__ = ["build_lock", "cache_dir", "cache_info", "clear_cache", "discard", "evict",
           "is_sealed", "max_size", "pin", "publish", "seal", "used", "work_dir"]

_SEAL_SUFFIX = ".seal"
_pinned: set[Path] = set()  # artefacts this process goes on reading: never evicted
_KEY_NAME = ".seal-key"
_USAGE_NAME = ".usage"
_BUILDS_NAME = "builds"
RECOUNT_SECONDS = 3600.0
_DEFAULT_MAX = 2 << 30
_lock = threading.Lock()
_usable_lock = threading.Lock()
_BUILDING = re.compile(r"^tmp-(\d+)-")  # a build in progress, or left by a killed one


def _chosen() -> Path:
    root = os.environ.get("MTWORK_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtwork"


def _usable(path: Path) -> Path:
    with _usable_lock:  # threads of one process must agree on one folder
        return _usable_once(path)


@cache
def _usable_once(path: Path) -> Path:
    """`path` if it can be made a private, writable folder of ours, else a temporary one."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        owner_ok = not hasattr(os, "getuid") or path.stat().st_uid == os.getuid()
        if owner_ok:
            os.chmod(path, 0o700)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
                pass
            _remove_leftovers(path)
            return path
        reason = "it belongs to another user"
    except OSError as exc:
        reason = f"it cannot be written ({exc.strerror or exc})"
    fallback = Path(tempfile.mkdtemp(prefix="mtwork-cache-"))
    atexit.register(shutil.rmtree, fallback, ignore_errors=True)  # this process's alone
    warnings.warn(f"mtwork's cache {path} is not usable ({reason}); using {fallback} for "
                  f"this process (set MTWORK_CACHE_DIR to choose another)", stacklevel=3)
    return fallback


def cache_dir() -> Path:
    """The cache folder (made, private to the user, when missing)."""
    return _usable(_chosen())


def _builds() -> Path:
    """The cache's folder of builds in progress (and of what killed ones left)."""
    builds = cache_dir() / _BUILDS_NAME
    builds.mkdir(exist_ok=True)
    return builds


def work_dir() -> Path:
    """A fresh folder of the cache to build in, named after this process so that what a
    killed build leaves is recognised and removed later."""
    return Path(tempfile.mkdtemp(dir=_builds(), prefix=f"tmp-{os.getpid()}-"))


@contextlib.contextmanager
def build_lock(artefact: Path) -> Iterator[None]:
    """Held while `artefact` is built: other processes (and threads) building the same one
    wait here, then find it published. Where files cannot be locked, builders race, and
    the last to publish wins (every one is whole)."""
    locks = _builds() / "locks"
    locks.mkdir(exist_ok=True)
    # Named by the artefact's place in the cache: the same artefact, the same lock.
    with exclusive_lock(locks / hashlib.sha256(str(artefact).encode()).hexdigest()[:32]):
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_leftovers(root: Path) -> None:
    """Build folders of processes that are gone."""
    builds = root / _BUILDS_NAME
    if not builds.is_dir():
        return
    for entry in builds.iterdir():
        m = _BUILDING.match(entry.name)
        if m and not _alive(int(m.group(1))):
            discard(entry)


# --- seals ---------------------------------------------------------------------------------


def _key() -> bytes:
    path = cache_dir() / _KEY_NAME
    with _lock:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            return path.read_bytes()
        key = secrets.token_bytes(32)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key


def _digest_of(path: Path) -> str:
    mac = hmac.new(_key(), digestmod=hashlib.sha256)
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            mac.update(f.relative_to(path).as_posix().encode() + b"\0")
            mac.update(f.read_bytes())
            mac.update(b"\0")
    else:
        mac.update(path.read_bytes())
    return mac.hexdigest()


def _seal_path(path: Path) -> Path:
    return path.with_name(path.name + _SEAL_SUFFIX)


def seal(path: Path, final: Path | None = None) -> None:
    """Records the seal of artefact `path` (a file or a folder), for it as `final`."""
    target = _seal_path(final or path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _builds() / f"tmp-{os.getpid()}-{secrets.token_hex(4)}-{target.name}"
    tmp.write_text(_digest_of(path))
    os.replace(tmp, target)


def is_sealed(path: Path) -> bool:
    """Whether `path` exists and matches its seal."""
    try:
        expected = _seal_path(path).read_text().strip()
        return path.exists() and hmac.compare_digest(expected, _digest_of(path))
    except OSError:
        return False


def publish(built: Path, final: Path) -> None:
    """Seals `built` and moves it into place as `final` (other processes may race: the
    last one wins, and every one of them is whole)."""
    seal(built, final)
    if final.is_dir():
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.replace(built, final)
    except OSError:  # a folder another process published first
        shutil.rmtree(built, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):  # evicted at once by another process
        os.utime(_seal_path(final))
        _count_published(_size(final))


def discard(path: Path) -> None:
    """Removes a broken or changed artefact and its seal."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    _seal_path(path).unlink(missing_ok=True)


# --- size ----------------------------------------------------------------------------------


def max_size() -> int:
    """$MTWORK_CACHE_MAX in bytes (digits with an optional K, M or G)."""
    text = os.environ.get("MTWORK_CACHE_MAX", "").strip()
    if not text:
        return _DEFAULT_MAX
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text, re.I)
    if not m:
        raise ValueError(f"MTWORK_CACHE_MAX must be a size such as 500M or 2G, got {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# Entries of the cache folder that are not artefacts, so never evicted (the last is the
# times of `mtwork run`'s notebooks: walkthrough/side_by_side.py).
_KEPT = frozenset({_KEY_NAME, _USAGE_NAME, _BUILDS_NAME, "zig", "preprocess-stubs",
                   "walkthrough-seconds.json"})


def _size(path: Path) -> int:
    """Bytes under `path` (files that vanish while counting, as other processes build,
    are left out)."""
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def _artefacts(root: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of every artefact: the entries of the cache and of its
    subfolders of many (kernels, sources, ...); last use is its seal's time, and one
    without a seal (left by an older mtwork) counts as never used."""
    out = []
    for entry in root.iterdir():
        if (entry.name in _KEPT or entry.name.endswith(_SEAL_SUFFIX)
                or _BUILDING.match(entry.name)):
            continue
        many = entry.is_dir() and entry.name in ("kernels", "sources", "preprocessed",
                                                        "pch")
        for path in (entry.iterdir() if many else [entry]):
            if path.name.endswith(_SEAL_SUFFIX) or _BUILDING.match(path.name):
                continue  # builds in progress are not artefacts yet
            try:
                seal_file = _seal_path(path)
                last = seal_file.stat().st_mtime if seal_file.exists() else 0.0
                out.append((last, _size(path), path))
            except OSError:
                continue
    return out


def used(path: Path) -> None:
    """Marks artefact `path` as just used (for least-recently-used eviction)."""
    with contextlib.suppress(OSError):
        os.utime(_seal_path(path))


def pin(path: Path) -> None:
    """Keeps artefact `path` from eviction while this process runs (a folder that
    compiles include, say)."""
    _pinned.add(path)


def evict(limit: int | None = None, keep: Path | None = None) -> int:
    """Once the cache holds more than 90% of `limit` (default `max_size()`) bytes, removes
    least recently used artefacts (never `keep`, nor pinned ones) until it holds at most
    80%; returns the bytes freed. The cache is walked only when its running total says
    it may be over (the 10% between is what spares the walk on most builds)."""
    limit = max_size() if limit is None else limit
    if _usage_below(limit * 0.9):
        return 0
    items = sorted(_artefacts(cache_dir()))
    total = sum(size for _, size, _ in items)
    if total <= limit * 0.9:
        _record_usage(total)
        return 0
    freed = 0
    for _, size, path in items:
        if total - freed <= limit * 0.8:
            break
        if path in _pinned or path == keep:
            continue
        discard(path)
        freed += size
    _record_usage(total - freed)
    return freed


# --- the running total -------------------------------------------------------------------


@contextlib.contextmanager
def _usage_file() -> Iterator[int | None]:
    """The running total's file, opened and locked against other processes (None where
    files cannot be locked: the cache is then counted every time)."""
    with exclusive_lock(cache_dir() / _USAGE_NAME) as fd:
        yield fd


def _read_usage(fd: int) -> tuple[int, float] | None:
    """(bytes, when they were counted), or None when there is no valid count."""
    fields = os.pread(fd, 64, 0).split()
    try:
        return int(fields[0]), float(fields[1])
    except (IndexError, ValueError):
        return None


def _write_usage(fd: int, total: int, counted: float) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{total} {counted}\n".encode(), 0)


def _usage_below(bound: float) -> bool:
    """Whether the running total, counted recently, is under `bound` bytes."""
    with _usage_file() as fd:
        usage = None if fd is None else _read_usage(fd)
    return (usage is not None and usage[0] <= bound
            and 0 <= time.time() - usage[1] < RECOUNT_SECONDS)


def _record_usage(total: int) -> None:
    with _usage_file() as fd:
        if fd is not None:
            _write_usage(fd, total, time.time())


def _count_published(size: int) -> None:
    """Adds a published artefact's bytes to the running total (a process that publishes
    one artefact twice counts it twice: the total errs high, toward counting again)."""
    with _usage_file() as fd:
        usage = None if fd is None else _read_usage(fd)
        if usage is not None:
            _write_usage(fd, usage[0] + size, usage[1])


def cache_info() -> dict[str, object]:
    """Where the cache is, what it holds, and its limit."""
    root = cache_dir()
    items = _artefacts(root)
    total = _size(root)
    return {"path": str(root), "bytes": total, "artefacts": len(items),
            "artefact_bytes": sum(size for _, size, _ in items),
            "kernels": sum(1 for _, _, p in items if p.parent.name == "kernels"
                           and p.suffix == ".so"),
            "limit": max_size()}


def clear_cache() -> int:
    """Removes everything mtwork cached; returns the bytes freed."""
    root = cache_dir()
    total = _size(root)
    for entry in root.iterdir():
        if entry.name == _KEY_NAME:
            continue
        discard(entry)
    return total
