"""Published sources of the validation set, fetched with pip and kept in the user's cache.

Each side of a validation pair is another project's code as it was released: llama.cpp's
Metal kernels from a `llama-cpp-python` source distribution (it vendors llama.cpp, with
`ggml-metal.metal` or `ggml/src/ggml-metal/` of its day), MLX's kernel headers from an `mlx`
wheel for macOS (a zip: pip downloads it on any platform), mlx-lm's kernels from its wheel
(written in Python with `mx.fast.metal_kernel`). Nothing of theirs lives in this
repository: the first use of a version downloads it (`pip download`, so pip's cache keeps
the archive too), and only the files the set reads are kept, under
``$XDG_CACHE_HOME/mtwork-sources/<package>-<version>/`` (``~/.cache`` by default), written
whole or not at all. Later runs, and CI with a warm cache, read them from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["Unavailable", "cache_root", "llama_cpp", "mlx_include", "mlx_lm_package"]

MAC_WHEEL = ("--platform", "macosx_14_0_arm64", "--only-binary=:all:", "--python-version",
             "3.11")


class Unavailable(Exception):
    """A published source cannot be had here (pip could not fetch it); says why."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtwork-sources"


def llama_cpp(version: str) -> Path:
    """The vendored llama.cpp folder of `llama-cpp-python==version` (its Metal sources:
    ``ggml-metal.metal`` at the top in 2023, ``ggml/src/ggml-metal/`` since)."""
    def keep(name: str) -> bool:
        tail = name.split("/vendor/llama.cpp/", 1)[-1] if "/vendor/llama.cpp/" in name else ""
        return bool(tail) and ("metal" in tail.lower() or tail.endswith("ggml-common.h"))

    root = _cached(f"llama-cpp-python-{version}",
                   lambda folder: _download(f"llama-cpp-python=={version}", folder,
                                            "--no-binary", "llama-cpp-python"),
                   keep)
    found = next(root.glob("*/vendor/llama.cpp"), None)
    if found is None:
        raise Unavailable(f"llama-cpp-python {version} vendors no llama.cpp Metal sources")
    return found


def mlx_include(version: str) -> Path:
    """The ``include`` folder of MLX `version`'s macOS wheel: MLX's kernel headers at
    ``mlx/backend/metal/kernels/``. Since 0.26 they are in the `mlx-metal` wheel of the
    same version, before in the `mlx` wheel itself."""
    wanted = "mlx/include/mlx/backend/metal/kernels/"
    split = tuple(int(part) for part in version.split(".")[:2]) >= (0, 26)
    for package in ("mlx-metal", "mlx") if split else ("mlx", "mlx-metal"):
        try:
            root = _cached(f"{package}-{version}",
                           lambda folder, p=package: _download(f"{p}=={version}", folder,
                                                               *MAC_WHEEL),
                           lambda name: name.startswith(wanted))
        except Unavailable:
            continue
        return root / "mlx" / "include"
    raise Unavailable(f"neither the mlx nor the mlx-metal {version} wheel for macOS ships "
                      "MLX's Metal kernel headers")


def mlx_lm_package(version: str) -> Path:
    """The ``mlx_lm`` package folder of the `mlx-lm==version` wheel (pure Python)."""
    root = _cached(f"mlx-lm-{version}",
                   lambda folder: _download(f"mlx-lm=={version}", folder,
                                            "--only-binary=:all:"),
                   lambda name: name.startswith("mlx_lm/") and name.endswith(".py"))
    return root / "mlx_lm"


def _cached(label: str, download: Callable[[Path], Path],
            keep: Callable[[str], bool]) -> Path:
    """`label`'s folder in the cache, filled on first use with the members of the
    downloaded archive that `keep` accepts. Whole or not at all: a run stopped half-way
    leaves no partial folder."""
    root = cache_root() / label
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        unpacked = Path(tmp) / "unpacked"
        _unpack(download(Path(tmp)), unpacked, keep)
        try:
            os.replace(unpacked, root)
        except OSError:
            if not root.is_dir():  # not another process that got there first
                raise
    return root


def _download(requirement: str, folder: Path, *options: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *options,
         requirement, "-d", str(folder)], capture_output=True, text=True, check=False)
    archives = [p for p in folder.iterdir() if p.suffix in (".gz", ".whl", ".zip")]
    if done.returncode or not archives:
        reason = (done.stderr or done.stdout).strip()[-300:]
        raise Unavailable(f"pip download {requirement} failed: {reason}")
    return archives[0]


def _unpack(archive: Path, into: Path, keep: Callable[[str], bool]) -> None:
    into.mkdir()
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if keep(n) and not n.endswith("/")]
            if not names:
                raise Unavailable(f"{archive.name} has none of the files wanted")
            z.extractall(into, members=names)
        return
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and keep(m.name)]
        if not members:
            raise Unavailable(f"{archive.name} has none of the files wanted")
        tar.extractall(into, members=members, filter="data")
