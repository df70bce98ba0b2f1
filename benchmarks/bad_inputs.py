"""Re-run every bad-input case of the reliability review against the ``hetspec`` CLI.

The reliability review (Appendix A) fed the command line 309 inputs a user or an
attacker could give it: unknown names, out-of-range and non-finite numbers, broken
profile YAML, corrupt acceptance traces, corrupt measured runs, outputs on a
read-only or full filesystem, outputs that are directories, FIFOs or the inputs
themselves. This script rebuilds each case's fixtures in a temporary directory,
runs ``python -m analyses.cli ...`` for it in a subprocess (its own working
directory, a per-case timeout and memory cap) and judges it as the review did:

- CLEAN: exit status other than 0; the last stderr line is one ``error:`` sentence
  (the only ``error:`` line); no ``Traceback``; no output file left behind; every
  input file byte-identical and with its mode (hashed before and after);
- TRACEBACK: a Python traceback on stderr;
- HANG: no answer within the timeout (or killed over the memory cap);
- ACCEPTED: exit status 0;
- UNCLEAR: a non-zero exit without one error sentence;
- LITTER: a clean sentence, but an output was left behind or an input changed.

A bad input must come out CLEAN. The inputs the review found valid (ids ending in
``v``: s28v, v13v, v23v) must exit 0 and leave their inputs alone; p14v and v05v,
a valid profile of 50 MB, must be refused by the 1 MB limit on profile files.
Cases that need a tmpfs mount (read-only or full filesystem) are SKIPPED when
mounting is not allowed. The script prints one row per case and the verdict counts
per group, and exits 1 when any case that ran is not as expected.

Run it from the repository root (measured runs for the replay/calibrate cases are
recorded once at startup with a tiny random-weight model, a few seconds)::

    python benchmarks/bad_inputs.py                 # every case, 2 at a time
    python benchmarks/bad_inputs.py --only r5 --jobs 1
    python benchmarks/bad_inputs.py --skip-slow --json bad_inputs.json
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = REPO / "hwprofiles" / "data" / "platforms"
MODELS = REPO / "hwprofiles" / "data" / "models"

# --------------------------------------------------------------------------- cases
SIM = "simulate --platform cpu-local --target smollm2-135m --tokens 50 --policy sd"
SD = f"{SIM} --set draft_layers=15"
MIRROR = ("simulate --platform cpu-local --target smollm2-135m --tokens 50 --policy mirror "
          "--draft smollm2-135m")
SSD = ("simulate --platform cpu-local --target smollm2-135m --tokens 50 --policy ssd "
       "--draft smollm2-135m")
POLICY = "simulate --platform cpu-local --target smollm2-135m --tokens 50 --policy"
ON_PLATFORM = "simulate --platform {} --target smollm2-135m --tokens 50 --policy sd --set draft_layers=15"
ON_TARGET = "simulate --platform cpu-local --target {} --tokens 50 --policy sd --set draft_layers=15"
RUN = ("run --platform cpu-local --target smollm2-135m --policy sd --set draft_layers=15 "
       "--max-new-tokens 4 --no-baseline --inline")
CALIBRATE = "calibrate --profile cpu-local --runs <runs>"


def compare(policies="ar,sd", sweep="gamma=2..3", jobs="1", out="out.html",
            platform="cpu-local", draft="none", extra="") -> str:
    return (f"compare --platform {platform} --target smollm2-135m --draft {draft} "
            f"--policies {policies} --set draft_layers=15 --sweep {sweep} --tokens 50 "
            f"--jobs {jobs} {extra} -o {out}").replace("  ", " ")


# Placeholders in <angle brackets> name fixtures, built in the case's own directory
# (see FIXTURES and Scratch.build): <file> a fixture file or directory, <run:VARIANT>
# a copy of the base measured run with one corruption, <runs> a folder of good runs,
# <runs:VARIANT> a folder holding only that corrupt run, <ro>/<full> a tmpfs mount.
CASES_TABLE = [
    # simulate ------------------------------------------------------------------
    ("s01", "unknown platform", ON_TARGET.replace("cpu-local", "nope-platform").format("smollm2-135m")),
    ("s02", "unknown target model", ON_TARGET.format("nope-model")),
    ("s03", "unknown policy", f"{POLICY} nope"),
    ("s04", "unknown draft model", f"{SIM} --draft nope-model"),
    ("s05", "sd without draft", SIM),
    ("s06", "empty platform string", ON_PLATFORM.format("''")),
    ("s07", "platform is /etc (directory)", ON_PLATFORM.format("/etc")),
    ("s10", "alpha > 1", f"{SD} --set alpha=1.5"),
    ("s11", "alpha < 0", f"{SD} --set alpha=-0.1"),
    ("s12", "alpha NaN", f"{SD} --set alpha=nan"),
    ("s13", "alpha inf", f"{SD} --set alpha=inf"),
    ("s14", "alpha non-numeric", f"{SD} --set alpha=abc"),
    ("s15", "gamma 0", f"{SD} --set gamma=0"),
    ("s16", "gamma negative", f"{SD} --set gamma=-3"),
    ("s17", "gamma huge", f"{SD} --set gamma=1000000000000"),
    ("s18", "gamma NaN", f"{SD} --set gamma=nan"),
    ("s19", "gamma fractional", f"{SD} --set gamma=2.5"),
    ("s20", "tokens 0", SD.replace("--tokens 50", "--tokens 0")),
    ("s21", "tokens negative", SD.replace("--tokens 50", "--tokens -5")),
    ("s22", "tokens huge (1e15)", SD.replace("--tokens 50", "--tokens 1000000000000000")),
    ("s23", "tokens non-integer", SD.replace("--tokens 50", "--tokens 1e3")),
    ("s24", "batch 0", f"{SD} --batch 0"),
    ("s25", "batch negative", f"{SD} --batch -1"),
    ("s26", "batch huge (1e9)", f"{SD} --batch 1000000000"),
    ("s27", "seed negative", f"{SD} --seed -1"),
    ("s28v", "seed 2**70", f"{SD} --seed 1180591620717411303424"),
    ("s29", "prompt_tokens negative", f"{SD} --set prompt_tokens=-1"),
    ("s30", "prompt_tokens huge", f"{SD} --set prompt_tokens=100000000000000000000000"),
    ("s31", "contention non-bool", f"{SD} --set contention=maybe"),
    ("s32", "alphas out of range", f"{SD} --set alphas=1.2,0.5"),
    ("s33", "histogram all zero", f"{SD} --set histogram=0,0,0"),
    ("s34", "histogram negative", f"{SD} --set histogram=-1,2"),
    ("s35", "histogram NaN", f"{SD} --set histogram=nan,1"),
    ("s36", "histogram inf", f"{SD} --set histogram=inf,1"),
    ("s37", "alphas NaN", f"{SD} --set alphas=nan,0.5"),
    ("s40", "--set without key", f"{SD} --set =5"),
    ("s41", "--set without =", f"{SD} --set gamma"),
    ("s42", "--set unknown key", f"{SD} --set foo=1"),
    ("s43", "--set empty value", f"{SD} --set gamma="),
    ("s44", "--set conflicting acceptance", f"{SD} --set alpha=0.8 --set alphas=0.5"),
    ("s45", "--acceptance unknown kind", f"{SD} --acceptance bogus"),
    ("s46", "--acceptance trace without path", f"{SD} --acceptance trace"),
    ("s47", "--set key with spaces/unicode", f"{SD} --set 'gämma =5'"),
    ("s50", "--placement without =", f"{SD} --placement draft"),
    ("s51", "--placement to unknown device", f"{SD} --placement target=gpu9"),
    ("s52", "--placement empty role", f"{SD} --placement =cpu0"),
    ("s53", "--placement empty device", f"{SD} --placement target="),
    ("s60", "mirror omega > 1", f"{MIRROR} --set omega=2"),
    ("s61", "mirror omega_trace missing file", f"{MIRROR} --set omega_trace=/nonexistent.jsonl"),
    ("s62", "mirror eta 0", f"{MIRROR} --set eta=0"),
    ("s63", "mirror exit_layer beyond model", f"{MIRROR} --set exit_layer=100000"),
    ("s64", "mirror rollout_ratio NaN", f"{MIRROR} --set rollout_ratio=nan"),
    ("s65", "mirror rollout_ratio inf", f"{MIRROR} --set rollout_ratio=inf"),
    ("s66", "mirror omega_trace = binary file", f"{MIRROR} --set omega_trace=<binary.bin>"),
    ("s67", "mirror omega_trace = directory", f"{MIRROR} --set omega_trace=<fx>"),
    ("s70", "ssd fast_backup_s inf",
     f"{SSD} --set hit_rate=0.7 --set backup=fast --set fast_backup_s=inf"),
    ("s71", "ssd hit_trace=/etc/passwd", f"{SSD} --set hit_trace=/etc/passwd"),
    ("s72", "ssd k huge", f"{SSD} --set hit_rate=0.7 --set k=33"),
    ("s73", "ssd budget 0", f"{SSD} --set hit_rate=0.7 --set budget=0"),
    ("s74", "ssd r NaN", f"{SSD} --set r=nan"),
    ("s75", "ssd r inf", f"{SSD} --set r=inf"),
    ("s80", "cats dram_budget_gb 0", f"{POLICY} cats --set dram_budget_gb=0"),
    ("s81", "cats dram_budget_gb inf", f"{POLICY} cats --set dram_budget_gb=inf"),
    ("s82", "cats dram_budget_gb NaN", f"{POLICY} cats --set dram_budget_gb=nan"),
    ("s83", "cats dram_budget_gb negative", f"{POLICY} cats --set dram_budget_gb=-1"),
    ("s84", "kangaroo mean_accepted NaN",
     f"{POLICY} kangaroo --set dram_budget_gb=0.2 --set mean_accepted=nan"),
    ("s85", "kangaroo l_dm beyond model",
     f"{POLICY} kangaroo --set dram_budget_gb=0.2 --set l_dm=1000"),
    ("s86", "ppsd exit_layer 0", f"{POLICY} ppsd --set exit_layer=0"),
    ("s87", "ppsd exit_layer beyond model", f"{POLICY} ppsd --set exit_layer=999"),
    ("s88", "cats chunk_layers huge",
     f"{POLICY} cats --set dram_budget_gb=0.2 --set chunk_layers=100000"),
    # simulate with an acceptance trace ---------------------------------------------
    ("t00", "acceptance trace nonexistent.jsonl", f"{SD} --set trace=/nonexistent.jsonl"),
    # t01 "acceptance trace fx": D8 lists it among directories given as files.
    ("t01", "acceptance trace fx (a directory)", f"{SD} --set trace=<fx>"),
    *[(f"t{n:02d}", f"acceptance trace {name}", f"{SD} --set trace=<{name}>")
      for n, name in enumerate(("acc_trunc.jsonl", "acc_emptylist.jsonl", "acc_str.jsonl",
                                "acc_int.jsonl", "acc_list.jsonl", "acc_none.jsonl",
                                "acc_neg.jsonl", "acc_nan.jsonl", "acc_huge.jsonl",
                                "acc_empty.jsonl", "acc_null.jsonl", "binary.bin"), 2)],
    # simulate outputs ----------------------------------------------------------------
    ("o01", "--trace under a regular file", f"{SD} --trace <file.txt>/t.json"),
    ("o02", "--trace is a directory", f"{SD} --trace <outdir>"),
    ("o03", "--trace on read-only fs", f"{SD} --trace <ro>/t.json"),
    ("o04", "--record on read-only fs", f"{SD} --record <ro>/r.json"),
    # o05/c22: the kernel refuses to create files in /proc; nothing is written there.
    ("o05", "--record in /proc", f"{SD} --record /proc/hetspec-r.json"),
    ("o06", "--record equal to the --platform input file",
     ON_PLATFORM.format("<cpu-copy.yaml>") + " --record <cpu-copy.yaml>"),
    ("o07", "--trace equal to --record", f"{SD} --trace x.json --record x.json"),
    ("o08", "--trace equal to acceptance trace input",
     f"{SD} --set trace=<acc_good.jsonl> --trace <acc_good.jsonl>"),
    ("o09", "--trace to a FIFO (special file)", f"{SD} --trace <fifo>"),
    ("o10", "bad input with --trace/--record given (no partial output expected)",
     f"{SD} --set alpha=2 --trace t.json --record r.json"),
    # o11's command is cut off after --trace in the review; its title names --record.
    ("o11", "--record on a full disk (256 KiB tmpfs filled)",
     SD.replace("--tokens 50", "--tokens 3000") + " --trace <full>/t.json --record <full>/r.json"),
    # platform files --------------------------------------------------------------------
    *[(cid, f"--platform {name}", ON_PLATFORM.format(f"<{name}>")) for cid, name in (
        ("p00", "empty.yaml"), ("p01", "null.yaml"), ("p02", "list.yaml"),
        ("p03", "scalar.yaml"), ("p04", "wrongtype.yaml"), ("p05", "wrongtype2.yaml"),
        ("p06", "wrongtype3.yaml"), ("p07", "extra.yaml"), ("p08", "extra2.yaml"),
        ("p09", "bomb.yaml"), ("p10", "pytag.yaml"), ("p11", "pytag2.yaml"),
        ("p12", "binary.yaml"), ("p13", "utf16.yaml"), ("p14v", "big.yaml"),
        ("p15", "big_junk.yaml"), ("p16", "dir.yaml"), ("p17", "nan_bw.yaml"),
        ("p18", "inf_bw.yaml"), ("p19", "inf_cap.yaml"), ("p20", "inf_latency.yaml"),
        ("p21", "inf_launch.yaml"), ("p22", "nan_flops.yaml"), ("p23", "neg_bw.yaml"),
        ("p24", "tiny_bw.yaml"), ("p25", "huge_bw.yaml"), ("p26", "huge_p.yaml"),
        ("p27", "badref.yaml"), ("p28", "nolink.yaml"), ("p29", "badsrc.yaml"),
        ("p30", "nosource.yaml"), ("p31", "dupmember.yaml"), ("p32", "baddtype.yaml"),
        ("p33", "boolflops.yaml"), ("p34", "nonexistent.yaml"))],
    # profiles -------------------------------------------------------------------------
    *[(cid, f"profiles validate {name}", f"profiles validate <{name}>") for cid, name in (
        ("v00", "empty.yaml"), ("v01", "bomb.yaml"), ("v02", "pytag.yaml"),
        ("v03", "pytag2.yaml"), ("v04", "binary.yaml"), ("v05v", "big.yaml"),
        ("v06", "big_junk.yaml"), ("v07", "dir.yaml"), ("v08", "list.yaml"),
        ("v09", "m_zero_layers.yaml"), ("v10", "m_heads.yaml"), ("v11", "m_float_layers.yaml"),
        ("v12", "m_dtype.yaml"), ("v13v", "xss.yaml"), ("v14", "nonexistent.yaml"))],
    ("v20", "profiles show unknown", "profiles show nope"),
    ("v21", "profiles without action", "profiles"),
    ("v22", "profiles show a directory", "profiles show /etc"),
    ("v23v", "profiles validate unicode-named file", "profiles validate <ünïcødé-平台-🚀.yaml>"),
    # model files ----------------------------------------------------------------------
    *[(cid, f"--target {name}", ON_TARGET.format(f"<{name}>")) for cid, name in (
        ("m00", "m_zero_layers.yaml"), ("m01", "m_heads.yaml"), ("m02", "m_huge_layers.yaml"),
        ("m03", "m_huge_hidden.yaml"), ("m04", "m_float_layers.yaml"), ("m05", "m_dtype.yaml"),
        ("m06", "cpu-copy.yaml"))],
    # m10's command is cut off at "--set dram_budg"; 1 GB holds the streaming buffer.
    ("m10", "model with huge n_layers through a streaming policy",
     "simulate --platform cpu-local --target smollm2-135m --tokens 50 "
     "--target <m_huge_layers.yaml> --policy ar_stream --set dram_budget_gb=1"),
    # law ------------------------------------------------------------------------------
    ("l01", "unknown law", "law nope"),
    ("l02", "alpha > 1", "law leviathan --set alpha=1.5 --set gamma=5"),
    ("l03", "alpha NaN", "law leviathan --set alpha=nan --set gamma=5"),
    ("l04", "alpha text", "law leviathan --set alpha=abc --set gamma=5"),
    ("l05", "gamma inf", "law leviathan --set alpha=0.8 --set gamma=inf"),
    ("l06", "gamma text", "law leviathan --set alpha=0.8 --set gamma=abc"),
    ("l07", "missing parameter", "law leviathan --set alpha=0.8"),
    ("l08", "unknown parameter", "law leviathan --set alpha=0.8 --set gamma=5 --set zeta=1"),
    ("l09", "c negative", "law leviathan --set alpha=0.8 --set gamma=5 --set c=-1"),
    ("l10", "c_hat NaN", "law leviathan --set alpha=0.8 --set gamma=5 --set c_hat=nan"),
    ("l11", "mirror all-zero times",
     "law mirror --set t_prefix_s=0 --set t_suffix_s=0 --set t_draft_s=0"),
    ("l12", "mirror inf times",
     "law mirror --set t_prefix_s=inf --set t_suffix_s=1 --set t_draft_s=inf --json"),
    ("l13", "ppsd n_layers inf", "law ppsd --set n_layers=inf --set exit_layer=2 --set alpha=0.5"),
    ("l14", "ppsd n_layers text", "law ppsd --set n_layers=abc --set exit_layer=2 --set alpha=0.5"),
    ("l15", "ssd batch 0", "law ssd --set hit_rate=0.5 --set e_hit=2 --set e_miss=1 --set t_p=1 "
                           "--set t_b=1 --set batch=0"),
    ("l16", "ssd hit_rate NaN",
     "law ssd --set hit_rate=nan --set e_hit=2 --set e_miss=1 --set t_p=1 --set t_b=1"),
    ("l17", "cats gamma negative", "law cats --set layer_gb=1 --set n_layers=30 --set gamma=-5 "
                                   "--set l_dm=3 --set mean_accepted=2"),
    ("l18", "cats mean_accepted inf", "law cats --set layer_gb=1 --set n_layers=30 --set gamma=5 "
                                      "--set l_dm=3 --set mean_accepted=inf"),
    ("l19", "leviathan gamma tuple", "law leviathan --set alpha=0.8 --set gamma=1,2"),
    ("l20", "set malformed", "law leviathan --set alpha"),
    ("l21", "ppsd exit_layer float", "law ppsd --set n_layers=30 --set exit_layer=2.5 --set alpha=0.5"),
    ("l22", "kangaroo layer_gb NaN", "law kangaroo --set layer_gb=nan --set n_layers=30 "
                                     "--set gamma=5 --set l_dm=3 --set mean_accepted=2"),
    # compare --------------------------------------------------------------------------
    ("c01", "unknown policy", compare(policies="ar,nope")),
    ("c02", "empty --policies", compare(policies=",")),
    ("c03", "reversed sweep range", compare(sweep="gamma=6..2")),
    ("c04", "zero sweep step", compare(sweep="gamma=2..6:0")),
    ("c05", "sweep with 1e9 values", compare(sweep="gamma=1..1000000000")),
    ("c06", "sweep non-numeric", compare(sweep="gamma=a..b")),
    ("c07", "sweep without =", compare(sweep="gamma")),
    ("c08", "sweep alpha beyond 1 (every point invalid)", compare(sweep="alpha=1.5..2.5:0.5")),
    ("c09", "sweep NaN", compare(sweep="gamma=nan")),
    ("c10", "sweep alpha nan..1", compare(sweep="alpha=nan..1:0.1")),
    ("c11", "sweep inf upper bound", compare(sweep="alpha=0.1..inf:0.1")),
    ("c12", "sweep key twice (--sweep and --set)", compare(extra="--set gamma=4")),
    ("c13", "unknown platform", compare(platform="nope")),
    ("c14", "tokens 0", compare().replace("--tokens 50", "--tokens 0")),
    ("c15", "batch 0", compare(extra="--batch 0")),
    ("c16", "--jobs 0", compare(jobs="0")),
    ("c17", "--jobs -3", compare(jobs="-3")),
    # c18 runs with the ray package hidden from the interpreter (see Scratch.env).
    ("c18", "--backend ray without ray installed", compare(extra="--backend ray")),
    ("c19", "-o on read-only fs", compare(out="<ro>/c.html")),
    ("c20", "-o is a directory", compare(out="<outdir>")),
    ("c21", "-o under a regular file", compare(out="<file.txt>/c.html")),
    ("c22", "-o in /proc", compare(out="/proc/hetspec.html")),
    ("c23", "-o equal to the --platform input",
     compare(platform="<cpu-copy.yaml>", out="<cpu-copy.yaml>")),
    ("c24", "-o on a full disk (256 KiB tmpfs)", compare(out="<full>/c.html")),
    ("c25", "--runs nonexistent", compare(extra="--runs /nonexistent")),
    ("c26", "--runs with a truncated record", compare(extra="--runs <runs:trunc_record>")),
    ("c27", "--runs with empty acceptance rows", compare(extra="--runs <runs:acc_emptylist>")),
    ("c28", "--profile unknown with --runs", compare(extra="--runs <runs> --profile nope")),
    ("c29", "--draft unknown", compare(draft="nope")),
    ("c30", "--placement bad", compare(extra="--placement target=gpu9")),
    ("c31", "--set unknown key", compare(extra="--set foo=1")),
    ("c32", "-o to a FIFO", compare(out="<fifo>")),
    ("c33", "platform file is a python-tag YAML", compare(platform="<pytag.yaml>")),
    ("c34", "platform with NaN bandwidth", compare(platform="<nan_bw.yaml>")),
    ("c35", "platform with inf bandwidth/flops", compare(platform="<inf_bw.yaml>")),
    # calibrate --------------------------------------------------------------------------
    ("k01", "--runs nonexistent", "calibrate --profile cpu-local --runs /nonexistent -o cal.yaml"),
    ("k02", "--runs is a file", "calibrate --profile cpu-local --runs <file.txt> -o cal.yaml"),
    ("k03", "--runs empty dir", "calibrate --profile cpu-local --runs <emptydir> -o cal.yaml"),
    ("k04", "--profile unknown", "calibrate --profile nope --runs <runs> -o cal.yaml"),
    ("k05", "-o on read-only fs", f"{CALIBRATE} -o <ro>/cal.yaml"),
    ("k06", "-o is a directory", f"{CALIBRATE} -o <outdir>"),
    ("k07", "--fit-policies empty", f"{CALIBRATE} --fit-policies , -o cal.yaml"),
    ("k08", "--fit-policies unknown", f"{CALIBRATE} --fit-policies nope -o cal.yaml"),
    ("k09", "-o equal to the --profile input",
     "calibrate --profile <cpu-copy.yaml> --runs <runs> -o <cpu-copy.yaml>"),
    ("k10", "--profile is a different platform than the runs",
     "calibrate --profile h100-sxm-5x --runs <runs> -o cal.yaml"),
    ("k11", "-o on a full disk", f"{CALIBRATE} -o <full>/cal.yaml"),
    ("k12", "-o into the runs directory (record.json of a run)",
     f"{CALIBRATE} -o <runs>/ar-0/record.json"),
    # replay -----------------------------------------------------------------------------
    ("r50", "replay nonexistent", "replay /nonexistent/record.json"),
    ("r51", "replay a directory without record", "replay <emptydir>"),
    ("r52", "replay --profile unknown", "replay <run:good>/record.json --profile nope --trace replay.json"),
    ("r53", "replay --trace read-only fs", "replay <run:good>/record.json --trace <ro>/replay.json"),
    ("r54", "replay --trace equal to the record.json input",
     "replay <run:good>/record.json --trace <run:good>/record.json"),
    ("r55", "replay --trace equal to spans.jsonl input",
     "replay <run:good>/record.json --trace <run:good>/spans.jsonl"),
    ("r56", "replay on a platform file with inf bandwidth",
     "replay <run:good>/record.json --profile <inf_bw.yaml> --trace replay.json"),
    ("r57", "replay with --profile a model YAML",
     "replay <run:good>/record.json --profile <smollm2-135m.yaml> --trace replay.json"),
    ("r58", "replay binary junk as record", "replay <binary.bin>"),
    ("r59", "replay 50 MB YAML as record", "replay <big_junk.yaml>"),
    # run (the real executor) -------------------------------------------------------------
    ("x01", "--prompts nonexistent", f"{RUN} --prompts /nonexistent.jsonl"),
    ("x02", "--prompts not JSON", f"{RUN} --prompts <prompts_bad.jsonl>"),
    ("x03", "--prompts wrong shape", f"{RUN} --prompts <prompts_wrong.jsonl>"),
    ("x04", "--prompts empty", f"{RUN} --prompts <prompts_empty.jsonl>"),
    ("x05", "--prompts binary", f"{RUN} --prompts <binary.bin>"),
    ("x06", "--max-new-tokens 0", RUN.replace("--max-new-tokens 4", "--max-new-tokens 0")),
    ("x07", "--threads 0", f"{RUN} --threads 0"),
    # x08's title says alpha=2, but its command and message are about gamma=0.
    ("x08", "--set gamma=0 (review title: --set alpha=2 unused by run)", f"{RUN} --set gamma=0"),
    ("x09", "--platform unknown", RUN.replace("--platform cpu-local", "--platform nope")),
    ("x10", "--target unknown", RUN.replace("--target smollm2-135m", "--target nope")),
    ("x11", "--prompts a directory", f"{RUN} --prompts <fx>"),
    ("x12", "--placement physical bogus", f"{RUN} --placement target=cuda:7"),
    ("x13", "--temperature NaN", f"{RUN} --temperature nan"),
    ("x14", "--out on read-only fs (full model run)", f"{RUN} --out <ro>/run"),
]

# Corrupt measured runs (review D3e, D11): r00.. replay each, k20.. calibrate on some.
REPLAY_VARIANTS = (
    "trunc_record empty_record record_list trunc_spans spans_int spans_abs spans_dir "
    "spans_missing spans_empty end_before_start nan_start layers_oob layers_str "
    "prompt_batch_mixed platform_unknown platform_int platform_missing target_unknown "
    "kind_sim no_inputs inputs_list policy_unknown params_bad params_list batch_zero "
    "tokens_str max_new_neg acc_trunc acc_emptylist acc_str acc_missing acc_event_noheld "
    "schema_wrong metrics_str steps_zero spans_nonobj op_no_type device_mixed").split()
CALIBRATE_VARIANTS = (
    "trunc_record empty_record record_list trunc_spans spans_int spans_abs spans_dir "
    "spans_missing end_before_start layers_str prompt_batch_mixed platform_int "
    "platform_unknown no_inputs inputs_list acc_emptylist acc_str schema_wrong metrics_str "
    "spans_nonobj op_no_type").split()
CASES_TABLE += [(f"r{n:02d}", f"replay corrupt run '{v}'",
                 f"replay <run:{v}>/record.json --trace replay.json")
                for n, v in enumerate(REPLAY_VARIANTS)]
CASES_TABLE += [(f"k{n:02d}", f"calibrate on corrupt run '{v}'",
                 f"calibrate --profile cpu-local --runs <runs:{v}> -o cal.yaml")
                for n, v in enumerate(CALIBRATE_VARIANTS, 20)]

# The run cases that got as far as loading SmolLM2 in the review (~15 s each).
SLOW = {"x08", "x12", "x13", "x14"}
HIDE_RAY = {"c18"}
# p13: D8 calls refusing a UTF-16 file with a BOM wrong (YAML allows it), so a
# clean refusal and a successful load both count as handled.
EITHER = {"p13"}
# p14v, v05v: a valid profile with a 50 MB description. The review judged it valid
# and, under D4, asked for profile files to be limited to about 1 MB; hetspec
# refuses files over 1 MB, so these two must now be clean refusals.
REFUSED_BY_SIZE_LIMIT = {"p14v", "v05v"}

GROUPS = [("s", "simulate"), ("t", "simulate-trace"), ("o", "simulate-out"),
          ("p", "platform-file"), ("v", "profiles"), ("m", "model-file"), ("l", "law"),
          ("c", "compare"), ("k0", "calibrate"), ("k1", "calibrate"),
          ("k", "calibrate-runs"), ("r", "replay"), ("x", "run"),
          # the second review's classes (benchmarks/badcases/, one module each)
          ("w", "outputs"), ("b", "budgets"), ("f", "fit-sanity"), ("e", "evidence"),
          ("i", "inputs"),
          # the third review's classes (benchmarks/badcases/reliability3.py)
          ("g", "options-moot"),
          ("u", "plausibility"), ("j", "json-inputs"), ("n", "positions"),
          ("q", "options-read"),
          # the serving simulation (benchmarks/badcases/serving.py)
          ("a", "serving")]
# Expectations a class module sets by case id ("accept", "refuse" or "either"),
# over the id rule below (an id ending in 'v' is a valid input).
EXPECT: dict[str, str] = {}
# Files under work/ an accepted case is documented to replace or remove, by case id:
# path -> "changed", "removed" (each must happen) or "either" (may change or stay).
# E.g. a previous run's files under 'hetspec run --force', a killed writer's temp file.
REPLACED: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    command: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    @property
    def group(self) -> str:
        return next(name for prefix, name in GROUPS if self.id.startswith(prefix))

    @property
    def expect(self) -> str:
        if self.id in EXPECT:
            return EXPECT[self.id]
        if self.id in EITHER:
            return "either"
        if self.id in REFUSED_BY_SIZE_LIMIT:
            return "refuse"
        return "accept" if self.id.endswith("v") else "refuse"


GROUP_ORDER = list(dict.fromkeys(name for _, name in GROUPS))

# ------------------------------------------------------------------------ fixtures
DELETE = object()  # a value in an edit that removes the key
BIG_BYTES = 50 * 2**20  # the review's 50 MB profile files


def set_path(obj, dotted: str, value) -> None:
    """Set ``a.0.b`` in nested dicts/lists ('*' = every list item; DELETE removes;
    a callable value is applied to the old one)."""
    head, _, rest = dotted.partition(".")
    keys = range(len(obj)) if head == "*" else [int(head) if isinstance(obj, list) else head]
    for key in keys:
        if rest:
            set_path(obj[key], rest, value)
        elif value is DELETE:
            del obj[key]
        else:
            obj[key] = value(obj[key]) if callable(value) else value


def edited(data, edits: dict):
    data = copy.deepcopy(data)
    for dotted, value in edits.items():
        set_path(data, dotted, value)
    return data


def cpu_local() -> dict:
    """cpu-local as plain data (merge keys resolved, no shared objects)."""
    return json.loads(json.dumps(yaml.safe_load((PLATFORMS / "cpu-local.yaml").read_text())))


def smollm2() -> dict:
    return yaml.safe_load((MODELS / "smollm2-135m.yaml").read_text())


def text(content: str | bytes):
    def write(path: Path) -> None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return write


def platform(edits: dict):
    return lambda path: path.write_text(yaml.safe_dump(edited(cpu_local(), edits),
                                                       sort_keys=False, allow_unicode=True))


def model(edits: dict):
    return lambda path: path.write_text(yaml.safe_dump(edited(smollm2(), edits),
                                                       sort_keys=False))


def copy_of(source: Path):
    return lambda path: shutil.copyfile(source, path)


def directory(path: Path) -> None:
    path.mkdir()
    (path / "inside.txt").write_text("a file inside a directory\n")


def nothing(path: Path) -> None:
    """A path that must not exist."""


def billion_laughs() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def big_profile(path: Path) -> None:
    """A valid cpu-local profile whose description is 50 MB long."""
    dumped = yaml.safe_dump(edited(cpu_local(), {"description": "DESCRIPTION"}),
                            sort_keys=False, width=1000)
    path.write_text(dumped.replace("DESCRIPTION", "x" * BIG_BYTES, 1))


def big_junk(path: Path) -> None:
    """A 50 MB flow list ``k: [1,1,...]``."""
    path.write_bytes(b"k: [" + b"1," * (BIG_BYTES // 2) + b"1]\n")


INF, NAN = float("inf"), float("nan")
ZLIB = zlib.compress(b"hetspec " * 64)  # starts with 0x78 0x9c: not UTF-8 at byte 1
FIXTURES = {
    # files and directories
    "file.txt": text("a regular file\n"), "fx": directory, "outdir": directory,
    "emptydir": lambda p: p.mkdir(), "dir.yaml": directory, "fifo": os.mkfifo,
    "nonexistent.yaml": nothing, "binary.bin": text(ZLIB),
    "binary.yaml": text(b"PK\x82\x03" + bytes(range(256)) * 4),
    "cpu-copy.yaml": copy_of(PLATFORMS / "cpu-local.yaml"),
    "smollm2-135m.yaml": copy_of(MODELS / "smollm2-135m.yaml"),
    # platform YAML that is not a platform
    "empty.yaml": text(""), "null.yaml": text("null\n"), "list.yaml": text("- 1\n- 2\n"),
    "scalar.yaml": text("42\n"), "bomb.yaml": text(billion_laughs()),
    "pytag.yaml": text('name: !!python/object/apply:os.system ["touch PWNED"]\n'),
    "pytag2.yaml": text("!!python/object/new:subprocess.Popen\n"
                        "args: [[touch, PWNED2]]\n"),
    "utf16.yaml": lambda p: p.write_bytes((PLATFORMS / "cpu-local.yaml").read_text()
                                          .encode("utf-16")),
    # platforms with one bad field
    "wrongtype.yaml": platform({"memory_tiers.0.capacity_bytes": "lots"}),
    "wrongtype2.yaml": platform({"devices.0.peak_flops": 5}),
    "wrongtype3.yaml": platform({"devices": "cpu0"}),
    "extra.yaml": platform({"foo": 1}),
    "extra2.yaml": platform({"devices.0.turbo": True}),
    "nan_bw.yaml": platform({"memory_tiers.0.bandwidth_gb_s": NAN}),
    "inf_bw.yaml": platform({"memory_tiers.*.bandwidth_gb_s": INF,
                             "devices.*.peak_flops.fp32": INF}),
    "inf_cap.yaml": platform({"memory_tiers.0.capacity_bytes": INF}),
    "inf_latency.yaml": platform({"links.0.latency_s": INF}),
    "inf_launch.yaml": platform({"devices.*.launch_overhead_s": INF,
                                 "devices.*.sources.launch_overhead_s": "fixture"}),
    "nan_flops.yaml": platform({"devices.*.peak_flops.fp32": NAN}),
    "neg_bw.yaml": platform({"memory_tiers.0.bandwidth_gb_s": -1.0}),
    "tiny_bw.yaml": platform({"memory_tiers.0.bandwidth_gb_s": 1e-300}),
    "huge_bw.yaml": platform({"memory_tiers.0.bandwidth_gb_s": 1e308}),
    # huge_p.yaml is not described in the review; read as a huge peak FLOP/s.
    "huge_p.yaml": platform({"devices.*.peak_flops.fp32": 1e308}),
    "badref.yaml": platform({"devices.0.memory": "nowhere"}),
    "nolink.yaml": platform({"links": []}),
    "badsrc.yaml": platform({"sources": {"name": 5}}),
    "nosource.yaml": platform({"memory_tiers.0.sources.capacity_bytes": DELETE}),
    "dupmember.yaml": platform({"groups.0.members": ["cpu0", "cpu0"]}),
    "baddtype.yaml": platform({"devices.0.peak_flops.fp64": 1e12}),
    "boolflops.yaml": platform({"devices.*.peak_flops.fp32": True}),
    # valid platforms (v cases)
    "xss.yaml": platform({"name": "<script>alert(1)</script>"}),
    "ünïcødé-平台-🚀.yaml": platform({"name": "ünïcødé-平台-🚀"}),
    # model specs
    "m_zero_layers.yaml": model({"n_layers": 0}),
    "m_heads.yaml": model({"n_kv_heads": 2}),
    "m_huge_layers.yaml": model({"n_layers": 10**7}),
    "m_huge_hidden.yaml": model({"hidden": 10**12}),
    "m_float_layers.yaml": model({"n_layers": 2.5}),
    "m_dtype.yaml": model({"dtype": "fp64"}),
    # acceptance traces (one line each; acc_none is a line with no 'accepted')
    "acc_good.jsonl": text('{"accepted": [2]}\n{"accepted": [3]}\n{"accepted": [1]}\n'),
    "acc_trunc.jsonl": text('{"accepted": [1, 2\n'),
    "acc_emptylist.jsonl": text('{"accepted": []}\n'),
    "acc_str.jsonl": text('{"accepted": ["a"]}\n'),
    "acc_int.jsonl": text('{"accepted": 3}\n'),
    "acc_list.jsonl": text("[1, 2]\n"),
    "acc_none.jsonl": text('{"gamma": 3}\n'),
    "acc_neg.jsonl": text('{"accepted": [-3]}\n'),
    "acc_nan.jsonl": text('{"accepted": [NaN]}\n'),
    "acc_huge.jsonl": text('{"accepted": [1e400]}\n'),
    "acc_empty.jsonl": text(""),
    "acc_null.jsonl": text("null\n"),
    # prompts for hetspec run
    "prompts_bad.jsonl": text('[{"role": "user", "content": "hi"}]\nnot json\n'),
    "prompts_wrong.jsonl": text('{"foo": 1}\n'),
    "prompts_empty.jsonl": text(""),
}
# Built once in the shared directory (50 MB each), hashed by every case using them.
SHARED = {"big.yaml": big_profile, "big_junk.yaml": big_junk}

# -------------------------------------------------------------- corrupt measured runs
TINY_MODEL = {"name": "tiny", "n_layers": 6, "hidden": 64, "ffn": 128, "n_heads": 4,
              "n_kv_heads": 2, "head_dim": 16, "vocab": 48, "dtype": "fp32",
              "hf_architecture": "LlamaForCausalLM"}
# One prompt: a run of one prompt batch is replayed whole (batch_zero, max_new_neg
# reach the code paths the review hit only then).
PROMPTS = '[{"role": "user", "content": "tell me a story"}]\n'
# The measured runs every run fixture copies: two AR repeats (one is held out by
# calibrate) and the SD run that the corrupt variants start from.
BASE_RUNS = {"ar-0": "--policy ar", "ar-1": "--policy ar",
             "sd-0": "--policy sd --set gamma=3 --set draft_layers=4"}


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def record(edits: dict):
    def corrupt(run: Path) -> None:
        path = run / "record.json"
        path.write_text(json.dumps(edited(json.loads(path.read_text()), edits), indent=2))
    return corrupt


def line(name: str, index: int, edits: dict):
    """Edit one line (0-based) of a run's JSON-lines file."""
    def corrupt(run: Path) -> None:
        rows = read_jsonl(run / name)
        rows[index] = edited(rows[index], edits)
        write_jsonl(run / name, rows)
    return corrupt


def append(name: str, raw: str):
    def corrupt(run: Path) -> None:
        with (run / name).open("a") as f:
            f.write(raw + "\n")
    return corrupt


def truncate(name: str):
    """Cut a file in the middle of a line (half its bytes)."""
    def corrupt(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[:len(data) // 2])
    return corrupt


def remove(name: str):
    return lambda run: (run / name).unlink()


def replayed_whole(corrupt):
    """Drop prompt_batch from every line, so replay simulates the run whole, as for
    the review's run (its batch_zero and max_new_neg reached that path)."""
    def both(run: Path) -> None:
        corrupt(run)
        for name in ("spans.jsonl", "acceptance.jsonl"):
            write_jsonl(run / name, [{k: v for k, v in row.items() if k != "prompt_batch"}
                                     for row in read_jsonl(run / name)])
    return both


def spans_in_a_directory(run: Path) -> None:
    (run / "spans.d").mkdir()
    record({"spans": "spans.d"})(run)


def as_list(run: Path) -> None:
    path = run / "record.json"
    path.write_text(json.dumps([json.loads(path.read_text())]))


VARIANTS = {
    "good": lambda run: None,
    "trunc_record": truncate("record.json"),
    "empty_record": lambda run: (run / "record.json").write_text(""),
    "record_list": as_list,
    "trunc_spans": truncate("spans.jsonl"),
    "spans_int": record({"spans": 5}),
    "spans_abs": record({"spans": "/etc/passwd"}),
    "spans_dir": spans_in_a_directory,
    "spans_missing": remove("spans.jsonl"),
    "spans_empty": lambda run: (run / "spans.jsonl").write_text(""),
    "end_before_start": line("spans.jsonl", 3, {"end_s": lambda end: end - 1.0}),
    "nan_start": line("spans.jsonl", 0, {"start_s": NAN}),
    "layers_oob": line("spans.jsonl", 0, {"op.layers": [0, 999]}),
    "layers_str": line("spans.jsonl", 0, {"op.layers": "ab"}),
    "prompt_batch_mixed": line("spans.jsonl", -1, {"prompt_batch": "1"}),
    "platform_unknown": record({"inputs.platform": "nope"}),
    "platform_int": record({"inputs.platform": 5}),
    "platform_missing": record({"inputs.platform": DELETE}),
    "target_unknown": record({"inputs.target": "nope"}),
    "kind_sim": record({"kind": "simulated"}),
    "no_inputs": record({"inputs": DELETE}),
    "inputs_list": record({"inputs": []}),
    "policy_unknown": record({"inputs.policy": "nope"}),
    "params_bad": record({"inputs.params.gamma": 0}),
    "params_list": record({"inputs.params": []}),
    "batch_zero": replayed_whole(record({"inputs.batch": 0})),
    "tokens_str": record({"metrics.tokens": "x"}),
    "max_new_neg": replayed_whole(record({"inputs.max_new_tokens": -1})),
    "acc_trunc": truncate("acceptance.jsonl"),
    "acc_emptylist": line("acceptance.jsonl", 0, {"accepted": []}),
    "acc_str": line("acceptance.jsonl", 0, {"accepted": ["a"]}),
    "acc_missing": remove("acceptance.jsonl"),
    # an Outcome event line lacking 'held' (the base SD run records none of its own)
    "acc_event_noheld": append("acceptance.jsonl", '{"event": "reuse", "prompt_batch": 0}'),
    "schema_wrong": record({"schema": "hetspec.run/999"}),
    "metrics_str": record({"metrics": "x"}),
    "steps_zero": record({"metrics.steps": 0}),
    "spans_nonobj": append("spans.jsonl", "[1, 2]"),
    "op_no_type": line("spans.jsonl", 0, {"op.type": DELETE}),
    "device_mixed": line("spans.jsonl", 2, {"device": 7}),
}


def load_class_modules() -> None:
    """Each module of ``benchmarks/badcases/`` adds one class of cases: its
    ``register(h)`` extends this module's CASES_TABLE, FIXTURES, VARIANTS, SLOW
    and EXPECT (``h`` is this module, so it can use the fixture builders)."""
    import importlib
    import pkgutil

    here = Path(__file__).resolve().parent
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    import badcases

    for info in sorted(pkgutil.iter_modules(badcases.__path__), key=lambda m: m.name):
        importlib.import_module(f"badcases.{info.name}").register(sys.modules[__name__])


load_class_modules()
CASES = sorted((Case(*row) for row in CASES_TABLE),
               key=lambda c: (GROUP_ORDER.index(c.group), c.id))  # the review's order


def record_base_runs(shared: Path, timeout_s: float) -> str | None:
    """Record the base runs with a tiny random-weight model; None or why it failed."""
    spec = shared / "tiny.yaml"
    fields = {**TINY_MODEL, "sources": {k: "test fixture" for k in TINY_MODEL
                                        if isinstance(TINY_MODEL[k], int)}}
    spec.write_text(yaml.safe_dump(fields, sort_keys=False))
    (shared / "prompts.jsonl").write_text(PROMPTS)
    for name, policy in BASE_RUNS.items():
        argv = [sys.executable, "-m", "analyses.cli", "run", "--platform", "cpu-local",
                "--target", f"random:{spec}", *policy.split(), "--max-new-tokens", "32",
                "--prompts", str(shared / "prompts.jsonl"), "--inline", "--no-baseline",
                "--out", str(shared / "runs" / name)]
        try:
            done = subprocess.run(argv, cwd=shared, env=child_env(shared, shared / "tmp"),
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"recording base run {name} took over {timeout_s:g} s"
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"recording base run {name} failed: {tail}"
    return None


def child_env(shared: Path, tmp: Path, hide_ray: bool = False) -> dict:
    """The CLI's environment: this checkout first on the path, bytecode and
    temporary files kept inside the scratch directory."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = [str(REPO)]
    if hide_ray:
        path.insert(0, str(shared / "noray"))
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path + ([old] if old else [])),
            "PYTHONPYCACHEPREFIX": str(shared / "pycache"), "TMPDIR": str(tmp)}


def make_noray(shared: Path) -> None:
    """A 'ray' package that cannot be imported, as if ray were not installed."""
    (shared / "noray" / "ray").mkdir(parents=True, exist_ok=True)
    (shared / "noray" / "ray" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'ray'\")\n")


# ----------------------------------------------------------------- one case's scratch
PLACEHOLDER = re.compile(r"<([^<>]+)>")
TMPFS_SIZE = "256k"


class Skip(Exception):
    """The case cannot be set up on this machine (e.g. mounting is not allowed)."""


class Scratch:
    """One case's directory: ``work/`` is the CLI's working directory and holds
    every fixture the command names; ``tmp/`` is its TMPDIR; logs sit beside."""

    def __init__(self, root: Path, shared: Path, base_error: str | None):
        self.root, self.shared, self.base_error = root, shared, base_error
        self.work = root / "work"
        self.work.mkdir(parents=True)
        self.mounts: list[Path] = []
        self.outside = {shared / "tiny.yaml"}  # inputs that live outside work/
        self.built: dict[str, Path] = {}

    def argv(self, case: Case) -> list[str]:
        return [PLACEHOLDER.sub(lambda m: str(self.build(m.group(1))), arg) for arg in case.argv]

    def build(self, name: str) -> Path:
        if name not in self.built:
            self.built[name] = self._make(name)
        return self.built[name]

    def _make(self, name: str) -> Path:
        kind, _, variant = name.partition(":")
        if kind == "run":
            return self._run(self.work / variant, variant)
        if kind == "runs":
            return self._runs(variant)
        if name in ("ro", "full"):
            return self._mount(self.work / name, read_only=name == "ro")
        if name in SHARED:
            self.outside.add(self.shared / name)
            return self.shared / name
        FIXTURES[name](self.work / name)
        return self.work / name

    def _run(self, dest: Path, variant: str, base: str = "sd-0") -> Path:
        if self.base_error:
            raise RuntimeError(self.base_error)
        shutil.copytree(self.shared / "runs" / base, dest)
        VARIANTS[variant](dest)
        return dest

    def _runs(self, variant: str) -> Path:
        runs = self.work / "runs"
        if variant:  # a folder holding only the corrupt run
            self._run(runs / variant, variant)
        else:
            for name in BASE_RUNS:
                self._run(runs / name, "good", base=name)
        return runs

    def _mount(self, path: Path, read_only: bool) -> Path:
        path.mkdir()
        mount(["-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)])
        self.mounts.append(path)
        if read_only:
            mount(["-o", "remount,ro", str(path)])
        else:
            fill(path)
        return path

    def unmount(self) -> None:
        for path in reversed(self.mounts):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
        self.mounts.clear()

    def snapshot(self) -> dict[str, tuple]:
        """Every path under work/ (and the shared inputs) with its fingerprint."""
        state = {str(p): fingerprint(p) for p in self.outside if p.exists()}
        for dirpath, dirnames, filenames in os.walk(self.work):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                state[str(path.relative_to(self.work))] = fingerprint(path)
        return state


def mount(args: list[str]) -> None:
    try:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
    except OSError as exc:
        raise Skip(f"cannot mount: {exc}") from None
    if done.returncode:
        raise Skip(f"cannot mount ({done.stderr.strip() or done.returncode})")


def fill(path: Path) -> None:
    """Fill a filesystem until it has no space left."""
    with open(path / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def fingerprint(path: Path) -> tuple:
    """File type and mode, plus a content hash for a regular file (FIFOs and
    devices are never opened)."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        return (st.st_mode, st.st_rdev)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return (st.st_mode, digest.hexdigest())


def differences(before: dict, after: dict) -> list[str]:
    out = [f"removed {p}" for p in before if p not in after]
    out += [f"changed {p}" for p in before if p in after and after[p] != before[p]]
    return out + [f"left {p}" for p in after if p not in before]


# ------------------------------------------------------------------ running, judging
@dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    seconds: float
    killed: str = ""


def rss_bytes(pid: int) -> int:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill_group(pid: int) -> None:
    """End the case's own process group (the CLI and any workers it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def execute(argv: list[str], scratch: Scratch, env: dict, timeout_s: float,
            max_rss: float) -> Outcome:
    out_path, err_path = scratch.root / "stdout.txt", scratch.root / "stderr.txt"
    start, killed = time.monotonic(), ""
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "analyses.cli", *argv],
                                cwd=scratch.work, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                killed = f"no answer within {timeout_s:g} s"
            elif rss_bytes(proc.pid) > max_rss:
                killed = f"killed at {max_rss / 2**30:g} GiB resident memory"
            if killed:
                kill_group(proc.pid)
                proc.wait()
                break
            time.sleep(0.1)
        kill_group(proc.pid)  # leftover workers of a finished command
    read = lambda p: p.read_text(errors="replace")  # noqa: E731
    return Outcome(None if killed else proc.returncode, read(out_path), read(err_path),
                   time.monotonic() - start, killed)


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def judge(outcome: Outcome, diffs: list[str]) -> tuple[str, str]:
    """(verdict, the line that shows it), as the review judged each case."""
    note = f"[{'; '.join(diffs[:3])}{' ...' if len(diffs) > 3 else ''}] " if diffs else ""
    if outcome.killed:
        return "HANG", note + outcome.killed
    if outcome.rc == 0:
        return "ACCEPTED", note + (last_line(outcome.out) or last_line(outcome.err))
    sentence = last_line(outcome.err)
    if "Traceback" in outcome.err:
        return "TRACEBACK", sentence
    errors = [ln for ln in outcome.err.splitlines() if "error:" in ln]
    if len(errors) != 1 or not sentence.partition("error:")[2].strip():
        return "UNCLEAR", note + (sentence or last_line(outcome.out))
    if diffs:
        return "LITTER", note + sentence
    return "CLEAN", sentence


def as_expected(case: Case, verdict: str, diffs: list[str]) -> bool:
    if verdict == "SKIPPED":
        return True
    inputs_kept = not any(d.startswith(("changed", "removed")) for d in diffs)
    if case.id in REPLACED and verdict == "ACCEPTED":
        inputs_kept = replaced_as_documented(REPLACED[case.id], diffs)
    accepted = verdict == "ACCEPTED" and inputs_kept
    return {"refuse": verdict == "CLEAN", "accept": accepted,
            "either": accepted or verdict == "CLEAN"}[case.expect]


def replaced_as_documented(documented: dict[str, str], diffs: list[str]) -> bool:
    """Every input change is one ``documented`` allows, and every required one
    (``changed``/``removed``) happened."""
    changes = [d.split(" ", 1) for d in diffs if d.startswith(("changed", "removed"))]
    allowed = all(documented.get(path) in (kind, "either") for kind, path in changes)
    required = all(f"{kind} {path}" in diffs for path, kind in documented.items()
                   if kind != "either")
    return allowed and required


@dataclass
class Result:
    id: str
    group: str
    what: str
    command: str
    verdict: str
    expected: bool
    sentence: str
    rc: int | None = None
    seconds: float = 0.0
    changes: list[str] = field(default_factory=list)


def run_case(case: Case, root: Path, shared: Path, args, base_error: str | None) -> Result:
    scratch = Scratch(root / case.id, shared, base_error)
    outcome, diffs = None, []
    try:
        argv = scratch.argv(case)
        env = child_env(shared, scratch.root / "tmp", hide_ray=case.id in HIDE_RAY)
        before = scratch.snapshot()
        outcome = execute(argv, scratch, env, args.timeout, args.max_rss_gb * 2**30)
        diffs = differences(before, scratch.snapshot())
        verdict, sentence = judge(outcome, diffs)
        sentence = sentence.replace(str(root), "<scratch>")
    except Skip as exc:
        verdict, sentence = "SKIPPED", str(exc)
    except Exception as exc:  # the harness could not set the case up
        verdict, sentence = "ERROR", f"harness: {exc.__class__.__name__}: {exc}"
    finally:
        scratch.unmount()
    return Result(case.id, case.group, case.what, case.command, verdict,
                  as_expected(case, verdict, diffs) and verdict != "ERROR", sentence,
                  outcome and outcome.rc, round(outcome.seconds, 2) if outcome else 0.0, diffs)


# ------------------------------------------------------------------------- report
VERDICTS = ("CLEAN", "ACCEPTED", "TRACEBACK", "HANG", "UNCLEAR", "LITTER", "SKIPPED", "ERROR")


def print_table(results: list[Result]) -> None:
    print(f"{'id':5} {'':2} {'verdict':9} {'what':44} sentence")
    for r in results:
        mark = "--" if r.verdict == "SKIPPED" else ("ok" if r.expected else "XX")
        print(f"{r.id:5} {mark:2} {r.verdict:9} {r.what[:44]:44} {r.sentence[:120]}")


def counts(results: list[Result]) -> dict[str, dict]:
    """Verdict counts and cases as expected, per group and in total."""
    out: dict[str, dict] = {}
    for key in [name for _, name in GROUPS] + ["total"]:
        rows = [r for r in results if key in ("total", r.group)]
        if rows and key not in out:
            tally = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
            out[key] = {"cases": len(rows), "as_expected": sum(r.expected for r in rows
                                                              if r.verdict != "SKIPPED"),
                        "ran": sum(r.verdict != "SKIPPED" for r in rows),
                        **{v: n for v, n in tally.items() if n}}
    return out


def print_counts(summary: dict[str, dict]) -> None:
    print()
    for group, c in summary.items():
        tally = ", ".join(f"{v} {c[v]}" for v in VERDICTS if v in c)
        print(f"{group:15} {tally} (of {c['cases']}); as expected {c['as_expected']}/{c['ran']}")


# --------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="run the cases whose id starts with one of "
                   "these comma-separated prefixes (e.g. l or r5,k2)")
    p.add_argument("--skip-slow", action="store_true",
                   help=f"skip the cases that load the real model ({', '.join(sorted(SLOW))})")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds before a case counts as a hang (default 60)")
    p.add_argument("--max-rss-gb", type=float, default=4.0,
                   help="resident memory at which a case is killed as a hang (default 4)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args(argv)


def select(args) -> list[Case]:
    prefixes = tuple(x for x in args.only.split(",") if x)
    return [c for c in CASES if (not prefixes or c.id.startswith(prefixes))
            and not (args.skip_slow and c.id in SLOW)]


def prepare_shared(shared: Path, cases: list[Case], args) -> str | None:
    """Build what several cases share; the reason the base runs failed, if they did."""
    shared.mkdir(parents=True)
    (shared / "tiny.yaml").touch()
    commands = " ".join(c.command for c in cases)
    for name, build in SHARED.items():
        if f"<{name}>" in commands:
            build(shared / name)
    if any(c.id in HIDE_RAY for c in cases):
        make_noray(shared)
    if "<run" in commands:
        print("recording the base measured runs ...", file=sys.stderr)
        return record_base_runs(shared, max(args.timeout, 120.0))
    return None


def unmount_all(root: Path) -> None:
    """Unmount anything still mounted under the scratch directory."""
    for row in reversed(Path("/proc/mounts").read_text().splitlines()):
        where = row.split()[1].encode().decode("unicode_escape")
        if where.startswith(str(root) + os.sep):
            subprocess.run(["umount", "-l", where], capture_output=True)


def run_all(cases: list[Case], root: Path, args) -> list[Result]:
    base_error = prepare_shared(root / "shared", cases, args)
    done = threading.Lock()

    def one(case: Case) -> Result:
        result = run_case(case, root, root / "shared", args, base_error)
        with done:
            print(f"  {result.id:5} {result.verdict:9} {result.seconds:6.1f} s", file=sys.stderr)
        return result
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        return list(pool.map(one, cases))


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = select(args)
    root = Path(tempfile.mkdtemp(prefix="hetspec-bad-inputs-"))
    try:
        results = run_all(cases, root, args)
    finally:
        unmount_all(root)
        if args.keep:
            print(f"scratch kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    summary = counts(results)
    print_counts(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": summary, "cases": [
            asdict(r) for r in results]}, indent=2, ensure_ascii=False) + "\n")
    return 0 if all(r.expected for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
