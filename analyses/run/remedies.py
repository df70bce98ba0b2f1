"""The memory check's refusal (``check_fit``) and what would make a refused
placement fit: each single change, with its number.

``check_fit`` refuses a placement whose memory tier overflows (the needs are
``analyses.run.memory``'s). Its sentence then names every single change that makes the same
check pass, each with the value that does it: the prompt prefilled in chunks
(``prefill_chunk``), the KV cache or the weights stored narrower (``kv_bits``,
``weight_bits``), the target on a larger group of the platform
(``--placement``), a smaller batch, or a schedule that streams layers from
flash with a DRAM budget. Every option is tried through ``overflow``, the
check itself, so a suggestion is never one the check would refuse.
"""

from __future__ import annotations

from dataclasses import replace

from hwprofiles import ModelSpec, Platform
from analyses.run.memory import Run, TierNeed, overflow, pieces, tier_needs

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
