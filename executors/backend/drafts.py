"""Trained draft heads of a target: early-exit heads and Kangaroo-style adapters.

The schedules draft from the target's own first layers and name the head that
turns those layers' hidden states into a draft token: ``head="exit"`` (EESD,
PPSD, SD with ``draft_layers``, Mirror's early exit; PPSD's "norm" head) and
``head="exit_layer"`` (Kangaroo and CATS adapters; PPSD's "transformer" head).
A self-draft ``self:N`` ends in its own head after N layers: an exit at N.

Untrained, an exit is the target's final norm and LM head applied to a shallow
layer, which rarely agrees with the last layer. A trained artifact
(``hetspec train-draft``) holds, per exit layer E:

* ``exit.E``: an RMS norm and a square residual projection before the shared LM
  head (``ExitHead``);
* ``adapter.E``: one attention block (the shape of one of the target's attention
  layers, with its own KV cache slot) followed by such a head (``Adapter``);
* ``ahead.E.j`` (j = 1..eta-1): multi-token heads, each an ``ExitHead`` that reads
  the same states at position t as ``exit.E`` and predicts token t+1+j instead
  of t+1 (Medusa-style): one pass over layers 1..E proposes eta tokens.

Every trained head projects onto a draft vocabulary (the artifact's
``vocab_ids``, the tokens the target emits most often) and gives -inf to the
rest: the draft never proposes a token outside it, and its LM-head product is a
fraction of the full one. Drafts only propose; the target verifies with its
own final norm and LM head, so outputs stay the target's.

The artifact is fp16 safetensors with a provenance JSON beside it; the shipped
one for SmolLM2-135M lies in ``executors/data``. ``HETSPEC_DRAFTS`` names
another file, or ``none`` for the untrained heads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save as to_bytes

from executors.backend import models
from hwprofiles.writing import atomic_write_bytes

DATA_DIR = Path(str(resources.files("executors") / "data"))  # package data, wherever this module is
SHIPPED = {models.REAL_NAME: DATA_DIR / "smollm2-135m-drafts.safetensors"}
ENV = "HETSPEC_DRAFTS"
FORMAT = "hetspec-drafts-1"
EPS = 1e-5


def artifact_path(target_source: str) -> Path | None:
    """The draft artifact a run of this target uses, or None (untrained heads)."""
    chosen = os.environ.get(ENV)
    if chosen:
        return None if chosen.lower() == "none" else Path(chosen)
    return SHIPPED.get(target_source)


def provenance_path(artifact: Path) -> Path:
    return artifact.with_suffix(".json")


def head_fields(target_source: str) -> dict:
    """What the target's spec says of the trained heads a run of it uses
    (``ModelSpec.exit_vocab``, ``trained_exits``, ``trained_adapters``), from the
    artifact's header alone; none without an artifact."""
    path = artifact_path(target_source)
    if path is None or not path.is_file():
        return dict(models.UNTRAINED)
    with safe_open(str(path), "pt") as f:
        layers = _layers_of(f.keys())
        vocab = f.get_slice("vocab_ids").get_shape()[0]
    return {"exit_vocab": int(vocab), "trained_exits": layers["exit"],
            "trained_adapters": layers["adapter"]}


def ahead_counts(target_source: str) -> dict[int, int]:
    """Per exit layer with multi-token heads, how many (eta - 1), from the
    artifact's header alone; empty when there is none."""
    path = artifact_path(target_source)
    if path is None or not path.is_file():
        return {}
    found: dict[int, set[int]] = {}
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            kind, *rest = key.split(".")
            if kind == "ahead":
                found.setdefault(int(rest[0]), set()).add(int(rest[1]))
    return {e: len(js) for e, js in sorted(found.items())}


def _layers_of(keys) -> dict[str, tuple[int, ...]]:
    found: dict[str, set[int]] = {"exit": set(), "adapter": set(), "ahead": set()}
    for key in keys:
        kind, _, rest = key.partition(".")
        if kind in found:
            found[kind].add(int(rest.split(".")[0]))
    return {k: tuple(sorted(v)) for k, v in found.items()}


def describe(target_source: str) -> dict | None:
    """What a run record notes of the draft heads used: the file and its hash."""
    path = artifact_path(target_source)
    if path is None or not path.is_file():
        return None
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def absent_note(target_source: str) -> str | None:
    """One line for a run whose target has no trained draft heads to use."""
    path = artifact_path(target_source)
    if path is None or path.is_file():
        return None
    return (f"hetspec: note: no trained draft heads at {path}; exit heads use the target's "
            "final norm and LM head (untrained); 'hetspec train-draft' writes them")


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight


class ExitHead(torch.nn.Module):
    """h -> norm(h + h P^T), ready for the (shared) LM head's rows of the draft
    vocabulary. P starts at zero: an untrained head is the final norm's."""

    def __init__(self, hidden: int, norm_weight: torch.Tensor | None = None):
        super().__init__()
        init = norm_weight.detach().clone() if norm_weight is not None else torch.ones(hidden)
        self.norm = torch.nn.Parameter(init.float())
        self.proj = torch.nn.Parameter(torch.zeros(hidden, hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return rms(h + h @ self.proj.T, self.norm)


class Adapter(torch.nn.Module):
    """One attention block over the exit layer's states (Kangaroo's adapter),
    then an ExitHead. Its keys and values live in the KV cache's
    adapter side cache (``KVCache.adapters``) at key E, written by every pass that
    computes layer E's input."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 norm_weight: torch.Tensor | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.norm_in = torch.nn.Parameter(torch.ones(hidden))
        self.q = torch.nn.Parameter(torch.zeros(n_heads * head_dim, hidden))
        self.k = torch.nn.Parameter(torch.zeros(n_kv_heads * head_dim, hidden))
        self.v = torch.nn.Parameter(torch.zeros(n_kv_heads * head_dim, hidden))
        self.o = torch.nn.Parameter(torch.zeros(hidden, n_heads * head_dim))
        self.head = ExitHead(hidden, norm_weight)

    def init_from(self, attn_layer) -> None:
        """Start from one of the target's attention layers, its output projection
        zero: the block starts as the identity, the adapter as its ExitHead."""
        with torch.no_grad():
            self.norm_in.copy_(attn_layer.input_layernorm.weight)
            attn = attn_layer.self_attn
            for mine, theirs in ((self.q, attn.q_proj), (self.k, attn.k_proj),
                                 (self.v, attn.v_proj)):
                mine.copy_(theirs.weight)

    def keys_values(self, h, cos, sin):
        """Rotated keys and values ``[B, kv_heads, n, D]`` of states ``h [B, n, H]``."""
        b, n, _ = h.shape
        x = rms(h, self.norm_in)
        k = (x @ self.k.T).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = (x @ self.v.T).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return rotate(k, cos, sin), v

    def attend(self, h, keys, values, cos, sin, mask) -> torch.Tensor:
        """States after the block: ``h`` plus attention over ``keys``/``values``
        (grouped-query, ``mask [B, 1, n, S]`` or None for causal-free one row)."""
        b, n, _ = h.shape
        x = rms(h, self.norm_in)
        q = (x @ self.q.T).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        q = rotate(q, cos, sin)
        group = self.n_heads // self.n_kv_heads
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return h + out.transpose(1, 2).reshape(b, n, -1) @ self.o.T


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DraftHeads:
    """The trained heads of one target, by exit layer, and the draft vocabulary.
    ``ahead[E][j - 1]`` predicts token t+1+j from exit E's states at t."""

    def __init__(self, exits: dict[int, ExitHead], adapters: dict[int, Adapter],
                 vocab_ids: torch.Tensor, meta: dict | None = None,
                 ahead: dict[int, list[ExitHead]] | None = None):
        self.exits, self.adapters = exits, adapters
        self.ahead = ahead or {}
        self.vocab_ids = vocab_ids.long()
        self.meta = meta or {}
        self._rows = None  # the LM head's rows of the draft vocabulary

    def to(self, device) -> DraftHeads:
        for m in [*self.exits.values(), *self.adapters.values(),
                  *(h for hs in self.ahead.values() for h in hs)]:
            m.to(device)
        self.vocab_ids = self.vocab_ids.to(device)
        return self

    def head_for(self, kind: str, exit_layer: int) -> ExitHead | None:
        if kind == "exit_layer":
            adapter = self.adapters.get(exit_layer)
            return adapter.head if adapter is not None else None
        return self.exits.get(exit_layer)

    def logits(self, head: ExitHead, hidden: torch.Tensor, lm_weight) -> torch.Tensor:
        """fp32 logits over the full vocabulary, -inf outside the draft's."""
        if self._rows is None or self._rows.device != lm_weight.device:
            self._rows = lm_weight[self.vocab_ids].detach()
        small = (head(hidden) @ self._rows.T).float()
        out = torch.full((*small.shape[:-1], lm_weight.shape[0]), float("-inf"),
                         device=small.device)
        out[..., self.vocab_ids] = small
        return out

    # artifact -------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        out = {"vocab_ids": self.vocab_ids.int().cpu()}
        for e, m in self.exits.items():
            out.update({f"exit.{e}.{k}": v for k, v in m.state_dict().items()})
        for e, m in self.adapters.items():
            out.update({f"adapter.{e}.{k}": v for k, v in m.state_dict().items()})
        for e, hs in self.ahead.items():
            for j, m in enumerate(hs, start=1):
                out.update({f"ahead.{e}.{j}.{k}": v for k, v in m.state_dict().items()})
        return {k: (v.detach().cpu().half() if v.is_floating_point() else v).contiguous()
                for k, v in out.items()}


SHAPE_KEYS = ("hidden", "vocab", "n_heads", "n_kv_heads", "head_dim")


def shape_of(stack) -> dict[str, int]:
    """The shape a draft artifact must match, from a target's (unsharded) stack."""
    return {"hidden": stack.hidden, "vocab": stack.vocab, "n_heads": stack.n_heads,
            "n_kv_heads": stack.n_kv_heads, "head_dim": stack.head_dim}


def load_artifact(path: Path, shape: dict[str, int], name: str = "the target") -> DraftHeads:
    """Read an artifact (fp16 -> fp32) and check it fits the target's ``shape``."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("format") != FORMAT:
        raise ValueError(f"draft artifact {path} is not a hetspec draft file (format "
                         f"{meta.get('format')!r}); rewrite it with 'hetspec train-draft'")
    theirs = {k: int(meta.get(k, -1)) for k in SHAPE_KEYS}
    if theirs != shape:
        raise ValueError(f"draft artifact {path} was trained for a model of shape {theirs}, "
                         f"not {name}'s {shape}; train one for it with 'hetspec "
                         f"train-draft' or set {ENV}=none")
    layers = _layers_of(tensors)
    exits = {e: ExitHead(shape["hidden"]) for e in layers["exit"]}
    adapters = {e: Adapter(shape["hidden"], shape["n_heads"], shape["n_kv_heads"],
                           shape["head_dim"]) for e in layers["adapter"]}
    for prefix, mods in (("exit", exits), ("adapter", adapters)):
        for e, m in mods.items():
            own = f"{prefix}.{e}."
            m.load_state_dict({k[len(own):]: v.float() for k, v in tensors.items()
                               if k.startswith(own)})
            m.eval().requires_grad_(False)
    return DraftHeads(exits, adapters, tensors["vocab_ids"], meta,
                      _ahead_of(tensors, shape["hidden"]))


def _ahead_of(tensors: dict, hidden: int) -> dict[int, list[ExitHead]]:
    """The multi-token heads ``ahead.E.j``, j = 1, 2, ... in order per exit E."""
    found: dict[int, dict[int, dict]] = {}
    for key, v in tensors.items():
        kind, e, j, name = (key.split(".", 3) + ["", "", ""])[:4]
        if kind == "ahead":
            found.setdefault(int(e), {}).setdefault(int(j), {})[name] = v.float()
    out = {}
    for e, by_j in found.items():
        if sorted(by_j) != list(range(1, len(by_j) + 1)):
            raise ValueError(f"the draft artifact's multi-token heads after layer {e} skip "
                             f"an offset ({sorted(by_j)}); rewrite it with 'hetspec "
                             "train-draft'")
        out[e] = []
        for j in sorted(by_j):
            head = ExitHead(hidden)
            head.load_state_dict(by_j[j])
            out[e].append(head.eval().requires_grad_(False))
    return out


def save_artifact(heads: DraftHeads, path: Path, shape: dict[str, int], target: str,
                  provenance: dict) -> None:
    """Write the artifact and its provenance JSON, each atomically (temp, fsync,
    rename); the JSON goes last, so a present JSON means a whole artifact."""
    meta = {"format": FORMAT, "target": target, **{k: str(v) for k, v in shape.items()}}
    data = to_bytes(heads.state(), metadata=meta)
    _write_atomic(path, data)
    provenance = {**provenance, "artifact": path.name,
                  "artifact_sha256": hashlib.sha256(data).hexdigest()}
    text = json.dumps(provenance, indent=2, sort_keys=True) + "\n"
    _write_atomic(provenance_path(path), text.encode())


def _write_atomic(path: Path, data: bytes) -> None:
    """The one atomic writer every output goes through (a killed writer's temp file
    is removed by the next write of the same path)."""
    atomic_write_bytes(path, data)


def attach(stack, target_source: str) -> None:
    """Give a stack of the target (or of a self-draft of it) its trained heads."""
    path = artifact_path(target_source)
    if path is None or not path.is_file():
        return
    heads = load_artifact(path, shape_of(stack), target_source)
    stack.drafts = heads.to(stack.embed.weight.device)


def warn_if_absent(target_source: str) -> None:
    note = absent_note(target_source)
    if note:
        print(note, file=sys.stderr)
