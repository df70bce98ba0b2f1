"""The run vocabulary both runtimes share (policies/runs/): metrics, the one
speedup over AR, baselines, measured spans."""

from types import SimpleNamespace

from policies.base import baseline_of
from policies.runs.files import Span
from policies.runs.metrics import add_speedup, elapsed_s, run_metrics
from policies.runs.measured import MeasuredSpan

CONFIG = SimpleNamespace(policy="sd", platform="p", target="t", draft="d", batch=2, seed=1,
                         deterministic=True)


def test_simulated_and_measured_runs_name_their_time_honestly():
    sim = run_metrics(CONFIG, tokens=40, time_s=2.0, steps=10, rows_per_step=2)
    real = run_metrics(CONFIG, tokens=40, time_s=2.0, steps=10, rows_per_step=2,
                       measured=True)
    assert sim["simulated_time_s"] == 2.0 and "wall_s" not in sim
    assert real["wall_s"] == 2.0 and "simulated_time_s" not in real
    assert real["measured"] is True and real["deterministic"] is False
    assert sim["tokens_per_s"] == 20.0 and sim["mean_tokens_per_step"] == 2.0
    assert sim["step_latency_s"] == 0.2


def test_elapsed_time_reads_new_and_old_measured_records():
    assert elapsed_s({"wall_s": 3.0}) == 3.0
    assert elapsed_s({"simulated_time_s": 4.0}) == 4.0  # records before the rename
    assert elapsed_s({}) is None


def test_speedup_is_tokens_per_s_over_the_baseline():
    assert add_speedup({"tokens_per_s": 30.0}, 10.0) == {
        "tokens_per_s": 30.0, "ar_tokens_per_s": 10.0, "speedup_vs_ar": 3.0}
    assert add_speedup({"tokens_per_s": 30.0}, own_baseline=True)["speedup_vs_ar"] == 1.0
    assert add_speedup({"tokens_per_s": 30.0})["speedup_vs_ar"] is None


def test_baselines_come_from_the_schedule():
    assert baseline_of("ar", {}) is None
    assert baseline_of("sd", {"gamma": 4}) == ("ar", {})
    name, params = baseline_of("ppsd", {"exit_layer": 8})
    assert name == "ar" and params  # AR through ppsd's own pipeline stages


def test_measured_spans_name_devices_like_simulated_ones():
    line = {"name": "draft", "kind": "compute", "device": "gpu0", "physical": "cuda:0",
            "start_s": 1.0, "end_s": 1.5, "op": {"type": "Forward"}}
    span = MeasuredSpan.from_line(line)
    assert span.as_span(2.0) == Span("draft", "compute", "gpu0", 3.0, 3.5)
    assert span.as_span(physical=True).device == "gpu0 (cuda:0)"
    old = {"start_s": 0, "end_s": 1, "op": {"type": "Verify", "device": "cpu0"}}
    assert MeasuredSpan.from_line(old).as_span() == Span("Verify", "compute", "cpu0", 0.0, 1.0)


def test_old_module_names_still_import():
    from policies.runs import files
    from simcore.records import write_record
    from simcore.trace import write_chrome_trace

    assert write_record is files.write_record
    assert write_chrome_trace is files.write_chrome_trace
