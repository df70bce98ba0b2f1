"""What a schedule models of its outcomes, for the simulator alone.

Operations say what happens (verify this proposal, did the cache hit); they carry
no modelled numbers. Where a schedule knows more than the run's acceptance model
(a token tree's mean accepted length, SAGUARO's distorted acceptance, the chance
that a prefix lies on a precomputed window), its module exposes
``outcome_models(ctx, params) -> {key: model}``, registered with the policy, and
the simulator attaches each model to the operations it names:

  * a ``Verify`` by its ``label`` -> ``VerifyModel``;
  * an ``Outcome`` by its ``event`` -> ``EventModel``.

The executor never reads these: it observes the real models' acceptance and events.
Plain frozen data, no simpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VerifyModel:
    """How the simulator draws the verdicts of the Verify operations it is attached to.

    ``expected``: a modelled mean of accepted tokens per row, used instead of the
    run's acceptance model (None: the run's model decides). ``scale`` in [0, 1]
    multiplies every modelled per-token acceptance (a proposal sampled from a
    distorted draft distribution).
    """

    expected: float | None = None
    scale: float = 1.0

    def __post_init__(self):
        if not 0 <= self.scale <= 1:
            raise ValueError(f"VerifyModel.scale must lie in [0, 1], got {self.scale}")


@dataclass(frozen=True, slots=True)
class EventModel:
    """The modelled chance that an ``Outcome`` event holds for one row.

    ``independent_rows``: deterministic simulation answers a per-row Outcome of
    this event as independent rows fall on average (every row holds on a share
    p^B of asks, each row on a share p; ``simcore.outcomes``). False: each row
    keeps its own credit, so rows with one chance answer alike."""

    probability: float
    independent_rows: bool = False


OutcomeModels = dict[str, VerifyModel | EventModel]
PLAIN = VerifyModel()  # a Verify no model names: the run's acceptance model decides


def verify_model(models: OutcomeModels, label: str) -> VerifyModel:
    """The model attached to Verify operations labelled ``label``."""
    model = models.get(label, PLAIN)
    if not isinstance(model, VerifyModel):
        raise ValueError(f"outcome model '{label}' is a {type(model).__name__}, but a "
                         "Verify is labelled so; a Verify needs a VerifyModel")
    return model


def event_model(models: OutcomeModels, event: str) -> EventModel:
    """The model of Outcome ``event``; every event a schedule asks needs one."""
    model = models.get(event)
    if not isinstance(model, EventModel):
        raise ValueError(f"Outcome event '{event}' has no EventModel among the schedule's "
                         f"outcome models ({', '.join(sorted(models)) or 'none'}); its "
                         "policy's outcome_models must give it one")
    return model
