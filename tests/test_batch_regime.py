"""The batch regime: a wide pass past the device's ridge, which operations are
compute-bound, and where speculation stops paying over a swept batch
(analyses/compare/crossover.py): the crossover arithmetic, and compare --sweep
batch=... reporting it in its summary, its JSON and its report."""

from __future__ import annotations

import json
import math

import pytest

from policies.runs.metrics import stops_paying
from tests.clicases import run_cli


def test_the_crossover_is_interpolated_in_log_batch():
    stops, until, estimate = stops_paying((1, 4, 16, 64), (2.0, 1.5, 1.2, 0.8))
    assert (stops, until) == (64, 16)
    # 1.2 -> 0.8 crosses 1 half way from log 16 to log 64: at batch 32
    assert estimate == pytest.approx(32.0, rel=1e-12)


@pytest.mark.parametrize("speedups, expected", [
    ((2.0, 1.5, 1.01), (None, None, None)),  # pays at every batch
    ((2.0, 0.9, 1.1), (None, None, None)),  # a dip it recovers from is no crossover
    ((0.9, 0.8, 0.7), (1, None, None)),  # pays at none
    ((2.0, 1.0, 0.5), (16, 4, None)),  # exactly 1 still pays: it stops after
])
def test_a_schedule_stops_paying_only_where_it_stays_below_1(speedups, expected):
    stops, until, estimate = stops_paying((1, 4, 16), speedups)
    assert (stops, until) == expected[:2]
    if expected == (16, 4, None):
        assert estimate == pytest.approx(4.0)
    else:
        assert estimate is None


H100 = ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft", "llama-3.2-1b",
        "--policies", "ar,sd", "--sweep", "batch=1,64,256", "--tokens", "60", "--jobs", "1"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """compare over a batch sweep wide enough for sd to stop paying on an H100 node:
    its JSON summary and its report."""
    folder = tmp_path_factory.mktemp("crossover")
    result = run_cli("compare", *H100, "-o", folder / "report.html", "--json")
    assert result.rc == 0, result.err
    return json.loads(result.out), (folder / "report.html").read_text()


def test_compare_states_each_schedules_crossover_batch(swept):
    summary, _ = swept
    (found,) = summary["crossover"]  # AR is its own baseline: it has none
    assert found["policy"] == "sd" and found["batches"] == [1, 64, 256]
    speedups = found["speedups"]
    assert speedups[0] > 1 > speedups[-1]
    assert found["stops_paying_at"] == 256 and found["pays_until"] == 64
    # the interpolated batch is where the speedups' line in log(batch) meets 1
    s0, s1 = speedups[1], speedups[2]
    at = math.log(64) + (math.log(256) - math.log(64)) * (s0 - 1) / (s0 - s1)
    assert found["crossover_batch"] == pytest.approx(math.exp(at), rel=1e-9)
    assert 64 < found["crossover_batch"] < 256
    # what grows: the breakdowns of the two runs around the crossover, beside AR's
    per_token = found["per_token_s"]
    assert per_token["verify"]["after"] > per_token["verify"]["before"] > 0
    base = found["baseline_per_token_s"]
    assert base["after"] > base["before"] > 0
    assert "stops paying between batch 64" in found["sentence"]
    assert "verify" in found["sentence"]


def test_the_report_plots_speedup_against_batch_and_says_where_it_stops(swept):
    _, report = swept
    assert "speedup against batch: where speculation stops paying" in report
    assert "On h100-sxm-5x, sd stops paying between batch 64" in report


def test_the_text_summary_prints_the_crossover(tmp_path):
    result = run_cli("compare", *H100, "-o", tmp_path / "r.html")
    assert result.rc == 0, result.err
    assert "on h100-sxm-5x, sd stops paying between batch 64" in result.out


def test_a_compare_without_a_batch_sweep_reports_no_crossover(tmp_path):
    result = run_cli("compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                     "--draft", "llama-3.2-1b", "--policies", "ar,sd", "--sweep",
                     "gamma=2,4", "--tokens", "60", "--jobs", "1", "-o", tmp_path / "r.html",
                     "--json")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["crossover"] == []


def _span(flops: float, nbytes: float):
    from types import SimpleNamespace

    return SimpleNamespace(name="verify", kind="forward", device="gpu4", start_s=0.0,
                           end_s=0.01, flops=flops, nbytes=nbytes)


def test_an_operation_is_compute_bound_past_the_devices_ridge():
    from hwprofiles import load_platform
    from policies.runs.breakdown import operator_table

    platform = load_platform("h100-sxm-5x")
    device = platform.device("gpu4")
    peak = device.peak_flops["bf16"]
    bandwidth = platform.tier(device.memory).bandwidth_gb_s * 1e9
    ridge = peak / bandwidth  # FLOPs per byte where both take as long
    for intensity, bound in ((ridge / 3, "memory"), (ridge * 3, "compute")):
        (row,) = operator_table([_span(intensity * 1e9, 1e9)], platform, "bf16")
        assert row["bound"] == bound
        assert row["compute_to_memory"] == pytest.approx(intensity / ridge, rel=1e-12)


def test_simulate_says_when_the_verify_is_compute_bound():
    args = ["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
            "llama-3.2-1b", "--policy", "sd", "--set", "gamma=4", "--tokens", "60"]
    narrow, wide = (run_cli(*args, "--batch", b) for b in ("1", "256"))
    assert narrow.rc == wide.rc == 0
    why = [line for line in wide.out.splitlines() if "why:" in line][0]
    assert "'verify' on target_tp, compute-bound" in why
    assert "compute-bound" not in narrow.out


def test_a_verify_costs_linearly_in_rows_once_past_the_ridge():
    """On a synthetic device (100 TFLOP/s over 1000 GB/s: its ridge at 100 FLOPs a
    byte, about 100 rows of a pass over fp16 weights), a verify of five positions for
    each of B sequences over 200 cached positions each costs about what one row
    costs while B is small (the weights' bytes), and past the ridge every further
    block of sequences adds the same time (its FLOPs at the device's rate, its KV
    reads at the tier's): the cost grows linearly in rows."""
    from simcore import RooflineCost
    from tests.test_engine import MODEL, platform

    cost = RooflineCost(platform())

    def busy(batch: int, positions: int = 5) -> float:
        return cost.forward(MODEL, "c", (0, 4), positions, batch, 200, "lm", None).busy_s

    assert busy(4) < 1.2 * busy(1, positions=1)  # memory-bound: the weights cost alike
    steps = [busy(b) for b in (256, 512, 768, 1024)]  # 1,280 to 5,120 rows
    grows = [b - a for a, b in zip(steps, steps[1:])]
    assert grows[0] > busy(1, positions=1)  # 1,280 more rows cost more than the weights
    assert grows[1] == pytest.approx(grows[0], rel=1e-3)
    assert grows[2] == pytest.approx(grows[0], rel=1e-3)


def test_a_batch_expansion_stack_scores_each_position_as_a_sequence_of_its_own():
    """Under ``scoring: batch_expansion`` a pass with a head over n positions of B
    sequences runs as B*n sequences of one position at the expanded sequences'
    mean context; a pass without a head, of one position, or with a head on fewer
    positions runs as written, and a multi-query stack changes nothing."""
    from hwprofiles.stacks import Stack, scored_shape

    expand, multi = Stack(name="e", scoring="batch_expansion"), Stack(name="m")
    assert scored_shape(expand, 4, 64, 128, "lm", None) == (1, 256, 129)
    assert scored_shape(expand, 5, 2, 100, "lm", None) == (1, 10, 102)
    assert scored_shape(multi, 4, 64, 128, "lm", None) == (4, 64, 128)
    assert scored_shape(expand, 4, 64, 128, None, None) == (4, 64, 128)  # hidden only
    assert scored_shape(expand, 1, 64, 128, "lm", None) == (1, 64, 128)  # a decode step
    assert scored_shape(expand, 4, 64, 128, "lm", 1) == (4, 64, 128)  # head on one


def test_an_expanded_verify_pays_its_host_time_and_kv_reads_once_per_position():
    """A verify of n = 4 positions for B = 8 sequences under a batch-expansion stack
    pays the per-sequence host time 4 x 8 times (a multi-query stack: 8 times) and
    reads every sequence's cached positions 4 times; its weights are read once
    either way."""
    from hwprofiles.stacks import Stack
    from simcore import RooflineCost
    from tests.test_engine import MODEL, platform

    host = dict(sequence_host_s=1e-4, call_host_s=1e-3,
                sources={"sequence_host_s": "test", "call_host_s": "test"})
    expand = RooflineCost(platform(), Stack(name="e", scoring="batch_expansion", **host))
    multi = RooflineCost(platform(), Stack(name="m", **host))

    def cost(model, context):
        return model.forward(MODEL, "c", (0, 4), 4, 8, context, "lm", None)

    def terms(model):
        return model.terms(MODEL, "c", (0, 4), 4, 8, "lm", None)

    assert terms(expand).sync_s == pytest.approx(32 * 1e-4, rel=1e-12)
    assert terms(multi).sync_s == pytest.approx(8 * 1e-4, rel=1e-12)
    # the context's bytes: four reads of each sequence's cache against one
    kv_expand = cost(expand, 1001).nbytes - cost(expand, 1).nbytes
    kv_multi = cost(multi, 1001).nbytes - cost(multi, 1).nbytes
    assert kv_expand == pytest.approx(4 * kv_multi, rel=1e-12)
    # the weights: one read either way (a pass at no context, less the new KV rows)
    assert terms(expand).bytes0 == pytest.approx(terms(multi).bytes0, rel=1e-12)
