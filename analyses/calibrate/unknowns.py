"""Numbers a published row needs but its source does not print, fitted as unknowns.

Published speculative throughputs rarely print the acceptance rate (or an SSD
cache's hit rate) a simulation needs. A row of a published-measurements file
may then write ``{fit: KEY}`` in its place: as its ``acceptance`` (an i.i.d.
per-token alpha) or as the value of a parameter in ``FREE_PARAMS`` (SSD's
miss-rate exponent ``r``: miss = F^-r). Rows naming one key share one value,
fitted jointly with the profile's knobs (``analyses.calibrate.published.fit_rows``) on the
fitted rows and judged, like the profile, on the held-out ones. A key must
appear in at least one fitted row of its platform, or nothing would fix it.

Each quantity is fitted through a transform that keeps it inside its bounds
(logit for alpha in (0, 1), log for r > 0), starting from the third number of
``QUANTITIES``, and shifted by ``Z_OFFSET``: scipy's finite differences take a
step relative to the variable, which at 0 would be ~1e-8, below the whole-round
resolution of a deterministic SSD run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# quantity -> (lowest, highest, start); alpha is a probability, r an exponent
QUANTITIES = {"alpha": (0.01, 0.99, 0.7), "r": (0.05, 10.0, 1.0)}
FREE_PARAMS = ("r",)
Z_OFFSET = 10.0  # policy parameters a row may leave to the fit


def free_key(value: Any) -> str | None:
    """KEY when ``value`` is ``{fit: KEY}``, else None."""
    if isinstance(value, dict) and set(value) == {"fit"}:
        return str(value["fit"])
    return None


@dataclass(frozen=True)
class Unknown:
    key: str
    quantity: str  # alpha | r

    @property
    def label(self) -> str:
        return f"{self.quantity} {self.key}"

    def value(self, z: float) -> float:
        lo, hi, _ = QUANTITIES[self.quantity]
        z -= Z_OFFSET
        if self.quantity == "alpha":
            return lo + (hi - lo) / (1 + math.exp(-z))
        return math.exp(z)

    def z_of(self, value: float) -> float:
        lo, hi, _ = QUANTITIES[self.quantity]
        if self.quantity == "alpha":
            u = (value - lo) / (hi - lo)
            return Z_OFFSET + math.log(u / (1 - u))
        return Z_OFFSET + math.log(value)

    def z_bounds(self) -> tuple[float, float]:
        lo, hi, _ = QUANTITIES[self.quantity]
        if self.quantity == "alpha":
            return (Z_OFFSET - 12.0, Z_OFFSET + 12.0)  # within 1e-5 of the bounds
        return (Z_OFFSET + math.log(lo), Z_OFFSET + math.log(hi))

    def z_start(self) -> float:
        return self.z_of(QUANTITIES[self.quantity][2])


def row_unknowns(acceptance: dict, params: dict) -> list[Unknown]:
    """The unknowns one row names, acceptance first."""
    out = []
    key = free_key(acceptance)
    if key is not None:
        out.append(Unknown(key, "alpha"))
    for name in FREE_PARAMS:
        key = free_key(params.get(name))
        if key is not None:
            out.append(Unknown(key, name))
    return out


def check_row(row_id: str, acceptance: dict, params: dict) -> None:
    """ValueError (one sentence) for a ``{fit: ...}`` written where none may go."""
    if "fit" in acceptance and free_key(acceptance) is None:
        raise ValueError(f"row {row_id}: acceptance {{fit: KEY}} takes no other field; "
                         "write either {fit: KEY} or a full acceptance mapping")
    for name, value in params.items():
        if isinstance(value, dict) and "fit" in value:
            if name not in FREE_PARAMS or free_key(value) is None:
                raise ValueError(f"row {row_id}: params.{name} cannot be fitted; only "
                                 f"{', '.join(FREE_PARAMS)} may be written as {{fit: KEY}}")


def check_rows(rows) -> None:
    """ValueError (one sentence) unless each key names one quantity and, on each
    platform, appears in at least one fitted row."""
    quantity: dict[str, str] = {}
    fitted: dict[tuple[str, str], bool] = {}
    for r in rows:
        for u in row_unknowns(r.acceptance, r.params):
            if quantity.setdefault(u.key, u.quantity) != u.quantity:
                raise ValueError(f"row {r.id}: fit key '{u.key}' names both "
                                 f"{quantity[u.key]} and {u.quantity}; give each its own key")
            slot = (r.platform, u.key)
            fitted[slot] = fitted.get(slot, False) or r.split == "fit"
    for (platform, key), ok in fitted.items():
        if not ok:
            raise ValueError(f"fit key '{key}' appears only in held-out rows of platform "
                             f"{platform}, so no fitted row fixes it; mark one of those "
                             "rows split: fit or give the value itself")


def unknowns_of(rows) -> list[Unknown]:
    """The distinct unknowns of ``rows`` in order of first appearance."""
    seen: list[Unknown] = []
    for r in rows:
        seen += [u for u in row_unknowns(r.acceptance, r.params) if u not in seen]
    return seen


def at_start(params: dict) -> dict:
    """``params`` with every ``{fit: KEY}`` at its quantity's starting value: the
    parameters the fit first simulates (the work budget dry-runs them)."""
    return {name: (QUANTITIES[name][2] if free_key(v) is not None else v)
            for name, v in params.items()}


def substitute(acceptance: dict, params: dict, values: dict[str, float]):
    """(acceptance, params) with every ``{fit: KEY}`` replaced by values[KEY]."""
    key = free_key(acceptance)
    if key is not None:
        acceptance = {"kind": "iid", "alpha": values[key]}
    params = {name: (values[free_key(v)] if free_key(v) is not None else v)
              for name, v in params.items()}
    return acceptance, params
