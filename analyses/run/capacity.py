"""What fits: the largest batch, the longest context, the fewest devices and the
parallel layouts of a platform's groups, by the memory check every run passes.

Every answer is a search over the check itself (``analyses.run.memory.overflow``
on the run's ``memory_request``, as ``run_schedule`` calls it), so the largest
batch found is one the check accepts and one more is refused. Memory grows with
the batch and with the context, so a bisection finds the edge.

A layout places the target on one of the platform's groups (tensor parallel
over its members) or on one device; a draft that shares the target's devices
by default moves with it. A mixture-of-experts target is tried tensor-parallel
and expert-parallel on each group; an AR target is also tried as a pipeline over
the platform's stage roles (stage0, stage1, ...: the pipelined AR baseline).
"""

from __future__ import annotations

from dataclasses import dataclass

from analyses.run.api import check_platform, memory_request, run_models
from analyses.run.config import MAX_BATCH, MAX_PROMPT_TOKENS, RunConfig
from analyses.run.memory import TierNeed, largest, moved, overflow, tier_needs
from hwprofiles import Platform, load_model, load_platform
from hwprofiles.schema import check_overrides, resolve
from policies import entry

# bisection steps of one search (batch up to MAX_BATCH, context up to the cap)
BATCH_STEPS = MAX_BATCH.bit_length() + 1
CONTEXT_STEPS = MAX_PROMPT_TOKENS.bit_length() + 1


@dataclass(frozen=True)
class Layout:
    """Where the target runs: a group (tensor parallel over its members), one
    device, or pipeline stages (``stages`` > 0: pipelined AR over roles stage0,
    stage1, ...); expert-parallel or not; ``placement`` the run's overrides."""

    where: str
    devices: int
    placement: tuple[tuple[str, str], ...]
    expert_parallel: bool = False
    stages: int = 0

    @property
    def label(self) -> str:
        if self.stages:
            return f"PP{self.stages} ({self.where})"
        kind = "EP" if self.expert_parallel else "TP"
        return f"{kind}{self.devices} ({self.where})"

    def config(self, config: RunConfig) -> RunConfig:
        """``config`` on this layout, validated once (a pipeline sets the
        schedule's own pipelined parameters, ``PolicyParams.pipelined``)."""
        changes = {"placement": dict(self.placement), "expert_parallel": self.expert_parallel}
        if self.stages:
            n_layers = load_model(config.target).n_layers
            staged = entry(config.policy).params.pipelined(-(-n_layers // self.stages))
            changes["params"] = {**config.given("params"), **staged}
        return config.revised(**changes)


def layouts(platform: Platform, config: RunConfig) -> list[Layout]:
    """Every layout of the platform's groups, fewest devices first: each group,
    and the target's first device alone; for AR, pipelines over the platform's
    stage roles."""
    check_overrides(platform, config.placement)
    base = resolve(platform, config.placement)
    first = platform.members(base["target"])[0]
    places = [(first, 1)] + [(g.name, g.size) for g in sorted(
        platform.groups, key=lambda g: (g.size, g.name))]
    moe = load_model(config.target).is_moe
    out = []
    for where, size in places:
        overrides = tuple(sorted(moved(base, where).items()))
        out.append(Layout(where, size, overrides))
        if moe and size > 1:
            out.append(Layout(where, size, overrides, expert_parallel=True))
    return out + pipelines(platform, config, base)


def pipelines(platform: Platform, config: RunConfig, base: dict[str, str]) -> list[Layout]:
    """The schedule pipelined (``PolicyParams.pipelined``: AR's) over 2, 4, 8, ...
    of the stage roles the placement names (the layers split evenly, ceil(N/P) a
    stage); none for a schedule without a pipelined form."""
    if entry(config.policy).params.pipelined(1) is None:
        return []
    roles = 0
    while f"stage{roles}" in base:
        roles += 1
    n_layers = load_model(config.target).n_layers
    out, stages = [], 2
    while stages <= min(roles, n_layers):
        used = -(-n_layers // -(-n_layers // stages))  # stages ceil(N/P)-layer stages fill
        devices = {m for k in range(used) for m in platform.members(base[f"stage{k}"])}
        out.append(Layout(f"stage0..stage{used - 1}", len(devices), (), stages=used))
        stages *= 2
    return out


def at(config: RunConfig, **changes) -> RunConfig:
    """A layout's config with ``changes`` (batch, prompt_tokens): fields the
    memory check reads, copied without revalidating."""
    return config.model_copy(update=changes)


def overflows(config: RunConfig, platform: Platform) -> tuple[str, TierNeed, float] | None:
    """The memory check of ``run_schedule``: the first tier it overflows, or None."""
    placement = resolve(platform, config.placement)
    return overflow(platform, run_models(config), placement, memory_request(config))


def accepted(config: RunConfig, platform: Platform) -> bool:
    return overflows(config, platform) is None


def largest_batch(config: RunConfig, platform: Platform, context: int) -> int | None:
    """The largest batch the check accepts at ``context`` prompt tokens
    (``config`` on its layout: Layout.config)."""
    return largest(lambda b: accepted(at(config, batch=b, prompt_tokens=context), platform),
                   1, MAX_BATCH)


def context_cap(config: RunConfig) -> int:
    """The longest prompt the run's models have positions for (``max_positions``
    less the generated tokens, unless fixed_context), at most ``MAX_PROMPT_TOKENS``."""
    grown = 0 if config.fixed_context else config.tokens
    limits = [s.max_positions - grown for s in run_models(config).values()
              if s.max_positions is not None]
    return max(0, min([MAX_PROMPT_TOKENS, *limits]))


def longest_context(config: RunConfig, platform: Platform, batch: int) -> int | None:
    """The longest prompt (context before decoding) the check accepts at ``batch``,
    within the models' trained positions (``context_cap``)."""
    return largest(lambda c: accepted(at(config, batch=batch, prompt_tokens=c), platform),
                   0, context_cap(config))


def breakdown(config: RunConfig, platform: Platform) -> list[dict]:
    """Per device the placement uses: its tier's weights, KV cache, activations,
    total and capacity in bytes (devices sharing a tier share one row)."""
    needs = tier_needs(platform, run_models(config), resolve(platform, config.placement),
                       memory_request(config))
    return [{"devices": need.devices, "tier": name, "roles": need.roles,
             "weights_bytes": need.weights, "kv_bytes": need.kv,
             "activations_bytes": need.activations, "total_bytes": need.total,
             "capacity_bytes": platform.tier(name).capacity_bytes}
            for name, need in needs.items()]


def why_not(config: RunConfig, platform: Platform) -> str:
    """'weights 141.1 GB + ... = 142.0 GB > 80.0 GB on gpu0' for a refused config."""
    found = overflows(config, platform)
    if found is None:
        return "fits"
    tier, need, capacity = found
    return (f"needs {need.total / 1e9:.1f} GB on {need.devices[0]} (weights "
            f"{need.weights / 1e9:.1f} GB) of {capacity / 1e9:.1f} GB")


def fit_report(config: RunConfig, contexts: list[int], batches: list[int],
               progress=None) -> dict:
    """Per layout: the largest batch at each context, the longest context at each
    batch, and the memory breakdown at the first context's largest batch (or
    why batch 1 does not fit); the fewest devices that fit batch ``batches[0]``
    at ``contexts[0]``."""
    platform = load_platform(config.platform)
    rows = []
    for layout in layouts(platform, config):
        rows.append(_layout_row(config, platform, layout, contexts, batches))
        if progress is not None:
            progress()
    fitting = [r for r in rows if r["fits_first"]]
    fewest = min(fitting, key=lambda r: r["devices"]) if fitting else None
    return {"platform": platform.name, "target": config.target, "draft": config.draft,
            "policy": config.policy, "tokens": config.tokens,
            "fixed_context": config.fixed_context, "contexts": contexts,
            "context_cap": context_cap(config),
            "batches": batches, "layouts": rows,
            "fewest_devices": None if fewest is None else {
                "devices": fewest["devices"], "layout": fewest["layout"],
                "batch": batches[0], "context": contexts[0]}}


def _layout_row(config, platform, layout, contexts, batches) -> dict:
    config = layout.config(config)
    check_platform(config, platform)  # what simulate refuses whatever the batch
    largest_batches = {c: largest_batch(config, platform, c) for c in contexts}
    longest = {b: longest_context(config, platform, b) for b in batches}
    edge = largest_batches[contexts[0]]
    shown = at(config, batch=edge or 1, prompt_tokens=contexts[0])
    first = at(config, batch=batches[0], prompt_tokens=contexts[0])
    return {"layout": layout.label, "where": layout.where, "devices": layout.devices,
            "expert_parallel": layout.expert_parallel, "pipeline_stages": layout.stages,
            "placement": dict(layout.placement), "params": config.given("params"),
            "largest_batch": largest_batches, "longest_context": longest,
            "fits_first": accepted(first, platform),
            "memory": breakdown(shown, platform), "memory_batch": edge,
            "why_not": None if edge else why_not(shown, platform)}


def checks_count(config: RunConfig, contexts: list[int], batches: list[int]) -> int:
    """Memory checks a fit report runs at most (its budget's units)."""
    platform = load_platform(config.platform)
    per_layout = len(contexts) * BATCH_STEPS + len(batches) * CONTEXT_STEPS + 4
    return len(layouts(platform, config)) * per_layout
