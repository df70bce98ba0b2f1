"""Simulated tokens per wall-second of the discrete-event simulator.

Runs the foundation issue's SD command (h100-sxm-5x, Llama-3.1-70B target,
Llama-3.2-1B draft, gamma=5, alpha=0.8, 2000 tokens, seed 1) on one core and
prints the simulated tokens divided by the wall time of the simulation, both for
the SD schedule alone and for the whole ``simulate`` call (which also simulates
the AR baseline). Goal: at least 20,000.

    python benchmarks/bench_sim.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

from analyses.run.api import RunConfig, run_schedule, simulate

SD = RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
               policy="sd", params={"gamma": 5}, acceptance={"kind": "iid", "alpha": 0.8},
               tokens=2000, seed=1)


def best_rate(fn, repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tokens = fn()
        rates.append(tokens / (time.perf_counter() - t0))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="best of N runs")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    run_schedule(SD)  # warm caches of profile loading and imports
    schedule_only = best_rate(lambda: run_schedule(SD).tokens, args.repeat)
    whole = best_rate(lambda: simulate(SD).metrics["tokens"], args.repeat)
    print(f"sd schedule alone:           {schedule_only:,.0f} simulated tokens / wall-s")
    print(f"simulate (sd + AR baseline): {whole:,.0f} simulated tokens / wall-s")


if __name__ == "__main__":
    main()
