"""Calibration against published measurements: synthetic rows of known answer,
the shipped data file, and the refusals of `hetspec calibrate --published`."""

import math

import pytest
import yaml

from analyses.cli import main
from analyses.calibrate.session import profile_text
from analyses.calibrate.draftstep import simulate_row_full
from analyses.calibrate.publishedcal import calibrate_published
from analyses.calibrate.published import (Knob, Measurement, fit_rows, fit_unknowns, knobs_of,
                                load_published, ranking_flips, scaled, shipped_file,
                                simulate_row)
from hwprofiles import load_platform

TRUTH = {"memory_efficiency": 0.72, "launch_overhead_s": 30e-6, "alpha_s": 1.6}
START = {"memory_efficiency": 1.0, "launch_overhead_s": 5e-6, "alpha_s": 0.5}  # perturbed
SHAPES = [("llama-2-7b", "gpu0"), ("llama-2-7b", "tp2"), ("llama-2-7b", "tp4"),
          ("llama-2-7b", "all8"), ("llama-2-70b", "tp2"), ("llama-2-70b", "tp4"),
          ("llama-2-70b", "all8"), ("vicuna-13b", "gpu0")]


def _platform_with(values):
    """a100-sxm-8x with its memory efficiency and launch overhead set to ``values``
    and every group's all-reduce latency scaled by values["alpha_s"]."""
    base = load_platform("a100-sxm-8x")
    knobs = knobs_of(base)
    x = []
    for k in knobs:
        start = getattr(next(o for o in (base.memory_tiers + base.devices + base.groups)
                             if o.name == k.names[0]), k.field)
        x.append(math.log(values[k.field] / start) if k.field != "alpha_s"
                 else math.log(values["alpha_s"]))
    return scaled(base, knobs, x), knobs


def _true_platform():
    return _platform_with(TRUTH)


def _rows(platform, split_every=2):
    from analyses.calibrate.published import Measurement

    rows = []
    for i, (target, where) in enumerate(SHAPES):
        row = Measurement(id=f"syn-{i}", platform="a100-sxm-8x", hardware="synthetic",
                          target=target, placement={"target": where}, prompt_tokens=5,
                          tokens=64, tokens_per_s=1.0, ranking="syn",
                          split="held_out" if i % split_every else "fit",
                          source="simulated from the known profile")
        rows.append(row.model_copy(update={"tokens_per_s": simulate_row(row, platform)}))
    return rows


def _write_rows(path, rows):
    path.write_text(yaml.safe_dump({"measurements": [r.model_dump(mode="json")
                                                     for r in rows]}, sort_keys=False))
    return path


def _value(platform, kind, name, field):
    objs = {"tier": platform.memory_tiers, "device": platform.devices,
            "group": platform.groups}[kind]
    return getattr(next(o for o in objs if o.name == name), field)


def test_fit_recovers_known_values_and_held_out_error_vanishes(tmp_path):
    truth, knobs = _true_platform()
    rows_file = _write_rows(tmp_path / "rows.yaml", _rows(truth))
    start = tmp_path / "start.yaml"
    start.write_text(profile_text(_platform_with(START)[0], ""))
    out = tmp_path / "fitted.yaml"
    summary = calibrate_published(rows_file, str(start), out)
    fitted = load_platform(str(out))
    for kind, name, field in [("tier", "hbm0", "memory_efficiency"),
                              ("tier", "hbm5", "memory_efficiency"),
                              ("device", "gpu3", "launch_overhead_s"),
                              ("group", "tp2", "alpha_s"), ("group", "all8", "alpha_s")]:
        want = _value(truth, kind, name, field)
        assert _value(fitted, kind, name, field) == pytest.approx(want, rel=0.01), field
    for row in summary["rows"]:
        assert abs(row["error_after"]) < 1e-3, row
        assert abs(row["error_before"]) > 0.05  # the start really was off
    assert summary["ranking_flips"] == []
    assert summary["median_abs_error_held_out"] < 1e-3
    text = out.read_text()
    assert "syn-0, syn-2, syn-4, syn-6" in text  # provenance names the fitted rows
    assert "syn-1 (held_out)" in text


def test_knobs_tie_identical_hardware():
    knobs = knobs_of(load_platform("a100-sxm-8x"))
    assert Knob("tier", tuple(f"hbm{i}" for i in range(8)), "memory_efficiency") in knobs
    assert len([k for k in knobs if k.field == "launch_overhead_s"]) == 1
    assert [k.names for k in knobs if k.field == "alpha_s"] == [("all8", "tp4", "tp2")]


def test_ranking_flip_detected_only_with_a_held_out_row():
    from analyses.calibrate.published import Measurement

    def row(i, tps, split):
        return Measurement(id=f"r{i}", platform="p", hardware="h", target="t",
                           tokens_per_s=tps, split=split, ranking="k", source="s")

    rows = [row(0, 10.0, "fit"), row(1, 20.0, "fit"), row(2, 30.0, "held_out")]
    assert ranking_flips(rows, {"r0": 25.0, "r1": 20.0, "r2": 40.0}) == []  # fit pair only
    assert ranking_flips(rows, {"r0": 10.0, "r1": 35.0, "r2": 30.0}) == [("r1", "r2")]


def test_shipped_rows_load_and_simulate():
    rows = load_published(shipped_file())  # validates: every key has a fitted row
    assert len(rows) >= 9
    speculative = [r for r in rows if r.policy != "ar"]
    assert {r.policy for r in speculative} == {"sd", "ssd"}
    assert all(r.unknowns for r in speculative)
    assert any(r.split == "held_out" for r in speculative)
    for platform in {r.platform for r in rows}:
        plat = load_platform(platform)
        mine = [r for r in rows if r.platform == platform]
        values = fit_unknowns(plat, mine)
        assert {u.key for r in mine for u in r.unknowns} == set(values)
        for r in mine:
            assert r.source and simulate_row(r, plat, values) > 0


def _spec_row(i, gamma, split, tps=1.0, acceptance=None):
    return Measurement(id=f"sd-{i}", platform="h100-sxm-5x", hardware="synthetic",
                       target="qwen3-32b", draft="qwen3-0.6b", policy="sd",
                       params={"gamma": gamma}, placement={"target": "target_tp",
                                                           "draft": "gpu0"},
                       acceptance=acceptance or {"fit": "pair"}, prompt_tokens=16,
                       tokens=128, tokens_per_s=tps, split=split, ranking="syn",
                       source="simulated from a known alpha")


def _known(rows, platform, alpha):
    return [r.model_copy(update={"tokens_per_s": simulate_row(r, platform, {"pair": alpha})})
            for r in rows]


def test_fitted_acceptance_recovered_from_rows_of_known_alpha():
    """SD rows simulated with alpha 0.62: fitting their shared key on the gamma 2
    and 6 rows recovers 0.62, and the held-out gamma 3 and 5 rows land on their
    published speeds."""
    platform = load_platform("h100-sxm-5x")
    rows = _known([_spec_row(i, g, s) for i, (g, s) in enumerate(
        [(2, "fit"), (3, "held_out"), (5, "held_out"), (6, "fit")])], platform, 0.62)
    values = fit_unknowns(platform, rows)
    assert values["pair"] == pytest.approx(0.62, abs=0.005)
    for r in rows:
        assert simulate_row(r, platform, values) / r.tokens_per_s - 1 == pytest.approx(
            0, abs=0.01), r.id


def test_fitted_acceptance_and_profile_knob_recovered_jointly():
    """AR rows fix the memory efficiency, SD rows the acceptance: fitted together
    from a start 25% off, both come back."""
    base = load_platform("h100-sxm-5x")
    truth = base.model_copy(update={"memory_tiers": tuple(
        t.model_copy(update={"memory_efficiency": 0.7}) for t in base.memory_tiers)})
    ar = Measurement(id="ar", platform="h100-sxm-5x", hardware="synthetic",
                     target="qwen3-32b", prompt_tokens=16, tokens=128, tokens_per_s=1.0,
                     split="fit", source="synthetic")
    rows = _known([ar, _spec_row(1, 3, "fit"), _spec_row(2, 6, "fit")], truth, 0.55)
    start = base.model_copy(update={"memory_tiers": tuple(
        t.model_copy(update={"memory_efficiency": 0.875}) for t in base.memory_tiers)})
    result = fit_rows(start, rows, fields=("memory_efficiency",))
    assert result.platform.tier("hbm0").memory_efficiency == pytest.approx(0.7, rel=0.01)
    assert result.values["pair"] == pytest.approx(0.55, abs=0.01)
    assert [u.label for u in result.unknowns] == ["alpha pair"]


def test_ranking_groups_may_be_several():
    def row(i, tps, split, ranking):
        return Measurement(id=f"r{i}", platform="p", hardware="h", target="t",
                           tokens_per_s=tps, split=split, ranking=ranking, source="s")

    rows = [row(0, 10.0, "fit", ["a", "b"]), row(1, 20.0, "held_out", "a"),
            row(2, 5.0, "held_out", "c")]
    assert ranking_flips(rows, {"r0": 30.0, "r1": 20.0, "r2": 40.0}) == [("r0", "r1")]


@pytest.mark.parametrize("text, words", [
    ("measurements: []", "measurements"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: -1, "
     "split: fit, source: s}", "tokens_per_s"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: maybe, source: s}", "split"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s, policy: sd}", "needs the acceptance"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s}\n  - {id: a, platform: p, hardware: h, target: t, "
     "tokens_per_s: 2, split: fit, source: s}", "appears twice"),
    ("measurements: [", "not valid YAML"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s}\n  - {id: b, platform: p, hardware: h, target: t, "
     "draft: d, policy: sd, acceptance: {fit: k}, tokens_per_s: 2, split: held_out, "
     "source: s}", "no fitted row fixes it"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s, policy: sd, acceptance: {fit: k, alpha: 0.5}}",
     "takes no other field"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s, policy: sd, acceptance: {fit: k}, params: {gamma: {fit: g}}}",
     "params.gamma cannot be fitted"),
    ("measurements:\n  - {id: a, platform: p, hardware: h, target: t, tokens_per_s: 1, "
     "split: fit, source: s, policy: ssd, acceptance: {fit: k}, params: {r: {fit: k}}}",
     "names both alpha and r"),
])
def test_bad_files_refused_in_one_sentence(tmp_path, capsys, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    rc = main(["calibrate", "--published", str(bad), "--profile", "a100-sxm-8x",
               "-o", str(tmp_path / "out.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1
    assert not (tmp_path / "out.yaml").exists()


def test_cli_refusals(tmp_path, capsys):
    out = str(tmp_path / "out.yaml")
    assert main(["calibrate", "--profile", "a100-sxm-8x", "-o", out]) == 2
    assert "exactly one of --runs" in capsys.readouterr().err
    assert main(["calibrate", "--published", "shipped", "--profile", "cpu-local",
                 "-o", out]) == 2
    assert "no row for platform cpu-local" in capsys.readouterr().err
    assert main(["calibrate", "--published", "shipped", "--profile", "a100-sxm-8x",
                 "--fit-fields", "colour", "-o", out]) == 2
    assert "'colour'" in capsys.readouterr().err
    rows = tmp_path / "rows.yaml"
    rows.write_text(shipped_file().read_text())
    assert main(["calibrate", "--published", str(rows), "--profile", "a100-sxm-8x",
                 "-o", str(rows)]) == 2  # the output is the file it reads
    assert "which this command reads" in capsys.readouterr().err
    assert not (tmp_path / "out.yaml").exists()


def test_cli_shipped_fit_prints_table_and_is_byte_identical(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert main(["calibrate", "--published", "shipped", "--profile", "h100-sxm-5x",
                 "-o", str(a)]) == 0
    printed = capsys.readouterr().out
    assert "ssd-h100-qwen32b-ar-tp4" in printed and "held_out" in printed
    assert main(["calibrate", "--published", "shipped", "--profile", "h100-sxm-5x",
                 "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert "calibrated: hetspec calibrate --published shipped on rows " \
           "ssd-h100-llama70b-ar-tp4" in a.read_text()


def _memory_efficiency(platform, value):
    """``platform`` with every memory tier read at ``value`` of its bandwidth."""
    return platform.model_copy(update={"memory_tiers": tuple(
        t.model_copy(update={"memory_efficiency": value}) for t in platform.memory_tiers)})


def _fit_from(tmp_path, truth, start, fields):
    """Fit ``fields`` of ``start`` on rows simulated with ``truth``: (summary, fitted)."""
    rows_file = _write_rows(tmp_path / "rows.yaml", _rows(truth))
    (tmp_path / "start.yaml").write_text(profile_text(start, ""))
    out = tmp_path / "fitted.yaml"
    summary = calibrate_published(rows_file, str(tmp_path / "start.yaml"), out,
                                  fields=fields)
    return summary, load_platform(str(out))


def test_fit_recovers_a_size_dependent_bandwidth_term_that_starts_off(tmp_path):
    """memory_half_bytes (the costmodel's size-dependent bandwidth) is 0 in the start
    profile: the fit starts it at OFF_STARTS and finds the true 20 MB per kernel."""
    base = load_platform("a100-sxm-8x")
    fields = ("memory_efficiency", "memory_half_bytes")
    truth = _memory_efficiency(base, 0.8).model_copy(update={
        "devices": tuple(d.model_copy(update={"memory_half_bytes": 20e6, "sources": {
            **d.sources, "memory_half_bytes": "synthetic truth"}}) for d in base.devices)})
    summary, fitted = _fit_from(tmp_path, truth, _memory_efficiency(base, 1.0), fields)
    assert fitted.device("gpu5").memory_half_bytes == pytest.approx(20e6, rel=0.01)
    assert fitted.tier("hbm2").memory_efficiency == pytest.approx(0.8, rel=0.01)
    assert summary["median_abs_error_held_out"] < 1e-3
    assert "was 0" in fitted.device("gpu0").sources["memory_half_bytes"]


def test_field_at_name_is_a_knob_on_that_object_alone():
    platform = load_platform("h100-sxm-5x")
    knobs = knobs_of(platform, ("launch_overhead_s", "launch_overhead_s@gpu4",
                                "compute_efficiency@gpu4=0.05"))
    assert knobs == [Knob("device", ("gpu0", "gpu1", "gpu2", "gpu3"), "launch_overhead_s"),
                     Knob("device", ("gpu4",), "launch_overhead_s"),
                     Knob("device", ("gpu4",), "compute_efficiency", 0.05)]
    assert scaled(platform, knobs[2:], [0.0]).device("gpu4").compute_efficiency == 0.05


@pytest.mark.parametrize("spec,words", [
    ("call_overhead_s@gpu9", "names no device of h100-sxm-5x"),
    ("compute_efficiency=0.5", "gives a start without an object"),
    ("compute_efficiency@gpu4=2", "not a number inside"),
    ("compute_efficiency@gpu4=abc", "not a number inside")])
def test_field_at_name_refusals(tmp_path, capsys, spec, words):
    assert main(["calibrate", "--published", "shipped", "--profile", "h100-sxm-5x",
                 "--fit-fields", spec, "-o", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_fit_recovers_one_devices_own_call_overhead(tmp_path):
    """gpu0 alone pays a 2 ms per-call overhead (its neighbours none): fitting
    call_overhead_s@gpu0 with the memory efficiency recovers both."""
    base = load_platform("a100-sxm-8x")
    truth = _memory_efficiency(base, 0.8).model_copy(update={
        "devices": tuple(d.model_copy(update={"call_overhead_s": 2e-3}) if d.name == "gpu0"
                         else d for d in base.devices)})
    summary, fitted = _fit_from(tmp_path, truth, _memory_efficiency(base, 1.0),
                                ("memory_efficiency", "call_overhead_s@gpu0"))
    assert fitted.device("gpu0").call_overhead_s == pytest.approx(2e-3, rel=0.01)
    assert fitted.device("gpu1").call_overhead_s == 0.0
    assert fitted.tier("hbm2").memory_efficiency == pytest.approx(0.8, rel=0.01)
    assert summary["median_abs_error_held_out"] < 1e-3


def _ssd_rows(platform, batches):
    rows = []
    for i, batch in enumerate(batches):
        row = Measurement(id=f"ssd-{batch}", platform="h100-sxm-5x", hardware="synthetic",
                          target="llama-3.1-70b", draft="llama-3.2-1b", policy="ssd",
                          params={"k": 6, "fanout": 3, "shape": "uniform", "r": 2.0},
                          acceptance={"kind": "iid", "alpha": 0.85}, batch=batch,
                          placement={"target": "target_tp", "draft": "gpu4"},
                          prompt_tokens=16, tokens=48, tokens_per_s=1.0, draft_step_s=1.0,
                          split="held_out" if i % 2 else "fit",
                          source="simulated from the known profile")
        tps, step = simulate_row_full(row, platform)
        rows.append(row.model_copy(update={"tokens_per_s": tps, "draft_step_s": step}))
    return rows


def test_fit_recovers_a_draft_call_overhead_from_draft_steps(tmp_path):
    """gpu4's true per-call overhead is 0.4 ms; the rows give tokens/s and the draft
    step of the same runs: fitting both recovers it and matches the held-out steps."""
    base = load_platform("h100-sxm-5x")
    truth = base.model_copy(update={"devices": tuple(
        d.model_copy(update={"call_overhead_s": 4e-4}) if d.name == "gpu4" else d
        for d in base.devices)})
    rows = _ssd_rows(truth, (1, 2, 8))
    assert all(r.draft_step_s > 0 for r in rows)
    rows_file = _write_rows(tmp_path / "rows.yaml", rows)
    out = tmp_path / "fitted.yaml"
    summary = calibrate_published(rows_file, "h100-sxm-5x", out,
                                  fields=("call_overhead_s@gpu4",), steps=True)
    gpu4 = load_platform(str(out)).device("gpu4")
    assert gpu4.call_overhead_s == pytest.approx(4e-4, rel=0.01)
    for t in summary["rows"]:
        assert abs(t["draft_step_error_after"]) < 1e-3 and abs(t["error_after"]) < 1e-3, t
    assert "(tokens/s and draft steps)" in gpu4.sources["call_overhead_s"]


def test_draft_step_needs_a_draft():
    with pytest.raises(ValueError, match="draft_step_s without a draft"):
        Measurement(id="x", platform="p", hardware="h", target="t", tokens_per_s=1.0,
                    draft_step_s=0.02, split="fit", source="s")
