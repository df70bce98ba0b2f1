"""Inputs mean what they say (issue 20, class 5; review N6-N9).

One rule per kind of input, each enforced where every command passes:

- a list value with an empty item (``4,,2``, ``0.9,``, ``tree=4,2;;3``) is refused
  (``analyses.run.config.split_items``), and a key given twice in a KEY=VALUE list
  (``refuse_repeats``: --set, --sweep, --placement, law --set);
- an option the configuration leaves without effect is refused (expert_parallel on
  one device, acceptance settings on a measured run, train-draft heads that train
  nothing, policy parameters their mode ignores, compare --profile without --runs);
- ``profiles import`` reads ``quantization_config`` as the weights' stored width;
- an input path that is not a regular file is named as what it is, an integer too
  long to convert names its file and field, a closed stdout ends quietly, and a
  schedule's range check speaks before the memory check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from analyses.run.config import parse_placement, parse_sets, parse_value, split_items
from clicases import assert_refused, run_cli
from tests.hangguard import HANG_S

REPO = Path(__file__).resolve().parents[1]
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
         "tie_word_embeddings": True}
SD = ("simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--tokens", "20",
      "--policy", "sd", "--set", "draft_layers=15")


# empty list items ------------------------------------------------------------------
@pytest.mark.parametrize("text", ["4,,2", "0.9,", ",0.5,0.5", ",,,", " , "])
def test_an_empty_list_item_is_refused_not_dropped(text):
    with pytest.raises(ValueError, match="is empty"):
        parse_value(text, f"--set tree={text}")


def test_a_list_without_empty_items_parses_as_before():
    assert parse_value("4, 2,2") == (4, 2, 2)
    assert parse_value("0.9,0.8") == (0.9, 0.8)
    assert parse_value("5") == 5 and parse_value("on") is True


@given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=8), st.data())
@settings(max_examples=60, deadline=None)
def test_property_an_empty_item_anywhere_is_refused(values, data):
    items = [str(v) for v in values]
    at = data.draw(st.integers(0, len(items)))
    blank = data.draw(st.sampled_from(["", " ", "  "]))
    broken = ",".join(items[:at] + [blank] + items[at:])
    with pytest.raises(ValueError, match=rf"item {at + 1} of {len(items) + 1} is empty"):
        parse_value(broken, "--set tree")
    if len(items) > 1:
        assert parse_value(",".join(items)) == tuple(values)


@pytest.mark.parametrize("spec", ["gamma=,,,", "tree=4,2;;3", "tree=4,2;", "gamma=2,4,",
                                  "rank_alphas=0.6,,0.2", "prompt_tokens=128;;1024"])
def test_sweep_lists_with_an_empty_item_are_refused(spec):
    from analyses.compare.sweep import parse_sweep

    with pytest.raises(ValueError, match="is empty"):
        parse_sweep(spec)


def test_compare_gamma_of_empty_items_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "r.html"
    result = run_cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "none", "--policies", "ar,sd", "--set", "draft_layers=15",
                     "--sweep", "gamma=,,,", "--tokens", "20", "--jobs", "1", "-o", out)
    assert_refused(result, "--sweep gamma=,,,", "empty")
    assert not out.exists()


@pytest.mark.parametrize("text", ["target=cpu0,", ",target=cpu0", "", "target=cpu0,,draft=cpu0"])
def test_placement_with_an_empty_pair_is_refused(text):
    with pytest.raises(ValueError, match="empty"):
        parse_placement(text)
    assert parse_placement(None) == {}


# repeated keys ---------------------------------------------------------------------
KEYS = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)


@given(st.lists(KEYS, min_size=1, max_size=6, unique=True), st.data())
@settings(max_examples=60, deadline=None)
def test_property_distinct_keys_pass_and_a_repeated_one_is_refused(keys, data):
    items = [f"{k}={i}" for i, k in enumerate(keys)]
    assert parse_sets(items) == {k: i for i, k in enumerate(keys)}
    twice = data.draw(st.sampled_from(keys))
    at = data.draw(st.integers(0, len(items)))
    with pytest.raises(ValueError, match=f"--set gives '{twice}' twice"):
        parse_sets(items[:at] + [f" {twice} =1"] + items[at:])


def test_repeated_keys_are_refused_by_every_command(tmp_path):
    assert_refused(run_cli(*SD, "--set", "alpha=0.8", "--set", "alpha=0.2"),
                   "'alpha' twice")
    assert_refused(run_cli("law", "leviathan", "--set", "alpha=0.8", "--set", "gamma=5",
                           "--set", "alpha=0.2"), "'alpha' twice")
    from analyses.compare.sweep import parse_sweeps

    with pytest.raises(ValueError, match="--sweep gives 'gamma' twice"):
        parse_sweeps(["gamma=2..3", "gamma=5"])
    with pytest.raises(ValueError, match="role 'draft' twice"):
        parse_placement("draft=gpu4,draft=gpu3")
    with pytest.raises(ValueError, match="'sd' twice"):
        split_items("ar,sd,sd", "--policies ar,sd,sd", unique=True)


# options with no effect --------------------------------------------------------------
def test_expert_parallel_on_one_device_is_refused_and_on_a_group_runs():
    from analyses.run.api import RunConfig, check_expert_parallel

    base = dict(platform="h100-sxm-5x", target="qwen3-30b-a3b", policy="ar",
                expert_parallel=True)
    with pytest.raises(ValueError, match="no effect.*qwen3-30b-a3b on gpu0"):
        check_expert_parallel(RunConfig(**base, placement={"target": "gpu0"}))
    check_expert_parallel(RunConfig(**base))  # target_tp: four GPUs
    with pytest.raises(ValueError, match="one device"):
        check_expert_parallel(RunConfig(**{**base, "platform": "jetson-agx-orin-64gb"}))
    with pytest.raises(ValueError, match="qwen3-30b-a3b on gpu4"):
        check_expert_parallel(RunConfig(**{**base, "target": "llama-3.1-70b",
                                           "draft": "qwen3-30b-a3b", "policy": "sd"}))


@pytest.mark.parametrize("extra, fragment", [
    (("--set", "alpha=0.8"), "--set alpha"),
    (("--set", "trace=x.jsonl"), "--set trace"),
    (("--acceptance", "iid"), "--acceptance iid")])
def test_a_measured_run_refuses_acceptance_settings_before_loading(extra, fragment, tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--policy", "sd", "--set", "draft_layers=15", "--max-new-tokens", "4",
                     "--no-baseline", "--inline", "--out", out, *extra)
    assert_refused(result, fragment, "no effect on hetspec run")
    assert not out.exists()


@pytest.mark.torch
@pytest.mark.parametrize("args, fragment", [
    (["--ahead", "none", "--eta", "3"], "--eta 3 has no effect with --ahead none"),
    (["--ahead", "15", "--eta", "1"], "--ahead 15 has no effect with --eta 1"),
    (["--exits", "8"], "the default --ahead 15 has no exit head"),
    (["--exits", "8,8"], "names layer 8 twice"),
    (["--exits", ""], "an empty list of layers"),
    (["--exits", "8,,15"], "item 2 of 3 is empty"),
    (["--exclude-packages", "a,a"], "'a' twice")])
def test_train_draft_refuses_before_training(args, fragment, tmp_path, monkeypatch):
    import executors.train.distil as distil

    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(distil, "train", lambda *a, **k: started.append(1))
    assert_refused(run_cli("train-draft", *args), fragment)
    assert not started and not list(tmp_path.iterdir())


@pytest.mark.parametrize("policy, sets, fragment", [
    ("ssd", ["hit_rate=0.7", "fast_backup_s=0.001"], "fast_backup_s has no effect"),
    ("ssd", ["hit_rate=0.7", "r=0.5"], "r has no effect"),
    ("ssd", ["hit_rate=0.7", "top_mass=0.3"], "top_mass has no effect"),
    ("mirror", ["rollout_ratio=0.5", "batch_fallback=skip"], "rollout_ratio has no effect")])
def test_policy_parameters_their_mode_ignores_are_refused(policy, sets, fragment):
    argv = ["simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft",
            "smollm2-135m", "--tokens", "20", "--policy", policy]
    for item in sets:
        argv += ["--set", item]
    assert_refused(run_cli(*argv), fragment)


def test_the_same_parameters_in_the_mode_that_uses_them_run():
    result = run_cli("simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "smollm2-135m", "--tokens", "20", "--policy", "ssd",
                     "--set", "hit_rate=0.7", "--set", "backup=fast", "--set",
                     "fast_backup_s=0.001")
    assert result.rc == 0, result.err


@pytest.mark.parametrize("policy, sets", [("ar", []), ("ppsd", []),
                                          ("sd", ["draft_layers=15"])])
def test_a_draft_the_policy_does_not_run_is_refused(policy, sets):
    argv = ["simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--tokens",
            "20", "--policy", policy, "--draft", "smollm2-135m"]
    for item in sets:
        argv += ["--set", item]
    assert_refused(run_cli(*argv), "--draft smollm2-135m has no effect")


def test_compare_refuses_profile_without_runs(tmp_path):
    out = tmp_path / "r.html"
    assert_refused(run_cli("compare", "--profile", "cpu-local", "-o", out),
                   "--profile cpu-local has no effect without --runs")
    assert not out.exists()


# quantization_config ---------------------------------------------------------------
def _write(tmp_path, config) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


QUANT_CONFIGS = st.one_of(
    st.tuples(st.sampled_from(["gptq", "awq"]), st.sampled_from([4, 8])).map(
        lambda t: ({"quant_method": t[0], "bits": t[1], "group_size": 128}, t[1])),
    st.sampled_from([4, 8]).map(lambda b: (
        {"quant_method": "bitsandbytes", f"load_in_{b}bit": True}, b)),
    st.sampled_from([4, 8]).map(lambda b: (
        {"quant_method": "compressed-tensors",
         "config_groups": {"g0": {"weights": {"num_bits": b}}}}, b)),
    st.just(({"quant_method": "fp8", "activation_scheme": "dynamic"}, 8)))


@given(QUANT_CONFIGS)
@settings(max_examples=25, deadline=None)
def test_property_imported_weight_bits_equal_the_configs_bits(tmp_path_factory, case):
    from hwprofiles import ModelSpec
    from hwprofiles.importer import import_config

    quant, bits = case
    tmp = tmp_path_factory.mktemp("q")
    fields = import_config(_write(tmp, {**LLAMA, "quantization_config": quant}), "m")
    spec = ModelSpec.model_validate(fields)
    plain = ModelSpec.model_validate(import_config(_write(tmp, LLAMA), "m"))
    assert spec.weight_bits == bits and "quantization_config" in fields["sources"]["weight_bits"]
    assert spec.weight_bytes == pytest.approx(plain.weight_bytes * bits / 16)


def test_an_imported_quantized_model_is_stored_at_its_width_in_a_run(tmp_path):
    from analyses.run.api import RunConfig, run_models

    config = _write(tmp_path, {**LLAMA, "quantization_config": {"quant_method": "gptq",
                                                                "bits": 4}})
    yaml_path = tmp_path / "q.yaml"
    assert run_cli("profiles", "import", config, "-o", yaml_path).rc == 0
    model = run_models(RunConfig(platform="cpu-local", target=str(yaml_path), policy="ar"))
    assert model["target"].weight_bits == 4 and model["target"].weight_elem_bytes == 0.5


@pytest.mark.parametrize("quant, extra, fragment", [
    ({"quant_method": "hqq", "nbits": 4}, (), "'hqq', not one hetspec reads"),
    ({"quant_method": "gptq", "bits": 3}, (), "3 bits"),
    ({"quant_method": "gptq", "bits": 4}, ("--weight-bits", "8"), "contradicts"),
    (None, ("--weight-bits", "4"), "has no effect")])
def test_quantization_configs_hetspec_cannot_read_point_at_weight_bits(quant, extra,
                                                                        fragment, tmp_path):
    config = {**LLAMA, "quantization_config": quant} if quant else LLAMA
    result = run_cli("profiles", "import", _write(tmp_path, config), *extra)
    assert_refused(result, fragment)
    if quant and not extra:
        assert "--weight-bits" in result.sentence


def test_weight_bits_given_for_an_unknown_method_is_imported_with_its_source(tmp_path):
    from hwprofiles.importer import import_config

    path = _write(tmp_path, {**LLAMA, "quantization_config": {"quant_method": "hqq"}})
    fields = import_config(path, "m", weight_bits=4)
    assert fields["weight_bits"] == 4
    assert "--weight-bits 4" in fields["sources"]["weight_bits"]


# N9 messages -------------------------------------------------------------------------
def test_a_range_check_speaks_before_the_memory_check():
    result = run_cli("simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b",
                     "--draft", "llama-3.2-1b", "--policy", "tree", "--set",
                     "draft_layers=500")
    assert_refused(result, "draft_layers (500)")
    assert "GB" not in result.sentence


def test_a_5000_digit_integer_names_its_file_and_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA).replace('"vocab_size": 128256',
                                              '"vocab_size": ' + "9" * 5000))
    result = run_cli("profiles", "import", path)
    assert_refused(result, str(path), "field 'vocab_size' holds an integer of")
    assert "4300" not in result.sentence


@pytest.mark.parametrize("kind, fragment", [("fifo", "is a FIFO (named pipe), not a "
                                                    "regular file"),
                                            ("devnull", "is a character device"),
                                            ("empty", "is empty")])
def test_prompts_that_are_not_a_file_are_named_as_what_they_are(kind, fragment, tmp_path):
    from executors.prompts import load_jsonl

    path = {"devnull": Path(os.devnull)}.get(kind, tmp_path / "p.jsonl")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "empty":
        path.write_text("")
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_jsonl(path)


def test_a_key_given_twice_in_an_input_file_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA)[:-1] + ', "hidden_size": 4096}')
    assert_refused(run_cli("profiles", "import", path), "gives 'hidden_size' twice")
    model = tmp_path / "m.yaml"
    shipped = (REPO / "hwprofiles/data/models/smollm2-135m.yaml").read_text()
    model.write_text(shipped.replace("n_layers: 30", "n_layers: 30\nn_layers: 3", 1))
    assert_refused(run_cli("profiles", "validate", model), "line 3", "'n_layers' twice")


def test_yaml_merge_keys_still_override():
    from hwprofiles.reading import YamlLoader
    import yaml

    data = yaml.load("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n", Loader=YamlLoader)
    assert data["other"] == {"x": 1, "y": 3}


def test_a_closed_stdout_ends_quietly():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "analyses.cli", "profiles", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=HANG_S) == 141 and err == ""
