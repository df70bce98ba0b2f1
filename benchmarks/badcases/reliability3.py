"""The third review's classes (issue 41), each with its variants:

- ``u`` plausibility: published rows and stack or platform files with a number
  in a wrong unit (10x-1000x either way) are refused naming the row or field and
  the likely unit; a value its source accepts, or a poor fit the user accepts,
  is written;
- ``j`` one JSON reader: prompts, config.json and acceptance traces that nest too
  deep, give a key twice, carry a UTF-16 byte-order mark or are empty are refused
  alike; a UTF-8 byte-order mark is read past;
- ``n`` contexts within the models' positions: real prompts (checked before any
  model loads, in words), simulate's prompt_tokens and fit's --contexts;
- ``q`` options read: fit refuses the --set keys its memory check does not read,
  and refuses what simulate refuses on the platform;
- ``g`` options moot: compare's --batch beside a batch sweep, --no-tune where
  nothing is tuned and a value a sweep lists twice, simulate's --seed beside
  --deterministic, fit's policy parameters its memory check does not read, and a
  real run's long prompts, counted by the work budget; compare --draft ngram
  runs prompt lookup, or is refused naming the schedule or setting.
"""

from __future__ import annotations

import codecs
import json

import yaml

PUB = "calibrate --profile a100-sxm-8x -o cal.yaml --published"
FIT = "fit --platform h100-sxm-8x --target llama-3.1-70b --contexts 8192 --batches 1"
SIM70 = ("simulate --platform h100-sxm-8x --target llama-3.1-70b --policy ar --tokens 50 "
         "--placement target=tp8")
SIM_CPU = "simulate --platform cpu-local --target llama-3.2-1b --policy ar --tokens 20"
SMOL = "simulate --platform cpu-local --target smollm2-135m --policy ar --tokens 50"
IMPORT = "profiles import"
GOOD_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
               "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
TRACE_LINE = '{"accepted": [2], "gamma": 4}'


def _rows(h, edit):
    """The shipped a100 tokens/s rows, each changed by ``edit(row)``."""
    path = h.REPO / "hwprofiles" / "data" / "published" / "measurements.yaml"
    rows = [r for r in yaml.safe_load(path.read_text())["measurements"]
            if r["platform"] == "a100-sxm-8x" and r.get("tokens_per_s")]

    def write(out):
        out.write_text(yaml.safe_dump({"measurements": [edit(dict(r)) for r in rows]},
                                      sort_keys=False))
    return write


def _per_token(factor):
    def edit(row):
        row["time_per_token_ms"] = round(1000 / row.pop("tokens_per_s") * factor, 6)
        return row
    return edit


def _scaled(factor, only=None):
    def edit(row):
        if only is None or row["id"] == only:
            row["tokens_per_s"] = row["tokens_per_s"] * factor
        return row
    return edit


def _edited_file(h, kind, name, edit):
    """A shipped platform or stack file with ``edit(data)`` applied."""
    path = h.REPO / "hwprofiles" / "data" / kind / f"{name}.yaml"

    def write(out):
        data = yaml.safe_load(path.read_text())
        edit(data)
        out.write_text(yaml.safe_dump(data, sort_keys=False))
    return write


def _set(*keys, value, note=None):
    def edit(data):
        node = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
        if note:
            data["sources"][keys[-1]] += note
    return edit


def _prompt(words: int, prefix: bytes = b"") -> callable:
    line = json.dumps([{"role": "user", "content": " ".join(["word"] * words)}])
    return lambda p: p.write_bytes(prefix + line.encode() + b"\n")


def _prompts(words: int, count: int) -> callable:
    line = json.dumps([{"role": "user", "content": " ".join(["word"] * words)}]) + "\n"
    return lambda p: p.write_text(line * count)


def _fixtures(h) -> dict:
    a100_tier = ("memory_tiers", 0)
    return {
        "u_div100.yaml": _rows(h, _scaled(0.01)),
        "u_x10_one.yaml": _rows(h, _scaled(10, "gptfast-a100-llama2-7b-tp1")),
        "u_tpt_us.yaml": _rows(h, _per_token(1000)),
        "u_tpt_s.yaml": _rows(h, _per_token(0.001)),
        "u_div1000.yaml": _rows(h, _scaled(0.001)),
        "u_eager_ms.yaml": _edited_file(h, "stacks", "hf-eager",
                                        _set("layer_host_s", value=0.4685)),
        "u_vllm_ms.yaml": _edited_file(h, "stacks", "vllm", _set("call_host_s", value=1.013)),
        "u_llamacpp_backend.yaml": _edited_file(
            h, "stacks", "llama.cpp", _set("backends", "cuda-tegra", "layer_host_s",
                                           value=0.3712)),
        "u_eager_accepted.yaml": _edited_file(
            h, "stacks", "hf-eager", _set("layer_host_s", value=0.02, note=(
                " (accepted outside the plausible range: a debug build)"))),
        "u_hbm_tb.yaml": _edited_file(h, "platforms", "a100-sxm-8x",
                                      _set(*a100_tier, "bandwidth_gb_s", value=2.039)),
        "u_eff_pct.yaml": _edited_file(h, "platforms", "a100-sxm-8x",
                                       _set(*a100_tier, "memory_efficiency", value=79.3)),
        "u_launch_us.yaml": _edited_file(h, "platforms", "a100-sxm-8x",
                                         _set("devices", 0, "launch_overhead_s", value=40.93)),
        "u_capacity_gb.yaml": _edited_file(h, "platforms", "a100-sxm-8x",
                                           _set(*a100_tier, "capacity_bytes", value=80)),
        "j_deep.jsonl": h.text(b"[" * 50_000 + b"]" * 50_000 + b"\n"),
        "j_dup.jsonl": h.text(b'[{"role": "user", "content": "a", "content": "b"}]\n'),
        "j_utf16.jsonl": h.text(codecs.BOM_UTF16_LE
                                + '[{"role": "user", "content": "hi"}]\n'.encode("utf-16-le")),
        "j_bom_huge.jsonl": _prompt(1_000_000, codecs.BOM_UTF8),
        "j_config_deep.json": h.text("[" * 100 + "]" * 100),
        "j_config_utf16.json": h.text(codecs.BOM_UTF16_LE
                                      + json.dumps(GOOD_CONFIG).encode("utf-16-le")),
        "j_config_bom.json": h.text(codecs.BOM_UTF8 + json.dumps(GOOD_CONFIG).encode()),
        "j_trace_dup.jsonl": h.text('{"accepted": [2], "accepted": [3], "gamma": 4}\n'),
        "j_trace_deep.jsonl": h.text(TRACE_LINE + "\n" + "[" * 5000 + "]" * 5000 + "\n"),
        "n_huge.jsonl": _prompt(1_000_000),
        "n_long.jsonl": _prompt(8000),
        "g_long8.jsonl": _prompts(5000, 8),
    }


def register(h) -> None:
    h.FIXTURES.update(_fixtures(h))
    run = h.RUN
    cases = [
        # u: numbers in a wrong unit (R1, the stack note) ----------------------------------
        ("u01", "every published row 1/100 of its speed (R1 div100)", f"{PUB} <u_div100.yaml>"),
        ("u02", "every row 1/1000 of its speed", f"{PUB} <u_div1000.yaml>"),
        ("u03", "time_per_token_ms typed in microseconds (R1 tpt_us)", f"{PUB} <u_tpt_us.yaml>"),
        ("u04", "time_per_token_ms typed in seconds (R1 tpt_seconds)", f"{PUB} <u_tpt_s.yaml>"),
        ("u05", "one fitted row 10x its speed (review nu08)", f"{PUB} <u_x10_one.yaml>"),
        ("u06v", "rows 1/100 with --accept-poor-fit (written, warned, loads)",
         f"{PUB} <u_div100.yaml> --accept-poor-fit"),
        ("u07", "stack layer_host_s 468.5 us typed as 0.4685 s", f"{SMOL} --stack <u_eager_ms.yaml>"),
        ("u08", "stack call_host_s 1.013 ms typed as 1.013 s", f"{SMOL} --stack <u_vllm_ms.yaml>"),
        ("u09", "stack backend entry typed in ms", f"{SMOL} --stack <u_llamacpp_backend.yaml>"),
        ("u10v", "stack value outside the range that its source accepts",
         f"{SMOL} --stack <u_eager_accepted.yaml>"),
        ("u11", "HBM bandwidth typed in TB/s", "profiles validate <u_hbm_tb.yaml>"),
        ("u12", "memory efficiency typed in percent", "profiles validate <u_eff_pct.yaml>"),
        ("u13", "launch overhead typed in microseconds", "profiles validate <u_launch_us.yaml>"),
        ("u14", "tier capacity typed in GB", "profiles validate <u_capacity_gb.yaml>"),
        # j: one JSON reader (R3, R7 and the BOM and '' notes) ------------------------------
        ("j01", "prompts line nested 50,000 deep (R3)", f"{run} --prompts <j_deep.jsonl>"),
        ("j02", "prompts line gives content twice (R7)", f"{run} --prompts <j_dup.jsonl>"),
        ("j03", "prompts file in UTF-16", f"{run} --prompts <j_utf16.jsonl>"),
        ("j04", "prompts with a UTF-8 BOM are read (then refused by positions)",
         f"{run} --prompts <j_bom_huge.jsonl>"),
        ("j05", "--prompts '' (review np22)", f"{run} --prompts ''"),
        ("j06", "config.json nested 100 deep", f"{IMPORT} <j_config_deep.json>"),
        ("j07", "config.json in UTF-16", f"{IMPORT} <j_config_utf16.json>"),
        ("j08v", "config.json with a UTF-8 BOM", f"{IMPORT} <j_config_bom.json>"),
        ("j09", "acceptance trace gives accepted twice",
         f"{h.SD} --set trace=<j_trace_dup.jsonl>"),
        ("j10", "acceptance trace line nested 5,000 deep",
         f"{h.SD} --set trace=<j_trace_deep.jsonl>"),
        # n: contexts within the positions (R2 and the fit note) ----------------------------
        ("n01", "a 1,000,000-word prompt (R2)", f"{run} --prompts <n_huge.jsonl>"),
        ("n02", "an 8,000-word prompt + 300 new tokens past 8,192 positions",
         f"{run} --prompts <n_long.jsonl> --max-new-tokens 300"),
        ("n03", "8,000-word prompts at batch 64 (the run's memory)",
         f"{run} --prompts <n_long.jsonl> --batch 64"),
        ("n04", "simulate prompt_tokens one past llama-3.1-70b's positions",
         f"{SIM70} --set prompt_tokens=131023"),
        ("n05", "simulate smollm2 prompt_tokens 8,192 + 50 tokens",
         f"{SMOL} --set prompt_tokens=8192"),
        ("n06", "fit --contexts past the positions (review nv05)", f"{FIT} --contexts 200000"),
        ("n07v", "simulate at the positions' edge", f"{SIM70} --set prompt_tokens=131022"),
        # q: options fit does not read, and what the platform can run (R4, R5) ------------
        ("q01", "fit --set memory_check=off (R5)", f"{FIT} --set memory_check=off"),
        ("q02", "fit --set alpha=0.8 (R5)", f"{FIT} --set alpha=0.8"),
        ("q03", "fit --set contention=on (R5)", f"{FIT} --set contention=on"),
        ("q04", "fit --set stack=hf-eager (R5)", f"{FIT} --set stack=hf-eager"),
        ("q05", "fit --set prompt_tokens=4096 (R5)", f"{FIT} --set prompt_tokens=4096"),
        ("q06", "fit --set expert_parallel=on, dense model (R5)",
         f"{FIT} --set expert_parallel=on"),
        ("q07", "fit --set histogram=0.5,0.5 (an acceptance setting)",
         f"{FIT} --set histogram=0.5,0.5"),
        ("q08", "fit --set compute_bits=8 on m2-ultra-8x (R4)",
         "fit --platform m2-ultra-8x --target qwen3-32b --set compute_bits=8"),
        ("q09v", "fit --set compute_bits=8 on h100-sxm-8x (has fp8)",
         f"{FIT} --set compute_bits=8"),
        ("q10v", "fit --set kv_bits=8 (read by the memory check)", f"{FIT} --set kv_bits=8"),
        ("q11", "simulate --set compute_bits=8 on cpu-local (no 8-bit peak)",
         f"{SIM_CPU} --set compute_bits=8"),
    ]
    h.CASES_TABLE.extend(cases + _moot(h))


def _moot(h) -> list[tuple[str, str, str]]:
    """The ``g`` class: options given where they would do nothing."""
    lookup = ("compare --platform cpu-local --target smollm2-135m --draft ngram --tokens 50 "
              "--jobs 1 -o out.html")
    sd = "--platform h100-sxm-5x --target llama-3.1-70b --draft llama-3.2-1b"
    mirror = "fit --policy mirror --platform m2-ultra-8x --target qwen3-32b --draft qwen3-0.6b"
    return [
        # compare: --batch beside a batch sweep, --no-tune, repeated values (R6, notes)
        ("g01", "compare --batch 4 beside --sweep batch=1,8 (review nd07)",
         h.compare(sweep="batch=1,8", extra="--batch 4")),
        ("g02", "compare --batch 4 beside --set batch=8",
         h.compare(extra="--batch 4 --set batch=8")),
        ("g03v", "compare --sweep batch=1,8 alone", h.compare(sweep="batch=1,8")),
        ("g04", "compare --no-tune beside --sweep gamma (review nt02)",
         h.compare(sweep="gamma=2,3", extra="--no-tune")),
        ("g05", "compare --no-tune beside --sweep alpha",
         h.compare(sweep="alpha=0.6,0.8", extra="--no-tune")),
        ("g06", "compare --no-tune with ar alone (nothing to tune)",
         "compare --platform cpu-local --target smollm2-135m --draft none --policies ar "
         "--tokens 50 --jobs 1 --no-tune -o out.html"),
        ("g07v", "compare --no-tune beside a batch sweep (each batch untuned)",
         h.compare(sweep="batch=1,8", extra="--no-tune")),
        ("g08", "compare --sweep gamma=2,2,4 (a value twice)", h.compare(sweep="gamma=2,2,4")),
        ("g09", "compare --sweep batch=1,1 (review nd08)", h.compare(sweep="batch=1,1")),
        ("g10", "compare --sweep stack=compiled,compiled (review ns32)",
         h.compare(sweep="stack=compiled,compiled")),
        ("g11", "compare --sweep gamma=2,4,2.0 (2 and 2.0 alike)",
         h.compare(sweep="gamma=2,4,2.0")),
        # compare --draft ngram (review nn17)
        ("g12", "compare --draft ngram without match= or trace=",
         f"{lookup} --policies ar,sd --sweep gamma=4,8"),
        ("g13", "compare --draft ngram with mirror listed",
         f"{lookup} --policies ar,mirror --set match=0.6"),
        ("g14", "compare --draft ngram with a draft model's draft_layers",
         f"{lookup} --policies ar,sd --set match=0.6 --set draft_layers=15"),
        ("g15v", "compare --draft ngram --set match=0.6 (sd by prompt lookup)",
         f"{lookup} --policies ar,sd --set match=0.6 --sweep gamma=4,8"),
        # simulate, fit, run
        ("g16", "simulate --seed beside --deterministic", f"{h.SD} --deterministic --seed 3"),
        ("g17", "fit --policy mirror --set omega=0.5 (not read by the memory check)",
         f"{mirror} --set omega=0.5"),
        ("g18", "fit --policy tree --set temperature and target_top_mass together",
         f"fit --policy tree {sd} --set temperature=0.5 --set target_top_mass=0.6"),
        ("g19", "fit --policy sd --set draft_collectives=0", f"fit --policy sd {sd} "
         "--set draft_collectives=0"),
        ("g20", "fit --policy ssd --set fanout=5", f"fit --policy ssd {sd} --set r=1.0 "
         "--set fanout=5"),
        ("g21v", "fit --policy sd --set gamma=9 (read: the verify pass's width)",
         f"fit --policy sd {sd} --set gamma=9"),
        ("g22", "run: 8 prompts of 5,000 words, 4 new tokens (the prompts' prefill)",
         f"{h.RUN} --prompts <g_long8.jsonl>"),
    ]
