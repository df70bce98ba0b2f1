"""Layer-range execution of a decoder-only HF model with a preallocated KV cache.

``Stack`` wraps a loaded Llama/Mistral/Qwen2/Qwen3 model and runs any range of
its decoder layers over new positions of each row: row ``b`` feeds
``n_fed[b]`` tokens at positions ``start[b]...``, its keys and values are
written into ``KVCache`` there, and it attends to everything before them
(plus an optional tree mask among the new positions, and branch positions: a
sibling token whose rotary position and visible prefix differ from its cache
slot). Rows may be ragged:
shorter rows are padded, and the padding's cache entries lie past the row's
valid length, where nothing reads them. A tensor-parallel shard
(``executors.backend.tensor``) holds some heads and MLP columns and sums the members'
partial outputs with ``Stack.reduce`` after each output and down projection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values per layer: ``[batch, kv_heads, capacity, head_dim]``.

    The cache stores; it does not know which positions are valid. The caller
    (the executor's bookkeeping) passes each row's start position, so a rollback
    costs nothing: later writes overwrite the rejected positions.
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.float32, device="cpu", capacity: int = 256):
        self.shape = (batch, n_kv_heads, capacity, head_dim)
        self.dtype, self.device = dtype, device
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.side: KVCache | None = None  # trained adapters' keys (whole, never sharded)

    def adapters(self, n_kv_heads: int) -> KVCache:
        """The cache of the draft adapters' keys and values, beside this one."""
        if self.side is None:
            b, _, cap, d = self.shape
            self.side = KVCache(b, n_kv_heads, d, self.dtype, self.device, cap)
        return self.side

    def buffers(self, layer: int, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k.get(layer)
        if k is None or k.shape[2] < need:
            cap = max(self.shape[2], need)
            while k is not None and cap < need:
                cap *= 2
            if k is not None and cap <= k.shape[2]:
                cap = 2 * k.shape[2]
            new_k = torch.zeros(*self.shape[:2], cap, self.shape[3], dtype=self.dtype,
                                device=self.device)
            new_v = torch.zeros_like(new_k)
            if k is not None:
                new_k[:, :, :k.shape[2]] = k
                new_v[:, :, :k.shape[2]] = self.v[layer]
            self.k[layer], self.v[layer] = new_k, new_v
        return self.k[layer], self.v[layer]

    def regroup(self, keep: list[int], add: int) -> None:
        """Rows ``keep`` (old indices, in their new order), then ``add`` empty rows
        (zeros: a padded attention reads them as finite numbers, never uses them)."""
        self.shape = (len(keep) + add, *self.shape[1:])
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for d in (self.k, self.v):
            for layer, t in d.items():
                rows = t.index_select(0, index)
                if add:
                    rows = torch.cat([rows, rows.new_zeros(add, *t.shape[1:])])
                d[layer] = rows
        if self.side is not None:
            self.side.regroup(keep, add)

    def rows(self, a: int, b: int) -> "RowsView":
        """Rows ``a..b`` of this cache, sharing its storage (a prefill of the rows
        that just joined)."""
        return RowsView(self, a, b)

    @property
    def nbytes(self) -> int:
        own = sum(t.numel() * t.element_size() for d in (self.k, self.v) for t in d.values())
        return own + (self.side.nbytes if self.side is not None else 0)


class RowsView(KVCache):
    """Some contiguous rows of a cache: writes land in the cache's own buffers."""

    def __init__(self, parent: KVCache, a: int, b: int):
        self.parent, self.a, self.b = parent, a, b
        self.shape = (b - a, *parent.shape[1:])
        self.dtype, self.device = parent.dtype, parent.device

    def buffers(self, layer: int, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.parent.buffers(layer, need)
        return k[self.a:self.b], v[self.a:self.b]

    def adapters(self, n_kv_heads: int) -> KVCache:
        return RowsView(self.parent.adapters(n_kv_heads), self.a, self.b)


class Positions:
    """Where each row's new tokens go, and the attention mask that follows.

    ``branches[b]``: ``(i, rope, limit, *seen)`` per branch token of row b: new
    token i takes rotary position ``rope`` and sees only the cache slots below
    ``limit``, the slots ``seen`` and its own slot (a correction branch: a sibling
    of the main-branch token at position ``rope``, placed in a slot past the main
    branch; a token-tree node: ``seen`` are its ancestors' slots).
    """

    def __init__(self, start: list[int], n_fed: list[int], tree: torch.Tensor | None = None,
                 device="cpu", branches: list | None = None):
        self.start, self.n_fed = list(start), list(n_fed)
        self.n = max(n_fed)
        self.branches = branches if branches and any(branches) else None
        self.uniform = len(set(self.start)) == 1 and tree is None and self.branches is None
        self.end = max(s + self.n for s in self.start)
        offs = torch.arange(self.n, device=device)
        self.pos = torch.tensor(self.start, device=device)[:, None] + offs  # [B, n]
        self.rope = self.pos
        if self.branches is not None:
            self.rope = self.pos.clone()
            for b, row in enumerate(self.branches):
                for i, rope, *_ in row:
                    self.rope[b, i] = rope
        self.mask = self._mask(tree, device)

    def _mask(self, tree, device):
        if self.uniform and self.n == 1:
            return None
        keys = torch.arange(self.end, device=device)
        mask = keys[None, None, :] <= self.pos[:, :, None]  # causal on absolute positions
        if tree is not None:  # tree[b, i, j]: new token i may see new token j
            for b, s in enumerate(self.start):
                mask[b, :, s:s + self.n] &= tree[b, :self.n, :self.n]
        for b, row in enumerate(self.branches or ()):
            for i, _, limit, *seen in row:
                mask[b, i] = keys < limit
                mask[b, i, self.start[b] + i] = True
                mask[b, i, list(seen)] = True
        return mask[:, None]  # [B, 1, n, S]


class Stack:
    """Runs layer ranges, the final norm and the LM head of one HF causal LM."""

    def __init__(self, hf_model, n_layers: int | None = None):
        """``n_layers``: use only the first layers (a self-draft: the target's first
        layers, then its final norm and LM head)."""
        self.hf = hf_model
        inner = hf_model.model
        cfg = hf_model.config
        self.embed, self.norm = inner.embed_tokens, inner.norm
        self.layers = inner.layers[:n_layers] if n_layers else inner.layers
        self.lm_head = hf_model.lm_head
        self.rotary = inner.rotary_emb
        self.n_layers = len(self.layers)
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.hidden = cfg.hidden_size
        self.vocab = cfg.vocab_size
        self._cos = self._sin = None
        self.reduce = None  # tensor parallel: sums the members' partial outputs
        self.full_layers = len(inner.layers)  # a self-draft's exit lies below this
        self.drafts = None  # executors.backend.drafts.DraftHeads: trained exit heads, adapters

    def new_cache(self, batch: int, capacity: int = 256) -> KVCache:
        return KVCache(batch, self.n_kv_heads, self.head_dim, self.embed.weight.dtype,
                       self.embed.weight.device, capacity)

    def _rope(self, pos: torch.Tensor, end: int):
        if self._cos is None or self._cos.shape[0] < end:
            size = max(1024, 1 << (end - 1).bit_length())
            ids = torch.arange(size, device=self.embed.weight.device)[None]
            cos, sin = self.rotary(self.embed.weight[:1], ids)
            self._cos, self._sin = cos[0], sin[0]
        return self._cos[pos][:, None], self._sin[pos][:, None]  # [B, 1, n, D]

    @torch.inference_mode()
    def run(self, cache: KVCache, layers: tuple[int, int], at: Positions,
            tokens: torch.Tensor | None = None, hidden: torch.Tensor | None = None):
        """Hidden states after layers [a, b) for the new positions ``at``."""
        h = self.embed(tokens) if hidden is None else hidden
        cos, sin = self._rope(at.rope, at.end)
        adapters = self.drafts.adapters if self.drafts is not None else {}
        for i in range(*layers):
            h = self._layer(i, h, cache, at, cos, sin)
            if i + 1 in adapters:  # the states an adapter reads: keep its keys and values
                adapter = adapters[i + 1]
                self._store(cache.adapters(adapter.n_kv_heads), i + 1,
                            *adapter.keys_values(h, cos, sin), at)
        return h

    @torch.inference_mode()
    def pre_head(self, kind: str | None, end: int, hidden, cache: KVCache, at: Positions):
        """States the head reads: an adapter's block over them (``exit_layer``,
        every fed position; its keys and values were stored by ``run``)."""
        if self._kind(kind, end) != "exit_layer":
            return hidden
        adapter = self.drafts.adapters.get(end) if self.drafts is not None else None
        if adapter is None:
            raise ValueError(f"no trained adapter at layer {end}")
        keys, values = cache.adapters(adapter.n_kv_heads).buffers(end, at.end)
        cos, sin = self._rope(at.rope, at.end)
        return adapter.attend(hidden, keys[:, :, :at.end], values[:, :, :at.end], cos, sin,
                              at.mask)

    @torch.inference_mode()
    def head(self, hidden: torch.Tensor, kind: str = "lm", end: int | None = None):
        """fp32 logits: the final norm and LM head after the last layer; a trained
        draft head at an exit (``kind`` exit / exit_layer, or a self-draft's own
        head), the final norm and LM head where none was trained."""
        end = self.n_layers if end is None else end
        kind = self._kind(kind, end)
        exit_head = None
        if self.drafts is not None and kind != "lm":
            exit_head = self.drafts.head_for(kind, end)
        if exit_head is None:
            return self.lm_head(self.norm(hidden)).float()
        return self.drafts.logits(exit_head, hidden, self.lm_head.weight)

    @torch.inference_mode()
    def ahead_logits(self, hidden: torch.Tensor, kind: str, end: int) -> list[torch.Tensor]:
        """fp32 logits of the multi-token heads after layer ``end`` (head j: token
        t+1+j from the states at t), j = 1, 2, ...; none unless ``kind`` resolves
        to that exit's trained exit head, the one they extend."""
        if self.drafts is None or self._kind(kind, end) != "exit":
            return []
        return [self.drafts.logits(h, hidden, self.lm_head.weight)
                for h in self.drafts.ahead.get(end, ())]

    def _kind(self, kind: str | None, end: int) -> str | None:
        """A self-draft's own head (``lm`` before the last layer) is its trained
        adapter where there is one, else its exit head."""
        if kind != "lm" or end >= self.full_layers:
            return kind
        return "exit_layer" if self.drafts and end in self.drafts.adapters else "exit"

    def _layer(self, i, h, cache, at, cos, sin):
        layer = self.layers[i]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        bsz, n, _ = x.shape
        q = attn.q_proj(x).view(bsz, n, self.n_heads, self.head_dim)
        k = attn.k_proj(x).view(bsz, n, self.n_kv_heads, self.head_dim)
        v = attn.v_proj(x).view(bsz, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = self._store(cache, i, k, v, at)
        out = self._attend(q, keys, values, at.mask)
        a = attn.o_proj(out)
        h = h + (a if self.reduce is None else self.reduce(a))
        m = layer.mlp(layer.post_attention_layernorm(h))
        return h + (m if self.reduce is None else self.reduce(m))

    @staticmethod
    def _store(cache: KVCache, i: int, k, v, at: Positions):
        kbuf, vbuf = cache.buffers(i, at.end)
        if at.uniform:
            s = at.start[0]
            kbuf[:, :, s:s + at.n] = k
            vbuf[:, :, s:s + at.n] = v
        else:
            for b, s in enumerate(at.start):
                kbuf[b, :, s:s + at.n] = k[b]
                vbuf[b, :, s:s + at.n] = v[b]
        return kbuf[:, :, :at.end], vbuf[:, :, :at.end]

    def _attend(self, q, keys, values, mask):
        """Grouped-query attention: each kv head serves its group of query heads,
        folded into the query length so keys and values are never repeated."""
        bsz, _, n, d = q.shape
        group = self.n_heads // self.n_kv_heads
        q = q.reshape(bsz, self.n_kv_heads, group * n, d)
        if mask is not None:
            mask = mask.expand(bsz, 1, n, mask.shape[-1])
            mask = mask[:, :, None].expand(bsz, 1, group, n, mask.shape[-1])
            mask = mask.reshape(bsz, 1, group * n, mask.shape[-1])
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = out.reshape(bsz, self.n_heads, n, d).transpose(1, 2)  # not always contiguous on CUDA
        return out.reshape(bsz, n, self.n_heads * d)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
