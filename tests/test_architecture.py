"""Architecture rules that code review alone would miss."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_policies_import_neither_simpy_nor_torch_statically():
    for path in (ROOT / "policies").glob("*.py"):
        assert not {"simpy", "torch"} & _imports(path), path.name


def test_policies_import_neither_simpy_nor_torch_at_run_time():
    code = ("import sys, policies, policies.builtin, policies.acceptance; "
            "policies.names(); "
            "bad = {'simpy', 'torch'} & set(sys.modules); "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_simcore_never_imports_plotly_or_torch():
    for path in (ROOT / "simcore").glob("*.py"):
        assert not {"plotly", "torch", "executors", "analyses"} & _imports(path), path.name
