"""Class 5 of the second review: inputs mean what they say (N6-N9).

An empty item in a list and a key given twice are refused where lists and
KEY=VALUE pairs are parsed; an option the configuration leaves without effect
is refused; ``profiles import`` reads ``quantization_config`` as the weights'
width (or refuses it pointing at ``--weight-bits``); an input path that is a
FIFO, a device or empty is named as what it is; an integer too long to convert
names its file and field; a schedule's range checks speak before the memory
check.
"""

from __future__ import annotations

import json
import os

BIG = "9" * 5000  # more digits than Python converts (4300)
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
         "tie_word_embeddings": True}
QUANT = {"i_gptq.json": {"quant_method": "gptq", "bits": 4, "group_size": 128},
         "i_awq.json": {"quant_method": "awq", "bits": 4, "version": "gemm"},
         "i_bnb4.json": {"quant_method": "bitsandbytes", "load_in_4bit": True},
         "i_bnb8.json": {"quant_method": "bitsandbytes", "load_in_8bit": True},
         "i_fp8.json": {"quant_method": "fp8", "activation_scheme": "dynamic"},
         "i_ct.json": {"quant_method": "compressed-tensors", "config_groups": {
             "group_0": {"weights": {"num_bits": 8, "type": "float"}}}},
         "i_hqq.json": {"quant_method": "hqq", "nbits": 4},
         "i_gptq3.json": {"quant_method": "gptq", "bits": 3},
         "i_bnb_both.json": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                             "load_in_8bit": True},
         "i_ct_mixed.json": {"quant_method": "compressed-tensors", "config_groups": {
             "a": {"weights": {"num_bits": 4}}, "b": {"weights": {"num_bits": 8}}}},
         "i_qc_list.json": [{"quant_method": "gptq", "bits": 4}]}

SIM = "simulate --platform cpu-local --target smollm2-135m --tokens 50"
SD = f"{SIM} --policy sd --set draft_layers=15"
TREE = f"{SIM} --policy tree --set draft_layers=15"
SSD = f"{SIM} --policy ssd --draft smollm2-135m --set hit_rate=0.7"
MIRROR = f"{SIM} --policy mirror --draft smollm2-135m"
H100_MOE = ("simulate --platform h100-sxm-5x --target qwen3-30b-a3b --tokens 20 --policy ar "
            "--set expert_parallel=on")
TRAIN = "train-draft -o drafts.safetensors"
IMPORT = "profiles import"


def _config(quant) -> str:
    return json.dumps({**LLAMA, "quantization_config": quant})


def _spans_fifo(run) -> None:
    (run / "spans.jsonl").unlink()
    os.mkfifo(run / "spans.jsonl")


def _record_long_int(run) -> None:
    """metrics.steps written as a 5000-digit integer (json.dumps cannot write one)."""
    path = run / "record.json"
    record = json.loads(path.read_text())
    record["metrics"]["steps"] = "LONG"
    path.write_text(json.dumps(record, indent=2).replace('"LONG"', BIG))


def _record_dup_key(run) -> None:
    """record.json with a second "kind" key (json.dumps cannot write one)."""
    path = run / "record.json"
    text = path.read_text().rstrip()
    path.write_text(text[:-1].rstrip() + ',\n  "kind": "simulated"\n}\n')


def register(h) -> None:
    run = h.RUN
    h.FIXTURES.update({name: h.text(_config(q)) for name, q in QUANT.items()})
    h.FIXTURES.update({
        "i_plain.json": h.text(json.dumps(LLAMA)),
        "i_big.json": h.text(json.dumps(LLAMA).replace('"vocab_size": 128256',
                                                       f'"vocab_size": {BIG}')),
        "i_big_model.yaml": lambda p: p.write_text(
            (h.MODELS / "smollm2-135m.yaml").read_text().replace(
                "n_layers: 30", f"n_layers: {BIG}", 1)),
        "i_big_published.yaml": h.text(f"measurements:\n  - tokens_per_s: {BIG}\n"),
        "i_dup.json": h.text(json.dumps(LLAMA)[:-1] + ', "hidden_size": 4096}'),
        "i_dup_model.yaml": lambda p: p.write_text(
            (h.MODELS / "smollm2-135m.yaml").read_text().replace(
                "n_layers: 30", "n_layers: 30\nn_layers: 3", 1)),
        "i_dup_platform.yaml": lambda p: p.write_text(
            (h.PLATFORMS / "cpu-local.yaml").read_text() + "name: cpu-other\n"),
        "i_dup_published.yaml": h.text("measurements:\n  - platform: a100-sxm-8x\n"
                                       "    platform: h100-sxm-5x\n"),
    })
    h.VARIANTS.update({"i_spans_fifo": _spans_fifo, "i_record_long_int": _record_long_int,
                       "i_record_dup_key": _record_dup_key})
    cases = [
        # N7: empty list items --------------------------------------------------------
        ("i01", "--set tree=4,,2 (empty item inside)", f"{TREE} --set tree=4,,2"),
        ("i02", "--set alphas=0.9, (trailing comma)", f"{SD} --set alphas=0.9,"),
        ("i03", "--set histogram=,0.5,0.5 (leading comma)", f"{SD} --set histogram=,0.5,0.5"),
        ("i04", "--sweep gamma=,,, (every item empty)", h.compare(sweep="gamma=,,,")),
        ("i05", "--sweep 'tree=4,2;;3' (empty value between ;)",
         h.compare(policies="ar,tree", sweep="'tree=4,2;;3'")),
        ("i06", "--sweep 'tree=4,2;' (trailing ;)",
         h.compare(policies="ar,tree", sweep="'tree=4,2;'")),
        ("i07", "--policies ar,,sd", h.compare(policies="ar,,sd")),
        ("i08", "--placement target=cpu0, (trailing comma)", f"{SD} --placement target=cpu0,"),
        ("i09", "--placement '' (empty list)", f"{SD} --placement ''"),
        ("i10", "--sweep 'rank_alphas=0.6,,0.2'",
         h.compare(policies="ar,tree", sweep="'rank_alphas=0.6,,0.2'")),
        # N7: repeated keys -------------------------------------------------------------
        ("i11", "--set alpha twice (simulate)", f"{SD} --set alpha=0.8 --set alpha=0.2"),
        ("i12", "law --set alpha twice", "law leviathan --set alpha=0.8 --set gamma=5 "
         "--set alpha=0.2"),
        ("i13", "compare --sweep gamma twice", h.compare(extra="--sweep gamma=4..5")),
        ("i14", "compare --set alpha twice", h.compare(extra="--set alpha=0.8 --set alpha=0.7")),
        ("i15", "--set key twice, once with spaces", f"{SD} --set ' gamma=3' --set gamma=4"),
        ("i16", "--policies ar,sd,ar (a policy twice)", h.compare(policies="ar,sd,ar")),
        # N8/N9: train-draft lists and options that train nothing -------------------------
        ("i17", "train-draft --exits 8,8 (duplicate exit)", f"{TRAIN} --exits 8,8"),
        ("i18", "train-draft --exits '' (empty)", f"{TRAIN} --exits ''"),
        ("i19", "train-draft --exits 8,,15", f"{TRAIN} --exits 8,,15"),
        ("i20", "train-draft --ahead none --eta 3 (eta unused)", f"{TRAIN} --ahead none --eta 3"),
        ("i21", "train-draft --ahead 15 --eta 1 (ahead unused)", f"{TRAIN} --ahead 15 --eta 1"),
        ("i22", "train-draft --exits 8 (default --ahead 15 has no exit)", f"{TRAIN} --exits 8"),
        ("i23", "train-draft --exits none --adapters none (no heads)",
         f"{TRAIN} --exits none --adapters none"),
        ("i24", "train-draft --exclude-packages a,,b", f"{TRAIN} --exclude-packages a,,b"),
        ("i25", "train-draft --adapters 3,3", f"{TRAIN} --adapters 3,3"),
        # N8: options with no effect ------------------------------------------------------
        ("i26", "expert_parallel=on, MoE target on one GPU", f"{H100_MOE} --placement target=gpu0"),
        ("i27", "expert_parallel=on, MoE draft on gpu4",
         "simulate --platform h100-sxm-5x --target llama-3.1-70b --draft qwen3-30b-a3b "
         "--tokens 20 --policy sd --set expert_parallel=on"),
        ("i28", "expert_parallel=on on a one-device platform (Jetson)",
         "simulate --platform jetson-agx-orin-64gb --target qwen3-30b-a3b --tokens 20 "
         "--policy ar --set expert_parallel=on --set memory_check=off"),
        ("i29v", "expert_parallel=on, MoE target on the 4-GPU group", H100_MOE),
        ("i30", "run --set alpha=0.8 (a measured run's acceptance is its models')",
         f"{run} --set alpha=0.8"),
        ("i31", "run --set histogram=0.5,0.5", f"{run} --set histogram=0.5,0.5"),
        ("i32", "run --acceptance iid", f"{run} --acceptance iid"),
        ("i33", "compare --profile without --runs", h.compare(extra="--profile cpu-local")),
        ("i34", "compare --backend ray --jobs 2", h.compare(jobs="2", extra="--backend ray")),
        ("i35", "ssd fast_backup_s with backup=jit", f"{SSD} --set fast_backup_s=0.001"),
        ("i36", "ssd hit_rate beside hit_trace",
         f"{SSD} --set hit_trace=<acc_good.jsonl>"),
        ("i37", "ssd r with a uniform fan-out and a hit rate", f"{SSD} --set r=0.5"),
        ("i38", "ssd top_mass with c_saguaro=1", f"{SSD} --set top_mass=0.3"),
        ("i39", "mirror omega beside omega_trace",
         f"{MIRROR} --set omega=0.5 --set omega_trace=<acc_good.jsonl>"),
        ("i40", "mirror rollout_ratio with batch_fallback=stall",
         f"{MIRROR} --set rollout_ratio=0.5 --set batch_fallback=stall"),
        ("i65", "--draft with policy ar (no draft)", f"{SIM} --policy ar --draft smollm2-135m"),
        ("i66", "--draft with sd drafting from the target's layers",
         f"{SD} --draft smollm2-135m"),
        ("i67", "--draft with a self-drafting policy (ppsd)",
         f"{SIM} --policy ppsd --draft smollm2-135m"),
        # N6: quantization_config -----------------------------------------------------------
        ("i41v", "import GPTQ 4-bit", f"{IMPORT} <i_gptq.json>"),
        ("i42v", "import AWQ 4-bit", f"{IMPORT} <i_awq.json>"),
        ("i43v", "import bitsandbytes load_in_4bit", f"{IMPORT} <i_bnb4.json>"),
        ("i44v", "import bitsandbytes load_in_8bit", f"{IMPORT} <i_bnb8.json>"),
        ("i45v", "import fp8", f"{IMPORT} <i_fp8.json>"),
        ("i46v", "import compressed-tensors 8-bit", f"{IMPORT} <i_ct.json>"),
        ("i47", "import an unknown quant_method (hqq)", f"{IMPORT} <i_hqq.json>"),
        ("i48v", "import hqq with --weight-bits 4", f"{IMPORT} <i_hqq.json> --weight-bits 4"),
        ("i49", "import GPTQ 3-bit (a width hetspec does not store)", f"{IMPORT} <i_gptq3.json>"),
        ("i50", "import bitsandbytes with both 4 and 8 bit", f"{IMPORT} <i_bnb_both.json>"),
        ("i51", "import compressed-tensors with mixed widths", f"{IMPORT} <i_ct_mixed.json>"),
        ("i52", "import quantization_config as a list", f"{IMPORT} <i_qc_list.json>"),
        ("i53", "import GPTQ 4-bit with --weight-bits 8 (contradiction)",
         f"{IMPORT} <i_gptq.json> --weight-bits 8"),
        ("i54", "import an unquantized config with --weight-bits 4 (no effect)",
         f"{IMPORT} <i_plain.json> --weight-bits 4"),
        # N9: messages that name the right thing -------------------------------------------
        ("i55", "tree draft_layers=500 on an 80-layer target (range before memory)",
         "simulate --platform h100-sxm-5x --target llama-3.1-70b --draft llama-3.2-1b "
         "--policy tree --set draft_layers=500"),
        ("i56", "config.json with a 5000-digit integer", f"{IMPORT} <i_big.json>"),
        ("i57", "model YAML with a 5000-digit integer",
         f"{SIM} --policy ar --target <i_big_model.yaml>"),
        ("i58", "published file with a 5000-digit integer",
         "calibrate --published <i_big_published.yaml> --profile a100-sxm-8x -o cal.yaml"),
        ("i59", "run record with a 5000-digit integer",
         "replay <run:i_record_long_int>/record.json"),
        ("i60", "run --prompts /dev/null (a character device)", f"{run} --prompts /dev/null"),
        ("i61", "run --prompts a FIFO", f"{run} --prompts <fifo>"),
        ("i62", "acceptance trace is a FIFO", f"{SD} --set trace=<fifo>"),
        ("i63", "profiles import a FIFO", f"{IMPORT} <fifo>"),
        ("i64", "replay a run whose spans file is a FIFO", "replay <run:i_spans_fifo>/record.json"),
        # N7: a key twice in an input file (JSON and YAML keep the last in silence) ------------
        ("i68", "config.json gives hidden_size twice", f"{IMPORT} <i_dup.json>"),
        ("i69", "model YAML gives n_layers twice", f"{SIM} --policy ar --target <i_dup_model.yaml>"),
        ("i70", "platform YAML gives name twice", "profiles validate <i_dup_platform.yaml>"),
        ("i71", "published file gives a row's platform twice",
         "calibrate --published <i_dup_published.yaml> --profile a100-sxm-8x -o cal.yaml"),
        ("i72", "run record gives a key twice", "replay <run:i_record_dup_key>/record.json"),
    ]
    h.CASES_TABLE.extend(cases)
