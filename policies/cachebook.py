"""What a model's KV cache lacks, counted by the runtime for ``Forward.catch_up``.

A draft samples the last token of its rollout without feeding it, and the
verdict commits tokens (the target's bonus, or a correction) that the draft never
saw. The next rollout's first pass must feed those positions too. Schedules no
longer count them: a Forward with ``catch_up=True`` asks the runtime to feed
what this model's cache lacks on this branch, and the runtime keeps the count.
The torch executor feeds real token sequences past what its layers hold
(``executors.coordinate.book``), so it needs no count; the simulator, which has
no tokens, counts positions here from the Forwards it ran and the Verdicts it
returned.

Plain Python (no simpy, no torch): both runtimes may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from policies.ops import Forward, Verdict


@dataclass
class _Rows:
    """Per row: ``behind``, positions of the committed sequence the cache lacks
    (1 at the start: prefill leaves the prompt's last token to the first step);
    ``sampled``, tokens of the pending proposal this cache sampled (it fed all
    but the last)."""

    behind: list[int]
    sampled: int = 0

    def fed(self) -> list[int]:
        """Per row, tokens of the pending proposal this cache fed."""
        return [max(self.sampled - 1, 0)] * len(self.behind)


@dataclass
class PositionBook:
    """Per (model, layer range, branch), what that cache lacks, row by row.

    ``expected``: verdicts are expectations (deterministic simulation); the laws
    take every rollout to start one position behind, so a catch-up feeds
    nothing extra."""

    expected: bool = False
    _caches: dict[tuple, _Rows] = field(default_factory=dict)

    def _rows(self, op: Forward) -> _Rows:
        key = (op.model, op.layers, op.branch)
        rows = self._caches.get(key)
        if rows is None:
            rows = self._caches[key] = _Rows([1] * op.batch)
        return rows

    def extra_positions(self, op: Forward) -> int:
        """Positions per row a ``catch_up`` Forward feeds before its own (the
        most any row lacks, less the one it feeds anyway: rows are padded to
        one width)."""
        if not op.catch_up or self.expected:
            return 0
        return max(self._rows(op).behind) - 1

    def feed(self, op: Forward) -> Forward:
        """``op`` as a runtime without tokens runs it: the positions its cache
        lacks fed first (counted as run). A one-token pass catching up still
        samples one token, from its last position (``head_tokens=1``)."""
        if not op.catch_up and op.emit != "sample":
            return op  # neither feeds nor samples for a cache the book counts
        extra = self.extra_positions(op)
        self.ran(op)
        if not extra:
            return op
        return replace(op, n_tokens=op.n_tokens + extra, context=op.context - extra,
                       head_tokens=1 if op.n_tokens == 1 else op.head_tokens,
                       catch_up=False)

    def ran(self, op: Forward) -> None:
        """Count a Forward the runtime ran: a catch-up feeds all its cache
        lacked; a sampling Forward adds its tokens to the pending proposal."""
        if op.catch_up:
            rows = self._rows(op)
            rows.behind, rows.sampled = [0] * len(rows.behind), 0
        rows = self._caches.get((op.model, op.layers, op.branch))
        if rows is not None and op.emit == "sample":
            rows.sampled += op.n_tokens

    def settle(self, verdict: Verdict, branch: int) -> None:
        """Commit ``verdict`` on speculation ``branch``: a cache that rolled out
        the proposal verified already fed the accepted tokens it fed; every
        other cache lacks all committed tokens."""
        committed = verdict.committed or [a + 1 for a in verdict.accepted]
        for (_, _, on), rows in self._caches.items():
            if self.expected:
                rows.behind, rows.sampled = [1] * len(rows.behind), 0
                continue
            fed = rows.fed() if on == branch else [0] * len(rows.behind)
            for r, (a, c) in enumerate(zip(verdict.accepted, committed)):
                rows.behind[r] += int(c) - min(int(a), fed[r])
            rows.sampled = 0
