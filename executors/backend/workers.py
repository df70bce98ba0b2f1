"""Worker processes, the coordinator's end: one per physical device.

``WorkerClient.start_all`` starts one process per physical device
(``python -m executors.backend.workerproc``, which pins it to its cores) and
connects back to each over an authenticated local socket; the commands here
(``LoadCmd``, ``SendCmd``, ``RecvCmd``) are what only a worker answers. Workers
form one torch.distributed group (gloo on 127.0.0.1), and hidden states and
token-channel messages between devices are real ``send``/``recv`` calls between
workers. Each tensor-parallel group (``executors.backend.tensor``) gets a process
group of its own (NCCL where its members are CUDA devices), in which a sharded
model's all-reduces run. What a worker does with each command, and on which of
its lanes, is ``executors.backend.workerproc``.

This module imports no torch: the coordinator's process needs none to start
workers.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from pathlib import Path

STARTUP_TIMEOUT_S = 600
EXIT_WAIT_S = 10.0  # a closed worker's own exit, then SIGTERM
TERM_WAIT_S = 5.0   # after SIGTERM, then SIGKILL (a stopped worker ignores SIGTERM)


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


class WorkerClient:
    """The coordinator's end of one worker process."""

    def __init__(self, name: str, rank: int, conn, proc):
        self.name, self.rank, self.conn, self.proc = name, rank, conn, proc
        self._last_tag = 0  # tags of this worker's receives (each also uses tag + 1)

    @classmethod
    def start_all(cls, names: list[str], *, threads: int = 1,
                  groups: tuple[str, ...] = ()) -> dict[str, "WorkerClient"]:
        """Start one worker per name (``python -m executors.backend.workerproc``),
        connected back over an authenticated local socket; independent of the
        caller's ``__main__``. ``groups``: tensor-parallel groups (members joined by
        ``tensor.SEP``), each given its own process group in every worker."""
        key = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {**os.environ, "HETSPEC_WORKER_KEY": key.hex(),
               "HETSPEC_WORKER_NAMES": ",".join(names)}
        port = _free_port()
        procs = [subprocess.Popen(
            [sys.executable, "-m", "executors.backend.workerproc", name, str(rank),
             str(len(names)), str(port), str(threads), str(listener.address[1]),
             ";".join(groups)], env=env, cwd=str(_package_root()))
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
