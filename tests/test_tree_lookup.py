"""A token tree drafted by prompt lookup (``--policy tree --draft ngram``): the
sibling proposer, the schedule, the simulator's pricing and the executor's
losslessness (tiny random models)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from analyses.run.config import RunConfig
from hwprofiles import load_model, load_platform
from policies import PolicyContext, build, parse_params
from policies.ngram import propose, siblings
from policies.ops import Forward, Found, Lookup, Verdict, Verify, drive
from tests.test_ngram import REPEATS, _session


# the proposer ----------------------------------------------------------------------
def test_siblings_are_the_most_recent_matches_with_distinct_first_tokens():
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3, 4, 7, 1, 2, 3]
    # [1, 2, 3] occurs at 10 (then 4, 7, 1), 5 (then 5, 6, 1) and 0 (then 4: taken)
    assert siblings(seq, len(seq), gamma=3, width=3, nodes=20, n=3, n_min=3) == [
        [4, 7, 1], [5, 6, 1]]
    # a shorter match adds what the longer ones lacked: [3] is also followed by 4, 5
    # only, [2, 3] likewise; width 1 is prompt lookup's own proposal
    assert siblings(seq, len(seq), gamma=3, width=1, nodes=20, n=3, n_min=1) == [
        propose(seq, len(seq), gamma=3, n=3, n_min=1)]
    assert siblings(seq, len(seq), gamma=3, width=3, nodes=4, n=3, n_min=3) == [
        [4, 7, 1], [5]]  # the node budget cuts the later continuation
    assert siblings([5, 6, 7], 3, gamma=3, width=3, nodes=9, n=2, n_min=1) == []


def test_a_shorter_match_adds_siblings_the_longer_did_not_find():
    seq = [8, 2, 3, 9, 1, 3, 4, 2, 3]  # [2, 3] at 1 -> 9; [3] at 5 -> 4 (and at 2 -> 9)
    assert siblings(seq, len(seq), gamma=2, width=3, nodes=9, n=2, n_min=1) == [
        [9, 1], [4, 2]]
    assert siblings(seq, 4, gamma=2, width=3, nodes=9, n=2, n_min=1,
                    search="prompt") == [[9]]  # match and continuation inside the prompt


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=40), st.integers(1, 5),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 12))
def test_each_sibling_followed_an_earlier_occurrence_of_a_tail(seq, gamma, width, n, nodes):
    runs = siblings(seq, len(seq), gamma=gamma, width=width, nodes=nodes, n=n, n_min=1)
    assert len(runs) <= width and sum(map(len, runs)) <= nodes
    assert len({r[0] for r in runs}) == len(runs) and all(1 <= len(r) <= gamma
                                                          for r in runs)
    for run in runs:
        assert any(seq[i:i + k] == seq[len(seq) - k:] and seq[i + k:i + k + len(run)] == run
                   for k in range(1, n + 1) for i in range(len(seq) - k))
    if runs:
        assert runs[0] == propose(seq, len(seq), gamma=gamma, n=n, n_min=1)[:nodes]


# the schedule and its parameters ---------------------------------------------------
def test_the_tree_scores_every_node_and_verifies_the_longest_branch():
    params = parse_params("tree", {"proposer": "ngram", "width": 2, "depth": 4})
    found = iter([Found((0, 0), (0, 0)), Found((7, 4), (4, 4)), Found((5, 2), (3, 2))])
    seen = []

    def answer(op):
        seen.append(op)
        if isinstance(op, Lookup):
            return next(found)
        if isinstance(op, Verify):
            return Verdict((0.0,) * op.batch)
        return object()

    ctx = PolicyContext(target=load_model("smollm2-135m"), tokens=3, batch=2)
    stats = drive(build("tree", ctx, params), answer)
    lookups = [op for op in seen if isinstance(op, Lookup)]
    assert {(op.siblings, op.gamma, op.nodes, op.branch) for op in lookups} == {(2, 4, 16, 1)}
    assert [op.n_tokens for op in seen if isinstance(op, Forward)] == [1, 8, 6]
    assert [(op.gamma, op.row_gamma) for op in seen if isinstance(op, Verify)] == [
        (0, None), (4, None), (3, (3, 2))]
    assert stats == {"steps": 3, "tokens": 6}
    assert all(op.model == "target" for op in seen if isinstance(op, Forward))


def test_draft_ngram_reaches_the_tree_and_its_lookup_defaults():
    config = RunConfig(platform="cpu-local", target="smollm2-135m", policy="tree",
                       draft="ngram")
    p = config.params
    assert config.draft is None and p.proposes_by_lookup
    assert (p.width, p.depth, p.nodes, p.n, p.n_min) == (3, 10, 16, 4, 3)
    assert not parse_params("tree", {}).proposes_by_lookup
    assert parse_params("tree", {}).width is None  # a drafted tree's default is unchanged
    assert "tree has no effect with --draft ngram" in parse_params(
        "tree", {"proposer": "ngram", "tree": 4}).unused()
    assert "n has no effect with a draft model" in parse_params("tree", {"n": 2}).unused()


# the simulator ---------------------------------------------------------------------
def _simulate(**fields):
    from analyses.run.api import simulate

    base = dict(platform="cpu-local", target="smollm2-135m", policy="tree", draft="ngram",
                tokens=60, deterministic=True, fixed_context=True)
    return simulate(RunConfig(**{**base, **fields})).metrics


def _pass_s(positions: int) -> float:
    from simcore.costmodel import RooflineCost

    spec, cost = load_model("smollm2-135m"), RooflineCost(load_platform("cpu-local"))
    return cost.forward(spec, "cpu0", (0, spec.n_layers), positions, 1, 128, "lm",
                        None).total_s


def test_matched_steps_score_the_whole_tree_and_follow_the_closed_form():
    """match m, i.i.d. alpha a of the best branch: a matched step commits
    (1-a^(g+1))/(1-a) tokens in T(1 + min(w g, nodes)), an unmatched one 1 token
    in T(1); each step first looks up w continuations on the host."""
    w, g, nodes, m, a = 3, 4, 10, 0.5, 0.6
    out = _simulate(params={"match": m, "width": w, "depth": g, "nodes": nodes},
                    acceptance={"kind": "iid", "alpha": a}, tokens=400)
    n = out["steps"]
    matched = int(n * m)  # error diffusion: the event holds on floor(n m) of n asks
    assert out["tokens"] == pytest.approx(
        matched * (1 - a ** (g + 1)) / (1 - a) + (n - matched), rel=1e-9)
    lookup_s = w * load_platform("cpu-local").host_lookup_s
    assert out["simulated_time_s"] == pytest.approx(
        matched * _pass_s(1 + nodes) + (n - matched) * _pass_s(1) + n * lookup_s,
        rel=1e-9)


def test_no_match_costs_an_ar_step_and_the_lookups():
    out = _simulate(params={"match": 0.0, "width": 2})
    lookup_s = 2 * load_platform("cpu-local").host_lookup_s
    assert out["step_latency_s"] == pytest.approx(1 / out["ar_tokens_per_s"] + lookup_s,
                                                  rel=1e-9)
    assert out["mean_tokens_per_step"] == 1.0


def test_a_trace_replays_each_steps_tree_and_walk(tmp_path):
    trace = tmp_path / "acceptance.jsonl"
    steps = [(0, 0, 0), (10, 16, 10), (6, 9, 2), (4, 4, 4)]  # longest, nodes, accepted
    trace.write_text("".join(json.dumps({"accepted": [a], "proposed": [p], "nodes": [k],
                                         "gamma": p}) + "\n" for p, k, a in steps))
    out = _simulate(acceptance={"kind": "trace", "path": str(trace)}, deterministic=False,
                    tokens=sum(a + 1 for *_, a in steps))
    assert out["steps"] == len(steps) and out["tokens"] == 1 + 11 + 3 + 5
    walls = [(0, 1), (10, 17), (6, 10), (4, 5)]  # each step scored 1 + its nodes
    assert out["simulated_time_s"] == pytest.approx(
        sum(_pass_s(k) for _, k in walls)
        + len(steps) * 3 * load_platform("cpu-local").host_lookup_s, rel=1e-9)


# the executor (tiny random models) -------------------------------------------------
LOOKUP = {"proposer": "ngram", "n": 2, "n_min": 1, "width": 3, "depth": 5}


@pytest.mark.torch
def test_greedy_lookup_tree_equals_ar_token_for_token(tmp_path):
    prompts = [REPEATS, [2, 5, 2, 5, 2, 5, 8, 2, 5], [4, 1, 4, 2, 4, 3, 4, 1, 4]]
    with _session(tmp_path, max_new_tokens=24) as s:
        for p in prompts:
            ar = s.decode("ar", {}, [p]).generated
            tree = s.decode("tree", LOOKUP, [p])
            assert [g[:24] for g in tree.generated] == ar  # a last step may commit more
            assert [x.op["type"] for x in tree.spans].count("Lookup") == tree.steps
            assert all(x["nodes"][0] >= x["proposed"][0] >= x["accepted"][0]
                       for x in tree.acceptance)
        batch = s.decode("tree", LOOKUP, prompts)  # rows of different trees at once
        assert [g[:24] for g in batch.generated] == [s.decode("ar", {}, [p]).generated[0]
                                                     for p in prompts]
    rows = range(len(prompts))
    assert all(x["nodes"][r] >= x["proposed"][r] >= x["accepted"][r]
               for x in batch.acceptance for r in rows)
    # the siblings were really there: some step scored more nodes than its longest branch
    assert any(x["nodes"][r] > x["proposed"][r] for x in batch.acceptance for r in rows)
    # each row records its own tree (the fitted match model reads them per row)
    assert any(len(set(x["proposed"])) > 1 for x in batch.acceptance)


@pytest.mark.torch
def test_lookup_tree_at_temperature_one_samples_the_target_distribution(tmp_path):
    from executors.backend.layers import Stack
    from tests.test_executor import _chi2_p, _joint, _peaky

    # [1, 2] is followed by 3 and by 4: two siblings, 3 and 4, under the root
    rows, prompt = 3000, [1, 2, 3, 1, 2, 4, 1, 2]
    with _session(tmp_path, max_new_tokens=2, temperature=1.0) as s:
        _peaky(s, "target", 8.0)
        out = s.decode("tree", {**LOOKUP, "depth": 3}, [prompt] * rows)
        target = _joint(Stack(s.loaded["target"].model), prompt, 12)
    samples = [g[:2] for g in out.generated]
    first = out.acceptance[0]
    assert first["nodes"][0] == 6 and first["proposed"][0] == 3  # 3, 1, 2 and 4, 1, 2
    assert sum(sum(a["accepted"]) for a in out.acceptance) > rows // 50  # some accepted
    assert _chi2_p(samples, target) > 1e-3
    assert _chi2_p(samples, target.T) < 1e-6  # the test tells laws apart (t1, t2 swapped)
