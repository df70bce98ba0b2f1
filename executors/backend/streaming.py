"""Decoder layers that live on disk: one file per layer, read every cycle.

Schedules under a DRAM budget (ar_stream, kangaroo, cats) stream the layers
that do not fit with ``StreamWeights``. The device keeps those layers' weights
in per-layer safetensors files under ``$HETSPEC_CACHE/layers/`` and frees them
from memory; a stream evicts the file from the page cache
(``POSIX_FADV_DONTNEED``) and reads it, so the bytes really come from the
disk, then installs the tensors in the layer. At most ``capacity`` streamed
layers are in memory at once (the schedule's buffer); loading one more frees
the oldest. Resident layers never leave memory.

A stream reads as a streaming runtime does, leaving the core to compute: with
``O_DIRECT`` (the disk writes into memory itself, no page-cache copy) into a
page-aligned buffer the store reuses (no fresh pages to fault in and zero),
and the layer's tensors are views of that buffer (no parse copy). A buffer is
reused only once no tensor views it: each read lends the buffer's memory through
a fresh ``memoryview``, which ``torch.frombuffer`` keeps alive as long as any
view of the read does, so a dead weak reference to it means the loan is over. On one SmolLM2 layer (14 MB) this takes
the core for ~0.7 ms instead of ~15 ms (buffered read into fresh memory, then
``safetensors.load``), which slowed the Forwards a stream overlapped. Where the
file system refuses ``O_DIRECT`` the read goes through the page cache.
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from executors.backend.models import cache_root


PAGE_BYTES = 4096  # O_DIRECT wants page-aligned memory and lengths
ALIGN_BYTES = 64  # where each tensor of a layer file starts (cache lines, AVX-512)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
          "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


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
        self.buffers: list[ReadBuffer] = []
        for i in sorted(self.streamed):
            self._write(i)

    def path(self, i: int) -> Path:
        return self.dir / f"layer{i:03d}.safetensors"

    def _write(self, i: int) -> None:
        path = self.path(i)
        if path.is_file() and _aligned(path):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.stack.layers[i].state_dict().items()}
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            for chunk in _aligned_safetensors(state):
                fh.write(chunk)
            fh.flush()
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
            nbytes += data.numel()
            self._install(i, data)
            self.loaded.append(i)
            self.in_memory.add(i)
            while len(self.loaded) > self.capacity:
                old = self.loaded.popleft()
                if old not in self.loaded:
                    _free(self.stack.layers[old])
                    self.in_memory.discard(old)
        return nbytes

    def check(self, layers: tuple[int, int]) -> None:
        for i in range(*layers):
            if i in self.streamed and i not in self.in_memory:
                raise RuntimeError(f"layer {i} is on disk; the schedule must stream it "
                                   "(StreamWeights) before running it")

    def _read(self, i: int) -> torch.Tensor:
        """Layer i's file, from the disk, in a free page-aligned buffer."""
        path = self.path(i)
        size = path.stat().st_size
        buf = self._buffer(page_rounded(size))
        got = read_into(path, buf, size)
        if got < size:
            raise RuntimeError(f"{path} ended after {got} of {size} bytes")
        return buf[:size]

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """A buffer of the store that no tensor views any more, else a new one."""
        for buf in self.buffers:
            if buf.nbytes == nbytes and buf.free():
                return buf.lend()
        buf = ReadBuffer(nbytes)
        self.buffers.append(buf)
        return buf.lend()

    def _install(self, i: int, data: torch.Tensor) -> None:
        params = dict(self.stack.layers[i].named_parameters())
        for name, value in _tensors(data).items():
            params[name].data = value.to(params[name].device)


class ReadBuffer:
    """Page-aligned memory the store owns, lent to one read at a time."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        # anonymous memory starts on a page boundary, as O_DIRECT needs
        self.memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.address = 0  # where the memory starts (the first loan tells)
        self._loan: weakref.ref | None = None

    def free(self) -> bool:
        """Whether no tensor of the last loan is alive any more."""
        return self._loan is None or self._loan() is None

    def lend(self) -> torch.Tensor:
        """The memory as a uint8 tensor; it and its views hold the loan."""
        loan = memoryview(self.memory)
        self._loan = weakref.ref(loan)
        out = torch.frombuffer(loan, dtype=torch.uint8)
        self.address = out.data_ptr()
        return out


def page_rounded(size: int) -> int:
    """``size`` rounded up to whole pages (what an O_DIRECT read transfers)."""
    return -(-size // PAGE_BYTES) * PAGE_BYTES


def page_aligned(nbytes: int) -> torch.Tensor:
    """A new uint8 buffer of ``nbytes`` whose memory starts on a page boundary."""
    raw = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8)
    skip = -raw.data_ptr() % PAGE_BYTES
    return raw[skip:skip + nbytes]


def read_into(path: Path, buf: torch.Tensor, size: int) -> int:
    """Read a file's ``size`` bytes into a page-aligned ``buf`` straight from the
    disk (O_DIRECT), or through the page cache on a file system that refuses
    it; returns the bytes read."""
    view = memoryview(buf.numpy())
    try:
        return _read_file(path, view, size, direct=True)
    except OSError:
        return _read_file(path, view, size, direct=False)


def _read_file(path: Path, view: memoryview, size: int, direct: bool) -> int:
    """Read a file from its start into view (page-rounded); returns bytes read."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
    fd = os.open(path, flags)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # really hit the disk
        got = 0
        while got < size:
            n = os.preadv(fd, [view[got:] if direct else view[got:size]], got)
            if n == 0:
                break
            got += n
        return got
    finally:
        os.close(fd)


def _aligned_safetensors(state: dict[str, torch.Tensor]):
    """A safetensors file's bytes whose tensors start ALIGN_BYTES-aligned (the
    header padded with spaces, as the format allows; tensors whose size is a
    multiple of ALIGN_BYTES first, then by element size), so views of a page-aligned read are aligned
    for the matmul kernels as freshly allocated tensors are."""
    names = sorted(state, key=lambda k: (_nbytes(state[k]) % ALIGN_BYTES != 0,
                                         -state[k].element_size()))
    header, offset = {}, 0
    for name in names:
        t = state[name]
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + _nbytes(t)]}
        offset += _nbytes(t)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN_BYTES)
    yield len(text).to_bytes(8, "little") + text
    for name in names:
        yield state[name].cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def _aligned(path: Path) -> bool:
    """Whether a layer file's tensor data starts ALIGN_BYTES-aligned (files
    written before the store aligned them are rewritten)."""
    with open(path, "rb") as fh:
        return (8 + int.from_bytes(fh.read(8), "little")) % ALIGN_BYTES == 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(data: torch.Tensor) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors as views of its bytes (no copy)."""
    raw = data.numpy()
    n = int.from_bytes(raw[:8].tobytes(), "little")
    header = json.loads(raw[8:8 + n].tobytes())
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        dtype, raw_bytes = DTYPES[meta["dtype"]], data[base + a:base + b]
        if (base + a) % raw_bytes.new_empty(0, dtype=dtype).element_size():
            raw_bytes = raw_bytes.clone()  # a misaligned tensor: its own copy
        out[name] = raw_bytes.view(dtype).view(meta["shape"])
    return out


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
