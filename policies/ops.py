"""The operation vocabulary a schedule yields, shared by every runtime.

A policy is a plain generator. It yields these frozen descriptors and receives
each one's result through ``send()``; it never learns whether a discrete-event
simulator or a torch executor interpreted them.

Names of devices in operations are *placement roles* ("target", "draft",
"stage3", ...) or device/group names of the platform; the runtime maps roles
through the platform's ``placement`` (and any user override).

Results:
  * ``Forward``     -> an opaque handle (hidden states / logits in the executor).
  * ``Verify``      -> ``Verdict``.
  * ``Lookup``      -> tuple of ``int``: tokens proposed per row; with
                       ``siblings`` a ``Found``.
  * ``Outcome``     -> ``bool``;
                       with ``per_row`` a tuple of ``bool``, one per row.
  * ``Spawn``       -> an opaque task handle; ``Join`` -> tuple of branch results.
  * ``Parallel``    -> tuple of branch results (spawn all, join all).
  * others          -> ``None``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from policies.forward import (ALTERNATIVES, CATCH_UP, LM, MAIN, OWN, SAMPLE, Branch, Children,
                              Fanout, Feed, Forward, Head, Narrow, Roots, Sample, TopK)

__all__ = ["ALTERNATIVES", "CATCH_UP", "ENTRY_BYTES", "LM", "LOOKUP_MAX_N", "MAIN", "OWN",
           "SAMPLE", "TOKEN_BYTES", "VERDICT_BYTES", "AllReduce", "Branch", "Children",
           "Delay", "Fanout", "Feed", "Forward", "Found", "Head", "Join", "Lookup",
           "Narrow", "OnTree", "Outcome", "Parallel", "Roots", "Sample", "Spawn",
           "StreamWeights", "TopK", "Transfer", "Verdict", "Verify", "drive", "rows_of",
           "widest_lookup"]

# What the messages between roles weigh, per row and token (``Transfer.nbytes``)
TOKEN_BYTES = 4    # a token id (int32)
ENTRY_BYTES = 8    # a token id with its fp32 log-prob
VERDICT_BYTES = 8  # accepted count + the target's token



@dataclass(frozen=True, slots=True)
class Transfer:
    """Send ``nbytes`` from one device to another along the platform's links."""

    src: str
    dst: str
    nbytes: float
    payload: Any = None
    label: str = ""


@dataclass(frozen=True, slots=True)
class AllReduce:
    """``count`` all-reduces of ``nbytes`` each inside a collective group."""

    group: str
    nbytes: float
    count: int = 1
    label: str = ""


@dataclass(frozen=True, slots=True)
class StreamWeights:
    """Read layers ``[start, stop)`` of a model from the device's storage tier
    (flash) into its memory, ``nbytes`` in all. ``buffer_layers``: streamed
    layers the device's buffer holds at once (the schedule's ring of slots);
    a runtime that keeps real weights evicts the oldest beyond it."""

    device: str
    model: str
    layers: tuple[int, int]
    nbytes: float
    label: str = ""
    buffer_layers: int = 1


@dataclass(frozen=True, slots=True)
class Verify:
    """Decide how many of ``gamma`` proposed tokens each row accepts.

    The target's logits come from the Forward whose handle is ``target``; the
    proposal is speculation ``branch``. Accepted tokens plus one bonus token
    (the target's own next token) are committed, and caches roll back past
    them. ``gamma=0`` is plain autoregressive sampling of one token.
    What the simulator models of the verdict beyond the run's acceptance model
    (a modelled mean, a scaled acceptance) is no field here: it is the schedule's
    ``VerifyModel`` for this ``label`` (``policies.base``).
    ``bonus=False``: the target's logits cover only the proposed positions (a
    pipeline verifying each token as it leaves): a row commits its accepted
    tokens plus the target's correction if it rejected one, and no bonus token.
    ``row_gamma`` (one int per row, each in [0, gamma]) gives rows proposals of
    different lengths: row r verifies the first ``row_gamma[r]`` tokens of its
    proposal in speculation ``branch``, and a row with 0 has no proposal and
    commits exactly the target's token at its first position (an AR step for
    that row). The target Forward still scored gamma+1 positions for every row
    (padding); None: every row proposes ``gamma``.
    ``row_labels`` (one label per row): the proposer of each row's proposal when
    rows' proposals come from different proposers (SSD: a cached speculation on
    rows that hit, the backup's on rows that missed); the simulator draws row r's
    verdict with the VerifyModel of ``row_labels[r]``. None: every row is ``label``.
    """

    gamma: int
    batch: int = 1
    target: Any = None
    branch: Branch = MAIN
    label: str = ""
    bonus: bool = True
    row_gamma: tuple[int, ...] | None = None
    row_labels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Accepted draft tokens per row; floats only in deterministic simulation."""

    accepted: tuple[float, ...]
    committed: tuple[float, ...] | None = None  # per row, when not accepted + 1

    @property
    def tokens(self) -> float:
        """Tokens committed over all rows: accepted plus one bonus each."""
        if self.committed is not None:
            return sum(self.committed)
        return sum(self.accepted) + len(self.accepted)


@dataclass(frozen=True, slots=True)
class OnTree:
    """What an Outcome observes: per row, whether the committed sequence (after
    the Verify just done) lies on a row of the speculation tree grown last
    (``Forward.tree``) with tokens beyond it. A row that takes its hit (every row
    by default, its own with ``per_row``) has those tokens as its next proposal,
    the narrow proposal of speculation ``into``; a row that does not has none."""

    into: Branch


@dataclass(frozen=True, slots=True)
class Outcome:
    """A yes/no event of the schedule (cache hit, branch reuse, top-k hit).

    The executor observes the event in the real models; the simulator draws it
    with the chance p of the schedule's ``EventModel`` for ``event``
    (``policies.base``). By default the answer is one ``bool``: the event
    held for every one of ``batch`` rows (modelled chance ``p ** batch``).
    ``per_row=True`` asks each row separately: the answer is a tuple of
    ``batch`` bools, row r's True with chance p independently of the others (in
    deterministic simulation each row keeps its own error-diffusion credit).

    ``observes`` names what the event is in the models (``OnTree``), which is
    how a real runtime decides it; ``event`` names it in traces and records.
    None: an event only a model can draw (a runtime refuses it).
    """

    event: str
    batch: int = 1
    label: str = ""
    per_row: bool = False
    observes: OnTree | None = None


def rows_of(answer, batch: int) -> tuple[bool, ...]:
    """An Outcome's answer as one bool per row (a runtime answers one bool for
    the batch unless the Outcome asked ``per_row``)."""
    return tuple(answer) if isinstance(answer, tuple) else (bool(answer),) * batch


@dataclass(frozen=True, slots=True)
class Delay:
    """Occupy ``device`` (or nothing, when None) for a fixed time.

    ``proposes``: meanwhile a proposer outside the models (SSD's fast backup:
    n-gram lookup, random tokens) appends that many tokens a row to the narrow
    proposal of speculation ``branch``. The executor proposes by prompt lookup
    (``policies.ngram``), up to that many a row (none where nothing matches: its
    Verify then commits the target's token alone).
    ``sequences``: the sequences it proposes for (None: every sequence)."""

    seconds: float
    device: str | None = None
    label: str = ""
    branch: Branch = MAIN
    proposes: int = 0
    sequences: tuple[int, ...] | None = None


LOOKUP_MAX_N = 8  # a Lookup's longest match: past 8 tokens it finds the same runs, slower


@dataclass(frozen=True, slots=True)
class Lookup:
    """Propose up to ``gamma`` tokens per row by prompt lookup (``policies.ngram``):
    the tokens that followed the most recent earlier occurrence of the row's last
    ``n`` tokens (down to ``n_min``, longest first) in its prompt, its output or
    both (``search``), as the narrow proposal of speculation ``branch``. Runs on
    the host CPU beside the target (``device`` None) or on a device the placement
    names. The result is the proposal's length per row (0: no match).

    The executor looks the committed tokens up for real; the simulator charges
    the platform's ``host_lookup_s`` per row and answers the lengths from the
    acceptance trace (what each step proposed) or the schedule's match model.

    ``siblings``: up to that many continuations with distinct first tokens
    (``policies.ngram.siblings``), at most ``nodes`` tokens in all, become a token
    tree on ``branch`` (not 0): each a chain under the root (the last committed
    token), which the branch's next Forward that does not sample scores under a
    tree mask and its Verify walks. The result is then a ``Found``."""

    gamma: int
    batch: int = 1
    n: int = 3
    n_min: int = 1
    search: str = "both"
    branch: Branch = MAIN
    label: str = "lookup"
    device: str | None = None
    siblings: int | None = None
    nodes: int = 0


@dataclass(frozen=True, slots=True)
class Found:
    """What a token-tree ``Lookup`` found, per row: the tree's nodes (tokens in
    all its continuations) and its longest continuation (0: no match)."""

    nodes: tuple[int, ...]
    longest: tuple[int, ...]


def widest_lookup(op: Lookup):
    """The answer to ``op`` that leads to the widest pass: a dry run's."""
    if op.siblings is None:
        return (op.gamma,) * op.batch
    return Found((min(op.siblings * op.gamma, op.nodes),) * op.batch,
                 (min(op.gamma, op.nodes),) * op.batch)


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a sub-schedule (a generator of operations) running concurrently."""

    branch: Generator


@dataclass(frozen=True, slots=True)
class Join:
    """Wait for spawned tasks; returns their results in order."""

    tasks: tuple


@dataclass(frozen=True, slots=True)
class Parallel:
    """Run sub-schedules concurrently and wait for all (fork/join)."""

    branches: tuple[Generator, ...]


def drive(schedule: Generator, answer) -> Any:
    """Run a schedule synchronously, no runtime behind it: each operation it
    yields is answered with ``answer(op)`` (a dry run, a test's stand-in), which
    may drive a Spawn's or Parallel's branches itself. Returns the schedule's
    return value."""
    value = None
    while True:
        try:
            op = schedule.send(value)
        except StopIteration as stop:
            return stop.value
        value = answer(op)
