"""Trained draft heads: the shipped artifact, one training step, and schedules
that draft through trained exit heads and adapters staying lossless (greedy:
AR's tokens; temperature 1: the target's distribution)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch
import torch

from executors.train import distil
from executors.backend import drafts, models
from executors.backend.layers import Positions, Stack
from executors.session import Options, Session
from smollm2 import smollm2_with_ar
from tests.test_executor import PROMPTS, _chi2_p, _joint, _peaky, tiny_spec

SMOL_SHAPE = {"hidden": 576, "vocab": 49152, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64}


# the shipped artifact ------------------------------------------------------------
def test_the_shipped_artifact_loads_with_its_shapes_and_provenance():
    path = drafts.SHIPPED[models.REAL_NAME]
    heads = drafts.load_artifact(path, SMOL_SHAPE)
    prov = json.loads(drafts.provenance_path(path).read_text())
    assert prov["artifact_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(heads.exits) == list(prov["config"]["exits"]) == [8, 15, 18]
    assert sorted(heads.adapters) == list(prov["config"]["adapters"]) == [3, 29]
    for head in [*heads.exits.values(), *(a.head for a in heads.adapters.values())]:
        assert head.proj.shape == (576, 576) and head.norm.shape == (576,)
    for a in heads.adapters.values():
        assert a.q.shape == (576, 576) and a.k.shape == a.v.shape == (192, 576)
        assert a.o.shape == (576, 576)
    assert sorted(heads.ahead) == list(prov["config"]["ahead"]) == [15]  # Mirror's exit
    assert len(heads.ahead[15]) == prov["config"]["eta"] - 1 == 1
    assert all(h.proj.shape == (576, 576) and h.norm.shape == (576,) for h in heads.ahead[15])
    ids = heads.vocab_ids
    assert len(ids) == prov["draft_vocab"] == prov["config"]["draft_vocab"]
    assert bool((ids[1:] > ids[:-1]).all()) and 0 <= int(ids[0]) and int(ids[-1]) < 49152
    assert path.stat().st_size < 12e6  # a few MB of fp16
    for name, h in prov["heads"].items():  # trained: better than where each started
        assert h["held_out_top1"] > h["held_out_top1_before"], name
        assert h["loss_last_mean10"] < h["loss_first"], name
    assert prov["corpus"]["positions"] > 10_000 and prov["config"]["steps"] > 0


def test_a_wrong_shape_or_format_is_one_sentence(tmp_path):
    path = drafts.SHIPPED[models.REAL_NAME]
    with pytest.raises(ValueError, match="trained for a model of shape") as err:
        drafts.load_artifact(path, {**SMOL_SHAPE, "hidden": 64})
    assert "train-draft" in str(err.value) and "\n" not in str(err.value)
    other = tmp_path / "x.safetensors"
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(1)}, str(other))
    with pytest.raises(ValueError, match="not a hetspec draft file"):
        drafts.load_artifact(other, SMOL_SHAPE)


# training -------------------------------------------------------------------------
def _tiny_teacher(tmp_path):
    """A tiny random model's teacher at exit 2 over one 16-token window, its
    40-token draft vocabulary, the targets in it and the LM head's rows."""
    spec = models.spec_of(f"random:{tiny_spec(tmp_path, layers=4)}")
    hf = models.build_random(spec, seed=3)
    ids = torch.randint(0, spec.vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    corpus = distil.Corpus(ids, torch.ones_like(ids, dtype=torch.bool))
    teacher = distil.teach(hf, corpus, (2,), k=8)
    vocab_ids = distil.draft_vocabulary(teacher.argmax, corpus.valid, 40, spec.vocab)
    pos, probs = distil.targets_in_vocab(teacher, vocab_ids, spec.vocab)
    rows = hf.lm_head.weight.detach()[vocab_ids]
    return spec, hf, corpus, teacher, vocab_ids, pos, probs, rows


def test_one_training_step_lowers_the_loss_on_a_tiny_random_model(tmp_path):
    spec, hf, corpus, teacher, vocab_ids, pos, probs, rows = _tiny_teacher(tmp_path)
    assert len(vocab_ids) == 40 and len(set(vocab_ids.tolist())) == 40
    cos, sin = hf.model.rotary_emb(rows[:1], torch.arange(16)[None])
    rope = (cos[:, None], sin[:, None])
    cfg = distil.TrainConfig(steps=1, batch_windows=1, lr=1e-2, warmup=1)
    shape = drafts.shape_of(Stack(hf))
    for head in (drafts.ExitHead(spec.hidden, hf.model.norm.weight),
                 drafts.Adapter(spec.hidden, shape["n_heads"], shape["n_kv_heads"],
                                shape["head_dim"], hf.model.norm.weight)):
        if isinstance(head, drafts.Adapter):
            head.init_from(hf.model.layers[2])
        args = (teacher.states[2], rows, pos, probs, corpus.valid, rope)
        with torch.no_grad():
            before = float(distil.distill_loss(head, *args))
        gen = torch.Generator().manual_seed(0)
        losses = distil.train_head(head, *args[:1], rows, pos, probs, corpus.valid, rope, cfg,
                                  gen)
        with torch.no_grad():
            after = float(distil.distill_loss(head, *args))
        assert len(losses) == 1 and abs(losses[0] - before) < 1e-4  # the same windows
        assert after < before


def test_train_draft_refuses_an_exit_outside_the_target(tmp_path):
    with pytest.raises(ValueError, match="--exits 30 is not an exit layer"):
        distil.check_layers(distil.TrainConfig(exits=(30,)), 30)


# multi-token heads ---------------------------------------------------------------
def _tiny_fit(spec_path: str, seed: int, windows: int = 8, **config):
    """fit_all on random windows of the tiny random model a session of ``seed``
    builds: ``config`` names the heads (and anything else to change)."""
    from tqdm import tqdm

    spec = models.spec_of(f"random:{spec_path}")
    hf = models.build_random(spec, seed=seed)
    ids = torch.randint(0, spec.vocab, (windows, 16),
                        generator=torch.Generator().manual_seed(1))
    corpus = distil.Corpus(ids, torch.ones_like(ids, dtype=torch.bool))
    cfg = distil.TrainConfig(**{"steps": 3, "batch_windows": 2, "lr": 1e-2, "warmup": 1,
                               "draft_vocab": 40, "seq_len": 16, "held_out_every": 4,
                               **config})
    distil.check_layers(cfg, spec.n_layers)
    teacher = distil.teach(hf, corpus, tuple(sorted({*cfg.exits, *cfg.adapters})), k=8)
    with tqdm(disable=True) as bar:
        heads, prov = distil.fit_all(hf, drafts.shape_of(Stack(hf)), cfg, corpus, teacher,
                                    bar)
    return heads, prov, drafts.shape_of(Stack(hf))


def test_multi_token_heads_leave_the_other_heads_bit_for_bit(tmp_path):
    """Trained last, the multi-token heads change no other head's tensors or numbers,
    and the artifact round-trips them (shapes, offsets j = 1..eta-1)."""
    spec = tiny_spec(tmp_path, layers=4)
    plain, plain_prov, _ = _tiny_fit(spec, 3, exits=(2, 3), adapters=(2,), ahead=(), eta=3)
    more, prov, shape = _tiny_fit(spec, 3, exits=(2, 3), adapters=(2,), ahead=(3,), eta=3)
    base = plain.state()
    mine = more.state()
    assert set(mine) - set(base) == {f"ahead.3.{j}.{k}" for j in (1, 2)
                                     for k in ("norm", "proj")}
    assert all(torch.equal(base[k], mine[k]) for k in base)
    assert {k: v for k, v in prov["heads"].items() if not k.startswith("ahead")} == \
        plain_prov["heads"]
    for j in (1, 2):
        h = prov["heads"][f"ahead.3.{j}"]
        assert h["loss_first"] > 0 and 0 <= h["held_out_top1"] <= 1
    drafts.save_artifact(more, tmp_path / "a.safetensors", shape, "tiny", prov)
    back = drafts.load_artifact(tmp_path / "a.safetensors", shape)
    assert sorted(back.ahead) == [3] and len(back.ahead[3]) == 2
    assert all(h.proj.shape == (64, 64) and h.norm.shape == (64,) for h in back.ahead[3])
    assert torch.equal(back.ahead[3][1].proj.half(), mine["ahead.3.2.proj"])


def test_one_training_step_lowers_a_multi_token_heads_loss(tmp_path):
    """Head j = 1 of exit 2 against the target's distribution one position on."""
    from executors.train.ahead import shifted

    spec, hf, corpus, teacher, _, pos, probs, rows = _tiny_teacher(tmp_path)
    sh = shifted(teacher.states[2], pos, probs, teacher.argmax, corpus.scored, 1)
    assert sh.states.shape[1] == sh.pos.shape[1] == 15 and torch.equal(sh.pos, pos[:, 1:])
    head = drafts.ExitHead(spec.hidden, hf.model.norm.weight)
    args = (sh.states, rows, sh.pos, sh.probs, sh.scored, None)
    with torch.no_grad():
        before = float(distil.distill_loss(head, *args))
    cfg = distil.TrainConfig(steps=1, batch_windows=1, lr=1e-2, warmup=1)
    distil.train_head(head, *args, cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float(distil.distill_loss(head, *args)) < before


def test_multi_token_heads_need_their_exit_head():
    with pytest.raises(ValueError, match="--ahead 15 has no exit head to extend"):
        distil.check_layers(distil.TrainConfig(exits=(8,)), 30)


# executor with trained heads --------------------------------------------------------
EXITS, ADAPTERS = (3, 5), (2, 3, 4)


def random_heads(spec_path: str, path, seed: int = 0, keep: int = 40,
                 ahead: dict[int, int] | None = None):
    """Seeded random (non-trivial) heads for a tiny model, written as an artifact;
    ``ahead``: multi-token heads per exit layer (drawn last: the others stay)."""
    spec = models.spec_of(f"random:{spec_path}")
    torch.manual_seed(seed)
    exits = {e: drafts.ExitHead(spec.hidden) for e in EXITS}
    adapters = {e: drafts.Adapter(spec.hidden, spec.n_heads, spec.n_kv_heads,
                                  spec.dim_per_head) for e in ADAPTERS}
    with torch.no_grad():
        for m in [*exits.values(), *adapters.values()]:
            for p in m.parameters():
                if p.ndim == 2:
                    p.normal_(0, 0.1)
    ids = torch.randperm(spec.vocab)[:keep].sort().values
    more = {e: [drafts.ExitHead(spec.hidden) for _ in range(n)]
            for e, n in (ahead or {}).items()}
    with torch.no_grad():
        for h in (h for hs in more.values() for h in hs):
            h.proj.normal_(0, 0.1)
    shape = {"hidden": spec.hidden, "vocab": spec.vocab, "n_heads": spec.n_heads,
             "n_kv_heads": spec.n_kv_heads, "head_dim": spec.dim_per_head}
    drafts.save_artifact(drafts.DraftHeads(exits, adapters, ids, ahead=more), path, shape,
                         "tiny",
                         {"test": "random heads"})
    return path


@pytest.fixture(scope="module")
def tiny_drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    spec = tiny_spec(root)
    return spec, random_heads(spec, root / "heads.safetensors")


CASES = [("kangaroo", {"dram_budget_gb": 1, "l_dm": 2, "gamma": 3}),
         ("cats", {"dram_budget_gb": 1, "l_dm": 2, "l_sv": 4, "gamma": 3, "corrections": 1}),
         ("eesd", {"exit_layer": 3, "gamma": 3}),
         ("ppsd", {"exit_layer": 3, "exit_head": "transformer"}),
         ("sd", {"draft_layers": 3, "gamma": 3}),
         ("mirror", {}),  # default parameters: eta 1 where the draft has no MTP heads
         ("mirror", {"kappa": 2, "gamma": 3, "exit_layer": 3})]


@pytest.mark.parametrize("policy,params", CASES, ids=[f"{p}-{i}" for i, (p, _) in
                                                       enumerate(CASES)])
def test_schedules_drafting_through_trained_heads_equal_ar(tiny_drafts, monkeypatch,
                                                             policy, params):
    spec, path = tiny_drafts
    monkeypatch.setenv(drafts.ENV, str(path))
    stages = {"stage0": "cpu0", "stage1": "cpu1"}
    with Session("cpu-local", f"random:{spec}", "self:5", placement=stages,
                 options=Options(max_new_tokens=12, mode="inline")) as s:
        ref = [s.decode("ar", {}, [p]).generated[0][:12] for p in PROMPTS]
        assert s.stacks["target"].drafts is not None
        out = s.decode(policy, params, PROMPTS)
        assert [g[:12] for g in out.generated] == ref
        drafted = [a for a in out.acceptance if "accepted" in a]
        assert drafted and sum(sum(a["proposed"]) for a in drafted) > 0


# multi-token heads in the executor ---------------------------------------------------
@pytest.fixture(scope="module")
def trained_mtp(tmp_path_factory):
    """Heads trained (a few steps, random windows) for the tiny model a session of
    seed 0 builds: exit heads at 3 and 5, two multi-token heads on exit 5."""
    root = tmp_path_factory.mktemp("mtp")
    spec = tiny_spec(root)
    heads, prov, shape = _tiny_fit(spec, 0, windows=16, exits=(3, 5), adapters=(),
                                   ahead=(5,), eta=3, steps=20)
    drafts.save_artifact(heads, root / "heads.safetensors", shape, "tiny", prov)
    return spec, root / "heads.safetensors"


def _draft_passes(out) -> list[dict]:
    return [x.op for x in out.spans if x.op["type"] == "Forward"
            and x.op["model"] == "draft" and x.op.get("emit") == "sample"]


@pytest.mark.parametrize("params", [
    {},  # defaults: eta 2 where the self-draft's exit has multi-token heads
    {"kappa": 2, "gamma": 3, "exit_layer": 3, "eta": 2},
    {"kappa": 1, "gamma": 5, "exit_layer": 4, "eta": 3}], ids=["defaults", "eta2", "eta3"])
def test_mirror_through_multi_token_heads_equals_ar(trained_mtp, monkeypatch, params):
    """One draft pass proposes eta tokens (exit head, then the heads ahead); the
    target's verification keeps the output AR's, token for token."""
    spec, path = trained_mtp
    monkeypatch.setenv(drafts.ENV, str(path))
    stages = {"stage0": "cpu0", "stage1": "cpu1"}
    with Session("cpu-local", f"random:{spec}", "self:5", placement=stages,
                 options=Options(max_new_tokens=12, mode="inline")) as s:
        assert s.draft_multi_token and s.context(PROMPTS).draft_multi_token
        ref = [s.decode("ar", {}, [p]).generated[0][:12] for p in PROMPTS]
        out = s.decode("mirror", params, PROMPTS)
    assert [g[:12] for g in out.generated] == ref
    eta = params.get("eta", 2)
    passes = _draft_passes(out)  # each emits eta tokens, the rollout's last chunk fewer
    assert all(op.get("multi_token") for op in passes if op["n_tokens"] > 1)
    assert max(op["multi_token"] for op in passes if "multi_token" in op) == eta
    assert all(op.get("multi_token", 1) <= min(eta, op["n_tokens"]) for op in passes)
    steps = [a for a in out.acceptance if "accepted" in a]
    assert max(max(a["accepted"]) for a in steps) >= 2  # a head ahead's token was kept


def test_without_multi_token_heads_mirror_stays_one_token_a_pass(tiny_drafts, monkeypatch):
    spec, path = tiny_drafts
    monkeypatch.setenv(drafts.ENV, str(path))
    with Session("cpu-local", f"random:{spec}", "self:5",
                 options=Options(max_new_tokens=6, mode="inline")) as s:
        assert not s.draft_multi_token
        out = s.decode("mirror", {"kappa": 2, "gamma": 3}, PROMPTS[:1])
        passes = _draft_passes(out)  # one token a pass (a first one catching up)
        assert passes and not any("multi_token" in op for op in passes)
        assert all(op["n_tokens"] == 1 or op["head_tokens"] == 1 for op in passes)
        with pytest.raises(ValueError, match="no multi-token heads after that layer; run "
                                             "it with eta=1"):
            s.decode("mirror", {"kappa": 2, "gamma": 3, "eta": 2}, PROMPTS[:1])


def test_more_tokens_a_pass_than_heads_is_one_sentence(trained_mtp, monkeypatch):
    spec, path = trained_mtp
    monkeypatch.setenv(drafts.ENV, str(path))
    with Session("cpu-local", f"random:{spec}", "self:5",
                 options=Options(max_new_tokens=6, mode="inline")) as s:
        with pytest.raises(ValueError, match="has 2 multi-token head.s. after layer 5; run "
                                             "it with eta=3") as err:
            s.decode("mirror", {"kappa": 2, "gamma": 8, "eta": 4}, PROMPTS[:1])
    assert "\n" not in str(err.value)


def test_a_multi_token_run_records_one_pass_and_replays(trained_mtp, monkeypatch, tmp_path,
                                                        capsys):
    """The record leaves eta to the simulator's default (2: multi-token heads, as
    ran), its spans say which passes emitted several tokens, and the replay
    simulates the run from them."""
    from analyses.cli import main
    from analyses.measured.replay import load_run
    from executors.measure import measure
    from analyses.run.config import SimConfig

    spec, path = trained_mtp
    monkeypatch.setenv(drafts.ENV, str(path))
    config = SimConfig(platform="cpu-local", target=f"random:{spec}", draft="self:5",
                       policy="mirror", params={"kappa": 2, "gamma": 3}, seed=1)
    out = measure(config, Options(max_new_tokens=8, mode="inline"),
                  [[{"role": "user", "content": "hello there"}]], out_dir=tmp_path / "run")
    assert out["matches_ar"] is True
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["inputs"]["params"] == {"gamma": 3, "kappa": 2}  # no eta=1 pinned
    run = load_run(tmp_path / "run")
    emitted = [x.op["multi_token"] for x in run.spans if "multi_token" in x.op]
    assert emitted and max(emitted) == 2
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "run"), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["predicted"]["tokens"] == record["metrics"]["tokens"]

def test_an_exit_layer_without_a_trained_adapter_is_one_sentence(tiny_drafts, monkeypatch):
    spec, path = tiny_drafts
    monkeypatch.setenv(drafts.ENV, str(path))
    with Session("cpu-local", f"random:{spec}", options=Options(max_new_tokens=4,
                                                                 mode="inline")) as s:
        with pytest.raises(ValueError, match="adapter after layer 1, but the draft "
                                             "artifact has adapters at: 2, 3, 4"):
            s.decode("kangaroo", {"dram_budget_gb": 1, "l_dm": 1}, PROMPTS[:1])


def test_a_missing_artifact_is_a_one_line_note_and_untrained_heads(tiny_drafts, tmp_path,
                                                                    monkeypatch, capsys):
    spec, _ = tiny_drafts
    monkeypatch.setenv(drafts.ENV, str(tmp_path / "absent.safetensors"))
    with Session("cpu-local", f"random:{spec}", options=Options(max_new_tokens=6,
                                                                 mode="inline")) as s:
        ref = s.decode("ar", {}, PROMPTS[:1]).generated[0][:6]
        assert s.decode("eesd", {"exit_layer": 3}, PROMPTS[:1]).generated[0][:6] == ref
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no trained draft heads at" in err[0] and "train-draft" in err[0]


def _draft_first_token(stack: Stack, prompt, kind: str, end: int) -> np.ndarray:
    cache = stack.new_cache(1)
    at = Positions([0], [len(prompt)])
    h = stack.run(cache, (0, end), at, tokens=torch.tensor([prompt]))
    h = stack.pre_head(kind, end, h, cache, at)
    return torch.softmax(stack.head(h, kind, end)[0, -1], -1).double().numpy()


@pytest.mark.parametrize("policy,params,kind,end,draft", [
    ("kangaroo", {"dram_budget_gb": 1, "l_dm": 2, "gamma": 2}, "exit_layer", 2, None),
    ("eesd", {"exit_layer": 3, "gamma": 2}, "exit", 3, None),
    # eta 2: both tokens from one pass of self:5, the second from the head ahead
    ("mirror", {"kappa": 1, "gamma": 2, "exit_layer": 3}, "exit", 5, "self:5")],
    ids=["kangaroo", "eesd", "mirror-multi-token"])
def test_at_temperature_one_trained_drafts_keep_the_target_distribution(
        tmp_path, monkeypatch, policy, params, kind, end, draft):
    """The first two tokens over many rows fit the target's exact joint law; the
    draft's own first-token law (a draft vocabulary of 8 of 12 tokens) is far
    from the target's, so a sampler that kept the draft's tokens would fail."""
    spec, rows, prompt = tiny_spec(tmp_path, vocab=12, layers=6, hidden=32), 3000, [1, 2, 3, 4]
    monkeypatch.setenv(drafts.ENV, str(random_heads(spec, tmp_path / "h.safetensors",
                                                    seed=2, keep=8, ahead={5: 1})))
    with Session("cpu-local", f"random:{spec}", draft, seed=7,
                 options=Options(max_new_tokens=2, mode="inline", temperature=1.0)) as s:
        _peaky(s, "target", 8.0)
        out = s.decode(policy, params, [prompt] * rows)
        stack = s.stacks["target"]
        target = _joint(Stack(s.loaded["target"].model), prompt, 12)
        draft_first = _draft_first_token(stack, prompt, kind, end)
    samples = [g[:2] for g in out.generated]
    assert sum(sum(a["accepted"]) for a in out.acceptance if "accepted" in a) > rows // 4
    if draft:  # the proposal's two tokens came from one pass
        assert {x.op.get("multi_token") for x in out.spans
                if x.op.get("model") == "draft" and x.op.get("emit") == "sample"} == {2}
    assert _chi2_p(samples, target) > 1e-3
    assert 0.5 * np.abs(draft_first - target.sum(1) / target.sum()).sum() > 0.1


# the real model ----------------------------------------------------------------------
SMOLLM2_TOKENS = 16  # per prompt: several verify cycles of every schedule


@pytest.fixture(scope="module")
def shipped():
    """One SmolLM2 session with the shipped heads for every schedule below, and AR's
    outputs on the built-in prompts (loading the model and decoding AR once)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(drafts.ENV, raising=False)
        with smollm2_with_ar("self:15", SMOLLM2_TOKENS) as shared:
            yield shared


@pytest.mark.slow
@pytest.mark.parametrize("policy,params", [
    ("kangaroo", {"dram_budget_gb": 1}), ("cats", {"dram_budget_gb": 1}),
    ("eesd", {}), ("sd", {"draft_layers": 15}),
    # Mirror's defaults (kappa 8, gamma 7) cost ~4x a smaller window on this CPU;
    # the heads and the window logic are the same at kappa 2, gamma 3
    ("mirror", {"kappa": 2, "gamma": 3}), ("ppsd", {})])
def test_smollm2_with_the_shipped_heads_is_lossless(policy, params, shipped):
    s, prompts, ref = shipped
    outs = [s.decode(policy, params, [p]) for p in prompts]
    assert s.stacks["target"].drafts is not None
    for row, out in enumerate(outs):  # equal, or a near-tie flipped by fp32 widths
        theirs = out.generated[0][:SMOLLM2_TOKENS]
        if theirs != ref[row]:
            i = next(j for j, (a, b) in enumerate(zip(ref[row], theirs)) if a != b)
            with torch.no_grad():
                logits = s.loaded["target"].model(
                    torch.tensor([prompts[row] + ref[row][:i]])).logits[0, -1]
            top = torch.topk(logits, 2).values
            assert float(top[0] - top[1]) < 1e-4, (policy, row)
    accepted = sum(sum(a["accepted"]) for o in outs for a in o.acceptance if "accepted" in a)
    assert accepted > 0
    if policy == "mirror":  # eta 2 by default: the shipped multi-token head on exit 15
        assert any(x.op.get("multi_token") == 2 for o in outs for x in o.spans)


@pytest.mark.parametrize("args,needle", [
    (["--exits", "a,b"], "is not a list of layers"),
    (["--adapters", "0"], "names a layer below 1"),
    (["-o", "drafts.json"], "is the same file as"),
    (["--exits", "none", "--adapters", "none"], "has no heads to train")])
def test_train_draft_mistakes_are_one_sentence(args, needle, capsys, tmp_path, monkeypatch):
    from analyses.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(distil, "train", lambda cfg, out, **_: distil.check_layers(cfg, 30))
    try:
        code = main(["train-draft", *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and needle in err[-1]
    assert not list(tmp_path.iterdir())  # nothing written
