"""llama.cpp's unary.metal and binbcast.metal: elementwise ops and broadcast binary ops,
dispatched as ggml_metal_op_unary / ggml_metal_op_bin do, against numpy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import Tensor, decode, encoded

SLOW = pytest.mark.slow
REFERENCE = "numpy float64"
TOLERANCE = {"f32": {"atol": 1e-6, "rtol": 1e-5}, "f16": {"atol": 2e-3, "rtol": 2e-3}}

# ggml's constants in its unary ops (ggml-metal's common.h uses the same values).
SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)
GELU_COEF_A = 0.044715

UNARY = {
    "SILU": lambda x, a: x / (1 + np.exp(-x)),
    "GELU": lambda x, a: 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * x * (1 + GELU_COEF_A * x * x))),
    "SQR": lambda x, a: x * x,
    "TANH": lambda x, a: np.tanh(x),
    "SIGMOID": lambda x, a: 1 / (1 + np.exp(-x)),
    "SCALE": lambda x, a: a["scale"] * x + a["bias"],
    "CLAMP": lambda x, a: np.clip(x, a["min"], a["max"]),
    "NEG": lambda x, a: -x,
}
_PARAMS = {"SCALE": {"scale": 0.75, "bias": -0.25}, "CLAMP": {"min": -0.5, "max": 0.8}}


def _rng() -> np.random.Generator:
    return np.random.default_rng(11)


def _unary(x: Tensor, op: str) -> tuple[np.ndarray, list]:
    """kernel_unary_* as ggml_metal_op_unary dispatches it (ggml_metal_library_get_
    pipeline_unary: the _4 variant when ne00 % 4 == 0, the "cnt" grid of one thread per
    element for contiguous tensors under 32768 elements)."""
    ne = x.ne
    c4 = ne[0] % 4 == 0
    cnt = int(np.prod(ne)) < 32768
    name = f"kernel_unary_{x.gtype}_{x.gtype}{'_4' if c4 else ''}"
    b = built("unary.metal", name, {fc("FC_UNARY", 0): impl_define(f"OP_UNARY_NUM_{op}"),
                                    fc("FC_UNARY", 1): cnt})
    ne00 = ne[0] // 4 if c4 else ne[0]
    args = pack("ggml_metal_kargs_unary", x.locals("0"), x.locals(""), **_PARAMS.get(op, {}),
                ne00=ne00, ne0=ne00)
    if cnt:
        groups, threads = (int(np.prod(ne)) // (4 if c4 else 1), 1, 1), (1, 1, 1)
    else:
        nth = min(ne00, 256, MAX_THREADS)
        groups, threads = (-(-ne00 // nth) * ne[1], ne[2], ne[3]), (nth, 1, 1)
    out = run(b, {0: args, 1: x, 2: new(x.nbytes)}, groups, threads)
    return decode(out[2], x.gtype, x.values.shape), [b]


@pytest.mark.parametrize(("op", "gtype", "shape"), [
    ("SILU", "f32", (3, 5, 64)),
    pytest.param("GELU", "f32", (4, 8, 256), marks=SLOW),   # over 32768 elements: rows grid
    pytest.param("SQR", "f32", (7, 33), marks=SLOW),        # ne00 % 4 != 0: scalar kernel
    pytest.param("TANH", "f16", (6, 48), marks=SLOW),
    pytest.param("SIGMOID", "f32", (2, 40, 500), marks=SLOW),
    pytest.param("SCALE", "f16", (5, 31), marks=SLOW),
    pytest.param("CLAMP", "f32", (9, 20), marks=SLOW),
    pytest.param("NEG", "f32", (3, 4, 8), marks=SLOW),
])
def test_unary(agreement, op, gtype, shape) -> None:
    x = encoded(_rng().standard_normal(shape) * 2, gtype)
    actual, parts = _unary(x, op)
    expected = UNARY[op](x.values, _PARAMS.get(op, {}))
    check(agreement, parts, f"kernel_unary_{gtype} {op.lower()} {shape}", actual, expected,
          REFERENCE, **TOLERANCE[gtype])


BINARY = {0: np.add, 1: np.subtract, 2: np.multiply, 3: np.divide}


def _binary(a: Tensor, b: Tensor, op: int) -> tuple[np.ndarray, list]:
    """kernel_bin_fuse_* as ggml_metal_op_bin dispatches one op (no fusion): constants
    op, n_fuse = 1, rb (src1 one row, contiguous, under 65536 elements: a thread per
    element), cb (src1's rows shorter than src0's)."""
    c4 = a.ne[0] % 4 == 0 and b.ne[0] % 4 == 0
    cb = a.ne[0] != b.ne[0]
    rb = int(np.prod(b.ne[1:])) == 1 and int(np.prod(a.ne)) < 65536
    name = f"kernel_bin_fuse_{a.gtype}_{b.gtype}_{a.gtype}{'_4' if c4 else ''}"
    k = built("binbcast.metal", name, {fc("FC_BIN", 0): op, fc("FC_BIN", 1): 1,
                                       fc("FC_BIN", 2): rb, fc("FC_BIN", 3): cb})
    div = 4 if c4 else 1
    args = pack("ggml_metal_kargs_bin", a.locals("0"), b.locals("1"), a.locals(""),
                ne00=a.ne[0] // div, ne10=b.ne[0] // div, ne0=a.ne[0] // div, offs=0)
    if rb:
        groups, threads = (a.ne[0] // div, int(np.prod(a.ne[1:])), 1), (1, 1, 1)
    else:
        nth = 1
        while 2 * nth < a.ne[0] // div and nth < min(256, MAX_THREADS):
            nth *= 2
        groups, threads = (a.ne[1], a.ne[2], a.ne[3]), (nth, 1, 1)
    out = run(k, {0: args, 1: a, 2: b, 3: new(a.nbytes)}, groups, threads)
    return decode(out[3], a.gtype, a.values.shape), [k]


@pytest.mark.parametrize(("op", "gtype", "shape0", "shape1"), [
    (0, "f32", (2, 3, 6, 64), (1, 3, 1, 64)),                       # broadcast rows and dim 3
    pytest.param(2, "f32", (4, 7, 96), (96,), marks=SLOW),          # one row: rb
    pytest.param(1, "f16", (3, 5, 40), (3, 1, 8), marks=SLOW),      # shorter rows: cb
    pytest.param(3, "f32", (2, 9, 35), (1, 9, 35), marks=SLOW),     # ne00 % 4 != 0
    pytest.param(0, "f16", (2, 2, 70000), (1, 1, 70000), marks=SLOW),  # rows grid, 256 thr
])
def test_binary_broadcast(agreement, op, gtype, shape0, shape1) -> None:
    g = _rng()
    a = encoded(g.standard_normal(shape0), gtype)
    b = encoded(g.standard_normal(shape1) + (3.0 if op == 3 else 0.0), gtype)
    actual, parts = _binary(a, b, op)
    reps = [n // m for n, m in zip(a.values.shape, (1,) * (a.values.ndim - b.values.ndim)
                                   + b.values.shape)]
    expected = BINARY[op](a.values, np.tile(b.values, reps))
    name = ["add", "sub", "mul", "div"][op]
    check(agreement, parts, f"kernel_bin_fuse_{gtype} {name} {shape0} by {shape1}", actual,
          expected, REFERENCE, **TOLERANCE[gtype])
