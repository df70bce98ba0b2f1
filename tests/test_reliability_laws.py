"""Bad law parameters and bad sweep values: one sentence, exit 2, nothing written.

The cases are the reliability review's (ids l.. and c..): wrong types (text, a
list, a boolean, a fraction where a count goes), non-finite numbers, values out
of range and combinations that divide by zero. Each must be refused before any
work with a sentence that names the parameter.
"""

import json
import math

import pytest

from analyses.laws import forms as laws
from clicases import assert_refused, run_cli

LAW_CASES = {
    "l02 alpha above 1": ("leviathan", ["alpha=1.5", "gamma=5"], "alpha"),
    "l03 alpha nan": ("leviathan", ["alpha=nan", "gamma=5"], "alpha"),
    "l04 alpha text": ("leviathan", ["alpha=abc", "gamma=5"], "alpha"),
    "l05 gamma inf": ("leviathan", ["alpha=0.8", "gamma=inf"], "gamma"),
    "l06 gamma text": ("leviathan", ["alpha=0.8", "gamma=abc"], "gamma"),
    "gamma boolean": ("leviathan", ["alpha=0.8", "gamma=true"], "gamma"),
    "gamma huge": ("leviathan", ["alpha=0.8", "gamma=10000000000"], "gamma"),
    "l09 c negative": ("leviathan", ["alpha=0.8", "gamma=5", "c=-1"], "'c'"),
    "l10 c_hat nan": ("leviathan", ["alpha=0.8", "gamma=5", "c_hat=nan"], "c_hat"),
    "c_hat negative": ("leviathan", ["alpha=0.8", "gamma=5", "c_hat=-0.5"], "c_hat"),
    "l19 gamma list": ("leviathan", ["alpha=0.8", "gamma=1,2"], "gamma"),
    "l11 mirror all zero": ("mirror", ["t_prefix_s=0", "t_suffix_s=0", "t_draft_s=0"],
                            "takes time"),
    "l12 mirror inf": ("mirror", ["t_prefix_s=inf", "t_suffix_s=1", "t_draft_s=inf"],
                       "t_prefix_s"),
    "mirror negative rv": ("mirror", ["t_prefix_s=1", "t_suffix_s=1", "t_draft_s=1",
                                      "t_rv_s=-1"], "t_rv_s"),
    "l13 ppsd n_layers inf": ("ppsd", ["n_layers=inf", "exit_layer=2", "alpha=0.5"],
                              "n_layers"),
    "l14 ppsd n_layers text": ("ppsd", ["n_layers=abc", "exit_layer=2", "alpha=0.5"],
                               "n_layers"),
    "l21 ppsd exit_layer fraction": ("ppsd", ["n_layers=30", "exit_layer=2.5", "alpha=0.5"],
                                     "exit_layer"),
    "ppsd exit beyond model": ("ppsd", ["n_layers=30", "exit_layer=31", "alpha=0.5"],
                               "exit_layer"),
    "l15 ssd batch 0": ("ssd", ["hit_rate=0.5", "e_hit=2", "e_miss=1", "t_p=1", "t_b=1",
                                "batch=0"], "batch"),
    "l16 ssd hit_rate nan": ("ssd", ["hit_rate=nan", "e_hit=2", "e_miss=1", "t_p=1",
                                     "t_b=1"], "hit_rate"),
    "ssd e_hit inf": ("ssd", ["hit_rate=0.5", "e_hit=inf", "e_miss=1", "t_p=1", "t_b=1"],
                      "e_hit"),
    "l17 cats gamma negative": ("cats", ["layer_gb=1", "n_layers=30", "gamma=-5", "l_dm=3",
                                         "mean_accepted=2"], "gamma"),
    "l18 cats mean_accepted inf": ("cats", ["layer_gb=1", "n_layers=30", "gamma=5", "l_dm=3",
                                            "mean_accepted=inf"], "mean_accepted"),
    "cats mean_accepted above gamma+1": ("cats", ["layer_gb=1", "n_layers=30", "gamma=5",
                                                  "l_dm=3", "mean_accepted=9"],
                                         "mean_accepted"),
    "cats overflowing bytes": ("cats", ["layer_gb=1e308", "n_layers=30", "gamma=5", "l_dm=3",
                                        "mean_accepted=2"], "non-finite"),
    "l22 kangaroo layer_gb nan": ("kangaroo", ["layer_gb=nan", "n_layers=30", "gamma=5",
                                               "l_dm=3", "mean_accepted=2"], "layer_gb"),
}


@pytest.mark.parametrize("case", list(LAW_CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_bad_law_parameters_are_one_sentence(case, as_json):
    name, sets, fragment = LAW_CASES[case]
    argv = ["law", name, *[a for s in sets for a in ("--set", s)]]
    result = run_cli(*argv, *(["--json"] if as_json else []))
    assert_refused(result, fragment)
    assert result.out == ""


GOOD_LAWS = {
    "leviathan": ["alpha=0.8", "gamma=5", "c=0.05"],
    "mirror": ["t_prefix_s=0.01", "t_suffix_s=0.01", "t_draft_s=0.006", "t_rv_s=0.0001"],
    "ssd": ["hit_rate=0.88", "e_hit=5.7", "e_miss=4", "t_p=0.8", "t_b=0.8", "batch=4"],
    "ppsd": ["n_layers=32", "exit_layer=8", "alpha=0.6738", "gamma=5"],
    "cats": ["layer_gb=0.4048", "n_layers=32", "gamma=5", "l_dm=3", "mean_accepted=3.05",
             "l_sv=15"],
    "kangaroo": ["layer_gb=0.4048", "n_layers=32", "gamma=5", "l_dm=3",
                 "mean_accepted=2.27"],
}


@pytest.mark.parametrize("name", list(GOOD_LAWS))
def test_valid_law_json_is_strict_json_equal_to_the_function(name):
    argv = ["law", name, *[a for s in GOOD_LAWS[name] for a in ("--set", s)], "--json"]
    result = run_cli(*argv)
    assert result.rc == 0, result.err
    printed = json.loads(result.out, parse_constant=lambda c: pytest.fail(c))
    from analyses.run.config import parse_sets
    direct = laws.laws()[name].__wrapped__(**parse_sets(GOOD_LAWS[name]))
    assert printed == pytest.approx(direct)
    assert all(math.isfinite(v) for v in printed.values() if isinstance(v, float))


SWEEP = ["compare", "--platform", "cpu-local", "--target", "smollm2-135m", "--draft", "none",
         "--policies", "ar,sd", "--set", "draft_layers=15", "--tokens", "20", "--jobs", "1"]

SWEEP_CASES = {
    "c08 every alpha beyond 1": (["--sweep", "alpha=1.5..2.5:0.5"], "alpha"),
    "c09 gamma nan": (["--sweep", "gamma=nan"], "finite"),
    "c10 alpha from nan": (["--sweep", "alpha=nan..1:0.1"], "finite"),
    "c11 alpha to inf": (["--sweep", "alpha=0.1..inf:0.1"], "finite"),
    "gamma list with inf": (["--sweep", "gamma=2,inf"], "finite"),
    "one alpha of three beyond 1": (["--sweep", "alpha=0.8..1.2:0.2"], "alpha=1.2"),
    "gamma beyond the policy's bound": (["--sweep", "gamma=60..70:5"], "gamma"),
    "set gamma nan": (["--set", "gamma=nan"], "gamma"),
    "set alpha text": (["--set", "alpha=high"], "alpha"),
    "c12 key twice": (["--sweep", "gamma=2..3", "--set", "gamma=3"], "'gamma' is given twice"),
    "c14 tokens 0": (["--sweep", "gamma=2..3", "--tokens", "0"], "--tokens"),
    "c15 batch 0": (["--sweep", "gamma=2..3", "--batch", "0"], "--batch"),
}


@pytest.mark.parametrize("case", list(SWEEP_CASES))
def test_invalid_sweep_values_are_errors_not_skipped_policies(case, tmp_path):
    extra, fragment = SWEEP_CASES[case]
    out = tmp_path / "report.html"
    result = run_cli(*SWEEP, *extra, "-o", out)
    assert_refused(result, fragment)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_set_gamma_replaces_the_default_gamma_sweep(tmp_path):
    out = tmp_path / "report.html"
    result = run_cli(*SWEEP, "--set", "gamma=3", "--json", "-o", out)
    assert result.rc == 0, result.err
    assert json.loads(result.out)["points"] == 2  # ar, and sd at gamma=3 only


def test_a_policy_that_does_not_apply_is_still_a_skip(tmp_path):
    """Skipping stays for schedules the scenario cannot run (no draft for sd)."""
    out = tmp_path / "report.html"
    result = run_cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "none", "--policies", "ar,sd", "--sweep", "gamma=2,3",
                     "--tokens", "20", "--jobs", "1", "-o", out)
    assert result.rc == 0, result.err
    assert "skipped sd" in result.out and out.exists()
