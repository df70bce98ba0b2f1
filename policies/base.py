"""The schedules' registry: what a schedule registers, and its look-up by name.

A policy is registered with a pydantic parameter model (frozen, extra fields
forbidden), and with what it models of its outcomes and what its law takes.
Users pick policies by name (``--policy``): ``entry``, ``names``,
``parse_params``, ``build``, ``outcome_models`` and ``baseline_of`` (the run a
speedup is measured against) look them up, importing a
schedule's module when its name is first looked up (``SCHEDULES``), so a run
loads the schedules it runs and no other; a schedule registered elsewhere
(``register`` in a test) is found as it is. This module imports no schedule, so
every schedule can import it. (A schedule's prologue, the prompt's prefill, is
``policies.prefill.build_prefill``.)

Outcome models: what a schedule models of its outcomes, for the simulator alone.
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

One module because the three answer one question, what a schedule declares to
the runtimes: its entry (``register``), the outcome models and law-cost interface
the entry's callables use, and the look-up that finds the entry by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from hwprofiles.numbers import StrictModel
from hwprofiles.models import MAX_LAYERS, ModelSpec
from policies.declared import Default, LawView, Tuned


# all-reduces per draft step: two per layer of the deepest model a profile may hold
MAX_COLLECTIVES = 2 * MAX_LAYERS


# outcome models --------------------------------------------------------------
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


class PolicyError(ValueError):
    """Bad policy name or parameters; the message names the field and the fix."""


class PolicyParams(StrictModel):
    """Frozen, no unknown fields, finite numbers: ``--set r=inf`` or ``gamma=true``
    is refused with the parameter named (see hwprofiles.numbers)."""

    def single_token_defaults(self) -> dict[str, Any]:
        """Parameters left unset whose default differs where the draft has no
        multi-token heads (``PolicyContext.draft_multi_token`` False), with the
        value they take there; a runtime records them beside its run."""
        return {}

    @classmethod
    def pipelined(cls, stage_layers: int) -> dict[str, Any] | None:
        """The parameters that run this schedule as a pipeline of stages of
        ``stage_layers`` layers on roles stage0, stage1, ... (a capacity search
        tries them); None: the schedule has no such form."""
        return None

    def resident_bytes(self) -> float | None:
        """DRAM a schedule that streams decoder layers from storage keeps them in
        (the memory check holds no more of them resident); None: all resident."""
        return None

    @property
    def proposes_by_lookup(self) -> bool:
        """True where no draft model proposes: prompt lookup on the host does
        (``policies.ngram``); a measured run then loads the target alone and
        records the lookup's fitted match model."""
        return False

    def unused(self) -> str | None:
        """A parameter given that this configuration of the schedule ignores, as
        one clause naming it and the fix, or None. A single run refuses it
        (``analyses.run.api.check_used``); a sweep does not, as one fixed
        setting may serve some of its points and not others."""
        return None


@dataclass(frozen=True)
class PolicyContext:
    """What a schedule knows of its run: models, batch and token budget.

    ``tokens`` is the number of tokens to generate per row; a schedule stops once
    its rows have committed ``tokens * batch`` in all. ``prompt_tokens`` is the
    context already in the KV cache when decoding starts; with ``fixed_context``
    every Forward sees exactly that context (the laws' steady-state assumption).
    ``expected_outcomes``: verdicts and outcomes are expectations (deterministic
    simulation), so a schedule charges the laws' idealised work and none of the
    catch-up positions that depend on whole outcomes.
    ``prefill_chunk``: positions per prefill pass (None: the whole prompt in
    one pass); see ``policies.prefill``.
    ``acceptance``: the simulated run's acceptance model (None in the executor),
    for a schedule whose proposal is not a chain (a token tree) to shape itself
    and, in its ``outcome_models``, to turn into a modelled mean.
    ``draft_multi_token``: the draft has multi-token heads (one pass emits several
    tokens, Mirror's eta > 1), as the papers' drafts do; the real executor's
    drafts have them only where the trained draft artifact does (``hetspec
    train-draft --ahead``), and default to one token a pass elsewhere.
    """

    target: ModelSpec
    draft: ModelSpec | None = None
    tokens: int = 128
    batch: int = 1
    prompt_tokens: int = 128
    fixed_context: bool = False
    expected_outcomes: bool = False
    prefill_chunk: int | None = None
    acceptance: Any = None
    draft_multi_token: bool = True

    def context(self, generated_per_row: float) -> int:
        if self.fixed_context:
            return self.prompt_tokens
        return self.prompt_tokens + int(generated_per_row)

    def need_draft(self, policy: str) -> ModelSpec:
        if self.draft is None:
            raise PolicyError(f"policy '{policy}' needs a draft model; pass --draft NAME")
        return self.draft

    @property
    def budget(self) -> int:
        return self.tokens * self.batch


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    fn: Callable[..., Generator]
    params: type[PolicyParams]
    needs_draft: bool
    streams_weights: bool
    summary: str
    baseline: Callable[[PolicyParams], tuple[str, dict]]
    timeline: Callable[[list], dict] | None = None
    outcome_models: Callable[[PolicyContext, PolicyParams], OutcomeModels] | None = None
    law_terms: Callable[[LawCosts, PolicyContext, PolicyParams], Any] | None = None
    tuned: Tuned | None = None
    laws: dict[str, Callable[..., dict]] = field(default_factory=dict)
    law_views: tuple[LawView, ...] = ()
    defaults: tuple[Default, ...] = ()
    baseline_words: str = ""
    fits_profile: bool = False


REGISTRY: dict[str, PolicyEntry] = {}


AR = "ar"  # the autoregressive schedule: the baseline a speedup is measured against


def _plain_ar(_params: PolicyParams) -> tuple[str, dict]:
    return AR, {}


def register(name: str, params: type[PolicyParams], *, needs_draft: bool = False,
             streams_weights: bool = False,
             baseline: Callable[[PolicyParams], tuple[str, dict]] = _plain_ar,
             timeline: Callable[[list], dict] | None = None,
             outcome_models: Callable[[PolicyContext, PolicyParams], OutcomeModels]
             | None = None,
             law_terms: Callable[[LawCosts, PolicyContext, PolicyParams], Any] | None = None,
             **declared):
    """Register ``fn(ctx, params) -> generator`` under a user-facing name.

    ``baseline(params)`` names the autoregressive run a speedup is measured
    against (a schedule under a memory budget compares with AR under the same
    budget); ``streams_weights`` says the schedule checks memory fit itself.
    ``timeline(spans) -> dict`` derives metrics that need times (overlap,
    per-phase shares) from a run's spans, simulated or measured.
    ``outcome_models(ctx, params)`` gives the simulator what the schedule models
    of its verdicts and events (``VerifyModel``, ``EventModel`` above); none: the run's
    acceptance model decides every Verify, and the schedule asks no Outcome.
    ``law_terms(costs, ctx, params)`` gives the terms the schedule's closed form
    takes, priced by ``costs`` (``LawCosts``: the caller's cost model and
    closed forms), whose ``metrics()`` are what a deterministic, fixed-context
    run at those terms measures (``tests/test_law_terms.py`` checks them);
    none: the schedule has no latency law to draw.
    ``declared``: what comparing the schedule reads (``policies.declared``):
    ``tuned`` (a ``Tuned``), ``laws`` (closed forms by name), ``law_views`` (its
    ``LawView`` figures), ``defaults`` (``Default`` settings a comparison fills in),
    ``baseline_words`` (its baseline in words, where not plain AR) and
    ``fits_profile`` (calibration fits a profile to its runs by default).
    """

    def wrap(fn):
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        REGISTRY[name] = PolicyEntry(name, fn, params, needs_draft, streams_weights,
                                     summary, baseline, timeline, outcome_models,
                                     law_terms, **declared)
        return fn

    return wrap


def validate_params(name: str, cls: type[PolicyParams], values: dict[str, Any]) -> PolicyParams:
    """``values`` validated by schedule ``name``'s parameter model ``cls``; a
    PolicyError naming the parameter and the fix when they do not validate."""
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        if not field:  # a check across fields: the message names them
            raise PolicyError(f"policy '{name}': "
                              f"{first['msg'].removeprefix('Value error, ')}") from None
        if first["type"] == "extra_forbidden":
            raise PolicyError(
                f"policy '{name}' has no parameter '{field}'; its parameters are "
                f"{', '.join(cls.model_fields) or '(none)'}") from None
        raise PolicyError(f"policy '{name}' parameter '{field}': "
                          f"{first['msg'].removeprefix('Value error, ')}") from None


# look-up by name -------------------------------------------------------------
# shipped schedule name -> the module of this package that registers it; a test
# (tests/test_architecture.py) ties it to the modules' ``@register`` lines, so a
# new schedule module that is not listed here fails the suite
SCHEDULES = {"ar": "ar", "ar_stream": "cats", "cats": "cats", "kangaroo": "cats",
             "eesd": "ppsd", "ppsd": "ppsd", "mirror": "mirror", "sd": "sd", "ssd": "ssd",
             "tree": "tree"}


def entry(name: str) -> PolicyEntry:
    """The registry entry of schedule ``name``, its module imported on first use."""
    if name not in REGISTRY and name in SCHEDULES:
        importlib.import_module(f"policies.{SCHEDULES[name]}")
    if name not in REGISTRY:
        raise PolicyError(f"unknown policy '{name}'; choose one of {', '.join(names())}")
    return REGISTRY[name]


def parse_params(name: str, values: dict[str, Any]) -> PolicyParams:
    return validate_params(name, entry(name).params, values)


def build(name: str, ctx: PolicyContext, params: PolicyParams | dict) -> Generator:
    e = entry(name)
    if isinstance(params, dict):
        params = parse_params(name, params)
    if e.needs_draft:
        ctx.need_draft(name)
    return e.fn(ctx, params)


def outcome_models(name: str, ctx: PolicyContext,
                   params: PolicyParams | dict) -> OutcomeModels:
    """What schedule ``name`` models of its outcomes, for a simulator to attach
    (``VerifyModel``, ``EventModel`` above); the executor never asks."""
    e = entry(name)
    if isinstance(params, dict):
        params = parse_params(name, params)
    return {} if e.outcome_models is None else e.outcome_models(ctx, params)


def baseline_of(policy: str, params: PolicyParams | dict) -> tuple[str, dict] | None:
    """The (policy, params) a run's speedup is measured against (its schedule's own
    AR baseline: ppsd's runs through the same stages), or None when the run is
    its own baseline. ``params``: the run's typed parameters (a RunSettings'), or a
    dict of them, validated here."""
    if not isinstance(params, PolicyParams):
        params = parse_params(policy, params)
    name, base_params = entry(policy).baseline(params)
    if name == policy and base_params == params.model_dump(exclude_unset=True):
        return None
    return name, base_params


def names() -> list[str]:
    """Every schedule's name, shipped or registered, without importing any."""
    return sorted(set(SCHEDULES) | set(REGISTRY))


def entries() -> list[PolicyEntry]:
    """Every schedule's entry, by name (each shipped schedule's module imported)."""
    return [entry(name) for name in names()]


# law terms -------------------------------------------------------------------
# A schedule exports the terms its closed form takes next to the schedule
# (``register(..., law_terms=fn)``, ``fn(costs, ctx, params)``): which passes,
# messages and acceptance means make up its step, priced by ``costs``, and its
# closed form evaluates them. The schedules sit below the simulator's cost model,
# so they receive it through this interface instead of importing it;
# ``analyses.laws.terms.Scenario`` answers it over the roofline cost model for
# one run's configuration. Times are seconds, sizes bytes.
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
