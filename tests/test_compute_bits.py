"""compute_bits=8: matrix products at the device's 8-bit peak (FP8, or INT8 where
the device has no FP8), refused in one sentence where the profile gives neither;
storage widths stay weight_bits and kv_bits."""

import pytest

from analyses.run.api import RunConfig, run_models
from analyses.run.memory import Run, tier_needs
from hwprofiles import load_model, load_platform
from simcore import CostError
from simcore.costmodel import RooflineCost

from test_cli import hetspec

L70 = load_model("llama-3.1-70b")


def _peak(platform: str, spec) -> float:
    plat = load_platform(platform)
    return RooflineCost(plat).terms(spec, plat.placement["target"], (0, 1), 1, 1, None,
                                    None).peak_flops


@pytest.mark.parametrize("platform, dtype", [("h100-sxm-5x", "fp8"),
                                             ("a100-sxm-8x", "int8"),
                                             ("mi300x-8x", "fp8")])
def test_the_eight_bit_peak_is_the_devices_fp8_else_int8(platform, dtype):
    plat = load_platform(platform)
    device = plat.device(plat.members(plat.placement["target"])[0])
    spec = L70.with_precision(compute_bits=8)
    assert _peak(platform, spec) == device.peak_flops[dtype]
    assert _peak(platform, L70) == device.peak_flops["bf16"]


def test_a_device_without_an_eight_bit_peak_is_refused_in_one_sentence():
    spec = L70.with_precision(compute_bits=8)
    with pytest.raises(CostError, match="peak_flops.fp8 or int8"):
        _peak("m2-ultra-8x", spec)
    out = hetspec("simulate", "--platform", "m2-ultra-8x", "--target", "qwen3-32b",
                  "--policy", "ar", "--tokens", "10", "--set", "compute_bits=8")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "compute_bits=8 needs an 8-bit peak on device" in out.stderr


def test_compute_bits_halves_a_compute_bound_prefill_and_leaves_storage_alone():
    base = dict(platform="h100-sxm-5x", target="llama-3.1-70b", policy="ar", tokens=2,
                deterministic=True, fixed_context=True, prompt_tokens=4096)
    from analyses.run.api import simulate

    wide = simulate(RunConfig(**base), baseline=False).metrics["prefill_s"]
    narrow = simulate(RunConfig(**base, compute_bits=8), baseline=False).metrics["prefill_s"]
    assert 0.45 < narrow / wide < 0.6  # FLOPs at twice the rate; all-reduces at 8 bits
    spec = run_models(RunConfig(**base, compute_bits=8))["target"]
    assert spec.weight_bytes == L70.weight_bytes
    assert spec.kv_bytes_per_token_layer() == L70.kv_bytes_per_token_layer()
    assert spec.dtype_bytes == 1 and L70.dtype_bytes == 2  # the products' inputs


def test_activations_in_the_memory_check_follow_compute_bits():
    plat = load_platform("h100-sxm-5x")
    run = Run(prompt_tokens=4096, tokens=0, batch=8)
    wide = tier_needs(plat, {"target": L70}, plat.placement, run)["hbm0"]
    narrow = tier_needs(plat, {"target": L70.with_precision(compute_bits=8)},
                        plat.placement, run)["hbm0"]
    assert narrow.activations == pytest.approx(wide.activations / 2)
    assert narrow.weights == wide.weights and narrow.kv == wide.kv


@pytest.mark.parametrize("value", [4, 32, "fp8", True])
def test_other_widths_are_refused(value):
    with pytest.raises(ValueError, match="compute_bits"):
        RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b", compute_bits=value)
