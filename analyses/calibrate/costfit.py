"""The cost model as a least-squares problem over measured operations.

Each measured operation becomes a ``Term``: its predicted seconds written as a
function of the profile parameters it depends on. A Forward is a list of
device passes (the executor runs a sampled Forward of k tokens as k passes),
each holding the coefficients ``simcore.costmodel.RooflineCost.terms`` gives
it (kernels, calls, FLOPs, bytes, rows, peak FLOP/s, tier bandwidth), and is
evaluated by the simulator's own ``pass_seconds`` and ``roofline`` on arrays
of every pass at once: there is one cost formula, not a copy of it.
Transfers, all-reduces and weight streams are sums of ``value * coef`` and
``coef / value`` terms (a stream on a device that installs its weights itself
adds bytes / ``stream_host_gb_s``; a flash tier with per-request latency adds
requests * ``request_latency_s`` / queue depth). ``fit`` solves the problem in
log space with ``scipy.optimize.least_squares`` and a robust (Cauchy) loss, so
a few disturbed spans (a page fault, a preempted core) do not drag the fit;
every run weighs the same in it, and every operation kind within a run
(``run_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from hwprofiles.schema import width_weights
from simcore.costmodel import Values, pass_seconds, roofline

BOUNDS = {"compute_efficiency": (1e-4, 1.0), "memory_efficiency": (1e-4, 1.0),
          "launch_overhead_s": (1e-9, 0.1), "call_overhead_s": (1e-9, 0.5),
          "roofline_exponent": (1.0, 64.0), "multirow_memory_factor": (0.1, 10.0),
          "latency_s": (1e-9, 1.0), "alpha_s": (1e-9, 1.0), "bandwidth_gb_s": (1e-3, 1e5),
          "stream_host_gb_s": (1e-3, 1e5), "memory_half_bytes": (1.0, 1e10),
          "compute_half_flops": (1.0, 1e13), "memory_bandwidth_gb_s": (1e-3, 1e5),
          "request_latency_s": (1e-9, 1.0), "stream_dispatch_s": (1e-9, 1.0)}
# Parameters whose terms measure them alone (a stream's wait before its read): never
# shadowed by another term, so fitted from an unset 0, starting from this value.
ALONE_STARTS = {"stream_dispatch_s": 1e-4}
DEVICE_FIELDS = ("launch_overhead_s", "call_overhead_s", "compute_efficiency",
                 "roofline_exponent", "multirow_memory_factor", "memory_half_bytes",
                 "compute_half_flops", "memory_bandwidth_gb_s")
# Efficiency terms fitted only when asked for (``hetspec calibrate --fit-terms``);
# otherwise they keep the profile's value (default: off) and are charged as such.
OPTIONAL_FIELDS = ("memory_half_bytes", "compute_half_flops", "memory_bandwidth_gb_s",
                   "request_latency_s")
LOSS = "cauchy"  # robust: a span 3x off weighs ~1/500 of a good one
LOSS_SCALE = 0.05  # residuals (log units) beyond ~5% count as outliers
# Asked for by name, the multi-row memory factor is fitted per width the passes
# measure (a table by rows, ``Device.multirow_factor``) instead of as one number:
# each width of 2 to ``MAX_LISTED_ROWS`` rows that at least ``MIN_WIDTH_PASSES``
# passes of a device measure is a listed width (the most measured one when none
# is). Narrow passes are where a CPU GEMM's row blocking shows in its weight
# streaming; wider ones keep the widest listed factor and grow by their compute
# (a factor per wide width would stand in for the compute term, which the spans
# then no longer measure).
BY_ROWS = "multirow_by_rows"
MIN_WIDTH_PASSES = 20
MAX_LISTED_ROWS = 8
COMPUTE_STARTS = (None, 0.3, 0.05, 0.01)  # compute efficiencies the fit starts from
EXPONENT_STARTS = (8.0, 1.5)  # roofline exponents the fit starts from (None: max)


@dataclass(frozen=True)
class Param:
    """One fitted number: which object(s) of the platform, which field. A device
    parameter may name several identical devices ("cpu0,cpu1"), fitted as one."""

    kind: str  # device | tier | link | group
    name: str
    field: str
    at: int = 0  # a multi-row factor's width (rows) in a table by rows; 0: none

    @property
    def label(self) -> str:
        width = f"[{self.at} rows]" if self.at else ""
        return f"{self.kind} {self.name}.{self.field}{width}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.name.split(","))


@dataclass(frozen=True)
class Pass:
    """One device pass of a Forward: its cost coefficients, per member."""

    kernels: float
    calls: int  # model calls it makes (each pays call_overhead_s)
    flops: float
    nbytes: float
    rows: int  # positions fed x batch rows
    peak_flops: float
    tier_bytes_s: float  # the tier's full bandwidth
    head_bytes: float = 0.0  # the head's weight bytes, per member (0: no head)
    head_rows: int = 0  # the rows the head's GEMM projects
    compute_padding: float = 1.0  # rows its GEMM tiles compute per row (Device.compute_padding)


@dataclass
class Term:
    """One measured operation's prediction as a function of parameters."""

    measured_s: float
    op_kind: str
    run: str
    fixed_s: float = 0.0
    device: str | None = None  # the (tied) device name of its passes' parameters
    tier: str | None = None
    passes: list[Pass] = field(default_factory=list)
    linear: list[tuple[Param, float]] = field(default_factory=list)  # value * coef
    inverse: list[tuple[Param, float]] = field(default_factory=list)  # coef / value

    def params(self) -> list[Param]:
        out = [Param("device", self.device, f) for f in DEVICE_FIELDS] if self.passes else []
        if self.passes:
            out.append(Param("tier", self.tier, "memory_efficiency"))
        return out + [p for p, _ in self.linear + self.inverse]


Widths = dict[str, tuple[int, ...]]  # device (tied name) -> a factor table's widths


def params_of(terms: list[Term], widths: Widths | None = None) -> list[Param]:
    """Every parameter the terms use; a device in ``widths`` has one multi-row
    factor per listed width instead of one."""
    seen: dict[Param, None] = {}
    for t in terms:
        for p in t.params():
            if p.field == "multirow_memory_factor" and widths and p.name in widths:
                for w in widths[p.name]:
                    seen.setdefault(Param(p.kind, p.name, p.field, w))
            else:
                seen.setdefault(p)
    return list(seen)


def widths_of(params) -> Widths:
    """Per device, the widths its multi-row factor parameters list (sorted)."""
    out: dict[str, list[int]] = {}
    for p in params:
        if p.at:
            out.setdefault(p.name, []).append(p.at)
    return {device: tuple(sorted(w)) for device, w in out.items()}


def measured_widths(terms: list[Term]) -> Widths:
    """Per device, the widths over several rows its passes measure often enough
    to be listed in a factor table (``BY_ROWS``)."""
    counts: dict[str, dict[int, int]] = {}
    for t in terms:
        for p in t.passes:
            if 1 < p.rows <= MAX_LISTED_ROWS:
                mine = counts.setdefault(t.device, {})
                mine[p.rows] = mine.get(p.rows, 0) + 1
    out = {}
    for device, seen in counts.items():
        often = tuple(sorted(w for w, n in seen.items() if n >= MIN_WIDTH_PASSES))
        out[device] = often or (max(seen, key=lambda w: (seen[w], -w)),)
    return out


class Problem:
    """All terms as flat arrays; ``predict(values)`` costs every term at once."""

    def __init__(self, terms: list[Term], params: list[Param]):
        self.terms, self.params = terms, params
        index = {p: i for i, p in enumerate(params)}
        tables = widths_of(params)  # device -> its factor table's widths
        self.measured = np.array([t.measured_s for t in terms])
        self.fixed = np.array([t.fixed_s for t in terms])
        rows = [(i, t, p) for i, t in enumerate(terms) for p in t.passes]
        self.p_term = np.array([i for i, _, _ in rows], dtype=int)
        self.p_col = {f: np.array([index[Param("device", t.device, f)] for _, t, _ in rows],
                                  dtype=int) for f in DEVICE_FIELDS if f != "multirow_memory_factor"}
        self.p_col["memory_efficiency"] = np.array(
            [index[Param("tier", t.tier, "memory_efficiency")] for _, t, _ in rows], dtype=int)
        # each pass's multi-row factor: one parameter, or two listed widths' blend
        blend = [self._factor_of(t.device, p.rows, tables, index) for _, t, p in rows]
        self.p_mf = np.array([[c for c, _ in b] for b in blend], dtype=int).reshape(-1, 2)
        self.w_mf = np.array([[w for _, w in b] for b in blend], dtype=float).reshape(-1, 2)
        # and its head's, at the rows the head projects (1 for one row)
        blend = [self._factor_of(t.device, p.head_rows, tables, index) for _, t, p in rows]
        self.p_hf = np.array([[c for c, _ in b] for b in blend], dtype=int).reshape(-1, 2)
        self.w_hf = np.array([[w for _, w in b] for b in blend], dtype=float).reshape(-1, 2)
        self.head_multirow = np.array([p.head_rows > 1 for _, _, p in rows], dtype=bool)
        for name in ("kernels", "calls", "flops", "nbytes", "peak_flops", "tier_bytes_s",
                     "head_bytes", "compute_padding"):
            setattr(self, name, np.array([getattr(p, name) for _, _, p in rows], dtype=float))
        self.multirow = np.array([p.rows > 1 for _, _, p in rows], dtype=bool)
        self.lin = self._pairs([(i, index[p], k) for i, t in enumerate(terms)
                                for p, k in t.linear])
        self.inv = self._pairs([(i, index[p], k) for i, t in enumerate(terms)
                                for p, k in t.inverse])

    @staticmethod
    def _factor_of(device: str, rows: int, tables: dict, index: dict):
        """(column, weight) x 2: the parameters a pass's multi-row factor blends."""
        field = "multirow_memory_factor"
        if device not in tables:
            col = index[Param("device", device, field)]
            return ((col, 1.0), (col, 0.0))
        widths = tables[device]
        pairs = [(index[Param("device", device, field, widths[i])], w)
                 for i, w in width_weights(widths, rows)]
        return tuple(pairs + [(pairs[0][0], 0.0)] * (2 - len(pairs)))

    def factor_columns(self) -> set[int]:
        """The multi-row factor parameters some pass (or head) over several rows uses."""
        used = self.p_mf[self.multirow][self.w_mf[self.multirow] > 0]
        heads = self.p_hf[self.head_multirow][self.w_hf[self.head_multirow] > 0]
        return set(used.tolist()) | set(heads.tolist())

    @staticmethod
    def _pairs(items):
        if not items:
            return np.zeros(0, int), np.zeros(0, int), np.zeros(0)
        a, b, c = zip(*items)
        return np.array(a, dtype=int), np.array(b, dtype=int), np.array(c, dtype=float)

    def values(self, v: np.ndarray) -> Values:
        """Each pass's parameter values, gathered from the parameter vector."""
        col = {f: v[i] for f, i in self.p_col.items()}
        return Values(col["launch_overhead_s"], col["call_overhead_s"],
                      col["compute_efficiency"], col["memory_efficiency"],
                      (v[self.p_mf] * self.w_mf).sum(axis=1), col["roofline_exponent"],
                      col["memory_half_bytes"], col["compute_half_flops"],
                      col["memory_bandwidth_gb_s"] * 1e9, self.compute_padding)

    def predict(self, v: np.ndarray) -> np.ndarray:
        out = self.fixed.copy()
        if len(self.p_term):
            values = self.values(v)
            head_factor = np.where(self.head_multirow, (v[self.p_hf] * self.w_hf).sum(axis=1),
                                   1.0)
            launch, compute, memory = pass_seconds(
                self.kernels, self.calls, self.flops, self.nbytes, self.multirow,
                self.peak_flops, self.tier_bytes_s, values, self.head_bytes, head_factor)
            np.add.at(out, self.p_term,
                      launch + roofline(compute, memory, values.roofline_exponent))
        for (t, p, k), inverse in ((self.lin, False), (self.inv, True)):
            if len(t):
                np.add.at(out, t, k / v[p] if inverse else v[p] * k)
        return out

    def log_residuals(self, v: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(self.predict(v), 1e-12) / self.measured)


@dataclass
class Fit:
    """Fitted values (kept values for parameters the spans do not constrain)."""

    values: dict[Param, float]
    initial: dict[Param, float]
    unconstrained: list[Param]
    log_residuals: np.ndarray
    terms: list[Term]
    success: bool
    held: list[Param] = field(default_factory=list)  # kept by request: not fitted
    # what the sanity gate (analyses.calibrate.fitgate) reads: the numbers fitted, in
    # log units where they ended and started, the Jacobian of the spans' (robustly
    # weighted) log residuals over them, and those residuals at any log values
    fitted: list[Param] = field(default_factory=list)
    x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    x_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    jac: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    residuals: Any = None
    paces: dict[str, float] = field(default_factory=dict)  # run -> pace, when fitted

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(np.expm1(self.log_residuals))))


def _starts(params: list[Param], x0: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Starting points: the profile's values, then lower compute efficiencies, each
    with a sharp and a soft roofline exponent. A fit started where every op is
    memory-bound would barely feel the compute terms."""
    ce = [i for i, p in enumerate(params) if p.field == "compute_efficiency"]
    ex = [i for i, p in enumerate(params) if p.field == "roofline_exponent"]
    # a bandwidth cap starting at the tier's bandwidth has no gradient (min(bw, cap)):
    # start it at half, where it binds
    cap = [i for i, p in enumerate(params) if p.field == "memory_bandwidth_gb_s"]
    x0 = x0.copy()
    x0[cap] = np.maximum(x0[cap] - np.log(2.0), lo[cap] + 1e-9)
    for value in COMPUTE_STARTS if ce else (None,):
        for exponent in EXPONENT_STARTS if ex else (None,):
            x = x0.copy()
            if value is not None:
                x[ce] = np.clip(np.log(value), lo[ce] + 1e-9, hi[ce] - 1e-9)
            if exponent is not None:
                x[ex] = np.clip(np.log(exponent), lo[ex] + 1e-9, hi[ex] - 1e-9)
            yield x


def run_weights(terms: list[Term]) -> np.ndarray:
    """Each span's weight in the fit, averaging 1 per span: every fitting run
    weighs the same in all, and within a run every operation kind the same (its
    spans share it). Counted per span, a run of many cheap draft passes would
    outweigh the AR run; counted per run, a run's thousands of draft passes
    would outweigh the few hundred one-row passes of the target beside them,
    the denominator of every speedup."""
    kinds: dict[tuple[str, str], int] = {}
    for t in terms:
        kinds[t.run, t.op_kind] = kinds.get((t.run, t.op_kind), 0) + 1
    per_run: dict[str, int] = {}
    for run, _ in kinds:
        per_run[run] = per_run.get(run, 0) + 1
    return np.array([len(terms) / (len(per_run) * per_run[t.run] * kinds[t.run, t.op_kind])
                     for t in terms])


def weighted_cauchy(weights: np.ndarray):
    """The Cauchy loss with a weight per residual, as least_squares takes a loss:
    rho(z) and its first two derivatives, z the squared scaled residuals."""
    def loss(z):
        out = np.empty((3, len(z)))
        out[0] = weights * np.log1p(z)
        out[1] = weights / (1 + z)
        out[2] = -weights / (1 + z) ** 2
        return out
    return loss


def fit(terms: list[Term], initial: dict[Param, float],
        fixed: frozenset[str] = frozenset(), widths: Widths | None = None,
        balance_runs: bool = False, pace_per_run: bool = False) -> Fit:
    """Least-squares fit, in log space, of every parameter the terms use (except
    fields named in ``fixed``, and parameters in it, which keep their initial
    values); a device in ``widths`` gets a multi-row factor per listed width;
    ``balance_runs`` weighs every run the same (``run_weights``), else every span;
    ``pace_per_run`` fits each run a pace besides (``Paces``)."""
    if not terms:
        raise ValueError("the fitting runs hold no Forward, Transfer, AllReduce or "
                         "StreamWeights spans to fit; record runs with 'hetspec run'")
    params = params_of(terms, widths)
    problem = Problem(terms, params)
    idle = set(unidentifiable(problem, np.array([initial[p] for p in params])))
    free = np.array([p.field not in fixed and p not in fixed and p not in idle
                     for p in params])
    lo_all = np.log([BOUNDS[p.field][0] for p in params])
    hi_all = np.log([BOUNDS[p.field][1] for p in params])
    starts = [initial[p] or _alone_start(problem, i, p) for i, p in enumerate(params)]
    x_all = np.clip(np.log([min(max(v, 1e-30), 1e30) for v in starts]),
                    lo_all + 1e-9,
                    hi_all - 1e-9)
    fitted = [p for p, f in zip(params, free) if f]

    kept = np.array([initial[p] for p in params], dtype=float)

    def full(x):  # parameters not fitted keep their exact values (0, inf included)
        out = kept.copy()
        out[free] = np.exp(x)
        return out

    paces = Paces(terms) if pace_per_run else Paces([])
    n = len(fitted)

    def joint(x):  # the profile's numbers, then the runs' paces
        return problem.log_residuals(full(x[:n])) + paces.log_pace(x[n:])

    loss = weighted_cauchy(run_weights(terms)) if balance_runs else LOSS
    lo, hi = np.append(lo_all[free], paces.lo), np.append(hi_all[free], paces.hi)
    sol = None
    for start in _starts(fitted, x_all[free], lo_all[free], hi_all[free]):
        trial = least_squares(joint, np.append(start, paces.start), bounds=(lo, hi),
                              loss=loss, f_scale=LOSS_SCALE, method="trf", x_scale="jac",
                              ftol=1e-12, xtol=1e-12, gtol=1e-12)
        if sol is None or trial.cost < sol.cost - 1e-12:
            sol = trial
    run_z = sol.x[n:]
    run_pace = paces.log_pace(run_z)

    def residuals(x):  # over the profile's numbers, at the fitted paces
        return problem.log_residuals(full(x)) + run_pace

    sol.jac, sol.x = sol.jac[:, :n], sol.x[:n]
    reach = np.linalg.norm(sol.jac, axis=0)
    unconstrained = [p for p in params if p in idle] + [
        p for p, r in zip(fitted, reach) if r < 1e-8]
    values = dict(zip(params, full(sol.x)))
    values.update({p: initial[p] for p, f in zip(params, free) if not f})  # kept exactly
    vector = np.array([values[p] for p in params])
    held = [p for p in params if p.field in fixed or p in fixed]
    return Fit({p: float(v) for p, v in values.items()}, {p: initial[p] for p in params},
               unconstrained, problem.log_residuals(vector) + run_pace, terms,
               bool(sol.success), held, fitted, sol.x, x_all[free], sol.jac, residuals,
               paces.of(run_z))


class Paces:
    """Each run's pace, fitted beside the profile: a factor on the time of every
    span of the run, for a machine whose speed drifts between runs (a virtual
    machine's host). The profile then holds how the runs' operations cost
    relative to one another, at the runs' mean pace: the paces' logs sum to 0,
    since the profile's own numbers can scale every time alike. The last run's
    pace is the one the others leave (minus their logs' sum)."""

    SPAN = np.log(3.0)  # a run's pace stays within 1/3x..3x of the mean

    def __init__(self, terms: list[Term]):
        self.runs = sorted({t.run for t in terms})
        index = {run: i for i, run in enumerate(self.runs)}
        self.of_term = np.array([index[t.run] for t in terms], dtype=int)
        free = max(len(self.runs) - 1, 0)  # the last run's pace is the others' rest
        self.start = np.zeros(free)
        self.lo, self.hi = np.full(free, -self.SPAN), np.full(free, self.SPAN)

    def per_run(self, z: np.ndarray) -> np.ndarray:
        """Each run's log pace from the free ones."""
        return np.append(z, -np.sum(z)) if self.runs else np.zeros(0)

    def log_pace(self, z: np.ndarray):
        """Each term's log pace (0 when no pace is fitted)."""
        return self.per_run(z)[self.of_term] if self.runs else 0.0

    def of(self, z: np.ndarray) -> dict[str, float]:
        """run -> its fitted pace (empty when none is fitted)."""
        return {run: float(np.exp(v)) for run, v in zip(self.runs, self.per_run(z))}


def _alone_start(problem: Problem, i: int, param: Param) -> float:
    """Where an unset parameter measured alone starts: the value its own terms
    give (their measured total less their fixed parts, over its coefficients),
    else ``ALONE_STARTS``. The robust loss is flat far from the data: started at
    its default, a wait of milliseconds beside seconds of fixed time stayed at
    its bound."""
    if param.field not in ALONE_STARTS:
        return 0.0
    mine = [(t, k) for t, p, k in zip(*problem.lin) if p == i]
    rows = sorted({t for t, _ in mine})
    left = float(np.sum(problem.measured[rows]) - np.sum(problem.fixed[rows])) if rows else 0.0
    coef = sum(k for _, k in mine)
    return left / coef if left > 0 and coef > 0 else ALONE_STARTS[param.field]


def unidentifiable(problem: Problem, v: np.ndarray, share: float = 0.02) -> list[Param]:
    """Parameters the operations cannot pin down, kept at the profile's values: a
    link, collective or flash parameter that makes less than ``share`` of every
    operation's predicted time (e.g. a link's bandwidth when every message is a
    few bytes), a multi-row memory factor with no pass over several rows, and a
    device's streaming host rate wherever a flash bandwidth costs the same bytes
    (a stream's span is bytes / bandwidth + bytes / host rate: only the sum of
    the two per-byte times shows, so the measured host rate is kept and the
    bandwidth fitted)."""
    total = problem.predict(v)
    out = []
    for i, param in enumerate(problem.params):
        if param.field == "multirow_memory_factor":
            if i not in problem.factor_columns():
                out.append(param)
            continue
        if param.field == "stream_host_gb_s":
            if _shadowed_by_bandwidth(problem, i):
                out.append(param)
            continue
        if param.field in OPTIONAL_FIELDS or param.field in ALONE_STARTS:
            continue  # asked for by name, or measured alone: fitted from 0
        parts: dict[int, float] = {}  # per term, the parameter's part (summed terms
        for t, p, k in zip(*problem.lin):  # hold it many times)
            if p == i:
                parts[t] = parts.get(t, 0.0) + v[p] * k
        for t, p, k in zip(*problem.inv):
            if p == i:
                parts[t] = parts.get(t, 0.0) + k / v[p]
        if parts and max(x / total[t] for t, x in parts.items()) < share:
            out.append(param)
    return out


def _shadowed_by_bandwidth(problem: Problem, i: int) -> bool:
    """Whether every term holding inverse parameter i also holds a tier's
    bandwidth over the same bytes (the two cannot be told apart)."""
    terms, params, coefs = problem.inv
    mine = {(t, k) for t, p, k in zip(terms, params, coefs) if p == i}
    tiers = {(t, k) for t, p, k in zip(terms, params, coefs)
             if problem.params[p].kind == "tier" and problem.params[p].field == "bandwidth_gb_s"}
    return bool(mine) and mine <= tiers


def predict(terms: list[Term], values: dict[Param, float]) -> np.ndarray:
    params = params_of(terms, widths_of(values))
    return Problem(terms, params).predict(np.array([values[p] for p in params]))


def op_kind_errors(terms: list[Term], values: dict[Param, float],
                   paces: dict[str, float] | None = None) -> dict[str, dict]:
    """Per operation kind: spans, median |error|, median signed error, and the
    error of the kind's total time (each span's run at its fitted pace, if any)."""
    if not terms:
        return {}
    predicted = predict(terms, values)
    if paces:
        predicted = predicted * np.array([paces.get(t.run, 1.0) for t in terms])
    groups: dict[str, list[tuple[float, float]]] = {}
    for t, p in zip(terms, predicted):
        groups.setdefault(t.op_kind, []).append((p, t.measured_s))
    out = {}
    for kind, pairs in sorted(groups.items()):
        err = [p / m - 1 for p, m in pairs]
        out[kind] = {"spans": len(pairs), "median_abs_error": float(np.median(np.abs(err))),
                     "median_error": float(np.median(err)),
                     "total_error": sum(p for p, _ in pairs) / sum(m for _, m in pairs) - 1,
                     "measured_s": sum(m for _, m in pairs)}
    return out
