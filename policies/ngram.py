"""Prompt lookup: an n-gram proposer over token ids, for both runtimes.

The draft that costs almost nothing. At each step it takes the sequence's last
``n`` tokens, finds their most recent earlier occurrence in the searched part
of the sequence (the prompt, the output so far, or both), and proposes the up
to ``gamma`` tokens that followed it; with no match at length ``n`` it tries
``n - 1``, down to ``n_min`` (longest first). With no match at all it proposes
nothing, and the step is a plain one-token pass of the target.

The proposal is a deterministic function of the committed tokens, a point
mass: at temperature 0 the target keeps the longest prefix equal to its own
argmax (the output equals autoregressive decoding token for token); at
temperature T rejection sampling accepts token x with probability p_T(x) and
otherwise samples from p_T with x removed, which leaves the target's
distribution unchanged. transformers calls it ``prompt_lookup_num_tokens``,
vLLM its n-gram speculator, SSD (SAGUARO) a fast backup.

Pure Python, no torch: the executor's coordinator runs it on the host CPU beside
the target; the simulator prices one lookup per row with the platform's
``host_lookup_s`` and answers its length from an acceptance trace or a match
model.
"""

from __future__ import annotations

from collections.abc import Sequence

SEARCHES = ("prompt", "output", "both")


def window(search: str, prompt_len: int, total: int) -> tuple[int, int]:
    """[lo, hi): where a matched n-gram and its continuation may lie: the prompt,
    the generated tokens, or the whole sequence."""
    if search == "prompt":
        return 0, min(prompt_len, total)
    if search == "output":
        return min(prompt_len, total), total
    if search == "both":
        return 0, total
    raise ValueError(f"search is {search!r}; choose one of {', '.join(SEARCHES)}")


def propose(tokens: Sequence[int], prompt_len: int, *, gamma: int, n: int = 3,
            n_min: int = 1, search: str = "both") -> list[int]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of
    the sequence's last ``k`` tokens inside the searched window, for k from ``n``
    down to ``n_min``; [] when none occurs (or ``gamma`` is 0)."""
    seq = tokens if isinstance(tokens, list) else list(tokens)
    total = len(seq)
    lo, hi = window(search, prompt_len, total)
    if gamma <= 0:
        return []
    for k in range(min(n, total - 1), max(n_min, 1) - 1, -1):
        tail = seq[total - k:]
        first = tail[0]
        # an earlier occurrence, inside the window with at least one token after it
        for i in range(min(hi, total) - 1 - k, lo - 1, -1):
            if seq[i] == first and seq[i:i + k] == tail:
                return seq[i + k:min(i + k + gamma, hi)]
    return []


def fit(lines: list[dict]) -> dict[str, float | None]:
    """The match model of recorded prompt-lookup steps (acceptance-trace Verify
    lines with ``proposed`` and ``accepted`` per row): ``match``, the share of
    rows' steps that proposed anything, and ``alpha``, the per-token acceptance
    of the i.i.d. model that most likely gave the accepted lengths (a row that
    accepted k of g tokens saw k acceptances and, if k < g, one rejection:
    alpha = acceptances / (acceptances + rejections)). ``--set match=M --set
    alpha=A`` simulates a prompt lookup with them; None where no row proposed."""
    asked = matched = accepted = rejected = 0
    for line in lines:
        for g, k in zip(line.get("proposed") or (), line.get("accepted") or ()):
            asked += 1
            if g:
                matched += 1
                accepted += min(k, g)
                rejected += k < g
    trials = accepted + rejected
    return {"match": matched / asked if asked else None,
            "alpha": accepted / trials if trials else None}


def siblings(tokens: Sequence[int], prompt_len: int, *, gamma: int, width: int,
             nodes: int, n: int = 3, n_min: int = 1,
             search: str = "both") -> list[list[int]]:
    """Up to ``width`` continuations with distinct first tokens, the siblings of a
    token tree: occurrences of the sequence's last ``k`` tokens, ``k`` from ``n``
    down to ``n_min``, most recent first, each followed by up to ``gamma`` tokens.
    The first is ``propose``'s proposal; a later one whose first token an earlier
    one has is skipped, and the continuations hold ``nodes`` tokens at most (a
    later one is cut to what is left)."""
    seq = tokens if isinstance(tokens, list) else list(tokens)
    total = len(seq)
    lo, hi = window(search, prompt_len, total)
    out: list[list[int]] = []
    firsts: set[int] = set()
    left = nodes
    for k in range(min(n, total - 1), max(n_min, 1) - 1, -1):
        tail = seq[total - k:]
        first = tail[0]
        for i in range(min(hi, total) - 1 - k, lo - 1, -1):
            if len(out) >= width or left <= 0 or gamma <= 0:
                return out
            if seq[i] != first or seq[i + k] in firsts or seq[i:i + k] != tail:
                continue
            follow = seq[i + k]
            run = seq[i + k:min(i + k + gamma, hi, i + k + left)]
            out.append(run)
            firsts.add(follow)
            left -= len(run)
    return out
