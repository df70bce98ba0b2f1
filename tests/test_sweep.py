"""Sweep grammar, grid expansion, and parallel runs that match serial ones."""

from __future__ import annotations

import pytest

from analyses.compare.sweep import Point, expand_grid, parse_sweep, point_config, run_grid

BASE = dict(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b", tokens=120)


@pytest.mark.parametrize("spec, key, values", [
    ("gamma=2..6", "gamma", [2, 3, 4, 5, 6]),
    ("alpha=0.6..0.9:0.1", "alpha", [0.6, 0.7, 0.8, 0.9]),
    ("gamma=2,4,8", "gamma", [2, 4, 8]),
    ("gamma=5", "gamma", [5]),
    ("gamma=3..3", "gamma", [3]),
])
def test_parse_sweep(spec, key, values):
    assert parse_sweep(spec) == (key, values)


@pytest.mark.parametrize("spec, message", [
    ("gamma=6..2", "empty range"),
    ("gamma", "expects KEY=RANGE"),
    ("gamma=", "expects KEY=RANGE"),
    ("gamma=a..4", "is not a number"),
    ("alpha=0.1..0.5:0", "step must be > 0"),
])
def test_parse_sweep_rejects(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_sweep(spec)


def test_grid_drops_keys_a_policy_does_not_take():
    points = expand_grid(["ar", "sd"], [parse_sweep("gamma=2..3")], {"alpha": 0.7})
    assert points == [Point("ar", (("alpha", 0.7),)),
                      Point("sd", (("gamma", 2), ("alpha", 0.7))),
                      Point("sd", (("gamma", 3), ("alpha", 0.7)))]
    config = point_config(points[1], BASE)
    assert config.given("params") == {"gamma": 2}
    assert config.given("acceptance") == {"kind": "iid", "alpha": 0.7}
    assert point_config(points[0], BASE).draft is None


def test_grid_rejects_a_key_no_policy_takes():
    with pytest.raises(ValueError, match="no chosen policy takes 'gama'"):
        expand_grid(["ar", "sd"], [parse_sweep("gama=2..3")])


def test_parallel_runs_equal_serial_runs_in_grid_order():
    points = expand_grid(["sd", "ar"], [parse_sweep("gamma=1..4")])
    serial = run_grid(points, BASE, jobs=1, quiet=True)
    parallel = run_grid(points, BASE, jobs=2, quiet=True)
    assert [r.point for r in parallel] == points
    assert [r.metrics for r in parallel] == [r.metrics for r in serial]
    assert [r.accepted for r in parallel] == [r.accepted for r in serial]
    sd2 = serial[1].metrics
    assert sd2["speedup_vs_ar"] == pytest.approx(
        sd2["tokens_per_s"] / serial[-1].metrics["tokens_per_s"])
    assert sum(serial[1].accepted.values()) == sd2["steps"]


def test_ray_backend_matches_local():
    ray = pytest.importorskip("ray")
    points = expand_grid(["ar", "sd"], [parse_sweep("gamma=2..3")])
    local = run_grid(points, BASE, jobs=1, quiet=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_grid(points, BASE, backend="ray", quiet=True)
    finally:
        ray.shutdown()
    assert [r.metrics for r in remote] == [r.metrics for r in local]
