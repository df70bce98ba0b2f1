"""The law terms each schedule exports (``register(..., law_terms=...)``) are what
its deterministic simulation measures: every metric a schedule's terms predict
(``metrics()``: Mirror's eq. 10 phases, SSD's round, a step, bytes per token)
equals the run's within 0.5%, the tolerance of the law tests (the start-up round,
rollout or pipeline fill is the rest)."""

import pytest

from analyses.laws.terms import law_terms
from analyses.run.api import simulate
from analyses.run.config import SimConfig
from policies.base import entry, names

H100 = {"platform": "h100-sxm-5x", "target": "llama-3.1-70b", "draft": "llama-3.2-1b"}
M2 = {"platform": "m2-ultra-8x", "target": "qwen3-32b", "draft": "qwen3-0.6b"}
A100 = {"platform": "a100-sxm-8x", "target": "vicuna-7b"}
ORIN = {"platform": "jetson-agx-orin-64gb", "target": "vicuna-7b"}
PHONE = {"platform": "snapdragon-8-gen3", "target": "llama-3.2-1b"}

# (policy, models and platform, parameters, batch): at least one per exporting schedule
CASES = [
    ("sd", H100, {"gamma": 4}, 2),
    ("sd", PHONE, {"gamma": 3, "draft_layers": 4}, 1),
    ("ssd", H100, {"k": 4, "fanout": 2, "hit_rate": 0.6}, 1),
    ("ssd", H100, {"k": 7, "fanout": 3, "hit_rate": 0.9, "backup": "fast"}, 4),
    ("ssd", H100, {"k": 4, "hit_rate": 0.6, "partial_hits": "backup"}, 4),
    ("mirror", H100, {"gamma": 4, "omega": 1.0}, 1),
    ("mirror", M2, {"gamma": 12, "omega": 1.0}, 8),
    ("mirror", H100, {"gamma": 4, "omega": 0.8, "batch_fallback": "stall"}, 1),  # T_f stalls
    ("eesd", A100, {"exit_layer": 8, "gamma": 3, "exit_head": "norm"}, 1),
    ("ppsd", A100, {"exit_layer": 8, "exit_head": "transformer"}, 1),
    ("cats", ORIN, {"dram_budget_gb": 4.0}, 1),
    ("kangaroo", ORIN, {"dram_budget_gb": 4.0}, 1),
    ("ar_stream", ORIN, {"dram_budget_gb": 4.0}, 1),
]


def _config(policy: str, where: dict, params: dict, batch: int) -> SimConfig:
    return SimConfig(policy=policy, params=params, batch=batch, tokens=2000,
                     acceptance={"kind": "iid", "alpha": 0.8}, deterministic=True,
                     fixed_context=True, **where)


def test_every_schedule_that_exports_law_terms_is_checked_here():
    exporting = {name for name in names() if entry(name).law_terms is not None}
    assert exporting == {case[0] for case in CASES}


@pytest.mark.parametrize("policy,where,params,batch", CASES,
                         ids=[f"{c[0]}-{c[1]['platform']}-b{c[3]}" for c in CASES])
def test_exported_terms_are_what_the_deterministic_run_measures(policy, where, params,
                                                                batch):
    cfg = _config(policy, where, params, batch)
    predicted = law_terms(cfg).metrics()
    measured = simulate(cfg).metrics
    assert predicted  # a schedule's terms predict at least one metric
    for key, value in predicted.items():
        assert measured[key] == pytest.approx(value, rel=5e-3), key


def test_a_schedule_without_a_law_is_refused_by_name():
    cfg = SimConfig(policy="ar", **H100)
    with pytest.raises(ValueError, match="policy 'ar' exports no latency-law terms"):
        law_terms(cfg)
