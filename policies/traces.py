"""Timelines and recorded runs as data, for the schedules' own metrics.

``recorded_rate`` reads how often an event held in a measured run's acceptance
trace (Mirror's reuse rate, SSD's cache hits, taken from a real run);
``intervals``, ``covered_s`` and ``overlap_s`` measure spans by operation label
(time a phase runs, time two phases run together).
"""

from __future__ import annotations

import json
from pathlib import Path

from policies.base import PolicyError


def recorded_rate(path: str | Path, event: str, field: str) -> float:
    """Share of a measured run's ``event`` lines (acceptance.jsonl) that held; a
    per-row line (``held`` a list) counts each row."""
    p = Path(path)
    if not p.is_file():
        raise PolicyError(f"{field}: {path} does not exist; pass the acceptance.jsonl "
                          "of a measured run")
    try:
        lines = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError:
        raise PolicyError(f"{field}: {path} is not JSON lines; pass the acceptance.jsonl "
                          "of a measured run") from None
    held = []
    for d in (d for d in lines if d.get("event") == event):
        h = d.get("held")
        held += [bool(x) for x in h] if isinstance(h, list) else [bool(h)]
    if not held:
        raise PolicyError(f"{field}: {path} records no '{event}' events; record a run "
                          "of the same schedule with the real executor")
    return sum(held) / len(held)


def intervals(spans, labels) -> list[tuple[float, float]]:
    """Sorted (start, end) of the spans an operation label produced (its compute,
    all-reduce and per-hop transfer spans)."""
    names = set(labels) | {f"{label} all-reduce" for label in labels}
    return sorted((s.start_s, s.end_s) for s in spans if s.name in names)


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def covered_s(spans: list[tuple[float, float]]) -> float:
    """Time during which at least one of the intervals runs."""
    return sum(b - a for a, b in merged(spans))


def overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time two sets of intervals run together (each merged first)."""
    a, b = merged(a), merged(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
