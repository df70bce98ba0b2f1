"""Speculation trees: Mirror's branch-complete window and SSD's pre-speculation.

A tree is started by the first sampling Forward with a ``tree`` layout on its
branch and grows by one token per row with every later one (see ``Wide``). Its
rows come from the layout the Forward names (``policies.ops``):

* ``Roots`` (Mirror's window): from the top-k candidates its ``inputs`` Forward
  emitted after the proposal being verified;
* ``Fanout`` (SSD's pre-speculation): for each accepted count k, F_k guesses of
  the bonus token after ``proposal[:k]`` of the narrow proposal the layout
  names.

A row hits (``observe_on_path``) when its committed sequence lies on one of its
tree rows with tokens beyond it; those tokens become its next proposal. Before
the tree's first pass has answered, a row whose committed sequence already
leaves every one of its rows' bases is a miss at once (the draft knows its
cache keys, but for the guesses that pass samples), so a miss stops the
pre-speculation after the step in flight rather than one step later.
"""

from __future__ import annotations

from dataclasses import dataclass

from executors.coordinate.book import Proposal, Wide
from policies.ops import Fanout, Roots


@dataclass
class Wait:
    """An observer needs the replies ``client`` owes before it can decide (the
    latest tree's first pass); the coordinator waits for them, then asks again."""

    client: str


def start_tree(coord, op, width: int, prior, client: str):
    """A new speculation tree for ``op``; returns (tree, per-row pick or None)."""
    seqs, rows = coord.seqs, coord.seqs.batch * width
    if op.tree.rows != width:
        raise ValueError(f"Forward '{op.label}' widens the batch {width}x but its tree "
                         f"layout has {op.tree.rows} rows per sequence; make batch "
                         "sequences x tree rows")
    if isinstance(op.tree, Roots):
        if prior is None or prior.topk is None:
            raise ValueError(f"Forward '{op.label}' grows a window from roots, but its "
                             "inputs emitted no top-k candidates; pass the early-exit "
                             "Forward (or its Transfer) as inputs")
        if prior.branch != op.tree.branch:
            raise ValueError(f"Forward '{op.label}' grows roots after the proposal of "
                             f"branch {op.tree.branch}, but its inputs scored branch "
                             f"{prior.branch}; make Roots.branch the branch they score")
        bases, pick = _roots(prior, width, seqs.batch), None
    elif isinstance(op.tree, Fanout):
        bases, pick = _outcomes(seqs, op.tree.per_accepted, op.tree.branch)
    else:
        raise ValueError(f"Forward '{op.label}' has tree {op.tree!r}; the executor grows "
                         "Roots and Fanout layouts")
    tree = Wide(width, bases, Proposal.empty(rows), client)
    coord.latest_tree = tree
    return tree, pick


def _roots(prior, width: int, batch: int) -> list[list[int]]:
    bases = []
    for r in range(batch):
        roots = prior.topk[r]
        if len(roots) < width:
            raise ValueError(f"a window of {width} branches needs {width} early-exit "
                             f"candidates; the exit Forward emitted {len(roots)}")
        bases += [list(prior.seqs[r]) + [roots[i]] for i in range(width)]
    return bases


def _outcomes(seqs, fanout, branch: int) -> tuple[list[list[int]], list[int]]:
    prop = seqs.proposal(branch)
    bases, pick = [], []
    for r in range(seqs.batch):
        c, p = seqs.committed[r], prop.tokens[r]
        for k, n_guesses in enumerate(fanout):
            k = min(k, len(p))
            cands = [t for t in prop.top[r][k] if t != p[k]] if k < len(p) else []
            for f in range(n_guesses):
                if f < len(cands):
                    bases.append(c + p[:k] + [cands[f]])
                    pick.append(-1)
                else:  # the draft names its guess in the tree's first pass
                    bases.append(c + p[:k])
                    pick.append(f + (1 if k < len(p) else 0))
    return bases, pick


def observe_on_path(coord, op):
    """Per row, whether its committed sequence lies on the latest tree with tokens
    beyond it; those tokens are that row's candidate next proposal (the
    coordinator installs them where the schedule takes the hit)."""
    tree = getattr(coord, "latest_tree", None)
    if tree is None:
        coord.candidates = [None] * coord.seqs.batch
        return (False,) * coord.seqs.batch
    if not tree.ready:  # its first pass still owes guesses; a sure miss need not wait
        if all(_off_tree(tree, r, c) for r, c in enumerate(coord.seqs.committed)):
            coord.candidates = [None] * coord.seqs.batch
            return (False,) * coord.seqs.batch
        return Wait(tree.client)
    found = []
    for r, c in enumerate(coord.seqs.committed):
        best = None
        for j in range(r * tree.width, (r + 1) * tree.width):
            s, offset = tree.seq(j), len(c) - len(tree.base[j])
            if offset >= 0 and len(s) > len(c) and s[:len(c)] == c:
                if best is None or len(s) > best[0]:
                    best = (len(s), j, offset)
        found.append(None if best is None else (tree, best[1], best[2]))
    coord.candidates = found
    return tuple(f is not None for f in found)


def _off_tree(tree, r: int, committed: list[int]) -> bool:
    """Whether row ``r``'s committed sequence leaves every one of its tree rows
    within their known base, so no token the tree grows can make it a hit."""
    for j in range(r * tree.width, (r + 1) * tree.width):
        n = min(len(committed), len(tree.base[j]))
        if committed[:n] == tree.base[j][:n]:
            return False
    return True
