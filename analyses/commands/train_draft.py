"""hetspec train-draft: self-distil a target's early-exit heads, adapters and
multi-token heads."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from analyses.cli import emit_json
from analyses.commands import COMMANDS
from analyses.commands.run import count
from analyses.run.config import split_items
from analyses.run.outputs import check_outputs
from executors.train.config import TrainConfig  # no torch: every command's help


def layer_list(option: str):
    """argparse type of ``option``: comma-separated exit layers, each once, or
    'none'. An empty list or item (``''``, ``8,,15``) and a layer given twice
    (``8,8``) are refused, not dropped."""
    def parse(text: str) -> tuple[int, ...]:
        if text.strip().lower() == "none":
            return ()
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty list of layers; give e.g. 8,15, or "
                                             f"{option} none for no heads")
        try:
            items = split_items(text, f"'{text}'")
            layers = [int(item) for item in items]
        except ValueError as exc:
            why = str(exc) if "empty" in str(exc) else (
                f"'{text}' is not a list of layers; give e.g. 8,15 or none")
            raise argparse.ArgumentTypeError(why) from None
        twice = sorted({e for e in layers if layers.count(e) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"'{text}' names layer {twice[0]} twice; give "
                                             "each exit layer once")
        if any(e < 1 for e in layers):
            raise argparse.ArgumentTypeError(f"'{text}' names a layer below 1; exits lie "
                                             "after at least one layer")
        return tuple(sorted(layers))
    return parse


def name_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated names, each once, no empty item."""
    try:
        return tuple(split_items(text, f"'{text}'", unique=True))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    d = TrainConfig()
    p = sub.add_parser(
        "train-draft", help=COMMANDS["train-draft"],
        description="Self-distillation on CPU: the target answers chat prompts built from "
                    "the installed packages' summaries and reads windows of their "
                    "descriptions; every exit head and adapter learns the target's "
                    "last-layer distribution (top-K reduced KL) from the hidden states at "
                    "its exit; multi-token heads (--ahead, --eta) learn the distribution "
                    "of the tokens after the next from an exit's states, so one draft pass "
                    "proposes eta tokens (Mirror's eta; they are trained last, leaving the "
                    "other heads as they would be without them). Writes an fp16 safetensors artifact and its provenance "
                    "JSON (data, steps, loss, held-out top-1 agreement), atomically; "
                    "'hetspec run' uses the shipped one for smollm2-135m, or the file "
                    "named by HETSPEC_DRAFTS.",
        epilog="example: hetspec train-draft -o drafts.safetensors  (then HETSPEC_DRAFTS="
               "drafts.safetensors hetspec run ...)")
    p.add_argument("--target", default=d.target, help=f"target model (default {d.target})")
    p.add_argument("-o", "--output", default="smollm2-135m-drafts.safetensors",
                   help="artifact path; the provenance goes beside it as .json")
    p.add_argument("--exits", type=layer_list("--exits"), default=d.exits,
                   help="exit layers of norm exit heads (default "
                        f"{','.join(map(str, d.exits))}: EESD/PPSD, Mirror and self:15, PPSD "
                        "split into two balanced stages)")
    p.add_argument("--adapters", type=layer_list("--adapters"), default=d.adapters,
                   help="exit layers of Kangaroo/CATS adapters (default "
                        f"{','.join(map(str, d.adapters))}: l_dm and CATS's l_sv)")
    p.add_argument("--ahead", type=layer_list("--ahead"), default=None,
                   help="exit layers (each among --exits) that get multi-token heads "
                        f"(default {','.join(map(str, d.ahead)) or 'none'}: Mirror's default "
                        "exit, half the layers, and its self:15 draft); 'none' for none")
    p.add_argument("--eta", type=count(16), default=None,
                   help=f"tokens one draft pass proposes there (default {d.eta}): heads for "
                        "tokens t+2..t+eta beside the exit head's t+1; 1 trains none. "
                        "'hetspec run' then defaults Mirror's eta to 2 on that exit; "
                        "refused with --ahead none, which trains no multi-token head")
    p.add_argument("--steps", type=count(100_000), default=d.steps,
                   help=f"optimiser steps per head (default {d.steps})")
    p.add_argument("--prompts", type=count(100_000), default=d.prompts,
                   help=f"chat prompts the target answers (default {d.prompts})")
    p.add_argument("--doc-windows", type=count(100_000), default=d.doc_windows,
                   help=f"windows of package descriptions (default {d.doc_windows})")
    p.add_argument("--exclude-packages", type=name_list, default=(),
                   help="installed distributions to leave out of the corpus, comma-"
                        "separated (to rebuild an artifact's corpus after more were "
                        "installed; its provenance counts the packages it read)")
    p.add_argument("--threads", type=count(1024), default=d.threads,
                   help=f"torch threads (default {d.threads})")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print the provenance as JSON")
    p.set_defaults(func=_train)


def _train(args) -> int:
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} is negative; give an integer >= 0")
    names = {"--output": "smollm2-135m-drafts.safetensors",
             "provenance": "smollm2-135m-drafts.json"}
    check_outputs({"--output": args.output}, [], names)  # at once, before torch loads
    from executors.backend.drafts import provenance_path
    from executors.train.distil import train

    check_outputs({"--output": args.output,
                   "provenance": provenance_path(Path(args.output))}, [], names)
    cfg = replace(TrainConfig(), target=args.target, exits=args.exits,
                  adapters=args.adapters, steps=args.steps,
                  prompts=args.prompts, doc_windows=args.doc_windows, threads=args.threads,
                  seed=args.seed, exclude_packages=args.exclude_packages)
    cfg = replace(cfg, **heads_ahead(cfg, args.ahead, args.eta))
    prov = train(cfg, Path(args.output), command=_command_line())
    if args.json:
        emit_json(prov)
        return 0
    print(f"wrote {args.output} ({prov['wall_s']:.0f} s, {prov['corpus']['positions']} "
          f"positions, draft vocabulary {prov['draft_vocab']})")
    for name, h in prov["heads"].items():
        print(f"  {name:12s} loss {h['loss_first']:.3f} -> {h['loss_last_mean10']:.3f}  "
              f"held-out top-1 {h['held_out_top1_before']:.1%} -> {h['held_out_top1']:.1%}")
    return 0


def heads_ahead(cfg, ahead: tuple[int, ...] | None, eta: int | None) -> dict:
    """``ahead`` and ``eta`` for ``cfg`` (None: not given, the default), refusing
    before any model loads the heads that would train nothing: no exit or adapter
    at all, an --eta with --ahead none, an --ahead with --eta 1, and multi-token
    heads on a layer that gets no exit head."""
    if not cfg.exits and not cfg.adapters:
        raise ValueError("train-draft has no heads to train (--exits none and --adapters "
                         "none); give exit layers with --exits or --adapters")
    if ahead == () and eta is not None:
        raise ValueError(f"--eta {eta} has no effect with --ahead none (no multi-token "
                         "heads are trained); drop --eta, or name exits with --ahead")
    if ahead and eta == 1:
        raise ValueError(f"--ahead {','.join(map(str, ahead))} has no effect with --eta 1 "
                         "(one token a pass needs no multi-token head); drop --ahead, or "
                         "give --eta 2 or more")
    given = "--ahead" if ahead is not None else "the default --ahead"
    ahead = cfg.ahead if ahead is None else ahead
    eta = cfg.eta if eta is None else eta
    missing = [e for e in ahead if e not in cfg.exits]
    if missing and eta > 1:
        raise ValueError(f"{given} {missing[0]} has no exit head to extend; add "
                         f"{missing[0]} to --exits, or give --ahead none")
    return {"ahead": ahead, "eta": eta}


def _command_line() -> str:
    """This process's command line from 'train-draft' on, as the provenance notes it."""
    argv = sys.argv
    start = argv.index("train-draft") if "train-draft" in argv else len(argv)
    return "hetspec " + shlex.join(argv[start:] or ["train-draft"])
