"""One physical device's side of the executor: weights, KV caches, commands.

A ``LocalDevice`` holds the layer stacks of the models placed on it, KV caches
per (model, row width), and the results of its Forwards by handle id. It
executes small picklable commands; the coordinator decides *which* positions
to feed (see ``executors.coordinate.book``), the device only computes. The same object
serves in-process and inside a worker process (``executors.backend.workerproc``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from executors.backend import streaming
from executors.coordinate.book import common_prefix
from executors.backend.layers import Positions, Stack
from executors.backend.streaming import StreamCmd, StreamSetupCmd
from executors.backend.tensor import (AllReduceCmd, WeightsCmd, layer_weight_bytes,
                              resident_weight_bytes)

KEEP_HANDLES = 256


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
    top_k: int = 1  # emit="topk": candidates per projected position
    n_logits: tuple[int, ...] = ()  # per row: logits for its last n fed positions
    temperature: float = 0.0
    top: int = 8  # draft candidates reported with each sampled token
    tree: object = None  # [B, n, n] bool: new token i may see new token j
    steps: int = 1  # emit="sample": tokens to emit, each fed back for the next
    ahead: int = 0  # emit="sample", when > 0: this many tokens from one pass, the ones
    # after the first from multi-token heads (draft artifact ``ahead.E.j``), none fed back
    pick: list[int] | None = None  # per row: emit the draft's rank-i token (-1: sample)
    width: int = 1  # rows = batch * width (speculation trees)
    branches: list | None = None  # per row: (i, rope, limit) branch tokens (layers.Positions)
    rows: tuple[int, int] | None = None  # only cache rows a..b (rows that just joined)


@dataclass
class VerifyCmd:
    """Accept the longest agreeing prefix of each row's proposal, plus a bonus
    token (``bonus``) or, without one, the target's correction where a row
    rejected. ``offsets[r]``: the row's first logits position to use."""

    handle: int
    proposals: list[list[int]]
    probs: list[list[object]] | None = None
    temperature: float = 0.0
    offsets: list[int] | None = None
    bonus: bool = True
    branches: list | None = None  # per row: (i, token, logits row) correction siblings
    tree: list | None = None  # per row: (token, parent or -1) per token-tree node


@dataclass
class CompactCmd:
    """After a commit: copy each accepted branch token's keys and values from its
    slot to its place on the committed path, in every layer of ``ranges``."""

    model: str
    width: int
    ranges: list[tuple[int, int]]
    moves: list[tuple[int, int, int]]  # (row, from slot, to slot)


@dataclass
class SleepCmd:
    seconds: float


@dataclass
class ResetCmd:
    """Fresh caches for a new batch; reseed sampling so runs repeat exactly."""

    batch: int
    seed: int = 0


@dataclass
class RegroupCmd:
    """Between schedule runs: every cache keeps rows ``keep`` per row group of its
    width (old sequence indices, in their new order), then gains ``add`` empty
    sequences; the stored results of earlier Forwards, sized for the old rows, go."""

    keep: list[int]
    add: int


class LocalDevice:
    """Executes commands against the stacks placed on one device."""

    def __init__(self, name: str, stacks: dict[str, Stack], seed: int = 0):
        self.name = name
        self.stacks = stacks
        self.caches: dict[tuple[str, int], object] = {}
        self.store: OrderedDict[int, dict] = OrderedDict()
        self.gen = torch.Generator().manual_seed(seed)  # sampling runs on the CPU
        self.batch = 1
        self.where = name if name.startswith("cuda:") else "cpu"
        self.collectives = None  # executors.backend.tensor.Collectives in a group's worker
        self.arriving: dict[int, threading.Event] = {}  # handles a receive will bring
        self._commands = {ResetCmd: self._reset, SleepCmd: self._sleep,
                          StreamSetupCmd: self._stream_setup, StreamCmd: self._stream,
                          FwdCmd: self._forward, WeightsCmd: self._weights,
                          AllReduceCmd: self._allreduce, VerifyCmd: self._verify,
                          CompactCmd: self._compact, RegroupCmd: self._regroup}

    def execute(self, cmd):
        """Run one command; returns (result, start perf_counter, end perf_counter).
        A Forward whose input states are still arriving starts once they are here."""
        inputs = getattr(cmd, "inputs", None)
        if inputs is not None:
            self.hidden(inputs)
        run = self._commands.get(type(cmd))
        if run is None:
            raise TypeError(f"device {self.name} cannot run {type(cmd).__name__}")
        start = time.perf_counter()
        result = run(cmd)
        return result, start, time.perf_counter()

    def cache(self, model: str, width: int):
        key = (model, width)
        if key not in self.caches:
            self.caches[key] = self.stacks[model].new_cache(self.batch * width)
        return self.caches[key]

    # commands -----------------------------------------------------------------
    def _reset(self, cmd: ResetCmd):
        self.batch = cmd.batch
        self.gen.manual_seed(cmd.seed)
        self.caches.clear()
        self.store.clear()

    def _regroup(self, cmd: RegroupCmd):
        self.batch = len(cmd.keep) + cmd.add
        for (_model, width), cache in self.caches.items():
            rows = [s * width + j for s in cmd.keep for j in range(width)]
            cache.regroup(rows, cmd.add * width)
        self.store.clear()

    def _sleep(self, cmd: SleepCmd):
        time.sleep(cmd.seconds)

    def _stream_setup(self, cmd: StreamSetupCmd):
        streaming.setup(self, cmd)

    def _stream(self, cmd: StreamCmd):
        return streaming.stream(self, cmd)

    def _forward(self, cmd: FwdCmd):
        streaming.check(self, cmd.model, cmd.layers)
        stack, cache = self.stacks[cmd.model], self.cache(cmd.model, cmd.width)
        if cmd.rows is not None:
            cache = cache.rows(*cmd.rows)
        at = Positions(cmd.start, cmd.n_fed, cmd.tree, self.where, cmd.branches)
        if cmd.inputs is None:
            hidden = stack.run(cache, cmd.layers, at,
                               tokens=torch.tensor(cmd.tokens, device=self.where))
        else:
            hidden = stack.run(cache, cmd.layers, at, hidden=self.hidden(cmd.inputs))
        entry = {"hidden": hidden, "n_fed": cmd.n_fed}
        out = {}
        if cmd.head is not None:
            feats = stack.pre_head(cmd.head, cmd.layers[1], hidden, cache, at)
            entry["logits"] = logits = self._logits(stack, feats, cmd)
            if cmd.emit == "sample" and cmd.ahead:
                out = self._emit_ahead(stack, cmd, feats, logits)
            elif cmd.emit == "sample":
                out = self._emit(stack, cache, cmd, logits)
            elif cmd.emit == "topk":
                ranked = [torch.topk(lg, cmd.top_k).indices for lg in logits]
                out = {"topk": [r[-1].tolist() for r in ranked],
                       # the candidates' probabilities: a draft's confidence in each
                       "topk_p": [torch.softmax(lg, -1).gather(-1, r).tolist()
                                  for lg, r in zip(logits, ranked)]}
                if any(lg.shape[0] > 1 for lg in logits):  # a verifier over several positions
                    out["topk_all"] = [r.tolist() for r in ranked]
        self.keep(cmd.handle, entry)
        if self.collectives is not None and self.collectives.timings:
            out["collectives"] = self.collectives.take()  # (start, end, bytes) each
        return out

    def _weights(self, cmd: WeightsCmd):
        return {role: (layer_weight_bytes(stack), resident_weight_bytes(stack))
                for role, stack in self.stacks.items()}

    def _allreduce(self, cmd: AllReduceCmd):
        return {"collectives": self.collectives.allreduce(cmd, self.where)}

    def _verify(self, cmd: VerifyCmd):
        logits = self.store[cmd.handle]["logits"]
        if cmd.tree is not None:
            return self._walk_trees(cmd, logits)
        accepted, tokens, margin, via = [], [], [], []
        for b, proposal in enumerate(cmd.proposals):
            g = len(proposal)
            need = g + 1 if cmd.bonus else max(g, 1)
            offset = cmd.offsets[b] if cmd.offsets else logits[b].shape[0] - need
            lg = logits[b][offset:offset + need]
            if offset < 0 or lg.shape[0] < need:
                raise RuntimeError(f"verify needs {need} target positions from {offset}; "
                                   f"the target pass has {logits[b].shape[0]}")
            probs = cmd.probs[b] if cmd.probs else None
            k, tok = self._accept(lg, proposal, probs, cmd.temperature, cmd.bonus)
            taken = None
            for i, branch_tok, row in (cmd.branches[b] if cmd.branches else ()):
                if i == k < len(proposal) and branch_tok == tok:  # the target's own token
                    taken, tok = branch_tok, int(logits[b][row].argmax())
                    break
            via.append(taken)
            top2 = torch.topk(lg[min(k, need - 1)], 2).values
            accepted.append(k)
            tokens.append(tok)
            margin.append(float(top2[0] - top2[1]))
        return {"accepted": accepted, "bonus": tokens, "margin": margin, "via": via}

    def _walk_trees(self, cmd: VerifyCmd, logits) -> dict:
        """Per row, follow the target's own token down a token tree from the root
        (logits row ``offset``; node j's at ``offset + 1 + j``) while it is a child;
        the path is accepted and the token where it leaves the tree is the bonus.
        At temperature > 0 the token is sampled at each node: the draft's children
        are fixed, so the committed tokens follow the target's distribution."""
        accepted, tokens, margin, paths = [], [], [], []
        for b, nodes in enumerate(cmd.tree):
            off, lg = cmd.offsets[b], logits[b]
            if off < 0 or lg.shape[0] < off + 1 + len(nodes):
                raise RuntimeError(f"a tree of {len(nodes)} nodes needs {len(nodes) + 1} "
                                   f"target positions from {off}; the pass has {lg.shape[0]}")
            children: dict[int, dict[int, int]] = {}
            for j, (token, parent) in enumerate(nodes):
                children.setdefault(parent, {})[token] = j
            node, path = -1, []
            while True:
                row = lg[off + 1 + node]
                if cmd.temperature <= 0:
                    tok = int(row.argmax())
                else:
                    p = torch.softmax(row / cmd.temperature, -1)
                    tok = int(torch.multinomial(p, 1, generator=self.gen))
                node = children.get(node, {}).get(tok)
                if node is None:
                    break
                path.append(node)
            top2 = torch.topk(row, 2).values
            accepted.append(len(path))
            tokens.append(tok)
            margin.append(float(top2[0] - top2[1]))
            paths.append(path)
        return {"accepted": accepted, "bonus": tokens, "margin": margin, "path": paths}

    @torch.inference_mode()
    def _compact(self, cmd: CompactCmd):
        main = self.cache(cmd.model, cmd.width)
        for a, b in cmd.ranges:  # an adapter after layer E reads layer E's input
            for cache, layers in ((main, range(a, b)), (main.side, range(a + 1, b + 1))):
                for layer in layers:
                    if cache is None or layer not in cache.k:
                        continue
                    for buf in (cache.k[layer], cache.v[layer]):
                        for row, src, dst in cmd.moves:
                            buf[row, :, dst] = buf[row, :, src]

    # helpers ------------------------------------------------------------------
    def keep(self, handle: int, entry: dict) -> None:
        self.store[handle] = entry
        while len(self.store) > KEEP_HANDLES:
            self.store.popitem(last=False)

    def expect(self, handle: int) -> None:
        """A receive (on another thread) will bring ``handle``: readers wait for it."""
        self.arriving[handle] = threading.Event()

    def arrived(self, handle: int) -> None:
        """The receive of ``handle`` ended (with the states, or failed without)."""
        event = self.arriving.pop(handle, None)
        if event is not None:
            event.set()

    def hidden(self, handle) -> torch.Tensor:
        """Hidden states of a handle, or of several concatenated along positions;
        waits for states a receive is still bringing."""
        for h in handle if isinstance(handle, (tuple, list)) else (handle,):
            event = self.arriving.get(h)
            if event is not None:
                event.wait()
        try:
            if isinstance(handle, (tuple, list)):
                return _concat([self.store[h] for h in handle])
            return self.store[handle]["hidden"]
        except KeyError:
            raise RuntimeError(f"device {self.name} holds no hidden states for handle "
                               f"{handle}") from None

    @staticmethod
    def _logits(stack: Stack, hidden, cmd: FwdCmd) -> list[torch.Tensor]:
        want = cmd.n_logits or tuple(1 for _ in cmd.n_fed)
        kind, end = cmd.head, cmd.layers[1]
        if len(set(want)) == 1 and len(set(cmd.n_fed)) == 1:
            n, m = cmd.n_fed[0], want[0]
            return list(stack.head(hidden[:, n - m:n], kind, end).cpu())  # decided on CPU
        return [stack.head(hidden[b, n - m:n], kind, end).cpu() for b, (n, m) in
                enumerate(zip(cmd.n_fed, want))]

    def _emit(self, stack, cache, cmd: FwdCmd, logits) -> dict:
        """Sample ``steps`` tokens per row, feeding each back through the layers."""
        out = self._sample(logits, cmd, cmd.pick)
        ends = [s + n for s, n in zip(cmd.start, cmd.n_fed)]
        for _ in range(cmd.steps - 1):
            last = [toks[-1] for toks in out["tokens"]]
            at = Positions(ends, [1] * len(ends), None, self.where)
            tokens = torch.tensor(last, device=self.where)[:, None]
            hidden = stack.run(cache, cmd.layers, at, tokens=tokens)
            hidden = stack.pre_head(cmd.head, cmd.layers[1], hidden, cache, at)
            step = self._sample(list(stack.head(hidden, cmd.head, cmd.layers[1]).cpu()), cmd,
                                None)
            _extend(out, step)
            ends = [e + 1 for e in ends]
        return out

    def _emit_ahead(self, stack, cmd: FwdCmd, feats, logits) -> dict:
        """Sample ``ahead`` tokens per row from one pass: the first from the head's
        logits, token 1 + j from multi-token head j at the same (last) position."""
        out = self._sample(logits, cmd, cmd.pick)
        last = torch.stack([feats[b, n - 1] for b, n in enumerate(cmd.n_fed)])[:, None]
        for lg in stack.ahead_logits(last, cmd.head, cmd.layers[1])[:cmd.ahead - 1]:
            _extend(out, self._sample(list(lg.cpu()), cmd, None))
        out["ahead"] = True  # the coordinator's book: no emitted token was fed
        return out

    def _sample(self, logits, cmd: FwdCmd, pick) -> dict:
        """One token per row from its last logits: per-row lists of the token, the
        draft distribution (temperature > 0) and the top candidates."""
        tokens, probs, top = [], [], []
        for r, lg in enumerate(logits):
            last = lg[-1]
            ranked = torch.topk(last, cmd.top).indices.tolist()
            prob = None
            if cmd.temperature > 0:
                p = torch.softmax(last / cmd.temperature, -1)
                prob = p.cpu().numpy()  # plain pickle across processes
            if pick is not None and pick[r] >= 0:
                token = ranked[pick[r]]
            elif cmd.temperature > 0:
                token = int(torch.multinomial(p, 1, generator=self.gen))
            else:
                token = ranked[0]
            tokens.append([token])
            probs.append([prob])
            top.append([ranked])
        return {"tokens": tokens, "probs": probs, "top": top}

    def _accept(self, lg, proposal, draft_probs, temperature, bonus=True):
        """(accepted, next token or None). Greedy: the longest prefix equal to the
        target's argmax. Otherwise rejection sampling, which leaves the target's
        distribution unchanged. Without ``bonus``, a fully accepted proposal
        commits no token of the target's."""
        g = len(proposal)
        if temperature <= 0:
            pred = lg.argmax(-1).tolist()
            k = common_prefix(pred, proposal)
            return k, (pred[k] if k < g or bonus or g == 0 else None)
        p = torch.softmax(lg / temperature, -1)
        for i, x in enumerate(proposal):
            if draft_probs[i] is None:  # a proposer outside the models: a point mass
                q = torch.zeros_like(p[i])
                q[x] = 1.0
            else:
                q = torch.as_tensor(draft_probs[i], device=p.device)
            u = float(torch.rand((), generator=self.gen))
            if u * float(q[x]) < float(p[i, x]):
                continue
            residual = torch.clamp(p[i] - q, min=0)
            total = float(residual.sum())
            dist = residual / total if total > 0 else p[i]
            return i, int(torch.multinomial(dist, 1, generator=self.gen))
        if g and not bonus:
            return g, None
        return g, int(torch.multinomial(p[g], 1, generator=self.gen))


def _extend(out: dict, step: dict) -> None:
    """Append one more sampled token per row (and its probs and candidates)."""
    for key in out:
        for r, value in enumerate(step[key]):
            out[key][r].extend(value)


def _concat(entries: list[dict]) -> torch.Tensor:
    """Several Forwards' hidden states, each row's valid positions end to end
    (ragged rows: each input is padded past its own rows' ends)."""
    fed = [e.get("n_fed") or [e["hidden"].shape[1]] * e["hidden"].shape[0] for e in entries]
    if all(len(set(n)) == 1 for n in fed):
        return torch.cat([e["hidden"] for e in entries], dim=1)
    rows = [torch.cat([e["hidden"][b, :n[b]] for e, n in zip(entries, fed)])
            for b in range(entries[0]["hidden"].shape[0])]
    width = max(r.shape[0] for r in rows)
    return torch.stack([torch.cat([r, r[-1:].expand(width - r.shape[0], -1)]) for r in rows])
