"""`mtwork selftest`: one command that shows what mtwork does on this machine. It checks
the toolchain, builds the emulator's runtime, runs a corpus of kernels (`corpus`: written
for it; `others`: MLX's own and one of each kernel family) on every backend that can run
here, compares each with its oracle and the backends with each other (bit for bit where
the operation is exact, else within `mtwork.diff`'s bands), and prints one table and a
summary ready to paste into a bug report (`check`).

On a Mac, `metal` runs beside `sim`: this is how a machine whose GPU's compute behaviour
nobody has checked (a CI runner's paravirtual Metal device) finds out.
"""

from __future__ import annotations

from collections.abc import Sequence

from .check import Report, Row, run_cases, toolchain_checks, usable_backends
from .corpus import Case, builtin_cases
from .others import family_cases, mlx_cases

__all__ = ["Case", "Report", "Row", "cases", "selftest"]


def cases(*, families: bool = True) -> tuple[list[Case], list[str]]:
    """The corpus: the self-test's own kernels, MLX's, and (with `families`) one launch
    of each kernel family found; and notes on what is left out."""
    found = [*builtin_cases(), *mlx_cases()]
    notes = [] if found[len(builtin_cases()):] else [
        "MLX's kernels: not run: the installed mlx ships no Metal headers"]
    if families:
        more, note = family_cases()
        found += more
        if note:
            notes.append(note)
    return found, notes


def selftest(backends: Sequence[str] | None = None, *, families: bool = True,
             kernels: Sequence[str] | None = None) -> Report:
    """Runs the self-test on `backends` (default: every registered backend that can run
    here), on every kernel of the corpus or those named in `kernels`, and returns its
    `Report` (`report.failed`: anything disagreed)."""
    run_on, notes = usable_backends(backends)
    corpus, more = cases(families=families)
    if kernels:
        known = {c.name for c in corpus}
        unknown = [k for k in kernels if k not in known]
        if unknown:
            raise ValueError(f"unknown self-test kernel {unknown[0]!r}: choose from "
                             f"{', '.join(sorted(known))}")
        corpus = [c for c in corpus if c.name in kernels]
    report = Report(checks=toolchain_checks(run_on), backends=run_on, notes=notes)
    report.notes += more
    if run_on:
        report.rows = run_cases(corpus, run_on)
    return report
