"""Vanilla SD's draft sharding, ppsd's AR baseline, the CATS 2 GB budget and the
platforms and models added with them."""

import pytest

from analyses.run.api import SimConfig, baseline_config, simulate
from policies.ppsd import ppsd_law
from hwprofiles import load_model, load_platform
from policies import PolicyContext, PolicyError, build


def _first_draft(params):
    ctx = PolicyContext(target=load_model("qwen3-32b"), draft=load_model("qwen3-0.6b"),
                        tokens=4, batch=1, prompt_tokens=8, fixed_context=True,
                        expected_outcomes=True)
    return next(build("sd", ctx, {"gamma": 3, **params}))


def test_vanilla_sd_shards_its_draft_as_mirror_does_unless_asked():
    assert _first_draft({}).collectives == 2  # SPD, as Mirror's: equal terms
    assert _first_draft({"draft_collectives": None}).collectives is None  # two per layer


def test_sd_on_a_draft_group_pays_megatron_all_reduces_when_asked():
    def tps(params):
        cfg = SimConfig(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b",
                        policy="sd", params={"gamma": 4, **params}, tokens=200,
                        deterministic=True, fixed_context=True)
        return simulate(cfg, baseline=False).metrics["tokens_per_s"]

    assert load_platform("m2-ultra-8x").group("ane_tp").size > 1
    assert tps({"draft_collectives": None}) < tps({})


def test_ppsd_baseline_is_ar_through_the_same_stages():
    cfg = SimConfig(platform="a100-sxm-8x", target="llama-2-70b", policy="ppsd",
                    params={"exit_layer": 10}, acceptance={"kind": "iid", "alpha": 0.8},
                    tokens=400, deterministic=True, fixed_context=True)
    base = baseline_config(cfg)
    assert base.policy == "ar" and base.given("params") == {"pipeline_layers": 10}
    speedup = simulate(cfg).metrics["speedup_vs_ar"]
    law = ppsd_law(80, 10, 0.8)["speedup"]  # 3.33: eq. 6
    # stage-to-stage transfers and the exit head are charged only in the simulator
    assert speedup == pytest.approx(law, rel=0.06)


def test_pipelined_ar_visits_every_stage_once_per_token():
    cfg = SimConfig(platform="a100-sxm-8x", target="llama-2-70b", policy="ar",
                    params={"pipeline_layers": 10}, tokens=3, deterministic=True)
    spans = simulate(cfg, baseline=False).result.spans
    forwards = [s for s in spans if s.kind == "compute"]
    assert len(forwards) == 3 * 8
    assert {s.device for s in forwards} == {f"gpu{k}" for k in range(8)}


CATS_2GB = dict(platform="jetson-agx-orin-64gb", target="vicuna-7b", policy="cats",
                tokens=40, deterministic=True)


def test_cats_two_gigabyte_budget_with_the_buffer_outside():
    params = {"dram_budget_gb": 2, "mean_accepted": 3.0}
    with pytest.raises(PolicyError, match="buffer_in_budget=false"):
        simulate(SimConfig(**CATS_2GB, params=params))
    out = simulate(SimConfig(**CATS_2GB, params={**params, "buffer_in_budget": False}))
    assert out.metrics["resident_layers"] == 4  # 2 GB / 0.405 GB per layer
    assert out.metrics["l_sv"] == 4
    base = baseline_config(out.config)
    assert base.policy == "ar_stream" and base.params.buffer_in_budget is False


@pytest.mark.parametrize("name, params_b", [("llama-3-8b", 8.03), ("vicuna-33b", 32.5),
                                            ("llama-2-7b", 6.74)])
def test_added_models_have_their_published_sizes(name, params_b):
    """Sizes as the model cards print them (8.03B; LLaMA-33B's 32.5B; 6.74B)."""
    assert load_model(name).total_params / 1e9 == pytest.approx(params_b, rel=0.002)


def test_added_platforms():
    h100 = load_platform("h100-sxm-8x")
    assert h100.group("tp8").size == 8 and h100.placement["target"] == "tp8"
    a100 = load_platform("a100-sxm-40gb")
    # the "40GB" card holds 40 GiB, as its driver reports (40,960 MiB)
    assert a100.tier("hbm0").capacity_bytes == 40 * 2**30
    cfg = SimConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                    tokens=20, deterministic=True)
    assert simulate(cfg, baseline=False).metrics["tokens_per_s"] > 0
