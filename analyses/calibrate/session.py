"""A calibration session: split runs, fit, judge on held-out runs, write the profile.

Runs of the fitting policies (AR and SD by default) are fitted; of several
repeats of one configuration, every other one (in name order) is held out too. Every
run of another schedule is held out: it is replayed on the calibrated profile
with its own acceptance trace and compared end to end, and its spans are
compared per operation kind.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import numpy as np
import yaml

from analyses.calibrate.fitgate import (check_runs_fit, enforce_plausible,
                                        poor_fit_lines)
from analyses.calibrate.terms import (Terms, apply, check_hold, fit, initial_values,
                                      op_kind_errors, stepped)
from analyses.measured.replay import (MeasuredRun, check_run_fits, find_runs, load_run,
                                      model_name, replay)
from hwprofiles import Platform, load_platform
from policies.base import entries
from policies.runs.metrics import elapsed_s
from hwprofiles import plausible
from hwprofiles.writing import atomic_write_text, scratch_dir


def _configuration(run: MeasuredRun) -> str:
    """What makes two runs repeats of one configuration: the schedule, its
    parameters, the models and where they ran. A draft spec the executor wrote
    beside its record counts by its content, not by its folder's path."""
    keys = ("policy", "params", "draft", "weights", "placement", "batch")
    inputs = {k: run.inputs.get(k) for k in keys}
    draft = model_name(run, "draft")  # a spec beside a moved record is found there
    if isinstance(draft, str) and Path(draft).is_file():
        inputs["draft"] = Path(draft).read_text(encoding="utf-8")
    return json.dumps(inputs, sort_keys=True, default=str)


def split_runs(runs: list[MeasuredRun], fit_policies: list[str],
               hold: tuple[str, ...] = (), hold_repeats: bool = True):
    """(fitting runs, held-out runs): runs of the fitting policies are fitted,
    except that of several repeats of one configuration every other one (in name
    order) is held out unless ``hold_repeats`` is False (repeats measured to
    average a drifting machine); runs of other policies, and runs named in
    ``hold``, are held out."""
    fitting, held = [], []
    seen: dict[str, int] = {}
    for run in sorted(runs, key=lambda r: r.name):
        if run.policy not in fit_policies or run.name in hold:
            held.append(run)
            continue
        key = _configuration(run)
        n = seen[key] = seen.get(key, 0) + 1
        (held if hold_repeats and n % 2 == 0 else fitting).append(run)
    if not fitting:
        raise ValueError(f"no run of the fitting policies ({', '.join(fit_policies)}) "
                         "was found; record AR and SD runs or pass --fit-policies")
    return fitting, held


def check_same_models(runs: list[MeasuredRun]) -> None:
    """All runs share one target (drafts may differ: each is costed by its spec)."""
    first = runs[0]
    for run in runs[1:]:
        a, b = first.inputs.get("target"), run.inputs.get("target")
        if a and b and a != b:
            raise ValueError(f"run {run.name} measured target '{b}' but run "
                             f"{first.name} measured '{a}'; calibrate runs of one target "
                             "at a time (move the other runs out)")


def _evaluate(profile_path: Path, platform: Platform, held: list[MeasuredRun]) -> dict:
    """Held-out runs on the calibrated profile: each replayed end to end (the
    schedule as written, and with the executor's recorded work), and each of
    their operations predicted against its measured critical-path time."""
    out = {"runs": [], "op_kinds": {}, "schedules": {}}
    terms = [t for run in held for t in Terms(platform).of_run(run)]
    out["op_kinds"] = op_kind_errors(terms, initial_values(platform, terms))
    for run in held:
        row = {"run": run.name, "policy": run.policy}
        for work, prefix in (("schedule", ""), ("executor", "executor_")):
            rep = replay(run, str(profile_path), work=work)
            errors = rep.errors()
            row[f"{prefix}tokens_per_s_error"] = errors.get("tokens_per_s")
            row[f"{prefix}median_step_latency_error"] = errors.get("median_step_latency")
            row[f"{prefix}steps"] = rep.predicted.get("steps")
        row["measured_steps"] = run.metrics.get("steps")
        row["passes"] = pass_counts(run, rep)
        out["runs"].append({**row, **unmodelled_shares(run)})
    for policy in sorted({r["policy"] for r in out["runs"]}):
        rows = [r for r in out["runs"] if r["policy"] == policy]
        out["schedules"][policy] = {"runs": len(rows), **{
            key: _median([r.get(key) for r in rows]) for key in (
                "tokens_per_s_error", "median_step_latency_error",
                "executor_tokens_per_s_error", "executor_median_step_latency_error")}}
    return out


def pass_counts(run: MeasuredRun, rep) -> dict[str, list[int]]:
    """Per Forward label whose counts differ: [device passes the executor ran,
    passes the executor-work replay simulated] (a sampled Forward of k tokens is
    k passes). Equal counts mean both did the same work."""
    measured: dict[str, int] = {}
    for s in run.spans:
        op = s.op
        if op["type"] == "Forward":
            k = op.get("n_tokens", 1) if stepped(op) else 1
            measured[op.get("label", "")] = measured.get(op.get("label", ""), 0) + k
    simulated: dict[str, int] = {}
    for s in rep.sim_spans:
        if s.kind == "compute":
            simulated[s.name] = simulated.get(s.name, 0) + 1
    return {k: [measured.get(k, 0), simulated.get(k, 0)] for k in sorted(
        set(measured) | set(simulated)) if measured.get(k, 0) != simulated.get(k, 0)}


def unmodelled_shares(run: MeasuredRun) -> dict[str, float]:
    """Shares of a run's measured decoding time that the cost model has no term
    for: Verify (sampling, acceptance) spans, which the simulator takes as
    instant, and host time between operations, when no device is busy."""
    wall_s = elapsed_s(run.metrics) or 0.0
    if wall_s <= 0 or not run.spans:
        return {}
    verify_s = sum(s.end_s - s.start_s for s in run.spans if s.type == "Verify")
    busy_s, reach = 0.0, 0.0
    for s in sorted(run.spans, key=lambda s: s.start_s):  # union of busy intervals
        start, end = max(s.start_s, reach), s.end_s
        if end > start:
            busy_s += end - start
            reach = end
    refed_s = sum(s.end_s - s.start_s for s in run.spans if s.type == "Forward"
                  and (s.op.get("n_fed") or 0) > s.op.get("n_tokens", 1)
                  + s.op.get("caught_up", 0))  # a draft's catch-up is not a re-feed
    return {"verify_share": verify_s / wall_s, "idle_share": max(0.0, 1 - busy_s / wall_s),
            "refed_share": refed_s / wall_s}


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def calibration_date() -> str:
    """Today's date (UTC), or the one ``SOURCE_DATE_EPOCH`` names (seconds since the
    epoch, the reproducible-builds convention): a profile calibrated twice on the
    same runs with it set is byte-identical whatever the day."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).date().isoformat()
        except (ValueError, OverflowError, OSError):
            raise ValueError(f"SOURCE_DATE_EPOCH is {epoch!r}; set it to whole seconds since "
                             "1970-01-01 UTC (e.g. 1795651200 for 2026-11-26) or unset it") from None
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def _header(fitting, held, result, evaluation, date: str) -> str:
    lines = ["Calibrated by 'hetspec calibrate' on " + date,
             "fitted on runs: " + ", ".join(f"{r.name} ({r.policy})" for r in fitting),
             f"spans fitted: {len(result.terms)}; median |residual| "
             f"{result.median_abs_error:.1%}; converged: {result.success}"]
    for p in result.values:
        mark = (" (held: not fitted)" if p in result.held else
                " (not constrained by the runs: kept)" if p in result.unconstrained else "")
        lines.append(f"  {p.label}: {result.initial[p]:.4g} -> {result.values[p]:.4g}{mark}")
    if result.paces:
        lines.append("each fitting run's pace, fitted beside the profile (x its spans' "
                     "times; their logs average 0): " + ", ".join(
                         f"{run} {pace:.3f}" for run, pace in result.paces.items()))
    lines.append("held-out runs: " + (", ".join(f"{r.name} ({r.policy})" for r in held)
                                      or "none"))
    for policy, s in evaluation["schedules"].items():
        lines.append(f"  {policy}: tokens/s error {_pct(s['tokens_per_s_error'])}, median "
                     f"step-latency error {_pct(s['median_step_latency_error'])}; with the "
                     f"executor's recorded work {_pct(s['executor_tokens_per_s_error'])}, "
                     f"{_pct(s['executor_median_step_latency_error'])} ({s['runs']} runs)")
    for r in evaluation["runs"]:
        if "verify_share" in r:
            lines.append(f"  run {r['run']}: time the cost model has no term for: Verify "
                         f"spans {r['verify_share']:.1%}, host time between operations "
                         f"{r['idle_share']:.1%}; time in passes that fed more positions "
                         f"than the schedule asked (a draft catching up on the bonus "
                         f"token) {r['refed_share']:.1%}")
    for kind, s in evaluation["op_kinds"].items():
        lines.append(f"  {kind}: median |error| {s['median_abs_error']:.1%} (bias "
                     f"{s['median_error']:+.1%}, total {s['total_error']:+.1%}, "
                     f"{s['spans']} spans)")
    return "".join(f"# {line}\n" for line in lines)


def profile_text(platform: Platform, header: str) -> str:
    data = platform.model_dump(mode="json", exclude_unset=True)
    text = header + yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
    Platform.model_validate(yaml.safe_load(text))  # the file must load as written
    return text


def profile_fitters() -> tuple[str, ...]:
    """The schedules whose measured runs a calibration fits by default (registered
    with ``fits_profile``); the others' runs are held out to test the fit."""
    return tuple(found.name for found in entries() if found.fits_profile)


def calibrate(runs_dir, profile: str, output, *,
              fit_policies: tuple[str, ...] | None = None,
              fit_terms: tuple[str, ...] = (), accept_poor_fit: bool = False,
              hold: tuple[str, ...] = (), hold_repeats: bool = True,
              pace_per_run: bool = False, hold_fields: tuple[str, ...] = ()) -> dict:
    """Fit ``profile`` to the runs under ``runs_dir`` and write ``output``; the
    optional efficiency terms named in ``fit_terms`` are fitted too; runs named in
    ``hold`` are held out whatever their policy; ``hold_repeats``: of repeats of
    one configuration, every other one is held out (``split_runs``);
    ``fit_policies``: the schedules whose runs are fitted (None: those registered
    with ``fits_profile``); ``pace_per_run``: each fitting run gets its own pace (``costfit.Paces``);
    ``hold_fields``: profile fields kept at the profile's values, not fitted. A fit the
    sanity gate refuses (``analyses.calibrate.fitgate``) raises ValueError and
    writes nothing, unless ``accept_poor_fit`` (the summary's ``problems``)."""
    check_hold(hold_fields, fit_terms)
    runs = [load_run(p) for p in find_runs(runs_dir)]
    platform = load_platform(profile)
    for run in runs:
        check_run_fits(run, platform.name)
    check_same_models(runs)
    fitting, held = split_runs(runs, list(fit_policies or profile_fitters()), hold,
                               hold_repeats)
    terms = Terms(platform)
    result = fit(platform, [t for run in fitting for t in terms.of_run(run)],
                 fixed=frozenset(hold_fields), fit_terms=frozenset(fit_terms),
                 pace_per_run=pace_per_run)
    problems = check_runs_fit(result, accept_poor_fit)
    date = calibration_date()
    source = (f"calibrated: hetspec calibrate on runs {', '.join(r.name for r in fitting)}"
              f" ({date}), median |residual| {result.median_abs_error:.1%} over "
              f"{len(result.terms)} spans")
    changed = {p: v for p, v in result.values.items()
               if p not in result.unconstrained and p not in result.held}
    fitted = apply(platform, changed, source)
    problems += enforce_plausible(fitted, platform, accept_poor_fit)
    fitted = plausible.accept(fitted, plausible.problems(fitted), "--accept-poor-fit")
    fitted = fitted.model_copy(update={"description": (
        f"{platform.description.strip()} Calibrated by hetspec calibrate on {date} "
        f"from measured runs {', '.join(r.name for r in fitting)}.").strip()})
    with scratch_dir("calibrate") as tmp:  # a killed run's leftover goes next time
        draft_path = tmp / "calibrated.yaml"
        draft_path.write_text(profile_text(fitted, ""))
        evaluation = _evaluate(draft_path, fitted, held)
    text = profile_text(fitted, _header(fitting, held, result, evaluation, date)
                        + poor_fit_lines(problems))
    atomic_write_text(output, text)
    return {"profile": str(output), "fitted_runs": [r.name for r in fitting],
            "held_out_runs": [r.name for r in held], "spans": len(result.terms),
            "median_abs_residual": result.median_abs_error, "converged": result.success,
            "parameters": {p.label: {"before": result.initial[p], "after": result.values[p],
                                     "constrained": p not in result.unconstrained}
                           for p in result.values if p not in result.held},
            "paces": result.paces,
            "fit_op_kinds": op_kind_errors(result.terms, result.values, result.paces),
            "held_out": evaluation, "problems": problems}
