"""``hetspec compare --serve``: schedules under load, side by side.

Every schedule serves the same workload (the same seed: the same requests,
their gaps scaled by the rate) at every swept arrival rate (``analyses.serve``);
AR is always among them, as the baseline speculation is judged against. The
report draws latency (TTFT, TPOT, end to end) and throughput against the rate
per schedule, SLO attainment where an SLO is given, and each schedule's
capacity (the highest rate meeting the SLO, bisected); its summary says, per
speculative schedule, at which rate it stops paying: where its mean end-to-end
latency crosses AR's, interpolated between the two swept rates around it.

Runs go to local worker processes (``--jobs``) or a Ray cluster, as a sweep's do.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace

import plotly.graph_objects as go

from analyses.compare import sweep_ray
from analyses.compare.report import _table, render_html, write_report
from analyses.compare.sections import Section
from analyses.compare.sweep import local_jobs, local_mapper, run_all, run_on_ray
from analyses.run.budget import Estimate, check
from analyses.serve.api import ServeConfig, capacity, prepare, serve
from policies.base import AR

SERVE_TOKENS_PER_S = 100_000  # output tokens served per CPU-second (analyses/commands/serve)
SERVE_BUDGET = 600 * SERVE_TOKENS_PER_S
CAPACITY_RUNS = 14


@dataclass(frozen=True)
class ServeComparison:
    """What the serving comparison found: per schedule, its figures at each rate
    and its capacity; the crossovers in words."""

    policies: list[str]
    rates: list[float]
    figures: dict[str, list[dict]]  # policy -> metrics per rate
    capacities: dict[str, float | None]
    crossovers: list[dict]
    config: ServeConfig

    def summary(self) -> dict:
        return {"policies": self.policies, "rates": self.rates,
                "capacity_requests_per_s": self.capacities,
                "crossover": self.crossovers,
                "per_rate": {p: [_brief(m) for m in ms] for p, ms in self.figures.items()}}

    def line(self) -> str:
        best = {p: c for p, c in self.capacities.items() if c is not None}
        if best:
            top = max(best, key=best.get)
            return (f"serving comparison of {', '.join(self.policies)} at "
                    f"{len(self.rates)} rates; highest capacity: {top} at "
                    f"{best[top]:.3g} requests/s ({self.config.slo.words()})")
        return (f"serving comparison of {', '.join(self.policies)} at "
                f"{len(self.rates)} rates")


def _brief(m: dict) -> dict:
    return {"ttft_p90_s": m["ttft_s"]["p90"], "tpot_p50_s": m["tpot_s"]["p50"],
            "tpot_p90_s": m["tpot_s"]["p90"], "e2e_mean_s": m["e2e_s"]["mean"],
            "e2e_p90_s": m["e2e_s"]["p90"],
            "throughput_tokens_per_s": m["throughput_tokens_per_s"],
            "slo_attainment": m["slo"]["attainment"], "slo_holds": m["slo"]["holds"],
            "batch_mean": m["batch_mean"], "preemptions": m["preemptions"]}


def _one(task: tuple) -> dict:
    config, kind = task
    if kind == "capacity":
        found = capacity(config, low=config.rate)
        return {"capacity": found["rate"]}
    out = serve(config).metrics
    out.pop("timeline", None)
    return out


def compare_serving(configs: dict[str, ServeConfig], rates: list[float], *,
                    jobs: int | None = None, backend: str = "local", quiet: bool = False,
                    allow_large: bool = False) -> ServeComparison:
    """Serve each schedule's config at every rate (and bisect its capacity when
    the configs carry an SLO). ``configs``: policy -> its config at any rate."""
    policies = list(configs)
    if AR not in configs:
        raise ValueError("a serving comparison needs ar among the policies: speculation "
                         "is judged against it")
    first = next(iter(configs.values()))
    tasks = [(replace(configs[p], rate=r), "run") for p in policies for r in rates]
    with_slo = first.slo.given
    if with_slo:
        tasks += [(replace(configs[p], rate=min(rates)), "capacity") for p in policies]
    ready = [prepare(replace(configs[p], rate=min(rates))) for p in policies]  # refusals first
    per_run = sum(r.output_tokens for r in ready[0].requests)
    runs = len(policies) * len(rates) + (CAPACITY_RUNS * len(policies) if with_slo else 0)
    check(Estimate("compare --serve", f"{runs} serving runs of {first.requests:,} requests",
                   per_run * runs, "output tokens", SERVE_TOKENS_PER_S, SERVE_BUDGET,
                   "sweep fewer rates or serve fewer --requests"), allow_large,
          announce=not quiet)
    results = _run(tasks, jobs, backend, quiet)
    figures = {p: results[i * len(rates):(i + 1) * len(rates)]
               for i, p in enumerate(policies)}
    caps = ({p: results[len(policies) * len(rates) + i]["capacity"]
             for i, p in enumerate(policies)} if with_slo else {p: None for p in policies})
    return ServeComparison(policies, rates, figures, caps,
                           crossovers(figures, rates), first)


def _run(tasks: list, jobs: int | None, backend: str, quiet: bool) -> list[dict]:
    if backend == "ray":
        sweep_ray.connect(None)
        return run_on_ray(_one, tasks, quiet)
    with local_mapper(local_jobs(jobs, len(tasks))) as mapper:
        return run_all(_one, tasks, mapper, quiet)


def crossovers(figures: dict[str, list[dict]], rates: list[float]) -> list[dict]:
    """Per speculative schedule: the rate at which its mean end-to-end latency
    reaches AR's (linear between the swept rates around it), or that it pays at
    every rate, or at none."""
    out = []
    base = [m["e2e_s"]["mean"] for m in figures[AR]]
    for policy, ms in figures.items():
        if policy == AR:
            continue
        ratio = [b / m["e2e_s"]["mean"] for b, m in zip(base, ms)]  # > 1: it pays
        cross = None
        for i in range(1, len(rates)):
            if ratio[i - 1] > 1 >= ratio[i]:
                w = (ratio[i - 1] - 1) / (ratio[i - 1] - ratio[i])
                cross = rates[i - 1] + w * (rates[i] - rates[i - 1])
                break
        if cross is not None:
            words = (f"{policy} stops paying at about {cross:.3g} requests/s: its mean "
                     f"latency is {ratio[0]:.2f}x better than AR's at {rates[0]:g} "
                     f"requests/s and reaches AR's between {rates[i - 1]:g} and "
                     f"{rates[i]:g} ({ratio[i]:.2f}x at {rates[i]:g})")
        elif all(r > 1 for r in ratio):
            words = (f"{policy} pays at every swept rate ({ratio[0]:.2f}x AR's mean latency "
                     f"at {rates[0]:g} requests/s, {ratio[-1]:.2f}x at {rates[-1]:g})")
        else:
            words = (f"{policy} does not pay at {rates[0]:g} requests/s already "
                     f"({ratio[0]:.2f}x AR's mean latency)")
        out.append({"policy": policy, "rate": cross, "speedup": ratio, "sentence": words})
    return out


# the report ------------------------------------------------------------------
def _curve(found: ServeComparison, title: str, y_title: str, value) -> go.Figure:
    fig = go.Figure()
    for policy in found.policies:
        fig.add_trace(go.Scatter(x=found.rates, y=[value(m) for m in found.figures[policy]],
                                 mode="lines+markers", name=policy))
    fig.update_layout(title=title, xaxis_title="arrival rate (requests/s)",
                      yaxis_title=y_title, height=380, margin=dict(t=50, b=40))
    return fig


def write_serving_report(path, found: ServeComparison) -> object:
    config = found.config
    run = config.run
    slo = config.slo
    sections = []
    load = Section("Latency against load")
    load.figures.append(("mean end-to-end latency", _curve(
        found, "End-to-end latency (mean) against arrival rate", "seconds",
        lambda m: m["e2e_s"]["mean"])))
    load.figures.append(("TTFT p90", _curve(found, "Time to first token (p90)", "seconds",
                                            lambda m: m["ttft_s"]["p90"])))
    load.figures.append(("TPOT p50", _curve(found, "Time per output token (p50)", "seconds",
                                            lambda m: m["tpot_s"]["p50"])))
    load.figures.append(("throughput", _curve(found, "Throughput", "output tokens/s",
                                              lambda m: m["throughput_tokens_per_s"])))
    load.notes += [c["sentence"] for c in found.crossovers]
    sections.append(load)
    speed = Section("Speedup over AR against load")
    fig = go.Figure()
    for c in found.crossovers:
        fig.add_trace(go.Scatter(x=found.rates, y=c["speedup"], mode="lines+markers",
                                 name=c["policy"]))
        if c["rate"] is not None:
            fig.add_vline(x=c["rate"], line_dash="dot",
                          annotation_text=f"{c['policy']}: {c['rate']:.3g}/s")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#888")
    fig.update_layout(title="AR's mean latency over each schedule's (above 1: it pays)",
                      xaxis_title="arrival rate (requests/s)", yaxis_title="speedup",
                      height=380)
    speed.figures.append(("speedup against load", fig))
    sections.append(speed)
    if slo.given:
        att = Section("SLO attainment and capacity")
        fig = _curve(found, f"Share of requests meeting {slo.words()}", "share",
                     lambda m: m["slo"]["attainment"])
        fig.add_hline(y=slo.percentile / 100, line_dash="dash", line_color="#888")
        att.figures.append(("SLO attainment", fig))
        att.notes += [f"{p}: capacity {c:.3g} requests/s" if c is not None else
                      f"{p}: misses the SLO at the lowest rate tried"
                      for p, c in found.capacities.items()]
        sections.append(att)
    rows = [[p, *(f"{m['e2e_s']['mean']:.3g} s" for m in found.figures[p])]
            for p in found.policies]
    table = _table(rows, ["schedule", *(f"{r:g}/s" for r in found.rates)])
    intro = (f"<p>{html.escape(run.target)}"
             f"{' with draft ' + html.escape(run.draft) if run.draft else ''} on "
             f"{html.escape(run.platform)} under stack {html.escape(run.stack)}: "
             f"{config.requests:,} requests ({html.escape(config.workload)} lengths) per "
             f"rate, seed {run.seed}; mean end-to-end latency:</p>{table}")
    text = render_html("hetspec: schedules under load", intro, sections)
    return write_report(path, text)
