"""Building mtwork's MLX extension (`extension.cpp`) at its first use, and loading it.

The extension is compiled the way MLX's documentation builds one ("Custom Extensions in
MLX"): against the installed MLX's headers and library, with nanobind in MLX's domain so
that ``mx.array`` objects cross as MLX's own arrays. Two facts decide the tools:

- the C++ standard library must be the one MLX was built with (its arrays hold
  ``std::shared_ptr`` and ``std::vector``, whose layouts differ between libstdc++ and
  libc++): MLX's Linux wheels use libstdc++, its macOS wheels libc++, so the compiler is
  the host's (``$CXX``, else ``c++``), which uses the host's library, as MLX's build
  does; zig's clang brings its own libc++ and cannot stand in for it;
- nanobind's types are shared between modules of one domain only when their internals
  agree, so nanobind's version must be one whose internals MLX's was built with (the
  ``nanobind`` dependency's range follows MLX's); a mismatch is told, not crashed on.

Building takes 10-30 s once; the result is sealed in mtwork's cache like a kernel and
keyed by everything that shapes it (this source, MLX's library, nanobind, the compiler,
the interpreter). The flags that differ between hosts are all in `host_flags`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from types import ModuleType

import mlx.core as mx

from .. import cachedir
from ..errors import BackendUnavailable
from ..host import extension_link_flags, shared_library

__all__ = ["GraphUnavailable", "host_flags", "load"]

MODULE_NAME = "_mtwork_graph"
_SOURCE = Path(__file__).with_name("extension.cpp")
_lock = threading.Lock()


class GraphUnavailable(BackendUnavailable):
    """mtwork's MLX extension cannot be built or loaded here (the reason says why)."""


def _mlx_dirs() -> tuple[Path, Path]:
    root = Path(mx.__file__).parent  # the mlx package (mlx.core is a module in it)
    return root / "include", root / "lib"


def _mlx_library(lib_dir: Path) -> Path:
    return lib_dir / shared_library("mlx")


def host_flags(mlx_lib: Path) -> list[str]:
    """The compiler and linker flags that differ between hosts: a Python extension that
    links MLX's library and finds it where it is at run time."""
    # On macOS: Python's symbols from the interpreter at load, macOS 14 as MLX targets
    # (mlx/extension.py builds extensions so too): the platform layer's.
    return ["-shared", "-fPIC", f"-Wl,-rpath,{mlx_lib.parent}", str(mlx_lib),
            *extension_link_flags()]


def _compiler() -> list[str]:
    chosen = os.environ.get("CXX")
    command = shlex.split(chosen) if chosen else ["c++"]
    if shutil.which(command[0]) is None:
        raise GraphUnavailable(
            f"no C++ compiler: mtwork builds its MLX extension with the host's compiler "
            f"({command[0]!r} is not on PATH; set $CXX, or install one: build-essential "
            f"on Debian and Ubuntu, the Xcode command line tools on macOS)")
    return command


def _stable_abi() -> bool:
    """Whether MLX's own module is built for Python's stable ABI (then ours must be too:
    nanobind keeps the two kinds of modules apart)."""
    return ".abi3." in Path(mx.__file__).name


def _suffix() -> str:
    return ".abi3.so" if _stable_abi() else sysconfig.get_config_var("EXT_SUFFIX")


def _nanobind() -> ModuleType:
    try:
        import nanobind
    except ImportError as exc:
        raise GraphUnavailable("mtwork's MLX extension needs nanobind: pip install "
                               "nanobind") from exc
    return nanobind


def _flags(nanobind: ModuleType) -> list[str]:
    include, lib = _mlx_dirs()
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        raise GraphUnavailable(f"Python's headers are missing ({python_include}/Python.h): "
                               f"install them (python3-dev on Debian and Ubuntu)")
    nb_dir = Path(nanobind.__file__).parent
    flags = ["-std=c++20", "-O2", "-fvisibility=hidden", "-fno-strict-aliasing",
             "-DNB_DOMAIN=mlx", "-DNDEBUG", f"-I{nanobind.include_dir()}",
             f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}", f"-I{include}",
             f"-I{python_include}"]
    if _stable_abi():
        flags.append("-DPy_LIMITED_API=0x030C0000")
    return flags


def _key(compiler: list[str], flags: list[str], nanobind: ModuleType) -> str:
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True,
                             check=False).stdout
    library = _mlx_library(_mlx_dirs()[1])
    st = library.stat()
    parts = [_SOURCE.read_text(), " ".join(compiler), version, " ".join(flags),
             " ".join(host_flags(library)),
             nanobind.__version__, mx.__version__, f"{library}:{st.st_size}:{st.st_mtime_ns}",
             sys.version, _suffix()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _build(target: Path, compiler: list[str], flags: list[str], nanobind: ModuleType) -> None:
    """Compiles the extension and nanobind's library to objects side by side (two
    processes: about 3 s each, which the notebooks of a fresh `mtwork run` all wait for),
    then links them."""
    work = cachedir.work_dir()
    try:
        built = work / target.parent.name
        built.mkdir()
        sources = [_SOURCE, Path(nanobind.__file__).parent / "src" / "nb_combined.cpp"]
        objects = [work / f"{source.stem}.o" for source in sources]
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            compiled = list(pool.map(
                lambda job: _run([*compiler, *flags, "-fPIC", "-c", str(job[0]),
                                  "-o", str(job[1])]), zip(sources, objects)))
        link = host_flags(_mlx_library(_mlx_dirs()[1]))  # after the objects that need it
        for result in [*compiled, _run([*compiler, *map(str, objects), *link,
                                        "-o", str(built / target.name)])]:
            if result.returncode != 0:
                raise GraphUnavailable(f"building mtwork's MLX extension failed:\n"
                                       f"{result.stderr[-4000:]}")
        cachedir.publish(built, target.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE_NAME] = module
    return module


def _check_domain(module: ModuleType, nanobind: ModuleType) -> None:
    """An extension whose nanobind cannot see MLX's arrays refuses them: say why."""
    try:
        module.is_tracer(mx.array(0))
    except TypeError:
        raise GraphUnavailable(
            f"nanobind {nanobind.__version__} does not share its types with the nanobind "
            f"MLX {mx.__version__} was built with (their internals differ); install the "
            f"nanobind release MLX's build names (see the `nanobind` requirement of mtwork "
            f"and of MLX's pyproject)") from None


@cache
def load() -> ModuleType:
    """The extension module, built first if the cache has none; `GraphUnavailable` when it
    cannot be built or cannot see MLX's types."""
    with _lock:
        nanobind = _nanobind()
        compiler = _compiler()
        flags = _flags(nanobind)
        folder = cachedir.cache_dir() / "graph" / _key(compiler, flags, nanobind)
        target = folder / (MODULE_NAME + _suffix())
        # Notebooks run side by side start at once: one builds, the others wait for it.
        with cachedir.build_lock(folder):
            if not cachedir.is_sealed(folder):
                cachedir.discard(folder)
                _build(target, compiler, flags, nanobind)
        cachedir.pin(folder)
        try:
            module = _import(target)
        except ImportError as exc:  # e.g. a symbol this MLX's library does not export
            raise GraphUnavailable(f"mtwork's MLX extension does not load: {exc}") from None
        _check_domain(module, nanobind)
        return module
