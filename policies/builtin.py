"""Imports the shipped schedules so that they register themselves: every module
of this package but the machinery below, so that a new schedule is one new file."""

import importlib
import pkgutil
from pathlib import Path

_SKIP = {"base", "builtin", "catalog", "ops", "modelled", "prefill"}

for _mod in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
    if _mod not in _SKIP and not _mod.startswith("_"):
        importlib.import_module(f"policies.{_mod}")
