"""Backend choice and the sim backend's on-disk compile cache."""

import uuid

import mlx.core as mx
import pytest

import mtwork
from mtwork.backends import resolve


def test_backends_reports_each_backend_and_why_not():
    report = mtwork.backends()
    assert {"metal", "sim"} <= set(report)  # and any a test registered
    assert report["sim"] is None
    if not mx.metal.is_available():
        assert "Metal" in report["metal"]


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        resolve("cuda")


@pytest.mark.skipif(mx.metal.is_available(), reason="needs a machine without Metal")
def test_metal_backend_without_a_gpu_says_why():
    kernel = mtwork.metal_kernel("k", ["a"], ["out"], "out[0] = a[0];")
    with pytest.raises(mtwork.BackendUnavailable, match="not an Apple GPU"):
        kernel(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32], backend="metal")


def test_environment_variable_chooses_the_default(monkeypatch):
    monkeypatch.setenv("MTWORK_BACKEND", "sim")
    assert mtwork.default_backend() == "sim"
    monkeypatch.setenv("MTWORK_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="unknown backend"):
        mtwork.default_backend()


def test_compile_cache_is_keyed_by_source(monkeypatch, tmp_path):
    monkeypatch.setenv("MTWORK_CACHE_DIR", str(tmp_path))
    marker = uuid.uuid4().hex

    def run(body):
        kernel = mtwork.metal_kernel("cached", ["a"], ["out"], body)
        return kernel(inputs=[mx.ones((4,))], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                      output_shapes=[(4,)], output_dtypes=[mx.float32])[0]

    def libraries():
        return sorted((tmp_path / "kernels").glob("*.so"))

    first = f"out[thread_position_in_grid.x] = a[0] * 2; // {marker}"
    assert mx.array_equal(run(first), mx.full((4,), 2.0))
    assert len(libraries()) == 1
    run(first)
    assert len(libraries()) == 1
    second = f"out[thread_position_in_grid.x] = a[0] * 3; // {marker}"
    assert mx.array_equal(run(second), mx.full((4,), 3.0))
    assert len(libraries()) == 2
