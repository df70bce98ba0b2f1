"""The rates behind hetspec's work budgets (analyses/run/budget.py).

Simulations: runs a suite of configurations chosen to stress each term of the
estimate (a large batch, deep speculation at low acceptance, a 1024-node tree,
a speculation cache and a window at a large batch, layer streaming, a prefill
of many chunks, plain AR) and
prints, for each, the estimated row-steps, the wall time and the row-steps per
second (run plus its AR baseline, as ``simulate`` does). The slowest rate is
the one the budget must use, so that the estimate bounds every case's time:
SIM_UNITS_PER_S is set at or below it.

Spans (``--spans``): records a tiny measured run (random weights, a few
seconds), repeats its spans to ``--spans`` lines and times ``hetspec replay``'s
loading and replaying them: spans per second (SPANS_PER_S).

    python benchmarks/bench_budget.py                 # simulation suite
    python benchmarks/bench_budget.py --spans 20000   # also the spans rate
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from analyses.run import budget, measuredbudget
from analyses.run.api import RunConfig, baseline_config, run_schedule
from policies.base import baseline_of

H100 = dict(platform="h100-sxm-5x", target="llama-3.1-70b", draft="llama-3.2-1b")
PHONE = dict(platform="snapdragon-8-gen3", target="llama-3-8b", draft="llama-3.2-1b")
M2 = dict(platform="m2-ultra-8x", target="qwen3-32b", draft="qwen3-0.6b")
LOW = {"kind": "iid", "alpha": 0.01}  # every step commits one token: the most steps
SUITE = {
    "ar b=1": (dict(H100, draft=None), "ar", {}, 2000, 1, {}),
    "ar b=16384": (dict(H100, draft=None), "ar", {}, 50, 16384, {}),
    "sd g=4 b=1": (H100, "sd", {"gamma": 4}, 2000, 1, {}),
    "sd g=64 a=0.01": (H100, "sd", {"gamma": 64}, 300, 1, {}),
    "sd g=64 collectives": (H100, "sd", {"gamma": 64, "draft_collectives": 2000}, 50, 1,
                            {}),
    "sd g=4 b=16384": (H100, "sd", {"gamma": 4}, 50, 16384, {}),
    "sd g=64 b=4096": (H100, "sd", {"gamma": 64}, 30, 4096, {}),
    "tree 1024 nodes": (H100, "tree", {"nodes": 1024, "depth": 32, "width": 32}, 20, 1, {}),
    "tree 1024 b=64": (H100, "tree", {"nodes": 1024, "depth": 32, "width": 32}, 15, 64,
                       {}),
    "ssd k=32 b=64": (H100, "ssd", {"k": 32, "fanout": 64, "hit_rate": 0.7}, 20, 64, {}),
    # a speculation cache or a window's rows walked per operation at a large batch
    "ssd k=5 b=1024": (H100, "ssd", {"hit_rate": 0.7}, 20, 1024, {}),
    "ssd k=2 f=1 b=2048": (H100, "ssd", {"k": 2, "fanout": 1, "hit_rate": 0.7}, 20, 2048, {}),
    "mirror g=64": (M2, "mirror", {"gamma": 64}, 200, 1, {}),
    "mirror g=8 b=1024": (M2, "mirror", {"gamma": 8}, 20, 1024, {}),
    "eesd g=64": (dict(H100, draft=None), "eesd", {"gamma": 64}, 200, 1, {}),
    "ar_stream chunk 1": (dict(PHONE, draft=None), "ar_stream", {"dram_budget_gb": 2},
                          100, 1, {}),
    "kangaroo 3 GB": (dict(PHONE, draft=None), "kangaroo", {"dram_budget_gb": 3}, 100, 1, {}),
    "cats 3 GB": (PHONE, "cats", {"dram_budget_gb": 3}, 100, 1, {}),
    "prefill 65536 chunks": (H100, "sd", {"gamma": 4}, 20, 1,
                             {"prompt_tokens": 65536, "prefill_chunk": 1}),
}


def run_case(fields: dict, policy: str, params: dict, tokens: int, batch: int,
             run: dict) -> tuple[float, float]:
    """(estimated row-steps, seconds) of one simulation and its AR baseline."""
    config = RunConfig(**fields, policy=policy, params=params, acceptance=LOW,
                       tokens=tokens, batch=batch, memory_check=False, **run)
    estimate = budget.config_estimate(config)
    t0 = time.perf_counter()
    run_schedule(config)
    if baseline_of(config.policy, config.params) is not None:
        run_schedule(baseline_config(config), record_spans=False)
    return estimate.units, time.perf_counter() - t0


def simulation_rates(names: list[str]) -> float:
    print(f"{'case':22s} {'row-steps':>12s} {'seconds':>8s} {'row-steps/s':>12s}")
    slowest = float("inf")
    for name in names:
        units, seconds = run_case(*SUITE[name])
        rate = units / seconds
        slowest = min(slowest, rate)
        print(f"{name:22s} {units:12,.0f} {seconds:8.3f} {rate:12,.0f}", flush=True)
    print(f"slowest: {slowest:,.0f} row-steps per second (budget.SIM_UNITS_PER_S = "
          f"{budget.SIM_UNITS_PER_S:,}: {'ok' if budget.SIM_UNITS_PER_S <= slowest else 'TOO HIGH'})")
    return slowest


TINY = {"name": "tiny", "n_layers": 6, "hidden": 64, "ffn": 128, "n_heads": 4,
        "n_kv_heads": 2, "head_dim": 16, "vocab": 48, "dtype": "fp32",
        "hf_architecture": "LlamaForCausalLM"}


def record_run(tmp: Path) -> Path:
    """A tiny measured SD run (random weights, 32 tokens, one prompt)."""
    spec = tmp / "tiny.yaml"
    spec.write_text(yaml.safe_dump({**TINY, "sources": {k: "bench" for k, v in TINY.items()
                                                        if isinstance(v, int)}}))
    prompts = tmp / "prompts.jsonl"
    prompts.write_text('[{"role": "user", "content": "tell me a story"}]\n')
    out = tmp / "run"
    subprocess.run([sys.executable, "-m", "analyses.cli", "run", "--platform", "cpu-local",
                    "--target", f"random:{spec}", "--policy", "sd", "--set", "gamma=3",
                    "--set", "draft_layers=4", "--max-new-tokens", "32", "--prompts",
                    str(prompts), "--inline", "--no-baseline", "--out", str(out)],
                   check=True, capture_output=True)
    return out


def spans_rate(lines: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run = record_run(Path(tmp))
        spans = (run / "spans.jsonl").read_text().splitlines()
        copies = -(-lines // len(spans))
        (run / "spans.jsonl").write_text("\n".join(spans * copies) + "\n")
        n = len(spans) * copies
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "analyses.cli", "replay",
                               str(run / "record.json"), "--trace", str(Path(tmp) / "t.json"),
                               "--json", "--allow-large"], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    ok = "replayed" if done.returncode == 0 else \
        f"refused: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    rate = n / seconds
    print(f"replay of {n:,} spans: {seconds:.2f} s ({ok}), {rate:,.0f} spans per second "
          f"(measuredbudget.SPANS_PER_S = {measuredbudget.SPANS_PER_S:,}: "
          f"{'ok' if measuredbudget.SPANS_PER_S <= rate else 'TOO HIGH'})")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated suite cases (default: all)")
    ap.add_argument("--spans", type=int, default=0, help="also time a replay of this many "
                    "spans lines")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(SUITE)
    simulation_rates(names)
    if args.spans:
        spans_rate(args.spans)


if __name__ == "__main__":
    main()
