"""A calibration session against published measurements: fit, judge the held-out
rows, write the calibrated profile with its provenance (``analyses.calibrate.published``
holds the data's schema and the fit)."""

from __future__ import annotations

from pathlib import Path

from analyses.calibrate.fitgate import (check_published_fit, check_published_units,
                                        poor_fit_lines)
from analyses.calibrate.published import (DEFAULT_FIELDS, Knob, PublishedFit, median_abs_error, objects_of,
                                evaluate, fit_rows, fit_unknowns, load_published,
                                ranking_flips, rows_for, shipped_folder)
from analyses.calibrate.session import profile_text
from hwprofiles import Platform, load_platform, plausible
from hwprofiles.writing import atomic_write_text


def _sourced(fitted: Platform, original: Platform, knobs: list[Knob], source: str):
    """``fitted`` with a source naming the fit on every field a knob changed."""
    touched: dict[tuple[str, str], list[str]] = {}
    for k in knobs:
        for n in k.names:
            touched.setdefault((k.kind, n), []).append(k.field)

    def update(obj, was, kind):
        fields = touched.get((kind, obj.name))
        if not fields:
            return obj
        sources = dict(obj.sources)
        for field in fields:
            old = getattr(was, field)
            sources[field] = (f"{source}; was " + ("unset" if old is None else f"{old:.4g}")
                              + (f" ({was.sources[field]})" if field in was.sources else ""))
        return obj.model_copy(update={"sources": sources})

    def each(name, kind):
        return tuple(update(o, w, kind) for o, w in zip(getattr(fitted, name),
                                                       getattr(original, name)))

    return fitted.model_copy(update={
        "devices": each("devices", "device"), "memory_tiers": each("memory_tiers", "tier"),
        "links": each("links", "link"), "groups": each("groups", "group")})


def _change(before: Platform, after: Platform, knob: Knob) -> dict:
    """A knob's field on its first object, before and after the fit (None: unset)."""
    name = knob.names[0]
    pick = {n: next(o for o in objects_of(p, knob.kind) if o.name == name)
            for n, p in (("before", before), ("after", after))}
    return {n: getattr(o, knob.field) for n, o in pick.items()}


def _named(path) -> str:
    """How a calibration names its published rows: ``shipped`` for the shipped
    folder, else the file's or folder's name."""
    return "shipped" if Path(path).resolve() == shipped_folder().resolve() else Path(path).name


def _shown(value) -> str:
    return "unset" if value is None else f"{value:.4g}"


def _header(path, original: Platform, result: PublishedFit, table, flips) -> str:
    lines = [f"Calibrated by 'hetspec calibrate --published {_named(path)}'",
             "fitted on rows: " + ", ".join(t["id"] for t in table if t["split"] == "fit"),
             "held-out rows: " + (", ".join(t["id"] for t in table
                                            if t["split"] == "held_out") or "none")]
    for knob in result.knobs:
        change = _change(original, result.platform, knob)
        lines.append(f"  {knob.label}: {_shown(change['before'])} -> "
                     f"{_shown(change['after'])}")
    for knob in result.fixed:
        lines.append(f"  {knob.label}: kept (no fitted row depends on it)")
    for u in result.unknowns:
        lines.append(f"  fitted {u.label}: {result.values[u.key]:.4g} (a row's unknown, "
                     "not a profile field)")
    for t in table:
        lines.append(f"  {t['id']} ({t['split']}): published {t['published_tokens_per_s']:.4g}"
                     f" tok/s, simulated {t['before_tokens_per_s']:.4g} -> "
                     f"{t['after_tokens_per_s']:.4g} ({t['error_after']:+.1%})"
                     + (f"; draft step published {t['published_draft_step_s'] * 1e3:.4g} ms, "
                        f"simulated {t['after_draft_step_s'] * 1e3:.4g} ms "
                        f"({t['draft_step_error_after']:+.1%})"
                        if "after_draft_step_s" in t else ""))
    lines.append("ranking flips among held-out rows: " + (
        ", ".join(f"{a} vs {b}" for a, b in flips) or "none"))
    return "".join(f"# {line}\n" for line in lines)


def of_stack(rows, stack: str | None) -> list:
    """The rows measured under ``stack`` (None: every row), at least one of them
    fitted; ValueError naming the stacks the rows do name otherwise."""
    if stack is None:
        return list(rows)
    mine = [r for r in rows if r.stack == stack]
    if not any(r.split == "fit" for r in mine):
        named = ", ".join(sorted({r.stack for r in rows if r.split == "fit"}))
        raise ValueError(f"no fitted published row of this platform names stack "
                         f"'{stack}'; its fitted rows name {named}; pass one of those "
                         "with --stack or leave --stack out")
    return mine


def calibrate_published(path, profile: str, output, *, fields=DEFAULT_FIELDS,
                        steps: bool = False, accept_poor_fit: bool = False,
                        stack: str | None = None) -> dict:
    """Fit ``profile`` to its rows in the file at ``path`` (with ``steps``, the
    fitted rows' draft steps too), judge the held-out rows, and write the
    calibrated platform YAML to ``output`` (atomically). Rows in a wrong unit,
    and a fit the sanity gate refuses (``analyses.calibrate.fitgate``), raise
    ValueError before anything is written, unless ``accept_poor_fit`` (then the
    summary's ``problems`` lists what the gate let pass). ``stack``: only the rows
    measured under that software stack (None: every row, under its own)."""
    platform = load_platform(profile)
    rows = of_stack(rows_for(load_published(path), platform.name), stack)
    # the unit check reads tokens/s (a speedup has no unit; ms/token its own)
    check_published_units(path, platform, [r for r in rows if r.tokens_per_s is not None])
    fitting = [r for r in rows if r.split == "fit"]
    result = fit_rows(platform, fitting, fields, steps=steps)
    table = evaluate(result.platform, platform, rows, result.values,
                     fit_unknowns(platform, rows))
    problems = check_published_fit(result, platform, table, accept_poor_fit, path)
    after = {t["id"]: t["after_tokens_per_s"] for t in table}
    flips = ranking_flips(rows, after)
    held = median_abs_error(table, "held_out")
    source = (f"calibrated: hetspec calibrate --published {_named(path)} on rows "
              + ("(tokens/s and draft steps) " if steps else "")
              + f"{', '.join(r.id for r in fitting)}; held-out median |error| "
              + ("n/a" if held is None else f"{held:.1%}"))
    fitted = _sourced(result.platform, platform, result.knobs, source)
    fitted = plausible.accept(fitted, plausible.problems(fitted), "--accept-poor-fit")
    fitted = fitted.model_copy(update={"description": (
        f"{platform.description.strip()} Calibrated against published measurements "
        f"({', '.join(r.id for r in fitting)}).").strip()})
    header = _header(path, platform, result, table, flips) + poor_fit_lines(problems)
    atomic_write_text(output, profile_text(fitted, header))
    return {"profile": str(output), "platform": platform.name,
            "fitted_rows": [r.id for r in fitting],
            "held_out_rows": [r.id for r in rows if r.split == "held_out"],
            "converged": result.success,
            "parameters": {k.label: _change(platform, result.platform, k)
                           for k in result.knobs},
            "kept": [k.label for k in result.fixed], "rows": table,
            "unknowns": {u.label: result.values[u.key] for u in result.unknowns},
            "median_abs_error_fit": median_abs_error(table, "fit"),
            "median_abs_error_held_out": held,
            "ranking_flips": [list(f) for f in flips], "problems": problems}
