"""The sanity gate (``analyses.calibrate.sanity``) applied to the two calibrations.

``check_published_units`` runs before the published fit: every row of the
profile's platform is simulated on the profile's hardware at its roofline
(``roofline_platform``: peak bandwidth and FLOP/s, no overhead, no latency) and
a row more than ``TOO_FAST`` times faster, or ``TOO_SLOW`` times slower, is a
number in the wrong unit, not a measurement. ``check_published_fit`` and
``check_runs_fit`` judge a fit's numbers before its profile is written.
"""

from __future__ import annotations

import math

import numpy as np
import yaml

from analyses.calibrate import sanity, unitslip
from analyses.calibrate.costfit import BOUNDS, Fit
from analyses.calibrate.knobs import _start, objects_of
from analyses.calibrate.published import simulate_row, start_values
from analyses.calibrate.unknowns import unknowns_of
from hwprofiles import Platform

TOO_FAST = 100.0  # a row this many times faster than the roofline is a unit mistake
TOO_SLOW = 1e4  # ... and one this many times slower
PUBLISHED_FIX = ("give more or other rows, fit fewer fields (--fit-fields) or check the "
                 "rows' units (tokens/s)")
RUNS_CHECK = ("record more or other runs (other batches, prompt lengths) or check that "
              "the runs were measured on this profile's hardware")
RUNS_FIX = ("hold a field the runs cannot measure at the profile's value (--hold FIELD), "
            + RUNS_CHECK)


def roofline_platform(platform: Platform) -> Platform:
    """``platform`` at its datasheet: every efficiency 1, every overhead and latency
    0, no size-dependent efficiency, no bandwidth cap below the tier's."""
    devices = tuple(d.model_copy(update={
        "compute_efficiency": 1.0, "launch_overhead_s": 0.0, "call_overhead_s": 0.0,
        "memory_half_bytes": 0.0, "compute_half_flops": 0.0, "roofline_exponent": None,
        "memory_bandwidth_gb_s": None, "stream_dispatch_s": 0.0,
        "multirow_memory_factor": _at_most_one(d.multirow_memory_factor)})
        for d in platform.devices)
    tiers = tuple(t.model_copy(update={"memory_efficiency": 1.0, "latency_s": 0.0,
                                       "request_latency_s": 0.0})
                  for t in platform.memory_tiers)
    return platform.model_copy(update={
        "devices": devices, "memory_tiers": tiers,
        "links": tuple(l.model_copy(update={"latency_s": 0.0}) for l in platform.links),
        "groups": tuple(g.model_copy(update={"alpha_s": 0.0}) for g in platform.groups)})


def _at_most_one(factor):
    """A multi-row factor (a number or a table by rows) with no factor above 1."""
    if isinstance(factor, dict):
        return {rows: min(f, 1.0) for rows, f in factor.items()}
    return min(factor, 1.0)


def row_lines(path) -> dict[str, int]:
    """Row id -> the line (1-based) its entry starts on in the published file."""
    try:
        node = yaml.compose(open(path, encoding="utf-8").read())
    except (OSError, yaml.YAMLError):
        return {}
    out = {}
    for key, value in getattr(node, "value", []) or []:
        if getattr(key, "value", None) == "measurements" and isinstance(value.value, list):
            for item in value.value:
                for k, v in item.value if isinstance(item.value, list) else []:
                    if getattr(k, "value", None) == "id":
                        out[str(v.value)] = item.start_mark.line + 1
    return out


def check_published_units(path, platform: Platform, rows) -> None:
    """ValueError naming the first row whose tokens/s the profile's hardware could
    not reach at its roofline by ``TOO_FAST``, or falls ``TOO_SLOW`` under it."""
    ideal = roofline_platform(platform)
    values = start_values(unknowns_of(rows))
    lines = row_lines(path)
    for r in rows:
        roof = simulate_row(r, ideal, values)
        where = f"row {r.id} (line {lines[r.id]})" if r.id in lines else f"row {r.id}"
        if r.tokens_per_s > TOO_FAST * roof:
            raise ValueError(
                f"{where} of {path} says {r.tokens_per_s:.4g} tokens/s, {r.tokens_per_s / roof:.3g}"
                f" times what {platform.name} reaches at its roofline ({roof:.4g} tokens/s, "
                "weights over peak bandwidth); a number in the wrong unit (tokens per minute, "
                "a batch or cluster total?): give tokens/s for one run of the row's settings")
        if r.tokens_per_s * TOO_SLOW < roof:
            raise ValueError(
                f"{where} of {path} says {r.tokens_per_s:.4g} tokens/s, {roof / r.tokens_per_s:.3g}"
                f" times slower than {platform.name} at its roofline ({roof:.4g} tokens/s); a "
                "number in the wrong unit (s/token or ms/token typed as tokens/s?): give "
                "tokens/s")


def _published_numbers(result, platform: Platform) -> list[sanity.Fitted]:
    s = result.solved
    out = []
    for i, k in enumerate(result.knobs):
        first = next(iter(_start(platform, k).values()))
        off = any(not getattr(o, k.field) for o in objects_of(platform, k.kind)
                  if o.name in k.names)
        stand_in = (f"the start {k.start:g} given in --fit-fields" if k.start is not None
                    else "the field is off in the profile" if off else "")
        out.append(sanity.Fitted(k.label, k.field, s.z[i], s.start[i], *s.bounds[:, i],
                                 first * math.exp(s.z[i]), stand_in))
    for j, u in enumerate(result.unknowns, len(result.knobs)):
        out.append(sanity.Fitted(f"fitted {u.label}", None, s.z[j], s.start[j],
                                 *s.bounds[:, j], u.value(s.z[j])))
    return out


def _median_abs(residuals) -> float:
    return float(np.median(np.abs(residuals)))


def check_published_fit(result, platform: Platform, table, accept_poor_fit: bool,
                        path=None) -> list[str]:
    """The gate on a published fit (``analyses.calibrate.published.PublishedFit``)
    and its table of rows (of the file at ``path``); the problems it let pass with
    ``accept_poor_fit``. Rows in a wrong unit and fitted fields no hardware has
    (``analyses.calibrate.unitslip``) come first."""
    s = result.solved
    numbers = _published_numbers(result, platform)
    base = _median_abs(s.residuals(s.z))

    def push(i, dx):
        z = s.z.copy()
        z[i] += dx
        return base - _median_abs(s.residuals(z))

    errors = [(t["id"], t["error_after"]) for t in table if t["split"] == "fit"]
    problems = unitslip.row_slips(path, table, platform.name, row_lines(path)) \
        if path is not None else []
    problems += unitslip.fitted_slips(result.platform, platform, PUBLISHED_FIX)
    problems += [p for p in [sanity.error_problem(errors, "row", PUBLISHED_FIX)] if p]
    problems += sanity.bound_problems(numbers, push, PUBLISHED_FIX)
    problems += sanity.null_problems(numbers, s.jac, result.rows, PUBLISHED_FIX)
    return sanity.enforce(problems, accept_poor_fit)


def _runs_numbers(fit: Fit) -> tuple[list[sanity.Fitted], list[int]]:
    """The fitted numbers the profile will take (those no span measures are kept,
    not judged) and their columns in the fit's Jacobian."""
    out, cols = [], []
    for j, (p, x, start) in enumerate(zip(fit.fitted, fit.x, fit.x_start)):
        if p in fit.unconstrained:
            continue
        lo, hi = BOUNDS[p.field]
        # a field off in the profile starts at its floor (~0, off): the profile's value
        out.append(sanity.Fitted(p.label, p.field, float(x), float(start), math.log(lo),
                                 math.log(hi), fit.values[p]))
        cols.append(j)
    return out, cols


def check_runs_fit(fit: Fit, accept_poor_fit: bool) -> list[str]:
    """The gate on a fit to measured spans (``analyses.calibrate.costfit.Fit``):
    numbers it kept because no span measures them are not judged."""
    numbers, cols = _runs_numbers(fit)
    base = _median_abs(fit.log_residuals)

    def push(i, dx):
        x = np.array(fit.x, dtype=float)
        x[cols[i]] += dx
        return base - _median_abs(fit.residuals(x))

    errors = [(f"{t.op_kind} of run {t.run}", float(np.expm1(r)))
              for t, r in zip(fit.terms, fit.log_residuals)]
    problems = [p for p in [sanity.error_problem(errors, "span", RUNS_FIX)] if p]
    problems += sanity.bound_problems(numbers, push, RUNS_FIX)
    problems += sanity.null_problems(numbers, np.asarray(fit.jac)[:, cols], len(fit.terms),
                                     RUNS_CHECK, rows="span", hold="--hold")
    return sanity.enforce(problems, accept_poor_fit)


def enforce_plausible(fitted: Platform, original: Platform, accept_poor_fit: bool
                      ) -> list[str]:
    """The gate on a runs fit's fitted profile: a field outside its physical range
    (``analyses.calibrate.unitslip``) is refused unless ``accept_poor_fit``."""
    return sanity.enforce(unitslip.fitted_slips(fitted, original, RUNS_CHECK),
                          accept_poor_fit)


def poor_fit_lines(problems: list[str]) -> str:
    """Header comment lines of a profile written with --accept-poor-fit: its
    provenance says which problems the gate let pass."""
    return "".join(f"# poor fit written with --accept-poor-fit: {p}\n" for p in problems)
