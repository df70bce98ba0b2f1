"""Run records: every simulated or measured run's inputs and outputs.

A record is one JSON file written atomically (temp file + rename), so a reader
never sees half a record.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import tempfile
from importlib import metadata
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path, text: str) -> Path:
    """Write a file whole or not at all: a temp file beside it, fsync, rename.
    The file gets the permissions a plain open() would give (0666 less umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def versions() -> dict[str, str]:
    out = {"python": _platform.python_version()}
    for pkg in ("hetspec", "simpy", "numpy", "scipy", "pydantic", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_record(path, *, kind: str, inputs: dict, metrics: dict, **extra) -> Path:
    """Write a run record: kind ('simulated' | 'measured'), inputs, metrics, extras."""
    record = {"schema": "hetspec.run/1", "kind": kind, "inputs": inputs,
              "versions": versions(), "metrics": metrics, **extra}
    return atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True))


def read_record(path) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"run record {path} cannot be read ({exc.__class__.__name__}); "
                         "pass a file written by 'hetspec run --json'") from None
    if not isinstance(record, dict) or record.get("schema") != "hetspec.run/1":
        raise ValueError(f"{path} is not a hetspec run record (schema hetspec.run/1); "
                         "pass a file written by 'hetspec run --json'")
    return record
