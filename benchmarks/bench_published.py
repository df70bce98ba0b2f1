"""Simulated against published numbers, by source and regime: the held-out error.

Every row of the shipped published set (every file of hwprofiles/data/published)
is simulated deterministically on its shipped platform with the row's models,
schedule, settings and stack; its error is simulated / published - 1 of the
number its source printed (decode tokens/s or ms per token, or the speedup over
the same stack's AR). A source is *fitted* when a shipped platform names one of
its rows in its field sources or a shipped stack lists it in ``fitted_on``;
every other source is *held out*, and only held-out sources judge the profiles
(analyses.calibrate.heldout). Printed: a table per source, a table per source
and regime (stack x device class x AR/speculative) with median and worst
|error| of absolute speeds and of speedups, the summary over held-out sources
(median and worst |error|, share of absolute-speed rows within 25% and of
speedups within 15%, ranking flips among held-out rows sharing a ``ranking``
key), a table per source with rows at batch > 1 by band of batch (the
batch regime: the fitted source's rows beside the held-out ones), a table of
the speedup series against batch (rows naming a ``series``: measured and
simulated speedup and error at each batch, and the batch where each crosses 1;
``analyses.calibrate.series``) with their summary, and with ``--rows`` every
row. A row's unknowns (``{fit: KEY}``) are
fitted on its platform's fitted rows with the shipped profile as it is.

    python benchmarks/bench_published.py [--markdown] [--rows] [--folder DIR]
        [--under-stack NAME]

``--under-stack NAME`` prices every row under one stack instead of the one its
source used: a what-if that shows how much of an error a stack's numbers carry
(the held-out figures mean something only under each row's own stack).
"""

from __future__ import annotations

import argparse
import statistics

from analyses.calibrate import heldout
from analyses.calibrate.draftstep import simulate_row_full
from analyses.calibrate.published import (fit_unknowns, load_published, shipped_folder,
                                          sources_of)
from analyses.calibrate.series import CROSSOVER_FACTOR, SERIES_GOAL, series_of
from analyses.calibrate.sources import runnable
from hwprofiles import load_platform


def stack_fits() -> dict[str, tuple[str, ...]]:
    """Stack name -> its fitted_on list, where shipped stacks exist."""
    import hwprofiles
    from hwprofiles.loader import list_names

    load_stack = getattr(hwprofiles, "load_stack", None)
    if load_stack is None:
        return {}
    try:
        names = list_names("stacks")
    except (OSError, KeyError, ValueError):
        return {}
    return {n: tuple(getattr(load_stack(n), "fitted_on", ()) or ()) for n in names}


def simulate(rows) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Every row's simulated number, and (stack -> row ids) for the rows whose
    stack is not shipped, priced under the default stack."""
    simulated, unpriced = {}, {}
    for name in sorted({r.platform for r in rows}):
        platform = load_platform(name)
        mine = [r for r in rows if r.platform == name]
        values = fit_unknowns(platform, mine)
        for r in mine:
            simulated[r.id] = simulate_row_full(r, platform, values)[0]
            if runnable(r)[1]:  # priced under the default stack
                unpriced.setdefault(r.stack, []).append(r.id)
    return simulated, unpriced


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _errs(rows, errors, measure) -> tuple[str, str, int]:
    """Median and worst |error| (and how many rows) of the absolute-speed rows
    (``measure`` 'tokens/s': tokens/s, ms/token and s/batch) or of the speedups."""
    vals = [abs(errors[r.id]) for r in rows
            if (r.measure == "speedup") == (measure == "speedup")]
    if not vals:
        return "-", "-", 0
    return f"{statistics.median(vals):.1%}", f"{max(vals):.1%}", len(vals)


def _table(header: list[str], lines: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                + ["| " + " | ".join(cells) + " |" for cells in lines])
    widths = [max(len(c) for c in col) for col in zip(header, *lines)]
    return ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in [header] + lines]


def source_lines(rows, sources, fitted, errors) -> list[list[str]]:
    out = []
    for sid, mine in heldout.by_key(rows, lambda r: r.source_id).items():
        src = sources.get(sid)
        tok = _errs(mine, errors, "tokens/s")
        spd = _errs(mine, errors, "speedup")
        out.append([sid, f"fitted ({fitted[sid]})" if sid in fitted else "held out",
                    src.stack if src else "-", src.device_class if src else "-",
                    str(len(mine)), f"{tok[0]} / {tok[1]} ({tok[2]})",
                    f"{spd[0]} / {spd[1]} ({spd[2]})"])
    return out


def regime_lines(rows, fitted, errors) -> list[list[str]]:
    out = []
    groups = heldout.by_key(rows, lambda r: (r.source_id,) + heldout.regime_of(r))
    for (sid, stack, dclass, kind), mine in sorted(groups.items()):
        tok = _errs(mine, errors, "tokens/s")
        spd = _errs(mine, errors, "speedup")
        out.append([sid, "fitted" if sid in fitted else "held out", stack, dclass, kind,
                    str(len(mine)), tok[0], tok[1], spd[0], spd[1]])
    return out


BATCHES = ((1, 1), (2, 8), (9, 32), (33, 128), (129, 10**9))  # the batch table's bands


def batch_lines(rows, fitted, errors) -> list[list[str]]:
    """Per source with rows at batch > 1: median and worst |error| by band of batch."""
    out = []
    for sid, mine in sorted(heldout.by_key(rows, lambda r: r.source_id).items()):
        if all(r.batch == 1 for r in mine):
            continue
        for lo, hi in BATCHES:
            band = [r for r in mine if lo <= r.batch <= hi]
            if not band:
                continue
            vals = [abs(errors[r.id]) for r in band]
            name = str(lo) if lo == hi else f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}"
            out.append([sid, "fitted" if sid in fitted else "held out", name, str(len(band)),
                        f"{statistics.median(vals):.1%}", f"{max(vals):.1%}"])
    return out


def _slash(values, fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def _batch(value: float | None, last: int) -> str:
    return f"none to {last}" if value is None else f"{value:.3g}"


def series_table(series, fitted) -> list[list[str]]:
    """Per series (a curve against batch): speedups measured and simulated at each
    batch, the error at each, and the batch where each crosses 1."""
    return [[s.source_id, "fitted" if s.source_id in fitted else "held out", s.name,
             _slash(s.batches, "d"), _slash(s.measured, ".2f"), _slash(s.predicted, ".2f"),
             _slash(s.errors, "+.0%"), _batch(s.measured_crossover, s.batches[-1]),
             _batch(s.predicted_crossover, s.batches[-1]), s.crossover_verdict]
            for s in series]


def series_summary(series, fitted) -> list[str]:
    held = [s for s in series if s.source_id not in fitted]
    if not held:
        return []
    crossing = [s for s in held if s.measured_crossover is not None]
    errors = [abs(e) for s in held for e in s.errors]
    return [f"held-out speedup series against batch: {len(held)} ({len(errors)} rows); "
            f"within {SERIES_GOAL:.0%} at every batch: {sum(s.within for s in held)}/{len(held)}; "
            f"rows within {SERIES_GOAL:.0%}: {sum(e <= SERIES_GOAL for e in errors)}/{len(errors)}",
            f"held-out series whose speedup crosses 1: {len(crossing)} measured, "
            f"{sum(s.predicted_crossover is not None for s in held)} simulated; crossover "
            f"batch within {CROSSOVER_FACTOR:g}x where measured: "
            f"{sum(s.crossover_verdict == 'yes' for s in crossing)}/{len(crossing)}"]


def summary_lines(rows, fitted, simulated) -> list[str]:
    held = [r for r in rows if r.source_id not in fitted]
    s = heldout.summarise(held, simulated)
    names = sorted({r.source_id for r in held})
    return [f"held-out sources: {', '.join(names) or 'none'} ({s.rows} rows)",
            f"held-out median |error|: {_pct(s.median_abs)}; worst: {_pct(s.worst_abs)}"
            f" ({s.worst_row or '-'})",
            f"held-out absolute-speed rows (tokens/s, ms/token, s/batch) within "
            f"{heldout.TOKENS_GOAL:.0%}: "
            + s.share(s.tokens_within, s.tokens_rows),
            f"held-out speedup rows within {heldout.SPEEDUP_GOAL:.0%}: "
            + s.share(s.speedup_within, s.speedup_rows),
            "ranking flips within held-out sources: "
            + (", ".join(f"{a} vs {b}" for a, b in s.flips) or "none")]


def row_lines(rows, fitted, simulated, errors) -> list[list[str]]:
    return [[r.id, r.source_id, "fit" if r.split == "fit" else
             ("fitted source" if r.source_id in fitted else "held out"), r.measure,
             f"{r.published:.4g}", f"{simulated[r.id]:.4g}", f"{errors[r.id]:+.1%}"]
            for r in rows]


def report(markdown: bool, show_rows: bool, folder=None,
           under_stack: str | None = None) -> list[str]:
    folder = folder or shipped_folder()
    rows = load_published(folder)
    if under_stack is not None:
        rows = tuple(r.model_copy(update={"stack": under_stack}) for r in rows)
    sources = sources_of(folder)
    fitted = heldout.fitted_sources(rows, sources, heldout.platform_source_texts(
        [load_platform(n) for n in sorted({r.platform for r in rows})]), stack_fits())
    simulated, unpriced = simulate(rows)
    errors = heldout.errors_of(rows, simulated)
    out = _table(["source", "fitted?", "stack", "device class", "rows",
                  "speed error: median / worst (rows)", "speedup error: median / worst (rows)"],
                 source_lines(rows, sources, fitted, errors), markdown) + [""]
    out += _table(["source", "fitted?", "stack", "device class", "kind", "rows",
                   "speed median", "speed worst", "speedup median", "speedup worst"],
                  regime_lines(rows, fitted, errors), markdown) + [""]
    by_batch = batch_lines(rows, fitted, errors)
    if by_batch:
        out += _table(["source", "fitted?", "batch", "rows", "median |error|", "worst"],
                      by_batch, markdown) + [""]
    curves = series_of(rows, simulated)
    if curves:
        out += _table(["source", "fitted?", "series", "batch", "measured", "hetspec",
                       "error", "crosses 1 at (measured)", "(hetspec)",
                       f"within {CROSSOVER_FACTOR:g}x"],
                      series_table(curves, fitted), markdown) + [""]
    out += [("- " if markdown else "") + line
            for line in summary_lines(rows, fitted, simulated) + series_summary(curves, fitted)]
    mismatched = [sid for sid, src in sources.items()
                  if (src.role == "fit") != (sid in fitted)]
    if mismatched:
        out.append(("- " if markdown else "") + "sources whose role differs from what was "
                   "fitted: " + ", ".join(mismatched))
    for stack, ids in sorted(unpriced.items()):
        out.append(("- " if markdown else "") + f"stack {stack} is not shipped: its "
                   f"{len(ids)} rows are priced under the default stack")
    if under_stack is not None:
        out.append(("- " if markdown else "") + f"what-if: every row priced under stack "
                   f"{under_stack} (the stack column names the source's own)")
    if show_rows:
        out += [""] + _table(["row", "source", "split", "measure", "published",
                              "simulated", "error"],
                             row_lines(rows, fitted, simulated, errors), markdown)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--rows", action="store_true", help="also print every row")
    parser.add_argument("--folder", default=None,
                        help="a published file or folder (default: the shipped folder)")
    parser.add_argument("--under-stack", metavar="NAME", default=None,
                        help="price every row under this stack (a shipped name or a "
                             "stack YAML) instead of the one its source used; default: "
                             "each row's own. A what-if: it shows how much of a source's "
                             "error the stack carries, and is never the held-out figure")
    args = parser.parse_args()
    if args.under_stack is not None:
        from hwprofiles import load_stack
        try:
            load_stack(args.under_stack)
        except (ValueError, OSError) as err:
            parser.error(f"--under-stack: {str(err).splitlines()[0]}")
    print("\n".join(report(args.markdown, args.rows, args.folder, args.under_stack)))


if __name__ == "__main__":
    main()
