"""Simulated against published tokens/s for every shipped platform.

Every row of the shipped published-measurements file
(hwprofiles/data/published/measurements.yaml) is simulated deterministically on
its shipped platform profile with the row's models, schedule and settings; the
table gives published and simulated tokens/s and the error, marks the rows the
profile was not fitted on (held out), and lists, per platform, the largest
held-out error and any pair of rows whose simulated order contradicts the
published one. Platforms without rows are listed as such. A row's unknowns
(``{fit: KEY}``: an acceptance or SSD's exponent r its source does not print)
are fitted on the platform's fitted rows with the shipped profile as it is, and
listed; the held-out rows then judge them with the profile. Rows that give the
draft's measured time per round (``draft_step_s``) list it beside the simulated
one (the draft devices' busy time per round, analyses.calibrate.draftstep).

    python benchmarks/bench_published.py [--markdown]
"""

from __future__ import annotations

import argparse

from analyses.calibrate.draftstep import simulate_row_full
from analyses.calibrate.published import fit_unknowns, load_published, ranking_flips, shipped_file
from hwprofiles import load_platform
from hwprofiles.loader import list_names


def table(markdown: bool) -> list[str]:
    rows = load_published(shipped_file())
    out = []
    if markdown:
        out += ["| platform | row | split | published tok/s | simulated tok/s | error |",
                "|---|---|---|---:|---:|---:|"]
    else:
        out.append(f"{'platform':22s} {'row':34s} {'split':9s} {'published':>9s} "
                   f"{'simulated':>9s} {'error':>7s}")
    summary = []
    for name in list_names("platforms"):
        mine = [r for r in rows if r.platform == name]
        if not mine:
            summary.append(f"{name}: no published rows")
            continue
        platform = load_platform(name)
        values = fit_unknowns(platform, mine)
        full = {r.id: simulate_row_full(r, platform, values) for r in mine}
        simulated = {key: tps for key, (tps, _) in full.items()}
        held = []
        for r in mine:
            err = simulated[r.id] / r.tokens_per_s - 1
            split = "held out" if r.split == "held_out" else "fit"
            if r.split == "held_out":
                held.append(abs(err))
            if markdown:
                out.append(f"| {name} | {r.id} | {split} | {r.tokens_per_s:.4g} | "
                           f"{simulated[r.id]:.4g} | {err:+.1%} |")
            else:
                out.append(f"{name:22s} {r.id:34s} {split:9s} {r.tokens_per_s:9.4g} "
                           f"{simulated[r.id]:9.4g} {err:+7.1%}")
        flips = ranking_flips(mine, simulated)
        worst = f"{max(held):.1%}" if held else "n/a"
        summary.append(f"{name}: {len(mine)} rows, largest held-out |error| {worst}, "
                       f"ranking flips: " + (", ".join(f"{a} vs {b}" for a, b in flips)
                                             or "none"))
        summary += [f"{name}: fitted {key} = {value:.4g}" for key, value in values.items()]
        summary += [f"{name}: draft step of {r.id} ({r.split} row; compared, not fitted"
                    f"): published {r.draft_step_s * 1e3:.4g} ms, simulated "
                    f"{full[r.id][1] * 1e3:.4g} ms ({full[r.id][1] / r.draft_step_s - 1:+.1%})"
                    for r in mine if r.draft_step_s is not None]
    return out + [""] + summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    print("\n".join(table(args.markdown)))


if __name__ == "__main__":
    main()
