"""hetspec calibrate: fit a platform profile's cost-model parameters to measured runs."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="fit a profile's cost-model parameters to measured runs",
        description="Fit the profile's compute and memory efficiencies, launch overheads, "
                    "link and collective latency/bandwidth and flash bandwidth to the spans "
                    "of measured runs (robust least squares), judge the fit on held-out "
                    "runs replayed with their own acceptance traces, and write a calibrated "
                    "platform YAML with its provenance.",
        epilog="example: hetspec calibrate --runs runs/ --profile cpu-local "
               "-o calibrated.yaml")
    p.add_argument("--runs", required=True, metavar="DIR",
                   help="directory of measured runs (each a folder with record.json)")
    p.add_argument("--profile", required=True, help="platform to calibrate (name or YAML)")
    p.add_argument("-o", "--output", default="calibrated.yaml",
                   help="calibrated platform YAML (default calibrated.yaml)")
    p.add_argument("--fit-policies", default="ar,ar_stream,sd",
                   help="schedules whose runs are fitted (default ar,ar_stream,sd: AR "
                        "resident and streaming from flash, and SD); the others' runs "
                        "are held out")
    p.add_argument("--fit-terms", default="", metavar="FIELDS",
                   help="optional efficiency terms to fit as well, comma-separated: "
                        "memory_half_bytes, compute_half_flops (size-dependent bandwidth "
                        "and FLOP rate), memory_bandwidth_gb_s (a device's bandwidth cap), "
                        "request_latency_s (flash per-request latency); default none "
                        "(they keep the profile's values)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_calibrate)


def _calibrate(args) -> int:
    from analyses.calibrate import check_fit_terms
    from analyses.cli import emit_json
    from analyses.heldout import calibrate
    from analyses.outputs import check_outputs, profile_inputs, runs_inputs

    policies = tuple(p.strip() for p in args.fit_policies.split(",") if p.strip())
    if not policies:
        raise ValueError("--fit-policies is empty; name at least one, e.g. ar,sd")
    fit_terms = tuple(t.strip() for t in args.fit_terms.split(",") if t.strip())
    check_fit_terms(fit_terms)  # a misspelt term is refused before any run is read
    # the uncalibrated --profile is an input too: a calibration never replaces it
    check_outputs({"--output": args.output},
                  profile_inputs(profile=args.profile) + runs_inputs(args.runs))
    summary = calibrate(args.runs, args.profile, args.output, fit_policies=policies,
                        fit_terms=fit_terms)
    if args.json:
        emit_json(summary)
        return 0
    print(f"wrote {summary['profile']}: fitted {summary['spans']} spans of "
          f"{len(summary['fitted_runs'])} runs, median |residual| "
          f"{summary['median_abs_residual']:.1%}")
    for label, p in summary["parameters"].items():
        kept = "" if p["constrained"] else "  (not constrained: kept)"
        print(f"  {label:48s} {p['before']:.4g} -> {p['after']:.4g}{kept}")
    for policy, s in summary["held_out"]["schedules"].items():
        print(f"held-out {policy}: tokens/s error {s['tokens_per_s_error']:+.1%}, median "
              f"step-latency error {s['median_step_latency_error']:+.1%} ({s['runs']} runs)")
    return 0
