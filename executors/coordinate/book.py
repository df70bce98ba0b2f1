"""The coordinator's bookkeeping: committed tokens, proposals, cache contents.

Per row, ``committed`` holds the prompt and every token decided so far.
*Narrow* proposals (one row per sequence) hold draft tokens awaiting a Verify,
per speculation branch, with what the draft knew of each token (its
distribution at temperature > 0 and its top candidates). *Wide* speculation
stores hold trees a draft builds over ``batch * width`` rows (Mirror's window,
SSD's pre-speculation): row ``j`` extends sequence ``j // width``. Each holds
its own full token sequence, so it survives the Verify it was built during.

``CacheBook`` records, per cache layer and row, which token sequence its keys
and values were computed from. A Forward feeds exactly the positions past the
longest prefix that every layer it runs shares with the sequence now wanted:
rollback is bookkeeping, and stale entries are overwritten later.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two sequences (C-speed compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Proposal:
    """Draft tokens per row, with the draft's distribution and top candidates."""

    tokens: list[list[int]]
    probs: list[list[object]]
    top: list[list[list[int]]]

    @classmethod
    def empty(cls, rows: int) -> "Proposal":
        return cls([[] for _ in range(rows)], [[] for _ in range(rows)],
                   [[] for _ in range(rows)])

    def append(self, row: int, token: int, prob, top) -> None:
        self.tokens[row].append(token)
        self.probs[row].append(prob)
        self.top[row].append(top)

    def drop_front(self, row: int, n: int) -> None:
        for lists in (self.tokens, self.probs, self.top):
            del lists[row][:n]


@dataclass
class Wide:
    """A speculation tree over ``rows = batch * width`` rows; row j's sequence is
    ``base[j] + proposal.tokens[j]``."""

    width: int
    base: list[list[int]]
    proposal: Proposal
    client: str  # the device building it
    ready: bool = False  # its first Forward has answered
    def seq(self, row: int) -> list[int]:
        return self.base[row] + self.proposal.tokens[row]


@dataclass
class Sequences:
    committed: list[list[int]]
    prompt_lens: list[int]
    proposals: dict[int, Proposal] = field(default_factory=dict)
    wide: dict[int, Wide] = field(default_factory=dict)
    trees: dict[int, object] = field(default_factory=dict)  # executors.coordinate.tokentree

    @classmethod
    def start(cls, prompts: list[list[int]]) -> "Sequences":
        return cls([list(p) for p in prompts], [len(p) for p in prompts])

    @property
    def batch(self) -> int:
        return len(self.committed)

    def proposal(self, branch: int) -> Proposal:
        if branch not in self.proposals:
            self.proposals[branch] = Proposal.empty(self.batch)
        return self.proposals[branch]

    def seq(self, row: int, branch: int) -> list[int]:
        return self.committed[row] + self.proposal(branch).tokens[row]

    def generated(self, row: int) -> list[int]:
        return self.committed[row][self.prompt_lens[row]:]

    def regroup(self, keep: list[int], prompts: list[list[int]]) -> None:
        """Between schedule runs: rows ``keep`` (in their new order), then one row
        per prompt. Speculation in flight is dropped: a run ends on committed tokens."""
        self.committed = [self.committed[r] for r in keep] + [list(p) for p in prompts]
        self.prompt_lens = [self.prompt_lens[r] for r in keep] + [len(p) for p in prompts]
        self.proposals, self.wide, self.trees = {}, {}, {}


class CacheBook:
    """Which token sequence each layer's cache entries come from, per row.

    ``held[l][r] = (seq, n)``: layer l holds the first n positions of ``seq`` (a
    tuple shared by the layers one Forward wrote).
    """

    EMPTY = ((), 0)

    def __init__(self, n_layers: int, rows: int):
        self.held = [[self.EMPTY] * rows for _ in range(n_layers)]

    def holds(self, layers, row: int, seq) -> int:
        """Positions of ``seq`` that every layer in ``layers`` holds."""
        best, seen = None, {}
        for i in range(*layers):
            entry = self.held[i][row]
            key = (id(entry[0]), entry[1])
            if key not in seen:
                held, n = entry
                seen[key] = common_prefix(held[:n], seq) if n else 0
            best = seen[key] if best is None else min(best, seen[key])
        return best if best is not None else len(seq)

    def regroup(self, keep: list[int], add: int, width: int = 1) -> None:
        """Rows of sequences ``keep`` (``width`` rows each, in their new order), then
        ``add`` sequences' empty rows."""
        rows = [s * width + j for s in keep for j in range(width)]
        self.held = [[layer[r] for r in rows] + [self.EMPTY] * (add * width)
                     for layer in self.held]

    def wrote(self, layers, row: int, seq: tuple, n: int) -> None:
        for i in range(*layers):
            self.held[i][row] = (seq, n)
