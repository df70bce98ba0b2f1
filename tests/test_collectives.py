"""One collective model for the shipped GPU profiles' datasheet versions: NCCL's
latency model (a base, a latency per ring hop, the bytes at the bus bandwidth
nccl-tests reports), its three numbers measured by nccl-tests or rccl-tests."""

from __future__ import annotations

import pytest

from hwprofiles import load_platform
from hwprofiles.schema import CollectiveGroup, allreduce_s
from simcore.costmodel import allreduce_terms

DATASHEET = ("h200-sxm-8x", "h100-sxm-8x-datasheet", "b200-8x", "mi300x-8x",
             "a100-sxm-8x-datasheet", "a100-sxm-40gb-datasheet")


def test_the_ring_is_a_base_a_latency_per_hop_and_the_bytes_at_the_bus_bandwidth():
    seconds = allreduce_s("ring", 1e-6, 200e9, 8, 16384, base_s=4e-6)
    assert seconds == pytest.approx(4e-6 + 14 * 1e-6 + 1.75 * 16384 / 200e9, rel=1e-12)
    assert allreduce_s("ring", 1e-6, 200e9, 1, 16384, base_s=4e-6) == 0.0  # no peers


def test_a_base_on_another_algorithm_is_refused():
    with pytest.raises(ValueError, match="only the ring algorithm reads"):
        CollectiveGroup(name="g", members=("a", "b"), algorithm="alpha_beta", alpha_s=1e-6,
                        bandwidth_gb_s=100, base_s=1e-6,
                        sources={"alpha_s": "x", "bandwidth_gb_s": "x", "base_s": "x"})


@pytest.mark.parametrize("name", DATASHEET)
def test_every_datasheet_gpu_profile_prices_its_collectives_by_one_measured_model(name):
    platform = load_platform(name)
    assert platform.groups
    for group in platform.groups:
        assert group.algorithm == "ring" and group.base_s > 0
        for field in ("base_s", "alpha_s", "bandwidth_gb_s"):
            assert group.sources[field].startswith("measured"), (name, group.name, field)


@pytest.mark.parametrize("name, measured_us", [
    ("h200-sxm-8x", 18.30),  # nccl-tests, 8 GPUs, 16 KiB
    ("h100-sxm-8x-datasheet", 18.98),
    ("mi300x-8x", 15.47),  # rccl-tests, 8 GPUs, 16 KiB
])
def test_a_decode_sized_all_reduce_is_priced_near_its_measurement(name, measured_us):
    """16 KiB on eight GPUs (Llama-3.1-70B's hidden state at batch 1, in fp16): the
    two-point fit (through 512 bytes) puts it 10-17% under the measured time on every
    profile: under, and by a like margin."""
    group = load_platform(name).group("tp8")
    assert 0.80 <= group.allreduce_s(16384) / (measured_us * 1e-6) <= 0.92


def test_calibration_terms_keep_the_base_fixed_and_sum_to_the_closed_form():
    platform = load_platform("h200-sxm-8x")
    group = platform.group("tp8")
    terms = allreduce_terms(group, 65536, count=3)
    assert terms.fixed_s == pytest.approx(3 * group.base_s, rel=1e-12)
    assert terms.seconds(platform) == pytest.approx(3 * group.allreduce_s(65536), rel=1e-12)
    shared = allreduce_terms(group, 65536, count=3, bandwidth_factor=0.3)
    assert shared.fixed_s == terms.fixed_s
    assert shared.seconds(platform) == pytest.approx(3 * group.allreduce_s(65536, 0.3),
                                                     rel=1e-12)
    assert shared.seconds(platform) > terms.seconds(platform)


@pytest.mark.parametrize("source, expected", [
    ("calibrated: hetspec calibrate --published shipped ...; was 1.0 (uncalibrated)", "fitted"),
    ("uncalibrated default: ideal roofline", "default"),
    ("measured: python benchmarks/measure_cpu.py ...", "measured"),
    ("estimate: the Mirror-SD paper's measured 4-GPU H100 all-reduce", "estimate"),
    ("carried from the h100-sxm-5x fit (same H100 SXM GPU): calibrated: ...", "fitted"),
    ("NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s", "datasheet"),
    ("NCCL latency model (src/graph/tuning.cc): ...", "model"),
    (None, "default"),
    ("as group tp8", "other"),
])
def test_a_sources_kind_is_read_from_its_words(source, expected):
    from hwprofiles.provenance import kind

    assert kind(source) == expected


def test_platforms_priced_from_like_sources_draw_no_warning_and_unlike_ones_do():
    from hwprofiles.provenance import unlike

    h200, mi300x, h100 = (load_platform(n) for n in ("h200-sxm-8x", "mi300x-8x", "h100-sxm-8x"))
    assert unlike([h200, mi300x]) == []  # datasheet memory and compute, measured collectives
    said = unlike([h100, mi300x])  # the H100 node's memory is fitted to published runs
    assert said and said[0].startswith("memory numbers come from different kinds of source "
                                       "(h100-sxm-8x: datasheet, fitted; mi300x-8x: datasheet, "
                                       "default)")
    assert unlike([h100]) == []


def test_compare_over_platforms_says_where_their_numbers_come_from(tmp_path):
    """hetspec compare over a calibrated H100 node and a datasheet MI300X says, in its
    summary, JSON and report, which aspects the two take from different kinds of
    source; the report leads with the platforms side by side."""
    import json
    import re

    from tests.clicases import run_cli

    args = ["compare", "--platform", "h100-sxm-8x,mi300x-8x", "--target", "llama-3.1-70b",
            "--draft", "llama-3.2-1b", "--policies", "ar,sd", "--sweep", "gamma=4",
            "--tokens", "40", "--jobs", "1"]
    out = run_cli(*args, "-o", tmp_path / "r.html")
    assert out.rc == 0, out.err
    notes = [line for line in out.out.splitlines() if line.startswith("  note: memory")]
    assert notes and "h100-sxm-8x: datasheet, fitted; mi300x-8x: datasheet, default" in notes[0]
    summary = json.loads(run_cli(*args, "-o", tmp_path / "j.html", "--json").out)
    assert [s.split(" numbers")[0] for s in summary["sources"]][:1] == ["memory"]
    html = (tmp_path / "r.html").read_text()
    headings = re.findall(r"<h2[^>]*>([^<]+)</h2>", html)
    assert headings[0] == "Platforms and batches side by side"
    assert "where each platform's numbers come from" in html
    alike = run_cli("compare", "--platform", "h200-sxm-8x,mi300x-8x", "--target",
                    "llama-3.1-70b", "--policies", "ar", "--tokens", "40", "--jobs", "1",
                    "-o", tmp_path / "a.html")
    assert alike.rc == 0 and "note: " not in alike.out
