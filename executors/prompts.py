"""Prompts for measured runs: a built-in set by name, or a JSONL file.

Built-in sets (``SETS``): ``chat``, four short questions (the default), and
``grounded``, eight tasks over a passage written for the project (summarise,
answer from the passage, extract names, dates and amounts, correct spelling,
restate a recipe as steps, edit a Python module), where the answer reuses the
input's words: what prompt lookup (``--draft ngram``) proposes from.

Each JSONL line is a list of chat messages (``[{"role": "user", "content":
"..."}]``) or an object with a ``messages`` list. Messages are rendered with the
model's chat template; a model without a tokenizer (random weights of a large
vocabulary) gets the UTF-8 bytes of the text as token ids.
"""

from __future__ import annotations

from pathlib import Path

from hwprofiles.jsonin import read_jsonl

DATA = Path(__file__).resolve().parent / "data"

MAX_PROMPTS_BYTES = 16 * 2**20  # prompts for a measured run, not a data set
FIX = "pass a JSONL file of chat messages (one list of messages per line) with --prompts"

BUILTIN = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
    [{"role": "user", "content": "List three uses of a paperclip."}],
)


SETS = {"chat": None, "grounded": DATA / "prompts-grounded.jsonl"}  # None: BUILTIN


def load(name_or_path: str | None) -> list[list[dict]]:
    """The prompts ``--prompts`` names: a built-in set (``SETS``), else a JSONL
    file; None: the chat set."""
    if name_or_path is None or name_or_path == "chat":
        return list(BUILTIN)
    if not str(name_or_path).strip():
        raise ValueError(f"--prompts is empty; give a built-in set ({', '.join(SETS)}) "
                         "or the path of a JSONL file of chat messages")
    if name_or_path in SETS:
        return load_jsonl(SETS[name_or_path])
    return load_jsonl(name_or_path)


def load_jsonl(path) -> list[list[dict]]:
    """The prompts of a JSONL file (``hwprofiles.jsonin`` reads it: size,
    encoding, nesting and keys given twice are refused as for every JSON input)."""
    out = []
    for n, item in read_jsonl(path, "prompts file", FIX, MAX_PROMPTS_BYTES):
        messages = item.get("messages") if isinstance(item, dict) else item
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "content" in m for m in messages):
            raise ValueError(f"prompts file {path} line {n} must be a list of messages with "
                             "'role' and 'content' (or an object with 'messages')")
        out.append(messages)
    if not out:
        raise ValueError(f"prompts file {path} holds no prompts; add one JSON line per "
                         "prompt")
    return out


def encode(messages: list[dict], tokenizer, vocab: int) -> list[int]:
    """Token ids of a chat prompt, ready for the assistant's answer."""
    if tokenizer is not None:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in messages)
    return [b % vocab for b in text.encode("utf-8")] + [vocab - 1]


def token_floor(messages: list[dict]) -> int:
    """Tokens a chat prompt takes at least, known before any tokenizer loads: its
    words (runs of non-space characters). Every tokenizer a run uses splits text
    at whitespace before it merges (byte-level BPE's pre-tokenizer, SentencePiece's
    whitespace split), so no token spans two words; a model without a tokenizer
    takes a token per byte (``encode``), more still."""
    return sum(len(str(m.get("content", "")).split()) for m in messages)
