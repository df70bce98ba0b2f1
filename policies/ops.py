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


@dataclass(frozen=True, slots=True)
class Forward:
    """Run decoder layers ``[start, stop)`` of a model over new positions.

    ``n_tokens`` new positions per row attend to ``context`` cached positions.
    On a group the runtime shards the work tensor-parallel; ``collectives`` is
    the number of all-reduces that sharding costs (None: Megatron's two per
    layer). ``head`` applies the final norm and LM head ("lm") or an early-exit
    head after the layers: "exit" (a norm and a vocabulary projection) or
    "exit_layer" (one decoder layer of its own before them). ``emit`` says what the executor produces
    from the head: "sample" appends one token per row to speculation
    ``branch``; "topk" returns the top-``k`` candidates; None returns logits.
    ``inputs`` is the handle of the Forward whose hidden states feed this one.
    ``head_tokens``: positions per row the head projects (e.g. 1 for a top-k
    taken at each row's last position); None: all ``n_tokens``.
    """

    model: str
    device: str
    layers: tuple[int, int]
    n_tokens: int = 1
    batch: int = 1
    context: int = 0
    head: str | None = None
    emit: str | None = None
    k: int = 1
    branch: int = 0
    inputs: Any = None
    collectives: int | None = None
    label: str = ""
    head_tokens: int | None = None


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
    (flash) into its memory, ``nbytes`` in all."""

    device: str
    model: str
    layers: tuple[int, int]
    nbytes: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class Verify:
    """Decide how many of ``gamma`` proposed tokens each row accepts.

    The target's logits come from the Forward whose handle is ``target``; the
    proposal is speculation ``branch``. Accepted tokens plus one bonus token
    (the target's own next token) are committed, and caches roll back past
    them. ``gamma=0`` is plain autoregressive sampling of one token.
    What the simulator models of the verdict beyond the run's acceptance model
    (a modelled mean, a scaled acceptance) is no field here: it is the schedule's
    ``VerifyModel`` for this ``label`` (``policies.modelled``).
    ``bonus=False``: the target's logits cover only the proposed positions (a
    pipeline verifying each token as it leaves): a row commits its accepted
    tokens plus the target's correction if it rejected one, and no bonus token.
    ``row_gamma`` (one int per row, each in [0, gamma]) gives rows proposals of
    different lengths: row r verifies the first ``row_gamma[r]`` tokens of its
    proposal in speculation ``branch``, and a row with 0 has no proposal and
    commits exactly the target's token at its first position (an AR step for
    that row). The target Forward still scored gamma+1 positions for every row
    (padding); None: every row proposes ``gamma``.
    """

    gamma: int
    batch: int = 1
    target: Any = None
    branch: int = 0
    label: str = ""
    bonus: bool = True
    row_gamma: tuple[int, ...] | None = None


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
class Outcome:
    """A yes/no event of the schedule (cache hit, branch reuse, top-k hit).

    The executor observes the event in the real models; the simulator draws it
    with the chance p of the schedule's ``EventModel`` for ``event``
    (``policies.modelled``). By default the answer is one ``bool``: the event
    held for every one of ``batch`` rows (modelled chance ``p ** batch``).
    ``per_row=True`` asks each row separately: the answer is a tuple of
    ``batch`` bools, row r's True with chance p independently of the others (in
    deterministic simulation each row keeps its own error-diffusion credit).
    """

    event: str
    batch: int = 1
    label: str = ""
    per_row: bool = False


@dataclass(frozen=True, slots=True)
class Delay:
    """Occupy ``device`` (or nothing, when None) for a fixed time."""

    seconds: float
    device: str | None = None
    label: str = ""


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
