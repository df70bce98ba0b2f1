"""The serving class (issue 40), ``s``: arrival traces with unsorted, negative,
repeated or absurd rows, rates of 0 or above any hardware, SLOs in the wrong unit,
requests longer than the KV cache, concurrencies of 0 or beside what they make
moot, options that a serving run would ignore; each
a one-sentence refusal with nothing written. ``v`` cases must run."""

from __future__ import annotations

SERVE = ("serve --platform h100-sxm-8x --target llama-3.1-70b --draft llama-3.2-1b "
         "--policy sd --requests 50")
RATE = f"{SERVE} --rate 4"
HEAD = "arrival_s,prompt_tokens,output_tokens\n"
REAL = ("serve --real --platform cpu-local --target smollm2-135m --policy ar --rate 1 "
        "--requests 2 --record served.json")


def _text(body: str):
    return lambda p: p.write_text(body)


def _fixtures() -> dict:
    return {
        "s_unsorted.csv": _text(HEAD + "0,100,20\n2,100,20\n1,100,20\n"),
        "s_negative.csv": _text(HEAD + "-0.5,100,20\n1,100,20\n"),
        "s_repeated.csv": _text(HEAD + "0,100,20\n1,100,20\n1,100,20\n"),
        "s_ms.csv": _text(HEAD + "0,100,20\n250000000000,100,20\n"),
        "s_zero.csv": _text(HEAD + "0,0,20\n"),
        "s_fraction.csv": _text(HEAD + "0,100.5,20\n"),
        "s_nocolumn.csv": _text("arrival_s,prompt_tokens\n0,100\n"),
        "s_alpha.csv": _text("arrival_s,prompt_tokens,output_tokens,alpha\n0,100,20,80\n"),
        "s_mixed.csv": _text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             "2023-11-16 18:15:46.68,374,44\n3.5,396,109\n"),
        "s_binary.csv": lambda p: p.write_bytes(b"\x00\x01\xff" * 100),
        "s_empty.csv": _text(""),
        "s_good.csv": _text(HEAD + "0,100,20\n0.5,200,30\n0.5,150,30\n2,100,10\n"),
        "s_azure.csv": _text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             "2023-11-16 18:15:46.6805900,374,44\n"
                             "2023-11-16 18:15:50.9951690,396,109\n"),
    }


def register(h) -> None:
    h.FIXTURES.update(_fixtures())
    arrivals = ("serve --platform h100-sxm-8x --target llama-3.1-70b --draft llama-3.2-1b "
                "--policy sd --arrivals")
    cases = [
        ("a01", "arrival trace not sorted by time", f"{arrivals} <s_unsorted.csv>"),
        ("a02", "arrival trace with a negative time", f"{arrivals} <s_negative.csv>"),
        ("a03", "arrival trace with a row repeated", f"{arrivals} <s_repeated.csv>"),
        ("a04", "arrival times in microseconds", f"{arrivals} <s_ms.csv>"),
        ("a05", "a request of 0 prompt tokens", f"{arrivals} <s_zero.csv>"),
        ("a06", "a fractional token count", f"{arrivals} <s_fraction.csv>"),
        ("a07", "a trace without output_tokens", f"{arrivals} <s_nocolumn.csv>"),
        ("a08", "an alpha of 80 (percent)", f"{arrivals} <s_alpha.csv>"),
        ("a09", "timestamps and seconds mixed", f"{arrivals} <s_mixed.csv>"),
        ("a10", "a binary file as the trace", f"{arrivals} <s_binary.csv>"),
        ("a11", "an empty trace", f"{arrivals} <s_empty.csv>"),
        ("a12", "--rate 0", f"{SERVE} --rate 0"),
        ("a13", "--rate above any hardware (per hour typed)", f"{SERVE} --rate 3600000"),
        ("a14", "--rate nan", f"{SERVE} --rate nan"),
        ("a15", "an SLO in milliseconds without the unit", f"{RATE} --slo ttft=500,tpot=50"),
        ("a16", "an SLO key that is not ttft or tpot", f"{RATE} --slo e2e=2"),
        ("a17", "a request longer than the KV cache (70B on two H100s)",
         "serve --platform h100-sxm-8x --target llama-3.1-70b --policy ar --rate 1 "
         "--requests 5 --prompt-tokens 120000 --output-tokens 1000 --placement target=tp2"),
        ("a18", "a request past the model's positions",
         f"{RATE} --prompt-tokens 130000 --output-tokens 5000"),
        ("a19", "--rate beside --arrivals", f"{arrivals} <s_good.csv> --rate 2"),
        ("a20", "--requests beside --arrivals", f"{arrivals} <s_good.csv> --requests 9"),
        ("a21", "a schedule that streams from flash", f"{RATE} --policy cats"),
        ("a22", "--capacity without an SLO", f"{RATE} --capacity"),
        ("a23", "switch_s without gamma=auto", f"{RATE} --set switch_s=0.001"),
        ("a24", "gamma=auto on a key that is not tuned", f"{RATE} --set alpha=auto"),
        ("a25", "--set prompt_tokens (each request has its own)",
         f"{RATE} --set prompt_tokens=100"),
        ("a26", "--requests 0", f"{SERVE} --rate 1 --requests 0"),
        ("a27", "compare --serve without a rate sweep",
         "compare --serve --platform h100-sxm-8x --target llama-3.1-70b "
         "--draft llama-3.2-1b --sweep gamma=2,4"),
        ("a28", "compare --slo without --serve",
         "compare --platform h100-sxm-8x --target llama-3.1-70b --draft llama-3.2-1b "
         "--slo ttft=1"),
        ("a32", "--real --max-batch 0", f"{REAL} --max-batch 0"),
        ("a33", "--real --max-batch -2", f"{REAL} --max-batch -2"),
        ("a34", "--max-batch without --real", f"{RATE} --max-batch 4"),
        ("a35", "--real with --set max_batch (the simulated engine's key)",
         f"{REAL} --set max_batch=4"),
        ("a29v", "a good trace", f"{arrivals} <s_good.csv>"),
        ("a30v", "an Azure trace (TIMESTAMP, ContextTokens, GeneratedTokens)",
         f"{arrivals} <s_azure.csv>"),
        ("a31v", "a synthetic run with an SLO", f"{RATE} --slo ttft=500ms,tpot=50ms"),
        ("a40", "--concurrency 0", f"{SERVE} --concurrency 0"),
        ("a41", "--concurrency alone with --cv (nothing arrives at a rate)",
         f"{SERVE} --concurrency 8 --cv 3"),
        ("a42", "--capacity with --concurrency alone (no rate to search)",
         f"{SERVE} --concurrency 8 --capacity --slo ttft=0.5,tpot=0.05"),
        ("a43", "compare --serve sweeping rate and concurrency together",
         "compare --serve --platform h100-sxm-8x --target llama-3.1-70b "
         "--draft llama-3.2-1b --sweep rate=1,2 --sweep concurrency=1,4"),
        ("a44", "compare --serve with a fractional concurrency",
         "compare --serve --platform h100-sxm-8x --target llama-3.1-70b "
         "--draft llama-3.2-1b --sweep concurrency=1,2.5"),
        ("a45v", "a closed loop of 8 clients", f"{SERVE} --concurrency 8"),
        ("a46v", "arrivals at a rate, at most 4 in flight",
         f"{RATE} --concurrency 4 --slo ttft=1,tpot=0.05"),
    ]
    h.CASES_TABLE.extend(cases)
