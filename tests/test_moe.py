"""Mixture of experts: active-expert FLOPs, distinct-expert bytes, expert parallelism."""

import itertools
import json
import math

import pytest

from analyses.run.api import SimConfig, run_models, simulate
from analyses.run.memory import Piece, weight_bytes
from hwprofiles import load_model, load_platform
from simcore.costmodel import RooflineCost

from test_cli import hetspec

MOE = load_model("qwen3-30b-a3b")


def test_shipped_qwen3_moe_counts_match_the_published_sizes():
    """The Qwen3-30B-A3B model card: 30.5B parameters in all, 29.9B without the
    embedding and LM head, 3.3B activated (the card cuts 3.35B to 3.3B)."""
    active = MOE.n_layers * MOE.layer_active_params + MOE.head_params + MOE.embed_params
    assert MOE.total_params == pytest.approx(30.5e9, abs=0.05e9)
    assert MOE.n_layers * MOE.layer_params == pytest.approx(29.9e9, abs=0.05e9)
    assert 3.3e9 <= active < 3.4e9
    assert load_model("Qwen/Qwen3-30B-A3B") == MOE


def test_expected_distinct_experts_is_the_exact_mean_over_routings():
    """E(1-(1-k/E)^r) equals the mean distinct count over every routing of r
    tokens each picking k of E experts (enumerated for E=5, k=2, r=3)."""
    spec = MOE.model_copy(update={"n_experts": 5, "n_active_experts": 2})
    choices = list(itertools.combinations(range(5), 2))
    counts = [len(set().union(*pick)) for pick in itertools.product(choices, repeat=3)]
    assert spec.expected_experts(3) == pytest.approx(sum(counts) / len(counts), rel=1e-12)
    assert MOE.expected_experts(1) == 8 and MOE.expected_experts(0) == 0
    assert MOE.expected_experts(10_000) == pytest.approx(128)


def test_one_row_reads_its_active_experts_and_computes_with_them():
    shared = MOE.layer_fixed_params
    assert MOE.layer_weight_bytes_read(1) == (shared + 8 * MOE.expert_params) * 2
    assert MOE.layer_bytes == (shared + 128 * MOE.expert_params) * 2
    attention = 4 * MOE.n_heads * MOE.dim_per_head  # one position attending to itself
    assert MOE.layer_flops(1, 0) == (2 * (shared - 2 * MOE.hidden + 8 * MOE.expert_params)
                                     + attention)


def test_forward_bytes_grow_with_the_experts_the_rows_touch():
    """A Forward's bytes are the layers' distinct-expert weights plus KV plus head:
    one row reads 8 experts a layer, 64 rows about 126 of 128."""
    cost = RooflineCost(load_platform("h100-sxm-5x"))
    kv = MOE.kv_bytes_per_token_layer()
    for rows in (1, 64):
        c = cost.forward(MOE, "gpu4", (0, MOE.n_layers), 1, rows, 1000, "lm", None)
        expected = (MOE.n_layers * (MOE.layer_weight_bytes_read(rows) + kv * rows * 1001)
                    + MOE.head_bytes)
        assert c.nbytes == pytest.approx(expected, rel=1e-12)
    assert MOE.layer_weight_bytes_read(64) / MOE.layer_weight_bytes_read(1) > 7


def test_expert_parallel_pays_attention_allreduce_and_two_all_to_alls():
    platform = load_platform("h100-sxm-5x")
    group = platform.group("target_tp")
    ep = MOE.model_copy(update={"expert_parallel": True})
    cost = RooflineCost(platform)
    rows = 4
    tp = cost.forward(MOE, "target_tp", (0, 48), 1, rows, 100, None, None)
    ex = cost.forward(ep, "target_tp", (0, 48), 1, rows, 100, None, None)
    act = rows * MOE.hidden * MOE.dtype_bytes
    assert tp.collective_s == pytest.approx(96 * group.allreduce_s(act))
    sent = rows / 4 * 8 * 3 / 4 * MOE.hidden * 2  # 3/4 of each token's 8 copies leave
    assert MOE.dispatch_bytes(rows, 4) == sent
    a2a = 3 * group.alpha_s + sent / (group.bandwidth_gb_s * 1e9)
    assert group.alltoall_s(sent) == pytest.approx(a2a)
    assert ex.collective_s == pytest.approx(48 * (group.allreduce_s(act) + 2 * a2a))
    assert ex.nbytes == tp.nbytes and ex.flops == tp.flops  # same work, other wires


def test_expert_parallel_member_holds_whole_experts():
    """128 experts over 3 members: the busiest holds ceil(128/3) = 43 whole ones."""
    ep = MOE.model_copy(update={"expert_parallel": True})
    layer = (MOE.layer_fixed_params / 3 + 43 * MOE.expert_params) * 2
    got = weight_bytes(Piece("target", "g", ep, MOE.n_layers), 3)
    assert got == pytest.approx(MOE.n_layers * layer)
    assert weight_bytes(Piece("target", "g", MOE, MOE.n_layers), 3) == pytest.approx(
        MOE.n_layers * MOE.layer_bytes / 3)


def test_moe_target_simulates_and_expert_parallel_changes_only_collectives():
    base = dict(platform="h100-sxm-5x", target="qwen3-30b-a3b", policy="ar", tokens=50,
                deterministic=True, fixed_context=True)
    tp = simulate(SimConfig(**base), baseline=False).metrics
    ep = simulate(SimConfig(**base, expert_parallel=True), baseline=False).metrics
    assert tp["tokens"] == ep["tokens"] == 50
    assert tp["step_latency_s"] != ep["step_latency_s"]
    models = run_models(SimConfig(**base, expert_parallel=True))
    assert models["target"].expert_parallel


def test_expert_parallel_on_a_dense_model_is_refused():
    out = hetspec("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                  "--policy", "ar", "--tokens", "10", "--set", "expert_parallel=on")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "expert_parallel" in out.stderr


def test_moe_fields_are_all_or_none():
    data = json.loads(MOE.model_dump_json(exclude_defaults=True))
    data.pop("expert_ffn")
    with pytest.raises(ValueError, match="add expert_ffn"):
        type(MOE).model_validate(data)
    data["expert_ffn"], data["n_active_experts"] = 768, 129
    with pytest.raises(ValueError, match="exceeds n_experts"):
        type(MOE).model_validate(data)
    assert math.isclose(MOE.expected_experts(2), 128 * (1 - (120 / 128) ** 2))
