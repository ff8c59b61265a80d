"""The GPU model against published before/after timings of Apple-GPU kernels.

Each pair of tests/validation/catalog.py: both sides' kernels from their published
packages (fetched by pip on first use and kept in the user's cache), dispatched as their
host code did, profiled on `sim` (on a slice of the work where the rest repeats it) and
modelled on the chip the figures were published for. Prints each pair (published and
modelled ratio, whether the direction is right, the ratio's error, the modelled times and
bounds) and the summary against the targets, over all pairs and over the fit and
held-out parts; then the cross-validation of the model's one fitted parameter (fitted on
each part, tried on the other: tests/validation/fit.py). Run:

    python bench/gpu_model_validation.py [--only TEXT] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The checkout's root first: its mtwork and its tests/validation.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtwork.display import seconds_text  # noqa: E402
from mtwork.gpu import Assumptions  # noqa: E402
from tests.validation import evaluate, fit  # noqa: E402
from tests.validation.catalog import PAIRS  # noqa: E402
from tests.validation.evaluate import Row  # noqa: E402

HEADER = ["pair", "level", "chip", "part", "published", "modelled", "direction", "error",
          "modelled before -> after", "published before -> after", "check", "bound"]


def cells(row: Row) -> list[str]:
    p = row.pair.published
    shown = (f"{seconds_text(p.before)} -> {seconds_text(p.after)}"
             if p.before is not None and p.after is not None else "—")
    if row.pair.level == "token":
        fits, at_least = row.token_bounds or (False, False)
        check = (f"fits in token: {'yes' if fits else 'NO'}; ratio >= published: "
                 f"{'yes' if at_least else 'NO'}")
    else:
        within = "yes" if row.ratio_within else "NO"
        absolute = row.absolute_within
        check = f"ratio within ±35%: {within}" + (
            "" if absolute is None else f"; times within 2x: {'yes' if absolute else 'NO'}")
    name = (f"[{row.pair.name}]({p.url})" if p.url.startswith("https://")
            else f"{row.pair.name} ({p.url})")
    return [name, row.pair.level, row.pair.chip, row.pair.part,
            f"{row.published:.2f}x", f"{row.modelled:.2f}x",
            "right" if row.direction_right else "WRONG", f"{100 * row.ratio_error:+.0f}%",
            f"{seconds_text(row.before_seconds)} -> {seconds_text(row.after_seconds)}",
            shown, check, row.bound_text]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="pairs whose name contains this text")
    args = parser.parse_args(argv)
    rows, pairs, sides = [], [], []
    print("| " + " | ".join(HEADER) + " |")
    print("|" + " --- |" * len(HEADER))
    for pair in PAIRS:
        if args.only.lower() not in pair.name.lower():
            continue
        start = time.perf_counter()
        pairs.append(pair)
        sides.append(evaluate.dispatches(pair))
        row = evaluate.model_dispatches(pair, sides[-1])
        rows.append(row)
        print("| " + " | ".join(cells(row)) + " |", flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    print()
    for title, part in (("all pairs", None), ("fit part", "fit"), ("held-out part", "held out")):
        chosen = [r for r in rows if part is None or r.pair.part == part]
        if chosen:
            print(f"{title} ({len(chosen)}):")
            for line in evaluate.summary(chosen).lines():
                print("  " + line)
    cross_validation(pairs, sides)


def cross_validation(pairs: list, sides: list) -> None:
    """The fitted parameter chosen on each part and the other part's results with it."""
    print(f"\ncross-validation of Assumptions.{fit.PARAMETER} (default "
          f"{getattr(Assumptions(), fit.PARAMETER):g}):")
    for on, held in (("fit", "held out"), ("held out", "fit")):
        fitted = [i for i, p in enumerate(pairs) if p.part == on]
        tried = [i for i, p in enumerate(pairs) if p.part == held]
        if not fitted or not tried:
            continue
        f = fit.fit([pairs[i] for i in fitted], [sides[i] for i in fitted])
        rows = fit.rows_with([pairs[i] for i in tried], [sides[i] for i in tried], f.value)
        print(f"  fitted on the {on} part ({f.pairs} pairs): {f.value:g} (mean |log ratio "
              f"error| {f.loss:.3f}); on the {held} part ({len(rows)} pairs, not fitted "
              f"to) {fit.loss(rows):.3f}:")
        for line in evaluate.summary(rows).lines():
            print("    " + line)


if __name__ == "__main__":
    main()
