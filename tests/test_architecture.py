"""Architecture rules that code review alone would miss: the layering of the packages.

    hwprofiles            hardware and model data; imports nothing of the project
    policies              schedules, ops, the run vocabulary (policies/runs/);
                          imports hwprofiles only, neither simpy nor torch
    simcore | executors   the two runtimes, side by side: each imports hwprofiles and
                          policies, never the other; simcore imports neither torch
                          nor plotly
    analyses              on top: laws, calibration, sweeps, reports, the CLI

Imports are read with ast from every module, function-local imports included
(``import x`` anywhere in a body, ``from x import y``, relative imports and
``importlib.import_module("x")`` with a literal name).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hwprofiles", "policies", "simcore", "executors", "analyses")

# package -> top-level names its modules must never import
FORBIDDEN = {
    "hwprofiles": {"policies", "simcore", "executors", "analyses"},
    "policies": {"simpy", "torch", "simcore", "executors", "analyses"},
    "simcore": {"executors", "analyses", "torch", "plotly"},
    "executors": {"simcore", "analyses"},
    "analyses": set(),
}

# Known breaks of the rules above, each (module path, imported package): none today.
# executors/measure.py imported simcore.records and simcore.trace until the run
# vocabulary moved to policies/runs/ (issue 15).
EXCEPTIONS: set[tuple[str, str]] = set()


def _absolute(node: ast.ImportFrom, module: str) -> str:
    """The absolute module a (possibly relative) ``from`` import names."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")[:-node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def imported_modules(source: str, module: str) -> set[str]:
    """Dotted names of everything ``source`` imports (``from a import b``: both
    ``a`` and ``a.b``, since b may be a module), wherever it is written."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def imported(source: str, module: str) -> set[str]:
    """Top-level names of everything ``source`` (module ``module``) imports."""
    return {name.split(".")[0] for name in imported_modules(source, module)} - {""}


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        yield rel, ".".join(rel.with_suffix("").parts)


def violations(package: str) -> list[tuple[str, str]]:
    """(module path, forbidden package) for every import against the layering."""
    return [(str(rel), name) for rel, module in _modules(package)
            for name in sorted(imported((ROOT / rel).read_text(), module))
            if name in FORBIDDEN[package]]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_keeps_to_its_layer(package):
    found = set(violations(package))
    assert found - EXCEPTIONS == set(), f"imports against the layering: {sorted(found)}"
    stale = {e for e in EXCEPTIONS if e[0].startswith(package + "/")} - found
    assert not stale, f"listed exceptions that no longer occur (remove them): {stale}"


def test_the_checker_sees_function_local_relative_and_dynamic_imports():
    source = ("import os\n"
              "def f():\n    import torch.nn\n"
              "def g():\n    from ..simcore import engine\n"
              "def h():\n    from . import ops\n"
              "def k():\n    importlib.import_module('analyses.run.api')\n")
    # a relative import stays inside its own package, whatever it names; the
    # rule table flags the rest
    assert imported(source, "policies.runs.x") == {"os", "torch", "policies", "analyses"}
    assert imported(source, "policies.runs.x") & FORBIDDEN["policies"] == {"torch", "analyses"}


def test_the_layer_table_names_every_package():
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert found == set(PACKAGES), "a package outside the layering: add it to FORBIDDEN"


def _loaded_after(statement: str) -> set[str]:
    code = (f"import sys; {statement}; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return set(out.stdout.split())


def test_policies_import_neither_simpy_nor_torch_at_run_time():
    loaded = _loaded_after("import policies, policies.builtin, policies.modelled, "
                           "policies.runs.metrics, policies.runs.records, policies.runs.config; "
                           "policies.names()")
    assert not {"simpy", "torch", "simcore", "executors", "analyses"} & loaded


def test_simcore_loads_no_runtime_or_drawing_package_at_run_time():
    loaded = _loaded_after("import simcore, simcore.engine, simcore.costmodel")
    assert not {"torch", "plotly", "executors", "analyses"} & loaded


# The executor interprets operations; it never learns which schedule yields them
# (issue 15): no policy name in its code, no import of a schedule's module.
def _policy_names() -> set[str]:
    import policies

    return set(policies.names())


def _schedule_modules() -> set[str]:
    """policies modules that register a schedule (``@register(...)``)."""
    found = set()
    for rel, module in _modules("policies"):
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register"
                    for d in node.decorator_list):
                found.add(module)
    return found


def _strings(node) -> list[str]:
    """String constants an expression names directly, or inside a literal collection."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def policy_names_in(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each policy name compared against (``==``, ``in``, ...)
    or used as a dict key."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        else:
            continue
        hits += [(node.lineno, s) for o in operands for s in _strings(o) if s in names]
    return hits


def test_executors_name_no_policy():
    names = _policy_names()
    found = [(str(rel), line, name) for rel, _ in _modules("executors")
             for line, name in policy_names_in((ROOT / rel).read_text(), names)]
    assert not found, f"executors compare against policy names (read op fields instead): {found}"


def test_executors_import_no_schedule_module():
    schedules = _schedule_modules()
    assert {"policies.ssd", "policies.mirror", "policies.cats"} <= schedules
    found = [(str(rel), m) for rel, module in _modules("executors")
             for m in sorted(imported_modules((ROOT / rel).read_text(), module) & schedules)]
    assert not found, f"executors import schedule modules (use policies.ops): {found}"


def test_the_policy_checks_see_comparisons_keys_and_schedule_imports():
    source = ("def hints(policy, params):\n"
              "    if policy == 'ssd':\n        from policies.ssd import fanout_of\n"
              "    if policy in ('mirror', 'x'):\n        pass\n"
              "    table = {'cats': 1, 'sample': 2}\n"
              "    from policies import ops, tree\n"
              "    return params.emit == 'topk'\n")
    names = {"ssd", "mirror", "cats", "tree"}
    assert sorted(policy_names_in(source, names)) == [(2, "ssd"), (4, "mirror"), (6, "cats")]
    mods = imported_modules(source, "executors.x")
    assert mods & {"policies.ssd", "policies.tree", "policies.mirror"} == \
        {"policies.ssd", "policies.tree"}


# The floor plan of analyses/ and executors/: sub-package folder -> folders (or
# modules) its modules must never import. Lower sub-packages know nothing of the
# ones above them; the top-level modules (analyses/cli.py, executors/session.py,
# ...) use them all. Written as paths, since a sub-package may share its name
# with the module it replaced (the laws module is now the laws folder's forms).
ANALYSES_TOP = ("analyses/commands", "analyses/cli")
EXECUTORS_TOP = ("executors/session", "executors/measure", "executors/prompts",
                 "executors/train", "executors/trainconfig", "executors/traincorpus",
                 "executors/trainahead")
SUBLAYERS = {
    "analyses/laws": ("analyses/run", "analyses/measured", "analyses/compare",
                      "analyses/calibrate") + ANALYSES_TOP,
    "analyses/run": ("analyses/measured", "analyses/compare", "analyses/calibrate")
                    + ANALYSES_TOP,
    "analyses/measured": ("analyses/compare", "analyses/calibrate") + ANALYSES_TOP,
    "analyses/compare": ("analyses/calibrate",) + ANALYSES_TOP,
    "analyses/calibrate": ("analyses/compare",) + ANALYSES_TOP,
    "analyses/commands": (),
    "executors/backend": ("executors/coordinate",) + EXECUTORS_TOP,
    "executors/coordinate": EXECUTORS_TOP,
}
# Known breaks, each (module path, imported module path): the device's greedy
# verify takes the agreeing-prefix helper from the coordinator's cache book.
SUB_EXCEPTIONS = {("executors/backend/device.py", "executors/coordinate/book")}


def _under(name: str, path: str) -> bool:
    """Whether dotted module ``name`` is the module or package at ``path`` or in it."""
    dotted = path.replace("/", ".")
    return name == dotted or name.startswith(dotted + ".")


def forbidden_in(sub: str, names: set[str]) -> set[str]:
    return {n for n in names if any(_under(n, f) for f in SUBLAYERS[sub])}


def sub_violations(sub: str) -> set[tuple[str, str]]:
    return {(str(rel), name) for rel, module in _modules(sub)
            for name in forbidden_in(sub, imported_modules((ROOT / rel).read_text(), module))}


def _excused(found: tuple[str, str], exception: tuple[str, str]) -> bool:
    """An exception covers its module and the names imported from it."""
    path, name = found
    return path == exception[0] and _under(name, exception[1])


@pytest.mark.parametrize("sub", SUBLAYERS)
def test_every_sub_package_keeps_to_its_layer(sub):
    found = sub_violations(sub)
    unexcused = {f for f in found if not any(_excused(f, e) for e in SUB_EXCEPTIONS)}
    assert not unexcused, f"imports against the floor plan: {sorted(unexcused)}"
    mine = {e for e in SUB_EXCEPTIONS if e[0].startswith(sub + "/")}
    stale = {e for e in mine if not any(_excused(f, e) for f in found)}
    assert not stale, f"listed exceptions that no longer occur (remove them): {stale}"


def test_the_floor_plan_names_every_sub_package():
    found = {f"{pkg}/{p.name}" for pkg in ("analyses", "executors")
             for p in (ROOT / pkg).iterdir() if (p / "__init__.py").is_file()}
    assert found == set(SUBLAYERS), "a sub-package outside the floor plan: add it to SUBLAYERS"


def test_the_floor_plan_checker_sees_a_lower_package_importing_a_higher_one():
    source = ("import analyses.run.api\n"
              "def f():\n    from analyses.compare import sweep\n"
              "def g():\n    from . import config\n")
    names = imported_modules(source, "analyses.run.memory")
    assert forbidden_in("analyses/run", names) == {"analyses.compare", "analyses.compare.sweep"}
    assert "analyses.run.config" in names
