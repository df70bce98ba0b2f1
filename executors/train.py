"""Self-distillation of a target's draft heads (``hetspec train-draft``).

The target teaches its own early exits: every head learns to match the target's
last-layer distribution, read from the hidden states after its exit layer.

1. Text, all offline and in a fixed order: the target's own greedy answers to
   chat prompts on everyday topics (words of its tokenizer's vocabulary, put in
   a few templates: the distribution a decoding run sees), and a few windows of
   the installed Python packages' long descriptions (METADATA, mostly READMEs).
2. One pass of the frozen target over every window keeps the hidden states at
   each exit layer and the last layer's top-K tokens with their log-probs.
3. The draft vocabulary: the tokens the target most often ranks first, filled
   up with the lowest ids (BPE ids follow merge order, roughly frequency).
4. Each head trains on its exit's states with a top-K reduced KL: the target's
   top-K probabilities (renormalised over those of the draft vocabulary) against
   the head's log-softmax over the draft vocabulary. The LM head stays frozen.
5. Held-out windows (every ``held_out_every``-th) give each head's top-1
   agreement with the target's argmax over the full vocabulary.
6. Last, the multi-token heads (``executors.trainahead``): for Mirror's draft,
   heads that guess the tokens after the next from the same states.

Same config, same machine, same thread count: the same artifact.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from executors import trainahead
from executors.backend import drafts, models
from executors.trainconfig import TrainConfig

PROMPT_TEMPLATES = (
    "Tell me about {topic}.",
    "Explain {topic} in simple terms.",
    "Write a short story about {topic}.",
    "Give three facts about {topic}.",
    "Why does {topic} matter?",
    "Write a haiku about {topic}.",
    "What should a beginner know about {topic}?",
)


@dataclass
class Corpus:
    """Token windows ``[S, T]`` with a validity mask, the positions that are
    scored (trained on and evaluated: those predicting an answer's or a
    document's tokens, not the chat template every prompt repeats; default: all
    valid ones), and where they came from."""

    ids: torch.Tensor
    valid: torch.Tensor
    sources: dict = field(default_factory=dict)
    scored: torch.Tensor | None = None

    def __post_init__(self):
        if self.scored is None:
            self.scored = self.valid.clone()


# text -------------------------------------------------------------------------
def package_texts() -> list[tuple[str, str, str]]:
    """(name, summary, description) of every installed distribution, by name."""
    seen, out = set(), []
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name = (meta.get("Name") or "").strip()
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        summary = " ".join((meta.get("Summary") or "").split())
        body = meta.get_payload() if hasattr(meta, "get_payload") else ""
        out.append((name, summary, body or meta.get("Description") or ""))
    return sorted(out, key=lambda t: t[0].lower())


def topics(tokenizer, n: int, first_id: int = 300, last_id: int = 20000) -> list[str]:
    """``n`` everyday words spread over the tokenizer's vocabulary: whole-word
    tokens (a leading space, then 4+ lowercase letters) between two ids, every
    k-th of them in id order (BPE ids follow merge order, roughly frequency)."""
    words = []
    for i in range(first_id, last_id):
        text = tokenizer.decode([i])
        if text.startswith(" ") and len(text) > 4 and text[1:].isalpha() and \
                text[1:].islower():
            words.append(text[1:])
    step = max(1, len(words) // max(1, n))
    return words[::step][:n]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """Chat prompts on ``n`` topics, the templates taken in turn."""
    return [_chat_ids(tokenizer, PROMPT_TEMPLATES[i % len(PROMPT_TEMPLATES)].format(topic=t))
            for i, t in enumerate(topics(tokenizer, n))]


def _chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@torch.inference_mode()
def generate(model, prompts: list[list[int]], n_new: int, batch: int, pad: int,
             stop: int | None = None, bar=None):
    """Greedy answers (prompt + answer ids, cut after ``stop``) with the model's
    own KV cache."""
    out = []
    for a in range(0, len(prompts), batch):
        chunk = prompts[a:a + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new,
                             do_sample=False, pad_token_id=pad)
        for p, row in zip(chunk, gen[:, width:].tolist()):
            if stop in row:  # a finished answer: what follows is padding
                row = row[:row.index(stop) + 1]
            out.append(p + row)
        if bar is not None:
            bar.update(len(chunk))
    return out


def doc_windows(tokenizer, packages, n: int, seq_len: int) -> list[list[int]]:
    """Windows of the packages' descriptions, prose-like ones first in name order."""
    out = []
    for _, _, body in packages:
        text = body.strip()
        if len(text) < 400 or sum(c.isascii() for c in text) < 0.97 * len(text):
            continue
        ids = tokenizer(text[:20000])["input_ids"]
        for a in range(0, len(ids) - seq_len + 1, seq_len):
            out.append(ids[a:a + seq_len])
            if len(out) >= n or a >= 2 * seq_len:  # at most 3 windows a package
                break
        if len(out) >= n:
            break
    return out


def build_corpus(model, tokenizer, cfg: TrainConfig, bar=None) -> Corpus:
    gone = {n.lower() for n in cfg.exclude_packages}
    packages = [p for p in package_texts() if p[0].lower() not in gone]
    prompts = chat_prompts(tokenizer, cfg.prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    answers = generate(model, prompts, cfg.answer_tokens, cfg.gen_batch, pad,
                       tokenizer.eos_token_id, bar)
    docs = doc_windows(tokenizer, packages, cfg.doc_windows, cfg.seq_len)
    rows = [r[:cfg.seq_len] for r in answers] + docs
    firsts = [len(p) - 1 for p in prompts] + [0] * len(docs)  # predicts the answer's 1st
    ids = torch.full((len(rows), cfg.seq_len), pad, dtype=torch.long)
    valid = torch.zeros(len(rows), cfg.seq_len, dtype=torch.bool)
    scored = torch.zeros_like(valid)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        valid[i, :len(r)] = True
        scored[i, firsts[i]:len(r) - 1] = True  # the last position's next token is unseen
    sources = {"generated_answers": len(answers), "answer_tokens": cfg.answer_tokens,
               "prompt_source": f"chat prompts: {len(PROMPT_TEMPLATES)} templates in turn "
                                "over everyday words of the target's tokenizer (whole-word "
                                "tokens, ids 300-20000, evenly spaced)",
               "doc_windows": len(docs),
               "doc_source": "METADATA long descriptions of installed Python "
                             "distributions, <=3 windows each, mostly-ASCII ones",
               "packages": len(packages), "positions": int(valid.sum()),
               "scored_positions": int(scored.sum()),
               "scored": "positions predicting answer or document tokens (not the chat "
                         "template and prompt)"}
    return Corpus(ids, valid, sources, scored)


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
    trainahead.ahead_layers_ok(cfg)


def train(cfg: TrainConfig, out_path, progress: bool = True,
          command: str | None = None) -> dict:
    """Train every head of ``cfg`` and write the artifact; returns its provenance
    (``command``: the command line that ran it, recorded there)."""
    from tqdm import tqdm

    from executors.backend.layers import Stack

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0, started = time.perf_counter(), trainahead.machine_facts()
    loaded = models.load(cfg.target, seed=cfg.seed)
    model, tok = loaded.model, loaded.tokenizer
    if tok is None:
        raise ValueError(f"train-draft needs a target with a tokenizer; '{cfg.target}' has "
                         f"none (use {models.REAL_NAME} or a checkpoint directory)")
    check_layers(cfg, loaded.spec.n_layers)
    shape = drafts.shape_of(Stack(model))
    steps_total = cfg.prompts + cfg.steps * (len(cfg.exits) + len(cfg.adapters)
                                             + trainahead.n_ahead_heads(cfg))
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
                 "finished": trainahead.machine_facts(),
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
    ahead, more = trainahead.fit_ahead(
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
