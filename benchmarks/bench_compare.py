"""Wall time of the main job, `hetspec compare` with no arguments (the default
scenario), serial and on every core, and of a 100-point sweep on one core (the
GenZ review's grid: SD, Llama-3.1-70B + Llama-3.2-1B on h100-sxm-5x, gamma 1..10 x
alpha 0.50..0.95, each point with its AR baseline and its prompt's prefill; goal:
under 3 s). Prints one line per setting, the sweep's CPU time beside its wall
time (on a shared machine the CPU time is the steadier figure).

    python benchmarks/bench_compare.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from analyses.cli import main

GRID_100 = ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
            "llama-3.2-1b", "--policies", "sd", "--sweep", "gamma=1..10", "--sweep",
            "alpha=0.5..0.95:0.05"]


def timed(jobs: int, extra: list[str] = ()) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one compare run."""
    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), time.process_time()
        rc = main(["compare", *extra, "--jobs", str(jobs), "-o", str(Path(tmp) / "r.html")])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if rc != 0:
        raise SystemExit(f"hetspec compare exited {rc}")
    return elapsed, cpu


if __name__ == "__main__":
    cores = os.cpu_count() or 1
    for jobs in sorted({1, cores}):
        print(f"hetspec compare (default scenario), jobs={jobs}: {timed(jobs)[0]:.2f} s wall")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    wall, cpu = timed(1, GRID_100)
    print(f"100-point sweep (review grid), one core: {wall:.2f} s wall, {cpu:.2f} s CPU")
