"""The measured-run schema (policies/runs/measured.py): one span type written by the
executor and read by replay and calibration, one record read by its version."""

import json
import shutil
from pathlib import Path

import pytest

from analyses.calibrate.terms import Terms, critical_times
from analyses.measured.replay import load_run, replay
from hwprofiles import load_platform
from hwprofiles.schema import resolve
from policies.ops import LM, SAMPLE, Forward, Transfer
from policies.runs.measured import (READERS, RUN_SCHEMA, MeasuredSpan, op_fields,
                                    read_measured_spans, write_measured_run)
from policies.runs.files import Span
from policies.traces import EventLine, VerifyLine

RUN = Path(__file__).parent / "golden" / "measured-runs" / "sd-1"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_span_line_reads_and_writes_back_unchanged():
    """Every line of a stored run becomes a MeasuredSpan and back, key for key and
    in the file's key order."""
    text = (RUN / "spans.jsonl").read_text()
    spans = read_measured_spans(RUN / "spans.jsonl")
    assert [n for n, _ in spans] == list(range(1, len(text.splitlines()) + 1))
    assert "".join(json.dumps(s.line()) + "\n" for _, s in spans) == text


def test_the_executor_span_is_the_operation_its_track_and_its_clock():
    op = Forward("draft", "draft", (0, 8), 2, 1, 10, head=LM, emit=SAMPLE, label="draft")
    span = MeasuredSpan(op_fields(op, n_fed=3), "cpu1", "cpu:1", "compute", "draft",
                        0.25, 0.75)
    assert span.op["type"] == span.type == "Forward" and span.op["layers"] == [0, 8]
    assert list(span.op)[0] == "type" and span.op["n_fed"] == 3
    assert "prompt_batch" not in span.line() and span.batch == 0
    written = span.shifted(2.0, 1)
    assert (written.start_s, written.end_s, written.prompt_batch) == (2.25, 2.75, 1)
    assert list(written.line()) == ["op", "device", "physical", "kind", "name", "start_s",
                                    "end_s", "prompt_batch"]
    assert MeasuredSpan.from_line(json.loads(json.dumps(written.line()))) == written
    assert written.as_span() == Span("draft", "compute", "cpu1", 2.25, 2.75)
    assert written.as_span(1.0, physical=True) == Span("draft", "compute", "cpu1 (cpu:1)",
                                                       3.25, 3.75)
    assert written.duration_s == 0.5


def test_a_span_line_of_the_first_runs_is_upgraded_as_it_is_read():
    """Span lines of the first hetspec.run/1 runs carry neither name, kind, device
    nor physical device: the name and kind come from the operation, and the track
    the simulator would name is the operation's device, while the recorded device
    stays unrecorded (the evidence checks only what a run recorded)."""
    old = {"op": {"type": "Transfer", "src": "draft", "dst": "target", "nbytes": 8,
                  "label": "proposal"}, "start_s": 0, "end_s": 1}
    span = MeasuredSpan.from_line(old)
    assert (span.name, span.kind, span.device, span.physical) == ("proposal", "compute",
                                                                  None, None)
    assert span.as_span() == Span("proposal", "compute", "?", 0.0, 1.0)
    forward = MeasuredSpan.from_line({"op": {"type": "Verify", "device": "target"},
                                      "start_s": 0.5, "end_s": 1.0})
    assert forward.name == "Verify" and forward.track == "target"
    assert forward.as_span(physical=True).device == "target"  # no physical device named


def test_a_written_run_is_read_back_through_the_same_schema(tmp_path):
    """write_measured_run lays the prompt batches end to end; load_run reads the same
    spans back, each on the run's clock with its batch."""
    source = load_run(RUN)
    record = source.record
    batches = {}
    for span in source.spans:
        batches.setdefault(span.batch, []).append(span)
    results = []
    for i, spans in sorted(batches.items()):
        start = min(s.start_s for s in spans)
        own = [MeasuredSpan(s.op, s.device, s.physical, s.kind, s.name, s.start_s - start,
                            s.end_s - start) for s in spans]
        lines = [{k: v for k, v in d.items() if k != "prompt_batch"}
                 for d in source.lines if d["prompt_batch"] == i]
        results.append((max(s.end_s for s in own), own, lines))
    out = tmp_path / "run"
    path = write_measured_run(out, record["inputs"], record["metrics"], results,
                              record["outputs"], record["texts"])
    assert path == out / "record.json"
    assert json.loads(path.read_text())["schema"] == RUN_SCHEMA
    back = load_run(out)
    assert len(back.spans) == len(source.spans)
    assert [(s.op, s.device, s.physical, s.kind, s.name, s.batch) for s in back.spans] == [
        (s.op, s.device, s.physical, s.kind, s.name, s.batch) for s in source.spans]
    assert [s.duration_s for s in back.spans] == pytest.approx(
        [s.duration_s for s in source.spans], abs=1e-12)
    assert back.lines == source.lines
    trace = json.loads((out / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(source.spans)


def test_a_record_of_another_version_is_refused_in_one_sentence(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    record = json.loads((run / "record.json").read_text())
    assert record["schema"] == RUN_SCHEMA and RUN_SCHEMA in READERS
    for schema in ("hetspec.run/0", "hetspec.run/2"):
        (run / "record.json").write_text(json.dumps({**record, "schema": schema}))
        with pytest.raises(ValueError) as caught:
            load_run(run)
        message = str(caught.value)
        assert f"schema '{schema}'" in message and "record the run again" in message
        assert "\n" not in message and message.count(";") == 1


def test_replay_and_calibration_read_the_one_span_type():
    """load_run gives MeasuredSpans; calibration's critical path reads them, and the
    replay's measured timeline is their Spans, the simulator's span type."""
    run = load_run(RUN)
    assert run.spans and all(type(s) is MeasuredSpan for s in run.spans)
    platform = load_platform("cpu-local")
    times = critical_times(run, resolve(platform, {}), platform)
    assert len(times) == len(run.spans) and all(t >= 0 for t in times)
    assert Terms(platform).of_run(run)
    rep = replay(run, steps=2)
    assert rep.measured_spans and all(type(s) is Span for s in rep.measured_spans)
    assert all(type(s) is Span for s in rep.predicted_spans + rep.sim_spans)
    first = run.spans[0].as_span()
    assert rep.measured_spans[0] == first


def test_the_acceptance_lines_the_executor_builds_are_the_ones_read_back():
    verify = VerifyLine(accepted=[1], gamma=4, proposed=[4], committed=[2],
                        bonus_rank=[None], margin=[0.5], branch=0).line()
    assert list(verify) == ["accepted", "gamma", "proposed", "committed", "bonus_rank",
                            "margin", "branch"]
    assert EventLine(event="reuse", held=[True, False]).line() == {
        "event": "reuse", "held": [True, False]}
    with pytest.raises(ValueError):  # a row accepting more than it proposed is never built
        VerifyLine(accepted=[5], gamma=4, proposed=[4])
    for stored in _lines(RUN / "acceptance.jsonl"):  # what the run wrote, key for key
        built = {k: v for k, v in stored.items() if k != "prompt_batch"}
        assert list(VerifyLine(**built).line().items()) == list(built.items())


def test_transfer_fields_are_recorded_as_the_operation_names_them():
    fields = op_fields(Transfer("draft", "target", 64, label="proposal"))
    assert fields["type"] == "Transfer" and fields["nbytes"] == 64
    assert (fields["src"], fields["dst"], fields["label"]) == ("draft", "target", "proposal")


def test_a_runs_baseline_spans_are_written_read_and_fitted_as_its_own(tmp_path):
    """A run that decoded its AR baseline keeps the baseline's spans in
    baseline-spans.jsonl (named by the record): load_run reads them back apart
    from the schedule's, and calibration fits them as the same run's operations,
    their kinds marked as the baseline's."""
    source = load_run(RUN)
    record = source.record
    end = max(s.end_s for s in source.spans)
    targets = [s for s in source.spans if s.type == "Forward" and s.op["model"] == "target"]
    out = tmp_path / "run"
    write_measured_run(out, record["inputs"], record["metrics"],
                       [(end, source.spans, [])], record["outputs"], record["texts"],
                       baseline=[(end, targets, [])])
    written = json.loads((out / "record.json").read_text())
    assert written["baseline_spans"] == "baseline-spans.jsonl"
    back = load_run(out)
    assert len(back.spans) == len(source.spans)
    assert [(s.op, s.duration_s) for s in back.baseline_spans] == [
        (s.op, pytest.approx(s.duration_s, abs=1e-12)) for s in targets]
    kinds = [t.op_kind for t in Terms(load_platform("cpu-local")).of_run(back)]
    marked = [k for k in kinds if k.endswith(" [AR baseline]")]
    assert len(marked) == len(targets) and len(kinds) - len(marked) == len(
        Terms(load_platform("cpu-local")).of_run(source))
    # a run without a baseline names none
    write_measured_run(tmp_path / "plain", record["inputs"], record["metrics"],
                       [(end, source.spans, [])], record["outputs"], record["texts"])
    assert "baseline_spans" not in json.loads((tmp_path / "plain" / "record.json").read_text())
    assert load_run(tmp_path / "plain").baseline_spans == []
