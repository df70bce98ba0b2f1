"""Where a run's time goes: the critical path through its spans, by cost, and
the per-operator table (``operator_table``).

One function for both runtimes: the simulator's spans and a measured run's
(``MeasuredSpan.as_span``) have the same shape. Spans carry no dependencies, so the
critical path is rebuilt backwards from the end of decoding: at each instant the
span that finished last before it is the one the work after it waited for; a
stretch no span covers is a wait. The chain covers the decoding window exactly,
so the costs sum to the decoding time, and per output token to the time per
token. What runs off the chain (a draft under the target's layers) is *hidden*.

Costs: ``target`` (the target's own layers), ``draft`` (draft passes, early
exits and windows), ``verify`` (target passes that score drafted tokens),
``collective`` (all-reduce, all-to-all), ``transfer`` (messages on links),
``stream`` (weights read from flash), ``wait`` (delays, and gaps the chain
crosses).

The per-operator table tabulates the same spans by operation instead of by cost:
each kind of operation on each device or link, with its count, time, FLOPs, bytes
and the fraction of the hardware's peak it reached (the higher of its compute and
its memory or link fraction); an operation is named as the breakdown names its
phases (``operation_of``).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

NUMBERS = re.compile(r"\s*\d+(-\d+)?$")  # 'stream layers 12-12' is one phase per layer
COSTS = ("target", "draft", "verify", "collective", "transfer", "stream", "wait")
EPS_S = 1e-12


def cost_of(span) -> str:
    """The cost a span's time counts as, from its kind and its name."""
    if span.kind in ("collective", "transfer", "stream"):
        return span.kind
    if span.kind == "delay":
        return "wait"
    name = span.name.lower()
    if "verif" in name:
        return "verify"
    if "draft" in name or "exit" in name or "window" in name or "proposal" in name:
        return "draft"
    return "target"


def operation_of(name: str) -> str:
    """A span's operation: its name without a bracketed layer range or trailing
    layer numbers ('stream layers 12-12' -> 'stream layers')."""
    base = name.split("[")[0].strip()
    return NUMBERS.sub("", base) or base or name


def phase_of(span) -> str:
    """The schedule's phase a span belongs to (an all-reduce inside a draft step
    is the draft's): its operation without a trailing collective."""
    name = span.name.split("[")[0].strip()
    for suffix in (" all-reduce", " all-to-all", " all-gather"):
        name = name.removesuffix(suffix)
    return NUMBERS.sub("", name) or name


def critical_path(spans, start_s: float, end_s: float) -> list[tuple[object, float, float]]:
    """(span or None for a wait, from, to) pieces covering [start_s, end_s], latest
    first."""
    timed = sorted((s for s in spans if s.end_s > s.start_s and s.end_s > start_s
                    and s.start_s < end_s), key=lambda s: (s.end_s, -s.start_s))
    ends = [s.end_s for s in timed]
    pieces, now = [], end_s
    while now > start_s + EPS_S:
        i = bisect.bisect_right(ends, now + EPS_S) - 1
        while i >= 0 and timed[i].start_s >= now - EPS_S:
            i -= 1  # a span that starts where we stand ran after it, not before
        if i < 0:
            pieces.append((None, start_s, now))
            break
        span = timed[i]
        finish = min(span.end_s, now)
        if finish < now - EPS_S:
            pieces.append((None, finish, now))
        begin = max(span.start_s, start_s)
        pieces.append((span, begin, finish))
        now = begin
    return pieces


def busy_s(intervals) -> float:
    """Time covered by at least one of the (start, end) ``intervals`` (their union)."""
    total, last = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > last:
            total += hi - max(lo, last)
            last = hi
    return total


def breakdown(spans, *, tokens: float, steps: int, start_s: float, end_s: float) -> dict:
    """Where the decoding window's time goes on the critical path: seconds per step
    and per output token of a sequence (``tokens``: one sequence's tokens) by cost,
    the shares, the phases on the path and what they hide off it, and each device's
    utilisation over the window."""
    window_s = end_s - start_s
    if window_s <= 0 or not tokens or not steps:
        return {}
    phases: dict[str, str] = {}  # span name -> phase (names repeat every step)
    stems: dict[str, str] = {}

    def phase(span) -> str:
        if span.name not in phases:
            phases[span.name] = phase_of(span)
            stems[span.name] = operation_of(span.name)
        return phases[span.name]

    on_path = defaultdict(float)
    phase_on_path = defaultdict(float)
    top = defaultdict(lambda: defaultdict(float))  # cost -> (name, device) -> seconds
    for span, begin, finish in critical_path(spans, start_s, end_s):
        cost = "wait" if span is None else cost_of(span)
        on_path[cost] += finish - begin
        if span is not None:
            phase_on_path[phase(span)] += finish - begin
            top[cost][(stems[span.name], span.device)] += finish - begin
    phase_busy = defaultdict(float)
    by_device = defaultdict(list)
    for s in spans:
        lo, hi = max(s.start_s, start_s), min(s.end_s, end_s)
        if hi > lo:
            phase_busy[phase(s)] += hi - lo
            by_device[s.device].append((lo, hi))
    hidden = {p: busy - phase_on_path.get(p, 0.0) for p, busy in phase_busy.items()}
    return {
        "per_step_s": {c: on_path[c] / steps for c in COSTS if on_path[c] > 0},
        "largest": {c: {"name": name, "device": device, "share": t / on_path[c]}
                    for c, parts in top.items()
                    for (name, device), t in [max(parts.items(), key=lambda kv: kv[1])]},
        "per_token_s": {c: on_path[c] / tokens for c in COSTS if on_path[c] > 0},
        "share": {c: on_path[c] / window_s for c in COSTS if on_path[c] > 0},
        "phases_per_token_s": {p: t / tokens for p, t in sorted(
            phase_on_path.items(), key=lambda kv: -kv[1])},
        "hidden_per_token_s": {p: t / tokens for p, t in sorted(
            hidden.items(), key=lambda kv: -kv[1]) if t > 0.01 * window_s},
        "utilisation": {d: busy_s(v) / window_s for d, v in sorted(by_device.items())},
    }


LABELS = {"target": "target compute", "draft": "draft compute", "verify": "verify",
          "collective": "collectives", "transfer": "transfers", "stream": "flash streams",
          "wait": "waits"}


def sentence(policy: str, parts: dict, operators: list[dict] | None = None) -> str:
    """One sentence naming a run's dominant cost and where it comes from (with
    ``operators``, the rows of ``operator_table``: whether that operation is
    compute-bound), and the largest phase the run hides under other work."""
    if not parts.get("share"):
        return f"{policy}: no spans recorded"
    cost, share = max(parts["share"].items(), key=lambda kv: kv[1])
    text = f"{policy}: {share:.0%} of each token's time is {LABELS[cost]}"
    largest = parts.get("largest", {}).get(cost)
    if largest and cost != "wait":
        text += (f", {largest['share']:.0%} of it '{largest['name']}' on "
                 f"{largest['device']}")
        row = next((r for r in operators or () if r["operation"] == largest["name"]
                    and r["device"] == largest["device"]), None)
        if row is not None and row.get("bound") == "compute":
            text += (f", compute-bound: its FLOPs at the device's peak take "
                     f"{row['compute_to_memory']:.2g}x as long as its bytes at full "
                     f"bandwidth")
    hidden = parts.get("hidden_per_token_s", {})
    if hidden:
        phase, t = next(iter(hidden.items()))
        text += f"; it hides {t * 1e3:.3g} ms of '{phase}' a token under other work"
    return text


def _capacity(platform, where: str, dtype: str) -> tuple[float, float]:
    """(peak FLOP/s, bandwidth in B/s) of a device, a group's member (a group's
    spans count one member's share, as the cost model does), a link or a tier."""
    if where.startswith("link:"):
        name = where[5:]
        link = next((l for l in platform.links if l.name == name), None)
        return 0.0, (link.bandwidth_gb_s * 1e9 if link else 0.0)
    if any(t.name == where for t in platform.memory_tiers):
        return 0.0, platform.tier(where).bandwidth_gb_s * 1e9
    try:
        members = platform.members(where)
    except (KeyError, ValueError):
        return 0.0, 0.0
    peak = bandwidth = 0.0
    for name in members:
        device = platform.device(name)
        peak += device.peak_flops.get(dtype, max(device.peak_flops.values()))
        bandwidth += platform.tier(device.memory).bandwidth_gb_s * 1e9
    return peak / len(members), bandwidth / len(members)


def operator_table(spans, platform, dtype: str) -> list[dict]:
    """Rows (operation, kind, device, count, time_s, flops, bytes, peak_fraction,
    bound, compute_to_memory), the longest total time first. An operation is a span's name without its layer
    numbers; ``peak_fraction`` is None where the hardware gives no peak or the
    span records no work (a collective's time is its latency and transfer)."""
    rows = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for s in spans:
        key = (operation_of(s.name), s.kind, s.device)
        row = rows[key]
        row[0] += 1
        row[1] += s.end_s - s.start_s
        row[2] += s.flops
        row[3] += s.nbytes
    out = []
    for (name, kind, device), (count, time_s, flops, nbytes) in rows.items():
        peak, bandwidth = _capacity(platform, device, dtype)
        compute_s = flops / peak if peak and flops else None  # at the peak FLOP/s
        memory_s = nbytes / bandwidth if bandwidth and nbytes else None  # at full bandwidth
        fractions = [x for x in (flops / (time_s * peak) if peak and time_s and flops
                                 else None,
                                 nbytes / (time_s * bandwidth) if bandwidth and time_s
                                 and nbytes else None) if x is not None]
        ratio = compute_s / memory_s if compute_s and memory_s else None
        bound = (None if compute_s is None and memory_s is None else
                 "compute" if memory_s is None or (compute_s or 0.0) > memory_s else "memory")
        out.append({"operation": name, "kind": kind, "device": device, "count": count,
                    "time_s": time_s, "flops": flops, "bytes": nbytes,
                    "peak_fraction": max(fractions) if fractions else None,
                    # which roofline it sits under: its FLOPs at peak against its bytes
                    # at full bandwidth (the ridge is where the two take as long)
                    "bound": bound, "compute_to_memory": ratio})
    return sorted(out, key=lambda r: -r["time_s"])
