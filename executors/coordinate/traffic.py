"""The operations that move bytes or wait, as the executor runs them: Transfer,
AllReduce, StreamWeights and Delay, and the sends that bring a Forward's hidden
states to the device that reads them.

None of them touches the token bookkeeping (``executors.coordinate.book``),
except a Delay that proposes (a fast backup), which hands that to
``executors.coordinate.lookup``:
they reach devices through the coordinator's clients and placement and leave
spans, nothing else. That is why they live apart from ``coordinator``, whose
Forward, Verify and Outcome decide what each row holds.
"""

from __future__ import annotations

import time
from functools import partial

from executors.backend.device import SleepCmd
from executors.backend.streaming import StreamCmd
from executors.backend.tensor import AllReduceCmd, members_of
from executors.coordinate import lookup
from executors.coordinate.feeds import Handle, HandleInfo
from executors.coordinate.loop import Pending
from policies.ops import AllReduce, Delay, StreamWeights, Transfer


def handlers(coord) -> dict:
    """Operation type -> the coordinator's handler for it, for the task loop."""
    return {Delay: partial(delay, coord), Transfer: partial(transfer, coord),
            AllReduce: partial(allreduce, coord), StreamWeights: partial(stream, coord)}


def move(coord, info: HandleInfo, dst: str) -> list:
    """Commands that bring a handle's hidden states to ``dst`` (real sends): to
    each of a group's members that lacks them, from a source group's lead."""
    if dst in info.at:
        return []
    src = next(iter(info.at))
    held = {m for at in info.at for m in members_of(at)}
    info.at.add(dst)
    lead = members_of(src)[0]
    return [cmd for m in members_of(dst) if m not in held
            for cmd in coord.clients[m].fetch_commands(coord.clients[lead], lead, info.id)]


def delay(coord, op: Delay) -> Pending:
    coord.positions.proposed(op)  # what the simulator counts
    if op.proposes:  # a fast backup proposes by prompt lookup meanwhile
        lookup.backup(coord, op)
    if op.device is None:  # the host waits: no device owes a reply
        start = time.perf_counter()
        time.sleep(op.seconds)
        reply = (None, start, time.perf_counter())
        return Pending([], lambda _r: coord.span(op, "host", "host", reply, "delay"))
    client = coord.place.client(op.device)
    return Pending([(client, SleepCmd(op.seconds))],
                   lambda r: coord.span(op, op.device, client, r[0], "delay"))


def transfer(coord, op: Transfer) -> Pending:
    src, dst = coord.place.client(op.src), coord.place.client(op.dst)
    info = coord.handles.get(op.payload.id) if isinstance(op.payload, Handle) else None
    if info is not None and info.head is None:
        cmds = move(coord, info, dst)  # activations: the hidden states themselves
    elif src == dst or set(members_of(src)) & set(members_of(dst)):
        cmds = []  # a group shares the message with a member it includes
    else:
        lead_src, lead_dst = members_of(src)[0], members_of(dst)[0]
        cmds = coord.clients[lead_dst].message_commands(coord.clients[lead_src], lead_src,
                                                        op.nbytes)

    def finish(replies):
        if replies:
            hull = (None, min(r[1] for r in replies), max(r[2] for r in replies))
            coord.span(op, op.src, f"{src}->{dst}", hull, "transfer")
        return op.payload

    return Pending(cmds, finish)


def allreduce(coord, op: AllReduce) -> Pending:
    """``count`` real all-reduces of ``op.nbytes`` in the group's process group."""
    client = coord.place.client(op.group)
    if len(members_of(client)) < 2:  # a group of one: nothing to exchange
        return Pending([], lambda _r: None)

    def finish(replies):
        coord.collective_spans(op.group, client, replies[0][0], op.label or "all-reduce")
        return None

    return Pending([(client, AllReduceCmd(client, op.nbytes, op.count))], finish)


def stream(coord, op: StreamWeights) -> Pending:
    client = coord.place.client(op.device)

    def finish(replies):
        # streamed bytes show on the storage tier
        coord.span(op, op.device, client, replies[0], "stream",
                   track=coord.place.storage.get(op.device, "storage"),
                   bytes_read=replies[0][0]["bytes"])
        return None

    return Pending([(client, StreamCmd(op.model, op.layers))], finish)
