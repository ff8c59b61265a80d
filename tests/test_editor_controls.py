"""The editor's controls beyond typing: Stop and cancel-on-edit end a running kernel at
once, the Sanitize toggle puts findings at their lines, the watchdog follows
$MTWORK_TIMEOUT, and the Sweep button samples the space within its budget, skips compile
error classes already seen, says what it needs and can be stopped."""

import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.editor import EditLoop, editor
from mtwork.errors import KernelCancelled
from mtwork.sweep.skipping import CompileErrorClasses, error_class
from mtwork.sweep.space import Config

N = 256

COPY = "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];\n"

# Spins for ever (the volatile counter keeps the compiler from assuming the loop ends):
# only a cancel (or the watchdog) ends it.
HANG = """\
volatile uint spins = 0;
while (inp[0] > -1.0f) { spins = spins + 1; }
out[thread_position_in_grid.x] = float(spins);
"""

# Each thread writes its slot, then reads its neighbour's without a barrier: a race.
RACY = """\
threadgroup float tile[64];
uint i = thread_position_in_threadgroup.x;
tile[i] = inp[thread_position_in_grid.x];
out[thread_position_in_grid.x] = tile[(i + 1) % 64];
"""


def kernel(source, name="controls"):
    return mtwork.metal_kernel(name=name, input_names=["inp"], output_names=["out"],
                               source=source)


def build_for(k):
    return lambda c: mtwork.Launch(k, grid=(N, 1, 1), threadgroup=(64, 1, 1),
                                   output_shapes=[(N,)], output_dtypes=[mx.float32])


def data():
    return [mx.arange(N, dtype=mx.float32)]


def copied(x):
    return np.asarray(x, np.float64)


def wait_for_phase(loop, phase, limit=120.0):
    start = time.monotonic()
    while loop.phase != phase:
        assert time.monotonic() - start < limit, f"never reached {phase!r}: {loop.phase!r}"
        time.sleep(0.02)


@pytest.fixture
def hanging():
    k = kernel(HANG, "controls_hang")
    return EditLoop(k, build_for(k), inputs=data(), oracle=copied, timeout=300,
                    bench_rounds=0)


def test_stop_ends_a_hung_kernel_at_once_and_the_next_run_works(hanging):
    hanging.submit()
    wait_for_phase(hanging, "running")
    time.sleep(0.3)
    stopped_at = time.monotonic()
    hanging.cancel()
    outcome = hanging.wait(30)
    assert time.monotonic() - stopped_at < 10  # the watchdog would wait 300 s
    assert outcome.status == "cancelled" and "cancelled" in outcome.message
    assert "stopped" in outcome.summary()
    hanging.set_source(COPY)
    assert hanging.run().status == "ok"


def test_an_edit_while_a_kernel_runs_stops_it(hanging):
    hanging.submit()
    wait_for_phase(hanging, "running")
    hanging.set_source(COPY)
    assert hanging.wait(30).status == "cancelled"
    assert hanging.run().status == "ok"


def test_cancel_stops_a_kernel_running_in_this_process():
    import threading

    from mtwork.backends import get

    k = kernel(HANG, "controls_hang_here")
    caught = []

    def call():
        try:
            mx.eval(k(inputs=data(), grid=(N, 1, 1), threadgroup=(64, 1, 1),
                      output_shapes=[(N,)], output_dtypes=[mx.float32], backend="sim",
                      isolate=False))
        except KernelCancelled as exc:
            caught.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 120
    while thread.is_alive() and time.monotonic() < deadline:
        get("sim").cancel()  # nothing to stop while it still compiles: try again
        thread.join(0.5)
    assert not thread.is_alive() and len(caught) == 1
    assert "cancelled" in str(caught[0])


def test_the_sanitize_toggle_puts_a_race_at_its_line():
    k = kernel(RACY, "controls_racy")
    loop = EditLoop(k, build_for(k), inputs=data(), bench_rounds=0)
    assert loop.run().status == "ran"
    loop.set_sanitize(True)
    outcome = loop.run()
    assert outcome.status == "unsafe" and not outcome.ok
    assert outcome.sanitizer is not None and outcome.sanitizer.errors >= 1
    lines = {(d.file, d.line) for d in outcome.diagnostics}
    assert ("source", 3) in lines or ("source", 4) in lines
    assert all(d.message.startswith("sanitizer: ") for d in outcome.diagnostics)
    assert "sanitizer: " in outcome.summary() and outcome.measurement is None
    loop.set_source(RACY.replace("tile[(i + 1) % 64]", "tile[i]"))
    clean = loop.run()
    assert clean.status == "ran" and clean.sanitizer is not None and clean.sanitizer.ok


def test_the_editor_sanitizer_report_sits_beside_the_result(tmp_path):
    k = kernel(RACY, "controls_racy_panel")
    ed = editor(k, build_for(k), inputs=data(), sanitize=True, bench_rounds=0, run=False)
    assert ed._sanitize_toggle.value is True
    ed.run()
    assert "Sanitizer:" in ed._result.value
    assert any(d["message"].startswith("sanitizer: ") for d in ed.code.diagnostics)
    ed._sanitize_toggle.value = False  # as a click: turns it off and runs again
    assert ed.wait(60).status == "ran" and ed.loop.sanitize is False


def test_the_watchdog_follows_mtwork_timeout(monkeypatch):
    k = kernel(COPY)
    monkeypatch.setenv("MTWORK_TIMEOUT", "7.5")
    assert EditLoop(k, build_for(k), inputs=data()).timeout == 7.5
    assert EditLoop(k, build_for(k), inputs=data(), timeout=3).timeout == 3
    monkeypatch.delenv("MTWORK_TIMEOUT")
    assert EditLoop(k, build_for(k), inputs=data()).timeout == 30.0
    monkeypatch.setenv("MTWORK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MTWORK_TIMEOUT.*'soon'"):
        EditLoop(k, build_for(k), inputs=data())


# --- the sweep button ---------------------------------------------------------------------

SCALED = """\
uint i = thread_position_in_grid.x;
static_assert(WIDTH != 3, "a width of 3 is not supported");
out[i] = inp[i] * float(WIDTH) / float(WIDTH);
"""
WIDE_SPACE = {"width": [1, 2, 3, 4, 5, 6], "tg": [16, 32, 64, 128]}


def scaled_build(k):
    return lambda c: mtwork.Launch(k, grid=(N, 1, 1), threadgroup=(c["tg"], 1, 1),
                                   template=[("WIDTH", c["width"])], output_shapes=[(N,)],
                                   output_dtypes=[mx.float32])


def scaled_editor(**options):
    k = kernel(SCALED, "controls_scaled")
    return editor(k, scaled_build(k), inputs=data(), oracle=copied, space=WIDE_SPACE,
                  bench_rounds=1, run=False, **options)


def test_a_sweep_within_budget_tries_every_value_of_every_knob():
    ed = scaled_editor(sweep_budget=8)
    assert ed._sweep_button.description == "Sweep (8 of 24 settings)"
    assert "Latin hypercube" in ed._sweep_button.tooltip
    result = ed.sweep()
    assert len(result.records) == 8
    for name, values in WIDE_SPACE.items():
        assert {r.config[name] for r in result.records} >= set(values[:4]), name
    again = ed.sweep()  # seeded: the same settings
    assert [dict(r.config) for r in again.records] == [dict(r.config) for r in result.records]


def test_a_sweep_skips_settings_of_a_compile_error_seen_twice():
    ed = scaled_editor(sweep_budget=None)
    result = ed.sweep()
    by_status = {}
    for r in result.records:
        by_status.setdefault(r.status, []).append(r)
    failed = by_status["compile_error"]
    skipped = by_status["skipped"]
    assert len(failed) == 2 and {r.config["width"] for r in failed} == {3}
    assert len(skipped) == 2 and {r.config["width"] for r in skipped} == {3}
    assert "width=3" in skipped[0].message and "not supported" in skipped[0].message
    assert len(by_status["ok"]) == 20
    assert result.counts()["skipped"] == 2


def test_one_compile_error_skips_nothing_and_classes_ignore_locations():
    classes = CompileErrorClasses()
    classes.add(Config({"a": 1, "b": 2}), "source:3:4: error: no member named 'x'")
    assert classes.reason({"a": 1, "b": 3}) is None
    classes.add(Config({"a": 1, "b": 4}), "source:9:1: error: no member named 'x'")
    assert "a=1" in classes.reason({"a": 1, "b": 5})
    assert classes.reason({"a": 2, "b": 2}) is None
    assert error_class("x\nsource:1:2: error: bad\n") == "error: bad"


def test_the_sweep_button_without_knobs_says_what_it_needs():
    k = kernel(COPY)
    ed = editor(k, build_for(k), inputs=data(), run=False)
    assert ed._sweep_button.disabled and ed._sweep_button.description == "Sweep (no knobs)"
    assert "space=" in ed._sweep_hint.value and "space=" in ed._sweep_button.tooltip
    with pytest.raises(ValueError, match="space="):
        ed.sweep()


def test_stop_ends_a_sweep_and_keeps_what_finished():
    # The last width hangs: only Stop ends this sweep.
    source = SCALED.replace("out[i] =", "volatile uint n = 0;\n"
                            "while (WIDTH == 6 && inp[0] > -1.0f) { n = n + 1; }\nout[i] =")
    k = kernel(source, "controls_sweep_hang")
    ed = editor(k, scaled_build(k), inputs=data(), oracle=copied, space=WIDE_SPACE,
                bench_rounds=1, timeout=300, sweep_budget=None, run=False)
    future = ed.loop.submit_sweep()
    deadline = time.monotonic() + 300
    while not future.done() and time.monotonic() < deadline:
        time.sleep(1.0)
        if ed.loop.phase == "sweeping":
            ed.cancel()  # repeated: it ends the run it finds; the hang is the last one
    result = future.result(60)
    assert result.stopped == "interrupted"
    assert len(result.records) < 24
    assert all(r.error_type != "KernelCancelled" for r in result.records)


def test_sanitize_report_mode_keeps_the_report_without_raising_or_warning():
    import warnings

    k = kernel(RACY, "controls_racy_report")
    launch = build_for(k)(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(*data(), backend="sim", sanitize="report")
    assert launch.sanitizer_report is not None and not launch.sanitizer_report.ok
    with pytest.raises(ValueError, match="'report'"):
        launch(*data(), backend="sim", sanitize="loud")
