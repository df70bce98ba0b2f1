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

--grid prints, instead of timings, Mirror-SD's lead over SD (tokens/s ratio,
deterministic, context 128, gamma 7, Omega 0.9, alpha 0.8, the paper's kappa
schedule, exit at half the layers) on every shipped platform at B = 1, 8, 16,
32, 64, with each fallback; auto takes the larger of the two (tests/test_mirror.py
checks that it does).

    python benchmarks/bench_mirror_ssd.py [--repeat 5] [--contention] [--batch 64]
    python benchmarks/bench_mirror_ssd.py --grid
"""

from __future__ import annotations

import argparse
import os
import time

from analyses.run.api import RunConfig, run_schedule, simulate

MIRROR = RunConfig(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b",
                   policy="mirror", params={"gamma": 7, "kappa": 8, "exit_layer": 32,
                                            "omega": 0.9, "eta": 2},
                   acceptance={"kind": "iid", "alpha": 0.8}, tokens=2000, seed=1)
SSD = RunConfig(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b",
                policy="ssd", params={"k": 7, "fanout": 3, "hit_rate": 0.88,
                                      "backup": "jit"},
                acceptance={"kind": "iid", "alpha": 0.8}, tokens=2000, seed=1)


GRID = ((("h100-sxm-5x", "llama-3.1-70b", "llama-3.2-1b"), {}),
        (("m2-ultra-8x", "qwen3-32b", "qwen3-0.6b"), {}),
        (("a100-sxm-8x", "qwen3-32b", "qwen3-0.6b"), {}),
        (("snapdragon-8-gen3", "vicuna-7b", "qwen3-0.6b"), {}),
        (("jetson-agx-orin-64gb", "qwen3-14b", "qwen3-0.6b"), {"draft": "dla0"}),
        (("cpu-local", "qwen3-0.6b", "smollm2-135m"), {}))
GRID_BATCHES = (1, 8, 16, 32, 64)


def grid_rate(setup, placement, policy: str, params: dict, batch: int) -> float:
    name, target, draft = setup
    cfg = RunConfig(platform=name, target=target, draft=draft, policy=policy,
                    params={"gamma": 7, **params}, acceptance={"kind": "iid", "alpha": 0.8},
                    tokens=2000, batch=batch, deterministic=True, fixed_context=True,
                    prompt_tokens=128, placement=placement)
    return simulate(cfg, baseline=False).metrics["tokens_per_s"]


def print_grid() -> None:
    print(f"{'platform':22s} {'B':>3s} {'stall':>7s} {'skip':>7s} {'best':>7s}"
          "   (Mirror-SD tokens/s over SD's)")
    for setup, placement in GRID:
        for batch in GRID_BATCHES:
            # SD with Mirror's SPD-style draft sharding: the two on equal terms
            sd = grid_rate(setup, placement, "sd", {"draft_collectives": 2}, batch)
            leads = [grid_rate(setup, placement, "mirror", {"batch_fallback": mode}, batch)
                     / sd for mode in ("stall", "skip")]
            print(f"{setup[0]:22s} {batch:3d} {leads[0]:7.3f} {leads[1]:7.3f} "
                  f"{max(leads):7.3f}")


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
    parser.add_argument("--grid", action="store_true",
                        help="print Mirror-SD's lead over SD on every shipped platform")
    args = parser.parse_args()
    if args.grid:
        print_grid()
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    configs = [("mirror (m2-ultra-8x)", MIRROR), ("ssd (h100-sxm-5x)", SSD)]
    if args.contention:
        configs.append(("mirror contention=on", MIRROR.model_copy(update={"contention": True})))
    for mode in ("stall", "skip") if args.batch else ():
        params = {**MIRROR.given("params"), "batch_fallback": mode}
        configs.append((f"mirror B={args.batch} {mode}",
                        MIRROR.revised(batch=args.batch, params=params)))
    for name, cfg in configs:
        run_schedule(cfg)  # warm profile loading and imports
        alone = best_rate(lambda: run_schedule(cfg).tokens, args.repeat)
        whole = best_rate(lambda: simulate(cfg).metrics["tokens"], args.repeat)
        print(f"{name:24s} schedule alone {alone:9,.0f}   simulate (+ AR baseline) "
              f"{whole:9,.0f} simulated tokens / wall-s")


if __name__ == "__main__":
    main()
