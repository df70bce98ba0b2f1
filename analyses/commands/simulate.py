"""hetspec simulate: one schedule on one platform in the discrete-event simulator."""

from __future__ import annotations

from analyses.commands._common import add_run_arguments, config_from_args
from analyses.run.budget import SIM_BUDGET_UNITS, allow_large_argument, readable


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="simulate one schedule on a hardware profile",
        description="Simulate a decoding schedule on a platform with a target (and draft) "
                    "model. Prints tokens/s, step latency and the speedup over "
                    "autoregressive decoding simulated on the same platform.",
        epilog="example: hetspec simulate --platform h100-sxm-5x --target llama-3.1-70b "
               "--draft llama-3.2-1b --policy sd --set gamma=5 --set alpha=0.8 "
               "--tokens 2000 --seed 1 --json")
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
    p.set_defaults(func=_simulate)


def _simulate(args) -> int:
    from analyses.run.api import simulate
    from analyses.cli import emit_json
    from analyses.run.budget import check_simulation
    from analyses.run.config import parse_sets
    from analyses.run.outputs import check_outputs, profile_inputs, set_inputs

    config = config_from_args(args, deterministic=args.deterministic,
                              fixed_context=args.fixed_context)
    check_outputs({"--trace": args.trace, "--record": args.record},
                  profile_inputs(platform=args.platform, target=args.target,
                                 draft=args.draft) + set_inputs(parse_sets(args.sets)))
    check_simulation(config, args.allow_large)
    out = simulate(config, trace_path=args.trace, record_path=args.record)
    if args.json:
        emit_json(out.metrics)
    else:
        m = out.metrics
        print(f"{config.policy} on {config.platform}: {m['tokens_per_s']:.1f} tokens/s, "
              f"{m['mean_tokens_per_step']:.2f} tokens/step, step "
              f"{m['step_latency_s'] * 1e3:.3f} ms, speedup vs AR "
              f"{m['speedup_vs_ar']:.2f}x")
        print(f"  {config.prompt_tokens}-token prompt: time to first token "
              f"{_ms(m['ttft_s'])} (prefill {_ms(m['prefill_s'])}), "
              f"{_ms(m['tpot_s'])} per output token")
    return 0


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"
