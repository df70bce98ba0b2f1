"""A measured run, end to end: decode the prompts, write the run record.

``measure(config, options, prompts)`` decodes every prompt batch with the
configured policy (and, for a speculative policy, with its autoregressive
baseline on the same prompts), then writes under the run directory:
``record.json`` (same schema as a simulated run), ``spans.jsonl``,
``trace.json`` (Chrome trace) and ``acceptance.jsonl``; with the baseline, also
``baseline-spans.jsonl`` (its spans, which calibration fits with the run's).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml
from tqdm import tqdm

from executors.backend import drafts
from executors.backend.models import default_draft
from executors.prompts import BUILTIN, encode
from executors.session import BatchResult, Options, Session
from policies import entry, ngram
from policies.base import baseline_of
from policies.runs.breakdown import breakdown
from policies.runs.config import RunSettings
from policies.runs.files import Span, claim_new_dir, default_run_dir, retire_run
from policies.runs.metrics import add_speedup, load_1m, run_metrics, usable_cores
from hwprofiles import ProfileError, load_model
from hwprofiles.loader import list_names
from hwprofiles.writing import atomic_write_text
from policies.runs.measured import write_measured_run
from policies.traces import held_rows


def decode_all(session: Session, policy: str, params, prompts: list[list[int]],
               batch: int, progress=None) -> list[BatchResult]:
    out = []
    for i in range(0, len(prompts), batch):
        out.append(session.decode(policy, params, prompts[i:i + batch]))
        if progress is not None:
            progress.update(1)
    return out


def interleaved(session: Session, schedule: tuple, base: tuple | None,
                prompts: list[list[int]], batch: int, repeats: int, progress=None):
    """Per round, (the schedule's results, AR's) over every prompt batch. Each
    batch is decoded by both back to back, in alternating order (schedule first
    on even batch + round, AR first on odd: ABBA...), so a machine whose speed
    drifts over seconds slows both alike and their ratio holds."""
    rounds = []
    for rep in range(repeats):
        own, ar = [], []
        for k, i in enumerate(range(0, len(prompts), batch)):
            order = [(own, schedule)] + ([(ar, base)] if base else [])
            if (rep + k) % 2:
                order.reverse()
            for out, (policy, params) in order:
                out.append(session.decode(policy, params, prompts[i:i + batch]))
                if progress is not None:
                    progress.update(1)
        rounds.append((own, ar))
    return rounds


def add_repeated_speedup(metrics: dict, config, rounds: list, max_new: int) -> dict:
    """``speedup_vs_ar``: the median over rounds of the schedule's tokens/s over
    AR's in that round, with every round's value (``speedup_vs_ar_repeats``) and
    their range (``speedup_vs_ar_spread``: [min, max]); ``ar_tokens_per_s`` over
    all rounds; ``matches_ar``: every round's outputs equal AR's."""
    ar_all = [r for _, ar in rounds for r in ar]
    add_speedup(metrics, summarise(config, ar_all, max_new)["tokens_per_s"])
    ratios = [summarise(config, own, max_new)["tokens_per_s"]
              / summarise(config, ar, max_new)["tokens_per_s"] for own, ar in rounds]
    metrics["speedup_vs_ar"] = statistics.median(ratios)
    metrics["speedup_vs_ar_repeats"] = ratios
    metrics["speedup_vs_ar_spread"] = [min(ratios), max(ratios)]
    metrics["matches_ar"] = all(outputs_of(own, max_new) == outputs_of(ar, max_new)
                                for own, ar in rounds)
    return metrics


def summarise(config, results: list[BatchResult], max_new: int) -> dict:
    tokens = sum(len(g) for r in results for g in r.generated)
    wall_s = sum(r.wall_s for r in results)
    steps = sum(r.steps for r in results) or 1
    rows = sum(len(r.generated) for r in results)
    verifies = [a for r in results for a in r.acceptance if "accepted" in a]
    proposed = sum(sum(a["proposed"]) for a in verifies)
    accepted = sum(sum(a["accepted"]) for a in verifies)
    out = run_metrics(config, tokens=tokens, time_s=wall_s, steps=steps,
                      rows_per_step=rows / len(results), measured=True)
    out.update({"max_new_tokens": max_new, "prompt_tokens": config.prompt_tokens,
                "mean_accepted": accepted / len(verifies) / (rows / len(results))
                if verifies else 0.0,
                "acceptance_rate": accepted / proposed if proposed else None})
    out.update(latency_metrics(results, tokens, wall_s, rows))
    if config.params.proposes_by_lookup:  # the fitted match model
        out.update({f"lookup_{k}": v for k, v in ngram.fit(verifies).items()})
    events = [a for r in results for a in r.acceptance if "event" in a]
    for name in sorted({e["event"] for e in events}):  # per row, as recorded
        held = [h for e in events if e["event"] == name for h in held_rows(e)]
        out[f"{name}_rate"] = sum(held) / len(held)
    return out


def latency_metrics(results: list[BatchResult], tokens: int, wall_s: float,
                    rows: int) -> dict:
    """A request's view, measured: ``ttft_s``, the mean over prompt batches of the
    prefill (every cache the schedule reads, streamed layers loaded once) plus the
    decoding up to the first committed token; ``tpot_s``, decoding time per
    generated token of a sequence (the prefill excluded)."""
    firsts = [r.ttft_s for r in results if r.ttft_s is not None]
    return {"prefill_s": sum(r.prefill_s for r in results) / len(results),
            "ttft_s": sum(firsts) / len(firsts) if firsts else None,
            "tpot_s": wall_s * rows / len(results) / tokens if tokens else None}


def as_spans(results: list[BatchResult]) -> list[Span]:
    """Measured spans of all batches on one timeline, as simulator spans."""
    out, offset_s = [], 0.0
    for r in results:
        out += [s.as_span(offset_s, physical=True) for s in r.spans]
        offset_s += r.wall_s
    return out


def timeline_metrics(policy: str, results: list[BatchResult]) -> dict:
    """The policy's own time-derived metrics (overlap, phase shares), measured."""
    timeline = entry(policy).timeline
    return timeline(as_spans(results)) if timeline else {}


def measured_breakdown(results: list[BatchResult]) -> dict:
    """Where the measured decoding time went (policies.runs.breakdown), over the
    prompt batches laid end to end; per token of one sequence."""
    tokens = sum(len(g) for r in results for g in r.generated)
    rows_per_batch = sum(len(r.generated) for r in results) / len(results)
    return breakdown(as_spans(results), tokens=tokens / rows_per_batch,
                     steps=sum(r.steps for r in results) or 1, start_s=0.0,
                     end_s=sum(r.wall_s for r in results))


def outputs_of(results: list[BatchResult], max_new: int, eos: int | None = None):
    """Generated tokens per prompt: the first ``max_new``, cut after an end token."""
    out = [g[:max_new] for r in results for g in r.generated]
    if eos is not None:
        out = [o[:o.index(eos) + 1] if eos in o else o for o in out]
    return out


def fits_positions(prompts: list[list[int]], specs: dict, max_new_tokens: int) -> None:
    """The tokenized prompts, checked before any decoding: the longest and the
    tokens to generate within each model's trained positions (the command checked
    a floor, the prompts' words, before the models loaded)."""
    longest = max(map(len, prompts))
    for role, spec in specs.items():
        if spec.max_positions is not None and longest + max_new_tokens > spec.max_positions:
            raise ValueError(f"the longest prompt is {longest:,} tokens, + {max_new_tokens:,} "
                             f"new tokens = {longest + max_new_tokens:,} positions pass the "
                             f"{spec.max_positions:,} the {role} model {spec.name} was "
                             "trained for (its max_positions); shorten the prompt or lower "
                             "--max-new-tokens")


def measure(config: RunSettings, options: Options, messages: list[list[dict]] | None = None, *,
            out_dir=None, baseline: bool = True, progress: bool = False,
            replace: bool = False, repeats: int = 1) -> dict:
    """Run ``config`` (a RunConfig) for real; returns the metrics (with ``outputs``
    and ``run_record``). Without ``out_dir`` the run goes to a new folder under
    runs/; ``replace`` removes a previous run's own files from ``out_dir`` once this
    run is measured, before its files are written (``hetspec run --force``).
    ``repeats``: rounds of every prompt batch, each decoded by the schedule and its
    AR baseline back to back (``interleaved``); the speedup is the median round's."""
    messages = list(messages or BUILTIN)
    if entry(config.policy).needs_draft and config.draft is None:
        config = config.model_copy(update={"draft": default_draft(config.target)})
    with Session(config.platform, config.target, config.draft,
                 placement=config.placement, options=options, seed=config.seed) as session:
        # a draft without multi-token heads (Session.draft_multi_token) emits one
        # token a pass: record the defaults that follow, so a replay simulates the
        # same schedule (with them, the simulator's own defaults hold)
        pinned = {} if session.draft_multi_token else config.params.single_token_defaults()
        if pinned:
            config = config.revised(params={**config.given("params"), **pinned})
        vocab = session.specs["target"].vocab
        prompts = [encode(m, session.tokenizer, vocab) for m in messages]
        fits_positions(prompts, session.specs, options.max_new_tokens)
        config = config.model_copy(update={  # the mean prompt really in the caches
            "prompt_tokens": sum(map(len, prompts)) // len(prompts),
            "tokens": options.max_new_tokens})
        base = baseline_of(config.policy, config.params) if baseline else None
        bar = _progress(progress, len(prompts) * repeats, config.batch, 2 if base else 1)
        load_before = load_1m()
        rounds = interleaved(session, (config.policy, config.params), base, prompts,
                             config.batch, repeats, bar)
        machine = machine_load(load_before, load_1m(), options.threads)
        results = [r for own, _ in rounds for r in own]
        metrics = summarise(config, results, options.max_new_tokens)
        metrics.update(timeline_metrics(config.policy, results))
        metrics["breakdown"] = measured_breakdown(results)
        metrics["machine"] = machine
        eos = getattr(session.tokenizer, "eos_token_id", None)
        outputs = outputs_of(rounds[0][0], options.max_new_tokens, eos)
        if base is None:
            add_speedup(metrics, own_baseline=baseline_of(config.policy,
                                                          config.params) is None)
        else:
            add_repeated_speedup(metrics, config, rounds, options.max_new_tokens)
        if bar is not None:
            bar.close()
        texts = ([session.tokenizer.decode(o, skip_special_tokens=True) for o in outputs]
                 if session.tokenizer is not None else None)
        specs = session.specs
    run_dir = (Path(out_dir) if out_dir
               else claim_new_dir(default_run_dir(config.policy, config.seed)))
    if replace:
        retire_run(run_dir)
    inputs = {**config.model_dump(mode="json"), "max_new_tokens": options.max_new_tokens,
              "threads": options.threads, "temperature": options.temperature,
              "mode": options.mode, "physical": options.physical, "prompts": messages,
              "repeats": repeats,
              "draft_heads": drafts.describe(config.target),
              **simulable_models(config, specs, run_dir),
              **recorded_platform(config.platform, run_dir)}
    baseline = [r for _, ar in rounds for r in ar]  # empty without a baseline
    record = write_run(run_dir, inputs, metrics, results, outputs, texts, baseline)
    return {**metrics, "outputs": outputs, "texts": texts, "run_record": str(record)}


CONTENDED_CORES = 0.5  # other work beyond the spare cores that marks a run contended


def machine_load(before: float | None, after: float | None, threads: int) -> dict:
    """The machine while the run was measured: its cores, the run's threads, the
    1-minute load average before and after decoding, and ``contended``: whether
    other work wanted more than the cores the run left spare (by
    ``CONTENDED_CORES``). Before decoding the load is other work's (and the
    model's loading); after, it includes the run's own threads. None: unknown."""
    cores = usable_cores()
    known = [x for x in (before, None if after is None else after - threads) if x is not None]
    other = max(known) if known else None
    return {"cores": cores, "threads": threads, "load_1m_before": before,
            "load_1m_after": after,
            "contended": None if other is None
            else other > max(cores - threads, 0) + CONTENDED_CORES}


def simulable_models(config: RunSettings, specs: dict, run_dir: Path) -> dict:
    """Model names the simulator resolves: a shipped spec name where there is one
    with the heads the run used (random:NAME runs NAME's shape), else a spec YAML
    written beside the record;
    ``weights`` keeps the executor's own names."""
    out = {"weights": {"target": config.target, "draft": config.draft}}
    for role, name in (("target", config.target), ("draft", config.draft)):
        if name is None:
            continue
        plain = name.removeprefix("random:")
        spec = specs[role]
        try:
            if load_model(plain).heads == spec.heads:  # else not the run's spec
                out[role] = plain
                continue
        except ProfileError:
            pass
        path = (run_dir / "models" / f"{role}.yaml").resolve()
        data = spec.model_dump(mode="json")
        numeric = [k for k, v in data.items() if isinstance(v, (int, float))
                   and not isinstance(v, bool)]
        data["sources"] = {k: spec.sources.get(k, f"executor model '{name}'")
                           for k in numeric}
        data["sources"]["n_layers"] = f"executor model '{name}'"
        atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
        out[role] = str(path)
    return out


def recorded_platform(platform: str, run_dir: Path) -> dict:
    """The platform as a record names it: a shipped name, or a copy of the profile
    file written beside the record (``platform.yaml``), since a measured record may
    name no other file (analyses/measured/evidence.py)."""
    if platform in list_names("platforms"):
        return {"platform": platform}
    path = (run_dir / "platform.yaml").resolve()
    atomic_write_text(path, Path(platform).read_text())
    return {"platform": str(path), "platform_source": platform}


def _progress(enabled: bool, n_prompts: int, batch: int, passes: int):
    if not enabled:
        return None
    return tqdm(total=passes * -(-n_prompts // batch), desc="decoding", unit="batch",
                delay=2.0)  # quick failures print their error alone


def write_run(run_dir: Path, inputs: dict, metrics: dict, results: list[BatchResult],
              outputs, texts, baseline: list[BatchResult] = ()) -> Path:
    """The run's files, written through the measured-run schema
    (``policies.runs.measured``), the prompt batches laid end to end; the AR
    baseline's spans (``baseline``, every round's) beside them."""
    def batches(of):
        return [(r.wall_s, r.spans, r.acceptance) for r in of]

    return write_measured_run(run_dir, inputs, metrics, batches(results), outputs, texts,
                              batches(baseline))
