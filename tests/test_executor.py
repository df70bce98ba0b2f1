"""The torch executor on tiny random models: layer-range execution against the
Hugging Face forward, lossless schedules, SD's output distribution at
temperature 1, records, and the command line. Fast: no real weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.needs import needs_torch

needs_torch()  # before the imports that load torch
import torch
from scipy import stats

from executors.backend import models
from executors.coordinate.book import Sequences
from executors.coordinate.coordinator import Coordinator
from executors.coordinate.loop import call
from executors.backend.tensor import WeightsCmd
from policies.ops import AllReduce
from policies.runs.measured import MeasuredSpan
from executors.backend.layers import Positions, Stack
from executors.measure import measure
from executors.session import Options, Session
from analyses.run.config import SimConfig

PROMPTS = [[5, 9, 14, 3, 7, 22, 1], [8, 2, 2, 30, 11], [40, 41, 3, 3, 3, 17, 6, 9, 12]]


def tiny_spec(tmp_path: Path, name="tiny", arch="LlamaForCausalLM", layers=6, vocab=48,
              hidden=64, heads=4, kv_heads=2) -> str:
    """A tiny model spec YAML (every number sourced, as profiles require)."""
    fields = {"n_layers": layers, "hidden": hidden, "ffn": 2 * hidden, "n_heads": heads,
              "n_kv_heads": kv_heads, "head_dim": hidden // heads, "vocab": vocab}
    lines = [f"name: {name}", *(f"{k}: {v}" for k, v in fields.items()), "dtype: fp32",
             f"hf_architecture: {arch}", "sources:"]
    lines += [f"  {k}: test fixture" for k in fields]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("spec"))


def session(target, draft=None, *, mode="inline", max_new=12, temperature=0.0,
            placement=None, seed=0):
    return Session("cpu-local", f"random:{target}", draft, placement=placement, seed=seed,
                   options=Options(max_new_tokens=max_new, mode=mode,
                                   temperature=temperature))


# layer-range execution -----------------------------------------------------------
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_layer_ranges_with_cache_match_the_hf_forward(tmp_path, arch):
    spec = models.spec_of(f"random:{tiny_spec(tmp_path, arch=arch)}")
    hf = models.build_random(spec, seed=3)
    stack = Stack(hf)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref = hf(ids).logits
    cache = stack.new_cache(1)
    stack.run(cache, (0, 6), Positions([0], [5]), tokens=ids[:, :5])
    low = stack.run(cache, (0, 2), Positions([5], [4]), tokens=ids[:, 5:])
    out = stack.head(stack.run(cache, (2, 6), Positions([5], [4]), hidden=low))
    assert torch.allclose(out, ref[:, 5:], atol=1e-5)


def test_ragged_rows_and_rollback_match_the_hf_forward(tiny):
    hf = models.build_random(models.spec_of(f"random:{tiny}"), seed=4)
    stack = Stack(hf)
    a, b = PROMPTS[0], PROMPTS[2]
    with torch.no_grad():
        ref_a, ref_b = hf(torch.tensor([a])).logits[0], hf(torch.tensor([b])).logits[0]
    cache = stack.new_cache(2)
    wrong = [a[:4] + [0, 0], b[:6]]  # row 0 holds two wrong tokens: rolled back below
    stack.run(cache, (0, 6), Positions([0, 0], [6, 6]), tokens=torch.tensor(wrong))
    feed = torch.tensor([a[4:7], b[6:8] + [0]])  # row 1 feeds 2 tokens, padded
    logits = stack.head(stack.run(cache, (0, 6), Positions([4, 6], [3, 2]), tokens=feed))
    assert torch.allclose(logits[0], ref_a[4:7], atol=1e-5)
    assert torch.allclose(logits[1, :2], ref_b[6:8], atol=1e-5)


# lossless schedules ----------------------------------------------------------------
CASES = [("sd", {"gamma": 3}), ("sd", {"gamma": 4, "draft_layers": 4}),
         ("mirror", {"gamma": 3, "kappa": 4, "exit_layer": 3, "eta": 1}),
         ("mirror", {"gamma": 3, "kappa": 2, "exit_layer": 4, "batch_fallback": "skip",
                     "eta": 1}),
         ("ssd", {"k": 3, "fanout": 2, "hit_rate": 0.5}),
         ("eesd", {"gamma": 3, "exit_layer": 4}), ("ppsd", {"exit_layer": 2})]
STAGES = {"stage0": "cpu0", "stage1": "cpu1", "stage2": "cpu0"}


@pytest.fixture(scope="module")
def inline_session(tiny):
    with session(tiny, "self:5", placement=STAGES) as s:
        s.reference = [s.decode("ar", {}, [p]).generated[0][:12] for p in PROMPTS]
        yield s


@pytest.mark.parametrize("policy,params", CASES, ids=[f"{p}-{i}" for i, (p, _) in
                                                       enumerate(CASES)])
def test_greedy_schedules_equal_ar_token_for_token(inline_session, policy, params):
    s = inline_session
    one = [s.decode(policy, params, [p]) for p in PROMPTS]
    assert [r.generated[0][:12] for r in one] == s.reference
    both = s.decode(policy, params, PROMPTS)  # ragged rows decoded together
    assert [g[:12] for g in both.generated] == s.reference
    verifies = [a for r in one for a in r.acceptance if "accepted" in a]
    assert verifies and all(a["accepted"][0] <= max(a["proposed"][0], 1) for a in verifies)


@pytest.mark.parametrize("policy,params", [("ar", {}), ("sd", {"proposer": "ngram"}),
                                           *CASES],
                         ids=["ar", "sd-ngram",
                              *(f"{p}-{i}" for i, (p, _) in enumerate(CASES))])
def test_rows_joining_and_leaving_a_running_batch_decode_as_alone(inline_session, policy,
                                                                  params):
    """Continuous batching: a prompt joins the running batch each round (its prompt
    prefilled into its own cache rows), a row leaves when it has its tokens (from
    the middle of the batch: the first prompt's row); every row's greedy output is
    AR's alone, whatever the schedule."""
    s = inline_session
    batch = s.running(policy, params, PROMPTS[0])
    waiting, rows, out = list(range(len(PROMPTS))), [], {}
    while waiting or rows:
        if waiting:
            batch.regroup(list(range(len(rows))), [PROMPTS[waiting[0]]])
            rows.append(waiting.pop(0))
        assert batch.round()  # at least one Verify
        keep = [r for r in range(len(rows)) if len(batch.generated(r)) < 12]
        out.update({rows[r]: batch.generated(r)[:12] for r in range(len(rows))
                    if r not in keep})
        if len(keep) < len(rows):
            batch.regroup(keep, [])
            rows = [rows[r] for r in keep]
    assert [out[i] for i in range(len(PROMPTS))] == s.reference


def test_a_close_draft_is_accepted_and_events_are_observed(inline_session):
    """self:5 of 6 layers agrees often, so acceptance, reuse and cache hits occur."""
    s = inline_session
    sd = s.decode("sd", {"gamma": 3}, PROMPTS)
    assert sum(sum(a["accepted"]) for a in sd.acceptance) > 0
    ssd = s.decode("ssd", {"k": 3, "fanout": 3, "hit_rate": 0.5}, PROMPTS[:1])
    events = [h for a in ssd.acceptance if a.get("event") == "cache_hit" for h in a["held"]]
    assert events and any(events) and ssd.generated[0][:12] == s.reference[0]
    mirror = s.decode("mirror", {"gamma": 3, "kappa": 4, "exit_layer": 5, "eta": 1,
                                 "batch_fallback": "skip"}, PROMPTS)
    rows = [a["held"] for a in mirror.acceptance if a.get("event") == "reuse"]
    assert any(any(r) for r in rows) and not all(all(r) for r in rows)  # mixed per row
    assert [g[:12] for g in mirror.generated] == s.reference


@pytest.mark.parametrize("params", [{"k": 3, "fanout": 3, "hit_rate": 0.5},
                                    {"k": 3, "fanout": 3, "hit_rate": 0.5, "backup": "fast"}],
                         ids=["jit", "fast"])
def test_ssd_at_batch_2_keeps_hit_rows_and_stays_lossless(inline_session, params):
    """Rows that hit keep their cached speculation while the backup speculates for
    the rows that missed alone (a Forward for those sequences), and greedy output
    stays AR's token for token."""
    s = inline_session
    run = s.decode("ssd", params, PROMPTS[:2])
    assert [g[:12] for g in run.generated] == s.reference[:2]
    held = [a["held"] for a in run.acceptance if a.get("event") == "cache_hit"]
    mixed = [h for h in held if any(h) and not all(h)]
    assert mixed  # some rounds had one row hit and the other miss
    verifies = [a for a in run.acceptance if "accepted" in a]
    assert all(len(v["proposed"]) == 2 for v in verifies)
    if params.get("backup", "jit") == "jit":
        backups = [sp.op for sp in run.spans if sp.name == "backup"]
        assert any(op["sequences"] is not None and len(op["sequences"]) == 1
                   and op["batch"] == 1 for op in backups)
        # a round after a mixed one verifies both rows' speculations, neither empty
        after = [v for v, h in zip(verifies[1:], held) if any(h) and not all(h)]
        assert after and all(min(v["proposed"]) > 0 for v in after)


@pytest.fixture(scope="module")
def workers(tiny):
    """One worker process per core (target on cpu:0, draft on cpu:1, the cpu_tp
    group over both) for the tests below that need worker processes but no model
    of their own: starting the workers costs more than what each test runs on
    them, and every decode resets the caches it uses."""
    with session(tiny, "self:5", mode="processes", placement=STAGES) as s:
        yield s


def test_worker_processes_run_the_draft_on_its_own_core(workers):
    s = workers
    ref = s.decode("ar", {}, PROMPTS[:1]).generated[0][:12]
    sd = s.decode("sd", {"gamma": 3}, PROMPTS[:1])
    pp = s.decode("ppsd", {"exit_layer": 2}, PROMPTS[:1])
    assert sd.generated[0][:12] == ref and pp.generated[0][:12] == ref
    where = {(x.op.get("label"), x.physical) for x in sd.spans}
    assert ("draft", "cpu:1") in where and ("verify", "cpu:0") in where
    moved = [x for x in pp.spans if x.kind == "transfer"]
    assert moved and {x.physical for x in moved} >= {"cpu:0->cpu:1", "cpu:1->cpu:0"}


STREAMED = [("ar_stream", {"dram_budget_gb": 0.0006}),
            ("kangaroo", {"dram_budget_gb": 0.0006, "l_dm": 1, "gamma": 3, "adapter": "norm"}),
            ("cats", {"dram_budget_gb": 0.0006, "l_dm": 1, "l_sv": 2, "gamma": 3,
                      "adapter": "norm", "corrections": 0}),
            ("cats", {"dram_budget_gb": 0.0006, "l_dm": 1, "l_sv": 2, "gamma": 3,
                      "adapter": "norm", "corrections": 2})]


@pytest.mark.parametrize("policy,params", STREAMED,
                         ids=["ar_stream", "kangaroo", "cats-0", "cats-2"])
def test_streamed_layers_come_from_disk_within_the_budget(tiny, tmp_path, monkeypatch,
                                                          policy, params):
    """6 layers of ~148 kB, budget 600 kB: 2 resident, 4 streamed through 2 slots."""
    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path))
    with session(tiny) as s:
        ref = s.decode("ar", {}, PROMPTS[:2])
        out = s.decode(policy, params, PROMPTS[:2])
        store = s.clients["cpu:0"].device.layer_stores["target"]
        in_memory = [i for i, layer in enumerate(s.loaded["target"].model.model.layers)
                     if next(layer.parameters()).numel()]
    assert [g[:12] for g in out.generated] == [g[:12] for g in ref.generated]
    streams = [x for x in out.spans if x.kind == "stream"]
    assert {tuple(x.op["layers"]) for x in streams} == {(2, 3), (3, 4), (4, 5), (5, 6)}
    assert all(x.op["bytes_read"] >= x.op["nbytes"] for x in streams)
    assert store.streamed == {2, 3, 4, 5} and len(store.loaded) <= 2
    assert store.capacity == 2  # the StreamWeights' buffer: 2 chunks of 1 layer
    assert set(in_memory) - {0, 1} <= set(store.loaded)  # resident: layers 0, 1 only


def test_the_streaming_buffer_size_comes_from_the_schedules_stream_operations():
    """The executor sizes its buffer from StreamWeights.buffer_layers, learnt by
    the dry run, not from the policy's parameters."""
    from executors.coordinate.footprint import footprint
    from hwprofiles import load_model
    from policies import PolicyContext, build

    ctx = PolicyContext(target=load_model("llama-3.1-70b"), tokens=4, batch=1)
    params = {"dram_budget_gb": 40, "chunk_layers": 2, "buffer_chunks": 3}
    found = footprint(build("ar_stream", ctx, params), 1)
    assert found["buffer_layers"] == 6
    assert footprint(build("ar", ctx, {}), 1).get("buffer_layers") is None


def test_a_stream_installs_the_layer_bit_for_bit_and_reuses_unviewed_buffers(
        tiny, tmp_path, monkeypatch):
    """Streamed tensors are views of a page-aligned read buffer; a buffer comes back
    for a later read only once no tensor views it."""
    from executors.backend.streaming import ALIGN_BYTES, PAGE_BYTES, LayerStore

    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path))
    stack = Stack(models.build_random(models.spec_of(f"random:{tiny}"), seed=2))
    before = {i: {k: v.clone() for k, v in stack.layers[i].state_dict().items()}
              for i in (2, 3, 4)}
    store = LayerStore(stack, "tiny-seed2", (2, 3, 4), capacity=1)
    store.evict_all()
    assert next(stack.layers[3].parameters()).numel() == 0
    for rounds in range(3):
        for i in (2, 3, 4):
            store.stream((i, i + 1))
            now = stack.layers[i].state_dict()
            assert all(torch.equal(now[k], v) for k, v in before[i].items())
            assert all(v.data_ptr() % ALIGN_BYTES == 0 for v in now.values())
    assert len(store.buffers) == 2  # capacity 1: the layer in memory, the next read
    held = next(stack.layers[4].parameters()).data  # a pass still running on layer 4
    store.stream((2, 3))
    store.stream((3, 4))  # layer 4's buffer is still viewed: a third buffer
    assert len(store.buffers) == 3 and torch.equal(held, before[4][next(
        n for n, _ in stack.layers[4].named_parameters())])
    assert all(b.address % PAGE_BYTES == 0 for b in store.buffers)


def test_layer_files_are_safetensors_with_aligned_views_or_copies():
    """Odd sizes and dtypes: safetensors reads the file back; the store's views
    equal the tensors, aligned ones sharing the read buffer, misaligned ones copied."""
    from safetensors.torch import load

    from executors.backend.streaming import _aligned_safetensors, _tensors

    state = {"w": torch.randn(3, 5), "m": torch.randn(16, 4),
             "i": torch.arange(7, dtype=torch.int64), "h": torch.randn(3).half()}
    data = b"".join(_aligned_safetensors(state))
    assert all(torch.equal(load(data)[k], v) for k, v in state.items())
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    views = _tensors(buf)
    assert all(torch.equal(views[k], v) for k, v in state.items())
    shared = {k for k, v in views.items() if v.untyped_storage().data_ptr() == buf.data_ptr()}
    assert {"m", "i"} <= shared and (views["m"].data_ptr() - buf.data_ptr()) % 64 == 0


# CATS correction branches ------------------------------------------------------------
def test_a_branch_token_sees_only_its_prefix_like_the_hf_forward(tiny):
    """A sibling in a slot past the main branch, with its rotary position and the
    prefix it may see, gets the logits of a plain forward over prefix + itself."""
    hf = models.build_random(models.spec_of(f"random:{tiny}"), seed=5)
    stack, seq = Stack(hf), PROMPTS[0]  # main branch: seq; correction 33 replaces seq[4]
    with torch.no_grad():
        ref_main = hf(torch.tensor([seq])).logits[0]
        ref_corr = hf(torch.tensor([seq[:4] + [33]])).logits[0, -1]
    cache = stack.new_cache(1)
    stack.run(cache, (0, 6), Positions([0], [3]), tokens=torch.tensor([seq[:3]]))
    feed = torch.tensor([seq[3:] + [33, 34]])  # two siblings of seq[4] after the main branch
    at = Positions([3], [len(seq) - 3 + 2], branches=[[(4, 4, 4), (5, 4, 4)]])
    low = stack.run(cache, (0, 2), at, tokens=feed)
    out = stack.head(stack.run(cache, (2, 6), at, hidden=low))[0]
    assert torch.allclose(out[:len(seq) - 3], ref_main[3:], atol=1e-5)  # main: unaffected
    assert torch.allclose(out[-2], ref_corr, atol=1e-5)  # 33 sees neither seq[4:] nor 34


def test_verify_continues_along_a_correction_the_target_chose():
    """Target rejects proposal[1] with token 7, a correction there: the row commits
    proposal[:1], 7 and the target's token after 7 (from the correction's logits)."""
    from executors.backend.device import LocalDevice, VerifyCmd

    logits = torch.zeros(5, 10)
    for row, tok in enumerate([2, 7, 9, 9, 4]):  # rows 0-2: main, 3-4: corrections 5, 7
        logits[row, tok] = 1.0
    dev = LocalDevice("cpu", {})
    dev.keep(1, {"logits": [logits]})
    cmd = VerifyCmd(1, [[2, 3]], offsets=[0], branches=[[(1, 5, 3), (1, 7, 4)]])
    assert dev._verify(cmd) | {"margin": None} == {
        "accepted": [1], "bonus": [4], "via": [7], "margin": None}
    cmd = VerifyCmd(1, [[2, 3]], offsets=[0], branches=[[(1, 5, 3)]])  # 7 not offered
    assert dev._verify(cmd)["via"] == [None] and dev._verify(cmd)["bonus"] == [7]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cats_correction_branches_are_lossless_and_taken(tiny, seed):
    """A 1-layer draft disagrees often, a 4-layer shallow verifier rarely: the
    target takes corrections, and outputs still equal AR's token for token."""
    params = {"dram_budget_gb": 0.0009, "l_dm": 1, "l_sv": 4, "gamma": 3,
              "adapter": "norm", "corrections": 2}
    with session(tiny, seed=seed) as s:
        ref = [g[:12] for g in s.decode("ar", {}, PROMPTS).generated]
        out = s.decode("cats", params, PROMPTS)
        one = s.decode("cats", params | {"corrections": 1}, PROMPTS[:1])
        cache = s.clients["cpu:0"].device.caches[("target", 1)]
        path = one.generated[0]
        plain = Stack(s.loaded["target"].model).new_cache(1)
        seq = PROMPTS[0] + path
        Stack(s.loaded["target"].model).run(plain, (0, 6), Positions([0], [len(seq) - 1]),
                                            tokens=torch.tensor([seq[:-1]]))
    assert [g[:12] for g in out.generated] == ref and one.generated[0][:12] == ref[0]
    taken = [c for a in out.acceptance + one.acceptance for c in a.get("correction", [])]
    assert taken and any(taken)
    for layer in range(6):  # after compaction the caches hold the committed path
        n = len(seq) - 1
        assert torch.allclose(cache.k[layer][0, :, :n], plain.k[layer][0, :, :n], atol=1e-4)


def test_parallel_branches_overlap_in_worker_processes(workers):
    """Fork/join branches on two devices run at once: the spans of two 0.4 s device
    delays in a Parallel overlap (run one after the other, they could not; how long
    the whole takes is the machine's business, not asserted)."""
    import time

    from executors.coordinate.book import Sequences
    from executors.coordinate.coordinator import Coordinator
    from policies.ops import Delay, Parallel

    def one(op):
        return (yield op)

    def schedule():
        yield Parallel((one(Delay(0.4, "target", "a")), one(Delay(0.4, "draft", "b"))))

    s = workers
    clients = s.devices.start({("target", "target", 1): 1, ("draft", "target", 1): 1}, 1)
    coord = Coordinator(clients, s.placement, Sequences.start([[1, 2]]), s.n_layers)
    coord.t0 = time.perf_counter()
    coord.run(schedule())
    a, b = sorted(coord.spans, key=lambda x: x.name)
    assert a.physical != b.physical
    assert min(a.end_s, b.end_s) > max(a.start_s, b.start_s)


def test_the_executor_refuses_layouts_and_events_its_operations_do_not_give(tiny):
    """It reads layout facts from the operations alone: an Outcome that names
    nothing to observe, or a tree whose rows disagree with the batch, is refused
    in one sentence, before any device command."""
    from executors.coordinate.observers import OBSERVERS
    from policies.ops import LM, SAMPLE, Fanout, Forward, Outcome, Roots

    def one(op):
        yield op

    with session(tiny) as s:
        s.decode("ar", {}, PROMPTS[:1])  # starts the device
        cases = [(Outcome("cache_hit", 0.5), r"cannot observe event 'cache_hit' \(Outcome."
                  r"observes=NoneType\); it observes OnTree"),
                 (Forward("target", "target", (0, 6), batch=3, head=LM, emit=SAMPLE,
                          branch=1, tree=Fanout((1, 1))),
                  "widens the batch 3x but its tree layout has 2 rows per sequence"),
                 (Forward("target", "target", (0, 6), batch=2, head=LM, emit=SAMPLE,
                          branch=1, tree=Roots(2)), "grows a window from roots, but its "
                  "inputs emitted no top-k candidates")]
        for op, message in cases:
            coord = Coordinator(s.clients, s.placement, Sequences.start(PROMPTS[:1]),
                                s.n_layers, observers=OBSERVERS)
            with pytest.raises(ValueError, match=message):
                coord.run(one(op))
        coord = Coordinator(s.clients, s.placement, Sequences.start(PROMPTS[:1]),
                            s.n_layers, observers=OBSERVERS)
        with pytest.raises(ValueError, match="grows roots after the proposal of branch 1, "
                           "but its inputs scored branch 0"):
            coord.run(_roots_after(Roots(2, branch=1)))


def _roots_after(tree):
    """An early exit scoring branch 0, then a window grown from its top-2 as ``tree``."""
    from policies.ops import LM, SAMPLE, Feed, Forward, Head, TopK

    exit_handle = yield Forward("target", "target", (0, 3), head=Head("exit", 1), emit=TopK(2),
                                branch=0)
    yield Forward("target", "target", (0, 6), batch=2, head=LM, emit=SAMPLE, branch=1,
                  tree=tree, feed=Feed(exit_handle))


# distribution at temperature 1 ---------------------------------------------------
def _peaky(s: Session, role: str, scale: float) -> None:
    with torch.no_grad():
        s.loaded[role].model.lm_head.weight.mul_(scale)


def _joint(stack: Stack, prompt, vocab) -> np.ndarray:
    """Exact P(t1, t2 | prompt) of a layer stack at temperature 1."""
    def last(seqs):
        cache = stack.new_cache(len(seqs))
        at = Positions([0] * len(seqs), [len(seqs[0])] * len(seqs))
        return torch.softmax(stack.head(stack.run(cache, (0, stack.n_layers), at,
                                                  tokens=torch.tensor(seqs)))[:, -1], -1)

    p1 = last([prompt])[0]
    p2 = last([prompt + [t] for t in range(vocab)])
    return (p1[:, None] * p2).double().numpy()


def _chi2_p(samples, joint) -> float:
    counts = np.zeros_like(joint)
    for t1, t2 in samples:
        counts[t1, t2] += 1
    expected = joint / joint.sum() * len(samples)  # renormalised after fp32 softmax
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return stats.chisquare(obs, exp).pvalue


def test_sd_at_temperature_one_samples_the_target_distribution(tmp_path):
    """Rejection sampling keeps the target's distribution: SD's first two tokens
    over many rows fit the target's exact joint law and reject the draft's."""
    spec, rows, prompt = tiny_spec(tmp_path, vocab=12, layers=3, hidden=32), 3000, [1, 2, 3, 4]
    with session(spec, "self:1", temperature=1.0, max_new=2, seed=7) as s:
        _peaky(s, "target", 8.0)  # spread-out but clearly non-uniform distributions
        sd = s.decode("sd", {"gamma": 2}, [prompt] * rows)
        target = _joint(Stack(s.loaded["target"].model), prompt, 12)
        draft = _joint(Stack(s.loaded["target"].model, 1), prompt, 12)
    samples = [g[:2] for g in sd.generated]
    accepted = sum(sum(a["accepted"]) for a in sd.acceptance)
    assert accepted > rows // 4  # the draft's tokens make up much of the output
    assert _chi2_p(samples, target) > 1e-3
    assert _chi2_p(samples, draft) < 1e-6  # the test tells the two laws apart


# records ---------------------------------------------------------------------------
def test_measured_run_writes_the_record_contract(tiny, tmp_path):
    from simcore.acceptance import Trace

    config = SimConfig(platform="cpu-local", target=f"random:{tiny}", policy="sd",
                       params={"gamma": 3, "draft_layers": 4}, seed=1)
    msgs = [[{"role": "user", "content": "hello there"}]]
    out = measure(config, Options(max_new_tokens=8, mode="inline"), msgs,
                  out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["kind"] == "measured" and record["outputs"] == out["outputs"]
    assert record["inputs"]["max_new_tokens"] == 8 and out["matches_ar"] is True
    for key in ("tokens", "wall_s", "tokens_per_s", "mean_tokens_per_step",
                "step_latency_s", "steps", "seed", "speedup_vs_ar"):
        assert key in record["metrics"]
    assert "simulated_time_s" not in record["metrics"]  # a measured run's time is wall time
    spans = [json.loads(x) for x in (tmp_path / "run" / record["spans"]).read_text().split(
        "\n") if x]
    forward = next(x for x in spans if x["op"]["type"] == "Forward")
    assert forward["op"]["layers"] in ([0, 4], [0, 6]) and forward["end_s"] > forward["start_s"]
    assert {x["kind"] for x in spans} == {"compute", "transfer"}  # proposal and verdict
    assert {x["physical"] for x in spans if x["kind"] == "transfer"} == {"cpu:1->cpu:0",
                                                                         "cpu:0->cpu:1"}
    trace = json.loads((tmp_path / "run" / record["trace"]).read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(spans)
    replay = Trace(path=tmp_path / "run" / record["acceptance_trace"])
    assert replay.sample(3, 1, np.random.default_rng(0))[0] <= 3


def test_cli_run_random_model_json(tiny, tmp_path):
    from analyses.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('[{"role": "user", "content": "hi"}]\n')
    code = main(["run", "--platform", "cpu-local", "--target", f"random:{tiny}", "--policy",
                 "mirror", "--set", "gamma=3", "--set", "kappa=2", "--set", "exit_layer=3",
                 "--set", "eta=1", "--max-new-tokens", "6", "--prompts", str(prompts),
                 "--inline", "--json", "--out", str(tmp_path / "m")])
    assert code == 0
    record = json.loads((tmp_path / "m" / "record.json").read_text())
    from hwprofiles import load_model

    assert record["inputs"]["weights"]["draft"] == "self:3" and record["metrics"]["matches_ar"]
    assert load_model(record["inputs"]["draft"]).n_layers == 3  # the simulator can replay it
    assert "reuse_rate" in record["metrics"]
    assert 0 <= record["metrics"]["hidden_draft_fraction"] <= 1  # the policy's timeline
    lines = [json.loads(x) for x in (tmp_path / "m" / "acceptance.jsonl").read_text()
             .splitlines()]
    steps = [x for x in lines if "accepted" in x]
    assert steps and all(len(x["topk_hit"]) == 1 for x in steps)
    assert {x["event"] for x in lines if "event" in x} == {"reuse"}


def test_cli_errors_are_one_sentence(tiny, capsys):
    from analyses.cli import main

    code = main(["run", "--platform", "cpu-local", "--target", "qwen3-0.6b", "--policy", "ar",
                 "--inline"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the work estimate may come first; the refusal is one sentence, the last line
    assert [ln for ln in err if "error:" in ln] == err[-1:]
    assert "random:qwen3-0.6b" in err[-1] and "Traceback" not in "\n".join(err)
    missing = f"cpu:{os.cpu_count()}"  # one past the machine's last core
    code = main(["run", "--platform", "cpu-local", "--target", f"random:{tiny}", "--policy",
                 "ar", "--placement", f"target={missing}", "--inline"])
    assert code == 2 and missing in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_target_with_cpu_draft_is_lossless(tiny):
    opts = Options(max_new_tokens=12, mode="processes", physical={"target": "cuda:0"})
    with Session("cpu-local", f"random:{tiny}", "self:5", options=opts) as s:
        ref = s.decode("ar", {}, PROMPTS[:1]).generated[0][:12]
        sd = s.decode("sd", {"gamma": 3}, PROMPTS[:1])
        mirror = s.decode("mirror", {"gamma": 3, "kappa": 2, "exit_layer": 3, "eta": 1},
                          PROMPTS[:1])
    assert sd.generated[0][:12] == ref and mirror.generated[0][:12] == ref
    assert {x.physical for x in sd.spans} >= {"cuda:0", "cpu:1"}


# tensor parallelism ------------------------------------------------------------------
def _group_forwards(spans) -> list[tuple[MeasuredSpan, list[MeasuredSpan]]]:
    """Each Forward span on the group with the collective spans recorded after it."""
    out = []
    for x in spans:
        if x.kind == "compute" and x.op["type"] == "Forward":
            out.append((x, []))
        elif x.kind == "collective" and out:
            out[-1][1].append(x)
    return [(f, c) for f, c in out if f.device == "cpu_tp"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_target_sharded_over_two_workers_is_lossless(tmp_path, seed):
    """3 kv-head groups over 2 workers (2 and 1): greedy AR and SD with the target on
    cpu_tp equal single-device AR token for token; two timed all-reduces per layer
    per Forward on the group, inside its span; each worker holds about half."""
    spec = tiny_spec(tmp_path, heads=6, kv_heads=3, hidden=48)
    with session(spec, seed=seed) as s:
        ref = [g[:12] for g in s.decode("ar", {}, PROMPTS).generated]
        layers = s.loaded["target"].model.model.layers
        full_layers = sum(p.numel() * 4 for p in layers.parameters())
        norms = sum(p.numel() * 4 for layer in layers for name, p in layer.named_parameters()
                    if "layernorm" in name)  # replicated on every member
        full = sum(p.numel() * 4 for p in s.loaded["target"].model.parameters())
    with session(spec, "self:4", mode="processes", placement={"target": "cpu_tp"},
                 seed=seed) as s:
        ar, sd = s.decode("ar", {}, PROMPTS), s.decode("sd", {"gamma": 3}, PROMPTS)
        weights = call(s.clients, [("cpu:0", WeightsCmd()), ("cpu:1", WeightsCmd())])
    assert [g[:12] for g in ar.generated] == ref and [g[:12] for g in sd.generated] == ref
    assert sum(a["accepted"][0] < a["proposed"][0] for a in sd.acceptance) > 0  # rollbacks
    for run in (ar, sd):
        forwards = _group_forwards(run.spans)
        assert forwards and all(len(c) == 2 * 6 for _, c in forwards)
        assert all(f.start_s <= x.start_s <= x.end_s <= f.end_s
                   for f, c in forwards for x in c)
    shards = [w[0]["target"] for w in weights]
    assert sum(layers for layers, _ in shards) == full_layers + norms
    assert all(0.4 < layers / full_layers < 0.6 and 0.4 < whole / full < 0.65
               for layers, whole in shards)


def test_a_standalone_all_reduce_runs_in_the_group(workers):
    s = workers
    s.decode("ar", {}, PROMPTS[:1])  # starts the workers (if no test above did)
    coord = Coordinator(s.clients, s.placement, Sequences.start(PROMPTS[:1]), s.n_layers)

    def schedule():
        yield AllReduce("cpu_tp", 65536, count=3, label="sync")

    coord.run(schedule())
    spans = [x for x in coord.spans if x.kind == "collective"]
    assert [(x.name, x.op["nbytes"], x.device) for x in spans] == [
        ("sync", 65536, "cpu_tp")] * 3


def test_a_group_refuses_inline_mode_and_a_model_both_sharded_and_whole(tiny):
    with session(tiny, placement={"target": "cpu_tp"}) as s:
        with pytest.raises(ValueError, match="worker processes"):
            s.decode("ar", {}, PROMPTS[:1])
    with session(tiny, "self:5", placement={"target": "cpu_tp", "stage1": "cpu1",
                                            "stage0": "cpu_tp", "stage2": "cpu_tp"}) as s:
        with pytest.raises(ValueError, match="sharded over cpu_tp and also runs whole on"):
            s.decode("ppsd", {"exit_layer": 2}, PROMPTS[:1])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_target_sharded_over_two_cuda_devices_is_lossless(tmp_path):
    spec = tiny_spec(tmp_path, heads=6, kv_heads=3, hidden=48)
    with session(spec) as s:
        ref = [g[:12] for g in s.decode("ar", {}, PROMPTS).generated]
    opts = Options(max_new_tokens=12, mode="processes",
                   physical={"target": "cuda:0+cuda:1", "draft": "cpu:1"})
    with Session("cpu-local", f"random:{spec}", "self:4", options=opts) as s:
        out = s.decode("sd", {"gamma": 3}, PROMPTS)
    assert [g[:12] for g in out.generated] == ref
    assert any(x.kind == "collective" for x in out.spans)


def test_closing_a_stopped_worker_kills_it(monkeypatch):
    """A worker that ignores SIGTERM (here: stopped) is killed, so close() returns."""
    import signal
    import subprocess
    import sys
    from multiprocessing import Pipe

    from executors.backend import workers

    monkeypatch.setattr(workers, "EXIT_WAIT_S", 0.2)
    monkeypatch.setattr(workers, "TERM_WAIT_S", 0.2)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(proc.pid, signal.SIGSTOP)
    ours, _theirs = Pipe()
    client = workers.WorkerClient.__new__(workers.WorkerClient)
    client.conn, client.proc = ours, proc
    client.close()
    assert proc.returncode == -signal.SIGKILL
