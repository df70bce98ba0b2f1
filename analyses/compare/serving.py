"""``hetspec compare --serve``: schedules under load, side by side.

Every schedule serves the same workload (the same seed: the same requests,
their gaps scaled by the rate) at every swept load (``analyses.serve``): an
arrival rate, or a concurrency (clients keeping N requests in flight, as
benchmark clients' --max-concurrency). AR is always among them, as the baseline
speculation is judged against. The report draws latency (TTFT, TPOT, end to
end) and throughput against the load per schedule, SLO attainment where an SLO
is given, and each schedule's capacity (the highest rate meeting the SLO,
bisected; against concurrency, the highest swept concurrency meeting it); its
summary says, per speculative schedule, at which load it stops paying: where
its mean end-to-end latency crosses AR's, interpolated between the two swept
loads around it.

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
class Axis:
    """A load axis: the ServeConfig field swept, its words and how a value reads."""

    key: str
    title: str  # the axis title of a chart
    plural: str  # "rates", "concurrencies"
    unit: str  # after a value: "requests/s", "in flight"
    short: str  # a table column's suffix: "/s"
    capacity_key: str  # the summary's key for the capacities
    log: bool  # crossings interpolated in log(load), as a batch sweep's are


AXES = {"rate": Axis("rate", "arrival rate (requests/s)", "rates", "requests/s", "/s",
                     "capacity_requests_per_s", False),
        "concurrency": Axis("concurrency", "concurrency (requests in flight)",
                            "concurrencies", "requests in flight", " in flight",
                            "capacity_concurrency", True)}


@dataclass(frozen=True)
class ServeComparison:
    """What the serving comparison found: per schedule, its figures at each load
    of the axis and its capacity; the crossovers in words."""

    policies: list[str]
    loads: list[float]
    figures: dict[str, list[dict]]  # policy -> metrics per load
    capacities: dict[str, float | None]
    crossovers: list[dict]
    config: ServeConfig
    axis: Axis = AXES["rate"]

    def summary(self) -> dict:
        return {"policies": self.policies, "axis": self.axis.key, "loads": self.loads,
                self.axis.capacity_key: self.capacities,
                "crossover": self.crossovers,
                "per_load": {p: [_brief(m) for m in ms] for p, ms in self.figures.items()}}

    def line(self) -> str:
        best = {p: c for p, c in self.capacities.items() if c is not None}
        head = (f"serving comparison of {', '.join(self.policies)} at "
                f"{len(self.loads)} {self.axis.plural}")
        if best:
            top = max(best, key=best.get)
            return (f"{head}; highest capacity: {top} at {best[top]:.3g} "
                    f"{self.axis.unit} ({self.config.slo.words()})")
        return head


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


def compare_serving(configs: dict[str, ServeConfig], loads: list[float], *,
                    axis: str = "rate", jobs: int | None = None, backend: str = "local",
                    quiet: bool = False, allow_large: bool = False) -> ServeComparison:
    """Serve each schedule's config at every load of ``axis`` (``rate`` or
    ``concurrency``; and find its capacity when the configs carry an SLO: against
    rate bisected, against concurrency the highest swept load meeting it).
    ``configs``: policy -> its config at any load."""
    policies = list(configs)
    if AR not in configs:
        raise ValueError("a serving comparison needs ar among the policies: speculation "
                         "is judged against it")
    if axis not in AXES:
        raise ValueError(f"a serving comparison sweeps {' or '.join(AXES)}, not {axis}")
    along = AXES[axis]
    loads = loads_of(axis, loads)
    first = next(iter(configs.values()))
    tasks = [(replace(configs[p], **{axis: x}), "run") for p in policies for x in loads]
    bisect = first.slo.given and axis == "rate"
    if bisect:
        tasks += [(replace(configs[p], rate=min(loads)), "capacity") for p in policies]
    # refusals first
    ready = [prepare(replace(configs[p], **{axis: min(loads)})) for p in policies]
    per_run = sum(r.output_tokens for r in ready[0].requests)
    runs = len(policies) * len(loads) + (CAPACITY_RUNS * len(policies) if bisect else 0)
    check(Estimate("compare --serve", f"{runs} serving runs of {first.requests:,} requests",
                   per_run * runs, "output tokens", SERVE_TOKENS_PER_S, SERVE_BUDGET,
                   f"sweep fewer {along.plural} or serve fewer --requests"), allow_large,
          announce=not quiet)
    results = _run(tasks, jobs, backend, quiet)
    figures = {p: results[i * len(loads):(i + 1) * len(loads)]
               for i, p in enumerate(policies)}
    if bisect:
        caps = {p: results[len(policies) * len(loads) + i]["capacity"]
                for i, p in enumerate(policies)}
    elif first.slo.given:
        caps = {p: swept_capacity(figures[p], loads) for p in policies}
    else:
        caps = {p: None for p in policies}
    return ServeComparison(policies, loads, figures, caps,
                           crossovers(figures, loads, along), first, along)


def loads_of(axis: str, loads: list) -> list:
    """The swept loads, each once; a concurrency in whole requests in flight."""
    if axis == "concurrency":
        whole = []
        for x in loads:
            if isinstance(x, bool) or float(x) != int(float(x)):
                raise ValueError(f"--sweep concurrency={x}: give whole numbers of requests "
                                 "in flight")
            whole.append(int(float(x)))
        loads = whole
    if len(set(loads)) != len(loads):
        raise ValueError(f"--sweep {axis}= gives a value twice; give each once")
    return loads


def swept_capacity(figures: list[dict], loads: list[float]) -> float | None:
    """The highest swept load at which the SLO holds there and at every lower one."""
    best = None
    for x, m in sorted(zip(loads, figures), key=lambda xm: xm[0]):
        if not m["slo"]["holds"]:
            break
        best = x
    return best


def _run(tasks: list, jobs: int | None, backend: str, quiet: bool) -> list[dict]:
    if backend == "ray":
        sweep_ray.connect(None)
        return run_on_ray(_one, tasks, quiet)
    with local_mapper(local_jobs(jobs, len(tasks))) as mapper:
        return run_all(_one, tasks, mapper, quiet)


def crossovers(figures: dict[str, list[dict]], loads: list[float],
               axis: Axis = AXES["rate"]) -> list[dict]:
    """Per speculative schedule: the load at which its mean end-to-end latency
    reaches AR's (linear between the swept loads around it), or that it pays at
    every load, or at none."""
    u = axis.unit
    out = []
    base = [m["e2e_s"]["mean"] for m in figures[AR]]
    for policy, ms in figures.items():
        if policy == AR:
            continue
        ratio = [b / m["e2e_s"]["mean"] for b, m in zip(base, ms)]  # > 1: it pays
        cross = None
        for i in range(1, len(loads)):
            if ratio[i - 1] > 1 >= ratio[i]:
                w = (ratio[i - 1] - 1) / (ratio[i - 1] - ratio[i])
                lo, hi = loads[i - 1], loads[i]
                cross = lo * (hi / lo) ** w if axis.log else lo + w * (hi - lo)
                break
        if cross is not None:
            words = (f"{policy} stops paying at about {cross:.3g} {u}: its mean "
                     f"latency is {ratio[0]:.2f}x better than AR's at {loads[0]:g} "
                     f"{u} and reaches AR's between {loads[i - 1]:g} and "
                     f"{loads[i]:g} ({ratio[i]:.2f}x at {loads[i]:g})")
        elif all(r > 1 for r in ratio):
            words = (f"{policy} pays at every swept {axis.key} ({ratio[0]:.2f}x AR's mean "
                     f"latency at {loads[0]:g} {u}, {ratio[-1]:.2f}x at {loads[-1]:g})")
        else:
            words = (f"{policy} does not pay at {loads[0]:g} {u} already "
                     f"({ratio[0]:.2f}x AR's mean latency)")
        out.append({"policy": policy, axis.key: cross, "speedup": ratio, "sentence": words})
    return out


# the report ------------------------------------------------------------------
def _curve(found: ServeComparison, title: str, y_title: str, value) -> go.Figure:
    fig = go.Figure()
    for policy in found.policies:
        fig.add_trace(go.Scatter(x=found.loads, y=[value(m) for m in found.figures[policy]],
                                 mode="lines+markers", name=policy))
    fig.update_layout(title=title, xaxis_title=found.axis.title,
                      yaxis_title=y_title, height=380, margin=dict(t=50, b=40))
    return fig


def write_serving_report(path, found: ServeComparison) -> object:
    config = found.config
    run = config.run
    slo = config.slo
    sections = []
    load = Section("Latency against load")
    load.figures.append(("mean end-to-end latency", _curve(
        found, f"End-to-end latency (mean) against {found.axis.title.split(' (')[0]}",
        "seconds",
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
        fig.add_trace(go.Scatter(x=found.loads, y=c["speedup"], mode="lines+markers",
                                 name=c["policy"]))
        cross = c[found.axis.key]
        if cross is not None:
            fig.add_vline(x=cross, line_dash="dot",
                          annotation_text=f"{c['policy']}: {cross:.3g}{found.axis.short}")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#888")
    fig.update_layout(title="AR's mean latency over each schedule's (above 1: it pays)",
                      xaxis_title=found.axis.title, yaxis_title="speedup",
                      height=380)
    speed.figures.append(("speedup against load", fig))
    sections.append(speed)
    if slo.given:
        att = Section("SLO attainment and capacity")
        fig = _curve(found, f"Share of requests meeting {slo.words()}", "share",
                     lambda m: m["slo"]["attainment"])
        fig.add_hline(y=slo.percentile / 100, line_dash="dash", line_color="#888")
        att.figures.append(("SLO attainment", fig))
        att.notes += [f"{p}: capacity {c:.3g} {found.axis.unit}" if c is not None else
                      f"{p}: misses the SLO at the lowest {found.axis.key} tried"
                      for p, c in found.capacities.items()]
        sections.append(att)
    rows = [[p, *(f"{m['e2e_s']['mean']:.3g} s" for m in found.figures[p])]
            for p in found.policies]
    table = _table(rows, ["schedule", *(f"{x:g}{found.axis.short}" for x in found.loads)])
    intro = (f"<p>{html.escape(run.target)}"
             f"{' with draft ' + html.escape(run.draft) if run.draft else ''} on "
             f"{html.escape(run.platform)} under stack {html.escape(run.stack)}: "
             f"{config.requests:,} requests ({html.escape(config.workload)} lengths) per "
             f"{found.axis.key}, seed {run.seed}; mean end-to-end latency:</p>{table}")
    text = render_html("hetspec: schedules under load", intro, sections)
    return write_report(path, text)
