"""What a schedule's law terms ask of the caller: times and closed forms.

A schedule exports the terms its closed form takes next to the schedule
(``register(..., law_terms=fn)``, ``fn(costs, ctx, params)``): which passes,
messages and acceptance means make up its step, priced by ``costs``. The
schedules sit below the simulator's cost model and the closed-form laws, so
they receive both through this interface instead of importing them;
``analyses.laws.terms.Scenario`` answers it over the roofline cost model for
one run's configuration. Times are seconds, sizes bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hwprofiles.models import ModelSpec


class LawCosts(Protocol):
    """The cost model's answers for one run's configuration."""

    batch: int  # rows per step
    context: int  # KV positions at the middle of the run (its prompt if fixed)

    def contexts(self, n: int) -> list[int]:
        """KV positions at the middle of n equal parts of the run (one if fixed)."""

    def forward_s(self, model: ModelSpec, role: str, layers: tuple[int, int],
                  n_tokens: int, rows: int, context: int, head: str | None,
                  collectives: int | None = None, head_tokens: int | None = None) -> float:
        """One forward of ``layers`` of ``model`` on the devices of placement
        ``role`` (as ``policies.ops.Forward`` has them)."""

    def target_s(self, layers: tuple[int, int], n_tokens: int, head: str | None,
                 context: int | None = None, head_tokens: int | None = None) -> float:
        """A target forward on role target over every row (context: the run's)."""

    def draft_s(self, n_tokens: int, rows: int, context: int,
                collectives: int | None) -> float:
        """A forward of the whole draft model with its LM head on role draft."""

    def trip_s(self, src: str, dst: str, nbytes: float) -> float:
        """A message from the first device of role src to the first of role dst."""

    def shared(self) -> bool:
        """Whether the target and the draft share a device (its stream is FIFO)."""

    def mean_accepted(self, gamma: int, scale: float | None = None) -> float:
        """The run's acceptance model's mean accepted drafts of gamma proposals,
        each acceptance multiplied by ``scale`` when given."""

    def closed_form(self, name: str) -> Callable[..., dict]:
        """The closed-form law of that name (``analyses.laws.forms``)."""
