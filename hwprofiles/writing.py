"""Writing output files: whole or not at all, and never through a planted path.
Run records, traces, reports, profiles and draft heads are written through it; it
imports nothing of the project but the input side's name for a special file
(``hwprofiles.reading.special_kind``), so every layer may.

Every file hetspec writes goes through ``atomic_write_bytes``: a temp file beside
the output, fsync, rename, fsync of the directory, so a reader never sees half a
file. The writer replaces only regular files: a directory, FIFO, device or socket
at the output path is refused, and so is a symbolic link that points out of its
own directory (a planted link must not redirect a write elsewhere); a link within
its directory is followed and its target replaced, the link kept. A replaced file
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
import math
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from hwprofiles.reading import special_kind


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
