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


# A run record holds its inputs (prompts included), metrics and generated tokens:
# tens of KiB for the built-in prompts, a few MiB for thousands of prompts; a
# larger file is refused before it is read into memory.
MAX_RECORD_BYTES = 16 * 2**20


def _record_text(path: Path) -> str:
    fix = "pass the record.json that 'hetspec run' wrote"
    try:
        if path.is_dir():
            raise ValueError(f"run record {path} is a directory, not a file; {fix}")
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise ValueError(f"run record {path} holds {size / 2**20:.1f} MiB, over the "
                             f"{MAX_RECORD_BYTES // 2**20} MiB a run record takes; {fix}")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"run record {path} is not UTF-8 text (a binary file?); "
                         f"{fix}") from None
    except OSError as exc:
        raise ValueError(f"run record {path} cannot be read ({exc.strerror}); "
                         f"{fix}") from None


def read_record(path) -> dict:
    """A run record's JSON object; one-sentence ValueError when the file is not one."""
    path = Path(path)
    text = _record_text(path)
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"run record {path} cannot be read ({exc.__class__.__name__}); "
                         "pass a file written by 'hetspec run --json'") from None
    if not isinstance(record, dict) or record.get("schema") != "hetspec.run/1":
        raise ValueError(f"{path} is not a hetspec run record (schema hetspec.run/1); "
                         "pass a file written by 'hetspec run --json'")
    return record
