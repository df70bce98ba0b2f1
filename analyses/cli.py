"""The ``hetspec`` command line. It parses arguments and prints; every action
is a call into ``analyses.api`` (or the module a subcommand names).

Subcommands live in ``analyses/commands/``: each module defines
``register(subparsers)``, which adds its parser and sets ``func`` to a
function taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys

from pydantic import ValidationError

import analyses.commands


class UserError(Exception):
    """An error the user can fix; printed as one sentence, exit status 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    from hwprofiles import ProfileError
    from policies import PolicyError
    from simcore import CostError

    return (UserError, ProfileError, PolicyError, CostError, ValueError, ValidationError,
            FileNotFoundError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetspec",
        description="Which speculative-decoding schedule is fastest on this hardware, "
                    "and why. Simulate a hardware profile, run schedules for real, "
                    "calibrate, and compare policies.",
        epilog="Run 'hetspec COMMAND --help' for a command's options.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(m.name for m in pkgutil.iter_modules(analyses.commands.__path__)
                      if not m.name.startswith("_")):
        importlib.import_module(f"analyses.commands.{mod}").register(sub)
    return parser


def emit_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _one_sentence(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"field '{where}': {first['msg'].removeprefix('Value error, ')}"
    text = str(exc) or exc.__class__.__name__
    return text.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except user_errors() as exc:
        print(f"hetspec: error: {_one_sentence(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
