"""The mHC collapse and expand kernels' inputs, launches and references. Their weights
are the Sinkhorn split's per-token outputs (pre, post, comb), so `mhc_weights` runs that
kernel to make them, as a model does."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.families import import_sibling
from mtwork.kernel import Launch
from mtwork.sweep import Constraint

common = import_sibling(__name__.rsplit(".", 1)[0], __file__, "common")
reference = import_sibling(__name__.rsplit(".", 1)[0], __file__, "reference")
decode = import_sibling(__name__.rsplit(".", 1)[0], __file__, "decode")


def mhc_weights(tokens: int, seed: int = 0, *, backend: str | None = None
                ) -> list[mx.array]:
    """[pre (tokens, 4), post (tokens, 4), comb (tokens, 4, 4)], float32: the Sinkhorn
    split kernel's outputs for random mixes, one set of weights per token."""
    launch = decode.sinkhorn_launch(tokens)
    return launch(*decode.sinkhorn_inputs(tokens, seed=seed), backend=backend)


def streams_input(tokens: int, dim: int, dtype: mx.Dtype = mx.float32,
                  seed: int = 0) -> mx.array:
    """Residual streams [tokens, 4, dim], normal."""
    return common.normal(np.random.default_rng(seed), (tokens, common.HC, dim), dtype)


def collapse_reference(streams, pre) -> np.ndarray:
    return reference.mhc_collapse(streams, pre)


def expand_reference(f, streams, post, comb) -> np.ndarray:
    return reference.mhc_expand(f, streams, post, comb)


def _checked_width(tokens: int, dim: int, dtype: mx.Dtype, per_thread: int,
                   threads: int) -> int:
    """The threads per token (dim / per_thread), after checking the knobs."""
    common.check_dtype(dtype)
    if per_thread < 1 or dim % per_thread:
        raise ValueError(f"per_thread must divide dim={dim}, got {per_thread}")
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads must be in 1..1024, got {threads}")
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    return dim // per_thread


def collapse_launch(tokens: int, dim: int, dtype: mx.Dtype = mx.float32, *,
                    per_thread: int = 4, threads: int = 128) -> Launch:
    """x [tokens, dim] from streams [tokens, 4, dim] and pre [tokens, 4] float32; thread
    (i, t) writes `per_thread` consecutive features of token t."""
    width = _checked_width(tokens, dim, dtype, per_thread, threads)
    return Launch(
        common.KERNELS["mhc_collapse"].kernel(),
        grid=(width, tokens, 1), threadgroup=(min(threads, width), 1, 1),
        template=[("T", dtype), ("D", dim), ("EPT", per_thread)],
        output_shapes=[(tokens, dim)], output_dtypes=[dtype],
    )


def expand_launch(tokens: int, dim: int, dtype: mx.Dtype = mx.float32, *,
                  per_thread: int = 4, threads: int = 128) -> Launch:
    """new streams [tokens, 4, dim] from f [tokens, dim], streams [tokens, 4, dim], post
    [tokens, 4] and comb [tokens, 4, 4] float32; thread (i, t) writes `per_thread`
    consecutive features of token t in all four streams."""
    width = _checked_width(tokens, dim, dtype, per_thread, threads)
    return Launch(
        common.KERNELS["mhc_expand"].kernel(),
        grid=(width, tokens, 1), threadgroup=(min(threads, width), 1, 1),
        template=[("T", dtype), ("D", dim), ("EPT", per_thread)],
        output_shapes=[(tokens, common.HC, dim)], output_dtypes=[dtype],
    )


# The sweep's space: features per thread and threads per threadgroup of the expand kernel.
EXPAND_SPACE = {"per_thread": [1, 2, 4, 8], "threads": [64, 256]}


def expand_constraints(dim: int) -> list[Constraint | str]:
    return [mtwork.divides("per_thread", dim)]
