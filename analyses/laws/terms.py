"""The terms of a run's latency law, as its schedule exports them.

Each schedule prices the terms its closed form takes next to the schedule
(``register(..., law_terms=...)``, ``policies.base.LawCosts``); ``law_terms`` hands
it a ``Scenario``: the roofline cost model's times for the run's configuration
(passes at the run's contexts, messages along the platform's routes), the
run's acceptance means; each schedule evaluates its own closed forms.
``analyses.compare.lawviews`` draws the laws with these terms and places the
simulated runs on them.
"""

from __future__ import annotations

from hwprofiles import load_model, load_platform, load_stack
from hwprofiles.schema import resolve
from policies import PolicyContext
from policies.base import entry
from simcore import RooflineCost
from simcore.outcomes import scaled_expected


def law_terms(cfg):
    """The terms of the closed form of ``cfg``'s schedule for its configuration;
    a schedule that exports none is refused."""
    export = entry(cfg.policy).law_terms
    if export is None:
        raise ValueError(f"policy '{cfg.policy}' exports no latency-law terms; pick a "
                         "policy that has a law (hetspec law --help lists them)")
    s = Scenario(cfg)
    return export(s, s.policy_context(), cfg.params)


class Scenario:
    """The cost model's times (seconds) for one run's configuration
    (``policies.base.LawCosts``)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.platform = load_platform(cfg.platform)
        self.placement = resolve(self.platform, cfg.placement)
        self.target = cfg.run_model(load_model(cfg.target))
        self.draft = cfg.run_model(load_model(cfg.draft)) if cfg.draft else None
        self.cost = RooflineCost(self.platform, load_stack(cfg.stack))
        self.batch = cfg.batch
        self.context = self.contexts(1)[0]
        self.acceptance = cfg.acceptance

    def contexts(self, n: int) -> list[int]:
        """KV positions at the middle of n equal parts of the run (one if fixed)."""
        c = self.cfg
        if c.fixed_context:
            return [c.prompt_tokens]
        return [c.prompt_tokens + int((i + 0.5) * c.tokens / n) for i in range(n)]

    def policy_context(self) -> PolicyContext:
        c = self.cfg
        return PolicyContext(self.target, self.draft, c.tokens, c.batch, c.prompt_tokens,
                             c.fixed_context)

    def forward_s(self, model, role: str, layers, n_tokens: int, rows: int, context: int,
                  head, collectives=None, head_tokens: int | None = None) -> float:
        return self.cost.forward(model, self.placement[role], layers, n_tokens, rows,
                                 context, head, collectives, head_tokens).total_s

    def target_s(self, layers, n_tokens: int, head, context: int | None = None,
                 head_tokens: int | None = None) -> float:
        return self.forward_s(self.target, "target", layers, n_tokens, self.batch,
                              self.context if context is None else context, head, None,
                              head_tokens)

    def draft_s(self, n_tokens: int, rows: int, context: int, collectives) -> float:
        return self.forward_s(self.draft, "draft", (0, self.draft.n_layers), n_tokens,
                              rows, context, "lm", collectives)

    def shared(self) -> bool:
        """Whether the target and the draft share a device (its stream is FIFO)."""
        members = [set(self.platform.members(self.placement[r]))
                   for r in ("target", "draft")]
        return bool(members[0] & members[1])

    def trip_s(self, src: str, dst: str, nbytes: float) -> float:
        """A message from the first device of role src to the first of role dst."""
        a = self.platform.members(self.placement[src])[0]
        b = self.platform.members(self.placement[dst])[0]
        return sum(RooflineCost.hop_s(link, nbytes) for link in self.platform.route(a, b))

    def mean_accepted(self, gamma: int, scale: float | None = None) -> float:
        if scale is None:
            return self.acceptance.expected(gamma)
        return scaled_expected(self.acceptance, gamma, 0, scale)
