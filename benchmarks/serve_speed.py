"""How fast a serving run simulates: 10,000 requests on one core, and the engine's
steps per CPU-second against bare SimPy timeouts in the same process.

    python benchmarks/serve_speed.py [--requests 10000] [--policy sd]

Prints the serving run's CPU seconds (the goal: under 30 s), its engine steps per
CPU-second, bare SimPy timeouts per CPU-second, and their ratio (the share of a
bare event loop's speed the engine keeps while forming batches and pricing steps).
"""

from __future__ import annotations

import argparse
import time

import simpy

from analyses.serve.api import ServeConfig, serve


def bare_timeouts(n: int) -> float:
    """SimPy timeouts per CPU-second: one process yielding n timeouts."""
    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1e-3)
    env.process(proc())
    start = time.process_time()
    env.run()
    return n / (time.process_time() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--policy", default="sd")
    p.add_argument("--rate", type=float, default=4.0)
    args = p.parse_args()
    draft = None if args.policy == "ar" else "llama-3.2-1b"
    config = ServeConfig.build(platform="h100-sxm-8x", target="llama-3.1-70b", draft=draft,
                               policy=args.policy, sets={"alpha": 0.8}, rate=args.rate,
                               requests=args.requests, slo="ttft=0.5,tpot=0.05", seed=1)
    start = time.process_time()
    out = serve(config)
    cpu = time.process_time() - start
    steps = out.metrics["steps"]
    bare = bare_timeouts(200_000)
    print(f"serve {args.policy}, {args.requests:,} requests at {args.rate:g}/s: {cpu:.2f} CPU s "
          f"({steps:,} engine steps, {out.metrics['pricing_simulations']} pricing "
          "simulations)")
    print(f"engine steps per CPU-second: {steps / cpu:,.0f}; bare SimPy timeouts per "
          f"CPU-second: {bare:,.0f}; ratio {steps / cpu / bare:.4f}")


if __name__ == "__main__":
    main()
