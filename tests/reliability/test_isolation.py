"""Nothing a kernel does takes the caller down: crashes, heap-corrupting writes, exit(),
abort() and hangs end in a Python exception naming the kernel, and correct kernels run
right after, many times over. Each test runs in a subprocess with a time limit."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .child import REPO, run_snippet

PRELUDE = """
import json, time, threading
import mlx.core as mx, numpy as np, mtwork

def kernel(body, name="bad", header=""):
    return mtwork.metal_kernel(name, ["inp"], ["out"], body, header=header)

def call(k, n=8, **kw):
    x = mx.arange(n, dtype=mx.float32)
    out = k(inputs=[x], grid=(n, 1, 1), threadgroup=(min(n, 32), 1, 1),
            output_shapes=[(n,)], output_dtypes=[mx.float32], **kw)[0]
    mx.eval(out)  # the kernel runs when MLX evaluates its output
    return out

GOOD = kernel("uint i = thread_position_in_grid.x; out[i] = inp[i] * 2.0f;", name="good")

def good_ok(n=64):
    return bool(np.array_equal(np.array(call(GOOD, n)), 2 * np.arange(n)))
"""

FAULTS = {
    "heap-corrupting write": "uint i = thread_position_in_grid.x;\n"
                             "for (uint k = 0; k < 4096; ++k) out[i * 4096 + k] = 1.0f;",
    "exit": "exit(3);",
    "abort": "abort();",
    "wild pointer": "*((device float*)0x10) = 1.0f;",
    "trap": "__builtin_trap();",
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_twenty_times_then_correct_kernels(fault):
    body = json.dumps(FAULTS[fault])
    result = run_snippet(PRELUDE + f"""
bad = kernel({body}, header="#include <stdlib.h>\\n")
kinds = []
for _ in range(20):
    try:
        call(bad)
        kinds.append("no error")
    except mtwork.KernelFault as e:
        assert e.kernel == "bad", e
        kinds.append(type(e).__name__)
    assert good_ok(), "a correct kernel went wrong after a fault"
print(json.dumps(kinds))
""", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    kinds = json.loads(result.stdout.strip().splitlines()[-1])
    assert kinds == ["KernelFault"] * 20


def test_a_worker_that_never_answers_is_ended_after_its_grace():
    result = run_snippet(PRELUDE + """
stuck = kernel("usleep(100000000); out[0] = 1.0f;", name="stuck",
               header="#include <unistd.h>\\n")
start = time.monotonic()
try:
    call(stuck, timeout=1.0)
    print("no error")
except mtwork.KernelTimeout as e:
    print(type(e).__name__, round(time.monotonic() - start, 1))
assert good_ok()
""", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    kind, seconds = result.stdout.split()
    assert kind == "KernelTimeout" and float(seconds) < 10


def test_cancel_from_another_thread_ends_a_running_kernel_at_once():
    result = run_snippet(PRELUDE + """
from mtwork.backends import get
loop = kernel("while (true) {}", name="spin")
done = threading.Event()

def stop():  # a cancel stops what runs: repeat it until the kernel has started
    while not done.wait(0.5):
        get("sim").cancel()

threading.Timer(1.0, stop).start()
start = time.monotonic()
try:
    call(loop, timeout=60)
except mtwork.KernelCancelled as e:
    print(type(e).__name__, round(time.monotonic() - start, 1))
finally:
    done.set()
assert good_ok()
""", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    kind, seconds = result.stdout.split()
    assert kind == "KernelCancelled" and float(seconds) < 30  # the watchdog: 60 s


def test_threads_calling_at_once_each_get_their_own_results():
    result = run_snippet(PRELUDE + """
k = kernel("uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;", name="plus")
results = {}
def work(t):
    n = 32 * (t + 1)
    results[t] = all(np.array_equal(np.array(call(k, n)), np.arange(n) + 1)
                     for _ in range(20))
threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
""", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == {str(t): True for t in range(4)}


def test_a_notebook_with_faulting_cells_runs_to_its_end(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    cells = [PRELUDE,
             'call(kernel("exit(3);", header="#include <stdlib.h>\\n"))',
             'call(kernel("uint i = thread_position_in_grid.x;\\n'
             'for (uint k = 0; k < 4096; ++k) out[i * 4096 + k] = 1.0f;"))',
             "assert good_ok()\nprint('after the faults')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o.get("ename") for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert errors == ["KernelFault", "KernelFault"]
    assert "after the faults" in nb.cells[-1].outputs[0]["text"]


def test_ctrl_c_ends_a_running_kernel_at_once_and_the_next_call_runs():
    code = PRELUDE + """
import sys
loop = kernel("while (true) {}", name="spin")
call(GOOD)  # the worker is up
print("ready", flush=True)
start = time.monotonic()
try:
    call(loop, timeout=60)
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - start, 1), flush=True)
print("good" if good_ok() else "bad", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = out.split("\n")
    assert lines[0].startswith("interrupted"), err[-2000:]
    assert float(lines[0].split()[1]) < 5
    assert lines[1] == "good"


def test_the_watchdog_follows_the_callers_environment_not_the_workers():
    # A worker keeps the environment it was started with; MTWORK_TIMEOUT is read by the
    # caller at each call.
    result = run_snippet(PRELUDE + """
import os
HANG = kernel("volatile uint n = 0; while (inp[0] > -1.0f) { n = n + 1; } out[0] = n;",
              name="hang")
os.environ["MTWORK_TIMEOUT"] = "soon"
try:
    call(GOOD)
    started_bad = "no error"
except ValueError as e:
    started_bad = str(e)
os.environ.pop("MTWORK_TIMEOUT")
after = good_ok()
os.environ["MTWORK_TIMEOUT"] = "0.5"
t = time.monotonic()
try:
    call(HANG)
    stopped = "no error"
except mtwork.KernelTimeout:
    stopped = time.monotonic() - t
print(json.dumps([started_bad, after, stopped]))
""", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    started_bad, after, stopped = json.loads(result.stdout.strip().splitlines()[-1])
    assert "MTWORK_TIMEOUT" in started_bad and "'soon'" in started_bad
    assert after is True
    assert isinstance(stopped, float) and stopped < 20


def test_a_worker_that_died_is_replaced_at_once():
    """A kernel that kills its process: the fault names the kernel, and the next worker is
    already starting when the caller gets it (it imports while the caller looks)."""
    result = run_snippet(PRELUDE + """
from mtwork.backends import get
sim = get("sim")
assert good_ok()
first = sim.worker_pid
try:
    call(kernel("raise(9);", header="#include <signal.h>\\n"))
except mtwork.KernelFault as e:
    assert e.kernel == "bad", e
replaced = sim.worker_pid
print(json.dumps([first, replaced, good_ok(), sim.worker_pid]))
""", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    first, replaced, ok, used = json.loads(result.stdout.strip().splitlines()[-1])
    assert first and replaced and first != replaced
    assert ok and used == replaced
