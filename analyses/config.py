"""One pydantic tree for a run's configuration, and ``--set`` parsing."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from policies import acceptance, entry

RUN_KEYS = {"contention": "fair-share memory tiers among concurrent readers (on/off)",
            "prompt_tokens": "KV-cache positions before decoding starts"}


class SimConfig(BaseModel):
    """Everything that determines a simulated run; written beside its results."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    platform: str
    target: str
    draft: str | None = None
    policy: str = "sd"
    params: dict[str, Any] = Field(default_factory=dict)
    acceptance: dict[str, Any] = Field(default_factory=lambda: {"kind": "iid", "alpha": 0.8})
    tokens: int = Field(2000, ge=1)
    batch: int = Field(1, ge=1)
    seed: int = 0
    deterministic: bool = False
    prompt_tokens: int = Field(128, ge=0)
    fixed_context: bool = False
    contention: bool = False
    placement: dict[str, str] = Field(default_factory=dict)


def parse_value(text: str) -> Any:
    """'5' -> 5, '0.8' -> 0.8, 'on'/'true' -> True, '0.9,0.8' -> (0.9, 0.8)."""
    low = text.strip().lower()
    if low in ("on", "true", "yes"):
        return True
    if low in ("off", "false", "no"):
        return False
    if low in ("none", "null"):
        return None
    if "," in text:
        return tuple(parse_value(part) for part in text.split(",") if part.strip())
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got '{item}'; write e.g. "
                             "--set gamma=5")
        out[key.strip()] = parse_value(value)
    return out


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
    if not acc:
        acc = {"kind": acceptance_kind or "iid"}
    return params, acc, run


def parse_placement(text: str | None) -> dict[str, str]:
    """'draft=gpu4,target=target_tp' -> {'draft': 'gpu4', 'target': 'target_tp'}."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        role, sep, where = part.partition("=")
        if not sep:
            raise ValueError(f"--placement expects ROLE=DEVICE pairs, got '{part}'; "
                             "write e.g. --placement draft=gpu4")
        out[role.strip()] = where.strip()
    return out
