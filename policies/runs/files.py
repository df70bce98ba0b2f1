"""A run's files, simulated or measured: its spans, its record and its folder.

- ``Span``: one operation on one track (what ran, where, when, what it moved), the
  span every timeline is made of, and its Chrome trace-event (Perfetto) export.
- The run record: every run's inputs and outputs in one JSON file (schema
  ``hetspec.run/1``), written whole or not at all through ``hwprofiles.writing``
  and read back with one-sentence errors; its ``metrics`` are
  ``policies.runs.metrics``'.
- The run folder: what a measured run writes into it (``RUN_FILES``; ``record.json``
  is written last, so a folder with a record holds a whole run) and, once replayed,
  ``DERIVED_RUN_FILES``; the next free folder name; and the replacement of a
  previous run's files under ``hetspec run --force``, which replaces exactly these,
  record first, and only after the new run has been measured (a failed or
  interrupted new run leaves the old one whole); every other file in the folder is
  kept.

One module because these are one format: the record names its spans and trace
files, the folder is the record's and those files' home, and every reader of a
run (replay, calibration, the output guard) reads them together.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import time
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from hwprofiles import jsonin
from hwprofiles.writing import atomic_write_text, json_safe
from policies.runs.config import RunSettings


class Span(NamedTuple):
    """One operation on one track: what ran, where, when, and what it moved."""

    name: str
    kind: str  # compute | collective | transfer | stream | delay
    device: str
    start_s: float
    end_s: float
    flops: float = 0.0
    nbytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def chrome_trace(spans, *, process: str = "hetspec", metadata: dict | None = None) -> dict:
    """Spans as a Chrome trace-event document: one thread per device/link."""
    tracks = sorted({s.device for s in spans})
    tid = {name: i + 1 for i, name in enumerate(tracks)}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
               "args": {"name": process}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid[t],
                "args": {"name": t}} for t in tracks]
    for s in spans:
        events.append({"ph": "X", "name": s.name, "cat": s.kind, "pid": 1,
                       "tid": tid[s.device], "ts": s.start_s * 1e6,
                       "dur": (s.end_s - s.start_s) * 1e6,
                       "args": {"flops": s.flops, "bytes": s.nbytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": metadata or {}}


def write_chrome_trace(path, spans, **kwargs) -> None:
    """Write the trace; a non-finite number (JSON has none) is written as null."""
    doc = chrome_trace(spans, **kwargs)
    try:
        text = json.dumps(doc, allow_nan=False)
    except ValueError:  # rare: walk the document only when it holds NaN or infinity
        text = json.dumps(json_safe(doc), allow_nan=False)
    atomic_write_text(path, text)


# The run record.

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


def read_record(path) -> dict:
    """A run record's JSON object, of any version of the run schema (the reader of
    a measured run reads it by its version: ``policies.runs.measured``); one-sentence
    ValueError when the file is not one (``hwprofiles.jsonin`` reads it, as every
    JSON input)."""
    path = Path(path)
    fix = "pass the record.json that 'hetspec run' wrote"
    record = jsonin.read_json(path, "run record", fix, MAX_RECORD_BYTES)
    if not isinstance(record, dict) or not str(record.get("schema", "")).startswith(
            RUN_SCHEMA_FAMILY):
        raise ValueError(f"{path} is not a hetspec run record (schema {RUN_SCHEMA}); "
                         "pass a file written by 'hetspec run --json'")
    return record


# The run folder.

RUN_FILES = ("record.json", "spans.jsonl", "acceptance.jsonl", "trace.json",
             "baseline-spans.jsonl",
             "models/target.yaml", "models/draft.yaml",
             "platform.yaml")  # what a measured run writes (a profile file it ran on)
# Files other commands write into a measured run's folder: replay's default trace.
DERIVED_RUN_FILES = ("replay-trace.json",)
MAX_NUMBERED = 10_000  # numbered names tried before giving up


def default_run_dir(policy: str, seed: int) -> Path:
    """The folder a run without ``--out`` is claimed at (``claim_new_dir``)."""
    return Path("runs") / f"{policy}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run record (a measured run, or the start of one)."""
    return (Path(folder) / "record.json").is_file()


def numbered(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}-{n}")


def free_name(path: Path) -> Path:
    """``path`` itself when nothing is there, else the first free ``path-2``,
    ``path-3``, ...: the name to suggest instead of an occupied folder."""
    path = Path(path)
    if not os.path.lexists(path):
        return path
    for n in range(2, MAX_NUMBERED):
        if not os.path.lexists(numbered(path, n)):
            return numbered(path, n)
    return numbered(path, os.getpid())


def claim_new_dir(path: Path) -> Path:
    """Create a new, empty folder at ``path`` or, where that exists, at the first
    free numbered name, and return it. ``mkdir`` either creates a folder or fails,
    so two processes claiming the same name at once get two folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for candidate in [path] + [numbered(path, n) for n in range(2, MAX_NUMBERED)]:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    candidate = numbered(path, os.getpid())
    candidate.mkdir()
    return candidate


def retire_run(folder: Path) -> list[Path]:
    """Remove a previous run's own files from ``folder`` (record first, so the folder
    never claims a run whose other files are gone), then its ``models/`` folder if
    that is left empty; other files stay. Returns the files removed."""
    folder = Path(folder)
    removed = []
    for name in RUN_FILES + DERIVED_RUN_FILES:
        path = folder / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path)
    try:
        (folder / "models").rmdir()
    except OSError:
        pass  # absent, or holding files of the user's
    return removed


def file_in_run(run_dir: Path, name: str, field: str, record_path: Path,
                why: str = "so the run is corrupt") -> Path:
    """The file a run record's ``field`` names, which must lie inside the run
    directory (a relative name without '..'; no link out of it); ValueError
    naming the field otherwise."""
    rel = Path(name)
    try:
        inside = (run_dir / rel).resolve().is_relative_to(run_dir.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if rel.is_absolute() or ".." in rel.parts or not inside:
        raise ValueError(f"run record {record_path}: field '{field}' = '{name}' points "
                         f"outside the run directory {run_dir}, {why}")
    return run_dir / rel
