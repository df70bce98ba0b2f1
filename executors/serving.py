"""Requests served for real: arrivals in wall-clock time, one engine, measured.

``serve_requests`` decodes each request with the configured schedule when its
turn comes: requests arrive at their times (the process sleeps until the next
one), wait first come, first served while the engine is busy, and are decoded one
at a time (a batch cap of 1: the executor decodes whole prompt batches, so
requests of different lengths are not yet merged into one step). For each
request it records when it arrived, started, produced its first token and
finished, on one clock, with its prompt and output lengths and the tokens its
decode committed per step; the simulated engine replays the same requests
(``analyses.serve.real``).
"""

from __future__ import annotations

import time

from executors.prompts import encode
from executors.session import Options, Session
from policies.runs.config import RunSettings

__all__ = ["Options", "serve_requests"]


def serve_requests(config: RunSettings, options: Options, messages: list[list[dict]],
                   arrivals: list[float], *, progress=None) -> dict:
    """Serve ``messages[i]`` arriving at ``arrivals[i]`` seconds (sorted); returns
    {"requests": [row...], "outputs": [[token...]...], "warmup_s": seconds}."""
    rows, outputs = [], []
    with Session(config.platform, config.target, config.draft,
                 placement=config.placement, options=options, seed=config.seed) as session:
        vocab = session.specs["target"].vocab
        prompts = [encode(m, session.tokenizer, vocab) for m in messages]
        # one request decoded before the clock starts: first calls allocate and compile
        warm = time.perf_counter()
        session.decode(config.policy, config.params, [prompts[0]])
        warmup_s = time.perf_counter() - warm
        start_clock = time.perf_counter()
        for arrival, prompt in zip(arrivals, prompts):
            now = time.perf_counter() - start_clock
            if now < arrival:
                time.sleep(arrival - now)
            started = time.perf_counter() - start_clock
            result = session.decode(config.policy, config.params, [prompt])
            finished = time.perf_counter() - start_clock
            generated = result.generated[0][:options.max_new_tokens]
            # the decode's own clock ends with it: its first token came wall_s -
            # first_token_s before the end (set-up before the prefill counts to it)
            first = finished - (result.wall_s - (result.first_token_s or result.wall_s))
            verifies = [step for step in result.acceptance if "accepted" in step]
            committed = [sum(step.get("committed") or [a + 1 for a in step["accepted"]])
                         for step in verifies]
            rows.append({"arrival_s": arrival, "started_s": started, "first_token_s": first,
                         "finish_s": finished, "prompt_tokens": len(prompt),
                         "output_tokens": len(generated), "steps": result.steps,
                         "prefill_s": result.prefill_s, "decode_s": result.wall_s,
                         "committed_per_step": committed,
                         "proposed_per_step": [(step.get("proposed") or [None])[0]
                                               for step in verifies],
                         "accepted_per_step": [step["accepted"][0] for step in verifies]})
            outputs.append(generated)
            if progress is not None:
                progress(1)
    return {"requests": rows, "outputs": outputs, "warmup_s": warmup_s}
