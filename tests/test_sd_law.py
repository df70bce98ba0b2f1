"""Deterministic simulation of AR and vanilla SD against Leviathan's law."""

import pytest

from analyses.run.api import SimConfig, simulate
from policies.sd import leviathan
from analyses.laws.terms import law_terms
from hwprofiles import load_model, load_platform
from simcore import RooflineCost

CONTEXT = 128
# (draft model, draft device): different draft sizes give different cost ratios c
DRAFTS = [("llama-3.2-1b", "gpu4"), ("qwen3-0.6b", "gpu4"), ("llama-2-13b", "gpu4")]


def _costs(draft_name, gamma):
    platform = load_platform("h100-sxm-5x")
    cost = RooflineCost(platform)
    target, draft = load_model("llama-3.1-70b"), load_model(draft_name)
    # draft step i attends to the i tokens it drafted before it
    t_drafts = sum(cost.forward(draft, "gpu4", (0, draft.n_layers), 1, 1, CONTEXT + i,
                                "lm", None).total_s for i in range(gamma))
    t_ar = cost.forward(target, "target_tp", (0, 80), 1, 1, CONTEXT, "lm", None)
    t_verify = cost.forward(target, "target_tp", (0, 80), gamma + 1, 1, CONTEXT, "lm", None)
    # the proposal (gamma int32 ids) goes gpu4 -> gpu0, the verdict (8 bytes) back
    (link,) = platform.route("gpu4", "gpu0")
    t_trips = cost.hop_s(link, 4 * gamma) + cost.hop_s(link, 8)
    return t_drafts / gamma, t_ar.total_s, t_verify.total_s, t_trips


def _sim(draft, alpha, gamma):
    cfg = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft=draft,
                    policy="sd", params={"gamma": gamma},
                    acceptance={"kind": "iid", "alpha": alpha}, tokens=400,
                    deterministic=True, fixed_context=True, prompt_tokens=CONTEXT)
    return simulate(cfg).metrics


@pytest.mark.parametrize("draft,_dev", DRAFTS)
@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
def test_deterministic_sd_speedup_equals_leviathan(draft, _dev, alpha, gamma):
    t_draft, t_ar, t_verify, t_trips = _costs(draft, gamma)
    m = _sim(draft, alpha, gamma)
    # c: one draft step, its share of the proposal/verdict messages included, over
    # one target step
    law = leviathan(alpha, gamma, c=(t_draft + t_trips / gamma) / t_ar)
    # the law assumes T_target(gamma+1) = T_target(1); the roofline keeps that within 0.5%
    assert m["speedup_vs_ar"] == pytest.approx(law["speedup"], rel=5e-3)
    # the step composition itself is exact: gamma draft steps, the proposal's trip, one
    # verify, the verdict's trip
    assert m["step_latency_s"] == pytest.approx(gamma * t_draft + t_trips + t_verify,
                                                rel=1e-9)
    assert m["mean_tokens_per_step"] == pytest.approx(law["expected_tokens_per_step"],
                                                      rel=1e-9)
    exact = law["expected_tokens_per_step"] * t_ar / (gamma * t_draft + t_trips + t_verify)
    assert m["speedup_vs_ar"] == pytest.approx(exact, rel=1e-9)


def test_cost_ratio_grid_spans_cheap_and_costly_drafts():
    # on the H100 calibrated to published runs a small draft's step carries ~28 us
    # per layer (effective per-layer cost) and the draft GPU's fitted terms, so the
    # cheapest shipped drafts sit near c = 0.07 rather than the roofline's 0.03
    ratios = [_costs(d, 3)[0] / _costs(d, 3)[1] for d, _ in DRAFTS]
    assert min(ratios) < 0.08 and max(ratios) > 0.5


def test_random_mode_converges_to_expected_tokens():
    cfg = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                    policy="sd", params={"gamma": 5},
                    acceptance={"kind": "iid", "alpha": 0.8}, tokens=20000, seed=3)
    m = simulate(cfg).metrics
    assert m["mean_tokens_per_step"] == pytest.approx(
        leviathan(0.8, 5)["expected_tokens_per_step"], rel=0.02)


def test_batch_rows_commit_independently():
    base = dict(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                policy="sd", params={"gamma": 4}, acceptance={"kind": "iid", "alpha": 0.7},
                tokens=300, deterministic=True, fixed_context=True)
    one = simulate(SimConfig(**base)).metrics
    eight = simulate(SimConfig(**base, batch=8)).metrics
    assert eight["mean_tokens_per_step"] == pytest.approx(one["mean_tokens_per_step"])
    # eight rows share each weight read: far more than 1x, less than 8x the throughput
    assert one["tokens_per_s"] * 1.5 < eight["tokens_per_s"] < 8 * one["tokens_per_s"]


def test_positional_and_histogram_acceptance_expectations():
    pos = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                    policy="sd", params={"gamma": 3},
                    acceptance={"kind": "positional", "alphas": (0.9, 0.5, 0.2)},
                    tokens=200, deterministic=True)
    assert simulate(pos).metrics["mean_tokens_per_step"] == pytest.approx(
        1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2)
    hist = pos.revised(acceptance={"kind": "histogram", "probs": (0.2, 0.3, 0.1, 0.1, 0.3)})
    # with gamma=3 the mass of k=4 folds onto k=3
    assert simulate(hist).metrics["mean_tokens_per_step"] == pytest.approx(
        1 + 0.3 + 0.2 + 3 * 0.4)


# Every shipped platform with a target that fits it and a draft its draft device runs
# (None: a 4-layer self-draft; the phone's NPU has no fp32 for SmolLM2's weights).
SHIPPED = {"a100-sxm-8x": ("vicuna-7b", "llama-3.2-1b"),
           "h100-sxm-5x": ("llama-3.1-70b", "llama-3.2-1b"),
           "m2-ultra-8x": ("qwen3-32b", "qwen3-0.6b"),
           "jetson-agx-orin-64gb": ("vicuna-7b", "llama-3.2-1b"),
           "snapdragon-8-gen3": ("llama-3.2-1b", None),
           "cpu-local": ("smollm2-135m", "smollm2-135m")}


@pytest.mark.parametrize("platform", sorted(SHIPPED))
@pytest.mark.parametrize("alpha,gamma", [(0.6, 3), (0.9, 5)])
def test_sd_equals_its_law_with_cost_model_times_on_every_shipped_platform(platform, alpha,
                                                                           gamma):
    """Leviathan's law with the cost model's step times (sd_law_terms: gamma
    draft steps and both trips, one verify of gamma + 1 positions, one AR token)
    is what the deterministic simulation gives, on every shipped platform; the
    plain law (T_target(gamma+1) = T_AR) stays within 0.5% where the verify's extra
    positions cost next to nothing."""
    target, draft = SHIPPED[platform]
    params = {"gamma": gamma} if draft else {"gamma": gamma, "draft_layers": 4}
    cfg = SimConfig(platform=platform, target=target, draft=draft, policy="sd",
                    params=params, acceptance={"kind": "iid", "alpha": alpha}, tokens=400,
                    deterministic=True, fixed_context=True, prompt_tokens=CONTEXT)
    terms = law_terms(cfg)
    simulated = simulate(cfg).metrics["speedup_vs_ar"]
    assert simulated == pytest.approx(terms.law(alpha)["speedup"], rel=1e-9)
    if terms.t_verify_s <= 1.005 * terms.t_ar_s:
        assert simulated == pytest.approx(leviathan(alpha, gamma, c=terms.c)["speedup"],
                                          rel=5e-3)
