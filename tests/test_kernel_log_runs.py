"""How a kernel's log lives through its run on sim: bounded per dispatch (and said), kept
when the kernel faults, times out or its worker process is killed (and the error quotes
the last messages of the threads involved), quoted by the sanitizer's findings, run on
fibers without changing a bit of the results, and nothing at all for a kernel that does
not log."""

import threading
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends import cancel, register, unregister
from mtwork.backends.sim import SimBackend
from mtwork.backends.sim.compile.linking import undefined_symbols
from mtwork.errors import KernelCancelled, KernelFault, KernelTimeout
from mtwork.sanitizer import SanitizerError

ISOLATION = pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])


def _call(kernel, n=8, threadgroup=4, **extra):
    outputs = kernel(inputs=[mx.arange(n, dtype=mx.float32)], output_shapes=[(n,)],
                     output_dtypes=[mx.float32], grid=(n, 1, 1),
                     threadgroup=(threadgroup, 1, 1), **extra)
    mx.eval(outputs)
    return np.array(outputs[0])


@ISOLATION
def test_the_log_is_bounded_per_dispatch_and_says_what_it_dropped(isolate, monkeypatch):
    monkeypatch.setenv("MTWORK_LOG_BUFFER_SIZE", "2048")
    monkeypatch.setenv("MTWORK_LOG_PRINT", "0")
    kernel = mtwork.metal_kernel("chatty", ["a"], ["out"], """
        uint i = thread_position_in_grid.x;
        os_log_default.log("thread %u of a chatty kernel", i);
        out[i] = a[i];""")
    _call(kernel, n=256, threadgroup=64, isolate=isolate)
    log = kernel.last_log
    assert log.dropped > 0 and len(log) + log.dropped == 256 and log.capacity == 2048
    assert "more were dropped: the log (2.0 KiB a dispatch; $MTWORK_LOG_BUFFER_SIZE sets it) " \
           "was full" in log.summary()
    assert all(m.text == f"thread {m.grid[0]} of a chatty kernel" for m in log)
    monkeypatch.setenv("MTWORK_LOG_BUFFER_SIZE", "100")
    with pytest.raises(ValueError, match="MTWORK_LOG_BUFFER_SIZE must be a number of bytes "
                                         "from 1024 to 1073741824"):
        _call(kernel, isolate=isolate)


FAULTING = """
uint i = thread_position_in_grid.x;
os_log_default.log("before %u", i);
if (i == 5) {
    os_log_default.log("about to write out of bounds");
    device float* nowhere = (device float*)0x40;  // unmapped in every process
    nowhere[i] = 1.0f;
}
out[i] = a[i];
"""


@ISOLATION
def test_a_fault_keeps_the_log_and_quotes_the_faulting_threads_last_messages(isolate):
    kernel = mtwork.metal_kernel("faulting", ["a"], ["out"], FAULTING)
    with pytest.raises(KernelFault) as caught:
        _call(kernel, isolate=isolate)
    said = str(caught.value)
    assert ('last messages of thread (1,0,0) of threadgroup (1,0,0): source:3: "before 5"; '
            'source:5: "about to write out of bounds"') in said
    log = kernel.last_log
    assert caught.value.log is log
    assert [m.text for m in log.where(grid=5)] == ["before 5", "about to write out of bounds"]
    assert len(log.where(line=3)) >= 6  # the threads that ran before it stopped


SPINNING = """
uint i = thread_position_in_grid.x;
os_log_default.log("start %u", i);
if (i == 2) {
    os_log_default.log("spinning");
    while (a[0] >= 0.0f) { out[i] += 1.0f; }
}
out[i] = a[i];
"""


@ISOLATION
def test_a_timeout_keeps_the_log_and_quotes_the_threads_still_running(isolate):
    kernel = mtwork.metal_kernel("spinning", ["a"], ["out"], SPINNING)
    with pytest.raises(KernelTimeout) as caught:
        _call(kernel, isolate=isolate, timeout=1)
    assert ('last messages of thread (2,0,0) of threadgroup (0,0,0): source:3: "start 2"; '
            'source:5: "spinning"') in str(caught.value)
    assert kernel.last_log.where(grid=2).texts == ["start 2", "spinning"]


def test_the_log_outlives_a_worker_that_is_killed():
    kernel = mtwork.metal_kernel("killed", ["a"], ["out"], SPINNING)
    timer = threading.Timer(1.5, cancel, args=("sim",))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KernelCancelled):
        _call(kernel, isolate=True, timeout=60)
    timer.join()
    assert time.monotonic() - started < 30
    assert kernel.last_log.where(grid=2).texts == ["start 2", "spinning"]
    np.testing.assert_array_equal(_call(mtwork.metal_kernel("after", ["a"], ["out"],
                                                            "out[thread_position_in_grid.x] "
                                                            "= 1.0f;"), isolate=True),
                                  np.ones(8))  # the next call has a new worker


SOMETIMES = """
uint i = thread_position_in_grid.x;
float v = sin(a[i]) * 3.0f + a[i] * a[i];
if (v < limit[0]) os_log_default.log("v=%f at %u", v, i);
out[i] = v;
"""


def test_a_kernel_runs_on_its_fast_path_until_it_logs_then_on_fibers_bit_for_bit():
    kernel = mtwork.metal_kernel("sometimes", ["a", "limit"], ["out"], SOMETIMES)

    def call(limit, **extra):
        outputs = kernel(inputs=[mx.arange(64, dtype=mx.float32) * 0.37, mx.array([limit])],
                         output_shapes=[(64,)], output_dtypes=[mx.float32],
                         grid=(64, 1, 1), threadgroup=(32, 1, 1), **extra)
        mx.eval(outputs)
        return np.array(outputs[0])

    quiet = call(-1e9)  # no message: the plain loops, as a kernel without logging
    assert kernel.last_engine.name == "loops" and len(kernel.last_log) == 0
    unlogged = call(1.0, log=False)
    assert kernel.last_engine.name == "loops" and kernel.last_log is None
    logged = call(1.0)
    assert kernel.last_engine.name == "fibers" and "logs (os_log)" in kernel.last_engine.reason
    assert quiet.tobytes() == unlogged.tobytes() == logged.tobytes()
    expected = [i for i in range(64) if quiet[i] < 1.0]
    assert [m.grid[0] for m in kernel.last_log] == expected
    call(-1e9)
    assert kernel.last_engine.name == "fibers"  # kept there once it logged


BARRIERS = """
threadgroup float tile[64];
uint i = thread_position_in_threadgroup.x;
tile[i] = a[thread_position_in_grid.x];
threadgroup_barrier(mem_flags::mem_threadgroup);
float s = tile[i] + tile[63 - i];
if (i % 16 == 0) os_log_default.log("pair %u sums %.2f", i, s);
out[thread_position_in_grid.x] = s;
"""


def test_the_fast_engine_hands_a_kernel_that_logs_to_fibers_with_the_same_results(
        monkeypatch):
    monkeypatch.setenv("MTWORK_SIM_ENGINE", "fast")
    kernel = mtwork.metal_kernel("barriers_log", ["a"], ["out"], BARRIERS)
    unlogged = _call(kernel, n=128, threadgroup=64, isolate=False, log=False)
    assert kernel.last_engine.name == "fast"
    logged = _call(kernel, n=128, threadgroup=64, isolate=False)
    assert kernel.last_engine.name == "fibers"
    assert unlogged.tobytes() == logged.tobytes()
    assert [(m.threadgroup[0], m.thread[0]) for m in kernel.last_log] == [
        (g, t) for g in (0, 1) for t in (0, 16, 32, 48)]


def test_the_sanitizers_findings_quote_their_threads_last_messages():
    kernel = mtwork.metal_kernel("reads_past", ["a"], ["out"], """
        uint i = thread_position_in_grid.x;
        uint j = i * 2;
        os_log_default.log("i=%u reads a[%u]", i, j);
        out[i] = a[j];""")
    with pytest.raises(SanitizerError) as caught:
        _call(kernel, sanitize=True)
    finding = caught.value.report.findings[0]
    assert finding.thread == (0, 0, 0) and finding.threadgroup == (1, 0, 0)
    assert finding.messages == ('last messages of thread (0,0,0) of threadgroup (1,0,0): '
                                'source:4: "i=4 reads a[8]"',)
    assert 'source:4: "i=4 reads a[8]"' in str(caught.value.report)
    assert kernel.last_log is caught.value.log and len(kernel.last_log) == 8


class _Elsewhere(SimBackend):
    """A backend that is not sim (a stand-in for metal): it keeps no log."""

    name = "elsewhere"


def test_log_true_runs_a_call_on_sim_and_says_so(monkeypatch):
    monkeypatch.setenv("MTWORK_LOG_PRINT", "0")
    register("elsewhere", _Elsewhere)
    try:
        kernel = mtwork.metal_kernel("redirected", ["a"], ["out"], """
            uint i = thread_position_in_grid.x;
            os_log_default.log("i=%u", i);
            out[i] = a[i];""", backend="elsewhere")
        _call(kernel, log=True)
        log = kernel.last_log
        assert len(log) == 8 and "run on sim for log=True: the elsewhere backend keeps no " \
                                 "log" in log.note and log.note in log.summary()
        with pytest.raises(ValueError, match="`log` must be True"):
            _call(kernel, log="yes")
    finally:
        unregister("elsewhere")


def test_a_kernel_without_logging_has_no_logging_code():
    plain = mtwork.metal_kernel("plain", ["a"], ["out"],
                                "out[thread_position_in_grid.x] = a[thread_position_in_grid.x];")
    logging = mtwork.metal_kernel("logging", ["a"], ["out"], """
        uint i = thread_position_in_grid.x;
        if (a[i] < 0.0f) os_log_default.log("negative at %u", i);
        out[i] = a[i];""")
    for kernel in (plain, logging):
        _call(kernel)
        assert kernel.last_engine.name == "loops" and len(kernel.last_log) == 0
    backend = SimBackend()
    programs = [k.program(k.generate([mx.zeros(8)], [mx.float32])) for k in (plain, logging)]
    libraries = [backend.compile(p).library.path for p in programs]
    if libraries[0].read_bytes()[:4] != b"\x7fELF":
        pytest.skip("reads ELF libraries")
    assert "mtw_log_message" not in undefined_symbols(libraries[0])
    assert "mtw_log_message" in undefined_symbols(libraries[1])
