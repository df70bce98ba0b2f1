"""Expert parallelism: the collectives of a mixture-of-experts Forward on a group.

Under tensor parallelism every expert is sliced over the group's members and a
layer pays Megatron's two all-reduces. Under expert parallelism
(``ModelSpec.expert_parallel``) attention stays tensor-parallel (one all-reduce
per layer, after it), while the routed experts are placed whole, E/G per member:
each member owns rows/G of the tokens and sends each of its tokens' k expert
copies to the member holding that expert (dispatch), then gets the results back
(combine). Routing is uniform, so (G-1)/G of the copies leave their member.

An all-to-all is G-1 pairwise exchanges on the group's links: (G-1) alpha plus
the bytes a member sends over the group's bandwidth. The weight bytes a pass
reads are the same in expectation under either sharding (the distinct experts
the rows touch, spread over the members), so only the collectives differ.
"""

from __future__ import annotations

from hwprofiles.schema import CollectiveGroup, ModelSpec


def alltoall_s(group: CollectiveGroup, nbytes_sent: float) -> float:
    """One all-to-all in which each member sends ``nbytes_sent`` to the others."""
    g = group.size
    if g == 1:
        return 0.0
    return (g - 1) * group.alpha_s + nbytes_sent / (group.bandwidth_gb_s * 1e9)


def dispatch_bytes(spec: ModelSpec, rows: int, group_size: int) -> float:
    """Bytes one member sends in one dispatch (or combine) of a layer."""
    g = group_size
    copies = rows / g * spec.n_active_experts * (g - 1) / g
    return copies * spec.hidden * spec.dtype_bytes

