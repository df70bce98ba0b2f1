"""Comparing a golden output per number, for the outputs a solver writes.

A fit's figures come out of scipy's least squares over numpy's BLAS: another
release, or the same release on another CPU (OpenBLAS picks its kernels by the
processor), sums in another order and moves the last digits. Such an output is
compared as text with its numbers taken out, byte for byte, and then number by
number: an integer (a count, a date's parts) exactly, a fraction within the
tolerance its golden folder's ``tolerance.yaml`` names:
|got - want| <= atol + rtol * |want| + one unit in the last digit ``want`` is
written with (a figure printed to four digits may round the other way when the
fifth moves).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import yaml

TOLERANCE_FILE = "tolerance.yaml"
# a number in JSON, YAML or prose: sign, digits, a fraction, an exponent; not a
# digit glued to a word or a hyphen (cpu0, sd-1, 2026-11-26 stay text)
NUMBER = re.compile(r"(?<![\w.-])[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w.-])")


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    files: tuple[str, ...]


def load_tolerance(folder: Path) -> Tolerance | None:
    """The tolerance a golden folder names, or None: its files compare byte for byte."""
    path = folder / TOLERANCE_FILE
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    return Tolerance(float(data["rtol"]), float(data["atol"]), tuple(data["files"]))


def last_digit_unit(token: str) -> float:
    """One unit in the last digit a number is written with (0.00123 -> 1e-05)."""
    return float(Decimal(1).scaleb(Decimal(token).as_tuple().exponent))


def split_numbers(text: str) -> tuple[str, list[str]]:
    """The text with each number replaced by a marker, and the numbers."""
    numbers = NUMBER.findall(text)
    return NUMBER.sub("\x00", text), numbers


def differences(got: str, want: str, tol: Tolerance, limit: int = 5) -> list[str]:
    """Where ``got`` departs from ``want`` beyond the tolerance (empty: it agrees)."""
    got_text, got_numbers = split_numbers(got)
    want_text, want_numbers = split_numbers(want)
    if got_text != want_text:
        at = next((i for i, (a, b) in enumerate(zip(got_text, want_text)) if a != b),
                  min(len(got_text), len(want_text)))
        return [f"the text around the numbers differs at character {at}: "
                f"{got_text[at:at + 60]!r} against {want_text[at:at + 60]!r}"]
    out = []
    for i, (g, w) in enumerate(zip(got_numbers, want_numbers)):
        if not any(c in w for c in ".eE"):  # an integer: exact
            if g != w:
                out.append(f"number {i} is {g}, recorded {w} (an integer: exact)")
            if len(out) == limit:
                break
            continue
        allowed = tol.atol + tol.rtol * abs(float(w)) + last_digit_unit(w)
        if abs(float(g) - float(w)) > allowed:
            out.append(f"number {i} is {g}, recorded {w} (allowed +-{allowed:.3g})")
            if len(out) == limit:
                break
    return out
