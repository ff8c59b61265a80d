"""The live MSL editor without a browser: diagnostics, knobs, the compile-run-check loop
(in the foreground and on its background thread), the widgets' side of it, saving, the
sweep button, and the static copy an exported notebook shows."""

import threading
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.editor import EditLoop, Knobs, editor, parse_diagnostics
from mtwork.editor.background import Worker

N = 1024

BODY = """\
// Each thread doubles EPT consecutive elements.
const uint first = thread_position_in_grid.x * EPT;
for (uint k = 0; k < EPT; ++k) {
    out[first + k] = twice(inp[first + k]);
}
"""

HEADER = """\
template <typename T>
T twice(T x) {
    return x * T(2);
}
"""

SPACE = {"ept": [1, 2, 4], "tg": [32, 64, 128, 512]}
CONSTRAINTS = [mtwork.divides("tg * ept", N)]


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "scale.metal").write_text(BODY)
    (tmp_path / "scale.h").write_text(HEADER)
    return mtwork.KernelSpec(name="editor_scale", source="scale.metal", header="scale.h",
                             input_names=["inp"], output_names=["out"], folder=tmp_path)


def doubled(x):
    return 2 * np.asarray(x, np.float64)


def make_build(spec, defines=None):
    def build(c):
        return mtwork.Launch(
            spec.kernel(), grid=(N // c["ept"], 1, 1), threadgroup=(c["tg"], 1, 1),
            template=[("T", mx.float32), ("EPT", c["ept"])], defines=defines,
            output_shapes=[(N,)], output_dtypes=[mx.float32])
    return build


def inputs():
    return [mx.arange(N, dtype=mx.float32) - 100]


@pytest.fixture
def ed(spec):
    return editor(spec, make_build(spec), inputs=inputs(), oracle=doubled, space=SPACE,
                  constraints=CONSTRAINTS, bench_rounds=2, debounce=0.2, run=False)


def broken(text, old, new):
    assert old in text
    return text.replace(old, new, 1)


# --- diagnostics and knobs ----------------------------------------------------------------


def test_compiler_text_becomes_located_diagnostics():
    message = (
        "In file included from x.cpp:1:\n"
        "header:3:14: error: use of undeclared identifier 'y'\n"
        "    3 |     return y * T(2);\n"
        "source:4:43: fatal error: expected ';' after expression\n"
        "source:2:7: note: declared here\n"
        "<generated>:80:1: error: something in the wrapper\n"
    )
    found = parse_diagnostics(message, header_shift=2)
    assert [(d.file, d.line, d.col, d.severity) for d in found] == [
        ("header", 1, 14, "error"), ("source", 4, 43, "error"), ("source", 2, 7, "note")]
    assert found[1].message == "expected ';' after expression"
    assert str(found[2]) == "source:2:7: note: declared here"


def test_knobs_offer_only_values_some_valid_setting_has():
    knobs = Knobs({"tg": [32, 64, 2048], "ept": [1, 2]}, ["tg * ept <= 1024"])
    assert knobs.allowed("tg") == [32, 64]
    assert dict(knobs.config) == {"tg": 32, "ept": 1}


def test_turning_a_knob_moves_the_others_to_the_nearest_valid_setting():
    knobs = Knobs(SPACE, CONSTRAINTS, {"tg": 512})
    assert dict(knobs.config) == {"ept": 1, "tg": 512}
    # ept=4 needs tg*4 to divide 1024: tg moves one step down, ept stays where asked.
    assert dict(knobs.set("ept", 4)) == {"ept": 4, "tg": 128}
    assert dict(knobs.set("tg", 32)) == {"ept": 4, "tg": 32}
    with pytest.raises(mtwork.SweepError, match="not in the space"):
        knobs.set("tg", 96)
    with pytest.raises(mtwork.SweepError, match="unknown knob"):
        knobs.set("threads", 32)


def test_a_space_no_setting_of_which_is_valid_is_refused():
    with pytest.raises(mtwork.SweepError, match="no setting"):
        Knobs({"tg": [32, 64]}, ["tg > 64"])


# --- the loop -----------------------------------------------------------------------------


def test_a_correct_kernel_passes_and_is_timed_on_the_emulator_clock(ed):
    outcome = ed.run()
    assert outcome.status == "ok", outcome.message
    assert [d.name for d in outcome.diffs] == ["out"] and outcome.diffs[0].ok
    assert outcome.diffs[0].max_abs_err == 0
    assert outcome.measurement is not None and outcome.measurement.rounds == 2
    assert outcome.measurement.clock.label.startswith("emulator")
    assert "PASS" in outcome.summary() and "emulator" in outcome.summary()
    assert ed.last_good is outcome


def test_a_correct_run_shows_its_modelled_time_and_bound(ed, spec):
    outcome = ed.run()
    chip = mtwork.gpu.default_gpu()
    assert outcome.estimate is not None and outcome.estimate.chip == chip.label
    counters = mtwork.profile(ed.loop.launch(), *inputs())
    assert outcome.estimate.seconds == mtwork.gpu.estimate(counters, chip).seconds
    assert f"on {chip.label}, {outcome.estimate.bound}-bound" in outcome.summary()
    assert f"modelled on {chip.label}" in ed.snapshot().html
    plain = editor(spec, make_build(spec), inputs=inputs(), oracle=doubled, space=SPACE,
                   constraints=CONSTRAINTS, gpu=False, bench_rounds=1, run=False)
    unmodelled = plain.run()
    assert unmodelled.ok and unmodelled.estimate is None
    assert "modelled" not in unmodelled.summary()


def test_a_compile_error_is_located_and_leaves_the_buffer_and_last_result(ed):
    good = ed.run()
    text = broken(BODY, "twice(inp[first + k]);", "twice(inp[first + k])")
    ed.set_source(text)
    outcome = ed.run()
    assert outcome.status == "compile_error"
    assert "source:4:" in outcome.message
    errors = [d for d in outcome.diagnostics if d.severity == "error"]
    assert (errors[0].file, errors[0].line) == ("source", 4)
    assert ed.source == text  # nothing rewrote what was typed
    assert ed.last_good is good
    assert ed.code.diagnostics[0]["line"] == 4 and ed.code.status == "compile_error"
    assert "Compile error" in ed._errors.value and "source:4:" in ed._errors.value
    # the panel keeps showing the last result, and says so
    assert f"showing run #{good.number}" in ed._result.value and "PASS" in ed._result.value


def test_an_error_in_the_header_is_located_in_the_header(ed):
    ed.set_header(broken(HEADER, "return x * T(2);", "return y * T(2);"))
    outcome = ed.run()
    assert outcome.status == "compile_error"
    assert [(d.file, d.line) for d in outcome.diagnostics if d.severity == "error"] == [
        ("header", 3)]


def test_header_lines_stay_the_authors_when_the_launch_defines_constants(spec):
    loop = EditLoop(spec, make_build(spec, defines={"A": 1, "B": 2}), inputs=inputs(),
                    knobs=Knobs(SPACE, CONSTRAINTS), bench_rounds=0)
    loop.set_header(broken(HEADER, "return x * T(2);", "return y * T(2);"))
    outcome = loop.run()
    assert [(d.file, d.line) for d in outcome.diagnostics if d.severity == "error"] == [
        ("header", 3)]


def test_a_wrong_result_shows_the_failing_diff(ed):
    ed.set_header(broken(HEADER, "T(2)", "T(3)"))
    outcome = ed.run()
    assert outcome.status == "wrong"
    assert not outcome.diffs[0].ok and outcome.diffs[0].n_mismatch == N - 1  # 0 * 3 == 0 * 2
    assert outcome.measurement is None
    assert "FAIL" in ed._result.value


def test_a_kernel_fault_is_an_outcome_and_the_buffer_survives(ed):
    text = broken(BODY, "const uint first", "if (thread_position_in_grid.x == 5) "
                  "__builtin_trap();\nconst uint first")
    ed.set_source(text)
    outcome = ed.run()
    assert outcome.status == "fault", outcome.message
    assert "faulted" in outcome.message
    assert ed.source == text
    assert "Kernel fault" in ed._errors.value


def test_a_build_that_raises_is_an_outcome(spec):
    def build(c):
        raise ValueError("no such launch")

    outcome = EditLoop(spec, build, inputs=inputs(), knobs=Knobs(SPACE, CONSTRAINTS)).run()
    assert outcome.status == "error" and "ValueError: no such launch" in outcome.message


def test_compile_checks_without_running(ed):
    assert ed.compile().status == "compiled"
    ed.set_source(broken(BODY, "EPT;", "EPT"))
    assert ed.compile().status == "compile_error"


def test_a_family_kernel_by_name():
    gguf = mtwork.load_family("gguf")
    weights = gguf.sample_weights(2, 256)
    packed = mx.array(gguf.FORMATS["q8_0"].quantize(weights))
    expected = gguf.FORMATS["q8_0"].dequantize(np.array(packed))
    ed = editor("gguf/q8_0", lambda c: gguf.launch("q8_0", packed, **c), oracle=[expected],
                space={"elems_per_thread": [1, 4, 32], "threadgroup": [32, 64]},
                bench_rounds=0, run=False)
    assert ed.source == gguf.KERNELS["q8_0"].read_source()
    outcome = ed.run()
    assert outcome.status == "ok", outcome.message
    with pytest.raises(ValueError, match="has no kernel"):
        editor("gguf/q9_0", lambda c: None, run=False)


# --- in the background --------------------------------------------------------------------


def test_the_worker_runs_the_newest_job_and_cancels_replaced_ones():
    worker = Worker()
    started, release, ran = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(5)
        ran.append("slow")

    first = worker.submit(slow)
    started.wait(5)
    replaced = worker.submit(lambda: ran.append("replaced"))
    newest = worker.submit(lambda: ran.append("newest"))
    release.set()
    assert worker.wait(5)
    assert ran == ["slow", "newest"]
    assert replaced.cancelled() and first.done() and newest.done()


def test_later_debounces_a_burst_into_one_job():
    worker, ran = Worker(), []
    for i in range(5):
        worker.later(0.1, lambda i=i: ran.append(i))
        time.sleep(0.02)
    assert worker.busy
    assert worker.wait(5)
    assert ran == [4]


def test_typing_in_the_browser_runs_once_after_a_pause_without_blocking(ed):
    text = broken(BODY, "twice(inp[first + k]);", "twice(inp[first + k])")
    start = time.perf_counter()
    for end in range(len(text) - 5, len(text) + 1):  # keystrokes, as the frontend syncs them
        ed.code.source = text[:end]
    assert time.perf_counter() - start < 0.5  # nothing compiled in the foreground
    outcome = ed.wait(60)
    assert outcome.number == 1  # one run for the whole burst, of the final text
    assert outcome.source == text and outcome.status == "compile_error"
    assert ed.code.diagnostics and ed.code.diagnostics[0]["line"] == 4
    ed.code.source = BODY  # the fix
    assert ed.wait(60).status == "ok"
    assert ed.code.diagnostics == [] and ed._errors.value == ""


def test_setting_the_source_from_python_updates_the_view_and_does_not_run(ed):
    ed.set_source(BODY + "// more\n")
    assert ed.code.source == BODY + "// more\n"
    assert not ed.loop.worker.busy and ed.last is None


def test_run_and_save_messages_from_the_frontend(ed, spec):
    ed.code.source = BODY.replace("Each thread", "Every thread")
    ed._on_message(ed.code, {"type": "run"}, [])
    assert ed.wait(60).status == "ok"
    assert ed.code.dirty
    ed._on_message(ed.code, {"type": "save"}, [])
    assert spec.source_path.read_text().startswith("// Every thread")
    assert spec.header_path.read_text() == HEADER and not ed.code.dirty


def test_a_knob_turned_in_the_browser_reruns_with_the_new_setting(ed):
    ed._knobs["ept"].value = 2  # index of ept=4 in the slider's options
    outcome = ed.wait(60)
    assert outcome.status == "ok" and outcome.config == {"ept": 4, "tg": 32}
    ed._knobs["tg"].value = 3  # tg=512 needs ept=1 or 2: ept moves one step
    outcome = ed.wait(60)
    assert outcome.config == {"ept": 2, "tg": 512}
    assert ed._knobs["ept"].value == 1  # the other slider followed


def test_set_knob_from_python_moves_the_sliders(ed):
    ed.set_knob("tg", 128)
    assert ed._knobs["tg"].label == "128" and not ed.loop.worker.busy


# --- files, sweeps and the static copy ----------------------------------------------------


def test_save_writes_only_changed_files_and_revert_restores(ed, spec):
    ed.set_header(HEADER + "// note\n")
    assert ed.save() == [spec.header_path]
    assert spec.header_path.read_text() == HEADER + "// note\n"
    assert ed.save() == []
    ed.set_source("garbage")
    ed.revert()
    assert ed.source == BODY and ed.code.source == BODY


def test_the_sweep_button_sweeps_the_edited_kernel_and_plots(ed):
    ed.set_header(broken(HEADER, "T(2)", "(T(1) + T(1))"))  # same result, edited text
    ed.sweep_budget = 4
    ed._sweep_button.click()
    ed.wait(120)
    result = ed.loop.last_sweep
    assert len(result.records) == 4 and all(r.ok for r in result.records)
    assert result.clock.label.startswith("emulator")
    # ranked by the model on sim, as mtwork.sweep ranks
    assert result.objective == "modelled" and all(r.estimate for r in result.records)
    assert [r.modelled for r in result.ranked()] == sorted(r.modelled for r in result.records)
    assert "bound" in ed._sweep_out.outputs[0]["data"]["text/plain"]
    kinds = [set(o["data"]) for o in ed._sweep_out.outputs]
    assert "text/html" in kinds[0] and "application/vnd.plotly.v1+json" in kinds[1]
    assert ed._sweep_button.description == "Sweep (11 settings)"


def test_the_sweep_of_a_broken_edit_records_compile_errors(ed):
    ed.set_source(broken(BODY, "EPT;", "EPT"))
    result = ed.sweep(budget=2)
    assert [r.status for r in result.records] == ["compile_error", "compile_error"]


def test_a_sweep_that_cannot_start_says_why_in_its_panel(spec):
    def oracle(x):
        raise RuntimeError("no reference today")

    ed = editor(spec, make_build(spec), inputs=inputs(), oracle=oracle, space=SPACE,
                constraints=CONSTRAINTS, run=False)
    ed._sweep_button.click()
    ed.wait(60)
    shown = ed._sweep_out.outputs[0]["data"]["text/plain"]
    assert shown.startswith("sweep failed: OracleError") and "no reference today" in shown


def test_the_snapshot_has_the_numbered_source_the_errors_and_the_last_diff(ed):
    ed.run()
    ed.set_source(broken(BODY, "twice(inp[first + k]);", "twice(inp[first + k])"))
    ed.run()
    html = ed.snapshot().html
    assert 'data-line="4" style="background' in html  # the error line is marked
    assert ">4  </span>" in html and "expected &#x27;;&#x27; after expression" in html
    assert "PASS out" in html and "showing run #1" in html


def test_an_executed_notebook_exports_the_editor_state_to_html(tmp_path, spec):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from mtwork.cli import export_html

    setup = (
        "import mlx.core as mx, numpy as np, mtwork\n"
        "from pathlib import Path\n"
        f"spec = mtwork.KernelSpec(name='editor_scale', source='scale.metal', header='scale.h',"
        f" input_names=['inp'], output_names=['out'], folder=Path({str(spec.folder)!r}))\n"
        "build = lambda c: mtwork.Launch(spec.kernel(), grid=(1024 // c['ept'], 1, 1), "
        "threadgroup=(c['tg'], 1, 1), template=[('T', mx.float32), ('EPT', c['ept'])], "
        "output_shapes=[(1024,)], output_dtypes=[mx.float32])\n"
        "import mtwork.editor\n"
        "ed = mtwork.editor(spec, build, inputs=[mx.arange(1024, dtype=mx.float32)], "
        "oracle=lambda x: 2 * np.asarray(x, np.float64), space={'ept': [1, 2], 'tg': [32]}, "
        "bench_rounds=1, run=False)\n"
        "ed.run()\n"
        "ed"
    )
    edit = ("ed.set_source(ed.source.replace('twice(inp[first + k]);', 'twice(inp[first + k])'))\n"
            "ed.run().status")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(edit)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "edited.ipynb"
    nbformat.write(nb, path)
    export_html(path, tmp_path / "edited.html")
    html = (tmp_path / "edited.html").read_text()
    static = html[html.index('class="mtw-editor-static"'):]
    assert 'data-line="4" style="background' in static  # updated after the second cell
    assert "expected &#x27;;&#x27; after expression" in static
    assert "source:4:" in static and "PASS out" in static
    assert "compile_error" in html  # the second cell's own output


def test_the_package_is_callable_and_ships_its_javascript():
    import mtwork.editor as package
    from mtwork.editor.widget import STATIC

    assert callable(package) and package.editor is editor
    bundle = (STATIC / "editor.js").read_text()
    assert len(bundle) > 100_000 and "import " not in bundle[:2000]  # one file, no CDN
