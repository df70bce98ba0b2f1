"""Pydantic schemas for hardware platforms (model specs: ``hwprofiles.models``),
and a run's placement on one (``resolve``: which device or group plays each role
of a schedule, ``target``, ``draft``, ``stage0``, ...: the platform's default
placement with a run's overrides on top; every runtime and analysis resolves a
run's placement here, once).

Every schema is frozen and forbids unknown fields. Field names carry their unit
(``_s`` seconds, ``_bytes`` bytes, ``_gb_s`` gigabytes per second, ``_flops``
floating-point operations per second). Every numeric field that a file sets must
be named in that object's ``sources`` mapping (spec sheet, paper, measurement):
a number without a source is a validation error.

Numbers are finite numbers (``hwprofiles.numbers``: no true/false, no .inf or
.nan; numeric strings such as ``80.0e9`` are read as numbers) inside ranges that
real hardware and published models stay far within. A value outside them is a
typo or a unit slip, and would overflow or underflow the cost model's arithmetic
(``bandwidth_gb_s * 1e9``, ``bytes / rate``) to inf or 0.

Efficiency terms real hardware has, each optional with a default that leaves
the roofline as it is (``simcore.costmodel`` charges them; ``hetspec calibrate``
fits them where spans constrain them). Like every number, a value set in a file
needs a source (a measurement, a calibration, a paper's table):

- ``Device.call_overhead_s`` (s): host time per Forward call (framework dispatch,
  result handling), charged once per Forward on top of per-kernel launches.
- ``Device.memory_half_bytes`` (bytes per kernel): the operation size at which a
  kernel reaches half its peak bandwidth; a pass of k kernels reading b bytes
  takes (b + k * memory_half_bytes) / rate, so small GEMVs reach a small fraction
  of peak (0: every kernel streams at peak). The cost model counts one kernel per
  decoder layer and one per head (as ``launch_overhead_s`` does), so the value is
  per layer's worth of GEMVs.
- ``Device.compute_half_flops`` (FLOPs per kernel): the same for compute time.
- ``Device.memory_bandwidth_gb_s`` (GB/s): the most of its memory tier's bandwidth
  this engine can draw (an SoC's GPU reaching part of the shared DRAM's peak);
  None: the tier's full bandwidth.
- ``MemoryTier.memory_efficiency`` (fraction): achieved over peak bandwidth; on a
  flash tier its read efficiency.
- ``MemoryTier.request_latency_s`` (s), ``request_bytes`` (bytes) and
  ``queue_depth`` (requests): a flash read of b bytes is ceil(b / request_bytes)
  requests, ``queue_depth`` of them outstanding at once, each adding
  ``request_latency_s``: the read takes latency_s + b / (bandwidth *
  memory_efficiency) + ceil(b / request_bytes) * request_latency_s / queue_depth.
- Flash streaming as measured (``MemoryTier``, flash tiers only; ``docs/flash.md``
  has the sources and the fit). Unset, a stream is as above: bytes at the tier's
  bandwidth, beside compute.

  * ``read_half_bytes`` (bytes) and ``read_curve_exponent``: reads reach
    x / (1 + x) of the tier's bandwidth, x = (outstanding / read_half_bytes) **
    read_curve_exponent, outstanding = request_bytes * queue_depth (the whole
    stream when request_bytes is unset): small reads are slow, throughput rises
    with the bytes in flight and saturates (fio on a Jetson AGX Orin NVMe).
  * ``page_cache_bytes`` (bytes): DRAM that keeps this tier's recently read
    chunks, least recently used first out; a chunk found there is not read again.
    A cyclic stream larger than it keeps nothing (LRU), as mmap runs of models
    larger than DRAM show. 0: every stream reads flash (O_DIRECT, or a budget
    that leaves no DRAM for the file's pages).
  * ``host_copy_gb_s`` (GB/s): the host-side copy / dequantisation of streamed
    bytes after the read (page cache to buffer, buffer to the device's memory),
    in series with the read; under ``contention`` it also draws 2 bytes (read and
    write) per byte from the streaming device's memory tier, the DRAM a
    unified-memory SoC shares with compute. None: no copy.
  * ``stream_overlap_fraction``: how much a stream and the compute of the device
    streaming it overlap: a stream of s seconds beside compute of c seconds
    takes max(s, c) + (1 - fraction) * min(s, c) together (1: perfect overlap,
    the default; 0: they serialize, as a loader that reads on the thread that
    issues compute does).
- ``Device.stream_dispatch_s`` (s): host time issuing a weight stream once it is
  free to start (the read before it done, a buffer slot free), on the device's
  own compute stream, after the compute queued before it: in the torch
  executor, the previous read's reply to the coordinator, the coordinator's
  next command and the worker's core issuing the read. 0: a stream starts at
  once, beside compute.
- ``Platform.host_lookup_s`` (s): host CPU time of one prompt lookup (an n-gram
  proposal, ``policies.ngram``) for one row, beside the target; 0: free.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from pydantic import Field, model_validator

# the model spec lives in hwprofiles.models; importing it from here keeps working
from hwprofiles.models import (BITS, DTYPE_BYTES, MAX_LAYERS, Bits, Dtype,  # noqa: F401
                               ModelSpec)
from hwprofiles.numbers import Sourced

# Ranges of the physical quantities (see the module docstring).
MAX_CAPACITY_BYTES = 1e18  # one exabyte: no memory tier holds more
MIN_GB_S = 1e-3  # 1 MB/s: slower than any memory or link a model is served over
MAX_GB_S = 1e12  # 1 ZB/s: above any real bandwidth; room for idealised links
MIN_FLOPS, MAX_FLOPS = 1e6, 1e21  # 1 MFLOP/s .. 1 ZFLOP/s per device and dtype
MAX_TIME_S = 1e3  # no latency or per-call overhead lasts a quarter of an hour
MIN_EFFICIENCY = 1e-6  # a fitted efficiency is >= 1e-4 (analyses.calibrate.costfit)
MAX_QUEUE_DEPTH = 65536  # NVMe allows 64K commands per queue
MAX_HALF_BYTES = 1e12  # a kernel needing a terabyte to reach half its bandwidth is a slip
MAX_HALF_FLOPS = 1e18


# the fields only a flash tier's weight streams use
FLASH_FIELDS = ("read_half_bytes", "read_curve_exponent", "page_cache_bytes",
                "host_copy_gb_s", "stream_overlap_fraction")


class MemoryTier(Sourced):
    name: str
    kind: Literal["hbm", "dram", "flash", "sram"]
    capacity_bytes: float = Field(gt=0, le=MAX_CAPACITY_BYTES)
    bandwidth_gb_s: float = Field(ge=MIN_GB_S, le=MAX_GB_S)
    latency_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    memory_efficiency: float = Field(default=1.0, ge=MIN_EFFICIENCY, le=1)
    # per-request cost of reads (flash): see the module docstring
    request_latency_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    request_bytes: float | None = Field(default=None, ge=512, le=MAX_CAPACITY_BYTES)
    queue_depth: int = Field(default=1, ge=1, le=MAX_QUEUE_DEPTH)
    # flash streaming as measured (module docstring); defaults leave streams as they were
    read_half_bytes: float | None = Field(default=None, ge=1, le=MAX_CAPACITY_BYTES)
    read_curve_exponent: float = Field(default=1.0, ge=0.05, le=8)
    page_cache_bytes: float = Field(default=0.0, ge=0, le=MAX_CAPACITY_BYTES)
    host_copy_gb_s: float | None = Field(default=None, ge=MIN_GB_S, le=MAX_GB_S)
    stream_overlap_fraction: float = Field(default=1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _requests_sized(self):
        if self.request_latency_s > 0 and self.request_bytes is None:
            raise ValueError(f"memory tier {self.name} sets request_latency_s but no "
                             "request_bytes; set the size of one read request and its "
                             "source")
        if self.kind != "flash":
            for name in FLASH_FIELDS:
                if name in self.model_fields_set:
                    raise ValueError(f"memory tier {self.name} is kind {self.kind} but sets "
                                     f"{name}, which only a flash tier's streams use; "
                                     "remove it or set kind: flash")
        return self

    def read_fraction(self, nbytes: float) -> float:
        """The share of the tier's bandwidth a stream of nbytes reaches with its
        requests in flight (``read_half_bytes``; 1 when unset)."""
        if self.read_half_bytes is None:
            return 1.0
        outstanding = nbytes if self.request_bytes is None else min(
            nbytes, self.request_bytes * self.queue_depth)
        x = (outstanding / self.read_half_bytes) ** self.read_curve_exponent
        return x / (1.0 + x)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s * 1e9


MAX_MULTIROW_ROWS = 1 << 20  # widths a multi-row factor table may list
MAX_TILE_ROWS = 1024  # the tallest GEMM row tile a device may list


def width_weights(widths: list[int], rows: int) -> tuple[tuple[int, float], ...]:
    """(index into ``widths``, weight) pairs that interpolate a per-width value at
    ``rows``: linear in rows between the two listed widths around it, the nearest
    width's value outside them. ``widths`` sorted ascending, not empty."""
    if rows <= widths[0]:
        return ((0, 1.0),)
    if rows >= widths[-1]:
        return ((len(widths) - 1, 1.0),)
    hi = next(i for i, w in enumerate(widths) if w >= rows)
    if widths[hi] == rows:
        return ((hi, 1.0),)
    share = (rows - widths[hi - 1]) / (widths[hi] - widths[hi - 1])
    return ((hi - 1, 1.0 - share), (hi, share))


class Device(Sourced):
    name: str
    kind: Literal["gpu", "npu", "cpu"]
    peak_flops: dict[Dtype, float] = Field(min_length=1)
    memory: str
    launch_overhead_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    compute_efficiency: float = Field(default=1.0, ge=MIN_EFFICIENCY, le=1)
    storage: str | None = None  # the flash tier weights stream from, if any
    # the compute API frameworks drive the device through (cuda, metal, ...): a
    # software stack may price its host time per backend (hwprofiles.stacks)
    backend: str | None = Field(default=None, min_length=1)
    # Optional cost-model terms (defaults leave the roofline as it is):
    # host time per Forward call (dispatch, result handling), on top of launches;
    call_overhead_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    # how memory and compute time combine: (m^p + c^p)^(1/p); None: max(m, c), the
    # roofline; 1: they add (single-thread CPU GEMM); between: partly overlapped;
    roofline_exponent: float | None = Field(default=None, ge=1)
    # weight-streaming time of a pass over more than one row relative to a one-row
    # pass (CPU BLAS: GEMM packs its operand, GEMV streams it once): one factor for
    # every width, or a table by a pass's rows (positions x batch rows) measured at
    # those widths (a CPU GEMM's cost moves unevenly with its rows: its kernels
    # block rows by 4 or 8); see ``multirow_factor``.
    multirow_memory_factor: float | dict[int, float] = Field(default=1.0)
    # the row heights, largest first and ending in 1, of the tiles this device's GEMM
    # kernels cover a pass over several rows with: the rows are covered greedily and
    # every tile computes as many rows as the largest (a CPU BLAS with tiles of
    # 4, 2 and 1 rows computes 11 rows as 16: 4 + 4 + 2 + 1), so a pass's compute is
    # billed on ``compute_rows``; None: on its rows. A one-row pass is a GEMV.
    gemm_row_tiles: tuple[int, ...] | None = None
    # bytes per second this device's own compute engine installs streamed weights at
    # (a CPU that reads and deserializes layers on the core it computes on); set, a
    # StreamWeights holds the device after its read for bytes / this rate (see
    # simcore.engine); None: a DMA engine streams beside compute.
    stream_host_gb_s: float | None = Field(default=None, ge=MIN_GB_S, le=MAX_GB_S)
    # seconds of this device's compute stream that issuing each weight stream takes
    # before its read begins (module docstring); 0: none
    stream_dispatch_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    # size-dependent efficiency and a per-engine bandwidth cap (module docstring)
    memory_half_bytes: float = Field(default=0.0, ge=0, le=MAX_HALF_BYTES)
    compute_half_flops: float = Field(default=0.0, ge=0, le=MAX_HALF_FLOPS)
    memory_bandwidth_gb_s: float | None = Field(default=None, ge=MIN_GB_S, le=MAX_GB_S)

    @model_validator(mode="after")
    def _multirow_in_range(self):
        f = self.multirow_memory_factor
        table = f if isinstance(f, dict) else {2: f}
        if not table:
            raise ValueError(f"multirow_memory_factor of device {self.name} is an empty "
                             f"table; give a number, or factors by rows such as {{4: 1.3}}")
        for rows, factor in table.items():
            if not 2 <= rows <= MAX_MULTIROW_ROWS:
                raise ValueError(f"multirow_memory_factor of device {self.name} lists "
                                 f"{rows} rows; list widths of 2 to {MAX_MULTIROW_ROWS} rows "
                                 f"(a one-row pass has no factor)")
            if not (math.isfinite(factor) and 1e-3 <= factor <= 1e3):
                raise ValueError(f"multirow_memory_factor of device {self.name} is {factor:g}"
                                 f" at {rows} rows; give a factor between 0.001 and 1000")
        return self

    @model_validator(mode="after")
    def _tiles_cover_rows(self):
        tiles = self.gemm_row_tiles
        if tiles is None:
            return self
        if (not tiles or tiles[-1] != 1 or any(a <= b for a, b in zip(tiles, tiles[1:]))
                or tiles[0] > MAX_TILE_ROWS):
            raise ValueError(f"gemm_row_tiles of device {self.name} is {list(tiles)}; "
                             f"list tile heights in rows, largest first, each smaller "
                             f"than the one before, ending in 1 and at most "
                             f"{MAX_TILE_ROWS} (e.g. [4, 2, 1])")
        return self

    def compute_rows(self, rows: int) -> int:
        """The rows a pass over ``rows`` rows computes as (``gemm_row_tiles``): its
        tiles, taken greedily largest first, times the largest tile's height;
        ``rows`` itself for one row or a device without tiles."""
        tiles = self.gemm_row_tiles
        if rows <= 1 or tiles is None:
            return rows
        count, left = 0, rows
        for height in tiles:
            count += left // height
            left %= height
        return count * tiles[0]

    def compute_padding(self, rows: int) -> float:
        """``compute_rows`` over rows: what a pass's FLOPs are billed at (1.0 without
        tiles; exact, so an untiled pass's compute is unchanged to the bit)."""
        return self.compute_rows(rows) / rows if rows > 1 else 1.0

    def multirow_factor(self, rows: int) -> float:
        """The multi-row memory factor of a pass over ``rows`` rows: 1 for one row;
        with a table, its factor at the listed width, linear in rows between two
        listed widths and the nearest one's outside them."""
        f = self.multirow_memory_factor
        if rows <= 1 or not isinstance(f, dict):
            return 1.0 if rows <= 1 else f
        widths = sorted(f)
        return sum(f[widths[i]] * w for i, w in width_weights(widths, rows))

    @model_validator(mode="after")
    def _positive_peaks(self):
        for dtype, peak in self.peak_flops.items():
            if not (math.isfinite(peak) and MIN_FLOPS <= peak <= MAX_FLOPS):
                raise ValueError(f"peak_flops.{dtype} of device {self.name} is {peak:g}; "
                                 f"set the spec-sheet FLOP/s for that dtype, between "
                                 f"{MIN_FLOPS:g} and {MAX_FLOPS:g}")
        return self


class Link(Sourced):
    name: str
    endpoints: tuple[str, str]
    latency_s: float = Field(ge=0, le=MAX_TIME_S)
    bandwidth_gb_s: float = Field(ge=MIN_GB_S, le=MAX_GB_S)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s * 1e9


def allreduce_s(algorithm: str, alpha_s: float, bandwidth_bytes_s: float, group: int,
                nbytes: float, base_s: float = 0.0) -> float:
    """One all-reduce of nbytes over ``group`` members: the closed form that
    ``CollectiveGroup.allreduce_s`` prices and ``simcore.costmodel`` splits into
    the terms calibration fits, written once so that the two cannot drift.

    ``alpha_beta``: alpha log2 G + M / bandwidth (the Mirror-SD model);
    ``ring``: base + 2(G-1) alpha + 2(G-1)/G M / bandwidth: NCCL's own latency
    model (a base latency and one per hop) with the bytes at the bus bandwidth
    nccl-tests reports (its busbw is 2(G-1)/G M over the time);
    ``tree``: 2 log2 G (alpha + M / bandwidth).
    """
    g = group
    if g == 1:
        return 0.0
    bw = bandwidth_bytes_s
    if algorithm == "alpha_beta":
        return alpha_s * math.log2(g) + nbytes / bw
    if algorithm == "ring":
        return base_s + 2 * (g - 1) * alpha_s + 2 * (g - 1) / g * nbytes / bw
    return 2 * math.log2(g) * (alpha_s + nbytes / bw)


class CollectiveGroup(Sourced):
    """Devices that act as one (tensor parallel), and how they all-reduce.

    ``alpha_beta``: cost = alpha_s * log2(G) + M / bandwidth (the Mirror-SD model).
    ``ring``: base_s + 2(G-1) * alpha_s + 2(G-1)/G * M / bandwidth (NCCL's latency
    model; the shipped GPU profiles' datasheet versions take its three numbers from
    nccl-tests and rccl-tests measurements).
    ``tree``: 2 * log2(G) * (alpha_s + M / bandwidth).
    ``base_s`` (ring only): the fixed part of one all-reduce, whatever the hops.
    """

    name: str
    members: tuple[str, ...] = Field(min_length=1)
    algorithm: Literal["alpha_beta", "ring", "tree"] = "alpha_beta"
    alpha_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)
    bandwidth_gb_s: float = Field(default=1e9, ge=MIN_GB_S, le=MAX_GB_S)
    base_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)

    @model_validator(mode="after")
    def _costed(self):
        _unique(f"group {self.name} members", list(self.members))
        if self.base_s and self.algorithm != "ring":
            raise ValueError(f"group {self.name} sets base_s, which only the ring "
                             f"algorithm reads; drop it or set algorithm: ring")
        if len(self.members) > 1:
            for name in ("alpha_s", "bandwidth_gb_s"):
                if name not in self.model_fields_set:
                    raise ValueError(f"group {self.name} has {len(self.members)} members "
                                     f"but no {name}; set the measured value and its source")
        return self

    @property
    def size(self) -> int:
        return len(self.members)

    def allreduce_s(self, nbytes: float, bandwidth_factor: float = 1.0) -> float:
        """One all-reduce of nbytes; ``bandwidth_factor`` scales the group's bandwidth
        (a stack's ``allreduce_bandwidth_factor``: what an engine's in-pass
        all-reduces reach of it)."""
        return allreduce_s(self.algorithm, self.alpha_s,
                           self.bandwidth_gb_s * 1e9 * bandwidth_factor,
                           self.size, nbytes, self.base_s)

    def alltoall_s(self, nbytes_sent: float) -> float:
        """One all-to-all in which each member sends ``nbytes_sent`` to the others
        (expert parallelism's dispatch or combine, ``ModelSpec.dispatch_bytes``):
        G-1 pairwise exchanges on the group's links, (G-1) alpha plus the bytes a
        member sends over the group's bandwidth."""
        g = self.size
        if g == 1:
            return 0.0
        return (g - 1) * self.alpha_s + nbytes_sent / (self.bandwidth_gb_s * 1e9)


class Platform(Sourced):
    name: str
    description: str = ""
    memory_tiers: tuple[MemoryTier, ...] = Field(min_length=1)
    devices: tuple[Device, ...] = Field(min_length=1)
    links: tuple[Link, ...] = ()
    groups: tuple[CollectiveGroup, ...] = ()
    placement: dict[str, str] = Field(default_factory=dict)
    # host CPU time of one prompt lookup (policies.ngram) for one row, seconds
    host_lookup_s: float = Field(default=0.0, ge=0, le=MAX_TIME_S)

    @model_validator(mode="after")
    def _cross_references(self):
        _unique("memory_tiers", [t.name for t in self.memory_tiers])
        names = [d.name for d in self.devices] + [g.name for g in self.groups]
        _unique("devices/groups", names)
        tiers = {t.name: t for t in self.memory_tiers}
        devices = {d.name for d in self.devices}
        for d in self.devices:
            if d.memory not in tiers:
                raise ValueError(f"device {d.name}: memory '{d.memory}' is not a "
                                 f"memory tier; use one of {sorted(tiers)}")
            if d.storage is not None and d.storage not in tiers:
                raise ValueError(f"device {d.name}: storage '{d.storage}' is not a "
                                 f"memory tier; use one of {sorted(tiers)}")
        for link in self.links:
            for end in link.endpoints:
                if end not in devices:
                    raise ValueError(f"link {link.name}: endpoint '{end}' is not a "
                                     f"device; use one of {sorted(devices)}")
        for g in self.groups:
            for m in g.members:
                if m not in devices:
                    raise ValueError(f"group {g.name}: member '{m}' is not a device; "
                                     f"use one of {sorted(devices)}")
        for role, target in self.placement.items():
            if not role.strip():
                raise ValueError(f"placement has an empty role (mapped to '{target}'); "
                                 "name the role, e.g. draft or target")
            if target not in names:
                raise ValueError(f"placement.{role}: '{target}' is neither a device "
                                 f"nor a group; use one of {sorted(names)}")
        if "target" in self.placement and "draft" in self.placement:
            self.route(self.members(self.placement["target"])[0],
                       self.members(self.placement["draft"])[0])
        return self

    # lookups -------------------------------------------------------------
    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def group(self, name: str) -> CollectiveGroup | None:
        for g in self.groups:
            if g.name == name:
                return g
        return None

    def tier(self, name: str) -> MemoryTier:
        for t in self.memory_tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def members(self, name: str) -> tuple[str, ...]:
        """The devices behind a device or group name."""
        group = self.group(name)
        if group is not None:
            return group.members
        self.device(name)
        return (name,)

    def route(self, src: str, dst: str) -> tuple[Link, ...]:
        """The links a message takes from src to dst: fewest hops, ties by name."""
        if src == dst:
            return ()
        adjacent: dict[str, list[tuple[str, Link]]] = {}
        for link in sorted(self.links, key=lambda l: l.name):
            a, b = link.endpoints
            adjacent.setdefault(a, []).append((b, link))
            adjacent.setdefault(b, []).append((a, link))
        previous: dict[str, tuple[str, Link]] = {}
        queue, seen = deque([src]), {src}
        while queue:
            node = queue.popleft()
            if node == dst:
                break
            for nxt, link in adjacent.get(node, []):
                if nxt not in seen:
                    seen.add(nxt)
                    previous[nxt] = (node, link)
                    queue.append(nxt)
        if dst not in previous:
            raise ValueError(f"platform {self.name} has no link path from {src} to "
                             f"{dst}; add a links entry connecting them")
        path, node = [], dst
        while node != src:
            node, link = previous[node]
            path.append(link)
        return tuple(reversed(path))


def _unique(what: str, names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{what}: name '{n}' appears twice; names must be unique")
        seen.add(n)


class Placement(dict):
    """{role: device or group}. A role placed nowhere names a device or group
    itself, so ``placement[role]`` is the one lookup every reader uses."""

    def __missing__(self, role: str) -> str:
        return role


def check_overrides(platform: Platform, overrides: dict[str, str]) -> None:
    """Raise ValueError when an override names no device or group of the platform."""
    names = [d.name for d in platform.devices] + [g.name for g in platform.groups]
    for role, where in overrides.items():
        if not role.strip():
            raise ValueError(f"placement '={where}' has no role; write ROLE=DEVICE, "
                             "e.g. draft=gpu4")
        if where not in names:
            raise ValueError(f"placement {role}={where}: '{where}' is not a device or "
                             f"group of platform {platform.name}; use one of "
                             f"{', '.join(names)}")


def resolve(platform: Platform, overrides: dict[str, str] | None = None) -> Placement:
    """The platform's placement, a run's overrides winning. One rule for every
    command: where the platform places the draft with the target (the same device
    or group), a run that moves the target and does not place the draft moves the
    draft with it (``--placement target=tp2`` runs both on tp2)."""
    overrides = dict(overrides or {})
    base = platform.placement
    if ("target" in overrides and "draft" not in overrides
            and base.get("draft") is not None and base.get("draft") == base.get("target")):
        overrides["draft"] = overrides["target"]
    return Placement({**base, **overrides})

