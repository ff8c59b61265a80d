"""What the editor edits: a kernel's texts, the files they save to, and how the edited
texts become a kernel again.

- `KernelSpec`: a family kernel, its body and header in files under ``kernels/``;
- `MetalKernel`: a body-form kernel made in a cell: its texts live in the editor until
  saved to files the author names;
- a full-source `Kernel` (`mtwork.load_metal`): its library's main file, saved back to
  that file (or, for a library loaded from a string, to a file the author names).

Every target has a ``source`` text and may have a ``header``; `swap` puts the kernel
made from the edited texts into the launch that `build(config)` returned.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..families import KernelSpec
from ..kernel import Launch, MetalKernel
from ..library_kernel import Kernel, LibraryLaunch

__all__ = ["Target", "save_atomically"]

PARTS = ("source", "header")


def save_atomically(path: Path, text: str) -> None:
    """Writes `text` to `path` so that the file holds the old or the new text, never part
    of one: written beside it, flushed to disk, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _parts_of(kernel: Any) -> tuple[str, dict[str, str], dict[str, Path | None],
                                    tuple[str, ...]]:
    """(name, texts, files, output names) of a kernel the editor can edit."""
    if isinstance(kernel, KernelSpec):
        texts = {"source": kernel.read_source()}
        files: dict[str, Path | None] = {"source": kernel.source_path}
        if kernel.header_path is not None:
            texts["header"], files["header"] = kernel.read_header(), kernel.header_path
        return kernel.name, texts, files, tuple(kernel.output_names)
    if isinstance(kernel, MetalKernel):
        return (kernel.name, {"source": kernel.source, "header": kernel.header},
                {"source": None, "header": None}, tuple(kernel.output_names))
    if isinstance(kernel, Kernel):
        writable = tuple(p.name for p in kernel.signature.buffers if p.writable)
        return (kernel.name, {"source": kernel.library.text}, {"source": kernel.library.path},
                writable)
    raise TypeError(f"the editor edits a KernelSpec, an mtwork.metal_kernel or a kernel of "
                    f"mtwork.load_metal, not {type(kernel).__name__}")


class Target:
    """The texts of one kernel being edited, and the files they save to."""

    def __init__(self, kernel: KernelSpec | MetalKernel | Kernel):
        self.kernel = kernel
        # The library a full-source kernel's edits are read into (its own, as loaded).
        self.library = kernel.library if isinstance(kernel, Kernel) else None
        self.name, self._texts, self.files, self.output_names = _parts_of(kernel)
        self._lock = threading.Lock()

    @property
    def has_header(self) -> bool:
        return "header" in self._texts

    def texts(self) -> tuple[str, str]:
        """(source, header) as they are now (header "" when there is none)."""
        with self._lock:
            return self._texts["source"], self._texts.get("header", "")

    def set(self, part: str, text: str) -> None:
        if part not in self._texts:
            raise ValueError(f"kernel {self.name!r} has no {part} to edit")
        with self._lock:
            self._texts[part] = text

    def file_name(self, part: str) -> str:
        path = self.files.get(part)
        return path.name if path else f"{part} (not saved)"

    def changed(self) -> list[str]:
        """The parts whose text differs from their file (or that have text and no file)."""
        with self._lock:
            texts = dict(self._texts)
        changed = []
        for part, text in texts.items():
            path = self.files.get(part)
            if path is None:
                if text:
                    changed.append(part)
            elif not path.is_file() or path.read_text() != text:
                changed.append(part)
        return changed

    def save(self, **paths: str | os.PathLike) -> list[Path]:
        """Writes the changed parts to their files; `source=`/`header=` name the files (a
        kernel made in a cell has none until then). Returns the files written."""
        unknown = set(paths) - set(self._texts)
        if unknown:
            raise ValueError(f"kernel {self.name!r} has no {', '.join(sorted(unknown))} to "
                             f"save; it has {', '.join(self._texts)}")
        for part, path in paths.items():
            self.files[part] = Path(path)
        unnamed = [p for p in self.changed() if self.files.get(p) is None]
        if unnamed:
            example = ", ".join(f"{p}='{self.name}{'.metal' if p == 'source' else '.h'}'"
                                for p in unnamed)
            raise ValueError(f"kernel {self.name!r} is not backed by files: give the path to "
                             f"save its {' and '.join(unnamed)} to, e.g. save({example})")
        written = []
        for part in self.changed():
            save_atomically(self.files[part], self._texts[part])  # type: ignore[arg-type]
            written.append(self.files[part])
        return written  # type: ignore[return-value]

    def revert(self) -> None:
        """Replaces the texts by their files' (texts without a file stay)."""
        with self._lock:
            for part, path in self.files.items():
                if path is not None and path.is_file():
                    self._texts[part] = path.read_text()

    def swap(self, launch: Any, source: str, header: str) -> Any:
        """`launch` (what `build(config)` returned) with the kernel made from the texts."""
        if isinstance(self.kernel, Kernel):
            if not isinstance(launch, LibraryLaunch):
                raise TypeError(f"build(config) must return `kernel.launch(...)` of the "
                                f"full-source kernel, got {type(launch).__name__}")
            return launch.replace_kernel(self.library.with_text(source).kernel_like(
                launch.kernel))
        if not isinstance(launch, Launch):
            raise TypeError(f"build(config) must return an mtwork.Launch, got "
                            f"{type(launch).__name__}")
        return launch.replace_kernel(launch.kernel.with_texts(source=source, header=header))
