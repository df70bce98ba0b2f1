"""The report's side-by-side view of platforms and batches (``--platform a,b``,
``--sweep platform=...``, ``--sweep batch=1,8,32``): per platform and batch,
each schedule's fastest point with its speed, latencies and whether it fits in
memory (the fullest device's need against its capacity), and a chart of
tokens/s grouped by platform and batch."""

from __future__ import annotations

import plotly.graph_objects as go

from analyses.compare.best import best_per_scenario
from analyses.compare.crossover import Crossover, crossovers
from analyses.compare.sections import Section
from analyses.compare.sweep import PointResult, SCENARIO_KEYS, point_config
from analyses.run.capacity import breakdown
from hwprofiles import load_platform
from hwprofiles.provenance import ASPECTS, kinds, unlike

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50))
HEADER = ["platform", "batch", "policy", "setting", "tokens/s", "speedup", "step [ms]",
          "TTFT [ms]", "per token [ms]", "fits in memory"]


def swept_scenario(results: list[PointResult]) -> bool:
    """Whether the grid compares platforms or batches."""
    return any(k in SCENARIO_KEYS for r in results for k, _ in r.point.sets)


def fit_text(result: PointResult, base: dict) -> str:
    """'yes: 79.1 of 80.0 GB' from the memory check's breakdown, or its refusal
    (which names the changes that would make it fit)."""
    if result.metrics is None:
        error = result.error or "not run"
        return f"no: {error}" if "would need" in error else f"not run: {error}"
    config = point_config(result.point, base)
    rows = breakdown(config, load_platform(config.platform))
    full = max(rows, key=lambda m: m["total_bytes"] / m["capacity_bytes"])
    return f"yes: {full['total_bytes'] / 1e9:.1f} of {full['capacity_bytes'] / 1e9:.1f} GB"


def _ms(value) -> str:
    return "" if value is None else f"{value * 1e3:.4g}"


def rows(results: list[PointResult], base: dict) -> list[list]:
    out = []
    for (platform, batch), by_policy in best_per_scenario(results, base).items():
        for policy, r in by_policy.items():
            m = r.metrics or {}
            speed = "" if not m else f"{m['tokens_per_s']:.4g}"
            speedup = "" if not m else f"{m['speedup_vs_ar']:.3g}x"
            out.append([platform, batch, policy, r.point.label, speed, speedup,
                        _ms(m.get("step_latency_s")), _ms(m.get("ttft_s")),
                        _ms(m.get("tpot_s")), fit_text(r, base)])
    return out


WIDTHS = [110, 45, 60, 190, 70, 60, 65, 70, 80, 150]  # the setting column is read whole


def table_figure(table: list[list]) -> go.Figure:
    columns = [list(col) for col in zip(*table)] if table else [[] for _ in HEADER]
    fig = go.Figure(go.Table(columnwidth=WIDTHS, header=dict(values=HEADER, align="left"),
                             cells=dict(values=columns, align="left")))
    fig.update_layout(title="each schedule's fastest point per platform and batch",
                      height=120 + 28 * max(1, len(table)), **LAYOUT)
    return fig


def speed_figure(results: list[PointResult], base: dict) -> go.Figure:
    """tokens/s grouped by platform and batch, one bar per schedule."""
    fig = go.Figure()
    best = best_per_scenario(results, base)
    labels = [f"{p} x{b}" for p, b in best]
    policies = list(dict.fromkeys(p for by in best.values() for p in by))
    for policy in policies:
        ys = [by[policy].metrics["tokens_per_s"] if policy in by and by[policy].metrics
              else None for by in best.values()]
        fig.add_bar(x=labels, y=ys, name=policy)
    fig.update_layout(title="tokens/s per platform and batch", barmode="group",
                      xaxis_title="platform x batch", yaxis_title="tokens/s", height=440,
                      **LAYOUT)
    return fig


def crossover_figure(found: list[Crossover]) -> go.Figure:
    """Each schedule's speedup against batch (log axis), per platform, with the
    break-even line and each crossover's interpolated batch marked."""
    fig = go.Figure()
    several = len({c.platform for c in found}) > 1
    for i, c in enumerate(found):
        name = f"{c.policy} on {c.platform}" if several else c.policy
        fig.add_scatter(x=list(c.batches), y=list(c.speedups), mode="lines+markers",
                        name=name, text=list(c.labels),
                        hovertemplate="batch %{x}: %{y:.2f}x (%{text})<extra>" + name +
                                      "</extra>")
        if c.estimate is not None:
            fig.add_scatter(x=[c.estimate], y=[1.0], mode="markers+text",
                            marker=dict(symbol="x", size=12, color="black"),
                            text=[f"{c.policy}: ~{c.estimate:.3g}"],
                            # neighbours' labels alternate above and below the line
                            textposition="top center" if i % 2 == 0 else "bottom center",
                            showlegend=False,
                            hovertemplate=f"{name} stops paying at about batch "
                                          f"{c.estimate:.3g}<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey",
                  annotation_text="no gain", annotation_position="bottom right")
    fig.update_layout(title="speedup against batch: where speculation stops paying",
                      xaxis=dict(title="batch", type="log"),
                      yaxis_title="speedup over the baseline", height=440, **LAYOUT)
    return fig


def platforms_of(results: list[PointResult], base: dict) -> list[str]:
    """The platforms the grid ran on, in its order."""
    return list(dict.fromkeys(p for p, _ in best_per_scenario(results, base)))


def sources_figure(platforms: dict) -> go.Figure:
    """Per platform (``{name as compared: Platform}``), the kinds of source its
    numbers come from, by aspect (``hwprofiles.provenance``)."""
    names = list(platforms)
    found = [kinds(p) for p in platforms.values()]
    columns = [names] + [[", ".join(k.get(a, ("-",))) for k in found] for a in ASPECTS]
    fig = go.Figure(go.Table(header=dict(values=["platform", *ASPECTS], align="left"),
                             cells=dict(values=columns, align="left")))
    fig.update_layout(title="where each platform's numbers come from",
                      height=120 + 28 * len(names), **LAYOUT)
    return fig


def section(results: list[PointResult], base: dict, found: list[Crossover] | None = None):
    """The report's 'Platforms and batches side by side' section, or None; over a
    swept batch it opens with each schedule's speedup against batch and where it
    stops paying (``found``, or ``crossover.crossovers`` of the results)."""
    if not swept_scenario(results):
        return None
    if found is None:
        found = crossovers(results, base)
    figures = [("speed per platform and batch", speed_figure(results, base)),
               ("side by side", table_figure(rows(results, base)))]
    if found:
        figures.insert(0, ("speedup against batch", crossover_figure(found)))
    notes = [c.sentence[0].upper() + c.sentence[1:] + "." for c in found]
    names = platforms_of(results, base)
    if len(names) > 1:
        platforms = {n: load_platform(n) for n in names}
        figures.append(("number sources", sources_figure(platforms)))
        said = unlike(list(platforms.values()))
        notes += [s[0].upper() + s[1:] + "." for s in said] or [
            "Every platform's numbers come from the same kinds of source "
            "(measured, fitted, datasheet, ...), aspect by aspect."]
    return Section("Platforms and batches side by side", figures, notes + [
        "Every platform runs with its own default placement; 'fits in memory' is the "
        "memory check every run passes (weights, KV cache and activations on the "
        "fullest device; hetspec fit finds the largest batch that fits)."])
