"""The model against the validation set: each pair modelled on its chip, and the targets.

For every pair: the published and modelled ratios (before time / after time), whether the
model says the same side is faster (where the published ratio is within 5% of 1, the
modelled one must be within 10% of 1), the ratio's error (modelled / published - 1), and
for kernel-level pairs with published times the absolute error of each side; for
token-level pairs the bounds (`pairs` module). `summary` counts the targets over a group
of rows (all, or the fit and held-out parts apart).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mtwork.gpu import Assumptions, Sequence, estimate_sequence

from .pairs import Dispatches, Pair

NEAR_ONE = 0.05  # a published ratio within 5% of 1 is "about 1"
NEAR_ONE_MODELLED = 0.10  # ... and then the modelled one must be within 10% of 1
RATIO_TOLERANCE = 0.35  # kernel-level ratios within ±35%
ABSOLUTE_FACTOR = 2.0  # modelled kernel times within 2x of the published ones


@dataclass(frozen=True)
class Row:
    pair: Pair
    before: Sequence
    after: Sequence

    @property
    def before_seconds(self) -> float:
        """The modelled time of what the before figure timed (GPU time or whole calls)."""
        return self.before.gpu_seconds if self.pair.timed == "gpu" else self.before.seconds

    @property
    def after_seconds(self) -> float:
        return self.after.gpu_seconds if self.pair.timed == "gpu" else self.after.seconds

    @property
    def published(self) -> float:
        return self.pair.published.ratio

    @property
    def modelled(self) -> float:
        return self.before_seconds / self.after_seconds

    @property
    def direction_right(self) -> bool:
        """The faster side is the published one's; a kernel-level published ratio about 1
        needs a modelled one about 1 (a token-level one only dilutes the kernels')."""
        if self.pair.level == "kernel" and abs(self.published - 1) <= NEAR_ONE:
            return abs(self.modelled - 1) <= NEAR_ONE_MODELLED
        return (self.modelled > 1) == (self.published > 1)

    @property
    def ratio_error(self) -> float:
        return self.modelled / self.published - 1

    @property
    def ratio_within(self) -> bool | None:
        """Kernel-level: the ratio within ±35% (None for token-level pairs)."""
        if self.pair.level != "kernel":
            return None
        return abs(self.ratio_error) <= RATIO_TOLERANCE

    def absolute_errors(self) -> tuple[float, float] | None:
        """Modelled / published time of each side (kernel-level with published times)."""
        p = self.pair.published
        if self.pair.level != "kernel" or p.before is None or p.after is None:
            return None
        return self.before_seconds / p.before, self.after_seconds / p.after

    @property
    def absolute_within(self) -> bool | None:
        errors = self.absolute_errors()
        if errors is None:
            return None
        return all(1 / ABSOLUTE_FACTOR <= e <= ABSOLUTE_FACTOR for e in errors)

    @property
    def token_bounds(self) -> tuple[bool, bool] | None:
        """Token-level: (the modelled kernels fit in each measured token, their ratio is
        at least the published one)."""
        p = self.pair.published
        if self.pair.level != "token":
            return None
        fits = (p.before is None or self.before_seconds <= p.before) and (
            p.after is None or self.after_seconds <= p.after)
        return fits, self.modelled >= self.published * (1 - 1e-9)

    @property
    def bound_text(self) -> str:
        return f"{self.before.bound} -> {self.after.bound}"


def model(pair: Pair, assumptions: Assumptions | None = None) -> Row:
    """`pair` modelled on its chip."""
    return model_dispatches(pair, dispatches(pair), assumptions)


def dispatches(pair: Pair) -> tuple[Dispatches, Dispatches]:
    """The (counters, times run) of the pair's before and after sides."""
    return pair.before.dispatches(), pair.after.dispatches()


def model_dispatches(pair: Pair, sides: tuple[Dispatches, Dispatches],
                     assumptions: Assumptions | None = None) -> Row:
    """`pair` modelled on its chip from its sides' dispatches."""
    return Row(pair, *(estimate_sequence(side, pair.chip, assumptions,
                                         synchronous=pair.timed == "call")
                       for side in sides))


@dataclass(frozen=True)
class Summary:
    pairs: int
    directions_right: int
    kernel_pairs: int
    kernel_ratios_within: int
    absolute_pairs: int
    absolute_within: int
    token_pairs: int
    token_fits: int
    token_ratio_at_least: int

    def lines(self) -> list[str]:
        def share(n: int, of: int) -> str:
            return f"{n} of {of}" + (f" ({100 * n / of:.0f}%)" if of else "")

        return [f"directions right: {share(self.directions_right, self.pairs)}",
                f"kernel-level ratios within ±35%: "
                f"{share(self.kernel_ratios_within, self.kernel_pairs)} (target 75%)",
                f"kernel times within 2x of published: "
                f"{share(self.absolute_within, self.absolute_pairs)} (target 80%)",
                f"token-level, modelled kernels fit in the measured token: "
                f"{share(self.token_fits, self.token_pairs)}; their ratio at least the "
                f"published one: {share(self.token_ratio_at_least, self.token_pairs)}"]


def summary(rows: Iterable[Row]) -> Summary:
    rows = list(rows)
    kernel = [r for r in rows if r.pair.level == "kernel"]
    absolute = [r for r in kernel if r.absolute_within is not None]
    token = [r for r in rows if r.token_bounds is not None]
    return Summary(
        pairs=len(rows), directions_right=sum(r.direction_right for r in rows),
        kernel_pairs=len(kernel), kernel_ratios_within=sum(bool(r.ratio_within)
                                                           for r in kernel),
        absolute_pairs=len(absolute), absolute_within=sum(bool(r.absolute_within)
                                                          for r in absolute),
        token_pairs=len(token), token_fits=sum(r.token_bounds[0] for r in token),
        token_ratio_at_least=sum(r.token_bounds[1] for r in token))
