"""Work budgets: every long command estimates its work before it starts.

One rule for every command that can run long (simulate, compare, replay, run,
calibrate): before any heavy work (a grid's validation, a model's load, a span
file's parse) the command counts its work in a unit proportional to its time,
prints a one-line estimate on stderr when it is long, and refuses work over its
budget in one sentence naming the product and how to shrink it, unless the user
passes ``--allow-large``. The estimate is an upper bound: each quantity the
runtime scales with (decoding steps, rows per step, operations per step,
simulations, spans, generated tokens) is counted at its most.

What a simulation's time scales with (``python benchmarks/bench_budget.py``
profiles it): the engine runs one decoding step after another, and every step
commits at least one token per sequence, so a run has at most ``tokens`` steps.
A step costs a fixed amount per operation the schedule yields (gamma draft
passes, a streamed chunk per layer group, a pipeline stage per layer group) and
an amount per sequence in the batch: the acceptance sampler and the cache book
(``policies/cachebook.py``) walk every row of every step in Python, about 2 us a
row, which is what makes ``--batch 16384`` slow (N3). A tree's steps walk its
nodes too, and a tree's or speculation cache's rows cost per level.

What a step yields is asked of the schedule, never read from its parameters'
names: its dry run (``policies.dryrun``, the one the memory check sizes)
counts the operations of its widest step, whether it lays out a speculation
tree and the positions of its widest pass over one (``StepWork``). A grid
dry-runs its schedule at the grid's corners only (``corners``: each swept
number at its least and largest), once per (schedule, parameters, models).

The unit is the *row-step*: one sequence's share of one decoding step.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from hwprofiles import ModelSpec, load_model
from policies import entry
from policies.base import baseline_of
from policies.dryrun import StepWork, held
from policies.prefill import MAX_PREFILL_PASSES
from policies.runs.metrics import load_1m, usable_cores

# Work units of a step: each operation the schedule yields costs as much as this
# many rows (measured: ~11-70 us an op against ~2.2 us a row).
OP_UNITS = 32
# A tree's step walks each of its nodes, about this many rows' worth each.
NODE_UNITS = 8
# Building one simulation (models, placement, the engine): about 4 ms.
SIM_FIXED_UNITS = 2_000
# Operations of a prefill pass (the prompt's chunks run one after another).
PREFILL_PASS_OPS = 4
DEFAULT_PROMPT = 128  # RunConfig's prompt_tokens default

# Rates, measured by ``python benchmarks/bench_budget.py`` on the development
# machine (2 shared x86 cores, 2026-11-26, each step's work counted by its dry
# run): the slowest case of its suite, SSD k=2 at --batch 2048, ran 440,000-
# 450,000 row-steps per second while other work slowed the machine 1.6x (sd at
# --batch 16384: 760,000-780,000, 1.2-1.3 million when quiet; ar_stream
# streaming one layer at a time 3.0 million); the rate below is under the
# slowest, so that the estimate bounds every case.
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
    that a refusal stays its only line. On a terminal, a machine busy with other
    work adds what it makes of the estimate (``busy_clause``)."""
    if estimate.seconds >= LONG_S:
        busy = busy_clause(estimate.seconds, machine_load()) if sys.stderr.isatty() else ""
        print(estimate.line() + busy, file=sys.stderr, flush=True)


BUSY_FACTOR = 1.5  # the slowdown from other work past which an estimate says so


def machine_load() -> tuple[float, int] | None:
    """(1-minute load average, cores this process may use); None where unknown."""
    load = load_1m()
    return None if load is None else (load, usable_cores())


def busy_clause(seconds: float, load: tuple[float, int] | None) -> str:
    """'; the machine is busy (...), so expect about N': the estimates are measured
    on idle cores, and a command's one busy thread beside ``load`` other runnable
    threads on ``cores`` gets about cores / (load + 1) of a core."""
    if load is None:
        return ""
    other, cores = load
    factor = (other + 1) / cores
    if factor < BUSY_FACTOR:
        return ""
    return (f"; the machine is busy (load average {other:.1f} on {cores} cores), so "
            f"expect about {duration(seconds * factor)}")


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
@dataclass(frozen=True)
class SimShape:
    """What one simulation's time scales with: ``tokens`` (the most steps),
    ``batch`` sequences, operations a step (``ops``), per-row levels
    (``row_levels``), tree nodes a step (``nodes``), prefill passes."""

    tokens: int
    batch: int
    ops: int
    row_levels: int = 1
    nodes: int = 0
    prefill_passes: int = 1

    @property
    def units(self) -> int:
        step = OP_UNITS * self.ops + NODE_UNITS * self.nodes + self.batch * self.row_levels
        return (SIM_FIXED_UNITS + self.tokens * step
                + self.prefill_passes * PREFILL_PASS_OPS * OP_UNITS)


def own_baseline(policy: str) -> bool:
    """Whether the schedule is measured against itself (its registry entry's
    baseline names it: AR, a streaming AR under its own budget)."""
    e = entry(policy)
    try:
        defaults = e.params()
    except ValueError:  # a parameter without a default: judged at the point, not here
        return False
    return e.baseline(defaults)[0] == policy


class Models(NamedTuple):
    """A run's target and draft as the user names them (profile names or YAML paths)."""

    target: str | None
    draft: str | None = None


@functools.lru_cache(maxsize=64)
def _spec(name: str | None) -> ModelSpec | None:
    """The model ``name``, or None where it does not load (the command reports it
    later in its own words)."""
    if not name:
        return None
    try:
        return load_model(name)
    except Exception:  # noqa: BLE001 - the command reports it in its own words
        return None


_STEPS: dict[tuple, StepWork | None] = {}  # step works kept, up to _CACHED
_CACHED = 4096


def step_work(policy: str, params: dict, models: Models, prompt_tokens: int) -> StepWork | None:
    """What one decoding step of ``policy`` at ``params`` yields, asked of its dry
    run (``policies.dryrun``, the one the memory check sizes); None where the
    schedule cannot be built from them (its run is refused before a step)."""
    key = (policy, repr(sorted(params.items())), models, prompt_tokens)
    if key not in _STEPS:
        if len(_STEPS) >= _CACHED:
            _STEPS.clear()
        _STEPS[key] = _dry_step(policy, params, models, prompt_tokens)
    return _STEPS[key]


def _dry_step(policy: str, params: dict, models: Models, prompt_tokens: int) -> StepWork | None:
    specs = {role: _spec(name) for role, name in models._asdict().items()}
    if specs["target"] is None:
        return None
    try:
        return held(policy, params, {k: v for k, v in specs.items() if v}, prompt_tokens).step
    except Exception:  # noqa: BLE001 - invalid parameters, a draft missing: the run
        return None  # refuses them before its first step, in its own words


def step_shape(step: StepWork | None, tokens: int, batch: int, passes: int) -> SimShape:
    """A simulation of ``tokens`` steps of ``step`` over ``batch`` sequences (None:
    a schedule that cannot be built, counted as one pass and its verdict a step):
    a step that lays out a speculation tree walks each row once per operation and
    once per group of rows of each tree pass that catches up (``StepWork.groups``)."""
    step = step or StepWork(ops=2)
    levels = step.ops - 1 + step.groups if step.tree else 1
    return SimShape(tokens, batch, step.ops, row_levels=levels, nodes=step.nodes,
                    prefill_passes=passes)


def _number(v: Any) -> bool:
    """A finite number (an int of any size is finite; a bool is no number)."""
    return (isinstance(v, int) and not isinstance(v, bool)
            or isinstance(v, float) and math.isfinite(v))


def _numbers(values: Iterable) -> list[float]:
    return [v for v in values if _number(v)]


def _choices(values: list) -> list:
    """The values of a parameter a schedule's work may be at its most at: its
    least and largest number (a schedule's step grows or shrinks with each
    number: more draft passes, fewer layers a streamed chunk) and every value
    that is no number (a tree's shape, a choice), each once."""
    numbers = _numbers(values)
    picked = [min(numbers), max(numbers)] if numbers else []
    for v in values:
        if not _number(v) and v not in picked:
            picked.append(v)
    return picked[1:] if numbers and picked[0] == picked[1] else picked


MAX_CORNERS = 64  # points of a grid's corners dry-run for its most costly one


def corners(settings: dict[str, list]) -> list[dict[str, Any]]:
    """The points at which a grid of ``settings`` (key -> values) is at its most:
    every combination of each key's ``_choices``; past MAX_CORNERS of them, each
    key's choices with the other keys at their first, and every key at its last."""
    picks = {k: _choices(list(v)) for k, v in settings.items() if v}
    if math.prod(len(v) for v in picks.values()) <= MAX_CORNERS:
        return [dict(zip(picks, combo)) for combo in itertools.product(*picks.values())]
    first = {k: v[0] for k, v in picks.items()}
    return ([{**first, k: c} for k, v in picks.items() for c in v]
            + [{k: v[-1] for k, v in picks.items()}])


def prefill_passes(settings: dict[str, list]) -> int:
    """The most prefill passes of a run's settings: its longest prompt in its
    shortest chunks (one pass without chunks)."""
    chunks = [c for c in _numbers(settings.get("prefill_chunk", ())) if c > 0]
    if not chunks:
        return 1
    prompt = max(_numbers(settings.get("prompt_tokens", ())) or [DEFAULT_PROMPT])
    return int(min(-(-max(prompt, 1) // min(chunks)), MAX_PREFILL_PASSES))


def point_shapes(policy: str, settings: dict[str, list], tokens: int, batch: int,
                 models: Models) -> tuple[SimShape, SimShape | None]:
    """The most a simulation of ``policy`` and its AR baseline (None: it is its
    own) can cost over every value in ``settings`` (key -> the values it takes:
    one for a fixed setting, all for a swept one): its schedule's parameters
    among them dry-run at each of the grid's ``corners``; the run's own settings
    (prompt, prefill chunks) counted as they are."""
    fields = entry(policy).params.model_fields
    prompt = int(max(_numbers(settings.get("prompt_tokens", ())) or [DEFAULT_PROMPT]))
    passes = prefill_passes(settings)
    run, base = None, None
    for params in corners({k: v for k, v in settings.items() if k in fields}):
        shape = step_shape(step_work(policy, params, models, prompt), tokens, batch, passes)
        run = shape if run is None or shape.units > run.units else run
        ar = _baseline_shape(policy, params, models, prompt, (tokens, batch, passes))
        base = ar if base is None or (ar is not None and ar.units > base.units) else base
    return run, base


def _baseline_shape(policy: str, params: dict, models: Models, prompt: int,
                    size: tuple[int, int, int]) -> SimShape | None:
    """The AR baseline of one point (its schedule's registry entry names it)."""
    try:
        named = baseline_of(policy, params)
    except ValueError:  # parameters the point's validation refuses
        named = None
    if named is None:
        return None
    return step_shape(step_work(*named, models, prompt), *size)


def sim_shape(policy: str, settings: dict[str, list], tokens: int, batch: int,
              models: Models) -> SimShape:
    """The most a simulation of ``policy`` can cost over ``settings`` (``point_shapes``)."""
    return point_shapes(policy, settings, tokens, batch, models)[0]


def point_units(policy: str, settings: dict[str, list], tokens: int, batch: int,
                models: Models) -> tuple[float, float]:
    """(row-steps of one simulation at ``settings``, of its AR baseline: 0 for a
    point that is its own, ``own_baseline``)."""
    run, base = point_shapes(policy, settings, tokens, batch, models)
    own = 0.0 if own_baseline(policy) or base is None else base.units
    return run.units, own


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
