"""hetspec replay: re-simulate a measured run with its own acceptance trace."""

from __future__ import annotations

import json
from pathlib import Path

from analyses.cli import emit_json
from analyses.commands import COMMANDS
from analyses.measured.evidence import contended_text
from analyses.measured.replay import load_run, replay, replay_config, side_by_side_trace
from analyses.run.budget import (SIM_BUDGET_UNITS, allow_large_argument, announce_estimate,
                                 check, config_shape, plural, readable, sim_estimate)
from analyses.run.measuredbudget import SPANS_BUDGET, spans_estimate
from analyses.run.outputs import check_outputs, profile_inputs, run_inputs
from analyses.serve.real import error_summary, is_served, replay_serving
from hwprofiles.writing import atomic_write_text
from policies.runs.files import read_record


def register(sub) -> None:
    p = sub.add_parser(
        "replay", help=COMMANDS["replay"],
        description="Simulate the configuration of a measured run on a profile (default: "
                    "the run's own platform) with the accepted lengths and events it "
                    "recorded, print predicted beside measured metrics, and write both "
                    "timelines side by side in one Chrome trace (open in Perfetto).",
        epilog="example: hetspec replay runs/sd-1/record.json --profile calibrated.yaml "
               "--json")
    p.add_argument("run", metavar="RUN_RECORD", help="record.json of a measured run "
                   "(or its directory)")
    p.add_argument("--profile", help="platform name or YAML (e.g. calibrated.yaml)")
    p.add_argument("--trace", metavar="PATH", help="side-by-side Chrome trace (default: "
                   "replay-trace.json beside the record)")
    p.add_argument("--work", choices=("schedule", "executor"), default="schedule",
                   help="simulate the schedule as written (default) or with the work the "
                        "executor recorded for each Forward (positions fed, one pass per "
                        "sampled token)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    allow_large_argument(p, f"{readable(SPANS_BUDGET)} spans lines, about 10 s of "
                            "reading and replaying on one CPU core, 50 times a run of 4 "
                            f"prompts x 64 tokens; and {readable(SIM_BUDGET_UNITS)} "
                            "row-steps simulated, about 10 minutes")
    p.set_defaults(func=_replay)


def _replay(args) -> int:
    if _served(args.run):
        return _replay_served(args)
    # the spans are counted (lines, not parsed) before the record is read
    spans = check(spans_estimate("replay", [args.run], "replay a shorter run"),
                  args.allow_large, announce=False)
    run = load_run(args.run)
    trace = args.trace if args.trace is not None else run.path.parent / "replay-trace.json"
    check_outputs({"--trace": trace},  # as typed: a trailing '/' names a directory
                  run_inputs(run.path) + profile_inputs(profile=args.profile),
                  names={"--trace": "replay-trace.json"})
    trace = Path(trace)
    announce_estimate(spans)
    check_replay_simulation(run, args.profile, args.allow_large)
    rep = replay(run, args.profile, work=args.work)
    atomic_write_text(trace, json.dumps(side_by_side_trace(rep, run)))
    out = {"run": str(run.path), "profile": rep.config.platform, "trace": str(trace),
           "predicted": rep.predicted, "measured": rep.measured, "error": rep.errors()}
    if args.json:
        emit_json(out)
        return 0
    print(f"{rep.label} on {rep.config.platform}:")
    errors = rep.errors()
    if "speedup_vs_ar" in errors:  # first: the figure a loaded machine leaves comparable
        print(f"  {'speedup vs AR':18s} measured {rep.measured['speedup_vs_ar']:.3g}x  "
              f"simulated {rep.predicted['speedup_vs_ar']:.3g}x  "
              f"({errors.pop('speedup_vs_ar'):+.1%})")
    if contended_text(rep.measured):
        print(f"  {contended_text(rep.measured)}")
    for key, err in errors.items():
        if key not in rep.measured:  # the median over steps of the per-step error
            print(f"  {key:18s} {err:+.1%}")
            continue
        print(f"  {key:18s} measured {rep.measured[key]:.5g}  simulated "
              f"{rep.predicted[key]:.5g}  ({err:+.1%})")
    print(f"  timelines side by side: {trace}")
    return 0


def check_replay_simulation(run, profile: str | None, allow_large: bool) -> None:
    """Refuse a replay whose simulations (one per prompt batch, at the record's
    tokens and batch) are over the budget; a record that cannot be configured
    is left to the replay's own refusal."""
    batches = run.batches() if run.batched() else [None]
    try:
        config = replay_config(run, profile, batches[0])
    except ValueError:
        return
    shape = config_shape(config)[0]
    product = (f"{plural(len(batches), 'simulation')} (one a prompt batch) of "
               f"{plural(config.tokens, 'token')} x {plural(config.batch, 'sequence')}")
    check(sim_estimate("replay", product, len(batches) * shape.units,
                       "replay a smaller run"), allow_large)


def _served(path) -> bool:
    """Whether ``path`` is a served workload's record; a record that does not read
    is left to the run's own checks (its spans are counted before it is parsed)."""
    try:
        return is_served(read_record(path))
    except (ValueError, OSError):
        return False


def _replay_served(args) -> int:
    """A served workload's record (hetspec serve --real): its requests served again
    by the simulated engine, each percentile measured beside predicted."""
    if args.trace is not None or args.work != "schedule":
        raise ValueError("--trace and --work replay a run's steps; a served workload's "
                         "record is replayed request by request: drop them")
    rep = replay_serving(args.run, profile=args.profile)
    if args.json:
        emit_json({k: v for k, v in rep.items() if k != "predicted"})
        return 0
    print(f"served workload of {rep['requests']} requests, replayed on {rep['platform']} "
          f"at most {rep['max_batch']} together (measured -> simulated):")
    for line in error_summary(rep):
        print(f"  {line}")
    return 0
