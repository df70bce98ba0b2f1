"""The executor with the real SmolLM2-135M-Instruct (slow: loads real weights)."""

from __future__ import annotations

import json

import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch
import torch

from executors.prompts import BUILTIN
from executors.session import Options, Session
from smollm2 import smollm2_with_ar

pytestmark = pytest.mark.slow
MAX_NEW = 12  # per prompt: several verify cycles of each schedule on four rows
SCHEDULES = [("sd", {"gamma": 4, "draft_layers": 15}), ("sd", {"gamma": 3}),
             ("mirror", {"gamma": 4, "kappa": 4, "exit_layer": 15, "eta": 1}),
             ("ssd", {"k": 3, "fanout": 2, "hit_rate": 0.5}),
             ("eesd", {"gamma": 3, "exit_layer": 15}), ("ppsd", {"exit_layer": 8}),
             ("cats", {"dram_budget_gb": 0.4, "l_dm": 12, "l_sv": 24, "gamma": 4,
                       "adapter": "norm", "corrections": 2})]


@pytest.fixture(scope="module")
def real():
    with smollm2_with_ar("self:24", MAX_NEW) as (s, prompts, reference):
        s.prompts, s.reference = prompts, reference
        yield s


def test_the_real_model_answers_a_chat_prompt_sensibly(real):
    text = real.tokenizer.decode(real.reference[0], skip_special_tokens=True)
    assert "Paris" in text and "capital" in text.lower()
    haiku = real.tokenizer.decode(real.reference[1], skip_special_tokens=True).lower()
    assert any(w in haiku for w in ("sea", "wave", "ocean", "shore"))


def test_executor_ar_equals_transformers_generate(real):
    hf = real.loaded["target"].model
    for prompt, ours in zip(real.prompts[:2], real.reference):
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        assert out[0, len(prompt):].tolist() == ours


def _near_tie(real, row: int, theirs: list[int]) -> float:
    """The target's top-2 logit gap where ``theirs`` first leaves AR's tokens."""
    ours = real.reference[row]
    i = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    with torch.no_grad():
        logits = real.loaded["target"].model(
            torch.tensor([real.prompts[row] + ours[:i]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("policy,params", SCHEDULES,
                         ids=[f"{p}-{i}" for i, (p, _) in enumerate(SCHEDULES)])
def test_every_schedule_is_lossless_on_the_builtin_prompts(real, policy, params):
    """Greedy outputs equal AR's token for token; the four prompts are decoded as one
    batch, and a difference is allowed only where fp32 batching flipped a near-tie
    (the target's top-2 logit gap below 1e-4 there)."""
    out = real.decode(policy, params, real.prompts)
    for row, tokens in enumerate(out.generated):
        if tokens[:MAX_NEW] != real.reference[row]:
            assert _near_tie(real, row, tokens[:MAX_NEW]) < 1e-4, (policy, row)
    assert out.steps > 0 and out.wall_s > 0
    if policy == "cats":  # 26 resident layers, 4 streamed; corrections rode along
        assert {x.kind for x in out.spans} >= {"stream"}
        assert any(any(a.get("correction", ())) for a in out.acceptance)


@pytest.mark.parametrize("args", [
    ["--policy", "ar"],
    ["--policy", "sd", "--set", "gamma=4", "--set", "draft_layers=15"],
    ["--policy", "mirror", "--set", "gamma=4", "--set", "kappa=4", "--set", "exit_layer=15",
     "--set", "eta=1"],
], ids=["ar", "sd", "mirror"])
def test_issue_command_lines(tmp_path, args, capsys):
    from analyses.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(BUILTIN[0]) + "\n")
    code = main(["run", "--platform", "cpu-local", "--target", "smollm2-135m", *args,
                 "--max-new-tokens", "8", "--seed", "1", "--json", "--outputs", "--prompts",
                 str(prompts), "--out", str(tmp_path / "run")])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["outputs"][0][:3] == [504, 3575, 282]  # "The capital of"
    assert data["speedup_vs_ar"] > 0 and data["tokens_per_s"] > 0
    assert data["run_record"].endswith("record.json") and data.get("matches_ar", True)
    # where the measured time went: the critical path sums to the measured step
    parts = data["breakdown"]
    assert sum(parts["per_step_s"].values()) == pytest.approx(data["step_latency_s"], rel=0.01)


def test_a_target_sharded_over_two_workers_is_lossless_on_the_builtin_prompts(real):
    """SmolLM2 on cpu_tp (its 3 kv-head groups as 2 and 1, MLP columns halved): greedy
    AR and SD over the built-in prompts equal single-device AR, a difference allowed
    only where partial sums in another order flipped a near-tie (gap below 1e-4)."""
    opts = Options(max_new_tokens=MAX_NEW, mode="processes")
    with Session("cpu-local", "smollm2-135m", "self:24", placement={"target": "cpu_tp"},
                 options=opts) as s:
        runs = [s.decode("ar", {}, real.prompts), s.decode("sd", {"gamma": 3}, real.prompts)]
    for out in runs:
        for row, tokens in enumerate(out.generated):
            if tokens[:MAX_NEW] != real.reference[row]:
                assert _near_tie(real, row, tokens[:MAX_NEW]) < 1e-4, row
        group = [x for x in out.spans if x.device == "cpu_tp"]
        forwards = sum(x.kind == "compute" and x.op["type"] == "Forward" for x in group)
        assert forwards and sum(x.kind == "collective" for x in group) == 2 * 30 * forwards
