"""Prompt lookup in the executor: the coordinator's host proposes by n-gram match.

A ``Lookup`` runs ``policies.ngram.propose`` over each row's committed tokens
(its prompt and what it generated) on the coordinator's own CPU, beside the
target, and makes what it found the narrow proposal of the Lookup's branch. A
proposed token is a point mass: it carries no draft distribution (the Verify's
rejection sampling then accepts token x with the target's p(x)) and is its own
only candidate. The span is the lookup's measured host time.

A ``Lookup`` with ``siblings`` makes its continuations a token tree instead
(``executors.coordinate.tokentree``): chains under the root, ranked as found
(the best first), which the target's scoring pass feeds whole and the Verify
walks as it walks a drafted tree.

A ``Delay`` that ``proposes`` (SSD's ``backup=fast``) is answered the same way:
while its device waits, the lookup proposes up to that many tokens a row on the
Delay's branch (``policies.ngram``'s defaults), so a miss falls back to a real
near-free proposer whose tokens the target verifies.
"""

from __future__ import annotations

import time

from executors.coordinate.book import Proposal
from executors.coordinate.loop import Pending
from executors.coordinate.tokentree import Node, TokenTree
from policies.ngram import propose, siblings
from policies.ops import Delay, Found, Lookup


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


def tree_rows(seqs, op: Lookup) -> Found:
    """Each row's sibling continuations, made a token tree on ``op.branch``."""
    base = [len(c) for c in seqs.committed]
    tree = TokenTree(base, [[] for _ in base], [[] for _ in base])
    longest = []
    for r, nodes in enumerate(tree.nodes):
        runs = siblings(seqs.committed[r], seqs.prompt_lens[r], gamma=op.gamma,
                        width=op.siblings, nodes=op.nodes, n=op.n, n_min=op.n_min,
                        search=op.search)
        for rank, run in enumerate(runs):  # a chain under the root, best ranked first
            parent = -1
            for depth, token in enumerate(run, start=1):
                nodes.append(Node(token, parent, depth, 1.0 / (rank + 1)))
                parent = len(nodes) - 1
        longest.append(max(map(len, runs), default=0))
    seqs.trees[op.branch] = tree
    return Found(tuple(len(n) for n in tree.nodes), tuple(longest))


def lookup(coord, op: Lookup) -> Pending:
    if op.siblings is not None and op.branch == 0:
        raise ValueError(f"Lookup '{op.label}' grows a token tree (siblings) on branch 0; "
                         "put it on a speculation branch other than 0")
    start = time.perf_counter()
    if op.siblings is None:
        found = propose_rows(coord.seqs, op.branch, op.gamma, n=op.n, n_min=op.n_min,
                             search=op.search)
    else:
        found = tree_rows(coord.seqs, op)
    reply = (None, start, time.perf_counter())
    role = op.device or "host"
    coord.span(op, role, "host" if op.device is None else coord.place.client(role),
               reply, "lookup",
               proposed=list(found if op.siblings is None else found.nodes))
    return Pending([], lambda _r: found)
