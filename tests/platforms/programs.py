"""The programs the platform tests build elsewhere: the self-test's corpus (its own
kernels, MLX's, one launch of each family) recorded as sim receives them, and a sample of
llama.cpp's library kernels as its host compiles them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

from mtwork.backends import register, unregister
from mtwork.dispatch import Program
from mtwork.selftest import Case, cases

from .foreign import Recorded, Recorder

# Kernels of llama.cpp's library (file, host name), one of each kind: a SIMD-group
# reduction, simdgroup_matrix tiles, SIMD-groups in lockstep through threadgroup memory.
LLAMA_CPP_SAMPLE = (("softmax.metal", "kernel_soft_max_f32"),
                    ("mul_mm.metal", "kernel_mul_mm_f16_f32"),
                    ("fa_vec_f16.metal", "kernel_flash_attn_ext_vec_f16_dk128_dv128"))


@contextmanager
def recording() -> Iterator[Recorder]:
    """A backend named "recorded" that runs on sim in this process and keeps each call."""
    recorder = Recorder()
    register("recorded", lambda: recorder)
    try:
        yield recorder
    finally:
        unregister("recorded")


def corpus() -> dict[str, Case]:
    found, _ = cases()
    return {c.name: c for c in found}


def record(recorder: Recorder, case: Case) -> list[Recorded]:
    """`case`'s calls, run once on the recorder."""
    recorder.calls.clear()
    mx.eval([o for o in case.run("recorded") if isinstance(o, mx.array)])  # runs them
    return list(recorder.calls)


def llama_cpp_program(file: str, name: str) -> Program:
    """A llama.cpp kernel's program, with the function constants its host sets."""
    from tests.conformance.llama_cpp import library
    from tests.conformance.test_llama_cpp_compile import constants_of

    lib = library(file)
    return lib.kernel(name, constants=constants_of(lib)).program
