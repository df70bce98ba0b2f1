"""Settings of ``hetspec train-draft`` (``executors.train.distil``), importable
without torch: the CLI builds its parser and help from these defaults on machines
without the executor installed."""

from __future__ import annotations

from dataclasses import dataclass

from executors.backend.models import REAL_NAME


@dataclass(frozen=True)
class TrainConfig:
    target: str = REAL_NAME
    # 18: PPSD's two stages balance there on SmolLM2 (README, 'Trained self-drafts')
    exits: tuple[int, ...] = (8, 15, 18)
    adapters: tuple[int, ...] = (3, 29)
    # multi-token heads on these exits (each one of ``exits``): Mirror's default
    # exit, half of SmolLM2's 30 layers; eta tokens per pass (eta - 1 heads each)
    ahead: tuple[int, ...] = (15,)
    eta: int = 2
    prompts: int = 256           # chat prompts the target answers
    answer_tokens: int = 96      # greedy tokens per answer
    doc_windows: int = 24        # windows of package descriptions
    seq_len: int = 160
    draft_vocab: int = 12288
    top_k: int = 32
    steps: int = 400             # per head
    batch_windows: int = 3
    lr: float = 1e-3
    warmup: int = 10
    seed: int = 0
    threads: int = 2
    held_out_every: int = 8
    gen_batch: int = 64
    # installed distributions left out of the corpus (by name): rebuilds an older
    # artifact's corpus on a machine that has since installed more
    exclude_packages: tuple[str, ...] = ()
