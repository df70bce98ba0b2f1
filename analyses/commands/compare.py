"""hetspec compare: run a grid of policies and settings and write a plotly report.

The comparison itself is ``analyses.compare.api.compare``; this module parses the
command line into its ``Scenario`` and prints what it found."""

from __future__ import annotations

import argparse
import sys

from analyses.cli import SettingsHelp, add_stack_argument, emit_json, paragraph, settings_help
from analyses.commands import COMMANDS
from analyses.compare.api import Scenario, prepare
from analyses.compare.sweep import parse_sweeps
from analyses.run.budget import SIM_BUDGET_UNITS, allow_large_argument, readable
from analyses.run.config import SIM_TOKENS, parse_placement, parse_sets, split_items
from analyses.run.outputs import check_outputs, profile_inputs, runs_inputs, set_inputs
from analyses.compare.serving import (AXES, compare_serving, loads_of,
                                      write_serving_report)
from analyses.serve.api import ServeConfig
from policies import entry, names
from policies.base import AR

DEFAULTS = {key: getattr(Scenario, key) for key in ("platform", "target", "draft")}
DEFAULT_OUTPUT = "hetspec-report.html"
COMPARE_BUDGET = (f"{readable(SIM_BUDGET_UNITS)} row-steps, sweep points x policies x "
                  "tokens x batch with their AR baselines, about 10 minutes on one CPU "
                  "core; 'hetspec compare' with no arguments is a fifth of it")


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
                   help=f"draft model (default {DEFAULTS['draft']}); 'none' for no draft; "
                        "'ngram' for prompt lookup on the host (sd and tree, beside ar; "
                        "give --set match=P or trace=PATH)")
    p.add_argument("--policies", help="comma-separated schedules (default: every "
                   "registered one; those that do not apply are skipped with a note)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=RANGE",
                   help="swept setting: gamma=2..6, alpha=0.6..0.9:0.1 or gamma=2,4,8 "
                        "(prompt_tokens=128,1024,8192 adds time to first token per "
                        "policy; batch=1,8,32 and platform=a,b put batches and platforms "
                        "side by side, each schedule still tuned; list values apart "
                        "with ';': tree='4,2,2,1;3,3,1'); "
                        "repeat for a grid; each value once. Without --sweep each "
                        "schedule is tuned instead: its gamma (SSD: k) searched over its "
                        "whole valid range")
    p.add_argument("--no-tune", action="store_true",
                   help="without --sweep, run each schedule at its default gamma (SSD: k) "
                        "instead of searching for its best (refused beside a sweep other "
                        "than of batch or platform, which runs the swept values untuned)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a fixed setting for every policy that takes it (alpha=0.8 ...)")
    p.add_argument("--tokens", type=int, default=SIM_TOKENS,
                   help=f"tokens to generate per sequence in each run (default {SIM_TOKENS})")
    p.add_argument("--batch", type=int, default=1, action=Given,
                   help="sequences decoded together (default 1; refused beside --sweep "
                        "batch=..., which gives the batches)")
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
    serving = p.add_argument_group(
        "schedules under load (--serve)",
        "serve one workload with every schedule at each swept load, an arrival rate "
        "(--sweep rate=1..16) or requests in flight (--sweep concurrency=1,16,64; one is "
        "required), and report latency against load, capacities "
        "and where speculation stops paying; see 'hetspec serve --help'")
    serving.add_argument("--serve", action="store_true",
                         help="compare the schedules serving requests (hetspec serve) "
                              "instead of decoding one batch")
    serving.add_argument("--requests", type=int, default=500,
                         help="requests per serving run (default 500)")
    serving.add_argument("--workload", default="chat",
                         help="request lengths: chat, code or summarisation (default chat)")
    serving.add_argument("--slo", help="e.g. ttft=0.5,tpot=0.05 (adds SLO attainment and "
                                       "each schedule's capacity)")
    serving.add_argument("--slo-percentile", type=float, default=90.0,
                         help="share of requests that must meet the SLO, percent")
    allow_large_argument(p, COMPARE_BUDGET)
    p.set_defaults(func=_compare)


class Given(argparse.Action):
    """Store the option's value and note that it was given (``args.given``): a
    default is not a choice a sweep could contradict."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


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


def scenario_of(args) -> Scenario:
    """The comparison the command line asks for."""
    policies = (None if args.policies is None else
                split_items(args.policies, f"--policies {args.policies}", unique=True))
    return Scenario(platform=args.platform, target=args.target, draft=args.draft,
                    policies=policies, sweeps=parse_sweeps(args.sweep),
                    sets=parse_sets(args.sets), tokens=args.tokens,
                    batch=args.batch if "batch" in getattr(args, "given", ()) else None,
                    seed=args.seed, placement=parse_placement(args.placement),
                    stack=args.stack, tune=not args.no_tune, runs=args.runs,
                    profile=args.profile, jobs=args.jobs, backend=args.backend,
                    allow_large=args.allow_large)


def _compare(args) -> int:
    if args.serve:
        return compare_serve(args)
    serving_only = [flag for flag, given in (
        ("--requests", args.requests != 500), ("--workload", args.workload != "chat"),
        ("--slo", args.slo is not None), ("--slo-percentile", args.slo_percentile != 90.0))
        if given]
    if serving_only:
        raise ValueError(f"{serving_only[0]} shapes a serving comparison; add --serve or "
                         "drop it")
    prepared = prepare(scenario_of(args))
    _check_output(args, prepared.resolved)
    found = prepared.run()
    path = found.write_report(args.output)
    summary = {"report": str(path), "line": f"wrote {path}: {found.line()}",
               **found.summary()}
    if summary["fastest"] is None:
        print(summary["line"], file=sys.stderr)
    if args.json:
        emit_json(summary)
    else:
        print(summary["line"])
        for platform, found in summary.get("per_platform", {}).items():
            print(f"  on {platform}: {found['line']}")
            for why in found["why"].values():
                print(f"    why: {why}")
        if summary.get("runs"):
            print("  measured runs replayed (speedup against each run's own AR first):")
            for run in summary["runs"]:
                print(f"    {run['line']}")
        for note in summary["notes"]:
            print(f"  {note}")
        for crossing in summary["crossover"]:
            print(f"  {crossing['sentence']}")
        for sentence in summary["sources"]:
            print(f"  note: {sentence}")
    return 0 if summary["fastest"] else 1


def _check_output(args, resolved) -> None:
    base = resolved.base
    inputs = profile_inputs(platform=base["platform"], target=base["target"],
                            draft=base["draft"], profile=args.profile)
    inputs += set_inputs(resolved.sets)
    for platform in resolved.platforms[1:]:
        inputs += profile_inputs(platform=str(platform))
    check_outputs({"--output": args.output},
                  inputs + (runs_inputs(args.runs) if args.runs else []),
                  names={"--output": DEFAULT_OUTPUT})


def compare_serve(args) -> int:
    """--serve: the schedules under load (analyses.compare.serving)."""
    found = serving_comparison(args)
    path = write_serving_report(args.output, found)
    summary = {"report": str(path), "line": f"wrote {path}: {found.line()}",
               **found.summary()}
    if args.json:
        emit_json(summary)
    else:
        print(summary["line"])
        for crossing in found.crossovers:
            print(f"  {crossing['sentence']}")
        for policy, cap in found.capacities.items():
            if found.config.slo.given:
                print(f"  {policy}: capacity "
                      + (f"{cap:.3g} {found.axis.unit}" if cap is not None else
                         f"none (misses the SLO at the lowest {found.axis.key})"))
    return 0


SERVE_REFUSED = (("--tokens", "tokens", SIM_TOKENS, "each request's output is its own"),
                 ("--batch", "batch", 1, "the engine forms each step's batch"),
                 ("--runs", "runs", None, "measured runs are not served"),
                 ("--profile", "profile", None, "measured runs are not served"),
                 ("--no-tune", "no_tune", False, "each schedule serves at its --set "
                                                 "gamma (or gamma=auto)"))


def serving_comparison(args):
    for flag, attr, default, why in SERVE_REFUSED:
        if getattr(args, attr) != default:
            raise ValueError(f"{flag} does not apply to --serve ({why}); drop it")
    sweeps = dict(parse_sweeps(args.sweep))
    axes = [k for k in sweeps if k in AXES]
    if len(axes) != 1 or len(sweeps) != 1:
        extra = sorted(set(sweeps) - set(AXES))
        raise ValueError("--serve sweeps one load: the arrival rate (--sweep rate=1..16) or "
                         "the requests in flight (--sweep concurrency=1,4,16,64)"
                         + (f"; drop --sweep {extra[0]}" if extra else
                            "; give one of them" if len(axes) != 1 else ""))
    axis = axes[0]
    loads = loads_of(axis, [float(x) for x in sweeps[axis]])
    policies = split_items(args.policies or "ar,sd", f"--policies {args.policies}",
                           unique=True)
    if AR not in policies:
        policies = [AR, *policies]
    sets = parse_sets(args.sets)
    draft = None if args.draft in (None, "none") else args.draft
    configs = {}
    for policy in policies:
        others, mine = entry_fields(policy), entry(policy).params.model_fields
        own = {k: v for k, v in sets.items() if k not in others or k in mine}
        configs[policy] = ServeConfig.build(
            platform=args.platform, target=args.target,
            draft=None if policy == AR else draft, policy=policy, sets=own,
            slo=args.slo, slo_percentile=args.slo_percentile, seed=args.seed,
            placement=parse_placement(args.placement), stack=args.stack,
            **{axis: min(loads)}, requests=args.requests, workload=args.workload)
    check_outputs({"--output": args.output},
                  profile_inputs(platform=args.platform, target=args.target, draft=draft),
                  names={"--output": DEFAULT_OUTPUT})
    return compare_serving(configs, loads, axis=axis, jobs=args.jobs, backend=args.backend,
                           quiet=args.json, allow_large=args.allow_large)


def entry_fields(policy: str) -> set[str]:
    """Every policy's parameter names but ``policy``'s own: a --set key another
    schedule takes is left out of this one's configuration."""
    return {k for name in names() if name != policy
            for k in entry(name).params.model_fields}
