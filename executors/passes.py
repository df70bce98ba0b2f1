"""How the executor splits a Forward into device passes: the one rule, read by
the executor's own commands and by the analyses of its measured runs.

The torch executor samples one token per pass: a sampled Forward of k tokens is
k passes, the first feeding ``n_fed`` positions per row (what the caches
lacked, catch-up included), the others one each, unless it asks for
``head_tokens=1`` (one pass over its positions, one token sampled) or its one
pass emits them through multi-token heads (``multi_token`` = k, whose k heads
cost as k projected positions). A sampled or top-k head projects one position
per row. The coordinator's commands sample ``sampled_steps`` steps
(``FwdCmd.steps``) or emit through the heads (``FwdCmd.ahead``); calibration
(``analyses.calibrate.terms``) costs measured Forwards by it, and a replay
(``analyses.measured.executorwork``) rewrites simulated ones into it, both from
the fields a measured span records (``n_fed``, ``multi_token``).
Pure Python: importing it loads no torch.
"""

from __future__ import annotations


def sampled_steps(n_tokens: int, emit: str | None, head_tokens: int | None) -> int:
    """The passes a Forward of ``n_tokens`` tokens runs to sample them one a pass:
    ``n_tokens`` where it samples, unless its head projects one position
    (``head_tokens=1``: one pass over its positions); one otherwise."""
    return n_tokens if emit == "sample" and head_tokens != 1 else 1


def executor_passes(n_tokens: int, n_fed: int, emit: str | None, head: str | None,
                    head_tokens: int | None,
                    multi_token: int = 0) -> tuple[tuple[int, ...], int | None]:
    """(positions fed per row in each pass, head positions each pass projects) of
    a Forward of ``n_tokens`` tokens that fed ``n_fed`` positions per row."""
    if multi_token:
        return (n_fed,), multi_token
    head_rows = 1 if head and emit in ("sample", "topk") else head_tokens
    return (n_fed,) + (1,) * (sampled_steps(n_tokens, emit, head_tokens) - 1), head_rows


def span_passes(op: dict) -> tuple[tuple[int, ...], int | None]:
    """``executor_passes`` of a measured Forward, from its span's operation."""
    n_tokens = op.get("n_tokens", 1)
    return executor_passes(n_tokens, op.get("n_fed") or n_tokens, op.get("emit"),
                           op.get("head"), op.get("head_tokens"),
                           op.get("multi_token") or 0)
