"""Architecture rules that code review alone would miss: the layering of the packages.

    hwprofiles            hardware and model data; imports nothing of the project
    policies              schedules, ops, the run vocabulary (policies/runs/);
                          imports hwprofiles only, neither simpy nor torch
    simcore | executors   the two runtimes, side by side: each imports hwprofiles and
                          policies, never the other; simcore imports neither torch
                          nor plotly
    analyses              on top: laws, calibration, sweeps, reports, the CLI

Imports are read with ast from every module, function-local imports included
(``import x`` anywhere in a body, ``from x import y``, relative imports, and
``importlib.import_module("x")``, ``import_module("x")`` and ``__import__("x")``
with a literal name). Below the layering: no import loops, function-local
imports only for optional dependencies (under a ceiling), no schedule name in
the executor (``==``, ``in``, dict keys, ``case``), no parameter probed by name
(``hasattr(params, ...)``), no schedule name in simcore/ or analyses/run/ nor a
schedule parameter's name in analyses/run/ (but the CLI's run configuration),
and how many modules ``hetspec simulate`` loads.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import policies
from policies.base import SCHEDULES

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


def dynamic_import(node) -> str | None:
    """The literal module name of ``importlib.import_module("x")``,
    ``import_module("x")`` or ``__import__("x")``; None for anything else."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    called = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
    first = node.args[0]
    if called in ("import_module", "__import__") and isinstance(first, ast.Constant) \
            and isinstance(first.value, str):
        return first.value
    return None


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
        elif (name := dynamic_import(node)) is not None:
            names.add(name)
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
              "def k():\n    importlib.import_module('analyses.run.api')\n"
              "def m():\n    import_module('executors.session')\n"
              "def n():\n    return __import__('simcore')\n")
    # a relative import stays inside its own package, whatever it names; the
    # rule table flags the rest
    assert imported(source, "policies.runs.x") == {"os", "torch", "policies", "analyses",
                                                   "executors", "simcore"}
    assert imported(source, "policies.runs.x") & FORBIDDEN["policies"] == {
        "torch", "analyses", "executors", "simcore"}


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
    loaded = _loaded_after("import policies, policies.base, "
                           "policies.runs.files, policies.runs.metrics, policies.runs.config; "
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
    """(line, name) of each policy name compared against (``==``, ``in``, a
    ``match`` statement's ``case``) or used as a dict key."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.MatchValue):  # case "ssd": (or one arm of case "a" | "b")
            operands = [node.value]
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


def registered_names(source: str) -> set[str]:
    """The names a module registers: the first argument of each ``@register("x", ...)``."""
    return {d.args[0].value for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register"
            and d.args and isinstance(d.args[0], ast.Constant)}


# The registry imports a schedule's module when its name is first looked up
# (policies.base.SCHEDULES, name -> module): the table must name every
# schedule a module of the package registers, and that module.
def test_the_schedule_table_names_every_registered_schedule_and_its_module():
    found = {name: module.removeprefix("policies.") for rel, module in _modules("policies")
             for name in registered_names((ROOT / rel).read_text())}
    assert len(found) >= 10
    assert SCHEDULES == found, "policies.base.SCHEDULES must list each @register name"


def test_looking_a_schedule_up_imports_its_module_alone():
    code = ("import sys, policies; policies.names(); policies.entry('ppsd'); "
            "print(' '.join(m for m in sys.modules if m.startswith('policies.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert "policies.ppsd" in out
    assert not {"policies.ssd", "policies.cats", "policies.tree", "policies.mirror"} & set(out)


def test_the_policy_checks_see_comparisons_keys_and_schedule_imports():
    source = ("def hints(policy, params):\n"
              "    if policy == 'ssd':\n        from policies.ssd import fanout_of\n"
              "    if policy in ('mirror', 'x'):\n        pass\n"
              "    table = {'cats': 1, 'sample': 2}\n"
              "    from policies import ops, tree\n"
              "    match policy:\n        case 'tree' | 'x':\n            pass\n"
              "    return params.emit == 'topk'\n")
    names = {"ssd", "mirror", "cats", "tree"}
    assert sorted(policy_names_in(source, names)) == [(2, "ssd"), (4, "mirror"), (6, "cats"),
                                                      (9, "tree")]
    mods = imported_modules(source, "executors.x")
    assert mods & {"policies.ssd", "policies.tree", "policies.mirror"} == \
        {"policies.ssd", "policies.tree"}


# The floor plan of analyses/ and executors/: sub-package folder -> folders (or
# modules) its modules must never import. Lower sub-packages know nothing of the
# ones above them; the top-level modules (analyses/cli.py, executors/measure.py,
# ...) use them all. Written as paths, since a sub-package may share its name
# with the module it replaced (the laws module is now the laws folder's forms).
ANALYSES_TOP = ("analyses/commands", "analyses/cli")
EXECUTORS_TOP = ("executors/session", "executors/measure", "executors/prompts",
                 "executors/train")
SUBLAYERS = {
    "analyses/laws": ("analyses/run", "analyses/measured", "analyses/compare",
                      "analyses/calibrate", "analyses/serve") + ANALYSES_TOP,
    "analyses/run": ("analyses/measured", "analyses/compare", "analyses/calibrate",
                     "analyses/serve") + ANALYSES_TOP,
    "analyses/measured": ("analyses/compare", "analyses/calibrate", "analyses/serve")
                         + ANALYSES_TOP,
    # serving drives the schedules as a run does, and the comparison sweeps it
    "analyses/serve": ("analyses/measured", "analyses/compare", "analyses/calibrate")
                      + ANALYSES_TOP,
    "analyses/compare": ("analyses/calibrate",) + ANALYSES_TOP,
    "analyses/calibrate": ("analyses/compare",) + ANALYSES_TOP,
    "analyses/commands": (),
    "executors/backend": ("executors/coordinate",) + EXECUTORS_TOP,
    "executors/coordinate": EXECUTORS_TOP,
    "executors/session": ("executors/measure", "executors/prompts", "executors/train"),
    "executors/train": ("executors/session", "executors/measure", "executors/prompts"),
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


# A schedule's parameters are its own typed model: code outside policies/ asks the
# schedule (or reads a field every model has), it does not probe for a field by
# name (``hasattr(params, "gamma")``, ``getattr(params, "k", None)``). Known
# probes, each (module path, field), until the schedules answer for themselves:
# the memory check's and the executor's.
PARAMS_PROBES = {("executors/session/plan.py", "temperature")}


def params_probes(source: str) -> list[tuple[int, str]]:
    """(line, field) of each ``hasattr(X, f)`` or ``getattr(X, f, default)`` whose X
    is ``params`` or ``<anything>.params`` (``<name>`` when f is not a literal)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and (node.func.id == "hasattr" or (node.func.id == "getattr"
                                                   and len(node.args) == 3))
                and len(node.args) >= 2):
            continue
        target = node.args[0]
        named = (isinstance(target, ast.Name) and target.id == "params") or (
            isinstance(target, ast.Attribute) and target.attr == "params")
        if named:
            field = node.args[1]
            hits.append((node.lineno, field.value if isinstance(field, ast.Constant)
                         else "<name>"))
    return hits


def test_no_layer_probes_a_schedules_parameters_by_name():
    found = {(str(rel), field) for package in ("simcore", "executors", "analyses")
             for rel, _ in _modules(package)
             for _, field in params_probes((ROOT / rel).read_text())}
    assert found - PARAMS_PROBES == set(), f"parameters probed by name: {sorted(found)}"
    stale = PARAMS_PROBES - found
    assert not stale, f"listed probes that no longer occur (remove them): {stale}"


def test_the_probe_check_sees_hasattr_and_getattr_with_a_default():
    source = ("def f(params, run, name):\n"
              "    if hasattr(params, 'gamma'):\n        pass\n"
              "    k = getattr(run.params, 'k', None)\n"
              "    v = getattr(params, name, 0)\n"
              "    return getattr(params, 'gamma'), hasattr(run, 'k')\n")
    assert params_probes(source) == [(2, "gamma"), (4, "k"), (5, "<name>")]


# Import loops and function-local imports. A loop is a set of project modules
# that import one another, counting imports written inside functions (which only
# hide a loop); function-local imports are for optional dependencies (torch,
# transformers, ray, plotly, safetensors and the project modules that import
# them at load), and the others are counted against a ceiling that only comes
# down.
OPTIONAL = {"torch", "transformers", "ray", "plotly", "safetensors"}
LOCAL_IMPORTS_CEILING = 0  # statements not for an optional dependency
# every function-local import statement: 14 with serve --real's executor (torch)
ALL_LOCAL_IMPORTS_CEILING = 14


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the five packages (a package is
    named by its ``__init__.py``)."""
    out = {}
    for package in PACKAGES:
        for rel, module in _modules(package):
            out[module.removesuffix(".__init__")] = ROOT / rel
    return out


def _statements(tree: ast.AST, inside: bool = False):
    """(node, whether it sits inside a function) for every import statement and
    literal dynamic import."""
    for child in ast.iter_child_nodes(tree):
        nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                              ast.Lambda))
        if isinstance(child, (ast.Import, ast.ImportFrom)) or dynamic_import(child):
            yield child, inside
        yield from _statements(child, nested)


def _targets(node, module: str, is_package: bool, known) -> list[str]:
    """The modules one import statement names, each resolved to the deepest name
    ``known`` holds (``from a import b``: a.b when b is a module, else a)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _absolute(node, module + ".__init__" if is_package else module)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                 for a in node.names]
    else:
        names = [dynamic_import(node)]
    out = []
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, int, tuple]]]:
    """(module -> project modules it imports anywhere, [(path, line, names) of each
    function-local import statement])."""
    modules = project_modules()
    graph, local = {m: set() for m in modules}, []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, inside in _statements(ast.parse(path.read_text())):
            for name in _targets(node, module, is_package, modules):
                if name in modules and name != module:
                    graph[module].add(name)
            if inside:
                local.append((str(path.relative_to(ROOT)), node.lineno,
                              tuple(_targets(node, module, is_package, modules))))
    return graph, local


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def needs_optional(graph_top: dict[str, set[str]], optional_top: set[str]) -> set[str]:
    """Project modules that load an optional dependency when imported: those
    importing one at their top level, and those importing such a module there."""
    found = set(optional_top)
    grew = True
    while grew:
        grew = False
        for module, names in graph_top.items():
            if module not in found and names & found:
                found.add(module)
                grew = True
    return found


def _top_level_graph():
    """(module -> project modules imported at its top level, modules importing an
    optional dependency at their top level)."""
    modules = project_modules()
    graph, optional = {m: set() for m in modules}, set()
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, inside in _statements(ast.parse(path.read_text())):
            if inside:
                continue
            for name in _targets(node, module, is_package, modules):
                if name.split(".")[0] in OPTIONAL:
                    optional.add(module)
                elif name in modules and name != module:
                    graph[module].add(name)
    return graph, optional


def local_imports_not_optional() -> list[tuple[str, int, tuple]]:
    """Function-local import statements that import anything but an optional
    dependency (or a project module that loads one)."""
    _, local = import_graph()
    heavy = needs_optional(*_top_level_graph())
    return [(path, line, names) for path, line, names in local
            if any(n.split(".")[0] not in OPTIONAL and n not in heavy for n in names)]


def test_no_import_loops():
    graph, _ = import_graph()
    assert import_loops(graph) == [], "modules that import one another"


def test_the_loop_finder_sees_a_loop_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_loops(graph) == [["a", "b", "c"]]
    assert needs_optional({"x": {"y"}, "y": set(), "z": set()}, {"y"}) == {"x", "y"}


def test_function_local_imports_stay_under_their_ceiling():
    _, local = import_graph()
    assert len(local) <= ALL_LOCAL_IMPORTS_CEILING, (
        f"{len(local)} function-local imports (ceiling {ALL_LOCAL_IMPORTS_CEILING})")
    found = local_imports_not_optional()
    assert len(found) <= LOCAL_IMPORTS_CEILING, (
        f"{len(found)} function-local imports of non-optional modules (ceiling "
        f"{LOCAL_IMPORTS_CEILING}); import at the top of the module: {found[:20]}")


def test_the_local_import_counter_sees_nested_and_dynamic_imports():
    source = ("import os\n"
              "def f():\n    import json\n    def g():\n        from . import ops\n"
              "class C:\n    def m(self):\n        return __import__('simcore')\n")
    found = [(inside, node.lineno) for node, inside in _statements(ast.parse(source))]
    assert found == [(False, 1), (True, 3), (True, 5), (True, 8)]


# ``hetspec simulate --policy sd`` loads the command line, its command, the run's
# API and what it simulates with: its schedule and its baseline's (sd, ar: the
# registry imports a schedule's module when its name is looked up), the engine, the
# profiles, the memory check and its remedies, the budget, the output guard and the
# run files; no other schedule, no executor, calibration or comparison module.

SIMULATE_SD = ("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
               "--draft", "llama-3.2-1b", "--policy", "sd", "--tokens", "20", "--json")


def simulate_loads() -> tuple[list[str], list[str]]:
    """(modules, packages) of the project that ``hetspec SIMULATE_SD`` loads, in a
    fresh interpreter."""
    code = ("import contextlib, io, sys\nfrom analyses.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    main({list(SIMULATE_SD)!r})\n"
            f"ours = sorted(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r})\n"
            "print(' '.join(m for m in ours if not hasattr(sys.modules[m], '__path__')))\n"
            "print(' '.join(m for m in ours if hasattr(sys.modules[m], '__path__')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    modules, packages = out.stdout.splitlines()
    return modules.split(), packages.split()


def test_simulate_loads_few_project_modules():
    loaded, packages = simulate_loads()
    assert "simcore.engine" in loaded and "policies.sd" in loaded  # it did simulate
    assert {"analyses", "policies", "simcore", "hwprofiles"} <= set(packages)
    others = {f"policies.{m}" for m in SCHEDULES.values()} - {"policies.sd", "policies.ar"}
    assert not others & set(loaded), "simulate --policy sd imports other schedules"
    assert not any(m.startswith(("executors", "analyses.calibrate", "analyses.compare"))
                   for m in loaded + packages), loaded + packages


# No schedule is named in simcore/ or analyses/: they ask the schedule (its dry
# run, policies.dryrun; its registry entry and what it declares for comparing it,
# policies.declared). The one module that may is the command line's help and
# defaults (analyses/cli.py); AR, the baseline, is ``policies.base.AR``.
SCHEDULE_NAMERS = {"analyses/cli.py"}


def schedule_literals(package: str) -> set[tuple[str, str]]:
    return string_literals(package, set(policies.names()))


def string_literals(package: str, words: set[str]) -> set[tuple[str, str]]:
    """(module path, literal) for every string constant of ``package`` in ``words``."""
    return {(str(rel), value) for rel, _ in _modules(package)
            for value in source_literals((ROOT / rel).read_text(), words)}


def source_literals(source: str, words: set[str]) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in words}


def test_no_schedule_name_in_simcore_or_analyses():
    found = sorted((path, word) for path, word in
                   schedule_literals("simcore") | schedule_literals("analyses")
                   if path not in SCHEDULE_NAMERS)
    assert len(found) == 0, f"{len(found)} schedule names written: {found}"
    assert source_literals('TUNED = {"sd": "gamma"}\nif p in ("ssd", "x"): pass\n'
                           '"""cats in a docstring"""', {"sd", "ssd", "cats"}) == {"sd", "ssd"}


# Nor is a schedule's parameter named in analyses/run/: the
# work budget, the memory check and the run API ask the schedule (its dry run,
# its registry entry, its parameter model) what its parameters mean. The one
# module that names them is the CLI's run configuration, which parses --set and
# turns --draft ngram into a schedule's ``proposer``.
PARAMETER_NAMERS = {"analyses/run/config.py"}


def parameter_names() -> set[str]:
    return {field for name in policies.names()
            for field in policies.entry(name).params.model_fields}


def test_no_schedule_parameter_named_in_analyses_run():
    found = {(path, word) for path, word in string_literals("analyses/run", parameter_names())
             if path not in PARAMETER_NAMERS}
    assert found == set(), f"schedule parameters named: {sorted(found)}"
    assert {"gamma", "tree", "chunk_layers", "fanout", "nodes"} <= parameter_names()
    assert source_literals('values.get("tree") or most(("gamma", "k"))',
                           parameter_names()) == {"tree", "gamma", "k"}


# One dry run of a schedule: only policies/dryrun.py drives a
# schedule with stand-in results (``policies.ops.drive``); prefill, the executor's
# footprint and the memory check ask it.
def drive_callers() -> set[str]:
    found = set()
    for package in PACKAGES:
        for rel, _ in _modules(package):
            for node in ast.walk(ast.parse((ROOT / rel).read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "drive"):
                    found.add(str(rel))
    return found


def test_one_module_dry_runs_a_schedule():
    assert drive_callers() == {"policies/dryrun.py"}


# One pass-splitting rule (executors/passes.py), called by both sides: the
# coordinator's commands sample by it, and calibration costs measured Forwards by it.
def test_the_executor_and_calibration_call_one_pass_rule():
    users = {str(rel) for package in ("executors", "analyses") for rel, module in
             _modules(package)
             if "executors.passes" in imported_modules((ROOT / rel).read_text(), module)}
    assert {"executors/coordinate/coordinator.py", "analyses/calibrate/terms.py"} <= users
