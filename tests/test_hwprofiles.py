"""The shipped hardware profiles load, their numbers add up, and bad files fail clearly."""

from __future__ import annotations

import itertools

import pytest
import yaml

from hwprofiles import ProfileError, list_names, load_model, load_platform

PLATFORMS = list_names("platforms")
MODELS = list_names("models")


def _write(tmp_path, name: str, data: dict):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tiny_platform(link_bandwidth_gb_s: float = 10.0) -> dict:
    """A valid two-device platform, as plain data, for tests to break."""
    device = {"kind": "cpu", "memory": "dram", "peak_flops": {"fp32": 1.0e11},
              "sources": {"peak_flops": "test"}}
    return {
        "name": "tiny",
        "memory_tiers": [{"name": "dram", "kind": "dram", "capacity_bytes": 1.0e9,
                          "bandwidth_gb_s": 10.0,
                          "sources": {"capacity_bytes": "test", "bandwidth_gb_s": "test"}}],
        "devices": [{"name": "a", **device}, {"name": "b", **device}],
        "links": [{"name": "a-b", "endpoints": ["a", "b"], "latency_s": 1.0e-6,
                   "bandwidth_gb_s": link_bandwidth_gb_s,
                   "sources": {"latency_s": "test", "bandwidth_gb_s": "test"}}],
        "placement": {"target": "a", "draft": "b"},
    }


def test_shipped_lists_hold_the_new_profiles():
    for name in ("a100-sxm-8x", "m2-ultra-8x", "jetson-agx-orin-64gb",
                 "snapdragon-8-gen3", "cpu-local", "h100-sxm-5x"):
        assert name in PLATFORMS
    for name in ("qwen3-32b", "qwen3-14b", "qwen3-0.6b", "vicuna-7b", "vicuna-13b",
                 "llama-2-13b", "llama-2-70b", "mistral-24b", "opt-66b", "llama-3.1-70b"):
        assert name in MODELS


@pytest.mark.parametrize("name", PLATFORMS)
def test_every_shipped_platform_loads(name):
    platform = load_platform(name)
    assert platform.name == name
    assert platform.placement, "every shipped platform says where target and draft run"


@pytest.mark.parametrize("name", MODELS)
def test_every_shipped_model_loads(name):
    model = load_model(name)
    assert model.name == name
    assert model.layer_bytes > 0 and model.total_params > 0


def test_vicuna_7b_layer_is_202_4m_fp16_params():
    model = load_model("vicuna-7b")
    assert model.layer_params == 202_383_360
    assert model.layer_bytes == pytest.approx(0.4048e9, rel=1e-3)


def test_llama_3_1_70b_has_70_6b_params():
    assert load_model("llama-3.1-70b").total_params == pytest.approx(70.6e9, rel=0.01)


def test_qwen3_0_6b_counts_tied_embeddings_once():
    model = load_model("qwen3-0.6b")
    # Qwen's model card: 0.6B parameters in all, 0.44B without embeddings.
    assert model.total_params == pytest.approx(0.6e9, rel=0.01)
    assert model.n_layers * model.layer_params == pytest.approx(0.44e9, rel=0.01)
    # Untied, the 156M-parameter embedding would push it past 0.75B.
    assert model.total_params < 0.7e9


@pytest.mark.parametrize("name", PLATFORMS)
def test_placement_targets_exist_and_target_reaches_every_role(name):
    platform = load_platform(name)
    target = platform.members(platform.placement["target"])
    for role, where in platform.placement.items():
        members = platform.members(where)  # raises KeyError if unknown
        assert members, f"{name}: placement.{role} resolves to no device"
        for src, dst in itertools.product(target, members):
            if src != dst:
                assert platform.route(src, dst), f"{name}: no route {src} -> {dst}"


def test_m2_ultra_token_channel_runs_gpu_cpu_ane():
    route = load_platform("m2-ultra-8x").route("gpu0", "ane0")
    assert len(route) == 2
    assert "cpu0" in route[0].endpoints and "cpu0" in route[1].endpoints
    assert set(route[0].endpoints) == {"gpu0", "cpu0"}
    assert set(route[1].endpoints) == {"cpu0", "ane0"}


def test_model_number_without_source_names_the_field(tmp_path):
    data = load_model("vicuna-7b").model_dump()
    del data["sources"]["vocab"]
    with pytest.raises(ProfileError) as err:
        load_model(_write(tmp_path, "no-vocab-source", data))
    assert "vocab" in str(err.value) and "no source" in str(err.value)


def test_platform_number_without_source_names_the_field(tmp_path):
    data = _tiny_platform()
    del data["links"][0]["sources"]["latency_s"]
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "no-latency-source", data))
    assert "latency_s" in str(err.value) and "no source" in str(err.value)


def test_negative_bandwidth_names_bandwidth_gb_s(tmp_path):
    assert load_platform(_write(tmp_path, "ok", _tiny_platform())).name == "tiny"
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "negative", _tiny_platform(link_bandwidth_gb_s=-5.0)))
    assert "bandwidth_gb_s" in str(err.value)


@pytest.mark.parametrize("kind, load", [("platforms", load_platform), ("models", load_model)])
def test_unknown_name_lists_the_choices(kind, load):
    with pytest.raises(ProfileError) as err:
        load("no-such-profile")
    message = str(err.value)
    assert "no-such-profile" in message
    for name in list_names(kind):
        assert name in message


def test_cpu_local_has_a_measured_two_core_group_and_keeps_its_placement():
    platform = load_platform("cpu-local")
    group = next(g for g in platform.groups if g.name == "cpu_tp")
    assert group.members == ("cpu0", "cpu1") and group.algorithm == "alpha_beta"
    for name in ("alpha_s", "bandwidth_gb_s"):
        assert "benchmarks/measure_cpu.py --allreduce" in group.sources[name]
    assert dict(platform.placement) == {"target": "cpu0", "draft": "cpu1"}
    assert group.allreduce_s(1e6) > group.allreduce_s(4) > 0


def test_only_cpu_local_installs_streamed_weights_on_its_cores():
    """The cores of cpu-local read streamed layers themselves (measured rate and
    its command in the source); every other shipped device streams by DMA."""
    for name in PLATFORMS:
        for device in load_platform(name).devices:
            if name == "cpu-local":
                assert device.stream_host_gb_s > 0
                assert "measure_cpu.py --stream-host-only" in device.sources["stream_host_gb_s"]
            else:
                assert device.stream_host_gb_s is None, (name, device.name)


def test_stream_host_rate_without_source_names_the_field(tmp_path):
    data = _tiny_platform()
    data["devices"][0]["stream_host_gb_s"] = 5.0
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "no-host-source", data))
    assert "stream_host_gb_s" in str(err.value) and "no source" in str(err.value)
    data["devices"][0]["sources"]["stream_host_gb_s"] = "test"
    data["devices"][0]["stream_host_gb_s"] = 0.0
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "zero-host-rate", data))
    assert "stream_host_gb_s" in str(err.value)


@pytest.mark.parametrize("where,field,good,bad", [
    ("devices", "memory_half_bytes", 2e6, -1.0),
    ("devices", "compute_half_flops", 1e9, 1e30),
    ("devices", "memory_bandwidth_gb_s", 51.0, 0.0),
    ("devices", "call_overhead_s", 1e-4, 1e4),
    ("memory_tiers", "request_latency_s", 1e-4, -1e-4),
    ("memory_tiers", "queue_depth", 32, 0),
])
def test_efficiency_terms_need_a_source_and_a_sane_value(tmp_path, where, field, good, bad):
    """Each optional efficiency term is a number like the others: refused without a
    source, refused out of range (naming the field), loaded with both."""
    data = _tiny_platform()
    obj = data[where][0]
    if field == "request_latency_s":  # a request latency needs the request's size
        obj["request_bytes"], obj["sources"]["request_bytes"] = 2.0 ** 20, "test"
    obj[field] = good
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "no-source", data))
    assert field in str(err.value) and "no source" in str(err.value)
    obj["sources"][field] = "test"
    assert getattr(getattr(load_platform(_write(tmp_path, "ok", data)), where)[0],
                   field) == good
    obj[field] = bad
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "bad", data))
    assert field in str(err.value)


def test_request_latency_without_request_size_names_request_bytes(tmp_path):
    data = _tiny_platform()
    tier = data["memory_tiers"][0]
    tier["request_latency_s"], tier["sources"]["request_latency_s"] = 1e-4, "test"
    with pytest.raises(ProfileError) as err:
        load_platform(_write(tmp_path, "no-size", data))
    assert "request_bytes" in str(err.value)
