"""Requests served for real: arrivals in wall-clock time, one engine, measured.

``serve_requests`` serves requests with continuous (iteration-level) batching,
as the simulated engine (``analyses.serve.engine``) does: requests arrive at
their times (the process sleeps while nothing runs), wait first come, first
served, and join the running batch at the next round boundary while it has
fewer than ``max_batch`` rows. A round is one step of the configured schedule
for every row (``executors.session.batching``); between rounds the rows whose
requests are done leave and the arrived requests join, their prompts prefilled
together as a pass of their own before the round that decodes them with the
rest. For each request it records when it arrived, started (its prefill began),
produced its first token and finished, on one clock, with its prompt and output
lengths and, per step, the tokens it committed, proposed and accepted and the
batch the step ran in; the simulated engine replays the same requests
(``analyses.serve.real``).
"""

from __future__ import annotations

import time
from collections import deque

from executors.prompts import encode
from executors.session import Options, Session
from policies.runs.config import RunSettings

__all__ = ["Options", "serve_requests"]


def serve_requests(config: RunSettings, options: Options, messages: list[list[dict]],
                   arrivals: list[float], *, max_batch: int = 1, progress=None) -> dict:
    """Serve ``messages[i]`` arriving at ``arrivals[i]`` seconds (sorted), at most
    ``max_batch`` decoded together; returns {"requests": [row...], "outputs":
    [[token...]...], "warmup_s": seconds, "rounds": [round...]} (each round's start,
    seconds and rows, and the requests that joined before it with their prefill's
    seconds and the seconds spent regrouping the caches)."""
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch} must be at least 1")
    with Session(config.platform, config.target, config.draft,
                 placement=config.placement, options=options, seed=config.seed) as session:
        vocab = session.specs["target"].vocab
        prompts = [encode(m, session.tokenizer, vocab) for m in messages]
        # batches decoded before the clock starts, of one row and of the most rows:
        # first calls allocate and compile
        warm = time.perf_counter()
        session.decode(config.policy, config.params, [prompts[0]])
        if max_batch > 1:
            session.decode(config.policy, config.params,
                           [prompts[i % len(prompts)] for i in range(max_batch)])
        warmup_s = time.perf_counter() - warm
        batch = session.running(config.policy, config.params, prompts[0])
        served = _Served(batch, prompts, arrivals, options.max_new_tokens, max_batch,
                         progress)
        served.run()
    return {"requests": served.rows, "outputs": served.outputs, "warmup_s": warmup_s,
            "rounds": served.rounds}


class _Served:
    """The serving loop's state: who waits, who runs in which row, what each did."""

    def __init__(self, batch, prompts, arrivals, max_new_tokens: int, max_batch: int,
                 progress):
        self.batch, self.prompts, self.arrivals = batch, prompts, arrivals
        self.max_new, self.max_batch, self.progress = max_new_tokens, max_batch, progress
        self.rows = [_row(a, len(p)) for a, p in zip(arrivals, prompts)]
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.in_row: list[int] = []  # request index per batch row
        self.rounds: list[dict] = []  # the engine's timeline: one entry per round
        self.joined: tuple[int, float, float] = (0, 0.0, 0.0)  # before the next round:
        # (requests, their prefill's seconds, the regroups' seconds)

    def run(self) -> None:
        pending = deque(range(len(self.prompts)))  # not yet started, in arrival order
        self.t0 = time.perf_counter()
        while pending or self.in_row:
            now = self.clock()
            joining = []
            while (pending and self.arrivals[pending[0]] <= now
                   and len(self.in_row) + len(joining) < self.max_batch):
                joining.append(pending.popleft())
            if not self.in_row and not joining:  # idle until the next arrival
                time.sleep(max(self.arrivals[pending[0]] - now, 0.0))
                continue
            if joining:
                self.admit(joining)
            self.step()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def admit(self, joining: list[int]) -> None:
        started = self.clock()
        prefill_s = self.batch.regroup(list(range(len(self.in_row))),
                                       [self.prompts[i] for i in joining])
        for i in joining:
            self.rows[i].update(started_s=started, prefill_s=prefill_s,
                                prefill_batch=len(joining))
        self.in_row += joining
        _, _, regroup_s = self.joined
        self.joined = (len(joining), prefill_s, regroup_s + self.clock() - started
                       - prefill_s)

    def step(self) -> None:
        """One round of every row; the rows whose requests are done leave."""
        start = self.clock()
        lines = self.batch.round()
        end = self.clock()
        size = len(self.in_row)
        joined, prefill_s, regroup_s = self.joined
        self.rounds.append({"start_s": start, "seconds": end - start, "rows": size,
                            "joined": joined, "prefill_s": prefill_s,
                            "regroup_s": regroup_s})
        self.joined = (0, 0.0, 0.0)
        for line in lines:
            for r, i in enumerate(self.in_row):
                row = self.rows[i]
                row["committed_per_step"].append(line["committed"][r])
                row["proposed_per_step"].append((line.get("proposed") or [None] * size)[r])
                row["accepted_per_step"].append(line["accepted"][r])
                row["batch_per_step"].append(size)
        keep = []
        for r, i in enumerate(self.in_row):
            row, generated = self.rows[i], self.batch.generated(r)
            if row["first_token_s"] is None and generated:
                row["first_token_s"] = end
            if len(generated) < self.max_new:
                keep.append(r)
                continue
            self.outputs[i] = generated[:self.max_new]
            row.update(finish_s=end, output_tokens=len(self.outputs[i]),
                       steps=len(row["committed_per_step"]),
                       decode_s=end - row["started_s"] - row["prefill_s"])
            if self.progress is not None:
                self.progress(1)
        if len(keep) < size:
            left = self.clock()
            self.batch.regroup(keep, [])
            self.in_row = [self.in_row[r] for r in keep]
            self.joined = (0, 0.0, self.clock() - left)


def _row(arrival: float, prompt_tokens: int) -> dict:
    return {"arrival_s": arrival, "started_s": None, "first_token_s": None,
            "finish_s": None, "prompt_tokens": prompt_tokens, "output_tokens": 0,
            "steps": 0, "prefill_s": 0.0, "prefill_batch": 1, "decode_s": 0.0,
            "committed_per_step": [], "proposed_per_step": [], "accepted_per_step": [],
            "batch_per_step": []}
