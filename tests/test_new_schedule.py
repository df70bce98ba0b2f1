"""Adding a schedule touches its own module only. The schedule below (a self-draft of
the target's first layers proposes ``gamma`` tokens on the draft's device, one
verify takes them) is written and registered here, once: its parameters, its
closed form, its law terms, its law view and its tuned knob all go to the one
``register(...)`` call of ``shallow_pair``. From that alone it is simulated,
sized, prefilled and footprinted, evaluated by ``hetspec law``, compared tuned on
equal terms with its best gamma found, drawn in the report's law view, and (with
torch) run by the executor through ``hetspec run``, replayed and calibrated
against. No table elsewhere names it: a comparison layer that still kept one (a
tuned-knob table, a law table, a name switch for law figures) would leave it
untuned or undrawn, and the assertions below fail."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import Field

from analyses.cli import main
from analyses.compare.api import Scenario, compare
from analyses.compare.best import best_per_policy
from analyses.run.memory import Run, pieces
from executors.coordinate.footprint import footprint
from hwprofiles import load_model, load_platform
from policies import PolicyContext, build
from policies.base import REGISTRY, LawCosts, PolicyParams, register
from policies.declared import LawView, Positive, Tuned
from policies.ops import LM, SAMPLE, Feed, Forward, Head, Verify
from policies.prefill import segments_of

NAME = "shallow_pair"
ROOT = Path(__file__).resolve().parents[1]
H100 = ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b"]
MOST_GAMMA = 12
# one short run of a tiny random model measures memory time alone: the fit holds what
# its spans cannot identify, as the stored calibration case does (tests/test_golden.py),
# and is written whatever its quality, which depends on the machine's load while the
# run was measured (--accept-poor-fit): what is tested is that calibration prices the
# new schedule's measured spans, not how well a few of them fit
HELD = "compute_efficiency,roofline_exponent,call_overhead_s,multirow_memory_factor"


class PairParams(PolicyParams):
    exit_at: int = Field(4, ge=1, description="the self-draft's layers")
    gamma: int = Field(2, ge=1, le=MOST_GAMMA, description="tokens proposed a step")


def _pair(ctx: PolicyContext, p: PairParams):
    n, b, done = ctx.target.n_layers, ctx.batch, 0.0
    while done < ctx.budget:
        context = ctx.context(done / b)
        for i in range(p.gamma):
            yield Forward("target", "draft", (0, p.exit_at), 1, b, context + i,
                          head=Head("exit"), emit=SAMPLE, feed=Feed(catch_up=i == 0),
                          label="draft")
        logits = yield Forward("target", "target", (0, n), p.gamma + 1, b, context, head=LM,
                               label="verify")
        verdict = yield Verify(p.gamma, b, target=logits, label="verify")
        done += verdict.tokens


def pair_law(tokens_per_step: Positive, t_ar_s: Positive, t_step_s: Positive) -> dict:
    """Speedup over AR: the tokens a step commits at AR's pace, over the step's time."""
    return {"speedup": tokens_per_step * t_ar_s / t_step_s}


@dataclass(frozen=True)
class PairTerms:
    t_ar_s: float
    t_step_s: float

    def curve(self, tokens_per_step: float) -> float:
        return pair_law(tokens_per_step, self.t_ar_s, self.t_step_s)["speedup"]

    def metrics(self) -> dict:
        return {"step_latency_s": self.t_step_s}


def pair_terms(costs: LawCosts, ctx: PolicyContext, p: PairParams) -> PairTerms:
    n, b, c = ctx.target.n_layers, costs.batch, costs.context
    draft = sum(costs.forward_s(ctx.target, "draft", (0, p.exit_at), 1, b, c + i, "exit")
                for i in range(p.gamma))
    return PairTerms(costs.target_s((0, n), 1, "lm"),
                     draft + costs.target_s((0, n), p.gamma + 1, "lm"))


VIEW = LawView("shallow pair: speedup vs tokens per step", "curve", x="mean_tokens_per_step",
               y="speedup_vs_ar", x_range=(1.0, 1.0 + MOST_GAMMA), along=("gamma",),
               heading="shallow pair law", x_title="tokens per step",
               y_title="speedup vs AR")


@pytest.fixture
def shallow_pair():
    register(NAME, PairParams, law_terms=pair_terms, tuned=Tuned("gamma"),
             laws={NAME: pair_law}, law_views=(VIEW,))(_pair)
    yield NAME
    del REGISTRY[NAME]


def test_no_module_of_the_product_names_the_new_schedule():
    found = [str(path.relative_to(ROOT)) for package in ("analyses", "executors",
                                                          "hwprofiles", "policies", "simcore")
             for path in (ROOT / package).rglob("*.py") if NAME in path.read_text()]
    assert found == []


def test_a_new_schedule_is_sized_prefilled_and_footprinted_from_its_own_ops(shallow_pair):
    target = load_model("llama-3.1-70b")
    plat = load_platform("h100-sxm-5x")
    ctx = PolicyContext(target=target, tokens=16)
    segs = segments_of(build(NAME, ctx, {"exit_at": 6}))
    assert {(s.device, s.model, s.start, s.stop) for s in segs} == {
        ("draft", "target", 0, 6), ("target", "target", 0, target.n_layers)}
    found = footprint(build(NAME, ctx, {"exit_at": 6}), 1)
    assert found == {("draft", "target", 1): 6, ("target", "target", 1): target.n_layers}
    held = pieces(plat, {"target": target}, plat.placement,
                  Run(NAME, None, prompt_tokens=128, tokens=16))
    by_role = {p.role: p for p in held}
    assert (by_role["target"].layers, by_role["target"].positions) == (target.n_layers, 3)
    assert by_role["target"].lm_head and not by_role["target"].exit_heads
    assert (by_role["draft"].layers, by_role["draft"].exit_heads,
            by_role["draft"].lm_head) == (4, 1, False)


def test_a_new_schedule_simulates_and_its_law_evaluates(shallow_pair, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", *H100, "--policy", NAME, "--tokens", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_s"] > 0 and out["prefill_s"] > 0
    assert main(["law", NAME, "--set", "tokens_per_step=3", "--set", "t_ar_s=0.02",
                 "--set", "t_step_s=0.03", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] == pytest.approx(3 * 0.02 / 0.03)


def test_a_new_schedule_is_compared_tuned_and_drawn_in_the_law_view(shallow_pair):
    scenario = dict(platform="h100-sxm-5x", target="llama-3.1-70b", draft=None,
                    policies=["ar", NAME], tokens=32, jobs=1)
    tuned = compare(Scenario(**scenario))
    tried = {dict(r.point.sets)["gamma"] for r in tuned.points if r.point.policy == NAME}
    assert len(tried) >= 3  # its gamma was searched, as every tuned rival's is
    every = compare(Scenario(**scenario, sweeps=[("gamma", list(range(1, MOST_GAMMA + 1)))]))
    best = [best_per_policy(found.points)[NAME].point for found in (tuned, every)]
    assert best[0] == best[1]  # the search found the gamma the whole range holds best
    laws = next(s for s in tuned.sections() if s.title == "Latency laws on this platform")
    figure = dict(laws.figures)[VIEW.title]
    drawn = [t for t in figure.data if t.meta and "on_curve" in t.meta]
    assert drawn and best[0].label in {label for t in drawn for label in t.text}


def test_a_new_schedule_runs_in_the_executor_is_replayed_and_calibrated(shallow_pair,
                                                                         tmp_path, capsys):
    pytest.importorskip("torch")
    from tests.test_executor import tiny_spec  # torch: an optional dependency

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('[{"role": "user", "content": "hi"}]\n')
    run = tmp_path / "runs" / "pair"
    assert main(["run", "--platform", "cpu-local", "--target", f"random:{tiny_spec(tmp_path)}",
                 "--policy", NAME, "--set", "gamma=3", "--max-new-tokens", "6", "--prompts",
                 str(prompts), "--inline", "--json", "--out", str(run)]) == 0
    capsys.readouterr()
    record = json.loads((run / "record.json").read_text())
    assert record["inputs"]["policy"] == NAME and record["metrics"]["matches_ar"]
    assert main(["replay", str(run / "record.json"), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["predicted"]["policy"] == NAME and replayed["predicted"]["tokens_per_s"] > 0
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(tmp_path / "runs"), "--profile", "cpu-local",
                 "-o", str(out), "--fit-policies", NAME, "--hold", HELD, "--accept-poor-fit",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fitted_runs"] == ["pair"] and load_platform(out)
    # the run's measured spans, its draft and verify passes, were priced and fitted
    assert summary["spans"] > 0 and summary["fit_op_kinds"]
