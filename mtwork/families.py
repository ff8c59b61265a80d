"""Kernel families: the `kernels/<family>/` folders of an mtwork checkout.

Each family folder holds the MSL a person edits (`.metal` files: kernel bodies in MLX's
body form, optional `.h` headers) and `family.py`, which describes the family: its kernels
(`KernelSpec`s), their parameter spaces, oracles and the shapes notebooks and tests use.
`family.py` must define `DESCRIPTION` (one line) and `KERNELS` (a dict name -> KernelSpec).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .kernel import MetalKernel, metal_kernel


def kernels_dir() -> Path:
    """The `kernels/` folder: $MTWORK_KERNELS_DIR, else beside the mtwork package (an
    editable install of a checkout), else found upwards from the working directory."""
    env = os.environ.get("MTWORK_KERNELS_DIR")
    if env:
        return Path(env)
    beside = Path(__file__).resolve().parents[1] / "kernels"
    if beside.is_dir():
        return beside
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / "kernels").is_dir() and (folder / "pyproject.toml").is_file():
            return folder / "kernels"
    raise FileNotFoundError(
        "no kernels/ folder found: install mtwork from a checkout (pip install -e .), run "
        "from the checkout, or set MTWORK_KERNELS_DIR"
    )


@dataclass
class KernelSpec:
    """A body-form kernel whose MSL lives in files: `source` (the body) and an optional
    `header`, both relative to `folder` — the family's folder, which a family module
    gives as ``folder=Path(__file__).parent`` so that the spec finds its files however
    the module was imported. `mtwork.editor(spec, build)` edits it live."""

    name: str
    source: str
    input_names: list[str]
    output_names: list[str]
    header: str | None = None
    ensure_row_contiguous: bool = True
    atomic_outputs: bool = False
    description: str = ""
    folder: Path = field(kw_only=True)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if not self.folder.is_absolute():
            raise ValueError(f"KernelSpec {self.name!r}: `folder` must be an absolute path "
                             f"(the family's folder: Path(__file__).parent), got "
                             f"{self.folder}")

    @property
    def source_path(self) -> Path:
        return self.folder / self.source

    @property
    def header_path(self) -> Path | None:
        return self.folder / self.header if self.header else None

    def read_source(self) -> str:
        return self.source_path.read_text()

    def read_header(self) -> str:
        path = self.header_path
        return path.read_text() if path else ""

    def kernel(self, *, source: str | None = None, header: str | None = None,
               **options: Any) -> MetalKernel:
        """The kernel built from the files (or from `source`/`header` given as text)."""
        return metal_kernel(
            self.name,
            self.input_names,
            self.output_names,
            self.read_source() if source is None else source,
            self.read_header() if header is None else header,
            ensure_row_contiguous=self.ensure_row_contiguous,
            atomic_outputs=self.atomic_outputs,
            **options,
        )


def import_sibling(family_module: str, family_file: str, name: str) -> ModuleType:
    """Imports `<name>.py` beside a family's `family.py` (family folders are not on
    sys.path): `formats = import_sibling(__name__, __file__, "formats")`."""
    qualified = f"{family_module}.{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            qualified, Path(family_file).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def family_names() -> list[str]:
    return sorted(p.parent.name for p in kernels_dir().glob("*/family.py"))


def load_family(name: str) -> ModuleType:
    """Imports `kernels/<name>/family.py`."""
    path = kernels_dir() / name / "family.py"
    if not path.is_file():
        known = ", ".join(family_names()) or "none"
        raise ValueError(f"unknown kernel family {name!r}; families: {known}")
    module_name = f"mtwork_kernels.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path,
                                                  submodule_search_locations=[])
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
