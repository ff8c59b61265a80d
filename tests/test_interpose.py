"""`mtwork.interpose()`: MLX's Metal functions answered by mtwork for a while, then MLX's
again; mtwork's own decisions keep MLX's answers throughout."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mtwork
from mtwork.backends.metal import MetalBackend
from mtwork.gpu.device import architecture
from mtwork.native import metal_available, original

# The keys MLX's Metal backend answers mx.device_info() with (device_info.cpp).
METAL_KEYS = {"device_name", "architecture", "max_buffer_length",
              "max_recommended_working_set_size", "memory_size", "resource_limit"}


def test_as_a_function_and_as_a_context_manager_it_puts_mlx_back() -> None:
    before = (mx.fast.metal_kernel, mx.metal.is_available, mx.device_info)
    interposition = mtwork.interpose()
    try:
        assert mx.metal.is_available() is True
        assert original(mx.fast.metal_kernel) is before[0]
        kernel = mx.fast.metal_kernel(name="inc", input_names=["a"], output_names=["b"],
                                      source="b[0] = a[0] + 1;")
        assert isinstance(kernel, mtwork.MetalKernel)
        out = kernel(inputs=[mx.array([41.0])], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                     output_shapes=[(1,)], output_dtypes=[mx.float32])[0]
        assert out.item() == 42.0
    finally:
        interposition.restore()
    assert (mx.fast.metal_kernel, mx.metal.is_available, mx.device_info) == before
    with mtwork.interpose(metal_available=False) as inner:
        assert mx.metal.is_available() is False and inner.active
    assert not inner.active and mx.metal.is_available is before[1]


def test_device_info_describes_the_modelled_chip_with_metals_keys() -> None:
    with mtwork.interpose(chip="M3 Max"):
        info = mx.device_info()
        assert set(info) == METAL_KEYS and info == mx.metal.device_info()
        assert info["device_name"] == "Apple M3 Max"
        assert info["architecture"] == "applegpu_g15c"
        assert info["max_recommended_working_set_size"] < info["memory_size"]
        assert mx.device_info(mx.cpu) == original(mx.device_info)(mx.cpu)
        previous = mx.set_wired_limit(info["max_recommended_working_set_size"])
        assert mx.set_wired_limit(0) == info["max_recommended_working_set_size"]
        assert previous == 0
        with pytest.raises(ValueError, match="larger than the maximum working set"):
            mx.set_wired_limit(info["max_recommended_working_set_size"] + 1)
        assert mx.metal.get_active_memory() >= 0  # MLX's own count


def test_architecture_strings_follow_metals_names() -> None:
    assert [architecture(mtwork.gpu(name)) for name in ("M1", "M1 Pro", "M2 Max",
                                                        "M4 Pro", "M2 Ultra")] == [
        "applegpu_g13g", "applegpu_g13s", "applegpu_g14c", "applegpu_g16s", "applegpu_g14d"]


def test_mtworks_own_choices_keep_mlxs_answers() -> None:
    native = metal_available()
    with mtwork.interpose():
        assert metal_available() == native
        assert (MetalBackend().unavailable_reason() is None) == native


def test_sanitize_every_interposed_call() -> None:
    with mtwork.interpose(sanitize="report"):
        kernel = mx.fast.metal_kernel(name="past", input_names=["a"], output_names=["b"],
                                      source="b[0] = a[1];")
        out = kernel(inputs=[mx.array([1.0])], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                     output_shapes=[(1,)], output_dtypes=[mx.float32])[0]
        mx.eval(out)
        assert kernel.last_sanitizer_report.of_kind("out-of-bounds access")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="`metal_available`"):
        mtwork.interpose(metal_available="yes")
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        mtwork.interpose(backend="gpu")
    with pytest.raises(TypeError, match="`chip`"):
        mtwork.interpose(chip=3)
