"""Compiler messages speak of the author's text: the author's file, line and column, the
author's own line quoted (not mtwork's rewrite of it), and no errors of mtwork's generated
code that only follow from the author's."""

import mlx.core as mx
import pytest

import mtwork

CALL = dict(grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
            output_dtypes=[mx.float32])


def message(body, header="", **call):
    kernel = mtwork.metal_kernel("broken", ["inp"], ["out"], body, header=header)
    with pytest.raises(mtwork.CompileError) as caught:
        kernel(inputs=[mx.zeros(32)], **{**CALL, **call})
    return caught.value.message


def test_an_error_in_a_rewritten_line_quotes_the_authors_line_and_column():
    text = message("uint i = thread_position_in_grid.x;\n"
                   "threadgroup float tile[32][Q];\n"
                   "tile[0][i] = inp[i];\nout[i] = tile[0][i];")
    assert "source:2:28: error: use of undeclared identifier 'Q'" in text
    assert "    2 | threadgroup float tile[32][Q];" in text
    assert "      |                            ^" in text
    assert "__mtw" not in text


def test_a_missing_template_value_gives_the_authors_error_only():
    text = message("uint i = thread_position_in_grid.x; out[i] = T(inp[i]);")
    assert "source:1:46: error: use of undeclared identifier 'T'" in text
    assert "<generated>" not in text and text.count("error:") == 1


def test_an_error_in_the_header_is_placed_in_the_header():
    text = message("uint i = thread_position_in_grid.x; out[i] = twice(inp[i]);",
                   header="float twice(float x) {\n  return x * two;\n}\n")
    assert "header:2:14: error: use of undeclared identifier 'two'" in text
    assert "    2 |   return x * two;" in text


def test_an_error_in_an_included_file_of_a_library_names_that_file(tmp_path):
    (tmp_path / "helper.h").write_text("inline float scale(float x) {\n"
                                       "  return x * factor;\n}\n")
    (tmp_path / "main.metal").write_text(
        '#include <metal_stdlib>\n#include "helper.h"\n'
        "[[kernel]] void k(device float* out [[buffer(0)]],\n"
        "                  uint i [[thread_position_in_grid]]) {\n"
        "  out[i] = scale(out[i]);\n}\n")
    kernel = mtwork.load_metal(tmp_path / "main.metal").kernel("k")
    with pytest.raises(mtwork.CompileError) as caught:
        kernel.compile()
    text = caught.value.message
    assert f"{tmp_path / 'helper.h'}:2:14: error: use of undeclared identifier 'factor'" in text
    assert "    2 |   return x * factor;" in text


def test_clangs_front_end_alone_reports_what_its_driver_does(tmp_path):
    from mtwork.toolchain import run_clang, run_clang_front_end

    source = tmp_path / "unit.cpp"
    source.write_text("int f(int* p) { return p; }\nint g() { return undeclared; }\n")
    args = ["-x", "c++", "-fsyntax-only", "-fno-color-diagnostics"]
    extra = ["-I", str(tmp_path)]
    driver = run_clang([*args, *extra, str(source)], "unit", raw=True)
    for _ in range(2):  # the driver's expansion asked, then reused
        alone = run_clang_front_end(args, extra, source, "unit")
        assert (alone.returncode, alone.stderr) == (driver.returncode, driver.stderr)
    assert "undeclared identifier 'undeclared'" in alone.stderr
