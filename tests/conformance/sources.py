"""Where the conformance suite finds other projects' kernels: in installed packages only.

Nothing here holds another project's kernel code. MLX's kernels are read from the
headers its wheel ships; kernels that mlx-lm and mlx-audio write with
`mx.fast.metal_kernel` are built by those packages' own code, run with
`mtwork.metal_kernel` standing in for `mx.fast.metal_kernel`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import mlx.core as mx
import pytest

import mtwork
from mtwork.msl.includes import mlx_include_dir

# What MLX's own `.metal` files put before a kernel header: the prelude that defines
# `Limits`, `elem_to_loc`, bfloat16 and friends (e.g. `softmax.metal` includes utils.h,
# then softmax.h).
MLX_UTILS = '#include "mlx/backend/metal/kernels/utils.h"\n'


def mlx_kernels_dir() -> Path:
    """The folder of Metal kernel headers inside the installed `mlx` wheel."""
    root = mlx_include_dir()
    if root is None:
        pytest.skip("the installed mlx package ships no Metal kernel headers")
    return root / "mlx" / "backend" / "metal" / "kernels"


def mlx_header(relative: str, *, before: tuple[str, ...] = ()) -> mtwork.Library:
    """MLX's kernel header `relative` (e.g. "softmax.h"), loaded as MLX's matching `.metal`
    file compiles it: utils.h, then the headers in `before`, then the header itself."""
    prelude = MLX_UTILS + "".join(
        f'#include "mlx/backend/metal/kernels/{name}"\n' for name in before
    )
    return mtwork.load_metal(mlx_kernels_dir() / relative, prelude=prelude)


def _spec(qualified_name: str) -> ModuleSpec:
    package = qualified_name.split(".")[0]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (it comes with the `dev` extra)")
    spec = importlib.util.find_spec(qualified_name)
    if spec is None or spec.origin is None:
        pytest.skip(f"the installed {package} has no module {qualified_name}")
    return spec


class Rebuilt(NamedTuple):
    module: ModuleType
    dispatches: list[str]  # the kernels it dispatched, in order, by MLX `name=`


def _recording(make: Callable[..., mtwork.MetalKernel],
               log: list[str]) -> Callable[..., Callable[..., Any]]:
    """`make` (a metal_kernel factory) whose kernels note each dispatch in `log`."""

    def factory(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        kernel = make(*args, **kwargs)

        def dispatch(*call: Any, **options: Any) -> Any:
            log.append(kernel.name)
            return kernel(*call, **options)

        return dispatch

    return factory


def rebuilt_module(qualified_name: str, monkeypatch: pytest.MonkeyPatch) -> Rebuilt:
    """A fresh copy of an installed module whose kernels are mtwork kernels.

    The module's own file is executed again (its parent package is imported as usual,
    so its relative imports work) while `mx.fast.metal_kernel` is `mtwork.metal_kernel`
    and `mx.metal.is_available()` is true, so the code that builds its kernels at import
    time, or in functions it calls later, runs unchanged and builds mtwork kernels. The
    copy is not put in `sys.modules`; the installed module stays as it was. The patches
    last for the test (the module's dispatch code may ask `mx.metal.is_available()` too);
    `MTWORK_BACKEND` is pinned to `sim` so that answer does not send mtwork to Metal.
    The returned `dispatches` lists the kernels run, so a test can tell that a result
    came from a kernel and a reference did not.
    """
    spec = _spec(qualified_name)
    log: list[str] = []
    monkeypatch.setenv("MTWORK_BACKEND", "sim")
    monkeypatch.setattr(mx.fast, "metal_kernel", _recording(mtwork.metal_kernel, log))
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return Rebuilt(module, log)
