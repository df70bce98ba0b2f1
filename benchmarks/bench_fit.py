"""Memory checks per second, the unit of `hetspec fit`'s work budget
(analyses.commands.fit.CHECKS_PER_S): one fit report of llama-3.1-70b on
h100-sxm-8x, timed, divided into the checks it may run.

    python benchmarks/bench_fit.py
"""

from __future__ import annotations

import time

from analyses.run.capacity import checks_count, fit_report
from analyses.run.config import RunConfig


def main() -> None:
    config = RunConfig(platform="h100-sxm-8x", target="llama-3.1-70b", policy="ar",
                       tokens=1000)
    contexts, batches = [2048, 8192, 32768], [1, 8, 32]
    fit_report(config, contexts, batches)  # warm the profile caches
    start = time.perf_counter()
    fit_report(config, contexts, batches)
    elapsed = time.perf_counter() - start
    checks = checks_count(config, contexts, batches)
    print(f"fit report: {elapsed * 1e3:.0f} ms for at most {checks} memory checks: "
          f"at least {checks / elapsed:,.0f} checks/s")


if __name__ == "__main__":
    main()
