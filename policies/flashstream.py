"""Decoder layers streamed from flash every cycle: the DRAM budget's settings, the
plan of which layers stay resident and which stream chunk by chunk, and the
streamer that issues the reads into a ring of buffer slots.

``plan_memory`` refuses, in one sentence with the fix, a budget that cannot hold
the streaming buffer or the layers a schedule pins (a draft's first layers);
``FlashStreamer`` streams the plan's chunks in order, cycle after cycle, each read
after the one before it; ``target_pass`` runs the resident layers, then each
streamed chunk once it has arrived. The streaming schedules (``policies/cats.py``:
ar_stream, kangaroo, cats) build on them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pydantic import Field

from policies.base import PolicyContext, PolicyError, PolicyParams
from policies.ops import LM, Feed, Forward, Join, Spawn, StreamWeights


class StreamParams(PolicyParams):
    dram_budget_gb: float | None = Field(None, gt=0, description="DRAM for decoder layers: "
                                         "resident layers plus the streaming buffer")
    chunk_layers: int = Field(1, ge=1, description="layers per streamed chunk")
    buffer_chunks: int = Field(2, ge=1, description="chunks the streaming buffer holds "
                                                    "(2: double buffering)")
    buffer_in_budget: bool = Field(
        True, description="the streaming buffer counts against dram_budget_gb (false: "
                          "the budget holds resident layers only, the buffer is extra)")

    def resident_bytes(self) -> float | None:
        return None if self.dram_budget_gb is None else self.dram_budget_gb * 1e9


# memory plan -------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Which decoder layers are resident and which stream, chunk by chunk."""

    n_layers: int
    layer_bytes: float
    resident: int
    buffer_layers: int
    chunks: tuple[tuple[int, int], ...]


def plan_memory(ctx: PolicyContext, p: StreamParams, policy: str, pinned: int = 0,
                pin_name: str = "", smallest: int = 1) -> Plan:
    """Resident layers and streamed chunks for the budget; a clear error when the
    budget cannot hold the buffer or the first ``pinned`` layers the policy needs
    (``pin_name`` names the parameter that sets them, ``smallest`` its least
    valid value)."""
    spec = ctx.target
    n, layer_bytes = spec.n_layers, spec.layer_bytes
    if p.dram_budget_gb is None:
        raise PolicyError(f"{policy} needs dram_budget_gb, the DRAM its decoder layers may "
                          "use; pass e.g. --set dram_budget_gb=8")
    buffer_layers = p.chunk_layers * p.buffer_chunks
    # layers the budget holds, counted as if the buffer were inside it
    fit = int(p.dram_budget_gb * 1e9 // layer_bytes) + (0 if p.buffer_in_budget
                                                         else buffer_layers)
    resident = n if fit >= n else max(0, fit - buffer_layers)
    if fit < n and fit < buffer_layers:
        raise PolicyError(
            f"{policy}: dram_budget_gb={p.dram_budget_gb:g} cannot hold the streaming "
            f"buffer of {buffer_layers} layers of {spec.name} "
            f"({buffer_layers * layer_bytes / 1e9:.2f} GB); raise dram_budget_gb or lower "
            "buffer_chunks / chunk_layers")
    if resident < pinned:
        def need_gb(layers: int) -> float:
            counted = layers + (buffer_layers if p.buffer_in_budget else 0)
            return counted * layer_bytes / 1e9 + 0.005
        fix = (f"choose {pin_name} <= {resident} or raise dram_budget_gb to at least "
               f"{need_gb(pinned):.2f}" if resident >= smallest else
               f"even the smallest {pin_name}={smallest} needs dram_budget_gb >= "
               f"{need_gb(smallest):.2f}")
        if p.buffer_in_budget:
            fix += (f" (or {need_gb(pinned) - buffer_layers * layer_bytes / 1e9:.2f} with "
                    "buffer_in_budget=false, the buffer outside the budget)")
        raise PolicyError(
            f"{policy}: dram_budget_gb={p.dram_budget_gb:g} holds {resident} resident layers "
            f"of {spec.name} ({layer_bytes / 1e9:.4f} GB each) beside a {buffer_layers}-layer "
            f"streaming buffer, but {pin_name}={pinned} pins {pinned}; {fix}")
    chunks = tuple((a, min(a + p.chunk_layers, n)) for a in range(resident, n, p.chunk_layers))
    return Plan(n, layer_bytes, resident, buffer_layers, chunks)


# flash streaming ----------------------------------------------------------------
class FlashStreamer:
    """Streams the plan's chunks in order, cycle after cycle, into a ring of
    buffer slots: chunk j+slots starts once chunk j has been computed, and each
    stream waits for the one before it (flash reads run one at a time)."""

    def __init__(self, plan: Plan, slots: int, device: str = "target"):
        self.plan, self.slots, self.device = plan, slots, device
        self.pending: deque = deque()  # (chunk, task), oldest first
        self.next = 0
        self.last_task = None
        self.stopped = False
        self.flash_bytes = 0.0

    def _load(self, previous, chunk):
        if previous is not None:
            yield Join((previous,))
        if self.stopped:
            return
        nbytes = (chunk[1] - chunk[0]) * self.plan.layer_bytes
        self.flash_bytes += nbytes
        yield StreamWeights(self.device, "target", chunk, nbytes,
                            label=f"stream layers {chunk[0]}-{chunk[1] - 1}",
                            buffer_layers=self.plan.buffer_layers)

    def fill(self):
        """Start streams into every free buffer slot."""
        chunks = self.plan.chunks
        while chunks and len(self.pending) < self.slots:
            chunk = chunks[self.next % len(chunks)]
            self.next += 1
            self.last_task = yield Spawn(self._load(self.last_task, chunk))
            self.pending.append((chunk, self.last_task))

    def take(self):
        """Wait until the oldest chunk is in DRAM; returns its layer range."""
        chunk, task = self.pending[0]
        yield Join((task,))
        return chunk

    def release(self):
        """The oldest chunk has been computed: its slot takes the next chunk."""
        self.pending.popleft()
        yield from self.fill()


def target_pass(streamer: FlashStreamer, first: int, n_tokens: int, batch: int,
                context: int, label: str = "target", inputs=None):
    """Layers first..N over n_tokens positions: resident ones, then each streamed
    chunk once it has arrived; ``inputs`` feed layer ``first`` (None: the token
    sequence, with first = 0). Returns the last Forward's handle (LM logits)."""
    plan = streamer.plan
    n, handle = plan.n_layers, inputs
    if first < plan.resident:
        handle = yield Forward("target", "target", (first, plan.resident), n_tokens, batch,
                               context, head=LM if plan.resident == n else None,
                               feed=Feed(inputs), label=label)
    for _ in plan.chunks:
        chunk = yield from streamer.take()
        handle = yield Forward("target", "target", chunk, n_tokens, batch, context,
                               head=LM if chunk[1] == n else None, feed=Feed(handle),
                               label=f"{label} (streamed)")
        yield from streamer.release()
    return handle
