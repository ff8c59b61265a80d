"""Large outputs reuse memory across calls: MLX's CPU allocator keeps 32 MiB of freed
buffers by default, so without mtwork raising that limit every call with a larger output
faults its memory in anew (mtwork/buffers.py). Each case runs in a fresh interpreter: the
limit is process state."""

from __future__ import annotations

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


@pytest.mark.parametrize("isolate", [False, True])
def test_repeated_large_outputs_reuse_memory(isolate: bool) -> None:
    result = run_isolated(CALLS.format(before="", isolate=isolate), timeout=180)
    # The first call faults its output in; later ones reuse it (a few pages of slack
    # and bookkeeping remain).
    assert result["faults"][0] > PAGES // 2
    assert max(result["faults"][2:]) < PAGES // 20, result["faults"]
    assert result["limit"] >= 4 * (1 << 26)


def test_a_cache_limit_the_caller_set_stays() -> None:
    result = run_isolated(CALLS.format(before="mx.set_cache_limit(1 << 20)", isolate=False),
                          timeout=180)
    assert result["limit"] == 1 << 20
    assert min(result["faults"]) > PAGES // 2  # the caller's choice: memory anew each call
