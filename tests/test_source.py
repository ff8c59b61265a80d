"""Golden tests for the MLX-exact kernel source generator.

Expected texts come from MLX 0.32's generator (``mx.fast.metal_kernel`` with
``verbose=True``); they are written out in full so that any byte of difference fails.
When the installed MLX can trace a kernel call without Metal (``mx.export_function``),
``test_matches_installed_mlx`` also compares against MLX itself.
"""

from __future__ import annotations

import os
import tempfile

import mlx.core as mx
import numpy as np
import pytest

from mtwork.dtypes import (
    as_mx_array,
    itemsize,
    mx_dtype_from_numpy,
    storage_numpy_dtype,
    type_string,
)
from mtwork.msl.body import (
    GeneratedSource,
    InputInfo,
    Param,
    detect_attributes,
    detect_shape_helpers,
    generate,
    kernel_name,
    template_hash,
    template_text,
)
from mtwork.msl.checks import (
    check_call_sizes,
    check_gpu_dtypes,
    check_has_outputs,
    check_size,
    validate_compile_options,
    validate_template,
)

F32 = mx.float32

# Every MLX dtype with its Metal name, numpy storage and size (MLX's get_type_string).
DTYPES = [
    (mx.bool_, "bool", np.bool_, 1),
    (mx.uint8, "uint8_t", np.uint8, 1),
    (mx.uint16, "uint16_t", np.uint16, 2),
    (mx.uint32, "uint32_t", np.uint32, 4),
    (mx.uint64, "uint64_t", np.uint64, 8),
    (mx.int8, "int8_t", np.int8, 1),
    (mx.int16, "int16_t", np.int16, 2),
    (mx.int32, "int32_t", np.int32, 4),
    (mx.int64, "int64_t", np.int64, 8),
    (mx.float16, "float16_t", np.float16, 2),
    (mx.bfloat16, "bfloat16_t", np.uint16, 2),
    (mx.float32, "float", np.float32, 4),
    (mx.float64, "double", np.float64, 8),
    (mx.complex64, "complex64_t", np.complex64, 8),
]

# MLX's attribute table, in emission order, written out independently of the module.
ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]


def info(shape: tuple[int, ...], dtype: mx.Dtype = F32) -> InputInfo:
    size = 1
    for s in shape:
        size *= s
    return InputInfo(dtype, len(shape), size)


def signature_lines(text: str) -> list[str]:
    return text.split("(\n", 1)[1].split("\n")


# ---------------------------------------------------------------------------------------
# Goldens: MLX's documentation and its own test suite

MYEXP_BODY = (
    "\n"
    "        uint elem = thread_position_in_grid.x;\n"
    "        T tmp = inp[elem];\n"
    "        out[elem] = metal::exp(tmp);\n"
    "    "
)


def test_golden_docs_myexp() -> None:
    gen = generate(
        "myexp", ["inp"], ["out"], MYEXP_BODY,
        template=[("T", F32)], inputs=[info((4, 16), mx.float16)],
        output_dtypes=[mx.float16],
    )
    name = "custom_kernel_myexp__float_float16_t_float16_t"
    expected = (
        "template <typename T>\n"
        f"[[kernel]] void {name}(\n"
        "  const device float16_t* inp [[buffer(0)]],\n"
        "  device float16_t* out [[buffer(1)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        + MYEXP_BODY
        + "\n}\n"
        f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}<float>) {name}<float>;\n'
    )
    assert gen.text == expected
    assert gen.host_name == name
    assert gen.verbose_text() == f"Generated source code for `myexp`:\n```\n{expected}\n```\n"


ARGS_BODY = (
    "\n"
    "                uint elem = thread_position_in_grid.x;\n"
    "                T tmp = a[0];\n"
    "                if (e) {\n"
    "                    out1[elem] = a[1] + b[2] + c[3] + d + f;\n"
    "                } else {\n"
    "                    out1[elem] = 1;\n"
    "                }\n"
    "                out2[elem] = a[1] + b[2] + c[1] - d;\n"
    "            "
)


def test_golden_custom_kernel_args() -> None:
    gen = generate(
        "arg_test", ["a", "b", "c", "d"], ["out1", "out2"], ARGS_BODY,
        template=[("e", True), ("f", 3), ("T", mx.float16)],
        inputs=[mx.zeros((3, 6)), mx.array([3, 4, 5]), mx.zeros((2, 2), mx.bfloat16), 7.3],
        output_dtypes=[F32, mx.int32],
    )
    name = "custom_kernel_arg_test__1_3_float16_t_float_int32_tc_bfloat16_tc_floats_float_int32_t"
    expected = (
        "template <bool e, int f, typename T>\n"
        f"[[kernel]] void {name}(\n"
        "  const device float* a [[buffer(0)]],\n"
        "  const constant int32_t* b [[buffer(1)]],\n"
        "  const constant bfloat16_t* c [[buffer(2)]],\n"
        "  const constant float& d [[buffer(3)]],\n"
        "  device float* out1 [[buffer(4)]],\n"
        "  device int32_t* out2 [[buffer(5)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        + ARGS_BODY
        + "\n}\n"
        f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}<1, 3, float16_t>) '
        f"{name}<1, 3, float16_t>;\n"
    )
    assert gen.text == expected


STRIDES_BODY = (
    "\n"
    "                uint elem = thread_position_in_grid.x;\n"
    "                uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);\n"
    "                T tmp = inp[loc];\n"
    "                out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;\n"
    "            "
)
STRIDES_BODY_CONTIG = (
    "\n"
    "                uint elem = thread_position_in_grid.x;\n"
    "                T tmp = inp[elem];\n"
    "                out[elem] = metal::precise::exp(tmp) * threads_per_simdgroup;\n"
    "            "
)


@pytest.mark.parametrize("contig", [True, False])
def test_golden_custom_kernel_strides(contig: bool) -> None:
    body = STRIDES_BODY_CONTIG if contig else STRIDES_BODY
    gen = generate(
        f"myexp{contig}", ["inp"], ["out"], body,
        template=[("T", F32)], inputs=[info((8, 6))], output_dtypes=[F32],
    )
    name = f"custom_kernel_myexp{contig}__float_float_float"
    helpers = "" if contig else (
        "  const constant int* inp_shape [[buffer(1)]],\n"
        "  const constant int64_t* inp_strides [[buffer(2)]],\n"
        "  const constant int& inp_ndim [[buffer(3)]],\n"
    )
    out_index = 1 if contig else 4
    expected = (
        "template <typename T>\n"
        f"[[kernel]] void {name}(\n"
        "  const device float* inp [[buffer(0)]],\n"
        + helpers
        + f"  device float* out [[buffer({out_index})]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]],\n"
        "  uint threads_per_simdgroup [[threads_per_simdgroup]]) {\n"
        + body
        + "\n}\n"
        f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}<float>) {name}<float>;\n'
    )
    assert gen.text == expected


def test_golden_custom_kernel_basic() -> None:
    body = (
        "\n"
        "                uint elem = thread_position_in_grid.x;\n"
        "                out1[elem] = a[elem];\n"
        "            "
    )
    gen = generate("basic", ["a"], ["out1"], body, inputs=[info((2, 2))], output_dtypes=[F32])
    assert gen.text == (
        "[[kernel]] void custom_kernel_basic_floatc_float(\n"
        "  const constant float* a [[buffer(0)]],\n"
        "  device float* out1 [[buffer(1)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        + body
        + "\n}\n"
    )


def test_golden_custom_kernel_helper_header_is_pasted_verbatim() -> None:
    header = (
        "\n"
        "            template <typename T>\n"
        "            T do_exp(T x) {\n"
        "                return metal::precise::exp(x);\n"
        "            }\n"
        "            "
    )
    body = (
        "\n"
        "                uint elem = thread_position_in_grid.x;\n"
        "                out1[elem] = do_exp(a[elem]);\n"
        "            "
    )
    gen = generate(
        "helper", ["a"], ["out1"], body, header=header,
        inputs=[info((2, 2))], output_dtypes=[F32],
    )
    assert gen.text == (
        header
        + "[[kernel]] void custom_kernel_helper_floatc_float(\n"
        "  const constant float* a [[buffer(0)]],\n"
        "  device float* out1 [[buffer(1)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        + body
        + "\n}\n"
    )


def test_golden_custom_kernel_attributes() -> None:
    body = "out[0] = threads_per_threadgroup.x;"
    gen = generate(
        "test_fun", ["a"], ["out"], body, inputs=[info((1, 1))], output_dtypes=[mx.uint32]
    )
    assert gen.text == (
        "[[kernel]] void custom_kernel_test_fun_floatc_uint32_t(\n"
        "  const constant float* a [[buffer(0)]],\n"
        "  device uint32_t* out [[buffer(1)]],\n"
        "  uint3 threads_per_threadgroup [[threads_per_threadgroup]]) {\n"
        "out[0] = threads_per_threadgroup.x;\n"
        "}\n"
    )


# ---------------------------------------------------------------------------------------
# The separator bug: the end-of-list test ignores helper buffers


def test_golden_separator_bug() -> None:
    gen = generate(
        "bug", ["a"], ["o1", "o2"], "o1[0] = a_shape[0]; o2[0] = 1;",
        inputs=[info((8,))], output_dtypes=[F32, F32],
    )
    assert gen.text == (
        "[[kernel]] void custom_kernel_bug_float_float_float(\n"
        "  const device float* a [[buffer(0)]],\n"
        "  const constant int* a_shape [[buffer(1)]],\n"
        "  device float* o1 [[buffer(2)]]) {\n"
        "  device float* o2 [[buffer(3)]]) {\n"
        "o1[0] = a_shape[0]; o2[0] = 1;\n"
        "}\n"
    )


def test_separator_bug_closes_every_output_once_helpers_outnumber() -> None:
    # 2 helper buffers, 3 outputs: the last-buffer test fails for all three outputs.
    gen = generate(
        "b3", ["a", "b"], ["o1", "o2", "o3"], "a_shape b_ndim",
        inputs=[info((8,)), info((9,))], output_dtypes=[F32] * 3,
    )
    assert signature_lines(gen.text)[:7] == [
        "  const device float* a [[buffer(0)]],",
        "  const constant int* a_shape [[buffer(1)]],",
        "  const device float* b [[buffer(2)]],",
        "  const constant int& b_ndim [[buffer(3)]],",
        "  device float* o1 [[buffer(4)]]) {",
        "  device float* o2 [[buffer(5)]]) {",
        "  device float* o3 [[buffer(6)]]) {",
    ]


def test_separator_is_right_with_an_attribute() -> None:
    gen = generate(
        "ok", ["a"], ["o1", "o2"], "a_shape grid_origin",
        inputs=[info((8,))], output_dtypes=[F32, F32],
    )
    assert gen.text.count(") {") == 1
    assert signature_lines(gen.text)[2:5] == [
        "  device float* o1 [[buffer(2)]],",
        "  device float* o2 [[buffer(3)]],",
        "  uint3 grid_origin [[grid_origin]]) {",
    ]


@pytest.mark.parametrize(
    ("source", "outputs"),
    [("a_shape", ["o"]), ("", ["o1", "o2"]), ("", ["o1", "o2", "o3"])],
)
def test_separator_is_right_without_the_trigger(source: str, outputs: list[str]) -> None:
    gen = generate(
        "s", ["a"], outputs, source, inputs=[info((8,))], output_dtypes=[F32] * len(outputs)
    )
    assert gen.text.count(") {") == 1
    last = len(gen.params) - 1
    assert gen.text.endswith(f"* {outputs[-1]} [[buffer({last})]]) {{\n{source}\n}}\n")


# ---------------------------------------------------------------------------------------
# Address spaces, 0-d inputs and helper buffers


@pytest.mark.parametrize(
    ("shape", "space"),
    [((1,), "constant"), ((7,), "constant"), ((2, 2), "constant"), ((0,), "constant"),
     ((3, 0), "constant"), ((8,), "device"), ((2, 4), "device"), ((100,), "device")],
)
def test_small_inputs_are_in_constant_space(shape: tuple[int, ...], space: str) -> None:
    gen = generate("k", ["a"], ["o"], "", inputs=[info(shape)], output_dtypes=[F32])
    assert signature_lines(gen.text)[0] == f"  const {space} float* a [[buffer(0)]],"
    suffix = "c" if space == "constant" else ""
    assert gen.host_name == f"custom_kernel_k_float{suffix}_float"


def test_zero_d_input_is_a_constant_reference_without_helpers() -> None:
    body = "o[0] = s + s_shape[0] + s_strides[0] + s_ndim;"
    gen = generate(
        "z", ["s", "a"], ["o"], body + " a_ndim",
        inputs=[3, info((9,), mx.int64)], output_dtypes=[F32],
    )
    assert gen.text == (
        "[[kernel]] void custom_kernel_z_int32_ts_int64_t_float(\n"
        "  const constant int32_t& s [[buffer(0)]],\n"
        "  const device int64_t* a [[buffer(1)]],\n"
        "  const constant int& a_ndim [[buffer(2)]],\n"
        "  device float* o [[buffer(3)]]) {\n"
        f"{body} a_ndim\n"
        "}\n"
    )


def test_helpers_found_in_comments_and_inside_longer_names() -> None:
    # "max_shape" contains "x_shape"; a comment naming x_strides still counts.
    gen = generate(
        "h", ["x"], ["o"], "int max_shape = 0; // x_strides\n",
        inputs=[info((16,))], output_dtypes=[F32],
    )
    assert [(p.kind, p.name) for p in gen.params] == [
        ("input", "x"), ("shape", "x_shape"), ("strides", "x_strides"), ("output", "o"),
    ]


def test_header_is_not_searched() -> None:
    gen = generate(
        "h", ["x"], ["o"], "o[0] = 1;", header="// x_shape thread_position_in_grid\n",
        inputs=[info((16,))], output_dtypes=[F32],
    )
    assert [p.kind for p in gen.params] == ["input", "output"]


def test_helpers_are_emitted_shape_strides_ndim_and_interleaved() -> None:
    gen = generate(
        "i", ["a", "b"], ["o"], "b_ndim a_ndim b_strides a_shape b_shape",
        inputs=[info((8,)), info((2,), mx.uint8)], output_dtypes=[F32],
    )
    assert gen.params == [
        Param("input", "a", "float", 0, "device", False, 0, F32),
        Param("shape", "a_shape", "int", 1, "constant", False, 0),
        Param("ndim", "a_ndim", "int", 2, "constant", True, 0),
        Param("input", "b", "uint8_t", 3, "constant", False, 1, mx.uint8),
        Param("shape", "b_shape", "int", 4, "constant", False, 1),
        Param("strides", "b_strides", "int64_t", 5, "constant", False, 1),
        Param("ndim", "b_ndim", "int", 6, "constant", True, 1),
        Param("output", "o", "float", 7, "device", dtype=F32),
    ]


def test_detect_shape_helpers() -> None:
    assert detect_shape_helpers("a_shape[0] + b_ndim + ab_strides", ["a", "b", "c"]) == {
        "a": (True, False, False),
        "b": (False, True, True),  # "ab_strides" contains "b_strides"
        "c": (False, False, False),
    }
    assert detect_shape_helpers("a_shape", ["a"])["a"].shape is True


def test_atomic_outputs_make_every_output_atomic() -> None:
    gen = generate(
        "at", ["a"], ["g", "h"], "thread_position_in_grid", atomic_outputs=True,
        inputs=[info((64,))], output_dtypes=[F32, mx.int32],
    )
    assert signature_lines(gen.text)[1:3] == [
        "  device atomic<float>* g [[buffer(1)]],",
        "  device atomic<int32_t>* h [[buffer(2)]],",
    ]
    outs = gen.params_of("output")
    assert [(p.msl_type, p.atomic) for p in outs] == [("float", True), ("int32_t", True)]


def test_param_fields_for_attributes() -> None:
    gen = generate("p", [], ["o"], "grid_size threads_per_simdgroup", output_dtypes=[F32])
    assert gen.params_of("attribute") == [
        Param("attribute", "grid_size", "uint3", None, None),
        Param("attribute", "threads_per_simdgroup", "uint", None, None),
    ]
    assert gen.host_name == "custom_kernel_p_float"


# ---------------------------------------------------------------------------------------
# Thread attributes


@pytest.mark.parametrize(("attr", "msl_type"), ATTRIBUTES)
def test_each_attribute_type(attr: str, msl_type: str) -> None:
    found = detect_attributes(f"x = {attr};")
    # The attribute itself, plus any table entry that is a substring of its name.
    expected = [(a, t) for a, t in ATTRIBUTES if a in attr]
    assert (attr, msl_type) in found
    assert found == expected
    gen = generate("t", [], ["o"], f"x = {attr};", output_dtypes=[F32])
    attr_lines = signature_lines(gen.text)[1 : 1 + len(expected)]
    assert attr_lines == [
        f"  {t} {a} [[{a}]]" + ("," if k < len(expected) - 1 else ") {")
        for k, (a, t) in enumerate(expected)
    ]


def test_attributes_come_in_table_order_not_use_order() -> None:
    body = " ".join(a for a, _ in reversed(ATTRIBUTES))
    assert detect_attributes(body) == ATTRIBUTES


@pytest.mark.parametrize(
    ("used", "pulled_in"),
    [
        ("dispatch_threads_per_threadgroup", "threads_per_threadgroup"),
        ("dispatch_simdgroups_per_threadgroup", "simdgroups_per_threadgroup"),
        ("dispatch_quadgroups_per_threadgroup", "quadgroups_per_threadgroup"),
    ],
)
def test_attribute_substring_side_effects(used: str, pulled_in: str) -> None:
    assert [a for a, _ in detect_attributes(used)] == [used, pulled_in]


def test_attribute_detection_is_plain_substring() -> None:
    assert detect_attributes("float grid_size_x; // threads_per_grid") == [
        ("grid_size", "uint3"), ("threads_per_grid", "uint3"),
    ]
    assert detect_attributes("thread_position") == []


# ---------------------------------------------------------------------------------------
# Names and templates


@pytest.mark.parametrize(("dtype", "name", "np_dtype", "size"), DTYPES)
def test_dtype_names(dtype: mx.Dtype, name: str, np_dtype: type, size: int) -> None:
    assert type_string(dtype) == name
    assert storage_numpy_dtype(dtype) == np.dtype(np_dtype)
    assert itemsize(dtype) == size
    assert kernel_name("n", None, [info((8,), dtype), info((), dtype)], [dtype]) == (
        f"custom_kernel_n_{name}_{name}s_{name}"
    )


def test_type_string_refuses_non_dtypes() -> None:
    with pytest.raises(ValueError, match="'float32'"):
        type_string("float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int"):
        storage_numpy_dtype(int)  # type: ignore[arg-type]


def test_template_text_and_hash() -> None:
    targs = [("e", True), ("f", 3), ("T", mx.float16)]
    assert template_text(targs) == "<1, 3, float16_t>"
    assert template_hash("<1, 3, float16_t>") == "_1_3_float16_t"
    assert template_text([("b", False)]) == "<0>"
    assert template_text(None) == "" and template_text([]) == ""


def test_negative_template_ints_become_underscores_in_the_name() -> None:
    # MLX 0.32.4 maps '-' to '_' in the hash; the instantiation keeps the minus sign.
    gen = generate(
        "p", ["a"], ["o"], "", template=[("a", 1), ("b", -3), ("c", False), ("T", mx.bfloat16)],
        inputs=[info((1,))], output_dtypes=[F32],
    )
    name = "custom_kernel_p__1__3_0_bfloat16_t_floatc_float"
    assert gen.text == (
        "template <int a, int b, bool c, typename T>\n"
        f"[[kernel]] void {name}(\n"
        "  const constant float* a [[buffer(0)]],\n"
        "  device float* o [[buffer(1)]]) {\n"
        "\n}\n"
        f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}<1, -3, 0, bfloat16_t>) '
        f"{name}<1, -3, 0, bfloat16_t>;\n"
    )


def test_double_underscore_only_with_templates() -> None:
    ins = [info((8,))]
    assert kernel_name("k", [("T", F32)], ins, [F32]) == "custom_kernel_k__float_float_float"
    assert kernel_name("k", [], ins, [F32]) == "custom_kernel_k_float_float"
    assert kernel_name("k", [("N", 0)], [], [F32, mx.int8]) == "custom_kernel_k__0_float_int8_t"


def test_validate_template_classification() -> None:
    assert validate_template(None) == []
    got = validate_template([("b", True), ("i", 1), ("t", mx.uint64), ("z", 0), ("f", False)])
    assert got == [("b", True), ("i", 1), ("t", mx.uint64), ("z", 0), ("f", False)]
    # bool is checked before int, so True stays a bool and prints as 1.
    assert [type(v) for _, v in got] == [bool, int, mx.Dtype, int, bool]
    assert validate_template([("m", -(2**31)), ("n", 2**31 - 1)]) == [
        ("m", -(2**31)), ("n", 2**31 - 1),
    ]


@pytest.mark.parametrize(
    "value", [1.5, "float", None, np.int32(3), np.bool_(True), 2**31, -(2**31) - 1, [1]],
)
def test_invalid_template_values(value: object) -> None:
    msg = "[metal_kernel] Invalid template argument. Must be `mlx.core.Dtype`, `int` or `bool`."
    with pytest.raises(ValueError) as exc:
        validate_template([("T", mx.float32), ("Bad", value)])
    assert str(exc.value).startswith(msg + " ")
    assert "`Bad`" in str(exc.value)


def test_malformed_template_list() -> None:
    with pytest.raises(TypeError):
        validate_template({"T": mx.float32})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        validate_template([("T",)])
    with pytest.raises(TypeError):
        validate_template([(1, 2)])


# ---------------------------------------------------------------------------------------
# Inputs: MLX's scalar rules


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        (True, mx.bool_), (False, mx.bool_), (0, mx.int32), (2**31 - 1, mx.int32),
        (-(2**31), mx.int32), (2**31, mx.int64), (-(2**31) - 1, mx.int64),
        (2**63 - 1, mx.int64), (7.3, mx.float32), (1 + 2j, mx.complex64),
        (np.float64(2.0), mx.float32), (np.int64(3), mx.int64), (np.bool_(True), mx.bool_),
    ],
)
def test_scalar_inputs(value: object, dtype: mx.Dtype) -> None:
    arr = as_mx_array(value)
    assert arr.dtype == dtype and arr.ndim == 0
    # Compare at the array's own precision (7.3 is stored as float32).
    assert arr.item() == np.asarray(value).astype(storage_numpy_dtype(dtype)).item()


def test_large_python_int_names_an_int64_scalar() -> None:
    assert kernel_name("k", None, [2**40, 5], [F32]) == "custom_kernel_k_int64_ts_int32_ts_float"
    gen = generate("k", ["n"], ["o"], "", inputs=[-(2**40)], output_dtypes=[F32])
    assert signature_lines(gen.text)[0] == "  const constant int64_t& n [[buffer(0)]],"


def test_array_inputs() -> None:
    a = mx.zeros((2, 3), mx.bfloat16)
    assert as_mx_array(a) is a
    f64 = as_mx_array(np.zeros((4, 5)))
    assert (f64.dtype, f64.shape) == (mx.float32, (4, 5))
    assert as_mx_array(np.zeros(3, np.complex128)).dtype == mx.complex64
    assert InputInfo.of(np.zeros((2, 0), np.uint8)) == InputInfo(mx.uint8, 2, 0)
    assert InputInfo.of(7.3) == InputInfo(mx.float32, 0, 1)


@pytest.mark.parametrize("value", [[1, 2], (1,), "s", None, object(), np.zeros(2, "U1")])
def test_unsupported_inputs(value: object) -> None:
    with pytest.raises(TypeError, match="accepted: mlx.core.array"):
        as_mx_array(value)


def test_int_beyond_int64_is_refused() -> None:
    with pytest.raises(ValueError, match="int64"):
        as_mx_array(2**63)


def test_mx_dtype_from_numpy_follows_mx_array() -> None:
    for dt in [np.bool_, np.int8, np.uint16, np.int64, np.float16, np.float32, np.float64,
               np.complex64, np.complex128, ">u1"]:
        assert mx_dtype_from_numpy(dt) == mx.array(np.zeros(2, dt)).dtype
    assert mx_dtype_from_numpy(np.float64) == mx.float32
    # Types mx.array refuses are refused here too.
    for dt in [np.longdouble, ">f4", "U2", object]:
        with pytest.raises(ValueError, match="no MLX equivalent"):
            mx_dtype_from_numpy(dt)
    with pytest.raises(TypeError, match="dtype >f4"):
        as_mx_array(np.zeros(2, ">f4"))


# ---------------------------------------------------------------------------------------
# Compile options and call checks


@pytest.mark.parametrize(
    ("opts", "mode"),
    [(None, "safe"), ({}, "safe"), ({"math_mode": "safe"}, "safe"),
     ({"math_mode": "relaxed"}, "relaxed"), ({"math_mode": "fast"}, "fast")],
)
def test_compile_options(opts: dict | None, mode: str) -> None:
    assert validate_compile_options(opts) == mode


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"math_mode": "precise"},
         "[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'."),
        ({"math_mode": 2}, "[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'."),
        ({"foo": 1}, "[metal_kernel] Unknown compile option `foo`."),
        ({"math_mode": "fast", "x": 1}, "[metal_kernel] Unknown compile option `x`."),
        ([("math_mode", "fast")], "[metal_kernel] Expected `compile_options` to be a dict."),
        ("fast", "[metal_kernel] Expected `compile_options` to be a dict."),
    ],
)
def test_invalid_compile_options(opts: object, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        validate_compile_options(opts)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_size_checks_use_mlx_messages() -> None:
    check_size(2, 2, "inputs")
    with pytest.raises(ValueError) as exc:
        check_size(0, 1, "inputs")
    assert str(exc.value) == "[metal_kernel] Expected `inputs` to have size 1 but got size 0.\n"
    with pytest.raises(ValueError) as exc:
        check_call_sizes(["a"], ["o"], [1], [(1,), (2,)], [F32])
    assert str(exc.value) == (
        "[metal_kernel] Expected `output_shapes` to have size 1 but got size 2.\n"
    )
    with pytest.raises(ValueError) as exc:
        check_call_sizes(["a"], ["o"], [1], [(1,)], [])
    assert str(exc.value) == (
        "[metal_kernel] Expected `output_dtypes` to have size 1 but got size 0.\n"
    )


def test_generate_checks_counts() -> None:
    with pytest.raises(ValueError) as exc:
        generate("k", [], [], "")
    assert str(exc.value) == "[metal_kernel] Must specify at least one output."
    with pytest.raises(ValueError, match="`inputs` to have size 2 but got size 1"):
        generate("k", ["a", "b"], ["o"], "", inputs=[1], output_dtypes=[F32])
    with pytest.raises(ValueError, match="`output_dtypes` to have size 1 but got size 2"):
        generate("k", [], ["o"], "", output_dtypes=[F32, F32])
    check_has_outputs(["o"])


def test_float64_is_named_but_refused_on_the_gpu() -> None:
    gen = generate("d", ["a"], ["o"], "", inputs=[info((2,), mx.float64)], output_dtypes=[F32])
    assert gen.host_name == "custom_kernel_d_doublec_float"
    check_gpu_dtypes([F32], [mx.float16])
    with pytest.raises(ValueError, match="^float64 is not supported on the GPU$"):
        check_gpu_dtypes([mx.float64], [F32])
    with pytest.raises(ValueError, match="^float64 is not supported on the GPU$"):
        check_gpu_dtypes([], [mx.float64])


def test_verbose_text_names_the_kernel_object() -> None:
    gen = generate("vb", [], ["o"], "o[0] = 1;", output_dtypes=[mx.int16])
    assert isinstance(gen, GeneratedSource)
    assert gen.verbose_text() == (
        "Generated source code for `vb`:\n"
        "```\n"
        "[[kernel]] void custom_kernel_vb_int16_t(\n"
        "  device int16_t* o [[buffer(0)]]) {\n"
        "o[0] = 1;\n"
        "}\n"
        "\n"
        "```\n"
    )


# ---------------------------------------------------------------------------------------
# Cross-check against the installed MLX, when it can trace a kernel without running it

ORACLE_CASES = {
    "args": dict(
        name="arg_test", input_names=["a", "b", "c", "d"], output_names=["out1", "out2"],
        source=ARGS_BODY, template=[("e", True), ("f", 3), ("T", mx.float16)],
        inputs=[mx.zeros((3, 6)), mx.array([3, 4, 5]), mx.zeros((2, 2), mx.bfloat16), 7.3],
        output_dtypes=[F32, mx.int32],
    ),
    "separator_bug": dict(
        name="bug3", input_names=["a", "b"], output_names=["o1", "o2", "o3"],
        source="a_shape a_strides b_ndim", inputs=[mx.zeros((8,)), mx.zeros((2,))],
        output_dtypes=[F32] * 3,
    ),
    "quirks": dict(
        name="q", input_names=["a", "x"], output_names=["o"], header="#define X 1",
        source="// a_shape max_shape dispatch_threads_per_threadgroup grid_size",
        inputs=[3, mx.zeros((0,))], output_dtypes=[mx.uint8], atomic_outputs=True,
    ),
    "all_attributes": dict(
        name="attrs", input_names=[], output_names=["o"],
        source=" ".join(a for a, _ in reversed(ATTRIBUTES)), inputs=[],
        output_dtypes=[mx.complex64],
    ),
    "templates": dict(
        name="t", input_names=["a"], output_names=["o", "p"], source="o[0] = a;",
        template=[("N", -7), ("B", False), ("T", mx.float64)], inputs=[2**40],
        output_dtypes=[mx.int8, mx.uint64],
    ),
    "dtypes": dict(
        name="d", input_names=[f"i{k}" for k in range(13)], output_names=["o"], source="",
        inputs=[mx.zeros((2,), d) for d, *_ in DTYPES if d != mx.float64],
        output_dtypes=[mx.bfloat16],
    ),
}


def _mlx_verbose(case: dict, capfd: pytest.CaptureFixture[str]) -> str:
    kernel = mx.fast.metal_kernel(
        name=case["name"], input_names=case["input_names"], output_names=case["output_names"],
        source=case["source"], header=case.get("header", ""),
        atomic_outputs=case.get("atomic_outputs", False),
    )

    def call(_: mx.array) -> list[mx.array]:
        return kernel(
            inputs=case["inputs"], template=case.get("template"), grid=(1, 1, 1),
            threadgroup=(1, 1, 1), output_shapes=[(1,)] * len(case["output_names"]),
            output_dtypes=case["output_dtypes"], verbose=True,
        )

    capfd.readouterr()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mx.export_function(os.path.join(tmp, "k.mlxfn"), call, mx.zeros((1,)))
        except (RuntimeError, ValueError) as exc:
            pytest.skip(f"installed MLX cannot trace metal_kernel here: {exc}")
    return capfd.readouterr().out


@pytest.mark.parametrize("case", list(ORACLE_CASES), ids=list(ORACLE_CASES))
def test_matches_installed_mlx(case: str, capfd: pytest.CaptureFixture[str]) -> None:
    spec = ORACLE_CASES[case]
    printed = _mlx_verbose(spec, capfd)
    if not printed:
        pytest.skip("installed MLX printed no generated source")
    assert generate(**spec).verbose_text() == printed
