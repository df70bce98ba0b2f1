"""The comparison's Python API (``analyses.compare.api``): its docstring example runs
as written, and a comparison over the work budget is refused before any point is
simulated, tuned or swept."""

from __future__ import annotations

import doctest

import pytest

import analyses.compare.api as api
from analyses.compare.api import Scenario, compare
from analyses.run import budget
from simcore import Simulator

H100 = dict(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b")


def test_the_docstring_example_runs():
    found = doctest.testmod(api, optionflags=doctest.ELLIPSIS)
    assert found.attempted >= 4 and found.failed == 0


def test_compare_returns_the_points_the_summary_and_the_report_data():
    found = compare(Scenario(**H100, policies=["ar", "ssd"], sweeps=[("k", [2, 3])],
                             tokens=20, jobs=1))
    assert [r.point.policy for r in found.points] == ["ar", "ssd", "ssd"]
    summary = found.summary()
    assert summary["points"] == 3 and summary["fastest"] in {r.point.label
                                                             for r in found.points}
    # SSD declares its hit rate for a comparison to fill in, and what it means
    assert found.scenario.sets["hit_rate"] == pytest.approx(0.7)
    assert "pre-speculated: an assumption unless --set hit_rate" in found.html()


@pytest.mark.parametrize("sweeps", [[], [("gamma", [2, 4])]], ids=["tuned", "swept"])
def test_the_budget_is_counted_before_any_simulation(sweeps, monkeypatch):
    def no_simulation(*args, **kwargs):
        raise AssertionError("a point was simulated before the budget check")

    monkeypatch.setattr(Simulator, "run", no_simulation)
    # a budget a few tokens wide: the comparison's estimate alone refuses it
    monkeypatch.setattr(budget, "SIM_BUDGET_UNITS", 10)
    with pytest.raises(ValueError, match="over the budget"):
        compare(Scenario(**H100, policies=["ar", "sd", "cats"], sweeps=sweeps, tokens=20,
                         jobs=1))


def test_a_scenario_past_the_targets_positions_is_refused_before_any_report(tmp_path):
    """Every run of it would pass the target's trained positions: one refusal of the
    scenario, and no report in which no schedule applies."""
    from tests.clicases import run_cli

    out = run_cli("compare", "--tokens", "1000000", "-o", tmp_path / "r.html")
    assert out.rc == 2
    assert ("1,000,128 positions pass the 40,960 the target model qwen3-32b was trained "
            "for") in out.err
    assert not (tmp_path / "r.html").exists()
