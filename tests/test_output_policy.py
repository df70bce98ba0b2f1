"""The output policy (issue 20, class 1), for files and folders alike:

- nothing is written in hetspec's shipped data folders (``hwprofiles/data/``,
  ``executors/data/``), by any command, whatever path reaches them;
- a run folder that is not empty is refused without ``--force``, in one sentence
  naming the folder, ``--force`` and the next free numbered name; ``--force``
  replaces the previous run's own files only, and only once the new run is
  measured; a file output never replaces a measured run's own files; default run
  folders never collide;
- a file output that names a directory (existing, or ending in '/', '.', '..') is
  refused instead of writing a file of the directory's name;
- the next write of an output removes its killed writers' temp files, never a live
  writer's, and two writers at once each leave a whole file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.run import outputs as policy
from analyses.run.outputs import check_outputs, check_run_dir
from policies.runs import files as run_files
from policies.runs.files import claim_new_dir, free_name, retire_run
from hwprofiles.writing import atomic_write_bytes, atomic_write_text, remove_stale_temps, temp_prefix
from tests.clicases import assert_refused, digest, run_cli
from tests.test_calibrate import make_measured_run
from tests.hangguard import HANG_S
from tests.needs import HAS_TORCH

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "hwprofiles" / "data"
DRAFTS_DATA = REPO / "executors" / "data"
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000, "torch_dtype": "bfloat16"}
DEAD_PID = 99_999_999  # above any Linux pid_max: never a live process


def refused(result, *fragments: str) -> None:
    assert result.rc == 2, (result.rc, result.out[-300:], result.err)
    assert_refused(result, *fragments)
    assert len(result.err.strip().splitlines()) == 1, result.err


def shipped_state(folders=None) -> dict:
    """Every path in the (stand-in) shipped data folders with its content hash."""
    folders = folders or policy.shipped_data_dirs()
    return {str(p): digest(p) if p.is_file() else "dir"
            for folder in folders for p in sorted(folder.rglob("*"))}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """Copies standing in for the shipped data folders (hwprofiles/data, executors/data),
    so that a broken rule cannot damage the checkout; a training or measured run
    that starts fails the test (without torch none can start)."""
    import shutil

    hw, ex = (tmp_path / "pkg" / pkg / "data" for pkg in ("hwprofiles", "executors"))
    shutil.copytree(DATA, hw)
    ex.mkdir(parents=True)
    (ex / "smollm2-135m-drafts.safetensors").write_bytes(b"stand-in artifact")
    monkeypatch.setattr(policy, "shipped_data_dirs", lambda: [hw.resolve(), ex.resolve()])

    def started(*_a, **_k):
        raise AssertionError("the command started its work before refusing the output")

    if HAS_TORCH:
        import executors.measure
        import executors.train.distil

        monkeypatch.setattr(executors.train.distil, "train", started)
        monkeypatch.setattr(executors.measure, "measure", started)
    return hw, ex


def test_the_shipped_data_folders_are_the_packages_own():
    assert policy.shipped_data_dirs() == [DATA.resolve(), DRAFTS_DATA.resolve()]


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): digest(p) if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def config(tmp_path) -> Path:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(LLAMA))
    return tmp_path / "ckpt" / "config.json"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """One measured SD run (synthetic executor); tests copy it before writing."""
    root = tmp_path_factory.mktemp("measured")
    make_measured_run(root / "sd-0", "sd", {"gamma": 3}, seed=4, tokens=30, noise=0.0,
                      outliers=0.0)
    return root / "sd-0"


@pytest.fixture
def run_copy(tmp_path, measured) -> Path:
    import shutil

    shutil.copytree(measured, tmp_path / "good")
    return tmp_path / "good"


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


def simulate(*extra):
    return ("simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy",
            "ar", "--tokens", "5", *extra)


def compare(*extra):
    return ("compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft",
            "none", "--policies", "ar", "--tokens", "5", "--jobs", "1", *extra)


def run(*extra):
    return ("run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy", "ar",
            "--max-new-tokens", "2", "--no-baseline", "--inline", *extra)


# --- never in the shipped data folders ---------------------------------------------------
# command -> argv for an output path in a shipped data folder
FILE_COMMANDS = {
    "simulate --record": lambda out, w: simulate("--record", out),
    "simulate --trace": lambda out, w: simulate("--trace", out),
    "compare -o": lambda out, w: compare("-o", out),
    "calibrate --published -o": lambda out, w: ("calibrate", "--published", "shipped",
                                                "--profile", "a100-sxm-8x", "-o", out),
    "calibrate --runs -o": lambda out, w: ("calibrate", "--runs", w["runs"], "--profile",
                                           "cpu-local", "-o", out),
    "profiles import -o": lambda out, w: ("profiles", "import", w["config"], "-o", out),
    "replay --trace": lambda out, w: ("replay", w["run"], "--trace", out),
    "train-draft -o": lambda out, w: ("train-draft", "-o", out),
}
# where -> output path from (hwprofiles/data, executors/data)
SHIPPED_OUTPUTS = {
    "new file in platforms": lambda hw, ex: hw / "platforms" / "new.yaml",
    "new file in published": lambda hw, ex: hw / "published" / "extra.yaml",
    "new file at the top": lambda hw, ex: hw / "notes.txt",
    "new sub-folder": lambda hw, ex: hw / "mine" / "out.json",
    "a .. detour": lambda hw, ex: hw / ".." / "data" / "models" / "x.yaml",
    "the draft heads": lambda hw, ex: ex / "smollm2-135m-drafts.safetensors",
}


@pytest.mark.parametrize("where", SHIPPED_OUTPUTS)
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_no_command_writes_in_the_shipped_data_folders(command, where, config, run_copy,
                                                       shipped):
    before = shipped_state()
    argv = FILE_COMMANDS[command](SHIPPED_OUTPUTS[where](*shipped), {
        "config": config, "runs": run_copy.parent, "run": run_copy})
    refused(run_cli(*argv), "shipped data folder")
    assert shipped_state() == before


def test_a_link_into_the_shipped_data_is_followed_and_refused(tmp_path, shipped):
    os.symlink(shipped[0], tmp_path / "alias")
    before = shipped_state()
    refused(run_cli(*simulate("--record", tmp_path / "alias" / "r.json")),
            "shipped data folder hwprofiles/data")
    assert shipped_state() == before


RUN_OUTS = {"platforms": lambda hw, ex: hw / "platforms",
            "a new folder": lambda hw, ex: hw / "new-run",
            "the folder itself": lambda hw, ex: hw,
            "the draft heads' folder": lambda hw, ex: ex,
            "a .. detour": lambda hw, ex: hw / "models" / ".." / "published"}


@pytest.mark.parametrize("out", RUN_OUTS)
@pytest.mark.parametrize("force", [(), ("--force",)])
def test_run_never_writes_in_the_shipped_data_even_with_force(out, force, shipped):
    before = shipped_state()
    refused(run_cli(*run("--out", RUN_OUTS[out](*shipped), *force)),
            "--out", "shipped data folder")
    assert shipped_state() == before


# --- run folders ---------------------------------------------------------------------
def test_a_folder_holding_a_run_is_refused_naming_force_and_the_next_free_name(
        run_copy, no_model_load):
    before = tree(run_copy.parent)
    refused(run_cli(*run("--out", run_copy)),
            f"--out {run_copy} already holds a run", "--force", f"--out {run_copy}-2")
    (run_copy.parent / "good-2").mkdir()
    refused(run_cli(*run("--out", f"{run_copy}/")), f"--out {run_copy}-3")
    assert tree(run_copy.parent) == {**before, "good-2": "dir"}


def test_a_folder_holding_other_files_is_refused_and_names_them(tmp_path, no_model_load):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    refused(run_cli(*run("--out", tmp_path / "out")),
            "is not empty (it holds notes.txt)", "--force", f"{tmp_path / 'out'}-2")


@pytest.mark.torch
def test_an_empty_existing_folder_is_taken(tmp_path, monkeypatch):
    import executors.measure

    seen = {}
    monkeypatch.setattr(executors.measure, "measure", _recording_measure(seen))
    (tmp_path / "empty").mkdir()
    assert run_cli(*run("--out", tmp_path / "empty")).rc == 0
    assert seen == {"out_dir": tmp_path / "empty", "replace": False}


def _recording_measure(seen: dict, files: dict | None = None):
    """A stand-in for executors.measure.measure: notes where it writes and whether
    it replaces, writes ``files`` there, and returns the metrics hetspec run prints."""
    def measure(config, options, messages, *, out_dir, replace=False, **_k):
        seen.update(out_dir=Path(out_dir), replace=replace)
        for name, text in (files or {}).items():
            atomic_write_text(Path(out_dir) / name, text)
        return {"tokens_per_s": 1.0, "mean_tokens_per_step": 1.0, "step_latency_s": 1.0,
                "run_record": str(Path(out_dir) / "record.json")}
    return measure


@pytest.mark.torch
def test_force_passes_replace_and_keeps_the_old_run_until_the_new_one_is_measured(
        run_copy, monkeypatch):
    import executors.measure

    old = tree(run_copy)

    def failing(config, options, messages, *, out_dir, replace=False, **_k):
        assert replace and tree(Path(out_dir)) == old  # nothing removed up front
        raise ValueError("stand-in failure of the new run")

    monkeypatch.setattr(executors.measure, "measure", failing)
    refused(run_cli(*run("--out", run_copy, "--force")), "stand-in")
    assert tree(run_copy) == old  # a failed forced run leaves the old one whole


def test_retire_run_removes_the_runs_own_files_only(run_copy):
    (run_copy / "notes.txt").write_text("mine")
    (run_copy / "models").mkdir()
    (run_copy / "models" / "target.yaml").write_text("name: t\n")
    (run_copy / "models" / "mine.yaml").write_text("name: mine\n")
    (run_copy / "replay-trace.json").write_text("{}")
    (run_copy / "baseline-spans.jsonl").write_text("")
    removed = retire_run(run_copy)
    assert removed[0] == run_copy / "record.json"  # first: never a record without spans
    assert sorted(p.name for p in removed) == sorted(
        ["record.json", "spans.jsonl", "acceptance.jsonl", "trace.json", "target.yaml",
         "replay-trace.json", "baseline-spans.jsonl"])
    assert tree(run_copy) == {"notes.txt": digest(run_copy / "notes.txt"), "models": "dir",
                              "models/mine.yaml": digest(run_copy / "models/mine.yaml")}


@pytest.mark.torch
def test_default_run_folders_never_collide(tmp_path, monkeypatch):
    import executors.measure

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_files.time, "strftime", lambda _fmt: "20261126-120000")
    seen: list[Path] = []

    def measure(config, options, messages, *, out_dir, **_k):
        seen.append(Path(out_dir))
        assert Path(out_dir).is_dir() and not any(Path(out_dir).iterdir())
        atomic_write_text(Path(out_dir) / "record.json", "{}")
        return {"tokens_per_s": 1.0, "mean_tokens_per_step": 1.0, "step_latency_s": 1.0,
                "run_record": str(Path(out_dir) / "record.json")}

    monkeypatch.setattr(executors.measure, "measure", measure)
    for _ in range(3):  # three runs in the same second
        assert run_cli(*run()).rc == 0
    base = Path("runs") / "ar-seed0-20261126-120000"
    assert seen == [base, Path(f"{base}-2"), Path(f"{base}-3")]


def test_claiming_folders_at_once_gives_each_claimant_its_own(tmp_path):
    got: list[Path] = []
    lock = threading.Lock()

    def claim():
        path = claim_new_dir(tmp_path / "runs" / "same")
        with lock:
            got.append(path)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 8 and all(p.is_dir() for p in got)


def test_a_file_output_never_replaces_a_measured_runs_own_files(run_copy):
    before = tree(run_copy)
    for name in ("record.json", "trace.json", "spans.jsonl"):
        refused(run_cli(*simulate("--record", run_copy / name)),
                f"is the {name} of the measured run {run_copy}", "--force")
    refused(run_cli(*compare("-o", run_copy / "acceptance.jsonl")), "measured run")
    os.symlink("record.json", run_copy / "alias.json")  # written through: the record
    before = tree(run_copy)
    refused(run_cli(*simulate("--record", run_copy / "alias.json")),
            "is the record.json of the measured run")
    assert tree(run_copy) == before
    # a new file beside the run, and a simulated record, are the user's to replace
    assert run_cli(*simulate("--record", run_copy / "sim.json")).rc == 0
    assert run_cli(*simulate("--record", run_copy.parent / "s" / "record.json")).rc == 0
    assert run_cli(*simulate("--record", run_copy.parent / "s" / "record.json")).rc == 0


@pytest.mark.slow
def test_force_replaces_a_real_run_and_keeps_other_files(tmp_path):
    """End to end with a tiny random-weight model: --force replaces the previous
    run's files, keeps the user's, and the new record is whole."""
    spec = tmp_path / "tiny.yaml"
    sizes = {"n_layers": 4, "hidden": 64, "ffn": 128, "n_heads": 4, "n_kv_heads": 2,
             "head_dim": 16, "vocab": 48}
    spec.write_text(json.dumps({"name": "tiny", **sizes, "dtype": "fp32",
                                "hf_architecture": "LlamaForCausalLM",
                                "sources": {k: "test fixture" for k in sizes}}))
    argv = ("run", "--platform", "cpu-local", "--target", f"random:{spec}", "--policy",
            "sd", "--set", "gamma=2", "--set", "draft_layers=2", "--max-new-tokens", "4",
            "--no-baseline", "--inline", "--out", tmp_path / "r")
    assert run_cli(*argv).rc == 0
    first = json.loads((tmp_path / "r" / "record.json").read_text())
    (tmp_path / "r" / "notes.txt").write_text("mine")
    refused(run_cli(*argv), "already holds a run", "--force")
    assert run_cli(*argv, "--seed", "1", "--force").rc == 0
    second = json.loads((tmp_path / "r" / "record.json").read_text())
    assert (first["inputs"]["seed"], second["inputs"]["seed"]) == (0, 1)
    assert (tmp_path / "r" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        ["record.json", "spans.jsonl", "acceptance.jsonl", "trace.json", "notes.txt"])


# --- a file output that names a directory ----------------------------------------------
DIRECTORY_FORMS = {"trailing slash": "newdir/", "trailing /.": "newdir/.",
                   "trailing /..": "newdir/..", "dot": ".", "empty": ""}


@pytest.mark.parametrize("form", DIRECTORY_FORMS)
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_a_file_output_naming_a_directory_is_refused(command, form, config, run_copy,
                                                     tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    argv = FILE_COMMANDS[command](DIRECTORY_FORMS[form], {
        "config": config, "runs": run_copy.parent, "run": run_copy})
    result = run_cli(*argv)
    refused(result, "give a file path, e.g.")
    assert tree(tmp_path) == before  # no file named 'newdir', nothing at all


def test_profiles_import_into_newdir_slash_is_refused_naming_the_file_to_give(config,
                                                                           tmp_path):
    result = run_cli("profiles", "import", config, "-o", tmp_path / "newdir", "--name",
                     "mine")
    assert result.rc == 0  # a plain name is a file
    result = run_cli("profiles", "import", config, "-o", f"{tmp_path}/other/")
    refused(result, f"-o {tmp_path}/other/ names a directory",
            f"e.g. {tmp_path}/other/ckpt.yaml")
    assert not (tmp_path / "other").exists()


# --- killed writers' temp files ---------------------------------------------------------
def test_the_next_write_removes_killed_writers_temp_files_of_both_forms(tmp_path):
    out = tmp_path / "out.html"
    stale = [tmp_path / f"{temp_prefix(out, DEAD_PID)}abc.tmp",
             tmp_path / f".out.html.{DEAD_PID}.tmp"]
    kept = [tmp_path / f"{temp_prefix(out, os.getpid())}live.tmp",  # a writer at work
            tmp_path / f".out.html.{os.getpid()}.tmp",
            tmp_path / f".other.html.{DEAD_PID}.tmp",  # another output's
            tmp_path / ".out.html.notapid.tmp"]
    for p in stale + kept:
        p.write_text("half")
    atomic_write_text(out, "whole")
    assert out.read_text() == "whole"
    assert [p.exists() for p in stale] == [False, False]
    assert all(p.exists() for p in kept)


def _writer_script(target: Path, size: int, hold: bool) -> str:
    """A process writing ``size`` bytes to ``target`` atomically; with ``hold`` it
    stops for good before the rename (to be killed there)."""
    return (
        "import os, sys, time\n"
        "from hwprofiles import writing as files\n"
        f"hold = {hold!r}\n"
        "real = os.fsync\n"
        "def fsync(fd):\n"
        "    real(fd)\n"
        "    if hold:\n"
        "        print('holding', flush=True); time.sleep(600)\n"
        "files.os.fsync = fsync\n"
        "data = bytes([os.getpid() % 251])\n"
        f"files.atomic_write_bytes({str(target)!r}, data * {size})\n"
    )


def _spawn(script: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script], env=env,
                            stdout=subprocess.PIPE, text=True)


def test_a_sigkilled_writers_temp_file_goes_with_the_next_write(tmp_path):
    out = tmp_path / "report.html"
    writer = _spawn(_writer_script(out, 4_900_000, hold=True))
    assert writer.stdout.readline().strip() == "holding"
    temps = list(tmp_path.glob(".report.html.*.tmp"))
    assert len(temps) == 1 and temps[0].stat().st_size == 4_900_000
    assert remove_stale_temps(out) == []  # its writer still runs: kept
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    atomic_write_text(out, "next report")
    assert out.read_text() == "next report"
    assert list(tmp_path.glob(".report.html.*")) == []


def test_two_writers_at_once_each_leave_a_whole_file(tmp_path):
    """A held writer's temp file survives another writer's write (it is alive),
    and it then completes: the file is always one writer's whole output."""
    out = tmp_path / "out.bin"
    held = _spawn(_writer_script(out, 3_000_000, hold=True))
    assert held.stdout.readline().strip() == "holding"
    atomic_write_bytes(out, b"x" * 2_000_000)  # a second writer meanwhile
    assert out.read_bytes() == b"x" * 2_000_000
    assert len(list(tmp_path.glob(".out.bin.*.tmp"))) == 1  # the held one's, kept
    held.send_signal(signal.SIGKILL)
    held.wait()
    writers = [_spawn(_writer_script(out, 2_000_000 + i, hold=False)) for i in range(4)]
    for w in writers:
        assert w.wait(timeout=HANG_S) == 0
    data = out.read_bytes()
    assert len(data) in {2_000_000 + i for i in range(4)}
    assert data == data[:1] * len(data)  # one writer's bytes, whole
    atomic_write_bytes(out, b"last")
    assert list(tmp_path.glob(".out.bin.*")) == []


# --- properties ---------------------------------------------------------------------------
SEGMENT = st.sampled_from(["a", "b.json", ".", "..", "", "data", "platforms", "x.yaml"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inside=st.booleans(), parts=st.lists(SEGMENT, min_size=1, max_size=4),
       slash=st.booleans())
def test_check_outputs_accepts_exactly_file_paths_outside_the_shipped_data(
        tmp_path, shipped, inside, parts, slash):
    """For any path built from these segments, from the shipped data folder or a
    scratch folder (with a folder 'a' in each), check_outputs accepts it exactly
    when it names a file (last part not '', '.', '..', not an existing directory)
    that resolves outside the shipped data folders; it never creates anything."""
    (tmp_path / "a").mkdir(exist_ok=True)
    base = shipped[0] if inside else tmp_path
    text = os.path.join(str(base), *parts) + ("/" if slash else "")
    before = shipped_state(), tree(tmp_path)
    real = Path(os.path.realpath(text))
    in_shipped = any(real == d or d in real.parents
                     for d in policy.shipped_data_dirs())
    names_file = (os.path.basename(text) not in ("", ".", "..")
                  and not Path(text).is_dir())
    # a file under an existing file cannot be written: not this property's concern
    parent_ok = not any(p.is_file() for p in Path(text).parents)
    try:
        check_outputs({"-o": text}, [])
        accepted = True
    except ValueError:
        accepted = False
    if parent_ok:
        assert accepted == (names_file and not in_shipped), text
    else:
        assert not accepted
    assert (shipped_state(), tree(tmp_path)) == before


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(taken=st.sets(st.integers(min_value=1, max_value=8), max_size=6),
       occupant=st.sampled_from(["run", "file", "empty"]))
def test_free_name_and_the_run_folder_check_agree(tmp_path, taken, occupant):
    """Whatever numbered siblings exist, the suggested name is the first free one,
    and the folder check refuses the occupied folder (naming that suggestion) and
    takes the suggestion."""
    root = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    root.mkdir()
    for n in taken:  # 1 stands for the plain name
        (root / ("r" if n == 1 else f"r-{n}")).mkdir()
    suggestion = free_name(root / "r")
    expected = next(root / ("r" if n == 1 else f"r-{n}") for n in range(1, 20)
                    if n not in taken)
    assert suggestion == expected
    folder = root / "r"
    folder.mkdir(exist_ok=True)
    if occupant == "run":
        (folder / "record.json").write_text("{}")
    elif occupant == "file":
        (folder / "x.txt").write_text("x")
    before = tree(root)
    if occupant == "empty":
        check_run_dir(folder, [], force=False)
    else:
        with pytest.raises(ValueError, match=re.escape(f"--out {free_name(folder)}, or "
                                                       "pass --force")):
            check_run_dir(folder, [], force=False)
        check_run_dir(folder, [], force=True)
        check_run_dir(free_name(folder), [], force=False)
    assert tree(root) == before  # a check writes nothing
