"""Arguments shared by the commands that configure a run (simulate, run, ...)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Collection

from analyses.run.config import (MAX_BATCH, MAX_TOKENS, RUN_KEYS, RunConfig, parse_placement,
                                 parse_sets, split_sets)
from hwprofiles.loader import printable
from policies import entry, names

# how each run option is written (RUN_KEYS describes them)
RUN_EXAMPLES = {"contention": "contention=on", "prompt_tokens": "prompt_tokens=128",
                "weight_bits": "weight_bits=4|8|16|32", "kv_bits": "kv_bits=4|8|16|32",
                "compute_bits": "compute_bits=8|16",
                "memory_check": "memory_check=off", "expert_parallel": "expert_parallel=on",
                "prefill_chunk": "prefill_chunk=512", "stack": "stack=hf-eager"}


# Tokens generated per sequence when --tokens is not given: one default for the
# simulated commands (simulate, compare); a measured run's is smaller (real decoding
# on a CPU runs at tens of tokens a second).
SIM_TOKENS = 1000


def add_run_arguments(p, *, tokens_default: int = SIM_TOKENS,
                      token_flags: tuple[str, ...] = ("--tokens",), tokens_type=int,
                      measured: bool = False) -> None:
    """The options of a run; a ``measured`` one (hetspec run) offers no acceptance
    model (its acceptance is the models' own; given anyway, it is refused)."""
    p.add_argument("--platform", required=True, help="shipped platform name or YAML path "
                   "(see 'hetspec profiles list')")
    p.add_argument("--target", required=True, help="target model name or YAML path")
    p.add_argument("--draft", help="draft model name or YAML path (separate-draft "
                                   "schedules), or ngram: prompt lookup on the host, no "
                                   "model (--policy sd: --set n, n_min, search, gamma; "
                                   "--policy tree: its continuations as siblings, --set "
                                   "width, depth, nodes)")
    p.add_argument("--policy", default="sd", help=f"schedule: {', '.join(names())} "
                   "(default: sd)")
    set_help = ("policy parameter (gamma=5; --policy tree: tree=4,2,2,1, or width=4 "
                "depth=5 nodes=32, rank_alphas=0.6,0.2), acceptance model (alpha=0.8, "
                "alphas=0.9,0.8, histogram=0.2,0.3,0.5, trace=PATH) or run option "
                f"({', '.join(RUN_EXAMPLES[k] for k in RUN_KEYS)}); repeat; every key is "
                "listed below; an unknown key is refused with the policy's valid keys")
    if measured:
        set_help = ("policy parameter (gamma=5, draft_layers=15, ...) or run option; "
                    "repeat; every key is listed below")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help=set_help)
    p.add_argument("--acceptance", help=argparse.SUPPRESS if measured else
                   "acceptance model kind (iid, positional, histogram, trace); normally "
                   "implied by the --set keys")
    p.add_argument(*token_flags, dest="tokens", type=tokens_type, default=tokens_default,
                   help=f"tokens to generate per sequence (default {tokens_default}; at "
                        f"most {MAX_TOKENS:,}, far beyond real outputs, so that a typo "
                        "cannot start an hours-long run)")
    p.add_argument("--batch", type=int, default=1,
                   help=f"sequences decoded together (at most {MAX_BATCH:,}, above any "
                        "serving batch)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed, an integer >= 0 (same seed, same output)")
    p.add_argument("--placement", help="role=device overrides, e.g. draft=gpu4,target=target_tp")
    if not measured:
        add_stack_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


STACK_HELP = ("software stack the hardware runs under: what the framework adds per "
              "layer, per call and per host sync (compiled, the default, adds nothing: "
              "torch.compile / CUDA graphs, what the shipped GPU profiles are fitted to; "
              "hf-eager: Hugging Face transformers generate, eager; llama.cpp); a shipped "
              "name or a stack YAML path (see 'hetspec profiles list')")


def add_stack_argument(p) -> None:
    """--stack NAME: the software stack a simulation is priced under."""
    p.add_argument("--stack", help=STACK_HELP)


def with_stack(args, run: dict) -> dict:
    """The run options with --stack in them (given beside --set stack=, refused)."""
    stack = getattr(args, "stack", None)
    if stack is None:
        return run
    if "stack" in run:
        raise ValueError("--stack and --set stack= both name a stack; keep one")
    return {**run, "stack": stack}


def config_from_args(args, **overrides) -> RunConfig:
    params, acc, run = split_sets(args.policy, parse_sets(args.sets), args.acceptance)
    run = with_stack(args, run)
    fields = dict(platform=args.platform, target=args.target, draft=args.draft,
                  policy=args.policy, params=params, acceptance=acc, tokens=args.tokens,
                  batch=args.batch, seed=args.seed,
                  placement=parse_placement(args.placement), **run)
    fields.update(overrides)
    return RunConfig(**fields)


class SettingsHelp(argparse.RawDescriptionHelpFormatter):
    """A raw-formatted help whose epilog may be a function, called only when the
    help is printed: ``settings_help`` lists every schedule's --set keys, which
    imports every schedule's module, and a run needs only its own."""

    def add_text(self, text):
        super().add_text(text() if callable(text) else text)


def settings_help(width: int = 88, *, simulated_only: Collection[str] | None = None) -> str:
    """Every --set key, generated from the parameter models: per policy each key
    with its default, range and one line; then the acceptance and run keys. A
    measured run's help passes the run keys it cannot take (``simulated_only``,
    ``analyses.measured.evidence.SIMULATED_ONLY``) and lists no acceptance model."""
    def wrap(text: str, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width=width, initial_indent=indent,
                             subsequent_indent=indent + "    ")

    out = ["--set keys of each policy (KEY=DEFAULT [RANGE]: what it sets):"]
    for name in names():
        out.append(f"  {name}:")
        for key, field in entry(name).params.model_fields.items():
            out.append(wrap(f"{key}={_default(field.default)}{_bounds(field.metadata)}: "
                            f"{field.description or ''}", "    "))
    if simulated_only is not None:
        out.append("run options (a measured run's acceptance is the models' own):")
        out += [wrap(f"{RUN_EXAMPLES[k]}: {t}", "    ") for k, t in RUN_KEYS.items()
                if k not in simulated_only and k != "stack"]
        return "\n".join(out)
    out.append("acceptance model (one kind per run; default alpha=0.8, i.i.d.):")
    for key, example in (("alpha", "alpha=0.8: each draft token accepted with this "
                                   "probability, independently"),
                         ("alphas", "alphas=0.9,0.8,0.7: acceptance per draft position"),
                         ("histogram", "histogram=0.2,0.3,0.5: probabilities of 0, 1, 2, "
                                       "... accepted tokens"),
                         ("trace", "trace=PATH: the acceptance.jsonl a measured run "
                                   "recorded")):
        out.append(wrap(example, "    "))
    out.append("run options:")
    for key, text in RUN_KEYS.items():
        out.append(wrap(f"{RUN_EXAMPLES[key]}: {text}", "    "))
    return "\n".join(out)


def _default(value) -> str:
    return "unset" if value is None else str(value).lower() if isinstance(
        value, bool) else str(value)


def _bounds(metadata) -> str:
    """' [1..64]', ' [>=1]', ' [>0]' from a field's annotated-types bounds."""
    found = {a: getattr(m, a) for m in metadata for a in ("ge", "gt", "le", "lt")
             if hasattr(m, a)}
    if "ge" in found and "le" in found:
        return f" [{found['ge']}..{found['le']}]"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    text = ", ".join(f"{signs[a]}{v}" for a, v in found.items())
    return f" [{text}]" if text else ""


def announce(path, what: str, *, json_mode: bool) -> None:
    """'wrote PATH (what)' for every file a command writes: on stdout with the text
    output, on stderr under --json (stdout then holds one JSON object)."""
    print(f"wrote {printable(str(path))} ({what})", file=sys.stderr if json_mode else sys.stdout)


def paragraph(text: str, width: int = 79) -> str:
    """A description wrapped for a raw-formatted --help."""
    return textwrap.fill(" ".join(text.split()), width=width)
