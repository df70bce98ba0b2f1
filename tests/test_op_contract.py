"""The op contract (``policies.forward``, ``policies.ops``) held by tests.

  * A Forward names its parts by type: its ``Head``, what it emits (``Sample``,
    ``TopK``, None for logits) and what it reads (``Feed``).
  * Speculation branches are named objects: members of a ``Branch`` subclass a
    schedule declares, never bare integers, in every operation a schedule yields
    and in the source of the schedule modules.
  * Message sizes (``*_BYTES`` of ``Transfer.nbytes``) are declared once, in
    ``policies.ops``: no schedule module declares one, and nothing imports one
    from a schedule module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import policies  # noqa: F401  (registers the shipped schedules)
from hwprofiles import load_model
from policies import PolicyContext, build
from policies.base import REGISTRY
from policies.ops import (ALTERNATIVES, LM, MAIN, OWN, SAMPLE, Branch, Delay, Feed, Forward,
                          Head, Join, Lookup, OnTree, Outcome, Parallel, Roots, Sample, Spawn,
                          TopK, Verdict, Verify, drive, widest_lookup)
from tests.test_prefill import M2, SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hwprofiles", "policies", "simcore", "executors", "analyses")
SCHEDULE_MODULES = sorted({REGISTRY[name].fn.__module__ for name in REGISTRY}
                          | {"policies.prefill"})
# each schedule once, and the prompt-lookup variants that pass a branch along
VARIANTS = [(name, {}) for name in sorted(REGISTRY)] + [
    ("sd", {"proposer": "ngram"}), ("tree", {"proposer": "ngram"}),
    ("mirror", {"batch_fallback": "skip"}), ("ssd", {"partial_hits": "keep"})]
MAX_OPS = 3000
SPECULATING = (Forward, Verify, Delay, Lookup)  # operations on a speculation branch


# operations a schedule yields ---------------------------------------------------------
class _Enough(Exception):
    pass


def _ops_of(schedule, accept: bool) -> list:
    """Every operation ``schedule`` yields (sub-schedules included) when each
    proposal is accepted in full (``accept``) or rejected, each event held or not."""
    ops = []

    def answer(op):
        ops.append(op)
        if len(ops) > MAX_OPS:
            raise _Enough
        if isinstance(op, Verify):
            return Verdict((op.gamma if accept else 0,) * op.batch)
        if isinstance(op, Outcome):
            return (accept,) * op.batch if op.per_row else accept
        if isinstance(op, Lookup):
            return widest_lookup(op)
        if isinstance(op, Spawn):
            return drive(op.branch, answer)
        if isinstance(op, Join):
            return tuple(op.tasks)
        if isinstance(op, Parallel):
            return tuple(drive(b, answer) for b in op.branches)
        return op if isinstance(op, Forward) else getattr(op, "payload", None)

    try:
        drive(schedule, answer)
    except _Enough:
        pass
    return ops


def _schedule(name: str, extra: dict, batch: int = 2):
    scenario, params = SCENARIOS.get(name, (M2, {}))
    draft = scenario["draft"] if name in SCENARIOS else M2["draft"]
    ctx = PolicyContext(target=load_model(scenario["target"]), tokens=12, batch=batch,
                        draft=draft and load_model(draft))
    return build(name, ctx, {**params, **extra})


def contract_breaks(op) -> list[str]:
    """How ``op`` breaks the typed contract: a bare branch, an untyped part."""
    breaks, branch = [], op.branch if isinstance(op, SPECULATING) else MAIN
    if not isinstance(branch, Branch):
        breaks.append(f"{type(op).__name__}.branch={branch!r}")
    if isinstance(op, Outcome) and isinstance(op.observes, OnTree) \
            and not isinstance(op.observes.into, Branch):
        breaks.append(f"OnTree.into={op.observes.into!r}")
    if isinstance(op, Forward):
        tree_branch = getattr(op.tree, "branch", MAIN)
        if not isinstance(tree_branch, Branch):
            breaks.append(f"{type(op.tree).__name__}.branch={tree_branch!r}")
        if not (op.head is None or isinstance(op.head, Head)):
            breaks.append(f"Forward.head={op.head!r}")
        if not (op.emit is None or isinstance(op.emit, (Sample, TopK))):
            breaks.append(f"Forward.emit={op.emit!r}")
        if not isinstance(op.feed, Feed):
            breaks.append(f"Forward.feed={op.feed!r}")
    return breaks


@pytest.mark.parametrize("name,extra", VARIANTS, ids=lambda v: str(v))
def test_every_operation_a_schedule_yields_names_its_branch_and_parts(name, extra):
    branches = set()
    for accept in (False, True):
        ops = _ops_of(_schedule(name, extra), accept)
        assert ops, f"{name} yielded no operation"
        assert [b for op in ops for b in contract_breaks(op)] == []
        branches |= {op.branch for op in ops if isinstance(op, SPECULATING)}
    assert branches and all(isinstance(b, Branch) for b in branches)


def test_the_schedules_speculate_on_named_branches_beyond_the_main_one():
    """The check above is not vacuous: schedules do use branches other than MAIN,
    each a member of the branch class its module declares."""
    seen = {}
    for name in ("mirror", "ssd", "tree"):
        for op in _ops_of(_schedule(name, {}), accept=True):
            if isinstance(op, SPECULATING) and op.branch != MAIN:
                seen[name] = op.branch
    assert {name: type(b).__module__ for name, b in seen.items()} == {
        "mirror": "policies.mirror", "ssd": "policies.ssd", "tree": "policies.tree"}
    assert {b.name for b in seen.values()} == {"WINDOW", "CACHE", "TREE"}


def test_the_contract_check_sees_a_bare_branch_and_an_untyped_part():
    assert contract_breaks(Verify(2, branch=1)) == ["Verify.branch=1"]
    assert contract_breaks(Delay(0.0, branch=0)) == ["Delay.branch=0"]
    assert contract_breaks(Outcome("hit", observes=OnTree(into=1))) == ["OnTree.into=1"]
    bad = Forward("draft", "draft", (0, 4), head="lm", emit="sample", tree=Roots(2, 1))
    assert contract_breaks(bad) == ["Roots.branch=1", "Forward.head='lm'",
                                    "Forward.emit='sample'"]
    assert contract_breaks(Forward("draft", "draft", (0, 4), head=LM, emit=SAMPLE)) == []


# the parts ---------------------------------------------------------------------------
def test_a_forward_defaults_to_its_own_positions_on_the_main_branch():
    op = Forward("target", "target", (0, 8))
    assert (op.head, op.emit, op.feed, op.branch) == (None, None, OWN, MAIN)
    assert OWN == Feed(None, False, None, 0) and SAMPLE == Sample(ALTERNATIVES)
    assert MAIN == 0 and isinstance(MAIN, Branch)


def test_the_record_keeps_the_flat_fields_a_measured_span_names():
    """``Forward.record`` is what the executor writes in a span's operation:
    the run records' field names and order, whatever the parts."""
    handle = object()
    op = Forward("draft", "draft", (0, 4), 1, 2, 99, head=Head("exit", 1), emit=Sample(11),
                 feed=Feed(handle, True, (1,)), label="draft")
    assert op.record() == {
        "model": "draft", "device": "draft", "layers": [0, 4], "n_tokens": 1, "batch": 2,
        "context": 99, "head": "exit", "emit": "sample", "top_k": 1, "branch": 0,
        "collectives": None, "label": "draft", "head_tokens": 1, "tree": None,
        "alternatives": 11, "corrections": 0, "catch_up": True, "sequences": [1]}
    verifier = Forward("target", "target", (2, 6), 3, 1, 10, head=LM, emit=TopK(4),
                       feed=Feed(corrections=2))
    assert list(verifier.record())[:11] == ["model", "device", "layers", "n_tokens",
                                            "batch", "context", "head", "emit", "top_k",
                                            "branch", "inputs"]
    assert (verifier.record()["top_k"], verifier.record()["corrections"],
            verifier.record()["alternatives"]) == (4, 2, ALTERNATIVES)


# the source of the schedule modules ----------------------------------------------------
def _source(module: str) -> ast.Module:
    return ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())


def bare_branches(tree: ast.Module) -> list[str]:
    """Integer literals given as a branch: ``branch=1``, ``into=1``, the branch of
    ``Roots``/``Fanout``, or a module-level name bound to an integer and passed as
    one (``FRESH, WINDOW = 0, 1``)."""
    ints = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target, value in _pairs(node):
                if isinstance(value, ast.Constant) and type(value.value) is int:
                    ints[target.id] = node.lineno
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        given = [k.value for k in node.keywords if k.arg in ("branch", "into")]
        if getattr(node.func, "id", None) in ("Roots", "Fanout") and len(node.args) > 1:
            given.append(node.args[1])
        for value in given:
            if isinstance(value, ast.Constant) and type(value.value) is int:
                found.append(f"line {value.lineno}: {value.value}")
            elif isinstance(value, ast.Name) and value.id in ints:
                found.append(f"line {ints[value.id]}: {value.id}")
    return found


def _pairs(node: ast.Assign):
    for target in node.targets:
        if isinstance(target, ast.Name):
            yield target, node.value
        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            yield from ((t, v) for t, v in zip(target.elts, node.value.elts)
                        if isinstance(t, ast.Name))


@pytest.mark.parametrize("module", SCHEDULE_MODULES)
def test_no_schedule_module_gives_a_bare_integer_as_a_branch(module):
    assert bare_branches(_source(module)) == []


def test_the_branch_check_sees_literals_and_integer_names():
    source = ("FRESH, WINDOW = 0, 1\nTREE = 1\n"
              "def f():\n    yield Forward('d', 'd', (0, 1), branch=WINDOW)\n"
              "    yield Verify(2, branch=1)\n    yield Outcome('x', observes=OnTree(into=TREE))\n"
              "    yield Forward('d', 'd', (0, 1), tree=Roots(2, 0))\n")
    assert sorted(bare_branches(ast.parse(source))) == ["line 1: WINDOW", "line 2: TREE",
                                                        "line 5: 1", "line 7: 0"]


def declared_sizes(tree: ast.Module) -> list[str]:
    """Module-level ``*_BYTES`` names a module binds."""
    return [t.id for node in tree.body if isinstance(node, ast.Assign)
            for t, _ in _pairs(node) if t.id.endswith("_BYTES")]


def sizes_taken_from(tree: ast.Module, modules: set[str]) -> list[str]:
    """``*_BYTES`` names imported from, or read as attributes of, ``modules``."""
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if node.module in modules and a.name.endswith("_BYTES"):
                    found.append(full)
                if full in modules:
                    aliases[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.endswith("_BYTES") \
                and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


@pytest.mark.parametrize("module", SCHEDULE_MODULES)
def test_no_schedule_module_declares_a_message_size(module):
    assert declared_sizes(_source(module)) == []


def test_no_module_takes_a_message_size_from_a_schedule():
    schedules = set(SCHEDULE_MODULES)
    found = {}
    for package in PACKAGES + ("tests", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            taken = sizes_taken_from(ast.parse(path.read_text()), schedules)
            if taken:
                found[str(path.relative_to(ROOT))] = taken
    assert found == {}


def test_the_size_checks_see_declarations_imports_and_attributes():
    source = ("from policies import sd as sd_policy\nfrom policies.mirror import ENTRY_BYTES\n"
              "import policies.ppsd as pp\nVERDICT_BYTES = 8\n"
              "x = sd_policy.VERDICT_BYTES + pp.TOKEN_BYTES\n")
    tree = ast.parse(source)
    assert declared_sizes(tree) == ["VERDICT_BYTES"]
    assert sorted(sizes_taken_from(tree, {"policies.sd", "policies.mirror", "policies.ppsd"})) \
        == ["policies.mirror.ENTRY_BYTES", "policies.ppsd.TOKEN_BYTES",
            "policies.sd.VERDICT_BYTES"]


def test_the_message_sizes_live_in_the_op_vocabulary():
    ops = sys.modules["policies.ops"]
    sizes = {n: getattr(ops, n) for n in ops.__all__ if n.endswith("_BYTES")}
    assert set(sizes) == {"TOKEN_BYTES", "ENTRY_BYTES", "VERDICT_BYTES"}
    assert all(type(v) is int and v > 0 for v in sizes.values())
