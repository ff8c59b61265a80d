"""clang sessions (mtwork/clang_sessions.py): one clang front end reading many units gives
each the result clang alone gives it, whatever came before it in the session."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import mtwork
from mtwork import clang_sessions
from mtwork.toolchain import run_clang_front_end

ARGS = ["-x", "c++", "-fsyntax-only", "-fno-color-diagnostics", "-Wno-everything"]

# Each unit's code is a header of its own, so that clang names the same file either way.
UNITS = {
    "clean": "int f() { return 0; }\n",
    # A pragma left in force: within its session it must end with its unit.
    "pragma": '#pragma clang diagnostic error "-Wunused-value"\nvoid f() {}\n',
    "after the pragma": "void f() { 1 + 1; }\n",
    "error": "int f() { return undeclared; }\n",
    "clean again": "int f() { return 1; }\n",
    # A fatal error silences clang for the rest of its run.
    "fatal": '#include "no-such-header.h"\n',
    "after the fatal error": "int f() { return undeclared_too; }\n",
}


def diagnostics(stderr: str, folder: Path) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(str(folder))]


@pytest.fixture(autouse=True)
def no_sessions_left():
    clang_sessions.close_sessions()
    yield
    clang_sessions.close_sessions()


def test_each_unit_reads_as_clang_alone_reads_it(tmp_path):
    taken = {}
    for name, code in UNITS.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        (folder / "code.h").write_text(code)
        unit = f'#include "{folder / "code.h"}"\n'
        (folder / "unit.cpp").write_text(unit)
        alone = run_clang_front_end(ARGS, [], folder / "unit.cpp", name)
        shared = clang_sessions.run(ARGS, [], unit, folder)
        assert shared is not None, name
        result, taken[name] = shared
        assert result.returncode == alone.returncode, name
        assert diagnostics(result.stderr, folder) == diagnostics(alone.stderr, folder), name
    assert "undeclared identifier 'undeclared_too'" in result.stderr
    # A unit clang found something in ends its session, and stays its caller's.
    assert taken == {"clean": True, "pragma": True, "after the pragma": True, "error": False,
                     "clean again": True, "fatal": False, "after the fatal error": False}
    clang_sessions.close_sessions()
    assert not (tmp_path / "clean").exists() and (tmp_path / "error").exists()


def test_a_changed_file_it_depends_on_ends_the_session(tmp_path):
    header = tmp_path / "depends.h"
    header.write_text("// one\n")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert clang_sessions.run(ARGS, [], "int f();\n", first, depends=[header])[1]
    assert first.exists()
    before = header.stat().st_mtime_ns
    header.write_text("// two\n")
    os.utime(header, ns=(before + 10**9, before + 10**9))  # whatever the clock's grain
    assert clang_sessions.run(ARGS, [], "int f();\n", second, depends=[header])[1]
    # The second unit went to a new session: the first one ended, with its folders.
    assert not first.exists() and second.exists()


KERNEL = """
#include <metal_stdlib>
using namespace metal;
void scale(device float* p, float s) {{ *p *= s; }}
[[kernel]] void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {{
  threadgroup float tile[8];
  tile[i % 8] = float(i);
  {body}
}}
// {tag}
"""
BODIES = {
    "clean": "scale(out + i, tile[i % 8]);",
    "threadgroup to device": "scale(tile, 2.0f);",
    "clean again": "out[i] = tile[i % 8];",
    "thread to device": "float x = 1.0f;\n  scale(&x, 2.0f);",
}


def test_the_metal_check_finds_the_same_in_a_session_and_alone(monkeypatch):
    from mtwork.backends.sim.compile import frontend

    def found(tag: str) -> list[tuple]:
        out = []
        for body in BODIES.values():
            program = mtwork.load_metal(KERNEL.format(body=body, tag=tag)).kernel("k").program
            out.append([(v.rule, v.file, v.line, v.column, v.message)
                        for v in frontend.violations(program)])
        return out

    used = []
    run = clang_sessions.run

    def counted(*args, **kwargs):
        shared = run(*args, **kwargs)
        used.append(shared is not None)
        return shared

    monkeypatch.setattr(clang_sessions, "run", counted)
    in_sessions = found(f"in sessions {uuid.uuid4()}")  # a text never checked before
    assert used and all(used)
    monkeypatch.setattr(clang_sessions, "run", lambda *args, **kwargs: None)
    assert in_sessions == found(f"alone {uuid.uuid4()}")
    assert [bool(v) for v in in_sessions] == [False, True, False, True]


def _unit_in_a_fork(folder: str) -> bool:
    shared = clang_sessions.run(ARGS, [], "int f();\n", Path(folder))
    return shared is not None and shared[0].returncode == 0


def test_a_forked_process_leaves_its_parents_session_alone(tmp_path):
    import multiprocessing

    first, second, forked = tmp_path / "first", tmp_path / "second", tmp_path / "forked"
    for folder in (first, second, forked):
        folder.mkdir()
    assert clang_sessions.run(ARGS, [], "int f();\n", first)[1]
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_unit_in_a_fork, (str(forked),))
    # The parent's session goes on: it takes the next unit, and still holds the first's.
    assert clang_sessions.run(ARGS, [], "int g();\n", second)[1]
    assert first.exists()


def test_a_header_each_unit_includes_is_read_by_each(tmp_path):
    # `#pragma once` and include guards are a unit's own: the next unit reads them again.
    (tmp_path / "once.h").write_text("#pragma once\nint g();\n")
    (tmp_path / "guarded.h").write_text("#ifndef GUARDED\n#define GUARDED\nint h();\n#endif\n")
    unit = (f'#include "{tmp_path / "once.h"}"\n#include "{tmp_path / "guarded.h"}"\n'
            "int f() { return g() + h(); }\n")
    for name in ("first", "second", "third"):
        (tmp_path / name).mkdir()
        result, taken = clang_sessions.run(ARGS, [], unit, tmp_path / name)
        assert (result.returncode, result.stderr, taken) == (0, "", True), name
