"""A session's settings and what one decoded batch gives back."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.runs.measured import MeasuredSpan


@dataclass
class Options:
    """Executor settings beyond the simulated run's configuration."""

    max_new_tokens: int = 64
    threads: int = 1
    temperature: float = 0.0
    mode: str = "processes"  # or "inline": every device in this process, serially
    physical: dict[str, str] = field(default_factory=dict)  # role -> cpu:N / cuda:N


@dataclass
class BatchResult:
    generated: list[list[int]]
    wall_s: float
    steps: int
    spans: list[MeasuredSpan]
    acceptance: list[dict]
    stats: dict
    prefill_s: float = 0.0  # the prompt's prefill, before the clock of wall_s starts

    @property
    def first_token_s(self) -> float | None:
        """When the first Verify committed tokens, on the decoding's clock."""
        ends = [s.end_s for s in self.spans if s.type == "Verify"]
        return min(ends) if ends else None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: the prefill, then the decoding up to its first
        committed token (the prefill leaves the prompt's last token to that step)."""
        first = self.first_token_s
        return None if first is None else self.prefill_s + first
