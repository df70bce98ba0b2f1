"""In-process device clients: every device lives in the coordinator's process.

A client takes ``submit(ticket, command)`` and later hands back
``(ticket, (result, start_s, end_s))`` from ``replies()``. The in-process
client runs each command at once, so the schedule runs serially; the
worker-process client (``executors.workers``) runs them on pinned cores.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from executors.device import LocalDevice


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

    def submit(self, ticket: int, cmd) -> None:
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
