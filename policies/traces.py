"""Recorded runs and timelines as data, for the schedules' own metrics.

``read_jsonl`` and ``read_acceptance`` read a measured run's JSON-lines files
whole, once, and validate every line (an error names the file and the line);
every reader of ``acceptance.jsonl`` (the Trace acceptance model, the recorded
event rates below, replays, the executor's summary) goes through them.
``recorded_rate`` reads how often an event held in a measured run's acceptance
trace (Mirror's reuse rate, SSD's cache hits, taken from a real run);
``intervals``, ``covered_s`` and ``overlap_s`` measure spans by operation label
(time a phase runs, time two phases run together).

The executor writes two kinds of acceptance line (executors/coordinate/coordinator.py):
a Verify line, ``{"accepted": [k per row], "gamma", "proposed", "committed",
"bonus_rank", "margin", "branch"[, "correction", "topk_hit", "nodes"]}``
(``nodes``: a token tree's scored nodes per row), and an Outcome
line, ``{"event": name, "held": [bool per row]}`` (older traces: one bool);
the run adds ``prompt_batch``. Nothing else is accepted. The executor builds
each line as a ``VerifyLine`` or ``EventLine`` (``line()``), so what it writes is
what is read back; ``policies.runs.measured`` writes them into a measured run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from hwprofiles import jsonin
from policies.base import PolicyError

# A measured run's JSON-lines files are a few MB at most (a Verify line is
# ~150 bytes: 16 MiB holds ~100,000 decoding steps, far past any run the
# executor makes); a larger file is refused before it is read into memory.
MAX_TRACE_BYTES = 16 * 2**20
MAX_SPANS_BYTES = 64 * 2**20  # ~200,000 spans of ~300 bytes
# No policy proposes more than 64 draft tokens a step (sd, mirror, ppsd, cats:
# gamma <= 64; ssd: k <= 32, tests/test_reliability_runs.py checks it); a
# Verify line's count per row may add the correction token the target chose
# (executors/coordinate/coordinator.py ``_commit``), so 65 is the most a real line holds.
MAX_GAMMA = 64
MAX_ACCEPTED = MAX_GAMMA + 1
MAX_NODES = 1024  # a token tree's nodes per row (policies.tree.MAX_NODES)

Count = Annotated[int, Field(ge=0)]


class TraceError(ValueError):
    """A recorded file that cannot be used; the message is one sentence naming the
    file, the line and the fix. (No custom __init__: SimPy re-raises a process's
    exception as ``type(e)(*e.args)``.)"""


class _Line(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    prompt_batch: Count = 0

    def line(self) -> dict:
        """The JSON object a runtime records: the fields it gave, in the order
        declared (a measured run adds ``prompt_batch`` as it writes the file)."""
        return self.model_dump(exclude_unset=True)


class VerifyLine(_Line):
    """One Verify of the executor: tokens accepted per row, and what it proposed."""

    accepted: list[Count] = Field(min_length=1)
    gamma: Annotated[int, Field(ge=0, le=MAX_GAMMA)] | None = None
    proposed: list[Annotated[int, Field(ge=0, le=MAX_GAMMA)]] | None = None
    committed: list[Annotated[int, Field(ge=0, le=MAX_ACCEPTED + 1)]] | None = None
    bonus_rank: list[Count | None] | None = None
    margin: list[Annotated[float, Field(allow_inf_nan=True)] | None] | None = None
    branch: Count | None = None
    correction: list[bool] | None = None
    topk_hit: list[bool] | None = None
    nodes: list[Annotated[int, Field(ge=0, le=MAX_NODES)]] | None = None

    @field_validator("accepted")
    @classmethod
    def _at_most_a_step(cls, v):
        if max(v) > MAX_ACCEPTED:
            raise ValueError(f"a row accepted {max(v)} tokens, more than the "
                             f"{MAX_ACCEPTED} any policy can accept in one step "
                             f"(gamma <= {MAX_GAMMA}, plus one correction)")
        return v

    @model_validator(mode="after")
    def _within_the_proposal(self):
        """A row accepts at most what it proposed (``proposed``, else ``gamma``),
        plus the correction token a correction branch adds; it commits what it
        accepted and at most one token more (the bonus)."""
        rows = len(self.accepted)
        for name in ("proposed", "committed", "correction", "nodes"):
            values = getattr(self, name)
            if values is not None and len(values) != rows:
                raise ValueError(f"'{name}' has {len(values)} rows but 'accepted' has "
                                 f"{rows}")
        proposed = self.proposed or ([self.gamma] * rows if self.gamma is not None else None)
        corrections = self.correction or [False] * rows
        for r, k in enumerate(self.accepted):
            if proposed is not None and k > proposed[r] + corrections[r]:
                what = "proposed" if self.proposed else "gamma"
                raise ValueError(f"row {r} accepted {k} tokens of {proposed[r]} {what}, "
                                 "more than it proposed")
            if self.committed is not None and not 0 <= self.committed[r] - k <= 1:
                raise ValueError(f"row {r} committed {self.committed[r]} tokens after "
                                 f"accepting {k} (it commits the accepted ones and at most "
                                 "one bonus token)")
        return self


class EventLine(_Line):
    """One Outcome the executor observed: whether the event held, per row."""

    event: str = Field(min_length=1)
    held: list[bool] = Field(min_length=1)

    @field_validator("held", mode="before")
    @classmethod
    def _one_bool_is_one_row(cls, v):
        return [v] if isinstance(v, bool) else v


def held_rows(line: dict) -> list[bool]:
    """An event line's ``held`` per row (an old one-bool line counts once)."""
    held = line["held"]
    return [bool(h) for h in held] if isinstance(held, list) else [bool(held)]


def read_jsonl(path, what: str, fix: str, max_bytes: int = MAX_TRACE_BYTES,
               check=None) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of a JSON-lines file, read
    whole by the reader of every JSON input (``hwprofiles.jsonin``: size,
    encoding, nesting, keys given twice); a line that is not one JSON object is
    refused (TraceError naming the line). ``check(obj, n)`` runs on each line in
    turn, so the first bad line in the file is the one named."""
    path = Path(path)
    text = jsonin.read_text(path, f"the {what}", fix, max_bytes, TraceError, empty=True)
    out = []
    for n, line in enumerate(text.split("\n"), 1):  # JSON lines end at \n alone
        if not line.strip():
            continue
        obj, problem = jsonin.parsed(line)
        if problem is None and not isinstance(obj, dict):
            problem = "is not a JSON object"
        if problem:
            raise TraceError(f"line {n} of {path} {problem}, so the {what} is corrupt; "
                             f"{fix}")
        if check is not None:
            check(obj, n)
        out.append((n, obj))
    return out


def field_error(exc: ValidationError) -> str:
    """"field 'accepted.0' = -3: Input should be ..." for the first error (only the
    message for an error about the whole object)."""
    first = exc.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return msg
    where = ".".join(str(p) for p in first["loc"])
    shown = json.dumps(first.get("input"), default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    value = "" if first["type"] == "missing" else f" = {shown}"
    return f"field '{where}'{value}: {msg}"


def check_line(obj: dict, n: int, path, what: str, fix: str) -> None:
    """Refuse line ``n`` unless it is a Verify or an Outcome line as the executor
    writes them (module doc)."""
    kind = VerifyLine if "accepted" in obj else EventLine if "event" in obj else None
    if kind is None:
        raise TraceError(f"line {n} of {path} has neither 'accepted' (a Verify) nor "
                         f"'event' (an Outcome), so the {what} is corrupt; {fix}")
    try:
        kind.model_validate(obj)
    except ValidationError as exc:
        raise TraceError(f"line {n} of {path}: {field_error(exc)}, so the {what} is "
                         f"corrupt; {fix}") from None


def read_acceptance(path, what: str = "acceptance trace",
                    fix: str = "pass the acceptance.jsonl of a measured run") -> list[dict]:
    """Every line of an acceptance.jsonl, validated (module doc), in order."""
    return [obj for _, obj in numbered_acceptance(path, what, fix)]


def numbered_acceptance(path, what: str = "acceptance trace",
                        fix: str = "pass the acceptance.jsonl of a measured run"
                        ) -> list[tuple[int, dict]]:
    """(line number, line) of every line of an acceptance.jsonl, validated (module
    doc): what a cross-check of a measured run names its refusals by."""
    return read_jsonl(path, what, fix,
                      check=lambda obj, n: check_line(obj, n, path, what, fix))


def recorded_rate(path: str | Path, event: str, field: str) -> float:
    """Share of a measured run's ``event`` lines (acceptance.jsonl) that held; a
    per-row line (``held`` a list) counts each row."""
    try:
        lines = read_acceptance(path)
    except TraceError as exc:
        raise PolicyError(f"{field}: {exc}") from None
    held = [h for d in lines if d.get("event") == event for h in held_rows(d)]
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
