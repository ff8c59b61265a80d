"""The DeepSeek-V4 kernels against their float64 oracles on sim, across f32/f16/bf16.

The format decoders are checked first against tables derived another way (through the
bit patterns of IEEE half and double), so the dequant oracles stand on their own.
"""

import mlx.core as mx
import numpy as np
import pytest

import mtwork

fam = mtwork.load_family("dsv4")
formats, reference = fam.formats, fam.reference

DTYPES = [pytest.param(d, id=fam.dtype_name(d)) for d in fam.DTYPES]


def run(launch, inputs):
    return launch(*inputs, backend="sim")


# --- the formats, derived independently ---------------------------------------------------


def half_bits_value(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float64)


def test_e2m1_table_matches_a_derivation_through_half_bits():
    # e2m1's exponent and mantissa, placed at the top of half's fields (<< 9), read as a
    # half with bias 15 instead of 1: the value times 2^-14 (subnormals included).
    codes = np.arange(16)
    derived = half_bits_value(((codes & 8) << 12) | ((codes & 7) << 9)) * 2.0**14
    np.testing.assert_array_equal(formats.decode_e2m1(codes), derived)
    assert formats.decode_e2m1(codes[:8]).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.signbit(formats.decode_e2m1(8))


def test_e4m3_table_matches_a_derivation_through_half_bits():
    # e4m3's EEEEMMM at half's exponent/mantissa (<< 7), bias 15 instead of 7: times 2^8.
    codes = np.arange(256)
    derived = half_bits_value(((codes & 0x80) << 8) | ((codes & 0x7F) << 7)) * 2.0**8
    nan = (codes & 0x7F) == 0x7F  # S.1111.111, the only NaNs; e4m3 has no infinity
    derived[nan] = np.nan
    decoded = formats.decode_e4m3(codes)
    np.testing.assert_array_equal(decoded, derived)
    assert np.isnan(decoded).sum() == 2 and not np.isinf(decoded).any()
    assert decoded[0x7E] == 448 and decoded[0x08] == 2.0**-6 and decoded[0x01] == 2.0**-9
    assert decoded[0x80] == 0 and np.signbit(decoded[0x80])


def test_e8m0_table_matches_double_exponent_fields():
    codes = np.arange(256)
    # 2^(e - 127) as a double: exponent field e - 127 + 1023, zero mantissa.
    derived = ((codes - 127 + 1023).astype(np.uint64) << np.uint64(52)).view(np.float64)
    derived = np.where(codes == 255, np.nan, derived)
    np.testing.assert_array_equal(formats.decode_e8m0(codes), derived)


@pytest.mark.parametrize("encode, decode, finite", [
    (formats.encode_e2m1, formats.decode_e2m1, range(16)),
    (formats.encode_e4m3, formats.decode_e4m3, [c for c in range(256) if c & 0x7F != 0x7F]),
], ids=["e2m1", "e4m3"])
def test_encoders_round_trip_every_finite_code_and_round_to_nearest_even(encode, decode,
                                                                        finite):
    codes = np.array(list(finite))
    np.testing.assert_array_equal(encode(decode(codes)), codes)
    # Midpoints between neighbours round to the even code; beyond the largest, saturate.
    positive = codes[codes < (8 if decode is formats.decode_e2m1 else 0x80)]
    mids = (decode(positive[:-1]) + decode(positive[1:])) / 2
    picked = encode(mids)
    assert (picked % 2 == 0).all() and set(picked) <= set(positive)
    assert decode(encode(np.array([1e6, -1e6]))).tolist() == [decode(positive[-1:])[0],
                                                              -decode(positive[-1:])[0]]


# --- dequantisation kernels -------------------------------------------------------------


def assert_value_exact(out: mx.array, expected: mx.array):
    """Same values (NaN matches NaN) and same sign on zeros."""
    mtwork.assert_close(out, expected, atol=0, rtol=0)
    a, e = np.array(out.astype(mx.float32)), np.array(expected.astype(mx.float32))
    zeros = e == 0
    np.testing.assert_array_equal(np.signbit(a[zeros]), np.signbit(e[zeros]))


def every_code_with_every_scale() -> list[mx.array]:
    """Row r has scale code r; its 32 elements are codes 0..15 then 15..0 (both nibbles)."""
    codes = np.tile(np.concatenate([np.arange(16), np.arange(15, -1, -1)]), (256, 1))
    return [mx.array(formats.pack_nibbles(codes)),
            mx.array(np.arange(256, dtype=np.uint8)[:, None])]


def bfloat16_subnormal(x: mx.array) -> np.ndarray:
    magnitude = np.abs(np.array(x.astype(mx.float32)))
    return (magnitude > 0) & (magnitude < 2.0**-126)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_kernel_decodes_every_code_with_every_scale(dtype):
    inputs = every_code_with_every_scale()
    out = run(fam.mxfp4_launch(256, 32, dtype, per_thread=4), inputs)[0]
    with np.errstate(over="ignore"):  # 6 * 2^127 overflows float32, as it does in-kernel
        expected = fam.rounded_to(fam.mxfp4_reference(*inputs), dtype)
    assert_value_exact(out, expected)
    assert np.isnan(np.array(out.astype(mx.float32))[255]).all()


def test_mxfp4_kernel_keeps_subnormal_bfloat16_results():
    inputs = every_code_with_every_scale()
    with np.errstate(over="ignore"):
        expected = fam.rounded_to(fam.mxfp4_reference(*inputs), mx.bfloat16)
    subnormal = bfloat16_subnormal(expected)
    # 2^-127 times 0.5, 1, 1.5 and 2^-126 times 0.5, each code twice a row, both signs
    if subnormal.sum() != 16:
        pytest.fail("the test's premise is wrong", pytrace=False)
    out = run(fam.mxfp4_launch(256, 32, mx.bfloat16, per_thread=4), inputs)[0]
    mtwork.assert_close(np.array(out.astype(mx.float32))[subnormal],
                        np.array(expected.astype(mx.float32))[subnormal], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_kernel_dequantises_quantised_weights(dtype):
    w = np.random.default_rng(1).standard_normal((6, 128)) * 0.02
    packed, scales = formats.quantize_mxfp4(w)
    inputs = [mx.array(packed), mx.array(scales)]
    out = run(fam.mxfp4_launch(6, 128, dtype), inputs)[0]
    exact = fam.mxfp4_reference(*inputs)
    assert_value_exact(out, fam.rounded_to(exact, dtype))
    # With unit = the block's scale, elements round within half a step (at most 1 unit,
    # between 4 and 6) and the block's largest, below 8 units, saturates to 6: 2 units.
    unit = np.repeat(formats.decode_e8m0(scales), formats.MX_BLOCK, axis=1)
    error = np.abs(exact - w) / unit
    assert error.max() <= 2 and np.median(error) <= 0.5


@pytest.mark.parametrize("per_thread", [2, 32])
def test_mxfp4_kernel_splits_blocks_over_threads_either_way(per_thread):
    inputs = fam.mxfp4_inputs(3, 96, seed=2)
    out = run(fam.mxfp4_launch(3, 96, mx.float16, per_thread=per_thread, threads=32), inputs)[0]
    assert_value_exact(out, fam.rounded_to(fam.mxfp4_reference(*inputs), mx.float16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kernel_decodes_every_code(dtype):
    inputs = [mx.array(np.arange(256, dtype=np.uint8).reshape(16, 16)),
              mx.array(np.ones((1, 1), np.float32))]
    out = run(fam.fp8_launch(16, 16, 16, dtype, per_thread=4), inputs)[0]
    expected = fam.rounded_to(fam.fp8_reference_for(16)(*inputs), dtype)
    assert_value_exact(out, expected)
    assert np.isnan(np.array(out.astype(mx.float32))).sum() == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kernel_applies_one_scale_per_tile_with_partial_edge_tiles(dtype):
    rows, cols, block = 20, 40, 16  # 2 x 3 tiles, the last row and column of tiles partial
    inputs = fam.fp8_inputs(rows, cols, block, seed=3)
    out = run(fam.fp8_launch(rows, cols, block, dtype, per_thread=8), inputs)[0]
    expected = fam.fp8_reference_for(block)(*inputs)
    assert_value_exact(out, fam.rounded_to(expected, dtype))
    mtwork.assert_close(out, expected)


# --- router -----------------------------------------------------------------------------


ROUTER = fam.RouterShape(tokens=4, hidden=96, experts=48, top_k=6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_router_selects_the_oracles_experts_and_weights(dtype):
    inputs = fam.router_inputs(ROUTER, dtype, seed=2)
    # The float32 kernel can only be asked to agree where the oracle's choice is clear.
    assert reference.selection_margin(*inputs[:3], ROUTER.top_k) > 1e-4
    ids, weights = run(fam.router_launch(ROUTER, dtype, threads=64), inputs)
    expected_ids, expected_weights = fam.router_reference_for(ROUTER.top_k)(*inputs)
    np.testing.assert_array_equal(np.array(ids), expected_ids)
    mtwork.assert_close(weights, expected_weights)
    np.testing.assert_allclose(np.array(weights).sum(axis=1), 1.5, rtol=1e-5)


def test_router_bias_steers_selection_but_not_weights_and_ties_go_to_the_smaller_index():
    x, gate, bias, route_scale = fam.router_inputs(ROUTER, mx.float32, seed=4)
    gate, bias = np.array(gate), np.array(bias)
    gate[30] = gate[7]
    bias[7] = bias[30] = 5.0  # experts 7 and 30 tie, ahead of all others
    bias[11] = 3.0  # expert 11 is chosen third whatever its score
    inputs = [x, mx.array(gate), mx.array(bias), route_scale]
    ids, weights = run(fam.router_launch(ROUTER, mx.float32, threads=96), inputs)
    expected_ids, expected_weights = fam.router_reference_for(ROUTER.top_k)(*inputs)
    assert (np.array(ids)[:, :3] == [7, 30, 11]).all()
    np.testing.assert_array_equal(np.array(ids), expected_ids)
    mtwork.assert_close(weights, expected_weights)
    w = np.array(weights)
    np.testing.assert_array_equal(w[:, 0], w[:, 1])  # same unbiased score, same weight


# --- partial RoPE -------------------------------------------------------------------------


ROPE = fam.RopeShape(tokens=5, heads=3, head_dim=48, rope_dims=16, max_position=1024)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rope_matches_the_oracle(dtype, inverse):
    inputs = fam.rope_inputs(ROPE, dtype, seed=5)
    out = run(fam.rope_launch(ROPE, dtype, inverse=inverse), inputs)[0]
    mtwork.assert_close(out, fam.rope_reference_for(ROPE.rope_dims, inverse)(*inputs))
    nope = ROPE.head_dim - ROPE.rope_dims  # passed through bit for bit
    mtwork.assert_bitwise_equal(out[..., :nope], inputs[0][..., :nope])


def test_inverse_rope_undoes_forward_rope_and_full_rope_rotates_every_pair():
    full = fam.RopeShape(tokens=4, heads=2, head_dim=32, rope_dims=32, max_position=512)
    x, positions, cos, sin = fam.rope_inputs(full, mx.float32, seed=6)
    rotated = run(fam.rope_launch(full, mx.float32), [x, positions, cos, sin])[0]
    mtwork.assert_close(rotated, fam.rope_reference_for(32)(x, positions, cos, sin))
    back = run(fam.rope_launch(full, mx.float32, inverse=True), [rotated, positions, cos, sin])
    mtwork.assert_close(back[0], x, atol=1e-5, rtol=1e-5)
    # A rotation keeps each pair's norm.
    pairs = np.array(rotated).reshape(4, 2, 16, 2)
    np.testing.assert_allclose(np.hypot(*np.moveaxis(pairs, -1, 0)),
                               np.hypot(*np.moveaxis(np.array(x).reshape(4, 2, 16, 2), -1, 0)),
                               rtol=1e-5)


# --- indexer score and top-k ----------------------------------------------------------------


@pytest.mark.parametrize("shared_key", [True, False], ids=["shared-key", "per-head-key"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_indexer_score_matches_the_oracle(dtype, shared_key):
    shape = fam.IndexerShape(queries=2, heads=4, head_dim=64, keys=37, shared_key=shared_key)
    inputs = fam.indexer_inputs(shape, dtype, seed=7)
    out = run(fam.indexer_launch(shape, dtype, simdgroups=4), inputs)[0]
    expected = fam.indexer_reference(*inputs)
    mtwork.assert_close(out, expected)
    assert (expected != 0).any() and (np.array(inputs[2]) < 0).any()  # ReLU and signs matter


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("distinct, threads", [(None, 64), (5, 32)], ids=["random", "ties"])
def test_topk_returns_the_oracles_indices_and_values(dtype, distinct, threads):
    shape = fam.TopKShape(rows=3, n=100, k=12)  # 100 slots sort in 128
    inputs = fam.topk_inputs(shape, dtype, seed=8, distinct=distinct)
    indices, values = run(fam.topk_launch(shape, dtype, threads=threads), inputs)
    expected_indices, expected_values = fam.topk_reference_for(shape.k)(*inputs)
    np.testing.assert_array_equal(np.array(indices), expected_indices)
    mtwork.assert_bitwise_equal(values, mx.array(expected_values).astype(dtype))


def test_topk_with_k_equal_to_n_is_a_full_sort_with_ties_by_index():
    shape = fam.TopKShape(rows=2, n=64, k=64)
    inputs = fam.topk_inputs(shape, mx.float32, seed=9, distinct=3)
    indices, _ = run(fam.topk_launch(shape, mx.float32, threads=32), inputs)
    scores = np.array(inputs[0])
    for row, order in zip(scores, np.array(indices)):
        keys = list(zip(-row[order], order))
        assert keys == sorted(keys) and sorted(order) == list(range(64))


# --- Sinkhorn split -------------------------------------------------------------------------


@pytest.mark.parametrize("iters", [1, 20])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinkhorn_split_matches_the_oracle(dtype, iters):
    inputs = fam.sinkhorn_inputs(9, dtype, seed=10)
    outputs = run(fam.sinkhorn_launch(9, dtype, iters=iters, threads=16), inputs)
    for name, out, expected in zip(("pre", "post", "comb"), outputs,
                                   fam.sinkhorn_reference_for(iters)(*inputs)):
        mtwork.assert_close(out, expected, name=name)
    comb = np.array(outputs[2])
    np.testing.assert_allclose(comb.sum(axis=-2), 1.0, atol=1e-5)  # columns last
    if iters == 20:  # converged: rows too
        np.testing.assert_allclose(comb.sum(axis=-1), 1.0, atol=1e-3)


# --- SDPA decode with a sink ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, simdgroups", [
    (fam.AttentionShape(batch=2, heads=4, kv_heads=2, length=37, head_dim=64), 4),
    (fam.AttentionShape(batch=1, heads=3, kv_heads=1, length=3, head_dim=32), 4),
], ids=["gqa", "mqa-fewer-keys-than-simdgroups"])
def test_sdpa_decode_with_sink_matches_the_oracle(dtype, shape, simdgroups):
    inputs = fam.sdpa_inputs(shape, dtype, seed=11)
    out = run(fam.sdpa_launch(shape, dtype, simdgroups=simdgroups), inputs)[0]
    tol = fam.SDPA_TOLERANCE[dtype]
    mtwork.assert_close(out, fam.sdpa_reference(*inputs), atol=tol, rtol=tol)


def test_sdpa_sink_only_takes_mass_from_the_denominator():
    shape = fam.AttentionShape(batch=1, heads=2, kv_heads=1, length=16, head_dim=32)
    q, k, v, _, scale = fam.sdpa_inputs(shape, mx.float32, seed=12)
    v = mx.ones_like(v)  # every value row is 1: the output is the mass left to the keys
    sinks = mx.array(np.array([-1e4, 2.0], np.float32))  # no sink, a strong sink
    out = np.array(run(fam.sdpa_launch(shape, mx.float32), [q, k, v, sinks, scale])[0])
    np.testing.assert_allclose(out[0, 0], 1.0, rtol=1e-6)
    scores = np.array(q)[0, 1] @ np.array(k)[0, 0].T * float(np.array(scale))
    kept = np.exp(scores).sum() / (np.exp(scores).sum() + np.exp(2.0))
    np.testing.assert_allclose(out[0, 1], kept, rtol=1e-5)


# --- the sanitizer on the kernels that share threadgroup memory -----------------------------


@pytest.mark.parametrize("launch, inputs", [
    (fam.topk_launch(fam.TopKShape(2, 100, 10), threads=32),
     fam.topk_inputs(fam.TopKShape(2, 100, 10))),
    (fam.router_launch(fam.RouterShape(2, 64, 40, 6), threads=64),
     fam.router_inputs(fam.RouterShape(2, 64, 40, 6))),
    (fam.sdpa_launch(fam.AttentionShape(1, 2, 1, 3, 32)),
     fam.sdpa_inputs(fam.AttentionShape(1, 2, 1, 3, 32))),
], ids=["topk_bitonic", "moe_router", "sdpa_decode_sink"])
def test_no_races_out_of_bounds_accesses_or_unwritten_outputs(launch, inputs):
    launch.kernel(inputs=inputs, grid=launch.grid, threadgroup=launch.threadgroup,
                  output_shapes=launch.output_shapes, output_dtypes=launch.output_dtypes,
                  template=launch.template, sanitize=True)  # raises on any finding
    assert launch.kernel.last_sanitizer_report.ok


# --- CSA / HCA compressor pool ----------------------------------------------------------------


POOLS = [fam.PoolShape(tokens=27, dim=48, rate=4, overlap=True),  # CSA, 6 windows + 3 left
         fam.PoolShape(tokens=300, dim=16, rate=128, overlap=False)]  # HCA, 2 windows + 44


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", POOLS, ids=lambda s: s.name)
def test_compressor_pool_matches_the_oracle(shape, dtype):
    inputs = fam.pool_inputs(shape, dtype, seed=13)
    out = run(fam.pool_launch(shape, dtype, threads=32), inputs)[0]
    assert out.shape == (shape.windows, shape.dim)
    mtwork.assert_close(out, fam.pool_reference_for(shape)(*inputs))


def test_pool_oracle_on_cases_worked_by_hand():
    rate, dim = 2, 3
    kv = np.arange(4 * 2 * dim, dtype=np.float64).reshape(4, 2 * dim)
    flat = np.zeros_like(kv)
    # Equal scores: each window's entry is the mean of its slots. CSA window 0 has only its
    # own two tokens (second half of the channels); window 1 adds window 0's first half.
    out = reference.compressor_pool(kv, flat, np.zeros((rate, 2 * dim)), rate, overlap=True)
    np.testing.assert_array_equal(out[0], kv[0:2, dim:].mean(axis=0))
    np.testing.assert_array_equal(out[1], (kv[0:2, :dim].sum(0) + kv[2:4, dim:].sum(0)) / 4)
    # HCA: the APE alone can make the second slot dominate.
    ape = np.array([[0.0] * dim, [100.0] * dim])
    out = reference.compressor_pool(kv[:, :dim], flat[:, :dim], ape, rate, overlap=False)
    np.testing.assert_allclose(out, kv[[1, 3], :dim], rtol=1e-12)


@pytest.mark.parametrize("overlap", [False, True], ids=["HCA", "CSA"])
def test_compressor_pool_follows_a_dominant_score(overlap):
    shape = fam.PoolShape(tokens=16, dim=32, rate=4, overlap=overlap)
    kv, gate, ape = fam.pool_inputs(shape, seed=14)
    gate = np.array(gate)
    gate[6, -shape.dim:] = 60.0  # token 6's own-window slot outweighs all others (e^-50)
    out = np.array(run(fam.pool_launch(shape), [kv, mx.array(gate), ape])[0])
    np.testing.assert_allclose(out[1], np.array(kv)[6, -shape.dim:], rtol=1e-6, atol=1e-6)


# --- mHC collapse and expand ------------------------------------------------------------------


MHC_TOKENS, MHC_DIM = 6, 64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_thread", [1, 4])
def test_mhc_collapse_matches_the_oracle_with_each_tokens_own_weights(dtype, per_thread):
    pre = fam.mhc_weights(MHC_TOKENS, seed=15)[0]
    one = fam.streams_input(1, MHC_DIM, dtype, seed=16)
    streams = mx.repeat(one, MHC_TOKENS, axis=0)  # the same streams for every token
    out = run(fam.collapse_launch(MHC_TOKENS, MHC_DIM, dtype, per_thread=per_thread,
                                  threads=8), [streams, pre])[0]
    mtwork.assert_close(out, fam.collapse_reference(streams, pre))
    # Only the weights differ between tokens, and so do the results: dynamic, per token.
    rows = np.array(out.astype(mx.float32))
    assert len({row.tobytes() for row in rows}) == MHC_TOKENS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_thread", [1, 8])
def test_mhc_expand_matches_the_oracle(dtype, per_thread):
    _, post, comb = fam.mhc_weights(MHC_TOKENS, seed=17)
    streams = fam.streams_input(MHC_TOKENS, MHC_DIM, dtype, seed=18)
    f = fam.streams_input(MHC_TOKENS, MHC_DIM, dtype, seed=19)[:, 0]
    out = run(fam.expand_launch(MHC_TOKENS, MHC_DIM, dtype, per_thread=per_thread),
              [f, streams, post, comb])[0]
    expected = fam.expand_reference(f, streams, post, comb)
    mtwork.assert_close(out, expected)
    # comb's orientation matters: its transpose (rows into columns) is far out of band.
    transposed = fam.expand_reference(f, streams, post, np.swapaxes(np.array(comb), 1, 2))
    assert not mtwork.diff(out, transposed).ok


def test_mhc_expand_moves_streams_by_a_permutation_comb():
    # comb[m, n] = 1 when n = (m + 1) % 4 and post = 0: old stream m becomes new stream m + 1.
    shift = np.roll(np.eye(4, dtype=np.float32), 1, axis=1)
    comb = mx.array(np.broadcast_to(shift, (MHC_TOKENS, 4, 4)).copy())
    post = mx.zeros((MHC_TOKENS, 4))
    streams = fam.streams_input(MHC_TOKENS, MHC_DIM, seed=20)
    f = streams[:, 0]
    out = run(fam.expand_launch(MHC_TOKENS, MHC_DIM), [f, streams, post, comb])[0]
    mtwork.assert_bitwise_equal(out, mx.roll(streams, 1, axis=1))
    np.testing.assert_array_equal(fam.expand_reference(f, streams, post, comb),
                                  np.roll(np.array(streams), 1, axis=1))


# --- CSA decode: SDPA over a gather list --------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, lists, simdgroups", [
    (fam.AttentionShape(batch=2, heads=4, kv_heads=2, length=90, head_dim=64),
     dict(top_k=20, window=16, capacity=48), 4),
    (fam.AttentionShape(batch=1, heads=3, kv_heads=1, length=40, head_dim=32),
     dict(top_k=1, window=2), 8),
], ids=["gqa-padded-list", "mqa-fewer-entries-than-simdgroups"])
def test_csa_sdpa_decode_matches_the_oracle(dtype, shape, lists, simdgroups):
    inputs = fam.csa_inputs(shape, dtype=dtype, seed=21, **lists)
    out = run(fam.csa_launch(shape, dtype, simdgroups=simdgroups), inputs)[0]
    tol = fam.SDPA_TOLERANCE[dtype]
    expected = fam.csa_reference(*inputs)
    mtwork.assert_close(out, expected, atol=tol, rtol=tol)
    # The list matters: attending to every row instead is far out of band.
    dense = reference.sdpa_sink(*inputs[:3], inputs[4], float(np.array(inputs[5])))
    assert not mtwork.diff(out, dense, atol=tol, rtol=tol).ok


@pytest.mark.parametrize("dtype", DTYPES)
def test_csa_sdpa_over_every_row_in_order_is_the_dense_kernel_bit_for_bit(dtype):
    shape = fam.AttentionShape(batch=2, heads=4, kv_heads=1, length=37, head_dim=64)
    q, k, v, sinks, scale = fam.sdpa_inputs(shape, dtype, seed=22)
    every = mx.array(np.tile(np.arange(37, dtype=np.int32), (2, 1)))
    sparse = run(fam.csa_launch(shape, dtype), [q, k, v, every, sinks, scale])[0]
    dense = run(fam.sdpa_launch(shape, dtype), [q, k, v, sinks, scale])[0]
    mtwork.assert_bitwise_equal(sparse, dense)


def test_csa_sdpa_with_an_empty_list_gives_the_sink_all_the_mass():
    shape = fam.AttentionShape(batch=1, heads=2, kv_heads=1, length=8, head_dim=32)
    q, k, v, _, sinks, scale = fam.csa_inputs(shape, top_k=2, window=2, seed=23)
    empty = mx.full((1, 5), -1, dtype=mx.int32)
    out = run(fam.csa_launch(shape), [q, k, v, empty, sinks, scale])[0]
    np.testing.assert_array_equal(np.array(out), 0.0)


def test_csa_lists_hold_the_window_and_distinct_earlier_rows():
    lists = np.array(fam.csa_indices(3, 50, top_k=10, window=8, capacity=24, seed=24))
    for row in lists:
        rows = row[row >= 0]
        assert len(rows) == 18 and len(set(rows)) == 18
        assert set(range(42, 50)) <= set(rows) and (rows[~np.isin(rows, range(42, 50))] < 42).all()
    with pytest.raises(ValueError, match="capacity"):
        fam.csa_indices(1, 50, top_k=10, window=8, capacity=12)


# --- the new kernels sanitized ------------------------------------------------------------------


def sanitized_cases():
    pool = fam.PoolShape(tokens=10, dim=32, rate=4, overlap=True)
    tokens, dim = 3, 32
    weights = fam.mhc_weights(tokens, seed=25)
    streams = fam.streams_input(tokens, dim, seed=26)
    attention = fam.AttentionShape(batch=1, heads=2, kv_heads=1, length=24, head_dim=32)
    return {
        "compressor_pool": (fam.pool_launch(pool, threads=16), fam.pool_inputs(pool, seed=27)),
        "mhc_collapse": (fam.collapse_launch(tokens, dim, per_thread=2, threads=8),
                         [streams, weights[0]]),
        "mhc_expand": (fam.expand_launch(tokens, dim, per_thread=2, threads=8),
                       [streams[:, 0], streams, weights[1], weights[2]]),
        "csa_sdpa_decode": (fam.csa_launch(attention, simdgroups=2),
                            fam.csa_inputs(attention, top_k=4, window=4, capacity=11,
                                           seed=28)),
    }


@pytest.mark.parametrize("name", ["compressor_pool", "mhc_collapse", "mhc_expand",
                                  "csa_sdpa_decode"])
def test_new_kernels_run_sanitized_without_findings(name):
    launch, inputs = sanitized_cases()[name]
    launch(*inputs, backend="sim", sanitize=True)
    assert launch.sanitizer_report.ok, str(launch.sanitizer_report)


def test_launches_reject_knobs_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="per_thread"):
        fam.expand_launch(2, 64, per_thread=3)
    with pytest.raises(ValueError, match="no window"):
        fam.PoolShape(tokens=3, dim=8, rate=4, overlap=False)
    with pytest.raises(ValueError, match="dtype"):
        fam.collapse_launch(2, 64, mx.int32)
