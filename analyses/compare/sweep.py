"""Grids of simulated runs: ``--sweep key=a..b`` expansion and parallel execution.

A grid is every policy crossed with every combination of the swept values. A
swept or fixed key that a policy does not take (``gamma`` for ``ar``) is dropped
for that policy, which then runs once. Run options sweep like policy parameters
and apply to every policy: ``prompt_tokens=128,1024,8192`` gives each point its
prompt's prefill (``ttft_s``) and its decoding at that context. Points run in worker processes (or on a
Ray cluster) and come back in the grid's order, so the same inputs always give
the same report. A point whose policy does not apply to the scenario (a missing
draft, a model that does not fit, no storage tier) comes back with its error
message instead of metrics.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import math
import multiprocessing
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from analyses.compare import sweep_ray
from analyses.run import budget
from analyses.run.api import (baseline_config, baseline_tokens_per_s, check_expert_parallel,
                              metrics_of, run_schedule)
from analyses.run.budget import check
from analyses.run.config import (RUN_KEYS, RunConfig, parse_value, refuse_repeats, split_items,
                                 split_sets)
from policies import PolicyError, entry
from policies.base import AR, entries
from policies.runs.metrics import add_speedup
from simcore import Outcomes, acceptance

# Settings of the scenario rather than of a schedule: every policy takes them, and a
# point carries them to its RunConfig's own fields (--sweep platform=a,b, batch=1,8,32).
SCENARIO_KEYS = {"platform": "the platform each point runs on",
                 "batch": "sequences decoded together"}

TIMELINE_STEPS = 4  # decoding steps of each point kept for the Gantt view
MAX_SWEEP_VALUES = 10_000  # values one --sweep key may take (the grid has a budget)


@dataclass(frozen=True)
class Point:
    """One run of the grid: a policy and the KEY=VALUE settings it takes."""

    policy: str
    sets: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.sets)
        return f"{self.policy}({inner})" if inner else self.policy


@dataclass
class PointResult:
    point: Point
    metrics: dict | None = None
    error: str | None = None
    spans: list = field(default_factory=list)  # (name, kind, device, start_s, end_s)
    accepted: dict[int, int] = field(default_factory=dict)  # accepted length -> steps


def _number(text: str, spec: str):
    value = parse_value(text)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"--sweep {spec}: '{text}' is not a number; write e.g. "
                         "gamma=2..6 or alpha=0.6..0.9:0.1")
    if not math.isfinite(value):
        raise ValueError(f"--sweep {spec}: '{text.strip()}' is not a finite number; write "
                         "finite bounds, e.g. alpha=0.6..0.9:0.1")
    return value


def _finite_values(values: list, spec: str) -> list:
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--sweep {spec}: {value} is not a finite number; sweep "
                             "finite values, e.g. gamma=2,4,8")
    return values


def list_keys() -> set[str]:
    """Settings whose one value is a comma list: the parameters that hold only a
    tuple (a tree's shape, per-rank acceptances), so --sweep tree=4,2,2,1 is that
    one tree; ';' separates the values swept."""
    out = set()
    for found in entries():
        for key, f in found.params.model_fields.items():
            kinds = (typing.get_args(f.annotation) if typing.get_origin(f.annotation)
                     in (typing.Union, types.UnionType) else (f.annotation,))
            kinds = [k for k in kinds if k is not type(None)]
            if kinds and all(typing.get_origin(k) is tuple for k in kinds):
                out.add(key)
    return out


def parse_sweep(spec: str) -> tuple[str, list]:
    """'gamma=2..6' -> ('gamma', [2..6]); 'alpha=0.6..0.9:0.1' steps by 0.1;
    'gamma=2,4,8' lists values; 'gamma=5' is one value; 'tree=4,2,2,1;3,3'
    lists comma-list values (a list key's comma list is one value)."""
    key, sep, text = spec.partition("=")
    key = key.strip()
    if not sep or not key or not text.strip():
        raise ValueError(f"--sweep expects KEY=RANGE, got '{spec}'; write e.g. "
                         "--sweep gamma=2..6")
    where = f"--sweep {spec}"
    if (listed := key in list_keys()) or ";" in text:
        values = [parse_value(part, where) for part in split_items(text, where, ";")]
        if listed or any(isinstance(v, tuple) for v in values):
            values = [v if isinstance(v, tuple) else (v,) for v in values]  # one kind
            for value in values:
                _finite_values(list(value), spec)
        else:
            _finite_values(values, spec)
        return key, values
    if ".." not in text:
        value = parse_value(text, where)
        return key, _finite_values(list(value) if isinstance(value, tuple) else [value], spec)
    lo_text, _, rest = text.partition("..")
    hi_text, _, step_text = rest.partition(":")
    lo, hi = _number(lo_text, spec), _number(hi_text, spec)
    step = _number(step_text, spec) if step_text else 1
    if step <= 0:
        raise ValueError(f"--sweep {spec}: the step must be > 0")
    if hi < lo:
        raise ValueError(f"--sweep {spec} is an empty range; put the lower bound first, "
                         f"e.g. {key}={hi}..{lo}")
    span = (hi - lo) / step
    if not math.isfinite(span) or span >= MAX_SWEEP_VALUES:
        shown = budget.readable(int(span) + 1) if math.isfinite(span) else "more than 1e+308"
        raise ValueError(f"--sweep {spec} has {shown} values, over the {MAX_SWEEP_VALUES:,} "
                         "a key may sweep; use a coarser step")
    count = int(span + 1e-9) + 1
    if all(isinstance(v, int) for v in (lo, hi, step)):
        return key, [lo + i * step for i in range(count)]
    return key, [round(lo + i * step, 10) for i in range(count)]


def parse_sweeps(specs: list[str]) -> list[tuple[str, list]]:
    """Every ``--sweep``; one key swept twice is refused (the grids would not say
    which values were meant)."""
    sweeps = [parse_sweep(spec) for spec in specs]
    refuse_repeats([key for key, _ in sweeps], "--sweep")
    return sweeps


def _accepts(policy: str, key: str) -> bool:
    return (key in entry(policy).params.model_fields or key in acceptance.KEYS
            or key in RUN_KEYS or key in SCENARIO_KEYS)


def _not_taken(key: str, policies: list[str]) -> str:
    """The refusal of a key no chosen policy takes, with the nearest valid key and
    every valid one."""
    valid = sorted({k for p in policies for k in entry(p).params.model_fields}
                   | set(acceptance.KEYS) | set(RUN_KEYS) | set(SCENARIO_KEYS))
    near = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean '{near[0]}'? " if near else ""
    return (f"no chosen policy takes '{key}'; {hint}the keys of "
            f"{', '.join(policies)} are {', '.join(valid)}")


def check_keys(policies: list[str], sweeps: list[tuple[str, list]], sets: dict) -> None:
    """Each key given once across --sweep and --set, and taken by some policy."""
    keys = [k for k, _ in sweeps] + list(sets)
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"'{twice[0]}' is given twice across --sweep and --set; keep one")
    for key in keys:
        if not any(_accepts(p, key) for p in policies):
            raise ValueError(_not_taken(key, policies))


def expand_grid(policies: list[str], sweeps: list[tuple[str, list]],
                sets: dict[str, Any] | None = None) -> list[Point]:
    """Every policy crossed with the swept values it takes; deterministic order."""
    sets = dict(sets or {})
    check_keys(policies, sweeps, sets)
    points: dict[Point, None] = {}  # insertion-ordered, a repeated point once
    for policy in policies:
        fixed = tuple((k, v) for k, v in sets.items() if _accepts(policy, k))
        mine = [(k, vals) for k, vals in sweeps if _accepts(policy, k)]
        for combo in itertools.product(*[vals for _, vals in mine]):
            points.setdefault(Point(policy, tuple(zip([k for k, _ in mine], combo)) + fixed))
    return list(points)


def fixed_point(policy: str, sets: dict[str, Any]) -> Point:
    """``policy`` with the settings of ``sets`` it takes: its point of an unswept grid."""
    return Point(policy, tuple((k, v) for k, v in sets.items() if _accepts(policy, k)))


# ---------------------------------------------------------------- the grid's budget
def grid_settings(policies: list[str], sweeps: list[tuple[str, list]],
                  sets: dict[str, Any] | None = None) -> dict[str, tuple[int, dict]]:
    """Per policy, (points, key -> every value it takes), counted without building
    the grid: the product of the swept keys' value counts (an upper bound on the
    points expand_grid keeps, which drops repeats)."""
    check_keys(policies, sweeps, dict(sets or {}))
    out = {}
    for policy in dict.fromkeys(policies):
        mine = {k: list(vals) for k, vals in sweeps if _accepts(policy, k)}
        mine.update({k: [v] for k, v in (sets or {}).items() if _accepts(policy, k)})
        count = math.prod(len(vals) for k, vals in sweeps if _accepts(policy, k))
        out[policy] = (count, mine)
    return out


def points_settings(points: list[Point]) -> dict[str, tuple[int, dict]]:
    """The same as grid_settings for a grid already built (the API's callers)."""
    out: dict[str, tuple[int, dict]] = {}
    for point in points:
        count, values = out.get(point.policy, (0, {}))
        for key, value in point.sets:
            values.setdefault(key, []).append(value)
        out[point.policy] = (count + 1, values)
    return out


def grid_estimate(by_policy: dict[str, tuple[int, dict]], base: dict,
                  sweeps: list[tuple[str, list]] = ()):
    """The grid's work (analyses.run.budget): every point at its most costly
    values, and for every point but an ``ar`` one its AR baseline."""
    tokens, batch = int(base.get("tokens", 2000)), int(base.get("batch", 1))
    models = budget.Models(base.get("target"), base.get("draft"))
    units, total, baselines = 0, 0, 0
    widest = batch
    for policy, (count, values) in by_policy.items():
        # a swept batch counts at its largest (a value that is no batch is refused later)
        rows = max([batch, *(v for v in values.get("batch", []) if isinstance(v, int))])
        widest = max(widest, rows)
        run, own = budget.point_units(policy, values, tokens, rows, models)
        per_point = run + own
        if policy != AR:  # the baselines the points share are run once: at most one each
            baselines += count
        units += count * per_point
        total += count
    grid = " x ".join(f"{budget.readable(len(vals))} {key}" for key, vals in sweeps)
    policies = f"{len(by_policy)} {'policy' if len(by_policy) == 1 else 'policies'}"
    points = (f"{grid} sweep values over {policies}" if grid
              else f"{budget.plural(total, 'grid point')} over {policies}")
    shared = f" (and up to {budget.readable(baselines)} AR baselines)" if baselines else ""
    product = (f"{points} = {budget.plural(total, 'simulation')}{shared} of "
               f"{budget.plural(tokens, 'token')} x {budget.plural(widest, 'sequence')}")
    return budget.sim_estimate("compare", product, units,
                               "narrow --sweep, drop policies or lower --tokens or --batch",
                               total + baselines)


def point_config(point: Point, base: dict) -> RunConfig:
    """The RunConfig of one point; ``base`` holds platform, models, tokens, ..."""
    sets = dict(point.sets)
    scenario = {k: sets.pop(k) for k in SCENARIO_KEYS if k in sets}
    params, acc, run = split_sets(point.policy, sets)
    fields = {**base, **scenario, "policy": point.policy, "params": params,
              "acceptance": acc, **run}
    if "acceptance" in base and not any(k in acceptance.KEYS for k, _ in point.sets):
        fields["acceptance"] = base["acceptance"]
    if point.policy == AR:
        fields["draft"] = None
    return RunConfig(**fields)


def _why_invalid(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        named = f"field '{where}': " if where else ""  # a check across fields
        return named + first["msg"].removeprefix("Value error, ")
    return str(exc).splitlines()[0]


def check_points(points: list[Point], base: dict) -> list[RunConfig]:
    """The points' configs, each validated once here. Refuse the grid when a point's
    own values are invalid (alpha beyond 1, a NaN gamma): that is a mistake in
    --sweep/--set, not a policy that does not apply, so it is one error before any
    run rather than a skipped point in the report."""
    try:
        RunConfig(**base)
    except ValidationError as exc:
        first = exc.errors()[0]
        option = "--" + "-".join(str(p) for p in first["loc"][:1]).replace("_", "-")
        raise ValueError(f"{option}: {first['msg'].removeprefix('Value error, ')}") from None
    configs = []
    for point in points:
        try:
            config = point_config(point, base)  # validates its params and acceptance
            # the scenario's models (an ar point drops the draft): a setting they
            # cannot take is refused for the grid, not skipped as not applying
            check_expert_parallel(config.model_copy(update={"draft": base.get("draft")}))
        except (ValidationError, PolicyError, ValueError) as exc:
            raise ValueError(f"{point.label} is not a valid setting ({_why_invalid(exc)}); "
                             f"fix the --sweep or --set value{_range_hint(point)}") from None
        configs.append(config)
    return configs


def _range_hint(point: Point) -> str:
    """' (a range is written KEY=A..B, e.g. gamma=2..8)' where a value reads as a
    range in another notation (2-8, 2:8, 2 to 8)."""
    for key, value in point.sets:
        found = re.fullmatch(r"\s*(-?[\d.]+)\s*(?:-|:|to|\.\.\.)\s*(-?[\d.]+)\s*", str(value))
        if found:
            return (f" (a range is written {key}=A..B, e.g. {key}={found[1]}..{found[2]}; "
                    "a list A,B,C)")
    return ""


def _recording_outcomes():
    class Recording(Outcomes):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.accepted: dict[int, int] = {}

        def verify(self, op):
            verdict = super().verify(op)
            for k in verdict.accepted:
                key = int(round(k))
                self.accepted[key] = self.accepted.get(key, 0) + 1
            return verdict

    return Recording


def run_point(point: Point, config: RunConfig, timeline_steps: int = TIMELINE_STEPS,
              ar_tokens_per_s: float | str | None = None) -> PointResult:
    """Simulate one point, ``config`` its validated configuration (``check_points``);
    user errors become ``error``. ``ar_tokens_per_s`` is its
    baseline's tokens/s (or the baseline's error message) when the grid ran the
    baselines already; without it the baseline is simulated here."""
    holder = {}

    def factory(acc, **kwargs):
        holder["outcomes"] = _recording_outcomes()(acc, **kwargs)
        return holder["outcomes"]

    try:
        result = run_schedule(config, outcomes_factory=factory)
        metrics = metrics_of(config, result, why=False)  # explain() adds it to the best
        if ar_tokens_per_s is None:
            ar_tokens_per_s = baseline_tokens_per_s(config)
        if isinstance(ar_tokens_per_s, str):
            raise ValueError(ar_tokens_per_s)
        # every point gets its baseline's tokens/s, the AR point its own rerun
        add_speedup(metrics, ar_tokens_per_s)
    except ValueError as exc:  # PolicyError, CostError, ProfileError, ValidationError
        return PointResult(point, error=_why_invalid(exc))
    horizon_s = timeline_steps * metrics["step_latency_s"]
    spans = [tuple(s[:5]) for s in result.spans if s.start_s < horizon_s]
    return PointResult(point, metrics, None, spans, dict(sorted(
        holder["outcomes"].accepted.items())))


def run_packed(args) -> PointResult:
    return run_point(*args)


def _baseline_key(config: RunConfig) -> str:
    return baseline_config(config).model_dump_json()


def _baseline_packed(key: str) -> float | str:
    """Tokens/s of one baseline configuration, or its error's first line."""
    try:
        result = run_schedule(RunConfig.model_validate_json(key), record_spans=False)
    except ValueError as exc:
        return _why_invalid(exc)
    return result.tokens / result.time_s


def point_tasks(points: list[Point], configs: list[RunConfig], mapper) -> list[tuple]:
    """Each point's arguments, its config and its baseline's tokens/s among them:
    the distinct baselines of the grid (many points share one AR run) are
    simulated once, through ``mapper`` (the pool's map), before the points."""
    keys = [_baseline_key(c) for c in configs]
    unique = sorted(set(keys))
    rates = dict(zip(unique, mapper(_baseline_packed, unique)))
    return [(p, c, TIMELINE_STEPS, rates[k]) for p, c, k in zip(points, configs, keys)]


def progress_bar(total: int, quiet: bool):
    return tqdm(total=total, desc="simulating", unit="run", file=sys.stderr,
                disable=quiet or total <= 1, leave=False)


def run_grid(points: list[Point], base: dict, *, jobs: int | None = None,
             backend: str = "local", quiet: bool = False,
             allow_large: bool = False) -> list[PointResult]:
    """Run every point; results in the points' order whatever finishes first.
    A grid over the work budget is refused unless ``allow_large``
    (analyses.run.budget); invalid values are refused before any point runs
    (``check_points``)."""
    check(grid_estimate(points_settings(points), base), allow_large, announce=not quiet)
    configs = check_points(points, base)
    if backend == "ray":
        return run_grid_ray(points, configs, quiet=quiet)
    if backend != "local":
        raise ValueError(f"unknown --backend '{backend}'; choose local or ray")
    with local_mapper(local_jobs(jobs, len(points))) as mapper:
        return run_all(run_packed, point_tasks(points, configs, mapper), mapper, quiet)


def run_grid_ray(points: list[Point], configs: list[RunConfig], *,
                 address: str | None = None, quiet: bool = False) -> list[PointResult]:
    """Every point on a Ray cluster (``analyses.compare.sweep_ray``), in order."""
    sweep_ray.connect(address)
    return run_on_ray(run_packed, point_tasks(points, configs, sweep_ray.ray_map), quiet)


def run_on_ray(fn, tasks: list, quiet: bool) -> list:
    """``fn`` of every task on the connected Ray cluster, in order, with progress."""
    with progress_bar(len(tasks), quiet) as bar:
        return sweep_ray.run_all(fn, tasks, bar.update)


def local_jobs(jobs: int | None, tasks: int) -> int:
    """Worker processes for ``tasks``: ``jobs`` (default: every core), at most one a
    task, at least one."""
    return max(1, min(jobs or os.cpu_count() or 1, tasks))


@contextlib.contextmanager
def local_mapper(jobs: int):
    """A map over ``jobs`` local processes (the built-in map for one): the pool is
    closed once every result is in, terminated on an error or an interrupt."""
    if jobs == 1:
        yield map
        return
    pool = worker_pool(jobs)
    try:
        yield lambda fn, items: pool.imap(fn, items, chunksize=1)
        pool.close()  # every result is in: let the workers finish on their own
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


def worker_pool(jobs: int):
    """A worker pool started from a fresh server process, not forked from this
    one: a forked child inherits whatever lock another thread of the caller (a
    test runner's, a progress bar's) held at that instant, and one such worker
    once blocked forever on the task queue. The server imports this module
    once, so each worker starts without re-importing the simulator."""
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() \
        else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx.Pool(jobs)


def run_all(fn, tasks: list, mapper, quiet: bool) -> list:
    """``fn`` of every task through ``mapper``, in order, with a progress bar."""
    out = []
    with progress_bar(len(tasks), quiet) as bar:
        for res in mapper(fn, tasks):
            out.append(res)
            bar.update()
    return out
