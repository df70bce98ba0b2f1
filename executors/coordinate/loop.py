"""The task loop that drives schedule generators against real devices.

A task is a schedule generator (the main one, or a branch of Spawn/Parallel).
Operations that need a device are submitted to the device's client and the
task sleeps until every command it submitted has answered; meanwhile other
tasks run, so fork/join branches on different devices really overlap.
Spawn, Join and Parallel are handled here; everything else by ``handlers``:
``handler(op) -> Pending`` (commands to submit and what to do with replies).
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from policies.ops import Join, Parallel, Spawn



@dataclass
class Pending:
    """Commands an operation submits, and how their replies become its result."""

    commands: list[tuple[str, object]]  # (client name, command)
    finish: Callable[[list], object]  # replies (result, start_s, end_s) in order -> value
    # finish may return another Pending: its commands are submitted for the same op


@dataclass(eq=False)
class Task:
    gen: object
    value: object = None
    done: bool = False
    result: object = None
    waiting_on: list = field(default_factory=list)  # tasks joined
    replies: list = field(default_factory=list)
    outstanding: int = 0
    pending: Pending | None = None


class Loop:
    """Runs one schedule to completion over a set of device clients."""

    def __init__(self, clients: dict, handlers: dict[type, Callable[[object], Pending]]):
        self.clients = clients
        self.handlers = handlers
        # A ticket is (this loop's random tag, a number): clients outlive loops, so a
        # late reply to a loop that ended early never passes for one of this loop's.
        self._tag = os.urandom(8).hex()
        self._numbers = itertools.count()
        self._tickets: dict[tuple[str, int], tuple[Task, int, _Merge | None]] = {}
        self._ready: deque[Task] = deque()
        self._joining: list[Task] = []

    def run(self, schedule):
        main = Task(schedule)
        self._ready.append(main)
        while not main.done:
            while self._ready:
                self._advance(self._ready.popleft())
            if not main.done:
                if not self._tickets:
                    raise RuntimeError("the schedule waits for something that never ends")
                self._collect()
        return main.result

    def _advance(self, task: Task) -> None:
        while True:
            try:
                op = task.gen.send(task.value)
            except StopIteration as stop:
                task.done, task.result = True, stop.value
                self._wake_joiners()
                return
            task.value = None
            if isinstance(op, Spawn):
                child = Task(op.branch)
                self._ready.append(child)
                task.value = child
            elif isinstance(op, (Join, Parallel)):
                tasks = list(op.tasks) if isinstance(op, Join) else [Task(b) for b in op.branches]
                if isinstance(op, Parallel):
                    self._ready.extend(tasks)
                task.waiting_on = tasks
                if not self._join_ready(task):
                    self._joining.append(task)
                    return
            else:
                self._submit(task, op)
                return

    def _join_ready(self, task: Task) -> bool:
        if all(t.done for t in task.waiting_on):
            task.value = tuple(t.result for t in task.waiting_on)
            task.waiting_on = []
            return True
        return False

    def _wake_joiners(self) -> None:
        still = []
        for t in self._joining:
            (self._ready.append if self._join_ready(t) else still.append)(t)
        self._joining = still

    def _submit(self, task: Task, op) -> None:
        handler = self.handlers.get(op.__class__)
        if handler is None:
            raise TypeError(f"schedule yielded {op!r}, which the executor cannot run")
        self._start(task, handler(op))

    def _start(self, task: Task, pending: Pending) -> None:
        task.pending, task.replies = pending, [None] * len(pending.commands)
        task.outstanding = len(pending.commands)
        if not pending.commands:
            self._finish(task)
            return
        for i, (client, cmd) in enumerate(pending.commands):
            route = getattr(self.clients[client], "route", None)  # a group: fan out
            parts = route(cmd) if route else [(client, cmd)]
            merge = _Merge(len(parts)) if route else None
            for name, part in parts:
                ticket = (self._tag, next(self._numbers))
                self._tickets[ticket] = (task, i, merge)
                self.clients[name].submit(ticket, part)

    def _finish(self, task: Task) -> None:
        pending, task.pending = task.pending, None
        value = pending.finish(task.replies)
        if isinstance(value, Pending):  # a second round of commands for the same op
            self._start(task, value)
            return
        task.value = value
        self._ready.append(task)

    def drain(self) -> None:
        """Wait for replies still owed (work the schedule started but never joined,
        such as a prefetch for a cycle that never came)."""
        while self._tickets:
            self._collect()

    def _collect(self) -> None:
        clients = list(self.clients.values())
        done = [c for c in clients if c.has_replies()]
        if not done:
            conns = {c.connection(): c for c in clients if c.connection() is not None}
            done = [conns[c] for c in wait(list(conns))]
        for client in done:
            for ticket, reply in client.replies():
                if ticket not in self._tickets:
                    raise RuntimeError("a device answered a command this run never sent "
                                       "(an earlier run stopped without draining its replies)")
                task, i, merge = self._tickets.pop(ticket)
                if merge is not None:
                    reply = merge.add(ticket, reply)
                    if reply is None:  # other members still owe theirs
                        continue
                task.replies[i] = reply
                task.outstanding -= 1
                if task.outstanding == 0:
                    self._finish(task)


class _Merge:
    """A group's replies to one command: the lead member's result (the first
    submitted) and the hull of all members' times, once all have answered."""

    def __init__(self, n: int):
        self.n, self.got = n, {}

    def add(self, ticket: tuple[str, int], reply):
        self.got[ticket] = reply
        if len(self.got) < self.n:
            return None
        replies = [self.got[t] for t in sorted(self.got)]
        return (replies[0][0], min(r[1] for r in replies), max(r[2] for r in replies))


@dataclass(frozen=True)
class _Batch:
    commands: list


def call(clients: dict, commands: list) -> list:
    """Submit commands outside any schedule and wait for all replies, in order."""
    if not commands:
        return []

    def one():
        return (yield _Batch(commands))

    handlers = {_Batch: lambda op: Pending(op.commands, lambda replies: replies)}
    loop = Loop(clients, handlers)
    out = loop.run(one())
    loop.drain()
    return out
