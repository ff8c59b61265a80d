"""Metal's shader logging on sim (mtwork.kernel_log): every thread's `os_log` messages,
with the thread that wrote them and the source line, in each thread's own order; the
formats Metal takes printed as C's printf prints them (Python's own printf-style
formatting is the reference), the ones it refuses refused while the kernel compiles; the
table's filters and its text and HTML; both kernel forms."""

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.errors import CompileError
from mtwork.kernel_log import KernelLog, quietly


def _run(kernel, inputs, shape, grid, threadgroup, **extra):
    outputs = kernel(inputs=inputs, output_shapes=[shape], output_dtypes=[mx.float32],
                     grid=grid, threadgroup=threadgroup, **extra)
    mx.eval(outputs)
    return np.array(outputs[0])


EVERY_THREAD = """
uint2 g = thread_position_in_grid.xy;
float v = a[g.y * 6 + g.x];
for (int k = 0; k < 3; ++k) {
    os_log_default.log("k=%d v=%.1f", k, v + float(k));
}
out[g.y * 6 + g.x] = v;
"""


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_every_thread_logs_with_its_position_line_and_order(isolate):
    kernel = mtwork.metal_kernel("every_thread", ["a"], ["out"], EVERY_THREAD)
    a = np.arange(24, dtype=np.float32) * 0.5
    out = _run(kernel, [mx.array(a)], (24,), (6, 4, 1), (4, 2, 1), isolate=isolate)
    np.testing.assert_array_equal(out, a)  # logging leaves the results alone
    log = kernel.last_log
    assert isinstance(log, KernelLog) and len(log) == 24 * 3 and not log.dropped
    for m in log:
        gx, gy = m.grid[0], m.grid[1]
        assert m.threadgroup == (gx // 4, gy // 2, 0)
        assert m.thread == (gx % 4, gy % 2, 0)
        width = min(4, 6 - 4 * m.threadgroup[0])  # the edge threadgroup is partial
        assert m.index == m.thread[1] * width + m.thread[0]
        assert (m.lane, m.simdgroup) == (m.index % 32, m.index // 32)
        assert (m.file, m.line, m.level) == ("source", 5, "default")
    # Each thread's messages in its own order, and the values it read.
    for gy in range(4):
        for gx in range(6):
            texts = [m.text for m in log if m.grid == (gx, gy, 0)]
            v = a[gy * 6 + gx]
            assert texts == ["k=%d v=%.1f" % (k, v + k) for k in range(3)]  # noqa: UP031
    # The table is threadgroup by threadgroup (x fastest), thread by thread.
    order = [(m.threadgroup[::-1], m.index) for m in log]
    assert order == sorted(order)


FORMATS = """
uint i = thread_position_in_grid.x;
if (i != 1) return;
half h = half(-2.25f);
bfloat b = bfloat(1.5f);
int n = -42;
uint u = 3054u;
os_log_default.log("%5d|%-6i|%u|%x|%X|%o|%08.3f|%+.2e|%g|%c|%s|%%|%*d|%.*f",
                   n, n, u, u, u, u, a[i], a[i], 0.0001f, 'Z', "lit", 6, n, 2, float(h));
os_log_default.log("%hhd %hd %ld %lld %lu", 300, 70000, -5000000000l, 7l, 9ul);
os_log_default.log("%.2f %.3f", float(b), h);
os_log_default.log("%v3u|%v2hd|%.1v4hlf|%.2v2hf", thread_position_in_grid,
                   short2(-3, 4), float4(0.25f, -1.0f, 2.5f, a[i]), half2(h, half(0.5f)));
constant os_log logger("com.example.kernels", "formats");
logger.log_debug("debug %d", 1);
logger.log_info("info");
logger.log_error("error %u", 2u);
logger.log_fault("fault %.1f", 0.5f);
out[i] = 1.0f;
"""


def test_formats_print_as_printf_does_vectors_and_levels_included():
    kernel = mtwork.metal_kernel("formats", ["a"], ["out"], FORMATS)
    a = np.array([0.0, 3.14159, 0.0, 0.0], np.float32)
    _run(kernel, [mx.array(a)], (4,), (4, 1, 1), (4, 1, 1), init_value=0.0)
    log = kernel.last_log
    n, u, x = -42, 3054, float(a[1])
    # Python's printf-style formatting is the reference (hence % and not format specs).
    assert log.texts[0] == ("%5d|%-6i|%u|%x|%X|%o|%08.3f|%+.2e|%g|%c|%s|%%|%*d|%.*f"  # noqa: UP031
                            % (n, n, u, u, u, u, x, x, np.float32(0.0001), "Z", "lit", 6, n,
                               2, -2.25))
    # Length modifiers take the argument's low bytes, as C reads a smaller type.
    assert log.texts[1] == "%d %d %d %d %d" % (  # noqa: UP031
        np.int8(300 - 256), np.int16(70000 - 65536),
                                               -5000000000, 7, 9)
    assert log.texts[2] == "1.50 -2.250"
    assert log.texts[3] == "1,0,0|-3,4|0.2,-1.0,2.5,3.1|-2.25,0.50"
    levels = [(m.level, m.text) for m in log][4:]
    assert levels == [("debug", "debug 1"), ("info", "info"), ("error", "error 2"),
                      ("fault", "fault 0.5")]
    assert {(m.subsystem, m.category) for m in log[4:]} == {("com.example.kernels",
                                                              "formats")}
    assert log[0].subsystem == "" and log[0].thread == (1, 0, 0)


@pytest.mark.parametrize("call, said", [
    ('os_log_default.log("x=%n", i);', 'at "%n" (conversion 1): %n is not supported'),
    ('os_log_default.log("%d %@", i, i);', 'at "%@" (conversion 2): %@ prints an Objective-C'),
    ('os_log_default.log("%Lf", 1.0f);', "long double has no Metal type"),
    ('os_log_default.log("%d", 1.5f);', "prints an integer; the argument is not one"),
    ('os_log_default.log("%f %f", 1.5f);', "more conversions than the call has arguments"),
    ('os_log_default.log("%f", 1.5f, 2.5f);', "more arguments than the format has"),
    ('os_log_default.log("%u", thread_position_in_grid);', "the argument is a vector"),
    ('os_log_default.log("%v4u", thread_position_in_grid);', "component count differs"),
    ('os_log_default.log("%v5f", float4(0));', "takes 2, 3 or 4 components"),
    ('os_log_default.log("%hlf", 1.0f);', "hl is a vector's length modifier"),
    ('os_log_default.log("%s", 3);', "%s prints a string literal"),
    ('os_log_default.log("%ls", "w");', "wide characters"),
    ('constant char* f = "x=%d"; os_log_default.log(f, 1);',
     "the format of a logging function must be a string literal"),
])
def test_a_format_metal_refuses_is_a_compile_error_at_the_call(call, said):
    kernel = mtwork.metal_kernel("refused", ["a"], ["out"],
                                 f"uint i = thread_position_in_grid.x;\n{call}\nout[i] = a[i];")
    with pytest.raises(CompileError) as caught:
        _run(kernel, [mx.zeros(4)], (4,), (4, 1, 1), (4, 1, 1))
    message = caught.value.message
    assert message.startswith("source:2:") and "error: MSL 3.2 §6.19: " in message
    assert said in message
    assert "consteval" not in message and "mtw_logging.h" not in message  # the author's words


def test_where_last_and_the_tables():
    kernel = mtwork.metal_kernel("filters", ["a"], ["out"], EVERY_THREAD)
    _run(kernel, [mx.zeros(24)], (24,), (6, 4, 1), (4, 2, 1))
    log = kernel.last_log
    one = log.where(thread=(1, 1), threadgroup=1)
    assert [m.grid for m in one] == [(5, 1, 0)] * 3 and one.of == 72
    assert log.where(grid=5) == log.where(thread=1, threadgroup=(1, 0)).where(grid=(5, 0, 0))
    assert len(log.where(line=5)) == 72 and len(log.where(line="source:5")) == 72
    assert len(log.where(line=4)) == 0 and len(log.where(lane=0)) == 4 * 3
    assert [m.text for m in log.where(contains="k=2", threadgroup=(0, 1))][:1] == ["k=2 v=2.0"]
    assert [m.text for m in log.last(thread=(3, 1), threadgroup=(0, 1), n=2)] == [
        "k=1 v=1.0", "k=2 v=2.0"]
    text = str(log)
    assert text.splitlines()[0] == "kernel `filters` logged 72 messages"
    assert "threadgroup  thread" in text and "… and 52 more" in text
    html = log._repr_html_()
    assert html.count("<tr>") == 72 + 1 and "source:5" in html
    with pytest.raises(ValueError, match="`thread` must be an int or one to three ints"):
        log.where(thread=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="`level` must be one of"):
        log.where(level="warning")
    with pytest.raises(ValueError, match="`line` must be a line number"):
        log.where(line=2.5)


def test_a_call_prints_its_first_messages_with_a_count_of_the_rest(capsys, monkeypatch):
    kernel = mtwork.metal_kernel("printed", ["a"], ["out"], EVERY_THREAD)
    monkeypatch.setenv("MTWORK_LOG_PRINT", "3")
    _run(kernel, [mx.zeros(24)], (24,), (6, 4, 1), (4, 2, 1))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "kernel `printed` logged 72 messages"
    assert len(printed) == 1 + 1 + 3 + 1 and printed[-1].lstrip().startswith("… and 69 more")
    with quietly():
        _run(kernel, [mx.zeros(24)], (24,), (6, 4, 1), (4, 2, 1))
    monkeypatch.setenv("MTWORK_LOG_PRINT", "0")
    _run(kernel, [mx.zeros(24)], (24,), (6, 4, 1), (4, 2, 1))
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("MTWORK_LOG_PRINT", "many")
    with pytest.raises(ValueError, match="MTWORK_LOG_PRINT must be how many messages"):
        _run(kernel, [mx.zeros(24)], (24,), (6, 4, 1), (4, 2, 1))


LIBRARY = """
#include <metal_stdlib>
#include "helper.h"
using namespace metal;

[[kernel]] void scaled(device const float* x [[buffer(0)]],
                       device float* y [[buffer(1)]],
                       uint i [[thread_position_in_grid]]) {
    os_log_default.log("x=%.1f", x[i]);
    y[i] = twice(x[i], i);
}
"""

HELPER = """
inline float twice(float v, uint i) {
    if (i == 2) metal::os_log_default.log_error("helper sees %.1f", v);
    return v * 2.0f;
}
"""


def test_a_full_source_kernel_logs_at_its_own_files_lines(tmp_path):
    (tmp_path / "scaled.metal").write_text(LIBRARY)
    (tmp_path / "helper.h").write_text(HELPER)
    library = mtwork.load_metal(tmp_path / "scaled.metal")
    kernel = library.kernel("scaled")
    x = np.arange(4, dtype=np.float32)
    out = kernel(buffers={"x": x, "y": np.zeros(4, np.float32)}, grid=4,
                 threads_per_threadgroup=4)
    np.testing.assert_array_equal(out["y"], x * 2)
    log = kernel.last_log
    assert [(m.file.rsplit("/", 1)[-1], m.line, m.text) for m in log.where(thread=2)] == [
        ("scaled.metal", 9, "x=2.0"), ("helper.h", 3, "helper sees 2.0")]
    assert log.where(level="error")[0].level == "error"
    kernel(buffers={"x": x, "y": np.zeros(4, np.float32)}, grid=4,
           threads_per_threadgroup=4, log=False)
    assert kernel.last_log is None
