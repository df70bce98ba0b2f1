"""Token-tree speculation (``policies.tree``): the closed form, deterministic
simulation against it, and the executor's tree drafting, tree-masked scoring and
walk (lossless greedy and at temperature 1, declared work, cache compaction)."""

from __future__ import annotations

import math

import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch
import torch

from analyses.laws.forms import law
from analyses.run.api import SimConfig, simulate
from policies.sd import leviathan
from executors.backend import models
from executors.backend.layers import Positions, Stack
from hwprofiles import load_model, load_platform
from policies import PolicyError, parse_params
from simcore.acceptance import IID, Histogram, Positional
from policies.tree import depth_alphas, draft_passes, rank_probs, tree_nodes
from simcore import RooflineCost
from tests.test_schedule_work import declared
from tests.test_executor import (PROMPTS, STAGES, _chi2_p, _joint, _peaky, session,
                                 tiny_spec)

CONTEXT = 128


# the closed form -------------------------------------------------------------------
def _by_outcomes(branching, p, d=0) -> float:
    """E[accepted] by recursion on the target's pick at each depth: the rank-i
    candidate with probability p[d][i] (then one more token and the same question
    one depth down), or none of them (the walk ends)."""
    if d == len(branching):
        return 0.0
    return sum(p[d][i] * (1 + _by_outcomes(branching, p, d + 1))
               for i in range(branching[d]))


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.8, 0.95])
def test_a_chain_tree_is_leviathan(alpha):
    for depth in (1, 3, 6):
        out = law("tree", alpha=alpha, tree=(1,) * depth)
        lev = leviathan(alpha, depth)["expected_tokens_per_step"]
        assert out["expected_tokens_per_step"] == pytest.approx(lev, rel=1e-12)


@pytest.mark.parametrize("branching", [(4, 2, 2, 1), (2, 3), (3, 1, 2)])
def test_static_tree_expectation_equals_enumeration(branching):
    alphas = [0.7, 0.6, 0.8, 0.5][:len(branching)]
    p = rank_probs(alphas, max(branching))
    out = law("tree", alphas=tuple(alphas), tree=branching)
    assert out["expected_accepted"] == pytest.approx(_by_outcomes(branching, p), rel=1e-12)
    assert out["nodes"] == sum(math.prod(branching[:d + 1]) for d in range(len(branching)))


def test_default_tree_shape_and_rank_model():
    """4,2,2,1 at alpha 0.8: P(depth-d node accepted) factorises per depth into
    1-(1-a)^b, so E = sum of running products."""
    per = [1 - 0.2 ** b for b in (4, 2, 2, 1)]
    want = sum(math.prod(per[:d + 1]) for d in range(4))
    out = law("tree", alpha=0.8)
    assert out["expected_accepted"] == pytest.approx(want, rel=1e-12)
    assert (out["nodes"], out["depth"], out["draft_passes"], out["draft_positions"]) == \
        (44, 4, 4, 1 + 4 + 8 + 16)
    ranks = law("tree", rank_alphas=(0.6, 0.2), tree=(2, 2))
    assert ranks["expected_accepted"] == pytest.approx(0.8 + 0.8 * 0.8, rel=1e-12)


def test_dynamic_tree_keeps_the_most_likely_nodes():
    params = parse_params("tree", {"width": 3, "depth": 4, "nodes": 10})
    nodes = tree_nodes(params, rank_probs([0.7] * 4, 3))
    assert len(nodes) == 10
    assert all(par < i for i, (_, _, par, _) in enumerate(nodes))  # parents first
    kept = sorted(v for v, *_ in nodes)
    # the best 10 of every candidate the expansion makes (3 + 3*9 of them)
    wide = tree_nodes(parse_params("tree", {"width": 3, "depth": 4, "nodes": 30}),
                      rank_probs([0.7] * 4, 3))
    assert kept == pytest.approx(sorted(v for v, *_ in wide)[-10:])
    # width 1 is a chain: Leviathan again
    chain = law("tree", alpha=0.7, width=1, depth=5, nodes=5)
    assert chain["expected_tokens_per_step"] == pytest.approx(
        leviathan(0.7, 5)["expected_tokens_per_step"], rel=1e-12)


def test_depth_alphas_follow_the_acceptance_model():
    assert depth_alphas(IID(alpha=0.7), 3) == pytest.approx([0.7] * 3)
    assert depth_alphas(Positional(alphas=(0.9, 0.6)), 3) == pytest.approx([0.9, 0.6, 0.6])
    hist = Histogram(probs=(0.2, 0.3, 0.5))  # P(A>=1)=0.8, P(A>=2)=0.5
    assert depth_alphas(hist, 3) == pytest.approx([0.8, 0.5 / 0.8, 0.0])


@pytest.mark.parametrize("bad,match", [
    ({"tree": (0, 2)}, "branching factor"), ({"tree": (4,), "width": 2}, "set one"),
    ({"depth": 3}, "set width"), ({"rank_alphas": (0.7, 0.5)}, "sum to at most 1"),
    ({"tree": (32, 32, 32)}, "more than 1024 nodes")])
def test_bad_tree_parameters_are_one_sentence(bad, match):
    with pytest.raises(PolicyError, match=match) as err:
        parse_params("tree", bad)
    assert "\n" not in str(err.value)


def test_a_dynamic_tree_scores_at_most_the_nodes_it_grows():
    out = law("tree", alpha=0.8, width=1, depth=5)  # nodes=32 by default
    assert out["nodes"] == 5 and out["expected_tokens_per_step"] == pytest.approx(
        leviathan(0.8, 5)["expected_tokens_per_step"], rel=1e-12)
    assert _sim({"width": 2, "depth": 3}, {"kind": "iid", "alpha": 0.8})["tree_nodes"] == 10

def test_more_children_than_the_vocabulary_is_refused_before_any_step(tiny):
    from policies import PolicyContext, build

    spec = models.spec_of(f"random:{tiny}")  # 48 tokens
    with pytest.raises(PolicyError, match="48 tokens of the vocabulary; lower tree"):
        build("tree", PolicyContext(target=spec, draft=spec), {"tree": (50,)})


# deterministic simulation == closed form ------------------------------------------
def _sim(params, acceptance, draft="llama-3.2-1b", deterministic=True, tokens=400):
    cfg = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft=draft,
                    policy="tree", params=params, acceptance=acceptance, tokens=tokens,
                    deterministic=deterministic, fixed_context=True, prompt_tokens=CONTEXT)
    return simulate(cfg).metrics


def _step_s(params, draft="llama-3.2-1b"):
    """The step the law composes, from the cost model: one draft pass per depth over
    that depth's nodes (each attending to the nodes fed before it), the tree's trip,
    one target pass over root + nodes, the verdict's trip; and one AR step."""
    platform = load_platform("h100-sxm-5x")
    cost = RooflineCost(platform)
    target, spec = load_model("llama-3.1-70b"), load_model(draft)
    p = parse_params("tree", params)
    n_nodes, fed, t_draft = len(tree_nodes(p, None)), 0, 0.0
    for count, _k in draft_passes(p):
        t_draft += cost.forward(spec, "gpu4", (0, spec.n_layers), count, 1, CONTEXT + fed,
                                "lm", 2).total_s
        fed += count
    (link,) = platform.route("gpu4", "gpu0")
    trips = cost.hop_s(link, 8 * n_nodes) + cost.hop_s(link, 8)
    t_verify = cost.forward(target, "target_tp", (0, 80), 1 + n_nodes, 1, CONTEXT, "lm",
                            None).total_s
    t_ar = cost.forward(target, "target_tp", (0, 80), 1, 1, CONTEXT, "lm", None).total_s
    return t_draft + trips, t_verify, t_ar, len(draft_passes(p))


@pytest.mark.parametrize("params", [{}, {"tree": (2, 2, 2)}, {"tree": (1, 1, 1, 1, 1)},
                                    {"width": 4, "depth": 5, "nodes": 32},
                                    {"width": 2, "depth": 6, "nodes": 10,
                                     "rank_alphas": (0.5, 0.2)},
                                    {"temperature": 1},
                                    {"width": 4, "depth": 5, "nodes": 32, "temperature": 1,
                                     "target_top_mass": 0.8}])
@pytest.mark.parametrize("alpha", [0.6, 0.8, 0.9])
def test_deterministic_tree_equals_its_closed_form(params, alpha):
    m = _sim(params, {"kind": "iid", "alpha": alpha})
    t_draft, t_verify, t_ar, passes = _step_s(params)
    form = law("tree", alpha=alpha, **params, c=t_draft / passes / t_ar, v=t_verify / t_ar)
    assert m["mean_tokens_per_step"] == pytest.approx(form["expected_tokens_per_step"],
                                                      rel=5e-3)
    assert m["step_latency_s"] == pytest.approx(t_draft + t_verify, rel=1e-9)  # exact sum
    assert m["speedup_vs_ar"] == pytest.approx(form["speedup"], rel=5e-3)
    assert m["tree_nodes"] == form["nodes"]


def test_positional_acceptance_shapes_the_tree_per_depth():
    m = _sim({"tree": (3, 2, 1)}, {"kind": "positional", "alphas": (0.9, 0.5, 0.3)})
    form = law("tree", alphas=(0.9, 0.5, 0.3), tree=(3, 2, 1))
    assert m["mean_tokens_per_step"] == pytest.approx(form["expected_tokens_per_step"],
                                                      rel=5e-3)


def test_a_wider_tree_commits_more_but_a_chain_matches_sd():
    acc = {"kind": "iid", "alpha": 0.7}
    chain = _sim({"tree": (1, 1, 1, 1)}, acc)
    sd = simulate(SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b",
                            draft="llama-3.2-1b", policy="sd", params={"gamma": 4},
                            acceptance=acc, tokens=400, deterministic=True,
                            fixed_context=True, prompt_tokens=CONTEXT)).metrics
    assert chain["mean_tokens_per_step"] == pytest.approx(sd["mean_tokens_per_step"])
    assert _sim({}, acc)["mean_tokens_per_step"] > chain["mean_tokens_per_step"] + 0.5


def test_random_mode_converges_to_the_expected_length():
    acc = {"kind": "iid", "alpha": 0.8}
    m = _sim({}, acc, deterministic=False, tokens=20000)
    assert m["mean_tokens_per_step"] == pytest.approx(law("tree", alpha=0.8)
                                                      ["expected_tokens_per_step"], rel=0.03)


def test_a_trace_of_tree_walks_is_replayed_as_recorded(tmp_path):
    path = tmp_path / "acceptance.jsonl"
    path.write_text('{"accepted": [3]}\n{"accepted": [0]}\n{"accepted": [2]}\n')
    m = _sim({"tree": (2, 2, 2)}, {"kind": "trace", "path": str(path)})
    assert m["mean_tokens_per_step"] == pytest.approx(5 / 3 + 1, rel=1e-9)


def test_self_draft_tree_on_one_device():
    m = _sim({"tree": (2, 2), "draft_layers": 8}, {"kind": "iid", "alpha": 0.8}, draft=None)
    assert m["mean_tokens_per_step"] == pytest.approx(
        law("tree", alpha=0.8, tree=(2, 2))["expected_tokens_per_step"], rel=1e-9)


# the executor ------------------------------------------------------------------------
TREES = [{"tree": (2, 2, 1)}, {"tree": (3, 2), "draft_layers": 4},
         {"width": 2, "depth": 3, "nodes": 5}, {"tree": (1, 1, 1)}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="module")
def close_draft(tiny):
    with session(tiny, "self:5", placement=STAGES) as s:
        s.reference = [s.decode("ar", {}, [p]).generated[0][:12] for p in PROMPTS]
        yield s


@pytest.mark.parametrize("params", TREES, ids=[str(p) for p in TREES])
def test_greedy_tree_equals_ar_token_for_token(close_draft, params):
    s = close_draft
    one = [s.decode("tree", params, [p]) for p in PROMPTS]
    assert [r.generated[0][:12] for r in one] == s.reference
    both = s.decode("tree", params, PROMPTS)  # ragged rows decoded together
    assert [g[:12] for g in both.generated] == s.reference
    verifies = [a for r in one for a in r.acceptance if "accepted" in a]
    assert sum(sum(a["accepted"]) for a in verifies) > 0  # the tree's tokens are taken
    forwards = [x.op for r in one for x in r.spans if x.op["type"] == "Forward"]
    assert forwards and all(declared(op) == op["n_fed"] for op in forwards)


def test_trees_in_worker_processes_equal_ar(close_draft, tiny):
    """Draft and target in their own processes: the commands travel pickled."""
    with session(tiny, "self:5", mode="processes", placement=STAGES) as s:
        runs = [s.decode("tree", p, PROMPTS) for p in TREES[:3]]
    assert all([g[:12] for g in r.generated] == close_draft.reference for r in runs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_far_draft_takes_side_branches_and_stays_lossless(tiny, seed):
    """A 1-layer draft's first guess is often wrong and a lower-ranked sibling
    right. A wide tree holds the chain of rank-0 guesses, so were no side branch
    ever taken it would need exactly the chain's steps; it needs fewer, and the
    output is still AR's."""
    with session(tiny, "self:1", placement=STAGES, seed=seed) as s:
        ref = [g[:12] for g in s.decode("ar", {}, PROMPTS).generated]
        out = s.decode("tree", {"tree": (4, 3, 2)}, PROMPTS)
        steps = {shape: sum(s.decode("tree", {"tree": shape}, [p]).steps for p in PROMPTS)
                 for shape in [(4, 3, 2), (1, 1, 1)]}
    assert [g[:12] for g in out.generated] == ref
    assert steps[(4, 3, 2)] < steps[(1, 1, 1)]


@pytest.mark.parametrize("temperature,seed", [(1.0, 1), (1.0, 2)])
def test_sampled_trees_feed_the_positions_they_declare(tiny, temperature, seed):
    with session(tiny, "self:5", placement=STAGES, temperature=temperature,
                 seed=seed) as s:
        runs = [s.decode("tree", p, [q]) for p in TREES for q in PROMPTS]
    ops = [x.op for r in runs for x in r.spans if x.op["type"] == "Forward"]
    assert len(ops) > 30 and [(o["label"], declared(o), o["n_fed"]) for o in ops
                              if declared(o) != o["n_fed"]] == []
    assert max(o["n_fed"] for o in ops if o["label"] == "tree draft") >= 2  # catch-up


def test_tree_nodes_see_only_their_ancestors_like_the_hf_forward(tiny):
    """Root + a 2x2 tree scored in one pass: each node's logits are those of a plain
    forward over the prefix and its own root path."""
    hf = models.build_random(models.spec_of(f"random:{tiny}"), seed=5)
    stack, seq = Stack(hf), PROMPTS[0]
    nodes = [(10, -1), (11, -1), (12, 0), (13, 0), (14, 1), (15, 1)]  # (token, parent)
    cache = stack.new_cache(1)
    n = len(seq)
    stack.run(cache, (0, 6), Positions([0], [n - 1]), tokens=torch.tensor([seq[:-1]]))
    depth = [1, 1, 2, 2, 2, 2]
    branches = [(1 + j, n - 1 + depth[j], n, *([n + par] if par >= 0 else []))
                for j, (_, par) in enumerate(nodes)]
    at = Positions([n - 1], [1 + len(nodes)], branches=[branches])
    feed = torch.tensor([[seq[-1]] + [t for t, _ in nodes]])
    out = stack.head(stack.run(cache, (0, 6), at, tokens=feed))[0]
    for j, (tok, par) in enumerate(nodes):
        path = ([nodes[par][0]] if par >= 0 else []) + [tok]
        with torch.no_grad():
            ref = hf(torch.tensor([seq + path])).logits[0, -1]
        assert torch.allclose(out[1 + j], ref, atol=1e-5)


def test_the_walk_follows_the_targets_token_and_compaction_keeps_the_path(tiny):
    """Greedy walk on hand-made logits, then a real run: after compaction the
    target's cache holds the committed path as a plain forward would."""
    from executors.backend.device import LocalDevice, VerifyCmd

    # logits rows: root, then nodes 0..3 = 3 and 5 (the root's), 7 and 6 (node 1's)
    logits = torch.zeros(5, 10)
    for row, tok in enumerate([5, 1, 7, 9, 8]):  # root -> 5 -> 7 -> 9, a leaf's bonus
        logits[row, tok] = 1.0
    dev = LocalDevice("cpu", {})
    dev.keep(1, {"logits": [logits]})
    cmd = VerifyCmd(1, [[]], offsets=[0], tree=[[(3, -1), (5, -1), (7, 1), (6, 1)]])
    out = dev._verify(cmd)
    assert (out["accepted"], out["bonus"], out["path"]) == ([2], [9], [[1, 2]])
    with session(tiny, "self:5", placement={"draft": "cpu1"}) as s:
        run = s.decode("tree", {"tree": (2, 2)}, PROMPTS[:1])
        cache = s.clients["cpu:0"].device.caches[("target", 1)]
        stack = Stack(s.loaded["target"].model)
        seq = PROMPTS[0] + run.generated[0]
        plain = stack.new_cache(1)
        stack.run(plain, (0, 6), Positions([0], [len(seq) - 1]),
                  tokens=torch.tensor([seq[:-1]]))
    assert sum(sum(a["accepted"]) for a in run.acceptance if "accepted" in a) > 0
    for layer in range(6):
        held = len(seq) - 1
        assert torch.allclose(cache.k[layer][0, :, :held], plain.k[layer][0, :, :held],
                              atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_target_scores_trees_losslessly(tiny):
    from executors.session import Options, Session

    opts = Options(max_new_tokens=12, mode="processes", physical={"target": "cuda:0"})
    with Session("cpu-local", f"random:{tiny}", "self:5", options=opts) as s:
        ref = s.decode("ar", {}, PROMPTS[:2]).generated
        runs = [s.decode("tree", p, PROMPTS[:2]) for p in TREES[:3]]
    assert all([g[:12] for g in r.generated] == [g[:12] for g in ref] for r in runs)
    assert {x.physical for x in runs[0].spans} >= {"cuda:0", "cpu:1"}


def test_a_measured_run_refuses_a_tree_priced_at_another_temperature(close_draft):
    with pytest.raises(ValueError, match="pass --temperature 1 or drop"):
        close_draft.decode("tree", {"tree": (2, 2), "temperature": 1}, PROMPTS[:1])


def test_tree_at_temperature_one_samples_the_target_distribution(tmp_path):
    """Following the target's sampled token down a fixed candidate tree keeps the
    target's law: the first two tokens over many rows fit the target's joint law
    and reject the draft's."""
    spec, rows, prompt = tiny_spec(tmp_path, vocab=12, layers=3, hidden=32), 3000, [1, 2, 3, 4]
    with session(spec, "self:1", temperature=1.0, max_new=2, seed=7) as s:
        _peaky(s, "target", 8.0)
        out = s.decode("tree", {"tree": (3, 2), "temperature": 1}, [prompt] * rows)
        target = _joint(Stack(s.loaded["target"].model), prompt, 12)
        draft = _joint(Stack(s.loaded["target"].model, 1), prompt, 12)
    samples = [g[:2] for g in out.generated]
    accepted = sum(sum(a["accepted"]) for a in out.acceptance if "accepted" in a)
    assert accepted > rows // 4  # the tree's tokens make up much of the output
    assert _chi2_p(samples, target) > 1e-3
    assert _chi2_p(samples, draft) < 1e-6


# the command line ----------------------------------------------------------------------
def test_cli_simulate_law_and_compare(tmp_path, capsys):
    from analyses.cli import main

    assert main(["law", "tree", "--set", "alpha=0.8", "--set", "tree=4,2,2,1",
                 "--json"]) == 0
    assert '"nodes": 44' in capsys.readouterr().out
    assert main(["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                 "--draft", "llama-3.2-1b", "--policy", "tree", "--set", "width=4",
                 "--set", "alpha=0.8", "--tokens", "200", "--json"]) == 0
    assert '"tree_nodes": 32' in capsys.readouterr().out
    assert main(["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                 "--draft", "llama-3.2-1b", "--policy", "tree", "--set", "tree=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetspec: error:") and "tree=4,2,2,1" in err
    report = tmp_path / "r.html"
    assert main(["compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                 "--draft", "llama-3.2-1b", "--policies", "ar,sd,tree", "--tokens", "200",
                 "--jobs", "1", "-o", str(report), "--json"]) == 0
    assert report.exists() and '"points"' in capsys.readouterr().out


# the real model ------------------------------------------------------------------------
TREE_TOKENS = 12  # per prompt: several verify cycles of each tree, in suite time


@pytest.fixture(scope="module")
def smollm2():
    """One SmolLM2 session (a 24-layer self-draft) for the tree cases below, and AR's
    outputs on the built-in prompts: the model loads and AR decodes once."""
    from smollm2 import smollm2_with_ar

    with smollm2_with_ar("self:24", TREE_TOKENS) as shared:
        yield shared


@pytest.mark.slow
@pytest.mark.parametrize("params", [{"tree": (4, 2, 2, 1)},
                                    {"width": 3, "depth": 4, "nodes": 12},
                                    {"tree": (3, 2, 1), "draft_layers": 15}],
                         ids=["static", "dynamic", "self-draft"])
def test_smollm2_tree_equals_ar_token_for_token(params, smollm2):
    s, prompts, ref = smollm2
    runs = [s.decode("tree", params, [p]) for p in prompts]
    assert [r.generated[0][:TREE_TOKENS] for r in runs] == ref
    accepted = [a["accepted"][0] for r in runs for a in r.acceptance if "accepted" in a]
    assert sum(accepted) > 0  # the real draft's trees are taken (the untrained
    # 15-layer exit rarely: 9 tokens over 57 steps; the 24-layer draft often)


def test_tree_operations_name_their_layout():
    """The draft passes carry ``tree=Children()`` and each node's ``top_k``; the
    scoring pass and the Verify share the tree's branch (what the executor reads)."""
    from policies import PolicyContext, build
    from policies.ops import Children, Forward, TopK, Verdict, Verify, drive
    from policies.tree import TREE

    spec = load_model("llama-3.1-70b")
    ops = []

    def answer(op):
        ops.append(op)
        return Verdict((1,)) if isinstance(op, Verify) else op

    drive(build("tree", PolicyContext(target=spec, draft=load_model("llama-3.2-1b"),
                                      tokens=2), {"tree": (4, 2)}), answer)
    drafts = [o for o in ops if isinstance(o, Forward) and o.label == "tree draft"]
    assert [(o.tree, o.emit, o.branch) for o in drafts[:2]] == [
        (Children(), TopK(4), TREE), (Children(), TopK(2), TREE)]
    verify = next(o for o in ops if isinstance(o, Verify))
    assert (verify.branch, verify.target.branch, verify.target.tree) == (TREE, TREE, None)
