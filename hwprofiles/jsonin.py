"""One reader for every JSON and JSON-lines file a user gives hetspec.

Prompts (``--prompts``), acceptance traces, Hugging Face ``config.json`` files,
run records and their spans are all read here, so each is refused alike, in
one sentence naming the file (and the line of a JSON-lines file) and the fix:

- what the path names (``hwprofiles.reading.regular_input``: missing, a directory,
  a FIFO or a device), an empty file, a file over the reader's size limit;
- its encoding: UTF-8, with or without a byte-order mark (a UTF-8 BOM is read
  past, as editors on Windows write it); a UTF-16 or UTF-32 BOM is named as one,
  and bytes that are not UTF-8 are named by their offset;
- its JSON: a syntax error with its line and column, a key given twice in one
  object (JSON keeps the last in silence), an integer too long to convert, and nesting deeper than ``MAX_DEPTH`` levels
  (no input of hetspec nests past a few; Python's parser recurses once per
  level and would end in a RecursionError). ``NaN`` and ``Infinity`` are read
  (the executor's own lines hold them where a value is undefined); each reader's
  schema names the field where one is not allowed.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from hwprofiles.reading import (DuplicateKey, _int, _unique_pairs, long_integer_field,
                              regular_input)
from hwprofiles.loader import printable

MAX_DEPTH = 64  # nesting levels: a chat message list is 3, a run record under 10
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
              (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def _size(nbytes: float, limit: int) -> str:
    """Bytes in the unit the limit is a whole number of: MiB or MB."""
    return f"{nbytes / 2**20:.3g} MiB" if limit % 2**20 == 0 else f"{nbytes / 1e6:.3g} MB"


def read_text(path, what: str, fix: str, max_bytes: int, error=ValueError,
              empty: bool = False) -> str:
    """The text of the file at ``path`` (``what``: 'prompts file', 'run record'),
    or ``error`` with one sentence: not a regular file, empty (unless ``empty``),
    over ``max_bytes``, a UTF-16/32 byte-order mark, not UTF-8."""
    path, shown = Path(path), printable(str(path))
    size = regular_input(path, what, fix, error, shown).st_size
    if size == 0 and not empty:
        raise error(f"{what} {shown} is empty; {fix}")
    if size > max_bytes:
        raise error(f"{what} {shown} holds {_size(size, max_bytes)}, over its "
                    f"{_size(max_bytes, max_bytes)} limit; {fix}")
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{what} {shown} cannot be read ({exc.strerror}); {fix}") from None
    if len(raw) > max_bytes:
        raise error(f"{what} {shown} grew past its {_size(max_bytes, max_bytes)} limit "
                    f"while being read; {fix}")
    wide = next((name for bom, name in _WIDE_BOMS if raw.startswith(bom)), None)
    if wide:
        raise error(f"{what} {shown} starts with a {wide} byte-order mark ({wide} text); "
                    f"save it as UTF-8 and {fix}")
    try:
        return raw.decode("utf-8-sig")  # a UTF-8 byte-order mark is read past
    except UnicodeDecodeError as exc:
        raise error(f"{what} {shown} is not UTF-8 text (byte {exc.start} is "
                    f"{exc.object[exc.start]:#04x}; a binary file?); {fix}") from None


def _depth(value: Any) -> int:
    """The nesting depth of parsed JSON (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def parsed(text: str) -> tuple[Any, str | None]:
    """(value, None) for one JSON document, or (None, what is wrong with it)."""
    try:
        value = json.loads(text, parse_int=_int, object_pairs_hook=_unique_pairs)
    except DuplicateKey as exc:
        return None, (f"gives {str(exc).removeprefix('key ').split(' appears')[0]} twice "
                      "in one object")
    except RecursionError:
        return None, f"nests deeper than {MAX_DEPTH} levels"
    except json.JSONDecodeError as exc:
        return None, f"is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    if _depth(value) > MAX_DEPTH:
        return None, f"nests deeper than {MAX_DEPTH} levels"
    found = long_integer_field(value)
    if found:
        where = "" if found[0] == "(the file)" else f"field '{found[0]}' "
        return None, f"{where}holds an integer of {found[1]:,} digits, too long to be a value"
    return value, None


def parse(text: str, shown: str, fix: str, error=ValueError) -> Any:
    """One JSON document, or ``error``: '{shown} {problem}; {fix}'."""
    value, problem = parsed(text)
    if problem:
        raise error(f"{shown} {problem}; {fix}")
    return value


def read_json(path, what: str, fix: str, max_bytes: int, error=ValueError) -> Any:
    """The JSON document in the file at ``path``, read and parsed as the module
    says; ``error`` with one sentence otherwise."""
    return parse(read_text(path, what, fix, max_bytes, error),
                 f"{what} {printable(str(path))}", fix, error)


def read_jsonl(path, what: str, fix: str, max_bytes: int, error=ValueError
               ) -> list[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON-lines file (lines
    end at \\n alone); ``error`` naming the first bad line."""
    text = read_text(path, what, fix, max_bytes, error)
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            out.append((n, parse(line, f"{what} {printable(str(path))} line {n}", fix,
                                 error)))
    return out
