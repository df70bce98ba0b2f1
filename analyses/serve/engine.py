"""The serving engine: continuous batching of requests, each step one step of the
schedule for the batch formed, on the SimPy clock.

Each iteration (a *step*) the scheduler forms a batch as serving engines do
(iteration-level batching, vLLM's and Orca's): every running request that has
its prompt in the KV cache decodes one step of the schedule; the step's token
budget left after them (each decoding request takes the positions it proposes,
K+1 for a chain of K drafts) goes to prompt chunks, first to requests part-way
through their prefill, then to waiting requests admitted first come, first
served while the batch has room (``max_batch``, and its proposed positions within
the token budget). The KV cache is accounted by positions held:
each request its prompt and generated tokens, and, while decoding, the
positions its step proposes. When a step's needs pass the cache, the request
admitted last is preempted (its cache dropped; it waits again at the head of
the queue and recomputes its prompt and generated tokens as a prefill, vLLM's
recompute preemption).

The step's time is the schedule's step for the batch (``pricing.StepPricer``)
plus the prefill passes it carries; then each decoding request commits its
tokens: its own acceptance decides how many (a truncated geometric draw of
at most K+1, whose mean is the schedule's tokens per step at the request's
acceptance; in deterministic mode exactly that mean, carried fractionally).
A request's first token comes from its first decode step, as in ``simulate``
(the prefill runs no head). With ``prefill_apart`` (the torch executor's rule,
which a replay of a served record follows) a step's prefill is a pass of its own
before its decode pass, and a request whose prompt it completes decodes in that
same step. Its prompts are priced one by one, as always: the executor pads them to
the longest in one pass, which costs more positions but computes each faster.

With ``concurrency`` N the requests' clients keep at most N in flight, as a
benchmark client's ``--max-concurrency`` does: a request that arrives while N
are in flight is held until one finishes and is sent then; its clock (TTFT,
latency) starts when it is sent. Arrivals all at 0 make a closed loop of N
clients; N requests at 0 are an offline batch of N.

With ``auto`` speculation (``--set gamma=auto``) the step's draft length, or no
speculation, is chosen each step from the batch formed: the one with the most
expected tokens per second of the step, paying ``switch_s`` whenever it changes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from analyses.serve.pricing import StepPricer
from analyses.serve.workload import Request


@dataclass(frozen=True)
class Mode:
    """One way of stepping the batch: its pricer, the positions a decoding
    request reserves, the cap on tokens a step commits, and each request's mean
    tokens per step (``mean(alpha)``, alpha None: the run's acceptance)."""

    label: str
    pricer: StepPricer
    reserve: int
    cap: int
    mean: Callable[[float | None], float]


@dataclass
class Live:
    """A request inside the engine."""

    index: int
    request: Request
    need: int  # positions to prefill: the prompt, plus generated tokens after a preemption
    prefilled: int = 0
    generated: float = 0.0
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    cursor: int = 0  # the next step of its step_trace
    held_s: float = 0.0  # seconds its client held it for a free slot (``concurrency``)

    def traced(self) -> tuple[int, bool] | None:
        """Its next measured step (tokens, proposed), if it replays a trace."""
        trace = self.request.step_trace
        return trace[self.cursor] if trace and self.cursor < len(trace) else None

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.need

    @property
    def context(self) -> int:
        """Positions in its cache: the prompt and the tokens generated while it
        decodes (a preempted request recomputes both), the prefilled part before."""
        return self.request.prompt_tokens + int(self.generated) if self.decoding \
            else self.prefilled


@dataclass
class Step:
    """One engine step, as the timeline records it."""

    start_s: float
    seconds: float
    decode_s: float
    decoding: int
    prefill_tokens: int
    mode: str
    kv_used: int
    waiting: int


@dataclass
class Served:
    """What a serving run produced: the requests as the engine left them, its
    steps, and counters."""

    requests: list[Live]
    steps: list[Step]
    end_s: float
    kv_capacity: int
    mode_steps: dict[str, int] = field(default_factory=dict)
    switches: int = 0


class Engine:
    """A continuous-batching engine over ``modes`` (one, or several for auto)."""

    def __init__(self, requests: list[Request], modes: list[Mode], *, max_batch: int,
                 token_budget: int, kv_capacity: int, deterministic: bool, seed: int,
                 switch_s: float = 0.0, progress=None, plain: Mode | None = None,
                 prefill_apart: bool = False, concurrency: int | None = None):
        self.requests = requests
        self.concurrency = concurrency  # requests in flight at most (closed-loop clients)
        self.modes = modes
        self.plain = plain  # a step no request proposes in (replayed traces): AR's
        # the executor's rule: a step's prefill is a pass of its own before its decode,
        # and a request whose prompt it completes decodes in that same step
        self.prefill_apart = prefill_apart
        self.max_batch = max_batch
        self.token_budget = token_budget
        self.kv_capacity = kv_capacity
        self.deterministic = deterministic
        self.rng = np.random.default_rng(seed)
        self.switch_s = switch_s
        self.progress = progress
        self._alpha_eff: dict[tuple[float, int], float] = {}
        self._means: dict[tuple[str, float | None], float] = {}

    # acceptance ----------------------------------------------------------------
    def mean(self, mode: Mode, live: Live) -> float:
        if live.request.tokens_per_step is not None:  # measured: a replay
            return min(live.request.tokens_per_step, float(mode.cap))
        key = (mode.label, live.request.alpha)
        if key not in self._means:
            self._means[key] = min(mode.mean(live.request.alpha), float(mode.cap))
        return self._means[key]

    def alpha_eff(self, m: float, cap: int) -> float:
        """The per-token acceptance a whose chain of cap-1 drafts commits m tokens a
        step on average: (1 - a^cap) / (1 - a) = m (bisection)."""
        key = (round(m, 6), cap)
        if key not in self._alpha_eff:
            lo, hi = 0.0, 1.0
            if m >= cap - 1e-9:
                self._alpha_eff[key] = 1.0
                return 1.0
            for _ in range(60):
                a = (lo + hi) / 2
                mean = cap if a == 1 else (1 - a ** cap) / (1 - a)
                lo, hi = (a, hi) if mean < m else (lo, a)
            self._alpha_eff[key] = (lo + hi) / 2
        return self._alpha_eff[key]

    def committed(self, mode: Mode, batch: list[Live]) -> list[float]:
        if all(r.traced() for r in batch):  # measured steps, replayed as they were
            out = [float(r.traced()[0]) for r in batch]
            for r in batch:
                r.cursor += 1
            return out
        means = [self.mean(mode, r) for r in batch]
        if self.deterministic or mode.cap == 1:
            return means
        out = []
        for m in means:
            a = self.alpha_eff(m, mode.cap)
            draws = self.rng.random(mode.cap - 1)
            accepted = int(np.argmin(draws < a)) if not np.all(draws < a) else mode.cap - 1
            out.append(float(accepted + 1))
        return out

    # the loop ------------------------------------------------------------------
    def run(self) -> Served:
        env = simpy.Environment()
        out: dict = {}
        env.process(self._serve(env, out))
        env.run()
        return out["served"]

    def _serve(self, env: simpy.Environment, out: dict):
        live = [Live(i, r, need=r.prompt_tokens) for i, r in enumerate(self.requests)]
        pending = deque(live)  # not yet arrived, in arrival order
        waiting: deque[Live] = deque()
        running: list[Live] = []  # admitted, in admission order
        steps: list[Step] = []
        done = 0
        in_flight = 0  # sent by their clients and not finished
        checked_s, credit = -math.inf, 0  # the last pass's time; its free slots left
        mode = self.modes[0]
        mode_steps = {m.label: 0 for m in self.modes}
        switches = 0
        while done < len(live):
            while (pending and pending[0].request.arrival_s <= env.now
                   and (self.concurrency is None or in_flight < self.concurrency)):
                r = pending.popleft()
                if self.concurrency is not None and r.request.arrival_s < env.now:
                    if r.request.arrival_s > checked_s and credit > 0:
                        credit -= 1  # a slot was free when it arrived: sent then
                    else:  # held by its client until a slot freed, now
                        r.held_s = env.now - r.request.arrival_s
                        r.request = replace(r.request, arrival_s=env.now)
                waiting.append(r)
                in_flight += 1
            # slots are freed only here, between steps: until the next pass, arrivals
            # take the ones left free, and wait at their clients once those are gone
            checked_s = env.now
            credit = (self.concurrency - in_flight) if self.concurrency is not None else 0
            if not running and not waiting:
                yield env.timeout(pending[0].request.arrival_s - env.now)
                continue
            decoding = [r for r in running if r.decoding]
            chosen = self._choose(decoding, mode) if len(self.modes) > 1 else mode
            # the KV cache: preempt the last admitted until the step's needs fit
            while running and self._kv_need(running, chosen) > self.kv_capacity:
                victim = running.pop()
                victim.preemptions += 1
                victim.need = victim.request.prompt_tokens + int(victim.generated)
                victim.prefilled = 0
                waiting.appendleft(victim)
                decoding = [r for r in running if r.decoding]
            budget = self.token_budget - len(decoding) * chosen.reserve
            chunks: list[tuple[Live, int]] = []
            kv_used = self._kv_need(running, chosen)
            for r in running:
                if budget <= 0:
                    break
                if not r.decoding:
                    n = min(r.need - r.prefilled, budget)
                    chunks.append((r, n))
                    budget -= n
            while (waiting and budget > 0 and len(running) < self.max_batch
                   and (len(running) + 1) * chosen.reserve <= self.token_budget):
                r = waiting[0]
                n = min(r.need, budget)
                if kv_used + n > self.kv_capacity:
                    break
                waiting.popleft()
                running.append(r)
                if r.admitted_s is None:
                    r.admitted_s = env.now
                chunks.append((r, n))
                budget -= n
                kv_used += n
            if not decoding and not chunks:  # the cache holds no more: wait for arrivals
                if not pending or (self.concurrency is not None
                                   and in_flight >= self.concurrency):
                    raise RuntimeError("the engine can make no progress: a request needs "
                                       "more KV cache than the platform holds")
                yield env.timeout(pending[0].request.arrival_s - env.now)
                continue
            if self.prefill_apart:
                decoding = decoding + [r for r, n in chunks if r.prefilled + n >= r.need]
            if chosen is not mode:
                switches += 1
            decode_s = 0.0
            if decoding:
                context = sum(self._context(r) for r in decoding) / len(decoding)
                pricer = chosen.pricer
                if self.plain is not None and all(
                        (t := r.traced()) and not t[1] for r in decoding):
                    pricer = self.plain.pricer  # nothing proposed: a one-token pass
                decode_s = pricer.step_s(len(decoding), context)
            prefill_s = sum(chosen.pricer.prefill_s(r.prefilled, r.prefilled + n)
                            for r, n in chunks)
            seconds = decode_s + prefill_s + (self.switch_s if chosen is not mode else 0.0)
            mode = chosen
            mode_steps[mode.label] += 1
            steps.append(Step(env.now, seconds, decode_s, len(decoding),
                              sum(n for _, n in chunks), mode.label,
                              self._kv_need(running, mode), len(waiting)))
            yield env.timeout(seconds)
            for r, n in chunks:
                r.prefilled += n
            finished = []
            for r, tokens in zip(decoding, self.committed(mode, decoding)):
                if r.first_token_s is None:
                    r.first_token_s = env.now
                r.generated = min(r.generated + tokens, float(r.request.output_tokens))
                if r.generated >= r.request.output_tokens:
                    r.finish_s = env.now
                    finished.append(r)
            if finished:
                gone = {id(r) for r in finished}
                running = [r for r in running if id(r) not in gone]
                done += len(finished)
                in_flight -= len(finished)
                if self.progress is not None:
                    self.progress(len(finished))
        out["served"] = Served(live, steps, env.now, self.kv_capacity, mode_steps, switches)

    @staticmethod
    def _context(r: Live) -> int:
        """A decoding request's context: its prompt and generated tokens, as for one
        this step's prefill completes (its own pass first, ``prefill_apart``)."""
        return r.request.prompt_tokens + int(r.generated)

    def _kv_need(self, running: list[Live], mode: Mode) -> int:
        return sum(r.context + (mode.reserve if r.decoding else 0) for r in running)

    def _choose(self, decoding: list[Live], current: Mode) -> Mode:
        """The mode with the most expected tokens per second for this batch
        (switching from ``current`` costs switch_s)."""
        if not decoding:
            return current
        context = sum(r.context for r in decoding) / len(decoding)
        best, best_rate = current, -math.inf
        for m in self.modes:
            seconds = m.pricer.step_s(len(decoding), context)
            seconds += self.switch_s if m is not current else 0.0
            rate = sum(self.mean(m, r) for r in decoding) / seconds
            if rate > best_rate + 1e-12:
                best, best_rate = m, rate
        return best
