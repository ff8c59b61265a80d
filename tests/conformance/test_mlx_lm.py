"""mlx-lm's `mx.fast.metal_kernel` kernels, built and dispatched by mlx-lm's own code with
`mtwork.metal_kernel` in place of `mx.fast.metal_kernel`, each compared with the ops-based
reference mlx-lm ships beside it (the path mlx-lm itself takes without a Metal GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from .sources import rebuilt_module

SOURCE = "mlx-lm"


# --- models/gated_delta.py ---------------------------------------------------------------


def gated_delta_inputs(b=1, t=6, hk=1, hv=2, dk=64, dv=16, vector_gate=False):
    g = np.random.default_rng(1)
    k = g.standard_normal((b, t, hk, dk))
    q = mx.array(g.standard_normal((b, t, hk, dk)) * dk**-0.5, dtype=mx.float32)
    k = mx.array(k / np.linalg.norm(k, axis=-1, keepdims=True), dtype=mx.float32)
    v = mx.array(g.standard_normal((b, t, hv, dv)), dtype=mx.float32)
    gate_shape = (b, t, hv, dk) if vector_gate else (b, t, hv)
    gate = mx.array(g.uniform(0.7, 1.0, gate_shape), dtype=mx.float32)
    beta = mx.array(g.uniform(0.1, 0.9, (b, t, hv)), dtype=mx.float32)
    state = mx.array(g.standard_normal((b, hv, dv, dk)) * 0.1, dtype=mx.float32)
    return q, k, v, gate, beta, state


@pytest.mark.parametrize("variant", ["scalar gate", "vector gate", "packed (Dk=128)"])
def test_gated_delta_kernels_match_the_ops_reference(agreement, monkeypatch, variant) -> None:
    gd, ran = rebuilt_module("mlx_lm.models.gated_delta", monkeypatch)
    dk = 128 if variant.startswith("packed") else 64
    q, k, v, gate, beta, state = gated_delta_inputs(dk=dk, vector_gate=variant == "vector gate")
    y, final = gd.gated_delta_kernel(q, k, v, gate, beta, state)
    y_ref, final_ref = gd.gated_delta_ops(q, k, v, gate, beta, state)
    kernel = {"scalar gate": "gated_delta_step", "vector gate": "gated_delta_step_vec",
              "packed (Dk=128)": "gated_delta_step_packed_btree"}[variant]
    assert ran == [kernel]
    agreement(f"gated_delta_step ({variant}) y", SOURCE, y, y_ref)
    agreement(f"gated_delta_step ({variant}) state", SOURCE, final, final_ref)


def test_gated_delta_masked_kernel(agreement, monkeypatch) -> None:
    gd, ran = rebuilt_module("mlx_lm.models.gated_delta", monkeypatch)
    q, k, v, gate, beta, state = gated_delta_inputs(b=2)
    mask = mx.array([[True] * 6, [True, True, False, True, False, False]])
    y, final = gd.gated_delta_kernel(q, k, v, gate, beta, state, mask)
    y_ref, final_ref = gd.gated_delta_ops(q, k, v, gate, beta, state, mask)
    assert ran == ["gated_delta_step_mask"]
    # At masked steps the kernel writes y = 0 while the ops reference still computes an
    # output from the (discarded) update; both keep the state. Compare y where it counts.
    keep = np.array(mask)[..., None, None]
    agreement("gated_delta_step_mask y (unmasked steps)", SOURCE,
              np.where(keep, np.array(y), 0), np.where(keep, np.array(y_ref), 0))
    assert not np.array(y)[~np.array(mask)].any()
    agreement("gated_delta_step_mask state", SOURCE, final, final_ref)


def test_gated_delta_packed_kernel_is_bitwise_its_comparator(agreement, monkeypatch) -> None:
    # mlx-lm's contract: the packed kernel (eight value rows per SIMD-group) reproduces the
    # explicit-butterfly comparator bit for bit, and on Apple GPUs the comparator equals
    # the simd_sum kernel bit for bit, because simd_sum reduces as that same butterfly.
    gd, ran = rebuilt_module("mlx_lm.models.gated_delta", monkeypatch)
    q, k, v, gate, beta, state = gated_delta_inputs(dk=128)
    packed = gd.gated_delta_kernel(q, k, v, gate, beta, state)
    xtree = gd.gated_delta_kernel_xtree(q, k, v, gate, beta, state)
    unpacked = gd.gated_delta_kernel_unpacked(q, k, v, gate, beta, state)
    assert ran == ["gated_delta_step_packed_btree", "gated_delta_step_xtree", "gated_delta_step"]
    for name, a, b in [("y", packed[0], xtree[0]), ("state", packed[1], xtree[1])]:
        agreement(f"gated_delta_step_packed_btree vs xtree {name}", SOURCE, a, b, bitwise=True)
    for name, a, b in [("y", unpacked[0], xtree[0]), ("state", unpacked[1], xtree[1])]:
        agreement(f"gated_delta_step (simd_sum) vs xtree {name}", SOURCE, a, b, bitwise=True)


# --- models/ssm.py ------------------------------------------------------------------------


def test_ssm_update_kernel(agreement, monkeypatch) -> None:
    ssm, ran = rebuilt_module("mlx_lm.models.ssm", monkeypatch)
    n, h, groups, dh, ds = 2, 4, 2, 16, 64
    g = np.random.default_rng(2)
    x = mx.array(g.standard_normal((n, 1, h, dh)), dtype=mx.float32)
    a_log = mx.array(g.uniform(-1, 1, (h,)), dtype=mx.float32)
    b = mx.array(g.standard_normal((n, 1, groups, ds)), dtype=mx.float32)
    c = mx.array(g.standard_normal((n, 1, groups, ds)), dtype=mx.float32)
    d = mx.array(g.standard_normal((h,)), dtype=mx.float32)
    dt = mx.array(g.standard_normal((n, 1, h)), dtype=mx.float32)
    dt_bias = mx.array(g.standard_normal((h,)), dtype=mx.float32)
    state = mx.array(g.standard_normal((n, h, dh, ds)) * 0.5, dtype=mx.float32)
    limit = (0.001, 100.0)
    y, new_state = ssm.ssm_update_kernel(x, a_log, b, c, d, dt, dt_bias, state, limit)
    y_ref, state_ref = ssm.ssm_attn(x, a_log, b, c, d, dt, dt_bias, state, limit)
    assert ran == ["ssm_kernel"]
    agreement("ssm_kernel y", SOURCE, y, y_ref)
    agreement("ssm_kernel state", SOURCE, new_state, state_ref)


# --- models/rwkv7.py ----------------------------------------------------------------------


def test_wkv7_kernel(agreement, monkeypatch) -> None:
    rwkv7, ran = rebuilt_module("mlx_lm.models.rwkv7", monkeypatch)
    b, t, h, d = 1, 5, 2, 64
    g = np.random.default_rng(3)

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
    # mlx-lm's own fallback: the time-mixing layer's step loop, taken on a CPU device.
    layer = SimpleNamespace(num_heads=h, head_dim=d)
    y_ref, state_ref = rwkv7.Rwkv7TimeMixing._wkv7(layer, r, w, k, v, a, bb, state)
    assert ran == ["wkv7_kernel"]
    agreement("wkv7_kernel y", SOURCE, y, y_ref.reshape(y.shape))
    agreement("wkv7_kernel state", SOURCE, new_state, state_ref)


# --- tuner/losses.py ----------------------------------------------------------------------


def losses_module(monkeypatch):
    utils = pytest.importorskip("mlx_lm.utils")
    # losses.py builds its kernels only where `can_run_metal()` (a GPU default device).
    monkeypatch.setattr(utils, "can_run_metal", lambda: True)
    return rebuilt_module("mlx_lm.tuner.losses", monkeypatch)


@pytest.mark.parametrize("loss", ["kl_div_loss", "js_div_loss"])
@pytest.mark.parametrize("vocab", [1000, 4500])
def test_distillation_losses(agreement, monkeypatch, loss, vocab) -> None:
    losses, ran = losses_module(monkeypatch)
    g = np.random.default_rng(4)
    logits_q = mx.array(g.standard_normal((3, vocab)) * 2, dtype=mx.float32)
    logits_p = mx.array(g.standard_normal((3, vocab)) * 2, dtype=mx.float32)
    on_kernel = getattr(losses, loss)(logits_q, logits_p)
    monkeypatch.setattr(losses, "can_run_metal", lambda: False)
    reference = getattr(losses, loss)(logits_q, logits_p)
    assert ran == [loss.replace("_div_loss", "_forward")]
    agreement(f"{loss} forward (V={vocab})", SOURCE, on_kernel, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("loss", ["kl_div_loss", "js_div_loss"])
def test_distillation_loss_gradients(agreement, monkeypatch, loss) -> None:
    # The backward kernels run from the losses' custom VJPs under mx.grad.
    losses, ran = losses_module(monkeypatch)
    g = np.random.default_rng(5)
    logits_q = mx.array(g.standard_normal((2, 1500)) * 2, dtype=mx.float32)
    logits_p = mx.array(g.standard_normal((2, 1500)) * 2, dtype=mx.float32)
    weights = mx.array([0.5, -2.0])

    def objective(q):
        return (getattr(losses, loss)(q, logits_p) * weights).sum()

    on_kernel = mx.grad(objective)(logits_q)
    monkeypatch.setattr(losses, "can_run_metal", lambda: False)
    reference = mx.grad(objective)(logits_q)
    name = loss.removesuffix("_div_loss")
    assert ran == [f"{name}_forward", f"{name}_backward"]
    agreement(f"{loss} backward", SOURCE, on_kernel, reference, atol=1e-6, rtol=1e-4)
