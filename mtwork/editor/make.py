"""`mtwork.editor(...)`: an `Editor` made from a kernel, the build of its launches, and
what it runs on and is checked against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..families import KernelSpec, load_family
from ..kernel import MetalKernel
from ..library_kernel import Kernel
from ..modelled import GpuChoice
from .knobs import Knobs, Rule
from .loop import Build, EditLoop
from .widget import Editor

__all__ = ["editor"]


def editor(
    kernel: KernelSpec | MetalKernel | Kernel | str,
    build: Build,
    *,
    inputs: Sequence[Any] = (),
    oracle: Any = None,
    space: Mapping[str, Sequence[Any]] | None = None,
    constraints: Sequence[Rule] = (),
    config: Mapping[str, Any] | None = None,
    diff_options: Mapping[str, Any] | None = None,
    backend: str | None = None,
    timeout: float | None = None,
    sanitize: bool = False,
    bench_rounds: int = 3,
    debounce: float = 0.8,
    sweep_budget: int | None = 16,
    sweep_rounds: int = 3,
    gpu: GpuChoice = None,
    height: str = "320px",
    run: bool = True,
) -> Editor:
    """A live editor of a kernel's MSL: type, and it compiles, runs and diffs.

    - `kernel`: what to edit: a `KernelSpec` or "family/name" (e.g. "gguf/q8_0"), whose
      body and header files `save()` (or Ctrl/Cmd-S) writes back; an `mtwork.metal_kernel`
      made in a cell, whose texts stay in the editor until `save(source=path,
      header=path)`; or a kernel of `mtwork.load_metal`, whose library file is edited.
    - `build(config)` returns the launch for a knob setting: an `mtwork.Launch` (or, for
      a `load_metal` kernel, `kernel.launch(buffers=..., grid=..., ...)`); the editor runs
      it with its kernel replaced by the edited one. E.g. for gguf:
      `build=lambda c: gguf.launch("q8_0", packed, **c)`.
    - `inputs`, `oracle`, `diff_options`: as `mtwork.sweep` takes them.
    - `space` (name -> allowed values) and `constraints` (as `mtwork.sweep` takes them)
      become the knobs; `config` picks the starting setting.
    - `bench_rounds`: timing rounds after a correct run (0: none); `timeout`: seconds a
      run may take on sim (default $MTWORK_TIMEOUT, else 30); `debounce`: seconds of
      quiet before an edit runs. Stop (or `cancel()`) ends a running kernel at once, and
      so does an edit while one runs.
    - `sanitize`: start with the Sanitize toggle on (each run checked by the sanitizer,
      its findings at their lines).
    - `sweep_budget`, `sweep_rounds`: what the Sweep button does: every setting when
      they are at most `sweep_budget` (None: always), else a seeded Latin hypercube of
      that many; settings of a compile error class already seen are skipped.
    - `gpu`: the Apple GPU each correct run is modelled on (its modelled time and bound
      are shown) and the Sweep button ranks by, on sim; a name such as "M2 Max", a chip
      of `mtwork.gpu`, None (`MTWORK_GPU`, else the default chip) or False (no model).
    - `run`: start a first run in the background (`wait()` for it). In a notebook run
      headlessly, call `run()` or `wait()` before the cell ends, so that the exported
      HTML holds the result.
    """
    loop = EditLoop(_kernel(kernel), build, inputs=inputs, oracle=oracle,
                    knobs=Knobs(space, constraints, config), diff_options=diff_options,
                    backend=backend, timeout=timeout, sanitize=sanitize,
                    bench_rounds=bench_rounds, gpu=gpu)
    made = Editor(loop, debounce=debounce, sweep_budget=sweep_budget,
                  sweep_rounds=sweep_rounds, height=height)
    if run:
        loop.submit()
    return made


def _kernel(kernel: KernelSpec | MetalKernel | Kernel | str
            ) -> KernelSpec | MetalKernel | Kernel:
    if not isinstance(kernel, str):
        return kernel
    family, _, name = kernel.partition("/")
    kernels = load_family(family).KERNELS
    if name not in kernels:
        raise ValueError(f"family {family!r} has no kernel {name!r}; it has "
                         f"{', '.join(kernels)} (write 'family/name')")
    return kernels[name]

