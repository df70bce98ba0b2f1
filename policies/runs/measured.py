"""The measured-run schema: what ``hetspec run`` writes, and what replay and
calibration read, in one place.

A measured run is a folder (``policies.runs.files.RUN_FILES``):

- ``record.json``: schema ``RUN_SCHEMA`` (``hetspec.run/1``, the version),
  ``kind: measured``, ``inputs`` (``RunInputs``), ``metrics`` (``RunMetrics``),
  and the names of the files below (``RunRecord``);
- ``spans.jsonl``: one ``MeasuredSpan`` a line, each the operation the executor
  timed (its fields as ``policies/ops.py`` names them, checked by ``SpanOp``),
  the placement's track, the physical device, start and end on the run's clock
  and the prompt batch;
- ``acceptance.jsonl``: one Verify or Outcome line a step
  (``policies.traces.VerifyLine``, ``EventLine``);
- ``trace.json``: the spans as a Chrome trace (``policies.runs.files``);
- ``baseline-spans.jsonl`` (named by the record's ``baseline_spans``, only in a
  run that decoded its AR baseline beside the schedule): the baseline's spans,
  in the same form, its prompt batches laid end to end on their own clock.
  Calibration fits them with the run's own (``hetspec calibrate
  --pace-per-run``): the baseline's passes ran in the same processes, in the
  same state of the machine, as the schedule's.

``MeasuredSpan`` is the one span of a measured run: the executor builds it,
``write_measured_run`` writes it, ``read_measured_spans`` reads it back, and
``as_span`` gives the ``Span`` every timeline (simulated or measured) is made of.

Versions: a record names its schema and is read by it (``READERS``). The
format on disk is the same since ``hetspec.run/1``; span lines of the first
runs of that version lack ``name``, ``kind`` and ``device``: ``from_line``
upgrades them (name and kind from their operation, ``track`` its device). A
record of any other schema is refused in one sentence naming what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from hwprofiles.writing import atomic_write_text
from policies import ops
from policies.runs.files import RUN_SCHEMA, Span, write_chrome_trace, write_record
from policies.traces import MAX_SPANS_BYTES, field_error, read_jsonl

RECORD_FILE, SPANS_FILE = "record.json", "spans.jsonl"
ACCEPTANCE_FILE, TRACE_FILE = "acceptance.jsonl", "trace.json"
BASELINE_SPANS_FILE = "baseline-spans.jsonl"
CORRUPT = "so the run is corrupt or was not written by 'hetspec run'; record it again"


@dataclass(frozen=True, slots=True)
class MeasuredSpan:
    """One operation the executor timed: ``op`` (its fields, ``type`` first, as
    ``policies/ops.py`` names them, with what the executor counted: ``n_fed``,
    ``caught_up``, ...), the placement's track (``device``; ``None`` in the first
    runs of ``hetspec.run/1``, which recorded none: see ``track``), the device it ran on
    (``physical``: ``cpu:1``, or ``src->dst`` for a link), the span's ``kind`` and
    ``name``, start and end in seconds on the run's clock, and its prompt batch
    (``None`` while a batch decodes, and in runs that recorded none)."""

    op: dict
    device: str | None
    physical: str | None
    kind: str
    name: str
    start_s: float
    end_s: float
    prompt_batch: int | None = None

    @property
    def type(self) -> str:
        """The operation's type (``Forward``, ``Verify``, ...)."""
        return self.op["type"]

    @property
    def track(self) -> str:
        """Where the span ran, as the simulator names it: the recorded track, else
        (an older line) its operation's device."""
        return self.device or self.op.get("device") or "?"

    @property
    def batch(self) -> int:
        """The prompt batch (0 in a run that recorded none)."""
        return self.prompt_batch or 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def shifted(self, offset_s: float, prompt_batch: int) -> MeasuredSpan:
        """This span on the run's clock: its batch started ``offset_s`` in."""
        return replace(self, start_s=self.start_s + offset_s, end_s=self.end_s + offset_s,
                       prompt_batch=prompt_batch)

    def line(self) -> dict:
        """The ``spans.jsonl`` object, keys in the order the file holds them."""
        out = {"op": self.op, "device": self.device}
        if self.physical is not None:
            out["physical"] = self.physical
        out.update({"kind": self.kind, "name": self.name, "start_s": self.start_s,
                    "end_s": self.end_s})
        if self.prompt_batch is not None:
            out["prompt_batch"] = self.prompt_batch
        return out

    @classmethod
    def from_line(cls, line: dict) -> MeasuredSpan:
        """A ``spans.jsonl`` object (checked by ``SpanLine``) as a span; a line
        without ``name`` or ``kind`` (the first runs of ``hetspec.run/1``) takes
        them from its operation (its label or type; compute)."""
        op = line.get("op", {})
        return cls(op, line.get("device"), line.get("physical"),
                   line.get("kind") or "compute",
                   line.get("name") or op.get("label") or op["type"],
                   float(line["start_s"]), float(line["end_s"]), line.get("prompt_batch"))

    def as_span(self, offset_s: float = 0.0, *, physical: bool = False) -> Span:
        """The timeline's ``Span``, shifted by ``offset_s``; on the placement's
        track, as the simulator names it, or with ``physical`` on the device it
        ran on (``gpu0 (cuda:0)``), as measured traces show it."""
        device = (f"{self.track} ({self.physical})" if physical and self.physical is not None
                  else self.track)
        return Span(self.name, self.kind, device, self.start_s + offset_s,
                    self.end_s + offset_s)


def op_fields(op, **extra) -> dict:
    """An operation's fields as a span records them: its type, then a Forward's parts
    as the flat fields run records keep (``Forward.record``), any other operation's
    every field of plain data (a tuple of numbers as a list), then what the executor
    adds."""
    fields = {"type": type(op).__name__}
    if isinstance(op, ops.Forward):
        fields.update(op.record())
    else:
        for name in op.__slots__:
            value = getattr(op, name)
            if isinstance(value, (int, float, str, bool, type(None))):
                fields[name] = value
            elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
                fields[name] = list(value)
    fields.update(extra)
    return fields


# --- writing ---------------------------------------------------------------------------

def write_measured_run(run_dir: Path, inputs: dict, metrics: dict, batches: list,
                       outputs, texts, baseline: list | None = None) -> Path:
    """Write a measured run's files; ``batches``: per prompt batch, in decoding
    order, (wall seconds, its spans, its acceptance lines), each on the batch's
    own clock; ``baseline``: the same for the AR baseline decoded beside it, if
    any (its spans only are kept). The record is written last; returns its path."""
    spans, acceptance = end_to_end(batches)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / SPANS_FILE, spans_text(spans))
    atomic_write_text(run_dir / ACCEPTANCE_FILE,
                      "".join(json.dumps(a) + "\n" for a in acceptance))
    files = {"spans": SPANS_FILE, "trace": TRACE_FILE, "acceptance_trace": ACCEPTANCE_FILE}
    if baseline:
        atomic_write_text(run_dir / BASELINE_SPANS_FILE, spans_text(end_to_end(baseline)[0]))
        files["baseline_spans"] = BASELINE_SPANS_FILE
    write_chrome_trace(run_dir / TRACE_FILE, [s.as_span(physical=True) for s in spans],
                       process=f"measured {inputs['policy']}", metadata=inputs)
    return write_record(run_dir / RECORD_FILE, kind="measured", inputs=inputs,
                        metrics=metrics, **files, outputs=outputs, texts=texts)


def end_to_end(batches: list) -> tuple[list[MeasuredSpan], list[dict]]:
    """The batches' spans and acceptance lines on one clock, batch after batch."""
    spans, acceptance, offset_s = [], [], 0.0
    for i, (wall_s, batch_spans, lines) in enumerate(batches):
        spans += [s.shifted(offset_s, i) for s in batch_spans]
        acceptance += [{**a, "prompt_batch": i} for a in lines]
        offset_s += wall_s
    return spans, acceptance


def spans_text(spans: list[MeasuredSpan]) -> str:
    return "".join(json.dumps(s.line()) + "\n" for s in spans)


# --- reading: the record ---------------------------------------------------------------

Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[float, Field(ge=0)]
Name = Annotated[str, Field(min_length=1)]


class _Checked(BaseModel):
    """Strict JSON types: no bool for an int, no "5" for a number, no NaN."""

    model_config = ConfigDict(frozen=True, strict=True, allow_inf_nan=False, extra="allow")


class RunInputs(_Checked):
    platform: Name
    target: Name
    draft: Name | None = None
    policy: Name
    params: dict[str, Any] = {}
    tokens: Positive | None = None
    batch: Positive = 1
    seed: int = 0
    prompt_tokens: Count | None = None
    fixed_context: bool = False
    contention: bool = False
    placement: dict[str, str] = {}
    max_new_tokens: Positive | None = None


class RunMetrics(_Checked):
    tokens: Positive
    steps: Positive
    tokens_per_s: NonNegative
    step_latency_s: NonNegative
    wall_s: NonNegative | None = None
    simulated_time_s: NonNegative | None = None  # records before wall_s


class RunRecord(_Checked):
    kind: Literal["measured"]
    inputs: RunInputs
    metrics: RunMetrics
    spans: Name
    acceptance_trace: Name | None = None
    baseline_spans: Name | None = None


def _read_v1(record: dict, path: Path) -> dict:
    """A ``hetspec.run/1`` record, checked (its span lines upgrade as they are read)."""
    try:
        RunRecord.model_validate(record)
    except ValidationError as exc:
        raise ValueError(f"run record {path}: {field_error(exc)}, {CORRUPT}") from None
    return record


READERS = {RUN_SCHEMA: _read_v1}  # schema -> reader of a measured record of it


def check_measured_record(record: dict, path: Path) -> dict:
    """The record, read by its schema's reader; a schema no reader reads is refused."""
    schema = record.get("schema")
    reader = READERS.get(schema)
    if reader is None:
        raise ValueError(f"run record {path} is of schema {schema!r}, which this hetspec "
                         f"does not read (it reads {', '.join(READERS)}); record the run "
                         "again with 'hetspec run', or read it with the hetspec that "
                         "wrote it")
    return reader(record, path)


# --- reading: the spans ----------------------------------------------------------------

# Fields an operation of each type must carry for a replay or a fit to read it.
REQUIRED_OP_FIELDS = {"Forward": ("model", "device", "layers"),
                      "StreamWeights": ("model", "device", "layers", "nbytes"),
                      "Transfer": ("src", "dst", "nbytes"),
                      "AllReduce": ("group", "nbytes")}


# The operations of the schedule vocabulary (policies/ops.py) a runtime times.
OP_TYPES = tuple(cls.__name__ for cls in (ops.Forward, ops.Transfer, ops.AllReduce,
                                          ops.StreamWeights, ops.Verify, ops.Outcome,
                                          ops.Delay, ops.Lookup))


class SpanOp(_Checked):
    """The operation a span timed (``op_fields``)."""

    type: Name
    model: str | None = None
    device: str | None = None
    src: str | None = None
    dst: str | None = None
    group: str | None = None
    label: str | None = None
    head: str | None = None
    emit: str | None = None
    layers: Annotated[list[Count], Field(min_length=2, max_length=2)] | None = None
    n_tokens: Count | None = None
    n_fed: Count | None = None
    context: Count | None = None
    context_measured: Count | None = None
    batch: Positive | None = None
    head_tokens: Positive | None = None
    collectives: Count | None = None
    count: Count | None = None
    gamma: Count | None = None
    nbytes: NonNegative | None = None

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in OP_TYPES:
            raise ValueError(f"no operation of the schedule vocabulary is called that "
                             f"(policies/ops.py times {', '.join(OP_TYPES)})")
        return value

    @model_validator(mode="after")
    def _complete(self):
        missing = [f for f in REQUIRED_OP_FIELDS.get(self.type, ())
                   if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} needs '{missing[0]}'")
        if self.layers is not None and self.layers[0] > self.layers[1]:
            raise ValueError(f"layers {self.layers} run backwards")
        return self


class SpanLine(_Checked):
    """A ``spans.jsonl`` line as the file holds it (``MeasuredSpan.line``)."""

    model_config = ConfigDict(extra="forbid")

    op: SpanOp
    start_s: float
    end_s: float
    device: str | None = None
    physical: str | None = None
    kind: str | None = None
    name: str | None = None
    prompt_batch: Count = 0

    @model_validator(mode="after")
    def _ordered(self):
        if self.end_s < self.start_s:
            raise ValueError(f"it ends at {self.end_s} s, before it starts at "
                             f"{self.start_s} s")
        return self


def _check_span(line: dict, n: int, path: Path) -> None:
    try:
        SpanLine.model_validate(line)
    except ValidationError as exc:
        raise ValueError(f"{path} line {n}: {field_error(exc)}, {CORRUPT}") from None


def read_measured_spans(path: Path) -> list[tuple[int, MeasuredSpan]]:
    """(line number, span) of every line of a spans.jsonl, each checked
    (``SpanLine``) in file order; an empty file is refused: a run times at
    least one operation."""
    lines = read_jsonl(path, "spans file", "re-run 'hetspec run' to write it again",
                       MAX_SPANS_BYTES, check=lambda line, n: _check_span(line, n, path))
    if not lines:
        raise ValueError(f"the spans file {path} holds no spans, {CORRUPT}")
    return [(n, MeasuredSpan.from_line(line)) for n, line in lines]
