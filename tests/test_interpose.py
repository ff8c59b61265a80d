"""`mtwork.interpose()`: MLX's Metal functions answered by mtwork for a while, then MLX's
again; mtwork's own decisions keep MLX's answers throughout."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mtwork
from mtwork.backends import get
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
    with mtwork.interpose(chip="M3 Max", gpu_device=mx.DeviceType.gpu):
        info = mx.device_info()
        assert set(info) == METAL_KEYS and info == mx.metal.device_info()
        assert info == mx.device_info(mx.gpu) == mx.device_info(mx.Device(mx.gpu))
        assert info["device_name"] == "Apple M3 Max"
        assert info["architecture"] == "applegpu_g15c"
        assert info["max_recommended_working_set_size"] < info["memory_size"]
        assert mx.device_info(mx.cpu) == original(mx.device_info)(mx.cpu)


def test_limits_are_the_modelled_chips_and_reach_what_holds_memory() -> None:
    shared = get("sim").shared_memory
    mlx_cache = original(mx.set_cache_limit)(1 << 30)  # MLX's own, to compare and restore
    original(mx.set_cache_limit)(mlx_cache)
    heap_cache = shared.cache_limit
    try:
        with mtwork.interpose(chip="M2 Ultra"):
            info = mx.device_info()
            working_set = info["max_recommended_working_set_size"]
            # MLX's Metal allocator: the memory limit, and the cache limit after it.
            modelled = int(min(1.5 * working_set, 0.95 * info["memory_size"]))
            assert mx.get_memory_limit() == mx.metal.get_memory_limit() == modelled
            assert mx.set_memory_limit(modelled // 2) == modelled
            assert mx.metal.set_memory_limit(modelled) == modelled // 2
            assert mx.set_cache_limit(1 << 20) == modelled
            assert original(mx.set_cache_limit)(1 << 20) == 1 << 20  # MLX's too
            assert shared.cache_limit == 1 << 20  # and the memory shared with the worker
            assert mx.metal.set_cache_limit(modelled) == 1 << 20
            assert mx.set_wired_limit(working_set) == 0
            assert mx.metal.set_wired_limit(0) == working_set
            with pytest.raises(ValueError, match="larger than the maximum working set"):
                mx.set_wired_limit(working_set + 1)
            with pytest.raises(TypeError, match="`limit` must be a number of bytes"):
                mx.set_memory_limit(-1)
    finally:
        original(mx.set_cache_limit)(mlx_cache)
        shared.set_cache_limit(heap_cache)


def test_counters_report_real_use_shared_memory_included() -> None:
    kernel = mtwork.metal_kernel("ones", ["a"], ["out"],
                                 "out[thread_position_in_grid.x] = 1.0f;")
    n = 1 << 20
    with mtwork.interpose():
        before = mx.get_active_memory()
        assert before == mx.metal.get_active_memory() >= original(mx.get_active_memory)()
        out = kernel(inputs=[mx.zeros((1,))], grid=(n, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(n,)], output_dtypes=[mx.float32], isolate=True)[0]
        mx.eval(out)
        # The output is memory shared with the worker, not MLX's: counted all the same.
        assert mx.get_active_memory() >= before + 4 * n
        assert mx.get_peak_memory() >= mx.get_active_memory()
        del out
        assert mx.get_active_memory() < before + 4 * n
        assert mx.get_cache_memory() >= 4 * n  # its block, kept for the next call
        mx.clear_cache()
        mx.reset_peak_memory()
        assert mx.get_peak_memory() <= mx.get_active_memory() + original(mx.get_peak_memory)()


def test_mx_gpu_is_the_device_mtworks_kernels_run_on() -> None:
    native = metal_available()
    with mtwork.interpose() as interposition:
        if native:
            assert mx.gpu == mx.DeviceType.gpu, "on a Mac, MLX's own GPU"
        else:
            assert mx.gpu == mx.cpu and mx.default_device() == mx.gpu
            stream = mx.new_stream(mx.gpu)  # MLX refuses a GPU stream without Metal
            with mx.stream(stream):
                assert mx.exp(mx.array(0.0)).item() == 1.0
        assert interposition.gpu_device == mx.gpu
    assert mx.gpu == mx.DeviceType.gpu
    with mtwork.interpose(gpu_device=mx.DeviceType.gpu):
        assert mx.gpu == mx.DeviceType.gpu
    with mtwork.interpose(metal_available=False):  # Metal looks absent: MLX's own
        assert mx.gpu == mx.DeviceType.gpu
    with pytest.raises(TypeError, match="`gpu_device`"):
        mtwork.interpose(gpu_device="cpu")


def test_calls_of_interposed_kernels_are_counted() -> None:
    with mtwork.interpose() as interposition:
        kernel = mx.fast.metal_kernel(name="twice", input_names=["a"], output_names=["b"],
                                      source="b[0] = 2 * a[0];")
        for _ in range(3):
            kernel(inputs=[mx.array([1.0])], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                   output_shapes=[(1,)], output_dtypes=[mx.float32])
    assert interposition.calls == {"twice": 3}


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
