"""Reading a user's input files: what a path names, and what a JSON or YAML file
may hold. Hardware profiles, model specs, stacks, prompts, traces and run records
are read through it; it imports nothing of the project, so every layer may.

``regular_input`` is the check every reader of a user's file passes first: a
missing path, a directory, a FIFO or a device (``/dev/null``) is named as what
it is, in one sentence with the reader's fix, instead of "does not exist" or a
hang on a pipe no one writes to.

Both readers also refuse a key given twice in one mapping (JSON and YAML keep the
last one in silence): ``DuplicateKey`` names it, and a YAML error names its line.
YAML merge keys (``<<: *base``) still override as YAML means them to.

JSON and YAML read an integer with Python's ``int()``, which refuses more than
4300 digits with a message that names neither the file nor the field.
``json_loads`` and ``YamlLoader`` read such an integer as a ``LongInteger``
marker instead, and ``refuse_long_integers`` names the first field holding one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml


_SPECIAL = {stat.S_ISFIFO: "FIFO (named pipe)", stat.S_ISCHR: "character device",
            stat.S_ISBLK: "block device", stat.S_ISSOCK: "socket"}


def special_kind(mode: int) -> str:
    """What a file that is neither regular nor a directory is ('FIFO (named pipe)',
    'character device', ...), for inputs and outputs alike."""
    return next((kind for test, kind in _SPECIAL.items() if test(mode)), "special file")


def regular_input(path, what: str, fix: str, error: type[Exception] = ValueError,
                  shown: str | None = None) -> os.stat_result:
    """The stat of ``path`` once it names a regular file; otherwise ``error`` with
    one sentence: '{what} {path} does not exist / is a directory / is a FIFO
    (named pipe), not a regular file; {fix}' (``shown``: the path as printed)."""
    path = Path(path)
    shown = str(path) if shown is None else shown
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{what} {shown} does not exist; {fix}") from None
    except OSError as exc:
        raise error(f"{what} {shown} cannot be read ({exc.strerror}); {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {shown} is a directory, not a regular file; {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {shown} is a {special_kind(st.st_mode)}, not a regular file; "
                    f"{fix}")
    return st


class LongInteger:
    """An integer of more digits than Python converts (a corrupt or hostile file)."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits


def _int(text: str):
    try:
        return int(text)
    except ValueError:
        if len(text) > 1000:  # the conversion limit, not a malformed number
            return LongInteger(sum(c.isdigit() for c in text))
        raise


class DuplicateKey(ValueError):
    """A JSON object gives one key twice."""


def _unique_pairs(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKey(f"key '{key}' appears twice in one object; keep one")
        seen.add(key)
    return dict(pairs)


def json_loads(text: str) -> Any:
    """``json.loads``, an integer too long to convert read as a ``LongInteger``,
    a key given twice in one object refused (``DuplicateKey``)."""
    return json.loads(text, parse_int=_int, object_pairs_hook=_unique_pairs)


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlLoader(_BaseLoader):
    """The safe YAML loader, an integer too long to convert read as a ``LongInteger``."""


def _yaml_int(loader, node):
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        if len(node.value) > 1000:
            return LongInteger(sum(c.isdigit() for c in node.value))
        raise


def _yaml_map(loader, node):
    """A mapping whose keys are each given once (merge keys aside)."""
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node,
                                                                       yaml.ScalarNode):
            continue
        if key_node.value in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"found the key '{key_node.value}' twice in one mapping",
                key_node.start_mark)
        seen.add(key_node.value)
    yield from yaml.SafeLoader.construct_yaml_map(loader, node)


YamlLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
YamlLoader.add_constructor("tag:yaml.org,2002:map", _yaml_map)


def long_integer_field(data: Any, where: str = "", seen: set | None = None
                       ) -> tuple[str, int] | None:
    """(dotted field, digits) of the first ``LongInteger`` in ``data``, or None.
    Each list or mapping is visited once: YAML aliases share them (an alias bomb
    is a small graph of shared lists, not the billion items it expands to)."""
    if isinstance(data, LongInteger):
        return where or "(the file)", data.digits
    if not isinstance(data, (dict, list)):
        return None
    seen = set() if seen is None else seen
    if id(data) in seen:
        return None
    seen.add(id(data))
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        found = long_integer_field(value, f"{where}.{key}" if where else str(key), seen)
        if found:
            return found
    return None


def refuse_long_integers(data: Any, shown: str, error: type[Exception] = ValueError) -> Any:
    """``data`` unchanged, or ``error`` naming the file and the first field that
    holds an integer too long to be a value."""
    found = long_integer_field(data)
    if found:
        field, digits = found
        raise error(f"{shown}: field '{field}': integer too large ({digits:,} digits); "
                    "give the real value")
    return data
