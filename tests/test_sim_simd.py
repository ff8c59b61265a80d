"""SIMD-group and quad-group functions on the emulator, against numpy oracles written from
Metal's definitions (MSL specification, section 6.9).

The kernels that test many functions at once run on a grid of 84 threads in threadgroups
of 64: two full SIMD-groups and a partial one of 20 lanes at the edge, and a few lanes
return before the SIMD-group functions run. Those lanes are inactive: reductions, scans
and votes take only the active lanes; a shuffle from an inactive lane gives the caller its
own value (Metal leaves that undefined; mtw_simd.h documents the choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.errors import CompileError

N = 84  # threads in the grid
TG = 64  # threads per threadgroup: the last SIMD-group has 20 lanes
RETURNED = (35, 36, 49, 62, 64, 69)  # lanes that return before any SIMD-group function
GONE = np.isin(np.arange(N), RETURNED).astype(np.int32)
ACTIVE = GONE == 0


def sim_kernel(name: str, inputs: list[str], outputs: list[str], body: str, header: str = ""):
    return mtwork.metal_kernel(name, inputs, outputs, body, header=header, backend="sim")


def launch(kernel, inputs, outputs: list[tuple[int, mx.Dtype]], grid=N, tg=TG):
    results = kernel(
        inputs=inputs,
        grid=(grid, 1, 1),
        threadgroup=(tg, 1, 1),
        output_shapes=[(size,) for size, _ in outputs],
        output_dtypes=[dtype for _, dtype in outputs],
    )
    return [np.array(r) for r in results]


# --- oracles -------------------------------------------------------------------------------


def lane_groups(width: int):
    """(thread indices, active flags) of each group of `width` lanes in the grid."""
    for start in range(0, N, width):
        lanes = np.arange(start, min(start + width, N))
        yield lanes, ACTIVE[lanes]


def butterfly(values: np.ndarray, active: np.ndarray, op: Callable, width: int) -> np.ndarray:
    """Metal's reduction order: partners at lane offsets 1, 2, 4, ... within each group of
    `width` lanes; an inactive lane contributes nothing. `values` holds whole groups."""
    v, has = values.copy(), active.copy()
    offset = 1
    while offset < width:
        p = np.arange(len(v)) ^ offset
        both = has & has[p]
        v = np.where(both, op(v, v[p]), np.where(has, v, v[p]))
        has = has | has[p]
        offset *= 2
    return v


def log_step_scan(values, active, op, identity, inclusive: bool) -> np.ndarray:
    """Prefix over the active lanes of one group, combined in log steps (Hillis-Steele)."""
    size = len(values)
    v, has = values.copy(), active.copy()
    offset = 1
    while offset < size:
        idx = np.arange(size)
        below = idx - offset
        p = np.maximum(below, 0)
        has_p = (below >= 0) & has[p]
        combined = op(v[p], v)
        v = np.where(has & has_p, combined, np.where(has, v, v[p]))
        has = has | has_p
        offset *= 2
    if inclusive:
        return v
    out = np.full_like(values, identity)
    last = None
    for lane in range(size):
        if active[lane]:
            if last is not None:
                out[lane] = v[last]
            last = lane
    return out


def sequential_scan(values, active, op, identity, inclusive: bool) -> np.ndarray:
    out = np.full_like(values, identity)
    acc = None
    for lane in range(len(values)):
        if not active[lane]:
            continue
        before = acc
        acc = values[lane] if acc is None else op(np.array([acc]), values[lane : lane + 1])[0]
        out[lane] = acc if inclusive else (identity if before is None else before)
    return out


def per_group(values: np.ndarray, width: int, fn: Callable) -> np.ndarray:
    """`fn(group values, group active flags)` for each group of `width` lanes; the lanes
    past the end of the grid are padded in as inactive."""
    out = values.copy()
    for lanes, active in lane_groups(width):
        padded = np.zeros(width, dtype=values.dtype)
        padded[: len(lanes)] = values[lanes]
        live = np.zeros(width, dtype=bool)
        live[: len(lanes)] = active
        out[lanes] = fn(padded, live)[: len(lanes)]
    return out


def shifted_source(how: str, idx: int, operand: int, width: int, modulo: int):
    """(source lane within the group, reads the filling value) per Metal's definitions."""
    if how == "shuffle":
        return operand % width, False
    if how == "up":
        return (idx - operand if idx >= operand else None), False
    if how == "down":
        return (idx + operand if idx + operand < width else None), False
    if how == "xor":
        return (idx ^ operand) % width, False
    if how == "rotate_up":
        return (idx - operand) % width, False
    if how == "rotate_down":
        return (idx + operand) % width, False
    vec, i = idx // modulo * modulo, idx % modulo
    j = i - operand if how == "fill_up" else i + operand
    if 0 <= j < modulo:
        return vec + j, False
    return vec + (j + modulo if how == "fill_up" else j - modulo), True


def moved(values, fills, operands, how: str, width: int, modulo: int) -> np.ndarray:
    out = values.copy()
    for lanes, active in lane_groups(width):
        for k, lane in enumerate(lanes):
            if not active[k]:
                continue
            src, filling = shifted_source(how, k, int(operands[lane]), width, modulo)
            if src is None or src >= len(lanes) or not active[src]:
                continue  # the caller keeps its own value
            out[lane] = (fills if filling else values)[lanes[src]]
    return out


# --- one kernel, many functions ------------------------------------------------------------


@dataclass(frozen=True)
class MslType:
    name: str
    numpy: type
    lanes: int

    @property
    def element(self) -> str:
        return self.name.rstrip("234")

    @property
    def is_float(self) -> bool:
        return self.element in ("float", "half", "bfloat")


T = {
    name: MslType(name, dtype, lanes)
    for name, dtype, lanes in [
        ("float", np.float32, 1), ("half", np.float16, 1), ("int", np.int32, 1),
        ("uint", np.uint32, 1), ("short", np.int16, 1), ("ushort", np.uint16, 1),
        ("char", np.int8, 1), ("uchar", np.uint8, 1), ("float4", np.float32, 4),
        ("half2", np.float16, 2), ("int3", np.int32, 3), ("ushort4", np.uint16, 4),
        ("uchar2", np.uint8, 2), ("long", np.int64, 1), ("ulong", np.uint64, 1),
        ("bool", np.bool_, 1),
    ]
}


class Batch:
    """Generates one kernel that applies many SIMD-group functions to per-lane inputs and
    stores each result component in its own slot of a float or an int64 output."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.expected: dict[str, list] = {"f": [], "i": []}

    def value(self, t: MslType, source: str) -> str:
        comps = [f"{t.element}({source}[{c} * {N} + i])" for c in range(t.lanes)]
        return comps[0] if t.lanes == 1 else f"{t.name}({', '.join(comps)})"

    def add(self, call: str, t: MslType, expected: list[np.ndarray], label: str) -> None:
        out = "f" if t.is_float else "i"
        slot = len(self.expected[out])
        stores = [
            f"{out}o[{slot + c} * {N} + i] = "
            f"{'float' if out == 'f' else 'long'}(r{'' if t.lanes == 1 else f'[{c}]'});"
            for c in range(t.lanes)
        ]
        self.lines.append(f"  {{ auto r = {call}; {' '.join(stores)} }}  // {label}")
        for c, values in enumerate(expected):
            self.expected[out].append((f"{label}[{c}]", values))

    def body(self) -> str:
        return "  uint i = thread_position_in_grid.x;\n  if (gone[i]) return;\n" + "\n".join(
            self.lines
        )

    def check(self, fo: np.ndarray, io: np.ndarray) -> None:
        for out, results in (("f", fo), ("i", io)):
            got = results.reshape(-1, N)
            for slot, (label, want) in enumerate(self.expected[out]):
                a, b = got[slot][ACTIVE], np.asarray(want)[ACTIVE]
                if out == "f":
                    same = a.astype(np.float32).view(np.uint32) == b.astype(np.float32).view(
                        np.uint32
                    )
                else:
                    same = a == b.astype(np.int64)
                assert same.all(), f"{label}: lanes {np.flatnonzero(ACTIVE)[~same]}"


def per_lane_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rows of per-lane values: floats of mixed magnitudes (so the order of a sum shows in
    its bits), floats near 1 for products, integers, and small integers for products."""
    scale = 10.0 ** rng.integers(-3, 4, size=(4, N))
    return {
        "xf": (rng.standard_normal((4, N)) * scale).astype(np.float32),
        "xp": (1 + 0.05 * rng.standard_normal((4, N))).astype(np.float32),
        "xi": rng.integers(-200, 200, size=(4, N)).astype(np.int32),
        "xs": rng.integers(-3, 4, size=(4, N)).astype(np.int32),
    }


def rows(t: MslType, data: np.ndarray) -> list[np.ndarray]:
    """The per-lane values of each component, converted as the kernel converts them."""
    if t.element == "half":  # the kernel rounds float to half directly
        return [data[c].astype(np.float16) for c in range(t.lanes)]
    return [data[c].astype(t.numpy) for c in range(t.lanes)]


REDUCTIONS = {
    "sum": (np.add, 0, "xf", "xi"),
    "product": (np.multiply, 1, "xp", "xs"),
    "min": (np.minimum, None, "xf", "xi"),
    "max": (np.maximum, None, "xf", "xi"),
    "and": (np.bitwise_and, None, None, "xi"),
    "or": (np.bitwise_or, None, None, "xi"),
    "xor": (np.bitwise_xor, None, None, "xi"),
}
ARITHMETIC_TYPES = ["float", "half", "int", "uint", "short", "ushort", "char", "uchar",
                    "float4", "half2", "int3", "ushort4"]
INTEGER_TYPES = ["int", "uint", "short", "ushort", "char", "uchar", "int3", "ushort4"]


def reductions_batch(data: dict[str, np.ndarray]) -> Batch:
    batch = Batch()
    for scope, width in (("simd", 32), ("quad", 4)):
        for op_name, (op, identity, float_src, int_src) in REDUCTIONS.items():
            types = ARITHMETIC_TYPES if float_src else INTEGER_TYPES
            for name in types:
                t = T[name]
                src = float_src if t.is_float else int_src
                values = rows(t, data[src])
                want = [per_group(v, width, lambda g, a, op=op, w=width: butterfly(g, a, op, w))
                        for v in values]
                call = f"{scope}_{op_name}({batch.value(t, src)})"
                batch.add(call, t, want, call)
                if identity is None:
                    continue
                for inclusive in (True, False):
                    kind = "inclusive" if inclusive else "exclusive"
                    want = [
                        per_group(v, width, lambda g, a, op=op, inc=inclusive, e=identity:
                                  log_step_scan(g, a, op, e, inc))
                        for v in values
                    ]
                    call = f"{scope}_prefix_{kind}_{op_name}({batch.value(t, src)})"
                    batch.add(call, t, want, call)
    return batch


@pytest.fixture(scope="module")
def reduction_run():
    data = per_lane_inputs(np.random.default_rng(7))
    batch = reductions_batch(data)
    kernel = sim_kernel("simd_reductions", ["gone", *data], ["fo", "io"], batch.body())
    fo, io = launch(
        kernel, [mx.array(GONE), *(mx.array(v) for v in data.values())],
        [(len(batch.expected["f"]) * N, mx.float32), (len(batch.expected["i"]) * N, mx.int64)],
    )
    return batch, fo, io, data


def test_reductions_and_scans_over_active_lanes_for_every_type(reduction_run):
    batch, fo, io, _ = reduction_run
    batch.check(fo, io)


def test_float_scans_agree_with_sequential_prefix_sums(reduction_run):
    """The log-step order is a choice; its values still are prefix sums of the active
    lanes (to rounding), and the first active lane of an exclusive scan gets 0."""
    batch, fo, _, data = reduction_run
    got = fo.reshape(-1, N)
    labels = [label for label, _ in batch.expected["f"]]
    for inclusive in (True, False):
        kind = "inclusive" if inclusive else "exclusive"
        slot = labels.index(f"simd_prefix_{kind}_sum(float(xf[0 * {N} + i]))[0]")
        want = per_group(data["xf"][0].astype(np.float64), 32,
                         lambda g, a, inc=inclusive: sequential_scan(g, a, np.add, 0.0, inc))
        scale = np.abs(data["xf"][0]).astype(np.float64).sum()
        np.testing.assert_allclose(got[slot][ACTIVE], want[ACTIVE], rtol=0, atol=1e-5 * scale)
        if not inclusive:
            firsts = [lanes[active][0] for lanes, active in lane_groups(32)]
            assert (got[slot][firsts] == 0).all()


# --- simd_sum is the xor butterfly, bitwise ------------------------------------------------

BUTTERFLY_SUM = "  out[i] = simd_sum(x[i]);"
SPELLED_OUT = """
  float v = x[i];
  v += simd_shuffle_xor(v, 1);
  v += simd_shuffle_xor(v, 2);
  v += simd_shuffle_xor(v, 4);
  v += simd_shuffle_xor(v, 8);
  v += simd_shuffle_xor(v, 16);
  out[i] = v;
"""


def test_simd_sum_is_bitwise_the_shuffle_xor_butterfly():
    """mlx-lm's packed gated-delta kernel relies on this: two kernels, one calling
    simd_sum and one spelling out the butterfly, give the same bits, while summing the
    same values in lane order gives other bits."""
    rng = np.random.default_rng(3)
    groups = 64
    x = (rng.standard_normal(32 * groups) * 10.0 ** rng.integers(-4, 5, 32 * groups))
    x = x.astype(np.float32)
    results = []
    for name, body in (("sum_builtin", BUTTERFLY_SUM), ("sum_xtree", SPELLED_OUT)):
        kernel = sim_kernel(name, ["x"], ["out"], "  uint i = thread_position_in_grid.x;\n" + body)
        (out,) = launch(kernel, [mx.array(x)], [(x.size, mx.float32)], grid=x.size, tg=256)
        results.append(out)
    builtin, xtree = results
    assert np.array_equal(builtin.view(np.uint32), xtree.view(np.uint32))

    lanes = x.reshape(groups, 32)
    everyone = np.ones(32, dtype=bool)
    oracle = np.stack([butterfly(g, everyone, np.add, 32) for g in lanes])
    assert np.array_equal(builtin.reshape(groups, 32).view(np.uint32), oracle.view(np.uint32))
    sequential = np.array([np.cumsum(g, dtype=np.float32)[-1] for g in lanes])
    differs = sequential.view(np.uint32) != oracle[:, 0].view(np.uint32)
    assert differs.sum() >= groups // 4, "the data must tell the two orders apart"


# --- data movement -------------------------------------------------------------------------


SIMD_MOVES = {  # call template, oracle kind, operand per lane, modulo
    "simd_shuffle({v}, ushort(lane_arg[i]))": ("shuffle", "lane_arg", 32),
    "simd_shuffle_up({v}, 3)": ("up", 3, 32),
    "simd_shuffle_down({v}, 5)": ("down", 5, 32),
    "simd_shuffle_xor({v}, 6)": ("xor", 6, 32),
    "simd_shuffle_rotate_up({v}, 7)": ("rotate_up", 7, 32),
    "simd_shuffle_rotate_down({v}, 30)": ("rotate_down", 30, 32),
    "simd_shuffle_and_fill_up({v}, {f}, 3)": ("fill_up", 3, 32),
    "simd_shuffle_and_fill_down({v}, {f}, 5)": ("fill_down", 5, 32),
    "simd_shuffle_and_fill_up({v}, {f}, 2, 8)": ("fill_up", 2, 8),
    "simd_shuffle_and_fill_down({v}, {f}, 3, 4)": ("fill_down", 3, 4),
    "simd_broadcast({v}, 9)": ("shuffle", 9, 32),
}
QUAD_MOVES = {
    "quad_shuffle({v}, ushort(lane_arg[i] % 4))": ("shuffle", "lane_arg4", 4),
    "quad_shuffle_up({v}, 1)": ("up", 1, 4),
    "quad_shuffle_down({v}, 2)": ("down", 2, 4),
    "quad_shuffle_xor({v}, 3)": ("xor", 3, 4),
    "quad_shuffle_rotate_up({v}, 1)": ("rotate_up", 1, 4),
    "quad_shuffle_rotate_down({v}, 3)": ("rotate_down", 3, 4),
    "quad_shuffle_and_fill_up({v}, {f}, 1)": ("fill_up", 1, 4),
    "quad_shuffle_and_fill_down({v}, {f}, 1, 2)": ("fill_down", 1, 2),
    "quad_broadcast({v}, 2)": ("shuffle", 2, 4),
}
# MLX's utils.h adds these 64-bit and bool overloads (through uint2 and uint).
MLX_WIDE_MOVES = [
    "simd_shuffle({v}, ushort(lane_arg[i]))",
    "simd_shuffle_up({v}, 3)",
    "simd_shuffle_down({v}, 5)",
    "simd_shuffle_and_fill_up({v}, {f}, 3)",
]
MOVE_TYPES = ["float", "half", "int", "ushort", "uchar", "float4", "int3", "half2"]


def moves_batch(data: dict[str, np.ndarray], lane_arg: np.ndarray) -> Batch:
    batch = Batch()

    def add(template: str, t: MslType, oracle: tuple, width: int, vsrc: str, fsrc: str):
        how, operand, modulo = oracle
        operands = {"lane_arg": lane_arg, "lane_arg4": lane_arg % 4}.get(
            operand, np.full(N, operand)
        )
        values, fills = rows(t, data[vsrc]), rows(t, data[fsrc])
        want = [moved(v, f, operands, how, width, modulo) for v, f in zip(values, fills)]
        call = template.format(v=batch.value(t, vsrc), f=batch.value(t, fsrc))
        batch.add(call, t, want, call)

    for moves, width in ((SIMD_MOVES, 32), (QUAD_MOVES, 4)):
        for template, oracle in moves.items():
            for name in MOVE_TYPES:
                t = T[name]
                add(template, t, oracle, width, *(("xf", "xp") if t.is_float else ("xi", "xs")))
    for template in MLX_WIDE_MOVES:
        for name in ("long", "ulong", "bool"):
            add(template, T[name], SIMD_MOVES[template], 32, "xl", "xs")
    return batch


def test_shuffles_broadcasts_and_fills_for_every_type():
    rng = np.random.default_rng(11)
    data = per_lane_inputs(rng)
    data["xl"] = rng.integers(-(2**62), 2**62, size=(4, N), dtype=np.int64)
    lane_arg = rng.integers(0, 32, size=N).astype(np.int32)
    batch = moves_batch(data, lane_arg)
    inputs = {"gone": GONE, "lane_arg": lane_arg, **data}
    kernel = sim_kernel("simd_moves", list(inputs), ["fo", "io"], batch.body())
    fo, io = launch(
        kernel, [mx.array(v) for v in inputs.values()],
        [(len(batch.expected["f"]) * N, mx.float32), (len(batch.expected["i"]) * N, mx.int64)],
    )
    batch.check(fo, io)


# --- votes, first lanes and barriers -------------------------------------------------------

VOTES = """
  uint i = thread_position_in_grid.x;
  if (gone[i]) return;
  bool p = x[i] > 0;
  simdgroup_barrier(mem_flags::mem_none);
  ulong b = ulong(simd_ballot(p));
  out[0 * N + i] = long(b);
  out[1 * N + i] = long(ulong(simd_active_threads_mask()));
  out[2 * N + i] = simd_all(p);
  out[3 * N + i] = simd_any(p);
  out[4 * N + i] = simd_is_first();
  out[5 * N + i] = long(simd_broadcast_first(x[i]));
  out[6 * N + i] = long(ushort(quad_ballot(p)));
  out[7 * N + i] = long(ushort(quad_active_threads_mask()));
  out[8 * N + i] = quad_all(p);
  out[9 * N + i] = quad_any(p);
  out[10 * N + i] = quad_is_first();
  out[11 * N + i] = long(quad_broadcast_first(x[i]));
  out[12 * N + i] = simd_ballot(p).all() + 2 * simd_ballot(p).any();
  out[13 * N + i] = simd_active_threads_mask().all();
  out[14 * N + i] = simd_all(true) + 2 * simd_any(false);
"""


def vote_oracle(x: np.ndarray) -> np.ndarray:
    pred = x > 0
    want = np.zeros((15, N), dtype=np.int64)
    for width, base_row in ((32, 0), (4, 6)):
        for lanes, active in lane_groups(width):
            votes = pred[lanes] & active
            ballot = sum(1 << k for k in np.flatnonzero(votes))
            live = sum(1 << k for k in np.flatnonzero(active))
            first = lanes[active][0] if active.any() else None
            want[base_row + 0, lanes] = ballot
            want[base_row + 1, lanes] = live
            want[base_row + 2, lanes] = votes[active].all()
            want[base_row + 3, lanes] = votes.any()
            want[base_row + 4, lanes] = lanes == first
            want[base_row + 5, lanes] = x[first] if first is not None else 0
            if width == 32:
                want[12, lanes] = (ballot == 0xFFFFFFFF) + 2 * (ballot != 0)
                want[13, lanes] = live == 0xFFFFFFFF
                want[14, lanes] = 1
    return want


def test_votes_first_lanes_and_simdgroup_barrier():
    rng = np.random.default_rng(5)
    x = rng.integers(-50, 50, size=N).astype(np.int32)
    x[:64] = np.abs(x[:64]) + 1  # every active lane of the first two SIMD-groups votes yes
    header = f"constant uint N = {N};\n"
    kernel = sim_kernel("simd_votes", ["gone", "x"], ["out"], VOTES, header=header)
    (out,) = launch(kernel, [mx.array(GONE), mx.array(x)], [(15 * N, mx.int64)])
    got, want = out.reshape(15, N), vote_oracle(x)
    for row in range(15):
        bad = np.flatnonzero(ACTIVE & (got[row] != want[row]))
        assert bad.size == 0, f"row {row}: lanes {bad}: {got[row][bad]} != {want[row][bad]}"


# --- divergence ----------------------------------------------------------------------------

BRANCHES = """
  uint i = thread_position_in_grid.x;
  uint lane = thread_index_in_simdgroup;
  int v = x[i];
  if (lane < 12) {
    halves[i] = simd_sum(v);
  } else {
    halves[i] = 1000 * simd_sum(v);
  }
  joined[i] = simd_sum(1);
"""
LOOP = """
  uint i = thread_position_in_grid.x;
  uint lane = thread_index_in_simdgroup;
  int v = x[i];
  // Lane l runs l % 5 + 1 iterations: iteration k has the lanes with more than k left.
  int acc = 0;
  for (uint k = 0; k <= lane % 5; ++k) {
    acc += simd_sum(v + int(k));
  }
  loop[i] = acc;
  after[i] = simd_sum(1);
"""
DIVERGENT_X = np.random.default_rng(9).integers(-100, 100, size=64).astype(np.int32)


def test_divergent_branches_each_reduce_their_own_lanes_then_rejoin():
    """An if/else whose branches both call simd_sum: each reduces over its own lanes, and
    the simd_sum after the if/else has all 32 lanes again."""
    kernel = sim_kernel("simd_branches", ["x"], ["halves", "joined"], BRANCHES)
    halves, joined = launch(kernel, [mx.array(DIVERGENT_X)], [(64, mx.int32)] * 2,
                            grid=64, tg=64)
    lane = np.arange(64) % 32
    groups = DIVERGENT_X.reshape(2, 32)
    low, high = groups[:, :12].sum(1), groups[:, 12:].sum(1)
    want_halves = np.where(lane < 12, np.repeat(low, 32), 1000 * np.repeat(high, 32))
    np.testing.assert_array_equal(halves, want_halves)
    np.testing.assert_array_equal(joined, np.full(64, 32))


def test_loop_with_lane_dependent_trip_count_reduces_over_the_lanes_still_inside():
    """Iteration k of the loop reduces over the lanes with more than k iterations; after
    the loop all 32 lanes are back together."""
    x = DIVERGENT_X
    kernel = sim_kernel("simd_loop", ["x"], ["loop", "after"], LOOP)
    loop, after = launch(kernel, [mx.array(x)], [(64, mx.int32)] * 2, grid=64, tg=64)
    trips = np.arange(64) % 32 % 5 + 1
    want_loop = np.zeros(64, dtype=np.int64)
    for k in range(5):
        for g in range(2):
            lanes = np.arange(32 * g, 32 * g + 32)
            inside = lanes[trips[lanes] > k]
            want_loop[inside] += (x[inside] + k).sum()
    np.testing.assert_array_equal(loop, want_loop)
    np.testing.assert_array_equal(after, np.full(64, 32))


# --- types Metal does not take -------------------------------------------------------------


def test_types_metal_rejects_do_not_compile():
    """Metal's simd_sum takes 32-bit or narrower elements (64-bit shuffles exist only
    through MLX's overloads) and simd_and takes integers."""
    body = """
  uint i = thread_position_in_grid.x;
  out[i] = float(simd_sum(long2(i, i)).x);
  out[i] += simd_and(float(i));
"""
    kernel = sim_kernel("simd_rejects", ["x"], ["out"], body)
    with pytest.raises(CompileError) as info:
        launch(kernel, [mx.zeros(32)], [(32, mx.float32)], grid=32, tg=32)
    message = str(info.value)
    assert "simd_sum" in message and "simd_and" in message


def test_bfloat_goes_through_mlx_overloads():
    """MLX's bf16_math.h gives bfloat simd functions: reductions in float, shuffles on the
    bits."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(64).astype(np.float32)
    xb = mx.array(x).astype(mx.bfloat16)
    body = """
  uint i = thread_position_in_grid.x;
  bfloat16_t v = x[i];
  s[i] = simd_sum(v);
  m[i] = simd_max(v);
  d[i] = simd_shuffle_down(v, 1);
  f[i] = simd_shuffle_and_fill_up(v, bfloat16_t(7.0f), 2, 8);
"""
    kernel = sim_kernel("simd_bfloat", ["x"], ["s", "m", "d", "f"], body)
    outs = kernel(inputs=[xb], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                  output_shapes=[(64,)] * 4, output_dtypes=[mx.bfloat16] * 4)
    s, m, d, f = (np.array(o.astype(mx.float32)) for o in outs)
    vals = np.array(xb.astype(mx.float32)).reshape(2, 32)
    everyone = np.ones(32, dtype=bool)
    sums = np.stack([butterfly(g, everyone, np.add, 32) for g in vals])
    want_s = np.array(mx.array(sums.ravel()).astype(mx.bfloat16).astype(mx.float32))
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_array_equal(m, np.repeat(vals.max(1), 32))
    lane = np.arange(64) % 32
    flat = vals.ravel()
    np.testing.assert_array_equal(d, np.where(lane < 31, np.roll(flat, -1), flat))
    idx = lane % 8
    np.testing.assert_array_equal(f, np.where(idx >= 2, np.roll(flat, 2), 7.0))
