"""hetspec serve: requests arriving at a serving engine that runs one schedule."""

from __future__ import annotations

import sys
from dataclasses import replace

from tqdm import tqdm

from analyses.cli import (DEFAULT_POLICY, SettingsHelp, add_stack_argument, announce,
                          emit_json, paragraph)
from analyses.commands import COMMANDS
from analyses.run.budget import Estimate, allow_large_argument, check, readable
from analyses.run.config import parse_placement, parse_sets
from analyses.run.outputs import check_outputs, profile_inputs
from analyses.serve.api import (MAX_BATCH, SERVE_KEYS, TOKEN_BUDGET, Prepared, ServeConfig,
                                capacity, prepare, serve)
from analyses.serve.real import measure_serving
from analyses.serve.workload import LENGTHS, TRACE_CV, check_rate
from analyses.run.config import RunConfig, split_sets
from executors.prompts import load
from policies import names
from policies.runs.breakdown import LABELS

# output tokens the engine simulates per CPU-second, at the least (benchmarks/serve_speed.py
# measures it; a step's cost is spread over its batch)
TOKENS_PER_S = 100_000
BUDGET_TOKENS = 600 * TOKENS_PER_S  # ten minutes
CAPACITY_RUNS = 14  # serving runs a capacity search takes at most, typically

EXAMPLE = ("hetspec serve --platform h100-sxm-8x --target llama-3.1-70b "
           "--draft llama-3.2-1b --policy sd \\\n    --rate 4 --requests 2000 "
           "--slo ttft=0.5,tpot=0.05 --seed 1")


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help=COMMANDS["serve"], formatter_class=SettingsHelp,
        description=paragraph(
            "Simulate a serving engine running one schedule: requests arrive (Poisson at "
            "--rate, burstier with --cv, or from an --arrivals trace; or --concurrency "
            "clients keep N in flight, as benchmark clients do), a continuous-"
            "batching scheduler forms each step's batch (chunked prefill beside the "
            "decodes, a token budget per step, FCFS, recompute preemption when the KV "
            "cache is full, KV held for every proposed position), and each step is the "
            "schedule's own step for the batch formed, priced by the cost model "
            "'hetspec simulate' uses. Prints TTFT, TPOT, end-to-end latency and "
            "queueing percentiles, throughput, goodput and whether the SLO holds; "
            "--capacity finds the highest rate that meets it."),
        epilog=lambda: _epilog())
    p.add_argument("--platform", required=True, help="shipped platform name or YAML path")
    p.add_argument("--target", required=True, help="target model name or YAML path")
    p.add_argument("--draft", help="draft model name or YAML path, or ngram (prompt lookup)")
    p.add_argument("--policy", default=DEFAULT_POLICY, help=f"schedule: "
                   f"{', '.join(names())} (default {DEFAULT_POLICY}; those that stream layers from storage serve no batches "
                   "and are refused)")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="policy parameter (gamma=4, gamma=auto: chosen each step from the "
                        "batch, or off), acceptance (alpha=0.8), run option "
                        "(compute_bits=8, kv_bits=8, ...) or serving key (listed below); "
                        "repeat")
    p.add_argument("--rate", type=float, help="requests per second, arriving at random "
                   "(Poisson unless --cv)")
    p.add_argument("--concurrency", type=int, metavar="N",
                   help="clients keep at most N requests in flight, as a benchmark "
                        "client's --max-concurrency: alone, a closed loop (each finished "
                        "request's client sends the next at once; --requests N with "
                        "--concurrency N is an offline batch of N); with --rate, arrivals "
                        "beyond N in flight wait at their clients. A request's clock "
                        "starts when it is sent")
    p.add_argument("--requests", type=int, default=1000,
                   help="requests in the synthetic workload (default 1000)")
    p.add_argument("--workload", choices=sorted(LENGTHS), default="chat",
                   help="prompt and output lengths, drawn from distributions fitted to "
                        "public traces (default chat; the sources are in the help's end)")
    p.add_argument("--prompt-tokens", type=int, help="every request's prompt, in tokens "
                   "(instead of the workload's)")
    p.add_argument("--output-tokens", type=int, help="every request's output, in tokens")
    p.add_argument("--cv", type=float, default=1.0,
                   help="burstiness: the coefficient of variation of the gaps between "
                        "arrivals, gamma-distributed (1, the default: Poisson; the Azure "
                        f"traces: chat {TRACE_CV['chat']}, code {TRACE_CV['code']})")
    p.add_argument("--arrivals", metavar="FILE",
                   help="a trace of requests instead of --rate: CSV or JSON lines with an "
                        "arrival time (s, or a TIMESTAMP), prompt and output tokens per "
                        "row (Azure: TIMESTAMP,ContextTokens,GeneratedTokens; Splitwise: "
                        "arrived_at,num_prefill_tokens,num_decode_tokens; or arrival_s,"
                        "prompt_tokens,output_tokens) and an optional alpha column, each "
                        "request's acceptance")
    p.add_argument("--slo", help="the service-level objective, seconds or ms: e.g. "
                   "ttft=0.5,tpot=0.05 or ttft=500ms,tpot=50ms")
    p.add_argument("--slo-percentile", type=float, default=90.0,
                   help="share of requests that must meet the SLO for it to hold, in "
                        "percent (default 90)")
    p.add_argument("--capacity", action="store_true",
                   help="find the highest --rate that meets the SLO (bisection; --rate is "
                        "the first rate tried, default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same output)")
    p.add_argument("--placement", help="role=device overrides, e.g. target=tp4")
    add_stack_argument(p)
    p.add_argument("--deterministic", action="store_true",
                   help="no randomness in acceptance: every request commits its expected "
                        "tokens each step (arrivals stay random unless a trace)")
    p.add_argument("--trace", metavar="PATH", help="write the steps and requests as a "
                   "Chrome trace (open in Perfetto)")
    p.add_argument("--record", metavar="PATH",
                   help="write the run record (JSON, every request's figures)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    real = p.add_argument_group(
        "served for real (--real)",
        "serve the requests on this machine with the torch executor (cpu-local and "
        "SmolLM2-135M; needs the torch extra): prompts of a set arrive at --rate and join "
        "the running batch first come, first served, at the next step while it has room "
        "(continuous batching, up to --max-batch), and the record (--record, required) "
        "holds every request's times and steps; 'hetspec replay RECORD' predicts them")
    real.add_argument("--real", action="store_true", help="measure instead of simulate")
    real.add_argument("--prompts", default="grounded", metavar="SET|FILE",
                      help="the prompts, cycled to --requests (default grounded)")
    real.add_argument("--max-new-tokens", type=int, default=32,
                      help="tokens each request generates (default 32)")
    real.add_argument("--max-batch", type=int, metavar="N",
                      help=f"most requests decoded together (default {REAL_MAX_BATCH}; 1 "
                           "serves them one at a time)")
    allow_large_argument(p, f"{readable(BUDGET_TOKENS)} output tokens served, about 10 "
                            "minutes on one CPU core")
    p.set_defaults(func=_serve)


def _epilog() -> str:
    keys = "\n".join(f"  {k}: {v}" for k, v in SERVE_KEYS.items())
    sources = "\n".join(f"  {name}: {m.source}" for name, m in LENGTHS.items())
    return (f"serving keys (--set):\n{keys}\n\nworkloads:\n{sources}\n\n"
            f"engine: at most {MAX_BATCH} requests a step, {TOKEN_BUDGET} positions a step; "
            "the default stack is vllm (per-step host work of a serving engine)\n\n"
            f"example: {EXAMPLE}")


def config_of(args) -> ServeConfig:
    workload = {"rate": args.rate, "concurrency": args.concurrency,
                "requests": args.requests, "workload": args.workload,
                "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                "cv": args.cv, "trace": args.arrivals}
    if args.arrivals is not None:
        for flag, value, default in (("--requests", args.requests, 1000),
                                     ("--cv", args.cv, 1.0),
                                     ("--prompt-tokens", args.prompt_tokens, None),
                                     ("--output-tokens", args.output_tokens, None)):
            if value != default:
                raise ValueError(f"{flag} shapes a synthetic workload; --arrivals gives "
                                 "every request already: drop one of them")
    if args.capacity and args.rate is None and args.concurrency is None:
        workload["rate"] = 0.5
    return ServeConfig.build(platform=args.platform, target=args.target, draft=args.draft,
                             policy=args.policy, sets=parse_sets(args.sets), slo=args.slo,
                             slo_percentile=args.slo_percentile, seed=args.seed,
                             deterministic=args.deterministic,
                             placement=parse_placement(args.placement), stack=args.stack,
                             **workload)


def estimate(ready: Prepared, runs: int = 1) -> Estimate:
    requests = ready.requests
    tokens = sum(r.output_tokens for r in requests) * runs
    what = (f"{runs} serving runs of " if runs > 1 else "") + \
        f"{len(requests):,} requests ({readable(tokens / runs)} output tokens)"
    return Estimate("serve", what, tokens, "output tokens", TOKENS_PER_S, BUDGET_TOKENS,
                    "serve fewer --requests or shorter outputs")


def _serve(args) -> int:
    if args.real:
        return _serve_real(args)
    if args.prompts != "grounded" or args.max_new_tokens != 32:
        raise ValueError("--prompts and --max-new-tokens shape a served workload measured "
                         "for real; add --real or drop them")
    if args.max_batch is not None:
        raise ValueError("--max-batch caps the engine of a workload served for real; a "
                         "simulated one takes --set max_batch=N")
    config = config_of(args)
    check_outputs({"--trace": args.trace, "--record": args.record},
                  profile_inputs(platform=args.platform, target=args.target,
                                 draft=args.draft),
                  names={"--trace": "serve-trace.json", "--record": "serve-record.json"})
    if args.capacity and (args.trace or args.record):
        raise ValueError("--capacity runs many rates; --trace and --record write one run: "
                         "run serve at the rate it finds to write them")
    ready = prepare(config)
    check(estimate(ready, CAPACITY_RUNS if args.capacity else 1), args.allow_large)
    if args.capacity:
        return _capacity(config, args)
    bar = _bar(len(ready.requests), args.json)
    try:
        out = serve(config, progress=bar.update if bar else None, trace_path=args.trace,
                    record_path=args.record, prepared=ready)
    finally:
        if bar:
            bar.close()
    if args.json:
        emit_json(out.metrics)
    else:
        print_serving(config, out.metrics)
    for path, what in ((args.trace, "Chrome trace of steps and requests, open in Perfetto"),
                       (args.record, "serving record")):
        if path:
            announce(path, what, json_mode=args.json)
    return 0


def _bar(total: int, json_mode: bool):
    if json_mode or not sys.stderr.isatty() or total < 2000:
        return None
    return tqdm(total=total, desc="serving", unit="request", file=sys.stderr, leave=False)


def _capacity(config: ServeConfig, args) -> int:
    def note(rate, holds):
        if not args.json:
            print(f"  {rate:.3g} requests/s: SLO {'holds' if holds else 'missed'}",
                  file=sys.stderr, flush=True)
    found = capacity(config, low=config.rate, progress=note)
    if args.json:
        emit_json({"capacity_requests_per_s": found["rate"], "tried": found["tried"],
                   "at_capacity": found["metrics"]})
        return 0
    if found["rate"] is None:
        print(f"{config.run.policy} on {config.run.platform}: {found['why']} "
              f"({config.slo.words()}); lower the load or relax the SLO")
        return 0
    print(f"{config.run.policy} on {config.run.platform}: capacity "
          f"{found['rate']:.3g} requests/s with {config.slo.words()} "
          f"({len(found['tried'])} serving runs)")
    print_serving(replace(config, rate=found["rate"]), found["metrics"], header=False)
    return 0


def _ms(seconds) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def print_percentiles(m: dict) -> None:
    """TTFT, TPOT, end-to-end latency and queueing: p50, p90, p99 and mean."""
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("latency", "e2e_s"),
                       ("queueing", "queue_s")):
        s = m[key]
        print(f"  {label:9} p50 {_ms(s['p50']):>9}  p90 {_ms(s['p90']):>9}  "
              f"p99 {_ms(s['p99']):>9}  mean {_ms(s['mean']):>9}")


def print_serving(config: ServeConfig, m: dict, header: bool = True) -> None:
    run = config.run
    if header:
        lengths = f"{config.workload} lengths"
        if config.trace:
            arrivals = f"from {config.trace}"
        elif config.rate is None:
            arrivals = f"from {config.concurrency} clients in a closed loop ({lengths})"
        else:
            arrivals = (f"at {config.rate:g} requests/s ({lengths}"
                        f"{'' if config.cv == 1 else f', cv {config.cv:g}'})")
        if config.concurrency is not None and (config.rate is not None or config.trace):
            arrivals += f", at most {config.concurrency} in flight"
        gamma = " (gamma chosen each step)" if config.auto else ""
        print(f"{run.policy}{gamma} on {run.platform} under stack {run.stack}: "
              f"{m['requests']:,} requests {arrivals}, seed {run.seed}")
    print_percentiles(m)
    print(f"  throughput {m['throughput_tokens_per_s']:,.1f} output tokens/s "
          f"({m['throughput_requests_per_s']:.3g} requests/s); batch {m['batch_mean']:.1f} "
          f"on average (at most {m['batch_max']}), KV cache at most "
          f"{m['kv_peak_share']:.0%} of {m['kv_capacity_positions']:,} positions, "
          f"{m['preemptions']:,} preemptions")
    clients = m.get("clients")
    if clients and clients["held_requests"]:
        print(f"  {clients['held_requests']:,} requests waited at their clients for one of "
              f"{clients['concurrency']} slots in flight, {_ms(clients['held_s_mean'])} on "
              f"average (not counted in their latency)")
    slo = m["slo"]
    if slo["attainment"] is not None:
        verdict = "holds" if slo["holds"] else "is missed"
        print(f"  SLO ({config.slo.words()}) {verdict}: {slo['attainment']:.1%} of "
              f"requests meet it; goodput {slo['goodput_requests_per_s']:.3g} requests/s, "
              f"{slo['goodput_tokens_per_s']:,.1f} tokens/s")
    b = m["breakdown"]
    print(f"  where the time goes: the engine steps {m['busy_share']:.0%} of the run, "
          f"{m['steps']:,} steps of {_ms(b['step_s_mean'])} on average, "
          f"{b['decode_share_of_steps']:.0%} of their time decoding and "
          f"{b['prefill_share_of_steps']:.0%} prefilling")
    parts = m.get("step_breakdown") or {}
    if parts.get("per_token_s"):
        total = sum(parts["per_token_s"].values())
        costs = ", ".join(f"{LABELS[c]} {t / total:.0%}" for c, t in sorted(
            parts["per_token_s"].items(), key=lambda kv: -kv[1]) if t / total >= 0.01)
        print(f"  a decode step at batch {parts['batch']} ({parts['mode']}): {costs}")
    if config.auto:
        used = ", ".join(f"{k} {v:,}" for k, v in m["mode_steps"].items() if v)
        print(f"  steps by draft length: {used} ({m['mode_switches']:,} switches)")


REAL_TOKENS_PER_S = 20  # generated tokens a second on a CPU core, at the least
REAL_MAX_BATCH = 8  # requests decoded together on a CPU core by default


def _serve_real(args) -> int:
    """--real: the requests served on this machine and recorded."""
    if args.record is None:
        raise ValueError("--real writes its record: give --record PATH")
    for flag, bad in (("--arrivals", args.arrivals is not None), ("--capacity", args.capacity),
                      ("--concurrency", args.concurrency is not None),
                      ("--trace", args.trace is not None), ("--slo", args.slo is not None),
                      ("--prompt-tokens", args.prompt_tokens is not None),
                      ("--output-tokens", args.output_tokens is not None),
                      ("--deterministic", args.deterministic), ("--cv", args.cv != 1.0)):
        if bad:
            raise ValueError(f"{flag} does not apply to --real (its prompts and their "
                             "outputs are real; arrivals are Poisson at --rate); drop it")
    if args.rate is None:
        raise ValueError("--real needs --rate: the requests' arrival rate per second")
    check_rate(args.rate)
    if not 1 <= args.requests <= 256:
        raise ValueError(f"--requests {args.requests} is outside 1..256 for a measured "
                         "workload")
    if not 1 <= args.max_new_tokens <= 1000:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} is outside 1..1000")
    max_batch = REAL_MAX_BATCH if args.max_batch is None else args.max_batch
    if not 1 <= max_batch <= 256:
        raise ValueError(f"--max-batch {max_batch} is outside 1..256: the most requests "
                         "decoded together")
    sets = parse_sets(args.sets)
    if "max_batch" in sets:
        raise ValueError("--set max_batch caps the simulated engine; --real takes "
                         "--max-batch N")
    params, acc, run = split_sets(args.policy, sets)
    if acc != {"kind": "iid"}:
        raise ValueError("a measured workload's acceptance is the models' own; drop the "
                         "acceptance settings")
    config = RunConfig(platform=args.platform, target=args.target, draft=args.draft,
                       policy=args.policy, params=params, seed=args.seed,
                       placement=parse_placement(args.placement), **run)
    messages = load(args.prompts)
    check_outputs({"--record": args.record}, profile_inputs(platform=args.platform),
                  names={"--record": "served.json"})
    work = args.requests * args.max_new_tokens
    check(Estimate("serve --real", f"{args.requests} requests of {args.max_new_tokens} "
                   "tokens", work, "generated tokens", REAL_TOKENS_PER_S, 1000,
                   "serve fewer --requests or lower --max-new-tokens"), args.allow_large)
    metrics = measure_serving(config, args.max_new_tokens, messages, rate=args.rate,
                              requests=args.requests, record_path=args.record,
                              max_batch=max_batch)
    if args.json:
        emit_json(metrics)
        return 0
    print(f"{config.policy} served on {config.platform} ({args.requests} requests at "
          f"{args.rate:g}/s, at most {max_batch} together, measured):")
    print_percentiles(metrics)
    print(f"  {metrics['tokens_per_step']:.2f} tokens a step; hetspec replay "
          f"{args.record} predicts these")
    announce(args.record, "served workload record", json_mode=False)
    return 0
