"""The file plumbing every layer shares: reading a user's input files and writing
output files, each checked for what the path names (a regular file, not a FIFO,
device, directory or planted link) before anything is read or written.

One module because the two halves are one policy on paths: both name a special
file the same way (``special_kind``), and the output guard refuses an output that
is one of the command's inputs. Why in hwprofiles/: it is the bottom layer, which
every runtime and analysis may import. This is file plumbing, not hardware data;
it knows nothing of runs (the run record's schema is ``policies.runs.files``) and
imports nothing of the project.

Reading a user's input files: what a path names, and integers too long to be
anyone's value.

``regular_input`` is the check every reader of a user's file passes first: a
missing path, a directory, a FIFO or a device (``/dev/null``) is named as what
it is, in one sentence with the reader's fix, instead of "does not exist" or a
hang on a pipe no one writes to.

Both also refuse a key given twice in one mapping (JSON and YAML keep the last
one in silence): ``DuplicateKey`` names it, and a YAML error names its line.
YAML merge keys (``<<: *base``) still override as YAML means them to.

JSON and YAML read an integer with Python's ``int()``, which refuses more than
4300 digits with a message that names neither the file nor the field.
``json_loads`` and ``YamlLoader`` read such an integer as a ``LongInteger``
marker instead, and ``refuse_long_integers`` names the first field holding one.

Writing output files: whole or not at all, and never through a planted path.

Every file hetspec writes (run records, traces, reports, profiles, draft heads)
goes through ``atomic_write_bytes``: a temp file beside the output, fsync,
rename, fsync of the directory, so a reader never sees half a file. The writer
replaces only regular files: a directory, FIFO, device or socket at the output
path is refused, and so is a symbolic link that points out of its own directory
(a planted link must not redirect a write elsewhere); a link within its
directory is followed and its target replaced, the link kept. A replaced file
keeps its permissions; a new one gets 0666 less the umask. Write failures are
raised as ``WriteError`` naming the path the caller gave, never the hidden temp
file, and the temp file is removed. A writer killed by SIGKILL leaves its temp
file (``.NAME.HOST-PID.XXXX.tmp`` beside NAME, or ``.NAME.PID.tmp`` from older
writers): the next write of NAME on this host removes every such file whose
writer process is gone, and never one whose writer still runs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import tempfile
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


class WriteError(OSError):
    """An output could not be written; ``filename`` is the path the caller gave."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _link_target(path: Path, label: str) -> Path:
    """A symbolic link's final target, which must lie in the link's directory."""
    try:
        target = path.resolve()
        home = path.parent.resolve()
    except (OSError, RuntimeError):
        raise ValueError(f"{label} {path} is a symbolic link that loops; remove it or "
                         "give another path") from None
    if not target.is_relative_to(home):
        raise ValueError(f"{label} {path} is a symbolic link to {target}, outside its "
                         "directory; give the target's own path or remove the link")
    return target


def output_target(path, label: str = "output") -> Path:
    """The regular file a write to ``path`` replaces (the path, or the target of a
    link within its directory); ValueError when that is not a regular file."""
    path = Path(path)
    target = _link_target(path, label) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new file (or a parent is a file)
        return target
    except OSError as exc:
        raise WriteError(exc.errno, exc.strerror, str(path)) from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{label} {path} is a directory; give a file path, e.g. "
                         f"{path / 'out'}")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{label} {path} is a {special_kind(mode)}, not a regular file; "
                         "give the path of a regular file")
    return target


def check_writable(path, label: str = "output") -> None:
    """Refuse, before any work, an output that cannot be written: a directory, a
    special file, a link out of its directory, a parent that is a file, or a
    directory this process cannot create files in (tested by creating one)."""
    path = Path(path)
    target = output_target(path, label)
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{label} {path} cannot be written: {folder} is a file, not a "
                         "directory; choose a path in a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hetspec-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{label} {path} cannot be written: {folder} does not take new "
                         f"files ({exc.strerror}); choose a writable directory") from None


_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _temp_prefix(target: Path, pid: int | str) -> str:
    return f".{target.name[:100]}.{_HOST}-{pid}."  # room for the suffix in NAME_MAX


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


def temp_prefix(target: Path, pid: int | str) -> str:
    """The start of the temp file name a writer with process id ``pid`` uses for
    ``target`` (public so that tests and fixtures can plant a killed writer's)."""
    return _temp_prefix(target, pid)


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temp files killed writers of ``target`` left beside it: this
    host's ``.NAME.HOST-PID.*.tmp`` and the older ``.NAME.PID.tmp``, each only when
    process PID is gone (a live writer's file is its own). Returns those removed."""
    removed = []
    for leftover, pid in _temps_of(target):
        if not _alive(pid):
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def _temps_of(target: Path) -> list[tuple[Path, int]]:
    """(temp file, its writer's process id) for every temp file of ``target``."""
    prefix = _temp_prefix(target, "")[:-1]  # up to the writer's process id
    found = []
    for leftover in target.parent.glob(f"{glob_escape(prefix)}*.tmp"):
        pid = leftover.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit():
            found.append((leftover, int(pid)))
    legacy = f".{target.name}."  # .NAME.PID.tmp (a whole process id, nothing else)
    for leftover in target.parent.glob(f"{glob_escape(legacy)}*.tmp"):
        pid = leftover.name[len(legacy):-len(".tmp")]
        if pid.isdigit():
            found.append((leftover, int(pid)))
    return found


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the filesystem supports it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def atomic_write_text(path, text: str) -> Path:
    """Write a text file (UTF-8) whole or not at all; see ``atomic_write_bytes``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write a file whole or not at all: a temp file beside it, fsync, rename, fsync
    of the directory. Killed writers' temp files of the same output go first. A
    replaced file keeps its mode; a new one gets what a plain open() would give
    (0666 less umask). Returns ``path`` as given."""
    path = Path(path)
    target = output_target(path)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target)
        mode = (stat.S_IMODE(target.stat().st_mode) if target.exists()
                else 0o666 & ~_umask())
        fd, tmp = tempfile.mkstemp(dir=target.parent,
                                   prefix=_temp_prefix(target, os.getpid()), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
        _fsync_dir(target.parent)
    except OSError as exc:
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def scratch_dir(purpose: str):
    """A private temporary directory, removed on exit (also on KeyboardInterrupt and,
    through the CLI's handler, SIGTERM); one a killed process left is removed by
    the next process that asks for one with the same purpose."""
    base = Path(tempfile.gettempdir())
    prefix = f"hetspec-{purpose}-{_HOST}-"
    for leftover in base.glob(f"{glob_escape(prefix)}*"):
        pid = leftover.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    try:
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def json_safe(obj):
    """``obj`` with every non-finite float replaced by None: JSON has no NaN or
    Infinity, so a quantity that is not a finite number is written as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
