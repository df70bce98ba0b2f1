"""SharedBandwidth at any simulated time: every flow finishes, bytes are conserved,
and each flow ends when exact processor sharing says it does.

The clock's resolution is ulp(now): 2 ps at 2^14 s, 2 ns at 1e7 s. A flow used to
count as done only within one picosecond of bytes, so past ~2^14 s a round-off
residue could outlive every timer and the simulation spun at one instant forever.
"""

from __future__ import annotations

import math
import types
from fractions import Fraction

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import simcore.engine
from simcore.resources import SharedBandwidth
from tests.clicases import deadline, run_cli
from tests.hangguard import HANG_S

MAX_STEPS = 100_000  # far above the 2 events a flow needs; a livelock exceeds it


def simulate_flows(start_s: float, bandwidth_bytes_s: float, flows) -> dict[int, float]:
    """End time of each flow ``(offset_s, nbytes)`` arriving at start_s + offset_s,
    stepping the environment at most MAX_STEPS times."""
    env = simpy.Environment(initial_time=start_s)
    bw = SharedBandwidth(env, bandwidth_bytes_s)
    ends: dict[int, float] = {}

    def flow(i, offset_s, nbytes):
        yield env.timeout(offset_s)
        yield bw.transfer(nbytes)
        ends[i] = env.now

    for i, (offset_s, nbytes) in enumerate(flows):
        env.process(flow(i, offset_s, nbytes))
    for _ in range(MAX_STEPS):  # as env.run() does, events at t = inf included
        try:
            env.step()
        except simpy.core.EmptySchedule:
            return ends
    raise AssertionError(f"still stepping at t={env.now!r} after {MAX_STEPS} events")


def exact_sharing(arrivals_s: list[float], nbytes: list[float],
                  bandwidth_bytes_s: float) -> dict[int, Fraction]:
    """Processor sharing in exact rational arithmetic: flows present together each
    move bandwidth / n bytes per second; ties finish together."""
    bw = Fraction(bandwidth_bytes_s)
    order = sorted(range(len(arrivals_s)), key=lambda i: (arrivals_s[i], i))
    pending = [(Fraction(arrivals_s[i]), i) for i in order]
    active: dict[int, Fraction] = {}
    ends: dict[int, Fraction] = {}
    now = pending[0][0]
    while pending or active:
        finish = (now + min(active.values()) * len(active) / bw) if active else None
        arrival = pending[0][0] if pending else None
        step_to = finish if arrival is None or (finish is not None and finish < arrival) \
            else arrival
        moved = (step_to - now) * bw / len(active) if active else 0
        active = {i: rem - moved for i, rem in active.items()}
        now = step_to
        if step_to == finish:
            for i in [i for i, rem in active.items() if rem == 0]:
                ends[i] = now
                del active[i]
        else:
            _, i = pending.pop(0)
            active[i] = Fraction(nbytes[i])
    return ends


def busy_periods(arrivals_s, ends_s):
    """Maximal intervals during which at least one flow was crossing, each with the
    indices of its flows."""
    periods = []
    for i in sorted(range(len(arrivals_s)), key=lambda i: arrivals_s[i]):
        if periods and arrivals_s[i] <= periods[-1][1]:
            periods[-1][1] = max(periods[-1][1], ends_s[i])
            periods[-1][2].append(i)
        else:
            periods.append([arrivals_s[i], ends_s[i], [i]])
    return periods


late_starts = st.one_of(st.floats(0.0, 1e7),
                        st.sampled_from([2.0**14, 1.7e4, 2e4, 32768.129, 5e4, 1e6, 1e7]))
# layer-sized flows at a few GB/s, as in weight streaming, and odd sizes besides
flow_lists = st.lists(
    st.tuples(st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
              st.one_of(st.floats(1.0, 4e9), st.floats(1e7, 6e8))),
    min_size=1, max_size=8)
bandwidths = st.one_of(st.floats(1e9, 4e9), st.floats(1e3, 1e12))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(start_s=late_starts, bandwidth_bytes_s=bandwidths, flows=flow_lists)
def test_shared_bandwidth_finishes_conserves_bytes_and_times_ends(start_s,
                                                                  bandwidth_bytes_s,
                                                                  flows):
    ends = simulate_flows(start_s, bandwidth_bytes_s, flows)
    assert sorted(ends) == list(range(len(flows)))
    arrivals = [start_s + offset_s for offset_s, _ in flows]
    nbytes = [n for _, n in flows]
    # the clock resolves ulp(now); each of the 2n events may round once
    resolution_s = 8 * len(flows) * math.ulp(max(ends.values()))
    exact = exact_sharing(arrivals, nbytes, bandwidth_bytes_s)
    for i in range(len(flows)):
        took_s, exact_s = ends[i] - arrivals[i], float(exact[i] - Fraction(arrivals[i]))
        assert abs(took_s - exact_s) <= 1e-9 * exact_s + resolution_s, (i, took_s, exact_s)
    for first_s, last_s, members in busy_periods(arrivals, ends):
        moved_bytes = (last_s - first_s) * bandwidth_bytes_s
        given_bytes = sum(nbytes[i] for i in members)
        assert abs(moved_bytes - given_bytes) <= (1e-9 * given_bytes
                                                  + resolution_s * bandwidth_bytes_s)


# each of these spun forever at one instant before the fix
STALLED_CASES = [
    (168623.0, 1e9, [(0.0, 1.0)]),  # one byte: 1 ns of transfer under a 29 ps clock
    (32768.129, 2e9, [(0.04, 1.3e8), (0.077, 2.6e8), (0.228, 2.6e8)]),  # the review's instant
    (32768.129, 2e9, [(0.177, 1.3e8), (0.27, 1.3e8), (0.007, 4.1e8)]),
]


@pytest.mark.parametrize("start_s, bandwidth_bytes_s, flows", STALLED_CASES)
def test_cases_that_stalled_finish_at_the_exact_sharing_times(start_s, bandwidth_bytes_s,
                                                              flows):
    ends = simulate_flows(start_s, bandwidth_bytes_s, flows)
    arrivals = [start_s + offset_s for offset_s, _ in flows]
    exact = exact_sharing(arrivals, [n for _, n in flows], bandwidth_bytes_s)
    for i, end_s in ends.items():
        assert end_s == pytest.approx(float(exact[i]), abs=4 * math.ulp(end_s))


@pytest.mark.parametrize("bandwidth_bytes_s", [1e-291, 5e-315, 1e-3, 1e6])
@pytest.mark.parametrize("start_s", [0.0, 1e7, 1e300])
def test_absurdly_slow_bandwidths_end_in_bounded_wall_time(start_s, bandwidth_bytes_s):
    # the review's fuzz hangs came from tiers of 1e-300 GB/s (profiles now refuse
    # them): simulated time may run to 1e300 s or overflow to inf, yet every flow
    # ends after a bounded number of events
    flows = [(0.0, 1.4e7), (0.5, 1.4e7), (0.5, 3e6), (2.0, 1.0)]
    ends = simulate_flows(start_s, bandwidth_bytes_s, flows)
    assert sorted(ends) == [0, 1, 2, 3]
    assert all(end_s >= start_s for end_s in ends.values())


class _LateEnvironment(simpy.Environment):
    """The engine's environment with the clock already past 2^15 s."""

    def __init__(self):
        super().__init__(initial_time=LATE_START_S)


LATE_START_S = 32768.129


def _kangaroo_late(monkeypatch, tokens: int):
    from analyses.run.api import baseline_config, run_schedule
    from analyses.run.config import SimConfig

    config = SimConfig(platform="snapdragon-8-gen3", target="llama-2-13b", policy="kangaroo",
                       params={"dram_budget_gb": 5}, tokens=tokens)
    runs = {}
    for cfg in (config, baseline_config(config)):
        runs[cfg.policy, 0.0] = run_schedule(cfg, record_spans=False)
        with monkeypatch.context() as m:
            m.setattr(simcore.engine, "simpy",
                      types.SimpleNamespace(Environment=_LateEnvironment,
                                            AllOf=simpy.AllOf))
            with deadline(HANG_S):
                runs[cfg.policy, LATE_START_S] = run_schedule(cfg, record_spans=False)
    return runs


def test_weight_streaming_schedules_finish_late_in_simulated_time(monkeypatch):
    # kangaroo and its ar_stream baseline stream layers from flash through one
    # shared bandwidth; started at the instant the review's run stalled at, they
    # finish and take the same simulated time as when started at zero
    runs = _kangaroo_late(monkeypatch, tokens=60)
    for (policy, start_s), late in runs.items():
        if start_s == 0.0:
            continue
        early = runs[policy, 0.0]
        assert late.tokens == early.tokens
        assert late.time_s - LATE_START_S == pytest.approx(early.time_s, rel=1e-9)


@pytest.mark.slow
def test_review_kangaroo_repro_finishes():
    # the review's repro: its AR baseline passes 2^14 s of simulated time (~30 s wall);
    # at a fixed context, since 8,000 tokens grow past llama-2-13b's 4,096 positions
    result = run_cli("simulate", "--platform", "snapdragon-8-gen3", "--target",
                     "llama-2-13b", "--policy", "kangaroo", "--set", "dram_budget_gb=5",
                     "--tokens", "8000", "--fixed-context")
    assert result.rc == 0, result.err
    assert "kangaroo on snapdragon-8-gen3" in result.out
