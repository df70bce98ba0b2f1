"""Token trees verified at temperature > 0 (``policies.tree``'s sampled law):
recursive rejection sampling over fixed candidates, simulated by Monte Carlo on
explicit distributions and on the model's targets against the closed forms; the
temperature-0 reduction; the executor's sampled walk against the target's
probabilities. The derivation: docs/schedules.md, "Token trees at temperature > 0"."""

from __future__ import annotations

import numpy as np
import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch
import torch

from analyses.laws.forms import law
from policies import PolicyError, parse_params
from policies.tree import TOP_MASS_T1, rank_probs, sibling_acceptance

MC_DRAWS = 200_000
MC_TOL = 0.005  # about 4 standard errors of a frequency over MC_DRAWS draws


def _rrs_walk(p: np.ndarray, candidates: list[int], u: np.ndarray):
    """Recursive rejection sampling over fixed candidates, one draw per row of
    ``u`` (uniforms, one column per candidate): candidate x is accepted with the
    residual's p(x); on rejection the residual loses x and is renormalised.
    Returns the accepted rank per draw (-1: all rejected) and the residual then."""
    residual, rank = p.astype(float).copy(), np.full(len(u), -1)
    for j, x in enumerate(candidates):
        take = (rank < 0) & (u[:, j] < residual[x])
        rank[take] = j
        residual[x] = 0.0
        residual /= residual.sum()
    return rank, residual


def test_rrs_over_fixed_candidates_takes_each_with_its_target_probability():
    """On an explicit distribution: candidate j is taken with p(x_j) overall and,
    after the ones before it were rejected, with p(x_j) / (1 - sum before); the
    token committed (a candidate, or a draw from the residual) follows p."""
    rng = np.random.default_rng(3)
    p = np.array([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
    candidates = [1, 3, 0]
    rank, residual = _rrs_walk(p, candidates, rng.random((MC_DRAWS, len(candidates))))
    rejected_before = 1.0
    for j, x in enumerate(candidates):
        assert np.mean(rank == j) == pytest.approx(p[x], abs=MC_TOL)
        reached = rank[(rank < 0) | (rank >= j)]
        assert np.mean(reached == j) == pytest.approx(p[x] / rejected_before, abs=MC_TOL)
        rejected_before -= p[x]
    rest = rng.choice(len(p), size=int(np.sum(rank < 0)), p=residual)
    committed = np.concatenate([np.array(candidates)[rank[rank >= 0]], rest])
    freq = np.bincount(committed, minlength=len(p)) / MC_DRAWS
    assert freq == pytest.approx(p, abs=MC_TOL)


def _mixture_targets(rng, greedy: float, mass: float, vocab: int, n: int) -> np.ndarray:
    """The model's targets over tokens in the draft's rank order: the target's most
    likely token at draft rank R ~ Geometric(greedy) with mass ``mass``, the rest
    spread evenly over ranks >= 20 (outside every tree tested here)."""
    rank = np.minimum(rng.geometric(greedy, size=n) - 1, vocab - 1)
    p = np.zeros((n, vocab))
    p[:, 20:] = (1 - mass) / (vocab - 20)
    p[np.arange(n), rank] += mass
    return p


@pytest.mark.parametrize("alpha,mass", [(0.6, 0.85), (0.45, 0.6), (0.8, 0.95)])
def test_the_sampled_rank_law_is_rrs_on_the_models_targets(alpha, mass):
    """Monte Carlo: recursive rejection sampling over the draft's top 4 on targets
    drawn from the model takes rank i with alpha (1 - alpha/m)^i (rank_probs) and,
    after i rejections, with sibling_acceptance; a 3,2 tree walked depth by depth
    accepts the closed form's mean."""
    rng = np.random.default_rng(11)
    targets = _mixture_targets(rng, alpha / mass, mass, 60, MC_DRAWS)
    u = rng.random((MC_DRAWS, 4))
    cum = np.cumsum(targets[:, :4], axis=1)  # rows differ: the walk, row-vectorised
    left = np.hstack([np.ones((MC_DRAWS, 1)), 1 - cum[:, :-1]])
    taken = np.argmax(u < targets[:, :4] / left, axis=1)
    taken[~(u < targets[:, :4] / left).any(axis=1)] = -1
    (want,) = rank_probs([alpha], 4, top_mass=mass)
    for i in range(4):
        assert np.mean(taken == i) == pytest.approx(want[i], abs=MC_TOL)
        reached = taken[(taken < 0) | (taken >= i)]
        assert np.mean(reached == i) == pytest.approx(
            sibling_acceptance(alpha, mass, i), abs=2 * MC_TOL)
    d1, d2 = taken, np.roll(taken, 1)  # depth 2: an independent draw for each walk
    accepted = ((0 <= d1) & (d1 < 3)).astype(int)
    walked = accepted * (1 + ((0 <= d2) & (d2 < 2)))
    form = law("tree", alpha=alpha, tree=(3, 2), temperature=1, target_top_mass=mass)
    assert np.mean(walked) == pytest.approx(form["expected_accepted"], abs=2 * MC_TOL)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.9, 1.0])
def test_temperature_zero_is_the_greedy_rule_exactly(alpha):
    """m = 1 leaves every float as the greedy rule computes it, so temperature 0
    (the default) prices every tree as before; sibling j is then accepted with
    alpha after any rejections, the greedy law's memorylessness."""
    assert rank_probs([alpha, 0.5], 5, top_mass=1.0) == \
        [[a * (1 - a) ** i for i in range(5)] for a in (alpha, 0.5)]
    for params in ({}, {"width": 4, "depth": 5, "nodes": 32}):
        assert law("tree", alpha=alpha, temperature=0, **params) == law("tree", alpha=alpha,
                                                                        **params)
    if alpha < 1:  # at alpha 1 no sibling is ever reached
        assert [sibling_acceptance(alpha, 1.0, j) for j in range(4)] == \
            pytest.approx([alpha] * 4, rel=1e-12, abs=1e-15)


def test_sampling_lowers_sibling_acceptance_and_the_tree():
    """At the same first-candidate acceptance a sampled tree accepts less than a
    greedy one (siblings share the target's mass m), and target_top_mass defaults at T=1."""
    greedy = law("tree", alpha=0.7)["expected_accepted"]
    sampled = law("tree", alpha=0.7, temperature=1)
    assert sampled["expected_accepted"] < greedy
    assert sampled == law("tree", alpha=0.7, temperature=1, target_top_mass=TOP_MASS_T1)
    assert sibling_acceptance(0.7, 0.85, 1) < 0.7
    # a chain has no siblings: its first candidate's acceptance alone decides
    chain = law("tree", alpha=0.7, tree=(1, 1, 1), temperature=1, target_top_mass=0.8)
    assert chain["expected_accepted"] == pytest.approx(0.7 + 0.7 ** 2 + 0.7 ** 3)


@pytest.mark.parametrize("bad,match", [
    ({"temperature": 0.5}, "give target_top_mass"),
    ({"target_top_mass": 0.8}, "set temperature"),
    ({"temperature": 1, "target_top_mass": 0}, "greater than 0")])
def test_sampled_tree_parameters_are_one_sentence(bad, match):
    with pytest.raises(PolicyError, match=match) as err:
        parse_params("tree", bad)
    assert "\n" not in str(err.value)


def test_the_executors_sampled_walk_takes_each_child_with_its_target_probability():
    """The executor's walk at temperature 1 (LocalDevice._walk_trees) on hand-made
    logits: the root's child j is taken with the target's softmax p(x_j), what the
    simulator's sampled law assumes of fixed candidates."""
    from executors.backend.device import LocalDevice, VerifyCmd

    logits = torch.zeros(4, 6)
    logits[0] = torch.tensor([0.0, 2.0, 0.5, 1.5, 1.0, 0.0])  # the root's row
    p = torch.softmax(logits[0], -1).numpy()
    dev, draws = LocalDevice("cpu", {}, seed=5), 20_000
    dev.keep(1, {"logits": [logits]})
    cmd = VerifyCmd(1, [[]], temperature=1.0, offsets=[0],
                    tree=[[(1, -1), (3, -1), (4, -1)]])  # children: tokens 1, 3, 4
    first = [dev._verify(cmd)["path"][0][:1] for _ in range(draws)]
    for j, token in enumerate((1, 3, 4)):
        assert np.mean([f == [j] for f in first]) == pytest.approx(p[token], abs=0.015)


def test_rank_alphas_replace_the_sampled_law():
    """Measured per-rank probabilities are taken as given: a temperature beside
    them changes nothing, so a run refuses it as unused."""
    given = {"rank_alphas": (0.5, 0.2), "tree": (2, 2)}
    assert law("tree", **given, temperature=1) == law("tree", **given)
    assert "drop one of them" in parse_params("tree", {**given, "temperature": 1}).unused()
    assert parse_params("tree", given).unused() is None
