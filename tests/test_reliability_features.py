"""Bad inputs for the newer options, and hand checks of their numbers.

Precision (weight_bits, kv_bits), the memory check and expert parallelism,
chunked prefill, token trees (tree, width/depth/nodes, rank_alphas, ``law
tree``), ``profiles import`` and ``calibrate --fit-terms``: each bad value is
one sentence naming what is wrong (exit 2, no traceback, no hang), before any
work, with no output written and every input byte-identical. The number checks
recompute by hand what these features report: MoE active parameters, a
prompt's prefill FLOPs, time to first token, a tree's expected accepted length.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from clicases import assert_refused, digest, run_cli

DATA = Path(__file__).parents[1] / "hwprofiles" / "data"
SIMULATE = ("simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--tokens",
            "20", "--deterministic", "--policy")

# --set VALUE for a run option or a tree parameter -> a fragment the sentence names
SET_CASES = {
    "weight_bits 3": ("sd", "weight_bits=3", "weight_bits"),
    "weight_bits 0": ("sd", "weight_bits=0", "weight_bits"),
    "weight_bits negative": ("sd", "weight_bits=-4", "weight_bits"),
    "weight_bits huge": ("sd", "weight_bits=1e9", "weight_bits"),
    "weight_bits boolean": ("sd", "weight_bits=true", "weight_bits"),
    "weight_bits nan": ("sd", "weight_bits=nan", "weight_bits"),
    "weight_bits list": ("sd", "weight_bits=4,8", "weight_bits"),
    "weight_bits text": ("sd", "weight_bits=half", "weight_bits"),
    "kv_bits 3": ("sd", "kv_bits=3", "kv_bits"),
    "kv_bits 0": ("sd", "kv_bits=0", "kv_bits"),
    "kv_bits negative": ("sd", "kv_bits=-8", "kv_bits"),
    "kv_bits huge": ("sd", "kv_bits=1e9", "kv_bits"),
    "kv_bits boolean": ("sd", "kv_bits=true", "kv_bits"),
    "kv_bits nan": ("sd", "kv_bits=nan", "kv_bits"),
    "kv_bits fraction": ("sd", "kv_bits=16.5", "kv_bits"),
    "prefill_chunk 0": ("sd", "prefill_chunk=0", "prefill_chunk"),
    "prefill_chunk negative": ("sd", "prefill_chunk=-1", "prefill_chunk"),
    "prefill_chunk fraction": ("sd", "prefill_chunk=2.5", "prefill_chunk"),
    "prefill_chunk boolean": ("sd", "prefill_chunk=true", "prefill_chunk"),
    "prefill_chunk nan": ("sd", "prefill_chunk=nan", "prefill_chunk"),
    "prefill_chunk inf": ("sd", "prefill_chunk=inf", "prefill_chunk"),
    "prefill_chunk text": ("sd", "prefill_chunk=big", "prefill_chunk"),
    "expert_parallel on a dense model": ("sd", "expert_parallel=on", "mixture-of-experts"),
    "expert_parallel maybe": ("sd", "expert_parallel=maybe", "expert_parallel=off"),
    "memory_check maybe": ("sd", "memory_check=maybe", "memory_check=on"),
    "memory_check 2": ("sd", "memory_check=2", "memory_check=off"),
    "tree with a 0": ("tree", "tree=0,1", "branching factor"),
    "tree empty": ("tree", "tree=,", "tree"),
    "tree blank": ("tree", "tree=", "tree"),
    "tree 1e9": ("tree", "tree=1e9", "1024 nodes"),
    "tree negative": ("tree", "tree=2,-1", "branching factor"),
    "tree too deep": ("tree", "tree=" + ",".join(["1"] * 33), "tree"),
    "tree fraction": ("tree", "tree=2.5", "tree"),
    "tree boolean": ("tree", "tree=true", "tree"),
    "tree nan": ("tree", "tree=nan", "tree"),
    "width 0": ("tree", "width=0", "width"),
    "width 33": ("tree", "width=33", "width"),
    "width nan": ("tree", "width=nan", "width"),
    "nodes beyond the cap": ("tree", "nodes=5000", "nodes"),
    "rank_alphas summing over 1": ("tree", "rank_alphas=0.5,0.6", "rank_alphas"),
    "rank_alphas negative": ("tree", "rank_alphas=-0.1", "rank_alphas"),
    "rank_alphas nan": ("tree", "rank_alphas=nan", "rank_alphas"),
    "rank_alphas inf": ("tree", "rank_alphas=inf", "rank_alphas"),
    "rank_alphas text": ("tree", "rank_alphas=0.5,abc", "rank_alphas"),
    "rank_alphas empty": ("tree", "rank_alphas=,", "rank_alphas"),
    "rank_alphas boolean": ("tree", "rank_alphas=true", "rank_alphas"),
}
# a dynamic tree's depth/nodes and a static tree together, or without width
SHAPE_CASES = {
    "tree and width": (["tree=4,2", "width=4"], "set one of them"),
    "depth without width": (["depth=4"], "set width too"),
    "depth 0": (["width=4", "depth=0"], "depth"),
    "depth 33": (["width=4", "depth=33"], "depth"),
    "nodes 0": (["width=4", "nodes=0"], "nodes"),
    "nodes fraction": (["width=4", "nodes=2.5"], "nodes"),
}


def _simulate(policy: str, sets: list[str], tmp_path: Path):
    extra = ["--set", "draft_layers=15"]
    record = tmp_path / "record.json"
    for item in sets:
        extra += ["--set", item]
    return run_cli(*SIMULATE, policy, *extra, "--record", record), record


@pytest.mark.parametrize("case", list(SET_CASES))
def test_bad_feature_settings_are_one_sentence(case, tmp_path):
    policy, item, fragment = SET_CASES[case]
    result, record = _simulate(policy, [item], tmp_path)
    assert_refused(result, fragment)
    assert result.out == "" and not record.exists()


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_bad_tree_shapes_are_one_sentence(case, tmp_path):
    sets, fragment = SHAPE_CASES[case]
    result, record = _simulate("tree", sets, tmp_path)
    assert_refused(result, fragment)
    assert not record.exists()


def test_a_check_across_fields_names_no_empty_field(tmp_path):
    """prefill_chunk against prompt_tokens is a check of the whole configuration:
    the sentence says what is wrong, without a "field ''" in front."""
    result, _ = _simulate("sd", ["prefill_chunk=1", "prompt_tokens=10000000"], tmp_path)
    assert_refused(result, "raise prefill_chunk")
    assert "field ''" not in result.err


LAW_TREE_CASES = {
    "alphas empty": (["alphas=,"], "alphas"),
    "alphas blank": (["alphas="], "alphas"),
    "alphas nan": (["alphas=0.5,nan"], "alphas"),
    "alphas beyond 1": (["alphas=1.5"], "alphas"),
    "alphas text": (["alphas=0.9,abc"], "alphas"),
    "alpha and alphas": (["alpha=0.8", "alphas=0.5"], "not both"),
    "no acceptance": ([], "needs the acceptance"),
    "alpha boolean": (["alpha=true"], "alpha"),
    "tree boolean": (["alpha=0.8", "tree=true"], "parameter 'tree'"),
    "tree inf": (["alpha=0.8", "tree=1e400"], "parameter 'tree'"),
    "tree with a 0": (["alpha=0.8", "tree=0,1"], "branching factor"),
    "tree huge": (["alpha=0.8", "tree=99999999999999999999999"], "1024 nodes"),
    "depth 33": (["alpha=0.8", "width=4", "depth=33"], "depth"),
    "depth without width": (["alpha=0.8", "depth=3"], "set width too"),
    "rank_alphas empty": (["alpha=0.8", "rank_alphas=,"], "rank_alphas"),
    "c nan": (["alpha=0.8", "c=nan"], "'c'"),
    "v 0": (["alpha=0.8", "v=0"], "'v'"),
}


@pytest.mark.parametrize("case", list(LAW_TREE_CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_bad_tree_law_parameters_are_one_sentence(case, as_json):
    sets, fragment = LAW_TREE_CASES[case]
    argv = ["law", "tree", *[a for s in sets for a in ("--set", s)]]
    result = run_cli(*argv, *(["--json"] if as_json else []))
    assert_refused(result, fragment)
    assert result.out == "" and "tuple[" not in result.err


def test_one_alpha_per_depth_may_be_a_single_value():
    result = run_cli("law", "tree", "--set", "alphas=0.5", "--set", "tree=2", "--json")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["expected_accepted"] == pytest.approx(0.5 + 0.25)


# profiles import ----------------------------------------------------------------
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
         "tie_word_embeddings": True}
QWEN_MOE = {**LLAMA, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128,
            "num_experts_per_tok": 8, "moe_intermediate_size": 768}


def _without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


# config.json text -> fragment of the sentence
IMPORT_CASES = {
    "not JSON": ("hello {", "not JSON"),
    "empty file": ("", "is empty"),
    "a JSON list": (json.dumps([LLAMA]), "JSON object"),
    "null": ("null", "JSON object"),
    "nested too deeply": ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
    "not UTF-8": (b"\xff\xfe{\x00".decode("latin-1"), "UTF-16 byte-order mark"),
    "unknown architecture": (json.dumps({**LLAMA, "architectures": ["MambaForCausalLM"]}),
                             "MambaForCausalLM"),
    "architectures a string": (json.dumps({**LLAMA, "architectures": "LlamaForCausalLM"}),
                               "architectures"),
    "no architectures": (json.dumps(_without(LLAMA, "architectures")), "architectures"),
    "no hidden_size": (json.dumps(_without(LLAMA, "hidden_size")), "hidden_size"),
    "no vocab_size": (json.dumps(_without(LLAMA, "vocab_size")), "vocab_size"),
    "hidden_size null": (json.dumps({**LLAMA, "hidden_size": None}), "hidden_size"),
    "hidden_size text": (json.dumps({**LLAMA, "hidden_size": "big"}), "hidden_size"),
    "hidden_size boolean": (json.dumps({**LLAMA, "hidden_size": True}), "hidden_size"),
    "hidden_size NaN": (json.dumps(LLAMA).replace("2048", "NaN"), "hidden_size"),
    "hidden_size Infinity": (json.dumps(LLAMA).replace("2048", "Infinity"), "hidden_size"),
    "layers negative": (json.dumps({**LLAMA, "num_hidden_layers": -5}), "num_hidden_layers"),
    "layers 0": (json.dumps({**LLAMA, "num_hidden_layers": 0}), "num_hidden_layers"),
    "layers fraction": (json.dumps({**LLAMA, "num_hidden_layers": 2.5}), "num_hidden_layers"),
    "layers huge": (json.dumps({**LLAMA, "num_hidden_layers": 10**30}), "num_hidden_layers"),
    "heads not a multiple of kv heads": (json.dumps({**LLAMA, "num_key_value_heads": 7}),
                                         "num_key_value_heads"),
    "hidden not a multiple of heads": (json.dumps({**LLAMA, "hidden_size": 2047}),
                                       "head_dim"),
    "head_dim negative": (json.dumps({**LLAMA, "head_dim": -1}), "head_dim"),
    "dtype unknown": (json.dumps({**LLAMA, "torch_dtype": "int3"}), "torch_dtype"),
    "dtype a list": (json.dumps({**LLAMA, "torch_dtype": ["bfloat16"]}), "torch_dtype"),
    "dtype an object": (json.dumps({**LLAMA, "torch_dtype": {"a": 1}}), "torch_dtype"),
    "architecture a list": (json.dumps({**LLAMA, "architectures": [["LlamaForCausalLM"]]}),
                            "architectures"),
    "architecture an object": (json.dumps({**LLAMA, "architectures": [{}]}), "architectures"),
    "tie_word_embeddings text": (json.dumps({**LLAMA, "tie_word_embeddings": "yes"}),
                                 "tie_word_embeddings"),
    "experts per token beyond experts": (json.dumps({**QWEN_MOE, "num_experts_per_tok": 200}),
                                         "num_experts_per_tok"),
    "experts per token 0": (json.dumps({**QWEN_MOE, "num_experts_per_tok": 0}),
                            "num_experts_per_tok"),
    "experts negative": (json.dumps({**QWEN_MOE, "num_experts": -1}), "num_experts"),
    "no expert width": (json.dumps(_without(QWEN_MOE, "moe_intermediate_size")),
                        "moe_intermediate_size"),
    "dense and sparse layers mixed": (json.dumps({**QWEN_MOE, "decoder_sparse_step": 2}),
                                      "decoder_sparse_step"),
}


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_bad_configs_are_one_sentence_and_write_nothing(case, tmp_path):
    text, fragment = IMPORT_CASES[case]
    config = tmp_path / "config.json"
    config.write_text(text, encoding="latin-1" if case == "not UTF-8" else "utf-8")
    before = digest(config)
    out = tmp_path / "model.yaml"
    result = run_cli("profiles", "import", config, "-o", out)
    assert_refused(result, fragment)
    assert digest(config) == before and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_config_paths_that_are_not_a_config_file(tmp_path):
    assert_refused(run_cli("profiles", "import", tmp_path / "missing.json"), "does not exist")
    assert_refused(run_cli("profiles", "import", tmp_path), "not a regular file")
    assert_refused(run_cli("profiles", "import", "/dev/null"), "not a regular file")
    huge = tmp_path / "config.json"
    huge.write_text(json.dumps({**LLAMA, "pad": "x" * 2_000_000}))
    assert_refused(run_cli("profiles", "import", huge), "over its 1 MB limit")


def test_import_never_replaces_its_input_or_a_shipped_profile(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    before = digest(config)
    assert_refused(run_cli("profiles", "import", config, "-o", config), "config.json")
    assert digest(config) == before
    for kind, name in (("models", "qwen3-32b"), ("platforms", "cpu-local")):
        shipped = DATA / kind / f"{name}.yaml"
        kept = digest(shipped)
        result = run_cli("profiles", "import", config, "-o", shipped)
        assert_refused(result, f"shipped {kind[:-1]} profile '{name}'")
        assert digest(shipped) == kept
    # a path that reaches the shipped file another way is the same file
    detour = DATA / "models" / ".." / "models" / "qwen3-32b.yaml"
    assert_refused(run_cli("profiles", "import", config, "-o", detour), "shipped model")


def test_import_writes_the_validated_numbers(tmp_path):
    """A config that writes a size as a string or as 2048.0 gives the profile the
    integer pydantic validated, not the config's raw value."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**QWEN_MOE, "num_experts_per_tok": "8",
                                  "hidden_size": 2048.0}))
    out = tmp_path / "m.yaml"
    result = run_cli("profiles", "import", config, "-o", out, "--hf-id", "Org/M")
    assert result.rc == 0, result.err
    data = yaml.safe_load(out.read_text())
    assert data["n_active_experts"] == 8 and type(data["n_active_experts"]) is int
    assert data["hidden"] == 2048 and type(data["hidden"]) is int
    assert data["hf_ids"] == ["Org/M"]
    assert run_cli("profiles", "validate", out).rc == 0


# calibrate --fit-terms and compare ---------------------------------------------
@pytest.mark.parametrize("terms, fragment", [
    ("bogus", "'bogus'"),
    ("launch_overhead_s", "not an optional term"),
    ("memory_half_bytes,memory_half_bytes", "twice"),
    ("MEMORY_HALF_BYTES", "not an optional term"),
])
def test_bad_fit_terms_are_refused_before_any_run_is_read(terms, fragment, tmp_path):
    """The runs directory does not even exist: the term is judged first."""
    out = tmp_path / "cal.yaml"
    result = run_cli("calibrate", "--runs", tmp_path / "no-runs", "--profile", "cpu-local",
                     "-o", out, "--fit-terms", terms)
    assert_refused(result, fragment)
    assert not out.exists()


@pytest.mark.parametrize("option", ["--sweep", "--set"])
def test_expert_parallel_on_dense_models_is_an_error_not_a_skip(option, tmp_path):
    out = tmp_path / "report.html"
    result = run_cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "none", "--policies", "ar", "--tokens", "20", "--jobs", "1",
                     option, "expert_parallel=on", "-o", out)
    assert_refused(result, "mixture-of-experts")
    assert not out.exists()


# the numbers, by hand ------------------------------------------------------------
def test_moe_active_parameters_by_hand():
    """Qwen3-30B-A3B from its config: 30.5B parameters, 3.3B active per token."""
    from hwprofiles import load_model

    m = load_model("qwen3-30b-a3b")
    h, layers, heads, kv, hd, experts, k, width, vocab = (2048, 48, 32, 4, 128, 128, 8,
                                                          768, 151936)
    attention = 2 * h * heads * hd + 2 * h * kv * hd
    fixed = attention + h * experts + 2 * h  # attention, router, two norms
    expert = 3 * h * width  # gate, up and down projections
    ends = 2 * vocab * h + h  # untied embedding and LM head, final norm
    assert m.total_params == layers * (fixed + experts * expert) + ends
    active = layers * (fixed + k * expert) + ends
    assert m.n_layers * m.layer_active_params + m.head_params + m.embed_params == active
    assert round(m.total_params / 1e9, 1) == 30.5 and round(active / 1e9, 1) == 3.4


def test_prefill_flops_of_a_1024_token_prompt_by_hand():
    """Linear layers 2 FLOPs per weight per position; attention 4 per head width
    per (query, key) pair, a causal prompt of P positions scoring P(P+1)/2 pairs;
    chunks of 256 cost the same."""
    from hwprofiles import load_model

    m = load_model("llama-3.1-70b")
    p, hd = 1024, m.hidden // m.n_heads
    weights = 2 * m.hidden * m.n_heads * hd + 2 * m.hidden * m.n_kv_heads * hd \
        + 3 * m.hidden * m.ffn
    pairs = sum(i for i in range(1, p + 1))
    by_hand = 2 * weights * p + 4 * m.n_heads * hd * pairs
    assert m.layer_flops(p, 0) == pytest.approx(by_hand, rel=1e-12)
    chunked = sum(m.layer_flops(256, c) for c in range(0, p, 256))
    assert chunked == pytest.approx(by_hand, rel=1e-12)


def test_ttft_is_the_prefill_plus_the_first_step():
    from analyses.run.api import SimConfig, simulate

    out = simulate(SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", policy="ar",
                             tokens=1, deterministic=True, prompt_tokens=1024,
                             fixed_context=True), baseline=False).metrics
    assert out["prefill_s"] > 0
    assert out["ttft_s"] == pytest.approx(out["prefill_s"] + out["step_latency_s"],
                                          rel=1e-12)


def _walk_expectation(tree: tuple[int, ...], alpha: float) -> float:
    """E[accepted] by enumerating the target's choice at each depth: the rank of
    its token among the draft's candidates (i with a(1-a)^i) or none of the
    first ``max(tree)`` ranks; the walk stops at the first depth whose rank is
    not a child in the tree."""
    ranks = max(tree)
    choices = [(i, alpha * (1 - alpha) ** i) for i in range(ranks)]
    choices.append((None, 1 - sum(p for _, p in choices)))
    total = 0.0
    for outcome in itertools.product(choices, repeat=len(tree)):
        prob = math.prod(p for _, p in outcome)
        length = 0
        for (rank, _), width in zip(outcome, tree):
            if rank is None or rank >= width:
                break
            length += 1
        total += prob * length
    return total


@pytest.mark.parametrize("tree", [(1, 1, 1, 1), (2, 2), (3, 1, 2), (4, 2, 2, 1)])
def test_tree_law_equals_an_enumeration_of_walks(tree):
    result = run_cli("law", "tree", "--set", "alpha=0.7", "--set",
                     "tree=" + ",".join(map(str, tree)), "--json")
    assert result.rc == 0, result.err
    got = json.loads(result.out)["expected_accepted"]
    assert got == pytest.approx(_walk_expectation(tree, 0.7), rel=1e-12)
    if set(tree) == {1}:  # a chain is Leviathan's: sum of alpha^d
        assert got == pytest.approx(sum(0.7 ** d for d in range(1, len(tree) + 1)))


@pytest.mark.parametrize("item", ["weight_bits=4", "kv_bits=8", "compute_bits=8",
                                  "prefill_chunk=64", "expert_parallel=on"])
def test_a_measured_run_refuses_what_it_cannot_measure(item, tmp_path):
    """The executor runs the checkpoint at its own precision, in one prefill pass:
    a record claiming otherwise would be replayed and calibrated as measured.
    Refused before the models load, and no run directory is made."""
    out = tmp_path / "run"
    result = run_cli("run", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--policy", "sd", "--set", "draft_layers=15", "--set", item,
                     "--max-new-tokens", "4", "--out", out)
    assert_refused(result, item.split("=")[0], "hetspec simulate")
    assert not out.exists()


def test_a_dynamic_tree_never_accepts_past_its_deepest_scored_node():
    """width=4, depth=5 with a budget of 2 nodes keeps the chain's first two (0.8,
    0.64): a random walk then accepts at most 2 tokens, with the closed form's mean
    (before, draws went up to depth 5)."""
    from analyses.run.api import SimConfig, run_schedule
    from simcore import Outcomes

    seen = []

    class Recording(Outcomes):
        def verify(self, op):
            verdict = super().verify(op)
            seen.extend(verdict.accepted)
            return verdict

    params = {"width": 4, "depth": 5, "nodes": 2}
    form = run_cli("law", "tree", "--set", "alpha=0.8", "--set", "width=4", "--set",
                   "depth=5", "--set", "nodes=2", "--json")
    law = json.loads(form.out)
    assert law["scored_depth"] == 2 and law["expected_accepted"] == pytest.approx(0.8 + 0.64)
    run_schedule(SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b",
                           draft="llama-3.2-1b", policy="tree", params=params, tokens=3000,
                           seed=3), outcomes_factory=Recording)
    assert max(seen) == 2
    assert sum(seen) / len(seen) == pytest.approx(0.8 + 0.64, rel=0.05)


def test_the_memory_check_counts_a_trees_nodes_and_its_self_draft():
    """A tree's verify scores 1 + nodes positions per row (45 for the default
    4,2,2,1), and a self-drafting tree keeps an exit head as sd does: the target's
    needs equal sd's with gamma = 44 (before, a tree counted one position and no
    head); its draft's widest pass expands 16 nodes (4 x 2 x 2), whose logits
    sd's one-position draft pass does not hold."""
    from analyses.run.memory import Run, pieces, tier_needs
    from hwprofiles import load_model, load_platform
    from policies import parse_params

    plat = load_platform("h100-sxm-5x")
    models = {"target": load_model("llama-3.1-70b")}

    def verify_positions(params):  # the target's widest pass, from the schedule's dry run
        run = Run("tree", parse_params("tree", {"draft_layers": 8, **params}), 0, 100, 1)
        return next(p.positions for p in pieces(plat, models, plat.placement, run)
                    if p.role == "target")

    assert verify_positions({}) == 45
    assert verify_positions({"width": 4, "depth": 5, "nodes": 32}) == 33

    def needs(policy, params):
        run = Run(policy, parse_params(policy, params), 0, 100, 64)  # decoding alone
        return {k: (v.weights, v.kv, v.activations)
                for k, v in tier_needs(plat, models, plat.placement, run).items()}

    tree, sd = needs("tree", {"draft_layers": 8}), needs("sd", {"draft_layers": 8,
                                                                 "gamma": 44})
    draft_tier = plat.device(plat.members(plat.placement["draft"])[0]).memory
    assert {k: v for k, v in tree.items() if k != draft_tier} == {
        k: v for k, v in sd.items() if k != draft_tier}
    assert tree[draft_tier][0] == sd[draft_tier][0]  # the same weights and exit head
    assert tree[draft_tier][2] > 10 * sd[draft_tier][2]  # 16 rows of logits, not 1
    assert tree != needs("sd", {"draft_layers": 8, "gamma": 1})


def test_the_memory_check_counts_the_prefill_pass_and_chunking_relieves_it(tmp_path):
    """A 130,000-token prompt prefilled in one pass holds 130,000 rows of
    activations (no logits); chunks of 4,096 hold 4,096. Refused whole with the
    fix named, accepted chunked (within llama-3.1-70b's 131,072 positions)."""
    from analyses.run.memory import Run, tier_needs
    from hwprofiles import load_model, load_platform

    plat, spec = load_platform("h100-sxm-5x"), load_model("llama-3.1-70b")
    width = 3 * spec.hidden + spec.n_heads * spec.dim_per_head + 2 * spec.ffn

    def activations(chunk):
        run = Run("ar", None, 130_000, 10, 6, prefill_chunk=chunk)
        return tier_needs(plat, {"target": spec}, plat.placement, run)["hbm0"].activations

    assert activations(None) == pytest.approx(6 * 130_000 * width * 2 / 4, rel=1e-12)
    assert activations(4096) == pytest.approx(6 * 4096 * width * 2 / 4, rel=1e-12)
    argv = ("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
            "--policy", "ar", "--tokens", "10", "--deterministic", "--batch", "6",
            "--set", "prompt_tokens=130000", "--set", "kv_bits=4")
    assert_refused(run_cli(*argv), "activations", "prefill_chunk")
    assert run_cli(*argv, "--set", "prefill_chunk=4096").rc == 0


def test_show_of_a_name_of_neither_kind_says_so():
    """A Hugging Face id no profile has was reported as an unknown platform."""
    result = run_cli("profiles", "show", "Org/Missing-7B")
    assert_refused(result, "no shipped platform or model", "Hugging Face")
    assert run_cli("profiles", "show", "Qwen/Qwen3-30B-A3B").rc == 0


def test_expert_parallel_for_a_mixture_of_experts_draft_runs(tmp_path):
    """A dense target with an MoE draft: the AR baseline and the ar point run the
    target alone, which once refused the whole run as having no mixture of experts.
    The draft sits on the four-GPU group (on gpu4 alone its experts have no group
    to be sharded over, and expert_parallel is refused as having no effect)."""
    scenario = ("--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
                "qwen3-30b-a3b", "--tokens", "20", "--set", "expert_parallel=on",
                "--placement", "draft=target_tp")
    result = run_cli("simulate", *scenario, "--policy", "sd", "--deterministic")
    assert result.rc == 0, result.err
    out = tmp_path / "report.html"
    result = run_cli("compare", *scenario, "--policies", "ar,sd", "--set", "gamma=4",
                     "--jobs", "1", "-o", out)
    assert result.rc == 0 and "skipped" not in result.out, result.err + result.out


@pytest.mark.parametrize("spec, shapes", [
    ("tree=4,2,2,1", [(4, 2, 2, 1)]),  # one tree (it swept four one-level trees)
    ("tree=4,2,2,1;3,3;2", [(4, 2, 2, 1), (3, 3), (2,)]),
    ("rank_alphas=0.6,0.2;0.5", [(0.6, 0.2), (0.5,)]),
    ("gamma=2;4", [2, 4]),
])
def test_sweeping_list_valued_settings(spec, shapes):
    from analyses.compare.sweep import parse_sweep

    assert parse_sweep(spec) == (spec.split("=")[0], shapes)


@pytest.mark.parametrize("spec, fragment", [("tree=;", "item 1 of 2 is empty"),
                                            ("tree=4,2;nan", "finite"),
                                            ("tree=4,2;0", "branching factor")])
def test_bad_list_sweeps_are_one_sentence(spec, fragment, tmp_path):
    out = tmp_path / "report.html"
    result = run_cli("compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                     "--draft", "llama-3.2-1b", "--policies", "tree", "--sweep", spec,
                     "--tokens", "20", "--jobs", "1", "-o", out)
    assert_refused(result, fragment)
    assert not out.exists()
