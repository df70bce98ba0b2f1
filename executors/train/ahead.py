"""Multi-token heads for ``hetspec train-draft`` (``executors.train.distil`` calls these
after every other head is trained, so those come out as they would alone).

Head j of exit E reads exit E's states at position t, as ``exit.E`` does, and
learns the target's last-layer distribution at position t+j (the distribution
of token t+1+j): the same top-K reduced KL as the other heads, on the teacher's
tensors shifted by j. It starts from the trained ``exit.E`` (its "before"
agreement: how often exit E's own guess for t+1 is the target's token t+1+j).
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass

import torch

from executors.train.config import TrainConfig


@dataclass
class Shifted:
    """Teacher tensors for offset j: states at t against targets at t+j."""

    states: torch.Tensor   # [S, T-j, H]
    pos: torch.Tensor      # [S, T-j, K]
    probs: torch.Tensor    # [S, T-j, K]
    argmax: torch.Tensor   # [S, T-j]
    scored: torch.Tensor   # [S, T-j]: t and t+j both scored


def shifted(states, pos, probs, argmax, scored, j: int) -> Shifted:
    t = states.shape[1] - j
    return Shifted(states[:, :t], pos[:, j:], probs[:, j:], argmax[:, j:],
                   scored[:, :t] & scored[:, j:])


def ahead_layers_ok(cfg: TrainConfig) -> None:
    """Multi-token heads extend a trained exit head: refuse ones without."""
    missing = [e for e in cfg.ahead if e not in cfg.exits]
    if missing and cfg.eta > 1:
        raise ValueError(f"train-draft --ahead {missing[0]} has no exit head to extend; add "
                         f"{missing[0]} to --exits or drop it from --ahead")


def n_ahead_heads(cfg: TrainConfig) -> int:
    return len(cfg.ahead) * (cfg.eta - 1)


def fit_ahead(exits: dict, data: dict, cfg: TrainConfig, gen, bar, train_head, agreement):
    """Train heads j = 1..eta-1 of every ``cfg.ahead`` exit; returns
    ({E: [head_1, ...]}, {"ahead.E.j": report}). ``data``: the split teacher
    tensors (``train``/``held``: states by layer, pos, probs, argmax, scored), the
    draft vocabulary's LM-head rows and ids, and the rope tables;
    ``train_head``/``agreement`` are ``executors.train.distil``'s."""
    heads, report = {}, {}
    for e in cfg.ahead if cfg.eta > 1 else ():
        heads[e] = []
        for j in range(1, cfg.eta):
            bar.set_description(f"train-draft: ahead {e}.{j}")
            tr, ho = (shifted(data[s]["states"][e], data[s]["pos"], data[s]["probs"],
                              data[s]["argmax"], data[s]["scored"], j)
                      for s in ("train", "held"))
            head = copy.deepcopy(exits[e]).train().requires_grad_(True)
            rows, ids, rope = data["rows"], data["vocab_ids"], data["rope"]
            base = agreement(head, ho.states, rows, ids, ho.argmax, ho.scored, rope)
            losses = train_head(head, tr.states, rows, tr.pos, tr.probs, tr.scored, rope,
                                cfg, gen, bar)
            head.eval().requires_grad_(False)
            after = agreement(head, ho.states, rows, ids, ho.argmax, ho.scored, rope)
            heads[e].append(head)
            report[f"ahead.{e}.{j}"] = {
                "loss_first": round(losses[0], 4),
                "loss_last_mean10": round(sum(losses[-10:]) / 10, 4),
                "held_out_top1_before": round(base, 4), "held_out_top1": round(after, 4),
                "predicts": f"token t+{1 + j} from exit {e}'s states at t"}
    return heads, report


def machine_facts() -> dict:
    """When and under what load a run went: the provenance's account of its
    wall time on a shared machine."""
    facts = {"utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if hasattr(os, "getloadavg"):
        facts["load_1min"] = round(os.getloadavg()[0], 2)
    if hasattr(os, "nice"):
        facts["nice"] = os.nice(0)
    facts["cpus"] = os.cpu_count()
    return facts
