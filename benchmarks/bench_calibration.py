"""Calibration of cpu-local on measured SmolLM2 runs: fit on AR and SD, predict
the other schedules' runs, print the error table.

    python benchmarks/bench_calibration.py --runs DIR [-o calibrated.yaml]
    python benchmarks/bench_calibration.py --measure --runs DIR   # record first

``--measure`` records every run of ``RUNS`` with ``hetspec run`` (the real
executor, worker processes on the two cores, built-in prompts) into DIR/NAME,
twice by default (``--fit-passes``): a first pass in order, the held-out runs,
then a second pass in reverse order into DIR/NAME.r2, so that the machine's
drift weighs every run alike (``measuring_order``). Each fitting run also
decodes one round of its AR baseline in the same processes (``--fit-baselines``,
default on); the record keeps the baseline's spans and the fit takes them with
the run's, so the target's one-token pass is measured in every fitting run. Before each run it waits
until other work uses fewer than ``--quiet-cores`` cores (other work on the two
cores slows every span), and notes in DIR/NAME.load that figure and the CPU
time other processes used while the run went on (all busy CPU time from
/proc/stat less the run's own processes'). Then, as without ``--measure``, it runs
``hetspec calibrate`` (analyses.calibrate.session.calibrate) on DIR and prints, per
held-out schedule, the end-to-end tokens/s error and the median step-latency
error of the replay on the calibrated profile, for the schedule as written and
with the executor's recorded work (positions fed, one pass per sampled token),
and the per-operation-kind errors of the held-out spans.

The speedup regime: runs measured with their AR baseline (``BASELINE_RUNS``:
prompt lookup, ``--draft ngram``, on the grounded and the chat prompts, and
mirror and ppsd) interleave the schedule and AR per prompt over 3 rounds and
record the median round's speedup_vs_ar and its range. They are held out of
the fit (the ngram runs are sd runs, held out by name), and each one's
speedup_vs_ar is predicted on the calibrated profile: its replay's tokens/s
over its own baseline's (AR, through the same stages for ppsd: ``baseline_of``)
simulated on the same prompts (contexts and tokens), both on that profile.
The goals: within 10% for ngram, 15% for mirror and ppsd.
``--speedup-only`` measures just these runs and the fitting runs they need
(the fitting set of docs/calibration.md: ar-1, ar_stream-1, sd-1, sd-sep2..16,
and sd-b2/sd-b4, a 15-layer draft at batch 2 and 4: passes of a short model
over several rows, as Mirror's draft window runs them).

The fit asks for two optional terms (``--fit-terms``, as ``hetspec calibrate
--fit-terms``; default ``multirow_by_rows,memory_bandwidth_gb_s``):
- the multi-row memory factor by width: this CPU's GEMMs cost unevenly by rows
  (``benchmarks/bench_gemm_widths.py``), so one factor for every width misprices
  the widths a schedule runs that the fitting runs do not weigh;
- each core's own bandwidth cap, the DRAM tier's efficiency kept: one core's
  GEMVs draw about 10 GB/s of a memory the two cores share at 34 GB/s. Fitted as
  the tier's efficiency instead, the same 10 GB/s is the whole memory's, and the
  simulator halves it between two cores that run at once (ppsd's stages,
  Mirror's draft beside the target's suffix), which they do not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

TARGET = "smollm2-135m"
STAGES = "stage0=cpu0,stage1=cpu1"
# (run name, hetspec run arguments). Fitting runs: AR (resident, and streaming
# the layers beyond a 0.2 GB DRAM budget from disk: the flash bandwidth) and SD
# (the self-draft, and a separate 8-layer draft at several gamma, so
# verify passes of 3 to 33 positions constrain how a pass's time grows with
# its width; a 15-layer draft at batch 2 and 4, so a short model's passes over
# several rows are measured too).
RUNS = [
    ("ar-1", ["--policy", "ar"]),
    ("ar_stream-1", ["--policy", "ar_stream", "--set", "dram_budget_gb=0.2"]),
    ("sd-1", ["--policy", "sd", "--set", "gamma=4", "--set", "draft_layers=15"]),
    ("sd-sep4", ["--policy", "sd", "--set", "gamma=4", "--draft", "self:8"]),
    ("sd-sep2", ["--policy", "sd", "--set", "gamma=2", "--draft", "self:8"]),
    ("sd-sep8", ["--policy", "sd", "--set", "gamma=8", "--draft", "self:8"]),
    ("sd-sep16", ["--policy", "sd", "--set", "gamma=16", "--draft", "self:8"]),
    ("sd-sep32", ["--policy", "sd", "--set", "gamma=32", "--draft", "self:8"]),
    ("sd-b2", ["--policy", "sd", "--set", "gamma=4", "--draft", "self:15", "--batch", "2"]),
    ("sd-b4", ["--policy", "sd", "--set", "gamma=4", "--draft", "self:15", "--batch", "4"]),
    ("mirror-1", ["--policy", "mirror", "--set", "gamma=4", "--set", "kappa=4",
                  "--set", "exit_layer=15", "--set", "eta=1"]),
    ("ssd-1", ["--policy", "ssd", "--set", "k=3", "--set", "fanout=2",
               "--set", "hit_rate=0.5"]),
    ("eesd-1", ["--policy", "eesd", "--set", "gamma=3", "--set", "exit_layer=15"]),
    ("ppsd-1", ["--policy", "ppsd", "--set", "exit_layer=15", "--placement", STAGES]),
    ("kangaroo-1", ["--policy", "kangaroo", "--set", "gamma=4", "--set", "l_dm=8",
                    "--set", "adapter=norm", "--set", "dram_budget_gb=0.2"]),
    ("cats-1", ["--policy", "cats", "--set", "gamma=4", "--set", "l_dm=6",
                "--set", "l_sv=12", "--set", "corrections=0", "--set", "adapter=norm",
                "--set", "dram_budget_gb=0.2"]),
]


# Held-out runs with their AR baseline (3 interleaved rounds: speedup_vs_ar and
# its range), and the goal on each one's predicted speedup_vs_ar.
BASELINE_RUNS = [
    ("ngram-grounded", ["--policy", "sd", "--draft", "ngram", "--prompts", "grounded"],
     0.10),
    ("ngram-chat", ["--policy", "sd", "--draft", "ngram", "--prompts", "chat"], 0.10),
    ("ppsd-ab", ["--policy", "ppsd", "--set", "exit_layer=15", "--placement", STAGES], 0.15),
    ("mirror-ab", ["--policy", "mirror", "--set", "gamma=4", "--set", "kappa=4",
                   "--set", "exit_layer=15", "--set", "eta=1"], 0.15),
]
BASELINE_REPEATS = 3
SPEEDUP_FIT = ("ar-1", "ar_stream-1", "sd-1", "sd-sep2", "sd-sep4", "sd-sep8", "sd-sep16",
               "sd-b2", "sd-b4")

FIT_POLICIES = ("ar", "ar_stream", "sd")


def wait_for_quiet(max_cores: float, max_wait_s: float) -> float:
    """Wait until, over a 3-second window, every process of the machine together
    used less than ``max_cores`` cores (the previous run's workers have exited, so
    this is other work); returns the last window's figure. The 1-minute load
    average would still count the run just finished."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = busy_core_s()
        time.sleep(3)
        busy = (busy_core_s() - before) / 3
        if busy < max_cores or time.monotonic() >= deadline:
            return busy


def busy_core_s() -> float:
    """CPU seconds all processes of the machine have used since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_core_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def measuring_order(names: set[str] | None, passes: int,
                    baselines: bool = False) -> list[tuple[str, list[str]]]:
    """(folder name, hetspec run arguments) in the order they are measured. The
    fitting runs are measured ``passes`` times, every other pass in reverse order
    (A B C ... C B A ...), into NAME, NAME.r2, ...; the held-out runs (with their
    AR baseline) after the first pass. This machine's speed drifts by 20% and
    more over minutes, and unevenly between its cores: a fitting run measured
    once, at one moment, can misprice its passes against the others' for the
    whole fit, where a ratio inside one run (a held-out run's AR rounds) is safe.
    Measured in mirrored passes, every fitting run is centred on the same moment,
    the held-out runs' too, so a drift linear over the measurement prices every
    run alike. ``baselines``: each fitting run decodes its AR baseline beside the
    schedule, in the same processes (one round; the record keeps its spans), so a
    fit with a pace per run (``--pace-per-run``) sees the target's one-token pass
    in every run's own state."""
    fitting = [(name, (["--repeats", "1"] if baselines else ["--no-baseline"]) + extra)
               for name, extra in RUNS if not names or name in names]
    held = [(name, ["--repeats", str(BASELINE_REPEATS), "--allow-large", *extra])
            for name, extra, _ in BASELINE_RUNS if not names or name in names]
    order = []
    for p in range(passes):
        runs = fitting if p % 2 == 0 else fitting[::-1]
        order += [(name if p == 0 else f"{name}.r{p + 1}", extra) for name, extra in runs]
        if p == 0:
            order += held
    return order


def measure(root: Path, names: set[str] | None, args) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, extra in measuring_order(names, args.fit_passes, args.fit_baselines):
        before = wait_for_quiet(args.quiet_cores, args.max_wait_s)
        cmd = ["hetspec", "run", "--platform", "cpu-local", "--target", TARGET,
               "--max-new-tokens", str(args.max_new_tokens), "--seed", "1",
               "--json", "--out", str(root / name), *extra]
        print(f"measuring {name} (other work before: {before:.2f} cores): "
              f"{' '.join(cmd[1:])}", flush=True)
        start, busy0, own0 = time.monotonic(), busy_core_s(), own_core_s()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        wall_s = time.monotonic() - start
        others = (busy_core_s() - busy0) - (own_core_s() - own0)
        note = (f"{before:.2f} cores busy before, {wall_s:.0f} s; "
                f"other processes used {max(others, 0.0):.1f} core-seconds "
                f"({max(others, 0.0) / wall_s:.2f} cores on average)")
        (root / f"{name}.load").write_text(note + "\n")
        print(f"  {note}", flush=True)
        if done.returncode:
            print(f"  {name} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)


def _pct(x) -> str:
    return "   n/a" if x is None else f"{x:+6.1%}"


def table(summary: dict) -> str:
    lines = [f"fitted on {', '.join(summary['fitted_runs'])}: {summary['spans']} "
             f"operations, median |residual| {summary['median_abs_residual']:.1%}"]
    for label, p in summary["parameters"].items():
        kept = "" if p["constrained"] else "  (not constrained: kept)"
        lines.append(f"  {label:46s} {p['before']:.4g} -> {p['after']:.4g}{kept}")
    lines.append("")
    lines.append(f"{'held-out run':14s} {'policy':9s} {'tok/s err':>9s} {'step err':>9s}"
                 f" | {'tok/s err':>9s} {'step err':>9s}  (schedule as written | "
                 "executor's work)")
    for r in summary["held_out"]["runs"]:
        lines.append(f"{r['run']:14s} {r['policy']:9s} {_pct(r.get('tokens_per_s_error')):>9s}"
                     f" {_pct(r.get('median_step_latency_error')):>9s} | "
                     f"{_pct(r.get('executor_tokens_per_s_error')):>9s} "
                     f"{_pct(r.get('executor_median_step_latency_error')):>9s}")
        for label, (ran, simulated) in r.get("passes", {}).items():
            lines.append(f"{'':25s}passes '{label}': executor ran {ran}, replay {simulated}")
    lines.append("")
    lines.append("held-out operation kinds (critical-path time: span + host time before "
                 "it): median error, error of the kind's total, spans")
    for kind, s in summary["held_out"]["op_kinds"].items():
        lines.append(f"  {kind:66s} {_pct(s['median_error'])} {_pct(s['total_error'])} "
                     f"{s['spans']:5d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, type=Path, help="directory of measured runs")
    ap.add_argument("--measure", action="store_true", help="record the runs first")
    ap.add_argument("--only", default="", help="comma-separated run names to measure")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--quiet-cores", type=float, default=0.25,
                    help="before each run, wait until other work uses fewer cores "
                         "than this over 3 s (default 0.25)")
    ap.add_argument("--fit-passes", type=int, default=2,
                    help="with --measure: measure each fitting run this many times, "
                         "in mirrored order around the held-out runs (default 2)")
    ap.add_argument("--fit-baselines", action=argparse.BooleanOptionalAction, default=True,
                    help="with --measure: every fitting run decodes one round of its AR "
                         "baseline beside the schedule, in the same processes, and the "
                         "fit takes the baseline's spans with the run's (default on: the "
                         "target's one-token pass, the denominator of every speedup, is "
                         "then measured in every fitting run, not in the AR runs alone)")
    ap.add_argument("--pace-per-run", action=argparse.BooleanOptionalAction, default=True,
                    help="fit each fitting run its own pace (hetspec calibrate "
                         "--pace-per-run; default on): with every fitting run's AR round "
                         "(--fit-baselines) each pace is tied to the target's one-token "
                         "pass in that run, and the prediction no longer moves with the "
                         "pass the runs were measured in (docs/calibration.md)")
    ap.add_argument("--max-wait-s", type=float, default=300.0)
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="calibrated profile (default: DIR/calibrated.yaml)")
    ap.add_argument("--speedup-only", action="store_true",
                    help="with --measure: only the baseline runs and the fitting runs "
                         "they need (" + ", ".join(SPEEDUP_FIT) + ")")
    ap.add_argument("--accept-poor-fit", action="store_true",
                    help="print the held-out errors of a fit the sanity gate refuses "
                         "(its problems are printed first); default: refuse")
    ap.add_argument("--fit-terms", default="multirow_by_rows,memory_bandwidth_gb_s",
                    type=lambda v: [x for x in v.split(",") if x],
                    help="optional terms to fit, as hetspec calibrate --fit-terms "
                         "(default multirow_by_rows,memory_bandwidth_gb_s: the "
                         "multi-row memory factor per measured width, and each core's "
                         "bandwidth cap in place of the DRAM's efficiency; '' for "
                         "neither)")
    args = ap.parse_args(argv)
    if args.measure:
        only = set(filter(None, args.only.split(",")))
        if args.speedup_only:
            only |= set(SPEEDUP_FIT) | {name for name, _, _ in BASELINE_RUNS}
        measure(args.runs, only, args)
    from analyses.calibrate.session import calibrate

    summary = calibrate(args.runs, "cpu-local", args.output or args.runs / "calibrated.yaml",
                        fit_policies=FIT_POLICIES, fit_terms=tuple(args.fit_terms),
                        hold=tuple(name for name, _, _ in BASELINE_RUNS),
                        hold_repeats=False,  # NAME.r2 measures NAME again, to average drift
                        accept_poor_fit=args.accept_poor_fit,
                        pace_per_run=args.pace_per_run)
    for problem in summary["problems"]:
        print(f"POOR FIT (the sanity gate would refuse it): {problem}")
    print(table(summary))
    print(speedup_table(args.runs, summary["profile"]))
    print(loads(args.runs))
    return 0


def predicted_speedup(run, profile: str) -> float:
    """A measured run's speedup_vs_ar as the calibrated profile predicts it: its
    replay's tokens/s over its baseline's (``baseline_of``: AR, through the same
    stages for ppsd, as the run measured it) simulated on the same prompts and
    tokens."""
    from analyses.measured.replay import replay, replay_config
    from analyses.run.api import simulate
    from policies.base import baseline_of

    rep = replay(run, profile)
    config = replay_config(run, profile)
    base = baseline_of(config.policy, config.params) or ("ar", {})
    ar_config = config.revised(policy=base[0], params=base[1], draft=None)
    return rep.predicted["tokens_per_s"] / simulate(ar_config, baseline=False).metrics[
        "tokens_per_s"]


def speedup_table(root: Path, profile: str) -> str:
    """Each baseline run: measured speedup_vs_ar (median, range over rounds),
    predicted, error, and whether the error is within the goal."""
    from analyses.measured.replay import load_run

    lines = ["", f"{'held-out run':15s} {'measured speedup (range)':>28s} "
             f"{'predicted':>9s} {'error':>7s}  goal"]
    for name, _, goal in BASELINE_RUNS:
        record = root / name / "record.json"
        if not record.is_file():
            lines.append(f"{name:15s} (not measured)")
            continue
        run = load_run(record)
        m = run.metrics
        low, high = m.get("speedup_vs_ar_spread") or (None, None)
        measured = m.get("speedup_vs_ar")
        if measured is None or low is None:
            lines.append(f"{name:15s} (measured without its AR baseline)")
            continue
        predicted = predicted_speedup(run, profile)
        error = predicted / measured - 1
        rounds = len(m.get("speedup_vs_ar_repeats") or ())
        lines.append(f"{name:15s} {measured:>8.3f}x ({low:.3f}-{high:.3f}x, {rounds} rounds)"
                     f" {predicted:>8.3f}x {error:+7.1%}  within {goal:.0%}: "
                     f"{abs(error) <= goal}")
    return "\n".join(lines)


def loads(root: Path) -> str:
    """The machine's load while each run was measured (DIR/NAME.load): spans
    measured while other processes used the cores run slower, whatever the
    cost model."""
    notes = sorted(root.glob("*.load"))
    return "\n".join(["", "machine load while each run was measured:"] + [
        f"  {p.stem:14s} {p.read_text().strip()}" for p in notes])


if __name__ == "__main__":
    sys.exit(main())
