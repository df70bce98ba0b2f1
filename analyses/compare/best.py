"""The fastest point of each schedule in a comparison, and what its speedup is
measured against: the data the report's tables and figures and the command's
notes read (no drawing package)."""

from __future__ import annotations

from analyses.compare.sweep import PointResult
from policies import entry
from policies.base import AR, baseline_of


def best_per_policy(results: list[PointResult]) -> dict[str, PointResult]:
    """The fastest successful point of each policy, in first-seen policy order."""
    best: dict[str, PointResult] = {}
    for r in results:
        if r.metrics is None:
            continue
        cur = best.get(r.point.policy)
        if cur is None or r.metrics["tokens_per_s"] > cur.metrics["tokens_per_s"]:
            best[r.point.policy] = r
    return best


def by_speed(best: dict[str, PointResult]) -> list[str]:
    """Policies fastest first: the order of the summary table and every bar chart."""
    return sorted(best, key=lambda p: -best[p].metrics["tokens_per_s"])


def baseline_name(result: PointResult) -> str:
    """The run a point's speedup is measured against (ar, ar_stream, AR through
    PPSD's stages, ...)."""
    fields = entry(result.point.policy).params.model_fields
    params = {k: v for k, v in result.point.sets if k in fields}
    try:
        found = baseline_of(result.point.policy, params)
    except ValueError:
        return "AR"
    return "itself" if found is None else found[0]


def baseline_label(result: PointResult) -> str:
    """What a speedup is over, in words: AR, or the streaming or pipelined AR a
    schedule is measured against (ar_stream, AR through PPSD's stages)."""
    name = baseline_name(result)
    words = entry(result.point.policy).baseline_words  # where not plain AR
    if name == AR and words:
        return words
    return {AR: "AR", "itself": "AR"}.get(name, name)


def scenario_of(result: PointResult, base: dict) -> tuple[str, int]:
    """(platform, batch) a point runs at: its own settings, else the base's."""
    sets = dict(result.point.sets)
    return (str(sets.get("platform", base["platform"])), int(sets.get("batch",
                                                                       base.get("batch", 1))))


def best_per_scenario(results: list[PointResult], base: dict) -> dict[tuple, dict]:
    """(platform, batch) -> policy -> its fastest point there (or, where none ran,
    its first point, whose error says why)."""
    out: dict[tuple, dict[str, PointResult]] = {}
    for r in results:
        mine = out.setdefault(scenario_of(r, base), {})
        cur = mine.get(r.point.policy)
        if cur is None or (r.metrics is not None and (
                cur.metrics is None or r.metrics["tokens_per_s"] > cur.metrics["tokens_per_s"])):
            mine[r.point.policy] = r
    return out


def best_per_platform(results: list[PointResult], base: dict) -> dict[str, dict]:
    """platform -> policy -> its fastest point on that platform (over every batch
    run there), platforms in the grid's order; a platform where nothing ran maps
    to an empty dict."""
    by_platform: dict[str, list[PointResult]] = {}
    for r in results:
        by_platform.setdefault(scenario_of(r, base)[0], []).append(r)
    return {p: best_per_policy(rs) for p, rs in by_platform.items()}


def fastest(results: list[PointResult]) -> PointResult | None:
    best = best_per_policy(results)
    return max(best.values(), key=lambda r: r.metrics["tokens_per_s"]) if best else None


def skipped_policies(results: list[PointResult]) -> dict[str, str]:
    """Policies none of whose points ran, with the first reason given."""
    ran = {r.point.policy for r in results if r.metrics is not None}
    out: dict[str, str] = {}
    for r in results:
        if r.point.policy not in ran and r.point.policy not in out:
            out[r.point.policy] = r.error or "no result"
    return out
