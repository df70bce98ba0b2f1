"""PPSD on two cores: measured speedup per exit layer, and where the time goes.

    python benchmarks/bench_ppsd.py [--exits 15,18] [--max-new-tokens 64]
                                    [--wait-load 1.5] [--plain-ar]

Each exit layer E is one ``hetspec run --platform cpu-local --target smollm2-135m
--policy ppsd --placement stage0=cpu0,stage1=cpu1 --set exit_layer=E`` (two
stages, one worker process per core, the built-in prompts, greedy), run as a
subprocess exactly as printed. Its ``speedup_vs_ar`` compares with PPSD's own
baseline, AR through the same two stages, measured in the same run.
``--plain-ar`` adds ``--policy ar --no-baseline`` (the whole target on one core,
no hand-over between processes) so that baseline can be compared with a
one-process AR. Before each command the script waits until the 1-minute load
is below ``--wait-load`` and prints the load it started at.

From each run's spans (``spans.jsonl``) it prints, per generated token: each
core's busy time, the time the cores were idle (waiting on transfers, the
coordinator, or each other), the activations and correction transfers, and
stage-0 passes thrown away by flushes. Nothing is asserted: the table is the
figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drafts import BASE, wait_for_quiet  # noqa: E402
from policies.runs.measured import read_measured_spans  # noqa: E402

TWO_STAGES = "stage0=cpu0,stage1=cpu1"


def run(args: list[str], out: Path, env: dict) -> dict:
    cmd = [sys.executable, "-m", "analyses.cli", "run", *BASE, *args, "--json",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout)


def time_shares(spans_path: Path, tokens: int) -> dict:
    """Per generated token (ms): busy time per core, idle core time, transfers,
    and the stage-0 passes beyond one per token (flushed work)."""
    spans = [s for _, s in read_measured_spans(spans_path)]
    wall_s, busy = 0.0, defaultdict(float)
    kinds = defaultdict(float)
    for batch in {s.batch for s in spans}:
        mine = [s for s in spans if s.batch == batch]
        wall_s += max(s.end_s for s in mine) - min(s.start_s for s in mine)
        for s in mine:
            if s.kind == "compute":
                busy[s.physical] += s.duration_s
            kinds[s.name] += s.duration_s
    stage0 = sum(1 for s in spans if s.name == "stage0")
    per = 1e3 / tokens
    return {"wall_ms": wall_s * per,
            **{f"busy_{k}_ms": v * per for k, v in sorted(busy.items())},
            "idle_core_ms": (len(busy) * wall_s - sum(busy.values())) * per,
            "activations_ms": kinds["activations"] * per,
            "correction_ms": kinds["correction"] * per,
            "exit_head_ms": kinds["exit head"] * per,
            "extra_stage0_passes": stage0 - tokens if stage0 else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exits", default="15,18")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--wait-load", type=float, default=1.5)
    ap.add_argument("--plain-ar", action="store_true")
    ap.add_argument("--out", default="runs/bench-ppsd")
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    n = ["--max-new-tokens", str(args.max_new_tokens)]
    jobs = [(f"ppsd-e{e}", ["--policy", "ppsd", "--placement", TWO_STAGES, "--set",
                            f"exit_layer={e}", *n]) for e in args.exits.split(",")]
    if args.plain_ar:
        jobs.append(("ar", ["--policy", "ar", "--no-baseline", *n]))
    for name, extra in jobs:
        load = wait_for_quiet(args.wait_load)
        out = Path(args.out) / name
        m = run(extra, out, env)
        print(f"hetspec run {' '.join(BASE + extra)}")
        if "error" in m:
            print(f"  load {load:.2f}  error: {m['error']}", flush=True)
            continue
        acc = m.get("acceptance_rate")
        print(f"  load {load:.2f}  tok/s {m['tokens_per_s']:.2f}  "
              f"AR tok/s {m.get('ar_tokens_per_s', m['tokens_per_s']):.2f}  "
              f"speedup_vs_ar {m.get('speedup_vs_ar', 1.0):.3f}  acceptance "
              f"{'-' if acc is None else f'{acc:.1%}'}  same as AR {m.get('matches_ar')}")
        tokens = m["tokens"]  # generated, as tokens_per_s counts them (past an end token too)
        shares = time_shares(out / "spans.jsonl", tokens)
        print("  per token: " + "  ".join(
            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in shares.items()), flush=True)


if __name__ == "__main__":
    main()
