"""Is a one-row pass's time linear in the layers it runs? The cost model prices
a pass as its layers' terms plus its head's, so a model of N layers costs a
fixed part plus N times a per-layer part; this measures whether the CPU agrees.

    python benchmarks/bench_depth.py [--depths 1,8,15,30] [--rounds 6] [--threads 1]

Loads SmolLM2-135M (the converted checkpoint the executor uses) once, and in one
process times one-token decode passes (a KV cache of 60 prompt tokens) of its
first N layers and its LM head for each depth, the depths interleaved over
``--rounds`` rounds so that a drifting machine slows every depth alike; prints
each depth's median pass, the time per layer between neighbouring depths, and
the LM head alone. Passes of 8-, 15- and 30-layer models measured in separate
runs minutes apart disagree with a line through them by 10-25% on this machine
(docs/calibration-notes.md, "Measured in mirrored passes"); measured side by side
they do not, which says the disagreement is the machine's drift, not a cost
term the model lacks.
"""

from __future__ import annotations

import argparse
import statistics
import time


def pass_ms(torch, model, layers, depth: int, prompt, steps: int) -> float:
    """Median milliseconds of ``steps`` one-token passes of the first ``depth``
    layers and the head, after a prefill of ``prompt``."""
    model.model.layers = layers[:depth]
    model.config.num_hidden_layers = depth
    token = torch.tensor([[5]])
    times = []
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
        for _ in range(steps):
            start = time.perf_counter()
            cache = model(token, past_key_values=cache, use_cache=True).past_key_values
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def head_ms(torch, model, calls: int = 20) -> float:
    x = torch.randn(1, model.lm_head.weight.shape[1])
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        torch.nn.functional.linear(x, model.lm_head.weight)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1,8,15,30",
                    type=lambda v: sorted({int(x) for x in v.split(",") if x}),
                    help="layer counts to time, comma-separated (default 1,8,15,30)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    ap.add_argument("--steps", type=int, default=12, help="passes per depth and round")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from executors.backend.models import smollm2_dir

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    layers = model.model.layers
    if args.depths[-1] > len(layers) or args.depths[0] < 1:
        ap.error(f"--depths must lie in 1..{len(layers)}")
    prompt = torch.randint(0, 1000, (1, 60), generator=torch.Generator().manual_seed(0))
    times = {d: [] for d in args.depths}
    for _ in range(args.rounds):
        for d in args.depths:
            times[d].append(pass_ms(torch, model, layers, d, prompt, args.steps))
    med = {d: statistics.median(v) for d, v in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), one-token passes after a "
          f"60-token prompt, median of {args.rounds} interleaved rounds")
    print("| layers | pass (ms) | range over rounds (ms) | ms per layer since the previous |")
    print("|---:|---:|---:|---:|")
    previous = None
    for d in args.depths:
        step = ("-" if previous is None
                else f"{(med[d] - med[previous]) / (d - previous):.2f}")
        print(f"| {d} | {med[d]:.1f} | {min(times[d]):.1f}-{max(times[d]):.1f} | {step} |")
        previous = d
    print(f"LM head alone (a {tuple(model.lm_head.weight.shape)} GEMV): "
          f"{head_ms(torch, model):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
