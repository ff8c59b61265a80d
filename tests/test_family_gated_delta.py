"""Gated DeltaNet kernels on `sim`: each against the float64 recurrence, and the packed
layout bitwise against the sequential one.

The oracle (`family.recurrence`) is the gated delta rule token by token, written from the
algorithm; it is itself checked on a step worked out by hand. `family.chunked` is the WY
algebra of the chunked kernel in float64, checked against the recurrence so that a wrong
derivation cannot hide behind a matching kernel.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.sweep import Config, constraint

fam = mtwork.load_family("gated_delta")

DTYPES = list(fam.DTYPES.values())
DTYPE_IDS = list(fam.DTYPES)
# Two batches, grouped heads (Hv = 2 Hk), T not a multiple of any chunk size tried.
PROBLEM = fam.Problem(batch=2, tokens=19, key_heads=1, value_heads=2, dk=64, dv=16)


def check_against_oracle(outputs, inputs, what: str) -> None:
    y_ref, state_ref = fam.recurrence(*inputs)
    mtwork.assert_close(outputs[0], y_ref, name=f"{what} y")
    mtwork.assert_close(outputs[1], state_ref, name=f"{what} state")


# --- the oracles ------------------------------------------------------------------------


def test_recurrence_matches_two_steps_worked_by_hand():
    # One head, Dk = Dv = 1: S, k, v, q are scalars.
    s0, k, q = 0.5, 2.0, 3.0
    g, beta, v = (0.5, 0.25), (0.5, 1.0), (1.0, -1.0)
    # t = 0: S = 0.25; delta = 0.5 (1 - 0.5) = 0.25; S = 0.25 + 0.5 = 0.75; y = 2.25
    # t = 1: S = 0.1875; delta = 1 (-1 - 0.375) = -1.375; S = 0.1875 - 2.75 = -2.5625
    shape = (1, 2, 1, 1)
    y, state = fam.recurrence(
        np.full(shape, q), np.full(shape, k), np.reshape(v, shape), np.reshape(g, (1, 2, 1)),
        np.reshape(beta, (1, 2, 1)), np.full((1, 1, 1, 1), s0),
    )
    np.testing.assert_array_equal(y.ravel(), [2.25, -2.5625 * 3.0])
    np.testing.assert_array_equal(state.ravel(), [-2.5625])


def test_recurrence_reads_key_head_of_its_group():
    inputs = fam.make_inputs(fam.Problem(1, 3, 2, 4, 32, 8), seed=1)
    y, state = fam.recurrence(*inputs)
    # Value head 3 belongs to key head 1: alone with that key head it gives the same rows.
    q, k, v, g, beta, s0 = (np.array(x.astype(mx.float32), dtype=np.float64) for x in inputs)
    y3, state3 = fam.recurrence(q[:, :, 1:], k[:, :, 1:], v[:, :, 3:], g[:, :, 3:],
                                beta[:, :, 3:], s0[:, 3:])
    np.testing.assert_allclose(y[:, :, 3:], y3, rtol=1e-12)
    np.testing.assert_allclose(state[:, 3:], state3, rtol=1e-12)


@pytest.mark.parametrize("chunk", [1, 4, 8, 32])
def test_chunked_algebra_equals_the_recurrence(chunk):
    inputs = fam.make_inputs(fam.Problem(2, 37, 1, 2, 32, 16), seed=chunk, max_decay=1.0)
    y_ref, state_ref = fam.recurrence(*inputs)
    y, state = fam.chunked(*inputs, chunk=chunk)
    mtwork.assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
    mtwork.assert_close(state, state_ref, atol=1e-12, rtol=1e-10)


# --- every kernel against the oracle ----------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "name, options",
    [("seq", {}), ("seq", {"xor_tree": True}), ("packed", {}), ("wy", {"chunk": 8, "rows": 4}),
     ("wy_mma", {"chunk": 8, "value_tile": 16, "simdgroups": 2})],
    ids=["seq", "seq-xor-tree", "packed", "wy", "wy-mma"],
)
def test_kernel_matches_the_recurrence(name, options, dtype):
    inputs = fam.make_inputs(PROBLEM, dtype, seed=7)
    check_against_oracle(fam.run(name, inputs, **options), inputs, name)


@pytest.mark.parametrize("tokens", [1, 5, 32, 45])
@pytest.mark.parametrize("chunk, rows", [(1, 2), (3, 1), (4, 4), (16, 1), (32, 8)])
def test_wy_pads_the_last_chunk(chunk, rows, tokens):
    inputs = fam.make_inputs(fam.Problem(1, tokens, 2, 2, 64, 16), seed=tokens, max_decay=1.0)
    check_against_oracle(fam.run("wy", inputs, chunk=chunk, rows=rows), inputs,
                         f"wy chunk={chunk}")


@pytest.mark.parametrize("tokens", [1, 5, 32, 45])
@pytest.mark.parametrize("chunk, value_tile, simdgroups", [(8, 8, 1), (16, 16, 2), (32, 16, 1)])
def test_wy_mma_pads_the_last_chunk(chunk, value_tile, simdgroups, tokens):
    inputs = fam.make_inputs(fam.Problem(1, tokens, 2, 2, 64, 16), seed=tokens, max_decay=1.0)
    outputs = fam.run("wy_mma", inputs, chunk=chunk, value_tile=value_tile,
                      simdgroups=simdgroups)
    check_against_oracle(outputs, inputs, f"wy_mma chunk={chunk}")


def test_wy_mma_at_the_head_dimensions_of_qwen3_next():
    # Dk = Dv = 128: 16 fragments of the state per value fragment in each SIMD-group.
    inputs = fam.make_inputs(fam.Problem(1, 20, 1, 1, 128, 128), mx.bfloat16, seed=8)
    outputs = fam.run("wy_mma", inputs, chunk=16, value_tile=32, simdgroups=2)
    check_against_oracle(outputs, inputs, "wy_mma Dk=Dv=128")


def test_state_kept_in_float16():
    inputs = fam.make_inputs(fam.Problem(1, 9, 1, 1, 32, 8), mx.float16,
                             state_dtype=mx.float16)
    for name in fam.KERNELS:
        y, state = fam.run(name, inputs)
        assert state.dtype == mx.float16
        check_against_oracle([y, state], inputs, name)


# --- the packed layout is the sequential one, bit for bit --------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("heads", fam.HEAD_CONFIGS, ids=lambda h: f"Hk{h[0]}-Hv{h[1]}")
def test_packed_is_bitwise_equal_to_seq(heads, dtype):
    for tokens in fam.TOKEN_COUNTS:
        problem = fam.Problem(1, tokens, *heads, dk=64, dv=16)
        reports = fam.bitwise_ab(fam.make_inputs(problem, dtype, seed=tokens))
        for report in reports["packed"] + reports["seq, xor tree"]:
            assert report.ok, f"{problem}\n{report}"


def test_bitwise_comparison_sees_a_different_summation_order():
    # Same numbers, summed left to right inside each lane: accurate, but other bits.
    inputs = fam.make_inputs(fam.Problem(1, 16, 1, 2, 64, 16), seed=3)
    y_seq, state_seq = fam.run("seq", inputs)
    y, state = fam.run("packed", inputs, variant=fam.packed_left_to_right())
    check_against_oracle([y, state], inputs, "left-to-right packed")
    assert mtwork.diff(state, state_seq, bitwise=True).n_mismatch > 0
    assert mtwork.diff(y, y_seq, bitwise=True).n_mismatch > 0


# --- the tiled WY kernel against the scalar one ------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wy_mma_is_bitwise_equal_across_its_value_tiles_simdgroups_and_padding(dtype):
    # Which SIMD-group or threadgroup computes a value column, and where a tile's rows sit
    # in threadgroup memory, change nothing in how: the same fragments meet in the same
    # multiply-accumulates, so the bits are the same.
    inputs = fam.make_inputs(fam.Problem(2, 45, 1, 2, 64, 32), dtype, seed=9)
    reference = fam.run("wy_mma", inputs, chunk=16, value_tile=8, simdgroups=1)
    for value_tile, simdgroups, pad in [(16, 2, 8), (32, 1, 8), (32, 4, 8), (16, 2, 0)]:
        outputs = fam.run("wy_mma", inputs, chunk=16, value_tile=value_tile,
                          simdgroups=simdgroups, pad=pad)
        for out, ref in zip(outputs, reference):
            mtwork.assert_bitwise_equal(out, ref)


def test_wy_mma_agrees_with_the_scalar_wy_in_band_but_not_bit_for_bit():
    # Same algebra, other roundings: the tiles' products are chains of fused multiply-adds
    # and the solve multiplies by the diagonal blocks' inverses, where the scalar kernel
    # rounds each product and sum and substitutes row by row.
    inputs = fam.make_inputs(fam.Problem(1, 40, 1, 2, 64, 16), seed=10)
    tiled = fam.run("wy_mma", inputs, chunk=8)
    scalar = fam.run("wy", inputs, chunk=8, rows=4)
    for out, ref, what in zip(tiled, scalar, ("y", "state")):
        mtwork.assert_close(out, ref, name=f"wy_mma {what} vs wy")
        assert mtwork.diff(out, ref, bitwise=True).n_mismatch > 0
    # A chunk size changes the algebra's grouping, hence the bits too (and stays in band).
    other = fam.run("wy_mma", inputs, chunk=16)
    assert mtwork.diff(other[1], tiled[1], bitwise=True).n_mismatch > 0
    check_against_oracle(other, inputs, "wy_mma chunk=16")


# --- sanitized ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, options", [("seq", {}), ("packed", {}),
                                           ("wy", {"chunk": 4, "rows": 2}),
                                           ("wy_mma", {"chunk": 8, "value_tile": 16,
                                                       "simdgroups": 2})],
                         ids=["seq", "packed", "wy", "wy-mma"])
def test_every_kernel_runs_sanitized_without_findings(name, options):
    # `packed` stores its state back from a private array in a loop that clang makes one
    # memcpy: `state_out` is written through a copy, which the sanitizer must see.
    inputs = fam.make_inputs(fam.Problem(1, 5, 1, 2, dk=64, dv=16), seed=4)
    launch = fam.LAUNCHES[name](inputs.problem, **options)
    outputs = launch(*inputs, sanitize=True)
    assert launch.sanitizer_report.ok, str(launch.sanitizer_report)
    check_against_oracle(outputs, inputs, f"sanitized {name}")


# --- launch checks ------------------------------------------------------------------------


def test_wy_constraints_follow_the_threadgroup_budget():
    problem = fam.Problem(1, 1, 1, 1, 128, 128)
    rules = [constraint(c) for c in fam.wy_constraints(problem)]
    allowed = {(c, r) for c in fam.WY_SPACE["chunk"] for r in fam.WY_SPACE["rows"]
               if all(rule(Config({"chunk": c, "rows": r})) for rule in rules)}
    assert (16, 8) in allowed  # 4 (4096 + 512 + 32 + 1024) = 22656 bytes
    assert (32, 1) not in allowed  # 4 (8192 + 2048 + 64 + 128) = 41728 bytes
    with pytest.raises(ValueError, match="threadgroup memory"):
        fam.wy_launch(problem, chunk=32, rows=1)


def test_wy_mma_constraints_follow_the_threadgroup_budget_and_the_tiles():
    problem = fam.Problem(1, 1, 1, 1, 128, 64)
    rules = [constraint(c) for c in fam.tiled.constraints(problem)]

    def allowed(chunk, value_tile, simdgroups):
        config = Config({"chunk": chunk, "value_tile": value_tile, "simdgroups": simdgroups})
        return all(rule(config) for rule in rules)

    assert allowed(16, 64, 8)  # 4 (2 16 136 + 2 16 24 + 160) = 21120 bytes
    assert not allowed(32, 64, 8)  # 4 (2 32 136 + 2 32 40 + 320) = 46336 bytes
    assert not allowed(16, 16, 4)  # two fragments cannot go to four SIMD-groups
    assert not allowed(8, 48, 1)  # 48 does not divide Dv = 64
    with pytest.raises(ValueError, match="threadgroup memory"):
        fam.tiled.launch(problem, chunk=32, value_tile=64)
    with pytest.raises(ValueError, match="simdgroups"):
        fam.tiled.launch(problem, chunk=8, value_tile=16, simdgroups=4)
    with pytest.raises(ValueError, match="chunk"):
        fam.tiled.launch(problem, chunk=12)
    with pytest.raises(ValueError, match="value_tile"):
        fam.tiled.launch(problem, value_tile=12)
    with pytest.raises(ValueError, match="pad"):
        fam.tiled.launch(problem, pad=3)


def test_launch_helpers_reject_shapes_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="multiple of Hk"):
        fam.Problem(1, 1, 2, 3, 32, 32)
    with pytest.raises(ValueError, match="Dv % 8"):
        fam.packed_launch(fam.Problem(1, 1, 1, 1, 32, 12))
    with pytest.raises(ValueError, match="chunk"):
        fam.wy_launch(fam.Problem(1, 1, 1, 1, 32, 32), chunk=64)
