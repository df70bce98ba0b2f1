"""The executor's interpretation of each operation: the second runtime.

``Coordinator`` turns a schedule's operations into device commands. It owns
the bookkeeping (``executors.coordinate.book``): which tokens each Forward feeds, what
the draft proposed, what a Verify commits, which speculation a hit selects.
Devices only compute. Each reply becomes a measured span; each Verify and
Outcome a line of the acceptance trace. The operations that only move bytes or
wait (Transfer, AllReduce, StreamWeights, Delay) are ``executors.coordinate.traffic``.

Everything it needs to know of a schedule's layout comes from the operations'
own fields (``policies.ops``): a Forward's ``branch`` and ``tree`` (``Roots``
and ``Fanout``: ``executors.coordinate.trees``; ``Children``: ``executors.coordinate.tokentree``),
``corrections`` (``executors.coordinate.branches``), ``top_k`` and ``alternatives``; an
Outcome's ``observes``, looked up by its type in ``observers``. One timing
choice is the executor's own: the install of a hit's speculation waits while
the tree's own Forwards still grow it (a hit seen after the first
pre-speculation step takes the tokens of all K).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from executors.coordinate import branches, lookup, tokentree, traffic
from executors.coordinate.book import CacheBook, Proposal, Sequences
from executors.backend.device import RegroupCmd, SleepCmd, VerifyCmd
from executors.backend.tensor import SEP
from executors.coordinate.trees import Wait, start_tree
from executors.coordinate.feeds import (Handle, HandleInfo, hidden_command, hidden_inputs,
                                        multi_token, token_command)
from executors.coordinate.loop import Loop, Pending
from executors.passes import sampled_steps
from policies.cachebook import PositionBook
from policies.runs.measured import MeasuredSpan, op_fields
from policies.traces import EventLine, VerifyLine
from policies.ops import (ALTERNATIVES, Fanout, Forward, Lookup, Outcome, Roots, Sample,
                          TopK, Verdict, Verify)


@dataclass
class Placement:
    """Role -> client name (physical device) and role -> platform device name."""

    clients: dict[str, str]
    tracks: dict[str, str]
    storage: dict[str, str] = field(default_factory=dict)  # role -> its storage tier

    def client(self, role: str) -> str:
        try:
            return self.clients[role]
        except KeyError:
            raise ValueError(f"the schedule uses device '{role}', which the placement does "
                             f"not map; add --placement {role}=DEVICE") from None


class Coordinator:
    def __init__(self, clients: dict, placement: Placement, seqs: Sequences,
                 n_layers: dict[str, int], *, temperature: float = 0.0, t0: float = 0.0,
                 observers: dict | None = None, adapters: tuple[int, ...] = (),
                 ahead: dict[str, dict[int, int]] | None = None):
        self.clients, self.place, self.seqs = clients, placement, seqs
        self.n_layers = n_layers
        self.temperature = temperature
        self.t0 = t0
        self.adapters = tuple(adapters)  # layers after which the draft artifact has an exit
        self.ahead = ahead or {}  # per model, exit layer -> its multi-token heads
        self.books: dict[tuple[str, str, int], CacheBook] = {}
        # the simulator's count of catch-up positions, kept beside the real one
        # so each span records what the simulator would cost (``caught_up``)
        self.positions = PositionBook()
        self.handles: dict[int, HandleInfo] = {}
        self.spans: list[MeasuredSpan] = []
        self.acceptance: list[dict] = []
        self.observers = observers or {}
        self.steps = 0
        self.install: tuple | None = None  # (branch, per row: the hit's speculation)
        self.latest_tree = None
        self.candidates: list = []  # per row: the speculation its last Outcome found
        self.last_topk: HandleInfo | None = None  # early-exit candidates since the Verify
        self.verifier = None  # (HandleInfo, top-k per position): candidates for corrections
        self.cycle: branches.Cycle | None = None  # correction branches awaiting the Verify
        self._next_handle = 0
        self.handlers = {Forward: self.forward, Verify: self.verify, Outcome: self.outcome,
                         Lookup: partial(lookup.lookup, self), **traffic.handlers(self)}

    def run(self, schedule):
        self.loop = Loop(self.clients, self.handlers)
        return self.loop.run(schedule)

    def drain(self) -> None:
        """Let work the schedule never joined finish (after the clock stopped)."""
        self.loop.drain()

    def regroup(self, keep: list[int], prompts: list[list[int]]) -> list:
        """Between runs of the schedule: sequences ``keep`` stay (in that order), one
        joins per prompt (its caches empty until a prefill); the device commands that
        do the same to every device's caches."""
        self.seqs.regroup(keep, prompts)
        for (_client, _model, width), book in self.books.items():
            book.regroup(keep, len(prompts), width)
        self.positions = PositionBook()
        self.handles.clear()
        self.install, self.latest_tree, self.candidates = None, None, []
        self.last_topk = self.verifier = self.cycle = None
        return [(name, RegroupCmd(list(keep), len(prompts))) for name in sorted(self.clients)
                if SEP not in name]  # each physical device once (a group fans out)

    def book(self, client: str, model: str, width: int = 1) -> CacheBook:
        key = (client, model, width)
        if key not in self.books:
            self.books[key] = CacheBook(self.n_layers[model], self.seqs.batch * width)
        return self.books[key]

    def new_handle(self) -> int:
        self._next_handle += 1
        return self._next_handle

    # spans ---------------------------------------------------------------------
    def span(self, op, role: str, client: str, reply, kind: str, *, track: str | None = None,
             **extra) -> None:
        """The measured span of ``op`` on ``role``'s track (or ``track``); ``extra``:
        what the executor counted for it."""
        self.spans.append(MeasuredSpan(op_fields(op, **extra),
                                       track or self.place.tracks.get(role, role), client, kind,
                                       getattr(op, "label", "") or type(op).__name__,
                                       reply[1] - self.t0, reply[2] - self.t0))

    def collective_spans(self, role: str, client: str, result, name: str,
                         inside: str | None = None) -> None:
        """The lead member's timed all-reduces, one span each (an AllReduce of count
        1 in the role's group; ``inside``: the operation whose span contains it)."""
        group = self.place.tracks.get(role, role)
        for start, end, nbytes in (result or {}).get("collectives", ()):
            op = {"type": "AllReduce", "group": group, "nbytes": nbytes, "count": 1,
                  "label": name, **({"inside": inside} if inside else {})}
            self.spans.append(MeasuredSpan(op, group, client, "collective", name,
                                           start - self.t0, end - self.t0))

    # Forward -------------------------------------------------------------------
    def forward(self, op: Forward) -> Pending:
        if op.head is not None and op.head.kind == "exit_layer" \
                and op.layers[1] not in self.adapters:
            trained = ", ".join(map(str, self.adapters)) or "none"
            raise ValueError(f"'{op.label}' needs a trained adapter after layer "
                             f"{op.layers[1]}, but the draft artifact has adapters at: "
                             f"{trained}; choose that exit layer, use the norm head "
                             "(exit_head=norm / adapter=norm), or train it with 'hetspec "
                             "train-draft --adapters'")
        sampled = type(op.emit) is Sample
        wide = sampled and isinstance(op.tree, (Roots, Fanout))
        if not self._grows_tree(op, wide):  # a growing tree's rows may be what a hit took
            self._materialise()
        client = self.place.client(op.device)
        width = self._width(op)
        handle = self.new_handle()
        infos = hidden_inputs(op, self.handles)
        caught = self.positions.extra_positions(op)
        self.positions.ran(op)
        extra = {"temperature": self.temperature, "width": width,
                 "steps": sampled_steps(op.n_tokens, op.emit and op.emit.name,
                                        op.head and op.head.tokens),
                 "top": op.emit.alternatives if sampled else ALTERNATIVES,
                 "ahead": multi_token(op, self.ahead.get(op.model, {}), self.adapters,
                                      self.handles)}
        book = self.book(client, op.model, width)
        cmds = []
        if infos is not None:
            for info in infos:
                cmds += traffic.move(self, info, client)
            cmd, fed = hidden_command(op, handle, book, infos, self._lens(width), **extra)
        elif tokentree.expands(self, op):
            cmd, fed = tokentree.expand_command(self, op, handle, client, **extra)
        else:
            seqs, extra["pick"] = self._sequences(op, width, wide, client)
            extras = branches.take(self, op, width, wide) or tokentree.scoring(self, op)
            cmd, fed = token_command(op, handle, book, seqs, self._lens(width, wide), extras,
                                     **extra)
        branches.note_pass(self, client, op.model, width, op.layers, fed)
        tokentree.note_pass(self, op, client, width, fed)
        info = HandleInfo(handle, client, op.device, op.model, width, op.layers,
                          at={client}, head=cmd.head, emit=cmd.emit, branch=op.branch,
                          wide=wide, **fed)
        self.handles[handle] = info

        def finish(replies):
            reply = replies[-1]
            self.span(op, op.device, client, reply, "compute", n_fed=max(cmd.n_fed),
                      context_measured=max(cmd.start), rows=len(cmd.start),
                      **({"caught_up": caught} if op.feed.catch_up else {}),
                      **({"multi_token": cmd.ahead} if cmd.ahead else {}))
            self.collective_spans(op.device, client, reply[0], f"{op.label or 'forward'} "
                                  "all-reduce", inside="Forward")
            self._emitted(op, info, book, reply[0])
            return Handle(handle)

        return Pending(cmds + [(client, cmd)], finish)

    def _grows_tree(self, op: Forward, wide: bool) -> bool:
        """Whether ``op`` extends the speculation tree its inputs Forward grew."""
        inputs = op.feed.inputs
        prior = self.handles.get(inputs.id) if isinstance(inputs, Handle) else None
        return wide and prior is not None and prior.wide and prior.branch == op.branch

    def _width(self, op: Forward) -> int:
        if op.feed.sequences is not None:
            return self._rows_width(op)
        if op.batch % self.seqs.batch:
            raise ValueError(f"Forward '{op.label}' has batch {op.batch}, not a multiple of "
                             f"the run's {self.seqs.batch} sequences")
        return op.batch // self.seqs.batch

    def _rows_width(self, op: Forward) -> int:
        """A Forward for some sequences alone (``Feed.sequences``) is narrow."""
        rows, n = op.feed.sequences, self.seqs.batch
        distinct = len(set(rows)) == len(rows) == op.batch
        if op.tree is not None or not distinct or not all(0 <= r < n for r in rows):
            raise ValueError(f"Forward '{op.label}' runs for sequences {list(rows)} with "
                             f"batch {op.batch}: rows must name batch distinct sequences "
                             f"among the run's {n}, without a tree")
        return 1

    def _lens(self, width: int, wide: bool = False) -> list[int | None]:
        if wide or width != 1:
            return [None] * (self.seqs.batch * width)
        return [len(c) for c in self.seqs.committed]

    def _sequences(self, op: Forward, width: int, wide: bool, client: str):
        """(sequence per row, per-row pick of a ranked token or None)."""
        seqs = self.seqs
        if not wide:
            if width != 1:
                raise ValueError(f"Forward '{op.label}' runs {op.batch} rows but only a "
                                 "sampling Forward with a tree layout may widen the batch")
            chosen = op.feed.sequences
            rows = range(seqs.batch) if chosen is None else set(chosen)
            # a sequence outside ``rows`` rides along on its committed tokens (the
            # device's batched cache has a row per sequence); its sample is dropped
            return [tuple(seqs.seq(r, op.branch) if r in rows else seqs.committed[r])
                    for r in range(seqs.batch)], None
        pick = None
        prior = self.handles.get(op.feed.inputs.id) if op.feed.inputs is not None else None
        if not self._grows_tree(op, wide):
            tree, pick = start_tree(self, op, width, prior, client)
            seqs.wide[op.branch] = tree
        tree = seqs.wide[op.branch]
        return [tuple(tree.seq(j)) for j in range(seqs.batch * width)], pick

    def _emitted(self, op: Forward, info: HandleInfo, book: CacheBook, result: dict) -> None:
        if type(op.emit) is TopK:
            info.topk = result["topk"]
            if tokentree.emitted(self, op, result):
                return
            branches.note_verifier(self, op, info, result)
            if not info.wide and info.width == 1:
                self.last_topk = info
        if type(op.emit) is not Sample:
            return
        if info.wide:
            tree = self.seqs.wide[op.branch]
            prop, tree.ready = tree.proposal, True
        else:
            prop = self.seqs.proposal(op.branch)
        for r, toks in enumerate(result["tokens"]):
            if op.feed.sequences is not None and r not in op.feed.sequences:
                continue  # a sequence this Forward does not speculate for
            if not info.wide and self._moved_on(info.seqs[r], r, op.branch):
                continue  # a Verify changed the row while this draft was in flight
            for tok, prob, top in zip(toks, result["probs"][r], result["top"][r]):
                prop.append(r, tok, prob, top)
            if len(toks) > 1 and not result.get("ahead"):  # stepped: fed all but the last
                seq = info.seqs[r] + tuple(toks[:-1])
                book.wrote(op.layers, r, seq, len(seq))

    def _moved_on(self, fed: tuple, row: int, branch: int) -> bool:
        """Whether ``row``'s sequence is no longer ``fed``, the one a draft was
        computed from: a Verify that landed first rejected a token of it, or
        committed its own token after it (PPSD verifies the token ahead while the
        exit head drafts). The draft's tokens follow a sequence that is gone."""
        return tuple(self.seqs.seq(row, branch)) != tuple(fed)

    def _materialise(self) -> None:
        """Make the speculation a hit selected the narrow proposal of its branch."""
        if self.install is None:
            return
        branch, rows = self.install
        prop = Proposal.empty(self.seqs.batch)
        for r, found in enumerate(rows):
            if found is None:  # this row has no proposal: an AR step for it
                continue
            tree, j, offset = found
            src = tree.proposal
            prop.tokens[r] = src.tokens[j][offset:]
            prop.probs[r] = src.probs[j][offset:]
            prop.top[r] = src.top[j][offset:]
        self.seqs.proposals[branch] = prop
        self.install = None

    # Verify --------------------------------------------------------------------
    def verify(self, op: Verify) -> Pending:
        self._materialise()
        info = self.handles[op.target.id]
        tree = self.seqs.trees.get(op.branch)
        if tree is not None and tree.scored is not None:
            return tokentree.verify(self, op, info)
        prop = self.seqs.proposal(op.branch)
        gamma = [len(t) if op.bonus else min(op.gamma, len(t)) for t in prop.tokens]
        if op.row_gamma is not None:  # rows verify proposals of their own lengths
            gamma = [min(g, rg) for g, rg in zip(gamma, op.row_gamma)]
        offsets = [len(c) - 1 - s for c, s in zip(self.seqs.committed, info.logit_start)]
        cmd = VerifyCmd(op.target.id, [t[:g] for t, g in zip(prop.tokens, gamma)],
                        [p[:g] for p, g in zip(prop.probs, gamma)]
                        if self.temperature > 0 else None,
                        self.temperature, offsets, op.bonus, branches.for_verify(self, info))

        def finish(replies):
            result, _, _ = reply = replies[0]
            self.span(op, info.role, info.client, reply, "compute")
            verdict = self._commit(op, result, prop, gamma)
            moves = branches.compaction(self, result.get("via") or [None] * len(gamma))
            return Pending(moves, lambda _r: verdict) if moves else verdict

        return Pending([(info.client, cmd)], finish)

    def _commit(self, op: Verify, result: dict, prop: Proposal, gamma: list[int],
                nodes: list[int] | None = None) -> Verdict:
        seqs, ranks, committed, taken = self.seqs, [], [], []
        via = result.get("via") or [None] * len(result["accepted"])
        for r, (k, tok) in enumerate(zip(result["accepted"], result["bonus"])):
            branch = [] if via[r] is None else [via[r]]  # a correction the target chose
            new = prop.tokens[r][:k] + branch + ([tok] if tok is not None else [])
            seqs.committed[r].extend(new)
            committed.append(len(new))
            taken.append(k + len(branch))
            top = prop.top[r][k] if k < len(prop.top[r]) and not branch else None
            ranks.append(top.index(tok) if top and tok in top else None)
        matched = all(k == g for k, g in zip(result["accepted"], gamma))
        if op.bonus or not matched:
            seqs.proposals = {}
        else:  # pipelined verification: every row matched, the tokens behind fly on
            for r, g in enumerate(gamma):
                prop.drop_front(r, g)
            seqs.proposals = {op.branch: prop}
        self.steps += 1
        line = {"accepted": taken, "gamma": op.gamma, "proposed": gamma,
                "committed": committed, "bonus_rank": ranks, "margin": result["margin"],
                "branch": op.branch}
        if self.cycle is not None:  # correction branches rode along: which rows took one
            line["correction"] = [v is not None for v in via]
        if self.last_topk is not None:  # this step's early exit named candidates
            line["topk_hit"] = [k == g and tok in top for k, g, tok, top in zip(
                result["accepted"], gamma, result["bonus"], self.last_topk.topk)]
            self.last_topk = None
        if nodes is not None:  # a token tree: the nodes each row scored
            line["nodes"] = nodes
        self.acceptance.append(VerifyLine(**line).line())
        verdict = Verdict(tuple(taken), None if op.bonus else tuple(committed))
        self.positions.settle(verdict, op.branch)
        return verdict

    # Outcome -------------------------------------------------------------------
    def outcome(self, op: Outcome) -> Pending:
        observe = self.observers.get(type(op.observes))
        if observe is None:
            known = ", ".join(sorted(kind.__name__ for kind in self.observers)) or "none"
            raise ValueError(f"the executor cannot observe event '{op.event}' (Outcome."
                             f"observes={type(op.observes).__name__}); it observes {known}")

        def decide(_replies=None):
            rows = observe(self, op)
            if isinstance(rows, Wait):  # the draft still owes the replies that decide
                return Pending([(rows.client, SleepCmd(0.0))], decide)
            rows = tuple(bool(h) for h in rows)
            self.acceptance.append(EventLine(event=op.event, held=list(rows)).line())
            taken = rows if op.per_row else (all(rows),) * len(rows)
            self.positions.observed(op, taken)
            if any(taken):  # the rows that take their hit get its speculation next
                self.install = (op.observes.into, [c if t else None
                                                   for c, t in zip(self.candidates, taken)])
            return rows if op.per_row else all(rows)

        return Pending([], decide)
