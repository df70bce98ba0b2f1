"""What a schedule declares for comparing it, beside what the runtimes ask.

``register(..., tuned=, laws=, law_views=, defaults=)`` (``policies.base``) carries
these, and generic code reads them:

  * ``Tuned``: the integer parameter a comparison searches for the schedule's best
    value (``analyses.compare.tune``);
  * ``laws``: the schedule's closed forms by the name ``hetspec law NAME`` takes
    (``analyses.laws.forms``), written with the argument types below, which that
    command checks before a law runs;
  * ``LawView``: a figure of the report's law view (``analyses.compare.lawviews``);
  * ``Default``: a setting a comparison fills in when the user gives none, with its
    one-line meaning for the report (``analyses.compare.scenario``).

Plain frozen data; no simpy, no torch, no plotly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from hwprofiles.models import ModelSpec

MAX_COUNT = 1_000_000  # larger token, layer or batch counts are typing slips, not designs
TUNE_TOP = 32  # a tuned search's top unless its schedule says otherwise

# the argument types of a closed form (checked, strictly, by ``hetspec law``)
Probability = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


def check(cond: bool, message: str) -> None:
    """A closed form's check across its arguments: ValueError ``message`` unless ``cond``."""
    if not cond:
        raise ValueError(message)


@dataclass(frozen=True)
class Tuned:
    """The integer parameter ``key`` a comparison searches, over the parameter's own
    valid range with its top capped at ``top``: drafts past 32 tokens a step are
    beyond every published configuration, and the work estimate counts the search's
    refinement rounds at the top of its range (``--sweep KEY=32..64`` looks further)."""

    key: str
    top: int = TUNE_TOP


@dataclass(frozen=True)
class Default:
    """A setting ``key`` a comparison fills in when the user gives neither it nor any
    of ``unless`` (settings that decide it instead): ``value``, or ``value(target)``
    of the target's model spec. ``meaning``: one sentence the report prints beside it."""

    key: str
    value: float | Callable[[ModelSpec], float]
    unless: tuple[str, ...] = ()
    meaning: str = ""

    def value_for(self, target: ModelSpec) -> float:
        return self.value(target) if callable(self.value) else self.value


@dataclass(frozen=True)
class LawView:
    """One figure of the report's law view of a schedule: ``title`` names it in the
    report, ``drawing`` says how it is drawn (``analyses.compare.lawviews.DRAWINGS``),
    ``note`` is printed under the view when the schedule ran. Schedules that declare
    one equal view share its figure (a view is frozen data, compared by value).

    ``drawing="curve"`` draws the law the run's terms give, ``terms.curve(x)`` for x
    in ``x_range``, and each run at (``metrics[x]``, ``metrics[y]``); ``heading``,
    ``x_title`` and ``y_title`` label it, and runs that differ only in ``along``
    (settings that move a run along the curve) share a curve. ``law``: a closed form
    a drawing evaluates itself (the eq. 6 family of PPSD)."""

    title: str
    drawing: str
    note: str = ""
    x: str = ""
    y: str = ""
    heading: str = ""
    x_title: str = ""
    y_title: str = ""
    along: tuple[str, ...] = ()
    x_range: tuple[float, float] = (0.0, 1.0)
    law: Callable[..., dict] | None = None
