"""What ``hetspec profiles list`` and ``show`` print: one line per profile, and a
compact view of one (alike neighbours summarised, sources left out, totals added)."""

from __future__ import annotations

import re
from collections import defaultdict

DIGITS = re.compile(r"\d+")


def first_sentence(text: str, width: int = 60) -> str:
    sentence = " ".join(text.split()).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[:width - 3].rstrip() + "..."


def provenance(platform) -> str:
    """What a platform's numbers are: 'calibrated' when hetspec calibrate fitted
    some of them (their sources say 'calibrated:', carried ones included),
    'measured' when hetspec's own benchmarks measured them on the machine
    (sources 'measured: python benchmarks/...'), else 'datasheet'
    (specification sheets and published figures only)."""
    texts = [text for obj in (*platform.memory_tiers, *platform.devices, *platform.links,
                              *platform.groups) for text in obj.sources.values()]
    if any("calibrated:" in text for text in texts):
        return "calibrated"
    if any(text.startswith("measured: python benchmarks/") for text in texts):
        return "measured"
    return "datasheet"


def platform_line(platform) -> str:
    """'calibrated; 8 gpu, 8 npu, 8 cpu; 1536 GB memory: Eight Mac Studio M2 Ultra
    nodes ...' (GB: 1e9 bytes)"""
    kinds = defaultdict(int)
    for device in platform.devices:
        kinds[device.kind] += 1
    devices = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    memory_gb = sum(t.capacity_bytes for t in platform.memory_tiers if t.kind != "flash") / 1e9
    return (f"{provenance(platform):10}  {devices}; {memory_gb:,.0f} GB memory: "
            f"{first_sentence(platform.description)}")


def model_line(spec) -> str:
    """'32.8B params, 64 layers, bf16 (Qwen/Qwen3-32B)'"""
    params = spec.total_params
    size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    active = spec.n_layers * spec.layer_active_params + spec.head_params + spec.embed_params
    moe = f", {active / 1e9:.1f}B active" if spec.is_moe else ""
    ids = f" ({', '.join(spec.hf_ids)})" if getattr(spec, "hf_ids", None) else ""
    return f"{size} params{moe}, {spec.n_layers} layers, {spec.dtype}{ids}"


def stack_line(stack) -> str:
    """'layer 410 us, call 2 ms, head sync 0.1 ms, verify 1 ms; serial: Hugging Face...'
    (what it adds; 'adds nothing' for a stack at its defaults)"""
    parts = [f"{label} {_us(getattr(stack, field))}" for field, label in (
        ("layer_host_s", "layer"), ("call_host_s", "call"), ("head_sync_s", "head sync"),
        ("sequence_host_s", "per sequence"), ("verify_host_s", "verify"),
        ("expert_host_s", "expert"), ("topk_step_host_s", "tree step"))
        if getattr(stack, field)]
    if stack.host_device_exponent is not None:
        parts.append(f"host/device overlap p={stack.host_device_exponent:g}")
    if stack.attention_context_factor != 1.0:
        parts.append(f"attention x{stack.attention_context_factor:g}")
    if stack.allreduce_bandwidth_factor != 1.0:
        parts.append(f"all-reduce at {stack.allreduce_bandwidth_factor:.0%} of the group's "
                     "bandwidth")
    if stack.moe_mode != "grouped":
        parts.append(f"MoE {stack.moe_mode}")
    if not stack.devices_overlap:
        parts.append("devices serial")
    what = ", ".join(parts) if parts else "adds nothing"
    return f"{what}: {first_sentence(stack.description)}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} us" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms"


def _without_sources(obj):
    if isinstance(obj, dict):
        return {k: _without_sources(v) for k, v in obj.items() if k != "sources"}
    if isinstance(obj, list):
        return [_without_sources(v) for v in obj]
    return obj


def _shape(item: dict) -> str:
    """An item with every number inside its strings replaced: gpu3 on dram3 and gpu4
    on dram4 have one shape."""
    return DIGITS.sub("#", repr(sorted(item.items())))


def summarise(items: list) -> list:
    """Alike items (same fields, names differing only in their numbers) as one, in
    the order of the first of each, named 'first .. last (N alike)'."""
    groups: dict[str, list] = {}
    for item in items:
        key = _shape(item) if isinstance(item, dict) else repr(item)
        groups.setdefault(key, []).append(item)
    out = []
    for run in groups.values():
        first = run[0]
        if len(run) > 1 and isinstance(first, dict) and "name" in first:
            first = {**first, "name": f"{first['name']} .. {run[-1]['name']} "
                                      f"({len(run)} alike)"}
        out.append(first)
    return out


def compact(data: dict) -> dict:
    data = _without_sources(data)
    return {k: summarise(v) if isinstance(v, list) else v for k, v in data.items()}


def platform_totals(platform) -> dict:
    """Aggregate memory, bandwidth and peak FLOP/s by kind."""
    memory = defaultdict(lambda: [0.0, 0.0])
    for tier in platform.memory_tiers:
        memory[tier.kind][0] += tier.capacity_bytes
        memory[tier.kind][1] += tier.bandwidth_gb_s
    flops = defaultdict(float)
    for device in platform.devices:
        for dtype, peak in device.peak_flops.items():
            flops[f"{device.kind} {dtype}"] += peak
    return {"devices": len(platform.devices),
            "memory": {kind: {"capacity_gb": round(cap / 1e9, 3),
                              "bandwidth_gb_s": round(bw, 3)}
                       for kind, (cap, bw) in memory.items()},
            "peak_tflops": {key: round(v / 1e12, 3) for key, v in flops.items()}}
