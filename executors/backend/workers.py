"""Worker processes: one per physical device, pinned to its cores.

Each worker owns a ``LocalDevice`` (weights of the models placed on it, their
KV caches) and answers commands from the coordinator over a pipe. Workers
form one torch.distributed group (gloo on 127.0.0.1), and hidden states and
token-channel messages between devices are real ``send``/``recv`` calls
between workers. Each tensor-parallel group (``executors.backend.tensor``) gets a
process group of its own (NCCL where its members are CUDA devices), in which a
sharded model's all-reduces run.

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

import importlib.util
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Listener
from pathlib import Path

from executors.backend import drafts, models
from executors.backend.layers import Stack
from executors.backend.streaming import StreamCmd

STARTUP_TIMEOUT_S = 600
EXIT_WAIT_S = 10.0  # a closed worker's own exit, then SIGTERM
TERM_WAIT_S = 5.0   # after SIGTERM, then SIGKILL (a stopped worker ignores SIGTERM)
# How long a worker's compute thread keeps the interpreter while a message's thread
# waits for it (Python's default, 5 ms, would delay a message by up to that much).
GIL_SWITCH_S = 0.0005


@dataclass
class LoadCmd:
    """Load models by role -> executor name (see executors.backend.models)."""

    sources: dict[str, str]
    seed: int
    target: str = ""  # the target's source, for self:N drafts
    shards: dict = field(default_factory=dict)  # role -> tensor.Shard on a group


@dataclass
class SendCmd:
    handle: int | None
    peer: int
    tag: int
    nbytes: float = 0.0  # a token-channel message of this size when handle is None


@dataclass
class RecvCmd:
    handle: int | None
    peer: int
    tag: int
    nbytes: float = 0.0


def no_delay(conn) -> None:
    """Send a pipe's small writes at once. A Connection writes a message over 16 KiB
    as header, then body; with Nagle's algorithm the body's last segment waits for
    the header's acknowledgement, which the peer delays (~40 ms on Linux)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cores_for(name: str, index: int, threads: int) -> set[int] | None:
    """The cores a CPU worker is pinned to: ``threads`` cores from its own."""
    if not name.startswith("cpu:"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    first = int(name.split(":")[1])
    return {allowed[(first + i) % len(allowed)] for i in range(threads)}


class WorkerClient:
    """The coordinator's end of one worker process."""

    def __init__(self, name: str, rank: int, conn, proc):
        self.name, self.rank, self.conn, self.proc = name, rank, conn, proc
        self._last_tag = 0  # tags of this worker's receives (each also uses tag + 1)

    @classmethod
    def start_all(cls, names: list[str], *, threads: int = 1,
                  groups: tuple[str, ...] = ()) -> dict[str, "WorkerClient"]:
        """Start one worker per name (``python -m executors.backend.workers``), connected
        back over an authenticated local socket; independent of the caller's
        ``__main__``. ``groups``: tensor-parallel groups (members joined by
        ``tensor.SEP``), each given its own process group in every worker."""
        key = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {**os.environ, "HETSPEC_WORKER_KEY": key.hex(),
               "HETSPEC_WORKER_NAMES": ",".join(names)}
        port = _free_port()
        procs = [subprocess.Popen(
            [sys.executable, "-m", "executors.backend.workers", name, str(rank), str(len(names)),
             str(port), str(threads), str(listener.address[1]), ";".join(groups)], env=env,
            cwd=str(_package_root()))
            for rank, name in enumerate(names)]
        try:
            conns = _accept_all(listener, procs)
        finally:
            listener.close()
        clients = {name: cls(name, rank, conns[rank], procs[rank])
                   for rank, name in enumerate(names)}
        for client in clients.values():
            client._expect_ready()
        return clients

    def _expect_ready(self) -> None:
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            raise RuntimeError(f"worker {self.name} did not start")
        tag, info = self.conn.recv()
        if tag != "ready":
            raise RuntimeError(f"worker {self.name} failed to start: {info}")

    def submit(self, ticket: tuple[str, int], cmd) -> None:
        self.conn.send((ticket, cmd))

    def has_replies(self) -> bool:
        return self.conn.poll(0)

    def replies(self) -> list:
        out = []
        while self.conn.poll(0):
            ticket, reply = self.conn.recv()
            if isinstance(reply, str):
                raise RuntimeError(f"worker {self.name} failed:\n{reply}")
            out.append((ticket, reply))
        return out

    def connection(self):
        return self.conn

    def _tag(self) -> int:
        """A tag for the next message this worker receives. torch.distributed
        matches a message by (sender, receiver, tag), so tags need be distinct only
        among one receiver's messages; the receiver numbers them."""
        self._last_tag = (self._last_tag + 2) % (1 << 20)
        return self._last_tag

    def fetch_commands(self, source: "WorkerClient", source_name: str, handle: int) -> list:
        if source is self:
            return []
        tag = self._tag()
        return [(source_name, SendCmd(handle, self.rank, tag)),
                (self.name, RecvCmd(handle, source.rank, tag))]

    def message_commands(self, source: "WorkerClient", source_name: str,
                         nbytes: float) -> list:
        if source is self:
            return []
        tag = self._tag()
        return [(source_name, SendCmd(None, self.rank, tag, nbytes)),
                (self.name, RecvCmd(None, source.rank, tag, nbytes))]

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=TERM_WAIT_S)
            except subprocess.TimeoutExpired:  # a stopped or wedged worker ignores SIGTERM
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


def _package_root() -> Path:
    """The folder holding the ``executors`` package, which a worker imports."""
    return Path(importlib.util.find_spec("executors").origin).resolve().parents[1]


def _accept_all(listener, procs) -> list:
    """Each worker's connection by rank; fails if a worker exits first."""
    conns: dict[int, object] = {}

    def accept():
        for _ in procs:
            conn = listener.accept()
            no_delay(conn)
            conns[conn.recv()] = conn

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
        dead = [p for p in procs if p.poll() is not None]
        if dead and thread.is_alive():
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            raise RuntimeError(f"a worker exited with status {dead[0].returncode} "
                               "before connecting; see its error above")
    if thread.is_alive():
        raise RuntimeError("workers did not connect in time")
    return [conns[r] for r in range(len(procs))]


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
    import torch.distributed as dist

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
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    sys.setswitchinterval(GIL_SWITCH_S)  # a message's thread waits this long at most
    if name.startswith("cuda:"):
        torch.cuda.set_device(int(name.split(":")[1]))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    from executors.backend.device import LocalDevice

    return LocalDevice(name, {}, seed=rank)


def _join_groups(device, groups: str, names: str) -> None:
    """One process group per tensor-parallel group; every worker joins each call
    (torch.distributed requires it), members keep theirs. NCCL where the
    members are CUDA devices, gloo otherwise."""
    import torch.distributed as dist

    from executors.backend.tensor import Collectives, members_of

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
            from executors.backend.tensor import shard_stack

            shard_stack(device.stacks[role], shard, device.collectives.reducer(shard.key))
    return None, start, time.perf_counter()


def _send(device, cmd: SendCmd, pending_sends):
    import torch
    import torch.distributed as dist

    pending_sends[:] = [(w, b) for w, b in pending_sends if not w.is_completed()]
    if cmd.handle is None:
        data = torch.zeros(max(1, int(cmd.nbytes)), dtype=torch.uint8)
    else:
        data = device.hidden(cmd.handle).contiguous().cpu()  # gloo moves host memory
        header = torch.tensor([data.dim(), *data.shape, 0, 0, 0][:4], dtype=torch.int64)
        pending_sends.append((dist.isend(header, cmd.peer, tag=cmd.tag), header))
    pending_sends.append((dist.isend(data, cmd.peer, tag=cmd.tag + 1), data))


def _recv(device, cmd: RecvCmd):
    import torch
    import torch.distributed as dist

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
    from executors.backend import workers  # the importable module, whose classes commands pickle

    _name, _rank, _world, _port, _threads, _back, _groups = sys.argv[1:8]
    _conn = Client(("127.0.0.1", int(_back)),
                   authkey=bytes.fromhex(os.environ["HETSPEC_WORKER_KEY"]))
    workers.no_delay(_conn)
    workers._main(_conn, _name, int(_rank), int(_world), int(_port), int(_threads),
                  _groups, os.environ["HETSPEC_WORKER_NAMES"])
