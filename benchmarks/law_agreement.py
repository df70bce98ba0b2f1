"""How closely deterministic simulation reproduces each law on the shipped platforms.

Every law is fed the terms its schedule exports, priced by the simulator's own
cost model (``analyses.laws.terms``: heads, links, collectives included), and
compared with a deterministic, fixed-context run of its schedule; the table
prints the largest relative error per law and platform. SD and EESD are exact; what remains of PPSD, SSD and Mirror-SD is the
start-up (the pipeline's first fill, the first round without pre-speculation,
the first rollout), which shrinks as 1/tokens (SSD at 1,200 tokens: up to 0.5%;
at 4,000: 0.11%). The tests hold each within 0.5%.

    python benchmarks/law_agreement.py
"""

from __future__ import annotations

from analyses.run.api import RunConfig, simulate
from analyses.laws.terms import law_terms

PAIRS = {"a100-sxm-8x": ("vicuna-7b", "llama-3.2-1b"),
         "h100-sxm-5x": ("llama-3.1-70b", "llama-3.2-1b"),
         "m2-ultra-8x": ("qwen3-32b", "qwen3-0.6b"),
         "jetson-agx-orin-64gb": ("vicuna-7b", "llama-3.2-1b"),
         "snapdragon-8-gen3": ("llama-3.2-1b", "qwen3-0.6b"),
         "cpu-local": ("smollm2-135m", "smollm2-135m")}
STAGES = {"m2-ultra-8x": {f"stage{i}": f"gpu{i}" for i in range(8)}}  # one stage per node


def _cfg(platform, policy, params, alpha, draft=True, **kw) -> RunConfig:
    target, d = PAIRS[platform]
    return RunConfig(platform=platform, target=target, draft=d if draft else None,
                     policy=policy, params=params, acceptance={"kind": "iid", "alpha": alpha},
                     deterministic=True, fixed_context=True, **kw)


def _errors(platform: str) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for alpha in (0.6, 0.9):
        cfg = _cfg(platform, "sd", {"gamma": 4}, alpha, tokens=400)
        out.setdefault("sd", []).append(
            simulate(cfg).metrics["speedup_vs_ar"] / law_terms(cfg).law(alpha)["speedup"])
        cfg = _cfg(platform, "eesd", {"exit_layer": 8, "gamma": 4}, alpha, False, tokens=400)
        out.setdefault("eesd", []).append(simulate(cfg).metrics["speedup_vs_ar"]
                                          / law_terms(cfg).law(alpha)["speedup"])
        if platform in ("a100-sxm-8x", "m2-ultra-8x"):
            cfg = _cfg(platform, "ppsd", {"exit_layer": 8}, alpha, False, tokens=2000,
                       placement=STAGES.get(platform, {}))
            out.setdefault("ppsd", []).append(simulate(cfg).metrics["speedup_vs_ar"]
                                              / law_terms(cfg).ppsd()["speedup"])
        cfg = _cfg(platform, "mirror", {"gamma": 8, "omega": 1.0}, alpha, tokens=2000)
        t = law_terms(cfg)
        out.setdefault("mirror", []).append(
            simulate(cfg, baseline=False).metrics["step_latency_s"] / t.step_s(t.draft_s))
        if platform != "jetson-agx-orin-64gb":  # one GPU: no overlap, no SSD law
            cfg = _cfg(platform, "ssd", {"k": 5, "fanout": 3, "hit_rate": 0.8}, alpha,
                       tokens=4000)
            m, t = simulate(cfg, baseline=False).metrics, law_terms(cfg)
            out.setdefault("ssd", []).append(m["mean_tokens_per_step"] * t.t_v_s
                                             / m["step_latency_s"] / t.speedup(0.8))
    return {law: max(abs(r - 1) for r in ratios) for law, ratios in out.items()}


def main() -> None:
    laws = ("sd", "eesd", "ppsd", "mirror", "ssd")
    print(f"{'platform':22s}" + "".join(f"{law:>10s}" for law in laws))
    for platform in PAIRS:
        errors = _errors(platform)
        print(f"{platform:22s}" + "".join(
            f"{errors[law]:>10.3%}" if law in errors else f"{'-':>10s}" for law in laws))


if __name__ == "__main__":
    main()
