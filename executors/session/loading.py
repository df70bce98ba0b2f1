"""A session's models: the target and its draft, loaded once for every batch.

A ``self:N`` draft is the target's first N layers (no second copy); a named
draft loads with the next seed. The target's trained draft artifact gives the
exit layers with adapters and the multi-token heads each exit has. In worker
mode the weights stay unloaded here: each worker loads its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from executors.backend import drafts, models


@dataclass
class LoadedModels:
    """The session's models by role (``target``, ``draft``) and what their draft
    artifact adds."""

    sources: dict[str, str]  # role -> executor name (models.load)
    loaded: dict  # role -> models.Loaded
    adapters: tuple[int, ...]  # exit layers with trained adapters
    ahead: dict[str, dict[int, int]]  # role -> exit layer -> multi-token heads

    @classmethod
    def load(cls, target: str, draft: str | None, *, seed: int,
             weights: bool) -> "LoadedModels":
        """Load ``target`` (seed ``seed``) and ``draft`` (seed + 1, or the target's
        first layers for ``self:N``); ``weights``: False leaves them to workers."""
        sources = {"target": target, **({"draft": draft} if draft else {})}
        loaded = {"target": with_heads(models.load(target, seed=seed, weights=weights),
                                       target)}
        if models.self_layers(draft):
            loaded["draft"] = models.self_draft(loaded["target"], draft)
        elif draft:
            loaded["draft"] = models.load(draft, seed=seed + 1, weights=weights)
        drafts.warn_if_absent(target)
        adapters = loaded["target"].spec.trained_adapters  # read from the artifact once
        return cls(sources, loaded, adapters, multi_token_heads(target, draft, adapters))

    @property
    def specs(self) -> dict:
        return {role: ld.spec for role, ld in self.loaded.items()}

    @property
    def n_layers(self) -> dict[str, int]:
        return {role: ld.spec.n_layers for role, ld in self.loaded.items()}

    @property
    def tokenizer(self):
        return self.loaded["target"].tokenizer

    @property
    def draft_multi_token(self) -> bool:
        """Whether the draft's own head has multi-token heads (Mirror's eta then
        defaults to 2, as in the papers), or emits one token a pass."""
        n = models.self_layers(self.sources.get("draft"))
        return bool(n) and self.ahead.get("draft", {}).get(n, 0) > 0

    def self_drafted(self, role: str) -> bool:
        """Whether ``role`` runs the target's own layers (a self:N draft)."""
        return bool(models.self_layers(self.sources[role]))


def with_heads(loaded: models.Loaded, target: str) -> models.Loaded:
    """``loaded`` with its spec saying which trained draft heads the run uses
    (``drafts.head_fields``): the simulator prices the heads the executor runs."""
    return replace(loaded, spec=loaded.spec.model_copy(update=drafts.head_fields(target)))


def multi_token_heads(target: str, draft: str | None,
                      adapters: tuple[int, ...]) -> dict[str, dict[int, int]]:
    """Per model of the session, exit layer -> the multi-token heads its trained
    exit head has there (the target's draft artifact; a self-draft shares it, and
    its own head at its last layer is that exit's unless an adapter sits there)."""
    counts = drafts.ahead_counts(target)
    out = {"target": counts}
    n = models.self_layers(draft)
    if n:
        out["draft"] = {e: c for e, c in counts.items() if e < n or n not in adapters}
    return out
