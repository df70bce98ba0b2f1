"""The runtimes' position book (policies/cachebook.py): what a catch_up Forward
feeds besides its own positions, counted from the Forwards run and the Verdicts
returned. The executor's real feeds are checked against it in
test_schedule_work and test_tree; here its counting rules."""

from __future__ import annotations

import numpy as np

from policies.base import PolicyContext
from policies.cachebook import PositionBook
from policies.ops import Forward, Verdict
from policies.sd import DraftCache
from hwprofiles import load_model


def _draft(i: int, batch: int = 2, **kw) -> Forward:
    return Forward("draft", "draft", (0, 4), 1, batch, 100 + i, head="lm", emit="sample",
                   catch_up=i == 0, **kw)


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
    assert (first.n_tokens, first.context, first.head_tokens) == (2, 99, 1)
    assert not first.catch_up  # widened once: what the runtime costs


def test_a_cache_that_did_not_roll_out_the_proposal_lacks_every_committed_token():
    book = PositionBook()
    op = Forward("draft", "draft", (0, 4), 1, 1, 50, emit="topk", branch=1, catch_up=True)
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


def test_the_book_counts_what_sd_s_own_draft_cache_counted():
    """The schedule-side count (kept by mirror and ssd) and the book agree on
    sd's pattern over random verdicts, row by row widths and all."""
    ctx = PolicyContext(load_model("smollm2-135m"), None, tokens=10, batch=3)
    rng, book, cache, gamma = np.random.default_rng(0), PositionBook(), DraftCache(ctx), 4
    widths = set()
    for _ in range(200):
        first = _rollout(book, gamma, batch=3)[0]
        assert first.n_tokens == cache.first_step()
        widths.add(first.n_tokens)
        cache.rolled_out(gamma)
        accepted = tuple(int(a) for a in rng.integers(0, gamma + 1, size=3))
        committed = None if rng.random() < 0.7 else tuple(a + 1 for a in accepted)
        verdict = Verdict(accepted, committed)
        book.settle(verdict, branch=0)
        cache.settle(verdict, own=True)
    assert widths == {1, 2}
