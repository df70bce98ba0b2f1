"""What a software stack (``hwprofiles.stacks.Stack``) adds to a Forward's cost.

The roofline (``simcore.costmodel``) prices what the hardware does; a stack
adds the framework's host time and changes what a pass reads:

    dispatch  kernels * layer_host_s + call_host_s
              + n_layers * experts_run * expert_host_s   (a mixture of experts)
    sync      head_sync_s                         (a pass with a head)
    pass      device + dispatch + sync            (host_device_exponent None)
              (dispatch^p + device^p)^(1/p) + sync  (p: asynchronous launches)
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
           head: str | None) -> tuple[float, float]:
    """(dispatch_s, sync_s): the host seconds the stack adds to one Forward
    (module docstring)."""
    dispatch = kernels * stack.layer_host_s + stack.call_host_s
    if spec.is_moe and stack.expert_host_s:
        dispatch += n_layers * experts_run(stack, spec, rows) * stack.expert_host_s
    return dispatch, stack.head_sync_s if head is not None else 0.0


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
