"""How the executor observes a schedule's yes/no events (``Outcome``) for real.

The simulator draws an Outcome from its modelled probability; the executor
looks at the models' actual state instead. Each observer is
``fn(coordinator, op) -> bool``, registered under the event's name.
"""

from __future__ import annotations

OBSERVERS: dict = {}


def observer(event: str):
    def wrap(fn):
        OBSERVERS[event] = fn
        return fn

    return wrap
