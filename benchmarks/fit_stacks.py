"""Fit a software stack's numbers to published sources; print the held-out error.

    python benchmarks/fit_stacks.py --stack hf-eager --fit medusa-paper \
        --fields layer_host_s,host_device_exponent
    python benchmarks/fit_stacks.py --stack hf-eager     # the shipped numbers, judged
    python benchmarks/fit_stacks.py --stack llama.cpp --backend cuda-tegra \
        --fit ollama-agx-orin --fields layer_host_s     # one backend's entry

Sources are ``benchmarks/stack_sources/NAME.yaml``: rows a paper or a public
benchmark printed, each measured under the stack the file names (``stack:``),
at its ``batch`` (default 1): a decode speed (``tokens_per_s``), a time per
output token of one sequence (``time_per_token_ms``), the end-to-end seconds of
a whole batch, its prefill and ``tokens`` decoding steps (``batch_latency_s``),
or a speedup over autoregressive decoding with the tokens committed per step it
measured (``speedup`` and ``tau``). Every row is simulated deterministically on
its shipped platform under the stack: a speed, time or latency as is; a speedup
as the schedule's tokens/s over AR's on the same hardware and stack, with an
i.i.d. acceptance solved (bisection) so that the simulated tokens per step equal
the printed tau (an input the source prints, not a fitted number).

With ``--fit``, the named sources' rows fit the stack fields in ``--fields``
(least squares on log(simulated / published), scipy), starting from the
shipped stack (with ``--backend NAME``, the fields of the stack's entry for
devices of that backend, created if it has none; the stack's own fields and
other entries stay); every other source of the same stack is held out, whole. The
script prints the fitted values and, per source, each row's error; nothing is
written: the stack file takes the printed values with this command as their
source.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analyses.run.api import run_schedule  # noqa: E402
from analyses.run.config import RunConfig  # noqa: E402
from hwprofiles import load_platform, load_stack  # noqa: E402
from hwprofiles.stacks import BackendHost  # noqa: E402

SOURCES = Path(__file__).resolve().parent / "stack_sources"
TOKENS, PROMPT = 256, 128  # where a row does not say (MT-Bench-like chat turns)
BOUNDS = {"host_device_exponent": (1.0, 20.0),  # other fields: seconds, > 0
          "attention_context_factor": (1.0, 20.0),
          "allreduce_bandwidth_factor": (0.02, 1.0)}


def sources_of(stack: str) -> dict[str, list[dict]]:
    """Every source file of one stack: its rows, by the file's stem."""
    out = {}
    for path in sorted(SOURCES.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data.get("stack") == stack:
            out[path.stem] = data["rows"]
    return out


def config(row: dict, policy: str | None = None, alpha: float = 0.8) -> RunConfig:
    policy = policy or row["policy"]
    return RunConfig(platform=row["platform"], target=row["target"],
                     draft=row.get("draft"), policy=policy,
                     params=row.get("params", {}) if policy != "ar" else {},
                     acceptance={"kind": "iid", "alpha": alpha},
                     tokens=row.get("tokens", TOKENS), weight_bits=row.get("weight_bits"),
                     batch=row.get("batch", 1),
                     prompt_tokens=row.get("prompt_tokens", PROMPT), deterministic=True,
                     placement={"target": row["placement"]["target"]} if policy == "ar"
                     else row["placement"], memory_check=False)


def _run(cfg: RunConfig, stack, prefill: bool):
    return run_schedule(cfg, stack=stack, prefill=prefill,
                        platform=load_platform(cfg.platform), record_spans=False)


def tokens_per_s(cfg: RunConfig, stack) -> float:
    result = _run(cfg, stack, prefill=False)
    return result.tokens / result.time_s


def batch_latency_s(cfg: RunConfig, stack) -> float:
    """The whole batch end to end: its prefill, then its decoding steps."""
    result = _run(cfg, stack, prefill=True)
    return result.prefill_s + result.time_s


MEASURES = ("tokens_per_s", "time_per_token_ms", "batch_latency_s", "speedup")
UNITS = {"tokens_per_s": "tok/s", "time_per_token_ms": "ms", "batch_latency_s": "s",
         "speedup": "x"}


def measure(row: dict) -> str:
    return next(m for m in MEASURES if m in row)


def solved_alpha(row: dict) -> float:
    """The i.i.d. acceptance whose deterministic tokens per step of one sequence
    equal row['tau'] (a run's tokens count every sequence of its batch, as
    ``analyses.calibrate.accepted.tokens_per_step`` divides them)."""
    lo, hi = 1e-3, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        result = run_schedule(config(row, alpha=mid), prefill=False, record_spans=False)
        per_step = result.tokens / (max(result.steps, 1) * row.get("batch", 1))
        lo, hi = (mid, hi) if per_step < row["tau"] else (lo, mid)
    return (lo + hi) / 2


def simulated(row: dict, stack, alphas: dict) -> float:
    """The row's simulated counterpart: tokens/s, ms per token of one sequence,
    the batch's end-to-end seconds, or the speedup over AR."""
    kind = measure(row)
    if kind == "tokens_per_s":
        return tokens_per_s(config(row), stack)
    if kind == "time_per_token_ms":
        return 1e3 * row.get("batch", 1) / tokens_per_s(config(row), stack)
    if kind == "batch_latency_s":
        return batch_latency_s(config(row), stack)
    alpha = alphas.setdefault(row["id"], solved_alpha(row))
    return (tokens_per_s(config(row, alpha=alpha), stack)
            / tokens_per_s(config(row, policy="ar"), stack))


def published(row: dict) -> float:
    return row[measure(row)]


def with_values(stack, fields: list[str], values, backend: str | None = None) -> object:
    """The stack with ``fields`` set to ``values``: its own fields, or (``backend``)
    those of its entry for devices of that backend, created if it has none."""
    update = dict(zip(fields, (float(v) for v in values)))
    if backend is None:
        return stack.model_copy(update=update)
    entry = stack.backends.get(backend) or BackendHost()
    backends = {**stack.backends, backend: entry.model_copy(update=update)}
    return stack.model_copy(update={"backends": backends})


def fit(stack, fields: list[str], rows: list[dict], alphas: dict,
        backend: str | None = None):
    """Least squares in log space over the fields (seconds in log, exponents as is)."""
    def unpack(z):
        return [v if f in BOUNDS else math.exp(v) for f, v in zip(fields, z)]

    def residuals(z):
        trial = with_values(stack, fields, unpack(z), backend)
        return [math.log(simulated(r, trial, alphas) / published(r)) for r in rows]

    now = stack.on(backend)
    start = [getattr(now, f) or (2.0 if f in BOUNDS else 1e-4) for f in fields]
    z0 = [v if f in BOUNDS else math.log(v) for f, v in zip(fields, start)]
    lo = [BOUNDS[f][0] if f in BOUNDS else math.log(1e-7) for f in fields]
    hi = [BOUNDS[f][1] if f in BOUNDS else math.log(0.1) for f in fields]
    sol = least_squares(residuals, np.clip(z0, lo, hi), bounds=(lo, hi), diff_step=1e-3)
    return with_values(stack, fields, unpack(sol.x), backend)


def report(stack, sources: dict, fitted_on: set[str], alphas: dict) -> None:
    for name, rows in sources.items():
        split = "fitted" if name in fitted_on else "held out"
        errors = []
        for r in rows:
            sim, pub = simulated(r, stack, alphas), published(r)
            errors.append(sim / pub - 1)
            unit = UNITS[measure(r)]
            print(f"  {split:8s} {r['id']:36s} published {pub:7.3g}{unit:5s} "
                  f"simulated {sim:7.3g}{unit:5s} {errors[-1]:+7.1%}")
        print(f"  {split:8s} {name}: median |error| {np.median(np.abs(errors)):.1%}, "
              f"worst {max(np.abs(errors)):.1%} over {len(rows)} rows")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True, help="shipped stack name")
    p.add_argument("--fit", default="", help="comma-separated source stems to fit on")
    p.add_argument("--fields", default="", help="comma-separated stack fields to fit")
    p.add_argument("--backend", default=None,
                   help="fit the fields of the stack's entry for devices of this backend "
                        "(a device's 'backend', e.g. cuda-tegra) instead of the stack's own: "
                        "a framework's host time on one kind of host, fitted on rows "
                        "measured there (default: the stack's own fields)")
    args = p.parse_args()
    stack = load_stack(args.stack)
    sources = sources_of(args.stack)
    fit_names = {s for s in args.fit.split(",") if s}
    alphas: dict = {}
    if fit_names:
        rows = [r for s in sorted(fit_names) for r in sources[s]]
        stack = fit(stack, [f for f in args.fields.split(",") if f], rows, alphas,
                    args.backend)
        fitted = stack.on(args.backend)
        print(f"fitted{f' (backend {args.backend})' if args.backend else ''}: "
              + ", ".join(f"{f}={getattr(fitted, f):.4g}" for f in args.fields.split(",") if f))
    else:
        fit_names = set(stack.fitted_on)
    for key, alpha in alphas.items():
        print(f"  acceptance solved from tau: {key} alpha={alpha:.4f}")
    report(stack, sources, fit_names, alphas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
