"""The integer search that puts each schedule at its best setting."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from analyses.compare.tune import Search, run_searches, searches


def evaluator(curves):
    calls = []

    def evaluate(batch):
        calls.append(len(batch))
        return [curves[p](v) for p, _k, v in batch]
    return evaluate, calls


def test_a_peak_beyond_the_default_grid_is_found():
    s = Search("mirror", "gamma", 1, 64, 7)
    evaluate, calls = evaluator({"mirror": lambda g: -(g - 16) ** 2})
    run_searches([s], evaluate)
    assert s.best == 16 and s.on_bound is None
    assert len(s.scores) <= 16 and len(calls) <= 6  # few rounds, few points


def test_a_best_value_on_the_valid_bound_is_reported():
    s = Search("sd", "gamma", 1, 64, 4)
    evaluate, _ = evaluator({"sd": lambda g: g})  # faster the longer the draft
    run_searches([s], evaluate)
    assert s.best == 64 and s.on_bound == "gamma=64 is the largest value sd allows"


def test_failed_points_are_passed_over():
    s = Search("ssd", "k", 1, 32, 5)
    evaluate, _ = evaluator({"ssd": lambda k: None if k > 6 else k})
    run_searches([s], evaluate)
    assert s.best == 6


def test_only_schedules_with_an_unset_tuned_parameter_are_searched():
    found = searches(["ar", "sd", "mirror", "ssd", "tree"], fixed={"gamma"})
    assert [(s.policy, s.key, s.lo, s.hi, s.start) for s in found] == [("ssd", "k", 1, 32, 5)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.floats(0.01, 10))
def test_a_unimodal_curve_is_maximised_exactly(start, peak, width):
    s = Search("sd", "gamma", 1, 64, start)
    evaluate, _ = evaluator({"sd": lambda g: -abs(g - peak) * width})
    run_searches([s], evaluate)
    assert s.best == peak
    # the best value is bracketed by evaluated neighbours (or the valid bounds)
    assert peak == 1 or peak - 1 in s.scores
    assert peak == 64 or peak + 1 in s.scores


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 32), st.integers(1, 32), st.integers(0, 3))
def test_a_search_never_evaluates_more_points_than_its_estimate_counts(start, peak, noise):
    s = Search("sd", "gamma", 1, 32, start)
    bumpy = lambda g: -abs(g - peak) + (noise if g % 3 == 0 else 0)  # noqa: E731
    evaluate, _ = evaluator({"sd": bumpy})
    run_searches([s], evaluate)
    assert len(s.scores) <= s.max_points


def test_compare_tunes_each_schedule_past_a_fixed_grid(tmp_path, capsys):
    """The default scenario: Mirror-SD's best gamma lies beyond the old 2..8 grid;
    an explicit --sweep whose edge holds the best is flagged."""
    import json

    from analyses.cli import main

    assert main(["compare", "--policies", "ar,mirror", "--tokens", "300", "--jobs", "1",
                 "-o", str(tmp_path / "t.html"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    gamma = int(summary["fastest"].split("gamma=")[1].rstrip(")"))
    assert summary["fastest"].startswith("mirror(") and gamma > 8
    assert main(["compare", "--policies", "ar,mirror", "--tokens", "300", "--jobs", "1",
                 "--sweep", "gamma=2..8", "-o", str(tmp_path / "g.html"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes == ["mirror: its best gamma=8 is on the edge of --sweep gamma; widen the "
                     "sweep (or leave --sweep out to search the whole range)"]
    assert "on the edge of --sweep gamma" in (tmp_path / "g.html").read_text()
