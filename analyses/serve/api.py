"""``serve``: a serving simulation of one schedule on one platform, and its capacity.

    from analyses.serve.api import ServeConfig, serve
    out = serve(ServeConfig.build(platform="h100-sxm-8x", target="llama-3.1-70b",
                                  draft="llama-3.2-1b", policy="sd", sets={"gamma": 4},
                                  rate=4, requests=200, slo="ttft=0.5,tpot=0.05"))
    out.metrics["slo"]["holds"]

Requests arrive (``analyses.serve.workload``), a continuous-batching engine forms
each step's batch (``analyses.serve.engine``) and the schedule is asked for one
step of it, priced by the cost model ``simulate`` uses
(``analyses.serve.pricing``); ``analyses.serve.metrics`` turns the run into its
figures. ``capacity`` bisects the highest arrival rate whose run meets the SLO.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from analyses.run.api import (baseline_config, check_platform, check_positions, check_used,
                              run_models)
from analyses.run.config import RunConfig, split_sets
from analyses.run.memory import Run, check_fit
from analyses.serve.engine import Engine, Mode, Served
from analyses.serve.metrics import SLO, parse_slo, request_rows, serve_metrics, timeline
from analyses.serve.pricing import StepPricer, kv_capacity, reserved_positions
from analyses.serve.workload import (LENGTHS, Request, check_concurrency, check_count,
                                     check_rate, read_trace, synthetic)
from hwprofiles import load_platform, load_stack
from hwprofiles.schema import check_overrides, resolve
from hwprofiles.writing import atomic_write_text
from policies import entry, names
from policies.base import AR
from policies.runs.files import write_record

SERVE_STACK = "vllm"  # serving engines pay host work per step; hwprofiles/data/stacks
MAX_BATCH = 256  # vLLM's default max_num_seqs
TOKEN_BUDGET = 8192  # tokens a step schedules (vLLM's max_num_batched_tokens default)
AUTO_GAMMAS = (1, 2, 3, 4, 5, 6, 8)  # draft lengths gamma=auto chooses among, beside off
SERVE_KEYS = {"alpha_spread": "standard deviation of each request's own acceptance "
                              "(beta-distributed about alpha; default 0: one alpha)",
              "switch_s": "seconds a step pays when gamma=auto changes the draft length "
                          "(default 0)",
              "max_batch": f"most requests decoded in one step (default {MAX_BATCH}, "
                           "vLLM's max_num_seqs)",
              "token_budget": f"positions one step schedules, decode and prefill "
                              f"(default {TOKEN_BUDGET}, vLLM's max_num_batched_tokens)"}


@dataclass(frozen=True)
class ServeConfig:
    """A serving run: the schedule's run (``run``: platform, models, policy and its
    parameters, acceptance, stack, placement, seed), the workload, the engine's
    limits and the SLO. ``auto``: the tuned parameter is chosen each step
    (gamma=auto). ``exact``: every step priced itself (no grid). ``prefill_apart``:
    prefills run as passes of their own, as the torch executor runs them."""

    run: RunConfig
    rate: float | None = None
    concurrency: int | None = None
    requests: int = 1000
    workload: str = "chat"
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cv: float = 1.0
    trace: str | None = None
    alpha_spread: float = 0.0
    max_batch: int = MAX_BATCH
    token_budget: int = TOKEN_BUDGET
    slo: SLO = field(default_factory=SLO)
    auto: bool = False
    switch_s: float = 0.0
    exact: bool = False
    prefill_apart: bool = False  # prefills as passes of their own (a replay)

    @classmethod
    def build(cls, *, platform: str, target: str, draft: str | None = None,
              policy: str, sets: dict | None = None, slo: str | None = None,
              slo_percentile: float = 90.0, seed: int = 0, deterministic: bool = False,
              placement: dict | None = None, stack: str | None = None, **workload):
        """A config from the command's words: ``sets`` as --set gives them (policy
        parameters, acceptance, run options and the serving keys, ``SERVE_KEYS``;
        gamma=auto for adaptive speculation)."""
        sets = dict(sets or {})
        serve = {k: sets.pop(k) for k in list(sets) if k in SERVE_KEYS}
        tuned = entry(policy).tuned
        auto = False
        if tuned and isinstance(sets.get(tuned.key), str) and sets[tuned.key] == "auto":
            sets.pop(tuned.key)
            auto = True
        for key, value in sets.items():
            if value == "auto":
                if tuned is None:
                    raise ValueError(f"--set {key}=auto: policy '{policy}' has no draft "
                                     f"length to choose each step; drop --set {key}")
                raise ValueError(f"--set {key}=auto: only policy '{policy}''s draft "
                                 f"length, {tuned.key}, is chosen each step; give {key} "
                                 "a value")
        params, acc, run = split_sets(policy, sets)
        if "prompt_tokens" in run:
            raise ValueError("--set prompt_tokens does not apply to serve: each request "
                             "has its own prompt; use --prompt-tokens or a workload")
        if stack is not None and "stack" in run:
            raise ValueError("--stack and --set stack= both name a stack; keep one")
        run.setdefault("stack", stack or SERVE_STACK)
        config = RunConfig(platform=platform, target=target, draft=draft, policy=policy,
                           params=params, acceptance=acc, seed=seed,
                           deterministic=deterministic, placement=placement or {}, **run)
        for key in ("max_batch", "token_budget"):
            if key in serve:
                value = serve[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"--set {key}={value} must be a whole number >= 1")
        if "switch_s" in serve and (not isinstance(serve["switch_s"], (int, float))
                                    or isinstance(serve["switch_s"], bool)
                                    or not 0 <= serve["switch_s"] < 10):
            raise ValueError(f"--set switch_s={serve['switch_s']} must be seconds in [0, 10)")
        if "switch_s" in serve and not auto:
            raise ValueError("--set switch_s prices changes of gamma=auto; set gamma=auto "
                             "or drop switch_s")
        if "alpha_spread" in serve:
            spread = serve["alpha_spread"]
            if isinstance(spread, bool) or not isinstance(spread, (int, float)):
                raise ValueError(f"--set alpha_spread={spread} is not a number")
        return cls(run=config, slo=parse_slo(slo, slo_percentile), auto=auto,
                   **serve, **workload)


@dataclass
class Serving:
    """A finished serving run: its config, figures and the engine's raw result."""

    config: ServeConfig
    metrics: dict
    served: Served
    modes: list[Mode]


# the workload --------------------------------------------------------------------
def requests_of(config: ServeConfig) -> list[Request]:
    """The workload's requests: a trace's, or synthetic ones arriving at ``rate``;
    with ``concurrency`` alone, all ready at 0 (the engine's clients keep
    ``concurrency`` in flight), their lengths those of ``--rate 1`` at the seed."""
    alpha = getattr(config.run.acceptance, "alpha", None)
    if config.concurrency is not None:
        check_concurrency(config.concurrency)
    if config.trace is not None:
        if config.rate is not None:
            raise ValueError("--rate and --arrivals both set the arrivals; keep one")
        requests = read_trace(config.trace)
        if config.alpha_spread:
            raise ValueError("alpha_spread draws acceptances for synthetic requests; a "
                             "trace gives its own in an alpha column")
        return requests
    closed = config.rate is None and config.concurrency is not None
    if config.rate is None and not closed:
        raise ValueError("serve needs arrivals: --rate REQUESTS_PER_S, --concurrency N "
                         "(clients keeping N requests in flight) or --arrivals FILE")
    if closed and config.cv != 1.0:
        raise ValueError(f"--cv {config.cv:g} shapes the gaps between arrivals at --rate; "
                         "with --concurrency alone every request is ready at once: give "
                         "--rate too or drop --cv")
    if config.alpha_spread and getattr(config.run.acceptance, "kind", None) != "iid":
        raise ValueError("alpha_spread spreads an i.i.d. acceptance alpha; the run's "
                         f"acceptance is '{config.run.acceptance.kind}'")
    check_count(config.requests)
    if not closed:
        check_rate(config.rate)
    requests = synthetic(config.requests, 1.0 if closed else config.rate,
                         seed=config.run.seed, cv=config.cv, lengths=config.workload,
                         prompt_tokens=config.prompt_tokens,
                         output_tokens=config.output_tokens, alpha=alpha,
                         alpha_spread=config.alpha_spread)
    return [replace(r, arrival_s=0.0) for r in requests] if closed else requests


# the schedule's modes ------------------------------------------------------------
def _mode(label: str, run: RunConfig, config: ServeConfig, top_context: int,
          platform, stack) -> Mode:
    pricer = StepPricer(run, max_batch=config.max_batch, max_context=top_context,
                        chunk=config.token_budget, exact=config.exact,
                        platform=platform, stack=stack)
    reserve = reserved_positions(run)
    if reserve == 1 and run.policy == AR:
        return Mode(label, pricer, 1, 1, lambda _alpha: 1.0)
    cap = max(1, int(round(pricer.tokens_per_step(1.0)))) if _iid(run) else \
        max(1, reserve)
    return Mode(label, pricer, reserve, cap, pricer.tokens_per_step)


def _iid(run: RunConfig) -> bool:
    return getattr(run.acceptance, "kind", None) == "iid"


def modes_of(config: ServeConfig, top_context: int, platform, stack) -> list[Mode]:
    run = config.run
    if not config.auto:
        return [_mode(run.policy, run, config, top_context, platform, stack)]
    tuned = entry(run.policy).tuned
    field_info = entry(run.policy).params.model_fields[tuned.key]
    low = next((m.ge for m in field_info.metadata if hasattr(m, "ge")), 1)
    high = next((m.le for m in field_info.metadata if hasattr(m, "le")), max(AUTO_GAMMAS))
    base = baseline_config(run)
    modes = [_mode("off", base, config, top_context, platform, stack)]
    for g in AUTO_GAMMAS:
        if low <= g <= high:
            params = run.params.model_copy(update={tuned.key: g})
            modes.append(_mode(f"{tuned.key}={g}", run.model_copy(update={"params": params}),
                               config, top_context, platform, stack))
    return modes


# checks ----------------------------------------------------------------------
def check_serve(config: ServeConfig, requests: list[Request], platform) -> int:
    """What the run must pass before it is simulated; returns the KV capacity in
    positions. A schedule that streams weights from storage serves one request on
    a memory-limited device: refused. The longest request must fit the models'
    positions and, with its proposals, the KV cache."""
    run = config.run
    e = entry(run.policy)
    if e.streams_weights:
        serving = [n for n in names() if not entry(n).streams_weights]
        raise ValueError(f"policy '{run.policy}' streams layers from storage every step "
                         "for one request on a memory-limited device; serving batches "
                         "requests on devices that hold the model: pick one of "
                         f"{', '.join(serving)}")
    if config.auto and e.tuned is None:
        raise ValueError(f"policy '{run.policy}' has no tuned parameter for auto")
    check_used(run)
    check_overrides(platform, run.placement)
    longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    probe = run.model_copy(update={"prompt_tokens": longest.prompt_tokens,
                                   "tokens": longest.output_tokens, "batch": 1})
    check_positions(probe, fix="the workload's longest request must be shorter")
    check_platform(run, platform)
    models = run_models(run)
    placement = resolve(platform, run.placement)
    if run.memory_check:
        check_fit(platform, models, placement,
                  Run(run.policy, run.params, 0, 0, 1, False, config.token_budget))
    capacity = kv_capacity(run, platform, config.max_batch, config.token_budget)
    reserve = reserved_positions(run)
    for i, r in enumerate(requests):
        need = r.prompt_tokens + r.output_tokens + reserve
        if need > capacity:
            raise ValueError(f"request {i + 1} needs {need:,} KV positions (prompt "
                             f"{r.prompt_tokens:,} + output {r.output_tokens:,} + "
                             f"{reserve} proposed), more than the {capacity:,} the platform "
                             "holds beside the weights; shorten it or use a larger platform")
    return capacity


@dataclass(frozen=True)
class Prepared:
    """A serving run's checked inputs: its requests, platform, stack and KV capacity."""

    requests: list[Request]
    platform: object
    stack: object
    kv_capacity: int


def prepare(config: ServeConfig, requests: list[Request] | None = None) -> Prepared:
    """The workload read (or ``requests``, a replayed record's) and every check
    passed on it, before anything is simulated."""
    requests = requests_of(config) if requests is None else requests
    platform = load_platform(config.run.platform)
    stack = load_stack(config.run.stack)
    return Prepared(requests, platform, stack, check_serve(config, requests, platform))


def serve(config: ServeConfig, *, progress=None, trace_path=None,
          record_path=None, prepared: Prepared | None = None,
          modes: list[Mode] | None = None) -> Serving:
    """Simulate the serving run; write a Chrome trace and a run record when paths
    are given. ``prepared``: ``prepare(config)``'s answer, where the caller has it;
    ``modes``: an earlier run's (``Serving.modes``) of the same schedule and engine
    at another rate, whose prices it reuses where they cover these requests."""
    ready = prepared or prepare(config)
    requests, platform, stack, capacity = (ready.requests, ready.platform, ready.stack,
                                           ready.kv_capacity)
    top = max(r.prompt_tokens + r.output_tokens for r in requests) + 64
    if not modes or modes[0].pricer.max_context < top:
        modes = modes_of(config, top, platform, stack)
    plain = (_mode("plain", baseline_config(config.run), config, top, platform, stack)
             if any(r.step_trace for r in requests) else None)
    engine = Engine(requests, modes, max_batch=config.max_batch,
                    token_budget=config.token_budget, kv_capacity=capacity,
                    deterministic=config.run.deterministic, seed=config.run.seed,
                    switch_s=config.switch_s, progress=progress, plain=plain,
                    prefill_apart=config.prefill_apart,
                    concurrency=config.concurrency)
    served = engine.run()
    metrics = serve_metrics(served, config.slo)
    metrics["pricing_simulations"] = sum(m.pricer.sims for m in modes)
    metrics["breakdown"] = breakdown(served)
    metrics["step_breakdown"] = step_breakdown(served, modes)
    metrics["schedule"] = {"policy": config.run.policy, "auto": config.auto,
                           "reserve_positions": {m.label: m.reserve for m in modes},
                           "tokens_per_step": {m.label: m.mean(None) for m in modes}}
    metrics["timeline"] = timeline(served)
    if config.concurrency is not None:  # the wait before a client could send
        held = [r.held_s for r in served.requests]
        metrics["clients"] = {"concurrency": config.concurrency,
                              "held_requests": sum(h > 0 for h in held),
                              "held_s_mean": sum(held) / len(held), "held_s_max": max(held)}
    if trace_path is not None:
        write_serve_trace(trace_path, served, config)
        metrics["trace"] = str(trace_path)
    if record_path is not None:
        write_record(record_path, kind="served", inputs=inputs_of(config),
                     metrics=metrics, requests=request_rows(served))
        metrics["run_record"] = str(record_path)
    return Serving(config, metrics, served, modes)


def inputs_of(config: ServeConfig) -> dict:
    out = {"run": config.run.model_dump(mode="json")}
    for key in ("rate", "concurrency", "requests", "workload", "prompt_tokens",
                "output_tokens", "cv", "trace", "alpha_spread", "max_batch", "token_budget",
                "auto", "switch_s"):
        out[key] = getattr(config, key)
    out["slo"] = {"ttft_s": config.slo.ttft_s, "tpot_s": config.slo.tpot_s,
                  "percentile": config.slo.percentile}
    return out


def breakdown(served: Served) -> dict:
    """Where an output token's time goes under load, per output token: waiting in
    the queue, its share of the steps' prefill passes, and of their decode
    passes."""
    tokens = sum(r.request.output_tokens for r in served.requests) or 1
    queue = sum(r.admitted_s - r.request.arrival_s for r in served.requests)
    decode = sum(s.decode_s for s in served.steps)
    total = sum(s.seconds for s in served.steps)
    return {"queue_s_per_token": queue / tokens,
            "decode_share_of_steps": decode / total if total else 0.0,
            "prefill_share_of_steps": (total - decode) / total if total else 0.0,
            "step_s_mean": total / len(served.steps) if served.steps else 0.0}


def step_breakdown(served: Served, modes: list[Mode]) -> dict:
    """The decode step at the run's mean batch and context, by cost (the schedule's
    spans at that batch): what grows under load, the verify's compute, the draft's
    passes, the KV reads or the host work. The most used mode's step."""
    decode = [s for s in served.steps if s.decoding]
    if not decode:
        return {}
    used: dict[str, float] = {}
    for s in decode:
        used[s.mode] = used.get(s.mode, 0.0) + s.decode_s
    label = max(used, key=used.get)
    mode = next(m for m in modes if m.label == label)
    weight = sum(s.decode_s for s in decode if s.mode == label)
    batch = sum(s.decoding * s.decode_s for s in decode if s.mode == label) / weight
    contexts = [r.request.prompt_tokens + r.request.output_tokens / 2
                for r in served.requests]
    parts = mode.pricer.step_breakdown(int(round(batch)), int(sum(contexts) / len(contexts)))
    return {"mode": label, "batch": int(round(batch)), **parts}


# capacity ----------------------------------------------------------------------
def capacity(config: ServeConfig, *, low: float = 0.05, high: float | None = None,
             tolerance: float = 0.025, progress=None) -> dict:
    """The highest arrival rate (requests/s) whose run meets the SLO, by bisection
    to ``tolerance`` (relative): the same seed at every rate, so the requests are
    the same and only their gaps scale. Returns the rate, the runs tried and the
    figures at the rate found."""
    if not config.slo.given:
        raise ValueError("--capacity needs an SLO to meet: --slo ttft=0.5,tpot=0.05")
    if config.trace is not None:
        raise ValueError("--capacity scales a synthetic workload's rate; a trace fixes "
                         "its arrivals")
    if config.rate is None and config.concurrency is not None:
        raise ValueError("--capacity searches the highest arrival rate; with --concurrency "
                         "alone the clients set the load: give --rate too, the first "
                         "rate tried, or sweep --concurrency with compare --serve")
    tried = []
    priced: list[Mode] = []  # the schedule's prices, the same at every rate

    def holds(rate: float) -> tuple[bool, dict]:
        run = serve(replace(config, rate=rate), modes=priced)
        priced[:] = run.modes
        out = run.metrics
        tried.append({"rate": rate, "attainment": out["slo"]["attainment"],
                      "holds": out["slo"]["holds"]})
        if progress is not None:
            progress(rate, out["slo"]["holds"])
        return out["slo"]["holds"], out

    ok, best = holds(low)
    if not ok:
        return {"rate": None, "tried": tried, "metrics": best,
                "why": f"even {low:g} requests/s misses the SLO"}
    high = high or low * 2
    while True:
        ok_high, out_high = holds(high)
        if not ok_high:
            break
        low, best = high, out_high
        high *= 2
        if high > 1e5:
            return {"rate": low, "tried": tried, "metrics": best, "why": "unbounded"}
    while (high - low) / low > tolerance:
        mid = math.sqrt(low * high)
        ok, out = holds(mid)
        if ok:
            low, best = mid, out
        else:
            high = mid
    return {"rate": low, "tried": tried, "metrics": best, "why": None}


# the timeline -------------------------------------------------------------------
def write_serve_trace(path, served: Served, config: ServeConfig) -> None:
    """Steps on the engine's track and every request's queue, prefill and decode
    as async spans, in the Chrome trace-event format (open it in Perfetto)."""
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
               "args": {"name": f"served {config.run.policy}"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
               "args": {"name": "engine steps"}}]
    for s in served.steps:
        events.append({"ph": "X", "name": f"step {s.mode}", "cat": "step", "pid": 1,
                       "tid": 1, "ts": s.start_s * 1e6, "dur": s.seconds * 1e6,
                       "args": {"decoding": s.decoding, "prefill_tokens": s.prefill_tokens,
                                "kv_used": s.kv_used, "waiting": s.waiting}})
    for r in served.requests:
        q = r.request
        phases = (("queue", q.arrival_s, r.admitted_s),
                  ("prefill", r.admitted_s, r.first_token_s),
                  ("decode", r.first_token_s, r.finish_s))
        for name, start, end in phases:
            events.append({"ph": "b", "cat": "request", "name": name, "id": r.index,
                           "pid": 2, "ts": start * 1e6,
                           "args": {"prompt_tokens": q.prompt_tokens,
                                    "output_tokens": q.output_tokens}})
            events.append({"ph": "e", "cat": "request", "name": name, "id": r.index,
                           "pid": 2, "ts": end * 1e6})
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": inputs_of(config)}
    atomic_write_text(Path(path), json.dumps(doc, allow_nan=False, default=str))


__all__ = ["ServeConfig", "Serving", "serve", "capacity", "LENGTHS"]
