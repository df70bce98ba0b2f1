"""Why each schedule's fastest point spends its time where it does: the sentences
the report's Why sections and the command's summary read (no drawing package).

With one platform the Why is each schedule's fastest point in the grid; with
several, each platform has its own (``per_platform``): its schedules' fastest
points there, so a platform whose schedules all lose to another's still says why
its own winner wins on it."""

from __future__ import annotations

from analyses.compare.best import baseline_label, best_per_platform, by_speed
from analyses.compare.crossover import add_breakdown
from analyses.compare.sweep import PointResult
from policies.runs.breakdown import sentence


def explain(best: dict[str, PointResult], base: dict) -> dict[str, PointResult]:
    """``best`` with where its time went (``breakdown``) added to each policy's
    fastest point: its seeded run again, with the same outcomes (a sweep leaves it
    out of the rest)."""
    for r in best.values():
        add_breakdown(r, base)
    return best


def whys(best: dict[str, PointResult]) -> dict[str, str]:
    """policy -> the sentence saying where its fastest point's time goes, fastest
    first (the policies whose breakdown is known)."""
    return {p: sentence(best[p].point.label, best[p].metrics["breakdown"])
            for p in by_speed(best) if best[p].metrics.get("breakdown")}


def per_platform(results: list[PointResult], base: dict) -> dict[str, dict]:
    """platform -> policy -> its fastest point there, each explained, when the grid
    compares several platforms; {} when it runs on one."""
    found = best_per_platform(results, base)
    if len(found) < 2:
        return {}
    return {platform: explain(best, base) for platform, best in found.items()}


def platform_line(best: dict[str, PointResult]) -> str:
    """'fastest sd(gamma=7) at 250.1 tokens/s, 2.31x AR' on one platform."""
    if not best:
        return "no policy ran"
    top = best[by_speed(best)[0]]
    return (f"fastest {top.point.label} at {top.metrics['tokens_per_s']:.1f} tokens/s, "
            f"{top.metrics['speedup_vs_ar']:.2f}x {baseline_label(top)}")


def platform_summaries(results: list[PointResult], base: dict) -> dict[str, dict]:
    """Per compared platform (several only): its fastest point, its line and each
    schedule's Why there."""
    out = {}
    for platform, best in per_platform(results, base).items():
        top = best[by_speed(best)[0]] if best else None
        out[platform] = {"fastest": top.point.label if top else None,
                         "tokens_per_s": top.metrics["tokens_per_s"] if top else None,
                         "speedup_vs_ar": top.metrics["speedup_vs_ar"] if top else None,
                         "line": platform_line(best), "why": whys(best)}
    return out
