"""One typed run configuration, validated once where it is built.

RunConfig's ``params`` is the registered parameter model of its policy and its
``acceptance`` one of the acceptance models (tagged by ``kind``); both are checked
when the config is built and read typed afterwards, while a record still writes
them as the user gave them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from analyses.run.api import simulate
from analyses.run.config import RunConfig
from clicases import assert_refused, run_cli
from policies import entry, names
from simcore import acceptance

TRACE = Path(__file__).parent / "golden" / "acceptance.jsonl"
H100 = {"platform": "h100-sxm-5x", "target": "llama-3.1-70b", "draft": "llama-3.2-1b"}
# a parameter each policy takes, at a value other than its default where it has one
GIVEN = {"sd": {"gamma": 6}, "cats": {"dram_budget_gb": 8, "gamma": 3},
         "tree": {"tree": [3, 2, 1]}, "mirror": {"gamma": 5, "kappa": 4},
         "ssd": {"hit_rate": 0.6}, "ppsd": {"exit_layer": 8}}


@pytest.mark.parametrize("policy", names())
def test_each_policy_round_trips_through_json_to_its_params_class(policy):
    given = GIVEN.get(policy, {})
    text = json.dumps({**H100, "policy": policy, "params": given,
                       "acceptance": {"kind": "iid", "alpha": 0.7}})
    config = RunConfig.model_validate_json(text)
    assert type(config.params) is entry(policy).params
    assert config.params == entry(policy).params.model_validate(given)
    again = RunConfig.model_validate_json(config.model_dump_json())
    assert type(again.params) is entry(policy).params
    assert again == config and again.model_dump_json() == config.model_dump_json()
    assert json.loads(config.model_dump_json())["params"] == given  # as given, no defaults


@pytest.mark.parametrize("given, kind", [
    ({"kind": "iid", "alpha": 0.6}, "iid"),
    ({"kind": "positional", "alphas": [0.9, 0.7]}, "positional"),
    ({"kind": "histogram", "probs": [1, 1, 2]}, "histogram"),
    ({"kind": "trace", "path": str(TRACE)}, "trace")])
def test_acceptance_is_the_model_its_kind_names(given, kind):
    config = RunConfig(**H100, acceptance=given)
    assert type(config.acceptance) is acceptance.MODELS[kind]
    assert config.given("acceptance") == given  # written as given (probs unnormalised)
    assert RunConfig.model_validate_json(config.model_dump_json()) == config


def test_a_record_writes_the_settings_as_given_and_reads_them_typed():
    config = RunConfig(**H100, policy="cats", params={"dram_budget_gb": 8})
    assert config.params.dram_budget_gb == 8.0 and config.params.gamma == \
        entry("cats").params().gamma  # the default, from the model alone
    dumped = config.model_dump(mode="json")
    assert dumped["params"] == {"dram_budget_gb": 8}
    assert isinstance(dumped["params"]["dram_budget_gb"], int)
    assert dumped["acceptance"] == acceptance.default()
    assert acceptance.default() == {"kind": "iid", "alpha": acceptance.IID().alpha}
    assert type(RunConfig(**H100).params) is entry("sd").params  # policy's default too


@pytest.mark.parametrize("fields, named", [
    ({"policy": "sd", "params": {"gama": 3}}, "'gama'"),
    ({"policy": "sd", "params": {"kappa": 8}}, "'kappa'"),  # another policy's parameter
    ({"policy": "sd", "params": {"gamma": 0}}, "'gamma'"),
    ({"policy": "nope"}, "unknown policy 'nope'"),
    ({"policy": "mirror", "params": entry("sd").params(gamma=3)}, "policy 'mirror'"),
    ({"acceptance": {"kind": "iid", "alpha": 1.5}}, "acceptance.iid.alpha"),
    ({"acceptance": {"kind": "iid", "alhpa": 0.5}}, "acceptance.iid.alhpa"),
    ({"acceptance": {"kind": "beta"}}, "'beta'")])
def test_a_bad_setting_is_refused_once_naming_the_field(fields, named):
    with pytest.raises(ValidationError) as err:
        RunConfig(**H100, **fields)
    assert len(err.value.errors()) == 1
    first = err.value.errors()[0]
    assert named in ".".join(map(str, first["loc"])) + ": " + first["msg"]


def test_the_cli_refuses_a_bad_parameter_in_one_sentence():
    result = run_cli("simulate", *[f"--{k}={v}" for k, v in H100.items()], "--policy",
                     "sd", "--set", "gamma=0", "--tokens", "10")
    assert_refused(result, "'gamma'")


def test_simulate_validates_neither_params_nor_acceptance_again(monkeypatch):
    config = RunConfig(**H100, params={"gamma": 3}, tokens=20,
                       acceptance={"kind": "trace", "path": str(TRACE)})
    calls = []
    params_cls = entry("sd").params
    original = params_cls.model_validate.__func__
    monkeypatch.setattr(params_cls, "model_validate", classmethod(
        lambda cls, *a, **k: calls.append("params") or original(cls, *a, **k)))
    import simcore.acceptance as acc_module

    read = acc_module.read_acceptance
    monkeypatch.setattr(acc_module, "read_acceptance",
                        lambda *a, **k: calls.append("trace") or read(*a, **k))
    simulate(config, baseline=False)
    assert calls == []


def test_a_trace_replays_from_its_first_step_in_every_run():
    config = RunConfig(**H100, params={"gamma": 4}, tokens=30, seed=2,
                       acceptance={"kind": "trace", "path": str(TRACE)})
    first = simulate(config, baseline=False).metrics
    assert simulate(config, baseline=False).metrics == first


def test_revised_validates_the_changed_config():
    config = RunConfig(**H100, params={"gamma": 3})
    ar = config.revised(policy="ar", params={}, draft=None)
    assert type(ar.params) is entry("ar").params and ar.given("params") == {}
    with pytest.raises(ValidationError, match="'gamma'"):
        config.revised(params={"gamma": 0})
    with pytest.raises(ValidationError, match="'gamma'"):
        config.revised(policy="ar")  # sd's parameters do not fit ar


def test_the_executor_session_refuses_an_unknown_placement_before_loading():
    pytest.importorskip("torch")
    from executors.session import Session

    with pytest.raises(ValueError, match="'nope' is not a device or group"):
        Session("cpu-local", "no-such-model", placement={"draft": "nope"})


def test_the_settings_every_layer_reads_are_typed_at_the_bottom():
    """RunConfig is policies.runs.config.RunSettings with its acceptance model
    narrowed in place: the runtimes and the run metrics read the bottom type, and a
    record's fields keep their order."""
    from policies.runs.config import RunSettings
    from policies.runs.metrics import run_metrics

    config = RunConfig(**H100, params={"gamma": 6})
    assert isinstance(config, RunSettings)
    assert list(RunConfig.model_fields) == list(RunSettings.model_fields)
    assert RunConfig.model_fields["acceptance"].annotation is not \
        RunSettings.model_fields["acceptance"].annotation
    revised = config.revised(batch=4)
    assert type(revised) is RunConfig and revised.given("params") == {"gamma": 6}
    metrics = run_metrics(config, tokens=8.0, time_s=2.0, steps=4, rows_per_step=1)
    assert metrics["policy"] == "sd" and metrics["tokens_per_s"] == 4.0


def test_a_measured_runs_executor_named_draft_is_checked_by_its_shape():
    """``hetspec run --draft self:N`` names no profile: the check that a draft is
    used sizes the schedule's dry run with the executor's spec (the target's first
    N layers), so sd takes it and a self-drafting schedule refuses it."""
    from analyses.commands.run import executor_models
    from analyses.run.api import check_used

    sd = RunConfig(platform="cpu-local", target="smollm2-135m", draft="self:8",
                   policy="sd", params={"gamma": 2})
    models = executor_models(sd)
    assert models["draft"].n_layers == 8
    assert models["draft"].hidden == models["target"].hidden
    check_used(sd, models)
    eesd = sd.revised(policy="eesd", params={"gamma": 2})
    with pytest.raises(ValueError, match="--draft self:8 has no effect"):
        check_used(eesd, executor_models(eesd))
