"""hetspec law NAME --set key=value ..."""

from __future__ import annotations

from analyses.run.config import parse_sets
from analyses.laws.forms import LAWS


def register(sub) -> None:
    lines = "\n".join(f"  {name}: {(fn.__doc__ or '').strip().splitlines()[0]}"
                      for name, fn in LAWS.items())
    p = sub.add_parser("law", help="evaluate a closed-form latency law",
                       description="Evaluate one schedule's closed-form law.\n\n" + lines,
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                       epilog="example: hetspec law leviathan --set alpha=0.8 "
                              "--set gamma=5 --set c=0 --json\n"
                              "         hetspec law tree --set alpha=0.8 --set tree=4,2,2,1")
    p.add_argument("name", choices=sorted(LAWS), help="which law")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE",
                   help="a law parameter (repeat)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_law)


def _law(args) -> int:
    from analyses.run.api import law
    from analyses.cli import emit_json

    out = law(args.name, **parse_sets(args.sets))
    if args.json:
        emit_json(out)
    else:
        for key, value in out.items():
            print(f"{key:28s} {value}")
    return 0
