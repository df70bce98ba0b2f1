"""Run folders: what a measured run writes into its folder, the next free folder
name, and the replacement of a previous run's files under ``hetspec run --force``.

A measured run's folder holds ``RUN_FILES`` (``record.json`` is written last, so
a folder with a record holds a whole run) and, once replayed, ``DERIVED_RUN_FILES``.
``--force`` replaces exactly these, record first, and only after the new run has
been measured (a failed or interrupted new run leaves the old one whole); every
other file in the folder is kept.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RUN_FILES = ("record.json", "spans.jsonl", "acceptance.jsonl", "trace.json",
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
