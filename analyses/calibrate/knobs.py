"""Knobs of the published fit: which profile fields it scales, and how.

A knob is a multiplicative factor on one field of the objects it ties together
(all HBM tiers of one spec, all devices of one kind, all collective groups), so
eight identical GPUs get one efficiency; ``FIELD@NAME`` in ``--fit-fields`` is a
knob on one object alone (``analyses.calibrate.published`` fits them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analyses.calibrate.costfit import BOUNDS
from hwprofiles import Platform

DEFAULT_FIELDS = ("memory_efficiency", "launch_overhead_s", "alpha_s")
FIELD_KINDS = {"memory_efficiency": "tier", "compute_efficiency": "device",
               "launch_overhead_s": "device", "call_overhead_s": "device",
               "alpha_s": "group", "bandwidth_gb_s": "group", "latency_s": "link",
               # the optional efficiency terms (hwprofiles.schema's module docstring)
               "memory_half_bytes": "device", "compute_half_flops": "device",
               "memory_bandwidth_gb_s": "device", "request_latency_s": "tier",
               "roofline_exponent": "device"}
# Where a field that is off (0) starts when fitted: a value at which it matters, so
# the fit can tell whether the rows want it (a factor cannot move a zero).
OFF_STARTS = {"call_overhead_s": 1e-5, "memory_half_bytes": 1e6,
              "compute_half_flops": 1e9, "request_latency_s": 1e-4,
              "launch_overhead_s": 1e-6, "alpha_s": 1e-6, "latency_s": 1e-6}


@dataclass(frozen=True)
class Knob:
    """A multiplicative factor on ``field`` of the objects named in ``names``."""

    kind: str  # tier | device | group | link
    names: tuple[str, ...]
    field: str
    start: float | None = None  # where the fit starts (``field@name=V``); None: the profile's

    @property
    def label(self) -> str:
        return f"{self.kind} {','.join(self.names)}.{self.field}"


def objects_of(platform: Platform, kind: str):
    return {"tier": platform.memory_tiers, "device": platform.devices,
            "group": [g for g in platform.groups if g.size > 1],
            "link": platform.links}[kind]


def _tie_key(obj, kind: str, field: str):
    """Objects with equal keys are one knob: identical hardware cannot be told
    apart by end-to-end speeds. Groups are tied whatever their size: one knob
    scales every all-reduce latency of the platform."""
    if kind == "tier":
        return (obj.kind, obj.capacity_bytes, obj.bandwidth_gb_s)
    if kind == "device":
        return (obj.kind, tuple(sorted(obj.peak_flops.items())))
    if kind == "link":
        return (obj.latency_s, obj.bandwidth_gb_s)
    return ("groups",)


def _parse_field(spec: str) -> tuple[str, str | None, float | None]:
    """``field``, ``field@name`` (that one object's ``field``) or ``field@name=V``
    (started at V: an efficiency whose term does not bind at the profile's value,
    e.g. compute on a memory-bound pass, has no slope there to move it)."""
    head, _, start = spec.partition("=")
    field, _, name = head.partition("@")
    if field not in FIELD_KINDS:
        raise ValueError(f"--fit-fields: '{field}' is not a field the published fit "
                         f"can scale; choose from {', '.join(FIELD_KINDS)}")
    if start and not name:
        raise ValueError(f"--fit-fields: '{spec}' gives a start without an object; "
                         f"write {field}@NAME={start}")
    lo, hi = BOUNDS[field]
    try:
        value = float(start) if start else None
    except ValueError:
        value = math.nan
    if value is not None and not lo < value < hi:
        raise ValueError(f"--fit-fields: the start in '{spec}' is not a number inside "
                         f"({lo:g}, {hi:g}); give one, e.g. {field}@{name}={(lo + hi) / 2:g}")
    return field, (name or None), value


def knobs_of(platform: Platform, fields=DEFAULT_FIELDS) -> list[Knob]:
    """One knob per field and group of tied objects; ``field@name`` is a knob on
    that object alone (a device whose software differs from its identical
    neighbours', e.g. a separate draft process), left out of the field's tied knob."""
    parsed = [_parse_field(f) for f in fields]
    alone = {(f, n) for f, n, _ in parsed if n is not None}
    knobs = []
    for field, name, start in parsed:
        kind = FIELD_KINDS[field]
        known = [o.name for o in objects_of(platform, kind)]
        if name is not None:
            if name not in known:
                raise ValueError(f"--fit-fields: '{field}@{name}' names no {kind} of "
                                 f"{platform.name}; choose from {', '.join(known)}")
            knobs.append(Knob(kind, (name,), field, start))
            continue
        groups: dict = {}
        for obj in objects_of(platform, kind):
            if (field, obj.name) not in alone:
                groups.setdefault(_tie_key(obj, kind, field), []).append(obj.name)
        knobs += [Knob(kind, tuple(names), field) for names in groups.values()]
    return knobs


def _start(platform: Platform, knob: Knob) -> dict[str, float]:
    """Each tied object's starting value: the knob's given start, its own, a field that is off (0) at
    ``OFF_STARTS``, a device's unset bandwidth cap at 90% of its memory tier's
    bandwidth (at 100% the cap is not binding and its slope upward is zero)."""
    out = {}
    for o in objects_of(platform, knob.kind):
        if o.name not in knob.names:
            continue
        value = getattr(o, knob.field) if knob.start is None else knob.start
        if value is None and knob.field == "memory_bandwidth_gb_s":
            value = 0.9 * platform.tier(o.memory).bandwidth_gb_s
        if not value:
            value = OFF_STARTS.get(knob.field, BOUNDS[knob.field][0])
        out[o.name] = float(value)
    return out


def log_bounds(platform: Platform, knob: Knob) -> tuple[float, float]:
    lo, hi = BOUNDS[knob.field]
    starts = _start(platform, knob).values()
    return (max(math.log(lo / v) for v in starts), min(math.log(hi / v) for v in starts))


def scaled(platform: Platform, knobs: list[Knob], x) -> Platform:
    """``platform`` with each knob's field multiplied by exp(x[k])."""
    changes: dict[tuple[str, str], dict[str, float]] = {}
    for knob, xk in zip(knobs, x):
        for name, start in _start(platform, knob).items():
            changes.setdefault((knob.kind, name), {})[knob.field] = start * math.exp(xk)

    def update(obj, kind):
        change = changes.get((kind, obj.name))
        return obj.model_copy(update=change) if change else obj

    return platform.model_copy(update={
        "devices": tuple(update(d, "device") for d in platform.devices),
        "memory_tiers": tuple(update(t, "tier") for t in platform.memory_tiers),
        "links": tuple(update(l, "link") for l in platform.links),
        "groups": tuple(update(g, "group") for g in platform.groups)})
