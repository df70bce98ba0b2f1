"""Executor speed on the real SmolLM2-135M: AR against transformers' generate, and
each schedule's measured speedup over AR with its acceptance statistics.

    python benchmarks/bench_executor.py [--max-new-tokens 64] [--threads 1]

Part 1 times greedy decoding of the built-in prompts by the executor (in
process, and with the target in a worker process pinned to a core) and by
``model.generate`` on the same model and threads. Both exclude the prompt:
generate's decode rate is (N - 1) / (t(N new tokens) - t(1 new token)).
Part 2 runs every schedule on the same prompts in worker processes (draft and
target on their own cores) and prints tokens/s, speedup over AR measured the
same way, acceptance and event rates, and whether the outputs equal AR's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from analyses.run.config import RunConfig
from executors.measure import decode_all, outputs_of, summarise
from executors.backend.models import load
from executors.prompts import BUILTIN, encode
from executors.session import Options, Session

STAGES = {"stage0": "cpu0", "stage1": "cpu1", "stage2": "cpu0", "stage3": "cpu1"}
SCHEDULES = [
    ("sd", {"gamma": 4, "draft_layers": 15}, None),
    ("sd", {"gamma": 4, "draft_layers": 24}, None),
    ("sd", {"gamma": 4}, "self:24"),
    ("mirror", {"gamma": 4, "kappa": 4, "exit_layer": 15, "eta": 1}, "self:15"),
    ("mirror", {"gamma": 4, "kappa": 4, "exit_layer": 15, "eta": 1}, "self:24"),
    ("ssd", {"k": 4, "fanout": 2, "hit_rate": 0.5}, "self:24"),
    ("eesd", {"gamma": 4, "exit_layer": 24}, None),
    ("ppsd", {"exit_layer": 8}, None),
]


def _generate_s(model, ids, n: int) -> float:
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return time.perf_counter() - start


def paired_rates(session: Session, prompts, max_new: int, repeats: int):
    """Median tokens/s of transformers' generate (prompt excluded) and of the
    executor, measured alternately on each prompt so load changes hit both."""
    model = session.loaded["target"].model or load("smollm2-135m").model
    hf, ours = [], []
    for _ in range(repeats):
        for p in prompts:
            ids = torch.tensor([p])
            hf.append((max_new - 1) / (_generate_s(model, ids, max_new)
                                       - _generate_s(model, ids, 1)))
            r = session.decode("ar", {}, [p])
            ours.append(len(r.generated[0]) / r.wall_s)
    return statistics.median(hf), statistics.median(ours)


def part_one(max_new: int, threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    results = {}
    for mode in ("inline", "processes"):
        opts = Options(max_new_tokens=max_new, threads=threads, mode=mode)
        with Session("cpu-local", "smollm2-135m", options=opts) as s:
            prompts = [encode(m, s.tokenizer, 49152) for m in BUILTIN]
            s.decode("ar", {}, prompts[:1])  # warm up
            results[mode] = paired_rates(s, prompts, max_new, repeats)
    print(f"AR, SmolLM2-135M fp32, {threads} thread(s), {max_new} new tokens, medians of "
          f"{repeats * len(prompts)} decodes (generate timed alternately with each):")
    for mode, where in (("inline", "in process"), ("processes", "worker on cpu:0")):
        theirs, ours = results[mode]
        print(f"  executor, {where:16s} {ours:7.2f} tokens/s   transformers generate "
              f"{theirs:7.2f} tokens/s   ratio {ours / theirs:.3f}")


def part_two(max_new: int, threads: int) -> None:
    opts = Options(max_new_tokens=max_new, threads=threads, mode="processes")
    print(f"\nSchedules on cpu-local (worker processes), {len(BUILTIN)} prompts x {max_new} "
          "tokens, speedup over AR measured the same way:")
    print(f"  {'policy':7s} {'params':42s} {'draft':8s} {'tok/s':>7s} {'speedup':>7s} "
          f"{'accept':>7s} {'mean acc':>8s} {'events':>14s} lossless")
    drafts = sorted({d for _, _, d in SCHEDULES if d}, key=str)
    for draft in [None, *drafts]:
        rows = [s for s in SCHEDULES if s[2] == draft]
        if not rows:
            continue
        with Session("cpu-local", "smollm2-135m", draft, placement=STAGES,
                     options=opts) as s:
            prompts = [encode(m, s.tokenizer, 49152) for m in BUILTIN]
            cfg = RunConfig(platform="cpu-local", target="smollm2-135m", policy="ar")
            ar = decode_all(s, "ar", {}, prompts, 1)
            ar_m = summarise(cfg, ar, max_new)
            for policy, params, _ in rows:
                res = decode_all(s, policy, params, prompts, 1)
                m = summarise(cfg.revised(policy=policy, params=params), res, max_new)
                events = ", ".join(f"{k[:-5]} {v:.2f}" for k, v in m.items()
                                   if k.endswith("_rate") and k != "acceptance_rate")
                same = outputs_of(res, max_new) == outputs_of(ar, max_new)
                acc = m["acceptance_rate"]
                print(f"  {policy:7s} {str(params):42s} {str(draft or '-'):8s} "
                      f"{m['tokens_per_s']:7.2f} {m['tokens_per_s'] / ar_m['tokens_per_s']:7.2f} "
                      f"{acc if acc is None else round(acc, 3)!s:>7s} "
                      f"{m['mean_accepted']:8.2f} {events:>14s} {same}")
            print(f"  {'ar':7s} {'{}':42s} {str(draft or '-'):8s} "
                  f"{ar_m['tokens_per_s']:7.2f} {1.0:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-schedules", action="store_true")
    args = ap.parse_args()
    part_one(args.max_new_tokens, args.threads, args.repeats)
    if not args.skip_schedules:
        part_two(args.max_new_tokens, args.threads)


if __name__ == "__main__":
    main()
