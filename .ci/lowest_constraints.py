"""Print pip constraints pinning each of hetspec's requirements to the lowest version
pyproject.toml allows: its '>=' bound, or its '==' pin.

    python .ci/lowest_constraints.py test,torch > lowest.txt
    pip install --only-binary :all: -c lowest.txt -e ".[test,torch]"

The extras to cover are the first argument (comma-separated; default none). A
requirement without a lower bound is an error: the lowest version it allows is
whatever the registry holds, which no test has seen.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def lowest(requirement: str) -> str:
    name, spec = REQUIREMENT.match(requirement).groups()
    bounds = dict(re.findall(r"(==|>=)\s*([^,;\s]+)", spec))
    if "==" in bounds:
        return f"{name}=={bounds['==']}"
    if ">=" not in bounds:
        raise SystemExit(f"{requirement!r} has no lower bound (>= or ==); give it one")
    return f"{name}=={bounds['>=']}"


def main(argv: list[str]) -> int:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                            .read_text())["project"]
    extras = [e for e in (argv[0].split(",") if argv else []) if e]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"no extra named {unknown[0]!r}; pyproject.toml has "
                         f"{', '.join(optional)}")
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += optional[extra]
    print("\n".join(lowest(r) for r in requirements))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
