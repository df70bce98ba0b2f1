"""hetspec run: one schedule executed for real by the torch executor."""

from __future__ import annotations

from analyses.commands._common import add_run_arguments, config_from_args
from analyses.config import parse_placement


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run one schedule for real with torch on this machine's devices",
        description="Execute a decoding schedule with real models (SmolLM2-135M by default "
                    "on cpu-local; random:NAME for random weights of a profile's shape; or "
                    "a local Hugging Face checkpoint directory) and measure it. Writes a "
                    "run record, measured spans, a Chrome trace and an acceptance trace.",
        epilog="example: hetspec run --platform cpu-local --target smollm2-135m --policy sd "
               "--set gamma=4 --set draft_layers=15 --max-new-tokens 64 --seed 1 --json")
    add_run_arguments(p, tokens_default=64)
    p.add_argument("--prompts", metavar="FILE",
                   help="JSONL of chat messages, one prompt a line (default: 4 built-in)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens to generate per prompt (default: --tokens, 64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per device (1)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy (default)")
    p.add_argument("--inline", action="store_true",
                   help="run every device in this process, one after another, instead of "
                        "worker processes pinned to cores")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the autoregressive run that speedup_vs_ar compares with")
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/POLICY-...)")
    p.set_defaults(func=_run)


def split_placement(text: str | None) -> tuple[str, dict[str, str]]:
    """Separate physical overrides (cpu:N, cuda:N) from platform-device ones."""
    physical, rest = {}, []
    for role, where in parse_placement(text).items():
        if where.startswith(("cpu:", "cuda:")):
            physical[role] = where
        else:
            rest.append(f"{role}={where}")
    return ",".join(rest), physical


def _run(args) -> int:
    from analyses.cli import emit_json
    from executors.measure import measure
    from executors.prompts import load_jsonl
    from executors.session import Options

    max_new = args.max_new_tokens if args.max_new_tokens is not None else args.tokens
    if max_new < 1 or args.threads < 1:
        raise ValueError("--max-new-tokens and --threads must be at least 1")
    args.placement, physical = split_placement(args.placement)
    config = config_from_args(args, tokens=max_new)
    options = Options(max_new_tokens=max_new, threads=args.threads,
                      temperature=args.temperature,
                      mode="inline" if args.inline else "processes", physical=physical)
    messages = load_jsonl(args.prompts) if args.prompts else None
    out = measure(config, options, messages, out_dir=args.out,
                  baseline=not args.no_baseline, progress=True)
    if args.json:
        emit_json(out)
    else:
        speedup = out.get("speedup_vs_ar")
        print(f"{config.policy} measured on {config.platform}: {out['tokens_per_s']:.1f} "
              f"tokens/s, {out['mean_tokens_per_step']:.2f} tokens/step, step "
              f"{out['step_latency_s'] * 1e3:.2f} ms"
              + (f", speedup vs AR {speedup:.2f}x" if speedup else ""))
        print(f"run record: {out['run_record']}")
    return 0
