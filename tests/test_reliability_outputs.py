"""Outputs a user could point anywhere: the reliability review's simulate-out (o),
compare (c19-c24, c32), calibrate (k05-k12), replay (r53-r55) and run (x13, x14)
cases, by defect class. An output that is an input, two outputs on one file, and
an output that cannot be written are each refused with one sentence before any
work; a write that fails midway (disk full, Ctrl-C, SIGTERM) says so in one
sentence and leaves the previous file and no temp file. Every case checks that
its inputs are byte-identical with their mode, and that nothing else appeared.

Tests may run as root, where a chmod'ed directory still takes files: the
read-only case is skipped there (the /proc and parent-is-a-file cases cover a
directory that takes no files). A full disk is simulated in process: fsync raises
ENOSPC, as it does on a full filesystem.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import signal
import stat
from pathlib import Path

import pytest

from analyses import cli
from hwprofiles import loader
from tests.clicases import assert_refused, digest, run_cli
from tests.needs import HAS_TORCH
from tests.test_calibrate import make_measured_run

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PLATFORM = REPO / "hwprofiles/data/platforms/cpu-local.yaml"
SHIPPED_MODEL = REPO / "hwprofiles/data/models/smollm2-135m.yaml"


def refused(result, *fragments: str) -> None:
    assert result.rc == 2, (result.rc, result.out[-300:], result.err)
    assert_refused(result, *fragments)
    assert len(result.err.strip().splitlines()) == 1, result.err


def tree(root: Path) -> dict:
    """Every entry under root: files with content hash and mode, others by kind."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p)] = digest(p)
        else:
            out[str(p)] = stat.S_IFMT(p.lstat().st_mode)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A folder with one measured SD run (synthetic executor), never written to."""
    root = tmp_path_factory.mktemp("runs")
    make_measured_run(root / "sd-0", "sd", {"gamma": 3}, seed=4, tokens=30, noise=0.0,
                      outliers=0.0)
    return root


@pytest.fixture
def work(tmp_path, runs) -> Path:
    """A scratch folder with a platform and a model file, a copy-free view of the runs,
    and the run's acceptance lines as an acceptance trace."""
    (tmp_path / "p.yaml").write_bytes(SHIPPED_PLATFORM.read_bytes())
    (tmp_path / "m.yaml").write_bytes(SHIPPED_MODEL.read_bytes())
    (tmp_path / "acc.jsonl").write_bytes((runs / "sd-0/acceptance.jsonl").read_bytes())
    return tmp_path


def simulate(platform="cpu-local", *extra):
    return ("simulate", "--platform", platform, "--target", "smollm2-135m", "--policy",
            "ar", "--tokens", "5", *extra)


def compare(platform="cpu-local", *extra):
    return ("compare", "--platform", platform, "--target", "smollm2-135m", "--draft",
            "none", "--policies", "ar", "--tokens", "5", "--jobs", "1", *extra)


def calibrate(runs_dir, profile="cpu-local", *extra):
    # one SD run cannot tell the call overhead from the launch overhead: the sanity
    # gate would refuse the fit before the writes these cases are about
    return ("calibrate", "--runs", runs_dir, "--profile", profile, "--fit-policies", "sd",
            "--accept-poor-fit", *extra)


def replay(record, *extra):
    return ("replay", record, *extra)


def run(*extra):
    return ("run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy", "ar",
            "--max-new-tokens", "2", "--no-baseline", "--inline", *extra)


# --- D2: an output that is an input, or two outputs on one file ------------------------
# id -> (argv from (work, runs), fragments of the sentence)
SAME_FILE = {
    "o06-record-is-platform": (lambda w, r: simulate(w / "p.yaml", "--record", w / "p.yaml"),
                               ("--record", "--platform file")),
    "o07-trace-is-record": (lambda w, r: simulate("cpu-local", "--trace", w / "t.json",
                                                  "--record", w / "t.json"),
                            ("--record", "same file as --trace")),
    "o08-trace-is-acceptance-trace": (lambda w, r: ("simulate", "--platform", "cpu-local",
                                                    "--target", "smollm2-135m", "--policy",
                                                    "sd", "--set", "draft_layers=15",
                                                    "--tokens", "5", "--set",
                                                    f"trace={w / 'acc.jsonl'}",
                                                    "--trace", w / "acc.jsonl"),
                                      ("--trace", "--set trace file")),
    "simulate-trace-is-target": (lambda w, r: ("simulate", "--platform", "cpu-local",
                                               "--target", w / "m.yaml", "--policy", "ar",
                                               "--tokens", "5", "--trace", w / "m.yaml"),
                                 ("--trace", "--target file")),
    "c23-output-is-platform": (lambda w, r: compare(w / "p.yaml", "-o", w / "p.yaml"),
                               ("--output", "--platform file")),
    "compare-output-is-a-run-file": (lambda w, r: compare("cpu-local", "--runs", r, "-o",
                                                          r / "sd-0/spans.jsonl"),
                                     ("--output", "reads")),
    "k09-output-is-profile": (lambda w, r: calibrate(r, w / "p.yaml", "-o", w / "p.yaml"),
                              ("--output", "--profile file")),
    "k12-output-is-a-run-record": (lambda w, r: calibrate(r, "cpu-local", "-o",
                                                          r / "sd-0/record.json"),
                                   ("--output", "record.json", "reads")),
    "r54-trace-is-record": (lambda w, r: replay(r / "sd-0/record.json", "--trace",
                                                r / "sd-0/record.json"),
                            ("--trace", "reads")),
    "r55-trace-is-spans": (lambda w, r: replay(r / "sd-0", "--trace", r / "sd-0/spans.jsonl"),
                           ("--trace", "spans.jsonl")),
    "replay-trace-is-acceptance": (lambda w, r: replay(r / "sd-0", "--trace",
                                                       r / "sd-0/acceptance.jsonl"),
                                   ("--trace", "acceptance.jsonl")),
    "replay-trace-is-profile": (lambda w, r: replay(r / "sd-0", "--profile", w / "p.yaml",
                                                    "--trace", w / "p.yaml"),
                                ("--trace", "--profile file")),
    "replay-trace-is-a-hard-link-to-the-record": (
        lambda w, r: (os.link(r / "sd-0/record.json", w / "hard.json"),
                      replay(r / "sd-0", "--trace", w / "hard.json"))[1],
        ("--trace", "hard.json", "reads")),
    "replay-trace-is-a-link-to-the-record": (
        lambda w, r: (os.symlink("record.json", r / "sd-0/alias.json"),
                      replay(r / "sd-0", "--trace", r / "sd-0/alias.json"))[1],
        ("--trace", "alias.json", "reads")),
    "run-out-holds-the-prompts-file": (
        lambda w, r: ((w / "out").mkdir(), (w / "out/spans.jsonl").write_text(
            '[{"role": "user", "content": "hi"}]\n'),
                      run("--prompts", w / "out/spans.jsonl", "--out", w / "out"))[-1],
        ("spans.jsonl", "--prompts file")),
}


@pytest.mark.parametrize("case", SAME_FILE)
def test_an_output_that_is_an_input_is_refused_before_any_work(case, work, runs):
    make, fragments = SAME_FILE[case]
    argv = make(work, runs)
    before = {**tree(work), **tree(runs)}
    try:
        refused(run_cli(*argv), *fragments)
        assert {**tree(work), **tree(runs)} == before  # inputs byte-identical, same mode
    finally:
        (runs / "sd-0/alias.json").unlink(missing_ok=True)


def test_a_shipped_profile_named_by_name_is_an_input_too(tmp_path, monkeypatch):
    # --platform cpu-local reads the shipped file: --record onto it is refused (on a
    # copy of the data folder, so a failing test cannot damage the checkout)
    for kind, src in (("platforms", SHIPPED_PLATFORM), ("models", SHIPPED_MODEL)):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / src.name).write_bytes(src.read_bytes())
    monkeypatch.setattr(loader, "_data_dir", lambda kind: tmp_path / kind)
    before = tree(tmp_path)
    shipped = tmp_path / "platforms/cpu-local.yaml"
    refused(run_cli(*simulate("cpu-local", "--record", shipped)), "--platform file")
    refused(run_cli(*compare("cpu-local", "-o", tmp_path / "models/smollm2-135m.yaml")),
            "--target file")
    assert tree(tmp_path) == before


# --- D3a/D5/D8: outputs that cannot be written -----------------------------------------

def _directory(w: Path) -> Path:
    (w / "d").mkdir()
    return w / "d"


def _under_a_file(w: Path) -> Path:
    return w / "p.yaml" / "out.json"


def _fifo(w: Path) -> Path:
    os.mkfifo(w / "fifo")
    return w / "fifo"


def _link_out(w: Path) -> Path:
    (w / "sub").mkdir()
    os.symlink(w / "p.yaml", w / "sub" / "out.json")  # points out of sub/
    return w / "sub" / "out.json"


def _dangling_link_out(w: Path) -> Path:
    os.symlink("/nonexistent-hetspec/x.json", w / "dangling.json")
    return w / "dangling.json"


def _read_only(w: Path) -> Path:
    (w / "ro").mkdir()
    os.chmod(w / "ro", 0o555)
    if os.access(w / "ro", os.W_OK):  # root: permissions do not block writes
        pytest.skip("this user can write into a read-only directory (root)")
    return w / "ro" / "out.json"


def _proc(_w: Path) -> Path:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    return Path("/proc/hetspec-out.json")


def _char_device(w: Path) -> Path:
    """A null device of our own: as root a broken guard would replace /dev/null
    itself, so the system's one is used only where this user cannot replace it."""
    try:
        os.mknod(w / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return w / "null"
    except PermissionError:
        if os.geteuid() == 0 or os.access("/dev", os.W_OK):
            pytest.skip("cannot make a device node here, and /dev/null is not safe to use")
        return Path("/dev/null")


# kind -> (make the bad output path, fragments of the sentence)
BAD_OUTPUTS = {
    "directory": (_directory, ("is a directory",)),
    "parent-is-a-file": (_under_a_file, ("p.yaml is a file, not a directory",)),
    "fifo": (_fifo, ("FIFO", "not a regular file")),
    "char-device": (_char_device, ("null", "character device")),
    "link-out-of-its-directory": (_link_out, ("symbolic link", "outside its directory")),
    "dangling-link-out": (_dangling_link_out, ("symbolic link", "outside its directory")),
    "read-only-directory": (_read_only, ("cannot be written",)),
    "proc": (_proc, ("/proc/hetspec-out.json", "cannot be written")),
}
# the review's ids: o01 parent-is-a-file, o02 directory, o03/o04 read-only, o05 proc,
# o09 fifo; c19-c22 and c32 the same for compare; k05/k06 calibrate; r53 replay
COMMANDS = {
    "simulate-trace": lambda w, r, out: simulate("cpu-local", "--trace", out),
    "simulate-record": lambda w, r, out: simulate("cpu-local", "--record", out),
    "compare-output": lambda w, r, out: compare("cpu-local", "-o", out),
    "calibrate-output": lambda w, r, out: calibrate(r, "cpu-local", "-o", out),
    "replay-trace": lambda w, r, out: replay(r / "sd-0", "--trace", out),
}


def _restore(work: Path) -> None:
    if (work / "ro").exists():
        os.chmod(work / "ro", 0o755)


@pytest.mark.parametrize("kind", BAD_OUTPUTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_unwritable_output_is_refused_before_any_work(command, kind, work, runs):
    make, fragments = BAD_OUTPUTS[kind]
    try:
        out = make(work)
        before = {**tree(work), **tree(runs)}
        refused(run_cli(*COMMANDS[command](work, runs, out)), *fragments)
        assert {**tree(work), **tree(runs)} == before  # a device or FIFO stays one
    finally:
        _restore(work)


RUN_OUTS = {
    "x14-read-only": (_read_only, ("--out", "cannot be written")),
    "out-is-a-file": (lambda w: w / "p.yaml", ("--out", "p.yaml", "not a directory")),
    "out-under-a-file": (_under_a_file, ("--out", "p.yaml is a file")),
    "out-is-a-fifo": (_fifo, ("--out", "fifo", "not a directory")),
    "out-in-proc": (lambda w: _proc(w).with_suffix(""), ("--out", "cannot be written")),
}


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if hetspec run gets as far as the measured run (without torch
    it cannot start one)."""
    if not HAS_TORCH:
        return
    import executors.measure

    def measure(*_a, **_k):
        raise AssertionError("the measured run started before --out was checked")

    monkeypatch.setattr(executors.measure, "measure", measure)


@pytest.mark.parametrize("case", RUN_OUTS)
def test_run_checks_its_out_directory_before_the_models_load(case, work, runs, no_model_load):
    make, fragments = RUN_OUTS[case]
    try:
        out = make(work)
        before = tree(work)
        refused(run_cli(*run("--out", out)), *fragments)
        assert tree(work) == before
    finally:
        _restore(work)


@pytest.mark.torch
def test_run_creates_its_out_directory_first_and_removes_it_if_the_run_fails(
        work, monkeypatch):
    import executors.measure

    seen = {}

    def failing_measure(config, options, messages, *, out_dir, **_k):
        seen["existed"] = Path(out_dir).is_dir()
        raise ValueError("model 'x' has no local weights; stand-in failure")

    monkeypatch.setattr(executors.measure, "measure", failing_measure)
    before = tree(work)
    refused(run_cli(*run("--out", work / "a" / "b" / "run")), "stand-in")
    assert seen["existed"]
    assert tree(work) == before


# --- D3h/D13: numeric arguments refused at parsing -------------------------------------
BAD_ARGUMENTS = {
    "x13-temperature-nan": (run("--temperature", "nan"), "--temperature"),
    "temperature-inf": (run("--temperature", "inf"), "--temperature"),
    "temperature-negative": (run("--temperature", "-1"), "--temperature"),
    "temperature-overflowing": (run("--temperature", "1e-300"), "--temperature"),
    "temperature-text": (run("--temperature", "warm"), "--temperature"),
    "max-new-tokens-0": (run("--max-new-tokens", "0"), "--max-new-tokens"),
    "max-new-tokens-huge": (run("--max-new-tokens", "10000000000"), "--max-new-tokens"),
    "threads-0": (run("--threads", "0"), "--threads"),
    "c16-jobs-0": (compare("cpu-local", "--jobs", "0"), "--jobs"),
    "c17-jobs-negative": (compare("cpu-local", "--jobs", "-3"), "--jobs"),
    "jobs-text": (compare("cpu-local", "--jobs", "many"), "--jobs"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_numeric_arguments_are_refused_at_parsing(case, tmp_path, monkeypatch,
                                                      no_model_load):
    argv, option = BAD_ARGUMENTS[case]
    monkeypatch.chdir(tmp_path)
    result = run_cli(*argv)
    assert result.rc == 2
    assert "Traceback" not in result.err
    assert f"argument {option}" in result.sentence
    assert list(tmp_path.iterdir()) == []


# --- D8: a bad --prompts file is named before the models load -------------------------
BAD_PROMPTS = {
    "x01-missing": (lambda d: d / "nope.jsonl", "does not exist"),
    "x02-not-json": (lambda d: _write(d / "p.jsonl", b'[{"role": "user", "content": "hi"}]\n{'),
                     "line 2 is not JSON"),
    "x03-wrong-shape": (lambda d: _write(d / "p.jsonl", b'{"a": 1}\n'), "line 1 must be"),
    "x04-empty": (lambda d: _write(d / "p.jsonl", b"\n"), "holds no prompts"),
    "x05-binary": (lambda d: _write(d / "p.jsonl", b"\x9c\x01\xff"), "not UTF-8 text"),
    "x11-directory": (lambda d: d, "is a directory"),
}


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", BAD_PROMPTS)
def test_a_bad_prompts_file_is_one_sentence_before_the_models_load(case, tmp_path,
                                                                   no_model_load):
    make, fragment = BAD_PROMPTS[case]
    prompts = make(tmp_path)
    before = tree(tmp_path)
    refused(run_cli(*run("--prompts", prompts, "--out", tmp_path / "run")),
            "prompts", fragment)
    assert tree(tmp_path) == before


# --- D3a/D14: a write that fails midway -----------------------------------------------

def _fsync_failing_with(exc_factory):
    real = os.fsync

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise exc_factory()
        return real(fd)
    return fsync


def _disk_full():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # the CLI's handler unwinds from here
    return OSError(errno.EIO, "not reached")


FAILING_WRITES = {
    "o11-simulate-record": lambda w, r, out: simulate("cpu-local", "--record", out),
    "c24-compare-output": lambda w, r, out: compare("cpu-local", "-o", out),
    "k11-calibrate-output": lambda w, r, out: calibrate(r, "cpu-local", "-o", out),
    "replay-trace": lambda w, r, out: replay(r / "sd-0", "--trace", out),
}


@pytest.mark.parametrize("command", FAILING_WRITES)
def test_a_full_disk_is_one_sentence_and_keeps_the_previous_output(command, work, runs,
                                                                   monkeypatch):
    out = work / "out" / "previous.txt"
    out.parent.mkdir()
    out.write_text("the previous complete output\n")
    os.chmod(out, 0o640)
    before = {**tree(work), **tree(runs)}
    monkeypatch.setattr(os, "fsync", _fsync_failing_with(_disk_full))
    result = run_cli(*FAILING_WRITES[command](work, runs, out))
    refused(result, f"cannot write {out}", "No space left on device")
    assert {**tree(work), **tree(runs)} == before  # no temp file, nothing replaced


@pytest.mark.parametrize("interrupt, rc", [(KeyboardInterrupt, 130), (_sigterm, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_an_interrupted_write_leaves_no_temp_file(interrupt, rc, work, monkeypatch):
    out = work / "t.json"
    before, handler = tree(work), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(os, "fsync", _fsync_failing_with(interrupt))
    result = run_cli(*simulate("cpu-local", "--trace", out))
    assert result.rc == rc, result.err
    assert "Traceback" not in result.err
    assert tree(work) == before
    assert signal.getsignal(signal.SIGTERM) is handler  # the CLI put it back


# --- D5: what a successful write replaces ----------------------------------------------

def test_a_replaced_output_keeps_its_mode(work):
    out = work / "record.json"
    out.write_text("{}")
    os.chmod(out, 0o600)
    assert run_cli(*simulate("cpu-local", "--record", out)).rc == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert json.loads(out.read_text())["schema"] == "hetspec.run/1"


def test_a_link_within_its_directory_is_written_through(work):
    os.symlink("target.json", work / "link.json")
    assert run_cli(*simulate("cpu-local", "--trace", work / "link.json")).rc == 0
    assert (work / "link.json").is_symlink()
    assert json.loads((work / "target.json").read_text())["traceEvents"]


def test_a_killed_writers_temp_file_is_removed_by_the_next_write(work):
    from hwprofiles.writing import _temp_prefix, atomic_write_text

    out = work / "report.html"
    dead = _dead_pid()
    leftover = work / f"{_temp_prefix(out, dead)}abc123.tmp"
    live = work / f"{_temp_prefix(out, os.getpid())}def456.tmp"  # a writer at work
    leftover.write_text("half")
    live.write_text("half")
    atomic_write_text(out, "whole")
    assert out.read_text() == "whole"
    assert not leftover.exists()
    assert live.exists()


def test_a_killed_calibrations_scratch_directory_is_removed_by_the_next(tmp_path,
                                                                        monkeypatch):
    import tempfile

    from hwprofiles.writing import scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_dir("calibrate") as first:
        leftover = first.with_name(first.name.replace(f"-{os.getpid()}-",
                                                      f"-{_dead_pid()}-"))
        leftover.mkdir()
        (leftover / "calibrated.yaml").write_text("x")
    with scratch_dir("calibrate") as second:
        assert second.is_dir()
        assert not leftover.exists()
    assert list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    for pid in range(4_000_000, 4_100_000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            continue
    pytest.skip("no free process id found")


# --- D9: JSON output never holds NaN or Infinity ---------------------------------------

def test_json_output_writes_non_finite_numbers_as_null(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    cli.emit_json({"speedup": math.nan, "steps": [math.inf, 1.5], "n": {"x": -math.inf}})

    def refuse(constant):
        raise AssertionError(f"{constant} in JSON output")

    parsed = json.loads(out.getvalue(), parse_constant=refuse)
    assert parsed == {"speedup": None, "steps": [None, 1.5], "n": {"x": None}}


def test_a_run_record_never_holds_nan(tmp_path):
    from policies.runs.files import write_record

    path = write_record(tmp_path / "r.json", kind="simulated", inputs={},
                        metrics={"tokens_per_s": math.nan, "time_s": 2.0})

    def refuse(constant):
        raise AssertionError(f"{constant} in the record")

    record = json.loads(path.read_text(), parse_constant=refuse)
    assert record["metrics"] == {"tokens_per_s": None, "time_s": 2.0}


def test_a_chrome_trace_never_holds_nan(tmp_path):
    from policies.runs.files import Span, write_chrome_trace

    path = tmp_path / "trace.json"
    write_chrome_trace(path, [Span("f", "compute", "cpu0", 0.0, 1.0, float("nan")),
                              Span("g", "compute", "cpu0", 1.0, 2.0, 5.0, float("inf"))])
    events = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))
    args = [e["args"] for e in events["traceEvents"] if e["ph"] == "X"]
    assert args == [{"flops": None, "bytes": 0.0}, {"flops": 5.0, "bytes": None}]
