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
from hwprofiles.placement import Placement
from policies.tree import draft_passes, tree_nodes

# schedules that never run a separate draft model (they draft with the target's
# own layers, or not at all)
SELF_DRAFTING = frozenset({"ar", "ppsd", "eesd", "ar_stream", "kangaroo", "cats"})
LOGIT_BYTES = 4  # logits are kept in fp32 for sampling


def uses_draft(policy: str, params) -> bool:
    """Whether the schedule runs a separate draft model: not a self-drafting one,
    nor sd/tree drafting from the target's first layers (draft_layers)."""
    if policy in SELF_DRAFTING:
        return False
    return not (policy in ("sd", "tree") and _param(params, "draft_layers") is not None)


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
    """What sizes a run's memory: the schedule and its request."""

    policy: str = "ar"
    params: object = None
    prompt_tokens: int = 0
    tokens: int = 0
    batch: int = 1
    streams_weights: bool = False
    prefill_chunk: int | None = None  # positions per prefill pass (None: the prompt)


def _param(params, name: str, default=None):
    return getattr(params, name, default) if params is not None else default


def positions_per_pass(params) -> int:
    """Positions per row of a verify pass: the proposal plus the bonus token; a
    token tree's verify scores the root and every node (at most ``nodes`` of a
    dynamic tree's candidates)."""
    if _param(params, "tree") is not None:
        return 1 + len(tree_nodes(params, None))
    depth = _param(params, "gamma") or _param(params, "k") or 0
    return 1 + int(depth)


def draft_positions(params) -> int:
    """Positions per row of the widest draft pass: one, or a token tree's widest
    level of nodes it expands."""
    if _param(params, "tree") is not None:
        return max(n for n, _ in draft_passes(params))
    return 1


def pieces(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
           run: Run) -> list[Piece]:
    """The pieces of models the schedule places, by role."""
    placement = Placement(placement)
    target = models["target"]
    width = positions_per_pass(run.params)
    exit_layer_head = 1 if _param(run.params, "exit_head") == "transformer" else 0
    stage_layers = getattr(run.params, "stage_layers", None)
    if stage_layers and all(f"stage{k}" in placement
                            for k in range(-(-target.n_layers // stage_layers))):
        return _stages(target, placement, stage_layers,
                       exit_layer_head if run.policy == "ppsd" else None)
    main = dict(role="target", where=placement["target"], spec=target,
                layers=target.n_layers, lm_head=True, embed=True, positions=width)
    out = []
    if run.streams_weights:
        budget = _param(run.params, "dram_budget_gb")
        if budget is not None:
            main["resident_layer_bytes"] = min(budget * 1e9,
                                               target.n_layers * target.layer_bytes)
    if run.policy == "eesd":
        main.update(exit_heads=1, exit_layers=exit_layer_head)
    # sd and tree self-draft alike (policies.sd.draft_source)
    draft_layers = (_param(run.params, "draft_layers") if run.policy in ("sd", "tree")
                    else None)
    if draft_layers is not None:
        where = placement["draft"]
        if platform.members(where) == platform.members(main["where"]):
            main["exit_heads"] = 1
        else:
            out.append(Piece("draft", where, target, draft_layers, embed=True,
                             exit_heads=1, positions=draft_positions(run.params)))
    elif "draft" in models and run.policy not in SELF_DRAFTING:
        draft = models["draft"]
        out.append(Piece("draft", placement["draft"], draft, draft.n_layers,
                         lm_head=True, embed=True, positions=draft_positions(run.params)))
    return [Piece(**main)] + out


def _stages(target: ModelSpec, placement: dict[str, str], per_stage: int,
            exit_layer_head: int | None) -> list[Piece]:
    """A pipelined target: stages of ``per_stage`` layers on roles stage0, stage1,
    ...; stage 0 holds the early-exit head when ``exit_layer_head`` is not None
    (ppsd; the pipelined AR baseline has none)."""
    bounds = [(a, min(a + per_stage, target.n_layers))
              for a in range(0, target.n_layers, per_stage)]
    out = []
    for k, (a, b) in enumerate(bounds):
        role = f"stage{k}"
        out.append(Piece(role, placement[role], target, b - a,
                         lm_head=k == len(bounds) - 1, embed=k == 0,
                         exit_heads=int(k == 0 and exit_layer_head is not None),
                         exit_layers=(exit_layer_head or 0) if k == 0 else 0))
    return out


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
