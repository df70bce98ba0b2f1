"""What prompt lookup's siblings buy on the grounded prompts (``tree --draft ngram``).

    python benchmarks/bench_tree_lookup.py [--max-new-tokens 32]

Greedy outputs do not depend on the draft, so for a fixed prompt set every
lookup setting's steps follow from the AR outputs: this decodes them once
(SmolLM2-135M, the grounded prompts), then replays each setting's lookups over
them (``policies.ngram.siblings``; the walk keeps the branch that agrees longest
with the output) and prints tokens per step and a speedup estimate priced as in
docs/ngram.md, "Choosing the defaults": one pass plus a fifth of a pass per
verified position (cpu-local's measured verify widths). Also prints how many
steps found a sibling at all.
"""

from __future__ import annotations

import argparse

from executors.prompts import encode, load
from executors.session import Options, Session
from policies.ngram import siblings

POSITION_COST = 0.2  # a verified position's cost in one-token passes (cpu-local)
SETTINGS = [(4, 3, 1, 10), (4, 3, 3, 16), (4, 2, 1, 10), (4, 2, 3, 20), (3, 1, 1, 10),
            (3, 1, 3, 16), (3, 1, 4, 30)]  # n, n_min, width, nodes; depth 10
DEPTH = 10


def ar_outputs(tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, AR greedy outputs) of the grounded prompts."""
    with Session("cpu-local", "smollm2-135m", None, seed=0,
                 options=Options(mode="inline", max_new_tokens=tokens)) as s:
        vocab = s.specs["target"].vocab
        prompts = [encode(m, s.tokenizer, vocab) for m in load("grounded")]
        return prompts, [s.decode("ar", {}, [p]).generated[0][:tokens] for p in prompts]


def replay(prompts, outputs, n: int, n_min: int, width: int, nodes: int) -> dict:
    """Steps, tokens, cost in passes and steps with a sibling of one setting."""
    steps = tokens = branched = 0
    cost = 0.0
    for prompt, out in zip(prompts, outputs):
        seq, done = list(prompt), 0
        while done < len(out):
            runs = siblings(seq, len(prompt), gamma=DEPTH, width=width, nodes=nodes,
                            n=n, n_min=n_min)
            best = max((_agree(r, out[done:]) for r in runs), default=0)
            take = min(best + 1, len(out) - done)
            seq += out[done:done + take]
            done += take
            steps, tokens, branched = steps + 1, tokens + take, branched + (len(runs) > 1)
            cost += 1 + POSITION_COST * sum(map(len, runs))
    return {"steps": steps, "tokens": tokens, "cost": cost, "branched": branched}


def _agree(run: list[int], rest: list[int]) -> int:
    k = 0
    while k < len(run) and k < len(rest) and run[k] == rest[k]:
        k += 1
    return k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="tokens each AR output holds (default 32)")
    args = parser.parse_args()
    prompts, outputs = ar_outputs(args.max_new_tokens)
    print("| n | n_min | width | nodes | tokens/step | estimated speedup | steps with "
          "a sibling |")
    print("|---|---|---|---|---|---|---|")
    for n, n_min, width, nodes in SETTINGS:
        r = replay(prompts, outputs, n, n_min, width, nodes)
        print(f"| {n} | {n_min} | {width} | {nodes} | {r['tokens'] / r['steps']:.2f} | "
              f"{r['tokens'] / r['cost']:.2f} | {r['branched']} of {r['steps']} |")


if __name__ == "__main__":
    main()
