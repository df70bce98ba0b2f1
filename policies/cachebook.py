"""What a model's KV cache lacks, counted by the runtime for ``Feed.catch_up``.

A draft samples the last token of its rollout without feeding it, and the
verdict commits tokens (the target's bonus, or a correction) that the draft never
saw; a speculation tree's rows (``Roots``, ``Fanout``) continue the proposal
under verification, which their cache fed only in part or not at all. The first
pass of a rollout or of a tree must feed those positions too. Schedules do not
count them: a Forward with ``catch_up=True`` asks the runtime to feed what its
rows lack, and the runtime keeps the count. The torch executor feeds real token
sequences past what its layers hold (``executors.coordinate.book``), so it needs
no count; the simulator, which has no tokens, counts positions here from the
Forwards it ran, the Verdicts it returned and the Outcomes it answered.

A cache is what the executor keys one: a model's layers at one width, rows per
sequence (``Forward.tree.rows``, 1 without a tree), whatever the branch. So
Mirror-SD's one-root window (``Roots(1)``) continues the draft's own cache, and
a window of several roots keeps a cache of its own. A cache of several rows per
sequence is counted by its worst row: one its tree's hit did not take.

Plain Python (no simpy, no torch): both runtimes may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from policies.ops import Delay, Fanout, Feed, Forward, Head, Outcome, Roots, Sample, Verdict


@dataclass
class _Taken:
    """The proposal an Outcome's hits installed: per row, the tokens the tree
    grew on the taken row (read when needed: a tree may still be growing), less
    a guess its first pass sampled (it is the committed bonus); None: no hit."""

    tree: "_Cache"
    less: list[int | None]
    grown: int | None = None  # the tree's tokens, once it stopped growing

    def length(self, row: int) -> int:
        less = self.less[row]
        grown = self.tree.sampled if self.grown is None else self.grown
        return 0 if less is None else grown - less


@dataclass
class _Rows:
    """Per row, the tokens of a proposal whose rows were extended apart
    (``Feed.sequences``, ``Delay.sequences``: SSD's backup beside the rows that hit)."""

    lengths: list[int]

    def length(self, row: int) -> int:
        return self.lengths[row]


@dataclass
class _Cache:
    """One cache, per sequence and per group of its rows (one group, or one per
    accepted count k of a ``Fanout``): ``behind``, positions of the committed
    sequence the group's worst row lacks (1 at the start: prefill leaves the
    prompt's last token to the first step); ``held``, tokens of the proposal of
    branch ``follows`` it holds (None: all that proposal's tokens but its last,
    the rollout that sampled them having fed them)."""

    behind: list[list[int]]
    held: list[list[int | None]]
    follows: int | None = None
    sampled: int = 0  # tokens sampled since it last caught up
    layout: Roots | Fanout | None = None  # the tree it last started
    continued: list[int] = field(default_factory=list)  # per row: that tree's proposal


def _wants(layout, n: int) -> list[tuple[int, int]]:
    """Per group of a first pass's rows, (tokens of the proposal under verification
    they continue, tokens given after it: a root or a guess) for a proposal of
    ``n`` tokens; a narrow rollout continues the committed tokens alone."""
    if isinstance(layout, Roots):
        return [(n, 1)]
    if isinstance(layout, Fanout):
        return [(min(k, n), int(k < n)) for k, f in enumerate(layout.per_accepted) if f > 0]
    return [(0, 0)]


@dataclass
class PositionBook:
    """Per cache, what it lacks, row by row.

    ``expected``: verdicts are expectations (deterministic simulation); the laws
    take every rollout to start one position behind, so a catch-up feeds
    nothing extra."""

    expected: bool = False
    _caches: dict[tuple, _Cache] = field(default_factory=dict)
    _proposals: dict[int, int | _Taken | _Rows] = field(default_factory=dict)  # per branch
    _latest: _Cache | None = None  # the tree grown last (what an Outcome observes)
    _accepted: tuple = ()  # the last verdict's, per row

    @staticmethod
    def _tree(op: Forward) -> Roots | Fanout | None:
        return op.tree if isinstance(op.tree, (Roots, Fanout)) else None

    def _cache(self, op: Forward, create: bool = False) -> _Cache | None:
        rows = op.tree.rows if op.tree is not None else 1
        key = (op.model, op.layers, rows)
        cache = self._caches.get(key)
        if cache is None and create:
            groups, seqs = len(_wants(self._tree(op), 0)), op.batch // rows
            cache = self._caches[key] = _Cache([[1] * seqs for _ in range(groups)],
                                               [[0] * seqs for _ in range(groups)])
        return cache

    def _proposal(self, branch: int, row: int) -> int:
        """Tokens of row ``row``'s proposal on speculation ``branch``."""
        p = self._proposals.get(branch, 0)
        return p if isinstance(p, int) else p.length(row)

    def _held(self, cache: _Cache, group: int, row: int, branch: int) -> int:
        if cache.follows != branch:
            return 0
        held = cache.held[group][row]
        return max(self._proposal(branch, row) - 1, 0) if held is None else held

    def extra_positions(self, op: Forward) -> int:
        """Positions per row a ``catch_up`` Forward feeds before its own (the
        most any row lacks, less the one it feeds anyway: rows are padded to
        one width)."""
        if not op.feed.catch_up or self.expected:
            return 0
        cache, layout = self._cache(op, create=True), self._tree(op)
        branch = layout.branch if layout is not None else op.branch
        most = 1
        seqs = op.feed.sequences
        for r in range(len(cache.behind[0])) if seqs is None else seqs:
            n = self._proposal(branch, r)
            for g, (m, given) in enumerate(_wants(layout, n)):
                held = min(self._held(cache, g, r, branch), m)
                most = max(most, cache.behind[g][r] + m - held + given)
        return most - 1

    def feed(self, op: Forward) -> Forward:
        """``op`` as a runtime without tokens runs it: the positions its cache
        lacks fed first (counted as run). A one-token pass catching up still
        samples one token, from its last position (``Head.tokens=1``)."""
        feed, head = op.feed, op.head
        if not feed.catch_up and type(op.emit) is not Sample:
            return op  # neither feeds nor samples for a cache the book counts
        extra = self.extra_positions(op)
        self.ran(op)
        if not extra:
            return op
        if op.n_tokens == 1 and head is not None:
            head = Head(head.kind, 1)
        return replace(op, n_tokens=op.n_tokens + extra, context=op.context - extra, head=head,
                       feed=Feed(feed.inputs, False, feed.sequences, feed.corrections))

    def ran(self, op: Forward) -> None:
        """Count a Forward the runtime ran: a catch-up feeds all its rows lacked
        (a tree's rows: the proposal they continue and their root or guess); a
        narrow sampling Forward extends its branch's proposal."""
        layout = self._tree(op)
        seqs = op.feed.sequences
        if op.feed.catch_up and not self.expected:
            self._caught_up(self._cache(op, create=True), layout, op.branch, seqs)
        if type(op.emit) is not Sample:
            return
        if layout is None:
            self._extend(op.branch, op.n_tokens, seqs)
        cache = self._cache(op)
        if cache is not None:
            cache.sampled += op.n_tokens

    def _extend(self, branch: int, tokens: int, rows: tuple[int, ...] | None) -> None:
        """``tokens`` more on each of ``rows``' proposals on ``branch`` (None: all)."""
        if rows is None:
            self._proposals[branch] = self._proposal(branch, 0) + tokens
            return
        seqs = max(len(self._accepted), max(rows) + 1)
        self._proposals[branch] = _Rows([self._proposal(branch, r) + tokens * (r in rows)
                                         for r in range(seqs)])

    def _caught_up(self, cache: _Cache, layout, branch: int,
                   rows: tuple[int, ...] | None = None) -> None:
        if rows is not None and layout is None:  # a rollout of some rows alone
            for behind in cache.behind:
                for r in rows:
                    behind[r] = 0
            # the rollout's rows hold their proposal as they sample it; the others none
            cache.held = [[None if r in rows else 0 for r in range(len(held))]
                          for held in cache.held]
            cache.sampled, cache.follows = 0, branch
            return
        seqs = range(len(cache.behind[0]))
        lengths = [self._proposal(layout.branch, r) for r in seqs] if layout else []
        for taken in self._proposals.values():  # a hit's tree stops growing here
            if isinstance(taken, _Taken) and taken.tree is cache and taken.grown is None:
                taken.grown = cache.sampled
        cache.behind = [[0] * len(seqs) for _ in cache.behind]
        cache.sampled = 0
        if layout is None:  # a rollout holds its proposal as it samples it
            cache.follows, cache.held = branch, [[None] * len(seqs) for _ in cache.held]
            return
        cache.follows, cache.layout, cache.continued = layout.branch, layout, lengths
        wants = [_wants(layout, n) for n in lengths]  # per row, per group
        cache.held = [[w[g][0] for w in wants] for g in range(len(cache.behind))]
        self._latest = cache

    def proposed(self, op: Delay) -> None:
        """A proposer outside the models put ``op.proposes`` tokens a row on
        speculation ``op.branch`` (``Delay.proposes``)."""
        if op.proposes:
            self._extend(op.branch, op.proposes, op.sequences)

    def settle(self, verdict: Verdict, branch: int) -> None:
        """Commit ``verdict`` on speculation ``branch``: a cache holding part of
        the proposal verified keeps the accepted tokens it holds; every other
        cache lacks all committed tokens. Every proposal is spent."""
        if not self.expected:
            committed = verdict.committed or [a + 1 for a in verdict.accepted]
            for cache in self._caches.values():
                for g, behind in enumerate(cache.behind):
                    for r, (a, c) in enumerate(zip(verdict.accepted, committed)):
                        behind[r] += int(c) - min(int(a), self._held(cache, g, r, branch))
                cache.follows = None
            self._accepted = verdict.accepted
        self._proposals = {}

    def observed(self, op: Outcome, answer) -> None:
        """An Outcome observing the latest tree (``OnTree``): a row that takes
        its hit has the tree's tokens as its next proposal on ``into``; a tree
        of one row per sequence then holds that row's committed tokens and all
        its proposal but the last token."""
        tree = self._latest
        if op.observes is None or tree is None or self.expected:
            return
        taken = answer if isinstance(answer, tuple) else (bool(answer),) * op.batch
        guessed = isinstance(tree.layout, Fanout)  # a hit on k >= n: the guess was sampled
        less = [None if not t else int(guessed and a >= n)
                for t, a, n in zip(taken, self._accepted, tree.continued)]
        self._proposals[op.observes.into] = _Taken(tree, less)
        if tree.layout.rows == 1:
            for r in (r for r, t in enumerate(taken) if t):
                tree.behind[0][r] = 0  # its root or guess was the bonus
            tree.follows, tree.held = op.observes.into, [[None] * len(taken)]
