"""What every notebook's first kernel waits for on `sim`, built by `mtwork run` while the
notebooks' kernels start.

On a fresh cache the first kernel call of a notebook needs mtwork's MLX extension (about
6 CPU seconds of the host's C++ compiler), the emulator's runtime, MLX's rewritten headers
and the precompiled headers of the kernels and of the Metal check. Notebooks run side by
side need the same ones at the same moment: one builds each while the others wait (the
cache's build locks), the machine's other core idle. Started here, in threads of the
process that runs the notebooks, the builds overlap the kernels' start (about 2 s: the
interpreter, MLX, plotly) and each other. They go through the public paths a notebook's
first call takes (a tiny kernel compiled plain and profiled, the extension loaded), so
what they build is exactly what the notebooks look up; a failure here is left to the
notebook that meets it, which reports it in its walkthrough.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["start_shared_builds"]


def start_shared_builds(backend: str | None) -> list[threading.Thread]:
    """Starts the builds (daemon threads) when the notebooks run on `sim` (`backend`, or
    this machine's default when None); returns the threads, none elsewhere."""
    from ..backends import default_backend

    if (backend or default_backend()) != "sim":
        return []
    threads = [threading.Thread(target=job, name=f"mtwork-shared-{job.__name__}", daemon=True)
               for job in (_extension, _emulator)]
    for thread in threads:
        thread.start()
    return threads


def _extension() -> None:
    from ..graph import available

    with contextlib.suppress(Exception):  # the notebook that meets it reports it
        available()


def _emulator() -> None:
    import mlx.core as mx

    from ..kernel import Launch, metal_kernel

    kernel = metal_kernel("mtwork_shared_builds", ["x"], ["y"],
                          "y[thread_position_in_grid.x] = x[thread_position_in_grid.x];")
    launch = Launch(kernel, grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
                    output_dtypes=[mx.float32])
    x = mx.zeros((32,), mx.float32)
    for profile in (False, True):
        with contextlib.suppress(Exception):  # the notebook's own call reports it
            launch.compile(x, backend="sim", profile=profile)
