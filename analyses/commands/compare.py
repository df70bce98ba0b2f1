"""hetspec compare: run a grid of policies and settings and write a plotly report."""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace

from analyses.cli import (SIM_TOKENS, SettingsHelp, add_stack_argument, emit_json, paragraph,
                         settings_help)
from analyses.commands import COMMANDS
from analyses.compare.best import baseline_label, best_per_policy, fastest, skipped_policies
from analyses.compare.crossover import crossovers
from analyses.compare.sweep import (Point, SCENARIO_KEYS, expand_grid, grid_estimate,
                                    fixed_point, grid_settings, parse_sweeps,
                                    point_config, run_grid, run_point)
from analyses.compare.tune import estimate, run_searches, searches
from analyses.measured.replay import replay_dir
from analyses.run.budget import SIM_BUDGET_UNITS, allow_large_argument, check, readable
from analyses.run.measuredbudget import runs_estimate
from analyses.run.config import parse_placement, parse_sets, split_items
from analyses.run.outputs import check_outputs, profile_inputs, runs_inputs, set_inputs
from hwprofiles import load_model, load_platform
from hwprofiles.schema import check_overrides
from policies import entry, names
from policies.runs.breakdown import sentence
from simcore import acceptance

DEFAULTS = {"platform": "m2-ultra-8x", "target": "qwen3-32b", "draft": "qwen3-0.6b"}
DEFAULT_OUTPUT = "hetspec-report.html"
COMPARE_BUDGET = (f"{readable(SIM_BUDGET_UNITS)} row-steps, sweep points x policies x "
                  "tokens x batch with their AR baselines, about 10 minutes on one CPU "
                  "core; 'hetspec compare' with no arguments is a fifth of it")


PROBE_TOKENS = 4  # tokens a schedule's probe simulates (runnable)


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help=COMMANDS["compare"],
        description=paragraph(
            "Simulate every chosen policy over the swept settings (in parallel) and write "
            "one self-contained HTML report (plotly, opens offline). With no arguments: "
            "Qwen3-32B with a Qwen3-0.6B draft on m2-ultra-8x, every policy that applies, "
            "each at its best gamma (SSD: its best k)."),
        formatter_class=SettingsHelp,
        epilog=lambda: settings_help() + "\n\nexample: hetspec compare --platform m2-ultra-8x "
               "--target qwen3-32b --draft qwen3-0.6b \\\n    --policies ar,sd,mirror "
               "--sweep gamma=2..6 -o report.html")
    p.add_argument("--platform", default=DEFAULTS["platform"],
                   help=f"platform name or YAML path (default {DEFAULTS['platform']}); "
                        "several apart with ',' (h100-sxm-8x,a100-sxm-8x) compare them in "
                        "one report, side by side, as --sweep platform=... does")
    p.add_argument("--target", default=DEFAULTS["target"],
                   help=f"target model (default {DEFAULTS['target']})")
    p.add_argument("--draft", default=DEFAULTS["draft"],
                   help=f"draft model (default {DEFAULTS['draft']}); 'none' for no draft")
    p.add_argument("--policies", help="comma-separated schedules (default: every "
                   "registered one; those that do not apply are skipped with a note)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=RANGE",
                   help="swept setting: gamma=2..6, alpha=0.6..0.9:0.1 or gamma=2,4,8 "
                        "(prompt_tokens=128,1024,8192 adds time to first token per "
                        "policy; batch=1,8,32 and platform=a,b put batches and platforms "
                        "side by side, each schedule still tuned; list values apart "
                        "with ';': tree='4,2,2,1;3,3,1'); "
                        "repeat for a grid. Without --sweep each schedule is tuned "
                        "instead: its gamma (SSD: k) searched over its whole valid range")
    p.add_argument("--no-tune", action="store_true",
                   help="without --sweep, run each schedule at its default gamma (SSD: k) "
                        "instead of searching for its best")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a fixed setting for every policy that takes it (alpha=0.8 ...)")
    p.add_argument("--tokens", type=int, default=SIM_TOKENS,
                   help=f"tokens to generate per sequence in each run (default {SIM_TOKENS})")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--placement", help="role=device overrides, e.g. draft=gpu4")
    add_stack_argument(p)
    p.add_argument("--runs", metavar="DIR", help="measured run records to replay and "
                   "compare with (adds predicted-vs-measured and sim-vs-real views)")
    p.add_argument("--profile", help="platform the measured runs are replayed on "
                   "(default: each run's own, e.g. a calibrated.yaml)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local processes (default) or a Ray cluster (RAY_ADDRESS)")
    p.add_argument("--jobs", type=positive_int, help="local worker processes, at least 1 "
                   "(default: all cores)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                   help=f"HTML report path (default ./{DEFAULT_OUTPUT})")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    allow_large_argument(p, COMPARE_BUDGET)
    p.set_defaults(func=_compare)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number; give 1 or "
                                         "more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; give 1 or more worker "
                                         "processes, or leave it out for all cores")
    return value


def scenario(args) -> tuple[list[str], list, dict, dict]:
    """(policies, sweeps, fixed sets, base config fields) from the arguments."""
    policies = (split_items(args.policies, f"--policies {args.policies}", unique=True)
                if args.policies is not None else names())
    for p in policies:
        entry(p)
    sweeps = parse_sweeps(args.sweep)
    platforms = split_items(args.platform, f"--platform {args.platform}", unique=True)
    if len(platforms) > 1:
        if any(k == "platform" for k, _ in sweeps):
            raise ValueError("--platform lists several platforms and --sweep platform= "
                             "lists them again; keep one")
        sweeps.append(("platform", platforms))
    sets = parse_sets(args.sets)
    draft = None if str(args.draft).lower() == "none" else args.draft
    base = dict(platform=platforms[0], target=args.target, draft=draft,
                tokens=args.tokens, batch=args.batch, seed=args.seed,
                placement=parse_placement(args.placement))
    if args.stack is not None:
        if "stack" in sets or any(k == "stack" for k, _ in sweeps):
            raise ValueError("--stack and --set/--sweep stack= both name a stack; keep one")
        base["stack"] = args.stack
    if "alpha" not in sets and not any(k == "alpha" for k, _ in sweeps):
        base["acceptance"] = acceptance.default()
    sets = {**required_defaults(policies, set(sets) | {k for k, _ in sweeps}, base),
            **sets}
    return policies, sweeps, sets, base


SSD_HIT_RATE = 0.7  # assumed per-row hit rate of the speculation cache


def required_defaults(policies: list[str], given: set[str], base: dict) -> dict:
    """Values for settings some schedules require and the user did not give: the
    SSD hit rate (an assumption the report states) and the DRAM budget of the
    weight-streaming schedules (half the target's decoder weights, the regime
    they are made for)."""
    out = {}
    fields = {p: entry(p).params.model_fields for p in policies}
    if any("hit_rate" in f for f in fields.values()) and not given & {"hit_rate", "r",
                                                                      "hit_trace"}:
        out["hit_rate"] = SSD_HIT_RATE
    needs_budget = any("dram_budget_gb" in f and (f["dram_budget_gb"].is_required()
                                                  or f["dram_budget_gb"].default is None)
                       for f in fields.values())
    if needs_budget and "dram_budget_gb" not in given:
        spec = load_model(base["target"])
        out["dram_budget_gb"] = round(0.5 * spec.n_layers * spec.layer_bytes / 1e9, 2)
    return out


def split_scenarios(sweeps: list) -> tuple[list[dict], list]:
    """(every combination of the swept scenario keys, platform and batch, as
    settings: [{}] when none is swept; the other sweeps)."""
    mine = [(k, v) for k, v in sweeps if k in SCENARIO_KEYS]
    combos = [dict(zip([k for k, _ in mine], values))
              for values in itertools.product(*[v for _, v in mine])]
    return combos, [(k, v) for k, v in sweeps if k not in SCENARIO_KEYS]


def platforms_of(base: dict, sweeps: list) -> list[str]:
    """The platforms compared: the swept ones, or the one of the scenario."""
    return next((list(v) for k, v in sweeps if k == "platform"), [base["platform"]])


def _check_scenario(base: dict, sweeps: list) -> None:
    for platform in platforms_of(base, sweeps):
        check_overrides(load_platform(str(platform)), base["placement"])
    load_model(base["target"])
    if base["draft"]:
        load_model(base["draft"])


def _compare(args) -> int:
    from analyses.compare import report
    _options_used(args)
    policies, sweeps, sets, base = scenario(args)
    _check_scenario(base, sweeps)
    _check_output(args, base, sets, sweeps)
    combos, swept = split_scenarios(sweeps)
    tuning = not swept and not args.no_tune
    found = tuned_searches(policies, sets) if tuning else []
    check_budget(args, policies, sweeps, sets, base, found, combos,
                 counted=runnable(policies, sets, base, combos))
    replays = _replays(args) if args.runs else None
    if found:
        results, sweep_keys, notes = run_scenarios(args, policies, sweeps, sets, base,
                                                   combos)
    else:
        results = run_grid(expand_grid(policies, sweeps, sets), base, jobs=args.jobs,
                           backend=args.backend, allow_large=args.allow_large)
        sweep_keys, notes = [k for k, _ in sweeps], []
    notes += edge_notes(results, swept)
    found = crossovers(results, base)  # the summary's and the report's
    sections = report.build_sections(results, base, sweep_keys, replays, notes=notes,
                                     crossover=found)
    where = ", ".join(map(str, platforms_of(base, sweeps)))
    title = (f"hetspec: {base['target']} + {base['draft']} on {where}"
             if base["draft"] else f"hetspec: {base['target']} on {where}")
    if base.get("stack"):
        title += f" under stack {base['stack']}"
    intro = report.scenario_intro(results, base, sets,
                                  platforms=platforms_of(base, sweeps))
    text = report.render_html(title, intro, sections)
    path = report.write_report(args.output, text)
    summary = _summary(results, path, found)
    summary["notes"] = notes
    if args.json:
        emit_json(summary)
    else:
        print(summary["line"])
        for note in notes:
            print(f"  {note}")
        for found in summary["crossover"]:
            print(f"  {found['sentence']}")
    return 0 if summary["fastest"] else 1


def run_scenarios(args, policies: list[str], sweeps: list, sets: dict, base: dict,
                  combos: list[dict]) -> tuple[list, list[str], list[str]]:
    """(results, sweep keys, notes) of a tuned comparison, each platform and batch
    tuned on its own (one scenario when neither is swept)."""
    results, notes, keys = [], [], set()
    for combo in combos:
        searches = tuned_searches(policies, sets)
        results += run_tuned(args, policies, {**sets, **combo}, base, searches)
        notes += [f"{_label(combo)}{n}" for n in tuning_notes(searches)]
        keys |= {s.key for s in searches}
    return results, sorted(keys, key=lambda k: k != "gamma") + [k for k, _ in sweeps], notes


def _label(combo: dict) -> str:
    """'platform=a100-sxm-8x, batch=8: ' before a note of one scenario ('' for none)."""
    return "".join(f"{k}={v}, " for k, v in combo.items())[:-2] + ": " if combo else ""


def check_budget(args, policies: list[str], sweeps: list, sets: dict, base: dict,
                 searches=(), combos=({},), counted=None) -> None:
    """Refuse a grid over the work budget before it is built (a 1e9-point grid is
    counted, never listed); a tuned schedule counts the most points its search can
    take, once per platform and batch compared; with --runs the measured runs'
    spans count too. Only the schedules in ``counted`` (default all) count."""
    settings = grid_settings(policies, sweeps, sets)
    if counted is not None:
        settings = {p: v for p, v in settings.items() if p in counted}
        searches = [s for s in searches if s.policy in counted]
    if searches:
        tuned = {s.policy for s in searches}
        works = [estimate(searches, {p: v for p, (_n, v) in settings.items()
                                     if p not in tuned},
                          {p: v for p, (_n, v) in settings.items()}, {**base, **combo})
                 for combo in combos]
        work = works[0] if len(works) == 1 else _summed(works)
    else:
        work = grid_estimate(settings, base, sweeps)
    check(work, args.allow_large, announce=False)
    if args.runs:
        check(runs_estimate(args.runs, "compare --runs"), args.allow_large)


def runnable(policies: list[str], sets: dict, base: dict, combos=({},)) -> list[str]:
    """The schedules whose first point simulates a few tokens in some compared
    scenario. One that cannot (its device has no storage tier to stream weights
    from, its placement names no device of the platform) is skipped by the
    comparison at the cost of that failure, so the work budget leaves it out; a
    point that fails its validation is counted (it is refused in its own words)."""
    out = []
    for policy in policies:
        for combo in combos:
            point = fixed_point(policy, {**sets, **combo})
            try:
                config = point_config(point, {**base, "tokens": PROBE_TOKENS})
            except ValueError:
                out.append(policy)
                break
            if run_point(point, config, ar_tokens_per_s=1.0).error is None:
                out.append(policy)
                break
    return out


def _summed(works: list):
    """One estimate for the same tuned comparison run once per scenario."""
    return replace(max(works, key=lambda w: w.units),
                   product=f"{len(works)} platform and batch settings, each of at most "
                           f"{max(works, key=lambda w: w.units).product}",
                   units=sum(w.units for w in works),
                   simulations=sum(w.simulations for w in works))


def tuned_searches(policies: list[str], sets: dict) -> list:
    """The searches of a tuned comparison: every schedule whose main integer
    parameter (analyses.compare.tune.TUNED) the user did not --set."""
    return searches(policies, fixed=set(sets))


def run_tuned(args, policies: list[str], sets: dict, base: dict, found: list) -> list:
    """Every schedule at its best setting: the untuned ones once, the tuned ones
    searched round by round (each round's points in parallel); every point run
    is kept for the report."""
    fixed = {p.policy: p for p in expand_grid(policies, [], sets)}
    tuned = {s.policy for s in found}
    results = []

    def evaluate(batch, extra=()):
        points = [Point(policy, ((key, value),) + fixed[policy].sets)
                  for policy, key, value in batch]
        # the whole search's work passed check_budget before the first round (its
        # estimate bounds every round): a round's grid is not checked again, which
        # would count the schedules that cannot run here (runnable) at full cost
        done = run_grid(points + list(extra), base, jobs=args.jobs, backend=args.backend,
                        allow_large=True, quiet=True)
        results.extend(done)
        return [r.metrics["tokens_per_s"] if r.metrics else None for r in done[:len(batch)]]

    first = [p for name, p in fixed.items() if name not in tuned]
    # the untuned schedules run once, beside the first round (every search has a ladder)
    run_searches(found, lambda batch: evaluate(batch, () if results else first))
    order = {p: i for i, p in enumerate(policies)}
    return sorted(results, key=lambda r: (order[r.point.policy], r.point.sets))


def tuning_notes(found: list) -> list[str]:
    """One line per tuned schedule whose best value sits on its valid bound."""
    return [f"{s.policy}: {s.on_bound}; the search could go no further" for s in found
            if s.best is not None and s.on_bound]


def edge_notes(results: list, sweeps: list) -> list[str]:
    """One line per schedule whose best point sits on the edge of a numeric --sweep."""
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


def _options_used(args) -> None:
    """Refuse an option the rest of the command line leaves without effect."""
    if args.profile and not args.runs:
        raise ValueError(f"--profile {args.profile} has no effect without --runs (it is "
                         "the platform measured runs are replayed on); add --runs DIR or "
                         "drop --profile")
    if args.jobs is not None and args.backend == "ray":
        raise ValueError(f"--jobs {args.jobs} has no effect with --backend ray (the "
                         "cluster schedules the points); drop --jobs")


def _check_output(args, base: dict, sets: dict, sweeps: list) -> None:
    inputs = profile_inputs(platform=base["platform"], target=base["target"],
                            draft=base["draft"], profile=args.profile) + set_inputs(sets)
    for platform in platforms_of(base, sweeps)[1:]:
        inputs += profile_inputs(platform=str(platform))
    check_outputs({"--output": args.output},
                  inputs + (runs_inputs(args.runs) if args.runs else []),
                  names={"--output": DEFAULT_OUTPUT})


def _replays(args):
    return replay_dir(args.runs, profile=args.profile)


def _summary(results, path, found) -> dict:
    best = fastest(results)
    skipped = skipped_policies(results)
    line = f"wrote {path}: "
    if best is None:
        line += "no policy applies to this scenario (" + "; ".join(
            f"{p}: {why}" for p, why in skipped.items()) + ")"
        print(line, file=sys.stderr)
    else:
        line += (f"fastest is {best.point.label} at {best.metrics['tokens_per_s']:.1f} "
                 f"tokens/s, {best.metrics['speedup_vs_ar']:.2f}x {baseline_label(best)} "
                 f"({len(results)} runs"
                 + (f"; skipped {', '.join(skipped)}" if skipped else "") + ")")
    explained = {p: r for p, r in best_per_policy(results).items()
                 if r.metrics.get("breakdown")}
    return {"report": str(path), "line": line,
            "why": {p: sentence(r.point.label, r.metrics["breakdown"])
                    for p, r in explained.items()},
            "breakdown": {p: r.metrics["breakdown"] for p, r in explained.items()},
            "fastest": best.point.label if best else None,
            "speedup_vs_ar": best.metrics["speedup_vs_ar"] if best else None,
            "tokens_per_s": best.metrics["tokens_per_s"] if best else None,
            "ttft_s": best.metrics.get("ttft_s") if best else None,
            "tpot_s": best.metrics.get("tpot_s") if best else None,
            "skipped": skipped, "points": len(results),
            # over a swept batch: where each schedule stops paying, and why
            "crossover": [c.as_dict() for c in found]}
