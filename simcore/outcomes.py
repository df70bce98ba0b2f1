"""Outcomes of Verify and Outcome operations in simulation.

Random mode draws from the acceptance model with a seeded generator. In
deterministic mode a Verify returns each row's *expected* accepted length (a
float), and an Outcome follows error diffusion: the event holds on exactly
floor(n * p) of the first n asks, so its frequency is p with no randomness.
A per-row Outcome keeps one credit per row (each row's frequency is exactly p)
and counts each row as one ask in ``rate``; an event whose model has
``independent_rows`` is answered instead as independent rows fall on average
(all rows hold on a share p^B of asks, each row on a share p). A Verify with
``row_labels`` draws each row's verdict with its own label's model. A Verify with ``row_gamma`` gives
each row the verdict of its own proposal length: in deterministic mode each
row's expected length for its gamma; in random mode one draw at the full gamma
clipped to the row's (accepting the first g of gamma tokens is the same event).
A yes/no Verify (one token, no bonus: a pipeline's check of the draft in flight)
is answered whole in deterministic mode too: every row accepts its token on
exactly floor(n * P) of the first n asks of its label, P the chance that all rows
accept (error diffusion, as for an Outcome), none on the others. Its draft
position (for per-position acceptance) is the number of answers of its label in
which every row accepted, since the last one in which some row did not: the
draft in flight was proposed after that many matches.

What a schedule models beyond the acceptance model comes from its outcome models
(``policies.base``), attached by the Verify's label and the Outcome's event:
a Verify's modelled mean or acceptance scale, an event's chance.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from policies.base import (EventModel, OutcomeModels, VerifyModel, event_model,
                           verify_model)
from policies.ops import Found, Lookup, Outcome, Verdict, Verify
from simcore.acceptance import IID


class Outcomes:
    def __init__(self, acceptance, *, seed: int = 0, deterministic: bool = False,
                 models: OutcomeModels | None = None):
        self.acceptance = acceptance
        self.models: OutcomeModels = dict(models or {})
        self.rng = np.random.default_rng(seed)
        self.deterministic = deterministic
        self._credit: dict = {}  # error-diffusion credit by event, (event, row) or Verify label
        self.asked: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self._expected: dict = {}  # deterministic verdicts by their inputs
        self._runs: dict[str, int] = {}  # a yes/no Verify's position, by label

    def verify(self, op: Verify) -> Verdict:
        if op.row_labels is not None:
            return self._verify_labelled(op)
        if op.row_gamma is not None:
            return self._verify_rows(op)
        modelled = verify_model(self.models, op.label)
        if modelled.expected is not None or not op.bonus or modelled.scale != 1.0:
            return self._verify_modelled(op, modelled)
        if self.deterministic:
            e = self._expected.get(op.gamma)
            if e is None:
                e = self._expected[op.gamma] = self.acceptance.expected(op.gamma)
            return Verdict((e,) * op.batch)
        return Verdict(self.acceptance.sample(op.gamma, op.batch, self.rng))

    def _verify_modelled(self, op: Verify, modelled: VerifyModel) -> Verdict:
        """A Verify with its own modelled mean (``expected``), a scaled
        acceptance (``scale``), or without a bonus token: a row then commits
        min(accepted, gamma - 1) + 1 tokens. A yes/no Verify's position is the
        run of all-accepted answers its label has had since the last rejection."""
        no_bonus = not op.bonus and op.gamma > 0
        yes_no = no_bonus and op.gamma == 1
        position = self._runs.get(op.label, 0) if yes_no else 0
        if self.deterministic:
            verdict = self._expected_verdict(op, modelled, no_bonus, position)
        else:
            verdict = self._sampled_verdict(op, modelled, no_bonus, position)
        if yes_no:
            matched = all(a >= 1 for a in verdict.accepted)
            self._runs[op.label] = position + 1 if matched else 0
        return verdict

    def _expected_verdict(self, op: Verify, modelled: VerifyModel, no_bonus: bool,
                          position: int) -> Verdict:
        expected, scale = modelled.expected, modelled.scale
        key = (op.gamma, position, expected, no_bonus, scale)
        pair = self._expected.get(key)
        if pair is None:
            model = self._model(op.gamma, expected)
            e = expected if expected is not None and scale == 1.0 else \
                scaled_expected(model, op.gamma, position, scale)
            c = scaled_expected(model, op.gamma - 1, position, scale) + 1 \
                if no_bonus else None
            pair = self._expected[key] = (e, c)
        e, c = pair
        accepted = (e,) * op.batch
        if no_bonus and op.gamma == 1:
            accepted = self._whole(op.label, accepted)
        return Verdict(accepted, committed=None if c is None else (c,) * op.batch)

    def _sampled_verdict(self, op: Verify, modelled: VerifyModel, no_bonus: bool,
                         position: int) -> Verdict:
        scale = modelled.scale
        model = self._model(op.gamma, modelled.expected)
        accepted = model.sample(op.gamma, op.batch, self.rng, position)
        if scale != 1.0:  # each token also survives a coin of probability scale
            runs = self.rng.geometric(1 - scale, size=op.batch) - 1 if scale < 1 \
                else (op.gamma,) * op.batch
            accepted = tuple(min(int(a), int(r)) for a, r in zip(accepted, runs))
        committed = tuple(min(a, op.gamma - 1) + 1 for a in accepted) if no_bonus else None
        return Verdict(accepted, committed=committed)

    def _model(self, gamma: int, expected: float | None):
        """The run's acceptance model, or the i.i.d. one with a modelled mean."""
        return self.acceptance if expected is None else iid_with_mean(gamma, expected)

    def _verify_rows(self, op: Verify) -> Verdict:
        """Each row verifies its own ``row_gamma`` tokens (0: an AR step)."""
        gammas = op.row_gamma
        if len(gammas) != op.batch or any(not 0 <= g <= op.gamma for g in gammas):
            raise ValueError(f"Verify.row_gamma must hold {op.batch} values in "
                             f"[0, {op.gamma}], one per row; got {gammas}")
        if verify_model(self.models, op.label).expected is not None:
            raise ValueError(f"Verify '{op.label}' has row_gamma, but its VerifyModel a "
                             "modelled mean for gamma proposals; drop one of them")
        if self.deterministic:
            per = {g: self.verify(replace(op, gamma=g, batch=1, row_gamma=None))
                   for g in set(gammas)}
            accepted = tuple(per[g].accepted[0] for g in gammas)
            if all(v.committed is None for v in per.values()):
                return Verdict(accepted)
            return Verdict(accepted, committed=tuple(per[g].tokens for g in gammas))
        full = self.verify(replace(op, row_gamma=None))
        accepted = tuple(min(a, g) for a, g in zip(full.accepted, gammas))
        if full.committed is None:
            return Verdict(accepted)
        return Verdict(accepted, committed=tuple(min(a, g - 1) + 1 if g > 0 else 1
                                                 for a, g in zip(accepted, gammas)))

    def _verify_labelled(self, op: Verify) -> Verdict:
        """Each row's verdict drawn with its own label's model (``row_labels``),
        rows of one label verified together."""
        labels = op.row_labels
        if len(labels) != op.batch or op.row_gamma is not None:
            raise ValueError(f"Verify.row_labels must hold {op.batch} labels, one per row, "
                             f"and comes without row_gamma; got {labels}")
        rows = {}
        for r, label in enumerate(labels):
            rows.setdefault(label, []).append(r)
        accepted, committed = [0.0] * op.batch, [0.0] * op.batch
        for label, group in rows.items():
            part = self.verify(replace(op, batch=len(group), label=label, row_labels=None))
            per = part.committed or [a + 1 for a in part.accepted]
            for r, a, c in zip(group, part.accepted, per):
                accepted[r], committed[r] = a, c
        if all(c == a + 1 for a, c in zip(accepted, committed)):
            return Verdict(tuple(accepted))
        return Verdict(tuple(accepted), committed=tuple(committed))

    def _whole(self, label: str, expected: tuple[float, ...]) -> tuple[int, ...]:
        """A yes/no verdict for every row at once (module doc)."""
        p = 1.0
        for e in expected:  # the chance that every row accepts its token
            p *= e
        return (int(self._diffuse(("verify", label), p)),) * len(expected)

    def _diffuse(self, key, p: float) -> bool:
        credit = self._credit.get(key, 0.0) + p
        held = credit >= 1.0 - 1e-12
        self._credit[key] = credit - 1.0 if held else credit
        return held

    def lookup(self, op: Lookup) -> tuple[int, ...]:
        """Tokens a prompt lookup proposes per row: ``gamma`` where its match model
        (the schedule's EventModel under the Lookup's label) draws a match, none
        elsewhere; without one, what the acceptance trace's step proposed (the
        step the next Verify replays; in deterministic mode the lookups' own count)."""
        if op.siblings is not None:
            return self._lookup_tree(op)
        model = self.models.get(op.label)
        if isinstance(model, EventModel):
            held = self._outcome_rows(Outcome(op.label, op.batch, per_row=True))
            return tuple(op.gamma if h else 0 for h in held)
        proposed = getattr(self.acceptance, "proposed", None)
        if proposed is None:
            raise ValueError("a prompt lookup (--draft ngram) needs what it proposes: "
                             "--set match=P (the chance a lookup finds a match) or --set "
                             "trace=acceptance.jsonl of a measured ngram run")
        step = self._runs.get(op.label, 0) if self.deterministic else None
        self._runs[op.label] = self._runs.get(op.label, 0) + 1
        return proposed(op.gamma, op.batch, step)

    def _lookup_tree(self, op: Lookup) -> Found:
        """A token-tree lookup: with a match model, a matched row's full tree
        (``siblings`` continuations of ``gamma`` tokens within ``nodes``) and none
        elsewhere; else the trace step's longest branch (``proposed``) and its
        tree's nodes (``nodes``, else the longest branch alone)."""
        if isinstance(self.models.get(op.label), EventModel):
            full = min(op.siblings * op.gamma, op.nodes)
            longest = min(op.gamma, op.nodes)
            held = self._outcome_rows(Outcome(op.label, op.batch, per_row=True))
            return Found(tuple(full if h else 0 for h in held),
                         tuple(longest if h else 0 for h in held))
        longest = self.lookup(replace(op, siblings=None))
        nodes = getattr(self.acceptance, "nodes", None)
        step = self._runs[op.label] - 1
        counts = longest if nodes is None else nodes(op.nodes, op.batch,
                                                     step if self.deterministic else None)
        return Found(tuple(max(c, g) for c, g in zip(counts, longest)), longest)

    def outcome(self, op: Outcome) -> bool | tuple[bool, ...]:
        if op.per_row:
            return self._outcome_rows(op)
        p = event_model(self.models, op.event).probability ** op.batch  # every row
        if self.deterministic:
            held = self._diffuse(op.event, p)
        else:
            held = bool(self.rng.random() < p)
        self.asked[op.event] = self.asked.get(op.event, 0) + 1
        self.held[op.event] = self.held.get(op.event, 0) + int(held)
        return held

    def _outcome_rows(self, op: Outcome) -> tuple[bool, ...]:
        """One answer per row; each row is one ask of the event's rate."""
        model = event_model(self.models, op.event)
        p = model.probability
        if self.deterministic and model.independent_rows:
            held = self._independent_rows(op.event, p, op.batch)
        elif self.deterministic:
            held = tuple(self._diffuse((op.event, r), p) for r in range(op.batch))
        else:
            held = tuple(bool(x) for x in self.rng.random(op.batch) < p)
        self.asked[op.event] = self.asked.get(op.event, 0) + op.batch
        self.held[op.event] = self.held.get(op.event, 0) + sum(held)
        return held

    def _independent_rows(self, event: str, p: float, batch: int) -> tuple[bool, ...]:
        """Deterministic rows that fall as independent ones do on average: all
        hold on a share p^B of asks (error diffusion); on the others the rows
        that hold number B q on average, q = (p - p^B) / (1 - p^B) (their count
        diffused, at most B - 1 since 1 - p^B <= B (1 - p)), taken round-robin,
        so each row holds on a share p."""
        all_held = p ** batch
        if self._diffuse((event, "all"), all_held):
            return (True,) * batch
        q = (p - all_held) / (1 - all_held)
        credit = self._credit.get((event, "rows"), 0.0) + batch * q
        n = min(int(credit + 1e-12), batch - 1)
        self._credit[(event, "rows")] = credit - n
        first = self._credit.get((event, "next"), 0)
        self._credit[(event, "next")] = (first + n) % batch
        chosen = {(first + i) % batch for i in range(n)}
        return tuple(r in chosen for r in range(batch))

    def rate(self, event: str) -> float | None:
        n = self.asked.get(event, 0)
        return self.held.get(event, 0) / n if n else None


def scaled_expected(model, gamma: int, position: int, scale: float) -> float:
    """Mean accepted length when every per-token acceptance is multiplied by
    scale: P(at least j accepted) scales by scale**j."""
    if scale == 1.0:
        return model.expected(gamma, position)
    means = [model.expected(j, position) for j in range(gamma + 1)]
    return sum(scale ** j * (means[j] - means[j - 1]) for j in range(1, gamma + 1))


@lru_cache(maxsize=256)
def iid_with_mean(gamma: int, expected: float) -> IID:
    """The i.i.d. acceptance model whose mean accepted length over gamma proposals
    is ``expected`` (alpha found by bisection; the mean rises with alpha)."""
    if not 0 <= expected <= gamma:
        raise ValueError(f"a modelled mean of {expected} accepted tokens cannot come "
                         f"from {gamma} proposals; it must lie in [0, {gamma}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if IID(alpha=mid).expected(gamma) < expected else (lo, mid)
    return IID(alpha=(lo + hi) / 2)
