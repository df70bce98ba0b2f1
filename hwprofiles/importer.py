"""A model profile from a Hugging Face ``config.json``.

``import_config(path)`` reads the config of a Llama, Mistral, Qwen2/Qwen3,
Gemma/Gemma2 or mixture-of-experts (Mixtral, Qwen2-MoE, Qwen3-MoE) checkpoint
and returns the model profile as a mapping that ``ModelSpec`` validates, every
number's source naming the config file and the key it came from. Other
architectures are refused: their layers differ in ways the profile's fields
cannot say (a different attention, dense and sparse layers mixed), and a wrong
shape would give wrong costs without a word.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import ValidationError

from hwprofiles import jsonin
from hwprofiles.loader import MAX_PROFILE_BYTES, ProfileError, printable
from hwprofiles.models import BITS, ModelSpec

# architecture -> (family, tie_word_embeddings when the config leaves it out: the
# default of that family's transformers config class)
FAMILIES = {
    "LlamaForCausalLM": ("llama", False),
    "MistralForCausalLM": ("mistral", False),
    "Qwen2ForCausalLM": ("qwen2", False),
    "Qwen3ForCausalLM": ("qwen3", False),
    "GemmaForCausalLM": ("gemma", True),
    "Gemma2ForCausalLM": ("gemma2", True),
    "MixtralForCausalLM": ("mixtral", False),
    "Qwen2MoeForCausalLM": ("qwen2_moe", False),
    "Qwen3MoeForCausalLM": ("qwen3_moe", False),
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# profile field -> config key
DENSE_KEYS = {"n_layers": "num_hidden_layers", "hidden": "hidden_size",
              "ffn": "intermediate_size", "n_heads": "num_attention_heads",
              "vocab": "vocab_size"}


def import_config(path: str | Path, name: str, hf_id: str | None = None,
                  weight_bits: int | None = None) -> dict:
    """The validated model profile (a plain mapping, ready to dump as YAML) of
    the config.json at ``path``; ProfileError with one sentence otherwise.
    ``weight_bits`` (``--weight-bits``) gives the stored width of a quantized
    checkpoint whose ``quantization_config`` hetspec cannot read."""
    path = Path(path)
    config = read_config(path)
    shown = printable(str(path))
    arch = _architecture(config, shown)
    fields: dict = {"name": name}
    if hf_id:
        fields["hf_ids"] = [hf_id]
    sources: dict[str, str] = {}

    def take(field: str, key: str, note: str = "") -> None:
        if config.get(key) is None:
            raise ProfileError(f"{shown} has no '{key}', which sets the profile's {field}; "
                               "give the config.json of a complete checkpoint")
        fields[field] = config[key]
        sources[field] = f"{shown}: {key}{note}"

    for field, key in DENSE_KEYS.items():
        take(field, key)
    if config.get("num_key_value_heads") is not None:
        take("n_kv_heads", "num_key_value_heads")
    else:
        take("n_kv_heads", "num_attention_heads", " (no num_key_value_heads: every "
             "head has its own keys and values)")
    if config.get("head_dim") is not None:
        take("head_dim", "head_dim")
    if config.get("max_position_embeddings") is not None:
        take("max_positions", "max_position_embeddings")
    fields.update(_dtype(config, shown, sources))
    fields.update(quantized_width(config, shown, sources, weight_bits))
    fields.update(_embeddings(config, arch, shown, sources))
    fields["hf_architecture"] = arch
    fields.update(_experts(config, arch, shown, sources, take))
    fields["sources"] = sources
    spec = _validate(fields, shown)
    # the numbers as validated: "2" or 2048.0 in the config become 2 and 2048
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in ((k, getattr(spec, k)) for k in fields)}


def read_config(path: Path) -> dict:
    """A Hugging Face config.json's object (``hwprofiles.jsonin`` reads it, as every
    JSON input)."""
    shown = printable(str(path))
    config = jsonin.read_json(path, "config file", "give a Hugging Face config.json",
                              MAX_PROFILE_BYTES, ProfileError)
    if not isinstance(config, dict):
        raise ProfileError(f"{shown} must hold a JSON object of config fields")
    return config


def _architecture(config: dict, shown: str) -> str:
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if not isinstance(arch, str) or arch not in FAMILIES:  # a list is no dict key
        raise ProfileError(
            f"{shown}: field 'architectures' is {printable(repr(arch))}, not a family "
            f"hetspec can import ({', '.join(FAMILIES)}); write the profile by hand "
            "(see hwprofiles/data/models/)")
    return arch


def _dtype(config: dict, shown: str, sources: dict) -> dict:
    key = "torch_dtype" if "torch_dtype" in config else "dtype"
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, str) or value not in DTYPES:
        raise ProfileError(f"{shown}: field '{key}' is {printable(repr(value))}; hetspec "
                           f"reads {', '.join(DTYPES)} (a quantized "
                           "checkpoint gives its width in quantization_config, or pass "
                           "--weight-bits)")
    sources["dtype"] = f"{shown}: {key} {value}"
    return {"dtype": DTYPES[value]}


# quant_method -> how its quantization_config gives the weights' stored width
QUANT_METHODS = ("gptq", "awq", "bitsandbytes", "fp8", "compressed-tensors")
FIX_BITS = "pass the stored width as --weight-bits 4 or 8 (the profile's weight_bits)"


def quantized_width(config: dict, shown: str, sources: dict,
                    given: int | None = None) -> dict:
    """``weight_bits`` of a quantized checkpoint, from its ``quantization_config``
    (GPTQ/AWQ ``bits``, bitsandbytes ``load_in_4bit``/``load_in_8bit``, fp8,
    compressed-tensors ``num_bits``) or from ``given`` (``--weight-bits``), with
    its source; {} for an unquantized checkpoint. An unknown method, or a width
    hetspec does not store, is refused: read as its dtype, a 4-bit checkpoint
    would count 4x its weight bytes."""
    qc = config.get("quantization_config")
    if qc is None:
        if given is not None:
            raise ProfileError(f"--weight-bits {given} has no effect: {shown} has no "
                               "quantization_config (its weights are stored at its dtype); "
                               "drop --weight-bits, or pass --set weight_bits= to a run")
        return {}
    known = isinstance(qc, dict) and qc.get("quant_method") in QUANT_METHODS
    bits, note = _config_bits(qc, shown) if given is None or known else (None, "")
    if given is not None and bits in BITS and given != bits:
        raise ProfileError(f"--weight-bits {given} contradicts {shown}'s {note} "
                           f"({bits}); drop --weight-bits")
    if given is None:
        source = f"{shown}: {note}"
    else:  # an unknown method, or a width hetspec does not store: the user's width
        said = f"says {printable(repr(bits))} bits" if known else "not read"
        bits, source = given, (f"profiles import --weight-bits {given} "
                               f"(quantization_config {said})")
    if isinstance(bits, bool) or bits not in BITS:
        raise ProfileError(f"{shown}: field 'quantization_config' stores weights at "
                           f"{printable(repr(bits))} bits; hetspec stores "
                           f"{', '.join(map(str, BITS))}: {FIX_BITS}")
    sources["weight_bits"] = source + " (embeddings and LM head counted at this width too)"
    return {"weight_bits": bits}


def _config_bits(qc, shown: str) -> tuple:
    """(bits, where they were read) of a quantization_config; ProfileError for an
    unknown method."""
    if not isinstance(qc, dict):
        raise ProfileError(f"{shown}: field 'quantization_config' is a "
                           f"{type(qc).__name__}, not a mapping with a quant_method; "
                           f"{FIX_BITS}")
    method = qc.get("quant_method")
    if method not in QUANT_METHODS:
        raise ProfileError(f"{shown}: field 'quantization_config.quant_method' is "
                           f"{printable(repr(method))}, not one hetspec reads "
                           f"({', '.join(QUANT_METHODS)}); {FIX_BITS}")
    where = f"quantization_config (quant_method {method})"
    if method in ("gptq", "awq"):
        key = "bits" if "bits" in qc or "w_bit" not in qc else "w_bit"
        return qc.get(key), f"{where}, {key}"
    if method == "bitsandbytes":
        four, eight = qc.get("load_in_4bit") is True, qc.get("load_in_8bit") is True
        if four == eight:
            raise ProfileError(f"{shown}: field 'quantization_config' sets "
                               f"{'both' if four else 'neither'} of load_in_4bit and "
                               f"load_in_8bit; {FIX_BITS}")
        return (4, f"{where}, load_in_4bit") if four else (8, f"{where}, load_in_8bit")
    if method == "fp8":
        return 8, f"{where}: 8-bit float weights"
    groups = qc.get("config_groups")
    found = [g["weights"].get("num_bits") for g in
             (groups.values() if isinstance(groups, dict) else ())
             if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    widths = list(dict.fromkeys(w if isinstance(w, (int, float, str)) else repr(w)
                                for w in found))
    if len(widths) != 1:
        raise ProfileError(f"{shown}: field 'quantization_config.config_groups' gives "
                           f"{'no' if not widths else 'several'} weight num_bits; {FIX_BITS}")
    return widths[0], f"{where}, config_groups weights num_bits"


def _embeddings(config: dict, arch: str, shown: str, sources: dict) -> dict:
    tied = config.get("tie_word_embeddings")
    if tied is None:
        tied = FAMILIES[arch][1]
        note = f"no tie_word_embeddings: the {FAMILIES[arch][0]} default ({tied})"
    else:
        note = "tie_word_embeddings"
    if not isinstance(tied, bool):
        raise ProfileError(f"{shown}: field 'tie_word_embeddings' is {tied!r}; it must "
                           "be true or false")
    sources["tied_embeddings"] = f"{shown}: {note}"
    return {"tied_embeddings": tied}


def _experts(config: dict, arch: str, shown: str, sources: dict, take) -> dict:
    """Mixture-of-experts fields, through ``take(field, key)``."""
    family = FAMILIES[arch][0]
    if family not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        return {}
    for key, dense in (("decoder_sparse_step", 1), ("mlp_only_layers", [])):
        if config.get(key, dense) not in (dense, None):
            raise ProfileError(f"{shown}: field '{key}' is {config[key]!r}; hetspec models "
                               "every layer as a mixture of experts, so it imports only "
                               f"{key}={json.dumps(dense)}")
    take("n_experts", "num_local_experts" if family == "mixtral" else "num_experts")
    take("n_active_experts", "num_experts_per_tok")
    take("expert_ffn", "intermediate_size" if family == "mixtral" else "moe_intermediate_size")
    out = {}
    if family == "qwen2_moe" and config.get("shared_expert_intermediate_size"):
        out["n_shared_experts"] = 1
        sources["n_shared_experts"] = (f"{shown}: shared_expert_intermediate_size is set "
                                       "(Qwen2-MoE has one shared expert)")
        take("shared_expert_ffn", "shared_expert_intermediate_size")
    return out


def _validate(fields: dict, shown: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        source = fields["sources"].get(where, "").partition(": ")[2].split(" ")[0]
        msg = first["msg"].removeprefix("Value error, ")
        if not where:  # a check across fields: name the config keys it is about
            for field, source in fields["sources"].items():
                key = source.partition(": ")[2].split(" ")[0]
                msg = re.sub(rf"\b{field}\b", f"{key}", msg)
            raise ProfileError(printable(f"{shown}: {msg}")) from None
        named = f"field '{source}'" if source else f"profile field '{where}'"
        raise ProfileError(printable(f"{shown}: {named}: {msg}")) from None
