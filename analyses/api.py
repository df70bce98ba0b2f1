"""The Python API under the CLI: load profiles, build policies, simulate.

Everything ``hetspec`` does on the command line is a call here, usable as is
from a notebook::

    from analyses.api import SimConfig, simulate
    out = simulate(SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b",
                             draft="llama-3.2-1b", policy="sd",
                             params={"gamma": 5}, acceptance={"kind": "iid", "alpha": 0.8}))
    out.metrics["speedup_vs_ar"]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analyses.config import SimConfig
from hwprofiles import ModelSpec, Platform, load_model, load_platform
from policies import PolicyContext, acceptance, build, entry, parse_params
from simcore import Outcomes, SimResult, Simulator
from simcore.records import write_record
from simcore.trace import write_chrome_trace


@dataclass
class Simulation:
    """A finished simulated run: its config, metrics and raw engine result."""

    config: SimConfig
    metrics: dict
    result: SimResult


def check_placement(platform: Platform, placement: dict[str, str]) -> None:
    """Raise ValueError when a placement names no device or group of the platform."""
    names = [d.name for d in platform.devices] + [g.name for g in platform.groups]
    for role, where in placement.items():
        if not role.strip():
            raise ValueError(f"placement '={where}' has no role; write ROLE=DEVICE, "
                             "e.g. draft=gpu4")
        if where not in names:
            raise ValueError(f"placement {role}={where}: '{where}' is not a device or "
                             f"group of platform {platform.name}; use one of "
                             f"{', '.join(names)}")


def _homes(role: str, spec: ModelSpec, placement: dict[str, str],
           stage_layers: int | None) -> list[tuple[str, float]]:
    """(role it lives on, share of its weights): a pipelined target's layers are
    spread over the stage roles, E layers each (when every stage is placed; the
    schedule names a missing one or a bad exit layer itself)."""
    n = spec.n_layers
    if role != "target" or not stage_layers or stage_layers >= n:
        return [(placement.get(role, role), 1.0)]
    starts = range(0, n, stage_layers)
    if any(f"stage{k}" not in placement for k in range(len(starts))):
        return [(placement.get(role, role), 1.0)]
    return [(placement[f"stage{k}"], (min(a + stage_layers, n) - a) / n)
            for k, a in enumerate(starts)]


def check_fit(platform: Platform, models: dict[str, ModelSpec],
              placement: dict[str, str], stage_layers: int | None = None) -> None:
    """Raise ValueError when resident weights overflow a memory tier
    (``stage_layers``: the target runs as a pipeline of stages that many layers)."""
    need: dict[str, float] = {}
    for role, spec in models.items():
        for where, share in _homes(role, spec, placement, stage_layers):
            members = platform.members(where)
            for m in members:
                tier = platform.device(m).memory
                need[tier] = need.get(tier, 0.0) + share * spec.weight_bytes / len(members)
    streams = any(d.storage for d in platform.devices)
    for tier_name, nbytes in need.items():
        tier = platform.tier(tier_name)
        if nbytes > tier.capacity_bytes:
            roles = ", ".join(f"{r}={models[r].name}" for r in models)
            fix = ("use a schedule that streams layers from flash (--policy cats, kangaroo "
                   "or ar_stream with --set dram_budget_gb=...)" if streams else
                   "place the model on a larger group with --placement or choose a "
                   "larger platform")
            raise ValueError(
                f"the weights of {roles} need {nbytes / 1e9:.1f} GB in memory tier "
                f"{tier_name} of {platform.name}, which holds "
                f"{tier.capacity_bytes / 1e9:.1f} GB; {fix}")


def _models(config: SimConfig) -> dict[str, ModelSpec]:
    models = {"target": load_model(config.target)}
    if config.draft:
        models["draft"] = load_model(config.draft)
    return models


def run_schedule(config: SimConfig, *, record_spans: bool = True,
                 outcomes_factory=Outcomes, rewrite=None,
                 platform: Platform | None = None) -> SimResult:
    """Simulate one configuration and return the engine's raw result.

    ``outcomes_factory(acceptance_model, seed=, deterministic=)`` builds the
    outcome source; pass an Outcomes subclass to observe or replay outcomes.
    ``rewrite(schedule) -> schedule`` wraps the policy's generator (a replay
    gives Forwards the work a measured run did for them). ``platform``, when
    given, is simulated instead of loading ``config.platform`` (a calibration
    tries candidate profiles in memory)."""
    platform = platform if platform is not None else load_platform(config.platform)
    models = _models(config)
    pol = entry(config.policy)
    params = parse_params(config.policy, config.params)
    check_placement(platform, config.placement)
    placement = {**platform.placement, **config.placement}
    if not pol.streams_weights:
        check_fit(platform, models, placement, getattr(params, "stage_layers", None))
    ctx = PolicyContext(target=models["target"], draft=models.get("draft"),
                        tokens=config.tokens, batch=config.batch,
                        prompt_tokens=config.prompt_tokens,
                        fixed_context=config.fixed_context,
                        expected_outcomes=config.deterministic)
    schedule = build(config.policy, ctx, params)
    if rewrite is not None:
        schedule = rewrite(schedule)
    acc = acceptance.build(**config.acceptance)
    outcomes = outcomes_factory(acc, seed=config.seed,
                                deterministic=config.deterministic)
    sim = Simulator(platform, models, outcomes, placement=config.placement,
                    contention=config.contention, record_spans=record_spans)
    return sim.run(schedule)


def metrics_of(config: SimConfig, result: SimResult) -> dict:
    steps = result.stats.get("steps", result.steps) or 1
    out = {
        "policy": config.policy, "platform": config.platform, "target": config.target,
        "draft": config.draft, "batch": config.batch, "seed": config.seed,
        "deterministic": config.deterministic,
        "tokens": result.tokens,
        "simulated_time_s": result.time_s,
        "tokens_per_s": result.tokens / result.time_s if result.time_s else 0.0,
        "steps": steps,
        "mean_tokens_per_step": result.tokens / (steps * config.batch),
        "step_latency_s": result.time_s / steps,
    }
    for key, value in result.stats.items():
        out.setdefault(key, value)
    for event, rate in sorted(result.outcome_rates.items()):
        out.setdefault(f"{event}_rate", rate)
    timeline = entry(config.policy).timeline
    if timeline is not None and result.spans:
        for key, value in timeline(result.spans).items():
            out.setdefault(key, value)
    return out


def baseline_config(config: SimConfig) -> SimConfig:
    """The autoregressive run a configuration's speedup is measured against."""
    params = parse_params(config.policy, config.params)
    name, base_params = entry(config.policy).baseline(params)
    return config.model_copy(update={"policy": name, "params": base_params, "draft": None,
                                     "placement": {k: v for k, v in config.placement.items()
                                                   if k != "draft"}})


def simulate(config: SimConfig, *, trace_path: str | Path | None = None,
             record_path: str | Path | None = None, baseline: bool = True) -> Simulation:
    """Simulate a configuration; with ``baseline`` also its AR baseline for
    ``speedup_vs_ar``. Writes a Chrome trace and a run record when paths are given."""
    result = run_schedule(config)
    metrics = metrics_of(config, result)
    if baseline:
        base_cfg = baseline_config(config)
        if base_cfg.policy == config.policy and base_cfg.params == config.params:
            metrics["speedup_vs_ar"] = 1.0
        else:
            base = run_schedule(base_cfg, record_spans=False)
            base_tps = base.tokens / base.time_s
            metrics["ar_tokens_per_s"] = base_tps
            metrics["speedup_vs_ar"] = metrics["tokens_per_s"] / base_tps
    if trace_path is not None:
        write_chrome_trace(trace_path, result.spans, process=f"simulated {config.policy}",
                           metadata=config.model_dump(mode="json"))
        metrics["trace"] = str(trace_path)
    if record_path is not None:
        write_record(record_path, kind="simulated", inputs=config.model_dump(mode="json"),
                     metrics=metrics, trace=str(trace_path) if trace_path else None)
        metrics["run_record"] = str(record_path)
    return Simulation(config, metrics, result)


def law(name: str, **params) -> dict:
    """Evaluate a closed-form law by name (see analyses.laws.LAWS)."""
    from analyses.laws import LAWS

    if name not in LAWS:
        raise ValueError(f"unknown law '{name}'; choose one of {', '.join(LAWS)}")
    import inspect

    accepted = inspect.signature(LAWS[name]).parameters
    for key in params:
        if key not in accepted:
            raise ValueError(f"law '{name}' has no parameter '{key}'; its parameters are "
                             f"{', '.join(accepted)}")
    missing = [k for k, p in accepted.items()
               if p.default is inspect.Parameter.empty and k not in params]
    if missing:
        raise ValueError(f"law '{name}' needs {', '.join(missing)}; pass each with "
                         f"--set {missing[0]}=VALUE")
    return LAWS[name](**params)
