"""Closed-form latency laws of the five schedules, as pure functions.

Each law returns a dict of named results; ``LAWS`` maps the names the CLI
accepts (``hetspec law NAME``) to these functions, each wrapped so that its
arguments are checked against the annotations below (type, range, finiteness)
before it runs, and its results are checked finite after. Called directly from
Python, the functions check only the relations between their arguments.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationError, validate_call

from policies.sd import expected_tokens
from policies.tree import tree_law  # token trees: the closed form lives with the schedule

MAX_COUNT = 1_000_000  # larger token, layer or batch counts are typing slips, not designs

Probability = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def leviathan(alpha: Probability, gamma: Count, c: NonNegative = 0.0,
              c_hat: NonNegative | None = None) -> dict:
    """Vanilla SD (Leviathan et al. 2023): expected tokens per step, walltime
    speedup (1-a^(g+1))/((1-a)(g c+1)) and operations factor
    (1-a)(g c_hat + g + 1)/(1-a^(g+1)); c_hat defaults to c."""
    _check(0 <= alpha <= 1, "alpha must lie in [0, 1]; set --set alpha=0.8 for example")
    _check(gamma >= 1 and int(gamma) == gamma, "gamma must be an integer >= 1")
    _check(c >= 0, "c (draft/target step-time ratio) must be >= 0")
    _check(c_hat is None or c_hat >= 0, "c_hat (draft/target cost ratio) must be >= 0")
    gamma = int(gamma)
    c_hat = c if c_hat is None else c_hat
    expected = expected_tokens(alpha, gamma)
    return {"expected_tokens_per_step": expected,
            "speedup": expected / (gamma * c + 1),
            "operations_factor": (gamma * c_hat + gamma + 1) / expected}


def mirror(t_prefix_s: NonNegative, t_suffix_s: NonNegative, t_draft_s: NonNegative,
           t_rv_s: NonNegative | None = None, t_rv_ee_s: NonNegative = 0.0,
           t_rv_fv_s: NonNegative = 0.0) -> dict:
    """Mirror-SD eq. 10: T = T_t[1:le] + T_rv_ee + max(T_t[le+1:N], T_draft_gen) + T_rv_fv,
    and appendix C's piecewise speedup over vanilla SD, T_SD = T_target + T_draft_gen."""
    for name, v in (("t_prefix_s", t_prefix_s), ("t_suffix_s", t_suffix_s),
                    ("t_draft_s", t_draft_s), ("t_rv_ee_s", t_rv_ee_s), ("t_rv_fv_s", t_rv_fv_s)):
        _check(v >= 0, f"{name} must be >= 0 seconds")
    t_rv = t_rv_ee_s + t_rv_fv_s if t_rv_s is None else t_rv_s
    _check(t_rv >= 0, "t_rv_s must be >= 0 seconds")
    _check(t_prefix_s + t_suffix_s + t_draft_s + t_rv > 0,
           "mirror needs a step that takes time: give t_prefix_s, t_suffix_s, t_draft_s "
           "or t_rv_s a value > 0 seconds")
    delta = t_suffix_s
    t_target = t_prefix_s + t_suffix_s
    t_mirror = t_prefix_s + max(delta, t_draft_s) + t_rv
    if t_draft_s <= delta:
        speedup = (t_target + t_draft_s) / (t_target + t_rv)
    else:
        speedup = (t_prefix_s + delta + t_draft_s) / (t_prefix_s + t_draft_s + t_rv)
    return {"step_latency_s": t_mirror, "sd_step_latency_s": t_target + t_draft_s,
            "speedup_vs_sd": speedup, "overlap_budget_s": delta,
            "draft_hidden": t_draft_s <= delta, "mirror_wins": t_rv < min(delta, t_draft_s)}


def ssd(hit_rate: Probability, e_hit: NonNegative, e_miss: NonNegative, t_p: NonNegative,
        t_b: NonNegative, batch: Count = 1) -> dict:
    """SSD expected speedup over AR, times normalised by the verify time, per row
    hit rate p over a batch of B rows: a row that hits keeps its cached
    speculation (E_hit tokens), a row that misses takes the backup's (E_miss),
    and a round waits for a backup unless every row hit (chance p^B):
    S = [p E_hit + (1-p) E_miss] / [p^B max(1, T_p) + (1-p^B)(1 + T_b)].
    hit_rate: p, the chance one row's outcome was cached; e_hit, e_miss: tokens a
    row commits per round (accepted + 1) from a cached or a backup speculation;
    t_p: pre-speculation plus its trip back, t_b: the backup's latency, both in
    verify times; batch: B rows per round."""
    _check(0 <= hit_rate <= 1, "hit_rate must lie in [0, 1]")
    _check(batch >= 1, "batch must be >= 1")
    _check(e_hit >= 0 and e_miss >= 0, "e_hit and e_miss must be >= 0 tokens")
    _check(t_p >= 0 and t_b >= 0, "t_p and t_b must be >= 0 (in verify times)")
    p_all = hit_rate ** batch
    tokens = hit_rate * e_hit + (1 - hit_rate) * e_miss
    time = p_all * max(1.0, t_p) + (1 - p_all) * (1 + t_b)
    return {"speedup": tokens / time, "all_hit_rate": p_all, "tokens_per_round": tokens,
            "round_time_over_verify": time}


def ppsd(n_layers: Count, exit_layer: Count, alpha: Probability,
         gamma: Count | None = None) -> dict:
    """PPSD eq. 6 rho* = N / (aE + (1-a) ceil(N/E) E); with gamma also EESD eq. 4
    rho = (1-a^(g+1)) N / ((1-a)(gE + N)), the eq. 5 bound on a_all and eq. 7 lambda."""
    _check(1 <= exit_layer <= n_layers, "exit_layer must lie in [1, n_layers]")
    _check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    n, e = n_layers, exit_layer
    rho_star = n / (alpha * e + (1 - alpha) * math.ceil(n / e) * e)
    out = {"speedup": rho_star, "stages": math.ceil(n / e)}
    if gamma is not None:
        _check(gamma >= 1, "gamma must be >= 1")
        tokens = expected_tokens(alpha, gamma)
        rho = tokens * n / (gamma * e + n)
        bound = 1.0 if alpha == 1 else alpha * (1 - alpha ** gamma) / ((1 - alpha) * gamma)
        out.update({"eesd_speedup": rho, "alpha_all_bound": bound, "lambda": rho_star / rho})
    return out


def ppsd_cost(alpha: Probability, t_ar_s: Positive, t_match_s: Positive,
              t_flush_s: Positive) -> dict:
    """PPSD eq. 6 with step times from the cost model: each token leaving the
    pipeline commits one, one bottleneck stage time ``t_match_s`` after the one
    before it on a match, the pipeline's refill ``t_flush_s`` (correction
    message, every stage, every activation hop, the heads) on a mismatch:
    rho* = T_AR / (a T_match + (1-a) T_flush). With layer times only (T_AR = N,
    T_match = E, T_flush = ceil(N/E) E) it is eq. 6."""
    _check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    per_token = alpha * t_match_s + (1 - alpha) * t_flush_s
    return {"speedup": t_ar_s / per_token, "time_per_token_s": per_token}


def eesd_cost(alpha: Probability, gamma: Count, t_ar_s: Positive, t_draft_s: NonNegative,
              t_verify_s: Positive) -> dict:
    """EESD eq. 4 with step times from the cost model: gamma exit-head drafts (their
    total ``t_draft_s``) and one verify of gamma + 1 positions per step:
    rho = E[tokens] T_AR / (T_draft + T_verify). With layer times only
    (T_draft = gamma E, T_verify = T_AR = N) it is eq. 4."""
    _check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    tokens = expected_tokens(alpha, gamma)
    step = t_draft_s + t_verify_s
    return {"speedup": tokens * t_ar_s / step, "expected_tokens_per_step": tokens,
            "step_latency_s": step}


def cats(layer_gb: Positive, n_layers: Count, gamma: Count, l_dm: Count,
         mean_accepted: Positive, l_sv: Count | None = None) -> dict:
    """Bytes of decoder weights read per committed token:
    CATS (gamma B_DM + B_SV + B_target)/(beta+1); without l_sv, Kangaroo
    (gamma B_DM + B_all)/(beta+1). mean_accepted is beta+1."""
    _check(layer_gb > 0, "layer_gb must be > 0")
    _check(1 <= l_dm < n_layers, "l_dm must lie in [1, n_layers)")
    _check(gamma >= 1, "gamma (draft passes per cycle) must be >= 1")
    _check(1 <= mean_accepted <= gamma + 1,
           "mean_accepted (tokens committed per cycle, bonus included) must lie in "
           "[1, gamma + 1]")
    b_dm = l_dm * layer_gb
    if l_sv is None:
        per_cycle = gamma * b_dm + n_layers * layer_gb
    else:
        _check(l_dm < l_sv < n_layers, "l_sv must lie in (l_dm, n_layers)")
        per_cycle = gamma * b_dm + (l_sv - l_dm) * layer_gb + (n_layers - l_sv) * layer_gb
    return {"bytes_per_token_gb": per_cycle / mean_accepted, "bytes_per_cycle_gb": per_cycle}


def kangaroo(layer_gb: Positive, n_layers: Count, gamma: Count, l_dm: Count,
             mean_accepted: Positive) -> dict:
    """Kangaroo's two-stage bytes per token (draft 1..L_DM, verify all N layers)."""
    return cats(layer_gb, n_layers, gamma, l_dm, mean_accepted)


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
        _check(not bad, f"law '{name}' gives a non-finite {bad[0] if bad else ''} for these "
                        "parameters; use smaller magnitudes")
        return out

    return run


LAWS = {name: _checked(name, law) for name, law in
        {"leviathan": leviathan, "mirror": mirror, "ssd": ssd, "ppsd": ppsd,
         "ppsd_cost": ppsd_cost, "eesd_cost": eesd_cost, "cats": cats,
         "kangaroo": kangaroo, "tree": tree_law}.items()}


def law(name: str, **params) -> dict:
    """Evaluate a closed-form law by name (one of ``LAWS``), its parameters checked
    against the law's signature first."""
    if name not in LAWS:
        raise ValueError(f"unknown law '{name}'; choose one of {', '.join(LAWS)}")
    accepted = inspect.signature(LAWS[name]).parameters
    for key in params:
        if key not in accepted:
            raise ValueError(f"law '{name}' has no parameter '{key}'; its parameters are "
                             f"{', '.join(accepted)}")
    missing = [k for k, p in accepted.items()
               if p.default is inspect.Parameter.empty and k not in params]
    if missing:
        raise ValueError(f"law '{name}' needs {', '.join(missing)}; pass each with "
                         f"--set {missing[0]}=VALUE")
    return LAWS[name](**params)
