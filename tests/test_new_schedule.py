"""Adding a schedule touches its own module only: a small schedule registered
here (one target pass over a self-draft's first layers on the draft's device,
one verify of a 2-token proposal) gets simulate, the memory check, the prefill,
the executor (its footprint and a greedy decode equal to AR's) and compare from
its own operations, with no name table elsewhere (``policies.dryrun``)."""

from __future__ import annotations

import json

import pytest
from pydantic import Field

from analyses.cli import main
from analyses.run.memory import Run, pieces
from executors.coordinate.footprint import footprint
from hwprofiles import load_model, load_platform
from policies import PolicyContext, build
from policies.base import REGISTRY, PolicyParams, register
from policies.ops import LM, SAMPLE, Feed, Forward, Head, Verify
from policies.prefill import segments_of

NAME = "shallow_pair"


class PairParams(PolicyParams):
    exit_at: int = Field(4, ge=1, description="the self-draft's layers")


def _pair(ctx: PolicyContext, p: PairParams):
    n, b, done = ctx.target.n_layers, ctx.batch, 0.0
    while done < ctx.budget:
        context = ctx.context(done / b)
        for i in range(2):
            yield Forward("target", "draft", (0, p.exit_at), 1, b, context + i,
                          head=Head("exit"), emit=SAMPLE, feed=Feed(catch_up=i == 0),
                          label="draft")
        logits = yield Forward("target", "target", (0, n), 3, b, context, head=LM,
                               label="verify")
        verdict = yield Verify(2, b, target=logits, label="verify")
        done += verdict.tokens


@pytest.fixture
def shallow_pair():
    register(NAME, PairParams)(_pair)
    yield NAME
    del REGISTRY[NAME]


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


def test_a_new_schedule_simulates_and_compares(shallow_pair, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--tokens", "32"]
    assert main(["simulate", *base, "--policy", NAME, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_s"] > 0 and out["prefill_s"] > 0
    assert main(["compare", *base, "--policies", f"ar,{NAME}", "--json",
                 "-o", str(tmp_path / "report.html")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 2


@pytest.mark.torch
def test_a_new_schedule_decodes_in_the_executor_as_ar_does(shallow_pair, tmp_path):
    """The torch executor on a tiny random model: the footprint found by the dry
    run starts the roles, and greedy decoding equals AR's token for token."""
    from executors.session import Options, Session  # torch: an optional dependency
    from tests.test_executor import PROMPTS, tiny_spec

    target = f"random:{tiny_spec(tmp_path)}"
    with Session("cpu-local", target, None, seed=0,
                 options=Options(max_new_tokens=8, mode="inline", temperature=0.0)) as s:
        reference = s.decode("ar", {}, PROMPTS).generated
        pair = s.decode(NAME, {"exit_at": 4}, PROMPTS)
    assert [g[:8] for g in pair.generated] == [g[:8] for g in reference]
    assert any("accepted" in a for a in pair.acceptance)
