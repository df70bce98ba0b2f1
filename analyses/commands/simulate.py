"""hetspec simulate: one schedule on one platform in the discrete-event simulator."""

from __future__ import annotations

from analyses.cli import (SettingsHelp, add_run_arguments, announce, config_from_args, emit_json,
                         settings_help)
from analyses.commands import COMMANDS
from analyses.run.api import simulate
from analyses.run.budget import SIM_BUDGET_UNITS, allow_large_argument, check_simulation, readable
from analyses.run.config import parse_sets
from analyses.run.outputs import check_outputs, profile_inputs, set_inputs
from hwprofiles import DEFAULT_STACK
from policies.runs.breakdown import LABELS, sentence
from policies.traces import read_acceptance


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help=COMMANDS["simulate"],
        description="Simulate a decoding schedule on a platform with a target (and draft)\n"
                    "model. Prints tokens/s, step latency and the speedup over\n"
                    "autoregressive decoding simulated on the same platform.",
        formatter_class=SettingsHelp,
        epilog=lambda: settings_help() + "\n\nexample: hetspec simulate --platform h100-sxm-5x "
               "--target llama-3.1-70b --draft llama-3.2-1b \\\n    --policy sd --set gamma=5 "
               "--set alpha=0.8 --tokens 2000 --seed 1 --json")
    add_run_arguments(p)
    p.add_argument("--deterministic", action="store_true",
                   help="no randomness: expected outcomes (for checking the laws)")
    p.add_argument("--fixed-context", action="store_true",
                   help="every step sees prompt_tokens of context (the laws' steady state)")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace (open in Perfetto)")
    p.add_argument("--record", metavar="PATH", help="write the run record (JSON)")
    allow_large_argument(p, f"{readable(SIM_BUDGET_UNITS)} row-steps, tokens x batch x "
                            "operations a step, the run and its AR baseline together, "
                            "about 10 minutes on one CPU core")
    p.set_defaults(func=_simulate, seed=None)  # None: not given (0), see _seed


def _seed(args) -> None:
    """--seed picks the draws of a run's outcomes; --deterministic makes none (its
    outcomes are expectations), so the two together are refused."""
    if args.seed is not None and args.deterministic:
        raise ValueError(f"--seed {args.seed} has no effect with --deterministic (its "
                         "outcomes are expectations, nothing is drawn); drop one")
    args.seed = 0 if args.seed is None else args.seed


def _simulate(args) -> int:
    _seed(args)
    config = config_from_args(args, deterministic=args.deterministic,
                              fixed_context=args.fixed_context)
    check_outputs({"--trace": args.trace, "--record": args.record},
                  profile_inputs(platform=args.platform, target=args.target,
                                 draft=args.draft) + set_inputs(parse_sets(args.sets)),
                  names={"--trace": "trace.json", "--record": "record.json"})
    check_simulation(config, args.allow_large)
    out = simulate(config, trace_path=args.trace, record_path=args.record)
    if args.json:
        emit_json(out.metrics)
    else:
        m = out.metrics
        batch = f" x batch {config.batch}" if config.batch > 1 else ""
        stack = "" if config.stack == DEFAULT_STACK else f" under stack {config.stack}"
        print(f"{config.policy} on {config.platform}{stack} ({config.tokens:,} tokens{batch}): "
              f"{m['tokens_per_s']:.1f} tokens/s, "
              f"{m['mean_tokens_per_step']:.2f} tokens/step, step "
              f"{m['step_latency_s'] * 1e3:.3f} ms, speedup vs AR "
              f"{m['speedup_vs_ar']:.2f}x")
        print(f"  {config.prompt_tokens}-token prompt: time to first token "
              f"{_ms(m['ttft_s'])} (prefill {_ms(m['prefill_s'])}), "
              f"{_ms(m['tpot_s'])} per output token")
        print_breakdown(config.policy, m.get("breakdown"), m.get("operators"))
        print_operators(m.get("operators"), m["tokens"] / config.batch)
        note = trace_note(config, m)
        if note:
            print(f"  note: {note}")
    for path, what in ((args.trace, "Chrome trace, open in Perfetto"),
                       (args.record, "run record")):
        if path:
            announce(path, what, json_mode=args.json)
    return 0


def trace_note(config, metrics: dict) -> str:
    """A sentence when the run read another part of its acceptance trace than the
    whole: the first steps of a longer trace (a measured run's first prompts), or
    the trace again from its start."""
    if getattr(config.acceptance, "kind", None) != "trace":
        return ""
    lines = [d for d in read_acceptance(config.acceptance.path) if "accepted" in d]
    batches = len({d.get("prompt_batch", 0) for d in lines})
    rows = max(len(lines[0]["accepted"]), 1)
    tokens = sum(sum(d.get("committed") or [a + 1 for a in d["accepted"]]) for d in lines)
    held = (f"the acceptance trace holds {len(lines):,} steps"
            + (f" over {batches} prompt batches" if batches > 1 else "")
            + f" ({tokens // rows:,} tokens a row)")
    steps = metrics.get("steps", 0)
    if steps < len(lines):
        return (f"{held}; this run read its first {steps:,}: --tokens {tokens // rows:,} "
                "reads it all, and hetspec replay RECORD replays a measured run prompt "
                "batch by prompt batch")
    if steps > len(lines):
        return f"{held}; this run read it {steps / len(lines):.1f} times over, from the start"
    return ""


def print_breakdown(policy: str, parts: dict | None, operators: list | None = None) -> None:
    """Why: one sentence (whether its largest operation is compute-bound, from the
    ``operators`` table), then each cost's time per output token on the critical
    path, then each device's utilisation."""
    if not parts:
        return
    print(f"  why: {sentence(policy, parts, operators)}")
    costs = ", ".join(f"{LABELS[c]} {t * 1e3:.3g} ms" for c, t in sorted(
        parts["per_token_s"].items(), key=lambda kv: -kv[1]))
    print(f"  per output token: {costs}")
    busy = ", ".join(f"{d} {u:.0%}" for d, u in parts["utilisation"].items()
                     if not d.startswith("link:") or u >= 0.01)
    print(f"  device utilisation: {busy}")


def print_operators(rows: list | None, tokens: float, top: int = 6) -> None:
    """The longest operations: per output token, their time, count, and the
    fraction of the hardware's peak reached (FLOPs and bytes per device; --json
    has every row)."""
    if not rows or not tokens:
        return
    print(f"  {'operation':28} {'on':18} {'ms/token':>9} {'calls/token':>11} {'of peak':>8}")
    for r in rows[:top]:
        peak = "" if r["peak_fraction"] is None else f"{r['peak_fraction']:.0%}"
        print(f"  {r['operation'][:28]:28} {r['device'][:18]:18} "
              f"{r['time_s'] / tokens * 1e3:9.3g} {r['count'] / tokens:11.3g} {peak:>8}")


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"
