"""hetspec serve: the serving simulation against simulate, the cost model and
queueing's identities; its workload, SLO and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyses.cli import main
from analyses.run.api import run_schedule
from analyses.run.config import RunConfig
from analyses.serve.api import ServeConfig, capacity, serve
from analyses.serve.metrics import parse_slo
from analyses.serve.pricing import GRID_ERROR, StepPricer, kv_capacity, reserved_positions
from analyses.serve.workload import read_trace, synthetic
from hwprofiles import load_platform

PLATFORM, TARGET, DRAFT = "h100-sxm-8x", "llama-3.1-70b", "llama-3.2-1b"


def _config(policy="sd", sets=None, **kw):
    draft = None if policy == "ar" else DRAFT
    return ServeConfig.build(platform=PLATFORM, target=TARGET, draft=draft, policy=policy,
                             sets={"alpha": 0.8, **(sets or {})}, **kw)


@pytest.mark.parametrize("policy,sets", [("ar", {}), ("sd", {"gamma": 4}), ("tree", {})])
def test_low_rate_requests_equal_simulate(tmp_path, policy, sets):
    """Requests that never overlap are each one simulate run: TTFT and end-to-end
    latency equal its time to first token and its prefill plus decoding."""
    arrivals = _write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n"
                      "0,128,64\n50,128,64\n100.5,128,64\n")
    config = _config(policy, sets, trace=str(arrivals), deterministic=True, exact=True)
    out = serve(config)
    run = RunConfig(platform=PLATFORM, target=TARGET, draft=config.run.draft, policy=policy,
                    params=sets, acceptance={"kind": "iid", "alpha": 0.8}, tokens=64,
                    prompt_tokens=128, deterministic=True, stack=config.run.stack)
    sim = run_schedule(run, record_spans=False)
    gaps = np.diff([r.request.arrival_s for r in out.served.requests])
    assert gaps.min() > 2 * (sim.prefill_s + sim.time_s)  # they never overlap
    for r in out.served.requests:
        assert r.first_token_s - r.request.arrival_s == pytest.approx(
            sim.prefill_s + sim.first_token_s, rel=1e-9)
        assert r.finish_s - r.request.arrival_s == pytest.approx(
            sim.prefill_s + sim.time_s, rel=1e-9)


def test_saturated_throughput_is_the_batch_step():
    """Requests arriving together, equal lengths, the batch capped at B: each wave
    of B decodes in lockstep, its decode steps exactly a simulate run of batch B,
    so the served throughput is the cost model's batch-B step's."""
    from analyses.serve.api import prepare
    from analyses.serve.workload import Request
    batch, waves = 8, 4
    config = _config("sd", {"gamma": 3, "max_batch": batch}, rate=1, requests=1,
                     prompt_tokens=256, output_tokens=96, deterministic=True, exact=True)
    ready = prepare(config, [Request(0.0, 256, 96)] * (waves * batch))
    out = serve(config, prepared=ready)
    decoding = [s.decoding for s in out.served.steps if s.decoding]
    assert set(decoding) == {batch}
    run = RunConfig(platform=PLATFORM, target=TARGET, draft=DRAFT, policy="sd",
                    params={"gamma": 3}, acceptance={"kind": "iid", "alpha": 0.8},
                    tokens=96, batch=batch, prompt_tokens=256, deterministic=True,
                    stack=config.run.stack)
    sim = run_schedule(run, record_spans=False, prefill=False)
    decode_s = sum(s.decode_s for s in out.served.steps)
    assert decode_s == pytest.approx(waves * sim.time_s, rel=1e-9)
    served = waves * batch * 96 / decode_s
    assert served == pytest.approx(batch * 96 / sim.time_s, rel=1e-9)


def test_closed_loop_clients_serve_waves_of_the_batch_step():
    """N clients in a closed loop, equal requests all ready at 0: at most N in
    flight, each client's next request sent the instant its last finishes; with
    the decodes in lockstep every wave of N is a batch-N simulate run, so
    --concurrency N --requests N is the offline batch of N."""
    batch, waves = 8, 3
    config = _config("sd", {"gamma": 3}, concurrency=batch, requests=waves * batch,
                     prompt_tokens=256, output_tokens=96, deterministic=True, exact=True)
    out = serve(config)
    rows = sorted(out.served.requests, key=lambda r: r.index)
    assert max(s.decoding for s in out.served.steps) == batch
    assert set(s.decoding for s in out.served.steps if s.decoding) == {batch}
    finishes = sorted({r.finish_s for r in rows})
    assert len(finishes) == waves  # each wave finishes together
    for i, r in enumerate(rows):  # sent when a slot freed: wave w at wave w-1's finish
        wave = i // batch
        assert r.request.arrival_s == (0.0 if wave == 0 else finishes[wave - 1])
        assert r.held_s == r.request.arrival_s
    run = RunConfig(platform=PLATFORM, target=TARGET, draft=DRAFT, policy="sd",
                    params={"gamma": 3}, acceptance={"kind": "iid", "alpha": 0.8},
                    tokens=96, batch=batch, prompt_tokens=256, deterministic=True,
                    stack=config.run.stack)
    sim = run_schedule(run, record_spans=False, prefill=False)
    assert sum(s.decode_s for s in out.served.steps) == pytest.approx(waves * sim.time_s,
                                                                      rel=1e-9)
    law = out.metrics["littles_law"]  # the clock of a held request starts when it is sent
    assert law["in_system_mean"] == pytest.approx(law["lambda_w"], rel=1e-9)
    assert out.metrics["queue_s"]["p99"] == 0.0  # the clients never oversubscribe


def test_concurrency_caps_open_arrivals_in_flight():
    """Poisson arrivals faster than the engine serves them, at most N in flight:
    the batch never passes N, and the requests beyond it wait at their clients,
    not in the engine's queue; without the cap the engine queue holds them."""
    capped = serve(_config("sd", {"gamma": 4}, rate=40, concurrency=4, requests=120,
                           seed=2))
    free = serve(_config("sd", {"gamma": 4}, rate=40, requests=120, seed=2))
    assert max(s.decoding for s in capped.served.steps) <= 4
    assert max(s.decoding for s in free.served.steps) > 4
    assert sum(r.held_s > 0 for r in capped.served.requests) > 60
    assert all(r.held_s == 0 for r in free.served.requests)
    for r in capped.served.requests:
        assert r.request.arrival_s <= r.admitted_s <= r.first_token_s <= r.finish_s


@pytest.mark.parametrize("kw,words", [
    ({"concurrency": 0}, "outside 1.."),
    ({"concurrency": 4, "cv": 2.0}, "every request is ready at once"),
])
def test_concurrency_refusals(kw, words):
    with pytest.raises(ValueError, match=words):
        serve(_config("sd", {"gamma": 4}, requests=10, **kw))


def test_capacity_needs_a_rate_beside_concurrency():
    with pytest.raises(ValueError, match="the clients set the load"):
        capacity(_config("sd", {"gamma": 4}, concurrency=8, requests=10,
                         slo="ttft=0.5,tpot=0.05"))


def test_littles_law_and_request_order():
    out = serve(_config("sd", {"gamma": 4}, rate=6, requests=300, seed=3))
    law = out.metrics["littles_law"]
    rows = out.served.requests
    # L integrated independently on a fine grid of instants
    start = min(r.request.arrival_s for r in rows)
    end = max(r.finish_s for r in rows)
    t = np.linspace(start, end, 200_001)[:-1] + (end - start) / 400_000
    arrivals = np.sort([r.request.arrival_s for r in rows])
    finishes = np.sort([r.finish_s for r in rows])
    in_system = np.searchsorted(arrivals, t, "right") - np.searchsorted(finishes, t, "right")
    assert in_system.mean() == pytest.approx(law["lambda_w"], rel=0.01)
    assert law["in_system_mean"] == pytest.approx(law["lambda_w"], rel=1e-9)
    for r in rows:
        assert r.request.arrival_s <= r.admitted_s <= r.first_token_s <= r.finish_s
        assert r.generated == r.request.output_tokens


def test_grid_pricing_is_within_its_error_of_exact():
    run = _config("sd", {"gamma": 4}, rate=1, requests=1).run
    grid = StepPricer(run, max_batch=256, max_context=8192, chunk=2048)
    exact = StepPricer(run, max_batch=256, max_context=8192, chunk=2048, exact=True)
    for batch, context in ((3, 700), (13, 1500), (50, 3000), (200, 6000)):
        assert grid.step_s(batch, context) == pytest.approx(exact.step_s(batch, context),
                                                            rel=GRID_ERROR)
    # the grid interpolates linearly: off-grid batches fall between their neighbours
    assert grid.step_s(12, 1024) < grid.step_s(13, 1024) < grid.step_s(16, 1024)


def test_kv_reserves_proposed_positions():
    """A chain of K drafts holds K+1 positions a step; a tree its nodes; and the
    engine's cache never holds more than its capacity, preempting to stay inside."""
    assert reserved_positions(_config("ar", rate=1, requests=1).run) == 1
    assert reserved_positions(_config("sd", {"gamma": 7}, rate=1, requests=1).run) == 8
    platform = load_platform(PLATFORM)
    sd = _config("sd", {"gamma": 7}, rate=1, requests=1).run
    assert kv_capacity(sd, platform, 256, 8192) > 1e6  # 70B on 8 x 80 GB holds ~1.5M
    config = _config("sd", {"gamma": 7}, rate=50, requests=60, prompt_tokens=1000,
                     output_tokens=300, seed=2)
    from analyses.serve import api
    real = api.kv_capacity
    try:
        api.kv_capacity = lambda *a: 6000  # a small cache: room for about four requests
        out = serve(config)
    finally:
        api.kv_capacity = real
    assert out.metrics["preemptions"] > 0
    assert max(s.kv_used for s in out.served.steps) <= 6000
    assert all(r.generated == r.request.output_tokens for r in out.served.requests)


def test_speculation_stops_paying_under_load():
    """At low load speculation cuts TPOT; saturated, its wide verifies cost more
    than the tokens they add (the batch regime), so AR serves more."""
    low = {p: serve(_config(p, {"gamma": 4} if p == "sd" else {}, rate=0.5,
                            requests=40, seed=1)).metrics for p in ("ar", "sd")}
    assert low["sd"]["tpot_s"]["p50"] < 0.7 * low["ar"]["tpot_s"]["p50"]
    high = {p: serve(_config(p, {"gamma": 4} if p == "sd" else {}, rate=200,
                             requests=600, seed=1)).metrics for p in ("ar", "sd")}
    assert high["sd"]["throughput_tokens_per_s"] < high["ar"]["throughput_tokens_per_s"]


def test_capacity_bisects_to_the_slo_edge():
    config = _config("sd", {"gamma": 4}, rate=1, requests=150, seed=1,
                     slo="ttft=0.5,tpot=0.03")
    found = capacity(config, low=1.0, tolerance=0.05)
    assert found["rate"] is not None
    held = [t["rate"] for t in found["tried"] if t["holds"]]
    missed = [t["rate"] for t in found["tried"] if not t["holds"]]
    assert found["rate"] == max(held)
    assert min(r for r in missed if r > found["rate"]) <= found["rate"] * 1.05 + 1e-9


def test_auto_gamma_picks_per_step_and_beats_a_bad_fixed_gamma():
    auto = serve(_config("sd", {"gamma": "auto"}, rate=4, requests=150, seed=1,
                         prompt_tokens=512, output_tokens=128)).metrics
    assert sum(v > 0 for v in auto["mode_steps"].values()) >= 1
    fixed = serve(_config("sd", {"gamma": 8}, rate=4, requests=150, seed=1,
                          prompt_tokens=512, output_tokens=128)).metrics
    assert auto["tpot_s"]["mean"] <= fixed["tpot_s"]["mean"] * 1.001
    with pytest.raises(ValueError, match="switch_s prices"):
        _config("sd", {"gamma": 4, "switch_s": 0.001}, rate=1, requests=1)


def test_per_request_acceptance_spreads_tpot():
    one = serve(_config("sd", {"gamma": 4}, rate=0.2, requests=60, seed=4,
                        prompt_tokens=256, output_tokens=128)).metrics
    spread = serve(_config("sd", {"gamma": 4, "alpha_spread": 0.15}, rate=0.2,
                           requests=60, seed=4, prompt_tokens=256,
                           output_tokens=128)).metrics
    width = lambda m: m["tpot_s"]["p90"] - m["tpot_s"]["p50"]  # noqa: E731
    assert width(spread) > 1.5 * width(one)


# the workload ------------------------------------------------------------------
def test_synthetic_workload_is_seeded_and_shaped():
    a = synthetic(2000, 5.0, seed=7)
    assert a == synthetic(2000, 5.0, seed=7) and a != synthetic(2000, 5.0, seed=8)
    gaps = np.diff([r.arrival_s for r in a])
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)
    bursty = np.diff([r.arrival_s for r in synthetic(4000, 5.0, seed=7, cv=4.0)])
    assert bursty.std() / bursty.mean() == pytest.approx(4.0, rel=0.2)
    # the Azure conversation trace's medians (prompt 1,020, output 129 tokens)
    assert np.median([r.output_tokens for r in a]) == pytest.approx(129, rel=0.08)
    assert np.median([r.prompt_tokens for r in a]) == pytest.approx(1020, rel=0.08)


def _write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trace_formats(tmp_path):
    azure = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    rows = read_trace(azure)
    assert rows[0].arrival_s == 0 and rows[1].arrival_s == pytest.approx(4.314579, abs=1e-5)
    jsonl = _write(tmp_path, '{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 5, '
                   '"alpha": 0.7}\n', "t.jsonl")
    assert read_trace(jsonl)[0].alpha == 0.7


@pytest.mark.parametrize("body,words", [
    ("arrival_s,prompt_tokens,output_tokens\n1,10,5\n0.5,10,5\n", "sort the trace"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,5\n", "negative"),
    ("arrival_s,prompt_tokens,output_tokens\n1,10,5\n1,10,5\n", "repeats the row above"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1e9,10,5\n", "ms or us"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", "outside 1.."),
    ("arrival_s,prompt_tokens,output_tokens\n0,2.5,5\n", "whole number"),
    ("arrival_s,prompt_tokens\n0,10\n", "no output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens,alpha\n0,10,5,1.5\n", "not a probability"),
])
def test_bad_traces_are_refused_in_a_sentence(tmp_path, body, words):
    with pytest.raises(ValueError, match=words):
        read_trace(_write(tmp_path, body))


def test_slo_units():
    assert parse_slo("ttft=500ms,tpot=50ms").ttft_s == pytest.approx(0.5)
    assert parse_slo("ttft=0.5,tpot=0.05").tpot_s == pytest.approx(0.05)
    with pytest.raises(ValueError, match="milliseconds"):
        parse_slo("ttft=500,tpot=50")
    with pytest.raises(ValueError, match="twice"):
        parse_slo("ttft=1,ttft=2")


# the command ---------------------------------------------------------------------
ARGS = ["serve", "--platform", PLATFORM, "--target", TARGET, "--draft", DRAFT,
        "--policy", "sd", "--rate", "4", "--requests", "200", "--seed", "1",
        "--slo", "ttft=0.5,tpot=0.05"]


def test_serve_prints_percentiles_goodput_and_the_slo(capsys):
    assert main(ARGS) == 0
    text = capsys.readouterr().out
    for words in ("TTFT", "TPOT", "p99", "goodput", "SLO (TTFT <= 500 ms and TPOT <= 50 ms",
                  "holds"):
        assert words in text


def test_serve_json_and_outputs(tmp_path, capsys):
    trace, record = tmp_path / "s.json", tmp_path / "r.json"
    assert main(ARGS + ["--json", "--trace", str(trace), "--record", str(record)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s", "throughput_tokens_per_s", "slo",
                "preemptions", "timeline", "littles_law", "breakdown"):
        assert key in out
    assert set(out["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert out["slo"]["goodput_tokens_per_s"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "step" for e in events)
    assert len(json.loads(record.read_text())["requests"]) == 200


@pytest.mark.parametrize("extra,words", [
    (["--policy", "cats", "--draft", DRAFT], "streams layers"),
    (["--rate", "0"], "not a positive number"),
    (["--rate", "1e9"], "above any hardware"),
    (["--slo", "ttft=500,tpot=0.05"], "milliseconds"),
    (["--output-tokens", "200000", "--prompt-tokens", "100"], "trained for"),
    (["--set", "prompt_tokens=100"], "each request has its own prompt"),
    (["--concurrency", "0"], "outside 1.."),
])
def test_serve_refusals(capsys, extra, words):
    assert main(ARGS + extra) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_compare_serve_reports_curves_capacities_and_the_crossover(tmp_path, capsys):
    report = tmp_path / "serve.html"
    assert main(["compare", "--serve", "--platform", PLATFORM, "--target", TARGET,
                 "--draft", DRAFT, "--policies", "sd", "--set", "gamma=4",
                 "--sweep", "rate=1,12,32", "--requests", "200", "--slo",
                 "ttft=0.5,tpot=0.05", "--jobs", "1", "-o", str(report), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"] == ["ar", "sd"]  # AR joins as the baseline
    assert set(out["capacity_requests_per_s"]) == {"ar", "sd"}
    crossing = out["crossover"][0]
    assert crossing["speedup"][0] > 1 > crossing["speedup"][-1]
    assert 1 < crossing["rate"] < 32 and "stops paying" in crossing["sentence"]
    html = report.read_text()
    for words in ("Latency against load", "Speedup over AR against load",
                  "SLO attainment and capacity", "stops paying"):
        assert words in html


def test_compare_serve_sweeps_concurrency(tmp_path, capsys):
    """--sweep concurrency: closed-loop clients at each load; the crossing is
    interpolated in log(concurrency), capacities are the highest swept load
    meeting the SLO, and the report's axes name the load."""
    report = tmp_path / "serve.html"
    assert main(["compare", "--serve", "--platform", PLATFORM, "--target", TARGET,
                 "--draft", DRAFT, "--policies", "sd", "--set", "gamma=4", "--set",
                 "alpha=0.6", "--sweep", "concurrency=1,16,128", "--requests", "128",
                 "--slo", "ttft=2,tpot=0.05", "--jobs", "1", "-o", str(report),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["axis"] == "concurrency" and out["loads"] == [1, 16, 128]
    for policy, cap in out["capacity_concurrency"].items():
        holds = [m["slo_holds"] for m in out["per_load"][policy]]
        expect = None
        for load, ok in zip(out["loads"], holds):
            if not ok:
                break
            expect = load
        assert cap == expect
    crossing = out["crossover"][0]
    s = crossing["speedup"]
    assert s[0] > 1 > s[-1], s
    i = next(k for k in range(1, 3) if s[k - 1] > 1 >= s[k])
    lo, hi = out["loads"][i - 1], out["loads"][i]
    w = (s[i - 1] - 1) / (s[i - 1] - s[i])
    assert crossing["concurrency"] == pytest.approx(lo * (hi / lo) ** w, rel=1e-12)
    assert "requests in flight" in crossing["sentence"]
    assert "concurrency (requests in flight)" in report.read_text()


def test_compare_serve_on_ray_matches_local():
    """The serving sweep's runs on a Ray cluster give the local runs' figures."""
    ray = pytest.importorskip("ray")
    from analyses.compare.serving import compare_serving
    configs = {p: _config(p, {"gamma": 4} if p != "ar" else {}, rate=1, requests=40,
                          slo="ttft=0.5,tpot=0.05") for p in ("ar", "sd")}
    local = compare_serving(configs, [1, 16], axis="concurrency", jobs=1, quiet=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = compare_serving(configs, [1, 16], axis="concurrency", backend="ray",
                                 quiet=True)
    finally:
        ray.shutdown()
    assert remote.summary() == local.summary()


@pytest.mark.parametrize("sweep,words", [
    (["--sweep", "rate=1,2", "--sweep", "concurrency=1,2"], "sweeps one load"),
    (["--sweep", "concurrency=1.5,4"], "whole numbers"),
    (["--sweep", "concurrency=4,4"], "a value twice"),
])
def test_compare_serve_load_refusals(capsys, sweep, words):
    assert main(["compare", "--serve", "--platform", PLATFORM, "--target", TARGET,
                 "--draft", DRAFT, "--policies", "sd", *sweep, "--requests", "20"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


# a served workload measured for real, and its replay -----------------------------
def _served_record(tmp_path, rows, policy="ar"):
    from analyses.serve.real import KIND, served_of
    from analyses.serve.metrics import SLO, request_metrics
    from policies.runs.files import RUN_SCHEMA
    inputs = {"platform": PLATFORM, "target": TARGET, "draft": None, "policy": policy,
              "params": {}, "seed": 0, "stack": "vllm", "max_batch": 1}
    record = {"schema": RUN_SCHEMA, "kind": KIND, "inputs": inputs,
              "metrics": request_metrics(served_of(rows), SLO()), "requests": rows}
    path = tmp_path / "served.json"
    path.write_text(json.dumps(record))
    return path


def test_replay_of_a_served_record_predicts_what_the_engine_serves(tmp_path):
    """A record whose times are the simulated engine's own (batch cap 1, one token a
    step) replays with no error: the replay serves the same requests the same way."""
    from analyses.serve.real import replay_serving
    config = _config("ar", {"max_batch": 1}, trace=str(_write(
        tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,300,40\n0.1,200,30\n"
                  "0.15,250,20\n3,100,25\n")), deterministic=True, exact=True)
    out = serve(config)
    rows = [{"arrival_s": r.request.arrival_s, "started_s": r.admitted_s,
             "first_token_s": r.first_token_s, "finish_s": r.finish_s,
             "prompt_tokens": r.request.prompt_tokens,
             "output_tokens": r.request.output_tokens,
             "committed_per_step": [1] * r.request.output_tokens,
             "proposed_per_step": [], "accepted_per_step": []}
            for r in out.served.requests]
    assert rows[1]["started_s"] > rows[1]["arrival_s"]  # it queued behind the first
    replayed = replay_serving(_served_record(tmp_path, rows))
    for figure in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        for stat, v in replayed["figures"][figure].items():
            if v["measured"]:
                assert v["error"] == pytest.approx(0, abs=1e-9), (figure, stat)


def test_prefill_apart_decodes_a_request_in_the_step_that_prefills_it(tmp_path):
    """The executor's rule: a step's prefill is a pass of its own before its decode,
    and the request it completes decodes in that same step; by default the request
    decodes from the next step, its prefill riding beside that step's decodes."""
    from dataclasses import replace
    trace = str(_write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n"
                                 "0,300,5\n0.001,200,5\n"))
    config = _config("ar", {"max_batch": 4}, trace=trace, deterministic=True, exact=True)
    base, apart = serve(config), serve(replace(config, prefill_apart=True))
    pricer = apart.modes[0].pricer
    first, second = apart.served.requests
    assert first.first_token_s == pytest.approx(
        pricer.prefill_s(0, 300) + pricer.step_s(1, 300), rel=1e-9)
    assert second.first_token_s - first.first_token_s == pytest.approx(
        pricer.prefill_s(0, 200) + pricer.step_s(2, (301 + 200) / 2), rel=1e-9)
    one, two = base.served.requests  # by default: a step of prefill alone first
    assert one.first_token_s == pytest.approx(
        pricer.prefill_s(0, 300) + pricer.step_s(1, 300) + pricer.prefill_s(0, 200),
        rel=1e-9)
    assert two.first_token_s > one.first_token_s


def test_replay_refuses_a_run_record_as_a_served_one(tmp_path):
    from analyses.serve.real import replay_serving
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": "hetspec.run/1", "kind": "measured",
                                "inputs": {}, "metrics": {}}))
    with pytest.raises(ValueError, match="not a served workload"):
        replay_serving(path)


@pytest.mark.slow
def test_a_workload_served_for_real_is_recorded_and_replayed(tmp_path, capsys):
    """Six requests arriving at once into a batch of at most 4: they are decoded
    together (continuous batching), each step's batch is recorded, and the replay
    serves the record with the same cap."""
    record = tmp_path / "served.json"
    assert main(["serve", "--real", "--platform", "cpu-local", "--target", "smollm2-135m",
                 "--policy", "sd", "--draft", "ngram", "--rate", "1000", "--requests", "6",
                 "--max-new-tokens", "8", "--max-batch", "4", "--record",
                 str(record)]) == 0
    data = json.loads(record.read_text())
    assert data["kind"] == "served" and len(data["requests"]) == 6
    assert data["inputs"]["max_batch"] == 4
    for r in data["requests"]:
        assert r["arrival_s"] <= r["started_s"] <= r["first_token_s"] <= r["finish_s"]
        assert r["output_tokens"] == 8 and sum(r["committed_per_step"]) >= 8
        assert len(r["batch_per_step"]) == len(r["committed_per_step"])
        assert all(1 <= b <= 4 for b in r["batch_per_step"])
    assert max(b for r in data["requests"] for b in r["batch_per_step"]) > 1
    capsys.readouterr()
    assert main(["replay", str(record), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 6 and out["figures"]["ttft_s"]["p50"]["predicted"] > 0
    assert out["max_batch"] == 4 and 1 < out["batch_max"] <= 4


def test_a_replayed_step_trace_is_consumed_step_by_step(tmp_path):
    """A request replaying measured steps commits exactly its trace, one step each,
    and a step where nothing was proposed is priced as AR's one-token pass."""
    from analyses.serve.api import prepare
    from analyses.serve.workload import Request
    config = _config("sd", {"gamma": 4, "max_batch": 1}, rate=1, requests=1,
                     prompt_tokens=128, output_tokens=16, deterministic=True, exact=True)
    trace = ((1, False), (5, True), (5, True), (1, False), (4, True))
    ready = prepare(config, [Request(0.0, 128, 16, step_trace=trace)])
    out = serve(config, prepared=ready)
    decode = [s for s in out.served.steps if s.decoding]
    assert len(decode) == len(trace)
    assert out.served.requests[0].generated == 16
    plain = [s.decode_s for s, (_, proposed) in zip(decode, trace) if not proposed]
    spec = [s.decode_s for s, (_, proposed) in zip(decode, trace) if proposed]
    assert max(plain) < min(spec)  # a one-token pass is cheaper than a verify of five


def test_the_token_budget_caps_the_batch_by_its_proposed_positions():
    """A tree proposing 45 positions a request fits 11 requests in a 512-position
    step, whatever the batch cap."""
    out = serve(_config("tree", {"token_budget": 512}, rate=100, requests=40,
                        prompt_tokens=100, output_tokens=50, seed=1))
    reserve = out.metrics["schedule"]["reserve_positions"]["tree"]
    assert max(s.decoding for s in out.served.steps) == 512 // reserve
