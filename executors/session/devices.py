"""A session's devices: placement roles on physical devices, started on first use.

The platform's devices map to this machine's (``cuda:N`` where present,
otherwise CPU cores; ``--physical`` overrides a role); a role on a group runs
sharded on every member (``executors.backend.tensor``). Devices start once, for
the first batch that needs them: in this process (``inline``) or one worker
process per physical device, pinned to its core (``executors.backend.workers``);
each batch then resets their caches and seeds.
"""

from __future__ import annotations

import os

import torch

from executors.backend import drafts
from executors.backend.clients import GroupClient, InlineClient
from executors.backend.device import LocalDevice, ResetCmd
from executors.backend.layers import Stack
from executors.backend.tensor import SEP, members_of
from executors.backend.workers import LoadCmd, WorkerClient
from executors.coordinate.coordinator import Placement
from executors.coordinate.loop import call
from executors.session.loading import LoadedModels
from executors.session.options import Options
from hwprofiles.schema import resolve


def physical_map(platform, placement: dict[str, str], physical: dict[str, str]):
    """(role -> physical device name, role -> platform device name, role -> the
    storage tier its weights stream from)."""
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n_cores = len(os.sched_getaffinity(0))
    phys, gpu_i, cpu_i = {}, 0, 0
    for d in platform.devices:
        if d.kind in ("gpu", "npu") and gpu_i < n_cuda:
            phys[d.name], gpu_i = f"cuda:{gpu_i}", gpu_i + 1
        else:
            phys[d.name], cpu_i = f"cpu:{cpu_i % n_cores}", cpu_i + 1
    clients, tracks, storage = {}, {}, {}
    for role, where in placement.items():
        tracks[role] = where
        clients[role] = group_client(platform, where, phys)
        storage[role] = platform.device(platform.members(where)[0]).storage or "storage"
    for role, name in physical.items():  # cuda:0+cuda:1: a group of physical devices
        for member in members_of(name):
            check_physical(member, n_cuda, n_cores)
        clients[role] = name
        tracks.setdefault(role, name)
    for d in platform.devices:  # a schedule may name platform devices directly
        clients.setdefault(d.name, phys[d.name])
        tracks.setdefault(d.name, d.name)
    for g in platform.groups:  # and groups (AllReduce), where this machine has the cores
        members = [phys[m] for m in g.members]
        if len(set(members)) == len(members):
            clients.setdefault(g.name, SEP.join(members))
            tracks.setdefault(g.name, g.name)
    return clients, tracks, storage


def group_client(platform, where: str, phys: dict[str, str]) -> str:
    """The client name of a device or group: a group's physical members joined."""
    members = [phys[m] for m in platform.members(where)]
    if len(set(members)) < len(members):
        raise ValueError(f"group '{where}' needs {len(members)} distinct devices, but this "
                         f"machine maps its members to {', '.join(members)}; run on a "
                         "machine with more cores or place the role on one device")
    return SEP.join(members)


def check_physical(name: str, n_cuda: int, n_cores: int) -> None:
    kind, _, index = name.partition(":")
    limit = {"cpu": n_cores, "cuda": n_cuda}.get(kind)
    if limit is None or not index.isdigit() or int(index) >= limit:
        raise ValueError(f"physical device '{name}' does not exist here; use cpu:0..cpu:"
                         f"{n_cores - 1}" + (f" or cuda:0..cuda:{n_cuda - 1}" if n_cuda
                                             else " (no CUDA device is present)"))


class Devices:
    """The session's clients by physical name, started as batches need them."""

    def __init__(self, platform, placement: dict[str, str] | None, options: Options,
                 loaded: LoadedModels, seed: int):
        self.opts, self.models, self.seed = options, loaded, seed
        self.placement = Placement(*physical_map(platform, resolve(platform, placement),
                                                 options.physical))
        self.clients: dict[str, object] = {}
        self.stacks = None  # role -> Stack, inline only
        self._batches = 0

    def start(self, uses, batch: int) -> dict:
        """Start the devices ``uses`` (the batch's (role, model, width) keys) needs,
        reset them for a batch of ``batch`` rows; their clients by name."""
        needed = {}
        for role, model, _width in uses:
            if model not in self.models.loaded:
                raise ValueError(f"the schedule runs model '{model}', but the run loads "
                                 f"only {', '.join(self.models.loaded)}; pass --draft NAME")
            needed.setdefault(self.placement.client(role), set()).add(model)
        self._check_groups(needed)
        if self.opts.mode == "inline":
            self._start_inline(needed)
        else:
            self._start_workers(needed)
        used = {m: self.clients[m] for name in needed for m in [name, *members_of(name)]}
        self._batches += 1
        names = self.physical_names()
        physical = sorted({m for name in needed for m in members_of(name)})
        call(used, [(name, ResetCmd(batch, self.seed * 1_000_003 + self._batches * 101
                                    + names.index(name))) for name in physical])
        return used

    def physical_names(self) -> list[str]:
        return sorted({m for c in self.placement.clients.values() for m in members_of(c)})

    def _check_groups(self, needed: dict[str, set]) -> None:
        """A model sharded over a group runs only there, on no more members than it
        has key/value heads."""
        for name, used in needed.items():
            if SEP not in name:
                continue
            members = members_of(name)
            group = next(t for r, t in sorted(self.placement.tracks.items())
                         if self.placement.clients.get(r) == name)
            for model in sorted(used):
                spec = self.models.specs[model]
                kv = spec.n_kv_heads or spec.n_heads
                if len(members) > kv:
                    raise ValueError(f"{model} has {kv} key/value heads, too few to shard "
                                     f"over {len(members)} devices; place it on a smaller "
                                     "group or one device with --placement")
                whole = [m for m in members if model in needed.get(m, ())]
                if whole:
                    raise ValueError(f"{model} is sharded over {group} and also runs whole "
                                     f"on {whole[0]}; place every role that runs {model} "
                                     "on the same group with --placement")

    def _start_inline(self, needed: dict[str, set]) -> None:
        if any(name.startswith("cuda:") for name in needed):
            raise ValueError("CUDA devices run in worker processes; drop --inline")
        if any(SEP in name for name in needed):
            raise ValueError("tensor-parallel groups run in worker processes; drop "
                             "--inline or place each role on one device")
        if self.stacks is None:
            self.stacks = {r: Stack(ld.model, ld.spec.n_layers)
                           for r, ld in self.models.loaded.items()}
            for role, stack in self.stacks.items():  # the target's own layers
                if role == "target" or self.models.self_drafted(role):
                    drafts.attach(stack, self.models.sources["target"])
        for name in needed:
            if name not in self.clients:
                self.clients[name] = InlineClient(LocalDevice(name, self.stacks))

    def _start_workers(self, needed: dict[str, set]) -> None:
        sources = self.models.sources
        if not self.clients:
            groups = sorted({c for c in self.placement.clients.values() if SEP in c})
            self.clients = WorkerClient.start_all(self.physical_names(),
                                                  threads=self.opts.threads,
                                                  groups=tuple(groups))
            self.clients.update({g: GroupClient(g) for g in groups})
        call(self.clients, [(name, LoadCmd({r: sources[r] for r in roles}, self.seed,
                                           sources["target"]))
                            for name, roles in needed.items()])

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
