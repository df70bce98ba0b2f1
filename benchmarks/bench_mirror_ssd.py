"""Simulated tokens per wall-second for the Mirror-SD and SSD commands of their issue.

    hetspec simulate --platform m2-ultra-8x --target qwen3-32b --draft qwen3-0.6b
        --policy mirror --set gamma=7 --set kappa=8 --set exit_layer=32 --set alpha=0.8
        --set omega=0.9 --set eta=2 --tokens 2000 --seed 1 --json
    hetspec simulate --platform h100-sxm-5x --target llama-3.1-70b --draft llama-3.2-1b
        --policy ssd --set k=7 --set fanout=3 --set alpha=0.8 --set hit_rate=0.88
        --set backup=jit --tokens 2000 --seed 1 --json

For each it prints the simulated tokens divided by the wall time of the
schedule alone and of the whole ``simulate`` call (which also simulates the AR
baseline and derives the timeline metrics), best of --repeat runs on one core.
Goal: at least 10,000. A Forward's per-layer all-reduces are charged as one
aggregated span after its compute (the engine's rule), so a 32-layer target
prefix is two timeouts, not 64 collectives.

--batch B also times the Mirror command at batch B with each fallback
(``batch_fallback=stall``, and ``skip`` whose Outcomes and Verifies answer per
row).

    python benchmarks/bench_mirror_ssd.py [--repeat 5] [--contention] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import time

from analyses.api import SimConfig, run_schedule, simulate

MIRROR = SimConfig(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b",
                   policy="mirror", params={"gamma": 7, "kappa": 8, "exit_layer": 32,
                                            "omega": 0.9, "eta": 2},
                   acceptance={"kind": "iid", "alpha": 0.8}, tokens=2000, seed=1)
SSD = SimConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                policy="ssd", params={"k": 7, "fanout": 3, "hit_rate": 0.88,
                                      "backup": "jit"},
                acceptance={"kind": "iid", "alpha": 0.8}, tokens=2000, seed=1)


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
    parser.add_argument("--contention", action="store_true",
                        help="also time the Mirror command with contention=on")
    parser.add_argument("--batch", type=int, default=None,
                        help="also time the Mirror command at this batch, per fallback")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    configs = [("mirror (m2-ultra-8x)", MIRROR), ("ssd (h100-sxm-5x)", SSD)]
    if args.contention:
        configs.append(("mirror contention=on", MIRROR.model_copy(update={"contention": True})))
    for mode in ("stall", "skip") if args.batch else ():
        params = {**MIRROR.params, "batch_fallback": mode}
        configs.append((f"mirror B={args.batch} {mode}",
                        MIRROR.model_copy(update={"batch": args.batch, "params": params})))
    for name, cfg in configs:
        run_schedule(cfg)  # warm profile loading and imports
        alone = best_rate(lambda: run_schedule(cfg).tokens, args.repeat)
        whole = best_rate(lambda: simulate(cfg).metrics["tokens"], args.repeat)
        print(f"{name:24s} schedule alone {alone:9,.0f}   simulate (+ AR baseline) "
              f"{whole:9,.0f} simulated tokens / wall-s")


if __name__ == "__main__":
    main()
