"""What-if: Spec-Bench's rows priced end to end, as its harness times them.

Spec-Bench times each call of a method's generate from before the prompt's
forward pass to the last token (evaluation/eval.py lines 178-189 at commit
fd2c1cd), and its Overall speedup is the mean over its 480 questions of each
question's tokens/s, divided by the same mean of the AR baseline
(evaluation/speed.py lines 26-30 and 49-61): with 80 questions per task, about
the mean of the six tasks' speedups. The shipped rows are priced as decode
speed (prefill outside the timed region, 128 prompt tokens, 1024 new ones).
This script prices each row per task with the prefill inside the timed region,
the task's prompt length from Spec-Bench's question.jsonl and its output length
from public runs of the same harness, and prints the mean over the six tasks
next to the row's decode-only price and the published speedup. Every row is
simulated at the acceptance that matches its printed mean accepted tokens
(pooled over all steps, as speed.py line 29 pools them); the per-task
acceptance is not printed, so each task takes the pooled one.

Inputs (data, each with its source):
- prompt words per call: mean whitespace-separated words of each task's first
  turn in data/spec_bench/question.jsonl (hemingkx/Spec-Bench, commit fd2c1cd):
  MT-bench 49 (second turn 18, on top of the first turn and its answer),
  translation 25, summarization 571, QA 9, math reasoning 45, RAG 509; plus
  the Vicuna system prompt and roles (31 words). Words become tokens at 1.3 per
  word, a tokenizer-free estimate (no tokenizer is loaded here).
- output tokens per call: the mean ``new_tokens`` per task of two public runs
  of Spec-Bench's AR baseline on Vicuna-7B-v1.3 at temperature 0
  (BNukhkadiev/Spec-Bench commit fe99257 and yukiki-jc/Spec-Bench commit
  3b73a28, data/spec_bench/model_answer/vicuna-7b-v1.3-vanilla-float16-temp-0.0.jsonl;
  they agree within 7% per task), the mean of the two: MT-bench 276 and 265
  (two turns), translation 30, summarization 178, QA 145, math reasoning 163,
  RAG 92.
  Greedy outputs are the model's, not the machine's; 13B and 33B rows use the
  7B lengths (no public run of theirs was found).

    python benchmarks/specbench_prefill.py

Deterministic; about 17 s on 2 cores, no GPU. A what-if, not a fit: nothing here is
fitted and no shipped row or stack changes (docs/calibration-notes.md, "What
Spec-Bench times").
"""

from __future__ import annotations

from analyses.calibrate.accepted import matched_config
from analyses.calibrate.published import load_published, shipped_folder
from analyses.calibrate.sources import runnable
from analyses.run.api import baseline_config, run_schedule
from hwprofiles import load_platform

TOKENS_PER_WORD = 1.3  # tokenizer-free estimate for English text
SYSTEM_WORDS = 31  # Vicuna v1.1 system prompt (23 words) and the USER/ASSISTANT roles
MT_FIRST_ANSWER_TOKENS = 270  # the first turn's answer, carried into the second prompt
# task -> [(prompt words, output tokens) per call], sources in the module docstring
TASK_CALLS = {
    "multi-turn conversation": [(49 + SYSTEM_WORDS, 276),
                                (49 + SYSTEM_WORDS + MT_FIRST_ANSWER_TOKENS / TOKENS_PER_WORD
                                 + 18, 265)],
    "translation": [(25 + SYSTEM_WORDS, 30)],
    "summarization": [(571 + SYSTEM_WORDS, 178)],
    "question answering": [(9 + SYSTEM_WORDS, 145)],
    "mathematical reasoning": [(45 + SYSTEM_WORDS, 163)],
    "retrieval-augmented generation": [(509 + SYSTEM_WORDS, 92)],
}


def call_times_s(row, platform, prompt_words: float, new_tokens: int) -> tuple[float, float]:
    """(method, AR) time of one timed call: prefill and decode of ``new_tokens``."""
    sized = row.model_copy(update={"prompt_tokens": round(prompt_words * TOKENS_PER_WORD),
                                   "tokens": new_tokens})
    sized = runnable(sized)[0]
    config = matched_config(sized.config(), sized.mean_accepted_tokens, platform)
    method = run_schedule(config, record_spans=False, platform=platform)
    base = run_schedule(baseline_config(config), record_spans=False, platform=platform)
    return method.time_s + method.prefill_s, base.time_s + base.prefill_s


def task_speedups(row, platform) -> list[float]:
    """Each task's end-to-end speedup (same tokens, so the ratio of times)."""
    speedups = []
    for calls in TASK_CALLS.values():
        method_s = base_s = 0.0
        for words, tokens in calls:
            m_s, b_s = call_times_s(row, platform, words, tokens)
            method_s, base_s = method_s + m_s, base_s + b_s
        speedups.append(base_s / method_s)
    return speedups


def decode_speedup(row, platform) -> float:
    """The row as the published bench prices it: decode only, its own lengths."""
    config = matched_config(runnable(row)[0].config(), row.mean_accepted_tokens, platform)
    method = run_schedule(config, record_spans=False, platform=platform)
    base = run_schedule(baseline_config(config), record_spans=False, platform=platform)
    return (method.tokens / method.time_s) / (base.tokens / base.time_s)


def main() -> None:
    rows = [r for r in load_published(shipped_folder()) if r.source_id == "spec-bench"]
    print("| row | published | decode only | end to end, mean of tasks | per task |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        platform = load_platform(row.platform)
        per_task = task_speedups(row, platform)
        mean = sum(per_task) / len(per_task)
        decode = decode_speedup(row, platform)
        print(f"| {row.id} | {row.speedup:.2f} | {decode:.3f} "
              f"({decode / row.speedup - 1:+.1%}) | {mean:.3f} "
              f"({mean / row.speedup - 1:+.1%}) | "
              + " ".join(f"{s:.2f}" for s in per_task) + " |")


if __name__ == "__main__":
    main()
