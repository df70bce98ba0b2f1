"""hetspec fit: its answers are the memory check's own edge (accepted there, one
step above refused), for every layout of the platform's groups."""

import json

import pytest

from analyses.run.api import (RunConfig, check_positions, memory_request, run_models,
                             run_schedule)
from analyses.run.memory import check_fit
from hwprofiles import load_platform
from hwprofiles.schema import resolve

from test_cli import hetspec

H100_8X = load_platform("h100-sxm-8x")


def _check(config: RunConfig) -> None:
    """The model's positions and the memory check exactly as run_schedule calls
    them (a context at the model's max_positions ends the search before memory)."""
    platform = load_platform(config.platform)
    check_positions(config)
    check_fit(platform, run_models(config), resolve(platform, config.placement),
              memory_request(config))


@pytest.fixture(scope="module")
def report():
    out = hetspec("fit", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("group", ["tp2", "tp4", "tp8"])
def test_largest_batch_at_8k_is_the_checks_edge(report, group):
    row = next(r for r in report["layouts"] if r["where"] == group)
    batch = row["largest_batch"]["8192"]
    assert batch >= 1 and row["devices"] == int(group[2:])
    config = RunConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                       prompt_tokens=8192, tokens=1000, batch=batch,
                       placement={"target": group, "draft": group})
    _check(config)
    with pytest.raises(ValueError, match="would need"):
        _check(config.revised(batch=batch + 1))


def test_a_pipeline_layout_is_the_checks_edge_too(report):
    """AR as a pipeline over stage0..stage3: ceil(80/4) = 20 layers a stage."""
    row = next(r for r in report["layouts"] if r["layout"].startswith("PP4"))
    assert row["params"] == {"pipeline_layers": 20} and row["devices"] == 4
    batch = row["largest_batch"]["8192"]
    config = RunConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                       params={"pipeline_layers": 20}, prompt_tokens=8192, tokens=1000,
                       batch=batch)
    _check(config)
    with pytest.raises(ValueError, match="would need"):
        _check(config.revised(batch=batch + 1))


def test_the_cli_refuses_one_batch_above_the_answer(report):
    row = next(r for r in report["layouts"] if r["where"] == "tp4")
    batch = row["largest_batch"]["8192"]
    common = ["simulate", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b",
              "--policy", "ar", "--set", "prompt_tokens=8192", "--tokens", "1000",
              "--placement", "target=tp4"]
    out = hetspec(*common, "--batch", str(batch + 1))
    assert out.returncode == 2 and "would need" in out.stderr


def test_a_run_at_the_answer_simulates():
    out = hetspec("fit", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b",
                  "--contexts", "8192", "--tokens", "20", "--json")
    row = next(r for r in json.loads(out.stdout)["layouts"] if r["where"] == "tp2")
    config = RunConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                       prompt_tokens=8192, tokens=20, deterministic=True,
                       batch=row["largest_batch"]["8192"], placement={"target": "tp2"})
    assert run_schedule(config, record_spans=False).tokens == 20 * config.batch


def test_longest_context_and_fewest_devices(report):
    tp1 = next(r for r in report["layouts"] if r["devices"] == 1)
    assert tp1["largest_batch"]["8192"] is None and "141.1 GB" in tp1["why_not"]
    assert report["fewest_devices"]["devices"] == 2  # 70B in bf16: 141 GB over 80 GB GPUs
    row = next(r for r in report["layouts"] if r["where"] == "tp8")
    longest = row["longest_context"]["1"]
    config = RunConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                       prompt_tokens=longest, tokens=1000, placement={"target": "tp8"})
    _check(config)
    with pytest.raises(ValueError):
        _check(config.revised(prompt_tokens=longest + 1))


def test_memory_breakdown_adds_up(report):
    row = next(r for r in report["layouts"] if r["where"] == "tp8")
    for m in row["memory"]:
        assert m["total_bytes"] == pytest.approx(
            m["weights_bytes"] + m["kv_bytes"] + m["activations_bytes"])
        assert m["total_bytes"] <= m["capacity_bytes"]
    assert len(row["memory"]) == 8


def test_a_mixture_of_experts_gets_expert_parallel_layouts():
    out = hetspec("fit", "--platform", "h100-sxm-8x", "--target", "qwen3-30b-a3b", "--json")
    layouts = [r["layout"] for r in json.loads(out.stdout)["layouts"]]
    assert "EP8 (tp8)" in layouts and "TP8 (tp8)" in layouts


def test_refused_lists_and_text_output():
    out = hetspec("fit", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b",
                  "--contexts", "8k")
    assert out.returncode == 2 and "--contexts" in out.stderr
    out = hetspec("fit", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b",
                  "--contexts", "2048,8192", "--batches", "1,16")
    assert out.returncode == 0 and "fewest devices: 2" in out.stdout
    assert "TP8 (tp8)" in out.stdout
