"""Top-1 agreement of the shipped draft heads with SmolLM2-135M on the prompts a
run decodes: the acceptance a schedule drafting through them can reach.

    python benchmarks/head_agreement.py [--max-new-tokens 48] [--prompts FILE]

For each prompt (default: the executor's built-in four), the target's greedy
answer is generated, then the whole sequence is run once with every hidden
state kept: at each position that predicts an answer token, each head (exit
heads and adapters of executors/data/smollm2-135m-drafts.safetensors) reads the
states after its exit layer, as training and the executor do, and its top token
over the draft vocabulary is compared with the target's argmax. Teacher-forced
(every head sees the target's own prefix), so this is the per-token acceptance
of a greedy draft of one token, the ``alpha`` that ``break_even.py`` compares
with what a speedup needs. The training's held-out agreement (the artifact's
provenance) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", help="JSONL of chat messages (default: the built-in four)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from executors.train import distil
    from executors.backend import drafts, models
    from executors.backend.layers import Stack
    from executors.prompts import BUILTIN, encode, load_jsonl

    torch.set_num_threads(args.threads)
    loaded = models.load("smollm2-135m")
    model, tok = loaded.model, loaded.tokenizer
    artifact = drafts.artifact_path("smollm2-135m")
    if artifact is None:
        ap.error("no draft artifact is installed; train one with 'hetspec train-draft'")
    heads = drafts.load_artifact(artifact, drafts.shape_of(Stack(model)))
    rows = model.lm_head.weight.detach()[heads.vocab_ids]
    held_out = json.loads(drafts.provenance_path(artifact).read_text())["heads"]
    prompts = load_jsonl(args.prompts) if args.prompts else list(BUILTIN)
    hits: dict[str, list[int]] = {}
    with torch.inference_mode():
        for messages in prompts:
            ids = encode(messages, tok, model.config.vocab_size)
            seq = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                                 do_sample=False)
            out = model(input_ids=seq, output_hidden_states=True)
            argmax = out.logits.argmax(-1)[0]
            positions = torch.arange(seq.shape[1])[None]
            cos, sin = model.model.rotary_emb(out.hidden_states[0], positions)
            rope = (cos[:, None], sin[:, None])
            first, last = len(ids) - 1, seq.shape[1] - 1  # positions predicting the answer
            for kind, table in (("exit", heads.exits), ("adapter", heads.adapters)):
                for layer, head in sorted(table.items()):
                    z = distil.student_states(head, out.hidden_states[layer].float(), rope)
                    mine = heads.vocab_ids[(z @ rows.T).argmax(-1)][0]
                    same = (mine[first:last] == argmax[first:last])
                    tally = hits.setdefault(f"{kind}.{layer}", [0, 0])
                    tally[0] += int(same.sum())
                    tally[1] += int(same.numel())
    print(f"{'head':12s} {'built-in prompts':>17s} {'positions':>9s} {'held out (training)':>20s}")
    for name, (same, total) in sorted(hits.items(), key=lambda kv: (kv[0][0], int(kv[0].split('.')[1]))):
        trained = held_out.get(name, {}).get("held_out_top1")
        shown = f"{trained:.1%}" if trained is not None else "-"
        print(f"{name:12s} {same / total:17.1%} {total:9d} {shown:>20s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
