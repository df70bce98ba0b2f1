"""The one cost model: operations -> cost terms -> seconds.

``RooflineCost.terms`` turns a Forward (layers, head, rows, group) into its
``ForwardTerms``: per member, FLOPs and bytes as linear functions of the KV
context, kernels, calls, and the collectives it pays (count and message
bytes). ``pass_seconds`` is the one place that turns a pass's coefficients
and the profile's parameter values (``Values``) into seconds; it works on
floats and on numpy arrays (calibration fits every measured pass at once with
it). ``RooflineCost.forward``, the simulator's and the laws' hot path, caches
its rates and evaluates the same expressions (a test holds the two equal bit
for bit on every shipped platform). A pass of k kernels costs

    launch    k * launch_overhead_s + calls * call_overhead_s
    compute   (flops x padding + k * compute_half_flops) / (peak * compute_efficiency)
              [padding: the rows the device's GEMM tiles compute over the pass's
               rows, Device.compute_padding; 1 without tiles]
    memory    (bytes + k * memory_half_bytes)
              / (min(tier bandwidth, memory_bandwidth_gb_s) * memory_efficiency
                 [/ multirow_memory_factor for a pass over several rows: one
                  factor, or a table by the pass's rows, Device.multirow_factor])
    busy      launch + roofline(compute, memory, roofline_exponent)

with roofline the max, or the p-norm (c^p + m^p)^(1/p) where the device sets an
exponent. A Forward on a collective group is sharded evenly over its members
(tensor parallel) and pays its all-reduces on top: 2 per layer unless the
operation says how many, each of rows * hidden * dtype bytes. Transfers,
all-reduces and weight streams are sums of ``value * coef`` and ``coef /
value``: ``hop_terms``, ``allreduce_terms`` and ``stream_terms`` give their
coefficients per profile parameter (``LinearTerms``, what calibration fits;
``dispatch_terms`` the wait before a stream's read, ``stream_dispatch_s``);
``hop_s``, ``allreduce_s`` and ``requests_s`` evaluate them on the simulator's
path.
Every optional term's default (0, 1, None) leaves the roofline exactly as it
was (x + 0.0 and x / 1.0 are exact in floating point).

The software stack (``hwprofiles.stacks``, which prices it too) adds its
host time to a pass's launch term (``ForwardTerms.host_s``), scales its
attention terms and says which experts a mixture-of-experts pass reads; the
default ``compiled`` stack adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hwprofiles.schema import (CollectiveGroup, Device, Link, MemoryTier, ModelSpec, Platform,
                               allreduce_s)
from hwprofiles import stacks
from hwprofiles.stacks import COMPILED, Stack

COLLECTIVES_PER_LAYER = 2  # Mirror-SD: two all-reduces per transformer block


class CostError(ValueError):
    """The platform cannot run an operation as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class Values:
    """The parameter values one pass depends on: floats, or arrays over passes."""

    launch_overhead_s: object
    call_overhead_s: object
    compute_efficiency: object
    memory_efficiency: object
    multirow_memory_factor: object
    roofline_exponent: object  # None: the max (scalar only)
    memory_half_bytes: object
    compute_half_flops: object
    bandwidth_cap_bytes_s: object  # inf: the tier's full bandwidth
    compute_padding: object  # rows its GEMM tiles compute per row (Device.compute_padding)

    @classmethod
    def of(cls, device: Device, tier: MemoryTier, rows: int) -> "Values":
        """The values a pass over ``rows`` rows on ``device`` reading ``tier`` uses."""
        cap = device.memory_bandwidth_gb_s
        return cls(device.launch_overhead_s, device.call_overhead_s,
                   device.compute_efficiency, tier.memory_efficiency,
                   device.multirow_factor(rows), device.roofline_exponent,
                   device.memory_half_bytes, device.compute_half_flops,
                   math.inf if cap is None else cap * 1e9, device.compute_padding(rows))


def flop_rate(peak_flops, v: Values):
    """FLOP/s a pass reaches at large size."""
    return peak_flops * v.compute_efficiency


def one_row_byte_rate(tier_bytes_s, v: Values):
    """Bytes/s a one-row pass reaches at large size: the tier's bandwidth, capped at
    what the engine can draw, times the efficiency (floats or numpy arrays)."""
    if isinstance(tier_bytes_s, np.ndarray):
        return np.minimum(tier_bytes_s, v.bandwidth_cap_bytes_s) * v.memory_efficiency
    return min(tier_bytes_s, v.bandwidth_cap_bytes_s) * v.memory_efficiency


def byte_rate(tier_bytes_s, multirow, v: Values):
    """Bytes/s a pass reaches at large size: ``one_row_byte_rate`` over the
    multi-row factor."""
    rate = one_row_byte_rate(tier_bytes_s, v)
    if isinstance(multirow, np.ndarray):
        return rate / np.where(multirow, v.multirow_memory_factor, 1.0)
    if multirow and v.multirow_memory_factor != 1.0:
        rate /= v.multirow_memory_factor
    return rate


def pass_seconds(kernels, calls, flops, nbytes, multirow, peak_flops, tier_bytes_s,
                 v: Values, head_bytes=0.0, head_factor=None):
    """(launch_s, compute_s, memory_s) of one device pass (module docstring); a
    head projecting another number of rows than the layers streams its
    ``head_bytes`` at its own multi-row factor ``head_factor`` (``head_memory_s``)."""
    launch = kernels * v.launch_overhead_s + calls * v.call_overhead_s
    compute = (flops * v.compute_padding + kernels * v.compute_half_flops) / flop_rate(
        peak_flops, v)
    memory = (nbytes + kernels * v.memory_half_bytes) / byte_rate(tier_bytes_s, multirow, v)
    if head_factor is not None:
        memory = memory + head_memory_s(head_bytes, head_factor, multirow, tier_bytes_s, v)
    return launch, compute, memory


def head_memory_s(head_bytes, head_factor, multirow, tier_bytes_s, v: Values):
    """What a head's weights add to a pass's memory time when its GEMM projects
    another number of rows than the layers' (a sampled head projects one position
    of a pass over several): its bytes at its own width's multi-row factor less
    at the layers'. 0 where the two factors are equal."""
    if isinstance(multirow, np.ndarray):
        rows_factor = np.where(multirow, v.multirow_memory_factor, 1.0)
    else:
        rows_factor = v.multirow_memory_factor if multirow else 1.0
    return head_bytes * (head_factor - rows_factor) / one_row_byte_rate(tier_bytes_s, v)


def roofline(compute_s, memory_s, exponent):
    """max(c, m), or the smooth (c^p + m^p)^(1/p): p = 1 adds them, p -> inf is max.
    Floats or numpy arrays (then ``exponent`` is an array of p)."""
    if isinstance(compute_s, np.ndarray):
        longer = np.maximum(np.maximum(compute_s, memory_s), 1e-300)
        p = exponent
        return longer * ((compute_s / longer) ** p + (memory_s / longer) ** p) ** (1.0 / p)
    longer = max(compute_s, memory_s)
    if exponent is None or longer <= 0:
        return longer
    return longer * ((compute_s / longer) ** exponent
                     + (memory_s / longer) ** exponent) ** (1.0 / exponent)


class ForwardCost(NamedTuple):
    """Per-member cost of one Forward (members of a group work in parallel). A
    named tuple: the simulator builds one per Forward, and a tuple is the
    cheapest immutable record to build."""

    launch_s: float
    compute_s: float
    memory_s: float
    collective_s: float
    flops: float
    nbytes: float
    tier: str
    exponent: float | None = None  # the device's roofline_exponent
    # bytes/s the pass streams at on a device with a bandwidth cap (None: uncapped);
    # under contention its flow takes at most this much of the shared tier
    rate_cap: float | None = None
    # a stack whose launches are asynchronous (hwprofiles.stacks): its host
    # dispatch, overlapped with the device's time by host_exponent, then its sync
    host_s: float = 0.0
    host_exponent: float | None = None
    sync_s: float = 0.0

    @property
    def busy_s(self) -> float:
        """Launch plus the roofline term, without collectives (and, under a stack
        with asynchronous launches, overlapped with its host dispatch)."""
        device = self.launch_s + roofline(self.compute_s, self.memory_s, self.exponent)
        if self.host_exponent is None:
            return device
        return stacks.overlapped(self.host_s, device, self.host_exponent) + self.sync_s

    @property
    def total_s(self) -> float:
        return self.busy_s + self.collective_s


@dataclass(frozen=True, slots=True)
class ForwardTerms:
    """A Forward's cost coefficients, per member, context-free: FLOPs and bytes are
    linear in the KV context (``flops0 + flops_ctx * context``)."""

    flops0: float
    flops_ctx: float
    bytes0: float
    bytes_ctx: float
    members: int
    kernels: int
    rows: int
    peak_flops: float
    tier_bytes_s: float
    device: str
    tier: str
    group: str | None
    collectives: int  # all-reduces on top (0 on one device)
    message_bytes: float  # bytes of each all-reduce
    alltoalls: int = 0  # expert parallelism's dispatches and combines
    alltoall_bytes: float = 0.0  # bytes one member sends in each (ModelSpec.dispatch_bytes)
    # the software stack's host time for the pass (hwprofiles.stacks): its
    # dispatch and its sync after the pass
    host_s: float = 0.0
    sync_s: float = 0.0
    # the head's weight bytes (per member) and the rows its GEMM projects (0: no head)
    head_bytes: float = 0.0
    head_rows: int = 0

    def flops(self, context: int) -> float:
        return (self.flops0 + self.flops_ctx * context) / self.members

    def nbytes(self, context: int) -> float:
        return (self.bytes0 + self.bytes_ctx * context) / self.members


def _peak(device, dtype: str) -> float:
    peaks = device.peak_flops
    for name in (dtype, {"bf16": "fp16", "fp16": "bf16"}.get(dtype, dtype), "fp32"):
        if name in peaks:
            return peaks[name]
    raise CostError(f"device {device.name} has no peak_flops for {dtype}; add "
                    f"peak_flops.{dtype} to the platform file")


EIGHT_BIT = ("fp8", "int8")  # the 8-bit peaks compute_bits=8 takes, in this order


def compute_peak(device, spec: ModelSpec) -> float:
    """FLOP/s of a device for the model's matrix products: at ``compute_bits=8``
    the device's FP8 peak, or its INT8 peak where it has no FP8; otherwise the
    peak of the model's dtype (at ``compute_bits=16``, its 16-bit one)."""
    if spec.compute_bits == 16 and spec.dtype not in ("bf16", "fp16"):
        return _peak(device, "bf16")
    if spec.compute_bits != 8:
        return _peak(device, spec.dtype)
    for dtype in EIGHT_BIT:
        if dtype in device.peak_flops:
            return device.peak_flops[dtype]
    raise CostError(f"compute_bits=8 needs an 8-bit peak on device {device.name}, whose "
                    f"profile gives peak_flops for {', '.join(device.peak_flops)} only; "
                    "add peak_flops.fp8 or int8 with its source, or drop compute_bits")


def forward_shape(spec: ModelSpec, layers: tuple[int, int], n_tokens: int, batch: int,
                  head: str | None, head_tokens: int | None):
    """(flops0, flops_ctx, bytes0, bytes_ctx, kernels) of a Forward over all members.
    The head projects ``head_tokens`` positions per row (None: all n_tokens); its
    weights are read once either way; "lm" is the model's own head (``ModelSpec.own_head``),
    an exit head a trained draft vocabulary's where the model has one
    (``ModelSpec.projection_params``). An "exit_layer" head adds a decoder layer."""
    n_layers = layers[1] - layers[0]
    if n_layers < 0 or layers[0] < 0 or layers[1] > spec.n_layers:
        raise CostError(f"layers {layers} fall outside {spec.name}'s "
                        f"{spec.n_layers} layers")
    rows = n_tokens * batch
    layer0 = spec.layer_flops(n_tokens, 0) * batch
    layer_ctx = (spec.layer_flops(n_tokens, 1) - spec.layer_flops(n_tokens, 0)) * batch
    kv = spec.kv_bytes_per_token_layer()
    flops0, flops_ctx = n_layers * layer0, n_layers * layer_ctx
    bytes0 = n_layers * (spec.layer_weight_bytes_read(rows) + kv * n_tokens * batch)
    bytes_ctx = n_layers * kv * batch
    kernels = n_layers
    if head is not None:
        flops0 += spec.head_flops(rows if head_tokens is None else head_tokens * batch, head,
                                  layers[1])
        bytes0 += spec.projection_bytes(head, layers[1])
        kernels += 1
    if head is not None and spec.head_kind(head) == "exit_layer":  # a layer of its own
        flops0 += layer0
        flops_ctx += layer_ctx
        bytes0 += spec.layer_weight_bytes_read(rows) + kv * n_tokens * batch
        bytes_ctx += kv * batch
        kernels += 1
    return flops0, flops_ctx, bytes0, bytes_ctx, kernels


@dataclass(frozen=True)
class LinearTerms:
    """An operation's seconds as fixed_s + sum(value * coef) over ``linear`` +
    sum(coef / value) over ``inverse``; each entry is (kind, name, field, coef),
    naming the profile parameter (kind: device, tier, link or group). Transfers,
    all-reduces and weight streams are written so, once: calibration fits the
    named parameters, ``seconds`` evaluates them (equal to ``hop_s`` and
    ``allreduce_s`` to rounding, and a weight stream to its closed form; tests hold
    them together)."""

    fixed_s: float = 0.0
    linear: tuple = ()
    inverse: tuple = ()

    def seconds(self, platform: Platform) -> float:
        def value(kind, name, field):
            obj = {"device": platform.device, "tier": platform.tier,
                   "group": platform.group,
                   "link": lambda n: next(l for l in platform.links if l.name == n)}[kind](name)
            return getattr(obj, field)
        return (self.fixed_s + sum(value(k, n, f) * c for k, n, f, c in self.linear)
                + sum(c / value(k, n, f) for k, n, f, c in self.inverse))

    def __add__(self, other: "LinearTerms") -> "LinearTerms":
        return LinearTerms(self.fixed_s + other.fixed_s, self.linear + other.linear,
                           self.inverse + other.inverse)


def hop_terms(link: Link, nbytes: float) -> LinearTerms:
    """One hop: latency + bytes / bandwidth."""
    return LinearTerms(0.0, (("link", link.name, "latency_s", 1.0),),
                       (("link", link.name, "bandwidth_gb_s", nbytes / 1e9),))


def allreduce_terms(group: CollectiveGroup, nbytes: float, count: float = 1,
                    bandwidth_factor: float = 1.0) -> LinearTerms:
    """count all-reduces of nbytes: the group's algorithm split into its alpha part
    and its per-byte part (``hwprofiles.schema.allreduce_s``), its base as given;
    the bytes move at ``bandwidth_factor`` x the group's bandwidth (a stack's
    ``allreduce_bandwidth_factor``)."""
    g, alg = group.size, group.algorithm
    alpha_coef = count * allreduce_s(alg, 1.0, math.inf, g, nbytes)
    # seconds at 1 GB/s of the group's bandwidth
    beta_coef = count * allreduce_s(alg, 0.0, 1e9 * bandwidth_factor, g, nbytes)
    base_s = count * group.base_s if g > 1 else 0.0
    return LinearTerms(base_s, (("group", group.name, "alpha_s", alpha_coef),),
                       (("group", group.name, "bandwidth_gb_s", beta_coef),))


def stream_terms(tier: MemoryTier, device: Device, nbytes: float) -> LinearTerms:
    """A weight stream: the tier's latency, its requests (``requests_s``), bytes at
    the tier's achieved bandwidth (at the share its requests in flight reach),
    the host copy and, on a device that installs the weights itself, bytes at its
    host rate (a read alone, page cache missed)."""
    linear = ()
    if tier.request_bytes is not None:
        linear = (("tier", tier.name, "request_latency_s",
                   math.ceil(nbytes / tier.request_bytes) / tier.queue_depth),)
    inverse = (("tier", tier.name, "bandwidth_gb_s",
                nbytes / 1e9 / tier.memory_efficiency / tier.read_fraction(nbytes)),)
    fixed_s = tier.latency_s  # + the host copy after the read (schema), kept as given
    if tier.host_copy_gb_s is not None:
        fixed_s += nbytes / (tier.host_copy_gb_s * 1e9)
    if device.stream_host_gb_s is not None:
        inverse += (("device", device.name, "stream_host_gb_s", nbytes / 1e9),)
    return LinearTerms(fixed_s, linear, inverse)


def dispatch_terms(device: Device) -> LinearTerms:
    """Issuing a weight stream on its device's compute stream before its read
    (``Device.stream_dispatch_s``); calibration adds the compute it queued behind."""
    return LinearTerms(0.0, (("device", device.name, "stream_dispatch_s", 1.0),))


class RooflineCost:
    """Predicts seconds for each operation kind on one platform, under one
    software stack (default: ``compiled``, which adds nothing)."""

    def __init__(self, platform: Platform, stack: Stack | None = None):
        self.platform = platform
        self.stack = COMPILED if stack is None else stack
        self._cache: dict[tuple, tuple] = {}
        self._terms: dict[tuple, ForwardTerms] = {}

    def terms(self, spec: ModelSpec, where: str, layers: tuple[int, int], n_tokens: int,
              batch: int, head: str | None, collectives: int | None,
              head_tokens: int | None = None) -> ForwardTerms:
        """The cost coefficients of a Forward on a device or group (cached)."""
        n_tokens, batch, _ = stacks.scored_shape(self.stack, n_tokens, batch, 0, head,
                                                 head_tokens)
        key = (spec.cost_key, where, layers, n_tokens, batch, head, collectives, head_tokens)
        found = self._terms.get(key)
        if found is None:
            found = self._terms[key] = self._make_terms(
                spec, where, layers, n_tokens, batch, head, collectives, head_tokens)
        return found

    def _make_terms(self, spec, where, layers, n_tokens, batch, head, collectives,
                    head_tokens) -> ForwardTerms:
        p = self.platform
        members = p.members(where)
        device = p.device(members[0])
        tier = p.tier(device.memory)
        flops0, flops_ctx, bytes0, bytes_ctx, kernels = forward_shape(
            spec, layers, n_tokens, batch, head, head_tokens)
        rows = n_tokens * batch
        count = alltoalls = 0
        n_layers = layers[1] - layers[0]
        stack = self.stack.on(device.backend)
        factor = stack.attention_context_factor
        flops_ctx, bytes_ctx = flops_ctx * factor, bytes_ctx * factor
        bytes0 += stacks.extra_expert_bytes(stack, spec, n_layers, rows)
        host, sync = stacks.host_s(stack, spec, n_layers, kernels, rows, head, batch)
        if len(members) > 1:
            count = COLLECTIVES_PER_LAYER * n_layers if collectives is None else collectives
            if spec.expert_parallel and collectives is None:
                # attention keeps one all-reduce per layer; the experts dispatch and
                # combine their tokens by all-to-all (CollectiveGroup.alltoall_s)
                count, alltoalls = n_layers, 2 * n_layers
        return ForwardTerms(flops0, flops_ctx, bytes0, bytes_ctx, len(members), kernels,
                            rows, compute_peak(device, spec), tier.bandwidth_bytes_s,
                            device.name, tier.name, where if len(members) > 1 else None,
                            count, rows * spec.hidden * spec.dtype_bytes, alltoalls,
                            spec.dispatch_bytes(rows, len(members)) if alltoalls else 0.0,
                            host, sync,
                            spec.projection_bytes(head, layers[1]) / len(members)
                            if head is not None else 0.0,
                            0 if head is None else rows if head_tokens is None
                            else head_tokens * batch)

    def forward(self, spec: ModelSpec, where: str, layers: tuple[int, int],
                n_tokens: int, batch: int, context: int, head: str | None,
                collectives: int | None, head_tokens: int | None = None) -> ForwardCost:
        """Cost of running layers of spec over n_tokens new positions per row that
        attend to ``context`` cached ones, on a device or a group (in the shape the
        stack runs it: ``stacks.scored_shape``)."""
        n_tokens, batch, context = stacks.scored_shape(self.stack, n_tokens, batch, context,
                                                       head, head_tokens)
        key = (spec.cost_key, where, layers, n_tokens, batch, head, collectives, head_tokens)
        shape = self._cache.get(key)
        if shape is None:
            shape = self._cache[key] = self._shape(self.terms(
                spec, where, layers, n_tokens, batch, head, collectives, head_tokens))
        (t, flop_rate_, byte_rate_, half_flops, half_bytes, launch_s, collective_s,
         exponent, rate_cap, head_s, host, padding) = shape
        flops = (t.flops0 + t.flops_ctx * context) / t.members
        nbytes = (t.bytes0 + t.bytes_ctx * context) / t.members
        return ForwardCost(launch_s, (flops * padding + half_flops) / flop_rate_,
                           (nbytes + half_bytes) / byte_rate_ + head_s, collective_s, flops,
                           nbytes,
                           t.tier, exponent, rate_cap, *host)

    def _shape(self, t: ForwardTerms) -> tuple:
        """The context-free evaluation of a Forward's terms: the rates and fixed parts
        of ``pass_seconds``, so a step only adds context times the per-position terms."""
        device = self.platform.device(t.device)
        v = Values.of(device, self.platform.tier(t.tier), t.rows)
        launch_s = t.kernels * v.launch_overhead_s + v.call_overhead_s
        host = ()  # a stack's host time: serial (in the launch) or overlapped
        stack = self.stack.on(device.backend)
        p = stack.host_device_exponent
        if p is None:
            launch_s += t.host_s + t.sync_s
        elif t.host_s or t.sync_s:
            host = (t.host_s, p, t.sync_s)
        collective_s = 0.0
        if t.collectives:
            collective_s = t.collectives * self.platform.group(t.group).allreduce_s(
                t.message_bytes, stack.allreduce_bandwidth_factor)
        if t.alltoalls:
            collective_s += t.alltoalls * self.platform.group(t.group).alltoall_s(
                t.alltoall_bytes)
        rate = byte_rate(t.tier_bytes_s, t.rows > 1, v)
        head_s = 0.0  # a head over other rows than the layers' (head_memory_s)
        head_factor = device.multirow_factor(t.head_rows)
        if t.head_bytes and head_factor != v.multirow_memory_factor:
            head_s = head_memory_s(t.head_bytes, head_factor, t.rows > 1, t.tier_bytes_s, v)
        return (t, flop_rate(t.peak_flops, v), rate,
                t.kernels * v.compute_half_flops, t.kernels * v.memory_half_bytes,
                launch_s, collective_s, v.roofline_exponent,
                None if device.memory_bandwidth_gb_s is None else rate, head_s, host,
                v.compute_padding)

    def verify_s(self) -> float:
        """Host seconds the stack spends on one Verify (its bookkeeping)."""
        return self.stack.verify_host_s

    @staticmethod
    def hop_s(link: Link, nbytes: float) -> float:
        return link.latency_s + nbytes / link.bandwidth_bytes_s

    def allreduce_s(self, group: str, nbytes: float, count: int = 1) -> float:
        g = self.platform.group(group)
        if g is None:
            raise CostError(f"'{group}' is not a collective group of platform "
                            f"{self.platform.name}")
        return count * g.allreduce_s(nbytes)

    def lookup_s(self, rows: int) -> float:
        """A prompt lookup (``policies.ops.Lookup``) over ``rows`` rows on the host."""
        return self.platform.host_lookup_s * rows

    @staticmethod
    def stream_host_s(device, nbytes: float) -> float:
        """Seconds the device's compute engine spends installing nbytes of streamed
        weights (0 for a device that streams by DMA)."""
        rate = device.stream_host_gb_s
        return 0.0 if rate is None else nbytes / (rate * 1e9)

    @staticmethod
    def stream_dispatch_s(device) -> float:
        """Seconds a weight stream on the device waits, once free to start, before
        its read begins (``dispatch_terms``)."""
        return device.stream_dispatch_s

    @staticmethod
    def requests_s(tier: MemoryTier, nbytes: float) -> float:
        """The per-request part of reading nbytes from a tier: ceil(b / request_bytes)
        requests, queue_depth outstanding at once, each request_latency_s."""
        if not tier.request_latency_s:
            return 0.0
        return math.ceil(nbytes / tier.request_bytes) * tier.request_latency_s / tier.queue_depth
