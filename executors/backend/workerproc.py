"""Inside a worker process: what it does with the coordinator's commands.

``python -m executors.backend.workerproc NAME RANK WORLD PORT THREADS BACK GROUPS``
(started by ``executors.backend.workers.WorkerClient.start_all``) pins itself to
its cores, joins the torch.distributed group and its tensor-parallel groups, and
owns one ``LocalDevice`` (weights of the models placed on it, their KV caches).

A worker reads its pipe on a thread of its own and hands each command to a
lane: compute (the main thread, one command at a time), storage (weight
streams, one after another), sends (posted at once, never waiting), and one
receive lane per peer (in order, like a link: the coordinator's bookkeeping
relies on messages between two devices ending in the order they were sent). A
message therefore travels on the link's time, never behind compute queued on
either end, as the simulator charges a Transfer to the link alone. A Forward
that reads hidden states still arriving waits for them (``LocalDevice.expect``),
so data dependencies hold.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client

import torch
import torch.distributed as dist

from executors.backend import drafts, models
from executors.backend.device import LocalDevice
from executors.backend.layers import Stack
from executors.backend.streaming import StreamCmd
from executors.backend.tensor import Collectives, members_of, shard_stack
from executors.backend.workers import LoadCmd, RecvCmd, SendCmd, no_delay

# How long a worker's compute thread keeps the interpreter while a message's thread
# waits for it (Python's default, 5 ms, would delay a message by up to that much).
GIL_SWITCH_S = 0.0005


def cores_for(name: str, index: int, threads: int) -> set[int] | None:
    """The cores a CPU worker is pinned to: ``threads`` cores from its own."""
    if not name.startswith("cpu:"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    first = int(name.split(":")[1])
    return {allowed[(first + i) % len(allowed)] for i in range(threads)}


def _main(conn, name: str, rank: int, world: int, port: int, threads: int,
          groups: str = "", names: str = "") -> None:
    conn.send(rank)
    try:
        device = _setup(name, rank, world, port, threads)
        _join_groups(device, groups, names)
    except BaseException:  # report, then exit: the coordinator raises
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    lock = threading.Lock()
    pending_sends: list = []
    lanes = {"storage": _Lane(device.execute, conn, lock),
             "sends": _Lane(lambda cmd: _message(device, cmd, pending_sends), conn, lock)}
    compute: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(conn, device, compute, lanes),
                     daemon=True).start()
    while (msg := compute.get()) is not None:
        _answer(conn, lock, lambda cmd: _execute(device, cmd), msg)
    for lane in list(lanes.values()):
        lane.queue.put(None)
        lane.join()
    for work, _buf in pending_sends:
        work.wait()
    dist.destroy_process_group()


def _answer(conn, lock, run, msg) -> None:
    """Run a (ticket, command), send the reply (or the traceback) back."""
    ticket, cmd = msg
    try:
        reply = run(cmd)
    except Exception:
        reply = traceback.format_exc()
    with lock:
        conn.send((ticket, reply))


def _read(conn, device, compute: queue.Queue, lanes: dict) -> None:
    """Read the pipe and hand each command to its lane, in the order it came: a
    receive of hidden states is announced to the device before any Forward that
    reads them can be queued."""
    lock = lanes["sends"].lock
    try:
        while (msg := conn.recv()) is not None:
            cmd = msg[1]
            if isinstance(cmd, StreamCmd):  # storage reads overlap compute
                lanes["storage"].queue.put(msg)
            elif isinstance(cmd, SendCmd):
                lanes["sends"].queue.put(msg)
            elif isinstance(cmd, RecvCmd):  # the link from its peer, in order
                if cmd.handle is not None:
                    device.expect(cmd.handle)
                if cmd.peer not in lanes:
                    lanes[cmd.peer] = _Lane(lambda c: _message(device, c), conn, lock)
                lanes[cmd.peer].queue.put(msg)
            else:
                compute.put(msg)
    except (EOFError, OSError):  # the coordinator went away: stop
        pass
    compute.put(None)


class _Lane(threading.Thread):
    """Runs one kind of command one after another, beside the worker's compute."""

    def __init__(self, run_one, conn, lock):
        super().__init__(daemon=True)
        self.run_one, self.conn, self.lock = run_one, conn, lock
        self.queue: queue.Queue = queue.Queue()
        self.start()

    def run(self) -> None:
        while (msg := self.queue.get()) is not None:
            _answer(self.conn, self.lock, self.run_one, msg)


def _setup(name, rank, world, port, threads):
    cores = cores_for(name, rank, threads)
    if cores:
        os.sched_setaffinity(0, cores)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    sys.setswitchinterval(GIL_SWITCH_S)  # a message's thread waits this long at most
    if name.startswith("cuda:"):
        torch.cuda.set_device(int(name.split(":")[1]))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    return LocalDevice(name, {}, seed=rank)


def _join_groups(device, groups: str, names: str) -> None:
    """One process group per tensor-parallel group; every worker joins each call
    (torch.distributed requires it), members keep theirs. NCCL where the
    members are CUDA devices, gloo otherwise."""
    device.collectives = Collectives()
    order = names.split(",")
    for key in filter(None, groups.split(";")):
        members = members_of(key)
        cuda = all(m.startswith("cuda:") for m in members)
        group = dist.new_group([order.index(m) for m in members],
                               backend="nccl" if cuda else "gloo")
        if device.name in members:
            device.collectives.groups[key] = group


def _execute(device, cmd):
    if isinstance(cmd, LoadCmd):
        return _load(device, cmd)
    return device.execute(cmd)


def _message(device, cmd, pending_sends=None):
    """A send (posted, not waited for) or a receive (waited for), timed here."""
    start = time.perf_counter()
    if isinstance(cmd, SendCmd):
        _send(device, cmd, pending_sends)
    else:
        _recv(device, cmd)
    return None, start, time.perf_counter()


def _load(device, cmd: LoadCmd):
    start = time.perf_counter()
    loaded = device.__dict__.setdefault("loaded", {})  # (source, shard) -> HF model

    def model(source: str, seed: int, shard):  # a sharded copy is never shared unsharded
        if (source, shard) not in loaded:
            loaded[source, shard] = models.load(source, seed=seed).model.to(device.where)
        return loaded[source, shard]

    for role, source in sorted(cmd.sources.items()):
        if role in device.stacks:
            continue
        shard = cmd.shards.get(role)
        n = models.self_layers(source)
        if n:
            device.stacks[role] = Stack(model(cmd.target, cmd.seed, shard), n)
        else:  # seeds as the coordinator's copy: target seed, draft seed + 1
            device.stacks[role] = Stack(model(source, cmd.seed + (role == "draft"), shard))
        if n or source == cmd.target:  # the target's own layers: its trained draft heads
            drafts.attach(device.stacks[role], cmd.target)
        if shard is not None:
            shard_stack(device.stacks[role], shard, device.collectives.reducer(shard.key))
    return None, start, time.perf_counter()


def _send(device, cmd: SendCmd, pending_sends):
    pending_sends[:] = [(w, b) for w, b in pending_sends if not w.is_completed()]
    if cmd.handle is None:
        data = torch.zeros(max(1, int(cmd.nbytes)), dtype=torch.uint8)
    else:
        data = device.hidden(cmd.handle).contiguous().cpu()  # gloo moves host memory
        header = torch.tensor([data.dim(), *data.shape, 0, 0, 0][:4], dtype=torch.int64)
        pending_sends.append((dist.isend(header, cmd.peer, tag=cmd.tag), header))
    pending_sends.append((dist.isend(data, cmd.peer, tag=cmd.tag + 1), data))


def _recv(device, cmd: RecvCmd):
    if cmd.handle is None:
        buf = torch.empty(max(1, int(cmd.nbytes)), dtype=torch.uint8)
        dist.recv(buf, cmd.peer, tag=cmd.tag + 1)
        return None
    try:
        header = torch.empty(4, dtype=torch.int64)
        dist.recv(header, cmd.peer, tag=cmd.tag)
        shape = header[1:1 + int(header[0])].tolist()
        buf = torch.empty(shape, dtype=torch.float32)
        dist.recv(buf, cmd.peer, tag=cmd.tag + 1)
        device.keep(cmd.handle, {"hidden": buf.to(device.where)})
    finally:  # a Forward waiting for these states goes on (and fails if none came)
        device.arrived(cmd.handle)
    return None


if __name__ == "__main__":
    _name, _rank, _world, _port, _threads, _back, _groups = sys.argv[1:8]
    _conn = Client(("127.0.0.1", int(_back)),
                   authkey=bytes.fromhex(os.environ["HETSPEC_WORKER_KEY"]))
    no_delay(_conn)
    _main(_conn, _name, int(_rank), int(_world), int(_port), int(_threads), _groups,
          os.environ["HETSPEC_WORKER_NAMES"])
