"""The runtime under faults: every kind of fault many times in one process with correct
kernels after each, frames too big for a thread's stack, private arrays indexed outside
their bounds, writes far past the memory mtwork makes, exit(), the first fault stopping a
dispatch, the watchdog naming the threads still running, grids near 2**32 and the
watchdog's own settings.

Anything that could hang or crash the interpreter runs in a child interpreter with a
time limit (`run_isolated`)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.run import runtime

from .child import run_isolated

# The child's kernels: one correct kernel whose result is checked against numpy, and one
# faulting kernel per kind. `arg` is the value of a[0] each faulting kernel gets.
KERNELS = '''
import json, time
import mlx.core as mx
import numpy as np
import mtwork

TREE = mtwork.metal_kernel("tree_sum", ["inp"], ["out"], """
    threadgroup float partial[256];
    uint t = thread_position_in_threadgroup.x;
    partial[t] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.x] = partial[0];
""")
X = np.random.default_rng(1).integers(-50, 50, 4096).astype(np.float32)
EXPECTED = X.astype(np.float64).reshape(16, 256).sum(axis=1)

def correct() -> bool:
    out = TREE(inputs=[mx.array(X)], grid=(4096, 1, 1), threadgroup=(256, 1, 1),
               output_shapes=[(16,)], output_dtypes=[mx.float32])[0]
    return bool(np.array_equal(np.array(out), EXPECTED))

HELPER = """
template <int N>
float big_helper(uint t) {
    float scratch[N];
    for (int i = 0; i < N; ++i) scratch[i] = float(i + t);
    float s = 0;
    for (int i = 0; i < N; i += 97) s += scratch[i];
    return s;
}
"""
BARRIER_THEN = """
    uint t = thread_position_in_threadgroup.x;
    threadgroup float buf[64];
    buf[t] = a[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
"""
FAULTS = {
    "wild pointer": ("device float* p = (device float*)0x40; "
                     "out[0] = p[thread_position_in_grid.x * 1024];", "", 0.0),
    # A helper with a 280 KB private array while the other threads wait at a barrier.
    "big frame": (BARRIER_THEN + "if (t == 5) buf[t] = big_helper<70000>(t);"
                  "threadgroup_barrier(mem_flags::mem_threadgroup); out[t] = buf[t];",
                  HELPER, 0.0),
    "far below a private array": (BARRIER_THEN + "float priv[8] = {0}; int n = int(a[0]);"
                                  "for (int i = n; i < 8; i++) priv[i] = 1.0f;"
                                  "out[t] = priv[t % 8];", "", -200000.0),
    "far above a private array": (BARRIER_THEN + "float priv[8] = {0}; int n = int(a[0]);"
                                  "for (int i = 0; i < n; i++) priv[i] = 1.0f;"
                                  "out[t] = priv[t % 8];", "", 200000.0),
    # 256 KiB into a 256-byte output: past its page of slack, into its guard page (pages
    # of 4, 16 or 64 KiB).
    "far past an output": ("for (uint j = 0; j < 65536; ++j) out[j] = 1.0f;", "", 0.0),
    "integer division by zero": ("int d = int(a[0]); out[0] = float(7 / d);", "", 0.0),
    "trap": ("__builtin_trap();", "", 0.0),
    "exit": ("if (thread_position_in_grid.x == 9) exit(3); out[0] = 1;",
             "#include <stdlib.h>\\n", 0.0),
    "deadlock": ("if (simdgroup_index_in_threadgroup == 0) "
                 "threadgroup_barrier(mem_flags::mem_threadgroup);"
                 "else threadgroup_barrier(mem_flags::mem_device); out[0] = 1;", "", 0.0),
    "endless": ("volatile uint n = 0; while (a[0] < 1.0f) { n = n + 1; } out[0] = n;", "", 0.0),
}
KERNEL_OF = {kind: mtwork.metal_kernel(kind.replace(" ", "_"), ["a"], ["out"], body,
                                       header=header)
             for kind, (body, header, _) in FAULTS.items()}

def fault(kind: str) -> str:
    """Runs the faulting kernel; returns the exception's class name (or 'ran')."""
    arg = FAULTS[kind][2]
    try:
        mx.eval(KERNEL_OF[kind](inputs=[mx.array([arg], dtype=mx.float32)], grid=(64, 1, 1),
                                threadgroup=(64, 1, 1), output_shapes=[(64,)],
                                output_dtypes=[mx.float32], timeout=0.05))
    except mtwork.KernelFault as exc:
        return type(exc).__name__
    return "ran"
'''

EXPECTED_ERROR = {
    "wild pointer": "KernelFault",
    "big frame": "KernelFault",
    "far below a private array": "KernelFault",
    "far above a private array": "KernelFault",
    "far past an output": "KernelFault",
    "integer division by zero": "KernelFault",
    "trap": "KernelFault",
    "exit": "KernelFault",
    "deadlock": "KernelDeadlock",
    "endless": "KernelTimeout",
}


def test_twenty_faults_of_each_kind_then_correct_kernels() -> None:
    result = run_isolated(KERNELS + '''
outcomes = {kind: [] for kind in FAULTS}
correct_after = {kind: 0 for kind in FAULTS}
for _ in range(20):
    for kind in FAULTS:
        outcomes[kind].append(fault(kind))
        correct_after[kind] += correct()
print(json.dumps({"outcomes": outcomes, "correct_after": correct_after,
                  "correct_at_end": sum(correct() for _ in range(12))}))
''', timeout=240)
    for kind, expected in EXPECTED_ERROR.items():
        assert result["outcomes"][kind] == [expected] * 20, kind
        assert result["correct_after"][kind] == 20, kind
    assert result["correct_at_end"] == 12


def test_fault_messages_say_what_happened() -> None:
    result = run_isolated(KERNELS + '''
messages = {}
for kind in ("big frame", "far below a private array", "far above a private array", "exit"):
    try:
        mx.eval(KERNEL_OF[kind](inputs=[mx.array([FAULTS[kind][2]], dtype=mx.float32)],
                                grid=(64, 1, 1), threadgroup=(64, 1, 1),
                                output_shapes=[(64,)], output_dtypes=[mx.float32]))
    except mtwork.KernelFault as exc:
        messages[kind] = exc.detail
print(json.dumps(messages))
''', timeout=120)
    assert "stack overflow" in result["big frame"] and "256 KiB" in result["big frame"]
    assert "indexed far below its start" in result["far below a private array"]
    assert "above the thread's stack" in result["far above a private array"]
    assert result["exit"].startswith("exit(3) called in kernel code (")
    assert "thread_position_in_grid (9,0,0)" in result["exit"]


def test_small_negative_private_indices_are_harmless() -> None:
    # MLX's layer_norm pattern: tail threads loop `for (i = n; i < N_READS; i++)` with a
    # negative n, writing below their private array. On the GPU that lands in the
    # thread's own scratch; here in its own stack, below its frame.
    result = run_isolated(KERNELS + '''
tail = mtwork.metal_kernel("tail_fill", ["a"], ["out"], """
    uint t = thread_position_in_threadgroup.x;
    float priv[8] = {0};
    int n = int(a[0]) - int(t) * 8;
    for (int i = n; i < 8; i++) priv[i] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float s = 0;
    for (int i = 0; i < 8; ++i) s += priv[i];
    out[thread_position_in_grid.x] = s;
""")
out = tail(inputs=[mx.array([20.0], dtype=mx.float32)], grid=(256, 1, 1),
           threadgroup=(128, 1, 1), output_shapes=[(256,)], output_dtypes=[mx.float32])[0]
print(json.dumps({"out": np.array(out).tolist(), "correct": correct()}))
''', timeout=120)
    t = np.arange(256) % 128
    expected = 8 - np.clip(20 - 8 * t, 0, 8)  # slots from max(n, 0) to 7 are set
    assert result["out"] == expected.tolist()
    assert result["correct"]


def test_writes_far_past_the_memory_mtwork_makes_fault_and_leave_the_heap_whole() -> None:
    # In this process too, fresh outputs and the aligned copies of bound memory end at a
    # page of slack before a guard page: 256 KiB past either faults, instead of landing in
    # the Python heap (which glibc's allocator noticed later, or not at all). A program
    # that declares an aligned type runs on aligned copies of misaligned bound memory.
    result = run_isolated(KERNELS + '''
past = mtwork.metal_kernel("past_the_input", ["a"], ["out"], """
    device float* p = (device float*)a;
    for (uint j = 0; j < 65536; ++j) p[j] = 1.0f;
    out[0] = 1.0f;
""", header="struct alignas(16) Row { float4 v; };")
a = mx.arange(9, dtype=mx.float32)[1:]  # 4 bytes past an allocation: never 16-aligned
outcomes = []
for _ in range(20):
    try:
        mx.eval(past(inputs=[a], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                     output_shapes=[(8,)], output_dtypes=[mx.float32]))
        outcomes.append("ran")
    except mtwork.KernelFault as exc:
        outcomes.append(exc.detail.split(" at ")[0])
    outcomes.append(fault("far past an output"))
junk = [bytearray(64) for _ in range(100000)]  # the heap still allocates
print(json.dumps({"outcomes": sorted(set(outcomes)), "input": np.array(a).tolist(),
                  "correct": correct()}))
''', timeout=120)
    assert result["outcomes"] == ["KernelFault", "segmentation fault (invalid memory access)"]
    assert result["input"] == list(range(1, 9))  # a faulted kernel's copy is not settled
    assert result["correct"]


def test_first_fault_stops_the_dispatch_at_once() -> None:
    # Threadgroup 0 faults while every other threadgroup loops forever: the fault is
    # reported within moments, not when the watchdog's 60 s run out.
    result = run_isolated(KERNELS + '''
k = mtwork.metal_kernel("fault_and_loop", ["a"], ["out"], """
    if (threadgroup_position_in_grid.x == 0) {
        device float* p = (device float*)0x40;
        out[0] = p[thread_position_in_grid.x];
    }
    volatile uint n = 0;
    while (a[0] < 1.0f) { n = n + 1; }
    out[0] = n;
""")
start = time.monotonic()
try:
    mx.eval(k(inputs=[mx.zeros((1,))], grid=(64 * 32, 1, 1), threadgroup=(32, 1, 1),
              output_shapes=[(1,)], output_dtypes=[mx.float32], timeout=60))
    error = "ran"
except mtwork.KernelFault as exc:
    error = type(exc).__name__ + ": " + exc.detail
print(json.dumps({"error": error, "seconds": time.monotonic() - start,
                  "correct": correct()}))
''', timeout=50)
    assert result["error"].startswith("KernelFault: segmentation fault"), result["error"]
    assert result["seconds"] < 5
    assert result["correct"]


def test_timeout_names_the_threads_still_running_and_where() -> None:
    result = run_isolated(KERNELS + '''
from mtwork.backends.sim.run import runtime
k = mtwork.metal_kernel("one_spins", ["a"], ["out"], """
    uint t = thread_position_in_threadgroup.x;
    if (t == 3) { volatile uint n = 0; while (a[0] < 1.0f) { n = n + 1; } }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[0] = 1;
""")
try:
    mx.eval(k(inputs=[mx.zeros((1,))], grid=(64, 1, 1), threadgroup=(64, 1, 1),
              output_shapes=[(1,)], output_dtypes=[mx.float32], timeout=0.3))
    message = "ran"
except mtwork.KernelTimeout as exc:
    message = exc.detail
total, live = runtime.last_live_threads()
library = next(iter(runtime._libraries.values()))
print(json.dumps({"message": message, "total": total,
                  "live": [[t.thread, t.state, runtime.code_offset(library, t.pc)]
                           for t in live],
                  "correct": correct()}))
''', timeout=60)
    message = result["message"]
    assert "still running after 0.3 s" in message
    assert "thread (3, 0, 0) of threadgroup (0, 0, 0) running" in message
    assert "thread (0, 0, 0) of threadgroup (0, 0, 0) waiting at threadgroup_barrier" in message
    assert "4 started threads had not finished" in message and ".so+0x" in message
    assert result["total"] == 4  # threads 0-2 at the barrier, 3 spinning; 4-63 unstarted
    states = {tuple(thread): (state, offset) for thread, state, offset in result["live"]}
    assert states[(3, 0, 0)][0] == "running" and states[(3, 0, 0)][1] is not None
    assert states[(0, 0, 0)][0] == "waiting at threadgroup_barrier"
    assert states[(0, 0, 0)][1] == states[(1, 0, 0)][1]  # the same barrier
    assert result["correct"]


# --- grids near 2**32 --------------------------------------------------------------------

LAST_THREAD = mtwork.metal_kernel("last_thread", ["a"], ["out"], """
    if (thread_position_in_grid.x == 4294967294u) out[0] = float(threadgroups_per_grid.x);
""")


def test_grid_of_two_to_the_32_minus_one_runs_its_last_thread() -> None:
    out = LAST_THREAD(inputs=[mx.zeros((1,))], grid=(2**32 - 1, 1, 1),
                      threadgroup=(1024, 1, 1), output_shapes=[(1,)],
                      output_dtypes=[mx.float32], init_value=0)[0]
    assert out.item() == 2**22  # ceil((2**32 - 1) / 1024) threadgroups, the last one ran


@pytest.mark.parametrize("grid, axis", [((2**32 + 64, 1, 1), "x"), ((1, 2**33, 1), "y"),
                                        ((1, 1, 2**40), "z")])
def test_grid_dimension_past_metal_limit_is_refused(grid, axis) -> None:
    with pytest.raises(ValueError, match=rf"`grid` {axis} = {grid['xyz'.index(axis)]} .*"
                                         r"1 to 4294967295"):
        LAST_THREAD(inputs=[mx.zeros((1,))], grid=grid, threadgroup=(1, 1, 1),
                    output_shapes=[(1,)], output_dtypes=[mx.float32])


def test_geometry_is_checked_at_the_binding() -> None:
    library = runtime.KernelLibrary(path=None, handle=None, entry=0, entry_barrier_free=0)
    table = (runtime.ctypes.c_void_p * 1)()
    with pytest.raises(ValueError, match=r"grid\.x = -1"):
        runtime.dispatch(library, "k", table, (-1, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError, match=r"threadgroup \(32, 32, 2\) has 2048 threads"):
        runtime.dispatch(library, "k", table, (64, 64, 2), (32, 32, 2))
    with pytest.raises(TypeError, match="grid must be three integers"):
        runtime.dispatch(library, "k", table, (1.5, 1, 1), (1, 1, 1))


# --- the watchdog's settings -------------------------------------------------------------


@pytest.mark.parametrize("timeout, error, shown", [
    (math.nan, ValueError, "nan"), (math.inf, ValueError, "inf"), (-1, ValueError, "-1"),
    (0, ValueError, "0"), ("1", TypeError, "'1' \\(str\\)"), (True, TypeError, "True"),
])
def test_bad_timeout_is_refused(timeout, error, shown) -> None:
    with pytest.raises(error, match=rf"`timeout` must be a positive, finite number of "
                                    rf"seconds, got {shown}"):
        LAST_THREAD(inputs=[mx.zeros((1,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                    output_shapes=[(1,)], output_dtypes=[mx.float32], timeout=timeout)


@pytest.mark.parametrize("value", ["soon", "nan", "-3", "0", "inf"])
def test_bad_mtwork_timeout_is_refused(monkeypatch, value) -> None:
    monkeypatch.setenv("MTWORK_TIMEOUT", value)
    with pytest.raises(ValueError, match=rf"MTWORK_TIMEOUT must be a positive, finite number "
                                         rf"of seconds, got '{value}'"):
        runtime.default_timeout()


def test_mtwork_timeout_sets_the_default(monkeypatch) -> None:
    monkeypatch.setenv("MTWORK_TIMEOUT", "2.5")
    assert runtime.default_timeout() == 2.5
    monkeypatch.delenv("MTWORK_TIMEOUT")
    assert runtime.default_timeout() == runtime.DEFAULT_TIMEOUT_S
