"""FP8 against GenZ: hetspec's decode step and prefill with ``--set compute_bits=8``
(weights, KV cache and activations at 8 bits, GenZ's ``bits='fp8'``) beside
GenZ's own (its prefill whole, and less the embedding and LM-head GEMMs GenZ runs
over every prompt position, which hetspec's prefill does not), on GenZ's H100 preset typed into a platform file
(``benchmarks/data/genz-h100-preset.yaml``; docs/units-genz.md says how each
number is matched). bf16 rows are printed too, as the reference the FP8 rows
move from. Goal: FP8 decode and prefill within 5% of GenZ.

GenZ's figures are computed here, by GenZ (``genz-llm`` on PyPI; 0.0.16 was
used): install it, or unpack its wheel and point ``HETSPEC_GENZ_PATH`` at the
folder holding ``GenZ/``, with pandas importable. Without it the benchmark
prints hetspec's side alone and exits 2.

    python benchmarks/bench_genz_fp8.py
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from analyses.run.api import RunConfig, simulate

PLATFORM = str(Path(__file__).parent / "data" / "genz-h100-preset.yaml")
CONTEXT = 1024  # prompt tokens: the prefill's length and the decode step's context
# (hetspec model, placement, GenZ model, tensor-parallel degree)
MODELS = [("llama-3.1-70b", "tp4", "meta-llama/Llama-3.1-70B", 4),
          ("llama-3-8b", "gpu0", "meta-llama/Llama-3.1-8B", 1)]
BATCHES = (1, 16)
PRECISIONS = {"bf16": {}, "fp8": {"compute_bits": 8, "weight_bits": 8, "kv_bits": 8}}
GOAL = 0.05


def load_genz():
    """GenZ's decode and prefill functions, or None. GenZ imports its plotting
    helpers at import time; this benchmark draws nothing, so a plotting package
    that is absent is replaced by an empty module."""
    if os.environ.get("HETSPEC_GENZ_PATH"):
        sys.path.insert(0, os.environ["HETSPEC_GENZ_PATH"])
    for name in ("matplotlib", "matplotlib.pyplot", "seaborn", "IPython", "IPython.display"):
        try:
            __import__(name)
        except ImportError:
            stub = sys.modules[name] = types.ModuleType(name)
            stub.display = print
    try:
        from GenZ import decode_moddeling, prefill_moddeling
    except ImportError as exc:
        print(f"GenZ is not importable ({exc}); pip install genz-llm, or set "
              "HETSPEC_GENZ_PATH to an unpacked genz-llm wheel", file=sys.stderr)
        return None
    return decode_moddeling, prefill_moddeling


def outside_layers_ms(model_df) -> float:
    """ms of GenZ's operators outside its repeated decoder layers: the embedding
    and the LM head, each a GEMM over every prompt position."""
    depth, total = 0, 0.0
    for op, latency in zip(model_df["Op Type"], model_df["Latency (msec)"]):
        depth += {"Repeat": 1, "EndRepeat": -1}.get(op, 0)
        if depth == 0 and op == "GEMM":
            total += float(latency)
    return total


def genz_ms(genz, model: str, tp: int, batch: int, bits: str) -> tuple[float, ...]:
    """(decode step, prefill, prefill less its embedding and LM-head GEMMs) in ms,
    as GenZ computes them (one beam: Bb=1). hetspec's prefill runs neither: an
    engine looks the prompt's embeddings up and projects only the last position
    to logits, where GenZ multiplies all of them by both matrices."""
    decode, prefill = genz
    d = decode(model=model, batch_size=batch, input_tokens=CONTEXT, output_tokens=0, Bb=1,
               system_name="H100_GPU", bits=bits, tensor_parallel=tp)
    p = prefill(model=model, batch_size=batch, input_tokens=CONTEXT, system_name="H100_GPU",
                bits=bits, tensor_parallel=tp)
    return d["Latency"], p["Latency"], p["Latency"] - outside_layers_ms(p["model_df"])


def hetspec_ms(model: str, where: str, batch: int, bits: str) -> tuple[float, float]:
    """(decode step, prefill) in ms: deterministic AR at a fixed context."""
    config = RunConfig(platform=PLATFORM, target=model, policy="ar", tokens=4, batch=batch,
                       deterministic=True, fixed_context=True, prompt_tokens=CONTEXT,
                       placement={"target": where}, **PRECISIONS[bits])
    m = simulate(config, baseline=False).metrics
    return m["step_latency_s"] * 1e3, m["prefill_s"] * 1e3


def main() -> int:
    genz = load_genz()
    print(f"{'model':15} {'TP':>2} {'batch':>5} {'bits':>4} | {'decode ms':>21} {'diff':>6} "
          f"| {'prefill ms':>21} {'diff':>6} | {'prefill, layers only':>21} {'diff':>6}")
    print(f"{'':31} | {'hetspec':>10} {'GenZ':>10} {'':6} | {'hetspec':>10} {'GenZ':>10} "
          f"{'':6} | {'hetspec':>10} {'GenZ':>10}")
    worst = 0.0
    for model, where, genz_model, tp in MODELS:
        for batch in BATCHES:
            for bits in PRECISIONS:
                decode_ms, prefill_ms = hetspec_ms(model, where, batch, bits)
                ours = (decode_ms, prefill_ms, prefill_ms)
                theirs = genz_ms(genz, genz_model, tp, batch, bits) if genz else (None,) * 3
                cells = []
                for column, (mine, ref) in enumerate(zip(ours, theirs)):
                    diff = None if ref is None else mine / ref - 1
                    if diff is not None and bits == "fp8" and column != 1:
                        worst = max(worst, abs(diff))
                    cells.append(f"{mine:10.3f} {'-' if ref is None else f'{ref:.3f}':>10} "
                                 f"{'' if diff is None else f'{diff:+.1%}':>6}")
                print(f"{model:15} {tp:>2} {batch:>5} {bits:>4} | " + " | ".join(cells))
    if genz is None:
        return 2
    print(f"largest FP8 difference, decode and prefill through the layers: {worst:.1%} "
          f"(goal: within {GOAL:.0%}); GenZ's whole prefill also multiplies every prompt "
          "position by the embedding and LM-head matrices, which hetspec's does not")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
