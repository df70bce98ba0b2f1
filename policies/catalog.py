"""The shipped schedules by name: what users pick with ``--policy``.

``policies.base`` holds the registry and ``register``, which every schedule
module imports; this module sits above the schedules (``policies.builtin``
loads every schedule module of the package, each registering itself) and answers
lookups by name: ``entry``, ``names``, ``parse_params``, ``build`` (the decoding),
``build_prefill`` (the prompt's prefill first, ``policies.prefill``) and
``outcome_models``. Importing ``policies`` imports it, so a name given anywhere
finds every shipped schedule registered.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import policies.builtin  # noqa: F401  (registers the shipped schedules)
from policies.base import (REGISTRY, PolicyContext, PolicyEntry, PolicyError, PolicyParams,
                           validate_params)
from policies.modelled import OutcomeModels
from policies.prefill import prologue


def entry(name: str) -> PolicyEntry:
    if name not in REGISTRY:
        raise PolicyError(f"unknown policy '{name}'; choose one of "
                          f"{', '.join(sorted(REGISTRY))}")
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
    return sorted(REGISTRY)
