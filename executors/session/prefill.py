"""Before a batch's clock starts: streamed layers back, every cache filled.

Layers a schedule streams from storage are back in memory for the prefill (so
they load once), then out to disk again; each cache the schedule will use is
filled with the prompt but its last token, which the first decoding step feeds.
"""

from __future__ import annotations

from executors.backend.device import FwdCmd
from executors.backend.streaming import StreamSetupCmd
from executors.backend.tensor import SEP
from executors.coordinate.coordinator import Coordinator, Placement
from executors.coordinate.loop import call
from executors.session.devices import Devices


def set_streams(devices: Devices, streams: dict, capacity: int, *, restore: bool) -> None:
    """Streamed layers: back in memory for the prefill (``restore``), then out to
    disk; ``capacity``: the streaming ring's size in layers."""
    cmds, sources, seed = [], devices.models.sources, devices.seed
    for (role, model), layers in sorted(streams.items()):
        client = devices.placement.client(role)
        if SEP in client:
            if layers:
                raise ValueError(f"'{role}' streams layers of {model}, which the "
                                 "executor cannot shard over a group; place it on one "
                                 f"device with --placement {role}=DEVICE")
            continue
        key = f"{sources[model]}-seed{seed + (model == 'draft')}"
        cmds.append((client, StreamSetupCmd(model, tuple(sorted(layers)), capacity, key,
                                            restore)))
    call(devices.clients, cmds)


def prefill(coord: Coordinator, placement: Placement, uses: dict, first: int = 0) -> None:
    """Fill every cache the schedule will use (``uses``: (role, model, width) ->
    deepest layer stop) with the prompt but its last token, for the sequences from
    ``first`` on (the ones that just joined a running batch; the others' cache rows
    are left as they are)."""
    seqs, cmds = coord.seqs, []
    if first >= seqs.batch:
        return
    for (role, model, width), stop in sorted(uses.items()):
        client = placement.client(role)
        book = coord.book(client, model, width)
        rows = [tuple(seqs.committed[j // width][:-1])
                for j in range(first * width, seqs.batch * width)]
        if all(book.holds((0, stop), first * width + j, row) >= len(row)
               for j, row in enumerate(rows)):
            continue  # another role on this device already filled these layers
        longest = max(len(r) for r in rows)
        cmd = FwdCmd(coord.new_handle(), model, (0, stop), [0] * len(rows),
                     [len(r) for r in rows],
                     [list(r) + [r[-1]] * (longest - len(r)) for r in rows], width=width,
                     rows=(first * width, seqs.batch * width) if first else None)
        for j, row in enumerate(rows):
            book.wrote((0, stop), first * width + j, row, len(row))
        cmds.append((client, cmd))
    call(coord.clients, cmds)
