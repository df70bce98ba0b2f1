"""hetspec calibrate: fit a platform profile's cost-model parameters to measured runs."""

from __future__ import annotations

import sys

from analyses.calibrate.published import DEFAULT_FIELDS, load_published, rows_for, shipped_folder
from analyses.calibrate.publishedcal import calibrate_published, of_stack
from analyses.calibrate.session import calibrate, profile_fitters
from analyses.calibrate.terms import check_fit_terms, check_hold
from analyses.calibrate.unknowns import at_start
from analyses.cli import emit_json
from analyses.commands import COMMANDS
from analyses.run.budget import SIM_BUDGET_UNITS, allow_large_argument, check, readable
from analyses.run.measuredbudget import SPANS_BUDGET, published_estimate, runs_estimate
from analyses.run.outputs import check_outputs, profile_inputs, runs_inputs
from hwprofiles import ProfileError, load_platform


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate", help=COMMANDS["calibrate"],
        description="Fit the profile's compute and memory efficiencies, launch overheads, "
                    "link and collective latency/bandwidth and flash bandwidth to the spans "
                    "of measured runs (robust least squares), judge the fit on held-out "
                    "runs replayed with their own acceptance traces, and write a calibrated "
                    "platform YAML with its provenance.",
        epilog="example: hetspec calibrate --runs runs/ --profile cpu-local "
               "-o calibrated.yaml")
    p.add_argument("--runs", metavar="DIR",
                   help="directory of measured runs (each a folder with record.json)")
    p.add_argument("--published", metavar="FILE",
                   help="fit to published measurements instead of measured runs: a YAML "
                        "file of rows (platform, models, schedule, settings, tokens/s, "
                        "source, split fit/held_out), or a folder of such files; "
                        "'shipped' names the folder hetspec ships "
                        "(hwprofiles/data/published: rows of held-out sources are judged, "
                        "never fitted)")
    p.add_argument("--fit-fields", default=None, metavar="F1,F2",
                   help="with --published: profile fields to scale (default "
                        "memory_efficiency,launch_overhead_s,alpha_s; also "
                        "compute_efficiency, call_overhead_s, bandwidth_gb_s, latency_s "
                        "and the optional terms memory_half_bytes, compute_half_flops, "
                        "memory_bandwidth_gb_s, request_latency_s, roofline_exponent); "
                        "FIELD@NAME fits one object's field alone (e.g. "
                        "call_overhead_s@gpu4), FIELD@NAME=V starts it at V")
    p.add_argument("--fit-draft-steps", action="store_true",
                   help="with --published: fit the fitted rows' draft_step_s (the draft's "
                        "measured time per round) as well as their tokens/s; without it "
                        "the draft steps are only compared")
    p.add_argument("--stack", metavar="NAME",
                   help="with --published: fit only the rows measured under this software "
                        "stack (compiled, hf-eager, llama.cpp, vllm, tensorrt-llm, or a "
                        "stack YAML; see 'hetspec profiles list'); default every row, each "
                        "simulated under "
                        "the stack it names, so the hardware is fitted once and the "
                        "stacks' own costs stay theirs")
    p.add_argument("--profile", required=True, help="platform to calibrate (name or YAML)")
    p.add_argument("-o", "--output", default="calibrated.yaml",
                   help="calibrated platform YAML (default calibrated.yaml)")
    p.add_argument("--fit-policies", default=None,
                   help="with --runs: schedules whose runs are fitted (default "
                        "ar,ar_stream,sd: AR "
                        "resident and streaming from flash, and SD); the others' runs "
                        "are held out")
    p.add_argument("--fit-every-repeat", action="store_true",
                   help="with --runs: fit every repeat of a configuration (default: of "
                        "runs with the same schedule, parameters, models and placement, "
                        "every other one in name order is held out, to show whether the "
                        "fit predicts a run it did not see); use it when the repeats were "
                        "measured to average a machine whose speed drifts between runs "
                        "(benchmarks/bench_calibration.py measures its fitting runs twice, "
                        "in mirrored order)")
    p.add_argument("--pace-per-run", action="store_true",
                   help="with --runs: fit each fitting run its own pace, a factor on all "
                        "its spans' times (printed; their geometric mean is 1), beside the profile, "
                        "for a machine whose speed moves between runs (a virtual "
                        "machine's host): the profile then says how operations cost "
                        "relative to one another, which a speedup needs. Runs recorded "
                        "with their AR baseline (hetspec run without --no-baseline) tie "
                        "each pace to the target's one-token pass measured in the same "
                        "processes; without them a run's pace can absorb what only its "
                        "own passes measure. Default off: one pace for all runs")
    p.add_argument("--fit-terms", default="", metavar="FIELDS",
                   help="with --runs: optional efficiency terms to fit as well "
                        "(with --published, name them in --fit-fields), comma-separated: "
                        "memory_half_bytes, compute_half_flops (size-dependent bandwidth "
                        "and FLOP rate), memory_bandwidth_gb_s (a device's bandwidth cap), "
                        "request_latency_s (flash per-request latency), "
                        "multirow_by_rows (the multi-row memory factor per width of 2-8 "
                        "rows the runs measure, for CPUs whose GEMMs cost unevenly by "
                        "rows, instead of one factor); default none (they keep the "
                        "profile's values)")
    p.add_argument("--hold", default="", metavar="FIELDS",
                   help="with --runs: profile fields kept at the profile's values instead "
                        "of fitted, comma-separated (e.g. compute_efficiency,"
                        "roofline_exponent when the runs are all memory-bound, as "
                        "one-token decoding on a CPU is: the sanity gate then names them "
                        "as numbers the runs cannot identify); the header of the written "
                        "profile marks them held. Default none")
    p.add_argument("--accept-poor-fit", action="store_true",
                   help="write the calibrated profile even when the sanity gate finds the "
                        "fit poor (a fitted number on the edge of its range or pushed past "
                        "a physical limit, a number the rows cannot identify, fitted rows "
                        "whose median |error| stays over 50%%), printing one warning line "
                        "per problem; default off: such a fit is refused and nothing is "
                        "written, because its numbers describe the fit, not the hardware; "
                        "a published row 100x faster (or 1e4x slower) than the hardware's "
                        "roofline is a unit mistake and refused even so")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    allow_large_argument(p, f"--runs: {readable(SPANS_BUDGET)} spans lines over all the "
                            "runs, about 10 s of reading on one CPU core (a run of 4 "
                            "prompts x 64 tokens holds about 1,000); --published: "
                            f"{readable(SIM_BUDGET_UNITS)} row-steps of simulated rows, "
                            "about 10 minutes")
    p.set_defaults(func=_calibrate)


def _calibrate(args) -> int:
    if (args.runs is None) == (args.published is None):
        raise ValueError("calibrate needs exactly one of --runs DIR (measured runs) or "
                         "--published FILE (published measurements)")
    if args.published is not None:
        return _calibrate_published(args)
    if args.stack is not None:
        raise ValueError("--stack picks published rows by the stack they were measured "
                         "under; with --runs the spans were measured under the executor's "
                         "own stack, which the fitted device fields hold, so drop --stack")
    for flag, given in (("--fit-draft-steps", args.fit_draft_steps),
                        ("--fit-fields", args.fit_fields is not None)):
        if given:
            raise ValueError(f"{flag} applies to published rows; use it with --published, "
                             "not --runs (measured runs fit every field their spans "
                             "measure; --fit-terms adds the optional ones)")
    policies = _items("--fit-policies", ",".join(profile_fitters())
                      if args.fit_policies is None else args.fit_policies)
    if not policies:
        raise ValueError("--fit-policies is empty; name at least one, e.g. ar,sd")
    fit_terms = _items("--fit-terms", args.fit_terms)
    check_fit_terms(fit_terms)  # a misspelt term is refused before any run is read
    hold = _items("--hold", args.hold)
    check_hold(hold, fit_terms)
    # the uncalibrated --profile is an input too: a calibration never replaces it
    check_outputs({"--output": args.output},
                  profile_inputs(profile=args.profile) + runs_inputs(args.runs),
                  names={"--output": "calibrated.yaml"})
    check(runs_estimate(args.runs, "calibrate"), args.allow_large)
    summary = calibrate(args.runs, args.profile, args.output, fit_policies=policies,
                        fit_terms=fit_terms, accept_poor_fit=args.accept_poor_fit,
                        hold_repeats=not args.fit_every_repeat,
                        pace_per_run=args.pace_per_run, hold_fields=hold)
    _warn(summary["problems"])
    if args.json:
        emit_json(summary)
        return 0
    print(f"wrote {summary['profile']}: fitted {summary['spans']} spans of "
          f"{len(summary['fitted_runs'])} runs, median |residual| "
          f"{summary['median_abs_residual']:.1%}")
    for label, p in summary["parameters"].items():
        kept = "" if p["constrained"] else "  (not constrained: kept)"
        print(f"  {label:48s} {p['before']:.4g} -> {p['after']:.4g}{kept}")
    if summary["paces"]:
        print("  each run's pace (x its spans' times): " + ", ".join(
            f"{run} {pace:.3f}" for run, pace in summary["paces"].items()))
    for policy, s in summary["held_out"]["schedules"].items():
        print(f"held-out {policy}: tokens/s error {s['tokens_per_s_error']:+.1%}, median "
              f"step-latency error {s['median_step_latency_error']:+.1%} ({s['runs']} runs)")
    return 0


def _calibrate_published(args) -> int:
    path = shipped_folder() if args.published == "shipped" else args.published
    if args.fit_terms.strip():
        raise ValueError("--fit-terms names the optional terms of a fit to measured runs; "
                         "with --published name the fields to fit in --fit-fields instead "
                         f"(e.g. --fit-fields {','.join(DEFAULT_FIELDS)},"
                         f"{_items('--fit-terms', args.fit_terms)[0]})")
    if args.hold.strip():
        raise ValueError("--hold keeps fields of a fit to measured runs at the profile's "
                         "values; with --published only the fields --fit-fields names are "
                         "fitted, so leave the held ones out of --fit-fields")
    if args.fit_policies is not None:
        raise ValueError("--fit-policies picks which measured runs are fitted; with "
                         "--published each row's split (fit or held_out) decides, so "
                         "drop --fit-policies or edit the rows' split")
    if args.fit_every_repeat:
        raise ValueError("--fit-every-repeat applies to measured runs (--runs); with "
                         "--published each row's split (fit or held_out) decides what is "
                         "fitted, so drop --fit-every-repeat")
    if args.pace_per_run:
        raise ValueError("--pace-per-run applies to measured runs (--runs); published "
                         "rows have no run whose pace could be fitted, so drop "
                         "--pace-per-run")
    fields = DEFAULT_FIELDS if args.fit_fields is None else _items("--fit-fields",
                                                                   args.fit_fields)
    if not fields:
        raise ValueError("--fit-fields is empty; name at least one, e.g. memory_efficiency")
    check_outputs({"--output": args.output},
                  profile_inputs(profile=args.profile) + [("--published", path)],
                  names={"--output": "calibrated.yaml"})
    check_published_budget(path, args.profile, args.allow_large, args.stack)
    summary = calibrate_published(path, args.profile, args.output, fields=fields,
                                  steps=args.fit_draft_steps,
                                  accept_poor_fit=args.accept_poor_fit, stack=args.stack)
    _warn(summary["problems"])
    if args.json:
        emit_json(summary)
        return 0
    print(f"wrote {summary['profile']}: {summary['platform']} fitted on "
          f"{len(summary['fitted_rows'])} published rows")
    for label, p in summary["parameters"].items():
        before = "unset" if p["before"] is None else f"{p['before']:.4g}"
        print(f"  {label:48s} {before} -> {p['after']:.4g}")
    for label in summary["kept"]:
        print(f"  {label:48s} kept (no fitted row depends on it)")
    for label, value in summary["unknowns"].items():
        print(f"  {'fitted ' + label:48s} {value:.4g}")
    print(f"  {'row':36s} {'split':8s} {'published':>9s} {'before':>8s} {'after':>8s} "
          f"{'error':>7s}")
    for t in summary["rows"]:
        print(f"  {t['id']:36s} {t['split']:8s} {t['published_tokens_per_s']:9.4g} "
              f"{t['before_tokens_per_s']:8.4g} {t['after_tokens_per_s']:8.4g} "
              f"{t['error_after']:+7.1%}" + (
                  f"   draft step {t['published_draft_step_s'] * 1e3:.4g} ms, simulated "
                  f"{t['after_draft_step_s'] * 1e3:.4g} ({t['draft_step_error_after']:+.1%})"
                  if "after_draft_step_s" in t else ""))
    held = summary["median_abs_error_held_out"]
    print("held-out median |error|: " + ("n/a (no held-out rows)" if held is None
                                         else f"{held:.1%}"))
    flips = summary["ranking_flips"]
    print("ranking flips: " + (", ".join(f"{a} vs {b}" for a, b in flips) or "none"))
    return 0


def check_published_budget(path, profile: str, allow_large: bool,
                           stack: str | None = None) -> None:
    """Refuse a published calibration whose rows are over the budget, before the
    fit; a file or profile that does not load is left to the fit's own refusal
    (the same sentence)."""
    try:
        rows = of_stack(rows_for(load_published(path), load_platform(profile).name),
                        stack)
    except (ValueError, ProfileError, OSError):
        return
    # the fit simulates its fitted rows up to PUBLISHED_SIMS_PER_ROW times; a
    # held-out row is simulated twice (before and after), which is not priced
    fitting = [r.model_copy(update={"params": at_start(r.params)}) for r in rows
               if r.split == "fit"]
    check(published_estimate(fitting), allow_large)


def _items(flag: str, text: str) -> tuple[str, ...]:
    """A comma-separated option's items; an empty item or one named twice is refused
    (``a,,b`` or ``a,a`` is a typo, not a wish)."""
    if not text.strip():
        return ()
    items = tuple(t.strip() for t in text.split(","))
    if "" in items:
        raise ValueError(f"{flag} '{text}' has an empty item; separate names by single "
                         "commas, e.g. a,b")
    # a field@name=start is named by its field@name: one start per knob
    keys = [item.partition("=")[0] for item in items]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise ValueError(f"{flag} names '{key}' twice; name each once")
    return items


def _warn(problems) -> None:
    """One line on stderr per problem the sanity gate let pass (--accept-poor-fit)."""
    for problem in problems:
        print(f"hetspec: warning: poor fit written anyway: {problem}", file=sys.stderr)
