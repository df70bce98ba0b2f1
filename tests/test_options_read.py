"""Every option of fit and simulate (simulate's flags, every run key, and for
fit every policy's parameters) changes the answer or is refused, never dropped in
silence; fit and simulate share one check of what a platform can run,
and both refuse contexts beyond the model's trained positions."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.cli import build_parser, main
from analyses.commands.fit import IGNORED
from analyses.run.config import RUN_KEYS
from hwprofiles import load_model, list_names
from policies import entry, names

FIT = ["fit", "--platform", "h100-sxm-8x", "--target", "llama-3.1-70b", "--contexts",
       "8192", "--batches", "1", "--json"]
MOE_FIT = ["fit", "--platform", "h100-sxm-8x", "--target", "qwen3-30b-a3b", "--contexts",
           "8192", "--batches", "1", "--json"]
SIM = ["simulate", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
       "llama-3.2-1b", "--policy", "sd", "--tokens", "50", "--json"]
# a batch whose KV cache overflows the target's GPUs: memory_check=off lets it run
SIM_FULL = SIM + ["--batch", "4096"]
# a system on chip whose tiers its engines share: contention slows them
SIM_SOC = ["simulate", "--platform", "jetson-agx-orin-64gb", "--target", "llama-3.2-1b",
           "--policy", "ar", "--tokens", "20", "--json"]
SIM_MOE = ["simulate", "--platform", "h100-sxm-8x", "--target", "qwen3-30b-a3b",
           "--policy", "ar", "--tokens", "20", "--placement", "target=tp8", "--json"]

# --set KEY=VALUE per run key: (simulate's base command, value)
SIM_SETS = {"contention": (SIM_SOC, "on"), "prompt_tokens": (SIM, "4096"),
            "weight_bits": (SIM, "8"), "kv_bits": (SIM, "8"), "compute_bits": (SIM, "8"),
            "memory_check": (SIM_FULL, "off"), "expert_parallel": (SIM_MOE, "on"),
            "prefill_chunk": (SIM + ["--set", "prompt_tokens=4096"], "512"),
            "stack": (SIM, "hf-eager")}
FIT_SETS = {"contention": (FIT, "on"), "prompt_tokens": (FIT, "4096"),
            "weight_bits": (FIT, "8"), "kv_bits": (FIT, "8"), "compute_bits": (FIT, "8"),
            "memory_check": (FIT, "off"), "expert_parallel": (MOE_FIT, "on"),
            "prefill_chunk": (FIT, "512"), "stack": (FIT, "hf-eager")}
FIT_OPTIONS = {"--draft": ["--draft", "llama-3.2-1b"], "--policy": ["--policy", "eesd"],
               "--contexts": ["--contexts", "4096"], "--batches": ["--batches", "8"],
               "--tokens": ["--tokens", "20000"], "--fixed-context": ["--fixed-context"],
               "--placement": ["--placement", "draft=gpu7"]}


def _answer(capsys, argv) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out if rc == 0 else captured.err.strip().splitlines()[-1]


def _changes_or_refused(capsys, base, extra):
    before = _answer(capsys, base)
    rc, after = _answer(capsys, base + extra)
    if rc == 2:
        assert after.startswith("hetspec: error:") and extra[-1].split("=")[0] in after
        return "refused"
    assert rc in (0, 1) and (rc, after) != before, f"{extra} changed nothing"
    return "changed"


def test_every_run_key_is_enumerated():
    assert set(SIM_SETS) == set(RUN_KEYS) == set(FIT_SETS)


@pytest.mark.parametrize("key", sorted(RUN_KEYS))
def test_each_set_key_changes_simulate_or_is_refused(capsys, key):
    base, value = SIM_SETS[key]
    assert _changes_or_refused(capsys, base, ["--set", f"{key}={value}"]) == "changed"


@pytest.mark.parametrize("key", sorted(RUN_KEYS))
def test_each_set_key_changes_fit_or_is_refused(capsys, key):
    base, value = FIT_SETS[key]
    outcome = _changes_or_refused(capsys, base, ["--set", f"{key}={value}"])
    assert outcome == ("refused" if key in IGNORED else "changed")


def test_an_acceptance_setting_is_refused_by_fit(capsys):
    rc, err = _answer(capsys, FIT + ["--set", "alpha=0.8"])
    assert rc == 2 and "--set alpha sets the acceptance" in err


@pytest.mark.parametrize("option", sorted(FIT_OPTIONS))
def test_each_fit_option_changes_the_answer(capsys, option):
    assert _changes_or_refused(capsys, FIT, FIT_OPTIONS[option]) == "changed"


def test_fit_refuses_what_simulate_refuses_on_the_platform(capsys):
    """m2-ultra-8x has no 8-bit peak: both commands say so in the same sentence."""
    fit = _answer(capsys, ["fit", "--platform", "m2-ultra-8x", "--target", "qwen3-32b",
                           "--set", "compute_bits=8"])
    sim = _answer(capsys, ["simulate", "--platform", "m2-ultra-8x", "--target",
                           "qwen3-32b", "--policy", "ar", "--set", "compute_bits=8"])
    assert fit[0] == sim[0] == 2 and fit[1] == sim[1] and "8-bit peak" in fit[1]


def test_every_shipped_model_carries_its_positions_with_a_source():
    for name in list_names("models"):
        spec = load_model(name)
        assert spec.max_positions and "max_position" in spec.sources["max_positions"] \
            or "context_length" in spec.sources["max_positions"]


def test_fit_answers_no_context_past_the_positions_and_refuses_one(capsys):
    rc, out = _answer(capsys, FIT[:-5] + ["--batches", "1", "--json"])
    report = json.loads(out)
    positions = load_model("llama-3.1-70b").max_positions
    assert report["context_cap"] == positions - report["tokens"]
    assert max(r["longest_context"]["1"] or 0 for r in report["layouts"]) \
        == report["context_cap"]
    rc, err = _answer(capsys, FIT[:-5] + ["--contexts", str(positions)])
    assert rc == 2 and f"{positions:,} the target model llama-3.1-70b" in err


def test_simulate_refuses_a_context_past_the_positions(capsys):
    positions = load_model("llama-3.1-70b").max_positions
    ok = _answer(capsys, SIM + ["--set", f"prompt_tokens={positions - 50}"])
    refused = _answer(capsys, SIM + ["--set", f"prompt_tokens={positions - 49}"])
    assert ok[0] == 0 and refused[0] == 2 and "max_positions" in refused[1]


# ---------------------------------------------------------------- property
FIT_VALUES = {"contention": "on", "prompt_tokens": "4096", "weight_bits": "8",
              "kv_bits": "8", "compute_bits": "8", "memory_check": "off",
              "expert_parallel": "on", "prefill_chunk": "512", "stack": "hf-eager",
              "alpha": "0.8", "histogram": "0.5,0.5"}


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from(sorted(FIT_VALUES)), min_size=1, max_size=4,
                     unique=True))
def test_fit_refuses_any_mix_of_set_keys_with_one_it_does_not_read(capsys, keys):
    """Any set of --set keys: refused, naming a key, exactly when one of them is a
    key fit does not read (or an acceptance setting); answered otherwise."""
    unread = [k for k in keys if k in IGNORED or k in ("alpha", "histogram")]
    if "alpha" in keys and "histogram" in keys:
        return  # two acceptance models: refused as a conflict before fit looks
    argv = FIT + [a for k in keys for a in ("--set", f"{k}={FIT_VALUES[k]}")]
    rc, answer = _answer(capsys, argv)
    if unread:
        assert rc == 2 and any(f"--set {k} " in answer for k in unread), answer
    else:
        assert rc in (0, 1) and json.loads(answer)["layouts"]


# ---------------------------------------------------------------- simulate's own flags
def _speed(capsys, argv) -> tuple[int, object]:
    """simulate's answer without the echo of its inputs: its measured numbers (an
    option that only changed the echo would look like it did something)."""
    rc = main(argv)
    captured = capsys.readouterr()
    if rc != 0:
        return rc, captured.err.strip().splitlines()[-1]
    out = json.loads(captured.out)
    return rc, {k: out.get(k) for k in ("tokens_per_s", "step_latency_s", "ttft_s",
                                        "tpot_s", "speedup_vs_ar", "mean_tokens_per_step")}


# each flag of simulate that sets the run: the arguments that give it another value
SIM_OPTIONS = {"--platform": ["--platform", "h100-sxm-8x"],
               "--target": ["--target", "llama-2-70b"],
               "--draft": ["--draft", "llama-3.2-3b"], "--policy": ["--policy", "tree"],
               "--tokens": ["--tokens", "60"], "--batch": ["--batch", "4"],
               "--seed": ["--seed", "3"], "--placement": ["--placement", "draft=gpu0"],
               "--stack": ["--stack", "hf-eager"],
               "--acceptance": ["--set", "alphas=0.9,0.5", "--acceptance", "positional"],
               "--deterministic": ["--deterministic"], "--fixed-context": ["--fixed-context"]}
# flags that shape what is printed or written, or allow a run: tested on their own
SIM_OUTPUTS = {"--json", "--trace", "--record", "--allow-large", "--help", "--set"}


def test_every_simulate_flag_is_enumerated():
    parser = build_parser(["simulate"])
    sub = next(a for a in parser._actions if a.dest == "command").choices["simulate"]
    flags = {s for a in sub._actions for s in a.option_strings if s.startswith("--")}
    assert flags == set(SIM_OPTIONS) | SIM_OUTPUTS


@pytest.mark.parametrize("flag", sorted(SIM_OPTIONS))
def test_each_simulate_flag_changes_the_answer(capsys, flag):
    before = _speed(capsys, SIM)
    after = _speed(capsys, SIM + SIM_OPTIONS[flag])
    assert before[0] == after[0] == 0 and after != before, f"{flag} changed nothing"


def test_seed_beside_deterministic_is_refused(capsys):
    rc, err = _answer(capsys, SIM + ["--deterministic", "--seed", "3"])
    assert rc == 2 and err == ("hetspec: error: --seed 3 has no effect with --deterministic "
                               "(its outcomes are expectations, nothing is drawn); drop one")


def test_trace_and_record_write_what_they_name_and_leave_the_answer(capsys, tmp_path):
    before = _speed(capsys, SIM)
    trace, record = tmp_path / "t.json", tmp_path / "r.json"
    after = _speed(capsys, SIM + ["--trace", str(trace), "--record", str(record)])
    assert after == before
    assert json.loads(trace.read_text())["traceEvents"]
    assert json.loads(record.read_text())["metrics"]["tokens_per_s"] == \
        before[1]["tokens_per_s"]


def test_allow_large_lets_a_run_over_the_budget_start(capsys, monkeypatch):
    import analyses.commands.simulate as command

    def started(*_a, **_k):
        raise ValueError("started")

    monkeypatch.setattr(command, "simulate", started)
    big = SIM[:-3] + ["--tokens", "1000000", "--batch", "1024", "--set",
                      "memory_check=off"]
    rc, err = _answer(capsys, big)
    assert rc == 2 and "over the budget" in err and "--allow-large" in err
    assert _answer(capsys, big + ["--allow-large"]) == (2, "hetspec: error: started")


# ---------------------------------------------------------------- fit: policy keys
FIT_BASES = {
    "ar": ["--platform", "h100-sxm-8x", "--target", "llama-3.1-70b"],
    "eesd": ["--platform", "h100-sxm-8x", "--target", "llama-3.1-70b"],
    "ppsd": ["--platform", "h100-sxm-8x", "--target", "llama-3.1-70b"],
    "sd": ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
           "llama-3.2-1b"],
    "tree": ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
             "llama-3.2-1b"],
    "ssd": ["--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
            "llama-3.2-1b", "--set", "r=1.0"],
    "mirror": ["--platform", "m2-ultra-8x", "--target", "qwen3-32b", "--draft",
               "qwen3-0.6b"],
    **{p: ["--platform", "jetson-agx-orin-64gb", "--target", "llama-3.1-70b", "--set",
           "dram_budget_gb=48"] for p in ("ar_stream", "cats", "kangaroo")}}
STREAM = {"dram_budget_gb": "32", "chunk_layers": "4", "buffer_chunks": "3",
          "buffer_in_budget": "off"}
LOOKUP = {"proposer": "ngram", "n": "2", "n_min": "1", "search": "prompt", "match": "0.5"}
TEMPERATURE = ["--set", "temperature=0.5", "--set", "target_top_mass=0.6"]  # given together
# a value other than the default of every policy parameter: VALUE, (more of the
# base, VALUE) where the parameter needs another, or the arguments of two that
# are given together
FIT_PARAMS = {
    "ar": {"pipeline_layers": "10"},
    "ar_stream": STREAM,
    "cats": {**STREAM, "gamma": "9", "l_dm": "5", "mean_accepted": "2.5",
             "adapter": "norm", "l_sv": "20", "corrections": "2"},
    "kangaroo": {**STREAM, "gamma": "9", "l_dm": "5", "mean_accepted": "2.5",
                 "adapter": "norm"},
    "eesd": {"exit_layer": "12", "exit_head": "transformer", "gamma": "9"},
    "ppsd": {"exit_layer": "12", "exit_head": "transformer"},
    "mirror": {"gamma": "9", "kappa": "4", "exit_layer": "12", "eta": "2", "omega": "0.5",
               "draft_collectives": "0", "batch_fallback": "stall",
               "rollout_ratio": "0.5"},
    "sd": {"gamma": "9", "draft_layers": "10", "draft_collectives": "0", **LOOKUP},
    "ssd": {"k": "3", "fanout": "5", "shape": "geometric", "budget": "20", "a_p": "0.5",
            "backup": "fast", "partial_hits": "backup", "fast_alpha": "0.5",
            "fast_backup_s": "0.001", "c_saguaro": "0.5", "top_mass": "0.6",
            "draft_collectives": "0"},
    "tree": {"tree": "3,3,1", "width": "3", "depth": (["--set", "width=3"], "4"),
             "nodes": (["--set", "width=3"], "16"), "rank_alphas": "0.6,0.2",
             "temperature": TEMPERATURE, "target_top_mass": TEMPERATURE,
             "draft_layers": "10", "draft_collectives": "0", **LOOKUP}}
# parameters left out, and why: a measured trace's path (read as omega and hit_rate
# are), and SSD's hit model, one of which its schedule cannot be built without (fit
# takes it; the memory check does not vary with it)
FIT_PARAMS_LEFT = {("mirror", "omega_trace"), ("ssd", "hit_trace"), ("ssd", "hit_rate"),
                   ("ssd", "r")}


def test_every_policy_parameter_is_enumerated_for_fit():
    every = {(p, k) for p in names() for k in entry(p).params.model_fields}
    assert every == {(p, k) for p, keys in FIT_PARAMS.items() for k in keys} \
        | FIT_PARAMS_LEFT


def _fit_answer(capsys, argv) -> tuple[int, object]:
    """fit's answer without the echo of the given parameters."""
    rc = main(argv)
    captured = capsys.readouterr()
    if rc != 0:
        return rc, captured.err.strip().splitlines()[-1]
    out = json.loads(captured.out)
    for row in out["layouts"]:
        row.pop("params")
    return rc, out


@pytest.mark.parametrize("policy, key", [(p, k) for p, keys in sorted(FIT_PARAMS.items())
                                         for k in keys])
def test_each_policy_parameter_changes_fit_or_is_refused(capsys, policy, key):
    base = ["fit", "--policy", policy, "--contexts", "8192", "--batches", "1",
            "--json"] + FIT_BASES[policy]
    value = FIT_PARAMS[policy][key]
    if isinstance(value, tuple):
        more, value = value
        base = base + more
    extra = value if isinstance(value, list) else ["--set", f"{key}={value}"]
    before = _fit_answer(capsys, base)
    rc, after = _fit_answer(capsys, base + extra)
    assert before[0] == 0
    if rc == 2:
        assert after.startswith("hetspec: error:") and f"{key}" in after, after
    else:
        assert (rc, after) != before, f"{policy} {key} changed nothing"


def test_fit_names_the_parameter_its_memory_check_does_not_read(capsys):
    rc, err = _answer(capsys, ["fit", "--policy", "mirror", "--set", "omega=0.5"]
                      + FIT_BASES["mirror"])
    assert rc == 2 and err == (
        "hetspec: error: --set omega has no effect on fit (without it mirror places the "
        "same layers, heads and widest pass on the same devices, all the memory check "
        "counts); drop it")


MIRROR_READ = {"gamma"}  # the one mirror parameter its memory check reads


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from(sorted(FIT_PARAMS["mirror"])), min_size=1,
                     max_size=4, unique=True))
def test_fit_refuses_any_mix_of_policy_parameters_with_one_it_does_not_read(capsys, keys):
    """Any set of mirror's parameters: refused, naming one of them, exactly when
    one is not read by the memory check; answered otherwise."""
    argv = ["fit", "--policy", "mirror", "--json"] + FIT_BASES["mirror"] + [
        a for k in keys for a in ("--set", f"{k}={FIT_PARAMS['mirror'][k]}")]
    rc, answer = _answer(capsys, argv)
    unread = [k for k in keys if k not in MIRROR_READ]
    if unread:
        assert rc == 2 and any(f"--set {k} has no effect" in answer for k in unread), answer
    else:
        assert rc in (0, 1) and json.loads(answer)["layouts"]
