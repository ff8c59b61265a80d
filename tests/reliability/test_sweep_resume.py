"""A sweep killed outright (SIGKILL, no chance to clean up) keeps every configuration it
finished, and the same sweep started again resumes from its cache file."""

import json
import signal
import subprocess
import sys
import time

from .child import REPO, run_snippet

SWEEP = """
import json, sys, time
import mtwork

def build(c):
    def run():
        time.sleep(0.3)
        return [float(c["a"] * 10 + c["b"])]
    return run

result = mtwork.sweep(build, {"a": [0, 1, 2, 3], "b": [0, 1]}, cache=sys.argv[1], key="v1",
                      rounds=1, warmup=0, progress=False)
print(json.dumps({"cached": sum(r.cached for r in result.records),
                  "configs": [[r.config["a"], r.config["b"]] for r in result.records],
                  "ok": [r.ok for r in result.records]}))
"""


def _entries(cache):
    """The whole entries of a cache file (a line cut short by the kill is not one)."""
    out = []
    for line in cache.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def test_a_killed_sweep_resumes_from_its_cache_file(tmp_path):
    cache = tmp_path / "sweep.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(cache)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                 "HOME": str(tmp_path)})
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if cache.exists() and len(cache.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    finished = _entries(cache)
    assert 3 <= len(finished) < 8
    result = run_snippet(SWEEP.replace("sys.argv[1]", repr(str(cache))), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = json.loads(result.stdout.strip().splitlines()[-1])
    assert resumed["cached"] >= len(finished)
    assert sorted(map(tuple, resumed["configs"])) == [(a, b) for a in range(4) for b in range(2)]
    assert all(resumed["ok"])
    keys = [entry["key"] for entry in _entries(cache)]
    assert len(keys) == len(set(keys)) == 8  # nothing run twice
