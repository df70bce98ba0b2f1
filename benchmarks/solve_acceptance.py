"""The i.i.d. acceptance at which a published speedup row is reproduced.

A speculative source that prints speedups but no acceptance leaves one number a
simulation needs. This solves it on one row: the alpha at which the row's
simulated speedup (deterministic, on the row's platform and stack, as
``benchmarks/bench_published.py`` simulates it) equals the printed one, by
bisection (the speedup rises with alpha). The solved alpha is then written into
the source's other rows, which judge the cost model; the row it was solved on
is no check of it and stays out of the file.

    python benchmarks/solve_acceptance.py FILE ROW_ID [--speedup X]

``--speedup`` replaces the row's printed speedup (to solve on a row kept out).
Prints the alpha to three decimals and the speedup it gives.
"""

from __future__ import annotations

import argparse

from analyses.calibrate.draftstep import simulate_row_full
from analyses.calibrate.published import load_published
from hwprofiles import load_platform

STEPS = 20  # bisection halvings: the bracket ends well below the printed 0.001


def speedup_at(row, platform, alpha: float) -> float:
    row = row.model_copy(update={"acceptance": {"kind": "iid", "alpha": alpha}})
    return simulate_row_full(row, platform)[0]


def solve(row, platform, target: float, lo: float = 0.01, hi: float = 0.99) -> float:
    """The alpha in [lo, hi] whose simulated speedup is ``target``."""
    if not speedup_at(row, platform, lo) <= target <= speedup_at(row, platform, hi):
        raise SystemExit(f"row {row.id}: a speedup of {target} lies outside what alpha "
                         f"{lo}-{hi} gives; check the row's schedule and settings")
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup_at(row, platform, mid) < target else (lo, mid)
    return (lo + hi) / 2


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a published-measurements YAML file")
    parser.add_argument("row", help="the id of a speculative row with a speedup")
    parser.add_argument("--speedup", type=float, help="solve for this speedup instead")
    args = parser.parse_args(argv)
    rows = {r.id: r for r in load_published(args.file)}
    if args.row not in rows:
        raise SystemExit(f"{args.file} has no row {args.row}; its rows: {', '.join(rows)}")
    row = rows[args.row]
    target = args.speedup if args.speedup is not None else row.speedup
    if target is None or row.policy == "ar":
        raise SystemExit(f"row {row.id} prints no speedup; give --speedup")
    platform = load_platform(row.platform)
    alpha = solve(row, platform, target)
    print(f"{row.id}: alpha {alpha:.3f} gives {speedup_at(row, platform, round(alpha, 3)):.3f}x "
          f"(printed {target}x)")


if __name__ == "__main__":
    main()
