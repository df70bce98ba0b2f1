"""The coordinator's bookkeeping: committed tokens, proposals, cache contents.

Per row, ``committed`` holds the prompt and every token decided so far. Per
speculation branch, a proposal list holds draft tokens not yet verified (with
what the draft knew of them: its distribution at temperature > 0 and its top
candidates). Per cache (device, model) and layer, ``CacheBook`` records which
tokens' keys and values it holds, as a prefix of ``committed`` plus a tail of
proposal tokens. A Forward feeds exactly the positions its layers lack, and a
Verify keeps the part of every cache that the committed tokens still agree
with: rollback is bookkeeping, the stale entries are overwritten later.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Proposal:
    """Draft tokens of one branch, per row, with what the draft knew of each."""

    tokens: list[list[int]]
    probs: list[list[object]]  # per row, per token: draft distribution (T > 0) or None
    top: list[list[list[int]]]  # per row, per token: the draft's top candidates

    @classmethod
    def empty(cls, batch: int) -> "Proposal":
        return cls([[] for _ in range(batch)], [[] for _ in range(batch)],
                   [[] for _ in range(batch)])


@dataclass
class Sequences:
    """Committed tokens per row and the open proposals per branch."""

    committed: list[list[int]]
    prompt_lens: list[int]
    proposals: dict[int, Proposal] = field(default_factory=dict)
    version: int = 0  # bumps at every commit

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

    def commit(self, row: int, tokens: list[int]) -> None:
        self.committed[row].extend(tokens)

    def close_step(self) -> None:
        self.proposals.clear()
        self.version += 1


class CacheBook:
    """Which tokens each layer of one cache holds, per row.

    ``n[l][b]`` tokens of ``committed[b]`` and then ``tail[l][b]``, proposal
    tokens beyond the committed ones.
    """

    def __init__(self, n_layers: int, batch: int):
        self.n = [[0] * batch for _ in range(n_layers)]
        self.tail = [[()] * batch for _ in range(n_layers)]

    def valid(self, layer: int, row: int, committed: list[int], extra) -> int:
        n = self.n[layer][row]
        if n < len(committed):
            return n
        return n + common_prefix(self.tail[layer][row], extra)

    def holds(self, layers, row: int, committed: list[int], extra) -> int:
        """Positions every layer of ``layers`` holds correctly for this row."""
        return min(self.valid(i, row, committed, extra) for i in range(*layers))

    def wrote(self, layers, row: int, committed_len: int, extra) -> None:
        """Layers now hold a whole sequence: ``committed_len`` committed tokens + extra."""
        for i in range(*layers):
            self.n[i][row] = committed_len
            self.tail[i][row] = tuple(extra)

    def commit(self, row: int, old_len: int, new_tokens: list[int]) -> None:
        """Tokens were committed: keep what agrees with them, drop the rest."""
        for i in range(len(self.n)):
            if self.n[i][row] >= old_len:
                self.n[i][row] = old_len + common_prefix(self.tail[i][row], new_tokens)
            self.tail[i][row] = ()
