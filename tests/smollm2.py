"""The real SmolLM2-135M session the slow tests share: one model load and AR's
reference outputs on the built-in prompts per test module."""

from __future__ import annotations

from contextlib import contextmanager

from executors.prompts import BUILTIN, encode
from executors.session import Options, Session

VOCAB = 49152
# four pipeline stage roles over the two cores (PPSD's default of 4 stages)
STAGES = {"stage0": "cpu0", "stage1": "cpu1", "stage2": "cpu0", "stage3": "cpu1"}


@contextmanager
def smollm2_with_ar(draft: str, tokens: int):
    """An inline SmolLM2 session with ``draft``, the built-in prompts encoded, and
    AR's first ``tokens`` on each: yields (session, prompts, reference)."""
    with Session("cpu-local", "smollm2-135m", draft, placement=STAGES,
                 options=Options(max_new_tokens=tokens, mode="inline")) as s:
        prompts = [encode(m, s.tokenizer, VOCAB) for m in BUILTIN]
        reference = [s.decode("ar", {}, [p]).generated[0][:tokens] for p in prompts]
        yield s, prompts, reference
