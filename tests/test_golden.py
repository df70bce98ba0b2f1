"""Seeded golden runs: the CLI's outputs, byte for byte, against stored files.

Each case runs ``hetspec`` in a fresh folder and compares its stdout and every file
it writes with tests/golden/<case>/. The stored files were recorded before the
architecture rework (issue 15) and guard "behaviour stays identical": a refactor
that changes one float, one span or one report figure fails here.

Two parts are normalised because they are the environment, not the run: a
record's ``versions`` block (installed package versions) and the plotly.js
library a report inlines (the same figures, whatever plotly release is installed).
The day a profile is calibrated is fixed with ``SOURCE_DATE_EPOCH`` to the day the
fixtures were recorded. Everything else, figures and their JSON included, is
compared byte for byte, except the files a case's ``tolerance.yaml`` names: a fit's
figures, which scipy's solver and numpy's BLAS move in their last digits from one
release or CPU to another, compared per number at the tolerance that file states
(tests/goldentext.py).

Measured runs: replay and calibrate read two small runs stored in
tests/golden/measured-runs/; the executor's writer writes one of them again;
and (slow: the real model) ``hetspec run`` writes a run whose shape, all but
what the clock decides, is compared with tests/golden/measured-run-shape/.

Rewriting the fixture is deliberate: ``HETSPEC_UPDATE_GOLDEN=1 python -m pytest
tests/test_golden.py`` records the current outputs instead of comparing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from policies.runs.measured import MeasuredSpan
from tests.goldentext import TOLERANCE_FILE, differences, load_tolerance
from tests.hangguard import HANG_S, MODEL_HANG_S

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("HETSPEC_UPDATE_GOLDEN") == "1"
RECORDED_EPOCH_S = "1795651200"  # 2026-11-26 00:00 UTC, the day the fixtures were recorded
MEASURED = GOLDEN / "measured-runs"

SIM = ["simulate", "--json", "--tokens", "60", "--record", "run.json", "--trace", "trace.json"]
H100 = ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft", "llama-3.2-1b"]
M2 = ["--platform", "m2-ultra-8x", "--target", "qwen3-32b", "--draft", "qwen3-0.6b"]
# tests/golden/measured-runs: two small runs 'hetspec run' measured with SmolLM2-135M on
# cpu-local (--max-new-tokens 8 --no-baseline; sd with --set gamma=4 --set
# draft_layers=15, and ar), copied into each case's folder as runs/; replay and
# calibrate read only these stored files, so their outputs are deterministic
REPLAY = ["replay", "--trace", "replay-trace.json"]

# case name -> (arguments, files the command writes besides stdout)
CASES = {
    "sd-h100": (SIM + H100 + ["--policy", "sd", "--seed", "3"], ["run.json", "trace.json"]),
    "sd-trace": (SIM + H100 + ["--policy", "sd", "--set", "gamma=4", "--set",
                               "trace=acceptance.jsonl", "--seed", "9"],
                 ["run.json", "trace.json"]),
    "mirror-m2": (SIM + M2 + ["--policy", "mirror", "--seed", "5"], ["run.json", "trace.json"]),
    "mirror-omega-trace": (SIM + M2 + ["--policy", "mirror", "--set",
                                       "omega_trace=acceptance.jsonl", "--seed", "9"],
                           ["run.json", "trace.json"]),
    "ssd-batch": (SIM + H100 + ["--policy", "ssd", "--set", "hit_rate=0.7", "--batch", "4",
                                "--seed", "7"], ["run.json", "trace.json"]),
    "ppsd-a100": (SIM + ["--platform", "a100-sxm-8x", "--target", "llama-2-13b",
                         "--policy", "ppsd", "--set", "alpha=0.7", "--seed", "2"],
                  ["run.json", "trace.json"]),
    "cats-orin": (SIM + ["--platform", "jetson-agx-orin-64gb", "--target", "vicuna-7b",
                         "--policy", "cats", "--set", "dram_budget_gb=8", "--seed", "1"],
                  ["run.json", "trace.json"]),
    "eesd-a100": (SIM + ["--platform", "a100-sxm-8x", "--target", "llama-2-13b",
                         "--policy", "eesd", "--seed", "6"], ["run.json", "trace.json"]),
    "kangaroo-orin": (SIM + ["--platform", "jetson-agx-orin-64gb", "--target", "vicuna-7b",
                             "--policy", "kangaroo", "--set", "dram_budget_gb=8",
                             "--seed", "1"], ["run.json", "trace.json"]),
    "ar_stream-orin": (SIM + ["--platform", "jetson-agx-orin-64gb", "--target", "vicuna-7b",
                              "--policy", "ar_stream", "--set", "dram_budget_gb=8",
                              "--seed", "1"], ["run.json", "trace.json"]),
    "tree-positional": (SIM + H100 + ["--policy", "tree", "--set", "alphas=0.9,0.7",
                                      "--seed", "4"], ["run.json", "trace.json"]),
    "ar-moe-deterministic": (SIM + ["--platform", "h100-sxm-5x", "--target", "qwen3-30b-a3b",
                                    "--policy", "ar", "--deterministic", "--fixed-context",
                                    "--set", "contention=on"], ["run.json", "trace.json"]),
    "law-leviathan": (["law", "leviathan", "--set", "alpha=0.8", "--set", "gamma=5",
                       "--set", "c=0.05", "--json"], []),
    "compare-h100": (["compare"] + H100 + ["--policies", "ar,sd,ssd", "--sweep", "gamma=2,4",
                                           "--tokens", "60", "--jobs", "1", "-o",
                                           "report.html", "--json"], ["report.html"]),
    "replay-sd": (REPLAY + ["runs/sd-1/record.json", "--json"], ["replay-trace.json"]),
    "replay-sd-executor": (REPLAY + ["runs/sd-1", "--work", "executor"],
                           ["replay-trace.json"]),
    "replay-ar": (REPLAY + ["runs/ar-1", "--profile", "cpu-local", "--json"],
                  ["replay-trace.json"]),
    # the one-token and draft passes of sd-1 are memory-bound, so the compute terms
    # and the call overhead are held: fitted, they are numbers the spans cannot
    # identify, which the solver leaves wherever its arithmetic happens to end (one
    # BLAS kernel wrote roofline_exponent 18.6, another 59.1)
    "calibrate-runs": (["calibrate", "--runs", "runs", "--profile", "cpu-local", "-o",
                        "calibrated.yaml", "--fit-policies", "sd", "--hold",
                        "compute_efficiency,roofline_exponent,call_overhead_s,"
                        "memory_efficiency", "--json"], ["calibrated.yaml"]),
}

_PLOTLY_JS = re.compile(r'<script type="text/javascript">.*?</script>', re.S)


def _normalised(name: str, data: bytes) -> bytes:
    """The environment's part of an output replaced by a fixed marker."""
    if name == "run.json":
        record = json.loads(data)
        record["versions"] = "<installed versions>"
        return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    if name.endswith(".html"):
        # plotly.js is inlined once, first, as the only typed script element
        text, count = _PLOTLY_JS.subn("<script>/* plotly.js */</script>", data.decode(), 1)
        assert count == 1, "the report no longer inlines plotly.js where expected"
        return text.encode()
    return data


def _run(case: str, folder: Path) -> dict[str, bytes]:
    args, files = CASES[case]
    shutil.copy(GOLDEN / "acceptance.jsonl", folder / "acceptance.jsonl")
    shutil.copytree(MEASURED, folder / "runs")
    # a calibrated profile names the day it was calibrated: the day these were recorded
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": RECORDED_EPOCH_S}
    out = subprocess.run([sys.executable, "-m", "analyses.cli", *args], cwd=folder, env=env,
                         capture_output=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr.decode()
    outputs = {"stdout": out.stdout}
    for name in files:
        outputs[name] = _normalised(name, (folder / name).read_bytes())
    return outputs


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_are_byte_identical_to_the_recorded_ones(case, tmp_path):
    outputs = _run(case, tmp_path)
    stored = GOLDEN / case
    if UPDATE:
        stored.mkdir(parents=True, exist_ok=True)
        for name, data in outputs.items():
            (stored / name).write_bytes(data)
    tolerance = load_tolerance(stored)
    for name, data in outputs.items():
        expected = (stored / name).read_bytes()
        if tolerance is not None and name in tolerance.files:
            wrong = differences(data.decode(), expected.decode(), tolerance)
            assert not wrong, f"{case}/{name} departs from tests/golden/{case}/{name}: " + (
                "; ".join(wrong))
        else:
            assert data == expected, f"{case}/{name} differs from tests/golden/{case}/{name}"
    assert sorted(p.name for p in stored.iterdir() if p.name != TOLERANCE_FILE) == sorted(
        outputs)


# What the executor writes for a measured run, from fixed decoding results: the
# prompt batches of tests/golden/measured-runs/sd-1 (their spans and acceptance
# lines, each batch's clock ending at its last span) written again, byte for byte.
RECORD_FILES = ("record.json", "spans.jsonl", "acceptance.jsonl", "trace.json")


def _stored_results(run: Path) -> tuple[dict, list]:
    from executors.session import BatchResult

    record = json.loads((run / "record.json").read_text())
    lines = {name: [json.loads(line) for line in (run / name).read_text().splitlines()]
             for name in ("spans.jsonl", "acceptance.jsonl")}
    batches = sorted({s["prompt_batch"] for s in lines["spans.jsonl"]})
    results = []
    for i in batches:
        spans = [MeasuredSpan.from_line({k: v for k, v in s.items() if k != "prompt_batch"})
                 for s in lines["spans.jsonl"] if s["prompt_batch"] == i]
        acceptance = [{k: v for k, v in a.items() if k != "prompt_batch"}
                      for a in lines["acceptance.jsonl"] if a["prompt_batch"] == i]
        results.append(BatchResult(generated=[record["outputs"][i]],
                                   wall_s=max(s.end_s for s in spans), steps=len(acceptance),
                                   spans=spans, acceptance=acceptance, stats={}))
    return record, results


def test_a_measured_record_is_written_byte_identical_to_the_recorded_one(tmp_path):
    pytest.importorskip("torch")
    from executors.measure import write_run

    record, results = _stored_results(MEASURED / "sd-1")
    write_run(tmp_path, record["inputs"], record["metrics"], results, record["outputs"],
              record["texts"])
    stored = GOLDEN / "measured-record"
    if UPDATE:
        stored.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        data = _normalised("run.json" if name == "record.json" else name,
                           (tmp_path / name).read_bytes())
        if UPDATE:
            (stored / name).write_bytes(data)
        assert data == (stored / name).read_bytes(), f"measured-record/{name} differs"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(RECORD_FILES)


# What 'hetspec run' itself writes, recorded with the real model on one prompt in
# one process (--inline: the coordinator's spans come in one order): every key,
# every operation's fields, every count and token, byte for byte; what the clock
# decides is replaced by a marker (each span's start and end, the trace's times,
# the metrics' floats, a Verify's logit margins, which the installed torch may
# round otherwise) and the breakdown and the machine's load are kept as their names.
MEASURED_RUN = ["run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy",
                "sd", "--set", "gamma=4", "--set", "draft_layers=15", "--max-new-tokens",
                "6", "--no-baseline", "--inline", "--prompts", "prompt.jsonl", "--out", "run"]
PROMPT = '[{"role": "user", "content": "What is the capital of France?"}]\n'


def _marked(value):
    """Every float (not a bool or an int) replaced by a marker."""
    if isinstance(value, float):
        return "<measured>"
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(v) for v in value]
    return value


def _repo_relative(inputs: dict) -> dict:
    heads = inputs.get("draft_heads") or {}
    if heads.get("path"):
        heads["path"] = str(Path(heads["path"]).relative_to(ROOT))
    return inputs


def _measured_shape(name: str, data: bytes) -> bytes:
    if name == "record.json":
        record = json.loads(data)
        record["versions"] = "<installed versions>"
        record["metrics"]["breakdown"] = sorted(record["metrics"]["breakdown"])
        record["metrics"]["machine"] = sorted(record["metrics"]["machine"])  # this machine's
        record["metrics"] = _marked(record["metrics"])
        _repo_relative(record["inputs"])
        return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    if name == "trace.json":
        trace = json.loads(data)
        for event in trace["traceEvents"]:
            event.update({k: "<measured>" for k in ("ts", "dur") if k in event})
        _repo_relative(trace["otherData"])
        return (json.dumps(trace, indent=1) + "\n").encode()
    lines = [json.loads(line) for line in data.decode().splitlines()]
    for line in lines:
        line.update({k: "<measured>" for k in ("start_s", "end_s") if k in line})
        if "margin" in line:
            line["margin"] = _marked(line["margin"])
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.mark.slow
def test_a_measured_run_writes_the_recorded_shape(tmp_path):
    (tmp_path / "prompt.jsonl").write_text(PROMPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "analyses.cli", *MEASURED_RUN], cwd=tmp_path,
                         env=env, capture_output=True, timeout=MODEL_HANG_S)
    assert out.returncode == 0, out.stderr.decode()
    stored = GOLDEN / "measured-run-shape"
    if UPDATE:
        stored.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        data = _measured_shape(name, (tmp_path / "run" / name).read_bytes())
        if UPDATE:
            (stored / name).write_bytes(data)
        assert data == (stored / name).read_bytes(), f"measured-run-shape/{name} differs"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(RECORD_FILES)
