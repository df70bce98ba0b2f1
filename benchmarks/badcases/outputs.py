"""Class 1 of issue 20, outputs (ids w..): one output policy for files and folders.

- Nothing is written in hetspec's shipped data folders (``hwprofiles/data/``,
  ``executors/data/``), by any command, any path that reaches them (``..``, a
  symbolic link), with or without ``--force`` (review N1, xr23).
- A run folder that holds a run or anything else is refused without ``--force``
  (review N1, op17); with it the previous run's own files are replaced and every
  other file is kept. A file output never replaces a measured run's own files.
- A file output that names a directory (an existing one, or a path ending in '/',
  '.' or '..') is refused instead of writing a file of the directory's name
  (review N8, op14).
- The next write of an output removes the temp files its killed writers left
  (review N9/k9), never a live writer's and never another output's.

The shipped-data cases name the checkout's own folders (the harness runs this
checkout's code): each must be refused before anything is written, so
``git status`` stays clean after them. Runs that must be accepted use a tiny
random-weight model (a few seconds); the SmolLM2 cases are refused before the
model loads.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
         "tie_word_embeddings": True}
DEAD_PID = 99_999_999  # above any Linux pid_max (2**22): never a live process
RUN_OWN_FILES = ("record.json", "spans.jsonl", "trace.json")  # differ run to run


def register(h) -> None:
    data = h.REPO / "hwprofiles" / "data"
    shipped = lambda *parts: shlex.quote(str(data.joinpath(*parts)))  # noqa: E731
    drafts_data = shlex.quote(str(h.REPO / "executors" / "data"))
    tiny_run = ("run --platform cpu-local --target random:<w_tiny.yaml> --policy sd "
                "--set gamma=3 --set draft_layers=4 --max-new-tokens 8 "
                "--prompts <w_prompts.jsonl> --inline --no-baseline")
    sim = h.SD
    imp = "profiles import <w_config>/config.json"
    cal_pub = "calibrate --published shipped --profile a100-sxm-8x"
    h.FIXTURES.update(_fixtures(h))
    h.CASES_TABLE.extend([
        # never in the shipped data folders -------------------------------------------
        ("w01", "N1 xr23: run --out the shipped platforms folder",
         f"{h.RUN} --out {shipped('platforms')}"),
        ("w02", "run --out a new folder inside hwprofiles/data",
         f"{h.RUN} --out {shipped('my-run')}"),
        ("w03", "run --out hwprofiles/data itself", f"{h.RUN} --out {shipped()}"),
        ("w04", "run --out the data folder by a .. detour",
         f"{h.RUN} --out {shipped('..', 'data', 'models')}"),
        ("w05", "run --out the shipped draft-heads folder", f"{h.RUN} --out {drafts_data}"),
        ("w06", "run --out shipped platforms with --force",
         f"{h.RUN} --out {shipped('platforms')} --force"),
        ("w07", "simulate --record a new file in shipped platforms",
         f"{sim} --record {shipped('platforms', 'new.json')}"),
        ("w08", "simulate --trace into hwprofiles/data",
         f"{sim} --trace {shipped('trace.json')}"),
        ("w09", "compare -o into the shipped published folder",
         h.compare(out=shipped("published", "report.html"))),
        ("w10", "calibrate --runs -o a new shipped platform",
         f"{h.CALIBRATE} -o {shipped('platforms', 'cpu-cal.yaml')}"),
        ("w11", "calibrate --published -o into the published folder",
         f"{cal_pub} -o {shipped('published', 'fit.yaml')}"),
        ("w12", "profiles import -o a new shipped model",
         f"{imp} -o {shipped('models', 'new-model.yaml')}"),
        ("w13", "replay --trace into hwprofiles/data",
         f"replay <run:good> --trace {shipped('replay.json')}"),
        ("w14", "train-draft -o the shipped draft artifact",
         f"train-draft -o {drafts_data}/smollm2-135m-drafts.safetensors"),
        ("w15", "train-draft -o into hwprofiles/data",
         f"train-draft -o {shipped('drafts.safetensors')}"),
        ("w16", "simulate --record through a link to hwprofiles/data",
         f"{sim} --record <w_datalink>/x.json"),
        # run folders that already hold something -------------------------------------
        ("w17", "N1 op17: run --out a folder holding a measured run",
         f"{h.RUN} --out <run:good>"),
        ("w18", "run --out a folder holding another file", f"{h.RUN} --out <outdir>"),
        ("w19", "run --out a measured run, trailing slash", f"{h.RUN} --out <run:good>/"),
        ("w20", "run --out one run of a --runs folder", f"{h.RUN} --out <runs>/ar-0"),
        ("w21", "run --force but --prompts is the run's own file",
         f"{h.RUN} --prompts <run:good>/acceptance.jsonl --out <run:good> --force"),
        ("w22", "run --out an existing empty folder (accepted)",
         f"{tiny_run} --out <emptydir>"),
        ("w23", "run --out a measured run with --force (accepted)",
         f"{tiny_run} --out <run:good> --force"),
        ("w24", "run --out a folder of other files with --force (kept)",
         f"{tiny_run} --out <outdir> --force"),
        # a file output over a measured run's own files ------------------------------
        ("w25", "simulate --record over a measured run's record",
         f"{sim} --record <run:good>/record.json"),
        ("w26", "simulate --trace over a measured run's trace",
         f"{sim} --trace <run:good>/trace.json"),
        ("w27", "compare -o over a measured run's spans",
         h.compare(out="<run:good>/spans.jsonl")),
        ("w28", "profiles import -o over a run's acceptance lines",
         f"{imp} -o <run:good>/acceptance.jsonl"),
        ("w29", "simulate --record a new file beside a run (accepted)",
         f"{sim} --record <run:good>/simulated.json"),
        # a file output that names a directory ---------------------------------------
        ("w30", "N8 op14: profiles import -o newdir/", f"{imp} -o newdir/"),
        ("w31", "profiles import -o an existing folder", f"{imp} -o <emptydir>"),
        ("w32", "simulate --record rec/", f"{sim} --record rec/"),
        ("w33", "simulate --trace ending in /.", f"{sim} --trace traces/."),
        ("w34", "simulate --record ..", f"{sim} --record .."),
        ("w35", "compare -o reports/", h.compare(out="reports/")),
        ("w36", "compare -o ''", h.compare(out="''")),
        ("w37", "calibrate --runs -o cal/", f"{h.CALIBRATE} -o cal/"),
        ("w38", "calibrate --published -o an existing folder", f"{cal_pub} -o <outdir>"),
        ("w39", "replay --trace out/", "replay <run:good> --trace out/"),
        ("w40", "train-draft -o drafts/", "train-draft -o drafts/"),
        ("w41", "train-draft -o ''", "train-draft -o ''"),
        ("w42", "profiles import -o newdir/x.yaml (accepted)", f"{imp} -o newdir/x.yaml"),
        # killed writers' temp files -------------------------------------------------
        ("w43", "N9 k9: compare over a killed writer's .NAME.PID.tmp",
         h.compare(out="<w_legacy.html>")),
        ("w44", "compare over a killed writer's .NAME.HOST-PID.*.tmp",
         h.compare(out="<w_stale.html>")),
        ("w45", "simulate --record beside a live writer's temp file (kept)",
         f"{sim} --record <w_live.json>"),
        ("w46", "compare beside another output's stale temp file (kept)",
         h.compare(out="<w_other.html>")),
    ])
    for case in ("w22", "w23", "w24", "w29", "w42", "w43", "w44", "w45", "w46"):
        h.EXPECT[case] = "accept"
    h.REPLACED["w23"] = {**{f"good/{n}": "changed" for n in RUN_OWN_FILES},
                         "good/acceptance.jsonl": "either"}  # same seed, same tokens
    h.REPLACED["w43"] = {_legacy_temp("w_legacy.html", DEAD_PID): "removed"}
    h.REPLACED["w44"] = {_current_temp(h, "w_stale.html", DEAD_PID): "removed"}


def _fixtures(h) -> dict:
    """Fixture builders, named w_* (each gets the path it builds)."""
    def config(path):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(LLAMA))

    def tiny(path):
        fields = {**h.TINY_MODEL, "sources": {k: "test fixture" for k in h.TINY_MODEL
                                              if isinstance(h.TINY_MODEL[k], int)}}
        h.text(json.dumps(fields))(path)  # JSON is YAML

    return {
        "w_config": config,
        "w_tiny.yaml": tiny,
        "w_prompts.jsonl": h.text(h.PROMPTS),
        "w_datalink": lambda path: os.symlink(h.REPO / "hwprofiles" / "data", path),
        # an output path (absent) with a killed writer's temp file beside it
        "w_legacy.html": _with_temp(lambda name: _legacy_temp(name, DEAD_PID)),
        "w_stale.html": _with_temp(lambda name: _current_temp(h, name, DEAD_PID)),
        # pid 1 (init) is alive for as long as the machine is
        "w_live.json": _with_temp(lambda name: _current_temp(h, name, 1)),
        "w_other.html": _with_temp(lambda name: _legacy_temp("x.html", DEAD_PID)),
    }


def _with_temp(temp_name):
    """A fixture: the output path itself stays absent; ``temp_name(its name)`` is
    planted beside it."""
    def build(path):
        (path.parent / temp_name(path.name)).write_text("half a report")
    return build


def _legacy_temp(name: str, pid: int) -> str:
    """The temp file name of hetspec's writers before the host was in it."""
    return f".{name}.{pid}.tmp"


def _current_temp(h, name: str, pid: int) -> str:
    """A temp file name the atomic writer gives ``name`` in process ``pid``."""
    if str(h.REPO) not in sys.path:
        sys.path.insert(0, str(h.REPO))
    from pathlib import Path

    from hwprofiles.writing import temp_prefix

    return f"{temp_prefix(Path(name), pid)}k1ll3d.tmp"
