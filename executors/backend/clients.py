"""In-process device clients: every device lives in the coordinator's process.

A client takes ``submit(ticket, command)`` and later hands back
``(ticket, (result, start_s, end_s))`` from ``replies()``. The in-process
client runs each command at once, so the schedule runs serially; the
worker-process client (``executors.backend.workers``) runs them on pinned cores. A
group client stands for a tensor-parallel group: it only routes commands to
its members' clients.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from executors.backend.device import CompactCmd, FwdCmd, LocalDevice, RegroupCmd, ResetCmd
from executors.backend.tensor import AllReduceCmd, Shard, members_of
from executors.backend.workers import LoadCmd


@dataclass
class CopyCmd:
    """Take a handle's hidden states from another in-process device."""

    handle: int
    source: LocalDevice


@dataclass
class MessageCmd:
    """A message of ``nbytes`` arriving from another in-process device."""

    nbytes: float


class InlineClient:
    def __init__(self, device: LocalDevice):
        self.device = device
        self._done: deque = deque()

    def submit(self, ticket: tuple[str, int], cmd) -> None:
        if isinstance(cmd, CopyCmd):
            start = time.perf_counter()
            self.device.keep(cmd.handle, {"hidden": cmd.source.hidden(cmd.handle).clone()})
            reply = (None, start, time.perf_counter())
        elif isinstance(cmd, MessageCmd):
            start = time.perf_counter()
            bytearray(int(cmd.nbytes))
            reply = (None, start, time.perf_counter())
        else:
            reply = self.device.execute(cmd)
        self._done.append((ticket, reply))

    def has_replies(self) -> bool:
        return bool(self._done)

    def replies(self) -> list:
        out = list(self._done)
        self._done.clear()
        return out

    def connection(self):
        return None

    def fetch_commands(self, source: "InlineClient", source_name: str, handle: int) -> list:
        if source is self:
            return []
        return [(self.device.name, CopyCmd(handle, source.device))]

    def message_commands(self, source: "InlineClient", source_name: str,
                         nbytes: float) -> list:
        return [(self.device.name, MessageCmd(nbytes))]

    def close(self) -> None:
        pass


def _shard_load(cmd: LoadCmd, group: str, index: int, size: int) -> LoadCmd:
    return replace(cmd, shards={role: Shard(group, index, size) for role in cmd.sources})


def _same(cmd, group: str, index: int, size: int):
    return cmd


class GroupClient:
    """The coordinator's view of a group: commands fan out to the members (the
    task loop merges their replies: the lead's result, the hull of their times)."""

    # command type -> (command, group, member index, group size) -> the member's command
    FAN_OUT = {FwdCmd: _same, ResetCmd: _same, CompactCmd: _same, RegroupCmd: _same,
               AllReduceCmd: _same, LoadCmd: _shard_load}

    def __init__(self, name: str):
        self.name, self.members = name, members_of(name)

    def route(self, cmd) -> list[tuple[str, object]]:
        for_member = self.FAN_OUT.get(type(cmd))
        if for_member is None:  # decisions read the replicated logits: the lead
            return [(self.members[0], cmd)]
        size = len(self.members)
        return [(m, for_member(cmd, self.name, i, size)) for i, m in enumerate(self.members)]

    def has_replies(self) -> bool:
        return False

    def replies(self) -> list:
        return []

    def connection(self):
        return None

    def close(self) -> None:
        pass
