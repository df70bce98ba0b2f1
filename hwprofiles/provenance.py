"""Where a platform's numbers come from, by kind, so that platforms can be
compared on like terms.

Every number of a profile carries its source (``Sourced``); the source's words
say its kind: ``measured`` (a benchmark's output), ``fitted`` (calibrated to
published or measured runs), ``datasheet`` (a vendor's specification),
``model`` (a library's or paper's formula), ``estimate`` (carried over from
similar hardware), or ``default`` (no source: the schema's default, which adds
nothing or assumes the ideal). The numbers are grouped by what they set
(``ASPECTS``); two platforms whose speeds are compared should get each aspect
from the same kinds of source, or the difference may be the sources', not the
hardware's (``unlike``).
"""

from __future__ import annotations

from hwprofiles.schema import Platform

# what a number sets -> (object kind, field) pairs that set it
ASPECTS = {
    "memory": (("tier", "bandwidth_gb_s"), ("tier", "memory_efficiency")),
    "compute": (("device", "peak_flops"), ("device", "compute_efficiency")),
    "overheads": (("device", "launch_overhead_s"), ("device", "call_overhead_s")),
    "collectives": (("group", "base_s"), ("group", "alpha_s"), ("group", "bandwidth_gb_s")),
}
# a source's opening words -> its kind, checked in this order; then words it holds
OPENINGS = (("default", ("uncalibrated",)), ("fitted", ("calibrated", "fitted")),
            ("measured", ("measured",)), ("estimate", ("estimate", "assumed")))
HOLDS = (("fitted", ("calibrated", "published fit", "-5x fit", "x fit")),
         ("datasheet", ("datasheet", "data sheet", "spec sheet")),
         ("model", ("latency model",)), ("measured", ("measured",)),
         ("estimate", ("carried from", "estimate")))


def kind(source: str | None) -> str:
    """The kind of a number's source (module doc), from the words it opens with
    (``OPENINGS``: 'calibrated: ...', 'measured: ...'), else from words it holds
    (``HOLDS``); ``default`` without a source; ``other`` else."""
    if not source:
        return "default"
    text = source.lower().lstrip()
    for name, words in OPENINGS:
        if text.startswith(words):
            return name
    for name, words in HOLDS:
        if any(w in text for w in words):
            return name
    return "other"


def _objects(platform: Platform, what: str) -> list:
    if what == "tier":
        return list(platform.memory_tiers)
    if what == "device":
        return list(platform.devices)
    return [g for g in platform.groups if g.size > 1]


def kinds(platform: Platform) -> dict[str, tuple[str, ...]]:
    """{aspect: the kinds of its numbers' sources on the platform}; an aspect the
    platform has nothing of (no group: no collectives) is left out."""
    out = {}
    for aspect, fields in ASPECTS.items():
        found = {kind(obj.sources.get(field)) for what, field in fields
                 for obj in _objects(platform, what)
                 if what != "group" or field in obj.model_fields_set}
        if found:
            out[aspect] = tuple(sorted(found))
    return out


def unlike(platforms: list[Platform]) -> list[str]:
    """One sentence per aspect whose numbers come from different kinds of source
    on the platforms compared (empty when all alike, or for one platform)."""
    if len(platforms) < 2:
        return []
    table = {p.name: kinds(p) for p in platforms}
    out = []
    for aspect in ASPECTS:
        per = {name: k.get(aspect) for name, k in table.items() if aspect in k}
        if len(set(per.values())) > 1:
            said = "; ".join(f"{name}: {', '.join(k)}" for name, k in per.items())
            out.append(f"{aspect} numbers come from different kinds of source ({said}), so "
                       f"part of the platforms' difference may be their sources'")
    return out
