"""Where a run's time goes: the critical path through its spans (both runtimes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from analyses.run.api import RunConfig, simulate
from policies.runs.breakdown import breakdown, critical_path, sentence
from policies.runs.files import Span


def test_an_exact_timeline_is_split_by_cost_and_the_hidden_draft_is_named():
    spans = [Span("target prefix", "compute", "gpu", 0.0, 4.0),
             Span("draft window", "compute", "npu", 4.0, 9.0),  # under the suffix
             Span("target suffix", "compute", "gpu", 4.0, 10.0),
             Span("window to target", "transfer", "link:x", 10.0, 11.0),
             Span("verify", "compute", "gpu", 11.0, 19.0),
             Span("verify all-reduce", "collective", "gpu", 19.0, 20.0)]
    parts = breakdown(spans, tokens=4, steps=2, start_s=0.0, end_s=21.0)
    assert parts["per_step_s"] == {"target": 5.0, "verify": 4.0, "collective": 0.5,
                                   "transfer": 0.5, "wait": 0.5}
    assert sum(parts["share"].values()) == pytest.approx(1.0)
    assert parts["hidden_per_token_s"] == {"draft window": 1.25}
    assert parts["utilisation"]["gpu"] == pytest.approx(19 / 21)
    assert parts["largest"]["target"] == {"name": "target suffix", "device": "gpu",
                                          "share": 0.6}
    assert sentence("mirror", parts) == (
        "mirror: 48% of each token's time is target compute, 60% of it 'target suffix' "
        "on gpu; it hides 1.25e+03 ms of 'draft window' a token under other work")


SCENARIOS = [("sd", {"gamma": 4}, "qwen3-0.6b", "m2-ultra-8x", "qwen3-32b", 1),
             ("mirror", {}, "qwen3-0.6b", "m2-ultra-8x", "qwen3-32b", 2),
             ("ssd", {"hit_rate": 0.7}, "llama-3.2-1b", "h100-sxm-5x", "llama-3.1-70b", 4),
             ("tree", {}, "llama-3.2-1b", "h100-sxm-5x", "llama-3.1-70b", 1),
             ("ppsd", {}, None, "a100-sxm-8x", "llama-2-13b", 1),
             ("cats", {"dram_budget_gb": 6}, None, "jetson-agx-orin-64gb", "vicuna-7b", 1),
             ("ar", {}, None, "h100-sxm-5x", "llama-3.1-70b", 8)]


@pytest.mark.parametrize("policy,params,draft,platform,target,batch", SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_simulated_breakdown_sums_to_the_step_time(policy, params, draft, platform, target,
                                                   batch):
    config = RunConfig(platform=platform, target=target, draft=draft, policy=policy,
                       params=params, acceptance={"kind": "iid", "alpha": 0.8}, tokens=120,
                       batch=batch)
    m = simulate(config).metrics
    parts = m["breakdown"]
    assert sum(parts["per_step_s"].values()) == pytest.approx(m["step_latency_s"], rel=0.01)
    assert sum(parts["per_token_s"].values()) == pytest.approx(m["tpot_s"], rel=0.01)
    assert all(0 <= u <= 1 + 1e-9 for u in parts["utilisation"].values())


def test_a_megatron_sharded_draft_is_named_for_its_all_reduce():
    """Vanilla SD's draft sharded Megatron-style over 8 nodes: the all-reduces are
    the dominant cost; sharded as Mirror's draft (the default), the verify is."""
    config = RunConfig(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b",
                       policy="sd", params={"gamma": 4, "draft_collectives": None},
                       acceptance={"kind": "iid"}, tokens=120)
    parts = simulate(config).metrics["breakdown"]
    assert max(parts["share"], key=parts["share"].get) == "collective"
    assert parts["largest"]["collective"]["name"] == "draft all-reduce"
    alike = simulate(config.revised(params={"gamma": 4})).metrics["breakdown"]
    assert max(alike["share"], key=alike["share"].get) == "verify"


spans_strategy = st.lists(
    st.tuples(st.sampled_from(["draft", "verify", "target", "x all-reduce"]),
              st.sampled_from(["compute", "collective", "transfer", "stream", "delay"]),
              st.sampled_from(["a", "b", "c"]),
              st.floats(0, 50, allow_nan=False), st.floats(0.001, 20, allow_nan=False)),
    max_size=40)


@settings(max_examples=200, deadline=None)
@given(spans_strategy, st.floats(10, 80))
def test_the_critical_path_covers_the_window_exactly_once(rows, end_s):
    spans = [Span(n, k, d, s, s + dur) for n, k, d, s, dur in rows]
    pieces = critical_path(spans, 0.0, end_s)
    covered = sorted((lo, hi) for _, lo, hi in pieces)
    assert covered[0][0] == pytest.approx(0.0) and covered[-1][1] == pytest.approx(end_s)
    for (_, hi), (lo, _) in zip(covered, covered[1:]):
        assert lo == pytest.approx(hi)  # no gap, no overlap
    for span, lo, hi in pieces:
        assert span is None or span.start_s - 1e-9 <= lo < hi <= span.end_s + 1e-9


def test_the_operator_table_accounts_for_every_span_and_its_peak_fraction():
    from analyses.run.api import RunConfig, run_schedule
    from policies.runs.breakdown import operator_table
    from hwprofiles import load_platform

    config = RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                       policy="sd", params={"gamma": 4}, acceptance={"kind": "iid"},
                       tokens=80, deterministic=True)
    spans = run_schedule(config).spans
    rows = operator_table(spans, load_platform("h100-sxm-5x"), "bf16")
    assert sum(r["count"] for r in rows) == len(spans)
    assert sum(r["time_s"] for r in rows) == pytest.approx(sum(s.duration_s for s in spans))
    assert [r["time_s"] for r in rows] == sorted((r["time_s"] for r in rows), reverse=True)
    verify = next(r for r in rows if r["operation"] == "verify")
    # a decode verify is bandwidth-bound: its bytes over its time, against one H100's
    # HBM bandwidth (each member of target_tp reads its shard)
    hbm = load_platform("h100-sxm-5x").tier("hbm0").bandwidth_gb_s * 1e9
    assert verify["peak_fraction"] == pytest.approx(
        verify["bytes"] / verify["time_s"] / hbm)
    assert 0 < verify["peak_fraction"] <= 1
    collective = next(r for r in rows if r["kind"] == "collective")
    assert collective["peak_fraction"] is None  # no work recorded, only latency
