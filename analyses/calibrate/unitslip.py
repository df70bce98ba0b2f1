"""Published rows in a wrong unit, and fitted numbers no hardware has.

Two checks join the sanity gate (``analyses.calibrate.fitgate``) of a published
calibration, each naming a unit slip as one:

- ``row_slips``: a row whose printed number lies more than ``SLIP`` times
  from what the profile being calibrated predicts for its settings (before the
  fit) is a number in a wrong unit, not a measurement the fit should bend the
  profile to: every shipped row lies within 2x of its shipped profile, and a
  slip of 10x-1000x (tokens per minute, ms per token typed in microseconds or
  seconds) lies past it. The row, its line and the likely unit are named.
- ``fitted_slips``: a fitted profile field outside its physical range
  (``hwprofiles.plausible``), as a uniformly mistyped file fits: every A100 row
  100x too slow fits at 0.7% memory efficiency with a good held-out error,
  because the held-out rows share the slip.

Both are problems the gate refuses unless ``--accept-poor-fit``.
"""

from __future__ import annotations

import math

from hwprofiles import plausible

SLIP = 10 ** 0.75  # ~5.6x: nearer a factor of 10 than of 1 (log scale)
CLOSE = 2.0  # a unit that brings a row within this factor of the profile names the slip
# what a printed number may have been typed in: (name, factor to the row's unit)
UNITS = {"tokens/s": (("tokens per minute", 1 / 60), ("tokens per ms", 1e3)),
         "ms/token": (("microseconds per token", 1e-3), ("seconds per token", 1e3)),
         "s/batch": (("milliseconds", 1e-3), ("minutes", 60.0)),
         "speedup": (("percent", 1e-2),)}


def _likely_unit(measure: str, published: float, predicted: float) -> str:
    for name, factor in UNITS.get(measure, ()):
        if abs(math.log(published * factor / predicted)) < math.log(CLOSE):
            return f"typed in {name}? as {name} it is {published * factor:.4g} {measure}"
    power = 10 ** round(math.log10(max(published / predicted, predicted / published)))
    return f"a slip of about {power:g}x, a number in a wrong unit?"


def row_slips(path, table, platform_name: str, lines: dict[str, int]) -> list[str]:
    """One sentence naming the first row of ``table`` (``published.evaluate``:
    its ``before`` column is the profile as it is) off by more than ``SLIP``, and
    how many more are; none when no row is."""
    off = [t for t in table if t["published_tokens_per_s"] > 0 and t["before_tokens_per_s"] > 0
           and not 1 / SLIP <= t["published_tokens_per_s"] / t["before_tokens_per_s"] <= SLIP]
    if not off:
        return []
    t = off[0]
    published, predicted = t["published_tokens_per_s"], t["before_tokens_per_s"]
    ratio = published / predicted
    where = f"row {t['id']}" + (f" (line {lines[t['id']]})" if t["id"] in lines else "")
    more = f"; {len(off) - 1} more of its {len(table)} rows are off too" if len(off) > 1 else ""
    return [f"{where} of {path} says {published:.4g} {t['measure']}, {_times_shown(ratio)} "
            f"{'above' if ratio > 1 else 'below'} what {platform_name}'s profile predicts for "
            f"its settings ({predicted:.4g} {t['measure']}; "
            f"{_likely_unit(t['measure'], published, predicted)}){more}: give each number "
            f"in {t['measure']} as its source printed it, or drop the row"]


def _times_shown(ratio: float) -> str:
    times = max(ratio, 1 / ratio)
    return f"{times:,.0f} times" if times >= 100 else f"{times:.3g} times"


def fitted_slips(fitted, original, fix: str) -> list[str]:
    """One sentence per fitted field (every object of a kind that shares it named
    once) outside its physical range, with its value before the fit and how many
    times the fit moved it."""
    before = {(f.kind, f.name, f.field) for f in plausible.problems(original)}
    groups: dict[tuple[str, str], list] = {}
    for f in plausible.problems(fitted):
        if (f.kind, f.name, f.field) not in before:
            groups.setdefault((f.kind, f.field), []).append(f)
    out = []
    for (kind, field), found in groups.items():
        f, b = found[0], found[0].bound
        unit = "" if b.unit == "fraction" else f" {b.unit}"
        names = f.name + (f" (and {len(found) - 1} more {kind}s)" if len(found) > 1 else "")
        was = _value(original, f)
        moved = "" if was in (None, 0) else f" from {was:.4g}, {_times(f.value, was)},"
        out.append(f"the fit moves {field} of {kind} {names}{moved} to {f.value:.4g}{unit}, "
                   f"outside its plausible range ({b.lo:g} to {b.hi:g}{unit}: {b.why}), so "
                   f"the rows it was fitted to are likely in a wrong unit: {fix}")
    return out


def _times(now: float, was: float) -> str:
    ratio = now / was
    return f"{_times_shown(ratio)} {'more' if ratio >= 1 else 'less'}"


def _value(platform, finding):
    kinds = {"tier": "memory_tiers", "device": "devices", "link": "links",
             "group": "groups"}
    items = getattr(platform, kinds.get(finding.kind, ""), (platform,))
    obj = next((o for o in items if o.name == finding.name), None)
    field = finding.field.split(".")
    value = getattr(obj, field[0], None) if obj is not None else None
    return value.get(field[1]) if isinstance(value, dict) and len(field) > 1 else value
