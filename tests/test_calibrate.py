"""Calibration on synthetic measured runs whose true profile is known.

``make_measured_run`` plays the executor's part: it runs a schedule's
operations one after another, timing each with the roofline cost of a "true"
platform (efficiencies and launch overheads unlike the shipped profile), adds
seeded noise and a few outliers, and writes the files of the measured-run
contract. Calibrating the shipped profile on such runs must recover the true
parameters and predict held-out runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from analyses.calibrate.terms import Param, Terms, apply, critical_times, fit, pass_terms
from analyses.cli import main
from executors.passes import span_passes
from analyses.calibrate.costfit import predict
from analyses.measured.executorwork import STEP_END, ExecutorWork
from analyses.calibrate.session import calibrate, calibration_date, split_runs
from analyses.measured.replay import load_run
from analyses.calibrate.streamterms import dispatch_gaps
from hwprofiles import load_model, load_platform
from policies import PolicyContext, build
from policies.cachebook import PositionBook
from policies.ops import (LM, SAMPLE, Forward, Join, Spawn, StreamWeights, Transfer, Verdict,
                          Verify, drive)
from simcore import RooflineCost, acceptance
from policies.runs.measured import MeasuredSpan
from policies.runs.files import Span, chrome_trace, write_record
from benchscripts import load_benchmark

# The two cores of cpu-local have one spec, so they share their parameters. The
# fake executor below feeds AR passes of one row, SD drafts of one row (8, 15 or
# 30 layers) and verify passes of 4 to 9 rows: every parameter is constrained.
TRUE_DEVICE = {"compute_efficiency": 0.25, "launch_overhead_s": 2e-4,
               "call_overhead_s": 1e-3, "roofline_exponent": 1.5,
               "multirow_memory_factor": 1.3}
TRUE_MEMORY_EFFICIENCY = 0.6
TRUE_LINK_LATENCY_S = 80e-6
TRUE_DISK_GB_S = 1.2  # unlike the profile's 3.15; the cores' stream_host_gb_s is kept
CORES = "cpu0,cpu1"


def true_platform(device: dict | None = None, tiers: dict | None = None):
    """The true platform; ``device`` and ``tiers`` (tier name -> fields) override it."""
    p = _true_platform()
    devices = tuple(d.model_copy(update=device or {}) for d in p.devices)
    new_tiers = tuple(t.model_copy(update=(tiers or {}).get(t.name, {}))
                      for t in p.memory_tiers)
    return p.model_copy(update={"devices": devices, "memory_tiers": new_tiers})


def _true_platform():
    p = load_platform("cpu-local")
    devices = tuple(d.model_copy(update=TRUE_DEVICE) for d in p.devices)
    tiers = tuple(t.model_copy(update={"memory_efficiency": TRUE_MEMORY_EFFICIENCY}
                               if t.kind == "dram" else {"bandwidth_gb_s": TRUE_DISK_GB_S})
                  for t in p.memory_tiers)
    links = tuple(l.model_copy(update={"latency_s": TRUE_LINK_LATENCY_S}) for l in p.links)
    return p.model_copy(update={"devices": devices, "memory_tiers": tiers, "links": links})


def _op_fields(op) -> dict:
    out = {"type": type(op).__name__}
    if isinstance(op, Forward):  # the fields the executor records of a Forward
        return {**out, **op.record()}
    for f in dataclasses.fields(op):
        v = getattr(op, f.name)
        if isinstance(v, (int, float, str, type(None))) or isinstance(v, tuple):
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def make_measured_run(out: Path, policy: str, params: dict, *, seed: int, tokens: int = 60,
                      alpha: float = 0.7, noise: float = 0.03, verify_s: float = 0.0,
                      target: str = "smollm2-135m", prompt_tokens: int = 40,
                      outliers: float = 0.02, truth=None) -> Path:
    """Run a schedule against the true platform's costs and write a measured run.
    Each Verify takes ``verify_s`` (sampling, which the simulator has no term for).
    Operations run one after another, a spawned branch at once (as a device that
    streams its weights on its own core does)."""
    plat, rng = truth or true_platform(), np.random.default_rng(seed)
    cost, models = RooflineCost(plat), {"target": load_model(target),
                                        "draft": load_model("smollm2-135m")}
    ctx = PolicyContext(models["target"], models["draft"], tokens=tokens,
                        prompt_tokens=prompt_tokens)
    schedule, acc = build(policy, ctx, params), acceptance.IID(alpha=alpha)
    spans, lines, clock, book = [], [], {"now": 0.0}, PositionBook()

    def answer(op):
        if isinstance(op, Spawn):
            return drive(op.branch, answer)
        if isinstance(op, Join):
            return (None,) * len(op.tasks)
        if isinstance(op, Verify):
            verdict = Verdict(acc.sample(op.gamma, op.batch, rng))
            lines.append({"accepted": list(verdict.accepted), "gamma": op.gamma})
            book.settle(verdict, op.branch)
            _timed(spans, clock, op, "", verify_s, "compute")
            return verdict
        if isinstance(op, StreamWeights):  # free to start: the round trip first
            clock["now"] += plat.device(plat.placement[op.device]).stream_dispatch_s
        # a runtime counts what a catch_up Forward feeds: the executor's cache
        # book and the simulator's position book do; this one uses the latter
        fed = book.feed(op) if isinstance(op, Forward) else op
        for o, track, seconds, kind in _fake_steps(plat, cost, models, fed):
            seconds *= float(np.exp(rng.normal(0, noise)))
            if rng.random() < outliers:
                seconds *= 3.0  # an outlier: the core was preempted
            _timed(spans, clock, op if o is fed else o, track, seconds, kind,
                   _caught_up(op, fed))
        return op

    drive(schedule, answer)
    return _write(out, policy, params, target, (tokens, prompt_tokens), seed, clock["now"],
                  spans, lines)


def _caught_up(op, fed) -> dict:
    """What the executor records of a catch-up Forward beside its fields."""
    if not isinstance(op, Forward) or not op.feed.catch_up:
        return {}
    return {"n_fed": fed.n_tokens, "caught_up": fed.n_tokens - op.n_tokens,
            "context_measured": fed.context}


def _timed(spans: list, clock: dict, op, track: str, seconds: float, kind: str,
           extra: dict | None = None) -> None:
    now = clock["now"]
    spans.append({"op": {**_op_fields(op), **(extra or {})}, "device": track, "start_s": now,
                  "end_s": now + seconds, "name": op.label, "kind": kind})
    clock["now"] = now + seconds


def _fake_steps(plat, cost, models, op):
    """(op, track, true seconds, span kind) for each timed part of an operation."""
    if isinstance(op, Transfer):  # a message along the route between placements
        src, dst = (plat.members(plat.placement[r])[0] for r in (op.src, op.dst))
        return [(op, "link:" + link.name, RooflineCost.hop_s(link, op.nbytes), "transfer")
                for link in plat.route(src, dst)]
    where = plat.placement[op.device]
    if isinstance(op, StreamWeights):
        device = plat.device(where)
        tier = plat.tier(device.storage)
        alone_s = (tier.latency_s + RooflineCost.requests_s(tier, op.nbytes)  # a read alone
                   + op.nbytes / (tier.bandwidth_bytes_s * tier.memory_efficiency))
        return [(op, tier.name, alone_s + RooflineCost.stream_host_s(device, op.nbytes),
                 "stream")]
    # the device passes the executor runs for it (executors.passes), one after another
    widths, head_rows = span_passes(_op_fields(op))
    seconds = sum(cost.forward(models[op.model], where, op.layers, width, op.batch,
                               op.context + (widths[0] + i - 1 if i else 0),
                               op.head and op.head.kind, op.collectives,
                               head_rows or None).total_s
                  for i, width in enumerate(widths))
    return [(op, where, seconds, "compute")]


def _write(out, policy, params, target, sizes, seed, wall_s, spans, lines) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    (out / "acceptance.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    trace = chrome_trace([Span(s["name"], s["kind"], s["device"], s["start_s"], s["end_s"])
                          for s in spans])
    (out / "trace.json").write_text(json.dumps(trace))
    made = sum(sum(d["accepted"]) + len(d["accepted"]) for d in lines)
    metrics = {"tokens": made, "simulated_time_s": wall_s, "tokens_per_s": made / wall_s,
               "steps": len(lines), "step_latency_s": wall_s / len(lines),
               "mean_tokens_per_step": made / len(lines), "seed": seed}
    inputs = {"platform": "cpu-local", "target": target,
              "draft": None if policy == "ar" else "smollm2-135m", "policy": policy,
              "params": params, "tokens": sizes[0], "batch": 1, "seed": seed,
              "prompt_tokens": sizes[1], "max_new_tokens": sizes[0]}
    return write_record(out / "record.json", kind="measured", inputs=inputs, metrics=metrics,
                        spans="spans.jsonl", trace="trace.json",
                        acceptance_trace="acceptance.jsonl", outputs=[[1, 2, 3]])


# (policy, params, prompt tokens): AR at two context lengths, SD with an 8- and a
# 15-layer self-draft and with the separate 30-layer draft, verify widths 4 to 9;
# the second AR run at 1500 repeats the first's configuration and is held out.
RUNS = [("ar", {}, 40), ("sd", {"gamma": 4, "draft_layers": 8}, 1500),
        ("ar", {}, 1500), ("sd", {"gamma": 3}, 600),
        ("sd", {"gamma": 8, "draft_layers": 15}, 40)]


def _make_runs(root: Path, noise: float, outliers: float, verify_s: float = 0.0) -> Path:
    for i, (policy, params, prompt) in enumerate(RUNS):
        make_measured_run(root / f"{policy}-{i}", policy, params, seed=i,
                          prompt_tokens=prompt, noise=noise, outliers=outliers,
                          verify_s=verify_s)
    return root


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """3% lognormal noise on every span and no outliers: an outlier (a preempted
    core) lengthens a measured run by a time no profile can predict."""
    return _make_runs(tmp_path_factory.mktemp("runs"), noise=0.03, outliers=0.0)


def _fit(root: Path):
    runs = [load_run(p) for p in sorted(root.glob("*/record.json"))]
    plat = load_platform("cpu-local")
    return fit(plat, [t for r in runs for t in Terms(plat).of_run(r)])


def test_fit_recovers_the_true_parameters(tmp_path):
    """Spans without noise: every parameter comes back, the new terms (call
    overhead, roofline exponent, multi-row memory factor) too, the two identical
    cores fitted as one."""
    result = _fit(_make_runs(tmp_path, noise=0.0, outliers=0.0))
    # Messages of a few bytes say nothing of the link's bandwidth: kept.
    assert result.success and result.unconstrained == [
        Param("link", "ipc-cpu0-cpu1", "bandwidth_gb_s")]
    assert result.values[result.unconstrained[0]] == 6.19
    assert {p.name for p in result.values if p.kind == "device"} == {CORES}
    for name, value in TRUE_DEVICE.items():
        assert result.values[Param("device", CORES, name)] == pytest.approx(value, rel=1e-3)
    assert result.values[Param("tier", "dram", "memory_efficiency")] == pytest.approx(
        TRUE_MEMORY_EFFICIENCY, rel=1e-3)
    assert result.values[Param("link", "ipc-cpu0-cpu1", "latency_s")] == pytest.approx(
        TRUE_LINK_LATENCY_S, rel=1e-3)
    assert result.median_abs_error < 1e-6


def test_robust_loss_ignores_outliers(tmp_path):
    """2% of the spans 3x too long (a preempted core): the robust loss keeps the
    well-determined terms and the predictions of the other spans; the
    launch/call/memory split, which only context lengths tell apart, may move a
    little."""
    result = _fit(_make_runs(tmp_path, noise=0.0, outliers=0.02))
    assert result.values[Param("device", CORES, "compute_efficiency")] == pytest.approx(
        TRUE_DEVICE["compute_efficiency"], rel=0.02)
    assert result.values[Param("link", "ipc-cpu0-cpu1", "latency_s")] == pytest.approx(
        TRUE_LINK_LATENCY_S, rel=0.01)
    good = np.abs(result.log_residuals) < 0.5  # the outliers sit at log(1/3)
    assert good.mean() > 0.95 and np.max(np.abs(result.log_residuals[good])) < 0.005


def _truth() -> dict:
    out = {Param("device", CORES, k): v for k, v in TRUE_DEVICE.items()}
    for field, off in (("memory_half_bytes", 0.0), ("compute_half_flops", 0.0),
                       ("memory_bandwidth_gb_s", float("inf"))):  # the optional terms, off
        out[Param("device", CORES, field)] = off
    out[Param("tier", "dram", "memory_efficiency")] = TRUE_MEMORY_EFFICIENCY
    out[Param("link", "ipc-cpu0-cpu1", "latency_s")] = TRUE_LINK_LATENCY_S
    out[Param("link", "ipc-cpu0-cpu1", "bandwidth_gb_s")] = 6.19
    return out


def test_fit_under_noise_predicts_as_the_truth(runs_dir):
    """3% noise per span: the fit's median error is the noise's, and it predicts
    every fitted operation within 1.5% of the true model, although the split
    between per-kernel launch, per-call overhead and memory efficiency (which
    only the context lengths tell apart) wanders under noise."""
    result = _fit(runs_dir)
    assert 0.01 < result.median_abs_error < 0.03
    ratio = predict(result.terms, result.values) / predict(result.terms, _truth())
    assert np.max(np.abs(ratio - 1)) < 0.015


def test_fit_recovers_the_flash_bandwidth_beside_the_kept_host_rate(tmp_path):
    """Streams on cores that install their weights themselves (AR under a DRAM
    budget): the flash bandwidth comes back within 1%; the host rate, whose
    per-byte time only adds to the flash's in every span, is kept at the
    profile's measured value and said to be kept. (A dispatch gap before each
    stream would fold into the bandwidth: streams of one size cannot separate a
    per-stream time from a per-byte one.)"""
    for i, (policy, params) in enumerate((("ar", {}), ("ar_stream", {"dram_budget_gb": 0.2}))):
        make_measured_run(tmp_path / f"{policy}-{i}", policy, params, seed=i, tokens=12,
                          noise=0.0, outliers=0.0)
    result = _fit(tmp_path)
    host = Param("device", CORES, "stream_host_gb_s")
    assert host in result.unconstrained
    assert result.values[host] == load_platform("cpu-local").device("cpu0").stream_host_gb_s
    disk = result.values[Param("tier", "disk", "bandwidth_gb_s")]
    assert disk == pytest.approx(TRUE_DISK_GB_S, rel=0.01)
    assert disk != pytest.approx(3.15, rel=0.1)  # it moved from the profile's value


def test_a_streams_wait_is_its_own_term():
    """A stream's critical time is its span alone; the wait before it is measured
    from when it was free to start: the stream before it ended, and so did the
    Forward that freed its slot (with two slots, the first Forward over the chunk
    streamed two streams earlier). The first stream of a batch has no wait."""
    def stream(layer, start_s, end_s):
        return MeasuredSpan.from_line({"op": {"type": "StreamWeights", "device": "target",
                                              "layers": [layer, layer + 1]},
                                       "device": "disk", "start_s": start_s, "end_s": end_s})

    def forward(layer, start_s, end_s, device="cpu0"):
        return MeasuredSpan.from_line({"op": {"type": "Forward", "layers": [layer, layer + 1]},
                                       "device": device, "start_s": start_s, "end_s": end_s})

    spans = [stream(1, 0.0, 0.5), stream(2, 0.5003, 1.0), forward(1, 0.6, 0.7),
             forward(2, 1.0, 1.2), stream(3, 1.2002, 1.6), forward(9, 1.6, 3.0, "cpu1"),
             stream(4, 2.0, 2.5)]
    run = dataclasses.make_dataclass("Run", ["spans"])(spans)
    times = critical_times(run, {}, load_platform("cpu-local"))
    assert times[1] == pytest.approx(0.4997) and times[6] == pytest.approx(0.5)
    gaps = dispatch_gaps(spans, {"target": "cpu0"}, slots=2)
    # stream 3 waited for layer 1's Forward (0.7 s) and stream 2 (1.0 s): 0.2002 s;
    # stream 4 for stream 3 (1.6 s) and layer 2's Forward (1.2 s); cpu1's are not its
    assert {i: g for i, (g, _) in gaps.items()} == {
        1: pytest.approx(0.0003), 4: pytest.approx(0.2002), 6: pytest.approx(0.4)}
    assert gaps[4][1] == pytest.approx(0.2)  # layer 2's Forward ran 1.0-1.2 s of it
    assert gaps[1][1] == 0.0 and gaps[6][1] == 0.0
    assert dispatch_gaps(spans, {"target": "cpu0"}, slots=1)[4] == (pytest.approx(0.0002),
                                                                     0.0)


def test_untied_cores_and_fixed_fields(tmp_path):
    """Fitted apart (tie=False), each core gets its own parameters and the fit
    still predicts as the truth; a field named in ``fixed`` keeps the profile's
    value."""
    runs = _make_runs(tmp_path, noise=0.0, outliers=0.0)
    plat = load_platform("cpu-local")
    terms = [t for p in sorted(runs.glob("*/record.json"))
             for t in Terms(plat, tie=False).of_run(load_run(p))]
    result = fit(plat, terms)
    assert {p.name for p in result.values if p.kind == "device"} == {"cpu0", "cpu1"}
    assert result.median_abs_error < 1e-4
    kept = fit(plat, terms, fixed={"multirow_memory_factor"})
    for core in ("cpu0", "cpu1"):
        assert kept.values[Param("device", core, "multirow_memory_factor")] == 1.0


def test_executor_passes_and_critical_times():
    """A sampled Forward of k tokens is k passes (the first feeding n_fed rows);
    a Forward's observed time takes the host gap before it and the Verify that
    reads it; a Transfer's, minus the time its ends were computing."""
    plat, spec = load_platform("cpu-local"), load_model("smollm2-135m")
    op = {"type": "Forward", "model": "draft", "device": "draft", "layers": [0, 30],
          "n_tokens": 3, "n_fed": 4, "batch": 2, "context": 50, "head": "lm",
          "emit": "sample"}
    passes = list(pass_terms(Terms(plat).cost, spec, "cpu1", op))
    assert [p.rows for p in passes] == [8, 2, 2] and all(p.kernels == 31 for p in passes)
    assert [p.calls for p in passes] == [1, 1, 1]  # each pass is one model call
    fwd = {"type": "Forward", "model": "target", "device": "target", "layers": [0, 30],
           "n_tokens": 5, "label": "verify"}
    spans = [{"op": fwd, "device": "cpu0", "start_s": 0.001, "end_s": 0.010},
             {"op": {"type": "Verify"}, "device": "cpu0", "start_s": 0.011, "end_s": 0.012},
             {"op": {"type": "Transfer", "src": "target", "dst": "draft", "nbytes": 8},
              "device": "cpu0", "start_s": 0.013, "end_s": 0.020},
             {"op": dict(fwd, device="draft"), "device": "cpu1", "start_s": 0.005,
              "end_s": 0.018}]
    run = type("Run", (), {"spans": [MeasuredSpan.from_line(s) for s in spans]})()
    times = critical_times(run, plat.placement, plat)
    assert times[0] == pytest.approx(0.009 + 0.001 + 0.001)  # + gap + Verify
    assert times[2] == pytest.approx(0.007 + 0.001 - 0.005)  # + gap - ends busy


def test_executor_work_rewrites_forwards_and_marks_steps():
    """The replay's rewrite: a sampled 2-token Forward measured with n_fed=3 runs as
    a 3-position pass then a 1-position pass; each Verify is followed by a
    zero-length step-end marker; unmeasured Forwards run as asked."""
    measured = [MeasuredSpan.from_line({"op": {"type": "Forward", "label": "draft", "n_fed": 3},
                                        "start_s": 0.0, "end_s": 1.0})]

    def schedule():
        handle = yield Forward("draft", "draft", (0, 8), 2, 1, 10, head=LM, emit=SAMPLE,
                               label="draft")
        yield Verify(2, 1, target=handle, label="verify")
        yield Forward("draft", "draft", (0, 8), 2, 1, 13, head=LM, emit=SAMPLE,
                      label="draft")

    ops, gen, value = [], ExecutorWork(measured).wrap(schedule()), None
    while True:
        try:
            op = gen.send(value)
        except StopIteration:
            break
        ops.append(op)
        value = Verdict((1,)) if isinstance(op, Verify) else op
    shapes = [(type(o).__name__, getattr(o, "n_tokens", None), getattr(o, "context", None))
              for o in ops]
    assert shapes == [("Forward", 3, 10), ("Forward", 1, 11), ("Verify", None, None),
                      ("Delay", None, None), ("Forward", 2, 13)]
    assert ops[0].head.tokens == 1 and ops[3].label == STEP_END and ops[3].seconds == 0.0


def test_a_multi_token_pass_is_one_pass_in_calibration_and_replay():
    """A draft pass that sampled its tokens through multi-token heads (the span's
    multi_token: tokens it emitted) is one pass in both directions: calibration
    costs it as one model call projecting that many heads, and the replay runs the
    schedule's Forward as one pass over the positions measured."""
    plat, spec = load_platform("cpu-local"), load_model("smollm2-135m")
    op = {"type": "Forward", "model": "draft", "device": "draft", "layers": [0, 15],
          "n_tokens": 9, "n_fed": 8, "batch": 2, "context": 50, "head": "lm",
          "emit": "sample", "multi_token": 2}
    passes = list(pass_terms(Terms(plat).cost, spec, "cpu1", op))
    assert [(p.rows, p.calls) for p in passes] == [(16, 1)]
    stepped = list(pass_terms(Terms(plat).cost, spec, "cpu1",
                                   {k: v for k, v in op.items() if k != "multi_token"}))
    assert len(stepped) == 9  # the same Forward, one token a pass
    measured = [MeasuredSpan.from_line({"op": {"type": "Forward", "label": "draft", "n_fed": 8,
                                               "multi_token": 2},
                                        "start_s": 0.0, "end_s": 1.0})]

    def schedule():
        yield Forward("draft", "draft", (0, 15), 9, 1, 10, head=LM, emit=SAMPLE,
                      label="draft")

    ops = list(ExecutorWork(measured).wrap(schedule()))
    assert [(o.n_tokens, o.head.tokens, o.context) for o in ops] == [(8, 2, 10)]


def test_calibrate_cli_writes_valid_profile_and_meets_held_out_target(runs_dir, tmp_path,
                                                                      capsys):
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    plat = load_platform(out)
    for core in ("cpu0", "cpu1"):
        assert "calibrated: hetspec calibrate on runs ar-0" in plat.device(core).sources[
            "call_overhead_s"]
    spec = load_model("smollm2-135m")
    for rows in (1, 5, 9):  # one-row and verify passes cost as on the true platform
        fitted, true = (RooflineCost(p).forward(spec, "cpu0", (0, 30), rows, 1, 200, "lm",
                                                None).busy_s
                        for p in (plat, true_platform()))
        assert fitted == pytest.approx(true, rel=0.02)
    text = out.read_text()
    assert text.startswith("# Calibrated by 'hetspec calibrate'") and "held-out" in text
    # A repeat of one configuration is held out (every other one, in name order).
    assert summary["fitted_runs"] == ["ar-0", "sd-1", "sd-3", "sd-4"]
    assert summary["held_out_runs"] == ["ar-2"]
    s = summary["held_out"]["schedules"]["ar"]  # the target is 10%
    assert abs(s["tokens_per_s_error"]) < 0.05
    assert abs(s["median_step_latency_error"]) < 0.05


def test_calibrate_cli_fits_every_repeat_when_asked(runs_dir, tmp_path, capsys):
    """--fit-every-repeat: repeats measured to average a drifting machine are all
    fitted, none held out; with --published it is refused in one sentence."""
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--fit-every-repeat", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fitted_runs"] == ["ar-0", "ar-2", "sd-1", "sd-3", "sd-4"]
    assert summary["held_out_runs"] == []
    assert main(["calibrate", "--published", "shipped", "--profile", "cpu-local", "-o",
                 str(tmp_path / "p.yaml"), "--fit-every-repeat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fit-every-repeat applies to measured runs" in err[0]


def true_profile_yaml(path: Path) -> Path:
    """The true platform as a profile file (each changed number sourced)."""
    data = true_platform().model_dump(mode="json", exclude_unset=True)
    for obj in data["devices"] + data["memory_tiers"] + data["links"]:
        for key in (*TRUE_DEVICE, "memory_efficiency", "latency_s"):
            if key in obj:
                obj["sources"][key] = "synthetic truth of tests/test_calibrate.py"
    path.write_text(yaml.safe_dump(data))
    return path


def test_replay_json_puts_predicted_beside_measured(tmp_path, capsys):
    record = make_measured_run(tmp_path / "sd-0", "sd", {"gamma": 3}, seed=4, noise=0.0,
                               outliers=0.0, prompt_tokens=300, verify_s=50e-6)
    trace = tmp_path / "side.json"
    assert main(["replay", str(record), "--profile", str(true_profile_yaml(
        tmp_path / "true.yaml")), "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    measured = json.loads(record.read_text())["metrics"]
    assert out["measured"]["tokens_per_s"] == measured["tokens_per_s"]
    assert out["predicted"]["steps"] == measured["steps"]  # its own acceptance trace
    assert out["predicted"]["tokens"] == measured["tokens"]
    # On the true profile only the fake executor's 50 us of sampling per step is
    # missing from the simulation.
    step_s = measured["step_latency_s"]
    assert out["error"]["median_step_latency"] == pytest.approx(-50e-6 / step_s, rel=0.2)
    assert out["error"]["tokens_per_s"] == pytest.approx(50e-6 / step_s, rel=0.2)
    pids = {e["pid"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert pids == {1, 2}


def test_bad_runs_get_one_sentence(runs_dir, tmp_path, capsys):
    out = tmp_path / "calibrated.yaml"
    out.write_text("previous")
    other = tmp_path / "mixed"
    for name in ("ar-0", "sd-1"):
        make_measured_run(other / name, name[:2], {"gamma": 4} if name[:2] == "sd" else {},
                          seed=1)
    make_measured_run(other / "x-ar", "ar", {}, seed=2, target="qwen3-0.6b")
    corrupt = tmp_path / "corrupt"
    make_measured_run(corrupt / "ar-0", "ar", {}, seed=1)
    with open(corrupt / "ar-0" / "spans.jsonl", "a") as fh:
        fh.write('{"op": {"type": "Forward"}, "start_s": 1.0, "end_')
    cases = [(other, "calibrate runs of one target at a time"),
             (corrupt, "is not JSON"), (tmp_path / "nothing", "not a directory")]
    for runs, message in cases:
        rc = main(["calibrate", "--runs", str(runs), "--profile", "cpu-local", "-o",
                   str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert out.read_text() == "previous"
    assert main(["replay", str(runs_dir / "sd-1"), "--profile", "m2-ultra-8x"]) == 2
    assert "measured on platform 'cpu-local'" in capsys.readouterr().err


def test_calibrated_yaml_is_readable(runs_dir, tmp_path):
    out = tmp_path / "c.yaml"
    calibrate(runs_dir, "cpu-local", out)
    data = yaml.safe_load(out.read_text())
    for field in TRUE_DEVICE:  # every fitted device term is written with its source
        assert field in data["devices"][0] and field in data["devices"][0]["sources"]
    assert "Calibrated by hetspec calibrate" in data["description"]


def test_new_cost_terms_default_to_the_roofline():
    """The optional device terms at their defaults leave a Forward's cost exactly
    as the roofline; set, each adds what it says."""
    plat, spec = load_platform("cpu-local"), load_model("smollm2-135m")
    base = RooflineCost(plat).forward(spec, "cpu0", (0, 30), 5, 1, 40, "lm", None)
    assert base.busy_s == base.launch_s + max(base.compute_s, base.memory_s)
    device = plat.device("cpu0").model_copy(update={
        "call_overhead_s": 1e-3, "roofline_exponent": 2.0, "multirow_memory_factor": 2.0})
    other = plat.model_copy(update={"devices": (device, plat.device("cpu1"))})
    c = RooflineCost(other).forward(spec, "cpu0", (0, 30), 5, 1, 40, "lm", None)
    assert c.launch_s == pytest.approx(base.launch_s + 1e-3)
    assert c.memory_s == pytest.approx(2 * base.memory_s)
    assert c.busy_s == pytest.approx(c.launch_s + (c.compute_s ** 2 + c.memory_s ** 2) ** 0.5)
    one_row = RooflineCost(other).forward(spec, "cpu0", (0, 30), 1, 1, 40, "lm", None)
    assert one_row.memory_s == pytest.approx(RooflineCost(plat).forward(
        spec, "cpu0", (0, 30), 1, 1, 40, "lm", None).memory_s)


def _with_factor(plat, factor):
    devices = tuple(d.model_copy(update={"multirow_memory_factor": factor})
                    for d in plat.devices)
    return plat.model_copy(update={"devices": devices})


def test_a_multirow_factor_table_prices_each_width_by_its_rows():
    """A table by rows prices a listed width as one factor of that value would,
    a width between two listed ones by the linear blend, one outside them by the
    nearest; a one-row pass by none."""
    plat, spec = load_platform("cpu-local"), load_model("smollm2-135m")
    table = _with_factor(plat, {2: 1.8, 4: 1.2, 8: 2.0})

    def memory_s(p, rows):
        return RooflineCost(p).forward(spec, "cpu0", (0, 30), rows, 1, 40, "lm", None).memory_s

    for rows, factor in ((2, 1.8), (3, 1.5), (4, 1.2), (6, 1.6), (8, 2.0), (33, 2.0)):
        assert memory_s(table, rows) == memory_s(_with_factor(plat, factor), rows), rows
    assert memory_s(table, 1) == memory_s(plat, 1)
    assert table.device("cpu0").multirow_factor(3) == pytest.approx(1.5)
    assert table.device("cpu0").multirow_factor(1) == 1.0


@pytest.mark.parametrize("factor,words", [({}, "empty table"), ({1: 1.2}, "lists 1 rows"),
                                          ({4: 0.0}, "is 0 at 4 rows"),
                                          ({4: float("nan")}, "finite number"),
                                          (1e4, "is 10000 at 2 rows")])
def test_a_multirow_factor_out_of_range_is_refused(factor, words):
    device = load_platform("cpu-local").device("cpu0").model_dump(exclude_unset=True)
    device["multirow_memory_factor"] = factor
    device["sources"] = {**device["sources"], "multirow_memory_factor": "a test"}
    with pytest.raises(ValueError, match=words):
        type(load_platform("cpu-local").device("cpu0")).model_validate(device)


def test_fit_recovers_a_multirow_factor_by_rows(tmp_path):
    """Verify passes of 4 and 5 rows streamed at unlike factors (a CPU GEMM's row
    blocking), 9 rows at the widest listed one's: asked for by rows, the fit lists
    the widths its passes measure (9 is beyond the widest it lists) and recovers
    each; one factor for every width cannot fit them."""
    truth = true_platform({"multirow_memory_factor": {4: 1.1, 5: 1.7}})
    runs = _optional_runs(tmp_path, truth)
    plat = load_platform("cpu-local")
    terms = [t for r in runs for t in Terms(plat).of_run(r)]
    result = fit(plat, terms, fit_terms={"multirow_by_rows"})
    field = "multirow_memory_factor"
    assert {p.at for p in result.values if p.field == field} == {4, 5}
    assert result.values[Param("device", CORES, field, 4)] == pytest.approx(1.1, rel=0.01)
    assert result.values[Param("device", CORES, field, 5)] == pytest.approx(1.7, rel=0.01)
    assert result.median_abs_error < 1e-4
    written = apply(plat, result.values, "test fit").device("cpu0")
    assert written.multirow_memory_factor == pytest.approx({4: 1.1, 5: 1.7}, rel=0.01)
    assert "was 1" in written.sources[field]
    one = fit(plat, terms)
    assert one.median_abs_error > 1e3 * result.median_abs_error


def test_the_widths_a_factor_table_lists_are_the_narrow_ones_the_passes_measure():
    """Widths of 2-8 rows measured by at least MIN_WIDTH_PASSES passes of a device;
    one-row and wider passes never; the most measured width when none is often."""
    from analyses.calibrate.costfit import MIN_WIDTH_PASSES, Pass, Term, measured_widths

    def term(device, rows):
        return Term(0.01, "Forward", "r", device=device, tier="dram",
                    passes=[Pass(31, 1, 1e9, 1e8, rows, 1e12, 3e10)])

    often, rare = MIN_WIDTH_PASSES, MIN_WIDTH_PASSES - 1
    terms = ([term("a", 4)] * often + [term("a", 5)] * rare + [term("a", 9)] * 99
             + [term("a", 1)] * 99 + [term("b", 3)] * rare + [term("b", 2)] * 2)
    assert measured_widths(terms) == {"a": (4,), "b": (3,)}


def test_every_fitting_run_and_every_kind_in_it_weighs_the_same():
    """A run of 3 spans and one of 1: each run's spans share one run's weight,
    1 per span on average; within a run, 8 draft passes and 2 one-row passes of
    the target share it half and half. The weighted loss is the Cauchy loss
    times it."""
    from analyses.calibrate.costfit import Term, run_weights, weighted_cauchy

    terms = [Term(0.1, "Forward", run) for run in ("sd", "sd", "sd", "ar")]
    w = run_weights(terms)
    assert w.tolist() == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert w[:3].sum() == pytest.approx(w[3]) and w.mean() == pytest.approx(1.0)
    mixed = [Term(0.1, "draft", "sd")] * 8 + [Term(0.1, "target x1", "sd")] * 2
    m = run_weights(mixed + [Term(0.1, "target x1", "ar")] * 10)
    assert m[:8].sum() == pytest.approx(m[8:10].sum()) == pytest.approx(m[10:].sum() / 2)
    assert m.mean() == pytest.approx(1.0)
    z = np.array([0.0, 0.5, 2.0, 8.0])
    rho = weighted_cauchy(w)(z)
    assert rho[0] == pytest.approx(w * np.log1p(z))
    step = 1e-6  # the derivatives it reports are the loss's
    assert rho[1] == pytest.approx((weighted_cauchy(w)(z + step)[0] - rho[0]) / step, rel=1e-4)
    assert rho[2] == pytest.approx((weighted_cauchy(w)(z + step)[1] - rho[1]) / step, rel=1e-4)


def test_calibrate_cli_writes_a_multirow_factor_by_rows(runs_dir, tmp_path, capsys):
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--fit-terms", "multirow_by_rows", "--json"]) == 0
    params = json.loads(capsys.readouterr().out)["parameters"]
    assert f"device {CORES}.multirow_memory_factor[4 rows]" in params
    device = load_platform(out).device("cpu0")
    assert set(device.multirow_memory_factor) == {4, 5}  # the verify widths of RUNS
    assert device.sources["multirow_memory_factor"].startswith("calibrated")


# The optional efficiency terms: each generated with a known value on top of the
# true platform, then fitted (asked for with fit_terms) from noise-free spans.
OPTIONAL_TRUTHS = [
    # a kernel reaches half its bandwidth at 2 MB: layers of ~7 MB run at ~78%
    ("memory_half_bytes", 2e6, {}, {}),
    # half its FLOP rate at 40 MFLOP per kernel: a one-row layer (~14 MFLOP) at ~26%
    ("compute_half_flops", 4e7, {}, {}),
    # a core that draws 12 of the DRAM's 34.2 GB/s (efficiency 1: the cap stands in)
    ("memory_bandwidth_gb_s", 12.0, {}, {"dram": {"memory_efficiency": 1.0}}),
]


def _optional_runs(root: Path, truth) -> list:
    for i, (policy, params, prompt) in enumerate(RUNS):
        make_measured_run(root / f"{policy}-{i}", policy, params, seed=i, prompt_tokens=prompt,
                          noise=0.0, outliers=0.0, truth=truth)
    return [load_run(p) for p in sorted(root.glob("*/record.json"))]


@pytest.mark.parametrize("field,value,device,tiers", OPTIONAL_TRUTHS)
def test_fit_recovers_each_optional_efficiency_term(tmp_path, field, value, device, tiers):
    truth = true_platform({**device, field: value}, tiers)
    runs = _optional_runs(tmp_path, truth)
    plat = load_platform("cpu-local")
    terms = [t for r in runs for t in Terms(plat).of_run(r)]
    result = fit(plat, terms, fit_terms={field})
    assert result.values[Param("device", CORES, field)] == pytest.approx(value, rel=0.01)
    assert result.median_abs_error < 1e-4
    # not asked for: kept off (the other terms absorb what they can; per-kernel
    # bytes look much like per-kernel launches, so the gap can be small)
    without = fit(plat, terms)
    assert Param("device", CORES, field) in without.held
    assert without.values[Param("device", CORES, field)] == result.initial[
        Param("device", CORES, field)]
    if field == "memory_bandwidth_gb_s":  # without a cap, the tier's efficiency takes it
        assert without.values[Param("tier", "dram", "memory_efficiency")] == pytest.approx(
            value / 34.2, rel=0.01)
    else:
        assert without.median_abs_error > 1e3 * result.median_abs_error


def test_fit_recovers_the_flash_request_latency(tmp_path):
    """Streams of 1 MiB requests, two outstanding, 0.4 ms each: with the flash
    bandwidth known (a sequential-read measurement), the per-request latency
    comes back; the layers of SmolLM2 (~7 MB) and its head (~57 MB) are reads of
    different request counts."""
    disk = {"request_latency_s": 4e-4, "request_bytes": 2.0 ** 20, "queue_depth": 2,
            "bandwidth_gb_s": 3.15}
    truth = true_platform(tiers={"disk": disk})
    for i, (policy, params) in enumerate((("ar", {}), ("ar_stream", {"dram_budget_gb": 0.2}))):
        make_measured_run(tmp_path / f"{policy}-{i}", policy, params, seed=i, tokens=12,
                          noise=0.0, outliers=0.0, truth=truth)
    base = load_platform("cpu-local")
    tiers = tuple(t.model_copy(update={"request_bytes": 2.0 ** 20, "queue_depth": 2})
                  if t.name == "disk" else t for t in base.memory_tiers)
    plat = base.model_copy(update={"memory_tiers": tiers})
    runs = [load_run(p) for p in sorted(tmp_path.glob("*/record.json"))]
    terms = [t for r in runs for t in Terms(plat).of_run(r)]
    result = fit(plat, terms, fit_terms={"request_latency_s"})
    assert result.values[Param("tier", "disk", "request_latency_s")] == pytest.approx(
        4e-4, rel=0.01)
    assert result.values[Param("tier", "disk", "bandwidth_gb_s")] == 3.15  # kept


def test_fit_recovers_the_wait_before_each_stream(tmp_path):
    """Each stream waits 1.5 ms once free to start (the executor's round trip):
    the wait comes back from AR and ar_stream runs, beside the flash bandwidth; a
    profile without the term simulates as before (default 0)."""
    truth = true_platform(device={"stream_dispatch_s": 1.5e-3})
    for i, (policy, params) in enumerate((("ar", {}), ("ar_stream", {"dram_budget_gb": 0.2}))):
        make_measured_run(tmp_path / f"{policy}-{i}", policy, params, seed=i, tokens=12,
                          noise=0.0, outliers=0.0, truth=truth)
    result = _fit(tmp_path)
    wait = Param("device", CORES, "stream_dispatch_s")
    assert result.initial[wait] == 0.0 and wait not in result.unconstrained
    assert result.values[wait] == pytest.approx(1.5e-3, rel=1e-3)
    assert result.values[Param("tier", "disk", "bandwidth_gb_s")] == pytest.approx(
        TRUE_DISK_GB_S, rel=0.01)
    assert load_platform("cpu-local").device("cpu0").stream_dispatch_s == 0.0


def test_stream_waits_and_spans_are_fitted_on_their_totals(tmp_path):
    """Streams whose reads alternate 1x, 1x, 1.6x (as cpu-local's layers did): one
    term per run holds every stream, so the fitted bandwidth gives their total
    time, not the common read's."""
    make_measured_run(tmp_path / "ar_stream-0", "ar_stream", {"dram_budget_gb": 0.2},
                      seed=0, tokens=6, noise=0.0, outliers=0.0)
    spans = [json.loads(l) for l in (tmp_path / "ar_stream-0/spans.jsonl").open()]
    streams = [s for s in spans if s["op"]["type"] == "StreamWeights"]
    for k, s in enumerate(streams):
        s["end_s"] = s["start_s"] + (s["end_s"] - s["start_s"]) * (1.6 if k % 3 == 2 else 1.0)
    (tmp_path / "ar_stream-0/spans.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in spans))
    plat = load_platform("cpu-local")
    terms = Terms(plat).of_run(load_run(tmp_path / "ar_stream-0/record.json"))
    kinds = [t.op_kind for t in terms if t.op_kind.startswith("StreamWeights")]
    assert kinds == ["StreamWeights: every stream"]
    result = fit(plat, terms)
    total = [t for t in result.terms if t.op_kind == kinds[0]][0]
    assert predict([total], result.values)[0] == pytest.approx(
        sum(s["end_s"] - s["start_s"] for s in streams), rel=1e-6)


def test_unknown_fit_term_is_one_sentence():
    plat = load_platform("cpu-local")
    with pytest.raises(ValueError, match="not an optional term"):
        fit(plat, [], fit_terms={"launch_overhead_s"})


def test_calibrate_cli_fits_named_efficiency_terms_and_refuses_unknown_ones(tmp_path,
                                                                           capsys):
    """Runs whose spans measure a per-kernel half size (2 MB, noise-free): the CLI
    fits it when named, and refuses a name that is not an optional term."""
    runs_dir = tmp_path / "runs"
    _optional_runs(runs_dir, true_platform({"memory_half_bytes": 2e6}))
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--fit-terms", "memory_half_bytes", "--json"]) == 0
    params = json.loads(capsys.readouterr().out)["parameters"]
    assert f"device {CORES}.memory_half_bytes" in params
    assert f"device {CORES}.compute_half_flops" not in params  # not asked for: not shown
    load_platform(out)  # valid, whatever the fit found
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(tmp_path / "other.yaml"), "--fit-terms", "launch_overhead_s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetspec: error:") and "memory_half_bytes" in err


def test_the_calibration_date_is_source_date_epoch_where_set(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1795651200")
    assert calibration_date() == "2026-11-26"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "tomorrow")
    with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH is 'tomorrow'; set it to whole"):
        calibration_date()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert len(calibration_date()) == 10 and calibration_date()[4] == "-"


def test_the_calibration_bench_measures_fitting_runs_in_mirrored_passes():
    """Each fitting run is measured once per pass, every other pass in reverse
    order, with the held-out runs after the first: under a drift linear in time
    every fitting run's passes are centred on the same moment."""
    bench = load_benchmark("bench_calibration")
    fitting = [name for name, _ in bench.RUNS]
    held = [name for name, _, _ in bench.BASELINE_RUNS]
    order = [name for name, _ in bench.measuring_order(None, 2)]
    assert order == fitting + held + [f"{n}.r2" for n in reversed(fitting)]
    times = {name: i for i, name in enumerate(order)}
    centres = {(times[n] + times[f"{n}.r2"]) / 2 for n in fitting}
    assert len(centres) == 1
    chosen = bench.measuring_order({"ar-1", "sd-1", "mirror-ab"}, 3)
    assert [name for name, _ in chosen] == ["ar-1", "sd-1", "mirror-ab", "sd-1.r2",
                                            "ar-1.r2", "ar-1.r3", "sd-1.r3"]
    assert dict(chosen)["mirror-ab"][:2] == ["--repeats", str(bench.BASELINE_REPEATS)]
    assert dict(chosen)["ar-1.r2"][0] == "--no-baseline"
    # with baselines, each fitting run decodes one AR round beside its schedule
    paired = dict(bench.measuring_order({"sd-1", "mirror-ab"}, 2, baselines=True))
    assert paired["sd-1"][:2] == paired["sd-1.r2"][:2] == ["--repeats", "1"]
    assert "--no-baseline" not in paired["sd-1"]
    assert paired["mirror-ab"][:2] == ["--repeats", str(bench.BASELINE_REPEATS)]


def test_repeats_with_their_own_draft_files_are_repeats(tmp_path):
    """Two runs of one SD configuration whose executor wrote the same draft spec
    into each run's folder are repeats (every other one held out); a draft spec of
    other content is another configuration."""
    from types import SimpleNamespace

    def run(name: str, draft_text: str):
        folder = tmp_path / name / "models"
        folder.mkdir(parents=True)
        (folder / "draft.yaml").write_text(draft_text)
        inputs = {"policy": "sd", "params": {"gamma": 4}, "draft": str(folder / "draft.yaml"),
                  "placement": {}, "batch": 1}
        return SimpleNamespace(name=name, policy="sd", inputs=inputs)

    runs = [run("sd-a", "n_layers: 8\n"), run("sd-b", "n_layers: 8\n"),
            run("sd-c", "n_layers: 15\n")]
    fitting, held = split_runs(runs, ["sd"])
    assert [r.name for r in fitting] == ["sd-a", "sd-c"] and [r.name for r in held] == ["sd-b"]
    fitting, held = split_runs(runs, ["sd"], hold_repeats=False)
    assert [r.name for r in fitting] == ["sd-a", "sd-b", "sd-c"] and held == []


def _slowed(run: Path, factor: float) -> None:
    """Every span of the run ``factor`` times longer, as if the whole machine ran
    slower while it was measured (its gaps too)."""
    spans = [json.loads(line) for line in (run / "spans.jsonl").read_text().splitlines()]
    for s in spans:
        s["start_s"] *= factor
        s["end_s"] *= factor
    (run / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))


def test_a_pace_per_run_absorbs_a_run_measured_on_a_slower_machine(tmp_path):
    """One run of five measured 25% slower throughout: fitted with one pace for
    all, its spans keep errors of ~20%; with a pace per run, that run's pace is
    1.25x the others', the paces' logs average 0, every span fits, and the
    profile prices every operation as the truth does at the runs' mean pace."""
    root = _make_runs(tmp_path, noise=0.0, outliers=0.0)
    _slowed(root / "sd-3", 1.25)
    runs = [load_run(p) for p in sorted(root.glob("*/record.json"))]
    plat = load_platform("cpu-local")
    terms = [t for r in runs for t in Terms(plat).of_run(r)]
    slow = np.array([t.run == "sd-3" for t in terms])
    one = fit(plat, terms)
    assert one.paces == {} and np.median(np.abs(one.log_residuals[slow])) > 0.15
    each = fit(plat, terms, pace_per_run=True)
    assert sorted(each.paces) == ["ar-0", "ar-2", "sd-1", "sd-3", "sd-4"]
    others = [v for run, v in each.paces.items() if run != "sd-3"]
    assert each.paces["sd-3"] / np.array(others) == pytest.approx(1.25, rel=1e-3)
    assert np.prod(list(each.paces.values())) == pytest.approx(1.0, rel=1e-9)
    assert np.max(np.abs(each.log_residuals)) < 1e-3
    ratio = predict(terms, each.values) / predict(terms, _truth())
    assert ratio == pytest.approx(1.25 ** (1 / 5), rel=3e-3)


def test_calibrate_cli_prints_each_runs_pace_when_asked(runs_dir, tmp_path, capsys):
    """--pace-per-run: the summary and the profile's header give each fitting run's
    pace; with --published it is refused in one sentence."""
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--pace-per-run", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(summary["paces"]) == sorted(summary["fitted_runs"])
    assert all(abs(v - 1) < 0.05 for v in summary["paces"].values())  # 3% noise, one machine
    assert "each fitting run's pace" in out.read_text()
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(tmp_path / "one.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["paces"] == {}
    assert main(["calibrate", "--published", "shipped", "--profile", "cpu-local", "-o",
                 str(tmp_path / "p.yaml"), "--pace-per-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pace-per-run applies to measured runs" in err[0]


def test_calibrate_cli_holds_named_fields_at_the_profiles_values(runs_dir, tmp_path,
                                                                 capsys):
    """--hold keeps a field out of the fit: the written profile keeps the profile's
    value and source for it, the header marks it held, the summary leaves it out,
    and the fields not held are fitted as before."""
    out = tmp_path / "held.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--hold", "compute_efficiency,roofline_exponent", "--json"]) == 0
    params = json.loads(capsys.readouterr().out)["parameters"]
    assert f"device {CORES}.compute_efficiency" not in params
    assert f"device {CORES}.roofline_exponent" not in params
    assert params[f"device {CORES}.launch_overhead_s"]["constrained"]
    plat, shipped = load_platform(out), load_platform("cpu-local")
    for core in ("cpu0", "cpu1"):
        device, before = plat.device(core), shipped.device(core)
        assert device.compute_efficiency == before.compute_efficiency
        assert device.roofline_exponent == before.roofline_exponent
        assert "calibrated" not in device.sources.get("compute_efficiency", "")
        assert device.launch_overhead_s != before.launch_overhead_s
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert any("compute_efficiency" in line and "(held: not fitted)" in line
               for line in header)
    assert not any("launch_overhead_s" in line and "held" in line for line in header)


@pytest.mark.parametrize("argv, words", [
    (["--hold", "compute_eficiency"], ["'compute_eficiency'", "roofline_exponent"]),
    (["--hold", "latency_s,latency_s"], ["twice"]),
    (["--hold", "memory_half_bytes", "--fit-terms", "memory_half_bytes"],
     ["both held", "--fit-terms"]),
])
def test_calibrate_cli_refuses_a_hold_it_cannot_keep(runs_dir, tmp_path, capsys, argv,
                                                     words):
    out = tmp_path / "never.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetspec: error:") and all(w in err for w in words), err
    assert not out.exists()


def test_hold_is_refused_with_published_rows(tmp_path, capsys):
    assert main(["calibrate", "--published", "shipped", "--profile", "h100-sxm-8x", "-o",
                 str(tmp_path / "never.yaml"), "--hold", "alpha_s"]) == 2
    err = capsys.readouterr().err
    assert "--hold" in err and "--fit-fields" in err


def test_a_refused_fit_names_the_fields_to_hold_and_holding_them_fits(tmp_path, capsys):
    """The golden SD run alone cannot tell the DRAM's efficiency from the multi-row
    factor, nor (memory-bound) measure the compute terms: each refusal names the
    fields to hold (--hold FIELD), and holding what they name, one refusal after
    another, ends in a profile written without --accept-poor-fit."""
    import shutil
    from pathlib import Path

    runs = tmp_path / "runs"
    shutil.copytree(Path(__file__).parent / "golden" / "measured-runs", runs)
    out = tmp_path / "calibrated.yaml"
    held: list[str] = []
    for _ in range(6):
        argv = ["calibrate", "--runs", str(runs), "--profile", "cpu-local", "-o", str(out),
                "--fit-policies", "sd"] + (["--hold", ",".join(held)] if held else [])
        if main(argv) == 0:
            break
        err = capsys.readouterr().err
        assert "do not measure" in err and "--hold " in err, err
        named = err.split("(--hold ", 1)[1].split(" ", 1)[0].rstrip("),")
        assert named not in held
        held.append(named)
    assert out.exists() and held[0] in ("memory_efficiency", "multirow_memory_factor")
    header = [line for line in out.read_text().splitlines() if "(held: not fitted)" in line]
    assert all(any(f".{field}:" in line for line in header) for field in held)
