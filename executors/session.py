"""A measured-run session: models loaded, devices started, batches decoded.

``Session`` maps the platform's placement roles to physical devices
(``cuda:N`` where present, otherwise CPU cores), starts one device per
physical name (in-process, or a worker process pinned to its core; a role on a
group runs sharded on every member, see ``executors.backend.tensor``), and decodes
prompt batches with any registered policy, unchanged. Before the clock starts
each batch's prompt is prefilled into every cache the schedule will use.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

from executors.backend import drafts, models
from executors.coordinate.book import Sequences
from executors.backend.clients import GroupClient, InlineClient
from executors.coordinate.coordinator import Coordinator, Placement
from executors.backend.device import FwdCmd, LocalDevice, ResetCmd
from executors.coordinate.footprint import footprint
from executors.backend.layers import Stack
from executors.coordinate.loop import call
from executors.backend.streaming import StreamSetupCmd
from executors.backend.tensor import SEP, members_of
from executors.coordinate.observers import OBSERVERS
from hwprofiles import load_platform
from hwprofiles.placement import check_overrides, resolve
from policies import PolicyContext, PolicyParams, build, parse_params
from policies.runs.measured import MeasuredSpan


@dataclass
class Options:
    """Executor settings beyond the simulated run's configuration."""

    max_new_tokens: int = 64
    threads: int = 1
    temperature: float = 0.0
    mode: str = "processes"  # or "inline": every device in this process, serially
    physical: dict[str, str] = field(default_factory=dict)  # role -> cpu:N / cuda:N


@dataclass
class BatchResult:
    generated: list[list[int]]
    wall_s: float
    steps: int
    spans: list[MeasuredSpan]
    acceptance: list[dict]
    stats: dict
    prefill_s: float = 0.0  # the prompt's prefill, before the clock of wall_s starts

    @property
    def first_token_s(self) -> float | None:
        """When the first Verify committed tokens, on the decoding's clock."""
        ends = [s.end_s for s in self.spans if s.type == "Verify"]
        return min(ends) if ends else None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: the prefill, then the decoding up to its first
        committed token (the prefill leaves the prompt's last token to that step)."""
        first = self.first_token_s
        return None if first is None else self.prefill_s + first


def physical_map(platform, placement: dict[str, str], physical: dict[str, str]):
    """(role -> physical device name, role -> platform device name, role -> the
    storage tier its weights stream from)."""
    import torch

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


class Session:
    """Loaded models and started devices for one platform, target and draft."""

    def __init__(self, platform: str, target: str, draft: str | None = None, *,
                 placement: dict[str, str] | None = None, options: Options | None = None,
                 seed: int = 0):
        self.opts = options or Options()
        self.platform = load_platform(platform)
        check_overrides(self.platform, placement or {})  # before minutes of loading
        self.seed = seed
        self.sources = {"target": target, **({"draft": draft} if draft else {})}
        weights = self.opts.mode == "inline"  # workers load their own copies
        self.loaded = {"target": models.load(target, seed=seed, weights=weights)}
        if models.self_layers(draft):
            self.loaded["draft"] = models.self_draft(self.loaded["target"], draft)
        elif draft:
            self.loaded["draft"] = models.load(draft, seed=seed + 1, weights=weights)
        drafts.warn_if_absent(target)
        self.adapters = drafts.available(target).get("adapter", ())  # trained exit layers
        self.ahead = multi_token_heads(target, draft, self.adapters)
        self.specs = {role: ld.spec for role, ld in self.loaded.items()}
        self.n_layers = {role: ld.spec.n_layers for role, ld in self.loaded.items()}
        self.placement = Placement(*physical_map(self.platform,
                                                 resolve(self.platform, placement),
                                                 self.opts.physical))
        self.clients: dict[str, object] = {}
        self._stacks = None
        self._batches = 0
        if self.opts.mode == "inline":
            import torch

            torch.set_num_threads(self.opts.threads)

    @property
    def tokenizer(self):
        return self.loaded["target"].tokenizer

    def context(self, prompts: list[list[int]]) -> PolicyContext:
        mean_len = sum(len(p) for p in prompts) // max(1, len(prompts))
        return PolicyContext(target=self.specs["target"], draft=self.specs.get("draft"),
                             tokens=self.opts.max_new_tokens, batch=len(prompts),
                             prompt_tokens=mean_len,
                             draft_multi_token=self.draft_multi_token)

    @property
    def draft_multi_token(self) -> bool:
        """Whether the draft's own head has multi-token heads (Mirror's eta then
        defaults to 2, as in the papers), or emits one token a pass."""
        n = models.self_layers(self.sources.get("draft"))
        return bool(n) and self.ahead.get("draft", {}).get(n, 0) > 0

    def _same_temperature(self, params: PolicyParams) -> None:
        """A schedule's own ``temperature`` (the tree's: what a simulation prices)
        must be the run's: the executor samples at --temperature alone."""
        priced = getattr(params, "temperature", None)
        if "temperature" in params.model_fields_set and priced != self.opts.temperature:
            raise ValueError(f"the schedule's temperature={priced:g} prices a simulated "
                             f"run; this run samples at --temperature "
                             f"{self.opts.temperature:g}: pass --temperature {priced:g} "
                             "or drop the setting")

    def decode(self, policy: str, params: PolicyParams | dict,
               prompts: list[list[int]]) -> BatchResult:
        """Decode one batch of prompts with a registered policy: ``params`` typed (a
        RunConfig's), or a dict validated here."""
        if any(len(p) < 2 for p in prompts):
            raise ValueError("every prompt needs at least 2 tokens; write a longer prompt")
        ctx = self.context(prompts)
        parsed = (params if isinstance(params, PolicyParams)
                  else parse_params(policy, params))
        self._same_temperature(parsed)
        found = footprint(build(policy, ctx, parsed), len(prompts))
        buffer_layers = found.pop("buffer_layers", 1)  # the streaming ring's size
        streams = {k[1:]: v for k, v in found.items() if k[0] == "stream"}
        uses = {k: v for k, v in found.items() if k[0] != "stream"}
        for role, model, _ in uses:  # layers an earlier schedule streamed come back
            streams.setdefault((role, model), ())
        clients = self._devices(uses, len(prompts))
        seqs = Sequences.start(prompts)
        coord = Coordinator(clients, self.placement, seqs, self.n_layers,
                            temperature=self.opts.temperature, observers=OBSERVERS,
                            adapters=self.adapters, ahead=self.ahead)
        start_s = time.perf_counter()  # streamed layers load once for the prefill
        self._streams(streams, buffer_layers, restore=True)
        self._prefill(coord, uses)
        prefill_s = time.perf_counter() - start_s
        self._streams(streams, buffer_layers, restore=False)
        coord.t0 = time.perf_counter()
        stats = coord.run(build(policy, ctx, parsed))
        short = self.opts.max_new_tokens - min(len(seqs.generated(r)) for r in range(seqs.batch))
        while short > 0:  # the budget is over all rows: run on until every row is done
            more = replace(ctx, tokens=short, prompt_tokens=ctx.prompt_tokens + short)
            coord.drain()
            coord.run(build(policy, more, parsed))
            short = self.opts.max_new_tokens - min(len(g) for g in
                                                   map(seqs.generated, range(seqs.batch)))
        wall_s = time.perf_counter() - coord.t0
        coord.drain()
        generated = [seqs.generated(r) for r in range(seqs.batch)]
        return BatchResult(generated, wall_s, coord.steps, coord.spans, coord.acceptance,
                           stats if isinstance(stats, dict) else {}, prefill_s)

    def _devices(self, uses, batch: int) -> dict:
        needed = {}
        for role, model, _width in uses:
            if model not in self.loaded:
                raise ValueError(f"the schedule runs model '{model}', but the run loads "
                                 f"only {', '.join(self.loaded)}; pass --draft NAME")
            needed.setdefault(self.placement.client(role), set()).add(model)
        self._check_groups(needed)
        self._start(needed)
        used = {m: self.clients[m] for name in needed for m in [name, *members_of(name)]}
        self._batches += 1
        names = self._physical_names()
        physical = sorted({m for name in needed for m in members_of(name)})
        call(used, [(name, ResetCmd(batch, self.seed * 1_000_003 + self._batches * 101
                                    + names.index(name))) for name in physical])
        return used

    def _physical_names(self) -> list[str]:
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
                kv = self.specs[model].n_kv_heads or self.specs[model].n_heads
                if len(members) > kv:
                    raise ValueError(f"{model} has {kv} key/value heads, too few to shard "
                                     f"over {len(members)} devices; place it on a smaller "
                                     "group or one device with --placement")
                whole = [m for m in members if model in needed.get(m, ())]
                if whole:
                    raise ValueError(f"{model} is sharded over {group} and also runs whole "
                                     f"on {whole[0]}; place every role that runs {model} "
                                     "on the same group with --placement")

    def _start(self, needed: dict[str, set]) -> None:
        if self.opts.mode == "inline":
            if any(name.startswith("cuda:") for name in needed):
                raise ValueError("CUDA devices run in worker processes; drop --inline")
            if any(SEP in name for name in needed):
                raise ValueError("tensor-parallel groups run in worker processes; drop "
                                 "--inline or place each role on one device")
            if self._stacks is None:
                self._stacks = {r: Stack(ld.model, ld.spec.n_layers)
                                for r, ld in self.loaded.items()}
                for role, stack in self._stacks.items():  # the target's own layers
                    if role == "target" or models.self_layers(self.sources[role]):
                        drafts.attach(stack, self.sources["target"])
            for name in needed:
                if name not in self.clients:
                    self.clients[name] = InlineClient(LocalDevice(name, self._stacks))
            return
        from executors.backend.workers import LoadCmd, WorkerClient

        if not self.clients:
            groups = sorted({c for c in self.placement.clients.values() if SEP in c})
            self.clients = WorkerClient.start_all(self._physical_names(),
                                                  threads=self.opts.threads,
                                                  groups=tuple(groups))
            self.clients.update({g: GroupClient(g) for g in groups})
        call(self.clients, [(name, LoadCmd({r: self.sources[r] for r in roles}, self.seed,
                                           self.sources["target"]))
                            for name, roles in needed.items()])

    def _streams(self, streams: dict, capacity: int, *, restore: bool) -> None:
        """Streamed layers: back in memory for the prefill, then out to disk."""
        cmds = []
        for (role, model), layers in sorted(streams.items()):
            client = self.placement.client(role)
            if SEP in client:
                if layers:
                    raise ValueError(f"'{role}' streams layers of {model}, which the "
                                     "executor cannot shard over a group; place it on one "
                                     f"device with --placement {role}=DEVICE")
                continue
            key = f"{self.sources[model]}-seed{self.seed + (model == 'draft')}"
            cmds.append((client, StreamSetupCmd(model, tuple(sorted(layers)), capacity, key,
                                                restore)))
        call(self.clients, cmds)

    def _prefill(self, coord: Coordinator, uses) -> None:
        """Fill every cache the schedule will use with the prompt but its last token."""
        seqs, cmds = coord.seqs, []
        for (role, model, width), stop in sorted(uses.items()):
            client = self.placement.client(role)
            book = coord.book(client, model, width)
            rows = [tuple(seqs.committed[j // width][:-1]) for j in range(seqs.batch * width)]
            if all(book.holds((0, stop), j, row) >= len(row) for j, row in enumerate(rows)):
                continue  # another role on this device already filled these layers
            longest = max(len(r) for r in rows)
            cmd = FwdCmd(coord.new_handle(), model, (0, stop), [0] * len(rows),
                         [len(r) for r in rows],
                         [list(r) + [r[-1]] * (longest - len(r)) for r in rows], width=width)
            for j, row in enumerate(rows):
                book.wrote((0, stop), j, row, len(row))
            cmds.append((client, cmd))
        call(coord.clients, cmds)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def multi_token_heads(target: str, draft: str | None,
                      adapters: tuple[int, ...]) -> dict[str, dict[int, int]]:
    """Per model of the session, exit layer -> the multi-token heads its trained
    exit head has there (the target's draft artifact; a self-draft shares it, and
    its own head at its last layer is that exit's unless an adapter sits there)."""
    counts = drafts.ahead_counts(target)
    out = {"target": counts}
    n = models.self_layers(draft)
    if n:
        out["draft"] = {e: c for e, c in counts.items() if e < n or n not in adapters}
    return out
