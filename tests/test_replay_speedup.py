"""Replay leads with the speedup against the run's own AR, which a machine busy
with other work leaves comparable, and reproduces the run's tokens per step from
its own acceptance trace; a measured run records the machine's load and says
when it was contended (executors.measure.machine_load)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from analyses.measured.evidence import contended_text
from tests.clicases import run_cli

RUN = Path(__file__).parent / "golden" / "measured-runs" / "sd-1"


def test_a_replay_reproduces_the_runs_tokens_per_step_over_all_its_prompt_batches():
    """sd-1 decoded 4 prompt batches; the replay's tokens per step are those of all
    of them (the first batch alone commits 1.33 a step, the run 1.5)."""
    from analyses.measured.replay import load_run, replay

    run = load_run(RUN)
    assert run.batched() and len(run.batches()) > 1
    rep = replay(run)
    measured = run.metrics["mean_tokens_per_step"]
    assert rep.predicted["mean_tokens_per_step"] == pytest.approx(measured, rel=1e-12)
    assert rep.predicted["tokens"] / rep.predicted["steps"] == pytest.approx(measured)
    assert rep.errors()["mean_tokens_per_step"] == pytest.approx(0.0, abs=1e-12)


def test_the_predicted_speedup_divides_by_the_ar_baseline_simulated_on_the_same_profile():
    from analyses.measured.replay import load_run, replay

    rep = replay(load_run(RUN))
    p = rep.predicted
    assert p["speedup_vs_ar"] == pytest.approx(p["tokens_per_s"] / p["ar_tokens_per_s"],
                                               rel=1e-12)
    assert 0 < p["ar_tokens_per_s"] and p["ar_tokens_per_s"] != p["tokens_per_s"]


def _copy_with(tmp_path: Path, **metrics) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    record = json.loads((run / "record.json").read_text())
    record["metrics"].update(metrics)
    (run / "record.json").write_text(json.dumps(record, indent=2))
    return run / "record.json"


BUSY = {"cores": 2, "threads": 1, "load_1m_before": 3.1, "load_1m_after": 3.9,
        "contended": True}


def test_replay_prints_the_speedup_first_and_flags_a_contended_run(tmp_path):
    record = _copy_with(tmp_path, speedup_vs_ar=2.0, ar_tokens_per_s=3.5, machine=BUSY)
    out = run_cli("replay", record, "--trace", tmp_path / "t.json")
    assert out.rc == 0, out.err
    lines = out.out.splitlines()
    assert lines[1].split()[:5] == ["speedup", "vs", "AR", "measured", "2x"]
    assert "simulated" in lines[1] and "%" in lines[1]
    assert "busy machine (load average up to 3.9 on 2 cores, 1 for this run)" in lines[2]
    quiet = _copy_with(tmp_path / "q", speedup_vs_ar=2.0, ar_tokens_per_s=3.5,
                       machine={**BUSY, "contended": False})
    assert "busy machine" not in run_cli("replay", quiet, "--trace",
                                         tmp_path / "q.json").out


@pytest.mark.parametrize("before, after, threads, cores, contended", [
    (0.2, 1.1, 1, 2, False),  # alone: the run's own thread after
    (2.0, 3.0, 1, 2, True),  # other work wants both cores
    (None, 2.9, 1, 2, True),  # no load before: the load after less the run's threads
    (1.4, 2.3, 1, 2, False),  # other work within the spare core and a half
    (None, None, 1, 2, None),  # no load average on this system: unknown
])
def test_a_run_is_contended_when_other_work_wants_more_than_its_spare_cores(
        monkeypatch, before, after, threads, cores, contended):
    measure = pytest.importorskip("executors.measure")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    machine = measure.machine_load(before, after, threads)
    assert machine["contended"] is contended
    assert machine["cores"] == cores and machine["threads"] == threads
    assert bool(contended_text({"machine": machine})) is bool(contended)


def test_run_says_its_outputs_equal_ar_its_fitted_lookup_and_a_busy_machine():
    from analyses.commands.run import run_notes

    notes = run_notes({"matches_ar": True, "lookup_match": 0.3425, "lookup_alpha": 0.9621,
                       "machine": BUSY})
    assert notes[0] == "outputs equal AR's, token for token"
    assert notes[1] == ("prompt lookup fitted: a match on 34.2% of steps, then each "
                        "proposed token accepted with alpha 0.962")
    assert notes[2].startswith("measured on a busy machine")
    assert run_notes({"matches_ar": False})[0].startswith("outputs differ from AR's")
    assert run_notes({}) == []


def test_simulate_says_which_part_of_a_longer_trace_it_read():
    """sd-1's trace: 24 steps over 4 prompt batches, 36 tokens a row; a 3-token run
    reads its first steps and says how to read it all; a run as long as the trace
    says nothing; a longer one says it read the trace again."""
    trace = RUN / "acceptance.jsonl"
    args = ["simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy",
            "sd", "--set", "gamma=4", "--set", "draft_layers=15", "--set", f"trace={trace}"]
    short = run_cli(*args, "--tokens", "3")
    assert short.rc == 0, short.err
    note = [line for line in short.out.splitlines() if "note:" in line]
    assert len(note) == 1 and "holds 24 steps over 4 prompt batches (36 tokens a row)" in note[0]
    assert "--tokens 36 reads it all" in note[0]
    assert "note:" not in run_cli(*args, "--tokens", "36").out
    assert "times over, from the start" in run_cli(*args, "--tokens", "100").out


def _two_runs(tmp_path: Path) -> Path:
    """An AR run and an SD run whose record says it measured 2x its own AR on a
    busy machine, in one --runs folder."""
    runs = tmp_path / "runs"
    shutil.copytree(RUN.parent / "ar-1", runs / "ar-1")
    sd = _copy_with(tmp_path, speedup_vs_ar=2.0, ar_tokens_per_s=3.5, machine=BUSY)
    shutil.move(sd.parent, runs / "sd-1")
    return runs


COMPARE = ["compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft",
           "none", "--policies", "ar", "--tokens", "8", "--jobs", "1"]


def test_compare_runs_leads_each_run_with_its_speedup_against_its_own_ar(tmp_path):
    from analyses.measured.replay import load_run, replay

    runs = _two_runs(tmp_path)
    out = run_cli(*COMPARE, "--runs", runs, "-o", tmp_path / "r.html")
    assert out.rc == 0, out.err
    lines = out.out.splitlines()
    at = lines.index("  measured runs replayed (speedup against each run's own AR first):")
    ar, sd = lines[at + 1], lines[at + 2]
    assert ar.startswith("    ar-1 (ar): its own AR baseline; tokens/s measured 17.42, ")
    simulated = replay(load_run(runs / "sd-1")).predicted["speedup_vs_ar"]
    assert sd.startswith(f"    sd-1 (sd): speedup vs AR measured 2x, simulated "
                         f"{simulated:.3g}x ({simulated / 2.0 - 1:+.1%}); tokens/s measured")
    assert "busy machine (load average up to 3.9 on 2 cores" in sd and "busy" not in ar
    report = (tmp_path / "r.html").read_text()
    assert sd.strip().split(";")[0] in report  # the report's measured section says it too
    summary = json.loads(run_cli(*COMPARE, "--runs", runs, "-o", tmp_path / "r.html",
                                 "--json").out)
    by_run = {r["run"]: r for r in summary["runs"]}
    assert by_run["sd-1 (sd)"]["speedup_vs_ar"] == {
        "measured": 2.0, "simulated": pytest.approx(simulated),
        "error": pytest.approx(simulated / 2.0 - 1)}
    assert by_run["ar-1 (ar)"]["own_baseline"] and by_run["sd-1 (sd)"]["contended"]
    assert "runs" not in json.loads(run_cli(*COMPARE, "-o", tmp_path / "q.html",
                                            "--json").out)


def test_a_run_without_ar_rounds_says_its_speedup_was_not_measured():
    from analyses.measured.replay import load_run, replay
    from analyses.measured.speedups import run_line

    line = run_line(replay(load_run(RUN)))  # sd-1 was recorded with --no-baseline
    assert line.startswith("sd-1 (sd): speedup vs AR not measured (recorded without its "
                           "AR rounds: 'hetspec run' without --no-baseline measures it), "
                           "simulated ")


def test_the_measured_scatter_draws_the_speedup_first_without_the_ar_run(tmp_path):
    from analyses.compare.report import measured_scatter
    from analyses.measured.replay import load_run, replay

    runs = _two_runs(tmp_path)
    reps = [replay(load_run(runs / name)) for name in ("ar-1", "sd-1")]
    fig = measured_scatter(reps)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["speedup vs AR", "tokens/s"]
    speedup, tokens = fig.data[0], fig.data[2]
    assert list(speedup.text) == ["sd-1 (sd)"] and list(speedup.x) == [2.0]
    assert list(tokens.text) == ["ar-1 (ar)", "sd-1 (sd)"]
