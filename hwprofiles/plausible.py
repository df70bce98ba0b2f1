"""Physical bounds on every number a platform or a software stack holds.

The schemas (``hwprofiles.schema``, ``hwprofiles.stacks``) refuse what cannot be
computed with (a negative time, a bandwidth of a zettabyte per second); this
module refuses what no real hardware or framework does, so that a number typed
in the wrong unit, or fitted to rows typed in one, is caught before it prices
anything. Each field has a range (``BOUNDS``) with the reason it is a physical
bound; the ranges hold every shipped profile and stack with room (the widest
shipped values are in each reason).

A number outside its range is named with its object and field, how many times
past the range it lies, and, where a common unit puts it inside (``0.4685`` s
per layer read as milliseconds is 468.5 us), the unit it was likely typed in.
A slip of 10x-1000x in either direction is named as one.

A number that really lies outside (a new kind of device) is kept when its
source says so: a source holding ``ACCEPTED`` (``hetspec calibrate
--accept-poor-fit`` writes it beside the values it let pass) is not judged.

``problems(obj)`` returns the findings of a platform or a stack; the loader
(``hwprofiles.loader``) refuses the first of a file's, and calibration
(``analyses.calibrate.fitgate``) adds a fit's to its sanity gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ACCEPTED = "accepted outside the plausible range"


@dataclass(frozen=True)
class Bound:
    lo: float
    hi: float
    unit: str  # the field's unit: 's', 'GB/s', 'fraction', 'FLOP/s', 'bytes'
    why: str
    typical: float  # a usual value (from the shipped profiles): what a slip is measured from


# (the value's true size in the field's unit) = typed value x factor
UNITS = {"s": (("milliseconds", 1e-3), ("microseconds", 1e-6), ("nanoseconds", 1e-9)),
         "GB/s": (("MB/s", 1e-3), ("TB/s", 1e3), ("bytes/s", 1e-9), ("KB/s", 1e-6)),
         "FLOP/s": (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("PFLOP/s", 1e15)),
         "bytes": (("GB", 1e9), ("MB", 1e6), ("TB", 1e12)),
         "fraction": (("percent", 1e-2),)}

_LAUNCH = Bound(0.0, 2e-3, "s", "a kernel launch or one layer's dispatch takes "
                "microseconds (shipped: 5 us to 0.18 ms); a 2 ms one is a host stall", 4e-5)
_CALL = Bound(0.0, 0.05, "s", "one model call's host work is at most a few ms "
              "(shipped: 3 us to 1 ms)", 5e-4)
_LATENCY = Bound(0.0, 0.01, "s", "a memory, link or collective start-up latency is "
                 "nanoseconds to 0.1 ms (shipped: 0.7 us to 0.13 ms)", 1e-5)
_EFFICIENCY = Bound(0.05, 1.0, "fraction", "decode reads weights at 50-95% of peak "
                    "bandwidth on every measured GPU and CPU (shipped: 0.79)", 0.79)
_ALLREDUCE_SHARE = Bound(0.05, 1.0, "fraction", "an engine's in-pass all-reduces reach "
                         "a share of the group's bus bandwidth (shipped: 0.31 to 1)", 1.0)
_COMPUTE_EFF = Bound(0.01, 1.0, "fraction", "GEMMs reach 5-90% of peak FLOP/s "
                     "(shipped: 0.07 to 1)", 0.5)
_LINK_GB_S = Bound(0.01, 1e5, "GB/s", "links run from 10 MB/s (a slow network) to "
                   "a few TB/s (shipped: 2.9 to 2,500 GB/s)", 100.0)
_ENGINE_GB_S = Bound(0.01, 3e4, "GB/s", "an engine draws 10 MB/s to tens of TB/s "
                     "(shipped: 9 to 695 GB/s)", 100.0)
_TIER_GB_S = {"hbm": Bound(50.0, 3e4, "GB/s", "HBM runs at 0.3-8 TB/s (shipped: "
                           "1,555 to 8,000 GB/s)", 3000.0),
              "dram": Bound(1.0, 5e3, "GB/s", "DRAM runs at 5-1,000 GB/s (shipped: "
                            "34 to 864 GB/s)", 100.0),
              "flash": Bound(0.01, 100.0, "GB/s", "flash reads at 0.05-15 GB/s "
                             "(shipped: 0.29 to 4.2 GB/s)", 2.0),
              "sram": Bound(10.0, 1e6, "GB/s", "on-chip SRAM runs at TB/s", 1e4)}
_CAPACITY = Bound(1e6, 1e15, "bytes", "a memory tier holds megabytes to a few "
                  "terabytes (shipped: 16 GB to 1 TB)", 8e10)
_PEAK = Bound(1e8, 1e17, "FLOP/s", "a device computes 0.1 GFLOP/s to 100 PFLOP/s "
              "per dtype", 1e14)
_HOST = Bound(0.0, 5e-3, "s", "a framework's host time per layer, sequence or "
              "expert is microseconds to a ms (shipped: up to 0.47 ms)", 1e-4)

BOUNDS = {
    "device": {"launch_overhead_s": _LAUNCH, "call_overhead_s": _CALL,
               "stream_dispatch_s": _CALL, "compute_efficiency": _COMPUTE_EFF,
               "memory_bandwidth_gb_s": _ENGINE_GB_S, "stream_host_gb_s": _ENGINE_GB_S},
    "tier": {"latency_s": _LATENCY, "request_latency_s": _CALL,
             "memory_efficiency": _EFFICIENCY, "capacity_bytes": _CAPACITY,
             "host_copy_gb_s": _ENGINE_GB_S},
    "link": {"latency_s": _LATENCY, "bandwidth_gb_s": _LINK_GB_S},
    "group": {"alpha_s": _LATENCY, "base_s": _LATENCY, "bandwidth_gb_s": _LINK_GB_S},
    "platform": {"host_lookup_s": _LATENCY},
    "stack": {"layer_host_s": _HOST, "call_host_s": _CALL, "head_sync_s": _LATENCY,
              "sequence_host_s": _HOST, "verify_host_s": _CALL, "expert_host_s": _HOST,
              "topk_step_host_s": _CALL, "allreduce_bandwidth_factor": _ALLREDUCE_SHARE},
}


@dataclass(frozen=True)
class Finding:
    """One number outside its range: where it is and the sentence that says so."""

    kind: str  # 'device', 'tier', 'link', 'group', 'platform', 'stack'
    name: str  # the object's name
    field: str
    value: float
    bound: Bound
    text: str


def slip(value: float, bound: Bound) -> str:
    """How far past ``bound`` the value lies, as words, and the slip it reads as:
    the unit that brings it nearest the usual value (within 10x of it), else its
    power of ten from the usual value."""
    above = value > bound.hi
    ratio = value / bound.hi if above else (bound.lo / value if value > 0 else math.inf)
    shown = f"{ratio:.3g} times" if math.isfinite(ratio) else "far"
    unit = "" if bound.unit == "fraction" else f" {bound.unit}"
    out = (f"{shown} {'above' if above else 'below'} its plausible range ({bound.lo:g} "
           f"to {bound.hi:g}{unit}: {bound.why})")
    if value <= 0:
        return out
    near = [(abs(math.log10(value * f / bound.typical)), name, f)
            for name, f in UNITS.get(bound.unit, ())
            if bound.lo <= value * f <= bound.hi]
    near = [n for n in near if n[0] < 1]
    if near:
        _, name, f = min(near)
        return out + f"; it reads as a unit slip: {value:g} {name} is {value * f:.4g}{unit}"
    power = round(math.log10(value / bound.typical))
    return out + (f"; a slip of about {10 ** abs(power):g}x (a wrong unit?) from the usual "
                  f"{bound.typical:g}{unit}")


def bound_of(kind: str, field: str, tier_kind: str | None = None) -> Bound | None:
    """The range of one field of an object of ``kind`` (a memory tier's bandwidth
    by the tier's own kind); None for a field without one."""
    if field == "peak_flops":
        return _PEAK
    if kind == "tier" and field == "bandwidth_gb_s":
        return _TIER_GB_S.get(tier_kind or "")
    return BOUNDS.get(kind, {}).get(field)


def judge(kind: str, name: str, field: str, value: float, bound: Bound | None,
          sources: dict) -> Finding | None:
    """The finding for one field's value, or None (no range, inside it, or
    accepted by its source)."""
    if bound is None or ACCEPTED in sources.get(field.split(".")[0], ""):
        return None
    if bound.lo <= value <= bound.hi:
        return None
    unit = "" if bound.unit == "fraction" else f" {bound.unit}"
    text = f"{kind} {name} field {field} is {value:.4g}{unit}, {slip(value, bound)}"
    return Finding(kind, name, field, value, bound, text)


def _fields(kind: str, obj, name: str | None = None, prefix: str = "",
            tier_kind: str | None = None) -> list[Finding]:
    """The findings of the fields ``obj`` sets (defaults are not judged); ``name``
    and ``prefix`` name an entry inside an object (a stack's backend)."""
    out = []
    sources = getattr(obj, "sources", {})
    name = obj.name if name is None else name
    for field in sorted(getattr(obj, "model_fields_set", ())):
        value = getattr(obj, field)
        bound = bound_of(kind, field, tier_kind)
        numbers = ({f"{field}.{k}": v for k, v in value.items()} if field == "peak_flops"
                   else {field: value})
        for label, number in numbers.items():
            if isinstance(number, (int, float)) and not isinstance(number, bool):
                found = judge(kind, name, prefix + label, float(number), bound, sources)
                out += [found] if found else []
    return out


def platform_problems(platform) -> list[Finding]:
    """Every number of a platform outside its range (``BOUNDS``)."""
    out = _fields("platform", platform)
    for tier in platform.memory_tiers:
        out += _fields("tier", tier, tier_kind=tier.kind)
    for kind, attr in (("device", "devices"), ("link", "links"), ("group", "groups")):
        for item in getattr(platform, attr):
            out += _fields(kind, item)
    return out


def stack_problems(stack) -> list[Finding]:
    """Every number of a stack (and of its per-backend entries) outside its range."""
    out = _fields("stack", stack)
    for backend, entry in stack.backends.items():
        out += _fields("stack", entry, stack.name, prefix=f"backends.{backend}.")
    return out


def problems(obj) -> list[Finding]:
    """The findings of a platform or a stack (anything else: none)."""
    if hasattr(obj, "devices"):
        return platform_problems(obj)
    if hasattr(obj, "backends"):
        return stack_problems(obj)
    return []


_ATTRS = {"memory_tiers": "tier", "devices": "device", "links": "link", "groups": "group"}


def explain(file_kind: str, data: dict, loc: tuple, value) -> Finding | None:
    """The finding for a value the schema refused at ``loc`` of a platform's or
    stack's ``data`` (a slip so large that it left the schema's own range, an
    efficiency typed in percent), or None where no range covers it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    if not (math.isfinite(number) and number > 0):
        return None  # the schema's own sentence names a sign or a non-number
    if file_kind == "stacks" and len(loc) == 1:
        kind, name, field, bound = ("stack", str(data.get("name", "")), str(loc[0]),
                                    bound_of("stack", str(loc[0])))
    elif file_kind == "platforms" and len(loc) == 3 and loc[0] in _ATTRS:
        try:
            obj = dict(data[loc[0]][loc[1]])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        kind, name, field = _ATTRS[loc[0]], str(obj.get("name", "")), str(loc[2])
        bound = bound_of(kind, field, obj.get("kind"))
    else:
        return None
    # a slip is a few powers of ten; further out the schema's own sentence says it
    if bound is None or not bound.lo / 1e4 <= number <= max(bound.hi, bound.typical) * 1e4:
        return None
    return judge(kind, name, field, number, bound, {})


FIX = (f"give the value in the field's unit, or, if it is right, say why in its source "
       f"and add '{ACCEPTED}' there")


def accept(obj, findings: list[Finding], why: str):
    """``obj`` (a platform) with ``ACCEPTED`` and ``why`` appended to the source of
    every field a finding names, so that the file written loads."""
    if not findings:
        return obj

    def marked(item, kind):
        mine = [f.field.split(".")[0] for f in findings
                if f.name == item.name and f.kind == kind]
        if not mine:
            return item
        sources = dict(item.sources)
        for field in mine:
            sources[field] = f"{sources.get(field, '')}; {ACCEPTED} ({why})".lstrip("; ")
        return item.model_copy(update={"sources": sources})

    kinds = {"memory_tiers": "tier", "devices": "device", "links": "link", "groups": "group"}
    update = {attr: tuple(marked(o, kind) for o in getattr(obj, attr))
              for attr, kind in kinds.items()}
    return marked(obj, "platform").model_copy(update=update)
