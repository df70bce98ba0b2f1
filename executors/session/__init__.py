"""A measured-run session: models loaded, devices started, batches decoded.

``Session`` keeps what every batch shares and hands each job to its module:

* ``loading``  — the target and draft models, and their trained draft heads;
* ``devices``  — placement roles on this machine's devices (``cuda:N`` where
  present, otherwise CPU cores), started in-process or as worker processes
  pinned to their cores; a role on a group runs sharded on every member;
* ``plan``     — the batch's schedule and its dry run: what runs where, how deep,
  what streams;
* ``prefill``  — before the clock starts, each batch's prompt in every cache the
  schedule will use;
* ``decode``   — the schedule run to the token budget, timed;
* ``batching`` — a batch whose rows join and leave between rounds of the schedule
  (continuous batching, for serving);
* ``options``  — the executor's settings and a batch's result.

Any registered policy decodes unchanged.
"""

from __future__ import annotations

import torch

from executors.session.batching import RunningBatch
from executors.session.decode import decode_batch
from executors.session.devices import Devices
from executors.session.loading import LoadedModels
from executors.session.options import BatchResult, Options
from executors.session.plan import context, plan_batch
from hwprofiles import load_platform
from hwprofiles.schema import check_overrides
from policies import PolicyContext, PolicyParams

__all__ = ["BatchResult", "Options", "RunningBatch", "Session"]


class Session:
    """Loaded models and started devices for one platform, target and draft."""

    def __init__(self, platform: str, target: str, draft: str | None = None, *,
                 placement: dict[str, str] | None = None, options: Options | None = None,
                 seed: int = 0):
        self.opts = options or Options()
        self.platform = load_platform(platform)
        check_overrides(self.platform, placement or {})  # before minutes of loading
        self.seed = seed
        weights = self.opts.mode == "inline"  # workers load their own copies
        self.models = LoadedModels.load(target, draft, seed=seed, weights=weights)
        self.devices = Devices(self.platform, placement, self.opts, self.models, seed)
        if self.opts.mode == "inline":
            torch.set_num_threads(self.opts.threads)

    @property
    def loaded(self) -> dict:
        return self.models.loaded

    @property
    def specs(self) -> dict:
        return self.models.specs

    @property
    def n_layers(self) -> dict[str, int]:
        return self.models.n_layers

    @property
    def tokenizer(self):
        return self.models.tokenizer

    @property
    def draft_multi_token(self) -> bool:
        return self.models.draft_multi_token

    @property
    def placement(self):
        return self.devices.placement

    @property
    def clients(self) -> dict:
        return self.devices.clients

    @property
    def stacks(self) -> dict | None:
        """Role -> layer stack of an inline session (None before its first batch)."""
        return self.devices.stacks

    def context(self, prompts: list[list[int]]) -> PolicyContext:
        return context(self.models, self.opts, prompts)

    def decode(self, policy: str, params: PolicyParams | dict,
               prompts: list[list[int]]) -> BatchResult:
        """Decode one batch of prompts with a registered policy: ``params`` typed (a
        RunConfig's), or a dict validated here."""
        plan = plan_batch(policy, params, prompts, self.models, self.opts)
        return decode_batch(plan, prompts, self.devices, self.opts)

    def running(self, policy: str, params: PolicyParams | dict,
                prompt: list[int]) -> RunningBatch:
        """An empty batch that rows join and leave between rounds of the schedule
        (``prompt``: a representative prompt, for the schedule's dry run)."""
        plan = plan_batch(policy, params, [prompt], self.models, self.opts)
        return RunningBatch(plan, self.devices, self.opts)

    def close(self) -> None:
        self.devices.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
