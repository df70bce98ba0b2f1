"""The output policy: every command that writes a file or a folder passes here
before any work, and a refusal is one sentence naming the option, the path and
the fix, with nothing read or written yet.

Files (``check_outputs``): an output must name a file (not a directory, not a
path ending in '/'); it must not be any file the command reads (a profile, an
acceptance trace, a measured run's record, spans or acceptance lines, any file
of a run under ``--runs``); two outputs must not be one file; it must not lie in
hetspec's shipped data folders (``hwprofiles/data/``, ``executors/data/``); it
must not replace a file of a measured run (only ``hetspec run --force`` does);
and it must be writable (``hwprofiles.writing.check_writable``).

Folders (``check_run_dir``, ``hetspec run --out``): the same shipped-data and
input rules for every file a run writes, and a folder that is not empty (a
previous run's ``record.json`` or anything else) is refused unless ``--force``,
which replaces the run's own files only (``policies.runs.files``); the
sentence names the next free numbered folder. Default run folders are claimed
new (``policies.runs.files.claim_new_dir``) and never collide.

Temp files of killed writers are removed by the next write of the same output
(``hwprofiles.writing.atomic_write_bytes``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

from hwprofiles import ProfileError
from hwprofiles.loader import _data_dir, _resolve, printable
from hwprofiles.writing import check_writable
from policies.runs.files import DERIVED_RUN_FILES, RUN_FILES, free_name, holds_run, read_record

MAX_RUN_FILES = 10_000  # files looked at under --runs before giving up the walk
SHIPPED_PACKAGES = ("hwprofiles", "executors")  # each ships a data/ folder
SHOWN_ENTRIES = 3  # a non-empty folder's entries named in its refusal


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(outputs: Mapping[str, object], inputs: Iterable[tuple[str, Path]],
                  names: Mapping[str, str] | None = None) -> None:
    """``outputs`` maps an option (``--record``) to its path (as the user typed it)
    or None; ``inputs`` are (what, path) pairs; ``names`` maps an option to the file
    name its refusals suggest (default 'out'). ValueError with one sentence on the
    first conflict."""
    names = names or {}
    given = {label: _typed(label, raw, names.get(label, "out"))
             for label, raw in outputs.items() if raw is not None}
    inputs = [(what, Path(p)) for what, p in inputs]
    seen: dict[str, str] = {}
    for label, text in given.items():
        path = Path(text)
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{label} {path} is the same file as {seen[real]}; give each "
                             "output its own path")
        seen[real] = label
        _not_an_input(label, path, inputs)
        _not_shipped(label, path)
        _a_file(label, text, names.get(label, "out"))
        _not_a_measured_run_file(label, path)
        check_writable(path, label)


def _typed(label: str, raw, example: str) -> str:
    text = os.fspath(raw)
    if not text:
        raise ValueError(f"{label} is empty; give a file path, e.g. {example}")
    return text


def _a_file(label: str, text: str, example: str) -> None:
    """Refuse a file output that names a directory: an existing one, or a path
    ending in '/' (or '.', '..'), which ``Path`` would turn into a file of the
    directory's own name."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"{label} {text} is a directory; give a file path, e.g. "
                         f"{path / example}")
    end = os.path.basename(text)
    if end in ("", ".", ".."):
        raise ValueError(f"{label} {text} names a directory (it ends in "
                         f"'{end or os.sep}'); give a file path, e.g. {path / example}")


def check_run_dir(run_dir: Path, inputs: Iterable[tuple[str, Path]], *, force: bool,
                  label: str = "--out") -> None:
    """The folder a measured run writes ``RUN_FILES`` into: not in shipped data, not
    a file, each run file writable and none an input, and (unless ``force``) empty
    or absent. ValueError with one sentence on the first conflict."""
    run_dir = Path(run_dir)
    _not_in_shipped_data(label, run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{label} {run_dir} exists and is not a directory; give "
                         "a new or an existing directory for the run")
    inputs = [(what, Path(p)) for what, p in inputs]
    for name in RUN_FILES:
        _not_an_input(f"{label} file {name}", run_dir / name, inputs)
        check_writable(run_dir / name, label)
    if not force:
        _empty(label, run_dir)


def _empty(label: str, folder: Path) -> None:
    """Refuse a folder that is not empty: a previous run is never replaced silently."""
    try:
        entries = sorted(os.listdir(folder)) if folder.is_dir() else []
    except OSError:
        return  # unreadable: the write check above or the run says so
    if not entries:
        return
    if holds_run(folder):
        what = "already holds a run (record.json)"
    else:
        shown = ", ".join(printable(e) for e in entries[:SHOWN_ENTRIES])
        more = ", ..." if len(entries) > SHOWN_ENTRIES else ""
        what = f"is not empty (it holds {shown}{more})"
    raise ValueError(f"{label} {folder} {what}; give a new folder such as {label} "
                     f"{free_name(folder)}, or pass --force to replace the run's own files "
                     "there (other files are kept)")


def _not_an_input(label: str, path: Path, inputs: list[tuple[str, Path]]) -> None:
    for what, source in inputs:
        if _same_file(path, source):
            raise ValueError(f"{label} {path} is {what}, which this command reads; "
                             "writing it would destroy it, so choose another path")


def _not_shipped(label: str, path: Path) -> None:
    """Refuse to replace a profile hetspec ships (every command that names it, and
    the tests that pin its numbers, would silently read the new file), and to write
    anything else into the shipped data folders."""
    for kind in ("platforms", "models"):
        for shipped in _data_dir(kind).glob("*.yaml"):
            if _same_file(path, shipped):
                raise ValueError(f"{label} {path} is the shipped {kind[:-1]} profile "
                                 f"'{shipped.stem}'; write your own file elsewhere and "
                                 "pass its path where a name goes")
    _not_in_shipped_data(label, path)


def shipped_data_dirs() -> list[Path]:
    """The data folders hetspec ships (profiles, published rows, draft heads), real
    paths: whatever lies in them is read as shipped data."""
    return [Path(os.path.realpath(str(resources.files(pkg) / "data")))
            for pkg in SHIPPED_PACKAGES]


def _not_in_shipped_data(label: str, path: Path) -> None:
    real = Path(os.path.realpath(path))
    for folder in shipped_data_dirs():
        if real == folder or folder in real.parents:
            raise ValueError(f"{label} {path} lies in hetspec's shipped data folder "
                             f"{folder.parent.name}/{folder.name}, which is never written "
                             "(commands read it as shipped data); choose a path outside it")


def _not_a_measured_run_file(label: str, path: Path) -> None:
    """Refuse a file output that would replace one of a measured run's own files
    (its record, spans, acceptance lines, trace, model specs), by any name: a
    link within its folder is written through, so its target is what counts."""
    real = Path(os.path.realpath(path))
    for folder in (real.parent, real.parent.parent):
        name = real.relative_to(folder).as_posix()
        if name in RUN_FILES and _measured(folder):
            raise ValueError(f"{label} {path} is the {name} of the measured run {folder}; "
                             "write elsewhere (only 'hetspec run --out "
                             f"{folder} --force' replaces a run's files)")


def _measured(folder: Path) -> bool:
    if not holds_run(folder):
        return False
    try:
        return read_record(folder / "record.json").get("kind") == "measured"
    except ValueError:
        return False  # not a readable record: not evidence this rule keeps


def profile_inputs(**names: str | None) -> list[tuple[str, Path]]:
    """The YAML files behind --platform/--target/--draft (shipped names included)."""
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

