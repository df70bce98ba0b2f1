"""Work budgets: every long command estimates its work before it starts.

One rule for every command that can run long (simulate, compare, replay, run,
calibrate): before any heavy work (a grid's validation, a model's load, a span
file's parse) the command counts its work in a unit proportional to its time,
prints a one-line estimate on stderr when it is long, and refuses work over its
budget in one sentence naming the product and how to shrink it, unless the user
passes ``--allow-large``. The estimate is an upper bound: each quantity the
runtime scales with (decoding steps, rows per step, operations per step,
simulations, spans, generated tokens) is counted at its most.

What a simulation's time scales with is asked of its schedule
(``analyses.run.simwork``). The unit is the *row-step*: one sequence's share of one decoding step.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from analyses.run.simwork import Models, SimShape, point_shapes, sim_shape

# Rates, measured by ``python benchmarks/bench_budget.py`` on the development
# machine (2 shared x86 cores, 2026-11-26): the slowest case of its suite ran
# 548,000 row-steps per second (ar_stream streaming one layer at a time; sd at
# --batch 16384 807,000, a 65,536-chunk prefill 919,000, plain AR 3.4 million);
# the rate below is under the slowest, so that the estimate bounds every case.
SIM_UNITS_PER_S = 400_000
# A simulate or compare may estimate up to 10 minutes of work at that rate.
SIM_BUDGET_UNITS = SIM_UNITS_PER_S * 600
LONG_S = 10.0  # estimates at least this long are printed before the work starts


def readable(value: float) -> str:
    """1234567 -> '1,234,567'; past 1e9 -> '1.2e+180' (never 180 digits)."""
    if isinstance(value, int) and value < 10**9:
        return f"{value:,}"
    if isinstance(value, float) and not math.isfinite(value):
        return "more than 1e+308"
    if value < 1e9:
        return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.3g}"
    return f"{float(value):.1e}" if value < 1e308 else _huge(value)


def _huge(value: int) -> str:
    """An integer past float range, in the same 1.2e+N style."""
    digits = str(value) if value < 10**4000 else None
    if digits is None:  # log10 without converting to a decimal string
        exponent = int(value.bit_length() * math.log10(2))
        return f"about 1e+{exponent}"
    return f"{digits[0]}.{digits[1]}e+{len(digits) - 1}"


def plural(count: float, noun: str) -> str:
    """'1 sequence', '16,384 sequences' (readable numbers)."""
    return f"{readable(count)} {noun}{'' if count == 1 else 's'}"


def duration(seconds: float) -> str:
    """A time as a person reads it: '40 s', '12 min', '3.5 h', '4.2e+9 years'."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.2g} h"
    if seconds < 3 * 365 * 86400:
        return f"{seconds / 86400:.0f} days"
    if not math.isfinite(seconds):
        return "longer than the universe has existed"
    return f"{readable(seconds / (365 * 86400))} years"


@dataclass(frozen=True)
class Estimate:
    """A command's work before it starts: ``product`` names what is multiplied
    ("4 sweep points x 2 policies = 8 simulations of 50 tokens x 1 sequence"),
    ``units`` the work in ``unit`` (an upper bound), run at ``rate_per_s``."""

    command: str  # "compare", "simulate", ...
    product: str
    units: float
    unit: str
    rate_per_s: float
    budget: float
    shrink: str  # how to make it smaller: "narrow --sweep or lower --tokens"
    counted: bool = False  # the product ends in the units already (spans, tokens)
    simulations: int = 0  # simulations counted (an upper bound), for simulated work

    @property
    def seconds(self) -> float:
        """The work's time at the measured rate (inf past float range: a grid of
        many swept keys multiplies past 1e308)."""
        try:
            return self.units / self.rate_per_s
        except OverflowError:
            return math.inf

    @property
    def over(self) -> bool:
        return self.units > self.budget

    def _work(self) -> str:
        """'about 1.2e+10 row-steps, ' unless the product says the units already."""
        return "" if self.counted else f"about {readable(self.units)} {self.unit}, "

    def refusal(self) -> str:
        return (f"this {self.command} is {self.product} ({self._work()}"
                f"{duration(self.seconds)} at {readable(self.rate_per_s)} {self.unit} "
                f"per second), over the budget of {readable(self.budget)} {self.unit} "
                f"({duration(self.budget / self.rate_per_s)}); {self.shrink}, or pass "
                "--allow-large")

    def line(self) -> str:
        return (f"hetspec: {self.product}, at most about {duration(self.seconds)} "
                f"({readable(self.units)} {self.unit} at {readable(self.rate_per_s)} "
                "per second)")


def check(estimate: Estimate, allow_large: bool = False, *, announce: bool = True) -> Estimate:
    """Refuse ``estimate`` over its budget unless ``allow_large``; print its line on
    stderr when it is long (``announce``)."""
    if estimate.over and not allow_large:
        raise ValueError(estimate.refusal())
    if announce:
        announce_estimate(estimate)
    return estimate


def announce_estimate(estimate: Estimate) -> None:
    """Print the estimate's line on stderr when the work is long (LONG_S); a
    command that checks its budget before its outputs prints it after them, so
    that a refusal stays its only line."""
    if estimate.seconds >= LONG_S:
        print(estimate.line(), file=sys.stderr, flush=True)


def allow_large_argument(p, budget: str) -> None:
    """The ``--allow-large`` flag of a command with a budget; ``budget`` says what
    the budget is and what it means in time."""
    p.add_argument("--allow-large", action="store_true",
                   help=f"run even when the estimated work is over the budget ({budget}); "
                        "without it such a command is refused before it starts, since a "
                        "typo in a sweep or a size would otherwise run for hours. The "
                        "estimate, an upper bound, is printed on stderr before any work "
                        "estimated at 10 s or more")


# ------------------------------------------------------------------ simulations
def sim_estimate(command: str, product: str, units: float, shrink: str,
                 simulations: int = 0) -> Estimate:
    return Estimate(command, product, units, "row-steps", SIM_UNITS_PER_S,
                    SIM_BUDGET_UNITS, shrink, simulations=simulations)


def config_shape(config) -> tuple[SimShape, SimShape | None]:
    """(shape, AR baseline's shape or None) of one RunConfig's simulation."""
    settings = {k: [v] for k, v in config.params.model_dump(exclude_unset=True).items()}
    settings["prompt_tokens"] = [config.prompt_tokens]
    if config.prefill_chunk:
        settings["prefill_chunk"] = [config.prefill_chunk]
    return point_shapes(config.policy, settings, config.tokens, config.batch,
                        Models(config.target, config.draft))


def config_estimate(config, command: str = "simulate") -> Estimate:
    """A simulate's work: the run and, unless it is its own, its AR baseline."""
    shape, base = config_shape(config)
    units = shape.units
    sims = 1
    if base is not None:
        units += base.units
        sims = 2
    runs = "1 simulation" if sims == 1 else "2 simulations (the run and its AR baseline)"
    product = f"{runs} of {plural(config.tokens, 'token')} x {plural(config.batch, 'sequence')}"
    return sim_estimate(command, product, units, "lower --tokens or --batch", sims)


def check_simulation(config, allow_large: bool = False) -> Estimate:
    """The budget check of one simulated configuration (and its baseline)."""
    return check(config_estimate(config), allow_large)


# ------------------------------------------------------------------ calibrations
# Simulations a published calibration runs per row: the least-squares fit
# evaluates every row once per trial and per finite-difference step. Counted on
# the shipped file: a100-sxm-8x 27 per row (7 rows, 2.5 s), h100-sxm-5x 120 per
# row (10 rows, 40 s); the bound below is the most seen and a quarter more.
# (scipy's trf allows 100 x parameters trials: a fit that wanders can exceed it.)
PUBLISHED_SIMS_PER_ROW = 150
# A published calibration's budget: four simulation budgets. Its rows are
# deterministic runs of up to 8,192 tokens, which the row-step rate (the slowest
# schedule's) prices far above their real cost: the shipped m2-ultra-8x file
# (8 rows) estimates 272,121,600 row-steps, 11 min at that rate, and fits in 16-40 s
# (`hetspec calibrate --published shipped --profile m2-ultra-8x`, 2 cores). Every
# shipped calibration fits within it with room to spare.
PUBLISHED_BUDGET_UNITS = 4 * SIM_BUDGET_UNITS


def published_estimate(rows) -> Estimate:
    """A published calibration's work: every row's deterministic simulation at
    its own tokens and batch, PUBLISHED_SIMS_PER_ROW times."""
    units = 0
    for row in rows:
        settings = {k: [v] for k, v in row.params.items()}
        settings["prompt_tokens"] = [row.prompt_tokens]
        shape = sim_shape(row.policy, settings, row.tokens, row.batch,
                          Models(row.target, row.draft))
        units += shape.units * PUBLISHED_SIMS_PER_ROW
    tokens = max((r.tokens for r in rows), default=0)
    batch = max((r.batch for r in rows), default=1)
    product = (f"{plural(len(rows), 'published row')} x up to {PUBLISHED_SIMS_PER_ROW} "
               f"fit evaluations, each a simulation of up to {plural(tokens, 'token')} x "
               f"{plural(batch, 'sequence')}")
    return Estimate("calibrate", product, units, "row-steps", SIM_UNITS_PER_S,
                    PUBLISHED_BUDGET_UNITS,
                    "fit fewer rows or rows with fewer tokens or a smaller batch")
