"""A measured run's files checked against each other: the record is evidence.

The measured-run schema (``policies.runs.measured``, with ``runrecord``) checks
each file on its own (types, ranges, names inside the run directory); here the files of one run must tell one story, or the run is refused
before a replay or a fit believes it. Every reader of measured runs (``hetspec
replay``, ``calibrate --runs``, ``compare --runs``) passes through
``check_evidence`` (``analyses.measured.replay.load_run`` calls it):

- inputs: validate as the ``RunConfig`` a new run would be validated by, and hold
  none of the simulated-only options ``hetspec run`` refuses (``SIMULATED_ONLY``);
- platform: a shipped platform, or a profile file inside the run directory (the
  ``platform.yaml`` a run on a profile file writes beside its record), never any
  other file on the machine;
- spans: each on a device, group, memory tier or link of that platform, each
  Forward on the device the platform (and the run's placement) gives its role;
  times from 0 to the run's measured wall time (plus what the executor drains
  after its clock stops); a Forward's positions within what the run's prompts
  and tokens could make;
- acceptance: one Verify line per timed Verify and per step the metrics count;
  the tokens the metrics count are the ones the lines committed. (Each line's
  rows accept at most what they proposed: ``policies.traces.VerifyLine``.)

A refusal is one sentence naming the file, the line or field, and what is wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import ValidationError

from analyses.run.config import RunConfig
from hwprofiles import Platform, load_platform
from hwprofiles.loader import list_names
from hwprofiles.schema import check_overrides, resolve
from policies.runs.measured import CORRUPT, MeasuredSpan
from policies.runs.metrics import elapsed_s
from policies.traces import MAX_ACCEPTED, field_error

# The executor stops its clock when the last row is done, then drains the work in
# flight (executors/session/decode.py): a span may end a little after the wall time.
DRAIN_SHARE = 0.5  # of the wall time
CLOCK_SLACK_S = 0.1
# The widest pass a schedule feeds beyond its sequence: a speculation tree's nodes
# (policies/tree.py MAX_NODES).
MAX_TREE_POSITIONS = 1024
# Tracks a span may sit on that are no platform part: the host's own waits, and
# the storage a device without a storage tier streams from (executors/coordinate).
HOST_TRACKS = ("host", "storage")
# Run options only the simulator models: the executor runs the checkpoint at its
# own precision and sharding, and prefills the prompt in one pass; a measured run
# recording them would claim what it did not measure ('hetspec run' refuses them,
# and a record holding one is refused).
SIMULATED_ONLY = ("weight_bits", "kv_bits", "compute_bits", "prefill_chunk",
                  "expert_parallel")
PLATFORM_FILE = "platform.yaml"  # what hetspec run writes beside a record run on a file


def refuse(where: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {problem}, {CORRUPT}")


# --- the platform ---------------------------------------------------------------------

def run_platform(record: dict, path: Path) -> str:
    """The platform a record names, as ``load_platform`` takes it: a shipped name,
    or the path of a profile file inside the run directory (a moved run's file is
    found beside its record by name); any other name or file is refused."""
    name = str(record["inputs"]["platform"])
    if name in list_names("platforms"):
        return name
    run_dir, given = path.parent.resolve(), Path(name)
    for candidate in (run_dir / given, run_dir / given.name):
        try:
            if candidate.resolve().is_relative_to(run_dir) and candidate.is_file():
                return str(candidate.resolve())
        except (OSError, RuntimeError, ValueError):  # a link loop, a NUL in the name
            continue
    if given.is_absolute() or len(given.parts) > 1 or given.suffix in (".yaml", ".yml"):
        problem = (f"names the file {name}, which is no shipped platform and lies outside "
                   f"the run directory {path.parent}")
    else:
        problem = (f"names an unknown platform '{name}' (no shipped platform, no file "
                   f"in the run directory {path.parent})")
    raise refuse(str(path), f"field 'inputs.platform' {problem}; a measured record names a "
                 f"shipped platform or the {PLATFORM_FILE} its run wrote beside it")


def tracks(platform: Platform, physical: dict) -> set[str]:
    """Every name a span of a run on ``platform`` may sit on."""
    names = {d.name for d in platform.devices} | {g.name for g in platform.groups}
    names |= {t.name for t in platform.memory_tiers}
    names |= {f"link:{link.name}" for link in platform.links}
    return names | set(HOST_TRACKS) | {str(v) for v in physical.values()}


# --- the inputs -----------------------------------------------------------------------

def check_inputs(inputs: dict, path: Path) -> None:
    """The record's inputs validate as a new run's configuration would, and hold no
    option only the simulator models."""
    fields = {k: v for k, v in inputs.items()
              if k in RunConfig.model_fields and k != "acceptance"}  # the run's own trace
    try:
        RunConfig.model_validate(fields)
    except ValidationError as exc:
        problem = field_error(exc).replace("field '", "field 'inputs.", 1)
        raise refuse(str(path), problem) from None
    for key in SIMULATED_ONLY:
        if inputs.get(key) not in (None, False):
            raise refuse(str(path), f"field 'inputs.{key}' = {inputs[key]!r} is a simulated "
                         "what-if 'hetspec run' refuses (the executor runs the checkpoint "
                         "at its own precision, one prefill pass, no expert sharding), so "
                         "the run cannot have measured it")


# --- the spans ------------------------------------------------------------------------

def longest_sequence(inputs: dict) -> int:
    """The most positions a row of the run could reach: its longest prompt (at most
    the mean the record keeps times the number of prompts), its tokens, a step's
    acceptance past the budget, and a tree's nodes."""
    prompts = inputs.get("prompts")
    n_prompts = len(prompts) if isinstance(prompts, list) and prompts else 1
    rows = max(n_prompts, inputs.get("batch") or 1)
    prompt = ((inputs.get("prompt_tokens") or 0) + 1) * rows
    tokens = inputs.get("max_new_tokens") or inputs.get("tokens") or 0
    return prompt + tokens + MAX_ACCEPTED + MAX_TREE_POSITIONS


def _span_device(span: MeasuredSpan, n: int, where: str, platform: Platform, known: set[str],
                 placement: dict) -> None:
    device = span.device
    if device and device not in known:
        raise refuse(f"{where} line {n}", f"the span ran on '{device}', which is no "
                     f"device, group, memory tier or link of platform '{platform.name}' "
                     "(the record's inputs.platform), so the spans were measured elsewhere "
                     "(a record retargeted to other hardware is no measurement of it)")
    op = span.op
    if device and op["type"] == "Forward" and op.get("device"):
        expected = placement[op["device"]]
        if device != expected:
            raise refuse(f"{where} line {n}", f"a Forward of role '{op['device']}' ran on "
                         f"'{device}', but platform '{platform.name}' with the run's "
                         f"placement puts that role on '{expected}'")


def _span_times(span: MeasuredSpan, n: int, where: str, wall_s: float | None) -> None:
    start, end = span.start_s, span.end_s
    if start < 0:
        raise refuse(f"{where} line {n}", f"the span starts at {start:.6g} s, before the "
                     "run's clock started")
    if wall_s is not None and end > wall_s * (1 + DRAIN_SHARE) + CLOCK_SLACK_S:
        raise refuse(f"{where} line {n}", f"the span ends at {end:.6g} s, after the run's "
                     f"measured wall time of {wall_s:.6g} s")


def _span_positions(span: MeasuredSpan, n: int, where: str, limit: int) -> None:
    op = span.op
    if op["type"] != "Forward":
        return
    for key in ("n_tokens", "n_fed", "context", "context_measured"):
        value = op.get(key)
        if isinstance(value, int) and value > limit:
            raise refuse(f"{where} line {n}", f"a Forward with op.{key} = {value:,} "
                         f"positions, more than the {limit:,} a row of this run could hold "
                         "(its prompts, its tokens and a step's speculation)")


def check_spans(run, platform: Platform) -> None:
    """Every span on the platform's hardware, in the run's time, of a plausible size."""
    inputs, where = run.inputs, str(run.spans_path)
    known = tracks(platform, inputs.get("physical") or {})
    try:
        check_overrides(platform, inputs.get("placement") or {})
    except ValueError as exc:
        raise refuse(str(run.path), f"field 'inputs.placement': {exc}") from None
    placement = resolve(platform, inputs.get("placement"))
    for role, name in (inputs.get("physical") or {}).items():
        if role not in placement:
            placement[role] = name
    wall_s = elapsed_s(run.metrics)
    wall_s = wall_s if isinstance(wall_s, (int, float)) and math.isfinite(wall_s) else None
    limit = longest_sequence(inputs)
    for n, span in zip(run.span_lines, run.spans):
        _span_device(span, n, where, platform, known, placement)
        _span_times(span, n, where, wall_s)
        _span_positions(span, n, where, limit)


# --- the acceptance trace -------------------------------------------------------------

def check_acceptance(run) -> None:
    """Steps, Verify spans and Verify lines agree; the tokens the metrics count are
    the tokens the lines committed."""
    if run.acceptance_path is None:
        return
    acc = str(run.acceptance_path)
    verifies = [(n, d) for n, d in zip(run.line_numbers, run.lines) if "accepted" in d]
    if not verifies:
        return
    timed = sum(s.type == "Verify" for s in run.spans)
    if timed and timed != len(verifies):
        raise refuse(acc, f"it holds {len(verifies)} Verify lines but {run.spans_path} "
                     f"times {timed} Verify operations (one step writes one of each), so "
                     "the two files are not of one run")
    steps = run.metrics["steps"]
    if steps != len(verifies):
        raise refuse(f"{run.path}", f"field 'metrics.steps' = {steps} but {acc} holds "
                     f"{len(verifies)} Verify lines (one a step)")
    committed = sum(_committed(d) for _, d in verifies)
    tokens = run.metrics["tokens"]
    if tokens != committed:
        raise refuse(f"{run.path}", f"field 'metrics.tokens' = {tokens} but the Verify lines "
                     f"of {acc} committed {committed} tokens")


def _committed(line: dict) -> int:
    """Tokens a Verify line committed: its ``committed`` rows, or (a line without
    them) each row's accepted tokens and the bonus (``policies.ops.Verdict``)."""
    if line.get("committed") is not None:
        return sum(line["committed"])
    return sum(line["accepted"]) + len(line["accepted"])


def check_evidence(run) -> None:
    """The cross-checks of the module doc, in the order a reader meets the files."""
    check_inputs(run.inputs, run.path)
    platform = load_platform(run.platform)
    check_spans(run, platform)
    check_acceptance(run)


def contended_text(metrics: dict) -> str:
    """A sentence when the run was measured on a machine busy with other work."""
    machine = metrics.get("machine") or {}
    if not machine.get("contended"):
        return ""
    loads = [x for x in (machine.get("load_1m_before"), machine.get("load_1m_after"))
             if x is not None]
    return (f"measured on a busy machine (load average up to {max(loads):.1f} on "
            f"{machine['cores']} cores, {machine['threads']} for this run): its absolute "
            "speeds are lower than an idle machine's; its speedup, from interleaved "
            "rounds, is the figure to compare")
