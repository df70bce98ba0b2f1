"""The software stack: what the framework costs on top of the hardware, and the
formulas that price it (``host_s``, ``overlapped``, ``extra_expert_bytes``: the
stack's fields read by the terms they set, beside their definitions).

A platform says what the hardware does (peak FLOP/s, bandwidth, the kernel
launch a fitted profile already holds); a stack says what the serving
framework adds to every operation it runs on that hardware: Hugging Face
transformers in eager mode pays Python and dispatch time per layer and a host
sync each time it reads a token back; a torch.compile / CUDA-graph stack pays
almost nothing beyond the device. hardware x model x stack -> cost.

Like a platform, a stack is a YAML file (``hwprofiles/data/stacks/NAME.yaml``
or a user's path), validated by a frozen model with no unknown fields, units in
field names and a source for every number it sets. Every field's default adds
nothing, so the ``compiled`` stack (all defaults) leaves the cost model exactly
as the shipped GPU profiles were fitted: those fits already hold a compiled
stack's costs in the devices' ``launch_overhead_s``.

Fields (``simcore.costmodel`` and ``simcore.engine`` charge them):

- ``layer_host_s`` (s per kernel the cost model counts: one per decoder layer,
  one per head): host time dispatching a layer's kernels, added to the device's
  ``launch_overhead_s``.
- ``call_host_s`` (s per Forward): host time of one model call (input
  preparation, module calls, output objects), added to ``call_overhead_s``.
- ``head_sync_s`` (s per Forward with a head): the host waits for the logits
  and reads back the result (sampling, argmax, top-k): a device-to-host sync,
  always after the pass.
- ``sequence_host_s`` (s per sequence per Forward with a head): what a serving
  engine does on the host for each sequence of the batch every step (scheduling
  it, preparing its inputs and block table, sampling and detokenising its
  token), after the pass like the sync: the batch-dependent host work of a
  serving step.
- ``host_device_exponent`` (p): how a pass's host dispatch time (the layer,
  call and expert terms) and the device's time combine. None: they add (the
  host issues each kernel only once the one before it ran). p >= 1:
  (host^p + device^p)^(1/p), the roofline's own form: launches are
  asynchronous, so the host queues kernels while the device runs earlier ones
  and a pass takes about the longer of the two (p large: their max; p = 1:
  their sum; between: the partial overlap of a host that is sometimes ahead,
  sometimes behind).
- ``scoring``: how the engine runs a pass that scores several positions per
  sequence (a verify: a pass with a head over n_tokens > 1 positions of each of
  B sequences). ``multi_query`` (the default): one pass of B sequences with
  n_tokens query positions each, every sequence's cached positions read once.
  ``batch_expansion``: the engine expands each sequence into n_tokens sequences
  of one query position each and runs those B x n_tokens sequences as a decode
  step (vLLM's first speculative path, ``vllm/spec_decode/batch_expansion.py``,
  ``BatchExpansionTop1Scorer``): the same rows, but each expanded sequence reads
  its own copy of the context (the KV bytes count n_tokens times, at the
  context the expanded sequences hold on average) and pays the engine's
  per-sequence host time (``sequence_host_s``) n_tokens times.
- ``topk_step_host_s`` (s per draft pass that keeps the top k > 1 candidates of
  each row: a tree's drafting step): what an engine does beyond the pass to grow a
  tree by one level (selecting each row's top k, scoring and pruning the paths,
  building the next step's positions and mask), charged on the pass's devices after
  it; a chain's step (k = 1) pays none.
- ``verify_host_s`` (s per Verify): verification bookkeeping on the host after
  the target's pass: comparing proposals, counting accepted tokens, cropping
  the KV caches past them; it holds the schedule, not a device.
- ``attention_context_factor`` (x): the context-dependent FLOPs and bytes of a
  pass (attention over the cached positions) times this; an eager attention
  that materialises the score matrix and re-reads it for the softmax and the
  mask makes more than one pass over it (1: one fused pass).
- ``moe_mode``: how a mixture-of-experts layer runs. ``grouped`` (one grouped
  GEMM; each expert's weights read once per pass, only the experts some
  position routes to); ``dense`` (every expert's weights read every pass,
  whatever the routing: a looped implementation that runs each expert on all
  positions and masks, or a fused kernel over the whole expert tensor).
- ``expert_host_s`` (s per expert per MoE layer): host time per expert a pass
  runs (a looped implementation dispatches each expert's kernels from Python).
- ``allreduce_bandwidth_factor`` (0 < f <= 1): the fraction of a collective
  group's all-reduce bandwidth (the platform's, measured as nccl-tests' bus
  bandwidth on large messages) that the all-reduces inside the engine's
  tensor-parallel passes reach: each pass's all-reduces move their bytes at
  f x the group's bandwidth (their latency part is the group's own). It holds
  what a collective between two GEMMs pays and a collective benchmark does not:
  messages of a few MB (a row's hidden state per layer), the ranks waiting for
  the slowest before each one, the engine's own all-reduce kernels. 1: the
  group's figure (no engine's cost added).
- ``devices_overlap``: False when one host thread drives every device and waits
  on each (eager, one stream): passes on different devices then run one after
  another, so draft work never hides under the target's.
- ``backends``: host terms that differ by the compute API a framework drives
  the device through (a device's ``backend``: ``cuda``, ``metal``, ...): one
  framework's per-layer host time on CUDA need not be its time on Metal. Each
  entry sets some of ``layer_host_s``, ``call_host_s``, ``head_sync_s`` and
  ``host_device_exponent`` (with their sources); a device whose backend has no
  entry, or has none, takes the stack's own values (``Stack.on``).
- ``fitted_on``: the published sources (file stems under
  ``hwprofiles/data/published/``, or row-id prefixes) the stack's numbers were
  fitted to; the others of the same stack are its held-out check.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hwprofiles.models import ModelSpec
from hwprofiles.numbers import Sourced

MAX_HOST_S = 1.0  # no framework spends a second of host time per layer or call
DEFAULT_STACK = "compiled"


class BackendHost(Sourced):
    """The host terms a stack sets apart for one backend (module docstring);
    None keeps the stack's own value."""

    layer_host_s: float | None = Field(default=None, ge=0, le=MAX_HOST_S)
    call_host_s: float | None = Field(default=None, ge=0, le=MAX_HOST_S)
    head_sync_s: float | None = Field(default=None, ge=0, le=MAX_HOST_S)
    host_device_exponent: float | None = Field(default=None, ge=1.0, le=100.0)


class Stack(Sourced):
    """A software stack's costs on top of the hardware (module docstring)."""

    name: str = Field(min_length=1)
    description: str = ""
    layer_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    call_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    head_sync_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    sequence_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    verify_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    topk_step_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    scoring: Literal["multi_query", "batch_expansion"] = "multi_query"
    host_device_exponent: float | None = Field(default=None, ge=1.0, le=100.0)
    attention_context_factor: float = Field(default=1.0, ge=1.0, le=100.0)
    moe_mode: Literal["grouped", "dense"] = "grouped"
    expert_host_s: float = Field(default=0.0, ge=0, le=MAX_HOST_S)
    allreduce_bandwidth_factor: float = Field(default=1.0, gt=0, le=1.0)
    devices_overlap: bool = True
    backends: dict[str, BackendHost] = Field(default_factory=dict)
    fitted_on: tuple[str, ...] = ()

    @property
    def adds_nothing(self) -> bool:
        """True when every cost is at its default (the compiled stack)."""
        return all(getattr(self, name) == field.get_default(call_default_factory=True)
                   for name, field in type(self).model_fields.items()
                   if name not in ("name", "description", "sources", "fitted_on"))

    def on(self, backend: str | None) -> "Stack":
        """The stack as it runs on a device of ``backend`` (its entry in
        ``backends`` replaces the host terms it sets; no entry: the stack itself)."""
        entry = self.backends.get(backend) if backend is not None else None
        if entry is None:
            return self
        update = {name: value for name in entry.model_fields_set - {"sources"}
                  if (value := getattr(entry, name)) is not None}
        return self.model_copy(update=update) if update else self


COMPILED = Stack(name=DEFAULT_STACK)


# What a stack adds to a Forward's cost, read by ``simcore.costmodel`` and
# ``simcore.engine``. The roofline prices what the hardware does; a stack adds the
# framework's host time and changes what a pass reads:
#
#     dispatch  kernels * layer_host_s + call_host_s
#               + n_layers * experts_run * expert_host_s   (a mixture of experts)
#     sync      head_sync_s + batch * sequence_host_s  (a pass with a head)
#     pass      device + dispatch + sync            (host_device_exponent None)
#               (dispatch^p + device^p)^(1/p) + sync  (p: asynchronous launches)
#     context   flops_ctx, bytes_ctx * attention_context_factor
#     scoring   batch_expansion: a pass with a head over n > 1 positions of B
#               sequences runs as n*B sequences of one position at context + (n-1)//2
#     tree step  a draft pass emitting top k > 1: + topk_step_host_s on its devices
#     all-reduce  a tensor-parallel pass's all-reduces: the group's alpha part, and
#               its bytes at allreduce_bandwidth_factor x its bandwidth
#     experts   grouped: the distinct experts the rows touch (the model's own
#               expectation); dense: every expert, every pass
#
# ``experts_run`` is every expert for a ``dense`` stack and the distinct experts
# the rows touch otherwise. Each term's default is 0 or 1, so the ``compiled``
# stack leaves every cost bit for bit as it was (x + 0.0 and x * 1.0 are exact).


def scored_shape(stack: Stack, n_tokens: int, batch: int, context: int, head: str | None,
                 head_tokens: int | None) -> tuple[int, int, int]:
    """(n_tokens, batch, context) of the pass the engine runs for a Forward of
    ``n_tokens`` positions over ``batch`` sequences: itself, or under a
    ``batch_expansion`` stack a scoring pass (a head on every one of several
    positions) as ``batch * n_tokens`` sequences of one position each, whose
    contexts run from ``context`` to ``context + n_tokens - 1`` (their mean,
    rounded down, stands for them; the module docstring)."""
    if (stack.scoring != "batch_expansion" or head is None or n_tokens == 1
            or head_tokens is not None):
        return n_tokens, batch, context
    return 1, batch * n_tokens, context + (n_tokens - 1) // 2


def experts_run(stack: Stack, spec: ModelSpec, rows: int) -> float:
    """Routed experts a pass of ``rows`` positions runs per layer under the stack."""
    if not spec.is_moe:
        return 0.0
    return float(spec.n_experts) if stack.moe_mode == "dense" else spec.expected_experts(rows)


def host_s(stack: Stack, spec: ModelSpec, n_layers: int, kernels: int, rows: int,
           head: str | None, batch: int = 1) -> tuple[float, float]:
    """(dispatch_s, sync_s): the host seconds the stack adds to one Forward over
    ``batch`` sequences (``rows`` positions in all; module docstring)."""
    dispatch = kernels * stack.layer_host_s + stack.call_host_s
    if spec.is_moe and stack.expert_host_s:
        dispatch += n_layers * experts_run(stack, spec, rows) * stack.expert_host_s
    if head is None:
        return dispatch, 0.0
    return dispatch, stack.head_sync_s + batch * stack.sequence_host_s


def overlapped(dispatch_s: float, device_s: float, exponent: float) -> float:
    """The host's dispatch and the device's time of a pass whose launches are
    asynchronous: (d^p + D^p)^(1/p)."""
    longer = max(dispatch_s, device_s)
    if longer <= 0:
        return 0.0
    return longer * ((dispatch_s / longer) ** exponent
                     + (device_s / longer) ** exponent) ** (1.0 / exponent)


def extra_expert_bytes(stack: Stack, spec: ModelSpec, n_layers: int, rows: int) -> float:
    """Weight bytes a dense-MoE stack reads beyond the experts the rows touch."""
    if not spec.is_moe or stack.moe_mode != "dense":
        return 0.0
    untouched = spec.n_experts - spec.expected_experts(rows)
    return n_layers * untouched * spec.expert_params * spec.weight_elem_bytes
