"""What a software stack (``hwprofiles.stacks.Stack``) adds to a Forward's cost.

The roofline (``simcore.costmodel``) prices what the hardware does; a stack
adds the framework's host time and changes what a pass reads:

    host      kernels * layer_host_s + call_host_s
              + head_sync_s                       (a pass with a head)
              + n_layers * experts_run * expert_host_s   (a mixture of experts)
    context   flops_ctx, bytes_ctx * attention_context_factor
    experts   grouped: the distinct experts the rows touch (the model's own
              expectation); dense: every expert, every pass

``experts_run`` is every expert for a ``dense`` stack and the distinct experts
the rows touch otherwise. Each term's default is 0 or 1, so the ``compiled``
stack leaves every cost bit for bit as it was (x + 0.0 and x * 1.0 are exact).
"""

from __future__ import annotations

from hwprofiles.schema import ModelSpec
from hwprofiles.stacks import Stack


def experts_run(stack: Stack, spec: ModelSpec, rows: int) -> float:
    """Routed experts a pass of ``rows`` positions runs per layer under the stack."""
    if not spec.is_moe:
        return 0.0
    return float(spec.n_experts) if stack.moe_mode == "dense" else spec.expected_experts(rows)


def host_s(stack: Stack, spec: ModelSpec, n_layers: int, kernels: int, rows: int,
           head: str | None) -> float:
    """Host seconds the stack adds to one Forward (module docstring)."""
    seconds = kernels * stack.layer_host_s + stack.call_host_s
    if head is not None:
        seconds += stack.head_sync_s
    if spec.is_moe and stack.expert_host_s:
        seconds += n_layers * experts_run(stack, spec, rows) * stack.expert_host_s
    return seconds


def extra_expert_bytes(stack: Stack, spec: ModelSpec, n_layers: int, rows: int) -> float:
    """Weight bytes a dense-MoE stack reads beyond the experts the rows touch."""
    if not spec.is_moe or stack.moe_mode != "dense":
        return 0.0
    untouched = spec.n_experts - spec.expected_experts(rows)
    return n_layers * untouched * spec.expert_params * spec.weight_elem_bytes
