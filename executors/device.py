"""One physical device's side of the executor: weights, KV caches, commands.

A ``LocalDevice`` holds the layer stacks of the models placed on it, one KV
cache per model, and the results of its Forwards by handle id. It executes
small picklable commands; the coordinator decides *which* positions to feed
(see ``executors.book``), the device only computes. The same object serves
in-process and inside a worker process (``executors.workers``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from executors.book import common_prefix
from executors.layers import Positions, Stack

KEEP_HANDLES = 64


@dataclass
class FwdCmd:
    """Run ``layers`` of ``model`` on new positions, then maybe a head."""

    handle: int
    model: str
    layers: tuple[int, int]
    start: list[int]
    n_fed: list[int]
    tokens: list[list[int]] | None = None  # per row, padded to max(n_fed)
    inputs: int | None = None  # handle whose hidden states feed these layers
    head: str | None = None
    emit: str | None = None
    k: int = 1
    n_logits: tuple[int, ...] = ()  # per row: logits for its last n fed positions
    temperature: float = 0.0
    top: int = 8  # draft candidates reported with each sampled token
    tree: object = None  # [B, n, n] bool: new token i may see new token j


@dataclass
class VerifyCmd:
    """Accept the longest agreeing prefix of each row's proposal, plus a bonus."""

    handle: int
    proposals: list[list[int]]
    probs: list[list[object]] | None = None
    temperature: float = 0.0


@dataclass
class SleepCmd:
    seconds: float


@dataclass
class ResetCmd:
    """Fresh caches for a new batch; reseed sampling so runs repeat exactly."""

    batch: int
    seed: int = 0


class LocalDevice:
    """Executes commands against the stacks placed on one device."""

    def __init__(self, name: str, stacks: dict[str, Stack], seed: int = 0):
        self.name = name
        self.stacks = stacks
        self.caches: dict[str, object] = {}
        self.store: OrderedDict[int, dict] = OrderedDict()
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = 1

    def execute(self, cmd):
        """Run one command; returns (result, start perf_counter, end perf_counter)."""
        start = time.perf_counter()
        fn = getattr(self, "_" + type(cmd).__name__)
        result = fn(cmd)
        return result, start, time.perf_counter()

    # commands -----------------------------------------------------------------
    def _ResetCmd(self, cmd: ResetCmd):
        self.batch = cmd.batch
        self.gen.manual_seed(cmd.seed)
        self.caches = {m: s.new_cache(cmd.batch) for m, s in self.stacks.items()}
        self.store.clear()

    def _SleepCmd(self, cmd: SleepCmd):
        time.sleep(cmd.seconds)

    def _FwdCmd(self, cmd: FwdCmd):
        stack = self.stacks[cmd.model]
        at = Positions(cmd.start, cmd.n_fed, cmd.tree)
        if cmd.inputs is None:
            hidden = stack.run(self.caches[cmd.model], cmd.layers, at,
                               tokens=torch.tensor(cmd.tokens))
        else:
            hidden = stack.run(self.caches[cmd.model], cmd.layers, at,
                               hidden=self.hidden(cmd.inputs))
        entry = {"hidden": hidden}
        out = {}
        if cmd.head is not None:
            entry["logits"] = logits = self._logits(stack, hidden, cmd)
            if cmd.emit == "sample":
                out = self._sample(logits, cmd)
            elif cmd.emit == "topk":
                out = {"topk": [torch.topk(lg[-1], cmd.k).indices.tolist() for lg in logits]}
        self.keep(cmd.handle, entry)
        return out

    def _VerifyCmd(self, cmd: VerifyCmd):
        logits = self.store[cmd.handle]["logits"]
        accepted, bonus, margin = [], [], []
        for b, proposal in enumerate(cmd.proposals):
            g = len(proposal)
            lg = logits[b][-(g + 1):]
            if lg.shape[0] < g + 1:
                raise RuntimeError(f"verify needs {g + 1} target positions, has {lg.shape[0]}")
            probs = cmd.probs[b] if cmd.probs else None
            k, tok = self._accept(lg, proposal, probs, cmd.temperature)
            top2 = torch.topk(lg[k], 2).values
            accepted.append(k)
            bonus.append(tok)
            margin.append(float(top2[0] - top2[1]))
        return {"accepted": accepted, "bonus": bonus, "margin": margin}

    # helpers ------------------------------------------------------------------
    def keep(self, handle: int, entry: dict) -> None:
        self.store[handle] = entry
        while len(self.store) > KEEP_HANDLES:
            self.store.popitem(last=False)

    def hidden(self, handle: int) -> torch.Tensor:
        try:
            return self.store[handle]["hidden"]
        except KeyError:
            raise RuntimeError(f"device {self.name} holds no hidden states for handle "
                               f"{handle}") from None

    @staticmethod
    def _logits(stack: Stack, hidden, cmd: FwdCmd) -> list[torch.Tensor]:
        want = cmd.n_logits or tuple(1 for _ in cmd.n_fed)
        if len(set(want)) == 1 and len(set(cmd.n_fed)) == 1:
            n, m = cmd.n_fed[0], want[0]
            return list(stack.head(hidden[:, n - m:n]))
        return [stack.head(hidden[b, n - m:n]) for b, (n, m) in
                enumerate(zip(cmd.n_fed, want))]

    def _sample(self, logits, cmd: FwdCmd) -> dict:
        tokens, probs, top = [], [], []
        for lg in logits:
            last = lg[-1]
            if cmd.temperature > 0:
                p = torch.softmax(last / cmd.temperature, -1)
                tokens.append(int(torch.multinomial(p, 1, generator=self.gen)))
                probs.append(p.cpu().numpy())  # plain pickle across processes
            else:
                tokens.append(int(last.argmax()))
                probs.append(None)
            top.append(torch.topk(last, cmd.top).indices.tolist())
        return {"tokens": tokens, "probs": probs, "top": top}

    def _accept(self, lg, proposal, draft_probs, temperature):
        """Greedy: longest prefix equal to the target's argmax. Otherwise
        rejection sampling, which leaves the target's distribution unchanged."""
        if temperature <= 0:
            pred = lg.argmax(-1).tolist()
            k = common_prefix(pred, proposal)
            return k, pred[k]
        p = torch.softmax(lg / temperature, -1)
        for i, x in enumerate(proposal):
            q = torch.as_tensor(draft_probs[i], device=p.device)
            u = float(torch.rand((), generator=self.gen))
            if u * float(q[x]) < float(p[i, x]):
                continue
            residual = torch.clamp(p[i] - q, min=0)
            total = float(residual.sum())
            dist = residual / total if total > 0 else p[i]
            return i, int(torch.multinomial(dist, 1, generator=self.gen))
        g = len(proposal)
        return g, int(torch.multinomial(p[g], 1, generator=self.gen))

