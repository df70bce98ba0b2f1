"""The text ``hetspec train-draft`` distils on (``executors.train.distil``, step 1).

All offline and in a fixed order: the target's own greedy answers to chat
prompts on everyday topics (words of its tokenizer's vocabulary, put in a few
templates: the distribution a decoding run sees), and a few windows of the
installed Python packages' long descriptions (METADATA, mostly READMEs). The
packages are whatever is installed, less ``TrainConfig.exclude_packages``: an
artifact's corpus is rebuilt by excluding the packages installed since.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field

import torch

from executors.train.config import TrainConfig

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
