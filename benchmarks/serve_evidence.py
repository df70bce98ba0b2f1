"""Speculation under load, measured against predicted, for two sources held out of
every fit:

1. the vLLM team's Llama-3-70B measurements against request rate
   (hwprofiles/data/published/serving/vllm-blog-2024-spec-decode.yaml) beside
   hetspec serve's prediction of the same sweep;
2. SpecDecode-Bench's draft-model curves against offline batch (the published
   rows of hwprofiles/data/published/specdecode-bench-sd.yaml), each batch served
   as N requests all sent at once by N clients (``--concurrency N --requests N``),
   the speedup the ratio of the two engines' throughputs.

    python benchmarks/serve_evidence.py [--requests 400] [--markdown]

The source states neither the draft's acceptance nor the prompt and output
lengths, so nothing is fitted to it: the prediction is printed for a band of
acceptances (alpha 0.6, 0.7, 0.8) on the chat workload (the Azure conversation
trace's lengths), with the draft model series' own setting (k=4, Llama-3-70B on
four H100s, a 0.5B draft: hetspec's qwen3-0.6b, on the target's GPUs, the vllm
stack). Judged: the sign of the gain at each rate and the rate where it ends.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from analyses.calibrate.published import load_published, shipped_folder
from analyses.calibrate.series import Series
from analyses.compare.serving import compare_serving, crossovers
from analyses.serve.api import ServeConfig, serve

SOURCE = (Path(__file__).resolve().parents[1] / "hwprofiles" / "data" / "published" / "serving"
          / "vllm-blog-2024-spec-decode.yaml")
ALPHAS = (0.6, 0.7, 0.8)
# The n-gram series' lookup, a priori: the match and alpha hetspec run fitted on the
# README tour's prompt-lookup run (SmolLM2-135M, the grounded prompts: summarise,
# extract, correct), the nearest measured lookup to CNN/DailyMail summaries we have.
LOOKUP = {"match": 0.342, "alpha": 0.962}


def measured_crossover(rows: list[dict]) -> float | None:
    for a, b in zip(rows, rows[1:]):
        if a["speedup"] > 1 >= b["speedup"]:
            return a["load"] + (a["speedup"] - 1) / (a["speedup"] - b["speedup"]) * (
                b["load"] - a["load"])
    return None


def predict(alpha: float, rates: list[float], requests: int, *, draft: str = "qwen3-0.6b",
            sets: dict | None = None, workload: str = "chat") -> dict:
    configs = {policy: ServeConfig.build(
        platform="h100-sxm-8x", target="llama-3.1-70b",
        draft=None if policy == "ar" else draft, policy=policy,
        sets={"alpha": alpha, **({"gamma": 4, **(sets or {})} if policy == "sd" else {})},
        placement={"target": "tp4"}, rate=rates[0], requests=requests, seed=1,
        workload=workload)
        for policy in ("ar", "sd")}
    found = compare_serving(configs, rates, jobs=1, quiet=True)
    return crossovers(found.figures, rates)[0]


BATCH_SOURCE = "specdecode-bench-sd"


def served_throughput(row, policy: str, batch: int) -> float:
    """Output tokens/s of ``batch`` requests of the row's lengths, all sent at once
    (an offline batch), served by ``policy`` (the row's, or AR) in the
    deterministic engine on the row's platform, placement and stack."""
    speculative = policy == row.policy
    config = ServeConfig.build(
        platform=row.platform, target=row.target,
        draft=row.draft if speculative else None, policy=policy,
        sets={**(row.params if speculative else {}),
              **{k: v for k, v in row.acceptance.items() if k != "kind"}},
        placement={k: v for k, v in row.placement.items()
                   if speculative or k != "draft"},
        stack=row.stack, deterministic=True, concurrency=batch, requests=batch,
        prompt_tokens=row.prompt_tokens, output_tokens=row.tokens)
    return serve(config).metrics["throughput_tokens_per_s"]


def batch_series() -> list[Series]:
    """SpecDecode-Bench's curves, each batch served as an offline batch; one serving
    run per distinct setting (the curves of one pair share theirs)."""
    rows = [r for r in load_published(shipped_folder())
            if r.source_id == BATCH_SOURCE and r.series is not None]
    served: dict[tuple, float] = {}
    predicted: dict[str, float] = {}
    for r in rows:
        key = (r.platform, r.target, r.draft, r.stack, r.prompt_tokens, r.tokens,
               repr(sorted(r.params.items())), repr(sorted(r.acceptance.items())),
               repr(sorted(r.placement.items())), r.batch)
        if key not in served:
            served[key] = (served_throughput(r, r.policy, r.batch)
                           / served_throughput(r, "ar", r.batch))
        predicted[r.id] = served[key]
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(r.series, []).append(r)
    out = []
    for name, mine in sorted(groups.items()):
        mine.sort(key=lambda r: r.batch)
        out.append(Series(BATCH_SOURCE, name, tuple(r.id for r in mine),
                          tuple(r.batch for r in mine), tuple(r.speedup for r in mine),
                          tuple(predicted[r.id] for r in mine)))
    return out


def print_batch_series(markdown: bool) -> None:
    found = batch_series()
    header = ["series", "batch", "measured", "served by hetspec", "error",
              "crosses 1 at: measured", "hetspec", "within 2x"]

    def cross(x):
        return "none to 128" if x is None else f"{x:.3g}"

    lines = []
    for s in found:
        lines.append([s.name, " / ".join(map(str, s.batches)),
                      " / ".join(f"{m:.2f}" for m in s.measured),
                      " / ".join(f"{p:.2f}" for p in s.predicted),
                      " / ".join(f"{e:+.0%}" for e in s.errors),
                      cross(s.measured_crossover), cross(s.predicted_crossover),
                      s.crossover_verdict])
    print(f"\n{BATCH_SOURCE}: offline batches served (--concurrency N --requests N)")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in lines:
            print("  ".join(line))
    signs = sum((p > 1) == (m > 1) for s in found for p, m in zip(s.predicted, s.measured))
    rows = sum(len(s.measured) for s in found)
    crossed = [s for s in found if s.measured_crossover is not None]
    print(f"sign of the gain right at {signs}/{rows} batches; {sum(s.within for s in found)}"
          f"/{len(found)} curves within 20% at every batch; measured crossovers "
          + ", ".join(f"{s.name} {s.measured_crossover:.3g} (predicted "
                      f"{cross(s.predicted_crossover)}, within 2x: {s.crossover_verdict})"
                      for s in crossed))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    source = yaml.safe_load(SOURCE.read_text())
    rows = [r for r in source["rows"] if r["series"] == "draft-sharegpt"]
    rates = [float(r["load"]) for r in rows]
    predicted = {a: predict(a, rates, args.requests) for a in ALPHAS}
    header = ["rate (req/s)", "measured", *(f"alpha {a}" for a in ALPHAS)]
    lines = [header]
    for i, r in enumerate(rows):
        lines.append([f"{r['load']:g}", f"{r['speedup']:.2f}x",
                      *(f"{predicted[a]['speedup'][i]:.2f}x" for a in ALPHAS)])
    cross = measured_crossover(rows)
    lines.append(["stops paying at", f"{cross:.3g}/s" if cross else "never",
                  *(f"{predicted[a]['rate']:.3g}/s" if predicted[a]["rate"] else "never"
                    for a in ALPHAS)])
    signs = {a: sum((p > 1) == (r["speedup"] > 1) for p, r in zip(predicted[a]["speedup"], rows))
             for a in ALPHAS}
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
    else:
        for line in lines:
            print("  ".join(f"{c:>15}" for c in line))
    ngram_rows = [r for r in source["rows"] if r["series"] == "ngram-cnndm"]
    ngram_rates = [float(r["load"]) for r in ngram_rows]
    lookup = predict(LOOKUP["alpha"], ngram_rates, args.requests, draft="ngram",
                     sets={"match": LOOKUP["match"]}, workload="summarisation")
    print(f"n-gram series (CNN/DailyMail; summarisation lengths, lookup match "
          f"{LOOKUP['match']}, alpha {LOOKUP['alpha']}): "
          + ", ".join(f"{r['load']:g}/s measured {r['speedup']:.2f}x predicted {p:.2f}x"
                      for r, p in zip(ngram_rows, lookup["speedup"]))
          + f"; crossover measured {measured_crossover(ngram_rows):.3g}/s, predicted "
          + (f"{lookup['rate']:.3g}/s" if lookup["rate"] else "none up to "
             f"{ngram_rates[-1]:g}/s"))
    print(f"sign of the gain right at {', '.join(f'{signs[a]}/{len(rows)} rates (alpha {a})' for a in ALPHAS)}; "
          f"measured crossover {cross:.3g} requests/s, predicted "
          + ", ".join(f"{predicted[a]['rate']:.3g}" if predicted[a]["rate"] else "none"
                      for a in ALPHAS))
    print_batch_series(args.markdown)


if __name__ == "__main__":
    main()
