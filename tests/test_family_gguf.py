"""GGUF dequantisation kernels (kernels/gguf) against their float64 oracles on sim.

The oracles and quantisers follow llama.cpp's layouts; blocks built by hand byte by byte
from llama.cpp's struct definitions pin those layouts down, so a quantiser and an oracle
that agreed on a wrong layout would fail here rather than pass together.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

family = mtwork.load_family("gguf")
quants = family.quants
FORMATS = list(family.FORMATS)
BACKEND = "sim"


def run(fmt: str, packed: np.ndarray, dtype: mx.Dtype = mx.float32, **launch) -> mx.array:
    return family.dequantize(fmt, np.atleast_2d(packed), dtype, backend=BACKEND, **launch)


def check_against_oracle(fmt: str, out: mx.array, expected: np.ndarray,
                         dtype: mx.Dtype) -> mtwork.DiffReport:
    """Within MAX_ULP of the float64 oracle, and bit for bit where that bound is 0."""
    report = mtwork.diff(out, expected, name=f"{fmt} -> {dtype}")
    assert report.ok, str(report)
    assert report.max_ulp <= family.MAX_ULP[fmt, dtype], str(report)
    if dtype == mx.float32 and family.MAX_ULP[fmt, dtype] == 0:
        mtwork.assert_bitwise_equal(out, expected.astype(np.float32))
    return report


@pytest.fixture(scope="module")
def weights() -> np.ndarray:
    return family.sample_weights(*family.TEST_SHAPE, seed=1)


@pytest.fixture(scope="module")
def packed(weights) -> dict[str, np.ndarray]:
    return {fmt: f.quantize(weights) for fmt, f in family.FORMATS.items()}


# --- the iq2_xxs tables -------------------------------------------------------------------


def test_ksigns_are_seven_sign_bits_plus_a_parity_bit_making_negatives_even():
    table = quants.header_table("ksigns_iq2xs")
    derived = []
    for bits in range(128):
        negatives = bin(bits).count("1")
        derived.append(bits | (negatives % 2) << 7)
    assert table == derived
    assert all(bin(v).count("1") % 2 == 0 for v in table)
    assert list(quants.sign_bytes(np.arange(128))) == derived


def test_iq2xxs_grid_has_256_distinct_points_of_three_magnitudes():
    words = quants.header_table("iq2xxs_grid")
    assert len(words) == 256
    assert len(set(words)) == 256
    assert words == sorted(words)  # llama.cpp lists the points in increasing order
    grid = quants.iq2xxs_grid()
    assert set(np.unique(grid)) == {0x08, 0x19, 0x2B}
    # byte j of each little-endian word is weight j
    assert [w & 0xFF for w in words[:3]] == [0x08, 0x2B, 0x19]
    assert list(grid[1]) == [0x2B, 8, 8, 8, 8, 8, 8, 8]


def test_iq2xxs_tables_match_the_gguf_package():
    gguf_quants = pytest.importorskip("gguf.quants")
    iq2 = gguf_quants.IQ2_XXS
    iq2.init_grid()
    np.testing.assert_array_equal(iq2.grid.reshape(256, 8), quants.iq2xxs_grid())
    assert list(iq2.ksigns) == quants.header_table("ksigns_iq2xs")


# --- hand-built blocks: llama.cpp's byte layouts, written out ---------------------------------


def hand_built_q8_0() -> tuple[np.ndarray, np.ndarray]:
    """block_q8_0 {half d; int8_t qs[32];}: two blocks, d = 0.5 and d = 1/1024."""
    qs = np.array([-128, -127, -1, 0, 1, 2, 3, 127] * 4, dtype=np.int8)
    packed = bytes([0x00, 0x38]) + qs.tobytes() + bytes([0x00, 0x14]) + qs[::-1].tobytes()
    expected = np.concatenate([qs * 0.5, qs[::-1] / 1024.0])
    return np.frombuffer(packed, np.uint8), expected


def hand_built_q2_K() -> tuple[np.ndarray, np.ndarray]:
    """block_q2_K {uint8_t scales[16]; uint8_t qs[64]; half d; half dmin;}.

    Sub-block s (weights 16s..16s+15) has scale nibble 15 - s and min nibble s; d = 1,
    dmin = 0.25, so a weight of sub-block s with 2-bit value q is (15 - s) q - s / 4.
    Only two qs bytes are set. dequantize_row_q2_K reads qs[32h + l] >> 2k for weight
    128h + 32k + l, so qs[0] = 0b11100100 gives weights 0, 32, 64, 96 the values 0, 1, 2, 3
    and qs[32 + 5] = 0b00001100 gives weight 128 + 32 + 5 = 165 the value 3. (Reading qs
    byte i // 4 instead would put qs[0]'s values on weights 0, 1, 2, 3.)
    """
    block = bytearray(84)
    block[0:16] = bytes((15 - s) | s << 4 for s in range(16))
    block[16 + 0] = 0b11100100
    block[16 + 37] = 0b00001100
    block[80:84] = bytes([0x00, 0x3C, 0x00, 0x34])  # d = 1.0, dmin = 0.25 (fp16, LE)
    sub = np.arange(256) // 16
    expected = -0.25 * sub
    for weight, q in {0: 0, 32: 1, 64: 2, 96: 3, 165: 3}.items():
        s = weight // 16
        expected[weight] = (15 - s) * q - 0.25 * s
    assert list(expected[[0, 1, 32, 64, 96, 165]]) == [0, 0, 12.5, 21, 25.5, 12.5]
    return np.frombuffer(bytes(block), np.uint8), expected


def hand_built_iq2_xxs() -> tuple[np.ndarray, np.ndarray]:
    """block_iq2_xxs {half d; uint16_t qs[32];}, d = 1.

    Group 0 (qs[0..3]): grid indices 1, 0, 255, 2; 7-bit sign indices 1, 0, 3, 127 and
    scale 3, so db = (0.5 + 3) / 4. iq2xxs_grid[1] = 0x080808080808082b,
    [255] = 0x2b2b2b1908081908, [2] = 0x0808080808081919; ksigns 1 -> 0x81 (weights 0 and 7
    negative), 3 -> 0x03, 127 -> 0xff. Groups 1-7 are zero: grid point 0 (all 0x08), no
    signs, scale 0, so every weight is 0.125 * 8 = 1.
    """
    signs_scale = 1 | 0 << 7 | 3 << 14 | 127 << 21 | 3 << 28
    group0 = bytes([1, 0, 255, 2]) + signs_scale.to_bytes(4, "little")
    block = bytes([0x00, 0x3C]) + group0 + bytes(56)
    db = 0.875
    expected = np.ones(256)
    expected[:32] = db * np.array([
        -0x2B, 8, 8, 8, 8, 8, 8, -8,
        8, 8, 8, 8, 8, 8, 8, 8,
        -8, -0x19, 8, 8, 0x19, 0x2B, 0x2B, 0x2B,
        -0x19, -0x19, -8, -8, -8, -8, -8, -8,
    ])
    return np.frombuffer(block, np.uint8), expected


HAND_BUILT = {"q8_0": hand_built_q8_0, "q2_K": hand_built_q2_K,
              "iq2_xxs": hand_built_iq2_xxs}


@pytest.mark.parametrize("fmt", FORMATS)
def test_oracle_reads_a_hand_built_block_in_llama_cpp_layout(fmt):
    packed, expected = HAND_BUILT[fmt]()
    np.testing.assert_array_equal(family.FORMATS[fmt].dequantize(packed), expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_reads_a_hand_built_block_in_llama_cpp_layout(fmt):
    packed, expected = HAND_BUILT[fmt]()
    out = run(fmt, packed, elems_per_thread=4)
    np.testing.assert_array_equal(np.array(out)[0], expected.astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_gguf_package_reads_the_hand_built_block_the_same_way(fmt):
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    packed, expected = HAND_BUILT[fmt]()
    np.testing.assert_array_equal(gguf.quants.dequantize(packed, qtype), expected)


def test_a_kernel_with_the_naive_q2_K_layout_is_caught(packed):
    """The seeds' trap: q = qs[i / 4] >> 2 (i % 4) looks plausible and is wrong."""
    naive = family.KERNELS["q2_K"].read_source().replace(
        "(block.qs[32 * h + i % 32] >> shift) & 3", "(block.qs[i / 4] >> (2 * (i % 4))) & 3")
    assert naive != family.KERNELS["q2_K"].read_source()
    kernel = family.KERNELS["q2_K"].kernel(source=naive)
    block, expected = hand_built_q2_K()
    out = kernel(inputs=[mx.array(block[None])], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                 template=[("T", mx.float32), ("EPT", 4)], output_shapes=[(1, 256)],
                 output_dtypes=[mx.float32], backend=BACKEND)[0]
    assert not np.array_equal(np.array(out)[0], expected)
    assert np.array(out)[0, 1] != expected[1]  # qs[0] bits 2..3 land on weight 1


# --- kernels against the oracles ------------------------------------------------------------


@pytest.mark.parametrize("dtype", family.DTYPES, ids=lambda d: str(d).rsplit(".", 1)[-1])
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_matches_oracle_on_quantised_weights(fmt, dtype, packed):
    out = run(fmt, packed[fmt], dtype)
    assert out.dtype == dtype and out.shape == family.TEST_SHAPE
    check_against_oracle(fmt, out, family.FORMATS[fmt].dequantize(packed[fmt]), dtype)


@pytest.mark.parametrize(("fmt", "elems_per_thread", "threadgroup"), [
    ("q8_0", 1, 96), ("q8_0", 32, 64), ("q2_K", 2, 96), ("q2_K", 32, 32),
    ("iq2_xxs", 1, 96), ("iq2_xxs", 16, 64),
])
def test_every_work_split_gives_the_same_bits(fmt, elems_per_thread, threadgroup, packed):
    """Threads per weight and threadgroup size change nothing; 96 leaves a partial
    threadgroup at the end of the grid."""
    out = run(fmt, packed[fmt], elems_per_thread=elems_per_thread, threadgroup=threadgroup)
    expected = family.FORMATS[fmt].dequantize(packed[fmt]).astype(np.float32)
    mtwork.assert_bitwise_equal(out, expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_weights_dequantise_to_exact_zeros(fmt):
    packed = family.FORMATS[fmt].quantize(np.zeros((2, 256), np.float32))
    out = np.array(run(fmt, packed, mx.float16))
    assert np.all(out == 0)


def test_launch_rejects_a_split_that_crosses_blocks():
    with pytest.raises(ValueError, match="divide 32"):
        family.check_launch("q8_0", 256, 64)
    with pytest.raises(ValueError, match="whole blocks"):
        family.check_launch("q2_K", 100, 4)


# --- quantisers: independent of the kernels, judged against the originals ------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantised_weights_stay_within_the_formats_error(fmt, weights, packed):
    f = family.FORMATS[fmt]
    restored = f.dequantize(packed[fmt])
    assert packed[fmt].shape == (weights.shape[0], weights.shape[1] // f.weights * f.nbytes)
    rel_rmse = np.sqrt(np.mean((restored - weights) ** 2) / np.mean(weights.astype(float) ** 2))
    assert rel_rmse < family.MAX_RELATIVE_RMSE[fmt]


def test_q8_0_error_is_at_most_half_a_step_plus_the_fp16_scale_rounding(weights, packed):
    blocks = weights.reshape(-1, 32).astype(np.float64)
    step = np.abs(blocks).max(axis=1, keepdims=True) / 127
    restored = family.FORMATS["q8_0"].dequantize(packed["q8_0"]).reshape(-1, 32)
    bound = step * (0.5 + 127 * 2.0**-11) * (1 + 1e-6)
    assert np.all(np.abs(restored - blocks) <= bound)


def test_iq2_xxs_keeps_every_sign_but_at_most_the_smallest_of_eight(weights, packed):
    restored = family.FORMATS["iq2_xxs"].dequantize(packed["iq2_xxs"]).reshape(-1, 8)
    original = weights.reshape(-1, 8)
    flipped = np.sign(restored) != np.sign(original)
    assert np.all(flipped.sum(axis=1) <= 1)
    smallest = np.abs(original).argmin(axis=1)
    rows = np.nonzero(flipped.any(axis=1))[0]
    assert np.all(flipped[rows, smallest[rows]])


def test_q8_0_quantiser_is_bit_exact_with_the_gguf_package(weights, packed):
    gguf = pytest.importorskip("gguf")
    ref = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ref, packed["q8_0"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_oracles_agree_with_the_gguf_package(fmt, packed):
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    ref = gguf.quants.dequantize(packed[fmt], qtype)
    # gguf computes in float32: one rounding of the exact value, as in the kernels
    expected = family.FORMATS[fmt].dequantize(packed[fmt]).astype(np.float32)
    np.testing.assert_array_equal(ref, expected)
