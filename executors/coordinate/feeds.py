"""Which positions a Forward feeds, and the device command that feeds them.

Token mode (layers from 0, or inputs from another model): each row feeds the
positions of its sequence past what all the Forward's layers already hold.
Hidden mode (inputs from the same model's layers just before these): the
positions of the input Forwards, in order, from their hidden states.
A row's sequence is ``committed + proposal`` (narrow), or a speculation-tree
row's own sequence (wide, see ``executors.coordinate.book.Wide``). Branch tokens (CATS's
corrections, see ``executors.coordinate.branches``) are fed after a row's sequence, in
slots the book does not record; hidden mode carries them through later layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executors.backend.device import FwdCmd
from policies.ops import Forward, Sample, TopK


@dataclass(frozen=True)
class Handle:
    """What a Forward returns to the schedule: an opaque reference."""

    id: int


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
    branches: list | None = None  # per row: (i, rope, limit) of its branch tokens

    @property
    def logit_start(self) -> list[int]:
        """Per row: the position of the first logits row."""
        return [s + n - m for s, n, m in zip(self.start, self.n_fed, self.n_logits)]


def hidden_inputs(op: Forward, handles: dict) -> list[HandleInfo] | None:
    """The input Forwards whose hidden states continue into ``op``, or None when
    ``op`` reads tokens (its inputs, if any, only order it after them)."""
    inputs = op.feed.inputs
    if inputs is None:
        return None
    refs = inputs if isinstance(inputs, tuple) else (inputs,)
    infos = [handles[h.id] for h in refs]
    if all(i.model == op.model and i.layers[1] == op.layers[0] for i in infos) and (
            op.layers[0] > 0 or op.layers[0] == op.layers[1]):
        return infos
    return None


def _n_logits(op: Forward, seq, committed_len: int | None, n_fed: int) -> int:
    if op.head is None:
        return 0
    if type(op.emit) is TopK and op.head.tokens is None and op.n_tokens > 1:
        return min(n_fed, op.n_tokens)  # a verifier's candidates at each position
    if op.emit is not None or committed_len is None:
        return 1
    return max(1, min(n_fed, len(seq) - (committed_len - 1)))


def multi_token(op: Forward, heads: dict[int, int], adapters: tuple[int, ...],
                handles: dict) -> int:
    """The most tokens ``op``'s one pass may emit per row through multi-token heads
    (0: it uses none): a sampled Forward of several tokens whose head is a trained
    exit head (``exit``, or a self-draft's own ``lm`` where no adapter sits) with
    ``heads[E]`` heads after its exit layer E (the draft artifact's ``ahead.E.j``)
    emits up to 1 + heads[E]. ``token_command`` settles the count
    (``ahead_tokens``). A Forward that extends a rollout asks exactly its tokens,
    so one asking more than the heads give is refused."""
    head = op.head
    if type(op.emit) is not Sample or op.n_tokens < 2 or head is None or head.tokens == 1:
        return 0
    exit_layer = op.layers[1]
    if head.kind not in ("exit", "lm") or (head.kind == "lm" and exit_layer in adapters):
        return 0
    have = heads.get(exit_layer, 0)
    prior = handles.get(getattr(op.feed.inputs, "id", None))  # the Forward it continues
    if have and prior is not None and prior.model == op.model and prior.emit == "sample" \
            and op.n_tokens > 1 + have:
        raise ValueError(f"Forward '{op.label}' asks one pass to emit {op.n_tokens} tokens "
                         f"per row, but the draft artifact has {have} multi-token head(s) "
                         f"after layer {exit_layer}; run it with eta={have + 1}, or train "
                         f"more with 'hetspec train-draft --eta {op.n_tokens}'")
    return 1 + have if have else 0


def ahead_tokens(op: Forward, most: int, n_fed: int) -> int:
    """Tokens a pass through multi-token heads emits per row, at most ``most``.
    A rollout's first Forward declares in ``n_tokens`` the positions it catches up
    on (all ``n_fed`` but the last, see ``policies.sd.first_draft_op``) beside its
    tokens; a later one feeds the previous pass's tokens, no fewer than it asks."""
    asked = op.n_tokens - n_fed + 1 if op.n_tokens > n_fed else op.n_tokens
    return max(1, min(most, asked))


def token_command(op: Forward, handle: int, book, seqs: list[tuple],
                  committed_lens: list[int | None], extras: list | None = None,
                  **extra) -> tuple[FwdCmd, dict]:
    """Feed each row's sequence past what the layers hold; ``extras[r]``: branch
    tokens ``(token, rope)`` fed after it, each seeing the slots below ``rope``, or
    ``(token, rope, limit, ancestors)``: seeing the slots below ``limit`` and those
    of the extras it names (indices into ``extras[r]``, a token tree).
    A sampled Forward whose head projects one position (``Head.tokens=1``)
    samples one token from one pass over its positions (a draft catching up on
    positions it never fed)."""
    sampled = type(op.emit) is Sample  # its steps: executors.passes.sampled_steps
    if sampled and op.n_tokens > 1 and op.head.tokens != 1 and not extra.get("ahead"):
        raise ValueError(f"Forward '{op.label}' asks one pass to emit {op.n_tokens} tokens "
                         "per row (multi-token prediction, mirror's eta), but this model has "
                         "no multi-token heads after that layer; run it with eta=1, or train "
                         "them with 'hetspec train-draft --ahead'")
    starts, n_fed, tokens, n_logits, branches = [], [], [], [], []
    for r, seq in enumerate(seqs):
        start = min(book.holds(op.layers, r, seq), len(seq) - 1)
        more = extras[r] if extras else []
        starts.append(start)
        n_fed.append(len(seq) - start + len(more))
        tokens.append(list(seq[start:]) + [e[0] for e in more])
        branches.append([_branch(len(seq), start, j, *e) for j, e in enumerate(more)])
        n_logits.append(_n_logits(op, seq, committed_lens[r], n_fed[-1] - len(more))
                        + (len(more) if op.head else 0))
        book.wrote(op.layers, r, seq, len(seq))
    width = max(n_fed)
    if extra.get("ahead"):
        extra["ahead"] = ahead_tokens(op, extra["ahead"], width)
    padded = [t + [t[-1]] * (width - len(t)) for t in tokens]
    branches = branches if any(branches) else None
    cmd = FwdCmd(handle, op.model, op.layers, starts, n_fed, padded, None, *head_fields(op),
                 tuple(n_logits), branches=branches, **extra)
    return cmd, {"start": starts, "n_fed": n_fed, "seqs": seqs, "n_logits": tuple(n_logits),
                 "branches": branches}


def head_fields(op: Forward) -> tuple[str | None, str | None, int]:
    """(head kind, what it emits, top-k) of ``op`` as a device command names them."""
    head, emit = op.head, op.emit
    return (head and head.kind, emit and emit.name, emit.k if type(emit) is TopK else 1)


def _branch(end: int, start: int, j: int, _token, rope: int, limit: int | None = None,
            ancestors=()) -> tuple:
    """Extra j's branch entry: its index among the fed positions, its rotary
    position, the slots it sees below, and its ancestors' slots."""
    return (end - start + j, rope, rope if limit is None else limit,
            *(end + a for a in ancestors))


def hidden_command(op: Forward, handle: int, book, infos: list[HandleInfo],
                   committed_lens: list[int | None], **extra) -> tuple[FwdCmd, dict]:
    """Continue the input Forwards' positions through more layers."""
    first, last = infos[0], infos[-1]
    starts, n_fed, n_logits, branches = list(first.start), [], [], []
    for r in range(len(first.start)):
        end, row = first.start[r], []
        for info in infos:
            if info.start[r] != end or (info.branches and info.branches[r]
                                        and info is not last):
                raise RuntimeError(f"the inputs of Forward '{op.label}' are not "
                                   "consecutive positions")
            if info.branches:  # branch tokens come last, past the main positions
                row += [(end - starts[r] + i, *rest) for i, *rest in info.branches[r]]
            end += info.n_fed[r]
        n_fed.append(end - starts[r])
        branches.append(row)
        seq = last.seqs[r]
        if op.layers[0] < op.layers[1] and book.holds(op.layers, r, seq) < starts[r]:
            raise RuntimeError(f"layers {op.layers[0]}..{op.layers[1]} of {op.model} lack "
                               f"positions before {starts[r]}; feed them from layer 0 first")
        book.wrote(op.layers, r, seq, end - len(row))
        n_logits.append(_n_logits(op, seq[:end - len(row)], committed_lens[r],
                                  n_fed[-1] - len(row)) + (len(row) if op.head else 0))
    if extra.get("ahead"):
        extra["ahead"] = ahead_tokens(op, extra["ahead"], max(n_fed))
    ids = tuple(i.id for i in infos) if len(infos) > 1 else first.id
    branches = branches if any(branches) else None
    cmd = FwdCmd(handle, op.model, op.layers, starts, n_fed, None, ids, *head_fields(op),
                 tuple(n_logits), branches=branches, **extra)
    seqs = [s[:st + n] for s, st, n in zip(last.seqs, starts, n_fed)]
    return cmd, {"start": starts, "n_fed": n_fed, "seqs": seqs, "n_logits": tuple(n_logits),
                 "branches": branches}
