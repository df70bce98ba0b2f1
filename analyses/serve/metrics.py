"""A serving run's figures: per-request latencies, throughput, goodput, SLOs.

Per request (engines' and serving benchmarks' definitions):

* queueing delay: admission (its first prefill chunk scheduled) less arrival;
* TTFT: its first token less its arrival;
* TPOT: (finish - first token) / (output tokens - 1), the time per output token
  after the first (requests of one output token have none);
* end-to-end latency: finish less arrival.

Of the run: p50/p90/p99 and mean of each; throughput (output tokens per second
from the first arrival to the last finish); token goodput (output tokens per
second of the requests that met the SLO: DistServe's goodput counts requests,
SmartSpec's tokens; both are here); SLO attainment (the share of requests whose
TTFT and TPOT both meet the SLO) and whether the SLO holds (attainment at least
the stated percentile); preemptions; batch size and KV use over time; and
Little's law: the mean number of requests in the system, integrated over the
run's timeline, against arrival rate x mean latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analyses.serve.engine import Served

PERCENTILES = (50, 90, 99)
TIMELINE_POINTS = 400  # steps kept in --json's timeline (evenly spaced)


@dataclass(frozen=True)
class SLO:
    """TTFT and TPOT bounds in seconds (None: unbounded) and the share of requests
    that must meet both, in percent."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    percentile: float = 90.0

    def met(self, ttft: float, tpot: float | None) -> bool:
        return ((self.ttft_s is None or ttft <= self.ttft_s)
                and (self.tpot_s is None or tpot is None or tpot <= self.tpot_s))

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def words(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT <= {self.ttft_s * 1e3:g} ms")
        if self.tpot_s is not None:
            parts.append(f"TPOT <= {self.tpot_s * 1e3:g} ms")
        return " and ".join(parts) + f" for {self.percentile:g}% of requests"


def parse_slo(text: str | None, percentile: float = 90.0) -> SLO:
    """'ttft=0.5,tpot=0.05' (seconds; '500ms' and '50ms' read as milliseconds) as
    an SLO; a bound in the wrong unit is refused as one: a TTFT over a minute, a TPOT over a second."""
    if not 0 < percentile <= 100:
        raise ValueError(f"--slo-percentile {percentile} is outside (0, 100]")
    if text is None:
        return SLO(percentile=percentile)
    bounds = {}
    for part in text.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in ("ttft", "tpot"):
            raise ValueError(f"--slo expects ttft=SECONDS,tpot=SECONDS, got '{part}'; "
                             "write e.g. --slo ttft=0.5,tpot=0.05")
        if f"{key}_s" in bounds:
            raise ValueError(f"--slo gives {key} twice; keep one")
        scale = 1.0
        if value.endswith("ms"):
            value, scale = value[:-2], 1e-3
        elif value.endswith("s"):
            value = value[:-1]
        try:
            seconds = float(value) * scale
        except ValueError:
            raise ValueError(f"--slo {key}={value} is not a number of seconds") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"--slo {key} must be a positive number of seconds")
        top = {"ttft": 60.0, "tpot": 1.0}[key]
        if seconds > top:
            raise ValueError(f"--slo {key}={seconds:g} s is over {top:g} s, longer than "
                             f"any serving SLO; is it in milliseconds? write "
                             f"{key}={seconds:g}ms")
        bounds[f"{key}_s"] = seconds
    return SLO(percentile=percentile, **bounds)


def _summary(values: list[float]) -> dict:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()),
            **{f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}}


def request_rows(served: Served) -> list[dict]:
    rows = []
    for r in served.requests:
        q = r.request
        tpot = ((r.finish_s - r.first_token_s) / (q.output_tokens - 1)
                if q.output_tokens > 1 else None)
        rows.append({"arrival_s": q.arrival_s, "prompt_tokens": q.prompt_tokens,
                     "output_tokens": q.output_tokens, "alpha": q.alpha,
                     "queue_s": r.admitted_s - q.arrival_s,
                     "ttft_s": r.first_token_s - q.arrival_s, "tpot_s": tpot,
                     "e2e_s": r.finish_s - q.arrival_s, "preemptions": r.preemptions})
    return rows


def littles_law(served: Served) -> dict:
    """L, the time-averaged number of requests in the system (integrated from
    arrivals and finishes over [first arrival, last finish]), against lambda x W."""
    events = []
    for r in served.requests:
        events.append((r.request.arrival_s, 1))
        events.append((r.finish_s, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    start, end = events[0][0], max(e[0] for e in events)
    area, n, last = 0.0, 0, start
    for t, d in events:
        area += n * (t - last)
        n, last = n + d, t
    span = end - start
    waits = [r.finish_s - r.request.arrival_s for r in served.requests]
    lam = len(waits) / span if span > 0 else math.inf
    return {"in_system_mean": area / span if span > 0 else math.nan,
            "arrival_rate": lam, "latency_mean_s": float(np.mean(waits)),
            "lambda_w": lam * float(np.mean(waits)) if span > 0 else math.nan}


def timeline(served: Served) -> dict:
    """Batch size, prefill tokens, KV use and queue length per step, thinned to at
    most TIMELINE_POINTS steps."""
    steps = served.steps
    keep = range(0, len(steps), max(1, math.ceil(len(steps) / TIMELINE_POINTS)))
    return {"time_s": [steps[i].start_s for i in keep],
            "batch": [steps[i].decoding for i in keep],
            "prefill_tokens": [steps[i].prefill_tokens for i in keep],
            "kv_used": [steps[i].kv_used / served.kv_capacity for i in keep],
            "waiting": [steps[i].waiting for i in keep],
            "mode": [steps[i].mode for i in keep]}


def serve_metrics(served: Served, slo: SLO) -> dict:
    """A simulated serving run's figures: its requests' and its engine's."""
    return {**request_metrics(served, slo), **engine_metrics(served)}


def request_metrics(served: Served, slo: SLO) -> dict:
    """What the requests saw (a served workload measured for real has these alone):
    latency summaries, throughput, the SLO, preemptions and Little's law."""
    rows = request_rows(served)
    first = min(r["arrival_s"] for r in rows)
    span = served.end_s - first
    tokens = sum(r["output_tokens"] for r in rows)
    met = [slo.met(r["ttft_s"], r["tpot_s"]) for r in rows]
    good_tokens = sum(r["output_tokens"] for r, ok in zip(rows, met) if ok)
    attainment = sum(met) / len(rows)
    return {
        "requests": len(rows),
        "duration_s": span,
        "offered_rate": (len(rows) - 1) / (rows[-1]["arrival_s"] - first)
        if len(rows) > 1 and rows[-1]["arrival_s"] > first else None,
        "throughput_tokens_per_s": tokens / span if span > 0 else None,
        "throughput_requests_per_s": len(rows) / span if span > 0 else None,
        "ttft_s": _summary([r["ttft_s"] for r in rows]),
        "tpot_s": _summary([r["tpot_s"] for r in rows if r["tpot_s"] is not None]),
        "e2e_s": _summary([r["e2e_s"] for r in rows]),
        "queue_s": _summary([r["queue_s"] for r in rows]),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "percentile": slo.percentile,
                "attainment": attainment if slo.given else None,
                "holds": attainment * 100 >= slo.percentile - 1e-9 if slo.given else None,
                "goodput_requests_per_s": sum(met) / span if slo.given and span > 0
                else None,
                "goodput_tokens_per_s": good_tokens / span if slo.given and span > 0
                else None},
        "preemptions": sum(r["preemptions"] for r in rows),
        "littles_law": littles_law(served),
    }


def engine_metrics(served: Served) -> dict:
    """What the engine did: its steps, how busy it was, batch sizes, KV use and, with
    gamma=auto, its draft lengths."""
    steps = served.steps
    span = served.end_s - min(r.request.arrival_s for r in served.requests)
    busy = sum(s.seconds for s in steps)
    decode_steps = [s for s in steps if s.decoding]
    return {
        "steps": len(steps),
        "busy_share": busy / span if span > 0 else None,
        "batch_mean": (sum(s.decoding * s.seconds for s in decode_steps)
                       / sum(s.seconds for s in decode_steps)) if decode_steps else 0.0,
        "batch_max": max((s.decoding for s in steps), default=0),
        "kv_capacity_positions": served.kv_capacity,
        "kv_peak_share": max((s.kv_used for s in steps), default=0) / served.kv_capacity,
        "mode_steps": dict(served.mode_steps),
        "mode_switches": served.switches,
    }
