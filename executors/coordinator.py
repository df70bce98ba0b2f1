"""The executor's interpretation of each operation: the second runtime.

``Coordinator`` turns a schedule's operations into device commands. It owns
the bookkeeping (``executors.book``): which tokens each Forward feeds, what
the draft proposed, what a Verify commits. Devices only compute. Each reply
becomes a measured span; each Verify a line of the acceptance trace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from executors.book import CacheBook, Sequences
from executors.device import FwdCmd, SleepCmd, VerifyCmd
from executors.loop import Loop, Pending
from policies.ops import (AllReduce, Delay, Forward, Outcome, StreamWeights, Transfer,
                          Verdict, Verify)


@dataclass(frozen=True)
class Handle:
    """What a Forward returns to the schedule: an opaque reference."""

    id: int


@dataclass
class HandleInfo:
    client: str
    model: str
    layers: tuple[int, int]
    start: list[int]
    n_fed: list[int]
    extras: list[tuple]  # per row: proposal tokens after the committed ones
    version: int
    branch: int
    at: set  # clients that hold its hidden states


@dataclass
class Placement:
    """Role -> client name (physical device) and role -> platform device name."""

    clients: dict[str, str]
    tracks: dict[str, str]

    def client(self, role: str) -> str:
        try:
            return self.clients[role]
        except KeyError:
            raise ValueError(f"the schedule uses device '{role}', which the placement does "
                             f"not map; add --placement {role}=DEVICE") from None


class Coordinator:
    def __init__(self, clients: dict, placement: Placement, seqs: Sequences,
                 n_layers: dict[str, int], *, temperature: float = 0.0, t0: float = 0.0,
                 observers: dict | None = None):
        self.clients, self.place, self.seqs = clients, placement, seqs
        self.n_layers = n_layers
        self.temperature = temperature
        self.t0 = t0
        self.books: dict[tuple[str, str], CacheBook] = {}
        self.handles: dict[int, HandleInfo] = {}
        self.spans: list[dict] = []
        self.acceptance: list[dict] = []
        self.observers = observers or {}
        self.steps = 0
        self._next_handle = 0
        self.handlers = {Forward: self.forward, Verify: self.verify, Delay: self.delay,
                         Transfer: self.transfer, Outcome: self.outcome,
                         AllReduce: self.allreduce, StreamWeights: self.stream}

    def run(self, schedule):
        return Loop(self.clients, self.handlers).run(schedule)

    def book(self, client: str, model: str) -> CacheBook:
        key = (client, model)
        if key not in self.books:
            self.books[key] = CacheBook(self.n_layers[model], self.seqs.batch)
        return self.books[key]

    # spans ---------------------------------------------------------------------
    def span(self, op, client: str, reply, kind: str, **extra) -> None:
        fields = {"type": type(op).__name__}
        for name in op.__slots__:
            value = getattr(op, name)
            if isinstance(value, (int, float, str, bool, type(None))):
                fields[name] = value
            elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
                fields[name] = list(value)
        fields.update(extra)
        role = getattr(op, "device", None) or getattr(op, "src", None) or ""
        self.spans.append({"op": fields, "device": self.place.tracks.get(role, role),
                           "physical": client, "name": getattr(op, "label", "") or
                           fields["type"], "kind": kind,
                           "start_s": reply[1] - self.t0, "end_s": reply[2] - self.t0})

    # Forward -------------------------------------------------------------------
    def forward(self, op: Forward) -> Pending:
        client = self.place.client(op.device)
        handle = self._next_handle
        self._next_handle += 1
        cmds, fed = [], None
        if op.inputs is not None:
            info = self.handles[op.inputs.id]
            if client not in info.at:
                cmds += self.move(info, op.inputs.id, client)
            fed = (info.start, info.n_fed, info.extras, info.version)
        cmd, info = self._forward_cmd(op, client, handle, fed)
        self.handles[handle] = info
        cmds.append((client, cmd))

        def finish(replies):
            result = replies[-1]
            self.span(op, client, result, "compute", n_fed=max(cmd.n_fed),
                      context_measured=max(cmd.start))
            self._emitted(op, result[0])
            return Handle(handle)

        return Pending(cmds, finish)

    def _forward_cmd(self, op: Forward, client: str, handle: int, fed):
        seqs, book = self.seqs, self.book(client, op.model)
        a, b = op.layers
        starts, n_fed, extras, tokens = [], [], [], []
        for r in range(seqs.batch):
            committed = seqs.committed[r]
            if fed is None:
                extra = seqs.proposal(op.branch).tokens[r]
                seq = committed + extra
                cap = len(seq) - 1 if op.emit in ("sample", "topk") else len(committed) - 1
                start = min(book.holds((a, b), r, committed, extra), cap)
                tokens.append(seq[start:])
            else:
                start, extra = fed[0][r], fed[2][r]
                if fed[3] != seqs.version:
                    raise RuntimeError("a Forward's inputs come from before the last Verify")
                if book.holds((a, b), r, committed, extra) < start:
                    raise RuntimeError(f"layers {a}..{b} of {op.model} lack positions before "
                                       f"{start}; feed them from layer 0 first")
            starts.append(start)
            n_fed.append(fed[1][r] if fed else len(committed) + len(extra) - start)
            extras.append(tuple(extra))
            book.wrote((a, b), r, len(committed), extra)
        width = max(n_fed)
        padded = [t + [t[-1]] * (width - len(t)) for t in tokens] if fed is None else None
        if op.emit in ("sample", "topk"):
            n_logits = tuple(1 for _ in n_fed)
        else:
            n_logits = tuple(min(n, len(e) + 1) for n, e in zip(n_fed, extras))
        cmd = FwdCmd(handle, op.model, (a, b), starts, n_fed, padded,
                     op.inputs.id if fed else None, op.head, op.emit, op.k, n_logits,
                     self.temperature)
        info = HandleInfo(client, op.model, (a, b), starts, n_fed, extras, seqs.version,
                          op.branch, {client})
        return cmd, info

    def _emitted(self, op: Forward, result: dict) -> None:
        if op.emit != "sample":
            return
        prop = self.seqs.proposal(op.branch)
        for r, tok in enumerate(result["tokens"]):
            prop.tokens[r].append(tok)
            prop.probs[r].append(result["probs"][r])
            prop.top[r].append(result["top"][r])

    def move(self, info: HandleInfo, handle: int, dst: str) -> list:
        """Commands that bring a handle's hidden states to ``dst``."""
        src = next(iter(info.at))
        info.at.add(dst)
        return self.clients[dst].fetch_commands(self.clients[src], src, handle)

    # Verify --------------------------------------------------------------------
    def verify(self, op: Verify) -> Pending:
        info = self.handles[op.target.id]
        prop = self.seqs.proposal(op.branch)
        gamma = [len(t) for t in prop.tokens]
        probs = prop.probs if self.temperature > 0 else None
        cmd = VerifyCmd(op.target.id, [list(t) for t in prop.tokens], probs,
                        self.temperature)

        def finish(replies):
            result, _, _ = reply = replies[0]
            self.span(op, info.client, reply, "compute")
            return self._commit(op, result, prop)

        return Pending([(info.client, cmd)], finish)

    def _commit(self, op: Verify, result: dict, prop) -> Verdict:
        seqs = self.seqs
        ranks = []
        for r, (k, bonus) in enumerate(zip(result["accepted"], result["bonus"])):
            new = prop.tokens[r][:k] + [bonus]
            old_len = len(seqs.committed[r])
            seqs.commit(r, new)
            for book in self.books.values():
                book.commit(r, old_len, new)
            top = prop.top[r][k] if k < len(prop.top[r]) else None
            ranks.append(top.index(bonus) if top and bonus in top else None)
        seqs.close_step()
        self.steps += 1
        line = {"accepted": list(result["accepted"]), "gamma": op.gamma,
                "proposed": [len(t) for t in prop.tokens], "bonus_rank": ranks,
                "margin": result["margin"], "branch": op.branch}
        self.acceptance.append(line)
        return Verdict(tuple(result["accepted"]), {"bonus": result["bonus"],
                                                    "bonus_rank": ranks})

    # the rest --------------------------------------------------------------------
    def delay(self, op: Delay) -> Pending:
        if op.device is None:
            start = time.perf_counter()
            time.sleep(op.seconds)
            return Pending([], lambda _r: self.span(op, "host", (None, start,
                                                                 time.perf_counter()),
                                                    "delay"))
        client = self.place.client(op.device)
        return Pending([(client, SleepCmd(op.seconds))],
                       lambda r: self.span(op, client, r[0], "delay"))

    def outcome(self, op: Outcome) -> Pending:
        observe = self.observers.get(op.event)
        if observe is None:
            raise ValueError(f"the executor cannot observe event '{op.event}' yet; it "
                             f"observes {', '.join(sorted(self.observers)) or 'none'}")
        held = bool(observe(self, op))
        self.acceptance.append({"event": op.event, "held": held})
        return Pending([], lambda _r: held)

    def transfer(self, op: Transfer) -> Pending:
        src, dst = self.place.client(op.src), self.place.client(op.dst)
        if isinstance(op.payload, Handle):
            info = self.handles[op.payload.id]
            cmds = [] if dst in info.at else self.move(info, op.payload.id, dst)
        else:
            cmds = self.clients[dst].message_commands(self.clients[src], src, op.nbytes)
        return Pending(cmds, lambda r: (self.span(op, src, _hull(r), "transfer")
                                        if r else None) or op.payload)

    def allreduce(self, op: AllReduce) -> Pending:
        raise ValueError("the executor does not run tensor-parallel groups yet; place "
                         f"'{op.group}' on a single device with --placement")

    def stream(self, op: StreamWeights) -> Pending:
        raise ValueError("the executor does not stream weights from disk yet")


def _hull(replies):
    return (None, min(r[1] for r in replies), max(r[2] for r in replies))
