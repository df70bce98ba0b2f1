"""A schedule's dry run: what each role runs where, asked of the schedule itself.

A policy is a plain generator, so running it with stand-in results (no runtime,
no clock) for its first steps shows what it touches: per (device role, model),
the layers its Forwards run, the heads they apply, the positions and rows of
its widest pass, the sharding of its first pass, and the weight chunks it
streams from storage. Every user of that knowledge asks this one dry run:

  * the prologue (``policies.prefill``) prefills each segment's KV cache;
  * the executor (``executors.coordinate.footprint``) loads the weights and
    caches each role needs;
  * the memory check (``analyses.run.memory``) sizes the weights, caches and
    activations each role holds;
  * the work budget (``analyses.run.budget``) counts what one decoding step
    yields (``StepWork``).

A schedule named with its parameters and models is dry-run once and kept
(``held``): a capacity search asks at every batch it tries.

So a new schedule gets its prefill, its executor footprint, its memory check and
its work budget from its own operations, with no name table elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwprofiles.models import ModelSpec
from policies.base import PolicyContext, build, parse_params
from policies.ops import (MAIN, Fanout, Forward, Join, Lookup, Outcome, Parallel, Spawn,
                          StreamWeights, Verdict, Verify, drive, widest_lookup)

DRY_STEPS = 3  # decoding steps the dry run follows: every cache is in use by then
# Operations answered at most: more than one step of any schedule yields (the
# work budget counts the widest step): a 1,000-layer model, the deepest a profile
# may hold, streamed a layer at a time (ar_stream) yields 3,998 a step.
DRY_OPS = 5000
DRY_TOKENS = 1024  # tokens a named schedule is asked for: none of its steps is its last
EXIT_LAYER_HEAD = "exit_layer"  # an early-exit head with a decoder layer of its own
EXIT_HEADS = ("exit", EXIT_LAYER_HEAD)  # early-exit heads (Head.kind)


@dataclass
class Segment:
    """Layers ``[start, stop)`` of ``model`` on ``device`` that the schedule runs
    (and whose KV cache needs the prompt); ``streamed``: the weight chunks that
    stream from storage, in load order; ``slots``: chunks loaded before the first
    streamed pass; ``heads``: the heads its Forwards apply (``Head.kind``);
    ``positions``: positions per row of its widest pass; ``rows``: rows per
    sequence of its widest pass (above 1 for speculation trees)."""

    device: str
    model: str
    start: int
    stop: int
    collectives: int | None = None
    streamed: list[tuple[int, int]] = field(default_factory=list)
    slots: int = 0
    heads: set[str] = field(default_factory=set)
    positions: int = 0
    rows: int = 1


@dataclass
class StepWork:
    """What one decoding step of a schedule yields, at its most over the dry run's
    steps: ``ops``, the operations it yields (a Spawn's or Parallel's branches'
    included; a step ends at its Verify); ``tree``, whether a Forward lays out a
    speculation tree (``Forward.tree``: a runtime walks each of its rows per
    operation); ``groups``, the groups of rows the step's tree passes that catch
    up lay out (a ``Fanout`` one per accepted count it guesses, any other layout
    one: the cache book walks each row once per group there); ``nodes``,
    positions per row of the widest pass on a speculation branch other than the
    narrow one (a token tree's nodes and root; 0: none)."""

    ops: int = 0
    tree: bool = False
    groups: int = 0
    nodes: int = 0

    def most(self, other: StepWork) -> StepWork:
        """Each quantity at its larger of the two."""
        return StepWork(max(self.ops, other.ops), self.tree or other.tree,
                        max(self.groups, other.groups), max(self.nodes, other.nodes))


@dataclass
class Answer:
    """What a schedule runs where: ``segments`` with layers, in the order it first
    uses them; ``heads_only``: (device, model) pairs that apply a head without
    layers (PPSD's exit head), with their heads; ``deepest``: {(device, model,
    rows per sequence): deepest layer stop}; ``buffer_layers``: the largest
    buffer a StreamWeights asks (None: nothing streams); ``step``: what one
    decoding step yields (the accepting run's too)."""

    segments: list[Segment]
    heads_only: dict[tuple[str, str], set[str]]
    deepest: dict[tuple[str, str, int], int]
    buffer_layers: int | None
    step: StepWork = field(default_factory=StepWork)

    def models(self) -> set[str]:
        """The model roles the schedule runs."""
        return {s.model for s in self.segments} | {m for _, m in self.heads_only}


class _Stop(Exception):
    pass


class _DryRun:
    """Answers a schedule's operations with stand-ins and notes what it runs."""

    def __init__(self, batch: int, accepted: bool = False):
        self.batch, self.accepted = max(1, batch), accepted
        self.segments: dict[tuple[str, str], Segment] = {}
        self.loads: dict[tuple[str, str], int] = {}  # StreamWeights seen per segment
        self.computed: set[tuple[str, str]] = set()  # segments a Forward ran
        self.heads_only: dict[tuple[str, str], set[str]] = {}
        self.deepest: dict[tuple[str, str, int], int] = {}
        self.buffer_layers: int | None = None
        self.ops, self.verifies = DRY_OPS, DRY_STEPS
        self.step = StepWork()  # the most a step yields
        self.step_ops = self.step_groups = 0  # this step's operations and tree groups

    def run(self, schedule) -> Answer:
        try:
            drive(schedule, self.answer)
        except _Stop:
            pass
        self._end_step()  # the step cut short counts with what it yielded so far
        return Answer(list(self.segments.values()), self.heads_only, self.deepest,
                      self.buffer_layers, self.step)

    def _end_step(self) -> None:
        self.step.ops, self.step_ops = max(self.step.ops, self.step_ops), 0
        self.step.groups, self.step_groups = max(self.step.groups, self.step_groups), 0

    def answer(self, op):
        self.ops -= 1
        if self.ops <= 0:
            raise _Stop
        self.step_ops += 1
        if isinstance(op, Forward):
            self._forward(op)
            return object()
        if isinstance(op, StreamWeights):
            self._stream(op)
            return None
        if isinstance(op, Verify):
            self.verifies -= 1
            if self.verifies < 0:
                raise _Stop
            self._end_step()
            return Verdict((op.gamma if self.accepted else 0,) * op.batch)
        if isinstance(op, Outcome):
            return (False,) * op.batch if op.per_row else False
        if isinstance(op, Lookup):  # the widest pass a lookup can lead to
            return widest_lookup(op)
        if isinstance(op, Spawn):
            return drive(op.branch, self.answer)
        if isinstance(op, Join):
            return tuple(op.tasks)
        if isinstance(op, Parallel):
            return tuple(drive(b, self.answer) for b in op.branches)
        return getattr(op, "payload", None)

    def _forward(self, op: Forward) -> None:
        if op.tree is not None:
            self.step.tree = True
            if op.feed.catch_up:
                self.step_groups += (sum(f > 0 for f in op.tree.per_accepted)
                                     if isinstance(op.tree, Fanout) else 1)
        if op.branch != MAIN:
            self.step.nodes = max(self.step.nodes, op.n_tokens)
        start, stop = op.layers
        rows = max(1, op.batch // self.batch)
        wide = (op.device, op.model, rows)
        self.deepest[wide] = max(self.deepest.get(wide, 0), stop)
        key = (op.device, op.model)
        if start >= stop:  # a head alone (PPSD's exit head): no cache of its own
            if op.head is not None:
                self.heads_only.setdefault(key, set()).add(op.head.kind)
            return
        seg = self.segments.setdefault(key, Segment(op.device, op.model, start, stop))
        if key not in self.computed:  # the sharding of the segment's first pass
            self.computed.add(key)
            seg.collectives = op.collectives
        seg.start, seg.stop = min(seg.start, start), max(seg.stop, stop)
        seg.positions, seg.rows = max(seg.positions, op.n_tokens), max(seg.rows, rows)
        if op.head is not None:
            seg.heads.add(op.head.kind)
        if seg.streamed and not seg.slots and any(a < stop and start < b
                                                   for a, b in seg.streamed):
            seg.slots = self.loads[key]

    def _stream(self, op: StreamWeights) -> None:
        key = (op.device, op.model)
        seg = self.segments.setdefault(key, Segment(op.device, op.model, *op.layers))
        if op.layers not in seg.streamed:
            seg.streamed.append(op.layers)
        self.loads[key] = self.loads.get(key, 0) + 1
        self.buffer_layers = max(self.buffer_layers or 1, op.buffer_layers)


def dry_run(schedule, batch: int = 1, accepting=None) -> Answer:
    """What ``schedule`` (a fresh decoding generator of ``batch`` sequences, only
    dry-run here) runs where over its first ``DRY_STEPS`` steps, every proposal
    rejected. ``accepting``: a second fresh generator of the same schedule, run
    with every proposal accepted, whose heads and widest passes are added (a head
    a schedule runs only after an acceptance, PPSD's exit head, shows there);
    its layers are not (the prefill and the executor's footprint stay those of
    the first run)."""
    answer = _DryRun(batch).run(schedule)
    if accepting is not None:
        more = _DryRun(batch, accepted=True).run(accepting)
        _add_heads(answer, more)
        answer.step = answer.step.most(more.step)
    return answer


def _add_heads(answer: Answer, more: Answer) -> None:
    known = {(s.device, s.model): s for s in answer.segments}
    for seg in more.segments:
        if (seg.device, seg.model) in known:
            mine = known[(seg.device, seg.model)]
            mine.heads |= seg.heads
            mine.positions, mine.rows = (max(mine.positions, seg.positions),
                                         max(mine.rows, seg.rows))
    for key, heads in more.heads_only.items():
        answer.heads_only.setdefault(key, set()).update(heads)


# A schedule asked by name (the memory check, the work budget) ----------------
_ANSWERS: dict[tuple, Answer] = {}
_CACHED = 256  # dry runs kept


def _answer(policy: str, params, target: ModelSpec, draft: ModelSpec | None,
            prompt_tokens: int) -> Answer:
    key = (policy, params, target.model_dump_json(),
           draft and draft.model_dump_json(), prompt_tokens)
    if key not in _ANSWERS:
        if len(_ANSWERS) >= _CACHED:
            _ANSWERS.clear()
        ctx = PolicyContext(target=target, draft=draft, tokens=DRY_TOKENS,
                            prompt_tokens=prompt_tokens)
        _ANSWERS[key] = dry_run(build(policy, ctx, params),
                                accepting=build(policy, ctx, params))
    return _ANSWERS[key]


def held(policy: str, params, models: dict[str, ModelSpec], prompt_tokens: int) -> Answer:
    """Schedule ``policy``'s dry run on these models: what each role runs where.
    Cached: a capacity search asks it at every batch it tries."""
    if params is None or isinstance(params, dict):
        params = parse_params(policy, params or {})
    return _answer(policy, params, models["target"], models.get("draft"), prompt_tokens)


def uses_draft(policy: str, params, models: dict[str, ModelSpec]) -> bool:
    """Whether the schedule runs a separate draft model (its dry run shows a
    Forward of the draft), rather than its target's own layers or no draft."""
    return "draft" in held(policy, params, models, 0).models()
