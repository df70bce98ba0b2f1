"""The latency-law view of a scenario: closed forms fed with a run's own costs.

A schedule declares its figures (``register(..., law_views=...)``, a ``LawView`` of
``policies.declared`` each); a view's ``drawing`` picks one of ``DRAWINGS`` here.
Each figure draws one schedule's closed form with the terms the roofline cost
model predicts for a simulated run of the grid (its platform, models, batch,
parameters and contexts: the prompt plus half the tokens, or SSD's round times
averaged over the run) and plots that run's metrics in the law's units, so in
deterministic mode each simulated point lies on its curve (the terms come from
its schedule, ``analyses.laws.terms``). A curve's trace has
``meta={"curve": key}``, a simulated point's ``{"on_curve": key}``. The curves
of each policy's fastest run are shown, the grid's other settings are in the
legend (hidden until clicked). A view is drawn only for schedules that ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from analyses.compare.sweep import Point, point_config
from analyses.laws.terms import law_terms
from hwprofiles import load_model
from policies import entry
from policies.declared import LawView

if TYPE_CHECKING:
    from policies.cats import StreamTerms
    from policies.mirror import MirrorTerms
    from policies.ssd import SSDTerms

LAYOUT = dict(template="plotly_white", height=480, margin=dict(l=60, r=20, t=120, b=50))


def _grid(lo: float, hi: float, extra=(), n: int = 61) -> np.ndarray:
    """Evenly spaced samples plus the exact x of every point and kink."""
    return np.unique(np.concatenate([np.linspace(lo, hi, n), np.asarray(extra, float)]))


def _curve(fig, x, y, name: str, key: str, visible: bool, **style) -> None:
    fig.add_scatter(x=list(x), y=list(y), mode="lines", name=name, meta={"curve": key},
                    legendgroup=key, visible=True if visible else "legendonly", **style)


def _points(fig, pts, name: str, key: str, visible: bool, labels, **marker) -> None:
    if pts:
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                        name=name, meta={"on_curve": key}, legendgroup=key, text=labels,
                        visible=True if visible else "legendonly", showlegend=visible,
                        marker=dict(size=11, **marker))


@dataclass
class Setup:
    """One curve's settings: the runs that share them (none: the defaults), the
    law's terms for them, and whether the figure shows it before a click."""

    name: str
    runs: list
    terms: object
    shown: bool

    @property
    def about(self) -> str:
        """Which run(s) a title says the curve belongs to."""
        labels = [r.point.label for r in self.runs]
        if not labels:
            return f"{self.name} (no such run in this grid)"
        if len(labels) == 1:
            return labels[0]
        return f"{self.name} ({len(labels)} runs: {labels[0]} … {labels[-1]})"


def setups(runs, drop, base: dict) -> list:
    """Runs grouped by their settings apart from ``drop``, the group of each
    policy's fastest run shown."""
    groups: dict[tuple, list] = {}
    for r in runs:
        key = (r.point.policy,) + tuple((k, v) for k, v in r.point.sets if k not in drop)
        groups.setdefault(key, []).append(r)
    best: dict[str, tuple] = {}
    for key, group in groups.items():
        speed = max(r.metrics["tokens_per_s"] for r in group)
        if key[0] not in best or speed > best[key[0]][0]:
            best[key[0]] = (speed, key)
    shown = {key for _, key in best.values()}
    return [Setup(Point(k[0], k[1:]).label, g, law_terms(point_config(g[0].point, base)),
                  k in shown) for k, g in groups.items()]


# SSD -----------------------------------------------------------------------------


def ssd_figure(runs, base: dict, view: LawView) -> go.Figure:
    """SSD speedup against the cache hit rate, each curve at one run's terms."""
    fig, title = go.Figure(), ""
    for s in setups(runs, view.along, base):
        t = s.terms  # a run: (rounds that hit, tokens per T_v, start-up speculation aside)
        pts = [(r.metrics["cache_hit_rate"], r.metrics["mean_tokens_per_step"] * t.t_v_s /
                r.metrics["round_time_s"]) for r in s.runs if not t.shared]
        x = _grid(0.0, 1.0, [p[0] for p in pts], 51)
        _curve(fig, x, [t.speedup(float(p)) for p in x], f"law, {s.name} ({t.backup} "
               "backup)", s.name, s.shown)
        _points(fig, pts, f"simulated {s.name}", s.name, s.shown,
                [r.point.label for r in s.runs])
        if s.shown and not title:
            title = _ssd_title(s.about, t)
            _ssd_references(fig, x, t, s.name)
    fig.update_layout(title=title, xaxis_title="p: per-row cache hit rate (a round "
                      "waits for a backup unless all B rows hit, p^B)", yaxis_title="speedup S (tokens per verify "
                      "time T_v)", **LAYOUT)
    return fig


def _ssd_references(fig, x, t: SSDTerms, name: str) -> None:
    other = "fast" if t.backup == "jit" else "jit"
    if t.t_b[t.backup][-1] > t.t_b_at_once[t.backup][-1]:
        _curve(fig, x, [t.speedup(float(p), at_once=True) for p in x],
               "closed form, a miss stops pre-speculation at once", name + " at once", True,
               line_dash="dot")
    _curve(fig, x, [t.speedup(float(p), other) for p in x], f"same run, {other} backup",
           name + " " + other, True, line_dash="dash")


def _ssd_title(name: str, t: SSDTerms) -> str:
    b = t.backup
    shared = ("<br>target and draft share a device here, so nothing overlaps the verify "
              "as the law assumes: runs not drawn") if t.shared else ""
    return (f"SSD law: speedup vs hit rate, curve at the terms of {name}<br><sup>K={t.k}, "
            f"F={list(t.fanout)}, T_v={t.t_v_s * 1e3:.2f} ms, T_p={t.t_p:.2f}·T_v, "
            f"E_hit={t.e_hit:.2f}, E_miss={t.e_miss[b]:.2f}<br>{b} backup "
            f"T_b={t.t_b_at_once[b][-1]:.2f}·T_v with every row missed, "
            f"+{t.t_b[b][-1] - t.t_b_at_once[b][-1]:.2f} waiting for the draft step in "
            f"flight{shared}</sup>")


# Mirror-SD ------------------------------------------------------------------------


def mirror_figure(runs, base: dict, view: LawView) -> go.Figure:
    """Mean step latency against draft time: SD, eq. 10 and each run on its line
    (eq. 10 plus its expected stalls); the knee at Delta."""
    fig, title = go.Figure(), ""
    found = setups(runs, view.along, base)
    pts = [[(r.metrics["step_draft_gen_s"], r.metrics["step_latency_s"]) for r in s.runs]
           for s in found]
    hi = max(max(3 * s.terms.suffix_s, 1.15 * max([s.terms.draft_s] + [x for x, _ in p]))
             for s, p in zip(found, pts))
    for s, p in zip(found, pts):
        # a setup holds one run: Mirror groups drop no setting
        t = replace(s.terms, startup_share=1 / s.runs[0].metrics["steps"])
        x = _grid(0.0, hi, [t.delta_s] + [a for a, _ in p])
        if s.shown and not title:
            title = _mirror_title(s.about, t)
            _mirror_references(fig, x, t, s.name)
        stall = f" + {t.stall_share + t.startup_share:.3f}·T_f" if t.stall_share or \
            t.startup_share else ""
        _curve(fig, x * 1e3, [t.step_s(float(d)) * 1e3 for d in x],
               f"Mirror-SD law{stall}, {s.name}", s.name, s.shown)
        _points(fig, [(a * 1e3, b * 1e3) for a, b in p], f"simulated {s.name}", s.name,
                s.shown, [r.point.label for r in s.runs], symbol="diamond")
    fig.update_layout(title=title, xaxis_title="draft generation time T_draft_gen [ms]",
                      yaxis_title="mean step latency [ms]", **LAYOUT)
    return fig


def _mirror_references(fig, x, t: MirrorTerms, name: str) -> None:
    rows = [t.eq10(float(d)) for d in x]
    _curve(fig, x * 1e3, [r["sd_step_latency_s"] * 1e3 for r in rows],
           "vanilla SD: T_target + T_draft_gen", name + " sd", True, line_dash="dash")
    if t.stall_share:
        _curve(fig, x * 1e3, [r["step_latency_s"] * 1e3 for r in rows],
               "eq. 10, every window reused (Ω=1)", name + " eq10", True, line_dash="dot")
    fig.add_vline(x=t.delta_s * 1e3, line_dash="dash", annotation_text=(
        f"knee: Δ = {t.delta_s * 1e3:.2f} ms" if not t.shared else
        "target and draft share a device: no overlap, Δ = 0"))


def _mirror_title(name: str, t: MirrorTerms) -> str:
    p = t.plan
    return (f"Mirror-SD law: step latency vs draft time, curves at the terms of {name}"
            f"<br><sup>γ={p.gamma}, κ={p.kappa}, η={p.eta}, exit at layer {p.exit_layer} of "
            f"{p.n_layers}, T_rv = {(t.rv_ee_s + t.rv_fv_s) * 1e6:.0f} µs, Ω={p.omega:g}, "
            f"fresh rollout T_f = {t.fresh_s * 1e3:.2f} ms on {t.stall_share:.2f} of steps "
            f"and once at start-up ({t.startup_share:.3f} of the run's steps)</sup>")


# CATS / Kangaroo / AR under a DRAM budget ------------------------------------------


def stream_figure(runs, base: dict, view: LawView) -> go.Figure:
    """Bytes per committed token against the DRAM budget for decoder layers:
    streamed from flash (steps as layers become resident) and, flat, the law's
    decoder-weight bytes read per token. The title is the first shown setup's
    with draft stages, else the first shown setup's."""
    found = setups(runs, view.along, base)
    layer_gb = found[0].terms.layer_gb
    budgets = [dict(r.point.sets)["dram_budget_gb"] for r in runs]
    hi = max([(found[0].terms.ctx.target.n_layers + 3) * layer_gb] + [1.05 * b for b in
                                                                        budgets])
    edges = [k * layer_gb * (1 + 1e-12) for k in range(1, int(hi / layer_gb) + 2)]
    fig, title, staged = go.Figure(), "", False
    for s in found:
        t, labels = s.terms, [r.point.label for r in s.runs]
        x = sorted(b for b in set(edges + budgets) if t.streamed_gb(b) is not None)
        _curve(fig, x, [t.streamed_gb(b) for b in x], f"streamed from flash, {s.name}",
               s.name, s.shown, line_shape="hv")
        _curve(fig, [x[0], x[-1]], [t.law_gb] * 2, f"law: bytes read per token, {s.name}",
               s.name + " law", s.shown, line_dash="dot")
        mine = [(dict(r.point.sets)["dram_budget_gb"], r.metrics) for r in s.runs]
        _points(fig, [(b, m["flash_bytes_per_token_gb"]) for b, m in mine],
                f"simulated {s.name}: streamed", s.name, s.shown, labels)
        _points(fig, [(b, m["bytes_per_token_gb"]) for b, m in mine],
                f"simulated {s.name}: read", s.name + " law", s.shown, labels,
                symbol="square")
        if s.shown and (not title or (_staged(t) and not staged)):
            title, staged = _stream_title(s.about, t), _staged(t)
    fig.update_layout(title=title, xaxis_title="DRAM budget for decoder layers [GB]",
                      yaxis_title="decoder-weight bytes per committed token [GB]", **LAYOUT)
    return fig


def _staged(t: StreamTerms) -> bool:
    """Whether the schedule drafts with the target's first layers (its stages)."""
    return "l_dm" in type(t.params).model_fields


def _stream_title(name: str, t: StreamTerms) -> str:
    p = t.params
    stages = f"γ̄={p.gamma}, L_DM={p.l_dm}, β̄+1={t.mean:.2f}, " if _staged(t) else ""
    return (f"CATS law: bytes per token vs DRAM budget, curves at the settings of {name}"
            f"<br><sup>{stages}N={t.ctx.target.n_layers} layers of {t.layer_gb:.3f} GB, "
            f"{p.chunk_layers * p.buffer_chunks}-layer stream buffer; the law's total does "
            "not depend on L_SV</sup>")


# PPSD --------------------------------------------------------------------------------
def ppsd_figure(runs, base: dict, view: LawView) -> go.Figure:
    """PPSD speedup rho* against the exit head's acceptance, one line per E: the
    view's closed form (eq. 6) over the target's layers."""
    n = load_model(base["target"]).n_layers
    exits = sorted({e for e in (1, 2, 4, 8, 16, n // 4, n // 2) if 1 <= e <= n})
    alpha = np.linspace(0.0, 1.0, 51)
    fig = go.Figure()
    for e in exits:
        _curve(fig, alpha, [view.law(n, e, float(a))["speedup"] for a in alpha],
               f"E={e} ({math.ceil(n / e)} stages)", f"ppsd E={e}", True)
    fig.update_layout(title=f"PPSD law (eq. 6): speedup vs exit acceptance α and exit "
                            f"layer E<br><sup>N={n} layers of the target; counts layer times "
                            "only (free links, no exit-head cost)</sup>",
                      xaxis_title="α of the early-exit head", yaxis_title="speedup ρ*",
                      **LAYOUT)
    return fig


def curve_figure(runs, base: dict, view: LawView) -> go.Figure:
    """A view's law as y(x) at each setup's terms (``terms.curve``) over the view's
    ``x_range``, and each run at (its ``view.x``, its ``view.y``)."""
    fig = go.Figure()
    for s in setups(runs, view.along, base):
        key = f"{view.x} {s.name}"
        pts = [(r.metrics[view.x], r.metrics[view.y]) for r in s.runs if view.y in r.metrics]
        x = _grid(*view.x_range, [a for a, _ in pts], n=51)
        _curve(fig, x, [s.terms.curve(float(a)) for a in x], s.name, key, s.shown)
        _points(fig, pts, f"{s.name} (simulated)", key, s.shown,
                [r.point.label for r in s.runs], symbol="circle")
    fig.update_layout(title=view.heading, xaxis_title=view.x_title,
                      yaxis_title=view.y_title, **LAYOUT)
    return fig


# the drawing a view names (``LawView.drawing``) -> its figure(runs, base, view)
DRAWINGS = {"hit_rate": ssd_figure, "knee": mirror_figure, "dram_budget": stream_figure,
            "exit_family": ppsd_figure, "curve": curve_figure}


def views(results, base: dict) -> dict[LawView, list]:
    """Each law view of the schedules that ran (in the order they first ran) with
    the runs it draws: a view several schedules declare draws all of theirs."""
    ran = {}
    for r in results:
        if r.metrics is not None:
            ran.setdefault(r.point.policy, []).append(r)
    out: dict[LawView, list] = {}
    for policy, runs in ran.items():
        found = entry(policy)
        if found.needs_draft and not base.get("draft"):
            continue
        for view in found.law_views:
            out.setdefault(view, []).extend(runs)
    return out


def law_figures(results, base: dict) -> tuple[list, list[str]]:
    """(titled figures, notes) of the latency-law view of a grid's results."""
    figures, notes = [], []
    drawn = views(results, base)
    for view, runs in drawn.items():
        if view.drawing not in DRAWINGS:
            raise ValueError(f"law view '{view.title}' names drawing '{view.drawing}'; "
                             f"choose one of {', '.join(DRAWINGS)}")
        figures.append((view.title, DRAWINGS[view.drawing](runs, base, view)))
        if view.note:
            notes.append(view.note)
    if not figures:
        notes.append("None of the schedules that ran here has a law view.")
    return figures, notes + _run_notes([r for rs in drawn.values() for r in rs], base)


def _run_notes(runs, base: dict) -> list[str]:
    """Why plotted runs may sit off their curves: sampling noise, contention."""
    notes = []
    if any(not r.metrics.get("deterministic", True) for r in runs):
        notes.append(f"Simulated points use seeded random outcomes (seed "
                     f"{base.get('seed', 0)}), so they scatter about their curves by "
                     "sampling noise; with deterministic outcomes they lie on them.")
    if any(dict(r.point.sets).get("contention", base.get("contention")) for r in runs):
        notes.append("Runs with contention=on fair-share memory bandwidth, which the laws "
                     "do not model: their points bend away from the curves.")
    return notes
