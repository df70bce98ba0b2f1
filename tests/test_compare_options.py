"""compare takes every option it is given or refuses it in one sentence: --batch
beside a batch a sweep gives, --no-tune where nothing would be tuned, a value a
sweep lists twice; --draft ngram compares prompt lookup (sd and tree) with AR."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from analyses.cli import build_parser, main
from analyses.commands.compare import scenario_of
from analyses.compare.api import Scenario, prepare

H100 = ["compare", "--platform", "h100-sxm-5x", "--target", "llama-3.1-70b", "--draft",
        "llama-3.2-1b", "--tokens", "50", "--jobs", "1"]
CPU = ["compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--tokens", "50",
       "--jobs", "1"]


def _refused(capsys, tmp_path, argv) -> str:
    """The one sentence compare refuses ``argv`` with; nothing written."""
    report = tmp_path / "out.html"
    rc = main(argv + ["-o", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("hetspec: error: "), err
    assert not report.exists()
    return err[0]


@pytest.mark.parametrize("extra", [["--sweep", "batch=1,8", "--batch", "4"],
                                   ["--batch", "4", "--set", "batch=8"]])
def test_batch_beside_a_batch_a_sweep_or_set_gives_is_refused(capsys, tmp_path, extra):
    err = _refused(capsys, tmp_path, H100 + ["--policies", "ar,sd"] + extra)
    assert "--batch 4 and --" in err and "both give the batch" in err and "keep one" in err


def test_batch_given_at_its_default_is_given(capsys, tmp_path):
    """--batch 1 beside a batch sweep is refused too; left out, args.batch stays 1
    (what a check on the parsed options reads) and the sweep runs."""
    err = _refused(capsys, tmp_path, H100 + ["--policies", "ar,sd", "--sweep",
                                             "batch=2,8", "--batch", "1"])
    assert "--batch 1 and --sweep batch=2,8 both give the batch" in err
    args = build_parser(["compare"]).parse_args(["compare", "--sweep", "batch=2,8"])
    assert args.batch == 1 and scenario_of(args).batch is None


def test_batch_alone_and_a_batch_sweep_alone_are_taken():
    assert prepare(Scenario(platform="h100-sxm-5x", target="llama-3.1-70b",
                            draft="llama-3.2-1b", policies=["ar", "sd"],
                            batch=4)).resolved.base["batch"] == 4
    found = prepare(Scenario(platform="h100-sxm-5x", target="llama-3.1-70b",
                             draft="llama-3.2-1b", policies=["ar", "sd"],
                             sweeps=[("batch", [1, 8])])).resolved
    assert found.base["batch"] == 1 and found.split()[0] == [{"batch": 1}, {"batch": 8}]


@pytest.mark.parametrize("extra, named", [
    (["--policies", "ar,sd", "--sweep", "gamma=2,3"], "beside --sweep gamma"),
    (["--policies", "ar,sd", "--sweep", "alpha=0.6,0.8"], "beside --sweep alpha"),
    (["--policies", "ar"], "none of ar has a parameter left to tune"),
    (["--policies", "ar,sd", "--set", "gamma=3"], "none of ar, sd has a parameter left"),
])
def test_no_tune_where_nothing_is_tuned_is_refused(capsys, tmp_path, extra, named):
    err = _refused(capsys, tmp_path, H100 + ["--no-tune"] + extra)
    assert "--no-tune has no effect" in err and named in err and "drop --no-tune" in err


def test_no_tune_acts_beside_a_batch_sweep(capsys, tmp_path):
    """A batch sweep keeps each batch's tuning: --no-tune runs sd once a batch."""
    argv = H100 + ["--policies", "ar,sd", "--sweep", "batch=1,8", "--json",
                   "-o", str(tmp_path / "r.html")]
    tuned = json.loads((main(argv), capsys.readouterr().out)[1])
    untuned = json.loads((main(argv + ["--no-tune"]), capsys.readouterr().out)[1])
    assert untuned["points"] == 4 < tuned["points"]


@pytest.mark.parametrize("sweep, value", [("gamma=2,2,4", "2"), ("batch=1,1", "1"),
                                          ("stack=compiled,compiled", "compiled"),
                                          ("gamma=2,4,2.0", "2.0"),
                                          ("tree=4,2;3,3;4,2", "4,2")])
def test_a_value_a_sweep_lists_twice_is_refused(capsys, tmp_path, sweep, value):
    policies = "ar,tree" if sweep.startswith("tree") else "ar,sd"
    err = _refused(capsys, tmp_path, H100 + ["--policies", policies, "--sweep", sweep])
    key = sweep.split("=")[0]
    assert f"--sweep {key} lists {value} twice; give each value once" in err


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.integers(1, 12), min_size=1, max_size=6))
def test_a_sweep_is_refused_exactly_when_a_value_repeats(values):
    """Any list of gamma values: refused, naming a repeated one, exactly when one
    repeats; resolved with each value once otherwise."""
    scenario = Scenario(platform="h100-sxm-5x", target="llama-3.1-70b",
                        draft="llama-3.2-1b", policies=["ar", "sd"],
                        sweeps=[("gamma", values)])
    if len(set(values)) < len(values):
        with pytest.raises(ValueError, match=r"--sweep gamma lists (\d+) twice") as info:
            prepare(scenario)
        assert values.count(int(info.value.args[0].split()[3])) > 1
    else:
        assert prepare(scenario).resolved.sweeps == [("gamma", values)]


def test_draft_ngram_compares_prompt_lookup_with_ar(capsys, tmp_path):
    """--draft ngram sets sd's proposer to prompt lookup (no draft model loads), as
    simulate --draft ngram does, and the point equals simulate's."""
    report = tmp_path / "r.html"
    rc = main(CPU + ["--draft", "ngram", "--policies", "ar,sd", "--sweep", "gamma=4,8",
                     "--set", "match=0.6", "--json", "-o", str(report)])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and report.exists()
    assert summary["fastest"] == "sd(gamma=8, match=0.6, proposer=ngram)"
    rc = main(["simulate", "--platform", "cpu-local", "--target", "smollm2-135m",
               "--draft", "ngram", "--policy", "sd", "--set", "gamma=8", "--set",
               "match=0.6", "--tokens", "50", "--json"])
    simulated = json.loads(capsys.readouterr().out)
    assert rc == 0 and simulated["tokens_per_s"] == summary["tokens_per_s"]


def test_draft_ngram_compares_the_schedules_that_take_it():
    found = prepare(Scenario(platform="cpu-local", target="smollm2-135m", draft="ngram",
                             sets={"match": 0.6})).resolved
    assert found.policies == ["ar", "sd", "tree"] and found.base["draft"] is None
    assert found.sets["proposer"] == "ngram"


@pytest.mark.parametrize("extra, named", [
    (["--policies", "ar,mirror", "--set", "match=0.6"],
     "works with policy sd or tree (beside ar, their baseline), not 'mirror'"),
    (["--policies", "ar,sd"], "--set match=P"),
    (["--set", "match=0.6", "--set", "proposer=model"], "both choose the proposer"),
])
def test_draft_ngram_is_refused_by_name_where_it_cannot_run(capsys, tmp_path, extra, named):
    err = _refused(capsys, tmp_path, CPU + ["--draft", "ngram"] + extra)
    assert named in err and "unknown model" not in err


def test_draft_ngram_refuses_a_draft_models_setting_as_simulate_does(capsys, tmp_path):
    err = _refused(capsys, tmp_path, CPU + ["--draft", "ngram", "--policies", "ar,sd",
                                            "--set", "match=0.6", "--set",
                                            "draft_layers=15"])
    assert err == ("hetspec: error: sd: draft_layers has no effect with --draft ngram "
                   "(no draft model runs); drop draft_layers")
