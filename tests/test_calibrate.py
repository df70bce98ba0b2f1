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

from analyses.calibrate import Param, Terms, fit
from analyses.cli import main
from analyses.heldout import calibrate
from analyses.replay import load_run
from hwprofiles import load_model, load_platform
from policies import PolicyContext, acceptance, build
from policies.ops import Forward, Transfer, Verdict, Verify
from simcore import RooflineCost
from simcore.records import write_record
from simcore.trace import Span, chrome_trace

# cpu0 (target) runs 1-token AR passes, memory-bound, and gamma+1-token verify passes,
# compute-bound; cpu1 (draft) runs only 1-token passes, so its compute efficiency is
# not constrained by any span and must be reported as such.
TRUE = {("cpu0", "compute_efficiency"): 0.2, ("cpu1", "compute_efficiency"): 0.3,
        ("cpu0", "launch_overhead_s"): 2e-4, ("cpu1", "launch_overhead_s"): 1e-4}
TRUE_MEMORY_EFFICIENCY = 0.6
TRUE_LINK_LATENCY_S = 80e-6


def true_platform():
    p = load_platform("cpu-local")
    devices = tuple(d.model_copy(update={
        "compute_efficiency": TRUE[(d.name, "compute_efficiency")],
        "launch_overhead_s": TRUE[(d.name, "launch_overhead_s")]}) for d in p.devices)
    tiers = tuple(t.model_copy(update={"memory_efficiency": TRUE_MEMORY_EFFICIENCY})
                  for t in p.memory_tiers)
    links = tuple(l.model_copy(update={"latency_s": TRUE_LINK_LATENCY_S}) for l in p.links)
    return p.model_copy(update={"devices": devices, "memory_tiers": tiers, "links": links})


def _op_fields(op) -> dict:
    out = {"type": type(op).__name__}
    for f in dataclasses.fields(op):
        v = getattr(op, f.name)
        if isinstance(v, (int, float, str, type(None))) or isinstance(v, tuple):
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def make_measured_run(out: Path, policy: str, params: dict, *, seed: int, tokens: int = 60,
                      alpha: float = 0.7, noise: float = 0.03, transfers: bool = False,
                      target: str = "smollm2-135m", prompt_tokens: int = 40,
                      outliers: float = 0.02) -> Path:
    """Run a schedule against the true platform's costs and write a measured run."""
    plat, rng = true_platform(), np.random.default_rng(seed)
    cost, models = RooflineCost(plat), {"target": load_model(target),
                                        "draft": load_model("smollm2-135m")}
    ctx = PolicyContext(models["target"], models["draft"], tokens=tokens,
                        prompt_tokens=prompt_tokens)
    schedule, acc = build(policy, ctx, params), acceptance.IID(alpha=alpha)
    now, value, spans, lines = 0.0, None, [], []
    while True:
        try:
            op = schedule.send(value)
        except StopIteration:
            break
        if isinstance(op, Verify):  # sampling: 50 us the cost model has no term for
            value = Verdict(acc.sample(op.gamma, op.batch, rng))
            lines.append({"accepted": list(value.accepted), "gamma": op.gamma})
            spans.append({"op": _op_fields(op), "device": "", "start_s": now,
                          "end_s": now + 50e-6, "name": op.label, "kind": "compute"})
            now += 50e-6
            continue
        if isinstance(op, Transfer):  # a message along the route between placements
            src, dst = (plat.members(plat.placement[r])[0] for r in (op.src, op.dst))
            steps = [(op, "link:" + link.name, RooflineCost.hop_s(link, op.nbytes))
                     for link in plat.route(src, dst)]
        else:
            where = plat.placement[op.device]
            c = cost.forward(models[op.model], where, op.layers, op.n_tokens, op.batch,
                             op.context, op.head, op.collectives)
            steps = [(op, where, c.total_s)]
        if transfers and op.label == "draft":
            hop = plat.links[0]
            steps.append((Transfer("draft", "target", 4.0, label="token"), "link:" + hop.name,
                          RooflineCost.hop_s(hop, 4.0)))
        for o, track, seconds in steps:
            seconds *= float(np.exp(rng.normal(0, noise)))
            if rng.random() < outliers:
                seconds *= 3.0  # an outlier: the core was preempted
            spans.append({"op": _op_fields(o), "device": track, "start_s": now,
                          "end_s": now + seconds, "name": o.label,
                          "kind": "transfer" if isinstance(o, Transfer) else "compute"})
            now += seconds
        value = op
    return _write(out, policy, params, target, (tokens, prompt_tokens), seed, now, spans,
                  lines)


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


RUNS = [("ar", {}, 40), ("sd", {"gamma": 4}, 1500), ("ar", {}, 1500),
        ("sd", {"gamma": 3}, 600), ("sd", {"gamma": 6}, 40)]


def _make_runs(root: Path, noise: float, outliers: float) -> Path:
    # Prompts of different lengths: without them every draft pass has one shape and
    # its launch overhead and roofline term could trade off freely.
    for i, (policy, params, prompt) in enumerate(RUNS):
        make_measured_run(root / f"{policy}-{i}", policy, params, seed=i,
                          prompt_tokens=prompt, noise=noise, outliers=outliers)
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
    """Spans without noise but with 2% outliers (3x): every constrained parameter
    comes back, the robust loss ignoring the outliers."""
    result = _fit(_make_runs(tmp_path, noise=0.0, outliers=0.02))
    assert result.success
    # cpu1 runs only memory-bound 1-token draft passes: its compute efficiency is free.
    assert result.unconstrained == [Param("device", "cpu1", "compute_efficiency")]
    assert result.values[result.unconstrained[0]] == 1.0  # the profile's value, kept
    for (device, name), value in TRUE.items():
        if (device, name) != ("cpu1", "compute_efficiency"):
            assert result.values[Param("device", device, name)] == pytest.approx(
                value, rel=0.01)
    assert result.values[Param("tier", "dram", "memory_efficiency")] == pytest.approx(
        TRUE_MEMORY_EFFICIENCY, rel=0.01)
    assert result.median_abs_error < 0.002  # the outliers do not drag the fit


def test_fit_under_noise_pins_the_roofline_terms(runs_dir):
    """3% noise per span: the roofline efficiencies stay within 5%, and the fit's
    median error is the noise's (the launch overhead, a small constant share of each
    pass, is only loosely determined then and is not checked)."""
    result = _fit(runs_dir)
    assert result.values[Param("device", "cpu0", "compute_efficiency")] == pytest.approx(
        TRUE[("cpu0", "compute_efficiency")], rel=0.05)
    assert result.values[Param("tier", "dram", "memory_efficiency")] == pytest.approx(
        TRUE_MEMORY_EFFICIENCY, rel=0.05)
    assert 0.01 < result.median_abs_error < 0.03


def test_fit_recovers_link_latency(tmp_path):
    run = load_run(make_measured_run(tmp_path / "sd", "sd", {"gamma": 4}, seed=9,
                                     transfers=True, noise=0.0))
    plat = load_platform("cpu-local")
    result = fit(plat, Terms(plat).of_run(run))
    assert result.values[Param("link", "ipc-cpu0-cpu1", "latency_s")] == pytest.approx(
        TRUE_LINK_LATENCY_S, rel=0.02)
    assert Param("link", "ipc-cpu0-cpu1", "bandwidth_gb_s") in result.unconstrained or \
        result.values[Param("link", "ipc-cpu0-cpu1", "bandwidth_gb_s")] > 0


def test_calibrate_cli_writes_valid_profile_and_meets_held_out_target(runs_dir, tmp_path,
                                                                      capsys):
    out = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--runs", str(runs_dir), "--profile", "cpu-local", "-o",
                 str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    plat = load_platform(out)
    assert plat.name == "cpu-local" and plat.device("cpu0").compute_efficiency == \
        pytest.approx(0.2, rel=0.03)
    assert plat.device("cpu1").compute_efficiency == 1.0  # not constrained: kept
    assert "calibrated: hetspec calibrate on runs ar-0" in plat.device("cpu0").sources[
        "compute_efficiency"]
    text = out.read_text()
    assert text.startswith("# Calibrated by 'hetspec calibrate'") and "held-out" in text
    # Every other run of a fitting policy is held out, in name order.
    assert summary["fitted_runs"] == ["ar-0", "sd-1", "sd-4"]
    assert summary["held_out_runs"] == ["ar-2", "sd-3"]
    for policy in ("ar", "sd"):  # the target is 10%
        s = summary["held_out"]["schedules"][policy]
        assert abs(s["tokens_per_s_error"]) < 0.05
        assert abs(s["median_step_latency_error"]) < 0.05


def true_profile_yaml(path: Path) -> Path:
    """The true platform as a profile file (each changed number sourced)."""
    data = true_platform().model_dump(mode="json", exclude_unset=True)
    for obj in data["devices"] + data["memory_tiers"] + data["links"]:
        for key in ("compute_efficiency", "launch_overhead_s", "memory_efficiency",
                    "latency_s"):
            if key in obj:
                obj["sources"][key] = "synthetic truth of tests/test_calibrate.py"
    path.write_text(yaml.safe_dump(data))
    return path


def test_replay_json_puts_predicted_beside_measured(tmp_path, capsys):
    record = make_measured_run(tmp_path / "sd-0", "sd", {"gamma": 3}, seed=4, noise=0.0,
                               outliers=0.0, prompt_tokens=300)
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
    cases = [(other, "calibrate one target/draft pair at a time"),
             (corrupt, "is not a JSON object"), (tmp_path / "nothing", "not a directory")]
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
    assert data["devices"][0]["compute_efficiency"] == pytest.approx(0.2, rel=0.05)
    assert "Calibrated by hetspec calibrate" in data["description"]
