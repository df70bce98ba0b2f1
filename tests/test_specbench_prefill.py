"""benchmarks/specbench_prefill.py: Spec-Bench's rows priced end to end, as its
harness times them (docs/calibration-notes.md, "What Spec-Bench times")."""

from __future__ import annotations

import pytest
from benchscripts import load_benchmark

from analyses.calibrate.published import load_published, shipped_folder
from hwprofiles import load_platform

whatif = load_benchmark("specbench_prefill")


@pytest.fixture(scope="module")
def eagle2_row():
    rows = load_published(shipped_folder())
    return next(r for r in rows if r.id == "specbench-a100-vicuna7b-eagle2")


def test_six_tasks_each_call_with_a_prompt_and_new_tokens():
    assert len(whatif.TASK_CALLS) == 6
    for calls in whatif.TASK_CALLS.values():
        assert all(words > 0 and tokens > 0 for words, tokens in calls)
    assert len(whatif.TASK_CALLS["multi-turn conversation"]) == 2  # two turns, two calls


def test_prefill_in_the_timed_call_lowers_a_speedup_above_one(eagle2_row):
    platform = load_platform(eagle2_row.platform)
    decode = whatif.decode_speedup(eagle2_row, platform)
    per_task = whatif.task_speedups(eagle2_row, platform)
    assert decode > 1
    # prefill costs method and baseline alike, so it pulls every task toward 1
    assert all(1 < s < decode for s in per_task)


def decode_times_s(row, platform, prompt_words, new_tokens):
    """(method, AR) decode time of the same call, prefill left out."""
    sized = row.model_copy(update={"prompt_tokens": round(prompt_words * whatif.TOKENS_PER_WORD),
                                   "tokens": new_tokens})
    config = whatif.matched_config(sized.config(), sized.mean_accepted_tokens, platform)
    method = whatif.run_schedule(config, record_spans=False, platform=platform)
    base = whatif.run_schedule(whatif.baseline_config(config), record_spans=False,
                               platform=platform)
    return method.time_s, base.time_s


def test_the_timed_call_holds_the_prefill(eagle2_row):
    platform = load_platform(eagle2_row.platform)
    method_s, base_s = whatif.call_times_s(eagle2_row, platform, 600, 30)
    decode_method_s, decode_base_s = decode_times_s(eagle2_row, platform, 600, 30)
    assert method_s > decode_method_s and base_s > decode_base_s
    # the same prefill on both sides pulls the call's speedup toward 1
    assert 1 < base_s / method_s < decode_base_s / decode_method_s
