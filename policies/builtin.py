"""Imports the shipped schedules so that they register themselves."""

import importlib
import pkgutil

import policies

_SKIP = {"base", "builtin", "ops", "modelled", "prefill"}

for _mod in sorted(m.name for m in pkgutil.iter_modules(policies.__path__)):
    if _mod not in _SKIP and not _mod.startswith("_"):
        importlib.import_module(f"policies.{_mod}")
