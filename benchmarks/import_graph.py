"""Print the import figures tests/test_architecture.py holds under ceilings: import
loops, function-local import statements (all, and those not for an optional
dependency), and the project modules ``hetspec simulate --policy sd`` loads (packages
included, listed apart).

    python benchmarks/import_graph.py [--list]

Run from a checkout (any commit with this test module's helpers) to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_architecture as arch  # noqa: E402


def main() -> None:
    graph, local = arch.import_graph()
    loops = arch.import_loops(graph)
    plain = arch.local_imports_not_optional()
    loaded, packages = arch.simulate_loads()
    print(f"import loops: {len(loops)}")
    for loop in loops:
        print("  " + " <-> ".join(loop))
    print(f"function-local import statements: {len(local)} "
          f"({len(plain)} not for an optional dependency)")
    print(f"project modules 'hetspec simulate --policy sd' loads: "
          f"{len(loaded) + len(packages)} ({len(packages)} of them packages)")
    if "--list" in sys.argv:
        for path, line, names in plain:
            print(f"  {path}:{line} {', '.join(sorted(set(names)))}")
        print("  modules: " + " ".join(loaded))
        print("  packages: " + " ".join(packages))


if __name__ == "__main__":
    main()
