"""Prefill and time to first token: the prologue's exact timeline against the cost
model, TTFT in every schedule's metrics, decode metrics untouched by the prefill,
prompt length as a sweep axis, the report's latency views, and the executor's
measured TTFT (tiny random model)."""

from __future__ import annotations

import json

import pytest

from analyses.compare import report
from analyses.run.api import SimConfig, run_schedule, simulate
from analyses.cli import main
from analyses.compare.sweep import expand_grid, parse_sweep, run_grid
from hwprofiles import load_model, load_platform
from policies import PolicyContext, build, build_prefill, names
import policies.ops as ops
from policies.ops import Forward, Join, Parallel, Spawn, drive
from policies.prefill import chunks_of, lanes_of, segments_of
from simcore.costmodel import RooflineCost

H100 = dict(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b")
JETSON = dict(platform="jetson-agx-orin-64gb", target="vicuna-7b", draft=None)
A100 = dict(platform="a100-sxm-8x", target="vicuna-7b", draft=None)
M2 = dict(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b")
# shipped schedules on a scenario each applies to; any other registered schedule
# runs on M2 with its defaults (a separate draft on the draft's accelerator)
# (ar runs without the scenario's draft: a draft it never runs is refused)
SCENARIOS = {"ar": ({**H100, "draft": None}, {}), "sd": (H100, {"gamma": 5}),
             "mirror": (M2, {}),
             "ssd": (M2, {"hit_rate": 0.7}), "ppsd": (A100, {}), "eesd": (A100, {}),
             "cats": (JETSON, {"dram_budget_gb": 6}),
             "kangaroo": (JETSON, {"dram_budget_gb": 6}),
             "ar_stream": (JETSON, {"dram_budget_gb": 6})}
LATENCY_KEYS = {"ttft_s", "tpot_s", "prefill_s", "prompt_tokens", "prefill_passes",
                "prefill_chunks"}


def _config(policy: str, **over) -> SimConfig:
    scenario, params = SCENARIOS.get(policy, (M2, {}))
    fields = {**scenario, "policy": policy, "params": params, "tokens": 60, "seed": 2,
              **over}
    return SimConfig(**fields)


def _forward_s(platform: str, model: str, where: str, layers, n: int, batch: int,
               context: int) -> float:
    cost = RooflineCost(load_platform(platform))
    return cost.forward(load_model(model), where, layers, n, batch, context, None,
                        None).total_s


# the prologue's timeline -----------------------------------------------------------
def test_prefill_costs_the_cost_models_forward_over_the_prompt():
    result = run_schedule(_config("ar", prompt_tokens=1024, batch=2))
    expected = _forward_s("h100-sxm-5x", "llama-3.1-70b", "target_tp", (0, 80), 1024, 2, 0)
    assert result.prefill_s == expected
    (span, *rest) = [s for s in result.prefill_spans if s.kind == "compute"]
    assert not rest and span.name == "prefill" and span.device == "target_tp"


def test_chunked_prefill_is_the_sum_of_its_chunks_each_attending_to_those_before():
    result = run_schedule(_config("ar", prompt_tokens=1000, prefill_chunk=256))
    chunks = [(256, 0), (256, 256), (256, 512), (232, 768)]
    assert chunks_of(1000, 256) == chunks
    expected = sum(_forward_s("h100-sxm-5x", "llama-3.1-70b", "target_tp", (0, 80), n, 1, c)
                   for n, c in chunks)
    assert result.prefill_s == pytest.approx(expected, rel=1e-12)
    assert result.stats["prefill_passes"] == 4 and result.stats["prefill_chunks"] == 4


def test_target_and_draft_prefill_at_once_on_their_own_devices():
    result = run_schedule(_config("sd", prompt_tokens=2048))
    target = _forward_s("h100-sxm-5x", "llama-3.1-70b", "target_tp", (0, 80), 2048, 1, 0)
    draft = _forward_s("h100-sxm-5x", "llama-3.2-1b", "gpu4", (0, 16), 2048, 1, 0)
    assert result.prefill_s == max(target, draft)
    tracks = sorted(s.device for s in result.prefill_spans if s.kind == "compute")
    assert tracks == ["gpu4", "target_tp"]


@pytest.mark.parametrize("policy", ["ar", "sd", "mirror", "ssd", "ppsd", "cats"])
def test_the_prologue_is_ordinary_operations_covering_each_layer_once(policy):
    """Every prompt position passes every layer of every segment exactly once, in
    Forwards without a head (the first token is the decoding's)."""
    scenario, params = SCENARIOS[policy]
    ctx = PolicyContext(target=load_model(scenario["target"]), tokens=8, prompt_tokens=1000,
                        prefill_chunk=300, draft=scenario["draft"] and load_model(
                            scenario["draft"]))
    seen: dict[tuple, int] = {}

    def answer(op):
        assert getattr(ops, type(op).__name__, None) is type(op)  # of the vocabulary
        if isinstance(op, Forward):
            assert op.head is None and op.label == "prefill"
            for layer in range(*op.layers):
                key = (op.device, op.model, layer)
                assert op.context == seen.get(key, 0)  # chunks in order, each after
                seen[key] = op.context + op.n_tokens   # the ones before it
        if isinstance(op, Spawn):
            return drive(op.branch, answer)
        if isinstance(op, Parallel):
            return tuple(drive(b, answer) for b in op.branches)
        return tuple(op.tasks) if isinstance(op, Join) else None

    stats = drive(build_prefill(policy, ctx, params), answer)
    segments = segments_of(build(policy, ctx, params))
    assert set(seen) == {(s.device, s.model, layer) for s in segments
                         for layer in range(s.start, s.stop)}
    assert set(seen.values()) == {1000} and stats["prefill_chunks"] == 4


def test_a_self_draft_prefills_its_layers_on_the_drafts_device():
    ctx = PolicyContext(target=load_model("llama-3.1-70b"), tokens=8)
    segs = segments_of(build("sd", ctx, {"draft_layers": 10}))
    assert {(s.device, s.model, s.start, s.stop) for s in segs} == {
        ("draft", "target", 0, 10), ("target", "target", 0, 80)}


def test_mirror_prefills_the_whole_target_and_the_draft_once():
    ctx = PolicyContext(target=load_model("qwen3-32b"), draft=load_model("qwen3-0.6b"),
                        tokens=8)
    segs = segments_of(build("mirror", ctx, {}))  # prefix and suffix: one segment
    assert [(s.device, s.model, s.start, s.stop, s.collectives) for s in segs] == [
        ("draft", "draft", 0, 28, 2), ("target", "target", 0, 64, None)]


def test_streamed_segments_know_their_chunks_and_buffer():
    ctx = PolicyContext(target=load_model("vicuna-7b"), tokens=8)
    params = {"dram_budget_gb": 6, "chunk_layers": 2, "buffer_chunks": 3}
    (seg,) = segments_of(build("cats", ctx, params))
    resident = 32 - len(seg.streamed) * 2
    assert (seg.start, seg.stop, seg.slots) == (0, 32, 3)
    assert seg.streamed == [(a, a + 2) for a in range(resident, 32, 2)]


def test_ppsd_stages_form_one_lane_and_chunks_pipeline_through_it():
    ctx = PolicyContext(target=load_model("vicuna-7b"), tokens=8)
    lanes = lanes_of(segments_of(build("ppsd", ctx, {"exit_layer": 8})))
    assert [[(s.device, s.start, s.stop) for s in lane] for lane in lanes] == [
        [("stage0", 0, 8), ("stage1", 8, 16), ("stage2", 16, 24), ("stage3", 24, 32)]]
    # vicuna-7b has 2,048 positions: a 1,536-token prompt in 8 chunks of 192
    whole = run_schedule(_config("ppsd", prompt_tokens=1536))
    chunked = run_schedule(_config("ppsd", prompt_tokens=1536, prefill_chunk=192))
    hops = [s for s in chunked.prefill_spans if s.kind == "transfer"]
    assert len(hops) == 8 * 3  # every chunk crosses every stage boundary once
    stage_s = _forward_s("a100-sxm-8x", "vicuna-7b", "gpu0", (0, 8), 1536, 1, 0)
    assert whole.prefill_s > 4 * stage_s  # one pass: the stages wait for each other
    assert chunked.prefill_s < 0.5 * whole.prefill_s  # chunks keep every stage busy


@pytest.mark.parametrize("policy", ["cats", "kangaroo", "ar_stream"])
def test_streamed_layers_stream_once_for_the_prefill(policy):
    config = _config(policy, prompt_tokens=512, prefill_chunk=128)
    result = run_schedule(config)
    spec = load_model("vicuna-7b")
    streamed = result.stats["streamed_layers"]
    streams = [s for s in result.prefill_spans if s.kind == "stream"]
    assert streamed > 0 and len(streams) == streamed  # chunk_layers=1: one per layer
    assert sum(s.nbytes for s in streams) == pytest.approx(streamed * spec.layer_bytes)
    computes = sorted(s.start_s for s in result.prefill_spans if s.kind == "compute")
    assert len(computes) == 4 * (1 + streamed)  # resident layers + each streamed layer
    streams.sort(key=lambda s: s.start_s)
    for k, stream in enumerate(streams):
        if k:  # one flash read at a time
            assert stream.start_s >= streams[k - 1].end_s
        assert computes[4 * (k + 1)] >= stream.end_s  # a layer's passes wait for it


def test_no_prompt_no_prefill():
    result = run_schedule(_config("sd", prompt_tokens=0))
    m = simulate(_config("sd", prompt_tokens=0)).metrics
    assert result.prefill_s == 0 and not result.prefill_spans
    assert m["ttft_s"] == result.first_token_s > 0


# metrics -------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", names())
def test_every_policy_reports_ttft_and_time_per_output_token(policy):
    config = _config(policy, prompt_tokens=512)
    sim = simulate(config)
    m = sim.metrics
    assert m["prompt_tokens"] == 512 and m["prefill_s"] > 0
    assert m["ttft_s"] == m["prefill_s"] + sim.result.first_token_s
    assert 0 < sim.result.first_token_s <= m["simulated_time_s"]
    assert m["tpot_s"] == pytest.approx(config.batch / m["tokens_per_s"], rel=1e-12)


@pytest.mark.parametrize("policy", names())
@pytest.mark.parametrize("deterministic", [False, True])
def test_the_prefill_leaves_every_decode_metric_as_it_was(policy, deterministic):
    """Same numbers, bit for bit, as the decoding simulated without a prologue."""
    # 1,536 + the generated tokens stay within vicuna-7b's 2,048 positions
    config = _config(policy, prompt_tokens=1536, prefill_chunk=512,
                     deterministic=deterministic, fixed_context=deterministic)
    with_prefill = run_schedule(config)
    without = run_schedule(config, prefill=False)
    assert with_prefill.prefill_s > 0 and without.prefill_s == 0
    assert with_prefill.spans == without.spans
    assert (with_prefill.time_s, with_prefill.tokens, with_prefill.outcome_rates) == (
        without.time_s, without.tokens, without.outcome_rates)
    assert {k: v for k, v in with_prefill.stats.items() if not k.startswith("prefill")} \
        == without.stats


def test_decode_metrics_do_not_depend_on_chunking():
    metrics = [simulate(_config("sd", prompt_tokens=4096, prefill_chunk=chunk)).metrics
               for chunk in (None, 1024)]
    decode = [{k: v for k, v in m.items() if k not in LATENCY_KEYS} for m in metrics]
    assert decode[0] == decode[1]
    assert metrics[0]["ttft_s"] != metrics[1]["ttft_s"]


def test_a_trace_shows_the_prefill_then_the_decoding(tmp_path):
    path = tmp_path / "t.json"
    sim = simulate(_config("sd", prompt_tokens=1024), trace_path=path, baseline=False)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    prefill = [e for e in events if e["name"].startswith("prefill")]
    decode = [e for e in events if not e["name"].startswith("prefill")]
    assert len(prefill) == len(sim.result.prefill_spans) == 3  # target, its all-reduces,
    assert len(decode) == len(sim.result.spans)                # and the draft
    end_us = max(e["ts"] + e["dur"] for e in prefill)
    assert end_us == pytest.approx(sim.metrics["prefill_s"] * 1e6)
    assert min(e["ts"] for e in decode) >= end_us * (1 - 1e-12)


def test_chunk_count_over_the_cap_is_one_sentence(capsys):
    with pytest.raises(ValueError, match="raise prefill_chunk"):
        _config("ar", prompt_tokens=1_000_000, prefill_chunk=1)
    code = main(["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                 "--policy", "ar", "--set", "prefill_chunk=0", "--tokens", "5"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "prefill_chunk" in err and len(err.splitlines()) == 1


def test_simulate_prints_ttft_and_per_token_latency(capsys):
    assert main(["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                 "--draft", "llama-3.2-1b", "--policy", "sd", "--set", "prompt_tokens=1024",
                 "--set", "prefill_chunk=512", "--tokens", "50"]) == 0
    out = capsys.readouterr().out
    assert "1024-token prompt: time to first token" in out and "per output token" in out


# sweeps and the report ---------------------------------------------------------------
BASE = dict(**M2, tokens=60, acceptance={"kind": "iid", "alpha": 0.8})


@pytest.fixture(scope="module")
def prompt_grid():
    points = expand_grid(["ar", "sd"], [parse_sweep("prompt_tokens=128,1024,8192")])
    return run_grid(points, BASE, jobs=1, quiet=True)


def test_prompt_length_is_a_sweep_axis(prompt_grid):
    assert [r.point.label for r in prompt_grid] == [
        f"{p}(prompt_tokens={n})" for p in ("ar", "sd") for n in (128, 1024, 8192)]
    for policy in ("ar", "sd"):
        mine = [r.metrics for r in prompt_grid if r.point.policy == policy]
        assert [m["prompt_tokens"] for m in mine] == [128, 1024, 8192]
        ttft = [m["ttft_s"] for m in mine]
        assert ttft == sorted(ttft) and ttft[2] > 10 * ttft[0]  # the prefill grows


def test_report_shows_ttft_beside_per_token_latency(prompt_grid):
    sections = report.build_sections(prompt_grid, BASE, ["prompt_tokens"])
    captions = [c for s in sections for c, _ in s.figures]
    assert "time to first token and per output token" in captions
    assert {"sweep: ttft_s", "sweep: tpot_s"} <= set(captions)
    latency = dict(sections[0].figures)["time to first token and per output token"]
    best = report.best_per_policy(prompt_grid)
    order = report.by_speed(best)  # bars fastest first, as the table
    assert list(latency.data[0].y) == [best[p].metrics["ttft_s"] * 1e3 for p in order]
    assert list(latency.data[1].y) == [best[p].metrics["tpot_s"] * 1e3 for p in order]
    intro = report.scenario_intro(prompt_grid, BASE)
    assert "<th>TTFT [ms]</th><th>per output token [ms]</th>" in intro


def test_compare_sweeps_prompt_tokens_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["compare", "--policies", "ar,sd", "--sweep", "prompt_tokens=128,1024",
                 "--tokens", "40", "--jobs", "1", "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 4 and summary["fastest"].startswith("sd(")
    assert summary["ttft_s"] > summary["tpot_s"] > 0  # the fastest point's latencies
    body = out.read_text()
    assert "time to first token [ms] over prompt_tokens" in body


# the executor ----------------------------------------------------------------------
def _measured_run(tmp_path):
    from executors.measure import measure
    from executors.session import Options
    from tests.test_executor import tiny_spec

    config = SimConfig(platform="cpu-local", target=f"random:{tiny_spec(tmp_path)}",
                       policy="sd", params={"gamma": 3, "draft_layers": 4}, seed=1)
    msgs = [[{"role": "user", "content": "a prompt for the prefill to process"}]]
    return measure(config, Options(max_new_tokens=6, mode="inline"), msgs,
                   out_dir=tmp_path / "run")


@pytest.mark.torch
def test_a_measured_run_records_its_time_to_first_token(tmp_path):
    out = _measured_run(tmp_path)
    assert out["matches_ar"] is True  # timing the prefill changes no token
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    m = record["metrics"]
    assert m["prefill_s"] > 0 and m["ttft_s"] > m["prefill_s"]
    assert m["prompt_tokens"] == record["inputs"]["prompt_tokens"] > 2
    spans = [json.loads(x) for x in (tmp_path / "run" / "spans.jsonl").read_text()
             .splitlines()]
    first_s = min(s["end_s"] for s in spans if s["op"]["type"] == "Verify")
    assert m["ttft_s"] == pytest.approx(m["prefill_s"] + first_s, rel=1e-12)
    assert m["tpot_s"] == pytest.approx(m["wall_s"] / m["tokens"], rel=1e-12)


@pytest.mark.torch
def test_the_report_sets_measured_against_replayed_ttft(tmp_path):
    from analyses.measured.replay import load_run, replay

    _measured_run(tmp_path)
    rep = replay(load_run(tmp_path / "run"))
    assert rep.predicted["ttft_s"] > rep.predicted["prefill_s"] > 0
    fig = report.measured_scatter([rep])
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["speedup vs AR", "tokens/s", "step latency [ms]",
                      "time to first token [ms]"]
    ttft = [t for t in fig.data if t.name == "ttft_s"][0]
    assert (ttft.x[0], ttft.y[0]) == (rep.measured["ttft_s"] * 1e3,
                                      rep.predicted["ttft_s"] * 1e3)
    rep.measured.pop("ttft_s")  # a run recorded before TTFT was: no TTFT view
    assert len(report.measured_scatter([rep]).layout.annotations) == 3
