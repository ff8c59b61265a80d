"""Every argument is checked before anything runs: a bad one gives a ValueError or
TypeError that names it, says what was given and what is allowed. One table for both
kernel forms, their calls and the environment."""

import json
import math

import mlx.core as mx
import numpy as np
import pytest

import mtwork

from .child import run_snippet

BODY = "uint i = thread_position_in_grid.x; out[i] = inp[i];"
LIBRARY = """
#include <metal_stdlib>
[[kernel]] void copy(device const float* inp [[buffer(0)]], device float* out [[buffer(1)]],
                     threadgroup float* scratch [[threadgroup(0)]],
                     uint i [[thread_position_in_grid]]) { out[i] = inp[i]; }
"""
X = mx.arange(8, dtype=mx.float32)


def make(**changes):
    arguments = {"name": "copy", "input_names": ["inp"], "output_names": ["out"],
                 "source": BODY, **changes}
    return mtwork.metal_kernel(**arguments)


def call(**changes):
    arguments = {"inputs": [X], "grid": (8, 1, 1), "threadgroup": (8, 1, 1),
                 "output_shapes": [(8,)], "output_dtypes": [mx.float32], **changes}
    return mx.eval(make()(**arguments))  # some settings are read as the kernel runs


def call_library(**changes):
    kernel = mtwork.load_metal(LIBRARY).kernel("copy")
    arguments = {"buffers": [np.zeros(8, np.float32), mtwork.new_buffer(8)], "grid": 8,
                 "threads_per_threadgroup": 8, "threadgroup_memory": {0: 32}, **changes}
    return kernel(**arguments)


CASES = [
    # (what, thunk, error, words the message must hold)
    ("name=123", lambda: make(name=123), ValueError, ["`name`", "123"]),
    ("name with a space", lambda: make(name="my kernel"), ValueError, ["`name`", "my kernel"]),
    ("input_names a str", lambda: make(input_names="inp"), TypeError, ["`input_names`", "'inp'"]),
    ("an input name not an identifier", lambda: make(input_names=["in-1"]), ValueError,
     ["`input_names`", "in-1"]),
    ("a name twice", lambda: make(input_names=["out"]), ValueError, ["twice"]),
    ("source=None", lambda: make(source=None), TypeError, ["`source`", "None"]),
    ("header=7", lambda: make(header=7), TypeError, ["`header`", "7"]),
    ("ensure_row_contiguous=1", lambda: make(ensure_row_contiguous=1), TypeError,
     ["`ensure_row_contiguous`"]),
    ("an unknown backend", lambda: make(backend="cuda"), ValueError, ["cuda", "sim"]),
    ("inputs an mx.array", lambda: call(inputs=X), TypeError, ["`inputs`", "list"]),
    ("output_shapes of a str", lambda: call(output_shapes=["64"]), ValueError,
     ["output_shapes[0]", "'64'", "integers"]),
    ("a fractional output size", lambda: call(output_shapes=[(64.7,)]), ValueError,
     ["output_shapes[0]", "64.7"]),
    ("a negative output size", lambda: call(output_shapes=[(-1,)]), ValueError,
     ["output_shapes[0]", "negative"]),
    ("output_dtypes not a dtype", lambda: call(output_dtypes=[np.float32]), ValueError,
     ["output_dtypes[0]", "mx.float32"]),
    ("grid of two values", lambda: call(grid=(8, 1)), ValueError, ["`grid`", "three"]),
    ("a zero grid", lambda: call(grid=(0, 1, 1)), ValueError, ["`grid`", "positive"]),
    ("a fractional threadgroup", lambda: call(threadgroup=(8.0, 1, 1)), ValueError,
     ["`threadgroup`", "integers"]),
    ("a grid past 2**32 - 1", lambda: call(grid=(2**32, 1, 1)), ValueError,
     ["`grid`", "4294967296", "4294967295"]),
    ("a threadgroup over 1024 threads", lambda: call(threadgroup=(2048, 1, 1)), ValueError,
     ["`threadgroup`", "2048", "1024"]),
    ("timeout=nan", lambda: call(timeout=math.nan), ValueError, ["`timeout`", "nan"]),
    ("timeout='1'", lambda: call(timeout="1"), TypeError, ["`timeout`", "'1'"]),
    ("timeout=0", lambda: call(timeout=0), ValueError, ["`timeout`", "positive"]),
    ("sanitize='yes please'", lambda: call(sanitize="yes please"), ValueError,
     ["`sanitize`", "warn"]),
    ("isolate='no'", lambda: call(isolate="no"), ValueError, ["`isolate`", "'no'"]),
    ("init_value '0'", lambda: call(init_value="0"), ValueError, ["`init_value`", "'0'"]),
    ("verbose='x'", lambda: call(verbose="x"), TypeError, ["`verbose`", "'x'", "True or False"]),
    ("verbose=1", lambda: call(verbose=1), TypeError, ["`verbose`", "1", "True or False"]),
    ("an input named new", lambda: make(input_names=["new"]), ValueError,
     ["`input_names`", "'new'", "C++ keyword"]),
    ("an output named class", lambda: make(output_names=["class"]), ValueError,
     ["`output_names`", "'class'", "C++ keyword"]),
    ("an input named float", lambda: make(input_names=["float"]), ValueError,
     ["`input_names`", "'float'", "C++ keyword"]),
    ("an input named not_eq", lambda: make(input_names=["not_eq"]), ValueError,
     ["`input_names`", "'not_eq'", "operator word"]),
    ("an output named device", lambda: make(output_names=["device"]), ValueError,
     ["`output_names`", "'device'", "address space"]),
    ("an input named after a thread attribute",
     lambda: make(input_names=["thread_position_in_grid"]), ValueError,
     ["`input_names`", "'thread_position_in_grid'", "thread attribute"]),
    ("a template parameter named float", lambda: call(template=[("float", 1)]), ValueError,
     ["template", "'float'", "C++ keyword"]),
    ("library buffers an array", lambda: call_library(buffers=np.zeros(8, np.float32)),
     TypeError, ["`buffers`"]),
    ("library grid and threadgroups", lambda: call_library(threadgroups=1), TypeError,
     ["threadgroups=", "grid="]),
    ("library grid of four values", lambda: call_library(grid=(8, 1, 1, 1)), ValueError,
     ["`grid`", "one to three"]),
    ("library threadgroup memory unaligned", lambda: call_library(threadgroup_memory={0: 30}),
     ValueError, ["30 bytes", "multiple of 16"]),
    ("library threadgroup memory negative", lambda: call_library(threadgroup_memory={0: -16}),
     ValueError, ["-16"]),
    ("library threadgroup memory over 32 KiB",
     lambda: call_library(threadgroup_memory={0: 64 * 1024}), mtwork.ThreadgroupMemoryError,
     ["32 KiB"]),
    ("library timeout=inf", lambda: call_library(timeout=math.inf), ValueError,
     ["`timeout`", "inf"]),
    ("new_buffer of a negative size",
     lambda: call_library(buffers=[np.zeros(8, np.float32), mtwork.new_buffer(-1)]),
     ValueError, ["new_buffer", "`shape`", "-1", "negative"]),
    ("new_buffer of a float size", lambda: mtwork.new_buffer(8.0), TypeError,
     ["new_buffer", "`shape`", "8.0", "integer"]),
    ("new_buffer of a bool size", lambda: mtwork.new_buffer(True), TypeError,
     ["new_buffer", "`shape`", "True"]),
    ("new_buffer fill a string", lambda: mtwork.new_buffer(8, fill="1"), ValueError,
     ["new_buffer", "`fill`", "'1'", "number"]),
    ("load_metal of a number", lambda: mtwork.load_metal(7), TypeError, ["`source`", "int"]),
    ("load_metal math mode", lambda: mtwork.load_metal(LIBRARY, math_mode="quick"), ValueError,
     ["`math_mode`", "quick", "safe"]),
    ("load_metal include_dirs a path", lambda: mtwork.load_metal(LIBRARY, include_dirs="x"),
     TypeError, ["`include_dirs`"]),
    ("a kernel name not a str", lambda: mtwork.load_metal(LIBRARY).kernel(3), TypeError,
     ["name", "3"]),
]


@pytest.mark.parametrize(("thunk", "error", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_bad_argument_is_named(thunk, error, words):
    with pytest.raises(error) as caught:
        thunk()
    message = str(caught.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{message!r} lacks {missing}"


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("MTWORK_TIMEOUT", "soon", ["MTWORK_TIMEOUT", "soon"]),
    ("MTWORK_TIMEOUT", "-3", ["MTWORK_TIMEOUT", "-3"]),
    ("MTWORK_SANITIZE", "maybe", ["MTWORK_SANITIZE", "maybe"]),
    ("MTWORK_ISOLATE", "perhaps", ["MTWORK_ISOLATE", "perhaps"]),
    ("MTWORK_BACKEND", "cuda", ["MTWORK_BACKEND", "cuda"]),
])
def test_a_bad_environment_variable_is_named(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as caught:
        call(grid=(8, 1, 1))
    message = str(caught.value)
    assert all(w in message for w in words), message


def test_names_close_to_reserved_words_are_kept():
    # Only whole reserved words are refused: names that contain one, differ in case, or
    # are MSL type names (typedefs, which a parameter may shadow) still make kernels.
    kernel = mtwork.metal_kernel("near", ["new_values", "Class", "half"], ["float_out"],
                                 "uint i = thread_position_in_grid.x;\n"
                                 "float_out[i] = new_values[i] + Class[i] + half[i];")
    ones = mx.ones((8,), dtype=mx.float32)
    out = kernel(inputs=[ones, 2 * ones, 3 * ones], grid=(8, 1, 1), threadgroup=(8, 1, 1),
                 output_shapes=[(8,)], output_dtypes=[mx.float32])[0]
    assert np.array_equal(np.array(out), np.full(8, 6.0, np.float32))


@pytest.mark.parametrize("isolate", [True, False])
def test_outputs_larger_than_the_memory_available_are_refused_up_front(monkeypatch, isolate):
    # Inputs count too (the worker holds a copy): 1 MiB in and 1 MiB out do not fit in
    # 1.5 MiB, and the error says what was asked and what there is.
    available = 3 << 19
    monkeypatch.setattr(mtwork.dispatch, "available_memory", lambda fresh=False: available)
    n = 1 << 18  # floats: 1 MiB
    with pytest.raises(ValueError) as caught:
        make()(inputs=[mx.zeros((n,), dtype=mx.float32)], grid=(n, 1, 1),
               threadgroup=(256, 1, 1), output_shapes=[(n,)], output_dtypes=[mx.float32],
               isolate=isolate)
    message = str(caught.value)
    for words in ("`output_shapes`", f"{4 * n:,} bytes", "1.0 MiB", f"{available:,} bytes",
                  "available"):
        assert words in message, message
    available = 3 << 20  # now they fit
    out = make()(inputs=[mx.arange(n, dtype=mx.float32)], grid=(n, 1, 1),
                 threadgroup=(256, 1, 1), output_shapes=[(n,)], output_dtypes=[mx.float32],
                 isolate=isolate)[0]
    assert np.array_equal(np.array(out), np.arange(n, dtype=np.float32))


def test_new_buffers_larger_than_the_memory_available_are_refused_up_front(monkeypatch):
    monkeypatch.setattr(mtwork.dispatch, "available_memory", lambda fresh=False: 1 << 20)
    with pytest.raises(ValueError) as caught:
        call_library(buffers=[np.zeros(8, np.float32), mtwork.new_buffer(1 << 18)])
    message = str(caught.value)
    assert "new_buffer" in message and "`copy`" in message and f"{1 << 20:,} bytes" in message


def test_terabytes_of_outputs_are_refused_before_any_memory_is_taken():
    # The machine's real MemAvailable, in a child whose address space is limited to
    # 16 GiB: were the check missing, the allocation would fail there (or the worker be
    # killed) instead of this error.
    result = run_snippet("""
import resource
resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
import json, mlx.core as mx, mtwork
k = mtwork.metal_kernel("copy", ["inp"], ["out"], "out[0] = inp[0];")
errors = []
for isolate in (True, False):
    try:
        k(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
          output_shapes=[(1 << 40,)], output_dtypes=[mx.float32], isolate=isolate)
        errors.append("ran")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(errors))
""", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for error in errors:
        assert error.startswith("ValueError") and "`output_shapes`" in error, error
        assert f"{4 << 40:,} bytes" in error, error
