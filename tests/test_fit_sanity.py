"""The calibration sanity gate (analyses.calibrate.sanity, .fitgate): a fit whose
numbers end on a bound, that its rows cannot identify, or whose fitted rows stay
far off is refused and writes nothing unless --accept-poor-fit; published rows
are checked against the roofline before fitting; calibrate's list options
refuse empty and repeated items and options of the other calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.calibrate import sanity
from analyses.calibrate.fitgate import check_published_units, roofline_platform
from analyses.calibrate.published import load_published, rows_for, shipped_file, simulate_row
from analyses.calibrate.publishedcal import calibrate_published
from analyses.calibrate.session import calibrate
from analyses.cli import main
from hwprofiles import load_platform

A100 = "a100-sxm-8x"


def _a100_rows() -> list[dict]:
    rows = yaml.safe_load(shipped_file().read_text())["measurements"]
    return [r for r in rows if r["platform"] == A100]


def _write(path, speed) -> str:
    rows = [dict(r, tokens_per_s=speed(r)) for r in _a100_rows()]
    path.write_text(yaml.safe_dump({"measurements": rows}, sort_keys=False))
    return str(path)


def _fitted(label="x", field=None, x=0.0, start=0.0, lo=-5.0, hi=5.0):
    return sanity.Fitted(label, field, x, start, lo, hi, math.exp(x))


# --------------------------------------------------------------- the rules alone
def test_an_arbitrary_bound_is_refused_whatever_the_rows_say():
    on_edge = _fitted("device d.multirow_memory_factor", "multirow_memory_factor", x=4.995)
    problems = sanity.bound_problems([on_edge], lambda i, dx: 0.0, "fix it")
    assert len(problems) == 1 and "edge of its search range" in problems[0]
    inside = _fitted("device d.multirow_memory_factor", "multirow_memory_factor", x=4.9)
    assert sanity.bound_problems([inside], lambda i, dx: 1.0, "fix it") == []


def test_a_physical_limit_is_refused_only_when_the_rows_push_past_it():
    eff = _fitted("tier t.memory_efficiency", "memory_efficiency", x=0.0, lo=-9.2, hi=0.0)
    pushed = []
    content = sanity.bound_problems([eff], lambda i, dx: pushed.append(dx) or 0.001, "f")
    assert content == [] and pushed == [sanity.NUDGE]  # nudged upward, past the peak
    refused = sanity.bound_problems([eff], lambda i, dx: 0.2, "f")
    assert len(refused) == 1 and "above its physical limit" in refused[0]
    zero = _fitted("device d.launch_overhead_s", "launch_overhead_s", x=-20.715, lo=-20.72)
    assert "below zero" in sanity.bound_problems([zero], lambda i, dx: 0.5, "f")[0]


def test_a_direction_no_row_measures_may_not_move_the_profile():
    numbers = [_fitted("a", "memory_efficiency", x=0.3), _fitted("b", "launch_overhead_s", x=0.3)]
    jac = np.array([[1.0, -1.0], [2.0, -2.0]])  # a + b is not measured
    (problem,) = sanity.null_problems(numbers, jac, 2, "fix")
    assert "the fitted rows do not measure a apart from b" in problem
    still = [_fitted("a", "memory_efficiency", x=0.3), _fitted("b", "launch_overhead_s", x=-0.3)]
    assert sanity.null_problems(still, jac, 2, "fix") == []  # moved along a - b: measured
    unknown = [_fitted("a", None, x=3.0), _fitted("b", None, x=3.0)]  # a row's guess moved
    assert sanity.null_problems(unknown, jac, 2, "fix") == []
    off = [_fitted("a", "memory_half_bytes"), _fitted("b", "launch_overhead_s")]
    off[0] = sanity.Fitted("a", "memory_half_bytes", 0.0, 0.0, -5, 5, 1e6, "off in the profile")
    (problem,) = sanity.null_problems(off, jac, 2, "fix")  # not moved, but from a stand-in
    assert problem.startswith("a starts at a stand-in (off in the profile)")
    assert "would write 1e+06" in problem


def test_an_off_term_no_row_measures_is_not_written_at_its_stand_in(tmp_path):
    fields = ("memory_efficiency", "launch_overhead_s", "alpha_s", "memory_half_bytes")
    with pytest.raises(ValueError, match="memory_half_bytes starts at a stand-in"):
        calibrate_published(shipped_file(), A100, tmp_path / "cal.yaml", fields=fields)
    assert not (tmp_path / "cal.yaml").exists()


def test_far_off_rows_name_the_worst_and_enforce_refuses_the_first():
    assert sanity.error_problem([("r1", 0.4), ("r2", -0.3)], "row", "f") is None
    problem = sanity.error_problem([("r1", 0.6), ("r2", -0.9), ("r3", 0.1)], "row", "f")
    assert "worst row r2 -90.0%" in problem and "median |error| 60.0%" in problem
    with pytest.raises(ValueError, match="nothing written: p1 .1 more problem"):
        sanity.enforce(["p1", "p2"], accept_poor_fit=False)
    assert sanity.enforce(["p1", "p2"], accept_poor_fit=True) == ["p1", "p2"]


# -------------------------------------------------------------- the review's cases
@pytest.mark.parametrize("speed, words", [
    (lambda r: 1e9, "times what a100-sxm-8x reaches at its roofline"),
    (lambda r: 1e-9, "ms/token typed as tokens/s"),
])
def test_absurd_rows_are_refused_before_fitting_even_when_accepted(tmp_path, capsys, speed,
                                                                   words):
    path = _write(tmp_path / "pub.yaml", speed)
    out = tmp_path / "cal.yaml"
    for extra in ([], ["--accept-poor-fit"]):
        rc = main(["calibrate", "--published", path, "--profile", A100, "-o", str(out),
                   *extra])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and "row gptfast-a100-llama2-7b-tp1 (line 2)" in err
        assert not out.exists()


def test_ms_per_token_rows_are_refused_and_written_only_when_accepted(tmp_path, capsys):
    path = _write(tmp_path / "ms.yaml", lambda r: round(1000 / r["tokens_per_s"], 3))
    out = tmp_path / "cal.yaml"
    args = ["calibrate", "--published", path, "--profile", A100, "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "calibration refused, nothing written" in err and not out.exists()
    assert main(args + ["--accept-poor-fit"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    warnings = [ln for ln in lines if ln.startswith("hetspec: warning:")]
    assert warnings and all(ln.startswith("hetspec: warning: poor fit written anyway")
                            for ln in warnings)
    assert not any("error:" in ln for ln in lines)
    assert any("fitted rows stay far off" in ln for ln in warnings) and out.exists()
    assert "# poor fit written with --accept-poor-fit: the fitted rows stay far off" in \
        out.read_text()  # the profile's provenance says so


def test_shipped_calibration_passes_the_gate(tmp_path):
    summary = calibrate_published(shipped_file(), A100, tmp_path / "cal.yaml")
    assert summary["problems"] == [] and (tmp_path / "cal.yaml").exists()


@pytest.mark.parametrize("argv, words", [
    (["--published", "shipped", "--fit-terms", "memory_half_bytes"], "--fit-fields"),
    (["--published", "shipped", "--fit-fields", "memory_efficiency,memory_efficiency"],
     "names 'memory_efficiency' twice"),
    (["--published", "shipped", "--fit-fields", "memory_efficiency,,alpha_s"], "empty item"),
    (["--published", "shipped", "--fit-policies", "ar"], "each row's split"),
    (["--runs", "nowhere", "--fit-fields", "alpha_s"], "use it with --published"),
    (["--runs", "nowhere", "--fit-policies", "ar,sd,ar"], "names 'ar' twice"),
])
def test_options_silently_ignored_or_repeated_are_refused(tmp_path, capsys, argv, words):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--profile", A100, "-o", str(out), *argv]) == 2
    assert words in capsys.readouterr().err and not out.exists()


def test_runs_that_push_an_efficiency_past_one_are_refused(tmp_path):
    from tests.test_calibrate import _make_runs

    runs = _make_runs(tmp_path / "runs", noise=0.0, outliers=0.0)
    good = calibrate(runs, "cpu-local", tmp_path / "good.yaml")
    assert good["problems"] == []
    data = load_platform("cpu-local").model_dump(mode="json", exclude_unset=True)
    for tier in data["memory_tiers"]:  # DRAM 10x slower than the runs' machine
        if tier["kind"] == "dram":
            tier["bandwidth_gb_s"] /= 10
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="calibration refused, nothing written: the fitted "
                                         "spans stay far off"):
        calibrate(runs, str(slow), tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()
    accepted = calibrate(runs, str(slow), tmp_path / "bad.yaml", accept_poor_fit=True)
    assert any("tier dram.memory_efficiency above its physical limit" in p
               for p in accepted["problems"]) and (tmp_path / "bad.yaml").exists()


# ---------------------------------------------------------------- property tests
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log_factor=st.one_of(st.floats(2, 6), st.floats(-12, -4)))
def test_rows_scaled_far_from_the_hardware_are_refused(tmp_path, log_factor):
    """Every row scaled by >= 100x (to the schema's cap of 1e9 tokens/s) or
    <= 1e-4: refused (a wrong unit before the fit, or a fit past the hardware's
    limits after it), nothing written."""
    path = _write(tmp_path / "scaled.yaml", lambda r: r["tokens_per_s"] * 10 ** log_factor)
    out = tmp_path / "cal.yaml"
    with pytest.raises(ValueError, match="wrong unit|calibration refused"):
        calibrate_published(path, A100, out)
    assert not out.exists()


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log_factor=st.one_of(st.floats(math.log10(200), 6), st.floats(-12, -4.3)))
def test_the_unit_check_alone_refuses_rows_far_past_the_roofline(tmp_path, log_factor):
    """>= 200x or <= 5e-5 of the published speeds is refused before any fit."""
    path = _write(tmp_path / "scaled.yaml", lambda r: r["tokens_per_s"] * 10 ** log_factor)
    with pytest.raises(ValueError, match="wrong unit"):
        check_published_units(path, load_platform(A100), rows_for(load_published(path), A100))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.lists(st.floats(-0.03, 0.03), min_size=7, max_size=7),
       efficiency=st.floats(0.5, 0.95))
def test_rows_the_profile_itself_predicts_are_accepted_and_recovered(tmp_path, noise,
                                                                     efficiency):
    """Rows simulated on the a100 with another memory efficiency, with <= 3% noise:
    the gate accepts the fit and the fitted rows come back within the noise."""
    platform = load_platform(A100)
    truth = platform.model_copy(update={"memory_tiers": tuple(
        t.model_copy(update={"memory_efficiency": efficiency})
        for t in platform.memory_tiers)})
    rows = rows_for(load_published(shipped_file()), A100)
    speeds = {r.id: simulate_row(r, truth) * (1 + e) for r, e in zip(rows, noise)}
    path = _write(tmp_path / "own.yaml", lambda r: speeds[r["id"]])
    summary = calibrate_published(path, A100, tmp_path / "cal.yaml")
    assert summary["problems"] == []
    assert summary["median_abs_error_fit"] < 0.05
    after = next(p["after"] for label, p in summary["parameters"].items()
                 if label.endswith("memory_efficiency"))
    assert after == pytest.approx(efficiency, rel=0.08)


def test_the_roofline_platform_is_at_least_as_fast_as_the_profile():
    platform = load_platform(A100)
    for row in rows_for(load_published(shipped_file()), A100):
        assert simulate_row(row, roofline_platform(platform)) >= simulate_row(row, platform)
