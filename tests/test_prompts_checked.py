"""Real prompts are checked like simulated ones before any model loads: the
longest prompt's tokens (at least its words) and the tokens to generate against
the models' trained positions, and the run's memory on its platform."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.cli import main
from executors.prompts import token_floor
from hwprofiles import load_model
from tests.needs import HAS_TORCH, needs_torch

RUN = ["run", "--platform", "cpu-local", "--target", "random:smollm2-135m", "--policy",
       "sd", "--set", "draft_layers=15", "--no-baseline", "--inline"]
POSITIONS = load_model("smollm2-135m").max_positions


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the measured run starts (the checks come first); without
    torch the run cannot start one."""
    if not HAS_TORCH:
        return
    import executors.measure

    def measure(*_a, **_k):
        raise AssertionError("the measured run started before the prompts were checked")

    monkeypatch.setattr(executors.measure, "measure", measure)


def _prompts(tmp_path, words: int, name="p.jsonl"):
    path = tmp_path / name
    path.write_text(json.dumps([{"role": "user", "content": " ".join(["word"] * words)}])
                    + "\n")
    return str(path)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.integers(1, 3 * POSITIONS), new=st.integers(1, 64))
def test_a_prompt_past_the_positions_is_refused_before_the_models_load(
        tmp_path, capsys, no_model_load, words, new):
    """Past the positions in words: refused naming them; within: it gets as far
    as the measured run (the stand-in refuses it there)."""
    path = _prompts(tmp_path, words, f"p{words}-{new}.jsonl")
    argv = RUN + ["--max-new-tokens", str(new), "--prompts", path,
                  "--out", str(tmp_path / f"r{words}-{new}")]
    if words + new > POSITIONS:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{POSITIONS:,} the target model smollm2-135m" in err and "max_positions" in err
    elif HAS_TORCH:
        with pytest.raises(AssertionError, match="measured run started"):
            main(argv)


def test_a_million_word_prompt_is_refused_in_one_sentence(tmp_path, capsys, no_model_load):
    path = _prompts(tmp_path, 1_000_000)
    assert main(RUN + ["--max-new-tokens", "2", "--prompts", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1,000,000 + 2 generated tokens" in err[0]


def test_a_batch_of_long_prompts_is_refused_by_the_memory_check(tmp_path, capsys,
                                                                no_model_load):
    path = _prompts(tmp_path, POSITIONS - 200)
    assert main(RUN + ["--max-new-tokens", "2", "--batch", "64", "--prompts", path]) == 2
    err = capsys.readouterr().err
    assert "would need" in err and "--batch" in err


def test_the_word_count_is_a_floor_on_the_tokens():
    from executors.prompts import encode

    messages = [{"role": "user", "content": "one two  three\nfour"}]
    assert token_floor(messages) == 4
    assert len(encode(messages, None, 1000)) >= token_floor(messages)


def test_tokenized_prompts_past_the_positions_are_refused_before_decoding():
    needs_torch()
    from executors.measure import fits_positions

    spec = load_model("smollm2-135m")
    fits_positions([[1] * (POSITIONS - 8)], {"target": spec}, 8)
    with pytest.raises(ValueError, match="shorten the prompt or lower --max-new-tokens"):
        fits_positions([[1] * 3, [1] * (POSITIONS - 7)], {"target": spec}, 8)


# ---------------------------------------------------------------- the run budget
def test_the_run_budget_counts_the_prompts_prefill(tmp_path, capsys, no_model_load):
    """Eight 5,000-word prompts and 2 new tokens each (16 tokens) are the time of
    over 6,000 generated tokens: refused by the budget, naming the prompts, before
    the models load; one such prompt runs."""
    path = tmp_path / "long.jsonl"
    path.write_text((json.dumps([{"role": "user", "content": " ".join(["word"] * 5000)}])
                     + "\n") * 8)
    argv = RUN + ["--max-new-tokens", "2", "--prompts", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 prompts x 2 new tokens = 16 generated tokens" in err[0]
    assert "prompts of up to 5,000 words, each prefilled 1 time" in err[0]
    assert "over the budget" in err[0] and "shorten the prompts" in err[0]
    if HAS_TORCH:
        with pytest.raises(AssertionError, match="measured run started"):
            main(RUN + ["--max-new-tokens", "2", "--prompts", _prompts(tmp_path, 5000),
                        "--out", str(tmp_path / "r")])


def test_prefill_grows_the_estimate_faster_than_the_prompt():
    """Attention over the whole prompt: twice the words, over twice the work; a
    draft model of its own and a baseline each prefill it again."""
    from analyses.run.measuredbudget import run_estimate

    def units(words, **kw):
        return run_estimate([words], 1, False, **kw).units

    assert units(4000) > 2 * units(2000) > 4 * units(1000)
    assert units(2000, draft_model=True) > 1.9 * units(2000)
    both = run_estimate([2000], 1, True, draft_model=True).units
    assert both > 2.9 * units(2000)  # three prefills (and two decodes) against one
    short = run_estimate([8] * 4, 64, True)
    assert short.units < 1.01 * 4 * 64 * 2  # the built-in chat prompts: decoding
