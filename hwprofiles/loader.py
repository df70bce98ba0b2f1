"""Load platforms, model specs and software stacks by shipped name or by path to a
YAML file."""

from __future__ import annotations

import codecs
import hashlib
import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from hwprofiles import plausible
from hwprofiles.reading import YamlLoader, refuse_long_integers, regular_input
from hwprofiles.schema import ModelSpec, Platform
from hwprofiles.stacks import Stack

_KINDS = {"platforms": Platform, "models": ModelSpec, "stacks": Stack}
# fields only a stack has: a file with one of them is validated as a stack
_STACK_FIELDS = set(Stack.model_fields) - {"name", "description", "sources"}
# Profiles are a few KB (the largest shipped one is under 10 KB); a file over this
# is the wrong file, and parsing it could take gigabytes of memory.
MAX_PROFILE_BYTES = 1_000_000
MEMO_SIZE = 256  # validated profiles kept, keyed by (kind, path, content hash)
_MEMO: dict[tuple, object] = {}
_HF_HINT = {"models": ", a Hugging Face id of one (e.g. Qwen/Qwen3-32B)"}


class ProfileError(ValueError):
    """A profile a user wrote or named is wrong; the message says how to fix it."""


def _data_dir(kind: str) -> Path:
    return Path(str(resources.files("hwprofiles") / "data" / kind))


def list_names(kind: str) -> list[str]:
    """Shipped profile names of one kind ('platforms', 'models' or 'stacks')."""
    return sorted(p.stem for p in _data_dir(kind).glob("*.yaml"))


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    if not str(name_or_path).strip():
        raise ProfileError(f"the {kind[:-1]} name is empty; give a shipped name or a "
                           "path to a YAML file")
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return _checked_file(path)
    shipped = _data_dir(kind) / f"{name_or_path}.yaml"
    if not shipped.is_file() and kind == "models":
        shipped = hf_id_index().get(str(name_or_path).lower(), shipped)
    if not shipped.is_file():
        raise ProfileError(
            f"unknown {kind[:-1]} '{printable(str(name_or_path))}'; choose one of "
            f"{', '.join(list_names(kind))}{_HF_HINT.get(kind, '')} or give a path to a "
            "YAML file")
    return shipped


def hf_id_index() -> dict[str, Path]:
    """Shipped model files by the lower-cased Hugging Face ids in their ``hf_ids``
    (the Hub matches ids without regard to case)."""
    index: dict[str, Path] = {}
    for name in list_names("models"):
        path = _data_dir("models") / f"{name}.yaml"
        for hf_id in load_file("models", path).hf_ids:
            index.setdefault(hf_id.lower(), path)
    return index


def printable(text: str) -> str:
    """Text with control characters (terminal escape sequences) written as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _checked_file(path: Path) -> Path:
    """The path, once it names a regular file within the size limit."""
    shown = printable(str(path))
    st = regular_input(path, "profile file", "give the path of a YAML file or a shipped "
                       "name", ProfileError, shown)
    if st.st_size > MAX_PROFILE_BYTES:
        raise ProfileError(f"profile file {shown} is {st.st_size / 1e6:.1f} MB, over the "
                           f"{MAX_PROFILE_BYTES / 1e6:.0f} MB limit for profiles (a "
                           "platform or model is a few KB); check that it is the right "
                           "file")
    return path


def _format_error(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if not where:  # a check across fields names what it is about itself
        return printable(f"{path.name}: {msg}")
    return printable(f"{path.name}: field '{where}': {msg}")


def load_file(kind: str | None, path: str | Path):
    """Validate one YAML file (kind None: a platform if it has 'devices', a stack
    if it has a field only a stack has, else a model). Memoised on the file's content hash, which is safe because profiles are
    frozen, and sees a rewrite that kept the modification time (cp -p, rsync -t)."""
    path = _checked_file(Path(path).resolve())
    raw = _read_bytes(path)
    key = (kind, path, hashlib.sha256(raw).digest())
    if key not in _MEMO:
        if len(_MEMO) >= MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = _validate(kind, path, raw)
    return _MEMO[key]


def _validate(kind: str | None, path: Path, raw: bytes):
    data = _parse(path, _decode(path, raw))
    if kind is None:
        kind = ("platforms" if "devices" in data
                else "stacks" if _STACK_FIELDS & set(data) else "models")
    try:
        obj = _KINDS[kind].model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        found = plausible.explain(kind, data, tuple(first["loc"]), first.get("input"))
        if found is None:
            raise ProfileError(_format_error(path, err)) from None
        raise ProfileError(printable(f"{path.name}: {found.text}; {plausible.FIX}")) from None
    found = plausible.problems(obj)
    if found:
        raise ProfileError(printable(f"{path.name}: {found[0].text}; {plausible.FIX}"))
    return obj


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, read no further than the size limit (it may have grown)."""
    with path.open("rb") as f:
        raw = f.read(MAX_PROFILE_BYTES + 1)
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"profile file {printable(path.name)} grew past the "
                           f"{MAX_PROFILE_BYTES / 1e6:.0f} MB limit for profiles while "
                           "being read; check that it is the right file")
    return raw


def _decode(path: Path, raw: bytes) -> str:
    """UTF-8, or UTF-8/UTF-16 with a byte-order mark (YAML allows both)."""
    encoding = "utf-8"
    if raw.startswith(codecs.BOM_UTF8):
        encoding = "utf-8-sig"
    elif raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        label = "UTF-16" if encoding == "utf-16" else "UTF-8"
        raise ProfileError(f"{printable(path.name)} is not {label} text (byte {exc.start} "
                           "cannot be decoded); save the profile as UTF-8 YAML") from None


def _parse(path: Path, text: str) -> dict:
    name = printable(path.name)
    try:
        data = yaml.load(text, Loader=YamlLoader)
    except yaml.constructor.ConstructorError as exc:
        tag = re.search(r"tag '([^']*)'", exc.problem or "")
        if tag is None:  # e.g. an unhashable key: a plain syntax problem
            raise ProfileError(_syntax_error(name, exc)) from None
        shown = printable(tag.group(1).replace("tag:yaml.org,2002:", "!!"))
        raise ProfileError(f"{name}{_line(exc)}: the YAML tag '{shown}' is not allowed; "
                           "profiles hold plain mappings, lists, numbers and strings, "
                           "drop the tag") from None
    except yaml.reader.ReaderError as exc:
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ProfileError(f"{name} holds a character YAML does not allow (#x{code:04x} "
                           f"at character {exc.position}); save it as plain UTF-8 "
                           "text") from None
    except yaml.YAMLError as exc:
        raise ProfileError(_syntax_error(name, exc)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{name} must hold a YAML mapping of fields")
    return refuse_long_integers(data, name, ProfileError)


def _syntax_error(name: str, exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or exc.__class__.__name__
    return (f"{name} is not valid YAML{_line(exc)}: {printable(problem)}; fix the syntax "
            "there")


def _line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def load_platform(name_or_path: str | Path) -> Platform:
    """A platform by shipped name (e.g. 'h100-sxm-5x') or YAML path."""
    return load_file("platforms", _resolve("platforms", name_or_path))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A model spec by shipped name (e.g. 'llama-3.1-70b') or YAML path."""
    return load_file("models", _resolve("models", name_or_path))


def load_stack(name_or_path: str | Path) -> Stack:
    """A software stack by shipped name (e.g. 'hf-eager') or YAML path."""
    return load_file("stacks", _resolve("stacks", name_or_path))


def validate_path(path: str | Path):
    """Validate a user's YAML file as a platform, a model or a stack (decided by its
    fields),
    parsing it once."""
    return load_file(None, _checked_file(Path(path)))
