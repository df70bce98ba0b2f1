"""Several platforms and batches in one comparison: --platform a,b and --sweep
batch=..., each point on its own platform and batch, side by side in the report."""

import html
import json

import pytest

from analyses.cli import main
from analyses.compare import sidebyside
from hwprofiles import load_platform
from analyses.compare.sweep import Point, expand_grid, grid_estimate, grid_settings, \
    point_config, run_grid

BASE = dict(platform="h100-sxm-8x", target="llama-3.1-70b", draft="llama-3.2-1b",
            tokens=40, seed=0, placement={"target": "tp4"})


def test_platform_and_batch_reach_each_points_config():
    points = expand_grid(["ar", "sd"], [("platform", ["h100-sxm-8x", "a100-sxm-8x"]),
                                        ("batch", [1, 8])], {"gamma": 3})
    assert len(points) == 8
    config = point_config(Point("sd", (("platform", "a100-sxm-8x"), ("batch", 8),
                                       ("gamma", 3))), BASE)
    assert (config.platform, config.batch, config.params.gamma) == ("a100-sxm-8x", 8, 3)


def test_the_budget_counts_a_swept_batch_at_its_largest():
    def units(batches):
        sweeps = [("batch", batches)]
        return grid_estimate(grid_settings(["ar"], sweeps), BASE, sweeps)

    assert units([1, 64]).units == units([64, 64]).units > units([1, 2]).units
    assert "64 sequences" in units([1, 64]).product


@pytest.fixture(scope="module")
def results():
    points = expand_grid(["ar", "sd"], [("platform", ["h100-sxm-8x", "a100-sxm-8x"]),
                                        ("batch", [1, 8])], {"gamma": 3})
    return run_grid(points, BASE, jobs=1, quiet=True)


def test_each_platform_and_batch_runs_on_its_own(results):
    speed = {(dict(r.point.sets)["platform"], dict(r.point.sets)["batch"], r.point.policy):
             r.metrics["tokens_per_s"] for r in results}
    # the H100 reads its HBM faster than the A100: faster at every batch and policy
    for batch in (1, 8):
        for policy in ("ar", "sd"):
            assert speed[("h100-sxm-8x", batch, policy)] > speed[("a100-sxm-8x", batch, policy)]
            assert speed[("h100-sxm-8x", 8, policy)] > speed[("h100-sxm-8x", 1, policy)]


def test_side_by_side_rows_hold_speed_latency_and_fit(results):
    rows = sidebyside.rows(results, BASE)
    assert len(rows) == 8 and {r[0] for r in rows} == {"h100-sxm-8x", "a100-sxm-8x"}
    for row in rows:
        assert float(row[4]) > 0 and float(row[7]) > 0  # tokens/s, TTFT
        capacity_gb = load_platform(row[0]).memory_tiers[0].capacity_bytes / 1e9
        assert row[9].startswith("yes: ") and row[9].endswith(f"of {capacity_gb:.1f} GB")
    assert sidebyside.section(results, BASE).title == "Platforms and batches side by side"


def test_a_point_that_does_not_fit_says_so_in_the_table():
    points = expand_grid(["ar"], [("platform", ["h100-sxm-8x", "a100-sxm-8x"])])
    base = {**BASE, "draft": None, "placement": {}}  # a100-sxm-8x places the target on gpu0
    rows = sidebyside.rows(run_grid(points, base, jobs=1, quiet=True), base)
    fit = {row[0]: row[9] for row in rows}
    assert fit["h100-sxm-8x"].startswith("yes")
    assert fit["a100-sxm-8x"].startswith("no: ") and "--placement target=" in fit["a100-sxm-8x"]


def test_compare_takes_several_platforms_and_a_batch_sweep(tmp_path, capsys):
    out = tmp_path / "r.html"
    rc = main(["compare", "--platform", "h100-sxm-8x,a100-sxm-8x", "--target",
               "llama-3.1-70b", "--draft", "llama-3.2-1b", "--policies", "ar,sd",
               "--placement", "target=tp4", "--sweep", "batch=1,8", "--tokens", "40",
               "--jobs", "1", "-o", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    text = out.read_text()
    assert "Platforms and batches side by side" in text
    assert "h100-sxm-8x, a100-sxm-8x" in text  # the title and the intro name both
    assert "platform=" in summary["fastest"] and "batch=" in summary["fastest"]


def test_every_compared_platform_says_why_in_the_report_and_the_summary(tmp_path, capsys):
    """The Why of each platform, not only of the fastest one: the report has a
    'Why on PLATFORM' section per platform, holding that platform's points only,
    and the printed summary gives each platform's fastest point and its Whys."""
    import re

    platforms = ["h200-sxm-8x", "mi300x-8x"]
    out = tmp_path / "r.html"
    assert main(["compare", "--platform", ",".join(platforms), "--target", "llama-3.1-70b",
                 "--policies", "ar,sd", "--draft", "llama-3.2-1b", "--tokens", "40",
                 "--jobs", "1", "-o", str(out)]) == 0
    text = out.read_text()
    chunks = dict(re.findall(r"<h2>Why on ([^<]+)</h2>(.*?)(?=<h2>)", text, re.S))
    assert list(chunks) == platforms and "<h2>Why</h2>" not in text
    printed = capsys.readouterr().out.splitlines()
    for mine, other in (platforms, platforms[::-1]):
        notes = re.findall(r'<p class="note">(.*?)</p>', chunks[mine])
        assert notes[0].startswith(f"On {mine}: fastest sd(gamma=")
        whys = notes[1:]
        assert len(whys) == 2 and all(f"platform={mine})" in n for n in whys)
        assert f"platform={other}" not in chunks[mine]
        assert f"time per output token by cost on {mine}" in chunks[mine]
        at = printed.index(next(line for line in printed if line.startswith(f"  on {mine}: ")))
        assert printed[at + 1:at + 3] == [f"    why: {html.unescape(n)}" for n in whys]


def test_platform_given_twice_is_refused(capsys):
    assert main(["compare", "--platform", "h100-sxm-8x,a100-sxm-8x", "--sweep",
                 "platform=h100-sxm-8x", "-o", "/tmp/never.html"]) == 2
    assert "keep one" in capsys.readouterr().err
