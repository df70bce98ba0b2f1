"""Load platforms and model specs by shipped name or by path to a YAML file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from functools import lru_cache

import yaml
from pydantic import ValidationError

from hwprofiles.schema import ModelSpec, Platform

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KINDS = {"platforms": Platform, "models": ModelSpec}


class ProfileError(ValueError):
    """A profile a user wrote or named is wrong; the message says how to fix it."""


def _data_dir(kind: str) -> Path:
    return Path(str(resources.files("hwprofiles") / "data" / kind))


def list_names(kind: str) -> list[str]:
    """Shipped profile names of one kind ('platforms' or 'models')."""
    return sorted(p.stem for p in _data_dir(kind).glob("*.yaml"))


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist; give a path to a "
                               "YAML file or a shipped name")
        return path
    shipped = _data_dir(kind) / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise ProfileError(
            f"unknown {kind[:-1]} '{name_or_path}'; choose one of "
            f"{', '.join(list_names(kind))} or give a path to a YAML file")
    return shipped


def _format_error(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{path.name}: field '{where}': {msg}"


def load_file(kind: str, path: str | Path):
    """Validate one YAML file; memoised on (path, modification time), which is safe
    because profiles are frozen."""
    path = Path(path).resolve()
    return _load_cached(kind, path, path.stat().st_mtime_ns)


@lru_cache(maxsize=256)
def _load_cached(kind: str, path: Path, _mtime_ns: int):
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path.name} is not valid YAML ({exc.__class__.__name__}); "
                           "fix the syntax near the reported line") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path.name} must hold a YAML mapping of fields")
    try:
        return _KINDS[kind].model_validate(data)
    except ValidationError as err:
        raise ProfileError(_format_error(path, err)) from None


def load_platform(name_or_path: str | Path) -> Platform:
    """A platform by shipped name (e.g. 'h100-sxm-5x') or YAML path."""
    return load_file("platforms", _resolve("platforms", name_or_path))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A model spec by shipped name (e.g. 'llama-3.1-70b') or YAML path."""
    return load_file("models", _resolve("models", name_or_path))


def validate_path(path: str | Path):
    """Validate a user's YAML file as a platform or a model (decided by its fields)."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path} does not exist; give a path to a YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        data = {}  # load_file reports the syntax error in one sentence
    kind = "platforms" if isinstance(data, dict) and "devices" in data else "models"
    return load_file(kind, path)
