"""mlx-lm's kernels as its users meet them: under `mtwork.interpose()`, with nothing
patched by hand, mlx-lm's modules are imported as they are and build their kernels with
what they believe is ``mx.fast.metal_kernel``; their public functions run the kernels
(on sim) and agree with mlx-lm's own pure-MLX path where the package has one (its models'
ops functions), else with a reference written from the algorithm with MLX's CPU ops (its
`kernels/` package is Metal-only). Inside `mx.compile` too.

The modules that build kernels are imported afresh under interposition (a module builds
its kernels when it is imported, so that is what a project does: interpose first, in its
conftest or with ``pytest --mtwork``) and put back as they were afterwards.

mlx-lm's models take their Metal path only where ``mx.default_device() == mx.gpu`` too:
under interposition ``mx.gpu`` is the device mtwork's kernels run on, so their own entry
points (the Gated DeltaNet layer and ``gated_delta_update``, ``ssm_update``, the RWKV7
layer) run their kernels, which `Interposition.calls` shows; the same entry points where
Metal looks absent (a nested ``interpose(metal_available=False)``) take the package's
pure-MLX path, and the two agree.
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
          "mlx_lm.models.rwkv7", "mlx_lm.models.qwen3_next")


class _Importer:
    """`importlib.import_module` under an interposition (`interposition`)."""

    def __init__(self, interposition: mtwork.Interposition) -> None:
        self.interposition = interposition

    def __call__(self, name: str):
        return importlib.import_module(name)

    def kernel_calls(self, prefix: str) -> int:
        return sum(n for name, n in self.interposition.calls.items()
                   if name.startswith(prefix))


@pytest.fixture
def interposed():
    """An `_Importer` under `mtwork.interpose()`, for modules imported afresh."""
    saved = {name: module for name, module in sys.modules.items()
             if name.startswith(_FRESH)}
    for name in saved:
        del sys.modules[name]
    with mtwork.interpose(backend="sim") as interposition:
        assert mx.metal.is_available()
        yield _Importer(interposition)
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


# --- models/: their own entry points, Metal path against pure-MLX path ----------------------


def _without_metal():
    """Where Metal looks absent: the models take their pure-MLX paths."""
    return mtwork.interpose(backend="sim", metal_available=False)


def _randomized(module, seed: int):
    """`module` with every parameter drawn at random (some start at zero, which would
    make the paths agree trivially)."""
    from mlx.utils import tree_map

    key = [mx.random.key(seed)]

    def draw(p):
        key[0], sub = mx.random.split(key[0])
        return 0.2 * mx.random.normal(p.shape, key=sub).astype(p.dtype)

    module.update(tree_map(draw, module.parameters()))
    mx.eval(module.parameters())
    return module


def test_gated_delta_update_and_the_gated_deltanet_layer_take_the_metal_path(interposed):
    gd = interposed("mlx_lm.models.gated_delta")
    qwen3_next = interposed("mlx_lm.models.qwen3_next")
    g = np.random.default_rng(21)
    b, t, hk, hv, dk, dv = 1, 5, 2, 4, 64, 32

    def arr(*shape, scale=1.0):
        return mx.array(g.standard_normal(shape) * scale, dtype=mx.float32)

    q, k = gd.normalize_qk(arr(b, t, hk, dk), arr(b, t, hk, dk), inv_scale=dk**-0.5,
                           eps=1e-6)
    v, a, beta = arr(b, t, hv, dv), arr(b, t, hv), arr(b, t, hv)
    a_log, dt_bias, state = arr(hv, scale=0.5), arr(hv), arr(b, hv, dv, dk, scale=0.1)
    y, final = gd.gated_delta_update(q, k, v, a, beta, a_log, dt_bias, state)
    mx.eval(y, final)
    assert interposed.kernel_calls("gated_delta_step") == 1, interposed.interposition.calls
    with _without_metal():
        y_ops, final_ops = gd.gated_delta_update(q, k, v, a, beta, a_log, dt_bias, state)
    _close(y, y_ops, "gated_delta_update y", rtol=1e-4, atol=1e-5)
    _close(final, final_ops, "gated_delta_update state", rtol=1e-4, atol=1e-5)

    config = SimpleNamespace(hidden_size=96, linear_num_value_heads=hv,
                             linear_num_key_heads=hk, linear_key_head_dim=dk,
                             linear_value_head_dim=dv, linear_conv_kernel_dim=4,
                             rms_norm_eps=1e-6)
    layer = _randomized(qwen3_next.Qwen3NextGatedDeltaNet(config), seed=3)
    layer.eval()  # as mlx-lm loads a model: in training its kernel is off
    x = arr(b, t, config.hidden_size)
    out = layer(x)
    mx.eval(out)
    assert interposed.kernel_calls("gated_delta_step") == 2
    with _without_metal():
        out_ops = layer(x)
    _close(out, out_ops, "Qwen3NextGatedDeltaNet", rtol=1e-4, atol=1e-5)


def test_ssm_update_takes_the_metal_path(interposed):
    ssm = interposed("mlx_lm.models.ssm")
    n, h, groups, dh, ds = 2, 4, 2, 16, 64
    g = np.random.default_rng(22)

    def arr(*shape, scale=1.0):
        return mx.array(g.standard_normal(shape) * scale, dtype=mx.float32)

    x, b, c = arr(n, 1, h, dh), arr(n, 1, groups, ds), arr(n, 1, groups, ds)
    a_log = mx.array(g.uniform(-1, 1, (h,)), dtype=mx.float32)
    d, dt, dt_bias, state = arr(h), arr(n, 1, h), arr(h), arr(n, h, dh, ds, scale=0.5)
    y, new_state = ssm.ssm_update(x, a_log, b, c, d, dt, dt_bias, state)
    mx.eval(y, new_state)
    assert interposed.kernel_calls("ssm_kernel") == 1, interposed.interposition.calls
    with _without_metal():
        y_ops, state_ops = ssm.ssm_update(x, a_log, b, c, d, dt, dt_bias, state)
    _close(y, y_ops, "ssm_update y", rtol=1e-4, atol=1e-5)
    _close(new_state, state_ops, "ssm_update state", rtol=1e-4, atol=1e-5)


def test_the_rwkv7_layer_takes_the_metal_path(interposed):
    rwkv7 = interposed("mlx_lm.models.rwkv7")
    from mlx_lm.models.cache import ArraysCache

    args = rwkv7.ModelArgs(model_type="rwkv7", vocab_size=16, hidden_size=128,
                           intermediate_size=256, norm_eps=1e-5, head_dim=64,
                           num_hidden_layers=1, a_low_rank_dim=16, v_low_rank_dim=16,
                           gate_low_rank_dim=16, decay_low_rank_dim=16)
    layer = _randomized(rwkv7.Rwkv7TimeMixing(args, layer_idx=0), seed=4)
    layer.eval()
    x = mx.array(np.random.default_rng(23).standard_normal((1, 6, 128)), dtype=mx.float32)
    cache = ArraysCache(size=2)
    out, _ = layer(x, None, cache)
    mx.eval(out, cache[1])
    assert interposed.kernel_calls("wkv7_kernel") == 1, interposed.interposition.calls
    with _without_metal():
        cache_ops = ArraysCache(size=2)
        out_ops, _ = layer(x, None, cache_ops)
    _close(out, out_ops, "Rwkv7TimeMixing", rtol=1e-4, atol=1e-5)
    _close(cache[1], cache_ops[1], "Rwkv7TimeMixing state", rtol=1e-4, atol=1e-5)


def _rope64(x: np.ndarray, offset: int, base: float) -> np.ndarray:
    """mx.fast.rope(traditional=True) over the last axis, in float64, for positions
    offset, offset + 1, ... along axis 1 (x: tokens, positions, heads, dims)."""
    dims = x.shape[-1]
    d = np.arange(dims)
    theta = (offset + np.arange(x.shape[1]))[None, :, None, None] * base ** (
        -(d // 2) / (dims / 2))
    partner = np.empty_like(x)
    partner[..., 0::2], partner[..., 1::2] = x[..., 1::2], x[..., 0::2]
    sign = np.where(d % 2 == 0, -1.0, 1.0)
    return x * np.cos(theta) + sign * partner * np.sin(theta)


def test_fused_rope_is_as_accurate_as_mlx_rope(interposed) -> None:
    """mlx-lm's own test holds the fused kernel within 1e-5 of mx.fast.rope, which off a
    Mac is MLX's CPU rope: two correct single-precision rotations differ by more. Held
    here to MLX's own accuracy against the float64 rotation instead."""
    kernels = interposed("mlx_lm.kernels")
    args = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 80, "eps": 1e-5, "query_scale": 4.9}
    mx.random.seed(0)
    qkvg = mx.random.normal((2, 5, 2 * (4 + 2) * 80))
    q, _ = kernels.qk_norm(qkvg, **args)
    rotated, _ = kernels.qk_norm_rope(qkvg, **args, rope_base=10000.0, offset=7)
    mx.eval(q, rotated)
    assert interposed.kernel_calls("qk_norm_rope") == 1
    mlx_rope = mx.fast.rope(q.swapaxes(1, 2), 80, traditional=True, base=10000.0, scale=1.0,
                            offset=7).swapaxes(1, 2)
    exact = _rope64(np.array(q, dtype=np.float64), 7, 10000.0)
    kernel_error = np.abs(np.array(rotated, dtype=np.float64) - exact).max()
    mlx_error = np.abs(np.array(mlx_rope, dtype=np.float64) - exact).max()
    assert kernel_error <= mlx_error * 1.01 + 1e-7, (kernel_error, mlx_error)
    # Within single precision's rounding of the angle (positions up to 11 rad).
    assert kernel_error < 64 * np.spacing(np.float32(8.0)), kernel_error
