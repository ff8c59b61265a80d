"""mtwork's pytest plugin: ``pytest --mtwork`` runs a project's own tests with its
``mx.fast.metal_kernel`` kernels on mtwork (`mtwork.interpose` for the whole run), so a
kernel project's test suite runs on Linux CI as it is.

- ``--mtwork``: interpose for the run: ``mx.fast.metal_kernel`` is mtwork's (on ``sim``
  off a Mac), ``mx.metal.is_available()`` is True, ``mx.gpu`` is the device mtwork's
  kernels run on (so ``mx.default_device() == mx.gpu``), ``mx.device_info()`` and the
  memory functions answer for the modelled chip;
- ``--mtwork-sanitize``: the same, and every kernel call is sanitized (a finding fails the
  test that evaluated the kernel, with the report);
- ``--mtwork-chip NAME``: the chip ``mx.device_info()`` describes (default: $MTWORK_GPU or
  mtwork's default chip);
- ``--mtwork-no-metal``: ``mx.metal.is_available()`` stays False (the project's own
  fallbacks run, with any kernel it makes regardless on mtwork);
- ``--mtwork-keep-gpu``: ``mx.gpu`` stays MLX's (off a Mac, code that asks
  ``mx.default_device() == mx.gpu`` then takes its CPU path).

Installed with mtwork (the ``pytest11`` entry point), so it is loaded into every pytest
run of the environment: without its options it only adds them (mtwork's public names are
imported, nothing is interposed, no emulator is started). Interposition starts before the
test modules are imported, so kernels a module makes at import are mtwork's.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["pytest_addoption", "pytest_configure", "pytest_report_header",
           "pytest_unconfigure"]

_KEY = "_mtwork_interposition"
_SANITIZE_VARIABLE = "MTWORK_SANITIZE"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("mtwork", "mtwork: Metal kernels on any machine")
    group.addoption("--mtwork", action="store_true", default=False,
                    help="run mx.fast.metal_kernel kernels on mtwork (sim off a Mac), with "
                         "mx.metal.is_available() True")
    group.addoption("--mtwork-sanitize", action="store_true", default=False,
                    help="--mtwork, with every kernel call sanitized")
    group.addoption("--mtwork-chip", default=None, metavar="NAME",
                    help="the Apple chip mx.device_info() describes (e.g. 'M3 Max')")
    group.addoption("--mtwork-no-metal", action="store_true", default=False,
                    help="with --mtwork: mx.metal.is_available() stays False")
    group.addoption("--mtwork-keep-gpu", action="store_true", default=False,
                    help="with --mtwork: mx.gpu stays MLX's (not the device mtwork's "
                         "kernels run on)")


def pytest_configure(config: Any) -> None:
    sanitize = config.getoption("mtwork_sanitize")
    if not (config.getoption("mtwork") or sanitize):
        return
    from .interposition import interpose

    if sanitize:  # mtwork's own kernels too, and the worker process's
        config._mtwork_sanitize_before = os.environ.get(_SANITIZE_VARIABLE)
        os.environ[_SANITIZE_VARIABLE] = "1"
    import mlx.core as mx

    keep = config.getoption("mtwork_keep_gpu")
    setattr(config, _KEY, interpose(
        metal_available=not config.getoption("mtwork_no_metal"),
        sanitize=True if sanitize else None, chip=config.getoption("mtwork_chip"),
        gpu_device=mx.DeviceType.gpu if keep else None))


def pytest_unconfigure(config: Any) -> None:
    interposition = getattr(config, _KEY, None)
    if interposition is None:
        return
    interposition.restore()
    setattr(config, _KEY, None)
    if hasattr(config, "_mtwork_sanitize_before"):
        before = config._mtwork_sanitize_before
        if before is None:
            os.environ.pop(_SANITIZE_VARIABLE, None)
        else:
            os.environ[_SANITIZE_VARIABLE] = before


def pytest_report_header(config: Any) -> str | None:
    interposition = getattr(config, _KEY, None)
    if interposition is None:
        return None
    from .backends import default_backend

    where = interposition.backend or default_backend()
    sanitized = ", every call sanitized" if interposition.sanitize else ""
    return (f"mtwork: mx.fast.metal_kernel runs on {where}{sanitized}; "
            f"mx.metal.is_available() -> {interposition.metal_available}; "
            f"mx.gpu -> {interposition.gpu_device}; device: Apple {interposition.chip.name}")
