"""The memory-fit check: weights, KV cache and activations on every device used."""

from dataclasses import replace

import pytest

from analyses.run.api import SimConfig, run_models, simulate
from analyses.commands.compare import DEFAULTS
from analyses.compare.scenario import declared_defaults
from analyses.run.memory import Run, check_fit, tier_needs
from hwprofiles import list_names, load_model, load_platform
from policies import entry, names, parse_params

from test_cli import hetspec

H100 = load_platform("h100-sxm-5x")
A100 = load_platform("a100-sxm-8x")
L70 = load_model("llama-3.1-70b")
Q32 = load_model("qwen3-32b")


def _needs(platform, models, placement, policy="ar", params=None, **run):
    params = parse_params(policy, params or {})
    r = Run(policy, params, streams_weights=entry(policy).streams_weights, **run)
    return tier_needs(platform, models, {**platform.placement, **placement}, r)


def test_tensor_parallel_shards_weights_and_kv_evenly():
    needs = _needs(H100, {"target": L70}, {}, prompt_tokens=1000, tokens=1000, batch=2)
    assert sorted(needs) == ["hbm0", "hbm1", "hbm2", "hbm3"]
    kv_per_token = 80 * 2 * 8 * 128 * 2
    for need in needs.values():
        assert need.weights == pytest.approx(L70.weight_bytes / 4)
        assert need.kv == pytest.approx(kv_per_token * (2000 + 1) * 2 / 4)


def test_draft_weights_sit_on_the_draft_device():
    small = load_model("llama-3.2-1b")
    needs = _needs(H100, {"target": L70, "draft": small}, {}, "sd", {"gamma": 5})
    assert needs["hbm4"].devices == ["gpu4"]
    assert needs["hbm4"].roles == ["draft=llama-3.2-1b"]
    assert needs["hbm4"].weights == pytest.approx(small.weight_bytes)


def test_self_draft_layers_and_exit_head_on_their_own_device():
    needs = _needs(A100, {"target": Q32}, {"draft": "gpu1"}, "sd", {"draft_layers": 8})
    own = 8 * Q32.layer_bytes + Q32.head_bytes + Q32.hidden * Q32.vocab * 2
    assert needs["hbm1"].weights == pytest.approx(own)
    assert needs["hbm1"].kv == pytest.approx(8 * Q32.kv_bytes_per_token_layer() * 1)


def test_pipeline_stages_hold_their_layers():
    needs = _needs(A100, {"target": Q32}, {}, "ppsd", {"exit_layer": 8})
    assert len(needs) == 8  # 64 layers, 8 per stage
    middle = needs["hbm3"]
    assert middle.weights == pytest.approx(8 * Q32.layer_bytes)
    total = sum(n.weights for n in needs.values())
    assert total == pytest.approx(Q32.weight_bytes + Q32.head_bytes)  # + the exit head


def test_streaming_schedule_keeps_its_budget_resident():
    plat = load_platform("snapdragon-8-gen3")
    vicuna = load_model("vicuna-7b")
    needs = _needs(plat, {"target": vicuna}, {}, "ar_stream", {"dram_budget_gb": 4})
    non_layer = vicuna.head_bytes + vicuna.hidden * vicuna.vocab * 2
    assert needs["dram"].weights == pytest.approx(4e9 + non_layer)


def test_precision_changes_weight_and_kv_bytes_not_flops():
    cfg = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", weight_bits=4, kv_bits=8)
    spec = run_models(cfg)["target"]
    assert spec.weight_bytes == pytest.approx(L70.weight_bytes / 4)
    assert spec.kv_bytes_per_token_layer() == L70.kv_bytes_per_token_layer() / 2
    assert spec.layer_flops(5, 100) == L70.layer_flops(5, 100)
    # 70B in 4 bits fits on one H100 (35 GB); in 16 bits it does not
    check_fit(H100, {"target": spec}, {"target": "gpu0"}, Run(tokens=100))
    with pytest.raises(ValueError, match="weights 141.1 GB"):
        check_fit(H100, {"target": L70}, {"target": "gpu0"}, Run(tokens=100))


def test_weight_bits_speed_up_a_memory_bound_step():
    base = dict(platform="h100-sxm-5x", target="qwen3-32b", policy="ar", tokens=20,
                deterministic=True, fixed_context=True, placement={"target": "gpu0"})
    wide = simulate(SimConfig(**base), baseline=False).metrics["step_latency_s"]
    narrow = simulate(SimConfig(**base, weight_bits=8), baseline=False).metrics
    assert narrow["step_latency_s"] < 0.6 * wide


def test_kv_cache_can_overflow_and_the_refusal_says_so():
    out = hetspec("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                  "--policy", "ar", "--batch", "256", "--tokens", "2000",
                  "--set", "prompt_tokens=8000")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    line = out.stderr
    assert "device gpu0 of h100-sxm-5x" in line and "85.5 GB" in line
    # 80 layers x 2 x 8 heads x 128 x 2 bytes per position, 10001 positions, 256 rows / 4
    kv_gb = 80 * 2 * 8 * 128 * 2 * 10_001 * 256 / 4 / 1e9
    assert f"KV cache {kv_gb:.1f} GB" in line
    # no narrower cache alone fits (8 bits: 105 GB of cache); the refusal names the
    # largest batch the same check accepts, and one more is refused
    batch = int(line.split("--batch ")[1].split()[0])
    run = Run("ar", parse_params("ar", {}), prompt_tokens=8000, tokens=2000)
    check_fit(H100, {"target": L70}, H100.placement, replace(run, batch=batch))
    with pytest.raises(ValueError):
        check_fit(H100, {"target": L70}, H100.placement, replace(run, batch=batch + 1))


def test_refusal_names_each_change_that_fits_with_its_number():
    """At batch 64 x 8k (a fixed context) one prefill pass holds 23.6 GB of
    activations per GPU of TP4: the refusal names prefill_chunk, which fits, and
    the check agrees (the next wider chunk does not)."""
    run = Run("ar", parse_params("ar", {}), prompt_tokens=8192, tokens=0, batch=64)
    with pytest.raises(ValueError) as err:
        check_fit(H100, {"target": L70}, H100.placement, run)
    text = str(err.value)
    assert "activations 23.62 GB" in text and text.count(";") == 1
    chunk = int(text.split("--set prefill_chunk=")[1].split()[0])
    check_fit(H100, {"target": L70}, H100.placement, replace(run, prefill_chunk=chunk))
    with pytest.raises(ValueError):
        check_fit(H100, {"target": L70}, H100.placement, replace(run, prefill_chunk=2 * chunk))


def test_refusal_names_the_device_need_and_capacity():
    with pytest.raises(ValueError) as err:
        check_fit(H100, {"target": L70}, {"target": "gpu0"}, Run(tokens=100))
    text = str(err.value)
    assert text.startswith("device gpu0 of h100-sxm-5x (memory tier hbm0, 85.5 GB) "
                           "would need 141.")
    assert "weights 141.1 GB + KV cache" in text and text.count(";") == 1


@pytest.mark.parametrize("policy", names())
def test_the_default_compare_scenario_fits(policy):
    """Every schedule of the default `hetspec compare` (its platform, models and
    the settings compare supplies) passes the check at its token count."""
    base = dict(DEFAULTS)
    plat = load_platform(base["platform"])
    models = {"target": load_model(base["target"]), "draft": load_model(base["draft"])}
    params = {k: v for k, v in declared_defaults([policy], set(), base).items()
              if k in entry(policy).params.model_fields}
    run = Run(policy, parse_params(policy, params), prompt_tokens=128, tokens=1000,
              streams_weights=entry(policy).streams_weights)
    check_fit(plat, models, plat.placement, run)


@pytest.mark.parametrize("platform", list_names("platforms"))
def test_every_shipped_platform_fits_a_model_it_ships_for(platform):
    """Each platform's default placement holds at least the smallest shipped
    model with its default run (so no platform became unusable)."""
    plat = load_platform(platform)
    smallest = min((load_model(n) for n in list_names("models")),
                   key=lambda m: m.weight_bytes)
    check_fit(plat, {"target": smallest}, plat.placement, Run(prompt_tokens=128,
                                                             tokens=2000))


def test_every_sequence_reserves_kv_for_the_positions_a_verify_adds():
    """A speculative verify feeds gamma + 1 positions per sequence, and each sequence
    holds KV for them: the target's KV cache at batch B grows by B x gamma positions
    over AR's, so the largest batch that fits shrinks as gamma grows."""
    models = {"target": L70, "draft": load_model("llama-3.2-1b")}
    kv_per_position = 80 * 2 * 8 * 128 * 2 / 4  # one of the target's four shards
    ar = _needs(H100, models, {}, "ar", prompt_tokens=128, tokens=64, batch=32)["hbm0"]
    for gamma in (4, 16):
        sd = _needs(H100, models, {}, "sd", {"gamma": gamma}, prompt_tokens=128, tokens=64,
                    batch=32)["hbm0"]
        assert sd.kv - ar.kv == pytest.approx(32 * gamma * kv_per_position, rel=1e-12)
    from analyses.run.capacity import largest_batch

    def largest(gamma: int) -> int:
        cfg = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b",
                        draft="llama-3.2-1b", policy="sd", params={"gamma": gamma},
                        tokens=64, prompt_tokens=128)
        return largest_batch(cfg, H100, 128)

    assert largest(2) > largest(16) > largest(32)
