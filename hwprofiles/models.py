"""The model spec: a decoder-only transformer's shape, its precision and its
mixture of experts; per-layer parameters, bytes and FLOPs derive from it.

Like every profile object it is frozen, forbids unknown fields and needs a
source for each number a file sets (``hwprofiles.numbers.Sourced``). Sizes lie inside
ranges that published models stay far within: a value beyond them is a typo.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hwprofiles.numbers import Sourced

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
Dtype = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
BITS = (4, 8, 16, 32)  # storage widths of weights and KV cache (--set weight_bits=)
COMPUTE_BITS = (8, 16)  # widths of the matrix products (--set compute_bits=)
Bits = Literal[4, 8, 16, 32]
ComputeBits = Literal[8, 16]

# Ranges of a model's sizes.
MAX_LAYERS = 1000  # the deepest published decoders have a few hundred layers
MAX_WIDTH = 1_000_000  # hidden and head sizes; published models stay below 1e5
MAX_FFN = 10_000_000
MAX_HEADS = 100_000
MAX_VOCAB = 100_000_000  # the largest vocabularies hold about a million tokens
MAX_EXPERTS = 100_000  # published mixtures of experts route among a few hundred
MAX_POSITIONS = 100_000_000  # the longest trained contexts hold a few million tokens


class ModelSpec(Sourced):
    """A decoder-only transformer's shape; per-layer bytes and FLOPs derive from it.

    Mixture of experts (``n_experts`` set): each layer's MLP is ``n_experts``
    routed experts of width ``expert_ffn`` (a router picks ``n_active_experts``
    per token) plus ``n_shared_experts`` every token uses (width
    ``shared_expert_ffn``, default ``expert_ffn``). FLOPs count the active
    experts; the weight bytes a pass reads count the distinct experts its rows
    touch (``layer_weight_bytes_read``).

    Precision: ``weight_bits`` and ``kv_bits`` (None: the width of ``dtype``)
    set the bytes of stored weights and KV cache; compute stays in ``dtype``, so
    FLOPs and peak FLOP/s do not change (``with_precision``). ``compute_bits=8``
    prices the matrix products at the device's 8-bit peak (FP8, or INT8 where the
    device has no FP8: ``simcore.costmodel.compute_peak``); FLOPs stay the same.
    """

    name: str
    n_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden: int = Field(gt=0, le=MAX_WIDTH)
    ffn: int = Field(gt=0, le=MAX_FFN)
    n_heads: int = Field(gt=0, le=MAX_HEADS)
    n_kv_heads: int = Field(gt=0, le=MAX_HEADS)
    head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    vocab: int = Field(gt=0, le=MAX_VOCAB)
    # the positions the model was trained for (config.json: max_position_embeddings):
    # a run's prompt and generated tokens together may not pass it; None: unknown
    max_positions: int | None = Field(default=None, gt=0, le=MAX_POSITIONS)
    dtype: Dtype = "bf16"
    gated_mlp: bool = True
    tied_embeddings: bool = False
    hf_architecture: str = "LlamaForCausalLM"
    # Hugging Face ids that name this model (``--target Qwen/Qwen3-32B``)
    hf_ids: tuple[str, ...] = ()
    n_experts: int | None = Field(default=None, ge=2, le=MAX_EXPERTS)
    n_active_experts: int | None = Field(default=None, ge=1, le=MAX_EXPERTS)
    expert_ffn: int | None = Field(default=None, gt=0, le=MAX_FFN)
    n_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    shared_expert_ffn: int | None = Field(default=None, gt=0, le=MAX_FFN)
    weight_bits: Bits | None = None
    kv_bits: Bits | None = None
    compute_bits: ComputeBits | None = None  # set per run (--set compute_bits=8)
    # trained draft heads: exit heads after the layers in trained_exits, adapters
    # (head "exit_layer") after those in trained_adapters, each projecting onto a
    # draft vocabulary of exit_vocab tokens; an exit elsewhere is the final norm
    # and the whole LM head
    exit_vocab: int | None = Field(default=None, gt=0, le=MAX_VOCAB)
    trained_exits: tuple[int, ...] = ()
    trained_adapters: tuple[int, ...] = ()
    # the head a Forward's "lm" head runs on this model: its LM head, or, for a
    # self-draft made of a target's first layers, the target's head at that exit
    own_head: Literal["lm", "exit", "exit_layer"] = "lm"
    # set per run (``--set expert_parallel=on``): the routed experts are sharded
    # whole over a group's members instead of tensor-parallel (CollectiveGroup.alltoall_s)
    expert_parallel: bool = False

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of "
                             f"n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None and self.hidden % self.n_heads:
            # without head_dim each head is hidden / n_heads wide (as transformers
            # derives it); a remainder would be dropped from every attention cost
            raise ValueError(f"hidden ({self.hidden}) is not a multiple of n_heads "
                             f"({self.n_heads}); give head_dim, the width of one head")
        return self

    @model_validator(mode="after")
    def _exit_heads_fit(self):
        if self.exit_vocab is not None and self.exit_vocab > self.vocab:
            raise ValueError(f"exit_vocab ({self.exit_vocab}) exceeds vocab "
                             f"({self.vocab}); a draft vocabulary is part of the model's")
        for key in ("trained_exits", "trained_adapters"):
            layers = getattr(self, key)
            if layers and self.exit_vocab is None:
                raise ValueError(f"{key} needs exit_vocab, the draft vocabulary their "
                                 "heads project onto")
            if any(e < 1 for e in layers):
                raise ValueError(f"{key} {list(layers)} must be layer counts of at "
                                 "least 1 (an exit after that many layers)")
        return self

    @model_validator(mode="after")
    def _experts_complete(self):
        moe = {"n_experts": self.n_experts, "n_active_experts": self.n_active_experts,
               "expert_ffn": self.expert_ffn}
        given = [k for k, v in moe.items() if v is not None]
        if given and len(given) < len(moe):
            missing = sorted(set(moe) - set(given))[0]
            raise ValueError(f"a mixture-of-experts model sets n_experts, "
                             f"n_active_experts and expert_ffn together; add {missing}")
        if given and self.n_active_experts > self.n_experts:
            raise ValueError(f"n_active_experts ({self.n_active_experts}) exceeds "
                             f"n_experts ({self.n_experts}); a token picks among them")
        if not given and (self.n_shared_experts or self.expert_parallel):
            raise ValueError("n_shared_experts and expert_parallel need a mixture-of-"
                             "experts model; set n_experts, n_active_experts and expert_ffn")
        return self

    # widths ---------------------------------------------------------------
    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def dtype_bytes(self) -> float:
        """Bytes of one activation element (compute precision: 8-bit under
        ``compute_bits=8``, whose matrix products take 8-bit inputs)."""
        return self.compute_bits / 8 if self.compute_bits else DTYPE_BYTES[self.dtype]

    @property
    def weight_elem_bytes(self) -> float:
        return self.weight_bits / 8 if self.weight_bits else DTYPE_BYTES[self.dtype]

    @property
    def kv_elem_bytes(self) -> float:
        return self.kv_bits / 8 if self.kv_bits else DTYPE_BYTES[self.dtype]

    def with_precision(self, weight_bits: int | None = None,
                       kv_bits: int | None = None,
                       compute_bits: int | None = None) -> "ModelSpec":
        """This model with weights and/or KV cache stored at other widths, and its
        matrix products at ``compute_bits``."""
        update = {k: v for k, v in (("weight_bits", weight_bits), ("kv_bits", kv_bits),
                                    ("compute_bits", compute_bits)) if v is not None}
        for key, bits in update.items():
            widths = COMPUTE_BITS if key == "compute_bits" else BITS
            if bits not in widths:
                raise ValueError(f"{key} is {bits}; choose one of "
                                 f"{', '.join(map(str, widths))}")
        return self.model_copy(update=update) if update else self

    @property
    def cost_key(self) -> tuple:
        """What tells this model's costs from another's of the same name: a run's
        precision, expert sharding and heads (a cost cache keys on it)."""
        return (self.name, self.weight_bits, self.kv_bits, self.expert_parallel,
                self.compute_bits, *self.heads)

    @property
    def heads(self) -> tuple:
        """What it says of the heads a run of it uses: its own head and its trained
        draft heads (``own_head``, ``exit_vocab``, ``trained_exits``,
        ``trained_adapters``)."""
        return (self.own_head, self.exit_vocab, self.trained_exits, self.trained_adapters)

    # parameters -----------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts is not None

    @property
    def mlp_width(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (0 for a dense model)."""
        return self.mlp_width * self.hidden * self.expert_ffn if self.is_moe else 0

    @property
    def attention_params(self) -> int:
        hd = self.dim_per_head
        return self.hidden * self.n_heads * hd * 2 + self.hidden * self.n_kv_heads * hd * 2

    @property
    def layer_fixed_params(self) -> int:
        """Parameters of one layer every token uses: attention, two norms, and the
        dense MLP, or the router and the shared experts."""
        if not self.is_moe:
            mlp = self.mlp_width * self.hidden * self.ffn
        else:
            shared_ffn = self.shared_expert_ffn or self.expert_ffn
            mlp = (self.hidden * self.n_experts
                   + self.n_shared_experts * self.mlp_width * self.hidden * shared_ffn)
        return self.attention_params + mlp + 2 * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, MLP or every expert, norms)."""
        routed = self.n_experts * self.expert_params if self.is_moe else 0
        return self.layer_fixed_params + routed

    @property
    def layer_active_params(self) -> int:
        """Parameters one token computes with in a layer (its active experts)."""
        routed = self.n_active_experts * self.expert_params if self.is_moe else 0
        return self.layer_fixed_params + routed

    @property
    def head_params(self) -> int:
        """Final norm plus LM head."""
        return self.hidden * self.vocab + self.hidden

    def head_kind(self, kind: str) -> str:
        """The head a Forward's ``kind`` runs on this model: "lm" is its own head."""
        return self.own_head if kind == "lm" else kind

    def projection_params(self, kind: str, exit_layer: int) -> int:
        """Parameters of the projection head ``kind`` ("lm", "exit", or "exit_layer":
        an exit head after a layer of its own) runs after layer ``exit_layer``: the
        final norm and LM head, or, at an exit with a trained head of that kind
        (``trained_exits``, ``trained_adapters``), its norm and hidden x hidden
        projection onto the LM head's rows of the draft vocabulary (a copy, as the
        executor keeps it)."""
        kind = self.head_kind(kind)
        trained = {"exit": self.trained_exits, "exit_layer": self.trained_adapters}
        if exit_layer in trained.get(kind, ()):
            return self.hidden * (self.hidden + self.exit_vocab) + self.hidden
        return self.head_params

    @property
    def embed_params(self) -> int:
        """The input embedding, stored once with the LM head when they are tied."""
        return 0 if self.tied_embeddings else self.hidden * self.vocab

    @property
    def total_params(self) -> int:
        return self.n_layers * self.layer_params + self.head_params + self.embed_params

    # bytes ----------------------------------------------------------------
    @property
    def layer_bytes(self) -> float:
        """Bytes one layer keeps in memory (every expert)."""
        return self.layer_params * self.weight_elem_bytes

    @property
    def head_bytes(self) -> float:
        return self.head_params * self.weight_elem_bytes

    def projection_bytes(self, kind: str, exit_layer: int) -> float:
        """Weight bytes head ``kind`` reads after layer ``exit_layer``."""
        return self.projection_params(kind, exit_layer) * self.weight_elem_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_elem_bytes

    def expected_experts(self, rows: int) -> float:
        """Expected distinct routed experts ``rows`` tokens touch, each picking k of
        E uniformly: E (1 - (1 - k/E)^rows)."""
        if not self.is_moe:
            return 0.0
        e, k = self.n_experts, self.n_active_experts
        return e * (1.0 - (1.0 - k / e) ** max(rows, 0))

    def layer_weight_bytes_read(self, rows: int) -> float:
        """Weight bytes one pass of ``rows`` token positions reads in a layer: the
        whole layer for a dense model; for a mixture of experts the shared part
        plus the distinct experts the rows are routed to."""
        if not self.is_moe:
            return self.layer_bytes
        params = self.layer_fixed_params + self.expected_experts(rows) * self.expert_params
        return params * self.weight_elem_bytes

    def dispatch_bytes(self, rows: int, group_size: int) -> float:
        """Bytes one member of a group of ``group_size`` sends in one dispatch (or
        combine) of a layer under expert parallelism (``expert_parallel``):
        attention stays tensor-parallel while the routed experts sit whole, E/G
        per member; each member owns rows/G of the tokens and sends each token's
        k expert copies to the member holding that expert. Routing is uniform, so
        (G-1)/G of the copies leave their member. The weight bytes a pass reads
        are the same in expectation under either sharding: only the collectives
        differ (``CollectiveGroup.alltoall_s``)."""
        g = group_size
        copies = rows / g * self.n_active_experts * (g - 1) / g
        return copies * self.hidden * self.dtype_bytes

    def kv_bytes_per_token_layer(self) -> float:
        return 2 * self.n_kv_heads * self.dim_per_head * self.kv_elem_bytes

    # FLOPs ----------------------------------------------------------------
    def layer_flops(self, n_tokens: int, context: int) -> float:
        """FLOPs of one layer over n_tokens new positions after ``context`` cached
        ones, under a causal mask: the i-th new position (1-based) attends to
        context + i positions, so a pass scores n*context + n(n+1)/2 pairs (a
        prompt of P positions costs P(P+1)/2, not P^2, and chunking it costs the
        same pairs as one pass)."""
        dense = 2 * (self.layer_active_params - 2 * self.hidden) * n_tokens
        pairs = n_tokens * context + n_tokens * (n_tokens + 1) / 2
        attn = 4 * self.n_heads * self.dim_per_head * pairs
        return dense + attn

    def head_flops(self, n_tokens: int, kind: str = "lm", exit_layer: int | None = None) -> float:
        """FLOPs of head ``kind`` after layer ``exit_layer`` (None: the last)
        projecting ``n_tokens`` positions, its norm aside."""
        at = self.n_layers if exit_layer is None else exit_layer
        return 2 * (self.projection_params(kind, at) - self.hidden) * n_tokens
