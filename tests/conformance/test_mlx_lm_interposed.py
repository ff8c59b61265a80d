"""mlx-lm's kernels as its users meet them: under `mtwork.interpose()`, with nothing
patched by hand, mlx-lm's modules are imported as they are and build their kernels with
what they believe is ``mx.fast.metal_kernel``; their public functions run the kernels
(on sim) and agree with mlx-lm's own pure-MLX path where the package has one (its models'
ops functions), else with a reference written from the algorithm with MLX's CPU ops (its
`kernels/` package is Metal-only). Inside `mx.compile` too.

The modules that build kernels are imported afresh under interposition (a module builds
its kernels when it is imported, so that is what a project does: interpose first, in its
conftest or with ``pytest --mtwork``) and put back as they were afterwards.
"""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import graph

SOURCE = "mlx-lm (interposed)"
pytest.importorskip("mlx_lm", reason="mlx-lm comes with the `dev` extra")
pytestmark = pytest.mark.skipif(not graph.available(),
                                reason=f"no MLX extension: {graph.unavailable_reason()}")

_FRESH = ("mlx_lm.kernels", "mlx_lm.models.gated_delta", "mlx_lm.models.ssm",
          "mlx_lm.models.rwkv7")


@pytest.fixture
def interposed():
    """`importlib.import_module` under `mtwork.interpose()`, for modules imported afresh."""
    saved = {name: module for name, module in sys.modules.items()
             if name.startswith(_FRESH)}
    for name in saved:
        del sys.modules[name]
    with mtwork.interpose(backend="sim") as interposition:
        assert mx.metal.is_available()
        yield importlib.import_module
    assert not interposition.active
    for name in [n for n in sys.modules if n.startswith(_FRESH)]:
        del sys.modules[name]
    for name, module in saved.items():
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)


def _close(got, want, what: str, rtol: float = 2e-5, atol: float = 2e-6) -> None:
    got, want = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def _normal(*shape, seed=0):
    return mx.array(np.random.default_rng(seed).standard_normal(shape), dtype=mx.float32)


# --- kernels/: Metal only; references from the algorithm -----------------------------------


def test_qk_norm_and_inside_compile(interposed) -> None:
    kernels = interposed("mlx_lm.kernels")
    hq, hk, d, eps, scale = 4, 2, 64, 1e-6, 0.125
    qkvg = _normal(2, 3, 2 * (hq + hk) * d)
    q, k = kernels.qk_norm(qkvg, n_heads=hq, n_kv_heads=hk, head_dim=d, eps=eps,
                           query_scale=scale)
    heads = qkvg[..., : (hq + hk) * d].reshape(2, 3, hq + hk, d)
    normed = mx.fast.rms_norm(heads, None, eps)
    _close(q, normed[..., :hq, :] * scale, "qk_norm q")
    _close(k, normed[..., hq:, :], "qk_norm k")
    compiled = mx.compile(lambda x: kernels.qk_norm(x, n_heads=hq, n_kv_heads=hk,
                                                    head_dim=d, eps=eps, query_scale=scale))
    for a, b in zip(compiled(qkvg), (q, k)):
        assert np.array(a).tobytes() == np.array(b).tobytes()


def test_rms_norm_sigmoid_gate(interposed) -> None:
    kernels = interposed("mlx_lm.kernels")
    b, h, length, d, eps = 2, 3, 4, 64, 1e-5
    x, gate = _normal(b, h, length, d, seed=1), _normal(b, length, h * d, seed=2)
    out = kernels.rms_norm_sigmoid_gate(x, gate, eps=eps)
    normed = mx.fast.rms_norm(x, None, eps).transpose(0, 2, 1, 3).reshape(b, length, h * d)
    _close(out, normed * mx.sigmoid(gate), "rms_norm_sigmoid_gate")


def test_norm_add_norm_and_pre_norm(interposed) -> None:
    kernels = interposed("mlx_lm.kernels")
    nn = pytest.importorskip("mlx.nn")
    d = 256
    branch, stream = _normal(2, 5, d, seed=3), _normal(2, 5, d, seed=4)
    alpha, beta = 1 + 0.1 * _normal(d, seed=5), 0.5 + 0.1 * _normal(d, seed=6)
    post_weight = 1 + 0.1 * _normal(d, seed=7)
    norm = nn.RMSNorm(d, eps=1e-6)
    norm.weight = 1 + 0.1 * _normal(d, seed=8)
    new_stream, normed = kernels.norm_add_norm(branch, stream, alpha=alpha, beta=beta,
                                               post_weight=post_weight, post_eps=1e-5,
                                               next_norm=norm)
    want = alpha * stream + beta * mx.fast.rms_norm(post_weight * branch, None, 1e-5)
    _close(new_stream, want, "norm_add_norm stream", rtol=1e-4, atol=1e-5)
    _close(normed, norm(want), "norm_add_norm normed", rtol=1e-4, atol=1e-5)
    _close(kernels.pre_norm(new_stream, norm, dtype=mx.float32), norm(new_stream),
           "pre_norm", rtol=1e-4, atol=1e-5)


# --- models/: kernels against the package's own ops paths --------------------------------


def test_gated_delta_kernel_against_its_ops(interposed) -> None:
    gd = interposed("mlx_lm.models.gated_delta")
    g = np.random.default_rng(11)
    b, t, hk, hv, dk, dv = 1, 6, 1, 2, 64, 16
    k = g.standard_normal((b, t, hk, dk))
    q = mx.array(g.standard_normal((b, t, hk, dk)) * dk**-0.5, dtype=mx.float32)
    k = mx.array(k / np.linalg.norm(k, axis=-1, keepdims=True), dtype=mx.float32)
    v = mx.array(g.standard_normal((b, t, hv, dv)), dtype=mx.float32)
    gate = mx.array(g.uniform(0.7, 1.0, (b, t, hv)), dtype=mx.float32)
    beta = mx.array(g.uniform(0.1, 0.9, (b, t, hv)), dtype=mx.float32)
    state = mx.array(g.standard_normal((b, hv, dv, dk)) * 0.1, dtype=mx.float32)
    y, final = gd.gated_delta_kernel(q, k, v, gate, beta, state)
    y_ops, final_ops = gd.gated_delta_ops(q, k, v, gate, beta, state)
    _close(y, y_ops, "gated_delta y", rtol=1e-4, atol=1e-5)
    _close(final, final_ops, "gated_delta state", rtol=1e-4, atol=1e-5)
    step = mx.compile(gd.gated_delta_kernel)
    assert np.array(step(q, k, v, gate, beta, state)[0]).tobytes() == np.array(y).tobytes()


def test_ssm_update_kernel_against_ssm_attn(interposed) -> None:
    ssm = interposed("mlx_lm.models.ssm")
    n, h, groups, dh, ds = 2, 4, 2, 16, 64
    g = np.random.default_rng(12)

    def arr(*shape, scale=1.0):
        return mx.array(g.standard_normal(shape) * scale, dtype=mx.float32)

    x, b, c = arr(n, 1, h, dh), arr(n, 1, groups, ds), arr(n, 1, groups, ds)
    a_log = mx.array(g.uniform(-1, 1, (h,)), dtype=mx.float32)
    d, dt, dt_bias, state = arr(h), arr(n, 1, h), arr(h), arr(n, h, dh, ds, scale=0.5)
    limit = (0.001, 100.0)
    y, new_state = ssm.ssm_update_kernel(x, a_log, b, c, d, dt, dt_bias, state, limit)
    y_ref, state_ref = ssm.ssm_attn(x, a_log, b, c, d, dt, dt_bias, state, limit)
    _close(y, y_ref, "ssm y", rtol=1e-4, atol=1e-5)
    _close(new_state, state_ref, "ssm state", rtol=1e-4, atol=1e-5)


def test_wkv7_kernel_against_the_layers_step_loop(interposed) -> None:
    rwkv7 = interposed("mlx_lm.models.rwkv7")
    b, t, h, d = 1, 5, 2, 64
    g = np.random.default_rng(13)

    def arr(*shape, low=-1.0, high=1.0):
        return mx.array(g.uniform(low, high, shape), dtype=mx.float32)

    r, k, v = arr(b, t, h, d), arr(b, t, h, d), arr(b, t, h, d)
    w = arr(b, t, h, d, low=0.8, high=1.0)
    kk = g.standard_normal((b, t, h, d))
    kk = kk / np.linalg.norm(kk, axis=-1, keepdims=True)
    a = mx.array(-kk, dtype=mx.float32)
    bb = mx.array(kk * g.uniform(0, 1, (b, t, h, 1)), dtype=mx.float32)
    state = arr(b, h, d, d, low=-0.1, high=0.1)
    y, new_state = rwkv7.wkv7_kernel(r, w, k, v, a, bb, state)
    # The layer's own fallback: its step loop, which it takes where the default device
    # is not a GPU (here: MLX's CPU, which interposition leaves as it is).
    layer = SimpleNamespace(num_heads=h, head_dim=d)
    y_ref, state_ref = rwkv7.Rwkv7TimeMixing._wkv7(layer, r, w, k, v, a, bb, state)
    _close(y, y_ref.reshape(y.shape), "wkv7 y", rtol=1e-4, atol=1e-5)
    _close(new_state, state_ref, "wkv7 state", rtol=1e-4, atol=1e-5)
