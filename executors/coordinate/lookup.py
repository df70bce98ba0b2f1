"""Prompt lookup in the executor: the coordinator's host proposes by n-gram match.

A ``Lookup`` runs ``policies.ngram.propose`` over each row's committed tokens
(its prompt and what it generated) on the coordinator's own CPU, beside the
target, and makes what it found the narrow proposal of the Lookup's branch. A
proposed token is a point mass: it carries no draft distribution (the Verify's
rejection sampling then accepts token x with the target's p(x)) and is its own
only candidate. The span is the lookup's measured host time.
"""

from __future__ import annotations

import time

from executors.coordinate.book import Proposal
from executors.coordinate.loop import Pending
from policies.ngram import propose
from policies.ops import Lookup


def lookup(coord, op: Lookup) -> Pending:
    start = time.perf_counter()
    seqs = coord.seqs
    prop = Proposal.empty(seqs.batch)
    for r in range(seqs.batch):
        for token in propose(seqs.committed[r], seqs.prompt_lens[r], gamma=op.gamma,
                             n=op.n, n_min=op.n_min, search=op.search):
            prop.append(r, token, None, [token])
    seqs.proposals[op.branch] = prop
    found = tuple(len(t) for t in prop.tokens)
    reply = (None, start, time.perf_counter())
    role = op.device or "host"
    coord.span(op, role, "host" if op.device is None else coord.place.client(role),
               reply, "lookup", proposed=list(found))
    return Pending([], lambda _r: found)
