"""One pydantic tree for a run's configuration, and ``--set`` parsing."""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Union

from pydantic import Field, field_validator, model_validator

from policies import PolicyParams, entry, names, parse_params
from policies.runs.config import (MAX_BATCH, MAX_PROMPT_TOKENS,  # noqa: F401 (re-exported)
                                  MAX_TOKENS, RunSettings)
from policies.runs.config import plain_setting as _plain
from simcore import acceptance

# Tokens generated per sequence when --tokens is not given: one default for the
# simulated commands (simulate, compare); a measured run's is smaller (real decoding
# on a CPU runs at tens of tokens a second).
SIM_TOKENS = 1000

RUN_KEYS = {"contention": "fair-share memory tiers among concurrent readers (on/off)",
            "prompt_tokens": "KV-cache positions before decoding starts (at most 1e7, "
                             "the longest context windows)",
            "weight_bits": "storage width of the models' weights: 4, 8, 16 or 32 "
                           "(default: the model's dtype); FLOPs are unchanged",
            "kv_bits": "storage width of the KV cache: 4, 8, 16 or 32 (default: the "
                       "model's dtype)",
            "compute_bits": "width of the matrix products and their inputs: 8 prices "
                            "them at the device's FP8 peak (INT8 where it has no FP8; "
                            "refused where its profile gives neither), 16 at the 16-bit "
                            "peak (default: the model's dtype); storage is weight_bits "
                            "and kv_bits",
            "memory_check": "refuse placements whose weights, KV cache and activations "
                            "overflow a device's memory (on, the default; off: a what-if "
                            "run past the hardware's capacity)",
            "expert_parallel": "shard a mixture-of-experts model's experts whole over "
                               "its group (all-to-all dispatch and combine) instead of "
                               "tensor-parallel (on/off)",
            "prefill_chunk": "positions per prefill pass: chunked prefill, each chunk "
                             "attending to those before it (default: one pass)",
            "stack": "the software stack the run is priced under: a shipped name "
                     "(compiled, the default; hf-eager; llama.cpp) or a stack YAML "
                     "path; hetspec profiles list shows them"}


# The acceptance models, told apart by their ``kind`` (STYLE 5: a discriminated union).
Acceptance = Annotated[Union[tuple(acceptance.MODELS.values())],
                       Field(discriminator="kind")]


class RunConfig(RunSettings):
    """Everything that determines a run, simulated (analyses.run.api) or measured
    (executors.measure); written beside its results. The settings every layer
    reads are ``policies.runs.config.RunSettings`` (caps, widths, switches,
    ``revised``, ``given``, ``run_model``); this narrows ``acceptance`` to one of
    the simulator's acceptance models, tagged by its ``kind`` (a trace is read
    and checked line by line here), and types ``params`` by the model ``policy``
    registers: a union of the registered models tagged by the policy name. Both
    take their defaults from their models alone."""

    acceptance: Acceptance

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


NGRAM = "ngram"  # --draft ngram: prompt lookup on the host (policies.ngram)


def _lookup_params(policy: str, params: Any) -> Any:
    """``params`` with the policy's proposer set to prompt lookup, for a policy that
    has one; any other is refused naming those that do."""
    if "proposer" not in entry(policy).params.model_fields:
        takes = [n for n in names() if "proposer" in entry(n).params.model_fields]
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
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise ValueError(f"unknown setting '{key}' for policy '{policy}'; {hint}valid "
                             f"keys are {', '.join(known)}")
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
