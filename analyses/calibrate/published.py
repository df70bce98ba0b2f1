"""Published measurements as data, and a platform profile fitted to them.

A published-measurements file (the shipped ones are the folder
``hwprofiles/data/published``, one file per source: ``analyses.calibrate.sources``)
lists decode speeds that papers and public benchmarks printed: the hardware,
the models, the schedule, its settings and stack, the measured tokens/s (or
the speedup over AR, with the mean accepted tokens where the source prints
them) and where it was printed. Each row names the shipped platform that
simulates it and whether it is fitted (``split: fit``) or held out to judge the
fit (``split: held_out``): the split is data, written by whoever adds the row.

``fit_rows`` fits a platform to its rows (``analyses.calibrate.publishedcal`` runs the
whole session) as ``hetspec calibrate`` fits measured spans: least squares (scipy) in log space on log(simulated /
published), where every row is simulated deterministically with its own
settings. What is fitted are *knobs* (``analyses.calibrate.knobs``): a knob scales one profile field on every
object it ties together (all HBM tiers of one spec, all devices of one kind,
all collective groups), so eight identical GPUs get one efficiency. A small
pull toward the starting values (``PRIOR_WEIGHT``, in log units) keeps a knob
the fitted rows cannot tell apart from another where it was; a knob no fitted
row is sensitive to is not fitted at all and says so. A row's unknowns
(``{fit: KEY}`` where its source prints no acceptance or SSD exponent,
``analyses.calibrate.unknowns``) are fitted with the knobs; ``fit_unknowns`` fits them
alone, with a profile as it is, for a table of what that profile predicts.
A row may also give the draft's measured time per round (``draft_step_s``,
``analyses.calibrate.draftstep``): always compared, fitted only when asked (``steps``).
"""

from __future__ import annotations

import math
from importlib import resources
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator
from scipy.optimize import least_squares

from analyses.run.config import RunConfig
from analyses.calibrate.draftstep import simulate_row_full
# the knobs' names stay importable from here (publishedcal, tests)
from analyses.calibrate.knobs import (DEFAULT_FIELDS, FIELD_KINDS, Knob, log_bounds, knobs_of,  # noqa: F401
                            objects_of, scaled)
from analyses.calibrate import sources
from analyses.calibrate.sources import DeviceClass
from analyses.calibrate.unknowns import Unknown, check_row, check_rows, row_unknowns, substitute, unknowns_of
from hwprofiles import Platform
from hwprofiles.models import Bits
from hwprofiles.numbers import StrictModel
from policies.base import AR
from simcore.acceptance import default as acceptance_default

from analyses.calibrate.sources import MAX_PUBLISHED_BYTES  # noqa: F401  (importable here)

PRIOR_WEIGHT = 1e-3  # log-units residual per log-unit a knob moves from its start
UNKNOWN_STEP = 0.01  # relative difference step of a fitted unknown's transform
MAX_STEP_S = 10.0  # a draft round slower than this is a unit mistake (ms for s)
SENSITIVE = 1e-6  # relative change in a row's tokens/s that counts as sensitive


class Measurement(StrictModel):
    """One published decode speed and the settings that reproduce it."""

    id: str = Field(min_length=1)
    platform: str = Field(min_length=1)  # the shipped platform that simulates it
    hardware: str = Field(min_length=1)  # what was measured, in words
    target: str = Field(min_length=1)
    draft: str | None = None
    policy: str = AR
    params: dict[str, Any] = Field(default_factory=dict)
    acceptance: dict[str, Any] = Field(default_factory=acceptance_default)
    batch: int = Field(1, ge=1)
    prompt_tokens: int = Field(128, ge=0)
    tokens: int = Field(128, ge=1, le=100_000)
    placement: dict[str, str] = Field(default_factory=dict)
    weight_bits: Bits | None = None  # weights stored at this width (quantized rows)
    # the software stack the source measured with (hwprofiles/data/stacks)
    stack: str = "compiled"
    # what was measured: decode tokens/s, or the speedup over the same stack's AR
    tokens_per_s: float | None = Field(None, gt=0, le=1e9)
    speedup: float | None = Field(None, gt=0, le=1e3)
    # what the speedup divides: decode tokens/s (the default), or the batch's end-to-end
    # time, its prefill included (a source that printed whole-run throughputs)
    speedup_of: Literal["decode", "end_to_end"] = "decode"
    time_per_token_ms: float | None = Field(None, gt=0, le=1e7)  # decode latency per token
    # the whole batch end to end: its prefill and its ``tokens`` decoding steps, s
    batch_latency_s: float | None = Field(None, gt=0, le=1e6)
    # tokens committed per target step as printed; the acceptance is matched to it
    mean_accepted_tokens: float | None = Field(None, ge=1, le=100)
    # the draft's time per round measured by the same run (analyses.calibrate.draftstep), s
    draft_step_s: float | None = Field(None, gt=0, le=MAX_STEP_S)
    split: Literal["fit", "held_out"]
    source_id: str = ""  # the source's id (analyses.calibrate.sources)
    device_class: DeviceClass | None = None
    # rows measured with one setup, compared by order; a row may join several groups
    ranking: str | tuple[str, ...] | None = None
    # one curve of a source against batch (same setup, batch the only change): its rows
    # are judged batch by batch and for the batch where the speedup crosses 1
    series: str | None = Field(None, min_length=1)
    source: str = Field(min_length=1)
    url: str | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _acceptance_for_speculation(self):
        printed = [self.tokens_per_s, self.speedup, self.time_per_token_ms,
                   self.batch_latency_s]
        if sum(v is not None for v in printed) != 1:
            raise ValueError(f"row {self.id} needs exactly one of tokens_per_s, speedup, "
                             "time_per_token_ms and batch_latency_s (what its source "
                             "printed); give one of them")
        if self.policy == AR and (self.speedup is not None
                                    or self.mean_accepted_tokens is not None):
            raise ValueError(f"row {self.id}: an ar row has no speedup or mean accepted "
                             "tokens; give tokens_per_s, or name the speculative policy")
        given = "acceptance" in self.model_fields_set
        if self.mean_accepted_tokens is not None and given:
            raise ValueError(f"row {self.id} gives both an acceptance and "
                             "mean_accepted_tokens; keep the one its source printed")
        if self.policy != AR and not given and self.mean_accepted_tokens is None:
            raise ValueError(f"row {self.id}: a {self.policy} row needs the acceptance "
                             "its source measured (alpha or a histogram of accepted "
                             "lengths, mean_accepted_tokens, or {fit: KEY} to fit it); "
                             "add an acceptance mapping")
        if self.speedup_of != "decode" and self.speedup is None:
            raise ValueError(f"row {self.id} gives speedup_of without a speedup; remove it "
                             "or give the speedup its source printed")
        check_row(self.id, self.acceptance, self.params)
        if self.draft_step_s is not None and self.draft is None:
            raise ValueError(f"row {self.id} gives draft_step_s without a draft; name the "
                             "draft model or remove draft_step_s")
        return self

    @property
    def rankings(self) -> tuple[str, ...]:
        if self.ranking is None:
            return ()
        return (self.ranking,) if isinstance(self.ranking, str) else tuple(self.ranking)

    @property
    def published(self) -> float:
        """The printed number: tokens/s, the speedup over AR, ms per token, or the
        batch's end-to-end seconds."""
        return next(v for v in (self.tokens_per_s, self.speedup, self.time_per_token_ms,
                                self.batch_latency_s) if v is not None)

    @property
    def measure(self) -> str:
        if self.speedup is not None:
            return "speedup"
        if self.batch_latency_s is not None:
            return "s/batch"
        return "tokens/s" if self.tokens_per_s is not None else "ms/token"

    @property
    def unknowns(self) -> list[Unknown]:
        return row_unknowns(self.acceptance, self.params)

    def config(self, values: dict[str, float] | None = None) -> RunConfig:
        """The run this row describes, its fitted unknowns set from ``values``."""
        missing = [u.key for u in self.unknowns if u.key not in (values or {})]
        if missing:
            raise ValueError(f"row {self.id} needs fitted values for {', '.join(missing)}; "
                             "fit them first (analyses.calibrate.published.fit_unknowns)")
        acceptance, params = substitute(self.acceptance, self.params, values or {})
        return RunConfig(platform=self.platform, target=self.target, draft=self.draft,
                         policy=self.policy, params=params, acceptance=acceptance,
                         tokens=self.tokens, batch=self.batch,
                         prompt_tokens=self.prompt_tokens, deterministic=True,
                         placement=self.placement, weight_bits=self.weight_bits,
                         stack=self.stack)


class PublishedSet(StrictModel):
    measurements: tuple[Measurement, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self):
        seen = set()
        for row in self.measurements:
            if row.id in seen:
                raise ValueError(f"row id '{row.id}' appears twice; give each row its own id")
            seen.add(row.id)
        check_rows(self.measurements)
        return self


def shipped_file() -> Path:
    """The shipped file of the rows the shipped profiles were calibrated on."""
    return shipped_folder() / "measurements.yaml"


def shipped_folder() -> Path:
    """The shipped published set: every file of ``hwprofiles/data/published``."""
    return Path(str(resources.files("hwprofiles") / "data" / "published"))


def load_published(path) -> tuple[Measurement, ...]:
    """The rows of a published-measurements file, or of every file of a folder
    (``analyses.calibrate.sources``); ValueError in one sentence."""
    return sources.load_rows(path, PublishedSet)


def sources_of(path) -> dict:
    """The sources (id -> Source) a published file or folder declares."""
    return sources.load_sources(path)


def rows_for(rows, platform_name: str) -> list[Measurement]:
    mine = [r for r in rows if r.platform == platform_name]
    if not mine:
        named = sorted({r.platform for r in rows})
        raise ValueError(f"the published measurements have no row for platform "
                         f"{platform_name}; they name {', '.join(named)}; pass one of "
                         "those with --profile")
    if not any(r.split == "fit" for r in mine):
        raise ValueError(f"no row for platform {platform_name} has split: fit; mark at "
                         "least one row to fit")
    return mine


def simulate_row(row: Measurement, platform: Platform, values=None) -> float:
    """Simulated counterpart of one row's printed number on ``platform``
    (deterministic tokens/s, or the speedup over the row's AR baseline), its
    fitted unknowns (acceptance, SSD's r) taken from ``values`` (key -> value)."""
    return simulate_row_full(row, platform, values)[0]


def published_logs(rows) -> np.ndarray:
    """What the fit matches: log of every row's printed number (tokens/s or
    speedup), then log draft step of the rows that give one."""
    return np.log([r.published for r in rows]
                  + [r.draft_step_s for r in rows if r.draft_step_s is not None])


def simulated_logs(rows, platform: Platform, values=None) -> np.ndarray:
    """The simulated counterparts of ``published_logs(rows)``."""
    pairs = [simulate_row_full(r, platform, values) for r in rows]
    return np.log([tps for tps, _ in pairs] + [step for _, step in pairs if step is not None])


def start_values(unknowns: list[Unknown]) -> dict[str, float]:
    return {u.key: u.value(u.z_start()) for u in unknowns}


def sensitive_knobs(platform: Platform, knobs: list[Knob], rows) -> list[Knob]:
    """The knobs some row's simulated speed (or draft step) changes with (10% nudge
    down from the start; up where the start is the lower bound), unknowns at
    their starts."""
    values = start_values(unknowns_of(rows))
    start = scaled(platform, knobs, np.zeros(len(knobs)))
    base = simulated_logs(rows, start, values)
    keep = []
    for k, knob in enumerate(knobs):
        x = np.zeros(len(knobs))
        x[k] = -math.log(1.1) if log_bounds(platform, knob)[0] < -0.1 else math.log(1.1)
        nudged = simulated_logs(rows, scaled(platform, knobs, x), values)
        if np.any(np.abs(np.expm1(nudged - base)) > SENSITIVE):
            keep.append(knob)
    return keep


@dataclass
class Solved:
    """What the sanity gate (``analyses.calibrate.sanity``) reads of a solution: every
    fitted coordinate (knobs' log factors, then unknowns'), where each started,
    their bounds (2 x n), the Jacobian of the rows' log residuals, and those
    residuals at any coordinates."""

    z: np.ndarray
    start: np.ndarray
    bounds: np.ndarray
    jac: np.ndarray
    residuals: Any


@dataclass
class PublishedFit:
    knobs: list[Knob]
    x: np.ndarray
    fixed: list[Knob]  # knobs no fitted row is sensitive to (kept)
    platform: Platform
    success: bool
    values: dict[str, float] = dc_field(default_factory=dict)  # fitted unknowns by key
    unknowns: list[Unknown] = dc_field(default_factory=list)
    solved: Solved | None = None
    rows: int = 0  # fitted rows' residuals (tokens/s, draft steps)


def _solve(platform: Platform, knobs: list[Knob], unknowns: list[Unknown], rows):
    """Least squares on log(simulated / published) (tokens/s, and the draft step
    where a row gives one) over the knobs' log factors and the unknowns'
    transformed values, each pulled weakly toward its start."""
    published = published_logs(rows)
    bounds = np.array([log_bounds(platform, k) for k in knobs]
                      + [u.z_bounds() for u in unknowns]).reshape(-1, 2).T
    z0 = np.array([0.0] * len(knobs) + [u.z_start() for u in unknowns])

    def split(x):
        values = {u.key: u.value(z) for u, z in zip(unknowns, x[len(knobs):])}
        return scaled(platform, knobs, x[:len(knobs)]), values

    def residuals(x):
        trial, values = split(x)
        sim = simulated_logs(rows, trial, values)
        return np.concatenate([sim - published, PRIOR_WEIGHT * (x - z0)])

    # a start on a bound stalls trf (its scaling by the distance to the bounds)
    x0 = np.clip(z0, bounds[0] + 0.05, bounds[1] - 0.05)
    # an unknown moves outcomes a deterministic run decides by whole rounds (SSD's
    # hits), flat at 1e-6: its difference step (~0.1 in logit or log) spans a few rounds
    steps = np.array([1e-6] * len(knobs) + [UNKNOWN_STEP] * len(unknowns))
    sol = least_squares(residuals, x0, bounds=(bounds[0], bounds[1]), method="trf",
                        diff_step=steps, ftol=1e-12, xtol=1e-12, gtol=1e-12)
    fitted, values = split(sol.x)
    n = len(published)  # the Jacobian's rows past these are the pull to the start
    solved = Solved(sol.x, z0, bounds, sol.jac[:n], lambda x: residuals(x)[:n])
    return sol.x[:len(knobs)], fitted, values, bool(sol.success), solved


def without_steps(rows) -> list[Measurement]:
    """The rows with their draft steps dropped: tokens/s alone is fitted."""
    return [r.model_copy(update={"draft_step_s": None}) for r in rows]


def fit_rows(platform: Platform, rows, fields=DEFAULT_FIELDS, *,
             steps: bool = False) -> PublishedFit:
    """Least-squares fit of the knobs on ``fields`` and of the rows' unknowns
    (fitted acceptances, SSD exponents) to the rows (all of them fitted): their
    tokens/s, and with ``steps`` their draft steps where they give one."""
    rows = rows if steps else without_steps(rows)
    all_knobs = knobs_of(platform, fields)
    knobs = sensitive_knobs(platform, all_knobs, rows)
    fixed = [k for k in all_knobs if k not in knobs]
    if not knobs:
        raise ValueError("no fitted row's speed depends on the fields to fit; fit other "
                         "fields with --fit-fields")
    unknowns = unknowns_of(rows)
    x, fitted, values, ok, solved = _solve(platform, knobs, unknowns, rows)
    return PublishedFit(knobs, x, fixed, fitted, ok, values, unknowns, solved,
                        len(published_logs(rows)))


def fit_unknowns(platform: Platform, rows) -> dict[str, float]:
    """The rows' unknowns fitted on their ``split: fit`` rows with ``platform``
    as it is (no knob moves): what a shipped profile predicts for the rest."""
    fitting = without_steps([r for r in rows if r.split == "fit" and r.unknowns])
    unknowns = unknowns_of(fitting)
    if not unknowns:
        return {}
    return _solve(platform, [], unknowns, fitting)[2]


def _order_pairs(rows):
    """Pairs of rows sharing a ranking key, at least one held out."""
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if not set(a.rankings) & set(b.rankings):
                continue
            if a.split == "fit" and b.split == "fit":
                continue
            yield a, b


def ranking_flips(rows, simulated: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs of rows with a ranking key in common, at least one held out, whose
    simulated order differs from the published order."""
    flips = []
    for a, b in _order_pairs(rows):
        published = a.published - b.published
        sim = simulated[a.id] - simulated[b.id]
        if published * sim < 0:
            flips.append((a.id, b.id))
    return flips


def evaluate(platform: Platform, before: Platform, rows, values=None,
             before_values=None) -> list[dict]:
    """Per row: published, simulated before and after, relative errors (and the
    draft step after, where the row gives one); unknowns from ``values`` after
    and ``before_values`` before."""
    table = []
    for r in rows:
        priced_as = sources.runnable(r)[1]
        pre = simulate_row(r, before, before_values)
        post, step = simulate_row_full(r, platform, values)
        entry = {"id": r.id, "split": r.split, "target": r.target, "policy": r.policy,
                 "measure": r.measure, "published_tokens_per_s": r.published,
                 "before_tokens_per_s": pre, "after_tokens_per_s": post,
                 "error_before": pre / r.published - 1,
                 "error_after": post / r.published - 1}
        if priced_as:  # its stack is not shipped: say what priced it
            entry["priced_as_stack"] = priced_as
        if step is not None:
            entry.update({"published_draft_step_s": r.draft_step_s,
                          "after_draft_step_s": step,
                          "draft_step_error_after": step / r.draft_step_s - 1})
        table.append(entry)
    return table


def median_abs_error(table, split: str) -> float | None:
    errs = [abs(t["error_after"]) for t in table if t["split"] == split]
    return float(np.median(errs)) if errs else None
