"""The acceptance each measured schedule would need to reach a speedup, on a
profile calibrated from measured runs.

    python benchmarks/break_even.py --runs DIR [--profile DIR/calibrated.yaml]
                                    [--goal 1.15]

Each run in DIR (``hetspec run --json --out DIR/NAME``, e.g. the runs
``bench_calibration.py --measure`` records) is re-simulated as ``replay``
does (the same schedule, parameters, draft, prompt length and token budget, on
the calibrated ``--profile``), but with an i.i.d. per-token acceptance alpha
in place of its recorded trace; Mirror's Omega and SSD's hit rate stay the
ones the run recorded. Deterministic mode (expected outcomes), so the
speedup is a smooth function of alpha and the bisection is exact to
``--tolerance``. It prints, per run: the measured per-token acceptance (the
i.i.d. alpha whose expected accepted length per step equals the run's mean),
the measured accepted/proposed rate, the simulated speedup at the measured
alpha and at alpha -> 1, and the alpha the speedup ``--goal`` needs with the
accepted/proposed rate that alpha gives. "never" means even alpha = 0.999
stays below the goal: the schedule's cost per step, not its draft's
agreement, rules the goal out on this profile.

The costs come from the profile, so the table is only as good as the
calibration: ``bench_calibration.py`` prints the held-out error of the same
profile next to it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyses.measured.replay import find_runs, load_run, replay_config  # noqa: E402
from analyses.run.api import simulate  # noqa: E402

TOP_ALPHA = 0.999
# where each schedule keeps the outcome its trace recorded besides acceptance
EVENT_TRACES = {"mirror": "omega_trace", "ssd": "hit_trace"}


def alpha_for_mean(mean_accepted: float, gamma: int) -> float:
    """The i.i.d. alpha whose expected accepted length of a gamma-token proposal,
    sum_{i=1..gamma} alpha^i, equals ``mean_accepted`` (bisection: it grows in alpha)."""
    if mean_accepted <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, gamma + 1)) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def proposed_rate(alpha: float, gamma: int) -> float:
    """Expected accepted / proposed draft tokens at i.i.d. ``alpha``: the
    expected accepted length over gamma."""
    return sum(alpha ** i for i in range(1, gamma + 1)) / gamma


def at_alpha(config, alpha: float) -> dict:
    """Simulated metrics of ``config`` with i.i.d. acceptance ``alpha``."""
    revised = config.revised(acceptance={"kind": "iid", "alpha": alpha}, deterministic=True)
    return simulate(revised).metrics


def needed_alpha(config, goal: float, tolerance: float, at_top: float) -> float | None:
    """The smallest alpha whose simulated speedup reaches ``goal``; None when
    even TOP_ALPHA does not (``at_top``: the speedup there)."""
    if at_top < goal:
        return None
    lo, hi = 0.0, TOP_ALPHA
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if at_alpha(config, mid)["speedup_vs_ar"] < goal:
            lo = mid
        else:
            hi = mid
    return hi


def schedule_config(run, profile: str | None):
    """The run's replay configuration, its recorded events kept as their rates."""
    config = replay_config(run, profile)
    key = EVENT_TRACES.get(run.policy)
    if key and run.acceptance_path is not None:
        params = {**config.given("params"), key: str(run.acceptance_path)}
        config = config.revised(params=params)
    return config


def row(run, profile: str | None, goal: float, tolerance: float) -> str:
    config = schedule_config(run, profile)
    gamma = int(getattr(config.params, "gamma", None) or 1)
    m = run.metrics
    measured = alpha_for_mean(float(m.get("mean_accepted") or 0.0), gamma)
    at_measured = at_alpha(config, measured)["speedup_vs_ar"]
    at_top = at_alpha(config, TOP_ALPHA)["speedup_vs_ar"]
    need = needed_alpha(config, goal, tolerance, at_top)
    if need is None:
        needed = f"{'never':>7s} {'':>7s}"
    else:
        needed = f"{need:7.3f} {proposed_rate(need, gamma):7.1%}"
    return (f"{run.name:14s} {run.policy:9s} {gamma:5d} {measured:7.3f} "
            f"{float(m.get('acceptance_rate') or 0.0):7.1%} {at_measured:8.3f} "
            f"{at_top:8.3f} {needed}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="directory of measured runs")
    ap.add_argument("--profile", help="calibrated profile (default: DIR/calibrated.yaml)")
    ap.add_argument("--goal", type=float, default=1.15, help="speedup_vs_ar to reach")
    ap.add_argument("--tolerance", type=float, default=0.002, help="on alpha")
    args = ap.parse_args(argv)
    root = Path(args.runs)
    profile = args.profile or str(root / "calibrated.yaml")
    if args.profile is None and not Path(profile).is_file():
        ap.error(f"no calibrated profile at {profile}; run bench_calibration.py first "
                 "or pass --profile (a profile file or a shipped platform's name)")
    print(f"profile {profile}; goal speedup_vs_ar {args.goal}")
    print(f"{'run':14s} {'policy':9s} {'gamma':>5s} {'alpha':>7s} {'acc/pro':>7s} "
          f"{'speedup':>8s} {'a->1':>8s} {'needs a':>7s} {'acc/pro':>7s}")
    print(f"{'':30s} {'(measured)':>15s} {'(simulated)':>17s} {'(for the goal)':>15s}")
    for path in find_runs(root):
        run = load_run(path)
        if run.policy in ("ar", "ar_stream"):
            continue
        print(row(run, profile, args.goal, args.tolerance), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
