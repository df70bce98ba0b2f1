"""Measured runs: reading them, and re-simulating them with their own outcomes.

A measured run (``hetspec run --json``) is a directory holding ``record.json``,
``spans.jsonl`` (one measured operation a line), ``trace.json`` and
``acceptance.jsonl``. ``replay`` simulates the same configuration on a profile
with the run's recorded acceptance lengths and Outcome events, one simulation
per prompt batch the executor decoded (each from its own prompt length, with
its own lines of the trace), so the two timelines differ only where the cost
model does, or where the executor did other work than the schedule asked.
A replay always fair-shares a memory tier among the devices reading it at
once (``contention``): the measured devices did share it (on cpu-local, a
PPSD run's two stages replay at +39.9% tokens/s error without it, -2.8% with).

``work="executor"`` also gives each simulated Forward the work the executor
really did for it (``ExecutorWork``): the positions it fed (``n_fed``: a draft
catching up on the bonus token, a speculation tree's first pass re-feeding its
rows' prefixes) and, for a sampled Forward of k tokens, k passes (the executor
has no multi-token heads). Comparing the two modes measures what that extra
work costs; what remains is the cost model's error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analyses.measured.evidence import check_evidence, run_platform
from analyses.measured.executorwork import ExecutorWork, STEP_END
from analyses.measured.runrecord import check_record, run_file
from analyses.run.api import baseline_config, metrics_of, run_schedule
from analyses.run.config import RunConfig
from hwprofiles import load_model, load_platform
from hwprofiles.writing import scratch_dir
from policies.base import baseline_of
from policies.runs.files import Span, chrome_trace, read_record
from policies.runs.metrics import add_speedup, elapsed_s
from policies.runs.measured import MeasuredSpan, read_measured_spans
from policies.traces import held_rows, numbered_acceptance
from simcore import Outcomes
from simcore.acceptance import default as acceptance_default

IID_DEFAULT = acceptance_default()

RUN_FIELDS = ("platform", "target", "draft", "policy", "params", "tokens", "batch", "seed",
              "prompt_tokens", "fixed_context", "contention", "placement")
WORK = ("schedule", "executor")


@dataclass
class MeasuredRun:
    """One measured run: its record, spans and acceptance-trace lines (with the
    line numbers of both files), and the platform it was measured on (a shipped
    name or a profile file inside its directory)."""

    path: Path
    record: dict
    spans: list[MeasuredSpan]
    acceptance_path: Path | None
    lines: list[dict] = field(default_factory=list)
    spans_path: Path | None = None
    span_lines: list[int] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)
    platform: str | None = None
    baseline_spans: list[MeasuredSpan] = field(default_factory=list)  # its AR rounds'

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

    @property
    def events(self) -> list[dict]:
        return [d for d in self.lines if "event" in d and "accepted" not in d]

    def batches(self) -> list[int]:
        """The prompt batches the executor decoded one after another."""
        return sorted({s.batch for s in self.spans} |
                      {d.get("prompt_batch", 0) for d in self.lines})

    def batched(self) -> bool:
        """Whether the run recorded the prompt batch of its spans (older runs did not)."""
        return any(s.prompt_batch is not None for s in self.spans)


def load_run(path) -> MeasuredRun:
    """Read a measured run from its record.json (or the directory holding it),
    checking the record, every span and every acceptance line
    (``analyses.measured.runrecord``, ``policies.traces.read_acceptance``), then
    the files against each other (``analyses.measured.evidence``): every reader
    of measured runs comes through here."""
    path = Path(path)
    if path.is_dir():
        path = path / "record.json"
    if not path.exists():
        raise ValueError(f"no run record at {path}; pass the run_record path that "
                         "'hetspec run --json' printed")
    record = read_record(path)  # a pipe or a device is named as such, never opened
    if record.get("kind") != "measured":
        raise ValueError(f"{path} is a {record.get('kind')} record, not a measured run; "
                         "pass a record written by 'hetspec run'")
    check_record(record, path)
    platform = run_platform(record, path)
    spans_path = run_file(path.parent, record["spans"], "spans", path)
    spans = read_measured_spans(spans_path)
    acc_path, lines = None, []
    if record.get("acceptance_trace"):
        acc_path = run_file(path.parent, record["acceptance_trace"], "acceptance_trace",
                            path)
        lines = numbered_acceptance(acc_path, "acceptance file",
                                    "re-run 'hetspec run' to write it again")
    baseline = []
    if record.get("baseline_spans"):
        baseline = [s for _, s in read_measured_spans(run_file(
            path.parent, record["baseline_spans"], "baseline_spans", path))]
    run = MeasuredRun(path, record, [s for _, s in spans], acc_path, [d for _, d in lines],
                      spans_path, [n for n, _ in spans], [n for n, _ in lines], platform,
                      baseline)
    check_evidence(run)
    return run


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


def model_name(run: MeasuredRun, role: str) -> str | None:
    """A run's model by shipped name or spec path; a spec YAML the record names is
    looked for beside the record when the run directory was moved."""
    name = run.inputs.get(role)
    if name and str(name).endswith((".yaml", ".yml")) and not Path(name).is_file():
        moved = run.path.parent / "models" / Path(name).name
        return str(moved) if moved.is_file() else name
    return name


class ReplayOutcomes(Outcomes):
    """Outcome events come back in the order the run recorded them; accepted
    lengths come from the acceptance model (the run's own trace)."""

    def __init__(self, acc, *, events: list[dict] = (), **kwargs):
        super().__init__(acc, **kwargs)
        self._queues: dict[str, list[tuple[bool, ...]]] = {}
        for e in events:  # lines read_acceptance checked: 'held' is there
            self._queues.setdefault(e["event"], []).append(tuple(held_rows(e)))

    def outcome(self, op) -> bool | tuple[bool, ...]:
        """The recorded answer: per row where the op asks per row and the run
        recorded as many rows, else whether every row held."""
        queue = self._queues.get(op.event)
        if not queue:
            return super().outcome(op)
        rows = queue.pop(0)
        if op.per_row and len(rows) == op.batch:
            self.asked[op.event] = self.asked.get(op.event, 0) + op.batch
            self.held[op.event] = self.held.get(op.event, 0) + sum(rows)
            return rows
        held = all(rows)
        self.asked[op.event] = self.asked.get(op.event, 0) + 1
        self.held[op.event] = self.held.get(op.event, 0) + int(held)
        return (held,) * op.batch if op.per_row else held


def _batch_spans(run: MeasuredRun, batch: int) -> list[MeasuredSpan]:
    return [s for s in run.spans if s.batch == batch]


def replay_config(run: MeasuredRun, profile: str | None = None, batch: int | None = None,
                  trace_path: str | None = None) -> RunConfig:
    """The RunConfig that re-simulates a run (or one prompt batch of it) on
    ``profile`` (default: its own platform)."""
    fields = {k: run.inputs[k] for k in RUN_FIELDS if k in run.inputs}
    if run.platform is not None:  # a profile file: the one inside the run directory
        fields["platform"] = run.platform
    # measured devices that read one memory tier at once really share it
    fields["contention"] = True
    for role in ("target", "draft"):
        if fields.get(role):
            fields[role] = model_name(run, role)
    if profile is not None:
        fields["platform"] = str(profile)
    if "platform" not in fields or "target" not in fields:
        raise ValueError(f"{run.path} does not say its platform and target in 'inputs'; "
                         "the record is corrupt")
    spans = run.spans if batch is None else _batch_spans(run, batch)
    budget = run.inputs.get("max_new_tokens") if batch is not None else None
    tokens = run.metrics.get("tokens")
    if budget:  # the executor's per-row budget for each prompt batch
        fields["tokens"] = int(budget)
    elif isinstance(tokens, (int, float)) and tokens > 0:  # what was really generated
        fields["tokens"] = max(1, math.ceil(tokens / fields.get("batch", 1)))
    if trace_path or run.acceptance_path is not None:
        fields["acceptance"] = {"kind": "trace",
                                "path": str(trace_path or run.acceptance_path)}
    starts = _prompt_contexts(spans)
    if starts:  # the contexts the prompts really started decoding at
        fields["prompt_tokens"] = round(sum(starts) / len(starts))
    return RunConfig(**fields)


def _prompt_contexts(spans: list[MeasuredSpan]) -> list[int]:
    """The context of the first target Forward of each prompt batch."""
    first: dict = {}
    for span in spans:
        op = span.op
        if op["type"] == "Forward" and op.get("model") == "target":
            first.setdefault(span.batch, op.get("context"))
    return [c for c in first.values() if isinstance(c, int)]


def check_run_fits(run: MeasuredRun, platform_name: str) -> None:
    """Raise one sentence when a run was measured on other hardware than the
    profile names, or its spans do not fit the models its inputs name."""
    measured_on = run.platform or run.inputs.get("platform")
    if measured_on is not None and load_platform(measured_on).name != platform_name:
        raise ValueError(f"run {run.name} was measured on platform "
                         f"'{load_platform(measured_on).name}', not '{platform_name}'; "
                         f"pass --profile {measured_on} or a profile calibrated from it")
    models = {"target": load_model(model_name(run, "target"))}
    if run.inputs.get("draft"):
        models["draft"] = load_model(model_name(run, "draft"))
    for span in run.spans:
        op = span.op
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
    measured_spans: list[Span]
    predicted_spans: list[Span]
    config: RunConfig
    sim_spans: list = field(default_factory=list, repr=False)  # all batches, in order
    median_step_error: float | None = None
    work: str = "schedule"

    def errors(self) -> dict[str, float]:
        """Relative errors predicted/measured - 1 of the shared timing metrics, and
        the median over steps of the per-step latency error when steps line up."""
        out = {} if self.median_step_error is None else {
            "median_step_latency": self.median_step_error}
        for key in ("speedup_vs_ar", "tokens_per_s", "step_latency_s", "simulated_time_s",
                    "mean_tokens_per_step"):
            m, p = self.measured.get(key), self.predicted.get(key)
            if key == "simulated_time_s":  # the run's time: measured wall time
                m = elapsed_s(self.measured)
            if isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0:
                out[key] = p / m - 1.0
        return out


def measured_steps(spans: list[MeasuredSpan]) -> list[float]:
    """Per-step latencies of one prompt batch: from its first span to the end of
    its first Verify, then from Verify end to Verify end."""
    if not spans:
        return []
    start = min(s.start_s for s in spans)
    ends = sorted(s.end_s for s in spans if s.type == "Verify")
    return [b - a for a, b in zip([start] + ends[:-1], ends)]


def simulated_steps(spans) -> list[float]:
    """Per-step latencies of a simulation: between its step-end markers."""
    ends = [s.end_s for s in spans if s.name == STEP_END and s.kind == "delay"]
    return [b - a for a, b in zip([0.0] + ends[:-1], ends)]


def _first_steps(spans: list[Span], step_s: float, steps: int) -> list[Span]:
    return [s for s in spans if s.start_s < steps * step_s]


def _simulate_batch(run: MeasuredRun, profile, batch: int | None, work: str):
    """(config, SimResult, measured step latencies, simulated ones) of one batch."""
    spans = run.spans if batch is None else _batch_spans(run, batch)
    lines = run.lines if batch is None else [
        d for d in run.lines if d.get("prompt_batch", 0) == batch]
    with scratch_dir("replay") as tmp:  # a killed replay's leftover goes next time
        trace = None
        if batch is not None and any("accepted" in d for d in lines):
            trace = tmp / "acceptance.jsonl"
            trace.write_text("".join(json.dumps(d) + "\n" for d in lines))
        config = replay_config(run, profile, batch, trace and str(trace))
        events = [d for d in lines if "event" in d and "accepted" not in d]

        def factory(acc, **kwargs):
            return ReplayOutcomes(acc, events=events, **kwargs)

        rewrite = ExecutorWork(spans, rewrite=work == "executor").wrap
        result = run_schedule(config, outcomes_factory=factory, rewrite=rewrite)
    return config, result, measured_steps(spans), simulated_steps(result.spans)


def replay(run: MeasuredRun, profile: str | None = None, *, steps: int = 4,
           work: str = "schedule") -> Replay:
    """Re-simulate a measured run with its own acceptance trace and events, one
    simulation per prompt batch (``work``: see the module doc)."""
    if work not in WORK:
        raise ValueError(f"work must be one of {', '.join(WORK)}, not '{work}'")
    check_run_fits(run, load_platform(profile or run.platform
                                      or run.inputs.get("platform")).name)
    parts = [_simulate_batch(run, profile, b, work)
             for b in (run.batches() if run.batched() else [None])]
    sim_spans, offset_s, measured, simulated = [], 0.0, [], []
    for _, result, steps_m, steps_s in parts:
        sim_spans += [x._replace(start_s=x.start_s + offset_s, end_s=x.end_s + offset_s)
                      for x in result.spans if x.name != STEP_END]
        offset_s += result.time_s
        measured, simulated = measured + steps_m, simulated + steps_s
    predicted = _predicted(run, parts, offset_s, metrics_of)
    _add_predicted_speedup(predicted, [config for config, *_ in parts])
    step_error = _median_error(measured, simulated)
    config = parts[0][0]
    return Replay(f"{run.name} ({run.policy})", run.policy, dict(run.metrics), predicted,
                  _first_steps([s.as_span() for s in run.spans], run.metrics.get(
                      "step_latency_s", predicted["step_latency_s"]), steps),
                  _first_steps(sim_spans, predicted["step_latency_s"], steps),
                  config, sim_spans, step_error, work)


def _median_error(measured: list[float], simulated: list[float]) -> float | None:
    """The median of simulated/measured - 1 over the steps that line up and took
    time (a step of zero measured time has no relative error)."""
    if not measured or len(simulated) != len(measured):
        return None
    pairs = [(s, m) for s, m in zip(simulated, measured) if m > 0 and math.isfinite(s)]
    return float(np.median([s / m - 1.0 for s, m in pairs])) if pairs else None


def _predicted(run: MeasuredRun, parts, time_s: float, metrics_of) -> dict:
    """The simulation's metrics over all batches. When it ran the measured number
    of steps (the same work), tokens/s counts the tokens the run kept."""
    first = metrics_of(parts[0][0], parts[0][1])
    steps = sum(r.stats.get("steps", r.steps) for _, r, _, _ in parts)
    tokens = sum(r.tokens for _, r, _, _ in parts)
    kept = run.metrics.get("tokens")
    if steps == run.metrics.get("steps") and isinstance(kept, (int, float)):
        tokens = kept
    batch = parts[0][0].batch
    out = {**first, "tokens": tokens, "simulated_time_s": time_s, "steps": steps,
           "tokens_per_s": tokens / time_s if time_s else 0.0,
           "step_latency_s": time_s / max(steps, 1),
           "mean_tokens_per_step": tokens / (max(steps, 1) * batch),
           "tpot_s": time_s * batch / tokens if tokens else None}
    return out


def _add_predicted_speedup(predicted: dict, configs: list[RunConfig]) -> None:
    """The simulated speedup over AR: the prompt batches' baselines simulated on the
    same profile (each from its own prompt length), their tokens over their time."""
    if baseline_of(configs[0].policy, configs[0].params) is None:
        add_speedup(predicted, own_baseline=True)
        return
    # AR reads no acceptance (the batches' traces are gone by now)
    runs = [run_schedule(baseline_config(c.model_copy(update={"acceptance": IID_DEFAULT})),
                         record_spans=False) for c in configs]
    time_s = sum(r.time_s for r in runs)
    add_speedup(predicted, sum(r.tokens for r in runs) / time_s if time_s else None)


def replay_dir(directory, profile: str | None = None) -> list[Replay]:
    return [replay(load_run(p), profile) for p in find_runs(directory)]


def side_by_side_trace(rep: Replay, run: MeasuredRun) -> dict:
    """One Chrome trace: the measured run as process 1, the simulation as 2."""
    measured = chrome_trace([s.as_span() for s in run.spans],
                            process=f"measured {rep.label}")
    simulated = chrome_trace(rep.sim_spans, process=f"simulated on {rep.config.platform}")
    for event in simulated["traceEvents"]:
        event["pid"] = 2
    return {"traceEvents": measured["traceEvents"] + simulated["traceEvents"],
            "displayTimeUnit": "ms",
            "otherData": {"run": str(run.path), "profile": rep.config.platform}}
