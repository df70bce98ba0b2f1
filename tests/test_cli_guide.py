"""The CLI teaches: --version, generated --help for every policy key and law
parameter, announced outputs, one sentence for a missing optional dependency,
compact profile views, typo hints."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyses.cli import main
from analyses.laws.forms import laws
from hwprofiles import list_names, load_platform
from policies import entry, names
from tests.hangguard import HANG_S

REPO = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "analyses.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=HANG_S)


def test_version():
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("hetspec ")


def policy_blocks(help_text: str) -> dict[str, str]:
    """The --set section of simulate --help, split per policy ('  NAME:' lines)."""
    section = help_text.split("--set keys of each policy", 1)[1].split("\nacceptance model (", 1)[0]
    blocks, current = {}, None
    for line in section.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.endswith(":"):
            current = line.strip().rstrip(":")
            blocks[current] = ""
        elif current:
            blocks[current] += line + "\n"
    return blocks


def test_simulate_help_lists_every_policy_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    blocks = policy_blocks(capsys.readouterr().out)
    assert set(blocks) == set(names())
    for name in names():
        for key, field in entry(name).params.model_fields.items():
            default = field.default
            shown = ("unset" if default is None else str(default).lower()
                     if isinstance(default, bool) else str(default))
            assert f"    {key}={shown}" in blocks[name], (name, key)


def test_law_help_lists_every_law_with_every_parameter(capsys):
    with pytest.raises(SystemExit):
        main(["law", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, fn in laws().items():
        part = text.split(f" {name} ", 1)[1]
        params = part.split("parameters:", 1)[1]
        for key in inspect.signature(fn).parameters:
            assert key in params.split(" parameters:")[0], (name, key)


def test_law_prints_rounded_numbers(capsys):
    assert main(["law", "leviathan", "--set", "alpha=0.8", "--set", "gamma=5"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "speedup" in ln)
    assert line.split()[-1] == "3.68928"  # c = 0: speedup = E[tokens] = 3.68928


def test_simulate_announces_each_file_it_writes(tmp_path):
    done = cli("simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy",
               "ar", "--tokens", "20", "--trace", "t.json", "--record", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote t.json (Chrome trace" in done.stdout and "wrote r.json (run record)" in done.stdout
    assert "(20 tokens)" in done.stdout
    as_json = cli("simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
                  "--policy", "ar", "--tokens", "20", "--trace", "t2.json", "--json",
                  cwd=tmp_path)
    assert json.loads(as_json.stdout)["tokens"] == 20  # an integer, not 20.0
    assert "wrote t2.json" in as_json.stderr


def test_a_missing_optional_dependency_is_one_sentence_naming_the_install(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from analyses.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    done = cli("run", "--platform", "cpu-local", "--target", "smollm2-135m", "--policy", "ar",
               "--tokens", "2", "--out", "runs/x", cwd=tmp_path, code=code)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "'torch'" in lines[0] and 'pip install -e ".[torch]"' in lines[0]
    assert not (tmp_path / "runs").exists()


def test_profiles_list_describes_every_shipped_profile(capsys):
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    for kind in ("platforms", "models"):
        for name in list_names(kind):
            line = next(ln for ln in out if ln.split()[:1] == [name])
            assert ("GB memory" if kind == "platforms" else "params") in line


def test_profiles_show_summarises_alike_objects_and_adds_totals(capsys):
    import yaml

    assert main(["profiles", "show", "m2-ultra-8x"]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) < 200 and "sources" not in text
    data = yaml.safe_load(text)
    assert data["devices"][0]["name"] == "gpu0 .. gpu7 (8 alike)"
    platform = load_platform("m2-ultra-8x")
    total = sum(t.capacity_bytes for t in platform.memory_tiers) / 1e9
    assert data["derived"]["memory"]["dram"]["capacity_gb"] == pytest.approx(total)
    assert main(["profiles", "show", "m2-ultra-8x", "--full"]) == 0
    assert "sources" in capsys.readouterr().out


def test_a_compare_key_typo_names_the_nearest_and_every_valid_key(tmp_path):
    done = cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft",
               "none", "--policies", "ar,sd", "--sweep", "gama=2..3", "-o", "o.html",
               cwd=tmp_path)
    assert done.returncode == 2
    assert "did you mean 'gamma'?" in done.stderr and "draft_layers" in done.stderr
    assert not (tmp_path / "o.html").exists()
