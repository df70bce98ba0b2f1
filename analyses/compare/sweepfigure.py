"""The report's sweep charts: a metric over the first swept key, one line per
schedule and setting of the other swept keys."""

from __future__ import annotations

import plotly.graph_objects as go

from analyses.compare.sweep import PointResult

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50))


METRICS = {"tokens_per_s": ("tokens/s", 1.0), "speedup_vs_ar": ("speedup vs AR", 1.0),
           "ttft_s": ("time to first token [ms]", 1e3),
           "tpot_s": ("time per output token [ms]", 1e3)}
LATENCIES = ("ttft_s", "tpot_s")  # lower is better


def sweep_figure(results: list[PointResult], keys: list[str], metric: str) -> go.Figure:
    """One line per policy (and per setting of the other swept keys) over keys[0];
    a policy that does not take keys[0] is a flat dotted line at its value, named in
    the legend (labels on the plot piled up where values were close: SSD's line per
    k), its best setting shown and the others hidden until clicked."""
    x_key = keys[0]
    lines: dict[str, list[tuple]] = {}
    policy_of: dict[str, str] = {}
    for r in results:
        if r.metrics is None:
            continue
        sets = dict(r.point.sets)
        rest = ", ".join(f"{k}={sets[k]}" for k in keys[1:] if k in sets)
        name = f"{r.point.policy} ({rest})" if rest else r.point.policy
        policy_of[name] = r.point.policy
        value = r.metrics[metric]
        lines.setdefault(name, []).append(
            (sets.get(x_key), None if value is None else value * METRICS[metric][1]))
    fig = go.Figure()
    flat: dict[str, float] = {}
    pick = min if metric in LATENCIES else max  # a line's best value
    for name, pts in lines.items():
        swept = [p for p in pts if p[0] is not None]
        if swept:
            swept.sort()
            fig.add_scatter(x=[p[0] for p in swept], y=[p[1] for p in swept],
                            mode="lines+markers", name=name)
        elif any(p[1] is not None for p in pts):  # does not take the key: its best
            flat[name] = pick(p[1] for p in pts if p[1] is not None)
    _flat_lines(fig, flat, policy_of, _x_ends(lines), pick)
    title = METRICS[metric][0]
    fig.update_layout(title=f"{title} over {x_key}", xaxis_title=x_key,
                      yaxis_title=title, height=420, **LAYOUT)
    if x_key == "prompt_tokens":  # prompts span orders of magnitude
        fig.update_xaxes(type="log")
    return fig


def _x_ends(lines: dict[str, list[tuple]]) -> list:
    """The first and last swept value over every line: where a flat line runs."""
    xs = list(dict.fromkeys(p[0] for pts in lines.values() for p in pts if p[0] is not None))
    try:
        xs.sort()
    except TypeError:  # values of mixed kinds: in the order the grid ran them
        pass
    return [xs[0], xs[-1]] if xs else [0, 1]


def _flat_lines(fig: go.Figure, flat: dict[str, float], policy_of: dict[str, str],
                ends: list, pick) -> None:
    """Each flat line a legend entry, one legend group per policy: its best line
    (``pick``: min or max of the values) drawn, the rest in the legend until
    clicked."""
    best: dict[str, str] = {}
    for name, value in flat.items():
        cur = best.get(policy_of[name])
        if cur is None or pick(value, flat[cur]) != flat[cur]:
            best[policy_of[name]] = name
    for name, value in flat.items():
        shown = best[policy_of[name]] == name
        fig.add_scatter(x=ends, y=[value, value], mode="lines", name=name,
                        line=dict(dash="dot"), legendgroup=policy_of[name],
                        visible=True if shown else "legendonly",
                        hovertemplate=f"{name}: %{{y:.4g}}<extra></extra>")
