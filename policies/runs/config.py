"""The settings of a run that every layer reads, typed once at the bottom.

``RunSettings`` is what determines a run, simulated or measured, less the type
of its acceptance model (the simulator's own, ``simcore.acceptance``): the
platform, the models, the schedule and its typed parameters, the token and batch
sizes, the seed, the placement, widths and switches, the software stack. The
runtimes and the run vocabulary read it by this type (``executors.measure``,
``policies.runs.metrics.run_metrics``); ``analyses.run.config.RunConfig`` narrows
``acceptance`` to the union of the acceptance models and is what callers build.

Frozen, no unknown fields, finite numbers (no true/false for a number), sizes
under the caps below. ``params`` is the schedule's own parameter model, picked by
``policy`` from the policy registry (the tag lives on the settings, not in the
parameters, so ``--set`` keys stay the parameters' own). A record writes
``params`` and ``acceptance`` as given (``{"dram_budget_gb": 8}``, not the
validated 8.0 and every default): what the user asked for, which validates to
the same models again when a record is replayed. ``revised`` derives changed
settings and validates them.
"""

from __future__ import annotations

from typing import Any

from pydantic import (Field, PrivateAttr, field_serializer, field_validator,
                      model_serializer, model_validator)

from hwprofiles import DEFAULT_STACK, load_stack
from hwprofiles.models import BITS, COMPUTE_BITS, Bits, ComputeBits, ModelSpec
from hwprofiles.numbers import StrictModel
from policies.base import PolicyParams
from policies.prefill import MAX_PREFILL_PASSES

# Caps on a run's size, far above real use; beyond them the simulation would run
# for hours with no output, so the value is a typo (or an exponent slip).
MAX_TOKENS = 1_000_000  # tokens generated per sequence; real outputs stay below 1e5
MAX_BATCH = 16_384  # sequences decoded together; serving engines batch a few thousand
MAX_PROMPT_TOKENS = 10_000_000  # the longest context windows hold 1e7 tokens
CAPS = {"tokens": (MAX_TOKENS, "lower --tokens"), "batch": (MAX_BATCH, "lower --batch"),
        "prompt_tokens": (MAX_PROMPT_TOKENS, "lower prompt_tokens")}

# The two settings a run records as the user gave them (see RunSettings).
GIVEN = ("params", "acceptance")

# settings a record omits when they hold these values (see RunSettings._defaults_unwritten)
UNWRITTEN_DEFAULTS = {"stack": DEFAULT_STACK, "compute_bits": None}


class RunSettings(StrictModel):
    """Everything that determines a run but the type of its acceptance model; see
    the module's docstring. Built and validated once, where a run is asked for,
    as ``analyses.run.config.RunConfig`` (which types ``params`` by the policy
    and ``acceptance`` by its kind, and keeps both as given for ``_as_given``);
    everything downstream reads it by this type."""

    platform: str
    target: str
    draft: str | None = None
    policy: str = "sd"
    params: PolicyParams
    # an acceptance model of the simulator's (simcore.acceptance), narrowed by
    # analyses.run.config.RunConfig; the runtimes pass it through
    acceptance: Any
    tokens: int = Field(2000, ge=1)
    batch: int = Field(1, ge=1)
    seed: int = Field(0, ge=0)
    deterministic: bool = False
    prompt_tokens: int = Field(128, ge=0)
    prefill_chunk: int | None = Field(None, ge=1)
    fixed_context: bool = False
    contention: bool = False
    placement: dict[str, str] = Field(default_factory=dict)
    weight_bits: Bits | None = None
    kv_bits: Bits | None = None
    compute_bits: ComputeBits | None = None
    expert_parallel: bool = False
    memory_check: bool = True
    # the software stack (hwprofiles.stacks): a shipped name or a YAML path
    stack: str = DEFAULT_STACK
    _given: dict[str, tuple] = PrivateAttr(default_factory=dict)

    @field_serializer(*GIVEN)
    def _as_given(self, value, info) -> dict[str, Any]:
        typed, given = self._given.get(info.field_name, (None, None))
        # a copy whose setting was replaced without validation writes the new one
        return given if typed is value else plain_setting(value)

    @model_serializer(mode="wrap")
    def _defaults_unwritten(self, handler):
        """Settings added after records existed are written only when they are not
        their default (the default stack, compute at the weights' width): records
        and outputs made before them read the same, and a record without one
        replays under the default."""
        data = handler(self)
        if isinstance(data, dict):
            for key, default in UNWRITTEN_DEFAULTS.items():
                if key in data and data[key] == default:
                    del data[key]
        return data

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, value: str) -> str:
        """A stack is loaded (and checked) now, so a typo fails before any run."""
        load_stack(value)
        return value

    def revised(self, **changes) -> RunSettings:
        """This config with ``changes`` (``policy=``, ``params=`` as given, ...),
        validated as a new one."""
        return type(self).model_validate({**self.model_dump(), **changes})

    def given(self, name: str) -> dict[str, Any]:
        """``params`` or ``acceptance`` as given: what a record writes."""
        return dict(self.model_dump(include={name})[name])

    @field_validator("tokens", "batch", "prompt_tokens")
    @classmethod
    def _under_cap(cls, value: int, info) -> int:
        cap, fix = CAPS[info.field_name]
        if value > cap:
            shown = f"{value:,}" if value < 10**9 else f"{value:.3g}"
            raise ValueError(f"{info.field_name} is {shown}, over the cap of {cap:,} "
                             f"(far beyond real use; a run that size would take hours); "
                             f"{fix}")
        return value

    @field_validator("weight_bits", "kv_bits", mode="before")
    @classmethod
    def _known_width(cls, value, info):
        if value is not None and (isinstance(value, bool) or value not in BITS):
            raise ValueError(f"{info.field_name} is {value!r}; choose one of "
                             f"{', '.join(map(str, BITS))} (bits per stored number)")
        return value

    @field_validator("compute_bits", mode="before")
    @classmethod
    def _compute_width(cls, value):
        if value is not None and (isinstance(value, bool) or value not in COMPUTE_BITS):
            raise ValueError(f"compute_bits is {value!r}; choose 8 (FP8 or INT8 matrix "
                             "products) or 16")
        return value

    @field_validator("contention", "expert_parallel", "memory_check", mode="before")
    @classmethod
    def _on_or_off(cls, value, info):
        """A switch is on or off (--set parses on/off/true/false into a bool); 'maybe'
        or 2 is a slip, refused with the words that work."""
        if not isinstance(value, bool):
            raise ValueError(f"{info.field_name} is {value!r}; write "
                             f"{info.field_name}=on or {info.field_name}=off")
        return value

    def run_model(self, spec: ModelSpec) -> ModelSpec:
        """A model as this run stores, computes and places it: its weights and KV
        cache at the widths asked for, its matrix products at compute_bits, its
        experts sharded whole under expert_parallel."""
        spec = spec.with_precision(self.weight_bits, self.kv_bits, self.compute_bits)
        if self.expert_parallel and spec.is_moe:
            spec = spec.model_copy(update={"expert_parallel": True})
        return spec

    @model_validator(mode="after")
    def _prefill_passes(self):
        if self.prefill_chunk is not None:
            passes = -(-self.prompt_tokens // self.prefill_chunk)
            if passes > MAX_PREFILL_PASSES:
                raise ValueError(f"prefill_chunk={self.prefill_chunk} cuts prompt_tokens="
                                 f"{self.prompt_tokens:,} into {passes:,} passes, over the "
                                 f"cap of {MAX_PREFILL_PASSES:,}; raise prefill_chunk")
        return self

    @field_validator("placement")
    @classmethod
    def _named_roles(cls, placement: dict[str, str]) -> dict[str, str]:
        for role, where in placement.items():
            if not role.strip() or not where.strip():
                raise ValueError(f"placement '{role}={where}' lacks a role or a device; "
                                 "write ROLE=DEVICE, e.g. draft=gpu4")
        return placement


def plain_setting(setting: Any) -> Any:
    """A setting as a record writes it: a mapping as given; parameters as the fields
    set; an acceptance model whole (its ``kind`` tells the models apart)."""
    if isinstance(setting, PolicyParams):
        return setting.model_dump(exclude_unset=True)
    if hasattr(setting, "model_dump"):
        return setting.model_dump()
    return dict(setting) if isinstance(setting, dict) else setting
