"""How the executor observes a schedule's yes/no events (``Outcome``) for real.

The simulator draws an Outcome from its modelled probability; the executor
looks at the models' actual state instead, by what the Outcome says it
observes (``Outcome.observes``, a type from ``policies.ops``). Each observer is
``fn(coordinator, op) -> per-row bools`` (or ``Wait`` for replies still owed).
"""

from __future__ import annotations

from executors.coordinate.trees import observe_on_path
from policies.ops import OnTree

OBSERVERS = {
    OnTree: observe_on_path,  # the committed prefix lies on the tree grown last
}
