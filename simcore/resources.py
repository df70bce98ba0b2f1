"""Engine resources: FIFO compute streams and fair-shared bandwidth.

``Stream`` is a FIFO lock with a fast path: taking a free stream schedules no
event, which roughly halves the events per operation against ``simpy.Resource``
(the simulator's hot path is a stream grab, one timeout and a release).
``SharedBandwidth`` is processor sharing: n concurrent flows each progress at
bandwidth / n, re-planned whenever a flow starts or ends. A flow may have a
rate cap (an engine that cannot draw more than part of a shared DRAM): then
the bandwidth is water-filled, capped flows take at most their cap and the
others share what is left equally. ``PageCache`` is the DRAM that keeps a
flash tier's recently read chunks, least recently used first out.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import simpy


class Stream:
    """One device's in-order execution queue."""

    __slots__ = ("env", "busy", "waiting")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.busy = False
        self.waiting: deque[simpy.Event] = deque()

    def acquire(self) -> simpy.Event | None:
        """None when taken at once; otherwise an event that fires on hand-over."""
        if not self.busy:
            self.busy = True
            return None
        event = self.env.event()
        self.waiting.append(event)
        return event

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft().succeed()
        else:
            self.busy = False


class SharedBandwidth:
    """A bandwidth fair-shared among the flows crossing it at the same time.

    Each plan times the flows with the fewest bytes left; when that timer fires
    those flows are done, whatever float residue their byte count still holds.
    The clock cannot resolve less than ``ulp(now)`` (2 ps at 2^14 s, 2 ns at
    1e7 s), so a residue can outlive any fixed byte threshold; completing the
    flows a timer was planned for makes every current plan retire at least one
    flow, so the loop always ends. Flows that tie with them to within the
    clock's resolution finish at the same instant."""

    def __init__(self, env: simpy.Environment, bandwidth_bytes_s: float):
        self.env = env
        self.bandwidth = bandwidth_bytes_s
        self.flows: dict[int, list] = {}  # id -> [remaining_bytes, done_event]
        self._next_id = 0
        self._last = env.now
        self._generation = 0

    def transfer(self, nbytes: float, cap_bytes_s: float | None = None) -> simpy.Event:
        """An event that fires when nbytes have crossed at the fair-share rate (at
        most ``cap_bytes_s``)."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._advance()
        self.flows[self._next_id] = [float(nbytes), done, cap_bytes_s]
        self._next_id += 1
        self._plan()
        return done

    def _share(self) -> float:
        """Each flow's rate when all share equally (no flow capped)."""
        return self.bandwidth / len(self.flows)

    def _rates(self) -> dict[int, float] | None:
        """Per flow, its water-filled rate; None when no flow is capped (all share
        equally, the common case, kept on its own exact path)."""
        capped = sorted((f[2], i) for i, f in self.flows.items() if f[2] is not None)
        if not capped:
            return None
        left, n, rates = self.bandwidth, len(self.flows), {}
        for cap, i in capped:
            if cap >= left / n:
                break
            rates[i], left, n = cap, left - cap, n - 1
        share = left / n if n else 0.0
        return {i: rates.get(i, share) for i in self.flows}

    def _advance(self) -> None:
        elapsed = self.env.now - self._last
        self._last = self.env.now
        if elapsed > 0 and self.flows:
            rates = self._rates()
            if rates is not None:
                for i, flow in self.flows.items():
                    flow[0] -= elapsed * rates[i]
                return
            moved = elapsed * self._share()
            for flow in self.flows.values():
                flow[0] -= moved

    def _plan(self) -> None:
        self._generation += 1
        if not self.flows:
            return
        rates = self._rates()
        if rates is None:
            rate = self._share()
            fewest_bytes = min(f[0] for f in self.flows.values())
            planned = tuple(i for i, f in self.flows.items() if f[0] == fewest_bytes)
            wait_s = max(fewest_bytes, 0.0) / rate
        else:
            times = {i: max(f[0], 0.0) / rates[i] for i, f in self.flows.items()}
            wait_s = min(times.values())
            planned = tuple(i for i, t in times.items() if t == wait_s)
        timer = self.env.timeout(wait_s)
        generation = self._generation
        timer.callbacks.append(lambda _e: self._on_timer(generation, planned))

    def _on_timer(self, generation: int, planned: tuple[int, ...]) -> None:
        if generation != self._generation:
            return  # a newer plan replaced this one
        self._advance()
        rates = self._rates()
        resolution = 4 * math.ulp(self.env.now)  # flows the clock cannot tell apart
        finished = set(planned)
        if rates is None:
            tie_bytes = self._share() * resolution
            finished.update(i for i, f in self.flows.items() if f[0] <= tie_bytes)
        else:
            finished.update(i for i, f in self.flows.items() if f[0] <= rates[i] * resolution)
        for i in sorted(finished):
            self.flows.pop(i)[1].succeed()
        self._plan()


class OverlapChannel(SharedBandwidth):
    """A device's compute and its weight streams, in seconds of work per second:
    capacity 2 / (2 - f) for an overlap fraction f, each flow at most 1 (alone, a
    pass or a read runs at full speed; a pass beside a read both at 1 / (2 - f)).
    Every flow has the same cap, so the shares stay equal: no water-filling."""

    def __init__(self, env: simpy.Environment, overlap_fraction: float):
        super().__init__(env, 2.0 / (2.0 - overlap_fraction))

    def _share(self) -> float:
        return min(1.0, self.bandwidth / len(self.flows))

    def _rates(self) -> None:
        return None


class PageCache:
    """A flash tier's page cache: chunks (any hashable key) with their bytes,
    evicted least recently used first once they exceed ``capacity_bytes``. A
    chunk larger than the whole cache is never kept; a cyclic stream larger than
    the cache therefore never hits (each chunk is evicted before it comes round
    again), as LRU does."""

    def __init__(self, capacity_bytes: float):
        self.capacity = capacity_bytes
        self.held = 0.0
        self.chunks: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def read(self, key, nbytes: float) -> bool:
        """True when the chunk is in DRAM (a hit); otherwise records the read
        chunk, evicting the least recently used ones to make room."""
        if key in self.chunks:
            self.chunks.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        if nbytes <= self.capacity:
            self.chunks[key] = nbytes
            self.held += nbytes
            while self.held > self.capacity:
                _, evicted = self.chunks.popitem(last=False)
                self.held -= evicted
        return False
