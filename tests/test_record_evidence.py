"""Records are evidence (issue 20, class 4): a measured run's record, spans and
acceptance trace are checked against each other, and against what a new run and
its platform allow, by the one reader every command uses
(``analyses.measured.replay.load_run`` -> ``analyses.measured.evidence``).

A tampered record is refused by ``replay`` and by ``calibrate --runs`` with the
same one sentence naming the file (and the line); the untampered record replays.
A hypothesis test tampers one field of a good run at random.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyses.measured.evidence import longest_sequence
from analyses.measured.replay import load_run
from policies.runs.measured import OP_TYPES
from hwprofiles.loader import list_names
from tests.clicases import run_cli
from tests.test_calibrate import make_measured_run

PLATFORMS = Path(__file__).resolve().parents[1] / "hwprofiles" / "data" / "platforms"


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A measured SD run on cpu-local (the synthetic executor of test_calibrate)."""
    root = tmp_path_factory.mktemp("evidence")
    make_measured_run(root / "sd-0", "sd", {"gamma": 3}, seed=4, tokens=30, noise=0.0,
                      outliers=0.0)
    return root / "sd-0"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _record(run: Path, edit) -> None:
    record = json.loads((run / "record.json").read_text())
    edit(record)
    (run / "record.json").write_text(json.dumps(record))


def _inputs(**fields):
    return lambda run: _record(run, lambda r: r["inputs"].update(fields))


def _metrics(key: str, change):
    return lambda run: _record(run, lambda r: r["metrics"].update(
        {key: change(r["metrics"][key])}))


def _first(name: str, pick, edit):
    """Edit the first line of a run file that ``pick`` selects; returns its number."""
    def apply(run: Path) -> int:
        rows = _rows(run / name)
        i = next(i for i, row in enumerate(rows) if pick(row))
        edit(rows[i])
        _write(run / name, rows)
        return i + 1
    return apply


def _forward(span) -> bool:
    return span["op"]["type"] == "Forward"


def _verify_span(span) -> bool:
    return span["op"]["type"] == "Verify"


def _drop_first(name: str, pick):
    def apply(run: Path) -> None:
        rows = _rows(run / name)
        i = next(i for i, row in enumerate(rows) if pick(row))
        _write(run / name, rows[:i] + rows[i + 1:])
    return apply


def _fifo(name: str):
    """The run's file ``name`` replaced by a pipe: refused by a stat, never opened
    (a read would block until a writer came)."""
    def apply(run: Path) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)
    return apply


def _platform_file(source: Path, name: str = "platform.yaml"):
    def apply(run: Path) -> None:
        shutil.copyfile(source, run / name)
        _inputs(platform=name)(run)
    return apply


# id -> (tampering, fragments the one sentence holds)
TAMPERED = {
    "acc_over_gamma": (_first("acceptance.jsonl", lambda d: "accepted" in d,
                              lambda d: d.update(accepted=[50])),
                       ("line 1 of", "acceptance.jsonl", "accepted 50", "of 3 gamma")),
    "platform_h100": (_inputs(platform="h100-sxm-5x"),
                      ("spans.jsonl line 1:", "'h100-sxm-5x'", "measured elsewhere")),
    "unknown_device": (_first("spans.jsonl", _forward, lambda s: s.update(device="gpu7")),
                       ("spans.jsonl line 1:", "'gpu7'", "'cpu-local'")),
    "unknown_op": (_first("spans.jsonl", _forward, lambda s: s["op"].update(type="Bogus")),
                   ("spans.jsonl line 1:", "'op.type'", "Bogus", "policies/ops.py")),
    "ntokens_1e9": (_first("spans.jsonl", _forward,
                           lambda s: s["op"].update(n_tokens=10**9)),
                    ("spans.jsonl line 1:", "op.n_tokens = 1,000,000,000")),
    "end_1e300": (_first("spans.jsonl", _verify_span, lambda s: s.update(end_s=1e300)),
                  ("spans.jsonl line", "1e+300 s", "wall time")),
    "start_negative": (_first("spans.jsonl", _forward, lambda s: s.update(start_s=-1.0)),
                       ("spans.jsonl line 1:", "starts at -1 s")),
    "forward_other_role_device": (
        _first("spans.jsonl", lambda s: _forward(s) and s["op"]["device"] == "target",
               lambda s: s.update(device="cpu1")),
        ("spans.jsonl line", "role 'target'", "'cpu1'", "'cpu0'")),
    "memory_check_maybe": (_inputs(memory_check="maybe"),
                           ("record.json:", "'inputs.memory_check'", "maybe")),
    "prefill_chunk_0": (_inputs(prefill_chunk=0), ("record.json:", "'inputs.prefill_chunk'")),
    "prompt_tokens_1e9": (_inputs(prompt_tokens=10**9),
                          ("record.json:", "'inputs.prompt_tokens'", "cap")),
    "expert_parallel": (_inputs(expert_parallel=True),
                        ("record.json:", "'inputs.expert_parallel'", "simulated what-if")),
    "weight_bits_4": (_inputs(weight_bits=4),
                      ("record.json:", "'inputs.weight_bits' = 4", "simulated what-if")),
    "placement_gpu": (_inputs(placement={"target": "gpu0"}),
                      ("record.json:", "'inputs.placement'", "gpu0")),
    "platform_etc_passwd": (_inputs(platform="/etc/passwd"),
                            ("record.json:", "'inputs.platform'", "/etc/passwd",
                             "outside the run directory")),
    "platform_unknown_name": (_inputs(platform="nope"),
                              ("record.json:", "unknown platform 'nope'")),
    "platform_file_of_h100": (_platform_file(PLATFORMS / "h100-sxm-5x.yaml"),
                              ("spans.jsonl line 1:", "'h100-sxm-5x'")),
    "spans_fifo": (_fifo("spans.jsonl"), ("spans.jsonl", "not a regular file")),
    "acceptance_fifo": (_fifo("acceptance.jsonl"), ("acceptance.jsonl", "not a regular file")),
    "record_fifo": (_fifo("record.json"), ("record.json", "not a regular file")),
    "steps_inflated": (_metrics("steps", lambda n: n + 5),
                       ("record.json:", "'metrics.steps'", "Verify lines")),
    "tokens_x10": (_metrics("tokens", lambda n: n * 10),
                   ("record.json:", "'metrics.tokens'", "committed")),
    "verify_span_dropped": (_drop_first("spans.jsonl", _verify_span),
                            ("acceptance.jsonl:", "Verify lines", "Verify operations")),
    "verify_line_dropped": (_drop_first("acceptance.jsonl", lambda d: "accepted" in d),
                            ("acceptance.jsonl:", "Verify lines", "Verify operations")),
}


def _copy(good_run: Path, root: Path, case: str) -> Path:
    run = root / "runs" / case
    shutil.copytree(good_run, run)
    TAMPERED[case][0](run)
    return run


def _one_sentence(result, *fragments: str) -> str:
    assert result.rc == 2, (result.rc, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetspec: error: "), result.err
    assert "Traceback" not in result.err and "Warning" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", TAMPERED)
def test_replay_and_calibrate_refuse_a_tampered_record_with_one_sentence(case, good_run,
                                                                        tmp_path):
    run = _copy(good_run, tmp_path, case)
    fragments = TAMPERED[case][1]
    replayed = run_cli("replay", run / "record.json", "--trace", tmp_path / "side.json")
    calibrated = run_cli("calibrate", "--profile", "cpu-local", "--runs", run.parent,
                         "-o", tmp_path / "cal.yaml")
    # one reader: the same sentence from both commands, nothing written
    assert _one_sentence(replayed, *fragments) == _one_sentence(calibrated, *fragments)
    assert not (tmp_path / "side.json").exists() and not (tmp_path / "cal.yaml").exists()


def test_the_untampered_record_replays_without_a_warning(good_run, tmp_path):
    run = tmp_path / "sd-0"
    shutil.copytree(good_run, run)
    result = run_cli("replay", run, "--trace", tmp_path / "side.json", "--json")
    assert result.rc == 0 and result.err == "", result.err
    out = json.loads(result.out)
    assert out["predicted"]["steps"] == out["measured"]["steps"]
    assert all(math.isfinite(v) for v in out["error"].values())


def test_a_profile_file_inside_the_run_folder_is_the_runs_platform(good_run, tmp_path):
    """A run on a profile file names the copy beside its record (hetspec run writes
    platform.yaml); it replays, from any working directory."""
    run = tmp_path / "sd-0"
    shutil.copytree(good_run, run)
    _platform_file(PLATFORMS / "cpu-local.yaml")(run)
    loaded = load_run(run)
    assert Path(loaded.platform) == (run / "platform.yaml").resolve()
    result = run_cli("replay", run, "--trace", tmp_path / "side.json", "--json")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["profile"] == str((run / "platform.yaml").resolve())


def test_a_moved_run_finds_its_profile_file_beside_the_record(good_run, tmp_path):
    run = tmp_path / "sd-0"
    shutil.copytree(good_run, run)
    shutil.copyfile(PLATFORMS / "cpu-local.yaml", run / "platform.yaml")
    _inputs(platform=str(tmp_path / "gone" / "platform.yaml"))(run)
    assert Path(load_run(run).platform) == (run / "platform.yaml").resolve()


def test_a_row_may_accept_its_proposal_and_a_correction_token(tmp_path):
    """The executor's own lines: a correction branch adds one token past the
    proposal; without it the same count is refused."""
    from policies.traces import TraceError, read_acceptance

    line = {"accepted": [4, 0], "gamma": 4, "proposed": [3, 4], "committed": [5, 1],
            "correction": [True, False]}
    path = tmp_path / "acceptance.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert read_acceptance(path)[0]["accepted"] == [4, 0]
    path.write_text(json.dumps({**line, "correction": [False, False]}) + "\n")
    with pytest.raises(TraceError, match="row 0 accepted 4 tokens of 3 proposed"):
        read_acceptance(path)


def test_the_longest_sequence_bounds_a_forward_by_the_runs_own_sizes():
    inputs = {"prompt_tokens": 100, "max_new_tokens": 64, "batch": 2,
              "prompts": [[{"role": "user", "content": "a"}]] * 4}
    bound = longest_sequence(inputs)
    assert 101 * 4 + 64 < bound < 10_000  # four prompts' worth, not a cap of millions


# --- hypothesis: one field of a good run tampered at random ------------------------

def _tamper_acceptance(data, run: Path, wall_s: float):
    rows = _rows(run / "acceptance.jsonl")
    i = data.draw(st.sampled_from([i for i, d in enumerate(rows) if "accepted" in d]))
    rows[i]["accepted"] = [rows[i]["gamma"] + data.draw(st.integers(1, 60))]
    _write(run / "acceptance.jsonl", rows)
    return "acceptance.jsonl", f"line {i + 1} "


def _tamper_span(data, run: Path, wall_s: float):
    rows = _rows(run / "spans.jsonl")
    forwards = [i for i, s in enumerate(rows) if _forward(s)]
    i = data.draw(st.sampled_from(forwards))
    kind = data.draw(st.sampled_from(["device", "op", "end", "nonfinite", "positions",
                                      "start"]))
    span = rows[i]
    if kind == "device":
        span["device"] = data.draw(st.sampled_from(["gpu0", "gpu7", "npu", "tp8", "ane0",
                                                   "hbm0", "link:nvlink-0-1"]))
    elif kind == "op":
        span["op"]["type"] = data.draw(st.text(min_size=1, max_size=8).filter(
            lambda t: t not in OP_TYPES))
    elif kind == "end":  # scaled past the run's wall time
        span["end_s"] = wall_s * data.draw(st.floats(2.0, 1e300)) + 1.0
    elif kind == "nonfinite":
        span[data.draw(st.sampled_from(["start_s", "end_s"]))] = data.draw(
            st.sampled_from([math.inf, -math.inf, math.nan]))
    elif kind == "positions":
        span["op"][data.draw(st.sampled_from(["n_tokens", "context"]))] = data.draw(
            st.integers(10**7, 10**15))
    else:
        span["start_s"] = -data.draw(st.floats(1e-3, 1e6))
    text = "".join(json.dumps(r) + "\n" for r in rows)  # NaN and Infinity as JSON allows
    (run / "spans.jsonl").write_text(text)
    return "spans.jsonl", f"line {i + 1}"


def _tamper_record(data, run: Path, wall_s: float):
    kind = data.draw(st.sampled_from(["platform", "steps", "tokens", "simulated"]))
    if kind == "platform":
        other = data.draw(st.sampled_from([n for n in list_names("platforms")
                                           if n != "cpu-local"]))
        _inputs(platform=other)(run)
        return "spans.jsonl", "line "
    if kind in ("steps", "tokens"):
        delta = data.draw(st.integers(1, 1000) | st.integers(-5, -1))
        _metrics(kind, lambda n: n + delta if n + delta >= 1 else n + 1)(run)
        return "record.json", f"'metrics.{kind}'"
    key, value = data.draw(st.sampled_from([("weight_bits", 8), ("kv_bits", 4),
                                            ("prefill_chunk", 16),
                                            ("expert_parallel", True)]))
    _inputs(**{key: value})(run)
    return "record.json", f"'inputs.{key}'"


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_tampering_is_refused_naming_the_file(good_run, data):
    wall_s = json.loads((good_run / "record.json").read_text())["metrics"][
        "simulated_time_s"]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "sd-0"
        shutil.copytree(good_run, run)
        load_run(run)  # the untampered copy is evidence
        tamper = data.draw(st.sampled_from([_tamper_acceptance, _tamper_span,
                                            _tamper_record]))
        name, where = tamper(data, run, wall_s)
        with pytest.raises(ValueError) as refused:
            load_run(run)
    message = str(refused.value)
    assert "\n" not in message and name in message and where in message, message
