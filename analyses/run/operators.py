"""The per-operator table of a run: each kind of operation on each device or link,
with its count, time, FLOPs, bytes and the fraction of the hardware's peak it
reached (the higher of its compute and its memory or link fraction)."""

from __future__ import annotations

from collections import defaultdict

from policies.runs.breakdown import operation_of


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
    """Rows (operation, kind, device, count, time_s, flops, bytes, peak_fraction),
    the longest total time first. An operation is a span's name without its layer
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
        fractions = [x for x in (flops / (time_s * peak) if peak and time_s and flops
                                 else None,
                                 nbytes / (time_s * bandwidth) if bandwidth and time_s
                                 and nbytes else None) if x is not None]
        out.append({"operation": name, "kind": kind, "device": device, "count": count,
                    "time_s": time_s, "flops": flops, "bytes": nbytes,
                    "peak_fraction": max(fractions) if fractions else None})
    return sorted(out, key=lambda r: -r["time_s"])
