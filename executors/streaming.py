"""Decoder layers that live on disk: one file per layer, read every cycle.

Schedules under a DRAM budget (ar_stream, kangaroo, cats) stream the layers
that do not fit with ``StreamWeights``. The device keeps those layers' weights
in per-layer safetensors files under ``$HETSPEC_CACHE/layers/`` and frees them
from memory; a stream evicts the file from the page cache
(``POSIX_FADV_DONTNEED``) and reads it, so the bytes really come from the
disk, then installs the tensors in the layer. At most ``capacity`` streamed
layers are in memory at once (the schedule's buffer); loading one more frees
the oldest. Resident layers never leave memory.
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save_file

from executors.models import cache_root


@dataclass
class StreamSetupCmd:
    """Put ``layers`` of ``model`` on disk (``restore``: back in memory)."""

    model: str
    layers: tuple[int, ...]
    capacity: int
    key: str  # names the weights' directory: source and seed
    restore: bool = False


@dataclass
class StreamCmd:
    model: str
    layers: tuple[int, int]


class LayerStore:
    """The streamed layers of one model on one device."""

    def __init__(self, stack, key: str, layers, capacity: int):
        self.stack, self.capacity = stack, max(1, capacity)
        self.dir = cache_root() / "layers" / key.replace("/", "_").replace(":", "_")
        self.streamed = set(layers)
        self.loaded: deque[int] = deque()  # streamed layers in memory, oldest first
        self.in_memory: set[int] = set(self.streamed)
        self.bytes_read = 0
        for i in sorted(self.streamed):
            self._write(i)

    def path(self, i: int) -> Path:
        return self.dir / f"layer{i:03d}.safetensors"

    def _write(self, i: int) -> None:
        path = self.path(i)
        if path.is_file():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.stack.layers[i].state_dict().items()}
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(fd)
        save_file(state, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())  # clean pages: the page cache can drop them
        os.replace(tmp, path)

    def evict_all(self) -> None:
        for i in self.streamed:
            _free(self.stack.layers[i])
        self.loaded.clear()
        self.in_memory.clear()

    def restore_all(self) -> None:
        for i in sorted(self.streamed - self.in_memory):
            self._install(i, self._read(i))
        self.in_memory |= self.streamed

    def stream(self, layers: tuple[int, int]) -> int:
        """Read layers [a, b) from disk into memory; returns the bytes read."""
        nbytes = 0
        for i in range(*layers):
            if i not in self.streamed:
                continue
            data = self._read(i)
            nbytes += len(data)
            self._install(i, data)
            self.loaded.append(i)
            self.in_memory.add(i)
            while len(self.loaded) > self.capacity:
                old = self.loaded.popleft()
                if old not in self.loaded:
                    _free(self.stack.layers[old])
                    self.in_memory.discard(old)
        self.bytes_read += nbytes
        return nbytes

    def check(self, layers: tuple[int, int]) -> None:
        for i in range(*layers):
            if i in self.streamed and i not in self.in_memory:
                raise RuntimeError(f"layer {i} is on disk; the schedule must stream it "
                                   "(StreamWeights) before running it")

    def _read(self, i: int) -> bytes:
        fd = os.open(self.path(i), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # really hit the disk
            size = os.fstat(fd).st_size
            chunks, got = [], 0
            while got < size:
                chunk = os.read(fd, size - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _install(self, i: int, data: bytes) -> None:
        tensors = load_bytes(data)
        params = dict(self.stack.layers[i].named_parameters())
        for name, value in tensors.items():
            params[name].data = value.to(params[name].device)


def _free(layer) -> None:
    for p in layer.parameters():
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def setup(device, cmd: StreamSetupCmd) -> None:
    stores = device.__dict__.setdefault("layer_stores", {})
    store = stores.get(cmd.model)
    if store is not None and (store.streamed != set(cmd.layers)
                              or store.capacity != max(1, cmd.capacity)):
        store.restore_all()  # another schedule's split: start from all in memory
        store = None
    if store is None:
        store = stores[cmd.model] = LayerStore(device.stacks[cmd.model], cmd.key,
                                               cmd.layers, cmd.capacity)
    if cmd.restore:
        store.restore_all()
    else:
        store.evict_all()


def stream(device, cmd: StreamCmd) -> dict:
    store = device.__dict__.get("layer_stores", {}).get(cmd.model)
    if store is None:
        raise RuntimeError(f"model {cmd.model} streams no layers on {device.name}")
    return {"bytes": store.stream(cmd.layers)}


def check(device, model: str, layers: tuple[int, int]) -> None:
    store = device.__dict__.get("layer_stores", {}).get(model)
    if store is not None:
        store.check(layers)
