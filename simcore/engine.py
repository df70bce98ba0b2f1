"""The discrete-event interpreter of schedule operations, on SimPy.

``Simulator.run(schedule)`` drives a policy generator: each yielded operation
is costed by the roofline model, queued on the device streams, links and
bandwidths it uses, and recorded as spans. The engine knows operation kinds,
not decoding schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from hwprofiles.schema import ModelSpec, Platform, resolve
from hwprofiles.stacks import overlapped
from policies.cachebook import PositionBook
from policies.ops import (AllReduce, Delay, Forward, Join, Lookup, Outcome, Parallel,
                          Spawn, StreamWeights, TopK, Transfer, Verify)
from policies.runs.files import Span
from simcore.costmodel import CostError, RooflineCost, roofline
from simcore.outcomes import Outcomes
from simcore.resources import OverlapChannel, PageCache, SharedBandwidth, Stream

HOST = ("host",)  # the key of the one host queue (no device name is a tuple)


@dataclass
class SimResult:
    time_s: float
    tokens: float
    steps: int
    spans: list[Span]
    stats: dict = field(default_factory=dict)
    outcome_rates: dict = field(default_factory=dict)
    first_token_s: float | None = None  # when the first Verify committed a token
    prefill_s: float = 0.0  # the prologue's time, run before (outside) time_s
    prefill_spans: list[Span] = field(default_factory=list)


class Simulator:
    """Runs schedules on one platform with given models and outcome source.

    ``contention=True`` fair-shares each memory tier among the devices that read
    it at once (an SoC's GPU and NPU on one DRAM); otherwise every reader sees
    the tier's full bandwidth, as the papers' laws assume. Flash tiers are
    always fair-shared among concurrent streams. A flash tier's measured terms
    (``hwprofiles.schema``: read curve, page cache, host copy, overlap) shape
    its streams; unset, a stream is bytes at the tier's bandwidth beside compute.

    The cost model's software stack (``RooflineCost.stack``) may hold each
    Verify for its host bookkeeping (``verify_s``), and, where its devices do
    not overlap (one host thread drives them all), runs every Forward on one
    host queue as well as on its devices, so passes on different devices run
    one after another.
    """

    def __init__(self, platform: Platform, models: dict[str, ModelSpec],
                 outcomes: Outcomes, *, placement: dict[str, str] | None = None,
                 contention: bool = False, cost: RooflineCost | None = None,
                 record_spans: bool = True):
        self.env = simpy.Environment()
        self.platform = platform
        self.models = models
        self.placement = resolve(platform, placement)
        self.outcomes = outcomes
        self.cost = cost or RooflineCost(platform)
        self.book = PositionBook(expected=outcomes.deterministic)
        self.record = record_spans
        self.streams = {d.name: Stream(self.env) for d in platform.devices}
        self._verify_s = self.cost.verify_s()
        # a tree's drafting step (a pass keeping top k > 1 per row): the stack's time
        # to grow the tree by one level, on the pass's devices after it
        self._tree_step_s = self.cost.stack.topk_step_host_s
        self._host: tuple = ()  # the host queue every Forward takes, if one serialises
        if not self.cost.stack.devices_overlap:
            self._host = (HOST,)
            self.streams[HOST] = Stream(self.env)
        self.spans: list[Span] = []
        self.tokens = 0.0
        self.steps = 0
        self.first_token_s: float | None = None
        self._members: dict[str, tuple[str, ...]] = {}
        self._links: dict[tuple[str, str, str], Stream] = {}
        self._routes: dict[tuple[str, str], tuple] = {}
        self._bandwidth = self._shared_tiers(contention)
        self._overlap = self._overlap_channels()
        self.page_caches = {t.name: PageCache(t.page_cache_bytes)
                            for t in platform.memory_tiers if t.page_cache_bytes > 0}
        self._timed = {Forward: self._forward, Transfer: self._transfer,
                       AllReduce: self._allreduce, StreamWeights: self._stream,
                       Delay: self._delay, Join: self._join, Parallel: self._parallel,
                       Lookup: self._lookup}
        self._instant = {Verify: self._verify, Outcome: self._outcome,
                         Spawn: self._spawn}

    # driving ---------------------------------------------------------------
    def run(self, schedule) -> SimResult:
        main = self.env.process(self._drive(schedule))
        self.env.run()
        stats = main.value if isinstance(main.value, dict) else {}
        rates = {e: self.outcomes.rate(e) for e in self.outcomes.asked}
        return SimResult(self.env.now, self.tokens, self.steps, self.spans, stats, rates,
                         self.first_token_s)

    def _drive(self, schedule):
        value = None
        instant, timed = self._instant, self._timed
        while True:
            try:
                op = schedule.send(value)
            except StopIteration as stop:
                return stop.value
            fn = instant.get(op.__class__)
            if fn is not None:
                value = fn(op)
                if self._verify_s and op.__class__ is Verify:
                    yield self.env.timeout(self._verify_s)
                continue
            handler = timed.get(op.__class__)
            if handler is None:
                raise TypeError(f"schedule yielded {op!r}, which is not an operation")
            value = yield from handler(op)

    # placement ---------------------------------------------------------------
    def members(self, role: str) -> tuple[str, ...]:
        found = self._members.get(role)
        if found is None:
            name = self.placement[role]
            try:
                found = self.platform.members(name)
            except KeyError:
                roles = ", ".join(sorted(self.platform.placement)) or "none"
                device = self.platform.devices[0].name
                raise CostError(
                    f"the schedule runs on role '{role}', which platform "
                    f"{self.platform.name} does not place (its roles: {roles}); pass "
                    f"--placement {role}={device} (a device or group) or set "
                    f"placement.{role} in the profile") from None
            self._members[role] = found
        return found

    def track(self, role: str) -> str:
        return self.placement[role]

    def _shared_tiers(self, contention: bool) -> dict[str, SharedBandwidth]:
        readers: dict[str, int] = {}
        for d in self.platform.devices:
            readers[d.memory] = readers.get(d.memory, 0) + 1
            if d.storage is not None and self.platform.tier(d.storage).host_copy_gb_s:
                readers[d.memory] += 1  # the host copy of its streams reads it too
        shared = {}
        for t in self.platform.memory_tiers:
            if t.kind == "flash" or (contention and readers.get(t.name, 0) > 1):
                shared[t.name] = SharedBandwidth(
                    self.env, t.bandwidth_bytes_s * t.memory_efficiency)
        return shared

    def _overlap_channels(self) -> dict[str, OverlapChannel]:
        """Per device that streams from a tier with ``stream_overlap_fraction``
        f < 1: a channel its compute and its streams share, in seconds of work
        per second. Capacity 2 / (2 - f), each flow capped at 1: alone, a pass or
        a read runs at full speed; together both run at 1 / (2 - f), so s seconds
        of stream beside c of compute take max(s, c) + (1 - f) min(s, c)."""
        channels = {}
        for d in self.platform.devices:
            if d.storage is not None:
                f = self.platform.tier(d.storage).stream_overlap_fraction
                if f < 1:
                    channels[d.name] = OverlapChannel(self.env, f)
        return channels

    def _busy(self, members, seconds: float):
        """An event for seconds of work on a device: a timeout, or a flow on its
        overlap channel when its streams and compute do not fully overlap."""
        channel = self._overlap.get(members[0]) if self._overlap else None
        if channel is None:
            return self.env.timeout(seconds)
        return channel.transfer(seconds)

    def _acquire(self, names):
        for name in names:
            event = self.streams[name].acquire()
            if event is not None:
                yield event

    def _release(self, names) -> None:
        for name in names:
            self.streams[name].release()

    def _span(self, *fields) -> None:
        if self.record:
            self.spans.append(Span(*fields))

    # operations --------------------------------------------------------------
    def _forward(self, op: Forward):
        try:
            spec = self.models[op.model]
        except KeyError:
            raise CostError(f"the schedule runs model '{op.model}' but the run has only "
                            f"{', '.join(self.models)}") from None
        members = self.members(op.device)
        where = self.track(op.device)
        fed = self.book.feed(op)  # with the positions its cache lacks (catch_up)
        head = fed.head
        c = self.cost.forward(spec, where, fed.layers, fed.n_tokens, fed.batch, fed.context,
                              head and head.kind, fed.collectives, head and head.tokens)
        queues = self._host + members  # the host queue first: no two wait on each other
        yield from self._acquire(queues)
        env = self.env
        start = env.now
        tiers = self._bandwidth and [t for t in (self.platform.device(m).memory
                                                 for m in members) if t in self._bandwidth]
        if tiers:
            channel = self._overlap.get(members[0]) if self._overlap else None
            if channel is None:
                yield from self._contended(c, tiers)
            else:  # shared DRAM and a stream beside it: both bound the pass
                yield simpy.AllOf(env, [env.process(self._contended(c, tiers)),
                                        channel.transfer(c.busy_s)])
        else:
            yield self._busy(members, c.busy_s)
        if self._tree_step_s and op.emit.__class__ is TopK and op.emit.k > 1:
            yield self._busy(members, self._tree_step_s)
        busy_end = env.now
        if c.collective_s:
            yield env.timeout(c.collective_s)
        self._release(queues)
        label = op.label or f"{op.model}[{op.layers[0]}:{op.layers[1]}]"
        self._span(label, "compute", where, start, busy_end, c.flops, c.nbytes)
        if c.collective_s:
            self._span(f"{label} all-reduce", "collective", where, busy_end, env.now)
        return op

    def _contended(self, c, tiers):
        """A Forward's roofline with its weight traffic fair-shared on ``tiers``:
        the flows carry the bytes the pass's memory time streams at the tier's
        rate (``multirow_memory_factor`` included), the memory time is how long
        they take under sharing, and compute and memory combine as the device's
        roofline does (max, or the p-norm), so a pass alone on its tier takes
        exactly ``busy_s``. A device with a bandwidth cap draws at most its own
        rate from the tier (``_flow``): two capped engines whose caps fit in the
        tier's bandwidth do not slow each other."""
        env = self.env
        began = env.now
        yield env.timeout(c.launch_s)
        start = env.now
        flows = [self._flow(self._bandwidth[t], c) for t in tiers]
        yield simpy.AllOf(env, flows)
        memory_s = env.now - start
        rest = roofline(c.compute_s, memory_s, c.exponent) - memory_s
        if rest > 0:
            yield env.timeout(rest)
        if c.host_exponent is not None:  # the stack's host dispatch, overlapped, and sync
            device_s = env.now - began
            yield env.timeout(overlapped(c.host_s, device_s, c.host_exponent) - device_s
                              + c.sync_s)

    @staticmethod
    def _flow(shared: SharedBandwidth, c):
        """A pass's memory traffic on a shared tier: the bytes its memory time
        streams at the tier's rate, or, on a device with a bandwidth cap, at its own
        rate with that rate as the flow's cap (alone it takes memory_s either way)."""
        if c.rate_cap is None:
            return shared.transfer(c.memory_s * shared.bandwidth)
        cap = min(c.rate_cap, shared.bandwidth)
        return shared.transfer(c.memory_s * cap, cap)

    def _route(self, src: str, dst: str):
        key = (src, dst)
        if key not in self._routes:
            hops, here = [], src
            for link in self.platform.route(src, dst):
                there = link.endpoints[1] if link.endpoints[0] == here else link.endpoints[0]
                hops.append((link, here, there))
                here = there
            self._routes[key] = tuple(hops)
        return self._routes[key]

    def _transfer(self, op: Transfer):
        src, dst = self.members(op.src)[0], self.members(op.dst)[0]
        for link, a, b in self._route(src, dst):
            lane = self._links.setdefault((link.name, a, b), Stream(self.env))
            event = lane.acquire()
            if event is not None:
                yield event
            start = self.env.now
            yield self.env.timeout(self.cost.hop_s(link, op.nbytes))
            lane.release()
            self._span(op.label or "transfer", "transfer", f"link:{link.name}", start,
                       self.env.now, 0.0, op.nbytes)
        return op.payload

    def _allreduce(self, op: AllReduce):
        group = self.track(op.group)
        members = self.members(op.group)
        seconds = self.cost.allreduce_s(group, op.nbytes, op.count)
        yield from self._acquire(members)
        start = self.env.now
        yield self.env.timeout(seconds)
        self._release(members)
        self._span(op.label or "all-reduce", "collective", group, start, self.env.now,
                   0.0, op.nbytes * op.count)

    def _stream(self, op: StreamWeights):
        """Latency, the per-request time of the read (``RooflineCost.requests_s``),
        then bytes over the flash tier's fair-shared bandwidth at the share its
        requests in flight reach (``MemoryTier.read_fraction``); a chunk still in
        the tier's page cache skips the read. Then the host copy of the bytes
        (``host_copy_gb_s``). On a device with ``stream_host_gb_s`` installing the
        weights read is the device's own work: after the read it takes the
        device's compute stream (FIFO, after work queued before it) for bytes /
        stream_host_gb_s.

        The read overlaps compute as far as the tier's ``stream_overlap_fraction``
        lets it (``_overlap_channels``; 1 by default: fully), as far as the
        schedule's buffer lets prefetches run ahead. The executor reads with O_DIRECT
        into reused buffers and installs views of them
        (``executors.backend.streaming``), so the core's share of a stream is the
        read's own kernel work; the host rate stands for that work. A device's
        ``stream_dispatch_s`` is issuing the read: it takes the device's compute
        stream (FIFO: the executor's worker first finishes the Forward sent with
        it) before the read; the span starts after it, where a measured stream's
        span starts."""
        members = self.members(op.device)
        device = self.platform.device(members[0])
        if device.storage is None:
            raise CostError(f"device {device.name} of platform {self.platform.name} has "
                            "no storage tier to stream weights from; set its 'storage'")
        tier = self.platform.tier(device.storage)
        if device.stream_dispatch_s:  # issuing the read takes the device's core
            yield from self._acquire(members)
            yield self.env.timeout(self.cost.stream_dispatch_s(device))
            self._release(members)
        start = self.env.now
        cache = self.page_caches.get(tier.name) if self.page_caches else None
        if cache is None or not cache.read((op.model, op.layers), op.nbytes):
            yield from self._read(tier, members, op.nbytes)
        if tier.host_copy_gb_s is not None:
            yield from self._host_copy(tier, device, members, op.nbytes)
        if device.stream_host_gb_s is not None:
            yield from self._acquire(members)
            yield self.env.timeout(self.cost.stream_host_s(device, op.nbytes))
            self._release(members)
        self._span(op.label or "stream weights", "stream", tier.name, start,
                   self.env.now, 0.0, op.nbytes)

    def _read(self, tier, members, nbytes: float):
        """The flash read itself: its waits, then its bytes on the tier (and, on a
        device whose streams do not fully overlap compute, on its channel)."""
        wait_s = tier.latency_s + self.cost.requests_s(tier, nbytes)
        if wait_s:
            yield self.env.timeout(wait_s)
        fraction = tier.read_fraction(nbytes)
        flow = self._bandwidth[tier.name].transfer(nbytes / fraction)
        channel = self._overlap.get(members[0]) if self._overlap else None
        if channel is None:
            yield flow
            return
        alone_s = nbytes / (tier.bandwidth_bytes_s * tier.memory_efficiency * fraction)
        yield simpy.AllOf(self.env, [flow, channel.transfer(alone_s)])

    def _host_copy(self, tier, device, members, nbytes: float):
        """The host-side copy of streamed bytes: nbytes / host_copy_gb_s of the
        device's time (on its overlap channel when it has one) and, where its
        memory tier is shared (``contention``), 2 bytes of that tier's traffic per
        byte copied, read and written."""
        events = [self._busy(members, nbytes / (tier.host_copy_gb_s * 1e9))]
        if self._bandwidth and device.memory in self._bandwidth:
            events.append(self._bandwidth[device.memory].transfer(2.0 * nbytes))
        yield simpy.AllOf(self.env, events)

    def _delay(self, op: Delay):
        self.book.proposed(op)
        members = self.members(op.device) if op.device else ()
        yield from self._acquire(members)
        start = self.env.now
        yield self.env.timeout(op.seconds)
        self._release(members)
        track = self.track(op.device) if op.device else "host"
        self._span(op.label or "delay", "delay", track, start, self.env.now)

    def _lookup(self, op: Lookup):
        """A prompt lookup: host time per row (and per sibling continuation sought),
        proposal lengths from the outcomes."""
        members = self.members(op.device) if op.device else ()
        yield from self._acquire(members)
        start = self.env.now
        yield self.env.timeout(self.cost.lookup_s(op.batch * (op.siblings or 1)))
        self._release(members)
        track = self.track(op.device) if op.device else "host"
        self._span(op.label, "lookup", track, start, self.env.now)
        return self.outcomes.lookup(op)

    def _verify(self, op: Verify):
        verdict = self.outcomes.verify(op)
        self.book.settle(verdict, op.branch)
        if self.first_token_s is None and verdict.tokens > 0:
            self.first_token_s = self.env.now
        self.tokens += verdict.tokens
        self.steps += 1
        return verdict

    def _outcome(self, op: Outcome):
        answer = self.outcomes.outcome(op)
        self.book.observed(op, answer)  # a hit's tree rows become the next proposal
        return answer

    def _spawn(self, op: Spawn):
        return self.env.process(self._drive(op.branch))

    def _join(self, op: Join):
        if len(op.tasks) == 1:  # the common case: wait on the one process itself
            task = op.tasks[0]
            if not task.processed:
                yield task
            return (task.value,)
        yield simpy.AllOf(self.env, list(op.tasks))
        return tuple(t.value for t in op.tasks)

    def _parallel(self, op: Parallel):
        tasks = [self.env.process(self._drive(b)) for b in op.branches]
        yield simpy.AllOf(self.env, tasks)
        return tuple(t.value for t in tasks)
