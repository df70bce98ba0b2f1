"""The runtimes' position book (policies/cachebook.py): what a catch_up Forward
feeds besides its own positions, counted from the Forwards run, the Verdicts
returned and the Outcomes answered. The executor's real feeds are checked
against it in test_schedule_work and test_tree; here its counting rules, and,
over random verdicts and hits, the closed forms the schedules used to count
with themselves (sd's draft, Mirror's window, SSD's pre-speculation)."""

from __future__ import annotations

import numpy as np

from policies.cachebook import PositionBook
from policies.ops import (LM, SAMPLE, Delay, Fanout, Feed, Forward, OnTree, Outcome, Roots, TopK,
                          Verdict)


def _draft(i: int, batch: int = 2, sequences: tuple[int, ...] | None = None) -> Forward:
    return Forward("draft", "draft", (0, 4), 1, batch, 100 + i, head=LM, emit=SAMPLE,
                   feed=Feed(catch_up=i == 0, sequences=sequences))


def _rollout(book: PositionBook, gamma: int, batch: int = 2) -> list[Forward]:
    return [book.feed(_draft(i, batch)) for i in range(gamma)]


def test_the_first_rollout_feeds_only_its_own_position():
    book = PositionBook()
    assert _rollout(book, 3)[0] == _draft(0)  # prefill left it one position: its own


def test_a_full_accept_leaves_the_last_token_and_the_bonus_to_feed():
    book = PositionBook()
    _rollout(book, 3)
    book.settle(Verdict((3, 1)), branch=0)  # row 0 lacks its last token and the bonus
    first = _rollout(book, 3)[0]
    assert (first.n_tokens, first.context, first.head.tokens) == (2, 99, 1)
    assert not first.feed.catch_up  # widened once: what the runtime costs


def test_a_cache_that_did_not_roll_out_the_proposal_lacks_every_committed_token():
    book = PositionBook()
    op = Forward("draft", "draft", (0, 4), 1, 1, 50, emit=TopK(), branch=1,
                 feed=Feed(catch_up=True))
    book.feed(op)
    book.settle(Verdict((2,)), branch=1)  # a top-k pass feeds none of the tokens
    assert book.extra_positions(op) == 2
    book.settle(Verdict((1,), committed=(1,)), branch=0)  # no bonus: one token more
    assert book.extra_positions(op) == 3


def test_expected_outcomes_start_every_rollout_one_position_behind():
    book = PositionBook(expected=True)
    _rollout(book, 4)
    book.settle(Verdict((3.7, 3.7)), branch=0)
    assert _rollout(book, 4)[0] == _draft(0)


def test_forwards_without_catch_up_are_fed_as_declared():
    book = PositionBook()
    _rollout(book, 2)
    book.settle(Verdict((0, 0)), branch=0)
    later = _draft(1)
    assert book.extra_positions(later) == 0 and book.feed(later) is later


def _verdict(rng, gamma: int, batch: int, row_gamma=None) -> Verdict:
    top = row_gamma or (gamma,) * batch
    return Verdict(tuple(int(rng.integers(0, g + 1)) for g in top))


def test_a_full_accept_is_the_only_catch_up_of_a_narrow_draft():
    """sd's pattern: a row lacks its last sampled token and the bonus exactly
    when it accepted all gamma tokens; otherwise only its correction."""
    rng, book, gamma, widths = np.random.default_rng(0), PositionBook(), 4, set()
    for _ in range(200):
        first = _rollout(book, gamma, batch=3)[0]
        widths.add(first.n_tokens)
        accepted = tuple(int(a) for a in rng.integers(0, gamma + 1, size=3))
        committed = None if rng.random() < 0.7 else tuple(a + 1 for a in accepted)
        book.settle(Verdict(accepted, committed), branch=0)
        lacks = max(a + 1 - min(a, gamma - 1) for a in accepted)
        assert book.extra_positions(_draft(0, 3)) == lacks - 1
    assert widths == {1, 2}


def _mirror_step(book, kappa, gamma, batch, branch, row_gamma, held):
    """One Mirror window on ``branch`` (Roots over the proposal it verifies);
    returns the positions its first step feeds per row."""
    op = Forward("draft", "draft", (0, 4), 1, batch * kappa, 200, emit=SAMPLE,
                 tree=Roots(kappa, branch), branch=1, feed=Feed(catch_up=True))
    first = book.feed(op)
    for _ in range(gamma - 1):
        book.feed(Forward("draft", "draft", (0, 4), 1, batch * kappa, 201, emit=SAMPLE,
                          tree=Roots(kappa, branch), branch=1))
    return first.n_tokens


def _fresh(book, gamma, batch):
    ops = [book.feed(Forward("draft", "draft", (0, 4), 1, batch, 100 + i, emit=SAMPLE,
                             feed=Feed(catch_up=i == 0))) for i in range(gamma)]
    return ops[0].n_tokens


def test_a_window_feeds_what_mirror_counted_for_its_rows():
    """kappa > 1: each row feeds the correction, the proposal under verification
    (a row verifying none: nothing) and its root; kappa = 1: the window's rows are
    the draft's own, which fed that proposal but its last token: 2. A fresh
    rollout after a batch's miss feeds every committed token its own rollouts
    did not (with kappa = 1 the windows are its own: the correction alone)."""
    rng, gamma, batch = np.random.default_rng(1), 3, 3
    for kappa in (1, 2, 4):
        for per_row in (False, True):
            book, lack = PositionBook(), [1] * batch  # the fresh rollout's rows
            assert _fresh(book, gamma, batch) == 1
            branch, row_gamma, seen, lack, own = 0, None, set(), [0] * batch, gamma - 1
            for _ in range(60):
                fed = _mirror_step(book, kappa, gamma, batch, branch, row_gamma, None)
                assert fed == (2 if kappa == 1 else max(row_gamma or (gamma,)) + 2)
                seen.add(fed)
                verdict = _verdict(rng, gamma, batch, row_gamma)
                book.settle(verdict, branch)
                if kappa == 1:  # the window rolled out on the draft's own rows
                    lack = [0] * batch
                kept = gamma if kappa == 1 else own if branch == 0 else 0
                lack = [n + a + 1 - min(a, kept) for n, a in zip(lack, verdict.accepted)]
                held = tuple(bool(h) for h in rng.random(batch) < 0.6)
                answer = held if per_row else all(held)
                book.observed(Outcome("reuse", batch, per_row=per_row,
                                      observes=OnTree(into=1)), answer)
                if per_row:
                    branch = 1
                    row_gamma = None if all(held) else tuple(gamma * h for h in held)
                elif answer:
                    branch, row_gamma = 1, None
                else:
                    assert _fresh(book, gamma, batch) == max(lack)
                    seen.add(-max(lack))
                    branch, lack = 0, [0] * batch
            assert len(seen) >= (1 if kappa == 1 and per_row else 2)  # widths vary


def _prespec_oracle(fanout, accepted, prev, length) -> int:
    """SSD's former schedule-side count of the pre-speculation's first step."""
    return max(a + 1 + min(k, n) + (k < n) - min(a, k, p)
               for a, p, n in zip(accepted, prev, length)
               for k, f in enumerate(fanout) if f > 0)


def test_a_fanout_feeds_what_ssd_counted_for_its_outcome_rows():
    """Each outcome row (k, f) continues proposal[:k] and its guess; it last
    extended the previous proposal by min(k, its length) tokens, which the
    verdict kept up to its accepted tokens. After a hit the proposal is the
    tree's row: K tokens, K - 1 where the first pass sampled the guess."""
    rng, k_max, batch, widths = np.random.default_rng(2), 3, 2, set()
    for fanout in ((2, 2, 2, 2), (3, 1, 0, 1)):
        book, fast = PositionBook(), False
        accepted, prev, length = [0] * batch, [0] * batch, [k_max] * batch
        for i in range(k_max):  # the first (jit) backup
            book.feed(Forward("draft", "draft", (0, 4), 1, batch, 100 + i, emit=SAMPLE,
                              feed=Feed(catch_up=i == 0)))
        branch = 0
        for _ in range(80):
            rows = batch * sum(fanout)
            op = Forward("draft", "draft", (0, 4), 1, rows, 300, emit=SAMPLE,
                         tree=Fanout(fanout, branch), branch=1, feed=Feed(catch_up=True))
            fed = book.feed(op).n_tokens
            assert fed == _prespec_oracle(fanout, accepted, prev, length)
            widths.add(fed)
            verdict = _verdict(rng, k_max, batch, tuple(length))
            book.settle(verdict, branch)
            steps = k_max - 1  # the pre-speculation goes on after the verdict
            hit = bool(rng.random() < 0.5)
            book.observed(Outcome("cache_hit", batch, observes=OnTree(into=1)), hit)
            for j in range(steps if hit else 0):
                book.feed(Forward("draft", "draft", (0, 4), 1, rows, 301 + j, emit=SAMPLE,
                                  tree=Fanout(fanout, branch), branch=1))
            accepted, prev = list(verdict.accepted), length
            length = [k_max - 1 if hit and a >= n else k_max for a, n in zip(accepted, prev)]
            if hit:
                branch = 1
                continue
            branch, fast = 0, not fast
            if fast:  # a fast backup proposes K tokens outside the models
                book.proposed(Delay(0.0, branch=0, proposes=k_max))
            for i in range(0 if fast else k_max):
                book.feed(Forward("draft", "draft", (0, 4), 1, batch, 100 + i,
                                  emit=SAMPLE, feed=Feed(catch_up=i == 0)))
    assert len(widths) >= 2  # the check above is not vacuous


def test_a_rollout_for_some_sequences_counts_their_rows_alone():
    """SSD's backup for the rows that missed (``Feed.sequences``): it feeds
    what its own rows lack, extends their proposals alone, and leaves the other
    rows' lag to the next rollout that runs them."""
    book = PositionBook()
    _rollout(book, 3)
    book.settle(Verdict((3, 0)), branch=0)  # row 0 lacks 2 (last token, bonus), row 1 one
    full = _draft(0)
    assert book.extra_positions(full) == 1
    some = [book.feed(_draft(i, batch=1, sequences=(1,))) for i in range(3)]
    assert some[0] == _draft(0, batch=1, sequences=(1,))  # row 1 lacks its own position only
    # row 1 proposes 3 tokens, row 0 none (an AR step for it)
    book.settle(Verdict((0, 3)), branch=0)  # row 0: 2 + its token; row 1: last + bonus
    assert book.extra_positions(full) == 2


def test_a_delay_proposes_for_its_sequences_alone():
    book = PositionBook()
    _rollout(book, 2)
    book.settle(Verdict((2, 2)), branch=0)
    book.proposed(Delay(0.0, "draft", proposes=3, sequences=(0,)))
    assert [book._proposal(0, r) for r in (0, 1)] == [3, 0]
