"""The closed-form cost of a collective, shared by the profiles and the cost model.

It lives once, at the bottom of the import graph, so that ``hwprofiles.schema``
(which costs a group's all-reduce with it) and ``simcore.costmodel`` (which
splits it into the terms calibration fits) cannot drift. The schedules' own
closed forms live with their schedules: Leviathan's expected tokens in
``policies.sd``, SSD's fan-out shape and miss rate in ``policies.ssd``.
"""

from __future__ import annotations

import math


def allreduce_s(algorithm: str, alpha_s: float, bandwidth_bytes_s: float, group: int,
                nbytes: float) -> float:
    """One all-reduce of nbytes over ``group`` members.

    ``alpha_beta``: alpha log2 G + M / bandwidth (the Mirror-SD model);
    ``ring``: 2(G-1) alpha + 2(G-1)/G M / bandwidth;
    ``tree``: 2 log2 G (alpha + M / bandwidth).
    """
    g = group
    if g == 1:
        return 0.0
    bw = bandwidth_bytes_s
    if algorithm == "alpha_beta":
        return alpha_s * math.log2(g) + nbytes / bw
    if algorithm == "ring":
        return 2 * (g - 1) * alpha_s + 2 * (g - 1) / g * nbytes / bw
    return 2 * math.log2(g) * (alpha_s + nbytes / bw)
