"""What a serving step costs: the schedule asked for one step of the batch formed.

Serving drives the same schedules ``simulate`` runs, priced by the same cost
model on the same simulated resources (``analyses.run.api.run_schedule``): a
step of a batch of B decoding requests at mean context c is the schedule's own
steady step, simulated in deterministic mode at batch B and fixed context c.
Its time is taken as the marginal cost of a step (two runs, the difference of
their times over the difference of their steps), so a schedule's first round
(SSD's cold cache, a pipeline filling) does not leak into every step. The
schedule's tokens per row and step at an acceptance come from the same
simulation at batch 1.

A serving run visits thousands of (batch, context) pairs, so prices are
memoised on a grid, as serving simulators precompute their predictors: batches
1..8 exactly and then every quarter octave, contexts every half octave from 64,
with linear interpolation between grid points (``GRID_ERROR`` is what
``tests/test_serve.py`` holds interpolation to against exact pricing).
``exact=True`` prices every pair itself (the low-rate equality tests).

A prefill chunk of positions [start, stop) of a prompt costs P(stop) - P(start),
where P(n) is the schedule's prologue (``policies.prefill``) over an n-token
prompt in chunks of the engine's chunk size: exact when the chunk starts on a
chunk boundary. Each request's chunk is its own pass: an engine that fuses a
step's chunks with its decode rows reads the weights once for all of them,
which this prices once per pass (an upper bound; docs/serving.md).

KV capacity is the memory check's (``analyses.run.memory``): what a tier holds
beside the run's weights and its widest step's activations, in positions of
every model that keeps a cache for a request (a separate draft keeps its own),
and the positions a schedule reserves per request and step are its widest
pass's (K+1 for a chain of K drafts, a tree's nodes), read off its dry run.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from analyses.run.api import run_models, run_schedule
from analyses.run.config import RunConfig
from analyses.run.memory import Run, tier_needs
from hwprofiles import Platform, Stack, load_platform, load_stack
from hwprofiles.schema import resolve
from policies import entry
from policies.dryrun import held
from policies.runs.breakdown import breakdown
from simcore.acceptance import MODELS as ACCEPTANCE_MODELS

GRID_ERROR = 0.01  # interpolation on the grid against exact pricing (tests hold it)
CONTEXT_FLOOR = 64


def batch_grid(top: int) -> list[int]:
    """1..8, then every quarter octave (rounded) up to ``top`` (always included)."""
    points = list(range(1, min(top, 8) + 1))
    k = 12
    while points[-1] < top:
        nxt = min(top, int(round(2 ** (k / 4))))
        if nxt > points[-1]:
            points.append(nxt)
        k += 1
    return points


def context_points(top: int) -> list[int]:
    """64 and every half octave above it, to past ``top``."""
    points = [CONTEXT_FLOOR]
    k = 13
    while points[-1] < top:
        points.append(int(round(2 ** (k / 2))))
        k += 1
    return points


def _between(grid: list[int], x: float) -> tuple[int, int, float]:
    """The grid points around x and x's weight on the upper one (x clipped in)."""
    if x <= grid[0]:
        return grid[0], grid[0], 0.0
    if x >= grid[-1]:
        return grid[-1], grid[-1], 0.0
    i = bisect.bisect_right(grid, x)
    lo, hi = grid[i - 1], grid[i]
    return lo, hi, (x - lo) / (hi - lo)


@dataclass
class StepPricer:
    """Step and prefill prices of one schedule configuration on one platform.

    ``config``: the schedule's run (policy, params, models, acceptance, stack,
    placement); its batch, tokens and prompt are what each price sets."""

    config: RunConfig
    max_batch: int
    max_context: int
    chunk: int
    exact: bool = False
    platform: Platform | None = None
    stack: Stack | None = None
    _steps: dict = field(default_factory=dict)
    _tokens: dict = field(default_factory=dict)
    _prefill: dict = field(default_factory=dict)
    sims: int = 0

    def __post_init__(self):
        self.platform = self.platform or load_platform(self.config.platform)
        self.stack = self.stack or load_stack(self.config.stack)
        self.batches = batch_grid(self.max_batch)
        self.contexts = context_points(self.max_context)
        self._prompt_grid = [0, *self.contexts]  # the prompt lengths P(n) is priced at
        self._probe = self.config.model_copy(update={
            "deterministic": True, "fixed_context": True, "memory_check": False,
            "prefill_chunk": None})

    # decode steps ------------------------------------------------------------
    def _simulate(self, batch: int, context: int, tokens: int, acceptance=None):
        update = {"batch": batch, "prompt_tokens": context, "tokens": tokens}
        if acceptance is not None:
            update["acceptance"] = acceptance
        self.sims += 1
        return run_schedule(self._probe.model_copy(update=update), record_spans=False,
                            prefill=False, platform=self.platform, stack=self.stack)

    def _marginal(self, batch: int, context: int, short: int, long: int,
                  acceptance=None) -> tuple[float, float]:
        """(seconds, tokens per row) of one steady step: two runs of ``short`` and
        ``long`` tokens a row, their difference over the difference of their steps
        (one run's whole where a single round decodes both)."""
        a = self._simulate(batch, context, short, acceptance)
        b = self._simulate(batch, context, long, acceptance)
        s1, s2 = a.stats.get("steps", a.steps), b.stats.get("steps", b.steps)
        if s2 > s1:
            return (b.time_s - a.time_s) / (s2 - s1), (b.tokens - a.tokens) / (s2 - s1) / batch
        return b.time_s / max(s2, 1), b.tokens / max(s2, 1) / batch

    def _steady(self, batch: int, context: int) -> float:
        """Seconds of one steady step at exactly this batch and context."""
        key = (batch, context)
        if key not in self._steps:
            self._steps[key] = self._marginal(batch, context, 8, 24)[0]
        return self._steps[key]

    def step_s(self, batch: int, context: float) -> float:
        """Seconds of one decode step of ``batch`` requests at mean ``context``."""
        if batch <= 0:
            return 0.0
        ctx = max(int(context), 1)
        if self.exact:
            return self._steady(batch, ctx)
        b0, b1, wb = _between(self.batches, batch)
        c0, c1, wc = _between(self.contexts, ctx)
        at = self._steady
        low = at(b0, c0) * (1 - wc) + (at(b0, c1) * wc if wc else 0.0)
        if not wb:
            return low
        high = at(b1, c0) * (1 - wc) + (at(b1, c1) * wc if wc else 0.0)
        return low * (1 - wb) + high * wb

    def tokens_per_step(self, alpha: float | None = None) -> float:
        """The schedule's mean tokens per row and step, at the run's acceptance or
        at i.i.d. ``alpha`` (rounded to 0.01), at batch 1 and the grid's first
        context."""
        key = None if alpha is None else round(alpha, 2)
        if key not in self._tokens:
            acc = None if key is None else _iid(key)
            self._tokens[key] = self._marginal(1, CONTEXT_FLOOR, 8, 40, acc)[1]
        return self._tokens[key]

    def step_breakdown(self, batch: int, context: int) -> dict:
        """Where one step's time goes at this batch and context (``policies.runs.
        breakdown``: per cost on the critical path, each device's utilisation): the
        schedule simulated with its spans for a few steps."""
        self.sims += 1
        result = run_schedule(self._probe.model_copy(update={
            "batch": max(batch, 1), "prompt_tokens": max(context, 1), "tokens": 16}),
            record_spans=True, prefill=False, platform=self.platform, stack=self.stack)
        steps = result.stats.get("steps", result.steps) or 1
        return breakdown(result.spans, tokens=result.tokens / max(batch, 1), steps=steps,
                         start_s=0.0, end_s=result.time_s)

    # prefill -------------------------------------------------------------------
    def prologue_s(self, positions: int) -> float:
        """P(n): the schedule's prologue over an n-position prompt in chunks."""
        if positions <= 0:
            return 0.0
        if positions not in self._prefill:
            config = self._probe.model_copy(update={
                "batch": 1, "prompt_tokens": positions, "tokens": 1,
                "prefill_chunk": self.chunk if positions > self.chunk else None})
            self.sims += 1
            self._prefill[positions] = run_schedule(
                config, record_spans=False, platform=self.platform,
                stack=self.stack).prefill_s
        return self._prefill[positions]

    def prefill_s(self, start: int, stop: int) -> float:
        """Seconds of a prefill pass over positions [start, stop) of a prompt."""
        if stop <= start:
            return 0.0
        if self.exact:
            return self.prologue_s(stop) - self.prologue_s(start)
        return self._prologue_grid(stop) - self._prologue_grid(start)

    def _prologue_grid(self, n: int) -> float:
        if n <= 0:
            return 0.0
        grid = self._prompt_grid
        if n > grid[-1]:  # past the grid (a prompt longer than max_context): n itself
            grid = [*grid, n]
        lo, hi, w = _between(grid, n)
        value = self.prologue_s(lo)
        return value + (self.prologue_s(hi) - value) * w if w else value


def _iid(alpha: float):
    return ACCEPTANCE_MODELS["iid"].model_validate({"kind": "iid", "alpha": alpha})


# What a request holds ------------------------------------------------------------
def reserved_positions(config: RunConfig) -> int:
    """Positions a decoding request reserves per step beyond its context: the
    schedule's widest pass per row (1 for AR, K+1 for a chain of K drafts)."""
    models = run_models(config)
    answer = held(config.policy, config.params, models, config.prompt_tokens)
    widest = [s.positions * s.rows for s in answer.segments if s.model == "target"]
    return max([1, *widest])


def kv_capacity(config: RunConfig, platform: Platform, max_batch: int, chunk: int) -> int:
    """KV positions per request-token the platform holds for the run: per memory
    tier, its capacity less the weights and the widest step's activations (at
    ``max_batch`` decoding rows, or one ``chunk``-position prefill pass), over the bytes one
    more position of context costs there; the smallest tier's answer."""
    models = run_models(config)
    placement = resolve(platform, config.placement)
    streams = entry(config.policy).streams_weights

    def needs(prompt, batch):
        return tier_needs(platform, models, placement,
                          Run(config.policy, config.params, prompt, 0, batch, streams, chunk))
    base = needs(0, 1)
    probe = 4096
    grown = needs(probe, 1)
    prefill, decode = needs(chunk, 1), needs(0, max_batch)  # a chunk is the step's, not a row's
    best = math.inf
    for tier, need in base.items():
        per_position = (grown[tier].kv - need.kv) / probe
        if per_position <= 0:
            continue
        free = (platform.tier(tier).capacity_bytes - need.weights
                - max(prefill[tier].activations, decode[tier].activations))
        best = min(best, free / per_position)
    if best is math.inf:
        raise ValueError("the run's models keep no KV cache on any memory tier")
    return max(int(best), 0)
