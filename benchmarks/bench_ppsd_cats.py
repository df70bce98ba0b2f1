"""Simulator speed on the PPSD, EESD, CATS and Kangaroo command lines, and how far
PPSD on an 8-GPU A100 node falls below eq. 6.

Speed: each command's configuration goes through ``analyses.run.api.simulate``
exactly as ``hetspec simulate ... --json`` runs it (its baseline run included);
the figure is simulated tokens per wall-second of that call, best of
``--repeat`` runs after one warm-up. Goals: 10,000 for PPSD and EESD, 1,000 for
CATS.

Eq. 6 gap: deterministic runs with fixed context on a100-sxm-8x, with the
platform's real NVLink costs and the exit head's cost, against
rho* = N / (alpha E + (1 - alpha) ceil(N/E) E).

    python benchmarks/bench_ppsd_cats.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

from analyses.run.api import run_schedule, simulate
from analyses.run.config import RunConfig
from policies.ppsd import ppsd_law

COMMANDS = {
    "ppsd": (RunConfig(platform="a100-sxm-8x", target="vicuna-7b", policy="ppsd",
                       params={"exit_layer": 8, "exit_head": "transformer"},
                       acceptance={"kind": "iid", "alpha": 0.6738}, tokens=2000, seed=1),
             10_000),
    "eesd": (RunConfig(platform="a100-sxm-8x", target="vicuna-7b", policy="eesd",
                       params={"exit_layer": 8, "gamma": 5},
                       acceptance={"kind": "iid", "alpha": 0.6738}, tokens=2000, seed=1),
             10_000),
    "cats": (RunConfig(platform="jetson-agx-orin-64gb", target="vicuna-7b", policy="cats",
                       params={"gamma": 5, "l_dm": 3, "l_sv": 15, "dram_budget_gb": 8,
                               "mean_accepted": 3.05}, tokens=300, seed=1),
             1_000),
    "kangaroo": (RunConfig(platform="jetson-agx-orin-64gb", target="vicuna-7b",
                           policy="kangaroo",
                           params={"gamma": 5, "l_dm": 3, "dram_budget_gb": 8,
                                   "mean_accepted": 2.27}, tokens=300, seed=1),
                 1_000),
}


def speed(config: RunConfig, repeat: int) -> tuple[float, float, dict]:
    """Best tokens per wall-second of the whole simulate call and of the schedule
    alone (without its baseline run)."""
    simulate(config)  # warm-up: profile loads, imports, cost-model caches
    whole = alone = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = simulate(config)
        whole = min(whole, time.perf_counter() - start)
        start = time.perf_counter()
        run_schedule(config)
        alone = min(alone, time.perf_counter() - start)
    tokens = out.metrics["tokens"]
    return tokens / whole, tokens / alone, out.metrics


def eq6_gap() -> None:
    print("\nPPSD on a100-sxm-8x, vicuna-7b, E=8 (deterministic, fixed context):")
    print(f"{'exit head':>12} {'alpha':>7} {'simulated':>10} {'eq. 6':>7} {'gap':>7}")
    for head in ("norm", "transformer"):
        for alpha in (0.0, 0.3226, 0.6738, 1.0):
            config = RunConfig(platform="a100-sxm-8x", target="vicuna-7b", policy="ppsd",
                               params={"exit_layer": 8, "exit_head": head},
                               acceptance={"kind": "iid", "alpha": alpha}, tokens=2000,
                               deterministic=True, fixed_context=True)
            sim = simulate(config).metrics["speedup_vs_ar"]
            law = ppsd_law(32, 8, alpha)["speedup"]
            print(f"{head:>12} {alpha:7.4f} {sim:10.3f} {law:7.3f} {sim / law - 1:+7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="best of N runs")
    args = parser.parse_args()
    print(f"{'command':>10} {'simulate':>10} {'schedule':>10} {'goal':>7}  speedup_vs_ar")
    for name, (config, goal) in COMMANDS.items():
        whole, alone, metrics = speed(config, args.repeat)
        flag = "ok" if whole >= goal else "BELOW GOAL"
        print(f"{name:>10} {whole:10,.0f} {alone:10,.0f} {goal:7,d}  "
              f"{metrics['speedup_vs_ar']:.3f}  {flag}")
    print("(simulated tokens per wall-second: the whole simulate call, baseline run "
          "included, and the schedule alone)")
    eq6_gap()


if __name__ == "__main__":
    main()
