"""hetspec fit: what fits on a platform (largest batch, longest context, fewest
devices, every layout of its groups), by the memory check every run passes."""

from __future__ import annotations

import argparse

from analyses.cli import DEFAULT_POLICY, SIM_TOKENS, config_from_args, emit_json, paragraph
from analyses.commands import COMMANDS
from analyses.compare.sweep import progress_bar
from analyses.run.budget import Estimate, allow_large_argument, check, readable
from analyses.run.api import check_positions, memory_request, run_models
from analyses.run.capacity import at, checks_count, fit_report, layouts
from analyses.run.memory import pieces
from analyses.run.config import (MAX_PROMPT_TOKENS, parse_sets, parse_value, split_items,
                                 split_sets)
from simcore import acceptance
from hwprofiles import load_platform
from hwprofiles.schema import resolve
from policies import entry
from policies.base import AR

DEFAULT_CONTEXTS = "8192"
DEFAULT_BATCHES = "1"
# memory checks a second on one core: python benchmarks/bench_fit.py gives at least
# 2,300 (every check its upper bound counts; 2 shared cores, no GPU, 2026-11-26);
# counted at 1,000 so that the time estimated stays an upper bound
CHECKS_PER_S = 1_000
CHECKS_BUDGET = CHECKS_PER_S * 600
# run options the memory check does not read: given to fit, they are refused, not
# dropped (an answer that looks like it took them)
IGNORED = {"memory_check": "fit is the memory check itself",
           "contention": "it changes time, not memory",
           "stack": "a stack prices host time, not memory",
           "prompt_tokens": "fit varies the context itself; give the contexts with "
                            "--contexts",
           "expert_parallel": "fit tries every mixture-of-experts layout both "
                              "tensor- and expert-parallel: its EP rows"}


def register(sub) -> None:
    p = sub.add_parser(
        "fit", help=COMMANDS["fit"],
        description=paragraph(
            "Capacity planning by the memory check every run passes (weights, KV cache "
            "and activations per device): for each layout of the platform's groups "
            "(the target tensor-parallel on a group, or on one device; a mixture of "
            "experts also expert-parallel; AR also pipelined over the stage roles), "
            "the largest batch at each --contexts "
            "value and the longest context at each --batches value, the memory per "
            "device at that batch, and the fewest devices that hold the first batch "
            "at the first context. Each answer is accepted by 'hetspec simulate' with "
            "the same settings, and one step above it is refused."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: hetspec fit --platform h100-sxm-8x --target llama-3.1-70b "
               "--contexts 8192,32768 --batches 1,32")
    p.add_argument("--platform", required=True, help="platform name or YAML path")
    p.add_argument("--target", required=True, help="target model name or YAML path")
    p.add_argument("--draft", help="draft model (its weights and cache count too)")
    p.add_argument("--policy", help="schedule whose pieces are placed (default: ar, or sd "
                   "with --draft); a streaming schedule keeps only its DRAM budget")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="policy parameter or run option the check counts: prefill_chunk=512 "
                        "(activations of one chunk, not the whole prompt), weight_bits=8, "
                        "kv_bits=8, gamma=5 (positions per verify pass); repeat")
    p.add_argument("--contexts", default=DEFAULT_CONTEXTS, metavar="N,N",
                   help=f"prompt lengths (KV positions before decoding) at which to find "
                        f"the largest batch (default {DEFAULT_CONTEXTS})")
    p.add_argument("--batches", default=DEFAULT_BATCHES, metavar="N,N",
                   help=f"batches at which to find the longest prompt (default "
                        f"{DEFAULT_BATCHES}); the first one also sizes 'fewest devices'")
    p.add_argument("--tokens", type=int, default=SIM_TOKENS,
                   help=f"tokens generated per sequence, whose KV cache counts too "
                        f"(default {SIM_TOKENS}, as simulate's)")
    p.add_argument("--fixed-context", action="store_true",
                   help="count the prompt's context alone (as simulate --fixed-context)")
    p.add_argument("--placement", help="role=device overrides kept in every layout, e.g. "
                   "draft=gpu4")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    allow_large_argument(p, f"{readable(CHECKS_BUDGET)} memory checks, about 10 minutes "
                            "on one CPU core")
    p.set_defaults(func=_fit)


def _sizes(text: str, option: str) -> list[int]:
    out = []
    for item in split_items(text, f"{option} {text}", unique=True):
        value = parse_value(item)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{option} {text}: '{item}' is not a whole number >= 0; "
                             f"write e.g. {option} 2048,8192")
        out.append(value)
    return out


def check_read(sets: list[str], policy: str) -> None:
    """Refuse a --set key the memory check does not read (``IGNORED``, and every
    acceptance setting) in one sentence naming it."""
    given = parse_sets(sets)
    params, _, run = split_sets(policy, given)
    for key in run:
        if key in IGNORED:
            raise ValueError(f"--set {key} has no effect on fit ({IGNORED[key]}); drop it")
    for key in (k for k in given if k not in params and k in acceptance.KEYS):
        raise ValueError(f"--set {key} sets the acceptance, which no memory check reads "
                         "(fit counts weights, KV cache and activations); drop it")


def check_params_read(config, prompt_tokens: int) -> None:
    """Refuse a policy parameter given that the memory check does not read: one
    without which the schedule places the same pieces of models (layers, heads,
    widest pass, resident layers: ``analyses.run.memory.pieces``) where it did
    (mirror's omega, prompt lookup's n), or two that are given together and
    without which it does so (tree's temperature and target_top_mass). One the
    schedule cannot be built without (SSD's hit model) is read."""
    given, fields = config.given("params"), entry(config.policy).params.model_fields
    platform = load_platform(config.platform)
    placement = resolve(platform, config.placement)

    def sized(values: dict) -> list:
        run = at(config.revised(params=values), prompt_tokens=prompt_tokens)
        return pieces(platform, run_models(run), placement, memory_request(run))

    seen = sized(given)
    needed = []  # keys the schedule cannot be built without (alone)
    for key, value in given.items():
        if key not in fields or value == fields[key].default:
            continue
        try:
            if sized({k: v for k, v in given.items() if k != key}) != seen:
                continue
        except ValueError:  # the schedule needs it (PolicyError, a validation)
            needed.append(key)
            continue
        _refuse_unread([key], config.policy)
    if len(needed) > 1:  # given together (tree's temperature and target_top_mass)
        try:
            alike = sized({k: v for k, v in given.items() if k not in needed}) == seen
        except ValueError:
            alike = False
        if alike:
            _refuse_unread(needed, config.policy)


def _refuse_unread(keys: list[str], policy: str) -> None:
    named = " and ".join(f"--set {k}" for k in keys)
    has, it = ("has", "it") if len(keys) == 1 else ("have", "them")
    raise ValueError(f"{named} {has} no effect on fit (without {it} {policy} places the "
                     "same layers, heads and widest pass on the same devices, all the "
                     f"memory check counts); drop {it}")


def fit_config(args):
    """The RunConfig whose memory check the search runs (batch and prompt vary)."""
    policy = args.policy or (DEFAULT_POLICY if args.draft else AR)
    check_read(args.sets, policy)
    ns = argparse.Namespace(**{**vars(args), "policy": policy, "acceptance": None,
                               "batch": 1, "seed": 0})
    return config_from_args(ns, fixed_context=args.fixed_context)


def check_budget(config, contexts, batches, allow_large: bool):
    units = checks_count(config, contexts, batches)
    product = (f"{len(contexts)} contexts and {len(batches)} batches over every layout = "
               f"at most {readable(units)} memory checks")
    return check(Estimate("fit", product, units, "memory checks", CHECKS_PER_S,
                          CHECKS_BUDGET, "give fewer --contexts or --batches", counted=True),
                 allow_large)


def _fit(args) -> int:
    contexts = _sizes(args.contexts, "--contexts")
    batches = _sizes(args.batches, "--batches")
    if min(batches) < 1 or max(contexts) > MAX_PROMPT_TOKENS:
        raise ValueError(f"--batches takes batches of 1 or more and --contexts at most "
                         f"{MAX_PROMPT_TOKENS:,} positions; fix the list")
    config = fit_config(args)
    check_positions(at(config, prompt_tokens=max(contexts)), prompt="--contexts")
    check_params_read(config, max(contexts))
    check_budget(config, contexts, batches, args.allow_large)
    total = len(layouts(load_platform(config.platform), config))
    with progress_bar(total, args.json or total < 8) as bar:
        report = fit_report(config, contexts, batches, progress=bar.update)
    if args.json:
        emit_json(report)
    else:
        print_report(report)
    return 0 if report["fewest_devices"] else 1


def print_report(r: dict) -> None:
    context_kind = "fixed context" if r["fixed_context"] else \
        f"+ {r['tokens']:,} generated tokens"
    models = r["target"] + (f" + draft {r['draft']}" if r["draft"] else "")
    print(f"{models} ({r['policy']}) on {r['platform']}, prompt {context_kind}:")
    heads = [f"batch @{c:,}" for c in r["contexts"]] + \
        [f"context @batch {b}" for b in r["batches"]]
    print(f"  {'layout':22} " + " ".join(f"{h:>18}" for h in heads))
    capped = False
    for row in r["layouts"]:
        cells = [_size(row["largest_batch"][c]) for c in r["contexts"]] + \
            [_size(row["longest_context"][b], r["context_cap"]) for b in r["batches"]]
        capped = capped or any(c.endswith("*") for c in cells)
        print(f"  {row['layout']:22} " + " ".join(f"{c:>18}" for c in cells))
    if capped:
        print(f"  * the models' trained positions end there (max_positions less the "
              f"generated tokens: {r['context_cap']:,}); memory would hold more")
    fewest = r["fewest_devices"]
    if fewest is None:
        print(f"  no layout holds batch {r['batches'][0]} at {r['contexts'][0]:,} positions")
    else:
        print(f"fewest devices: {fewest['devices']} ({fewest['layout']}) for batch "
              f"{fewest['batch']} at {fewest['context']:,} positions")
    print(f"memory per device at the largest batch at {r['contexts'][0]:,} positions:")
    for row in r["layouts"]:
        _print_memory(row)


def _size(value: int | None, cap: int | None = None) -> str:
    """'-' where nothing fits; a context at the models' positions ends in '*', one
    at the cap on every context is a lower bound ('+')."""
    if value is None:
        return "-"
    if value >= MAX_PROMPT_TOKENS:
        return f"{value:,}+"
    return f"{value:,}*" if cap is not None and value >= cap else f"{value:,}"


def _print_memory(row: dict) -> None:
    if row["memory_batch"] is None:
        print(f"  {row['layout']}: does not fit at batch 1: {row['why_not']}")
        return
    print(f"  {row['layout']} at batch {row['memory_batch']:,}:")
    alike: dict[tuple, list[str]] = {}  # a group's members hold equal shares: one line
    for m in row["memory"]:
        key = tuple(round(m[k]) for k in ("weights_bytes", "kv_bytes", "activations_bytes",
                                          "capacity_bytes"))
        alike.setdefault(key, []).extend(m["devices"])
    gb = 1e9
    for (weights, kv, activations, capacity), devices in alike.items():
        who = devices[0] if len(devices) == 1 else f"each of {', '.join(devices)}"
        print(f"    {who}: weights {weights / gb:.1f} GB + KV {kv / gb:.1f} GB + "
              f"activations {activations / gb:.2f} GB = "
              f"{(weights + kv + activations) / gb:.1f} of {capacity / gb:.1f} GB")
