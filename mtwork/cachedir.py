"""The folder where mtwork keeps what it builds: compiled kernels, the emulator runtime,
rewritten sources, preprocessed listings. $MTWORK_CACHE_DIR, else the user's cache
folder (``$XDG_CACHE_HOME/mtwork`` or ``~/.cache/mtwork``)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache folder (made when missing)."""
    root = os.environ.get("MTWORK_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "mtwork"
    path.mkdir(parents=True, exist_ok=True)
    return path
