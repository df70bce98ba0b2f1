"""Measured speedups of the self-drafting schedules on SmolLM2-135M with the
trained draft heads (executors/data/smollm2-135m-drafts.safetensors).

    python benchmarks/bench_drafts.py [--max-new-tokens 64] [--wait-load 1.5]
                                      [--only kangaroo,eesd] [--untrained]

Each row is one ``hetspec run --platform cpu-local --target smollm2-135m ...``
command, run as a subprocess exactly as printed (worker processes, one per core,
the built-in prompts, the AR baseline measured in the same run), parsed from its
``--json``. Before each command the script waits until the 1-minute load average
is below ``--wait-load`` and prints the load it started at. ``--untrained`` sets
HETSPEC_DRAFTS=none: the same commands with the untrained exits (the issue's
starting point). Nothing is asserted: the table is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BASE = ["--platform", "cpu-local", "--target", "smollm2-135m"]
PPSD_STAGES = "stage0=cpu0,stage1=cpu1,stage2=cpu0,stage3=cpu1"
# (policy, extra arguments): default parameters, plus what a schedule cannot run
# without on cpu-local (a DRAM budget for the streaming schedules: 1 GB holds all
# 30 layers, so nothing streams; stage placement for PPSD's four stages)
RUNS = [
    ("kangaroo", ["--set", "dram_budget_gb=1"]),
    ("cats", ["--set", "dram_budget_gb=1"]),
    ("eesd", []),
    ("ppsd", ["--placement", PPSD_STAGES]),
    ("mirror", []),
    ("sd", ["--set", "draft_layers=15"]),
    ("sd", ["--set", "draft_layers=8"]),
    ("kangaroo", ["--set", "dram_budget_gb=1", "--set", "gamma=3"]),
    ("eesd", ["--set", "gamma=3"]),
    ("ppsd", ["--placement", "stage0=cpu0,stage1=cpu1", "--set", "exit_layer=15"]),
]


def wait_for_quiet(limit: float, timeout_s: float = 900) -> float:
    start = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - start < timeout_s:
        time.sleep(5)
    return os.getloadavg()[0]


def run_one(policy: str, extra: list[str], max_new: int, env: dict, out: str) -> dict:
    cmd = [sys.executable, "-m", "analyses.cli", "run", *BASE, "--policy", policy, *extra,
           "--max-new-tokens", str(max_new), "--json", "--out", out]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--wait-load", type=float, default=1.5)
    ap.add_argument("--only", help="comma-separated policies")
    ap.add_argument("--untrained", action="store_true")
    ap.add_argument("--runs", default="runs/bench-drafts", help=(
        "directory the runs are written to, one NN-POLICY folder each (replaced if "
        "there): benchmarks/break_even.py reads them"))
    args = ap.parse_args()
    env = dict(os.environ, **({"HETSPEC_DRAFTS": "none"} if args.untrained else {}))
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    only = set(args.only.split(",")) if args.only else None
    print(f"{'command (hetspec run ' + ' '.join(BASE) + ' ...)':72s} {'load':>5s} "
          f"{'tok/s':>6s} {'AR':>6s} {'speedup':>7s} {'accept':>6s} {'tok/step':>8s} "
          "same")
    for i, (policy, extra) in enumerate(RUNS):
        if only and policy not in only:
            continue
        load = wait_for_quiet(args.wait_load)
        out = os.path.join(args.runs, f"{i:02d}-{policy}")
        m = run_one(policy, extra, args.max_new_tokens, env, out)
        label = " ".join(["--policy", policy, *extra])
        if "error" in m:
            print(f"{label:72s} {load:5.2f} error: {m['error']}")
            continue
        acc = m.get("acceptance_rate")
        print(f"{label:72s} {load:5.2f} {m['tokens_per_s']:6.2f} {m['ar_tokens_per_s']:6.2f} "
              f"{m['speedup_vs_ar']:7.3f} {'-' if acc is None else f'{acc:.1%}':>6s} "
              f"{m['mean_tokens_per_step']:8.2f} {m.get('matches_ar')}", flush=True)


if __name__ == "__main__":
    main()
