"""Token trees (Medusa, EAGLE, SpecInfer): drafted depth by depth, scored in one
tree-masked pass, walked by the Verify (see ``policies.tree``).

The Forwards of a speculation branch other than 0 that do not sample:
  * a ``TopK`` Forward with ``tree=Children()`` when the branch has no
    tree feeds the committed sequence as usual (catch-up positions, then the
    root: the last committed token) and starts the tree: the root's top-k
    candidates are depth 1;
  * a later ``TopK`` Forward expands the ``n_tokens`` most confident
    nodes of the deepest level (confidence: the product of the draft's
    probabilities along the path; a static tree expands all of them) into
    their top-k candidates;
  * a Forward that emits nothing (the target's, with its head) feeds the root
    and the ``n_tokens - 1`` most confident nodes, parents before children; its
    logits rows are the root's and then each node's.
Nodes go in cache slots past the committed sequence, which the cache book does
not record. A node at depth d takes rotary position ``committed - 1 + d`` and
sees the committed slots, its ancestors' slots and its own.

The Verify on the branch walks the tree (``LocalDevice._walk_trees``), then the
path's keys and values move from their slots to their places on the committed
sequence in every scoring pass's layers (``CompactCmd``), and the book records
them as held. Drafting caches are left as they are: their next pass re-feeds
the path and the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executors.coordinate.book import Proposal
from executors.coordinate.loop import Pending
from executors.backend.device import CompactCmd, FwdCmd, VerifyCmd
from executors.coordinate.feeds import head_fields
from policies.ops import Children, Sample, TopK


@dataclass
class Node:
    token: int
    parent: int  # index of the parent node, -1: the root
    depth: int
    score: float  # product of the draft's probabilities along the path


@dataclass
class TokenTree:
    base: list[int]  # per row: committed length when the tree started
    nodes: list[list[Node]]
    level: list[list[int]]  # per row: the nodes the last expansion made
    slots: dict = field(default_factory=dict)  # (client, model, width) -> per row {node: slot}
    pending: list | None = None  # per row: nodes of the expansion in flight
    scored: list | None = None  # per row: nodes the scoring pass fed, in order
    passes: list = field(default_factory=list)  # (client, model, width, layers) that scored


def _tree(coord, op):
    if op.branch == 0 or type(op.emit) is Sample or (type(op.emit) is TopK and
                                                     not isinstance(op.tree, Children)):
        return None
    return coord.seqs.trees.get(op.branch)


def expands(coord, op) -> bool:
    """Whether ``op`` expands an existing tree (a draft pass past the root)."""
    return type(op.emit) is TopK and _tree(coord, op) is not None


def _ranked(nodes: list[Node], among, n: int) -> list[int]:
    """The n most confident of ``among`` (shallower first on ties, so a node never
    outranks its parent), in creation order: parents before children."""
    best = sorted(among, key=lambda j: (-nodes[j].score, nodes[j].depth, j))[:n]
    return sorted(best)


def expand_command(coord, op, handle: int, client: str, **extra):
    """The draft pass over the ``n_tokens`` nodes the tree expands next."""
    tree = _tree(coord, op)
    key = (client, op.model, extra["width"])
    slots = tree.slots.setdefault(key, [{} for _ in tree.base])
    starts, n_fed, tokens, branches, picks = [], [], [], [], []
    for r, base in enumerate(tree.base):
        nodes, held = tree.nodes[r], slots[r]
        pick = _ranked(nodes, tree.level[r], op.n_tokens)
        start = max([base, *(s + 1 for s in held.values())])
        row = []
        for i, j in enumerate(pick):
            held[j] = start + i
            row.append((i, base - 1 + nodes[j].depth, base,
                        *(held[a] for a in _ancestors(nodes, j))))
        starts.append(start)
        n_fed.append(len(pick))
        tokens.append([nodes[j].token for j in pick])
        branches.append(row)
        picks.append(pick)
    tree.pending = picks
    most = max(n_fed)
    padded = [t + [t[-1]] * (most - len(t)) for t in tokens]
    cmd = FwdCmd(handle, op.model, op.layers, starts, n_fed, padded, None, *head_fields(op),
                 tuple(n_fed), branches=branches, **extra)
    seqs = [tuple(c) for c in coord.seqs.committed]
    return cmd, {"start": starts, "n_fed": n_fed, "seqs": seqs, "n_logits": tuple(n_fed),
                 "branches": branches}


def _ancestors(nodes: list[Node], j: int) -> list[int]:
    out, a = [], nodes[j].parent
    while a >= 0:
        out.append(a)
        a = nodes[a].parent
    return out


def scoring(coord, op):
    """Per row, the nodes a scoring pass feeds after the root, as extras
    ``(token, rope, limit, ancestors)``; None when ``op`` scores no tree."""
    tree = _tree(coord, op)
    if tree is None or op.emit is not None or op.head is None:
        return None
    tree.scored, out = [], []
    for r, base in enumerate(tree.base):
        nodes = tree.nodes[r]
        pick = _ranked(nodes, range(len(nodes)), op.n_tokens - 1)
        where = {j: i for i, j in enumerate(pick)}
        tree.scored.append(pick)
        out.append([(nodes[j].token, base - 1 + nodes[j].depth, base,
                     tuple(where[a] for a in _ancestors(nodes, j))) for j in pick])
    return out


def note_pass(coord, op, client: str, width: int, fed: dict) -> None:
    """A Forward computed the scored nodes through ``op.layers``."""
    tree = _tree(coord, op)
    if tree is not None and tree.scored is not None and fed.get("branches"):
        tree.passes.append((client, op.model, width, tuple(op.layers)))


def emitted(coord, op, result: dict) -> bool:
    """Grow the branch's tree from a draft pass's candidates; False when ``op`` is
    no token-tree pass."""
    if (op.branch == 0 or type(op.emit) is not TopK or not isinstance(op.tree, Children)
            or op.batch != coord.seqs.batch):
        return False
    tree = coord.seqs.trees.get(op.branch)
    per_pos = result.get("topk_all") or [[t] for t in result["topk"]]
    if tree is None:  # the root pass: its last position is the root
        n = len(coord.seqs.committed)
        tree = TokenTree([len(c) for c in coord.seqs.committed], [[] for _ in range(n)],
                         [[] for _ in range(n)])
        coord.seqs.trees[op.branch] = tree
        parents = [[-1] for _ in range(n)]
        per_pos = [[p[-1]] for p in per_pos]
        probs = [[p[-1]] for p in result["topk_p"]]
    else:
        parents, tree.pending = tree.pending, None
        probs = result["topk_p"]
    for r, row in enumerate(parents):
        nodes, level = tree.nodes[r], []
        for i, parent in enumerate(row):
            score = 1.0 if parent < 0 else nodes[parent].score
            depth = 1 if parent < 0 else nodes[parent].depth + 1
            for tok, p in zip(per_pos[r][i], probs[r][i]):
                nodes.append(Node(int(tok), parent, depth, score * float(p)))
                level.append(len(nodes) - 1)
        tree.level[r] = level
    return True


def verify(coord, op, info):
    """The Verify of a scored tree: walk it on the target's device, commit the
    path and the bonus token, move the path's keys and values into place."""
    tree = coord.seqs.trees.get(op.branch)
    rows = [[(tree.nodes[r][j].token, -1 if tree.nodes[r][j].parent < 0 else
              pick.index(tree.nodes[r][j].parent)) for j in pick]
            for r, pick in enumerate(tree.scored)]
    offsets = [len(c) - 1 - s for c, s in zip(coord.seqs.committed, info.logit_start)]
    cmd = VerifyCmd(op.target.id, [[] for _ in rows], None, coord.temperature, offsets,
                    True, tree=rows)

    def finish(replies):
        result, _, _ = reply = replies[0]
        coord.span(op, info.role, info.client, reply, "compute")
        prop = Proposal.empty(len(rows))
        for r, path in enumerate(result["path"]):  # indices among the scored nodes
            prop.tokens[r] = [rows[r][i][0] for i in path]
        depth = [max((tree.nodes[r][j].depth for j in pick), default=0)  # per row
                 for r, pick in enumerate(tree.scored)]
        verdict = coord._commit(op, result, prop, depth,
                                nodes=[len(pick) for pick in tree.scored])
        coord.seqs.trees.pop(op.branch, None)
        moves = _compaction(coord, tree, result["path"])
        return Pending(moves, lambda _r: verdict) if moves else verdict

    return Pending([(info.client, cmd)], finish)


def _compaction(coord, tree: TokenTree, paths: list[list[int]]) -> list:
    """Commands that move each accepted path from its scoring slots to its place
    on the committed sequence; the books then hold the path."""
    cmds = []
    for client, model, width, layers in tree.passes:
        book, moves = coord.book(client, model, width), []
        for r, path in enumerate(paths):
            base, committed = tree.base[r], tuple(coord.seqs.committed[r])
            if not path or book.holds(layers, r, committed[:base]) < base:
                continue
            nodes, scored = tree.nodes[r], tree.scored[r]
            for i in path:  # scored node i sits in slot base + i
                moves.append((r, base + i, base - 1 + nodes[scored[i]].depth))
            book.wrote(layers, r, committed, base + len(path))
        if moves:
            cmds.append((client, CompactCmd(model, width, [layers], moves)))
    return cmds
