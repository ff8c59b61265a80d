"""llama.cpp's Metal sources, from the pinned `llama-cpp-python` source distribution.

The sdist is fetched with pip (``pip download --no-binary :all: --no-deps``) the first
time something asks for it, and only its ggml sources that Metal compiles
(``ggml/src/ggml-metal/`` and ``ggml/src/ggml-common.h``) are kept, in the user's cache
folder under the pinned version; nothing of llama.cpp lives in this repository. The
conformance suite and ``bench/`` both read it from here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["SDIST", "Unavailable", "cache_dir", "ggml_src", "source_label"]

SDIST = "llama-cpp-python==0.3.36"
_GGML = "vendor/llama.cpp/ggml/src"


class Unavailable(Exception):
    """llama.cpp's sources cannot be had here (pip could not fetch them); says why."""


def source_label() -> str:
    """The package and version the kernels come from, as a report names them."""
    return SDIST.replace("==", " ")


def cache_dir() -> Path:
    """Where the unpacked sources of this version live (``$XDG_CACHE_HOME`` or
    ``~/.cache``, then ``mtwork-sources/<package>-<version>``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtwork-sources" / SDIST.replace("==", "-")


def ggml_src() -> Path:
    """ggml/src of the sdist (``ggml-metal/`` and ``ggml-common.h``), fetched on first use."""
    root = cache_dir()
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            unpacked = Path(tmp) / "unpacked"
            _unpack(_download(Path(tmp)), unpacked)
            # Whole or not at all: a run stopped half-way leaves no partial cache.
            try:
                os.replace(unpacked, root)
            except OSError:
                if not root.is_dir():  # not another process that got there first
                    raise
    return root / _GGML


def _download(folder: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "--quiet", SDIST, "-d", str(folder)], capture_output=True, text=True, check=False)
    archives = list(folder.glob("*.tar.gz"))
    if done.returncode or not archives:
        reason = (done.stderr or done.stdout).strip()[-300:]
        raise Unavailable(f"pip download {SDIST} failed: {reason}")
    return archives[0]


def _unpack(archive: Path, into: Path) -> None:
    """Only ggml-metal/ and ggml-common.h of the sdist, at their places under `into`."""
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        wanted = (f"{top}/{_GGML}/ggml-metal/", f"{top}/{_GGML}/ggml-common.h")
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        if not members:
            raise Unavailable(f"{archive.name} has no {_GGML}/ggml-metal/")
        for m in members:
            m.name = m.name[len(top) + 1:]
        tar.extractall(into, members=members, filter="data")
