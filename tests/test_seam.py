"""One dispatch path for both kernel forms: the sanitizer and the geometry checks of
full-source kernels are those of body-form ones, a backend plugs in with one
registration, the editor edits any kernel, and family modules work however imported."""

import importlib
import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends import register, unregister
from mtwork.backends.sim import SimBackend
from mtwork.editor import EditLoop
from mtwork.sanitizer import SanitizerError

N = 64

BODY_OOB = "uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1];"
LIBRARY_OOB = """\
#include <metal_stdlib>
using namespace metal;

[[kernel]] void shift(device const float* inp [[buffer(0)]],
                      device float* out [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
    out[i] = inp[i + 1];
}
"""


def _body_report():
    kernel = mtwork.metal_kernel("shift", ["inp"], ["out"], BODY_OOB)
    with pytest.raises(SanitizerError) as caught:
        kernel(inputs=[mx.arange(N, dtype=mx.float32)], grid=(N, 1, 1), threadgroup=(32, 1, 1),
               output_shapes=[(N,)], output_dtypes=[mx.float32], sanitize=True)
    return caught.value.report


def _library_report(**call):
    kernel = mtwork.load_metal(LIBRARY_OOB).kernel("shift")
    with pytest.raises(SanitizerError) as caught:
        kernel(buffers={"inp": np.arange(N, dtype=np.float32), "out": mtwork.new_buffer(N)},
               grid=N, threads_per_threadgroup=32, **call)
    assert kernel.last_sanitizer_report is caught.value.report
    return caught.value.report


def test_full_source_kernels_are_sanitized_like_body_form_ones():
    body, library = _body_report(), _library_report(sanitize=True)
    for report in (body, library):
        [finding] = report.findings
        assert (finding.kind, finding.where, finding.element, finding.access) == (
            "out-of-bounds access", "inp", N, "read")
        assert finding.thread == (31, 0, 0) and finding.threadgroup == (1, 0, 0)
    assert body.findings[0].line == "source:2"
    assert library.findings[0].line == "source:7"  # the library's own file and line


def test_the_sanitize_variable_reaches_full_source_kernels(monkeypatch):
    monkeypatch.setenv("MTWORK_SANITIZE", "1")
    assert _library_report().findings[0].kind == "out-of-bounds access"


@pytest.mark.parametrize("value", ["sometimes", "2"])
def test_a_bad_sanitize_variable_is_named(monkeypatch, value):
    monkeypatch.setenv("MTWORK_SANITIZE", value)
    kernel = mtwork.load_metal(LIBRARY_OOB).kernel("shift")
    with pytest.raises(ValueError, match="MTWORK_SANITIZE"):
        kernel(buffers=[np.zeros(N, np.float32), mtwork.new_buffer(N)], grid=N,
               threads_per_threadgroup=32)


@pytest.mark.parametrize(("grid", "threadgroup", "what"), [
    ((0, 1, 1), (32, 1, 1), "grid"),
    ((64, 1, 1), (2048, 1, 1), "threadgroup"),
    ((2**32, 1, 1), (32, 1, 1), "grid"),
])
def test_both_forms_check_the_geometry_with_the_same_words(grid, threadgroup, what):
    body = mtwork.metal_kernel("k", ["inp"], ["out"], "out[0] = inp[0];")
    library = mtwork.load_metal(LIBRARY_OOB).kernel("shift")
    with pytest.raises(ValueError) as from_body:
        body(inputs=[mx.zeros(N)], grid=grid, threadgroup=threadgroup,
             output_shapes=[(N,)], output_dtypes=[mx.float32])
    name = "grid" if what == "grid" else "threads_per_threadgroup"
    with pytest.raises(ValueError) as from_library:
        library(buffers=[np.zeros(N, np.float32), mtwork.new_buffer(N)],
                **{"grid": grid, "threads_per_threadgroup": threadgroup})
    assert f"`{what}`" in str(from_body.value)
    assert f"`{name}`" in str(from_library.value)
    tail = str(from_body.value).split("`", 2)[2].split(",")[0]  # after the argument's name
    assert tail.split(" ")[-1] in str(from_library.value)


class CountingSim(SimBackend):
    """A third backend: the emulator, counting its dispatches."""

    name = "counting"
    calls = 0

    def dispatch(self, program, call):
        CountingSim.calls += 1
        return super().dispatch(program, call)


def test_a_backend_plugs_in_with_one_registration():
    register("counting", CountingSim)
    try:
        assert mtwork.backends()["counting"] is None
        kernel = mtwork.metal_kernel("twice", ["inp"], ["out"],
                                     "out[thread_position_in_grid.x] = 2 * "
                                     "inp[thread_position_in_grid.x];")
        x = mx.arange(N, dtype=mx.float32)
        out = kernel(inputs=[x], grid=(N, 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[(N,)], output_dtypes=[mx.float32], backend="counting")[0]
        mx.eval(out)  # an operation of MLX's graph: it is dispatched when evaluated
        lib = mtwork.load_metal(LIBRARY_OOB.replace("i + 1", "i")).kernel("shift")
        copied = lib(buffers=[np.arange(N, dtype=np.float32), mtwork.new_buffer(N)], grid=N,
                     threads_per_threadgroup=32, backend="counting")
    finally:
        unregister("counting")
    assert CountingSim.calls == 2
    np.testing.assert_array_equal(np.array(out), 2 * np.arange(N))
    np.testing.assert_array_equal(copied["out"], np.arange(N))
    assert "counting" not in mtwork.backends()


# --- the editor edits any kernel ---------------------------------------------------------

TWICE = "uint i = thread_position_in_grid.x;\nout[i] = inp[i] * 2;\n"


def _cell_kernel():
    return mtwork.metal_kernel("twice", ["inp"], ["out"], TWICE)


def test_the_editor_edits_a_kernel_made_in_a_cell(tmp_path):
    kernel = _cell_kernel()

    def build(c):
        return mtwork.Launch(kernel, grid=(N, 1, 1), threadgroup=(32, 1, 1),
                             output_shapes=[(N,)], output_dtypes=[mx.float32])

    loop = EditLoop(kernel, build, inputs=[mx.arange(N, dtype=mx.float32)],
                    oracle=lambda x: 2 * np.asarray(x, np.float64), bench_rounds=0)
    assert loop.run().status == "ok"
    loop.set_source(TWICE.replace("* 2", "* 3"))
    assert loop.run().status == "wrong"
    assert loop.dirty
    with pytest.raises(ValueError, match="not backed by files.*save\\(source="):
        loop.save()
    written = loop.save(source=tmp_path / "twice.metal")
    assert written == [tmp_path / "twice.metal"]
    assert (tmp_path / "twice.metal").read_text() == loop.source
    assert not loop.dirty
    assert kernel.source == TWICE  # the cell's kernel itself is unchanged


def test_the_editor_edits_a_load_metal_kernel(tmp_path):
    path = tmp_path / "shift.metal"
    path.write_text(LIBRARY_OOB.replace("i + 1", "i"))
    kernel = mtwork.load_metal(path).kernel("shift")
    x = np.arange(N, dtype=np.float32)

    def build(c):
        return kernel.launch(buffers={"inp": x, "out": mtwork.new_buffer(N)}, grid=N,
                             threads_per_threadgroup=32)

    loop = EditLoop(kernel, build, oracle=lambda: [x], bench_rounds=0)
    assert loop.run().status == "ok"
    loop.set_source(loop.source.replace("out[i] = inp[i];", "out[i] = inp[i] + 1;"))
    outcome = loop.run()
    assert outcome.status == "wrong" and outcome.diffs[0].n_mismatch == N
    loop.set_source(loop.source.replace("out[i] = inp[i] + 1;", "out[i] = inp[i] + 0;"))
    assert loop.run().status == "ok"
    assert loop.save() == [path]
    assert "inp[i] + 0" in path.read_text()
    loop.set_source(loop.source.replace("[[kernel]] void shift", "[[kernel]] void moved"))
    outcome = loop.run()
    assert outcome.status == "error" and "no longer defines kernel `shift`" in outcome.message


def test_an_editor_without_an_oracle_says_the_kernel_only_ran():
    kernel = _cell_kernel()
    loop = EditLoop(kernel, lambda c: mtwork.Launch(
        kernel, grid=(N, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(N,)],
        output_dtypes=[mx.float32]), inputs=[mx.arange(N, dtype=mx.float32)], bench_rounds=0)
    outcome = loop.run()
    assert outcome.status == "ran" and "no oracle" in outcome.summary()
    assert "correct" not in outcome.summary()


# --- family modules ---------------------------------------------------------------------


def test_a_family_module_imported_directly_finds_its_files(monkeypatch, tmp_path):
    # Imported from its file under a name of its own, from another folder: a dotted
    # `kernels.gguf.family` is not always importable (Hugging Face's `kernels` package,
    # which transformers requires, is a regular package that shadows the folder).
    monkeypatch.chdir(tmp_path)
    path = Path(__file__).parent.parent / "kernels" / "gguf" / "family.py"
    spec = importlib.util.spec_from_file_location("gguf_family_by_path", path)
    assert spec is not None and spec.loader is not None
    family = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, family)
    spec.loader.exec_module(family)
    weights = family.sample_weights(2, 64)
    packed = family.FORMATS["q8_0"].quantize(weights)
    out = family.dequantize("q8_0", packed)  # compiles the spec's files from their folder
    np.testing.assert_array_equal(np.array(out), family.FORMATS["q8_0"].dequantize(packed))


def test_a_spec_needs_its_folder():
    with pytest.raises(TypeError, match="folder"):
        mtwork.KernelSpec(name="k", source="k.metal", input_names=["a"], output_names=["b"])
