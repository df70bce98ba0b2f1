"""Decoding schedules, written once as plain generators of operations.

Nothing here imports simpy or torch: the same schedule runs in the simulator
and in the real executor.
"""

from policies.base import (PolicyContext, PolicyError, PolicyParams, build, build_prefill,
                           entry, names, outcome_models, parse_params, register)

__all__ = ["PolicyContext", "PolicyError", "PolicyParams", "build", "build_prefill", "entry",
           "names", "outcome_models", "parse_params", "register"]
