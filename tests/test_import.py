"""`hetspec profiles import`: model profiles from Hugging Face config.json files.

The configs below hold the public values of each checkpoint's config.json (the
fields the import reads, plus a few it ignores)."""

import json

import pytest

from hwprofiles import ProfileError, load_model
from hwprofiles.importer import import_config
from hwprofiles.schema import ModelSpec

from test_cli import hetspec

LLAMA_31_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "rope_theta": 500000.0, "rms_norm_eps": 1e-05}
QWEN3_32B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
             "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
             "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                 "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
              "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "sliding_window": 4096}
GEMMA2_2B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
             "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
             "vocab_size": 256000, "torch_dtype": "float32",
             "hidden_activation": "gelu_pytorch_tanh"}  # no tie_word_embeddings: tied
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "num_local_experts": 8, "num_experts_per_tok": 2,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN15_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
              "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
              "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
              "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
              "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def _spec(tmp_path, config) -> ModelSpec:
    return ModelSpec.model_validate(import_config(_write(tmp_path, config), "m"))


SHAPE = ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "dim_per_head", "vocab",
         "dtype", "tied_embeddings", "n_experts", "n_active_experts", "expert_ffn",
         "total_params", "weight_bytes")


@pytest.mark.parametrize("config,shipped", [(LLAMA_31_70B, "llama-3.1-70b"),
                                            (QWEN3_32B, "qwen3-32b"),
                                            (QWEN3_30B_A3B, "qwen3-30b-a3b")])
def test_import_reproduces_the_shipped_profiles(tmp_path, config, shipped):
    got, want = _spec(tmp_path, config), load_model(shipped)
    for field in SHAPE:
        assert getattr(got, field) == getattr(want, field), field


@pytest.mark.parametrize("config,total,active", [
    (MISTRAL_7B, 7.24e9, None),       # model card: 7.24B parameters
    (MIXTRAL_8X7B, 46.7e9, 12.9e9),   # Mistral AI: 46.7B in all, 12.9B used per token
    (QWEN15_MOE, 14.3e9, 2.7e9),      # Qwen1.5-MoE-A2.7B card: 14.3B, 2.7B activated
])
def test_imported_counts_match_published_sizes(tmp_path, config, total, active):
    """Published sizes are rounded to the last digit shown; so is the tolerance."""
    spec = _spec(tmp_path, config)
    assert spec.total_params == pytest.approx(total, abs=0.05e9 if total > 1e10 else 0.005e9)
    if active is not None:
        used = spec.n_layers * spec.layer_active_params + spec.head_params + spec.embed_params
        assert used == pytest.approx(active, abs=0.05e9)


def test_tied_embeddings_are_counted_once(tmp_path):
    """Gemma 2 ties the embedding to the LM head (the family default when the
    config leaves it out): one vocab x hidden matrix, not two."""
    tied = _spec(tmp_path, GEMMA2_2B)
    untied = _spec(tmp_path, {**GEMMA2_2B, "tie_word_embeddings": False})
    assert tied.tied_embeddings and tied.dim_per_head == 256 and tied.dtype == "fp32"
    assert untied.total_params - tied.total_params == 2304 * 256000
    # Gemma-2-2B holds 2.61B parameters (its two extra norms per layer aside)
    assert tied.total_params == pytest.approx(2.61e9, abs=0.005e9)


def test_shared_experts_and_gqa(tmp_path):
    spec = _spec(tmp_path, QWEN15_MOE)
    assert spec.n_shared_experts == 1 and spec.shared_expert_ffn == 5632
    mistral = _spec(tmp_path, MISTRAL_7B)
    assert mistral.kv_bytes_per_token_layer() == 2 * 8 * 128 * 2  # 8 KV heads of 32
    no_gqa = {k: v for k, v in MISTRAL_7B.items() if k != "num_key_value_heads"}
    assert _spec(tmp_path, no_gqa).n_kv_heads == 32


def test_sources_name_the_config_file_and_key(tmp_path):
    path = _write(tmp_path, QWEN3_30B_A3B)
    fields = import_config(path, "m", "Qwen/Qwen3-30B-A3B")
    assert fields["sources"]["n_experts"] == f"{path}: num_experts"
    assert fields["sources"]["expert_ffn"] == f"{path}: moe_intermediate_size"
    assert fields["hf_ids"] == ["Qwen/Qwen3-30B-A3B"]


def test_cli_writes_a_valid_profile_that_loads(tmp_path):
    config = _write(tmp_path, QWEN3_32B)
    out = tmp_path / "model.yaml"
    done = hetspec("profiles", "import", str(config), "-o", str(out))
    assert done.returncode == 0, done.stderr
    spec = load_model(out)
    assert spec.name == "model" and spec.total_params == load_model("qwen3-32b").total_params
    check = hetspec("profiles", "validate", str(out))
    assert check.returncode == 0 and "valid model 'model'" in check.stdout


@pytest.mark.parametrize("change,needle", [
    ({"architectures": ["DeepseekV3ForCausalLM"]}, "field 'architectures'"),
    ({"hidden_size": None}, "no 'hidden_size'"),
    ({"num_attention_heads": 60},
     "num_attention_heads (60) must be a multiple of num_key_value_heads (8)"),
    ({"torch_dtype": "int8"}, "field 'torch_dtype'"),
    ({"num_hidden_layers": 0}, "field 'num_hidden_layers'"),
])
def test_bad_configs_are_refused_in_one_sentence(tmp_path, change, needle):
    config = _write(tmp_path, {**QWEN3_32B, **change})
    out = tmp_path / "model.yaml"
    done = hetspec("profiles", "import", str(config), "-o", str(out))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert needle in done.stderr
    assert not out.exists()  # nothing written


def test_mixed_dense_and_sparse_layers_are_refused(tmp_path):
    path = _write(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]})
    with pytest.raises(ProfileError, match="mlp_only_layers"):
        import_config(path, "m")


def test_output_may_not_be_the_config(tmp_path):
    config = _write(tmp_path, QWEN3_32B)
    before = config.read_bytes()
    done = hetspec("profiles", "import", str(config), "-o", str(config))
    assert done.returncode == 2 and "which this command reads" in done.stderr
    assert config.read_bytes() == before


def test_not_json_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="is not JSON"):
        import_config(path, "m")


def test_hugging_face_ids_name_shipped_models():
    assert load_model("meta-llama/Llama-3.1-70B").name == "llama-3.1-70b"
    assert load_model("Qwen/Qwen3-32B").name == "qwen3-32b"
    assert load_model("qwen/qwen3-32b").name == "qwen3-32b"  # the Hub ignores case
    with pytest.raises(ProfileError, match="Hugging Face id"):
        load_model("someone/Unknown-7B")


def test_simulate_takes_a_hugging_face_id():
    args = ["simulate", "--platform", "h100-sxm-5x", "--policy", "ar", "--tokens", "20",
            "--deterministic", "--json", "--target"]
    by_id, by_name = hetspec(*args, "Qwen/Qwen3-32B"), hetspec(*args, "qwen3-32b")
    assert by_id.returncode == 0, by_id.stderr
    a, b = json.loads(by_id.stdout), json.loads(by_name.stdout)
    assert a["step_latency_s"] == b["step_latency_s"] and a["target"] == "Qwen/Qwen3-32B"
