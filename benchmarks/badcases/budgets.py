"""Class 2, budgets (review N2, N3, N9's cs08): every command estimates its work
before it starts and refuses work over its budget unless --allow-large
(analyses/run/budget.py). Each refusal comes before any heavy work (a grid's
validation, a model's load, a spans file's parse), in well under 10 s.

Edges: the simulate budget is 240,000,000 row-steps; AR on smollm2-135m at
--batch 16384 estimates 239,994,896 for 14,591 tokens and 240,011,344 for 14,592
(with --fixed-context, which keeps the 128-token prompt's context within the
model's 8,192 positions).
The run budget is 1,000 generated tokens; the replay budget 50,000 spans.
"""

from __future__ import annotations

import json
from pathlib import Path

H100 = ("simulate --platform h100-sxm-5x --target llama-3.1-70b --draft llama-3.2-1b "
        "--policy")
CPU = "simulate --platform cpu-local --target smollm2-135m --policy"
OFF = "--set memory_check=off"
N2 = ("compare --platform cpu-local --target smollm2-135m --draft none --policies ar,sd "
      "--set draft_layers=15 --tokens 50 --jobs 1 -o out.html --sweep gamma=1..64 "
      "--sweep alpha=0.01..0.99:0.01 --sweep prompt_tokens=1..100")
CMP = ("compare --platform cpu-local --target smollm2-135m --draft none --policies ar,sd "
       "--set draft_layers=15 --jobs 1 -o out.html")
RUN = ("run --platform cpu-local --target smollm2-135m --policy sd --set draft_layers=15 "
       "--inline --out run_b")
PUBLISHED = Path(__file__).resolve().parents[2] / "hwprofiles" / "data" / "published" / \
    "measurements.yaml"

CASES = [
    # simulate: the caps together (N3) and each term of the estimate
    ("b01", "N3: tokens and batch both at their caps (memory_check off)",
     f"{H100} sd --tokens 1000000 --batch 16384 {OFF}"),
    ("b02", "N3 with the memory check on", f"{H100} sd --tokens 1000000 --batch 16384"),
    ("b03", "tokens at the cap, gamma 64, alpha 0.01 (a step per token)",
     f"{H100} sd --tokens 1000000 --set gamma=64 --set alpha=0.01"),
    ("b04", "batch at the cap, 20,000 tokens", f"{H100} sd --tokens 20000 --batch 16384 {OFF}"),
    ("b05", "tree of 1024 nodes, depth 32, 100,000 tokens",
     f"{H100} tree --set nodes=1024 --set depth=32 --set width=32 --tokens 100000 {OFF}"),
    ("b06", "ssd k=32 fanout=64 at batch 4096",
     f"{H100} ssd --set k=32 --set fanout=64 --set hit_rate=0.7 --batch 4096 --tokens 10000 "
     f"{OFF}"),
    ("b07", "AR at both caps", f"{CPU} ar --tokens 1000000 --batch 16384 {OFF}"),
    ("b08", "budget edge: AR at batch 16384, 14,592 tokens (just over)",
     f"{CPU} ar --tokens 14592 --batch 16384 --fixed-context {OFF}"),
    ("b09", "mirror gamma 64 at a million tokens",
     "simulate --platform m2-ultra-8x --target qwen3-32b --draft qwen3-0.6b --policy mirror "
     "--set gamma=64 --tokens 1000000"),
    ("b10", "streaming one layer at a time for a million tokens",
     "simulate --platform snapdragon-8-gen3 --target llama-3-8b --policy ar_stream "
     "--set dram_budget_gb=2 --tokens 1000000"),
    ("b11", "sd at batch 16384 with a trace and a record asked for (nothing written)",
     f"{H100} sd --tokens 100000 --batch 16384 {OFF} --trace t.json --record r.json"),
    # compare: the grid's product (N2), never built to be counted
    ("b12", "N2: 633,600-point grid x 2 policies", N2),
    ("b13", "a 1e9-point grid (three 1000-value sweeps)",
     f"{CMP} --tokens 50 --sweep alpha=0.001..1:0.001 --sweep prompt_tokens=1..1000 "
     "--sweep gamma=1..1000"),
    ("b14", "cs08: a sweep of 1e180 values (no 180-digit count)",
     f"{CMP} --tokens 50 --sweep gamma=1..1e180"),
    ("b15", "a sweep whose range overflows to infinity",
     f"{CMP} --tokens 50 --sweep alpha=-1e308..1e308:1e-300"),
    ("b16", "cs05's 10,000 alphas at 1000 tokens",
     f"{CMP} --tokens 1000 --sweep alpha=0.0001..1:0.0001"),
    ("b17", "the default compare at a million tokens",
     "compare --tokens 1000000 -o out.html --jobs 1"),
    ("b18", "gamma sweep at batch 16384", f"{CMP} --tokens 2000 --batch 16384 --sweep gamma=2..8"),
    ("b19", "every policy over 10,000 prompt lengths",
     "compare --tokens 200 -o out.html --jobs 1 --sweep prompt_tokens=1..10000"),
    ("b20", "compare --runs over a run of 60,000 spans",
     f"{CMP} --tokens 50 --runs <runs:b_spans_60k>"),
    ("b21", "10,000 x 100 grid of one policy (a million points)",
     f"compare --platform cpu-local --target smollm2-135m --draft none --policies ar "
     f"--tokens 50 -o out.html --sweep alpha=0.0001..1:0.0001 --sweep prompt_tokens=1..100"),
    # replay: the record's spans, counted before parsing
    ("b22", "replay a run of 60,000 spans", "replay <run:b_spans_60k>/record.json --trace rt.json"),
    ("b23", "budget edge: replay a run of 50,001 spans",
     "replay <run:b_spans_50001>/record.json --trace rt.json"),
    ("b24", "replay a record whose run asked a million tokens a prompt at batch 16384",
     "replay <run:b_tokens_caps>/record.json --trace rt.json"),
    # run: prompts x new tokens x runs, before the model loads
    ("b25", "run a million new tokens a prompt", f"{RUN} --max-new-tokens 1000000"),
    ("b26", "budget edge: 4 prompts x 126 tokens x 2 runs = 1,008", f"{RUN} --max-new-tokens 126"),
    ("b27", "budget edge: 1,001 prompts of 1 token, no baseline",
     f"{RUN} --prompts <b_prompts_1001.jsonl> --max-new-tokens 1 --no-baseline"),
    ("b28", "10,000 prompts x 64 tokens", f"{RUN} --prompts <b_prompts_10k.jsonl> --max-new-tokens 64"),
    ("b29", "--tokens at its cap as the new tokens", f"{RUN} --tokens 1000000"),
    ("b30", "a real model at 500 tokens a prompt, the baseline skipped",
     f"{RUN} --max-new-tokens 500 --no-baseline"),
    # calibrate: spans of the runs, or published rows x fit evaluations
    ("b31", "calibrate on a folder holding a run of 60,000 spans",
     "calibrate --profile cpu-local --runs <runs:b_spans_60k> -o cal.yaml"),
    ("b32", "calibrate on published rows of 100,000 tokens at batch 16384",
     "calibrate --published <b_pub_big.yaml> --profile a100-sxm-8x -o cal.yaml"),
    # accepted: --allow-large on work that is small, and the budget's edge from below
    ("b33", "simulate a small run with --allow-large", f"{CPU} sd --set draft_layers=15 "
     "--tokens 50 --allow-large"),
    ("b34", "compare a small grid with --allow-large",
     f"{CMP} --tokens 50 --sweep gamma=2..3 --allow-large"),
    ("b35", "replay the base run with --allow-large",
     "replay <run:good>/record.json --trace rt.json --allow-large"),
    ("b36", "calibrate the shipped A100 rows with --allow-large",
     "calibrate --published shipped --profile a100-sxm-8x -o cal.yaml --allow-large"),
    ("b37", "budget edge: AR at batch 16384, 14,591 tokens (just under)",
     f"{CPU} ar --tokens 14591 --batch 16384 --fixed-context {OFF}"),
    ("b38", "a 1e9-point grid with --allow-large is still refused by the per-key cap",
     f"{CMP} --tokens 50 --sweep gamma=1..1e180 --allow-large"),
]
ACCEPT = ("b33", "b34", "b35", "b36", "b37")


def spans_lines(count: int):
    """The base run's spans repeated to ``count`` lines."""
    def corrupt(run: Path) -> None:
        rows = (run / "spans.jsonl").read_text().splitlines()
        rows = [r for r in rows if r.strip()]
        (run / "spans.jsonl").write_text(
            "".join(rows[i % len(rows)] + "\n" for i in range(count)))
    return corrupt


def prompts(count: int):
    def build(path: Path) -> None:
        path.write_text(''.join(json.dumps([{"role": "user", "content": f"prompt {i}"}])
                                + "\n" for i in range(count)))
    return build


def published_big(path: Path) -> None:
    """The shipped published rows, each at 100,000 tokens and batch 16384."""
    import yaml

    data = yaml.safe_load(PUBLISHED.read_text())
    for row in data["measurements"]:
        row.update(tokens=100_000, batch=16_384)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def register(h) -> None:
    h.CASES_TABLE += CASES
    h.VARIANTS.update({
        "b_spans_60k": spans_lines(60_000),
        "b_spans_50001": spans_lines(50_001),
        "b_tokens_caps": h.record({"inputs.max_new_tokens": 1_000_000,
                                   "inputs.tokens": 1_000_000, "inputs.batch": 16_384}),
    })
    h.FIXTURES.update({"b_prompts_1001.jsonl": prompts(1001),
                       "b_prompts_10k.jsonl": prompts(10_000),
                       "b_pub_big.yaml": published_big})
    h.EXPECT.update({case: "accept" for case in ACCEPT})
