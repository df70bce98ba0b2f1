"""Prompt lookup (``--draft ngram``): the proposer, the schedule, the simulator's
pricing and outcomes, the run configuration, and the executor (tiny random
models): greedy equals AR token for token, temperature 1 keeps the target's law."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from analyses.run.config import RunConfig
from hwprofiles import load_model
from policies import PolicyContext, build, parse_params
from policies.ngram import propose
from policies.ops import Forward, Lookup, Verdict, Verify, drive


# the proposer ----------------------------------------------------------------------
def test_longest_match_first_and_most_recent_occurrence():
    seq = [7, 1, 2, 3, 40, 41, 9, 2, 3, 50, 1, 2, 3]
    # the tail 1 2 3 occurs at 1..3 (then 40 41): the 3-gram wins over the 2-gram 2 3 at 7
    assert propose(seq, len(seq), gamma=2, n=3, n_min=1) == [40, 41]
    assert propose(seq, len(seq), gamma=2, n=2, n_min=1) == [50, 1]  # 2 3 most recently at 7
    assert propose(seq, len(seq), gamma=8, n=3, n_min=1) == [40, 41, 9, 2, 3, 50, 1, 2]


def test_no_match_proposes_nothing_and_n_min_bounds_the_search():
    assert propose([1, 2, 3, 4], 4, gamma=5, n=3, n_min=1) == []
    seq = [5, 6, 9, 8, 6]  # only the 1-gram 6 recurs
    assert propose(seq, 5, gamma=2, n=3, n_min=2) == []
    assert propose(seq, 5, gamma=2, n=3, n_min=1) == [9, 8]
    assert propose(seq, 5, gamma=0, n=3, n_min=1) == []


def test_search_windows_keep_match_and_continuation_inside():
    prompt, out = [1, 2, 3, 4, 9], [1, 2, 7, 1, 2]
    seq = prompt + out
    assert propose(seq, len(prompt), gamma=3, n=2, n_min=2, search="output") == [7, 1, 2]
    assert propose(seq, len(prompt), gamma=3, n=2, n_min=2, search="prompt") == [3, 4, 9]
    assert propose(seq, len(prompt), gamma=3, n=2, n_min=2, search="both") == [7, 1, 2]
    # a match at the prompt's end continues no further than the prompt
    assert propose([4, 9, 4, 9, 0, 4, 9], 4, gamma=5, n=2, n_min=2, search="prompt") == [4, 9]
    with pytest.raises(ValueError, match="search is 'all'"):
        propose(seq, 3, gamma=2, search="all")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=40), st.integers(1, 6),
       st.integers(1, 4))
def test_a_proposal_is_what_followed_an_earlier_occurrence_of_the_tail(seq, gamma, n):
    got = propose(seq, len(seq), gamma=gamma, n=n, n_min=1)
    assert len(got) <= gamma
    if not got:  # then not even the last token occurs earlier with a successor
        assert seq[-1] not in seq[:-1]
        return
    starts = [i for k in range(1, n + 1) for i in range(len(seq) - k)
              if seq[i:i + k] == seq[len(seq) - k:] and seq[i + k:i + k + len(got)] == got]
    assert starts


# the schedule ----------------------------------------------------------------------
def _ctx(tokens=12):
    return PolicyContext(target=load_model("smollm2-135m"), tokens=tokens)


def test_lookup_sd_verifies_what_the_lookup_found():
    params = parse_params("sd", {"proposer": "ngram", "gamma": 6})
    found = iter([(0,), (6,), (3,)])
    seen = []

    def answer(op):
        seen.append(op)
        if isinstance(op, Lookup):
            return next(found)
        if isinstance(op, Verify):
            return Verdict((op.gamma,))  # everything accepted
        return object()

    stats = drive(build("sd", _ctx(tokens=12), params), answer)
    forwards = [op.n_tokens for op in seen if isinstance(op, Forward)]
    verifies = [op.gamma for op in seen if isinstance(op, Verify)]
    assert forwards == [1, 7, 4] and verifies == [0, 6, 3]  # no match: a one-token pass
    assert stats == {"steps": 3, "tokens": 1 + 7 + 4}
    assert not any(isinstance(op, Forward) and op.model != "target" for op in seen)


def test_ngram_defaults_and_unused_settings():
    params = parse_params("sd", {"proposer": "ngram"})
    assert (params.gamma, params.n, params.n_min, params.search) == (10, 4, 3, "both")
    assert parse_params("sd", {}).gamma == 4  # a draft model's default is unchanged
    assert "n has no effect with a draft model" in parse_params("sd", {"n": 2}).unused()
    assert "draft_layers has no effect with --draft ngram" in parse_params(
        "sd", {"proposer": "ngram", "draft_layers": 4}).unused()


def test_draft_ngram_configures_the_proposer_not_a_model():
    config = RunConfig(platform="cpu-local", target="smollm2-135m", policy="sd",
                       draft="ngram", params={"gamma": 5})
    assert config.draft is None and config.params.proposer == "ngram"
    assert config.given("params") == {"gamma": 5, "proposer": "ngram"}
    assert config.revised(seed=1).params.proposer == "ngram"  # a record replays as run
    with pytest.raises(ValueError, match="--draft ngram .* works with policy sd"):
        RunConfig(platform="cpu-local", target="smollm2-135m", policy="mirror",
                  draft="ngram")


# the simulator ---------------------------------------------------------------------
def _simulate(**fields):
    from analyses.run.api import simulate

    base = dict(platform="cpu-local", target="smollm2-135m", policy="sd", draft="ngram",
                tokens=60, deterministic=True, fixed_context=True)
    return simulate(RunConfig(**{**base, **fields})).metrics


def test_no_match_costs_exactly_an_ar_step_and_the_lookup():
    from hwprofiles import load_platform

    out = _simulate(params={"match": 0.0})
    ar_step_s = 1 / out["ar_tokens_per_s"]
    lookup_s = load_platform("cpu-local").host_lookup_s
    assert out["step_latency_s"] == pytest.approx(ar_step_s + lookup_s, rel=1e-9)
    assert out["mean_tokens_per_step"] == 1.0


def test_matched_steps_follow_the_closed_form():
    """match m, i.i.d. alpha: a matched step commits (1-a^(g+1))/(1-a) tokens in
    T(g+1), an unmatched one 1 token in T(1), each after a host lookup; deterministic
    mode matches exactly
    floor(n m) of n steps."""
    from simcore.costmodel import RooflineCost
    from hwprofiles import load_platform

    g, m, a = 4, 0.5, 0.6
    out = _simulate(params={"match": m, "gamma": g}, acceptance={"kind": "iid", "alpha": a},
                    tokens=400)
    spec, cost = load_model("smollm2-135m"), RooflineCost(load_platform("cpu-local"))
    t1, tg = (cost.forward(spec, "cpu0", (0, spec.n_layers), k, 1, 128, "lm", None).total_s
              for k in (1, g + 1))
    n = out["steps"]
    matched = int(n * m)  # error diffusion: the event holds on floor(n m) of n asks
    per_match = (1 - a ** (g + 1)) / (1 - a)
    assert out["tokens"] == pytest.approx(matched * per_match + (n - matched), rel=1e-9)
    lookup_s = load_platform("cpu-local").host_lookup_s  # every step looks up first
    assert out["simulated_time_s"] == pytest.approx(
        matched * tg + (n - matched) * t1 + n * lookup_s, rel=1e-9)


def test_a_lookup_costs_the_profiles_host_time_per_row(tmp_path):
    import yaml

    from hwprofiles import load_platform

    data = yaml.safe_load(open("hwprofiles/data/platforms/cpu-local.yaml"))
    data["host_lookup_s"] = 0.004
    data.setdefault("sources", {})["host_lookup_s"] = "test fixture"
    path = tmp_path / "slow-lookup.yaml"
    path.write_text(yaml.safe_dump(data))
    shipped, slow = _simulate(params={"match": 0.0}), _simulate(
        platform=str(path), params={"match": 0.0})
    extra_s = 0.004 - load_platform("cpu-local").host_lookup_s
    assert slow["step_latency_s"] - shipped["step_latency_s"] == pytest.approx(extra_s,
                                                                               rel=1e-9)


def test_a_trace_replays_each_steps_proposal_and_acceptance(tmp_path):
    trace = tmp_path / "acceptance.jsonl"
    steps = [(0, 0), (10, 10), (10, 2), (4, 4)]
    trace.write_text("".join(json.dumps({"accepted": [a], "proposed": [p], "gamma": p})
                             + "\n" for p, a in steps))
    out = _simulate(acceptance={"kind": "trace", "path": str(trace)}, deterministic=False,
                    tokens=sum(a + 1 for _, a in steps))
    assert out["steps"] == len(steps) and out["tokens"] == 1 + 11 + 3 + 5
    with pytest.raises(ValueError, match="needs what it proposes"):
        _simulate(params={}, acceptance={"kind": "iid", "alpha": 0.5})


# the executor (tiny random models) -------------------------------------------------
REPEATS = [3, 7, 1, 9, 4, 3, 7, 1, 9, 4, 3, 7, 1]  # a run the lookup can copy


def _session(tmp_path, **options):
    from executors.session import Options, Session
    from tests.test_executor import tiny_spec

    spec = tiny_spec(tmp_path, vocab=12, layers=3, hidden=32)
    return Session("cpu-local", f"random:{spec}", None, seed=7,
                   options=Options(mode="inline", **options))


@pytest.mark.torch
def test_greedy_lookup_equals_ar_token_for_token(tmp_path):
    prompts = [REPEATS, [2, 5, 2, 5, 2, 5, 8, 2, 5]]
    with _session(tmp_path, max_new_tokens=24) as s:
        for p in prompts:
            ar = s.decode("ar", {}, [p]).generated
            ng = s.decode("sd", {"proposer": "ngram", "n": 2, "n_min": 1, "gamma": 5}, [p])
            assert [g[:24] for g in ng.generated] == ar  # a last step may commit more
            assert any(sum(a["proposed"]) for a in ng.acceptance)  # it did propose
            assert [x.op["type"] for x in ng.spans].count("Lookup") == ng.steps


@pytest.mark.torch
def test_lookup_at_temperature_one_samples_the_target_distribution(tmp_path):
    from executors.backend.layers import Stack
    from tests.test_executor import _chi2_p, _joint, _peaky

    rows, prompt = 3000, [1, 2, 3, 1, 2]  # the lookup proposes 3, 1, 2, ...
    with _session(tmp_path, max_new_tokens=2, temperature=1.0) as s:
        _peaky(s, "target", 8.0)
        out = s.decode("sd", {"proposer": "ngram", "n": 2, "n_min": 1, "gamma": 3},
                       [prompt] * rows)
        target = _joint(Stack(s.loaded["target"].model), prompt, 12)
    samples = [g[:2] for g in out.generated]
    assert sum(sum(a["accepted"]) for a in out.acceptance) > rows // 50  # some accepted
    assert _chi2_p(samples, target) > 1e-3
    assert _chi2_p(samples, target.T) < 1e-6  # the test tells laws apart (t1, t2 swapped)


@pytest.mark.torch
def test_ssd_fast_backup_proposes_by_lookup_in_the_executor(tmp_path):
    from executors.session import Options, Session
    from tests.test_executor import tiny_spec

    spec = tiny_spec(tmp_path, vocab=12, layers=3, hidden=32)
    with Session("cpu-local", f"random:{spec}", "self:2", seed=7,
                 options=Options(mode="inline", max_new_tokens=24)) as s:
        ar = s.decode("ar", {}, [REPEATS]).generated
        ssd = s.decode("ssd", {"k": 3, "fanout": 1, "hit_rate": 0.5, "backup": "fast"},
                       [REPEATS])
    assert [g[:24] for g in ssd.generated] == ar
    # branch 0 is SSD's backup branch: with backup=fast only the lookup fills it
    fast = [a for a in ssd.acceptance if a.get("branch") == 0 and sum(a["proposed"])]
    assert fast, "the fast backup's verifies check lookup tokens (none before it proposed)"


def test_the_match_model_fitted_from_a_trace():
    from policies.ngram import fit

    lines = [{"proposed": [0], "accepted": [0]}, {"proposed": [4], "accepted": [4]},
             {"proposed": [4], "accepted": [1]}, {"proposed": [2], "accepted": [0]}]
    # 3 of 4 steps matched; 5 tokens accepted, 2 rejections: alpha = 5/7
    assert fit(lines) == {"match": 0.75, "alpha": pytest.approx(5 / 7)}
    assert fit([{"proposed": [0], "accepted": [0]}]) == {"match": 0.0, "alpha": None}


def test_prompt_sets_by_name():
    from executors.prompts import BUILTIN, load

    grounded = load("grounded")
    assert len(grounded) >= 8 and load("chat") == list(BUILTIN) == load(None)
    assert all(m[0]["role"] == "user" and len(m[0]["content"]) > 300 for m in grounded)


@pytest.mark.torch
def test_a_measured_run_reports_the_median_round_and_its_range(tmp_path):
    from executors.measure import measure
    from executors.session import Options
    from tests.test_executor import tiny_spec

    spec = tiny_spec(tmp_path, vocab=12, layers=3, hidden=32)
    config = RunConfig(platform="cpu-local", target=f"random:{spec}", policy="sd",
                       draft="ngram", params={"n": 2, "n_min": 1, "gamma": 4})
    msgs = [[{"role": "user", "content": "abab abab abab"}],
            [{"role": "user", "content": "xyz xyz xyz"}]]
    out = measure(config, Options(max_new_tokens=8, mode="inline"), msgs,
                  out_dir=tmp_path / "run", repeats=3)
    rounds = out["speedup_vs_ar_repeats"]
    assert len(rounds) == 3 and out["speedup_vs_ar"] == sorted(rounds)[1]
    assert out["speedup_vs_ar_spread"] == [min(rounds), max(rounds)]
    assert out["matches_ar"] is True and "lookup_match" in out
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["inputs"]["repeats"] == 3 and record["inputs"]["draft"] is None
    assert record["inputs"]["params"]["proposer"] == "ngram"
    batches = {json.loads(x)["prompt_batch"] for x in
               (tmp_path / "run" / "spans.jsonl").read_text().splitlines()}
    assert batches == set(range(6))  # 2 prompts x 3 rounds of the schedule
