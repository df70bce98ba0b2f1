"""What a measured run's files must hold, checked once when the run is loaded.

``hetspec run`` writes ``record.json`` (inputs, metrics, and the names of its
``spans.jsonl`` and ``acceptance.jsonl`` beside it). A record or spans file that
is not what the executor writes (a hand edit, a truncated copy, a file from
elsewhere) is refused here with one sentence naming the file, the field (and
the span's line) and that the run is corrupt, instead of failing deep inside a
replay or a fit. The files a record names must lie inside its run directory.
The models check; the run keeps the dictionaries exactly as read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from policies import PolicyError, parse_params
from policies import ops
from policies.runs.folders import file_in_run
from policies.traces import MAX_SPANS_BYTES, field_error, read_jsonl

CORRUPT = "so the run is corrupt or was not written by 'hetspec run'; record it again"

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
    """The operation a span timed (executors/coordinate/coordinator.py ``span``)."""

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


class MeasuredSpan(_Checked):
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


def check_record(record: dict, path: Path) -> dict:
    """The record itself, once its inputs, metrics and file names are well formed."""
    try:
        RunRecord.model_validate(record)
    except ValidationError as exc:
        raise ValueError(f"run record {path}: {field_error(exc)}, {CORRUPT}") from None
    inputs = record["inputs"]
    try:  # the schedule it ran, with parameters that schedule takes
        parse_params(inputs["policy"], inputs.get("params", {}))
    except PolicyError as exc:
        raise ValueError(f"run record {path}: field 'inputs.params': {exc}, "
                         f"{CORRUPT}") from None
    return record


def run_file(run_dir: Path, name: str, field: str, record_path: Path) -> Path:
    """The file a record's ``field`` names inside its run directory
    (policies.runs.folders.file_in_run); outside it, the record is corrupt."""
    return file_in_run(run_dir, name, field, record_path, CORRUPT)


def _check_span(span: dict, n: int, path: Path) -> None:
    try:
        MeasuredSpan.model_validate(span)
    except ValidationError as exc:
        raise ValueError(f"{path} line {n}: {field_error(exc)}, {CORRUPT}") from None


def read_numbered_spans(path: Path) -> list[tuple[int, dict]]:
    """(line number, span) of every span of a spans.jsonl, each checked
    (``MeasuredSpan``) in file order; an empty file is refused: a run times at
    least one operation."""
    lines = read_jsonl(path, "spans file", "re-run 'hetspec run' to write it again",
                       MAX_SPANS_BYTES, check=lambda span, n: _check_span(span, n, path))
    if not lines:
        raise ValueError(f"the spans file {path} holds no spans, {CORRUPT}")
    return lines


def read_spans(path: Path) -> list[dict]:
    """Every span of a spans.jsonl, checked (``read_numbered_spans``)."""
    return [span for _, span in read_numbered_spans(path)]
