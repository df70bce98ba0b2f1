"""Flat span records and their Chrome trace-event (Perfetto) export."""

from __future__ import annotations

import json
from typing import NamedTuple

from hwprofiles.outputfiles import atomic_write_text, json_safe


class Span(NamedTuple):
    """One operation on one track: what ran, where, when, and what it moved."""

    name: str
    kind: str  # compute | collective | transfer | stream | delay
    device: str
    start_s: float
    end_s: float
    flops: float = 0.0
    nbytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def chrome_trace(spans, *, process: str = "hetspec", metadata: dict | None = None) -> dict:
    """Spans as a Chrome trace-event document: one thread per device/link."""
    tracks = sorted({s.device for s in spans})
    tid = {name: i + 1 for i, name in enumerate(tracks)}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
               "args": {"name": process}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid[t],
                "args": {"name": t}} for t in tracks]
    for s in spans:
        events.append({"ph": "X", "name": s.name, "cat": s.kind, "pid": 1,
                       "tid": tid[s.device], "ts": s.start_s * 1e6,
                       "dur": (s.end_s - s.start_s) * 1e6,
                       "args": {"flops": s.flops, "bytes": s.nbytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": metadata or {}}


def write_chrome_trace(path, spans, **kwargs) -> None:
    """Write the trace; a non-finite number (JSON has none) is written as null."""
    doc = chrome_trace(spans, **kwargs)
    try:
        text = json.dumps(doc, allow_nan=False)
    except ValueError:  # rare: walk the document only when it holds NaN or infinity
        text = json.dumps(json_safe(doc), allow_nan=False)
    atomic_write_text(path, text)
