"""Token trees at temperature 0 and 1: published speedups against simulated ones.

Every row of benchmarks/data/tree_published.yaml (EAGLE's static trees, EAGLE-2's
dynamic trees, each printed at temperature 0 and 1 with the mean accepted length
tau) is simulated deterministically on the shipped a100-sxm-8x profile, the
target on one A100 and EAGLE's one-layer draft as draft_layers=1:

  1. greedy: the row's acceptance alpha_0 is fitted so that the tree's closed form
     gives the published temperature-0 tau (the only number a row is fitted on);
     the simulated temperature-0 speedup is compared with the published one;
  2. sampled: the target's top mass m (``target_top_mass``) is fitted on the
     temperature-1 tau of the source whose role is "fit" (EAGLE-2) and nowhere
     else; every row is then simulated at temperature 1 with first-candidate
     acceptance m alpha_0, and the held-out sources judge it;
  3. for comparison, the greedy sibling rule at the same first-candidate
     acceptance, and the temperature-0 pricing itself (a simulation blind to
     temperature, given the row's greedy acceptance).

Prints one line per row (published and simulated speedup and tau at T=0 and T=1,
errors) and, per source, the median and largest |error| of: the T=0 speedup (the
cost model alone: tau is matched), the T=1 tau (the acceptance model alone:
hardware-free), the T=1 speedup, and the T=1/T=0 speedup ratio (what sampling
costs, with the cost model's error at T=0 divided out), sampled and greedy.

    python benchmarks/bench_trees.py [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml
from scipy.optimize import brentq, minimize_scalar

from analyses.laws.forms import law
from analyses.run.api import SimConfig, simulate
from policies.tree import TOP_MASS_T1

DATA = Path(__file__).parent / "data" / "tree_published.yaml"
PLATFORM, PLACEMENT = "a100-sxm-8x", {"target": "gpu0", "draft": "gpu0"}  # one A100
TOKENS, PROMPT_TOKENS = 256, 256  # steady-state decode; ratios barely move with them


def load() -> tuple[dict, list[dict]]:
    data = yaml.safe_load(DATA.read_text())
    return data["sources"], data["rows"]


def shape(sources: dict, row: dict) -> dict:
    """The tree parameters of a row's source (lists as tuples), EAGLE's draft."""
    src = sources[row["source"]]
    given = src["params"] if "params" in src else src["params_by_size"][row["size"]]
    return {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}


def tau(params: dict, alpha0: float, mass: float | None) -> float:
    """Tokens per step of the closed form: greedy (mass None) at alpha_0, or sampled
    at temperature 1 with target_top_mass m and first-candidate acceptance m alpha_0."""
    if mass is None:
        return law("tree", alpha=alpha0, **params)["expected_tokens_per_step"]
    return law("tree", alpha=alpha0 * mass, temperature=1, target_top_mass=mass,
               **params)["expected_tokens_per_step"]


def greedy_alpha(params: dict, tau0: float) -> float:
    """alpha_0 whose greedy tree gives the published temperature-0 tau."""
    return brentq(lambda a: tau(params, a, None) - tau0, 1e-4, 1 - 1e-9, xtol=1e-10)


def fit_top_mass(rows: list[dict]) -> float:
    """m minimising the squared relative tau error over the fit rows at T=1."""
    def loss(m: float) -> float:
        return sum((tau(r["params"], r["alpha0"], m) / r["t1"][1] - 1) ** 2 for r in rows)

    return float(minimize_scalar(loss, bounds=(0.3, 1.0), method="bounded",
                                 options={"xatol": 1e-6}).x)


def speedup(row: dict, alpha: float, extra: dict) -> float:
    cfg = SimConfig(platform=PLATFORM, target=row["target"], policy="tree",
                    params={**row["params"], "draft_layers": 1, **extra},
                    acceptance={"kind": "iid", "alpha": alpha}, placement=PLACEMENT,
                    tokens=TOKENS, deterministic=True, fixed_context=True,
                    prompt_tokens=PROMPT_TOKENS)
    return simulate(cfg).metrics["speedup_vs_ar"]


def evaluate(row: dict, mass: float) -> dict:
    """Simulated speedups and taus of one row at T=0 and T=1 (sampled, greedy)."""
    a0, sampled = row["alpha0"], {"temperature": 1, "target_top_mass": mass}
    return {"s0": speedup(row, a0, {}), "s1": speedup(row, a0 * mass, sampled),
            "s1_greedy": speedup(row, a0 * mass, {}), "tau1": tau(row["params"], a0, mass),
            "tau1_greedy": tau(row["params"], a0 * mass, None)}


def err(simulated: float, published: float | None) -> float | None:
    return None if published is None else simulated / published - 1


def line(row: dict, sim: dict, markdown: bool) -> str:
    (p0, t0), (p1, t1) = row["t0"], row["t1"]
    cells = [row["source"], row["sources_role"], row["target"], row["task"],
             f"{row['alpha0']:.3f}", f"{p0:.2f}", f"{sim['s0']:.2f}",
             f"{err(sim['s0'], p0):+.1%}", f"{t1:.2f}", f"{sim['tau1']:.2f}",
             f"{sim['tau1_greedy']:.2f}", f"{p1:.2f}", f"{sim['s1']:.2f}",
             f"{err(sim['s1'], p1):+.1%}", f"{sim['s1_greedy']:.2f}",
             f"{err(sim['s1_greedy'], p1):+.1%}"]
    if markdown:
        return "| " + " | ".join(cells) + " |"
    widths = [7, 8, 12, 17, 6, 5, 5, 7, 5, 5, 5, 5, 5, 7, 5, 7]
    return " ".join(f"{c:>{w}s}" for c, w in zip(cells, widths))


HEADER = ["source", "role", "target", "task", "a0", "S0 pub", "S0 sim", "err",
          "tau1 pub", "tau1 sampled", "tau1 greedy", "S1 pub", "S1 sampled", "err",
          "S1 greedy", "err"]


def header(markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    widths = [7, 8, 12, 17, 6, 5, 5, 7, 5, 5, 5, 5, 5, 7, 5, 7]
    short = ["source", "role", "target", "task", "a0", "S0p", "S0s", "err", "t1p", "t1s",
             "t1g", "S1p", "S1s", "err", "S1g", "err"]
    return [" ".join(f"{c:>{w}s}" for c, w in zip(short, widths))]


MEASURES = (  # (label, simulated value, published value) per row
    ("T=0 speedup", lambda r, s: s["s0"], lambda r: r["t0"][0]),
    ("T=1 tau, sampled", lambda r, s: s["tau1"], lambda r: r["t1"][1]),
    ("T=1 tau, greedy rule", lambda r, s: s["tau1_greedy"], lambda r: r["t1"][1]),
    ("T=1 speedup, sampled", lambda r, s: s["s1"], lambda r: r["t1"][0]),
    ("T=1 speedup, greedy rule", lambda r, s: s["s1_greedy"], lambda r: r["t1"][0]),
    ("T=1 speedup, priced as T=0", lambda r, s: s["s0"], lambda r: r["t1"][0]),
    ("T=1/T=0 speedup, sampled", lambda r, s: s["s1"] / s["s0"],
     lambda r: r["t1"][0] / r["t0"][0]),
    ("T=1/T=0 speedup, greedy rule", lambda r, s: s["s1_greedy"] / s["s0"],
     lambda r: r["t1"][0] / r["t0"][0]))


def summary(rows: list[dict], sims: list[dict], sources: dict) -> list[str]:
    """Per source and measure: the median and largest |error| over its rows."""
    out = []
    for name, src in sources.items():
        pairs = [(r, s) for r, s in zip(rows, sims) if r["source"] == name]
        for label, simulated, published in MEASURES:
            errs = [abs(err(simulated(r, s), published(r))) for r, s in pairs]
            out.append(f"{name} ({src['role']}, {len(errs)} rows) {label}: median "
                       f"|error| {statistics.median(errs):.1%}, largest {max(errs):.1%}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    sources, rows = load()
    for row in rows:
        row["params"] = shape(sources, row)
        row["sources_role"] = sources[row["source"]]["role"]
        row["alpha0"] = greedy_alpha(row["params"], row["t0"][1])
    target_top_mass = fit_top_mass([r for r in rows if r["sources_role"] == "fit"])
    sims = [evaluate(r, target_top_mass) for r in rows]
    print("\n".join(header(args.markdown) + [line(r, s, args.markdown)
                                               for r, s in zip(rows, sims)]))
    print(f"\nfitted target_top_mass m = {target_top_mass:.4f} on the 'fit' source's T=1 tau "
          f"(shipped default TOP_MASS_T1 = {TOP_MASS_T1})")
    print("\n".join(summary(rows, sims, sources)))


if __name__ == "__main__":
    main()
