"""What one batch will touch, from the schedule's dry run, before any device starts.

The schedule is built for the batch (its ``PolicyContext``: the models' shapes,
the token budget, the batch and its mean prompt length) and dry-run
(``executors.coordinate.footprint``): which (device role, model, row width)
run how deep, which layers stream from storage, and the streaming ring's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from executors.coordinate.footprint import footprint
from executors.session.loading import LoadedModels
from executors.session.options import Options
from policies import PolicyContext, PolicyParams, build, parse_params


@dataclass(frozen=True)
class BatchPlan:
    """A batch's schedule and what its dry run found."""

    policy: str
    params: PolicyParams
    ctx: PolicyContext
    uses: dict  # (device role, model role, row width) -> deepest layer stop
    streams: dict  # (device role, model role) -> layers streamed from storage
    buffer_layers: int  # the streaming ring's size

    def schedule(self, ctx: PolicyContext | None = None):
        """A fresh run of the schedule (for ``ctx``, by default the batch's)."""
        return build(self.policy, ctx or self.ctx, self.params)


def context(loaded: LoadedModels, opts: Options, prompts: list[list[int]]) -> PolicyContext:
    mean_len = sum(len(p) for p in prompts) // max(1, len(prompts))
    return PolicyContext(target=loaded.specs["target"], draft=loaded.specs.get("draft"),
                         tokens=opts.max_new_tokens, batch=len(prompts),
                         prompt_tokens=mean_len,
                         draft_multi_token=loaded.draft_multi_token)


def plan_batch(policy: str, params: PolicyParams | dict, prompts: list[list[int]],
               loaded: LoadedModels, opts: Options) -> BatchPlan:
    """The batch's schedule (``params`` typed, or a dict validated here) and its
    footprint; refuses prompts too short to decode."""
    if any(len(p) < 2 for p in prompts):
        raise ValueError("every prompt needs at least 2 tokens; write a longer prompt")
    ctx = context(loaded, opts, prompts)
    parsed = (params if isinstance(params, PolicyParams)
              else parse_params(policy, params))
    same_temperature(parsed, opts.temperature)
    found = footprint(build(policy, ctx, parsed), len(prompts))
    buffer_layers = found.pop("buffer_layers", 1)
    streams = {k[1:]: v for k, v in found.items() if k[0] == "stream"}
    uses = {k: v for k, v in found.items() if k[0] != "stream"}
    for role, model, _ in uses:  # layers an earlier schedule streamed come back
        streams.setdefault((role, model), ())
    return BatchPlan(policy, parsed, ctx, uses, streams, buffer_layers)


def same_temperature(params: PolicyParams, temperature: float) -> None:
    """A schedule's own ``temperature`` (the tree's: what a simulation prices)
    must be the run's: the executor samples at --temperature alone."""
    priced = getattr(params, "temperature", None)
    if "temperature" in params.model_fields_set and priced != temperature:
        raise ValueError(f"the schedule's temperature={priced:g} prices a simulated "
                         f"run; this run samples at --temperature "
                         f"{temperature:g}: pass --temperature {priced:g} "
                         "or drop the setting")
