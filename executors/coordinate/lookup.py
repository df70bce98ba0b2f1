"""Prompt lookup in the executor: the coordinator's host proposes by n-gram match.

A ``Lookup`` runs ``policies.ngram.propose`` over each row's committed tokens
(its prompt and what it generated) on the coordinator's own CPU, beside the
target, and makes what it found the narrow proposal of the Lookup's branch. A
proposed token is a point mass: it carries no draft distribution (the Verify's
rejection sampling then accepts token x with the target's p(x)) and is its own
only candidate. The span is the lookup's measured host time.

A ``Delay`` that ``proposes`` (SSD's ``backup=fast``) is answered the same way:
while its device waits, the lookup proposes up to that many tokens a row on the
Delay's branch (``policies.ngram``'s defaults), so a miss falls back to a real
near-free proposer whose tokens the target verifies.
"""

from __future__ import annotations

import time

from executors.coordinate.book import Proposal
from executors.coordinate.loop import Pending
from policies.ngram import propose
from policies.ops import Delay, Lookup


def propose_rows(seqs, branch: int, gamma: int, **match) -> tuple[int, ...]:
    """Each row's lookup, made the narrow proposal of ``branch``; lengths per row."""
    prop = Proposal.empty(seqs.batch)
    for r in range(seqs.batch):
        for token in propose(seqs.committed[r], seqs.prompt_lens[r], gamma=gamma, **match):
            prop.append(r, token, None, [token])
    seqs.proposals[branch] = prop
    return tuple(len(t) for t in prop.tokens)


def backup(coord, op: Delay) -> None:
    """A fast backup's tokens (``Delay.proposes``), by prompt lookup."""
    propose_rows(coord.seqs, op.branch, op.proposes)


def lookup(coord, op: Lookup) -> Pending:
    start = time.perf_counter()
    found = propose_rows(coord.seqs, op.branch, op.gamma, n=op.n, n_min=op.n_min,
                         search=op.search)
    reply = (None, start, time.perf_counter())
    role = op.device or "host"
    coord.span(op, role, "host" if op.device is None else coord.place.client(role),
               reply, "lookup", proposed=list(found))
    return Pending([], lambda _r: found)
