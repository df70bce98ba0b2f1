"""A replayed run in numbers and in one line, the speedup against the run's own AR
first: measured from AR rounds interleaved with the schedule's, it stays
comparable on a machine busy with other work, where absolute speeds do not
(``evidence.contended_text``). ``hetspec compare --runs`` prints and reports
these; ``hetspec replay`` leads the same way."""

from __future__ import annotations

from analyses.measured.evidence import contended_text
from policies.base import baseline_of

NOT_MEASURED = ("not measured (recorded without its AR rounds: 'hetspec run' without "
                "--no-baseline measures it)")


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pair(rep, key: str) -> dict:
    """{'measured', 'simulated', 'error'} of one metric (None where missing); the
    error is simulated / measured - 1."""
    m, p = _number(rep.measured.get(key)), _number(rep.predicted.get(key))
    return {"measured": m, "simulated": p,
            "error": p / m - 1.0 if m and p is not None else None}


def own_baseline(rep) -> bool:
    """Whether the run is its own AR baseline (an AR run: its speedup is 1)."""
    return baseline_of(rep.config.policy, rep.config.params) is None


def speedup_text(rep) -> str:
    """'speedup vs AR measured 2.72x, simulated 2.53x (-7.0%)', or why there is none."""
    if own_baseline(rep):
        return "its own AR baseline"
    s = pair(rep, "speedup_vs_ar")
    if s["measured"] is None:
        simulated = "" if s["simulated"] is None else f", simulated {s['simulated']:.3g}x"
        return f"speedup vs AR {NOT_MEASURED}{simulated}"
    if s["simulated"] is None:
        return f"speedup vs AR measured {s['measured']:.3g}x, not simulated"
    return (f"speedup vs AR measured {s['measured']:.3g}x, simulated {s['simulated']:.3g}x "
            f"({s['error']:+.1%})")


def speed_text(rep) -> str:
    """'tokens/s measured 3.84, simulated 158.4 (+4021.2%)'."""
    t = pair(rep, "tokens_per_s")
    if t["measured"] is None or t["simulated"] is None:
        return "tokens/s not compared"
    return (f"tokens/s measured {t['measured']:.4g}, simulated {t['simulated']:.4g} "
            f"({t['error']:+.1%})")


def run_line(rep) -> str:
    """One replayed run: its speedup against its own AR first, then its absolute
    speed, then a busy machine's note."""
    busy = contended_text(rep.measured)
    return f"{rep.label}: {speedup_text(rep)}; {speed_text(rep)}" + (f"; {busy}" if busy
                                                                     else "")


def run_summary(rep) -> dict:
    """The numbers behind ``run_line``, for JSON."""
    return {"run": rep.label, "profile": rep.config.platform,
            "own_baseline": own_baseline(rep),
            "speedup_vs_ar": pair(rep, "speedup_vs_ar"),
            "tokens_per_s": pair(rep, "tokens_per_s"),
            "contended": bool(contended_text(rep.measured)), "line": run_line(rep)}
