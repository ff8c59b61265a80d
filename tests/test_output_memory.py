"""Large outputs reuse memory across calls. In this process: MLX's CPU allocator keeps 32
MiB of freed buffers by default, so without mtwork raising that limit every call with a
larger output faults its memory in anew (mtwork/buffers.py). Isolated: the output is a
block of the memory shared with the worker, which writes it in place (no copy into this
process's memory) and gets the same block back for the next call. Each case runs in a
fresh interpreter: the limit is process state."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.child import run_isolated

CALLS = '''
import json, resource
import mlx.core as mx
import mtwork
n = 1 << 24  # 64 MB of float32
k = mtwork.metal_kernel("fill_index", ["a"], ["out"],
                        "uint i = thread_position_in_grid.x; out[i] = float(i);")
{before}
faults = []
for _ in range(6):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    (out,) = k(inputs=[mx.zeros((1,))], grid=(n, 1, 1), threadgroup=(256, 1, 1),
               output_shapes=[(n,)], output_dtypes=[mx.float32], isolate={isolate})
    assert out[n - 1].item() == n - 1
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
    del out
print(json.dumps({{"faults": faults, "limit": mx.set_cache_limit(0)}}))
'''
PAGES = (1 << 26) // 4096


def test_repeated_large_outputs_reuse_memory() -> None:
    result = run_isolated(CALLS.format(before="", isolate=False), timeout=180)
    # The first call faults its output in; later ones reuse it (a few pages of slack
    # and bookkeeping remain).
    assert result["faults"][0] > PAGES // 2
    assert max(result["faults"][2:]) < PAGES // 20, result["faults"]
    assert result["limit"] >= 4 * (1 << 26)


ISOLATED_CALLS = '''
import json, resource
import mlx.core as mx
import numpy as np
import mtwork
from mtwork.backends import get
n = 1 << 24  # 64 MB of float32
k = mtwork.metal_kernel("fill_index", ["a"], ["out"],
                        "uint i = thread_position_in_grid.x; out[i] = float(i);")

def worker_faults():
    with open(f"/proc/{get('sim').worker_pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])  # minflt

faults, worker, addresses = [], [], []
for _ in range(6):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    (out,) = k(inputs=[mx.zeros((1,))], grid=(n, 1, 1), threadgroup=(256, 1, 1),
               output_shapes=[(n,)], output_dtypes=[mx.float32], isolate=True)
    mx.eval(out)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
    worker.append(worker_faults())
    addresses.append(np.array(out, copy=False).ctypes.data)
    assert out[n - 1].item() == n - 1
    del out
print(json.dumps({"faults": faults, "worker": worker, "addresses": addresses}))
'''


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_isolated_large_outputs_are_written_in_place_and_reused() -> None:
    result = run_isolated(ISOLATED_CALLS, timeout=180, env={"MTWORK_ISOLATE": "1"})
    # No call copies the 64 MB output into this process's memory (which would fault it
    # in at the first call, and cost a copy at every call) ...
    faults = result["faults"]
    assert faults[0] < PAGES // 4 and max(faults[1:]) < PAGES // 20, faults
    # ... and every later call gets the same block back, which the worker has faulted in.
    worker = result["worker"]
    assert max(b - a for a, b in zip(worker[1:], worker[2:])) < PAGES // 20, worker
    assert len(set(result["addresses"][1:])) == 1, result["addresses"]


def test_a_cache_limit_the_caller_set_stays() -> None:
    result = run_isolated(CALLS.format(before="mx.set_cache_limit(1 << 20)", isolate=False),
                          timeout=180)
    assert result["limit"] == 1 << 20
    assert min(result["faults"]) > PAGES // 2  # the caller's choice: memory anew each call
