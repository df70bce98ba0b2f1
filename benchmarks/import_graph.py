"""Print the import figures tests/test_architecture.py holds under ceilings: import
loops, function-local import statements (all, and those not for an optional
dependency), and the project modules ``hetspec simulate --policy sd`` loads.

    python benchmarks/import_graph.py [--list]

Run from a checkout (any commit with this test module's helpers) to compare.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_architecture as arch  # noqa: E402


def simulate_modules() -> list[str]:
    code = ("import contextlib, io, sys\nfrom analyses.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({list(arch.SIMULATE_SD)!r})\n"
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{arch.PACKAGES!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return out.stdout.split()


def main() -> None:
    graph, local = arch.import_graph()
    loops = arch.import_loops(graph)
    plain = arch.local_imports_not_optional()
    loaded = simulate_modules()
    print(f"import loops: {len(loops)}")
    for loop in loops:
        print("  " + " <-> ".join(loop))
    print(f"function-local import statements: {len(local)} "
          f"({len(plain)} not for an optional dependency)")
    print(f"project modules 'hetspec simulate --policy sd' loads: {len(loaded)}")
    if "--list" in sys.argv:
        for path, line, names in plain:
            print(f"  {path}:{line} {', '.join(sorted(set(names)))}")
        print("  " + " ".join(loaded))


if __name__ == "__main__":
    main()
