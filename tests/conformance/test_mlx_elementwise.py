"""MLX's elementwise kernels (unary.h, binary.h, binary_two.h, ternary.h, copy.h) on `sim`,
against the same `mx.*` operation on the CPU.

The kernel names and template arguments are those of MLX's unary.metal, binary.metal,
binary_two.metal, ternary.metal and copy.metal (`instantiate_kernel("v_" #op ..., unary_v,
in_type, out_type, op, 1)` and so on); the geometry is that of unary.cpp, binary.cpp,
ternary.cpp and copy.cpp: contiguous kernels take one thread per element (or per
`WorkPerThread` elements), general ones a grid of (last dim / work per thread, second to
last, rest) in `get_block_dims` threadgroups of up to 1024 threads.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, block_dims, build, metal_library, name, rng, strided_view

UNARY = ("utils.h", "unary_ops.h", "unary.h")
BINARY = ("defines.h", "utils.h", "binary_ops.h", "binary.h")

# (op, dtype, mx function, bitwise): correctly rounded operations agree bit for bit;
# transcendental ones are Metal's own approximations, within a few ULPs.
UNARY_CASES = [
    ("Abs", mx.float32, mx.abs, True),
    ("Negative", mx.int32, mx.negative, True),
    ("Sqrt", mx.float32, mx.sqrt, True),
    ("Floor", mx.float16, mx.floor, True),
    ("Exp", mx.float32, mx.exp, False),
    ("Tanh", mx.float16, mx.tanh, False),
    ("Sigmoid", mx.bfloat16, mx.sigmoid, False),
    ("Erf", mx.float32, mx.erf, False),
    ("LogicalNot", mx.bool_, mx.logical_not, True),
]


def _values(dtype: mx.Dtype, shape: tuple[int, ...]) -> mx.array:
    g = rng()
    if dtype == mx.bool_:
        return mx.array(g.random(shape) < 0.5)
    if dtype in (mx.int32, mx.uint32):
        return mx.array(g.integers(-1000 if dtype == mx.int32 else 0, 1000, shape), dtype)
    return mx.array(g.standard_normal(shape) * 2).astype(dtype)


def _positive(op: str, x: mx.array) -> mx.array:
    return mx.abs(x) if op == "Sqrt" else x


@pytest.mark.parametrize(("op", "dtype", "fn", "bitwise"), UNARY_CASES,
                         ids=[c[0] for c in UNARY_CASES])
def test_unary_contiguous(agreement, op, dtype, fn, bitwise) -> None:
    # unary.cpp: a contiguous input of fewer than 2**16 elements runs unary_v with one
    # element per thread ("v_"), threadgroups of the pipeline's 1024 threads at most.
    x = _positive(op, _values(dtype, (1000,)))
    built = build(metal_library(*UNARY), "unary_v", (dtype, dtype, op, 1))
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer(x.shape, dtype),
                                          "size": x.size},
                   grid=(x.size,), threads_per_threadgroup=(1000,))
    agreement(f"unary_v {op}<{name(dtype)}>", MLX, out.mx("out"), fn(x),
              reference=f"mx.{fn.__name__} (CPU)", compile_s=built.compile_s,
              bitwise=bitwise, **({} if bitwise else {"atol": 0}))


def test_unary_work_per_thread(agreement) -> None:
    # From 2**16 elements on, "vn_" (WorkPerThread<T>::n = 8 / sizeof(T) elements a
    # thread, the default template argument), the last thread's tail cut at `size`.
    dtype, n = mx.float16, 4 * (1 << 16) + 3
    x = _values(dtype, (n,))
    built = build(metal_library(*UNARY), "unary_v", (dtype, dtype, "Exp"))
    threads = -(-n // 4)
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer(x.shape, dtype),
                                          "size": n},
                   grid=(threads,), threads_per_threadgroup=(1024,))
    agreement("unary_v Exp<float16> (4 a thread)", MLX, out.mx("out"), mx.exp(x),
              reference="mx.exp (CPU)", compile_s=built.compile_s)


def test_unary_general(agreement) -> None:
    # A transposed input: "gn1_" (unary_g, N = 1, IdxT = int) over shape and strides.
    base = np.asarray(_values(mx.float32, (6, 5, 7)))
    shape, strides = strided_view(base, (2, 0, 1))
    built = build(metal_library(*UNARY), "unary_g", (mx.float32, mx.float32, "Sin", 1, "int"))
    d0, d1, rest = int(shape[-1]), int(shape[-2]), int(np.prod(shape[:-2]))
    out = run_both(built.kernel,
                   buffers={"in": base, "out": new_buffer(tuple(shape), mx.float32),
                            "in_shape": shape, "in_strides": strides, "ndim": 3},
                   grid=(d0, d1, rest), threads_per_threadgroup=block_dims(d0, d1, rest))
    expected = mx.sin(mx.array(base).transpose(2, 0, 1))
    agreement("unary_g Sin<float32> (transposed)", MLX, out.mx("out"), expected,
              reference="mx.sin (CPU)", compile_s=built.compile_s)


# (kernel, op, dtype, mx function): binary.metal's "vv_", "sv_", "vs_", "ss_" with N = 1.
BINARY_CONTIGUOUS = [
    ("binary_vv", "Add", mx.float32, mx.add),
    ("binary_vv", "Multiply", mx.bfloat16, mx.multiply),
    ("binary_sv", "Subtract", mx.float16, mx.subtract),
    ("binary_vs", "Divide", mx.float32, mx.divide),
    ("binary_vv", "Maximum", mx.int32, mx.maximum),
    ("binary_vv", "Less", mx.float32, mx.less),
    ("binary_ss", "Power", mx.float32, mx.power),
]


@pytest.mark.parametrize(("kernel", "op", "dtype", "fn"), BINARY_CONTIGUOUS,
                         ids=[f"{c[0]}-{c[1]}" for c in BINARY_CONTIGUOUS])
def test_binary_contiguous(agreement, kernel, op, dtype, fn) -> None:
    n = 777
    a = _values(dtype, (1,) if kernel in ("binary_sv", "binary_ss") else (n,))
    b = _values(dtype, (1,) if kernel in ("binary_vs", "binary_ss") else (n,))
    if op == "Power":
        a = mx.abs(a) + 0.5
    out_dtype = mx.bool_ if op == "Less" else dtype
    size = max(a.size, b.size)
    template = (dtype, out_dtype, op) + (() if kernel == "binary_ss" else (1,))
    built = build(metal_library(*BINARY), kernel, template)
    buffers = {"a": a, "b": b, "c": new_buffer((size,), out_dtype)}
    if kernel != "binary_ss":
        buffers["size"] = size
    out = run_both(built.kernel, buffers=buffers, grid=(size,),
                   threads_per_threadgroup=(min(size, 1024),))
    # +, -, *, /, max and comparisons round once: bitwise; pow is Metal's own.
    bitwise = op != "Power"
    agreement(f"{kernel} {op}<{name(dtype)}>", MLX, out.mx("c"), fn(a, b),
              reference=f"mx.{fn.__name__} (CPU)", compile_s=built.compile_s,
              bitwise=bitwise)


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_binary_general(agreement, ndim) -> None:
    # binary.cpp: "g<ndim>_" up to 3 dimensions (the grid is the shape), "gn2_" beyond
    # (binary_g, two elements a thread, shape and ndim passed); b broadcasts a row.
    shape = (5, 3, 4, 9)[-ndim:]
    base = np.asarray(_values(mx.float32, shape[::-1]))
    _, a_strides = strided_view(base, tuple(range(ndim))[::-1])
    row = np.asarray(_values(mx.float32, (shape[-1],)))
    b_strides = np.zeros(ndim, np.int64)
    b_strides[-1] = 1
    if ndim <= 3:
        function, template = f"binary_g_nd{ndim}", (mx.float32, mx.float32, "Add", "int")
    else:
        function, template = "binary_g", (mx.float32, mx.float32, "Add", 2, "int")
    built = build(metal_library(*BINARY), function, template)
    buffers = {"a": base, "b": row, "c": new_buffer(shape, mx.float32)}
    if ndim == 1:
        buffers |= {"a_stride": int(a_strides[0]), "b_stride": int(b_strides[0])}
    else:
        buffers |= {"a_strides": a_strides, "b_strides": b_strides}
    d0 = shape[-1]
    d1 = shape[-2] if ndim > 1 else 1
    rest = int(np.prod(shape)) // (d0 * d1)
    if ndim > 3:
        buffers |= {"shape": np.array(shape, np.int32), "ndim": ndim}
        d0 = -(-d0 // 2)
    grid = (d0, d1, rest)[: max(ndim, 1)] if ndim <= 3 else (d0, d1, rest)
    out = run_both(built.kernel, buffers=buffers, grid=grid,
                   threads_per_threadgroup=block_dims(d0, d1, rest)[: len(grid)])
    expected = mx.array(base).transpose(tuple(range(ndim))[::-1]) + mx.array(row)
    agreement(f"{function} Add<float32> ({ndim}-d, broadcast)", MLX, out.mx("c"), expected,
              reference="mx.add (CPU)", compile_s=built.compile_s, bitwise=True)


def test_binary_two_divmod(agreement) -> None:
    # binary_two.metal: DivMod writes the quotient and the remainder ("vv_DivMod").
    a = _values(mx.int32, (500,))
    b = mx.array(rng().integers(1, 50, (500,)), mx.int32) * mx.array(
        rng().choice([-1, 1], 500), mx.int32)
    built = build(metal_library("utils.h", "binary_ops.h", "binary_two.h"), "binary_vv",
                  (mx.int32, mx.int32, "DivMod", 1))
    out = run_both(built.kernel, buffers={"a": a, "b": b, "c": new_buffer((500,), mx.int32),
                                          "d": new_buffer((500,), mx.int32), "size": 500},
                   grid=(500,), threads_per_threadgroup=(500,))
    q, r = mx.divmod(a, b)
    agreement("binary_two vv DivMod<int32> quotient", MLX, out.mx("c"), q,
              reference="mx.divmod (CPU)", compile_s=built.compile_s)
    agreement("binary_two vv DivMod<int32> remainder", MLX, out.mx("d"), r,
              reference="mx.divmod (CPU)", compile_s=built.compile_s)


@pytest.mark.parametrize("kind", ["v", "g"])
def test_ternary_select(agreement, kind) -> None:
    # ternary.metal: Select as "v_" (ternary_v, one element a thread) and "g2_"
    # (ternary_g_nd2 over strides: here a condition broadcast along rows).
    shape = (6, 40)
    cond = mx.array(rng().random(shape[1] if kind == "g" else shape) < 0.5)
    a, b = _values(mx.float32, shape), _values(mx.float32, shape) + 10
    lib = metal_library("utils.h", "ternary_ops.h", "ternary.h")
    out_buffer = new_buffer(shape, mx.float32)
    if kind == "v":
        built = build(lib, "ternary_v", (mx.float32, "Select", False, False, 1))
        out = run_both(built.kernel, buffers={"a": cond, "b": a, "c": b, "d": out_buffer,
                                              "size": a.size},
                       grid=(a.size,), threads_per_threadgroup=(a.size,))
        expected = mx.where(cond, a, b)
    else:
        built = build(lib, "ternary_g_nd2", (mx.float32, "Select", "int"))
        out = run_both(built.kernel,
                       buffers={"a": cond, "b": a, "c": b, "d": out_buffer,
                                "a_strides": np.array([0, 1], np.int64),
                                "b_strides": np.array([shape[1], 1], np.int64),
                                "c_strides": np.array([shape[1], 1], np.int64)},
                       grid=(shape[1], shape[0]),
                       threads_per_threadgroup=block_dims(shape[1], shape[0], 1)[:2])
        expected = mx.where(cond[None, :], a, b)
    agreement(f"ternary_{kind} Select<float32>", MLX, out.mx("d"), expected,
              reference="mx.where (CPU)", compile_s=built.compile_s, bitwise=True)


@pytest.mark.parametrize(("function", "src", "dst"), [
    ("copy_v", mx.float32, mx.float16), ("copy_s", mx.int32, mx.float32),
    ("copy_g_nd2", mx.float16, mx.bfloat16), ("copy_g_nd3", mx.float16, mx.float16),
    ("copy_g", mx.float32, mx.int32), ("copy_gg_nd3", mx.float32, mx.float32),
])
def test_copy(agreement, function, src, dst) -> None:
    # copy.metal / copy.cpp: "v_" and "s_" for contiguous and scalar sources, "g<n>_"
    # for a strided source into a contiguous output, "gn2_" beyond 3 dimensions
    # (copy_g, two elements a thread), "gg<n>_" for a strided output too.
    lib = metal_library("utils.h", "copy.h")
    ndim = {"copy_g_nd2": 2, "copy_g_nd3": 3, "copy_gg_nd3": 3}.get(function, 4)
    shape = (3, 4, 5, 6)[-ndim:]
    base = np.asarray(_values(src, shape[::-1]))
    view_shape, strides = strided_view(base, tuple(range(ndim))[::-1])
    src_view = mx.array(base).transpose(tuple(range(ndim))[::-1])
    expected = src_view.astype(dst)
    template = (src, dst) + ({"copy_v": (1,), "copy_s": (1,), "copy_g": (2, "int")}
                             .get(function, ("int",)))
    built = build(lib, function, template)
    out_buf = new_buffer(shape, dst)
    d0, d1 = shape[-1], shape[-2]
    rest = int(np.prod(shape)) // (d0 * d1)
    if function in ("copy_v", "copy_s"):
        source = np.asarray(src_view).reshape(-1) if function == "copy_v" else base.reshape(-1)[:1]
        if function == "copy_s":
            expected = mx.full(shape, mx.array(source[0]), src).astype(dst)
        n = int(np.prod(shape))
        buffers = {"src": source, "dst": out_buf, "size": n}
        grid, tg = (n,), (1024,)
    elif function == "copy_gg_nd3":
        buffers = {"src": base, "dst": out_buf, "src_strides": strides,
                   "dst_strides": np.array([d1 * d0, d0, 1], np.int64)}
        grid, tg = (d0, d1, rest), block_dims(d0, d1, rest)
    else:
        buffers = {"src": base, "dst": out_buf, "src_strides": strides}
        if function == "copy_g":
            buffers |= {"src_shape": view_shape, "ndim": ndim}
            d0 = -(-d0 // 2)
        grid = (d0, d1, rest) if ndim > 2 else (d0, d1)
        tg = block_dims(d0, d1, rest)[: len(grid)]
    out = run_both(built.kernel, buffers=buffers, grid=grid, threads_per_threadgroup=tg)
    agreement(f"{function}<{name(src)}, {name(dst)}>", MLX, out.mx("dst"), expected,
              reference="astype (CPU)", compile_s=built.compile_s, bitwise=True)
