"""Decoding schedules, written once as plain generators of operations.

Nothing here imports simpy or torch: the same schedule runs in the simulator
and in the real executor. ``base`` is the registry every schedule registers
with, which looks the shipped schedules up by name, importing a schedule's
module when its name is first looked up; ``prefill`` builds a schedule's
prologue.
"""

from policies.base import (PolicyContext, PolicyError, PolicyParams, build, entry, names,
                           outcome_models, parse_params, register)
from policies.prefill import build_prefill

__all__ = ["PolicyContext", "PolicyError", "PolicyParams", "build", "build_prefill", "entry",
           "names", "outcome_models", "parse_params", "register"]
