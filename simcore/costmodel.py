"""Roofline cost model: launch + max(flops / (peak * eff), bytes / (bw * eff)).

Efficiency factors and launch overheads live in the platform profile, where
calibration fits them. A Forward on a collective group is sharded evenly over
its members (tensor parallel) and pays its all-reduces on top. Optional device
terms, off by default: a per-call overhead, a roofline exponent (memory and
compute time combine as a p-norm instead of a max: they partly add), a
memory factor for passes over more than one row, and the host time of
installing streamed weights on a device without a DMA engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from hwprofiles.schema import Link, MemoryTier, ModelSpec, Platform
from simcore.moe import expert_parallel_s


class CostError(ValueError):
    """The platform cannot run an operation as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class ForwardCost:
    """Per-member cost of one Forward (members of a group work in parallel)."""

    launch_s: float
    compute_s: float
    memory_s: float
    collective_s: float
    flops: float
    nbytes: float
    tier: str
    exponent: float | None = None  # the device's roofline_exponent

    @property
    def busy_s(self) -> float:
        """Launch plus the roofline term, without collectives: max(compute, memory),
        or with a roofline exponent p, (compute^p + memory^p)^(1/p)."""
        return self.launch_s + roofline(self.compute_s, self.memory_s, self.exponent)

    @property
    def total_s(self) -> float:
        return self.busy_s + self.collective_s


def roofline(compute_s: float, memory_s: float, exponent: float | None) -> float:
    """max(c, m), or the smooth (c^p + m^p)^(1/p): p = 1 adds them, p -> inf is max."""
    longer = max(compute_s, memory_s)
    if exponent is None or longer <= 0:
        return longer
    return longer * ((compute_s / longer) ** exponent
                     + (memory_s / longer) ** exponent) ** (1.0 / exponent)


def _peak(device, dtype: str) -> float:
    peaks = device.peak_flops
    for name in (dtype, {"bf16": "fp16", "fp16": "bf16"}.get(dtype, dtype), "fp32"):
        if name in peaks:
            return peaks[name]
    raise CostError(f"device {device.name} has no peak_flops for {dtype}; add "
                    f"peak_flops.{dtype} to the platform file")


class RooflineCost:
    """Predicts seconds for each operation kind on one platform."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self._cache: dict[tuple, tuple] = {}

    def forward(self, spec: ModelSpec, where: str, layers: tuple[int, int],
                n_tokens: int, batch: int, context: int, head: str | None,
                collectives: int | None, head_tokens: int | None = None) -> ForwardCost:
        """Cost of running layers of spec over n_tokens new positions per row that
        attend to ``context`` cached ones, on a device or a group. The head projects
        ``head_tokens`` positions per row (None: all n_tokens); its weights are read
        once either way."""
        key = (spec.cost_key, where, layers, n_tokens, batch, head, collectives, head_tokens)
        shape = self._cache.get(key)
        if shape is None:
            shape = self._cache[key] = self._shape(spec, where, layers, n_tokens, batch,
                                                   head, collectives, head_tokens)
        (flops0, flops_ctx, bytes0, bytes_ctx, g, flop_rate, byte_rate, launch_s,
         collective_s, tier, exponent) = shape
        flops = (flops0 + flops_ctx * context) / g
        nbytes = (bytes0 + bytes_ctx * context) / g
        return ForwardCost(launch_s, flops / flop_rate, nbytes / byte_rate, collective_s,
                           flops, nbytes, tier, exponent)

    def _shape(self, spec: ModelSpec, where: str, layers: tuple[int, int], n_tokens: int,
               batch: int, head: str | None, collectives: int | None,
               head_tokens: int | None = None) -> tuple:
        """The context-free part of a Forward's cost; FLOPs and bytes are linear in
        context, so a step only adds context times the per-position terms."""
        p = self.platform
        members = p.members(where)
        g = len(members)
        device = p.device(members[0])
        tier = p.tier(device.memory)
        n_layers = layers[1] - layers[0]
        if n_layers < 0 or layers[0] < 0 or layers[1] > spec.n_layers:
            raise CostError(f"layers {layers} fall outside {spec.name}'s "
                            f"{spec.n_layers} layers")
        rows = n_tokens * batch
        flops0 = n_layers * spec.layer_flops(n_tokens, 0) * batch
        flops_ctx = n_layers * (spec.layer_flops(n_tokens, 1) - spec.layer_flops(n_tokens, 0)) * batch
        kv = spec.kv_bytes_per_token_layer()
        bytes0 = n_layers * (spec.layer_weight_bytes_read(rows) + kv * n_tokens * batch)
        bytes_ctx = n_layers * kv * batch
        kernels = n_layers
        if head is not None:
            flops0 += spec.head_flops(rows if head_tokens is None else head_tokens * batch)
            bytes0 += spec.head_bytes
            kernels += 1
        if head == "exit_layer":  # an early-exit head with a decoder layer of its own
            flops0 += spec.layer_flops(n_tokens, 0) * batch
            flops_ctx += (spec.layer_flops(n_tokens, 1) - spec.layer_flops(n_tokens, 0)) * batch
            bytes0 += spec.layer_weight_bytes_read(rows) + kv * n_tokens * batch
            bytes_ctx += kv * batch
            kernels += 1
        collective_s = 0.0
        if g > 1:
            count = 2 * n_layers if collectives is None else collectives
            collective_s = count * p.group(where).allreduce_s(rows * spec.hidden * spec.dtype_bytes)
            if spec.expert_parallel and collectives is None:  # simcore.moe: all-to-alls
                collective_s = expert_parallel_s(p.group(where), spec, rows, n_layers)
        byte_rate = tier.bandwidth_bytes_s * tier.memory_efficiency
        if rows > 1 and device.multirow_memory_factor != 1.0:
            byte_rate /= device.multirow_memory_factor
        launch_s = device.launch_overhead_s * kernels
        if device.call_overhead_s:
            launch_s += device.call_overhead_s
        return (flops0, flops_ctx, bytes0, bytes_ctx, g,
                _peak(device, spec.dtype) * device.compute_efficiency,
                byte_rate, launch_s, collective_s, tier.name, device.roofline_exponent)

    @staticmethod
    def hop_s(link: Link, nbytes: float) -> float:
        return link.latency_s + nbytes / link.bandwidth_bytes_s

    def allreduce_s(self, group: str, nbytes: float, count: int = 1) -> float:
        g = self.platform.group(group)
        if g is None:
            raise CostError(f"'{group}' is not a collective group of platform "
                            f"{self.platform.name}")
        return count * g.allreduce_s(nbytes)

    @staticmethod
    def stream_host_s(device, nbytes: float) -> float:
        """Seconds the device's compute engine spends installing nbytes of streamed
        weights (0 for a device that streams by DMA)."""
        rate = device.stream_host_gb_s
        return 0.0 if rate is None else nbytes / (rate * 1e9)

    @staticmethod
    def tier_s(tier: MemoryTier, nbytes: float) -> float:
        return tier.latency_s + nbytes / (tier.bandwidth_bytes_s * tier.memory_efficiency)
