"""The Python API under the CLI: load profiles, build policies, simulate.

Everything ``hetspec`` does on the command line is a call here, usable as is
from a notebook::

    from analyses.run.api import RunConfig, simulate
    out = simulate(RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b",
                             draft="llama-3.2-1b", policy="sd",
                             params={"gamma": 5}, acceptance={"kind": "iid", "alpha": 0.8}))
    out.metrics["speedup_vs_ar"]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analyses.run.config import RunConfig, SimConfig  # noqa: F401 (SimConfig: the API's old name)
from analyses.run.memory import Run, check_fit
from hwprofiles import ModelSpec, Platform, Stack, load_model, load_platform, load_stack
from hwprofiles.schema import check_overrides, resolve
from policies import PolicyContext, build, build_prefill, entry, outcome_models
from policies.base import baseline_of
from policies.dryrun import held, uses_draft
from policies.runs.breakdown import breakdown, operator_table
from policies.runs.files import write_chrome_trace, write_record
from policies.runs.metrics import add_speedup, run_metrics
from simcore import Outcomes, RooflineCost, SimResult, Simulator, acceptance
from simcore.costmodel import compute_peak


@dataclass
class Simulation:
    """A finished simulated run: its config, metrics and raw engine result."""

    config: RunConfig
    metrics: dict
    result: SimResult


def run_models(config: RunConfig) -> dict[str, ModelSpec]:
    """The run's models at its precision and expert sharding (config.run_model:
    expert_parallel shards the mixture-of-experts models among them)."""
    models = {"target": config.run_model(load_model(config.target))}
    if config.draft:
        models["draft"] = config.run_model(load_model(config.draft))
    return models


def check_expert_parallel(config: RunConfig) -> None:
    """expert_parallel=on is a mistake when the scenario (its target and draft) has
    no mixture of experts. Judged on what the user asked for, not per run: an AR
    baseline or an ``ar`` point drops a mixture-of-experts draft, and runs."""
    if config.expert_parallel and not any(
            load_model(name).is_moe for name in (config.target, config.draft) if name):
        raise ValueError("expert_parallel=on needs a mixture-of-experts target or draft "
                         "(a model with n_experts, e.g. qwen3-30b-a3b); drop the setting")
    if config.expert_parallel:
        check_expert_group(config)


def check_used(config: RunConfig, models: dict[str, ModelSpec] | None = None) -> None:
    """A policy parameter this run's configuration of the schedule ignores
    (``PolicyParams.unused``: fast_backup_s with backup=jit, omega beside
    omega_trace, ...) is refused: the run would look like it took it.
    ``models``: the run's model specs where its names are not profiles (a
    measured run's ``self:N``, ``random:`` or checkpoint models); default
    ``run_models``."""
    why = config.params.unused()
    if why:
        raise ValueError(f"policy '{config.policy}': {why}")
    if config.draft and not uses_draft(config.policy, config.params,
                                       models or run_models(config)):
        raise ValueError(f"--draft {config.draft} has no effect with policy "
                         f"'{config.policy}' (it drafts from the target's own layers, or "
                         "not at all); drop --draft")


def check_positions(config: RunConfig, models: dict[str, ModelSpec] | None = None,
                    prompt: str = "prompt_tokens", fix: str | None = None) -> None:
    """A run whose context (its prompt, and the tokens it generates unless
    fixed_context) passes a model's trained positions (``ModelSpec.max_positions``)
    is refused: the model has no position for them. ``models``: the run's specs
    (default ``run_models``); ``prompt`` names the prompt in the sentence and
    ``fix`` says what to change (default: lower it or --tokens)."""
    grown = 0 if config.fixed_context else config.tokens
    context = config.prompt_tokens + grown
    for role, spec in (models or run_models(config)).items():
        if spec.max_positions is not None and context > spec.max_positions:
            tokens = f" + {grown:,} generated tokens" if grown else ""
            fix = fix or f"lower {prompt}{' or --tokens' if grown else ''}"
            raise ValueError(
                f"{prompt} {config.prompt_tokens:,}{tokens} = {context:,} positions pass the "
                f"{spec.max_positions:,} the {role} model {spec.name} was trained for "
                f"(its max_positions); {fix}")


def check_platform(config: RunConfig, platform: Platform,
                   models: dict[str, ModelSpec] | None = None) -> None:
    """What the devices the run is placed on must offer whatever its size: the
    peak its matrix products are priced at (``compute_bits=8`` needs an 8-bit one,
    ``simcore.costmodel.compute_peak``). ``simulate`` and ``fit`` (each of its
    layouts) ask this one check, so that they accept the same runs."""
    placement = resolve(platform, config.placement)
    models = models or run_models(config)
    roles = {"target": models["target"], "draft": models.get("draft", models["target"])}
    roles.update({r: models["target"] for r in placement if r.startswith("stage")})
    for role, spec in roles.items():
        try:
            members = platform.members(placement[role])
        except (KeyError, ValueError):  # a role this platform places nowhere
            continue
        for name in members:
            compute_peak(platform.device(name), spec)


def moe_roles(config: RunConfig, platform: Platform) -> dict[str, str]:
    """{role: model name} of the roles a mixture-of-experts model may hold: the
    target's own roles (its pipeline stages and a self-draft's ``draft`` among
    them) and the draft's."""
    roles = {}
    if load_model(config.target).is_moe:
        stages = [r for r in {**platform.placement, **config.placement}
                  if r.startswith("stage")]
        roles.update({r: config.target for r in ("target", "draft", *stages)})
    if config.draft and load_model(config.draft).is_moe:
        roles["draft"] = config.draft
    return roles


def check_expert_group(config: RunConfig) -> None:
    """expert_parallel=on shards experts over a group's members: where every
    mixture-of-experts model sits on one device it changes nothing, so it is
    refused (a dense model is refused above for the same reason)."""
    platform = load_platform(config.platform)
    check_overrides(platform, config.placement)
    placement = resolve(platform, config.placement)
    alone = []
    for role, model in moe_roles(config, platform).items():
        try:
            members = platform.members(placement[role])
        except (KeyError, ValueError):  # a role this platform places nowhere
            continue
        if len(members) > 1:
            return
        alone.append(f"{model} on {placement[role]}")
    where = ", ".join(dict.fromkeys(alone))
    raise ValueError(f"expert_parallel=on has no effect: every mixture-of-experts model "
                     f"sits on one device ({where}) and experts are sharded only over a "
                     "group; place it on a group with --placement (e.g. target=GROUP) or "
                     "drop the setting")


def check_schedule(policy: str, ctx: PolicyContext, params) -> None:
    """Run the schedule to its first operation and drop it: its own checks of its
    parameters against the models (a layer beyond the target, a tree wider than
    its nodes) speak first, before the memory check, whose refusal would name a
    consequence of the value (draft_layers=500 needs 860 GB) instead of the value."""
    schedule = build(policy, ctx, params)
    try:
        next(schedule)
    except StopIteration:
        pass
    finally:
        schedule.close()


def _context(config: RunConfig, models: dict[str, ModelSpec], acc) -> PolicyContext:
    return PolicyContext(target=models["target"], draft=models.get("draft"),
                         tokens=config.tokens, batch=config.batch,
                         prompt_tokens=config.prompt_tokens,
                         fixed_context=config.fixed_context,
                         expected_outcomes=config.deterministic,
                         prefill_chunk=config.prefill_chunk, acceptance=acc)


def _check_before(config: RunConfig, platform: Platform, models: dict[str, ModelSpec],
                  checks=()) -> None:
    """What a run checks before it simulates: the placement, the schedule's own
    checks of its parameters, ``checks`` and the memory check."""
    check_overrides(platform, config.placement)
    # its own acceptance copy: the check's first steps move no cursor of the run's
    ctx = _context(config, models, config.acceptance.model_copy())
    check_schedule(config.policy, ctx, config.params)
    for check in checks:
        check(config)
    check_positions(config, models)
    check_platform(config, platform, models)
    if config.memory_check:
        check_fit(platform, models, resolve(platform, config.placement),
                  memory_request(config))


def check_runnable(config: RunConfig) -> None:
    """Raise ValueError, one sentence, where ``run_schedule`` would refuse ``config``
    without simulating it: the checks a run makes before it simulates, and a
    device a streaming schedule streams weights to that has no storage tier (the
    schedule's dry run names its devices, ``policies.dryrun``)."""
    platform = load_platform(config.platform)
    models = run_models(config)
    _check_before(config, platform, models)
    placement = resolve(platform, config.placement)
    answer = held(config.policy, config.params, models, config.prompt_tokens)
    for role in sorted({s.device for s in answer.segments if s.streamed}):
        device = platform.device(platform.members(placement[role])[0])
        if device.storage is None:
            raise ValueError(f"device {device.name} of platform {platform.name} has no "
                             "storage tier to stream weights from; set its 'storage'")


def memory_request(config: RunConfig) -> Run:
    """What sizes the run's memory for the check every run passes: the KV cache
    holds the context the run models (with fixed_context every step sees
    prompt_tokens, otherwise the cache grows by the generated tokens)."""
    grown = 0 if config.fixed_context else config.tokens
    return Run(config.policy, config.params, config.prompt_tokens, grown, config.batch,
               entry(config.policy).streams_weights, config.prefill_chunk)


def run_schedule(config: RunConfig, *, record_spans: bool = True,
                 outcomes_factory=Outcomes, rewrite=None,
                 prefill: bool = True,
                 platform: Platform | None = None, checks=(),
                 stack: Stack | None = None) -> SimResult:
    """Simulate one configuration and return the engine's raw result.

    ``outcomes_factory(acceptance_model, seed=, deterministic=, models=)`` builds
    the outcome source, ``models`` the schedule's outcome models
    (``policies.base``); pass an Outcomes subclass to observe or replay
    outcomes.
    ``rewrite(schedule) -> schedule`` wraps the policy's generator (a replay
    gives Forwards the work a measured run did for them).

    With ``prefill`` the schedule's prologue (the prompt's prefill) runs first,
    in a simulation of its own on idle hardware, and its time is the result's
    ``prefill_s``: decoding then starts at time 0 from the same state as without
    it, so every decode metric is the same with or without the prefill.

    ``platform``, when given, is simulated instead of loading ``config.platform``
    (a calibration tries candidate profiles in memory); ``stack``, likewise,
    instead of loading ``config.stack`` (a stack's fit). ``checks``: functions of
    the config run after the schedule's own parameter checks and before the
    memory check (``simulate`` refuses there what the run would ignore)."""
    platform = platform if platform is not None else load_platform(config.platform)
    models = run_models(config)
    params = config.params
    # a copy per run: a trace's replay cursor starts at its first step every run
    acc = config.acceptance.model_copy()
    ctx = _context(config, models, acc)
    _check_before(config, platform, models, checks)
    schedule = build(config.policy, ctx, params)
    if rewrite is not None:
        schedule = rewrite(schedule)
    outcomes = outcomes_factory(acc, seed=config.seed, deterministic=config.deterministic,
                                models=outcome_models(config.policy, ctx, params))

    cost = RooflineCost(platform, stack if stack is not None else load_stack(config.stack))

    def simulator():  # a fresh engine; the prologue asks the outcome source nothing
        return Simulator(platform, models, outcomes, placement=config.placement,
                         contention=config.contention, record_spans=record_spans,
                         cost=cost)

    before = simulator().run(build_prefill(config.policy, ctx, params)) if prefill else None
    result = simulator().run(schedule)
    if before is not None:
        result.prefill_s, result.prefill_spans = before.time_s, before.spans
        result.stats = {**before.stats, **result.stats}
    return result


def metrics_of(config: RunConfig, result: SimResult, *, why: bool = True) -> dict:
    """The run's metrics; with ``why`` (and spans) where its time went
    (policies.runs.breakdown), which a sweep leaves to its best points."""
    steps = result.stats.get("steps", result.steps) or 1
    out = run_metrics(config, tokens=result.tokens, time_s=result.time_s, steps=steps,
                      rows_per_step=config.batch)
    out.update(latency_metrics(config, result))
    for key, value in result.stats.items():
        out.setdefault(key, value)
    for event, rate in sorted(result.outcome_rates.items()):
        out.setdefault(f"{event}_rate", rate)
    if why and result.spans:
        out["breakdown"] = breakdown(result.spans, tokens=result.tokens / config.batch,
                                     steps=steps, start_s=0.0, end_s=result.time_s)
    timeline = entry(config.policy).timeline
    if timeline is not None and result.spans:
        for key, value in timeline(result.spans).items():
            out.setdefault(key, value)
    return out


def latency_metrics(config: RunConfig, result: SimResult) -> dict:
    """A request's view: ``ttft_s``, the prefill plus the decoding up to the first
    committed token; ``tpot_s``, decoding time per generated token of a sequence
    (batch / tokens_per_s, the prefill excluded)."""
    first = result.first_token_s
    return {"prompt_tokens": config.prompt_tokens, "prefill_s": result.prefill_s,
            "ttft_s": None if first is None else result.prefill_s + first,
            "tpot_s": result.time_s * config.batch / result.tokens if result.tokens
            else None}


def timeline_spans(result: SimResult) -> list:
    """The run's spans on one timeline: the prefill from 0, then the decoding
    shifted by the prefill's time."""
    shift = result.prefill_s
    if not shift:
        return list(result.prefill_spans) + list(result.spans)
    return list(result.prefill_spans) + [s._replace(start_s=s.start_s + shift,
                                                    end_s=s.end_s + shift)
                                         for s in result.spans]


def baseline_config(config: RunConfig) -> RunConfig:
    """The autoregressive run a configuration's speedup is measured against (the
    configuration itself when it is its own baseline)."""
    name, base_params = (baseline_of(config.policy, config.params)
                         or (config.policy, config.given("params")))
    return config.revised(policy=name, params=base_params, draft=None,
                          placement={k: v for k, v in config.placement.items()
                                     if k != "draft"})


def baseline_tokens_per_s(config: RunConfig) -> float:
    """Tokens/s of the configuration's baseline, simulated without spans."""
    base = run_schedule(baseline_config(config), record_spans=False)
    return base.tokens / base.time_s


def simulate(config: RunConfig, *, trace_path: str | Path | None = None,
             record_path: str | Path | None = None, baseline: bool = True) -> Simulation:
    """Simulate a configuration; with ``baseline`` also its AR baseline for
    ``speedup_vs_ar``. Writes a Chrome trace and a run record when paths are given."""
    check_expert_parallel(config)
    result = run_schedule(config, checks=(check_used,))
    metrics = metrics_of(config, result)
    if result.spans:
        metrics["operators"] = operators_of(config, result.spans)
    if baseline:
        own = baseline_of(config.policy, config.params) is None
        add_speedup(metrics, None if own else baseline_tokens_per_s(config), own_baseline=own)
    if trace_path is not None:
        write_chrome_trace(trace_path, timeline_spans(result),
                           process=f"simulated {config.policy}",
                           metadata=config.model_dump(mode="json"))
        metrics["trace"] = str(trace_path)
    if record_path is not None:
        write_record(record_path, kind="simulated", inputs=config.model_dump(mode="json"),
                     metrics=metrics, trace=str(trace_path) if trace_path else None)
        metrics["run_record"] = str(record_path)
    return Simulation(config, metrics, result)


def operators_of(config: RunConfig, spans) -> list[dict]:
    """The run's per-operator table (policies.runs.breakdown) on its platform, peaks
    taken at the target's dtype."""
    dtype = "fp8" if config.compute_bits == 8 else load_model(config.target).dtype
    return operator_table(spans, load_platform(config.platform), dtype)
