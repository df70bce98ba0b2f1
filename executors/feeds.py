"""Which positions a Forward feeds, and the device command that feeds them.

Token mode (layers from 0, or inputs from another model): each row feeds the
positions of its sequence past what all the Forward's layers already hold.
Hidden mode (inputs from the same model's layers just before these): the
positions of the input Forwards, in order, from their hidden states.
A row's sequence is ``committed + proposal`` (narrow), or a speculation-tree
row's own sequence (wide, see ``executors.book.Wide``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executors.device import FwdCmd
from policies.ops import Forward


@dataclass
class HandleInfo:
    """What the coordinator knows of a Forward's result (the device keeps tensors)."""

    id: int
    client: str
    role: str
    model: str
    width: int
    layers: tuple[int, int]
    start: list[int]
    n_fed: list[int]
    seqs: list[tuple]  # per row: the sequence whose positions were fed, up to the end
    n_logits: tuple[int, ...]
    head: str | None
    emit: str | None
    branch: int
    wide: bool
    at: set = field(default_factory=set)
    topk: list | None = None

    @property
    def logit_start(self) -> list[int]:
        """Per row: the position of the first logits row."""
        return [s + n - m for s, n, m in zip(self.start, self.n_fed, self.n_logits)]


def hidden_inputs(op: Forward, handles: dict) -> list[HandleInfo] | None:
    """The input Forwards whose hidden states continue into ``op``, or None when
    ``op`` reads tokens (its inputs, if any, only order it after them)."""
    if op.inputs is None:
        return None
    refs = op.inputs if isinstance(op.inputs, tuple) else (op.inputs,)
    infos = [handles[h.id] for h in refs]
    if all(i.model == op.model and i.layers[1] == op.layers[0] for i in infos) and (
            op.layers[0] > 0 or op.layers[0] == op.layers[1]):
        return infos
    return None


def _n_logits(op: Forward, seq, committed_len: int | None, n_fed: int) -> int:
    if op.head is None:
        return 0
    if op.emit in ("sample", "topk") or committed_len is None:
        return 1
    return max(1, min(n_fed, len(seq) - (committed_len - 1)))


def token_command(op: Forward, handle: int, book, seqs: list[tuple],
                  committed_lens: list[int | None], **extra) -> tuple[FwdCmd, dict]:
    """Feed each row's sequence past what the layers hold."""
    starts, n_fed, tokens, n_logits = [], [], [], []
    for r, seq in enumerate(seqs):
        start = min(book.holds(op.layers, r, seq), len(seq) - 1)
        starts.append(start)
        n_fed.append(len(seq) - start)
        tokens.append(list(seq[start:]))
        n_logits.append(_n_logits(op, seq, committed_lens[r], n_fed[-1]))
        book.wrote(op.layers, r, seq, len(seq))
    width = max(n_fed)
    padded = [t + [t[-1]] * (width - len(t)) for t in tokens]
    cmd = FwdCmd(handle, op.model, op.layers, starts, n_fed, padded, None, op.head,
                 op.emit, op.k, tuple(n_logits), **extra)
    return cmd, {"start": starts, "n_fed": n_fed, "seqs": seqs, "n_logits": tuple(n_logits)}


def hidden_command(op: Forward, handle: int, book, infos: list[HandleInfo],
                   committed_lens: list[int | None], **extra) -> tuple[FwdCmd, dict]:
    """Continue the input Forwards' positions through more layers."""
    first, last = infos[0], infos[-1]
    starts, n_fed, n_logits = list(first.start), [], []
    for r in range(len(first.start)):
        end = first.start[r]
        for info in infos:
            if info.start[r] != end:
                raise RuntimeError(f"the inputs of Forward '{op.label}' are not "
                                   "consecutive positions")
            end += info.n_fed[r]
        n_fed.append(end - starts[r])
        seq = last.seqs[r]
        if op.layers[0] < op.layers[1] and book.holds(op.layers, r, seq) < starts[r]:
            raise RuntimeError(f"layers {op.layers[0]}..{op.layers[1]} of {op.model} lack "
                               f"positions before {starts[r]}; feed them from layer 0 first")
        book.wrote(op.layers, r, seq, end)
        n_logits.append(_n_logits(op, seq[:end], committed_lens[r], n_fed[-1]))
    ids = tuple(i.id for i in infos) if len(infos) > 1 else first.id
    cmd = FwdCmd(handle, op.model, op.layers, starts, n_fed, None, ids, op.head, op.emit,
                 op.k, tuple(n_logits), **extra)
    seqs = [s[:st + n] for s, st, n in zip(last.seqs, starts, n_fed)]
    return cmd, {"start": starts, "n_fed": n_fed, "seqs": seqs, "n_logits": tuple(n_logits)}
