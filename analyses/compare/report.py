"""Plotly reports: one self-contained HTML file comparing policies on a scenario.

The file inlines plotly.js once, so it opens offline. Sections: speedup and
tokens/s per policy with time to first token beside the time per output token,
the sweep as lines (TTFT and per-token latency too when prompt_tokens is swept),
the latency-law view, a per-device timeline of a few steps per policy,
acceptance histograms, and, when measured runs are given, predicted-vs-measured
and sim-vs-real timelines.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from analyses.compare.best import baseline_name, best_per_policy, by_speed, skipped_policies
from analyses.compare.lawviews import law_figures
from analyses.compare.sections import Section
from analyses.compare.sidebyside import platforms_of, section as side_by_side
from analyses.compare.sweep import PointResult
from analyses.compare.sweepfigure import sweep_figure
from analyses.compare.timelines import gantt_figure, gantt_traces
from analyses.compare.why import explain, per_platform, platform_line, whys
from analyses.measured.speedups import own_baseline, run_line
from hwprofiles import load_platform
from hwprofiles.writing import atomic_write_text
from hwprofiles.schema import resolve
from policies import entry
from policies.runs.breakdown import LABELS

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50))


def summary_figure(best: dict[str, PointResult]) -> go.Figure:
    names = by_speed(best)
    labels = [best[p].point.label for p in names]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s (best point)",
                                                        "speedup vs AR"))
    fig.add_bar(x=names, y=[best[p].metrics["tokens_per_s"] for p in names],
                hovertext=labels, name="tokens/s", row=1, col=1,
                hovertemplate="%{hovertext}<br>%{y:.4g} tokens/s<extra></extra>")
    fig.add_bar(x=names, y=[best[p].metrics["speedup_vs_ar"] for p in names],
                hovertext=[f"{lab} against {baseline_name(best[p])}" for p, lab in
                           zip(names, labels)], name="speedup", row=1, col=2,
                hovertemplate="%{hovertext}<br>%{y:.3g}x<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
    fig.update_layout(title="Speed per policy (each at its fastest swept setting)",
                      showlegend=False, height=420, **LAYOUT)
    return fig


def latency_figure(best: dict[str, PointResult]) -> go.Figure:
    """A request's two latencies per policy: time to first token (the prompt's
    prefill and the decoding up to the first token) beside the decoding time per
    output token."""
    names = by_speed(best)
    labels = [best[p].point.label for p in names]
    titles = ("time to first token [ms]", "time per output token [ms]")
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles)
    for col, key in ((1, "ttft_s"), (2, "tpot_s")):
        fig.add_bar(x=names, y=[_ms(best[p].metrics.get(key)) for p in names],
                    hovertext=labels, name=titles[col - 1], row=1, col=col,
                    hovertemplate="%{hovertext}<br>%{y:.4g} ms<extra></extra>")
    fig.update_layout(title="Latency per policy (each at its fastest swept setting)",
                      showlegend=False, height=420, **LAYOUT)
    return fig


def _ms(seconds) -> float | None:
    return None if seconds is None else seconds * 1e3


def drafting(best: dict[str, PointResult]) -> dict[str, PointResult]:
    """The policies that verified drafted tokens (AR decoding has none to show)."""
    return {p: r for p, r in best.items() if any(k > 0 for k in r.accepted)}


def acceptance_figure(best: dict[str, PointResult]) -> go.Figure:
    fig = go.Figure()
    for policy, r in drafting(best).items():
        total = sum(r.accepted.values()) or 1
        fig.add_bar(x=list(r.accepted), y=[n / total for n in r.accepted.values()],
                    name=r.point.label)
    fig.update_layout(title="Accepted draft tokens per verify (fraction of steps)",
                      xaxis_title="accepted tokens", yaxis_title="fraction of steps",
                      barmode="group", height=420, **LAYOUT)
    return fig


MEASURED_VIEWS = (("speedup_vs_ar", 1.0, "speedup vs AR"),
                  ("tokens_per_s", 1.0, "tokens/s"),
                  ("step_latency_s", 1e3, "step latency [ms]"),
                  ("ttft_s", 1e3, "time to first token [ms]"))


def _view_runs(replays, key: str) -> list:
    """The runs with a measured and a simulated value of ``key`` (runs recorded
    without AR rounds lack a measured speedup, older ones a TTFT); an AR run,
    its own baseline at 1x, is left out of the speedup view."""
    return [r for r in replays if isinstance(r.measured.get(key), (int, float))
            and isinstance(r.predicted.get(key), (int, float))
            and not (key == "speedup_vs_ar" and own_baseline(r))]


def measured_scatter(replays) -> go.Figure:
    """Predicted against measured: the speedup against each run's own AR first (a
    machine busy with other work leaves it comparable, not absolute speeds), then
    tokens/s, step latency and time to first token; one point per run."""
    views = [(v, runs) for v in MEASURED_VIEWS if (runs := _view_runs(replays, v[0]))]
    fig = make_subplots(rows=1, cols=max(1, len(views)),
                        subplot_titles=[v[2] for v, _ in views])
    for col, ((key, scale, _title), runs) in enumerate(views, start=1):
        xs = [r.measured[key] * scale for r in runs]
        ys = [r.predicted[key] * scale for r in runs]
        fig.add_scatter(x=xs, y=ys, mode="markers", text=[r.label for r in runs],
                        marker=dict(size=10), name=key, row=1, col=col)
        lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line_dash="dot",
                        name="predicted = measured", row=1, col=col)
        fig.update_xaxes(title_text="measured", row=1, col=col)
        fig.update_yaxes(title_text="simulated (replay)", row=1, col=col)
    fig.update_layout(title="Simulated vs measured runs (each replayed with its own "
                            "acceptance trace)", showlegend=False, height=440, **LAYOUT)
    return fig


def sim_vs_real_figure(replay, steps: int) -> go.Figure:
    """The measured and the simulated timeline of one run, first steps, stacked."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("measured", "simulated"))
    named: set[str] = set()  # a kind first drawn in either timeline is named once
    for row, spans in ((1, replay.measured_spans), (2, replay.predicted_spans)):
        for trace in gantt_traces(spans, named=named):
            fig.add_trace(trace, row=row, col=1)
    tracks = len({s[2] for s in replay.measured_spans} | {s[2] for s in
                                                            replay.predicted_spans})
    fig.update_xaxes(title_text="time [ms]", row=2, col=1)
    fig.update_layout(title=f"{replay.label}: first {steps} steps, measured vs simulated",
                      barmode="overlay", showlegend=True,
                      legend_title_text="operation kind",
                      height=max(380, 120 + 56 * tracks), **LAYOUT)
    return fig


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _table(rows: list[list], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:36px}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ddd;padding:4px 10px;
text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}
.note{color:#8a4b00}.figure{margin:12px 0 28px}"""


def render_html(title: str, intro: str, sections: list[Section]) -> str:
    """One HTML document: plotly.js inlined once, then every section's figures."""
    parts, n = [], 0
    for sec in sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        parts += [f'<p class="note">{html.escape(note)}</p>' for note in sec.notes]
        for caption, fig in sec.figures:
            n += 1
            div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{n}",
                              config={"displaylogo": False, "responsive": True})
            parts.append(f'<div class="figure" data-caption="{html.escape(caption)}">'
                         f"{div}</div>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head>"
            f"<body><h1>{html.escape(title)}</h1>{intro}{''.join(parts)}</body></html>\n")


def write_report(path, text: str):
    """Write the HTML atomically: a reader never sees half a report."""
    return atomic_write_text(path, text)


COST_COLORS = {"target": "#1f77b4", "draft": "#17becf", "verify": "#2ca02c",
               "collective": "#ff7f0e", "transfer": "#bcbd22", "stream": "#9467bd",
               "wait": "#7f7f7f"}


def why_figure(best: dict[str, PointResult], platform: str | None = None) -> go.Figure:
    """Each policy's time per output token split by cost on its critical path
    (policies.runs.breakdown), one stacked bar per policy, fastest on top;
    ``platform``: the one of several compared platforms the points ran on."""
    names = [p for p in by_speed(best) if best[p].metrics.get("breakdown")][::-1]
    fig = go.Figure()
    for cost, color in COST_COLORS.items():
        values = [_ms(best[p].metrics["breakdown"]["per_token_s"].get(cost, 0.0))
                  for p in names]
        if any(values):
            fig.add_bar(y=names, x=values, orientation="h", name=LABELS[cost],
                        marker_color=color,
                        hovertemplate="%{y}: %{x:.3g} ms a token<extra>" + LABELS[cost]
                                      + "</extra>")
    where = f" on {platform}" if platform else ""
    fig.update_layout(title=f"Where each output token's time goes{where} (critical path)",
                      xaxis_title="time per output token [ms]", barmode="stack",
                      height=max(260, 80 + 40 * len(names)), **LAYOUT)
    return fig


def _why_section(best: dict[str, PointResult], platform: str | None = None) -> Section:
    """Each schedule's Why; on one of several compared platforms, led by its
    fastest point there."""
    sec = Section("Why" if platform is None else f"Why on {platform}")
    if platform is not None:
        sec.notes.append(f"On {platform}: {platform_line(best)}.")
    said = whys(best)
    if said:
        caption = "time per output token by cost"
        sec.figures.append((caption if platform is None else f"{caption} on {platform}",
                            why_figure(best, platform)))
    sec.notes += list(said.values())
    return sec


def why_sections(results: list[PointResult], base: dict,
                 best: dict[str, PointResult]) -> list[Section]:
    """'Why' for each schedule's fastest point; with several platforms compared,
    one 'Why on PLATFORM' each (``why.per_platform``)."""
    found = per_platform(results, base)
    if not found:
        return [_why_section(best)]
    return [_why_section(mine, platform) for platform, mine in found.items()]


def _speed_section(results: list[PointResult]) -> Section:
    best = best_per_policy(results)
    sec = Section("Speed per policy")
    if best:
        sec.figures.append(("speedup and tokens/s per policy", summary_figure(best)))
        sec.figures.append(("time to first token and per output token",
                            latency_figure(best)))
    by_reason: dict[str, list[str]] = {}
    for policy, reason in skipped_policies(results).items():
        by_reason.setdefault(reason, []).append(policy)
    for reason, policies in by_reason.items():  # schedules skipped alike, in one line
        names = ", ".join(policies)
        sec.notes.append(f"{names} {'was' if len(policies) == 1 else 'were'} not run: "
                         f"{reason}")
    return sec


def _measured_section(replays, steps: int) -> Section:
    sec = Section("Simulation vs measured runs", notes=[run_line(rep) for rep in replays])
    sec.figures.append(("predicted vs measured", measured_scatter(replays)))
    seen = set()
    for rep in replays:
        if rep.policy not in seen:
            seen.add(rep.policy)
            sec.figures.append((f"sim vs real: {rep.label}", sim_vs_real_figure(rep, steps)))
    return sec


def build_sections(results: list[PointResult], base: dict, sweep_keys: list[str],
                   replays=None, steps: int = 4, notes: list[str] = (),
                   crossover=None) -> list[Section]:
    """Every section of the comparison report, in reading order; ``notes`` (best
    points on a sweep's edge or a valid bound) open the speed section;
    ``crossover``: where each schedule stops paying over a swept batch, when the
    caller has it (``crossover.crossovers``; None: found here)."""
    best = best_per_policy(results)
    explain(best, base)
    speed = _speed_section(results)
    speed.notes[:0] = list(notes)
    sides = [s for s in [side_by_side(results, base, crossover)] if s]
    # platforms compared: the side-by-side table of every platform leads
    several = len(platforms_of(results, base)) > 1
    sections = (sides + [speed] if several else [speed] + sides)
    sections += why_sections(results, base, best)
    sweep = Section("Sweep")
    if sweep_keys and best:
        for metric in ("tokens_per_s", "speedup_vs_ar"):
            sweep.figures.append((f"sweep: {metric}", sweep_figure(results, sweep_keys,
                                                                   metric)))
        if "prompt_tokens" in sweep_keys:  # the prompt's length drives the first token
            keys = ["prompt_tokens"] + [k for k in sweep_keys if k != "prompt_tokens"]
            for metric in ("ttft_s", "tpot_s"):
                sweep.figures.append((f"sweep: {metric}", sweep_figure(results, keys,
                                                                       metric)))
    else:
        sweep.notes.append("No --sweep was given: one point per policy.")
    sections.append(sweep)
    figures, notes = law_figures(results, base)
    sections.append(Section("Latency laws on this platform", figures, notes))
    shown = [best[p] for p in by_speed(best) if best[p].spans]
    x_range = (0.0, max((s[4] for r in shown for s in r.spans), default=0.0) * 1e3)
    sections.append(Section("Per-device timelines", [
        (f"timeline: {r.point.label}",
         gantt_figure(r.spans, f"{r.point.label}: first {steps} steps", x_range))
        for r in shown]))
    if drafting(best):
        sections.append(Section("Acceptance", [("acceptance histograms",
                                                acceptance_figure(best))]))
    if replays:
        sections.append(_measured_section(replays, steps))
    return sections


def placement_note(base: dict) -> str:
    """Where the target and the draft run: one placement for every schedule."""
    placement = resolve(load_platform(base["platform"]), base.get("placement"))
    where = f"target on {placement['target']}"
    if base.get("draft"):
        where += f", draft on {placement['draft']}"
    return (f"<p>Every schedule runs with one placement: {html.escape(where)}; a draft on "
            "a group is sharded alike by each (two all-reduces per draft step unless "
            "--set draft_collectives says otherwise); self-drafting schedules draft "
            "with the target's own layers.</p>")


def set_meanings(results: list[PointResult]) -> dict[str, str]:
    """What a setting a comparison fills in means, as the compared schedules declare
    it (``register(..., defaults=...)``)."""
    policies = dict.fromkeys(r.point.policy for r in results)
    return {d.key: d.meaning for p in policies for d in entry(p).defaults if d.meaning}


def scenario_intro(results: list[PointResult], base: dict, sets: dict | None = None,
                   platforms: list[str] | None = None) -> str:
    best = best_per_policy(results)
    rows = [[p, r.point.label, r.metrics["tokens_per_s"],
             f"{r.metrics['speedup_vs_ar']:.3g}x {baseline_name(r)}",
             r.metrics["mean_tokens_per_step"], r.metrics["step_latency_s"] * 1e3,
             _ms(r.metrics.get("ttft_s")), _ms(r.metrics.get("tpot_s"))]
            for p, r in sorted(best.items(), key=lambda kv: -kv[1].metrics["tokens_per_s"])]
    acc = ", ".join(f"{k}={v}" for k, v in base.get("acceptance", {}).items())
    platforms = [str(p) for p in platforms or [base["platform"]]]
    head = (f"<p>{'Platforms' if len(platforms) > 1 else 'Platform'} "
            f"<b>{html.escape(', '.join(platforms))}</b>, target "
            f"<b>{html.escape(base['target'])}</b>, draft "
            f"<b>{html.escape(str(base.get('draft')))}</b>, acceptance {html.escape(acc)}, "
            f"{base.get('tokens')} tokens per run, batch {base.get('batch', 1)}, seed "
            f"{base.get('seed', 0)}; {len(results)} simulated points.</p>")
    head += placement_note(base) if len(platforms) == 1 else (
        "<p>Each platform runs with its own default placement.</p>")
    if sets:
        head += ("<p>Settings for every policy that takes them: " + html.escape(", ".join(
            f"{k}={v}" for k, v in sets.items())) + ".</p>")
        meanings = set_meanings(results)
        meaning = [meanings[k] for k in sets if k in meanings]
        if meaning:
            head += f"<p>{html.escape(' '.join(meaning))}</p>"
    return head + _table(rows, ["policy", "fastest setting", "tokens/s", "speedup vs",
                                "tokens/step", "step latency [ms]", "TTFT [ms]",
                                "per output token [ms]"])
