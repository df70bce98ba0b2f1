"""Closed-form latency laws by name: each schedule's, gathered from its registration.

A schedule registers its closed forms beside it (``register(..., laws={name: fn})``,
``policies.declared``); ``laws()`` maps the names the CLI accepts (``hetspec law
NAME``) to these functions, each wrapped so that its arguments are checked against
its annotations (type, range, finiteness) before it runs, and its results are
checked finite after. Called directly from Python, the functions check only the
relations between their arguments.
"""

from __future__ import annotations

import functools
import inspect
import math

from pydantic import ConfigDict, ValidationError, validate_call

from policies.base import entries
from policies.declared import check


def _checked(name: str, law):
    """The law with its arguments validated against its annotations (strict types:
    a boolean, a string or a list is not a number; finite values only) and its
    results required finite; every failure is one ValueError sentence."""
    strict = validate_call(law, config=ConfigDict(strict=True, allow_inf_nan=False))

    @functools.wraps(law)
    def run(**params) -> dict:
        try:
            out = strict(**params)
        except ValidationError as exc:
            first = exc.errors()[0]
            # the parameter and any item index; not the union member tried
            # ('tree.tuple[int, ...]' reads as 'tree')
            loc = first["loc"]
            key = ".".join(str(p) for p in loc[:1] + tuple(p for p in loc[1:]
                                                            if isinstance(p, int)))
            given = params.get(key, first.get("input"))
            raise ValueError(f"law '{name}' parameter '{key}': {first['msg']} (got "
                             f"{given!r})") from None
        bad = [k for k, v in out.items()
               if isinstance(v, float) and not math.isfinite(v)]
        check(not bad, f"law '{name}' gives a non-finite {bad[0] if bad else ''} for these "
                        "parameters; use smaller magnitudes")
        return out

    return run


def laws() -> dict:
    """Every registered closed form by its name, checked (``_checked``)."""
    out = {}
    for found in entries():
        for name, fn in found.laws.items():
            if name in out:
                raise ValueError(f"law '{name}' is registered twice; rename one")
            out[name] = _checked(name, fn)
    return out


def law(name: str, **params) -> dict:
    """Evaluate a closed-form law by name (one of ``laws()``), its parameters checked
    against the law's signature first."""
    known = laws()
    if name not in known:
        raise ValueError(f"unknown law '{name}'; choose one of {', '.join(known)}")
    accepted = inspect.signature(known[name]).parameters
    for key in params:
        if key not in accepted:
            raise ValueError(f"law '{name}' has no parameter '{key}'; its parameters are "
                             f"{', '.join(accepted)}")
    missing = [k for k, p in accepted.items()
               if p.default is inspect.Parameter.empty and k not in params]
    if missing:
        raise ValueError(f"law '{name}' needs {', '.join(missing)}; pass each with "
                         f"--set {missing[0]}=VALUE")
    return known[name](**params)
