"""Published measurements by source: a folder of files, each row tied to one source.

A published-measurements file is a ``measurements`` list, optionally with the
source its rows come from (``source:``, one per file) or the sources they come
from (``sources:``, rows matched to them by ``url``). A source names what was
measured (hardware, software stack, device class, what it measures) and its
``role``: ``fit`` for a source some shipped profile or stack was calibrated on,
``held_out`` for one kept apart to judge them. Rows of a held-out source are
never fitted: a ``split: fit`` row there is refused, and a row that gives no
split is held out. A row takes its source's stack, device class and url unless
it gives its own; one source may have rows in several files of a folder (the
same ``id`` and ``url`` each time).

A folder (the shipped ``hwprofiles/data/published``) is read file by file in
name order; row ids are unique across the folder. A file without sources (a
user's own rows) keeps the older form: each row is its own file's, role ``fit``,
and its ``split`` decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from hwprofiles import DEFAULT_STACK
from hwprofiles.reading import YamlLoader, refuse_long_integers
from hwprofiles.loader import list_names
from hwprofiles.numbers import StrictModel

MAX_PUBLISHED_BYTES = 1_000_000  # a few hundred rows are ~100 KB

DEVICE_CLASSES = ("datacenter-gpu", "apple-unified", "jetson-edge", "phone-cpu",
                  "phone-npu", "cpu")
DeviceClass = Literal["datacenter-gpu", "apple-unified", "jetson-edge", "phone-cpu",
                      "phone-npu", "cpu"]


class Source(StrictModel):
    """Where a set of rows was printed and what it measured."""

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    stack: str = Field(min_length=1)  # the software stack the rows were measured with
    device_class: DeviceClass
    hardware: str = Field(min_length=1)
    measures: str = Field(min_length=1)
    role: Literal["fit", "held_out"]
    # other names of this source (a stack's fitted_on may name it by one of them)
    aliases: tuple[str, ...] = ()
    notes: str = ""


class SourcesOfFile(StrictModel):
    source: Source | None = None
    sources: tuple[Source, ...] = ()


def _error(path, err: ValidationError) -> ValueError:
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "the file"
    return ValueError(f"published measurements {path}: {where}: "
                      f"{e['msg'].removeprefix('Value error, ')}")


def file_sources(path, data: dict) -> tuple[Source, ...]:
    """The sources a file declares (none for the older form)."""
    head = {k: data[k] for k in ("source", "sources") if k in data}
    try:
        parsed = SourcesOfFile.model_validate(head)
    except ValidationError as err:
        raise _error(path, err) from None
    if parsed.source is not None and parsed.sources:
        raise ValueError(f"published measurements {path} gives both 'source' and "
                         "'sources'; give one source per file or a list matched by url")
    return (parsed.source,) if parsed.source is not None else parsed.sources


def _source_of(path, row: dict, sources: tuple[Source, ...]) -> Source | None:
    if not sources:
        return None
    if len(sources) == 1 and row.get("url") in (None, sources[0].url):
        return sources[0]
    matches = [s for s in sources if s.url == row.get("url")]
    if len(matches) != 1:
        raise ValueError(f"published measurements {path}: row {row.get('id')} has url "
                         f"{row.get('url')!r}, which names none of the file's sources "
                         f"({', '.join(s.url for s in sources)}); give the url of its source")
    return matches[0]


def with_source(path, row: Any, sources: tuple[Source, ...]) -> Any:
    """The row's mapping with its source's id, url, stack and device class filled
    in where it gives none, its split defaulted (held out), and a fitted row of
    a held-out source refused."""
    if not isinstance(row, dict):
        return row  # the row model refuses it in its own words
    source = _source_of(path, row, sources)
    out = dict(row)
    out.setdefault("split", "held_out")
    if source is None:
        out.setdefault("source_id", f"file:{Path(path).name}")
        return out
    for key, value in (("url", source.url), ("stack", source.stack),
                       ("device_class", source.device_class)):
        out.setdefault(key, value)
    out["source_id"] = source.id
    if source.role == "held_out" and out["split"] == "fit":
        raise ValueError(f"published measurements {path}: row {row.get('id')} is marked "
                         f"split: fit but its source {source.id} is held out, and a "
                         "held-out source is never fitted; mark the row split: held_out "
                         "or make the source's role fit")
    return out


def merge_sources(found: list[tuple[Path, Source]]) -> dict[str, Source]:
    """One source per id across files; a second declaration must agree on url and role."""
    merged: dict[str, Source] = {}
    for path, source in found:
        seen = merged.setdefault(source.id, source)
        if (seen.url, seen.role) != (source.url, source.role):
            raise ValueError(f"published measurements {path}: source {source.id} is "
                             f"declared elsewhere with url {seen.url} and role {seen.role}; "
                             "give one source one url and one role")
    return merged


def folder_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ValueError(f"published measurements folder {path} holds no .yaml file; "
                         "give a folder of measurement files or one file")
    return files


def _read(path: Path):
    if path.stat().st_size > MAX_PUBLISHED_BYTES:
        raise ValueError(f"published measurements {path} is over "
                         f"{MAX_PUBLISHED_BYTES:,} bytes; split it or give the right file")
    try:
        data = refuse_long_integers(yaml.load(path.read_text(encoding="utf-8"),
                                              Loader=YamlLoader), str(path))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"published measurements {path} is not valid YAML ({first}); "
                         "fix the syntax") from None
    if not isinstance(data, dict):
        raise ValueError(f"published measurements {path} is not a mapping; give a "
                         "'measurements' list")
    return data


def _file_rows(path: Path, found: list) -> list:
    data = _read(path)
    declared = file_sources(path, data)
    found += [(path, s) for s in declared]
    rows = data.get("measurements")
    if not isinstance(rows, list):
        return rows  # PublishedSet refuses it in its own words
    return [with_source(path, row, declared) for row in rows]


def load_rows(path, schema) -> tuple:
    """The rows of a published-measurements file, or of every file of a folder,
    validated by ``schema`` (a model with a ``measurements`` tuple); ValueError
    in one sentence."""
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise ValueError(f"published measurements {path} is not a file; give the path "
                         "of a YAML file with a 'measurements' list, or a folder of them")
    found: list = []
    if path.is_dir():
        rows: Any = []
        for file in folder_files(path):
            part = _file_rows(file, found)
            rows += part if isinstance(part, list) else [part]
    else:
        rows = _file_rows(path, found)
    merge_sources(found)
    try:
        return schema.model_validate({"measurements": rows}).measurements
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "the file"
        msg = e["msg"].removeprefix("Value error, ")
        raise ValueError(f"published measurements {path}: {where}: {msg}") from None


def load_sources(path) -> dict:
    """The sources (id -> Source) a published file or folder declares."""
    path = Path(path)
    found: list = []
    for file in (folder_files(path) if path.is_dir() else [path]):
        found += [(file, s) for s in file_sources(file, _read(file))]
    return merge_sources(found)


def shipped_stacks() -> set[str]:
    try:
        return set(list_names("stacks"))
    except (OSError, KeyError, ValueError):
        return set()


def runnable(row):
    """``row`` as it can be simulated here: a row whose stack is neither shipped
    nor a path is priced under the default stack (and returned with
    ``priced_as`` naming it, so a table can say so); otherwise ``(row, None)``."""
    if row.stack in shipped_stacks() or Path(row.stack).suffix in (".yaml", ".yml"):
        return row, None
    return row.model_copy(update={"stack": DEFAULT_STACK}), DEFAULT_STACK
