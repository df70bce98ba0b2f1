"""What a measured run's files must hold, checked once when the run is loaded.

``hetspec run`` writes ``record.json`` (inputs, metrics, and the names of its
``spans.jsonl`` and ``acceptance.jsonl`` beside it) through the measured-run
schema (``policies.runs.measured``), which also reads them back: the record by
its schema's version, every span line into a ``MeasuredSpan``. A record or
spans file that is not what the executor writes (a hand edit, a truncated copy,
a file from elsewhere) is refused there with one sentence naming the file, the
field (and the span's line) and that the run is corrupt, instead of failing
deep inside a replay or a fit. Here, on top: the record's parameters are the
schedule's own, and the files a record names lie inside its run directory.
"""

from __future__ import annotations

from pathlib import Path

from policies import PolicyError, parse_params
from policies.runs.files import file_in_run
from policies.runs.measured import CORRUPT, check_measured_record


def check_record(record: dict, path: Path) -> dict:
    """The record itself, once its schema's reader took it and its parameters are
    ones its schedule takes."""
    check_measured_record(record, path)
    inputs = record["inputs"]
    try:  # the schedule it ran, with parameters that schedule takes
        parse_params(inputs["policy"], inputs.get("params", {}))
    except PolicyError as exc:
        raise ValueError(f"run record {path}: field 'inputs.params': {exc}, "
                         f"{CORRUPT}") from None
    return record


def run_file(run_dir: Path, name: str, field: str, record_path: Path) -> Path:
    """The file a record's ``field`` names inside its run directory
    (policies.runs.files.file_in_run); outside it, the record is corrupt."""
    return file_in_run(run_dir, name, field, record_path, CORRUPT)
