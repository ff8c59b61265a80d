"""`mtwork selftest`: every kernel of the corpus agrees with its oracle on sim, a backend
that gets one bit wrong is caught (against the oracle and against sim), the table and the
summary say what ran where and why metal could not, and the exit status says whether
anything disagreed."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

from mtwork import cli
from mtwork.backends import register, unregister
from mtwork.backends.sim import SimBackend
from mtwork.dispatch import Completion
from mtwork.selftest import cases, selftest

EXACT = "tree sum"  # integer-valued sums: bit for bit on every backend


class OneBitOff(SimBackend):
    """sim, with the lowest bit of the first element of every float output flipped."""

    name = "one_bit_off"

    def dispatch(self, program, call) -> Completion:
        done = super().dispatch(program, dataclasses.replace(
            call, options=dataclasses.replace(call.options, isolate=False)))
        buffers = {}
        for index, array in done.buffers.items():
            array = np.array(array)
            if array.dtype == np.float32 and array.size:
                array.reshape(-1).view(np.uint32)[0] ^= 1
            buffers[index] = array
        return dataclasses.replace(done, buffers=buffers)


@pytest.fixture
def one_bit_off():
    register("one_bit_off", OneBitOff)
    yield "one_bit_off"
    unregister("one_bit_off")


def test_the_corpus_covers_what_differs_between_machines() -> None:
    found, _ = cases(families=False)
    covered = " ".join(c.covers for c in found)
    for what in ("half", "bfloat", "threadgroup", "simd_sum", "simdgroup_load", "atomic",
                 "MLX's"):
        assert what in covered, what
    assert len({c.name for c in found}) == len(found)


def test_every_kernel_agrees_with_its_oracle_on_sim(capsys) -> None:
    assert cli.main(["selftest", "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    found, _ = cases()
    for case in found:
        assert f"{case.name} " in out, case.name
    assert "DIFFERS" not in out and "ERROR" not in out
    assert "kernels on sim; 0 disagreements" in out
    assert "machine:" in out and "versions: mtwork" in out
    for check in ("clang (ziglang)", "emulator runtime", "fault isolation", "sanitizer",
                  "profiler"):
        assert f"ok   {check}: " in out, check
    assert "found at its line (source:2)" in out  # this machine has a symbolizer
    if mx.metal.is_available():
        return
    # Asked for metal off a Mac: sim runs, and the summary says why metal did not.
    assert cli.main(["selftest", "--kernel", EXACT, "--backend", "sim", "--backend",
                     "metal"]) == 0
    assert "metal: not run: no Metal device" in capsys.readouterr().out


def test_a_backend_one_bit_off_is_caught_and_fails_the_run(one_bit_off, capsys) -> None:
    report = selftest(["sim", one_bit_off], kernels=[EXACT, "exp"], families=False)
    verdicts = {(r.kernel, r.backend): r.verdict for r in report.rows}
    assert verdicts[(EXACT, "sim")] == "agrees"
    assert verdicts[(EXACT, one_bit_off)] == "DIFFERS"  # bitwise against the oracle
    assert verdicts[(EXACT, f"sim = {one_bit_off}")] == "DIFFERS"
    # Metal's exp is not the emulator's: one ULP is within the bands, on both counts.
    assert verdicts[("exp", one_bit_off)] == "agrees"
    assert verdicts[("exp", f"sim = {one_bit_off}")] == "within bands"
    assert report.failed
    assert f"{EXACT} on {one_bit_off}: DIFFERS: 1/" in report.summary()
    code = cli.main(["selftest", "--backend", "sim", "--backend", one_bit_off,
                     "--kernel", EXACT])
    assert code == 1 and "2 disagreements or errors" in capsys.readouterr().out


def test_bad_names_are_refused_with_the_choices(capsys) -> None:
    assert cli.main(["selftest", "--backend", "nope"]) == 2
    assert "unknown backend 'nope'" in capsys.readouterr().err
    assert cli.main(["selftest", "--kernel", "nope"]) == 2
    assert "unknown self-test kernel 'nope': choose from" in capsys.readouterr().err
