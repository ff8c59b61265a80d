"""mlx-audio's `mx.fast.metal_kernel` kernels, built and dispatched by mlx-audio's own code
with `mtwork.metal_kernel` in place of `mx.fast.metal_kernel`, each compared with the
fallback mlx-audio itself runs where there is no Metal GPU."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from .sources import rebuilt_module

SOURCE = "mlx-audio"


def test_encodec_lstm_step(agreement, monkeypatch) -> None:
    # One LSTM time step with the input projection and recurrent gates precomputed,
    # gates in (i, f, g, o) order. Batch 1 only: for a batch of B > 1 the kernel's grid
    # (B, B * hidden) and its element index b * 4 * hidden + y mix the batch rows and
    # write past the (B, hidden) outputs, on a GPU as on sim, so its fallback is the
    # only correct path there.
    encodec, ran = rebuilt_module("mlx_audio.codec.models.encodec.encodec", monkeypatch)
    g = np.random.default_rng(0)
    batch, steps, hidden = 1, 4, 40
    x = mx.array(g.standard_normal((batch, steps, 4 * hidden)) * 2, dtype=mx.float32)
    h_in = mx.array(g.standard_normal((batch, 4 * hidden)), dtype=mx.float32)
    cell = mx.array(g.standard_normal((batch, hidden)), dtype=mx.float32)
    for t in (0, steps - 1):
        hidden_state, cell_state = encodec.lstm_custom(x, h_in, cell, t)
        hidden_ref, cell_ref = encodec.lstm_fallback(x, h_in, cell, t)
        agreement(f"lstm hidden (t={t})", SOURCE, hidden_state, hidden_ref)
        agreement(f"lstm cell (t={t})", SOURCE, cell_state, cell_ref)
    assert ran == ["lstm", "lstm"]


def test_encodec_lstm_layer(agreement, monkeypatch) -> None:
    # The whole layer: its __call__ picks the kernel when Metal is available.
    encodec, ran = rebuilt_module("mlx_audio.codec.models.encodec.encodec", monkeypatch)
    g = np.random.default_rng(1)
    layer = encodec.LSTM(input_size=12, hidden_size=24)
    for name in ("Wx", "Wh", "bias"):
        value = getattr(layer, name)
        setattr(layer, name, mx.array(g.standard_normal(value.shape) * 0.3, dtype=mx.float32))
    x = mx.array(g.standard_normal((1, 5, 12)), dtype=mx.float32)
    on_kernel = layer(x)
    assert ran == ["lstm"] * 5
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    reference = layer(x)
    assert len(ran) == 5
    agreement("lstm layer (5 steps)", SOURCE, on_kernel, reference)


@pytest.mark.parametrize(("dtype", "kernel_size"), [(mx.float32, 7), (mx.float16, 3)])
def test_depthwise_conv1d(agreement, monkeypatch, dtype, kernel_size) -> None:
    conv, ran = rebuilt_module(
        "mlx_audio.sts.models.mossformer2_se.depthwise_conv1d_kernel", monkeypatch
    )
    g = np.random.default_rng(2)
    batch, length, channels = 2, 37, 24
    x = mx.array(g.standard_normal((batch, length, channels))).astype(dtype)
    weight = mx.array(g.standard_normal((channels, kernel_size, 1))).astype(dtype)
    padding = (kernel_size - 1) // 2
    out = conv.depthwise_conv1d(x, weight, padding=padding, groups=channels)
    assert ran == ["custom_depthwise_conv1d"]
    expected = mx.conv1d(x, weight, padding=padding, groups=channels)
    # The kernel accumulates in T; for half that rounds after every step while
    # mx.conv1d rounds once, and outputs reach |4|, where a half ULP is 0.0039.
    tolerance = {"atol": 8e-3, "rtol": 5e-3} if dtype == mx.float16 else {}
    agreement(f"custom_depthwise_conv1d<{str(dtype).removeprefix('mlx.core.')}> k={kernel_size}",
              SOURCE, out, expected, **tolerance)


def test_mossformer_relu_squared_attention(agreement, monkeypatch) -> None:
    kernels, ran = rebuilt_module(
        "mlx_audio.sts.models.mossformer2_se.flash_attention_kernels", monkeypatch
    )
    g = np.random.default_rng(3)
    q, k, v = (mx.array(g.standard_normal((2, 3, 20, 16)), dtype=mx.float32) for _ in range(3))
    flash = kernels.FlashAttentionImplementations
    expected = flash.standard(q, k, v)
    simple = flash.simple_kernel(q, k, v)
    fused = flash.fused_kernel(q, k, v)
    assert ran == ["relu_squared", "qk_relu_squared"]
    agreement("relu_squared attention", SOURCE, simple, expected)
    agreement("qk_relu_squared attention", SOURCE, fused, expected)


def test_phonon_base5_unpack(agreement, monkeypatch) -> None:
    # Ten base-5 symbols per 24-bit little-endian word, unpacked into two 2-bit planes.
    packed, ran = rebuilt_module("mlx_audio.stt.models.phonon.packed", monkeypatch)
    g = np.random.default_rng(4)
    rows, features = 5, 96
    symbols = g.integers(0, 5, (rows, -(-features // 10) * 10)).astype(np.uint32)
    words = (symbols.reshape(rows, -1, 10) * 5 ** np.arange(10, dtype=np.uint32)).sum(-1)
    payload = np.stack([(words >> s) & 0xFF for s in (0, 8, 16)], -1).reshape(rows, -1)
    quint5 = mx.array(payload.astype(np.uint8))
    base, residual = packed.unpack_base5_codes(quint5, features)
    assert ran == ["mlx_audio_phonon_unpack_base5_v1"]
    base_ref, residual_ref = packed._unpack_base5_codes_fallback(quint5, features)
    agreement("phonon unpack base plane", SOURCE, base, base_ref, bitwise=True)
    agreement("phonon unpack residual plane", SOURCE, residual, residual_ref, bitwise=True)
