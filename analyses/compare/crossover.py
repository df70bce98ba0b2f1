"""Where speculation stops paying: over a swept batch (``--sweep batch=1,2,4,...``),
the batch at which each schedule's speedup over its baseline falls below 1 for
good, and what grows to make it so (the data the command's summary, its JSON and
the report read; no drawing package).

Per platform, each schedule is taken at its fastest point at each batch (its best
setting there, as the comparison tuned it). A schedule *stops paying* at the
smallest swept batch from which its speedup stays below 1 at every larger swept
batch; between that batch and the one before it, where it still paid, the batch
at which the speedup crosses 1 is estimated by interpolating the speedup linearly
in log(batch). What grows is read from the two runs' breakdowns: the time per
token of each kind of work (verify, draft compute, collectives, ...) at both
batches, beside the baseline's time per token, which is what the speedup
divides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyses.compare.best import baseline_label, baseline_name, best_per_scenario
from analyses.compare.sweep import PointResult, point_config
from analyses.run.api import metrics_of, run_schedule
from policies.runs.breakdown import LABELS
from policies.runs.metrics import stops_paying


@dataclass(frozen=True)
class Crossover:
    """One schedule's speedup against batch on one platform."""

    platform: str
    policy: str
    baseline: str
    batches: tuple[int, ...]
    speedups: tuple[float, ...]
    labels: tuple[str, ...]  # the point (its best setting) at each batch
    stops_at: int | None  # None: it pays at the largest swept batch
    pays_until: int | None  # the batch before stops_at (None: it pays at none)
    estimate: float | None  # the interpolated batch where the speedup is 1
    # kind of work -> (seconds per token at pays_until, at stops_at)
    growth: dict[str, tuple[float, float]] = field(default_factory=dict)
    baseline_per_token: tuple[float, float] | None = None

    @property
    def sentence(self) -> str:
        first, last = self.batches[0], self.batches[-1]
        where = f"on {self.platform}, {self.policy}"
        if self.stops_at is None:
            return (f"{where} pays at every swept batch ({_x(self.speedups[0])} at batch "
                    f"{first}, {_x(self.speedups[-1])} at batch {last} against "
                    f"{self.baseline})")
        if self.pays_until is None:
            return (f"{where} pays at no swept batch: {_x(self.speedups[0])} against "
                    f"{self.baseline} at batch {first}, {_x(self.speedups[-1])} at {last}")
        i = self.batches.index(self.stops_at)
        text = (f"{where} stops paying between batch {self.pays_until} "
                f"({_x(self.speedups[i - 1])}) and {self.stops_at} "
                f"({_x(self.speedups[i])} against {self.baseline}), at about batch "
                f"{self.estimate:.3g}")
        return text + self._why()

    def _why(self) -> str:
        if not self.growth or self.baseline_per_token is None:
            return ""
        grown = sorted(self.growth.items(), key=lambda kv: kv[1][1] - kv[1][0],
                       reverse=True)
        parts = [f"{LABELS.get(kind, kind)} {_ms(before)} -> {_ms(after)} ms"
                 for kind, (before, after) in grown[:2]]
        before, after = self.baseline_per_token
        return (f": from batch {self.pays_until} to {self.stops_at} its time per token "
                f"grows most in {' and '.join(parts)}, while {self.baseline}'s grows "
                f"{_ms(before)} -> {_ms(after)} ms")

    def as_dict(self) -> dict:
        return {"platform": self.platform, "policy": self.policy,
                "baseline": self.baseline, "batches": list(self.batches),
                "speedups": list(self.speedups), "points": list(self.labels),
                "stops_paying_at": self.stops_at, "pays_until": self.pays_until,
                "crossover_batch": self.estimate,
                "per_token_s": {k: {"before": b, "after": a}
                                for k, (b, a) in self.growth.items()},
                "baseline_per_token_s": (None if self.baseline_per_token is None else
                                         dict(zip(("before", "after"),
                                                  self.baseline_per_token))),
                "sentence": self.sentence}


def _x(speedup: float) -> str:
    return f"{speedup:.2f}x"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _per_token(result: PointResult) -> dict[str, float]:
    return dict((result.metrics.get("breakdown") or {}).get("per_token_s", {}))


def _baseline_per_token(result: PointResult, batch: int) -> float:
    """The baseline's seconds per token of one sequence: the point's tokens/s over
    its speedup is the baseline's tokens/s over the whole batch."""
    m = result.metrics
    return batch * m["speedup_vs_ar"] / m["tokens_per_s"]


def add_breakdown(result: PointResult, base: dict) -> PointResult:
    """The point with where its time went (``breakdown``) in its metrics: its seeded
    run again, with the same outcomes (a sweep leaves it out of the points)."""
    if "breakdown" not in result.metrics:
        config = point_config(result.point, base)
        result.metrics["breakdown"] = metrics_of(config, run_schedule(config))["breakdown"]
    return result


def crossovers(results: list[PointResult], base: dict) -> list[Crossover]:
    """Per platform and schedule, its speedup against batch and where it stops
    paying, each schedule at its fastest point at each batch
    (``best.best_per_scenario``); the two points around a crossover are run again
    for their breakdowns (``add_breakdown``). Platforms with fewer than two swept
    batches, and schedules that are their own baseline (AR), have none."""
    best = best_per_scenario(results, base)
    by_platform: dict[str, dict[int, dict[str, PointResult]]] = {}
    for (platform, batch), by_policy in best.items():
        by_platform.setdefault(platform, {})[batch] = by_policy
    out = []
    for platform, by_batch in by_platform.items():
        if len(by_batch) < 2:
            continue
        policies = list(dict.fromkeys(p for by in by_batch.values() for p in by))
        for policy in policies:
            runs = [(b, by_batch[b][policy]) for b in sorted(by_batch)
                    if policy in by_batch[b] and by_batch[b][policy].metrics is not None]
            if len(runs) < 2 or baseline_name(runs[0][1]) == "itself":
                continue
            batches = tuple(b for b, _ in runs)
            speedups = tuple(float(r.metrics["speedup_vs_ar"]) for _, r in runs)
            stops, until, estimate = stops_paying(batches, speedups)
            growth, baseline = {}, None
            if until is not None:
                before, after = (add_breakdown(by_batch[b][policy], base)
                                 for b in (until, stops))
                was, now = _per_token(before), _per_token(after)
                growth = {k: (was.get(k, 0.0), now.get(k, 0.0)) for k in {**was, **now}}
                baseline = (_baseline_per_token(before, until),
                            _baseline_per_token(after, stops))
            out.append(Crossover(platform, policy, baseline_label(runs[0][1]), batches,
                                 speedups, tuple(r.point.label for _, r in runs), stops,
                                 until, estimate, growth, baseline))
    return out

