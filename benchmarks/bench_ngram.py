"""Prompt lookup on this CPU: hetspec's `--draft ngram` against transformers' own.

    python benchmarks/bench_ngram.py [--max-new-tokens 64] [--repeats 3]

Runs, in one benchmark run on the same machine:

1. ``hetspec run --platform cpu-local --target smollm2-135m --policy sd --draft
   ngram --prompts grounded --max-new-tokens 64 --json`` and the same with
   ``--prompts chat``, exactly as a user types them (each interleaves the
   schedule and AR per prompt over --repeats rounds and reports the median
   round's speedup and the range);
2. transformers' ``generate(prompt_lookup_num_tokens=10)`` against its plain
   greedy ``generate`` on the grounded prompts, one torch thread, the two
   interleaved per prompt (order alternating) over the same number of rounds;
   decode time only (a one-token generate, the prefill, is subtracted);

and prints every speedup with its range over rounds, whether the outputs equal
AR's, hetspec's fraction of transformers' speedup (the goal: at least 0.9), and
the host time of one lookup (``host_lookup_s`` in the cpu-local profile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from policies.runs.measured import SPANS_FILE, read_measured_spans

REPO = Path(__file__).resolve().parents[1]
COMMAND = ("hetspec run --platform cpu-local --target smollm2-135m --policy sd "
           "--draft ngram --prompts {prompts} --max-new-tokens {tokens} --json")
HF_LOOKUP_TOKENS = 10  # transformers' documented example value


def hetspec_run(prompts: str, tokens: int, repeats: int, out: Path) -> dict:
    """The README's command, run as a user runs it; its JSON and record."""
    argv = COMMAND.format(prompts=prompts, tokens=tokens).split()[1:]
    argv += ["--repeats", str(repeats), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "analyses.cli", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hetspec run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def lookup_s(run_dir: Path) -> float:
    """Median host time of one prompt lookup in a measured run's spans."""
    times = [s.duration_s for _, s in read_measured_spans(run_dir / SPANS_FILE)
             if s.type == "Lookup"]
    return statistics.median(times)


def hf_rounds(prompts: str, tokens: int, repeats: int):
    """Per round, transformers' prompt-lookup speedup over its greedy generate on
    the prompts (decode time: each generate minus a one-token generate), and
    whether every output equalled greedy's."""
    import torch

    from executors.backend.models import load
    from executors.prompts import encode, load as load_prompts

    torch.set_num_threads(1)
    loaded = load("smollm2-135m")
    model, tok = loaded.model, loaded.tokenizer
    ids = [torch.tensor([encode(m, tok, loaded.spec.vocab)]) for m in load_prompts(prompts)]

    def timed(x, n, lookup=None):
        kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        start = time.perf_counter()
        out = model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, **kwargs)
        return time.perf_counter() - start, out

    ratios, equal = [], True
    for rep in range(repeats):
        ar_s = lookup_total_s = 0.0
        for k, x in enumerate(ids):
            prefill_s, _ = timed(x, 1)
            order = [None, HF_LOOKUP_TOKENS][::-1 if (rep + k) % 2 else 1]
            outs = {}
            for lookup in order:
                t, outs[lookup] = timed(x, tokens, lookup)
                if lookup:
                    lookup_total_s += t - prefill_s
                else:
                    ar_s += t - prefill_s
            equal &= outs[None].tolist() == outs[HF_LOOKUP_TOKENS].tolist()
        ratios.append(ar_s / lookup_total_s)
    return ratios, equal


def spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f}x (range {min(values):.2f}-{max(values):.2f}x "
            f"over {len(values)} rounds)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per measurement (3)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ngram-") as tmp:
        start = time.perf_counter()
        runs = {}
        for prompts in ("grounded", "chat"):
            runs[prompts] = hetspec_run(prompts, args.max_new_tokens, args.repeats,
                                        Path(tmp) / prompts)
        hf, hf_equal = hf_rounds("grounded", args.max_new_tokens, args.repeats)
        per_lookup_s = lookup_s(Path(tmp) / "grounded")
    print(f"prompt lookup on SmolLM2-135M, cpu-local, {args.max_new_tokens} new tokens, "
          f"greedy ({time.perf_counter() - start:.0f} s)")
    for prompts, out in runs.items():
        print(f"  hetspec --draft ngram --prompts {prompts}: speedup_vs_ar "
              f"{spread(out['speedup_vs_ar_repeats'])}, matches_ar {out['matches_ar']}, "
              f"{out['mean_tokens_per_step']:.2f} tokens/step, AR "
              f"{out['ar_tokens_per_s']:.1f} tokens/s")
    print(f"  transformers generate(prompt_lookup_num_tokens={HF_LOOKUP_TOKENS}) on "
          f"grounded: {spread(hf)}, outputs equal greedy {hf_equal}")
    ours = runs["grounded"]["speedup_vs_ar"]
    print(f"  hetspec / transformers on grounded: {ours / statistics.median(hf):.2f} "
          "(goal >= 0.90)")
    print(f"  goals: grounded >= 1.8: {ours >= 1.8}; chat >= 0.95: "
          f"{runs['chat']['speedup_vs_ar'] >= 0.95}; outputs equal AR: "
          f"{runs['grounded']['matches_ar'] and runs['chat']['matches_ar']}")
    print(f"  host time of one lookup (host_lookup_s): {per_lookup_s * 1e6:.1f} us "
          "(median over the grounded run's lookups)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
