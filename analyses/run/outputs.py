"""The output guard every command that writes files calls before any work.

An output must not be any file the command reads (a profile, an acceptance trace,
a measured run's record, spans or acceptance lines, any file of a run under
``--runs``), two outputs must not be one file, and each output must be writable
(``policies.runs.records.check_writable``). A refusal is one sentence naming the
option, the path and the fix, and nothing has been read or written yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from policies.runs.records import check_writable, read_record

# Files a command writes into a measured run's directory itself; overwriting a
# previous one is expected (replay's default side-by-side trace).
DERIVED_RUN_FILES = frozenset({"replay-trace.json"})
MAX_RUN_FILES = 10_000  # files looked at under --runs before giving up the walk


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(outputs: Mapping[str, object], inputs: Iterable[tuple[str, Path]]) -> None:
    """``outputs`` maps an option (``--record``) to its path or None; ``inputs`` are
    (what, path) pairs. ValueError with one sentence on the first conflict."""
    given = {label: Path(p) for label, p in outputs.items() if p is not None}
    inputs = [(what, Path(p)) for what, p in inputs]
    seen: dict[str, str] = {}
    for label, path in given.items():
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{label} {path} is the same file as {seen[real]}; give each "
                             "output its own path")
        seen[real] = label
        for what, source in inputs:
            if _same_file(path, source):
                raise ValueError(f"{label} {path} is {what}, which this command reads; "
                                 "writing it would destroy it, so choose another path")
        _not_shipped(label, path)
        check_writable(path, label)


def _not_shipped(label: str, path: Path) -> None:
    """Refuse to replace a profile hetspec ships: every command that names it (and
    the tests that pin its numbers) would silently read the new file."""
    from hwprofiles.loader import _data_dir

    for kind in ("platforms", "models"):
        for shipped in _data_dir(kind).glob("*.yaml"):
            if _same_file(path, shipped):
                raise ValueError(f"{label} {path} is the shipped {kind[:-1]} profile "
                                 f"'{shipped.stem}'; write your own file elsewhere and "
                                 "pass its path where a name goes")


def profile_inputs(**names: str | None) -> list[tuple[str, Path]]:
    """The YAML files behind --platform/--target/--draft (shipped names included)."""
    from hwprofiles import ProfileError
    from hwprofiles.loader import _resolve

    out = []
    for option, name in names.items():
        if not name or str(name).lower() == "none":
            continue
        kind = "platforms" if option in ("platform", "profile") else "models"
        try:
            out.append((f"the --{option} file", _resolve(kind, name)))
        except ProfileError:
            continue  # loading it later says what is wrong
    return out


def set_inputs(sets: Mapping[str, object]) -> list[tuple[str, Path]]:
    """Files named by --set values (trace=, omega_trace=, hit_trace=, ...)."""
    return [(f"the --set {key} file", Path(value)) for key, value in sets.items()
            if isinstance(value, str) and value and Path(value).exists()]


def run_inputs(record_path) -> list[tuple[str, Path]]:
    """Every file of the measured run ``record_path`` belongs to: its directory's
    files (record, spans, acceptance lines, trace, models) and the profile files
    its inputs name."""
    record_path = Path(record_path)
    if record_path.is_dir():
        record_path = record_path / "record.json"
    run_dir = record_path.parent
    out = [(f"a file of the measured run {run_dir}", p)
           for p in _files(run_dir) if p.name not in DERIVED_RUN_FILES]
    out.append(("the run record", record_path))
    out += _record_named(record_path)
    return out


def runs_inputs(runs_dir) -> list[tuple[str, Path]]:
    """The files of every measured run under --runs."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    out = []
    for record in sorted(runs_dir.rglob("record.json"))[:MAX_RUN_FILES]:
        out += run_inputs(record)
    return out


def _files(folder: Path) -> list[Path]:
    found = []
    for root, _dirs, names in os.walk(folder):
        found += [Path(root) / n for n in names]
        if len(found) > MAX_RUN_FILES:
            break
    return found


def _record_named(record_path: Path) -> list[tuple[str, Path]]:
    """Files a record's fields name (spans, acceptance, trace, profiles)."""
    try:
        record = read_record(record_path)  # size-capped; a dict with the run schema
    except ValueError:
        return []  # reading the run later says what is wrong
    out = [(f"the run's {field} file", record_path.parent / record[field])
           for field in ("spans", "acceptance_trace", "trace")
           if isinstance(record.get(field), str) and record[field]]
    inputs = record.get("inputs")
    if isinstance(inputs, dict):
        names = {k: inputs.get(k) for k in ("platform", "target", "draft")
                 if isinstance(inputs.get(k), str)}
        out += profile_inputs(**names)
    return out

