"""A Forward and its typed parts: which speculation branch it works on
(``Branch``), the tree it lays out there (``Roots``, ``Fanout``, ``Children``),
its ``Head``, what it emits (``Sample``, ``TopK``) and what it reads (``Feed``).
Schedules build Forwards by naming these parts; every runtime reads them.
``policies.ops`` holds the rest of the operation vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Literal

ALTERNATIVES = 8  # draft candidates kept beside a sampled token unless a schedule asks more


class Branch(IntEnum):
    """A speculation branch, named by the schedule that speculates on it: a
    schedule subclasses ``Branch`` with one member per branch it uses (its value
    the branch's index). Each branch holds a narrow proposal, one row per
    sequence, which a sampling Forward on it extends and a Forward on it that
    does not sample scores after the committed tokens; value 0 is the narrow
    branch every operation names unless it says otherwise (``MAIN``)."""


class Narrow(Branch):
    """The one branch of a schedule that speculates on a single proposal."""

    MAIN = 0


MAIN = Narrow.MAIN


@dataclass(frozen=True, slots=True)
class Roots:
    """Layout of a speculation tree grown from candidates (Mirror-SD's
    branch-complete window): each sequence gets ``count`` rows, row
    ``r * count + i`` continuing ``committed + proposal + [candidate i]``, the
    candidates being the top-``count`` tokens (``TopK``) that the Forward in the
    tree's first ``feed.inputs`` emitted after the proposal under verification,
    the narrow proposal of speculation ``branch`` (the branch that Forward
    scores). Each row guesses the whole proposal is accepted and its candidate
    is the bonus token."""

    count: int
    branch: Branch = MAIN

    @property
    def rows(self) -> int:
        """Rows per sequence."""
        return self.count


@dataclass(frozen=True, slots=True)
class Fanout:
    """Layout of a speculation tree over guessed verdicts (SSD's pre-speculation):
    for each accepted count k = 0..K, ``per_accepted[k]`` (F_k) rows continue
    ``committed + proposal[:k] + [guess f]``, sequence-major, then in order of k
    and f. The proposal is the one under verification, the narrow proposal of
    speculation ``branch``. For k below the proposal's length the guesses are the
    draft's own top candidates at position k other than the token it proposed
    there (``Sample.alternatives`` must keep enough); for k = K the tree's first
    pass emits the draft's rank-f token as the guess."""

    per_accepted: tuple[int, ...]
    branch: Branch = MAIN

    @property
    def rows(self) -> int:
        """Rows per sequence: sum(F_k)."""
        return sum(self.per_accepted)


@dataclass(frozen=True, slots=True)
class Children:
    """Layout of a token tree drafted depth by depth (Medusa, EAGLE; ``TopK``
    Forwards): the first such Forward on its branch feeds the committed
    sequence and its last token is the root, whose ``TopK.k`` candidates are
    depth 1; each later one expands the ``n_tokens`` most confident nodes of the
    deepest level (confidence: the product of the draft's probabilities along
    the path) into their ``TopK.k`` candidates. A Forward on the branch that does
    not sample (the target's, with a head) then scores the root and its
    ``n_tokens - 1`` most confident nodes, parents first, under a tree mask, and
    a Verify on the branch walks it."""

    @property
    def rows(self) -> int:
        """Rows per sequence: a token tree's nodes share their sequence's row."""
        return 1


@dataclass(frozen=True, slots=True)
class Head:
    """The head a Forward applies after its layers: ``kind`` "lm" (the final
    norm and LM head), "exit" (an early-exit norm and vocabulary projection) or
    "exit_layer" (one decoder layer of its own before them). ``tokens``:
    positions per row it projects (1: a top-k taken at each row's last
    position); None: all the Forward's ``n_tokens``."""

    kind: Literal["lm", "exit", "exit_layer"] = "lm"
    tokens: int | None = None


LM = Head("lm")


@dataclass(frozen=True, slots=True)
class Sample:
    """Emit by sampling: the Forward appends ``n_tokens`` tokens per row (one
    pass each) to its speculation branch, keeping ``alternatives`` of the
    draft's ranked candidates beside each sampled token (the acceptance trace
    ranks the target's bonus token among them; a ``Fanout`` tree takes its
    guesses there)."""

    alternatives: int = ALTERNATIVES
    name: ClassVar[str] = "sample"


SAMPLE = Sample()


@dataclass(frozen=True, slots=True)
class TopK:
    """Emit the top-``k`` candidates at each position the head projects."""

    k: int = 1
    name: ClassVar[str] = "topk"


@dataclass(frozen=True, slots=True)
class Feed:
    """What a Forward reads besides its own new positions.

    ``inputs``: the handle (or tuple of handles) of the Forward(s) whose hidden
    states feed this one. ``catch_up``: it also feeds, before its own positions,
    what its rows lack in this model's cache for these layers, rows padded to
    the widest: a narrow rollout's, the committed tokens its rollouts never fed
    (the last sampled token, the bonus token); a tree's first Forward's
    (``Roots``, ``Fanout``), besides those, the part of the proposal under
    verification its rows continue and did not feed, and their root or guess.
    The runtime counts them (``policies.cachebook``), the schedule does not; a
    sampling one still samples ``n_tokens`` tokens from its last positions.
    Caches are the model's layers at one width (``tree.rows`` rows per
    sequence, 1 without a tree), whatever the branch.
    ``sequences``: the sequences a narrow Forward runs for, in order (SSD's
    backup for the rows whose cache missed), ``batch`` of them; its samples
    extend those rows' proposals alone. None: every sequence.
    ``corrections``: it (token mode, the main branch) also re-forwards that many
    correction tokens after the proposal (CATS): at the first position i where
    the last multi-position ``TopK`` verifier's best token differs from the
    draft's (the last position where it agrees everywhere), its best candidates
    other than the draft's, each a sibling of ``proposal[i]`` that sees the
    committed tokens and ``proposal[:i]`` only. Later Forwards over these
    positions carry them through their layers, and the Verify may take one where
    the target's own token equals it."""

    inputs: Any = None
    catch_up: bool = False
    sequences: tuple[int, ...] | None = None
    corrections: int = 0


OWN = Feed()  # its own new positions alone
CATCH_UP = Feed(catch_up=True)  # what its rows lack first, then its own positions


@dataclass(frozen=True, slots=True)
class Forward:
    """Run decoder layers ``[start, stop)`` of a model over new positions.

    ``n_tokens`` new positions per row attend to ``context`` cached positions.
    On a group the runtime shards the work tensor-parallel; ``collectives`` is
    the number of all-reduces that sharding costs (None: Megatron's two per
    layer). Its parts: ``head`` (``Head``, None: hidden states only), ``emit``
    (``Sample``, ``TopK``; None: logits), ``feed`` (``Feed``), and the
    speculation ``branch`` it extends or scores (the target's Forwards name the
    branch their Verify checks).

    ``tree`` lays out a speculation tree on a branch other than ``MAIN``: with
    ``Roots`` or ``Fanout`` a sampling Forward grows one over ``batch`` rows
    (sequences x ``tree.rows``), the first starting it in that layout and each
    later one (whose ``feed.inputs`` is the previous) extending every row by
    one token; with ``Children`` a ``TopK`` Forward drafts a token tree, which
    the branch's next Forward that does not sample scores and its Verify walks.
    """

    model: str
    device: str
    layers: tuple[int, int]
    n_tokens: int = 1
    batch: int = 1
    context: int = 0
    head: Head | None = None
    emit: Sample | TopK | None = None
    feed: Feed = OWN
    branch: Branch = MAIN
    tree: Roots | Fanout | Children | None = None
    collectives: int | None = None
    label: str = ""

    def record(self) -> dict:
        """The Forward as a measured span names it: the flat fields, in the order,
        the run records have always kept (``inputs`` and ``tree`` only where
        None: a handle or a layout is no record value)."""
        head, emit, feed = self.head, self.emit, self.feed
        fields = {"model": self.model, "device": self.device, "layers": list(self.layers),
                  "n_tokens": self.n_tokens, "batch": self.batch, "context": self.context,
                  "head": head and head.kind, "emit": emit and emit.name,
                  "top_k": emit.k if isinstance(emit, TopK) else 1, "branch": int(self.branch),
                  "inputs": None, "collectives": self.collectives,
                  "label": self.label, "head_tokens": head and head.tokens,
                  "tree": None,
                  "alternatives": emit.alternatives if isinstance(emit, Sample) else ALTERNATIVES,
                  "corrections": feed.corrections, "catch_up": feed.catch_up,
                  "sequences": None if feed.sequences is None else list(feed.sequences)}
        if feed.inputs is not None:
            del fields["inputs"]
        if self.tree is not None:
            del fields["tree"]
        return fields
