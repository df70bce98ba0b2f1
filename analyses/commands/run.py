"""hetspec run: one schedule executed for real by the torch executor."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from analyses.commands._common import add_run_arguments, config_from_args
from analyses.run.budget import RUN_TOKENS_BUDGET, allow_large_argument
from analyses.run.config import MAX_TOKENS, parse_placement

MIN_TEMPERATURE = 1e-3  # below it logits / temperature can overflow to inf (NaN probs)
MAX_THREADS = 1024


def count(upper: int):
    """argparse type: a whole number from 1 to ``upper``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number; give one "
                                             f"from 1 to {upper:,}") from None
        if not 1 <= value <= upper:
            raise argparse.ArgumentTypeError(f"{value} is outside 1..{upper:,}; give a "
                                             "number in that range")
        return value
    return parse


def temperature(text: str) -> float:
    """argparse type: 0 (greedy) or a finite temperature of at least MIN_TEMPERATURE."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not (value == 0 or value >= MIN_TEMPERATURE):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a sampling temperature; give 0 for greedy decoding or a "
            f"finite number of at least {MIN_TEMPERATURE:g}, e.g. 0.7")
    return value


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
    p.add_argument("--max-new-tokens", type=count(MAX_TOKENS), default=None,
                   help="tokens to generate per prompt (default: --tokens, 64)")
    p.add_argument("--threads", type=count(MAX_THREADS), default=1,
                   help="torch threads per device (1)")
    p.add_argument("--temperature", type=temperature, default=0.0,
                   help=f"sampling temperature: 0 is greedy (default), otherwise a "
                        f"finite number of at least {MIN_TEMPERATURE:g}")
    p.add_argument("--inline", action="store_true",
                   help="run every device in this process, one after another, instead of "
                        "worker processes pinned to cores")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the autoregressive run that speedup_vs_ar compares with")
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/POLICY-..."
                   "); created and checked writable before the models load")
    allow_large_argument(p, f"{RUN_TOKENS_BUDGET:,} generated tokens, prompts x "
                            "--max-new-tokens x 2 with the AR baseline, at most about 11 "
                            "minutes for SmolLM2-135M on one CPU core, hours for a "
                            "larger model")
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


# Run options only the simulator models: the executor runs the checkpoint at its
# own precision and sharding, and prefills the prompt in one pass; a measured run
# recording them would claim what it did not measure.
SIMULATED_ONLY = ("weight_bits", "kv_bits", "prefill_chunk", "expert_parallel")


def _measurable(config) -> None:
    for key in SIMULATED_ONLY:
        value = getattr(config, key)
        if value not in (None, False):
            raise ValueError(f"--set {key} is a simulated what-if that hetspec run cannot "
                             "measure (it runs the checkpoint at its own precision, one "
                             "prefill pass, no expert sharding); drop it, or use hetspec "
                             "simulate")


def _run(args) -> int:
    from analyses.cli import emit_json
    from analyses.run.budget import announce_estimate, check, run_estimate
    from executors.prompts import BUILTIN, load_jsonl

    max_new = args.max_new_tokens if args.max_new_tokens is not None else args.tokens
    if max_new < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    args.placement, physical = split_placement(args.placement)
    config = config_from_args(args, tokens=max_new)
    _measurable(config)
    messages = load_jsonl(args.prompts) if args.prompts else None
    # the budget before torch is imported and long before the models load
    estimate = check(run_estimate(len(messages or BUILTIN), max_new, not args.no_baseline),
                     args.allow_large, announce=False)
    from executors.measure import default_run_dir, measure
    from executors.session import Options

    options = Options(max_new_tokens=max_new, threads=args.threads,
                      temperature=args.temperature,
                      mode="inline" if args.inline else "processes", physical=physical)
    run_dir = Path(args.out) if args.out else default_run_dir(config.policy, config.seed)
    with prepared_run_dir(run_dir, run_dir_inputs(args)):
        announce_estimate(estimate)
        out = measure(config, options, messages, out_dir=run_dir,
                      baseline=not args.no_baseline, progress=True)
    if args.json:
        emit_json(out)
    else:
        speedup = out.get("speedup_vs_ar")
        print(f"{config.policy} measured on {config.platform}: {out['tokens_per_s']:.1f} "
              f"tokens/s, {out['mean_tokens_per_step']:.2f} tokens/step, step "
              f"{out['step_latency_s'] * 1e3:.2f} ms"
              + (f", speedup vs AR {speedup:.2f}x" if speedup else ""))
        if out.get("ttft_s") is not None:
            print(f"  time to first token {out['ttft_s'] * 1e3:.2f} ms (prefill "
                  f"{out['prefill_s'] * 1e3:.2f} ms), {out['tpot_s'] * 1e3:.2f} ms per "
                  "output token")
        print(f"run record: {out['run_record']}")
    return 0


RUN_FILES = ("record.json", "spans.jsonl", "acceptance.jsonl", "trace.json",
             "models/target.yaml", "models/draft.yaml")  # what a run writes


def run_dir_inputs(args) -> list:
    from analyses.run.config import parse_sets
    from analyses.run.outputs import profile_inputs, set_inputs

    inputs = profile_inputs(platform=args.platform, target=args.target, draft=args.draft)
    inputs += set_inputs(parse_sets(args.sets))
    if args.prompts:
        inputs.append(("the --prompts file", Path(args.prompts)))
    return inputs


class prepared_run_dir:
    """Create the run directory and check its files can be written, before the
    models load (a measured run is minutes; finding out after it is too late).
    Directories created here are removed again if the run fails before writing."""

    def __init__(self, run_dir: Path, inputs: list):
        self.run_dir, self.inputs, self.created = run_dir, inputs, []

    def __enter__(self):
        from analyses.run.outputs import check_outputs
        from policies.runs.records import check_writable

        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ValueError(f"--out {self.run_dir} exists and is not a directory; give "
                             "a new or an existing directory for the run")
        check_writable(self.run_dir / "record.json", "--out")
        check_outputs({f"--out file {name}": self.run_dir / name for name in RUN_FILES},
                      self.inputs)
        missing = self.run_dir
        while not missing.exists():
            self.created.append(missing)
            missing = missing.parent
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {self.run_dir} cannot be created ({exc.strerror}); "
                             "choose a writable directory") from None
        return self.run_dir

    def __exit__(self, exc_type, _exc, _tb):
        if exc_type is not None:
            for folder in self.created:  # innermost first; only if still empty
                try:
                    os.rmdir(folder)
                except OSError:
                    break
        return False
