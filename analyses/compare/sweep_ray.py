"""``--backend ray``: the same grid on a Ray cluster (the optional ``ray`` extra).

Connects to the cluster named by ``RAY_ADDRESS`` (or ``address``) and starts a
local Ray instance when none is named. Results come back in the grid's order.
"""

from __future__ import annotations

import os

from analyses.run.config import RunConfig
from analyses.compare.sweep import Point, PointResult, point_tasks, progress_bar, run_packed


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the ray package; install it with "
                         "pip install 'hetspec[ray]' or use --backend local") from None
    return ray


def run_grid_ray(points: list[Point], configs: list[RunConfig], *,
                 address: str | None = None, quiet: bool = False) -> list[PointResult]:
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"),
                 include_dashboard=False, log_to_driver=False)
    def mapper(fn, items):
        remote = ray.remote(fn)
        return ray.get([remote.remote(item) for item in items])

    remote = ray.remote(run_packed)
    refs = [remote.remote(task) for task in point_tasks(points, configs, mapper)]
    pending = list(refs)
    with progress_bar(len(refs), quiet) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(len(done))
    return ray.get(refs)
