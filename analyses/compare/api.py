"""Compare schedules on a scenario, from Python: ``compare(Scenario(...))``.

``hetspec compare`` is this call plus argparse and printing. A notebook writes::

    >>> from analyses.compare.api import Scenario, compare
    >>> found = compare(Scenario(platform="h100-sxm-5x", target="llama-3.1-70b",
    ...                          draft="llama-3.2-1b", policies=["ar", "sd"],
    ...                          sweeps=[("gamma", [2, 4])], tokens=20, jobs=1))
    >>> found.summary()["fastest"]
    'sd(gamma=4)'
    >>> [r.point.label for r in found.points]
    ['ar', 'sd(gamma=2)', 'sd(gamma=4)']
    >>> [section.title for section in found.sections()][:2]
    ['Speed per policy', 'Why']

Without ``sweeps`` each schedule is tuned: the integer parameter its registration
names (``policies.declared.Tuned``) is searched for its best value. The work is
counted and refused over the budget before any point is simulated
(``analyses.compare.scenario.check_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from analyses.compare.best import baseline_label, best_per_policy, fastest, skipped_policies
from analyses.compare.crossover import crossovers
from analyses.compare.scenario import Resolved, Scenario, check_budget, resolve
from analyses.compare.sweep import Point, expand_grid, run_grid
from analyses.compare.tune import run_searches, searches
from analyses.compare.why import platform_summaries
from analyses.measured.replay import replay_dir
from analyses.measured.speedups import run_summary
from analyses.run.api import check_positions
from analyses.run.config import RunConfig
from hwprofiles import load_model, load_platform
from hwprofiles.provenance import unlike
from policies.base import AR
from policies.runs.breakdown import sentence

__all__ = ["Comparison", "Scenario", "compare", "prepare"]


@dataclass
class Comparison:
    """A finished comparison: ``points`` (every simulated point's result),
    ``notes`` (best points on a sweep's edge or a search's bound), ``crossover``
    (where each schedule stops paying over a swept batch), the sweep keys its
    report draws and the measured runs it replayed."""

    scenario: Resolved
    points: list
    notes: list[str]
    crossover: list
    sweep_keys: list[str]
    replays: list | None = None

    @property
    def title(self) -> str:
        base = self.scenario.base
        where = ", ".join(map(str, self.scenario.platforms))
        title = (f"hetspec: {base['target']} + {base['draft']} on {where}"
                 if base["draft"] else f"hetspec: {base['target']} on {where}")
        return title + (f" under stack {base['stack']}" if base.get("stack") else "")

    def sections(self) -> list:
        """The report's sections, figures and notes (plotly; ``report.Section``)."""
        return _report().build_sections(self.points, self.scenario.base, self.sweep_keys,
                                     self.replays, notes=self.notes,
                                     crossover=self.crossover)

    def html(self) -> str:
        """The self-contained HTML report."""
        report = _report()
        intro = report.scenario_intro(self.points, self.scenario.base, self.scenario.sets,
                                      platforms=self.scenario.platforms)
        return report.render_html(self.title, intro, self.sections())

    def write_report(self, path):
        """Write the HTML report to ``path`` (atomically); its path."""
        return _report().write_report(path, self.html())

    def summary(self) -> dict:
        """The fastest point, its speedup and latencies, why each schedule's best
        point spends its time where it does, and what was skipped; over several
        platforms also ``per_platform``: each one's fastest point and Why; with
        measured runs ``runs``: each one's speedup against its own AR, measured
        and simulated, then its tokens/s (``measured.speedups``)."""
        best = fastest(self.points)
        explained = {p: r for p, r in best_per_policy(self.points).items()
                     if r.metrics.get("breakdown")}
        several = platform_summaries(self.points, self.scenario.base)
        runs = [run_summary(r) for r in self.replays or ()]
        return {**({"per_platform": several} if several else {}),
                **({"runs": runs} if runs else {}), "why": {p: sentence(r.point.label, r.metrics["breakdown"])
                        for p, r in explained.items()},
                "breakdown": {p: r.metrics["breakdown"] for p, r in explained.items()},
                "fastest": best.point.label if best else None,
                "speedup_vs_ar": best.metrics["speedup_vs_ar"] if best else None,
                "tokens_per_s": best.metrics["tokens_per_s"] if best else None,
                "ttft_s": best.metrics.get("ttft_s") if best else None,
                "tpot_s": best.metrics.get("tpot_s") if best else None,
                "skipped": skipped_policies(self.points), "points": len(self.points),
                "crossover": [c.as_dict() for c in self.crossover], "notes": self.notes,
                "sources": self.sources}

    @property
    def sources(self) -> list[str]:
        """A sentence per aspect (memory, compute, overheads, collectives) the compared
        platforms take from different kinds of source (``hwprofiles.provenance``)."""
        names = list(dict.fromkeys(map(str, self.scenario.platforms)))
        return unlike([load_platform(n) for n in names])

    def line(self) -> str:
        """The summary in one line: the fastest point, or why none applies."""
        best, skipped = fastest(self.points), skipped_policies(self.points)
        if best is None:
            return "no policy applies to this scenario (" + "; ".join(
                f"{p}: {why}" for p, why in skipped.items()) + ")"
        return (f"fastest is {best.point.label} at {best.metrics['tokens_per_s']:.1f} "
                f"tokens/s, {best.metrics['speedup_vs_ar']:.2f}x {baseline_label(best)} "
                f"({len(self.points)} runs"
                + (f"; skipped {', '.join(skipped)}" if skipped else "") + ")")


@dataclass
class Prepared:
    """A scenario resolved and checked, nothing simulated yet: ``run`` counts its
    work against the budget, then runs it."""

    scenario: Scenario
    resolved: Resolved

    def run(self) -> Comparison:
        s, found = self.scenario, self.resolved
        combos, swept = found.split()
        tuned = searches(found.policies, set(found.sets)) if not swept and s.tune else []
        check_budget(s, found, tuned, combos)
        replays = replay_dir(s.runs, profile=s.profile) if s.runs else None
        if tuned:
            points, keys, notes = _tuned(s, found, combos)
        else:
            points = run_grid(expand_grid(found.policies, found.sweeps, found.sets),
                              found.base, jobs=s.jobs, backend=s.backend,
                              allow_large=s.allow_large)
            keys, notes = [k for k, _ in found.sweeps], []
        notes += edge_notes(points, swept)
        return Comparison(found, points, notes, crossovers(points, found.base), keys, replays)


def prepare(scenario: Scenario) -> Prepared:
    """The scenario resolved (its declared defaults filled in) and its inputs checked."""
    if scenario.profile and not scenario.runs:
        raise ValueError(f"--profile {scenario.profile} has no effect without --runs (it "
                         "is the platform measured runs are replayed on); add --runs DIR "
                         "or drop --profile")
    if scenario.jobs is not None and scenario.backend == "ray":
        raise ValueError(f"--jobs {scenario.jobs} has no effect with --backend ray (the "
                         "cluster schedules the points); drop --jobs")
    resolved = resolve(scenario)
    if not scenario.tune:
        _check_untuned(resolved)
    _check_positions(resolved)
    return Prepared(scenario, resolved)


def _check_untuned(resolved: Resolved) -> None:
    """--no-tune where no schedule would be tuned anyway (a sweep other than of
    the platform or batch runs the swept values; a schedule with no tuned
    parameter, or one --set fixes, runs once) is refused, not dropped."""
    _combos, swept = resolved.split()
    if swept:
        raise ValueError(f"--no-tune has no effect beside --sweep {swept[0][0]} (a swept "
                         "comparison runs each schedule at the swept or default values, "
                         "never tuned); drop --no-tune")
    if not searches(resolved.policies, set(resolved.sets)):
        raise ValueError(f"--no-tune has no effect: none of {', '.join(resolved.policies)} "
                         "has a parameter left to tune (none declares one, or --set fixes "
                         "it); drop --no-tune")


def _check_positions(resolved: Resolved) -> None:
    """Refuse a scenario whose every run would pass the target's trained positions
    (its prompt and tokens, unless a sweep varies them): a refusal of the scenario,
    not a report in which no schedule applies."""
    base, swept = resolved.base, {k for k, _ in resolved.sweeps}
    if swept & {"tokens", "prompt_tokens", "fixed_context"}:
        return
    sets = {k: v for k, v in dict(resolved.sets).items()
            if k in ("prompt_tokens", "fixed_context")}
    try:
        config = RunConfig(**{**base, **sets, "policy": AR, "draft": None, "params": {}})
    except ValidationError:  # a bad value: the grid's own check names its option
        return
    check_positions(config, {"target": load_model(base["target"])},
                    fix="lower --tokens or --set prompt_tokens")


def compare(scenario: Scenario) -> Comparison:
    """Simulate every schedule of ``scenario`` (each at its best tuned setting, or
    over its sweeps) and return the points, the summary and the report's data."""
    return prepare(scenario).run()


def _report():
    from analyses.compare import report  # plotly: an optional dependency
    return report


def _tuned(s: Scenario, found: Resolved, combos: list[dict]) -> tuple[list, list, list]:
    """(points, sweep keys, notes) of a tuned comparison, each platform and batch
    tuned on its own (one scenario when neither is swept)."""
    points, notes, keys = [], [], set()
    for combo in combos:
        running = searches(found.policies, set(found.sets))
        points += run_tuned(s, found.policies, {**found.sets, **combo}, found.base, running)
        label = "".join(f"{k}={v}, " for k, v in combo.items())[:-2] + ": " if combo else ""
        notes += [f"{label}{x.policy}: {x.on_bound}; the search could go no further"
                  for x in running if x.best is not None and x.on_bound]
        keys |= {x.key for x in running}
    swept = [k for k, _ in found.sweeps]
    return points, sorted(keys, key=lambda k: k != "gamma") + swept, notes


def run_tuned(s: Scenario, policies: list[str], sets: dict, base: dict, found: list) -> list:
    """Every schedule at its best setting: the untuned ones once, the tuned ones
    searched round by round (each round's points in parallel); every point run
    is kept for the report."""
    fixed = {p.policy: p for p in expand_grid(policies, [], sets)}
    tuned = {x.policy for x in found}
    results = []

    def evaluate(batch, extra=()):
        points = [Point(policy, ((key, value),) + fixed[policy].sets)
                  for policy, key, value in batch]
        # the whole search's work passed check_budget before the first round (its
        # estimate bounds every round): a round's grid is not checked again
        done = run_grid(points + list(extra), base, jobs=s.jobs, backend=s.backend,
                        allow_large=True, quiet=True)
        results.extend(done)
        return [r.metrics["tokens_per_s"] if r.metrics else None for r in done[:len(batch)]]

    first = [p for name, p in fixed.items() if name not in tuned]
    # the untuned schedules run once, beside the first round (every search has a ladder)
    run_searches(found, lambda batch: evaluate(batch, () if results else first))
    order = {p: i for i, p in enumerate(policies)}
    return sorted(results, key=lambda r: (order[r.point.policy], r.point.sets))


def edge_notes(results: list, sweeps: list) -> list[str]:
    """One line per schedule whose best point sits on the edge of a numeric sweep."""
    notes = []
    for policy, best in best_per_policy(results).items():
        sets = dict(best.point.sets)
        for key, values in sweeps:
            numbers = [v for v in values if isinstance(v, (int, float))
                       and not isinstance(v, bool)]
            if key in sets and len(numbers) >= 2 and sets[key] in (min(numbers),
                                                                   max(numbers)):
                notes.append(f"{policy}: its best {key}={sets[key]} is on the edge of "
                             f"--sweep {key}; widen the sweep (or leave --sweep out to "
                             "search the whole range)")
    return notes
