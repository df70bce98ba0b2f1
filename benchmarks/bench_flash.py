"""Flash streaming as measured: fit the flash model to public measurements, print
published against simulated per source, and the held-out error.

Sources are ``benchmarks/data/flash_published.yaml``, each whole source either
fitted or held out (``role``):

- read curves (``kind: read_curve``): the tier's saturating read curve
  bw * x / (1 + x), x = (r / half)^k, fitted by least squares on log throughput to
  a source's (request size, MB/s) points; simulated as one stream through the
  engine with requests of that size, one in flight, on the shipped tier;
- overlap (``kind: overlap``): stream and compute times whose sum or max is the
  measured total: f = 1 - (total - max) / min; simulated as a stream beside a
  Forward priced to the row's compute time;
- held out (``kind: mmap_stream``): a model larger than DRAM read through the page
  cache every token, simulated with the fitted overlap and the LRU page cache.

Then the shipped Jetson AGX Orin profile against its old datasheet flash
(7.45 GB/s, no read curve, perfect overlap) on ar_stream, kangaroo and cats, and
the Kangaroo draft-depth order (l_dm 3 -> 5 -> 15) with the acceptance at which
it would flip.

    python benchmarks/bench_flash.py [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from analyses.run.api import run_schedule
from analyses.run.config import SimConfig
from hwprofiles import ModelSpec, Platform, load_platform
from policies.ops import Forward, Parallel, StreamWeights
from simcore import Outcomes, RooflineCost, Simulator
from simcore.acceptance import IID

DATA = Path(__file__).parent / "data" / "flash_published.yaml"
ORIN = "jetson-agx-orin-64gb"
SRC = {"sources": {"capacity_bytes": "bench", "bandwidth_gb_s": "bench"}}
TINY = ModelSpec.model_validate(dict(
    name="tiny", n_layers=4, hidden=1024, ffn=4096, n_heads=16, n_kv_heads=4, vocab=32000,
    dtype="fp16", sources={k: "bench" for k in ("n_layers", "hidden", "ffn", "n_heads",
                                                  "n_kv_heads", "vocab")}))


# fitting -------------------------------------------------------------------------
def fit_read_curve(points) -> tuple[float, float, float]:
    """(bandwidth GB/s, read_half_bytes, read_curve_exponent) of a curve's points."""
    r = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float) * 1e6

    def residual(x):
        bw, half, k = x[0] * 1e9, x[1] * 1e3, x[2]
        return np.log(bw * r ** k / (r ** k + half ** k)) - np.log(y)

    fit = least_squares(residual, [y.max() / 1e9, 100.0, 1.0],
                        bounds=([1e-3, 1e-3, 0.05], [1e3, 1e9, 8.0]))
    return fit.x[0], fit.x[1] * 1e3, fit.x[2]


def fit_overlap(row: dict) -> float:
    """The overlap fraction f with total = max + (1 - f) min."""
    io, compute, total = row["io_ms"], row["compute_ms"], row["total_ms"]
    f = 1.0 - (total - max(io, compute)) / min(io, compute)
    return min(1.0, max(0.0, f))


# simulating ----------------------------------------------------------------------------
def _platform(flash: dict, dram_gb_s: float = 100.0) -> Platform:
    dram = dict(name="dram", kind="dram", capacity_bytes=64e9, bandwidth_gb_s=dram_gb_s,
                **SRC)
    tier = {"name": "flash", "kind": "flash", "capacity_bytes": 1e12, **flash}
    tier["sources"] = {k: "bench" for k, v in tier.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
    gpu = dict(name="a", kind="gpu", peak_flops={"fp16": 1e18}, memory="dram",
               storage="flash", sources={"peak_flops": "bench"})
    return Platform.model_validate(dict(name="bench", memory_tiers=[dram, tier],
                                        devices=[gpu], placement={"target": "a"}))


def _seq(ops):
    """A schedule yielding ops in order (a generator, as the engine drives)."""
    for op in ops:
        yield op


def _simulate(plat: Platform, ops_fn) -> Simulator:
    sim = Simulator(plat, {"target": TINY}, Outcomes(IID(alpha=0.5)))
    sim.result = sim.run(ops_fn())
    return sim


def _tier_fields(tier) -> dict:
    keep = ("bandwidth_gb_s", "memory_efficiency", "read_half_bytes", "read_curve_exponent")
    return {k: getattr(tier, k) for k in keep if getattr(tier, k) is not None}


def simulated_read_mb_s(tier, block_bytes: int) -> float:
    """Throughput of one stream read in requests of block_bytes, one in flight."""
    plat = _platform({**_tier_fields(tier), "request_bytes": block_bytes, "queue_depth": 1})
    nbytes = 16.0 * block_bytes
    sim = _simulate(plat, lambda: _seq([StreamWeights("a", "target", (0, 1), nbytes)]))
    return nbytes / sim.result.time_s / 1e6


def simulated_overlap_total_ms(row: dict, f: float) -> float:
    """A stream of the row's I/O time beside a Forward of its compute time."""
    io_s, compute_s = row["io_ms"] / 1e3, row["compute_ms"] / 1e3
    flash = {"bandwidth_gb_s": row["flash_bytes"] / io_s / 1e9, "stream_overlap_fraction": f}
    probe = RooflineCost(_platform(flash, dram_gb_s=1.0)).forward(
        TINY, "a", (0, 4), 1, 1, 64, None, None)
    plat = _platform(flash, dram_gb_s=probe.busy_s / compute_s)
    stream = StreamWeights("a", "target", (0, 1), row["flash_bytes"])
    forward = Forward("target", "target", (0, 4), 1, 1, 64)
    sim = _simulate(plat, lambda: _seq([Parallel((_seq([stream]), _seq([forward])))]))
    return sim.result.time_s * 1e3


def simulated_mmap_s_per_token(row: dict, f: float) -> float:
    """A model read layer by layer through an LRU page cache of the row's DRAM, three
    tokens; the last token's time (the laptop's compute is not given: omitted)."""
    flash = {"bandwidth_gb_s": row["flash_gb_s"], "page_cache_bytes": row["dram_bytes"],
             "stream_overlap_fraction": f}
    n, layer_bytes = row["layers"], row["model_bytes"] / row["layers"]
    ops = [StreamWeights("a", "target", (i, i + 1), layer_bytes) for i in range(n)] * 3
    sim = _simulate(_platform(flash), lambda: _seq(ops))
    ends = sorted(s.end_s for s in sim.result.spans)
    return ends[-1] - ends[-n - 1]


# reporting -------------------------------------------------------------------------------
def _err(sim: float, pub: float) -> float:
    return 100.0 * (sim / pub - 1.0)


def _size(nbytes: float) -> str:
    return f"{nbytes / 1024:g} KiB" if nbytes < 1024 ** 2 else f"{nbytes / 1024 ** 2:g} MiB"


def read_curve_rows(source: dict) -> tuple[list, dict]:
    tier = load_platform(source["platform"]).tier(source["tier"])
    bw, half, k = fit_read_curve(source["points"])
    rows = [(_size(b), mb, simulated_read_mb_s(tier, b)) for b, mb in source["points"]]
    fitted = {"bandwidth_gb_s": bw, "read_half_bytes": half, "read_curve_exponent": k,
              "profile": _tier_fields(tier)}
    return rows, fitted


def overlap_rows(source: dict, f: float) -> list:
    return [(r["device"], r["total_ms"], simulated_overlap_total_ms(r, f))
            for r in source["rows"]]


def mmap_rows(source: dict, f: float) -> list:
    return [(f"{r['model_bytes'] / 1e9:g} GB model, {r['dram_bytes'] / 1e9:g} GB DRAM",
             r["s_per_token"], simulated_mmap_s_per_token(r, f)) for r in source["rows"]]


def by_source(sources: list) -> list[tuple[dict, list, dict]]:
    """Each source with its (row, published, simulated) rows and what it fitted."""
    fitted_f = [fit_overlap(r) for s in sources if s["kind"] == "overlap"
                and s["role"] == "fit" for r in s["rows"]]
    f = statistics.median(fitted_f) if fitted_f else 1.0
    out = []
    for s in sources:
        if s["kind"] == "read_curve":
            rows, fitted = read_curve_rows(s)
        elif s["kind"] == "overlap":
            rows, fitted = overlap_rows(s, f), {"stream_overlap_fraction": f}
        else:
            rows, fitted = mmap_rows(s, f), {}
        out.append((s, rows, fitted))
    return out


# the Jetson AGX Orin ------------------------------------------------------------------
DATASHEET_NVME = {"bandwidth_gb_s": 7.45, "read_half_bytes": None, "request_bytes": None,
                  "stream_overlap_fraction": 1.0}
ORIN_RUNS = (("ar_stream", {}), ("kangaroo", {"gamma": 5, "l_dm": 3, "mean_accepted": 2.27}),
             ("cats", {"gamma": 5, "l_dm": 3, "mean_accepted": 3.05}))


WHOLE_CHUNK_NVME = {"request_bytes": None}  # one O_DIRECT read per chunk


def orin(nvme: dict | None = None) -> Platform:
    """The shipped Orin profile, or it with its NVMe's fields updated by nvme."""
    p = load_platform(ORIN)
    if not nvme:
        return p
    tiers = tuple(t.model_copy(update=nvme) if t.name == "nvme" else t
                  for t in p.memory_tiers)
    return p.model_copy(update={"memory_tiers": tiers})


def s_per_token(policy: str, params: dict, platform: Platform, tokens: int = 60) -> float:
    res = run_schedule(SimConfig(platform=ORIN, target="vicuna-7b", policy=policy,
                                 params=params, tokens=tokens, seed=1, deterministic=True,
                                 fixed_context=True), platform=platform)
    return res.time_s / res.tokens


def orin_rows() -> list[tuple[str, float, float, float]]:
    """(run, s/token with the datasheet flash, the fitted one, the fitted one read in
    one request per chunk) at 6 and 8 GB budgets."""
    platforms = (orin(DATASHEET_NVME), orin(), orin(WHOLE_CHUNK_NVME))
    rows = []
    for budget in (6, 8):
        for policy, params in ORIN_RUNS:
            p = {**params, "dram_budget_gb": budget}
            rows.append((f"{policy} {budget} GB",
                         *(s_per_token(policy, p, plat) for plat in platforms)))
    return rows


def kangaroo_depth_rows() -> list[tuple[int, float, float, float]]:
    """(l_dm, s/token fitted, s/token datasheet, mean accepted at which l_dm ties
    l_dm=3 on the fitted profile): every depth commits l_dm=3's 2.27 tokens."""
    new, old = orin(), orin(DATASHEET_NVME)
    params = {"gamma": 5, "dram_budget_gb": 8, "mean_accepted": 2.27}
    base = None
    rows = []
    for l_dm in (3, 5, 15):
        t_new = s_per_token("kangaroo", {**params, "l_dm": l_dm}, new)
        t_old = s_per_token("kangaroo", {**params, "l_dm": l_dm}, old)
        base = base or t_new
        rows.append((l_dm, t_new, t_old, 2.27 * t_new / base))
    return rows


def _table(title: str, header: tuple, rows: list, markdown: bool) -> list[str]:
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
                 "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
        return lines + [""]
    width = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in width)
    return [title, fmt.format(*header)] + [fmt.format(*map(str, r)) for r in rows] + [""]


def source_tables(results, markdown: bool) -> list[str]:
    lines, summary = [], []
    for source, rows, fitted in results:
        errs = [_err(sim, pub) for _, pub, sim in rows]
        shown = [(name, f"{pub:g}", f"{sim:.4g}", f"{e:+.1f}%")
                 for (name, pub, sim), e in zip(rows, errs)]
        lines += _table(f"{source['id']} ({source['role']}, {source['kind']})",
                        ("row", "published", "simulated", "error"), shown, markdown)
        fit_text = ", ".join(f"{k} {v:.4g}" for k, v in fitted.items()
                             if isinstance(v, float))
        if fit_text:
            lines += [f"fitted: {fit_text}"]
            profile = fitted.get("profile", {})
            lines += [f"profile {source.get('platform')} {source.get('tier')}: " + ", ".join(
                f"{k} {v:.4g}" for k, v in profile.items())] if profile else []
            lines += [""]
        abs_errs = [abs(e) for e in errs]
        summary.append((source["id"], source["role"], len(rows),
                        f"{statistics.median(abs_errs):.1f}%", f"{max(abs_errs):.1f}%"))
        if source["kind"] == "mmap_stream":
            r = source["rows"][0]
            kept_s = (r["model_bytes"] - r["dram_bytes"]) / (r["flash_gb_s"] * 1e9)
            lines += [f"(a page cache that kept the first {r['dram_bytes'] / 1e9:g} GB "
                      f"instead of LRU would read {kept_s:.1f} s a token: "
                      f"{_err(kept_s, r['s_per_token']):+.0f}%)", ""]
    lines += _table("error by source (|simulated / published - 1|)",
                    ("source", "role", "rows", "median", "worst"), summary, markdown)
    return lines


def orin_tables(markdown: bool) -> list[str]:
    rows = [(name, f"{old:.3f}", f"{new:.3f}", f"{new / old:.2f}x", f"{whole:.3f}",
             f"{whole / old:.2f}x") for name, old, new, whole in orin_rows()]
    lines = _table("Jetson AGX Orin, Vicuna-7B, s/token: datasheet flash vs fitted",
                   ("run", "datasheet", "fitted (128 KiB reads)", "slower",
                    "fitted, one read per chunk", "slower"), rows, markdown)
    depth = [(l, f"{new:.3f}", f"{old:.3f}", f"{tie:.2f}")
             for l, new, old, tie in kangaroo_depth_rows()]
    return lines + _table("Kangaroo draft depth, 8 GB, 2.27 tokens/cycle: s/token",
                          ("l_dm", "fitted", "datasheet", "ties l_dm=3 at tokens/cycle"),
                          depth, markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true",
                        help="print markdown tables (for docs/flash.md)")
    args = parser.parse_args()
    sources = yaml.safe_load(DATA.read_text())["sources"]
    lines = source_tables(by_source(sources), args.markdown) + orin_tables(args.markdown)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
