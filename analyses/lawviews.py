"""The latency-law view of a scenario: closed forms fed with the scenario's costs.

Each figure evaluates one law of ``analyses.laws`` over a range, with the
per-operation times the roofline cost model predicts for the scenario's
platform and models (so the Mirror knee sits at this platform's Delta), and
overlays simulated points where the grid ran the matching policy.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from analyses import laws
from hwprofiles import load_model, load_platform
from simcore import RooflineCost

LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=60, b=50))


class Costs:
    """Predicted times of the scenario's target and draft passes (seconds)."""

    def __init__(self, base: dict, gamma: int):
        self.platform = load_platform(base["platform"])
        self.placement = {**self.platform.placement, **base.get("placement", {})}
        self.target = load_model(base["target"])
        self.draft = load_model(base["draft"]) if base.get("draft") else None
        self.cost = RooflineCost(self.platform)
        self.batch = base.get("batch", 1)
        self.context = base.get("prompt_tokens", 128)
        self.gamma = gamma

    def target_s(self, layers: tuple[int, int], n_tokens: int, head=None) -> float:
        where = self.placement.get("target", "target")
        return self.cost.forward(self.target, where, layers, n_tokens, self.batch,
                                 self.context, head, None).total_s

    def draft_step_s(self) -> float:
        where = self.placement.get("draft", "draft")
        return self.cost.forward(self.draft, where, (0, self.draft.n_layers), 1,
                                 self.batch, self.context, "lm", None).total_s

    def hop_s(self) -> float:
        """One small message from the target's first device to the draft's."""
        src = self.platform.members(self.placement.get("target", "target"))[0]
        dst = self.platform.members(self.placement.get("draft", "draft"))[0]
        nbytes = 64.0 * self.batch
        return sum(RooflineCost.hop_s(link, nbytes) for link in self.platform.route(src, dst))


def _expected_tokens(alpha: float, gamma: int) -> float:
    return laws.leviathan(alpha, gamma)["expected_tokens_per_step"]


def mirror_figure(c: Costs) -> go.Figure:
    """Step latency against draft time, SD and Mirror; the knee at Delta."""
    n = c.target.n_layers
    exit_layer = n // 2
    t_prefix = c.target_s((0, exit_layer), c.gamma + 1, "exit")
    t_suffix = c.target_s((exit_layer, n), c.gamma + 1, "lm")
    t_rv = 2 * c.hop_s()
    draft_s = np.linspace(0.0, 3.0 * t_suffix, 61)
    rows = [laws.mirror(t_prefix, t_suffix, float(d), t_rv_s=t_rv) for d in draft_s]
    ms = draft_s * 1e3
    fig = go.Figure()
    fig.add_scatter(x=ms, y=[r["sd_step_latency_s"] * 1e3 for r in rows], name="vanilla SD",
                    mode="lines")
    fig.add_scatter(x=ms, y=[r["step_latency_s"] * 1e3 for r in rows], name="Mirror-SD",
                    mode="lines")
    fig.add_vline(x=t_suffix * 1e3, line_dash="dash",
                  annotation_text=f"knee: Δ = {t_suffix * 1e3:.2f} ms")
    fig.add_scatter(x=[c.gamma * c.draft_step_s() * 1e3], y=[
        laws.mirror(t_prefix, t_suffix, c.gamma * c.draft_step_s(), t_rv_s=t_rv)
        ["step_latency_s"] * 1e3], mode="markers", marker=dict(size=11, symbol="diamond"),
        name=f"this draft, γ={c.gamma}")
    fig.update_layout(title=f"Mirror-SD law: step latency vs draft time (exit at layer "
                            f"{exit_layer} of {n}, T_rv = {t_rv * 1e6:.0f} µs)",
                      xaxis_title="draft generation time T_draft(γ) [ms]",
                      yaxis_title="step latency [ms]", **LAYOUT)
    return fig


def ssd_figure(c: Costs, alpha: float, points: list[tuple[float, float]]) -> go.Figure:
    """SSD speedup against cache hit rate, neural and fast backup."""
    t_v = c.target_s((0, c.target.n_layers), c.gamma + 1, "lm")
    t_p = c.gamma * c.draft_step_s() / t_v
    e_hit = _expected_tokens(alpha, c.gamma)
    hit = np.linspace(0.0, 1.0, 51)
    fig = go.Figure()
    for name, t_b, e_miss in (("neural backup", t_p, e_hit), ("fast backup", 0.0, 1.0)):
        fig.add_scatter(x=hit, y=[laws.ssd(float(p), e_hit, e_miss, t_p, t_b)["speedup"]
                                  for p in hit], mode="lines", name=name)
    if points:
        fig.add_scatter(x=[p for p, _ in points], y=[s for _, s in points], mode="markers",
                        name="simulated ssd", marker=dict(size=9))
    fig.update_layout(title=f"SSD law: speedup vs hit rate (α={alpha}, γ={c.gamma}, "
                            f"T_p = {t_p:.2f}·T_v)",
                      xaxis_title="speculation cache hit rate p",
                      yaxis_title="speedup (tokens per verify time)", **LAYOUT)
    return fig


def _cats_defaults() -> dict:
    """The registered cats schedule's defaults (stage split, buffer), if any."""
    from policies import entry

    out = {"gamma": 5, "l_dm": 3, "chunk_layers": 1, "buffer_chunks": 2}
    try:
        fields = entry("cats").params.model_fields
    except ValueError:
        return out
    return {k: (fields[k].default if k in fields and fields[k].default is not None else v)
            for k, v in out.items()}


def cats_figure(c: Costs, alpha: float) -> go.Figure:
    """Bytes per committed token against the DRAM budget for decoder layers.

    The law's bytes read per token (all weight traffic) does not depend on the
    budget; what the budget changes is how much of it streams from flash: layers
    1..P stay resident, P+1..N stream once per cycle (once per token for AR)."""
    d = _cats_defaults()
    n, gamma, l_dm = c.target.n_layers, d["gamma"], min(d["l_dm"], c.target.n_layers - 2)
    layer_gb = c.target.layer_bytes / 1e9
    mean = _expected_tokens(alpha, gamma)
    l_sv = min(n - 1, 2 * l_dm)
    buffer_layers = d["chunk_layers"] * d["buffer_chunks"]
    budgets = np.linspace(buffer_layers * layer_gb, (n + buffer_layers) * layer_gb, 60)
    resident = [min(n, max(0, int(b // layer_gb) - buffer_layers)) for b in budgets]
    fig = go.Figure()
    fig.add_scatter(x=budgets, y=[(n - p) * layer_gb for p in resident], mode="lines",
                    name="AR: streamed per token")
    fig.add_scatter(x=budgets, y=[(n - p) * layer_gb / mean for p in resident], mode="lines",
                    name="CATS / Kangaroo: streamed per token")
    fig.add_hline(y=laws.cats(layer_gb, n, gamma, l_dm, mean, l_sv)["bytes_per_token_gb"],
                  line_dash="dash", annotation_text="CATS law: all weight bytes read per token")
    fig.add_hline(y=laws.kangaroo(layer_gb, n, gamma, l_dm, mean)["bytes_per_token_gb"],
                  line_dash="dot", annotation_text="Kangaroo law",
                  annotation_position="bottom right")
    fig.update_layout(title=f"CATS law: bytes per token vs DRAM budget (α={alpha}, γ̄={gamma}, "
                            f"L_DM={l_dm}, {buffer_layers}-layer stream buffer; the law's total "
                            "does not depend on L_SV)",
                      xaxis_title="DRAM budget for decoder layers [GB]",
                      yaxis_title="bytes per committed token [GB]", **LAYOUT)
    return fig


def ppsd_figure(c: Costs) -> go.Figure:
    """PPSD speedup rho* against the exit head's acceptance, one line per E."""
    n = c.target.n_layers
    exits = sorted({e for e in (1, 2, 4, 8, 16, n // 4, n // 2) if 1 <= e <= n})
    alpha = np.linspace(0.0, 1.0, 51)
    fig = go.Figure()
    for e in exits:
        fig.add_scatter(x=alpha, y=[laws.ppsd(n, e, float(a))["speedup"] for a in alpha],
                        mode="lines", name=f"E={e} ({math.ceil(n / e)} stages)")
    fig.update_layout(title=f"PPSD law: speedup vs exit acceptance α and exit layer E "
                            f"(N={n})", xaxis_title="α of the early-exit head",
                      yaxis_title="speedup ρ*", **LAYOUT)
    return fig


def law_figures(base: dict, gamma: int, alpha: float,
                ssd_points: list[tuple[float, float]]) -> tuple[list, list[str]]:
    """(titled figures, notes) of the latency-law view for a scenario."""
    c = Costs(base, gamma)
    figures, notes = [], []
    if c.draft is not None:
        figures.append(("Mirror-SD: the knee at Δ", mirror_figure(c)))
        figures.append(("SSD: speedup vs hit rate", ssd_figure(c, alpha, ssd_points)))
    else:
        notes.append("Mirror-SD and SSD law views need a draft model (--draft).")
    figures.append(("CATS: bytes per token vs DRAM budget", cats_figure(c, alpha)))
    figures.append(("PPSD: speedup vs α and E", ppsd_figure(c)))
    return figures, notes
