"""Arguments shared by the commands that configure a run (simulate, run, ...)."""

from __future__ import annotations

from analyses.run.config import (MAX_BATCH, MAX_TOKENS, RUN_KEYS, RunConfig, parse_placement,
                             parse_sets, split_sets)
from policies import names

# how each run option is written (RUN_KEYS describes them)
RUN_EXAMPLES = {"contention": "contention=on", "prompt_tokens": "prompt_tokens=128",
                "weight_bits": "weight_bits=4|8|16|32", "kv_bits": "kv_bits=4|8|16|32",
                "memory_check": "memory_check=off", "expert_parallel": "expert_parallel=on",
                "prefill_chunk": "prefill_chunk=512"}


def add_run_arguments(p, *, tokens_default: int = 2000) -> None:
    p.add_argument("--platform", required=True, help="shipped platform name or YAML path "
                   "(see 'hetspec profiles list')")
    p.add_argument("--target", required=True, help="target model name or YAML path")
    p.add_argument("--draft", help="draft model name or YAML path (separate-draft schedules)")
    p.add_argument("--policy", default="sd", help=f"schedule: {', '.join(names())} "
                   "(default: sd)")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="policy parameter (gamma=5; --policy tree: tree=4,2,2,1, or "
                        "width=4 depth=5 nodes=32, rank_alphas=0.6,0.2), acceptance model "
                        "(alpha=0.8, alphas=0.9,0.8, histogram=0.2,0.3,0.5, trace=PATH) or "
                        f"run option ({', '.join(RUN_EXAMPLES[k] for k in RUN_KEYS)}); "
                        "repeat; an unknown key is refused with the policy's valid keys")
    p.add_argument("--acceptance", help="acceptance model kind (iid, positional, histogram, "
                   "trace); normally implied by the --set keys")
    p.add_argument("--tokens", type=int, default=tokens_default,
                   help=f"tokens to generate per sequence (default {tokens_default}; at "
                        f"most {MAX_TOKENS:,}, far beyond real outputs, so that a typo "
                        "cannot start an hours-long run)")
    p.add_argument("--batch", type=int, default=1,
                   help=f"sequences decoded together (at most {MAX_BATCH:,}, above any "
                        "serving batch)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed, an integer >= 0 (same seed, same output)")
    p.add_argument("--placement", help="role=device overrides, e.g. draft=gpu4,target=target_tp")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def config_from_args(args, **overrides) -> RunConfig:
    params, acc, run = split_sets(args.policy, parse_sets(args.sets), args.acceptance)
    fields = dict(platform=args.platform, target=args.target, draft=args.draft,
                  policy=args.policy, params=params, acceptance=acc, tokens=args.tokens,
                  batch=args.batch, seed=args.seed,
                  placement=parse_placement(args.placement), **run)
    fields.update(overrides)
    return RunConfig(**fields)
