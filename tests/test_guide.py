"""docs/guide.md runs as printed: each task's ```bash block runs from a fresh clone's
root (a scratch folder holding the repository's ``hwprofiles``, where the guide's
commands read shipped files) with ``hetspec`` this checkout's CLI, and every line of
the ```text block after it is a line the commands printed, its numbers aside (they
move with the cost model; the guide shows them as printed on its date). The tasks
that load the real model are marked slow."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hangguard import MODEL_HANG_S
from tests.needs import needs_torch

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "docs" / "guide.md").read_text()
REAL = ("hetspec run ", "hetspec replay ")  # commands that load the real model


def tasks() -> list[tuple[str, str, str]]:
    """(title, commands, expected) of every task with a bash block."""
    out = []
    for part in GUIDE.split("\n## ")[1:]:
        title = part.splitlines()[0]
        bash = re.findall(r"^```bash\n(.*?)^```", part, flags=re.S | re.M)
        text = re.findall(r"^```text\n(.*?)^```", part, flags=re.S | re.M)
        if bash:
            out.append((title, "\n".join(bash), "\n".join(text)))
    return out


def masked(line: str) -> str:
    return re.sub(r"[-+]?\d[\d,]*(\.\d+)?", "N", line).rstrip()


def run_task(commands: str, cwd: Path) -> str:
    (cwd / "hwprofiles").symlink_to(REPO / "hwprofiles")
    shim = cwd / "bin" / "hetspec"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m analyses.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["bash", "-e", "-c", commands], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=MODEL_HANG_S)
    assert done.returncode == 0, f"{commands}\n{done.stderr[-2000:]}"
    return done.stdout


def check(title: str, commands: str, expected: str, cwd: Path) -> None:
    printed = {masked(line) for line in run_task(commands, cwd).splitlines()}
    missing = [line for line in expected.splitlines() if masked(line) not in printed]
    assert missing == [], f"{title}: not printed: {missing}"


def test_the_guide_has_its_tasks():
    titles = [t for t, _, _ in tasks()]
    assert titles[:5] == ["Will it fit?", "Compare two machines",
                          "Is speculation worth it under load?", "Your GPUs are not shipped",
                          "A real speedup on this CPU, and check it"]
    assert all(expected for _, _, expected in tasks())


@pytest.mark.parametrize("title, commands, expected",
                         [t for t in tasks() if not any(r in t[1] for r in REAL)],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_a_simulated_task_prints_what_the_guide_shows(title, commands, expected, tmp_path):
    check(title, commands, expected, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("title, commands, expected",
                         [t for t in tasks() if any(r in t[1] for r in REAL)],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_a_real_task_prints_what_the_guide_shows(title, commands, expected, tmp_path):
    needs_torch()
    check(title, commands, expected, tmp_path)
