"""The shipped schedules by name: what users pick with ``--policy``.

``policies.base`` holds the registry and ``register``, which every schedule
module imports; this module sits above the schedules and answers lookups by
name: ``entry``, ``names``, ``parse_params``, ``build`` (the decoding),
``build_prefill`` (the prompt's prefill first, ``policies.prefill``) and
``outcome_models``. A schedule's module is imported when its name is first
looked up (``SCHEDULES``), so a run loads the schedules it runs and no other;
a schedule registered elsewhere (``register`` in a test) is found as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator
from typing import Any

from policies.base import (REGISTRY, PolicyContext, PolicyEntry, PolicyError, PolicyParams,
                           validate_params)
from policies.modelled import OutcomeModels
from policies.prefill import prologue

# shipped schedule name -> the module of this package that registers it; a test
# (tests/test_architecture.py) ties it to the modules' ``@register`` lines, so a
# new schedule module that is not listed here fails the suite
SCHEDULES = {"ar": "ar", "ar_stream": "cats", "cats": "cats", "kangaroo": "cats",
             "eesd": "ppsd", "ppsd": "ppsd", "mirror": "mirror", "sd": "sd", "ssd": "ssd",
             "tree": "tree"}


def entry(name: str) -> PolicyEntry:
    """The registry entry of schedule ``name``, its module imported on first use."""
    if name not in REGISTRY and name in SCHEDULES:
        importlib.import_module(f"policies.{SCHEDULES[name]}")
    if name not in REGISTRY:
        raise PolicyError(f"unknown policy '{name}'; choose one of {', '.join(names())}")
    return REGISTRY[name]


def parse_params(name: str, values: dict[str, Any]) -> PolicyParams:
    return validate_params(name, entry(name).params, values)


def build(name: str, ctx: PolicyContext, params: PolicyParams | dict) -> Generator:
    e = entry(name)
    if isinstance(params, dict):
        params = parse_params(name, params)
    if e.needs_draft:
        ctx.need_draft(name)
    return e.fn(ctx, params)


def outcome_models(name: str, ctx: PolicyContext,
                   params: PolicyParams | dict) -> OutcomeModels:
    """What schedule ``name`` models of its outcomes, for a simulator to attach
    (``policies.modelled``); the executor never asks."""
    e = entry(name)
    if isinstance(params, dict):
        params = parse_params(name, params)
    return {} if e.outcome_models is None else e.outcome_models(ctx, params)


def build_prefill(name: str, ctx: PolicyContext, params: PolicyParams | dict) -> Generator:
    """The prologue of schedule ``name``: the prompt's prefill of every cache its
    decoding reads (``policies.prefill``), as ordinary operations. ``build``
    returns the decoding alone, whose metrics exclude the prefill."""
    return prologue(build(name, ctx, params), ctx)


def names() -> list[str]:
    """Every schedule's name, shipped or registered, without importing any."""
    return sorted(set(SCHEDULES) | set(REGISTRY))
