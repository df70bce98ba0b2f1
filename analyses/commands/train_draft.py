"""hetspec train-draft: self-distil a target's early-exit heads, adapters and
multi-token heads."""

from __future__ import annotations

from analyses.commands.run import count


def layer_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated exit layers, or 'none'."""
    import argparse

    if text.strip().lower() == "none":
        return ()
    try:
        layers = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of layers; give e.g. "
                                         "8,15 or none") from None
    if any(e < 1 for e in layers):
        raise argparse.ArgumentTypeError(f"'{text}' names a layer below 1; exits lie "
                                         "after at least one layer")
    return layers


def register(sub) -> None:
    from executors.trainconfig import TrainConfig  # no torch: every command's help

    d = TrainConfig()
    p = sub.add_parser(
        "train-draft", help="train the target's own draft heads (early exits, adapters, "
                            "multi-token heads)",
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
    p.add_argument("--exits", type=layer_list, default=d.exits,
                   help="exit layers of norm exit heads (default "
                        f"{','.join(map(str, d.exits))}: EESD/PPSD, Mirror and self:15, PPSD "
                        "split into two balanced stages)")
    p.add_argument("--adapters", type=layer_list, default=d.adapters,
                   help="exit layers of Kangaroo/CATS adapters (default "
                        f"{','.join(map(str, d.adapters))}: l_dm and CATS's l_sv)")
    p.add_argument("--ahead", type=layer_list, default=d.ahead,
                   help="exit layers (each among --exits) that get multi-token heads "
                        f"(default {','.join(map(str, d.ahead)) or 'none'}: Mirror's default "
                        "exit, half the layers, and its self:15 draft); 'none' for none")
    p.add_argument("--eta", type=count(16), default=d.eta,
                   help=f"tokens one draft pass proposes there (default {d.eta}): heads for "
                        "tokens t+2..t+eta beside the exit head's t+1; 1 trains none. "
                        "'hetspec run' then defaults Mirror's eta to 2 on that exit")
    p.add_argument("--steps", type=count(100_000), default=d.steps,
                   help=f"optimiser steps per head (default {d.steps})")
    p.add_argument("--prompts", type=count(100_000), default=d.prompts,
                   help=f"chat prompts the target answers (default {d.prompts})")
    p.add_argument("--doc-windows", type=count(100_000), default=d.doc_windows,
                   help=f"windows of package descriptions (default {d.doc_windows})")
    p.add_argument("--exclude-packages", type=lambda t: tuple(x.strip() for x in t.split(",")
                                                            if x.strip()), default=(),
                   help="installed distributions to leave out of the corpus, comma-"
                        "separated (to rebuild an artifact's corpus after more were "
                        "installed; its provenance counts the packages it read)")
    p.add_argument("--threads", type=count(1024), default=d.threads,
                   help=f"torch threads (default {d.threads})")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print the provenance as JSON")
    p.set_defaults(func=_train)


def _train(args) -> int:
    from dataclasses import replace
    from pathlib import Path

    from analyses.cli import emit_json
    from analyses.run.outputs import check_outputs

    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} is negative; give an integer >= 0")
    names = {"--output": "smollm2-135m-drafts.safetensors",
             "provenance": "smollm2-135m-drafts.json"}
    check_outputs({"--output": args.output}, [], names)  # at once, before torch loads
    from executors.backend.drafts import provenance_path
    from executors.train import TrainConfig, train

    check_outputs({"--output": args.output,
                   "provenance": provenance_path(Path(args.output))}, [], names)
    cfg = replace(TrainConfig(), target=args.target, exits=args.exits,
                  adapters=args.adapters, ahead=args.ahead, eta=args.eta, steps=args.steps,
                  prompts=args.prompts, doc_windows=args.doc_windows, threads=args.threads,
                  seed=args.seed, exclude_packages=args.exclude_packages)
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


def _command_line() -> str:
    """This process's command line from 'train-draft' on, as the provenance notes it."""
    import shlex
    import sys

    argv = sys.argv
    start = argv.index("train-draft") if "train-draft" in argv else len(argv)
    return "hetspec " + shlex.join(argv[start:] or ["train-draft"])
