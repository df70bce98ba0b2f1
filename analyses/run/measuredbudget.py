"""Work budgets of measurements (``analyses.run.budget``'s rule): reading measured
runs (replay, compare --runs and calibrate count the spans lines of the runs they
read, before parsing any), making them (``hetspec run`` counts the tokens it
will generate with real models and its prompts' prefill) and fitting published
measured rows (calibrate --published counts their simulations)."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from analyses.run.budget import (SIM_BUDGET_UNITS, SIM_UNITS_PER_S, Estimate, Models, plural,
                                 sim_shape)
from policies.runs.files import MAX_RECORD_BYTES, file_in_run


# Spans a replay reads, checks and replays per second: ``python
# benchmarks/bench_budget.py --spans 100000`` replayed 100,156 spans in 14.7 s
# (6,800 a second, the CLI's start included); rounded down. A measured run of
# 4 prompts x 64 tokens holds about 1,000 spans; the budget, 50,000 spans, is
# about 10 s (the 64 MB spans file limit allows ~200,000, 40 s).
SPANS_PER_S = 5_000
SPANS_BUDGET = 50_000
# Tokens ``hetspec run`` generates with real models: prompts x new tokens x the
# runs (the schedule, its AR baseline). The slowest schedule measured on the
# development machine (README, "Measured with these heads": ``python
# benchmarks/bench_drafts.py --max-new-tokens 48``, 2026-11-25) decoded 1.72
# tokens/s (mirror on SmolLM2-135M, cpu-local), AR 7.8-14; rounded down. The
# budget, 1,000 tokens, is at most about 11 minutes there (the default run, 4
# prompts x 64 tokens with its baseline, is 512); a larger model is slower.
RUN_TOKENS_PER_S = 1.5
RUN_TOKENS_BUDGET = 1_000
# A run with no draft model (AR, prompt lookup: --draft ngram) decodes at AR's
# pace or faster: the slowest AR measured there, 7.8 tokens/s (same source), is
# its rate, and its budget the same ~11 minutes in tokens at that rate.
MODEL_FREE_TOKENS_PER_S = 7.8


def count_lines(path) -> int:
    """Lines of a regular file, counted in 1 MiB blocks without parsing (0 for
    anything else: its loader refuses it in its own words)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return 0
        lines, last = 0, b"\n"
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                lines += block.count(b"\n")
                last = block[-1:]
        return lines + (last != b"\n")
    except OSError:
        return 0


def spans_file(record_path) -> Path | None:
    """The spans file a run record names, read cheaply (no check of the record:
    ``load_run`` does that); None when the record does not say one."""
    path = Path(record_path)
    path = path / "record.json" if path.is_dir() else path
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        name = record.get("spans") if isinstance(record, dict) else None
        return file_in_run(path.parent, name, "spans", path) if isinstance(name, str) else None
    except (OSError, ValueError, RecursionError):
        return None


def spans_estimate(command: str, records: list, shrink: str) -> Estimate:
    """Work of reading (and replaying) measured runs: their spans lines."""
    lines = sum(count_lines(p) for p in map(spans_file, records) if p is not None)
    runs = f"{len(records)} measured run{'s' if len(records) != 1 else ''}"
    return Estimate(command, f"{runs} holding {plural(lines, 'spans line')}", lines,
                    "spans lines", SPANS_PER_S, SPANS_BUDGET, shrink, counted=True)


def runs_estimate(directory, command: str) -> Estimate:
    """The spans of every run record under ``directory`` (none when it is not a
    directory: the command refuses that in its own words)."""
    directory = Path(directory)
    records = sorted(directory.rglob("record.json")) if directory.is_dir() else []
    return spans_estimate(command, records, f"pass a folder with fewer runs than {directory}")


# ------------------------------------------------------------------ real runs
# A prompt's own work in a real run: its prefill, once per run of each model
# that reads it, and every new token's pass over its longer context. Measured on
# the development machine (AR on SmolLM2-135M, cpu-local, --inline, 2 shared
# cores, 2026-11-29; prompts of 1,000, 2,500 and 5,000 words of the grounded
# passage, 1.56 tokens a word): prefill 7.1 s, 28.3 s and 102 s, which
# PREFILL_S_PER_WORD * w + PREFILL_S_PER_WORD2 * w^2 meets at 1,000 and 5,000 words
# and bounds at 2,500 (30.2 s): attention over the whole prompt grows as its
# square. A new token took 86, 130 and 176 ms there (64 ms at no context on the
# line through them): 1 + w / CONTEXT_WORDS of a short prompt's token. Each
# constant is rounded to the slower side; a prompt of fewer tokens a word (or a
# smaller model) prefills faster. Checked: sd (draft_layers=15) with its baseline,
# one 5,000-word prompt, 64 new tokens, estimated 446 s, took 355 s (load 5).
PREFILL_S_PER_WORD = 0.0038
PREFILL_S_PER_WORD2 = 3.4e-6
CONTEXT_WORDS = 2_800


def prefill_s(words: int) -> float:
    """Seconds one model of SmolLM2-135M's size prefills a prompt of ``words`` in."""
    return PREFILL_S_PER_WORD * words + PREFILL_S_PER_WORD2 * words ** 2


def run_estimate(prompt_words: list[int], max_new_tokens: int, baseline: bool, *,
                 model_free: bool = False, draft_model: bool = False,
                 rounds: int = 1) -> Estimate:
    """``hetspec run``'s work: every prompt (``prompt_words``: each one's words, a
    floor on its tokens) prefilled and decoded to max_new_tokens by the schedule
    (by its target and, with a ``draft_model`` of its own, by that too: one no
    larger) and, with a baseline, by AR again, in each of ``rounds``; each new token
    priced at its prompt's context. ``model_free``: the schedule runs no draft
    model (AR's pace). Counted in generated tokens' time at the schedule's rate."""
    prompts, runs = len(prompt_words), 2 if baseline else 1
    tokens = prompts * rounds * max_new_tokens * runs
    rate = MODEL_FREE_TOKENS_PER_S if model_free else RUN_TOKENS_PER_S
    prefills = rounds * (1 + draft_model + baseline)
    decoded = sum(1 + w / CONTEXT_WORDS for w in prompt_words) * rounds * max_new_tokens * runs
    prompted = prefills * sum(map(prefill_s, prompt_words)) * rate
    product = (f"{plural(prompts, 'prompt')} x "
               + (f"{rounds} rounds x " if rounds > 1 else "")
               + f"{plural(max_new_tokens, 'new token')}"
               + (" x 2 runs (the schedule and its AR baseline)" if baseline else "")
               + f" = {plural(tokens, 'generated token')}, after prompts of up to "
               + f"{plural(max(prompt_words, default=0), 'word')}, each prefilled "
               + f"{plural(prefills, 'time')}: the time of "
               + f"{plural(math.ceil(decoded + prompted), 'generated token')}")
    return Estimate("run", product, decoded + prompted, "generated tokens", rate,
                    RUN_TOKENS_BUDGET * rate / RUN_TOKENS_PER_S, "shorten the prompts, "
                    "lower --max-new-tokens, pass fewer --prompts"
                    + (" or --no-baseline" if baseline else ""), counted=True)


# ------------------------------------------------------------------ calibrations
# Simulations a published calibration runs per row: the least-squares fit
# evaluates every row once per trial and per finite-difference step. Counted on
# the shipped file: a100-sxm-8x 27 per row (7 rows, 2.5 s), h100-sxm-5x 120 per
# row (10 rows, 40 s); the bound below is the most seen and a quarter more.
# (scipy's trf allows 100 x parameters trials: a fit that wanders can exceed it.)
PUBLISHED_SIMS_PER_ROW = 150
# A published calibration's budget: four simulation budgets. Its rows are
# deterministic runs of up to 8,192 tokens, which the row-step rate (the slowest
# schedule's) prices far above their real cost: the shipped h100-sxm-5x rows (5
# fitted, SSD's among them) estimate 162,876,000 row-steps, 6.8 min at that rate,
# the others 2.8-91 million (2026-11-26), and its fit took 19 s
# (`hetspec calibrate --published shipped --profile h100-sxm-5x`, 2 cores). Every
# shipped calibration fits within it with room to spare.
PUBLISHED_BUDGET_UNITS = 4 * SIM_BUDGET_UNITS


def published_estimate(rows) -> Estimate:
    """A published calibration's work: every row's deterministic simulation at
    its own tokens and batch, PUBLISHED_SIMS_PER_ROW times."""
    units = 0
    for row in rows:
        settings = {k: [v] for k, v in row.params.items()}
        settings["prompt_tokens"] = [row.prompt_tokens]
        shape = sim_shape(row.policy, settings, row.tokens, row.batch,
                          Models(row.target, row.draft))
        units += shape.units * PUBLISHED_SIMS_PER_ROW
    tokens = max((r.tokens for r in rows), default=0)
    batch = max((r.batch for r in rows), default=1)
    product = (f"{plural(len(rows), 'published row')} x up to {PUBLISHED_SIMS_PER_ROW} "
               f"fit evaluations, each a simulation of up to {plural(tokens, 'token')} x "
               f"{plural(batch, 'sequence')}")
    return Estimate("calibrate", product, units, "row-steps", SIM_UNITS_PER_S,
                    PUBLISHED_BUDGET_UNITS,
                    "fit fewer rows or rows with fewer tokens or a smaller batch")
