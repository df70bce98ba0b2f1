"""Fit a platform's cost-model parameters to measured spans.

Every measured operation is turned into its cost terms by the simulator's own
cost model (``simcore.costmodel``): a Forward into the device passes the
executor ran for it, each with the coefficients ``RooflineCost.terms`` gives
(kernels, calls, FLOPs, bytes, rows, peak, tier bandwidth) and the collectives
it pays; ``analyses.calibrate.costfit`` evaluates them with the same ``pass_seconds``:

    Forward        per pass: call_overhead_s + launch_overhead_s * kernels
                   + roofline(memory, compute, roofline_exponent)
                   + collectives * (alpha * a + b / bandwidth)
    Transfer       sum over hops of latency + bytes / bandwidth
    AllReduce      count * (alpha * a + b / bandwidth)
    StreamWeights  latency + requests * request_latency_s / queue_depth
                   + bytes / flash bandwidth [+ bytes / stream_host_gb_s]
    its wait       compute its device ran meanwhile (measured) + stream_dispatch_s
                   (``analyses.calibrate.streamterms``; streams and waits are fitted on
                   their totals per run)

The optional efficiency terms (``costfit.OPTIONAL_FIELDS``: size-dependent
bandwidth and FLOP rates, a per-engine bandwidth cap, flash request latency)
are fitted when asked for (``fit_terms``) and otherwise keep the profile's
values. A fitted bandwidth cap stands in for its tier's memory efficiency,
which is then kept (the two scale the same bytes). Asked for ``multirow_by_rows``
(``costfit.BY_ROWS``), the multi-row memory factor is fitted per width the
passes measure, a table by rows, instead of as one number.

What a span is compared with is the time the operation held the critical path
of the executor: its own span, plus, for a Forward, Transfer or StreamWeights,
the host time before it (since the latest span that ended: command dispatch; a
stream's wait is a term of its own), plus, for the Forward a Verify reads, that
Verify's sampling and the host time before it (the simulator's Verify is
instant). A Transfer's span is taken net of the time its sender or receiver
was still computing (the executor sends and receives a message only when the
device is free).

A sampled Forward of k tokens is k device passes in the executor (the first
feeds the positions it really fed, ``n_fed``; the others one per row), unless
it asks for ``head_tokens=1``: one pass over its positions, one token sampled.
Devices with identical hardware (kind, peak FLOP/s, memory and storage tiers)
share their fitted parameters: the spans cannot tell two such cores apart.
"""

from __future__ import annotations

import bisect

from analyses.calibrate.costfit import (BOUNDS, BY_ROWS, EXPONENT_STARTS, OPTIONAL_FIELDS, Fit,
                                       Param, Pass, Term, Widths, measured_widths,
                                       params_of)
from analyses.calibrate.costfit import fit as _fit
from analyses.calibrate.costfit import op_kind_errors  # noqa: F401  (re-exported)
from analyses.measured.replay import MeasuredRun, model_name
from analyses.calibrate.streamterms import DISPATCH_KIND, dispatch_gaps, merge_streams
from executors.passes import span_passes
from hwprofiles import Platform, load_model
from hwprofiles.schema import Placement, resolve
from policies import parse_params
from policies.runs.measured import MeasuredSpan
from simcore import RooflineCost
from simcore.costmodel import (LinearTerms, allreduce_terms, dispatch_terms, hop_terms,
                               stream_terms)

BASELINE_KIND = " [AR baseline]"  # how a baseline operation's kind ends
PREFILL_KIND = "prefill (target)"  # a run's prompt prefill, fitted beside its spans

__all__ = ["Param", "Terms", "fit", "apply", "current_value", "op_kind", "op_kind_errors",
           "device_classes", "params_of"]


def device_classes(platform: Platform, tie: bool = True) -> dict[str, str]:
    """Device name -> the parameter name it is fitted under ("cpu0,cpu1")."""
    groups: dict[tuple, list[str]] = {}
    for d in platform.devices:
        key = (d.kind, tuple(sorted(d.peak_flops.items())), d.memory, d.storage) if tie \
            else (d.name,)
        groups.setdefault(key, []).append(d.name)
    return {name: ",".join(names) for names in groups.values() for name in names}


def current_value(platform: Platform, p: Param) -> float:
    lookup = {"device": platform.device, "tier": platform.tier, "group": platform.group,
              "link": lambda n: next(l for l in platform.links if l.name == n)}[p.kind]
    obj = lookup(p.names[0])
    if p.at:  # one width of a multi-row factor table
        return obj.multirow_factor(p.at)
    value = getattr(obj, p.field)
    if value is None and p.field == "memory_bandwidth_gb_s":  # None: the tier's own
        return platform.tier(obj.memory).bandwidth_gb_s
    return EXPONENT_STARTS[0] if value is None else float(value)  # None: the max


def _add(term: Term, terms: LinearTerms, classes: dict) -> None:
    """A transfer's, all-reduce's or stream's cost-model terms as fitted parameters
    (devices under their tied class name)."""
    term.fixed_s += terms.fixed_s
    for entries, into in ((terms.linear, term.linear), (terms.inverse, term.inverse)):
        for kind, name, field, coef in entries:
            into.append((Param(kind, classes[name] if kind == "device" else name, field),
                         coef))


def op_kind(op: dict, placement: dict) -> str:
    """'Forward target[0:30]+lm x5 on cpu0 (verify)': what the error tables group by."""
    placement = Placement(placement)
    kind, label = op["type"], op.get("label") or ""
    if kind == "Forward":
        lo, hi = op["layers"]
        head = f"+{op['head']}" if op.get("head") else ""
        where = placement[op["device"]]
        rows = f"x{op.get('n_fed') or op.get('n_tokens', 1)}"
        if op.get("batch", 1) > 1:
            rows += f"x{op['batch']}"
        if stepped(op) and op.get("n_tokens", 1) > 1:
            rows += f" then {op['n_tokens'] - 1} pass(es)"
        text = f"Forward {op['model']}[{lo}:{hi}]{head} {rows} on {where}"
    else:
        text = kind
    return text + (f" ({label})" if label else "")


def critical_times(run: MeasuredRun, placement: dict, platform: Platform,
                   spans: list[MeasuredSpan] | None = None) -> list[float]:
    """Per span (of the run's, or of ``spans``: its AR baseline's): the time it
    held the executor's critical path (module doc)."""
    placement = Placement(placement)
    spans = run.spans if spans is None else spans
    observed = [s.end_s - s.start_s for s in spans]
    order = sorted(range(len(spans)), key=lambda i: (spans[i].batch,
                                                     spans[i].start_s))
    busy = _busy_by_device(spans)
    ends: dict = {}  # per prompt batch, sorted ends of the spans seen so far
    last_forward: dict = {}
    for i in order:
        s = spans[i]
        batch, kind = s.batch, s.type
        seen = ends.setdefault(batch, [])
        before = bisect.bisect_right(seen, s.start_s)  # the latest end before it
        gap = s.start_s - seen[before - 1] if before else 0.0
        if kind == "StreamWeights":
            gap = 0.0  # its wait is a term of its own (streamterms.dispatch_gaps)
        if kind == "Verify":
            target = last_forward.get((batch, s.device or None))
            target = last_forward.get((batch, None)) if target is None else target
            if target is not None:
                observed[target] += gap + observed[i]
        elif kind in ("Forward", "Transfer", "StreamWeights"):
            observed[i] += gap
        if kind == "Transfer":
            observed[i] -= _endpoints_busy(s, busy, placement, platform)
        if kind == "Forward":
            last_forward[(batch, s.device)] = last_forward[(batch, None)] = i
        bisect.insort(seen, s.end_s)
    return observed


def _busy_by_device(spans: list[MeasuredSpan]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list] = {}
    for s in spans:
        if s.type == "Forward":
            out.setdefault(s.device, []).append((s.start_s, s.end_s))
    return {k: sorted(v) for k, v in out.items()}


def _endpoints_busy(span: MeasuredSpan, busy: dict, placement: dict, platform: Platform) -> float:
    """How long either end of a Transfer span was computing during it (the
    executor sends and receives a message only when the device is free)."""
    ends = set()
    for role in (span.op.get("src"), span.op.get("dst")):
        try:
            ends.add(platform.members(placement[role])[0])
        except (KeyError, TypeError):
            continue
    a, b = span.start_s, span.end_s
    intervals = sorted(iv for d in ends for iv in busy.get(d, ()) if iv[1] > a and iv[0] < b)
    total, reach = 0.0, a
    for lo, hi in intervals:
        lo, hi = max(lo, reach), min(hi, b)
        if hi > lo:
            total, reach = total + hi - lo, hi
    return total


class Terms:
    """Builds a Term for each measured operation of runs on one platform."""

    def __init__(self, platform: Platform, *, tie: bool = True):
        self.platform = platform
        self.cost = RooflineCost(platform)
        self.classes = device_classes(platform, tie)
        self._models: dict[str, object] = {}

    def _spec(self, run: MeasuredRun, role: str):
        name = model_name(run, role)
        if name not in self._models:
            self._models[name] = load_model(name)
        return self._models[name]

    def of_run(self, run: MeasuredRun) -> list[Term]:
        """The run's operations, and those of the AR baseline it decoded beside the
        schedule (same run: the fit's per-run pace, ``costfit.Paces``, is theirs too),
        their kinds marked as the baseline's."""
        placement = resolve(self.platform, run.inputs.get("placement"))
        out = self._spans(run, placement, run.spans, "")
        out += self._dispatches(run, placement)
        out += self._prefill(run, placement)
        if run.baseline_spans:
            out += self._spans(run, placement, run.baseline_spans, BASELINE_KIND)
        return merge_streams(out)

    def _spans(self, run: MeasuredRun, placement: dict, spans, suffix: str) -> list[Term]:
        out = []
        for span, observed in zip(spans, critical_times(run, placement, self.platform, spans)):
            term = self._term(span.op, placement, run, observed)
            if term is not None and observed > 0:
                term.op_kind += suffix
                out.append(term)
        return out

    def _prefill(self, run: MeasuredRun, placement: dict) -> list[Term]:
        """The prompt's prefill (``prefill_s``, the mean over the run's prompt
        batches, at its mean prompt) as one Forward of the target over every
        layer, no head: many rows a pass, where decoding passes feed a few, so it
        measures the compute term. Only where the target alone holds the prompt
        (AR, prompt lookup): a draft's own prefill would share its time."""
        prefill_s = run.metrics.get("prefill_s")
        prompt = run.inputs.get("prompt_tokens") or 0
        if not prefill_s or prompt < 2 or any(
                s.op.get("model") != "target" for s in run.spans
                if s.op.get("type") == "Forward"):
            return []
        spec = self._spec(run, "target")
        op = {"type": "Forward", "model": "target", "device": "target",
              "layers": [0, spec.n_layers], "n_tokens": prompt,
              "batch": run.inputs.get("batch", 1), "head": None, "context": 0}
        term = Term(prefill_s, PREFILL_KIND, run.name)
        self._forward(op, placement, run, term)
        return [term]

    def _dispatches(self, run: MeasuredRun, placement: dict) -> list[Term]:
        """Each stream's wait before its read, as ``stream_dispatch_s``."""
        out = []
        params = run.inputs.get("params") or {}
        try:  # the buffer's slots: streams in flight at once
            slots = getattr(parse_params(run.policy, params), "buffer_chunks", 1)
        except ValueError:  # parameters of an unknown or changed schedule: one slot
            slots = 1
        for i, (gap, busy) in dispatch_gaps(run.spans, placement, slots).items():
            role = run.spans[i].op["device"]
            device = self.platform.device(self.platform.members(placement[role])[0])
            term = Term(gap, DISPATCH_KIND, run.name, fixed_s=busy)  # compute before it
            _add(term, dispatch_terms(device), self.classes)
            out.append(term)
        return out

    def _term(self, op: dict, placement: dict, run: MeasuredRun, observed: float):
        term = Term(observed, op_kind(op, placement), run.name)
        kind = op["type"]
        if kind == "Forward":
            self._forward(op, placement, run, term)
        elif kind == "Transfer":
            if not self._transfer(op, placement, term):
                return None  # both ends on one device: no link to fit
        elif kind == "AllReduce":
            group = self.platform.group(placement[op["group"]])
            _add(term, allreduce_terms(group, float(op["nbytes"]), op.get("count", 1)),
                 self.classes)
        elif kind == "StreamWeights":
            self._stream(op, placement, term)
        else:
            return None  # Delay, Verify and bookkeeping spans carry no fitted term
        return term

    def _forward(self, op: dict, placement: dict, run: MeasuredRun, term: Term) -> None:
        spec = self._spec(run, op["model"])
        where = placement[op["device"]]
        members = self.platform.members(where)
        device = self.platform.device(members[0])
        term.device, term.tier = self.classes[device.name], device.memory
        term.passes = list(pass_terms(self.cost, spec, where, op))
        if len(members) > 1:  # the collectives the Forward as scheduled pays
            t = self.cost.terms(spec, where, tuple(op["layers"]), op.get("n_tokens", 1),
                                op.get("batch", 1), op.get("head"), op.get("collectives"))
            factor = self.cost.stack.on(device.backend).allreduce_bandwidth_factor
            _add(term, allreduce_terms(self.platform.group(where), t.message_bytes,
                                       t.collectives, factor), self.classes)

    def _transfer(self, op: dict, placement: dict, term: Term) -> bool:
        src = self.platform.members(placement[op["src"]])[0]
        dst = self.platform.members(placement[op["dst"]])[0]
        route = self.platform.route(src, dst)
        for link in route:
            _add(term, hop_terms(link, float(op["nbytes"])), self.classes)
        return bool(route)

    def _stream(self, op: dict, placement: dict, term: Term) -> None:
        where = placement[op["device"]]
        device = self.platform.device(self.platform.members(where)[0])
        tier = self.platform.tier(device.storage)
        _add(term, stream_terms(tier, device, float(op["nbytes"])), self.classes)


def stepped(op: dict) -> bool:
    """Whether the executor ran a measured Forward as more than one pass."""
    return len(span_passes(op)[0]) > 1


def pass_terms(cost: RooflineCost, spec, where: str, op: dict):
    """The device passes the executor ran for a measured Forward, as cost terms: a
    sampled Forward of k tokens is k passes (``stepped``), the first feeding
    ``n_fed`` positions per row, the others one (one pass through multi-token
    heads, when the span says ``multi_token``); a sampled or top-k head projects
    one position per row. Each pass is one model call and pays call_overhead_s,
    as the replay's rewrite (``executorwork.ExecutorWork``) charges it: one simulated
    Forward per pass. The split is the executor's own (``executors.passes``)."""
    widths, head_tokens = span_passes(op)
    n_fed, batch = widths[0], op.get("batch", 1)
    context = op.get("context_measured", op.get("context", 0)) or 0
    for i, width in enumerate(widths):
        t = cost.terms(spec, where, tuple(op["layers"]), width, batch, op.get("head"),
                       op.get("collectives"), head_tokens or None)
        ctx = context + (n_fed + i - 1 if i else 0)
        yield Pass(t.kernels, 1, t.flops(ctx), t.nbytes(ctx), width * batch,
                   t.peak_flops, t.tier_bytes_s, t.head_bytes, t.head_rows,
                   cost.platform.device(t.device).compute_padding(t.rows))


def initial_values(platform: Platform, terms: list[Term],
                   widths: Widths | None = None) -> dict[Param, float]:
    """The profile's value of every parameter the terms use; a device's multi-row
    factor per width in ``widths``, else per width of its profile's table."""
    if widths is None:
        widths = table_widths(platform, terms)
    return {p: current_value(platform, p) for p in params_of(terms, widths)}


def table_widths(platform: Platform, terms: list[Term]) -> Widths:
    """The widths each fitted device's multi-row factor table lists in the profile."""
    out = {}
    for t in terms:
        if t.passes and t.device not in out:
            factor = platform.device(t.device.split(",")[0]).multirow_memory_factor
            if isinstance(factor, dict):
                out[t.device] = tuple(sorted(factor))
    return out


def check_fit_terms(names) -> None:
    """ValueError naming the first --fit-terms entry that is not an optional term
    or that repeats one."""
    seen = set()
    for name in names:
        if name not in OPTIONAL_FIELDS + (BY_ROWS,):
            raise ValueError(f"--fit-terms names '{name}', which is not an optional "
                             f"term; use any of {', '.join(OPTIONAL_FIELDS + (BY_ROWS,))}")
        if name in seen:
            raise ValueError(f"--fit-terms names '{name}' twice; name each term once")
        seen.add(name)


def check_hold(names, fit_terms=()) -> None:
    """ValueError naming the first --hold entry that is no field a fit sets, that
    repeats one, or that --fit-terms asks to fit."""
    seen = set()
    for name in names:
        if name not in BOUNDS:
            raise ValueError(f"--hold names '{name}', which is no field a calibration "
                             f"fits; use any of {', '.join(BOUNDS)}")
        if name in seen:
            raise ValueError(f"--hold names '{name}' twice; name each field once")
        if name in fit_terms:
            raise ValueError(f"'{name}' is both held (--hold) and fitted (--fit-terms); "
                             "drop it from one of them")
        seen.add(name)


def fit(platform: Platform, terms: list[Term], *, fixed=frozenset(),
        fit_terms=frozenset(), pace_per_run: bool = False) -> Fit:
    """Least-squares fit of every parameter the terms use (``analyses.calibrate.costfit``);
    of the optional efficiency terms only those named in ``fit_terms``. Fitting a
    flash tier's request latency keeps its bandwidth (a sequential-read
    measurement), fitting a device's bandwidth cap keeps its tier's efficiency;
    ``multirow_by_rows`` fits the multi-row factor per measured width. Every
    run, and every operation kind in a run, weighs the same in the fit
    (``costfit.run_weights``); ``pace_per_run``
    fits each run its own pace besides (``costfit.Paces``)."""
    check_fit_terms(fit_terms)
    keep = set(fixed) | (set(OPTIONAL_FIELDS) - set(fit_terms))
    if "memory_bandwidth_gb_s" in fit_terms:
        keep.add("memory_efficiency")  # a cap and the efficiency scale the same bytes
    if "request_latency_s" in fit_terms:  # streams of one size cannot tell a per-request
        keep.update(Param("tier", t.name, "bandwidth_gb_s")  # time from a per-byte one:
                    for t in platform.memory_tiers  # the measured bandwidth is kept
                    if t.request_bytes is not None)
    widths = measured_widths(terms) if BY_ROWS in fit_terms else table_widths(platform, terms)
    return _fit(terms, initial_values(platform, terms, widths), frozenset(keep), widths,
                balance_runs=True, pace_per_run=pace_per_run)


def apply(platform: Platform, values: dict[Param, float], source: str) -> Platform:
    """A copy of the platform with fitted values and a source naming the fit."""

    def update(obj, kind: str):
        changes = {p.field: v for p, v in values.items()
                   if p.kind == kind and obj.name in p.names and not p.at}
        table = {p.at: v for p, v in values.items()
                 if p.kind == kind and obj.name in p.names and p.at}
        if table:  # a multi-row factor by rows
            changes["multirow_memory_factor"] = dict(sorted(table.items()))
        if not changes:
            return obj
        sources = dict(obj.sources)
        for name, v in changes.items():
            was = _shown(getattr(obj, name))
            sources[name] = f"{source}; was {was}" + (
                f" ({obj.sources[name]})" if name in obj.sources else "")
        return obj.model_copy(update={**changes, "sources": sources})

    return platform.model_copy(update={
        "devices": tuple(update(d, "device") for d in platform.devices),
        "memory_tiers": tuple(update(t, "tier") for t in platform.memory_tiers),
        "links": tuple(update(l, "link") for l in platform.links),
        "groups": tuple(update(g, "group") for g in platform.groups)})


def _shown(value) -> str:
    """A profile value as a calibrated source quotes what it was."""
    if value is None:
        return "unset"
    if isinstance(value, dict):  # a table by rows
        return "{" + ", ".join(f"{k}: {v:.4g}" for k, v in value.items()) + "}"
    return f"{value:.4g}"
