"""``--backend ray``: the same grid on a Ray cluster (the optional ``ray`` extra).

Connects to the cluster named by ``RAY_ADDRESS`` (or ``address``) and starts a
local Ray instance when none is named. Results come back in the grid's order.
It knows nothing of sweeps: ``analyses.compare.sweep`` hands it the functions
and their arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the ray package; install it with "
                         "pip install 'hetspec[ray]' or use --backend local") from None
    return ray


def connect(address: str | None = None):
    """The ray module, connected to the cluster (or a local instance)."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"),
                 include_dashboard=False, log_to_driver=False)
    return ray


def ray_map(fn: Callable, items: list) -> list:
    """``map(fn, items)`` on the cluster, in the items' order."""
    ray = _ray()
    remote = ray.remote(fn)
    return ray.get([remote.remote(item) for item in items])


def run_all(fn: Callable, tasks: list, done: Callable[[int], object]) -> list:
    """``fn`` of every task on the cluster, in the tasks' order; ``done(n)`` as n
    more finish (a progress bar's update)."""
    ray = _ray()
    remote = ray.remote(fn)
    refs = [remote.remote(task) for task in tasks]
    pending = list(refs)
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        done(len(finished))
    return ray.get(refs)
