"""Trained draft heads in the cost model: an exit head with a head trained onto a
draft vocabulary projects through that vocabulary's rows, not the whole LM head,
and a self-draft's own head is the target's at its exit, as the executor runs
them (``ModelSpec.projection_params``, ``own_head``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from hwprofiles import ModelSpec, load_model, load_platform
from simcore.costmodel import RooflineCost

SMOL = load_model("smollm2-135m")
PLATFORM = load_platform("cpu-local")


def _spec(**extra) -> ModelSpec:
    base = dict(name="m", n_layers=12, hidden=64, ffn=128, n_heads=4, n_kv_heads=2,
                vocab=1000, dtype="fp32")
    fields = {**base, **extra}
    numbers = {k: "a test's shape" for k, v in fields.items() if isinstance(v, (int, tuple))}
    return ModelSpec(**fields, sources=numbers)


def test_a_trained_exit_projects_through_the_draft_vocabulary_only():
    spec = _spec(exit_vocab=250, trained_exits=(4,), trained_adapters=(6,))
    small = 64 * (64 + 250) + 64  # norm, hidden x hidden projection, draft rows
    assert spec.projection_params("exit", 4) == small
    assert spec.projection_params("exit_layer", 6) == small
    assert spec.head_flops(3, "exit", 4) == 2 * (small - 64) * 3
    # an exit without a head of that kind is the final norm and the whole LM head
    assert spec.projection_params("exit", 6) == spec.head_params == 64 * 1000 + 64
    assert spec.projection_params("exit_layer", 4) == spec.head_params
    assert spec.projection_params("lm", 12) == spec.head_params
    assert spec.head_flops(3) == 2 * 64 * 1000 * 3


def test_without_a_draft_vocabulary_every_head_is_the_lm_head():
    spec = _spec()
    for kind in ("lm", "exit", "exit_layer"):
        assert spec.projection_params(kind, 4) == spec.head_params


@pytest.mark.parametrize("extra, words", [
    (dict(exit_vocab=1001), "exceeds vocab"),
    (dict(trained_exits=(4,)), "needs exit_vocab"),
    (dict(exit_vocab=10, trained_adapters=(0,)), "at least 1"),
])
def test_impossible_draft_heads_are_refused_in_one_sentence(extra, words):
    with pytest.raises(ValidationError, match=words):
        _spec(**extra)


def test_a_self_drafts_own_head_costs_what_the_targets_exit_head_costs():
    """The executor runs a ``self:N`` draft's head as the target's head at exit N:
    the same pass must cost the same whichever model names it."""
    from executors.backend.models import first_layers
    cost = RooflineCost(PLATFORM)
    for n in (8, 15, 10):  # trained exits, and one without a head (the LM head)
        draft = first_layers(SMOL, f"self:{n}")
        assert draft.own_head == "exit"
        mine = cost.forward(draft, "cpu1", (0, n), 1, 1, 60, "lm", None)
        target = cost.forward(SMOL, "cpu1", (0, n), 1, 1, 60, "exit", None)
        assert mine == target
    trained = cost.forward(SMOL, "cpu1", (0, 15), 1, 1, 60, "exit", None)
    untrained = cost.forward(SMOL, "cpu1", (0, 15), 1, 1, 60, "lm", None)
    assert trained.nbytes == pytest.approx(
        untrained.nbytes - 4 * (SMOL.head_params - SMOL.projection_params("exit", 15)))
    assert first_layers(SMOL, "self:3").own_head == "exit_layer"  # an adapter there


def test_the_shipped_spec_names_the_heads_of_the_shipped_artifact():
    pytest.importorskip("safetensors")
    from executors.backend import drafts
    assert drafts.head_fields("smollm2-135m") == {
        "exit_vocab": SMOL.exit_vocab, "trained_exits": SMOL.trained_exits,
        "trained_adapters": SMOL.trained_adapters}
    assert drafts.head_fields("random:smollm2-135m")["exit_vocab"] is None


def test_a_run_whose_heads_differ_from_the_shipped_spec_records_its_own(tmp_path):
    """Random weights have no trained heads: the record names a spec beside it,
    not the shipped one, whose exit heads are trained."""
    pytest.importorskip("torch")
    from executors.backend.models import UNTRAINED, spec_of
    from executors.measure import simulable_models
    config = SimpleNamespace(target="random:smollm2-135m", draft=None)
    out = simulable_models(config, {"target": spec_of("random:smollm2-135m")}, tmp_path)
    written = load_model(out["target"])
    assert written.exit_vocab is None and written.n_layers == SMOL.n_layers
    config = SimpleNamespace(target="smollm2-135m", draft=None)
    assert simulable_models(config, {"target": SMOL}, tmp_path)["target"] == "smollm2-135m"
    assert spec_of("random:smollm2-135m").model_dump() == SMOL.model_copy(
        update=UNTRAINED).model_dump()
