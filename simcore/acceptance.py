"""Acceptance models: where a simulated Verify gets its outcome.

Each model answers two questions for a proposal of ``gamma`` tokens starting at
draft position ``position``: draw accepted lengths for ``batch`` rows, and give
the expected accepted length (used in deterministic mode). Selectable by name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from policies.sd import expected_accepted
from policies.traces import TraceError, read_acceptance


class _Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def load(self) -> _Params:
        """Read whatever the model reads from disk (a trace); the model itself."""
        return self


class IID(_Params):
    """Every draft token is accepted with the same probability alpha."""

    kind: Literal["iid"] = "iid"
    alpha: float = Field(0.8, ge=0, le=1)

    def expected(self, gamma: int, position: int = 0) -> float:
        return expected_accepted(self.alpha, gamma)

    def sample(self, gamma: int, batch: int, rng: np.random.Generator,
               position: int = 0) -> tuple[int, ...]:
        if gamma == 0:
            return (0,) * batch
        if self.alpha >= 1:
            return (gamma,) * batch
        draws = rng.geometric(1 - self.alpha, size=batch) - 1
        return tuple(int(min(d, gamma)) for d in draws)


class Positional(_Params):
    """Token i (0-based, counted from the start of the draft) is accepted with
    probability alphas[i] given all before it were; the last value repeats."""

    kind: Literal["positional"] = "positional"
    alphas: tuple[float, ...] = Field(min_length=1)

    @field_validator("alphas")
    @classmethod
    def _in_unit(cls, v):
        if any(not 0 <= a <= 1 for a in v):
            raise ValueError("every alpha_i must lie in [0, 1]")
        return v

    def _alpha(self, i: int) -> float:
        return self.alphas[min(i, len(self.alphas) - 1)]

    def expected(self, gamma: int, position: int = 0) -> float:
        total, survive = 0.0, 1.0
        for j in range(gamma):
            survive *= self._alpha(position + j)
            total += survive
        return total

    def sample(self, gamma, batch, rng, position=0):
        out = []
        u = rng.random((batch, gamma))
        for row in u:
            k = 0
            while k < gamma and row[k] < self._alpha(position + k):
                k += 1
            out.append(k)
        return tuple(out)


class Histogram(_Params):
    """Empirical distribution of accepted lengths: probs[k] = P(k accepted).
    With a shorter proposal than the histogram covers, the tail mass lands on
    gamma (all accepted)."""

    kind: Literal["histogram"] = "histogram"
    probs: tuple[float, ...] = Field(min_length=1)

    @field_validator("probs")
    @classmethod
    def _normalised(cls, v):
        if any(p < 0 for p in v) or not 0 < sum(v) < math.inf:
            raise ValueError("histogram probabilities must be >= 0 with a positive, "
                             "finite sum")
        s = sum(v)
        return tuple(p / s for p in v)

    def _truncated(self, gamma: int) -> np.ndarray:
        p = np.zeros(gamma + 1)
        for k, pk in enumerate(self.probs):
            p[min(k, gamma)] += pk
        return p

    def expected(self, gamma, position=0):
        p = self._truncated(gamma)
        return float(np.dot(np.arange(gamma + 1), p))

    def sample(self, gamma, batch, rng, position=0):
        p = self._truncated(gamma)
        return tuple(int(k) for k in rng.choice(gamma + 1, size=batch, p=p))


class Trace(_Params):
    """Replays accepted lengths recorded by the real executor (JSONL, one step a
    line with an ``accepted`` list per row), cycling when it runs out. The file
    is read and every line validated when the model is built, before any
    simulation starts (``policies.traces.read_acceptance``)."""

    kind: Literal["trace"] = "trace"
    path: Path

    @field_validator("path")
    @classmethod
    def _readable(cls, v):
        if not Path(v).exists():
            raise ValueError(f"acceptance trace {v} does not exist; pass the "
                             "acceptance_trace path of a measured run record")
        return v

    def load(self) -> Trace:
        """Read and validate the whole file now; ``build`` does, so a bad line is
        refused before a simulation starts (TraceError naming the line)."""
        self._steps()
        return self

    def _steps(self) -> list[list[int]]:
        cache = self.__dict__.get("_cache")
        if cache is None:
            cache = [d["accepted"] for d in read_acceptance(self.path)
                     if "accepted" in d]  # Outcome lines carry no lengths
            if not cache:
                raise TraceError(f"acceptance trace {self.path} holds no Verify lines "
                                 "('accepted'); pass the acceptance.jsonl of a measured "
                                 "run")
            object.__setattr__(self, "_cache", cache)
        return cache

    def proposed(self, gamma: int, batch: int, step: int | None = None) -> tuple[int, ...]:
        """What the recorded step the next ``sample`` replays (or step ``step``)
        proposed per row, at most ``gamma``: a prompt lookup's lengths. A line
        without ``proposed`` proposed what it accepted."""
        return self._recorded("proposed", gamma, batch, step)

    def nodes(self, most: int, batch: int, step: int | None = None) -> tuple[int, ...]:
        """The token tree's nodes per row that step scored (``nodes``; a line
        without them: what it proposed), at most ``most``."""
        return self._recorded("nodes", most, batch, step)

    def _recorded(self, field: str, most: int, batch: int, step: int | None):
        lines = self.__dict__.get("_" + field)
        if lines is None:
            lines = [d.get(field) or d.get("proposed") or d["accepted"]
                     for d in read_acceptance(self.path) if "accepted" in d]
            object.__setattr__(self, "_" + field, lines)
        i = self.__dict__.get("_cursor", 0) if step is None else step
        row = lines[i % len(lines)]
        return tuple(min(int(row[b % len(row)]), most) for b in range(batch))

    def expected(self, gamma, position=0):
        flat = [min(k, gamma) for step in self._steps() for k in step]
        return float(np.mean(flat))

    def sample(self, gamma, batch, rng, position=0):
        steps = self._steps()
        i = self.__dict__.get("_cursor", 0)
        object.__setattr__(self, "_cursor", i + 1)
        row = steps[i % len(steps)]
        return tuple(min(int(row[b % len(row)]), gamma) for b in range(batch))


def default() -> dict:
    """The acceptance model a run assumes when none is given: i.i.d. at the IID
    model's default alpha (the one place that default is written)."""
    return IID().model_dump()


MODELS: dict[str, type[_Params]] = {m.model_fields["kind"].default: m
                                    for m in (IID, Positional, Histogram, Trace)}

# Which --set key selects which acceptance model, and the field it fills.
KEYS = {"alpha": ("iid", "alpha"), "alphas": ("positional", "alphas"),
        "histogram": ("histogram", "probs"), "trace": ("trace", "path")}


def build(kind: str, **fields):
    if kind not in MODELS:
        raise ValueError(f"unknown acceptance model '{kind}'; choose one of "
                         f"{', '.join(MODELS)}")
    return MODELS[kind](**fields).load()
