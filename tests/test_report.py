"""The compare report: built from a small grid, opened in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analyses import report
from analyses.cli import main
from analyses.sweep import expand_grid, parse_sweep, run_grid

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "test-artifacts"
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser")
                if shutil.which(b)), None)
BASE = dict(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b", tokens=150,
            acceptance={"kind": "iid", "alpha": 0.8})

# Injected first into <head>: keep every console error and uncaught exception.
CAPTURE = """<script>window.__errors=[];(function(){var e=console.error;
console.error=function(){window.__errors.push(Array.from(arguments).join(' '));
e.apply(console,arguments)};window.addEventListener('error',function(ev){
window.__errors.push('uncaught: '+ev.message)});window.addEventListener(
'unhandledrejection',function(ev){window.__errors.push('rejection: '+ev.reason)})})();
</script>"""
# Appended to <body>: after load, describe what each figure rendered.
CHECK = """<script>window.addEventListener('load',function(){setTimeout(function(){
var out=[];document.querySelectorAll('.plotly-graph-div').forEach(function(d){
var svg=d.querySelectorAll('svg.main-svg'),marks=d.querySelectorAll(
'.trace path, .trace .point, .bars .point, canvas').length;
var r=d.getBoundingClientRect();out.push({id:d.id,svg:svg.length,marks:marks,
height:r.height,width:r.width})});var pre=document.createElement('pre');
pre.id='render-check';pre.textContent=JSON.stringify({figures:out,
errors:window.__errors});document.body.appendChild(pre)},500)})</script>"""


def _grid(policies="ar,sd", sweep="gamma=2..3"):
    points = expand_grid(policies.split(","), [parse_sweep(sweep)])
    return run_grid(points, BASE, jobs=1, quiet=True)


def test_report_holds_every_section_and_inlines_plotly(tmp_path):
    results = _grid()
    sections = report.build_sections(results, BASE, ["gamma"])
    titles = [s.title for s in sections]
    assert titles == ["Speed per policy", "Sweep", "Latency laws on this platform",
                      "Per-device timelines", "Acceptance"]
    text = report.render_html("t", report.scenario_intro(results, BASE), sections)
    path = report.write_report(tmp_path / "r.html", text)
    body = path.read_text()
    assert "<script src=" not in body  # nothing to fetch: opens offline
    assert body.count("Plotly.newPlot(") == sum(len(s.figures) for s in sections)
    assert "sd(gamma=" in body and "knee" in body


def test_policy_that_does_not_apply_is_skipped_with_a_note():
    base = {**BASE, "draft": None}
    points = expand_grid(["ar", "sd"], [parse_sweep("gamma=2..3")])
    results = run_grid(points, base, jobs=1, quiet=True)
    assert report.skipped_policies(results) == {
        "sd": "policy 'sd' needs a draft model; pass --draft NAME"}
    notes = report.build_sections(results, base, ["gamma"])[0].notes
    assert notes and notes[0].startswith("sd: skipped")
    assert report.fastest(results).point.policy == "ar"


def test_compare_cli_writes_report_and_summary(tmp_path, capsys):
    out = tmp_path / "report.html"
    rc = main(["compare", "--policies", "ar,sd", "--sweep", "gamma=2..4", "--tokens", "200",
               "--jobs", "2", "-o", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["report"] == str(out) and out.stat().st_size > 1_000_000
    assert summary["fastest"].startswith("sd(gamma=") and summary["speedup_vs_ar"] > 1
    assert summary["points"] == 4


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "gamma=6..2"], "empty range"),
    (["--policies", "ar,nosuch"], "unknown policy 'nosuch'"),
    (["--target", "no-such-model"], "unknown model 'no-such-model'"),
])
def test_compare_bad_input_is_one_sentence_and_keeps_old_report(tmp_path, capsys, argv,
                                                                 message):
    out = tmp_path / "report.html"
    out.write_text("previous report")
    assert main(["compare", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert out.read_text() == "previous report"


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--virtual-time-budget=15000", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(BROWSER is None, reason="chromium is not installed "
                    "(apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    from tests.test_calibrate import make_measured_run

    make_measured_run(tmp_path / "runs" / "sd-0", "sd", {"gamma": 3}, seed=1, tokens=20)
    out = tmp_path / "report.html"
    assert main(["compare", "--policies", "ar,sd", "--sweep", "gamma=2..4", "--tokens",
                 "200", "--jobs", "1", "--runs", str(tmp_path / "runs"), "-o",
                 str(out)]) == 0
    text = out.read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("<head>", "<head>" + CAPTURE, 1)
                     .replace("</body>", CHECK + "</body>", 1))
    dom = _chromium("--enable-logging=stderr", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="render-check">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"the render check never ran: {dom.stderr[-2000:]}"
    check = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    uncaught = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln and "Uncaught" in ln]
    assert check["errors"] == [] and uncaught == []
    expected = text.count("Plotly.newPlot(")
    assert len(check["figures"]) == expected >= 11  # the measured views included
    for fig in check["figures"]:
        assert fig["svg"] >= 1 and fig["marks"] > 0 and fig["height"] > 100, fig
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    _chromium("--window-size=1280,7000", f"--screenshot={shot}", out.as_uri())
    assert shot.is_file() and shot.stat().st_size > 50_000


def test_report_with_measured_runs_adds_scatter_and_timelines(tmp_path):
    from tests.test_calibrate import make_measured_run

    runs = tmp_path / "runs"
    make_measured_run(runs / "ar-0", "ar", {}, seed=0, tokens=20)
    make_measured_run(runs / "sd-0", "sd", {"gamma": 3}, seed=1, tokens=20)
    out = tmp_path / "r.html"
    assert main(["compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                 "--draft", "smollm2-135m", "--policies", "ar,sd", "--sweep", "gamma=2..3",
                 "--tokens", "40", "--jobs", "1", "--runs", str(runs), "-o", str(out)]) == 0
    body = out.read_text()
    assert "Simulation vs measured runs" in body
    assert "sim vs real: ar-0 (ar)" in body and "sim vs real: sd-0 (sd)" in body
