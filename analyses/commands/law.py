"""hetspec law NAME --set key=value ..."""

from __future__ import annotations

import argparse
import inspect
import textwrap

from analyses.cli import emit_json
from analyses.commands import COMMANDS
from analyses.laws.forms import law, laws
from analyses.run.config import parse_sets


def law_description(name: str, fn) -> str:
    """One law for --help: its whole docstring as a paragraph, then its parameters
    (required ones bare, the others with their defaults)."""
    doc = " ".join((fn.__doc__ or "").split())
    params = []
    for key, param in inspect.signature(fn).parameters.items():
        default = param.default
        params.append(key if default is inspect.Parameter.empty
                      else f"{key}={'(derived)' if default is None else default}")
    body = textwrap.fill(doc, width=86, initial_indent="    ", subsequent_indent="    ")
    keys = textwrap.fill("parameters: " + ", ".join(params), width=86,
                         initial_indent="    ", subsequent_indent="      ")
    return f"  {name}\n{body}\n{keys}"


def register(sub) -> None:
    found = laws()
    lines = "\n\n".join(law_description(name, fn) for name, fn in found.items())
    p = sub.add_parser("law", help=COMMANDS["law"],
                       description="Evaluate one schedule's closed-form law, as its paper\n"
                                   "states it. Pass each parameter with --set KEY=VALUE; a\n"
                                   "parameter with a default may be left out.\n\n" + lines,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example: hetspec law leviathan --set alpha=0.8 "
                              "--set gamma=5 --set c=0 --json\n"
                              "         hetspec law tree --set alpha=0.8 --set tree=4,2,2,1")
    p.add_argument("name", choices=sorted(found), help="which law")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE",
                   help="a law parameter (repeat)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_law)


def _law(args) -> int:
    out = law(args.name, **parse_sets(args.sets))
    if args.json:
        emit_json(out)
    else:
        for key, value in out.items():
            print(f"{key:28s} {_shown(value)}")
    return 0


def _shown(value) -> str:
    """A result as text: floats to 6 significant digits (--json keeps them whole)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
