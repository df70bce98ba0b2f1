"""A serving workload: requests as data, from a synthetic generator or a trace file.

A request is its arrival time, its prompt and output lengths in tokens and,
optionally, its own acceptance (the probability that a draft token is accepted
in its decoding, ``alpha``). Requests come from

* a **synthetic workload**: arrivals at ``rate`` requests per second, Poisson
  (exponential gaps) or gamma-distributed gaps with a coefficient of variation
  ``cv`` (burstiness: 1 is Poisson, above 1 burstier), and lengths drawn from a
  named distribution (``LENGTHS``) or fixed; or
* a **trace file**: CSV or JSON lines with an arrival time, prompt tokens and
  output tokens per row, in the column names serving traces use (``COLUMNS``:
  the Azure LLM inference traces' ``TIMESTAMP, ContextTokens, GeneratedTokens``,
  Splitwise/Vidur's ``arrived_at, num_prefill_tokens, num_decode_tokens``, or
  hetspec's ``arrival_s, prompt_tokens, output_tokens``), and an optional
  per-request ``alpha`` column: an acceptance trace per request.

Every request is checked before anything is simulated: a trace's rows sorted by
arrival, none negative, none a copy of the row before it, lengths within the
run caps; each refusal is one sentence naming the row and the fix.

The length distributions are log-normal, fitted to public traces by their
median and 90th percentile (mu = ln median, sigma = ln(p90 / p50) / 1.2816), each
with its source; draws are clipped to [1, the trace's largest value]. Same
seed, same requests.
"""

from __future__ import annotations

import csv
import datetime
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hwprofiles.jsonin import parse, read_text
from hwprofiles.loader import printable
from hwprofiles.writing import atomic_write_text
from policies.runs.config import MAX_PROMPT_TOKENS, MAX_TOKENS

MAX_REQUESTS = 1_000_000  # a day of traffic at ~10 requests/s; beyond it, a typo
MAX_TRACE_BYTES = 256 * 2**20
MAX_ARRIVAL_S = 1e7  # about 116 days: a trace's times in ms or us pass it
MAX_RATE = 1e5  # requests/s: far above what any hardware serves


@dataclass(frozen=True, slots=True)
class Request:
    """One request: arrival (s from the workload's start), prompt and output
    tokens, and its own acceptance (None: the run's acceptance model's), or the
    tokens its decode committed per step where they were measured: their mean
    (``tokens_per_step``) or, step by step, (tokens committed, whether the step
    had a proposal) (``step_trace``: a replay of a measured request)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    alpha: float | None = None
    tokens_per_step: float | None = None
    step_trace: tuple[tuple[int, bool], ...] | None = None


@dataclass(frozen=True)
class LengthModel:
    """Log-normal prompt and output lengths: (mu, sigma) of ln(tokens), clipped to
    [1, largest]; ``source`` names the trace the parameters were fitted to."""

    prompt: tuple[float, float]
    output: tuple[float, float]
    prompt_max: int
    output_max: int
    source: str

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        p = np.exp(rng.normal(self.prompt[0], self.prompt[1], n))
        o = np.exp(rng.normal(self.output[0], self.output[1], n))
        return (np.clip(np.rint(p), 1, self.prompt_max).astype(int),
                np.clip(np.rint(o), 1, self.output_max).astype(int))


# Fitted by hetspec to the traces (each column's median and 90th percentile; the
# largest row): Azure LLM inference trace 2023 (Patel et al.,
# "Splitwise", ISCA 2024; github.com/Azure/AzurePublicDataset, data/
# AzureLLMInferenceTrace_{conv,code}.csv, CC-BY 4.0), 19,366 conversation and
# 8,819 code requests: conversation prompts p50 1,020 / p90 2,734.5 tokens, outputs
# 129 / 424; code prompts 1,469 / 5,187.6, outputs 13 / 55. The summarisation lengths are
# CNN/DailyMail's (See et al. 2017, "Get To The Point", Table 1 of its data
# description: articles 781 tokens, summaries 56 on average), spread as the
# conversation trace's.
LENGTHS = {
    "chat": LengthModel(prompt=(6.928, 0.769), output=(4.860, 0.929), prompt_max=14_050,
                        output_max=1_000,
                        source="Azure LLM inference trace 2023, conversation (Splitwise, "
                               "ISCA 2024): p50 and p90 fitted by hetspec"),
    "code": LengthModel(prompt=(7.292, 0.985), output=(2.565, 1.125), prompt_max=7_437,
                        output_max=1_899,
                        source="Azure LLM inference trace 2023, code (Splitwise, "
                               "ISCA 2024): p50 and p90 fitted by hetspec"),
    "summarisation": LengthModel(prompt=(math.log(781) - 0.769 ** 2 / 2, 0.769),
                                 output=(math.log(56) - 0.929 ** 2 / 2, 0.929),
                                 prompt_max=8_192, output_max=512,
                                 source="CNN/DailyMail means (See et al. 2017: 781 "
                                        "article, 56 summary tokens), the conversation "
                                        "trace's spread"),
}
# Burstiness of the same traces (hetspec's arithmetic on their TIMESTAMPs):
# coefficient of variation of the gaps, conversation 1.09 at 5.5 requests/s,
# code 13.2 at 2.6 requests/s.
TRACE_CV = {"chat": 1.09, "code": 13.2}


def synthetic(n: int, rate: float, *, seed: int = 0, cv: float = 1.0,
              lengths: str | None = "chat", prompt_tokens: int | None = None,
              output_tokens: int | None = None, alpha: float | None = None,
              alpha_spread: float = 0.0) -> list[Request]:
    """``n`` requests arriving at ``rate`` per second: gaps exponential (``cv`` 1)
    or gamma with coefficient of variation ``cv``; lengths from ``LENGTHS[lengths]``
    unless fixed by ``prompt_tokens``/``output_tokens``. With ``alpha_spread`` > 0
    each request draws its own acceptance from a beta distribution of mean
    ``alpha`` and that standard deviation."""
    check_count(n)
    check_rate(rate)
    if not 0 < cv <= 100:
        raise ValueError(f"arrival cv={cv} is outside (0, 100]: 1 is Poisson, larger is "
                         "burstier (the Azure code trace's is 13.2)")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv ** 2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request opens the workload
    if prompt_tokens is None or output_tokens is None:
        if lengths not in LENGTHS:
            raise ValueError(f"unknown workload '{lengths}'; choose one of "
                             f"{', '.join(LENGTHS)} or fix the lengths")
        drawn_p, drawn_o = LENGTHS[lengths].draw(rng, n)
    prompts = np.full(n, prompt_tokens) if prompt_tokens is not None else drawn_p
    outputs = np.full(n, output_tokens) if output_tokens is not None else drawn_o
    alphas = request_alphas(rng, n, alpha, alpha_spread)
    return [Request(float(a), int(p), int(o), None if alphas is None else float(al))
            for a, p, o, al in zip(arrivals, prompts, outputs,
                                   alphas if alphas is not None else [None] * n)]


def request_alphas(rng: np.random.Generator, n: int, alpha: float | None,
                   spread: float) -> np.ndarray | None:
    """Per-request acceptances: beta of mean ``alpha`` and standard deviation
    ``spread`` (None when there is no spread: every request takes the run's)."""
    if not spread:
        return None
    if alpha is None or not 0 < alpha < 1:
        raise ValueError(f"alpha_spread needs a mean acceptance alpha strictly between 0 "
                         f"and 1 (got {alpha}); set alpha=0.8 or drop alpha_spread")
    top = math.sqrt(alpha * (1 - alpha))
    if not 0 < spread < top:
        raise ValueError(f"alpha_spread={spread} must lie in (0, {top:.3f}): a beta of mean "
                         f"{alpha} has no larger standard deviation")
    k = alpha * (1 - alpha) / spread ** 2 - 1
    return rng.beta(alpha * k, (1 - alpha) * k, n)


def _a_count(n) -> bool:
    """A whole number of requests, 1 to MAX_REQUESTS."""
    return not isinstance(n, bool) and isinstance(n, int) and 1 <= n <= MAX_REQUESTS


def check_count(n: int) -> None:
    if not _a_count(n):
        raise ValueError(f"--requests {n} is outside 1..{MAX_REQUESTS:,}")


def check_concurrency(n: int) -> None:
    if not _a_count(n):
        raise ValueError(f"--concurrency {n} is outside 1..{MAX_REQUESTS:,}: the requests "
                         "the clients keep in flight at once")


def check_rate(rate: float) -> None:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate)) or rate <= 0:
        raise ValueError(f"--rate {rate} is not a positive number of requests per second; "
                         "give e.g. --rate 4")
    if rate > MAX_RATE:
        raise ValueError(f"--rate {rate:g} requests/s is above any hardware's service "
                         f"rate (at most {MAX_RATE:g}); is it per minute or per hour?")


# Trace files ------------------------------------------------------------------
# Accepted column names, by field: the first of each found in the header is read.
COLUMNS = {"arrival_s": ("arrival_s", "arrived_at", "TIMESTAMP", "timestamp"),
           "prompt_tokens": ("prompt_tokens", "num_prefill_tokens", "ContextTokens",
                             "input_tokens"),
           "output_tokens": ("output_tokens", "num_decode_tokens", "GeneratedTokens"),
           "alpha": ("alpha",)}
TRACE_FIX = ("give a CSV or JSON-lines file with an arrival time in seconds (or a "
             "TIMESTAMP), prompt tokens and output tokens per row, sorted by arrival")


def read_trace(path) -> list[Request]:
    """The requests of a trace file (CSV, or JSON lines when its first character is
    '{'), every row checked (``check_rows``)."""
    what = "arrival trace"
    text = read_text(path, what, TRACE_FIX, MAX_TRACE_BYTES)
    shown = f"{what} {printable(str(path))}"
    rows = _json_rows(text, shown) if text.lstrip().startswith("{") else _csv_rows(text, shown)
    return check_rows(rows, shown)


def _csv_rows(text: str, shown: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise ValueError(f"{shown} has no header row; {TRACE_FIX}")
    return [(n + 2, row) for n, row in enumerate(reader)]


def _json_rows(text: str, shown: str) -> list[tuple[int, dict]]:
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            value = parse(line, f"{shown} line {n}", TRACE_FIX)
            if not isinstance(value, dict):
                raise ValueError(f"{shown} line {n} is not a JSON object; {TRACE_FIX}")
            out.append((n, value))
    return out


def _field(row: dict, field: str, where: str, required: bool = True):
    for name in COLUMNS[field]:
        if name in row and row[name] not in (None, ""):
            return row[name]
    if required:
        raise ValueError(f"{where} has no {field} (a column named one of "
                         f"{', '.join(COLUMNS[field])}); {TRACE_FIX}")
    return None


def _seconds(value, where: str) -> float:
    """A number of seconds, or a timestamp ('2023-11-16 18:15:46.68') as seconds
    since the epoch (the caller takes the first row's as zero)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: arrival {value} is not a time")
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        stamp = datetime.datetime.fromisoformat(str(value).strip()[:26])
    except ValueError:
        raise ValueError(f"{where}: arrival '{value}' is neither seconds nor a timestamp "
                         "like 2023-11-16 18:15:46.68") from None
    return stamp.replace(tzinfo=stamp.tzinfo or datetime.timezone.utc).timestamp()


def _count(value, field: str, where: str, top: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {field} '{value}' is not a number of tokens") from None
    if isinstance(value, bool) or not math.isfinite(number) or number != int(number):
        raise ValueError(f"{where}: {field} {value} is not a whole number of tokens")
    if not 1 <= number <= top:
        raise ValueError(f"{where}: {field} {int(number):,} is outside 1..{top:,}")
    return int(number)


def check_rows(rows: list[tuple[int, dict]], shown: str) -> list[Request]:
    """Requests from parsed rows, each checked: a time, sorted, not negative, not
    absurd; whole token counts within the run caps; an alpha in [0, 1]; no row a
    copy of the one before (a trace concatenated twice or a writer's retry)."""
    if not rows:
        raise ValueError(f"{shown} holds no requests; {TRACE_FIX}")
    if len(rows) > MAX_REQUESTS:
        raise ValueError(f"{shown} holds {len(rows):,} requests, over the "
                         f"{MAX_REQUESTS:,} a run takes; cut it")
    out: list[Request] = []
    raw_times = []
    stamped = None
    for line, row in rows:
        where = f"{shown} row {line}"
        value = _field(row, "arrival_s", where)
        is_stamp = not _is_number(value)
        if stamped is None:
            stamped = is_stamp
        elif stamped != is_stamp:
            raise ValueError(f"{where} mixes a timestamp and a number of seconds; use one")
        t = _seconds(value, where)
        if not math.isfinite(t) or (not stamped and t < 0):
            raise ValueError(f"{where}: arrival {value} is negative or not finite; times "
                             "count seconds from the trace's start")
        raw_times.append(t)
        prompt = _count(_field(row, "prompt_tokens", where), "prompt_tokens", where,
                        MAX_PROMPT_TOKENS)
        output = _count(_field(row, "output_tokens", where), "output_tokens", where,
                        MAX_TOKENS)
        alpha = _field(row, "alpha", where, required=False)
        if alpha is not None:
            try:
                alpha = float(alpha)
            except (TypeError, ValueError):
                alpha = math.nan
            if not 0 <= alpha <= 1:
                raise ValueError(f"{where}: alpha {row.get('alpha')} is not a probability "
                                 "in [0, 1]")
        out.append(Request(t, prompt, output, alpha))
    origin = raw_times[0] if stamped else 0.0
    checked = []
    for (line, _), req in zip(rows, out):
        where = f"{shown} row {line}"
        t = req.arrival_s - origin
        if t > MAX_ARRIVAL_S:
            raise ValueError(f"{where}: arrival {t:.4g} s is past {MAX_ARRIVAL_S:.0e} s "
                             "(116 days); are the times in ms or us?")
        if checked and t < checked[-1].arrival_s:
            raise ValueError(f"{where} arrives at {t:g} s, before the row above "
                             f"({checked[-1].arrival_s:g} s); sort the trace by arrival")
        request = Request(t, req.prompt_tokens, req.output_tokens, req.alpha)
        if checked and request == checked[-1]:
            raise ValueError(f"{where} repeats the row above (same arrival and lengths); "
                             "drop the copy")
        checked.append(request)
    return checked


def _is_number(value) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def write_trace(path, requests: list[Request]) -> None:
    """The requests as hetspec's CSV trace (``read_trace`` reads it back)."""
    lines = ["arrival_s,prompt_tokens,output_tokens,alpha"]
    for r in requests:
        lines.append(f"{r.arrival_s!r},{r.prompt_tokens},{r.output_tokens},"
                     f"{'' if r.alpha is None else repr(r.alpha)}")
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
