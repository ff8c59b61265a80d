"""Attention kernels on `sim` against the float64 oracle softmax(QK^T * scale) V: the
scalar kernel and flash attention v2 on simdgroup_matrix tiles, f32/f16/bf16, full and
causal, sequences that end inside a tile, and the 32 KiB threadgroup budget."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

import mtwork

fam = mtwork.load_family("flash_attention")

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
CAUSAL = [False, True]


def dtype_id(dtype: mx.Dtype) -> str:
    return fam.dtype_name(dtype)


def check(launch, shape, dtype, *, causal, seed=0, spread=1.0):
    """Runs `launch` on fresh inputs and asserts it matches the oracle in dtype's band."""
    q, k, v, scale = fam.make_inputs(shape, dtype, seed)
    q = (q.astype(mx.float32) * spread).astype(dtype)
    out = launch(q, k, v, scale, backend="sim")[0]
    assert out.shape == shape.out_shape and out.dtype == dtype
    return mtwork.assert_close(out, fam.attention_reference(q, k, v, scale, causal=causal))


# --- the oracle ------------------------------------------------------------------------------


def test_oracle_averages_values_when_every_score_ties():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 5, 4))
    v = rng.standard_normal((1, 2, 7, 4))
    out = fam.attention_reference(q, np.zeros((1, 2, 7, 4)), v, 0.5)
    assert out.shape == (1, 5, 2, 4)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=2)[:, None], out.shape))


def test_oracle_causal_rows_see_their_prefix_of_keys():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 6, 3)) for _ in range(3))
    out = fam.attention_reference(q, k, v, 1.0, causal=True)
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0])  # the first query sees one key
    # The last query sees every key: the same as non-causal attention.
    np.testing.assert_allclose(out[0, -1], fam.attention_reference(q, k, v, 1.0)[0, -1])
    # With fewer queries than keys the mask is aligned on the last key.
    short = fam.attention_reference(q[:, :, 4:], k, v, 1.0, causal=True)
    np.testing.assert_allclose(short, out[:, 4:])


# --- both kernels against the oracle ------------------------------------------------------------


@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_naive_matches_oracle(dtype, causal):
    shape = fam.SMALL
    check(fam.naive_launch(shape, dtype, causal=causal), shape, dtype, causal=causal)


@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_flash_matches_oracle(dtype, causal):
    shape = fam.SMALL
    check(fam.flash_launch(shape, dtype, causal=causal), shape, dtype, causal=causal)


@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("name", ["B2_L13_D16", "Lq24_Lk40"])
def test_both_kernels_on_other_shapes(name, causal):
    shape = fam.SMALL_SHAPES[name]
    for launch in (fam.naive_launch(shape, causal=causal),
                   fam.flash_launch(shape, causal=causal)):
        check(launch, shape, mx.float32, causal=causal, seed=3)


def test_flash_head_dim_64_in_half():
    shape = fam.SMALL_SHAPES["L40_D64"]
    launch = fam.flash_launch(shape, mx.float16, causal=True, tiles=fam.Tiles(32, 32, 2))
    check(launch, shape, mx.float16, causal=True, seed=4)


# Tilings that put the sequence edge (40) inside query and key tiles, more than one
# fragment row per SIMD-group (32 / 2 = 16 rows), key tiles wider and narrower than query
# tiles (causal: SIMD-groups that skip a tile), and four SIMD-groups.
TILINGS = [(8, 8, 1), (32, 16, 2), (16, 32, 2), (64, 16, 4), (8, 64, 1)]


@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("tiling", TILINGS, ids=lambda t: "bq{}_bk{}_sg{}".format(*t))
def test_flash_tilings_match_oracle(tiling, causal):
    shape = fam.SMALL
    launch = fam.flash_launch(shape, causal=causal, tiles=fam.Tiles(*tiling))
    check(launch, shape, mx.float32, causal=causal, seed=5)


def test_flash_online_softmax_survives_large_scores():
    # Scores of several hundred: exp overflows float32 unless every step subtracts the
    # running maximum.
    shape = fam.SMALL
    report = check(fam.flash_launch(shape), shape, mx.float32, causal=False, seed=6,
                   spread=40.0)
    assert report.nan_actual == 0 and report.inf_actual == 0


def test_flash_rows_do_not_depend_on_query_tiling():
    # A row's arithmetic depends on the key tile only: query tiles and SIMD-groups change
    # which threads compute it, not how, so the outputs are bitwise equal.
    shape = fam.SMALL
    inputs = fam.make_inputs(shape, seed=7)
    outs = [fam.flash_launch(shape, causal=True, tiles=fam.Tiles(bq, 16, sg))(*inputs)[0]
            for bq, sg in [(8, 1), (32, 2), (32, 4)]]
    for other in outs[1:]:
        mtwork.assert_bitwise_equal(other, outs[0])


# --- the threadgroup budget and launch checks -------------------------------------------------


@pytest.mark.parametrize(("dtype", "block_k", "fits"), [
    (mx.float32, 64, True), (mx.float32, 72, False), (mx.float16, 128, True),
    (mx.float16, 136, False),
])
def test_threadgroup_formula_is_what_the_kernel_declares(dtype, block_k, fits):
    head_dim = 64
    assert (fam.flash_threadgroup_bytes(block_k, head_dim, dtype) <= 32768) == fits
    constraint = fam.flash_constraints(head_dim, dtype)[1]
    assert constraint({"block_q": 8, "block_k": block_k, "simdgroups": 1}) == fits
    # Past the budget the emulator refuses the kernel: launch it around flash_launch's check.
    shape = fam.Shape(1, 1, 16, 16, head_dim)
    launch = fam.flash_launch(shape, dtype, tiles=fam.Tiles(8, 8, 1))
    launch = replace(launch, template=[(n, block_k if n == "BK" else v)
                                       for n, v in launch.template])
    if fits:
        check(launch, shape, dtype, causal=False)
    else:
        with pytest.raises(mtwork.ThreadgroupMemoryError):
            launch(*fam.make_inputs(shape, dtype))


def test_flash_launch_rejects_tilings_it_cannot_run():
    with pytest.raises(ValueError, match="multiple of 8 \\* simdgroups"):
        fam.flash_launch(fam.SMALL, tiles=fam.Tiles(8, 16, 2))
    with pytest.raises(ValueError, match="multiples of 8"):
        fam.flash_launch(fam.SMALL, tiles=fam.Tiles(8, 12, 1))
    with pytest.raises(ValueError, match="threadgroup memory"):
        fam.flash_launch(fam.SMALL, tiles=fam.Tiles(8, 256, 1))
    with pytest.raises(ValueError, match="kv_len >= q_len"):
        fam.naive_launch(replace(fam.SMALL, kv_len=8), causal=True)


def test_sweep_space_keeps_only_runnable_tilings():
    result = mtwork.sweep(
        fam.flash_builder(fam.SMALL, mx.float32),
        {"block_q": [16, 24], "block_k": [16, 512], "simdgroups": [1, 2]},
        inputs=fam.make_inputs(fam.SMALL),
        oracle=fam.reference_for(causal=False),
        constraints=fam.flash_constraints(fam.SMALL.head_dim, mx.float32),
        rounds=1, warmup=0, progress=False,
    )
    # 24 rows do not split into 8-row fragments on 2 SIMD-groups; 512 keys overflow the
    # budget: 3 of the 8 configurations remain, and all of them pass the oracle.
    assert result.candidates == 3
    assert {tuple(r.config.values()) for r in result.ok} == {
        (16, 16, 1), (16, 16, 2), (24, 16, 1)
    }
