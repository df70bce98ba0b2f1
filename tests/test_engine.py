"""Exact timelines of the engine: each operation ends when its formula says."""

import math

import pytest

from hwprofiles import ModelSpec, Platform, list_names, load_model, load_platform
from hwprofiles.schema import MemoryTier
from simcore.acceptance import IID
from policies.ops import AllReduce, Delay, Forward, Parallel, StreamWeights, Transfer
from simcore import Outcomes, RooflineCost, Simulator
from simcore.costmodel import Values, pass_seconds
from simcore.resources import SharedBandwidth

SRC = "test fixture"


def _sourced(**fields):
    numeric = [k for k, v in fields.items()
               if isinstance(v, (int, float, dict)) and not isinstance(v, bool)]
    return {**fields, "sources": {k: SRC for k in numeric}}


def platform(contended_dram=True, ring=False):
    dram = _sourced(name="dram", kind="dram", capacity_bytes=64e9, bandwidth_gb_s=100.0)
    flash = _sourced(name="flash", kind="flash", capacity_bytes=1e12, bandwidth_gb_s=2.0,
                     latency_s=1e-4)
    hbm = _sourced(name="hbm", kind="hbm", capacity_bytes=80e9, bandwidth_gb_s=1000.0)
    devs = [_sourced(name=n, kind="gpu", peak_flops={"fp16": 100e12}, memory=m,
                     launch_overhead_s=1e-6, storage="flash")
            for n, m in (("a", "dram"), ("b", "dram" if contended_dram else "hbm"),
                         ("c", "hbm"), ("d", "hbm"))]
    links = [_sourced(name="ab", endpoints=("a", "b"), latency_s=5e-6, bandwidth_gb_s=50.0),
             _sourced(name="bc", endpoints=("b", "c"), latency_s=2e-6, bandwidth_gb_s=10.0)]
    group = _sourced(name="g4", members=("a", "b", "c", "d"),
                     algorithm="ring" if ring else "alpha_beta",
                     alpha_s=3e-6, bandwidth_gb_s=100.0)
    return Platform.model_validate(dict(
        name="fixture", memory_tiers=[dram, flash, hbm], devices=devs, links=links,
        groups=[group], placement={"target": "a", "draft": "b"}))


MODEL = ModelSpec.model_validate(_sourced(
    name="tiny", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=4, vocab=32000,
    dtype="fp16"))


def seq(*ops):
    """A schedule that yields the given operations in order."""
    for op in ops:
        yield op


def run(ops_fn, *, contention=False, plat=None):
    sim = Simulator(plat or platform(), {"target": MODEL}, Outcomes(IID(alpha=0.5)),
                    contention=contention)
    res = sim.run(ops_fn())
    return res


def test_transfer_ends_at_latency_plus_bytes_over_bandwidth():
    nbytes = 3e6

    def sched():
        yield Transfer("a", "b", nbytes)

    res = run(sched)
    assert res.time_s == pytest.approx(5e-6 + nbytes / 50e9, rel=1e-12)
    (span,) = res.spans
    assert span.device == "link:ab" and span.nbytes == nbytes


def test_multi_hop_transfer_is_store_and_forward_along_the_route():
    def sched():
        yield Transfer("a", "c", 1e6)

    res = run(sched)
    assert res.time_s == pytest.approx((5e-6 + 1e6 / 50e9) + (2e-6 + 1e6 / 10e9), rel=1e-12)
    assert [s.device for s in res.spans] == ["link:ab", "link:bc"]


def test_two_readers_sharing_one_dram_each_get_half():
    shared = platform(contended_dram=True)
    layers = (0, 4)
    solo = run(lambda: seq(Forward("target", "a", layers)), contention=True,
               plat=shared).time_s

    def both():
        yield Parallel((seq(Forward("target", "a", layers)),
                        seq(Forward("target", "b", layers))))

    res = run(both, contention=True, plat=shared)
    launch = 4e-6
    assert res.time_s == pytest.approx(launch + 2 * (solo - launch), rel=1e-9)
    # without contention each reader sees the full bandwidth: they overlap fully
    assert run(both, contention=False, plat=shared).time_s == pytest.approx(solo, rel=1e-12)


def test_fair_share_with_staggered_flows_is_exact():
    import simpy

    env = simpy.Environment()
    bw = SharedBandwidth(env, 100.0)
    ends = {}

    def flow(name, start, nbytes):
        yield env.timeout(start)
        yield bw.transfer(nbytes)
        ends[name] = env.now

    env.process(flow("x", 0.0, 100.0))
    env.process(flow("y", 0.5, 100.0))
    env.run()
    # x alone for 0.5 s (50 bytes), then both at 50 B/s: x done at 1.5, y alone after
    assert ends["x"] == pytest.approx(1.5)
    assert ends["y"] == pytest.approx(2.0)


def test_forward_is_roofline_launch_plus_max_of_compute_and_memory():
    def sched():
        yield Forward("target", "a", (0, 4), n_tokens=1, context=100)

    res = run(sched)
    flops = 4 * MODEL.layer_flops(1, 100)
    nbytes = 4 * (MODEL.layer_bytes + MODEL.kv_bytes_per_token_layer() * 101)
    expected = 4e-6 + max(flops / 100e12, nbytes / 100e9)
    assert res.time_s == pytest.approx(expected, rel=1e-12)
    assert res.spans[0].flops == pytest.approx(flops)


def test_ring_allreduce_costs_its_formula():
    m = 8e6

    def sched():
        yield AllReduce("g4", m, count=3)

    res = run(sched, plat=platform(ring=True))
    g = 4
    assert res.time_s == pytest.approx(
        3 * (2 * (g - 1) * 3e-6 + 2 * (g - 1) / g * m / 100e9), rel=1e-12)


def test_alpha_beta_allreduce_and_group_forward_pay_two_per_layer():
    def sched():
        yield Forward("target", "g4", (0, 4), n_tokens=2)

    res = run(sched)
    per = 3e-6 * math.log2(4) + 2 * 1024 * 2 / 100e9
    compute, coll = res.spans
    assert coll.kind == "collective"
    assert coll.end_s - coll.start_s == pytest.approx(8 * per, rel=1e-12)


def test_one_device_runs_operations_in_order():
    def sched():
        yield Parallel((seq(Delay(1.0, "a")), seq(Delay(2.0, "a")),
                        seq(Delay(0.5, "b"))))

    res = run(sched)
    assert res.time_s == pytest.approx(3.0)
    starts = sorted((s.start_s, s.device) for s in res.spans)
    assert starts == [(0.0, "a"), (0.0, "b"), (1.0, "a")]


def test_flash_streams_share_the_flash_bandwidth():
    def sched():
        yield Parallel((seq(StreamWeights("a", "target", (0, 1), 2e9)),
                        seq(StreamWeights("c", "target", (1, 2), 2e9))))

    res = run(sched)
    assert res.time_s == pytest.approx(1e-4 + 4e9 / 2e9, rel=1e-9)


def _host_streaming(rate_gb_s=4.0):
    """The fixture with device a installing streamed weights on its own engine."""
    p = platform()
    a = p.device("a").model_copy(update={
        "stream_host_gb_s": rate_gb_s,
        "sources": {**p.device("a").sources, "stream_host_gb_s": SRC}})
    return p.model_copy(update={"devices": (a,) + p.devices[1:]})


def test_dma_stream_overlaps_the_devices_compute():
    nbytes = 2e9

    def sched():
        yield Parallel((seq(StreamWeights("a", "target", (0, 1), nbytes)),
                        seq(Delay(0.5, "a"))))

    res = run(sched)
    stream = next(s for s in res.spans if s.kind == "stream")
    assert stream.start_s == 0.0
    assert stream.end_s == pytest.approx(1e-4 + nbytes / 2e9, rel=1e-12)
    assert res.time_s == pytest.approx(1e-4 + nbytes / 2e9, rel=1e-12)


def test_host_stream_reads_beside_compute_then_installs_on_the_device():
    nbytes = 2e9

    def sched():
        yield Parallel((seq(StreamWeights("a", "target", (0, 1), nbytes)),
                        seq(Delay(0.5, "a")), seq(Delay(0.25, "b"))))

    res = run(sched, plat=_host_streaming(4.0))
    read_end = 1e-4 + nbytes / 2e9  # the read overlaps a's compute
    stream_end = read_end + nbytes / 4e9  # then the install holds a's engine
    by_kind = {(s.kind, s.device): s for s in res.spans}
    stream = by_kind[("stream", "flash")]
    assert (stream.start_s, stream.end_s) == (0.0, pytest.approx(stream_end, rel=1e-12))
    assert by_kind[("delay", "a")].start_s == 0.0
    assert by_kind[("delay", "b")].start_s == 0.0
    assert res.time_s == pytest.approx(stream_end, rel=1e-12)


def test_host_stream_install_waits_for_compute_queued_before_it():
    nbytes = 1e9

    def sched():
        yield Parallel((seq(Delay(0.8, "a")),
                        seq(StreamWeights("a", "target", (0, 1), nbytes)),
                        seq(Delay(0.1, "a"))))

    res = run(sched, plat=_host_streaming(2.0))
    stream = next(s for s in res.spans if s.kind == "stream")
    assert stream.start_s == 0.0  # the read (0.5001 s) runs under the first delay
    install_start = 0.8 + 0.1  # both delays were queued on a before the install asked
    assert stream.end_s == pytest.approx(install_start + nbytes / 2e9, rel=1e-12)



def _with(p, device=None, tier=None, **fields):
    """The fixture with fields set on one device or tier (each with a source)."""
    if device:
        d = p.device(device)
        d = d.model_copy(update={**fields, "sources": {**d.sources, **{k: SRC for k in fields}}})
        return p.model_copy(update={"devices": tuple(d if x.name == device else x
                                                     for x in p.devices)})
    t = p.tier(tier)
    t = t.model_copy(update={**fields, "sources": {**t.sources, **{k: SRC for k in fields}}})
    return p.model_copy(update={"memory_tiers": tuple(t if x.name == tier else x
                                                      for x in p.memory_tiers)})


def test_forward_pays_call_overhead_size_efficiency_and_bandwidth_cap():
    """call_overhead_s once per Forward; memory time (bytes + kernels * half) over
    min(tier, cap) * efficiency; compute time (flops + kernels * half) over peak."""
    p = _with(platform(), device="a", call_overhead_s=3e-5, memory_half_bytes=1e6,
              compute_half_flops=5e9, memory_bandwidth_gb_s=40.0)

    def sched():
        yield Forward("target", "a", (0, 4), n_tokens=1, context=100)

    res = run(sched, plat=p)
    flops = 4 * MODEL.layer_flops(1, 100)
    nbytes = 4 * (MODEL.layer_bytes + MODEL.kv_bytes_per_token_layer() * 101)
    expected = 4e-6 + 3e-5 + max((flops + 4 * 5e9) / 100e12, (nbytes + 4 * 1e6) / 40e9)
    assert res.time_s == pytest.approx(expected, rel=1e-12)


def test_flash_read_pays_its_requests_over_the_queue_depth():
    p = _with(platform(), tier="flash", request_latency_s=2e-4, request_bytes=2.0 ** 20,
              queue_depth=4, memory_efficiency=0.5)
    nbytes = 10.5 * 2 ** 20  # 11 requests

    def sched():
        yield StreamWeights("a", "target", (0, 1), nbytes)

    res = run(sched, plat=p)
    assert res.time_s == pytest.approx(1e-4 + 11 * 2e-4 / 4 + nbytes / 1e9, rel=1e-12)


def test_a_streams_dispatch_takes_its_device_after_compute_queued_before_it():
    """stream_dispatch_s holds the device's compute stream (issuing the read takes
    the core), after the compute queued before it; the read then overlaps the
    device's later compute, and the span starts when the read does, as a
    measured stream's span."""
    p = _with(platform(), device="a", stream_dispatch_s=3e-3)
    nbytes = 1e9

    def sched():
        yield Parallel((seq(Delay(0.002, "a")),
                        seq(StreamWeights("a", "target", (0, 1), nbytes)),
                        seq(Delay(0.5, "a"))))

    res = run(sched, plat=p)
    stream = next(s for s in res.spans if s.kind == "stream")
    assert stream.start_s == pytest.approx(0.002 + 3e-3, rel=1e-12)
    assert stream.end_s == pytest.approx(0.005 + 1e-4 + nbytes / 2e9, rel=1e-12)
    delays = sorted(s.start_s for s in res.spans if s.kind == "delay")
    assert delays == [0.0, pytest.approx(0.005, rel=1e-12)]  # the dispatch, then it


def test_request_latency_without_a_request_size_is_refused():
    flash = _sourced(name="flash", kind="flash", capacity_bytes=1e12, bandwidth_gb_s=2.0,
                     request_latency_s=2e-4)
    with pytest.raises(ValueError, match="request_bytes"):
        MemoryTier.model_validate(flash)


def test_capped_flows_are_water_filled():
    """A flow capped at 20 B/s of 100 takes its cap; the uncapped one takes the
    other 80; once the capped flow ends the other has all 100."""
    import simpy

    env = simpy.Environment()
    bw = SharedBandwidth(env, 100.0)
    ends = {}

    def flow(name, nbytes, cap):
        yield bw.transfer(nbytes, cap)
        ends[name] = env.now

    env.process(flow("capped", 20.0, 20.0))
    env.process(flow("free", 180.0, None))
    env.run()
    assert ends["capped"] == pytest.approx(1.0, rel=1e-12)
    assert ends["free"] == pytest.approx(1.0 + 100.0 / 100.0, rel=1e-12)


def test_capped_engines_on_one_dram_slow_each_other_only_past_the_tier():
    """Two engines capped at 40 GB/s on a 100 GB/s DRAM both run at their caps;
    capped at 80 GB/s they share the 100 fairly (50 each)."""
    layers = (0, 4)

    def both():
        yield Parallel((seq(Forward("target", "a", layers)),
                        seq(Forward("target", "b", layers))))

    for cap_gb_s, share_gb_s in ((40.0, 40.0), (80.0, 50.0)):
        p = _with(_with(platform(), device="a", memory_bandwidth_gb_s=cap_gb_s),
                  device="b", memory_bandwidth_gb_s=cap_gb_s)
        solo = run(lambda: seq(Forward("target", "a", layers)), contention=True, plat=p)
        launch = 4e-6
        assert solo.time_s - launch == pytest.approx(
            4 * (MODEL.layer_bytes + MODEL.kv_bytes_per_token_layer()) / (cap_gb_s * 1e9),
            rel=1e-12)
        res = run(both, contention=True, plat=p)
        assert res.time_s - launch == pytest.approx(
            (solo.time_s - launch) * cap_gb_s / share_gb_s, rel=1e-9)


@pytest.mark.parametrize("name", list_names("platforms"))
def test_simulator_forward_is_pass_seconds_bit_for_bit(name):
    """The simulator's cached Forward cost and the cost model's one formula (which
    calibration evaluates on arrays) agree exactly, optional terms on or off."""
    plat = load_platform(name)
    spec = load_model("llama-3.2-1b").model_copy(update={"dtype": "fp16"})
    on = {"call_overhead_s": 2e-5, "memory_half_bytes": 3e5, "compute_half_flops": 7e7,
          "memory_bandwidth_gb_s": 0.3 * plat.tier(plat.devices[0].memory).bandwidth_gb_s,
          "multirow_memory_factor": 1.2, "launch_overhead_s": 4e-6}
    for update in ({}, on):
        p = plat.model_copy(update={"devices": tuple(d.model_copy(update=update)
                                                     for d in plat.devices)})
        cost = RooflineCost(p)
        for where in (d.name for d in p.devices):
            for rows, head, head_tokens in ((1, "lm", None), (5, None, None),
                                            (3, "exit_layer", None), (5, "lm", 1)):
                c = cost.forward(spec, where, (0, 4), rows, 2, 77, head, None, head_tokens)
                t = cost.terms(spec, where, (0, 4), rows, 2, head, None, head_tokens)
                device = p.device(where)
                v = Values.of(device, p.tier(t.tier), t.rows)
                assert (c.launch_s, c.compute_s, c.memory_s) == pass_seconds(
                    t.kernels, 1, t.flops(77), t.nbytes(77), t.rows > 1, t.peak_flops,
                    t.tier_bytes_s, v, t.head_bytes, device.multirow_factor(t.head_rows))


@pytest.mark.parametrize("name", list_names("platforms"))
def test_linear_terms_are_the_simulators_hop_stream_and_allreduce(name):
    """The coefficient forms calibration fits (hop, stream, all-reduce) evaluate to
    the simulator's own seconds for them."""
    from simcore.costmodel import allreduce_terms, hop_terms, stream_terms

    p = load_platform(name)
    for link in p.links:
        for nbytes in (8.0, 3e6):
            assert hop_terms(link, nbytes).seconds(p) == pytest.approx(
                RooflineCost.hop_s(link, nbytes), rel=1e-12)
    for group in p.groups:
        assert allreduce_terms(group, 2e5, 3).seconds(p) == pytest.approx(
            RooflineCost(p).allreduce_s(group.name, 2e5, 3), rel=1e-12)
    for d in p.devices:
        if d.storage is not None:
            tier = p.tier(d.storage)
            assert stream_terms(tier, d, 1.4e7).seconds(p) == pytest.approx(
                tier.latency_s + RooflineCost.requests_s(tier, 1.4e7)  # a read alone
                + 1.4e7 / (tier.bandwidth_bytes_s * tier.memory_efficiency
                           * tier.read_fraction(1.4e7))
                + (1.4e7 / (tier.host_copy_gb_s * 1e9) if tier.host_copy_gb_s else 0.0)
                + RooflineCost.stream_host_s(d, 1.4e7),
                rel=1e-12)
