"""Measured runs: reading them, and re-simulating them with their own outcomes.

A measured run (``hetspec run --json``) is a directory holding ``record.json``,
``spans.jsonl`` (one measured operation a line), ``trace.json`` and
``acceptance.jsonl``. ``replay`` simulates the same configuration on a profile
with the run's recorded acceptance lengths and Outcome events, so the two
timelines differ only where the cost model does.
"""

from __future__ import annotations

import json
import math

import numpy as np
from dataclasses import dataclass, field
from pathlib import Path

from analyses.config import SimConfig
from hwprofiles import load_model, load_platform
from simcore import Outcomes
from simcore.records import read_record

RUN_FIELDS = ("platform", "target", "draft", "policy", "params", "tokens", "batch", "seed",
              "prompt_tokens", "fixed_context", "contention", "placement")


@dataclass
class MeasuredRun:
    """One measured run: its record, spans and recorded outcomes."""

    path: Path
    record: dict
    spans: list[dict]
    acceptance_path: Path | None
    events: list[dict] = field(default_factory=list)

    @property
    def inputs(self) -> dict:
        return self.record["inputs"]

    @property
    def metrics(self) -> dict:
        return self.record["metrics"]

    @property
    def name(self) -> str:
        return self.path.parent.name if self.path.name == "record.json" else self.path.stem

    @property
    def policy(self) -> str:
        return self.inputs.get("policy", "?")


def _jsonl(path: Path, what: str) -> list[dict]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"the {what} file {path} cannot be read ({exc.strerror}); "
                         "re-run 'hetspec run' to write it again") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise ValueError(f"line {n} of {path} is not a JSON object, so the {what} file "
                             "is corrupt; re-run 'hetspec run' to write it again")
        out.append(obj)
    return out


def _check_span(span: dict, path: Path, n: int) -> dict:
    ok = (isinstance(span.get("op"), dict) and "type" in span["op"]
          and all(isinstance(span.get(k), (int, float)) for k in ("start_s", "end_s")))
    if not ok or span["end_s"] < span["start_s"]:
        raise ValueError(f"span {n} of {path} lacks op/start_s/end_s or ends before it "
                         "starts; the run is corrupt, re-run 'hetspec run'")
    return span


def load_run(path) -> MeasuredRun:
    """Read a measured run from its record.json (or the directory holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "record.json"
    if not path.is_file():
        raise ValueError(f"no run record at {path}; pass the run_record path that "
                         "'hetspec run --json' printed")
    record = read_record(path)
    if record.get("kind") != "measured":
        raise ValueError(f"{path} is a {record.get('kind')} record, not a measured run; "
                         "pass a record written by 'hetspec run'")
    for key in ("inputs", "metrics"):
        if not isinstance(record.get(key), dict):
            raise ValueError(f"{path} has no '{key}' object; the record is corrupt")
    if not record.get("spans"):
        raise ValueError(f"{path} names no spans file; re-run 'hetspec run' to record one")
    spans_path = path.parent / record["spans"]
    spans = [_check_span(s, spans_path, n)
             for n, s in enumerate(_jsonl(spans_path, "spans"), 1)]
    acc_path, events = None, []
    if record.get("acceptance_trace"):
        acc_path = path.parent / record["acceptance_trace"]
        lines = _jsonl(acc_path, "acceptance")
        events = [d for d in lines if "event" in d and "accepted" not in d]
    return MeasuredRun(path, record, spans, acc_path, events)


def find_runs(directory) -> list[Path]:
    """The measured run records under a directory, in name order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--runs {directory} is not a directory; pass the folder that "
                         "'hetspec run --out' wrote runs into")
    found = sorted(directory.rglob("record.json"))
    if not found:
        raise ValueError(f"no run records (record.json) under {directory}; record runs "
                         "with 'hetspec run ... --out DIR/NAME' first")
    return found


class ReplayOutcomes(Outcomes):
    """Outcome events come back in the order the run recorded them; accepted
    lengths come from the acceptance model (the run's own trace)."""

    def __init__(self, acc, *, events: list[dict] = (), **kwargs):
        super().__init__(acc, **kwargs)
        self._queues: dict[str, list[bool]] = {}
        for e in events:
            self._queues.setdefault(str(e["event"]), []).append(bool(e.get("held")))

    def outcome(self, op) -> bool:
        queue = self._queues.get(op.event)
        if not queue:
            return super().outcome(op)
        held = queue.pop(0)
        self.asked[op.event] = self.asked.get(op.event, 0) + 1
        self.held[op.event] = self.held.get(op.event, 0) + int(held)
        return held


def replay_config(run: MeasuredRun, profile: str | None = None) -> SimConfig:
    """The SimConfig that re-simulates a run on ``profile`` (default: its own)."""
    fields = {k: run.inputs[k] for k in RUN_FIELDS if k in run.inputs}
    if profile is not None:
        fields["platform"] = str(profile)
    if "platform" not in fields or "target" not in fields:
        raise ValueError(f"{run.path} does not say its platform and target in 'inputs'; "
                         "the record is corrupt")
    tokens = run.metrics.get("tokens")
    if isinstance(tokens, (int, float)) and tokens > 0:  # what was really generated
        fields["tokens"] = max(1, math.ceil(tokens / fields.get("batch", 1)))
    if run.acceptance_path is not None:
        fields["acceptance"] = {"kind": "trace", "path": str(run.acceptance_path)}
    starts = _prompt_contexts(run)
    if starts:  # the contexts the runs' prompts really started decoding at
        fields["prompt_tokens"] = round(sum(starts) / len(starts))
    return SimConfig(**fields)


def _prompt_contexts(run: MeasuredRun) -> list[int]:
    """The context of the first target Forward of each prompt the run decoded."""
    first: dict = {}
    for span in run.spans:
        op = span["op"]
        if op["type"] == "Forward" and op.get("model") == "target":
            first.setdefault(span.get("prompt_batch", 0), op.get("context"))
    return [c for c in first.values() if isinstance(c, int)]


def check_run_fits(run: MeasuredRun, platform_name: str) -> None:
    """Raise one sentence when a run was measured on other hardware than the
    profile names, or its spans do not fit the models its inputs name."""
    measured_on = run.inputs.get("platform")
    if measured_on is not None and load_platform(measured_on).name != platform_name:
        raise ValueError(f"run {run.name} was measured on platform "
                         f"'{load_platform(measured_on).name}', not '{platform_name}'; "
                         f"pass --profile {measured_on} or a profile calibrated from it")
    models = {"target": load_model(run.inputs["target"])}
    if run.inputs.get("draft"):
        models["draft"] = load_model(run.inputs["draft"])
    for span in run.spans:
        op = span["op"]
        if op["type"] not in ("Forward", "StreamWeights"):
            continue
        spec = models.get(op.get("model"))
        layers = op.get("layers") or [0, 0]
        if spec is None or layers[1] > spec.n_layers:
            raise ValueError(
                f"run {run.name} has a {op['type']} over layers {layers} of "
                f"'{op.get('model')}', which its models "
                f"({', '.join(f'{r}={s.name}' for r, s in models.items())}) do not have; "
                "the record comes from another model, so measure it again")


@dataclass
class Replay:
    """A measured run beside its simulation on a profile."""

    label: str
    policy: str
    measured: dict
    predicted: dict
    measured_spans: list[tuple]
    predicted_spans: list[tuple]
    config: SimConfig
    sim_spans: list = field(default_factory=list, repr=False)  # the whole simulation
    median_step_error: float | None = None

    def errors(self) -> dict[str, float]:
        """Relative errors predicted/measured - 1 of the shared timing metrics, and
        the median over steps of the per-step latency error when steps line up."""
        out = {} if self.median_step_error is None else {
            "median_step_latency": self.median_step_error}
        for key in ("tokens_per_s", "step_latency_s", "simulated_time_s"):
            m, p = self.measured.get(key), self.predicted.get(key)
            if isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0:
                out[key] = p / m - 1.0
        return out


def measured_span_tuples(run: MeasuredRun) -> list[tuple]:
    return [(s.get("name") or s["op"].get("label") or s["op"]["type"],
             s.get("kind", "compute"), s.get("device", s["op"].get("device", "?")),
             float(s["start_s"]), float(s["end_s"])) for s in run.spans]


def measured_steps(run: MeasuredRun) -> tuple[list[float], set[str]]:
    """Per-step latencies of a run whose spans include its Verify operations, and
    the names of the spans that end a step (the Forward each Verify follows)."""
    out, names = [], set()
    start, batch, last_forward = None, None, None
    for span in run.spans:
        if span.get("prompt_batch", 0) != batch:
            batch, start = span.get("prompt_batch", 0), float(span["start_s"])
        if span["op"]["type"] == "Forward":
            last_forward = span.get("name") or span["op"].get("label")
        elif span["op"]["type"] == "Verify":
            out.append(float(span["end_s"]) - start)
            start = float(span["end_s"])
            if last_forward:
                names.add(last_forward)
    return out, names


def simulated_steps(spans, names: set[str]) -> list[float]:
    """Per-step latencies of a sequential simulation: the step-ending spans' ends."""
    ends = [s.end_s for s in spans if s.name in names and s.kind == "compute"]
    return [b - a for a, b in zip([0.0] + ends[:-1], ends)]


def step_error(run: MeasuredRun, sim_spans) -> float | None:
    """Median over steps of simulated/measured - 1, when the steps line up."""
    measured, names = measured_steps(run)
    simulated = simulated_steps(sim_spans, names) if names else []
    if not measured or len(simulated) != len(measured):
        return None
    return float(np.median(np.array(simulated) / np.array(measured) - 1.0))


def _first_steps(spans: list[tuple], step_s: float, steps: int) -> list[tuple]:
    return [s for s in spans if s[3] < steps * step_s]


def replay(run: MeasuredRun, profile: str | None = None, *, steps: int = 4) -> Replay:
    """Re-simulate a measured run with its own acceptance trace and events."""
    from analyses.api import metrics_of, run_schedule

    config = replay_config(run, profile)
    check_run_fits(run, load_platform(config.platform).name)

    def factory(acc, **kwargs):
        return ReplayOutcomes(acc, events=run.events, **kwargs)

    result = run_schedule(config, outcomes_factory=factory)
    predicted = metrics_of(config, result)
    spans = [tuple(s[:5]) for s in result.spans]
    return Replay(f"{run.name} ({run.policy})", run.policy, dict(run.metrics), predicted,
                  _first_steps(measured_span_tuples(run), run.metrics.get(
                      "step_latency_s", predicted["step_latency_s"]), steps),
                  _first_steps(spans, predicted["step_latency_s"], steps), config,
                  result.spans, step_error(run, result.spans))


def replay_dir(directory, profile: str | None = None) -> list[Replay]:
    return [replay(load_run(p), profile) for p in find_runs(directory)]


def side_by_side_trace(rep: Replay, run: MeasuredRun) -> dict:
    """One Chrome trace: the measured run as process 1, the simulation as 2."""
    from simcore.trace import Span, chrome_trace

    measured = chrome_trace([Span(*t) for t in measured_span_tuples(run)],
                            process=f"measured {rep.label}")
    simulated = chrome_trace(rep.sim_spans, process=f"simulated on {rep.config.platform}")
    for event in simulated["traceEvents"]:
        event["pid"] = 2
    return {"traceEvents": measured["traceEvents"] + simulated["traceEvents"],
            "displayTimeUnit": "ms",
            "otherData": {"run": str(run.path), "profile": rep.config.platform}}
