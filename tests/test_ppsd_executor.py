"""PPSD in the executor: a draft that lands after a Verify rewrote the sequence it
followed is dropped, so pipelines of any depth stay consistent (issue 13)."""

from __future__ import annotations

import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch

from executors.coordinate.book import Sequences
from executors.coordinate.coordinator import Coordinator
from policies.ops import LM, SAMPLE, Forward, Head, Join, Spawn, Verify
from tests.test_executor import PROMPTS, session, tiny_spec

EXIT = Head("exit")

STAGES = {"stage0": "cpu0", "stage1": "cpu1", "stage2": "cpu0", "stage3": "cpu1"}


def _verify_one(logits):
    """A PPSD Verify: one proposed token, no bonus."""
    return (yield Verify(1, 1, target=logits, bonus=False, label="verify"))


@pytest.fixture(scope="module")
def tiny8(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("spec"), name="tiny8", layers=8)


def test_a_draft_landing_after_a_rejecting_verify_is_dropped(tiny8):
    """The inline loop collects cpu0's replies before cpu1's, so the Verify on
    cpu0 rejects the first draft before the second draft (on cpu1, drafted after
    the rejected token) answers: that token follows a sequence no longer there."""
    prompt = PROMPTS[0]
    with session(tiny8, placement=STAGES) as s:
        s.decode("ppsd", {"exit_layer": 2}, [prompt])  # loads the stages' devices
        assert list(s.clients)[:2] == ["cpu:0", "cpu:1"]
        seqs = Sequences.start([prompt])
        coord = Coordinator(s.clients, s.placement, seqs, s.n_layers)
        ctx = len(prompt)

        def schedule():
            yield Forward("target", "stage1", (0, 1), 1, 1, ctx, head=EXIT, emit=SAMPLE)
            logits = yield Forward("target", "stage0", (0, 8), 1, 1, ctx, head=LM)
            verdict = yield Spawn(_verify_one(logits))
            late = yield Forward("target", "stage1", (0, 1), 1, 1, ctx + 1, head=EXIT,
                                 emit=SAMPLE, label="late draft")
            return (yield Join((verdict,)))[0], late

        verdict, _ = coord.run(schedule())
    assert verdict.accepted == (0,)  # the one-layer draft missed: the case under test
    assert len(seqs.committed[0]) == len(prompt) + 1  # the target's correction
    assert seqs.proposal(0).tokens == [[]]  # not the late draft's stale token


def test_a_draft_landing_after_a_verify_committed_past_its_sequence_is_dropped(tiny8):
    """A Verify that lands before the draft it should check (no proposal yet)
    commits the target's token; the draft, computed for that same position, would
    otherwise sit one position too far (two-stage PPSD failed so on SmolLM2)."""
    prompt = PROMPTS[1]
    with session(tiny8, placement=STAGES) as s:
        s.decode("ppsd", {"exit_layer": 2}, [prompt])
        seqs = Sequences.start([prompt])
        coord = Coordinator(s.clients, s.placement, seqs, s.n_layers)
        ctx = len(prompt)

        def schedule():
            logits = yield Forward("target", "stage0", (0, 8), 1, 1, ctx, head=LM)
            verdict = yield Spawn(_verify_one(logits))
            yield Forward("target", "stage1", (0, 1), 1, 1, ctx, head=EXIT, emit=SAMPLE)
            return (yield Join((verdict,)))[0]

        coord.run(schedule())
    assert len(seqs.committed[0]) == len(prompt) + 1  # the Verify came first
    assert seqs.proposal(0).tokens == [[]]


def test_four_stages_on_two_worker_processes_equal_ar(tiny8):
    """Issue 13: PPSD's default on SmolLM2 (exit 8 of 30: four stages on two
    cores) failed in worker processes; here four stages of two layers."""
    with session(tiny8, mode="processes", placement=STAGES, max_new=24) as s:
        ref = [s.decode("ar", {}, [p]).generated[0] for p in PROMPTS]
        got = [s.decode("ppsd", {"exit_layer": 2}, [p]).generated[0] for p in PROMPTS]
    assert got == ref
