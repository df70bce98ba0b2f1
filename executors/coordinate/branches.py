"""Correction branches (CATS): sibling positions verified in the same target pass.

A shallow verifier, a ``TopK`` Forward over several positions of the
narrow proposal (branch 0, ``Head.tokens=None``), names its top candidates at
each proposed position. A token-mode Forward of branch 0 with ``Feed(corrections=n)``
re-forwards n correction tokens after the proposal: at the
first position i where the verifier's top token differs from the draft's (the
last position where it agrees everywhere), its best candidates other than the
draft's token. Each correction is a sibling of ``proposal[i]``: rotary position
``len(committed) + i``, it sees the committed prefix and ``proposal[:i]`` only
(neither the rest of the main branch nor its siblings), from a cache slot past
the main branch. Later Forwards over those positions carry the branch tokens
through their layers (``executors.coordinate.feeds``), so one target pass scores the main
branch and every correction.

At the Verify (greedy), where the target rejects ``proposal[i]`` and its own
token there equals a correction, the row continues along that correction: it
commits ``proposal[:i]``, the correction and the target's token after it.
Compaction then copies the correction's keys and values to its place on the
committed path in every layer that computed it, so later steps see a plain
prefix. At temperature above 0 the branches are computed but not used: plain
rejection sampling on the main branch keeps the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executors.backend.device import CompactCmd


@dataclass
class Cycle:
    """One cycle's correction branches, from the re-forward to the Verify."""

    rows: list[list[tuple[int, int]]]  # per row: (proposal index, token) per correction
    base: list[int]  # per row: committed length when the branches were placed
    slot0: list[int]  # per row: cache slot of its first correction
    passes: list[tuple[str, str, int, tuple[int, int]]] = field(default_factory=list)


def note_verifier(coord, op, info, result: dict) -> None:
    """Remember a verifier's candidates at every position it projected."""
    if ("topk_all" in result and not info.wide and info.width == 1 and op.branch == 0
            and op.head.tokens is None):
        coord.verifier = (info, result["topk_all"])


def take(coord, op, width: int, wide: bool):
    """Per row, the correction tokens ``(token, rope)`` this token-mode Forward
    re-forwards after the proposal, or None when it carries none."""
    n = op.feed.corrections
    if not n or coord.verifier is None or wide or width != 1 or op.branch != 0:
        return None
    info, topk_all = coord.verifier
    coord.verifier = None
    seqs, prop = coord.seqs, coord.seqs.proposal(0)
    rows, base, slot0 = [], [], []
    for r, committed in enumerate(seqs.committed):
        rows.append(_choose(info.logit_start[r], topk_all[r], len(committed),
                            prop.tokens[r], n))
        base.append(len(committed))
        slot0.append(len(committed) + len(prop.tokens[r]))
    coord.cycle = Cycle(rows, base, slot0)
    return [[(tok, b + i) for i, tok in row] for row, b in zip(rows, base)]


def _choose(logit_start: int, ranked: list[list[int]], base: int, proposal: list[int],
            n: int) -> list[tuple[int, int]]:
    """The verifier's n best alternatives at its first disagreement with the draft."""
    seen = None
    for i, tok in enumerate(proposal):
        m = base + i - 1 - logit_start  # logits at the slot before proposal[i]
        if 0 <= m < len(ranked):
            seen = i
            if ranked[m][0] != tok:
                break
    if seen is None:
        return []
    m = base + seen - 1 - logit_start
    return [(seen, t) for t in ranked[m] if t != proposal[seen]][:n]


def note_pass(coord, client: str, model: str, width: int, layers, fed: dict) -> None:
    """A Forward computed the branch tokens through ``layers``."""
    if fed.get("branches") and coord.cycle is not None:
        coord.cycle.passes.append((client, model, width, tuple(layers)))


def for_verify(coord, info) -> list | None:
    """Per row ``(proposal index, token, logits row)`` of each correction the
    target pass scored (its logits follow the main branch's), or None."""
    cycle = coord.cycle
    if cycle is None or not info.branches or coord.temperature > 0:
        return None
    out = []
    for r, row in enumerate(cycle.rows):
        first = info.n_logits[r] - len(row)
        out.append([(i, tok, first + j) for j, (i, tok) in enumerate(row)])
    return out


def compaction(coord, via: list) -> list:
    """Commands that move each taken correction's keys and values onto the
    committed path; the book then records the path as held."""
    cycle, coord.cycle = coord.cycle, None
    if cycle is None or not any(v is not None for v in via):
        return []
    moves: dict[tuple[str, str, int], list] = {}
    for r, token in enumerate(via):
        if token is None:
            continue
        j, (i, _) = next((j, c) for j, c in enumerate(cycle.rows[r]) if c[1] == token)
        dst, path = cycle.base[r] + i, tuple(coord.seqs.committed[r])
        for client, model, width, layers in cycle.passes:
            book = coord.book(client, model, width)
            if book.holds(layers, r, path[:dst]) >= dst:
                book.wrote(layers, r, path, dst + 1)
                moves.setdefault((client, model, width), []).append(
                    (layers, (r, cycle.slot0[r] + j, dst)))
    cmds = []
    for (client, model, width), items in moves.items():
        ranges = sorted({layers for layers, _ in items})
        cmds.append((client, CompactCmd(model, width, ranges,
                                        sorted({m for _, m in items}))))
    return cmds
