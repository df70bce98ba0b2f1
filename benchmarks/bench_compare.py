"""Wall time of the main job, `hetspec compare` with no arguments (the default
scenario), serial and on every core; prints one line per setting.

    python benchmarks/bench_compare.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from analyses.cli import main


def timed(jobs: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rc = main(["compare", "--jobs", str(jobs), "-o", str(Path(tmp) / "r.html")])
        elapsed = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"hetspec compare exited {rc}")
    return elapsed


if __name__ == "__main__":
    cores = os.cpu_count() or 1
    for jobs in sorted({1, cores}):
        print(f"hetspec compare (default scenario), jobs={jobs}: {timed(jobs):.2f} s wall")
