"""One pydantic tree for a run's configuration, and ``--set`` parsing."""

from __future__ import annotations

import math
from typing import Annotated, Any, Union

from pydantic import (Field, PrivateAttr, field_serializer, field_validator,
                      model_validator)

from hwprofiles.numbers import StrictModel
from hwprofiles.models import BITS, Bits, ModelSpec
from policies import PolicyParams, entry, names, parse_params
from policies.prefill import MAX_PREFILL_PASSES
from simcore import acceptance

RUN_KEYS = {"contention": "fair-share memory tiers among concurrent readers (on/off)",
            "prompt_tokens": "KV-cache positions before decoding starts (at most 1e7, "
                             "the longest context windows)",
            "weight_bits": "storage width of the models' weights: 4, 8, 16 or 32 "
                           "(default: the model's dtype); FLOPs are unchanged",
            "kv_bits": "storage width of the KV cache: 4, 8, 16 or 32 (default: the "
                       "model's dtype)",
            "memory_check": "refuse placements whose weights, KV cache and activations "
                            "overflow a device's memory (on, the default; off: a what-if "
                            "run past the hardware's capacity)",
            "expert_parallel": "shard a mixture-of-experts model's experts whole over "
                               "its group (all-to-all dispatch and combine) instead of "
                               "tensor-parallel (on/off)",
            "prefill_chunk": "positions per prefill pass: chunked prefill, each chunk "
                             "attending to those before it (default: one pass)"}


# Caps on a run's size, far above real use; beyond them the simulation would run
# for hours with no output, so the value is a typo (or an exponent slip).
MAX_TOKENS = 1_000_000  # tokens generated per sequence; real outputs stay below 1e5
MAX_BATCH = 16_384  # sequences decoded together; serving engines batch a few thousand
MAX_PROMPT_TOKENS = 10_000_000  # the longest context windows hold 1e7 tokens
CAPS = {"tokens": (MAX_TOKENS, "lower --tokens"), "batch": (MAX_BATCH, "lower --batch"),
        "prompt_tokens": (MAX_PROMPT_TOKENS, "lower prompt_tokens")}


# The acceptance models, told apart by their ``kind`` (STYLE 5: a discriminated union).
Acceptance = Annotated[Union[tuple(acceptance.MODELS.values())],
                       Field(discriminator="kind")]

# The two settings a run records as the user gave them (see RunConfig).
GIVEN = ("params", "acceptance")


class RunConfig(StrictModel):
    """Everything that determines a run, simulated (analyses.run.api) or measured
    (executors.measure); written beside its results.

    Frozen, no unknown fields, finite numbers (no true/false for a number), sizes
    under the caps above. Built and validated once, where a run is asked for (the
    CLI's commands, the API's caller); everything downstream reads it typed.

    ``params`` is the schedule's own parameter model, picked by ``policy`` from the
    policy registry: a union of the registered models tagged by the policy name
    (the tag lives on the config, not in the parameters, so ``--set`` keys stay the
    parameters' own). ``acceptance`` is one of the acceptance models, tagged by
    its ``kind``; a trace is read and checked line by line here. Both take their
    defaults from their models alone.

    A record writes both as given (``{"dram_budget_gb": 8}``, not the validated
    8.0 and every default): what the user asked for, which validates to the same
    models again when a record is replayed. ``revised`` derives a changed config
    and validates it."""

    platform: str
    target: str
    draft: str | None = None
    policy: str = "sd"
    params: PolicyParams
    acceptance: Acceptance
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
    expert_parallel: bool = False
    memory_check: bool = True
    _given: dict[str, tuple] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _typed_settings(cls, data: Any, handler):
        """Validate ``params`` against the model ``policy`` registers (refused in one
        sentence naming the parameter); keep both settings as given, for records."""
        if not isinstance(data, dict):  # a RunConfig already (or pydantic's refusal)
            return handler(data)
        policy = data.get("policy", cls.model_fields["policy"].default)
        params = data.get("params", {})
        if data.get("draft") == NGRAM:  # prompt lookup: a proposer, not a model
            data, params = {**data, "draft": None}, _lookup_params(policy, params)
        acc = data.get("acceptance", acceptance.default())
        config = handler({**data, "params": _policy_params(policy, params),
                          "acceptance": acc})
        config._given = {"params": (config.params, _plain(params)),
                         "acceptance": (config.acceptance, _plain(acc))}
        return config

    @field_serializer(*GIVEN)
    def _as_given(self, value, info) -> dict[str, Any]:
        typed, given = self._given.get(info.field_name, (None, None))
        # a copy whose setting was replaced without validation writes the new one
        return given if typed is value else _plain(value)

    def revised(self, **changes) -> RunConfig:
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
        """A model as this run stores and places it: its weights and KV cache at
        the widths asked for, its experts sharded whole under expert_parallel."""
        spec = spec.with_precision(self.weight_bits, self.kv_bits)
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

    @field_validator("acceptance", mode="before")
    @classmethod
    def _finite_acceptance(cls, values: Any) -> Any:
        """Policy parameters judge their own numbers; acceptance values are checked
        here (the acceptance models read true as 1), so that a NaN never reaches a
        sampler."""
        for key, value in (values.items() if isinstance(values, dict) else ()):
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, bool) or (isinstance(item, float)
                                              and not math.isfinite(item)):
                    raise ValueError(f"acceptance setting '{key}' is {item}, not a finite "
                                     "number; give a finite value")
        return values

    @field_validator("acceptance")
    @classmethod
    def _read_trace(cls, model):
        """A trace is read and every line checked now, before any simulation."""
        return model.load()

    @field_validator("placement")
    @classmethod
    def _named_roles(cls, placement: dict[str, str]) -> dict[str, str]:
        for role, where in placement.items():
            if not role.strip() or not where.strip():
                raise ValueError(f"placement '{role}={where}' lacks a role or a device; "
                                 "write ROLE=DEVICE, e.g. draft=gpu4")
        return placement


NGRAM = "ngram"  # --draft ngram: prompt lookup on the host (policies.ngram)


def _lookup_params(policy: str, params: Any) -> Any:
    """``params`` with the policy's proposer set to prompt lookup, for a policy that
    has one; any other is refused naming those that do."""
    takes = sorted(n for n in names() if "proposer" in entry(n).params.model_fields)
    if policy not in takes:
        raise ValueError(f"--draft {NGRAM} (prompt lookup) works with policy "
                         f"{' or '.join(takes)}, not '{policy}'; pick one of them or "
                         "name a draft model")
    if isinstance(params, PolicyParams):
        return params.model_copy(update={"proposer": NGRAM})
    return {**(params or {}), "proposer": NGRAM}


def _policy_params(policy: str, params: Any) -> Any:
    """``params`` validated by the model ``policy`` registers; a model of another
    policy is refused, anything not a mapping is left to pydantic to refuse."""
    if isinstance(params, dict):
        return parse_params(policy, params)
    cls = entry(policy).params
    if isinstance(params, PolicyParams) and not isinstance(params, cls):
        raise ValueError(f"params are {type(params).__name__}, not the parameters of "
                         f"policy '{policy}'; pass a {cls.__name__} or a dict")
    return params


def _plain(setting: Any) -> Any:
    """A setting as a record writes it: a mapping as given; parameters as the fields
    set; an acceptance model whole (its ``kind`` tells the models apart)."""
    if isinstance(setting, PolicyParams):
        return setting.model_dump(exclude_unset=True)
    if hasattr(setting, "model_dump"):
        return setting.model_dump()
    return dict(setting) if isinstance(setting, dict) else setting


# The name the API had while it configured simulations only; kept for its users.
SimConfig = RunConfig


def split_items(text: str, where: str, sep: str = ",", *, unique: bool = False) -> list[str]:
    """The items of a list value, stripped. An empty item (a doubled, leading or
    trailing separator: ``tree=4,,2``, ``alphas=0.9,``) is refused rather than
    dropped, and with ``unique`` so is an item given twice (a set of names or
    layers): every list a command reads passes here."""
    items = [item.strip() for item in text.split(sep)]
    if len(items) == 1 and not items[0]:
        raise ValueError(f"{where.rstrip()} is empty; give at least one item")
    for index, item in enumerate(items, 1):
        if not item:
            raise ValueError(f"{where}: item {index} of {len(items)} is empty (a doubled, "
                             f"leading or trailing '{sep}'); give every item a value or "
                             "drop the extra separator")
    if unique:
        seen = set()
        for item in items:
            if item in seen:
                raise ValueError(f"{where} names '{item}' twice; give each item once")
            seen.add(item)
    return items


def parse_value(text: str, where: str = "value") -> Any:
    """'5' -> 5, '0.8' -> 0.8, 'on'/'true' -> True, '0.9,0.8' -> (0.9, 0.8); an empty
    item of a list (``4,,2``) is refused, naming ``where``."""
    low = text.strip().lower()
    if low in ("on", "true", "yes"):
        return True
    if low in ("off", "false", "no"):
        return False
    if low in ("none", "null"):
        return None
    if "," in text:
        return tuple(parse_value(part, where) for part in split_items(text, where))
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def refuse_repeats(keys: list[str], option: str) -> None:
    """A key given twice in one KEY=VALUE list (``--set alpha=0.8 --set alpha=0.2``)
    is refused: the last would win in silence."""
    seen = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"{option} gives '{key}' twice; keep one value")
        seen.add(key)


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a mapping; a key given twice is refused."""
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got '{item}'; write e.g. "
                             "--set gamma=5")
        pairs.append((key.strip(), parse_value(value, f"--set {item}")))
    refuse_repeats([key for key, _ in pairs], "--set")
    return dict(pairs)


ACCEPTANCE_EXAMPLES = {"alphas": "alphas=0.9,0.8,0.7", "histogram": "histogram=0.2,0.3,0.5",
                       "trace": "trace=runs/sd-1/acceptance.jsonl"}


def split_sets(policy: str, sets: dict[str, Any], acceptance_kind: str | None = None):
    """Route --set keys to the policy's parameters, the acceptance model, or the run.

    Returns (policy params, acceptance dict, run options).
    """
    fields = entry(policy).params.model_fields
    params, acc, run = {}, {}, {}
    for key, value in sets.items():
        if key in fields:
            params[key] = value
        elif key in acceptance.KEYS:
            kind, field = acceptance.KEYS[key]
            if acc and acc["kind"] != kind:
                raise ValueError(f"--set {key} conflicts with an earlier acceptance "
                                 f"setting of model '{acc['kind']}'; choose one")
            if field in ("alphas", "probs") and not isinstance(value, tuple):
                value = (value,)
            acc = {**acc, "kind": kind, field: value}
        elif key in RUN_KEYS:
            run[key] = value
        else:
            known = sorted([*fields, *acceptance.KEYS, *RUN_KEYS])
            raise ValueError(f"unknown setting '{key}' for policy '{policy}'; valid keys "
                             f"are {', '.join(known)}")
    if acceptance_kind and acc and acc["kind"] != acceptance_kind:
        raise ValueError(f"--acceptance {acceptance_kind} does not take the settings of "
                         f"model '{acc['kind']}'; drop one of them")
    needs = {kind: key for key, (kind, _) in acceptance.KEYS.items() if kind != "iid"}
    if acceptance_kind in needs and not acc:
        key = needs[acceptance_kind]
        raise ValueError(f"--acceptance {acceptance_kind} needs its values; pass "
                         f"--set {key}=... (e.g. {ACCEPTANCE_EXAMPLES[key]})")
    if not acc:
        acc = {"kind": acceptance_kind or "iid"}
    return params, acc, run


def parse_placement(text: str | None) -> dict[str, str]:
    """'draft=gpu4,target=target_tp' -> {'draft': 'gpu4', 'target': 'target_tp'};
    None is no override; an empty pair or a role given twice is refused."""
    out = {}
    if text is None:
        return out
    for part in split_items(text, f"--placement {text}"):
        role, sep, where = (s.strip() for s in part.partition("="))
        if not sep or not role or not where:
            raise ValueError(f"--placement expects ROLE=DEVICE pairs, got '{part}'; "
                             "write e.g. --placement draft=gpu4")
        if role in out:
            raise ValueError(f"--placement gives role '{role}' twice; keep one")
        out[role] = where
    return out
