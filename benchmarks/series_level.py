"""A speedup series' level against its shape: acceptance solved at its smallest batch.

A held-out speedup series (rows of the published set naming a ``series``: one curve of
a source's speedup against batch) is judged by ``bench_published.py`` at the
acceptance its rows carry. Where the source prints none (SpecDecode-Bench's k=3
draft-model curves), that is hetspec's a-priori i.i.d. alpha, one value for every
dataset, and it sets the level of the whole curve. This what-if separates the two
things a curve says: for each series, the i.i.d. alpha whose simulated speedup at the
series' smallest batch equals the measured one is solved (``solve_acceptance.solve``'s
bisection; a deterministic run commits whole rounds, so the speedup is a staircase in
alpha, and the printed one lies on the step found, under 1% wide), and the other
batches are simulated at it. Their errors are then the batch regime's alone (how the
speedup falls with batch: verify compute, draft passes, KV reads, host work), with the
level taken from the source's own smallest-batch row, which is therefore not judged.
Nothing is written or fitted into a shipped file: the solved alphas describe the
source's datasets, not the hardware or a stack.

Series whose rows print their mean accepted tokens are skipped (their acceptance is
the source's already).

    python benchmarks/series_level.py [--markdown] [--source ID]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_acceptance import solve, speedup_at  # noqa: E402
from analyses.calibrate.published import load_published, shipped_folder  # noqa: E402
from analyses.calibrate.series import SERIES_GOAL  # noqa: E402
from hwprofiles import load_platform  # noqa: E402


def series_rows(rows, source: str | None = None) -> dict[tuple[str, str], list]:
    """Held-out speedup series of two or more batches, without printed acceptance."""
    out: dict[tuple[str, str], list] = {}
    for r in rows:
        if (r.series is None or r.measure != "speedup" or r.split != "held_out"
                or (source is not None and r.source_id != source)):
            continue
        out.setdefault((r.source_id, r.series), []).append(r)
    return {k: sorted(v, key=lambda r: r.batch) for k, v in sorted(out.items())
            if len(v) > 1 and all(getattr(r, "mean_accepted_tokens", None) is None
                                  for r in v)}


def level_series(mine: list, platform) -> tuple[float, list[tuple[int, float, float]]]:
    """(alpha solved on the smallest batch, [(batch, measured, simulated)] at the others)."""
    alpha = solve(mine[0], platform, mine[0].speedup)
    return alpha, [(r.batch, r.speedup, speedup_at(r, platform, alpha)) for r in mine[1:]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--source", default=None, help="one source's series (its id)")
    args = p.parse_args()
    rows = load_published(shipped_folder())
    found = series_rows(rows, args.source)
    if not found:
        raise SystemExit("no held-out speedup series without printed acceptance"
                         + (f" in source {args.source}" if args.source else ""))
    header = ["source", "series", "alpha at batch", "batch", "measured", "hetspec", "error",
              f"within {SERIES_GOAL:.0%}"]
    lines, within = [], 0
    for (sid, name), mine in found.items():
        platform = load_platform(mine[0].platform)
        alpha, rest = level_series(mine, platform)
        errors = [s / m - 1 for _, m, s in rest]
        ok = all(abs(e) <= SERIES_GOAL for e in errors)
        within += ok
        lines.append([sid, name, f"{alpha:.3f} at {mine[0].batch}",
                      " / ".join(str(b) for b, _, _ in rest),
                      " / ".join(f"{m:.2f}" for _, m, _ in rest),
                      " / ".join(f"{s:.2f}" for _, _, s in rest),
                      " / ".join(f"{e:+.0%}" for e in errors), "yes" if ok else "no"])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(c) for c in col) for col in zip(header, *lines)]
        for cells in [header] + lines:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
    print(f"{within}/{len(lines)} series within {SERIES_GOAL:.0%} at every batch past the "
          "one their acceptance was solved on")


if __name__ == "__main__":
    main()
