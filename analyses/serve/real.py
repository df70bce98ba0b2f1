"""A served workload measured on this machine, and its replay in the simulator.

``measure_serving`` serves requests for real (``executors.serving``): the
prompts of a set, cycled to ``requests``, arriving as a Poisson process of the
seed at ``rate`` (the same gaps ``hetspec serve`` draws), admitted first come,
first served into the torch executor's running batch of at most ``max_batch``
rows (continuous batching: rows join and leave between steps). Its record holds
every request's arrival, start, first token and finish with its lengths and,
per step, the tokens its decode committed, proposed and accepted and the batch
the step ran in, and the same figures ``hetspec serve`` prints (TTFT, TPOT,
latency and queueing percentiles).

``replay_serving`` re-serves the record's requests in the simulator: the same
arrival times and lengths, each request's own measured steps, the engine capped
at the executor's max batch and prefilling as the executor does (a pass of its
own before the step that first decodes the request: ``prefill_apart``), every
step priced exactly on the platform (the recorded one, or a calibrated
profile); then it sets each predicted percentile beside the measured one.
"""

from __future__ import annotations

import json
from pathlib import Path

from analyses.run.config import NGRAM, RunConfig
from analyses.serve.api import ServeConfig, prepare, serve
from analyses.serve.engine import Live, Served
from analyses.serve.metrics import PERCENTILES, SLO, request_metrics
from analyses.serve.workload import Request, synthetic
from hwprofiles import DEFAULT_STACK
from hwprofiles.writing import atomic_write_text, json_safe
from policies import ngram
from policies.runs.files import RUN_SCHEMA, read_record, versions

KIND = "served"  # a record's kind: a measured served workload
FIGURES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


def arrivals_at(rate: float, n: int, seed: int) -> list[float]:
    """The arrival times ``hetspec serve --rate`` draws for ``n`` requests."""
    return [r.arrival_s for r in synthetic(n, rate, seed=seed, prompt_tokens=1,
                                           output_tokens=1)]


def served_of(rows: list[dict]) -> Served:
    """The measured requests as the engine's result, for the shared metrics."""
    live = []
    for i, r in enumerate(rows):
        request = Request(r["arrival_s"], r["prompt_tokens"], r["output_tokens"])
        live.append(Live(i, request, need=r["prompt_tokens"], prefilled=r["prompt_tokens"],
                         generated=float(r["output_tokens"]), admitted_s=r["started_s"],
                         first_token_s=r["first_token_s"], finish_s=r["finish_s"]))
    return Served(live, [], max(r["finish_s"] for r in rows), kv_capacity=1)


def measure_serving(config: RunConfig, max_new_tokens: int, messages: list[list[dict]], *,
                    rate: float, requests: int, record_path, max_batch: int = 1,
                    progress=None) -> dict:
    """Serve ``requests`` prompts (``messages`` cycled) arriving at ``rate`` for real,
    ``max_new_tokens`` each, at most ``max_batch`` decoded together; write the
    record; return its metrics."""
    from executors.serving import Options, serve_requests  # torch: a measured run alone
    options = Options(max_new_tokens=max_new_tokens)
    chosen = [messages[i % len(messages)] for i in range(requests)]
    arrivals = arrivals_at(rate, requests, config.seed)
    out = serve_requests(config, options, chosen, arrivals, max_batch=max_batch,
                         progress=progress)
    rows = out["requests"]
    metrics = request_metrics(served_of(rows), SLO())
    metrics["tokens_per_step"] = (sum(sum(r["committed_per_step"]) for r in rows)
                                  / max(sum(len(r["committed_per_step"]) for r in rows), 1))
    inputs = {**config.model_dump(mode="json"), "rate": rate, "requests": requests,
              "max_new_tokens": options.max_new_tokens, "threads": options.threads,
              "prompts": chosen, "max_batch": max_batch}
    record = {"schema": RUN_SCHEMA, "kind": KIND, "inputs": inputs, "versions": versions(),
              "metrics": metrics, "requests": rows, "warmup_s": out["warmup_s"],
              "rounds": out["rounds"]}
    atomic_write_text(Path(record_path), json.dumps(json_safe(record), indent=2,
                                                    sort_keys=True, allow_nan=False))
    metrics["run_record"] = str(record_path)
    return metrics


def is_served(record: dict) -> bool:
    return record.get("kind") == KIND


def replay_serving(path, *, profile: str | None = None) -> dict:
    """The record's requests served by the simulator; measured and predicted
    percentiles side by side with their errors (predicted / measured - 1)."""
    record = read_record(path)
    if not is_served(record):
        raise ValueError(f"{path} is not a served workload's record (its kind is "
                         f"{record.get('kind')!r}); hetspec replay reads it as a run")
    inputs, rows = record["inputs"], record["requests"]
    sets = dict(inputs.get("params") or {})
    draft = inputs.get("draft")
    if sets.pop("proposer", None) == NGRAM:
        # each replayed step says whether it proposed: a step that did is priced
        # as a full proposal's (match 1), one that did not as AR's pass
        draft = NGRAM
        fitted = ngram.fit(_lookup_lines(rows))
        sets.update({"match": 1.0, "alpha": fitted["alpha"] or 0.5})
    config = ServeConfig.build(platform=profile or inputs["platform"],
                               target=inputs["target"], draft=draft,
                               policy=inputs["policy"], sets=sets,
                               # the record's stack (unwritten: the default), not a
                               # simulated serve's: the executor is the engine measured
                               stack=inputs.get("stack") or DEFAULT_STACK,
                               seed=inputs.get("seed", 0),
                               deterministic=True, max_batch=inputs.get("max_batch", 1),
                               exact=True, prefill_apart=True)
    requests = [Request(r["arrival_s"], r["prompt_tokens"], max(r["output_tokens"], 1),
                        tokens_per_step=_per_step(r), step_trace=_trace(r)) for r in rows]
    predicted = serve(config, prepared=prepare(config, requests)).metrics
    measured = record["metrics"]
    table = {}
    for figure in FIGURES:
        table[figure] = {}
        for stat in ("mean", *(f"p{p}" for p in PERCENTILES)):
            m, p = measured[figure][stat], predicted[figure][stat]
            table[figure][stat] = {"measured": m, "predicted": p,
                                   "error": (p / m - 1) if m and p is not None else None}
    return {"record": str(path), "platform": config.run.platform, "figures": table,
            "requests": len(rows), "max_batch": config.max_batch,
            "batch_max": predicted["batch_max"], "predicted": predicted}


def _per_step(row: dict) -> float | None:
    steps = row["committed_per_step"]
    return sum(steps) / len(steps) if steps else None


def _trace(row: dict) -> tuple[tuple[int, bool], ...] | None:
    """The request's measured steps: (tokens committed, whether it proposed)."""
    proposed = row.get("proposed_per_step") or []
    if len(proposed) != len(row["committed_per_step"]):
        return None
    return tuple((int(c), bool(g)) for c, g in zip(row["committed_per_step"], proposed))


def _lookup_lines(rows: list[dict]) -> list[dict]:
    """Each request's Verify steps as acceptance lines, for the lookup's match fit."""
    return [{"proposed": [g], "accepted": [k]} for r in rows
            for g, k in zip(r["proposed_per_step"], r["accepted_per_step"]) if g is not None]


def error_summary(replayed: dict) -> list[str]:
    out = []
    for figure, stats in replayed["figures"].items():
        parts = [f"{stat} {v['measured'] * 1e3:.1f} -> {v['predicted'] * 1e3:.1f} ms "
                 f"({v['error']:+.0%})" for stat, v in stats.items()
                 if v["measured"] is not None and v["error"] is not None]
        out.append(f"{figure.removesuffix('_s').upper()}: " + "; ".join(parts))
    return out

