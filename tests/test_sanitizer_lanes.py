"""Planted reads of inactive SIMD lanes: a shuffle or broadcast whose source lane has
returned, waits elsewhere, or does not exist gives an undefined value in Metal (MSL
specification, section 6.9.2); each with a clean twin that reads only active lanes."""

import pytest

from tests.helpers.planted import Planted, assert_clean, assert_found

KIND = "read of an inactive SIMD lane"
LANE = "uint lane = thread_index_in_simdgroup;\nfloat x = inp[thread_position_in_grid.x];\n"

CORPUS = [
    Planted("shuffle_down from lanes that returned",
            LANE + "if (lane >= 16) { out[thread_position_in_grid.x] = 0; return; }\n"
            "out[thread_position_in_grid.x] = x + simd_shuffle_down(x, 8);",
            LANE + "if (lane >= 16) { out[thread_position_in_grid.x] = 0; return; }\n"
            "out[thread_position_in_grid.x] = x + simd_shuffle_xor(x, 8);",
            KIND, line="source:4"),
    Planted("broadcast from a lane that returned",
            LANE + "if (lane == 0) { out[thread_position_in_grid.x] = x; return; }\n"
            "out[thread_position_in_grid.x] = simd_broadcast(x, 0);",
            LANE + "if (lane == 0) { out[thread_position_in_grid.x] = x; return; }\n"
            "out[thread_position_in_grid.x] = simd_broadcast_first(x);",
            KIND, line="source:4"),
    Planted("shuffle from lanes past the end of a partial SIMD-group",
            LANE + "out[thread_position_in_grid.x] = simd_shuffle(x, 31 - lane);",
            LANE + "out[thread_position_in_grid.x] = simd_shuffle(x, (lane + 1) % 16);",
            KIND, line="source:3",
            call=dict(grid=(48, 1, 1), threadgroup=(48, 1, 1), output_shapes=[(48,)])),
    Planted("quad shuffle from a lane that returned",
            LANE + "if (lane % 4 == 3) { out[thread_position_in_grid.x] = x; return; }\n"
            "out[thread_position_in_grid.x] = quad_shuffle(x, 3);",
            LANE + "if (lane % 4 == 3) { out[thread_position_in_grid.x] = x; return; }\n"
            "out[thread_position_in_grid.x] = quad_shuffle(x, 2);",
            KIND, line="source:4"),
    # Shifting past the edge is defined (those lanes keep their own value): no finding.
    Planted("shuffle_up within a SIMD-group that returned half its lanes",
            LANE + "if (lane < 16) { out[thread_position_in_grid.x] = 0; return; }\n"
            "out[thread_position_in_grid.x] = simd_shuffle_up(x, 1);",
            LANE + "out[thread_position_in_grid.x] = simd_shuffle_up(x, 1);",
            KIND, line="source:4"),
]


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_defect_is_found_with_kind_and_place(case):
    assert_found(case)


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_clean_twin_has_no_finding(case):
    assert_clean(case)


def test_the_finding_names_the_reader_and_the_lane_read():
    finding = assert_found(CORPUS[1])
    assert finding.other_thread == (0, 0, 0)  # lane 0 of SIMD-group 0, which returned
    assert "lane 0" in finding.detail and "undefined" in finding.detail


def test_a_lane_that_does_not_exist_is_named_so():
    finding = assert_found(CORPUS[2])
    assert finding.other_thread is None
    assert "does not exist" in finding.detail
