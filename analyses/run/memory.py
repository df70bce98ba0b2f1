"""Does a placement fit in memory? Weights, KV cache and activations per device.

A schedule places pieces of models on devices or groups: the target on its
group (tensor-parallel shards), pipeline stages on their devices, a
self-draft's first layers and exit head on the draft's device, a separate
draft's own weights on its device. Each piece needs, per member of its group:

* weights: its layers (a mixture of experts holds every expert; under expert
  parallelism a member holds ceil(E/G) whole experts), plus the LM head, the
  input embedding and any exit head it carries. A schedule that streams layers
  from flash keeps only its DRAM budget of layers resident.
* KV cache: its layers' keys and values for the requested context (prompt plus
  generated tokens plus the positions one pass adds; with ``--fixed-context``,
  which holds every step at the prompt's context, the prompt alone) and every
  row of the batch.
* activations: one pass's transient tensors at its widest layer (residual,
  attention output, MLP inner width) and its logits, for all rows of the pass;
  the widest of a decoding pass and a prefill pass (the whole prompt, or one
  ``prefill_chunk`` of it, without logits: the prefill runs no head).

Needs add up per memory tier (devices on one SoC share a DRAM), and a tier that
cannot hold them is refused (``analyses.run.remedies.check_fit``) in one sentence
naming the device, the need with its breakdown, and the capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hwprofiles import ModelSpec, Platform
from hwprofiles.schema import Placement
from policies import PolicyContext, build, parse_params
from policies.dryrun import EXIT_HEADS, EXIT_LAYER_HEAD, Answer, Segment, dry_run

LOGIT_BYTES = 4  # logits are kept in fp32 for sampling
DRY_TOKENS = 1024  # tokens the dry run's schedule is asked for: none of its steps is its last


def uses_draft(policy: str, params, models: dict[str, ModelSpec]) -> bool:
    """Whether the schedule runs a separate draft model (its dry run shows a
    Forward of the draft), rather than its target's own layers or no draft."""
    return "draft" in held(policy, params, models, 0).models()


@dataclass(frozen=True)
class Piece:
    """Part of a model held by a device or group (its members share it evenly)."""

    role: str
    where: str
    spec: ModelSpec
    layers: int
    lm_head: bool = False
    embed: bool = False
    exit_heads: int = 0  # vocabulary projections of early exits
    exit_layers: int = 0  # decoder layers of their own in early-exit heads
    resident_layer_bytes: float | None = None  # a streaming schedule's DRAM budget
    positions: int = 1  # positions per row of its widest pass


@dataclass
class TierNeed:
    """Bytes a memory tier must hold, and who asks for them."""

    weights: float = 0.0
    kv: float = 0.0
    activations: float = 0.0
    devices: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.activations


@dataclass(frozen=True)
class Run:
    """What sizes a run's memory: the schedule and its request. ``policy`` None:
    the target alone, one position a pass (a model's own check, a remedy's
    trial); ``resident_bytes``: DRAM for the decoder layers of a schedule that
    streams the rest (None: the schedule's own, ``PolicyParams.resident_bytes``)."""

    policy: str | None = None
    params: object = None
    prompt_tokens: int = 0
    tokens: int = 0
    batch: int = 1
    streams_weights: bool = False
    prefill_chunk: int | None = None  # positions per prefill pass (None: the prompt)
    resident_bytes: float | None = None


_ANSWERS: dict[tuple, Answer] = {}
_CACHED = 256  # dry runs kept


def _answer(policy: str, params, target: ModelSpec, draft: ModelSpec | None,
            prompt_tokens: int) -> Answer:
    key = (policy, params, target.model_dump_json(),
           draft and draft.model_dump_json(), prompt_tokens)
    if key not in _ANSWERS:
        if len(_ANSWERS) >= _CACHED:
            _ANSWERS.clear()
        ctx = PolicyContext(target=target, draft=draft, tokens=DRY_TOKENS,
                            prompt_tokens=prompt_tokens)
        _ANSWERS[key] = dry_run(build(policy, ctx, params),
                                accepting=build(policy, ctx, params))
    return _ANSWERS[key]


def held(policy: str, params, models: dict[str, ModelSpec], prompt_tokens: int) -> Answer:
    """The schedule's dry run (``policies.dryrun``) on these models: what each
    role runs where. Cached: a capacity search asks it at every batch it tries."""
    if params is None or isinstance(params, dict):
        params = parse_params(policy, params or {})
    return _answer(policy, params, models["target"], models.get("draft"), prompt_tokens)


def pieces(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
           run: Run) -> list[Piece]:
    """The pieces of models the schedule places, by role: each segment of its dry
    run, segments of one model on the same members merged (a self-draft on the
    target's devices shares the target's weights and adds its exit head)."""
    placement = Placement(placement)
    target = models["target"]
    resident = run.resident_bytes
    if resident is None and run.params is not None and run.streams_weights:
        resident = run.params.resident_bytes()
    if resident is not None:
        resident = min(resident, target.n_layers * target.layer_bytes)
    if run.policy is None:
        return [Piece("target", placement["target"], target, target.n_layers, lm_head=True,
                      embed=True, resident_layer_bytes=resident)]
    answer = held(run.policy, run.params, models, run.prompt_tokens)
    merged: dict[tuple, list[Segment]] = {}
    for seg in sorted(answer.segments, key=lambda s: (s.model != "target", s.start,
                                                      s.device != "target")):
        merged.setdefault((_members(platform, placement[seg.device]), seg.model),
                          []).append(seg)
    return [_piece(segs, placement, models, answer, resident) for segs in merged.values()]


def _members(platform: Platform, where: str) -> tuple[str, ...] | str:
    try:
        return tuple(platform.members(where))
    except KeyError:  # an unplaced role: the simulator names it and the fix
        return where


def _piece(segs: list[Segment], placement: Placement, models: dict[str, ModelSpec],
           answer: Answer, resident: float | None) -> Piece:
    """One piece of segments on the same members: their layers, heads (a head
    alone on the role, PPSD's exit head, counts), widest pass."""
    first, spec = segs[0], models[segs[0].model]
    start, stop = min(s.start for s in segs), max(s.stop for s in segs)
    heads = set().union(*(s.heads | answer.heads_only.get((s.device, s.model), set())
                          for s in segs))
    exit_heads = int(any(h in EXIT_HEADS for h in heads))
    return Piece(first.device, placement[first.device], spec, stop - start,
                 lm_head="lm" in heads, embed=start == 0, exit_heads=exit_heads,
                 exit_layers=int(EXIT_LAYER_HEAD in heads),
                 resident_layer_bytes=resident if any(s.streamed for s in segs) else None,
                 positions=max(max(s.positions for s in segs), 1))


def weight_bytes(piece: Piece, g: int) -> float:
    """Weight bytes one of ``g`` members holds."""
    spec, w = piece.spec, piece.spec.weight_elem_bytes
    layers = piece.layers + piece.exit_layers
    if spec.expert_parallel and g > 1:
        per_layer = (spec.layer_fixed_params / g
                     + math.ceil(spec.n_experts / g) * spec.expert_params) * w
    else:
        per_layer = spec.layer_bytes / g
    layer_bytes = per_layer * layers
    if piece.resident_layer_bytes is not None:
        layer_bytes = min(layer_bytes, piece.resident_layer_bytes / g)
    vocab = spec.hidden * spec.vocab * w
    heads = (piece.lm_head + piece.exit_heads) * spec.head_bytes
    embed = vocab if piece.embed and not (spec.tied_embeddings and piece.lm_head) else 0.0
    return layer_bytes + (heads + embed) / g


def kv_bytes(piece: Piece, g: int, run: Run) -> float:
    context = run.prompt_tokens + run.tokens + piece.positions
    layers = piece.layers + piece.exit_layers
    return layers * piece.spec.kv_bytes_per_token_layer() * context * run.batch / g


def activation_bytes(piece: Piece, g: int, run: Run) -> float:
    """The larger of a decoding pass (its positions, with logits where it has a
    head) and a prefill pass (the prompt, or one chunk of it; no head)."""
    spec = piece.spec
    if spec.is_moe:
        inner = spec.n_active_experts * spec.expert_ffn
    else:
        inner = spec.ffn
    inner *= 2 if spec.gated_mlp else 1
    width = 3 * spec.hidden + spec.n_heads * spec.dim_per_head + inner
    logits = spec.vocab * LOGIT_BYTES if piece.lm_head or piece.exit_heads else 0
    decode = run.batch * piece.positions * (width * spec.dtype_bytes + logits)
    prompt = min(run.prompt_tokens, run.prefill_chunk or run.prompt_tokens)
    prefill = run.batch * prompt * width * spec.dtype_bytes
    return max(decode, prefill) / g


def tier_needs(platform: Platform, models: dict[str, ModelSpec],
               placement: dict[str, str], run: Run) -> dict[str, TierNeed]:
    """Bytes each memory tier must hold under the placement."""
    needs: dict[str, TierNeed] = {}
    for piece in pieces(platform, models, placement, run):
        try:
            members = platform.members(piece.where)
        except KeyError:  # an unplaced role: the simulator names it and the fix
            continue
        g = len(members)
        for m in members:
            need = needs.setdefault(platform.device(m).memory, TierNeed())
            need.weights += weight_bytes(piece, g)
            need.kv += kv_bytes(piece, g, run)
            need.activations += activation_bytes(piece, g, run)
            if m not in need.devices:
                need.devices.append(m)
            label = f"{piece.role}={piece.spec.name}"
            if label not in need.roles:
                need.roles.append(label)
    return needs


def overflow(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
             run: Run) -> tuple[str, TierNeed, float] | None:
    """The first memory tier the placement overflows: (tier, need, capacity in
    bytes); None when every tier holds its need."""
    for tier_name, need in tier_needs(platform, models, placement, run).items():
        capacity = platform.tier(tier_name).capacity_bytes
        if need.total > capacity:
            return tier_name, need, capacity
    return None
