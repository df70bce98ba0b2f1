"""How well the shipped profiles predict what they were not fitted on, by source.

A source counts as fitted when something shipped was calibrated on it: a
platform whose field sources name one of its rows (``hetspec calibrate
--published`` writes the fitted rows' ids there), or a stack whose
``fitted_on`` list names the source (its id or url) or one of its rows. Every
other source is held out, whatever its ``role`` says (``role`` is the intent,
this is the fact; ``mismatched_roles`` lists where they differ). A regime is a
row's stack, device class and kind (``AR``, or ``speculative``). Errors are
simulated / published - 1 of the row's printed number (tokens/s or speedup).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import AR

TOKENS_GOAL = 0.25  # |error| of an absolute speed (tokens/s, ms/token) counted as "within"
SPEEDUP_GOAL = 0.15  # |error| of a speedup counted as "within"


def kind_of(row) -> str:
    return "AR" if row.policy == AR else "speculative"


def regime_of(row) -> tuple[str, str, str]:
    return (row.stack or "compiled", row.device_class or "unknown", kind_of(row))


def platform_source_texts(platforms) -> list[str]:
    """Every field source of the given platforms, as text."""
    texts = []
    for p in platforms:
        for group in (p.devices, p.memory_tiers, p.links, p.groups):
            for obj in group:
                texts += [str(v) for v in getattr(obj, "sources", {}).values()]
    return texts


def fitted_sources(rows, sources: dict, platform_texts: list[str],
                   stack_fits: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Source id -> what was fitted on it (platforms and stacks, comma-separated),
    for each source something shipped was calibrated on."""
    fitted: dict[str, list[str]] = {}

    def mark(sid: str, what: str) -> None:
        if what not in fitted.setdefault(sid, []):
            fitted[sid].append(what)

    for row in rows:
        if any(row.id in text for text in platform_texts):
            mark(row.source_id, f"platform {row.platform}")
    for stack, names in stack_fits.items():
        for row in rows:
            src = sources.get(row.source_id)
            keys = {row.id, row.source_id} | ({src.url, *src.aliases} if src else set())
            if keys & set(names):
                mark(row.source_id, f"stack {stack}")
    return {sid: ", ".join(whats) for sid, whats in fitted.items()}


@dataclass
class Summary:
    rows: int
    median_abs: float | None
    worst_abs: float | None
    worst_row: str | None
    tokens_rows: int
    tokens_within: int
    speedup_rows: int
    speedup_within: int
    flips: list[tuple[str, str]]

    def share(self, within: int, total: int) -> str:
        return "n/a" if not total else f"{within}/{total} ({within / total:.0%})"


def errors_of(rows, simulated: dict[str, float]) -> dict[str, float]:
    return {r.id: simulated[r.id] / r.published - 1 for r in rows}


def flips_within(rows, simulated: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs of rows sharing a ranking key (all of ``rows``) whose simulated order
    contradicts the published one."""
    flips = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if not set(a.rankings) & set(b.rankings) or a.measure != b.measure:
                continue
            if (a.published - b.published) * (simulated[a.id] - simulated[b.id]) < 0:
                flips.append((a.id, b.id))
    return flips


def summarise(rows, simulated: dict[str, float]) -> Summary:
    """Median and worst |error|, shares within the goals, ranking flips of ``rows``."""
    errs = errors_of(rows, simulated)
    absolute = {k: abs(v) for k, v in errs.items()}
    tokens = [r for r in rows if r.measure != "speedup"]  # absolute: tokens/s, ms/token
    speedups = [r for r in rows if r.measure == "speedup"]
    worst = max(absolute, key=absolute.get) if absolute else None
    return Summary(
        rows=len(rows),
        median_abs=float(np.median(list(absolute.values()))) if absolute else None,
        worst_abs=absolute[worst] if worst else None, worst_row=worst,
        tokens_rows=len(tokens),
        tokens_within=sum(absolute[r.id] <= TOKENS_GOAL for r in tokens),
        speedup_rows=len(speedups),
        speedup_within=sum(absolute[r.id] <= SPEEDUP_GOAL for r in speedups),
        flips=flips_within(rows, simulated))


def by_key(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out
