"""Constructed cases with known answers for mtwork.oracle."""

import json
import math
import pickle

import mlx.core as mx
import numpy as np
import plotly.graph_objects as go
import pytest

from mtwork.oracle import DiffReport, assert_bitwise_equal, assert_close, diff


def f16(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=np.uint16).view(np.float16)


def bf16(*bits: int) -> mx.array:
    return mx.array(np.array(bits, dtype=np.uint16)).view(mx.bfloat16)


def f32(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


# --- ULP distances ------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_ulp_float32_counts_nextafter_steps(steps: int) -> None:
    a = np.float32(1.0)
    for _ in range(steps):
        a = np.nextafter(a, np.float32(2.0))
    report = diff(np.array([a]), np.array([1.0]))
    assert report.max_ulp == steps


def test_ulp_mean_over_elements() -> None:
    one = np.float32(1.0)
    up1 = np.nextafter(one, np.float32(2))
    up2 = np.nextafter(up1, np.float32(2))
    report = diff(np.array([one, up1, up2]), np.ones(3))
    assert (report.max_ulp, report.mean_ulp) == (2, 1.0)


@pytest.mark.parametrize(
    ("actual", "expected", "ulps"),
    [
        (f16(0x3C01), 1.0, 1),  # just above 1.0
        (f16(0x3BFF), 1.0, 1),  # just below 1.0, across an exponent boundary
        (f16(0x3C05), 1.0, 5),
        (f16(0x7BFF), 65504.0, 0),  # largest finite float16
    ],
)
def test_ulp_float16_neighbours(actual: np.ndarray, expected: float, ulps: int) -> None:
    assert diff(actual, np.array([expected])).max_ulp == ulps


@pytest.mark.parametrize(
    ("actual", "expected", "ulps"),
    [(bf16(0x3F81), 1.0, 1), (bf16(0x3F7F), 1.0, 1), (bf16(0x3F83), 1.0, 3)],
)
def test_ulp_bfloat16_neighbours(actual: mx.array, expected: float, ulps: int) -> None:
    report = diff(actual, np.array([expected]))
    assert (report.dtype, report.max_ulp) == ("bfloat16", ulps)


@pytest.mark.parametrize(
    ("positive", "negative"),
    [
        (f32(0x00000001), f32(0x80000001)),
        (f16(0x0001), f16(0x8001)),
        (bf16(0x0001), bf16(0x8001)),
    ],
    ids=["float32", "float16", "bfloat16"],
)
def test_ulp_across_zero_between_smallest_subnormals_is_two(positive, negative) -> None:
    assert diff(positive, negative).max_ulp == 2


@pytest.mark.parametrize(
    ("plus", "minus"),
    [(f32(0x00000000), f32(0x80000000)), (f16(0x0000), f16(0x8000)), (bf16(0x0000), bf16(0x8000))],
    ids=["float32", "float16", "bfloat16"],
)
def test_signed_zeros_are_zero_ulp_apart_and_match(plus, minus) -> None:
    report = diff(plus, minus)
    assert report.ok
    assert report.max_ulp == 0


def test_expected_is_rounded_once_to_bfloat16() -> None:
    # 1 + 2**-8 + 2**-30 lies just above the midpoint of 1.0 and 1 + 2**-7. Rounding through
    # float32 first would create an exact tie and land on 1.0 (even).
    expected = np.array([1 + 2**-8 + 2**-30])
    assert diff(bf16(0x3F81), expected).max_ulp == 0
    assert diff(bf16(0x3F80), expected).max_ulp == 1


def test_bfloat16_rounding_matches_brute_force_nearest() -> None:
    rng = np.random.default_rng(0)
    positive = np.arange(0x0000, 0x7F81, dtype=np.uint32)  # 0 .. +Inf
    values = (positive << 16).view(np.float32).astype(np.float64)
    mids = (values[:-2] + values[1:-1]) / 2
    nudge = rng.choice([-1.0, 0.0, 1.0], size=mids.size) * np.abs(mids) * 2.0**-40
    x = np.concatenate([mids + nudge, rng.uniform(-3, 3, 1000)])
    x = x * rng.choice([-1.0, 1.0], size=x.size)
    # Nearest bfloat16 by search, ties to the even bit pattern.
    hi = np.searchsorted(values, np.abs(x))
    lo = hi - 1
    below, above = np.abs(x) - values[lo], values[hi] - np.abs(x)
    pick = np.where((above < below) | ((above == below) & (hi % 2 == 0)), hi, lo)
    bits = positive[pick] | np.where(x < 0, 0x8000, 0).astype(np.uint32)
    report = diff(bf16(*bits.tolist()), x)
    assert report.max_ulp == 0


def test_dtype_override_sets_ulp_unit_and_band() -> None:
    a = np.array([1 + 2**-10], dtype=np.float32)
    assert diff(a, [1.0]).max_ulp == 2**13
    as_f16 = diff(a, [1.0], dtype="float16")
    assert (as_f16.dtype, as_f16.max_ulp, as_f16.atol) == ("float16", 1, 5e-3)
    assert diff(a, [1.0], dtype=mx.bfloat16).dtype == "bfloat16"


# --- NaN and Inf --------------------------------------------------------------------------


def test_nan_in_actual_only_is_listed_mismatch() -> None:
    a = np.zeros((2, 3), dtype=np.float32)
    a[1, 2] = np.nan
    report = diff(a, np.zeros((2, 3)))
    assert not report.ok
    assert report.n_mismatch == 1
    assert report.mismatches[0].index == (1, 2)
    assert math.isnan(report.mismatches[0].actual)
    assert (report.nan_actual, report.nan_expected) == (1, 0)


def test_nan_on_both_sides_matches() -> None:
    report = diff(np.array([np.nan, 1.0], np.float32), np.array([np.nan, 1.0]))
    assert report.ok
    assert (report.nan_actual, report.nan_expected) == (1, 1)


def test_nan_in_expected_only_is_mismatch() -> None:
    assert not diff(np.float32([1.0]), [np.nan]).ok


@pytest.mark.parametrize(
    ("actual", "expected", "ok"),
    [
        (np.inf, np.inf, True),
        (-np.inf, -np.inf, True),
        (np.inf, -np.inf, False),
        (np.inf, 3.0e38, False),
        (1.0, np.inf, False),
    ],
)
def test_inf_matches_only_same_sign_inf(actual: float, expected: float, ok: bool) -> None:
    report = diff(np.float32([actual]), [expected])
    assert report.ok is ok


def test_inf_counts_per_side() -> None:
    report = diff(np.float32([np.inf, -np.inf, 0]), [np.inf, 1.0, 0.0])
    assert (report.inf_actual, report.inf_expected, report.n_mismatch) == (2, 1, 1)


# --- bitwise mode -------------------------------------------------------------------------


def test_bitwise_detects_one_ulp_change() -> None:
    a = np.linspace(0, 1, 16, dtype=np.float32)
    b = a.copy()
    b[5] = np.nextafter(b[5], np.float32(2))
    report = diff(a, b, bitwise=True)
    assert (report.ok, report.n_mismatch, report.max_ulp, report.band) == (False, 1, 1, "bitwise")


def test_bitwise_detects_signed_zero() -> None:
    report = diff(np.float32([0.0]), np.float32([-0.0]), bitwise=True)
    assert (report.ok, report.n_mismatch, report.max_ulp) == (False, 1, 0)


def test_bitwise_nan_equal_bits_equal_other_payload_differs() -> None:
    assert diff(f32(0x7FC00001), f32(0x7FC00001), bitwise=True).ok
    assert not diff(f32(0x7FC00001), f32(0x7FC00002), bitwise=True).ok
    assert not diff(f32(0x7F800001), f32(0x7FC00001), bitwise=True).ok  # signalling vs quiet
    assert not diff(bf16(0x7F81), bf16(0x7FC1), bitwise=True).ok


def test_bitwise_integers() -> None:
    assert diff(np.int8([1, -2]), np.int8([1, -2]), bitwise=True).ok
    assert diff(np.int8([1, -2]), np.int8([1, 2]), bitwise=True).n_mismatch == 1


def test_bitwise_requires_one_dtype() -> None:
    with pytest.raises(ValueError, match="float32.*float64"):
        diff(np.float32([1.0]), np.float64([1.0]), bitwise=True)


# --- tolerance bands ----------------------------------------------------------------------


def test_float16_band_passes_within_5e_3_and_fails_at_1e_2() -> None:
    assert diff(np.float16([4e-3]), [0.0]).ok
    failing = diff(np.float16([1e-2]), [0.0])
    assert not failing.ok
    assert failing.band == "float16 default (atol=0.005, rtol=0.005)"


@pytest.mark.parametrize(
    ("make", "tol"),
    [
        (lambda v: np.array([v], np.float64), 1e-10),
        (lambda v: np.array([v], np.float32), 1e-4),
        (lambda v: np.array([v], np.float16), 5e-3),
        (lambda v: mx.array([v], dtype=mx.bfloat16), 5e-2),
        (lambda v: np.array([1j * v], np.complex64), 1e-4),  # imaginary part judged alone
    ],
    ids=["float64", "float32", "float16", "bfloat16", "complex64"],
)
def test_default_band_per_dtype(make, tol: float) -> None:
    passing, failing = diff(make(0.5 * tol), [0.0]), diff(make(2 * tol), [0.0])
    assert (passing.ok, failing.ok) == (True, False)
    assert (passing.atol, passing.rtol) == (tol, tol)


def test_band_is_relative_to_expected() -> None:
    # float32 band: 1e-4 + 1e-4 * 1000 = 0.1001
    assert diff(np.float32([1000.09]), [1000.0]).ok
    assert not diff(np.float32([1000.2]), [1000.0]).ok


def test_user_band_overrides_default() -> None:
    report = diff(np.float16([1e-2]), [0.0], atol=0.1)
    assert report.ok
    assert report.band == "custom (atol=0.1, rtol=0.005)"


def test_integers_and_bools_compare_exactly() -> None:
    assert diff(np.int32([1, 2, 3]), np.int32([1, 2, 3])).ok
    off_by_one = diff(np.int32([1, 2, 3]), np.int32([1, 2, 4]))
    assert (off_by_one.ok, off_by_one.band, off_by_one.max_ulp) == (
        False,
        "int32 exact (atol=0, rtol=0)",
        None,
    )
    assert not diff(np.int64([2**62 + 1]), np.int64([2**62])).ok  # float64 would call it equal
    assert not diff(np.array([True, False]), np.array([True, True])).ok


# --- inputs -------------------------------------------------------------------------------


def test_shape_mismatch_names_both_shapes_and_fix() -> None:
    with pytest.raises(ValueError) as err:
        diff(np.zeros((2, 3), np.float32), np.zeros((3, 2)))
    message = str(err.value)
    for part in ("(2, 3)", "(3, 2)", "float32", "float64", "reshape"):
        assert part in message


def test_expected_of_size_one_broadcasts() -> None:
    report = diff(np.full((2, 2), 3.0, np.float32), 3.0)
    assert (report.ok, report.size, report.shape) == (True, 4, (2, 2))


def test_non_numeric_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="not numeric.*dtype str32.*np.asarray"):
        diff(np.float32([1.0]), ["a"])


def test_complex_reference_needs_complex_comparison() -> None:
    with pytest.raises(ValueError, match="dtype='complex64'"):
        diff(np.float32([1.0]), [1 + 1j])
    assert diff(np.float32([1.0]), [1 + 0j], dtype="complex64").ok


def test_bfloat16_mx_array_round_trips_every_bit_pattern() -> None:
    bits = np.arange(2**16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        exact = (bits << 16).view(np.float32).astype(np.float64)
    actual = bf16(*bits.tolist())
    assert diff(actual, actual, bitwise=True).ok
    report = diff(actual, exact, atol=0, rtol=0)
    assert (report.ok, report.max_ulp) == (True, 0)


def test_mx_float16_and_complex64_inputs() -> None:
    assert diff(mx.array([1.5], dtype=mx.float16), [1.5]).dtype == "float16"
    report = diff(mx.array([1 + 2j], dtype=mx.complex64), [1 + 2.5j])
    assert (report.dtype, report.ok, report.max_abs_err) == ("complex64", False, 0.5)


# --- metrics ------------------------------------------------------------------------------


def test_cosine_hand_computed() -> None:
    report = diff(np.float32([1, 2, 3]), np.array([4.0, 5.0, 6.0]))
    assert report.cosine == pytest.approx(32 / math.sqrt(14 * 77), rel=1e-12)
    assert diff(np.float32([1, 0]), [1.0, 1.0]).cosine == pytest.approx(1 / math.sqrt(2))
    assert diff(np.float32([0, 0]), [1.0, 1.0]).cosine is None


def test_relative_error_skips_zero_reference() -> None:
    report = diff(np.float32([1.0, 1.5]), [0.0, 1.0])
    assert (report.max_abs_err, report.max_rel_err) == (1.0, 0.5)
    assert diff(np.float32([1.0]), [0.0]).max_rel_err is None


def test_first_mismatches_are_row_major_and_capped() -> None:
    expected = np.zeros((3, 3))
    actual = expected.astype(np.float32)
    for index in [(2, 0), (0, 2), (1, 2)]:
        actual[index] = 1.0
    report = diff(actual, expected, max_listed=2)
    assert [m.index for m in report.mismatches] == [(0, 2), (1, 2)]
    assert report.n_mismatch == 3
    assert report.mismatch_fraction == pytest.approx(3 / 9)


# --- rendering and serialisation ------------------------------------------------------------


def failing_report() -> DiffReport:
    actual = np.ones((4, 5), np.float32)
    actual[1, 3] = np.nan
    actual[2, 0] = 2.0
    return diff(actual, np.ones((4, 5)), name="relu")


def test_text_summary_lists_verdict_and_mismatches() -> None:
    text = str(failing_report())
    assert text.startswith("FAIL relu\n")
    for part in ("float32 (expected float64)", "mismatches 2/20 (10%)", "NaN actual/expected 1/0"):
        assert part in text
    assert "[1, 3] actual=nan expected=1.0" in text
    assert "[2, 0] actual=2.0 expected=1.0" in text
    assert str(diff(np.float32([1]), [1.0])).startswith("PASS\n")


def test_html_shows_verdict_and_is_self_contained() -> None:
    page = failing_report()._repr_html_()
    assert "FAIL relu" in page and "#cf222e" in page
    assert "<script" not in page and "<link" not in page
    assert "PASS" in diff(np.float32([1]), [1.0])._repr_html_()


def test_plot_has_heatmap_marks_and_histogram() -> None:
    fig = failing_report().plot()
    assert isinstance(fig, go.Figure)
    heatmap, marks, bars = fig.data
    assert heatmap.type == "heatmap" and np.asarray(heatmap.z).shape == (4, 5)
    assert (list(marks.y), list(marks.x)) == ([1, 2], [3, 0])
    # 18 exact elements, one at 2.0 vs 1.0 = 2**23 float32 ULPs, the NaN left out.
    assert bars.type == "bar" and (bars.x[0], bars.y[0], sum(bars.y)) == ("0", 18, 19)
    assert (bars.x[-1], bars.y[-1]) == ("2^23–2^24", 1)
    assert "1 non-finite left out" in fig.layout.annotations[1].text


def test_integer_histogram_bins_absolute_error() -> None:
    fig = diff(np.int32([0, 3, 1]), [0.0, 0.0, 0.5]).plot(kind="histogram")
    assert (list(fig.data[0].x), list(fig.data[0].y)) == (["0", "1", "2–3"], [1, 1, 1])
    assert "|actual − expected|" in fig.layout.title.text


def test_plot_kinds_and_nd_collapse() -> None:
    report = diff(np.zeros((2, 3, 600), np.float32), np.zeros((2, 3, 600)))
    heat = report.plot(kind="heatmap")
    assert [t.type for t in heat.data] == ["heatmap"]
    assert np.asarray(heat.data[0].z).shape == (6, 200)  # 600 columns pooled in blocks of 3
    assert "leading dims 2×3 collapsed" in heat.layout.title.text
    assert [t.type for t in report.plot(kind="histogram").data] == ["bar"]
    with pytest.raises(ValueError, match="kind"):
        report.plot(kind="pie")  # type: ignore[arg-type]


def test_to_dict_is_strict_json_and_round_trips() -> None:
    actual = np.array([1 + 1j, np.nan + 0j], np.complex64)
    report = diff(actual, np.array([1 + 2j, 0j]), name="cplx")
    text = json.dumps(report.to_dict(), allow_nan=False)
    restored = DiffReport.from_dict(json.loads(text))
    # Compare dicts, not reports: the NaN in the listing is unequal to itself.
    assert restored.to_dict() == report.to_dict()
    assert str(restored) == str(report)
    with pytest.raises(ValueError, match="restored from a dict"):
        restored.plot()


def test_report_pickles_with_plot_data() -> None:
    report = failing_report()
    restored = pickle.loads(pickle.dumps(report))
    assert restored.to_dict() == report.to_dict()
    assert isinstance(restored.plot(), go.Figure)


def test_assert_close_raises_with_summary() -> None:
    with pytest.raises(AssertionError) as err:
        assert_close(np.float32([1.0, 2.0]), [1.0, 2.5], name="k")
    assert str(err.value) == str(diff(np.float32([1.0, 2.0]), [1.0, 2.5], name="k"))
    assert assert_close(np.float32([1.0]), [1.00001]).ok


def test_assert_bitwise_equal() -> None:
    a = np.float32([1.0, -0.0])
    assert assert_bitwise_equal(a, a.copy()).ok
    with pytest.raises(AssertionError, match="FAIL"):
        assert_bitwise_equal(a, np.float32([1.0, 0.0]))
