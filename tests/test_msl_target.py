"""What a kernel is held to on sim: the MSL version (its rules and what Apple's compiler
predefines for it) and the GPU family (its limits), from the kernel's arguments or the
environment."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.errors import MetalRuleError
from mtwork.msl.target import DEFAULT_MSL_TARGET, MslTarget, MslVersion, resolve_target

PROBE = """#include <metal_stdlib>
using namespace metal;
kernel void probe(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[0] = __METAL_VERSION__;
#if defined(__HAVE_BFLOAT__)
  out[1] = 1;
#else
  out[1] = 0;
#endif
#if defined(__METAL__)
  out[2] = 1;
#else
  out[2] = 0;
#endif
}
"""


@pytest.mark.parametrize(("version", "expected"), [
    ("3.0", [300, 0, 1]), ("3.1", [310, 1, 1]), (None, [320, 1, 1]), ("4.0", [400, 1, 1]),
])
def test_the_version_sets_what_apples_compiler_predefines(version, expected) -> None:
    lib = mtwork.load_metal(PROBE, msl_version=version)
    out = lib.kernel("probe")(buffers={"out": np.zeros(3, np.int32)}, grid=(1,),
                              threads_per_threadgroup=(1,))["out"]
    assert out.tolist() == expected


def test_the_environment_sets_the_default(monkeypatch) -> None:
    monkeypatch.setenv("MTWORK_MSL_VERSION", "3.1")
    monkeypatch.setenv("MTWORK_GPU_FAMILY", "apple9")
    assert resolve_target() == MslTarget(MslVersion(3, 1), "apple9")
    kernel = mtwork.metal_kernel("env_probe", ["a"], ["out"],
                                 "out[0] = float(__METAL_VERSION__) + a[0];")
    out = kernel(inputs=[mx.zeros(1)], output_shapes=[(1,)], output_dtypes=[mx.float32],
                 grid=(1, 1, 1), threadgroup=(1, 1, 1))[0]
    assert out.tolist() == [310.0]
    # A lambda is MSL 3.2's: refused for this default, accepted when the kernel says 3.2.
    lam = "auto f = [](float v) { return v; };\nout[0] = f(a[0]);"
    with pytest.raises(MetalRuleError, match=r"\[lambda\]"):
        mtwork.metal_kernel("env_lambda", ["a"], ["out"], lam)(
            inputs=[mx.zeros(1)], output_shapes=[(1,)], output_dtypes=[mx.float32],
            grid=(1, 1, 1), threadgroup=(1, 1, 1))
    ok = mtwork.metal_kernel("env_lambda", ["a"], ["out"], lam, msl_version="3.2")
    assert ok(inputs=[mx.ones(1)], output_shapes=[(1,)], output_dtypes=[mx.float32],
              grid=(1, 1, 1), threadgroup=(1, 1, 1))[0].tolist() == [1.0]


def test_the_default_is_msl_3_2_on_apple7(monkeypatch) -> None:
    monkeypatch.delenv("MTWORK_MSL_VERSION", raising=False)
    monkeypatch.delenv("MTWORK_GPU_FAMILY", raising=False)
    assert resolve_target() == DEFAULT_MSL_TARGET == MslTarget(MslVersion(3, 2), "apple7")
    assert DEFAULT_MSL_TARGET.limits.threads_per_threadgroup == 1024
    assert DEFAULT_MSL_TARGET.limits.threadgroup_memory == 32 * 1024


@pytest.mark.parametrize(("given", "version"), [
    ("3.1", MslVersion(3, 1)), ("metal3.2", MslVersion(3, 2)), (320, MslVersion(3, 2)),
    (4.0, MslVersion(4, 0)), ("4.1", MslVersion(4, 1)),
])
def test_versions_are_read_as_written(given, version) -> None:
    assert MslVersion.parse(given) == version


@pytest.mark.parametrize("given", ["2.4", "3.3", "five", True, "32"])
def test_an_unknown_version_is_refused_naming_the_argument(given) -> None:
    with pytest.raises(ValueError, match=r"`msl_version` must be one of 3\.0, 3\.1, 3\.2, "
                                         r"4\.0, 4\.1"):
        mtwork.load_metal(PROBE, msl_version=given)


def test_an_unknown_family_is_refused_naming_the_argument(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"`gpu_family` must be an Apple GPU family: "
                                         r"apple7 \(M1\).*got 'apple6'"):
        mtwork.metal_kernel("f", ["a"], ["out"], "out[0] = a[0];", gpu_family="apple6")
    monkeypatch.setenv("MTWORK_MSL_VERSION", "9")
    with pytest.raises(ValueError, match="`MTWORK_MSL_VERSION` must be one of"):
        resolve_target()
