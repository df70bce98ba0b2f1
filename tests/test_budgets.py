"""Work budgets (analyses/run/budget.py): every long command estimates its work
before it starts, refuses it over the budget unless --allow-large, and the
estimate bounds what the simulation really does."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import Field

from analyses.compare.sweep import (expand_grid, grid_estimate, grid_settings, parse_sweep,
                                    point_config, points_settings, run_grid)
from analyses.run import budget, measuredbudget
from analyses.run.config import RunConfig
from policies import PolicyContext
from policies.base import REGISTRY, PolicyParams, register
from policies.ops import LM, SAMPLE, Forward, Head, Verify
from tests.clicases import assert_refused, run_cli

SMOL = dict(platform="cpu-local", target="smollm2-135m", draft=None)
N3 = ["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
      "llama-3.2-1b", "--policy", "sd", "--tokens", "1000000", "--batch", "16384",
      "--set", "memory_check=off"]
N2 = ["compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft", "none",
      "--policies", "ar,sd", "--set", "draft_layers=15", "--tokens", "50", "--jobs", "1",
      "--sweep", "gamma=1..64", "--sweep", "alpha=0.01..0.99:0.01",
      "--sweep", "prompt_tokens=1..100"]


@pytest.mark.parametrize("value, shown", [
    (0, "0"), (1234, "1,234"), (999_999_999, "999,999,999"), (1_234_567_890, "1.2e+09"),
    (10**180, "1.0e+180"), (1.5, "1.5"), (2.4e8, "240,000,000")])
def test_numbers_are_readable(value, shown):
    assert budget.readable(value) == shown


def test_a_huge_integer_is_never_printed_whole():
    assert budget.readable(10**5000).startswith("about 1e+")
    assert len(budget.readable(10**400)) < 12


@pytest.mark.parametrize("seconds, shown", [(0.2, "1 s"), (40, "40 s"), (600, "10 min"),
                                            (12_600, "3.5 h"), (10 * 86400, "10 days")])
def test_durations_read_as_time(seconds, shown):
    assert budget.duration(seconds) == shown


def test_n3_caps_together_are_refused_naming_the_product(tmp_path, monkeypatch):
    import analyses.commands.simulate as command  # patched where it is bound

    monkeypatch.chdir(tmp_path)
    # refused before any simulation starts (the estimate alone decides)
    monkeypatch.setattr(command, "simulate", lambda *a, **k: pytest.fail("simulated"))
    result = run_cli(*N3)
    assert_refused(result, "1,000,000 tokens x 16,384 sequences", "over the budget of "
                   "240,000,000 row-steps", "lower --tokens or --batch", "--allow-large")
    assert list(tmp_path.iterdir()) == []


def test_n2_grid_is_refused_before_it_is_built(tmp_path, monkeypatch):
    import analyses.compare.api as command  # patched where it is bound, so that
    import analyses.compare.sweep as sweep  # no later test keeps the patch

    monkeypatch.chdir(tmp_path)
    for module in (sweep, command):
        monkeypatch.setattr(module, "expand_grid", lambda *a, **k: pytest.fail("grid built"))
    result = run_cli(*N2, "-o", "out.html")
    assert_refused(result, "64 gamma x 99 alpha x 100 prompt_tokens", "643,500 simulations",
                   "narrow --sweep", "--allow-large")
    assert not (tmp_path / "out.html").exists()


def test_a_billion_point_grid_is_counted_without_building_it(monkeypatch):
    import analyses.compare.sweep as sweep

    monkeypatch.setattr(sweep, "expand_grid", lambda *a, **k: pytest.fail("grid built"))
    sweeps = [parse_sweep("alpha=0.001..1:0.001"), parse_sweep("prompt_tokens=1..1000"),
              parse_sweep("gamma=1..1000")]
    by_policy = grid_settings(["ar", "sd"], sweeps)
    estimate = grid_estimate(by_policy, dict(SMOL, tokens=50, batch=1), sweeps)
    assert by_policy["sd"][0] == 10**9 and by_policy["ar"][0] == 10**6
    assert estimate.over and "1.0e+09 simulations" in estimate.refusal()


def test_cs08_sweep_count_is_not_180_digits():
    with pytest.raises(ValueError, match=r"has 1\.0e\+180 values") as err:
        parse_sweep("gamma=1..1e180")
    assert len(str(err.value)) < 120


def test_the_api_grid_refuses_too_unless_allow_large(monkeypatch):
    import analyses.compare.sweep as sweep

    points = expand_grid(["sd"], [parse_sweep("gamma=2..8")])
    base = dict(SMOL, tokens=20000, batch=16384)
    with pytest.raises(ValueError, match="this compare is .* over the budget"):
        run_grid(points, base, jobs=1, quiet=True)
    monkeypatch.setattr(sweep, "check_points", lambda *a: (_ for _ in ()).throw(
        RuntimeError("past the budget")))
    with pytest.raises(RuntimeError, match="past the budget"):
        run_grid(points, base, jobs=1, quiet=True, allow_large=True)


def test_budget_edge_from_both_sides():
    def estimate(tokens):
        return budget.config_estimate(RunConfig(**SMOL, policy="ar", params={},
                                                acceptance={"kind": "iid"}, tokens=tokens,
                                                batch=16384, memory_check=False))
    assert not estimate(14591).over and estimate(14592).over
    with pytest.raises(ValueError, match="over the budget"):
        budget.check(estimate(14592))
    assert budget.check(estimate(14592), allow_large=True).over


def test_long_work_prints_its_estimate_line(capsys):
    estimate = budget.config_estimate(RunConfig(**SMOL, policy="ar", params={},
                                                acceptance={"kind": "iid"}, tokens=14591,
                                                batch=16384, memory_check=False))
    budget.check(estimate)
    line = capsys.readouterr().err.strip()
    assert line.startswith("hetspec: 1 simulation of 14,591 tokens x 16,384 sequences, "
                           "at most about 10 min (239,994,896 row-steps at 400,000 per second)")


@pytest.mark.torch
def test_run_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import executors.measure

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(executors.measure, "measure", lambda *a, **k: pytest.fail("loaded"))
    result = run_cli("run", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--policy", "sd", "--set", "draft_layers=15", "--max-new-tokens", "126",
                     "--inline", "--out", "r")
    assert_refused(result, "4 prompts x 126 new tokens x 2 runs", "1,008 generated tokens",
                   "over the budget of 1,000")
    assert not (tmp_path / "r").exists()


def test_replay_counts_spans_lines_before_parsing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.json").write_text(json.dumps({"kind": "measured", "spans": "spans.jsonl"}))
    (run / "spans.jsonl").write_text("not json\n" * 50_001)  # never parsed
    result = run_cli("replay", str(run / "record.json"), "--trace", str(tmp_path / "t.json"))
    assert_refused(result, "1 measured run holding 50,001 spans lines",
                   "over the budget of 50,000 spans lines")
    (run / "spans.jsonl").write_text("x\n" * 3 + "no newline at the end")
    assert measuredbudget.count_lines(run / "spans.jsonl") == 4


def test_help_states_each_budget():
    for command in ("simulate", "compare", "replay", "run", "calibrate"):
        result = run_cli(command, "--help")
        text = " ".join(result.out.split())
        assert "--allow-large" in text and "budget" in text and "minutes" in text, command


# ---------------------------------------------------------------- property tests
GAMMAS = st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True)
ALPHAS = st.lists(st.sampled_from([0.3, 0.5, 0.7, 0.9]), min_size=1, max_size=2, unique=True)


@settings(max_examples=20, deadline=None)
@given(drafted=st.lists(st.sampled_from(["sd", "eesd", "mirror"]), min_size=1, max_size=2,
                        unique=True),
       with_ar=st.booleans(), gammas=GAMMAS, alphas=ALPHAS,
       tokens=st.integers(1, 1_000_000), batch=st.integers(1, 16_384))
def test_estimate_bounds_the_simulations_and_refusal_is_the_budget(drafted, with_ar, gammas,
                                                                   alphas, tokens, batch):
    """The count is never below the grid's true simulations (its points and their
    distinct AR baselines), the estimate from the spec equals the one from the
    built grid, and the API refuses exactly when it is over the budget."""
    from analyses.compare.sweep import _baseline_key

    policies = ["ar"] * with_ar + drafted
    sweeps = [("gamma", gammas), ("alpha", alphas)]
    base = dict(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b",
                tokens=tokens, batch=batch)
    points = expand_grid(policies, sweeps)
    spec = grid_estimate(grid_settings(policies, sweeps), base, sweeps)
    built = grid_estimate(points_settings(points), base)
    configs = [point_config(p, base) for p in points]
    baselines = {_baseline_key(c) for c in configs if c.policy != "ar"}
    assert spec.simulations >= len(points) + len(baselines)
    assert spec.units == built.units
    with mock.patch("analyses.compare.sweep.check_points", side_effect=Passed):
        try:
            run_grid(points, base, jobs=1, quiet=True)
            refused = None  # unreachable: check_points raises Passed
        except Passed:
            refused = False
        except ValueError as exc:
            refused = "over the budget" in str(exc)
    assert refused == (built.units > budget.SIM_BUDGET_UNITS)


class Passed(Exception):
    """The grid passed its budget check and reached its validation."""


@settings(max_examples=8, deadline=None)
@given(policy=st.sampled_from(["ar", "sd", "tree", "eesd"]), gamma=st.integers(1, 8),
       alpha=st.sampled_from([0.0, 0.5, 0.95]), tokens=st.integers(1, 60),
       batch=st.integers(1, 4))
def test_a_run_takes_no_more_steps_than_the_estimate_counts(policy, gamma, alpha, tokens,
                                                            batch):
    """What the runtime scales with: decoding steps x rows is bounded by the
    estimate's tokens x batch (every step commits a token per sequence)."""
    from analyses.run.api import run_schedule

    params = {"draft_layers": 8} if policy in ("sd", "tree") else {}
    if policy in ("sd", "eesd"):
        params["gamma"] = gamma
    config = RunConfig(**SMOL, policy=policy, params=params,
                       acceptance={"kind": "iid", "alpha": alpha}, tokens=tokens,
                       batch=batch)
    shape = budget.config_shape(config)[0]
    result = run_schedule(config, record_spans=False)
    steps = result.stats.get("steps", result.steps)
    assert steps <= shape.tokens
    assert shape.units >= steps * batch


# ------------------------------------------- a step's work, asked of the schedule
class RoundsParams(PolicyParams):
    rounds: int = Field(3, ge=1, le=500, description="draft passes a step")


def _rounds(ctx: PolicyContext, p: RoundsParams):
    """A step of ``rounds`` one-layer self-draft passes, a verify pass and its verdict."""
    n, b, done = ctx.target.n_layers, ctx.batch, 0.0
    while done < ctx.budget:
        for i in range(p.rounds):
            yield Forward("target", "draft", (0, 1), 1, b, ctx.prompt_tokens + i,
                          head=Head("exit"), emit=SAMPLE, label="draft")
        logits = yield Forward("target", "target", (0, n), p.rounds + 1, b, ctx.prompt_tokens,
                               head=LM, label="verify")
        verdict = yield Verify(p.rounds, b, target=logits, label="verify")
        done += verdict.tokens


@pytest.fixture
def rounds_schedule():
    register("rounds_only", RoundsParams)(_rounds)
    yield "rounds_only"
    del REGISTRY["rounds_only"]


def test_a_schedules_step_is_counted_by_its_dry_run_not_its_parameters_names(
        rounds_schedule, monkeypatch):
    """A parameter no table names ("rounds") still counts: the dry run sees the
    step's rounds + 2 operations; a grid is dry-run at its corners, each once."""
    models = budget.Models("smollm2-135m")
    shape = budget.sim_shape(rounds_schedule, {"rounds": [7]}, 10, 1, models)
    assert (shape.ops, shape.row_levels, shape.nodes) == (9, 1, 0)
    assert shape.units == budget.SIM_FIXED_UNITS + 10 * (32 * 9 + 1) + 4 * 32
    asked = []
    real = budget._dry_step
    monkeypatch.setattr(budget, "_dry_step", lambda *a: asked.append(a[:2]) or real(*a))
    monkeypatch.setattr(budget, "_STEPS", {})
    grid = {"rounds": [20, 2, 50, 9, 31], "alpha": [0.1, 0.5, 0.9]}
    assert budget.sim_shape(rounds_schedule, grid, 10, 1, models).ops == 52
    assert budget.sim_shape(rounds_schedule, grid, 10, 1, models).ops == 52
    assert sorted(p.get("rounds", 0) for _, p in asked) == [0, 2, 50]  # 0: AR's baseline
    assert [policy for policy, p in asked if not p] == ["ar"]


def test_a_tree_is_counted_from_its_widest_pass():
    """The tree schedule's verify pass scores its 1,024 nodes and root; its rows
    are walked once per operation of the step and once more where its first
    draft pass catches up."""
    config = RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                       policy="tree", params={"nodes": 1024, "depth": 32, "width": 32},
                       acceptance={"kind": "iid"}, tokens=20, batch=64, memory_check=False)
    shape, base = budget.config_shape(config)
    assert shape.nodes == 1025 and shape.ops >= 34 and shape.row_levels == shape.ops
    assert (base.ops, base.nodes, base.row_levels) == (2, 0, 1)  # AR: a pass and its verdict


def test_corners_of_a_grid():
    found = budget.corners({"gamma": [4, 2, 8, 6], "tree": [(4, 2), (2, 2, 2), (4, 2)],
                             "proposer": ["model", "ngram"]})
    assert len(found) == 2 * 2 * 2
    assert {(c["gamma"], c["tree"]) for c in found} == {
        (2, (4, 2)), (8, (4, 2)), (2, (2, 2, 2)), (8, (2, 2, 2))}
    many = {f"k{i}": [1, 2] for i in range(7)}  # 128 corners: each key alone, then all
    assert len(budget.corners(many)) == 7 * 2 + 1


@pytest.mark.parametrize("policy, fixed, key, values", [
    ("sd", {}, "gamma", [1, 3, 8]), ("mirror", {}, "gamma", [2, 9]),
    ("ssd", {"hit_rate": [0.7], "fanout": [8]}, "k", [2, 8]),
    ("ar_stream", {}, "dram_budget_gb", [4.0, 16.0])])
def test_a_grid_bounds_every_point_it_holds(policy, fixed, key, values):
    """A grid's estimate is its costliest point's (whichever end of a range that is)."""
    models = budget.Models("qwen3-32b", "qwen3-0.6b")
    grid = budget.point_units(policy, {**fixed, key: values}, 50, 4, models)
    points = []
    for v in values:
        point = {**{k: vals[0] for k, vals in fixed.items()}, key: v}
        assert budget.step_work(policy, point, models, budget.DEFAULT_PROMPT) is not None
        points.append(budget.point_units(policy, {k: [x] for k, x in point.items()}, 50, 4,
                                         models))
    assert grid == (max(p[0] for p in points), max(p[1] for p in points))
    assert len({p[0] for p in points}) > 1  # the key changes the step's work


# The README's first command is a bare `hetspec compare` (the built-in scenario,
# an M2 Ultra with no flash tier). Its weight-streaming schedules cannot run there
# and are skipped at the cost of that failure, so the work budget leaves them out
# (analyses.compare.scenario.runnable); counted, they alone put the estimate at 15
# minutes over the 10-minute budget for a comparison that takes seconds.
def test_the_readme_compare_runs_within_its_budget(tmp_path):
    from analyses.compare.scenario import runnable

    result = run_cli("compare", "-o", tmp_path / "report.html", "--json")
    assert result.rc == 0, result.err
    skipped = json.loads(result.out)["skipped"]
    assert {"ar_stream", "cats", "kangaroo"} <= set(skipped)
    base = {"platform": "m2-ultra-8x", "target": "qwen3-32b", "draft": "qwen3-0.6b",
            "tokens": 1000}
    assert runnable(["ar", "cats", "sd"], {"dram_budget_gb": 20.0}, base) == ["ar", "sd"]
    flash = {**base, "platform": "jetson-agx-orin-64gb", "target": "vicuna-7b", "draft": None}
    assert "ar_stream" in runnable(["ar_stream"], {"dram_budget_gb": 4.0}, flash)


@pytest.mark.parametrize("load, expected", [
    ((0.4, 2), ""),  # idle: one core for the command
    ((0.9, 2), ""),  # a second thread busy: 1.45x, not yet said
    ((2.1, 2), "; the machine is busy (load average 2.1 on 2 cores), so expect about 3 min"),
    ((7.0, 2), "; the machine is busy (load average 7.0 on 2 cores), so expect about 8 min"),
    ((7.0, 16), ""),  # the same load on sixteen cores leaves cores free
    (None, ""),  # no load average on this system
])
def test_an_estimate_on_a_busy_machine_says_what_the_load_makes_of_it(load, expected):
    from analyses.run.budget import busy_clause

    assert busy_clause(120.0, load) == expected
