"""A published row's printed acceptance: mean accepted tokens per target step.

Benchmarks of speculative decoding (Spec-Bench, the EAGLE papers) print, beside
the speedup, the mean number of tokens each target step commits (1.00 for AR):
what the simulation needs to know of the drafts' quality, not an i.i.d. alpha.
``matched_config`` finds the i.i.d. alpha at which the row's own schedule,
simulated deterministically, commits that many tokens per step (bisection: the
mean grows with alpha), so a row is simulated at the acceptance its source
measured and only its speed is predicted. Rounds are whole in a deterministic
run, so the match is as close as the run's length allows (1024 tokens: about
0.1% of the mean).
"""

from __future__ import annotations

from analyses.run.api import run_schedule

ALPHA_LOW, ALPHA_HIGH = 1e-4, 0.9999
ITERATIONS = 30  # halves the alpha interval to ~1e-9
_CACHE: dict[str, float] = {}


def tokens_per_step(config, platform) -> float:
    """Tokens committed per target step of one sequence, simulated deterministically."""
    result = run_schedule(config, record_spans=False, platform=platform)
    return result.tokens / (max(result.steps, 1) * config.batch)


def _with_alpha(config, alpha: float):
    return config.revised(acceptance={"kind": "iid", "alpha": alpha})


def match_alpha(config, mean_tokens: float, platform) -> float:
    """The i.i.d. alpha at which ``config`` commits ``mean_tokens`` per step;
    ValueError (one sentence) where no alpha reaches it."""
    key = config.model_dump_json(exclude={"acceptance"}) + f"|{mean_tokens!r}"
    if key in _CACHE:
        return _CACHE[key]
    low, high = ALPHA_LOW, ALPHA_HIGH
    top = tokens_per_step(_with_alpha(config, high), platform)
    if mean_tokens > top:
        raise ValueError(f"mean_accepted_tokens {mean_tokens} is more than {config.policy} "
                         f"with these settings can commit per step ({top:.3g} at alpha "
                         f"{high}); check the row's schedule parameters")
    for _ in range(ITERATIONS):
        mid = 0.5 * (low + high)
        if tokens_per_step(_with_alpha(config, mid), platform) < mean_tokens:
            low = mid
        else:
            high = mid
    _CACHE[key] = high
    return high


def matched_config(config, mean_tokens: float | None, platform):
    """``config`` with its acceptance set to match ``mean_tokens`` (unchanged when None)."""
    if mean_tokens is None:
        return config
    return _with_alpha(config, match_alpha(config, mean_tokens, platform))
