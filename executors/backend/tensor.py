"""Tensor parallelism: a model's layers sharded over a collective group.

A role placed on a platform group (``--placement target=cpu_tp``) runs on every
member worker at once, Megatron style:

* attention is split by key/value head groups: member i of G takes a contiguous
  run of kv heads (earlier members take one more when G does not divide them:
  SmolLM2's 3 kv groups over 2 workers are 2 and 1) with their query heads; its
  q/k/v projections keep those rows, the output projection those columns;
* the MLP is split by intermediate columns (gate/up rows, down-projection
  columns), unevenly the same way when G does not divide the width;
* norms, the embedding and the LM head are replicated: every member ends a
  Forward with the same hidden states and logits, so a Verify or a handle moved
  to another device reads the group's lead member alone, and no gather is needed;
* each layer all-reduces twice (after the output projection and after the down
  projection), a real ``all_reduce`` over the group's own process group (gloo,
  NCCL where the members are CUDA devices), timed as a collective span;
* KV caches hold only the member's kv heads, so rollback and cropping work per
  shard exactly as on one device: positions, not heads, are what the book tracks.

The coordinator sees a group as one client (``executors.backend.clients.GroupClient``) whose commands the
task loop fans out to the members and whose replies it merges.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

SEP = "+"  # a group client's name: its members' physical names joined by SEP


def members_of(client: str) -> list[str]:
    return client.split(SEP)


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` items in ``parts`` contiguous runs, earlier runs one longer if uneven."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (i < extra)
        out.append((start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class Shard:
    """This member's place in its group: key (the group client's name), index, size."""

    key: str
    index: int
    size: int


@dataclass
class AllReduceCmd:
    """``count`` all-reduces of ``nbytes`` each in the group ``key``."""

    key: str
    nbytes: float
    count: int = 1


@dataclass
class WeightsCmd:
    """Report each stack's weight bytes on this device: (layers, whole model)."""


def _rows(linear, a: int, b: int) -> None:
    linear.weight = torch.nn.Parameter(linear.weight.data[a:b].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias.data[a:b].clone(), requires_grad=False)
    linear.out_features = b - a


def _cols(linear, a: int, b: int, keep_bias: bool) -> None:
    linear.weight = torch.nn.Parameter(linear.weight.data[:, a:b].clone(),
                                       requires_grad=False)
    if linear.bias is not None and not keep_bias:  # the bias is added once, by member 0
        linear.bias = torch.nn.Parameter(torch.zeros_like(linear.bias.data),
                                         requires_grad=False)
    linear.in_features = b - a


def shard_stack(stack, shard: Shard, reduce) -> None:
    """Keep this member's kv-head groups and MLP columns; ``reduce(t)`` all-reduces."""
    if shard.size > stack.n_kv_heads:
        raise ValueError(f"a group of {shard.size} devices cannot split {stack.n_kv_heads} "
                         "key/value heads; place the model on a group of at most "
                         f"{stack.n_kv_heads} devices")
    group = stack.n_heads // stack.n_kv_heads
    kv_a, kv_b = split(stack.n_kv_heads, shard.size)[shard.index]
    if getattr(stack.hf, "_tp_shard", None) != shard:  # a self-draft shares the target's
        _slice(stack.hf.model.layers, kv_a, kv_b, group, stack.head_dim, shard)
        stack.hf._tp_shard = shard
    stack.n_kv_heads = kv_b - kv_a
    stack.n_heads = stack.n_kv_heads * group
    stack.reduce = reduce


def _slice(layers, kv_a: int, kv_b: int, group: int, d: int, shard: Shard) -> None:
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        ffn_a, ffn_b = split(mlp.down_proj.in_features, shard.size)[shard.index]
        _rows(attn.q_proj, kv_a * group * d, kv_b * group * d)
        _rows(attn.k_proj, kv_a * d, kv_b * d)
        _rows(attn.v_proj, kv_a * d, kv_b * d)
        _cols(attn.o_proj, kv_a * group * d, kv_b * group * d, shard.index == 0)
        _rows(mlp.gate_proj, ffn_a, ffn_b)
        _rows(mlp.up_proj, ffn_a, ffn_b)
        _cols(mlp.down_proj, ffn_a, ffn_b, shard.index == 0)


def layer_weight_bytes(stack) -> int:
    """Bytes of the decoder layers' weights this stack holds (its shard)."""
    return sum(p.numel() * p.element_size() for layer in stack.layers
               for p in layer.parameters())


def resident_weight_bytes(stack) -> int:
    """Bytes of every weight this stack's model holds (tied weights once)."""
    seen = {id(p): p for p in stack.hf.parameters()}
    return sum(p.numel() * p.element_size() for p in seen.values())


class Collectives:
    """A worker's process groups by key, and the timings of its all-reduces."""

    def __init__(self):
        self.groups: dict[str, object] = {}
        self.timings: list[tuple[float, float, int]] = []  # (start, end, bytes)

    def reducer(self, key: str):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            start = time.perf_counter()
            dist.all_reduce(t, group=self.groups[key])
            if t.is_cuda:  # NCCL returns once queued: time the reduction itself
                torch.cuda.synchronize(t.device)
            self.timings.append((start, time.perf_counter(), t.numel() * t.element_size()))
            return t
        return reduce

    def take(self) -> list[tuple[float, float, int]]:
        out, self.timings = self.timings, []
        return out

    def allreduce(self, cmd: AllReduceCmd, where: str) -> list:
        reduce = self.reducer(cmd.key)
        buf = torch.zeros(max(1, int(cmd.nbytes) // 4), dtype=torch.float32, device=where)
        for _ in range(cmd.count):
            reduce(buf)
        return self.take()
