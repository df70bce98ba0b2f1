"""The report's per-device timelines: a run's spans as horizontal bars, one lane
per device, group, link or memory tier, one colour per kind of operation, each
named in the legend."""

from __future__ import annotations

import plotly.graph_objects as go

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50))
KIND_COLORS = {"compute": "#1f77b4", "collective": "#ff7f0e", "transfer": "#2ca02c",
               "stream": "#9467bd", "delay": "#7f7f7f", "lookup": "#e377c2"}
OTHER_COLORS = ("#8c564b", "#bcbd22", "#17becf")  # span kinds not listed above


def lane(device: str) -> str:
    """A timeline lane's name: 'uf-cpu0-ane0 (link)' for the simulator's
    'link:uf-cpu0-ane0'."""
    return f"{device[5:]} (link)" if device.startswith("link:") else device


def kind_colors(spans) -> dict[str, str]:
    """Each span kind present, in a fixed order, with its bar colour: a kind not
    in KIND_COLORS takes one of OTHER_COLORS, and is still drawn and named."""
    present = dict.fromkeys(s[1] for s in spans)
    known = {k: c for k, c in KIND_COLORS.items() if k in present}
    others = sorted(k for k in present if k not in KIND_COLORS)
    return known | {k: OTHER_COLORS[i % len(OTHER_COLORS)] for i, k in enumerate(others)}


def gantt_traces(spans, *, named: set[str] | None = None) -> list[go.Bar]:
    """Bars of spans (name, kind, device, start_s, end_s), one trace per kind, each
    named in the legend unless ``named`` (the kinds a figure's legend already
    names; updated here) holds it; the hover gives each bar's operation, start
    and duration. Bars have no outline: the template's white one turned a short
    bar into a pale stripe of a colour no legend entry shows."""
    named = set() if named is None else named
    out = []
    for kind, color in kind_colors(spans).items():
        mine = [s for s in spans if s[1] == kind]
        out.append(go.Bar(y=[lane(s[2]) for s in mine],
                          x=[(s[4] - s[3]) * 1e3 for s in mine],
                          base=[s[3] * 1e3 for s in mine], orientation="h", name=kind,
                          marker=dict(color=color, line=dict(width=0)), legendgroup=kind,
                          showlegend=kind not in named,
                          customdata=[[s[0], s[3] * 1e3] for s in mine],
                          hovertemplate="%{customdata[0]}<br>starts %{customdata[1]:.4g}"
                                        " ms, takes %{x:.4g} ms<extra>%{y}</extra>"))
        named.add(kind)
    return out


def gantt_figure(spans, title: str, x_range_ms: tuple[float, float] | None = None) -> go.Figure:
    """Horizontal bars per device track: a few decoding steps of one run; timelines
    of one report share ``x_range_ms``, so their lengths compare."""
    fig = go.Figure(gantt_traces(spans))
    tracks = sorted({lane(s[2]) for s in spans})
    fig.update_layout(title=title, xaxis_title="time [ms]", barmode="overlay",
                      showlegend=True, legend_title_text="operation kind",
                      yaxis=dict(categoryorder="array", categoryarray=tracks),
                      height=max(260, 60 + 28 * len(tracks)), **LAYOUT)
    if x_range_ms:
        fig.update_xaxes(range=list(x_range_ms))
    return fig
