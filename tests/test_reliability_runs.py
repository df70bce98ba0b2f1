"""Acceptance traces and measured runs a user could hand hetspec, malformed or
hostile: the reliability review's simulate-trace (t), replay (r) and
calibrate-runs (k) cases and the defect classes around them. Each is refused
with one sentence naming the file and the line or field, exit status 2, no
traceback, within a deadline, leaving every input as it was and no output
behind. A hypothesis fuzz test feeds random acceptance traces to a simulation.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies import entry
from policies.traces import MAX_ACCEPTED, MAX_GAMMA, MAX_TRACE_BYTES
from tests.clicases import assert_refused, digest, run_cli
from tests.test_calibrate import make_measured_run

SIMULATE = ("simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
            "--tokens", "50", "--policy", "sd", "--set", "draft_layers=15")
BINARY = bytes(range(256)) * 4


def snapshot(root: Path) -> dict:
    """Every file under ``root`` (or ``root`` itself) with its content hash and mode."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): digest(p) for p in files}


def refused(result, *fragments: str) -> None:
    assert result.rc == 2, (result.rc, result.err)
    assert_refused(result, *fragments)
    assert len(result.err.strip().splitlines()) == 1, result.err


# --- acceptance traces (--set trace=FILE): t00-t13 and their class -------------------

def _lines(*lines) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


OK = '{"accepted": [2], "gamma": 4}'
# id -> (file content, or a directory / a missing path; fragments of the sentence)
TRACES = {
    "t00-missing": (None, ("does not exist",)),
    "t01-directory": ("dir", ("is a directory",)),
    "t02-truncated": (_lines(OK, '{"accepted": [1,'), ("line 2", "is not JSON")),
    "t03-empty-accepted": (_lines(OK, OK, '{"accepted": []}'), ("line 3", "'accepted'")),
    "t04-string": (_lines('{"accepted": ["a"]}'), ("line 1", "accepted.0")),
    "t05-not-a-list": (_lines('{"accepted": 3}'), ("line 1", "'accepted'")),
    "t06-list-line": (_lines("[1, 2]"), ("line 1", "not a JSON object")),
    "t07-no-verify-lines": (_lines('{"event": "reuse", "held": [true]}'),
                            ("holds no Verify lines",)),
    "t07-neither": (_lines(OK, '{"gamma": 4}'), ("line 2", "neither 'accepted'")),
    "t08-negative": (_lines(OK, '{"accepted": [-3]}'), ("line 2", "accepted.0")),
    "t09-nan": (_lines('{"accepted": [NaN]}'), ("line 1", "accepted.0")),
    "t10-1e400": (_lines('{"accepted": [1e400]}'), ("line 1", "accepted.0")),
    "t11-empty-file": (b"", ("holds no Verify lines",)),
    "t12-null-line": (_lines(OK, "null"), ("line 2", "not a JSON object")),
    "t13-binary": (BINARY, ("not UTF-8",)),
    "null-accepted": (_lines('{"accepted": null}'), ("line 1", "'accepted'")),
    "bool": (_lines('{"accepted": [true]}'), ("line 1", "accepted.0")),
    "float": (_lines('{"accepted": [1.0]}'), ("line 1", "accepted.0")),
    "beyond-any-gamma": (_lines('{"accepted": [66]}'), ("line 1", "more than the 65")),
    "huge-int": (_lines('{"accepted": [%d]}' % 10**30), ("line 1", "more than the 65")),
    "4000-digits": (_lines('{"accepted": [%s]}' % ("9" * 5000)), ("line 1",)),
    "nested": (_lines("[" * 100_000 + "]" * 100_000), ("line 1", "nests deeper than")),
    "unknown-field": (_lines('{"accepted": [1], "zzz": 1}'), ("line 1", "'zzz'")),
    "gamma-string": (_lines('{"accepted": [1], "gamma": "4"}'), ("line 1", "'gamma'")),
    "event-without-held": (_lines(OK, '{"event": "reuse"}'), ("line 2", "'held'")),
    "held-null": (_lines('{"event": "reuse", "held": null}'), ("line 1", "'held'")),
    "both-kinds": (_lines('{"accepted": [1], "event": "reuse"}'), ("line 1", "'event'")),
    "prompt-batch-negative": (_lines('{"accepted": [1], "prompt_batch": -1}'),
                              ("line 1", "prompt_batch")),
    "blank-lines-counted": (_lines(OK, "", "  ", "{"), ("line 4",)),
    "oversized": ("big", ("MiB",)),
}


def _make_trace(tmp_path: Path, content) -> Path:
    path = tmp_path / "acceptance.jsonl"
    if content == "dir":
        path.mkdir()
    elif content == "big":  # sparse: the limit is checked before anything is read
        with open(path, "wb") as fh:
            fh.truncate(MAX_TRACE_BYTES + 1)
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", TRACES)
def test_a_malformed_acceptance_trace_is_refused_naming_its_line(case, tmp_path):
    content, fragments = TRACES[case]
    trace = _make_trace(tmp_path, content)
    before = snapshot(tmp_path)
    out = tmp_path / "out.json"
    result = run_cli(*SIMULATE, "--set", f"trace={trace}", "--record", out)
    refused(result, "acceptance", *fragments)
    assert snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("case", ["t02-truncated", "event-without-held", "t13-binary",
                                  "t01-directory", "held-null"])
@pytest.mark.parametrize("policy,key", [("mirror", "omega_trace"), ("ssd", "hit_trace")])
def test_a_malformed_event_trace_is_refused_naming_its_line(case, policy, key, tmp_path):
    content, fragments = TRACES[case]
    trace = _make_trace(tmp_path, content)
    before = snapshot(tmp_path)
    result = run_cli("simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--tokens", "50", "--policy", policy, "--draft", "smollm2-135m",
                     "--set", f"{key}={trace}")
    refused(result, key, *fragments)
    assert snapshot(tmp_path) == before


def test_the_executors_own_lines_are_accepted(tmp_path, capsys):
    """Verify and Outcome lines exactly as executors/coordinate/coordinator.py writes them,
    with the prompt batch the run adds, and an old one-bool Outcome line."""
    verify = {"accepted": [3, 0], "gamma": 4, "proposed": [4, 4], "committed": [4, 1],
              "bonus_rank": [0, None], "margin": [1.5, float("nan")], "branch": 0,
              "correction": [False, True], "topk_hit": [True, False], "prompt_batch": 1}
    lines = [verify, {"event": "reuse", "held": [True, False], "prompt_batch": 1},
             {"event": "reuse", "held": True}, {"accepted": [MAX_ACCEPTED]}]
    trace = tmp_path / "acceptance.jsonl"
    trace.write_text("".join(json.dumps(d) + "\n" for d in lines))
    result = run_cli(*SIMULATE, "--set", f"trace={trace}", "--json")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["steps"] > 0


def test_the_accepted_bound_covers_every_policys_proposal():
    """MAX_ACCEPTED is the largest proposal a policy's parameters allow plus one."""
    from policies import names

    bounds = [meta.le for name in names()
              for field in ("gamma", "k") if field in entry(name).params.model_fields
              for meta in entry(name).params.model_fields[field].metadata
              if getattr(meta, "le", None) is not None]
    assert bounds and max(bounds) == MAX_GAMMA == MAX_ACCEPTED - 1


@pytest.mark.parametrize("value,fragments", [
    ("histogram=nan,1", ("probs", "finite")),      # s35
    ("histogram=inf,1", ("probs", "finite")),      # s36
    ("alphas=nan,0.5", ("alphas",)),               # s37
    ("histogram=1e308,1e308", ("probs", "finite sum")),
    ("alphas=0.5,inf", ("alphas",)),
    ("alpha=nan", ("alpha",)),
])
def test_non_finite_acceptance_numbers_are_refused_by_field(value, fragments):
    refused(run_cli(*SIMULATE, "--set", value), *fragments)


# --- measured runs: the r and k cases, by what is corrupt ----------------------------

@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A measured SD run (synthetic executor, tests/test_calibrate.py)."""
    root = tmp_path_factory.mktemp("good")
    make_measured_run(root / "sd-0", "sd", {"gamma": 3}, seed=4, tokens=30, noise=0.0,
                      outliers=0.0)
    return root / "sd-0"


def _json(path: Path):
    return json.loads(path.read_text())


def _record(edit):
    def apply(run: Path) -> None:
        record = _json(run / "record.json")
        edit(record)
        (run / "record.json").write_text(json.dumps(record))
    return apply


def _set(*keys_value):
    *keys, value = keys_value

    def edit(record):
        obj = record
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value
    return _record(edit)


def _drop(*keys):
    def edit(record):
        obj = record
        for k in keys[:-1]:
            obj = obj[k]
        del obj[keys[-1]]
    return _record(edit)


def _text(name: str, text: str | bytes, keep: int | None = None):
    """Write file ``name`` of the run (or cut it to its first ``keep`` bytes)."""
    def apply(run: Path) -> None:
        path = run / name
        if keep is not None:
            path.write_bytes(path.read_bytes()[:keep])
        else:
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return apply


def _cut(name: str, n: int):
    """Cut a JSON-lines file of the run in the middle of line ``n``."""
    def apply(run: Path) -> None:
        lines = (run / name).read_text().splitlines()
        (run / name).write_text("".join(line + "\n" for line in lines[:n - 1])
                                + lines[n - 1][:len(lines[n - 1]) // 2])
    return apply


def _line(name: str, n: int, edit):
    """Edit line ``n`` (1-based) of a JSON-lines file of the run; ``edit`` gets the
    object and returns what to write (an object, or raw text)."""
    def apply(run: Path) -> None:
        lines = (run / name).read_text().splitlines()
        new = edit(json.loads(lines[n - 1]))
        lines[n - 1] = new if isinstance(new, str) else json.dumps(new)
        (run / name).write_text("\n".join(lines) + "\n")
    return apply


def _span(n: int, **fields):
    def edit(span):
        for key, value in fields.items():
            if key.startswith("op_"):
                span["op"][key[3:]] = value
            else:
                span[key] = value
        return span
    return _line("spans.jsonl", n, edit)


def _outside(field: str, name: str):
    """Point ``field`` at a file beside the run directory, not inside it."""
    def apply(run: Path) -> None:
        (run.parent / "elsewhere.jsonl").write_text('{"accepted": [1]}\n')
        _set(field, name)(run)
    return apply


def _symlink_out(run: Path) -> None:
    (run.parent / "elsewhere.jsonl").write_text((run / "spans.jsonl").read_text())
    (run / "spans.jsonl").unlink()
    os.symlink(run.parent / "elsewhere.jsonl", run / "spans.jsonl")


def _without_op_field(field: str):
    def edit(span):
        del span["op"][field]
        return span
    return edit


def _symlink_loop(run: Path) -> None:
    (run / "spans.jsonl").unlink()
    os.symlink(run / "spans.jsonl", run / "spans.jsonl")


def _dir_spans(run: Path) -> None:
    (run / "sub").mkdir()
    _set("spans", "sub")(run)


def _sparse(name: str, size: int):
    def apply(run: Path) -> None:
        with open(run / name, "wb") as fh:
            fh.truncate(size)
    return apply


# id -> (edit of a good run, fragments of the sentence). Ids after the review's
# cases' fixture names (r/k cases); the rest widen each class.
RUNS = {
    # the record itself (r00-r02, r18-r20, r32, r33, k20-k22, k33, k34, k37, k38)
    "trunc_record": (_text("record.json", "", keep=200), ("record.json", "is not JSON")),
    "empty_record": (_text("record.json", ""), ("record.json", "is empty")),
    "record_list": (_text("record.json", "[]"), ("record.json", "not a hetspec run record")),
    "binary_record": (_text("record.json", BINARY), ("record.json", "not UTF-8")),
    "huge_record": (_sparse("record.json", 50 * 2**20), ("record.json", "MiB")),
    "schema_wrong": (_set("schema", "other.run/1"), ("not a hetspec run record",)),
    "schema_version": (_set("schema", "hetspec.run/0"), ("schema 'hetspec.run/0'",
                                                         "record the run again")),
    "kind_sim": (_set("kind", "simulated"), ("simulated record",)),
    "no_inputs": (_drop("inputs"), ("record.json", "'inputs'", "corrupt")),
    "inputs_list": (_set("inputs", []), ("record.json", "'inputs'", "corrupt")),
    "metrics_str": (_set("metrics", "x"), ("record.json", "'metrics'", "corrupt")),
    # inputs and metrics (r13-r17, r21-r26, r34, k31, k32)
    "platform_int": (_set("inputs", "platform", 5), ("record.json", "inputs.platform")),
    "platform_missing": (_drop("inputs", "platform"), ("record.json", "inputs.platform")),
    "platform_unknown": (_set("inputs", "platform", "nope"), ("unknown platform 'nope'",)),
    "target_unknown": (_set("inputs", "target", "nope"), ("unknown model 'nope'",)),
    "policy_unknown": (_set("inputs", "policy", "nope"), ("inputs.params",
                                                          "unknown policy 'nope'")),
    "params_bad": (_set("inputs", "params", {"gamma": 0}), ("inputs.params", "'gamma'")),
    "params_unknown": (_set("inputs", "params", {"zeta": 1}), ("inputs.params", "'zeta'")),
    "params_list": (_set("inputs", "params", []), ("record.json", "inputs.params")),
    "batch_zero": (_set("inputs", "batch", 0), ("record.json", "inputs.batch")),
    "batch_bool": (_set("inputs", "batch", True), ("record.json", "inputs.batch")),
    "tokens_str": (_set("metrics", "tokens", "x"), ("record.json", "metrics.tokens")),
    "max_new_neg": (_set("inputs", "max_new_tokens", -5), ("inputs.max_new_tokens",)),
    "steps_zero": (_set("metrics", "steps", 0), ("record.json", "metrics.steps")),
    "tokens_per_s_nan": (_set("metrics", "tokens_per_s", math.nan),
                         ("record.json", "metrics.tokens_per_s")),
    "latency_missing": (_drop("metrics", "step_latency_s"), ("metrics.step_latency_s",)),
    # the files a record names, confined to its run directory (r04-r07, k24-k27)
    "spans_int": (_set("spans", 5), ("record.json", "'spans'")),
    "spans_abs": (_set("spans", "/etc/passwd"), ("'spans'", "outside the run directory")),
    "spans_dotdot": (_outside("spans", "../elsewhere.jsonl"),
                     ("'spans'", "outside the run directory")),
    "spans_symlink_out": (_symlink_out, ("'spans'", "outside the run directory")),
    "spans_symlink_loop": (_symlink_loop, ("'spans'", "outside the run directory")),
    "acc_abs": (_set("acceptance_trace", "/etc/passwd"),
                ("'acceptance_trace'", "outside the run directory")),
    "acc_dotdot": (_outside("acceptance_trace", "../elsewhere.jsonl"),
                   ("'acceptance_trace'", "outside the run directory")),
    "spans_dir": (_dir_spans, ("spans file", "is a directory")),
    "spans_missing": (_set("spans", "nope.jsonl"), ("spans file", "does not exist")),
    "acc_missing": (_set("acceptance_trace", "nope.jsonl"), ("acceptance", "does not exist")),
    # spans (r03, r08-r12, r35-r37, k23, k28-k30, k39, k40)
    "trunc_spans": (_cut("spans.jsonl", 2), ("line 2", "spans.jsonl")),
    "spans_empty": (_text("spans.jsonl", ""), ("spans.jsonl", "holds no spans")),
    "spans_binary": (_text("spans.jsonl", BINARY), ("spans.jsonl", "not UTF-8")),
    "spans_huge": (_sparse("spans.jsonl", 65 * 2**20), ("spans.jsonl", "MiB")),
    "spans_nonobj": (_line("spans.jsonl", 3, lambda s: "[1, 2]"),
                     ("line 3", "not a JSON object")),
    "end_before_start": (_span(4, end_s=0.0, start_s=1.0), ("line 4", "before it starts")),
    "nan_start": (_span(2, start_s=math.nan), ("line 2", "start_s")),
    "inf_end": (_span(2, end_s=math.inf), ("line 2", "end_s")),
    "start_str": (_span(2, start_s="0"), ("line 2", "start_s")),
    "layers_oob": (_span(1, op_layers=[0, 999]), ("layers [0, 999]",)),
    "layers_str": (_span(1, op_layers="ab"), ("line 1", "op.layers")),
    "layers_backwards": (_span(1, op_layers=[20, 3]), ("line 1", "backwards")),
    "layers_float": (_span(1, op_layers=[0, 30.0]), ("line 1", "op.layers.1")),
    "prompt_batch_mixed": (_span(2, prompt_batch="1"), ("line 2", "prompt_batch")),
    "op_no_type": (_line("spans.jsonl", 1, _without_op_field("type")), ("line 1", "op.type")),
    "op_str": (_span(1, op="Forward"), ("line 1", "'op'")),
    "forward_without_model": (_line("spans.jsonl", 1, _without_op_field("model")),
                              ("line 1", "needs 'model'")),
    "transfer_nbytes_neg": (_span(4, op_nbytes=-12), ("line 4", "op.nbytes")),
    "device_mixed": (_span(2, device=3), ("line 2", "device")),
    "span_extra_key": (_span(2, zzz=1), ("line 2", "zzz")),
    # the acceptance file (r27-r31, k35, k36)
    "acc_trunc": (_cut("acceptance.jsonl", 3), ("line 3", "acceptance.jsonl")),
    "acc_emptylist": (_line("acceptance.jsonl", 2, lambda d: {**d, "accepted": []}),
                      ("line 2", "'accepted'")),
    "acc_str": (_line("acceptance.jsonl", 1, lambda d: {**d, "accepted": ["a"]}),
                ("line 1", "accepted.0")),
    "acc_negative": (_line("acceptance.jsonl", 1, lambda d: {**d, "accepted": [-1]}),
                     ("line 1", "accepted.0")),
    "acc_event_noheld": (_line("acceptance.jsonl", 3, lambda d: {"event": "reuse"}),
                         ("line 3", "'held'")),
    "acc_binary": (_text("acceptance.jsonl", BINARY), ("acceptance.jsonl", "not UTF-8")),
}


def _corrupt_copy(good_run: Path, tmp_path: Path, case: str) -> Path:
    run = tmp_path / "runs" / case
    shutil.copytree(good_run, run)
    RUNS[case][0](run)
    return run


@pytest.mark.parametrize("case", RUNS)
def test_replay_refuses_a_corrupt_run_naming_the_field(case, good_run, tmp_path):
    run = _corrupt_copy(good_run, tmp_path, case)
    before, out = snapshot(tmp_path / "runs"), tmp_path / "side.json"
    result = run_cli("replay", run / "record.json", "--trace", out)
    refused(result, *RUNS[case][1])
    assert snapshot(tmp_path / "runs") == before and not out.exists()


# Cases another check of calibrate answers first, with its own sentence.
CALIBRATE_OWN = {"platform_unknown", "target_unknown", "layers_oob"}


@pytest.mark.parametrize("case", RUNS)
def test_calibrate_refuses_a_corrupt_run_naming_the_field(case, good_run, tmp_path):
    run = _corrupt_copy(good_run, tmp_path, case)
    before, out = snapshot(tmp_path / "runs"), tmp_path / "calibrated.yaml"
    result = run_cli("calibrate", "--runs", run.parent, "--profile", "cpu-local", "-o", out)
    refused(result, *(() if case in CALIBRATE_OWN else RUNS[case][1]))
    assert snapshot(tmp_path / "runs") == before and not out.exists()


@pytest.mark.parametrize("case", ["acc_emptylist", "acc_str", "nan_start", "spans_abs",
                                  "tokens_str"])
def test_compare_refuses_a_corrupt_run_before_any_report(case, good_run, tmp_path):
    """c27 and its class: ``compare --runs`` loads the runs as replay does."""
    run = _corrupt_copy(good_run, tmp_path, case)
    before, out = snapshot(tmp_path / "runs"), tmp_path / "c.html"
    result = run_cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "none", "--policies", "ar,sd", "--set", "draft_layers=15",
                     "--sweep", "gamma=2..3", "--tokens", "50", "--jobs", "1",
                     "--runs", run.parent, "-o", out)
    refused(result, *RUNS[case][1])
    assert snapshot(tmp_path / "runs") == before and not out.exists()


def _inf_profile(tmp_path: Path) -> Path:
    text = (Path(__file__).parents[1] / "hwprofiles/data/platforms/cpu-local.yaml").read_text()
    path = tmp_path / "inf_bw.yaml"
    path.write_text(text.replace("bandwidth_gb_s: 34.2", "bandwidth_gb_s: .inf"))
    return path


@pytest.mark.parametrize("case", ["r50-missing", "r51-directory-without-record",
                                  "r52-unknown-profile", "r56-inf-profile",
                                  "r57-model-as-profile", "r58-binary-record"])
def test_replay_refuses_a_bad_argument(case, good_run, tmp_path):
    args = {"r50-missing": (tmp_path / "nope" / "record.json",),
            "r51-directory-without-record": (tmp_path,),
            "r52-unknown-profile": (good_run, "--profile", "nope"),
            "r56-inf-profile": (good_run, "--profile", _inf_profile(tmp_path)),
            "r57-model-as-profile": (good_run, "--profile", Path(__file__).parents[1]
                                     / "hwprofiles/data/models/smollm2-135m.yaml"),
            "r58-binary-record": (tmp_path / "junk.bin",)}[case]
    (tmp_path / "junk.bin").write_bytes(BINARY)
    before, out = snapshot(good_run), tmp_path / "side.json"
    result = run_cli("replay", *args, "--trace", out)
    refused(result)
    assert snapshot(good_run) == before and not out.exists()


def test_a_good_run_still_replays_and_calibrates(good_run, tmp_path):
    run = tmp_path / "runs" / "sd-0"
    shutil.copytree(good_run, run)
    result = run_cli("replay", run, "--trace", tmp_path / "side.json", "--json")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["predicted"]["steps"] == _json(run / "record.json")[
        "metrics"]["steps"]  # its own 13 recorded steps, read whole


# --- fuzz: random acceptance traces -------------------------------------------------

# A row accepts at most its gamma (policies/traces.py VerifyLine).
GOOD_VERIFY = st.integers(0, MAX_GAMMA).flatmap(lambda gamma: st.builds(
    lambda acc, batch: {"accepted": acc, "gamma": gamma, "prompt_batch": batch},
    st.lists(st.integers(0, gamma), min_size=1, max_size=4), st.integers(0, 3)))
GOOD_EVENT = st.builds(lambda name, held: {"event": name, "held": held},
                       st.sampled_from(["reuse", "cache_hit"]),
                       st.booleans() | st.lists(st.booleans(), min_size=1, max_size=4))
BAD_COUNT = (st.none() | st.booleans() | st.text(max_size=3)
             | st.floats(allow_nan=True, allow_infinity=True)
             | st.integers(max_value=-1) | st.integers(min_value=MAX_ACCEPTED + 1))
BAD_ACCEPTED = (st.just([]) | BAD_COUNT | st.lists(BAD_COUNT, min_size=1, max_size=3)
                | st.lists(st.integers(0, 3), min_size=1).map(lambda v: v + [None]))
BAD_LINE = st.one_of(
    BAD_ACCEPTED.map(lambda v: {"accepted": v}),
    st.sampled_from([None, "yes", [], 1, [1]]).map(lambda h: {"event": "reuse", "held": h}),
    st.just({"event": "reuse"}), st.just({"gamma": 4}),
    GOOD_VERIFY.map(lambda d: {**d, "zzz": 0}),
    GOOD_VERIFY.map(lambda d: {**d, "gamma": -1}),
    GOOD_VERIFY.map(lambda d: {**d, "accepted": [d["gamma"] + 1]}),  # beyond its gamma
)


@st.composite
def trace_lines(draw) -> tuple[list[str], bool]:
    """(line text, whether the line is valid) of one kind; Verify lines weigh most,
    so that a good part of the traces simulate."""
    kind = draw(st.sampled_from(["verify"] * 6 + ["event", "blank", "bad", "truncated",
                                                 "junk", "not-object"]))
    if kind == "verify":
        return json.dumps(draw(GOOD_VERIFY)), True
    if kind == "event":
        return json.dumps(draw(GOOD_EVENT)), True
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t", "\r"])), True
    if kind == "bad":
        return json.dumps(draw(BAD_LINE)), False
    if kind == "truncated":
        text = json.dumps(draw(GOOD_VERIFY | GOOD_EVENT))
        return text[:draw(st.integers(1, len(text) - 1))], False
    if kind == "junk":
        return "x" + draw(st.text(st.characters(blacklist_characters="\n",
                                                blacklist_categories=("Cs",)), max_size=12)), False
    return json.dumps(draw(st.none() | st.integers() | st.text(max_size=4)
                           | st.lists(st.integers(), max_size=3))), False


@settings(max_examples=400, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(trace_lines(), max_size=8))
def test_fuzzed_acceptance_traces_simulate_or_are_refused_naming_the_line(lines):
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "acceptance.jsonl"
        trace.write_text("".join(text + "\n" for text, _ in lines))
        before = digest(trace)
        result = run_cli("simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
                         "--tokens", "20", "--policy", "sd", "--set", "draft_layers=15",
                         "--set", f"trace={trace}", "--json")
        assert digest(trace) == before
    bad = [n for n, (_, ok) in enumerate(lines, 1) if not ok]
    has_steps = any(text.lstrip().startswith('{"accepted"') for text, ok in lines if ok)
    event("refused: a bad line" if bad else "refused: no Verify line" if not has_steps
          else "simulated")
    if bad:
        refused(result, f"line {bad[0]} of")
    elif not has_steps:
        refused(result, "holds no Verify lines")
    else:
        assert result.rc == 0, result.err
        metrics = json.loads(result.out)
        for key in ("tokens_per_s", "step_latency_s", "mean_tokens_per_step"):
            assert math.isfinite(metrics[key]) and metrics[key] > 0, (key, metrics)
