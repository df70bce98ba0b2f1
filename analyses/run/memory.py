"""Does a placement fit in memory, and if not, what would make it fit? Weights, KV
cache and activations per device.

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
cannot hold them is refused (``check_fit``) in one sentence naming the device,
the need with its breakdown, and the capacity, then every single change that
makes the same check pass, each with the value that does it: the prompt
prefilled in chunks (``prefill_chunk``), the KV cache or the weights stored
narrower (``kv_bits``, ``weight_bits``), the target on a larger group of the
platform (``--placement``), a smaller batch, or a schedule that streams layers
from flash with a DRAM budget. Every option is tried through ``overflow``, the
check itself, so a suggestion is never one the check would refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hwprofiles import ModelSpec, Platform
from hwprofiles.schema import Placement
from policies.dryrun import EXIT_HEADS, EXIT_LAYER_HEAD, Answer, Segment, held

LOGIT_BYTES = 4  # logits are kept in fp32 for sampling


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


# The refusal and its remedies -------------------------------------------------
CHUNKS = (8192, 4096, 2048, 1024, 512, 256, 128, 64)  # prefill chunks tried, widest first
NARROWER = (8, 4)  # storage widths tried, widest first


def fits(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
         run: Run) -> bool:
    """Whether the memory check accepts the placement."""
    return overflow(platform, models, placement, run) is None


def fullest_gb(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
               run: Run) -> float:
    """GB the fullest tier (by share of its capacity) must hold."""
    needs = tier_needs(platform, models, placement, run)
    tier = max(needs, key=lambda t: needs[t].total / platform.tier(t).capacity_bytes)
    return needs[tier].total / 1e9


def largest(accepts, low: int, high: int) -> int | None:
    """The largest n in [low, high] that ``accepts`` (monotone: true up to some n,
    false above); None when not even ``low`` is accepted."""
    if not accepts(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if accepts(mid) else (low, mid - 1)
    return low


def remedies(platform: Platform, models: dict[str, ModelSpec], placement: dict[str, str],
             run: Run) -> str:
    """'it would fit with A, B or C' naming each single change that fits; '' when
    none does."""
    options = [text for option in (_chunk, _kv_bits, _weight_bits, _layout, _batch, _stream)
               if (text := option(platform, models, placement, run))]
    if not options:
        return ""
    listed = options[0] if len(options) == 1 else (", ".join(options[:-1]) + " or "
                                                   + options[-1])
    return f"it would fit with {listed}"


def _needing(platform, models, placement, run) -> str:
    return f"{fullest_gb(platform, models, placement, run):.1f} GB"


def _chunk(platform, models, placement, run) -> str:
    current = min(run.prompt_tokens, run.prefill_chunk or run.prompt_tokens)
    for chunk in CHUNKS:
        trial = replace(run, prefill_chunk=chunk)
        if chunk < current and fits(platform, models, placement, trial):
            return (f"--set prefill_chunk={chunk} "
                    f"({_needing(platform, models, placement, trial)})")
    return ""


def _narrower(models: dict[str, ModelSpec], field: str, bits: int) -> dict | None:
    """The models stored at ``bits`` for ``field``; None when none gets narrower."""
    width = {"kv_bits": lambda m: m.kv_elem_bytes, "weight_bits": lambda m: m.weight_elem_bytes}
    if all(width[field](m) * 8 <= bits for m in models.values()):
        return None
    return {role: m.with_precision(**{field: bits}) if width[field](m) * 8 > bits else m
            for role, m in models.items()}


def _bits(field: str, platform, models, placement, run) -> str:
    for bits in NARROWER:
        trial = _narrower(models, field, bits)
        if trial is not None and fits(platform, trial, placement, run):
            return f"--set {field}={bits} ({_needing(platform, trial, placement, run)})"
    return ""


def _kv_bits(platform, models, placement, run) -> str:
    return _bits("kv_bits", platform, models, placement, run)


def _weight_bits(platform, models, placement, run) -> str:
    return _bits("weight_bits", platform, models, placement, run)


def moved(placement: dict[str, str], group: str) -> dict[str, str]:
    """The placement with the target on ``group`` (a draft sharing the target's
    devices moves with it)."""
    out = dict(placement, target=group)
    if placement.get("draft") == placement.get("target"):
        out["draft"] = group
    return out


def _layout(platform, models, placement, run) -> str:
    if "target" not in placement or all(p.role != "target" for p in
                                        pieces(platform, models, placement, run)):
        return ""  # a pipelined target is placed by its stages, not the target role
    now = len(platform.members(placement["target"]))
    for group in sorted(platform.groups, key=lambda g: (g.size, g.name)):
        trial = moved(placement, group.name)
        if group.size > now and fits(platform, models, trial, run):
            return (f"--placement target={group.name} ({group.size} devices, "
                    f"{_needing(platform, models, trial, run)} on the fullest)")
    return ""


def _batch(platform, models, placement, run) -> str:
    if run.batch <= 1:
        return ""
    found = largest(lambda b: fits(platform, models, placement, replace(run, batch=b)),
                    1, run.batch - 1)
    return "" if found is None else f"--batch {found} or less"


def _stream(platform, models, placement, run) -> str:
    """A weight-streaming schedule's largest DRAM budget (in 0.1 GB) that fits."""
    if run.streams_weights or not any(d.storage for d in platform.devices):
        return ""
    target = models["target"]

    def accepts(tenths: int) -> bool:
        trial = Run(None, None, run.prompt_tokens, run.tokens, run.batch, True,
                    run.prefill_chunk, resident_bytes=tenths / 10 * 1e9)
        return fits(platform, {"target": target}, placement, trial)

    whole = int(target.n_layers * target.layer_bytes / 1e8)
    found = largest(accepts, 1, max(1, whole))
    if found is None:
        return ""
    return (f"a schedule that streams layers from flash (--policy ar_stream, kangaroo or "
            f"cats with --set dram_budget_gb={found / 10:g} or less)")


def check_fit(platform: Platform, models: dict[str, ModelSpec],
              placement: dict[str, str], run: Run | None = None) -> None:
    """Raise ValueError, one sentence, when a memory tier the placement uses
    cannot hold its weights, KV cache and activations; the sentence names the
    single changes that would make it fit (``remedies``)."""
    run = run or Run()
    found = overflow(platform, models, placement, run)
    if found is not None:
        tier_name, need, capacity = found
        fix = remedies(platform, models, placement, run) or _fix(platform, need, run)
        raise ValueError(_refusal(platform, tier_name, need, capacity, run, fix))


def _refusal(platform: Platform, tier_name: str, need: TierNeed, capacity: float,
             run: Run, fix: str) -> str:
    devices = ", ".join(need.devices)
    noun = "device" if len(need.devices) == 1 else "devices"
    context = run.prompt_tokens + run.tokens
    return (f"{noun} {devices} of {platform.name} (memory tier {tier_name}, "
            f"{capacity / 1e9:.1f} GB) would need {need.total / 1e9:.1f} GB for "
            f"{', '.join(need.roles)}: weights {need.weights / 1e9:.1f} GB + KV cache "
            f"{need.kv / 1e9:.1f} GB ({context} positions x batch {run.batch}) + "
            f"activations {need.activations / 1e9:.2f} GB; {fix}")


def _fix(platform: Platform, need: TierNeed, run: Run) -> str:
    """What to change when no single change the remedies try makes it fit."""
    prefill_rows = min(run.prompt_tokens, run.prefill_chunk or run.prompt_tokens)
    if need.activations > max(need.kv, need.weights) and prefill_rows > 512:
        return ("prefill the prompt in chunks with --set prefill_chunk=512, or lower "
                "--batch or prompt_tokens")
    if need.kv > need.weights:
        return ("lower --batch, --tokens or prompt_tokens, or store the cache smaller "
                "with --set kv_bits=8")
    if run.streams_weights:
        return "lower --set dram_budget_gb or use a platform with more memory"
    if any(d.storage for d in platform.devices):
        return ("use a schedule that streams layers from flash (--policy cats, kangaroo "
                "or ar_stream with --set dram_budget_gb=...), or --set weight_bits=4")
    return ("place the model on a larger group with --placement, store weights smaller "
            "with --set weight_bits=8 or 4, or choose a larger platform")
