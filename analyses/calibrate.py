"""Fit a platform's cost-model parameters to measured spans.

Every measured operation is re-predicted with ``simcore.RooflineCost`` on a
"unit" copy of the platform (efficiencies 1, one second of launch per kernel),
which splits its time into terms that scale with one parameter each:

    Forward        launch_s * kernels + max(compute / ce, memory / me)
                   + collectives * (alpha * a + b / bandwidth)
    Transfer       sum over hops of latency + bytes / bandwidth
    AllReduce      count * (alpha * a + b / bandwidth)
    StreamWeights  latency + bytes / flash bandwidth

``scipy.optimize.least_squares`` fits the logarithms of the parameters that
the spans exercise to log(predicted / measured) with a robust (Cauchy) loss,
so a few disturbed spans (a page fault, a preempted core) do not drag the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from analyses.replay import MeasuredRun
from hwprofiles import Platform, load_model
from simcore import RooflineCost

BOUNDS = {"compute_efficiency": (1e-4, 1.0), "memory_efficiency": (1e-4, 1.0),
          "launch_overhead_s": (1e-9, 0.1), "latency_s": (1e-9, 1.0),
          "alpha_s": (1e-9, 1.0), "bandwidth_gb_s": (1e-3, 1e5)}
LOSS = "cauchy"  # robust: a span 3x off weighs ~1/500 of a good one
LOSS_SCALE = 0.05  # residuals (log units) beyond ~5% count as outliers


@dataclass(frozen=True)
class Param:
    """One fitted number: which object of the platform, which field."""

    kind: str  # device | tier | link | group
    name: str
    field: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}.{self.field}"


def current_value(platform: Platform, p: Param) -> float:
    obj = {"device": platform.device, "tier": platform.tier, "group": platform.group,
           "link": lambda n: next(l for l in platform.links if l.name == n)}[p.kind](p.name)
    return float(getattr(obj, p.field))


@dataclass
class Term:
    """One span's prediction as coefficients of parameters (see module doc)."""

    measured_s: float
    op_kind: str
    run: str
    fixed_s: float = 0.0
    launch: tuple[Param, float] | None = None
    roofline: tuple[Param, float, Param, float] | None = None  # ce, compute, me, memory
    linear: list[tuple[Param, float]] = field(default_factory=list)  # value * coef
    inverse: list[tuple[Param, float]] = field(default_factory=list)  # coef / value

    def predict(self, v: dict[Param, float]) -> float:
        t = self.fixed_s
        if self.launch:
            t += v[self.launch[0]] * self.launch[1]
        if self.roofline:
            ce, c, me, m = self.roofline
            t += max(c / v[ce], m / v[me])
        t += sum(v[p] * k for p, k in self.linear)
        t += sum(k / v[p] for p, k in self.inverse)
        return t


def _unit_platform(platform: Platform) -> Platform:
    """The platform with efficiencies 1, 1 s launch and free collectives."""
    devices = tuple(d.model_copy(update={"compute_efficiency": 1.0, "launch_overhead_s": 1.0})
                    for d in platform.devices)
    tiers = tuple(t.model_copy(update={"memory_efficiency": 1.0})
                  for t in platform.memory_tiers)
    groups = tuple(g.model_copy(update={"alpha_s": 0.0, "bandwidth_gb_s": 1e30})
                   for g in platform.groups)
    return platform.model_copy(update={"devices": devices, "memory_tiers": tiers,
                                       "groups": groups})


def _collective(platform: Platform, group: str, nbytes: float, count: float,
                term: Term) -> None:
    g = platform.group(group)
    alpha_coef = g.model_copy(update={"alpha_s": 1.0, "bandwidth_gb_s": 1e30}).allreduce_s(nbytes)
    beta_coef = g.model_copy(update={"alpha_s": 0.0, "bandwidth_gb_s": 1.0}).allreduce_s(nbytes)
    term.linear.append((Param("group", group, "alpha_s"), count * alpha_coef))
    term.inverse.append((Param("group", group, "bandwidth_gb_s"), count * beta_coef))


def op_kind(op: dict, placement: dict) -> str:
    """'Forward target[0:30]+lm x5 on cpu0 (verify)': what the error tables group by."""
    kind, label = op["type"], op.get("label") or ""
    if kind == "Forward":
        lo, hi = op["layers"]
        head = f"+{op['head']}" if op.get("head") else ""
        where = placement.get(op["device"], op["device"])
        n_tokens = op.get("n_fed") or op.get("n_tokens", 1)
        text = f"Forward {op['model']}[{lo}:{hi}]{head} x{n_tokens} on {where}"
    else:
        text = kind
    return text + (f" ({label})" if label else "")


class Terms:
    """Builds a Term for each measured span of runs on one platform."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.unit = RooflineCost(_unit_platform(platform))
        self._models: dict[str, object] = {}

    def _spec(self, run: MeasuredRun, role: str):
        name = run.inputs.get(role)
        if name not in self._models:
            self._models[name] = load_model(name)
        return self._models[name]

    def of_run(self, run: MeasuredRun) -> list[Term]:
        placement = {**self.platform.placement, **run.inputs.get("placement", {})}
        out = []
        for span in run.spans:
            measured = float(span["end_s"]) - float(span["start_s"])
            term = self._term(span["op"], placement, run, measured)
            if term is not None and measured > 0:
                out.append(term)
        return out

    def _term(self, op: dict, placement: dict, run: MeasuredRun, measured: float):
        term = Term(measured, op_kind(op, placement), run.name)
        kind = op["type"]
        if kind == "Forward":
            self._forward(op, placement, run, term)
        elif kind == "Transfer":
            self._transfer(op, placement, term)
        elif kind == "AllReduce":
            group = placement.get(op["group"], op["group"])
            _collective(self.platform, group, float(op["nbytes"]), op.get("count", 1), term)
        elif kind == "StreamWeights":
            self._stream(op, placement, term)
        else:
            return None  # Delay and bookkeeping spans carry no fitted term
        return term

    def _forward(self, op: dict, placement: dict, run: MeasuredRun, term: Term) -> None:
        spec = self._spec(run, op["model"])
        where = placement.get(op["device"], op["device"])
        # n_fed: the positions the executor really fed (a draft catching up on the
        # bonus token feeds two where the schedule asked for one).
        n_tokens = op.get("n_fed") or op.get("n_tokens", 1)
        c = self.unit.forward(spec, where, tuple(op["layers"]), n_tokens,
                              op.get("batch", 1), op.get("context", 0), op.get("head"),
                              op.get("collectives"))
        members = self.platform.members(where)
        device = self.platform.device(members[0])
        term.launch = (Param("device", device.name, "launch_overhead_s"), c.launch_s)
        term.roofline = (Param("device", device.name, "compute_efficiency"), c.compute_s,
                         Param("tier", device.memory, "memory_efficiency"), c.memory_s)
        if len(members) > 1:
            n_layers = op["layers"][1] - op["layers"][0]
            count = 2 * n_layers if op.get("collectives") is None else op["collectives"]
            rows = op.get("n_tokens", 1) * op.get("batch", 1)
            _collective(self.platform, where, rows * spec.hidden * spec.dtype_bytes, count,
                        term)

    def _transfer(self, op: dict, placement: dict, term: Term) -> None:
        src = self.platform.members(placement.get(op["src"], op["src"]))[0]
        dst = self.platform.members(placement.get(op["dst"], op["dst"]))[0]
        for link in self.platform.route(src, dst):
            term.linear.append((Param("link", link.name, "latency_s"), 1.0))
            term.inverse.append((Param("link", link.name, "bandwidth_gb_s"),
                                 float(op["nbytes"]) / 1e9))

    def _stream(self, op: dict, placement: dict, term: Term) -> None:
        where = placement.get(op["device"], op["device"])
        device = self.platform.device(self.platform.members(where)[0])
        tier = self.platform.tier(device.storage)
        term.fixed_s = tier.latency_s
        term.inverse.append((Param("tier", tier.name, "bandwidth_gb_s"),
                             float(op["nbytes"]) / 1e9 / tier.memory_efficiency))


@dataclass
class Fit:
    """Fitted values (kept values for parameters the spans do not constrain)."""

    values: dict[Param, float]
    initial: dict[Param, float]
    unconstrained: list[Param]
    log_residuals: np.ndarray
    terms: list[Term]
    success: bool

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(np.expm1(self.log_residuals))))


def params_of(terms: list[Term]) -> list[Param]:
    seen: dict[Param, None] = {}
    for t in terms:
        for p in ([t.launch[0]] if t.launch else []) + (
                [t.roofline[0], t.roofline[2]] if t.roofline else []):
            seen.setdefault(p)
        for p, _ in t.linear + t.inverse:
            seen.setdefault(p)
    return list(seen)


def log_residuals(terms: list[Term], values: dict[Param, float]) -> np.ndarray:
    return np.array([math.log(max(t.predict(values), 1e-12) / t.measured_s) for t in terms])


COMPUTE_STARTS = (None, 0.3, 0.05, 0.01)  # compute efficiencies the fit starts from


def _starts(params: list[Param], x0: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Starting points: the profile's values, then lower compute efficiencies. Under
    max(compute, memory) a branch that is nowhere active has no gradient, so a fit
    started where every op is memory-bound would never try compute-bound ones."""
    ce = [i for i, p in enumerate(params) if p.field == "compute_efficiency"]
    for value in COMPUTE_STARTS if ce else (None,):
        x = x0.copy()
        if value is not None:
            x[ce] = np.clip(np.log(value), lo[ce] + 1e-9, hi[ce] - 1e-9)
        yield x


def fit(platform: Platform, terms: list[Term]) -> Fit:
    """Least-squares fit of every parameter the terms use, in log space."""
    if not terms:
        raise ValueError("the fitting runs hold no Forward, Transfer, AllReduce or "
                         "StreamWeights spans to fit; record runs with 'hetspec run'")
    params = params_of(terms)
    initial = {p: current_value(platform, p) for p in params}
    lo = np.log([BOUNDS[p.field][0] for p in params])
    hi = np.log([BOUNDS[p.field][1] for p in params])
    x0 = np.clip(np.log([max(initial[p], 1e-30) for p in params]), lo + 1e-9, hi - 1e-9)

    def residuals(x):
        return log_residuals(terms, dict(zip(params, np.exp(x))))

    sol = None
    for x_start in _starts(params, x0, lo, hi):
        trial = least_squares(residuals, x_start, bounds=(lo, hi), loss=LOSS,
                              f_scale=LOSS_SCALE, method="trf")
        if sol is None or trial.cost < sol.cost - 1e-12:
            sol = trial
    reach = np.linalg.norm(sol.jac, axis=0)
    unconstrained = [p for p, r in zip(params, reach) if r < 1e-8]
    values = {p: (initial[p] if p in unconstrained else float(v))
              for p, v in zip(params, np.exp(sol.x))}
    return Fit(values, initial, unconstrained, residuals(np.log(
        [max(values[p], 1e-30) for p in params])), terms, bool(sol.success))


def op_kind_errors(terms: list[Term], values: dict[Param, float]) -> dict[str, dict]:
    """Per operation kind: spans, median |error| and median signed error."""
    groups: dict[str, list[float]] = {}
    for t, r in zip(terms, log_residuals(terms, values)):
        groups.setdefault(t.op_kind, []).append(math.expm1(r))
    return {k: {"spans": len(v), "median_abs_error": float(np.median(np.abs(v))),
                "median_error": float(np.median(v))} for k, v in sorted(groups.items())}


def apply(platform: Platform, values: dict[Param, float], source: str) -> Platform:
    """A copy of the platform with fitted values and a source naming the fit."""

    def update(obj, kind: str):
        changes = {p.field: v for p, v in values.items()
                   if p.kind == kind and p.name == obj.name}
        if not changes:
            return obj
        sources = dict(obj.sources)
        for name, v in changes.items():
            was = getattr(obj, name)
            sources[name] = f"{source}; was {was:.4g}" + (
                f" ({obj.sources[name]})" if name in obj.sources else "")
        return obj.model_copy(update={**changes, "sources": sources})

    return platform.model_copy(update={
        "devices": tuple(update(d, "device") for d in platform.devices),
        "memory_tiers": tuple(update(t, "tier") for t in platform.memory_tiers),
        "links": tuple(update(l, "link") for l in platform.links),
        "groups": tuple(update(g, "group") for g in platform.groups)})
