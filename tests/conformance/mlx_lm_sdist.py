"""mlx-lm's own test files, from the source distribution of the installed mlx-lm.

Fetched with pip (``pip download --no-binary :all: --no-deps``) the first time a test asks
for them; only the sdist's ``tests/`` folder is kept, in the user's cache folder under
the version (``mtwork-sources/mlx-lm-<version>``). Nothing of mlx-lm lives here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

__all__ = ["Unavailable", "sdist", "tests_dir"]


class Unavailable(Exception):
    """The sdist cannot be had here (pip could not fetch it); says why."""


def sdist() -> str:
    """The requirement of the sdist that matches the installed package."""
    return f"mlx-lm=={version('mlx-lm')}"


def tests_dir() -> Path:
    """The sdist's ``tests/`` folder, fetched and unpacked on first use."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = Path(base) / "mtwork-sources" / sdist().replace("==", "-")
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            unpacked = Path(tmp) / "unpacked"
            _unpack(_download(Path(tmp)), unpacked)
            try:  # whole or not at all
                os.replace(unpacked, root)
            except OSError:
                if not root.is_dir():
                    raise
    return root / "tests"


def _download(folder: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "--quiet", sdist(), "-d", str(folder)], capture_output=True, text=True, check=False)
    archives = list(folder.glob("*.tar.gz"))
    if done.returncode or not archives:
        reason = (done.stderr or done.stdout).strip()[-300:]
        raise Unavailable(f"pip download {sdist()} failed: {reason}")
    return archives[0]


def _unpack(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/tests/")]
        if not members:
            raise Unavailable(f"{archive.name} has no tests/ folder")
        for m in members:
            m.name = m.name[len(top) + 1:]
        tar.extractall(into, members=members, filter="data")
