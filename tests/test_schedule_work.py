"""Schedule work == executor work: every Forward a schedule yields declares the
positions the step must compute (a ``catch_up`` Forward: its own plus those the
runtime's position book, ``policies.cachebook``, counts its cache lacks), and the
real executor (tiny random models, in-process) feeds exactly those. A span
records the operation's fields, the book's count (``caught_up``) and the
executor's ``n_fed`` (the most positions any row fed in the Forward's pass).

A close draft (the target's first 5 of 6 layers, a model of its own on the
draft's device) makes full acceptance, reuse and cache hits common, so the
catch-up positions they cause are exercised; temperature 1 with a few seeds
varies the outcomes. Prompts decode one at a time: a batch whose rows finish
unevenly is run on by a second schedule (``Session.decode``), which cannot know
what the first left its caches lacking. SSD's fast backup is left out: the
executor's backup proposes by prompt lookup, as many tokens as match (none
where nothing does), where the schedule declares the K tokens it may send, so
the positions fed depend on the text (``tests/test_ngram.py`` checks that
backup's losslessness).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch

from executors.session import Options, Session
from tests.test_executor import PROMPTS, STAGES, tiny_spec

CASES = [("sd", {"gamma": 3}), ("sd", {"gamma": 2, "draft_layers": 4}),
         ("eesd", {"gamma": 3, "exit_layer": 4}), ("ppsd", {"exit_layer": 2}),
         ("mirror", {"gamma": 3, "kappa": 2, "exit_layer": 3, "eta": 1}),
         ("mirror", {"gamma": 3, "kappa": 4, "exit_layer": 5, "eta": 1}),
         ("mirror", {"gamma": 3, "kappa": 2, "exit_layer": 4, "eta": 1,
                     "batch_fallback": "skip"}),
         ("mirror", {"gamma": 3, "kappa": 1, "exit_layer": 5, "eta": 1}),
         ("ssd", {"k": 3, "fanout": 3, "hit_rate": 0.5}),
         ("ssd", {"k": 3, "fanout": 2, "shape": "geometric", "r": 0.5, "a_p": 0.9,
                  "budget": 4, "hit_rate": 0.5}),
         # one outcome row per sequence: the pre-speculation continues the backup's cache
         ("ssd", {"k": 3, "shape": "geometric", "r": 0.5, "budget": 1, "hit_rate": 0.5})]
STREAMED = [("kangaroo", {"dram_budget_gb": 0.0006, "l_dm": 1, "gamma": 3,
                          "adapter": "norm"}),
            ("cats", {"dram_budget_gb": 0.0006, "l_dm": 1, "l_sv": 2, "gamma": 3,
                      "adapter": "norm", "corrections": 2})]


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("spec"))


def _session(spec, draft, placement, temperature, seed):
    return Session("cpu-local", f"random:{spec}", draft, placement=placement, seed=seed,
                   options=Options(max_new_tokens=16, mode="inline",
                                   temperature=temperature))


def _forwards(session, policy, params):
    """Per prompt, the measured Forward spans' operations."""
    return [[s.op for s in session.decode(policy, params, [p]).spans
             if s.op["type"] == "Forward"] for p in PROMPTS]


def declared(op: dict) -> int:
    """Positions the simulator costs for a Forward: its own, plus, for a
    ``catch_up`` one, what the neutral position book counts its cache lacks."""
    return op["n_tokens"] + op.get("caught_up", 0)


def _mismatches(ops_per_prompt) -> Counter:
    return Counter((op["label"], declared(op), op["n_fed"])
                   for ops in ops_per_prompt for op in ops if declared(op) != op["n_fed"])


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 1), (1.0, 2)])
def test_every_forward_feeds_the_positions_it_declares(spec, temperature, seed):
    with _session(spec, "self:5", STAGES, temperature, seed) as s:
        work = {f"{p} {params}": _forwards(s, p, params) for p, params in CASES}
    assert all(sum(map(len, ops)) > 10 for ops in work.values())
    assert {name: dict(_mismatches(ops)) for name, ops in work.items()} == \
        {name: {} for name in work}


def test_catch_up_positions_occur(spec):
    """The check above is not vacuous: drafts do catch up (SD after a full
    accept, Mirror's window on its rows, SSD's pre-speculation on its outcomes)."""
    with _session(spec, "self:5", STAGES, 0.0, 0) as s:
        fed = Counter()
        for p, params in CASES[:2] + CASES[4:5] + CASES[8:9]:  # sd, mirror, ssd
            fed[p] = max([fed[p]] + [op["n_fed"] for ops in _forwards(s, p, params)
                                     for op in ops if op["emit"] == "sample"])
    assert fed["sd"] >= 2 and fed["mirror"] == 3 + 2 and fed["ssd"] >= 3 + 1


@pytest.mark.parametrize("policy,params", STREAMED, ids=["kangaroo", "cats"])
def test_streamed_schedules_feed_what_they_declare(spec, tmp_path, monkeypatch, policy,
                                                   params):
    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path))
    with _session(spec, None, None, 0.0, 0) as s:
        ops = _forwards(s, policy, params)
    assert sum(map(len, ops)) > 10 and _mismatches(ops) == Counter()


def test_multi_token_draft_steps_are_refused_with_the_fix(spec):
    """Mirror's eta > 1 asks one pass for eta tokens (multi-token heads): the
    executor's models have none, and running it as eta passes would do work the
    schedule does not declare."""
    with _session(spec, "self:5", STAGES, 0.0, 0) as s:
        with pytest.raises(ValueError, match="eta=1"):
            s.decode("mirror", {"gamma": 3, "kappa": 2, "exit_layer": 3, "eta": 2},
                     PROMPTS[:1])


@pytest.mark.parametrize("mode", ["inline", "processes"])
def test_ppsd_runs_one_last_stage_pass_per_verdict(spec, mode):
    """A flushed token never takes the last stage in the executor either (it
    waits there for the verdict on the token ahead): the executor's passes are
    the simulated schedule's, whichever token reaches the stage first."""
    with Session("cpu-local", f"random:{spec}", None, placement=STAGES, seed=0,
                 options=Options(max_new_tokens=24, mode=mode, temperature=0.0)) as s:
        runs = [s.decode("ppsd", {"exit_layer": 2}, [p]) for p in PROMPTS]
    passes = Counter(x.op["label"] for r in runs for x in r.spans
                     if x.op["type"] in ("Forward", "Verify"))
    assert passes["stage0"] - passes["verify"] > 30  # tokens flushed on the way
    assert passes["stage2"] == passes["verify"] == 3 * 24


SSD = [{"k": 3, "fanout": 3, "hit_rate": 0.5},
       {"k": 3, "fanout": 2, "shape": "geometric", "r": 0.5, "a_p": 0.9, "budget": 4,
        "hit_rate": 0.5}]


def test_ssd_feeds_what_it_declares_with_worker_processes(spec):
    """With the draft in its own process the outcome is observed while the
    pre-speculation still grows its tree: a hit must take the whole speculation
    (all K steps), not the part grown when the hit was seen."""
    with Session("cpu-local", f"random:{spec}", "self:5", placement=STAGES, seed=0,
                 options=Options(max_new_tokens=16, mode="processes",
                                 temperature=0.0)) as s:
        runs = [s.decode("ssd", params, [p]) for params in SSD for p in PROMPTS]
    hits = sum(all(d["held"]) for r in runs for d in r.acceptance
               if d.get("event") == "cache_hit")
    ops = [[x.op for x in r.spans if x.op["type"] == "Forward"] for r in runs]
    assert hits >= 3 and _mismatches(ops) == Counter()


def test_a_sure_miss_is_seen_before_the_tree_answers():
    """SSD: the verdict stops the pre-speculation after the step in flight, as
    the schedule says, only if the miss needs no reply from that step: a row
    whose committed tokens leave every base is a miss at once; a row that may
    still meet a guess the first pass samples waits for it."""
    from types import SimpleNamespace

    from executors.coordinate.book import Proposal, Sequences, Wide
    from executors.coordinate.trees import Wait
    from executors.coordinate.trees import observe_on_path

    # outcomes k=0 (guesses 7, 8) and k=1 (a guess the first pass samples) after [1, 2]
    tree = Wide(3, [[1, 2, 7], [1, 2, 8], [1, 2, 5]], Proposal.empty(3), "draft")
    coord = SimpleNamespace(latest_tree=tree, seqs=Sequences.start([[1, 2, 9]]),
                            candidates=None)
    assert observe_on_path(coord, None) == (False,) and coord.candidates == [None]
    coord.seqs = Sequences.start([[1, 2, 5, 4]])  # on the k=1 row: its guess decides
    assert isinstance(observe_on_path(coord, None), Wait)
    tree.ready = True
    tree.proposal.append(2, 4, None, [])
    tree.proposal.append(2, 6, None, [])
    assert observe_on_path(coord, None) == (True,) and coord.candidates[0][1:] == (2, 1)
