"""Self-distillation of a target's draft heads (``hetspec train-draft``).

The target teaches its own early exits: every head learns to match the target's
last-layer distribution, read from the hidden states after its exit layer.

1. Text, all offline and in a fixed order: the target's own greedy answers to
   chat prompts on everyday topics (words of its tokenizer's vocabulary, put in
   a few templates: the distribution a decoding run sees), and a few windows of
   the installed Python packages' long descriptions (METADATA, mostly READMEs)
   (``executors.train.corpus``).
2. One pass of the frozen target over every window keeps the hidden states at
   each exit layer and the last layer's top-K tokens with their log-probs.
3. The draft vocabulary: the tokens the target most often ranks first, filled
   up with the lowest ids (BPE ids follow merge order, roughly frequency).
4. Each head trains on its exit's states with a top-K reduced KL: the target's
   top-K probabilities (renormalised over those of the draft vocabulary) against
   the head's log-softmax over the draft vocabulary. The LM head stays frozen.
5. Held-out windows (every ``held_out_every``-th) give each head's top-1
   agreement with the target's argmax over the full vocabulary.
6. Last, the multi-token heads (``executors.train.ahead``): for Mirror's draft,
   heads that guess the tokens after the next from the same states.

Same config, same machine, same thread count, same installed packages: the same
artifact.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from executors.backend import drafts, models
from executors.backend.layers import Stack
from executors.train.ahead import ahead_layers_ok, fit_ahead, machine_facts, n_ahead_heads
from executors.train.corpus import Corpus, build_corpus
from executors.train.config import TrainConfig

# teacher --------------------------------------------------------------------------
@dataclass
class Teacher:
    """Per window: hidden states at the exit layers, the target's argmax and top-K."""

    states: dict[int, torch.Tensor]   # exit layer -> [S, T, H] fp16
    argmax: torch.Tensor              # [S, T]
    top_ids: torch.Tensor             # [S, T, K]
    top_logp: torch.Tensor            # [S, T, K]


@torch.inference_mode()
def teach(model, corpus: Corpus, layers: tuple[int, ...], k: int, batch: int = 8,
          bar=None) -> Teacher:
    states = {e: [] for e in layers}
    argmax, top_ids, top_logp = [], [], []
    for a in range(0, corpus.ids.shape[0], batch):
        ids = corpus.ids[a:a + batch]
        out = model(input_ids=ids, attention_mask=corpus.valid[a:a + batch].long(),
                    output_hidden_states=True)
        for e in layers:  # hidden_states[e]: after the first e layers
            states[e].append(out.hidden_states[e].half())
        logp = torch.log_softmax(out.logits.float(), -1)
        top = torch.topk(logp, k, dim=-1)
        argmax.append(top.indices[..., 0])
        top_ids.append(top.indices)
        top_logp.append(top.values)
        if bar is not None:
            bar.update(ids.shape[0])
    return Teacher({e: torch.cat(v) for e, v in states.items()}, torch.cat(argmax),
                   torch.cat(top_ids), torch.cat(top_logp))


def draft_vocabulary(argmax: torch.Tensor, valid: torch.Tensor, size: int,
                     vocab: int) -> torch.Tensor:
    """The ``size`` tokens the target ranks first most often, then the lowest ids."""
    counts = torch.bincount(argmax[valid], minlength=vocab)
    seen = int((counts > 0).sum())
    order = torch.argsort(-counts.double() * vocab + torch.arange(vocab).double())
    chosen = order[:min(seen, size)]
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[chosen] = False
    fill = torch.nonzero(rest).flatten()[:size - len(chosen)]
    return torch.sort(torch.cat([chosen, fill])).values


def targets_in_vocab(teacher: Teacher, vocab_ids: torch.Tensor, vocab: int):
    """Teacher top-K as (positions in the draft vocabulary, probabilities
    renormalised over those that lie in it; 0 where a token lies outside)."""
    where = torch.full((vocab,), -1, dtype=torch.long)
    where[vocab_ids] = torch.arange(len(vocab_ids))
    pos = where[teacher.top_ids]
    logp = teacher.top_logp.masked_fill(pos < 0, float("-inf"))
    probs = torch.softmax(logp, -1).nan_to_num(0.0)
    return pos.clamp(min=0), probs


# students -------------------------------------------------------------------------
def student_states(head, states: torch.Tensor, rope) -> torch.Tensor:
    """Head input states -> normalised states for the LM head (adapters attend
    causally over the window)."""
    if isinstance(head, drafts.Adapter):
        cos, sin = rope
        t = states.shape[1]
        keys, values = head.keys_values(states, cos[..., :t, :], sin[..., :t, :])
        causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
        states = head.attend(states, keys, values, cos[..., :t, :], sin[..., :t, :], causal)
        return head.head(states)
    return head(states)


def distill_loss(head, states, rows, pos, probs, valid, rope) -> torch.Tensor:
    """Top-K reduced KL (its cross-entropy part) over the valid positions."""
    logq = torch.log_softmax((student_states(head, states.float(), rope) @ rows.T).float(), -1)
    ce = -(probs * torch.gather(logq, -1, pos)).sum(-1)
    return ce[valid].mean()


def train_head(head, states, rows, pos, probs, valid, rope, cfg: TrainConfig, gen,
               bar=None) -> list[float]:
    """AdamW with cosine decay over random batches of training windows."""
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup)
                                              * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    losses = []
    for _ in range(cfg.steps):
        pick = torch.randint(0, states.shape[0], (cfg.batch_windows,), generator=gen)
        loss = distill_loss(head, states[pick], rows, pos[pick], probs[pick], valid[pick],
                            rope)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
    return losses


@torch.no_grad()
def agreement(head, states, rows, vocab_ids, argmax, valid, rope) -> float:
    """Share of valid positions where the head's top token is the target's."""
    hits = total = 0
    for a in range(0, states.shape[0], 8):
        z = student_states(head, states[a:a + 8].float(), rope) @ rows.T
        mine = vocab_ids[z.argmax(-1)]
        ok = valid[a:a + 8]
        hits += int((mine == argmax[a:a + 8])[ok].sum())
        total += int(ok.sum())
    return hits / max(1, total)


# whole run ------------------------------------------------------------------------
def new_heads(model, stack_shape: dict, cfg: TrainConfig):
    norm = model.model.norm.weight
    exits = {e: drafts.ExitHead(stack_shape["hidden"], norm) for e in cfg.exits}
    adapters = {}
    for e in cfg.adapters:
        a = drafts.Adapter(stack_shape["hidden"], stack_shape["n_heads"],
                           stack_shape["n_kv_heads"], stack_shape["head_dim"], norm)
        a.init_from(model.model.layers[min(e, len(model.model.layers) - 1)])
        adapters[e] = a
    return exits, adapters


def check_layers(cfg: TrainConfig, n_layers: int) -> None:
    for name, layers in (("exits", cfg.exits), ("adapters", cfg.adapters)):
        bad = [e for e in layers if not 1 <= e < n_layers]
        if bad:
            raise ValueError(f"train-draft --{name} {bad[0]} is not an exit layer of a "
                             f"{n_layers}-layer target; give layers from 1 to {n_layers - 1}")
    if not cfg.exits and not cfg.adapters:
        raise ValueError("train-draft has no heads to train; give --exits or --adapters")
    ahead_layers_ok(cfg)


def train(cfg: TrainConfig, out_path, progress: bool = True,
          command: str | None = None) -> dict:
    """Train every head of ``cfg`` and write the artifact; returns its provenance
    (``command``: the command line that ran it, recorded there)."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0, started = time.perf_counter(), machine_facts()
    loaded = models.load(cfg.target, seed=cfg.seed)
    model, tok = loaded.model, loaded.tokenizer
    if tok is None:
        raise ValueError(f"train-draft needs a target with a tokenizer; '{cfg.target}' has "
                         f"none (use {models.REAL_NAME} or a checkpoint directory)")
    check_layers(cfg, loaded.spec.n_layers)
    shape = drafts.shape_of(Stack(model))
    steps_total = cfg.prompts + cfg.steps * (len(cfg.exits) + len(cfg.adapters)
                                             + n_ahead_heads(cfg))
    with tqdm(total=steps_total, desc="train-draft", unit="step", disable=not progress,
              file=sys.stderr) as bar:
        phase_s = {"load": time.perf_counter() - t0}
        corpus = build_corpus(model, tok, cfg, bar)
        phase_s["text"] = time.perf_counter() - t0 - sum(phase_s.values())
        layers = tuple(sorted(set(cfg.exits) | set(cfg.adapters)))
        bar.set_description("train-draft: target pass")
        teacher = teach(model, corpus, layers, cfg.top_k)
        phase_s["target_pass"] = time.perf_counter() - t0 - sum(phase_s.values())
        heads, prov = fit_all(model, shape, cfg, corpus, teacher, bar)
        phase_s["heads"] = time.perf_counter() - t0 - sum(phase_s.values())
    prov["phase_s"] = {k: round(v, 1) for k, v in phase_s.items()}
    prov.update({"target": cfg.target, "config": asdict(cfg), "corpus": corpus.sources,
                 "threads": cfg.threads, "wall_s": round(time.perf_counter() - t0, 1),
                 "torch": torch.__version__, "started": started,
                 "finished": machine_facts(),
                 **({"command": command} if command else {})})
    drafts.save_artifact(heads, out_path, shape, cfg.target, prov)
    return prov


def fit_all(model, shape, cfg: TrainConfig, corpus: Corpus, teacher: Teacher, bar):
    """Split, choose the draft vocabulary, train and evaluate every head."""
    s = corpus.ids.shape[0]
    held = torch.arange(s) % cfg.held_out_every == cfg.held_out_every - 1
    train_rows = torch.nonzero(~held).flatten()
    held_rows = torch.nonzero(held).flatten()
    vocab = model.config.vocab_size
    vocab_ids = draft_vocabulary(teacher.argmax[train_rows], corpus.scored[train_rows],
                                 cfg.draft_vocab, vocab)
    lm_rows = model.lm_head.weight.detach()[vocab_ids]
    pos, probs = targets_in_vocab(teacher, vocab_ids, vocab)
    ids = torch.arange(cfg.seq_len)[None]
    cos, sin = model.model.rotary_emb(lm_rows[:1], ids)
    rope = (cos[:, None].detach(), sin[:, None].detach())
    exits, adapters = new_heads(model, shape, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    report = {}
    for kind, mods in (("exit", exits), ("adapter", adapters)):
        for e, head in mods.items():
            bar.set_description(f"train-draft: {kind} {e}")
            st = teacher.states[e]
            base = agreement(head, st[held_rows], lm_rows, vocab_ids, teacher.argmax[held_rows],
                             corpus.scored[held_rows], rope)
            losses = train_head(head, st[train_rows], lm_rows, pos[train_rows],
                                probs[train_rows], corpus.scored[train_rows], rope, cfg, gen,
                                bar)
            head.eval().requires_grad_(False)
            after = agreement(head, st[held_rows], lm_rows, vocab_ids,
                              teacher.argmax[held_rows], corpus.scored[held_rows], rope)
            report[f"{kind}.{e}"] = {"loss_first": round(losses[0], 4),
                                     "loss_last_mean10": round(sum(losses[-10:]) / 10, 4),
                                     "held_out_top1_before": round(base, 4),
                                     "held_out_top1": round(after, 4)}
    split = {name: {"states": {e: teacher.states[e][rows] for e in cfg.ahead
                               if e in teacher.states},
                    "pos": pos[rows], "probs": probs[rows], "argmax": teacher.argmax[rows],
                    "scored": corpus.scored[rows]}
             for name, rows in (("train", train_rows), ("held", held_rows))}
    ahead, more = fit_ahead(
        exits, {**split, "rows": lm_rows, "vocab_ids": vocab_ids, "rope": rope}, cfg, gen,
        bar, train_head, agreement)
    report.update(more)
    covered = corpus.scored[held_rows] & torch.isin(teacher.argmax[held_rows], vocab_ids)
    heads = drafts.DraftHeads(exits, adapters, vocab_ids, ahead=ahead)
    return heads, {"heads": report, "draft_vocab": len(vocab_ids),
                   "held_out_windows": len(held_rows), "train_windows": len(train_rows),
                   "held_out_positions": int(corpus.scored[held_rows].sum()),
                   "held_out_vocab_coverage": round(
                       int(covered.sum()) / max(1, int(corpus.scored[held_rows].sum())), 4),
                   "loss": "top-K reduced KL to the last layer (cross-entropy against "
                           "the target's top-K probabilities renormalised over the draft "
                           "vocabulary)"}
