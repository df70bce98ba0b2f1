"""Run records: every simulated or measured run's inputs and outputs in one JSON
file (schema ``hetspec.run/1``), written whole or not at all through
``hwprofiles.outputfiles`` (the file plumbing every output shares) and read back
with one-sentence errors.
"""

from __future__ import annotations

import json
import platform as _platform
from importlib import metadata
from pathlib import Path

from hwprofiles.inputfiles import DuplicateKey, json_loads, refuse_long_integers, regular_input
from hwprofiles.outputfiles import atomic_write_text, json_safe


RUN_SCHEMA = "hetspec.run/1"  # the run record's schema, and its version
RUN_SCHEMA_FAMILY = RUN_SCHEMA.split("/")[0] + "/"  # a run record of any version


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
    record = {"schema": RUN_SCHEMA, "kind": kind, "inputs": inputs,
              "versions": versions(), "metrics": metrics, **extra}
    text = json.dumps(json_safe(record), indent=2, sort_keys=True, allow_nan=False)
    return atomic_write_text(path, text)


# A run record holds its inputs (prompts included), metrics and generated tokens:
# tens of KiB for the built-in prompts, a few MiB for thousands of prompts; a
# larger file is refused before it is read into memory.
MAX_RECORD_BYTES = 16 * 2**20


def _record_text(path: Path) -> str:
    fix = "pass the record.json that 'hetspec run' wrote"
    # stat only first: a pipe is never opened (a read would block)
    size = regular_input(path, "run record", fix).st_size
    try:
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
    """A run record's JSON object, of any version of the run schema (the reader of
    a measured run reads it by its version: ``policies.runs.measured``); one-sentence
    ValueError when the file is not one."""
    path = Path(path)
    text = _record_text(path)
    try:
        record = json_loads(text)
    except DuplicateKey as exc:
        raise ValueError(f"run record {path}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"run record {path} cannot be read ({exc.__class__.__name__}); "
                         "pass a file written by 'hetspec run --json'") from None
    refuse_long_integers(record, f"run record {path}")
    if not isinstance(record, dict) or not str(record.get("schema", "")).startswith(
            RUN_SCHEMA_FAMILY):
        raise ValueError(f"{path} is not a hetspec run record (schema {RUN_SCHEMA}); "
                         "pass a file written by 'hetspec run --json'")
    return record
