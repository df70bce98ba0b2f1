"""What a comparison compares, resolved and counted before anything runs.

A ``Scenario`` is the comparison's inputs as a notebook writes them (the command
line parses its options into one). ``resolve`` turns it into the policies, sweeps,
fixed settings and base configuration a grid runs, filling in the settings the
compared schedules declare (``register(..., defaults=...)``, ``policies.declared``);
``check_budget`` counts the work, a tuned search at the most points it can take,
and refuses it over the budget before any point is simulated.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from analyses.compare.sweep import (SCENARIO_KEYS, fixed_point, grid_estimate, grid_settings,
                                    point_config)
from analyses.compare.tune import estimate
from analyses.run.api import check_runnable
from analyses.run.budget import check
from analyses.run.config import NGRAM, SIM_TOKENS, split_items
from analyses.run.measuredbudget import runs_estimate
from hwprofiles import load_model, load_platform
from hwprofiles.schema import check_overrides
from policies import entry, names
from policies.base import AR, parse_params
from simcore import acceptance


@dataclass
class Scenario:
    """The inputs of a comparison. ``policies``: None for every registered schedule;
    ``platform``: one name or several (compared side by side, as a swept platform);
    ``sweeps``: (key, values) pairs, a grid; ``sets``: a fixed setting for every
    schedule that takes it; ``tune``: without sweeps, search each schedule's tuned
    parameter for its best value; ``runs``: measured runs to replay beside the
    simulations (``profile``: the platform they are replayed on); ``batch``: None
    for 1 unless a sweep or --set gives the batch (given beside them, refused);
    ``draft``: a model, None, or ``ngram`` (prompt lookup: sd and tree propose by
    it, ``ar`` is their baseline)."""

    platform: str | list[str] = "m2-ultra-8x"
    target: str = "qwen3-32b"
    draft: str | None = "qwen3-0.6b"
    policies: list[str] | None = None
    sweeps: list[tuple[str, list]] = field(default_factory=list)
    sets: dict = field(default_factory=dict)
    tokens: int = SIM_TOKENS
    batch: int | None = None
    seed: int = 0
    placement: dict = field(default_factory=dict)
    stack: str | None = None
    tune: bool = True
    runs: str | None = None
    profile: str | None = None
    jobs: int | None = None
    backend: str = "local"
    allow_large: bool = False

    def platforms(self) -> list[str]:
        if isinstance(self.platform, str):
            return split_items(self.platform, f"--platform {self.platform}", unique=True)
        return list(self.platform)


@dataclass
class Resolved:
    """A scenario as the grid runs it: policies, sweeps, fixed settings (the
    schedules' declared defaults included) and the base configuration."""

    policies: list[str]
    sweeps: list[tuple[str, list]]
    sets: dict
    base: dict

    @property
    def platforms(self) -> list[str]:
        """The platforms compared: the swept ones, or the one of the scenario."""
        return platforms_of(self.base, self.sweeps)

    def split(self) -> tuple[list[dict], list]:
        """(every combination of the swept scenario keys, platform and batch, as
        settings: [{}] when none is swept; the other sweeps)."""
        mine = [(k, v) for k, v in self.sweeps if k in SCENARIO_KEYS]
        combos = [dict(zip([k for k, _ in mine], values))
                  for values in itertools.product(*[v for _, v in mine])]
        return combos, [(k, v) for k, v in self.sweeps if k not in SCENARIO_KEYS]


def platforms_of(base: dict, sweeps: list) -> list[str]:
    return next((list(v) for k, v in sweeps if k == "platform"), [base["platform"]])


def resolve(s: Scenario) -> Resolved:
    """The scenario's grid inputs, its platform and models loaded and checked."""
    policies = list(s.policies) if s.policies is not None else names()
    for p in policies:
        entry(p)
    sweeps, platforms, sets = [(k, list(v)) for k, v in s.sweeps], s.platforms(), dict(s.sets)
    refuse_repeated_values(sweeps)
    refuse_given_twice(s, sweeps, sets)
    if len(platforms) > 1:
        if any(k == "platform" for k, _ in sweeps):
            raise ValueError("--platform lists several platforms and --sweep platform= "
                             "lists them again; keep one")
        sweeps.append(("platform", platforms))
    draft = None if str(s.draft).lower() == "none" else s.draft
    if draft == NGRAM:  # a proposer, not a model: the schedules that take it, set to it
        policies, sets, draft = lookup_policies(s.policies, policies, sweeps, sets), \
            {**sets, "proposer": NGRAM}, None
    base = dict(platform=platforms[0], target=s.target, draft=draft, tokens=s.tokens,
                batch=1 if s.batch is None else s.batch, seed=s.seed,
                placement=dict(s.placement))
    if s.stack is not None:
        if "stack" in sets or any(k == "stack" for k, _ in sweeps):
            raise ValueError("--stack and --set/--sweep stack= both name a stack; keep one")
        base["stack"] = s.stack
    if "alpha" not in sets and not any(k == "alpha" for k, _ in sweeps):
        base["acceptance"] = acceptance.default()
    given = set(sets) | {k for k, _ in sweeps}
    found = Resolved(policies, sweeps, {**declared_defaults(policies, given, base), **sets},
                     base)
    _check_loads(found)
    return found


def refuse_repeated_values(sweeps: list[tuple[str, list]]) -> None:
    """A value a sweep lists twice (gamma=2,2,4) is refused: its points would run
    twice, or once with the sweep's count and the report's axis saying otherwise."""
    for key, values in sweeps:
        seen = set()
        for value in values:
            same = ("on/off", value) if isinstance(value, bool) else value  # True is not 1
            if same in seen:
                shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
                raise ValueError(f"--sweep {key} lists {shown} twice; give each value once")
            seen.add(same)


def refuse_given_twice(s: Scenario, sweeps: list, sets: dict) -> None:
    """--batch beside a batch a sweep or --set gives (the run would take theirs and
    drop --batch in silence) is refused, naming both."""
    if s.batch is None:
        return
    for key, values in sweeps:
        if key == "batch":
            listed = ",".join(map(str, values))
            raise ValueError(f"--batch {s.batch} and --sweep batch={listed} both give the "
                             "batch (the sweep's would run, --batch none); keep one")
    if "batch" in sets:
        raise ValueError(f"--batch {s.batch} and --set batch={sets['batch']} both give the "
                         "batch; keep one")


def lookup_policies(asked: list[str] | None, policies: list[str], sweeps: list,
                    sets: dict) -> list[str]:
    """The schedules a comparison with --draft ngram runs: those whose proposer may
    be prompt lookup (``proposer``: sd, tree) and ``ar``, their baseline; every one
    of them when --policies is not given, else a listed one that takes no lookup
    is refused by name. A lookup needs what it proposes (``match`` or a ``trace``),
    and a fixed setting it ignores (a draft model's draft_layers) is refused in the
    schedule's words (``PolicyParams.unused``), as simulate refuses it."""
    takes = [p for p in names() if "proposer" in entry(p).params.model_fields]
    for policy in asked or ():
        if policy != AR and policy not in takes:
            raise ValueError(f"--draft {NGRAM} (prompt lookup) works with policy "
                             f"{' or '.join(takes)} (beside ar, their baseline), not "
                             f"'{policy}'; drop it from --policies or name a draft model")
    given = set(sets) | {k for k, _ in sweeps}
    if "proposer" in given:
        raise ValueError(f"--draft {NGRAM} and --set/--sweep proposer= both choose the "
                         "proposer; keep one")
    if not given & {"match", "trace"}:
        raise ValueError(f"--draft {NGRAM} needs what a prompt lookup proposes: --set "
                         "match=P (the chance a lookup finds a match) or --set "
                         "trace=acceptance.jsonl of a measured ngram run")
    chosen = policies if asked is not None else [p for p in policies if p == AR or p in takes]
    for policy in (p for p in chosen if p in takes):  # a draft model's setting, say
        fields = entry(policy).params.model_fields
        mine = {k: v for k, v in sets.items() if k in fields}
        try:
            why = parse_params(policy, {**mine, "proposer": NGRAM}).unused()
        except ValueError:
            continue  # an invalid value: the grid's own check names it
        if why:
            raise ValueError(f"{policy}: {why}")
    return chosen


def declared_defaults(policies: list[str], given: set[str], base: dict) -> dict:
    """The settings the compared schedules declare a comparison fills in
    (``policies.declared.Default``) that the user gave neither directly nor through
    a setting that decides them instead (SSD's r or hit_trace for its hit rate)."""
    out = {}
    for policy in policies:
        for d in entry(policy).defaults:
            if d.key not in out and not given & {d.key, *d.unless}:
                out[d.key] = d.value_for(load_model(base["target"]))
    return out


def _check_loads(found: Resolved) -> None:
    for platform in found.platforms:
        check_overrides(load_platform(str(platform)), found.base["placement"])
    load_model(found.base["target"])
    if found.base["draft"]:
        load_model(found.base["draft"])


def runnable(policies: list[str], sets: dict, base: dict, combos=({},)) -> list[str]:
    """The schedules whose first point some compared scenario would run, judged
    without simulating (``analyses.run.api.check_runnable``). One that cannot (its
    device has no storage tier to stream weights from, its weights do not fit) is
    skipped by the comparison at the cost of that check, so the work budget leaves
    it out; a point that fails its validation is counted (it is refused in its own
    words)."""
    out = []
    for policy in policies:
        for combo in combos:
            point = fixed_point(policy, {**sets, **combo})
            try:
                config = point_config(point, base)
            except ValueError:
                out.append(policy)
                break
            try:
                check_runnable(config)
            except ValueError:
                continue
            out.append(policy)
            break
    return out


def check_budget(s: Scenario, found: Resolved, searches=(), combos=({},)) -> None:
    """Refuse the comparison over the work budget before any point runs (a 1e9-point
    grid is counted, never listed); a tuned schedule counts the most points its
    search can take, once per platform and batch compared; measured runs count
    their spans. Only the schedules ``runnable`` finds count."""
    counted = runnable(found.policies, found.sets, found.base, combos)
    settings = {p: v for p, v in grid_settings(found.policies, found.sweeps, found.sets).items()
                if p in counted}
    searches = [x for x in searches if x.policy in counted]
    if searches:
        tuned = {x.policy for x in searches}
        works = [estimate(searches, {p: v for p, (_n, v) in settings.items() if p not in tuned},
                          {p: v for p, (_n, v) in settings.items()}, {**found.base, **combo})
                 for combo in combos]
        work = works[0] if len(works) == 1 else _summed(works)
    else:
        work = grid_estimate(settings, found.base, found.sweeps)
    check(work, s.allow_large, announce=False)
    if s.runs:
        check(runs_estimate(s.runs, "compare --runs"), s.allow_large)


def _summed(works: list):
    """One estimate for the same tuned comparison run once per scenario."""
    largest = max(works, key=lambda w: w.units)
    return replace(largest, product=f"{len(works)} platform and batch settings, each of at "
                                    f"most {largest.product}",
                   units=sum(w.units for w in works),
                   simulations=sum(w.simulations for w in works))
